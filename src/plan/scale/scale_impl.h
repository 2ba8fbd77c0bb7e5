/*
** The cluster-scale planner's shared piece: what each pipeline rank of a
** configuration holds (scale_simulate.c), which the search (scale.c) asks of
** its plan and the simulation of every configuration.
*/
#ifndef REPIPE_SCALE_IMPL_H
#define REPIPE_SCALE_IMPL_H

#include "repipe/planner.h"
#include "../../transformer/transformer_impl.h"

/* Each rank's memory of cfg (its layout, schedule, micro-batches and
** replicas) under run and sharding; the busiest into *busiest, its rank
** into *at. */
rp_status rpi_scale_ranks_memory(const rp_transformer *m, const rp_transformer_run *run,
                                 rp_sharding sharding, const rp_config *cfg,
                                 rp_transformer_memory *busiest, int *at, rp_error *err);

#endif /* REPIPE_SCALE_IMPL_H */
