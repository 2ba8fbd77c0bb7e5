/*
** transformer_block's 12 variables (block_vars.c): what a model, a tensor
** split and a weight file need to know of them, apart from the kernels.
*/
#ifndef REPIPE_BLOCK_VARS_H
#define REPIPE_BLOCK_VARS_H

#include "repipe/spec.h"

/* in the order a block holds them */
enum {
    RPI_BLOCK_LN1_W, RPI_BLOCK_LN1_B, RPI_BLOCK_QKV_W, RPI_BLOCK_QKV_B, RPI_BLOCK_PROJ_W,
    RPI_BLOCK_PROJ_B, RPI_BLOCK_LN2_W, RPI_BLOCK_LN2_B, RPI_BLOCK_FC_W, RPI_BLOCK_FC_B,
    RPI_BLOCK_FCPROJ_W, RPI_BLOCK_FCPROJ_B, RPI_BLOCK_VARS
};
const char *rpi_block_var_name(int v); /* "attn.qkv.weight" */
rp_shape rpi_block_var_shape(const rp_layer *L, int v);
/* the standard deviation of variable v's initial values, or 0 and *constant */
double rpi_block_var_init(int v, int blocks, float *constant);

#endif /* REPIPE_BLOCK_VARS_H */
