/*
** A session's weights, and its whole training state, free of its layout
** (rp_train_state).
**
** A worker holds its stage's parameters and, per run of variables (see
** session_impl.h), `per` optimizer state arrays: of the whole run, or with
** replicated tensor sharding of one shard of it, arrays of the shard's
** length; in memory, or offchip in its state file. Reading packs every
** worker's state into a model-wide layout, [per][num_params], each worker
** filling the elements it holds; under MPI the packs are all-gathered. Each
** group's value of each element is then taken from a worker that holds it:
** the owner of its shard, or for an unsharded run the group's first worker
** (every worker of a group updates the whole run alike). Writing is the
** inverse, each worker taking what it holds from the layout-free tensors.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session_impl.h"
#include "../sched/sharding.h"

/* ---- tensor parallelism ------------------------------------------------------------ */

/* Where the layers of stage t lie in rank k's parameters: [*lo, *hi). Its
** element i is the model's s->tpmap[k][i] (tensor parallelism); without
** tensor groups the model's own range, element i being i. */
static void rank_range(const rp_session *s, int k, int t, size_t *lo, size_t *hi) {
    const rp_model *lm = s->T > 1 ? s->tpm[k] : s->m;
    *lo = lm->layers[s->first[t]].param_offset;
    *hi = t + 1 < s->P ? lm->layers[s->first[t + 1]].param_offset : lm->num_params;
}

static size_t whole_index(const rp_session *s, int k, size_t i) {
    return s->T > 1 ? s->tpmap[k][i] : i;
}

/* A worker's parameters of its stage into the model's layout (row: n floats). */
static void scatter_params(const rp_session *s, const worker *w, const float *p, float *row) {
    size_t lo, hi;
    rank_range(s, w->tensor_rank, w->stage, &lo, &hi);
    for (size_t i = lo; i < hi; i++)
        row[whole_index(s, w->tensor_rank, i)] = p[i - lo];
}

/* ---- weights ---------------------------------------------------------------------- */

/* Every replica's full flat parameters, R * num_params floats: each stage's
** slice from the replica's first stage replica. Collective under MPI. */
rp_status rpi_all_params(rp_session *s, float **out, rp_error *err) {
    const rp_model *m = s->m;
    size_t n = m->num_params;
    float *buf = calloc(n * s->R, sizeof(float));
    if (!buf)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    if (s->backend == RP_BACKEND_LOCAL) { /* a tensor group's ranks each give their slices */
        for (int c = 0; c < s->R; c++)
            for (int t = 0; t < s->P; t++)
                for (int k = s->T - 1; k >= 0; k--) {
                    worker *w = &s->w[rp_workplan_worker(&s->cfg, c, t, 0) + k];
                    scatter_params(s, w, rp_net_params(w->net), buf + (size_t)c * n);
                }
        *out = buf;
        return RP_OK;
    }
    /* MPI: every rank contributes its slice in a zero vector */
    float *mine = calloc(n ? n : 1, sizeof(float)), *every = malloc(sizeof(float) * n * s->W);
    rp_status st = RP_OK;
    if (!mine || !every) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
    } else {
        for (int i = 0; i < s->nlocal; i++) /* (a device's chunks hold different layers) */
            scatter_params(s, &s->w[i], rp_net_params(s->w[i].net), mine);
        st = rp_comm_allgather(s->comm, NULL, mine, n, every, err);
        for (int c = 0; !st && c < s->R; c++)
            for (int t = 0; t < s->P; t++)
                for (int k = s->T - 1; k >= 0; k--) {
                    size_t lo, hi;
                    int id = rp_workplan_worker(&s->cfg, c, t, 0) + k;
                    const float *src = every + (size_t)rpi_rank_of(s, id) * n;
                    rank_range(s, k, t, &lo, &hi);
                    for (size_t i = lo; i < hi; i++) {
                        size_t e = whole_index(s, k, i);
                        buf[(size_t)c * n + e] = src[e];
                    }
                }
    }
    free(mine), free(every);
    if (st)
        free(buf);
    else
        *out = buf;
    return st;
}

