/*
** Communicator internals shared by the backends.
*/
#ifndef REPIPE_COMM_IMPL_H
#define REPIPE_COMM_IMPL_H

#include "repipe/comm.h"

struct rp_comm {
    rp_backend backend;
    int rank, size;
    /* local */
    rp_world *world;
    int *members;    /* world rank of each rank of this communicator */
    bool from_world; /* owned by the world (not freed by rp_comm_free) */
    /* mpi */
    void *mpi;
};

/* Ranks (of c) of the group of rank r under g, ascending, into out; returns
** the group's size and sets *index to r's position. */
static inline int comm_group(const rp_comm *c, const rp_grouping *g, int r, int *out,
                             int *index) {
    if (!g) {
        for (int i = 0; i < c->size; i++)
            out[i] = i;
        *index = r;
        return c->size;
    }
    int k = rp_grouping_group_of(g, r);
    rp_grouping_members(g, k, out);
    *index = rp_grouping_index_in_group(g, r);
    return g->group_size;
}

rp_status rpi_comm_check_grouping(const rp_comm *c, const rp_grouping *g, rp_error *err);

/* The MPI backend's entry points (mpi.c), reached through a table that
** rp_comm_mpi_init sets: a program that never asks for MPI (the repipe
** command, for `plan` and `config`) links no MPI library, and loads the
** backend as a module (librepipe_mpi.so) only for --backend mpi. comm.c
** dispatches to the local backend or to this table, by design the two
** sides' only meeting point. */
typedef struct rpi_mpi_ops {
    rp_status (*send)(rp_comm *c, int dst, int tag, const void *buf, size_t bytes, bool wait,
                      rp_request *req, rp_error *err);
    rp_status (*recv)(rp_comm *c, int src, int tag, void *buf, size_t bytes, bool wait,
                      rp_request *req, rp_error *err);
    rp_status (*wait)(rp_comm *c, rp_request *req, rp_error *err);
    rp_status (*test)(rp_comm *c, rp_request *req, bool *done, rp_error *err);
    rp_status (*set_servers)(rp_comm *c, int k, rp_error *err);
    rp_status (*barrier)(rp_comm *c, rp_error *err);
    rp_status (*broadcast)(rp_comm *c, const rp_grouping *g, float *buf, size_t n, int root,
                           rp_error *err);
    rp_status (*allreduce)(rp_comm *c, const rp_grouping *g, float *buf, size_t n, rp_error *err);
    rp_status (*iallreduce)(rp_comm *c, float *buf, size_t n, float *scratch, rp_request *req,
                            rp_error *err);
    rp_status (*allreduce_half)(rp_comm *c, const rp_grouping *g, float *buf, uint16_t *stage,
                                size_t n, rp_error *err);
    rp_status (*reduce_scatter)(rp_comm *c, const rp_grouping *g, const float *in, size_t n,
                                float *out, rp_error *err);
    rp_status (*allgather)(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                           float *out, rp_error *err);
    rp_status (*alltoall)(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                          float *out, rp_error *err);
    rp_status (*reduce_update)(rp_comm *c, const rp_grouping *g, float *grads, float *params,
                               size_t n, rp_update_fn update, void *ctx, rp_error *err);
    rp_status (*split)(rp_comm *c, int color, int key, rp_comm **out, rp_error *err);
    void (*free)(rp_comm *c);
    void (*fail)(rp_comm *c, const char *msg);
    void (*finalize)(rp_comm *c); /* frees c (may be NULL), then MPI_Finalize */
    const char *(*defaults)(void);
} rpi_mpi_ops;

/* The table, once MPI is started; NULL before. */
extern const rpi_mpi_ops *rpi_mpi;

#endif /* REPIPE_COMM_IMPL_H */
