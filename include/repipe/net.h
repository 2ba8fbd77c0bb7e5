/*
** Nets: a worker's executor for a range of a model's layers over flat
** buffers (forward, backward, its two halves, memory), and sampling from a
** token model (src/net/).
*/
#ifndef REPIPE_NET_H
#define REPIPE_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "repipe/core.h"
#include "repipe/layers.h"
#include "repipe/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    /* recompute_layers (config.h), a bit a layer of the model, or NULL: an
    ** activation set keeps neither the output nor the state of a layer
    ** named (but the net's last), and backward makes a run of them again
    ** from the kept output before it, when it reaches the layer after the
    ** run. Read when the net is made. Not with recompute. */
    const uint64_t *recompute_layers;
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
    /* Expert parallelism: the moe layers' group of ep_size members (0, 1:
    ** none), this net's place in it, and its all-to-all: block j of `in`
    ** (n floats at in + j n) to member j, member j's block for this one at
    ** out + j n. Member j runs experts [j E / ep_size, (j + 1) E / ep_size)
    ** of each moe layer for the whole group in training; evaluation runs
    ** every expert locally. */
    int ep_size, ep_rank;
    void (*ep_alltoall)(void *ctx, const float *in, size_t n, float *out);
    void *ep_ctx;
    /* Which kernel runs the convolutions: RP_CONV_AUTO (0) chooses each
    ** layer's by its shape (rp_net_conv_kernel says which it chose);
    ** RP_CONV_IM2COL lowers every one to a matrix product (as
    ** REPIPE_CONV=im2col does for a process); RP_CONV_ONEDNN runs every one
    ** oneDNN takes through it, but where the lowering keeps only some taps. */
    int conv_kernel;
} rp_net_options;
enum { RP_CONV_AUTO = 0, RP_CONV_IM2COL, RP_CONV_ONEDNN };
/* The kernel that runs convolution layer l of the net: "onednn" or
** "im2col" (NULL: l is not a convolution of the net). */
const char *rp_net_conv_kernel(const rp_net *net, int l);

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

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_NET_H */
