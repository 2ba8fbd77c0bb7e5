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
rp_status rpi_mpi_error(int code, const char *what, rp_error *err);

#endif /* REPIPE_MPI_IMPL_H */
