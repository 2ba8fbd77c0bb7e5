/*
** The schedule checker: every worker's operation list (and every device's
** order over its workers' lists) run by simulation, message by message and
** reduction by reduction, before a session runs it. A plan that passes
** cannot wait forever: every receive meets its send, every reduction all
** its members. The passes' own order is checked first (a backward after
** its forward, a weights' half after its input's half).
*/
#include "repipe/schedule.h"

#include <stdlib.h>
#include <string.h>
static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Every backward (or half) on the worker that ran its forward, after it,
** on the activation slot that forward filled. */
static rp_status check_passes(const rp_workplan *s, rp_error *err) {
    for (int w = 0; w < s->workers; w++) {
        const rp_worker_ops *wo = &s->w[w];
        int most = 0;
        for (int i = 0; i < wo->num_ops; i++)
            most = wo->ops[i].mb > most ? wo->ops[i].mb : most;
        int *slot_of = malloc(sizeof(int) * (most + 1));
        if (!slot_of)
            return rp_fail(err, RP_ERR_NOMEM, "out of memory to check a schedule");
        for (int m = 0; m <= most; m++)
            slot_of[m] = -1;
        for (int i = 0; i < wo->num_ops; i++) {
            const rp_op *op = &wo->ops[i];
            bool bwd = op->kind == RP_OP_BACKWARD || op->kind == RP_OP_BACKWARD_INPUT ||
                       op->kind == RP_OP_BACKWARD_WEIGHT;
            if (op->kind == RP_OP_FORWARD && op->slot >= 0 && op->slot < wo->slots)
                slot_of[op->mb] = op->slot;
            else if ((op->kind == RP_OP_FORWARD || bwd) && op->slot != slot_of[op->mb]) {
                free(slot_of);
                return rp_fail(err, RP_ERR_INVALID,
                               "schedule: worker %d runs the %s of micro-batch %d (operation %d) "
                               "%s", w, bwd ? "backward" : "forward", op->mb, i,
                               bwd ? "before its forward, or on another activation slot"
                                   : "on no activation slot of its own");
            }
        }
        free(slot_of);
    }
    return RP_OK;
}

/* A split backward's halves on one worker: each W after its B, the Ws in
** micro-batch order (the order 1f1b sums the weights' gradients in), and
** no B without its W before the reduction. */
static rp_status check_halves(const rp_workplan *s, rp_error *err) {
    for (int w = 0; w < s->workers; w++) {
        const rp_worker_ops *wo = &s->w[w];
        int last_b = -1, last_w = -1, open = 0;
        for (int i = 0; i < wo->num_ops; i++) {
            const rp_op *op = &wo->ops[i];
            if (op->kind == RP_OP_BACKWARD_INPUT) {
                last_b = op->mb > last_b ? op->mb : last_b;
                open++;
            } else if (op->kind == RP_OP_BACKWARD_WEIGHT) {
                if (op->mb > last_b || open == 0)
                    return rp_fail(err, RP_ERR_INVALID,
                                   "schedule: worker %d runs the weights' half of micro-batch "
                                   "%d's backward (operation %d) before its input's half",
                                   w, op->mb, i);
                if (op->mb <= last_w)
                    return rp_fail(err, RP_ERR_INVALID,
                                   "schedule: worker %d runs the weights' halves out of "
                                   "micro-batch order (%d after %d, operation %d): the "
                                   "gradients would be summed in another order than 1f1b's",
                                   w, op->mb, last_w, i);
                last_w = op->mb;
                open--;
            } else if (op->kind == RP_OP_REDUCE && open > 0) {
                return rp_fail(err, RP_ERR_INVALID,
                               "schedule: worker %d reduces (operation %d) with %d weights' "
                               "halves still to run",
                               w, i, open);
            }
        }
    }
    return RP_OK;
}

/* The checker's state: each worker's next operation, its messages sent and
** received, its reductions; the messages in flight, matched by (from, to,
** kind, mb), those to each worker not yet received forming a list, so
** that a receive looks at its own messages only. */
typedef struct check_msg {
    int from, to, kind, mb, next;
} check_msg;

typedef struct checker {
    const rp_workplan *s;
    int *pc, *sent, *received, *waiting_reduce, *rounds;
    int *group, *members, *arrived; /* reduction groups 0..G-1: members, and arrived */
    check_msg *msgs;
    int cap, nmsg, *head, *tail;
} checker;