rp_status rp_session_get_weights(rp_session *s, rp_weights_mode mode, rp_weights **out,
                                 rp_error *err) {
    *out = NULL;
    const rp_model *m = s->m;
    float *rows = NULL;
    rp_weights *w = calloc(1, sizeof *w);
    rp_status st = RP_OK;
    if (!w || !(w->tensors = calloc(m->num_vars ? m->num_vars : 1, sizeof(rp_tensor)))) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = rpi_all_params(s, &rows, err)))
        goto done;
    for (int v = 0; v < m->num_vars; v++) {
        const rp_variable *var = &m->vars[v];
        const rp_grouping *g = &s->var_group[v];
        rp_tensor *t = &w->tensors[v];
        snprintf(t->name, RP_NAME_MAX, "%s", var->name);
        t->shape = var->shape;
        t->groups = mode == RP_ALL_REPLICAS ? s->R : rp_grouping_num_groups(g);
        t->data = malloc(sizeof(float) * var->count * t->groups);
        if (!t->data) {
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
            goto done;
        }
        w->num_tensors++;
        for (int k = 0; k < t->groups; k++) {
            int c = mode == RP_ALL_REPLICAS ? k : rp_grouping_first(g, k);
            memcpy(t->data + (size_t)k * var->count, rows + (size_t)c * m->num_params + var->offset,
                   sizeof(float) * var->count);
        }
    }
done:
    free(rows);
    if (st) {
        rp_weights_free(w);
        return st;
    }
    *out = w;
    return RP_OK;
}

/* Worker wk's weights from the file's copy of its replica (or group),
** its tensor rank's slice of them. */
static void load_worker(rp_session *s, worker *wk, const rp_weights *w, rp_weights_mode mode) {
    const rp_model *m = s->m;
    int c = wk->replica, l0 = s->first[wk->stage], l1 = s->first[wk->stage + 1];
    float *p = rp_net_params(wk->net);
    const rp_model *lm = wk->lm;
    size_t base = lm->layers[l0].param_offset;
    for (int v = 0; v < m->num_vars; v++) {
        const rp_variable *var = &m->vars[v], *lv = &lm->vars[v];
        if (var->layer < l0 || var->layer >= l1)
            continue;
        const rp_tensor *t = rp_weights_find(w, var->name);
        int row = t->groups == 1 ? 0
                  : mode == RP_ALL_REPLICAS ? c
                                            : rp_grouping_group_of(&s->var_group[v], c);
        const float *src = t->data + (size_t)row * var->count;
        if (s->T == 1)
            memcpy(p + (var->offset - base), src, sizeof(float) * var->count);
        for (size_t e = 0; s->T > 1 && e < lv->count; e++) /* the rank's slice */
            p[lv->offset - base + e] =
                src[s->tpmap[wk->tensor_rank][lv->offset + e] - var->offset];
    }
    if (wk->stale) /* 2BW: set weights start both versions */
        memcpy(wk->stale, p, sizeof(float) * rp_net_num_params(wk->net));
}

rp_status rp_session_set_weights(rp_session *s, const rp_weights *w, rp_weights_mode mode,
                                 rp_error *err) {
    const rp_model *m = s->m;
    /* check everything before writing anything */
    for (int v = 0; v < m->num_vars; v++) {
        const rp_variable *var = &m->vars[v];
        const rp_grouping *g = &s->var_group[v];
        const rp_tensor *t;
        rp_status st = rp_weights_var(w, var, &t, err);
        if (st)
            return st;
        int want = mode == RP_ALL_REPLICAS ? s->R : rp_grouping_num_groups(g);
        if (mode == RP_ALL_REPLICAS && g->group_size > 1)
            return rp_fail(err, RP_ERR_INVALID,
                           "weights: variable '%s' is shared by groups of %d replicas; writing "
                           "one value per replica (all_replicas) could make a group's members "
                           "differ: write one value per group",
                           var->name, g->group_size);
        if (t->groups != 1 && t->groups != want)
            return rp_fail(err, RP_ERR_INVALID,
                           "weights: variable '%s' has %d copies; it needs 1 or %d (%s)",
                           var->name, t->groups, want,
                           mode == RP_ALL_REPLICAS ? "replicas" : "groups");
    }
    for (int i = 0; i < s->nties; i++) { /* a tie's two copies are one tensor */
        const rp_tensor *e = rp_weights_find(w, m->vars[s->ties[i].emb_var].name);
        const rp_tensor *h = rp_weights_find(w, m->vars[s->ties[i].head_var].name);
        int groups = e->groups < h->groups ? e->groups : h->groups;
        size_t n = rp_shape_size(&e->shape) * (size_t)groups;
        if (e->groups != h->groups || memcmp(e->data, h->data, sizeof(float) * n) != 0)
            return rp_fail(err, RP_ERR_INVALID,
                           "weights: '%s' and '%s' are tied, one tensor, but the file holds "
                           "two different ones",
                           e->name, h->name);
    }
    for (int i = 0; i < s->nlocal; i++)
        load_worker(s, &s->w[i], w, mode);
    return RP_OK;
}

