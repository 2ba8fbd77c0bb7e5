/*
** Every layer against an independent double-precision reference: the
** float forward pass must match the reference, and the gradients of the
** float backward pass (input and parameters) must match central finite
** differences of the reference, for the objective sum(out * r). Graphs
** (add, concat, a tensor read by several layers) are checked the same way,
** the reference evaluating the model's layers one by one from their inputs.
*/
#include <stdlib.h>

#include "layers/layers_impl.h"
#include "repipe/net.h"
#include "test.h"

typedef struct refctx {
    const rp_model *m;
    const rp_layer *L;
    int B;
    const rp_step_ctx *ctx;
} refctx;

/* ---- transformer_block in double precision, written from its definition:
** LN1, one projection per Q, K and V row block, causal softmax attention per
** head, the output projection, dropout on the branch, LN2 and the MLP. ---- */

static void ref_layernorm(const double *x, const double *g, const double *b, double *y, int D,
                          double eps) {
    double mean = 0, var = 0;
    for (int d = 0; d < D; d++)
        mean += x[d] / D;
    for (int d = 0; d < D; d++)
        var += (x[d] - mean) * (x[d] - mean) / D;
    for (int d = 0; d < D; d++)
        y[d] = (x[d] - mean) / sqrt(var + eps) * g[d] + b[d];
}

/* y (N) = W (N x D) x + b */
static void ref_affine(const double *W, const double *b, const double *x, double *y, int N,
                       int D) {
    for (int n = 0; n < N; n++) {
        double s = b[n];
        for (int d = 0; d < D; d++)
            s += W[(size_t)n * D + d] * x[d];
        y[n] = s;
    }
}

