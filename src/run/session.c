/*
** Sessions: R replicas of a pipeline of P stages, stage s replicated r_s
** times inside each replica (docs/replicas.md, docs/pipelines.md).
**
** Every worker runs the operation list the schedule gives it (forwards,
** backwards, sends and receives of micro-batches tagged by their number),
** then the gradients of each variable are SUM-reduced once per update among
** the workers that hold the same group's copy: every stage replica of the
** variable's stage in every replica of the group. Then each worker applies
** the same optimizer step to its flat buffers.
**
** The loss gradient is scaled once, at the loss layer, by 1 / (samples of
** the update in a group) = 1 / (B * GA * g) for the configuration's group
** size g. A layer whose own group_size differs (a per-replica head, say) has
** its reduced gradient rescaled by g / g_layer, so that it too is the mean
** over its group's samples.
**
** On the local backend the calling thread is worker 0 and every other
** worker is a thread that waits for host calls: W workers take W threads,
** none of them idle while the others work. Under MPI this process is one
** worker (its rank) and the others are ranks.
**
** This file makes sessions, and session_run.c runs their host calls; what
** a configuration may ask of a model is checked first (session_check.c), each
** worker's nets, buffers and first weights are made in setup.c and its
** communicators in session_comms.c. Each
** worker's operation loop is in worker.c, the gradient exchange and the
** optimizer step in exchange.c, weights and the whole training state in
** state.c, inference in inference.c, the memory plan and traces in
** memory.c, and what a configuration makes of a stage's nets and
** reductions (which every one of them reads) in layout.c; session_impl.h
** is what they share.
*/
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core/blas.h"
#include "../core/util.h"
#include "cache.h"
#include "session_impl.h"
#include "../sched/servers.h"
#include "../sched/sharding.h"

/* ---- creation ---------------------------------------------------------------- */

void rp_session_free(rp_session *s) {
    if (!s)
        return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->quit = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        for (int i = 1; i < s->nlocal; i++)
            if (s->w[i].threaded)
                pthread_join(s->w[i].thread, NULL);
    }
    for (int i = 0; s->w && i < s->nlocal; i++) {
        worker *w = &s->w[i];
        for (int k = 0; w->acts && w->plan && k < w->plan->slots; k++)
            rp_acts_free(w->acts[k]);
        for (int q = 0; q < s->ngroupings; q++)
            rp_comm_free(w->reduce[q]);
        rp_comm_free(w->tp);
        rp_comm_free(w->ep);
        for (int i = 0; i < MAX_TIES; i++)
            rp_comm_free(w->tie_comm[i]);
        if (w->net && w->own) /* a pass that failed may have left another version in */
            rp_net_use_params(w->net, w->own);
        rp_net_free(w->net);
        free(w->acts), free(w->out), free(w->opt), free(w->losses), free(w->grad_in);
        free(w->grad_out), free(w->req), free(w->req_live), free(w->runs), free(w->trace);
        free(w->breq), free(w->breq_comm), free(w->bstart), free(w->bscratch);
        free(w->shard_g), free(w->shard_p), free(w->tail), free(w->chunk);
        free(w->h_act), free(w->h_grad), free(w->h_recv), free(w->h_stage), free(w->tie_buf);
        free(w->parts);
        rp_comm_free(w->dcomm);
        free(w->stash), free(w->stale), free(w->history), free(w->version_of), free(w->slot_ver);
        if (w->state_fd >= 0) {
            char path[RP_PATH_MAX + 32];
            snprintf(path, sizeof path, "%s/worker-%d.state", s->run_dir, w->id);
            close(w->state_fd);
            unlink(path);
        }
    }
    if (s->run_dir[0])
        rmdir(s->run_dir);
    rp_world_free(s->world);
    rp_workplan_free(s->plan);
    for (int k = 0; s->tpm && k < s->T; k++) {
        rp_model_free(s->tpm[k]);
        free(s->tpmap[k]);
    }
    free(s->tpm), free(s->tpmap);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->w), free(s->var_group), free(s->all), free(s->gather), free(s->reduced);
    free(s->labels), free(s->rank_of), free(s->lidx);
    free(s);
}

