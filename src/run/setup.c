/*
** A worker of a session made ready: its stage's net (or its tensor rank's
** slice of it), activation slots, message and exchange buffers, optimizer
** state, the weight versions its schedule keeps, and its first weights,
** drawn as one worker would draw the whole model's so that every layout
** starts from the same numbers.
*/
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/util.h"
#include "session_impl.h"
#include "../sched/sharding.h"

/* Vertical sync: micro-batch m runs at stage s on the version that holds
** the micro-batches the input stage's version for it holds, v_0(m) r_0 of
** them (v_0(m): stage 0's updates before m's forward there), as far as the
** stage's groups of r_s allow: version floor(v_0(m) r_0 / r_s). The stage
** must have made that version before m's forward reaches it. */
static rp_status vertical_versions(const rp_session *s, worker *w, rp_error *err) {
    const rp_config *cfg = &s->cfg;
    int r0 = rp_config_stage_replicas(cfg, 0), rs = rp_config_stage_replicas(cfg, w->stage);
    for (int j = 0; j < r0; j++) {
        const rp_worker_ops *in = &s->plan->w[rp_workplan_worker(cfg, 0, 0, j)];
        int steps = 0;
        for (int i = 0; i < in->num_ops; i++) {
            const rp_op *op = &in->ops[i];
            if (op->kind == RP_OP_STEP)
                steps++;
            else if (op->kind == RP_OP_FORWARD)
                w->version_of[op->mb] = steps * r0 / rs;
        }
    }
    int steps = 0;
    for (int i = 0; i < w->plan->num_ops; i++) {
        const rp_op *op = &w->plan->ops[i];
        if (op->kind == RP_OP_STEP)
            steps++;
        else if (op->kind == RP_OP_FORWARD && w->version_of[op->mb] > steps)
            return rp_fail(err, RP_ERR_INVALID,
                           "pipedream_vertical_sync: stage %d would need version %d for "
                           "micro-batch %d before it has made it (%d)",
                           w->stage, w->version_of[op->mb], op->mb, steps);
    }
    return RP_OK;
}

/* Tensor parallelism: rank k's parameters of layers [l0, l1) (which start at
** its layer l0's offset) from the whole model's default initialisation, so
** that every t starts from the weights of t = 1. */
static rp_status init_rank_params(const rp_session *s, const worker *w, const int *var_index,
                                  float *params, rp_error *err) {
    const rp_model *m = s->m, *lm = w->lm;
    int l0 = s->first[w->stage], l1 = s->first[w->stage + 1];
    size_t base = m->layers[l0].param_offset;
    size_t n = (l1 < m->num_layers ? m->layers[l1].param_offset : m->num_params) - base;
    float *whole = malloc(sizeof(float) * (n ? n : 1));
    if (!whole)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's initialisation", w->id);
    rp_model_init_params(m, l0, l1, s->cfg.seed, var_index, whole);
    const size_t *map = s->tpmap[w->tensor_rank];
    size_t lbase = lm->layers[l0].param_offset;
    size_t ln = (l1 < lm->num_layers ? lm->layers[l1].param_offset : lm->num_params) - lbase;
    for (size_t i = 0; i < ln; i++)
        params[i] = whole[map[lbase + i] - base];
    free(whole);
    return RP_OK;
}

/* The worker's net over its stage's layers (its tensor rank's share), with
** what the configuration asks of it. */
static rp_status make_net(rp_session *s, worker *w, rp_error *err) {
    const rp_model *m = w->lm;
    int l0 = s->first[w->stage], l1 = s->first[w->stage + 1];
    rp_net_options no = rpi_net_options(&s->cfg, w->stage, false);
    if (s->T > 1)
        no.tp_allreduce = rpi_tp_allreduce, no.tp_allgather = rpi_tp_allgather, no.tp_ctx = w;
    if (s->cfg.expert_parallel > 1) { /* the group: consecutive replicas (session_check.c) */
        no.ep_size = s->cfg.expert_parallel, no.ep_rank = w->replica % no.ep_size;
        no.ep_alltoall = rpi_ep_alltoall, no.ep_ctx = w;
    }
    if (s->cfg.replicated_tensor_sharding) /* room for a padded all-gather's tail */
        no.param_slack = (size_t)s->R * rp_config_stage_replicas(&s->cfg, w->stage);
    no.stat_slots = s->GA * s->R; /* batchnorm: a slot per micro-batch of the update */
    return rp_net_create_with(m, l0, l1, s->B, &no, &w->net, err);
}

