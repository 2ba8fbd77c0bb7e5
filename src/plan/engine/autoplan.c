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
** autoplan_programme.c runs the programme over every shape; this file
** simulates the candidates (and tensor groups, PipeDream's plan, equal
** devices); autoplan_try.c prices and chooses them,
** autoplan_rungs.c says which layers a stage recomputes by layer, and
** autoplan_setup.c makes and frees the search's state.
*/
#include <float.h>
#include <limits.h>
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

/* Simulated exactly: the best estimates; and, whatever their estimates,
** every single-worker and data-parallel shape. A pipeline's shape under
** the zero-bubble schedules, two chunks a worker and DualPipe too, which
** fill its bubble at more activation memory. */
static void simulate_shapes(const search *S, int W, rp_autoplan *out) {
    for (int i = 0; i < S->n; i++) {
        const cand *k = &S->c[i];
        bool single = k->R == 1 && k->per == 1, dp = k->per == 1 && k->R * k->per == W;
        if (i >= S->o->candidates && !single && !dp)
            continue;
        rp_config cfg;
        double t, bytes;
        rpi_plan_config(S, k, &cfg);
        if (!rpi_plan_simulate(S, &cfg, &t, &bytes))
            continue;
        out->simulated++;
        if (single)
            rpi_plan_consider(S, &out->single, &cfg, t, bytes);
        if (dp)
            rpi_plan_consider(S, &out->data_parallel, &cfg, t, bytes);
        rpi_plan_consider(S, &out->best, &cfg, t, bytes);
        if (k->P < 2)
            continue;
        rpi_plan_consider(S, &out->pipeline_1f1b, &cfg, t, bytes);
        out->simulated += rpi_plan_zero_bubble(S, k, cfg, &out->pipeline_zero_bubble, &out->best);
        out->simulated += rpi_plan_interleaved(S, k, cfg, &out->pipeline_interleaved, &out->best);
        out->simulated += rpi_plan_dualpipe(S, k, cfg, &out->pipeline_interleaved, &out->best);
    }
}

/* A third axis: the shapes of W / t workers, each split over tensor groups
** of t inside a unit of the innermost level (Megatron-LM's placement), the
** best estimates of each t simulated exactly under 1f1b and, for a
** pipeline, the zero-bubble schedules and two chunks a worker. */
static void tensor_shapes(const search *S, int W, rp_autoplan *out) {
    const rp_autoplan_options *o = S->o;
    for (int t = 2; t <= 8 && o->tensor_split && o->num_levels > 0; t *= 2) {
        if (!(o->tensor_degrees & (1u << t)) || o->machines[0] % t ||
            (o->tensor_parallel && t != o->tensor_parallel))
            continue;
        for (int i = 0, tried = 0; i < S->n && tried < o->candidates; i++) {
            const cand *k = &S->c[i];
            if (k->per * k->R * t != W || rpi_cand_by_layer(k))
                continue; /* (a tensor group's layers are not the model's) */
            tried++;
            rp_config cfg;
            double sec, bytes;
            rpi_plan_config(S, k, &cfg);
            cfg.tensor_parallel = t;
            if (rpi_plan_simulate(S, &cfg, &sec, &bytes)) {
                out->simulated++;
                rpi_plan_consider(S, &out->tensor_parallel, &cfg, sec, bytes);
                rpi_plan_consider(S, &out->best, &cfg, sec, bytes);
            }
            if (k->P > 1) {
                out->simulated +=
                    rpi_plan_zero_bubble(S, k, cfg, &out->tensor_parallel, &out->best);
                out->simulated +=
                    rpi_plan_interleaved(S, k, cfg, &out->tensor_parallel, &out->best);
            }
        }
    }
}

