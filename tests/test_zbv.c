/*
** zb-v: P pipeline workers each run two chunks of a 2 P-stage pipeline in a
** V (worker r holds chunk r on the way down and 2 P - 1 - r on the way up),
** each chunk's F, B and W in micro-batch order, so the weights and losses
** are 1f1b's on those 2 P stages bit for bit (MLP, CNN, a GPT with dropout
** whose tied embedding and head share worker 0, or, on 6 chunks, lie on
** two workers), with clipping and loss scaling taken at a device's step;
** the plan's devices and orders; the checker refuses a W moved before its
** B; on unit pass times the simulator's bubble is below zb-h1's and
** 1f1b's on the same P workers, clipping or not; what it does not take,
** named. With --mpi under mpirun -np N: the cases of N devices on N ranks,
** a rank holding a device's two chunks, against 1f1b on threads, and a
** training state moved between the two.
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
    {2, 2, 8, ""},
    {3, 1, 6, ""},
    {3, 2, 4, ""},
    {2, 2, 4, ", \"replicated_tensor_sharding\": true"},
    {2, 1, 4, ", \"recompute_checkpoint_every_layer\": true, \"device_iterations\": 2"},
    {2, 1, 8, ", \"fp16_exchange\": true"},
    {2, 1, 4, ", \"gradient_clipping\": 0.05"},
    /* 2^60 overflows fp16 between stages: every update skipped, the scale halved */
    {2, 2, 4, ", \"auto_loss_scaling\": true, \"fp16_exchange\": true, "
              "\"loss_scaling\": 1152921504606846976, \"gradient_clipping\": 0.05"},
    {2, 2, 8, ", \"auto_loss_scaling\": true, \"gradient_clipping\": 0.05"},
    /* stage replication: a worker's two chunks replicated together */
    {2, 1, 4, ", \"stage_replication\": [2, 1, 1, 2]"},
    {2, 1, 8, ", \"stage_replication\": [1, 2, 2, 1]"},
    {2, 2, 4, ", \"stage_replication\": [2, 1, 1, 2], \"gradient_clipping\": 0.05"},
    {3, 1, 6, ", \"stage_replication\": [1, 2, 1, 1, 2, 1]"},
    /* tensor groups: a device of each rank of its chunks' groups (the GPT
    ** alone: they split attention and MLP blocks) */
    {2, 1, 4, ", \"tensor_parallel\": 2"},
    {2, 2, 4, ", \"tensor_parallel\": 2, \"gradient_clipping\": 0.05"},
    {2, 1, 8, ", \"tensor_parallel\": 2, \"stage_replication\": [1, 2, 2, 1]"},
    {2, 1, 4, ", \"tensor_parallel\": 2, \"vocab_parallel\": false"},
    /* ordered on the passes' times (1f1b takes none: its case is without) */
    {3, 1, 6, ", \"zb_pass_times\": [1, 3, 1]"},
    {2, 2, 8, ", \"zb_pass_times\": [3.05, 3.29, 2.43]"},
};

/* Each case against 1f1b on threads; with ranks, on as many MPI ranks. */
static void exact(int ranks) {
    v_exact(CASES, sizeof CASES / sizeof CASES[0], 2, "zb-v", ranks, mpi, data);
}

/* A checkpoint moves between zb-v on MPI ranks (or threads) and 1f1b on
** threads, either way, and the run goes on as if never stopped (on 3
** ranks, worker 0 replicated: 3 devices). */
static void resume(int ranks) {
    vcase vc = {2, ranks == 4 ? 2 : 1, 4, ranks == 3 ? ", \"stage_replication\": [2, 1, 1, 2]" : ""};
    v_resume(&vc, 2, "zb-v", ranks ? mpi : NULL, data);
}

