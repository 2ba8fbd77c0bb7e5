/*
** Convolution by im2col (oneDNN's kernels are layers_dnnl.c's, pooling is
** layers_pool.c's). A convolution is one matrix product for the whole
** micro-batch: the input patches of every output position of every sample
** form the columns of `col` (channels*k*k rows), and W (out x channels*k*k)
** times col gives every output at once; `tmp` holds that product in (out
** channel, sample, position) order until it is scattered into the (sample,
** out channel, position) rows. The work is done in tiles of a few samples
** so that the columns stay in cache. Output planes of one position are
** lowered a position to a row instead (layers_rows.c); a 1 x 1 kernel at stride 1
** needs no lowering at all (layers_pointwise.c).
*/
#include <stdbool.h>
#include <string.h>

#include "../core/blas.h"
#include "layers_conv.h"

/* Samples per tile: the tile's columns (channels*k*k x positions) should
** stay in a core's L2 cache while the product reads them. */
#define CONV_TILE_BYTES (128 * 1024)
#ifndef CONV_MIN_COLS
#define CONV_MIN_COLS 512
#endif

size_t rpi_conv_sample_scratch(const rp_layer *L) {
    size_t ckk = (size_t)L->in.dim[0] * L->kernel * L->kernel;
    return sizeof(float) * (ckk + (size_t)L->units) * L->out.dim[1] * L->out.dim[2];
}

/* The cache's tile, made smaller when a tile's scratch (columns and
** product) must fit `limit` bytes (0: no limit). One sample at least: the
** net refuses a limit below that. */
static int conv_tile(const rp_layer *L, int B, size_t limit) {
    size_t hw = (size_t)L->out.dim[1] * L->out.dim[2];
    size_t per = (size_t)L->in.dim[0] * L->kernel * L->kernel * hw;
    size_t t = CONV_TILE_BYTES / (sizeof(float) * per);
    size_t wide = (CONV_MIN_COLS + hw - 1) / hw; /* products no narrower than this */
    if (t < wide)
        t = wide;
    if (limit && limit / rpi_conv_sample_scratch(L) < t)
        t = limit / rpi_conv_sample_scratch(L);
    if (t < 1)
        t = 1;
    return (int)(t < (size_t)B ? t : (size_t)B);
}

/* Output columns ow whose input column ow*S - P + kj lies inside [0, W):
** [*lo, *hi). */
static inline void valid_cols(int OW, int W, int S, int P, int kj, int *lo, int *hi) {
    int a = P - kj, b = W + P - kj; /* need a <= ow*S < b */
    *lo = a <= 0 ? 0 : (a + S - 1) / S;
    *hi = b <= 0 ? 0 : (b + S - 1) / S;
    if (*hi > OW)
        *hi = OW;
    if (*lo > *hi)
        *lo = *hi;
}

/* whether offset k lands inside the input for some output */
static bool tap_reaches(int k, int n_out, int n_in, int S, int P) {
    int lo, hi;
    valid_cols(n_out, n_in, S, P, k, &lo, &hi);
    return hi > lo;
}

static void conv_lowering(const rp_layer *L, lowering *lw) {
    int K = L->kernel;
    lw->T = K * K;
    lw->reduced = false;
    if (K * K > MAX_TAPS)
        return;
    int T = 0;
    for (int ki = 0; ki < K; ki++)
        for (int kj = 0; kj < K; kj++)
            if (tap_reaches(ki, L->out.dim[1], L->in.dim[1], L->stride, L->pad) &&
                tap_reaches(kj, L->out.dim[2], L->in.dim[2], L->stride, L->pad))
                lw->tap[T++] = ki * K + kj;
    if (T < K * K && T > 0) {
        lw->T = T;
        lw->reduced = true;
    }
}

bool rpi_conv_reduced(const rp_layer *L) {
    lowering lw;
    conv_lowering(L, &lw);
    return lw.reduced;
}

