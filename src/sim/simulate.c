/*
** Predicting an update's time: the workers' operation lists, played on one
** clock for all of them with the profile's layer times and the machines'
** prices.
*/
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/schedule.h"
#include "repipe/simulate.h"
#include "simulate_impl.h"
#include "../sched/sharding.h"

/* The operations that compute (the rest move messages or wait). */
static bool op_computes(int k) {
    return k == RP_OP_FORWARD || k == RP_OP_BACKWARD || k == RP_OP_STEP ||
           k == RP_OP_BACKWARD_INPUT || k == RP_OP_BACKWARD_WEIGHT;
}

/* A worker in the simulation: at its operation pc, computing (work
** seconds of compute left) or waiting until a known time, or blocked. */
typedef struct sim_worker {
    int pc, held;
    bool started;    /* the operation at pc has begun, at t0 */
    double t0;
    double work;     /* compute left, seconds at full speed; -1: not computing */
    double until;    /* end of a wait whose end is known; -1: none */
    double arrive;   /* when it reached the reduction; -1: not yet */
    double reducing; /* the allreduce's own time, for the bubble */
    double copying;  /* time spent copying messages */
    int rounds;      /* reductions passed */
    bool at_norm;    /* waiting at its step for every worker's norm (clipping, loss scaling) */
    int steps;       /* such waits passed */
    int flow;        /* the group whose reduction it waits for on the network; -1: none */
    long long delivers; /* a send being copied: the message it makes available */
    double lb0, lb1;    /* its last backward (or weights' half): when it ran */
} sim_worker;

/* A reduction group: a stage's workers in one replica group. */
typedef struct red_group {
    int n, first, top, arrived;
    rpi_reduction how; /* the algorithm its allreduce runs */
    double *last; /* per round of reductions, its last arrival */
    int round;    /* the round of its reduction on the network, if active */
    bool active;
    double left;  /* seconds of it left at the link's full rate */
    double share; /* the flows it shares its busiest link with, itself too */
    int bucket_round; /* the round whose buckets' time is in bucket_cost (0: none yet) */
    double bucket_cost;
} red_group;

/* Reductions on the network at the same time share the links they cross. A
** group whose members span level l sends through the link of each of its
** members' units one level down; each active flow moves at 1 / k of its
** rate, k the most flows that meet on one of those links. (R = 2 x 2
** stages on two servers: the two stages' allreduces cross the one link
** between the servers together; measured 1.24 s an update against 0.67 s
** predicted when each had the link to itself.) Sets every active flow's
** share and its members' projected end; count and seen hold levels x W. */
static void links_shared(const rpi_cluster *net, red_group *rg, int n, const int *gid,
                         const int *pos, sim_worker *sw, int W, int *count, int *seen,
                         double now) {
    int active = 0;
    for (int k = 0; k < n; k++)
        if (rg[k].active)
            active++, rg[k].share = 1;
    if (active > 1) {
        size_t cells = (size_t)net->levels * W;
        memset(count, 0, sizeof(int) * cells);
        memset(seen, 0, sizeof(int) * cells);
        for (int pass = 0; pass < 2; pass++) /* count the flows a link carries, then take the most */
            for (int k = 0; k < n; k++) {
                if (!rg[k].active || rg[k].top == 0)
                    continue;
                for (int w = 0; w < W; w++) {
                    if (gid[w] != k)
                        continue;
                    size_t at = (size_t)rg[k].top * W + (size_t)(pos[w] / net->span[rg[k].top - 1]);
                    if (pass == 0 && seen[at] != k + 1)
                        seen[at] = k + 1, count[at]++;
                    else if (pass == 1 && count[at] > rg[k].share)
                        rg[k].share = count[at];
                }
            }
    }
    for (int w = 0; w < W; w++)
        if (sw[w].flow >= 0)
            sw[w].until = now + rg[sw[w].flow].left * rg[sw[w].flow].share;
}

