/*
** Zero-bubble schedules (zb-h1, zb-h2, zb-auto): a split backward adds exactly the
** bits of the whole one, so every configuration's weights and losses equal
** 1f1b's bit for bit, on every layout (stage replication, replicas,
** accumulation, recomputation, sharding, clipping; MLP, CNN and a GPT with
** dropout and a tied head). The plans: W after its B, both in micro-batch
** order, zb-h1 at 1f1b's activation slots, zb-h2 at most 2 n_s - 1; the
** checker refuses a W before its B and Ws out of order; the simulator gives
** the bubbles of the paper's formulas on equal pass times, and zb-auto,
** ordered by the passes' times, no more than zb-h2's where W outweighs F.
**
**   test_zerobubble          local backend: everything
**   test_zerobubble --mpi    under mpirun -np W: the cases of W workers
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "repipe/data.h"
#include "repipe/profile.h"
#include "repipe/schedule.h"
#include "repipe/session.h"
#include "repipe/simulate.h"
#include "support.h"
#include "test.h"

static const char *MLP = TEST_SPEC_MLP;
static const char *CNN = TEST_SPEC_CNN;
static const char *GPT = TEST_SPEC_GPT;
/* a LLaMA-family block as a graph: RMSNorm, grouped-query attention with
** rotary embeddings, a SwiGLU MLP, two residuals */
static const char *LLAMA = "input 8\nx = embedding 13 8\nrmsnorm\nlinear 16 bias=false\n"
                           "attention heads=2 kv_heads=1 rope_theta=10000\n"
                           "o = linear 8 bias=false\nx1 = add < o x\nn2 = rmsnorm\n"
                           "linear 12 bias=false\ng = silu\nu = linear 12 bias=false < n2\n"
                           "mul < g u\nd = linear 8 bias=false\nadd < d x1\n"
                           "linear 13 bias=false\nsoftmax_cross_entropy\n";

static rp_dataset *data;
static rp_comm *mpi;

typedef struct zcase {
    int P, R, r[3], GA;
    const char *extra; /* more configuration keys */
} zcase;

/* Stage replication [1,1], [2,1] and [1,2,1], R 1 and 2, GA 4 and 8, and
** the options that change what a backward keeps or sends. */
static const zcase CASES[] = {
    {2, 1, {1, 1}, 4, ""},
    {2, 1, {1, 1}, 8, ""},
    {2, 2, {1, 1}, 4, ""},
    {2, 1, {2, 1}, 4, ""},
    {2, 2, {2, 1}, 8, ""},
    {3, 1, {1, 2, 1}, 8, ""},
    {3, 1, {1, 1, 1}, 4, ", \"recompute_checkpoint_every_layer\": true"},
    {2, 2, {1, 1}, 4, ", \"replicated_tensor_sharding\": true"},
    {2, 1, {2, 1}, 8, ", \"gradient_clipping\": 0.5"},
    {3, 1, {1, 1, 1}, 8, ", \"fp16_exchange\": true, \"device_iterations\": 2"},
};

/* "zb-auto-w3": zb-auto ordered for a weight gradient three times the
** forward, with room for 2 P - 1 micro-batches; "zb-auto-1": room for one */
static rp_config config(const zcase *zc, const char *schedule, bool adam) {
    char sched[160]; /* the schedule's keys */
    if (strcmp(schedule, "zb-auto-w3") == 0)
        snprintf(sched, sizeof sched,
                 "\"schedule\": \"zb-auto\", \"zb_pass_times\": [1, 1, 3], "
                 "\"zb_max_in_flight\": %d",
                 2 * zc->P - 1);
    else if (strcmp(schedule, "zb-auto-1") == 0) /* one micro-batch at a time, F to W */
        snprintf(sched, sizeof sched, "\"schedule\": \"zb-auto\", \"zb_max_in_flight\": 1");
    else
        snprintf(sched, sizeof sched, "\"schedule\": \"%s\"", schedule);
    char layers[64] = "[-1", reps[64];
    for (int s = 1; s < zc->P; s++)
        strcat(layers, ", -1");
    snprintf(reps, sizeof reps, "[%d", zc->r[0]);
    for (int s = 1; s < zc->P; s++)
        snprintf(reps + strlen(reps), sizeof reps - strlen(reps), ", %d", zc->r[s]);
    char json[1024];
    snprintf(json, sizeof json,
             "{\"seed\": 5, \"micro_batch_size\": 3, \"gradient_accumulation_steps\": %d, "
             "\"replication_factor\": %d, \"layers_per_stage\": %s], \"stage_replication\": %s], "
             "%s, \"output_mode\": \"all\", \"optimizer\": %s%s}",
             zc->GA, zc->R, layers, reps, sched,
             adam ? "{\"type\": \"adam\", \"lr\": 0.01}"
                  : "{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}",
             zc->extra);
    return test_config(json);
}

