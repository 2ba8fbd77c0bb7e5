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
                                        "wait for sends", "reduce", "step",
                                        "backward (input)", "backward (weights)"};
    _Static_assert(sizeof names / sizeof names[0] == RP_OP_COUNT, "a name for every kind");
    return k >= 0 && k < RP_OP_COUNT ? names[k] : "?";
}

bool rp_schedule_splits_backward(rp_schedule s) {
    return s == RP_SCHEDULE_ZB_H1 || s == RP_SCHEDULE_ZB_H2 || s == RP_SCHEDULE_ZB_AUTO;
}

/* The worker of (c, s, j) as if there were no tensor groups. */
static int base_worker(const rp_config *cfg, int c, int s, int j) {
    int P = cfg->layers_per_stage.count, per = 0, before = 0;
    for (int t = 0; t < P; t++) {
        if (t < s)
            before += rp_config_stage_replicas(cfg, t);
        per += rp_config_stage_replicas(cfg, t);
    }
    return c * per + before + j;
}

int rp_workplan_worker(const rp_config *cfg, int c, int s, int j) {
    return base_worker(cfg, c, s, j) * rp_config_tensor_parallel(cfg);
}

/* Tensor parallelism: each worker of the plan becomes its tensor group, t
** workers with the same operations, each exchanging with the rank of its
** own number in the other groups. The group's ranks meet in every forward
** and backward (their all-reduces), which a plan that cannot hang with
** one worker a group cannot make hang: the ranks run in lockstep. */
static rp_status expand_tensor_groups(const rp_config *cfg, rp_workplan *sc, rp_error *err) {
    int t = rp_config_tensor_parallel(cfg), W0 = sc->workers;
    if (t == 1)
        return RP_OK;
    rp_worker_ops *w = calloc((size_t)W0 * t, sizeof(rp_worker_ops));
    if (!w)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the schedules of %d workers",
                       W0 * t);
    for (int b = 0; b < W0; b++)
        for (int k = 0; k < t; k++) {
            rp_worker_ops *x = &w[b * t + k];
            *x = sc->w[b];
            x->tensor_rank = k;
            if (!(x->ops = malloc(sizeof(rp_op) * (sc->w[b].num_ops ? sc->w[b].num_ops : 1)))) {
                for (int i = 0; i < b * t + k; i++)
                    free(w[i].ops);
                free(w);
                return rp_fail(err, RP_ERR_NOMEM, "out of memory for the schedules of %d workers",
                               W0 * t);
            }
            for (int i = 0; i < x->num_ops; i++) {
                x->ops[i] = sc->w[b].ops[i];
                if (x->ops[i].peer >= 0)
                    x->ops[i].peer = x->ops[i].peer * t + k;
            }
        }
    for (int b = 0; b < W0; b++)
        free(sc->w[b].ops);
    free(sc->w);
    sc->w = w;
    sc->workers = W0 * t;
    return RP_OK;
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

/* A stage order's passes: a forward, a backward (whole, or its input's
** half) and a backward's weights' half. */
enum { PASS_F, PASS_B, PASS_W };

