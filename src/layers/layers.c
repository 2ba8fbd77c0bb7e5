/*
** The dispatch from a layer's type to its kernels, and what each needs
** beside its input and output: aux state kept for backward, and scratch.
** The kernels are in layers_dense.c (linear, layernorm, embedding),
** layers_conv.c (convolution, pooling), layers_act.c (element-wise, the
** loss), layers_attn.c (attention), layers_moe.c (mixtures of experts) and
** layers_block.c (transformer_block).
*/
#include <string.h>

#include "layers_impl.h"

size_t rpi_layer_aux_bytes(const rp_layer *L, int B) {
    switch (L->type) {
    case RP_LAYER_MAXPOOL2D: return sizeof(int) * rp_shape_size(&L->out) * B;
    case RP_LAYER_LAYERNORM:
        return sizeof(float) * 2 * (rp_shape_size(&L->in) / L->in.dim[L->in.ndim - 1]) * B;
    case RP_LAYER_SOFTMAX_CE: return sizeof(float) * rp_shape_size(&L->in) * B;
    case RP_LAYER_TRANSFORMER_BLOCK: return rpi_block_aux_bytes(L, B);
    case RP_LAYER_BATCHNORM2D:
    case RP_LAYER_BATCHNORM1D: return sizeof(float) * 2 * (size_t)L->in.dim[0]; /* mean, 1/std */
    case RP_LAYER_ATTENTION: return rpi_attention_aux_bytes(L, B);
    case RP_LAYER_MOE: return rpi_moe_aux_bytes(L, B, 1);
    case RP_LAYER_RMSNORM: /* 1 / rms per row */
        return sizeof(float) * (rp_shape_size(&L->in) / L->in.dim[L->in.ndim - 1]) * B;
    default: return 0;
    }
}

bool rpi_layer_splits(const rp_layer *L) {
    switch (L->type) {
    case RP_LAYER_LINEAR:
    case RP_LAYER_CONV2D:
    case RP_LAYER_LAYERNORM:
    case RP_LAYER_EMBEDDING:
    case RP_LAYER_POSITION_EMBEDDING:
    case RP_LAYER_RMSNORM:
    case RP_LAYER_TRANSFORMER_BLOCK: return true;
    default: return false;
    }
}

size_t rpi_layer_wstash_floats(const rp_layer *L, int B) {
    if (!rpi_layer_splits(L))
        return 0;
    if (L->type == RP_LAYER_TRANSFORMER_BLOCK)
        return rpi_block_wstash_floats(L, B);
    return rp_shape_size(&L->out) * B;
}

void rpi_layer_scratch(const rp_layer *L, int B, size_t limit, size_t *col, size_t *tmp) {
    *col = *tmp = 0;
    if (L->type == RP_LAYER_CONV2D)
        rpi_conv_scratch(L, B, limit, col, tmp);
    if (L->type == RP_LAYER_TRANSFORMER_BLOCK)
        *tmp = rpi_block_scratch(L, B);
    if (L->type == RP_LAYER_ATTENTION)
        *tmp = rpi_attention_scratch(L);
    if (L->type == RP_LAYER_MOE)
        *tmp = rpi_moe_scratch(L, B, 1);
    if (L->type == RP_LAYER_SOFTMAX_CE && L->tp_ranks > 1) /* 3 floats a row, the group's too */
        *tmp = 3 * (size_t)B * (rp_shape_size(&L->in) / L->in.dim[L->in.ndim - 1]) *
               (L->tp_ranks + 1);
}