/* The session's fields and buffers from the configuration (checked): its
** shape, its tensor-parallel models, the call's loss and label buffers and
** optimizer_state_offchip's run directory. */
static rp_status init_session(rp_session *s, const rp_model *m, const rp_config *cfg,
                              rp_comm *comm, int v, rp_error *err) {
    int counts[RP_MAX_STAGES];
    rp_config_stage_layers(cfg, false, m->num_layers, counts, err);
    rp_derived der;
    rp_config_derive(cfg, &der);
    int R = cfg->replication_factor, W = der.workers;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->m = m;
    s->cfg = *cfg;
    s->R = R;
    s->P = der.stages;
    s->W = W;
    s->B = cfg->micro_batch_size;
    s->GA = cfg->gradient_accumulation_steps;
    s->D = cfg->device_iterations;
    s->T = rp_config_tensor_parallel(cfg);
    for (int t = 0; t < s->P; t++)
        s->first[t + 1] = s->first[t] + counts[t];
    s->backend = comm ? RP_BACKEND_MPI : RP_BACKEND_LOCAL;
    s->comm = comm;
    s->nlocal = comm ? v : W;
    s->spin = s->nlocal <= sysconf(_SC_NPROCESSORS_ONLN);
    s->var_group = calloc(m->num_vars ? m->num_vars : 1, sizeof(rp_grouping));
    s->w = calloc(s->nlocal, sizeof(worker));
    s->all = malloc(sizeof(float) * (size_t)s->D * R * s->GA);
    s->gather = malloc(sizeof(float) * (size_t)s->D * W * s->GA);
    s->reduced = malloc(sizeof(float) * R);
    s->labels = malloc(sizeof(int32_t) * (size_t)s->D * R * s->GA * s->B * m->num_targets);
    if (s->T > 1) {
        s->tpm = calloc(s->T, sizeof(rp_model *));
        s->tpmap = calloc(s->T, sizeof(size_t *));
    }
    if (!s->var_group || !s->w || !s->all || !s->gather || !s->reduced || !s->labels ||
        (s->T > 1 && (!s->tpm || !s->tpmap)))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a session of %d workers", W);
    for (int k = 0; k < s->T && s->T > 1; k++) {
        rp_status st = rp_model_tensor_split(m, s->T, k, rp_config_tp_flags(cfg), &s->tpm[k],
                                             &s->tpmap[k], err);
        if (st)
            return st;
    }
    for (int i = 0; i < s->nlocal; i++)
        s->w[i].state_fd = -1; /* no state file yet (0 would be stdin) */
    if (cfg->optimizer_state_offchip) { /* under $TMPDIR, else /tmp */
        const char *tmp = getenv("TMPDIR");
        snprintf(s->run_dir, sizeof s->run_dir, "%s/repipe-run-XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(s->run_dir)) {
            rp_status st = rp_fail(err, RP_ERR_IO, "optimizer_state_offchip: cannot create a "
                                   "run directory %s", s->run_dir);
            s->run_dir[0] = 0;
            return st;
        }
    }
    s->state_per_param = (size_t)rp_optimizer_state_per_param(&cfg->optimizer);
    return RP_OK;
}

