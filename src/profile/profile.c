/*
** graph.txt reader and writer. The reader is strict about numbers and
** structure and names the line of every problem; ids are matched exactly.
** What the planner asks of a profile once read is in profile_query.c.
*/
#include "repipe/profile.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"

void rp_profile_free(rp_profile *p) {
    if (!p)
        return;
    for (int i = 0; i < p->num_nodes; i++) {
        free(p->nodes[i].id);
        free(p->nodes[i].desc);
    }
    free(p->nodes);
    free(p->edges);
    free(p);
}

static char *dup_range(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* Trims spaces, tabs and a trailing CR in place; returns the new start. */
static char *trim(char *s) {
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

/* A finite, non-negative number that fills the whole text. */
static bool parse_number(const char *text, double *out) {
    if (!*text)
        return false;
    char *end;
    errno = 0;
    double v = rp_strtod(text, &end);
    if (errno || *end || !isfinite(v) || v < 0)
        return false;
    *out = v;
    return true;
}

/* Simple chained hash from id to node index. */
typedef struct id_map {
    int cap;
    int *slot; /* node index + 1, 0 = empty */
} id_map;

static unsigned long hash_str(const char *s) {
    unsigned long h = 1469598103934665603ul;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211ul;
    return h;
}

static int map_find(const id_map *m, const rp_profile *p, const char *id) {
    for (unsigned long h = hash_str(id) % m->cap;; h = (h + 1) % m->cap) {
        int v = m->slot[h];
        if (!v)
            return -1;
        if (strcmp(p->nodes[v - 1].id, id) == 0)
            return v - 1;
    }
}

static void map_put(id_map *m, const rp_profile *p, int idx) {
    unsigned long h = hash_str(p->nodes[idx].id) % m->cap;
    while (m->slot[h])
        h = (h + 1) % m->cap;
    m->slot[h] = idx + 1;
}

/* Parses "forward_compute_time=F, backward_compute_time=B, activation_size=A,
** parameter_size=P" into n. */
static rp_status parse_metadata(char *meta, rp_profile_node *n, const char *name, int line,
                                rp_error *err) {
    static const char *const keys[4] = {"forward_compute_time", "backward_compute_time",
                                        "activation_size", "parameter_size"};
    double vals[4];
    char *s = meta;
    for (int k = 0; k < 4; k++) {
        char *sep = k < 3 ? strstr(s, ", ") : NULL;
        if (k < 3 && !sep)
            return rp_fail(err, RP_ERR_PARSE,
                           "%s:%d: expected '%s=..., ' in the node's numbers", name, line,
                           keys[k]);
        if (sep)
            *sep = '\0';
        char *eq = strchr(s, '=');
        size_t klen = eq ? (size_t)(eq - s) : 0;
        if (!eq || klen != strlen(keys[k]) || strncmp(s, keys[k], klen) != 0)
            return rp_fail(err, RP_ERR_PARSE, "%s:%d: expected '%s=' but found '%.40s'", name,
                           line, keys[k], s);
        char *v = trim(eq + 1);
        if (k == 2 && v[0] == '[') {
            /* a list of activation sizes: "[a; b; ...]", summed */
            size_t vl = strlen(v);
            if (vl < 2 || v[vl - 1] != ']')
                return rp_fail(err, RP_ERR_PARSE,
                               "%s:%d: activation_size list '%.40s' lacks its closing ']'",
                               name, line, v);
            v[vl - 1] = '\0';
            double sum = 0;
            char *item = v + 1;
            for (;;) {
                char *semi = strchr(item, ';');
                if (semi)
                    *semi = '\0';
                double x;
                if (!parse_number(trim(item), &x))
                    return rp_fail(err, RP_ERR_PARSE,
                                   "%s:%d: activation_size list has a bad number '%.40s'",
                                   name, line, trim(item));
                sum += x;
                if (!semi)
                    break;
                item = semi + 1;
            }
            vals[k] = sum;
        } else if (!parse_number(v, &vals[k])) {
            return rp_fail(err, RP_ERR_PARSE,
                           "%s:%d: %s: '%.40s' is not a non-negative number", name, line,
                           keys[k], v);
        }
        if (sep)
            s = sep + 2;
    }
    n->forward_ms = vals[0];
    n->backward_ms = vals[1];
    n->activation_bytes = vals[2];
    n->parameter_bytes = vals[3];
    return RP_OK;
}

static rp_status parse_node(char *line_text, rp_profile_node *n, const char *name, int line,
                            rp_error *err) {
    /* Split on " -- ": id, description (may itself contain " -- "), the
    ** numbers, and an optional stage_id. */
    char *parts[256];
    int np = 0;
    char *s = line_text;
    for (;;) {
        if (np == 256)
            return rp_fail(err, RP_ERR_PARSE, "%s:%d: too many ' -- ' separators", name, line);
        parts[np++] = s;
        char *sep = strstr(s, " -- ");
        if (!sep)
            break;
        *sep = '\0';
        s = sep + 4;
    }
    int meta = -1;
    for (int i = 1; i < np; i++)
        if (strncmp(parts[i], "forward_compute_time=", 21) == 0)
            meta = i;
    if (np < 3 || meta < 2)
        return rp_fail(err, RP_ERR_PARSE,
                       "%s:%d: expected 'ID -- DESCRIPTION -- forward_compute_time=..., ...'",
                       name, line);
    n->stage_id = -1;
    if (meta + 1 < np) {
        double v;
        if (meta + 2 != np || strncmp(parts[meta + 1], "stage_id=", 9) != 0 ||
            !parse_number(parts[meta + 1] + 9, &v) || v != floor(v) || v > 1e6)
            return rp_fail(err, RP_ERR_PARSE,
                           "%s:%d: after the numbers only ' -- stage_id=N' may follow", name,
                           line);
        n->stage_id = (int)v;
    }
    char *id = trim(parts[0]);
    if (!*id)
        return rp_fail(err, RP_ERR_PARSE, "%s:%d: the node has an empty id", name, line);
    rp_status st = parse_metadata(parts[meta], n, name, line, err);
    if (st)
        return st;
    /* Rejoin the description's own " -- " separators. */
    size_t dlen = 0;
    for (int i = 1; i < meta; i++)
        dlen += strlen(parts[i]) + 4;
    n->id = dup_range(id, strlen(id));
    n->desc = malloc(dlen + 1);
    if (!n->id || !n->desc)
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name);
    n->desc[0] = '\0';
    for (int i = 1; i < meta; i++) {
        if (i > 1)
            strcat(n->desc, " -- ");
        strcat(n->desc, parts[i]);
    }
    n->line = line;
    return RP_OK;
}

/* The error naming an edge on a cycle, once a topological sort left nodes
** with inputs (indeg > 0): those are on a cycle or downstream of one, so
** the ones without outputs among them are peeled off until only cycles
** remain. start, adj: each node's out-edges. */
static rp_status cycle_error(const rp_profile *p, int *indeg, const int *start, const int *adj,
                             const char *name, rp_error *err) {
    for (bool changed = true; changed;) {
        changed = false;
        for (int u = 0; u < p->num_nodes; u++) {
            if (indeg[u] <= 0)
                continue;
            bool out_left = false;
            for (int k = start[u]; k < start[u + 1] && !out_left; k++)
                out_left = indeg[adj[k]] > 0;
            if (!out_left) {
                indeg[u] = 0;
                changed = true;
            }
        }
    }
    for (int e = 0; e < p->num_edges; e++)
        if (indeg[p->edges[e].to] > 0 && indeg[p->edges[e].from] > 0)
            return rp_fail(err, RP_ERR_INVALID, "%s:%d: the edge %s -- %s lies on a cycle", name,
                           p->edges[e].line, p->nodes[p->edges[e].from].id,
                           p->nodes[p->edges[e].to].id);
    return rp_fail(err, RP_ERR_INVALID, "%s: the graph has a cycle", name);
}

/* Kahn's algorithm: fails with the line of an edge on a cycle. */
static rp_status check_acyclic(const rp_profile *p, const char *name, rp_error *err) {
    int n = p->num_nodes;
    int *indeg = calloc(n, sizeof(int)), *queue = malloc(sizeof(int) * (n ? n : 1));
    int *start = calloc(n + 1, sizeof(int)), *adj = malloc(sizeof(int) * (p->num_edges + 1));
    if (!indeg || !queue || !start || !adj) {
        free(indeg), free(queue), free(start), free(adj);
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name);
    }
    for (int e = 0; e < p->num_edges; e++) {
        indeg[p->edges[e].to]++;
        start[p->edges[e].from + 1]++;
    }
    for (int i = 0; i < n; i++)
        start[i + 1] += start[i];
    int *fill = calloc(n + 1, sizeof(int));
    for (int e = 0; fill && e < p->num_edges; e++)
        adj[start[p->edges[e].from] + fill[p->edges[e].from]++] = p->edges[e].to;
    int head = 0, tail = 0, sources = 0;
    for (int i = 0; i < n; i++)
        if (!indeg[i]) {
            queue[tail++] = i;
            sources++;
        }
    while (head < tail) {
        int u = queue[head++];
        for (int k = start[u]; k < start[u + 1]; k++)
            if (--indeg[adj[k]] == 0)
                queue[tail++] = adj[k];
    }
    rp_status s = RP_OK;
    if (!fill)
        s = rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name);
    else if (sources == 0)
        s = rp_fail(err, RP_ERR_INVALID, "%s: the graph has no source (every node has an input)",
                    name);
    else if (tail < n)
        s = cycle_error(p, indeg, start, adj, name, err);
    free(indeg), free(queue), free(start), free(adj), free(fill);
    return s;
}

