/*
** Schedules from outside (rp_sim_actions): PyTorch's published CSV
** schedules load, pass the checks and play on one clock; repipe's own
** schedules written in that form play to rp_simulate's times; bad lists are
** refused with the line and what is wrong.
**
** Every stage is one layer of unit times: forward 1 ms, backward 2 ms whose
** halves are 1 ms each, and transfers free, so that a schedule's time is
** counted in PyTorch's own steps of one action.
*/
#include <stdlib.h>
#include <string.h>

#include "../src/core/util.h"
#include "repipe/simulate.h"
#include "support.h"
#include "test.h"

#ifndef REPIPE_FIXTURES_PYTORCH
#define REPIPE_FIXTURES_PYTORCH "tests/fixtures/pytorch"
#endif

static const double FW[8] = {1, 1, 1, 1, 1, 1, 1, 1}, BW[8] = {2, 2, 2, 2, 2, 2, 2, 2};
static const double HALF[8] = {1, 1, 1, 1, 1, 1, 1, 1}, OUT[8] = {4, 4, 4, 4, 4, 4, 4, 4};

static rp_sim_options unit_options(void) {
    rp_sim_options o;
    rp_sim_options_default(&o);
    o.latency = 0;
    o.num_levels = 1;
    o.machines[0] = 8;
    o.bandwidth[0] = 1e30;
    o.memory_bandwidth = 1e30;
    o.bwd_input_ms = HALF, o.bwd_weight_ms = HALF;
    return o;
}

/* A fixture, parsed, with the ranks, stages and micro-batches it must have. */
static rp_sim_actions *load(const char *file, int ranks, int stages, int mbs, char **text_out) {
    char path[1024], *text;
    size_t len;
    rp_error err;
    rp_sim_actions *a = NULL;
    snprintf(path, sizeof path, "%s/%s", REPIPE_FIXTURES_PYTORCH, file);
    CHECK_OK(rp_read_file(path, &text, &len, &err), err);
    if (test_failures)
        return NULL;
    CHECK_OK(rp_sim_actions_parse(text, len, file, &a, &err), err);
    *text_out = text;
    if (a) {
        CHECK_INT(rp_sim_actions_ranks(a), ranks);
        CHECK_INT(rp_sim_actions_stages(a), stages);
        CHECK_INT(rp_sim_actions_micro_batches(a), mbs);
    }
    return a;
}

/* The columns of the longest line: PyTorch lays a schedule out in steps of
** one action each, a column a step. */
static int columns(const char *text) {
    int most = 0, n = 1;
    for (const char *p = text; *p; p++) {
        if (*p == ',')
            n++;
        if (*p == '\n' || !p[1])
            most = n > most ? n : most, n = 1;
    }
    return most;
}

