/*
** Models: the model spec (docs/training.md), layers over flat buffers, optimizers
** and weight files.
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
#ifndef REPIPE_MODEL_H
#define REPIPE_MODEL_H

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
    RP_LAYER_ATTENTION    /* causal attention on fused Q, K, V rows: grouped-query, rotary */
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

/* ---- execution ------------------------------------------------------------ */

/* What a forward pass needs to know besides its input. */
typedef struct rp_step_ctx {
    bool training;
    uint64_t seed;
    uint64_t update;          /* for dropout masks */
    const int64_t *sample_id; /* global sample ids, one per row, for dropout */
    const int32_t *labels;    /* for the loss layer, one per row */
    double loss_scale;        /* the loss gradient is multiplied by this (1 / samples) */
    int embedding_blocks;     /* embedding tables processed as this many row blocks (0, 1: whole) */
    /* batchnorm in training: 1 + the slot of the update's statistics this
    ** micro-batch records into (its number in the update, replica-major);
    ** 0: records nothing */
    int stat_slot;
    /* Called in a backward, from the last layer down, once each layer's
    ** weight gradient is as this call leaves it (after a whole backward of
    ** the layer, or its weights' half; never after an input half): the
    ** caller may start reducing [the layer's first parameter, the net's
    ** last) while the layers below compute. NULL: not called. */
    void (*grads_done)(void *arg, int layer);
    void *grads_arg;
} rp_step_ctx;

/* A worker's executor for the layers [first, last) of a model. It owns the
** flat parameter and gradient slices of those layers and the scratch space
** of the largest micro-batch. */
typedef struct rp_net rp_net;

/* Activations of one micro-batch in flight through a net. */
typedef struct rp_acts rp_acts;

rp_status rp_net_create(const rp_model *m, int first, int last, int max_batch, rp_net **out,
                        rp_error *err);

/* How a net trades memory for compute. */
typedef struct rp_net_options {
    /* recompute_checkpoint_every_layer: an activation set keeps only the
    ** checkpoints (the input of the net and of every layer with parameters)
    ** and the last layer's output; the activations between two checkpoints
    ** are recomputed from the first during backward, in one buffer the net
    ** shares between its activation sets. */
    bool recompute;
    /* matmul_proportion x device_memory: bytes the scratch of one product
    ** (im2col columns and the product) may take; convolutions are tiled to
    ** fit. 0: no limit. A limit below one sample's scratch is refused. */
    size_t scratch_limit;
    /* matmul_proportion 0: the least scratch the tiling can use, one sample
    ** at a time, whatever that takes (Poplar's least temporary memory);
    ** scratch_limit is then ignored. */
    bool scratch_least;
    /* Floats allocated after the parameters, for a collective that writes
    ** a padded tail past them. */
    size_t param_slack;
    /* Micro-batches an update's batchnorm statistics are kept for (the
    ** slots of rp_step_ctx.stat_slot); 0: none kept. */
    int stat_slots;
    /* A net of one layer of a graph that receives that layer's inputs and
    ** sends its output alone, not every tensor alive around it: the layer
    ** as a profile times it. */
    bool alone;
    /* Backward in two halves (rp_net_backward_input, then
    ** rp_net_backward_weight): each activation set keeps what the weights'
    ** half reads. */
    bool split_backward;
    /* Tensor parallelism: the sum over the worker's tensor group, in
    ** place, of n floats, that the layers' tp_reduce ask for; the same
    ** bits on every member. It reports its own failures (NULL: no group). */
    void (*tp_allreduce)(void *ctx, float *buf, size_t n);
    /* ...and its all-gather: every member's n floats of `in` into `out`
    ** (the group's size x n), in rank order; a vocabulary-split loss's. */
    void (*tp_allgather)(void *ctx, const float *in, size_t n, float *out);
    void *tp_ctx;
} rp_net_options;

rp_status rp_net_create_with(const rp_model *m, int first, int last, int max_batch,
                             const rp_net_options *opt, rp_net **out, rp_error *err);
void rp_net_free(rp_net *net);
float *rp_net_params(rp_net *net);
float *rp_net_grads(rp_net *net);
size_t rp_net_num_params(const rp_net *net);
/* Elements per sample of the net's input and output. */
size_t rp_net_in_size(const rp_net *net);
size_t rp_net_out_size(const rp_net *net);
/* Bytes of the net's scratch space and of one activation set of `batch`. */
size_t rp_net_scratch_bytes(const rp_net *net);
size_t rp_acts_bytes(const rp_net *net, int batch);

