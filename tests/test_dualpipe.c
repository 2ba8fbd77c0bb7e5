/*
** dualpipe: DeepSeek's DualPipe, replicas 2q and 2q + 1 each a pipeline of
** P stages over the same P devices in opposite directions (device r holds
** stage r of the one and stage P - 1 - r of the other), each device running
** DualPipeV's eight steps at its half rank h = min(r, P - 1 - r), as
** DeepSeek's dualpipe.py does: every rank's passes are those its own code
** orders (and dualpipev.py's for dualpipev; tests/fixtures/dualpipe). Each
** stage's passes of a kind run in micro-batch order, so the weights and
** losses are those of 1f1b with the same replicas on the same stages bit
** for bit (MLP, CNN, a GPT with dropout and its tied head summed on devices
** 0 and P - 1; two pairs, a replicated stage pair, recomputation, sharding,
** tensor groups, clipping). The orders: every shape to P 6 and 16
** micro-batches checked free of waits, a device holding P + 1
** micro-batches' activations at most; the checker refuses a W moved before
** its B; a device's two stages are the mirrored ones. On unit passes the
** simulator gives DualPipe's bubble. A training state moves to and from
** 1f1b as if never stopped. What it does not take, named. With --mpi under
** mpirun -np N: the cases of N devices on N ranks.
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

#ifndef REPIPE_FIXTURES_DUALPIPE
#define REPIPE_FIXTURES_DUALPIPE "tests/fixtures/dualpipe"
#endif

static const char *MLP = TEST_SPEC_MLP;

static rp_dataset *data;
static rp_comm *mpi;

static const vcase CASES[] = { /* P stages, R replicas, GA */
    {2, 2, 2, ""},
    {2, 2, 4, ""},
    {4, 2, 4, ""},
    {4, 2, 8, ""},
    /* two pairs; on 4 ranks, servers of 2 sum in worker order as threads do
    ** (a flat MPI allreduce of 4 groups its sums its own way: test_buckets) */
    {2, 4, 3, ", \"workers_per_server\": 2"},
    {2, 2, 2, ", \"recompute_checkpoint_every_layer\": true"},
    {4, 2, 4, ", \"gradient_clipping\": 0.05"},
    {2, 2, 2, ", \"replicated_tensor_sharding\": true"},
    /* a device's two stages replicated together */
    {4, 2, 4, ", \"stage_replication\": [2, 1, 1, 2]"},
    /* tensor groups (the GPT alone: they split its blocks) */
    {2, 2, 2, ", \"tensor_parallel\": 2"},
};

/* Each case against 1f1b on threads; with ranks, on as many MPI ranks. */
static void exact(int ranks) {
    v_exact(CASES, sizeof CASES / sizeof CASES[0], 1, "dualpipe", ranks, mpi, data);
}

/* A training state moves between dualpipe on MPI ranks (or threads) and
** 1f1b with the same replicas on threads, either way, and the run goes on
** as if never stopped (Adam's moments too; 2 or 4 devices). */
static void resume(int ranks) {
    vcase dc = ranks == 4 ? (vcase){4, 2, 4, ""} : (vcase){2, 2, 2, ""};
    v_resume(&dc, 1, "dualpipe", ranks ? mpi : NULL, data);
}

