/*
** A worker's gradient exchange and optimizer step: loss scaling, the
** reduction of each run of variables within its group (allreduce, fp16,
** reduce-scatter and all-gather when sharded, or summed and updated at once
** when fused), and the step on state in memory or streamed from a file.
*/
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "../core/util.h"
#include "session_impl.h"

/* ---- loss scaling ----------------------------------------------------------- */

/* The loss is multiplied by a power of two `scale` before backward, so
** gradients that would underflow, or overflow fp16 on their way between
** stages, stay representable. The reduced gradients are divided by it
** again (exactly: a power of two) before the update. With
** auto_loss_scaling, an update whose gradients hold an inf or a NaN
** anywhere in the world is skipped by every worker and the scale halved;
** loss_scaling_growth_interval clean updates in a row double it. */
#define MIN_SCALE 0x1p-24
#define MAX_SCALE 0x1p100

static bool all_finite(const float *x, size_t n) {
    float acc = 0; /* inf and NaN survive x * 0: one test at the end */
    for (size_t i = 0; i < n; i++)
        acc += x[i] * 0.0f;
    return acc == 0.0f;
}

static void next_scale(worker *w, const rp_config *cfg) {
    if (w->skip) {
        w->skipped++;
        w->scale = w->scale / 2 < MIN_SCALE ? MIN_SCALE : w->scale / 2;
        w->clean = 0;
    } else if (++w->clean >= cfg->loss_scaling_growth_interval) {
        w->scale = w->scale * 2 > MAX_SCALE ? MAX_SCALE : w->scale * 2;
        w->clean = 0;
    }
}

rp_status rpi_pio(int fd, void *buf, size_t bytes, off_t at, bool write_it) {
    unsigned char *p = buf;
    while (bytes) {
        ssize_t k = write_it ? pwrite(fd, p, bytes, at) : pread(fd, p, bytes, at);
        if (k <= 0)
            return RP_ERR_IO;
        p += k, at += k, bytes -= (size_t)k;
    }
    return RP_OK;
}

/* One optimizer step of `count` parameters whose state starts at
** state_offset (the state of a run: `per` arrays of count floats). Offchip,
** the state is streamed through the chunk buffer: read, step, write back. */
rp_status rpi_opt_step(worker *w, long long step, float *p, const float *g, size_t state_offset,
                          size_t count) {
    rp_session *s = w->s;
    if (w->state_fd < 0) {
        rp_optimizer_step(&w->opt_now, step, p, g, w->opt + state_offset, count);
        return RP_OK;
    }
    size_t per = s->state_per_param;
    for (size_t at = 0; at < count; at += RP_OFFCHIP_CHUNK) {
        size_t n = count - at < RP_OFFCHIP_CHUNK ? count - at : RP_OFFCHIP_CHUNK;
        for (size_t a = 0; a < per; a++) /* array a of the run, elements [at, at + n) */
            if (rpi_pio(w->state_fd, w->chunk + a * n, sizeof(float) * n,
                    (off_t)(sizeof(float) * (state_offset + a * count + at)), false))
                return rp_fail(&w->err, RP_ERR_IO, "offchip optimizer state: read failed");
        rp_optimizer_step(&w->opt_now, step, p + at, g + at, w->chunk, n);
        for (size_t a = 0; a < per; a++)
            if (rpi_pio(w->state_fd, w->chunk + a * n, sizeof(float) * n,
                    (off_t)(sizeof(float) * (state_offset + a * count + at)), true))
                return rp_fail(&w->err, RP_ERR_IO, "offchip optimizer state: write failed");
    }
    return RP_OK;
}

/* A fused run's update of one piece of this member's share. A sharded
** run's state is its shard's, laid out as the reduce-scatter path lays it
** out: arrays of the shard's length. */
typedef struct fused_update {
    worker *w;
    const var_run *vr;
    float f;            /* the group's rescale over the loss scale */
    size_t first, have; /* the shard: where it starts, its length */
} fused_update;