/* Each variable's grouping (the configuration's, or its layer's own), the
** distinct ones, and the loss's scale; which stage holds each tie's copy
** (the workers come with the schedule). */
static rp_status groupings_and_ties(rp_session *s, rp_error *err) {
    const rp_model *m = s->m;
    const rp_config *cfg = &s->cfg;
    int gcfg = cfg->replica_grouping.group_size;
    s->loss_scale = 1.0 / ((double)s->B * s->GA * gcfg);
    if (cfg->schedule == RP_SCHEDULE_PIPEDREAM) /* a micro-batch's mean; the stages average */
        s->loss_scale = 1.0 / s->B;
    s->groupings[s->ngroupings++] = cfg->replica_grouping;
    for (int v = 0; v < m->num_vars; v++) {
        const rp_layer *L = &m->layers[m->vars[v].layer];
        s->var_group[v] = cfg->replica_grouping;
        rp_error gerr;
        if (L->group_size && rp_grouping_init(&s->var_group[v], s->R, L->group_size, 1, &gerr))
            return rp_fail(err, RP_ERR_INVALID, "model line %d (%s): %s", L->line,
                           rp_layer_name(L->type), gerr.msg);
        int q = 0;
        while (q < s->ngroupings && !rp_grouping_equal(&s->groupings[q], &s->var_group[v]))
            q++;
        if (q == s->ngroupings && q == MAX_GROUPINGS)
            return rp_fail(err, RP_ERR_INVALID, "more than %d different groupings in one model",
                           MAX_GROUPINGS);
        if (q == s->ngroupings)
            s->groupings[s->ngroupings++] = s->var_group[v];
    }
    for (int l = 0; l < m->num_layers; l++) {
        if (!m->layers[l].tie)
            continue;
        tie *t = &s->ties[s->nties++];
        t->emb_var = m->layers[m->layers[l].tie - 1].first_var;
        t->head_var = m->layers[l].first_var;
        for (int q = 0; q < s->P; q++) {
            if (m->layers[l].tie - 1 >= s->first[q] && m->layers[l].tie - 1 < s->first[q + 1])
                t->emb_stage = q;
            if (l >= s->first[q] && l < s->first[q + 1])
                t->head_stage = q;
        }
    }
    return RP_OK;
}

/* The executable cache as a session uses it: its file and key, and whether
** the schedule and memory plan came from it. */
typedef struct cache_use {
    char path[RP_PATH_MAX + 32];
    uint64_t key;
    bool cached;
} cache_use;

/* The cached schedule, where there is one, read. A cache entry is trusted
** no further than it can be checked: its schedule must be the one this
** configuration builds (a forged or duplicated operation is not), and it
** passes the hang checker and memory planning like a fresh one. What the
** cache still saves is the file it keeps beside the run's. */
static rp_status read_cache(rp_session *s, cache_use *c, rp_error *err) {
    const rp_config *cfg = &s->cfg;
    char why[160];
    rpi_cache_key(s->m, cfg, c->path, sizeof c->path, &c->key);
    switch (rpi_cache_load(c->path, c->key, s->W, s->P, s->GA, &s->plan, s->mem, why,
                           sizeof why)) {
    case CACHE_HIT:
        c->cached = true;
        snprintf(s->cache_note, sizeof s->cache_note,
                 "executable cache: reused the schedule and memory plan in %s", c->path);
        break;
    case CACHE_MISS:
        snprintf(s->cache_note, sizeof s->cache_note, "executable cache: stored %s", c->path);
        break;
    case CACHE_REBUILD:
        snprintf(s->cache_note, sizeof s->cache_note,
                 "executable cache: %s was %s; rebuilt it", c->path, why);
        break;
    }
    if (!c->cached)
        return RP_OK;
    rp_workplan *fresh;
    rp_status st = rp_workplan_build(cfg, &fresh, err);
    if (st)
        return st;
    bool same = fresh->workers == s->plan->workers && fresh->stages == s->plan->stages;
    for (int k = 0; same && k < fresh->workers; k++) {
        const rp_worker_ops *a = &fresh->w[k], *b = &s->plan->w[k];
        same = a->num_ops == b->num_ops && a->slots == b->slots && a->stage == b->stage &&
               a->replica == b->replica && a->stage_replica == b->stage_replica &&
               memcmp(a->ops, b->ops, sizeof(rp_op) * a->num_ops) == 0;
    }
    rp_workplan_free(s->plan);
    s->plan = fresh;
    if (!same) {
        c->cached = false;
        snprintf(s->cache_note, sizeof s->cache_note,
                 "executable cache: %s held another schedule than this configuration's; "
                 "rebuilt it", c->path);
    }
    return RP_OK;
}

