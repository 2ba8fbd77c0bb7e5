/*
** Sessions: a model, an execution configuration and the workers that run
** them. A host call (rp_session_run) performs device_iterations updates on
** data handed over at once and returns the losses shaped by output_mode.
*/
#ifndef REPIPE_SESSION_H
#define REPIPE_SESSION_H

#include <stdint.h>

#include "repipe/config.h"
#include "repipe/core.h"
#include "repipe/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rp_session rp_session;

/* Losses of a host call (DESIGN §4.4): `all` gives [D][R][GA] micro-batch
** losses, `sum` and `final` give [R]. Each loss is the mean over the samples
** of its micro-batch. Owned by the session until the next call. */
typedef struct rp_result {
    int ndim;
    int dims[3];
    int count;
    const float *losses;
} rp_result;

rp_status rp_session_create(const rp_model *m, const rp_config *cfg, rp_session **out,
                            rp_error *err);
void rp_session_free(rp_session *s);

/* Samples one host call takes: B * GA * R * D. */
long long rp_session_samples_per_call(const rp_session *s);
/* Updates done so far. */
long long rp_session_updates(const rp_session *s);

/* One host call: D updates on rows x (samples_per_call of them, in stream
** order: update by update, replica by replica, micro-batch by micro-batch),
** their labels and global sample ids. */
rp_status rp_session_run(rp_session *s, const float *x, const int32_t *labels,
                         const int64_t *sample_ids, rp_result *res, rp_error *err);

/* Inference on n rows: the predicted class of each row, in row order. */
rp_status rp_session_predict(rp_session *s, const float *x, int n, int32_t *pred,
                             rp_error *err);

/* The model's weights, or replaces them (every variable, with its shape). */
rp_status rp_session_get_weights(rp_session *s, rp_weights **out, rp_error *err);
rp_status rp_session_set_weights(rp_session *s, const rp_weights *w, rp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_SESSION_H */
