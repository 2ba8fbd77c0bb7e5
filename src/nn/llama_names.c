/*
** Meta's names for a LLaMA-family model's tensors, the state_dict keys of
** llama/model.py (tok_embeddings, layers.i.attention.wq ... feed_forward.w3,
** norm, output), so that weights written by PyTorch start a repipe model and
** repipe's go back. repipe writes such a block as a graph of plain layers
** (docs/training.md, "A LLaMA-family block as a graph"); this file finds the
** blocks in that graph by what reads what, rather than by line numbers, so
** any spelling of the same graph maps. Meta keeps Q, K and V as three
** matrices where repipe fuses their rows into one linear ([Q; K; V], each
** (out, in) as in PyTorch); the rotary convention is the same (interleaved
** pairs), so no matrix is permuted.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/model.h"

#define MAX_SLOTS(m) (9 * (m)->num_layers + 3)

/* One of Meta's tensors: `rows` rows from row0 of a repipe variable. */
typedef struct {
    char name[RP_NAME_MAX];
    int var, row0, rows;
} slot;

/* The one layer that reads tensor t and has type `type`; -1 when none or
** several do. */
static int reader(const rp_model *m, int t, rp_layer_type type) {
    int found = -1;
    for (int l = t + 1; l < m->num_layers; l++)
        for (int i = 0; i < m->layers[l].num_inputs; i++)
            if (m->layers[l].inputs[i] == t && m->layers[l].type == type) {
                if (found >= 0 && found != l)
                    return -1;
                found = l;
            }
    return found;
}

static bool reads(const rp_layer *L, int t) {
    for (int i = 0; i < L->num_inputs; i++)
        if (L->inputs[i] == t)
            return true;
    return false;
}

/* Rows of a variable: a matrix's first dimension, a vector's length. */
static int var_rows(const rp_model *m, int v) { return m->vars[v].shape.dim[0]; }

static void add(slot *s, int *n, const char *name, int var, int row0, int rows) {
    snprintf(s[*n].name, RP_NAME_MAX, "%s", name);
    s[*n].var = var, s[*n].row0 = row0, s[*n].rows = rows;
    (*n)++;
}

static rp_status not_llama(const rp_model *m, int l, const char *what, rp_error *err) {
    if (l < 0)
        return rp_fail(err, RP_ERR_INVALID, "not a LLaMA-family model in Meta's layout: %s",
                       what);
    return rp_fail(err, RP_ERR_INVALID,
                   "not a LLaMA-family model in Meta's layout: at layer %d (line %d, %s): %s", l,
                   m->layers[l].line, rp_layer_name(m->layers[l].type), what);
}

