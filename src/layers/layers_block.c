/*
** transformer_block: GPT-2's pre-LayerNorm block on a (T x C) sample,
**
**     x1  = x  + drop(proj(attention(LN1(x))))
**     out = x1 + drop(fc_proj(gelu(fc(LN2(x1)))))
**
** with causal multi-head attention over a fused QKV projection (biases on
** every projection), scores scaled by 1/sqrt(C/H), LayerNorm eps from the
** layer (1e-5), and the MLP mlp x C wide. As one layer it is one unit of
** layers_per_stage, the way pipeline frameworks cut transformers.
**
** Every product is one BLAS call over all B x T rows, or per (sample,
** head) for attention, reading Q, K and V in place through a leading
** dimension of 3C. Forward keeps what backward needs in aux; with
** recomputation the block is a segment of its own and aux is rebuilt.
**
** Dropout acts on the two residual branches (GPT-2's resid_pdrop); element
** e of branch k of a sample is kept by the same counter-based rule as the
** dropout layer, keyed by element k x T x C + e.
**
** Split over a tensor group of t (tensor_split.c), a rank holds heads / t
** heads (the attention is A = C / t wide) and M / t of the MLP: the rows of
** qkv and fc, the columns of proj and fc_proj. Each of the two projections
** back to C then gives a partial sum, all-reduced over the group before the
** residual (rank 0 adds the bias), and in backward each LayerNorm's output
** gradient is a partial sum, all-reduced before the LayerNorm: two
** all-reduces each way, as Megatron-LM's block.
*/
#include <math.h>
#include <string.h>

#include "../core/blas.h"
#include "layers_impl.h"

/* The tensor group a block is split over (1: whole). */
static inline int ranks_of(const rp_layer *L) { return L->tp_ranks > 1 ? L->tp_ranks : 1; }

/* Where a micro-batch's parts live in aux (floats from its start), R = B x T
** rows; H heads of hs make the attention A wide (C, or C / t split), and
** the MLP is M wide (mlp x C, or its share of it). */
typedef struct block_layout {
    int T, C, H, hs, A, M, R, t;
    size_t ln1, st1, qkv, prob, att, x1, ln2, st2, h, gh, end;
} block_layout;

static block_layout layout(const rp_layer *L, int B) {
    block_layout o;
    o.t = ranks_of(L);
    o.T = L->in.dim[0], o.C = L->in.dim[1], o.H = L->heads;
    o.hs = o.C / (o.H * o.t), o.A = o.H * o.hs, o.M = L->mlp * o.C / o.t, o.R = B * o.T;
    size_t R = (size_t)o.R, C = (size_t)o.C, A = (size_t)o.A;
    o.ln1 = 0;                                     /* LN1(x): R x C */
    o.st1 = o.ln1 + R * C;                         /* its row statistics: R x 2 */
    o.qkv = o.st1 + 2 * R;                         /* R x 3A */
    o.prob = o.qkv + 3 * R * A;                    /* attention: B x H x T x T */
    o.att = o.prob + (size_t)B * o.H * o.T * o.T;  /* heads side by side: R x A */
    o.x1 = o.att + R * A;                          /* the residual after attention */
    o.ln2 = o.x1 + R * C;
    o.st2 = o.ln2 + R * C;
    o.h = o.st2 + 2 * R;                           /* fc's output: R x M */
    o.gh = o.h + R * (size_t)o.M;                  /* gelu(h) */
    o.end = o.gh + R * (size_t)o.M;
    return o;
}

size_t rpi_block_aux_bytes(const rp_layer *L, int B) { return sizeof(float) * layout(L, B).end; }

/* Backward's gradients: dM (R x M), then three of R x C (the residual
** stream's, a branch's, LN's input's), attention's (R x A), dqkv (R x 3A)
** and one T x T matrix. */
size_t rpi_block_scratch(const rp_layer *L, int B) {
    block_layout o = layout(L, B);
    return (size_t)o.R * (o.M + 3 * (size_t)o.C + 4 * (size_t)o.A) + (size_t)o.T * o.T;
}

/* A split block's partial sums (R x C), summed over its tensor group. */
static void group_sum(const layer_args *a, const block_layout *o, float *x) {
    if (o->t > 1 && a->tp_allreduce)
        a->tp_allreduce(a->tp_ctx, x, (size_t)o->R * o->C);
}

/* y = x + drop_k(b): branch k's dropout of sample r's elements, as the
** dropout layer draws them; y may be b. */
RP_HOT
static void residual(const layer_args *a, int k, const float *x, const float *b, float *y) {
    size_t n = rp_shape_size(&a->L->in);
    bool drop = a->ctx->training && a->L->p > 0;
    for (int r = 0; r < a->B; r++)
        for (size_t e = 0; e < n; e++) {
            size_t i = (size_t)r * n + e;
            y[i] = x[i] + (drop ? b[i] * rpi_dropout_scale(a, r, k * n + e) : b[i]);
        }
}

