/*
** Element-wise layers (relu, gelu, dropout, flatten) and the loss. The
** dispatch from a layer's type to its kernels is in layers.c.
*/
#include <math.h>
#include <string.h>

#include "layers_impl.h"

/* Row r's label, checked to be one of V classes (-1 without labels). */
static rp_status label_of(const layer_args *a, int r, int V, int *y, rp_error *err) {
    *y = a->ctx->labels ? a->ctx->labels[r] : -1;
    if (a->ctx->labels && (*y < 0 || *y >= V))
        return rp_fail(err, RP_ERR_INVALID,
                       "layer %d (softmax_cross_entropy): label %d of row %d is not a class in "
                       "[0, %d)",
                       a->index, *y, r, V);
    return RP_OK;
}

/* p = e^(z - m) for C scores z, m their maximum; their sum. The
** exponentials are a loop of their own, so that it vectorises: over a
** vocabulary of 50 257, glibc's expf a value at a time was a few per cent
** of a GPT-2's step. */
RP_HOT
static double exp_row(const float *z, int C, float *p, float *m_out) {
    float m = z[0];
    for (int c = 1; c < C; c++)
        m = z[c] > m ? z[c] : m;
    for (int c = 0; c < C; c++)
        p[c] = rpi_expf(z[c] - m);
    double sum = 0;
    for (int c = 0; c < C; c++)
        sum += p[c];
    *m_out = m;
    return sum;
}

/* One row r of C scores: its probabilities into prob, and its loss,
** -log softmax(z)[label] (0 without labels). */
static rp_status softmax_ce_row(const layer_args *a, int r, int C, float *prob, double *loss,
                                rp_error *err) {
    const float *z = a->in + (size_t)r * C;
    float *p = prob + (size_t)r * C, m;
    int y;
    rp_status st = label_of(a, r, C, &y, err);
    if (st)
        return st;
    double sum = exp_row(z, C, p, &m);
    float inv = (float)(1.0 / sum);
    for (int c = 0; c < C; c++)
        p[c] *= inv;
    /* log(sum) + m - z[y]: exact even when p[y] underflows */
    *loss = y >= 0 ? log(sum) + m - z[y] : 0.0;
    return RP_OK;
}

/* The targets of a sample: 1 for class scores, T for (T x C) token scores. */
static inline int targets_of(const rp_layer *L) { return L->in.ndim == 2 ? L->in.dim[0] : 1; }

/* A loss split by vocabulary over a tensor group (tensor_split.c): this
** rank's C scores are classes [first, first + C) of V. Per row it gathers
** from every rank its scores' maximum m_k, their sum s_k of e^(z - m_k),
** and the label's score where it holds the label (else 0), and combines
** them in rank order into M = max m_k, S = sum s_k e^(m_k - M) and the loss
** log S + M - z_y: the same bits on every rank, never the whole scores.
** Its probabilities e^(z - M) / S are its share of the whole softmax.
** Scratch: 3 floats a row of its own, then the group's. */
static rp_status softmax_ce_split(const layer_args *a, int rows, rp_error *err) {
    const rp_layer *L = a->L;
    int C = L->in.dim[L->in.ndim - 1], V = L->tp_vocab, first = L->tp_vocab_first;
    int t = L->tp_ranks;
    if (!a->tp_allgather)
        return rp_fail(err, RP_ERR_INVALID,
                       "layer %d (softmax_cross_entropy) is split by vocabulary and needs its "
                       "tensor group", a->index);
    float *mine = a->tmp, *all = a->tmp + 3 * (size_t)rows;
    for (int r = 0; r < rows; r++) {
        const float *z = a->in + (size_t)r * C;
        float *p = (float *)a->aux + (size_t)r * C;
        int y;
        rp_status st = label_of(a, r, V, &y, err);
        if (st)
            return st;
        float m;
        double sum = exp_row(z, C, p, &m);
        mine[3 * r] = m, mine[3 * r + 1] = (float)sum;
        mine[3 * r + 2] = y >= first && y < first + C ? z[y - first] : 0.0f;
    }
    a->tp_allgather(a->tp_ctx, mine, 3 * (size_t)rows, all);
    for (int r = 0; r < rows; r++) {
        float M = all[3 * r], zy = 0;
        for (int k = 1; k < t; k++)
            M = all[3 * ((size_t)k * rows + r)] > M ? all[3 * ((size_t)k * rows + r)] : M;
        double S = 0;
        for (int k = 0; k < t; k++) {
            const float *g = all + 3 * ((size_t)k * rows + r);
            S += (double)g[1] * exp((double)g[0] - M);
            zy += g[2]; /* one rank's score and zeros */
        }
        float f = (float)(exp((double)mine[3 * r] - M) / S);
        float *p = (float *)a->aux + (size_t)r * C;
        for (int c = 0; c < C; c++)
            p[c] *= f;
        mine[3 * r] = a->ctx->labels ? (float)(log(S) + M - zy) : 0.0f; /* the row's loss */
    }
    return RP_OK;
}