/* Meta's tensors of model m in the order of llama/model.py's state_dict
** (a block's attention, its feed-forward, then its two norms, as the block
** registers them), as slots of m's variables; every variable of m must
** have one. */
static rp_status layout(const rp_model *m, slot *s, int *ns, rp_error *err) {
    const rp_layer *ly = m->layers;
    int n = m->num_layers, blocks = 0;
    *ns = 0;
    if (n < 4 || ly[0].type != RP_LAYER_EMBEDDING)
        return not_llama(m, -1, "it must begin with an embedding", err);
    add(s, ns, "tok_embeddings.weight", ly[0].first_var, 0, var_rows(m, ly[0].first_var));
    for (int a = 0; a < n; a++) {
        if (ly[a].type != RP_LAYER_ATTENTION)
            continue;
        char name[RP_NAME_MAX];
        int qkv = ly[a].inputs[0];
        if (qkv < 0 || ly[qkv].type != RP_LAYER_LINEAR || ly[qkv].bias)
            return not_llama(m, a, "attention must read a linear without bias (Q, K, V)", err);
        int norm1 = ly[qkv].inputs[0], x = norm1 >= 0 ? ly[norm1].inputs[0] : -1;
        if (norm1 < 0 || ly[norm1].type != RP_LAYER_RMSNORM)
            return not_llama(m, qkv, "the Q, K, V linear must read an rmsnorm", err);
        int o = reader(m, a, RP_LAYER_LINEAR), r1 = o >= 0 ? reader(m, o, RP_LAYER_ADD) : -1;
        if (o < 0 || ly[o].bias || r1 < 0 || ly[r1].num_inputs != 2 || !reads(&ly[r1], x))
            return not_llama(m, a,
                             "attention must feed one linear without bias, added to the "
                             "block's input",
                             err);
        int norm2 = reader(m, r1, RP_LAYER_RMSNORM);
        if (norm2 < 0)
            return not_llama(m, r1, "the residual must feed one rmsnorm (the MLP's)", err);
        int gate = -1, up = -1, silu = -1;
        for (int l = norm2 + 1; l < n; l++) {
            if (ly[l].type != RP_LAYER_LINEAR || !reads(&ly[l], norm2))
                continue;
            int sl = reader(m, l, RP_LAYER_SILU);
            if (sl >= 0 && gate < 0)
                gate = l, silu = sl;
            else if (up < 0)
                up = l;
            else
                gate = -2;
        }
        int mul = silu >= 0 ? reader(m, silu, RP_LAYER_MUL) : -1;
        int down = mul >= 0 ? reader(m, mul, RP_LAYER_LINEAR) : -1;
        if (gate < 0 || up < 0 || ly[gate].bias || ly[up].bias || mul < 0 ||
            !reads(&ly[mul], up) || down < 0 || ly[down].bias)
            return not_llama(m, norm2,
                             "the MLP must be SwiGLU: linear -> silu and linear, their mul, a "
                             "linear, all without bias",
                             err);
        int H = ly[a].heads, K = ly[a].kv_heads ? ly[a].kv_heads : H;
        int rows = var_rows(m, ly[qkv].first_var), hs = rows / (H + 2 * K);
        const char *part[] = {"wq", "wk", "wv"};
        int start[] = {0, H * hs, (H + K) * hs, rows}; /* [Q; K; V] */
        for (int k = 0; k < 3; k++) {
            snprintf(name, sizeof name, "layers.%d.attention.%s.weight", blocks, part[k]);
            add(s, ns, name, ly[qkv].first_var, start[k], start[k + 1] - start[k]);
        }
        const struct {
            const char *what;
            int layer;
        } rest[] = {{"attention.wo", o},        {"feed_forward.w1", gate},
                    {"feed_forward.w2", down},  {"feed_forward.w3", up},
                    {"attention_norm", norm1},  {"ffn_norm", norm2}};
        for (int k = 0; k < 6; k++) {
            snprintf(name, sizeof name, "layers.%d.%s.weight", blocks, rest[k].what);
            int v = ly[rest[k].layer].first_var;
            add(s, ns, name, v, 0, var_rows(m, v));
        }
        blocks++;
    }
    if (blocks == 0)
        return not_llama(m, -1, "it has no attention layer", err);
    int head = ly[n - 1].type == RP_LAYER_SOFTMAX_CE ? ly[n - 1].inputs[0] : -1;
    int norm = head >= 0 ? ly[head].inputs[0] : -1;
    if (head < 0 || ly[head].type != RP_LAYER_LINEAR || ly[head].bias || norm < 0 ||
        ly[norm].type != RP_LAYER_RMSNORM)
        return not_llama(m, -1,
                         "it must end with rmsnorm, a linear without bias and "
                         "softmax_cross_entropy",
                         err);
    add(s, ns, "norm.weight", ly[norm].first_var, 0, var_rows(m, ly[norm].first_var));
    add(s, ns, "output.weight", ly[head].first_var, 0, var_rows(m, ly[head].first_var));
    /* every variable once: a layer this walk did not reach (a bias, an extra
    ** projection) would otherwise keep its initial values unseen */
    for (int l = 0; l < n; l++)
        for (int v = ly[l].first_var; v < ly[l].first_var + ly[l].num_vars; v++) {
            int k = 0;
            while (k < *ns && s[k].var != v)
                k++;
            if (k == *ns)
                return not_llama(m, l, "this layer's parameters have no name in Meta's layout",
                                 err);
        }
    return RP_OK;
}

/* A slot's floats in params and their count; cols is one row's length. */
static float *slot_data(const rp_model *m, float *params, const slot *s, size_t *cols) {
    const rp_variable *v = &m->vars[s->var];
    *cols = v->count / (size_t)v->shape.dim[0];
    return params + v->offset + (size_t)s->row0 * *cols;
}

