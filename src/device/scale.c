/*
** Plans for a transformer on a cluster of devices: the search over tensor,
** pipeline and data-parallel sizes, micro-batch, virtual stages (and,
** where asked, DualPipeV's V) and recomputation that 'repipe plan
** --cluster' runs.
**
** The engine's own planner (autoplan.c) searches stage replication and cuts
** worker by worker, which a cluster of thousands of devices makes too many.
** A transformer's blocks are alike, so here a shape is priced in closed
** form from its stages' times: the stages cut (binary search on the
** busiest) so that the embedding and the head count where they fall; the
** pipeline's steady state, (m - 1) micro-batches of the busiest rank, plus
** one pass through every stage (a v-th of it with v chunks a rank) and the
** transfers of the fill; the replicas' reduction of bf16 gradients and the
** optimizer's pass. Memory is counted as the simulator does (parameters at
** 18 bytes, the activations each schedule keeps in flight). The best few
** estimates that fit are then simulated exactly, and the fastest that fits
** by the simulation wins.
*/
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/device.h"
#include "repipe/profile.h"

void rp_scale_options_default(rp_scale_options *o) {
    memset(o, 0, sizeof *o);
    o->candidates = 3;
}

/* A profile of the model for one micro-batch and t, as arrays. */
typedef struct layers {
    int L;
    double *fw, *bw, *ob, *pb, *bi, *bwt, *saved, *ck;
    int *node;
} layers;

static void layers_free(layers *x) {
    free(x->fw), free(x->bw), free(x->ob), free(x->pb), free(x->bi), free(x->bwt);
    free(x->saved), free(x->ck), free(x->node);
    memset(x, 0, sizeof *x);
}

static rp_status layers_make(const rp_transformer *m, const rp_cluster *c, int b, int t,
                             layers *x, rp_error *err) {
    memset(x, 0, sizeof *x);
    char *text;
    rp_profile *p;
    rp_status st = rp_transformer_profile(m, c, b, t, &text, err);
    if (st)
        return st;
    st = rp_profile_parse(&p, text, strlen(text), "transformer", err);
    free(text);
    if (st)
        return st;
    if ((st = rp_profile_layers(p, &x->fw, &x->bw, &x->ob, &x->pb, &x->node, &x->L, err)) ||
        (st = rp_profile_split_ms(p, x->node, x->L, &x->bi, &x->bwt, err)) ||
        (st = rp_profile_numbers(p, x->node, x->L, "saved_bytes=", &x->saved, err)) ||
        (st = rp_profile_numbers(p, x->node, x->L, "checkpoint_bytes=", &x->ck, err)))
        layers_free(x);
    rp_profile_free(p);
    return st;
}

static rp_status simulate(const layers *x, const rp_cluster *c, int t, const rp_config *cfg,
                          double *sec, double *peak, rp_error *err) {
    rp_derived d;
    rp_config_derive(cfg, &d);
    rp_sim_options o;
    rp_status st = rp_cluster_sim_options(c, t, rp_config_devices(cfg, &d), &o, err);
    if (st)
        return st;
    o.profile_batch = cfg->micro_batch_size;
    o.bwd_input_ms = x->bi, o.bwd_weight_ms = x->bwt;
    o.kept_bytes = x->saved, o.recompute_kept_bytes = x->ck;
    rp_sim_result r;
    if ((st = rp_simulate(cfg, x->fw, x->bw, x->ob, x->pb, x->L, &o, &r, err)))
        return st;
    *sec = r.update_time;
    int P = rp_config_chunked(cfg) ? r.stages / cfg->virtual_stages : r.stages;
    *peak = 0;
    for (int j = 0; j < P; j++) { /* a rank's chunks together */
        double sum = 0;
        for (int k = 0; k < (rp_config_chunked(cfg) ? cfg->virtual_stages : 1); k++)
            sum += r.stage_bytes[rp_config_chunked(cfg) ? rp_config_chunk(cfg, P, j, k) : j];
        *peak = sum > *peak ? sum : *peak;
    }
    rp_sim_result_free(&r);
    return RP_OK;
}