/* A host call of D updates: each worker's operations D times over, the
** micro-batches of update d numbered from d GA, so that a worker goes on
** to the next update while others finish this one, as the engine's do. */
static rp_status repeat_updates(rp_workplan *p, int D, int GA, rp_error *err) {
    for (int v = 0; D > 1 && v < p->devices; v++) { /* a device's order, D times */
        rp_device_ops *dv = &p->dev[v];
        int *wk = malloc(sizeof(int) * ((size_t)dv->num * D + 1));
        int *op = malloc(sizeof(int) * ((size_t)dv->num * D + 1));
        if (!wk || !op) {
            free(wk), free(op);
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for the simulation of %d updates",
                           D);
        }
        for (int d = 0; d < D; d++)
            for (int j = 0; j < dv->num; j++) {
                wk[(size_t)d * dv->num + j] = dv->worker[j];
                op[(size_t)d * dv->num + j] = dv->op[j] + d * p->w[dv->worker[j]].num_ops;
            }
        free(dv->worker), free(dv->op);
        dv->worker = wk, dv->op = op;
        dv->num *= D;
    }
    for (int w = 0; D > 1 && w < p->workers; w++) {
        rp_worker_ops *wo = &p->w[w];
        rp_op *ops = malloc(sizeof(rp_op) * ((size_t)wo->num_ops * D + 1));
        if (!ops)
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for the simulation of %d updates",
                           D);
        for (int d = 0; d < D; d++)
            for (int i = 0; i < wo->num_ops; i++) {
                rp_op op = wo->ops[i];
                if (op.mb >= 0)
                    op.mb += d * GA;
                ops[(size_t)d * wo->num_ops + i] = op;
            }
        free(wo->ops);
        wo->ops = ops;
        wo->num_ops *= D;
    }
    return RP_OK;
}

/* One simulation: the operation lists played, their prices, and the
** clock's books. */
typedef struct sim {
    const rp_config *cfg;
    const rp_sim_options *opt;
    rp_sim_result *res;
    rp_workplan *plan;
    rpi_cluster net;
    rpi_stage_costs c;
    rpi_buckets bk;
    int P, W, T, G, GA, D;
    bool buckets;   /* reduction_bucket_mb across machines */
    bool cpu;       /* one machine: the workers' cores copy and sum */
    bool norm_sync; /* every worker waits at its step for all the norms */
    double membw;   /* bytes/s of one pass over the parameters at the step */
    double wire_sum; /* the replicas' sums' bytes per float's 4 */
    int done;       /* workers through their list */
    int normed;     /* workers that reached their step's norm, over every update */
    sim_worker *sw;
    int *dpc;       /* each device's next operation */
    int *pos;       /* where each worker runs: its device, or itself */
    double *avail;  /* when each message is available: per (to, kind, mb) */
    double *copy;   /* a message's copy left to its receiver: the sender did not wait */
    double *link_free; /* across machines, when each worker's link is free */
    int *gid;       /* each worker's reduction group */
    red_group *rg;
    double *lasts;  /* the groups' last arrivals, rounds of them each */
    int *shared;    /* links_shared's counts */
    double *mt0, *mt1; /* a group's members' last backwards, for the buckets */
} sim;

static void sim_free(sim *m) {
    free(m->sw), free(m->dpc), free(m->pos), free(m->avail), free(m->copy), free(m->link_free);
    free(m->gid), free(m->rg), free(m->lasts), free(m->shared), free(m->mt0);
    rpi_buckets_free(&m->bk);
    rp_workplan_free(m->plan);
}