rp_status rpi_layer_forward(const layer_args *a, rp_error *err) {
    size_t n = rp_shape_size(&a->L->in) * a->B;
    switch (a->L->type) {
    case RP_LAYER_LINEAR: rpi_linear_forward(a); break;
    case RP_LAYER_CONV2D: rpi_conv_forward(a); break;
    case RP_LAYER_MAXPOOL2D: rpi_maxpool_forward(a); break;
    case RP_LAYER_LAYERNORM: rpi_layernorm_forward(a); break;
    case RP_LAYER_EMBEDDING: return rpi_embedding_forward(a, err);
    case RP_LAYER_POSITION_EMBEDDING: rpi_position_forward(a); break;
    case RP_LAYER_TRANSFORMER_BLOCK: rpi_block_forward(a); break;
    case RP_LAYER_SOFTMAX_CE: return rpi_softmax_ce_forward(a, err);
    case RP_LAYER_RELU: rpi_relu_forward(a->in, a->out, n); break;
    case RP_LAYER_GELU: rpi_gelu_forward(a->in, a->out, n); break;
    case RP_LAYER_FLATTEN: memcpy(a->out, a->in, sizeof(float) * n); break;
    case RP_LAYER_DROPOUT: rpi_dropout_apply(a, a->in, a->out); break;
    case RP_LAYER_AVGPOOL2D: rpi_avgpool_forward(a); break;
    case RP_LAYER_ADAPTIVE_AVGPOOL2D: rpi_avgpool_forward(a); break;
    case RP_LAYER_SIGMOID: rpi_sigmoid_forward(a->in, a->out, n); break;
    case RP_LAYER_TANH: rpi_tanh_forward(a->in, a->out, n); break;
    case RP_LAYER_ADD: rpi_add_forward(a); break;
    case RP_LAYER_CONCAT: rpi_concat_forward(a); break;
    case RP_LAYER_BATCHNORM2D:
    case RP_LAYER_BATCHNORM1D: return rpi_batchnorm_forward(a, err);
    case RP_LAYER_RMSNORM: rpi_rmsnorm_forward(a); break;
    case RP_LAYER_SILU: rpi_silu_forward(a->in, a->out, n); break;
    case RP_LAYER_MUL: rpi_mul_forward(a); break;
    case RP_LAYER_ATTENTION: rpi_attention_forward(a); break;
    case RP_LAYER_MOE: rpi_moe_forward(a); break;
    }
    return RP_OK;
}

void rpi_layer_backward(const layer_args *a, const float *dout, float *din) {
    size_t n = rp_shape_size(&a->L->in) * a->B;
    switch (a->L->type) {
    case RP_LAYER_LINEAR: rpi_linear_backward(a, dout, din); break;
    case RP_LAYER_CONV2D: rpi_conv_backward(a, dout, din); break;
    case RP_LAYER_MAXPOOL2D: rpi_maxpool_backward(a, dout, din); break;
    case RP_LAYER_LAYERNORM: rpi_layernorm_backward(a, dout, din); break;
    case RP_LAYER_EMBEDDING: rpi_embedding_backward(a, dout, din); break;
    case RP_LAYER_POSITION_EMBEDDING: rpi_position_backward(a, dout, din); break;
    case RP_LAYER_TRANSFORMER_BLOCK: rpi_block_backward(a, dout, din); break;
    case RP_LAYER_SOFTMAX_CE: rpi_softmax_ce_backward(a, din); break;
    case RP_LAYER_RELU:
        if (din)
            rpi_relu_backward(a->in, dout, din, n);
        break;
    case RP_LAYER_GELU:
        if (din)
            rpi_gelu_backward(a->in, dout, din, n);
        break;
    case RP_LAYER_FLATTEN:
        if (din)
            memcpy(din, dout, sizeof(float) * n);
        break;
    case RP_LAYER_DROPOUT:
        if (din)
            rpi_dropout_apply(a, dout, din);
        break;
    case RP_LAYER_AVGPOOL2D: rpi_avgpool_backward(a, dout, din); break;
    case RP_LAYER_ADAPTIVE_AVGPOOL2D: rpi_avgpool_backward(a, dout, din); break;
    case RP_LAYER_SIGMOID:
        if (din)
            rpi_sigmoid_backward(a->out, dout, din, n);
        break;
    case RP_LAYER_TANH:
        if (din)
            rpi_tanh_backward(a->out, dout, din, n);
        break;
    case RP_LAYER_ADD:
    case RP_LAYER_CONCAT:
        break; /* the net routes their gradients */
    case RP_LAYER_BATCHNORM2D:
    case RP_LAYER_BATCHNORM1D: rpi_batchnorm_backward(a, dout, din); break;
    case RP_LAYER_RMSNORM: rpi_rmsnorm_backward(a, dout, din); break;
    case RP_LAYER_SILU:
        if (din)
            rpi_silu_backward(a->in, dout, din, n);
        break;
    case RP_LAYER_MUL: break; /* the net routes its gradients (rpi_mul_backward) */
    case RP_LAYER_ATTENTION: rpi_attention_backward(a, dout, din); break;
    case RP_LAYER_MOE: rpi_moe_backward(a, dout, din); break;
    }
}
