/*
** Questions asked of a parsed profile: its layers in an order the planner
** can cut, the bytes each cut carries, the split backward's two halves and
** the memory counts the engine's nets record. None of them changes it.
*/
#include "repipe/profile.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"

rp_status rp_profile_layers(const rp_profile *p, double **fwd_ms, double **bwd_ms,
                            double **out_bytes, double **param_bytes, int **node, int *n,
                            rp_error *err) {
    int N = p->num_nodes;
    double *fw = calloc(N + 1, sizeof(double)), *bw = calloc(N + 1, sizeof(double));
    double *ob = calloc(N + 1, sizeof(double)), *pb = calloc(N + 1, sizeof(double));
    int *nd = calloc(N + 1, sizeof(int)), *indeg = calloc(N + 1, sizeof(int));
    int *order = malloc(sizeof(int) * (N + 1));
    if (!fw || !bw || !ob || !pb || !nd || !indeg || !order) {
        free(fw), free(bw), free(ob), free(pb), free(nd), free(indeg), free(order);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    /* file order when it is a topological order (repipe's own profiles are
    ** the model's layers in file order, which the engine's stages count) */
    bool sorted = true;
    for (int e = 0; e < p->num_edges; e++) {
        indeg[p->edges[e].to]++;
        sorted = sorted && p->edges[e].from < p->edges[e].to;
    }
    int head = 0, tail = 0, L = 0;
    for (int i = 0; i < N; i++)
        if (sorted || !indeg[i])
            order[tail++] = i;
    while (!sorted && head < tail) {
        int u = order[head++];
        for (int e = 0; e < p->num_edges; e++)
            if (p->edges[e].from == u && --indeg[p->edges[e].to] == 0)
                order[tail++] = p->edges[e].to;
    }
    for (int k = 0; k < tail; k++) {
        const rp_profile_node *x = &p->nodes[order[k]];
        if (strncmp(x->desc, "Input", 5) == 0)
            continue;
        fw[L] = x->forward_ms;
        bw[L] = x->backward_ms;
        ob[L] = x->activation_bytes;
        pb[L] = x->parameter_bytes;
        nd[L++] = order[k];
    }
    free(indeg), free(order);
    *fwd_ms = fw, *bwd_ms = bw, *out_bytes = ob, *param_bytes = pb;
    if (node)
        *node = nd;
    else
        free(nd);
    *n = L;
    return RP_OK;
}

rp_status rp_profile_cut_bytes(const rp_profile *p, const int *node, int n, double **cut,
                               rp_error *err) {
    int N = p->num_nodes;
    int *pos = malloc(sizeof(int) * (N + 1)), *last = malloc(sizeof(int) * (N + 1));
    double *c = calloc(n + 2, sizeof(double));
    if (!pos || !last || !c) {
        free(pos), free(last), free(c);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < N; i++)
        pos[i] = -1, last[i] = -1; /* Input sources: before every layer */
    for (int k = 0; k < n; k++)
        pos[node[k]] = k;
    for (int e = 0; e < p->num_edges; e++) {
        int u = p->edges[e].from, v = p->edges[e].to;
        if (pos[v] > last[u])
            last[u] = pos[v];
    }
    /* node u crosses the cuts pos(u) + 1 .. last(u): a difference array */
    for (int u = 0; u < N; u++)
        if (last[u] > pos[u]) {
            c[pos[u] + 1] += p->nodes[u].activation_bytes;
            c[last[u] + 1] -= p->nodes[u].activation_bytes;
        }
    for (int k = 1; k <= n; k++)
        c[k] += c[k - 1];
    c[0] = 0;
    free(pos), free(last);
    *cut = c;
    return RP_OK;
}

/* A number recorded in a node's description as "key=V": 1 found, 0 not
** there, -1 not a non-negative number. */
static int desc_number(const rp_profile_node *x, const char *key, double *v) {
    const char *at = strstr(x->desc, key);
    if (!at)
        return 0;
    char *end;
    *v = strtod(at + strlen(key), &end);
    return end != at + strlen(key) && *v >= 0 ? 1 : -1;
}

rp_status rp_profile_split_ms(const rp_profile *p, const int *node, int n, double **b,
                              double **w, rp_error *err) {
    double *vb = calloc(n + 1, sizeof(double)), *vw = calloc(n + 1, sizeof(double));
    if (!vb || !vw) {
        free(vb), free(vw);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k < n; k++) {
        const rp_profile_node *x = &p->nodes[node[k]];
        int hb = desc_number(x, "backward_input_time=", &vb[k]);
        int hw = desc_number(x, "backward_weight_time=", &vw[k]);
        if (hb < 0 || hw < 0 || hb != hw) {
            free(vb), free(vw);
            return rp_fail(err, RP_ERR_INVALID,
                           "profile line %d (node %s): backward_input_time= and "
                           "backward_weight_time= must both be non-negative numbers, or both "
                           "left out",
                           x->line, x->id);
        }
        if (!hb) {
            vw[k] = x->parameter_bytes > 0 ? 0.5 * x->backward_ms : 0;
            vb[k] = x->backward_ms - vw[k];
        }
    }
    *b = vb, *w = vw;
    return RP_OK;
}

rp_status rp_profile_numbers(const rp_profile *p, const int *node, int n, const char *key,
                             double **out, rp_error *err) {
    *out = NULL;
    int have = 0;
    for (int k = 0; k < n; k++)
        have += strstr(p->nodes[node[k]].desc, key) != NULL;
    if (!have)
        return RP_OK;
    double *v = calloc((size_t)n + 1, sizeof(double));
    if (!v)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < n; k++) {
        const rp_profile_node *x = &p->nodes[node[k]];
        if (desc_number(x, key, &v[k]) != 1) {
            free(v);
            return rp_fail(err, RP_ERR_INVALID,
                           "profile line %d (node %s): %s must be a number >= 0 on every layer "
                           "where one layer has it",
                           x->line, x->id, key);
        }
    }
    *out = v;
    return RP_OK;
}

