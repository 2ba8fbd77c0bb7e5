/*
** Element-wise layers (relu, gelu, dropout, flatten), the loss, and the
** dispatch from a layer's type to its kernels.
*/
#include <math.h>
#include <string.h>

#include "layers.h"

void rpi_linear_forward(const layer_args *a);
void rpi_linear_backward(const layer_args *a, const float *dout, float *din);
void rpi_layernorm_forward(const layer_args *a);
void rpi_layernorm_backward(const layer_args *a, const float *dout, float *din);
rp_status rpi_embedding_forward(const layer_args *a, rp_error *err);
void rpi_embedding_backward(const layer_args *a, const float *dout, float *din);
void rpi_conv_scratch(const rp_layer *L, int B, size_t limit, size_t *col, size_t *tmp);
void rpi_conv_forward(const layer_args *a);
void rpi_conv_backward(const layer_args *a, const float *dout, float *din);
void rpi_maxpool_forward(const layer_args *a);
void rpi_maxpool_backward(const layer_args *a, const float *dout, float *din);

/* Dropout keeps element e of row r with probability 1 - p; the decision is
** a function of (seed, update, sample id, layer, element), nothing else. */
static inline float dropout_scale(const layer_args *a, int r, size_t e) {
    const rp_step_ctx *c = a->ctx;
    float u = rp_uniform(c->seed, c->update, (uint64_t)c->sample_id[r], (uint64_t)a->index, e);
    return u < a->L->p ? 0.0f : 1.0f / (1.0f - a->L->p);
}

/* aux: the probabilities of every row */
static rp_status softmax_ce_forward(const layer_args *a, rp_error *err) {
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

static void softmax_ce_backward(const layer_args *a, float *din) {
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

size_t rpi_layer_aux_bytes(const rp_layer *L, int B) {
    switch (L->type) {
    case RP_LAYER_MAXPOOL2D: return sizeof(int) * rp_shape_size(&L->out) * B;
    case RP_LAYER_LAYERNORM:
        return sizeof(float) * 2 * (rp_shape_size(&L->in) / L->in.dim[L->in.ndim - 1]) * B;
    case RP_LAYER_SOFTMAX_CE: return sizeof(float) * rp_shape_size(&L->in) * B;
    default: return 0;
    }
}

void rpi_layer_scratch(const rp_layer *L, int B, size_t limit, size_t *col, size_t *tmp) {
    *col = *tmp = 0;
    if (L->type == RP_LAYER_CONV2D)
        rpi_conv_scratch(L, B, limit, col, tmp);
}

static void relu_forward(const float *restrict x, float *restrict y, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void relu_backward(const float *restrict x, const float *restrict dy, float *restrict dx,
                          size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = dy[i]; /* loaded unconditionally so the select vectorises */
        dx[i] = x[i] > 0.0f ? g : 0.0f;
    }
}

static const float SQRT1_2 = 0.70710678118654752f;
static const float INV_SQRT_2PI = 0.39894228040143268f;

RP_HOT
rp_status rpi_layer_forward(const layer_args *a, rp_error *err) {
    size_t n = rp_shape_size(&a->L->in) * a->B;
    switch (a->L->type) {
    case RP_LAYER_LINEAR: rpi_linear_forward(a); break;
    case RP_LAYER_CONV2D: rpi_conv_forward(a); break;
    case RP_LAYER_MAXPOOL2D: rpi_maxpool_forward(a); break;
    case RP_LAYER_LAYERNORM: rpi_layernorm_forward(a); break;
    case RP_LAYER_EMBEDDING: return rpi_embedding_forward(a, err);
    case RP_LAYER_SOFTMAX_CE: return softmax_ce_forward(a, err);
    case RP_LAYER_RELU: relu_forward(a->in, a->out, n); break;
    case RP_LAYER_GELU:
        for (size_t i = 0; i < n; i++)
            a->out[i] = 0.5f * a->in[i] * (1.0f + erff(a->in[i] * SQRT1_2));
        break;
    case RP_LAYER_FLATTEN: memcpy(a->out, a->in, sizeof(float) * n); break;
    case RP_LAYER_DROPOUT:
        if (!a->ctx->training || a->L->p == 0) {
            memcpy(a->out, a->in, sizeof(float) * n);
        } else {
            size_t per = rp_shape_size(&a->L->in);
            for (int r = 0; r < a->B; r++)
                for (size_t e = 0; e < per; e++)
                    a->out[r * per + e] = a->in[r * per + e] * dropout_scale(a, r, e);
        }
        break;
    }
    return RP_OK;
}

RP_HOT
void rpi_layer_backward(const layer_args *a, const float *dout, float *din) {
    size_t n = rp_shape_size(&a->L->in) * a->B;
    switch (a->L->type) {
    case RP_LAYER_LINEAR: rpi_linear_backward(a, dout, din); break;
    case RP_LAYER_CONV2D: rpi_conv_backward(a, dout, din); break;
    case RP_LAYER_MAXPOOL2D: rpi_maxpool_backward(a, dout, din); break;
    case RP_LAYER_LAYERNORM: rpi_layernorm_backward(a, dout, din); break;
    case RP_LAYER_EMBEDDING: rpi_embedding_backward(a, dout, din); break;
    case RP_LAYER_SOFTMAX_CE: softmax_ce_backward(a, din); break;
    case RP_LAYER_RELU:
        if (din)
            relu_backward(a->in, dout, din, n);
        break;
    case RP_LAYER_GELU:
        if (din)
            for (size_t i = 0; i < n; i++) {
                float x = a->in[i];
                float cdf = 0.5f * (1.0f + erff(x * SQRT1_2));
                din[i] = dout[i] * (cdf + x * INV_SQRT_2PI * expf(-0.5f * x * x));
            }
        break;
    case RP_LAYER_FLATTEN:
        if (din)
            memcpy(din, dout, sizeof(float) * n);
        break;
    case RP_LAYER_DROPOUT:
        if (!din)
            break;
        if (!a->ctx->training || a->L->p == 0) {
            memcpy(din, dout, sizeof(float) * n);
        } else {
            size_t per = rp_shape_size(&a->L->in);
            for (int r = 0; r < a->B; r++)
                for (size_t e = 0; e < per; e++)
                    din[r * per + e] = dout[r * per + e] * dropout_scale(a, r, e);
        }
        break;
    }
}
