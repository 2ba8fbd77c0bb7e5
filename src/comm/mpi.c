/*
** The MPI backend: Open MPI's communicators and collectives. A grouping's
** groups are communicators made once with MPI_Comm_split and cached.
*/
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi_impl.h"

#define MAX_CACHED 16

typedef struct mpi_state {
    MPI_Comm comm;
    bool owns; /* free the communicator on rp_comm_free */
    bool world;
    struct {
        int g, s;
        MPI_Comm comm;
    } groups[MAX_CACHED];
    int num_groups;
    float *pad; /* reduce-scatter input padded to g * k */
    size_t pad_n;
    MPI_Comm xcomm; /* a copy of comm for point-to-point collectives, made at the first */
    mpi_servers servers;
} mpi_state;

/* A request: one MPI request (a send, a receive, MPI_Iallreduce), or a
** two-rank allreduce's exchange, whose receive and send end in the sum. */
typedef struct mreq {
    MPI_Request r[2];
    int kind; /* 0: r[0] alone; 1: an exchange, summed when over */
    int rank;
    float *buf, *other;
    size_t n;
} mreq;

_Static_assert(sizeof(mreq) <= sizeof(rp_request), "rp_request too small");

static mpi_state *S(rp_comm *c) { return c->mpi; }

static rp_comm *wrap(MPI_Comm comm, bool owns, bool world, rp_error *err) {
    rp_comm *c = calloc(1, sizeof *c);
    mpi_state *s = calloc(1, sizeof *s);
    if (!c || !s) {
        free(c), free(s);
        rp_fail(err, RP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->comm = comm;
    s->xcomm = MPI_COMM_NULL;
    s->owns = owns;
    s->world = world;
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->size);
    c->backend = RP_BACKEND_MPI;
    c->mpi = s;
    return c;
}

/* What Open MPI's TCP transport does by default costs a pipeline on a real
** link (bench/cluster_vs_simulate.sh, two ranks in namespaces):
** - it moves a large message with its PUT protocol, which ran a 2-rank
**   allreduce at about half the link's rate: data parallelism at 100 Mbit
**   took 1.50 s an update against 1.05 s without PUT (0.95 s by the ring
**   formula);
** - a message over its 64 KB eager limit moves only while the receiver is
**   inside an MPI call, so an activation waits for the next stage to ask:
**   a 2-stage pipeline at 100 Mbit took 150 ms an update against 137 ms
**   with a 4 MB limit.
** Unless the user set them, the ranks run without PUT and with 4 MB
** messages sent eagerly. The variables are Open MPI's own way to set its
** parameters, read at MPI_Init; other MPIs ignore them. */
static const struct {
    const char *name, *value;
} tcp_params[] = {
    {"OMPI_MCA_btl_tcp_flags", "send,inplace,need-ack,need-csum,hetero-rdma"},
    {"OMPI_MCA_btl_tcp_eager_limit", "4194304"},
    {"OMPI_MCA_btl_tcp_rndv_eager_limit", "4194304"},
    {"OMPI_MCA_btl_tcp_max_send_size", "4194304"},
};
static char tcp_note[512];

static const char *defaults(void) { return tcp_note[0] ? tcp_note : NULL; }

static void set_tcp_defaults(void) {
    size_t at = 0;
    for (size_t i = 0; i < sizeof tcp_params / sizeof tcp_params[0]; i++) {
        if (getenv(tcp_params[i].name) || setenv(tcp_params[i].name, tcp_params[i].value, 0))
            continue;
        at += (size_t)snprintf(tcp_note + at, sizeof tcp_note - at, "%s%s=%s",
                               at ? ", " : "Open MPI's TCP transport set to ", tcp_params[i].name,
                               tcp_params[i].value);
        if (at >= sizeof tcp_note)
            at = sizeof tcp_note - 1;
    }
    if (at)
        snprintf(tcp_note + at, sizeof tcp_note - at,
                 " (no PUT protocol, 4 MB sent eagerly; set a variable to choose otherwise)");
}

static const rpi_mpi_ops table;
static void backend_free(rp_comm *c);

rp_status rp_comm_mpi_init(int *argc, char ***argv, rp_comm **out, rp_error *err) {
    rpi_mpi = &table;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        set_tcp_defaults();
        int provided;
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS)
            return rpi_mpi_error(rc, "initialisation", err);
    }
    /* errors come back as codes, so that they can be reported */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    *out = wrap(MPI_COMM_WORLD, false, true, err);
    return *out ? RP_OK : RP_ERR_NOMEM;
}

