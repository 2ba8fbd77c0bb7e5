/*
** One rule, used by the engine, its memory plan, its state and the
** simulator: when a run of variables has its optimizer state sharded.
*/
#ifndef REPIPE_SHARDING_H
#define REPIPE_SHARDING_H

#include <stdbool.h>
#include <stddef.h>

#include "repipe/config.h"

/* With replicated_tensor_sharding, a run whose gradients `sharers` workers
** reduce together (its group's replicas times its stage's replicas) is
** sharded over them when there are two or more and there is optimizer
** state to shard. */
static inline bool rpi_sharded(const rp_config *cfg, int sharers, size_t state_per_param) {
    return cfg->replicated_tensor_sharding && sharers > 1 && state_per_param > 0;
}

#endif /* REPIPE_SHARDING_H */
