/*
** Tensor parallelism, Megatron-LM's way (Shoeybi et al., 2019): what one
** rank of a tensor group holds of a model.
**
** The split is found in the graph, not declared: an attention reads a fused
** Q, K, V linear and is read by one linear; an MLP is a linear, an
** activation (or SwiGLU's silu and its gate's mul) and a linear. The first
** linears of each pattern are split by rows of their weight (output
** features), so that each rank computes a slice of the attention's heads or
** of the MLP's width from the whole input; the last linear by columns
** (input features), so that each rank's product is a partial sum of the
** whole output, which the forward all-reduces. In backward the conjugate:
** the split linears' common input gets a partial gradient on every rank,
** all-reduced before the layer that made it runs backward. Between those
** points nothing is exchanged, and everything outside them is whole on
** every rank and computed alike, bit for bit. A transformer_block holds the
** same pattern inside itself, and splits its own variables the same way
** (layers_block.c makes its all-reduces).
**
** A fused Q, K, V weight is Q's rows, then K's, then V's; a rank takes
** heads / t query heads and kv_heads / t key and value heads, three runs of
** rows, so that each of its query heads finds its shared key and value head
** on the same rank (grouped-query attention groups consecutive heads).
**
** The vocabulary (RP_TP_VOCAB): an embedding's table is split by rows, each
** rank looking up the tokens it holds and writing zeros for the others, so
** that the all-reduce of the lookups is the whole lookup, exactly (one
** value and zeros). The head before the loss is split by its output rows,
** the same rows as its tied embedding's, and the loss combines the ranks'
** scores without gathering them (layers_act.c). Shares differ by a row at
** most, so no vocabulary needs padding.
*/
#include <stdlib.h>
#include <string.h>

#include "block_vars.h"
#include "spec_impl.h"

enum { WHOLE, COLUMNS, QKV, HEADS, ROWS, SPLIT, BLOCK, VOCAB, VOCAB_HEAD, VOCAB_LOSS };

typedef struct split_ctx {
    const rp_model *m;
    int t;
    unsigned flags;
    int *role;
    int *readers; /* readers of each tensor t, at [t + 1] */
    rp_error *err;
} split_ctx;

static bool is_act(rp_layer_type ty) {
    return ty == RP_LAYER_SILU || ty == RP_LAYER_GELU || ty == RP_LAYER_RELU;
}

/* The one layer that reads tensor l, or -1 when it has none or several. */
static int only_reader(const split_ctx *c, int l) {
    if (c->readers[l + 1] != 1)
        return -1;
    for (int r = l + 1; r < c->m->num_layers; r++)
        for (int i = 0; i < c->m->layers[r].num_inputs; i++)
            if (c->m->layers[r].inputs[i] == l)
                return r;
    return -1;
}

/* A linear that may be split: unassigned, its own weight (no tie). */
static bool free_linear(const split_ctx *c, int l) {
    return l >= 0 && c->role[l] == WHOLE && c->m->layers[l].type == RP_LAYER_LINEAR &&
           !c->m->layers[l].tie;
}

static rp_status not_divisible(const split_ctx *c, const rp_layer *L, const char *what, int n) {
    return rp_fail(c->err, RP_ERR_INVALID,
                   "tensor_parallel %d: line %d (%s) has %d %s, not a multiple of %d", c->t,
                   L->line, rp_layer_name(L->type), n, what, c->t);
}

