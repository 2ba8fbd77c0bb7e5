/*
** The engine's planner: stages, stage replication, replicas, micro-batch and
** accumulation chosen for repipe's synchronous pipelines, by the time per
** update that rp_simulate predicts on the given machines.
**
** The search has two steps. For every shape of the run — workers per
** replica `per`, replicas R, accumulation GA (B = global batch / (R GA)),
** with or without recomputation and sharded optimizer state — a dynamic
** programme over the layers, from the last one back, finds the stages and
** their replication that minimise the busiest stage's time per update:
**
**     cost(stage) = GA / r * t(stage) + allreduce(stage) + step(stage)
**
** where t is a micro-batch's forward and backward on one worker, and the
** allreduce runs over the R r workers that hold the stage, at the slowest
** level they span (the layout is known: going backwards, a stage's offset
** in its replica is per minus the workers it and the later stages take).
** A stage has at most GA replicas, so every one gets micro-batches (the
** busiest ceil(GA / r) of them),
** and a worker's memory (with 1F1B's in-flight count, which depends only
** on the workers of the later stages) must fit. The programme's bottleneck
** plus the pipeline's fill estimates each shape's time; the best few
** estimates, single-worker and data-parallel runs, and PipeDream's plan at
** every accumulation are then simulated exactly, and the fastest wins —
** the simplest, with the micro-batch nearest the profile's, within 1 %.
** Where reductions leave a machine, each simulation also tries the
** reductions that pay on a slow link (workers_per_server, then
** reduction_bucket_mb) and keeps them where they are faster.
*/
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/planner.h"
#include "repipe/simulate.h"
#include "simulate_impl.h"

void rp_autoplan_options_default(rp_autoplan_options *o) {
    *o = (rp_autoplan_options){
        .num_levels = 0,
        .global_batch = 0,
        .memory_size = 0,
        .max_accumulation = 64,
        .min_micro_batch = 1,
        .candidates = 24,
        .latency = 2e-5,
    };
}

size_t rp_autoplan_options_size(void) { return sizeof(rp_autoplan_options); }
size_t rp_autoplan_size(void) { return sizeof(rp_autoplan); }

/* A shape whose stages the programme chose, with its estimate. */
typedef struct cand {
    int R, per, GA, B, P, prof; /* prof: the profile its times come from */
    bool recompute, shard; /* recomputation, replicated tensor sharding */
    int layers[RP_MAX_STAGES], reps[RP_MAX_STAGES];
    double estimate;
} cand;

/* One profile of the model: its layers, measured on `batch` rows, and
** prefix sums of forward and backward seconds and parameter bytes. */
typedef struct measured {
    double batch;
    double *fw, *bw, *out, *par;
    double *bi, *bwt; /* a split backward's halves */
    double *cut; /* bytes crossing the cut before each layer */
    double *cf, *cb, *cp;
} measured;

typedef struct search {
    const rp_config *base;
    const rp_autoplan_options *o;
    int L;
    measured m[RP_AUTOPLAN_MAX_PROFILES];
    int nm;
    rpi_cluster net;
    rp_sim_options sim;
    /* the programme's tables, stages x (L + 1) x (per + 1) */
    double *best;
    int *cut, *rep;
    cand *c;
    int n, cap;
    double *fastest; /* the fastest simulation so far (the keys are tried near it) */
} search;

/* The profile measured nearest B rows (by ratio): the fewer rows its times
** are scaled over, the truer they are. */
static int nearest(const search *S, double B) {
    int best = 0;
    for (int k = 1; k < S->nm; k++)
        if (fabs(log(B / S->m[k].batch)) < fabs(log(B / S->m[best].batch)))
            best = k;
    return best;
}

