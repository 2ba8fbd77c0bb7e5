/*
** Batch normalisation over a channel's values in a micro-batch (PyTorch's
** BatchNorm1d and BatchNorm2d on one device). A sample's row is C channels
** of HW values each: (channels x height x width), (channels x length), or
** C features with HW = 1. The parameters are weight and bias (C each) and
** the running mean and variance (C each), which only evaluation reads; the
** net updates them from the statistics forward records (net.c).
*/
#include <math.h>
#include <string.h>

#include "layers.h"

/* channels, and values per channel in one sample */
static void bn_dims(const rp_layer *L, int *C, size_t *HW) {
    *C = L->in.dim[0];
    *HW = rp_shape_size(&L->in) / (size_t)*C;
}

rp_status rpi_batchnorm_forward(const layer_args *a, rp_error *err) {
    const rp_layer *L = a->L;
    int C;
    size_t HW, per = rp_shape_size(&L->in);
    bn_dims(L, &C, &HW);
    const float *g = a->w, *beta = a->w + C, *rm = a->w + 2 * C, *rv = a->w + 3 * C;
    if (!a->ctx->training) { /* the running statistics */
        for (int c = 0; c < C; c++) {
            float k = g[c] / sqrtf(rv[c] + L->eps), m = rm[c];
            for (int b = 0; b < a->B; b++) {
                const float *x = a->in + b * per + (size_t)c * HW;
                float *y = a->out + b * per + (size_t)c * HW;
                for (size_t p = 0; p < HW; p++)
                    y[p] = (x[p] - m) * k + beta[c];
            }
        }
        return RP_OK;
    }
    double N = (double)a->B * HW;
    if (N < 2)
        return rp_fail(err, RP_ERR_INVALID,
                       "layer %d (%s, line %d): a micro-batch of one value per channel has no "
                       "variance to normalise by (PyTorch refuses it too): use micro_batch_size "
                       "2 or more",
                       a->index, rp_layer_name(L->type), L->line);
    float *mean = a->aux, *rstd = (float *)a->aux + C;
    int slot = a->ctx->stat_slot - 1;
    float *rec = a->stats && slot >= 0 ? a->stats + (size_t)slot * (2 * C + 1) : NULL;
    for (int c = 0; c < C; c++) {
        double s = 0, v = 0; /* two passes in double: no cancellation */
        for (int b = 0; b < a->B; b++) {
            const float *x = a->in + b * per + (size_t)c * HW;
            for (size_t p = 0; p < HW; p++)
                s += x[p];
        }
        double mu = s / N;
        for (int b = 0; b < a->B; b++) {
            const float *x = a->in + b * per + (size_t)c * HW;
            for (size_t p = 0; p < HW; p++)
                v += (x[p] - mu) * (x[p] - mu);
        }
        mean[c] = (float)mu;
        rstd[c] = (float)(1.0 / sqrt(v / N + L->eps));
        if (rec) { /* the unbiased variance, as PyTorch's running_var takes it */
            rec[c] = mean[c];
            rec[C + c] = (float)(v / (N - 1));
        }
        float m = mean[c], k = rstd[c] * g[c];
        for (int b = 0; b < a->B; b++) {
            const float *x = a->in + b * per + (size_t)c * HW;
            float *y = a->out + b * per + (size_t)c * HW;
            for (size_t p = 0; p < HW; p++)
                y[p] = (x[p] - m) * k + beta[c];
        }
    }
    if (rec)
        rec[2 * C] = 1.0f;
    return RP_OK;
}

/* dx = weight rstd (dy - mean(dy) - xhat mean(dy xhat)) with xhat the
** normalised input; the statistics' own rows get no gradient */
void rpi_batchnorm_backward(const layer_args *a, const float *dout, float *din) {
    const rp_layer *L = a->L;
    int C;
    size_t HW, per = rp_shape_size(&L->in);
    bn_dims(L, &C, &HW);
    const float *g = a->w, *mean = a->aux, *rstd = (const float *)a->aux + C;
    float *dg = a->dw, *db = a->dw + C;
    double N = (double)a->B * HW;
    for (int c = 0; c < C; c++) {
        double sg = 0, sgx = 0;
        float m = mean[c], r = rstd[c];
        for (int b = 0; b < a->B; b++) {
            const float *x = a->in + b * per + (size_t)c * HW, *dy = dout + b * per + (size_t)c * HW;
            for (size_t p = 0; p < HW; p++) {
                sg += dy[p];
                sgx += dy[p] * ((x[p] - m) * r);
            }
        }
        dg[c] = (float)(a->accumulate ? dg[c] + sgx : sgx);
        db[c] = (float)(a->accumulate ? db[c] + sg : sg);
        if (!din)
            continue;
        float k = g[c] * r, mg = (float)(sg / N), mgx = (float)(sgx / N);
        for (int b = 0; b < a->B; b++) {
            const float *x = a->in + b * per + (size_t)c * HW, *dy = dout + b * per + (size_t)c * HW;
            float *dx = din + b * per + (size_t)c * HW;
            for (size_t p = 0; p < HW; p++)
                dx[p] = k * (dy[p] - mg - (x[p] - m) * r * mgx);
        }
    }
    if (!a->accumulate)
        memset(a->dw + 2 * C, 0, sizeof(float) * 2 * C);
}
