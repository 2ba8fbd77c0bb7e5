/*
** The reduced profile graph the antichain search walks (antichain_graph.h):
** built once per plan, with every transitive closure the search asks for
** computed here rather than per antichain.
*/
#include "antichain_graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* PipeDream's reduction: Input sources (marked in input_source) and
** __getitem__ sinks removed; the edges left, as each node's out-edges in
** edge order, and each node's in-degree over them (indeg, outdeg, fill: n
** ints of scratch, zero). */
static void reduce(const rp_profile *p, graph *g, unsigned char *input_source, int *indeg,
                   int *outdeg, int *fill) {
    int n = p->num_nodes;
    memset(g->alive, 1, n);
    for (int e = 0; e < p->num_edges; e++)
        indeg[p->edges[e].to]++;
    for (int i = 0; i < n; i++)
        if (indeg[i] == 0 && strncmp(p->nodes[i].desc, "Input", 5) == 0) {
            g->alive[i] = 0;
            input_source[i] = 1;
        }
    for (int e = 0; e < p->num_edges; e++)
        if (g->alive[p->edges[e].from] && g->alive[p->edges[e].to])
            outdeg[p->edges[e].from]++;
    for (int i = 0; i < n; i++)
        if (g->alive[i] && outdeg[i] == 0 && strncmp(p->nodes[i].desc, "__getitem__", 11) == 0)
            g->alive[i] = 0;
    for (int e = 0; e < p->num_edges; e++) {
        int a = p->edges[e].from, b = p->edges[e].to;
        if (g->alive[a] && g->alive[b])
            g->out_start[a + 1]++;
    }
    for (int i = 0; i < n; i++)
        g->out_start[i + 1] += g->out_start[i];
    memset(indeg, 0, sizeof(int) * n);
    for (int e = 0; e < p->num_edges; e++) {
        int a = p->edges[e].from, b = p->edges[e].to;
        if (g->alive[a] && g->alive[b]) {
            g->out[g->out_start[a] + fill[a]++] = b;
            indeg[b]++;
        }
    }
}

/* Each node's transitive predecessors, in a topological order (Kahn's),
** then its successors in the reverse order (order: n ints of scratch;
** indeg is used up). */
static void closures(graph *g, int *indeg, int *order) {
    int n = g->n, head = 0, tail = 0;
    for (int i = 0; i < n; i++)
        if (g->alive[i] && indeg[i] == 0)
            order[tail++] = i;
    while (head < tail) {
        int u = order[head++];
        for (int k = g->out_start[u]; k < g->out_start[u + 1]; k++) {
            int v = g->out[k];
            word *pv = g->pred + (size_t)v * g->nw, *pu = g->pred + (size_t)u * g->nw;
            for (int w = 0; w < g->nw; w++)
                pv[w] |= pu[w];
            BIT_SET(pv, u);
            if (--indeg[v] == 0)
                order[tail++] = v;
        }
    }
    for (int t = tail - 1; t >= 0; t--) {
        int u = order[t];
        word *su = g->succ + (size_t)u * g->nw;
        for (int k = g->out_start[u]; k < g->out_start[u + 1]; k++) {
            int v = g->out[k];
            word *sv = g->succ + (size_t)v * g->nw;
            for (int w = 0; w < g->nw; w++)
                su[w] |= sv[w];
            BIT_SET(su, v);
        }
    }
}

/* extra[x]: the predecessors of x with an out-edge to a node that is
** neither x nor before it (their outputs still cross an antichain at x). */
static void crossing(graph *g) {
    for (int x = 0; x < g->n; x++) {
        const word *px = g->pred + (size_t)x * g->nw;
        word *ex = g->extra + (size_t)x * g->nw;
        for (int w = 0; w < g->nw; w++)
            for (word bits = px[w]; bits; bits &= bits - 1) {
                int q = w * 64 + __builtin_ctzll(bits);
                for (int k = g->out_start[q]; k < g->out_start[q + 1]; k++) {
                    int o = g->out[k];
                    if (o != x && !BIT_GET(px, o)) {
                        BIT_SET(ex, q);
                        break;
                    }
                }
            }
    }
}

