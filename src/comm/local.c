/*
** The local backend: workers are threads sharing memory.
**
** Collectives meet at a sync object, one per set of members. A member
** publishes its buffer pointer and waits at a barrier; once all are there,
** each member reads the others' buffers directly. In an allreduce member i
** sums chunk i of every buffer, in ascending member order, and writes the
** sum into every member's buffer: each element is read once and written
** once per member, and the sums are the same on every run.
**
** Point-to-point is a rendezvous: the sender's buffer is copied straight
** into the receiver's, outside the lock. All waits block on one condition
** variable; a failure sets a flag and wakes everybody.
*/
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/util.h"
#include "comm_impl.h"

typedef struct sync {
    int g;
    int *members; /* world ranks, ascending member order */
    int count;
    unsigned long gen;
    const void **ptr; /* published by each member */
    int *ints;        /* two per member, for split */
    struct sync *next;
} sync_obj;

typedef struct lreq {
    int src, dst, tag; /* world ranks */
    void *buf;
    size_t bytes;
    bool is_send, matched;
    unsigned long done; /* 0 until the copy is finished */
    rp_status status;
    struct lreq *next;
} lreq;

struct rp_world {
    int size;
    bool spin; /* every worker has a core: waiters may spin before sleeping */
    pthread_mutex_t mu;
    /* A condition variable a worker: an event wakes the workers it concerns
    ** (a barrier's members, a message's two ends), not every sleeper of the
    ** world. With one for all, test_replicas (up to 16 workers on 2 cores)
    ** spent 1.9 s in the kernel, 1.3 s with one a worker. */
    pthread_cond_t *wake;
    bool failed;
    char msg[RP_ERROR_MAX];
    rp_comm *comms;
    int *identity;
    sync_obj *syncs;
    lreq *sends, *recvs;
};

_Static_assert(sizeof(lreq) <= sizeof(rp_request), "rp_request too small");

rp_status rp_world_create(int size, rp_world **out, rp_error *err) {
    *out = NULL;
    if (size < 1 || size > RP_MAX_WORKERS)
        return rp_fail(err, RP_ERR_INVALID, "a local world needs 1 to %d workers (got %d)",
                       RP_MAX_WORKERS, size);
    rp_world *w = calloc(1, sizeof *w);
    if (!w || !(w->comms = calloc(size, sizeof(rp_comm))) ||
        !(w->identity = malloc(sizeof(int) * size)) ||
        !(w->wake = malloc(sizeof(pthread_cond_t) * size))) {
        if (w)
            free(w->comms), free(w->identity);
        free(w);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    w->size = size;
    w->spin = size <= sysconf(_SC_NPROCESSORS_ONLN);
    pthread_mutex_init(&w->mu, NULL);
    for (int r = 0; r < size; r++) {
        pthread_cond_init(&w->wake[r], NULL);
        w->identity[r] = r;
        w->comms[r] = (rp_comm){RP_BACKEND_LOCAL, r, size, w, w->identity, true, NULL};
    }
    *out = w;
    return RP_OK;
}

rp_comm *rp_world_comm(rp_world *w, int rank) {
    return rank >= 0 && rank < w->size ? &w->comms[rank] : NULL;
}

rp_comm *rp_world_subcomm(rp_world *w, const int *members, int n, int me) {
    rp_comm *c = calloc(1, sizeof *c);
    int *m = malloc(sizeof(int) * n);
    if (!c || !m) {
        free(c), free(m);
        return NULL;
    }
    memcpy(m, members, sizeof(int) * n);
    *c = (rp_comm){RP_BACKEND_LOCAL, me, n, w, m, false, NULL};
    return c;
}

void rp_world_free(rp_world *w) {
    if (!w)
        return;
    for (sync_obj *s = w->syncs, *n; s; s = n) {
        n = s->next;
        free(s->members), free(s->ptr), free(s->ints), free(s);
    }
    pthread_mutex_destroy(&w->mu);
    for (int r = 0; r < w->size; r++)
        pthread_cond_destroy(&w->wake[r]);
    free(w->wake), free(w->comms), free(w->identity), free(w);
}

/* Before sleeping on the condition variable a waiter spins briefly
** (RP_SPIN_LIMIT): a message or a barrier that completes within
** microseconds, the usual case when every worker has its own core, then
** costs no wake-up. */

/* Spins, with the world's mutex released, until *flag differs from `from`
** or the world fails; returns with the mutex held again. */
static void spin_unlocked(rp_world *w, const unsigned long *flag, unsigned long from) {
    if (!w->spin) /* oversubscribed: a spinning waiter would slow the workers it waits for */
        return;
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < RP_SPIN_LIMIT; i++) {
        if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != from ||
            __atomic_load_n(&w->failed, __ATOMIC_ACQUIRE))
            break;
        rp_cpu_relax();
    }
    pthread_mutex_lock(&w->mu);
}

