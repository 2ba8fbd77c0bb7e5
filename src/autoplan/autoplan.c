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
** reduction_bucket_mb) and keeps them where they are faster. This file
** searches the shapes; autoplan_try.c prices and chooses them.
*/
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autoplan_impl.h"

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

/* The least of v over a stage's devices: workers off .. off + r - 1 of each
** of the R replicas of per workers. */
static double stage_least(const double *v, int R, int per, int off, int r) {
    double least = DBL_MAX;
    for (int q = 0; q < R; q++)
        for (int i = off; i < off + r; i++)
            least = v[q * per + i] < least ? v[q * per + i] : least;
    return least;
}

/* How much longer a stage's passes take than the profile's: its
** micro-batches dealt round-robin, the slowest device sets the pace. */
static double stage_slowness(const search *S, int R, int per, int off, int r) {
    return S->o->device_speed ? 1 / stage_least(S->o->device_speed, R, per, off, r) : 1;
}

/* The bytes a worker of the stage may hold: the least of its devices' (0:
** no limit). */
static double stage_memory(const search *S, int R, int per, int off, int r) {
    return S->o->device_memory ? stage_least(S->o->device_memory, R, per, off, r)
                               : S->o->memory_size;
}

static bool programme(search *S, int R, int per, int GA, bool recompute, bool shard) {
    int L = S->L, W1 = per + 1, PM = per < RP_AUTOPLAN_STAGES ? per : RP_AUTOPLAN_STAGES;
    if (PM > L)
        PM = L;
    int B = (int)(S->o->global_batch / ((long long)R * GA)), prof = rpi_plan_nearest(S, B);
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
                    if (j < L && S->o->cuts && !S->o->cuts[j])
                        continue; /* (a cut the trainer cannot make) */
                    double f = (M->cf[j] - M->cf[i]) * scale;
                    double t = f + (M->cb[j] - M->cb[i]) * scale;
                    if (cfg.recompute_checkpoint_every_layer)
                        t += f;
                    double par = M->cp[j] - M->cp[i];
                    int rmax = S->o->one_worker_a_stage ? 1 : GA;
                    for (int r = 1; r <= k - (p - 1) && r <= rmax; r++) {
                        double rest = S->best[AT(p - 1, j, k - r)]; /* finite: stages fill k */
                        if (rest == DBL_MAX)
                            continue;
                        /* this stage's workers: offset per - k in every replica */
                        int off = per - k;
                        int top = rpi_level_of(&S->net, off, (R - 1) * per + off + r - 1);
                        double slow = stage_slowness(S, R, per, off, r);
                        double cost = (double)((GA + r - 1) / r) * t * slow +
                                      rpi_allreduce_time(R * r, par, S->net.bw[top],
                                                         S->net.latency) +
                                      par / S->sim.memory_bandwidth * slow;
                        double m = cost > rest ? cost : rest;
                        if (m >= *b)
                            continue;
                        double cap = stage_memory(S, R, per, off, r);
                        if (cap > 0) {
                            int inflight = k < GA ? k : GA, slots = (inflight + r - 1) / r;
                            if (rpi_stage_bytes(&cfg, M->out, M->par, i, j - i, r, slots,
                                                scale, &S->sim) > cap)
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
        if (S->o->pipeline_stages > 0 && P != S->o->pipeline_stages)
            continue;
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
            double t = (M->cf[j] - M->cf[i] + M->cb[j] - M->cb[i]) * scale *
                       stage_slowness(S, R, per, per - k, r);
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

/* Why no configuration was found, by its cause: the layers too few for the
** stages asked, the cuts a trainer can make, or the memory. */
static rp_status none_found(const search *S, int W, const rp_autoplan_options *o,
                            rp_error *err) {
    int P = o->pipeline_stages, cuts = 0;
    if (P > S->L)
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: pipelines of %d stages need %d layers or "
                       "more; the profile has %d (a stage holds one layer at least)", P, P, S->L);
    for (int j = 1; o->cuts && j < S->L; j++)
        cuts += o->cuts[j] != 0;
    if (o->cuts && P > 1 && cuts < P - 1)
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: the trainer can begin a stage at %d of the "
                       "%d layers, too few for pipelines of %d stages", cuts, S->L, P);
    if (!(o->memory_size > 0) && !o->device_memory)
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: no configuration of %d workers%s splits "
                       "the update's samples evenly (accumulation up to %d, micro-batches of %d "
                       "samples at least)", W, P ? " in pipelines of that many stages" : "",
                       o->max_accumulation, o->min_micro_batch);
    return rp_fail(err, RP_ERR_INFEASIBLE,
                   "plan: no configuration of %d workers fits %.0f bytes per worker, even with "
                   "recomputation, sharded optimizer state and every accumulation up to %d "
                   "(micro-batches of %d samples at least)",
                   W, o->memory_size, o->max_accumulation, o->min_micro_batch);
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
    if (o->pipeline_stages < 0 || o->pipeline_stages > RP_AUTOPLAN_STAGES)
        return rp_fail(err, RP_ERR_INVALID,
                       "plan: pipeline_stages must be 0 (any) to %d, not %d",
                       RP_AUTOPLAN_STAGES, o->pipeline_stages);
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
    for (int d = 0; o->device_speed && d < W; d++)
        if (!(o->device_speed[d] > 0) || isinf(o->device_speed[d]))
            return rp_fail(err, RP_ERR_INVALID,
                           "plan: device %d's speed is %g (a positive number, 1 for the "
                           "profile's device)", d, o->device_speed[d]);
    for (int d = 0; o->device_memory && d < W; d++)
        if (!(o->device_memory[d] > 0) || isinf(o->device_memory[d]))
            return rp_fail(err, RP_ERR_INVALID,
                           "plan: device %d's memory is %g bytes (a positive number)", d,
                           o->device_memory[d]);
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
        if (!st)
            st = rp_profile_memory(profiles[S.nm], node, L, m->mem, err);
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
    S.sim.device_speed = o->device_speed;
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
            if (per < o->pipeline_stages)
                continue; /* (fewer workers than the stages asked for) */
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
                    if (q > 0 && !(o->memory_size > 0) && !o->device_memory)
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
        st = none_found(&S, W, o, err);
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
        rpi_plan_config(&S, k, &cfg);
        if (!rpi_plan_simulate(&S, &cfg, &t, &bytes))
            continue;
        out->simulated++;
        if (single)
            rpi_plan_consider(&S, &out->single, &cfg, t, bytes);
        if (dp)
            rpi_plan_consider(&S, &out->data_parallel, &cfg, t, bytes);
        rpi_plan_consider(&S, &out->best, &cfg, t, bytes);
        if (k->P < 2)
            continue;
        /* a pipeline: the zero-bubble schedules too, which fill its bubble
        ** with the weights' halves at more activation memory */
        rpi_plan_consider(&S, &out->pipeline_1f1b, &cfg, t, bytes);
        out->simulated += rpi_plan_zero_bubble(&S, k, cfg, &out->pipeline_zero_bubble, &out->best);
        out->simulated += rpi_plan_interleaved(&S, k, cfg, &out->pipeline_interleaved, &out->best);
        out->simulated += rpi_plan_dualpipe(&S, k, cfg, &out->pipeline_interleaved, &out->best);
    }
    /* A third axis: the shapes of W / t workers, each split over tensor
    ** groups of t inside a unit of the innermost level (Megatron-LM's
    ** placement), the best estimates of each t simulated exactly under
    ** 1f1b and, for a pipeline, the zero-bubble schedules and two chunks a
    ** worker */
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
            rpi_plan_config(&S, k, &cfg);
            cfg.tensor_parallel = t;
            if (rpi_plan_simulate(&S, &cfg, &sec, &bytes)) {
                out->simulated++;
                rpi_plan_consider(&S, &out->tensor_parallel, &cfg, sec, bytes);
                rpi_plan_consider(&S, &out->best, &cfg, sec, bytes);
            }
            if (k->P > 1) {
                out->simulated +=
                    rpi_plan_zero_bubble(&S, k, cfg, &out->tensor_parallel, &out->best);
                out->simulated +=
                    rpi_plan_interleaved(&S, k, cfg, &out->tensor_parallel, &out->best);
            }
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
            if (!rpi_plan_simulate(&S, &pd, &t, &bytes))
                continue;
            out->simulated++;
            rpi_plan_consider(&S, &out->pipedream, &pd, t, bytes);
        }
        /* it wins where faster, and where it is what the options ask for: as
        ** many stages as pipeline_stages, none replicated with
        ** one_worker_a_stage, 1f1b among the schedules */
        const rp_config *q = &out->pipedream.cfg;
        bool replicated = false;
        for (int s = 0; s < q->layers_per_stage.count; s++)
            replicated = replicated || rp_config_stage_replicas(q, s) > 1;
        bool allowed = (!o->pipeline_stages || q->layers_per_stage.count == o->pipeline_stages) &&
                       (!o->one_worker_a_stage || !replicated) &&
                       (!o->schedules || (o->schedules & (1u << RP_SCHEDULE_1F1B)));
        if (out->pipedream.found && allowed &&
            (!out->best.found || out->pipedream.seconds < out->best.seconds))
            out->best = out->pipedream;
    }
    if (!out->best.found)
        st = none_found(&S, W, o, err);
    /* devices of several kinds: what a planner that takes them as equal
    ** would run, on these */
    if (!st && (o->device_speed || o->device_memory)) {
        rp_autoplan_options eq = *o;
        eq.device_speed = NULL;
        if (o->device_memory) { /* equal: each the least of them */
            eq.device_memory = NULL;
            eq.memory_size = DBL_MAX;
            for (int d = 0; d < W; d++)
                eq.memory_size = o->device_memory[d] < eq.memory_size ? o->device_memory[d]
                                                                      : eq.memory_size;
        }
        rp_autoplan *e = malloc(sizeof *e);
        rp_error ignored; /* (nothing for equal devices: no row) */
        double t, bytes, far;
        if (!e) {
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        } else if (!rp_autoplan_compute(profiles, batches, num_profiles, base, pipedream, &eq, e,
                                        &ignored) &&
                   rpi_plan_simulate_as_is(&S, &e->best.cfg, &t, &bytes, &far)) {
            out->equal_devices = (rp_autoplan_entry){true, e->best.cfg, t, bytes};
            out->simulated++;
        }
        free(e);
    }
done:
    for (int k = 0; k < S.nm; k++) {
        measured *m = &S.m[k];
        free(m->fw), free(m->bw), free(m->out), free(m->par), free(m->cut), free(m->cf), free(m->cb), free(m->cp);
        free(m->bi), free(m->bwt);
        for (int k = 0; k < 5; k++)
            free(m->mem[k]);
    }
    free(S.best), free(S.cut), free(S.rep);
    free(S.c);
    return st;
}