/* Cuts L costs into exactly K contiguous non-empty parts whose largest sum
** is smallest: the least cap a greedy fill meets in K parts, found by
** bisection, then parts split further (never raising the largest) until
** there are K. */
static void partition(const double *cost, int L, int K, int *counts) {
    double lo = 0, hi = 0;
    for (int l = 0; l < L; l++)
        lo = cost[l] > lo ? cost[l] : lo, hi += cost[l];
    for (int it = 0; it < 60 && hi - lo > 1e-12 * hi; it++) {
        double cap = (lo + hi) / 2, sum = 0;
        int parts = 1;
        for (int l = 0; l < L; l++) {
            if (sum + cost[l] > cap)
                parts++, sum = 0;
            sum += cost[l];
        }
        if (parts <= K)
            hi = cap;
        else
            lo = cap;
    }
    int n = 0;
    double sum = 0;
    counts[0] = 0;
    for (int l = 0; l < L; l++) {
        if (counts[n] > 0 && (sum + cost[l] > hi * (1 + 1e-9) || L - l <= K - n - 1))
            counts[++n] = 0, sum = 0;
        counts[n]++, sum += cost[l];
    }
    n++;
    while (n < K) { /* split the part of most layers: its halves are no larger */
        int w = 0;
        for (int k = 1; k < n; k++)
            w = counts[k] > counts[w] ? k : w;
        memmove(&counts[w + 2], &counts[w + 1], sizeof(int) * (size_t)(n - w - 1));
        counts[w + 1] = counts[w] / 2;
        counts[w] -= counts[w + 1];
        n++;
    }
}

typedef struct cand {
    int t, p, d, b, v, m;
    bool rc, dv; /* dv: DualPipeV's V, chunks ch and 2p - 1 - ch on rank ch */
    double estimate;
    int counts[RP_MAX_STAGES];
} cand;

static int by_estimate(const void *a, const void *b) {
    double x = ((const cand *)a)->estimate, y = ((const cand *)b)->estimate;
    return x < y ? -1 : x > y;
}

static double ring(int n, double bytes, double bw, double latency) {
    return n > 1 ? 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * latency : 0;
}

/* The estimate of shape k over x, or DBL_MAX where it does not fit. */
static double estimate(const layers *x, const rp_cluster *c, cand *k, double step_bw) {
    int P = k->p, C = P * k->v;
    double cost[4096];
    for (int l = 0; l < x->L; l++)
        cost[l] = (x->fw[l] * (k->rc ? 2 : 1) + x->bw[l]) * 1e-3;
    partition(cost, x->L, C, k->counts);
    double rank[RP_MAX_STAGES] = {0}, par[RP_MAX_STAGES] = {0}, kept[RP_MAX_STAGES] = {0};
    double work[RP_MAX_STAGES] = {0};
    double out = 0;
    for (int ch = 0, l = 0; ch < C; ch++) {
        int r = k->dv ? (ch < P ? ch : 2 * P - 1 - ch) : ch % P;
        for (int n = 0; n < k->counts[ch]; n++, l++) {
            rank[r] += cost[l];
            par[r] += x->pb[l];
            kept[r] += k->rc ? x->ck[l] : x->saved[l];
            work[r] = x->saved[l] > work[r] ? x->saved[l] : work[r];
            out = x->ob[l] > out ? x->ob[l] : out;
        }
    }
    double most = 0, all = 0, mpar = 0;
    for (int r = 0; r < P; r++) {
        /* in flight: 1f1b's P - r micro-batches; interleaving's warm-up of
        ** 2 (P - r - 1) + (v - 1) P + 1 chunks, a v-th of the rank's each */
        double n = k->dv       ? P + 1.0 /* DualPipeV: PP + 1 of a rank's activations */
                   : k->v == 1 ? (P - r < k->m ? P - r : k->m)
                               : (2.0 * (P - r - 1) + (k->v - 1.0) * P + 1) / k->v;
        double bytes = 4.5 * par[r] + n * kept[r] + (k->rc ? work[r] : 0);
        if (bytes > c->device.memory_bytes)
            return DBL_MAX;
        most = rank[r] > most ? rank[r] : most;
        all += rank[r];
        mpar = par[r] > mpar ? par[r] : mpar;
    }
    bool across = (double)k->t * P > c->per_node;
    double xfer = c->latency + out / (across ? c->network_bandwidth : c->node_bandwidth);
    double dp_bw = (double)k->t * P * k->d > c->per_node ? c->network_bandwidth : c->node_bandwidth;
    /* the fill and drain, a v-th of one micro-batch through every stage
    ** with v chunks a rank (DualPipeV's two as well: its estimate ranks it
    ** beside interleaving's, and the simulation tells them apart) */
    double fill = all / k->v;
    return (k->m - 1) * most + fill + 2.0 * (C - 1) * xfer +
           ring(k->d, mpar / 2, dp_bw, c->latency) + mpar / step_bw;
}