static void make_config(const search *S, const cand *k, rp_config *cfg) {
    *cfg = *S->base;
    cfg->replication_factor = k->R;
    cfg->gradient_accumulation_steps = k->GA;
    cfg->micro_batch_size = k->B;
    cfg->schedule = RP_SCHEDULE_1F1B;
    cfg->recompute_checkpoint_every_layer = S->base->recompute_checkpoint_every_layer || k->recompute;
    cfg->replicated_tensor_sharding = S->base->replicated_tensor_sharding || k->shard;
    cfg->layers_per_stage.count = k->P;
    cfg->stage_replication_count = k->P;
    for (int s = 0; s < k->P; s++) {
        cfg->layers_per_stage.layers[s] = k->layers[s];
        cfg->stage_replication[s] = k->reps[s];
    }
    cfg->matmul_proportion_count = 1;
    cfg->grouping_set = false;
    cfg->replica_grouping = rp_grouping_all(k->R);
}

/* zb-auto's relative pass times for a candidate: the forward, input
** gradient and weight gradient of its busiest stage replica, from the
** profile it was planned on. */
static void pass_times(const search *S, const cand *k, double out[3]) {
    const measured *m = &S->m[k->prof];
    double most = -1;
    for (int s = 0, first = 0; s < k->P; s++) {
        int last = s == k->P - 1 ? S->L : first + k->layers[s];
        double t[3] = {0, 0, 0};
        for (int l = first; l < last; l++)
            t[0] += m->fw[l], t[1] += m->bi[l], t[2] += m->bwt[l];
        double busy = (t[0] + t[1] + t[2]) / k->reps[s];
        if (busy > most && t[0] > 0 && t[1] > 0 && t[2] > 0)
            most = busy, memcpy(out, t, sizeof t);
        first = last;
    }
    if (most < 0)
        out[0] = out[1] = out[2] = 1;
}

/* Simulates a configuration as it is: seconds per update, the most a
** worker holds, and (far) the seconds its messages and reductions spend
** beyond the innermost level; false when it cannot run on these machines. */
static bool simulate_as_is(const search *S, const rp_config *cfg, double *t, double *bytes,
                           double *far) {
    rp_sim_result r;
    rp_error err;
    const measured *m = &S->m[nearest(S, cfg->micro_batch_size)];
    rp_sim_options so = S->sim;
    so.profile_batch = m->batch;
    so.cut_bytes = m->cut;
    so.bwd_input_ms = m->bi, so.bwd_weight_ms = m->bwt;
    if (rp_simulate(cfg, m->fw, m->bw, m->out, m->par, S->L, &so, &r, &err))
        return false;
    *t = r.update_time;
    *bytes = 0;
    for (int s = 0; s < r.stages; s++)
        *bytes = r.stage_bytes[s] > *bytes ? r.stage_bytes[s] : *bytes;
    *far = 0;
    for (int l = 1; l < r.num_levels; l++)
        *far += r.comm_seconds[l];
    rp_sim_result_free(&r);
    return !(S->o->memory_size > 0 && *bytes > S->o->memory_size);
}