/* PipeDream's plan, run synchronously at each accumulation that fits. It
** wins where faster, and where it is what the options ask for: as many
** stages as pipeline_stages, none replicated with one_worker_a_stage, 1f1b
** among the schedules. */
static void pipedream_shape(const search *S, const rp_profile *profile, const rp_plan *pipedream,
                            rp_autoplan *out, rp_error *err) {
    const rp_autoplan_options *o = S->o;
    long long N = o->global_batch;
    rp_config pd = *S->base;
    if (!pipedream || rp_plan_to_config(pipedream, profile, &pd, NULL, 0, err))
        return;
    int R = pd.replication_factor, most = 1;
    for (int s = 0; s < pd.layers_per_stage.count; s++)
        most = rp_config_stage_replicas(&pd, s) > most ? rp_config_stage_replicas(&pd, s) : most;
    int lo = most, hi = rpi_accumulation_cap(S, N, R);
    if (o->micro_batch > 0) { /* that micro-batch exactly: the accumulation it makes */
        int GA = rpi_exact_accumulation(o, N, R);
        lo = hi = GA >= most ? GA : 0;
    }
    for (int GA = lo; N % R == 0 && GA >= 1 && GA <= hi && GA <= N / R; GA++) {
        if ((N / R) % GA || N / R / GA > INT_MAX || N / R / GA < o->min_micro_batch)
            continue;
        pd.gradient_accumulation_steps = GA;
        pd.micro_batch_size = (int)(N / R / GA);
        pd.schedule = RP_SCHEDULE_1F1B;
        double t, bytes;
        if (!rpi_plan_simulate(S, &pd, &t, &bytes))
            continue;
        out->simulated++;
        rpi_plan_consider(S, &out->pipedream, &pd, t, bytes);
    }
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

/* Devices of several kinds: what a planner that takes them as equal would
** run, on these (out->equal_devices; nothing where it finds nothing). */
static rp_status equal_devices(const search *S, int W, const rp_profile *const *profiles,
                               const double *batches, int num_profiles,
                               const rp_plan *pipedream, rp_autoplan *out, rp_error *err) {
    const rp_autoplan_options *o = S->o;
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
    if (!e)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    rp_error ignored; /* (nothing for equal devices: no row) */
    double t, bytes, far;
    if (!rp_autoplan_compute(profiles, batches, num_profiles, S->base, pipedream, &eq, e,
                             &ignored) &&
        rpi_plan_simulate_as_is(S, &e->best.cfg, &t, &bytes, &far)) {
        out->equal_devices = (rp_autoplan_entry){true, e->best.cfg, t, bytes};
        out->simulated++;
    }
    free(e);
    return RP_OK;
}

/* Of the n profiles, those measured on a rank of a group of t (o's
** profile_tensor) into ps and bs; how many. */
static int profiles_at(const rp_autoplan_options *o, int t, const rp_profile *const *profiles,
                       const double *batches, int n, const rp_profile **ps, double *bs) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if ((o->profile_tensor ? o->profile_tensor[i] : 1) == t)
            ps[k] = profiles[i], bs[k++] = batches[i];
    return k;
}

/* Tensor groups of t, from the profiles measured on a rank of one: the
** programme with a group as its worker (a unit of the innermost level holds
** machines[0] / t; a group's link to the next is the level's), then its
** best estimates simulated on all W workers with tensor_parallel t, the
** profile's times, parameters and memory a rank's as they are. */
static rp_status measured_groups(const rp_profile *const *ps, const double *bs, int n, int t,
                                 const rp_config *base, const rp_autoplan_options *o, int W,
                                 double *fastest, rp_autoplan *out, rp_error *err) {
    if (o->num_levels < 1 || o->machines[0] % t)
        return RP_OK; /* (a group inside a unit of the innermost level) */
    rp_autoplan_options ot = *o;
    ot.machines[0] /= t;
    ot.profile_tensor = NULL, ot.tensor_split = NULL;
    search S = {.base = base, .o = &ot, .fastest = fastest};
    bool too_big = false;
    rp_autoplan *e = calloc(1, sizeof *e);
    rp_status st = e ? rpi_plan_programme(&S, ps, bs, n, W / t, &too_big, err)
                     : rp_fail(err, RP_ERR_NOMEM, "out of memory");
    if (!st && S.n) {
        rp_config bt = *base;
        bt.tensor_parallel = t;
        S.base = &bt, S.o = o;
        memcpy(S.sim.machines, o->machines, sizeof o->machines);
        S.sim.tensor_measured = true;
        simulate_shapes(&S, W, e);
        out->simulated += e->simulated;
        if (e->best.found) {
            rpi_plan_consider(&S, &out->tensor_parallel, &e->best.cfg, e->best.seconds,
                              e->best.worker_bytes);
            rpi_plan_consider(&S, &out->best, &e->best.cfg, e->best.seconds,
                              e->best.worker_bytes);
        }
    }
    free(e);
    rpi_plan_free(&S);
    return st;
}