static void config_of(const cand *k, long long B, rp_config *cfg) {
    rp_config_default(cfg);
    cfg->micro_batch_size = k->b;
    cfg->gradient_accumulation_steps = k->m;
    cfg->replication_factor = k->d;
    cfg->replica_grouping = rp_grouping_all(k->d);
    cfg->optimizer.type = RP_OPT_ADAM;
    cfg->recompute_checkpoint_every_layer = k->rc;
    cfg->tensor_parallel = k->t;
    int C = k->p * k->v;
    if (C > 1) {
        cfg->layers_per_stage.count = C;
        memcpy(cfg->layers_per_stage.layers, k->counts, sizeof(int) * (size_t)C);
    }
    if (k->v > 1) {
        cfg->schedule = k->dv ? RP_SCHEDULE_DUALPIPEV : RP_SCHEDULE_INTERLEAVED;
        cfg->virtual_stages = k->v;
    }
    (void)B;
}

rp_status rp_scale_simulate(const rp_transformer *m, const rp_cluster *c, const rp_config *cfg,
                            double *seconds, double *peak, rp_error *err) {
    int t = cfg->tensor_parallel > 1 ? cfg->tensor_parallel : 1;
    layers x;
    rp_status st = layers_make(m, c, cfg->micro_batch_size, t, &x, err);
    if (st)
        return st;
    rp_config run = *cfg;
    run.tensor_parallel = 1; /* (the profile's ranks hold it) */
    st = simulate(&x, c, t, &run, seconds, peak, err);
    layers_free(&x);
    return st;
}