/* The books of a simulation whose plan, cluster and costs are set. */
static rp_status sim_setup(sim *m, rp_error *err) {
    const rp_config *cfg = m->cfg;
    const rp_sim_options *opt = m->opt;
    rp_sim_result *res = m->res;
    rp_workplan *plan = m->plan;
    int W = m->W, P = m->P, T = m->T;
    int nev = 0, rounds = 1;
    for (int w = 0; w < W; w++) {
        int n = 0;
        for (int i = 0; i < plan->w[w].num_ops; i++)
            n += plan->w[w].ops[i].kind == RP_OP_REDUCE;
        rounds = n > rounds ? n : rounds;
        nev += plan->w[w].num_ops;
    }
    m->G = rp_grouping_num_groups(&cfg->replica_grouping) * T; /* a group of the replicas for each tensor rank */
    int G = m->G;
    res->events = malloc(sizeof(rp_sim_event) * (nev ? nev : 1));
    res->busy = calloc(W, sizeof(double));
    res->in_flight = calloc(W, sizeof(int));
    res->stage_of = malloc(sizeof(int) * W);
    m->mt0 = malloc(sizeof(double) * W * 2), m->mt1 = m->mt0 ? m->mt0 + W : NULL;
    m->sw = calloc(W, sizeof(sim_worker));
    m->dpc = calloc(plan->devices ? plan->devices : 1, sizeof(int));
    m->pos = malloc(sizeof(int) * W);
    m->avail = malloc(sizeof(double) * (size_t)W * 2 * m->GA);
    m->copy = calloc((size_t)W * 2 * m->GA, sizeof(double));
    m->link_free = calloc(W, sizeof(double));
    m->gid = malloc(sizeof(int) * W);
    m->rg = calloc((size_t)P * G, sizeof(red_group));
    m->lasts = calloc((size_t)P * G * rounds, sizeof(double));
    m->shared = malloc(sizeof(int) * 2 * (size_t)m->net.levels * W);
    if (!res->events || !res->busy || !res->in_flight || !res->stage_of || !m->mt0 || !m->sw ||
        !m->dpc || !m->pos || !m->avail || !m->copy || !m->link_free || !m->gid || !m->rg ||
        !m->lasts || !m->shared)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the simulation of %d workers", W);
    for (size_t i = 0; i < (size_t)W * 2 * m->GA; i++)
        m->avail[i] = -1;
    for (int w = 0; w < W; w++) {
        sim_worker *x = &m->sw[w];
        x->arrive = x->until = x->work = -1;
        x->delivers = -1;
        x->flow = -1;
        res->stage_of[w] = plan->w[w].stage;
        m->pos[w] = plan->devices ? plan->device_of[w] : w;
    }
    res->num_levels = m->net.levels;
    /* Reductions: each worker's group (stage and replica group), and per
    ** group its members, its first worker, the slowest level it spans
    ** from there, and its arrivals so far. */
    for (int k = 0; k < P * G; k++)
        m->rg[k].first = -1, m->rg[k].last = m->lasts + (size_t)k * rounds;
    for (int v = 0; v < W; v++) {
        m->gid[v] = plan->w[v].stage * G +
                    rp_grouping_group_of(&cfg->replica_grouping, plan->w[v].replica) * T +
                    plan->w[v].tensor_rank;
        red_group *g = &m->rg[m->gid[v]];
        if (g->first < 0)
            g->first = v;
        int l = rpi_level_of(&m->net, m->pos[g->first], m->pos[v]);
        g->top = l > g->top ? l : g->top;
        g->n++;
    }
    int alike = opt->replicas > 1 ? opt->replicas : 1, units = plan->devices ? plan->devices : W;
    for (int k = 0; k < P * G; k++) { /* each group's allreduce: its members decide */
        int n = 0, *members = m->shared; /* (a scratch of W ints here) */
        for (int v = 0; alike == 1 && (opt->polling || cfg->workers_per_server > 0) && v < W; v++)
            if (m->gid[v] == k)
                members[n++] = v;
        red_group *g = &m->rg[k];
        if (alike > 1 && g->first >= 0) /* the copies' members too: a ring over them all */
            for (int j = 1; j < alike; j++) {
                int l = rpi_level_of(&m->net, m->pos[g->first], m->pos[g->first] + j * units);
                g->top = l > g->top ? l : g->top;
            }
        rpi_reduction_make(&g->how, &m->net, members, g->n, m->pos, g->top,
                           opt->polling && alike == 1, alike == 1 ? cfg->workers_per_server : 0);
        g->how.n = g->n * alike;
    }
    return RP_OK;
}

