/*
** attention: causal multi-head attention on a (T x W) sample of fused rows,
** LLaMA's with grouped-query heads and rotary embeddings,
**
**     row t = [q_0 .. q_{H-1} | k_0 .. k_{K-1} | v_0 .. v_{K-1}], each hs wide,
**     out_t = [att_0 .. att_{H-1}],  att_h = softmax(rope(q_h) rope(k_g)^T / sqrt(hs)) v_g
**
** with g = h / (H / K): H / K query heads share a key and value head. With
** rope_theta > 0, a head's pairs (2i, 2i + 1) at position t turn by the angle
** t theta^(-2i / hs) (Meta's LLaMA convention: interleaved pairs). The
** layer has no parameters: the projections around it are linear layers, so
** a LLaMA block is a graph of rmsnorm, linear, attention, linear, add and
** SwiGLU's lines (docs/training.md). Forward keeps the turned rows and the
** probabilities; the products are BLAS calls per (sample, head) that read
** a head's columns in place through the rows' leading dimension.
*/
#include <math.h>
#include <string.h>

#include "../core/blas.h"
#include "layers_impl.h"

typedef struct attn_dims {
    int T, W, H, K, G, hs;
} attn_dims;

static attn_dims dims_of(const rp_layer *L) {
    attn_dims d;
    d.T = L->in.dim[0], d.W = L->in.dim[1], d.H = L->heads, d.K = L->kv_heads;
    d.G = d.H / d.K, d.hs = d.W / (d.H + 2 * d.K);
    return d;
}

size_t rpi_attention_aux_bytes(const rp_layer *L, int B) {
    attn_dims d = dims_of(L);
    return sizeof(float) * (size_t)B * ((size_t)d.T * d.W + (size_t)d.H * d.T * d.T);
}

size_t rpi_attention_scratch(const rp_layer *L) {
    attn_dims d = dims_of(L);
    return (size_t)d.T * d.T; /* a head's score gradients */
}

/* Every row of B samples of T positions (rows `row` floats apart, samples
** `sample` apart) turned, in each of its first `heads` heads of hs floats
** (pairs), by the angles of its position; sign -1 turns back. A position's
** angles are computed once for all its samples and heads: the cosines and
** sines were most of attention's time when each head took its own, and the
** same expressions give the same bits. */
static void rope(float *x, int B, size_t sample, int T, size_t row, int heads, int hs,
                 float theta, double sign) {
    enum { CHUNK = 64 }; /* pairs whose angles are held at once */
    double c[CHUNK], s[CHUNK], f[CHUNK];
    for (int i0 = 0; i0 < hs / 2; i0 += CHUNK) {
        int n = hs / 2 - i0 < CHUNK ? hs / 2 - i0 : CHUNK;
        for (int i = 0; i < n; i++) /* the pairs' frequencies, once for every position */
            f[i] = pow(theta, -2.0 * (i0 + i) / hs);
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < n; i++) {
                double ang = t * f[i];
                c[i] = cos(ang), s[i] = sign * sin(ang);
            }
            for (int b = 0; b < B; b++)
                for (int h = 0; h < heads; h++) {
                    float *v = x + (size_t)b * sample + (size_t)t * row + (size_t)h * hs + 2 * i0;
                    for (int i = 0; i < n; i++) {
                        double x0 = v[2 * i], x1 = v[2 * i + 1];
                        v[2 * i] = (float)(x0 * c[i] - x1 * s[i]);
                        v[2 * i + 1] = (float)(x0 * s[i] + x1 * c[i]);
                    }
                }
        }
    }
}

RP_HOT
void rpi_attention_forward(const layer_args *a) {
    attn_dims d = dims_of(a->L);
    int T = d.T, W = d.W, hs = d.hs, C = d.H * hs;
    float scale = 1.0f / sqrtf((float)hs), theta = a->L->rope_theta;
    memcpy(a->aux, a->in, sizeof(float) * (size_t)a->B * T * W);
    if (theta > 0) /* the query heads, then the key heads */
        rope(a->aux, a->B, (size_t)T * W, T, W, d.H + d.K, hs, theta, 1.0);
    for (int b = 0; b < a->B; b++) {
        float *rq = (float *)a->aux + (size_t)b * T * W;
        float *P = (float *)a->aux + (size_t)a->B * T * W + (size_t)b * d.H * T * T;
        float *out = a->out + (size_t)b * T * C;
        for (int h = 0; h < d.H; h++) {
            int g = h / d.G;
            const float *q = rq + h * hs, *k = rq + (d.H + g) * hs, *v = rq + (d.H + d.K + g) * hs;
            float *p = P + (size_t)h * T * T;
            /* the scores of every pair (the upper triangle is masked below), read
            ** in place through the rows' leading dimension W */
            rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, W, k, W, 0.0f,
                        p, T);
            for (int i = 0; i < T; i++)
                rpi_causal_softmax_row(p + (size_t)i * T, i, T);
            rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, v, W, 0.0f,
                        out + h * hs, C);
        }
    }
}

RP_HOT
void rpi_attention_backward(const layer_args *a, const float *dout, float *din) {
    if (!din) /* no parameters: nothing to learn here */
        return;
    attn_dims d = dims_of(a->L);
    int T = d.T, W = d.W, hs = d.hs, C = d.H * hs;
    float scale = 1.0f / sqrtf((float)hs), theta = a->L->rope_theta, *dS = a->tmp;
    for (int b = 0; b < a->B; b++) {
        const float *rq = (const float *)a->aux + (size_t)b * T * W;
        const float *P = (const float *)a->aux + (size_t)a->B * T * W + (size_t)b * d.H * T * T;
        const float *dy = dout + (size_t)b * T * C;
        float *dx = din + (size_t)b * T * W;
        memset(dx, 0, sizeof(float) * T * W); /* a group's key and value gradients add up */
        for (int h = 0; h < d.H; h++) {
            int g = h / d.G;
            const float *q = rq + h * hs, *k = rq + (d.H + g) * hs, *v = rq + (d.H + d.K + g) * hs;
            float *dq = dx + h * hs, *dk = dx + (d.H + g) * hs, *dv = dx + (d.H + d.K + g) * hs;
            const float *p = P + (size_t)h * T * T, *di = dy + h * hs;
            /* dP = datt V^T; dV += P^T datt */
            rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, di, C, v, W, 0.0f,
                        dS, T);
            rpi_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, di, C, 1.0f,
                        dv, W);
            for (int i = 0; i < T; i++) /* the softmax's gradient, scaled; 0 above the diagonal */
                rpi_causal_softmax_back_row(p + (size_t)i * T, dS + (size_t)i * T, i, T, scale);
            /* dQ = dS K; dK += dS^T Q */
            rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, dS, T, k, W, 0.0f,
                        dq, W);
            rpi_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, dS, T, q, W, 1.0f,
                        dk, W);
        }
    }
    if (theta > 0) /* back through the turns */
        rope(din, a->B, (size_t)T * W, T, W, d.H + d.K, hs, theta, -1.0);
}
