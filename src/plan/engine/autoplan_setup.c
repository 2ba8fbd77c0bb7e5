/*
** The engine's planner's search state: its options checked, its profiles
** read (with their running sums) and the accumulations they let a shape
** take, the simulator's options and the programme's tables made, and all of
** it freed; and why nothing was found.
*/
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autoplan_impl.h"

/* Why no configuration was found, by its cause: the layers too few for the
** stages asked, the cuts a trainer can make, or the memory. */
rp_status rpi_plan_none_found(const search *S, int W, const rp_autoplan_options *o,
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
    char mb[64];
    snprintf(mb, sizeof mb, o->micro_batch > 0 ? "micro-batches of %d samples"
                                               : "micro-batches of %d samples at least",
             o->micro_batch > 0 ? o->micro_batch : o->min_micro_batch);
    char acc[64] = "any accumulation"; /* (an exact micro-batch makes its own: no cap) */
    if (o->micro_batch <= 0)
        snprintf(acc, sizeof acc, "every accumulation up to %d",
                 rpi_accumulation_cap(S, o->global_batch, 1));
    if (!(o->memory_size > 0) && !o->device_memory)
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: no configuration of %d workers%s splits "
                       "the update's samples evenly (%s, %s)", W,
                       P ? " in pipelines of that many stages" : "", acc, mb);
    return rp_fail(err, RP_ERR_INFEASIBLE,
                   "plan: no configuration of %d workers fits %.0f bytes per worker, even with "
                   "recomputation, %s and %s (%s)",
                   W, o->memory_size,
                   o->no_sharding ? "the optimizer state whole (no sharding asked)"
                                  : "sharded optimizer state",
                   acc, mb);
}

/* The options, each in its range; the number of workers in *W. */
rp_status rpi_plan_check_options(const rp_autoplan_options *o, int num_profiles, int *W,
                                 rp_error *err) {
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
        return rp_fail(err, RP_ERR_INVALID, "plan: latency must be >= 0 seconds, not %g",
                       o->latency);
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
    for (int i = 0; o->profile_tensor && i < num_profiles; i++)
        if (o->profile_tensor[i] < 1 || o->profile_tensor[i] > 64)
            return rp_fail(err, RP_ERR_INVALID,
                           "plan: profile %d was measured on a rank of a tensor group of %d "
                           "(1 to 64)", i + 1, o->profile_tensor[i]);
    if (o->profile_tensor && (o->device_speed || o->device_memory))
        return rp_fail(err, RP_ERR_INVALID, "plan: profiles of tensor groups' ranks plan "
                       "devices alike: not with each device's speed or memory");
    if (o->tensor_parallel < 0 || o->tensor_parallel > 64)
        return rp_fail(err, RP_ERR_INVALID, "plan: tensor_parallel must be 0 (any) to 64, not %d",
                       o->tensor_parallel);
    *W = 1;
    for (int l = 0; l < o->num_levels; l++)
        *W *= o->machines[l];
    for (int d = 0; o->device_speed && d < *W; d++)
        if (!(o->device_speed[d] > 0) || isinf(o->device_speed[d]))
            return rp_fail(err, RP_ERR_INVALID,
                           "plan: device %d's speed is %g (a positive number, 1 for the "
                           "profile's device)", d, o->device_speed[d]);
    for (int d = 0; o->device_memory && d < *W; d++)
        if (!(o->device_memory[d] > 0) || isinf(o->device_memory[d]))
            return rp_fail(err, RP_ERR_INVALID,
                           "plan: device %d's memory is %g bytes (a positive number)", d,
                           o->device_memory[d]);
    return RP_OK;
}

/* Profile i's rows into S->m[i], with their running sums; S->nm counts
** each profile begun, so that rpi_plan_free frees what it holds. */
rp_status rpi_plan_read_profile(search *S, const rp_profile *p, double batch, rp_error *err) {
    int i = S->nm++, *node = NULL, L;
    measured *m = &S->m[i];
    if (!(batch > 0))
        return rp_fail(err, RP_ERR_INVALID, "plan: profile %d: its micro-batch is %g", i + 1,
                       batch);
    m->batch = batch;
    rp_status st = rp_profile_layers(p, &m->fw, &m->bw, &m->out, &m->par, &node, &L, err);
    if (!st)
        st = rp_profile_cut_bytes(p, node, L, &m->cut, err);
    if (!st)
        st = rp_profile_split_ms(p, node, L, &m->bi, &m->bwt, err);
    if (!st)
        st = rp_profile_memory(p, node, L, m->mem, err);
    free(node);
    if (st)
        return st;
    m->cf = calloc(L + 1, sizeof(double));
    m->cb = calloc(L + 1, sizeof(double));
    m->cp = calloc(L + 1, sizeof(double));
    if (!m->cf || !m->cb || !m->cp)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for %d layers", L);
    for (int l = 0; l < L; l++) {
        m->cf[l + 1] = m->cf[l] + m->fw[l] * 1e-3;
        m->cb[l + 1] = m->cb[l] + m->bw[l] * 1e-3;
        m->cp[l + 1] = m->cp[l] + m->par[l];
    }
    if (!S->o->no_recompute_by_layer && !S->base->recompute_checkpoint_every_layer &&
        L <= RP_MAX_RECOMPUTE_LAYERS && (st = rpi_rungs_make(m, L, err)))
        return st;
    if (i == 0)
        S->L = L;
    else if (L != S->L || m->cp[L] != S->m[0].cp[L])
        return rp_fail(err, RP_ERR_INVALID,
                       "plan: profile %d has %d layers and %.0f parameter bytes, the first %d "
                       "and %.0f: profiles of one model are needed",
                       i + 1, L, m->cp[L], S->L, S->m[0].cp[S->L]);
    return RP_OK;
}

