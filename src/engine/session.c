/*
** Sessions: R replicas of the whole model, each on its own worker.
**
** A worker runs its share of every update (replica c takes micro-batches
** c*GA .. c*GA+GA-1 of the update's slice), then the gradients of each
** variable are SUM-reduced once within the variable's replica group, and
** every worker applies the same optimizer step to its flat buffers.
**
** The loss gradient is scaled once, at the loss layer, by 1 / (samples of
** the update in a group) = 1 / (B * GA * g) for the configuration's group
** size g. A layer whose own group_size differs (a per-replica head, say) has
** its reduced gradient rescaled by g / g_layer, so that it too is the mean
** over its group's samples.
**
** On the local backend the workers are threads that wait for host calls;
** with one replica the calling thread does the work. Under MPI this process
** is one replica and the others are ranks.
*/
#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/session.h"

/* OpenBLAS's own thread control (not part of CBLAS). */
void openblas_set_num_threads(int num_threads);

typedef struct worker {
    struct rp_session *s;
    int replica;
    rp_comm *comm;
    rp_net *net;
    rp_acts *acts;
    float *opt;
    float *losses; /* D * GA of the last host call */
    rp_status status;
    rp_error err;
    pthread_t thread;
} worker;

/* A run of consecutive variables that share a grouping: one reduction. */
typedef struct var_run {
    size_t offset, count;
    rp_grouping g;
    float rescale;
} var_run;

struct rp_session {
    const rp_model *m;
    rp_config cfg;
    rp_backend backend;
    int R, B, GA, D;
    rp_world *world;
    rp_comm *comm; /* MPI: the world communicator (not owned) */
    int nlocal;
    worker *w;
    rp_grouping *var_group;
    var_run *runs;
    int nruns;
    double loss_scale;
    size_t state_per_param;
    /* host calls to the worker threads */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long gen;
    int done;
    bool quit, threads;
    const float *x;
    const int32_t *y;
    const int64_t *ids;
    long long updates;
    float *all;     /* D * R * GA */
    float *gather;  /* MPI: the ranks' losses, rank by rank */
    float *reduced; /* R */
};

/* ---- one worker's part of a host call ------------------------------------- */

/* Threads of this process wake each other; under MPI the caller reports
** the error and calls rp_comm_fail, which ends the job (the other ranks are
** waiting in a collective). */
static void worker_fail(worker *w, rp_status st, const char *msg) {
    w->status = st;
    if (msg != w->err.msg)
        rp_fail(&w->err, st, "%s", msg);
    if (w->s->backend == RP_BACKEND_LOCAL)
        rp_comm_fail(w->comm, w->err.msg);
}

static void worker_run(worker *w) {
    rp_session *s = w->s;
    int B = s->B, GA = s->GA, c = w->replica;
    size_t in = rp_net_in_size(w->net), n = rp_net_num_params(w->net);
    size_t S = (size_t)B * GA * s->R;
    w->status = RP_OK;
    for (int d = 0; d < s->D; d++) {
        rp_net_zero_grads(w->net);
        for (int mb = 0; mb < GA; mb++) {
            size_t row = d * S + ((size_t)c * GA + mb) * B;
            rp_step_ctx ctx = {.training = true,
                               .seed = s->cfg.seed,
                               .update = (uint64_t)(s->updates + d),
                               .sample_id = s->ids + row,
                               .labels = s->y + row,
                               .loss_scale = s->loss_scale};
            double loss;
            if (!rp_net_forward(w->net, w->acts, s->x + row * in, B, &ctx, &loss)) {
                char msg[RP_ERROR_MAX];
                snprintf(msg, sizeof msg, "replica %d: %s", c, rp_net_error(w->net));
                worker_fail(w, RP_ERR_INVALID, msg);
                return;
            }
            rp_net_backward(w->net, w->acts, NULL, &ctx, false);
            w->losses[(size_t)d * GA + mb] = (float)(loss / B);
        }
        float *g = rp_net_grads(w->net);
        for (int r = 0; r < s->nruns; r++) {
            const var_run *vr = &s->runs[r];
            if (vr->g.group_size > 1) {
                rp_status st = rp_comm_allreduce(w->comm, &vr->g, g + vr->offset, vr->count, &w->err);
                if (st) {
                    w->status = st;
                    if (st != RP_ERR_ABORTED)
                        worker_fail(w, st, w->err.msg);
                    return;
                }
            }
            if (vr->rescale != 1.0f)
                for (size_t i = 0; i < vr->count; i++)
                    g[vr->offset + i] *= vr->rescale;
        }
        rp_optimizer_step(&s->cfg.optimizer, s->updates + d + 1, rp_net_params(w->net), g, w->opt,
                          n);
    }
}