static void apply_update(void *ctx, size_t at, float *sum, size_t len) {
    const fused_update *u = ctx;
    worker *w = u->w;
    if (u->f != 1.0f)
        for (size_t e = 0; e < len; e++)
            sum[e] *= u->f;
    float *state = u->vr->sharded ? w->opt + u->vr->state_offset + (at - u->first) : NULL;
    rp_optimizer_step_at(&w->opt_now, w->applied,
                         rp_net_params(w->net) + u->vr->offset + at, sum, state, u->have, len);
}

/* A variable's reduced gradient in this worker's buffer, or NULL when its
** layer lies on another stage. */
static float *var_grad(worker *w, int v) {
    const rp_session *s = w->s;
    const rp_variable *var = &w->lm->vars[v];
    int l0 = s->first[w->stage], l1 = s->first[w->stage + 1];
    if (var->layer < l0 || var->layer >= l1)
        return NULL;
    return rp_net_grads(w->net) + (var->offset - w->lm->layers[l0].param_offset);
}

/* Tied weights: both copies take the sum of their reduced gradients, so
** they stay equal, as one tensor used twice would. On one stage the sum is
** local; across stages every worker joins one sum of the world in which only
** the first worker of each of the two stages puts in its gradient (the
** others, zeros): the result is that one addition, whatever the order. Split
** by vocabulary (tensor parallelism), the sum is of whole tables, in which
** each rank of those two workers' tensor groups puts its rows, the same rows
** in both copies. */
static rp_status tie_sum(worker *w) {
    rp_session *s = w->s;
    rp_status st = RP_OK;
    for (int i = 0; i < s->nties && !st; i++) {
        const tie *t = &s->ties[i];
        const rp_variable *v = &w->lm->vars[t->emb_var];
        size_t n = v->count;
        float *ge = var_grad(w, t->emb_var), *gh = var_grad(w, t->head_var);
        if (t->emb_stage == t->head_stage) {
            for (size_t e = 0; ge && e < n; e++)
                gh[e] = ge[e] = ge[e] + gh[e];
            continue;
        }
        if (s->plan->devices) {
            /* zb-v's V puts both copies on one device: its second reduction
            ** sums them, for both (every replica's device alike: their
            ** halves are the replicas' sums; a tensor rank's two copies
            ** split by vocabulary hold the same rows). DualPipe's device
            ** holds one copy of each replica of a pair, equal after the
            ** replicas' sums, and adds them alike. */
            const rp_config *cfg = &s->cfg;
            int ostage = w->stage == t->emb_stage ? t->head_stage : t->emb_stage;
            int oc = rp_config_paired(cfg) ? w->replica ^ 1 : w->replica;
            int other = w->stage_replica < rp_config_stage_replicas(cfg, ostage)
                            ? rp_workplan_worker(cfg, oc, ostage, w->stage_replica) +
                                  w->tensor_rank
                            : -1; /* (a stage replicated more than the other: another device) */
            if (other >= 0 && s->plan->device_of[other] == s->plan->device_of[w->id]) {
                worker *o = rpi_worker_of(s, other);
                if (!o->tie_half[i]) {
                    w->tie_half[i] = true;
                    continue;
                }
                o->tie_half[i] = false;
                float *e = ge ? ge : var_grad(o, t->emb_var), *h = gh ? gh : var_grad(o, t->head_var);
                for (size_t k = 0; k < n; k++)
                    e[k] = h[k] = e[k] + h[k];
                continue;
            }
        }
        /* a device's workers sum over the tie's own (none where this is not
        ** one of them); else every worker, those of other stages with zeros */
        rp_comm *c = s->plan->devices ? w->tie_comm[i] : w->comm;
        if (!c)
            continue;
        if (!v->split) {
            float *buf = ge ? ge : gh ? gh : w->tie_buf;
            if (w->id != t->emb_rep && w->id != t->head_rep)
                memset(buf, 0, sizeof(float) * n);
            st = rp_comm_allreduce(c, NULL, buf, n, &w->err);
            continue;
        }
        int group = w->id - w->tensor_rank; /* rank 0 of the worker's tensor group */
        bool speaks = group == t->emb_rep || group == t->head_rep;
        const rp_layer *E = &w->lm->layers[v->layer];
        size_t whole = s->m->vars[t->emb_var].count, at = (size_t)E->tp_vocab_first * E->dim;
        float *mine = ge ? ge : gh;
        memset(w->tie_buf, 0, sizeof(float) * whole);
        if (speaks)
            memcpy(w->tie_buf + at, mine, sizeof(float) * n);
        st = rp_comm_allreduce(c, NULL, w->tie_buf, whole, &w->err);
        if (mine)
            memcpy(mine, w->tie_buf + at, sizeof(float) * n);
    }
    return st;
}

