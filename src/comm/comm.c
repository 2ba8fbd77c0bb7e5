/*
** Communicator front end: argument checks and dispatch to the backend.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"

rp_status rpi_local_allreduce(rp_comm *c, const rp_grouping *g, float *buf, size_t n,
                          rp_error *err);
rp_status rpi_local_allreduce_half(rp_comm *c, const rp_grouping *g, float *buf, uint16_t *stage,
                               size_t n, rp_error *err);
rp_status rpi_local_reduce_scatter(rp_comm *c, const rp_grouping *g, const float *in, size_t n,
                               float *out, rp_error *err);
rp_status rpi_local_allgather(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                          float *out, rp_error *err);
rp_status rpi_local_alltoall(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                             float *out, rp_error *err);
rp_status rpi_local_reduce_update(rp_comm *c, const rp_grouping *g, float *grads, float *params,
                              size_t n, rp_update_fn update, void *ctx, rp_error *err);
rp_status rpi_local_broadcast(rp_comm *c, const rp_grouping *g, float *buf, size_t n, int root,
                          rp_error *err);
rp_status rpi_local_barrier(rp_comm *c, rp_error *err);
rp_status rpi_local_split(rp_comm *c, int color, int key, rp_comm **out, rp_error *err);
void rpi_local_free(rp_comm *c);
void rpi_local_fail(rp_comm *c, const char *msg);
rp_status rpi_local_isend(rp_comm *c, int dst, int tag, const void *buf, size_t bytes,
                      rp_request *req, rp_error *err);
rp_status rpi_local_irecv(rp_comm *c, int src, int tag, void *buf, size_t bytes, rp_request *req,
                      rp_error *err);
rp_status rpi_local_wait(rp_comm *c, rp_request *req, rp_error *err);
rp_status rpi_local_test(rp_comm *c, rp_request *req, bool *done, rp_error *err);
void rpi_local_done(rp_request *req);

const rpi_mpi_ops *rpi_mpi;

bool rp_mpi_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

const char *rp_comm_mpi_defaults(void) { return rpi_mpi ? rpi_mpi->defaults() : NULL; }

void rp_comm_mpi_finalize(rp_comm *c) {
    if (rpi_mpi)
        rpi_mpi->finalize(c);
}

const char *rp_backend_name(rp_backend b) { return b == RP_BACKEND_MPI ? "mpi" : "local"; }

int rp_comm_rank(const rp_comm *c) { return c->rank; }
int rp_comm_size(const rp_comm *c) { return c->size; }
rp_backend rp_comm_backend(const rp_comm *c) { return c->backend; }

rp_status rpi_comm_check_grouping(const rp_comm *c, const rp_grouping *g, rp_error *err) {
    if (g && g->replicas != c->size)
        return rp_fail(err, RP_ERR_INVALID,
                       "collective: the grouping is over %d replicas but the communicator has "
                       "%d ranks",
                       g->replicas, c->size);
    return RP_OK;
}

#define LOCAL(c) ((c)->backend == RP_BACKEND_LOCAL)

rp_status rp_comm_isend(rp_comm *c, int dst, int tag, const void *buf, size_t bytes,
                        rp_request *req, rp_error *err) {
    return LOCAL(c) ? rpi_local_isend(c, dst, tag, buf, bytes, req, err)
                    : rpi_mpi->send(c, dst, tag, buf, bytes, false, req, err);
}

rp_status rp_comm_irecv(rp_comm *c, int src, int tag, void *buf, size_t bytes,
                        rp_request *req, rp_error *err) {
    return LOCAL(c) ? rpi_local_irecv(c, src, tag, buf, bytes, req, err)
                    : rpi_mpi->recv(c, src, tag, buf, bytes, false, req, err);
}

rp_status rp_comm_wait(rp_comm *c, rp_request *req, rp_error *err) {
    return LOCAL(c) ? rpi_local_wait(c, req, err) : rpi_mpi->wait(c, req, err);
}

rp_status rp_comm_send(rp_comm *c, int dst, int tag, const void *buf, size_t bytes,
                       rp_error *err) {
    rp_request r;
    if (!LOCAL(c))
        return rpi_mpi->send(c, dst, tag, buf, bytes, true, &r, err);
    rp_status s = rpi_local_isend(c, dst, tag, buf, bytes, &r, err);
    return s ? s : rpi_local_wait(c, &r, err);
}

rp_status rp_comm_recv(rp_comm *c, int src, int tag, void *buf, size_t bytes, rp_error *err) {
    rp_request r;
    if (!LOCAL(c))
        return rpi_mpi->recv(c, src, tag, buf, bytes, true, &r, err);
    rp_status s = rpi_local_irecv(c, src, tag, buf, bytes, &r, err);
    return s ? s : rpi_local_wait(c, &r, err);
}

rp_status rp_comm_barrier(rp_comm *c, rp_error *err) {
    return LOCAL(c) ? rpi_local_barrier(c, err) : rpi_mpi->barrier(c, err);
}

rp_status rp_comm_broadcast(rp_comm *c, const rp_grouping *g, float *buf, size_t n, int root,
                            rp_error *err) {
    rp_status s = rpi_comm_check_grouping(c, g, err);
    if (s)
        return s;
    int size = g ? g->group_size : c->size;
    if (root < 0 || root >= size)
        return rp_fail(err, RP_ERR_INVALID, "broadcast: root %d is not a member index (group of %d)",
                       root, size);
    return LOCAL(c) ? rpi_local_broadcast(c, g, buf, n, root, err)
                    : rpi_mpi->broadcast(c, g, buf, n, root, err);
}

rp_status rp_comm_allreduce(rp_comm *c, const rp_grouping *g, float *buf, size_t n,
                            rp_error *err) {
    rp_status s = rpi_comm_check_grouping(c, g, err);
    if (s)
        return s;
    return LOCAL(c) ? rpi_local_allreduce(c, g, buf, n, err) : rpi_mpi->allreduce(c, g, buf, n, err);
}

rp_status rp_comm_iallreduce(rp_comm *c, float *buf, size_t n, float *scratch, rp_request *req,
                             rp_error *err) {
    if (!LOCAL(c))
        return rpi_mpi->iallreduce(c, buf, n, scratch, req, err);
    /* shared memory: the sum costs what its wait would; done at once */
    rpi_local_done(req);
    return rpi_local_allreduce(c, NULL, buf, n, err);
}