static double ref_gelu(double x, bool erf_form) {
    if (erf_form)
        return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    return 0.5 * x * (1 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

static void ref_block(const refctx *c, const double *x, const double *w, double *y) {
    const rp_layer *L = c->L;
    int T = L->in.dim[0], C = L->in.dim[1], H = L->heads, hs = C / H, M = L->mlp * C;
    /* the parameters in file order */
    const double *ln1g = w, *ln1b = ln1g + C, *Wqkv = ln1b + C, *bqkv = Wqkv + 3 * C * C;
    const double *Wp = bqkv + 3 * C, *bp = Wp + C * C, *ln2g = bp + C, *ln2b = ln2g + C;
    const double *Wfc = ln2b + C, *bfc = Wfc + (size_t)M * C, *Wfp = bfc + M, *bfp = Wfp + (size_t)M * C;
    double *ln = malloc(sizeof(double) * T * C), *qkv = malloc(sizeof(double) * T * 3 * C);
    double *att = malloc(sizeof(double) * T * C), *x1 = malloc(sizeof(double) * T * C);
    double *hid = malloc(sizeof(double) * M), *br = malloc(sizeof(double) * C);
    double *p = malloc(sizeof(double) * T);
    for (int b = 0; b < c->B; b++) {
        const double *xs = x + (size_t)b * T * C;
        double *ys = y + (size_t)b * T * C;
        for (int t = 0; t < T; t++) {
            ref_layernorm(xs + t * C, ln1g, ln1b, ln + t * C, C, L->eps);
            ref_affine(Wqkv, bqkv, ln + t * C, qkv + t * 3 * C, 3 * C, C);
        }
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                double m = -1e300, sum = 0;
                for (int j = 0; j <= i; j++) {
                    double s = 0;
                    for (int d = 0; d < hs; d++)
                        s += qkv[i * 3 * C + h * hs + d] * qkv[j * 3 * C + C + h * hs + d];
                    p[j] = s / sqrt((double)hs);
                    m = p[j] > m ? p[j] : m;
                }
                for (int j = 0; j <= i; j++)
                    sum += (p[j] = exp(p[j] - m));
                for (int d = 0; d < hs; d++) {
                    double s = 0;
                    for (int j = 0; j <= i; j++)
                        s += p[j] / sum * qkv[j * 3 * C + 2 * C + h * hs + d];
                    att[i * C + h * hs + d] = s;
                }
            }
        for (int k = 0; k < 2; k++)
            for (int t = 0; t < T; t++) {
                const double *in = k == 0 ? xs + t * C : x1 + t * C;
                if (k == 0) {
                    ref_affine(Wp, bp, att + t * C, br, C, C);
                } else {
                    ref_layernorm(in, ln2g, ln2b, ln + t * C, C, L->eps);
                    ref_affine(Wfc, bfc, ln + t * C, hid, M, C);
                    for (int e = 0; e < M; e++)
                        hid[e] = ref_gelu(hid[e], L->gelu_erf);
                    ref_affine(Wfp, bfp, hid, br, C, M);
                }
                double *o = k == 0 ? x1 + t * C : ys + t * C;
                for (int d = 0; d < C; d++) {
                    double keep = 1;
                    if (L->p > 0) { /* branch k's mask: element k x T x C + e of the sample */
                        float u = rp_uniform(c->ctx->seed, c->ctx->update,
                                             (uint64_t)c->ctx->sample_id[b], 0,
                                             (uint64_t)k * T * C + t * C + d);
                        keep = u < L->p ? 0 : 1 / (1.0 - L->p);
                    }
                    o[d] = in[d] + br[d] * keep;
                }
            }
    }
    free(ln), free(qkv), free(att), free(x1), free(hid), free(br), free(p);
}

/* ---- double-precision references of one layer's forward pass ----------- */

/* The balance losses the reference's moe layers add to the objective (times
** the loss's weight), summed as ref_model runs them. */
static double ref_balance;

/* moe from its definition (layers_moe.c's comment): each token's scores,
** its K best experts by a full sort, their gates, the SwiGLU experts; and
** the sample's balance loss into ref_balance. */
static void ref_moe(const refctx *c, const double *x, const double *w, double *y) {
    const rp_layer *L = c->L;
    int E = L->experts, K = L->top_k, F = L->ffn, C = L->in.dim[L->in.ndim - 1];
    int T = L->in.ndim == 2 ? L->in.dim[0] : 1;
    double u[64], f[64], P[64], h[256];
    int order[64];
    for (int b = 0; b < c->B; b++) {
        for (int i = 0; i < E; i++)
            f[i] = P[i] = 0;
        for (int t = 0; t < T; t++) {
            const double *xt = x + ((size_t)b * T + t) * C;
            double *yt = y + ((size_t)b * T + t) * C, sum = 0, z = 0;
            for (int i = 0; i < E; i++) {
                double s = 0;
                for (int k = 0; k < C; k++)
                    s += w[i * C + k] * xt[k];
                u[i] = L->gate_sigmoid ? 1 / (1 + exp(-s)) : exp(s);
                sum += u[i];
                order[i] = i;
            }
            for (int i = 0; i < E; i++) {
                if (!L->gate_sigmoid)
                    u[i] /= sum;
                P[i] += u[i] / (L->gate_sigmoid ? sum : 1) / T;
            }
            for (int i = 1; i < E; i++) /* insertion sort, best first */
                for (int j = i; j > 0 && u[order[j]] > u[order[j - 1]]; j--) {
                    int keep = order[j];
                    order[j] = order[j - 1], order[j - 1] = keep;
                }
            for (int k = 0; k < K; k++)
                z += u[order[k]], f[order[k]] += (double)E / ((double)K * T);
            for (int k = 0; k < C; k++)
                yt[k] = 0;
            for (int k = 0; k < K; k++) {
                int e = order[k];
                const double *w1 = w + E * C + (size_t)e * 3 * F * C, *w3 = w1 + F * C,
                             *w2 = w3 + F * C;
                double g = L->gate_norm ? u[e] / z : u[e];
                for (int j = 0; j < F; j++) {
                    double a = 0, bb = 0;
                    for (int i = 0; i < C; i++)
                        a += w1[j * C + i] * xt[i], bb += w3[j * C + i] * xt[i];
                    h[j] = a / (1 + exp(-a)) * bb;
                }
                for (int i = 0; i < C; i++)
                    for (int j = 0; j < F; j++)
                        yt[i] += g * w2[i * F + j] * h[j];
            }
        }
        for (int i = 0; i < E; i++)
            ref_balance += c->ctx->loss_scale * L->balance * f[i] * P[i];
    }
}

static void ref_forward(const refctx *c, const double *x, const double *w, double *y) {
    const rp_layer *L = c->L;
    int B = c->B;
    size_t in = rp_shape_size(&L->in), out = rp_shape_size(&L->out);
    switch (L->type) {
    case RP_LAYER_LINEAR: {
        int D = L->in.dim[L->in.ndim - 1], N = L->units;
        size_t rows = in / D * B;
        for (size_t r = 0; r < rows; r++)
            for (int n = 0; n < N; n++) {
                double s = L->bias ? w[(size_t)N * D + n] : 0;
                for (int d = 0; d < D; d++)
                    s += x[r * D + d] * w[(size_t)n * D + d];
                y[r * N + n] = s;
            }
        break;
    }
    case RP_LAYER_CONV2D: { /* output channel o reads the input channels of its group */
        int C = L->in.dim[0], H = L->in.dim[1], W = L->in.dim[2], O = L->units, K = L->kernel;
        int OH = L->out.dim[1], OW = L->out.dim[2], Cg = C / L->groups, Og = O / L->groups;
        for (int b = 0; b < B; b++)
            for (int o = 0; o < O; o++)
                for (int oh = 0; oh < OH; oh++)
                    for (int ow = 0; ow < OW; ow++) {
                        double s = L->bias ? w[(size_t)O * Cg * K * K + o] : 0;
                        for (int ch = o / Og * Cg; ch < (o / Og + 1) * Cg; ch++)
                            for (int ki = 0; ki < K; ki++)
                                for (int kj = 0; kj < K; kj++) {
                                    int h = oh * L->stride - L->pad + ki;
                                    int ww = ow * L->stride - L->pad + kj;
                                    if (h >= 0 && h < H && ww >= 0 && ww < W)
                                        s += x[(((size_t)b * C + ch) * H + h) * W + ww] *
                                             w[(((size_t)o * Cg + ch % Cg) * K + ki) * K + kj];
                                }
                        y[(((size_t)b * O + o) * OH + oh) * OW + ow] = s;
                    }
        break;
    }
    case RP_LAYER_MAXPOOL2D: {
        int C = L->in.dim[0], H = L->in.dim[1], W = L->in.dim[2];
        int OH = L->out.dim[1], OW = L->out.dim[2];
        for (int bc = 0; bc < B * C; bc++)
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++) {
                    double m = -1e300; /* padding: -infinity */
                    for (int ki = 0; ki < L->kernel; ki++)
                        for (int kj = 0; kj < L->kernel; kj++) {
                            int h = oh * L->stride - L->pad + ki, ww = ow * L->stride - L->pad + kj;
                            if (h < 0 || h >= H || ww < 0 || ww >= W)
                                continue;
                            double v = x[((size_t)bc * H + h) * W + ww];
                            m = v > m ? v : m;
                        }
                    y[((size_t)bc * OH + oh) * OW + ow] = m;
                }
        break;
    }
    case RP_LAYER_AVGPOOL2D:
    case RP_LAYER_ADAPTIVE_AVGPOOL2D: { /* windows by their definitions */
        int H = L->in.dim[1], W = L->in.dim[2];
        int OH = L->out.dim[1], OW = L->out.dim[2];
        bool adaptive = L->type == RP_LAYER_ADAPTIVE_AVGPOOL2D;
        for (int bc = 0; bc < B * L->in.dim[0]; bc++)
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++) {
                    int h0 = oh * L->stride - L->pad, w0 = ow * L->stride - L->pad;
                    int h1 = h0 + L->kernel, w1 = w0 + L->kernel;
                    if (adaptive) {
                        h0 = (int)floor((double)oh * H / OH), h1 = (int)ceil((oh + 1.0) * H / OH);
                        w0 = (int)floor((double)ow * W / OW), w1 = (int)ceil((ow + 1.0) * W / OW);
                    }
                    double sum = 0, count = (double)(h1 - h0) * (w1 - w0); /* pads counted */
                    for (int h = h0; h < h1; h++)
                        for (int ww = w0; ww < w1; ww++)
                            if (h >= 0 && h < H && ww >= 0 && ww < W)
                                sum += x[((size_t)bc * H + h) * W + ww];
                    y[((size_t)bc * OH + oh) * OW + ow] = sum / count;
                }
        break;
    }
    case RP_LAYER_SIGMOID:
        for (size_t i = 0; i < in * B; i++)
            y[i] = 1 / (1 + exp(-x[i]));
        break;
    case RP_LAYER_TANH:
        for (size_t i = 0; i < in * B; i++)
            y[i] = tanh(x[i]);
        break;
    case RP_LAYER_SILU:
        for (size_t i = 0; i < in * B; i++)
            y[i] = x[i] / (1 + exp(-x[i]));
        break;
    case RP_LAYER_ATTENTION: { /* rotate pairs of q and k by t theta^(-2i/hs), then attend */
        int T = L->in.dim[0], W = L->in.dim[1], H = L->heads, K = L->kv_heads;
        int hs = W / (H + 2 * K), C = H * hs;
        double *r = malloc(sizeof(double) * T * W), *sc = malloc(sizeof(double) * T);
        for (int b = 0; b < B; b++) {
            memcpy(r, x + (size_t)b * T * W, sizeof(double) * T * W);
            for (int t = 0; L->rope_theta > 0 && t < T; t++)
                for (int part = 0; part < H + K; part++)
                    for (int i = 0; i < hs / 2; i++) {
                        double ang = t * pow(L->rope_theta, -2.0 * i / hs);
                        double *z = r + (size_t)t * W + part * hs + 2 * i, z0 = z[0], z1 = z[1];
                        z[0] = z0 * cos(ang) - z1 * sin(ang);
                        z[1] = z0 * sin(ang) + z1 * cos(ang);
                    }
            for (int h = 0; h < H; h++) {
                int g = h / (H / K);
                for (int i = 0; i < T; i++) {
                    double m = -1e300, sum = 0;
                    for (int j = 0; j <= i; j++) {
                        sc[j] = 0;
                        for (int e = 0; e < hs; e++)
                            sc[j] += r[(size_t)i * W + h * hs + e] * r[(size_t)j * W + (H + g) * hs + e];
                        sc[j] /= sqrt((double)hs);
                        m = sc[j] > m ? sc[j] : m;
                    }
                    for (int j = 0; j <= i; j++)
                        sum += (sc[j] = exp(sc[j] - m));
                    for (int e = 0; e < hs; e++) {
                        double s = 0;
                        for (int j = 0; j <= i; j++)
                            s += sc[j] / sum * r[(size_t)j * W + (H + K + g) * hs + e];
                        y[((size_t)b * T + i) * C + h * hs + e] = s;
                    }
                }
            }
        }
        free(r), free(sc);
        break;
    }
    case RP_LAYER_ADD:
    case RP_LAYER_MUL:
    case RP_LAYER_CONCAT:
        break; /* graph's: ref_model reads their inputs */
    case RP_LAYER_BATCHNORM2D:
    case RP_LAYER_BATCHNORM1D: { /* training: the micro-batch's mean and biased variance */
        int C = L->in.dim[0];
        size_t HW = in / C;
        for (int ch = 0; ch < C; ch++) {
            double mean = 0, var = 0, N = (double)B * HW;
            for (int b = 0; b < B; b++)
                for (size_t p = 0; p < HW; p++)
                    mean += x[b * in + ch * HW + p] / N;
            for (int b = 0; b < B; b++)
                for (size_t p = 0; p < HW; p++)
                    var += (x[b * in + ch * HW + p] - mean) * (x[b * in + ch * HW + p] - mean) / N;
            for (int b = 0; b < B; b++)
                for (size_t p = 0; p < HW; p++)
                    y[b * in + ch * HW + p] =
                        (x[b * in + ch * HW + p] - mean) / sqrt(var + L->eps) * w[ch] + w[C + ch];
        }
        break;
    }
    case RP_LAYER_RELU:
        for (size_t i = 0; i < in * B; i++)
            y[i] = x[i] > 0 ? x[i] : 0;
        break;
    case RP_LAYER_GELU:
        for (size_t i = 0; i < in * B; i++)
            y[i] = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0)));
        break;
    case RP_LAYER_FLATTEN:
        memcpy(y, x, sizeof(double) * in * B);
        break;
    case RP_LAYER_DROPOUT:
        /* the mask is repipe's definition: (seed, update, sample id, layer, element) */
        for (int b = 0; b < B; b++)
            for (size_t e = 0; e < in; e++) {
                float u = rp_uniform(c->ctx->seed, c->ctx->update,
                                     (uint64_t)c->ctx->sample_id[b], 0, e);
                y[b * in + e] = u < L->p ? 0 : x[b * in + e] / (1.0 - L->p);
            }
        break;
    case RP_LAYER_LAYERNORM: {
        int D = L->in.dim[L->in.ndim - 1];
        size_t rows = in / D * B;
        for (size_t r = 0; r < rows; r++) {
            double mean = 0, var = 0;
            for (int d = 0; d < D; d++)
                mean += x[r * D + d] / D;
            for (int d = 0; d < D; d++)
                var += (x[r * D + d] - mean) * (x[r * D + d] - mean) / D;
            for (int d = 0; d < D; d++)
                y[r * D + d] = (x[r * D + d] - mean) / sqrt(var + L->eps) * w[d] + w[D + d];
        }
        break;
    }
    case RP_LAYER_RMSNORM: { /* x / sqrt(mean(x^2) + eps) x weight */
        int D = L->in.dim[L->in.ndim - 1];
        for (size_t r = 0; r < in / D * B; r++) {
            double ms = 0;
            for (int d = 0; d < D; d++)
                ms += x[r * D + d] * x[r * D + d] / D;
            for (int d = 0; d < D; d++)
                y[r * D + d] = x[r * D + d] / sqrt(ms + L->eps) * w[d];
        }
        break;
    }
    case RP_LAYER_EMBEDDING:
        for (size_t t = 0; t < in * B; t++)
            for (int d = 0; d < L->dim; d++)
                y[t * L->dim + d] = w[(size_t)x[t] * L->dim + d];
        break;
    case RP_LAYER_POSITION_EMBEDDING:
        for (int b = 0; b < B; b++)
            for (size_t e = 0; e < in; e++)
                y[b * in + e] = x[b * in + e] + w[e];
        break;
    case RP_LAYER_TRANSFORMER_BLOCK:
        ref_block(c, x, w, y);
        break;
    case RP_LAYER_MOE:
        ref_moe(c, x, w, y);
        break;
    case RP_LAYER_SOFTMAX_CE: { /* a sample's loss: the mean over its T rows */
        int C = L->in.dim[L->in.ndim - 1], T = L->in.ndim == 2 ? L->in.dim[0] : 1;
        for (int b = 0; b < B; b++) {
            y[b] = 0;
            for (int t = 0; t < T; t++) {
                const double *z = x + ((size_t)b * T + t) * C;
                double m = -1e300, s = 0;
                for (int k = 0; k < C; k++)
                    m = z[k] > m ? z[k] : m;
                for (int k = 0; k < C; k++)
                    s += exp(z[k] - m);
                y[b] += (log(s) + m - z[c->ctx->labels[b * T + t]]) / T;
            }
        }
        break;
    }
    }
    (void)out;
}

