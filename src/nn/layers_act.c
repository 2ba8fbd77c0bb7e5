/*
** Element-wise layers (relu, gelu, dropout, flatten) and the loss. The
** dispatch from a layer's type to its kernels is in layers.c.
*/
#include <math.h>
#include <string.h>

#include "layers.h"

/* Dropout keeps element e of row r with probability 1 - p; the decision is
** a function of (seed, update, sample id, layer, element), nothing else. */
static inline float dropout_scale(const layer_args *a, int r, size_t e) {
    const rp_step_ctx *c = a->ctx;
    float u = rp_uniform(c->seed, c->update, (uint64_t)c->sample_id[r], (uint64_t)a->index, e);
    return u < a->L->p ? 0.0f : 1.0f / (1.0f - a->L->p);
}

/* in: (B, C) scores; out: (B) losses, -log softmax(in)[label]; aux (B, C):
** the probabilities, for backward */
rp_status rpi_softmax_ce_forward(const layer_args *a, rp_error *err) {
    int C = a->L->in.dim[0];
    float *prob = a->aux;
    for (int r = 0; r < a->B; r++) {
        const float *z = a->in + (size_t)r * C;
        float *p = prob + (size_t)r * C;
        int y = a->ctx->labels ? a->ctx->labels[r] : -1;
        if (a->ctx->labels && (y < 0 || y >= C))
            return rp_fail(err, RP_ERR_INVALID,
                           "layer %d (softmax_cross_entropy): label %d of row %d is not a class "
                           "in [0, %d)",
                           a->index, y, r, C);
        float m = z[0];
        for (int c = 1; c < C; c++)
            m = z[c] > m ? z[c] : m;
        double sum = 0;
        for (int c = 0; c < C; c++) {
            p[c] = expf(z[c] - m);
            sum += p[c];
        }
        float inv = (float)(1.0 / sum);
        for (int c = 0; c < C; c++)
            p[c] *= inv;
        /* -log softmax(z)[y] = log(sum) + m - z[y], exact even when p[y] underflows */
        a->out[r] = y >= 0 ? (float)(log(sum) + m - z[y]) : 0.0f;
    }
    return RP_OK;
}

/* din: (B, C) = (probabilities - one-hot label) x the loss scale */
void rpi_softmax_ce_backward(const layer_args *a, float *din) {
    if (!din)
        return;
    int C = a->L->in.dim[0];
    const float *prob = a->aux;
    float scale = (float)a->ctx->loss_scale;
    for (int r = 0; r < a->B; r++) {
        const float *p = prob + (size_t)r * C;
        float *d = din + (size_t)r * C;
        for (int c = 0; c < C; c++)
            d[c] = p[c] * scale;
        d[a->ctx->labels[r]] -= scale;
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

/* GELU, the erf form: x, y: n values */
RP_HOT
void rpi_gelu_forward(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * SQRT1_2));
}

RP_HOT
void rpi_gelu_backward(const float *x, const float *dy, float *dx, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float cdf = 0.5f * (1.0f + erff(x[i] * SQRT1_2));
        dx[i] = dy[i] * (cdf + x[i] * INV_SQRT_2PI * expf(-0.5f * x[i] * x[i]));
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
            out[r * per + e] = in[r * per + e] * dropout_scale(a, r, e);
}