/* ---- the whole training state ------------------------------------------------- */

void rp_train_state_free(rp_train_state *st) {
    if (!st)
        return;
    rp_weights_free(st->weights);
    rp_weights_free(st->optimizer);
    memset(st, 0, sizeof *st);
}

static int stage_of(const rp_session *s, int layer) {
    int t = 0;
    while (t + 1 < s->P && layer >= s->first[t + 1])
        t++;
    return t;
}

/* The run that holds variable v, as setup_worker forms them: consecutive
** variables of its stage, of one grouping, contiguous. Its first parameter
** (model-wide) and its length. */
static void run_of(const rp_session *s, const rp_model *m, int v, size_t *first,
                   size_t *count) {
    int t = stage_of(s, m->vars[v].layer);
    int u = v;
    while (u > 0 && stage_of(s, m->vars[u - 1].layer) == t &&
           rp_grouping_equal(&s->var_group[u - 1], &s->var_group[v]) &&
           m->vars[u - 1].split == m->vars[v].split &&
           m->vars[u - 1].offset + m->vars[u - 1].count == m->vars[u].offset)
        u--;
    *first = m->vars[u].offset;
    *count = 0;
    for (int x = u; x < m->num_vars && stage_of(s, m->vars[x].layer) == t &&
                    rp_grouping_equal(&s->var_group[x], &s->var_group[v]) &&
                    m->vars[x].split == m->vars[v].split &&
                    m->vars[x].offset == *first + *count;
         x++)
        *count += m->vars[x].count;
}

/* What worker w holds of run r: elements [*lo, *lo + *n) of the run. */
static void held(const worker *w, const var_run *vr, size_t *lo, size_t *n) {
    if (!vr->sharded) {
        *lo = 0, *n = vr->count;
        return;
    }
    *lo = (size_t)rp_comm_rank(w->reduce[vr->grouping]) * vr->shard;
    size_t have = *lo < vr->count ? vr->count - *lo : 0;
    *n = have < vr->shard ? have : vr->shard;
}

/* Copies worker w's state into dst, [per][num_params] (read) or from it
** (write). */
static rp_status move_state(worker *w, float *dst, bool write_it, rp_error *err) {
    const rp_session *s = w->s;
    size_t n = s->m->num_params, per = s->state_per_param;
    size_t base = w->lm->layers[s->first[w->stage]].param_offset;
    float *slice = NULL; /* tensor parallelism: the rank's elements, gathered */
    for (int r = 0; r < w->nruns; r++) {
        const var_run *vr = &w->runs[r];
        size_t lo, have;
        held(w, vr, &lo, &have);
        free(slice);
        if (s->T > 1 && have && !(slice = malloc(sizeof(float) * have)))
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for the optimizer state");
        for (size_t a = 0; a < per && have; a++) {
            const size_t *map = s->T > 1 ? s->tpmap[w->tensor_rank] + base + vr->offset + lo : NULL;
            float *model = slice ? slice : dst + a * n + base + vr->offset + lo;
            for (size_t e = 0; slice && write_it && e < have; e++)
                slice[e] = dst[a * n + map[e]];
            size_t at = vr->state_offset + a * have;
            if (w->state_fd >= 0) {
                if (rpi_pio(w->state_fd, model, sizeof(float) * have, (off_t)(sizeof(float) * at),
                            write_it)) {
                    free(slice);
                    return rp_fail(err, RP_ERR_IO, "offchip optimizer state: %s failed",
                                   write_it ? "write" : "read");
                }
            } else if (write_it) {
                memcpy(w->opt + at, model, sizeof(float) * have);
            } else {
                memcpy(model, w->opt + at, sizeof(float) * have);
            }
            for (size_t e = 0; slice && !write_it && e < have; e++)
                dst[a * n + map[e]] = slice[e];
        }
    }
    free(slice);
    return RP_OK;
}

