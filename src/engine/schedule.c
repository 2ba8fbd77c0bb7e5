/*
** Schedules: building each worker's operation list, and checking it by
** simulation.
*/
#include "repipe/schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *rp_op_name(rp_op_kind k) {
    static const char *const names[] = {"receive activation", "forward", "send activation",
                                        "receive gradient", "backward", "send gradient",
                                        "wait for sends", "reduce", "step"};
    _Static_assert(sizeof names / sizeof names[0] == RP_OP_COUNT, "a name for every kind");
    return k >= 0 && k < RP_OP_COUNT ? names[k] : "?";
}

int rp_workplan_worker(const rp_config *cfg, int c, int s, int j) {
    int P = cfg->layers_per_stage.count, per = 0, before = 0;
    for (int t = 0; t < P; t++) {
        if (t < s)
            before += rp_config_stage_replicas(cfg, t);
        per += rp_config_stage_replicas(cfg, t);
    }
    return c * per + before + j;
}

void rp_workplan_free(rp_workplan *s) {
    if (!s)
        return;
    for (int i = 0; i < s->workers; i++)
        free(s->w[i].ops);
    free(s->w);
    free(s);
}

static void push(rp_worker_ops *w, rp_op_kind k, int mb, int peer) {
    w->ops[w->num_ops++] = (rp_op){k, mb, peer, -1};
}

/* A micro-batch's forward (with its receive and send) or backward. */
static void add_pass(const rp_config *cfg, rp_worker_ops *w, bool forward, int mb) {
    int P = cfg->layers_per_stage.count, s = w->stage, c = w->replica;
    if (forward) {
        if (s > 0)
            push(w, RP_OP_RECV_ACT, mb, rp_workplan_worker(cfg, c, s - 1, mb % rp_config_stage_replicas(cfg, s - 1)));
        push(w, RP_OP_FORWARD, mb, -1);
        if (s < P - 1)
            push(w, RP_OP_SEND_ACT, mb, rp_workplan_worker(cfg, c, s + 1, mb % rp_config_stage_replicas(cfg, s + 1)));
    } else {
        if (s < P - 1)
            push(w, RP_OP_RECV_GRAD, mb, rp_workplan_worker(cfg, c, s + 1, mb % rp_config_stage_replicas(cfg, s + 1)));
        push(w, RP_OP_BACKWARD, mb, -1);
        if (s > 0)
            push(w, RP_OP_SEND_GRAD, mb, rp_workplan_worker(cfg, c, s - 1, mb % rp_config_stage_replicas(cfg, s - 1)));
    }
}

/* A balanced pipeline completes a micro-batch per stage replica every
** f + b; one that enters stage s returns after every stage from s on has
** run it. By Little's law the stage then needs as many micro-batches in
** flight as there are workers from s to the end of the replica: r_s + ... +
** r_{P-1}, which is P - s without stage replication and PipeDream's
** workers / r_0 per input-stage replica. The counts fall along the pipeline,
** so a stage always has sent the forwards that the next one's warm-up
** waits for. */
int rp_workplan_in_flight(const rp_config *cfg, int s) {
    int P = cfg->layers_per_stage.count, GA = cfg->gradient_accumulation_steps, n = 0;
    if (cfg->schedule == RP_SCHEDULE_GPIPE)
        return GA;
    for (int t = s; t < P; t++)
        n += rp_config_stage_replicas(cfg, t);
    return n < GA ? n : GA;
}