rp_status rp_llama_import(const rp_model *m, const rp_weights *file, const char *name,
                          float *params, rp_error *err) {
    slot *s = malloc(sizeof *s * (size_t)MAX_SLOTS(m));
    bool *used = calloc(file->num_tensors ? (size_t)file->num_tensors : 1, sizeof *used);
    int ns;
    rp_status st = s && used ? layout(m, s, &ns, err)
                             : rp_fail(err, RP_ERR_NOMEM, "out of memory");
    const rp_layer *head = st ? NULL : &m->layers[m->layers[m->num_layers - 1].inputs[0]];
    for (int k = 0; !st && k < ns; k++) {
        const rp_tensor *t = rp_weights_find(file, s[k].name);
        size_t cols;
        float *dst = slot_data(m, params, &s[k], &cols);
        bool is_head = s[k].var == head->first_var;
        if (is_head && head->tie) { /* the embedding's table, which it must equal if given */
            const float *emb = params + m->vars[m->layers[head->tie - 1].first_var].offset;
            memcpy(dst, emb, sizeof(float) * (size_t)s[k].rows * cols);
            if (t) {
                used[t - file->tensors] = true;
                if (rp_shape_size(&t->shape) != (size_t)s[k].rows * cols ||
                    memcmp(t->data, emb, sizeof(float) * (size_t)s[k].rows * cols) != 0)
                    st = rp_fail(err, RP_ERR_INVALID,
                                 "%s: output.weight differs from tok_embeddings.weight, but "
                                 "the model ties its head to the embedding (line %d)",
                                 name, head->line);
            }
            continue;
        }
        if (!t) {
            st = rp_fail(err, RP_ERR_INVALID, "%s: no tensor '%s' (for line %d of the model)",
                         name, s[k].name, m->layers[m->vars[s[k].var].layer].line);
            break;
        }
        used[t - file->tensors] = true;
        rp_shape want = m->vars[s[k].var].shape;
        want.dim[0] = s[k].rows;
        if (t->groups != 1 || t->shape.ndim != want.ndim ||
            memcmp(t->shape.dim, want.dim, sizeof(int) * (size_t)want.ndim) != 0) {
            char have[64], need[64];
            st = rp_fail(err, RP_ERR_INVALID, "%s: tensor '%s' is %s; this model's is %s", name,
                         s[k].name, rp_shape_to_string(&t->shape, have, sizeof have),
                         rp_shape_to_string(&want, need, sizeof need));
            break;
        }
        memcpy(dst, t->data, sizeof(float) * (size_t)s[k].rows * cols);
    }
    for (int i = 0; !st && i < file->num_tensors; i++) /* nothing left unread */
        if (!used[i] && strcmp(file->tensors[i].name, "rope.freqs") != 0)
            st = rp_fail(err, RP_ERR_INVALID,
                         "%s: tensor '%s' has no place in this model (Meta's names for its %d "
                         "tensors run from tok_embeddings.weight to output.weight)",
                         name, file->tensors[i].name, ns);
    free(s), free(used);
    return st;
}

rp_status rp_llama_export(const rp_model *m, const float *params, rp_weights **out,
                          rp_error *err) {
    *out = NULL;
    slot *s = malloc(sizeof *s * (size_t)MAX_SLOTS(m));
    int ns = 0;
    rp_status st = s ? layout(m, s, &ns, err) : rp_fail(err, RP_ERR_NOMEM, "out of memory");
    rp_weights *w = st ? NULL : calloc(1, sizeof *w);
    if (!st && (!w || !(w->tensors = calloc((size_t)ns, sizeof(rp_tensor)))))
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
    for (int k = 0; !st && k < ns; k++) {
        size_t cols;
        const float *src = slot_data(m, (float *)params, &s[k], &cols);
        rp_tensor *t = &w->tensors[k];
        snprintf(t->name, RP_NAME_MAX, "%s", s[k].name);
        t->groups = 1;
        t->shape = m->vars[s[k].var].shape;
        t->shape.dim[0] = s[k].rows;
        if (!(t->data = malloc(sizeof(float) * (size_t)s[k].rows * cols))) {
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
            break;
        }
        w->num_tensors++;
        memcpy(t->data, src, sizeof(float) * (size_t)s[k].rows * cols);
    }
    free(s);
    if (st) {
        rp_weights_free(w);
        return st;
    }
    *out = w;
    return RP_OK;
}