/* Measured layer by layer (bench/conv_bound.c, one core, forward and
** backward) on torchvision's resnet18 at 28 x 28, batch 64, and resnet50 at
** 64 x 64, batch 32: oneDNN's kernels, reorders included, ahead of im2col
** by 1.1 to 1.7 times on every layer with 8 or more input channels a group
** and 256 or more output positions (B OH OW), within 5 % either way at 512
** positions and 1 x 1 kernels, and behind on the rest: the stems (1 and 3
** input channels: 4.2 against 11.7 ms, 33 against 43) and the last stage's
** 2 x 2 and 1 x 1 planes at 64 and 128 positions (up to 19 against 30 ms),
** where the reorders outweigh the kernels. Planes of at most ROWS_MAX_HW
** positions stay im2col's too, lowered a position to a row (resnet18's
** 256-channel 3 x 3 layers on 2 x 2 planes at batch 64: 5.8 against 7.8 ms
** with oneDNN, whose kernels alone take 6.5). Depthwise and grouped ones go
** to oneDNN, which has kernels for them. A 1 x 1 kernel at a stride onto
** planes of fewer than 64 positions stays im2col's too (resnet18's 64 ->
** 128 channels from 7 x 7 to 4 x 4 at batch 64: 0.78 against 0.95 ms;
** resnet50's 512 -> 1024 from 8 x 8 to 4 x 4 at batch 32: 13.2 against
** 15.2; from 8 x 8 planes up the two within 2 %): oneDNN reorders the
** whole input to read a quarter of it. The rule is the shape's alone, so
** the same configuration always computes with the same kernels. */
bool rpi_conv_direct(const rp_layer *L, int B) {
    if (rpi_conv_pointwise(L))
        return false;
    if (L->kernel == 1 && L->stride > 1 && L->groups == 1 &&
        L->out.dim[1] * L->out.dim[2] < 64)
        return false;
    lowering lw;
    conv_lowering(L, &lw);
    if (L->groups == 1 && rpi_rows_lowering(L, &lw))
        return false;
    size_t positions = (size_t)B * L->out.dim[1] * L->out.dim[2];
    int per_group = L->in.dim[0] / L->groups;
    return positions >= 256 && (per_group >= 8 || L->groups > 1);
}

void rpi_conv_scratch(const rp_layer *L, int B, size_t limit, size_t *col, size_t *tmp) {
    size_t positions = (size_t)conv_tile(L, B, limit) * L->out.dim[1] * L->out.dim[2];
    lowering lw;
    conv_lowering(L, &lw);
    *col = (size_t)L->in.dim[0] * L->kernel * L->kernel * positions;
    *tmp = (size_t)L->units * positions;
    if (lw.reduced) /* the gathered weights and their gradient */
        *tmp += 2 * (size_t)L->units * (L->in.dim[0] / L->groups) * lw.T;
}

/* A convolution whose output has its input's size at stride 1 (3 x 3 with
** padding 1, say): the taps of kernel offset (ki, kj) over a whole plane
** are the plane shifted by off = (ki - P) * W + kj - P. One flat loop per
** plane then does the work of H short row loops; the taps that a row shift
** would wrap into the neighbouring row are masked out. Flat position q is
** in row oh = q / W when the tap's row oh + ki - P is inside the plane:
** [q0, q1); within it, q + off falls outside the plane only for masked taps,
** so [a, e) is what may be touched. */

typedef struct same_shift {
    int off, a, e;
} same_shift;

static bool same_size(const rp_layer *L) {
    return L->stride == 1 && L->out.dim[1] == L->in.dim[1] && L->out.dim[2] == L->in.dim[2] &&
           (size_t)L->kernel * L->in.dim[1] * L->in.dim[2] <= SAME_MAX;
}