/* The MLP or gate feeding layer l (a mul, or an activation) through linears
** whose only reader it is; l's one reader is the linear split by columns. */
static rp_status find_mlp(split_ctx *c, int l) {
    const rp_model *m = c->m;
    const rp_layer *L = &m->layers[l];
    int out = only_reader(c, l), cols[2], acts[2], n = 0;
    if (!free_linear(c, out) || c->role[l] != WHOLE)
        return RP_OK;
    if (L->type == RP_LAYER_MUL) {
        if (L->num_inputs != 2)
            return RP_OK;
        for (int i = 0; i < 2; i++) {
            int x = L->inputs[i], a = -1;
            if (x >= 0 && is_act(m->layers[x].type) && only_reader(c, x) == l &&
                c->role[x] == WHOLE)
                a = x, x = m->layers[x].inputs[0];
            if (!free_linear(c, x) || only_reader(c, x) != (a >= 0 ? a : l))
                return RP_OK;
            cols[n] = x, acts[n++] = a;
        }
    } else {
        int x = L->inputs[0];
        if (!free_linear(c, x) || only_reader(c, x) != l)
            return RP_OK;
        cols[n] = x, acts[n++] = -1;
    }
    for (int i = 0; i < n; i++)
        if (m->layers[cols[i]].units % c->t)
            return not_divisible(c, &m->layers[cols[i]], "output features", m->layers[cols[i]].units);
    for (int i = 0; i < n; i++) {
        c->role[cols[i]] = COLUMNS;
        if (acts[i] >= 0)
            c->role[acts[i]] = SPLIT;
    }
    c->role[l] = SPLIT;
    c->role[out] = ROWS;
    return RP_OK;
}

/* The vocabulary: the head (a linear read by the loss alone, whose input
** it alone reads, so that the input's gradient sums the ranks' parts once)
** and the loss, then every embedding but one whose tied head stays whole. */
static void find_vocab(split_ctx *c) {
    const rp_model *m = c->m;
    int ce = m->num_layers - 1, head = ce > 0 ? m->layers[ce].inputs[0] : -1;
    if (head >= 0 && m->layers[ce].type == RP_LAYER_SOFTMAX_CE && c->role[head] == WHOLE &&
        m->layers[head].type == RP_LAYER_LINEAR && only_reader(c, head) == ce &&
        m->layers[head].units >= c->t) {
        int x = m->layers[head].inputs[0];
        if (x < 0 || only_reader(c, x) == head)
            c->role[head] = VOCAB_HEAD, c->role[ce] = VOCAB_LOSS;
    }
    for (int e = 0; e < m->num_layers; e++) {
        if (m->layers[e].type != RP_LAYER_EMBEDDING || m->layers[e].vocab < c->t)
            continue;
        bool ok = true;
        for (int l = 0; l < m->num_layers; l++)
            if (m->layers[l].tie == e + 1 && c->role[l] != VOCAB_HEAD)
                ok = false;
        if (ok)
            c->role[e] = VOCAB;
    }
}

static rp_status find_splits(split_ctx *c) {
    const rp_model *m = c->m;
    rp_status st = RP_OK;
    for (int l = 0; l < m->num_layers && !st; l++) {
        const rp_layer *L = &m->layers[l];
        if (L->type != RP_LAYER_ATTENTION)
            continue;
        int q = L->inputs[0], o = only_reader(c, l);
        if (!free_linear(c, q) || only_reader(c, q) != l || !free_linear(c, o))
            return rp_fail(c->err, RP_ERR_INVALID,
                           "tensor_parallel %d: line %d (attention) must read a linear of its "
                           "own (its fused Q, K, V) and be read by one linear alone, to be "
                           "split", c->t, L->line);
        if (L->heads % c->t)
            return not_divisible(c, L, "query heads", L->heads);
        if (L->kv_heads % c->t)
            return not_divisible(c, L, "key and value heads", L->kv_heads);
        c->role[q] = QKV, c->role[l] = HEADS, c->role[o] = ROWS;
    }
    for (int l = 0; l < m->num_layers && !st; l++)
        if (m->layers[l].type == RP_LAYER_MUL)
            st = find_mlp(c, l);
    for (int l = 0; l < m->num_layers && !st; l++)
        if (is_act(m->layers[l].type))
            st = find_mlp(c, l);
    for (int l = 0; l < m->num_layers && !st; l++) {
        const rp_layer *L = &m->layers[l];
        if (L->type != RP_LAYER_TRANSFORMER_BLOCK)
            continue;
        if (L->heads % c->t)
            return not_divisible(c, L, "heads", L->heads);
        if (L->mlp * L->in.dim[1] % c->t)
            return not_divisible(c, L, "MLP features", L->mlp * L->in.dim[1]);
        c->role[l] = BLOCK;
    }
    if (!st && (c->flags & RP_TP_VOCAB))
        find_vocab(c);
    return st;
}