/* Worker w's send: its message queued for its peer. */
static rp_status post(checker *k, int w, const rp_op *op, rp_error *err) {
    if (op->peer < 0 || op->peer >= k->s->workers)
        return rp_fail(err, RP_ERR_INVALID,
                       "schedule: worker %d sends micro-batch %d to worker %d, which does "
                       "not exist", w, op->mb, op->peer);
    if (k->nmsg == k->cap) {
        check_msg *nm = realloc(k->msgs, sizeof(check_msg) * k->cap * 2);
        if (!nm)
            return rp_fail(err, RP_ERR_NOMEM,
                           "out of memory for the %d messages of the schedule check",
                           k->cap * 2);
        k->msgs = nm;
        k->cap *= 2;
    }
    k->msgs[k->nmsg] = (check_msg){w, op->peer, op->kind == RP_OP_SEND_ACT, op->mb, -1};
    if (k->tail[op->peer] >= 0)
        k->msgs[k->tail[op->peer]].next = k->nmsg;
    else
        k->head[op->peer] = k->nmsg;
    k->tail[op->peer] = k->nmsg++;
    k->sent[w]++;
    return RP_OK;
}

/* Worker w's receive: the message it names taken from its queue; false
** where it has not come. */
static bool take(checker *k, int w, const rp_op *op) {
    int found = k->head[w], before = -1;
    while (found >= 0 && !(k->msgs[found].from == op->peer &&
                           k->msgs[found].kind == (op->kind == RP_OP_RECV_ACT) &&
                           k->msgs[found].mb == op->mb))
        before = found, found = k->msgs[found].next;
    if (found < 0)
        return false;
    if (before >= 0) /* out of the list */
        k->msgs[before].next = k->msgs[found].next;
    else
        k->head[w] = k->msgs[found].next;
    if (k->tail[w] == found)
        k->tail[w] = before;
    k->received[k->msgs[found].from]++;
    return true;
}

/* Runs worker w's next operation if it can: 1 if it ran, 0 if it waits. */
static int check_op(checker *k, int w, rp_status *st, rp_error *err) {
    const rp_op *op = &k->s->w[w].ops[k->pc[w]];
    if (op->kind == RP_OP_SEND_ACT || op->kind == RP_OP_SEND_GRAD) {
        if ((*st = post(k, w, op, err)))
            return 0;
    } else if (op->kind == RP_OP_RECV_ACT || op->kind == RP_OP_RECV_GRAD) {
        if (!take(k, w, op))
            return 0; /* blocked */
    } else if (op->kind == RP_OP_WAIT_SENDS) {
        if (k->received[w] < k->sent[w])
            return 0;
    } else if (op->kind == RP_OP_REDUCE) {
        /* the k-th passes once every member of its group has arrived at its
        ** k-th: no member reaches its k+1-th before all reach the k-th, so
        ** the arrivals can be counted together */
        int g = k->group[w];
        if (!k->waiting_reduce[w]) {
            k->waiting_reduce[w] = 1;
            k->arrived[g]++;
            k->rounds[w]++;
        }
        if (k->arrived[g] < k->members[g] * k->rounds[w])
            return 0;
        k->waiting_reduce[w] = 0;
    }
    k->pc[w]++;
    return 1;
}

/* Each worker's reduction group (its id in reduce_group, else its stage),
** numbered from 0, and the members of each (ids: W ints of scratch). */
static void number_groups(checker *k, const int *reduce_group, int *ids) {
    const rp_workplan *s = k->s;
    int W = s->workers, G = 0;
    for (int w = 0; w < W; w++) {
        ids[w] = reduce_group ? reduce_group[w] : s->w[w].stage;
        k->head[w] = k->tail[w] = -1;
    }
    memcpy(k->group, ids, sizeof(int) * W);
    qsort(ids, W, sizeof(int), cmp_int);
    for (int w = 0; w < W; w++) /* the distinct ids */
        if (G == 0 || ids[w] != ids[G - 1])
            ids[G++] = ids[w];
    for (int w = 0; w < W; w++) {
        k->group[w] = (int)((int *)bsearch(&k->group[w], ids, G, sizeof(int), cmp_int) - ids);
        k->members[k->group[w]]++;
    }
}