/* A micro-batch's forward (with its receive and send), backward or W. */
static void add_pass(const rp_config *cfg, rp_worker_ops *w, int pass, int mb) {
    int P = cfg->layers_per_stage.count, s = w->stage, c = w->replica;
    bool split = rp_schedule_splits_backward(cfg->schedule);
    if (pass == PASS_W) {
        push(w, RP_OP_BACKWARD_WEIGHT, mb, -1);
    } else if (pass == PASS_F) {
        if (s > 0)
            push(w, RP_OP_RECV_ACT, mb, base_worker(cfg, c, s - 1, mb % rp_config_stage_replicas(cfg, s - 1)));
        push(w, RP_OP_FORWARD, mb, -1);
        if (s < P - 1)
            push(w, RP_OP_SEND_ACT, mb, base_worker(cfg, c, s + 1, mb % rp_config_stage_replicas(cfg, s + 1)));
    } else {
        if (s < P - 1)
            push(w, RP_OP_RECV_GRAD, mb, base_worker(cfg, c, s + 1, mb % rp_config_stage_replicas(cfg, s + 1)));
        push(w, split ? RP_OP_BACKWARD_INPUT : RP_OP_BACKWARD, mb, -1);
        if (s > 0)
            push(w, RP_OP_SEND_GRAD, mb, base_worker(cfg, c, s - 1, mb % rp_config_stage_replicas(cfg, s - 1)));
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

/* The zero-bubble stage orders (schedule.h): a list schedule of P stages,
** on unit pass times for zb-h1 and zb-h2 and on zb_pass_times for zb-auto.
** kind and mb receive stage s's 3 GA passes at 3 GA s. Some stage can
** always move (the last one's B needs only its own F), so the loop ends.
** Times are doubles; unit times add up exactly, so zb-h1's and zb-h2's
** orders are those of whole numbers. */
/* A stage in the list schedule: its passes done (indexed by PASS_F, PASS_B,
** PASS_W), when it is free, and its room: micro-batches from F to B, and
** from F to W. */
typedef struct zb_stage {
    int done[3], fb_room, fw_room;
    double free_at;
} zb_stage;

static rp_status zb_orders(const rp_config *cfg, int *kind, int *mbs, rp_error *err) {
    int P = cfg->layers_per_stage.count, GA = cfg->gradient_accumulation_steps;
    bool h2 = cfg->schedule == RP_SCHEDULE_ZB_H2, aut = cfg->schedule == RP_SCHEDULE_ZB_AUTO;
    double dur[3] = {1, 1, 1};
    if (aut)
        memcpy(dur, cfg->zb_pass_times, sizeof dur);
    zb_stage *st = calloc((size_t)P, sizeof(zb_stage));
    double *tf = malloc(sizeof(double) * P * GA), *tb = malloc(sizeof(double) * P * GA);
    if (!st || !tf || !tb) {
        free(st), free(tf), free(tb);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a schedule of %d micro-batches", GA);
    }
    const double never = 1e300;
    /* 1f1b's most micro-batches on one worker (the first stage's, without
    ** stage replication): every worker of zb-h1 may hold as many, those of
    ** zb-h2 twice less one */
    int peak = 1;
    for (int s = 0; s < P; s++) {
        int r = rp_config_stage_replicas(cfg, s), n = rp_workplan_in_flight(cfg, s);
        peak = (n + r - 1) / r > peak ? (n + r - 1) / r : peak;
    }
    for (int s = 0; s < P; s++) {
        int n = rp_workplan_in_flight(cfg, s), r = rp_config_stage_replicas(cfg, s);
        /* zb-auto's limit L on a worker scales each stage's room from F to B
        ** as zb-h1's n_s stands to peak: L = peak gives zb-h1's rooms, L = 2
        ** peak - 1 zb-h2's (n_s (2 peak - 1) / peak rounds down to 2 n_s - 1) */
        int limit = cfg->zb_max_in_flight > 0 ? cfg->zb_max_in_flight : peak;
        int scaled = (int)((long long)n * limit / peak);
        st[s].fb_room = aut ? (scaled > 1 ? scaled : 1) : h2 ? 2 * n - 1 : n;
        st[s].fw_room = r * (aut ? limit : h2 ? 2 * peak - 1 : peak);
    }
    for (int i = 0; i < P * GA; i++)
        tf[i] = tb[i] = never; /* when each F and B ends: not yet known */
    for (int left = 3 * P * GA; left > 0; left--) {
        int best = -1, best_pass = 0;
        double best_at = never;
        for (int s = 0; s < P; s++) {
            const zb_stage *c = &st[s];
            int nf = c->done[PASS_F], nb = c->done[PASS_B], nw = c->done[PASS_W];
            double at = c->free_at;
            bool room = nf < GA && nf - nb < c->fb_room && nf - nw < c->fw_room;
            double rf = room ? (s == 0 ? 0 : tf[(s - 1) * GA + nf]) : never;
            double rb = nb < nf ? (s == P - 1 ? tf[s * GA + nb] : tb[(s + 1) * GA + nb]) : never;
            double start;
            int pass;
            if (rf <= at) /* a forward first: it feeds the stages after, which idle most */
                start = at, pass = PASS_F;
            else if (rb <= at)
                start = at, pass = PASS_B;
            else if (nw < nb)
                start = at, pass = PASS_W;
            else if (rb < never || rf < never)
                start = rb <= rf ? rb : rf, pass = rb <= rf ? PASS_B : PASS_F;
            else
                continue;
            if (start < best_at)
                best = s, best_at = start, best_pass = pass;
        }
        zb_stage *c = &st[best];
        int i = c->done[PASS_F] + c->done[PASS_B] + c->done[PASS_W], mb = c->done[best_pass];
        kind[3 * GA * best + i] = best_pass;
        mbs[3 * GA * best + i] = mb;
        if (best_pass == PASS_F)
            tf[best * GA + mb] = best_at + dur[PASS_F];
        else if (best_pass == PASS_B)
            tb[best * GA + mb] = best_at + dur[PASS_B];
        c->done[best_pass]++;
        c->free_at = best_at + dur[best_pass];
    }
    free(st), free(tf), free(tb);
    return RP_OK;
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
    /* the stages' orders as one worker each would run them: (pass, mb)
    ** pairs, 3 GA per stage */
    bool split = rp_schedule_splits_backward(cfg->schedule);
    int *order_k = malloc(sizeof(int) * 3 * GA * P), *order_m = malloc(sizeof(int) * 3 * GA * P);
    int *slot_of = malloc(sizeof(int) * GA), *free_slots = malloc(sizeof(int) * GA);
    rp_status st = !order_k || !order_m || !slot_of || !free_slots
                       ? rp_fail(err, RP_ERR_NOMEM,
                                 "out of memory for a schedule of %d micro-batches", GA)
                   : split ? zb_orders(cfg, order_k, order_m, err)
                           : RP_OK;
    if (st) {
        free(order_k), free(order_m), free(slot_of), free(free_slots);
        rp_workplan_free(sc);
        return st;
    }
    for (int c = 0; c < R; c++)
        for (int s = 0; s < P; s++) {
            int n = 0, *order_fw = order_k + 3 * GA * s, *order_mb = order_m + 3 * GA * s;
            if (split) {
                n = 3 * GA;
            } else if (cfg->schedule == RP_SCHEDULE_GPIPE) {
                for (int m = 0; m < GA; m++)
                    order_fw[n] = PASS_F, order_mb[n++] = m;
                for (int m = GA - 1; m >= 0; m--)
                    order_fw[n] = PASS_B, order_mb[n++] = m;
            } else {
                int warm = rp_workplan_in_flight(cfg, s) - 1, f = 0, b = 0;
                while (f < warm)
                    order_fw[n] = PASS_F, order_mb[n++] = f++;
                while (b < GA) {
                    if (f < GA)
                        order_fw[n] = PASS_F, order_mb[n++] = f++;
                    order_fw[n] = PASS_B, order_mb[n++] = b++;
                }
            }
            for (int j = 0; j < rp_config_stage_replicas(cfg, s); j++) {
                rp_worker_ops *w = &sc->w[base_worker(cfg, c, s, j)];
                w->stage = s;
                w->replica = c;
                w->stage_replica = j;
                w->ops = malloc(sizeof(rp_op) * (8 * (size_t)GA + 3));
                if (!w->ops) {
                    free(order_k), free(order_m), free(slot_of), free(free_slots);
                    rp_workplan_free(sc);
                    return rp_fail(err, RP_ERR_NOMEM,
                                   "out of memory for the operations of worker %d",
                                   (int)(w - sc->w));
                }
                bool async = cfg->schedule == RP_SCHEDULE_PIPEDREAM;
                for (int i = 0; i < n; i++)
                    if (order_mb[i] % rp_config_stage_replicas(cfg, s) == j) {
                        add_pass(cfg, w, order_fw[i], order_mb[i]);
                        if (async && order_fw[i] == PASS_B) { /* PipeDream: an update a backward */
                            push(w, RP_OP_REDUCE, -1, -1);
                            push(w, RP_OP_STEP, -1, -1);
                        }
                    }
                push(w, RP_OP_WAIT_SENDS, -1, -1);
                if (!async) {
                    push(w, RP_OP_REDUCE, -1, -1);
                    push(w, RP_OP_STEP, -1, -1);
                }
                /* activation slots: taken at a forward, freed at its backward
                ** (a split one's weights' half) */
                int nfree = 0, used = 0;
                for (int i = 0; i < w->num_ops; i++) {
                    rp_op *op = &w->ops[i];
                    if (op->kind == RP_OP_FORWARD) {
                        op->slot = nfree ? free_slots[--nfree] : used++;
                        slot_of[op->mb] = op->slot;
                    } else if (op->kind == RP_OP_BACKWARD || op->kind == RP_OP_BACKWARD_INPUT ||
                               op->kind == RP_OP_BACKWARD_WEIGHT) {
                        op->slot = slot_of[op->mb];
                        if (op->kind != RP_OP_BACKWARD_INPUT)
                            free_slots[nfree++] = op->slot;
                    }
                }
                w->slots = used;
            }
        }
    free(order_k), free(order_m), free(slot_of), free(free_slots);
    if ((st = expand_tensor_groups(cfg, sc, err))) {
        rp_workplan_free(sc);
        return st;
    }
    *out = sc;
    return RP_OK;
}

/* ---- simulation ----------------------------------------------------------- */

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
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

rp_status rp_workplan_check(const rp_workplan *s, const int *reduce_group, rp_error *err) {
    rp_status halves = check_halves(s, err);
    if (halves)
        return halves;
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
