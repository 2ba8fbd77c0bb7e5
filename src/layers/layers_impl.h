/*
** Layer kernels (internal). Each layer type has a forward and a backward
** function over plain arrays; rows are samples, each holding the layer's
** per-sample shape contiguously. Backward adds to dw (or, when accumulate
** is false, overwrites it: the first micro-batch of an update needs no
** zeroed gradients) and writes din (when not NULL).
*/
#ifndef REPIPE_LAYERS_IMPL_H
#define REPIPE_LAYERS_IMPL_H

#include <string.h>

#include "repipe/layers.h"
#include "repipe/spec.h"
#include "../spec/block_vars.h"

/* The element-wise loops of these kernels vectorise twice or four times as
** wide on AVX2 and AVX-512, which a portable build may not assume: on
** x86-64 each function marked RP_HOT is compiled once per level and the
** loader picks the one this CPU runs (GNU ifunc). The clones compute the
** same floats: the build contracts no a * b + c into an FMA
** (-ffp-contract=off), and nothing is reassociated. A -march=native build
** needs no clones. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX2__) && \
    !defined(REPIPE_NO_CLONES) /* clang names clones of an extern function apart */
#define RP_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#ifndef RP_HOT
#define RP_HOT
#endif

/* e^x for the element-wise loops: glibc's tanhf and expf are calls the
** compiler cannot vectorise, and tanhf alone took a third of a GPT's step.
** x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 split in two so r is exact to
** float precision), e^r by its Taylor series to r^7 (truncation below
** 2e-8), and 2^n put into the exponent bits: within 2 ulp of expf on
** [-87, 88], the range it is clamped to. 2^n is read from the bits of the
** rounded sum (1.5 x 2^23 + n holds n in its low bits), in unsigned
** arithmetic: a NaN is never converted to an integer (undefined, and a
** diverging run's scores meet it) and stays a NaN, and the loops still
** vectorise, which a test for NaN before a conversion prevented (every
** caller ran a value at a time). Plain float operations, so every clone
** computes the same bits. */
static inline float rpi_expf(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    /* n = x / ln 2 rounded to the nearest integer: adding 1.5 x 2^23 leaves no bits
    ** for a fraction */
    union { float f; uint32_t u; } sum = {.f = x * 1.44269504f + 12582912.0f}, scale;
    float n = sum.f - 12582912.0f;
    float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
              r * (1.0f / 720 + r * (1.0f / 5040)))))));
    scale.u = (sum.u - 0x4B400000u + 127u) << 23; /* n + 127, from 1 to 254 */
    return p * scale.f;
}

/* Row i of a causal attention's scores (p, T wide) to its probabilities:
** softmax over keys 0..i, zeros past them. Each step a loop of its own, so
** that they vectorise in the callers' clones. */
static inline void rpi_causal_softmax_row(float *p, int i, int T) {
    float m = p[0];
    for (int j = 1; j <= i; j++)
        m = p[j] > m ? p[j] : m;
    for (int j = 0; j <= i; j++)
        p[j] = rpi_expf(p[j] - m);
    double sum = 0;
    for (int j = 0; j <= i; j++)
        sum += p[j];
    float inv = (float)(1.0 / sum);
    for (int j = 0; j <= i; j++)
        p[j] *= inv;
    memset(p + i + 1, 0, sizeof(float) * (T - 1 - i));
}

/* Its gradient: d (the probabilities' gradient, row i) to the scores',
** d_j = p_j (d_j - p . d) scale for j <= i, zeros from i + 1 to end. */
static inline void rpi_causal_softmax_back_row(const float *p, float *d, int i, int end,
                                               float scale) {
    double dot = 0;
    for (int j = 0; j <= i; j++)
        dot += (double)p[j] * d[j];
    for (int j = 0; j <= i; j++)
        d[j] = p[j] * (d[j] - (float)dot) * scale;
    memset(d + i + 1, 0, sizeof(float) * (end - 1 - i));
}