/* Index in a whole weight of N rows of row r of rank k's slice; a fused
** Q, K, V weight (heads > 0) is H + 2 K parts of hs rows, of which the
** rank takes H / t, K / t and K / t. */
static size_t whole_row(size_t N, int heads, int kv_heads, int t, int k, size_t r) {
    if (!heads)
        return (size_t)k * (N / t) + r;
    size_t hs = N / (size_t)(heads + 2 * kv_heads);
    size_t hq = hs * heads / t, hk = hs * kv_heads / t;
    if (r < hq)
        return k * hq + r;
    if (r < hq + hk)
        return hs * heads + k * hk + (r - hq);
    return hs * (heads + kv_heads) + k * hk + (r - hq - hk);
}

/* A rank's rows of a whole (N x D) weight: whole row row(r) for its row r. */
typedef struct rows_of {
    size_t N, D;             /* the rank's rows and their width */
    size_t first;            /* a vocabulary share's first row */
    int heads, kv_heads;     /* a fused Q, K, V weight's (else 0) */
    bool by_heads;
} rows_of;

static void map_rows(size_t *p, size_t off, const rows_of *o, size_t whole_N, int t, int k) {
    for (size_t r = 0; r < o->N; r++) {
        size_t wr = o->by_heads ? whole_row(whole_N, o->heads, o->kv_heads, t, k, r)
                                : o->first + r;
        for (size_t e = 0; e < o->D; e++)
            p[r * o->D + e] = off + wr * o->D + e;
    }
}

/* A rank's columns [k Dl, (k + 1) Dl) of a whole (N x Dl t) weight. */
static void map_cols(size_t *p, size_t off, size_t N, size_t Dl, int t, int k) {
    for (size_t r = 0; r < N; r++)
        for (size_t e = 0; e < Dl; e++)
            p[r * Dl + e] = off + r * Dl * t + (size_t)k * Dl + e;
}

/* The map of variable v of a split transformer_block; whether it is split. */
static bool map_block(size_t *p, const rp_variable *mv, const rp_layer *W, int v, int t, int k) {
    int C = W->in.dim[1], M = W->mlp * C, H = W->heads;
    rows_of qkv = {.N = 3 * (size_t)C / t, .heads = H, .kv_heads = H, .by_heads = true};
    rows_of fc = {.N = (size_t)M / t, .first = (size_t)k * (M / t)};
    switch (v) {
    case RPI_BLOCK_QKV_W: qkv.D = C; map_rows(p, mv->offset, &qkv, 3 * (size_t)C, t, k); return true;
    case RPI_BLOCK_QKV_B: qkv.D = 1; map_rows(p, mv->offset, &qkv, 3 * (size_t)C, t, k); return true;
    case RPI_BLOCK_PROJ_W: map_cols(p, mv->offset, C, (size_t)C / t, t, k); return true;
    case RPI_BLOCK_FC_W: fc.D = C; map_rows(p, mv->offset, &fc, M, t, k); return true;
    case RPI_BLOCK_FC_B: fc.D = 1; map_rows(p, mv->offset, &fc, M, t, k); return true;
    case RPI_BLOCK_FCPROJ_W: map_cols(p, mv->offset, C, (size_t)M / t, t, k); return true;
    default:
        for (size_t e = 0; e < mv->count; e++)
            p[e] = mv->offset + e;
        return false;
    }
}

