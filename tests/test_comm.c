/*
** Communicators: every collective over the groupings of the comm issue and
** sizes 0, 1, 7 and 1 000 003 against a serial reference; point to point,
** split, determinism; and a failure that must wake every worker.
**
**   test_comm              local backend: worlds of 8 and 16 threads
**   test_comm --mpi        MPI backend, under mpirun (any number of ranks)
**   test_comm --mpi --fail rank 2 fails mid-collective: mpirun must end
*/
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../src/core/util.h"
#include "repipe/comm.h"
#include "test.h"

static pthread_mutex_t check_mu = PTHREAD_MUTEX_INITIALIZER;
/* CHECK from worker threads: the condition (often a blocking collective)
** is evaluated first, outside the lock. */
#define TCHECK(cond)                                                                      \
    do {                                                                                  \
        bool ok_ = (cond);                                                                \
        pthread_mutex_lock(&check_mu);                                                    \
        test_checks++;                                                                    \
        if (!ok_) {                                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);      \
            test_failures++;                                                              \
        }                                                                                 \
        pthread_mutex_unlock(&check_mu);                                                  \
    } while (0)

/* Deterministic, varied values with many bits. */
static float val(int rank, size_t i) {
    unsigned long long h = (unsigned long long)rank * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    return (float)((double)(h % 2000003) / 1000001.0 - 1.0);
}

/* The serial reference: a sum in ascending member order. */
static float ref_sum(const int *members, int g, size_t i) {
    float s = val(members[0], i);
    for (int j = 1; j < g; j++)
        s += val(members[j], i);
    return s;
}

/* Indices to check: all of small buffers; for large ones the ends and a
** stride (the reference is serial and the workers share 2 cores). */
static bool checked(size_t i, size_t n) { return n < 5000 || i < 1000 || i + 1000 >= n || i % 997 == 0; }

typedef struct body_args {
    rp_comm *comm;
    bool exact; /* local: bit-identical to the reference */
} body_args;

static bool same(float got, float want, bool exact, double scale) {
    return exact ? got == want : fabs((double)got - want) <= 1e-6 * scale;
}

/* Mismatches of an all-gather's output: every member's n values in order. */
static size_t gather_errors(const float *out, const int *members, int gs, size_t n) {
    size_t bad = 0;
    for (int j = 0; j < gs; j++)
        for (size_t i = 0; i < n; i++)
            if (checked(i, n) && out[j * n + i] != val(members[j], i))
                bad++;
    return bad;
}

/* reduce_update's callback: p -= sum / 4, and a record of the pieces. */
typedef struct pieces {
    float *params;
    size_t next, covered; /* where the next piece must start; elements seen */
    bool ordered;
    int calls;
} pieces;

static void quarter_step(void *ctx, size_t at, float *sum, size_t len) {
    pieces *p = ctx;
    if (p->calls++ == 0)
        p->next = at;
    p->ordered &= at == p->next;
    p->next = at + len, p->covered += len;
    for (size_t x = 0; x < len; x++)
        p->params[at + x] -= 0.25f * sum[x];
}

/* The largest message: a million and three floats (many of the local
** backend's 2048-float sum blocks, an odd tail), or under ThreadSanitizer
** (REPIPE_TEST_NARROW, set by its build's tests) a hundred thousand and
** three: the same blocks and tail, a tenth of the shadow memory to fault in
** (at the full size the sanitizer spent 46 of its 80 CPU-seconds there). */
static size_t large = 1000003;

static float start_param(size_t i) { return (float)(i % 1013) * 0.5f; }