/* An edge line, "FROM -- TO": its ends' text kept in ends[0..1] until
** every node is read. */
static rp_status edge_line(char *t, char **ends, const char *name, int line, rp_error *err) {
    char *sep = strstr(t, " -- ");
    if (!sep)
        return rp_fail(err, RP_ERR_PARSE, "%s:%d: an edge line must read 'FROM -- TO'", name,
                       line);
    *sep = '\0';
    char *a = trim(t), *b = trim(sep + 4);
    if (!*a || !*b || strstr(b, " -- "))
        return rp_fail(err, RP_ERR_PARSE, "%s:%d: an edge line must read 'FROM -- TO'", name,
                       line);
    ends[0] = a, ends[1] = b;
    return RP_OK;
}

/* A node line, the next node of p, its id new. */
static rp_status node_line(rp_profile *p, id_map *map, char *t, const char *name, int line,
                           rp_error *err) {
    rp_profile_node *n = &p->nodes[p->num_nodes];
    rp_status s = parse_node(t, n, name, line, err);
    if (s) {
        free(n->id), free(n->desc);
        n->id = n->desc = NULL;
        return s;
    }
    int prev = map_find(map, p, n->id);
    p->num_nodes++; /* (a node with the id of another is freed with the profile) */
    if (prev >= 0)
        return rp_fail(err, RP_ERR_INVALID, "%s:%d: node id '%s' already defined on line %d",
                       name, line, n->id, p->nodes[prev].line);
    map_put(map, p, p->num_nodes - 1);
    return RP_OK;
}