/* dy = drop_k(dy) in place, the mask of residual() */
RP_HOT
static void residual_back(const layer_args *a, int k, float *dy) {
    if (!a->ctx->training || a->L->p == 0)
        return;
    size_t n = rp_shape_size(&a->L->in);
    for (int r = 0; r < a->B; r++)
        for (size_t e = 0; e < n; e++)
            dy[(size_t)r * n + e] *= rpi_dropout_scale(a, r, k * n + e);
}

static void gelu(const rp_layer *L, const float *x, float *y, size_t n) {
    if (L->gelu_erf)
        rpi_gelu_forward(x, y, n);
    else
        rpi_gelu_tanh_forward(x, y, n);
}

static void gelu_back(const rp_layer *L, const float *x, float *d, size_t n) {
    if (L->gelu_erf)
        rpi_gelu_backward(x, d, d, n);
    else
        rpi_gelu_tanh_backward(x, d, d, n);
}

/* Attention is causal: row i of the scores needs keys 0..i only. Rows are
** taken in blocks of ROWS, and a block's products stop at its last row's
** key, which skips 3/8 of the products at T = 4 x ROWS. */
#define ROWS 64

/* Causal attention of sample b, head h: P = softmax(Q K^T / sqrt(hs)) with
** P[i][j] = 0 for j > i, then att = P V. */
RP_HOT
static void attention(const block_layout *o, const float *qkv, float *P, float *att) {
    int T = o->T, C3 = 3 * o->A;
    float scale = 1.0f / sqrtf((float)o->hs);
    for (int r0 = 0; r0 < T; r0 += ROWS) {
        int r1 = r0 + ROWS < T ? r0 + ROWS : T, n = r1 - r0;
        float *Pb = P + (size_t)r0 * T;
        rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, r1, o->hs, scale,
                    qkv + (size_t)r0 * C3, C3, qkv + o->A, C3, 0.0f, Pb, T);
        for (int i = r0; i < r1; i++)
            rpi_causal_softmax_row(P + (size_t)i * T, i, T);
        rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, o->hs, r1, 1.0f, Pb, T,
                    qkv + 2 * o->A, C3, 0.0f, att + (size_t)r0 * o->A, o->A);
    }
}

/* The gradients of one (sample, head): from datt (T x hs, ld A) into dqkv
** (T x 3A, this head's columns of Q, K, V); dS is T x T scratch. */
static void attention_back(const block_layout *o, const float *qkv, const float *P,
                           const float *datt, float *dqkv, float *dS) {
    int T = o->T, C3 = 3 * o->A, hs = o->hs, A = o->A;
    float scale = 1.0f / sqrtf((float)hs);
    for (int r0 = 0; r0 < T; r0 += ROWS) {
        int r1 = r0 + ROWS < T ? r0 + ROWS : T, n = r1 - r0;
        const float *Pb = P + (size_t)r0 * T, *db = datt + (size_t)r0 * A;
        float *dSb = dS + (size_t)r0 * T;
        /* dP = datt V^T; dV (keys 0..r1) += P^T datt, the first block writing */
        rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, r1, hs, 1.0f, db, A,
                    qkv + 2 * A, C3, 0.0f, dSb, T);
        if (r0 == 0 && r1 < T) /* keys past the first block: their first sum comes later */
            for (int j = r1; j < T; j++)
                memset(dqkv + (size_t)j * C3 + A, 0, sizeof(float) * hs),
                    memset(dqkv + (size_t)j * C3 + 2 * A, 0, sizeof(float) * hs);
        rpi_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, n, 1.0f, Pb, T, db, A,
                    r0 ? 1.0f : 0.0f, dqkv + 2 * A, C3);
        /* softmax backward, row by row: dS = P (dP - sum_j P dP), times the scale */
        for (int i = r0; i < r1; i++)
            rpi_causal_softmax_back_row(P + (size_t)i * T, dS + (size_t)i * T, i, r1, scale);
        /* dQ = dS K; dK (keys 0..r1) += dS^T Q */
        rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hs, r1, 1.0f, dSb, T,
                    qkv + A, C3, 0.0f, dqkv + (size_t)r0 * C3, C3);
        rpi_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, n, 1.0f, dSb, T,
                    qkv + (size_t)r0 * C3, C3, r0 ? 1.0f : 0.0f, dqkv + A, C3);
    }
}