/* The whole model in double precision, layer by layer from the tensors each
** reads; the last layer's output into y. */
static void ref_model(const refctx *c, const double *x, const double *w, double *y) {
    const rp_model *m = c->m;
    double **t = calloc(m->num_layers, sizeof(double *));
    for (int l = 0; l < m->num_layers; l++) {
        const rp_layer *L = &m->layers[l];
        refctx lc = *c;
        lc.L = L;
        size_t on = rp_shape_size(&L->out) * c->B;
        double *o = t[l] = malloc(sizeof(double) * on);
#define TENSOR(k) (L->inputs[k] < 0 ? x : t[L->inputs[k]])
        if (L->type == RP_LAYER_ADD) {
            for (size_t e = 0; e < on; e++) {
                o[e] = 0;
                for (int k = 0; k < L->num_inputs; k++)
                    o[e] += TENSOR(k)[e];
            }
        } else if (L->type == RP_LAYER_MUL) {
            for (size_t e = 0; e < on; e++)
                o[e] = TENSOR(0)[e] * TENSOR(1)[e];
        } else if (L->type == RP_LAYER_CONCAT) {
            size_t per = rp_shape_size(&L->out), at = 0;
            for (int k = 0; k < L->num_inputs; k++) {
                size_t n = rp_shape_size(rp_model_tensor_shape(m, L->inputs[k]));
                for (int b = 0; b < c->B; b++)
                    memcpy(o + b * per + at, TENSOR(k) + b * n, sizeof(double) * n);
                at += n;
            }
        } else {
            ref_forward(&lc, TENSOR(0), w + L->param_offset, o);
        }
#undef TENSOR
    }
    const rp_layer *last = &m->layers[m->num_layers - 1];
    memcpy(y, t[m->num_layers - 1], sizeof(double) * rp_shape_size(&last->out) * c->B);
    for (int l = 0; l < m->num_layers; l++)
        free(t[l]);
    free(t);
}