/* The activations of its slots, the messages' buffers and requests, the
** losses, and fp16_exchange's halves. */
static rp_status buffers(rp_session *s, worker *w, rp_error *err) {
    int id = w->id, slots = w->plan->slots > 0 ? w->plan->slots : 1;
    size_t in = rp_net_in_size(w->net), out = rp_net_out_size(w->net);
    w->acts = calloc(slots, sizeof(rp_acts *));
    w->out = calloc(slots, sizeof(float *));
    w->losses = calloc((size_t)s->D * s->GA, sizeof(float));
    w->grad_in = malloc(sizeof(float) * out * s->B);
    w->grad_at = w->grad_in;
    w->grad_out = malloc(sizeof(float) * in * s->B * s->GA);
    w->req = calloc(2 * (size_t)s->GA, sizeof(rp_request));
    w->req_live = calloc(2 * (size_t)s->GA, sizeof(bool));
    w->runs = calloc(w->lm->num_vars ? w->lm->num_vars : 1, sizeof(var_run));
    w->scale = rp_config_loss_scale(&s->cfg);
    if ((s->cfg.gradient_clipping > 0 || s->cfg.auto_loss_scaling) &&
        !(w->parts = calloc((size_t)s->W + 1, sizeof(float))))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's norm", id);
    w->opt_now = s->cfg.optimizer;
    w->grad_norm = -1;
    if (s->cfg.fp16_exchange) {
        size_t big = in > out ? in : out;
        w->h_act = malloc(sizeof(uint16_t) * out * s->B * s->GA);
        w->h_grad = malloc(sizeof(uint16_t) * in * s->B * s->GA);
        w->h_recv = malloc(sizeof(uint16_t) * big * s->B);
        if (!w->h_act || !w->h_grad || !w->h_recv)
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's fp16 buffers", id);
    }
    if (!w->acts || !w->out || !w->losses || !w->grad_in || !w->grad_out || !w->req ||
        !w->req_live || !w->runs)
        return rp_fail(err, RP_ERR_NOMEM,
                       "out of memory for worker %d's activations and messages", id);
    for (int k = 0; k < w->plan->slots; k++) {
        rp_status st = rp_acts_create(w->net, s->B, &w->acts[k], err);
        if (st)
            return st;
    }
    return RP_OK;
}

/* This stage's variables, in runs of one grouping; and room for the tied
** gradients that pass through this worker: a tie across two other stages
** passes through its zeros, a tie split by vocabulary through everyone's
** whole table (exchange.c). */
static rp_status runs_and_ties(rp_session *s, worker *w, rp_error *err) {
    const rp_model *m = w->lm;
    int l0 = s->first[w->stage], l1 = s->first[w->stage + 1];
    int gcfg = s->cfg.replica_grouping.group_size;
    size_t base = m->layers[l0].param_offset;
    for (int v = 0; v < m->num_vars; v++) {
        int layer = m->vars[v].layer;
        if (layer < l0 || layer >= l1)
            continue;
        int q = 0;
        while (!rp_grouping_equal(&s->groupings[q], &s->var_group[v]))
            q++;
        size_t off = m->vars[v].offset - base;
        var_run *last = w->nruns ? &w->runs[w->nruns - 1] : NULL;
        bool whole = s->T > 1 && !m->vars[v].split;
        if (last && last->grouping == q && last->offset + last->count == off &&
            last->tp_whole == whole)
            last->count += m->vars[v].count;
        else
            w->runs[w->nruns++] = (var_run){.offset = off,
                                            .count = m->vars[v].count,
                                            .grouping = q,
                                            .rescale = (float)gcfg / s->var_group[v].group_size,
                                            .tp_whole = whole};
    }
    size_t tie_n = 0;
    for (int i = 0; i < s->nties; i++) {
        const tie *t = &s->ties[i];
        bool split = m->vars[t->emb_var].split;
        if (t->emb_stage != t->head_stage &&
            (split || (w->stage != t->emb_stage && w->stage != t->head_stage)) &&
            s->m->vars[t->emb_var].count > tie_n)
            tie_n = s->m->vars[t->emb_var].count;
    }
    if (tie_n && !(w->tie_buf = malloc(sizeof(float) * tie_n)))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's tied gradients", w->id);
    return RP_OK;
}