/* Gradient clipping: every worker scales its reduced gradients by
** min(1, C / (norm + 1e-6)), norm the L2 norm over every variable of every
** stage and replica group. Each group's copy of a run counts once: its
** shards, or for an unsharded run the first member of its reduction. A
** tensor group's ranks each count their slices of its split variables, and
** rank 0 alone the whole ones. This is the worker's part of the squares. */
static float norm_part(const worker *w) {
    const rp_session *s = w->s;
    const float *g = rp_net_grads(w->net);
    double sum = 0;
    for (int r = 0; r < w->nruns; r++) {
        const var_run *vr = &w->runs[r];
        const float *x = vr->sharded ? w->shard_g + vr->shard_offset : g + vr->offset;
        size_t k = vr->sharded ? vr->shard : vr->count;
        if (vr->tp_whole && w->tensor_rank != 0)
            continue;
        if (vr->sharded) { /* the shard's padding past the run holds nothing */
            size_t first = (size_t)rp_comm_rank(w->reduce[vr->grouping]) * vr->shard;
            k = first >= vr->count ? 0 : vr->count - first < k ? vr->count - first : k;
        } else if (rp_comm_rank(w->reduce[vr->grouping]) != 0) {
            continue;
        }
        for (size_t e = 0; e < k; e++)
            sum += (double)x[e] * x[e];
    }
    /* a tied weight is one tensor: its second copy does not count (a copy
    ** split by vocabulary is each rank's slice) */
    for (int i = 0; i < s->nties; i++) {
        if (w->tensor_rank != 0 && !w->lm->vars[s->ties[i].head_var].split)
            continue;
        const float *gh = var_grad((worker *)w, s->ties[i].head_var);
        size_t n = w->lm->vars[s->ties[i].head_var].count;
        size_t at = gh ? (size_t)(gh - g) : 0;
        for (int r = 0; gh && r < w->nruns; r++) {
            const var_run *vr = &w->runs[r];
            if (at >= vr->offset && at < vr->offset + vr->count &&
                rp_comm_rank(w->reduce[vr->grouping]) == 0)
                for (size_t e = 0; e < n; e++)
                    sum -= (double)gh[e] * gh[e];
        }
    }
    return (float)sum;
}

/* The workers' parts, one slot each, summed in worker order: the same
** bits whoever adds them up (threads, ranks, devices). */
static float sum_parts(const worker *w) {
    float total = 0;
    for (int k = 0; k < w->s->W; k++)
        total += w->parts[k];
    return total;
}

/* Scales the worker's reduced gradients by the clipping coefficient of
** the world's sum of squares. */
static void clip_scale(worker *w, float total) {
    float *g = rp_net_grads(w->net);
    w->grad_norm = sqrt((double)total);
    double coef = w->s->cfg.gradient_clipping / (w->grad_norm + 1e-6);
    if (coef >= 1)
        return;
    float f = (float)coef;
    for (int r = 0; r < w->nruns; r++) {
        const var_run *vr = &w->runs[r];
        float *x = vr->sharded ? w->shard_g + vr->shard_offset : g + vr->offset;
        size_t k = vr->sharded ? vr->shard : vr->count;
        for (size_t e = 0; e < k; e++)
            x[e] *= f;
    }
}

static rp_status clip(worker *w) {
    memset(w->parts, 0, sizeof(float) * w->s->W);
    w->parts[w->id] = norm_part(w);
    rp_status st = RP_OK;
    if (rp_comm_size(w->comm) > 1 &&
        (st = rp_comm_allreduce(w->comm, NULL, w->parts, (size_t)w->s->W, &w->err)))
        return st;
    clip_scale(w, sum_parts(w));
    return RP_OK;
}

