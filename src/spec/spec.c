/*
** The model spec's parser (docs/training.md): its lines, the graph's names
** and inputs, and the blocks one line spells out (llama_block). What one
** line's words make of a layer is spec_layer.c's; shapes are inferred line
** by line in shapes.c; what a parsed graph means at a stage boundary is
** graph.c's.
*/
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "graph.h"
#include "spec_impl.h"
#include "block_vars.h"
#include "repipe/spec.h"


static void split_words(char *s, rpi_words *out) {
    out->n = 0;
    while (*s && out->n < 32) {
        while (isspace((unsigned char)*s))
            s++;
        if (!*s)
            break;
        out->w[out->n++] = s;
        while (*s && !isspace((unsigned char)*s))
            s++;
        if (*s)
            *s++ = '\0';
    }
}


/* ---- the graph's words: "NAME = ..." before a layer, "< A B" after it ---- */

static bool is_name(const char *s) {
    if (!isalpha((unsigned char)*s) && *s != '_')
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '.')
            return false;
    return true;
}

/* Takes a line's name and inputs out of its words. */
static rp_status graph_words(pctx *c, rpi_words *w, char **lname, char **ins, int *nin) {
    *lname = NULL;
    *nin = 0;
    if (w->n >= 2 && strcmp(w->w[1], "=") == 0) {
        if (!is_name(w->w[0]) || strlen(w->w[0]) >= RP_NAME_MAX)
            return rp_fail(c->err, RP_ERR_PARSE,
                           "%s:%d: '%s' is not a name (a letter or '_', then letters, digits, "
                           "'_' or '.', under %d characters)",
                           c->name, c->line, w->w[0], RP_NAME_MAX);
        if (w->n == 2)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: '%s =' names no layer", c->name, c->line,
                           w->w[0]);
        *lname = w->w[0];
        for (int i = 2; i < w->n; i++)
            w->w[i - 2] = w->w[i];
        w->n -= 2;
    } else if (strchr(w->w[0], '=')) {
        return rp_fail(c->err, RP_ERR_PARSE,
                       "%s:%d: '%s': a name is given with spaces around '=' ('b1 = conv2d ...')",
                       c->name, c->line, w->w[0]);
    }
    for (int i = 0; i < w->n; i++) {
        if (w->w[i][0] != '<')
            continue;
        if (i == 0)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: '<' comes after the layer", c->name,
                           c->line);
        int n = w->n;
        w->n = i;
        if (w->w[i][1])
            ins[(*nin)++] = w->w[i] + 1;
        for (int j = i + 1; j < n; j++) {
            if (*nin == RP_MAX_INPUTS)
                return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: more than %d inputs", c->name,
                               c->line, RP_MAX_INPUTS);
            ins[(*nin)++] = w->w[j];
        }
        if (*nin == 0)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: '<' names no input", c->name, c->line);
        break;
    }
    return RP_OK;
}

typedef struct named {
    char name[RP_NAME_MAX];
    int tensor, line;
} named;

/* The tensor a name was given to, or a message naming it. */
static rp_status find_name(pctx *c, const named *names, int nnames, const char *name, int *t) {
    for (int k = 0; k < nnames; k++)
        if (strcmp(names[k].name, name) == 0) {
            *t = names[k].tensor;
            return RP_OK;
        }
    return rp_fail(c->err, RP_ERR_PARSE,
                   "%s:%d: '%s' is not the name of an earlier line (names are defined before "
                   "they are read)",
                   c->name, c->line, name);
}

/* The inputs of layer L (number l) from the names after its '<', or the
** line above. */
static rp_status resolve_inputs(pctx *c, rp_layer *L, int l, char **ins, int nin,
                                const named *names, int nnames) {
    bool multi = L->type == RP_LAYER_ADD || L->type == RP_LAYER_CONCAT || L->type == RP_LAYER_MUL;
    if (L->type == RP_LAYER_MUL && nin != 2)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: mul reads two inputs ('mul < a b'), not %d",
                       c->name, c->line, nin);
    if (nin == 0) {
        if (multi)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s needs two or more inputs ('%s < a b')",
                           c->name, c->line, rp_layer_name(L->type), rp_layer_name(L->type));
        L->num_inputs = 1;
        L->inputs[0] = l - 1;
        return RP_OK;
    }
    if (multi ? nin < 2 : nin != 1)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s reads %s, not %d inputs", c->name,
                       c->line, rp_layer_name(L->type), multi ? "two or more" : "one input", nin);
    for (int i = 0; i < nin; i++) {
        rp_status s = find_name(c, names, nnames, ins[i], &L->inputs[i]);
        if (s)
            return s;
    }
    L->num_inputs = nin;
    return RP_OK;
}