/* ZB1P on 2 ranks of 2 stages, 8 micro-batches: 48 unit actions a rank in
** PyTorch's 49 steps, which played as soon as each can go take 49 ms too:
** bubble 1 / 49. */
static void zb1p(void) {
    char *text = NULL;
    rp_sim_actions *a = load("zb1p_2rank_2stagep_compute.csv", 2, 4, 8, &text);
    if (!a)
        return;
    rp_config c = test_config("{\"micro_batch_size\": 1, \"layers_per_stage\": [1, 1, 1, 1]}");
    rp_sim_options o = unit_options();
    rp_sim_result r;
    rp_error err;
    CHECK_OK(rp_simulate_actions(&c, a, FW, BW, OUT, OUT, 4, &o, &r, &err), err);
    int steps = columns(text);
    CHECK_INT(steps, 49);
    CHECK_CLOSE(r.update_time, steps * 1e-3, 1e-12);
    CHECK_CLOSE(r.bubble_fraction, 1 - 48.0 / steps, 1e-12);
    CHECK_INT(r.workers, 2);
    CHECK_INT(r.stage_of[0], 0); /* a rank's first stage: 0 and 1, interleaved */
    CHECK_INT(r.stage_of[1], 1);
    CHECK_INT(r.num_events, 96);
    rp_sim_result_free(&r);
    /* the stages' order matters: on 2 stages of 2 layers each the same list
    ** is no longer 4 stages, and is refused with both counts */
    rp_config two = test_config("{\"micro_batch_size\": 1, \"layers_per_stage\": [2, 2]}");
    CHECK(rp_simulate_actions(&two, a, FW, BW, OUT, OUT, 4, &o, &r, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "4 stages and the configuration 2");
    rp_sim_actions_free(a);
    free(text);
}

/* DualPipeV on 4 ranks of 2 stages in a V, 10 micro-batches: each rank
** computes 2 x 10 x 3 = 60 ms (an overlapped pair runs its two actions one
** after the other here); the V's ends wait little, so the bubble is small. */
static void dualpipev(void) {
    char *text = NULL;
    rp_sim_actions *a = load("dualpipev_4rank_10mb.csv", 4, 8, 10, &text);
    if (!a)
        return;
    rp_config c = test_config("{\"micro_batch_size\": 1, \"layers_per_stage\": [1, 1, 1, 1, 1, "
                              "1, 1, 1]}");
    rp_sim_options o = unit_options();
    rp_sim_result r;
    rp_error err;
    CHECK_OK(rp_simulate_actions(&c, a, FW, BW, OUT, OUT, 8, &o, &r, &err), err);
    for (int w = 0; w < 4; w++) {
        CHECK_CLOSE(r.busy[w] * r.update_time, 60e-3, 1e-12);
        CHECK_INT(r.stage_of[w], w); /* rank w holds stages w and 7 - w */
    }
    CHECKF(r.update_time >= 60e-3 && r.bubble_fraction < 0.1, "%.3f ms, bubble %.4f",
           r.update_time * 1e3, r.bubble_fraction);
    rp_sim_result_free(&r);
    rp_sim_actions_free(a);
    free(text);
}

/* PyTorch's own 4-rank schedules, from its generators (the fixtures'
** README): Schedule1F1B's order is refused, its last rank running the
** forwards of micro-batches 1 to 8 (line 4 lacks 3F0); interleaved 1F1B
** (2 stages a rank, 8 micro-batches) plays to Megatron's formula, each rank
** 2 x 8 x 3 ms of work and a bubble of (P - 1) stage passes of F + B, 9 ms;
** ZBV (F = I = W = 1 ms) to the V's least, 6 m ms of work and P - 1 ms of
** bubble (test_zbv's bound), as repipe's own zb-v plays. */
static void pytorch_four_ranks(void) {
    char path[1024], *text = NULL;
    size_t len;
    rp_error err;
    rp_sim_actions *a = NULL;
    snprintf(path, sizeof path, "%s/1f1b_4rank_8mb.csv", REPIPE_FIXTURES_PYTORCH);
    CHECK_OK(rp_read_file(path, &text, &len, &err), err);
    if (text) {
        CHECK(rp_sim_actions_parse(text, len, "1f1b_4rank_8mb.csv", &a, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, "line 4: stage 3's micro-batch 0 has no forward (F)");
        free(text);
    }
    static const char *const files[] = {"interleaved1f1b_4rank_2stagep_8mb.csv",
                                        "zbv_4rank_8mb.csv"};
    const double want[] = {57e-3, 51e-3}, work[] = {48e-3, 48e-3};
    rp_config c = test_config("{\"micro_batch_size\": 1, \"layers_per_stage\": [1, 1, 1, 1, 1, "
                              "1, 1, 1]}");
    for (int i = 0; i < 2; i++) {
        if (!(a = load(files[i], 4, 8, 8, &text)))
            continue;
        rp_sim_options o = unit_options();
        rp_sim_result r;
        CHECK_OK(rp_simulate_actions(&c, a, FW, BW, OUT, OUT, 8, &o, &r, &err), err);
        printf("%s: %.3f ms, bubble %.4f\n", files[i], r.update_time * 1e3, r.bubble_fraction);
        CHECK_CLOSE(r.update_time, want[i], 1e-12);
        CHECK_CLOSE(r.bubble_fraction, 1 - work[i] / want[i], 1e-12);
        for (int w = 0; w < 4; w++) /* interleaved: w and 4 + w; the V: w and 7 - w */
            CHECK_INT(r.stage_of[w], w);
        rp_sim_result_free(&r);
        rp_sim_actions_free(a);
        free(text);
    }
}

/* repipe's schedules written as CSV and read back play to rp_simulate's
** time (no parameters: no reduction, no step), and 1F1B's is the formula's
** 3m + 3(P - 1) units, zb-h1's 3m + (P - 1); zb-auto's too, ordered for
** other pass times than it plays on. */
static void round_trip(void) {
    const char *names[] = {"gpipe", "1f1b", "zb-h1", "zb-h2", "zb-auto"};
    const double par[4] = {0, 0, 0, 0};
    for (int i = 0; i < 5; i++) {
        char json[256];
        snprintf(json, sizeof json,
                 "{\"micro_batch_size\": 1, \"layers_per_stage\": [1, 1, 1, 1], "
                 "\"gradient_accumulation_steps\": 8, \"schedule\": \"%s\"%s}",
                 names[i],
                 i == 4 ? ", \"zb_pass_times\": [1, 3, 1], \"zb_max_in_flight\": 12" : "");
        rp_config c = test_config(json);
        rp_sim_options o = unit_options();
        rp_error err;
        char *csv = NULL;
        rp_sim_actions *a = NULL;
        rp_sim_result own, back;
        CHECK_OK(rp_schedule_csv(&c, &csv, &err), err);
        CHECK_OK(rp_simulate(&c, FW, BW, OUT, par, 4, &o, &own, &err), err);
        if (test_failures)
            return;
        CHECK_OK(rp_sim_actions_parse(csv, strlen(csv), names[i], &a, &err), err);
        CHECK_OK(rp_simulate_actions(&c, a, FW, BW, OUT, par, 4, &o, &back, &err), err);
        if (test_failures)
            return;
        CHECKF(fabs(own.update_time - back.update_time) < 1e-12, "%s: %.6f ms, from its CSV "
               "%.6f", names[i], own.update_time * 1e3, back.update_time * 1e3);
        if (i == 1)
            CHECK_CLOSE(back.update_time, (3 * 8 + 3 * 3) * 1e-3, 1e-12);
        if (i == 2)
            CHECK_CLOSE(back.update_time, (3 * 8 + 3) * 1e-3, 1e-12);
        rp_sim_result_free(&own);
        rp_sim_result_free(&back);
        rp_sim_actions_free(a);
        free(csv);
    }
    rp_config r2 = test_config("{\"replication_factor\": 2, \"layers_per_stage\": [1, 1]}");
    char *csv;
    rp_error err;
    CHECK(rp_schedule_csv(&r2, &csv, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "replication_factor");
}

/* Megatron-LM's interleaved 1F1B, made here and played with unit chunks:
** its bubble is (P - 1) / (v m + P - 1) (the paper's (P - 1) / v of one
** micro-batch through a rank), its time 3 v m + 3 (P - 1) ms; and it asks
** for micro-batches in multiples of the ranks. */
static void interleaved(void) {
    static const int cases[][3] = {{4, 2, 8}, {4, 2, 16}, {4, 4, 8}, {2, 2, 4}, {2, 4, 8}};
    static double fw[32], bw[32], half[32], out[32];
    for (int i = 0; i < 32; i++)
        fw[i] = 1, bw[i] = 2, half[i] = 1, out[i] = 4;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int P = cases[i][0], v = cases[i][1], m = cases[i][2], S = P * v;
        char json[256], *csv = NULL;
        int at = snprintf(json, sizeof json, "{\"micro_batch_size\": 1, \"layers_per_stage\": [");
        for (int s = 0; s < S; s++)
            at += snprintf(json + at, sizeof json - at, "%s1", s ? ", " : "");
        snprintf(json + at, sizeof json - at, "]}");
        rp_config c = test_config(json);
        rp_sim_options o = unit_options();
        o.machines[0] = S;
        o.bwd_input_ms = half, o.bwd_weight_ms = half;
        rp_sim_actions *a = NULL;
        rp_sim_result r;
        rp_error err;
        CHECK_OK(rp_schedule_csv_interleaved(P, v, m, &csv, &err), err);
        if (test_failures)
            return;
        CHECK_OK(rp_sim_actions_parse(csv, strlen(csv), "interleaved", &a, &err), err);
        if (test_failures)
            return;
        CHECK_INT(rp_sim_actions_ranks(a), P);
        CHECK_INT(rp_sim_actions_stages(a), S);
        CHECK_OK(rp_simulate_actions(&c, a, fw, bw, out, out, S, &o, &r, &err), err);
        if (test_failures)
            return;
        CHECK_CLOSE(r.bubble_fraction, (P - 1.0) / (v * m + P - 1), 1e-12);
        CHECK_CLOSE(r.update_time, (3.0 * v * m + 3.0 * (P - 1)) * 1e-3, 1e-12);
        rp_sim_result_free(&r);
        rp_sim_actions_free(a);
        free(csv);
    }
    char *csv;
    rp_error err;
    /* as many micro-batches as ranks: every forward first, on every rank */
    CHECK_OK(rp_schedule_csv_interleaved(2, 2, 2, &csv, &err), err);
    if (!test_failures)
        CHECK_STR_HAS(csv, "0F0,0F1,2F0,2F1,2B0,2B1,0B0,0B1\n1F0,1F1,3F0,3F1,3B0,3B1,1B0,1B1\n");
    free(csv);
    CHECK(rp_schedule_csv_interleaved(4, 2, 6, &csv, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "a multiple of the ranks");
    CHECK(rp_schedule_csv_interleaved(4, 1, 8, &csv, &err) == RP_ERR_INVALID);
}

/* What the checks refuse, each with its line. */
static void refused(void) {
    static const struct {
        const char *text, *says;
    } bad[] = {
        {"0F0,0B0\n0F1,0B1\n", "stage 0 has actions on ranks 0 and 1"},
        {"0F0,0B0,0F0\n", "line 1: 0F0 appears twice"},
        {"0F0,0F1,0B0\n", "stage 0's micro-batch 1 has no backward"},
        {"0B0,0F0\n", "line 1: 0F0 comes after its backward"},
        {"0F0,0I0\n", "0I0 has no 0W0"},
        {"0F0,0W0,0I0\n", "0W0 comes before its B"},
        {"0F0,0X0\n", "line 1, column 2: '0X0' is not an action"},
        {"0F0,(0B0;zz)OVERLAP_F_B\n", "line 1, column 2"},
        {"\n,,\n", "no actions"},
        {"0F0,0B0\n2F0,2B0\n", "stage 1 has no actions"},
        {"0F99999,0B99999\n", "at most 65536 micro-batches"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rp_sim_actions *a = (rp_sim_actions *)1;
        rp_error err;
        CHECKF(rp_sim_actions_parse(bad[i].text, strlen(bad[i].text), "s.csv", &a, &err) != RP_OK,
               "accepted: %s", bad[i].text);
        CHECK(a == NULL);
        CHECK_STR_HAS(err.msg, "s.csv");
        CHECK_STR_HAS(err.msg, bad[i].says);
    }
    /* comms of PyTorch's lowered form are skipped: the transfers are derived */
    const char *comms = "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n";
    rp_sim_actions *a;
    rp_error err;
    CHECK_OK(rp_sim_actions_parse(comms, strlen(comms), "c.csv", &a, &err), err);
    if (!test_failures)
        rp_sim_actions_free(a);
    /* a list that waits for ever: rank 1 wants micro-batch 1 first, rank 0
    ** waits for micro-batch 0's gradient, which rank 1 sends only later */
    const char *stuck = "0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n";
    CHECK_OK(rp_sim_actions_parse(stuck, strlen(stuck), "stuck.csv", &a, &err), err);
    if (test_failures)
        return;
    rp_config c = test_config("{\"micro_batch_size\": 1, \"layers_per_stage\": [1, 1]}");
    rp_sim_options o = unit_options();
    rp_sim_result r;
    CHECK(rp_simulate_actions(&c, a, FW, BW, OUT, OUT, 2, &o, &r, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "waits for ever: rank 0 at 0B0, rank 1 at 1F1");
    rp_sim_actions_free(a);
}

int main(void) {
    zb1p();
    dualpipev();
    pytorch_four_ranks();
    round_trip();
    interleaved();
    refused();
    return test_finish("test_actions");
}