/* The schedule, built (or the cache's) and checked free of waits before
** anything runs; the ties' workers from it. */
static rp_status schedule(rp_session *s, cache_use *c, rp_error *err) {
    const rp_config *cfg = &s->cfg;
    int W = s->W;
    rp_status st;
    if (cfg->executable_cache_dir[0] && (st = read_cache(s, c, err)))
        return st;
    if (!s->plan && (st = rp_workplan_build(cfg, &s->plan, err)))
        return st;
    for (int i = 0; i < s->nties; i++) { /* the first worker of each stage speaks for it */
        tie *t = &s->ties[i];
        t->emb_rep = t->head_rep = -1;
        for (int k = W - 1; k >= 0; k--) {
            if (s->plan->w[k].stage == t->emb_stage)
                t->emb_rep = k;
            if (s->plan->w[k].stage == t->head_stage)
                t->head_rep = k;
        }
    }
    int *gid = malloc(sizeof(int) * W), G = rp_grouping_num_groups(&cfg->replica_grouping);
    if (!gid)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the schedule check of %d workers",
                       W);
    for (int k = 0; k < W; k++)
        gid[k] = (s->plan->w[k].stage * G +
                  rp_grouping_group_of(&cfg->replica_grouping, s->plan->w[k].replica)) *
                     s->T + s->plan->w[k].tensor_rank;
    st = rp_workplan_check(s->plan, gid, err);
    free(gid);
    return st;
}

/* Under MPI with v workers a rank: which rank holds each worker, and its
** place there. A rank's workers go in the order of their stages, so that
** the i-th of every rank make their communicators together (a collective
** split each): a stage's workers are the same one of their ranks'
** (dualpipe's stage h is the first on devices h and P - 1 - h). */
static rp_status place_workers(rp_session *s, int v, rp_error *err) {
    int W = s->W;
    if (!s->comm || v <= 1)
        return RP_OK;
    s->rank_of = malloc(sizeof(int) * W);
    s->lidx = calloc(W, sizeof(int));
    if (!s->rank_of || !s->lidx)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a session of %d workers", W);
    for (int k = 0; k < W; k++)
        s->rank_of[k] = s->plan->device_of[k];
    for (int k = 0; k < W; k++)
        for (int x = 0; x < W; x++)
            s->lidx[k] += s->rank_of[x] == s->rank_of[k] &&
                          s->plan->w[x].stage < s->plan->w[k].stage;
    return RP_OK;
}

/* Each stage's memory plan (a cached one must be the same), held to
** device_memory; a fresh schedule and plan stored in the cache. */
static rp_status memory(rp_session *s, cache_use *c, rp_error *err) {
    const rp_config *cfg = &s->cfg;
    for (int t = 0; t < s->P; t++) {
        rp_memory mem;
        rp_status st = rpi_plan_memory(s, t, &mem, err);
        if (st)
            return st;
        if (c->cached && memcmp(&mem, &s->mem[t], sizeof mem) != 0) {
            c->cached = false;
            snprintf(s->cache_note, sizeof s->cache_note,
                     "executable cache: %s held another memory plan than this configuration's; "
                     "rebuilt it", c->path);
        }
        s->mem[t] = mem;
        size_t total = mem.params + mem.grads + mem.optimizer + mem.activations + mem.scratch;
        if (cfg->device_memory > 0 && total > (size_t)cfg->device_memory)
            return rp_fail(err, RP_ERR_INFEASIBLE,
                           "device_memory: a worker of stage %d needs %zu bytes but "
                           "device_memory is %lld: parameters %zu, gradients %zu, optimizer "
                           "state %zu, activations %zu, scratch %zu",
                           t, total, (long long)cfg->device_memory, mem.params, mem.grads,
                           mem.optimizer, mem.activations, mem.scratch);
    }
    if (cfg->executable_cache_dir[0] && !c->cached && (!s->comm || rp_comm_rank(s->comm) == 0)) {
        mkdir(cfg->executable_cache_dir, 0777); /* one level; an existing one is fine */
        rp_error why; /* the cache only saves time: without it the run goes on */
        if (rpi_cache_store(c->path, c->key, s->plan, s->mem, &why))
            snprintf(s->cache_note, sizeof s->cache_note,
                     "executable cache: not stored (%s); the run goes on without it", why.msg);
    }
    return RP_OK;
}

/* Worker 0 runs on the calling thread, the others on threads of their
** own; a device's workers on its first one's. */
static rp_status start_threads(rp_session *s, rp_error *err) {
    const rp_workplan *pl = s->plan;
    if (pl->devices)
        s->spin = pl->devices <= sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 1; i < s->nlocal && !s->comm; i++) {
        if (pl->devices && pl->dev[pl->device_of[i]].worker[0] != i)
            continue;
        if (pthread_create(&s->w[i].thread, NULL, rpi_worker_thread, &s->w[i]) != 0)
            return rp_fail(err, RP_ERR_NOMEM, "cannot start worker thread %d", i);
        s->w[i].threaded = true; /* those started are stopped by free */
        s->started++;
    }
    return RP_OK;
}

