/*
** bench/comm: allreduce of 4 MB and 64 MB.
**   bench_comm local W   the local backend with W threads
**   bench_comm mpi       under mpirun: the MPI backend and a bare
**                        MPI_Allreduce of the same buffer, alternating
** Prints one line per case: backend, workers, bytes, best time, and the bus
** bandwidth 2(n-1)/n * bytes / time (the figure NCCL reports).
*/
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/core/util.h"
#include "repipe/comm.h"

static const size_t SIZES[] = {4u << 20, 64u << 20};

static int reps_for(size_t bytes) { return bytes > (16u << 20) ? 15 : 60; }

static void report(const char *backend, int n, size_t bytes, double t) {
    double busbw = 2.0 * (n - 1) / n * bytes / t / 1e9;
    printf("%-8s %d workers %6zu MB  %9.3f ms  %7.2f GB/s bus\n", backend, n, bytes >> 20,
           t * 1e3, busbw);
    fflush(stdout);
}

typedef struct targ {
    rp_comm *c;
    double best[2];
} targ;

static void *local_body(void *p) {
    targ *a = p;
    rp_error err;
    for (int s = 0; s < 2; s++) {
        size_t n = SIZES[s] / sizeof(float);
        float *buf = malloc(SIZES[s]);
        for (size_t i = 0; i < n; i++)
            buf[i] = (float)(i % 7);
        a->best[s] = 1e30;
        for (int r = 0; r < reps_for(SIZES[s]); r++) {
            rp_comm_barrier(a->c, &err);
            double t = rp_now();
            rp_comm_allreduce(a->c, NULL, buf, n, &err);
            rp_comm_barrier(a->c, &err);
            t = rp_now() - t;
            if (t < a->best[s])
                a->best[s] = t;
        }
        free(buf);
    }
    return NULL;
}

static int run_local(int w) {
    rp_world *world;
    rp_error err;
    if (rp_world_create(w, &world, &err))
        return 1;
    pthread_t t[64];
    targ a[64];
    for (int r = 0; r < w; r++) {
        a[r].c = rp_world_comm(world, r);
        pthread_create(&t[r], NULL, local_body, &a[r]);
    }
    for (int r = 0; r < w; r++)
        pthread_join(t[r], NULL);
    for (int s = 0; s < 2; s++)
        report("local", w, SIZES[s], a[0].best[s]);
    rp_world_free(world);
    return 0;
}

static int run_mpi(int *argc, char ***argv) {
    rp_comm *c;
    rp_error err;
    if (rp_comm_mpi_init(argc, argv, &c, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int n = rp_comm_size(c), rank = rp_comm_rank(c);
    for (int s = 0; s < 2; s++) {
        size_t cnt = SIZES[s] / sizeof(float);
        float *buf = malloc(SIZES[s]);
        for (size_t i = 0; i < cnt; i++)
            buf[i] = (float)(i % 7);
        double best_rp = 1e30, best_bare = 1e30;
        for (int r = 0; r < reps_for(SIZES[s]); r++) {
            for (int which = 0; which < 2; which++) {
                MPI_Barrier(MPI_COMM_WORLD);
                double t = rp_now();
                if (which == 0)
                    rp_comm_allreduce(c, NULL, buf, cnt, &err);
                else
                    MPI_Allreduce(MPI_IN_PLACE, buf, (int)cnt, MPI_FLOAT, MPI_SUM,
                                  MPI_COMM_WORLD);
                MPI_Barrier(MPI_COMM_WORLD);
                t = rp_now() - t;
                double *best = which ? &best_bare : &best_rp;
                if (t < *best)
                    *best = t;
            }
        }
        if (rank == 0) {
            report("mpi", n, SIZES[s], best_rp);
            report("bare-mpi", n, SIZES[s], best_bare);
        }
        free(buf);
    }
    rp_comm_mpi_finalize(c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "local") == 0)
        return run_local(atoi(argv[2]));
    if (argc >= 2 && strcmp(argv[1], "mpi") == 0)
        return run_mpi(&argc, &argv);
    fprintf(stderr, "usage: bench_comm local W | bench_comm mpi (under mpirun)\n");
    return 2;
}