static rp_status aborted(rp_world *w, rp_error *err) {
    return rp_fail(err, RP_ERR_ABORTED, "%s", w->msg);
}

void rpi_local_fail(rp_comm *c, const char *msg) {
    rp_world *w = c->world;
    pthread_mutex_lock(&w->mu);
    if (!w->failed) {
        __atomic_store_n(&w->failed, true, __ATOMIC_RELEASE);
        snprintf(w->msg, sizeof w->msg, "worker %d failed: %s", c->members[c->rank], msg);
    }
    for (int r = 0; r < w->size; r++)
        pthread_cond_broadcast(&w->wake[r]);
    pthread_mutex_unlock(&w->mu);
}

/* The sync object of a member set (world ranks); created on first use.
** Called with the world's mutex held. */
static sync_obj *find_sync(rp_world *w, const int *members, int g) {
    for (sync_obj *s = w->syncs; s; s = s->next)
        if (s->g == g && memcmp(s->members, members, sizeof(int) * g) == 0)
            return s;
    sync_obj *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->g = g;
    s->members = malloc(sizeof(int) * g);
    s->ptr = calloc(g, sizeof(void *));
    s->ints = calloc(2 * (size_t)g, sizeof(int));
    if (!s->members || !s->ptr || !s->ints) {
        free(s->members), free(s->ptr), free(s->ints), free(s);
        return NULL;
    }
    memcpy(s->members, members, sizeof(int) * g);
    s->next = w->syncs;
    w->syncs = s;
    return s;
}

/* Barrier of the sync's members, for its member `index`; mutex held. */
static rp_status arrive(rp_world *w, sync_obj *s, int index) {
    unsigned long gen = s->gen;
    if (++s->count == s->g) {
        s->count = 0;
        __atomic_store_n(&s->gen, gen + 1, __ATOMIC_RELEASE);
        for (int i = 0; i < s->g; i++)
            pthread_cond_broadcast(&w->wake[s->members[i]]);
    } else {
        spin_unlocked(w, &s->gen, gen);
        while (s->gen == gen && !w->failed)
            pthread_cond_wait(&w->wake[s->members[index]], &w->mu);
    }
    return w->failed ? RP_ERR_ABORTED : RP_OK;
}

/* A member's view of one collective call. */
typedef struct group_call {
    rp_world *w;
    sync_obj *s;
    int g, index;
} group_call;

/* Finds the group of c's rank under g, publishes ptr and waits for all. */
static rp_status enter(rp_comm *c, const rp_grouping *g, const void *ptr, group_call *gc,
                       rp_error *err) {
    rp_world *w = c->world;
    int local[RP_MAX_WORKERS], world[RP_MAX_WORKERS];
    gc->w = w;
    gc->g = comm_group(c, g, c->rank, local, &gc->index);
    for (int i = 0; i < gc->g; i++)
        world[i] = c->members[local[i]];
    pthread_mutex_lock(&w->mu);
    if (w->failed) {
        pthread_mutex_unlock(&w->mu);
        return aborted(w, err);
    }
    gc->s = find_sync(w, world, gc->g);
    if (!gc->s) {
        pthread_mutex_unlock(&w->mu);
        rpi_local_fail(c, "out of memory in a collective");
        return rp_fail(err, RP_ERR_NOMEM, "out of memory in a collective");
    }
    gc->s->ptr[gc->index] = ptr;
    rp_status st = arrive(w, gc->s, gc->index);
    pthread_mutex_unlock(&w->mu);
    return st ? aborted(w, err) : RP_OK;
}

static rp_status step(group_call *gc, rp_error *err) {
    pthread_mutex_lock(&gc->w->mu);
    rp_status st = arrive(gc->w, gc->s, gc->index);
    pthread_mutex_unlock(&gc->w->mu);
    return st ? aborted(gc->w, err) : RP_OK;
}

/* acc[0, n) = p_0[at + x] + p_1[at + x] + ..., in member order. */
static void sum_block(const void **ptrs, int g, size_t at, size_t n, float *acc) {
    const float *p0 = (const float *)ptrs[0] + at;
    for (size_t x = 0; x < n; x++)
        acc[x] = p0[x];
    for (int j = 1; j < g; j++) {
        const float *pj = (const float *)ptrs[j] + at;
        for (size_t x = 0; x < n; x++)
            acc[x] += pj[x];
    }
}

enum { SUM_BLOCK = 2048 };

