/*
** llm.c's GPT-2 checkpoint format, to start repipe, llm.c and PyTorch from
** the same weights. llm.c stacks each block tensor over the blocks (all the
** ln1 weights, then all the ln1 biases, ...); repipe keeps a block's twelve
** tensors together. Both store matrices as (out, in).
*/
#include <stdlib.h>
#include <string.h>

#include "../spec/block_vars.h"
#include "repipe/weights.h"

#define LLMC_MAGIC 20240326
#define LLMC_HEADER 1024 /* bytes: 256 int32 */

/* The model's llm.c shape: L blocks of C features and NH heads, V tokens, T
** positions; the error names what does not fit. */
static rp_status llmc_shape(const rp_model *m, int *L, int *C, int *NH, int *V, int *T,
                            rp_error *err) {
    int n = m->num_layers, nb = n - 5;
    const rp_layer *ly = m->layers;
    const char *why = NULL;
    if (nb < 1 || ly[0].type != RP_LAYER_EMBEDDING ||
        ly[1].type != RP_LAYER_POSITION_EMBEDDING)
        why = "it must begin with embedding V C and position_embedding";
    for (int b = 0; !why && b < nb; b++) {
        const rp_layer *B = &ly[2 + b];
        if (B->type != RP_LAYER_TRANSFORMER_BLOCK || B->mlp != 4 || B->gelu_erf ||
            B->heads != ly[2].heads)
            why = "layers 2 .. n-4 must be transformer_blocks with the same heads, mlp=4 and "
                  "GELU's tanh form";
    }
    if (!why && (ly[n - 3].type != RP_LAYER_LAYERNORM || ly[n - 2].type != RP_LAYER_LINEAR ||
                 ly[n - 2].bias || ly[n - 2].tie != 1 || ly[n - 1].type != RP_LAYER_SOFTMAX_CE))
        why = "it must end with layernorm, linear V bias=false tie=0 and softmax_cross_entropy";
    if (why)
        return rp_fail(err, RP_ERR_INVALID, "not llm.c's GPT-2: %s", why);
    *L = nb, *C = ly[0].dim, *NH = ly[2].heads, *V = ly[0].vocab, *T = ly[1].in.dim[0];
    return RP_OK;
}

/* Where the model keeps block b's tensor k, and its size. */
static float *block_var(const rp_model *m, float *params, int b, int k, size_t *count) {
    const rp_variable *v = &m->vars[m->layers[2 + b].first_var + k];
    *count = v->count;
    return params + v->offset;
}

/* Walks llm.c's tensor order, copying between its floats (f) and params. */
static void walk(const rp_model *m, float *params, float *f, int L, int C, int T, int V,
                 int maxT, int Vp, bool to_params) {
#define MOVE(dst_params, n)                                                                    \
    do {                                                                                       \
        if (to_params)                                                                         \
            memcpy(dst_params, f, sizeof(float) * (n));                                        \
        else                                                                                   \
            memcpy(f, dst_params, sizeof(float) * (n));                                        \
    } while (0)
    const rp_layer *ly = m->layers;
    int n = m->num_layers;
    float *wte = params + m->vars[ly[0].first_var].offset;
    MOVE(wte, (size_t)V * C); /* the padded rows past V are not the model's */
    f += (size_t)Vp * C;
    MOVE(params + m->vars[ly[1].first_var].offset, (size_t)T * C);
    f += (size_t)maxT * C;
    for (int k = 0; k < RPI_BLOCK_VARS; k++)
        for (int b = 0; b < L; b++) {
            size_t count;
            float *p = block_var(m, params, b, k, &count);
            MOVE(p, count);
            f += count;
        }
    MOVE(params + m->vars[ly[n - 3].first_var].offset, (size_t)2 * C); /* lnf weight, bias */
    if (to_params) /* the head: the embedding's table again */
        memcpy(params + m->vars[ly[n - 2].first_var].offset, wte, sizeof(float) * V * C);
#undef MOVE
}

rp_status rp_llmc_import(const rp_model *m, const unsigned char *data, size_t len,
                         const char *name, float *params, rp_error *err) {
    int L, C, NH, V, T;
    rp_status st = llmc_shape(m, &L, &C, &NH, &V, &T, err);
    if (st)
        return st;
    if (len < LLMC_HEADER)
        return rp_fail(err, RP_ERR_PARSE, "%s: %zu bytes, less than llm.c's 1024-byte header",
                       name, len);
    int32_t h[8];
    memcpy(h, data, sizeof h);
    if (h[0] != LLMC_MAGIC || h[1] != 3)
        return rp_fail(err, RP_ERR_PARSE,
                       "%s: not an llm.c float32 checkpoint (magic %d, version %d; expected %d, 3)",
                       name, h[0], h[1], LLMC_MAGIC);
    int maxT = h[2], hV = h[3], hL = h[4], hNH = h[5], hC = h[6], Vp = h[7];
    if (hL != L || hNH != NH || hC != C || hV != V || maxT < T || Vp < V || maxT > (1 << 20) ||
        Vp > (1 << 24))
        return rp_fail(err, RP_ERR_INVALID,
                       "%s: llm.c's model has L %d, NH %d, C %d, V %d (padded %d), maxT %d; this "
                       "one L %d, NH %d, C %d, V %d, T %d",
                       name, hL, hNH, hC, hV, Vp, maxT, L, NH, C, V, T);
    size_t floats = (size_t)(Vp + maxT) * C + (size_t)L * (12 * (size_t)C * C + 13 * (size_t)C) +
                    2 * (size_t)C;
    if ((len - LLMC_HEADER) / sizeof(float) != floats || (len - LLMC_HEADER) % sizeof(float))
        return rp_fail(err, RP_ERR_PARSE, "%s: %zu bytes of tensors, expected %zu floats", name,
                       len - LLMC_HEADER, floats);
    float *f = malloc(sizeof(float) * floats);
    if (!f)
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name);
    memcpy(f, data + LLMC_HEADER, sizeof(float) * floats); /* aligned for the copies */
    walk(m, params, f, L, C, T, V, maxT, Vp, true);
    free(f);
    return RP_OK;
}

rp_status rp_llmc_export(const rp_model *m, const float *params, unsigned char **out,
                         size_t *len, rp_error *err) {
    int L, C, NH, V, T;
    rp_status st = llmc_shape(m, &L, &C, &NH, &V, &T, err);
    if (st)
        return st;
    size_t floats = (size_t)(V + T) * C + (size_t)L * (12 * (size_t)C * C + 13 * (size_t)C) +
                    2 * (size_t)C;
    unsigned char *b = calloc(1, LLMC_HEADER + sizeof(float) * floats);
    float *f = malloc(sizeof(float) * floats);
    if (!b || !f) {
        free(b), free(f);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for an llm.c checkpoint");
    }
    int32_t h[8] = {LLMC_MAGIC, 3, T, V, L, NH, C, V};
    memcpy(b, h, sizeof h);
    walk(m, (float *)params, f, L, C, T, V, T, V, false);
    memcpy(b + LLMC_HEADER, f, sizeof(float) * floats);
    free(f);
    *out = b;
    *len = LLMC_HEADER + sizeof(float) * floats;
    return RP_OK;
}