static void check_collectives(rp_comm *c, const rp_grouping *g, bool exact) {
    rp_error err;
    int r = rp_comm_rank(c), members[64], idx;
    int gs = g ? g->group_size : rp_comm_size(c);
    if (g) {
        rp_grouping_members(g, rp_grouping_group_of(g, r), members);
        idx = rp_grouping_index_in_group(g, r);
    } else {
        for (int i = 0; i < gs; i++)
            members[i] = i;
        idx = r;
    }
    const size_t sizes[] = {0, 1, 7, large};
    for (int si = 0; si < 4; si++) {
        size_t n = sizes[si], k = (n + gs - 1) / gs;
        float *buf = malloc(sizeof(float) * (n + 1)), *again = malloc(sizeof(float) * (n + 1));
        float *out = malloc(sizeof(float) * (gs * (n + 1) + 1));
        size_t bad = 0;
        /* allreduce, twice: the same bits both times */
        for (size_t i = 0; i < n; i++)
            buf[i] = again[i] = val(r, i);
        TCHECK(rp_comm_allreduce(c, g, buf, n, &err) == RP_OK);
        TCHECK(rp_comm_allreduce(c, g, again, n, &err) == RP_OK);
        for (size_t i = 0; i < n; i++)
            if (checked(i, n) && !same(buf[i], ref_sum(members, gs, i), exact, gs))
                bad++;
        TCHECK(bad == 0);
        TCHECK(memcmp(buf, again, sizeof(float) * n) == 0);
        /* reduce_update: the member updates its share in ascending pieces
        ** (locally its chunk, under MPI everything) from the allreduce's
        ** sums, and every member ends with every element updated */
        float *params = malloc(sizeof(float) * (n + 1));
        for (size_t i = 0; i < n; i++)
            again[i] = val(r, i), params[i] = start_param(i);
        pieces pc = {params, 0, 0, true, 0};
        TCHECK(rp_comm_reduce_update(c, g, again, params, n, quarter_step, &pc, &err) == RP_OK);
        size_t from = idx * k < n ? idx * k : n, mine = from + k < n ? k : n - from;
        if (rp_comm_backend(c) == RP_BACKEND_MPI)
            from = 0, mine = n;
        TCHECK(pc.ordered && pc.covered == mine && (pc.calls == 0 || pc.next == from + mine));
        TCHECK(mine == 0 || pc.calls > 0);
        bad = 0;
        for (size_t i = 0; i < n; i++)
            if (checked(i, n) && params[i] != start_param(i) - 0.25f * buf[i])
                bad++;
        TCHECK(bad == 0);
        free(params);
        /* in half precision: the members' halves summed in fp32 and rounded;
        ** MPI may round partial sums of more than two members too */
        uint16_t *stage = malloc(sizeof(uint16_t) * (n + 1));
        for (size_t i = 0; i < n; i++)
            buf[i] = val(r, i);
        TCHECK(rp_comm_allreduce_half(c, g, buf, stage, n, &err) == RP_OK);
        bad = 0;
        for (size_t i = 0; i < n; i++) {
            if (!checked(i, n))
                continue;
            float sum = 0, mag = 0;
            for (int j = 0; j < gs; j++) {
                float h = rp_half_to_float(rp_half_from_float(val(members[j], i)));
                sum += h;
                mag += fabsf(h);
            }
            float want = rp_half_to_float(rp_half_from_float(sum));
            bool ok = exact || gs <= 2 ? buf[i] == want
                                       : fabsf(buf[i] - want) <= gs * 0x1p-11f * mag + 0x1p-24f;
            bad += !ok;
        }
        TCHECK(bad == 0);
        free(stage);
        /* reduce-scatter: chunk idx of the sum, zero-padded */
        for (size_t i = 0; i < n; i++)
            buf[i] = val(r, i);
        TCHECK(rp_comm_reduce_scatter(c, g, buf, n, out, &err) == RP_OK);
        bad = 0;
        for (size_t x = 0; x < k; x++) {
            size_t i = idx * k + x;
            float want = i < n ? ref_sum(members, gs, i) : 0.0f;
            if (checked(x, k) && !same(out[x], want, exact, gs))
                bad++;
        }
        TCHECK(bad == 0);
        /* all-gather: every member's n values, in member order */
        TCHECK(rp_comm_allgather(c, g, buf, n, out, &err) == RP_OK);
        TCHECK(gather_errors(out, members, gs, n) == 0);
        /* in place: the member's block of out is its input */
        for (size_t i = 0; i < n; i++)
            out[idx * n + i] = val(r, i);
        TCHECK(rp_comm_allgather(c, g, out + idx * n, n, out, &err) == RP_OK);
        TCHECK(gather_errors(out, members, gs, n) == 0);
        /* all-to-all: block j of member m's input reaches member j at block m. Blocks
        ** of up to 4099 floats (four pages and more): it copies whole blocks, with no
        ** chunked sums to cross, and larger ones cost ThreadSanitizer seconds a size */
        size_t b = n < 4099 ? n : 4099;
        float *sent = malloc(sizeof(float) * (gs * b + 1));
        for (int j = 0; j < gs; j++)
            for (size_t i = 0; i < b; i++)
                sent[j * b + i] = val(r, j * b + i);
        TCHECK(rp_comm_alltoall(c, g, sent, b, out, &err) == RP_OK);
        bad = 0;
        for (int j = 0; j < gs; j++)
            for (size_t i = 0; i < b; i++)
                if (out[j * b + i] != val(members[j], idx * b + i))
                    bad++;
        TCHECK(bad == 0);
        TCHECK(b == 0 || (rp_comm_alltoall(c, g, out, b, out, &err) == RP_ERR_INVALID &&
                          strstr(err.msg, "apart")));
        free(sent);
        /* broadcast from the last member */
        TCHECK(rp_comm_broadcast(c, g, buf, n, gs - 1, &err) == RP_OK);
        bad = 0;
        for (size_t i = 0; i < n; i++)
            if (checked(i, n) && buf[i] != val(members[gs - 1], i))
                bad++;
        TCHECK(bad == 0);
        free(buf), free(again), free(out);
    }
}

