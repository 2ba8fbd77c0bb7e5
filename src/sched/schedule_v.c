/*
** The orders of the schedules in a V (schedule.h): zb-v's list schedule on
** the passes' times, and DualPipeV's eight steps, which DualPipe's devices
** run too at their half ranks (schedule_devices.c). Each writes every
** device's passes; schedule_devices.c turns them into the devices' orders
** over the workers' operations.
*/
#include <stdbool.h>
#include <stdlib.h>

#include "repipe/schedule.h"
#include "schedule_impl.h"

/* zb-v: each device's passes in order, 6 GA of them (its two chunks' F, B
** and W of every micro-batch) at 6 GA r as (stage, pass, mb), by a list
** schedule on zb_pass_times (unit times unless set), as zb_orders orders
** the others: the device that can start soonest runs next; of what it can
** start then, a B first (the chunks before it wait for it), the way down's
** (its micro-batch is nearly through) before the way up's, then an F, the
** way up's first (the way down's first can fill the device's room with
** micro-batches that never come back: no pass could start), and a W only
** where nothing else can start (W fills what would be a bubble). On unit
** times this is the least bubble a V allows, P - 1 (worker P - 1 waits for
** the first micro-batch's way down; test_zbv.c); on the passes' own times
** (a GPT's small W, a recomputing stage's large B) Ws land where the unit
** order would idle. A chunk's passes of each kind go in micro-batch order,
** so its Ws sum the gradients in 1f1b's order. A device holds at most 2 P
** micro-batches' chunk activations from F to W: a 1F1B worker's P
** micro-batches of a stage twice as deep. */
rp_status rpi_zbv_orders(const rp_config *cfg, int *seq_stage, int *seq_pass, int *seq_mb,
                            rp_error *err) {
    int S = cfg->layers_per_stage.count, P = S / 2, GA = cfg->gradient_accumulation_steps;
    int *done = calloc((size_t)S * 3, sizeof(int)), *at = calloc((size_t)P, sizeof(int));
    double *tf = malloc(sizeof(double) * S * GA), *tb = malloc(sizeof(double) * S * GA);
    double *free_at = calloc((size_t)P, sizeof(double));
    if (!done || !at || !tf || !tb || !free_at) {
        free(done), free(at), free(tf), free(tb), free(free_at);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a schedule of %d micro-batches", GA);
    }
    const double never = 1e300, *dur = cfg->zb_pass_times;
    for (int i = 0; i < S * GA; i++)
        tf[i] = tb[i] = never;
    for (int left = 3 * S * GA; left > 0; left--) {
        int best_d = -1, best_s = 0, best_pass = 0;
        double best_at = never;
        for (int d = 0; d < P; d++) {
            int up = 2 * P - 1 - d, down = d, held = 0;
            for (int k = 0; k < 2; k++) {
                int c = k ? up : down;
                held += done[3 * c + PASS_F] - done[3 * c + PASS_W];
            }
            /* candidates in priority order: B down, B up, F up, F down */
            int cs[4] = {down, up, up, down}, ps[4] = {PASS_B, PASS_B, PASS_F, PASS_F};
            double ready[4];
            for (int q = 0; q < 4; q++) {
                int c = cs[q], nf = done[3 * c + PASS_F], nb = done[3 * c + PASS_B];
                if (ps[q] == PASS_F)
                    ready[q] = nf < GA && held < 2 * P ? (c == 0 ? 0 : tf[(c - 1) * GA + nf])
                                                       : never;
                else
                    ready[q] = nb < nf ? (c == S - 1 ? tf[c * GA + nb] : tb[(c + 1) * GA + nb])
                                       : never;
            }
            int pick = -1, pass = 0;
            double start = never;
            for (int q = 0; q < 4 && pick < 0; q++)
                if (ready[q] <= free_at[d])
                    pick = cs[q], pass = ps[q], start = free_at[d];
            for (int k = 0; k < 2 && pick < 0; k++) { /* a W, rather than wait */
                int c = k ? down : up;
                if (done[3 * c + PASS_W] < done[3 * c + PASS_B])
                    pick = c, pass = PASS_W, start = free_at[d];
            }
            if (pick < 0) /* else wait for the first that will be ready */
                for (int q = 0; q < 4; q++)
                    if (ready[q] < start)
                        start = ready[q], pick = cs[q], pass = ps[q];
            if (pick < 0)
                continue;
            if (start < best_at)
                best_d = d, best_s = pick, best_pass = pass, best_at = start;
        }
        if (best_d < 0) { /* never met for P <= 6, m <= 24 (test_zbv); F down first met it */
            free(done), free(at), free(tf), free(tb), free(free_at);
            return rp_fail(err, RP_ERR_INVALID, "zb-v: no pass can start (%d left)", left);
        }
        int d = best_d, c = best_s, mb = done[3 * c + best_pass];
        int i = 6 * GA * d + at[d]++;
        seq_stage[i] = c, seq_pass[i] = best_pass, seq_mb[i] = mb;
        if (best_pass == PASS_F)
            tf[c * GA + mb] = best_at + dur[PASS_F];
        else if (best_pass == PASS_B)
            tb[c * GA + mb] = best_at + dur[PASS_B];
        done[3 * c + best_pass]++;
        free_at[d] = best_at + dur[best_pass];
    }
    free(done), free(at), free(tf), free(tb), free(free_at);
    return RP_OK;
}