typedef struct layer_args {
    const rp_model *m;
    const rp_layer *L;
    int index; /* layer number in the model (keys dropout masks) */
    int B;     /* rows */
    const float *in;          /* the first input */
    const float *const *ins;  /* all L->num_inputs of them (add, concat) */
    float *out;
    const float *w; /* the layer's parameters */
    float *dw;      /* their gradients */
    void *aux;      /* per micro-batch state kept for backward */
    float *stats;   /* batchnorm: the update's statistics slots (NULL: none kept) */
    float *col, *tmp; /* scratch for convolutions */
    struct rpi_conv_accel *accel; /* a convolution's oneDNN kernels (NULL: im2col) */
    void *accel_ws;               /* their workspace, 64-byte aligned */
    const rp_step_ctx *ctx;
    bool accumulate; /* false: dw holds garbage, to be overwritten */
    size_t scratch_limit; /* bytes of col + tmp a product may use (0: no limit) */
    int part;        /* RPI_BACK_*: which half of backward to run */
    float *wstash;   /* what the weights' half reads (rpi_layer_wstash_floats) */
    /* A layer split inside itself calls its tensor group (the net's
    ** rp_net_options.tp_*; NULL calls: no group). */
    void (*tp_allreduce)(void *ctx, float *buf, size_t n);
    void (*tp_allgather)(void *ctx, const float *in, size_t n, float *out);
    void *tp_ctx;
    /* An moe layer's expert-parallel group (rp_net_options.ep_*): its size
    ** (0, 1: none), this member's place, and its all-to-all. */
    int ep_size, ep_rank;
    void (*ep_alltoall)(void *ctx, const float *in, size_t n, float *out);
    void *ep_ctx;
} layer_args;

/* A split backward (zero-bubble schedules) runs a layer's backward in two
** halves: the input's gradient (B), which the previous stage waits for,
** then later the weights' (W), which only the step needs. Each half does
** exactly the arithmetic it does in the whole backward, so the split changes
** no bit. Between the halves the layer's output gradient waits in wstash
** (transformer_block keeps its inner products' too); the layer's input and
** aux stay in the activation set. A layer that does not split (batchnorm,
** whose input gradient needs its weight gradient's sums) runs whole in B. */
enum { RPI_BACK_BOTH = 0, RPI_BACK_INPUT, RPI_BACK_WEIGHT };
bool rpi_layer_splits(const rp_layer *L);
/* Floats a split layer keeps between B and W for B rows (0: it does not split). */
size_t rpi_layer_wstash_floats(const rp_layer *L, int B);
/* The weights' half of transformer_block reads its own wstash; the others
** read their output gradient from it, which the net copies there. */
static inline bool rpi_layer_stashes_itself(const rp_layer *L) {
    return L->type == RP_LAYER_TRANSFORMER_BLOCK;
}

/* Dropout keeps element e of row r with probability 1 - L->p; the decision
** is a function of (seed, update, sample id, layer, e), nothing else. The
** dropout layer and transformer_block's residual branches share it. */
static inline float rpi_dropout_scale(const layer_args *a, int r, size_t e) {
    const rp_step_ctx *c = a->ctx;
    float u = rp_uniform(c->seed, c->update, (uint64_t)c->sample_id[r], (uint64_t)a->index, e);
    return u < a->L->p ? 0.0f : 1.0f / (1.0f - a->L->p);
}

/* Bytes of aux state per micro-batch of B rows. */
size_t rpi_layer_aux_bytes(const rp_layer *L, int B);
/* Floats of scratch (col, tmp) a convolution needs for B rows, tiled to
** fit `limit` bytes (0: no limit). */
void rpi_layer_scratch(const rp_layer *L, int B, size_t limit, size_t *col, size_t *tmp);
/* Bytes of scratch one sample of a convolution needs: the least tile. */
size_t rpi_conv_sample_scratch(const rp_layer *L);

rp_status rpi_layer_forward(const layer_args *a, rp_error *err);
void rpi_layer_backward(const layer_args *a, const float *dout, float *din);

