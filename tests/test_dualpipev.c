/*
** dualpipev: DeepSeek's DualPipeV on zb-v's V (worker r holds chunk r on the
** way down and 2 P - 1 - r on the way up), its eight steps of paired
** forwards and backwards, a chunk's W after its B or, where DualPipeV
** lets it wait, in a queue served oldest first; so each chunk's passes of
** a kind run in micro-batch order and the weights and losses are 1f1b's
** on those 2 P stages bit for bit (MLP, CNN, a GPT with dropout and a tied
** head; replicas, a replicated stage, recomputation, tensor groups,
** clipping). The orders: every shape to P 6 and 24 micro-batches checked
** free of waits, each device's steps as DualPipeV's counts; the checker
** refuses a W moved before its B. On unit passes the simulator gives
** DualPipe's bubble, (P - 1)(F&B + B - 3 W) a device (below: with F&B
** = B), for P 4, 8 and 16 devices. With
** --mpi under mpirun -np N: the cases of N devices on N ranks. (Every
** device's order against DeepSeek's dualpipev.py itself: test_dualpipe's
** deepseek_orders, with DualPipe's.)
*/
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>

#include "repipe/data.h"
#include "repipe/schedule.h"
#include "repipe/session.h"
#include "repipe/simulate.h"
#include "support.h"
#include "vshape.h"
#include "test.h"

static const char *MLP = TEST_SPEC_MLP;

static rp_dataset *data;
static rp_comm *mpi;

static const vcase CASES[] = {
    {2, 1, 4, ""},
    {2, 1, 8, ""},
    {2, 2, 4, ""},
    {3, 1, 6, ""},
    {3, 2, 8, ""},
    {2, 1, 4, ", \"recompute_checkpoint_every_layer\": true"},
    {2, 2, 4, ", \"gradient_clipping\": 0.05"},
    /* stage replication: a worker's two chunks replicated together */
    {2, 1, 4, ", \"stage_replication\": [2, 1, 1, 2]"},
    {2, 1, 8, ", \"stage_replication\": [1, 2, 2, 1]"},
    /* tensor groups (the GPT alone: they split its blocks) */
    {2, 1, 4, ", \"tensor_parallel\": 2"},
};

/* Each case against 1f1b on threads; with ranks, on as many MPI ranks. */
static void exact(int ranks) {
    v_exact(CASES, sizeof CASES / sizeof CASES[0], 2, "dualpipev", ranks, mpi, data);
}

/* Every shape checked free of waits; on each device, each chunk's F, B and
** W in micro-batch order, m of each, and DualPipeV's warm-up: 2 P forwards
** before the first backward (2 (P - r - 1) down, then r + 1 down and up),
** one more on the last device (its main step opens with a forward down);
** at most 2 P + 1 micro-batches' chunk activations held on a device.
** A W moved before its B is refused. */
static void orders(void) {
    rp_error err;
    int shapes = 0;
    for (int P = 2; P <= 6; P++) {
        int most_all = 0; /* DualPipe's PP + 1, PP in stages: 2 P + 1 */
        for (int m = 2 * P; m <= 24; m++) {
            char layers[64], json[512];
            snprintf(json, sizeof json, "{\"gradient_accumulation_steps\": %d, "
                     "\"layers_per_stage\": %s, \"schedule\": \"dualpipev\"}", m,
                     test_ones(layers, sizeof layers, 2 * P));
            rp_config c = test_config(json);
            rp_workplan *p;
            rp_status st = rp_workplan_build(&c, &p, &err);
            CHECKF(!st && rp_workplan_check(p, NULL, &err) == RP_OK, "dualpipev P=%d m=%d: %s",
                   P, m, err.msg);
            if (st)
                continue;
            shapes++;
            CHECK(p->devices == P && p->workers == 2 * P);
            char what[64];
            snprintf(what, sizeof what, "dualpipev P=%d m=%d", P, m);
            for (int d = 0; d < p->devices; d++) {
                int fwd_before_b, most = v_device_passes(p, d, m, what, &fwd_before_b);
                CHECKF(most <= 2 * P + 1, "P=%d m=%d device %d holds %d micro-batches' chunks",
                       P, m, d, most);
                most_all = most > most_all ? most : most_all;
                /* steps 1 to 3's forwards come before the first backward */
                CHECKF(fwd_before_b == 2 * P + (d == P - 1), "P=%d m=%d device %d: %d "
                       "forwards before the first backward", P, m, d, fwd_before_b);
            }
            if (P == 3 && m == 8) { /* device 0: chunk 5's first W before its first B */
                int wi = v_find_op(p, 0, 5, RP_OP_BACKWARD_WEIGHT);
                int bi = v_find_op(p, 0, 5, RP_OP_BACKWARD_INPUT);
                CHECK(wi > bi && bi >= 0);
                test_move_device_op(&p->dev[0], wi, bi);
                CHECK(rp_workplan_check(p, NULL, &err) == RP_ERR_INVALID);
            }
            rp_workplan_free(p);
        }
        CHECKF(most_all == 2 * P + 1, "P=%d: at most %d micro-batches' chunks a device, want %d",
               P, most_all, 2 * P + 1);
    }
    printf("dualpipev: %d shapes (P 2 to 6, 2 P to 24 micro-batches) free of waits\n", shapes);
}

