/*
** What the layers' kernels are given besides their input (a step's context),
** and the optimizers' update over flat buffers (src/layers/). Nets run the
** kernels (repipe/net.h).
*/
#ifndef REPIPE_LAYERS_H
#define REPIPE_LAYERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "repipe/config.h"
#include "repipe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a forward pass needs to know besides its input. */
typedef struct rp_step_ctx {
    bool training;
    uint64_t seed;
    uint64_t update;          /* for dropout masks */
    const int64_t *sample_id; /* global sample ids, one per row, for dropout */
    const int32_t *labels;    /* for the loss layer, one per row */
    double loss_scale;        /* the loss gradient is multiplied by this (1 / samples) */
    int embedding_blocks;     /* embedding tables processed as this many row blocks (0, 1: whole) */
    /* batchnorm in training: 1 + the slot of the update's statistics this
    ** micro-batch records into (its number in the update, replica-major);
    ** 0: records nothing */
    int stat_slot;
    /* Called in a backward, from the last layer down, once each layer's
    ** weight gradient is as this call leaves it (after a whole backward of
    ** the layer, or its weights' half; never after an input half): the
    ** caller may start reducing [the layer's first parameter, the net's
    ** last) while the layers below compute. NULL: not called. */
    void (*grads_done)(void *arg, int layer);
    void *grads_arg;
} rp_step_ctx;

/* Floats of optimizer state per parameter: 0 (sgd), 1 (sgd + momentum) or
** 2 (adam). */
int rp_optimizer_state_per_param(const rp_optimizer_config *o);

/* One update of n parameters from their gradients. step counts updates from
** 1 (Adam's bias correction). PyTorch's SGD and Adam/AdamW semantics. The
** state is rp_optimizer_state_per_param arrays of n floats, one after the
** other (NULL when there are none). */
void rp_optimizer_step(const rp_optimizer_config *o, long long step, float *params,
                       const float *grads, float *state, size_t n);
/* The same with the state's arrays `stride` floats apart (stride >= n): a
** piece of a longer run of parameters, updated on its own. */
void rp_optimizer_step_at(const rp_optimizer_config *o, long long step, float *params,
                          const float *grads, float *state, size_t stride, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_LAYERS_H */