/* Layer l of the rank's model, narrowed for its role. */
static rp_status narrow(split_ctx *c, rp_model *lm, int l, int k) {
    rp_layer *Ly = &lm->layers[l];
    int t = c->t, last = Ly->out.ndim - 1, in_last = Ly->in.ndim - 1;
    int V = c->m->layers[l].type == RP_LAYER_EMBEDDING ? c->m->layers[l].vocab
            : c->role[l] == VOCAB_HEAD                  ? c->m->layers[l].units
                                                        : c->m->layers[l].in.dim[in_last];
    int lo = rp_tensor_share_first(V, t, k), n = rp_tensor_share_first(V, t, k + 1) - lo;
    switch (c->role[l]) {
    case COLUMNS:
    case QKV:
        Ly->units /= t;
        Ly->out.dim[last] /= t;
        break;
    case HEADS:
        if (Ly->p > 0)
            return rp_fail(c->err, RP_ERR_INVALID, "tensor_parallel %d: line %d (attention): "
                           "dropout inside a split attention is not supported", t, Ly->line);
        Ly->heads /= t, Ly->kv_heads /= t;
        Ly->in.dim[in_last] /= t;
        Ly->out.dim[last] /= t;
        break;
    case SPLIT:
        Ly->in.dim[in_last] /= t;
        Ly->out.dim[last] /= t;
        break;
    case ROWS:
        Ly->in.dim[in_last] /= t;
        Ly->tp_reduce |= RP_TP_REDUCE_OUTPUT;
        Ly->tp_skip_bias = Ly->bias && k != 0;
        break;
    case BLOCK: /* its projections' biases: rank 0's */
        Ly->heads /= t;
        Ly->tp_ranks = t;
        Ly->tp_skip_bias = k != 0;
        break;
    case VOCAB:
        Ly->vocab = n;
        Ly->tp_vocab = V, Ly->tp_vocab_first = lo;
        Ly->tp_reduce |= RP_TP_REDUCE_OUTPUT;
        break;
    case VOCAB_HEAD:
        Ly->units = n;
        Ly->out.dim[last] = n;
        break;
    case VOCAB_LOSS:
        Ly->in.dim[in_last] = n;
        Ly->tp_vocab = V, Ly->tp_vocab_first = lo;
        Ly->tp_ranks = t;
        break;
    }
    if ((c->role[l] == COLUMNS || c->role[l] == QKV || c->role[l] == VOCAB_HEAD) &&
        Ly->inputs[0] >= 0)
        lm->layers[Ly->inputs[0]].tp_reduce |= RP_TP_REDUCE_GRAD;
    return RP_OK;
}

/* The map of the rank's variable v into m's parameters; whether it is a
** slice. */
static bool map_var(const split_ctx *c, const rp_model *lm, int v, int k, size_t *p) {
    const rp_model *m = c->m;
    const rp_variable *lv = &lm->vars[v], *mv = &m->vars[v];
    const rp_layer *Ly = &lm->layers[lv->layer];
    int role = c->role[lv->layer], t = c->t;
    bool weight = v == Ly->first_var;
    size_t D = weight ? (size_t)(Ly->type == RP_LAYER_EMBEDDING ? Ly->dim
                                                                : Ly->in.dim[Ly->in.ndim - 1])
                      : 1;
    if (role == COLUMNS || role == QKV) {
        const rp_layer *A = role == QKV ? &m->layers[only_reader(c, lv->layer)] : NULL;
        rows_of o = {.N = (size_t)Ly->units, .D = D, .heads = A ? A->heads : 0,
                     .kv_heads = A ? A->kv_heads : 0, .by_heads = true};
        map_rows(p, mv->offset, &o, (size_t)m->layers[lv->layer].units, t, k);
        return true;
    }
    if (role == ROWS && weight) {
        map_cols(p, mv->offset, (size_t)Ly->units, D, t, k);
        return true;
    }
    if (role == BLOCK)
        return map_block(p, mv, &m->layers[lv->layer], v - Ly->first_var, t, k);
    if (role == VOCAB || role == VOCAB_HEAD) {
        int V = role == VOCAB ? m->layers[lv->layer].vocab : m->layers[lv->layer].units;
        rows_of o = {.N = role == VOCAB ? (size_t)Ly->vocab : (size_t)Ly->units, .D = D,
                     .first = (size_t)rp_tensor_share_first(V, t, k)};
        map_rows(p, mv->offset, &o, (size_t)V, t, k);
        return true;
    }
    for (size_t e = 0; e < lv->count; e++)
        p[e] = mv->offset + e;
    return false;
}