/* One update of dualpipev on P devices of 2 P one-layer chunks, m
** micro-batches, unit passes (F, B's input half and W 1 ms each), free
** transfers. Milliseconds. */
static double v_update_ms(int P, int m) {
    char layers[128], json[512];
    snprintf(json, sizeof json, "{\"gradient_accumulation_steps\": %d, \"layers_per_stage\": "
             "%s, \"schedule\": \"dualpipev\"}", m, test_ones(layers, sizeof layers, 2 * P));
    return test_pass_update_ms(json, 2 * P, 1, 1, 1);
}

/* DualPipe's README: a bubble of (PP/2 - 1)(F&B + B - 3 W) a device, PP the
** stages (2 P here), B a whole backward (B's input half and W), F&B a
** forward overlapped with a backward. On unit passes (F = 1, B = 2, W = 1)
** repipe's order, the pair's forward first and no overlap, idles (P - 1) F
** a device beside its 6 m of work: the formula's value where the paired
** backward hides the forward (F&B = B = 2: (P - 1)(2 + 2 - 3)); read with
** F&B = F + B (3) the formula would give 2 (P - 1), which the order beats
** because the way down's forwards run while the way up's gradients come
** back. 1f1b on the same P workers (stages twice as deep) idles 6 (P - 1). */
static void bubbles(void) {
    static const int PM[][2] = {{2, 4}, {4, 8}, {4, 16}, {8, 16}, {8, 32}, {16, 32}};
    for (int i = 0; i < 6; i++) {
        int P = PM[i][0], m = PM[i][1];
        double t = v_update_ms(P, m), work = 6.0 * m, bubble = (P - 1) * (2.0 + 2.0 - 3.0);
        printf("dualpipev P=%d (PP %d) m=%d: %.1f ms, %.1f ms of bubble (the formula with F&B = "
               "B: %.1f; 1f1b's %d)\n", P, 2 * P, m, t, t - work, bubble, 6 * (P - 1));
        CHECKF(fabs(t - work - bubble) < 1e-9, "dualpipev P=%d m=%d: %.3f ms, the work %.0f and "
               "the formula's bubble %.0f", P, m, t, work, bubble);
    }
}

static void refused(void) {
    rp_model *m = test_model(MLP);
    rp_error err;
    static const char *const bad[][2] = {
        {"\"schedule\": \"dualpipev\", \"virtual_stages\": 3", "\"dualpipev\" 2 (their V)"},
        {"\"schedule\": \"dualpipev\", \"gradient_accumulation_steps\": 3",
         "at least twice the pipeline's workers"}};
    for (int i = 0; i < 2; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"layers_per_stage\": [-1, -1, -1, -1], %s}", bad[i][0]);
        rp_config bc = test_config(json);
        CHECK(rp_session_check(m, &bc, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, bad[i][1]);
    }
    rp_model_free(m);
}

static void local(void) {
    orders();
    bubbles();
    refused();
    exact(0);
}

static void with_mpi(int ranks) {
    exact(ranks);
}

int main(int argc, char **argv) {
    test_start(argc, argv, 512, 9, &data, &mpi);
    return test_main("test_dualpipev", mpi, data, with_mpi, local);
}
