/*
** The devices of the chunked schedules (interleaved-1f1b, zb-v, dualpipev)
** and of dualpipe: each device's order of passes (schedule_v.c writes the
** V's), and the devices made from it over the workers' operation lists
** that schedule.c builds.
*/
#include <stdlib.h>

#include "repipe/schedule.h"
#include "schedule_impl.h"

/* The worker of (c, s, j) as if there were no tensor groups: replica by
** replica, stage by stage, its stage replicas in turn. */
int rpi_base_worker(const rp_config *cfg, int c, int s, int j) {
    int P = cfg->layers_per_stage.count, per = 0, before = 0;
    if (!cfg->stage_replication_count) /* a worker a stage (every op asks: keep it short) */
        return c * (P > 0 ? P : 1) + s + j;
    for (int t = 0; t < P; t++) {
        if (t < s)
            before += rp_config_stage_replicas(cfg, t);
        per += rp_config_stage_replicas(cfg, t);
    }
    return c * per + before + j;
}

void rp_interleaved_order(int P, int v, int m, int r, int *stage, bool *fwd, int *mb) {
    int total = m * v, warmup = m == P ? total : (P - r - 1) * 2 + (v - 1) * P;
    warmup = warmup < total ? warmup : total;
    for (int i = 0, f = 0, b = 0; f < total || b < total; i++) {
        /* warm-up forwards, then a forward whenever the backwards have caught up */
        bool F = f < total && (f < warmup || f - warmup == b);
        int k = F ? f++ : b++, chunk = (k / P) % v;
        stage[i] = (F ? chunk : v - 1 - chunk) * P + r;
        fwd[i] = F;
        mb[i] = (k / (P * v)) * P + k % P;
    }
}

static int chunk_of(const rp_config *cfg, int P, int r, int k) {
    return rp_config_chunk(cfg, P, r, k);
}

/* The passes a device runs in an update, and the orders device_orders
** writes: one a pipeline worker (a V's, interleaved-1f1b's), or under
** dualpipe one a position h of P / 2, which devices h and P - 1 - h share. */
static int device_passes(const rp_config *cfg) {
    int GA = cfg->gradient_accumulation_steps;
    return rp_config_paired(cfg) ? 6 * GA
                                 : (rp_config_v_shaped(cfg) ? 3 : 2) * GA * cfg->virtual_stages;
}
static int device_rows(const rp_config *cfg) {
    int S = cfg->layers_per_stage.count;
    return rp_config_paired(cfg) ? S / 2 : S / cfg->virtual_stages;
}

/* Each device's passes in order as (stage, pass, mb) at 6 GA r (zb-v,
** dualpipev, dualpipe) or 2 GA v r (interleaved-1f1b), and each stage's
** from them, into kind and mbs at 3 GA s as zb_orders writes them.
** DualPipe's steps are DualPipeV's on P / 2 positions (DeepSeek's
** dualpipe.py runs the same eight on its half rank h = min(r, P - 1 - r)),
** whose V's stages h and 2 (P / 2) - 1 - h are DualPipe's h and P - 1 - h. */
rp_status rpi_device_orders(const rp_config *cfg, int *seq_stage, int *seq_pass, int *seq_mb,
                            int *kind, int *mbs, rp_error *err) {
    int S = cfg->layers_per_stage.count, v = cfg->virtual_stages, P = device_rows(cfg);
    int GA = cfg->gradient_accumulation_steps, n = device_passes(cfg);
    if (cfg->schedule == RP_SCHEDULE_ZB_V) {
        rp_status st = rpi_zbv_orders(cfg, seq_stage, seq_pass, seq_mb, err);
        if (st)
            return st;
    } else if (cfg->schedule == RP_SCHEDULE_DUALPIPEV || rp_config_paired(cfg)) {
        rpi_dualpipev_orders(cfg, seq_stage, seq_pass, seq_mb);
    } else {
        bool *fwd = malloc(sizeof(bool) * n);
        if (!fwd)
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for a schedule of %d micro-batches",
                           GA);
        for (int r = 0; r < P; r++) {
            rp_interleaved_order(P, v, GA, r, seq_stage + n * r, fwd, seq_mb + n * r);
            for (int i = 0; i < n; i++)
                seq_pass[n * r + i] = fwd[i] ? PASS_F : PASS_B;
        }
        free(fwd);
    }
    int *at = calloc(S, sizeof(int));
    if (!at)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a schedule of %d micro-batches", GA);
    for (int i = 0; i < n * P; i++) {
        int s = seq_stage[i], k = 3 * GA * s + at[s]++;
        kind[k] = seq_pass[i];
        mbs[k] = seq_mb[i];
    }
    free(at);
    return RP_OK;
}

/* The stage replicas of worker r's chunks: one count for all of them
** (rp_session_check), so that worker r is that many devices. */
static int device_replicas(const rp_config *cfg, int P, int r) {
    return rp_config_paired(cfg) ? rp_config_stage_replicas(cfg, r)
                                 : rp_config_stage_replicas(cfg, chunk_of(cfg, P, r, 0));
}