rp_status rp_model_tensor_split(const rp_model *m, int t, int k, unsigned flags, rp_model **out,
                                size_t **map, rp_error *err) {
    *out = NULL, *map = NULL;
    int L = m->num_layers;
    split_ctx c = {m, t, flags, calloc(L, sizeof(int)), calloc(L + 1, sizeof(int)), err};
    rp_model *lm = calloc(1, sizeof *lm);
    rp_status st = RP_OK;
    if (!c.role || !c.readers || !lm) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory for a tensor split of %d layers", L);
        goto done;
    }
    for (int l = 0; l < L; l++)
        for (int i = 0; i < m->layers[l].num_inputs; i++)
            c.readers[m->layers[l].inputs[i] + 1]++;
    if ((st = find_splits(&c)))
        goto done;
    int nsplit = 0;
    for (int l = 0; l < L; l++)
        nsplit += c.role[l] != WHOLE;
    if (t > 1 && !nsplit) {
        st = rp_fail(err, RP_ERR_INVALID,
                     "tensor_parallel %d: the model has nothing to split (an attention, an MLP "
                     "of a linear, an activation or gate and a linear, a transformer_block, or "
                     "a vocabulary)", t);
        goto done;
    }
    /* the split linears' input: every reader of it split too, or its
    ** gradient's all-reduce would count a whole reader's part t times */
    for (int l = 0; l < L; l++) {
        if (c.role[l] != COLUMNS && c.role[l] != QKV)
            continue;
        int x = m->layers[l].inputs[0];
        for (int r = 0; r < L; r++)
            for (int i = 0; i < m->layers[r].num_inputs; i++)
                if (m->layers[r].inputs[i] == x && c.role[r] != COLUMNS && c.role[r] != QKV) {
                    st = rp_fail(err, RP_ERR_INVALID,
                                 "tensor_parallel %d: the input of line %d (linear, split) is "
                                 "read by line %d (%s), which is not split: give the split "
                                 "linears an input of their own",
                                 t, m->layers[l].line, m->layers[r].line,
                                 rp_layer_name(m->layers[r].type));
                    goto done;
                }
    }
    /* the rank's model: the same layers, narrower */
    *lm = *m;
    lm->layers = malloc(sizeof(rp_layer) * L);
    lm->last_reader = malloc(sizeof(int) * (L + 1));
    lm->vars = NULL, lm->num_vars = 0;
    if (!lm->layers || !lm->last_reader) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory for a tensor split of %d layers", L);
        goto done;
    }
    memcpy(lm->layers, m->layers, sizeof(rp_layer) * L);
    memcpy(lm->last_reader, m->last_reader, sizeof(int) * (L + 1));
    for (int l = 0; l < L && t > 1 && !st; l++)
        st = narrow(&c, lm, l, k);
    if (st || (st = rpi_spec_layout(lm, err)))
        goto done;
    if (!(*map = malloc(sizeof(size_t) * (lm->num_params ? lm->num_params : 1)))) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory for the map of %zu parameters",
                     lm->num_params);
        goto done;
    }
    for (int v = 0; v < lm->num_vars; v++)
        lm->vars[v].split = map_var(&c, lm, v, k, *map + lm->vars[v].offset) && t > 1;
    *out = lm;
    lm = NULL;
done:
    free(c.role), free(c.readers);
    rp_model_free(lm);
    if (st) {
        free(*map);
        *map = NULL;
    }
    return st;
}