static void *worker_thread(void *arg) {
    worker *w = arg;
    rp_session *s = w->s;
    rp_fpu_fast_denormals();
    unsigned long seen = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->gen == seen && !s->quit)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->quit)
            break;
        seen = s->gen;
        pthread_mutex_unlock(&s->mu);
        worker_run(w);
        pthread_mutex_lock(&s->mu);
        s->done++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- creation ---------------------------------------------------------------- */

static rp_status check_config(const rp_model *m, const rp_config *cfg, rp_error *err) {
    rp_derived d;
    rp_config_derive(cfg, &d);
    if (d.stages != 1 || (cfg->stage_replication_count && cfg->stage_replication[0] != 1))
        return rp_fail(err, RP_ERR_INVALID,
                       "layers_per_stage lists %d stages: sessions run whole-model replicas "
                       "(one stage, stage_replication 1)",
                       d.stages);
    if (m->num_classes == 0 || m->layers[m->num_layers - 1].type != RP_LAYER_SOFTMAX_CE)
        return rp_fail(err, RP_ERR_INVALID,
                       "the model must end with softmax_cross_entropy to be trained");
    int counts[RP_MAX_STAGES];
    return rp_config_stage_layers(cfg, false, m->num_layers, counts, err);
}

void rp_session_free(rp_session *s) {
    if (!s)
        return;
    if (s->threads) {
        pthread_mutex_lock(&s->mu);
        s->quit = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < s->nlocal; i++)
            pthread_join(s->w[i].thread, NULL);
    }
    for (int i = 0; s->w && i < s->nlocal; i++) {
        rp_acts_free(s->w[i].acts);
        rp_net_free(s->w[i].net);
        free(s->w[i].opt), free(s->w[i].losses);
    }
    rp_world_free(s->world);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->w), free(s->var_group), free(s->runs), free(s->all), free(s->gather);
    free(s->reduced);
    free(s);
}

static rp_status create(const rp_model *m, const rp_config *cfg, rp_comm *comm, rp_session **out,
                        rp_error *err) {
    *out = NULL;
    rp_status st = check_config(m, cfg, err);
    if (st)
        return st;
    int R = cfg->replication_factor;
    if (comm && rp_comm_size(comm) != R)
        return rp_fail(err, RP_ERR_INVALID,
                       "the configuration needs %d workers (replication_factor %d x 1 stage) but "
                       "%d MPI ranks were started: run 'mpirun -np %d ...' or set "
                       "replication_factor to %d",
                       R, R, rp_comm_size(comm), R, rp_comm_size(comm));
    rp_session *s = calloc(1, sizeof *s);
    if (!s)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->m = m;
    s->cfg = *cfg;
    s->R = R;
    s->B = cfg->micro_batch_size;
    s->GA = cfg->gradient_accumulation_steps;
    s->D = cfg->device_iterations;
    s->backend = comm ? RP_BACKEND_MPI : RP_BACKEND_LOCAL;
    s->comm = comm;
    s->nlocal = comm ? 1 : R;
    s->var_group = calloc(m->num_vars ? m->num_vars : 1, sizeof(rp_grouping));
    s->runs = calloc(m->num_vars ? m->num_vars : 1, sizeof(var_run));
    s->w = calloc(s->nlocal, sizeof(worker));
    s->all = malloc(sizeof(float) * (size_t)s->D * R * s->GA);
    s->gather = malloc(sizeof(float) * (size_t)s->D * R * s->GA);
    s->reduced = malloc(sizeof(float) * R);
    int *var_index = malloc(sizeof(int) * (m->num_vars ? m->num_vars : 1));
    if (!s->var_group || !s->runs || !s->w || !s->all || !s->gather || !s->reduced || !var_index) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* each variable's grouping: the configuration's, or its layer's own */
    int gcfg = cfg->replica_grouping.group_size;
    s->loss_scale = 1.0 / ((double)s->B * s->GA * gcfg);
    for (int v = 0; v < m->num_vars; v++) {
        const rp_layer *L = &m->layers[m->vars[v].layer];
        s->var_group[v] = cfg->replica_grouping;
        if (L->group_size) {
            rp_error gerr;
            if (rp_grouping_init(&s->var_group[v], R, L->group_size, 1, &gerr)) {
                st = rp_fail(err, RP_ERR_INVALID, "model line %d (%s): %s", L->line,
                             rp_layer_name(L->type), gerr.msg);
                goto fail;
            }
        }
        const rp_variable *var = &m->vars[v];
        var_run *last = s->nruns ? &s->runs[s->nruns - 1] : NULL;
        if (last && rp_grouping_equal(&last->g, &s->var_group[v]) &&
            last->offset + last->count == var->offset) {
            last->count += var->count;
        } else {
            s->runs[s->nruns++] = (var_run){var->offset, var->count, s->var_group[v],
                                            (float)gcfg / s->var_group[v].group_size};
        }
    }
    rp_fpu_fast_denormals();
    openblas_set_num_threads(1); /* one BLAS thread per worker */
    if (!comm && (st = rp_world_create(R, &s->world, err)))
        goto fail;
    s->state_per_param = (size_t)rp_optimizer_state_per_param(&cfg->optimizer);
    for (int i = 0; i < s->nlocal; i++) {
        worker *w = &s->w[i];
        w->s = s;
        w->replica = comm ? rp_comm_rank(comm) : i;
        w->comm = comm ? comm : rp_world_comm(s->world, i);
        if ((st = rp_net_create(m, 0, m->num_layers, s->B, &w->net, err)) ||
            (st = rp_acts_create(w->net, s->B, &w->acts, err)))
            goto fail;
        size_t n = rp_net_num_params(w->net);
        w->opt = calloc(s->state_per_param ? n * s->state_per_param : 1, sizeof(float));
        w->losses = malloc(sizeof(float) * (size_t)s->D * s->GA);
        if (!w->opt || !w->losses) {
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
            goto fail;
        }
        /* replica c starts from its group's row of each variable */
        for (int v = 0; v < m->num_vars; v++)
            var_index[v] = rp_grouping_group_of(&s->var_group[v], w->replica);
        rp_model_init_params(m, 0, m->num_layers, cfg->seed, var_index, rp_net_params(w->net));
    }
    if (cfg->device_memory > 0) {
        rp_memory mem;
        rp_session_memory(s, &mem);
        size_t total = mem.params + mem.grads + mem.optimizer + mem.activations + mem.scratch;
        if (total > (size_t)cfg->device_memory) {
            st = rp_fail(err, RP_ERR_INFEASIBLE,
                         "device_memory: a worker needs %zu bytes but device_memory is %lld: "
                         "parameters %zu, gradients %zu, optimizer state %zu, activations %zu, "
                         "scratch %zu",
                         total, (long long)cfg->device_memory, mem.params, mem.grads,
                         mem.optimizer, mem.activations, mem.scratch);
            goto fail;
        }
    }
    if (s->nlocal > 1) {
        for (int i = 0; i < s->nlocal; i++)
            if (pthread_create(&s->w[i].thread, NULL, worker_thread, &s->w[i]) != 0) {
                /* stop the ones that started */
                s->nlocal = i;
                s->threads = true;
                st = rp_fail(err, RP_ERR_NOMEM, "cannot start worker thread %d", i);
                goto fail;
            }
        s->threads = true;
    }
    free(var_index);
    *out = s;
    return RP_OK;
fail:
    free(var_index);
    rp_session_free(s);
    return st;
}