static void check_p2p(rp_comm *c) {
    rp_error err;
    int r = rp_comm_rank(c), n = rp_comm_size(c);
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    const size_t sizes[] = {0, 1, 7, large};
    for (int si = 0; si < 4; si++) {
        size_t len = sizes[si];
        float *a = malloc(sizeof(float) * (len + 1)), *b = malloc(sizeof(float) * (len + 1));
        for (size_t i = 0; i < len; i++)
            a[i] = val(r, i);
        rp_request rs, rr;
        /* two messages with different tags, received in the other order */
        TCHECK(rp_comm_isend(c, next, 5, a, sizeof(float) * len, &rs, &err) == RP_OK);
        float tagged = (float)r;
        rp_request rs2;
        TCHECK(rp_comm_isend(c, next, 6, &tagged, sizeof tagged, &rs2, &err) == RP_OK);
        float got_tag = -1;
        TCHECK(rp_comm_recv(c, prev, 6, &got_tag, sizeof got_tag, &err) == RP_OK);
        TCHECK(got_tag == (float)prev);
        TCHECK(rp_comm_irecv(c, prev, 5, b, sizeof(float) * len, &rr, &err) == RP_OK);
        TCHECK(rp_comm_wait(c, &rr, &err) == RP_OK);
        TCHECK(rp_comm_wait(c, &rs, &err) == RP_OK);
        TCHECK(rp_comm_wait(c, &rs2, &err) == RP_OK);
        size_t bad = 0;
        for (size_t i = 0; i < len; i++)
            bad += b[i] != val(prev, i);
        TCHECK(bad == 0);
        free(a), free(b);
    }
    TCHECK(rp_comm_barrier(c, &err) == RP_OK);
}

static void check_split(rp_comm *c, bool exact) {
    rp_error err;
    int r = rp_comm_rank(c);
    rp_comm *half;
    /* two halves, each ordered by descending rank */
    TCHECK(rp_comm_split(c, r % 2, -r, &half, &err) == RP_OK);
    int n = rp_comm_size(c), expect = (n - r % 2 + 1) / 2;
    TCHECK(rp_comm_size(half) == expect);
    int members[64];
    for (int i = 0; i < expect; i++) /* descending ranks of my parity */
        members[i] = (n - 1 - ((n - 1 - r % 2) % 2)) - 2 * i;
    TCHECK(members[rp_comm_rank(half)] == r);
    float x[3] = {val(r, 0), val(r, 1), val(r, 2)};
    TCHECK(rp_comm_allreduce(half, NULL, x, 3, &err) == RP_OK);
    for (int i = 0; i < 3; i++)
        TCHECK(same(x[i], ref_sum(members, expect, (size_t)i), exact, expect));
    rp_comm_free(half);
}

/* Servers of k ranks (each k that divides the size): the allreduce, and the
** non-blocking one, sum in rank order: the reference's bits, under MPI too;
** sizes from none to several of the chain's pieces (16384 floats) a chunk,
** not a multiple of k. */
static void check_servers(rp_comm *c) {
    rp_error err;
    int n = rp_comm_size(c), r = rp_comm_rank(c), all[64];
    for (int i = 0; i < n; i++)
        all[i] = i;
    static const size_t sizes[] = {0, 1, 5, 1001, 100003};
    float *x = malloc(sizeof(float) * 100003), *scratch = malloc(sizeof(float) * 100003);
    for (int k = 2; k < n; k++) {
        if (n % k)
            continue;
        rp_comm *sc;
        TCHECK(rp_comm_split(c, 0, r, &sc, &err) == RP_OK);
        TCHECK(rp_comm_set_servers(sc, k, &err) == RP_OK);
        for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
            for (int nb = 0; nb < 2; nb++) {
                size_t m = sizes[t], bad = 0;
                for (size_t i = 0; i < m; i++)
                    x[i] = val(r, i);
                if (nb) {
                    rp_request q;
                    TCHECK(rp_comm_iallreduce(sc, x, m, scratch, &q, &err) == RP_OK);
                    TCHECK(rp_comm_wait(sc, &q, &err) == RP_OK);
                } else {
                    TCHECK(rp_comm_allreduce(sc, NULL, x, m, &err) == RP_OK);
                }
                for (size_t i = 0; i < m; i++)
                    bad += checked(i, m) && x[i] != ref_sum(all, n, i);
                if (bad)
                    fprintf(stderr, "servers of %d of %d ranks, %s%zu floats: %zu sums not in "
                            "rank order\n", k, n, nb ? "non-blocking, " : "", m, bad);
                TCHECK(bad == 0);
            }
        }
        rp_comm_free(sc);
    }
    free(x), free(scratch);
}

