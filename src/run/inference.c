/*
** Inference: the inference stages run one after another on every
** micro-batch, replicas taking every R-th one, with replica 0's weights.
*/
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "session_impl.h"

/* ---- inference ---------------------------------------------------------------------- */

/* Sharded inference (docs/pipelines.md) with replica 0's weights: each inference
** replica runs the inference stages one after another on micro-batches r,
** r + R, r + 2R, ... of the rows. On the local backend the replicas are
** threads (replica 0 the calling thread); under MPI every rank computes all
** rows itself, one replica. A row's prediction does not depend on R: the
** micro-batches are the same. */
typedef struct infer_replica {
    const rp_session *s;
    const float *x;
    const int32_t *labels; /* loss mode: num_targets per row; else NULL */
    double loss_sum;       /* loss mode: the summed losses of this replica's rows */
    int n, r, R, used;
    int32_t *pred;         /* prediction mode: a class per row; else NULL */
    rp_net *nets[RP_MAX_STAGES];
    rp_acts *acts[RP_MAX_STAGES];
    rp_status st;
    rp_error err;
    pthread_t thread;
} infer_replica;

static rp_status infer_setup(infer_replica *ir, const int *counts, int P, const float *params) {
    const rp_model *m = ir->s->m;
    int l0 = 0;
    rp_status st = RP_OK;
    for (int t = 0; t < P && !st; t++) {
        if (counts[t] == 0)
            continue;
        rp_net_options no = rpi_net_options(&ir->s->cfg, t, true);
        rp_net **net = &ir->nets[ir->used];
        if ((st = rp_net_create_with(m, l0, l0 + counts[t], ir->s->B, &no, net, &ir->err)) ||
            (st = rp_acts_create(*net, ir->s->B, &ir->acts[ir->used], &ir->err)))
            break;
        memcpy(rp_net_params(*net), params + m->layers[l0].param_offset,
               sizeof(float) * rp_net_num_params(*net));
        ir->used++;
        l0 += counts[t];
    }
    return st;
}

static void infer_run(infer_replica *ir) {
    const rp_session *s = ir->s;
    size_t in = rp_shape_size(&s->m->input);
    rp_step_ctx ctx = {.training = false,
                       .seed = s->cfg.seed,
                       .loss_scale = 1.0,
                       .embedding_blocks = s->cfg.inference_embedding_serialization_factor};
    size_t K = (size_t)s->m->num_targets;
    for (int at = ir->r * s->B; !ir->st && at < ir->n; at += ir->R * s->B) {
        int k = ir->n - at < s->B ? ir->n - at : s->B;
        const float *y = ir->x + (size_t)at * in;
        double loss = 0;
        ctx.labels = ir->labels ? ir->labels + (size_t)at * K : NULL;
        for (int t = 0; t < ir->used && y; t++)
            y = rp_net_forward(ir->nets[t], ir->acts[t], y, k, &ctx,
                               t == ir->used - 1 && ir->labels ? &loss : NULL);
        ir->loss_sum += loss;
        if (!y) {
            ir->st = RP_ERR_INVALID;
            for (int t = 0; t < ir->used; t++)
                if (rp_net_error(ir->nets[t])[0])
                    rp_fail(&ir->err, RP_ERR_INVALID, "%s", rp_net_error(ir->nets[t]));
            if (!ir->err.msg[0])
                rp_fail(&ir->err, RP_ERR_INVALID, "inference failed");
            return;
        }
        if (ir->pred)
            rp_net_predictions(ir->nets[ir->used - 1], ir->acts[ir->used - 1], ir->pred + at);
    }
}

static void *infer_thread(void *arg) {
    rp_fpu_fast_denormals();
    infer_run(arg);
    return NULL;
}

/* Under MPI rank r < R takes micro-batches r, r + R, ...; the predictions
** are then summed over the world as floats (exact: each row has one
** nonzero contribution, a class index below 2^24), with one more element
** that counts the ranks that failed, so that all return together. In loss
** mode the ranks' loss sums are summed the same way. */
static rp_status infer_mpi(rp_session *s, const float *x, const int32_t *labels, int n,
                           int32_t *pred, double *loss_sum, const int *counts, int P,
                           const float *params, int R, rp_error *err) {
    int me = rp_comm_rank(s->comm);
    infer_replica q = {.s = s, .x = x, .labels = labels, .n = n, .r = me, .R = R, .pred = pred};
    size_t slots = pred ? (size_t)n : 1; /* the votes, or one loss sum */
    float *votes = calloc(slots + 1, sizeof(float));
    if (!votes)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the predictions of %d rows", n);
    if (me < R && !(q.st = infer_setup(&q, counts, P, params)))
        infer_run(&q);
    if (q.st)
        votes[slots] = 1;
    for (int at = me * s->B; pred && me < R && !q.st && at < n; at += R * s->B)
        for (int i = at; i < n && i < at + s->B; i++)
            votes[i] = (float)pred[i];
    if (!pred)
        votes[0] = (float)q.loss_sum;
    rp_status st = rp_comm_allreduce(s->comm, NULL, votes, slots + 1, err);
    if (!st && q.st)
        st = rp_fail(err, q.st, "%s", q.err.msg);
    else if (!st && votes[slots] > 0)
        st = rp_fail(err, RP_ERR_INVALID, "inference failed on %d other rank(s)",
                     (int)votes[slots]);
    for (int i = 0; !st && pred && i < n; i++)
        pred[i] = (int32_t)votes[i];
    if (!st && !pred)
        *loss_sum = votes[0];
    for (int t = 0; t < q.used; t++) {
        rp_acts_free(q.acts[t]);
        rp_net_free(q.nets[t]);
    }
    free(votes);
    return st;
}