/* Adds a name for tensor t; a name is given once. */
static rp_status add_name(pctx *c, named **names, int *n, int *cap, const char *lname, int t) {
    for (int k = 0; k < *n; k++)
        if (strcmp((*names)[k].name, lname) == 0)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: the name '%s' is taken (line %d)",
                           c->name, c->line, lname, (*names)[k].line);
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        named *nn = realloc(*names, sizeof(named) * nc);
        if (!nn)
            return rp_fail(c->err, RP_ERR_NOMEM, "out of memory");
        *names = nn, *cap = nc;
    }
    named *e = &(*names)[(*n)++];
    snprintf(e->name, sizeof e->name, "%s", lname);
    e->tensor = t;
    e->line = c->line;
    return RP_OK;
}

/* The names a spec has given so far, for the inputs after '<'. */
typedef struct name_table {
    named *names;
    int n, cap;
} name_table;

/* Appends the layer of one line's words (its inputs `ins`, its name
** `lname` or NULL) to m, whose layers array has room for *cap. */
static rp_status add_layer(pctx *c, rp_model *m, int *cap, rpi_words *w, char **ins, int nin,
                           const char *lname, name_table *nt) {
    if (m->num_layers == *cap) {
        rp_layer *more = realloc(m->layers, sizeof(rp_layer) * *cap * 2);
        if (!more)
            return rp_fail(c->err, RP_ERR_NOMEM, "out of memory");
        memset(more + *cap, 0, sizeof(rp_layer) * *cap);
        m->layers = more;
        *cap *= 2;
    }
    rp_layer *L = &m->layers[m->num_layers];
    if (m->num_layers && m->layers[m->num_layers - 1].type == RP_LAYER_SOFTMAX_CE)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s:%d: softmax_cross_entropy (line %d) must be the last layer", c->name,
                       c->line, m->layers[m->num_layers - 1].line);
    rp_status s;
    if ((s = rpi_spec_parse_layer(c, w, L)) ||
        (s = resolve_inputs(c, L, m->num_layers, ins, nin, nt->names, nt->n)) ||
        (lname && (s = add_name(c, &nt->names, &nt->n, &nt->cap, lname, m->num_layers))))
        return s;
    L->in = *rp_model_tensor_shape(m, L->inputs[0]);
    if ((s = rpi_spec_infer(c, L, m)))
        return s;
    if (rp_shape_size(&L->out) > (1u << 28))
        return rp_fail(c->err, RP_ERR_INVALID, "%s:%d: the layer's output is too large", c->name,
                       c->line);
    m->num_layers++;
    return RP_OK;
}

/* A llama_block line's options. */
typedef struct llama_opts {
    int H, K, M;
    double theta, eps;
} llama_opts;

/* Reads a llama_block's key=value options (options only). */
static rp_status llama_options(pctx *c, rpi_words *w, llama_opts *o) {
    for (int i = 1; i < w->n; i++) {
        char *eq = strchr(w->w[i], '=');
        rp_status s = RP_OK;
        if (!eq)
            return rp_fail(c->err, RP_ERR_PARSE,
                           "%s:%d: llama_block takes options only (heads=H kv_heads=K mlp=M "
                           "rope_theta=T eps=E), not '%s'",
                           c->name, c->line, w->w[i]);
        *eq = '\0';
        const char *k = w->w[i], *v = eq + 1;
        if (strcmp(k, "heads") == 0)
            s = rpi_spec_want_int(c, k, v, 1, 1 << 16, &o->H);
        else if (strcmp(k, "kv_heads") == 0)
            s = rpi_spec_want_int(c, k, v, 1, 1 << 16, &o->K);
        else if (strcmp(k, "mlp") == 0)
            s = rpi_spec_want_int(c, k, v, 1, 1 << 24, &o->M);
        else if (strcmp(k, "rope_theta") == 0 || strcmp(k, "eps") == 0) {
            double *d = strcmp(k, "eps") == 0 ? &o->eps : &o->theta;
            if (!rpi_spec_parse_float(v, d) || *d < 0 || *d > 1e12)
                s = rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s: '%s' is not a number in [0, 1e12]",
                            c->name, c->line, k, v);
        } else
            s = rp_fail(c->err, RP_ERR_PARSE,
                        "%s:%d: llama_block takes no option '%s' (it takes: heads kv_heads mlp "
                        "rope_theta eps)",
                        c->name, c->line, k);
        if (s)
            return s;
    }
    return RP_OK;
}

