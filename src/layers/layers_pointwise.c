/*
** Convolutions with a 1 x 1 kernel at stride 1 and no padding, on planes
** large enough: a sample's input rows (C, H W) are already the columns
** im2col would build, so each sample is one product with the weights, read
** and written in place. layers_conv.c calls these for the layers
** rpi_conv_pointwise accepts; the rest of its job (the bias, the split
** backward's halves) is as there.
*/
#include <stdbool.h>

#include "../core/blas.h"
#include "layers_impl.h"

/* Planes of PLANE_MIN positions or more: (O, C) x (C, H W) a sample, no
** lowering, no reorders. Forward and backward of such a layer alone, batch
** 64, one core (a scratch harness; the products through rpi_sgemm, which
** sends these to oneDNN's sgemm), against oneDNN's convolution with its
** reorders: 64 -> 256 channels on 16 x 16
** 17.9 against 27.1 ms, 256 -> 64 19.2 against 28.0, 128 -> 512 on 8 x 8
** 18.2 against 21.6, 512 -> 128 18.2 against 25.7, 256 -> 512 on 16 x 16
** 132 against 148; behind on 4 x 4 (256 -> 1024: 21.2 against 17.0),
** where the products are 16 columns wide. */
#define PLANE_MIN 64

bool rpi_conv_pointwise(const rp_layer *L) {
    return L->kernel == 1 && L->stride == 1 && L->pad == 0 &&
           L->out.dim[1] * L->out.dim[2] >= PLANE_MIN;
}

/* out[b] (O, HW) = W (O, C) in[b] (C, HW), a group at a time */
RP_HOT
void rpi_conv_pointwise_forward(const layer_args *a) {
    const rp_layer *L = a->L;
    int C = L->in.dim[0], O = L->units, G = L->groups, Cg = C / G, Og = O / G;
    int HW = L->out.dim[1] * L->out.dim[2];
    const float *bias = a->w + (size_t)O * Cg;
    for (int b = 0; b < a->B; b++) {
        const float *x = a->in + (size_t)b * C * HW;
        float *y = a->out + (size_t)b * O * HW;
        if (L->bias)
            for (int o = 0; o < O; o++)
                for (int p = 0; p < HW; p++)
                    y[(size_t)o * HW + p] = bias[o];
        for (int g = 0; g < G; g++)
            rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Og, HW, Cg, 1.0f,
                      a->w + (size_t)g * Og * Cg, Cg, x + (size_t)g * Cg * HW, HW,
                      L->bias ? 1.0f : 0.0f, y + (size_t)g * Og * HW, HW);
    }
}

/* dW (O, C) += dout[b] in[b]^T summed over the samples in order, db (O) its
** rows' sums, din[b] = W^T dout[b]; din NULL: not wanted */
RP_HOT
void rpi_conv_pointwise_backward(const layer_args *a, const float *dout, float *din,
                                 bool want_w) {
    const rp_layer *L = a->L;
    int C = L->in.dim[0], O = L->units, G = L->groups, Cg = C / G, Og = O / G;
    int HW = L->out.dim[1] * L->out.dim[2];
    float *db = a->dw + (size_t)O * Cg;
    for (int b = 0; b < a->B; b++) {
        const float *x = a->in + (size_t)b * C * HW, *dy = dout + (size_t)b * O * HW;
        if (want_w && L->bias)
            for (int o = 0; o < O; o++) { /* as the lowered path sums them */
                const float *src = dy + (size_t)o * HW;
                float acc[8] = {0}, sum = 0;
                int p = 0;
                for (; p + 8 <= HW; p += 8)
                    for (int k = 0; k < 8; k++)
                        acc[k] += src[p + k];
                for (; p < HW; p++)
                    sum += src[p];
                for (int k = 0; k < 8; k++)
                    sum += acc[k];
                db[o] += sum;
            }
        bool add = a->accumulate || b > 0;
        for (int g = 0; want_w && g < G; g++)
            rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Og, Cg, HW, 1.0f,
                      dy + (size_t)g * Og * HW, HW, x + (size_t)g * Cg * HW, HW,
                      add ? 1.0f : 0.0f, a->dw + (size_t)g * Og * Cg, Cg);
        for (int g = 0; din && g < G; g++)
            rpi_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Cg, HW, Og, 1.0f,
                      a->w + (size_t)g * Og * Cg, Cg, dy + (size_t)g * Og * HW, HW, 0.0f,
                      din + (size_t)b * C * HW + (size_t)g * Cg * HW, HW);
    }
}