/* mask[kj * HW + q]: the tap of column offset kj is inside the row */
static void same_masks(int H, int W, int K, int P, int *mask) {
    for (int kj = 0; kj < K; kj++)
        for (int h = 0; h < H; h++)
            for (int w = 0; w < W; w++)
                mask[(kj * H + h) * W + w] = w + kj - P >= 0 && w + kj - P < W;
}

static same_shift same_range(int H, int W, int P, int ki, int kj) {
    int lo = P - ki > 0 ? P - ki : 0, hi = H + P - ki < H ? H + P - ki : H;
    same_shift r = {(ki - P) * W + kj - P, lo * W, hi > lo ? hi * W : lo * W};
    if (r.a < -r.off)
        r.a = -r.off;
    if (r.e > H * W - r.off)
        r.e = H * W - r.off;
    /* a tap that misses the whole plane (the pad at least the input's
    ** size): all of its column is padding, a = e = H * W */
    if (r.a > H * W)
        r.a = H * W;
    if (r.e > H * W)
        r.e = H * W;
    if (r.e < r.a)
        r.e = r.a;
    return r;
}

/* im2col (in to col) or col2im (cin added into din) of a same-size
** convolution: one of the two pairs is given, the other NULL. */
RP_HOT
static void same_cols(const rp_layer *L, int B, const int *mask, const float *in, float *col,
                      const float *cin, float *din) {
    bool to_col = in != NULL;
    int C = L->in.dim[0], H = L->in.dim[1], W = L->in.dim[2], K = L->kernel, P = L->pad;
    int HW = H * W;
    size_t ncols = (size_t)B * HW;
    for (int c = 0; c < C; c++)
        for (int ki = 0; ki < K; ki++)
            for (int kj = 0; kj < K; kj++) {
                same_shift r = same_range(H, W, P, ki, kj);
                const int *restrict m = mask + kj * HW;
                size_t plane = (size_t)c * HW, row = ((size_t)(c * K + ki) * K + kj) * ncols;
                int off = r.off; /* a + off >= 0: the pointers stay inside the planes */
                for (int b = 0; b < B; b++, plane += (size_t)C * HW, row += HW) {
                    if (to_col) { /* loops, not memset: a plane's rows are short */
                        float *restrict y = col + row;
                        for (int q = 0; q < r.a; q++)
                            y[q] = 0.0f;
                        if (r.e > r.a) {
                            const float *restrict x = in + plane + r.a + off;
                            const int *restrict mm = m + r.a;
                            for (int q = 0; q < r.e - r.a; q++)
                                y[r.a + q] = mm[q] ? x[q] : 0.0f;
                        }
                        for (int q = r.e; q < HW; q++)
                            y[q] = 0.0f;
                    } else if (r.e > r.a) {
                        float *restrict x = din + plane + r.a + off;
                        const float *restrict y = cin + row + r.a;
                        const int *restrict mm = m + r.a;
                        for (int q = 0; q < r.e - r.a; q++)
                            x[q] += mm[q] ? y[q] : 0.0f;
                    }
                }
            }
}

/* The masks of a same-size convolution, once per layer call rather than
** once per tile: NULL for the others. */
static const int *conv_masks(const rp_layer *L, int *mask) {
    if (!same_size(L))
        return NULL;
    same_masks(L->in.dim[1], L->in.dim[2], L->kernel, L->pad, mask);
    return mask;
}

/* One output row of a kernel tap's columns from a row of the input plane
** (src, already shifted by the tap): zeros where the tap falls in the
** padding, [0, lo) and [hi, OW). */
static inline void row_to_col(float *restrict dst, const float *restrict src, int lo, int hi,
                              int OW, int S) {
    for (int ow = 0; ow < lo; ow++)
        dst[ow] = 0.0f;
    if (S == 1)
        memcpy(dst + lo, src + lo, sizeof(float) * (hi - lo));
    else if (S == 2) /* a constant stride: the loop vectorises (a stem's 7 x 7) */
        for (int ow = lo; ow < hi; ow++)
            dst[ow] = src[2 * ow];
    else
        for (int ow = lo; ow < hi; ow++)
            dst[ow] = src[ow * S];
    for (int ow = hi; ow < OW; ow++)
        dst[ow] = 0.0f;
}