static void finalize(rp_comm *c) {
    if (c) /* (what rp_comm_free does with an MPI communicator) */
        backend_free(c);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
        MPI_Finalize();
}

static void backend_free(rp_comm *c) {
    mpi_state *s = S(c);
    for (int i = 0; i < s->num_groups; i++)
        if (s->groups[i].comm != s->comm)
            MPI_Comm_free(&s->groups[i].comm);
    if (s->xcomm != MPI_COMM_NULL)
        MPI_Comm_free(&s->xcomm);
    free(s->servers.buf), free(s->servers.req);
    if (s->owns)
        MPI_Comm_free(&s->comm);
    free(s->pad);
    free(s);
    free(c);
}

static void backend_fail(rp_comm *c, const char *msg) {
    (void)msg; /* the caller reports it; MPI_Abort ends every rank */
    /* mpirun forwards a rank's output asynchronously and MPI_Abort kills at
    ** once: flush, and give the forwarder a moment to deliver the message */
    fflush(NULL);
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    MPI_Abort(S(c)->comm, 1);
}

/* The communicator of this rank's group under g. */
static rp_status group_comm(rp_comm *c, const rp_grouping *g, MPI_Comm *out, rp_error *err) {
    mpi_state *s = S(c);
    if (!g || g->group_size == c->size) {
        *out = s->comm;
        return RP_OK;
    }
    for (int i = 0; i < s->num_groups; i++)
        if (s->groups[i].g == g->group_size && s->groups[i].s == g->stride) {
            *out = s->groups[i].comm;
            return RP_OK;
        }
    if (s->num_groups == MAX_CACHED)
        return rp_fail(err, RP_ERR_INVALID, "more than %d groupings on one communicator",
                       MAX_CACHED);
    MPI_Comm nc;
    int rc = MPI_Comm_split(s->comm, rp_grouping_group_of(g, c->rank),
                            rp_grouping_index_in_group(g, c->rank), &nc);
    if (rc != MPI_SUCCESS)
        return rpi_mpi_error(rc, "Comm_split", err);
    s->groups[s->num_groups].g = g->group_size;
    s->groups[s->num_groups].s = g->stride;
    s->groups[s->num_groups++].comm = nc;
    *out = nc;
    return RP_OK;
}

static rp_status count_ok(size_t n, const char *what, rp_error *err) {
    if (n > (size_t)0x7fffffff)
        return rp_fail(err, RP_ERR_INVALID, "%s of %zu elements exceeds MPI's count limit", what,
                       n);
    return RP_OK;
}

/* A message's size within MPI's counts; its request, where it does not
** wait, a point-to-point one. */
static rp_status begin_message(size_t bytes, bool wait, rp_request *req, rp_error *err) {
    rp_status st = count_ok(bytes, "a message", err);
    if (!st && !wait)
        ((mreq *)req->opaque)->kind = 0;
    return st;
}

static rp_status backend_send(rp_comm *c, int dst, int tag, const void *buf, size_t bytes,
                              bool wait, rp_request *req, rp_error *err) {
    rp_status st = begin_message(bytes, wait, req, err);
    if (st)
        return st;
    int rc = wait ? MPI_Send(buf, (int)bytes, MPI_BYTE, dst, tag, S(c)->comm)
                  : MPI_Isend(buf, (int)bytes, MPI_BYTE, dst, tag, S(c)->comm,
                              ((mreq *)req->opaque)->r);
    return rc == MPI_SUCCESS ? RP_OK : rpi_mpi_error(rc, "send", err);
}