/* The block's layers, reading tensor x: a line of words each, its inputs,
** the name its output takes (the last one's, lname where given). */
static rp_status add_block_layers(pctx *c, rp_model *m, int *cap, int x, int H, int K, int M,
                                  int C, double theta, double eps, const char *lname,
                                  name_table *nt) {
    char text[12][160];
    snprintf(text[0], sizeof text[0], "rmsnorm eps=%.9g", eps);
    snprintf(text[1], sizeof text[1], "linear %d bias=false", (H + 2 * K) * (C / H));
    snprintf(text[2], sizeof text[2], "attention heads=%d kv_heads=%d rope_theta=%.9g", H, K,
             theta);
    snprintf(text[3], sizeof text[3], "linear %d bias=false", C);
    snprintf(text[4], sizeof text[4], "add");
    snprintf(text[5], sizeof text[5], "rmsnorm eps=%.9g", eps);
    snprintf(text[6], sizeof text[6], "linear %d bias=false", M); /* w1, the gate */
    snprintf(text[7], sizeof text[7], "silu");
    snprintf(text[8], sizeof text[8], "linear %d bias=false", M); /* w3, up */
    snprintf(text[9], sizeof text[9], "mul");
    snprintf(text[10], sizeof text[10], "linear %d bias=false", C);
    snprintf(text[11], sizeof text[11], "add");
    /* inputs by the sub-layer's index in the block: -1 the block's input,
    ** -2 the line above */
    static const int reads[12][2] = {{-1, 0}, {-2, 0}, {-2, 0}, {-2, 0}, {-2, -1}, {-2, 0},
                                     {-2, 0}, {-2, 0}, {5, 0},  {7, 8},   {-2, 0}, {-2, 4}};
    static const int nreads[12] = {1, 0, 0, 0, 2, 0, 0, 0, 1, 2, 0, 2};
    char names[13][RP_NAME_MAX], *bins[2];
    snprintf(names[12], RP_NAME_MAX, "#%d.in", c->line);
    rp_status s = add_name(c, &nt->names, &nt->n, &nt->cap, names[12], x);
    for (int k = 0; !s && k < 12; k++) {
        snprintf(names[k], RP_NAME_MAX, "#%d.%d", c->line, k);
        for (int i = 0; i < nreads[k]; i++) {
            int r = reads[k][i] == -2 ? k - 1 : reads[k][i];
            bins[i] = r < 0 ? names[12] : names[r];
        }
        rpi_words sub;
        split_words(text[k], &sub);
        s = add_layer(c, m, cap, &sub, bins, nreads[k], k == 11 && lname ? lname : names[k], nt);
    }
    return s;
}

/* A LLaMA-family block on one line, "[NAME =] llama_block heads=H
** [kv_heads=K] [mlp=M] [rope_theta=T] [eps=E] [< IN]": the twelve layers of
** docs/training.md's block graph, with names of their own that no spec can
** write (they begin with '#', which starts a comment), so that a pipeline
** may still cut inside it and the LLaMA name schemes find it as they find
** the written-out graph. M defaults to 8 C / 3 rounded up to a multiple of
** 8 (344 for C 128), T to 10000, E to rmsnorm's 1e-6. */
static rp_status add_llama_block(pctx *c, rp_model *m, int *cap, rpi_words *w, char **ins, int nin,
                                 const char *lname, name_table *nt) {
    llama_opts o = {.theta = 10000, .eps = 1e-6};
    rp_status st = llama_options(c, w, &o);
    if (st)
        return st;
    int H = o.H, K = o.K, M = o.M;
    double theta = o.theta, eps = o.eps;
    if (H == 0)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: llama_block needs heads=H", c->name, c->line);
    K = K ? K : H;
    int x = m->num_layers - 1; /* the block's input: the line above, or the one named */
    if (nin > 1)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: llama_block reads one input, not %d",
                       c->name, c->line, nin);
    st = nin ? find_name(c, nt->names, nt->n, ins[0], &x) : RP_OK;
    if (st)
        return st;
    const rp_shape *in = rp_model_tensor_shape(m, x);
    int C = in->dim[in->ndim - 1];
    if (in->ndim != 2 || C % H || H % K || (C / H) % 2)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s:%d: llama_block needs a (T x C) input with C divisible by heads, an "
                       "even head size and heads divisible by kv_heads (C %d, heads %d, kv_heads "
                       "%d)",
                       c->name, c->line, C, H, K);
    if (!M)
        M = (8 * C / 3 + 7) / 8 * 8;
    return add_block_layers(c, m, cap, x, H, K, M, C, theta, eps, lname, nt);
}