/* Every shape checked free of waits; P R / 2 devices, device r holding
** stage r of replica 2q and P - 1 - r of replica 2q + 1; on each device
** each stage's F, B and W in micro-batch order, m of each. A W moved
** before its B is refused. */
static void orders(void) {
    rp_error err;
    int shapes = 0;
    for (int P = 2; P <= 6; P += 2)
        for (int R = 2; R <= 4; R += 2)
            for (int m = P; m <= 16; m++) {
                char layers[64], json[512];
                snprintf(json, sizeof json, "{\"gradient_accumulation_steps\": %d, "
                         "\"replication_factor\": %d, \"layers_per_stage\": %s, "
                         "\"schedule\": \"dualpipe\"}", m, R, test_ones(layers, sizeof layers, P));
                rp_config c = test_config(json);
                rp_workplan *p;
                rp_status st = rp_workplan_build(&c, &p, &err);
                CHECKF(!st && rp_workplan_check(p, NULL, &err) == RP_OK,
                       "dualpipe P=%d R=%d m=%d: %s", P, R, m, err.msg);
                if (st)
                    continue;
                shapes++;
                CHECK(p->devices == P * R / 2 && p->workers == P * R);
                int most_all = 0;
                char what[64];
                snprintf(what, sizeof what, "dualpipe P=%d R=%d m=%d", P, R, m);
                for (int d = 0; d < p->devices; d++) {
                    int q = d / P, r = d % P, n[2] = {0};
                    for (int w = 0; w < p->workers; w++)
                        if (p->device_of[w] == d) {
                            const rp_worker_ops *wo = &p->w[w];
                            bool down = wo->replica == 2 * q && wo->stage == r;
                            bool up = wo->replica == 2 * q + 1 && wo->stage == P - 1 - r;
                            CHECKF(down || up, "P=%d device %d holds replica %d's stage %d", P,
                                   d, wo->replica, wo->stage);
                            n[up]++;
                        }
                    CHECK(n[0] == 1 && n[1] == 1);
                    int most = v_device_passes(p, d, m, what, NULL); /* stage activations */
                    most_all = most > most_all ? most : most_all;
                }
                /* DualPipe's README: PP + 1 micro-batches' activations a device */
                CHECKF(most_all == P + 1, "dualpipe P=%d R=%d m=%d: at most %d micro-batches' "
                       "stage activations a device, want %d", P, R, m, most_all, P + 1);
                if (P == 4 && R == 2 && m == 8) { /* device 0: its first W before its B */
                    int w0 = p->dev[0].worker[0];
                    int wi = v_find_op(p, 0, w0, RP_OP_BACKWARD_WEIGHT);
                    int bi = v_find_op(p, 0, w0, RP_OP_BACKWARD_INPUT);
                    CHECK(wi > bi && bi >= 0);
                    test_move_device_op(&p->dev[0], wi, bi);
                    CHECK(rp_workplan_check(p, NULL, &err) == RP_ERR_INVALID);
                }
                rp_workplan_free(p);
            }
    printf("dualpipe: %d shapes (P 2 to 6, R 2 and 4, P to 16 micro-batches) free of waits\n",
           shapes);
}

/* DeepSeek's own orders (tests/fixtures/dualpipe: dualpipe.py's and
** dualpipev.py's step() on each rank, its compute recorded): every rank's
** passes, "F0.3" a forward of its module 0's micro-batch 3, are repipe's
** device's for the same ranks and micro-batches. Module 0 of dualpipe's
** rank r is stage r of replica 0 and module 1 stage P - 1 - r of replica 1
** (half the micro-batches a direction: GA m / 2); dualpipev's are chunks r
** and 2 P - 1 - r (GA m). */
static void deepseek_orders(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/orders.txt", REPIPE_FIXTURES_DUALPIPE);
    FILE *f = fopen(path, "r");
    CHECKF(f != NULL, "%s: cannot open", path);
    if (!f)
        return;
    static char line[8192];
    int ranks_checked = 0, lines = 0;
    rp_workplan *p = NULL;
    char have[32] = "";
    while (fgets(line, sizeof line, f)) {
        char sched[16], *colon = strchr(line, ':');
        int n, m, r;
        if (line[0] == '#' || !colon || sscanf(line, "%15s %d %d %d", sched, &n, &m, &r) != 4)
            continue;
        lines++;
        bool v = strcmp(sched, "dualpipev") == 0;
        char key[32], layers[128], json[512];
        snprintf(key, sizeof key, "%s %d %d", sched, n, m);
        if (strcmp(key, have) != 0) { /* the case's workplan, once */
            rp_workplan_free(p);
            p = NULL;
            snprintf(json, sizeof json, "{\"gradient_accumulation_steps\": %d, "
                     "\"replication_factor\": %d, \"layers_per_stage\": %s, \"schedule\": "
                     "\"%s\"}", v ? m : m / 2, v ? 1 : 2,
                     test_ones(layers, sizeof layers, v ? 2 * n : n), sched);
            rp_config c = test_config(json);
            rp_error err;
            CHECKF(rp_workplan_build(&c, &p, &err) == RP_OK, "%s: %s", key, err.msg);
            if (!p)
                continue;
            snprintf(have, sizeof have, "%s", key);
        }
        char mine[8192] = "";
        size_t at = 0;
        const rp_device_ops *dv = &p->dev[r];
        for (int j = 0; j < dv->num && at < sizeof mine - 32; j++) {
            const rp_worker_ops *w = &p->w[dv->worker[j]];
            const rp_op *op = &w->ops[dv->op[j]];
            char k = op->kind == RP_OP_FORWARD           ? 'F'
                     : op->kind == RP_OP_BACKWARD_INPUT  ? 'B'
                     : op->kind == RP_OP_BACKWARD_WEIGHT ? 'W'
                                                         : 0;
            if (k)
                at += (size_t)snprintf(mine + at, sizeof mine - at, "%s%c%d.%d", at ? " " : "",
                                       k, w->stage != r, op->mb);
        }
        char *theirs = colon + 1;
        theirs += strspn(theirs, " ");
        theirs[strcspn(theirs, "\n")] = 0;
        bool same = strcmp(mine, theirs) == 0;
        CHECKF(same, "%s rank %d: DeepSeek's order\n  %s\nrepipe's\n  %s", key, r, theirs, mine);
        ranks_checked += same;
    }
    fclose(f);
    rp_workplan_free(p);
    CHECK(lines > 100);
    printf("DeepSeek's dualpipe.py and dualpipev.py: %d of %d ranks' orders repipe's\n",
           ranks_checked, lines);
}