/* The objective: sum(out * r); for the loss layer, loss_scale * sum(loss). */
static double objective(const refctx *c, const double *x, const double *w, const double *r,
                        double *y) {
    ref_balance = 0;
    ref_model(c, x, w, y);
    size_t out = rp_shape_size(&c->L->out) * c->B;
    double s = ref_balance;
    for (size_t i = 0; i < out; i++)
        s += c->L->type == RP_LAYER_SOFTMAX_CE ? y[i] * c->ctx->loss_scale : y[i] * r[i];
    return s;
}

static unsigned long long rng = 0x2545F4914F6CDD1Dull;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (rng >> 11) * (1.0 / 9007199254740992.0);
}

/* Checks a model given as spec text: one layer, or a graph whose last
** layer's output is the objective's. */
static void check_layer(const char *spec, int B) {
    rp_model *m;
    rp_error err;
    if (rp_model_parse(&m, spec, strlen(spec), "gradcheck", &err) != RP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        test_failures++;
        return;
    }
    const rp_layer *L = &m->layers[m->num_layers - 1];
    size_t in = rp_shape_size(&m->input) * B, out = rp_shape_size(&L->out) * B;
    size_t np = m->num_params;
    rp_net *net;
    rp_acts *acts;
    CHECK(rp_net_create(m, 0, m->num_layers, B, &net, &err) == RP_OK);
    CHECK(rp_acts_create(net, B, &acts, &err) == RP_OK);
    float *xf = malloc(sizeof(float) * in), *rf = malloc(sizeof(float) * out);
    double *x = malloc(sizeof(double) * in), *w = malloc(sizeof(double) * (np + 1));
    double *r = calloc(out, sizeof(double)), *y = malloc(sizeof(double) * out);
    int64_t ids[16];
    int32_t labels[256];
    for (int b = 0; b < B; b++)
        ids[b] = 1000 + 7 * b;
    for (int i = 0; i < B * m->num_targets; i++) /* a class per sample, or per token */
        labels[i] = (i * 3 + 1) % (m->num_classes ? m->num_classes : 1);
    rp_step_ctx ctx = {.training = true, .seed = 5, .update = 3, .sample_id = ids,
                       .labels = labels, .loss_scale = 1.0 / B};
    refctx c = {m, L, B, &ctx};
    /* inputs away from the kinks of relu and maxpool, token ids for embeddings */
    for (size_t i = 0; i < in; i++) {
        double v = urand() * 4 - 2;
        if (fabs(v) < 0.05)
            v = v < 0 ? -0.05 - urand() : 0.05 + urand();
        if (m->layers[0].type == RP_LAYER_EMBEDDING)
            v = (double)(i * 5 % m->layers[0].vocab);
        xf[i] = (float)v;
        x[i] = xf[i];
    }
    float *pf = rp_net_params(net);
    for (size_t i = 0; i < np; i++) {
        pf[i] = (float)(urand() - 0.5);
        w[i] = pf[i];
    }
    for (size_t i = 0; i < out; i++) {
        rf[i] = (float)(urand() * 2 - 1);
        r[i] = rf[i];
    }
    const float *yf = rp_net_forward(net, acts, xf, B, &ctx, NULL);
    CHECK(yf != NULL);
    objective(&c, x, w, r, y);
    double ymax = 0;
    for (size_t i = 0; i < out; i++)
        ymax = fabs(y[i]) > ymax ? fabs(y[i]) : ymax;
    size_t bad = 0;
    for (size_t i = 0; yf && i < out; i++)
        bad += !(fabs(yf[i] - y[i]) <= 1e-5 * (ymax + 1));
    test_checks++;
    if (bad) {
        fprintf(stderr, "%s: forward differs from the reference in %zu of %zu\n", spec, bad, out);
        test_failures++;
    }
    /* after rp_net_zero_grads the next backward writes every gradient (it
    ** clears no memory, only the layers' flags): what a layer leaves
    ** unwritten shows as NaN */
    for (size_t i = 0; i < np; i++)
        rp_net_grads(net)[i] = NAN;
    rp_net_zero_grads(net);
    bool want_din = m->layers[0].type != RP_LAYER_EMBEDDING;
    const float *din = rp_net_backward(net, acts, rf, &ctx, want_din);
    /* central differences of the double reference */
    double h = 1e-6;
    size_t nchk = (want_din ? in : 0) + np;
    double *fd = malloc(sizeof(double) * (nchk + 1)), *an = malloc(sizeof(double) * (nchk + 1));
    size_t k = 0;
    for (size_t i = 0; want_din && i < in; i++, k++) {
        double keep = x[i];
        x[i] = keep + h;
        double up = objective(&c, x, w, r, y);
        x[i] = keep - h;
        double dn = objective(&c, x, w, r, y);
        x[i] = keep;
        fd[k] = (up - dn) / (2 * h);
        an[k] = din[i];
    }
    for (size_t i = 0; i < np; i++, k++) {
        double keep = w[i];
        w[i] = keep + h;
        double up = objective(&c, x, w, r, y);
        w[i] = keep - h;
        double dn = objective(&c, x, w, r, y);
        w[i] = keep;
        fd[k] = (up - dn) / (2 * h);
        an[k] = rp_net_grads(net)[i];
    }
    double scale = 0;
    for (size_t i = 0; i < nchk; i++)
        scale = fabs(fd[i]) > scale ? fabs(fd[i]) : scale;
    bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < nchk; i++)
        if (!(fabs(an[i] - fd[i]) <= 1e-4 * (fabs(fd[i]) + scale) + 1e-7)) {
            if (!bad++)
                first = i;
        }
    test_checks++;
    if (bad) {
        fprintf(stderr, "%s: %zu of %zu gradients differ; first [%zu]: %.8g vs %.8g\n", spec, bad,
                nchk, first, an[first], fd[first]);
        test_failures++;
    }
    CHECK(nchk > 0);
    free(fd), free(an), free(xf), free(rf), free(x), free(w), free(r), free(y);
    rp_acts_free(acts);
    rp_net_free(net);
    rp_model_free(m);
}