static int by_id(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Every worker's packed state, [W][per][num_params]. */
static rp_status gather_state(rp_session *s, float **out, rp_error *err) {
    size_t len = s->state_per_param * s->m->num_params;
    float *every = calloc(len ? len * s->W : 1, sizeof(float));
    if (!every)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the optimizer state");
    rp_status st = RP_OK;
    if (s->backend == RP_BACKEND_LOCAL) {
        for (int i = 0; i < s->W && !st; i++)
            st = move_state(&s->w[i], every + (size_t)i * len, false, err);
    } else {
        /* a rank's workers (a device's chunks) pack their layers into one row */
        float *mine = calloc(len ? len : 1, sizeof(float));
        float *rows = s->rank_of ? malloc(sizeof(float) * (len ? len * s->W : 1)) : every;
        if (!mine || !rows)
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory for the optimizer state");
        for (int i = 0; i < s->nlocal && !st; i++)
            st = move_state(&s->w[i], mine, false, err);
        if (!st)
            st = rp_comm_allgather(s->comm, NULL, mine, len, rows, err);
        for (int i = 0; i < s->W && !st && rows != every; i++) /* then a row a worker */
            memcpy(every + (size_t)i * len, rows + (size_t)s->rank_of[i] * len,
                   sizeof(float) * len);
        if (rows != every)
            free(rows);
        free(mine);
    }
    if (st) {
        free(every);
        return st;
    }
    *out = every;
    return RP_OK;
}

/* The optimizer steps of each stage, from its workers, wherever they run
** (collective under MPI): sent as 16-bit pieces in floats, which a sum
** over ranks carries exactly, as one rank gives each stage's. */
static rp_status stage_steps(rp_session *s, long long *steps, rp_error *err) {
    for (int t = 0; t < s->P; t++)
        steps[t] = 0;
    for (int i = 0; i < s->nlocal; i++)
        if (s->w[i].applied > steps[s->w[i].stage])
            steps[s->w[i].stage] = s->w[i].applied;
    if (!s->comm || rp_comm_size(s->comm) == 1)
        return RP_OK;
    /* a stage's replicas step alike: its first worker gives it */
    float piece[RP_MAX_STAGES * 4] = {0};
    for (int i = 0; i < s->nlocal; i++) {
        const worker *w = &s->w[i];
        if (rp_workplan_worker(&s->cfg, 0, w->stage, 0) == w->id)
            for (int k = 0; k < 4; k++)
                piece[w->stage * 4 + k] = (float)((unsigned long long)w->applied >> (16 * k) &
                                                  0xffff);
    }
    rp_status st = rp_comm_allreduce(s->comm, NULL, piece, (size_t)s->P * 4, err);
    for (int t = 0; t < s->P && !st; t++) {
        unsigned long long v = 0;
        for (int k = 0; k < 4; k++)
            v |= (unsigned long long)piece[t * 4 + k] << (16 * k);
        steps[t] = (long long)v;
    }
    return st;
}

/* Where the whole model's elements lie under tensor parallelism: the rank
** that holds each (0 for whole ones) and its place in that rank's layout. */
typedef struct element_map {
    int *rank_of;
    size_t *local_of;
} element_map;

/* Variable v's optimizer state, a tensor an array of it (per a parameter),
** one copy a group: each element from the worker that owns it (the shard's
** owner where the state is sharded) in every worker's gathered state. */
static rp_status state_tensors(rp_session *s, int v, const float *every, const element_map *em,
                               rp_weights *opt, rp_error *err) {
    const rp_model *m = s->m;
    size_t n = m->num_params, per = s->state_per_param;
    const rp_variable *var = &m->vars[v];
    const rp_grouping *g = &s->var_group[v];
    int t = stage_of(s, var->layer), G = rp_grouping_num_groups(g);
    int k = g->group_size * rp_config_stage_replicas(&s->cfg, t);
    bool sharded = rpi_sharded(&s->cfg, k, per);
    for (size_t a = 0; a < per; a++) {
        rp_tensor *ten = &opt->tensors[opt->num_tensors];
        if (snprintf(ten->name, RP_NAME_MAX, "%s#%zu", var->name, a) >= RP_NAME_MAX)
            return rp_fail(err, RP_ERR_INVALID,
                           "variable '%s': its name is too long for its optimizer state's",
                           var->name);
        ten->shape = var->shape;
        ten->groups = G;
        if (!(ten->data = malloc(sizeof(float) * var->count * G)))
            return rp_fail(err, RP_ERR_NOMEM, "out of memory");
        opt->num_tensors++;
        for (int q = 0; q < G; q++) {
            int members[RP_MAX_WORKERS], in = -1;
            size_t first = 0, shard = 1;
            for (size_t e = 0; e < var->count; e++) {
                size_t ge = var->offset + e, li = em->local_of ? em->local_of[ge] : ge;
                int r = em->rank_of ? em->rank_of[ge] : 0; /* its rank's reduction and run */
                if (r != in) {
                    int nm = rpi_reduce_members(s, g, rp_grouping_first(g, q), t, r, members);
                    qsort(members, nm, sizeof(int), by_id); /* their ranks in it */
                    /* ranks' layouts differ where a vocabulary splits unevenly */
                    size_t count;
                    run_of(s, s->T > 1 ? s->tpm[r] : m, v, &first, &count);
                    shard = sharded ? (count + k - 1) / k : count;
                    in = r;
                }
                int owner = members[sharded ? (li - first) / shard : 0];
                ten->data[(size_t)q * var->count + e] = every[((size_t)owner * per + a) * n + ge];
            }
        }
    }
    return RP_OK;
}

/* The whole optimizer state, from every worker's (collective under MPI). */
static rp_status optimizer_state(rp_session *s, rp_train_state *out, rp_error *err) {
    const rp_model *m = s->m;
    size_t n = m->num_params, per = s->state_per_param;
    float *every = NULL;
    element_map em = {NULL, NULL};
    if (!(out->optimizer = calloc(1, sizeof(rp_weights))) ||
        !(out->optimizer->tensors = calloc(per * m->num_vars + 1, sizeof(rp_tensor))))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    if (!per)
        return RP_OK;
    rp_status st = gather_state(s, &every, err);
    if (!st && s->T > 1) {
        em.rank_of = malloc(sizeof(int) * (n ? n : 1));
        em.local_of = malloc(sizeof(size_t) * (n ? n : 1));
        if (!em.rank_of || !em.local_of)
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        for (int r = s->T - 1; !st && r >= 0; r--)
            for (size_t i = 0; i < s->tpm[r]->num_params; i++)
                em.rank_of[s->tpmap[r][i]] = r, em.local_of[s->tpmap[r][i]] = i;
    }
    for (int v = 0; !st && v < m->num_vars; v++)
        st = state_tensors(s, v, every, &em, out->optimizer, err);
    free(every), free(em.rank_of), free(em.local_of);
    return st;
}

rp_status rp_session_get_state(rp_session *s, rp_train_state *out, rp_error *err) {
    memset(out, 0, sizeof *out);
    if (s->cfg.schedule == RP_SCHEDULE_PIPEDREAM_2BW)
        return rp_fail(err, RP_ERR_INVALID,
                       "a training state holds one version of the weights; schedule "
                       "\"pipedream_2bw\" keeps two, so it cannot be checkpointed yet");
    rp_status st = rp_session_get_weights(s, RP_ONE_PER_GROUP, &out->weights, err);
    if (!st)
        st = optimizer_state(s, out, err);
    if (!st)
        st = stage_steps(s, out->stage_steps, err);
    if (st) {
        rp_train_state_free(out);
        return st;
    }
    const worker *w = &s->w[0]; /* the other counters are the world's */
    /* the steps of stage 0; under PipeDream's schedules each stage's too,
    ** for they step once a micro-batch they run (a stage of 4 replicas a
    ** quarter as often as one of 1) */
    out->num_stage_steps = s->cfg.schedule >= RP_SCHEDULE_PIPEDREAM ? s->P : 0;
    out->updates = s->updates;
    out->steps = out->stage_steps[0];
    out->skipped = w->skipped;
    out->loss_scale = w->scale;
    out->clean = w->clean;
    return RP_OK;
}

/* The state's counters, each within what the session's schedule allows. */
static rp_status check_counters(const rp_session *s, const rp_train_state *in, rp_error *err) {
    /* a synchronous update steps once; PipeDream's stages step once a
    ** micro-batch they run, at most gradient_accumulation_steps an update */
    bool async = s->cfg.schedule >= RP_SCHEDULE_PIPEDREAM;
    long long most = in->updates * (async ? s->cfg.gradient_accumulation_steps : 1);
    const char *bad = !in->weights                         ? "weights"
                      : !(in->loss_scale > 0)              ? "loss scale"
                      : in->updates < 0                    ? "updates"
                      : in->steps < 0 || in->steps > most  ? "steps"
                      : in->skipped < 0 || in->skipped > in->updates ? "skipped"
                      : in->clean < 0                      ? "clean"
                      : NULL;
    if (!bad && in->num_stage_steps && in->num_stage_steps != s->P)
        bad = "stage steps (one per stage)";
    for (int t = 0; !bad && t < in->num_stage_steps; t++)
        if (in->stage_steps[t] < 0 || in->stage_steps[t] > most)
            bad = "stage steps";
    if (bad)
        return rp_fail(err, RP_ERR_INVALID,
                       "training state: %s out of range (updates %lld, steps %lld, skipped %lld, "
                       "loss scale %g; at most %lld steps under schedule %s)",
                       bad, in->updates, in->steps, in->skipped, in->loss_scale, most,
                       rp_schedule_name(s->cfg.schedule));
    return RP_OK;
}

/* Every state tensor present, shaped, one copy per group: before anything
** changes. ten[v * per + a]: variable v's a-th array. */
static rp_status find_tensors(const rp_session *s, const rp_train_state *in,
                              const rp_tensor **ten, rp_error *err) {
    const rp_model *m = s->m;
    size_t per = s->state_per_param;
    for (int v = 0; v < m->num_vars && per; v++) {
        const rp_variable *var = &m->vars[v];
        int G = rp_grouping_num_groups(&s->var_group[v]);
        for (size_t a = 0; a < per; a++) {
            char name[RP_NAME_MAX + 24];
            snprintf(name, sizeof name, "%s#%zu", var->name, a);
            const rp_tensor *t = in->optimizer ? rp_weights_find(in->optimizer, name) : NULL;
            if (!t)
                return rp_fail(err, RP_ERR_INVALID,
                               "training state: no optimizer state '%s' for variable '%s'", name,
                               var->name);
            if (t->shape.ndim != var->shape.ndim ||
                memcmp(t->shape.dim, var->shape.dim, sizeof(int) * t->shape.ndim) ||
                t->groups != G)
                return rp_fail(err, RP_ERR_INVALID,
                               "training state: '%s' has %d cop%s of %zu values; the session "
                               "needs %d of %zu",
                               name, t->groups, t->groups == 1 ? "y" : "ies",
                               rp_shape_size(&t->shape), G, var->count);
            ten[(size_t)v * per + a] = t;
        }
    }
    return RP_OK;
}

/* Worker w's optimizer state (its replica's value of every element of its
** stage, packed as the whole model's in pack) and counters. */
static rp_status set_worker(rp_session *s, worker *w, const rp_train_state *in,
                            const rp_tensor **ten, float *pack, rp_error *err) {
    const rp_model *m = s->m;
    size_t n = m->num_params, per = s->state_per_param;
    rp_status st = RP_OK;
    if (per) {
        int l0 = s->first[w->stage], l1 = s->first[w->stage + 1];
        for (int v = 0; v < m->num_vars; v++) {
            const rp_variable *var = &m->vars[v];
            if (var->layer < l0 || var->layer >= l1)
                continue;
            int q = rp_grouping_group_of(&s->var_group[v], w->replica);
            for (size_t a = 0; a < per; a++)
                memcpy(pack + a * n + var->offset,
                       ten[(size_t)v * per + a]->data + (size_t)q * var->count,
                       sizeof(float) * var->count);
        }
        st = move_state(w, pack, true, err);
    }
    w->applied = in->num_stage_steps ? in->stage_steps[w->stage] : in->steps;
    w->skipped = in->skipped;
    w->scale = in->loss_scale;
    w->clean = in->clean;
    return st;
}

rp_status rp_session_set_state(rp_session *s, const rp_train_state *in, rp_error *err) {
    const rp_model *m = s->m;
    size_t n = m->num_params, per = s->state_per_param;
    if (s->cfg.schedule == RP_SCHEDULE_PIPEDREAM_2BW)
        return rp_fail(err, RP_ERR_INVALID,
                       "a training state holds one version of the weights; schedule "
                       "\"pipedream_2bw\" needs two");
    rp_status st = check_counters(s, in, err);
    if (st)
        return st;
    const rp_tensor **ten = calloc(per * m->num_vars + 1, sizeof(rp_tensor *));
    if (!ten)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    st = find_tensors(s, in, ten, err);
    if (!st)
        st = rp_session_set_weights(s, in->weights, RP_ONE_PER_GROUP, err);
    float *pack = st || !per ? NULL : malloc(sizeof(float) * per * n);
    if (!st && per && !pack)
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory for the optimizer state");
    for (int i = 0; i < s->nlocal && !st; i++)
        st = set_worker(s, &s->w[i], in, ten, pack, err);
    if (!st)
        s->updates = in->updates;
    free(pack);
    free(ten);
    return st;
}