/* One update of dualpipe on P devices of P one-layer stages, two replicas,
** m micro-batches each, unit passes (F, B's input half and W 1 ms each),
** free transfers and reductions. Milliseconds. */
static double update_ms(int P, int m) {
    char layers[128], json[512];
    snprintf(json, sizeof json, "{\"gradient_accumulation_steps\": %d, \"replication_factor\": "
             "2, \"layers_per_stage\": %s, \"schedule\": \"dualpipe\"}", m,
             test_ones(layers, sizeof layers, P));
    return test_pass_update_ms(json, P, 1, 1, 1);
}

/* DualPipe's README: a bubble of (PP/2 - 1)(F&B + B - 3 W) a device, PP the
** devices, B a whole backward (B's input half and W), F&B a forward
** overlapped with a backward. On unit passes (F = 1, B = 2, W = 1) the
** order, the pair's forward first and no overlap, idles P/2 - 1 a device
** beside its 6 m of work (two stages, m micro-batches each): the formula
** where the paired backward hides the forward (F&B = B = 2). */
static void bubbles(void) {
    static const int PM[][2] = {{4, 4}, {4, 8}, {8, 8}, {8, 16}, {16, 16}, {16, 32}};
    for (int i = 0; i < 6; i++) {
        int P = PM[i][0], m = PM[i][1];
        double t = update_ms(P, m), work = 6.0 * m, bubble = (P / 2 - 1) * (2.0 + 2.0 - 3.0);
        printf("dualpipe PP=%d m=%d a direction: %.1f ms, %.1f ms of bubble (the formula with "
               "F&B = B: %.1f)\n", P, m, t, t - work, bubble);
        CHECKF(fabs(t - work - bubble) < 1e-9, "dualpipe P=%d m=%d: %.3f ms, the work %.0f and "
               "the formula's bubble %.0f", P, m, t, work, bubble);
    }
}

static void refused(void) {
    rp_model *m = test_model(MLP);
    rp_error err;
    static const char *const bad[][2] = {
        {"[-1, -1, -1], \"replication_factor\": 2, \"gradient_accumulation_steps\": 4",
         "an even number of stages"},
        {"[-1, -1], \"replication_factor\": 3, \"gradient_accumulation_steps\": 4",
         "replication_factor must be even"},
        {"[-1, -1, -1, -1], \"replication_factor\": 2, \"gradient_accumulation_steps\": 3",
         "at least the stages"},
        {"[-1, -1, -1, -1], \"replication_factor\": 2, \"gradient_accumulation_steps\": 4, "
         "\"stage_replication\": [2, 1, 1, 1]",
         "stages 0 and 3 share devices"}};
    for (int i = 0; i < 4; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"schedule\": \"dualpipe\", \"layers_per_stage\": %s}",
                 bad[i][0]);
        rp_config bc = test_config(json);
        CHECK(rp_session_check(m, &bc, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, bad[i][1]);
    }
    rp_model_free(m);
}

static void local(void) {
    deepseek_orders();
    orders();
    bubbles();
    refused();
    exact(0);
    resume(0);
}

static void with_mpi(int ranks) {
    exact(ranks);
    if (ranks == 2 || ranks == 4)
        resume(ranks);
}

int main(int argc, char **argv) {
    test_start(argc, argv, 512, 9, &data, &mpi);
    return test_main("test_dualpipe", mpi, data, with_mpi, local);
}
