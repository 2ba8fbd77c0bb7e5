/*
** Communicators: how workers talk (docs/communicators.md).
**
** One interface, two backends with the same semantics:
**   local  workers are threads of one process; messages and collectives go
**          through shared memory, waits block on a condition variable;
**   mpi    workers are MPI ranks (Open MPI); collectives are MPI's own.
**
** Collectives take a replica grouping over the communicator's ranks and act
** within every group at once, members in ascending order: rank r takes part
** in the collective of group_of(r) with the other members of that group.
** Every member of a group must make the same sequence of collective calls.
**
** If a worker fails (rp_comm_fail), every worker blocked in, or later
** entering, a call of the same world returns RP_ERR_ABORTED with the
** failing worker's message; nothing hangs. Under MPI the job is aborted.
*/
#ifndef REPIPE_COMM_H
#define REPIPE_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "repipe/core.h"
#include "repipe/grouping.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rp_backend { RP_BACKEND_LOCAL = 0, RP_BACKEND_MPI } rp_backend;

const char *rp_backend_name(rp_backend b);

typedef struct rp_comm rp_comm;

/* ---- local backend ---------------------------------------------------------- */

/* A set of `size` workers in this process; each thread takes its own
** communicator with rp_world_comm. */
typedef struct rp_world rp_world;

rp_status rp_world_create(int size, rp_world **out, rp_error *err);
rp_comm *rp_world_comm(rp_world *w, int rank);
/* Frees the world and its communicators, once every thread is done. */
void rp_world_free(rp_world *w);
/* A communicator of the world's ranks members[0..n) (ascending order of
** rank within it), as seen by members[me]; made without a collective call.
** Freed with rp_comm_free. */
rp_comm *rp_world_subcomm(rp_world *w, const int *members, int n, int me);

/* ---- mpi backend ------------------------------------------------------------ */

/* MPI_Init (if not yet done) and the communicator of MPI_COMM_WORLD.
** Before MPI_Init it sets what repipe needs of Open MPI where the user has
** not (rp_comm_mpi_defaults says what). */
rp_status rp_comm_mpi_init(int *argc, char ***argv, rp_comm **out, rp_error *err);
/* A sentence on the Open MPI settings rp_comm_mpi_init chose, or NULL when
** it chose none (the user set them, or MPI was started before). */
const char *rp_comm_mpi_defaults(void);
/* Frees the communicator and calls MPI_Finalize. */
void rp_comm_mpi_finalize(rp_comm *c);
/* True when this process was started by mpirun (several ranks or one). */
bool rp_mpi_launched(void);

/* ---- both --------------------------------------------------------------------- */

int rp_comm_rank(const rp_comm *c);
int rp_comm_size(const rp_comm *c);
rp_backend rp_comm_backend(const rp_comm *c);

/* Point to point, tagged (tag >= 0); a receive names its source. */
rp_status rp_comm_send(rp_comm *c, int dst, int tag, const void *buf, size_t bytes,
                       rp_error *err);
rp_status rp_comm_recv(rp_comm *c, int src, int tag, void *buf, size_t bytes, rp_error *err);

/* Non-blocking: the request lives in the caller's memory until waited for;
** the buffer must not be touched until then. */
typedef struct rp_request {
    unsigned char opaque[128];
} rp_request;

rp_status rp_comm_isend(rp_comm *c, int dst, int tag, const void *buf, size_t bytes,
                        rp_request *req, rp_error *err);
rp_status rp_comm_irecv(rp_comm *c, int src, int tag, void *buf, size_t bytes,
                        rp_request *req, rp_error *err);
rp_status rp_comm_wait(rp_comm *c, rp_request *req, rp_error *err);

rp_status rp_comm_barrier(rp_comm *c, rp_error *err);

/* Collectives within each group of g (over rp_comm_size ranks); g == NULL
** means one group of all ranks. Sums are taken in ascending member order
** by the local backend, so its results are the same on every run. */
rp_status rp_comm_broadcast(rp_comm *c, const rp_grouping *g, float *buf, size_t n, int root,
                            rp_error *err); /* root: index in the group */
rp_status rp_comm_allreduce(rp_comm *c, const rp_grouping *g, float *buf, size_t n,
                            rp_error *err); /* sum, in place */