/* The kernels, by file. Forward reads a->in and writes a->out (B rows);
** backward reads dout, adds to a->dw and writes din (when not NULL). */
/* layers_dense.c; the _rows forms act on R rows of plain arrays: a NULL dW
** (or dg) leaves the weights' gradient out, a NULL din the input's */
void rpi_linear_rows(const float *in, float *out, const float *W, const float *b, int R, int D,
                     int N);
void rpi_linear_rows_backward(const float *in, const float *dout, const float *W, float *dW,
                              float *db, float *din, bool accumulate, int R, int D, int N);
void rpi_layernorm_rows(const float *in, float *out, const float *g, const float *b,
                        float *stats, int R, int D, float eps);
void rpi_layernorm_rows_backward(const float *in, const float *dout, const float *g,
                                 const float *stats, float *dg, float *db, float *dx, bool add,
                                 bool accumulate, int R, int D);
void rpi_linear_forward(const layer_args *a);
void rpi_linear_backward(const layer_args *a, const float *dout, float *din);
void rpi_layernorm_forward(const layer_args *a);
void rpi_layernorm_backward(const layer_args *a, const float *dout, float *din);
rp_status rpi_embedding_forward(const layer_args *a, rp_error *err);
void rpi_embedding_backward(const layer_args *a, const float *dout, float *din);
void rpi_position_forward(const layer_args *a);
void rpi_position_backward(const layer_args *a, const float *dout, float *din);
/* layers_conv.c */
void rpi_conv_scratch(const rp_layer *L, int B, size_t limit, size_t *col, size_t *tmp);
void rpi_conv_forward(const layer_args *a);
/* Whether the convolution's lowering keeps only some kernel taps (some
** reach only padding); im2col then beats a direct kernel. */
bool rpi_conv_reduced(const rp_layer *L);
/* Whether the convolution is 1 x 1 at stride 1 without padding on planes
** large enough that im2col runs it as one product a sample, in place. */
bool rpi_conv_pointwise(const rp_layer *L);
/* Such a layer's forward, and backward: the weights' gradient (and the
** bias's sums) where want_w, the input's where din is not NULL
** (layers_pointwise.c). */
void rpi_conv_pointwise_forward(const layer_args *a);
void rpi_conv_pointwise_backward(const layer_args *a, const float *dout, float *din,
                                 bool want_w);
/* Whether a direct kernel (oneDNN's) is ahead of im2col for the layer at
** batch B, by the rule layers_conv.c measures, its lowering keeping every
** tap (where it does not, im2col is ahead: rpi_conv_reduced). */
bool rpi_conv_direct(const rp_layer *L, int B);

/* A convolution's kernels from oneDNN for batches of B (layers_dnnl.c):
** NULL where oneDNN is not there, refuses the shape, or the lowering is
** reduced; *ws_bytes the workspace they need. The forward and backward
** return false, touching nothing, where the call is not theirs to make (a
** batch other than B): im2col runs instead. */
typedef struct rpi_conv_accel rpi_conv_accel;
bool rpi_conv_accel_wanted(const rp_layer *L);
rpi_conv_accel *rpi_conv_accel_create(const rp_layer *L, int B, size_t *ws_bytes);
void rpi_conv_accel_free(rpi_conv_accel *c);
bool rpi_conv_accel_forward(rpi_conv_accel *c, const layer_args *a);
bool rpi_conv_accel_backward(rpi_conv_accel *c, const layer_args *a, const float *dout,
                             float *din);
