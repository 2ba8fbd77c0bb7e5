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

#endif /* REPIPE_MPI_IMPL_H */
