/*
** Model specs (docs/training.md): the parser, shapes, the graph of a model's
** tensors and Megatron-LM's tensor-parallel splits (src/spec/).
**
** A model spec is a text file, one layer per line:
**
**     input 1 28 28
**     conv2d 16 kernel=3 pad=1
**     relu
**     maxpool2d 2
**     flatten
**     linear 10
**     softmax_cross_entropy
**
** `input` declares the shape of one sample; every other line is a layer,
** numbered 0..L-1 in file order. Shapes are inferred line by line.
**
** A layer reads the line above unless it says otherwise: a line may name
** its output (`b1 = conv2d 64 kernel=3 pad=1`) and name what it reads after
** a '<' (`add < b1 x0`); names are defined before they are used, so file
** order is a topological order of the graph. Every output but the last
** layer's must be read.
**
** Parameters of a model live in one flat array, layer after layer, so any
** contiguous range of layers (a pipeline stage) owns a contiguous slice;
** gradients and optimizer state mirror that layout.
*/
#ifndef REPIPE_SPEC_H
#define REPIPE_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "repipe/config.h"
#include "repipe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RP_MAX_DIMS 4
#define RP_NAME_MAX 64

typedef enum rp_layer_type {
    RP_LAYER_LINEAR,
    RP_LAYER_CONV2D,
    RP_LAYER_RELU,
    RP_LAYER_GELU,
    RP_LAYER_MAXPOOL2D,
    RP_LAYER_FLATTEN,
    RP_LAYER_DROPOUT,
    RP_LAYER_LAYERNORM,
    RP_LAYER_EMBEDDING,
    RP_LAYER_SOFTMAX_CE,
    RP_LAYER_POSITION_EMBEDDING, /* learned positions added to a (T x C) input */
    RP_LAYER_TRANSFORMER_BLOCK,  /* GPT-2's pre-LayerNorm block on a (T x C) input */
    RP_LAYER_ADD,                /* the sum of several inputs of one shape (a residual) */
    RP_LAYER_CONCAT,             /* several inputs joined along their first dimension */
    RP_LAYER_AVGPOOL2D,
    RP_LAYER_ADAPTIVE_AVGPOOL2D, /* average pooling to a given output size */
    RP_LAYER_SIGMOID,
    RP_LAYER_TANH,
    RP_LAYER_BATCHNORM2D, /* over (channels x height x width): a channel's statistics */
    RP_LAYER_BATCHNORM1D, /* over features, or (channels x length) */
    RP_LAYER_RMSNORM,     /* LLaMA's: over the last dimension, a weight, no bias */
    RP_LAYER_SILU,        /* x sigmoid(x) */
    RP_LAYER_MUL,         /* the element-wise product of two inputs of one shape (a gate) */
    RP_LAYER_ATTENTION,   /* causal attention on fused Q, K, V rows: grouped-query, rotary */
    RP_LAYER_MOE          /* a mixture of SwiGLU experts, each token routed to top_k of them */
} rp_layer_type;

/* Inputs a layer may read (add and concat read several). */
#define RP_MAX_INPUTS 16

/* The shape of one sample (the batch dimension is not included). */
typedef struct rp_shape {
    int ndim;
    int dim[RP_MAX_DIMS];
} rp_shape;

size_t rp_shape_size(const rp_shape *s);
/* "1x28x28"; returns buf. */
char *rp_shape_to_string(const rp_shape *s, char *buf, size_t n);

typedef struct rp_layer {
    rp_layer_type type;
    int line; /* in the spec */
    rp_shape in, out;
    int units;        /* linear: output features; conv2d: output channels;
                         adaptive_avgpool2d: output height and width */
    int kernel, stride, pad;
    int groups;       /* conv2d: channel groups (1: a full convolution) */
    /* The tensors it reads, in order: each a layer's number, or -1 for the
    ** model's input. A chain's layer l reads l - 1 alone. */
    int num_inputs;
    int inputs[RP_MAX_INPUTS];
    bool bias;
    float p;          /* dropout probability (a block's: of its two residual branches) */
    float eps;        /* layernorm, batchnorm */
    float momentum;   /* batchnorm: of its running statistics [0.1], PyTorch's */
    int vocab, dim;   /* embedding */
    int heads, mlp;   /* transformer_block: attention heads, MLP width / C */
    int kv_heads;     /* attention: key and value heads (heads / kv_heads queries share one) */
    float rope_theta; /* attention: rotary embeddings' base (0: none) */
    int tie;          /* linear: 1 + the embedding layer whose table its weight is; 0: none */
    float std;        /* embedding: its initial values' standard deviation [1] */
    bool gelu_erf;    /* transformer_block: GELU's erf form (else GPT-2's tanh form) */
    /* moe: its experts, the experts a token goes to, an expert's hidden
    ** width; the gates from a softmax over the router's scores (Mixtral's,
    ** Qwen3's) or from sigmoids (DeepSeek-V3's); whether a token's gates are
    ** its chosen scores over their sum [true]; the weight of the
    ** sequence-wise balance loss [0]. */
    int experts, top_k, ffn;
    bool gate_sigmoid, gate_norm;
    float balance;
    int group_size;   /* replica grouping override for this layer; 0 = config's */
    /* Tensor parallelism (rp_model_tensor_split): an all-reduce over the
    ** worker's tensor group of this layer's output after forward
    ** (RP_TP_REDUCE_OUTPUT, a row-split linear's partial sums) or of its
    ** output's gradient before backward (RP_TP_REDUCE_GRAD: the input of
    ** column-split linears); 0: none. tp_skip_bias: a row-split linear
    ** whose bias another rank of the group adds. */
    int tp_reduce;
    bool tp_skip_bias;
    /* A layer split inside itself: a transformer_block (its heads and MLP
    ** width) or a vocabulary-split loss; the tensor group's size (0: not
    ** split). */
    int tp_ranks;
    /* Split by vocabulary: an embedding whose table, or a loss whose
    ** scores, are rows [tp_vocab_first, tp_vocab_first + vocab or the
    ** scores' width) of tp_vocab (0: whole). */
    int tp_vocab, tp_vocab_first;
    int num_vars;     /* parameter tensors: 0, 1 or 2; a transformer_block's 12 */
    int first_var;    /* index of its first variable in the model */
    size_t param_offset, param_count; /* slice of the flat parameter array */
} rp_layer;