/* Starts a send. On one machine the later of sender and receiver copies,
** as the local backend and shared-memory MPI do; across machines the
** network moves the bytes while the workers go on, a worker's sends
** leaving over its one link one after another (six 512 KB activations sent
** at once over 100 Mbit take 0.27 s, not 0.044). */
static void start_send(sim *m, int w, const rp_op *op, double now) {
    sim_worker *x = &m->sw[w];
    int s = m->plan->w[w].stage;
    double bytes = op->kind == RP_OP_SEND_ACT ? m->c.act[s] : m->c.act[s - 1];
    int l = rpi_level_of(&m->net, m->pos[w], m->pos[op->peer]);
    double cost = m->net.latency + bytes / m->net.bw[l];
    size_t k = ((size_t)op->peer * 2 + (op->kind == RP_OP_SEND_GRAD)) * m->GA + op->mb;
    m->res->comm_seconds[l] += cost;
    const sim_worker *r = &m->sw[op->peer];
    const rp_op *rop = r->pc < m->plan->w[op->peer].num_ops ? &m->plan->w[op->peer].ops[r->pc]
                                                            : NULL;
    if (!m->cpu) {
        double from = m->link_free[w] > now ? m->link_free[w] : now;
        m->avail[k] = m->link_free[w] = from + cost;
        x->until = m->opt->blocking_sends ? from + cost : now;
    } else if (r->started && rop && rop->mb == op->mb &&
               rop->kind == (op->kind == RP_OP_SEND_ACT ? RP_OP_RECV_ACT : RP_OP_RECV_GRAD)) {
        x->work = cost; /* the receiver waits: the sender copies */
        x->delivers = (long long)k;
    } else {
        m->avail[k] = now;
        m->copy[k] = cost;
        x->until = now;
    }
}

/* How much longer worker w's device takes than the profile's. */
static double slowness(const sim *m, int w) {
    if (!m->opt->device_speed)
        return 1;
    return 1 / m->opt->device_speed[m->plan->devices ? m->plan->device_of[w] : w];
}

/* Starts a step; false while it waits for the norms. Gradient clipping's
** norm and loss scaling's overflow are sums over every worker of their
** reduced gradients (exchange.c): no worker steps before all have reduced
** (the sum of one float itself: its latency, left out). */
static bool start_step(sim *m, int w, double now) {
    sim_worker *x = &m->sw[w];
    const rp_workplan *plan = m->plan;
    if (m->norm_sync) {
        if (!x->at_norm)
            x->at_norm = true, m->normed++;
        /* a device's chunks have all reduced by its first step, which
        ** takes the sums for them all */
        for (int y = 0; plan->devices && y < m->W; y++)
            if (plan->device_of[y] == plan->device_of[w] && !m->sw[y].at_norm &&
                m->sw[y].steps == x->steps)
                m->sw[y].at_norm = true, m->normed++;
        if (m->normed < m->W * (x->steps + 1))
            return false;
        x->at_norm = false, x->steps++, x->t0 = now;
    }
    /* the parameters, once (a shard of them where the options say so) */
    double shards = m->opt->state_shards > 1 ? m->opt->state_shards : 1;
    x->work = m->c.par[plan->w[w].stage] / m->membw / shards * slowness(m, w);
    return true;
}

/* Starts a reduction; false until every member of its stage and group has
** reached it. Then an allreduce over the slowest level the group spans. */
static bool start_reduce(sim *m, int w, double now) {
    sim_worker *x = &m->sw[w];
    int s = m->plan->w[w].stage;
    red_group *g = &m->rg[m->gid[w]];
    if (x->arrive < 0) { /* a member reaches the k-th only after all the k-1-th */
        x->arrive = now;
        int k = g->arrived++ / g->n;
        g->last[k] = now > g->last[k] ? now : g->last[k];
    }
    if (g->arrived < g->n * (x->rounds + 1))
        return false;
    double last = g->last[x->rounds++];
    x->arrive = -1; /* for the next round */
    int top = g->top;
    double cost = rpi_reduction_time(&g->how, m->c.par[s] * m->wire_sum, &m->net, !m->cpu);
    double full = cost;
    if (m->buckets && !g->how.per_server) { /* what is left of the buckets when the last arrives */
        if (g->bucket_round != x->rounds) { /* once a group and round */
            int k = 0;
            for (int v = 0; v < m->W; v++)
                if (m->gid[v] == m->gid[w])
                    m->mt0[k] = m->sw[v].lb0, m->mt1[k++] = m->sw[v].lb1;
            double end = rpi_buckets_end(&m->bk, s, m->mt0, m->mt1, k, m->net.bw[top],
                                         m->net.latency, m->wire_sum);
            g->bucket_round = x->rounds;
            g->bucket_cost = end > last ? end - last : 0;
        }
        cost = g->bucket_cost;
    }
    if (m->cpu) { /* the workers sum in their own cores */
        x->work = cost;
    } else { /* a flow on the network, ended in links_shared */
        if (!g->active || g->round != x->rounds)
            g->active = true, g->round = x->rounds, g->left = cost;
        x->flow = m->gid[w];
        x->until = last + g->left;
    }
    x->reducing += cost;
    if (w == g->first)
        m->res->comm_seconds[top] += full;
    return true;
}