/* Simulates a configuration with the reductions that pay on these
** machines, where the base configuration left them to the planner:
** across servers on MPI ranks, the sum inside each server first
** (workers_per_server: one server's workers of every level below the
** outermost); then the reduction in buckets during the last backward, at
** PyTorch DDP's two sizes (its first bucket's 1 MB, its 25 MB), each where
** the model makes at most RP_AUTOPLAN_BUCKETS of them (the simulation
** plays every bucket of every reduction: a fuzzed 1e12-byte profile in
** 1 MB buckets took seconds a candidate). A key is
** set only where the simulation is faster with it: off is the simpler
** run. Tried on up to RP_AUTOPLAN_KEY_WORKERS workers, and only within 1.5 times the fastest simulation so far (the
** keys save at most the reductions' time; a 2 916-worker plan tried them
** on every candidate for seconds). cfg's two keys are the base's again
** first, then the choice. */
#define RP_AUTOPLAN_BUCKETS 1024
#define RP_AUTOPLAN_KEY_WORKERS 64
static bool simulate(const search *S, rp_config *cfg, double *t, double *bytes) {
    double far;
    cfg->workers_per_server = S->base->workers_per_server;
    cfg->reduction_bucket_mb = S->base->reduction_bucket_mb;
    if (!simulate_as_is(S, cfg, t, bytes, &far))
        return false;
    int levels = S->o->num_levels, servers = levels > 1 ? S->o->machines[levels - 1] : 1;
    rp_derived der;
    rp_config_derive(cfg, &der);
    if (der.workers > RP_AUTOPLAN_KEY_WORKERS)
        return true; /* (each try plays every worker again: seconds on thousands) */
    bool reduces = cfg->replication_factor > 1; /* some stage's gradients summed over workers */
    for (int st = 0; st < cfg->layers_per_stage.count && !reduces; st++)
        reduces = rp_config_stage_replicas(cfg, st) > 1;
    if (*t < *S->fastest)
        *S->fastest = *t;
    if (far <= 0 || servers < 2 || !reduces || *t > 1.5 * *S->fastest)
        return true; /* nothing leaves a machine, nothing is reduced, or far from the best */
    rp_config c = *cfg;
    double t2, b2, f2;
    if (S->o->polling && cfg->workers_per_server == 0) {
        int W = 1;
        for (int l = 0; l < levels; l++)
            W *= S->o->machines[l];
        c.workers_per_server = W / servers;
        if (c.workers_per_server > 1 && simulate_as_is(S, &c, &t2, &b2, &f2) && t2 < *t * 0.999)
            *cfg = c, *t = t2, *bytes = b2;
        c = *cfg;
    }
    bool buckets_go = cfg->schedule < RP_SCHEDULE_PIPEDREAM &&
                      !rp_config_chunked(cfg) &&
                      !cfg->replicated_tensor_sharding && !cfg->fp16_exchange;
    static const double sizes[] = {1, 25};
    rp_config keep = *cfg;
    double bytes_all = S->m[0].cp[S->L]; /* the model's parameters */
    for (int i = 0; i < 2 && buckets_go && cfg->reduction_bucket_mb == 0; i++) {
        if (bytes_all / (sizes[i] * 1e6) > RP_AUTOPLAN_BUCKETS)
            continue; /* the simulation plays every bucket: too many to try */
        c = *cfg;
        c.reduction_bucket_mb = sizes[i];
        if (simulate_as_is(S, &c, &t2, &b2, &f2) && t2 < *t * 0.999)
            keep = c, *t = t2, *bytes = b2;
    }
    *cfg = keep;
    if (*t < *S->fastest)
        *S->fastest = *t;
    return true;
}

static bool push(search *S, const cand *k) {
    if (S->n == S->cap) {
        int cap = S->cap ? 2 * S->cap : 64;
        cand *c = realloc(S->c, sizeof(cand) * cap);
        if (!c)
            return false;
        S->c = c;
        S->cap = cap;
    }
    S->c[S->n++] = *k;
    return true;
}

/* The programme for one shape; pushes its best plan for every number of
** stages up to RP_AUTOPLAN_STAGES (fewer stages, fewer messages: the
** programme's bottleneck does not see them, the estimate and the
** simulation do). best[p][i][k]: the busiest stage of layers i..L-1 in p
** stages on k workers. */
#define RP_AUTOPLAN_STAGES 8
#define AT(p, i, k) ((((size_t)(p) * (L + 1)) + (i)) * W1 + (k))