/* Its adjoint: the row's columns [lo, hi) added back into the plane's row. */
static inline void col_to_row(float *restrict dst, const float *restrict src, int lo, int hi,
                              int S) {
    if (S == 1)
        for (int ow = lo; ow < hi; ow++)
            dst[ow] += src[ow];
    else if (S == 2)
        for (int ow = lo; ow < hi; ow++)
            dst[2 * ow] += src[ow];
    else
        for (int ow = lo; ow < hi; ow++)
            dst[ow * S] += src[ow];
}

/* im2col (in: B samples (C, H, W), to col: (C T, B OH OW), a row per kept
** kernel tap and a column per output position) or col2im (cin's columns
** added back into din, zeroed first): one of the two pairs is given, the
** other NULL, as for same_cols, which takes a same-size convolution's. */
RP_HOT
static void lower(const rp_layer *L, int B, const int *mask, const lowering *lw, const float *in,
                  float *col, const float *cin, float *din) {
    int C = L->in.dim[0], H = L->in.dim[1], W = L->in.dim[2];
    int OH = L->out.dim[1], OW = L->out.dim[2], K = L->kernel, S = L->stride, P = L->pad;
    size_t ncols = (size_t)B * OH * OW;
    bool to_col = in != NULL;
    if (!to_col)
        memset(din, 0, sizeof(float) * (size_t)B * C * H * W);
    if (mask && !lw->reduced) {
        same_cols(L, B, mask, in, col, cin, din);
        return;
    }
    for (int c = 0; c < C; c++)
        for (int t = 0; t < lw->T; t++) {
            int tap = lw->reduced ? lw->tap[t] : t, ki = tap / K, kj = tap % K, lo, hi;
            size_t row = ((size_t)c * lw->T + t) * ncols;
            valid_cols(OW, W, S, P, kj, &lo, &hi);
            for (int b = 0; b < B; b++) {
                size_t plane = ((size_t)b * C + c) * H * W;
                for (int oh = 0; oh < OH; oh++) {
                    int h = oh * S - P + ki;
                    size_t at = row + ((size_t)b * OH + oh) * OW;
                    bool inside = h >= 0 && h < H;
                    /* the plane's row h, shifted left by the tap (P - kj) */
                    ptrdiff_t px = (ptrdiff_t)plane + (ptrdiff_t)h * W - P + kj;
                    if (to_col && !inside)
                        memset(col + at, 0, sizeof(float) * OW);
                    else if (to_col)
                        row_to_col(col + at, in + px, lo, hi, OW, S);
                    else if (inside)
                        col_to_row(din + px, cin + at, lo, hi, S);
                }
            }
        }
}

/* A reduced lowering's weights: wr (O x Cg T) from w (O x Cg K K). One
** kept tap (a kernel on a plane of one position) is a strided copy the
** compiler can vectorise: these passes read every line of weights of
** megabytes (512 x 512 x 3 x 3), and a tap at a time they ran at a
** quarter of the memory's speed. */
RP_HOT
static void gather_taps(const rp_layer *L, const lowering *lw, const float *w, float *wr) {
    size_t KK = (size_t)L->kernel * L->kernel, n = (size_t)L->units * (L->in.dim[0] / L->groups);
    if (lw->T == 1) {
        const float *from = w + lw->tap[0];
        for (size_t oc = 0; oc < n; oc++)
            wr[oc] = from[oc * KK];
        return;
    }
    for (size_t oc = 0; oc < n; oc++)
        for (int t = 0; t < lw->T; t++)
            wr[oc * lw->T + t] = w[oc * KK + lw->tap[t]];
}