/* Whether any of the worker's reduced gradients is not finite: 1 or 0. */
static float not_finite(const worker *w) {
    const float *g = rp_net_grads(w->net);
    for (int r = 0; r < w->nruns; r++) {
        const var_run *vr = &w->runs[r];
        bool ok = vr->sharded ? all_finite(w->shard_g + vr->shard_offset, vr->shard)
                              : all_finite(g + vr->offset, vr->count);
        if (!ok)
            return 1.0f;
    }
    return 0.0f;
}

/* Batchnorm's statistics slots of the update, summed over the workers that
** share each layer's variables (the group of its weight's run): each slot
** was filled by one of them, so the sum is that worker's values exactly. */
rp_status rpi_reduce_stats(worker *w) {
    const rp_session *s = w->s;
    size_t n, at = 0;
    float *stats = rp_net_stats(w->net, &n);
    int l0 = s->first[w->stage], l1 = s->first[w->stage + 1];
    size_t base = w->lm->layers[l0].param_offset;
    rp_status st = RP_OK;
    for (int l = l0; l < l1 && !st; l++) {
        const rp_layer *L = &w->lm->layers[l];
        if (L->type != RP_LAYER_BATCHNORM2D && L->type != RP_LAYER_BATCHNORM1D)
            continue;
        size_t k = (size_t)s->GA * s->R * (2 * L->in.dim[0] + 1), off = L->param_offset - base;
        for (int r = 0; r < w->nruns; r++) {
            const var_run *vr = &w->runs[r];
            rp_comm *rc = w->reduce[vr->grouping];
            if (off >= vr->offset && off < vr->offset + vr->count && rp_comm_size(rc) > 1)
                st = rp_comm_allreduce(rc, NULL, stats + at, k, &w->err);
        }
        at += k;
    }
    return st;
}

/* ---- reduction in buckets (reduction_bucket_mb) --------------------------------- */

/* A bucket sums a range of one run within the run's group, as the run's
** whole allreduce would: each element's sum is the same whatever range it
** travels in, so the buckets change when the bytes move, not the result.
** The worker's last backward announces its layers from the top down; the
** gradients from the announced layer's first parameter up are final, and
** every run's part above bucket_lo that holds a bucket's worth (or reaches
** the run's start) is started. REDUCE starts what is left and waits. */
static bool bucketed(const worker *w, const var_run *vr) {
    return w->last_back >= 0 && !vr->sharded && !vr->fused;
}

static void bucket_flush(worker *w, size_t lo, bool all) {
    while (w->bucket_lo > lo && !w->bucket_status) {
        const var_run *vr = NULL; /* the run holding the element below bucket_lo */
        size_t below = 0;         /* else the end of the highest run under it */
        for (int r = 0; r < w->nruns; r++) {
            const var_run *x = &w->runs[r];
            if (x->offset < w->bucket_lo && w->bucket_lo <= x->offset + x->count)
                vr = x;
            else if (x->offset + x->count < w->bucket_lo && x->offset + x->count > below)
                below = x->offset + x->count;
        }
        if (!vr) { /* a gap no run holds */
            w->bucket_lo = below > lo ? below : lo;
            continue;
        }
        size_t from = vr->offset > lo ? vr->offset : lo;
        if (!all && from > vr->offset && w->bucket_lo - from < w->bucket)
            return; /* too small yet: the layers below add to it */
        rp_comm *rc = w->reduce[vr->grouping];
        /* a range larger than a bucket (one large layer) goes as several,
        ** top first, each on its way as soon as it starts (and Open MPI's
        ** MPI_Iallreduce of 6.4 MB took twice its blocking one's time over
        ** TCP, of 1 MB pieces 1.1 x) */
        while (w->bucket_lo > from && !w->bucket_status) {
            size_t k = w->bucket_lo - from < w->bucket ? w->bucket_lo - from : w->bucket;
            if (bucketed(w, vr) && rp_comm_size(rc) > 1) {
                rp_request *q = &w->breq[w->nbreq];
                w->bstart[w->nbreq] = w->s->tracing ? rp_now() : 0;
                w->breq_comm[w->nbreq++] = rc;
                size_t at = w->bucket_lo - k;
                w->bucket_status =
                    rp_comm_iallreduce(rc, rp_net_grads(w->net) + at, k,
                                       w->bscratch ? w->bscratch + at : NULL, q, &w->err);
            }
            w->bucket_lo -= k;
        }
    }
}

