/*
** Shape inference of a parsed layer (its output from its inputs, with the
** error that names the line and both shapes) and the layout of the model's
** variables in the flat parameter array.
*/
#include <stdio.h>
#include <stdlib.h>

#include "block_vars.h"
#include "spec_impl.h"

static rp_status shape_error(pctx *c, const rp_layer *L, const char *need) {
    char buf[64];
    return rp_fail(c->err, RP_ERR_INVALID, "%s:%d: %s needs %s, but its input has shape %s",
                   c->name, c->line, rp_layer_name(L->type), need,
                   rp_shape_to_string(&L->in, buf, sizeof buf));
}

/* linear: its units; a tied weight is an earlier embedding's table. */
static rp_status infer_linear(pctx *c, rp_layer *L, rp_model *m, rp_shape *out) {
    rp_shape in = L->in;
    out->dim[in.ndim - 1] = L->units;
    L->num_vars = L->bias ? 2 : 1;
    if (L->tie) { /* its weight is an embedding's table: V x D */
        int e = L->tie - 1;
        const rp_layer *E = e < m->num_layers ? &m->layers[e] : NULL;
        if (!E || E->type != RP_LAYER_EMBEDDING)
            return rp_fail(c->err, RP_ERR_INVALID,
                           "%s:%d: tie=%d: layer %d is not an embedding before this layer",
                           c->name, c->line, e, e);
        if (E->vocab != L->units || E->dim != in.dim[in.ndim - 1])
            return rp_fail(c->err, RP_ERR_INVALID,
                           "%s:%d: tie=%d: the embedding's table is %d x %d, but this "
                           "layer's weight is %d x %d",
                           c->name, c->line, e, E->vocab, E->dim, L->units,
                           in.dim[in.ndim - 1]);
    }
    return RP_OK;
}

/* conv2d and the poolings: channels x height x width, by kernel, stride
** and padding (conv2d's channels by its groups). */
static rp_status infer_spatial(pctx *c, rp_layer *L, rp_shape *out) {
    rp_shape in = L->in;
    if (in.ndim != 3)
        return shape_error(c, L, "a 3-dimensional input (channels x height x width)");
    if (L->type == RP_LAYER_CONV2D && (in.dim[0] % L->groups || L->units % L->groups)) {
        char need[96];
        snprintf(need, sizeof need, "input and output channels divisible by its %d groups",
                 L->groups);
        if (L->units % L->groups)
            return rp_fail(c->err, RP_ERR_INVALID,
                           "%s:%d: conv2d: %d output channels are not divisible by its %d "
                           "groups", c->name, c->line, L->units, L->groups);
        return shape_error(c, L, need);
    }
    if (L->type != RP_LAYER_CONV2D && 2 * L->pad > L->kernel)
        return rp_fail(c->err, RP_ERR_INVALID, "%s:%d: %s: pad=%d is more than half its kernel %d",
                       c->name, c->line, rp_layer_name(L->type), L->pad, L->kernel);
    int pad = L->pad;
    int oh = (in.dim[1] + 2 * pad - L->kernel) / L->stride + 1;
    int ow = (in.dim[2] + 2 * pad - L->kernel) / L->stride + 1;
    if (in.dim[1] + 2 * pad < L->kernel || in.dim[2] + 2 * pad < L->kernel) {
        char need[96];
        snprintf(need, sizeof need, "an input of at least %dx%d (kernel %d, padding %d)",
                 L->kernel - 2 * pad, L->kernel - 2 * pad, L->kernel, pad);
        return shape_error(c, L, need);
    }
    out->dim[0] = L->type == RP_LAYER_CONV2D ? L->units : in.dim[0];
    out->dim[1] = oh;
    out->dim[2] = ow;
    L->num_vars = L->type == RP_LAYER_CONV2D ? (L->bias ? 2 : 1) : 0;
    return RP_OK;
}

/* add, mul and concat: inputs of one shape (concat's first dimension
** apart, which it sums). */
static rp_status infer_join(pctx *c, rp_layer *L, rp_model *m, rp_shape *out) {
    rp_shape in = L->in;
    for (int i = 1; i < L->num_inputs; i++) {
        const rp_shape *s = rp_model_tensor_shape(m, L->inputs[i]);
        bool same = s->ndim == in.ndim;
        for (int d = L->type == RP_LAYER_CONCAT; same && d < in.ndim; d++)
            same = s->dim[d] == in.dim[d];
        if (!same) {
            char a[64], b[64];
            return rp_fail(c->err, RP_ERR_INVALID,
                           "%s:%d: %s: input %d has shape %s, input 1 %s (%s)", c->name,
                           c->line, rp_layer_name(L->type), i + 1,
                           rp_shape_to_string(s, a, sizeof a),
                           rp_shape_to_string(&in, b, sizeof b),
                           L->type != RP_LAYER_CONCAT ? "its inputs need one shape"
                                                   : "concat joins along the first "
                                                     "dimension; the others must agree");
        }
        if (L->type == RP_LAYER_CONCAT)
            out->dim[0] += s->dim[0];
    }
    if ((size_t)out->dim[0] > (1u << 28))
        return rp_fail(c->err, RP_ERR_INVALID, "%s:%d: the layer's output is too large",
                       c->name, c->line);
    return RP_OK;
}