/* Their gradient back: dw's kept taps take dwr's (added when accumulate),
** the others nothing (zero when not accumulate). Not accumulating, a block
** of rows is zeroed at a time and its kept taps then set while the block
** is in the cache (0 + g: the bits of the addition, a -0 gradient kept +0). */
RP_HOT
static void scatter_taps(const rp_layer *L, const lowering *lw, const float *dwr, float *dw,
                         bool accumulate) {
    size_t KK = (size_t)L->kernel * L->kernel, n = (size_t)L->units * (L->in.dim[0] / L->groups);
    int T = lw->T;
    for (size_t o0 = 0; o0 < n; o0 += 1024) {
        size_t o1 = n - o0 < 1024 ? n : o0 + 1024;
        if (!accumulate)
            memset(dw + o0 * KK, 0, sizeof(float) * (o1 - o0) * KK);
        for (int t = 0; t < T; t++) {
            float *d = dw + lw->tap[t];
            const float *g = dwr + t;
            for (size_t oc = o0; oc < o1; oc++)
                d[oc * KK] += g[oc * T];
        }
    }
}

/* The weights' values before the bias: O x C / G x K x K */
static size_t weights_of(const rp_layer *L) {
    return (size_t)L->units * (L->in.dim[0] * L->kernel * L->kernel / L->groups);
}

static void conv_job_init(const layer_args *a, conv_job *j) {
    const rp_layer *L = a->L;
    j->G = L->groups, j->O = L->units, j->Og = j->O / j->G;
    j->HW = L->out.dim[1] * L->out.dim[2];
    j->in_per = rp_shape_size(&L->in);
    j->weights = weights_of(L);
    j->tile = conv_tile(L, a->B, a->scratch_limit);
    j->mask = conv_masks(L, j->mask_buf);
    conv_lowering(L, &j->lw);
    j->R = L->in.dim[0] / j->G * j->lw.T;
    j->w = a->w, j->wr = NULL;
    if (j->lw.reduced) {
        j->wr = a->tmp + (size_t)j->O * j->tile * j->HW;
        gather_taps(L, &j->lw, a->w, j->wr);
        j->w = j->wr;
    }
}

/* in: (B, C, H, W); out: (B, O, OH, OW); weight (O, C / G, K, K), bias (O);
** tiled over a few samples at a time through col and tmp. With G groups,
** group g's output channels read its C / G input channels alone: rows
** g C K K / G onwards of the columns, one product per group. */
RP_HOT
void rpi_conv_forward(const layer_args *a) {
    if (rpi_conv_accel_forward(a->accel, a))
        return;
    if (rpi_conv_pointwise(a->L)) {
        rpi_conv_pointwise_forward(a);
        return;
    }
    const rp_layer *L = a->L;
    conv_job j;
    conv_job_init(a, &j);
    if (rpi_rows_lowering(L, &j.lw)) {
        rpi_rows_forward(a, &j);
        return;
    }
    int G = j.G, O = j.O, Og = j.Og, HW = j.HW, R = j.R, tile = j.tile;
    const float *bias = a->w + j.weights;
    for (int b0 = 0; b0 < a->B; b0 += tile) {
        int nb = a->B - b0 < tile ? a->B - b0 : tile, ncols = nb * HW;
        lower(L, nb, j.mask, &j.lw, a->in + b0 * j.in_per, a->col, NULL, NULL);
        for (int g = 0; g < G; g++)
            rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Og, ncols, R, 1.0f,
                        j.w + (size_t)g * Og * R, R, a->col + (size_t)g * R * ncols,
                        ncols, 0.0f, a->tmp + (size_t)g * Og * ncols, ncols);
        for (int b = 0; b < nb; b++)
            for (int o = 0; o < O; o++) {
                const float *restrict src = a->tmp + (size_t)o * ncols + (size_t)b * HW;
                float *restrict dst = a->out + ((size_t)(b0 + b) * O + o) * HW;
                float bo = L->bias ? bias[o] : 0.0f;
                for (int p = 0; p < HW; p++)
                    dst[p] = src[p] + bo;
            }
    }
}

