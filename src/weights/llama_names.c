/*
** Two name schemes for a LLaMA-family model's tensors, so that weights
** written by PyTorch start a repipe model and repipe's go back: Meta's, the
** state_dict keys of llama/model.py (tok_embeddings, layers.i.attention.wq
** ... feed_forward.w3, norm, output), and Hugging Face's, those of
** transformers' LlamaForCausalLM (model.embed_tokens,
** model.layers.i.self_attn.q_proj ... mlp.down_proj, model.norm, lm_head),
** which Mistral, Qwen and most published LLaMA-family files use too.
**
** repipe writes such a block as a graph of plain layers (docs/training.md,
** "A LLaMA-family block as a graph"); this file finds the blocks in that
** graph by what reads what, rather than by line numbers, so any spelling of
** the same graph maps. Both schemes keep Q, K and V as three matrices where
** repipe fuses their rows into one linear ([Q; K; V], each (out, in) as in
** PyTorch). repipe's rotary convention is Meta's (each head's features in
** interleaved pairs); Hugging Face's rotates a head's first half against
** its second, and its conversion script permutes each head's Q and K rows
** to match (row p * hs/2 + i of its head holds Meta's row 2i + p), which
** the import undoes and the export redoes. V is not permuted.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/weights.h"

#define MAX_SLOTS(m) (9 * (m)->num_layers + 3)

/* One tensor of the file: `rows` rows from row0 of a repipe variable, each
** head's rows permuted (Hugging Face's rotary order) when `heads` > 0. */
typedef struct {
    char name[RP_NAME_MAX];
    int var, row0, rows, heads;
} slot;

/* A tensor's role and its name in each scheme (%d: the block). */
enum { EMB, WQ, WK, WV, WO, W1, W2, W3, NORM1, NORM2, NORM, OUT, ROLES };
static const char *const NAMES[2][ROLES] = {
    {"tok_embeddings.weight", "layers.%d.attention.wq.weight", "layers.%d.attention.wk.weight",
     "layers.%d.attention.wv.weight", "layers.%d.attention.wo.weight",
     "layers.%d.feed_forward.w1.weight", "layers.%d.feed_forward.w2.weight",
     "layers.%d.feed_forward.w3.weight", "layers.%d.attention_norm.weight",
     "layers.%d.ffn_norm.weight", "norm.weight", "output.weight"},
    {"model.embed_tokens.weight", "model.layers.%d.self_attn.q_proj.weight",
     "model.layers.%d.self_attn.k_proj.weight", "model.layers.%d.self_attn.v_proj.weight",
     "model.layers.%d.self_attn.o_proj.weight", "model.layers.%d.mlp.gate_proj.weight",
     "model.layers.%d.mlp.down_proj.weight", "model.layers.%d.mlp.up_proj.weight",
     "model.layers.%d.input_layernorm.weight", "model.layers.%d.post_attention_layernorm.weight",
     "model.norm.weight", "lm_head.weight"},
};
/* A block's tensors in its state_dict's order: the attention's, the MLP's
** (Meta registers w1, w2, w3; Hugging Face gate, up, down), the norms. */
static const int BLOCK_ORDER[2][9] = {{WQ, WK, WV, WO, W1, W2, W3, NORM1, NORM2},
                                      {WQ, WK, WV, WO, W1, W3, W2, NORM1, NORM2}};

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

static void add(slot *s, int *n, rp_llama_names names, int role, int block, int var, int row0,
                int rows, int heads) {
    snprintf(s[*n].name, RP_NAME_MAX, NAMES[names][role], block);
    s[*n].var = var, s[*n].row0 = row0, s[*n].rows = rows;
    s[*n].heads = names == RP_LLAMA_HF ? heads : 0;
    (*n)++;
}

static rp_status not_llama(const rp_model *m, int l, const char *what, rp_error *err) {
    if (l < 0)
        return rp_fail(err, RP_ERR_INVALID, "not a LLaMA-family model in repipe's graph: %s",
                       what);
    return rp_fail(err, RP_ERR_INVALID,
                   "not a LLaMA-family model in repipe's graph: at layer %d (line %d, %s): %s", l,
                   m->layers[l].line, rp_layer_name(m->layers[l].type), what);
}

