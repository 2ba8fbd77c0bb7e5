/*
** One worker's part of a host call: the operation list its schedule gives it
** (docs/pipelines.md), played D times for a call of device_iterations D.
** Forwards and backwards run on the worker's net, sends and receives move a
** micro-batch's activations and gradients (tagged by its number) between
** stages, and REDUCE and STEP hand over to exchange.c. Every op is timed
** into the worker's trace when the session traces.
**
** On the local backend every worker but worker 0 is a thread parked in
** rpi_worker_thread until the next call; worker 0 is the calling thread.
*/
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../core/util.h"
#include "session_impl.h"

/* Threads of this process wake each other; under MPI the caller reports
** the error and calls rp_comm_fail, which ends the job (the other ranks are
** waiting). */
static void worker_fail(worker *w, rp_status st, const char *msg) {
    w->status = st;
    if (msg != w->err.msg)
        rp_fail(&w->err, st, "%s", msg);
    if (w->s->backend == RP_BACKEND_LOCAL)
        rp_comm_fail(w->comm, w->err.msg);
}

/* A communication error: the first worker to see one reports it. */
static bool comm_failed(worker *w, rp_status st) {
    if (!st)
        return false;
    w->status = st;
    if (st != RP_ERR_ABORTED)
        worker_fail(w, st, w->err.msg);
    return true;
}

/* A collective of the tensor group, traced as `kind` in w->tp_op. */
static void tp_traced(worker *w, int kind, double t0) {
    if (!w->s->tracing)
        return;
    if (w->ntrace < w->trace_cap)
        w->trace[w->ntrace++] = (trace_event){kind, w->tp_op->mb, t0, rp_now()};
    else
        w->trace_dropped++;
}

/* Tensor parallelism: a net's all-reduce over the tensor group, in the
** operation w->tp_op; after a failure the others are skipped (the
** operation then fails with it). */
void rpi_tp_allreduce(void *arg, float *buf, size_t n) {
    worker *w = arg;
    if (w->tp_status)
        return;
    double t0 = w->s->tracing ? rp_now() : 0;
    w->tp_status = rp_comm_allreduce(w->tp, NULL, buf, n, &w->err);
    tp_traced(w, w->tp_op->kind == RP_OP_FORWARD ? RPI_TRACE_TP_FORWARD : RPI_TRACE_TP_BACKWARD,
              t0);
}

/* ...and its all-gather, the same way. */
void rpi_tp_allgather(void *arg, const float *in, size_t n, float *out) {
    worker *w = arg;
    if (w->tp_status)
        return;
    double t0 = w->s->tracing ? rp_now() : 0;
    w->tp_status = rp_comm_allgather(w->tp, NULL, in, n, out, &w->err);
    tp_traced(w, RPI_TRACE_TP_GATHER, t0);
}

/* A worker's update d begins: its gradients zeroed, its statistics'
** slots, the version its passes use, the update's learning rate. */
static void update_begin(worker *w, int d) {
    rp_session *s = w->s;
    size_t n = rp_net_num_params(w->net), nstats;
    rp_net_zero_grads(w->net);
    float *stats = rp_net_stats(w->net, &nstats);
    if (stats) /* batchnorm: this update's slots, filled by the forwards */
        memset(stats, 0, sizeof(float) * nstats);
    if (w->stale) /* 2BW: this update's passes run on the older version */
        rp_net_use_params(w->net, w->stale);
    if (w->history) { /* vertical sync: version 0 of the call */
        memcpy(w->history, w->own, sizeof(float) * n);
        w->versions = 0;
    }
    w->opt_now = s->cfg.optimizer; /* this update's learning rate */
    w->opt_now.lr = rp_config_lr(&s->cfg, s->updates + d);
}

