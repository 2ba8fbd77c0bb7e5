/*
** The simulator's event loop: every worker's operation list played on one
** clock, computing at its device's speed, sending and receiving over the
** cluster's links, reducing in groups that share the links they cross.
*/
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "sim_play.h"
#include "../sched/sharding.h"

/* The operations that compute (the rest move messages or wait). */
static bool op_computes(int k) {
    return k == RP_OP_FORWARD || k == RP_OP_BACKWARD || k == RP_OP_STEP ||
           k == RP_OP_BACKWARD_INPUT || k == RP_OP_BACKWARD_WEIGHT;
}

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
rp_status rpi_sim_play(sim *m, double *end, rp_error *err) {
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

