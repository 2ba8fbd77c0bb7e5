/*
** bench/memory: what the memory features save, side by side. Each variant
** trains a few updates in a child process of its own; the table gives a
** stage-0 worker's memory plan (rp_session_memory) and the child's peak
** resident set (all of its workers, as threads, plus the process's fixed
** cost: libraries, OpenBLAS buffers, data).
**
** Usage: bench_memory MODEL [UPDATES]     (synthetic data of the model's input)
*/
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "repipe/repipe.h"

typedef struct result {
    rp_memory mem;
    double exchanged; /* bytes sent between stages per update, by one replica */
    int ok;
} result;

static const char *BASE = "\"seed\": 1, \"micro_batch_size\": 64, "
                          "\"gradient_accumulation_steps\": 4, "
                          "\"optimizer\": {\"type\": \"adam\", \"lr\": 0.001}";

static const struct variant {
    const char *name, *shape, *json;
} VARIANTS[] = {
    {"baseline", "\"replication_factor\": 4", ""},
    {"replicated_tensor_sharding", "\"replication_factor\": 4",
     "\"replicated_tensor_sharding\": true"},
    {"optimizer_state_offchip", "\"replication_factor\": 4", "\"optimizer_state_offchip\": true"},
    {"sharding + offchip", "\"replication_factor\": 4",
     "\"replicated_tensor_sharding\": true, \"optimizer_state_offchip\": true"},
    {"recompute_checkpoint_every_layer", "\"replication_factor\": 4",
     "\"recompute_checkpoint_every_layer\": true"},
    {"matmul_proportion 0.0002 of 1 GB", "\"replication_factor\": 4",
     "\"device_memory\": 1000000000, \"matmul_proportion\": 0.0002"},
    {"baseline", "\"replication_factor\": 2, \"layers_per_stage\": [-1, -1]", ""},
    {"recompute_checkpoint_every_layer", "\"replication_factor\": 2, \"layers_per_stage\": [-1, -1]",
     "\"recompute_checkpoint_every_layer\": true"},
    {"fp16_exchange (fp16)", "\"replication_factor\": 2, \"layers_per_stage\": [-1, -1]",
     "\"fp16_exchange\": true, \"auto_loss_scaling\": true"},
};
#define NV (int)(sizeof VARIANTS / sizeof VARIANTS[0])

/* One variant, in this (child) process. */
static result run(const rp_model *m, const struct variant *v, int updates) {
    result r = {0};
    char json[1024];
    snprintf(json, sizeof json, "{%s, %s%s%s}", BASE, v->shape, v->json[0] ? ", " : "", v->json);
    rp_config cfg;
    rp_error err;
    rp_dataset *d;
    rp_session *s;
    if (rp_config_load_string(&cfg, json, strlen(json), v->name, &err) ||
        rp_dataset_synthetic(&d, 512, m->input, m->num_classes, 1, &err) ||
        rp_session_create(m, &cfg, &s, &err)) {
        fprintf(stderr, "bench_memory: %s: %s\n", v->name, err.msg);
        return r;
    }
    rp_session_memory(s, 0, &r.mem, &err);
    int counts[RP_MAX_STAGES];
    if (rp_session_stages(s) > 1 &&
        rp_config_stage_layers(&cfg, false, m->num_layers, counts, &err) == RP_OK) {
        double boundary = (double)rp_shape_size(&m->layers[counts[0] - 1].out);
        double bytes = cfg.fp16_exchange ? 2 : 4;
        r.exchanged = 2 * boundary * bytes * cfg.micro_batch_size * cfg.gradient_accumulation_steps;
    }
    long long per = rp_session_samples_per_call(s);
    size_t in = rp_shape_size(&m->input);
    float *x = malloc(sizeof(float) * per * in);
    int32_t *y = malloc(sizeof(int32_t) * per);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    r.ok = x && y && ids;
    for (int k = 0; k < updates && r.ok; k++) {
        for (long long i = 0; i < per; i++)
            ids[i] = (k * per + i) % d->n;
        rp_dataset_gather(d, ids, (int)per, x, y);
        rp_result res;
        if (rp_session_run(s, x, y, ids, &res, &err)) {
            fprintf(stderr, "bench_memory: %s: %s\n", v->name, err.msg);
            r.ok = 0;
        }
    }
    free(x), free(y), free(ids);
    rp_session_free(s);
    rp_dataset_free(d);
    return r;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_memory MODEL [UPDATES]\n");
        return 2;
    }
    int updates = argc > 2 ? atoi(argv[2]) : 5;
    rp_model *m;
    rp_error err;
    if (rp_model_load(&m, argv[1], &err)) {
        fprintf(stderr, "bench_memory: %s\n", err.msg);
        return 1;
    }
    printf("%s, batch 64, GA 4, Adam, %d updates; memory of a stage-0 worker (MB) and the\n"
           "peak resident set of the whole run (all workers, MB)\n",
           argv[1], updates);
    const char *shape = NULL;
    double base_rss = 0;
    for (int i = 0; i < NV; i++) {
        const struct variant *v = &VARIANTS[i];
        if (!shape || strcmp(shape, v->shape) != 0) {
            shape = v->shape;
            printf("\n{%s}\n  %-34s %9s %11s %8s %8s %9s %10s\n", shape, "variant", "optimizer",
                   "activations", "scratch", "total", "peak RSS", "exchanged");
        }
        int fd[2];
        if (pipe(fd) != 0)
            return 1;
        pid_t pid = fork();
        if (pid == 0) { /* the child trains and reports its plan */
            close(fd[0]);
            result r = run(m, v, updates);
            ssize_t k = write(fd[1], &r, sizeof r);
            _exit(k == (ssize_t)sizeof r && r.ok ? 0 : 1);
        }
        close(fd[1]);
        result r = {0};
        ssize_t got = read(fd[0], &r, sizeof r);
        close(fd[0]);
        int status;
        struct rusage ru;
        wait4(pid, &status, 0, &ru);
        if (got != (ssize_t)sizeof r || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("  %-34s failed\n", v->name);
            continue;
        }
        double rss = ru.ru_maxrss / 1024.0; /* KB on Linux */
        if (strcmp(v->name, "baseline") == 0)
            base_rss = rss;
        const rp_memory *x = &r.mem;
        double total = (double)(x->params + x->grads + x->optimizer + x->activations + x->scratch);
        char ex[32] = "-";
        if (r.exchanged > 0)
            snprintf(ex, sizeof ex, "%.2f MB", r.exchanged / 1e6);
        printf("  %-34s %9.2f %11.2f %8.2f %8.2f %6.1f %+5.1f %10s\n", v->name, x->optimizer / 1e6,
               x->activations / 1e6, x->scratch / 1e6, total / 1e6, rss, rss - base_rss, ex);
    }
    rp_model_free(m);
    return 0;
}