/* Two updates (two host calls on other samples); the weights, and every
** loss, come back. */
static rp_weights *train(const rp_model *m, const rp_config *c, bool tokens, bool use_mpi,
                         float *losses) {
    return test_two_calls(m, c, tokens, use_mpi ? mpi : NULL, data, losses);
}

static void exact(bool use_mpi, int only_workers) {
    static const char *const models[] = {"mlp", "cnn", "gpt", "llama"};
    static const char *const schedules[] = {"zb-h1", "zb-h2", "zb-auto", "zb-auto-w3",
                                            "zb-auto-1"};
    int run = 0;
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        const zcase *zc = &CASES[k];
        if (only_workers && test_workers(zc->P, zc->r, zc->R) != only_workers)
            continue;
        for (int mi = 0; mi < 4; mi++) {
            if (mi == 3 && zc->P > 2) /* five layers before the head: two stages are enough */
                continue;
            if (mi == 2 && strstr(zc->extra, "sharding")) /* a tie is never sharded */
                continue;
            bool tokens = mi >= 2;
            rp_model *m = test_model(mi == 0 ? MLP : mi == 1 ? CNN : mi == 2 ? GPT : LLAMA);
            rp_config base = config(zc, "1f1b", mi != 2);
            float l0[128] = {0}, l1[128];
            rp_weights *want = train(m, &base, tokens, use_mpi, l0);
            for (int si = 0; si < 5; si++) {
                rp_config c = config(zc, schedules[si], mi != 2);
                memset(l1, 0, sizeof l1);
                rp_weights *got = train(m, &c, tokens, use_mpi, l1);
                CHECKF(test_same_bits(want, got) && memcmp(l0, l1, sizeof l0) == 0,
                       "%s %s P=%d R=%d r=[%d,%d,%d] GA=%d%s: not 1f1b's bits (weights differ "
                       "by %g)",
                       models[mi], schedules[si], zc->P, zc->R, zc->r[0], zc->r[1], zc->r[2],
                       zc->GA, zc->extra, want && got ? test_weights_diff(want, got) : -1.0);
                rp_weights_free(got);
                run++;
            }
            rp_weights_free(want);
            rp_model_free(m);
        }
    }
    CHECK(run > 0);
    printf("%d zero-bubble runs equal to 1f1b bit for bit\n", run);
}

