/*
** transformer_block's variables as a model lays them out: their names (the
** llm.c / Hugging Face suffixes), shapes, whole or split over a tensor group,
** and initial values. The spec and the weight readers need them without
** the kernels (layers_block.c), which need them too.
*/
#include "block_vars.h"

#include <math.h>

static const char *const NAMES[RPI_BLOCK_VARS] = {
    "ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias",
    "attn.proj.weight", "attn.proj.bias", "ln2.weight", "ln2.bias",
    "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias",
};

const char *rpi_block_var_name(int v) { return NAMES[v]; }

rp_shape rpi_block_var_shape(const rp_layer *L, int v) {
    int t = L->tp_ranks > 1 ? L->tp_ranks : 1; /* the tensor group it is split over */
    int C = L->in.dim[1], M = L->mlp * C / t, A = C / t;
    switch (v) {
    case RPI_BLOCK_QKV_W: return (rp_shape){2, {3 * A, C}};
    case RPI_BLOCK_QKV_B: return (rp_shape){1, {3 * A}};
    case RPI_BLOCK_PROJ_W: return (rp_shape){2, {C, A}};
    case RPI_BLOCK_FC_W: return (rp_shape){2, {M, C}};
    case RPI_BLOCK_FC_B: return (rp_shape){1, {M}};
    case RPI_BLOCK_FCPROJ_W: return (rp_shape){2, {C, M}};
    default: return (rp_shape){1, {C}}; /* the LayerNorms, the projections' biases */
    }
}

double rpi_block_var_init(int v, int blocks, float *constant) {
    *constant = v == RPI_BLOCK_LN1_W || v == RPI_BLOCK_LN2_W ? 1.0f : 0.0f;
    switch (v) {
    case RPI_BLOCK_QKV_W:
    case RPI_BLOCK_FC_W: return 0.02;
    case RPI_BLOCK_PROJ_W:
    case RPI_BLOCK_FCPROJ_W: return 0.02 / sqrt(2.0 * (blocks > 0 ? blocks : 1));
    default: return 0;
    }
}