/* Operation i of worker w's list in update d; false when it failed (its
** status and message say why). */
static bool run_op(worker *w, int d, int i) {
    rp_session *s = w->s;
    int B = s->B, GA = s->GA, c = w->replica;
    bool last = w->stage == s->P - 1;
    size_t in = rp_net_in_size(w->net), out = rp_net_out_size(w->net);
    size_t n = rp_net_num_params(w->net), nstats;
    size_t S = (size_t)B * GA * s->R, data_in = rp_shape_size(&s->m->input);
    size_t K = (size_t)s->m->num_targets; /* labels per sample */
    bool half = s->cfg.fp16_exchange;
    float *stats = rp_net_stats(w->net, &nstats);
    const rp_op *op = &w->plan->ops[i];
    size_t row = op->mb >= 0 ? d * S + ((size_t)c * GA + op->mb) * B : 0;
    /* a message's tag: its micro-batch, and where a rank holds a device's
    ** chunks, which of them it goes to (two may hear from one rank) */
    bool sends = op->kind == RP_OP_SEND_ACT || op->kind == RP_OP_SEND_GRAD;
    bool talks = sends || op->kind == RP_OP_RECV_ACT || op->kind == RP_OP_RECV_GRAD;
    int peer = talks ? rpi_rank_of(s, op->peer) : -1;
    int tag = ((talks && s->lidx ? s->lidx[sends ? op->peer : w->id] * GA : 0) + op->mb) * 2;
    rp_step_ctx ctx = {.training = true,
                       .seed = s->cfg.seed,
                       .update = (uint64_t)(s->updates + d),
                       .sample_id = s->ids + row,
                       .labels = s->y + row * K,
                       .loss_scale = s->loss_scale * w->scale,
                       .embedding_blocks = s->cfg.embedding_serialization_factor,
                       .stat_slot = op->mb >= 0 ? 1 + c * GA + op->mb : 0};
    double t0 = s->tracing ? rp_now() : 0;
    rp_status st = RP_OK;
    w->tp_op = op;
    switch (op->kind) {
    case RP_OP_RECV_ACT: { /* straight into the slot the forward will use */
        float *dst = rp_acts_input(w->acts[w->plan->ops[i + 1].slot]);
        if (!half) {
            st = rp_comm_recv(w->comm, peer, tag, dst, sizeof(float) * in * B, &w->err);
        } else if (!(st = rp_comm_recv(w->comm, peer, tag, w->h_recv,
                                       sizeof(uint16_t) * in * B, &w->err))) {
            rp_half_decode(w->h_recv, dst, in * B);
        }
        break;
    }
    case RP_OP_FORWARD: {
        rp_acts *a = w->acts[op->slot];
        if (w->history) /* vertical sync: the input stage's version, kept */
            w->slot_ver[op->slot] = w->history + (size_t)w->version_of[op->mb] * n;
        else if (w->stash) { /* the version this micro-batch's backward will use */
            memcpy(w->stash + (size_t)op->slot * n, rp_net_params(w->net),
                   sizeof(float) * n);
            w->slot_ver[op->slot] = w->stash + (size_t)op->slot * n;
        }
        if (w->history)
            rp_net_use_params(w->net, (float *)w->slot_ver[op->slot]);
        const float *x = rp_acts_input(a);
        if (w->stage == 0 && s->x)
            x = s->x + row * data_in;
        else if (w->stage == 0) /* straight into the activations: no second copy */
            rp_dataset_gather(s->data, s->ids + row, B, rp_acts_input(a), NULL);
        double loss;
        const float *y = rp_net_forward(w->net, a, x, B, &ctx, last ? &loss : NULL);
        if (!y) {
            char msg[RP_ERROR_MAX];
            snprintf(msg, sizeof msg, "replica %d, stage %d: %s", c, w->stage,
                     rp_net_error(w->net));
            worker_fail(w, RP_ERR_INVALID, msg);
            return false;
        }
        if (w->history)
            rp_net_use_params(w->net, w->own);
        w->out[op->slot] = y;
        if (last)
            w->losses[(size_t)d * GA + op->mb] = (float)(loss / B);
        break;
    }
    case RP_OP_SEND_ACT: {
        const void *src = w->out[w->plan->ops[i - 1].slot];
        size_t bytes = sizeof(float) * out * B;
        if (half) {
            uint16_t *h = w->h_act + (size_t)op->mb * out * B;
            rp_half_encode(src, h, out * B);
            src = h, bytes /= 2;
        }
        st = rp_comm_isend(w->comm, peer, tag, src, bytes, &w->req[op->mb], &w->err);
        w->req_live[op->mb] = !st;
        break;
    }
    case RP_OP_RECV_GRAD: {
        /* a split backward's input half next: straight into the stash its
        ** weights' half reads, which saves it a copy */
        const rp_op *next = i + 1 < w->plan->num_ops ? &w->plan->ops[i + 1] : NULL;
        float *home = next && next->kind == RP_OP_BACKWARD_INPUT && next->mb == op->mb
                          ? rp_net_grad_in_place(w->net, w->acts[next->slot])
                          : NULL;
        w->grad_at = home ? home : w->grad_in;
        if (!half) {
            st = rp_comm_recv(w->comm, peer, tag + 1, w->grad_at,
                              sizeof(float) * out * B, &w->err);
        } else if (!(st = rp_comm_recv(w->comm, peer, tag + 1, w->h_recv,
                                       sizeof(uint16_t) * out * B, &w->err))) {
            rp_half_decode(w->h_recv, w->grad_at, out * B);
        }
        break;
    }
    case RP_OP_BACKWARD_WEIGHT:
        if (i == w->last_back)
            rpi_bucket_begin(w), ctx.grads_done = rpi_bucket_ready, ctx.grads_arg = w;
        rp_net_backward_weight(w->net, w->acts[op->slot], &ctx);
        break;
    case RP_OP_BACKWARD_INPUT:
    case RP_OP_BACKWARD: {
        float *own = w->slot_ver ? rp_net_use_params(w->net, (float *)w->slot_ver[op->slot])
                                 : NULL;
        if (i == w->last_back)
            rpi_bucket_begin(w), ctx.grads_done = rpi_bucket_ready, ctx.grads_arg = w;
        const float *din =
            (op->kind == RP_OP_BACKWARD ? rp_net_backward : rp_net_backward_input)(
                w->net, w->acts[op->slot], last ? NULL : w->grad_at, &ctx, w->stage > 0);
        if (own)
            rp_net_use_params(w->net, own);
        if (w->stage > 0 && half)
            rp_half_encode(din, w->h_grad + (size_t)op->mb * in * B, in * B);
        else if (w->stage > 0)
            memcpy(w->grad_out + (size_t)op->mb * in * B, din, sizeof(float) * in * B);
        break;
    }
    case RP_OP_SEND_GRAD: {
        const void *src = w->grad_out + (size_t)op->mb * in * B;
        size_t bytes = sizeof(float) * in * B;
        if (half)
            src = w->h_grad + (size_t)op->mb * in * B, bytes /= 2;
        st = rp_comm_isend(w->comm, peer, tag + 1, src, bytes, &w->req[GA + op->mb],
                           &w->err);
        w->req_live[GA + op->mb] = !st;
        break;
    }
    case RP_OP_WAIT_SENDS:
        for (int r = 0; r < 2 * GA && !st; r++)
            if (w->req_live[r]) {
                w->req_live[r] = false;
                st = rp_comm_wait(w->comm, &w->req[r], &w->err);
            }
        break;
    case RP_OP_REDUCE:
        if (stats && !(st = rpi_reduce_stats(w)))
            rp_net_running_next(w->net);
        if (!st)
            st = rpi_reduce(w);
        break;
    case RP_OP_STEP:
        if (rpi_verdict_at_step(s) && (st = rpi_step_verdict(w, ctx.update)))
            break;
        if (w->stale) /* 2BW: the older version becomes this one; this one steps */
            rp_net_use_params(w->net, w->own);
        if (w->skip)
            break;
        if (w->stale)
            memcpy(w->stale, w->own, sizeof(float) * n);
        /* one run: its state arrays are the net's; several (groupings,
        ** tensor-parallel slices beside whole variables) have a state of
        ** their own each, as the training state reads it */
        if (!w->any_sharded && !w->any_fused && w->state_fd < 0 && w->nruns <= 1) {
            rp_optimizer_step(&w->opt_now, w->applied, rp_net_params(w->net),
                              rp_net_grads(w->net), w->opt, n);
            break;
        }
        for (int r = 0; r < w->nruns && !st; r++) { /* the others stepped above */
            const var_run *vr = &w->runs[r];
            if (!vr->sharded && !vr->fused)
                st = rpi_opt_step(w, w->applied, rp_net_params(w->net) + vr->offset,
                              rp_net_grads(w->net) + vr->offset, vr->state_offset,
                              vr->count);
        }
        break;
    }
    if (op->kind == RP_OP_STEP && stats) /* over what the step did to them */
        rp_net_running_commit(w->net);
    if (op->kind == RP_OP_STEP && w->slot_ver) /* the next backward: a new update */
        rp_net_zero_grads(w->net);
    if (op->kind == RP_OP_STEP && w->history) /* vertical sync keeps every version */
        memcpy(w->history + (size_t)++w->versions * n, w->own, sizeof(float) * n);
    if (!st && w->tp_status)
        st = w->tp_status;
    if (!st && i == w->last_back)
        st = w->bucket_status;
    if (comm_failed(w, st))
        return false;
    if (s->tracing && w->ntrace < w->trace_cap)
        w->trace[w->ntrace++] = (trace_event){op->kind, op->mb, t0, rp_now()};
    else if (s->tracing)
        w->trace_dropped++;
    return true;
}