/* Sums elements [from, to) of the members' buffers in member order
** (p_0 + p_1 + ...) and writes the sum to every destination (dsts[j] + x
** for x in the range; dsts may be the sources). Blocks go through a stack
** buffer, so the sources are all read before any of them is written. */
static void sum_members(const void **ptrs, int g, size_t from, size_t to, float *const *dsts,
                        int ndst, size_t dst_base) {
    float acc[SUM_BLOCK];
    for (size_t b = from; b < to; b += SUM_BLOCK) {
        size_t n = to - b < SUM_BLOCK ? to - b : SUM_BLOCK;
        sum_block(ptrs, g, b, n, acc);
        for (int d = 0; d < ndst; d++)
            memcpy(dsts[d] + (b - dst_base), acc, sizeof(float) * n);
    }
}

/* Member i alone touches chunk i of every buffer: it sums the chunk over
** all members and writes the sum into all of them. Two barriers: enter
** (every buffer published) and leave (every chunk written). */
rp_status rpi_local_allreduce(rp_comm *c, const rp_grouping *g, float *buf, size_t n,
                          rp_error *err) {
    group_call gc;
    rp_status st = enter(c, g, buf, &gc, err);
    if (st || gc.g == 1)
        return st;
    size_t k = (n + gc.g - 1) / gc.g;
    size_t from = gc.index * k < n ? gc.index * k : n, to = from + k < n ? from + k : n;
    float *dsts[RP_MAX_WORKERS];
    for (int j = 0; j < gc.g; j++)
        dsts[j] = (float *)gc.s->ptr[j];
    sum_members(gc.s->ptr, gc.g, from, to, dsts, gc.g, 0);
    return step(&gc, err);
}

/* fp16 exchange: each member publishes its values as halves; member i sums
** chunk i of every member's halves in fp32, in member order, and writes the
** sum, rounded to half, back into every member's halves; then each member
** reads its own. Half the bytes of the fp32 allreduce cross between cores. */
rp_status rpi_local_allreduce_half(rp_comm *c, const rp_grouping *g, float *buf, uint16_t *stage,
                               size_t n, rp_error *err) {
    rp_half_encode(buf, stage, n);
    group_call gc;
    rp_status st = enter(c, g, stage, &gc, err);
    if (st)
        return st;
    if (gc.g > 1) {
        size_t k = (n + gc.g - 1) / gc.g;
        size_t from = gc.index * k < n ? gc.index * k : n, to = from + k < n ? from + k : n;
        const uint16_t *const *src = (const uint16_t *const *)gc.s->ptr;
        float acc[256], t[256];
        uint16_t h[256];
        for (size_t at = from; at < to; at += 256) { /* blocks of the chunk */
            size_t len = to - at < 256 ? to - at : 256;
            rp_half_decode(src[0] + at, acc, len);
            for (int j = 1; j < gc.g; j++) {
                rp_half_decode(src[j] + at, t, len);
                for (size_t i = 0; i < len; i++)
                    acc[i] += t[i];
            }
            rp_half_encode(acc, h, len);
            for (int j = 0; j < gc.g; j++)
                memcpy((uint16_t *)gc.s->ptr[j] + at, h, sizeof(uint16_t) * len);
        }
        if ((st = step(&gc, err)))
            return st;
    }
    rp_half_decode(stage, buf, n);
    return RP_OK;
}

rp_status rpi_local_reduce_scatter(rp_comm *c, const rp_grouping *g, const float *in, size_t n,
                               float *out, rp_error *err) {
    group_call gc;
    rp_status st = enter(c, g, in, &gc, err);
    if (st)
        return st;
    size_t k = (n + gc.g - 1) / gc.g;
    size_t from = gc.index * k < n ? gc.index * k : n, to = from + k < n ? from + k : n;
    sum_members(gc.s->ptr, gc.g, from, to, &out, 1, from);
    memset(out + (to - from), 0, sizeof(float) * (k - (to - from)));
    return gc.g == 1 ? RP_OK : step(&gc, err);
}

/* Every member's input published, member i copies k floats of each member
** j's to out + j k: from the start of j's input (the all-gather; its own
** block skipped where it already lies in out) or from block i of it (the
** all-to-all). The second arrival keeps every input alive until all have
** copied. */
static rp_status copy_blocks(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                             float *out, bool own_block, rp_error *err) {
    group_call gc;
    rp_status st = enter(c, g, in, &gc, err);
    if (st)
        return st;
    for (int j = 0; j < gc.g; j++) {
        const float *src = (const float *)gc.s->ptr[j] + (own_block ? (size_t)gc.index * k : 0);
        if (out + j * k != src) /* in place: a member's own block is its input */
            memcpy(out + j * k, src, sizeof(float) * k);
    }
    return gc.g == 1 ? RP_OK : step(&gc, err);
}