/* A session, in the steps above: the configuration fitted and checked, the
** session's shape, its groupings and ties, the schedule, the workers placed
** and set up with their communicators (session_comms.c), the memory plan,
** the threads. */
static rp_status create(const rp_model *m, const rp_config *cfg, rp_comm *comm, rp_session **out,
                        rp_error *err) {
    *out = NULL;
    if (cfg->layers_count_blocks) { /* an IPUConfig file's lists, as counts of m's layers */
        rp_config *fit = malloc(sizeof *fit);
        if (!fit)
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for a configuration");
        *fit = *cfg;
        rp_status st = rp_session_fit_config(m, fit, err);
        if (!st)
            st = create(m, fit, comm, out, err);
        free(fit);
        return st;
    }
    rp_status st = rp_session_check(m, cfg, err);
    if (st)
        return st;
    rp_derived der;
    rp_config_derive(cfg, &der);
    int W = der.workers, R = cfg->replication_factor;
    int v = W / rp_config_devices(cfg, &der); /* workers a rank holds */
    if (comm && rp_comm_size(comm) != W / v)
        return rp_fail(err, RP_ERR_INVALID,
                       "the configuration needs %d %s (replication_factor %d x %d per "
                       "replica) but %d MPI ranks were started: run 'mpirun -np %d ...'",
                       W / v, v > 1 ? "devices" : "workers", R, W / v / R, rp_comm_size(comm),
                       W / v);
    rp_session *s = calloc(1, sizeof *s);
    if (!s)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a session of %d workers", W);
    cache_use cache = {.cached = false};
    st = init_session(s, m, cfg, comm, v, err);
    if (!st)
        st = groupings_and_ties(s, err);
    if (!st)
        st = schedule(s, &cache, err);
    if (!st)
        st = rpi_expert_order_check(s, err);
    if (!st)
        st = rpi_blas_single(err); /* one BLAS thread per worker */
    if (!st && !comm)
        st = rp_world_create(W, &s->world, err);
    if (!st)
        st = place_workers(s, v, err);
    if (!st)
        st = rpi_session_comms(s, err);
    if (!st)
        st = memory(s, &cache, err);
    if (!st)
        st = start_threads(s, err);
    if (!st) {
        *out = s;
        return RP_OK;
    }
    rp_session_free(s);
    return st;
}

/* The calling thread computes as worker 0, with denormals flushed as on the
** other workers' threads; it gets its own floating-point mode back after
** each call. */
rp_status rp_session_create(const rp_model *m, const rp_config *cfg, rp_session **out,
                            rp_error *err) {
    unsigned fpu = rpi_fpu_enter();
    rp_status st = create(m, cfg, NULL, out, err);
    rpi_fpu_leave(fpu);
    return st;
}

rp_status rp_session_create_mpi(const rp_model *m, const rp_config *cfg, rp_comm *comm,
                                rp_session **out, rp_error *err) {
    unsigned fpu = rpi_fpu_enter();
    rp_status st = create(m, cfg, comm, out, err);
    rpi_fpu_leave(fpu);
    return st;
}

long long rp_session_samples_per_call(const rp_session *s) {
    return (long long)s->B * s->GA * s->R * s->D;
}

long long rp_session_updates(const rp_session *s) { return s->updates; }

const char *rp_session_cache_note(const rp_session *s) { return s->cache_note; }

void rp_session_last_update(const rp_session *s, double *lr, double *grad_norm) {
    *lr = s->w[0].opt_now.lr;
    *grad_norm = s->w[0].grad_norm;
}

void rp_session_loss_scale(const rp_session *s, double *scale, long long *skipped) {
    *scale = s->w[0].scale; /* every worker took the same decisions */
    *skipped = s->w[0].skipped;
}
int rp_session_workers(const rp_session *s) { return s->W; }
int rp_session_stages(const rp_session *s) { return s->P; }
rp_grouping rp_session_var_grouping(const rp_session *s, int var) { return s->var_group[var]; }