/* The weight versions the asynchronous schedules keep: 2BW's second,
** PipeDream's stash (a version a slot) or vertical sync's history. */
static rp_status versions(rp_session *s, worker *w, rp_error *err) {
    int id = w->id;
    w->mean = 1;
    w->own = rp_net_params(w->net);
    size_t np = rp_net_num_params(w->net) ? rp_net_num_params(w->net) : 1;
    if (s->cfg.schedule == RP_SCHEDULE_PIPEDREAM_2BW && /* filled once the weights are set */
        !(w->stale = malloc(sizeof(float) * np)))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's second version", id);
    if (s->cfg.schedule != RP_SCHEDULE_PIPEDREAM)
        return RP_OK;
    int r = rp_config_stage_replicas(&s->cfg, w->stage);
    int kept = rpi_pipedream_versions(s, w->stage, w->plan->slots);
    w->mean = 1.0f / (float)(r * s->R);
    w->slot_ver = calloc(w->plan->slots, sizeof(float *));
    if (s->cfg.pipedream_vertical_sync) { /* every version of a call */
        w->history = malloc(sizeof(float) * np * kept);
        w->version_of = malloc(sizeof(int) * s->GA);
        rp_status st;
        if (w->history && w->version_of && (st = vertical_versions(s, w, err)))
            return st;
    } else { /* weight stashing: a version a slot */
        w->stash = malloc(sizeof(float) * np * kept);
    }
    if (!w->slot_ver || (!w->stash && !w->history) ||
        (s->cfg.pipedream_vertical_sync && !w->version_of))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's %d weight versions",
                       id, kept);
    return RP_OK;
}