/* The block of attention layer a, its layers found around it (rmsnorm, the
** Q, K, V linear, attention, the output linear and the residual; rmsnorm,
** SwiGLU and the residual), as slots in the scheme's order. */
static rp_status block(const rp_model *m, rp_llama_names names, int a, int b, slot *s, int *ns,
                       rp_error *err) {
    const rp_layer *ly = m->layers;
    int n = m->num_layers;
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
    if (hs % 2)
        return not_llama(m, a, "rotary embeddings need an even head size", err);
    int at[ROLES], row0[ROLES] = {0}, nrows[ROLES], heads[ROLES] = {0};
    at[WQ] = at[WK] = at[WV] = qkv; /* [Q; K; V] */
    row0[WK] = H * hs, row0[WV] = (H + K) * hs;
    nrows[WQ] = H * hs, nrows[WK] = nrows[WV] = K * hs;
    heads[WQ] = ly[a].rope_theta > 0 ? H : 0, heads[WK] = ly[a].rope_theta > 0 ? K : 0;
    at[WO] = o, at[W1] = gate, at[W2] = down, at[W3] = up, at[NORM1] = norm1, at[NORM2] = norm2;
    for (int k = 0; k < 9; k++) {
        int r = BLOCK_ORDER[names][k], v = ly[at[r]].first_var;
        add(s, ns, names, r, b, v, row0[r], r >= WQ && r <= WV ? nrows[r] : var_rows(m, v),
            heads[r]);
    }
    return RP_OK;
}

/* Every variable once: a layer the walk did not reach (a bias, an extra
** projection) would otherwise keep its initial values unseen. */
static rp_status every_var_named(const rp_model *m, const slot *s, int ns, rp_error *err) {
    const rp_layer *ly = m->layers;
    for (int l = 0; l < m->num_layers; l++)
        for (int v = ly[l].first_var; v < ly[l].first_var + ly[l].num_vars; v++) {
            int k = 0;
            while (k < ns && s[k].var != v)
                k++;
            if (k == ns)
                return not_llama(m, l, "this layer's parameters have no name in the scheme",
                                 err);
        }
    return RP_OK;
}