rp_status rp_scale_plan_compute(const rp_transformer *m, const rp_cluster *c,
                                const rp_scale_options *o, rp_scale_plan *out, rp_error *err) {
    memset(out, 0, sizeof *out);
    long long B = o->global_batch;
    int N = o->devices, L = m->layers + 2;
    if (B < 1 || N < 1)
        return rp_fail(err, RP_ERR_INVALID, "plan: a global batch and a number of devices of 1 "
                       "or more are needed");
    if (L > 4096)
        return rp_fail(err, RP_ERR_INVALID, "plan: at most 4094 layers for a cluster's plan, "
                       "not %d", m->layers);
    int F = m->ffn > 0 ? m->ffn : 4 * m->hidden;
    unsigned sched = o->schedules ? o->schedules
                                  : 1u << RP_SCHEDULE_1F1B | 1u << RP_SCHEDULE_INTERLEAVED;
    cand *cs = NULL;
    int n = 0, cap = 0;
    rp_status st = RP_OK;
    rp_sim_options so;
    for (int t = 1; t <= 8; t *= 2) {
        if ((o->tensor_parallel && t != o->tensor_parallel) || c->per_node % t || m->heads % t ||
            m->vocab % t || F % t || N % t)
            continue;
        if ((st = rp_cluster_sim_options(c, t, 1, &so, err)))
            goto done;
        for (int b = 1; b <= 8; b *= 2) {
            if (o->micro_batch && b != o->micro_batch)
                continue;
            layers x;
            if ((st = layers_make(m, c, b, t, &x, err)))
                goto done;
            for (int p = 1; p <= N / t && p <= L && p <= RP_MAX_STAGES; p++) {
                if ((o->pipeline_parallel && p != o->pipeline_parallel) || (N / t) % p)
                    continue;
                int d = N / t / p;
                if (B % ((long long)b * d))
                    continue;
                long long mb = B / ((long long)b * d);
                if (mb > 1 << 20)
                    continue;
                /* v = 1, 2, 4 chunks a rank, then (w = 8) DualPipeV's two */
                for (int w = 1; w <= 8; w *= 2) {
                    bool dv = w == 8;
                    int v = dv ? 2 : w;
                    if (!(sched & (1u << (dv ? RP_SCHEDULE_DUALPIPEV
                                        : v > 1 ? RP_SCHEDULE_INTERLEAVED
                                                : RP_SCHEDULE_1F1B))))
                        continue;
                    if (v > 1 && (p < 2 || p * v > L || p * v > RP_MAX_STAGES ||
                                  (dv ? mb < 2 * p : mb % p)))
                        continue;
                    for (int rc = 0; rc < 2; rc++) {
                        if ((o->recompute > 0 && !rc) || (o->recompute < 0 && rc))
                            continue;
                        cand k = {.t = t, .p = p, .d = d, .b = b, .v = v, .m = (int)mb, .rc = rc,
                                  .dv = dv};
                        k.estimate = estimate(&x, c, &k, so.memory_bandwidth);
                        out->considered++;
                        if (k.estimate == DBL_MAX)
                            continue;
                        if (n == cap) {
                            cand *more = realloc(cs, sizeof(cand) * (size_t)(cap = cap ? 2 * cap : 256));
                            if (!more) {
                                layers_free(&x);
                                st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
                                goto done;
                            }
                            cs = more;
                        }
                        cs[n++] = k;
                    }
                }
            }
            layers_free(&x);
        }
    }
    if (n == 0) {
        st = rp_fail(err, RP_ERR_INFEASIBLE,
                     "plan: no shape of %d devices fits %.0f bytes a device for %lld sequences "
                     "an update (tensor groups, pipelines, replicas, micro-batches of 1 to 8, "
                     "recomputation)", N, c->device.memory_bytes, B);
        goto done;
    }
    qsort(cs, (size_t)n, sizeof *cs, by_estimate);
    /* the best estimates, simulated; those that do not fit by the
    ** simulation make room for the next */
    int want = o->candidates > 0 ? o->candidates : 3, fit = 0, first_dv = -1;
    for (int i = 0; i < n && first_dv < 0; i++)
        first_dv = cs[i].dv ? i : -1;
    for (int i = 0; i < n; i++) {
        /* ...and DualPipeV's best estimate too, where it was asked for:
        ** the closed form does not price its overlap of passes */
        bool best = fit < want && i < 4 * want;
        if (!best && i != first_dv) {
            if (i > first_dv)
                break;
            continue;
        }
        const cand *k = &cs[i];
        layers x;
        if ((st = layers_make(m, c, k->b, k->t, &x, err)))
            goto done;
        rp_config cfg;
        config_of(k, B, &cfg);
        cfg.tensor_parallel = 1;
        double sec, peak;
        st = simulate(&x, c, k->t, &cfg, &sec, &peak, err);
        layers_free(&x);
        if (st)
            goto done;
        out->simulated++;
        if (peak > c->device.memory_bytes)
            continue;
        fit++;
        if (out->seconds > 0 && sec >= out->seconds)
            continue;
        config_of(k, B, &out->cfg);
        out->t = k->t, out->p = k->p, out->d = k->d, out->b = k->b, out->v = k->v;
        out->recompute = k->rc;
        out->seconds = sec;
        out->peak_bytes = peak;
        out->tflops_per_device = rp_transformer_flops(m, (double)B) / (sec * N) / 1e12;
    }
    if (!fit)
        st = rp_fail(err, RP_ERR_INFEASIBLE,
                     "plan: the %d best estimates of %d devices do not fit %.0f bytes a device "
                     "when simulated", out->simulated, N, c->device.memory_bytes);
done:
    free(cs);
    return st;
}