/* The allreduce over all ranks of c, started without waiting: the sum is
** in buf once rp_comm_wait (or an rp_comm_test that says done) returns for
** req; until then neither buf nor scratch (n floats; MPI with 2 ranks
** receives the other's values there) may be touched. Every rank starts its
** non-blocking collectives on c in the same order. Each element's sum is
** rp_comm_allreduce's: the local backend sums at once, in member order;
** under MPI two ranks exchange their values and each adds the pair (one
** round, so the bytes move while the caller computes, as far as calls to
** rp_comm_test let Open MPI progress them), more ranks use MPI_Iallreduce. */
rp_status rp_comm_iallreduce(rp_comm *c, float *buf, size_t n, float *scratch, rp_request *req,
                             rp_error *err);
/* Whether a started request has finished (*done); lets MPI progress it. A
** request found done is over: it is not waited for again. */
rp_status rp_comm_test(rp_comm *c, rp_request *req, bool *done, rp_error *err);
/* The allreduce with values exchanged in half precision (half the bytes):
** each member's values are rounded to fp16 and the sum, taken in fp32, is
** rounded to fp16 again, so buf ends with fp16 values. `stage` is the
** caller's scratch of n halves. The local backend sums in ascending member
** order; MPI may group the partial sums differently (each rounded to fp16),
** which for two members gives the same result. */
rp_status rp_comm_allreduce_half(rp_comm *c, const rp_grouping *g, float *buf, uint16_t *stage,
                                 size_t n, rp_error *err);
/* Member i receives elements [i*k, (i+1)*k) of the sum, k = ceil(n / g),
** zero-padded at the tail: out holds k floats. */
rp_status rp_comm_reduce_scatter(rp_comm *c, const rp_grouping *g, const float *in, size_t n,
                                 float *out, rp_error *err);
/* Every member contributes k floats; out holds the group's g * k, in
** member order. In place when in is the member's own block of out
** (out + i * k for member i). */
rp_status rp_comm_allgather(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                            float *out, rp_error *err);
/* Every member sends block j of in (k floats at in + j * k) to member j and
** receives member j's block for it at out + j * k, in member order: the
** exchange of a mixture's tokens with the members holding their experts.
** in and out are apart (in holds the group's g * k floats, as out does). */
rp_status rp_comm_alltoall(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                           float *out, rp_error *err);

/* Data parallelism's sum-then-update as one collective. The member calls
** update(ctx, at, sum, len) on pieces of its share of the group's sum of
** grads, in ascending order; update must write the member's own
** params[at, at + len) from sum (which it may overwrite). On the local
** backend the share is a chunk, member i's elements [i*k, min((i+1)*k, n)),
** k = ceil(n / g), and the new values are copied to every member, so each
** element is updated once per group; under MPI it is all n elements (Open
** MPI's reduce-scatter and all-gather cost more than its allreduce). On
** return every member's params hold every element's update, made from the
** sums rp_comm_allreduce gives. grads are left unspecified. */
typedef void (*rp_update_fn)(void *ctx, size_t at, float *sum, size_t len);
rp_status rp_comm_reduce_update(rp_comm *c, const rp_grouping *g, float *grads, float *params,
                                size_t n, rp_update_fn update, void *ctx, rp_error *err);

/* Whether every rank holds rank 0's digest of each of n things (what[i]
** names them: "the model", "the configuration"): ranks that run different
** commands would wait in collectives the others never enter, or exchange
** messages of other sizes. One broadcast and one sum (collective); every
** rank fails alike, naming each thing that differs and on how many ranks.
** n <= 64. */
rp_status rp_comm_agree(rp_comm *c, const char *const *what, const uint32_t *digest, int n,
                        rp_error *err);

/* The servers c's ranks are on: consecutive runs of k ranks share one (its
** fast links), and the links between servers are slower. An allreduce of a
** communicator that spans servers then sums inside each server, crosses
** between servers once each way along a chain of them, and shares the
** sums inside each server again, in rank order: the local backend's sums
** (a flat MPI_Allreduce of more than two ranks groups them its own way).
** Collective over c. k of 0 or 1, one that does not divide the size, or a
** single server: flat. The local backend's ranks share memory: no effect. */
rp_status rp_comm_set_servers(rp_comm *c, int k, rp_error *err);

/* Ranks with the same color form a new communicator, ordered by (key, rank).
** Collective over c. The result is freed with rp_comm_free. */
rp_status rp_comm_split(rp_comm *c, int color, int key, rp_comm **out, rp_error *err);
void rp_comm_free(rp_comm *c);

/* Reports a failure: every worker of the world wakes with RP_ERR_ABORTED and
** this message. Under MPI the job is aborted (MPI_Abort). */
void rp_comm_fail(rp_comm *c, const char *msg);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_COMM_H */