/* The edges' ends named by their nodes' ids, resolved. */
static rp_status resolve_edges(rp_profile *p, const id_map *map, char **edge_ends,
                               const char *name, rp_error *err) {
    for (int e = 0; e < p->num_edges; e++) {
        int idx[2];
        for (int end = 0; end < 2; end++) {
            const char *id = edge_ends[2 * e + end];
            if ((idx[end] = map_find(map, p, id)) < 0)
                return rp_fail(err, RP_ERR_INVALID, "%s:%d: the edge names an unknown node '%s'",
                               name, p->edges[e].line, id);
        }
        p->edges[e].from = idx[0], p->edges[e].to = idx[1];
        if (idx[0] == idx[1])
            return rp_fail(err, RP_ERR_INVALID, "%s:%d: the edge %s -- %s lies on a cycle", name,
                           p->edges[e].line, edge_ends[2 * e], edge_ends[2 * e]);
    }
    return RP_OK;
}

/* The lines of buf (written over), a node or an edge each; blank lines
** are allowed. */
static rp_status read_lines(rp_profile *p, id_map *map, char **edge_ends, char *buf,
                            const char *name, rp_error *err) {
    char *line_text = buf;
    for (int line = 1; line_text; line++) {
        char *nl = strchr(line_text, '\n');
        if (nl)
            *nl = '\0';
        bool is_edge = line_text[0] == '\t';
        char *t = trim(line_text);
        rp_status s = RP_OK;
        if (*t && is_edge) {
            s = edge_line(t, edge_ends + 2 * p->num_edges, name, line, err);
            if (!s)
                p->edges[p->num_edges++].line = line;
        } else if (*t) {
            s = node_line(p, map, t, name, line, err);
        }
        if (s)
            return s;
        line_text = nl ? nl + 1 : NULL;
    }
    if (p->num_nodes == 0)
        return rp_fail(err, RP_ERR_INVALID, "%s: no nodes: the profile is empty", name);
    return RP_OK;
}