static void plan(void) {
    vcase vc = {3, 2, 8, ""};
    rp_config c = vconfig(&vc, 2, "zb-v", false);
    rp_workplan *p;
    rp_error err;
    CHECK_OK(rp_workplan_build(&c, &p, &err), err);
    CHECK(p->devices == 6 && p->workers == 12);
    CHECK_OK(rp_workplan_check(p, NULL, &err), err);
    /* replica c's chunk s (worker 6 c + s) on device 3 c + min(s, 5 - s) */
    for (int w = 0; w < p->workers; w++) {
        int s = w % 6, at = (w / 6) * 3 + (s < 3 ? s : 5 - s);
        CHECKF(p->device_of[w] == at, "worker %d on device %d, the V's %d", w, p->device_of[w],
               at);
        int last[3] = {-1, -1, -1};
        for (int i = 0; i < p->w[w].num_ops; i++) {
            const rp_op *op = &p->w[w].ops[i];
            int k = v_pass(op);
            CHECK(op->kind != RP_OP_BACKWARD);
            if (k >= 0)
                CHECK(op->mb == ++last[k]);
        }
        CHECK(last[0] == 7 && last[1] == 7 && last[2] == 7);
    }
    /* every device's reductions before its steps */
    for (int d = 0; d < p->devices; d++) {
        const rp_device_ops *dv = &p->dev[d];
        int last_reduce = -1, first_step = dv->num;
        for (int j = 0; j < dv->num; j++) {
            rp_op_kind k = p->w[dv->worker[j]].ops[dv->op[j]].kind;
            if (k == RP_OP_REDUCE)
                last_reduce = j;
            if (k == RP_OP_STEP && j < first_step)
                first_step = j;
        }
        CHECK(last_reduce >= 0 && last_reduce < first_step);
    }
    /* device 0 (chunks 0 and 5): chunk 5's first W moved before its first
    ** B, whose output gradient it needs */
    int wi = v_find_op(p, 0, 5, RP_OP_BACKWARD_WEIGHT), bi = v_find_op(p, 0, 5, RP_OP_BACKWARD_INPUT);
    CHECK(wi > bi && bi >= 0);
    test_move_device_op(&p->dev[0], wi, bi);
    CHECK(rp_workplan_check(p, NULL, &err) == RP_ERR_INVALID);
    rp_workplan_free(p);
    /* the CSV: a row a device, the V's stages on it */
    vcase one = {2, 1, 4, ""};
    c = vconfig(&one, 2, "zb-v", false);
    char *csv;
    CHECK_OK(rp_schedule_csv(&c, &csv, &err), err);
    CHECK(csv && strncmp(csv, "0F0,", 4) == 0 && strstr(csv, "3F0") && strstr(csv, "3I0") &&
          strstr(csv, "0W3") && strchr(csv, '\n') && !strstr(strchr(csv, '\n') + 1, "0F0"));
    free(csv);
}

/* One update of zb-v on P workers of 2 P one-layer chunks, m micro-batches,
** each chunk's forward f, input half bi and weight half bw (ms), no bytes
** and free transfers; extra: more keys. Milliseconds. */
static double v_update_ms(int P, int m, double f, double bi, double bw, const char *extra) {
    char layers[64], json[512];
    snprintf(json, sizeof json, "{\"gradient_accumulation_steps\": %d, \"layers_per_stage\": "
             "%s, \"schedule\": \"zb-v\"%s}", m, test_ones(layers, sizeof layers, 2 * P), extra);
    return test_pass_update_ms(json, 2 * P, f, bi, bw);
}