/* in: (B, T, C) scores, T = 1 for classes and a sample's tokens otherwise;
** labels (B, T); out: (B) losses, the mean of a sample's T; aux (B, T, C):
** the probabilities, for backward */
rp_status rpi_softmax_ce_forward(const layer_args *a, rp_error *err) {
    const rp_layer *L = a->L;
    int C = L->in.dim[L->in.ndim - 1], T = targets_of(L);
    if (L->tp_ranks > 1) {
        rp_status st = softmax_ce_split(a, a->B * T, err);
        for (int b = 0; b < a->B && !st; b++) {
            double total = 0;
            for (int t = 0; t < T; t++)
                total += a->tmp[3 * (b * T + t)];
            a->out[b] = (float)(T == 1 ? total : total / T);
        }
        return st;
    }
    for (int b = 0; b < a->B; b++) {
        double total = 0;
        for (int t = 0; t < T; t++) {
            double loss = 0;
            rp_status st = softmax_ce_row(a, b * T + t, C, a->aux, &loss, err);
            if (st)
                return st;
            total += loss;
        }
        a->out[b] = (float)(T == 1 ? total : total / T);
    }
    return RP_OK;
}

/* din: (B, T, C) = (probabilities - one-hot label) x the loss scale / T */
void rpi_softmax_ce_backward(const layer_args *a, float *din) {
    if (!din)
        return;
    const rp_layer *L = a->L;
    int C = L->in.dim[L->in.ndim - 1], T = targets_of(L);
    const float *prob = a->aux;
    float scale = (float)a->ctx->loss_scale;
    if (T > 1)
        scale /= (float)T;
    for (int r = 0; r < a->B * T; r++) {
        const float *p = prob + (size_t)r * C;
        float *d = din + (size_t)r * C;
        for (int c = 0; c < C; c++)
            d[c] = p[c] * scale;
        int y = a->ctx->labels[r] - L->tp_vocab_first; /* a split loss's share of classes */
        if (y >= 0 && y < C)
            d[y] -= scale;
    }
}

/* x, y: n values */
RP_HOT
void rpi_relu_forward(const float *restrict x, float *restrict y, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

RP_HOT
void rpi_relu_backward(const float *restrict x, const float *restrict dy, float *restrict dx,
                       size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = dy[i]; /* loaded unconditionally so the select vectorises */
        dx[i] = x[i] > 0.0f ? g : 0.0f;
    }
}

static const float SQRT1_2 = 0.70710678118654752f;
static const float INV_SQRT_2PI = 0.39894228040143268f;

/* The standard normal's distribution function, Phi(x) = erfc(-x / sqrt 2) / 2,
** from erfc's Chebyshev fit in Numerical Recipes (erfcc: t = 1 / (1 + z / 2),
** erfc(z) = t e^(-z^2 + P(t)) for z >= 0, a relative error under 1.2e-7)
** in plain float operations with rpi_expf, so that the loops vectorise:
** glibc's erff and expf, a value at a time, made the erf-form GELU twenty
** times the tanh form's cost. Within 2e-7 of Phi (test_layers). */
static inline float normal_cdf(float x) {
    float z = (x < 0 ? -x : x) * SQRT1_2, t = 1.0f / (1.0f + 0.5f * z);
    float p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f +
              t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f +
              t * (-0.82215223f + t * 0.17087277f))))))));
    float tail = 0.5f * t * rpi_expf(p - z * z); /* Phi(-|x|) */
    return x < 0 ? tail : 1.0f - tail;
}

/* GELU, the erf form: x, y: n values */
RP_HOT
void rpi_gelu_forward(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] * normal_cdf(x[i]);
}

RP_HOT
void rpi_gelu_backward(const float *x, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        dx[i] = dy[i] * (normal_cdf(v) + v * INV_SQRT_2PI * rpi_expf(-0.5f * v * v));
    }
}

/* tanh(u) = 1 - 2 / (e^2u + 1): an absolute error of a few ulp of 1, which
** is what GELU's 0.5 x (1 + tanh) can use */
static inline float tanh_poly(float u) { return 1.0f - 2.0f / (rpi_expf(2.0f * u) + 1.0f); }

/* GELU, GPT-2's tanh form: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) */
static const float SQRT_2_PI = 0.79788456080286536f;

RP_HOT
void rpi_gelu_tanh_forward(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanh_poly(SQRT_2_PI * (v + 0.044715f * v * v * v)));
    }
}

