/*
** Antichain DAG construction.
**
** The profile graph is first reduced as PipeDream reduces it: sources whose
** description starts with "Input" are removed (their work is zeroed and they
** are placed in stage 0), then sinks whose description starts with
** "__getitem__". From the first remaining source, antichains are explored
** breadth first; each antichain is augmented with the predecessors whose
** outputs leave the antichain's own past, and its successors replace one
** node of the augmented set by an out-neighbour.
**
** Where PipeDream iterates a Python set (the extra nodes of an augmented
** antichain), repipe uses ascending node order. This only changes the
** numbering of states on branchy graphs, never the set of states, their
** sizes or the DAG; on chains the numbering is identical.
*/
#include "antichain.h"
#include "antichain_graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Growable int array. */
typedef struct ivec {
    int *v;
    int n, cap;
} ivec;

/* Doubles a's room. */
static bool iv_grow(ivec *a) {
    int cap = a->cap ? a->cap * 2 : 16;
    int *nv = realloc(a->v, sizeof(int) * cap);
    if (!nv)
        return false;
    a->v = nv;
    a->cap = cap;
    return true;
}

static inline bool iv_push(ivec *a, int x) {
    if (a->n == a->cap && !iv_grow(a))
        return false;
    a->v[a->n++] = x;
    return true;
}


/* One explored antichain. */
typedef struct achain {
    int key_off, key_len; /* sorted node list in the key arena */
    int aug_off, aug_len; /* augmented list (extra nodes, then antichain) */
    int list_off;         /* antichain in discovery order (key_len nodes) */
    ivec succ;            /* DAG out-edges, in insertion order */
    bool expanded;
} achain;

typedef struct builder {
    graph g;
    ivec arena;
    achain *ac;
    int nac, cap;
    int *table; /* open addressing: antichain index + 1 */
    int tcap;
    word *scratch; /* one bitset */
    word *cbits, *taken; /* two more, all zero between uses */
} builder;

/* Antichains hold a few nodes: insertion sort beats qsort's calls. */
static void sort_ints(int *v, int n) {
    for (int i = 1; i < n; i++) {
        int x = v[i], j = i - 1;
        for (; j >= 0 && v[j] > x; j--)
            v[j + 1] = v[j];
        v[j + 1] = x;
    }
}


static unsigned long hash_ints(const int *v, int n) {
    unsigned long h = 1469598103934665603ul;
    for (int i = 0; i < n; i++)
        h = (h ^ (unsigned long)v[i]) * 1099511628211ul;
    return h;
}


/* Looks up the antichain with this sorted node list; -1 if unknown. */
static int find_chain(builder *b, const int *key, int len, unsigned long h) {
    for (unsigned long s = h % b->tcap;; s = (s + 1) % b->tcap) {
        int v = b->table[s];
        if (!v)
            return -1;
        achain *a = &b->ac[v - 1];
        if (a->key_len == len && memcmp(b->arena.v + a->key_off, key, sizeof(int) * len) == 0)
            return v - 1;
    }
}

static bool grow_table(builder *b) {
    int ncap = b->tcap ? b->tcap * 2 + 1 : 1021;
    int *nt = calloc(ncap, sizeof(int));
    if (!nt)
        return false;
    for (int i = 0; i < b->nac; i++) {
        achain *a = &b->ac[i];
        unsigned long s = hash_ints(b->arena.v + a->key_off, a->key_len) % ncap;
        while (nt[s])
            s = (s + 1) % ncap;
        nt[s] = i + 1;
    }
    free(b->table);
    b->table = nt;
    b->tcap = ncap;
    return true;
}

/* Registers a new antichain given in discovery order; computes its
** augmented list. Returns its index or -1 when out of memory. */
static int add_chain(builder *b, const int *list, int len) {
    if (b->nac == b->cap) {
        int cap = b->cap ? b->cap * 2 : 64;
        achain *na = realloc(b->ac, sizeof(achain) * cap);
        if (!na)
            return -1;
        b->ac = na;
        b->cap = cap;
    }
    if ((b->nac + 1) * 2 > b->tcap && !grow_table(b))
        return -1;
    graph *g = &b->g;
    achain a = {0};
    a.list_off = b->arena.n;
    for (int i = 0; i < len; i++)
        if (!iv_push(&b->arena, list[i]))
            return -1;
    a.key_off = b->arena.n;
    a.key_len = len;
    for (int i = 0; i < len; i++)
        if (!iv_push(&b->arena, list[i]))
            return -1;
    sort_ints(b->arena.v + a.key_off, len);
    /* Extra nodes: those of graph.extra of its nodes. */
    word *extra = b->scratch;
    memset(extra, 0, sizeof(word) * g->nw);
    for (int i = 0; i < len; i++) {
        const word *ex = g->extra + (size_t)b->arena.v[a.list_off + i] * g->nw;
        for (int w = 0; w < g->nw; w++)
            extra[w] |= ex[w];
    }
    a.aug_off = b->arena.n;
    for (int w = 0; w < g->nw; w++)
        for (word bits = extra[w]; bits; bits &= bits - 1)
            if (!iv_push(&b->arena, w * 64 + __builtin_ctzll(bits)))
                return -1;
    for (int i = 0; i < len; i++)
        if (!iv_push(&b->arena, b->arena.v[a.list_off + i]))
            return -1;
    a.aug_len = b->arena.n - a.aug_off;
    b->ac[b->nac] = a;
    unsigned long s = hash_ints(b->arena.v + a.key_off, len) % b->tcap;
    while (b->table[s])
        s = (s + 1) % b->tcap;
    b->table[s] = b->nac + 1;
    return b->nac++;
}