/* Chunk k's worker on device r (of P a replica group) of replica group g,
** as stage replica j: a chunked schedule's chunk k of replica g; under
** dualpipe, of the pair g (replicas 2 g and 2 g + 1), the stage at
** position h = min(r, P - 1 - r) of the pipeline this device is in the
** first half of (k 0: replica 2 g's on devices below P / 2, 2 g + 1's
** above, whose pipeline runs from device P - 1 down), and the stage at
** P - 1 - h of the other (k 1). */
static int device_worker(const rp_config *cfg, int g, int P, int r, int k, int j) {
    if (!rp_config_paired(cfg))
        return rpi_base_worker(cfg, g, chunk_of(cfg, P, r, k), j);
    int h = r < P - 1 - r ? r : P - 1 - r, upper = r >= P / 2;
    return k == 0 ? rpi_base_worker(cfg, 2 * g + upper, h, j)
                  : rpi_base_worker(cfg, 2 * g + !upper, P - 1 - h, j);
}

/* The chunked schedules and dualpipe: each replica's (or pair's) pipeline
** worker r is a device, or with stage replication k of them, device j
** taking the micro-batches of its chunks' stage replica j (mb mod k = j),
** as a stage replica does. A device runs the workers of its chunks
** (device_worker): their passes in its order (dualpipe's device r, position
** h's), the worker's order filtered (each pass: its receive, compute and
** send), then the chunks' closing operations (WAIT_SENDS, REDUCE, STEP) in
** turns, every chunk's reduction before any step (zb-v's tie of the first
** and last chunk is then summed on the device, before either steps), and
** the devices meet in every chunk's reduction in the same order (dualpipe's
** devices r and P - 1 - r both reduce stage h first). Devices are numbered
** by replica (or pair), then worker, then stage replica. */
rp_status rpi_make_devices(const rp_config *cfg, rp_workplan *sc, const int *seq_stage,
                           const int *seq_mb, rp_error *err) {
    bool paired = rp_config_paired(cfg);
    int S = sc->stages, v = paired ? 2 : cfg->virtual_stages, P = paired ? S : S / v;
    int G = paired ? cfg->replication_factor / 2 : cfg->replication_factor;
    int n = device_passes(cfg), per = 0;
    for (int r = 0; r < P; r++)
        per += device_replicas(cfg, P, r);
    int *cursor = calloc(sc->workers, sizeof(int));
    sc->devices = G * per;
    sc->dev = calloc(sc->devices, sizeof(rp_device_ops));
    sc->device_of = malloc(sizeof(int) * sc->workers);
    rp_status st = RP_OK;
    if (!cursor || !sc->dev || !sc->device_of) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory for the devices of %s",
                     rp_schedule_name(cfg->schedule));
        goto done;
    }
    for (int c = 0, at = 0; c < G && !st; c++)
        for (int r = 0; r < P && !st; r++)
            for (int j = 0; j < device_replicas(cfg, P, r) && !st; j++, at++) {
                rp_device_ops *d = &sc->dev[at];
                int total = 0, k_r = device_replicas(cfg, P, r);
                int row = paired && r >= P / 2 ? P - 1 - r : r; /* its order's */
                for (int k = 0; k < v; k++) {
                    int w = device_worker(cfg, c, P, r, k, j);
                    sc->device_of[w] = at;
                    total += sc->w[w].num_ops;
                }
                d->worker = malloc(sizeof(int) * total);
                d->op = malloc(sizeof(int) * total);
                if (!d->worker || !d->op) {
                    st = rp_fail(err, RP_ERR_NOMEM, "out of memory for the devices of %s",
                                 rp_schedule_name(cfg->schedule));
                    break;
                }
                for (int i = 0; i < n; i++) { /* a pass ends at its compute, or at the send after */
                    int stage = seq_stage[n * row + i];
                    if (seq_mb[n * row + i] % k_r != j)
                        continue;
                    int w = !paired ? rpi_base_worker(cfg, c, stage, j)
                                    : device_worker(cfg, c, P, r, stage == row ? 0 : 1, j);
                    const rp_worker_ops *wo = &sc->w[w];
                    for (bool computed = false; cursor[w] < wo->num_ops;) {
                        rp_op_kind kd = wo->ops[cursor[w]].kind;
                        if (computed && kd != RP_OP_SEND_ACT && kd != RP_OP_SEND_GRAD)
                            break;
                        computed = computed || kd == RP_OP_FORWARD || kd == RP_OP_BACKWARD ||
                                   kd == RP_OP_BACKWARD_INPUT || kd == RP_OP_BACKWARD_WEIGHT;
                        d->worker[d->num] = w, d->op[d->num++] = cursor[w]++;
                        if (kd == RP_OP_SEND_ACT || kd == RP_OP_SEND_GRAD)
                            break;
                    }
                }
                for (bool more = true; more;) { /* the closing operations, in turns */
                    more = false;
                    for (int k = 0; k < v; k++) {
                        int w = device_worker(cfg, c, P, r, k, j);
                        if (cursor[w] < sc->w[w].num_ops)
                            d->worker[d->num] = w, d->op[d->num++] = cursor[w]++, more = true;
                    }
                }
            }
done:
    free(cursor);
    return st;
}
