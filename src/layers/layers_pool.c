/*
** Pooling over (B, C, H, W) planes: max pooling (the offset of each
** output's maximum kept for backward), average pooling with its padding
** counted, and adaptive average pooling to a fixed size.
*/
#include <stdbool.h>
#include <string.h>

#include "layers_impl.h"

/* in: (B, C, H, W); out: (B, C, OH, OW); aux: for every output, the offset
** of its maximum in its input plane */
RP_HOT
void rpi_maxpool_forward(const layer_args *a) {
    const rp_layer *L = a->L;
    int C = L->in.dim[0], H = L->in.dim[1], W = L->in.dim[2];
    int OH = L->out.dim[1], OW = L->out.dim[2], K = L->kernel, S = L->stride, P = L->pad;
    int *arg = a->aux;
    if (K == 2 && S == 2 && P == 0) {
        /* the window's four values in the general loop's order. Rows are
        ** short (14 outputs and less), so most of the work is the scalar
        ** remainder of the vector loop: the index is chosen with masks, not
        ** branches that mispredict on every other window. */
        for (int bc = 0; bc < a->B * C; bc++) {
            const float *restrict plane = a->in + (size_t)bc * H * W;
            float *restrict o = a->out + (size_t)bc * OH * OW;
            int *restrict g = arg + (size_t)bc * OH * OW;
            for (int oh = 0; oh < OH; oh++) {
                const float *restrict r0 = plane + (size_t)(2 * oh) * W;
                const float *restrict r1 = r0 + W;
                int base = 2 * oh * W;
                for (int ow = 0; ow < OW; ow++) {
                    float v0 = r0[2 * ow], v1 = r0[2 * ow + 1], v2 = r1[2 * ow], v3 = r1[2 * ow + 1];
                    float m = v0;
                    int c = -(v1 > m), i = c & 1;
                    m = v1 > m ? v1 : m;
                    c = -(v2 > m), i ^= (i ^ W) & c;
                    m = v2 > m ? v2 : m;
                    c = -(v3 > m), i ^= (i ^ (W + 1)) & c;
                    m = v3 > m ? v3 : m;
                    o[oh * OW + ow] = m;
                    g[oh * OW + ow] = base + 2 * ow + i;
                }
            }
        }
        return;
    }
    /* padding is -infinity: a window's maximum is over its part inside the
    ** plane, never empty while P <= K / 2 */
    for (int bc = 0; bc < a->B * C; bc++) {
        const float *plane = a->in + (size_t)bc * H * W;
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                int h0 = oh * S - P, w0 = ow * S - P;
                int hs = h0 < 0 ? 0 : h0, ws = w0 < 0 ? 0 : w0;
                int he = h0 + K > H ? H : h0 + K, we = w0 + K > W ? W : w0 + K;
                int best = hs * W + ws;
                float m = plane[best];
                for (int h = hs; h < he; h++)
                    for (int w = ws; w < we; w++) {
                        int at = h * W + w;
                        if (plane[at] > m) {
                            m = plane[at];
                            best = at;
                        }
                    }
                size_t o = ((size_t)bc * OH + oh) * OW + ow;
                a->out[o] = m;
                arg[o] = best;
            }
    }
}

/* dout: (B, C, OH, OW) routed to each maximum's place in din: (B, C, H, W) */
RP_HOT
void rpi_maxpool_backward(const layer_args *a, const float *dout, float *din) {
    const rp_layer *L = a->L;
    if (!din)
        return;
    int C = L->in.dim[0], HW = L->in.dim[1] * L->in.dim[2];
    int OHW = L->out.dim[1] * L->out.dim[2];
    const int *arg = a->aux;
    memset(din, 0, sizeof(float) * (size_t)a->B * C * HW);
    for (int bc = 0; bc < a->B * C; bc++)
        for (int o = 0; o < OHW; o++)
            din[(size_t)bc * HW + arg[(size_t)bc * OHW + o]] += dout[(size_t)bc * OHW + o];
}

/* Average pooling, over one of two kinds of windows, [lo, hi) clipped to
** the plane: avgpool2d's K x K at stride S with P zeros of padding counted
** in every window (PyTorch's count_include_pad: the divisor is K K), or
** adaptive_avgpool2d's to N x N (PyTorch's: output i of a side of n covers
** [floor(i n / N), ceil((i + 1) n / N)), the divisor its size). */
static inline void avg_window(const rp_layer *L, int o, int n, int *lo, int *hi) {
    if (L->type == RP_LAYER_ADAPTIVE_AVGPOOL2D) {
        int N = L->units;
        *lo = (int)((long)o * n / N);
        *hi = (int)(((long)(o + 1) * n + N - 1) / N);
        return;
    }
    int a = o * L->stride - L->pad, b = a + L->kernel;
    *lo = a < 0 ? 0 : a;
    *hi = b > n ? n : b;
}

/* Output (oh, ow)'s window in an H x W plane and what its sum is divided
** by. */
typedef struct avg_cell {
    int h0, h1, w0, w1;
    float divisor;
} avg_cell;

static inline avg_cell avg_cell_at(const rp_layer *L, int oh, int ow, int H, int W) {
    avg_cell c;
    avg_window(L, oh, H, &c.h0, &c.h1);
    avg_window(L, ow, W, &c.w0, &c.w1);
    c.divisor = L->type == RP_LAYER_ADAPTIVE_AVGPOOL2D ? (float)((c.h1 - c.h0) * (c.w1 - c.w0))
                                                       : (float)(L->kernel * L->kernel);
    return c;
}

void rpi_avgpool_forward(const layer_args *a) {
    const rp_layer *L = a->L;
    int H = L->in.dim[1], W = L->in.dim[2], OH = L->out.dim[1], OW = L->out.dim[2];
    for (int bc = 0; bc < a->B * L->in.dim[0]; bc++) {
        const float *plane = a->in + (size_t)bc * H * W;
        float *o = a->out + (size_t)bc * OH * OW;
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                avg_cell c = avg_cell_at(L, oh, ow, H, W);
                float sum = 0;
                for (int h = c.h0; h < c.h1; h++)
                    for (int w = c.w0; w < c.w1; w++)
                        sum += plane[h * W + w];
                o[oh * OW + ow] = sum / c.divisor;
            }
    }
}

void rpi_avgpool_backward(const layer_args *a, const float *dout, float *din) {
    const rp_layer *L = a->L;
    if (!din)
        return;
    int H = L->in.dim[1], W = L->in.dim[2], OH = L->out.dim[1], OW = L->out.dim[2];
    memset(din, 0, sizeof(float) * rp_shape_size(&L->in) * a->B);
    for (int bc = 0; bc < a->B * L->in.dim[0]; bc++) {
        float *plane = din + (size_t)bc * H * W;
        const float *g = dout + (size_t)bc * OH * OW;
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                avg_cell c = avg_cell_at(L, oh, ow, H, W);
                float v = g[oh * OW + ow] / c.divisor;
                for (int h = c.h0; h < c.h1; h++)
                    for (int w = c.w0; w < c.w1; w++)
                        plane[h * W + w] += v;
            }
    }
}