rp_status rp_profile_parse(rp_profile **out, const char *text, size_t len, const char *name,
                           rp_error *err) {
    *out = NULL;
    rp_profile *p = calloc(1, sizeof *p);
    char *buf = dup_range(text, len);
    if (!p || !buf) {
        free(p), free(buf);
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name);
    }
    /* Count lines to size the arrays once. */
    int lines = 1;
    for (size_t i = 0; i < len; i++)
        lines += buf[i] == '\n';
    p->nodes = calloc(lines, sizeof *p->nodes);
    p->edges = calloc(lines, sizeof *p->edges);
    /* Edge ends are resolved after all nodes are read; keep their text. */
    char **edge_ends = calloc(2 * (size_t)lines, sizeof(char *));
    id_map map = {2 * lines + 1, calloc(2 * (size_t)lines + 1, sizeof(int))};
    rp_status s = RP_OK;
    if (!p->nodes || !p->edges || !edge_ends || !map.slot)
        s = rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name);
    else if (memchr(text, '\0', len))
        s = rp_fail(err, RP_ERR_PARSE, "%s: the file contains a NUL byte; not a graph.txt", name);
    if (!s)
        s = read_lines(p, &map, edge_ends, buf, name, err);
    if (!s)
        s = resolve_edges(p, &map, edge_ends, name, err);
    if (!s)
        s = check_acyclic(p, name, err);
    free(edge_ends);
    free(map.slot);
    free(buf);
    if (s)
        rp_profile_free(p);
    else
        *out = p;
    return s;
}

static rp_status parse_profile(const char *text, size_t len, const char *path, void *out,
                               rp_error *err) {
    return rp_profile_parse(out, text, len, path, err);
}

rp_status rp_profile_read(rp_profile **out, const char *path, rp_error *err) {
    return rp_parse_file(path, false, parse_profile, out, err);
}

/* A growable string. */
typedef struct sbuf {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int need = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (need < 0) {
            b->oom = true;
            return;
        }
        if (b->s && b->n + (size_t)need < b->cap) {
            b->n += (size_t)need;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)need + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
}

rp_status rp_profile_to_string(const rp_profile *p, const int *stage_ids, char **out,
                               rp_error *err) {
    sbuf b = {0};
    for (int i = 0; i < p->num_nodes; i++) {
        const rp_profile_node *n = &p->nodes[i];
        int stage = stage_ids ? stage_ids[i] : n->stage_id;
        sb_printf(&b,
                  "%s -- %s -- forward_compute_time=%.3f, backward_compute_time=%.3f, "
                  "activation_size=%.3f, parameter_size=%.3f",
                  n->id, n->desc, n->forward_ms, n->backward_ms, n->activation_bytes,
                  n->parameter_bytes);
        if (stage >= 0)
            sb_printf(&b, " -- stage_id=%d", stage);
        sb_printf(&b, "\n");
    }
    /* Incoming edges node by node, as PipeDream writes them. */
    for (int i = 0; i < p->num_nodes; i++)
        for (int e = 0; e < p->num_edges; e++)
            if (p->edges[e].to == i)
                sb_printf(&b, "\t%s -- %s\n", p->nodes[p->edges[e].from].id, p->nodes[i].id);
    if (b.oom || !b.s) {
        free(b.s);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    *out = b.s;
    return RP_OK;
}

rp_status rp_profile_write(const rp_profile *p, const int *stage_ids, const char *path,
                           rp_error *err) {
    char *text;
    rp_status s = rp_profile_to_string(p, stage_ids, &text, err);
    if (s)
        return s;
    s = rp_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return s;
}
