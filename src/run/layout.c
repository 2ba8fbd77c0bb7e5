/*
** What a configuration makes of a stage's nets and of its reductions: the
** options its nets are made with, the workers that reduce a variable
** together, and whether a run of variables is summed and updated in one
** call. The session (session.c), inference, the training state and the
** memory plan (inference.c, state.c, memory.c) all read them, so they sit
** below every one of those files.
*/
#include <math.h>
#include <stdint.h>

#include "session_impl.h"

/* How the nets of a stage trade memory for compute: recomputation, and the
** scratch of a product limited to matmul_proportion of device_memory. */
rp_net_options rpi_net_options(const rp_config *cfg, int stage, bool inference) {
    rp_net_options o = {.recompute = !inference && cfg->recompute_checkpoint_every_layer,
                        .recompute_layers = !inference && cfg->recompute_layers_count
                                                ? cfg->recompute_layers
                                                : NULL,
                        .split_backward = !inference &&
                                          rp_schedule_splits_backward(cfg->schedule)};
    const double *prop = cfg->matmul_proportion;
    int count = cfg->matmul_proportion_count;
    if (inference && cfg->inference_matmul_proportion_count)
        prop = cfg->inference_matmul_proportion, count = cfg->inference_matmul_proportion_count;
    double p = prop[stage < count ? stage : 0];
    if (cfg->device_memory > 0 && p == 0)
        o.scratch_least = true;
    else if (cfg->device_memory > 0) /* above 1: more than device_memory, as IPUConfig allows */
        o.scratch_limit = (size_t)fmin(p * (double)cfg->device_memory, (double)SIZE_MAX / 2);
    return o;
}

int rpi_reduce_members(const rp_session *s, const rp_grouping *g, int c, int stage, int k,
                       int *out) {
    int n = 0, q = rp_grouping_group_of(g, c);
    for (int i = 0; i < g->group_size; i++)
        for (int j = 0; j < rp_config_stage_replicas(&s->cfg, stage); j++)
            out[n++] = rp_workplan_worker(&s->cfg, rp_grouping_member(g, q, i), stage, j) + k;
    return n;
}

/* Whether a run reduced over k workers is summed and updated by one
** rp_comm_reduce_update. With an optimizer that keeps no state, always:
** locally each member then updates a chunk for all. A stateful update may be
** split only where its state is: sharded runs on the local backend, whose
** chunk is the member's shard (under MPI every rank would update all of it).
** Never with auto_loss_scaling (the update may yet be skipped), gradient
** clipping (it waits for the global norm), fp16 sums or offchip state
** (streamed a chunk at a time). */
bool rpi_fused_run(const rp_session *s, int k, bool sharded) {
    if (k < 2 || s->cfg.auto_loss_scaling || s->cfg.fp16_exchange ||
        s->cfg.reduction_bucket_mb > 0 || /* (summed in buckets before the update) */
        s->cfg.gradient_clipping > 0 || s->nties || /* (the update waits for the norm, the tie) */
        s->cfg.schedule == RP_SCHEDULE_PIPEDREAM_2BW) /* (it updates the other version) */
        return false;
    if (s->state_per_param == 0)
        return true;
    return sharded && s->backend == RP_BACKEND_LOCAL && !s->cfg.optimizer_state_offchip;
}
