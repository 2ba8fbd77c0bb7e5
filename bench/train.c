/*
** bench/train: repipe's training throughput on one worker, measured the way
** ../shared/bench/torch_peer.py measures PyTorch's: 20 warm-up updates (or
** --warmup N),
** then `steps` timed updates of one micro-batch, samples per second, and
** the median call's time (a call is device_iterations updates): one that a
** neighbour on a shared machine slowed moves the mean, not the median. The
** workers copy their rows from the dataset (rp_session_run_samples);
** PyTorch's loop takes contiguous slices of its tensors and copies none.
** Prints one JSON line (rank 0 under MPI). With --text FILE a token model
** trains on FILE's bytes instead of Fashion-MNIST; with --synthetic K an
** image model on 4096 random samples of its input's shape in K classes.
** Usage: bench_train MODEL CONFIG STEPS [--mpi] [--text FILE] [--synthetic K]
**        [--warmup N]
*/
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/core/util.h"
#include "repipe/repipe.h"

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_train MODEL CONFIG STEPS [--mpi] [--text FILE] "
                        "[--synthetic K] [--warmup N]\n");
        return 2;
    }
    const char *text = NULL;
    bool use_mpi = false;
    int warmup = 20, classes = 0;
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "--mpi") == 0)
            use_mpi = true;
        else if (strcmp(argv[i], "--text") == 0 && i + 1 < argc)
            text = argv[++i];
        else if (strcmp(argv[i], "--synthetic") == 0 && i + 1 < argc)
            classes = atoi(argv[++i]);
        else if (strcmp(argv[i], "--warmup") == 0 && i + 1 < argc)
            warmup = atoi(argv[++i]);
        else {
            fprintf(stderr, "bench_train: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    int steps = atoi(argv[3]);
    if (steps < 1) {
        fprintf(stderr, "bench_train: STEPS must be at least 1\n");
        return 2;
    }
    rp_error err;
    rp_model *m;
    rp_config cfg;
    rp_dataset *d;
    rp_session *s;
    rp_comm *comm = NULL;
    if (use_mpi && rp_comm_mpi_init(&argc, &argv, &comm, &err)) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        return 1;
    }
    int32_t *tokens = NULL;
    size_t count = 0;
    int vocab = 0;
    if (rp_model_load(&m, argv[1], &err) || rp_config_load_file(&cfg, argv[2], &err) ||
        (text ? rp_tokens_read(text, false, &tokens, &count, &vocab, &err) ||
                    rp_dataset_from_tokens(tokens, count, m->input.dim[0], vocab, text, &d, &err)
         : classes > 0 ? rp_dataset_synthetic(&d, 4096, m->input, classes, 1, &err)
                       : rp_dataset_load_idx(&d, RP_FASHION_MNIST_DIR, true, &err)) ||
        (comm ? rp_session_create_mpi(m, &cfg, comm, &s, &err)
              : rp_session_create(m, &cfg, &s, &err))) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        return 1;
    }
    long long per = rp_session_samples_per_call(s);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    rp_stream st;
    rp_stream_init(&st, cfg.seed, d->n, (int)(per / cfg.device_iterations), &err);
    double *call = malloc(sizeof(double) * steps);
    if (!call) {
        fprintf(stderr, "bench_train: out of memory\n");
        return 1;
    }
    double t0 = 0, loss = 0;
    for (int k = 0; k < warmup + steps; k++) {
        if (k == warmup)
            t0 = rp_now();
        double tk = rp_now();
        for (int i = 0; i < cfg.device_iterations; i++)
            rp_stream_update(&st, (long long)k * cfg.device_iterations + i,
                             ids + i * (per / cfg.device_iterations), &err);
        rp_result r;
        if (rp_session_run_samples(s, d, ids, &r, &err)) {
            fprintf(stderr, "bench_train: %s\n", err.msg);
            return 1;
        }
        loss = r.losses[r.count - 1];
        if (k >= warmup)
            call[k - warmup] = rp_now() - tk;
    }
    double dt = rp_now() - t0;
    qsort(call, steps, sizeof(double), rp_cmp_double);
    if (!comm || rp_comm_rank(comm) == 0)
        printf("{\"model\": \"%s\", \"mode\": \"repipe-%s%d\", \"batch\": %d, "
               "\"samples_per_s\": %.1f, \"median_call_ms\": %.3f, \"final_loss\": %.4f}\n",
               argv[1], comm ? "mpi" : "local", cfg.replication_factor, cfg.micro_batch_size,
               steps * per / dt, 1e3 * call[steps / 2], loss);
    rp_stream_free(&st);
    free(ids), free(tokens), free(call);
    rp_session_free(s);
    rp_dataset_free(d);
    rp_model_free(m);
    if (comm)
        rp_comm_mpi_finalize(comm);
    return 0;
}