rp_status rpi_local_allgather(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                          float *out, rp_error *err) {
    return copy_blocks(c, g, in, k, out, false, err);
}

rp_status rpi_local_alltoall(rp_comm *c, const rp_grouping *g, const float *in, size_t k,
                             float *out, rp_error *err) {
    return copy_blocks(c, g, in, k, out, true, err);
}

/* Member i sums its chunk block by block, as the allreduce does, and hands
** each block's sum to update, which writes the member's own parameters while
** the block is in L1. After a barrier it copies the other chunks' new values
** from their owners. A core thus reads the others' memory and never writes
** it: pushing the values instead left the lines in the wrong cache, and the
** next forward pass paid for them. */
typedef struct update_bufs {
    float *grads, *params;
} update_bufs;

rp_status rpi_local_reduce_update(rp_comm *c, const rp_grouping *g, float *grads, float *params,
                              size_t n, rp_update_fn update, void *ctx, rp_error *err) {
    update_bufs mine = {grads, params};
    group_call gc;
    rp_status st = enter(c, g, &mine, &gc, err);
    if (st)
        return st;
    size_t k = (n + gc.g - 1) / gc.g;
    size_t from = gc.index * k < n ? gc.index * k : n, to = from + k < n ? from + k : n;
    const void *src[RP_MAX_WORKERS];
    for (int j = 0; j < gc.g; j++)
        src[j] = ((const update_bufs *)gc.s->ptr[j])->grads;
    float acc[SUM_BLOCK];
    for (size_t b = from; b < to; b += SUM_BLOCK) {
        size_t len = to - b < SUM_BLOCK ? to - b : SUM_BLOCK;
        sum_block(src, gc.g, b, len, acc);
        update(ctx, b, acc, len);
    }
    if (gc.g == 1)
        return RP_OK;
    if ((st = step(&gc, err)))
        return st;
    for (int j = 0; j < gc.g; j++) {
        size_t f = j * k < n ? j * k : n, t = f + k < n ? f + k : n;
        if (j != gc.index)
            memcpy(params + f, ((const update_bufs *)gc.s->ptr[j])->params + f,
                   sizeof(float) * (t - f));
    }
    return step(&gc, err);
}

rp_status rpi_local_broadcast(rp_comm *c, const rp_grouping *g, float *buf, size_t n, int root,
                          rp_error *err) {
    group_call gc;
    rp_status st = enter(c, g, buf, &gc, err);
    if (st || gc.g == 1)
        return st;
    if (gc.index != root)
        memcpy(buf, gc.s->ptr[root], sizeof(float) * n);
    return step(&gc, err);
}

rp_status rpi_local_barrier(rp_comm *c, rp_error *err) {
    group_call gc;
    return enter(c, NULL, NULL, &gc, err);
}