/* Starts worker w's operation op at now; false when it cannot start yet. */
static bool start_op(sim *m, int w, const rp_op *op, double now) {
    sim_worker *x = &m->sw[w];
    int s = m->plan->w[w].stage;
    switch (op->kind) {
    case RP_OP_RECV_ACT:
    case RP_OP_RECV_GRAD: {
        size_t k = ((size_t)w * 2 + (op->kind == RP_OP_RECV_GRAD)) * m->GA + op->mb;
        if (m->avail[k] < 0)
            return false;
        if (m->copy[k] > 0) /* the sender went on: the receiver copies */
            x->work = m->copy[k], m->copy[k] = 0;
        else
            x->until = m->avail[k] > now ? m->avail[k] : now;
        return true;
    }
    case RP_OP_SEND_ACT:
    case RP_OP_SEND_GRAD:
        start_send(m, w, op, now);
        return true;
    case RP_OP_FORWARD:
        x->work = m->c.f[s] * slowness(m, w);
        if (++x->held > m->res->in_flight[w])
            m->res->in_flight[w] = x->held;
        return true;
    case RP_OP_BACKWARD:
        x->work = m->c.b[s] * slowness(m, w);
        x->held--;
        return true;
    case RP_OP_BACKWARD_INPUT:
        x->work = m->c.bi[s] * slowness(m, w);
        return true;
    case RP_OP_BACKWARD_WEIGHT:
        x->work = m->c.bw[s] * slowness(m, w);
        x->held--;
        return true;
    case RP_OP_STEP:
        return start_step(m, w, now);
    case RP_OP_WAIT_SENDS:
        x->until = now;
        return true;
    case RP_OP_REDUCE:
        return start_reduce(m, w, now);
    }
    return true;
}

/* Worker w's operation at pc is over at t: its event, and the next. */
static void finish_op(sim *m, int w, const rp_op *op, double t) {
    sim_worker *x = &m->sw[w];
    rp_sim_result *res = m->res;
    res->events[res->num_events++] = (rp_sim_event){w, op->kind, op->mb, x->t0, t};
    x->work = x->until = -1;
    x->flow = -1; /* (else links_shared would end its next operation) */
    x->started = false;
    if (m->plan->devices)
        m->dpc[m->plan->device_of[w]]++;
    if (++x->pc == m->plan->w[w].num_ops)
        m->done++;
}

/* Starts what worker w can start at now, in order; true if anything moved.
** Sends and receives of arrived messages are over at once. */
static bool start_ops(sim *m, int w, double now) {
    sim_worker *x = &m->sw[w];
    const rp_workplan *plan = m->plan;
    const rp_worker_ops *wo = &plan->w[w];
    bool moved = false;
    while (x->pc < wo->num_ops && x->work < 0 && x->until < 0) {
        const rp_op *op = &wo->ops[x->pc];
        if (plan->devices) { /* a device runs one of its workers' at a time */
            const rp_device_ops *dv = &plan->dev[plan->device_of[w]];
            int j = m->dpc[plan->device_of[w]];
            if (j >= dv->num || dv->worker[j] != w || dv->op[j] != x->pc)
                return moved;
        }
        if (!x->started)
            x->started = true, x->t0 = now;
        if (!start_op(m, w, op, now))
            return moved;
        moved = true;
        if (x->until >= 0 && x->until <= now) /* over at once */
            finish_op(m, w, op, now);
    }
    return moved;
}