static bool programme(search *S, int R, int per, int GA, bool recompute, bool shard) {
    int L = S->L, W1 = per + 1, PM = per < RP_AUTOPLAN_STAGES ? per : RP_AUTOPLAN_STAGES;
    if (PM > L)
        PM = L;
    int B = (int)(S->o->global_batch / ((long long)R * GA)), prof = nearest(S, B);
    const measured *M = &S->m[prof];
    double scale = B / M->batch;
    rp_config cfg = *S->base;
    cfg.recompute_checkpoint_every_layer = S->base->recompute_checkpoint_every_layer || recompute;
    cfg.replicated_tensor_sharding = S->base->replicated_tensor_sharding || shard;
    cfg.replica_grouping = rp_grouping_all(R);
    for (size_t x = 0; x < AT(PM + 1, 0, 0); x++)
        S->best[x] = DBL_MAX;
    S->best[AT(0, L, 0)] = 0;
    for (int p = 1; p <= PM; p++)
        for (int i = L - 1; i >= 0; i--)
            for (int k = p; k <= per; k++) {
                double *b = &S->best[AT(p, i, k)];
                for (int j = i + 1; j <= L - (p - 1); j++) {
                    double f = (M->cf[j] - M->cf[i]) * scale;
                    double t = f + (M->cb[j] - M->cb[i]) * scale;
                    if (cfg.recompute_checkpoint_every_layer)
                        t += f;
                    double par = M->cp[j] - M->cp[i];
                    for (int r = 1; r <= k - (p - 1) && r <= GA; r++) {
                        double rest = S->best[AT(p - 1, j, k - r)]; /* finite: stages fill k */
                        if (rest == DBL_MAX)
                            continue;
                        /* this stage's workers: offset per - k in every replica */
                        int off = per - k;
                        int top = rpi_level_of(&S->net, off, (R - 1) * per + off + r - 1);
                        double cost = (double)((GA + r - 1) / r) * t +
                                      rpi_allreduce_time(R * r, par, S->net.bw[top],
                                                         S->net.latency) +
                                      par / S->sim.memory_bandwidth;
                        double m = cost > rest ? cost : rest;
                        if (m >= *b)
                            continue;
                        if (S->o->memory_size > 0) {
                            int inflight = k < GA ? k : GA, slots = (inflight + r - 1) / r;
                            if (rpi_stage_bytes(&cfg, M->out, M->par, i, j - i, r, slots,
                                                scale, S->o->polling) > S->o->memory_size)
                                continue;
                        }
                        *b = m;
                        S->cut[AT(p, i, k)] = j;
                        S->rep[AT(p, i, k)] = r;
                    }
                }
            }
    double wire = S->base->fp16_exchange ? 0.5 : 1.0;
    for (int P = 1; P <= PM; P++) {
        if (S->best[AT(P, 0, per)] == DBL_MAX)
            continue; /* nothing fits */
        cand c = {.R = R,
                  .per = per,
                  .GA = GA,
                  .B = B,
                  .recompute = recompute,
                  .shard = shard,
                  .P = P,
                  .prof = prof};
        double sum = 0, most = 0;
        for (int p = P, i = 0, k = per; p > 0; p--) {
            int j = S->cut[AT(p, i, k)], r = S->rep[AT(p, i, k)];
            c.layers[P - p] = j - i;
            c.reps[P - p] = r;
            double t = (M->cf[j] - M->cf[i] + M->cb[j] - M->cb[i]) * scale;
            sum += t;
            most = t > most ? t : most;
            if (j < L) { /* the activation out and its gradient back, at the level they cross */
                int l = rpi_level_of(&S->net, per - k + r - 1, per - k + r);
                sum += 2 * (S->net.latency + M->cut[j] * scale * wire / S->net.bw[l]);
            }
            i = j, k -= r;
        }
        /* the busiest stage, plus a micro-batch through the others and the
        ** messages between them (fill and drain) */
        c.estimate = S->best[AT(P, 0, per)] + sum - most;
        if (!push(S, &c))
            return false;
    }
    return true;
}

static int by_estimate(const void *a, const void *b) {
    double x = ((const cand *)a)->estimate, y = ((const cand *)b)->estimate;
    return x < y ? -1 : x > y;
}

/* Every stage replica gets as many micro-batches as the others of its
** stage. */
static bool balanced(const rp_config *c) {
    for (int s = 0; s < c->layers_per_stage.count; s++)
        if (c->gradient_accumulation_steps % rp_config_stage_replicas(c, s))
            return false;
    return true;
}