/* Every worker's W after its B, each kind in micro-batch order; no worker
** of zb-h1 holds more slots than 1f1b's busiest one, none of zb-h2 more
** than twice that less one. */
static void plans(void) {
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++)
        for (int ga = 4; ga <= 16; ga *= 2) {
            zcase zc = CASES[k];
            zc.GA = ga;
            rp_config c1 = config(&zc, "1f1b", false);
            rp_workplan *p1, *p;
            rp_error err;
            CHECK_OK(rp_workplan_build(&c1, &p1, &err), err);
            int peak = 0; /* 1f1b's busiest worker */
            for (int w = 0; w < p1->workers; w++)
                peak = p1->w[w].slots > peak ? p1->w[w].slots : peak;
            static const char *const names[] = {"zb-h1", "zb-h2", "zb-auto", "zb-auto-w3"};
            for (int si = 0; si < 4; si++) {
                rp_config c = config(&zc, names[si], false);
                CHECK_OK(rp_workplan_build(&c, &p, &err), err);
                CHECK_OK(rp_workplan_check(p, NULL, &err), err);
                for (int w = 0; w < p->workers; w++) {
                    int nb = 0, nw = 0, last_b = -1, last_w = -1;
                    const rp_worker_ops *wo = &p->w[w];
                    for (int i = 0; i < wo->num_ops; i++) {
                        const rp_op *op = &wo->ops[i];
                        CHECK(op->kind != RP_OP_BACKWARD);
                        if (op->kind == RP_OP_BACKWARD_INPUT) {
                            CHECK(op->mb > last_b);
                            last_b = op->mb, nb++;
                        }
                        if (op->kind == RP_OP_BACKWARD_WEIGHT) {
                            CHECK(op->mb > last_w && op->mb <= last_b);
                            last_w = op->mb, nw++;
                        }
                    }
                    CHECK(nb == nw && nb > 0);
                    /* zb-h1 and zb-auto at 1f1b's most; zb-h2 twice less one; zb-auto's
                    ** limit of 2 P - 1 */
                    int most = si == 0 || si == 2 ? peak : si == 1 ? 2 * peak - 1 : 2 * zc.P - 1;
                    if (si == 3 && most < peak)
                        most = peak;
                    CHECKF(wo->slots <= most && (si == 3 || wo->slots >= p1->w[w].slots),
                           "%s worker %d: %d slots, 1f1b's most %d", names[si], w, wo->slots,
                           peak);
                }
                rp_workplan_free(p);
            }
            rp_workplan_free(p1);
        }
    /* the checker: a W moved before its B, and two Ws swapped */
    zcase zc = {2, 1, {1, 1}, 4, ""};
    rp_config c = config(&zc, "zb-h1", false);
    for (int mutation = 0; mutation < 2; mutation++) {
        rp_workplan *p;
        rp_error err;
        CHECK_OK(rp_workplan_build(&c, &p, &err), err);
        rp_worker_ops *wo = &p->w[1];
        int first_b = -1, ws[2] = {-1, -1};
        for (int i = 0; i < wo->num_ops; i++) {
            if (wo->ops[i].kind == RP_OP_BACKWARD_INPUT && first_b < 0)
                first_b = i;
            if (wo->ops[i].kind == RP_OP_BACKWARD_WEIGHT)
                ws[ws[0] < 0 ? 0 : 1] = ws[1] < 0 ? i : ws[1];
        }
        CHECK(first_b >= 0 && ws[0] > first_b && ws[1] > ws[0]);
        if (mutation == 0) { /* W 0 first of all */
            rp_op w0 = wo->ops[ws[0]];
            memmove(wo->ops + 1, wo->ops, sizeof(rp_op) * ws[0]);
            wo->ops[0] = w0;
        } else {
            rp_op t = wo->ops[ws[0]];
            wo->ops[ws[0]] = wo->ops[ws[1]], wo->ops[ws[1]] = t;
        }
        CHECK(rp_workplan_check(p, NULL, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, mutation ? "order" : "before");
        rp_workplan_free(p);
    }
}