/* Moves the clock from now to next, every computation at rate: what it
** computed, copied, and what ends there. */
static void advance(sim *m, double now, double next, double rate) {
    int n = m->P * m->G;
    for (int k = 0; k < n; k++)
        if (m->rg[k].active && (m->rg[k].left -= (next - now) / m->rg[k].share) <= 1e-12)
            m->rg[k].active = false;
    for (int w = 0; w < m->W; w++) {
        sim_worker *x = &m->sw[w];
        const rp_worker_ops *wo = &m->plan->w[w];
        const rp_op *op = &wo->ops[x->pc < wo->num_ops ? x->pc : 0];
        bool over;
        if (x->work >= 0) {
            x->work -= (next - now) * rate;
            if (op_computes(op->kind))
                m->res->busy[w] += next - now;
            else if (op->kind != RP_OP_REDUCE)
                x->copying += next - now;
            over = x->work <= 1e-12 * (next > 1 ? next : 1);
        } else {
            over = x->until >= 0 && x->until <= next;
        }
        if (!over)
            continue;
        if (op->kind == RP_OP_BACKWARD || op->kind == RP_OP_BACKWARD_WEIGHT)
            x->lb0 = x->t0, x->lb1 = next;
        if (x->delivers >= 0)
            m->avail[x->delivers] = next, x->delivers = -1;
        finish_op(m, w, op, next);
    }
}

/* Global time: start every operation that can start now, then move to the
** next moment something ends: a computation, whose rate is 1 or, when more
** workers compute than there are cores, cores / computing; or a wait for a
** message or a reduction whose end is known. Returns the call's end. */
static rp_status play(sim *m, double *end, rp_error *err) {
    double now = 0;
    for (;;) {
        for (bool moved = true; moved;) {
            moved = false;
            for (int w = 0; w < m->W; w++)
                moved |= start_ops(m, w, now);
        }
        if (m->done == m->W)
            break;
        if (!m->cpu) /* network reductions at the same time share their links */
            links_shared(&m->net, m->rg, m->P * m->G, m->gid, m->pos, m->sw, m->W, m->shared,
                         m->shared + (size_t)m->net.levels * m->W, now);
        /* the workers that want a core: those computing, and under
        ** polling those waiting too */
        int computing = 0;
        for (int w = 0; m->opt->cores > 0 && w < m->W; w++)
            computing += m->sw[w].work >= 0 || (m->opt->polling && m->sw[w].pc < m->plan->w[w].num_ops);
        double rate = m->opt->cores > 0 && computing > m->opt->cores
                          ? (double)m->opt->cores / computing : 1;
        double next = -1;
        for (int w = 0; w < m->W; w++) {
            double t = m->sw[w].work >= 0 ? now + m->sw[w].work / rate : m->sw[w].until;
            if (t >= 0 && (next < 0 || t < next))
                next = t;
        }
        if (next < 0) /* cannot happen after rp_workplan_check */
            return rp_fail(err, RP_ERR_INVALID, "simulate: every worker waits at %g s", now);
        advance(m, now, next, rate);
        now = next;
    }
    *end = now;
    return RP_OK;
}