rp_status rp_profile_memory(const rp_profile *p, const int *node, int n, double *out[5],
                            rp_error *err) {
    static const char *const keys[5] = {"saved_bytes=", "checkpoint_bytes=", "wstash_bytes=",
                                        "scratch_bytes=", "grad_bytes="};
    rp_status st = RP_OK;
    for (int k = 0; k < 5; k++)
        out[k] = NULL;
    for (int k = 0; !st && k < 5; k++)
        st = rp_profile_numbers(p, node, n, keys[k], &out[k], err);
    for (int k = 0; st && k < 5; k++)
        free(out[k]), out[k] = NULL;
    return st;
}

/* The positive integer after key in the Input source's description, at
** most most; 0 when it is not one, -1 when no Input source says it. */
static long input_number(const rp_profile *p, const char *key, long most) {
    size_t n = strlen(key);
    for (int i = 0; i < p->num_nodes; i++) {
        const char *d = p->nodes[i].desc, *at;
        if (strncmp(d, "Input", 5) == 0 && (at = strstr(d, key))) {
            long v = strtol(at + n, NULL, 10);
            return v > 0 && v <= most ? v : 0;
        }
    }
    return -1;
}

int rp_profile_micro_batch(const rp_profile *p) {
    long v = input_number(p, " micro_batch=", 1L << 30);
    return v > 0 ? (int)v : 0;
}

int rp_profile_tensor_parallel(const rp_profile *p) {
    long v = input_number(p, " tensor_parallel=", 64);
    return v < 0 ? 1 : (int)v;
}

int rp_profile_find(const rp_profile *p, const char *id) {
    for (int i = 0; i < p->num_nodes; i++)
        if (strcmp(p->nodes[i].id, id) == 0)
            return i;
    return -1;
}