rp_status rp_workplan_build(const rp_config *cfg, rp_workplan **out, rp_error *err) {
    *out = NULL;
    int P = cfg->layers_per_stage.count, R = cfg->replication_factor;
    int GA = cfg->gradient_accumulation_steps, per = 0;
    for (int s = 0; s < P; s++)
        per += rp_config_stage_replicas(cfg, s);
    rp_workplan *sc = calloc(1, sizeof *sc);
    if (!sc || !(sc->w = calloc((size_t)R * per, sizeof(rp_worker_ops)))) {
        free(sc);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the schedules of %d workers", R * per);
    }
    sc->workers = R * per;
    sc->stages = P;
    /* the stage's order as one worker would run it: (forward?, mb) pairs */
    int *order_fw = malloc(sizeof(int) * 2 * GA), *order_mb = malloc(sizeof(int) * 2 * GA);
    int *slot_of = malloc(sizeof(int) * GA), *free_slots = malloc(sizeof(int) * GA);
    if (!order_fw || !order_mb || !slot_of || !free_slots) {
        free(order_fw), free(order_mb), free(slot_of), free(free_slots);
        rp_workplan_free(sc);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a schedule of %d micro-batches", GA);
    }
    for (int c = 0; c < R; c++)
        for (int s = 0; s < P; s++) {
            int n = 0;
            if (cfg->schedule == RP_SCHEDULE_GPIPE) {
                for (int m = 0; m < GA; m++)
                    order_fw[n] = 1, order_mb[n++] = m;
                for (int m = GA - 1; m >= 0; m--)
                    order_fw[n] = 0, order_mb[n++] = m;
            } else {
                int warm = rp_workplan_in_flight(cfg, s) - 1, f = 0, b = 0;
                while (f < warm)
                    order_fw[n] = 1, order_mb[n++] = f++;
                while (b < GA) {
                    if (f < GA)
                        order_fw[n] = 1, order_mb[n++] = f++;
                    order_fw[n] = 0, order_mb[n++] = b++;
                }
            }
            for (int j = 0; j < rp_config_stage_replicas(cfg, s); j++) {
                rp_worker_ops *w = &sc->w[rp_workplan_worker(cfg, c, s, j)];
                w->stage = s;
                w->replica = c;
                w->stage_replica = j;
                w->ops = malloc(sizeof(rp_op) * (8 * (size_t)GA + 3));
                if (!w->ops) {
                    free(order_fw), free(order_mb), free(slot_of), free(free_slots);
                    rp_workplan_free(sc);
                    return rp_fail(err, RP_ERR_NOMEM,
                                   "out of memory for the operations of worker %d",
                                   (int)(w - sc->w));
                }
                bool async = cfg->schedule == RP_SCHEDULE_PIPEDREAM;
                for (int i = 0; i < n; i++)
                    if (order_mb[i] % rp_config_stage_replicas(cfg, s) == j) {
                        add_pass(cfg, w, order_fw[i], order_mb[i]);
                        if (async && !order_fw[i]) { /* PipeDream: an update a backward */
                            push(w, RP_OP_REDUCE, -1, -1);
                            push(w, RP_OP_STEP, -1, -1);
                        }
                    }
                push(w, RP_OP_WAIT_SENDS, -1, -1);
                if (!async) {
                    push(w, RP_OP_REDUCE, -1, -1);
                    push(w, RP_OP_STEP, -1, -1);
                }
                /* activation slots: taken at a forward, freed at its backward */
                int nfree = 0, used = 0;
                for (int i = 0; i < w->num_ops; i++) {
                    rp_op *op = &w->ops[i];
                    if (op->kind == RP_OP_FORWARD) {
                        op->slot = nfree ? free_slots[--nfree] : used++;
                        slot_of[op->mb] = op->slot;
                    } else if (op->kind == RP_OP_BACKWARD) {
                        op->slot = slot_of[op->mb];
                        free_slots[nfree++] = op->slot;
                    }
                }
                w->slots = used;
            }
        }
    free(order_fw), free(order_mb), free(slot_of), free(free_slots);
    *out = sc;
    return RP_OK;
}

/* ---- simulation ----------------------------------------------------------- */

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

