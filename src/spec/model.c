/*
** The model object: layer names, default initialisation and the
** fingerprint. The spec's parser is spec.c (shapes.c its inference);
** boundaries of the graph are graph.c's.
*/
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../core/util.h"
#include "block_vars.h"
#include "repipe/spec.h"

const char *rp_layer_name(rp_layer_type t) {
    switch (t) {
    case RP_LAYER_LINEAR: return "linear";
    case RP_LAYER_CONV2D: return "conv2d";
    case RP_LAYER_RELU: return "relu";
    case RP_LAYER_GELU: return "gelu";
    case RP_LAYER_MAXPOOL2D: return "maxpool2d";
    case RP_LAYER_FLATTEN: return "flatten";
    case RP_LAYER_DROPOUT: return "dropout";
    case RP_LAYER_LAYERNORM: return "layernorm";
    case RP_LAYER_EMBEDDING: return "embedding";
    case RP_LAYER_SOFTMAX_CE: return "softmax_cross_entropy";
    case RP_LAYER_POSITION_EMBEDDING: return "position_embedding";
    case RP_LAYER_TRANSFORMER_BLOCK: return "transformer_block";
    case RP_LAYER_ADD: return "add";
    case RP_LAYER_CONCAT: return "concat";
    case RP_LAYER_AVGPOOL2D: return "avgpool2d";
    case RP_LAYER_ADAPTIVE_AVGPOOL2D: return "adaptive_avgpool2d";
    case RP_LAYER_SIGMOID: return "sigmoid";
    case RP_LAYER_TANH: return "tanh";
    case RP_LAYER_BATCHNORM2D: return "batchnorm2d";
    case RP_LAYER_BATCHNORM1D: return "batchnorm1d";
    case RP_LAYER_RMSNORM: return "rmsnorm";
    case RP_LAYER_SILU: return "silu";
    case RP_LAYER_MUL: return "mul";
    case RP_LAYER_ATTENTION: return "attention";
    case RP_LAYER_MOE: return "moe";
    }
    return "?";
}

void rp_model_free(rp_model *m) {
    if (!m)
        return;
    free(m->layers);
    free(m->vars);
    free(m->last_reader);
    free(m);
}