static rp_status infer_call(rp_session *s, const float *x, const int32_t *labels, int n,
                            int32_t *pred, double *loss_sum, rp_error *err);

/* Predictions (pred) or the summed loss (labels, loss_sum) of n rows; the
** calling thread runs replica 0 with denormals flushed, as the others. */
static rp_status infer(rp_session *s, const float *x, const int32_t *labels, int n,
                       int32_t *pred, double *loss_sum, rp_error *err) {
    unsigned fpu = rpi_fpu_enter();
    rp_status st = infer_call(s, x, labels, n, pred, loss_sum, err);
    rpi_fpu_leave(fpu);
    return st;
}

/* Inference on threads: R replicas, the calling thread running replica 0,
** each its share of the rows. */
static rp_status infer_local(rp_session *s, const float *x, const int32_t *labels, int n,
                             int32_t *pred, double *loss_sum, const int *counts, int P,
                             float *params, int R, rp_error *err) {
    rp_status st = RP_OK;
    infer_replica *ir = calloc((size_t)R, sizeof *ir);
    if (!ir) {
        free(params);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for %d inference replicas", R);
    }
    int made = 0, started = 0;
    while (made < R) {
        infer_replica *q = &ir[made++];
        *q = (infer_replica){
            .s = s, .x = x, .labels = labels, .n = n, .r = made - 1, .R = R, .pred = pred};
        if ((st = infer_setup(q, counts, P, params))) {
            rp_fail(err, st, "%s", q->err.msg);
            break;
        }
    }
    free(params);
    for (int r = 1; r < R && !st; r++, started++)
        if (pthread_create(&ir[r].thread, NULL, infer_thread, &ir[r]) != 0)
            break;
    if (!st && started < R - 1) { /* not every replica got a thread: run them here */
        for (int r = started + 1; r < R; r++)
            infer_run(&ir[r]);
    }
    if (!st)
        infer_run(&ir[0]);
    for (int r = 1; r <= started; r++)
        pthread_join(ir[r].thread, NULL);
    double sum = 0;
    for (int r = 0; r < made; r++) {
        if (!st && ir[r].st) /* the first replica's failure */
            st = rp_fail(err, ir[r].st, "%s", ir[r].err.msg);
        sum += ir[r].loss_sum; /* in replica order: the same sum every run */
        for (int t = 0; t < ir[r].used; t++) {
            rp_acts_free(ir[r].acts[t]);
            rp_net_free(ir[r].nets[t]);
        }
    }
    if (loss_sum)
        *loss_sum = sum;
    free(ir);
    return st;
}

static rp_status infer_call(rp_session *s, const float *x, const int32_t *labels, int n,
                            int32_t *pred, double *loss_sum, rp_error *err) {
    const rp_model *m = s->m;
    int counts[RP_MAX_STAGES], P = rp_config_num_stages(&s->cfg, true);
    rp_status st = rp_config_stage_layers(&s->cfg, true, m->num_layers, counts, err);
    if (st)
        return st;
    float *params = NULL;
    if ((st = rpi_all_params(s, &params, err))) /* replica 0's come first */
        return st;
    int batches = (n + s->B - 1) / s->B;
    int R = s->cfg.inference_replication_factor;
    if (s->backend == RP_BACKEND_MPI && R > rp_comm_size(s->comm))
        R = rp_comm_size(s->comm);
    R = R < batches ? R : (batches > 0 ? batches : 1);
    if (s->backend == RP_BACKEND_MPI) {
        st = infer_mpi(s, x, labels, n, pred, loss_sum, counts, P, params, R, err);
        free(params);
        return st;
    }
    st = infer_local(s, x, labels, n, pred, loss_sum, counts, P, params, R, err);
    return st;
}

rp_status rp_session_predict(rp_session *s, const float *x, int n, int32_t *pred,
                             rp_error *err) {
    if (s->m->num_targets > 1)
        return rp_fail(err, RP_ERR_INVALID,
                       "predict: the model scores %d targets per sample (one per token); it "
                       "predicts one class per sample only (rp_session_loss measures it)",
                       s->m->num_targets);
    return infer(s, x, NULL, n, pred, NULL, err);
}

rp_status rp_session_loss(rp_session *s, const float *x, const int32_t *labels, int n,
                          double *mean, rp_error *err) {
    *mean = 0;
    if (n < 1)
        return rp_fail(err, RP_ERR_INVALID, "loss: no rows");
    double sum = 0;
    rp_status st = infer(s, x, labels, n, NULL, &sum, err);
    if (!st)
        *mean = sum / n;
    return st;
}
