/*
** PipeDream's branch compression, for graphs whose antichain DAG is too
** large to plan.
**
** Where a node forks, each branch that runs as a chain (one input, one
** output, node after node) until it rejoins is one node of the compressed
** graph, with the compute times and parameters of its nodes summed and the
** activation of its last. This is Graph.compress_branches of PipeDream's
** graph/graph.py, which PipeDream's README has users run on Inception and
** NASNet before its optimizer can plan them; repipe reproduces it step for
** step (the order it meets nodes in, the names it gives, the three decimals
** it writes times and parameters with), so that the graph planned is the
** graph PipeDream's optimizer reads from the compressed file. A branch's
** nodes then share their compressed node's stage.
*/
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "antichain.h"

/* A node of the compressed graph: one of the profile's (orig >= 0) or a
** branch made of several. */
typedef struct cnode {
    int orig;
    char id[32], desc[32];
    const char *named; /* a one-node branch keeps its node's description */
    double fwd, bwd, act, param;
} cnode;

typedef struct cgraph {
    cnode *nodes;
    int n;
    int *edge_from, *edge_to, ne; /* in the order they were added */
    int *handle_of;               /* per profile node: its cnode, or -1 */
} cgraph;

typedef struct adjacency {
    int *in_start, *in, *out_start, *out; /* the profile's, in edge order */
} adjacency;

static int indeg(const adjacency *a, int v) { return a->in_start[v + 1] - a->in_start[v]; }
static int outdeg(const adjacency *a, int v) { return a->out_start[v + 1] - a->out_start[v]; }

/* The cnode of profile node v, made when first met. */
static int orig_handle(cgraph *g, const rp_profile *p, int v) {
    if (g->handle_of[v] < 0) {
        cnode *c = &g->nodes[g->n];
        memset(c, 0, sizeof *c);
        c->orig = v;
        c->fwd = p->nodes[v].forward_ms;
        c->bwd = p->nodes[v].backward_ms;
        c->act = p->nodes[v].activation_bytes;
        c->param = p->nodes[v].parameter_bytes;
        g->handle_of[v] = g->n++;
    }
    return g->handle_of[v];
}

static void add_edge(cgraph *g, int from, int to) {
    g->edge_from[g->ne] = from;
    g->edge_to[g->ne++] = to;
}

static void merge(cnode *c, const rp_profile_node *nd) {
    c->fwd += nd->forward_ms;
    c->bwd += nd->backward_ms;
    c->act = nd->activation_bytes;
    c->param += nd->parameter_bytes;
}

/* compress_branch_helper: the branch from out_node, as a new cnode (-2 when
** out_node has several inputs and stays as it is); *last receives the
** profile node the branch ends at, which the compressed node replaces. The
** walked nodes are recorded in `walked`. */
static int branch(cgraph *g, const rp_profile *p, const adjacency *a, int out_node, int i,
                  int *last, int *walked, int *nwalked) {
    *nwalked = 0;
    *last = out_node;
    if (indeg(a, out_node) > 1)
        return -2;
    cnode c = {.orig = -1};
    snprintf(c.id, sizeof c.id, "compressed_node%d", i);
    snprintf(c.desc, sizeof c.desc, "Branch %d", i);
    int chain = 0, node = out_node;
    while (indeg(a, node) == 1 && outdeg(a, node) == 1) {
        chain++;
        int next = a->out[a->out_start[node]];
        merge(&c, &p->nodes[node]);
        walked[(*nwalked)++] = node;
        if (indeg(a, next) > 1)
            break;
        node = next;
        if (outdeg(a, node) == 0) { /* a branch into a sink: the sink is replaced, unmerged */
            *last = node;
            g->nodes[g->n] = c;
            return g->n++;
        }
    }
    *last = node;
    if (chain == 0)
        return orig_handle(g, p, node);
    if (chain == 1)
        c.named = p->nodes[node].desc;
    if (outdeg(a, node) > 1) {
        merge(&c, &p->nodes[node]);
        walked[(*nwalked)++] = node;
    }
    g->nodes[g->n] = c;
    return g->n++;
}

/* The value as PipeDream writes it ("%.3f") and reads it back. */
static double three_decimals(double x) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.3f", x);
    return strtod(buf, NULL);
}