/* attention: rows of H + 2 K head-sized parts (Q's heads, K's, V's) in,
** H heads' out. */
static rp_status infer_attention(pctx *c, rp_layer *L, rp_shape *out) {
    rp_shape in = L->in;
    int H = L->heads, K = L->kv_heads, parts = H + 2 * K;
    if (in.ndim != 2)
        return shape_error(c, L, "a 2-dimensional input (positions x fused Q, K, V)");
    if (H % K)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s:%d: attention: %d heads do not share %d key and value heads evenly",
                       c->name, c->line, H, K);
    if (in.dim[1] % parts || (L->rope_theta > 0 && (in.dim[1] / parts) % 2)) {
        char need[128];
        snprintf(need, sizeof need,
                 "features of %d head-sized parts (%d query, %d key, %d value heads)%s",
                 parts, H, K, K, L->rope_theta > 0 ? ", each of even size (rotary pairs)" : "");
        return shape_error(c, L, need);
    }
    out->dim[1] = H * (in.dim[1] / parts);
    return RP_OK;
}

/* moe: features, or positions x features, out as in; a router and three
** weights an expert. */
static rp_status infer_moe(pctx *c, rp_layer *L) {
    rp_shape in = L->in;
    if (in.ndim != 1 && in.ndim != 2)
        return shape_error(c, L, "features, or a 2-dimensional input (positions x features)");
    double C = in.dim[in.ndim - 1];
    if (C * L->experts * (1 + 3.0 * L->ffn) > (double)(1u << 30))
        return shape_error(c, L, "fewer features (its weights would exceed 2^30 floats)");
    L->num_vars = 1 + 3 * L->experts;
    return RP_OK;
}

/* GPT-2's transformer block: positions x features, the features split by
** its heads. */
static rp_status infer_block(pctx *c, rp_layer *L) {
    rp_shape in = L->in;
    if (in.ndim != 2)
        return shape_error(c, L, "a 2-dimensional input (positions x features)");
    if (in.dim[1] % L->heads) {
        char need[96];
        snprintf(need, sizeof need, "features divisible by its %d heads", L->heads);
        return shape_error(c, L, need);
    }
    if ((double)in.dim[1] * in.dim[1] * (3 + 1 + 2 * L->mlp) > (double)(1u << 30))
        return shape_error(c, L, "fewer features (its weights would exceed 2^30 floats)");
    L->num_vars = 12;
    return RP_OK;
}

/* softmax_cross_entropy: class scores, or one row of them per token; a
** target each. */
static rp_status infer_loss(pctx *c, rp_layer *L, rp_model *m, rp_shape *out) {
    rp_shape in = L->in;
    /* class scores, or one row of them per token: a target each */
    if (in.ndim != 1 && in.ndim != 2)
        return shape_error(c, L,
                           "a 1-dimensional input of class scores, or 2-dimensional (tokens "
                           "x classes) (flatten first)");
    if (in.dim[in.ndim - 1] < 2)
        return shape_error(c, L, "at least 2 classes");
    out->ndim = 1;
    out->dim[0] = 1;
    m->num_classes = in.dim[in.ndim - 1];
    m->num_targets = in.ndim == 2 ? in.dim[0] : 1;
    return RP_OK;
}

/* Output shape and parameter count of a layer whose input shape is set. */
rp_status rpi_spec_infer(pctx *c, rp_layer *L, rp_model *m) {
    rp_shape in = L->in, out = in;
    rp_status st = RP_OK;
    switch (L->type) {
    case RP_LAYER_LINEAR: st = infer_linear(c, L, m, &out); break;
    case RP_LAYER_CONV2D:
    case RP_LAYER_MAXPOOL2D:
    case RP_LAYER_AVGPOOL2D: st = infer_spatial(c, L, &out); break;
    case RP_LAYER_ADAPTIVE_AVGPOOL2D:
        if (in.ndim != 3)
            return shape_error(c, L, "a 3-dimensional input (channels x height x width)");
        out.dim[1] = out.dim[2] = L->units;
        break;
    case RP_LAYER_ADD:
    case RP_LAYER_MUL:
    case RP_LAYER_CONCAT: st = infer_join(c, L, m, &out); break;
    case RP_LAYER_FLATTEN:
        out.ndim = 1;
        out.dim[0] = (int)rp_shape_size(&in);
        break;
    case RP_LAYER_LAYERNORM:
        L->num_vars = 2;
        break;
    case RP_LAYER_RMSNORM:
        L->num_vars = 1;
        break;
    case RP_LAYER_ATTENTION: st = infer_attention(c, L, &out); break;
    case RP_LAYER_BATCHNORM2D:
    case RP_LAYER_BATCHNORM1D:
        if (L->type == RP_LAYER_BATCHNORM2D && in.ndim != 3)
            return shape_error(c, L, "a 3-dimensional input (channels x height x width)");
        if (L->type == RP_LAYER_BATCHNORM1D && in.ndim > 2)
            return shape_error(c, L, "features, or (channels x length)");
        L->num_vars = 4; /* weight, bias, running_mean, running_var */
        break;
    case RP_LAYER_EMBEDDING:
        if (in.ndim != 1)
            return shape_error(c, L, "a 1-dimensional input of token ids");
        out.ndim = 2;
        out.dim[0] = in.dim[0];
        out.dim[1] = L->dim;
        L->num_vars = 1;
        break;
    case RP_LAYER_POSITION_EMBEDDING:
        if (in.ndim != 2)
            return shape_error(c, L, "a 2-dimensional input (positions x features)");
        L->num_vars = 1;
        break;
    case RP_LAYER_TRANSFORMER_BLOCK: st = infer_block(c, L); break;
    case RP_LAYER_MOE: st = infer_moe(c, L); break;
    case RP_LAYER_SOFTMAX_CE: st = infer_loss(c, L, m, &out); break;
    default:
        break;
    }
    if (st)
        return st;
    L->out = out;
    return RP_OK;
}