/* A parameter tensor ("3.weight"): a variable in PopXL's sense. */
typedef struct rp_variable {
    char name[RP_NAME_MAX];
    int layer;
    size_t offset, count; /* in the flat parameter array */
    rp_shape shape;
    bool split; /* a tensor-parallel rank's slice of the model's variable */
} rp_variable;

typedef struct rp_model {
    rp_shape input;
    int num_layers;
    rp_layer *layers;
    int num_vars;
    rp_variable *vars;
    size_t num_params;
    int num_classes; /* of the loss layer; 0 if the model has none */
    int num_targets; /* labels per sample: 1, or T for a loss over (T x classes) scores */
    int *last_reader; /* [t + 1]: the last layer that reads tensor t (-1: the input) */
} rp_model;

/* Whether every layer reads the one before it alone. */
bool rp_model_is_chain(const rp_model *m);
/* The tensors alive at boundary k (0 <= k <= L, before layer k): those
** made before it (-1: the input) and read by layer k or later; at k = L,
** the last layer's output. Written to `tensors` (room for L + 1) in
** ascending order; returns how many. A pipeline stage [first, last)
** receives boundary `first`'s tensors and sends boundary `last`'s, each
** sample's packed one after another in that order. */
int rp_model_boundary(const rp_model *m, int k, int *tensors);
/* Floats per sample of boundary k's tensors. */
size_t rp_model_boundary_size(const rp_model *m, int k);
/* The model's blocks, as Optimum Graphcore's layers_per_ipu counts a
** transformer's layers: each span between two boundaries one tensor
** crosses that holds a transformer_block or an attention (a LLaMA block's
** twelve lines). Writes each block's first layer to first (room for L)
** and the layer after the last block to *end; returns the count, 0 for
** a model without blocks. Block i runs to block i + 1's first layer; what
** comes before the first block (the embeddings) and after the last (the
** head) belongs to none. */
int rp_model_blocks(const rp_model *m, int *first, int *end);
/* The shape of tensor t (-1: the input). */
const rp_shape *rp_model_tensor_shape(const rp_model *m, int t);

rp_status rp_model_parse(rp_model **out, const char *text, size_t len, const char *name,
                         rp_error *err);
rp_status rp_model_load(rp_model **out, const char *path, rp_error *err);
void rp_model_free(rp_model *m);
const char *rp_layer_name(rp_layer_type t);
/* A CRC-32 of what makes the model's mathematics: every layer's type,
** shapes and settings, and its variables' names. Equal models, equal
** fingerprints; a checkpoint records its model's. */
uint32_t rp_model_fingerprint(const rp_model *m);

/* Tensor parallelism (Megatron-LM's): what rank k of t workers holds of m.
** Each attention's fused Q, K, V linear is split by rows (output
** features), each rank taking heads / t query heads and kv_heads / t key
** and value heads, and the linear after the attention by columns (input
** features); likewise an MLP's linears around an activation or a gated
** product (SwiGLU's silu and mul): the first ones by rows, the last by
** columns. A transformer_block is split the same way inside itself. With
** RP_TP_VOCAB, the embeddings' tables and the head before the loss are
** split by vocabulary rows too, rank k taking rows [k V / t, (k + 1) V / t)
** (so V need not be a multiple of t), and the loss combines the ranks'
** scores (Megatron's parallel cross-entropy). Everything else is whole on
** every rank. The forward all-reduces the column-split linears' partial
** outputs and an embedding's lookups (tp_reduce), the backward the gradient
** of the split linears' common input: two all-reduces a block each way.
** *out is the rank's model, with its own parameter layout; (*map)[i] is the
** index in m's parameters of the rank's parameter i. An error names the
** line whose split is impossible (a width not divisible by t, a split input
** read by a layer that is whole). tp_reduce is a set of these bits: */
enum { RP_TP_REDUCE_OUTPUT = 1, RP_TP_REDUCE_GRAD = 2 };
/* flags of rp_model_tensor_split (rp_config_tp_flags gives a configuration's) */
enum { RP_TP_VOCAB = 1 };
rp_status rp_model_tensor_split(const rp_model *m, int t, int k, unsigned flags, rp_model **out,
                                size_t **map, rp_error *err);
/* Rank k's first row of n rows split over t: the ranks' shares differ by
** one row at most. */
static inline int rp_tensor_share_first(int n, int t, int k) {
    return (int)((long long)n * k / t);
}

/* Default initialisation of the parameters of layers [first, last) into
** params (which starts at layer `first`'s offset): uniform in
** ±1/sqrt(fan_in) for linear and conv2d (PyTorch's distribution), N(0, 1)
** for embeddings, ones and zeros for layernorm. Element e of variable v in
** replica group k is drawn from the stream (seed, v, k, e); var_group[v]
** gives k for each variable of the model (NULL: group 0 for all). */
void rp_model_init_params(const rp_model *m, int first, int last, uint64_t seed,
                          const int *var_group, float *params);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_SPEC_H */