/* The block's variables within its parameter (or gradient) slice. */
static void var_ptrs(const rp_layer *L, float *base, float *p[RPI_BLOCK_VARS]) {
    size_t at = 0;
    for (int v = 0; v < RPI_BLOCK_VARS; v++) {
        rp_shape s = rpi_block_var_shape(L, v);
        p[v] = base + at;
        at += rp_shape_size(&s);
    }
}

void rpi_block_forward(const layer_args *a) {
    const rp_layer *L = a->L;
    block_layout o = layout(L, a->B);
    float *w[RPI_BLOCK_VARS], *aux = a->aux;
    var_ptrs(L, (float *)a->w, w);
    int R = o.R, C = o.C, T = o.T, A = o.A;
    bool bias = !L->tp_skip_bias; /* the projections' biases: one rank of a group adds them */
    rpi_layernorm_rows(a->in, aux + o.ln1, w[RPI_BLOCK_LN1_W], w[RPI_BLOCK_LN1_B], aux + o.st1, R,
                       C, L->eps);
    rpi_linear_rows(aux + o.ln1, aux + o.qkv, w[RPI_BLOCK_QKV_W], w[RPI_BLOCK_QKV_B], R, C, 3 * A);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < o.H; h++)
            attention(&o, aux + o.qkv + (size_t)b * T * 3 * A + (size_t)h * o.hs,
                      aux + o.prob + ((size_t)b * o.H + h) * T * T,
                      aux + o.att + (size_t)b * T * A + (size_t)h * o.hs);
    /* the projection lands in out, then joins the residual stream */
    rpi_linear_rows(aux + o.att, a->out, w[RPI_BLOCK_PROJ_W], bias ? w[RPI_BLOCK_PROJ_B] : NULL,
                    R, A, C);
    group_sum(a, &o, a->out);
    residual(a, 0, a->in, a->out, aux + o.x1);
    rpi_layernorm_rows(aux + o.x1, aux + o.ln2, w[RPI_BLOCK_LN2_W], w[RPI_BLOCK_LN2_B],
                       aux + o.st2, R, C, L->eps);
    rpi_linear_rows(aux + o.ln2, aux + o.h, w[RPI_BLOCK_FC_W], w[RPI_BLOCK_FC_B], R, C, o.M);
    gelu(L, aux + o.h, aux + o.gh, (size_t)R * o.M);
    rpi_linear_rows(aux + o.gh, a->out, w[RPI_BLOCK_FCPROJ_W],
                    bias ? w[RPI_BLOCK_FCPROJ_B] : NULL, R, o.M, C);
    group_sum(a, &o, a->out);
    residual(a, 1, aux + o.x1, a->out, a->out);
}

/* A split backward keeps, per row, the output gradients of the block's
** products and norms: fcproj's (C), fc's (M), LN2's (C), proj's (C), qkv's
** (3A) and LN1's (C). */
size_t rpi_block_wstash_floats(const rp_layer *L, int B) {
    block_layout o = layout(L, B);
    return (size_t)o.R * (o.M + 4 * (size_t)o.C + 3 * (size_t)o.A);
}

/* The weights' half: each product's and norm's weight gradient from its
** input (aux) and the output gradient B kept. */
static void block_weights(const layer_args *a, const block_layout *o, float *const g[6]) {
    const rp_layer *L = a->L;
    const float *aux = a->aux;
    float *w[RPI_BLOCK_VARS], *dw[RPI_BLOCK_VARS];
    var_ptrs(L, (float *)a->w, w);
    var_ptrs(L, a->dw, dw);
    int R = o->R, C = o->C, A = o->A;
    bool acc = a->accumulate;
    rpi_linear_rows_backward(aux + o->gh, g[0], w[RPI_BLOCK_FCPROJ_W], dw[RPI_BLOCK_FCPROJ_W],
                             dw[RPI_BLOCK_FCPROJ_B], NULL, acc, R, o->M, C);
    rpi_linear_rows_backward(aux + o->ln2, g[1], w[RPI_BLOCK_FC_W], dw[RPI_BLOCK_FC_W],
                             dw[RPI_BLOCK_FC_B], NULL, acc, R, C, o->M);
    rpi_layernorm_rows_backward(aux + o->x1, g[2], w[RPI_BLOCK_LN2_W], aux + o->st2,
                                dw[RPI_BLOCK_LN2_W], dw[RPI_BLOCK_LN2_B], NULL, true, acc, R, C);
    rpi_linear_rows_backward(aux + o->att, g[3], w[RPI_BLOCK_PROJ_W], dw[RPI_BLOCK_PROJ_W],
                             dw[RPI_BLOCK_PROJ_B], NULL, acc, R, A, C);
    rpi_linear_rows_backward(aux + o->ln1, g[4], w[RPI_BLOCK_QKV_W], dw[RPI_BLOCK_QKV_W],
                             dw[RPI_BLOCK_QKV_B], NULL, acc, R, C, 3 * A);
    rpi_layernorm_rows_backward(a->in, g[5], w[RPI_BLOCK_LN1_W], aux + o->st1,
                                dw[RPI_BLOCK_LN1_W], dw[RPI_BLOCK_LN1_B], NULL, true, acc, R, C);
}