rp_status rp_session_create(const rp_model *m, const rp_config *cfg, rp_session **out,
                            rp_error *err) {
    return create(m, cfg, NULL, out, err);
}

rp_status rp_session_create_mpi(const rp_model *m, const rp_config *cfg, rp_comm *comm,
                                rp_session **out, rp_error *err) {
    return create(m, cfg, comm, out, err);
}

long long rp_session_samples_per_call(const rp_session *s) {
    return (long long)s->B * s->GA * s->R * s->D;
}

long long rp_session_updates(const rp_session *s) { return s->updates; }
int rp_session_workers(const rp_session *s) { return s->R; }
rp_grouping rp_session_var_grouping(const rp_session *s, int var) { return s->var_group[var]; }

/* ---- host calls ------------------------------------------------------------------ */

rp_status rp_session_run(rp_session *s, const float *x, const int32_t *labels,
                         const int64_t *sample_ids, rp_result *res, rp_error *err) {
    s->x = x;
    s->y = labels;
    s->ids = sample_ids;
    if (s->threads) {
        pthread_mutex_lock(&s->mu);
        s->done = 0;
        s->gen++;
        pthread_cond_broadcast(&s->cv);
        while (s->done < s->nlocal)
            pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
    } else {
        worker_run(&s->w[0]);
    }
    /* the failing worker's own message, not the others' "aborted" */
    const worker *bad = NULL;
    for (int i = 0; i < s->nlocal; i++)
        if (s->w[i].status && (!bad || bad->status == RP_ERR_ABORTED))
            bad = &s->w[i];
    if (bad)
        return rp_fail(err, bad->status, "%s", bad->err.msg);
    int R = s->R, D = s->D, GA = s->GA;
    /* [D][R][GA] from each replica's [D][GA] */
    const float *by_replica = NULL;
    if (s->backend == RP_BACKEND_MPI) {
        rp_status st = rp_comm_allgather(s->comm, NULL, s->w[0].losses, (size_t)D * GA, s->gather,
                                         err);
        if (st)
            return st;
        by_replica = s->gather;
    }
    for (int c = 0; c < R; c++) {
        const float *src = by_replica ? by_replica + (size_t)c * D * GA : s->w[c].losses;
        for (int d = 0; d < D; d++)
            memcpy(s->all + ((size_t)d * R + c) * GA, src + (size_t)d * GA, sizeof(float) * GA);
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

rp_status rp_session_predict(rp_session *s, const float *x, int n, int32_t *pred,
                             rp_error *err) {
    worker *w = &s->w[0];
    size_t in = rp_net_in_size(w->net);
    rp_step_ctx ctx = {.training = false, .seed = s->cfg.seed, .loss_scale = 1.0};
    for (int at = 0; at < n; at += s->B) {
        int rows = n - at < s->B ? n - at : s->B;
        if (!rp_net_forward(w->net, w->acts, x + (size_t)at * in, rows, &ctx, NULL))
            return rp_fail(err, RP_ERR_INVALID, "%s", rp_net_error(w->net));
        rp_net_predictions(w->net, w->acts, pred + at);
    }
    return RP_OK;
}

/* ---- weights ---------------------------------------------------------------------- */

/* Every replica's flat parameters: pointers into the local workers, or,
** under MPI, gathered from all ranks into buf (R * n floats). */
static rp_status all_params(rp_session *s, const float **rows, float **buf, rp_error *err) {
    size_t n = s->m->num_params;
    *buf = NULL;
    if (s->backend == RP_BACKEND_LOCAL) {
        for (int c = 0; c < s->R; c++)
            rows[c] = rp_net_params(s->w[c].net);
        return RP_OK;
    }
    *buf = malloc(sizeof(float) * n * s->R);
    if (!*buf)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    rp_status st = rp_comm_allgather(s->comm, NULL, rp_net_params(s->w[0].net), n, *buf, err);
    for (int c = 0; c < s->R; c++)
        rows[c] = *buf + (size_t)c * n;
    return st;
}

rp_status rp_session_get_weights(rp_session *s, rp_weights_mode mode, rp_weights **out,
                                 rp_error *err) {
    *out = NULL;
    const rp_model *m = s->m;
    const float **rows = malloc(sizeof(float *) * s->R);
    float *buf = NULL;
    rp_weights *w = calloc(1, sizeof *w);
    rp_status st = RP_OK;
    if (!rows || !w || !(w->tensors = calloc(m->num_vars ? m->num_vars : 1, sizeof(rp_tensor)))) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = all_params(s, rows, &buf, err)))
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
            memcpy(t->data + (size_t)k * var->count, rows[c] + var->offset,
                   sizeof(float) * var->count);
        }
    }
