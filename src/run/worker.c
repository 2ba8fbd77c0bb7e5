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

void rpi_ep_alltoall(void *arg, const float *in, size_t n, float *out) {
    worker *w = arg;
    if (w->tp_status)
        return;
    double t0 = w->s->tracing ? rp_now() : 0;
    w->tp_status = rp_comm_alltoall(w->ep, NULL, in, n, out, &w->err);
    tp_traced(w, RPI_TRACE_EP_ALLTOALL, t0);
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

/* What every operation of a worker's list reads: its update, its rows of
** the call's data, the message's peer and tag, the step's context. */
typedef struct op_env {
    const rp_op *op;
    int i, d;
    bool last, half; /* the last stage; messages in fp16 */
    size_t in, out, n; /* floats a sample in and out; the net's parameters */
    size_t row;        /* the micro-batch's first row of the call's samples */
    int peer, tag;
    rp_step_ctx ctx;
} op_env;

/* Receives a micro-batch's activations straight into the slot the forward
** will use. */
static rp_status recv_act(worker *w, const op_env *e) {
    int B = w->s->B;
    float *dst = rp_acts_input(w->acts[w->plan->ops[e->i + 1].slot]);
    if (!e->half)
        return rp_comm_recv(w->comm, e->peer, e->tag, dst, sizeof(float) * e->in * B, &w->err);
    rp_status st = rp_comm_recv(w->comm, e->peer, e->tag, w->h_recv,
                                sizeof(uint16_t) * e->in * B, &w->err);
    if (!st)
        rp_half_decode(w->h_recv, dst, e->in * B);
    return st;
}

/* A forward on the version of the weights the micro-batch's backward will
** use (PipeDream's stash, vertical sync's history); the first stage reads
** the call's data, the last keeps the loss. */
static rp_status forward(worker *w, op_env *e) {
    rp_session *s = w->s;
    const rp_op *op = e->op;
    int B = s->B;
    size_t n = e->n;
    rp_acts *a = w->acts[op->slot];
    if (w->history) /* vertical sync: the input stage's version, kept */
        w->slot_ver[op->slot] = w->history + (size_t)w->version_of[op->mb] * n;
    else if (w->stash) { /* the version this micro-batch's backward will use */
        memcpy(w->stash + (size_t)op->slot * n, rp_net_params(w->net), sizeof(float) * n);
        w->slot_ver[op->slot] = w->stash + (size_t)op->slot * n;
    }
    if (w->history)
        rp_net_use_params(w->net, (float *)w->slot_ver[op->slot]);
    const float *x = rp_acts_input(a);
    if (w->stage == 0 && s->x)
        x = s->x + e->row * rp_shape_size(&s->m->input);
    else if (w->stage == 0) /* straight into the activations: no second copy */
        rp_dataset_gather(s->data, s->ids + e->row, B, rp_acts_input(a), NULL);
    double loss;
    const float *y = rp_net_forward(w->net, a, x, B, &e->ctx, e->last ? &loss : NULL);
    if (!y)
        return rp_fail(&w->err, RP_ERR_INVALID, "replica %d, stage %d: %s", w->replica,
                       w->stage, rp_net_error(w->net));
    if (w->history)
        rp_net_use_params(w->net, w->own);
    w->out[op->slot] = y;
    if (e->last)
        w->losses[(size_t)e->d * s->GA + op->mb] = (float)(loss / B);
    return RP_OK;
}

/* Sends the forward's output (in fp16 where asked). */
static rp_status send_act(worker *w, const op_env *e) {
    const rp_op *op = e->op;
    size_t count = e->out * w->s->B, bytes = sizeof(float) * count;
    const void *src = w->out[w->plan->ops[e->i - 1].slot];
    if (e->half) {
        uint16_t *h = w->h_act + (size_t)op->mb * count;
        rp_half_encode(src, h, count);
        src = h, bytes /= 2;
    }
    rp_status st = rp_comm_isend(w->comm, e->peer, e->tag, src, bytes, &w->req[op->mb], &w->err);
    w->req_live[op->mb] = !st;
    return st;
}

/* Receives the output's gradient; where a split backward's input half is
** next, straight into the stash its weights' half reads, which saves it a
** copy. */
static rp_status recv_grad(worker *w, const op_env *e) {
    const rp_op *op = e->op;
    size_t count = e->out * w->s->B;
    const rp_op *next = e->i + 1 < w->plan->num_ops ? &w->plan->ops[e->i + 1] : NULL;
    float *home = next && next->kind == RP_OP_BACKWARD_INPUT && next->mb == op->mb
                      ? rp_net_grad_in_place(w->net, w->acts[next->slot])
                      : NULL;
    w->grad_at = home ? home : w->grad_in;
    if (!e->half)
        return rp_comm_recv(w->comm, e->peer, e->tag + 1, w->grad_at, sizeof(float) * count,
                            &w->err);
    rp_status st = rp_comm_recv(w->comm, e->peer, e->tag + 1, w->h_recv,
                                sizeof(uint16_t) * count, &w->err);
    if (!st)
        rp_half_decode(w->h_recv, w->grad_at, count);
    return st;
}

/* A backward, whole or one of its halves, on the micro-batch's version of
** the weights; the last backward of the list starts the buckets. The
** input's gradient is kept for its send (in fp16 where asked). */
static void backward(worker *w, op_env *e) {
    const rp_op *op = e->op;
    size_t count = e->in * w->s->B;
    bool weights = op->kind == RP_OP_BACKWARD_WEIGHT;
    float *own = w->slot_ver && !weights
                     ? rp_net_use_params(w->net, (float *)w->slot_ver[op->slot])
                     : NULL;
    if (e->i == w->last_back)
        rpi_bucket_begin(w), e->ctx.grads_done = rpi_bucket_ready, e->ctx.grads_arg = w;
    if (weights) {
        rp_net_backward_weight(w->net, w->acts[op->slot], &e->ctx);
        return;
    }
    const float *din = (op->kind == RP_OP_BACKWARD ? rp_net_backward : rp_net_backward_input)(
        w->net, w->acts[op->slot], e->last ? NULL : w->grad_at, &e->ctx, w->stage > 0);
    if (own)
        rp_net_use_params(w->net, own);
    if (w->stage > 0 && e->half)
        rp_half_encode(din, w->h_grad + (size_t)op->mb * count, count);
    else if (w->stage > 0)
        memcpy(w->grad_out + (size_t)op->mb * count, din, sizeof(float) * count);
}

/* Sends the input's gradient. */
static rp_status send_grad(worker *w, const op_env *e) {
    const rp_op *op = e->op;
    int GA = w->s->GA;
    size_t count = e->in * w->s->B, bytes = sizeof(float) * count;
    const void *src = w->grad_out + (size_t)op->mb * count;
    if (e->half)
        src = w->h_grad + (size_t)op->mb * count, bytes /= 2;
    rp_status st = rp_comm_isend(w->comm, e->peer, e->tag + 1, src, bytes, &w->req[GA + op->mb],
                                 &w->err);
    w->req_live[GA + op->mb] = !st;
    return st;
}

/* The optimizer's step, after the device's verdicts where it gives them;
** 2BW's older version becomes this one. One run's state arrays are the
** net's; several (groupings, tensor-parallel slices beside whole
** variables) have a state of their own each, as the training state reads
** it. */
static rp_status step(worker *w, const op_env *e) {
    size_t n = e->n;
    rp_status st = rpi_verdict_at_step(w->s) ? rpi_step_verdict(w, e->ctx.update) : RP_OK;
    if (st)
        return st;
    if (w->stale)
        rp_net_use_params(w->net, w->own);
    if (w->skip)
        return RP_OK;
    if (w->stale)
        memcpy(w->stale, w->own, sizeof(float) * n);
    if (!w->any_sharded && !w->any_fused && w->state_fd < 0 && w->nruns <= 1) {
        rp_optimizer_step(&w->opt_now, w->applied, rp_net_params(w->net), rp_net_grads(w->net),
                          w->opt, n);
        return RP_OK;
    }
    for (int r = 0; r < w->nruns && !st; r++) { /* the others stepped in the reduction */
        const var_run *vr = &w->runs[r];
        if (!vr->sharded && !vr->fused)
            st = rpi_opt_step(w, w->applied, rp_net_params(w->net) + vr->offset,
                              rp_net_grads(w->net) + vr->offset, vr->state_offset, vr->count);
    }
    return st;
}

/* Waits for every send still under way. */
static rp_status wait_sends(worker *w) {
    rp_status st = RP_OK;
    for (int r = 0; r < 2 * w->s->GA && !st; r++)
        if (w->req_live[r]) {
            w->req_live[r] = false;
            st = rp_comm_wait(w->comm, &w->req[r], &w->err);
        }
    return st;
}

/* After a step, failed or not: batchnorm's running statistics over what
** it did to them; under PipeDream the next backward's gradients a new
** update's; vertical sync keeps every version. */
static void after_step(worker *w, bool stats, size_t n) {
    if (stats)
        rp_net_running_commit(w->net);
    if (w->slot_ver)
        rp_net_zero_grads(w->net);
    if (w->history)
        memcpy(w->history + (size_t)++w->versions * n, w->own, sizeof(float) * n);
}

/* Operation i of update d as its functions read it. */
static op_env env_of(worker *w, int d, int i) {
    rp_session *s = w->s;
    int B = s->B, GA = s->GA, c = w->replica;
    size_t S = (size_t)B * GA * s->R, K = (size_t)s->m->num_targets; /* labels per sample */
    const rp_op *op = &w->plan->ops[i];
    size_t row = op->mb >= 0 ? d * S + ((size_t)c * GA + op->mb) * B : 0;
    /* a message's tag: its micro-batch, and where a rank holds a device's
    ** chunks, which of them it goes to (two may hear from one rank) */
    bool sends = op->kind == RP_OP_SEND_ACT || op->kind == RP_OP_SEND_GRAD;
    bool talks = sends || op->kind == RP_OP_RECV_ACT || op->kind == RP_OP_RECV_GRAD;
    return (op_env){
        .op = op, .i = i, .d = d,
        .last = w->stage == s->P - 1, .half = s->cfg.fp16_exchange,
        .in = rp_net_in_size(w->net), .out = rp_net_out_size(w->net),
        .n = rp_net_num_params(w->net), .row = row,
        .peer = talks ? rpi_rank_of(s, op->peer) : -1,
        .tag = ((talks && s->lidx ? s->lidx[sends ? op->peer : w->id] * GA : 0) + op->mb) * 2,
        .ctx = {.training = true,
                .seed = s->cfg.seed,
                .update = (uint64_t)(s->updates + d),
                .sample_id = s->ids + row,
                .labels = s->y + row * K,
                .loss_scale = s->loss_scale * w->scale,
                .embedding_blocks = s->cfg.embedding_serialization_factor,
                .stat_slot = op->mb >= 0 ? 1 + c * GA + op->mb : 0}};
}

/* Operation i of worker w's list in update d; false when it failed (its
** status and message say why). */
static bool run_op(worker *w, int d, int i) {
    rp_session *s = w->s;
    size_t nstats;
    float *stats = rp_net_stats(w->net, &nstats);
    const rp_op *op = &w->plan->ops[i];
    op_env e = env_of(w, d, i);
    double t0 = s->tracing ? rp_now() : 0;
    rp_status st = RP_OK;
    w->tp_op = op;
    switch (op->kind) {
    case RP_OP_RECV_ACT: st = recv_act(w, &e); break;
    case RP_OP_FORWARD: st = forward(w, &e); break;
    case RP_OP_SEND_ACT: st = send_act(w, &e); break;
    case RP_OP_RECV_GRAD: st = recv_grad(w, &e); break;
    case RP_OP_BACKWARD_WEIGHT:
    case RP_OP_BACKWARD_INPUT:
    case RP_OP_BACKWARD: backward(w, &e); break;
    case RP_OP_SEND_GRAD: st = send_grad(w, &e); break;
    case RP_OP_WAIT_SENDS: st = wait_sends(w); break;
    case RP_OP_REDUCE:
        if (stats && !(st = rpi_reduce_stats(w)))
            rp_net_running_next(w->net);
        if (!st)
            st = rpi_reduce(w);
        break;
    case RP_OP_STEP:
        st = step(w, &e);
        after_step(w, stats != NULL, e.n);
        break;
    }
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