rp_status rp_comm_set_servers(rp_comm *c, int k, rp_error *err) {
    if (k < 0)
        return rp_fail(err, RP_ERR_INVALID, "servers of %d ranks", k);
    return LOCAL(c) ? RP_OK : rpi_mpi->set_servers(c, k, err);
}

rp_status rp_comm_test(rp_comm *c, rp_request *req, bool *done, rp_error *err) {
    return LOCAL(c) ? rpi_local_test(c, req, done, err) : rpi_mpi->test(c, req, done, err);
}

rp_status rp_comm_reduce_scatter(rp_comm *c, const rp_grouping *g, const float *in, size_t n,
                                 float *out, rp_error *err) {
    rp_status s = rpi_comm_check_grouping(c, g, err);
    if (s)
        return s;
    return LOCAL(c) ? rpi_local_reduce_scatter(c, g, in, n, out, err)
                    : rpi_mpi->reduce_scatter(c, g, in, n, out, err);
}

rp_status rp_comm_allreduce_half(rp_comm *c, const rp_grouping *g, float *buf, uint16_t *stage,
                                 size_t n, rp_error *err) {
    rp_status s = rpi_comm_check_grouping(c, g, err);
    if (s)
        return s;
    return LOCAL(c) ? rpi_local_allreduce_half(c, g, buf, stage, n, err)
                    : rpi_mpi->allreduce_half(c, g, buf, stage, n, err);
}

rp_status rp_comm_allgather(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                            float *out, rp_error *err) {
    rp_status s = rpi_comm_check_grouping(c, g, err);
    if (s)
        return s;
    return LOCAL(c) ? rpi_local_allgather(c, g, in, k, out, err)
                    : rpi_mpi->allgather(c, g, in, k, out, err);
}

rp_status rp_comm_alltoall(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                           float *out, rp_error *err) {
    rp_status s = rpi_comm_check_grouping(c, g, err);
    if (s)
        return s;
    if (k && in == out)
        return rp_fail(err, RP_ERR_INVALID, "an all-to-all's input and output are apart");
    return LOCAL(c) ? rpi_local_alltoall(c, g, in, k, out, err)
                    : rpi_mpi->alltoall(c, g, in, k, out, err);
}

rp_status rp_comm_reduce_update(rp_comm *c, const rp_grouping *g, float *grads, float *params,
                                size_t n, rp_update_fn update, void *ctx, rp_error *err) {
    rp_status s = rpi_comm_check_grouping(c, g, err);
    if (s)
        return s;
    return LOCAL(c) ? rpi_local_reduce_update(c, g, grads, params, n, update, ctx, err)
                    : rpi_mpi->reduce_update(c, g, grads, params, n, update, ctx, err);
}

rp_status rp_comm_split(rp_comm *c, int color, int key, rp_comm **out, rp_error *err) {
    return LOCAL(c) ? rpi_local_split(c, color, key, out, err) : rpi_mpi->split(c, color, key, out, err);
}

void rp_comm_free(rp_comm *c) {
    if (!c)
        return;
    if (LOCAL(c)) {
        if (!c->from_world)
            rpi_local_free(c);
    } else {
        rpi_mpi->free(c);
    }
}

void rp_comm_fail(rp_comm *c, const char *msg) {
    if (LOCAL(c))
        rpi_local_fail(c, msg);
    else
        rpi_mpi->fail(c, msg);
}

/* The digests go as 16-bit halves in floats, which a broadcast and a sum
** carry exactly. */
rp_status rp_comm_agree(rp_comm *c, const char *const *what, const uint32_t *digest, int n,
                        rp_error *err) {
    if (n < 0 || n > 64)
        return rp_fail(err, RP_ERR_INVALID, "agree: %d things; at most 64", n);
    if (c->size == 1)
        return RP_OK;
    float theirs[128], differ[64];
    for (int i = 0; i < n; i++) {
        theirs[2 * i] = (float)(digest[i] & 0xffff);
        theirs[2 * i + 1] = (float)(digest[i] >> 16);
    }
    rp_status s = rp_comm_broadcast(c, NULL, theirs, (size_t)2 * n, 0, err);
    if (s)
        return s;
    for (int i = 0; i < n; i++)
        differ[i] = ((uint32_t)theirs[2 * i] | (uint32_t)theirs[2 * i + 1] << 16) != digest[i];
    if ((s = rp_comm_allreduce(c, NULL, differ, (size_t)n, err)))
        return s;
    char msg[sizeof err->msg];
    size_t at = 0;
    for (int i = 0; i < n; i++)
        if (differ[i] > 0 && at < sizeof msg)
            at += (size_t)snprintf(msg + at, sizeof msg - at, "%s%s (on %d rank%s)",
                                   at ? ", " : "", what[i], (int)differ[i],
                                   differ[i] > 1 ? "s" : "");
    if (!at)
        return RP_OK;
    return rp_fail(err, RP_ERR_INVALID,
                   "the ranks do not run the same job; differing from rank 0's: %s. Start every "
                   "rank with the same command and files",
                   msg);
}