/* Keeps e if it is faster, or as fast (within 1 %) and simpler: first a
** plan whose stage replicas share the micro-batches evenly (an uneven one
** is only as fast as predicted where nothing else competes for the cores). */
static void consider(const search *S, rp_autoplan_entry *e, const rp_config *cfg, double t,
                     double bytes) {
    rp_derived d, de;
    rp_config_derive(cfg, &d);
    if (e->found) {
        rp_config_derive(&e->cfg, &de);
        /* then fewer workers, fewer stages, then the micro-batch nearest the
        ** profiles': their times were measured there, and scaling them to
        ** other micro-batches is where the model is weakest (a CPU's caches
        ** favour small ones, a GPU's width large ones) */
        double B = cfg->micro_batch_size, Be = e->cfg.micro_batch_size;
        double near = fabs(log(B / S->m[nearest(S, B)].batch));
        double near_e = fabs(log(Be / S->m[nearest(S, Be)].batch));
        bool even = balanced(cfg), even_e = balanced(&e->cfg);
        bool simpler = even != even_e           ? even
                       : d.workers != de.workers ? d.workers < de.workers
                       : d.stages != de.stages   ? d.stages < de.stages
                                                 : near < near_e;
        if (!(t < e->seconds * (simpler ? 1.01 : 0.99)))
            return;
    }
    e->found = true;
    e->cfg = *cfg;
    e->seconds = t;
    e->worker_bytes = bytes;
}

/* Two chunks a worker on pipeline k's workers, each worker replicated as
** the pipeline's stage on it is: the model cut into 2 P chunks by the
** profile, each worker's two of about equal forward and backward time and
** the workers' shares in proportion to their replicas (a stage's
** replicas take its micro-batches in turns), under interleaved-1f1b
** (chunk c on worker c mod P; GA a multiple of P) and under zb-v (chunks r
** and 2 P - 1 - r on worker r), each considered for `into` and `best`.
** Returns how many were simulated. */
static int interleaved(const search *S, const cand *k, rp_config cfg, rp_autoplan_entry *into,
                       rp_autoplan_entry *best) {
    int P = k->P, C = 2 * P;
    if (P < 2 || C > RP_MAX_STAGES || S->L < C || rp_config_tensor_parallel(&cfg) > 1)
        return 0;
    const measured *m = &S->m[k->prof];
    double total = 0;
    for (int l = 0; l < S->L; l++)
        total += m->fw[l] + m->bw[l];
    cfg.virtual_stages = 2;
    cfg.stage_replication_count = 0; /* (none written where every worker is one device) */
    for (int r = 0; r < P; r++)
        cfg.stage_replication_count = k->reps[r] > 1 ? C : cfg.stage_replication_count;
    int n = 0;
    for (int z = 0; z < 2; z++) {
        cfg.schedule = z == 0 ? RP_SCHEDULE_INTERLEAVED : RP_SCHEDULE_ZB_V;
        if (z == 0 && k->GA % P)
            continue;
        int dev[RP_MAX_STAGES], weights = 0;
        for (int r = 0; r < P; r++)
            for (int j = 0; j < 2; j++)
                dev[rp_config_chunk(&cfg, P, r, j)] = r;
        for (int c = 0; c < C; c++)
            weights += k->reps[dev[c]];
        double acc = 0;
        for (int c = 0, l = 0, upto = 0; c < C; c++) {
            cfg.stage_replication[c] = k->reps[dev[c]];
            upto += k->reps[dev[c]];
            if (c == C - 1) {
                cfg.layers_per_stage.layers[c] = S->L - l;
                break;
            }
            int layers = 0; /* to the layer nearest its share, leaving one a chunk */
            double goal = total * upto / weights;
            do {
                acc += m->fw[l] + m->bw[l];
                l++, layers++;
            } while (l < S->L - (C - 1 - c) && acc + (m->fw[l] + m->bw[l]) / 2 < goal);
            cfg.layers_per_stage.layers[c] = layers;
        }
        cfg.layers_per_stage.count = C;
        double t, bytes;
        if (!simulate(S, &cfg, &t, &bytes))
            continue;
        consider(S, into, &cfg, t, bytes);
        consider(S, best, &cfg, t, bytes);
        n++;
    }
    return n;
}

