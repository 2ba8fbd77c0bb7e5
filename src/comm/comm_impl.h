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

/* the MPI backend's entry points (mpi.c) */
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
rp_status rpi_mpi_allgather(rp_comm *c, const rp_grouping *g, const float *in, size_t k, float *out,
                        rp_error *err);
rp_status rpi_mpi_reduce_update(rp_comm *c, const rp_grouping *g, float *grads, float *params,
                            size_t n, rp_update_fn update, void *ctx, rp_error *err);
rp_status rpi_mpi_split(rp_comm *c, int color, int key, rp_comm **out, rp_error *err);
void rpi_mpi_free(rp_comm *c);
void rpi_mpi_fail(rp_comm *c, const char *msg);

#endif /* REPIPE_COMM_IMPL_H */