static rp_status backend_recv(rp_comm *c, int src, int tag, void *buf, size_t bytes, bool wait,
                              rp_request *req, rp_error *err) {
    rp_status st = begin_message(bytes, wait, req, err);
    if (st)
        return st;
    int rc = wait ? MPI_Recv(buf, (int)bytes, MPI_BYTE, src, tag, S(c)->comm, MPI_STATUS_IGNORE)
                  : MPI_Irecv(buf, (int)bytes, MPI_BYTE, src, tag, S(c)->comm,
                              ((mreq *)req->opaque)->r);
    return rc == MPI_SUCCESS ? RP_OK : rpi_mpi_error(rc, "receive", err);
}

/* An exchange is over: the pair's sum, the lower rank's values first (two
** floats add to the same bits either way; the order is the local backend's). */
static void exchange_sum(mreq *q) {
    for (size_t i = 0; i < q->n; i++)
        q->buf[i] = q->rank == 0 ? q->buf[i] + q->other[i] : q->other[i] + q->buf[i];
}

static rp_status backend_wait(rp_comm *c, rp_request *req, rp_error *err) {
    (void)c;
    mreq *q = (mreq *)req->opaque;
    int rc = MPI_Waitall(q->kind ? 2 : 1, q->r, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS)
        return rpi_mpi_error(rc, "wait", err);
    if (q->kind == 1)
        exchange_sum(q), q->kind = 0; /* (r[0] is MPI_REQUEST_NULL now: a second wait returns) */
    return RP_OK;
}

static rp_status backend_test(rp_comm *c, rp_request *req, bool *done, rp_error *err) {
    (void)c;
    mreq *q = (mreq *)req->opaque;
    int flag = 0, rc = MPI_Testall(q->kind ? 2 : 1, q->r, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS)
        return rpi_mpi_error(rc, "test", err);
    if (flag && q->kind == 1)
        exchange_sum(q), q->kind = 0;
    *done = flag != 0;
    return RP_OK;
}

static rp_status backend_barrier(rp_comm *c, rp_error *err) {
    int rc = MPI_Barrier(S(c)->comm);
    return rc == MPI_SUCCESS ? RP_OK : rpi_mpi_error(rc, "barrier", err);
}

static rp_status backend_broadcast(rp_comm *c, const rp_grouping *g, float *buf, size_t n, int root,
                                   rp_error *err) {
    MPI_Comm gc;
    rp_status st = count_ok(n, "a broadcast", err);
    if (st || (st = group_comm(c, g, &gc, err)))
        return st;
    int rc = MPI_Bcast(buf, (int)n, MPI_FLOAT, root, gc);
    return rc == MPI_SUCCESS ? RP_OK : rpi_mpi_error(rc, "Bcast", err);
}

static rp_status backend_allreduce(rp_comm *c, const rp_grouping *g, float *buf, size_t n,
                                   rp_error *err) {
    MPI_Comm gc;
    rp_status st = count_ok(n, "an allreduce", err);
    if (st || (st = group_comm(c, g, &gc, err)))
        return st;
    if (n == 0)
        return RP_OK;
    if (gc == S(c)->comm && S(c)->servers.per_server)
        return rpi_mpi_servers_allreduce(S(c)->xcomm, c->size, c->rank, &S(c)->servers, buf, n,
                                         err);
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, gc);
    return rc == MPI_SUCCESS ? RP_OK : rpi_mpi_error(rc, "Allreduce", err);
}

/* The copy of the communicator that point-to-point collectives use, so
** that their messages meet no one else's; made by the first (collective:
** every rank makes its first such call in the same order). */
static rp_status xcomm(mpi_state *s, rp_error *err) {
    int rc = s->xcomm == MPI_COMM_NULL ? MPI_Comm_dup(s->comm, &s->xcomm) : MPI_SUCCESS;
    return rc == MPI_SUCCESS ? RP_OK : rpi_mpi_error(rc, "Comm_dup", err);
}

