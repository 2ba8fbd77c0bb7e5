/*
** Simulation: the time of one update of a configuration, predicted from a
** profile's layer times by playing every worker's checked operation list
** (schedule.h) on its own clock: a receive waits for its send, a reduction
** for its group, compute takes the profile's time scaled to the
** micro-batch.
*/
#ifndef REPIPE_SIMULATE_H
#define REPIPE_SIMULATE_H

#include "repipe/config.h"
#include "repipe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rp_sim_options {
    double profile_batch; /* rows the profile's times were measured on */
    double bandwidth;     /* bytes/s between workers [1e10: shared memory] */
    double latency;       /* seconds per message [2e-5] */
    double compute_scale; /* compute takes this many times the profile's [1]; e.g.
                          ** workers / cores when workers share cores */
} rp_sim_options;

typedef struct rp_sim_event {
    int worker, kind, mb;
    double t0, t1; /* seconds */
} rp_sim_event;

typedef struct rp_sim_result {
    double update_time; /* seconds */
    int workers, stages;
    /* A worker of each stage holds its parameters and gradients, its
    ** optimizer state (its shard with replicated_tensor_sharding, one chunk
    ** with optimizer_state_offchip) and the activations of every
    ** micro-batch it has in flight, in bytes. */
    double stage_bytes[RP_MAX_STAGES];
    int num_events;
    rp_sim_event *events;
} rp_sim_result;

/* Layer l of the model: forward and backward milliseconds, output bytes
** and parameter bytes, for the profile's batch. */
rp_status rp_simulate(const rp_config *cfg, const double *fwd_ms, const double *bwd_ms,
                      const double *out_bytes, const double *param_bytes, int num_layers,
                      const rp_sim_options *opt, rp_sim_result *res, rp_error *err);
void rp_sim_result_free(rp_sim_result *r);

/* The timeline as SVG: one row per worker, forwards, backwards, reductions
** and steps as boxes labelled with their micro-batch. */
rp_status rp_sim_svg(const rp_sim_result *r, const char *title, const char *path,
                     rp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_SIMULATE_H */