/* The explorer's scratch: the queue of antichains, a candidate and its
** key, and which antichains dag_order holds. */
typedef struct walk {
    ivec queue, cand, keybuf, sorted;
    unsigned char *in_order;
    int in_order_cap;
} walk;

/* The antichain that antichain ai becomes with x replaced by its successor
** y, its nodes that precede another dropped, as a key in k->keybuf (and
** sorted in k->sorted): 1; 0 where y cannot join (it is in the antichain,
** or one of its successors is); -1 out of memory. */
static int next_key(builder *b, walk *k, int ai, int x, int y) {
    const graph *g = &b->g;
    const achain *a = &b->ac[ai];
    const int *key = b->arena.v + a->key_off;
    for (int i = 0; i < a->key_len && key[i] <= y; i++)
        if (key[i] == y)
            return 0; /* already in the antichain */
    const word *sy = g->succ + (size_t)y * g->nw;
    const int *aug = b->arena.v + a->aug_off;
    for (int i = 0; i < a->aug_len; i++)
        if (BIT_GET(sy, aug[i]))
            return 0;
    k->cand.n = 0;
    for (int i = 0; i < a->aug_len; i++)
        if (!iv_push(&k->cand, aug[i] == x ? y : aug[i]))
            return -1;
    k->keybuf.n = 0;
    word *cbits = b->cbits, *taken = b->taken;
    const ivec *cand = &k->cand;
    for (int i = 0; i < cand->n; i++)
        BIT_SET(cbits, cand->v[i]);
    for (int i = 0; i < cand->n; i++) {
        int u = cand->v[i];
        const word *su = g->succ + (size_t)u * g->nw;
        bool drop = false;
        for (int w = 0; w < g->nw && !drop; w++)
            drop = (su[w] & cbits[w]) != 0;
        if (!drop && !BIT_GET(taken, u)) {
            BIT_SET(taken, u);
            if (!iv_push(&k->keybuf, u))
                return -1;
        }
    }
    for (int i = 0; i < cand->n; i++) { /* zero again, by the bits set */
        cbits[cand->v[i] >> 6] = 0;
        taken[cand->v[i] >> 6] = 0;
    }
    k->sorted.n = 0;
    for (int i = 0; i < k->keybuf.n; i++)
        if (!iv_push(&k->sorted, k->keybuf.v[i]))
            return -1;
    sort_ints(k->sorted.v, k->keybuf.n);
    return 1;
}

/* The edge ai -> bi: bi queued, both ends in dag_order at their first
** appearance. False: out of memory. */
static bool add_dag_edge(builder *b, walk *k, int ai, int bi, ivec *dag_order) {
    if (!iv_push(&b->ac[ai].succ, bi) || !iv_push(&k->queue, bi))
        return false;
    if (b->nac > k->in_order_cap) {
        int ncap = b->nac * 2;
        unsigned char *n2 = realloc(k->in_order, ncap);
        if (!n2)
            return false;
        memset(n2 + k->in_order_cap, 0, ncap - k->in_order_cap);
        k->in_order = n2;
        k->in_order_cap = ncap;
    }
    int ends[2] = {ai, bi};
    for (int e = 0; e < 2; e++)
        if (!k->in_order[ends[e]]) {
            k->in_order[ends[e]] = 1;
            if (!iv_push(dag_order, ends[e]))
                return false;
        }
    return true;
}