/* Both GELUs against the double-precision formulas and their gradients, on
** a grid over [-12, 12] and at the ends of the exp's range, errors over
** max(1, |x|): GPT-2's tanh form (its tanh from a polynomial exp) within 2e-7
** and 5e-7 for its gradient (with glibc's tanhf: 1.3e-7); the erf form (from
** erfc's Chebyshev fit) within 2e-7 and 3e-7 (1.1e-7 and 1.8e-7 measured). */
static void gelu_accuracy(bool erf_form) {
    enum { N = 48001 };
    static float x[N + 4], y[N + 4], d[N + 4];
    for (int i = 0; i < N; i++)
        x[i] = -12.0f + 24.0f * i / (N - 1);
    x[N] = -200, x[N + 1] = 200, x[N + 2] = 1e-30f, x[N + 3] = -3e-4f;
    for (int i = 0; i < N + 4; i++)
        d[i] = 1;
    (erf_form ? rpi_gelu_forward : rpi_gelu_tanh_forward)(x, y, N + 4);
    (erf_form ? rpi_gelu_backward : rpi_gelu_tanh_backward)(x, d, d, N + 4);
    const double pi = 3.14159265358979323846, k = sqrt(2.0 / pi);
    double worst = 0, worst_d = 0;
    for (int i = 0; i < N + 4; i++) {
        double v = x[i], want, dwant;
        if (erf_form) {
            double cdf = 0.5 * erfc(-v / sqrt(2.0));
            want = v * cdf, dwant = cdf + v * exp(-0.5 * v * v) / sqrt(2 * pi);
        } else {
            double t = tanh(k * (v + 0.044715 * v * v * v));
            want = 0.5 * v * (1 + t);
            dwant = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
        }
        double scale = fabs(v) > 1 ? fabs(v) : 1;
        worst = fmax(worst, fabs(y[i] - want) / scale);
        worst_d = fmax(worst_d, fabs(d[i] - dwant) / scale);
    }
    CHECKF(worst <= 2e-7 && worst_d <= (erf_form ? 3e-7 : 5e-7),
           "gelu %s: error %g, of the gradient %g", erf_form ? "erf" : "tanh", worst, worst_d);
}

/* A NaN stays a NaN through the exponential the loss and attention use (a
** diverging run's scores must show), and is never converted to an integer
** (undefined behaviour, which the sanitized build reports). */
static void exp_of_nan(void) {
    float nan[2] = {NAN, -NAN}, e[2];
    for (int i = 0; i < 2; i++)
        e[i] = rpi_expf(nan[i]);
    CHECK(isnan(e[0]) && isnan(e[1]));
    CHECK(rpi_expf(0.0f) == 1.0f && rpi_expf(-1000.0f) < 1e-37f && isfinite(rpi_expf(1000.0f)));
}