/* DualPipeV (DeepSeek's, its dualpipev.py; PyTorch's ScheduleDualPipeV):
** zb-v's V, device r holding chunk r on the way down (phase 0) and
** 2 P - 1 - r on the way up (phase 1), GA >= 2 P micro-batches, in eight
** steps: 2 (P - r - 1) forwards down; r + 1 pairs of a forward down and
** one up; P - r - 1 of a backward up, its weights and a forward up; then
** the main step, GA - 2 P + r + 1 times a forward down with a backward up
** and a forward up with a backward down (the pairs DeepSeek overlaps
** with each other's communication; here one after the other, forward
** first); P - r - 1 of a backward up and a forward up with a backward down;
** r + 1 of a backward up and one down, whose weights wait from the middle
** on (from the up one on odd devices, the down one on even); then P - r - 1
** of the oldest waiting weights and a backward down whose weights wait;
** and the r + 1 weights left. A backward runs whole (its W right after its
** B) except where its weights wait, in a queue served oldest first, so
** each chunk's Ws run in micro-batch order: 1f1b's sums. */
typedef struct dpv {
    int *stage, *pass, *mb, n;  /* the device's passes, appended */
    int chunk[2], done_f[2], done_b[2];
    int queue[2 * RP_MAX_STAGES], qs[2 * RP_MAX_STAGES], head, tail, cap;
} dpv;

static void dpv_put(dpv *d, int stage, int pass, int mb) {
    d->stage[d->n] = stage, d->pass[d->n] = pass, d->mb[d->n] = mb;
    d->n++;
}

static void dpv_f(dpv *d, int phase) {
    dpv_put(d, d->chunk[phase], PASS_F, d->done_f[phase]++);
}

static void dpv_w(dpv *d) { /* the oldest waiting weights */
    int i = d->head++ % d->cap;
    dpv_put(d, d->qs[i], PASS_W, d->queue[i]);
}

static void dpv_b(dpv *d, int phase, bool wait) {
    int mb = d->done_b[phase]++;
    dpv_put(d, d->chunk[phase], PASS_B, mb);
    if (!wait) {
        dpv_put(d, d->chunk[phase], PASS_W, mb);
    } else {
        int i = d->tail++ % d->cap;
        d->queue[i] = mb, d->qs[i] = d->chunk[phase];
    }
}

void rpi_dualpipev_orders(const rp_config *cfg, int *seq_stage, int *seq_pass, int *seq_mb) {
    int P = cfg->layers_per_stage.count / 2, GA = cfg->gradient_accumulation_steps;
    for (int r = 0; r < P; r++) {
        int at = 6 * GA * r;
        dpv d = {seq_stage + at, seq_pass + at, seq_mb + at, 0, {r, 2 * P - 1 - r}, {0}, {0},
                 {0}, {0}, 0, 0, 2 * RP_MAX_STAGES};
        for (int i = 0; i < 2 * (P - r - 1); i++)
            dpv_f(&d, 0);
        for (int i = 0; i < r + 1; i++)
            dpv_f(&d, 0), dpv_f(&d, 1);
        for (int i = 0; i < P - r - 1; i++)
            dpv_b(&d, 1, true), dpv_w(&d), dpv_f(&d, 1);
        for (int i = 0; i < GA - 2 * P + r + 1; i++) {
            dpv_f(&d, 0), dpv_b(&d, 1, false);
            dpv_f(&d, 1), dpv_b(&d, 0, false);
        }
        for (int i = 0; i < P - r - 1; i++)
            dpv_b(&d, 1, false), dpv_f(&d, 1), dpv_b(&d, 0, false);
        bool wait = false;
        for (int i = 0; i < r + 1; i++) {
            wait = wait || (i == (r + 1) / 2 && r % 2 == 1);
            dpv_b(&d, 1, wait);
            wait = wait || (i == (r + 1) / 2 && r % 2 == 0);
            dpv_b(&d, 0, wait);
        }
        for (int i = 0; i < P - r - 1; i++)
            dpv_w(&d), dpv_b(&d, 0, true);
        while (d.head < d.tail)
            dpv_w(&d);
    }
}
