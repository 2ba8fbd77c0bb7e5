/*
** bench/comm: allreduce of 4 MB and 64 MB.
**   bench_comm local W   the local backend with W threads
**   bench_comm mpi       under mpirun: the MPI backend and a bare
**                        MPI_Allreduce of the same buffer, alternating
**   bench_comm sweep     under mpirun, 2 ranks or more: a ping-pong between
**                        ranks 0 and 1 from 1 KB to 4 MB and the fit of its
**                        one-way time to latency + bytes / bandwidth, then
**                        allreduces from 64 KB to 16 MB over every rank
**   bench_comm pingpong  under mpirun, 2 ranks: the ping-pong of 1 KB alone
**                        (a link's latency, as scripts/cluster --latency
**                        adds it)
**   bench_comm alltoall CLUSTER [STRIDE]
**                        under mpirun: all-to-alls of 1, 4 and 16 MB a rank
**                        over every rank (rp_comm_alltoall, MPI_Alltoall),
**                        the median of 7, beside what the cluster file's
**                        links predict (rp_cluster_all_to_all, the price a
**                        mixture's expert group of all the ranks pays)
**   bench_comm price CLUSTER N STRIDE BYTES...
**                        no MPI: what rp_cluster_all_to_all prices an
**                        all-to-all of BYTES a rank over N ranks at (ms)
** Prints one line per case: backend, workers, bytes, best time, and the bus
** bandwidth 2(n-1)/n * bytes / time (the figure NCCL reports); the sweep
** ends with "fit latency S bandwidth B/s", what 'repipe simulate --latency
** S --bandwidth ... B' takes for the link measured.
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
#include "repipe/device.h"

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

static int run_mpi(rp_comm *c) {
    rp_error err;
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
    return 0;
}

/* The median of the one-way times of reps round trips of `bytes`. */
static double pingpong(rp_comm *c, int rank, char *buf, size_t bytes, int reps) {
    double t[64];
    rp_error err;
    for (int r = 0; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = rp_now();
        if (rank == 0) {
            rp_comm_send(c, 1, 7, buf, bytes, &err);
            rp_comm_recv(c, 1, 7, buf, bytes, &err);
        } else if (rank == 1) {
            rp_comm_recv(c, 0, 7, buf, bytes, &err);
            rp_comm_send(c, 0, 7, buf, bytes, &err);
        }
        t[r] = (rp_now() - t0) / 2;
    }
    for (int i = 1; i < reps; i++) /* insertion sort: a handful */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1], t[j - 1] = x;
        }
    return t[reps / 2];
}

static int run_sweep(rp_comm *c) {
    rp_error err;
    int n = rp_comm_size(c), rank = rp_comm_rank(c);
    if (n < 2) {
        fprintf(stderr, "bench_comm sweep: needs 2 ranks or more\n");
        return 2;
    }
    static const size_t pp[] = {1u << 10, 16u << 10, 256u << 10, 1u << 20, 4u << 20};
    static const size_t ar[] = {64u << 10, 1u << 20, 4u << 20, 16u << 20};
    char *buf = calloc(16u << 20, 1);
    /* The fit: the bandwidth from the two largest messages (a token bucket
    ** lets small ones through at the wire's own speed, so a least-squares
    ** line over every size came out with a negative latency), the latency
    ** what the smallest takes beyond its bytes. */
    int k = (int)(sizeof pp / sizeof pp[0]);
    double t[8];
    for (int i = 0; i < k; i++) {
        t[i] = pingpong(c, rank, buf, pp[i], pp[i] > (256u << 10) ? 9 : 31);
        if (rank == 0)
            printf("pingpong %8zu bytes  one way %9.3f ms\n", pp[i], t[i] * 1e3);
    }
    double slope = (t[k - 1] - t[k - 2]) / (double)(pp[k - 1] - pp[k - 2]);
    double alpha = t[0] - slope * (double)pp[0];
    alpha = alpha > 0 ? alpha : 0;
    for (size_t i = 0; i < sizeof ar / sizeof ar[0]; i++) {
        double best = 1e30;
        for (int r = 0; r < (ar[i] > (4u << 20) ? 5 : 15); r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t = rp_now();
            rp_comm_allreduce(c, NULL, (float *)buf, ar[i] / sizeof(float), &err);
            MPI_Barrier(MPI_COMM_WORLD);
            t = rp_now() - t;
            best = t < best ? t : best;
        }
        if (rank == 0) {
            double ring = 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * (double)ar[i] * slope;
            printf("allreduce %8zu bytes on %d ranks  %9.3f ms  (ring formula with the fit "
                   "%9.3f ms)\n", ar[i], n, best * 1e3, ring * 1e3);
        }
    }
    if (rank == 0)
        printf("fit latency %.3e bandwidth %.4e\n", alpha, 1 / slope);
    free(buf);
    return 0;
}