rp_status rpi_local_split(rp_comm *c, int color, int key, rp_comm **out, rp_error *err) {
    group_call gc;
    int mine[2] = {color, key};
    rp_status st = enter(c, NULL, mine, &gc, err);
    if (st)
        return st;
    /* members with my color, ordered by (key, rank) */
    int *members = malloc(sizeof(int) * c->size), n = 0, me = 0;
    rp_comm *nc = calloc(1, sizeof *nc);
    if (!members || !nc) {
        free(members), free(nc);
        rpi_local_fail(c, "out of memory in split");
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    for (int r = 0; r < c->size; r++) {
        const int *p = gc.s->ptr[r];
        if (p[0] != color)
            continue;
        int at = n++;
        while (at > 0) { /* insertion by (key, rank) */
            const int *q = gc.s->ptr[members[at - 1]];
            if (q[1] < p[1] || (q[1] == p[1] && members[at - 1] < r))
                break;
            members[at] = members[at - 1];
            at--;
        }
        members[at] = r;
    }
    for (int i = 0; i < n; i++) {
        if (members[i] == c->rank)
            me = i;
        members[i] = c->members[members[i]]; /* to world ranks */
    }
    *nc = (rp_comm){RP_BACKEND_LOCAL, me, n, c->world, members, false, NULL};
    if ((st = step(&gc, err))) {
        free(members), free(nc);
        return st;
    }
    *out = nc;
    return RP_OK;
}

void rpi_local_free(rp_comm *c) {
    free(c->members);
    free(c);
}

/* ---- point to point ----------------------------------------------------------- */

static lreq **list_of(rp_world *w, bool sends) { return sends ? &w->sends : &w->recvs; }

/* Takes the first request of the other kind matching (src, dst, tag). */
static lreq *take_match(rp_world *w, bool want_send, int src, int dst, int tag) {
    for (lreq **p = list_of(w, want_send); *p; p = &(*p)->next)
        if ((*p)->src == src && (*p)->dst == dst && (*p)->tag == tag) {
            lreq *r = *p;
            *p = r->next;
            return r;
        }
    return NULL;
}

static rp_status post(rp_comm *c, bool is_send, int peer, int tag, void *buf, size_t bytes,
                      rp_request *out, rp_error *err) {
    rp_world *w = c->world;
    if (peer < 0 || peer >= c->size || tag < 0)
        return rp_fail(err, RP_ERR_INVALID, "%s: rank %d or tag %d out of range (size %d)",
                       is_send ? "send" : "receive", peer, tag, c->size);
    lreq *r = (lreq *)out->opaque;
    int me = c->members[c->rank], other = c->members[peer];
    *r = (lreq){is_send ? me : other, is_send ? other : me, tag, buf, bytes, is_send, false, 0,
                RP_OK, NULL};
    pthread_mutex_lock(&w->mu);
    if (w->failed) {
        pthread_mutex_unlock(&w->mu);
        return aborted(w, err);
    }
    lreq *m = take_match(w, !is_send, r->src, r->dst, tag);
    if (!m) {
        lreq **tail = list_of(w, is_send);
        while (*tail)
            tail = &(*tail)->next;
        *tail = r;
        pthread_mutex_unlock(&w->mu);
        return RP_OK;
    }
    /* matched: copy outside the lock; the peer waits until done */
    m->matched = r->matched = true;
    pthread_mutex_unlock(&w->mu);
    lreq *snd = is_send ? r : m, *rcv = is_send ? m : r;
    rp_status st = RP_OK;
    if (snd->bytes != rcv->bytes)
        st = RP_ERR_INVALID;
    else if (snd->bytes)
        memcpy(rcv->buf, snd->buf, snd->bytes);
    pthread_mutex_lock(&w->mu);
    m->status = r->status = st;
    __atomic_store_n(&m->done, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&w->wake[r->src]);
    pthread_cond_broadcast(&w->wake[r->dst]);
    pthread_mutex_unlock(&w->mu);
    return RP_OK;
}

rp_status rpi_local_isend(rp_comm *c, int dst, int tag, const void *buf, size_t bytes,
                      rp_request *req, rp_error *err) {
    return post(c, true, dst, tag, (void *)buf, bytes, req, err);
}

rp_status rpi_local_irecv(rp_comm *c, int src, int tag, void *buf, size_t bytes, rp_request *req,
                      rp_error *err) {
    return post(c, false, src, tag, buf, bytes, req, err);
}

rp_status rpi_local_wait(rp_comm *c, rp_request *req, rp_error *err) {
    rp_world *w = c->world;
    lreq *r = (lreq *)req->opaque;
    pthread_cond_t *wake = &w->wake[r->is_send ? r->src : r->dst];
    pthread_mutex_lock(&w->mu);
    if (!r->done)
        spin_unlocked(w, &r->done, 0);
    while (!r->done && !w->failed)
        pthread_cond_wait(wake, &w->mu);
    bool done = r->done;
    if (!done) {
        /* unlink, so that no late match writes into a buffer the caller
        ** may free */
        for (lreq **p = list_of(w, r->is_send); *p; p = &(*p)->next)
            if (*p == r) {
                *p = r->next;
                break;
            }
        /* a match in progress copies outside the lock: let it finish */
        while (r->matched && !r->done)
            pthread_cond_wait(wake, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    if (!done)
        return aborted(w, err);
    if (r->status)
        return rp_fail(err, r->status,
                       "message from worker %d to %d, tag %d: sizes differ between the send and "
                       "the receive",
                       r->src, r->dst, r->tag);
    return RP_OK;
}

/* A request that is over before it is waited for (a collective the local
** backend finished at once). */
void rpi_local_done(rp_request *req) {
    lreq *r = (lreq *)req->opaque;
    memset(r, 0, sizeof *r);
    r->done = 1;
}

rp_status rpi_local_test(rp_comm *c, rp_request *req, bool *done, rp_error *err) {
    rp_world *w = c->world;
    const lreq *r = (const lreq *)req->opaque;
    pthread_mutex_lock(&w->mu);
    *done = r->done != 0;
    bool failed = w->failed;
    pthread_mutex_unlock(&w->mu);
    if (*done)
        return rpi_local_wait(c, req, err);
    return failed ? aborted(w, err) : RP_OK;
}