static void run_body(rp_comm *c, bool exact) {
    int n = rp_comm_size(c);
    /* the comm issue's groupings, (stride, group size), where they fit */
    static const int gs[][3] = {{8, 1, 8}, {8, 1, 2}, {8, 4, 2}, {8, 2, 2}, {8, 1, 1},
                                {16, 4, 4}, {4, 1, 4}, {4, 1, 2}, {4, 2, 2}, {4, 1, 1}};
    check_collectives(c, NULL, exact);
    for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++) {
        if (gs[i][0] != n)
            continue;
        rp_grouping g;
        rp_error err;
        TCHECK(rp_grouping_init(&g, n, gs[i][2], gs[i][1], &err) == RP_OK);
        check_collectives(c, &g, exact);
    }
    check_p2p(c);
    check_split(c, exact);
    check_servers(c);
    /* a grouping over the wrong number of replicas is refused */
    rp_grouping bad = rp_grouping_all(n + 1);
    float x = 1;
    rp_error err;
    TCHECK(rp_comm_allreduce(c, &bad, &x, 1, &err) == RP_ERR_INVALID);
}

static void *thread_body(void *p) {
    body_args *a = p;
    run_body(a->comm, a->exact);
    return NULL;
}

static void local_world(int size) {
    rp_world *w;
    rp_error err;
    CHECK(rp_world_create(size, &w, &err) == RP_OK);
    pthread_t t[16];
    body_args a[16];
    for (int r = 0; r < size; r++) {
        a[r] = (body_args){rp_world_comm(w, r), true};
        pthread_create(&t[r], NULL, thread_body, &a[r]);
    }
    for (int r = 0; r < size; r++)
        pthread_join(t[r], NULL);
    rp_world_free(w);
}

/* ---- failure ---------------------------------------------------------------- */

typedef struct fail_args {
    rp_comm *comm;
    rp_status status;
    double waited;
    char msg[RP_ERROR_MAX];
} fail_args;

static void *fail_body(void *p) {
    fail_args *a = p;
    rp_error err = {0};
    float buf[16] = {0};
    if (rp_comm_rank(a->comm) == 2) {
        struct timespec d = {0, 200 * 1000 * 1000};
        nanosleep(&d, NULL); /* the others are waiting by now */
        rp_comm_fail(a->comm, "injected failure");
        a->status = RP_ERR_INVALID;
        return NULL;
    }
    double t0 = rp_now();
    if (rp_comm_rank(a->comm) == 3) /* blocked in a receive from the failing worker */
        a->status = rp_comm_recv(a->comm, 2, 1, buf, sizeof buf, &err);
    else
        a->status = rp_comm_allreduce(a->comm, NULL, buf, 16, &err);
    a->waited = rp_now() - t0 - 0.2;
    snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    /* and every later call fails at once */
    if (rp_comm_barrier(a->comm, &err) != RP_ERR_ABORTED)
        a->status = RP_OK;
    return NULL;
}

static void local_failure(void) {
    rp_world *w;
    rp_error err;
    CHECK(rp_world_create(4, &w, &err) == RP_OK);
    pthread_t t[4];
    fail_args a[4];
    for (int r = 0; r < 4; r++) {
        a[r] = (fail_args){.comm = rp_world_comm(w, r)};
        pthread_create(&t[r], NULL, fail_body, &a[r]);
    }
    for (int r = 0; r < 4; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < 4; r++) {
        if (r == 2)
            continue;
        CHECK(a[r].status == RP_ERR_ABORTED);
        CHECK_STR_HAS(a[r].msg, "worker 2 failed: injected failure");
        CHECK(a[r].waited < 1.0);
    }
    rp_world_free(w);
}

int main(int argc, char **argv) {
    bool mpi = argc > 1 && strcmp(argv[1], "--mpi") == 0;
    bool fail = argc > 2 && strcmp(argv[2], "--fail") == 0;
    if (getenv("REPIPE_TEST_NARROW"))
        large = 100003;
    if (!mpi) {
        local_world(8);
        local_world(16);
        local_failure();
        return test_finish("test_comm (local)");
    }
    rp_comm *c;
    rp_error err;
    if (rp_comm_mpi_init(&argc, &argv, &c, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (fail) {
        float buf[4] = {0};
        if (rp_comm_rank(c) == 2) {
            sleep(1);
            fprintf(stderr, "rank 2: injected failure\n");
            rp_comm_fail(c, "injected failure");
        }
        rp_comm_allreduce(c, NULL, buf, 4, &err); /* never returns */
        rp_comm_mpi_finalize(c);
        return 0;
    }
    run_body(c, false);
    int rank = rp_comm_rank(c);
    char name[64];
    snprintf(name, sizeof name, "test_comm (mpi rank %d)", rank);
    int rc = test_finish(name);
    rp_comm_mpi_finalize(c);
    return rc;
}