rp_status rp_simulate(const rp_config *cfg, const double *fwd_ms, const double *bwd_ms,
                      const double *out_bytes, const double *param_bytes, int num_layers,
                      const rp_sim_options *opt, rp_sim_result *res, rp_error *err) {
    memset(res, 0, sizeof *res);
    int counts[RP_MAX_STAGES];
    rp_status st = rp_config_stage_layers(cfg, false, num_layers, counts, err);
    if (st || (st = rp_schedule_check_config(cfg, err)))
        return st;
    sim m = {.cfg = cfg, .opt = opt, .res = res};
    if ((st = rp_workplan_build(cfg, &m.plan, err)))
        return st;
    m.D = cfg->device_iterations > 1 ? cfg->device_iterations : 1;
    m.GA = cfg->gradient_accumulation_steps * m.D; /* micro-batch numbers of the call */
    if ((st = rp_workplan_check(m.plan, NULL, err)) ||
        (st = repeat_updates(m.plan, m.D, cfg->gradient_accumulation_steps, err)) ||
        (st = rpi_cluster_make(opt, (m.plan->devices ? m.plan->devices : m.plan->workers) *
                                        (opt->replicas > 1 ? opt->replicas : 1),
                               &m.net, err))) {
        rp_workplan_free(m.plan);
        return st;
    }
    m.P = m.plan->stages, m.W = m.plan->workers, m.T = rp_config_tensor_parallel(cfg);
    for (int w = 0; opt->device_speed && w < m.W; w++) {
        int d = m.plan->devices ? m.plan->device_of[w] : w;
        if (!(opt->device_speed[d] > 0) || !isfinite(opt->device_speed[d])) {
            rp_workplan_free(m.plan);
            return rp_fail(err, RP_ERR_INVALID,
                           "simulate: device %d's speed is %g (a positive number, 1 for the "
                           "profile's device)", d, opt->device_speed[d]);
        }
    }
    if (m.T > 1 && !opt->tensor_split) {
        rp_workplan_free(m.plan);
        return rp_fail(err, RP_ERR_INVALID,
                       "simulate: tensor_parallel %d needs the layers' split (--tensor-split "
                       "MODEL: the profiled model)", m.T);
    }
    rpi_stage_costs_make(cfg, counts, m.P, fwd_ms, bwd_ms, out_bytes, param_bytes, num_layers,
                         opt, &m.c);
    /* reduction_bucket_mb: across machines the buckets move while the last
    ** backward computes (on one machine the local backend sums each where
    ** it is announced: nothing to overlap) */
    m.buckets = cfg->reduction_bucket_mb > 0 && opt->num_levels > 0;
    m.membw = opt->memory_bandwidth > 0 ? opt->memory_bandwidth : 1e10;
    /* fp16 exchange halves the replicas' sums too (the engine's sharded
    ** reduction stays fp32); mixed precision reduces bf16 gradients, sharded
    ** or not (Megatron-LM's distributed optimizer reduce-scatters them) */
    m.wire_sum = opt->mixed_precision || (cfg->fp16_exchange && !cfg->replicated_tensor_sharding)
                     ? 0.5
                     : 1.0;
    /* On one machine (no hierarchy given) a transfer is a copy and a
    ** reduction a sum, both by the workers' own cores. Across machines the
    ** network moves the bytes while the workers go on, even where the
    ** workers share cores (ranks in network namespaces on one machine):
    ** charging the transfers to the cores predicted data parallelism on 4
    ** ranks over a 100 Mbit link 151 % slow, 26 % without. */
    m.cpu = opt->num_levels == 0;
    m.norm_sync = (cfg->gradient_clipping > 0 || cfg->auto_loss_scaling) &&
                  cfg->schedule < RP_SCHEDULE_PIPEDREAM;
    double now = 0;
    if ((m.buckets && (st = rpi_buckets_make(cfg, counts, m.P, bwd_ms, param_bytes, opt, &m.bk,
                                             err))) ||
        (st = sim_setup(&m, err)) || (st = play(&m, &now, err))) {
        sim_free(&m);
        rp_sim_result_free(res);
        return st;
    }
    res->update_time = now / m.D; /* the call's time, per update */
    /* idle time of the threads or ranks: a device's workers share its time */
    int units = m.plan->devices ? m.plan->devices : m.W;
    double idle = units * now;
    for (int w = 0; w < m.W; w++) {
        idle -= res->busy[w] + m.sw[w].reducing + m.sw[w].copying;
        res->busy[w] = now > 0 ? res->busy[w] / now : 0;
    }
    res->bubble_fraction = now > 0 && idle > 0 ? idle / (units * now) : 0;
    res->workers = m.W;
    res->stages = m.P;
    for (int s = 0, l = 0; s < m.P; l += counts[s], s++) {
        int slots = 0;
        for (int w = 0; w < m.W; w++)
            if (m.plan->w[w].stage == s && m.plan->w[w].slots > slots)
                slots = m.plan->w[w].slots;
        res->stage_bytes[s] = rpi_stage_bytes(cfg, out_bytes, param_bytes, l, counts[s],
                                              rp_config_stage_replicas(cfg, s), slots,
                                              m.c.per_mb, opt);
    }
    sim_free(&m);
    return RP_OK;
}

void rp_sim_result_free(rp_sim_result *r) {
    free(r->events);
    free(r->busy);
    free(r->in_flight);
    free(r->stage_of);
    memset(r, 0, sizeof *r);
}