static int run_pingpong(rp_comm *c) {
    char buf[1024] = {0};
    if (rp_comm_size(c) != 2) {
        fprintf(stderr, "bench_comm pingpong: needs 2 ranks\n");
        return 2;
    }
    double t = pingpong(c, rp_comm_rank(c), buf, sizeof buf, 31);
    if (rp_comm_rank(c) == 0)
        printf("pingpong %8zu bytes  one way %9.3f ms\n", sizeof buf, t * 1e3);
    return 0;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run_alltoall(rp_comm *c, const char *cluster, int stride) {
    rp_error err;
    rp_cluster cl;
    if (rp_cluster_get(cluster, &cl, &err)) {
        fprintf(stderr, "bench_comm alltoall: %s\n", err.msg);
        return 2;
    }
    int n = rp_comm_size(c), rank = rp_comm_rank(c);
    static const size_t sizes[] = {1u << 20, 4u << 20, 16u << 20};
    float *in = calloc(16u << 20, 1), *out = calloc(16u << 20, 1);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t k = sizes[s] / sizeof(float) / (size_t)n;
        double t[7];
        for (int r = 0; r < 7; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = rp_now();
            if (rp_comm_alltoall(c, NULL, in, k, out, &err)) {
                fprintf(stderr, "bench_comm alltoall: %s\n", err.msg);
                return 1;
            }
            MPI_Barrier(MPI_COMM_WORLD);
            t[r] = rp_now() - t0;
        }
        qsort(t, 7, sizeof *t, by_value);
        double bytes = (double)k * sizeof(float) * n;
        if (rank == 0)
            printf("alltoall %8.0f bytes a rank on %d ranks  %9.3f ms  predicted %9.3f ms "
                   "(%s, %d a node)\n", bytes, n, t[3] * 1e3,
                   rp_cluster_all_to_all(&cl, n, stride, bytes) * 1e3, cl.name, cl.per_node);
    }
    free(in), free(out);
    return 0;
}

static int run_price(int argc, char **argv) {
    rp_error err;
    rp_cluster cl;
    if (rp_cluster_get(argv[2], &cl, &err)) {
        fprintf(stderr, "bench_comm price: %s\n", err.msg);
        return 2;
    }
    for (int i = 5; i < argc; i++)
        printf("price %s bytes a rank on %s ranks  predicted %9.3f ms\n", argv[i], argv[3],
               rp_cluster_all_to_all(&cl, atoi(argv[3]), atoi(argv[4]), atof(argv[i])) * 1e3);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 6 && strcmp(argv[1], "price") == 0)
        return run_price(argc, argv);
    if (argc >= 3 && strcmp(argv[1], "local") == 0)
        return run_local(atoi(argv[2]));
    if (argc >= 3 && strcmp(argv[1], "alltoall") == 0) {
        rp_comm *c;
        rp_error err;
        if (rp_comm_mpi_init(&argc, &argv, &c, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        int rc = run_alltoall(c, argv[2], argc >= 4 ? atoi(argv[3]) : 1);
        rp_comm_mpi_finalize(c);
        return rc;
    }
    bool sweep = argc >= 2 && strcmp(argv[1], "sweep") == 0;
    bool ping = argc >= 2 && strcmp(argv[1], "pingpong") == 0;
    if (sweep || ping || (argc >= 2 && strcmp(argv[1], "mpi") == 0)) {
        rp_comm *c;
        rp_error err;
        if (rp_comm_mpi_init(&argc, &argv, &c, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        int rc = sweep ? run_sweep(c) : ping ? run_pingpong(c) : run_mpi(c);
        rp_comm_mpi_finalize(c);
        return rc;
    }
    fprintf(stderr, "usage: bench_comm local W | bench_comm mpi | bench_comm sweep | "
                    "bench_comm pingpong | bench_comm alltoall CLUSTER [STRIDE] (those four "
                    "under mpirun) | bench_comm price CLUSTER N STRIDE BYTES...\n");
    return 2;
}