rp_status rpi_graph_build(const rp_profile *p, graph *g, unsigned char *input_source,
                          rp_error *err) {
    int n = p->num_nodes;
    g->n = n;
    g->nw = (n + 63) / 64;
    g->alive = malloc(n);
    int *indeg = calloc(n, sizeof(int)), *outdeg = calloc(n, sizeof(int));
    g->out_start = calloc(n + 1, sizeof(int));
    g->out = malloc(sizeof(int) * (p->num_edges + 1));
    g->pred = calloc((size_t)n * g->nw, sizeof(word));
    g->succ = calloc((size_t)n * g->nw, sizeof(word));
    g->extra = calloc((size_t)n * g->nw, sizeof(word));
    int *order = malloc(sizeof(int) * n), *fill = calloc(n, sizeof(int));
    rp_status st = RP_OK;
    if (!g->alive || !indeg || !outdeg || !g->out_start || !g->out || !g->pred || !g->succ ||
        !g->extra || !order || !fill) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
    } else {
        reduce(p, g, input_source, indeg, outdeg, fill);
        closures(g, indeg, order);
        crossing(g);
    }
    free(indeg), free(outdeg), free(order), free(fill);
    return st;
}

void rpi_graph_free(graph *g) {
    free(g->alive), free(g->out_start), free(g->out), free(g->pred), free(g->succ);
    free(g->extra);
}

/* The antichain DAG grows from the first source: a node not connected to
** it (a chain that never joins the others) would be left out of the plan
** without a word, so it fails naming them. adj: each node's neighbours
** either way. */
static rp_status connected(const rp_profile *p, const graph *g, int first, const int *adj_start,
                           const int *adj, rp_error *err) {
    unsigned char *seen = calloc(g->n, 1);
    int *queue = malloc(sizeof(int) * g->n), qh = 0, qt = 0;
    if (!seen || !queue) {
        free(seen), free(queue);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    seen[first] = 1;
    queue[qt++] = first;
    while (qh < qt) {
        int u = queue[qh++];
        for (int k = adj_start[u]; k < adj_start[u + 1]; k++)
            if (!seen[adj[k]])
                seen[adj[k]] = 1, queue[qt++] = adj[k];
    }
    char names[256] = "";
    size_t at = 0;
    int missed = 0;
    for (int i = 0; i < g->n; i++)
        if (g->alive[i] && !seen[i] && missed++ < 4 && at < sizeof names)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s%s (line %d)",
                                   missed > 1 ? ", " : "", p->nodes[i].id, p->nodes[i].line);
    free(seen), free(queue);
    if (!missed)
        return RP_OK;
    return rp_fail(err, RP_ERR_INVALID,
                   "%d node%s not connected to the first source %s (line %d): %s%s; "
                   "the planner plans one connected graph (join them with an edge, "
                   "or profile them apart)",
                   missed, missed == 1 ? "" : "s", p->nodes[first].id, p->nodes[first].line,
                   names, missed > 4 ? ", ..." : "");
}

rp_status rpi_graph_first_source(const rp_profile *p, const graph *g, int *first_out,
                                 rp_error *err) {
    /* The first node without an input, and each node's neighbours either
    ** way (sources that join count), over the nodes left. */
    int first = -1, n = g->n;
    *first_out = -1;
    int *adj_start = calloc((size_t)n + 1, sizeof(int));
    int *adj = malloc(sizeof(int) * (2 * (size_t)p->num_edges + 1));
    unsigned char *has_in = calloc((size_t)n + 1, 1);
    if (!adj_start || !adj || !has_in) {
        free(adj_start), free(adj), free(has_in);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    for (int e = 0; e < p->num_edges; e++) {
        int a = p->edges[e].from, v = p->edges[e].to;
        if (g->alive[a] && g->alive[v]) {
            has_in[v] = 1;
            adj_start[a + 1]++, adj_start[v + 1]++;
        }
    }
    for (int i = 0; i < n; i++)
        adj_start[i + 1] += adj_start[i];
    for (int e = 0, *fill = adj_start; e < p->num_edges; e++) { /* fill, then shift back */
        int a = p->edges[e].from, v = p->edges[e].to;
        if (g->alive[a] && g->alive[v])
            adj[fill[a]++] = v, adj[fill[v]++] = a;
    }
    for (int i = n; i > 0; i--)
        adj_start[i] = adj_start[i - 1];
    adj_start[0] = 0;
    for (int i = 0; i < n && first < 0; i++)
        if (g->alive[i] && !has_in[i])
            first = i;
    free(has_in);
    if (first < 0) {
        free(adj_start), free(adj);
        return rp_fail(err, RP_ERR_INVALID,
                       "the profile has no node left to plan once Input sources and "
                       "__getitem__ sinks are removed");
    }
    rp_status st = connected(p, g, first, adj_start, adj, err);
    free(adj_start), free(adj);
    if (st)
        return st;
    *first_out = first;
    return RP_OK;
}