/* oneDNN's convolutions against im2col's on the same net, input and
** output gradient: the output, the input's gradient and the weights'
** (written, then added to: the accumulating path) within 1e-5 of the
** largest value, whole and in a split backward's two halves. Each spec
** says which kernel its layer gets where oneDNN is built in
** (REPIPE_EXPECT_DNNL): oneDNN unless the lowering keeps only some taps. */
static void onednn_equals_im2col(const char *spec, int B, const char *kernel) {
    rp_model *m;
    rp_error err;
    if (rp_model_parse(&m, spec, strlen(spec), "onednn", &err) != RP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        test_failures++;
        return;
    }
    int l = m->num_layers - 1;
    size_t in = rp_shape_size(&m->input) * B, out = rp_shape_size(&m->layers[l].out) * B;
    size_t np = m->num_params;
    rp_net *net[3];
    rp_acts *acts[3];
    float *x = malloc(sizeof(float) * in), *r = malloc(sizeof(float) * out);
    for (size_t i = 0; i < in; i++)
        x[i] = (float)(urand() * 2 - 1);
    for (size_t i = 0; i < out; i++)
        r[i] = (float)(urand() * 2 - 1);
    int64_t ids[16] = {0};
    rp_step_ctx ctx = {.training = true, .seed = 5, .sample_id = ids, .loss_scale = 1.0};
    const float *y[3], *din[3];
    float *g[3][3]; /* each net's gradients: written, then twice that, then split */
    /* oneDNN's, im2col's, and im2col's a sample a tile */
    for (int k = 0; k < 3; k++) {
        rp_net_options o = {.conv_kernel = k >= 1 ? RP_CONV_IM2COL : RP_CONV_ONEDNN,
                            .split_backward = true, .scratch_least = k == 2};
        CHECK(rp_net_create_with(m, 0, m->num_layers, B, &o, &net[k], &err) == RP_OK);
        CHECK(rp_acts_create(net[k], B, &acts[k], &err) == RP_OK);
        float *p = rp_net_params(net[k]);
        srand(7);
        for (size_t i = 0; i < np; i++)
            p[i] = (float)((double)rand() / RAND_MAX) - 0.5f;
        y[k] = rp_net_forward(net[k], acts[k], x, B, &ctx, NULL);
        rp_net_zero_grads(net[k]);
        din[k] = rp_net_backward(net[k], acts[k], r, &ctx, true);
        for (int j = 0; j < 3; j++)
            g[k][j] = malloc(sizeof(float) * (np + 1));
        memcpy(g[k][0], rp_net_grads(net[k]), sizeof(float) * np);
        rp_net_backward(net[k], acts[k], r, &ctx, false);
        memcpy(g[k][1], rp_net_grads(net[k]), sizeof(float) * np);
        rp_net_zero_grads(net[k]);
        rp_net_backward_input(net[k], acts[k], r, &ctx, true);
        rp_net_backward_weight(net[k], acts[k], &ctx);
        memcpy(g[k][2], rp_net_grads(net[k]), sizeof(float) * np);
    }
    const char *got = rp_net_conv_kernel(net[0], l);
#ifndef REPIPE_EXPECT_DNNL
    kernel = "im2col";
#endif
    if (getenv("REPIPE_CONV") && strcmp(getenv("REPIPE_CONV"), "im2col") == 0)
        kernel = "im2col"; /* the process keeps im2col everywhere */
    CHECKF(got && strcmp(got, kernel) == 0, "%s: the kernel is %s, not %s", spec,
           got ? got : "none", kernel);
    CHECK(strcmp(rp_net_conv_kernel(net[1], l), "im2col") == 0);
    struct { const float *a, *b; size_t n; const char *what; } pairs[] = {
        {y[0], y[1], out, "output"},          {din[0], din[1], in, "input gradient"},
        {g[0][0], g[1][0], np, "weights' gradient"}, {g[0][1], g[1][1], np, "accumulated"},
        {g[0][2], g[1][2], np, "split backward's"},
        {y[2], y[1], out, "tiled output"},    {din[2], din[1], in, "tiled input gradient"},
        {g[2][0], g[1][0], np, "tiled weights' gradient"},
        {g[2][1], g[1][1], np, "tiled, accumulated"}, {g[2][2], g[1][2], np, "tiled, split"},
    };
    for (size_t q = 0; q < sizeof pairs / sizeof *pairs; q++) {
        double big = 0, diff = 0;
        for (size_t i = 0; i < pairs[q].n; i++) {
            big = fmax(big, fabs(pairs[q].b[i]));
            diff = fmax(diff, fabs((double)pairs[q].a[i] - pairs[q].b[i]));
        }
        CHECKF(diff <= 1e-5 * (big + 1e-30) && big > 0, "%s: %s differs by %g (largest %g)", spec,
               pairs[q].what, diff, big);
    }
    for (int k = 0; k < 3; k++) {
        for (int j = 0; j < 3; j++)
            free(g[k][j]);
        rp_acts_free(acts[k]);
        rp_net_free(net[k]);
    }
    free(x), free(r);
    rp_model_free(m);
}