/* The columns are recomputed tile by tile rather than kept from forward:
** cheaper than a round trip through memory, and the activations of a
** micro-batch stay as small as the layer outputs. */
/* dout: (B, O, OH, OW); dW (O, C / G, K, K), db (O); din: (B, C, H, W) */
RP_HOT
void rpi_conv_backward(const layer_args *a, const float *dout, float *din) {
    if (rpi_conv_accel_backward(a->accel, a, dout, din))
        return;
    const rp_layer *L = a->L;
    /* the split halves: B needs only the product with the weights, W the
    ** columns (im2col runs there alone) and the bias sums */
    bool want_w = a->part != RPI_BACK_INPUT;
    if (a->part == RPI_BACK_WEIGHT)
        din = NULL;
    if (want_w && L->bias && !a->accumulate)
        memset(a->dw + weights_of(L), 0, sizeof(float) * L->units);
    if (rpi_conv_pointwise(L)) {
        rpi_conv_pointwise_backward(a, dout, din, want_w);
        return;
    }
    conv_job j;
    conv_job_init(a, &j);
    int G = j.G, O = j.O, Og = j.Og, HW = j.HW, R = j.R, tile = j.tile;
    float *db = a->dw + j.weights;
    /* with gathered weights, their gradient is summed apart, then scattered */
    float *dw = j.wr ? j.wr + (size_t)O * R : a->dw;
    bool rows = rpi_rows_lowering(L, &j.lw);
    if (rows)
        rpi_rows_backward(a, &j, dout, din, dw, want_w);
    for (int b0 = 0; !rows && b0 < a->B; b0 += tile) {
        int nb = a->B - b0 < tile ? a->B - b0 : tile, ncols = nb * HW;
        for (int b = 0; b < nb; b++)
            for (int o = 0; o < O; o++) {
                const float *restrict src = dout + ((size_t)(b0 + b) * O + o) * HW;
                float *restrict dst = a->tmp + (size_t)o * ncols + (size_t)b * HW;
                /* eight running sums in a fixed order: vectorisable and still
                ** the same result on every run */
                float acc[8] = {0};
                int p = 0;
                for (; p + 8 <= HW; p += 8)
                    for (int k = 0; k < 8; k++) {
                        acc[k] += src[p + k];
                        dst[p + k] = src[p + k];
                    }
                float sum = 0;
                for (; p < HW; p++) {
                    dst[p] = src[p];
                    sum += src[p];
                }
                for (int k = 0; k < 8; k++)
                    sum += acc[k];
                if (want_w && L->bias)
                    db[o] += sum;
            }
        if (want_w) {
            lower(L, nb, j.mask, &j.lw, a->in + b0 * j.in_per, a->col, NULL, NULL);
            bool add = (a->accumulate && !j.lw.reduced) || b0 > 0;
            for (int g = 0; g < G; g++)
                rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Og, R, ncols, 1.0f,
                            a->tmp + (size_t)g * Og * ncols, ncols,
                            a->col + (size_t)g * R * ncols, ncols, add ? 1.0f : 0.0f,
                            dw + (size_t)g * Og * R, R);
        }
        if (!din)
            continue;
        for (int g = 0; g < G; g++)
            rpi_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, R, ncols, Og, 1.0f,
                        j.w + (size_t)g * Og * R, R, a->tmp + (size_t)g * Og * ncols,
                        ncols, 0.0f, a->col + (size_t)g * R * ncols, ncols);
        lower(L, nb, j.mask, &j.lw, NULL, NULL, a->col, din + b0 * j.in_per);
    }
    if (j.wr && want_w)
        scatter_taps(L, &j.lw, dw, a->dw, a->accumulate);
}