/* The profile's inputs and outputs of each node, in edge order (fill: n + 1
** ints of scratch). */
static void adjacency_of(const rp_profile *p, adjacency *a, int *fill) {
    int n = p->num_nodes, m = p->num_edges;
    for (int e = 0; e < m; e++) {
        a->out_start[p->edges[e].from + 1]++;
        a->in_start[p->edges[e].to + 1]++;
    }
    for (int v = 0; v < n; v++) {
        a->out_start[v + 1] += a->out_start[v];
        a->in_start[v + 1] += a->in_start[v];
    }
    for (int e = 0; e < m; e++)
        a->out[a->out_start[p->edges[e].from] + fill[p->edges[e].from]++] = p->edges[e].to;
    memset(fill, 0, sizeof(int) * (n + 1));
    for (int e = 0; e < m; e++)
        a->in[a->in_start[p->edges[e].to] + fill[p->edges[e].to]++] = p->edges[e].from;
}

/* Graph.compress_branches' walk: from the sources, in node order, a
** breadth-first pass that makes each fork's branches one node each and
** copies every other edge. replaced[v]: the branch node that stands for
** profile node v (-1: none). */
static void walk(const rp_profile *p, const adjacency *a, cgraph *g, int *queue, int *walked,
                 int *replaced, unsigned char *seen) {
    int n = p->num_nodes, head = 0, tail = 0, branch_id = 0;
    for (int v = 0; v < n; v++)
        g->handle_of[v] = replaced[v] = -1;
    for (int v = 0; v < n; v++) /* the sources, in node order */
        if (indeg(a, v) == 0)
            queue[tail++] = v;
    while (head < tail) {
        int node = queue[head++];
        if (seen[node])
            continue;
        int from = replaced[node] >= 0 ? replaced[node] : -1;
        bool fork = outdeg(a, node) > 1;
        for (int k = a->out_start[node]; k < a->out_start[node + 1]; k++) {
            int to = a->out[k], last = to, nw = 0;
            int cn = fork ? branch(g, p, a, to, branch_id++, &last, walked, &nw) : -2;
            int src = from >= 0 ? from : orig_handle(g, p, node); /* (after the branch's) */
            if (!fork)
                add_edge(g, src, replaced[to] >= 0 ? replaced[to] : orig_handle(g, p, to));
            else if (cn == -2)
                add_edge(g, src, orig_handle(g, p, to));
            else {
                replaced[last] = cn;
                for (int w = 0; w < nw; w++)
                    if (replaced[walked[w]] < 0)
                        replaced[walked[w]] = cn;
                add_edge(g, src, cn);
            }
            if (!seen[last])
                queue[tail++] = last;
        }
        seen[node] = 1;
    }
}

/* The compressed graph as a profile: Graph.add_edge adds the two ends to
** the graph in that order, so its node order is the order of first
** mention (rank[cnode]); the file lists each node's inputs, node after
** node, and PipeDream reads the edges back in that order. */
static rp_status write_profile(const rp_profile *p, const cgraph *g, const int *rank,
                               const int *order, int nn, rp_profile *c, rp_error *err) {
    int n = p->num_nodes;
    c->num_nodes = nn;
    c->nodes = calloc(nn ? nn : 1, sizeof(rp_profile_node));
    c->edges = calloc(g->ne ? g->ne : 1, sizeof(rp_profile_edge));
    if (!c->nodes || !c->edges)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory compressing %d nodes", n);
    for (int i = 0; i < nn; i++) {
        const cnode *cn = &g->nodes[order[i]];
        rp_profile_node *nd = &c->nodes[i];
        const rp_profile_node *o = cn->orig >= 0 ? &p->nodes[cn->orig] : NULL;
        nd->id = strdup(o ? o->id : cn->id);
        nd->desc = strdup(o ? o->desc : cn->named ? cn->named : cn->desc);
        nd->forward_ms = three_decimals(cn->fwd);
        nd->backward_ms = three_decimals(cn->bwd);
        nd->activation_bytes = cn->act;
        nd->parameter_bytes = three_decimals(cn->param);
        nd->stage_id = -1;
        nd->line = o ? o->line : 0;
        if (!nd->id || !nd->desc) {
            c->num_nodes = i + 1;
            return rp_fail(err, RP_ERR_NOMEM, "out of memory compressing %d nodes", n);
        }
    }
    int *start = calloc((size_t)nn + 1, sizeof(int)), *by_to = malloc(sizeof(int) * (g->ne + 1));
    if (!start || !by_to) {
        free(start), free(by_to);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory compressing %d nodes", n);
    }
    for (int e = 0; e < g->ne; e++) /* a stable bucket sort of the edges by target */
        start[rank[g->edge_to[e]] + 1]++;
    for (int i = 0; i < nn; i++)
        start[i + 1] += start[i];
    for (int e = 0; e < g->ne; e++)
        by_to[start[rank[g->edge_to[e]]]++] = e;
    for (int k = 0; k < g->ne; k++) {
        rp_profile_edge *ed = &c->edges[c->num_edges++];
        ed->from = rank[g->edge_from[by_to[k]]];
        ed->to = rank[g->edge_to[by_to[k]]];
    }
    free(start), free(by_to);
    return RP_OK;
}