done:
    free(rows), free(buf);
    if (st) {
        rp_weights_free(w);
        return st;
    }
    *out = w;
    return RP_OK;
}

rp_status rp_session_set_weights(rp_session *s, const rp_weights *w, rp_weights_mode mode,
                                 rp_error *err) {
    const rp_model *m = s->m;
    /* check everything before writing anything */
    for (int v = 0; v < m->num_vars; v++) {
        const rp_variable *var = &m->vars[v];
        const rp_grouping *g = &s->var_group[v];
        const rp_tensor *t = rp_weights_find(w, var->name);
        char a[64], b[64];
        if (!t)
            return rp_fail(err, RP_ERR_INVALID, "weights: the model's variable '%s' is missing",
                           var->name);
        if (t->shape.ndim != var->shape.ndim ||
            memcmp(t->shape.dim, var->shape.dim, sizeof(int) * t->shape.ndim) != 0)
            return rp_fail(err, RP_ERR_INVALID,
                           "weights: variable '%s' has shape %s in the file but %s in the model",
                           var->name, rp_shape_to_string(&t->shape, a, sizeof a),
                           rp_shape_to_string(&var->shape, b, sizeof b));
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
    for (int i = 0; i < s->nlocal; i++) {
        int c = s->w[i].replica;
        float *p = rp_net_params(s->w[i].net);
        for (int v = 0; v < m->num_vars; v++) {
            const rp_variable *var = &m->vars[v];
            const rp_tensor *t = rp_weights_find(w, var->name);
            int row = t->groups == 1 ? 0
                      : mode == RP_ALL_REPLICAS ? c
                                                : rp_grouping_group_of(&s->var_group[v], c);
            memcpy(p + var->offset, t->data + (size_t)row * var->count,
                   sizeof(float) * var->count);
        }
    }
    return RP_OK;
}

void rp_session_memory(const rp_session *s, rp_memory *out) {
    const worker *w = &s->w[0];
    size_t n = rp_net_num_params(w->net);
    out->params = sizeof(float) * n;
    out->grads = sizeof(float) * n;
    out->optimizer = sizeof(float) * n * s->state_per_param;
    out->activations = rp_acts_bytes(w->net, s->B);
    out->scratch = rp_net_scratch_bytes(w->net);
}
