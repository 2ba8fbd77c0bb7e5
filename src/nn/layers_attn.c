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
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "layers.h"

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

/* x (hs floats, pairs) turned by the angles of position t; sign -1 turns back */
static void rope(float *x, int hs, int t, float theta, double sign) {
    for (int i = 0; i < hs / 2; i++) {
        double ang = t * pow(theta, -2.0 * i / hs), c = cos(ang), s = sign * sin(ang);
        double x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = (float)(x0 * c - x1 * s);
        x[2 * i + 1] = (float)(x0 * s + x1 * c);
    }
}

void rpi_attention_forward(const layer_args *a) {
    attn_dims d = dims_of(a->L);
    int T = d.T, W = d.W, hs = d.hs, C = d.H * hs;
    float scale = 1.0f / sqrtf((float)hs), theta = a->L->rope_theta;
    for (int b = 0; b < a->B; b++) {
        float *rq = (float *)a->aux + (size_t)b * T * W;
        float *P = (float *)a->aux + (size_t)a->B * T * W + (size_t)b * d.H * T * T;
        memcpy(rq, a->in + (size_t)b * T * W, sizeof(float) * T * W);
        for (int t = 0; theta > 0 && t < T; t++)
            for (int h = 0; h < d.H + d.K; h++) /* the query heads, then the key heads */
                rope(rq + (size_t)t * W + (size_t)h * hs, hs, t, theta, 1.0);
        float *out = a->out + (size_t)b * T * C;
        for (int h = 0; h < d.H; h++) {
            int g = h / d.G;
            const float *q = rq + h * hs, *k = rq + (d.H + g) * hs, *v = rq + (d.H + d.K + g) * hs;
            float *p = P + (size_t)h * T * T;
            /* the scores of every pair (the upper triangle is masked below), read
            ** in place through the rows' leading dimension W */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, W, k, W, 0.0f,
                        p, T);
            for (int i = 0; i < T; i++) {
                float *pi = p + (size_t)i * T, m = pi[0];
                for (int j = 1; j <= i; j++)
                    m = pi[j] > m ? pi[j] : m;
                double sum = 0;
                for (int j = 0; j <= i; j++)
                    sum += (pi[j] = expf(pi[j] - m));
                float inv = (float)(1.0 / sum);
                for (int j = 0; j < T; j++)
                    pi[j] = j <= i ? pi[j] * inv : 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, v, W, 0.0f,
                        out + h * hs, C);
        }
    }
}

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
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, di, C, v, W, 0.0f,
                        dS, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, di, C, 1.0f,
                        dv, W);
            for (int i = 0; i < T; i++) { /* the softmax's gradient, scaled; 0 above the diagonal */
                const float *pi = p + (size_t)i * T;
                float *si = dS + (size_t)i * T;
                double dot = 0;
                for (int j = 0; j <= i; j++)
                    dot += (double)pi[j] * si[j];
                for (int j = 0; j < T; j++)
                    si[j] = j <= i ? pi[j] * (si[j] - (float)dot) * scale : 0.0f;
            }
            /* dQ = dS K; dK += dS^T Q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, dS, T, k, W, 0.0f,
                        dq, W);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, dS, T, q, W, 1.0f,
                        dk, W);
        }
        for (int t = 0; theta > 0 && t < T; t++) /* back through the turns */
            for (int h = 0; h < d.H + d.K; h++)
                rope(dx + (size_t)t * W + (size_t)h * hs, hs, t, theta, -1.0);
    }
}