/* What layer l of a model takes in a net of `batch` rows, as a net lays
** it out: what an activation set keeps of it for its backward (its output
** and its auxiliary state); what it keeps when recomputed (its output where
** the next layer starts a segment, a checkpoint, or where a graph reads it
** in a later segment); what a split backward keeps besides for its
** weights' half; the scratch it needs (a net's is the most of its
** layers'); and, in a graph, the gradient buffer of its output, which a
** net holds once for all its activation sets. 'repipe profile' records
** them, and the simulator counts a stage's memory from them. The counts
** are of the net's own boundaries as a whole model sees them: a stage's
** last layer keeps its output and state whole when recomputed, which the
** simulator adds where it knows the cut. */
typedef struct rp_layer_bytes {
    size_t saved, checkpoint, wstash, scratch, grads;
} rp_layer_bytes;
void rp_layer_memory(const rp_model *m, int l, int batch, rp_layer_bytes *out);
/* Every layer's rp_layer_memory as doubles (arrays of m's layers, given
** NULL where not wanted), of tensor rank t - 1 of t where t > 1: the rank
** whose share is the largest, which rp_session_memory reports. */
rp_status rp_layer_memory_table(const rp_model *m, int t, unsigned tp_flags, int batch,
                                double *saved, double *checkpoint, double *wstash,
                                double *scratch, double *grads, rp_error *err);

rp_status rp_acts_create(const rp_net *net, int batch, rp_acts **out, rp_error *err);
void rp_acts_free(rp_acts *a);
/* The activation set's input rows: data received into it needs no copy
** when passed to rp_net_forward. */
float *rp_acts_input(rp_acts *a);

/* Runs the layers forward on `batch` rows of input (copied into the
** activation set). Returns the output rows (owned by acts), or NULL on bad
** data (a token id or label out of range: rp_net_error says which). When
** the last layer is the loss, the output is one loss per row and *loss_sum
** (if not NULL) receives their sum. */
const float *rp_net_forward(rp_net *net, rp_acts *acts, const float *input, int batch,
                            const rp_step_ctx *ctx, double *loss_sum);

/* Sets the gradients to zero, lazily: the next backward pass writes them
** instead of adding to them. */
void rp_net_zero_grads(rp_net *net);

/* Runs the layers backward, accumulating parameter gradients. dout is the
** gradient of the output rows (ignored when the last layer is the loss).
** Returns the gradient of the input rows, or NULL when need_input_grad is
** false (the first stage of a model needs none). */
const float *rp_net_backward(rp_net *net, rp_acts *acts, const float *dout,
                             const rp_step_ctx *ctx, bool need_input_grad);

/* The same backward in two halves, on a net created with split_backward:
** the input's gradient first (returned as rp_net_backward returns it; the
** gradients of layers that do not split are accumulated here too), then,
** any time before the activation set is used again, the weights'. Together
** they add exactly the bits rp_net_backward adds, provided each activation
** set's weights' half runs in the order its input half did. */
const float *rp_net_backward_input(rp_net *net, rp_acts *acts, const float *dout,
                                   const rp_step_ctx *ctx, bool need_input_grad);
/* Where rp_net_backward_input would keep the output's gradient for the
** weights' half of acts' micro-batch: the stash of a chain net's last
** layer, where it splits; NULL otherwise. A caller that receives that
** gradient there (rp_net_out_size x rows floats) and passes it as dout
** saves the copy; it must stay untouched until rp_net_backward_weight. */
float *rp_net_grad_in_place(rp_net *net, rp_acts *acts);
void rp_net_backward_weight(rp_net *net, rp_acts *acts, const rp_step_ctx *ctx);

/* Times every layer of the net as it runs in the net's passes: from now on
** each layer l adds the seconds of its forward to ms[3 (l - first)], of its
** backward (or a split backward's input half) to ms[3 (l - first) + 1] and
** of its weights' half to ms[3 (l - first) + 2] (NULL: stops). Recomputed
** forwards count as forwards. ms is the caller's, 3 x layers doubles. */
void rp_net_time_layers(rp_net *net, double *ms);

/* Batchnorm's running statistics (docs/training.md). In training, each
** batchnorm layer normalises with its micro-batch's statistics and records
** them (each channel's mean and unbiased variance, and a 1 that marks the
** slot as filled) in the slot of rp_step_ctx.stat_slot. rp_net_stats gives
** the net's slots (*count floats, every layer's); zero them before an
** update, sum them over the workers that share the layers' variables (each
** slot is filled by one), then rp_net_running_next computes the running
** statistics one worker would reach running the filled slots in order,
** and rp_net_running_commit writes them into the parameters (after the
** optimizer's step, which must not move them). NULL, and nothing to do,
** without batchnorm. */
float *rp_net_stats(rp_net *net, size_t *count);
void rp_net_running_next(rp_net *net);
void rp_net_running_commit(rp_net *net);