/* Optimizer state: whole runs, or one shard of each sharded run; in memory,
** or in a file of the run directory (optimizer_state_offchip). */
static rp_status optimizer_state(rp_session *s, worker *w, rp_error *err) {
    int id = w->id;
    size_t per = s->state_per_param, maxc = 1, maxk = 1, shards = 0;
    for (int r = 0; r < w->nruns; r++) {
        var_run *vr = &w->runs[r];
        /* members of the run's reduction: its group's replicas x stage replicas */
        const rp_grouping *g = &s->groupings[vr->grouping];
        int k = g->group_size * rp_config_stage_replicas(&s->cfg, w->stage);
        vr->sharded = rpi_sharded(&s->cfg, k, per);
        vr->shard = vr->sharded ? (vr->count + k - 1) / k : vr->count;
        vr->state_offset = w->state_floats;
        w->state_floats += vr->shard * per;
        vr->fused = rpi_fused_run(s, k, vr->sharded);
        w->any_fused |= vr->fused;
        w->any_sharded |= vr->sharded && !vr->fused; /* reduce-scattered, all-gathered */
        if (vr->sharded && !vr->fused) {
            vr->shard_offset = shards;
            shards += vr->shard;
            maxc = vr->shard > maxc ? vr->shard : maxc;
            maxk = (size_t)k > maxk ? (size_t)k : maxk;
        }
    }
    if (s->cfg.optimizer_state_offchip && w->state_floats) {
        /* worker-ID.state in the session's run directory, removed with it */
        char path[RP_PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/worker-%d.state", s->run_dir, w->id);
        w->state_fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (w->state_fd < 0)
            return rp_fail(err, RP_ERR_IO, "optimizer_state_offchip: cannot create %s", path);
        if (ftruncate(w->state_fd, (off_t)(sizeof(float) * w->state_floats)) != 0)
            return rp_fail(err, RP_ERR_IO, "optimizer_state_offchip: cannot size %s", path);
        w->chunk = calloc(RP_OFFCHIP_CHUNK * s->state_per_param, sizeof(float));
        w->opt = calloc(1, sizeof(float));
    } else {
        w->opt = calloc(w->state_floats ? w->state_floats : 1, sizeof(float));
    }
    if (w->state_fd >= 0 && !w->chunk)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's offchip chunk", id);
    if (w->any_sharded) {
        w->shard_g = malloc(sizeof(float) * shards);
        w->shard_p = malloc(sizeof(float) * maxc); /* touched by the last member only */
        w->tail = malloc(sizeof(float) * maxk);
    }
    if (!w->opt || (w->any_sharded && (!w->shard_g || !w->shard_p || !w->tail)))
        return rp_fail(err, RP_ERR_NOMEM,
                       "out of memory for worker %d's optimizer state (%zu floats)", id,
                       w->state_floats);
    return RP_OK;
}

/* reduction_bucket_mb: the last backward of the list (a whole one, or the
** weights' half of the last micro-batch) starts the buckets; room for one a
** layer and run, the most its announcements can start. fp16_exchange: the
** largest unsharded run, reduced in fp16. */
static rp_status reduction_buffers(rp_session *s, worker *w, rp_error *err) {
    int id = w->id, layers = s->first[w->stage + 1] - s->first[w->stage];
    w->last_back = -1;
    for (int i = 0; s->cfg.reduction_bucket_mb > 0 && i < w->plan->num_ops; i++)
        if (w->plan->ops[i].kind == RP_OP_BACKWARD ||
            w->plan->ops[i].kind == RP_OP_BACKWARD_WEIGHT)
            w->last_back = i;
    if (w->last_back >= 0) {
        double floats = s->cfg.reduction_bucket_mb * 1e6 / sizeof(float);
        w->bucket = floats < 1 ? 1 : floats > 1e15 ? (size_t)1e15 : (size_t)floats;
        /* a bucket starts at a layer's end, a run's start, or every
        ** `bucket` floats of a range */
        w->breq_cap = (int)(rp_net_num_params(w->net) / w->bucket) + layers + 2 * w->nruns + 1;
        w->breq = malloc(sizeof(rp_request) * w->breq_cap);
        w->breq_comm = malloc(sizeof(rp_comm *) * w->breq_cap);
        w->bstart = malloc(sizeof(double) * w->breq_cap);
        if (s->backend == RP_BACKEND_MPI) /* (rp_comm_iallreduce's scratch) */
            w->bscratch = malloc(sizeof(float) * (rp_net_num_params(w->net) + 1));
        if (!w->breq || !w->breq_comm || !w->bstart ||
            (s->backend == RP_BACKEND_MPI && !w->bscratch))
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's buckets", id);
    }
    size_t most = 0;
    for (int r = 0; s->cfg.fp16_exchange && r < w->nruns; r++)
        if (!w->runs[r].sharded && w->runs[r].count > most)
            most = w->runs[r].count;
    if (most && !(w->h_stage = malloc(sizeof(uint16_t) * most)))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's fp16 reduction", id);
    return RP_OK;
}

/* The first weights: replica c starts from its group's row of each
** variable (a tensor rank from its share of it). */
static rp_status first_weights(rp_session *s, worker *w, rp_error *err) {
    const rp_model *m = w->lm;
    int l0 = s->first[w->stage], l1 = s->first[w->stage + 1];
    int *var_index = malloc(sizeof(int) * (m->num_vars ? m->num_vars : 1));
    if (!var_index)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's initialisation", w->id);
    for (int v = 0; v < m->num_vars; v++)
        var_index[v] = rp_grouping_group_of(&s->var_group[v], w->replica);
    rp_status st = RP_OK;
    if (s->T > 1)
        st = init_rank_params(s, w, var_index, rp_net_params(w->net), err);
    else
        rp_model_init_params(m, l0, l1, s->cfg.seed, var_index, rp_net_params(w->net));
    free(var_index);
    if (st)
        return st;
    if (w->stale) /* 2BW's first update uses the weights it starts from twice */
        memcpy(w->stale, rp_net_params(w->net), sizeof(float) * rp_net_num_params(w->net));
    return RP_OK;
}

rp_status rpi_setup_worker(rp_session *s, worker *w, int id, rp_error *err) {
    w->s = s;
    w->id = id;
    w->plan = &s->plan->w[id];
    w->replica = w->plan->replica;
    w->stage = w->plan->stage;
    w->stage_replica = w->plan->stage_replica;
    w->tensor_rank = w->plan->tensor_rank;
    w->lm = s->T > 1 ? s->tpm[w->tensor_rank] : s->m;
    rp_status st = make_net(s, w, err);
    if (!st)
        st = buffers(s, w, err);
    if (!st)
        st = runs_and_ties(s, w, err);
    if (!st)
        st = versions(s, w, err);
    if (!st)
        st = optimizer_state(s, w, err);
    if (!st)
        st = reduction_buffers(s, w, err);
    if (!st)
        st = first_weights(s, w, err);
    return st;
}