/* N(0, sd^2) by Box-Muller from two uniforms of element e's stream */
static double gauss(uint64_t seed, int v, int group, size_t e, double sd) {
    double u1 = rp_uniform(seed, (uint64_t)v, (uint64_t)group, e, 0);
    double u2 = rp_uniform(seed, (uint64_t)v, (uint64_t)group, e, 1);
    return sd * sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

static int blocks_of(const rp_model *m) {
    int n = 0;
    for (int l = 0; l < m->num_layers; l++)
        n += m->layers[l].type == RP_LAYER_TRANSFORMER_BLOCK;
    return n;
}

void rp_model_init_params(const rp_model *m, int first, int last, uint64_t seed,
                          const int *var_group, float *params) {
    size_t base = m->layers[first].param_offset;
    for (int l = first; l < last; l++) {
        const rp_layer *L = &m->layers[l];
        for (int v = 0; v < L->num_vars; v++) {
            int vi = L->first_var + v;
            const rp_variable *var = &m->vars[vi];
            int group = var_group ? var_group[vi] : 0;
            float *p = params + (var->offset - base);
            if (L->type == RP_LAYER_LAYERNORM || L->type == RP_LAYER_RMSNORM) {
                for (size_t e = 0; e < var->count; e++)
                    p[e] = v == 0 ? 1.0f : 0.0f;
            } else if (L->type == RP_LAYER_BATCHNORM2D || L->type == RP_LAYER_BATCHNORM1D) {
                /* weight 1, bias 0, running mean 0, running variance 1 */
                for (size_t e = 0; e < var->count; e++)
                    p[e] = v == 0 || v == 3 ? 1.0f : 0.0f;
            } else if (L->type == RP_LAYER_TRANSFORMER_BLOCK) {
                /* GPT-2's: LayerNorms ones and zeros, biases zero, weights N(0, 0.02^2),
                ** the two projections into the residual stream N(0, (0.02 / sqrt(2 x
                ** blocks))^2) so that the stream's variance does not grow with depth */
                float constant;
                double sd = rpi_block_var_init(v, blocks_of(m), &constant);
                for (size_t e = 0; e < var->count; e++)
                    p[e] = sd > 0 ? (float)gauss(seed, vi, group, e, sd) : constant;
            } else if (L->type == RP_LAYER_EMBEDDING || L->type == RP_LAYER_POSITION_EMBEDDING) {
                /* N(0, std^2) for tokens (1: PyTorch's nn.Embedding); N(0, 0.02^2)
                ** for positions, as GPT-2's */
                double sd = L->type == RP_LAYER_EMBEDDING ? L->std : 0.02;
                for (size_t e = 0; e < var->count; e++)
                    p[e] = (float)gauss(seed, vi, group, e, sd);
            } else if (L->tie && v == 0) {
                /* a tied weight starts as its embedding's table: the same draws */
                const rp_layer *E = &m->layers[L->tie - 1];
                int ve = E->first_var, ge = var_group ? var_group[ve] : 0;
                for (size_t e = 0; e < var->count; e++)
                    p[e] = (float)gauss(seed, ve, ge, e, E->std);
            } else {
                /* fan_in of the layer's weight: all its dimensions but the first (an
                ** moe's variables are each a weight: each its own) */
                const rp_variable *w = &m->vars[L->type == RP_LAYER_MOE ? vi : L->first_var];
                double fan_in = (double)w->count / w->shape.dim[0];
                double bound = 1.0 / sqrt(fan_in);
                for (size_t e = 0; e < var->count; e++)
                    p[e] = (float)((2.0 * rp_uniform(seed, (uint64_t)vi, (uint64_t)group, e, 0) -
                                    1.0) * bound);
            }
        }
    }
}

/* Fields one at a time: a struct's padding is not part of the model. */
static uLong fold(uLong crc, const void *p, size_t n) { return rp_crc32((uint32_t)crc, p, n); }

uint32_t rp_model_fingerprint(const rp_model *m) {
    uLong c = crc32(0L, Z_NULL, 0);
    c = fold(c, &m->num_layers, sizeof m->num_layers);
    for (int i = 0; i < m->num_layers; i++) {
        const rp_layer *l = &m->layers[i];
        int ints[] = {(int)l->type, l->in.ndim, l->out.ndim, l->units, l->kernel, l->stride,
                      l->pad, l->bias, l->vocab, l->dim, l->group_size};
        c = fold(c, ints, sizeof ints);
        if (l->type == RP_LAYER_TRANSFORMER_BLOCK) {
            int block[] = {l->heads, l->mlp, l->gelu_erf};
            c = fold(c, block, sizeof block);
        }
        if (l->tie)
            c = fold(c, &l->tie, sizeof l->tie);
        if (l->groups > 1)
            c = fold(c, &l->groups, sizeof l->groups);
        if (l->type == RP_LAYER_BATCHNORM2D || l->type == RP_LAYER_BATCHNORM1D)
            c = fold(c, &l->momentum, sizeof l->momentum);
        if (l->type == RP_LAYER_ATTENTION) {
            int at[] = {l->heads, l->kv_heads};
            c = fold(c, at, sizeof at);
            c = fold(c, &l->rope_theta, sizeof l->rope_theta);
        }
        if (l->type == RP_LAYER_MOE) {
            int moe[] = {l->experts, l->top_k, l->ffn, l->gate_sigmoid, l->gate_norm};
            c = fold(c, moe, sizeof moe);
            c = fold(c, &l->balance, sizeof l->balance);
        }
        if (l->num_inputs != 1 || l->inputs[0] != i - 1) { /* a graph's edges */
            c = fold(c, &l->num_inputs, sizeof l->num_inputs);
            c = fold(c, l->inputs, sizeof(int) * l->num_inputs);
        }
        if (l->type == RP_LAYER_EMBEDDING && l->std != 1)
            c = fold(c, &l->std, sizeof l->std);
        c = fold(c, l->in.dim, sizeof(int) * l->in.ndim);
        c = fold(c, l->out.dim, sizeof(int) * l->out.ndim);
        c = fold(c, &l->p, sizeof l->p);
        c = fold(c, &l->eps, sizeof l->eps);
    }
    for (int v = 0; v < m->num_vars; v++)
        c = fold(c, m->vars[v].name, strlen(m->vars[v].name) + 1);
    return (uint32_t)c;
}