static rp_status backend_set_servers(rp_comm *c, int k, rp_error *err) {
    mpi_state *s = S(c);
    s->servers.per_server = k > 1 && k < c->size && c->size % k == 0 ? k : 0;
    return s->servers.per_server ? xcomm(s, err) : RP_OK;
}

static rp_status backend_iallreduce(rp_comm *c, float *buf, size_t n, float *scratch,
                                    rp_request *req, rp_error *err) {
    mpi_state *s = S(c);
    mreq *q = (mreq *)req->opaque;
    rp_status st = count_ok(n, "an allreduce", err);
    if (st)
        return st;
    int rc;
    if (s->servers.per_server) { /* summed now, in rank order, as the blocking one sums */
        q->kind = 0, q->r[0] = MPI_REQUEST_NULL;
        return rpi_mpi_servers_allreduce(s->xcomm, c->size, c->rank, &s->servers, buf, n, err);
    }
    if (c->size != 2) { /* Open MPI's: its rounds move on inside MPI calls only */
        q->kind = 0;
        rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, s->comm, q->r);
        return rc == MPI_SUCCESS ? RP_OK : rpi_mpi_error(rc, "Iallreduce", err);
    }
    /* Two ranks: each sends its values whole and adds the other's, one
    ** round in which the kernel moves the bytes between calls. Open MPI's
    ** MPI_Iallreduce of 6.4 MB over a 100 Mbit link took 1.06 s where its
    ** MPI_Allreduce took 0.58 and this exchange 0.56 (the same bytes each
    ** way as a ring's halves), and 0.56 with 0.4 s of computing between
    ** tests every 50 ms. On a copy of the communicator: its messages meet
    ** no one else's. */
    if ((st = xcomm(s, err)))
        return st;
    *q = (mreq){.kind = 1, .rank = c->rank, .buf = buf, .other = scratch, .n = n};
    int peer = 1 - c->rank;
    rc = MPI_Irecv(scratch, (int)n, MPI_FLOAT, peer, 0, s->xcomm, &q->r[0]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Isend(buf, (int)n, MPI_FLOAT, peer, 0, s->xcomm, &q->r[1]);
    return rc == MPI_SUCCESS ? RP_OK : rpi_mpi_error(rc, "Isend", err);
}

/* Sum of two vectors of halves, in fp32, rounded to half. */
static void half_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = rp_half_from_float(rp_half_to_float(a[i]) + rp_half_to_float(b[i]));
}

static rp_status backend_allreduce_half(rp_comm *c, const rp_grouping *g, float *buf,
                                        uint16_t *stage, size_t n, rp_error *err) {
    MPI_Comm gc;
    rp_status st = count_ok(n, "an allreduce", err);
    if (st || (st = group_comm(c, g, &gc, err)))
        return st;
    static MPI_Op op = MPI_OP_NULL; /* made once; MPI_Finalize frees it */
    if (op == MPI_OP_NULL)
        MPI_Op_create(half_sum, 1, &op);
    rp_half_encode(buf, stage, n);
    if (n) {
        int rc = MPI_Allreduce(MPI_IN_PLACE, stage, (int)n, MPI_UINT16_T, op, gc);
        if (rc != MPI_SUCCESS)
            return rpi_mpi_error(rc, "Allreduce", err);
    }
    rp_half_decode(stage, buf, n);
    return RP_OK;
}