/* The most micro-batches an update on R replicas of N samples: the
** option's, or more where the profiles were measured on micro-batches that
** small (a run of a large batch on a few workers, Megatron-LM's hundreds of
** micro-batches of one sequence): the planner's times come from the nearest
** profile, scaled, so a micro-batch no smaller than the smallest profiled
** is priced from a measurement, not extrapolated below it. RPI_MOST_MICRO
** bounds it (a shape's accumulations are tried one by one). */
#define RPI_MOST_MICRO 65536
int rpi_accumulation_cap(const search *S, long long N, int R) {
    double least = S->m[0].batch;
    for (int i = 1; i < S->nm; i++)
        least = S->m[i].batch < least ? S->m[i].batch : least;
    double measured = least >= 1 ? (double)(N / R) / least : 0;
    int most = measured < RPI_MOST_MICRO ? (int)measured : RPI_MOST_MICRO;
    return most > S->o->max_accumulation ? most : S->o->max_accumulation;
}

/* The simulator's options and cluster, and the programme's tables. */
rp_status rpi_plan_prepare(search *S, int W, rp_error *err) {
    const rp_autoplan_options *o = S->o;
    rp_sim_options_default(&S->sim);
    S->sim.num_levels = o->num_levels;
    S->sim.cores = o->cores;
    S->sim.latency = o->latency;
    S->sim.polling = o->polling;
    memcpy(S->sim.machines, o->machines, sizeof o->machines);
    memcpy(S->sim.bandwidth, o->bandwidth, sizeof o->bandwidth);
    S->sim.tensor_split = o->tensor_split;
    S->sim.device_speed = o->device_speed;
    size_t cells = (size_t)(RP_AUTOPLAN_STAGES + 1) * (S->L + 1) * (W + 1);
    S->best = malloc(sizeof(double) * cells);
    S->loop = malloc(sizeof(double) * cells);
    S->cut = malloc(sizeof(int) * cells);
    S->rep = malloc(sizeof(int) * cells);
    S->rung = calloc(cells, 1);
    S->sums = malloc(sizeof(rpi_stage_acc) * (S->L + 1) * (RPI_RUNGS + 1));
    S->kmin = malloc(sizeof(int) * (RP_AUTOPLAN_STAGES + 1) * (S->L + 1));
    S->kmax = malloc(sizeof(int) * (RP_AUTOPLAN_STAGES + 1) * (S->L + 1));
    S->top = malloc(sizeof(double) * (o->candidates > 0 ? o->candidates : 1));
    if (S->m[0].crf[1]) /* recomputation by layer asked, and the profile's layers nameable */
        S->rung_cfg = malloc(sizeof(rp_config) * (RPI_RUNGS + 1));
    if (!S->best || !S->loop || !S->cut || !S->rep || !S->rung || !S->sums || !S->kmin || !S->kmax || !S->top ||
        (S->m[0].crf[1] && !S->rung_cfg))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the engine's planner (%d layers, "
                                          "%d workers)", S->L, W);
    return rpi_cluster_make(&S->sim, W, &S->net, err);
}

void rpi_plan_free(search *S) {
    for (int k = 0; k < S->nm; k++) {
        measured *m = &S->m[k];
        free(m->fw), free(m->bw), free(m->out), free(m->par), free(m->cut);
        free(m->cf), free(m->cb), free(m->cp), free(m->bi), free(m->bwt);
        for (int j = 0; j < 5; j++)
            free(m->mem[j]);
        for (int q = 0; q <= RPI_RUNGS; q++)
            free(m->crf[q]);
        free(m->rank);
    }
    free(S->best), free(S->loop), free(S->cut), free(S->rep), free(S->rung), free(S->rung_cfg);
    free(S->sums);
    free(S->kmin), free(S->kmax), free(S->top), free(S->c);
}
