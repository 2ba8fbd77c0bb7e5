/*
** Schedules: building each worker's operation list (each device's order
** over its chunks' lists: schedule_devices.c; the V's orders:
** schedule_v.c; schedule_check.c proves them free of waits that never
** end).
*/
#include "repipe/schedule.h"
#include "schedule_impl.h"

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
    return s == RP_SCHEDULE_ZB_H1 || s == RP_SCHEDULE_ZB_H2 || s == RP_SCHEDULE_ZB_AUTO ||
           s == RP_SCHEDULE_ZB_V || s == RP_SCHEDULE_DUALPIPEV || s == RP_SCHEDULE_DUALPIPE;
}


int rp_workplan_worker(const rp_config *cfg, int c, int s, int j) {
    return rpi_base_worker(cfg, c, s, j) * rp_config_tensor_parallel(cfg);
}

/* The devices of the chunked schedules, each made t devices: one a tensor
** rank, holding that rank's workers (W0: the workers before). */
static rp_status expand_devices(rp_workplan *sc, int t, int W0, rp_error *err) {
    int D0 = sc->devices;
    rp_device_ops *dev = calloc((size_t)D0 * t, sizeof(rp_device_ops));
    int *device_of = malloc(sizeof(int) * W0 * t);
    bool ok = dev && device_of;
    for (int d = 0; d < D0 && ok; d++)
        for (int k = 0; k < t && ok; k++) {
            rp_device_ops *x = &dev[d * t + k];
            int n = sc->dev[d].num;
            x->worker = malloc(sizeof(int) * (n ? n : 1));
            x->op = malloc(sizeof(int) * (n ? n : 1));
            if (!(ok = x->worker && x->op))
                break;
            x->num = n;
            for (int i = 0; i < n; i++)
                x->worker[i] = sc->dev[d].worker[i] * t + k, x->op[i] = sc->dev[d].op[i];
        }
    for (int b = 0; b < W0 && ok; b++)
        for (int k = 0; k < t; k++)
            device_of[b * t + k] = sc->device_of[b] * t + k;
    for (int d = 0; d < D0; d++) /* the old devices go either way */
        free(sc->dev[d].worker), free(sc->dev[d].op);
    free(sc->dev), free(sc->device_of);
    sc->dev = dev, sc->device_of = device_of, sc->devices = dev ? D0 * t : 0;
    if (!ok)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the devices of %d workers",
                       W0 * t);
    return RP_OK;
}


/* Tensor parallelism: each worker of the plan becomes its tensor group, t
** workers with the same operations, each exchanging with the rank of its
** own number in the other groups. The group's ranks meet in every forward
** and backward (their all-reduces), which a plan that cannot hang with
** one worker a group cannot make hang: the ranks run in lockstep. A
** device of the chunked schedules becomes t devices the same way, device
** d's rank k running the rank-k workers of d's chunks in d's order. */
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
    return sc->devices ? expand_devices(sc, t, W0, err) : RP_OK;
}

void rp_workplan_free(rp_workplan *s) {
    if (!s)
        return;
    for (int i = 0; i < s->workers; i++)
        free(s->w[i].ops);
    for (int d = 0; d < s->devices; d++)
        free(s->dev[d].worker), free(s->dev[d].op);
    free(s->w), free(s->dev), free(s->device_of);
    free(s);
}

static void push(rp_worker_ops *w, rp_op_kind k, int mb, int peer) {
    w->ops[w->num_ops++] = (rp_op){k, mb, peer, -1};
}


/* The worker of replica c's stage s that takes micro-batch mb: its stage
** replica mb mod r_s. */
static int taker(const rp_config *cfg, int c, int s, int mb) {
    return rpi_base_worker(cfg, c, s, mb % rp_config_stage_replicas(cfg, s));
}