/* The nodes in the order of their first mention by an edge: rank[cnode]
** its place, order[place] the cnode; *nn how many. */
static void first_mention(const cgraph *g, int *rank, int *order, int *nn) {
    for (int i = 0; i < g->n; i++)
        rank[i] = -1;
    *nn = 0;
    for (int e = 0; e < g->ne; e++) {
        int ends[2] = {g->edge_from[e], g->edge_to[e]};
        for (int k = 0; k < 2; k++)
            if (rank[ends[k]] < 0) {
                rank[ends[k]] = *nn;
                order[(*nn)++] = ends[k];
            }
    }
}

/* The compression, in the steps above: the profile's adjacency, the walk
** that makes the branches, the compressed graph as a profile, and each
** profile node's compressed node. */
rp_status rpi_profile_compress_branches(const rp_profile *p, rp_profile **out, int *member_of,
                                        rp_error *err) {
    *out = NULL;
    int n = p->num_nodes, m = p->num_edges;
    adjacency a = {calloc(n + 1, sizeof(int)), malloc(sizeof(int) * (m + 1)),
                   calloc(n + 1, sizeof(int)), malloc(sizeof(int) * (m + 1))};
    cgraph g = {calloc((size_t)n + m + 1, sizeof(cnode)), 0, malloc(sizeof(int) * (2 * m + 1)),
                malloc(sizeof(int) * (2 * m + 1)), 0, malloc(sizeof(int) * (n + 1))};
    int *fill = calloc(n + 1, sizeof(int)), *queue = malloc(sizeof(int) * (2 * m + n + 1));
    int *walked = malloc(sizeof(int) * (n + 1)), *replaced = malloc(sizeof(int) * (n + 1));
    int *rank = NULL, *order = NULL, nn = 0;
    unsigned char *seen = calloc(n + 1, 1);
    rp_profile *c = calloc(1, sizeof *c);
    rp_status s = RP_OK;
    if (!a.in_start || !a.in || !a.out_start || !a.out || !g.nodes || !g.edge_from ||
        !g.edge_to || !g.handle_of || !fill || !queue || !walked || !replaced || !seen || !c)
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory compressing %d nodes", n);
    if (!s) {
        adjacency_of(p, &a, fill);
        walk(p, &a, &g, queue, walked, replaced, seen);
        rank = malloc(sizeof(int) * (g.n + 1));
        order = malloc(sizeof(int) * (g.n + 1));
        if (!rank || !order)
            s = rp_fail(err, RP_ERR_NOMEM, "out of memory compressing %d nodes", n);
    }
    if (!s) {
        first_mention(&g, rank, order, &nn);
        s = write_profile(p, &g, rank, order, nn, c, err);
    }
    for (int v = 0; !s && v < n; v++) {
        int h = replaced[v] >= 0 ? replaced[v] : g.handle_of[v];
        member_of[v] = h >= 0 ? rank[h] : -1;
    }
    free(rank), free(order);
    free(a.in_start), free(a.in), free(a.out_start), free(a.out);
    free(g.nodes), free(g.edge_from), free(g.edge_to), free(g.handle_of);
    free(fill), free(queue), free(walked), free(replaced), free(seen);
    if (s) {
        rp_profile_free(c);
        return s;
    }
    *out = c;
    return RP_OK;
}