/* On unit chunks (F = B = W = 1 ms) and free transfers, each of P workers
** computes 6 m ms an update. 1f1b's and zb-h1's bubbles on the same P
** workers (stages twice as deep) are 6 (P - 1) and 2 (P - 1) ms (Qi et
** al.); no V can do with less than P - 1 (worker P - 1 cannot start before
** the first micro-batch's way down reaches it, and then has 6 m to do), and
** zb-v's order has exactly that. Every shape to P 6 and 24 micro-batches
** orders without a wait that never ends. */
static void bubbles(void) {
    static const int PM[][2] = {{2, 4}, {2, 8}, {3, 6}, {4, 8}, {4, 16}};
    rp_error err;
    for (int i = 0; i < 10; i++) { /* then with clipping: its norm waits for every device */
        int P = PM[i % 5][0], m = PM[i % 5][1];
        double ideal = 6.0 * m,
               t = v_update_ms(P, m, 1, 1, 1, i < 5 ? "" : ", \"gradient_clipping\": 1");
        if (i < 5)
            printf("zb-v P=%d m=%d: %.1f ms, %.1f ms of bubble (1f1b %d, zb-h1 %d)\n", P, m, t,
                   t - ideal, 6 * (P - 1), 2 * (P - 1));
        /* (no parameters: the steps after the norm take no time) */
        CHECKF(fabs(t - ideal - (P - 1)) < 1e-9, "zb-v P=%d m=%d%s: %.3f ms, the work %.0f and "
               "the V's least bubble %d", P, m, i < 5 ? "" : " with clipping", t, ideal, P - 1);
    }
    /* Ordered on the passes' times where they differ: faster than the
    ** unit order, and never below the work plus the last worker's wait
    ** for the first micro-batch's way down, (P - 1) F (W the GPT's smaller
    ** half; a stage that recomputes, B three times F) */
    static const struct { int P, m; double f, b, w; } TIMED[] = {
        {2, 8, 1, 1.08, 0.8}, {3, 6, 1, 3, 1}, {4, 16, 1, 1.08, 0.8}, {2, 8, 1, 1, 0.3}};
    for (int i = 0; i < 4; i++) {
        int P = TIMED[i].P, m = TIMED[i].m;
        char times[128];
        snprintf(times, sizeof times, ", \"zb_pass_times\": [%g, %g, %g]", TIMED[i].f,
                 TIMED[i].b, TIMED[i].w);
        double t[2] = {v_update_ms(P, m, TIMED[i].f, TIMED[i].b, TIMED[i].w, ""),
                       v_update_ms(P, m, TIMED[i].f, TIMED[i].b, TIMED[i].w, times)};
        double least = 2.0 * m * (TIMED[i].f + TIMED[i].b + TIMED[i].w) + (P - 1) * TIMED[i].f;
        printf("zb-v P=%d m=%d, F %g B %g W %g: %.2f ms on unit times' order, %.2f on the "
               "passes' (at least %.2f)\n", P, m, TIMED[i].f, TIMED[i].b, TIMED[i].w, t[0], t[1],
               least);
        CHECKF(t[1] < t[0] - 1e-9 && t[1] >= least - 1e-9, "zb-v P=%d m=%d: %.3f ms timed, %.3f "
               "on unit times, the least %.3f", P, m, t[1], t[0], least);
    }
    /* on unit times, and on the passes' times of a GPT (W the smaller
    ** half), of a stage that recomputes (B three times F), of W larger
    ** than F and B, of a slow forward, and uneven ones */
    static const char *TIMES[] = {"[1, 1, 1]",    "[3.05, 3.29, 2.43]", "[1, 3, 1]",
                                  "[1, 0.5, 2]",  "[2, 1, 1]",          "[1, 1, 0.3]",
                                  "[1, 2.7, 0.1]", "[0.2, 1, 1]"};
    for (int t = 0; t < 8; t++)
        for (int P = 2; P <= 6; P++)
            for (int m = 1; m <= 24; m++) {
                char layers[64], json[512];
                snprintf(json, sizeof json, "{\"gradient_accumulation_steps\": %d, "
                         "\"layers_per_stage\": %s, \"schedule\": \"zb-v\", "
                         "\"zb_pass_times\": %s}", m, test_ones(layers, sizeof layers, 2 * P),
                         TIMES[t]);
                rp_config c = test_config(json);
                rp_workplan *p;
                rp_status st = rp_workplan_build(&c, &p, &err);
                CHECKF(!st && rp_workplan_check(p, NULL, &err) == RP_OK, "zb-v P=%d m=%d, %s: %s",
                       P, m, TIMES[t], err.msg);
                if (!st)
                    rp_workplan_free(p);
            }
}

static void refused(void) {
    rp_model *m = test_model(MLP);
    rp_error err;
    static const char *const bad[][2] = {
        {"\"schedule\": \"zb-v\", \"virtual_stages\": 3", "\"zb-v\" and \"dualpipev\" 2 (their V)"},
        {"\"schedule\": \"zb-v\", \"stage_replication\": [2, 1, 1, 1]", "stage_replication"}};
    for (int i = 0; i < 2; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"gradient_accumulation_steps\": 4, \"layers_per_stage\": "
                 "[-1, -1, -1, -1], %s}", bad[i][0]);
        rp_config bc = test_config(json);
        CHECK(rp_session_check(m, &bc, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, bad[i][1]);
    }
    /* three chunks do not make a V */
    rp_config odd = test_config("{\"layers_per_stage\": [-1, -1, -1], \"schedule\": \"zb-v\"}");
    CHECK(rp_session_check(m, &odd, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "chunks per worker");
    rp_model_free(m);
}

static void local(void) {
    plan();
    bubbles();
    refused();
    exact(0);
    resume(0);
}

static void with_mpi(int ranks) {
    exact(ranks);
    resume(ranks);
}

int main(int argc, char **argv) {
    test_start(argc, argv, 512, 9, &data, &mpi);
    return test_main("test_zbv", mpi, data, with_mpi, local);
}