/* Pipeline k of cfg under zb-h1, zb-h2, then zb-auto on the busiest
** stage's pass times at zb-h1's memory, at about zb-h2's and at room for
** 3 P micro-batches (where the passes differ, more room lets it fill the
** bubble; the memory limit decides whether it fits), each considered for
** `into` and `best`. Returns how many were simulated. */
static int zero_bubble(const search *S, const cand *k, rp_config cfg, rp_autoplan_entry *into,
                       rp_autoplan_entry *best) {
    int n = 0;
    for (int z = 0; z < 5; z++) {
        double t, bytes;
        cfg.schedule = z == 0 ? RP_SCHEDULE_ZB_H1 : z == 1 ? RP_SCHEDULE_ZB_H2 : RP_SCHEDULE_ZB_AUTO;
        if (z >= 2)
            pass_times(S, k, cfg.zb_pass_times);
        cfg.zb_max_in_flight = z == 3 ? 2 * k->P - 1 : z == 4 ? 3 * k->P : 0;
        if (!simulate(S, &cfg, &t, &bytes))
            continue;
        n++;
        consider(S, into, &cfg, t, bytes);
        consider(S, best, &cfg, t, bytes);
    }
    return n;
}

rp_status rp_autoplan_compute(const rp_profile *const *profiles, const double *batches,
                              int num_profiles, const rp_config *base, const rp_plan *pipedream,
                              const rp_autoplan_options *o, rp_autoplan *out, rp_error *err) {
    memset(out, 0, sizeof *out);
    if (o->global_batch < 1 || o->global_batch > RP_MAX_SAMPLES)
        return rp_fail(err, RP_ERR_INVALID,
                       "plan: the engine objective needs a global batch of 1 to %lld samples, "
                       "not %lld",
                       (long long)RP_MAX_SAMPLES, o->global_batch);
    if (!(o->memory_size >= 0) || isinf(o->memory_size))
        return rp_fail(err, RP_ERR_INVALID,
                       "plan: memory_size must be a number of bytes >= 0 (0: no limit), not %g",
                       o->memory_size);
    if (o->max_accumulation < 1)
        return rp_fail(err, RP_ERR_INVALID,
                       "plan: max_accumulation must be at least 1 (one micro-batch an update), "
                       "not %d",
                       o->max_accumulation);
    if (!(o->latency >= 0))
        return rp_fail(err, RP_ERR_INVALID, "plan: latency must be >= 0 seconds, not %g", o->latency);
    if (o->cores < 0)
        return rp_fail(err, RP_ERR_INVALID, "plan: cores must be >= 0 (0: one a worker), not %d",
                       o->cores);
    if (num_profiles < 1 || num_profiles > RP_AUTOPLAN_MAX_PROFILES)
        return rp_fail(err, RP_ERR_INVALID, "plan: %d profiles (1 to %d)", num_profiles,
                       RP_AUTOPLAN_MAX_PROFILES);
    double fastest = DBL_MAX;
    search S = {.base = base, .o = o, .fastest = &fastest};
    rp_status st = RP_OK;
    int W = 1;
    for (int l = 0; l < o->num_levels; l++)
        W *= o->machines[l];
    for (; S.nm < num_profiles; S.nm++) {
        measured *m = &S.m[S.nm];
        int *node = NULL, L;
        if (!(batches[S.nm] > 0)) {
            st = rp_fail(err, RP_ERR_INVALID, "plan: profile %d: its micro-batch is %g",
                         S.nm + 1, batches[S.nm]);
            goto done;
        }
        m->batch = batches[S.nm];
        if ((st = rp_profile_layers(profiles[S.nm], &m->fw, &m->bw, &m->out, &m->par, &node, &L,
                                    err)))
            goto done;
        st = rp_profile_cut_bytes(profiles[S.nm], node, L, &m->cut, err);
        if (!st)
            st = rp_profile_split_ms(profiles[S.nm], node, L, &m->bi, &m->bwt, err);
        free(node);
        if (st) {
            S.nm++;
            goto done;
        }
        m->cf = calloc(L + 1, sizeof(double));
        m->cb = calloc(L + 1, sizeof(double));
        m->cp = calloc(L + 1, sizeof(double));
        if (!m->cf || !m->cb || !m->cp) {
            S.nm++;
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory for %d layers", L);
            goto done;
        }
        for (int l = 0; l < L; l++) {
            m->cf[l + 1] = m->cf[l] + m->fw[l] * 1e-3;
            m->cb[l + 1] = m->cb[l] + m->bw[l] * 1e-3;
            m->cp[l + 1] = m->cp[l] + m->par[l];
        }
        if (S.nm == 0) {
            S.L = L;
        } else if (L != S.L || m->cp[L] != S.m[0].cp[L]) {
            S.nm++;
            st = rp_fail(err, RP_ERR_INVALID,
                         "plan: profile %d has %d layers and %.0f parameter bytes, the first %d "
                         "and %.0f: profiles of one model are needed",
                         S.nm, L, m->cp[L], S.L, S.m[0].cp[S.L]);
            goto done;
        }
    }
    rp_sim_options_default(&S.sim);
    S.sim.num_levels = o->num_levels;
    S.sim.cores = o->cores;
    S.sim.latency = o->latency;
    S.sim.polling = o->polling;
    memcpy(S.sim.machines, o->machines, sizeof o->machines);
    memcpy(S.sim.bandwidth, o->bandwidth, sizeof o->bandwidth);
    S.sim.tensor_split = o->tensor_split;
    int L = S.L;
    size_t cells = (size_t)(RP_AUTOPLAN_STAGES + 1) * (L + 1) * (W + 1);
    S.best = malloc(sizeof(double) * cells);
    S.cut = malloc(sizeof(int) * cells);
    S.rep = malloc(sizeof(int) * cells);
    if (!S.best || !S.cut || !S.rep) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory for the engine's planner (%d layers, %d "
                                        "workers)", L, W);
        goto done;
    }
    if ((st = rpi_cluster_make(&S.sim, W, &S.net, err)))
        goto done;
    /* every shape: workers per replica, replicas, accumulation; where
    ** memory is short, the savings the engine has, cheapest first:
    ** sharding the optimizer state over a stage's workers (its reduction
    ** becomes a reduce-scatter and a gather, as much traffic), then
    ** recomputation (a second forward), then both */
    long long N = o->global_batch;
    bool too_big = false; /* shapes passed over: micro-batches beyond an int */
    for (int per = 1; per <= W && per <= L; per++)
        for (int R = 1; R * per <= W; R++) {
            if (N % R)
                continue;
            for (int GA = 1; GA <= o->max_accumulation && GA <= N / R; GA++) {
                if ((N / R) % GA)
                    continue;
                if (N / R / GA > INT_MAX) { /* a micro-batch is an int of samples */
                    too_big = true;
                    continue;
                }
                if (N / R / GA < o->min_micro_batch)
                    continue;
                static const bool ladder[4][2] = {{false, false}, {false, true}, {true, false},
                                                  {true, true}};
                int before = S.n;
                for (int q = 0; q < 4 && S.n == before; q++) {
                    bool rc = ladder[q][0], sh = ladder[q][1];
                    if (q > 0 && !(o->memory_size > 0))
                        break;
                    if ((rc && base->recompute_checkpoint_every_layer) ||
                        (sh && (base->replicated_tensor_sharding || W == 1 ||
                                rp_optimizer_state_per_param(&base->optimizer) == 0 ||
                                base->reduction_bucket_mb > 0)))
                        continue; /* already on, saves nothing, or (buckets) refused */
                    if (!programme(&S, R, per, GA, rc, sh)) {
                        st = rp_fail(err, RP_ERR_NOMEM, "out of memory for the engine's planner");
                        goto done;
                    }
                }
            }
        }
    if (S.n == 0 && too_big) {
        st = rp_fail(err, RP_ERR_INFEASIBLE,
                     "plan: %lld samples per update split over at most %d replicas and %d "
                     "micro-batches an update (max_accumulation) leave micro-batches of more "
                     "than %d samples: give a smaller global batch, or one with more divisors",
                     N, W, o->max_accumulation, INT_MAX);
        goto done;
    }
    if (S.n == 0) {
        st = rp_fail(err, RP_ERR_INFEASIBLE,
                     "plan: no configuration of %d workers fits %.0f bytes per worker, even "
                     "with recomputation, sharded optimizer state and every accumulation up "
                     "to %d (micro-batches of %d samples at least)",
                     W, o->memory_size, o->max_accumulation, o->min_micro_batch);
        goto done;
    }
    qsort(S.c, S.n, sizeof(cand), by_estimate);
    /* exact: the best estimates; and, whatever their estimates, every
    ** single-worker and data-parallel shape */
    for (int i = 0; i < S.n; i++) {
        const cand *k = &S.c[i];
        bool single = k->R == 1 && k->per == 1, dp = k->per == 1 && k->R * k->per == W;
        if (i >= o->candidates && !single && !dp)
            continue;
        rp_config cfg;
        double t, bytes;
        make_config(&S, k, &cfg);
        if (!simulate(&S, &cfg, &t, &bytes))
            continue;
        out->simulated++;
        if (single)
            consider(&S, &out->single, &cfg, t, bytes);
        if (dp)
            consider(&S, &out->data_parallel, &cfg, t, bytes);
        consider(&S, &out->best, &cfg, t, bytes);
        if (k->P < 2)
            continue;
        /* a pipeline: the zero-bubble schedules too, which fill its bubble
        ** with the weights' halves at more activation memory */
        consider(&S, &out->pipeline_1f1b, &cfg, t, bytes);
        out->simulated += zero_bubble(&S, k, cfg, &out->pipeline_zero_bubble, &out->best);
        out->simulated += interleaved(&S, k, cfg, &out->pipeline_interleaved, &out->best);
    }
    /* A third axis: the shapes of W / t workers, each split over tensor
    ** groups of t inside a unit of the innermost level (Megatron-LM's
    ** placement), the best estimates of each t simulated exactly under
    ** 1f1b and, for a pipeline, the zero-bubble schedules */
    for (int t = 2; t <= 8 && o->tensor_split && o->num_levels > 0; t *= 2) {
        if (!(o->tensor_degrees & (1u << t)) || o->machines[0] % t)
            continue;
        for (int i = 0, tried = 0; i < S.n && tried < o->candidates; i++) {
            const cand *k = &S.c[i];
            if (k->per * k->R * t != W)
                continue;
            tried++;
            rp_config cfg;
            double sec, bytes;
            make_config(&S, k, &cfg);
            cfg.tensor_parallel = t;
            if (simulate(&S, &cfg, &sec, &bytes)) {
                out->simulated++;
                consider(&S, &out->tensor_parallel, &cfg, sec, bytes);
                consider(&S, &out->best, &cfg, sec, bytes);
            }
            if (k->P > 1)
                out->simulated += zero_bubble(&S, k, cfg, &out->tensor_parallel, &out->best);
        }
    }
    /* PipeDream's plan, run synchronously at each accumulation that fits */
    rp_config pd = *base;
    if (pipedream && !rp_plan_to_config(pipedream, profiles[0], &pd, NULL, 0, err)) {
        int R = pd.replication_factor, most = 1;
        for (int s = 0; s < pd.layers_per_stage.count; s++)
            most = rp_config_stage_replicas(&pd, s) > most ? rp_config_stage_replicas(&pd, s) : most;
        for (int GA = most; N % R == 0 && GA <= o->max_accumulation && GA <= N / R; GA++) {
            if ((N / R) % GA || N / R / GA > INT_MAX || N / R / GA < o->min_micro_batch)
                continue;
            pd.gradient_accumulation_steps = GA;
            pd.micro_batch_size = (int)(N / R / GA);
            pd.schedule = RP_SCHEDULE_1F1B;
            double t, bytes;
            if (!simulate(&S, &pd, &t, &bytes))
                continue;
            out->simulated++;
            consider(&S, &out->pipedream, &pd, t, bytes);
        }
        if (out->pipedream.found && (!out->best.found || out->pipedream.seconds < out->best.seconds))
            out->best = out->pipedream;
    }
    if (!out->best.found)
        st = rp_fail(err, RP_ERR_INFEASIBLE,
                     "plan: no configuration of %d workers fits %.0f bytes per worker",
                     W, o->memory_size);
done:
    for (int k = 0; k < S.nm; k++) {
        measured *m = &S.m[k];
        free(m->fw), free(m->bw), free(m->out), free(m->par), free(m->cut), free(m->cf), free(m->cb), free(m->cp);
        free(m->bi), free(m->bwt);
    }
    free(S.best), free(S.cut), free(S.rep);
    free(S.c);
    return st;
}
