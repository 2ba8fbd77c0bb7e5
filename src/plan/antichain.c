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

/* Explores the antichain DAG breadth first from `first`. dag_order gets the
** antichains in the order they first appear in an edge. */
static rp_status explore(builder *b, int first, int max_states, ivec *dag_order,
                         rp_error *err) {
    graph *g = &b->g;
    ivec queue = {0}, cand = {0}, keybuf = {0}, sorted = {0};
    unsigned char *in_order = NULL;
    int in_order_cap = 0;
    rp_status s = RP_OK;
    if (add_chain(b, &first, 1) < 0 || !iv_push(&queue, 0))
        goto oom;
    for (int head = 0; head < queue.n; head++) {
        int ai = queue.v[head];
        if (b->ac[ai].expanded)
            continue;
        b->ac[ai].expanded = true;
        int aug_len = b->ac[ai].aug_len;
        for (int xi = 0; xi < aug_len; xi++) {
            int x = b->arena.v[b->ac[ai].aug_off + xi];
            for (int k = g->out_start[x]; k < g->out_start[x + 1]; k++) {
                int y = g->out[k];
                const achain *a = &b->ac[ai];
                const int *key = b->arena.v + a->key_off;
                bool in = false;
                for (int i = 0; i < a->key_len && !in && key[i] <= y; i++)
                    in = key[i] == y;
                if (in)
                    continue; /* already in the antichain */
                /* y may join only if none of its successors is in the set */
                const word *sy = g->succ + (size_t)y * g->nw;
                const int *aug = b->arena.v + a->aug_off;
                bool ok = true;
                for (int i = 0; i < aug_len && ok; i++)
                    ok = !BIT_GET(sy, aug[i]);
                if (!ok)
                    continue;
                /* Replace x by y, then drop nodes that precede another. */
                cand.n = 0;
                for (int i = 0; i < aug_len; i++)
                    if (!iv_push(&cand, aug[i] == x ? y : aug[i]))
                        goto oom;
                keybuf.n = 0;
                word *cbits = b->cbits, *taken = b->taken;
                for (int i = 0; i < cand.n; i++)
                    BIT_SET(cbits, cand.v[i]);
                for (int i = 0; i < cand.n; i++) {
                    int u = cand.v[i];
                    const word *su = g->succ + (size_t)u * g->nw;
                    bool drop = false;
                    for (int w = 0; w < g->nw && !drop; w++)
                        drop = (su[w] & cbits[w]) != 0;
                    if (!drop && !BIT_GET(taken, u)) {
                        BIT_SET(taken, u);
                        if (!iv_push(&keybuf, u))
                            goto oom;
                    }
                }
                for (int i = 0; i < cand.n; i++) { /* zero again, by the bits set */
                    cbits[cand.v[i] >> 6] = 0;
                    taken[cand.v[i] >> 6] = 0;
                }
                int len = keybuf.n;
                sorted.n = 0;
                for (int i = 0; i < len; i++)
                    if (!iv_push(&sorted, keybuf.v[i]))
                        goto oom;
                sort_ints(sorted.v, len);
                int bi = find_chain(b, sorted.v, len, hash_ints(sorted.v, len));
                if (bi < 0 && max_states && b->nac >= max_states) {
                    s = rp_fail(err, RP_ERR_INFEASIBLE, "the antichain DAG has more than %d "
                                "states", max_states);
                    goto done;
                }
                if (bi < 0 && (bi = add_chain(b, keybuf.v, len)) < 0)
                    goto oom;
                if (!iv_push(&b->ac[ai].succ, bi) || !iv_push(&queue, bi))
                    goto oom;
                if (b->nac > in_order_cap) {
                    int ncap = b->nac * 2;
                    unsigned char *n2 = realloc(in_order, ncap);
                    if (!n2)
                        goto oom;
                    memset(n2 + in_order_cap, 0, ncap - in_order_cap);
                    in_order = n2;
                    in_order_cap = ncap;
                }
                int ends[2] = {ai, bi};
                for (int e = 0; e < 2; e++)
                    if (!in_order[ends[e]]) {
                        in_order[ends[e]] = 1;
                        if (!iv_push(dag_order, ends[e]))
                            goto oom;
                    }
            }
        }
    }
    if (dag_order->n == 0 && !iv_push(dag_order, 0)) /* a single state */
        goto oom;
    goto done;
oom:
    s = rp_fail(err, RP_ERR_NOMEM, "out of memory while building the antichain DAG");
done:
    free(queue.v), free(cand.v), free(keybuf.v), free(sorted.v), free(in_order);
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

rp_status rp_states_build(const rp_profile *p, int max_states, rp_states *st, rp_error *err) {
    memset(st, 0, sizeof *st);
    builder b = {0};
    ivec dag_order = {0};
    int *topo = NULL, *pos = NULL;
    word *spred = NULL; /* transitive predecessors of each state, by rank */
    rp_status s = RP_OK;
    st->input_source = calloc(p->num_nodes, 1);
    if (!st->input_source)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    if ((s = rpi_graph_build(p, &b.g, st->input_source, err)))
        goto done;
    graph *g = &b.g;
    b.scratch = calloc(g->nw, sizeof(word));
    b.cbits = calloc(g->nw, sizeof(word));
    b.taken = calloc(g->nw, sizeof(word));
    if (!b.scratch || !b.cbits || !b.taken) {
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    int first;
    if ((s = rpi_graph_first_source(p, g, &first, err)))
        goto done;
    if ((s = explore(&b, first, max_states, &dag_order, err)))
        goto done;

    /* Depth-first topological sort over nodes and out-edges in insertion
    ** order; the reverse finishing order numbers the states. */
    int N = b.nac;
    topo = malloc(sizeof(int) * N);
    pos = malloc(sizeof(int) * N);
    int *stack = malloc(sizeof(int) * N), *edge_at = calloc(N, sizeof(int));
    unsigned char *mark = calloc(N, 1);
    if (!topo || !pos || !stack || !edge_at || !mark) {
        free(stack), free(edge_at), free(mark);
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    int done_n = 0;
    for (int r = 0; r < dag_order.n; r++) {
        int root = dag_order.v[r];
        if (mark[root])
            continue;
        int sp = 0;
        stack[sp++] = root;
        mark[root] = 1;
        while (sp) {
            int u = stack[sp - 1];
            if (edge_at[u] < b.ac[u].succ.n) {
                int v = b.ac[u].succ.v[edge_at[u]++];
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
    N = done_n; /* every antichain is reachable, so done_n == nac */
    for (int i = 0; i < N; i++)
        pos[topo[i]] = i;

    st->n = N;
    st->nwords = g->nw;
    st->compute = calloc(N, sizeof(double));
    st->activation = calloc(N, sizeof(double));
    st->parameter = calloc(N, sizeof(double));
    st->out_activation = calloc(N, sizeof(double));
    st->covers = calloc((size_t)N * g->nw, sizeof(word));
    st->pred = calloc(N, sizeof(int *));
    st->num_pred = calloc(N, sizeof(int));
    int swords = (N + 63) / 64;
    spred = calloc((size_t)N * swords, sizeof(word));
    if (!st->compute || !st->activation || !st->parameter || !st->out_activation ||
        !st->covers || !st->pred || !st->num_pred || !spred) {
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int si = 0; si < N; si++) {
        const achain *a = &b.ac[topo[si]];
        word *cov = st->covers + (size_t)si * g->nw;
        for (int i = 0; i < a->aug_len; i++) {
            int x = b.arena.v[a->aug_off + i];
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
    /* Each state's predecessors by descending cumulative compute, ties by
    ** descending state, the order the planner scans split points in. The
    ** states are ranked in that order once; each state's transitive
    ** predecessors are then a bitset over ranks, filled from the first
    ** state on (the numbering is topological), so that its list is its
    ** bits in ascending order, written in one sweep. */
    by_compute *order = malloc(sizeof(by_compute) * N);
    int *rank = malloc(sizeof(int) * N);
    if (!order || !rank) {
        free(order), free(rank);
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int si = 0; si < N; si++)
        order[si] = (by_compute){st->compute[si], si};
    qsort(order, N, sizeof *order, cmp_compute_desc);
    for (int r = 0; r < N; r++)
        rank[order[r].s] = r;
    for (int si = 0; si < N; si++) {
        const achain *a = &b.ac[topo[si]];
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
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory: %zu predecessors of %d states", total, N);
        goto done;
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
done:
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