/* Makes the net read its parameters from p (as many as rp_net_num_params)
** until called again; returns the array it read before. Weight stashing
** runs a backward on the version its forward used this way. Gradients and
** updates stay the net's own. */
float *rp_net_use_params(rp_net *net, float *p);

/* The message of the last failed forward pass. */
const char *rp_net_error(const rp_net *net);

/* The predicted class of each row of a forward pass through a loss layer. */
void rp_net_predictions(const rp_net *net, const rp_acts *acts, int32_t *out);
/* The class probabilities of each row of a forward pass through a loss
** layer (rows x classes; a token model has T rows a sample). */
const float *rp_net_probabilities(const rp_net *net, const rp_acts *acts);

/* llm.c's GPT-2 checkpoints: a header of 256 int32 [20240326, 3, maxT, V,
** L, NH, C, Vp], then float32 tensors in its order (wte, wpe, then each
** block tensor stacked over the L blocks, then the final LayerNorm). The
** model must be llm.c's shape: embedding V C, position_embedding, L
** transformer_blocks (heads NH, mlp 4, gelu tanh), layernorm, linear V
** bias=false tie=0, softmax_cross_entropy, with T <= maxT and V <= Vp.
** Import fills params (the whole model's); export writes maxT = T, Vp = V
** and the embedding's copy of a tied table. */
rp_status rp_llmc_import(const rp_model *m, const unsigned char *data, size_t len,
                         const char *name, float *params, rp_error *err);
rp_status rp_llmc_export(const rp_model *m, const float *params, unsigned char **out,
                         size_t *len, rp_error *err);

/* Whether m is a token model: an input of T token ids and a loss with a
** target per token; the error says what `what` needs and what m has. */
rp_status rp_model_check_tokens(const rp_model *m, const char *what, rp_error *err);

/* Sampling from a token model (an input of T token ids, a loss with a
** target per token). tokens holds `len` tokens (at least one) and has room
** for len + n; each of the n new ones is drawn from the model's
** distribution for the position after the last T tokens, its scores
** divided by `temperature` (0: the most likely token) and cut to the
** `top_k` most likely (0: all). The draws come from the stream of `seed`,
** so a seed gives the same text. params: the whole model's. */
rp_status rp_model_generate(const rp_model *m, const float *params, int32_t *tokens, int len,
                            int n, double temperature, int top_k, uint64_t seed, rp_error *err);

/* ---- optimizers ----------------------------------------------------------- */

/* Floats of optimizer state per parameter: 0 (sgd), 1 (sgd + momentum) or
** 2 (adam). */
int rp_optimizer_state_per_param(const rp_optimizer_config *o);

/* One update of n parameters from their gradients. step counts updates from
** 1 (Adam's bias correction). PyTorch's SGD and Adam/AdamW semantics. The
** state is rp_optimizer_state_per_param arrays of n floats, one after the
** other (NULL when there are none). */
void rp_optimizer_step(const rp_optimizer_config *o, long long step, float *params,
                       const float *grads, float *state, size_t n);
/* The same with the state's arrays `stride` floats apart (stride >= n): a
** piece of a longer run of parameters, updated on its own. */
void rp_optimizer_step_at(const rp_optimizer_config *o, long long step, float *params,
                          const float *grads, float *state, size_t stride, size_t n);

/* ---- weight files ----------------------------------------------------------- */

/* One tensor of a weight file: `groups` copies of `shape` (replica groups;
** 1 without groupings). */
typedef struct rp_tensor {
    char name[RP_NAME_MAX];
    rp_shape shape;
    int groups;
    float *data; /* groups * size(shape) floats */
} rp_tensor;

typedef struct rp_weights {
    int num_tensors;
    rp_tensor *tensors;
} rp_weights;

/* Weight file: magic "RPWEIGHT", version, then each tensor's name, shape and
** groups, its data (little-endian float32), and a CRC-32 of everything
** before it. Written to a temporary file, fsynced and renamed. */
rp_status rp_weights_save(const rp_weights *w, const char *path, rp_error *err);
/* The bytes of a weight file, in *out (the caller frees it). */
rp_status rp_weights_serialize(const rp_weights *w, unsigned char **out, size_t *len,
                               rp_error *err);