/* The `input` line: the shape of one sample, named "input" and whatever
** else the line calls it. */
static rp_status input_line(pctx *c, rp_model *m, const rpi_words *w, const char *lname, int nin,
                            bool have_input, name_table *nt) {
    const char *name = c->name;
    if (nin)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: the input reads nothing", name, c->line);
    if (have_input)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: a second 'input' line (a model has one)",
                       name, c->line);
    if (m->num_layers)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: 'input' must come before the layers", name,
                       c->line);
    if (w->n < 2 || w->n > 4)
        return rp_fail(c->err, RP_ERR_PARSE,
                       "%s:%d: input takes 1 to 3 dimensions (e.g. 'input 1 28 28')", name,
                       c->line);
    m->input.ndim = w->n - 1;
    for (int i = 1; i < w->n; i++) {
        rp_status s = rpi_spec_want_int(c, "input dimension", w->w[i], 1, 1 << 24,
                                        &m->input.dim[i - 1]);
        if (s)
            return s;
    }
    if (rp_shape_size(&m->input) > (1u << 28))
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: the input is too large", name, c->line);
    rp_status s = add_name(c, &nt->names, &nt->n, &nt->cap, "input", -1);
    if (!s && lname && strcmp(lname, "input") != 0)
        s = add_name(c, &nt->names, &nt->n, &nt->cap, lname, -1);
    return s;
}

/* Every line of the spec in buf (NUL-terminated, written over): comments
** cut, words split, the input line first, then a layer (or a llama_block's
** layers) a line. */
static rp_status lines(pctx *c, rp_model *m, int *cap, char *buf, name_table *nt) {
    bool have_input = false;
    char *lname, *ins[RP_MAX_INPUTS];
    int nin;
    for (char *line = buf; line;) {
        c->line++;
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        rpi_words w;
        split_words(line, &w);
        line = nl ? nl + 1 : NULL;
        if (w.n == 0)
            continue;
        if (w.n == 32)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: too many words on one line", c->name,
                           c->line);
        rp_status s = graph_words(c, &w, &lname, ins, &nin);
        if (s)
            return s;
        if (strcmp(w.w[0], "input") == 0) {
            if ((s = input_line(c, m, &w, lname, nin, have_input, nt)))
                return s;
            have_input = true;
            continue;
        }
        if (!have_input)
            return rp_fail(c->err, RP_ERR_PARSE,
                           "%s:%d: the first line must declare the input shape ('input 1 28 "
                           "28')", c->name, c->line);
        if ((s = strcmp(w.w[0], "llama_block") == 0
                     ? add_llama_block(c, m, cap, &w, ins, nin, lname, nt)
                     : add_layer(c, m, cap, &w, ins, nin, lname, nt)))
            return s;
    }
    if (!have_input)
        return rp_fail(c->err, RP_ERR_PARSE, "%s: no 'input' line: the model is empty", c->name);
    return RP_OK;
}

rp_status rp_model_parse(rp_model **out, const char *text, size_t len, const char *name,
                         rp_error *err) {
    *out = NULL;
    rp_model *m = calloc(1, sizeof *m);
    char *buf = malloc(len + 1);
    int cap = 16;
    if (m) {
        m->layers = calloc(cap, sizeof(rp_layer));
        m->num_targets = 1;
    }
    if (!m || !buf || !m->layers) {
        free(buf);
        rp_model_free(m);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    memcpy(buf, text, len);
    buf[len] = '\0';
    pctx c = {name, 0, err};
    name_table nt = {NULL, 0, 0};
    rp_status s = memchr(text, '\0', len)
                      ? rp_fail(err, RP_ERR_PARSE, "%s: the file contains a NUL byte; not a "
                                "model spec", name)
                      : lines(&c, m, &cap, buf, &nt);
    if (!s && m->num_layers == 0)
        s = rp_fail(err, RP_ERR_PARSE, "%s: the model has no layers", name);
    if (!s)
        s = rpi_model_link(m, name, err);
    if (!s)
        s = rpi_spec_layout(m, err);
    if (!s && m->num_params > ((size_t)1 << 31))
        s = rp_fail(err, RP_ERR_INVALID, "%s: %zu parameters: more than 2^31 is not supported",
                    name, m->num_params);
    free(buf);
    free(nt.names);
    if (s) {
        rp_model_free(m);
        return s;
    }
    *out = m;
    return RP_OK;
}

static rp_status parse_model(const char *text, size_t len, const char *path, void *out,
                             rp_error *err) {
    return rp_model_parse(out, text, len, path, err);
}

rp_status rp_model_load(rp_model **out, const char *path, rp_error *err) {
    return rp_parse_file(path, false, parse_model, out, err);
}
