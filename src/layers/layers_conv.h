/*
** What the convolution's files share: the lowering (which kernel taps are
** kept), the job forward and backward set up, and the rows path of
** layers_rows.c, which layers_conv.c calls for planes of a few positions.
*/
#ifndef REPIPE_LAYERS_CONV_H
#define REPIPE_LAYERS_CONV_H

#include <stdbool.h>

#include "layers_impl.h"

/* The kernel taps that reach the input for some output position. A tap
** that only ever lands on padding (a 3 x 3 kernel on a 1 x 1 plane has one
** of nine that does not) makes rows of zeros in the columns and products
** that add nothing: with any such tap the lowering keeps the others alone,
** and the weights are gathered to match (kernels up to 8 x 8). */
#define MAX_TAPS 64
typedef struct lowering {
    int T;          /* taps kept: K K unless reduced */
    bool reduced;
    int tap[MAX_TAPS]; /* ki K + kj of each kept tap, when reduced */
} lowering;

/* Output planes of at most ROWS_MAX_HW positions are lowered a position
** to a row (layers_rows.c). */
#define ROWS_MAX_HW 4

static inline bool rpi_rows_lowering(const rp_layer *L, const lowering *lw) {
    return L->out.dim[1] * L->out.dim[2] <= ROWS_MAX_HW && lw->T <= MAX_TAPS;
}

#define SAME_MAX 16384 /* K * H * W of the masks kept on the stack */

/* What forward and backward both set up: the sizes, the tile of samples,
** the masks and the lowering, and the weights as the products read them
** (gathered to the kept taps in tmp, after the tile's outputs, where the
** lowering drops some). */
typedef struct conv_job {
    int G, O, Og, HW, tile;
    int R;           /* the rows of a group's columns and its weights' width: C / G x taps */
    size_t in_per;   /* one sample's input values */
    size_t weights;  /* the weights' values before the bias (O x C / G x K x K) */
    const int *mask; /* conv_masks' */
    lowering lw;
    const float *w;  /* the weights the products read */
    float *wr;       /* their gathered copy in tmp, or NULL */
    int mask_buf[SAME_MAX];
} conv_job;

/* The rows path (layers_rows.c); dw is the weights' gradient as the
** products write it (gathered, or a->dw). */
void rpi_rows_forward(const layer_args *a, const conv_job *j);
void rpi_rows_backward(const layer_args *a, const conv_job *j, const float *dout, float *din,
                       float *dw, bool want_w);

#endif
