/*
** MPI backend internals shared by its files (mpi.c, mpi_servers.c).
*/
#ifndef REPIPE_MPI_IMPL_H
#define REPIPE_MPI_IMPL_H

#include <mpi.h>

#include "comm_impl.h"

/* rp_comm_set_servers: k ranks a server, and the scratch of the allreduce
** over servers, kept between calls. */
typedef struct mpi_servers {
    int per_server; /* 0: flat */
    float *buf;
    size_t nbuf;
    MPI_Request *req;
    int nreq;
} mpi_servers;

/* The allreduce of n floats over the size ranks of x, in consecutive runs
** of h->per_server a server (which divides size), summed in rank order. */
rp_status rpi_mpi_servers_allreduce(MPI_Comm x, int size, int rank, mpi_servers *h, float *buf,
                                    size_t n, rp_error *err);

/* An MPI error code as repipe's error, naming the call that failed. Inline
** here so that both files use it without calling each other (mpi.c calls
** mpi_servers.c's allreduce; nothing calls back). */
static inline rp_status rpi_mpi_error(int code, const char *what, rp_error *err) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, text, &len);
    return rp_fail(err, RP_ERR_IO, "MPI %s failed: %.*s", what, len, text);
}

/* The backend's entry points (mpi.c), which its table holds. */
rp_status rpi_mpi_send(rp_comm *c, int dst, int tag, const void *buf, size_t bytes, bool wait,
                   rp_request *req, rp_error *err);
rp_status rpi_mpi_recv(rp_comm *c, int src, int tag, void *buf, size_t bytes, bool wait,
                   rp_request *req, rp_error *err);
rp_status rpi_mpi_wait(rp_comm *c, rp_request *req, rp_error *err);
rp_status rpi_mpi_test(rp_comm *c, rp_request *req, bool *done, rp_error *err);
rp_status rpi_mpi_set_servers(rp_comm *c, int k, rp_error *err);
rp_status rpi_mpi_barrier(rp_comm *c, rp_error *err);
rp_status rpi_mpi_broadcast(rp_comm *c, const rp_grouping *g, float *buf, size_t n, int root,
                        rp_error *err);
rp_status rpi_mpi_allreduce(rp_comm *c, const rp_grouping *g, float *buf, size_t n, rp_error *err);
rp_status rpi_mpi_iallreduce(rp_comm *c, float *buf, size_t n, float *scratch, rp_request *req,
                             rp_error *err);
rp_status rpi_mpi_allreduce_half(rp_comm *c, const rp_grouping *g, float *buf, uint16_t *stage,
                             size_t n, rp_error *err);
rp_status rpi_mpi_reduce_scatter(rp_comm *c, const rp_grouping *g, const float *in, size_t n,
                             float *out, rp_error *err);
rp_status rpi_mpi_alltoall(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                           float *out, rp_error *err);
rp_status rpi_mpi_allgather(rp_comm *c, const rp_grouping *g, const float *in, size_t k, float *out,
                        rp_error *err);
rp_status rpi_mpi_reduce_update(rp_comm *c, const rp_grouping *g, float *grads, float *params,
                            size_t n, rp_update_fn update, void *ctx, rp_error *err);
rp_status rpi_mpi_split(rp_comm *c, int color, int key, rp_comm **out, rp_error *err);
void rpi_mpi_free(rp_comm *c);
void rpi_mpi_fail(rp_comm *c, const char *msg);


#endif /* REPIPE_MPI_IMPL_H */
