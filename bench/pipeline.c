/*
** bench/pipeline: a 2-stage pipeline's measured time per update against the
** pipeline (bubble) model, and R = 2 x P = 2 beside it.
**
** Each stage's forward + backward of one micro-batch (t_s) and its optimizer
** step are timed alone on one worker. With a flush per update, GA
** micro-batches through P stages take
**     sum_s t_s + (GA - 1) * max_s t_s  (+ the slowest step)
** which for equal stages is GA * t * (1 + (P - 1) / GA): the bubble is
** (P - 1) / (GA + P - 1) of the time. The model is printed beside the
** measured time per update of the pipelined session (P workers on P cores).
** Usage: bench_pipeline MODEL LAYERS_STAGE0 [B]
*/
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/core/util.h"
#include "repipe/repipe.h"

static rp_dataset *data;

/* Best time of a stage's forward + backward on B rows, and of its step. */
static void stage_time(const rp_model *m, int l0, int l1, int B, double *fb, double *step) {
    rp_net *n;
    rp_acts *a;
    rp_error err;
    rp_net_create(m, l0, l1, B, &n, &err);
    rp_acts_create(n, B, &a, &err);
    rp_model_init_params(m, l0, l1, 1, NULL, rp_net_params(n));
    size_t in = rp_net_in_size(n), out = rp_net_out_size(n);
    float *x = malloc(sizeof(float) * in * B), *dy = malloc(sizeof(float) * out * B);
    for (size_t i = 0; i < in * B; i++)
        x[i] = data->x[i % (784 * (size_t)data->n)];
    for (size_t i = 0; i < out * B; i++)
        dy[i] = 1e-3f;
    int64_t ids[1024];
    int32_t y[1024];
    for (int i = 0; i < B; i++)
        ids[i] = i, y[i] = data->labels[i];
    rp_step_ctx ctx = {.training = true, .sample_id = ids, .labels = y, .loss_scale = 1.0 / B};
    bool last = l1 == m->num_layers;
    float *st = calloc(rp_net_num_params(n) + 1, sizeof(float));
    rp_optimizer_config sgd = {RP_OPT_SGD, 0.01, 0, 0, 0.9, 0.999, 1e-8};
    *fb = *step = 1e30;
    for (int r = 0; r < 60; r++) {
        double t = rp_now();
        rp_net_forward(n, a, x, B, &ctx, NULL);
        rp_net_backward(n, a, last ? NULL : dy, &ctx, l0 > 0);
        t = rp_now() - t;
        if (r > 5 && t < *fb)
            *fb = t;
        t = rp_now();
        rp_optimizer_step(&sgd, r + 1, rp_net_params(n), rp_net_grads(n), st, rp_net_num_params(n));
        t = rp_now() - t;
        if (r > 5 && t < *step)
            *step = t;
    }
    free(x), free(dy), free(st);
    rp_acts_free(a);
    rp_net_free(n);
}

/* Best time per update of a session over `calls` host calls. */
static double session_time(const rp_model *m, const char *json, double *sps) {
    rp_config cfg;
    rp_error err;
    rp_session *s;
    if (rp_config_load_string(&cfg, json, strlen(json), "bench", &err) ||
        rp_session_create(m, &cfg, &s, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    long long per = rp_session_samples_per_call(s);
    float *x = malloc(sizeof(float) * per * 784);
    int32_t *y = malloc(sizeof(int32_t) * per);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    for (long long i = 0; i < per; i++)
        ids[i] = i % data->n;
    rp_dataset_gather(data, ids, (int)per, x, y);
    double best = 1e30;
    for (int k = 0; k < 40; k++) {
        rp_result r;
        double t = rp_now();
        rp_session_run(s, x, y, ids, &r, &err);
        t = rp_now() - t;
        if (k > 3 && t < best)
            best = t;
    }
    *sps = per / best;
    free(x), free(y), free(ids);
    rp_session_free(s);
    return best;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_pipeline MODEL LAYERS_STAGE0 [B]\n");
        return 2;
    }
    rp_error err;
    rp_model *m;
    rp_fpu_fast_denormals(); /* (the session sets BLAS to one thread a worker) */
    if (rp_model_load(&m, argv[1], &err) ||
        rp_dataset_load_idx(&data, RP_FASHION_MNIST_DIR, true, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int split = atoi(argv[2]), B = argc > 3 ? atoi(argv[3]) : 16;
    double t0, t1, s0, s1, tall, sall;
    stage_time(m, 0, split, B, &t0, &s0);
    stage_time(m, split, m->num_layers, B, &t1, &s1);
    stage_time(m, 0, m->num_layers, B, &tall, &sall);
    printf("%s, micro-batch %d: stage 0 (layers 0-%d) %.3f ms, stage 1 %.3f ms, whole model "
           "%.3f ms per micro-batch\n",
           argv[1], B, split - 1, t0 * 1e3, t1 * 1e3, tall * 1e3);
    printf("%4s %12s %12s %12s %8s %9s %12s %12s\n", "GA", "1 worker", "P=2 model", "P=2",
           "error", "bubble", "R=2xP=2", "(samples/s)");
    static const int gas[] = {4, 8, 16};
    for (int g = 0; g < 3; g++) {
        int GA = gas[g];
        char json[512];
        double sps1, sps2, sps4;
        snprintf(json, sizeof json,
                 "{\"micro_batch_size\": %d, \"gradient_accumulation_steps\": %d, "
                 "\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}}", B, GA);
        double one = session_time(m, json, &sps1);
        snprintf(json, sizeof json,
                 "{\"micro_batch_size\": %d, \"gradient_accumulation_steps\": %d, "
                 "\"layers_per_stage\": [%d, -1], \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}}",
                 B, GA, split);
        double pipe = session_time(m, json, &sps2);
        snprintf(json, sizeof json,
                 "{\"micro_batch_size\": %d, \"gradient_accumulation_steps\": %d, "
                 "\"replication_factor\": 2, \"layers_per_stage\": [%d, -1], "
                 "\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}}", B, GA, split);
        session_time(m, json, &sps4);
        double tmax = t0 > t1 ? t0 : t1, smax = s0 > s1 ? s0 : s1;
        double model = t0 + t1 + (GA - 1) * tmax + smax;
        printf("%4d %10.2fms %10.2fms %10.2fms %+7.1f%% %8.1f%% %12.0f %6.0f/%.0f/%.0f\n", GA,
               one * 1e3, model * 1e3, pipe * 1e3, 100 * (pipe - model) / model,
               100.0 * 1 / (GA + 1), sps4, sps1, sps2, sps4);
    }
    rp_dataset_free(data);
    rp_model_free(m);
    return 0;
}
