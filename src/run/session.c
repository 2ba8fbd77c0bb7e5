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
** a configuration may ask of a model is checked first (src/sched/config_check.c), and each
** worker's nets, buffers and first weights are made in setup.c. Each
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
#include "../sched/cache.h"
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
    int counts[RP_MAX_STAGES];
    rp_config_stage_layers(cfg, false, m->num_layers, counts, err);
    rp_derived der;
    rp_config_derive(cfg, &der);
    int P = der.stages, W = der.workers, R = cfg->replication_factor;
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
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->m = m;
    s->cfg = *cfg;
    s->R = R;
    s->P = P;
    s->W = W;
    s->B = cfg->micro_batch_size;
    s->GA = cfg->gradient_accumulation_steps;
    s->D = cfg->device_iterations;
    s->T = rp_config_tensor_parallel(cfg);
    if (s->T > 1) {
        s->tpm = calloc(s->T, sizeof(rp_model *));
        s->tpmap = calloc(s->T, sizeof(size_t *));
        if (!s->tpm || !s->tpmap) {
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory for a session of %d workers", W);
            goto fail;
        }
        for (int k = 0; k < s->T; k++)
            if ((st = rp_model_tensor_split(m, s->T, k, rp_config_tp_flags(cfg), &s->tpm[k],
                                            &s->tpmap[k], err)))
                goto fail;
    }
    for (int t = 0; t < P; t++)
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
    if (!s->var_group || !s->w || !s->all || !s->gather || !s->reduced || !s->labels) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory for a session of %d workers", W);
        goto fail;
    }
    for (int i = 0; i < s->nlocal; i++)
        s->w[i].state_fd = -1; /* no state file yet (0 would be stdin) */
    if (cfg->optimizer_state_offchip) { /* under $TMPDIR, else /tmp */
        const char *tmp = getenv("TMPDIR");
        snprintf(s->run_dir, sizeof s->run_dir, "%s/repipe-run-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(s->run_dir)) {
            st = rp_fail(err, RP_ERR_IO, "optimizer_state_offchip: cannot create a run directory %s",
                         s->run_dir);
            s->run_dir[0] = 0;
            goto fail;
        }
    }
    /* each variable's grouping: the configuration's, or its layer's own */
    int gcfg = cfg->replica_grouping.group_size;
    s->loss_scale = 1.0 / ((double)s->B * s->GA * gcfg);
    if (cfg->schedule == RP_SCHEDULE_PIPEDREAM) /* a micro-batch's mean; the stages average */
        s->loss_scale = 1.0 / s->B;
    s->groupings[s->ngroupings++] = cfg->replica_grouping;
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
        int q = 0;
        while (q < s->ngroupings && !rp_grouping_equal(&s->groupings[q], &s->var_group[v]))
            q++;
        if (q == s->ngroupings) {
            if (q == MAX_GROUPINGS) {
                st = rp_fail(err, RP_ERR_INVALID, "more than %d different groupings in one model",
                             MAX_GROUPINGS);
                goto fail;
            }
            s->groupings[s->ngroupings++] = s->var_group[v];
        }
    }
    /* ties: which stage holds each copy (the workers come with the schedule) */
    for (int l = 0; l < m->num_layers; l++) {
        if (!m->layers[l].tie)
            continue;
        tie *t = &s->ties[s->nties++];
        t->emb_var = m->layers[m->layers[l].tie - 1].first_var;
        t->head_var = m->layers[l].first_var;
        for (int q = 0; q < P; q++) {
            if (m->layers[l].tie - 1 >= s->first[q] && m->layers[l].tie - 1 < s->first[q + 1])
                t->emb_stage = q;
            if (l >= s->first[q] && l < s->first[q + 1])
                t->head_stage = q;
        }
    }
    /* the schedule, checked before anything runs, or a cached one */
    char cpath[RP_PATH_MAX + 32];
    uint64_t ckey = 0;
    bool cached = false;
    if (cfg->executable_cache_dir[0]) {
        char why[160];
        rpi_cache_key(m, cfg, cpath, sizeof cpath, &ckey);
        switch (rpi_cache_load(cpath, ckey, W, P, s->GA, &s->plan, s->mem, why, sizeof why)) {
        case CACHE_HIT:
            cached = true;
            snprintf(s->cache_note, sizeof s->cache_note,
                     "executable cache: reused the schedule and memory plan in %s", cpath);
            break;
        case CACHE_MISS:
            snprintf(s->cache_note, sizeof s->cache_note, "executable cache: stored %s", cpath);
            break;
        case CACHE_REBUILD:
            snprintf(s->cache_note, sizeof s->cache_note,
                     "executable cache: %s was %s; rebuilt it", cpath, why);
            break;
        }
    }
    /* A cache entry is trusted no further than it can be checked: its
    ** schedule must be the one this configuration builds (a forged or
    ** duplicated operation is not), and it passes the hang checker and
    ** memory planning like a fresh one. What the cache still saves is the
    ** file it keeps beside the run's. */
    if (cached) {
        rp_workplan *fresh;
        if ((st = rp_workplan_build(cfg, &fresh, err)))
            goto fail;
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
            cached = false;
            snprintf(s->cache_note, sizeof s->cache_note,
                     "executable cache: %s held another schedule than this configuration's; "
                     "rebuilt it", cpath);
        }
    }
    if (!s->plan && (st = rp_workplan_build(cfg, &s->plan, err)))
        goto fail;
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
    {
        int *gid = malloc(sizeof(int) * W), G = rp_grouping_num_groups(&cfg->replica_grouping);
        if (!gid) {
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory for the schedule check of %d workers", W);
            goto fail;
        }
        for (int k = 0; k < W; k++)
            gid[k] = (s->plan->w[k].stage * G +
                      rp_grouping_group_of(&cfg->replica_grouping, s->plan->w[k].replica)) *
                         s->T + s->plan->w[k].tensor_rank;
        st = rp_workplan_check(s->plan, gid, err);
        free(gid);
        if (st)
            goto fail;
    }
    if ((st = rpi_blas_single(err))) /* one BLAS thread per worker */
        goto fail;
    if (!comm && (st = rp_world_create(W, &s->world, err)))
        goto fail;
    if (comm && v > 1) { /* this rank is device rp_comm_rank(comm) */
        s->rank_of = malloc(sizeof(int) * W);
        s->lidx = calloc(W, sizeof(int));
        if (!s->rank_of || !s->lidx) {
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory for a session of %d workers", W);
            goto fail;
        }
        /* a rank's workers in the order of their stages, so that the i-th
        ** of every rank make their communicators together (a collective
        ** split each): a stage's workers are the same one of their ranks'
        ** (dualpipe's stage h is the first on devices h and P - 1 - h) */
        for (int k = 0; k < W; k++)
            s->rank_of[k] = s->plan->device_of[k];
        for (int k = 0; k < W; k++)
            for (int x = 0; x < W; x++)
                s->lidx[k] += s->rank_of[x] == s->rank_of[k] &&
                              s->plan->w[x].stage < s->plan->w[k].stage;
    }
    s->state_per_param = (size_t)rp_optimizer_state_per_param(&cfg->optimizer);
    for (int i = 0; i < s->nlocal; i++) {
        worker *w = &s->w[i];
        int id = comm ? rp_comm_rank(comm) : i;
        for (int k = 0; s->lidx && k < W; k++) /* its i-th worker */
            if (s->rank_of[k] == id && s->lidx[k] == i)
                id = k, k = W;
        w->comm = comm ? comm : rp_world_comm(s->world, i);
        if ((st = rpi_setup_worker(s, w, id, err)))
            goto fail;
        /* reduction communicators, one per distinct grouping */
        for (int q = 0; q < s->ngroupings; q++) {
            int members[RP_MAX_WORKERS];
            int nm = rpi_reduce_members(s, &s->groupings[q], w->replica, w->stage,
                                        w->tensor_rank, members);
            /* members come out ascending by worker id: the split's order */
            for (int a = 1; a < nm; a++)
                for (int b = a; b > 0 && members[b - 1] > members[b]; b--) {
                    int t = members[b];
                    members[b] = members[b - 1];
                    members[b - 1] = t;
                }
            if (comm) {
                int color = (w->stage * R + rp_grouping_group_of(&s->groupings[q], w->replica)) *
                                s->T + w->tensor_rank;
                for (int j = 0; j < nm; j++) /* servers hold ranks */
                    members[j] = rpi_rank_of(s, members[j]);
                if ((st = rp_comm_split(comm, color, id, &w->reduce[q], err)) ||
                    (st = rp_comm_set_servers(w->reduce[q],
                                              rpi_per_server(members, nm, cfg->workers_per_server),
                                              err)))
                    goto fail;
            } else {
                int me = 0;
                while (members[me] != id)
                    me++;
                if (!(w->reduce[q] = rp_world_subcomm(s->world, members, nm, me))) {
                    st = rp_fail(err, RP_ERR_NOMEM,
                                 "out of memory for worker %d's reduction group", id);
                    goto fail;
                }
            }
        }
    }
    for (int i = 0; i < s->nties && s->plan->devices; i++) { /* the ties' own workers */
        const tie *t = &s->ties[i];
        int members[RP_MAX_WORKERS], nm = 0;
        int emb = rp_workplan_worker(cfg, 0, t->emb_stage, 0);
        int head = rp_workplan_worker(cfg, rp_config_paired(cfg), t->head_stage, 0);
        if (s->plan->device_of[emb] == s->plan->device_of[head])
            continue; /* summed on the device (exchange.c) */
        if (rp_config_paired(cfg)) { /* else a device would hold two of the sum's members */
            st = rp_fail(err, RP_ERR_INVALID,
                         "schedule \"dualpipe\": the tied weights of stages %d and %d must lie "
                         "on one device, stages s and %d - s (the model's first and last)",
                         t->emb_stage, t->head_stage, P - 1);
            goto fail;
        }
        for (int k = 0; k < W && t->emb_stage != t->head_stage; k++)
            if (s->plan->w[k].stage == t->emb_stage || s->plan->w[k].stage == t->head_stage)
                members[nm++] = k;
        if (comm) { /* one split a tie on every rank: its workers, and each other rank alone */
            worker *in = NULL;
            for (int j = 0; j < nm; j++)
                if (rpi_rank_of(s, members[j]) == rp_comm_rank(comm))
                    in = rpi_worker_of(s, members[j]);
            rp_comm *c;
            if ((st = rp_comm_split(comm, in ? 0 : 1 + rp_comm_rank(comm), in ? in->id : 0, &c,
                                    err)))
                goto fail;
            if (in)
                in->tie_comm[i] = c;
            else
                rp_comm_free(c);
            continue;
        }
        for (int j = 0; j < nm; j++)
            if (!(s->w[members[j]].tie_comm[i] = rp_world_subcomm(s->world, members, nm, j))) {
                st = rp_fail(err, RP_ERR_NOMEM, "out of memory for a tie's workers");
                goto fail;
            }
    }
    if (!comm && s->plan->devices && rpi_verdict_at_step(s)) { /* the devices' first workers */
        int leads[RP_MAX_WORKERS], nd = s->plan->devices;
        for (int d = 0; d < nd; d++) /* ascending, as a subcommunicator lists them */
            for (int b = d; b >= 0; b--)
                if (b == 0 || leads[b - 1] < s->plan->dev[d].worker[0]) {
                    memmove(leads + b + 1, leads + b, sizeof(int) * (d - b));
                    leads[b] = s->plan->dev[d].worker[0];
                    break;
                }
        for (int d = 0; d < nd; d++)
            if (!(s->w[leads[d]].dcomm = rp_world_subcomm(s->world, leads, nd, d))) {
                st = rp_fail(err, RP_ERR_NOMEM, "out of memory for the devices' sums");
                goto fail;
            }
    }
    for (int i = 0; i < s->nlocal && s->T > 1; i++) { /* the tensor groups */
        worker *w = &s->w[i];
        int first = w->id - w->tensor_rank, members[RP_MAX_WORKERS];
        for (int k = 0; k < s->T; k++)
            members[k] = first + k;
        if (comm)
            st = rp_comm_split(comm, first, w->tensor_rank, &w->tp, err);
        else if (!(w->tp = rp_world_subcomm(s->world, members, s->T, w->tensor_rank)))
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's tensor group", w->id);
        if (st)
            goto fail;
    }
    for (int t = 0; t < P; t++) {
        rp_memory mem;
        if ((st = rpi_plan_memory(s, t, &mem, err)))
            goto fail;
        if (cached && memcmp(&mem, &s->mem[t], sizeof mem) != 0) {
            cached = false;
            snprintf(s->cache_note, sizeof s->cache_note,
                     "executable cache: %s held another memory plan than this configuration's; "
                     "rebuilt it", cpath);
        }
        s->mem[t] = mem;
    }
    if (cfg->device_memory > 0) {
        for (int t = 0; t < P; t++) {
            const rp_memory mem = s->mem[t];
            size_t total = mem.params + mem.grads + mem.optimizer + mem.activations + mem.scratch;
            if (total > (size_t)cfg->device_memory) {
                st = rp_fail(err, RP_ERR_INFEASIBLE,
                             "device_memory: a worker of stage %d needs %zu bytes but "
                             "device_memory is %lld: parameters %zu, gradients %zu, optimizer "
                             "state %zu, activations %zu, scratch %zu",
                             t, total, (long long)cfg->device_memory, mem.params, mem.grads,
                             mem.optimizer, mem.activations, mem.scratch);
                goto fail;
            }
        }
    }
    if (cfg->executable_cache_dir[0] && !cached && (!comm || rp_comm_rank(comm) == 0)) {
        mkdir(cfg->executable_cache_dir, 0777); /* one level; an existing one is fine */
        rp_error why; /* the cache only saves time: without it the run goes on */
        if (rpi_cache_store(cpath, ckey, s->plan, s->mem, &why))
            snprintf(s->cache_note, sizeof s->cache_note,
                     "executable cache: not stored (%s); the run goes on without it", why.msg);
    }
    /* worker 0 runs on the calling thread, the others on threads of their
    ** own; a device's workers on its first one's */
    const rp_workplan *pl = s->plan;
    if (pl->devices)
        s->spin = pl->devices <= sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 1; i < s->nlocal && !comm; i++) {
        if (pl->devices && pl->dev[pl->device_of[i]].worker[0] != i)
            continue;
        if (pthread_create(&s->w[i].thread, NULL, rpi_worker_thread, &s->w[i]) != 0) {
            st = rp_fail(err, RP_ERR_NOMEM, "cannot start worker thread %d", i);
            goto fail; /* those started are stopped by free */
        }
        s->w[i].threaded = true;
        s->started++;
    }
    *out = s;
    return RP_OK;
fail:
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