/* Equal pass times F = B = W (a layer with parameters whose backward is
** twice its forward): 1f1b idles (P - 1)(F + B + W) of an update, zb-h1
** (P - 1)(F + B - W), which with F = B = W is the least one update can
** take (the last stage starts (P - 1) F late; zb-h2's further gain is
** across updates, or where W outweighs F); zb-h2 no more. */
static void bubbles(void) {
    for (int P = 2; P <= 4; P++)
        for (int GA = 8; GA <= 16; GA *= 2) {
            double fw[4], bw[4], out[4], par[4];
            for (int l = 0; l < P; l++)
                fw[l] = 1, bw[l] = 2, out[l] = 0, par[l] = 4;
            rp_sim_options so;
            rp_sim_options_default(&so);
            so.latency = 0;
            double t[3];
            for (int si = 0; si < 3; si++) {
                char layers[64], json[512];
                snprintf(json, sizeof json,
                         "{\"gradient_accumulation_steps\": %d, \"layers_per_stage\": %s, "
                         "\"schedule\": \"%s\"}",
                         GA, test_ones(layers, sizeof layers, P),
                         si == 0 ? "1f1b" : si == 1 ? "zb-h1" : "zb-h2");
                rp_config c = test_config(json);
                rp_sim_result r;
                rp_error err;
                CHECK_OK(rp_simulate(&c, fw, bw, out, par, P, &so, &r, &err), err);
                t[si] = r.update_time * 1e3;
                rp_sim_result_free(&r);
            }
            double work = 3.0 * GA;
            CHECKF(fabs(t[0] - work - 3.0 * (P - 1)) < 0.01, "1f1b P=%d GA=%d: %.3f ms", P, GA,
                   t[0]);
            CHECKF(fabs(t[1] - work - 1.0 * (P - 1)) < 0.01, "zb-h1 P=%d GA=%d: %.3f ms", P, GA,
                   t[1]);
            CHECKF(t[2] <= t[1] + 0.01, "zb-h2 P=%d GA=%d: %.3f ms", P, GA, t[2]);
        }
}

/* An input gradient three times the forward (F = W = 1, B = 3: a stage
** that recomputes, say), GA 16: zb-auto, ordered on those times with room
** for 3 P micro-batches, idles only the pipeline's fill, (P - 1) F, where
** zb-h2, ordered on equal times, idles twice that; ordered on equal times
** at zb-h1's memory, zb-auto is zb-h1. (The greedy order is no optimum: at
** P 4, GA 8 the same room gives 7 ms against zb-h2's 6, and the planner
** simulates both.) */
static void auto_bubbles(void) {
    for (int P = 2; P <= 4; P++) {
        int GA = 16;
        double fw[4], bw[4], out[4], par[4], bi[4], bwt[4];
        for (int l = 0; l < P; l++)
            fw[l] = 1, bw[l] = 4, bi[l] = 3, bwt[l] = 1, out[l] = 0, par[l] = 4;
        rp_sim_options so;
        rp_sim_options_default(&so);
        so.latency = 0;
        so.bwd_input_ms = bi, so.bwd_weight_ms = bwt;
        static const char *const keys[] = {
            "\"schedule\": \"zb-h1\"", "\"schedule\": \"zb-h2\"",
            "\"schedule\": \"zb-auto\", \"zb_pass_times\": [1, 3, 1], \"zb_max_in_flight\": %d",
            "\"schedule\": \"zb-auto\""};
        double t[4];
        for (int si = 0; si < 4; si++) {
            char layers[64], sched[160], json[512];
            snprintf(sched, sizeof sched, keys[si], 3 * P);
            snprintf(json, sizeof json,
                     "{\"gradient_accumulation_steps\": %d, \"layers_per_stage\": %s, %s}", GA,
                     test_ones(layers, sizeof layers, P), sched);
            rp_config c = test_config(json);
            rp_sim_result r;
            rp_error err;
            CHECK_OK(rp_simulate(&c, fw, bw, out, par, P, &so, &r, &err), err);
            t[si] = r.update_time * 1e3 - 5.0 * GA; /* the bubble */
            rp_sim_result_free(&r);
        }
        CHECKF(fabs(t[2] - (P - 1)) < 1e-6 && fabs(t[1] - 2.0 * (P - 1)) < 1e-6,
               "P=%d: bubbles zb-auto %.3f ms, zb-h2 %.3f", P, t[2], t[1]);
        CHECKF(fabs(t[3] - t[0]) < 1e-6, "P=%d: zb-auto on equal times %.3f, zb-h1 %.3f", P,
               t[3], t[0]);
        if (P == 2) { /* zb-auto's keys belong to it (the pass times to zb-v too) */
            rp_model *m = test_model(MLP);
            rp_config c = test_config("{\"layers_per_stage\": [3, -1], \"schedule\": \"zb-h1\", "
                                      "\"zb_max_in_flight\": 3}");
            rp_error err;
            CHECK(rp_session_check(m, &c, &err) == RP_ERR_INVALID);
            CHECK_STR_HAS(err.msg, "zb_max_in_flight goes with schedule \"zb-auto\", not \"zb-h1\"");
            c = test_config("{\"layers_per_stage\": [3, -1], \"schedule\": \"1f1b\", "
                            "\"zb_pass_times\": [1, 2, 1]}");
            CHECK(rp_session_check(m, &c, &err) == RP_ERR_INVALID);
            CHECK_STR_HAS(err.msg, "zb_pass_times goes with schedule \"zb-auto\" or \"zb-v\", "
                                   "not \"1f1b\"");
            c = test_config("{\"layers_per_stage\": [1, 1, 1, -1], \"schedule\": \"zb-v\", "
                            "\"zb_max_in_flight\": 3}");
            CHECK(rp_session_check(m, &c, &err) == RP_ERR_INVALID);
            CHECK_STR_HAS(err.msg, "zb_max_in_flight goes with schedule \"zb-auto\", not \"zb-v\"");
            rp_model_free(m);
        }
        if (P == 4)
            printf("F 1, B 3, W 1 ms, P 4, GA 16: bubbles zb-h1 %.0f ms, zb-h2 %.0f, zb-auto "
                   "%.0f\n",
                   t[0], t[1], t[2]);
    }
}