/* Explores the antichain DAG breadth first from `first`. dag_order gets the
** antichains in the order they first appear in an edge. */
static rp_status explore(builder *b, int first, int max_states, ivec *dag_order,
                         rp_error *err) {
    const graph *g = &b->g;
    walk k = {0};
    rp_status s = RP_OK;
    bool oom = add_chain(b, &first, 1) < 0 || !iv_push(&k.queue, 0);
    for (int head = 0; !oom && !s && head < k.queue.n; head++) {
        int ai = k.queue.v[head];
        if (b->ac[ai].expanded)
            continue;
        b->ac[ai].expanded = true;
        int aug_len = b->ac[ai].aug_len;
        for (int xi = 0; !oom && !s && xi < aug_len; xi++) {
            int x = b->arena.v[b->ac[ai].aug_off + xi];
            for (int e = g->out_start[x]; !oom && !s && e < g->out_start[x + 1]; e++) {
                int got = next_key(b, &k, ai, x, g->out[e]), len = k.keybuf.n;
                if (got <= 0) {
                    oom = got < 0;
                    continue;
                }
                int bi = find_chain(b, k.sorted.v, len, hash_ints(k.sorted.v, len));
                if (bi < 0 && max_states && b->nac >= max_states)
                    s = rp_fail(err, RP_ERR_INFEASIBLE, "the antichain DAG has more than %d "
                                "states", max_states);
                else if (bi < 0 && (bi = add_chain(b, k.keybuf.v, len)) < 0)
                    oom = true;
                else
                    oom = !add_dag_edge(b, &k, ai, bi, dag_order);
            }
        }
    }
    if (!oom && !s && dag_order->n == 0) /* a single state */
        oom = !iv_push(dag_order, 0);
    if (oom)
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory while building the antichain DAG");
    free(k.queue.v), free(k.cand.v), free(k.keybuf.v), free(k.sorted.v), free(k.in_order);
    return s;
}

/* A state and its cumulative compute: descending compute, ties by
** descending state. */
typedef struct by_compute {
    double c;
    int s;
} by_compute;

static int cmp_compute_desc(const void *a, const void *b) {
    const by_compute *x = a, *y = b;
    if (x->c != y->c)
        return x->c > y->c ? -1 : 1;
    return (x->s < y->s) - (x->s > y->s);
}

void rp_states_free(rp_states *s) {
    free(s->compute), free(s->activation), free(s->parameter), free(s->out_activation);
    free(s->pred_all);
    free(s->pred), free(s->num_pred), free(s->covers), free(s->input_source);
    memset(s, 0, sizeof *s);
}