rp_status rp_workplan_check(const rp_workplan *s, const int *reduce_group, rp_error *err) {
    int W = s->workers;
    int *pc = calloc(W, sizeof(int));
    int *sent = calloc(W, sizeof(int)), *received = calloc(W, sizeof(int));
    int *waiting_reduce = calloc(W, sizeof(int)), *rounds = calloc(W, sizeof(int));
    /* reduction groups, numbered 0..G-1: members, and members arrived */
    int *group = malloc(sizeof(int) * W), *ids = malloc(sizeof(int) * W);
    int *members = calloc(W, sizeof(int)), *arrived = calloc(W, sizeof(int));
    /* messages in flight: (from, to, kind, mb), matched by count; those to
    ** each worker not yet received form a list, so that a receive looks at
    ** its own messages only */
    typedef struct msg {
        int from, to, kind, mb, next;
    } msg;
    int cap = 1024, nmsg = 0;
    msg *msgs = malloc(sizeof(msg) * cap);
    int *head = malloc(sizeof(int) * W), *tail = malloc(sizeof(int) * W);
    rp_status st = RP_OK;
    if (!pc || !sent || !received || !waiting_reduce || !rounds || !group || !ids || !members ||
        !arrived || !msgs || !head || !tail) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory to check the schedules of %d workers", W);
        goto done;
    }
    for (int w = 0; w < W; w++) {
        ids[w] = reduce_group ? reduce_group[w] : s->w[w].stage;
        head[w] = tail[w] = -1;
    }
    memcpy(group, ids, sizeof(int) * W);
    qsort(ids, W, sizeof(int), cmp_int);
    int G = 0; /* the distinct ids */
    for (int w = 0; w < W; w++)
        if (G == 0 || ids[w] != ids[G - 1])
            ids[G++] = ids[w];
    for (int w = 0; w < W; w++) {
        group[w] = (int)((int *)bsearch(&group[w], ids, G, sizeof(int), cmp_int) - ids);
        members[group[w]]++;
    }
    for (bool progress = true; progress;) {
        progress = false;
        for (int w = 0; w < W; w++) {
            const rp_worker_ops *wo = &s->w[w];
            while (pc[w] < wo->num_ops) {
                const rp_op *op = &wo->ops[pc[w]];
                if (op->kind == RP_OP_SEND_ACT || op->kind == RP_OP_SEND_GRAD) {
                    if (op->peer < 0 || op->peer >= W) {
                        st = rp_fail(err, RP_ERR_INVALID,
                                     "schedule: worker %d sends micro-batch %d to worker %d, "
                                     "which does not exist",
                                     w, op->mb, op->peer);
                        goto done;
                    }
                    if (nmsg == cap) {
                        msg *nm = realloc(msgs, sizeof(msg) * cap * 2);
                        if (!nm) {
                            st = rp_fail(err, RP_ERR_NOMEM,
                                         "out of memory for the %d messages of the schedule "
                                         "check",
                                         cap * 2);
                            goto done;
                        }
                        msgs = nm;
                        cap *= 2;
                    }
                    msgs[nmsg] = (msg){w, op->peer, op->kind == RP_OP_SEND_ACT, op->mb, -1};
                    if (tail[op->peer] >= 0)
                        msgs[tail[op->peer]].next = nmsg;
                    else
                        head[op->peer] = nmsg;
                    tail[op->peer] = nmsg++;
                    sent[w]++;
                } else if (op->kind == RP_OP_RECV_ACT || op->kind == RP_OP_RECV_GRAD) {
                    int found = head[w], before = -1;
                    while (found >= 0 && !(msgs[found].from == op->peer &&
                                           msgs[found].kind == (op->kind == RP_OP_RECV_ACT) &&
                                           msgs[found].mb == op->mb))
                        before = found, found = msgs[found].next;
                    if (found < 0)
                        break; /* blocked */
                    if (before >= 0) /* out of the list */
                        msgs[before].next = msgs[found].next;
                    else
                        head[w] = msgs[found].next;
                    if (tail[w] == found)
                        tail[w] = before;
                    received[msgs[found].from]++;
                } else if (op->kind == RP_OP_WAIT_SENDS) {
                    if (received[w] < sent[w])
                        break;
                } else if (op->kind == RP_OP_REDUCE) {
                    /* the k-th passes once every member of its group has arrived at
                    ** its k-th: no member reaches its k+1-th before all reach the k-th,
                    ** so the arrivals can be counted together */
                    if (!waiting_reduce[w]) {
                        waiting_reduce[w] = 1;
                        arrived[group[w]]++;
                        rounds[w]++;
                    }
                    if (arrived[group[w]] < members[group[w]] * rounds[w])
                        break;
                    waiting_reduce[w] = 0;
                }
                pc[w]++;
                progress = true;
            }
        }
    }
    for (int w = 0; w < W; w++)
        if (pc[w] < s->w[w].num_ops) {
            const rp_op *op = &s->w[w].ops[pc[w]];
            if (op->mb >= 0)
                st = rp_fail(err, RP_ERR_INVALID,
                             "schedule would hang: worker %d (stage %d, replica %d) waits forever "
                             "at operation %d, %s of micro-batch %d from worker %d",
                             w, s->w[w].stage, s->w[w].replica, pc[w], rp_op_name(op->kind),
                             op->mb, op->peer);
            else
                st = rp_fail(err, RP_ERR_INVALID,
                             "schedule would hang: worker %d (stage %d, replica %d) waits forever "
                             "at operation %d, %s",
                             w, s->w[w].stage, s->w[w].replica, pc[w], rp_op_name(op->kind));
            break;
        }
    for (int w = 0; !st && w < W; w++)
        if (head[w] >= 0) {
            const msg *m = &msgs[head[w]];
            st = rp_fail(err, RP_ERR_INVALID,
                         "schedule: the %s of micro-batch %d from worker %d to worker %d is "
                         "never received",
                         m->kind ? "activation" : "gradient", m->mb, m->from, m->to);
        }
done:
    free(pc), free(sent), free(received), free(waiting_reduce), free(rounds), free(msgs);
    free(group), free(ids), free(members), free(arrived), free(head), free(tail);
    return st;
}