/* Every operation that can run, run, until none can: workers alone in
** their order, a device's workers in the device's (dpc: each device's
** next). */
static rp_status play(checker *k, int *dpc, rp_error *err) {
    const rp_workplan *s = k->s;
    int W = s->workers, D = s->devices;
    rp_status st = RP_OK;
    for (bool progress = true; progress && !st;) {
        progress = false;
        for (int w = 0; w < W && !st; w++)
            while (!(D && s->device_of) && k->pc[w] < s->w[w].num_ops && check_op(k, w, &st, err))
                progress = true;
        for (int d = 0; d < D && !st; d++) {
            const rp_device_ops *dv = &s->dev[d];
            while (dpc[d] < dv->num) {
                int w = dv->worker[dpc[d]];
                if (k->pc[w] != dv->op[dpc[d]]) {
                    st = rp_fail(err, RP_ERR_INVALID,
                                 "schedule: device %d runs operation %d of worker %d out of "
                                 "that worker's order (its next is %d)",
                                 d, dv->op[dpc[d]], w, k->pc[w]);
                    break;
                }
                if (!check_op(k, w, &st, err))
                    break;
                dpc[d]++;
                progress = true;
            }
        }
    }
    return st;
}

/* What is left once nothing runs: a worker short of its list's end waits
** for ever, a message sent and never received. */
static rp_status left_over(const checker *k, rp_error *err) {
    const rp_workplan *s = k->s;
    for (int w = 0; w < s->workers; w++) {
        if (k->pc[w] >= s->w[w].num_ops)
            continue;
        const rp_op *op = &s->w[w].ops[k->pc[w]];
        if (op->mb >= 0)
            return rp_fail(err, RP_ERR_INVALID,
                           "schedule would hang: worker %d (stage %d, replica %d) waits forever "
                           "at operation %d, %s of micro-batch %d from worker %d",
                           w, s->w[w].stage, s->w[w].replica, k->pc[w], rp_op_name(op->kind),
                           op->mb, op->peer);
        return rp_fail(err, RP_ERR_INVALID,
                       "schedule would hang: worker %d (stage %d, replica %d) waits forever "
                       "at operation %d, %s",
                       w, s->w[w].stage, s->w[w].replica, k->pc[w], rp_op_name(op->kind));
    }
    for (int w = 0; w < s->workers; w++)
        if (k->head[w] >= 0) {
            const check_msg *m = &k->msgs[k->head[w]];
            return rp_fail(err, RP_ERR_INVALID,
                           "schedule: the %s of micro-batch %d from worker %d to worker %d is "
                           "never received",
                           m->kind ? "activation" : "gradient", m->mb, m->from, m->to);
        }
    return RP_OK;
}

/* Workers alone run their operations in order; a device's workers run
** theirs in the device's order, one at a time. */
rp_status rp_workplan_check(const rp_workplan *s, const int *reduce_group, rp_error *err) {
    rp_status halves = check_passes(s, err);
    if (halves || (halves = check_halves(s, err)))
        return halves;
    int W = s->workers, D = s->devices;
    checker k = {.s = s, .cap = 1024};
    k.pc = calloc(W, sizeof(int));
    k.sent = calloc(W, sizeof(int)), k.received = calloc(W, sizeof(int));
    k.waiting_reduce = calloc(W, sizeof(int)), k.rounds = calloc(W, sizeof(int));
    k.group = malloc(sizeof(int) * W);
    k.members = calloc(W, sizeof(int)), k.arrived = calloc(W, sizeof(int));
    k.msgs = malloc(sizeof(check_msg) * k.cap);
    k.head = malloc(sizeof(int) * W), k.tail = malloc(sizeof(int) * W);
    int *ids = malloc(sizeof(int) * W), *dpc = calloc(D ? D : 1, sizeof(int));
    rp_status st = RP_OK;
    if (!k.pc || !k.sent || !k.received || !k.waiting_reduce || !k.rounds || !k.group || !ids ||
        !k.members || !k.arrived || !k.msgs || !k.head || !k.tail || !dpc) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory to check the schedules of %d workers", W);
        goto done;
    }
    number_groups(&k, reduce_group, ids);
    st = play(&k, dpc, err);
    if (!st)
        st = left_over(&k, err);
done:
    free(k.pc), free(k.sent), free(k.received), free(k.waiting_reduce), free(k.rounds);
    free(k.msgs), free(k.group), free(k.members), free(k.arrived), free(k.head), free(k.tail);
    free(ids), free(dpc);
    return st;
}