/* Depth-first topological sort of the antichains over their out-edges in
** insertion order, from the roots in dag_order; the reverse finishing order
** numbers the states: topo[state] is its antichain, pos[antichain] its
** state. */
static rp_status sort_states(const builder *b, const ivec *dag_order, int *topo, int *pos,
                             rp_error *err) {
    int N = b->nac;
    int *stack = malloc(sizeof(int) * N), *edge_at = calloc(N, sizeof(int));
    unsigned char *mark = calloc(N, 1);
    if (!stack || !edge_at || !mark) {
        free(stack), free(edge_at), free(mark);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    int done_n = 0;
    for (int r = 0; r < dag_order->n; r++) {
        int root = dag_order->v[r];
        if (mark[root])
            continue;
        int sp = 0;
        stack[sp++] = root;
        mark[root] = 1;
        while (sp) {
            int u = stack[sp - 1];
            if (edge_at[u] < b->ac[u].succ.n) {
                int v = b->ac[u].succ.v[edge_at[u]++];
                if (!mark[v]) {
                    mark[v] = 1;
                    stack[sp++] = v;
                }
            } else {
                topo[N - 1 - done_n++] = u;
                sp--;
            }
        }
    }
    free(stack), free(edge_at), free(mark);
    for (int i = 0; i < N; i++) /* every antichain is reachable: done_n == nac */
        pos[topo[i]] = i;
    return RP_OK;
}

/* Each state's cover (the nodes at or before it) and its sums: compute,
** activations, parameters, and the activations leaving it. */
static void state_sums(const rp_profile *p, const builder *b, const int *topo, rp_states *st) {
    const graph *g = &b->g;
    for (int si = 0; si < st->n; si++) {
        const achain *a = &b->ac[topo[si]];
        word *cov = st->covers + (size_t)si * g->nw;
        for (int i = 0; i < a->aug_len; i++) {
            int x = b->arena.v[a->aug_off + i];
            const word *px = g->pred + (size_t)x * g->nw;
            for (int w = 0; w < g->nw; w++)
                cov[w] |= px[w];
            BIT_SET(cov, x);
            st->out_activation[si] += p->nodes[x].activation_bytes;
        }
        for (int w = 0; w < g->nw; w++)
            for (word bits = cov[w]; bits; bits &= bits - 1) {
                const rp_profile_node *nd = &p->nodes[w * 64 + __builtin_ctzll(bits)];
                st->compute[si] += (nd->forward_ms + nd->backward_ms) / 1000.0;
                st->activation[si] += nd->activation_bytes;
                st->parameter[si] += nd->parameter_bytes;
            }
    }
}

/* Each state's predecessors by descending cumulative compute, ties by
** descending state, the order the planner scans split points in. The
** states are ranked in that order once; each state's transitive
** predecessors are then a bitset over ranks (spred), filled from the first
** state on (the numbering is topological), so that its list is its bits in
** ascending order, written in one sweep. */
static rp_status predecessors(const builder *b, const int *topo, const int *pos, word *spred,
                              rp_states *st, rp_error *err) {
    int N = st->n, swords = (N + 63) / 64;
    by_compute *order = malloc(sizeof(by_compute) * N);
    int *rank = malloc(sizeof(int) * N);
    if (!order || !rank) {
        free(order), free(rank);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    for (int si = 0; si < N; si++)
        order[si] = (by_compute){st->compute[si], si};
    qsort(order, N, sizeof *order, cmp_compute_desc);
    for (int r = 0; r < N; r++)
        rank[order[r].s] = r;
    for (int si = 0; si < N; si++) {
        const achain *a = &b->ac[topo[si]];
        const word *ps = spred + (size_t)si * swords;
        for (int e = 0; e < a->succ.n; e++) {
            word *pt = spred + (size_t)pos[a->succ.v[e]] * swords;
            for (int w = 0; w < swords; w++)
                pt[w] |= ps[w];
            BIT_SET(pt, rank[si]);
        }
    }
    size_t total = 0;
    for (int si = 0; si < N; si++) {
        const word *ps = spred + (size_t)si * swords;
        int c = 0;
        for (int w = 0; w < swords; w++)
            c += __builtin_popcountll(ps[w]);
        st->num_pred[si] = c;
        total += (size_t)c;
    }
    st->pred_all = malloc(sizeof(int) * (total ? total : 1));
    if (!st->pred_all) {
        free(order), free(rank);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory: %zu predecessors of %d states", total,
                       N);
    }
    int *at = st->pred_all;
    for (int si = 0; si < N; si++) {
        const word *ps = spred + (size_t)si * swords;
        st->pred[si] = at;
        for (int w = 0; w < swords; w++)
            for (word bits = ps[w]; bits; bits &= bits - 1)
                *at++ = order[w * 64 + __builtin_ctzll(bits)].s;
    }
    free(order), free(rank);
    return RP_OK;
}

/* The states of a profile, in the steps above: the reduced graph, its
** antichains explored from the first source, numbered topologically, each
** with its sums and its predecessors in the planner's order. */
rp_status rp_states_build(const rp_profile *p, int max_states, rp_states *st, rp_error *err) {
    memset(st, 0, sizeof *st);
    builder b = {0};
    ivec dag_order = {0};
    int *topo = NULL, *pos = NULL, first;
    word *spred = NULL; /* transitive predecessors of each state, by rank */
    st->input_source = calloc(p->num_nodes, 1);
    if (!st->input_source)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    rp_status s = rpi_graph_build(p, &b.g, st->input_source, err);
    if (!s) {
        b.scratch = calloc(b.g.nw, sizeof(word));
        b.cbits = calloc(b.g.nw, sizeof(word));
        b.taken = calloc(b.g.nw, sizeof(word));
        if (!b.scratch || !b.cbits || !b.taken)
            s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    if (!s)
        s = rpi_graph_first_source(p, &b.g, &first, err);
    if (!s)
        s = explore(&b, first, max_states, &dag_order, err);
    int N = b.nac;
    if (!s) {
        topo = malloc(sizeof(int) * N);
        pos = malloc(sizeof(int) * N);
        s = topo && pos ? sort_states(&b, &dag_order, topo, pos, err)
                        : rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    if (!s) {
        st->n = N;
        st->nwords = b.g.nw;
        st->compute = calloc(N, sizeof(double));
        st->activation = calloc(N, sizeof(double));
        st->parameter = calloc(N, sizeof(double));
        st->out_activation = calloc(N, sizeof(double));
        st->covers = calloc((size_t)N * b.g.nw, sizeof(word));
        st->pred = calloc(N, sizeof(int *));
        st->num_pred = calloc(N, sizeof(int));
        spred = calloc((size_t)N * ((N + 63) / 64), sizeof(word));
        if (!st->compute || !st->activation || !st->parameter || !st->out_activation ||
            !st->covers || !st->pred || !st->num_pred || !spred)
            s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    if (!s) {
        state_sums(p, &b, topo, st);
        s = predecessors(&b, topo, pos, spred, st, err);
    }
    for (int i = 0; i < b.nac; i++)
        free(b.ac[i].succ.v);
    free(b.ac), free(b.table), free(b.scratch), free(b.cbits), free(b.taken), free(b.arena.v);
    free(dag_order.v);
    free(topo), free(pos), free(spred);
    rpi_graph_free(&b.g);
    if (s)
        rp_states_free(st);
    return s;
}