/* The kernel a net chooses by itself (RP_CONV_AUTO): oneDNN's for 8 or
** more input channels a group (or groups) and 256 or more output
** positions but for planes of 4 positions or fewer without groups and 1 x 1
** kernels at a stride onto planes under 64 positions (groups aside),
** im2col's for the rest. */
static void conv_kernel_choice(void) {
    static const struct { const char *spec; int B; const char *kernel; } cases[] = {
        {"input 1 28 28\nconv2d 8 kernel=7 stride=2 pad=3\n", 4, "im2col"}, /* a stem */
        {"input 16 8 8\nconv2d 16 kernel=3 pad=1\n", 4, "onednn"},         /* 256 positions */
        {"input 16 8 8\nconv2d 16 kernel=3 pad=1\n", 3, "im2col"},         /* 192 */
        {"input 16 8 8\nconv2d 16 kernel=3 pad=1 groups=16\n", 4, "onednn"},
        {"input 16 1 1\nconv2d 16 kernel=3 pad=1\n", 512, "im2col"}, /* taps kept */
        /* planes of 4 positions and fewer: a position to a row, groups aside */
        {"input 16 4 4\nconv2d 16 kernel=3 stride=2 pad=1\n", 64, "im2col"},
        {"input 16 2 2\nconv2d 16 kernel=3 pad=1 groups=16\n", 64, "onednn"},
        {"input 16 3 3\nconv2d 16 kernel=3 pad=1\n", 64, "onednn"}, /* 9 positions */
        /* 1 x 1 at stride 1: a product a sample from 64 positions a plane */
        {"input 16 8 8\nconv2d 16 kernel=1\n", 4, "im2col"},
        {"input 16 4 4\nconv2d 16 kernel=1\n", 16, "onednn"},
        /* 1 x 1 at a stride: im2col's onto planes under 64 positions */
        {"input 16 8 8\nconv2d 16 kernel=1 stride=2\n", 16, "im2col"},
        {"input 16 14 16\nconv2d 16 kernel=1 stride=2\n", 8, "im2col"}, /* 7 x 8 */
        {"input 16 16 16\nconv2d 16 kernel=1 stride=2\n", 4, "onednn"},
        {"input 16 8 8\nconv2d 16 kernel=1 stride=2 groups=2\n", 16, "onednn"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        rp_model *m;
        rp_net *net;
        rp_error err;
        CHECK(rp_model_parse(&m, cases[i].spec, strlen(cases[i].spec), "choice", &err) == RP_OK);
        CHECK(rp_net_create(m, 0, m->num_layers, cases[i].B, &net, &err) == RP_OK);
        const char *want = cases[i].kernel, *got = rp_net_conv_kernel(net, 0);
#ifndef REPIPE_EXPECT_DNNL
        want = "im2col";
#endif
        if (getenv("REPIPE_CONV") && strcmp(getenv("REPIPE_CONV"), "im2col") == 0)
            want = "im2col";
        CHECKF(got && strcmp(got, want) == 0, "%s at batch %d: %s, not %s", cases[i].spec,
               cases[i].B, got ? got : "none", want);
        rp_net_free(net);
        rp_model_free(m);
    }
}

int main(void) {
    gelu_accuracy(false);
    gelu_accuracy(true);
    exp_of_nan();
    conv_kernel_choice();
    /* the convolutions of torchvision's ResNets, VGG, MobileNet and DenseNet:
    ** 7 x 7 stride 2, 3 x 3 with and without stride, 1 x 1 with stride,
    ** groups and depthwise, bias or none, a batch not a tile's multiple */
    onednn_equals_im2col("input 3 16 16\nconv2d 8 kernel=7 stride=2 pad=3 bias=false\n",
                         3, "onednn");
    onednn_equals_im2col("input 8 7 7\nconv2d 8 kernel=3 pad=1 bias=false\n",
                         5, "onednn");
    onednn_equals_im2col("input 8 7 7\nconv2d 16 kernel=3 stride=2 pad=1\n",
                         2, "onednn");
    onednn_equals_im2col("input 8 7 7\nconv2d 16 kernel=1 stride=2 bias=false\n",
                         3, "onednn");
    onednn_equals_im2col("input 3 9 9\nconv2d 4 kernel=3 pad=1\n",
                         4, "onednn");
    onednn_equals_im2col("input 8 6 6\nconv2d 8 kernel=3 pad=1 groups=8 bias=false\n",
                         3, "onednn");
    onednn_equals_im2col("input 4 6 5\nconv2d 6 kernel=3 pad=1 groups=2\n",
                         2, "onednn");
    onednn_equals_im2col("input 6 5 5\nconv2d 4 kernel=1\n",
                         3, "onednn");
    /* a 3 x 3 kernel on a 1 x 1 plane: one tap reaches it; im2col keeps that one */
    onednn_equals_im2col("input 8 1 1\nconv2d 8 kernel=3 pad=1\n",
                         3, "im2col");
    /* outputs of one position, which im2col lowers a sample to a row: a
    ** ResNet's 1 x 1 downsampling on 2 x 2 planes, a 3 x 3 kernel whose
    ** taps all reach, with groups */
    onednn_equals_im2col("input 8 2 2\nconv2d 16 kernel=1 stride=2\n",
                         5, "onednn");
    onednn_equals_im2col("input 8 3 3\nconv2d 8 kernel=3 groups=2 bias=false\n",
                         3, "onednn");
    /* planes of 2 x 2 and 1 x 3, a position to a row: at stride 2, at the
    ** input's size, in groups */
    onednn_equals_im2col("input 8 4 4\nconv2d 16 kernel=3 stride=2 pad=1\n", 5, "onednn");
    onednn_equals_im2col("input 8 2 2\nconv2d 8 kernel=3 pad=1 bias=false\n", 3, "onednn");
    onednn_equals_im2col("input 8 3 5\nconv2d 6 kernel=3 stride=2 groups=2\n", 4, "onednn");
    /* 1 x 1 at stride 1 on planes of 64 positions and more, which im2col runs
    ** as a product a sample: with a bias, and in groups */
    onednn_equals_im2col("input 8 8 8\nconv2d 16 kernel=1\n", 5, "onednn");
    onednn_equals_im2col("input 8 8 9\nconv2d 6 kernel=1 groups=2 bias=false\n", 3, "onednn");
    check_layer("input 3 5\nlinear 4\n", 3);
    check_layer("input 6\nlinear 2 bias=false\n", 2);
    /* output of the input's size: the flat im2col and col2im */
    check_layer("input 2 6 5\nconv2d 3 kernel=3 pad=1\n", 2);
    check_layer("input 2 6 7\nconv2d 2 kernel=5 pad=2\n", 2);
    check_layer("input 3 4 5\nconv2d 2 kernel=1\n", 2);
    check_layer("input 2 8 8\nconv2d 3 kernel=1\n", 2); /* a product a sample */
    check_layer("input 4 8 8\nconv2d 4 kernel=1 groups=2 bias=false\n", 2);
    /* inputs no larger than the pad: some taps miss the whole plane */
    check_layer("input 2 1 1\nconv2d 3 kernel=3 pad=1\n", 2);
    check_layer("input 2 2 1\nconv2d 2 kernel=5 pad=2\n", 2);
    check_layer("input 1 1 3\nconv2d 2 kernel=3 pad=1\n", 2);
    check_layer("input 1 2 2\nconv2d 2 kernel=7 pad=3\n", 2); /* found by libFuzzer */
    /* outputs of one position: taps kept at stride 2, groups, a 1 x 1 kernel
    ** at stride 2, and more taps than a lowering keeps apart (9 x 9) */
    check_layer("input 2 2 2\nconv2d 3 kernel=3 stride=2 pad=1 bias=false\n", 3);
    check_layer("input 4 1 1\nconv2d 6 kernel=3 pad=1 groups=2\n", 2);
    check_layer("input 3 2 2\nconv2d 4 kernel=1 stride=2\n", 3);
    check_layer("input 1 1 1\nconv2d 2 kernel=9 pad=4\n", 2);
    check_layer("input 2 1 1\nconv2d 2 kernel=2 stride=9 pad=3\n", 2); /* no tap reaches */
    /* outputs of 2 to 4 positions, a position to a row: 2 x 2 at stride 2,
    ** at the input's size (every tap reaching), 1 x 3 in groups, 2 x 2 on a
    ** 1 x 1 input (taps kept) */
    check_layer("input 2 4 4\nconv2d 3 kernel=3 stride=2 pad=1\n", 3);
    check_layer("input 3 2 2\nconv2d 2 kernel=3 pad=1 bias=false\n", 2);
    check_layer("input 4 3 5\nconv2d 4 kernel=3 stride=2 groups=2\n", 2);
    check_layer("input 2 1 1\nconv2d 2 kernel=2 pad=1\n", 2);
    /* the row by row ones */
    check_layer("input 2 6 5\nconv2d 3 kernel=3\n", 2);
    check_layer("input 2 7 7\nconv2d 2 kernel=3 stride=2\n", 2);
    check_layer("input 3 6 6\nconv2d 2 kernel=2 stride=2 pad=1 bias=false\n", 2);
    check_layer("input 2 6 4\nmaxpool2d 2\n", 2);
    check_layer("input 1 7 7\nmaxpool2d 3 stride=2\n", 2);
    check_layer("input 2 7 6\nmaxpool2d 3 stride=2 pad=1\n", 2); /* ResNet's */
    check_layer("input 9\nrelu\n", 3);
    check_layer("input 2 5\ngelu\n", 3);
    check_layer("input 2 3 2\nflatten\n", 2);
    check_layer("input 20\ndropout 0.3\n", 3);
    check_layer("input 3 6\nlayernorm\n", 2);
    check_layer("input 2 37\nlayernorm\n", 2); /* a row past its 32 running sums */
    check_layer("input 5\nembedding 7 3\n", 2);
    check_layer("input 4 3\nposition_embedding\n", 3);
    check_layer("input 6\nsoftmax_cross_entropy\n", 4);
    check_layer("input 5 7\nsoftmax_cross_entropy\n", 3); /* a target per token */
    /* blocks: one head and several, both GELUs, a narrow MLP, dropout on both branches */
    check_layer("input 4 6\ntransformer_block heads=2\n", 2);
    check_layer("input 5 4\ntransformer_block heads=1 mlp=2 gelu=erf\n", 2);
    check_layer("input 3 8\ntransformer_block heads=4 dropout=0.3\n", 3);
    /* more positions than a block of attention rows (64): three blocks */
    check_layer("input 130 4\ntransformer_block heads=2 mlp=1\n", 2);
    check_layer("input 4 7 6\navgpool2d 2\n", 2);
    check_layer("input 2 7 7\navgpool2d 3 stride=2 pad=1\n", 2);
    check_layer("input 3 7 5\nadaptive_avgpool2d\n", 2);
    check_layer("input 2 7 5\nadaptive_avgpool2d 3\n", 2); /* windows that overlap */
    check_layer("input 11\nsigmoid\n", 3);
    check_layer("input 2 7\nsilu\n", 3);
    /* attention: multi-head, grouped-query (4 heads on 2 key/value heads), rotary */
    check_layer("input 5 12\nattention heads=2\n", 2);
    check_layer("input 6 32\nattention heads=4 kv_heads=2 rope_theta=10000\n", 2);
    check_layer("input 4 16\nattention heads=2 kv_heads=1 rope_theta=100\n", 3);
    /* a LLaMA block as a graph: RMSNorm, fused QKV, attention, its projection and the
    ** residual, then SwiGLU's MLP and the second residual */
    check_layer("x = input 4 8\nrmsnorm\nlinear 16 bias=false\n"
                "attention heads=2 kv_heads=1 rope_theta=10000\no = linear 8 bias=false\n"
                "x1 = add < o x\nn = rmsnorm\nlinear 12 bias=false\ns = silu\n"
                "u = linear 12 bias=false < n\nmul < s u\nm = linear 8 bias=false\n"
                "add < m x1\n", 2);
    /* mixtures of experts: softmax and sigmoid gates, normalised or not, the
    ** balance loss; one token a sample and six; every expert chosen (K = E) */
    check_layer("input 6 5\nmoe experts=4 top_k=2 ffn=3\n", 2);
    check_layer("input 6 5\nmoe experts=4 top_k=2 ffn=3 balance=0.5\n", 2);
    check_layer("input 6 5\nmoe experts=5 top_k=3 ffn=4 gate=sigmoid balance=0.3\n", 2);
    check_layer("input 4 6\nmoe experts=3 top_k=1 ffn=2 norm=false balance=1\n", 3);
    check_layer("input 6\nmoe experts=3 top_k=3 ffn=4 gate=sigmoid norm=false\n", 3);
    /* an MoE block as a graph: the experts replace SwiGLU's lines */
    check_layer("x = input 4 8\nrmsnorm\nlinear 16 bias=false\n"
                "attention heads=2 kv_heads=1 rope_theta=10000\no = linear 8 bias=false\n"
                "x1 = add < o x\nn = rmsnorm\nm = moe experts=4 ffn=6 balance=0.1\n"
                "add < m x1\n", 2);
    /* SwiGLU, LLaMA's MLP, as a graph: W2 (silu(W1 x) * W3 x), and a square */
    check_layer("x = input 3 6\nrmsnorm\nn = linear 8 bias=false\ng = silu\n"
                "u = linear 8 bias=false < n\nmul < g u\nm = linear 6 bias=false\nadd < m x\n", 2);
    check_layer("input 5\nh = linear 4\nmul < h h\nlinear 3\n", 2);
    check_layer("input 2 5\ntanh\n", 3);
    check_layer("input 3 4 5\nbatchnorm2d\n", 3);
    check_layer("input 3 6\nrmsnorm\n", 2);
    check_layer("input 9\nrmsnorm eps=1e-3\n", 3);
    check_layer("input 6\nbatchnorm1d eps=1e-3\n", 4);
    check_layer("input 3 5\nbatchnorm1d momentum=0.5\n", 2);
    /* past one block of 32 channels, the last block part-full (batchnorm
    ** walks blocks of channels sample by sample) */
    check_layer("input 37 2 3\nbatchnorm2d\n", 2);
    check_layer("input 70\nbatchnorm1d\n", 3);
    /* a residual block as ResNet's: conv, norm, relu, conv, norm, the sum */
    check_layer("x = input 2 4 4\nconv2d 2 kernel=3 pad=1 bias=false\nbatchnorm2d\nrelu\n"
                "conv2d 2 kernel=3 pad=1 bias=false\nb = batchnorm2d\nadd < b x\nrelu\n", 3);
    check_layer("input 4 6 5\nconv2d 6 kernel=3 pad=1 groups=2\n", 2);
    check_layer("input 4 5 5\nconv2d 4 kernel=3 stride=2 groups=4 bias=false\n", 2); /* depthwise */
    /* graphs: a residual (the input read twice), a concat of three, a
    ** tensor read by three layers, and an add of one tensor with itself */
    check_layer("x = input 2 5 4\nconv2d 2 kernel=3 pad=1\nr = relu\nadd < r x\n", 2);
    check_layer("x = input 2 5 4\nconv2d 2 kernel=3 pad=1\nr = relu\nb = conv2d 2 kernel=3 pad=1\n"
                "add < b x r\n", 2);
    check_layer("x = input 2 4 4\na = conv2d 3 kernel=1\nb = conv2d 1 kernel=3 pad=1 < x\n"
                "c = tanh < a\nconcat < a b c x\nflatten\nlinear 3\n", 2);
    check_layer("input 6\nh = linear 5\nr1 = relu\ns = sigmoid < h\nt = tanh < h\n"
                "add < r1 s t\nlinear 4\n", 2);
    check_layer("input 6\nh = linear 5\nadd < h h\nlinear 2\nsoftmax_cross_entropy\n", 3);
    return test_finish("test_layers");
}