/* The tensors of model m under `names`, in the order of that scheme's
** state_dict, as slots of m's variables; every variable of m must have
** one. */
static rp_status layout(const rp_model *m, rp_llama_names names, slot *s, int *ns,
                        rp_error *err) {
    const rp_layer *ly = m->layers;
    int n = m->num_layers, blocks = 0;
    *ns = 0;
    if (n < 4 || ly[0].type != RP_LAYER_EMBEDDING)
        return not_llama(m, -1, "it must begin with an embedding", err);
    add(s, ns, names, EMB, 0, ly[0].first_var, 0, var_rows(m, ly[0].first_var), 0);
    for (int a = 0; a < n; a++) {
        if (ly[a].type != RP_LAYER_ATTENTION)
            continue;
        rp_status st = block(m, names, a, blocks++, s, ns, err);
        if (st)
            return st;
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
    add(s, ns, names, NORM, 0, ly[norm].first_var, 0, var_rows(m, ly[norm].first_var), 0);
    add(s, ns, names, OUT, 0, ly[head].first_var, 0, var_rows(m, ly[head].first_var), 0);
    return every_var_named(m, s, *ns, err);
}

/* A slot's floats in params and their count; cols is one row's length. */
static float *slot_data(const rp_model *m, float *params, const slot *s, size_t *cols) {
    const rp_variable *v = &m->vars[s->var];
    *cols = v->count / (size_t)v->shape.dim[0];
    return params + v->offset + (size_t)s->row0 * *cols;
}

/* Copies a slot's rows between the file's order (f) and repipe's (p):
** within each of `heads` heads of hs rows, the file's row p * hs/2 + i is
** repipe's row 2i + p; without heads, row for row. */
static void copy_rows(float *p, float *f, const slot *s, size_t cols, bool to_repipe) {
    int hs = s->heads ? s->rows / s->heads : 0;
    for (int r = 0; r < s->rows; r++) {
        int rr = r; /* repipe's row of the file's row r */
        if (hs) {
            int h = r / hs, w = r % hs, half = hs / 2;
            rr = h * hs + 2 * (w % half) + w / half;
        }
        if (to_repipe)
            memcpy(p + (size_t)rr * cols, f + (size_t)r * cols, sizeof(float) * cols);
        else
            memcpy(f + (size_t)r * cols, p + (size_t)rr * cols, sizeof(float) * cols);
    }
}

bool rp_llama_names_of(const rp_weights *file, rp_llama_names *out) {
    for (int n = RP_LLAMA_META; n <= RP_LLAMA_HF; n++)
        if (rp_weights_find(file, NAMES[n][EMB])) {
            *out = (rp_llama_names)n;
            return true;
        }
    return false;
}

/* Buffers of a scheme's own, which carry no parameter. */
static bool buffer_name(const char *n) {
    const char *tail = ".self_attn.rotary_emb.inv_freq";
    size_t ln = strlen(n), lt = strlen(tail);
    return strcmp(n, "rope.freqs") == 0 || (ln > lt && strcmp(n + ln - lt, tail) == 0);
}

rp_status rp_llama_import(const rp_model *m, const rp_weights *file, rp_llama_names names,
                          const char *name, float *params, rp_error *err) {
    slot *s = malloc(sizeof *s * (size_t)MAX_SLOTS(m));
    bool *used = calloc(file->num_tensors ? (size_t)file->num_tensors : 1, sizeof *used);
    int ns;
    rp_status st = s && used ? layout(m, names, s, &ns, err)
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
                                 "%s: %s differs from %s, but the model ties its head to the "
                                 "embedding (line %d)",
                                 name, s[k].name, NAMES[names][EMB], head->line);
            }
            continue;
        }
        if (!t) {
            st = rp_fail(err, RP_ERR_INVALID, "%s: no tensor '%s' (for line %d of the model)%s",
                         name, s[k].name, m->layers[m->vars[s[k].var].layer].line,
                         is_head ? "; a file without its head ties it to the embedding: give "
                                   "the model's head tie=0"
                                 : "");
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
        copy_rows(dst, t->data, &s[k], cols, true);
    }
    for (int i = 0; !st && i < file->num_tensors; i++) /* nothing left unread */
        if (!used[i] && !buffer_name(file->tensors[i].name))
            st = rp_fail(err, RP_ERR_INVALID,
                         "%s: tensor '%s' has no place in this model (its %d tensors run from %s "
                         "to %s)",
                         name, file->tensors[i].name, ns, NAMES[names][EMB], NAMES[names][OUT]);
    free(s), free(used);
    return st;
}

rp_status rp_llama_export(const rp_model *m, const float *params, rp_llama_names names,
                          rp_weights **out, rp_error *err) {
    *out = NULL;
    slot *s = malloc(sizeof *s * (size_t)MAX_SLOTS(m));
    int ns = 0;
    rp_status st = s ? layout(m, names, s, &ns, err)
                     : rp_fail(err, RP_ERR_NOMEM, "out of memory");
    rp_weights *w = st ? NULL : calloc(1, sizeof *w);
    if (!st && (!w || !(w->tensors = calloc((size_t)ns, sizeof(rp_tensor)))))
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
    const rp_layer *head = st ? NULL : &m->layers[m->layers[m->num_layers - 1].inputs[0]];
    for (int k = 0; !st && k < ns; k++) {
        /* Hugging Face writes no lm_head for a tied model (its loader ties
        ** it again); Meta's layout has no tied head, and keeps the copy */
        if (names == RP_LLAMA_HF && head->tie && s[k].var == head->first_var)
            continue;
        size_t cols;
        const float *src = slot_data(m, (float *)params, &s[k], &cols);
        rp_tensor *t = &w->tensors[w->num_tensors];
        snprintf(t->name, RP_NAME_MAX, "%s", s[k].name);
        t->groups = 1;
        t->shape = m->vars[s[k].var].shape;
        t->shape.dim[0] = s[k].rows;
        if (!(t->data = malloc(sizeof(float) * (size_t)s[k].rows * cols))) {
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
            break;
        }
        w->num_tensors++;
        copy_rows((float *)src, t->data, &s[k], cols, false);
    }
    free(s);
    if (st) {
        rp_weights_free(w);
        return st;
    }
    *out = w;
    return RP_OK;
}