/* A device (the chunked schedules) runs its workers' operations in its
** order: on a thread of the local backend, or as an MPI rank. */
static void device_run(rp_session *s, const rp_device_ops *dv) {
    for (int j = 0; j < dv->num; j++) {
        worker *x = rpi_worker_of(s, dv->worker[j]);
        x->status = RP_OK;
        x->tp_status = RP_OK;
    }
    for (int d = 0; d < s->D; d++) {
        for (int j = 0; j < dv->num; j++)
            if (dv->op[j] == 0)
                update_begin(rpi_worker_of(s, dv->worker[j]), d);
        for (int j = 0; j < dv->num; j++)
            if (!run_op(rpi_worker_of(s, dv->worker[j]), d, dv->op[j]))
                return;
    }
}

void rpi_worker_run(worker *w) {
    rp_session *s = w->s;
    if (s->plan->devices) {
        device_run(s, &s->plan->dev[s->plan->device_of[w->id]]);
        return;
    }
    w->status = RP_OK;
    w->tp_status = RP_OK;
    for (int d = 0; d < s->D; d++) {
        update_begin(w, d);
        for (int i = 0; i < w->plan->num_ops; i++)
            if (!run_op(w, d, i))
                return;
    }
}

void *rpi_worker_thread(void *arg) {
    worker *w = arg;
    rp_session *s = w->s;
    rp_fpu_fast_denormals();
    unsigned long seen = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->spin && s->gen == seen && !s->quit) { /* the next call often comes at once */
            pthread_mutex_unlock(&s->mu);
            for (int i = 0; i < RP_SPIN_LIMIT && __atomic_load_n(&s->gen, __ATOMIC_ACQUIRE) == seen;
                 i++)
                rp_cpu_relax();
            pthread_mutex_lock(&s->mu);
        }
        while (s->gen == seen && !s->quit)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->quit)
            break;
        seen = s->gen;
        pthread_mutex_unlock(&s->mu);
        rpi_worker_run(w);
        pthread_mutex_lock(&s->mu);
        __atomic_store_n(&s->done, s->done + 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}