/* dx may be dy */
RP_HOT
void rpi_gelu_tanh_backward(const float *x, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float t = tanh_poly(SQRT_2_PI * (v + 0.044715f * v * v * v));
        float du = SQRT_2_PI * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
}

/* in, out: B rows of the layer's input; backward passes dout and din. In
** inference, or with p = 0, a copy. */
RP_HOT
void rpi_dropout_apply(const layer_args *a, const float *in, float *out) {
    size_t per = rp_shape_size(&a->L->in);
    if (!a->ctx->training || a->L->p == 0) {
        memcpy(out, in, sizeof(float) * per * a->B);
        return;
    }
    for (int r = 0; r < a->B; r++)
        for (size_t e = 0; e < per; e++)
            out[r * per + e] = in[r * per + e] * rpi_dropout_scale(a, r, e);
}

/* sigmoid(x) = 1 / (1 + e^-x); its gradient y (1 - y) from the output */
RP_HOT
void rpi_sigmoid_forward(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] = 1.0f / (1.0f + rpi_expf(-x[i]));
}

RP_HOT
void rpi_sigmoid_backward(const float *y, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++)
        dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

/* glibc's tanhf: exact near 0, where 2 sigmoid(2x) - 1 would cancel */
void rpi_tanh_forward(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] = tanhf(x[i]);
}

RP_HOT
void rpi_tanh_backward(const float *y, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++)
        dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

/* y = x0 + x1 or x0 x1 over a batch of the layer's output: add's first
** step and mul's whole. */
RP_HOT
static size_t first_two(const layer_args *a, bool product) {
    size_t n = rp_shape_size(&a->L->out) * a->B;
    const float *restrict x0 = a->ins[0], *restrict x1 = a->ins[1];
    float *restrict y = a->out;
    if (product)
        for (size_t i = 0; i < n; i++)
            y[i] = x0[i] * x1[i];
    else
        for (size_t i = 0; i < n; i++)
            y[i] = x0[i] + x1[i];
    return n;
}

/* add: the inputs summed in their order, ((x0 + x1) + x2) ... */
void rpi_add_forward(const layer_args *a) {
    size_t n = first_two(a, false);
    float *restrict y = a->out;
    for (int k = 2; k < a->L->num_inputs; k++) {
        const float *restrict xk = a->ins[k];
        for (size_t i = 0; i < n; i++)
            y[i] += xk[i];
    }
}

/* Elements per sample of concat's input k, and where they start in a
** sample of its output. */
static size_t concat_part(const rp_model *m, const rp_layer *L, int k, size_t *at) {
    size_t off = 0;
    for (int i = 0; i < k; i++)
        off += rp_shape_size(rp_model_tensor_shape(m, L->inputs[i]));
    *at = off;
    return rp_shape_size(rp_model_tensor_shape(m, L->inputs[k]));
}

/* concat along the first dimension: in a sample's row, the inputs' rows one
** after another */
void rpi_concat_forward(const layer_args *a) {
    size_t per = rp_shape_size(&a->L->out);
    for (int k = 0; k < a->L->num_inputs; k++) {
        size_t at, n = concat_part(a->m, a->L, k, &at);
        for (int r = 0; r < a->B; r++)
            memcpy(a->out + r * per + at, a->ins[k] + r * n, sizeof(float) * n);
    }
}

/* The gradient of concat's input k: its part of dout, written into din or
** added to it. */
void rpi_concat_backward(const layer_args *a, int k, const float *dout, float *din, bool add) {
    size_t per = rp_shape_size(&a->L->out);
    size_t at, n = concat_part(a->m, a->L, k, &at);
    for (int r = 0; r < a->B; r++) {
        const float *restrict g = dout + r * per + at;
        float *restrict d = din + r * n;
        if (add)
            for (size_t i = 0; i < n; i++)
                d[i] += g[i];
        else
            memcpy(d, g, sizeof(float) * n);
    }
}

/* silu(x) = x sigmoid(x) (SwiGLU's gate); its gradient s (1 + x (1 - s)) */
RP_HOT
void rpi_silu_forward(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] / (1.0f + rpi_expf(-x[i]));
}

RP_HOT
void rpi_silu_backward(const float *x, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + rpi_expf(-x[i]));
        dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
    }
}

void rpi_mul_forward(const layer_args *a) {
    first_two(a, true);
}

RP_HOT
void rpi_mul_backward(const layer_args *a, int k, const float *dout, float *din) {
    size_t n = rp_shape_size(&a->L->out) * a->B;
    const float *restrict other = a->ins[1 - k];
    for (size_t i = 0; i < n; i++)
        din[i] = dout[i] * other[i];
}
