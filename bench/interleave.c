/*
** bench/interleave: several configurations of one model timed call by call
** in turn, in one process, so that the machine's drift falls on all alike.
**
** Why not one process a configuration: on a shared machine the speed of a
** core moves by several per cent over seconds, and a run of a few seconds
** then catches one configuration in a slow spell and the next in a fast
** one. Here every configuration has its own session, and a cycle gives each
** a turn of TURN calls (the first of a turn warms the caches that the other
** sessions' calls took, and is not timed); each cycle starts at the next
** configuration. For each configuration it prints the median of its timed
** calls, and the median over cycles of its call's time over the first
** configuration's in the same cycle: a paired ratio, which a slow spell
** lasting a cycle moves in neither direction.
** Usage: bench_interleave MODEL CYCLES [--text FILE] [--warmup N] [--turn T]
**        CONFIG...
*/
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/util.h"
#include "repipe/repipe.h"

/* one configuration: its session, its sample stream and its call times */
typedef struct run {
    const char *path;
    rp_config cfg;
    rp_session *s;
    rp_stream st;
    int64_t *ids;
    long long per, calls;
    double *t, *ratio;
} run;

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), rp_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* one call of r's session on its next samples; its time in seconds */
static int call(run *r, const rp_dataset *d, double *seconds, rp_error *err) {
    int D = r->cfg.device_iterations;
    for (int i = 0; i < D; i++)
        rp_stream_update(&r->st, r->calls * D + i, r->ids + i * (r->per / D), err);
    r->calls++;
    rp_result res;
    double t0 = rp_now();
    if (rp_session_run_samples(r->s, d, r->ids, &res, err))
        return 1;
    *seconds = rp_now() - t0;
    return 0;
}

int main(int argc, char **argv) {
    const char *text = NULL;
    int warmup = 5, turn = 2, first = 3;
    for (; first + 1 < argc && strncmp(argv[first], "--", 2) == 0; first += 2) {
        if (strcmp(argv[first], "--text") == 0)
            text = argv[first + 1];
        else if (strcmp(argv[first], "--warmup") == 0)
            warmup = atoi(argv[first + 1]);
        else if (strcmp(argv[first], "--turn") == 0)
            turn = atoi(argv[first + 1]);
        else
            break;
    }
    int cycles = argc > 2 ? atoi(argv[2]) : 0, K = argc - first;
    if (argc < 4 || K < 1 || cycles < 1 || turn < 1 || warmup < 0 ||
        strncmp(argv[first], "--", 2) == 0) {
        fprintf(stderr, "usage: bench_interleave MODEL CYCLES [--text FILE] [--warmup N] "
                        "[--turn T] CONFIG...\n");
        return 2;
    }
    rp_error err;
    rp_model *m;
    rp_dataset *d;
    int32_t *tokens = NULL;
    size_t count = 0;
    int vocab = 0;
    if (rp_model_load(&m, argv[1], &err) ||
        (text ? rp_tokens_read(text, false, &tokens, &count, &vocab, &err) ||
                    rp_dataset_from_tokens(tokens, count, m->input.dim[0], vocab, text, &d, &err)
              : rp_dataset_load_idx(&d, RP_FASHION_MNIST_DIR, true, &err))) {
        fprintf(stderr, "bench_interleave: %s\n", err.msg);
        return 1;
    }
    run *runs = calloc((size_t)K, sizeof(run));
    if (!runs) {
        fprintf(stderr, "bench_interleave: out of memory\n");
        return 1;
    }
    int status = 0;
    for (int k = 0; k < K && !status; k++) {
        run *r = &runs[k];
        r->path = argv[first + k];
        if (rp_config_load_file(&r->cfg, r->path, &err) ||
            rp_session_create(m, &r->cfg, &r->s, &err)) {
            status = 1;
            break;
        }
        r->per = rp_session_samples_per_call(r->s);
        r->ids = malloc(sizeof(int64_t) * r->per);
        r->t = malloc(sizeof(double) * cycles);
        r->ratio = malloc(sizeof(double) * cycles);
        if (!r->ids || !r->t || !r->ratio) {
            snprintf(err.msg, sizeof err.msg, "out of memory");
            status = 1;
        } else if (rp_stream_init(&r->st, r->cfg.seed, d->n,
                                  (int)(r->per / r->cfg.device_iterations), &err)) {
            status = 1;
        }
    }
    double t = 0;
    for (int w = 0; w < warmup && !status; w++)
        for (int k = 0; k < K && !status; k++)
            status = call(&runs[k], d, &t, &err);
    for (int c = 0; c < cycles && !status; c++)
        for (int i = 0; i < K && !status; i++) {
            run *r = &runs[(c + i) % K]; /* cycle c starts at the c-th */
            for (int j = 0; j < turn && !status; j++)
                status = call(r, d, &t, &err);
            r->t[c] = t; /* the turn's last call */
        }
    if (status) {
        fprintf(stderr, "bench_interleave: %s\n", err.msg);
    } else {
        for (int k = 0; k < K; k++)
            for (int c = 0; c < cycles; c++)
                runs[k].ratio[c] = runs[k].t[c] / runs[0].t[c];
        for (int k = 0; k < K; k++)
            printf("{\"config\": \"%s\", \"calls\": %d, \"median_call_ms\": %.3f, "
                   "\"median_ratio\": %.4f}\n",
                   runs[k].path, cycles, 1e3 * median(runs[k].t, cycles),
                   median(runs[k].ratio, cycles));
    }
    for (int k = 0; k < K; k++) {
        if (runs[k].s) {
            rp_stream_free(&runs[k].st);
            rp_session_free(runs[k].s);
        }
        free(runs[k].ids), free(runs[k].t), free(runs[k].ratio);
    }
    free(runs), free(tokens);
    rp_dataset_free(d);
    rp_model_free(m);
    return status;
}