static rp_status backend_reduce_scatter(rp_comm *c, const rp_grouping *g, const float *in, size_t n,
                                        float *out, rp_error *err) {
    MPI_Comm gc;
    rp_status st = group_comm(c, g, &gc, err);
    if (st)
        return st;
    int size = g ? g->group_size : c->size;
    size_t k = (n + size - 1) / size;
    if ((st = count_ok(k * size, "a reduce-scatter", err)))
        return st;
    if (k == 0)
        return RP_OK;
    const float *src = in;
    if (k * size != n) { /* pad the tail with zeros */
        mpi_state *s = S(c);
        if (s->pad_n < k * size) {
            float *np = realloc(s->pad, sizeof(float) * k * size);
            if (!np)
                return rp_fail(err, RP_ERR_NOMEM, "out of memory");
            s->pad = np;
            s->pad_n = k * size;
        }
        memcpy(s->pad, in, sizeof(float) * n);
        memset(s->pad + n, 0, sizeof(float) * (k * size - n));
        src = s->pad;
    }
    int rc = MPI_Reduce_scatter_block(src, out, (int)k, MPI_FLOAT, MPI_SUM, gc);
    return rc == MPI_SUCCESS ? RP_OK : rpi_mpi_error(rc, "Reduce_scatter_block", err);
}

static rp_status backend_allgather(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                                   float *out, rp_error *err) {
    MPI_Comm gc;
    rp_status st = count_ok(k, "an allgather", err);
    if (st || (st = group_comm(c, g, &gc, err)))
        return st;
    if (k == 0)
        return RP_OK;
    int me;
    MPI_Comm_rank(gc, &me);
    const void *send = in == out + (size_t)me * k ? MPI_IN_PLACE : (const void *)in;
    int rc = MPI_Allgather(send, (int)k, MPI_FLOAT, out, (int)k, MPI_FLOAT, gc);
    return rc == MPI_SUCCESS ? RP_OK : rpi_mpi_error(rc, "Allgather", err);
}

static rp_status backend_alltoall(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                                  float *out, rp_error *err) {
    MPI_Comm gc;
    rp_status st = count_ok(k, "an all-to-all", err);
    if (st || (st = group_comm(c, g, &gc, err)))
        return st;
    if (k == 0)
        return RP_OK;
    int rc = MPI_Alltoall(in, (int)k, MPI_FLOAT, out, (int)k, MPI_FLOAT, gc);
    return rc == MPI_SUCCESS ? RP_OK : rpi_mpi_error(rc, "Alltoall", err);
}

/* Open MPI's reduce-scatter and all-gather together take longer than its
** allreduce (0.67 against 0.37 ms for 4 MB on two ranks), so every member
** takes the allreduce's sums and updates all n elements itself. */
static rp_status backend_reduce_update(rp_comm *c, const rp_grouping *g, float *grads,
                                       float *params, size_t n, rp_update_fn update, void *ctx,
                                       rp_error *err) {
    (void)params;
    rp_status st = backend_allreduce(c, g, grads, n, err);
    if (!st && n)
        update(ctx, 0, grads, n);
    return st;
}

static rp_status backend_split(rp_comm *c, int color, int key, rp_comm **out, rp_error *err) {
    MPI_Comm nc;
    int rc = MPI_Comm_split(S(c)->comm, color, key, &nc);
    if (rc != MPI_SUCCESS)
        return rpi_mpi_error(rc, "Comm_split", err);
    *out = wrap(nc, true, false, err);
    return *out ? RP_OK : RP_ERR_NOMEM;
}

static const rpi_mpi_ops table = {
    .send = backend_send,
    .recv = backend_recv,
    .wait = backend_wait,
    .test = backend_test,
    .set_servers = backend_set_servers,
    .barrier = backend_barrier,
    .broadcast = backend_broadcast,
    .allreduce = backend_allreduce,
    .iallreduce = backend_iallreduce,
    .allreduce_half = backend_allreduce_half,
    .reduce_scatter = backend_reduce_scatter,
    .allgather = backend_allgather,
    .alltoall = backend_alltoall,
    .reduce_update = backend_reduce_update,
    .split = backend_split,
    .free = backend_free,
    .fail = backend_fail,
    .finalize = finalize,
    .defaults = defaults,
};
