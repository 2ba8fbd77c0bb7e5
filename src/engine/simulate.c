/*
** Predicting an update's time: the workers' operation lists, played on one
** clock for all of them with the profile's layer times and the machines'
** prices.
*/
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/schedule.h"
#include "repipe/simulate.h"
#include "simulate_impl.h"
#include "sharding.h"

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

rp_status rp_simulate(const rp_config *cfg, const double *fwd_ms, const double *bwd_ms,
                      const double *out_bytes, const double *param_bytes, int num_layers,
                      const rp_sim_options *opt, rp_sim_result *res, rp_error *err) {
    memset(res, 0, sizeof *res);
    int counts[RP_MAX_STAGES];
    rp_status st = rp_config_stage_layers(cfg, false, num_layers, counts, err);
    if (st || (st = rp_schedule_check_config(cfg, err)))
        return st;
    rp_workplan *plan;
    if ((st = rp_workplan_build(cfg, &plan, err)))
        return st;
    rpi_cluster net;
    int D = cfg->device_iterations > 1 ? cfg->device_iterations : 1;
    if ((st = rp_workplan_check(plan, NULL, err)) ||
        (st = repeat_updates(plan, D, cfg->gradient_accumulation_steps, err)) ||
        (st = rpi_cluster_make(opt, plan->devices ? plan->devices : plan->workers, &net, err))) {
        rp_workplan_free(plan);
        return st;
    }
    int P = plan->stages, W = plan->workers, T = rp_config_tensor_parallel(cfg);
    if (T > 1 && !opt->tensor_split) {
        rp_workplan_free(plan);
        return rp_fail(err, RP_ERR_INVALID,
                       "simulate: tensor_parallel %d needs the layers' split (--tensor-split "
                       "MODEL: the profiled model)", T);
    }
    rpi_stage_costs c;
    rpi_stage_costs_make(cfg, counts, P, fwd_ms, bwd_ms, out_bytes, param_bytes, num_layers, opt,
                         &c);
    const double *tf = c.f, *tb = c.b, *ti = c.bi, *tw = c.bw, *act = c.act, *par = c.par;
    double per_mb = c.per_mb;
    /* reduction_bucket_mb: across machines the buckets move while the last
    ** backward computes (on one machine the local backend sums each where
    ** it is announced: nothing to overlap) */
    rpi_buckets bk = {0};
    bool buckets = cfg->reduction_bucket_mb > 0 && opt->num_levels > 0;
    double *mt0 = malloc(sizeof(double) * W * 2), *mt1 = mt0 ? mt0 + W : NULL;
    if (!mt0 || (buckets && (st = rpi_buckets_make(cfg, counts, P, bwd_ms, param_bytes, opt,
                                                    &bk, err)))) {
        free(mt0);
        rp_workplan_free(plan);
        return st ? st : rp_fail(err, RP_ERR_NOMEM, "out of memory for %d workers", W);
    }
    double membw = opt->memory_bandwidth > 0 ? opt->memory_bandwidth : 1e10;
    /* fp16 exchange halves the replicas' sums too (a sharded reduction stays fp32) */
    double wire_sum = cfg->fp16_exchange && !cfg->replicated_tensor_sharding ? 0.5 : 1.0;
    int nev = 0;
    for (int w = 0; w < W; w++)
        nev += plan->w[w].num_ops;
    res->events = malloc(sizeof(rp_sim_event) * (nev ? nev : 1));
    res->busy = calloc(W, sizeof(double));
    res->in_flight = calloc(W, sizeof(int));
    res->stage_of = malloc(sizeof(int) * W);
    int GA = cfg->gradient_accumulation_steps * D; /* micro-batch numbers of the call */
    sim_worker *sw = calloc(W, sizeof(sim_worker));
    int *dpc = calloc(plan->devices ? plan->devices : 1, sizeof(int)); /* each device's next */
    int *pos = malloc(sizeof(int) * W); /* where each worker runs: its device, or itself */
    for (int w = 0; pos && w < W; w++)
        pos[w] = plan->devices ? plan->device_of[w] : w;
    /* when each message is available: per (to, kind, mb) */
    double *avail = malloc(sizeof(double) * (size_t)W * 2 * GA);
    /* a message's copy left to its receiver: the sender did not wait */
    double *copy = calloc((size_t)W * 2 * GA, sizeof(double));
    /* across machines, when each worker's link is free for its next message:
    ** a worker's sends leave over its one link, one after another (six 512 KB
    ** activations sent at once over 100 Mbit take 0.27 s, not 0.044) */
    double *link_free = calloc(W, sizeof(double));
    /* On one machine (no hierarchy given) a transfer is a copy and a
    ** reduction a sum, both by the workers' own cores: the later of sender
    ** and receiver copies, as the local backend and shared-memory MPI do.
    ** Across machines the network moves the bytes while the workers go on,
    ** even where the workers share cores (ranks in network namespaces on
    ** one machine): charging the transfers to the cores predicted data
    ** parallelism on 4 ranks over a 100 Mbit link 151 % slow, 26 % without. */
    bool cpu = opt->num_levels == 0;
    /* Reductions: each worker's group (stage and replica group), and per
    ** group its members, its first worker, the slowest level it spans
    ** from there, and its arrivals so far. */
    int G = rp_grouping_num_groups(&cfg->replica_grouping), done = 0;
    int *gid = malloc(sizeof(int) * W), rounds = 1;
    for (int w = 0; w < W; w++) {
        int n = 0;
        for (int i = 0; i < plan->w[w].num_ops; i++)
            n += plan->w[w].ops[i].kind == RP_OP_REDUCE;
        rounds = n > rounds ? n : rounds;
    }
    G *= T; /* a group of the replicas for each tensor rank */
    red_group *rg = calloc((size_t)P * G, sizeof(red_group));
    double *lasts = calloc((size_t)P * G * rounds, sizeof(double));
    int *shared = malloc(sizeof(int) * 2 * (size_t)net.levels * W); /* links_shared's counts */
    if (!res->events || !res->busy || !res->in_flight || !res->stage_of || !sw || !dpc || !pos ||
        !avail || !link_free ||
        !copy || !gid || !rg || !lasts || !shared) {
        free(sw), free(dpc), free(pos), free(avail), free(copy), free(gid), free(rg), free(lasts), free(shared);
        free(mt0), rpi_buckets_free(&bk), free(link_free);
        rp_workplan_free(plan);
        rp_sim_result_free(res);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the simulation of %d workers", W);
    }
    for (size_t i = 0; i < (size_t)W * 2 * GA; i++)
        avail[i] = -1;
    for (int w = 0; w < W; w++) {
        sw[w].arrive = sw[w].until = sw[w].work = -1;
        sw[w].delivers = -1;
        sw[w].flow = -1;
        res->stage_of[w] = plan->w[w].stage;
    }
    res->num_levels = net.levels;
    for (int k = 0; k < P * G; k++)
        rg[k].first = -1, rg[k].last = lasts + (size_t)k * rounds;
    for (int v = 0; v < W; v++) {
        gid[v] = plan->w[v].stage * G +
                 rp_grouping_group_of(&cfg->replica_grouping, plan->w[v].replica) * T +
                 plan->w[v].tensor_rank;
        red_group *g = &rg[gid[v]];
        if (g->first < 0)
            g->first = v;
        int l = rpi_level_of(&net, pos[g->first], pos[v]);
        g->top = l > g->top ? l : g->top;
        g->n++;
    }
    for (int k = 0; k < P * G; k++) { /* each group's allreduce: its members decide */
        int m = 0, *members = shared; /* (a scratch of W ints here) */
        for (int v = 0; (opt->polling || cfg->workers_per_server > 0) && v < W; v++)
            if (gid[v] == k)
                members[m++] = v;
        rpi_reduction_make(&rg[k].how, &net, members, rg[k].n, pos, rg[k].top, opt->polling,
                           cfg->workers_per_server);
    }
    bool norm_sync = (cfg->gradient_clipping > 0 || cfg->auto_loss_scaling) &&
                     cfg->schedule < RP_SCHEDULE_PIPEDREAM;
    int normed = 0; /* workers that reached their step's norm, over every update */
    double now = 0;
    /* Global time: start every operation that can start now (sends and
    ** receives of arrived messages finish at once), then move to the next
    ** moment something ends: a computation, whose rate is 1 or, when more
    ** workers compute than there are cores, cores / computing; or a wait
    ** for a message or a reduction whose end is known. */
    for (;;) {
        for (bool moved = true; moved;) {
            moved = false;
            for (int w = 0; w < W; w++) {
                sim_worker *x = &sw[w];
                const rp_worker_ops *wo = &plan->w[w];
                int s = wo->stage;
                while (x->pc < wo->num_ops && x->work < 0 && x->until < 0) {
                    const rp_op *op = &wo->ops[x->pc];
                    if (plan->devices) { /* a device runs one of its workers' at a time */
                        const rp_device_ops *dv = &plan->dev[plan->device_of[w]];
                        int j = dpc[plan->device_of[w]];
                        if (j >= dv->num || dv->worker[j] != w || dv->op[j] != x->pc)
                            goto blocked;
                    }
                    if (!x->started)
                        x->started = true, x->t0 = now;
                    switch (op->kind) {
                    case RP_OP_RECV_ACT:
                    case RP_OP_RECV_GRAD: {
                        size_t k = ((size_t)w * 2 + (op->kind == RP_OP_RECV_GRAD)) * GA + op->mb;
                        if (avail[k] < 0)
                            goto blocked;
                        if (copy[k] > 0) /* the sender went on: the receiver copies */
                            x->work = copy[k], copy[k] = 0;
                        else
                            x->until = avail[k] > now ? avail[k] : now;
                        break;
                    }
                    case RP_OP_SEND_ACT:
                    case RP_OP_SEND_GRAD: {
                        double bytes = op->kind == RP_OP_SEND_ACT ? act[s] : act[s - 1];
                        int l = rpi_level_of(&net, pos[w], pos[op->peer]);
                        double cost = net.latency + bytes / net.bw[l];
                        size_t k = ((size_t)op->peer * 2 + (op->kind == RP_OP_SEND_GRAD)) * GA +
                                   op->mb;
                        res->comm_seconds[l] += cost;
                        const sim_worker *r = &sw[op->peer];
                        const rp_op *rop = r->pc < plan->w[op->peer].num_ops
                                               ? &plan->w[op->peer].ops[r->pc] : NULL;
                        if (!cpu) {
                            double from = link_free[w] > now ? link_free[w] : now;
                            avail[k] = link_free[w] = from + cost;
                            x->until = now;
                        } else if (r->started && rop && rop->mb == op->mb &&
                                   rop->kind == (op->kind == RP_OP_SEND_ACT ? RP_OP_RECV_ACT
                                                                            : RP_OP_RECV_GRAD)) {
                            x->work = cost; /* the receiver waits: the sender copies */
                            x->delivers = (long long)k;
                        } else {
                            avail[k] = now;
                            copy[k] = cost;
                            x->until = now;
                        }
                        break;
                    }
                    case RP_OP_FORWARD:
                        x->work = tf[s];
                        if (++x->held > res->in_flight[w])
                            res->in_flight[w] = x->held;
                        break;
                    case RP_OP_BACKWARD:
                        x->work = tb[s];
                        x->held--;
                        break;
                    case RP_OP_BACKWARD_INPUT:
                        x->work = ti[s];
                        break;
                    case RP_OP_BACKWARD_WEIGHT:
                        x->work = tw[s];
                        x->held--;
                        break;
                    case RP_OP_STEP:
                        /* gradient clipping's norm and loss scaling's overflow
                        ** are sums over every worker of their reduced
                        ** gradients (exchange.c): no worker steps before all
                        ** have reduced (the sum of one float itself: its
                        ** latency, left out) */
                        if (norm_sync) {
                            if (!x->at_norm)
                                x->at_norm = true, normed++;
                            /* a device's chunks have all reduced by its
                            ** first step, which takes the sums for them all */
                            for (int y = 0; plan->devices && y < W; y++)
                                if (plan->device_of[y] == plan->device_of[w] && !sw[y].at_norm &&
                                    sw[y].steps == x->steps)
                                    sw[y].at_norm = true, normed++;
                            if (normed < W * (x->steps + 1))
                                goto blocked;
                            x->at_norm = false, x->steps++, x->t0 = now;
                        }
                        x->work = par[s] / membw; /* one pass over the parameters */
                        break;
                    case RP_OP_WAIT_SENDS:
                        x->until = now;
                        break;
                    case RP_OP_REDUCE: {
                        /* everyone of the stage and group, then an allreduce
                        ** over the slowest level the group spans */
                        red_group *g = &rg[gid[w]];
                        if (x->arrive < 0) { /* a member reaches the k-th only after all the k-1-th */
                            x->arrive = now;
                            int k = g->arrived++ / g->n;
                            g->last[k] = now > g->last[k] ? now : g->last[k];
                        }
                        if (g->arrived < g->n * (x->rounds + 1))
                            goto blocked;
                        double last = g->last[x->rounds++];
                        x->arrive = -1; /* for the next round */
                        int first = g->first, top = g->top;
                        double cost = rpi_reduction_time(&g->how, par[s] * wire_sum, &net, !cpu);
                        double full = cost;
                        if (buckets && !g->how.per_server) { /* what is left of the buckets when the last arrives */
                            if (g->bucket_round != x->rounds) { /* once a group and round */
                                int k = 0;
                                for (int v = 0; v < W; v++)
                                    if (gid[v] == gid[w])
                                        mt0[k] = sw[v].lb0, mt1[k++] = sw[v].lb1;
                                double end = rpi_buckets_end(&bk, s, mt0, mt1, k, net.bw[top],
                                                             net.latency, wire_sum);
                                g->bucket_round = x->rounds;
                                g->bucket_cost = end > last ? end - last : 0;
                            }
                            cost = g->bucket_cost;
                        }
                        if (cpu) { /* the workers sum in their own cores */
                            x->work = cost;
                        } else { /* a flow on the network, ended in links_shared */
                            if (!g->active || g->round != x->rounds)
                                g->active = true, g->round = x->rounds, g->left = cost;
                            x->flow = gid[w];
                            x->until = last + g->left;
                        }
                        x->reducing += cost;
                        if (w == first)
                            res->comm_seconds[top] += full;
                        break;
                    }
                    }
                    moved = true;
                    if (x->until >= 0 && x->until <= now) { /* over at once */
                        res->events[res->num_events++] =
                            (rp_sim_event){w, op->kind, op->mb, x->t0, now};
                        x->until = -1;
                        x->flow = -1; /* (else links_shared would end its next operation) */
                        x->started = false;
                        if (plan->devices)
                            dpc[plan->device_of[w]]++;
                        if (++x->pc == wo->num_ops)
                            done++;
                    }
                }
            blocked:;
            }
        }
        if (done == W)
            break;
        if (!cpu) /* network reductions at the same time share their links */
            links_shared(&net, rg, P * G, gid, pos, sw, W, shared, shared + (size_t)net.levels * W, now);
        /* the workers that want a core: those computing, and under
        ** polling those waiting too */
        int computing = 0;
        for (int w = 0; w < W; w++)
            computing += sw[w].work >= 0 || (opt->polling && sw[w].pc < plan->w[w].num_ops);
        double rate = opt->cores > 0 && computing > opt->cores ? (double)opt->cores / computing : 1;
        double next = -1;
        for (int w = 0; w < W; w++) {
            double t = sw[w].work >= 0 ? now + sw[w].work / rate : sw[w].until;
            if (t >= 0 && (next < 0 || t < next))
                next = t;
        }
        if (next < 0) { /* cannot happen after rp_workplan_check */
            free(sw), free(dpc), free(pos), free(avail), free(copy), free(gid), free(rg), free(lasts), free(shared);
        free(mt0), rpi_buckets_free(&bk), free(link_free);
            rp_workplan_free(plan);
            rp_sim_result_free(res);
            return rp_fail(err, RP_ERR_INVALID, "simulate: every worker waits at %g s", now);
        }
        for (int k = 0; k < P * G; k++)
            if (rg[k].active && (rg[k].left -= (next - now) / rg[k].share) <= 1e-12)
                rg[k].active = false;
        for (int w = 0; w < W; w++) {
            sim_worker *x = &sw[w];
            bool over;
            const rp_op *op = &plan->w[w].ops[x->pc < plan->w[w].num_ops ? x->pc : 0];
            if (x->work >= 0) {
                x->work -= (next - now) * rate;
                if (op_computes(op->kind))
                    res->busy[w] += next - now;
                else if (op->kind != RP_OP_REDUCE)
                    x->copying += next - now;
                over = x->work <= 1e-12 * (next > 1 ? next : 1);
            } else {
                over = x->until >= 0 && x->until <= next;
            }
            if (over) {
                if (op->kind == RP_OP_BACKWARD || op->kind == RP_OP_BACKWARD_WEIGHT)
                    x->lb0 = x->t0, x->lb1 = next;
                if (x->delivers >= 0)
                    avail[x->delivers] = next, x->delivers = -1;
                res->events[res->num_events++] = (rp_sim_event){w, op->kind, op->mb, x->t0, next};
                x->work = x->until = -1;
                x->flow = -1;
                x->started = false;
                if (plan->devices)
                    dpc[plan->device_of[w]]++;
                if (++x->pc == plan->w[w].num_ops)
                    done++;
            }
        }
        now = next;
    }
    res->update_time = now / D; /* the call's time, per update */
    /* idle time of the threads or ranks: a device's workers share its time */
    int units = plan->devices ? plan->devices : W;
    double idle = units * now;
    for (int w = 0; w < W; w++) {
        idle -= res->busy[w] + sw[w].reducing + sw[w].copying;
        res->busy[w] = now > 0 ? res->busy[w] / now : 0;
    }
    res->bubble_fraction = now > 0 && idle > 0 ? idle / (units * now) : 0;
    res->workers = W;
    res->stages = P;
    for (int s = 0, l = 0; s < P; l += counts[s], s++) {
        int slots = 0;
        for (int w = 0; w < W; w++)
            if (plan->w[w].stage == s && plan->w[w].slots > slots)
                slots = plan->w[w].slots;
        res->stage_bytes[s] = rpi_stage_bytes(cfg, out_bytes, param_bytes, l, counts[s],
                                              rp_config_stage_replicas(cfg, s), slots, per_mb,
                                              opt->polling);
    }
    free(sw), free(dpc), free(pos), free(avail), free(copy), free(gid), free(rg), free(lasts), free(shared);
        free(mt0), rpi_buckets_free(&bk), free(link_free);
    rp_workplan_free(plan);
    return RP_OK;
}

void rp_sim_result_free(rp_sim_result *r) {
    free(r->events);
    free(r->busy);
    free(r->in_flight);
    free(r->stage_of);
    memset(r, 0, sizeof *r);
}
