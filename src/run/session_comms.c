/*
** A session's workers set up, and the communicators they sum over: each
** worker's reduction groups (one a distinct replica grouping), the tied
** weights' workers, the devices' first workers (a device's verdicts) and
** the tensor groups. Threads get subcommunicators of the session's world;
** MPI ranks split the world communicator, every rank in every split, in
** the same order (session.c places the workers so that they do).
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "session_impl.h"
#include "../sched/servers.h"

/* Worker w's communicator for grouping q: the workers that reduce with it,
** ascending by worker id (the split's order). */
static rp_status reduction_group(rp_session *s, worker *w, int q, rp_error *err) {
    int members[RP_MAX_WORKERS];
    int nm = rpi_reduce_members(s, &s->groupings[q], w->replica, w->stage, w->tensor_rank,
                                members);
    for (int a = 1; a < nm; a++)
        for (int b = a; b > 0 && members[b - 1] > members[b]; b--) {
            int t = members[b];
            members[b] = members[b - 1];
            members[b - 1] = t;
        }
    if (!s->comm) {
        int me = 0;
        while (members[me] != w->id)
            me++;
        if (!(w->reduce[q] = rp_world_subcomm(s->world, members, nm, me)))
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's reduction group",
                           w->id);
        return RP_OK;
    }
    int color = (w->stage * s->R + rp_grouping_group_of(&s->groupings[q], w->replica)) * s->T +
                w->tensor_rank;
    for (int j = 0; j < nm; j++) /* servers hold ranks */
        members[j] = rpi_rank_of(s, members[j]);
    rp_status st = rp_comm_split(s->comm, color, w->id, &w->reduce[q], err);
    if (!st)
        st = rp_comm_set_servers(w->reduce[q],
                                 rpi_per_server(members, nm, s->cfg.workers_per_server), err);
    return st;
}

/* Each of this process's workers set up (setup.c), with its reduction
** groups. Local worker i is worker i; under MPI a rank's i-th worker. */
static rp_status workers(rp_session *s, rp_error *err) {
    for (int i = 0; i < s->nlocal; i++) {
        worker *w = &s->w[i];
        int id = s->comm ? rp_comm_rank(s->comm) : i;
        for (int k = 0; s->lidx && k < s->W; k++) /* its i-th worker */
            if (s->rank_of[k] == id && s->lidx[k] == i)
                id = k, k = s->W;
        w->comm = s->comm ? s->comm : rp_world_comm(s->world, i);
        rp_status st = rpi_setup_worker(s, w, id, err);
        for (int q = 0; !st && q < s->ngroupings; q++)
            st = reduction_group(s, w, q, err);
        if (st)
            return st;
    }
    return RP_OK;
}

/* Tie i's own workers, where its two copies lie on different devices
** (summed on one device otherwise: exchange.c). */
static rp_status tie_group(rp_session *s, int i, rp_error *err) {
    const rp_config *cfg = &s->cfg;
    const tie *t = &s->ties[i];
    int members[RP_MAX_WORKERS], nm = 0;
    int emb = rp_workplan_worker(cfg, 0, t->emb_stage, 0);
    int head = rp_workplan_worker(cfg, rp_config_paired(cfg), t->head_stage, 0);
    if (s->plan->device_of[emb] == s->plan->device_of[head])
        return RP_OK;
    if (rp_config_paired(cfg)) /* else a device would hold two of the sum's members */
        return rp_fail(err, RP_ERR_INVALID,
                       "schedule \"dualpipe\": the tied weights of stages %d and %d must lie "
                       "on one device, stages s and %d - s (the model's first and last)",
                       t->emb_stage, t->head_stage, s->P - 1);
    for (int k = 0; k < s->W && t->emb_stage != t->head_stage; k++)
        if (s->plan->w[k].stage == t->emb_stage || s->plan->w[k].stage == t->head_stage)
            members[nm++] = k;
    if (s->comm) { /* one split a tie on every rank: its workers, and each other rank alone */
        int rank = rp_comm_rank(s->comm);
        worker *in = NULL;
        for (int j = 0; j < nm; j++)
            if (rpi_rank_of(s, members[j]) == rank)
                in = rpi_worker_of(s, members[j]);
        rp_comm *c;
        rp_status st = rp_comm_split(s->comm, in ? 0 : 1 + rank, in ? in->id : 0, &c, err);
        if (st)
            return st;
        if (in)
            in->tie_comm[i] = c;
        else
            rp_comm_free(c);
        return RP_OK;
    }
    for (int j = 0; j < nm; j++)
        if (!(s->w[members[j]].tie_comm[i] = rp_world_subcomm(s->world, members, nm, j)))
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for a tie's workers");
    return RP_OK;
}

/* On threads, where a device's step gives verdicts (loss scaling, clipping):
** the devices' first workers, ascending as a subcommunicator lists them. */
static rp_status device_group(rp_session *s, rp_error *err) {
    if (s->comm || !s->plan->devices || !rpi_verdict_at_step(s))
        return RP_OK;
    int leads[RP_MAX_WORKERS], nd = s->plan->devices;
    for (int d = 0; d < nd; d++)
        for (int b = d; b >= 0; b--)
            if (b == 0 || leads[b - 1] < s->plan->dev[d].worker[0]) {
                memmove(leads + b + 1, leads + b, sizeof(int) * (d - b));
                leads[b] = s->plan->dev[d].worker[0];
                break;
            }
    for (int d = 0; d < nd; d++)
        if (!(s->w[leads[d]].dcomm = rp_world_subcomm(s->world, leads, nd, d)))
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for the devices' sums");
    return RP_OK;
}

/* Each worker's tensor group: the T workers from its group's first. */
static rp_status tensor_group(rp_session *s, worker *w, rp_error *err) {
    int first = w->id - w->tensor_rank, members[RP_MAX_WORKERS];
    for (int k = 0; k < s->T; k++)
        members[k] = first + k;
    if (s->comm)
        return rp_comm_split(s->comm, first, w->tensor_rank, &w->tp, err);
    if (!(w->tp = rp_world_subcomm(s->world, members, s->T, w->tensor_rank)))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's tensor group", w->id);
    return RP_OK;
}

/* Each worker's expert-parallel group: the workers of its stage, stage
** replica and tensor rank in the G consecutive replicas from its group's
** first (they run the same operations). */
static rp_status expert_group(rp_session *s, worker *w, rp_error *err) {
    int G = s->cfg.expert_parallel, first = w->replica - w->replica % G, members[RP_MAX_WORKERS];
    for (int i = 0; i < G; i++)
        members[i] = rp_workplan_worker(&s->cfg, first + i, w->stage, w->stage_replica) +
                     w->tensor_rank;
    if (s->comm) /* a color no other group of the split has: its first member */
        return rp_comm_split(s->comm, members[0], w->replica % G, &w->ep, err);
    if (!(w->ep = rp_world_subcomm(s->world, members, G, w->replica % G)))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for worker %d's expert group", w->id);
    return RP_OK;
}

rp_status rpi_session_comms(rp_session *s, rp_error *err) {
    rp_status st = workers(s, err);
    for (int i = 0; !st && i < s->nties && s->plan->devices; i++)
        st = tie_group(s, i, err);
    if (!st)
        st = device_group(s, err);
    for (int i = 0; !st && i < s->nlocal && s->T > 1; i++)
        st = tensor_group(s, &s->w[i], err);
    for (int i = 0; !st && i < s->nlocal && s->cfg.expert_parallel > 1; i++)
        st = expert_group(s, &s->w[i], err);
    return st;
}