void rpi_block_backward(const layer_args *a, const float *dout, float *din) {
    const rp_layer *L = a->L;
    block_layout o = layout(L, a->B);
    const float *aux = a->aux;
    float *w[RPI_BLOCK_VARS], *dw[RPI_BLOCK_VARS];
    var_ptrs(L, (float *)a->w, w);
    var_ptrs(L, a->dw, dw);
    int R = o.R, C = o.C, T = o.T, A = o.A;
    size_t RC = (size_t)R * C, RA = (size_t)R * A;
    float *dM = a->tmp, *dx1 = dM + (size_t)R * o.M, *dbr = dx1 + RC, *dln = dbr + RC,
          *datt = dln + RC, *dqkv = datt + RA, *dS = dqkv + 3 * RA;
    /* the output gradients of fcproj, fc, LN2, proj, qkv and LN1: scratch
    ** when whole, kept for the weights' half when split */
    float *g[6] = {dbr, dM, dln, dbr, dqkv, dln};
    if (a->part != RPI_BACK_BOTH) {
        g[0] = a->wstash, g[1] = g[0] + RC, g[2] = g[1] + (size_t)R * o.M;
        g[3] = g[2] + RC, g[4] = g[3] + RC, g[5] = g[4] + 3 * RA;
    }
    if (a->part == RPI_BACK_WEIGHT) {
        block_weights(a, &o, g);
        return;
    }
    if (a->part == RPI_BACK_INPUT) /* the weights' gradients wait */
        for (int v = 0; v < RPI_BLOCK_VARS; v++)
            dw[v] = NULL;
    bool acc = a->accumulate;
    /* the MLP branch */
    memcpy(dx1, dout, sizeof(float) * RC);
    memcpy(g[0], dout, sizeof(float) * RC);
    residual_back(a, 1, g[0]);
    rpi_linear_rows_backward(aux + o.gh, g[0], w[RPI_BLOCK_FCPROJ_W], dw[RPI_BLOCK_FCPROJ_W],
                             dw[RPI_BLOCK_FCPROJ_B], g[1], acc, R, o.M, C);
    gelu_back(L, aux + o.h, g[1], (size_t)R * o.M);
    rpi_linear_rows_backward(aux + o.ln2, g[1], w[RPI_BLOCK_FC_W], dw[RPI_BLOCK_FC_W],
                             dw[RPI_BLOCK_FC_B], g[2], acc, R, C, o.M);
    group_sum(a, &o, g[2]);
    rpi_layernorm_rows_backward(aux + o.x1, g[2], w[RPI_BLOCK_LN2_W], aux + o.st2,
                                dw[RPI_BLOCK_LN2_W], dw[RPI_BLOCK_LN2_B], dx1, true, acc, R, C);
    /* the attention branch */
    memcpy(g[3], dx1, sizeof(float) * RC);
    residual_back(a, 0, g[3]);
    rpi_linear_rows_backward(aux + o.att, g[3], w[RPI_BLOCK_PROJ_W], dw[RPI_BLOCK_PROJ_W],
                             dw[RPI_BLOCK_PROJ_B], datt, acc, R, A, C);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < o.H; h++) {
            size_t q = (size_t)b * T * 3 * A + (size_t)h * o.hs;
            attention_back(&o, aux + o.qkv + q, aux + o.prob + ((size_t)b * o.H + h) * T * T,
                           datt + (size_t)b * T * A + (size_t)h * o.hs, g[4] + q, dS);
        }
    rpi_linear_rows_backward(aux + o.ln1, g[4], w[RPI_BLOCK_QKV_W], dw[RPI_BLOCK_QKV_W],
                             dw[RPI_BLOCK_QKV_B], g[5], acc, R, C, 3 * A);
    group_sum(a, &o, g[5]);
    /* din = dx1 + LN1's input gradient; LN1's parameters learn either way */
    rpi_layernorm_rows_backward(a->in, g[5], w[RPI_BLOCK_LN1_W], aux + o.st1, dw[RPI_BLOCK_LN1_W],
                                dw[RPI_BLOCK_LN1_B], din ? dx1 : NULL, true, acc, R, C);
    if (din)
        memcpy(din, dx1, sizeof(float) * RC);
}