/* Bucket k is seen done: its event on the trace. */
static void bucket_traced(worker *w, int k) {
    if (!w->s->tracing)
        return;
    if (w->ntrace < w->trace_cap)
        w->trace[w->ntrace++] = (trace_event){RPI_TRACE_BUCKET, k, w->bstart[k], rp_now()};
    else
        w->trace_dropped++;
}

/* The update's last backward begins: nothing summing yet. */
void rpi_bucket_begin(worker *w) {
    w->bucket_lo = rp_net_num_params(w->net);
    w->nbreq = w->bdone = 0;
    w->bucket_status = RP_OK;
}

/* rp_step_ctx.grads_done: the gradients from `layer`'s first parameter up
** are final. Starts what holds a bucket, and lets the oldest sums move on
** (Open MPI progresses a non-blocking collective only inside its calls). */
void rpi_bucket_ready(void *arg, int layer) {
    worker *w = arg;
    const rp_layer *L0 = &w->lm->layers[w->s->first[w->stage]];
    bucket_flush(w, w->lm->layers[layer].param_offset - L0->param_offset, false);
    while (w->bdone < w->nbreq && !w->bucket_status) {
        bool done;
        w->bucket_status = rp_comm_test(w->breq_comm[w->bdone], &w->breq[w->bdone], &done,
                                        &w->err);
        if (!done)
            break;
        bucket_traced(w, w->bdone++);
    }
}

/* Starts the rest and waits for every bucket. */
static rp_status bucket_wait(worker *w) {
    bucket_flush(w, 0, true);
    for (; w->bdone < w->nbreq && !w->bucket_status; w->bdone++)
        if (!(w->bucket_status =
                  rp_comm_wait(w->breq_comm[w->bdone], &w->breq[w->bdone], &w->err)))
            bucket_traced(w, w->bdone);
    return w->bucket_status;
}

/* The gradients of an update, reduced within each variable's group and
** unscaled; with auto_loss_scaling, every worker of the world learns
** whether any gradient is not finite and skips the update if so.
** Sharded runs are reduce-scattered, then (unless skipped) their shard is
** updated and the parameters all-gathered (ZeRO stage 1). Fused runs are
** summed and updated here too (rp_comm_reduce_update). */
static rp_status update_sharded(worker *w);

rp_status rpi_reduce(worker *w) {
    rp_session *s = w->s;
    float *g = rp_net_grads(w->net), *prm = rp_net_params(w->net);
    rp_status st = RP_OK;
    if (w->any_fused) /* never skipped: no auto_loss_scaling */
        w->applied++;
    if (w->last_back >= 0 && (st = bucket_wait(w)))
        return st;
    for (int r = 0; r < w->nruns && !st; r++) {
        const var_run *vr = &w->runs[r];
        rp_comm *rc = w->reduce[vr->grouping];
        float f = (float)(vr->rescale / w->scale) * w->mean, *x = g + vr->offset;
        size_t k = vr->count;
        if (vr->fused) {
            size_t first = (size_t)rp_comm_rank(rc) * vr->shard;
            size_t have = first < vr->count ? vr->count - first : 0;
            fused_update u = {w, vr, f, first, have < vr->shard ? have : vr->shard};
            st = rp_comm_reduce_update(rc, NULL, x, prm + vr->offset, k, apply_update, &u,
                                       &w->err);
            continue;
        }
        if (vr->sharded) {
            x = w->shard_g + vr->shard_offset, k = vr->shard;
            st = rp_comm_reduce_scatter(rc, NULL, g + vr->offset, vr->count, x, &w->err);
        } else if (rp_comm_size(rc) > 1 && w->h_stage) {
            st = rp_comm_allreduce_half(rc, NULL, x, w->h_stage, k, &w->err);
        } else if (rp_comm_size(rc) > 1 && !bucketed(w, vr)) {
            st = rp_comm_allreduce(rc, NULL, x, k, &w->err);
        }
        if (f != 1.0f)
            for (size_t e = 0; e < k; e++)
                x[e] *= f;
    }
    if (!st && s->nties)
        st = tie_sum(w);
    if (st || rpi_verdict_at_step(s)) /* (a device's: rpi_step_verdict) */
        return st;
    w->skip = false;
    if (s->cfg.auto_loss_scaling) {
        float bad = not_finite(w);
        if (rp_comm_size(w->comm) > 1 && (st = rp_comm_allreduce(w->comm, NULL, &bad, 1, &w->err)))
            return st;
        w->skip = bad > 0;
        next_scale(w, &s->cfg);
    }
    if (w->skip)
        return RP_OK;
    if (s->cfg.gradient_clipping > 0 && (st = clip(w)))
        return st;
    return update_sharded(w);
}