/* A profile's recorded halves are read back; a node without them gets
** half its backward as W when it has parameters, none otherwise; a bad
** number is refused with its line. And the halves move the prediction: W
** alone in the bubble. */
static void profile_halves(void) {
    const char *text =
        "node0 -- Input0 micro_batch=4 -- forward_compute_time=0.000, backward_compute_time=0.000, "
        "activation_size=16.000, parameter_size=0.000\n"
        "node1 -- linear (layer 0, line 2) backward_input_time=0.250 backward_weight_time=1.500 -- "
        "forward_compute_time=1.000, backward_compute_time=1.750, activation_size=16.000, "
        "parameter_size=64.000\n"
        "node2 -- relu (layer 1, line 3) -- forward_compute_time=0.500, backward_compute_time=0.500, "
        "activation_size=16.000, parameter_size=0.000\n"
        "node3 -- linear (layer 2, line 4) -- forward_compute_time=1.000, backward_compute_time=2.000, "
        "activation_size=16.000, parameter_size=64.000\n"
        "\tnode0 -- node1\n\tnode1 -- node2\n\tnode2 -- node3\n";
    rp_profile *p;
    rp_error err;
    CHECK_OK(rp_profile_parse(&p, text, strlen(text), "t.txt", &err), err);
    double *fw, *bw, *ob, *pb, *b, *w;
    int *node, L;
    CHECK_OK(rp_profile_layers(p, &fw, &bw, &ob, &pb, &node, &L, &err), err);
    CHECK_OK(rp_profile_split_ms(p, node, L, &b, &w, &err), err);
    CHECK_INT(L, 3);
    CHECK(b[0] == 0.25 && w[0] == 1.5 && b[1] == 0.5 && w[1] == 0 && b[2] == 1 && w[2] == 1);
    /* two stages: [linear, relu] and [linear] */
    rp_config c = test_config("{\"gradient_accumulation_steps\": 4, \"layers_per_stage\": [2, 1], "
                              "\"schedule\": \"zb-h1\"}");
    rp_sim_options so;
    rp_sim_options_default(&so);
    rp_sim_result r0, r1;
    CHECK_OK(rp_simulate(&c, fw, bw, ob, pb, L, &so, &r0, &err), err);
    so.bwd_input_ms = b, so.bwd_weight_ms = w;
    CHECK_OK(rp_simulate(&c, fw, bw, ob, pb, L, &so, &r1, &err), err);
    CHECK(r1.update_time != r0.update_time);
    rp_sim_result_free(&r0), rp_sim_result_free(&r1);
    free(fw), free(bw), free(ob), free(pb), free(node), free(b), free(w);
    rp_profile_free(p);
    const char *bad[] = {"backward_input_time=x backward_weight_time=1", "backward_weight_time=1"};
    for (int k = 0; k < 2; k++) {
        char t[1024];
        snprintf(t, sizeof t,
                 "node0 -- Input0 -- forward_compute_time=0, backward_compute_time=0, "
                 "activation_size=4, parameter_size=0\n"
                 "node1 -- linear %s -- forward_compute_time=1, backward_compute_time=2, "
                 "activation_size=4, parameter_size=4\n\tnode0 -- node1\n",
                 bad[k]);
        CHECK_OK(rp_profile_parse(&p, t, strlen(t), "t.txt", &err), err);
        CHECK_OK(rp_profile_layers(p, &fw, &bw, &ob, &pb, &node, &L, &err), err);
        CHECK(rp_profile_split_ms(p, node, L, &b, &w, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, "profile line 2 (node node1)");
        free(fw), free(bw), free(ob), free(pb), free(node);
        rp_profile_free(p);
    }
}

/* Interleaved 1F1B: P pipeline workers of v chunks each run the stages of
** a P v-stage pipeline, each chunk's forwards and backwards in micro-batch
** order, so the weights and losses are 1f1b's on those stages bit for bit.
** A device's order is checked: a chunk's passes swapped on it hang. */
typedef struct icase {
    int P, v, R, GA;
    const char *extra;
} icase;

static const icase ICASES[] = {
    {2, 2, 1, 4, ""},
    {2, 2, 1, 8, ""},
    {2, 2, 2, 4, ""},
    {2, 3, 1, 4, ""},
    {3, 2, 1, 6, ""},
    {2, 2, 2, 4, ", \"replicated_tensor_sharding\": true"},
    {2, 2, 1, 4, ", \"recompute_checkpoint_every_layer\": true, \"device_iterations\": 2"},
    {2, 2, 1, 8, ", \"fp16_exchange\": true"},
    {2, 2, 1, 4, ", \"gradient_clipping\": 0.05"},
    {2, 2, 2, 4, ", \"auto_loss_scaling\": true, \"fp16_exchange\": true, "
                 "\"loss_scaling\": 1152921504606846976, \"gradient_clipping\": 0.05"},
    {2, 2, 2, 8, ", \"auto_loss_scaling\": true, \"gradient_clipping\": 0.05"},
    /* stage replication: a worker's chunks replicated together */
    {2, 2, 1, 4, ", \"stage_replication\": [2, 1, 2, 1]"},
    {2, 2, 1, 8, ", \"stage_replication\": [1, 2, 1, 2], \"gradient_clipping\": 0.05"},
    {2, 2, 2, 4, ", \"stage_replication\": [1, 2, 1, 2]"},
    {3, 2, 1, 6, ", \"stage_replication\": [1, 1, 2, 1, 1, 2]"},
    /* tensor groups (the GPT alone: they split attention and MLP blocks) */
    {2, 2, 1, 4, ", \"tensor_parallel\": 2"},
    {2, 2, 2, 4, ", \"tensor_parallel\": 2, \"gradient_clipping\": 0.05"},
    {2, 2, 1, 8, ", \"tensor_parallel\": 2, \"stage_replication\": [2, 1, 2, 1]"},
    {2, 2, 1, 4, ", \"tensor_parallel\": 2, \"vocab_parallel\": false"},
};

static rp_config iconfig(const icase *ic, bool interleaved, bool adam) {
    const char *sched = !interleaved ? "\"schedule\": \"1f1b\""
                        : ic->v == 2 ? "\"schedule\": \"interleaved-1f1b\", \"virtual_stages\": 2"
                                     : "\"schedule\": \"interleaved-1f1b\", \"virtual_stages\": 3";
    return test_stages_config(ic->P * ic->v, ic->GA, ic->R, sched, adam, ic->extra);
}

/* Each case against 1f1b on threads; with ranks, on as many MPI ranks (a
** rank a device) where the case has that many devices. */
static void interleaved_exact(int ranks) {
    static const char *const models[] = {"mlp", "cnn", "gpt"};
    const char *const specs[] = {MLP, CNN, GPT};
    int run = 0;
    for (size_t k = 0; k < sizeof ICASES / sizeof ICASES[0]; k++) {
        const icase *ic = &ICASES[k];
        if (ranks && test_devices(iconfig(ic, true, false)) != ranks)
            continue;
        for (int mi = 0; mi < 3; mi++) {
            if (mi == 2 && strstr(ic->extra, "sharding")) /* a tie is never sharded */
                continue;
            if (mi < 2 && strstr(ic->extra, "tensor_parallel"))
                continue;
            rp_config base = iconfig(ic, false, mi != 2), c = iconfig(ic, true, mi != 2);
            double diff;
            CHECKF(test_same_training(specs[mi], mi == 2, &base, &c, ranks ? mpi : NULL, data,
                                      &diff),
                   "%s interleaved P=%d v=%d R=%d GA=%d%s: not 1f1b's bits (weights differ by "
                   "%g)", models[mi], ic->P, ic->v, ic->R, ic->GA, ic->extra, diff);
            run++;
        }
    }
    CHECK(run > 0);
    printf("%d interleaved runs%s equal to 1f1b bit for bit\n", run,
           ranks ? " on MPI ranks" : "");
}

static void interleaved(void) {
    interleaved_exact(0);
    /* the plan: P devices a replica, each running its v chunks' workers;
    ** every chunk's forwards, and its backwards, in micro-batch order */
    icase ic = {2, 2, 2, 8, ""};
    rp_config c = iconfig(&ic, true, false);
    rp_workplan *p;
    rp_error err;
    CHECK_OK(rp_workplan_build(&c, &p, &err), err);
    CHECK(p->devices == 4 && p->workers == 8);
    CHECK_OK(rp_workplan_check(p, NULL, &err), err);
    for (int w = 0; w < p->workers; w++) {
        int last_f = -1, last_b = -1;
        CHECK(p->device_of[w] == (w / 4) * 2 + w % 2);
        for (int i = 0; i < p->w[w].num_ops; i++) {
            const rp_op *op = &p->w[w].ops[i];
            if (op->kind == RP_OP_FORWARD)
                CHECK(op->mb == ++last_f);
            if (op->kind == RP_OP_BACKWARD)
                CHECK(op->mb == ++last_b);
        }
        CHECK(last_f == 7 && last_b == 7);
    }
    /* device 1 (worker 1's chunks 1 and 3): its first forward of chunk 3
    ** moved before chunk 1's first, whose activation it needs */
    rp_device_ops *d = &p->dev[1];
    int a = -1, b = -1;
    for (int j = 0; j < d->num; j++) {
        const rp_op *op = &p->w[d->worker[j]].ops[d->op[j]];
        if (op->kind == RP_OP_RECV_ACT && a < 0)
            a = j;
        if (op->kind == RP_OP_RECV_ACT && d->worker[j] == 3 && b < 0)
            b = j;
    }
    CHECK(a >= 0 && b > a && d->worker[a] == 1);
    test_move_device_op(d, b, a);
    CHECK(rp_workplan_check(p, NULL, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "would hang");
    rp_workplan_free(p);
    /* simulated on unit chunks (F 1, B 2 ms) and free transfers: Megatron's
    ** bubble, (P - 1) of a micro-batch's F + B through one chunk, against
    ** 1f1b's (P - 1) through a device's v chunks on the same P workers */
    static const int PVM[][3] = {{4, 2, 8}, {2, 2, 4}, {2, 4, 8}, {4, 4, 8}, {3, 2, 6}};
    for (int i = 0; i < 5; i++) {
        int P = PVM[i][0], v = PVM[i][1], mb = PVM[i][2], S = P * v;
        double fw[16], bw[16], out[16], par[16];
        for (int l = 0; l < S; l++)
            fw[l] = 1, bw[l] = 2, out[l] = 0, par[l] = 0;
        char layers[64], json[512];
        snprintf(json, sizeof json, "{\"gradient_accumulation_steps\": %d, \"layers_per_stage\": "
                 "%s, \"schedule\": \"interleaved-1f1b\", \"virtual_stages\": %d}", mb,
                 test_ones(layers, sizeof layers, S), v);
        rp_config ic2 = test_config(json);
        rp_sim_options so;
        rp_sim_options_default(&so);
        so.latency = 0;
        rp_sim_result r;
        CHECK_OK(rp_simulate(&ic2, fw, bw, out, par, S, &so, &r, &err), err);
        double want = 3.0 * mb * v + 3.0 * (P - 1);
        CHECKF(fabs(r.update_time * 1e3 - want) < 1e-6, "interleaved P=%d v=%d m=%d: %.4f ms, "
               "Megatron's %.0f", P, v, mb, r.update_time * 1e3, want);
        /* the bubble of the P workers (not of the P v chunks' workers) */
        CHECKF(fabs(r.bubble_fraction - 3.0 * (P - 1) / want) < 1e-9, "interleaved P=%d v=%d "
               "m=%d: bubble %.4f, Megatron's %.4f", P, v, mb, r.bubble_fraction,
               3.0 * (P - 1) / want);
        rp_sim_result_free(&r);
    }
    /* the trace: each device's chunks on its own track, named with its stages */
    {
        icase tc = {2, 2, 1, 4, ""};
        rp_config cc = iconfig(&tc, true, true);
        rp_model *mm = test_model(MLP);
        rp_session *ts = test_session(mm, &cc, NULL);
        static char text[1 << 20];
        size_t len = 0;
        if (ts) {
            long long per = rp_session_samples_per_call(ts);
            int64_t ids[64];
            for (long long i = 0; i < per && i < 64; i++)
                ids[i] = i;
            rp_result res;
            CHECK_OK(rp_session_trace(ts, true, &err), err);
            CHECK_OK(rp_session_run_samples(ts, data, ids, &res, &err), err);
            CHECK_OK(rp_session_write_trace(ts, "test_zerobubble.trace.json", &err), err);
            FILE *f = fopen("test_zerobubble.trace.json", "r");
            len = f ? fread(text, 1, sizeof text - 1, f) : 0;
            if (f)
                fclose(f);
            remove("test_zerobubble.trace.json");
        }
        text[len] = 0;
        CHECK_STR_HAS(text, "\"worker 1: replica 0, stages 1, 3 (interleaved)\"");
        CHECK_STR_HAS(text, "\"name\":\"backward 3 (stage 3)\",\"cat\":\"backward\",\"ph\":\"X\","
                            "\"pid\":0,\"tid\":1,");
        CHECK(strstr(text, "\"tid\":1,") && !strstr(text, "\"tid\":2,"));
        rp_session_free(ts);
        rp_model_free(mm);
    }
    /* what it does not take yet, named */
    rp_model *m = test_model(MLP);
    static const char *const bad[][2] = {
        {"\"schedule\": \"interleaved-1f1b\"", "virtual_stages of 2 or more"},
        {"\"virtual_stages\": 2", "virtual_stages goes with them alone"},
        {"\"schedule\": \"interleaved-1f1b\", \"virtual_stages\": 3", "chunks per worker"},
        {"\"schedule\": \"interleaved-1f1b\", \"virtual_stages\": 2, "
         "\"gradient_accumulation_steps\": 3", "a multiple of the pipeline's workers"},
        {"\"schedule\": \"interleaved-1f1b\", \"virtual_stages\": 2, "
         "\"stage_replication\": [2, 1, 1, 1]", "stage_replication"}};
    for (int i = 0; i < 5; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"gradient_accumulation_steps\": 4, \"layers_per_stage\": "
                 "[-1, -1, -1, -1], %s}", bad[i][0]);
        rp_config bc = test_config(json);
        CHECK(rp_session_check(m, &bc, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, bad[i][1]);
    }
    rp_model_free(m);
}

static void with_mpi(int ranks) {
    exact(true, ranks);
    interleaved_exact(ranks);
}

static void local(void) {
    plans();
    bubbles();
    auto_bubbles();
    profile_halves();
    exact(false, 0);
    interleaved();
}

int main(int argc, char **argv) {
    test_start(argc, argv, 512, 9, &data, &mpi);
    return test_main("test_zerobubble", mpi, data, with_mpi, local);
}