/* Variable v of moe layer l: the router, then each expert's w1 (the gate),
** w3 (up) and w2 (down). */
static void moe_variable(const rp_layer *L, int l, int v, rp_variable *var) {
    static const char *const wn[] = {"w1", "w3", "w2"};
    int e = (v - 1) / 3, k = (v - 1) % 3, C = L->in.dim[L->in.ndim - 1];
    if (v == 0)
        snprintf(var->name, RP_NAME_MAX, "%d.router", l);
    else
        snprintf(var->name, RP_NAME_MAX, "%d.experts.%d.%s", l, e, wn[k]);
    var->shape = v == 0  ? (rp_shape){2, {L->experts, C}}
                 : k < 2 ? (rp_shape){2, {L->ffn, C}}
                         : (rp_shape){2, {C, L->ffn}};
}

/* Variable v of layer l: its name and shape. */
static void variable(const rp_layer *L, int l, int v, rp_variable *var) {
    bool weight = v == 0;
    snprintf(var->name, RP_NAME_MAX, "%d.%s", l, weight ? "weight" : "bias");
    int D = L->in.dim[L->in.ndim - 1];
    switch (L->type) {
    case RP_LAYER_TRANSFORMER_BLOCK:
        snprintf(var->name, RP_NAME_MAX, "%d.%s", l, rpi_block_var_name(v));
        var->shape = rpi_block_var_shape(L, v);
        break;
    case RP_LAYER_LINEAR:
        var->shape = weight ? (rp_shape){2, {L->units, D}} : (rp_shape){1, {L->units}};
        break;
    case RP_LAYER_CONV2D:
        var->shape = weight ? (rp_shape){4, {L->units, L->in.dim[0] / L->groups, L->kernel,
                                             L->kernel}}
                            : (rp_shape){1, {L->units}};
        break;
    case RP_LAYER_LAYERNORM:
    case RP_LAYER_RMSNORM:
        var->shape = (rp_shape){1, {D}};
        break;
    case RP_LAYER_BATCHNORM2D:
    case RP_LAYER_BATCHNORM1D: { /* PyTorch's names for the statistics */
        static const char *const vn[] = {"weight", "bias", "running_mean", "running_var"};
        snprintf(var->name, RP_NAME_MAX, "%d.%s", l, vn[v]);
        var->shape = (rp_shape){1, {L->in.dim[0]}};
        break;
    }
    case RP_LAYER_EMBEDDING:
        var->shape = (rp_shape){2, {L->vocab, L->dim}};
        break;
    case RP_LAYER_POSITION_EMBEDDING:
        var->shape = L->in;
        break;
    case RP_LAYER_MOE:
        moe_variable(L, l, v, var);
        break;
    default:
        break;
    }
}

/* Fills the layers' variables and parameter offsets. */
rp_status rpi_spec_layout(rp_model *m, rp_error *err) {
    int nv = 0;
    for (int l = 0; l < m->num_layers; l++)
        nv += m->layers[l].num_vars;
    m->vars = calloc(nv ? nv : 1, sizeof(rp_variable));
    if (!m->vars)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    size_t off = 0;
    for (int l = 0; l < m->num_layers; l++) {
        rp_layer *L = &m->layers[l];
        L->first_var = m->num_vars;
        L->param_offset = off;
        for (int v = 0; v < L->num_vars; v++) {
            rp_variable *var = &m->vars[m->num_vars++];
            var->layer = l;
            var->offset = off;
            variable(L, l, v, var);
            var->count = rp_shape_size(&var->shape);
            off += var->count;
        }
        L->param_count = off - L->param_offset;
    }
    m->num_params = off;
    return RP_OK;
}
