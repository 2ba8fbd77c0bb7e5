/*
** Normalisations: batchnorm over a channel's values in a micro-batch
** (PyTorch's BatchNorm1d and BatchNorm2d on one device), and layernorm and
** RMSNorm (LLaMA's) over a row. For batchnorm a sample's row is C channels
** of HW values each: (channels x height x width), (channels x length), or C
** features with HW = 1; its parameters are weight and bias (C each) and the
** running mean and variance (C each), which only evaluation reads; the net
** updates them from the statistics forward records (net_stats.c).
*/
#include <math.h>
#include <string.h>

#include "layers_impl.h"

/* Sums over a channel's n values in double, in 32 running sums (a fixed
** order, so every run gives the same bits; four vectors of them, so the
** loop is not held to one addition's latency): sum(x - shift) into acc[0],
** or with squares sum((x - shift)^2) into acc[1]; or, with y, sum(y) and
** sum(y (x - shift) k). */
#define LANES 32
static inline void sums(const float *restrict x, const float *restrict y, size_t n, double shift,
                        double k, bool squares, double acc[2][LANES]) {
    /* the tail, t < LANES values, goes to lanes 0 to t - 1 as value p goes
    ** to lane p % LANES (p is a multiple of LANES there): written so, it
    ** vectorises, where a plane smaller than LANES (4 x 4, 2 x 2: a
    ** ResNet's last stages) went a value at a time */
    size_t p = 0, t = n % LANES;
    if (!y && !squares) {
        for (; p + LANES <= n; p += LANES)
            for (int j = 0; j < LANES; j++)
                acc[0][j] += x[p + j] - shift;
        for (size_t j = 0; j < t; j++)
            acc[0][j] += x[p + j] - shift;
        return;
    }
    if (!y) {
        for (; p + LANES <= n; p += LANES)
            for (int j = 0; j < LANES; j++) {
                double d = x[p + j] - shift;
                acc[1][j] += d * d;
            }
        for (size_t j = 0; j < t; j++) {
            double d = x[p + j] - shift;
            acc[1][j] += d * d;
        }
        return;
    }
    for (; p + LANES <= n; p += LANES)
        for (int j = 0; j < LANES; j++) {
            acc[0][j] += y[p + j];
            acc[1][j] += y[p + j] * ((x[p + j] - shift) * k);
        }
    for (size_t j = 0; j < t; j++) {
        acc[0][j] += y[p + j];
        acc[1][j] += y[p + j] * ((x[p + j] - shift) * k);
    }
}

/* The running sums added pairwise, in a fixed tree. */
static inline double total(const double *a) {
    double t[LANES];
    memcpy(t, a, sizeof t);
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++)
            t[j] += t[j + w];
    return t[0];
}

/* channels, and values per channel in one sample */
static void bn_dims(const rp_layer *L, int *C, size_t *HW) {
    *C = L->in.dim[0];
    *HW = rp_shape_size(&L->in) / (size_t)*C;
}

/* A channel's rows are a sample apart (C HW values, often a power of two:
** walked channel by channel, 32 rows of a channel fall in the same cache
** sets and every pass missed). So each pass walks a block of CB channels
** sample by sample, the block's rows in the order they lie, with a set of
** running sums for each channel: each channel's values are still added in
** the same order, so the sums are the same bits as a channel at a time. */
#define CB 32

/* y = (x - m) k + bias over every value, in the order they lie: k is
** weight rstd with the batch's statistics (m, rstd: mean and rstd), else
** weight / sqrt(running variance + eps) with m the running mean. */
RP_HOT
static void bn_apply(const layer_args *a, int C, size_t HW, const float *m, const float *rstd) {
    const rp_layer *L = a->L;
    const float *g = a->w, *beta = a->w + C, *rv = a->w + 3 * C;
    size_t per = (size_t)C * HW;
    for (int b = 0; b < a->B; b++)
        for (int c = 0; c < C; c++) {
            const float *x = a->in + b * per + (size_t)c * HW;
            float *y = a->out + b * per + (size_t)c * HW;
            float mc = m[c], bc = beta[c];
            float k = rstd ? rstd[c] * g[c] : g[c] / sqrtf(rv[c] + L->eps);
            for (size_t p = 0; p < HW; p++)
                y[p] = (x[p] - mc) * k + bc;
        }
}

/* Channels [c0, c0 + n)'s sums over the micro-batch, as sums() takes them
** (shift[j] and k[j] for channel c0 + j, or 0 where NULL; dy NULL: of x
** alone, its squares about the shift where one is given). */
RP_HOT
static void bn_block_sums(const layer_args *a, int C, size_t HW, int c0, int n, const float *dy,
                          const double *shift, const double *k, double acc[CB][2][LANES]) {
    size_t per = (size_t)C * HW;
    memset(acc, 0, sizeof(double) * CB * 2 * LANES);
    for (int b = 0; b < a->B; b++)
        for (int j = 0; j < n; j++) {
            size_t at = b * per + (size_t)(c0 + j) * HW;
            sums(a->in + at, dy ? dy + at : NULL, HW, shift ? shift[j] : 0.0, k ? k[j] : 0.0,
                 shift != NULL, acc[j]);
        }
}