rp_status rp_weights_load(rp_weights **out, const char *path, rp_error *err);
rp_status rp_weights_parse(rp_weights **out, const unsigned char *data, size_t len,
                           const char *name, rp_error *err);
void rp_weights_free(rp_weights *w);
/* Fails, naming the file, the tensor and the first bad value, when a
** tensor holds NaN or infinity: what a diverged run leaves, and no start
** for training or evaluation. */
rp_status rp_weights_check_finite(const rp_weights *w, const char *name, rp_error *err);
const rp_tensor *rp_weights_find(const rp_weights *w, const char *name);

/* The tensor of a model variable, checked: present, with the variable's
** shape. Errors name the variable and both shapes. */
rp_status rp_weights_var(const rp_weights *w, const rp_variable *var, const rp_tensor **out,
                         rp_error *err);

/* The weights of a model from its flat parameters (one group). */
rp_status rp_weights_from_params(const rp_model *m, const float *params, rp_weights **out,
                                 rp_error *err);
/* Copies weights into flat parameters; every variable must be present with
** its shape (group `group` when the file holds several). */
rp_status rp_weights_to_params(const rp_model *m, const rp_weights *w, int group, float *params,
                               rp_error *err);

/* safetensors files (PyTorch users' state_dicts): a little-endian u64 N,
** N bytes of JSON naming each tensor's dtype, shape and [begin, end) in the
** data, then the data. parse reads F32, F16, BF16 and F64 tensors as float32
** under their own names and shapes (a scalar as [1]), one group each, in
** the header's order, and refuses any other dtype, a key given twice, and
** offsets that do not tile the data exactly, naming the file and tensor.
** serialize writes F32 tensors of one group in w's order, with
** {"format": "pt"} as metadata and the header padded to 8 bytes; save
** writes it atomically. */
rp_status rp_safetensors_parse(rp_weights **out, const unsigned char *data, size_t len,
                               const char *name, rp_error *err);
rp_status rp_safetensors_load(rp_weights **out, const char *path, rp_error *err);
rp_status rp_safetensors_serialize(const rp_weights *w, unsigned char **out, size_t *len,
                                   rp_error *err);
rp_status rp_safetensors_save(const rp_weights *w, const char *path, rp_error *err);

/* Name schemes of LLaMA-family state_dicts: Meta's (llama/model.py:
** tok_embeddings.weight, layers.i.attention.wq ... feed_forward.w3,
** attention_norm, ffn_norm, norm.weight, output.weight) and Hugging Face's
** (transformers' LlamaForCausalLM: model.embed_tokens.weight,
** model.layers.i.self_attn.q_proj ... mlp.down_proj, input_layernorm,
** post_attention_layernorm, model.norm.weight, lm_head.weight; each head's
** Q and K rows in its half-split rotary order, which import and export
** permute to and from Meta's interleaved pairs). */
typedef enum rp_llama_names { RP_LLAMA_META, RP_LLAMA_HF } rp_llama_names;

/* A LLaMA-family model of repipe's graph: an embedding, blocks of rmsnorm
** -> linear (fused Q, K, V rows) -> attention -> linear + residual, rmsnorm
** -> SwiGLU (w1 / gate the linear under silu, w3 / up the other, w2 / down
** after their mul) + residual, then rmsnorm, a linear head and
** softmax_cross_entropy, none with biases; the blocks are found by what
** reads what. Import fills params (the whole model's) from `file` (named
** `name` in errors): every tensor must be there with its shape, and none
** may be left over (but the schemes' rotary buffers, rope.freqs and
** ...rotary_emb.inv_freq); a tied head takes the embedding's table (a file
** without a head is one), and a head in the file must then equal it.
** Export gives the scheme's tensors in its state_dict's order (a tied head
** under Hugging Face's names not at all, as transformers saves one). */
/* The scheme whose embedding `file` holds (tok_embeddings.weight: Meta's,
** model.embed_tokens.weight: Hugging Face's); false when neither. */
bool rp_llama_names_of(const rp_weights *file, rp_llama_names *out);
rp_status rp_llama_import(const rp_model *m, const rp_weights *file, rp_llama_names names,
                          const char *name, float *params, rp_error *err);
rp_status rp_llama_export(const rp_model *m, const float *params, rp_llama_names names,
                          rp_weights **out, rp_error *err);

/* Largest difference of two tensors relative to their scale:
** max |a - b| / max(max |a|, max |b|); 0 for two zero tensors. */
double rp_tensor_rel_diff(const float *a, const float *b, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_MODEL_H */
