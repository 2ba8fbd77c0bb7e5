/*
** Profiling: a repipe model measured on this machine, layer by layer, as a
** profile the planner reads (repipe/profile.h). It runs the model's layers,
** so it lives beside the engine; the planner itself is arithmetic on
** profiles.
*/
#ifndef REPIPE_MEASURE_H
#define REPIPE_MEASURE_H

#include "repipe/core.h"
#include "repipe/model.h"
#include "repipe/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Measures a repipe model on this machine: per layer the median forward and
** backward time of `repeats` runs on `batch` rows, its output bytes and its
** parameter bytes, as a profile that starts with an Input source and chains
** the layers in order (PipeDream's optimizer reads it too). Each layer is
** timed inside whole passes of the model, as a stage runs it; where the
** model, its gradients and a micro-batch's activations would take over a
** quarter of the memory, each layer alone on what it reads. The Input's
** description says which (timed_in=whole_passes or timed_in=layers_alone).
** The caller frees *out with rp_profile_free. */
rp_status rp_profile_measure(const rp_model *m, int batch, int repeats, rp_profile **out,
                             rp_error *err);
/* The same with every layer timed alone, whatever the model's size. */
rp_status rp_profile_measure_alone(const rp_model *m, int batch, int repeats, rp_profile **out,
                                   rp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* REPIPE_MEASURE_H */
