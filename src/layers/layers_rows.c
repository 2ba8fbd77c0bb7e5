/*
** Output planes of a few positions (a ResNet's last stages on small
** images: 3 x 3 kernels on 2 x 2 and 1 x 1 planes, 1 x 1 ones at stride 2),
** with at most MAX_TAPS taps: the columns are laid out a position to a
** row, (B OH OW, C T), which for planes of one position is the layout of
** the input itself, and the product's (B OH OW, O) rows that of the output
** and of its gradient, reordered only where a plane has more than one
** position. im2col's row loops would move a value or two a call there,
** walking the micro-batch a plane apart; here every row is written in
** order. The products are the textbook lowering's, transposed.
*/
#include <string.h>

#include "../core/blas.h"
#include "layers_conv.h"

/* Each output position's taps as offsets in an input plane, or -1 where
** the tap lands on padding: the lowering keeps the taps that reach the
** input for some position, but keeps all where none does (a pad past the
** kernel). */
static void rows_offsets(const rp_layer *L, const lowering *lw, int *off) {
    int H = L->in.dim[1], W = L->in.dim[2], K = L->kernel, T = lw->T, OW = L->out.dim[2];
    int HW = L->out.dim[1] * OW;
    for (int p = 0; p < HW; p++)
        for (int t = 0; t < T; t++) {
            int tap = lw->reduced ? lw->tap[t] : t;
            int h = p / OW * L->stride - L->pad + tap / K;
            int w = p % OW * L->stride - L->pad + tap % K;
            off[p * T + t] = h >= 0 && h < H && w >= 0 && w < W ? h * W + w : -1;
        }
}

/* One tile's columns from in, or with din their gradient added into din
** (zeroed first), T taps a channel: rows_cols calls it with T a constant
** for the common counts, so that the compiler unrolls the taps and moves
** channels in vectors (resnet18's 2 x 2 planes at 256 channels, T 9: 0.46
** -> 0.13 ms a lowering, 0.38 -> 0.14 its gradient's). */
static inline void rows_move(const rp_layer *L, const int *off, int T, int nb, const float *in,
                             float *colT, const float *dcolT, float *din) {
    int C = L->in.dim[0], HW = L->out.dim[1] * L->out.dim[2];
    size_t plane = (size_t)L->in.dim[1] * L->in.dim[2], CHW = (size_t)C * plane;
    size_t R = (size_t)C * T;
    if (din)
        memset(din, 0, sizeof(float) * nb * CHW);
    for (int b = 0; b < nb; b++)
        for (int p = 0; p < HW; p++) {
            const int *o = off + p * T;
            size_t row = ((size_t)b * HW + p) * R;
            for (int c = 0; c < C; c++) {
                size_t at = b * CHW + (size_t)c * plane, k = row + (size_t)c * T;
                if (!din)
                    for (int t = 0; t < T; t++)
                        colT[k + t] = o[t] < 0 ? 0.0f : in[at + o[t]];
                else
                    for (int t = 0; t < T; t++)
                        if (o[t] >= 0)
                            din[at + o[t]] += dcolT[k + t];
            }
        }
}

static void rows_cols(const rp_layer *L, const lowering *lw, int nb, const float *in,
                      float *colT, const float *dcolT, float *din) {
    int off[ROWS_MAX_HW * MAX_TAPS];
    rows_offsets(L, lw, off);
    if (lw->T == 9)
        rows_move(L, off, 9, nb, in, colT, dcolT, din);
    else if (lw->T == 1)
        rows_move(L, off, 1, nb, in, colT, dcolT, din);
    else
        rows_move(L, off, lw->T, nb, in, colT, dcolT, din);
}

/* A plane of one position is written by the products in place, its bias
** first; a larger one goes through tmp and is reordered to (B, O, HW). */
void rpi_rows_forward(const layer_args *a, const conv_job *j) {
    const rp_layer *L = a->L;
    int G = j->G, O = j->O, Og = j->Og, R = j->R, HW = j->HW;
    const float *bias = a->w + j->weights;
    for (int b0 = 0; b0 < a->B; b0 += j->tile) {
        int nb = a->B - b0 < j->tile ? a->B - b0 : j->tile;
        float *out = a->out + (size_t)b0 * O * HW, *prod = HW == 1 ? out : a->tmp;
        rows_cols(L, &j->lw, nb, a->in + b0 * j->in_per, a->col, NULL, NULL);
        for (int b = 0; HW == 1 && b < nb; b++)
            for (int o = 0; o < O; o++)
                out[(size_t)b * O + o] = L->bias ? bias[o] : 0.0f;
        for (int g = 0; g < G; g++)
            rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb * HW, Og, R, 1.0f,
                      a->col + (size_t)g * R, G * R, j->w + (size_t)g * Og * R, R,
                      HW == 1 ? 1.0f : 0.0f, prod + (size_t)g * Og, O);
        for (int b = 0; HW > 1 && b < nb; b++)
            for (int o = 0; o < O; o++)
                for (int p = 0; p < HW; p++)
                    out[((size_t)b * O + o) * HW + p] =
                        prod[((size_t)b * HW + p) * O + o] + (L->bias ? bias[o] : 0.0f);
    }
}

/* The output's gradient a position to a row, (nb HW, O): dout itself for
** planes of one position, else reordered into tmp; the bias's sums added
** a plane at a time. */
static const float *rows_dout(const layer_args *a, const conv_job *j, const float *dout,
                              int nb, bool bias) {
    int O = j->O, HW = j->HW;
    float *db = a->dw + j->weights;
    if (HW == 1) {
        for (int b = 0; bias && b < nb; b++)
            for (int o = 0; o < O; o++)
                db[o] += dout[(size_t)b * O + o];
        return dout;
    }
    for (int b = 0; b < nb; b++)
        for (int o = 0; o < O; o++) {
            const float *src = dout + ((size_t)b * O + o) * HW;
            float sum = 0;
            for (int p = 0; p < HW; p++) {
                a->tmp[((size_t)b * HW + p) * O + o] = src[p];
                sum += src[p];
            }
            if (bias)
                db[o] += sum;
        }
    return a->tmp;
}

void rpi_rows_backward(const layer_args *a, const conv_job *j, const float *dout, float *din,
                       float *dw, bool want_w) {
    const rp_layer *L = a->L;
    int G = j->G, O = j->O, Og = j->Og, R = j->R, HW = j->HW;
    for (int b0 = 0; b0 < a->B; b0 += j->tile) {
        int nb = a->B - b0 < j->tile ? a->B - b0 : j->tile;
        const float *dy = rows_dout(a, j, dout + (size_t)b0 * O * HW, nb, want_w && L->bias);
        if (want_w) {
            rows_cols(L, &j->lw, nb, a->in + b0 * j->in_per, a->col, NULL, NULL);
            bool add = (a->accumulate && !j->lw.reduced) || b0 > 0;
            for (int g = 0; g < G; g++)
                rpi_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Og, R, nb * HW, 1.0f,
                          dy + (size_t)g * Og, O, a->col + (size_t)g * R, G * R,
                          add ? 1.0f : 0.0f, dw + (size_t)g * Og * R, R);
        }
        if (!din)
            continue;
        for (int g = 0; g < G; g++)
            rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb * HW, R, Og, 1.0f,
                      dy + (size_t)g * Og, O, j->w + (size_t)g * Og * R, R, 0.0f,
                      a->col + (size_t)g * R, G * R);
        rows_cols(L, &j->lw, nb, NULL, NULL, a->col, din + b0 * j->in_per);
    }
}
