/*
** A session's host calls: a call hands the workers its samples and waits
** for every worker's update (on the local backend the calling thread is
** worker 0 and the others wake from their wait), then gathers the losses.
** Sessions are made in session.c; session_impl.h is what they share.
*/
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "session_impl.h"

/* ---- host calls ------------------------------------------------------------------ */

static rp_status run(rp_session *s, rp_result *res, rp_error *err);

rp_status rp_session_run(rp_session *s, const float *x, const int32_t *labels,
                         const int64_t *sample_ids, rp_result *res, rp_error *err) {
    s->x = x;
    s->data = NULL;
    s->y = labels;
    s->ids = sample_ids;
    return run(s, res, err);
}

rp_status rp_session_run_samples(rp_session *s, const rp_dataset *d, const int64_t *sample_ids,
                                 rp_result *res, rp_error *err) {
    if (rp_shape_size(&d->sample) != rp_shape_size(&s->m->input))
        return rp_fail(err, RP_ERR_INVALID, "the dataset's samples have %zu values, the model's "
                       "input %zu", rp_shape_size(&d->sample), rp_shape_size(&s->m->input));
    size_t n = (size_t)s->D * s->R * s->GA * s->B, K = (size_t)s->m->num_targets;
    if ((size_t)d->label_count != K)
        return rp_fail(err, RP_ERR_INVALID,
                       "the dataset's samples have %d labels each, the model's loss takes %zu",
                       d->label_count, K);
    for (size_t i = 0; i < n; i++) {
        if (sample_ids[i] < 0 || sample_ids[i] >= d->n)
            return rp_fail(err, RP_ERR_INVALID, "sample id %lld (row %zu of the call) is not "
                           "in the dataset's %d samples", (long long)sample_ids[i], i, d->n);
        memcpy(s->labels + i * K, d->labels + sample_ids[i] * (int64_t)K, sizeof(int32_t) * K);
    }
    s->x = NULL;
    s->data = d;
    s->y = s->labels;
    s->ids = sample_ids;
    return run(s, res, err);
}

static rp_status run_call(rp_session *s, rp_result *res, rp_error *err);

static rp_status run(rp_session *s, rp_result *res, rp_error *err) {
    if (s->failed)
        return rp_fail(err, RP_ERR_ABORTED, "the session failed in an earlier call (%s): its "
                       "update was left half done; close it and open another",
                       s->failed_msg);
    unsigned fpu = rpi_fpu_enter();
    rp_status st = run_call(s, res, err);
    rpi_fpu_leave(fpu);
    if (st && !s->failed) {
        s->failed = true;
        snprintf(s->failed_msg, sizeof s->failed_msg, "%s", err->msg);
    }
    return st;
}

static rp_status run_call(rp_session *s, rp_result *res, rp_error *err) {
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        __atomic_store_n(&s->done, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->gen, s->gen + 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    rpi_worker_run(&s->w[0]); /* the calling thread is worker 0 */
    if (s->started) {
        for (int i = 0; s->spin && i < RP_SPIN_LIMIT &&
                        __atomic_load_n(&s->done, __ATOMIC_ACQUIRE) < s->started;
             i++)
            rp_cpu_relax();
        pthread_mutex_lock(&s->mu);
        while (s->done < s->started)
            pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    /* the failing worker's own message, not the others' "aborted" */
    const worker *bad = NULL;
    for (int i = 0; i < s->nlocal; i++)
        if (s->w[i].status && (!bad || bad->status == RP_ERR_ABORTED))
            bad = &s->w[i];
    if (bad)
        return rp_fail(err, bad->status, "%s", bad->err.msg);
    int R = s->R, D = s->D, GA = s->GA, P = s->P;
    int rl = rp_config_stage_replicas(&s->cfg, P - 1);
    if (s->backend == RP_BACKEND_MPI) {
        const worker *last = &s->w[0]; /* the rank's worker of the last stage, if it has one */
        for (int i = 1; i < s->nlocal; i++)
            if (s->w[i].stage == P - 1)
                last = &s->w[i];
        rp_status st = rp_comm_allgather(s->comm, NULL, last->losses, (size_t)D * GA, s->gather,
                                         err);
        if (st)
            return st;
    }
    /* [D][R][GA]: micro-batch mb of replica c was the last stage's, on its
    ** stage replica mb mod r */
    for (int c = 0; c < R; c++)
        for (int mb = 0; mb < GA; mb++) {
            int id = rp_workplan_worker(&s->cfg, c, P - 1, mb % rl);
            const float *src = s->backend == RP_BACKEND_MPI
                                   ? s->gather + (size_t)rpi_rank_of(s, id) * D * GA
                                                            : s->w[id].losses;
            for (int d = 0; d < D; d++)
                s->all[((size_t)d * R + c) * GA + mb] = src[(size_t)d * GA + mb];
        }
    s->updates += D;
    if (s->cfg.output_mode == RP_OUTPUT_ALL) {
        *res = (rp_result){3, {D, R, GA}, D * R * GA, s->all};
        return RP_OK;
    }
    for (int c = 0; c < R; c++) {
        if (s->cfg.output_mode == RP_OUTPUT_SUM) {
            double sum = 0;
            for (int d = 0; d < D; d++)
                for (int mb = 0; mb < GA; mb++)
                    sum += s->all[((size_t)d * R + c) * GA + mb];
            s->reduced[c] = (float)sum;
        } else { /* final, and default for training */
            s->reduced[c] = s->all[((size_t)(D - 1) * R + c) * GA + GA - 1];
        }
    }
    *res = (rp_result){1, {R}, R, s->reduced};
    return RP_OK;
}