/* A micro-batch's forward (with its receive and send), backward or W. */
static void add_pass(const rp_config *cfg, rp_worker_ops *w, int pass, int mb) {
    int P = cfg->layers_per_stage.count, s = w->stage, c = w->replica;
    bool split = rp_schedule_splits_backward(cfg->schedule);
    if (pass == PASS_W) {
        push(w, RP_OP_BACKWARD_WEIGHT, mb, -1);
    } else if (pass == PASS_F) {
        if (s > 0)
            push(w, RP_OP_RECV_ACT, mb, taker(cfg, c, s - 1, mb));
        push(w, RP_OP_FORWARD, mb, -1);
        if (s < P - 1)
            push(w, RP_OP_SEND_ACT, mb, taker(cfg, c, s + 1, mb));
    } else {
        if (s < P - 1)
            push(w, RP_OP_RECV_GRAD, mb, taker(cfg, c, s + 1, mb));
        push(w, split ? RP_OP_BACKWARD_INPUT : RP_OP_BACKWARD, mb, -1);
        if (s > 0)
            push(w, RP_OP_SEND_GRAD, mb, taker(cfg, c, s - 1, mb));
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

/* A stage in the list schedule: its passes done (indexed by PASS_F, PASS_B,
** PASS_W), when it is free, and its room: micro-batches from F to B, and
** from F to W. */
typedef struct zb_stage {
    int done[3], fb_room, fw_room;
    double free_at;
} zb_stage;

/* Each stage's rooms: the micro-batches it may hold between F and B, and
** between F and W (over its replicas). */
static void zb_rooms(const rp_config *cfg, zb_stage *st, bool h2, bool aut) {
    int P = cfg->layers_per_stage.count;
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
}

/* The zero-bubble stage orders (schedule.h): a list schedule of P stages,
** on unit pass times for zb-h1 and zb-h2 and on zb_pass_times for zb-auto.
** kind and mb receive stage s's 3 GA passes at 3 GA s. Some stage can
** always move (the last one's B needs only its own F), so the loop ends.
** Times are doubles; unit times add up exactly, so zb-h1's and zb-h2's
** orders are those of whole numbers. */
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
    zb_rooms(cfg, st, h2, aut);
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

/* Stage s's order as one worker would run it, (pass, mb) pairs, where the
** schedule has not made it already (zero bubble's and the chunked ones'):
** GPipe's, or 1F1B's warm-up of the micro-batches in flight, then one
** forward and one backward in turn. Its length. */
static int stage_order(const rp_config *cfg, int s, int *order_fw, int *order_mb, bool split,
                       bool chunked) {
    int n = 0, GA = cfg->gradient_accumulation_steps;
    if (split)
        return 3 * GA;
    if (chunked)
        return 2 * GA;
    if (cfg->schedule == RP_SCHEDULE_GPIPE) {
        for (int m = 0; m < GA; m++)
            order_fw[n] = PASS_F, order_mb[n++] = m;
        for (int m = GA - 1; m >= 0; m--)
            order_fw[n] = PASS_B, order_mb[n++] = m;
        return n;
    }
    int warm = rp_workplan_in_flight(cfg, s) - 1, f = 0, b = 0;
    while (f < warm)
        order_fw[n] = PASS_F, order_mb[n++] = f++;
    while (b < GA) {
        if (f < GA)
            order_fw[n] = PASS_F, order_mb[n++] = f++;
        order_fw[n] = PASS_B, order_mb[n++] = b++;
    }
    return n;
}

/* Activation slots: taken at a forward, freed at its backward (a split
** one's weights' half). slot_of and free_slots: GA ints of scratch. */
static void assign_slots(rp_worker_ops *w, int *slot_of, int *free_slots) {
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

/* Stage replica j's list of its stage's order: its micro-batches' passes
** (under PipeDream an update after each backward), then the sends' end,
** the reduction and the step. */
static rp_status worker_list(const rp_config *cfg, rp_worker_ops *w, int j, const int *order_fw,
                             const int *order_mb, int n, int *slot_of, int *free_slots,
                             int id, rp_error *err) {
    int GA = cfg->gradient_accumulation_steps, r = rp_config_stage_replicas(cfg, w->stage);
    w->ops = malloc(sizeof(rp_op) * (8 * (size_t)GA + 3));
    if (!w->ops)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the operations of worker %d", id);
    bool async = cfg->schedule == RP_SCHEDULE_PIPEDREAM;
    for (int i = 0; i < n; i++)
        if (order_mb[i] % r == j) {
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
    assign_slots(w, slot_of, free_slots);
    return RP_OK;
}

/* The workplan, in the steps above: the stages' orders (zero bubble's and
** the chunked schedules' from their own builders), every stage replica's
** list of every replica, the devices of the chunked schedules, the tensor
** groups. */
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
    /* the chunked schedules: each device's order, (stage, pass, mb) */
    bool chunked = rp_config_chunked(cfg) || rp_config_paired(cfg);
    size_t nseq = chunked ? (size_t)3 * GA * P : 1;
    int *seq = malloc(sizeof(int) * 3 * nseq);
    rp_status st = !order_k || !order_m || !slot_of || !free_slots || !seq
                       ? rp_fail(err, RP_ERR_NOMEM,
                                 "out of memory for a schedule of %d micro-batches", GA)
                   : chunked ? rpi_device_orders(cfg, seq, seq + nseq, seq + 2 * nseq, order_k,
                                             order_m, err)
                   : split ? zb_orders(cfg, order_k, order_m, err)
                           : RP_OK;
    for (int c = 0; !st && c < R; c++)
        for (int s = 0; !st && s < P; s++) {
            int *order_fw = order_k + 3 * GA * s, *order_mb = order_m + 3 * GA * s;
            int n = stage_order(cfg, s, order_fw, order_mb, split, chunked);
            for (int j = 0; !st && j < rp_config_stage_replicas(cfg, s); j++) {
                int id = rpi_base_worker(cfg, c, s, j);
                rp_worker_ops *w = &sc->w[id];
                w->stage = s;
                w->replica = c;
                w->stage_replica = j;
                st = worker_list(cfg, w, j, order_fw, order_mb, n, slot_of, free_slots, id, err);
            }
        }
    free(order_k), free(order_m), free(slot_of), free(free_slots);
    if (!st && chunked)
        st = rpi_make_devices(cfg, sc, seq, seq + 2 * nseq, err);
    free(seq);
    if (!st)
        st = expand_tensor_groups(cfg, sc, err);
    if (st) {
        rp_workplan_free(sc);
        return st;
    }
    *out = sc;
    return RP_OK;
}

/* The interleaved and V schedules: their chunks a worker, the
** micro-batches they need, and a worker's chunks replicated together. */
static rp_status check_chunked(const rp_config *cfg, rp_error *err) {
    bool interleaved = cfg->schedule == RP_SCHEDULE_INTERLEAVED;
    int S = rp_config_num_stages(cfg, false), v = cfg->virtual_stages, P = S / v;
    const char *why = S % v ? "layers_per_stage must list virtual_stages chunks per worker"
                      : interleaved && cfg->gradient_accumulation_steps % P
                          ? "gradient_accumulation_steps must be a multiple of the pipeline's "
                            "workers (micro-batches go through the chunks in groups of them)"
                      : cfg->schedule == RP_SCHEDULE_DUALPIPEV &&
                              cfg->gradient_accumulation_steps < 2 * P
                          ? "gradient_accumulation_steps must be at least twice the pipeline's "
                            "workers (DualPipeV's warm-up takes that many micro-batches)"
                      : P < 2 ? "it needs 2 pipeline workers or more"
                              : NULL;
    if (why)
        return rp_fail(err, RP_ERR_INVALID,
                       "schedule \"%s\" with virtual_stages %d, %d stages "
                       "and gradient_accumulation_steps %d: %s",
                       rp_schedule_name(cfg->schedule), v, S,
                       cfg->gradient_accumulation_steps, why);
    for (int r = 0; r < P; r++) /* a worker's chunks are replicated together */
        for (int k = 1; k < v; k++) {
            int a = rp_config_chunk(cfg, P, r, 0), b = rp_config_chunk(cfg, P, r, k);
            if (rp_config_stage_replicas(cfg, a) != rp_config_stage_replicas(cfg, b))
                return rp_fail(err, RP_ERR_INVALID,
                               "stage_replication: under schedule \"%s\" stages %d and %d "
                               "are chunks of pipeline worker %d, which is replicated as a "
                               "whole: give them as many replicas (%d and %d)",
                               rp_schedule_name(cfg->schedule), a, b, r,
                               rp_config_stage_replicas(cfg, a),
                               rp_config_stage_replicas(cfg, b));
        }
    return RP_OK;
}

/* DualPipe: an even number of stages and replicas, a warm-up's worth of
** micro-batches, and a device's two stages replicated together. */
static rp_status check_paired(const rp_config *cfg, rp_error *err) {
    int P = cfg->layers_per_stage.count, R = cfg->replication_factor;
    int GA = cfg->gradient_accumulation_steps;
    const char *why = P < 2 || P % 2 ? "it needs an even number of stages, 2 or more"
                      : R % 2 ? "replication_factor must be even (each pair of replicas runs "
                                "its two pipelines over the same devices, in opposite "
                                "directions)"
                      : GA < P ? "gradient_accumulation_steps must be at least the stages "
                                 "(DualPipe's warm-up takes that many micro-batches a "
                                 "direction)"
                               : NULL;
    if (why)
        return rp_fail(err, RP_ERR_INVALID,
                       "schedule \"dualpipe\" with %d stages, replication_factor %d and "
                       "gradient_accumulation_steps %d: %s",
                       P, R, GA, why);
    for (int r = 0; r < P / 2; r++) /* a device's two stages are replicated together */
        if (rp_config_stage_replicas(cfg, r) != rp_config_stage_replicas(cfg, P - 1 - r))
            return rp_fail(err, RP_ERR_INVALID,
                           "stage_replication: under schedule \"dualpipe\" stages %d and %d "
                           "share devices, which are replicated as a whole: give them as "
                           "many replicas (%d and %d)",
                           r, P - 1 - r, rp_config_stage_replicas(cfg, r),
                           rp_config_stage_replicas(cfg, P - 1 - r));
    return RP_OK;
}

/* The schedule's keys, which need no model (rp_simulate checks them too). */
rp_status rp_schedule_check_config(const rp_config *cfg, rp_error *err) {
    if (cfg->pipedream_vertical_sync && cfg->schedule != RP_SCHEDULE_PIPEDREAM)
        return rp_fail(err, RP_ERR_INVALID,
                       "pipedream_vertical_sync goes with schedule \"pipedream\", not \"%s\"",
                       rp_schedule_name(cfg->schedule));
    bool timed = cfg->zb_pass_times[0] != 1 || cfg->zb_pass_times[1] != 1 ||
                 cfg->zb_pass_times[2] != 1;
    if (cfg->schedule != RP_SCHEDULE_ZB_AUTO && cfg->zb_max_in_flight != 0)
        return rp_fail(err, RP_ERR_INVALID,
                       "zb_max_in_flight goes with schedule \"zb-auto\", not \"%s\"",
                       rp_schedule_name(cfg->schedule));
    if (cfg->schedule != RP_SCHEDULE_ZB_AUTO && cfg->schedule != RP_SCHEDULE_ZB_V && timed)
        return rp_fail(err, RP_ERR_INVALID,
                       "zb_pass_times goes with schedule \"zb-auto\" or \"zb-v\", not \"%s\"",
                       rp_schedule_name(cfg->schedule));
    bool interleaved = cfg->schedule == RP_SCHEDULE_INTERLEAVED;
    if (interleaved ? cfg->virtual_stages < 2
        : rp_config_v_shaped(cfg) ? cfg->virtual_stages != 2 : cfg->virtual_stages != 1)
        return rp_fail(err, RP_ERR_INVALID,
                       "schedule \"interleaved-1f1b\" takes virtual_stages of 2 or more, \"zb-v\" "
                       "and \"dualpipev\" 2 (their V), and virtual_stages goes with them alone "
                       "(schedule \"%s\", virtual_stages %d)",
                       rp_schedule_name(cfg->schedule), cfg->virtual_stages);
    rp_status st = rp_config_chunked(cfg) ? check_chunked(cfg, err) : RP_OK;
    if (!st && rp_config_paired(cfg))
        st = check_paired(cfg, err);
    if (st)
        return st;
    if (cfg->reduction_bucket_mb > 0) {
        const char *why = cfg->schedule >= RP_SCHEDULE_PIPEDREAM
                              ? "the PipeDream schedules (a stage's versions update apart)"
                          : cfg->replicated_tensor_sharding
                              ? "replicated_tensor_sharding (its reduction is a reduce-scatter)"
                          : cfg->fp16_exchange ? "fp16_exchange (its reduction is in fp16)"
                                               : NULL;
        if (why)
            return rp_fail(err, RP_ERR_INVALID, "reduction_bucket_mb does not go with %s yet",
                           why);
    }
    if (rp_config_tensor_parallel(cfg) > 1 && cfg->schedule >= RP_SCHEDULE_PIPEDREAM)
        return rp_fail(err, RP_ERR_INVALID,
                       "tensor_parallel goes with the synchronous schedules, not \"%s\"",
                       rp_schedule_name(cfg->schedule));
    return RP_OK;
}