RP_HOT
rp_status rpi_batchnorm_forward(const layer_args *a, rp_error *err) {
    const rp_layer *L = a->L;
    int C;
    size_t HW;
    bn_dims(L, &C, &HW);
    if (!a->ctx->training) { /* the running statistics */
        bn_apply(a, C, HW, a->w + 2 * C, NULL);
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
    for (int c0 = 0; c0 < C; c0 += CB) {
        int n = C - c0 < CB ? C - c0 : CB;
        /* two passes in double: the mean, then the squares about it (no
        ** cancellation) */
        double acc[CB][2][LANES], mu[CB];
        bn_block_sums(a, C, HW, c0, n, NULL, NULL, NULL, acc);
        for (int j = 0; j < n; j++)
            mu[j] = total(acc[j][0]) / N;
        bn_block_sums(a, C, HW, c0, n, NULL, mu, NULL, acc);
        for (int j = 0; j < n; j++) {
            int c = c0 + j;
            double v = total(acc[j][1]);
            mean[c] = (float)mu[j];
            rstd[c] = (float)(1.0 / sqrt(v / N + L->eps));
            if (rec) { /* the unbiased variance, as PyTorch's running_var takes it */
                rec[c] = mean[c];
                rec[C + c] = (float)(v / (N - 1));
            }
        }
    }
    if (rec)
        rec[2 * C] = 1.0f;
    bn_apply(a, C, HW, mean, rstd);
    return RP_OK;
}

/* dx = weight rstd (dy - mean(dy) - xhat mean(dy xhat)) with xhat the
** normalised input; the statistics' own rows get no gradient */
RP_HOT
void rpi_batchnorm_backward(const layer_args *a, const float *dout, float *din) {
    const rp_layer *L = a->L;
    int C;
    size_t HW, per = rp_shape_size(&L->in);
    bn_dims(L, &C, &HW);
    const float *g = a->w, *mean = a->aux, *rstd = (const float *)a->aux + C;
    float *dg = a->dw, *db = a->dw + C;
    double N = (double)a->B * HW;
    for (int c0 = 0; c0 < C; c0 += CB) {
        int n = C - c0 < CB ? C - c0 : CB;
        double acc[CB][2][LANES], shift[CB], r[CB];
        for (int j = 0; j < n; j++)
            shift[j] = mean[c0 + j], r[j] = rstd[c0 + j];
        bn_block_sums(a, C, HW, c0, n, dout, shift, r, acc);
        float k[CB], mg[CB], mgx[CB];
        for (int j = 0; j < n; j++) {
            int c = c0 + j;
            double sg = total(acc[j][0]), sgx = total(acc[j][1]);
            dg[c] = (float)(a->accumulate ? dg[c] + sgx : sgx);
            db[c] = (float)(a->accumulate ? db[c] + sg : sg);
            k[j] = g[c] * rstd[c], mg[j] = (float)(sg / N), mgx[j] = (float)(sgx / N);
        }
        if (!din)
            continue;
        for (int b = 0; b < a->B; b++)
            for (int j = 0; j < n; j++) {
                size_t at = b * per + (size_t)(c0 + j) * HW;
                const float *x = a->in + at, *dy = dout + at;
                float *dx = din + at, m = mean[c0 + j], rc = rstd[c0 + j];
                for (size_t p = 0; p < HW; p++)
                    dx[p] = k[j] * (dy[p] - mg[j] - (x[p] - m) * rc * mgx[j]);
            }
    }
    if (!a->accumulate)
        memset(a->dw + 2 * C, 0, sizeof(float) * 2 * C);
}

/* Layernorm's rows. x, y: (R, D); gain g and bias b (D); stats (R, 2): the
** mean and 1/std of every row, side by side, for backward. The sums run in
** double, in running sums. */
RP_HOT
void rpi_layernorm_rows(const float *in, float *out, const float *g, const float *b,
                        float *stats, int R, int D, float eps) {
    for (int r = 0; r < R; r++) {
        const float *x = in + (size_t)r * D;
        float *y = out + (size_t)r * D;
        double acc[2][LANES] = {{0}};
        sums(x, NULL, (size_t)D, 0.0, 0.0, false, acc);
        double mean = total(acc[0]) / D;
        sums(x, NULL, (size_t)D, mean, 0.0, true, acc);
        double var = total(acc[1]) / D;
        float rstd = (float)(1.0 / sqrt(var + eps));
        float m = (float)mean;
        for (int d = 0; d < D; d++)
            y[d] = (x[d] - m) * rstd * g[d] + b[d];
        stats[2 * r] = m;
        stats[2 * r + 1] = rstd;
    }
}

/* dy: (R, D); dg, db (D) += (overwritten when !accumulate); dx (R, D), when
** not NULL, = the input's gradient (add: += it) */
RP_HOT
void rpi_layernorm_rows_backward(const float *in, const float *dout, const float *g,
                                 const float *stats, float *dg, float *db, float *dx, bool add,
                                 bool accumulate, int R, int D) {
    if (dg && !accumulate) {
        memset(dg, 0, sizeof(float) * D);
        memset(db, 0, sizeof(float) * D);
    }
    for (int r = 0; r < R; r++) {
        const float *x = in + (size_t)r * D, *dy = dout + (size_t)r * D;
        float m = stats[2 * r], rstd = stats[2 * r + 1];
        if (dg)
            for (int d = 0; d < D; d++) {
                float xhat = (x[d] - m) * rstd;
                dg[d] += dy[d] * xhat;
                db[d] += dy[d];
            }
        if (!dx)
            continue;
        /* sum(dxhat) and sum(dxhat xhat), dxhat = dy g, in running sums */
        double acc[2][LANES] = {{0}};
        int d = 0;
        for (; d + LANES <= D; d += LANES)
            for (int j = 0; j < LANES; j++) {
                float xhat = (x[d + j] - m) * rstd, dxhat = dy[d + j] * g[d + j];
                acc[0][j] += dxhat;
                acc[1][j] += dxhat * xhat;
            }
        for (; d < D; d++) {
            float xhat = (x[d] - m) * rstd, dxhat = dy[d] * g[d];
            acc[0][d % LANES] += dxhat;
            acc[1][d % LANES] += dxhat * xhat;
        }
        float mean_dxhat = (float)(total(acc[0]) / D), mean_dxhat_xhat = (float)(total(acc[1]) / D);
        float *o = dx + (size_t)r * D;
        for (d = 0; d < D; d++) {
            float xhat = (x[d] - m) * rstd;
            float v = rstd * (dy[d] * g[d] - mean_dxhat - xhat * mean_dxhat_xhat);
            o[d] = add ? o[d] + v : v;
        }
    }
}

/* RMSNorm (LLaMA's) over the last dimension: y = x / rms(x) weight, rms(x)
** = sqrt(mean(x^2) + eps), no mean taken out and no bias. aux: 1 / rms per
** row. The sums run in double. */
RP_HOT
void rpi_rmsnorm_forward(const layer_args *a) {
    const rp_layer *L = a->L;
    int D = L->in.dim[L->in.ndim - 1];
    size_t rows = rp_shape_size(&L->in) / (size_t)D * a->B;
    const float *g = a->w;
    float *inv = a->aux;
    for (size_t r = 0; r < rows; r++) {
        const float *x = a->in + r * D;
        float *y = a->out + r * D;
        double acc[2][LANES] = {{0}};
        sums(x, NULL, (size_t)D, 0.0, 0.0, true, acc);
        inv[r] = (float)(1.0 / sqrt(total(acc[1]) / D + L->eps));
        for (int d = 0; d < D; d++)
            y[d] = x[d] * inv[r] * g[d];
    }
}

/* dx = (g dy) / rms - x sum(g dy x) / (D rms^3); dweight = sum over rows of
** dy x / rms */
RP_HOT
void rpi_rmsnorm_backward(const layer_args *a, const float *dout, float *din) {
    const rp_layer *L = a->L;
    int D = L->in.dim[L->in.ndim - 1];
    size_t rows = rp_shape_size(&L->in) / (size_t)D * a->B;
    const float *g = a->w, *inv = a->aux;
    float *dg = a->part == RPI_BACK_INPUT ? NULL : a->dw;
    if (a->part == RPI_BACK_WEIGHT)
        din = NULL;
    if (dg && !a->accumulate)
        for (int d = 0; d < D; d++)
            dg[d] = 0.0f;
    for (size_t r = 0; r < rows; r++) {
        const float *x = a->in + r * D, *dy = dout + r * D;
        if (dg)
            for (int d = 0; d < D; d++)
                dg[d] += dy[d] * x[d] * inv[r];
        if (!din)
            continue;
        double s = 0;
        for (int d = 0; d < D; d++)
            s += (double)g[d] * dy[d] * x[d];
        float k = (float)(s * inv[r] * inv[r] * inv[r] / D);
        float *dx = din + r * D;
        for (int d = 0; d < D; d++)
            dx[d] = g[d] * dy[d] * inv[r] - x[d] * k;
    }
}