void rpi_conv_backward(const layer_args *a, const float *dout, float *din);
void rpi_maxpool_forward(const layer_args *a);
void rpi_maxpool_backward(const layer_args *a, const float *dout, float *din);
/* avgpool2d and adaptive_avgpool2d */
void rpi_avgpool_forward(const layer_args *a);
void rpi_avgpool_backward(const layer_args *a, const float *dout, float *din);
/* layers_act.c */
void rpi_relu_forward(const float *x, float *y, size_t n);
void rpi_relu_backward(const float *x, const float *dy, float *dx, size_t n);
void rpi_gelu_forward(const float *x, float *y, size_t n);
void rpi_gelu_backward(const float *x, const float *dy, float *dx, size_t n);
/* dropout's mask applied to in (forward: the input; backward: dout) */
void rpi_dropout_apply(const layer_args *a, const float *in, float *out);
rp_status rpi_softmax_ce_forward(const layer_args *a, rp_error *err);
void rpi_softmax_ce_backward(const layer_args *a, float *din);
void rpi_sigmoid_forward(const float *x, float *y, size_t n);
void rpi_sigmoid_backward(const float *y, const float *dy, float *dx, size_t n);
void rpi_tanh_forward(const float *x, float *y, size_t n);
void rpi_tanh_backward(const float *y, const float *dy, float *dx, size_t n);
/* add and concat read a->ins; their backward is the net's, which sums a
** fan-out's gradients: concat's gives input k's part of dout */
void rpi_add_forward(const layer_args *a);
/* mul: ins[0] x ins[1]; the gradient of input k is dout times the other */
void rpi_mul_forward(const layer_args *a);
void rpi_mul_backward(const layer_args *a, int k, const float *dout, float *din);
void rpi_silu_forward(const float *x, float *y, size_t n);
void rpi_silu_backward(const float *x, const float *dy, float *dx, size_t n);
void rpi_concat_forward(const layer_args *a);
void rpi_concat_backward(const layer_args *a, int k, const float *dout, float *din, bool add);
/* layers_attn.c: attention (grouped-query, rotary) */
size_t rpi_attention_aux_bytes(const rp_layer *L, int B);
size_t rpi_attention_scratch(const rp_layer *L);
void rpi_attention_forward(const layer_args *a);
void rpi_attention_backward(const layer_args *a, const float *dout, float *din);
/* layers_norm.c: batchnorm1d and batchnorm2d */
rp_status rpi_batchnorm_forward(const layer_args *a, rp_error *err);
void rpi_batchnorm_backward(const layer_args *a, const float *dout, float *din);
void rpi_rmsnorm_forward(const layer_args *a);
void rpi_rmsnorm_backward(const layer_args *a, const float *dout, float *din);
void rpi_gelu_tanh_forward(const float *x, float *y, size_t n);
void rpi_gelu_tanh_backward(const float *x, const float *dy, float *dx, size_t n);
/* layers_block.c: transformer_block (its variables: ../spec/block_vars.h) */
size_t rpi_block_aux_bytes(const rp_layer *L, int B);
size_t rpi_block_wstash_floats(const rp_layer *L, int B);
size_t rpi_block_scratch(const rp_layer *L, int B);
void rpi_block_forward(const layer_args *a);
void rpi_block_backward(const layer_args *a, const float *dout, float *din);

/* layers_moe.c: a mixture of experts. The router's steps in double
** precision on R tokens, samples of T: the scores s (R x E) to u (in place
** allowed), each token's top_k experts best first and their gates; the
** balance loss of the R / T samples (their sum); the gradient of the scores
** from the gates' (R x top_k) and the balance loss's weight. */
size_t rpi_moe_aux_bytes(const rp_layer *L, int B, int ep_size);
size_t rpi_moe_scratch(const rp_layer *L, int B, int ep_size);
void rpi_moe_route(const rp_layer *L, const double *s, size_t R, double *u, int *chosen,
                   double *gate);
double rpi_moe_balance_loss(const rp_layer *L, const double *u, const int *chosen, size_t R,
                            int T);
void rpi_moe_route_backward(const rp_layer *L, const double *u, const int *chosen,
                            const double *gate, const double *dgate, double weight, size_t R,
                            int T, double *ds);
void rpi_moe_forward(const layer_args *a);
void rpi_moe_backward(const layer_args *a, const float *dout, float *din);

#endif /* REPIPE_LAYERS_IMPL_H */