/* The update's reduced gradients stepped where they are sharded, each
** shard on its worker and the parameters all-gathered (ZeRO stage 1). */
static rp_status update_sharded(worker *w) {
    float *prm = rp_net_params(w->net);
    rp_status st = RP_OK;
    if (!w->any_fused)
        w->applied++;
    for (int r = 0; r < w->nruns && !st; r++) {
        const var_run *vr = &w->runs[r];
        if (!vr->sharded || vr->fused)
            continue;
        rp_comm *rc = w->reduce[vr->grouping];
        size_t c = vr->shard, first = (size_t)rp_comm_rank(rc) * c;
        size_t have = first < vr->count ? vr->count - first : 0;
        have = have < c ? have : c;
        /* the shard is updated where it lies and all-gathered in place; the
        ** padded tail, fewer floats than members, lands on the next run's
        ** parameters (or the net's slack) and is put back */
        float *p = prm + vr->offset + first, *out = prm + vr->offset;
        if ((st = rpi_opt_step(w, w->applied, p, w->shard_g + vr->shard_offset, vr->state_offset,
                           have)))
            break;
        if (have < c) {
            memcpy(w->shard_p, p, sizeof(float) * have);
            memset(w->shard_p + have, 0, sizeof(float) * (c - have));
            p = w->shard_p;
        }
        size_t pad = c * (size_t)rp_comm_size(rc) - vr->count;
        memcpy(w->tail, out + vr->count, sizeof(float) * pad);
        if ((st = rp_comm_allgather(rc, NULL, p, c, out, &w->err)))
            break;
        memcpy(out + vr->count, w->tail, sizeof(float) * pad);
    }
    return st;
}


/* A device runs its chunks' workers on one thread (ranks under MPI), so
** it cannot join a sum over every worker once for each: its first step of
** an update, after all its chunks have reduced, takes the overflow count
** and every chunk's part of the squares for them all in one sum over the
** devices (parts in slots: the same bits as a sum over workers), and sets
** each chunk's verdict; then each chunk's step goes on as rpi_reduce does. */
rp_status rpi_step_verdict(worker *w, uint64_t update) {
    rp_session *s = w->s;
    const rp_workplan *pl = s->plan;
    int d = pl->device_of[w->id], W = s->W;
    worker *lead = rpi_worker_of(s, pl->dev[d].worker[0]);
    rp_status st = RP_OK;
    if (lead->verdict != update + 1) {
        lead->verdict = update + 1;
        float *v = lead->parts; /* W parts, then the overflows */
        memset(v, 0, sizeof(float) * (W + 1));
        for (int k = 0; k < W; k++)
            if (pl->device_of[k] == d) {
                const worker *x = rpi_worker_of(s, k);
                v[W] += s->cfg.auto_loss_scaling ? not_finite(x) : 0.0f;
                v[k] = s->cfg.gradient_clipping > 0 ? norm_part(x) : 0.0f;
            }
        rp_comm *c = s->comm ? s->comm : lead->dcomm;
        if (rp_comm_size(c) > 1 && (st = rp_comm_allreduce(c, NULL, v, (size_t)W + 1, &w->err)))
            return st;
        for (int k = 0; k < W; k++)
            if (pl->device_of[k] == d) {
                worker *x = rpi_worker_of(s, k);
                x->skip = s->cfg.auto_loss_scaling && v[W] > 0;
                if (s->cfg.auto_loss_scaling)
                    next_scale(x, &s->cfg);
                if (x != lead)
                    memcpy(x->parts, v, sizeof(float) * W);
            }
    }
    if (w->skip)
        return RP_OK;
    if (s->cfg.gradient_clipping > 0)
        clip_scale(w, sum_parts(w));
    return update_sharded(w);
}
