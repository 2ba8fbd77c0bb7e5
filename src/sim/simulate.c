/*
** Predicting an update's time: the workers' operation lists, played on one
** clock for all of them (sim_play.c) with the profile's layer times and the
** machines' prices; here the plan, the books and the result.
*/
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/schedule.h"
#include "repipe/simulate.h"
#include "sim_play.h"
#include "simulate_impl.h"
#include "../sched/sharding.h"

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

/* The simulation's plan: the schedule's lists (an update's repeated for
** each device iteration), checked free of waits, its cluster, and the
** devices' speeds; the plan freed where it fails. */
static rp_status sim_plan(sim *m, rp_error *err) {
    const rp_config *cfg = m->cfg;
    const rp_sim_options *opt = m->opt;
    rp_status st = rp_workplan_build(cfg, &m->plan, err);
    if (st)
        return st;
    m->D = cfg->device_iterations > 1 ? cfg->device_iterations : 1;
    m->GA = cfg->gradient_accumulation_steps * m->D; /* micro-batch numbers of the call */
    int units = m->plan->devices ? m->plan->devices : m->plan->workers;
    if (!(st = rp_workplan_check(m->plan, NULL, err)) &&
        !(st = repeat_updates(m->plan, m->D, cfg->gradient_accumulation_steps, err)))
        st = rpi_cluster_make(opt, units * (opt->replicas > 1 ? opt->replicas : 1), &m->net, err);
    m->P = m->plan->stages, m->W = m->plan->workers, m->T = rp_config_tensor_parallel(cfg);
    for (int w = 0; !st && opt->device_speed && w < m->W; w++) {
        int d = m->plan->devices ? m->plan->device_of[w] : w;
        if (!(opt->device_speed[d] > 0) || !isfinite(opt->device_speed[d]))
            st = rp_fail(err, RP_ERR_INVALID,
                         "simulate: device %d's speed is %g (a positive number, 1 for the "
                         "profile's device)", d, opt->device_speed[d]);
    }
    if (!st && m->T > 1 && !opt->tensor_split && !opt->tensor_measured)
        st = rp_fail(err, RP_ERR_INVALID,
                     "simulate: tensor_parallel %d needs the layers' split (--tensor-split "
                     "MODEL: the profiled model) or a profile measured on a rank of such a "
                     "group (tensor_parallel=%d in its Input's description)", m->T, m->T);
    if (st) {
        rp_workplan_free(m->plan);
        m->plan = NULL;
    }
    return st;
}

/* What the simulation assumes of the machines and the configuration. */
static void sim_terms(sim *m) {
    const rp_config *cfg = m->cfg;
    const rp_sim_options *opt = m->opt;
    /* reduction_bucket_mb: across machines the buckets move while the last
    ** backward computes (on one machine the local backend sums each where
    ** it is announced: nothing to overlap) */
    m->buckets = cfg->reduction_bucket_mb > 0 && opt->num_levels > 0;
    m->membw = opt->memory_bandwidth > 0 ? opt->memory_bandwidth : 1e10;
    /* fp16 exchange halves the replicas' sums too (the engine's sharded
    ** reduction stays fp32); mixed precision reduces bf16 gradients, sharded
    ** or not (Megatron-LM's distributed optimizer reduce-scatters them) */
    m->wire_sum = opt->mixed_precision || (cfg->fp16_exchange && !cfg->replicated_tensor_sharding)
                      ? 0.5
                      : 1.0;
    /* On one machine (no hierarchy given) a transfer is a copy and a
    ** reduction a sum, both by the workers' own cores. Across machines the
    ** network moves the bytes while the workers go on, even where the
    ** workers share cores (ranks in network namespaces on one machine):
    ** charging the transfers to the cores predicted data parallelism on 4
    ** ranks over a 100 Mbit link 151 % slow, 26 % without. */
    m->cpu = opt->num_levels == 0;
    m->norm_sync = (cfg->gradient_clipping > 0 || cfg->auto_loss_scaling) &&
                   cfg->schedule < RP_SCHEDULE_PIPEDREAM;
}

/* The result of a call of `now` seconds: the update's time, each worker's
** busy share and the bubble (a device's workers share its time), each
** stage's bytes. */
static void sim_result(const sim *m, const int *counts, const double *out_bytes,
                       const double *param_bytes, double now, rp_sim_result *res) {
    const rp_config *cfg = m->cfg;
    res->update_time = now / m->D; /* the call's time, per update */
    int units = m->plan->devices ? m->plan->devices : m->W;
    double idle = units * now;
    for (int w = 0; w < m->W; w++) {
        idle -= res->busy[w] + m->sw[w].reducing + m->sw[w].copying;
        res->busy[w] = now > 0 ? res->busy[w] / now : 0;
    }
    res->bubble_fraction = now > 0 && idle > 0 ? idle / (units * now) : 0;
    res->workers = m->W;
    res->stages = m->P;
    for (int s = 0, l = 0; s < m->P; l += counts[s], s++) {
        int slots = 0;
        for (int w = 0; w < m->W; w++)
            if (m->plan->w[w].stage == s && m->plan->w[w].slots > slots)
                slots = m->plan->w[w].slots;
        res->stage_bytes[s] = rpi_stage_bytes(cfg, out_bytes, param_bytes, l, counts[s],
                                              rp_config_stage_replicas(cfg, s), slots,
                                              m->c.per_mb, m->opt);
    }
}

rp_status rp_simulate(const rp_config *cfg, const double *fwd_ms, const double *bwd_ms,
                      const double *out_bytes, const double *param_bytes, int num_layers,
                      const rp_sim_options *opt, rp_sim_result *res, rp_error *err) {
    memset(res, 0, sizeof *res);
    int counts[RP_MAX_STAGES];
    rp_status st = rp_config_stage_layers(cfg, false, num_layers, counts, err);
    if (!st && rp_config_last_recomputed(cfg) >= num_layers)
        st = rp_fail(err, RP_ERR_INVALID,
                     "simulate: recompute_layers names layer %d; the profile's layers are 0 to %d",
                     rp_config_last_recomputed(cfg), num_layers - 1);
    if (st || (st = rp_schedule_check_config(cfg, err)))
        return st;
    sim m = {.cfg = cfg, .opt = opt, .res = res};
    if ((st = sim_plan(&m, err)))
        return st;
    rpi_stage_costs_make(cfg, counts, m.P, fwd_ms, bwd_ms, out_bytes, param_bytes, num_layers,
                         opt, &m.c);
    sim_terms(&m);
    double now = 0;
    if ((m.buckets && (st = rpi_buckets_make(cfg, counts, m.P, bwd_ms, param_bytes, opt, &m.bk,
                                             err))) ||
        (st = sim_setup(&m, err)) || (st = rpi_sim_play(&m, &now, err))) {
        sim_free(&m);
        rp_sim_result_free(res);
        return st;
    }
    sim_result(&m, counts, out_bytes, param_bytes, now, res);
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