/* The search, in the steps above: the options and profiles read, every
** shape's stages by the programme, the best estimates simulated (with the
** zero-bubble, interleaved and DualPipe schedules, and tensor groups),
** PipeDream's plan beside them, and equal devices' choice where they are
** not; then tensor groups from profiles measured on their ranks. */
rp_status rp_autoplan_compute(const rp_profile *const *profiles, const double *batches,
                              int num_profiles, const rp_config *base, const rp_plan *pipedream,
                              const rp_autoplan_options *o, rp_autoplan *out, rp_error *err) {
    memset(out, 0, sizeof *out);
    int W = 1;
    rp_status st = rpi_plan_check_options(o, num_profiles, &W, err);
    if (st)
        return st;
    const rp_profile *ps[RP_AUTOPLAN_MAX_PROFILES];
    double bs[RP_AUTOPLAN_MAX_PROFILES], fastest = DBL_MAX;
    int n = profiles_at(o, 1, profiles, batches, num_profiles, ps, bs);
    if (n == 0)
        return rp_fail(err, RP_ERR_INVALID, "plan: a profile measured on one worker "
                       "(tensor_parallel 1) is needed beside those of tensor groups");
    /* plain: the plans of one worker a device; shapes: the programme over
    ** them runs (with a t asked for, only for tensor_split's groups of it) */
    search S = {.base = base, .o = o, .fastest = &fastest};
    bool too_big = false, plain = o->tensor_parallel <= 1, shapes = plain || o->tensor_split;
    if (shapes)
        st = rpi_plan_programme(&S, ps, bs, n, W, &too_big, err);
    for (int t = 2; !st && o->profile_tensor && t <= 64; t++) {
        const rp_profile *pt[RP_AUTOPLAN_MAX_PROFILES];
        double bt[RP_AUTOPLAN_MAX_PROFILES];
        int k = profiles_at(o, t, profiles, batches, num_profiles, pt, bt);
        if (k && (!o->tensor_parallel || o->tensor_parallel == t))
            st = measured_groups(pt, bt, k, t, base, o, W, &fastest, out, err);
    }
    if (!st && plain)
        simulate_shapes(&S, W, out);
    if (!st && shapes)
        tensor_shapes(&S, W, out);
    if (!st && plain)
        pipedream_shape(&S, ps[0], pipedream, out, err);
    if (!st && !shapes && !out->best.found)
        st = rp_fail(err, RP_ERR_INFEASIBLE, "plan: no configuration of %d workers in tensor "
                     "groups of %d%s fits (profiles measured on their ranks: tensor_parallel=%d "
                     "in the Input's description)", W, o->tensor_parallel,
                     o->memory_size > 0 ? " within the memory" : "", o->tensor_parallel);
    if (!st && !out->best.found && S.n == 0 && too_big)
        st = rp_fail(err, RP_ERR_INFEASIBLE,
                     "plan: %lld samples per update split over at most %d replicas and %d "
                     "micro-batches an update leave micro-batches of more "
                     "than %d samples: give a smaller global batch, or one with more divisors",
                     o->global_batch, W, rpi_accumulation_cap(&S, o->global_batch, 1),
                     INT_MAX);
    if (!st && !out->best.found)
        st = rpi_plan_none_found(&S, W, o, err);
    if (!st && (o->device_speed || o->device_memory))
        st = equal_devices(&S, W, profiles, batches, num_profiles, pipedream, out, err);
    rpi_plan_free(&S);
    return st;
}
