/*
** Transformers as the field writes them, and their runs on clusters of
** devices: the shapes of GPT-2, LLaMA, Mistral and Qwen2 (a Hugging Face
** config.json, a preset or KEY=VALUE text), their FLOPs and parameters as
** Megatron-LM counts them, what a rank of a run holds (weights, optimizer
** state, activations) and how long its passes take (src/transformer/;
** docs/simulate.md, "Transformers on GPU clusters"). The search for the
** fastest run that fits is planning's (repipe/planner.h, src/plan/scale/).
**
** A run is the model on t x cp x p x d devices: tensor groups of t
** (attention's heads and the MLP's columns split, Shoeybi et al.), context
** groups of cp (each rank a cp-th of every sequence, ring attention's K and V
** passed round), p pipeline ranks, d replicas. Its features are those
** Megatron-LM and torchtitan offer: sequence parallelism (the activations
** outside the products split over the tensor group too, Korthikanti et al.
** 2022), recomputation of nothing, of attention's core (selective) or of
** every block (full), the optimizer state sharded over the replicas
** (Megatron-LM's distributed optimizer) or everything sharded (FSDP), bf16 or
** fp8 products, and communication overlapped with compute or not.
*/
#ifndef REPIPE_TRANSFORMER_H
#define REPIPE_TRANSFORMER_H

#include <stdbool.h>

#include "repipe/config.h"
#include "repipe/core.h"
#include "repipe/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rp_mlp_kind { RP_MLP_GELU = 0, RP_MLP_SWIGLU } rp_mlp_kind;
typedef enum rp_norm_kind { RP_NORM_LAYER = 0, RP_NORM_RMS } rp_norm_kind;
typedef enum rp_position_kind { RP_POSITION_LEARNED = 0, RP_POSITION_ROPE } rp_position_kind;
/* Which products have biases: all (GPT-2), none (LLaMA), the QKV's (Qwen2). */
typedef enum rp_bias_kind { RP_BIAS_ALL = 0, RP_BIAS_NONE, RP_BIAS_QKV } rp_bias_kind;

/* The largest shape accepted: every count the cost model multiplies stays
** exact in a double and far from int's range (hidden x ffn < 2^53). */
#define RP_TRANSFORMER_MAX_LAYERS 100000
#define RP_TRANSFORMER_MAX_WIDTH (1 << 20)   /* hidden, ffn, heads, head_dim */
#define RP_TRANSFORMER_MAX_SEQ (1 << 24)
#define RP_TRANSFORMER_MAX_VOCAB (1 << 24)

/* A decoder-only transformer. After rp_transformer_parse every field is
** concrete (no zeros meaning "the default"). */
typedef struct rp_transformer {
    int layers, hidden, heads, seq, vocab;
    int kv_heads;  /* key/value heads: heads for multi-head attention, fewer with GQA */
    int head_dim;  /* [hidden / heads] */
    int ffn;       /* the MLP's width [4 hidden; SwiGLU: Megatron-LM's 8 hidden / 3, to 64] */
    rp_mlp_kind mlp;
    rp_norm_kind norm;
    rp_position_kind position;
    rp_bias_kind bias;
    bool untied;   /* the head has weights of its own (not the embedding's) */
    bool flash;    /* a fused attention kernel: the scores are never stored */
    bool dropout;  /* dropout after attention and the MLP (GPT-2's; LLaMA has none) */
    bool qk_norm;  /* an RMSNorm on each head's queries and keys (Qwen3's, OLMo 2's) */
    /* Latent attention (DeepSeek's MLA) where kv_lora > 0: keys and values
    ** from a latent of kv_lora (a product down from hidden, normed, and up
    ** to every head's head_dim + v_dim), queries likewise through a latent of
    ** q_lora (0: straight from hidden), each head's query and key
    ** head_dim + rope_dim wide (rope_dim of them rotary, shared by the heads'
    ** keys), its value v_dim [head_dim]. */
    int q_lora, kv_lora, rope_dim, v_dim;
    /* multi-token prediction (DeepSeek-V3's): mtp more blocks after the last,
    ** each predicting one token further, with its projection, norms and the
    ** head again; trained, not part of the model's parameters */
    int mtp;
    /* A mixture of experts where experts > 0: in block i (from 0) with
    ** i >= dense_first and i % moe_every == 0 (Megatron-LM's --moe-layer-freq),
    ** the MLP is `experts` MLPs of moe_ffn each, top_k of them a token, chosen
    ** by a router (hidden x experts), beside a shared expert of shared_ffn
    ** (0: none) every token passes; the other blocks keep the dense MLP. */
    int experts, top_k, moe_ffn, shared_ffn, moe_every, dense_first;
} rp_transformer;

/* Multiply-adds a token of a block's attention products (QKV and the
** output; latent attention's down and up products). */
double rp_transformer_attention_macs(const rp_transformer *m);
/* A head's query-key width and value width summed over the heads: 2 heads
** head_dim, or latent attention's heads (head_dim + rope_dim + v_dim) --
** what attention's core multiplies by s^2 a sequence. */
double rp_transformer_qkv_width(const rp_transformer *m);

/* Whether block i (from 0) is a mixture of experts, and how many are. */
bool rp_transformer_moe_block(const rp_transformer *m, int i);
int rp_transformer_moe_blocks(const rp_transformer *m);

/* "[PRESET,]KEY=VALUE,...": layers, hidden, heads, seq, vocab (required
** unless a preset gives them), kv_heads, head_dim, ffn, mlp=gelu|swiglu,
** norm=layernorm|rmsnorm, position=learned|rope, bias=all|none|qkv,
** tied=0|1, flash=0|1, dropout=0|1, qk_norm=0|1; a mixture of experts: experts,
** top_k [2], moe_ffn [ffn], shared_ffn [0], moe_every [1], dense_first [0]
** (the last five only with experts); latent attention: kv_lora, q_lora [0],
** rope_dim [0], v_dim [head_dim] (the last three only with kv_lora); mtp [0].
** A key given twice is an error.
** Without a preset the shape is GPT-2's kind (GELU, LayerNorm, learned
** positions, biases, tied, dropout, no flash). */
rp_status rp_transformer_parse(const char *spec, rp_transformer *out, rp_error *err);

/* The presets' names (llama3-8b, llama3-70b, llama3-405b, gpt3-175b, ...),
** NULL-terminated, and one by name. */
const char *const *rp_transformer_presets(void);
bool rp_transformer_preset(const char *name, rp_transformer *out);

/* A Hugging Face config.json (GPT-2, LLaMA, Mistral, Qwen2, Qwen3, and the
** mixtures of experts of Mixtral, Qwen2-MoE and Qwen3-MoE) as a shape.
** Keys that change the arithmetic in ways this model does not price
** (mixtures of experts, sliding windows, latent attention) are an error
** that names them; keys it knows to change nothing (token ids, rope's
** theta, epsilon, ...) are read past; any other key is named in *unknown
** (comma-separated; "" when none; the caller frees it), so a tool can say
** it. `overrides` (KEY=VALUE,... as rp_transformer_parse, or NULL) is
** applied last: seq= for the training sequence, which defaults to the
** config's max_position_embeddings. */
rp_status rp_transformer_from_config(const char *path, const char *overrides,
                                     rp_transformer *out, char **unknown, rp_error *err);

/* The shape as rp_transformer_parse reads it back, every key written. */
void rp_transformer_format(const rp_transformer *m, char *out, size_t cap);

/* Megatron-LM's vocabulary padded to a multiple of 128 t (its
** make-vocab-size-divisible-by 128 times the tensor group). */
double rp_transformer_padded_vocab(const rp_transformer *m, int t);

/* Parameters of the model, as a count (the position table and biases
** included), and those a token passes through (a mixture's top_k experts
** of its `experts`; the same for a dense model). */
double rp_transformer_parameters(const rp_transformer *m);
double rp_transformer_active_parameters(const rp_transformer *m);

/* FLOPs of an update of `samples` sequences:
** - rp_transformer_flops_megatron: Megatron-LM's own count
**   (num_floating_point_operations, megatron/training/training.py: the
**   products forward and backward, attention's core halved by the causal
**   mask, the vocabulary padded for t) -- what Megatron-LM and
**   Megatron-Bridge report as "model TFLOP/s";
** - rp_transformer_flops_eq3: Narayanan et al. (SC'21), equation 3,
**   96 B s l h^2 (1 + s / 6h + V / 16 l h) for their GPTs (a recomputed
**   forward included), generalised to any MLP and GQA;
** - rp_transformer_flops_6n: as PyTorch users count MFU (torchtitan): 6 N a
**   token, N the active parameters but the embedding's, plus attention's
**   12 l heads head_dim s; no recomputation.
** A mixture's router is in none of the three (Megatron-LM leaves it out). */
double rp_transformer_flops_megatron(const rp_transformer *m, int t, double samples);
double rp_transformer_flops_eq3(const rp_transformer *m, double samples);
double rp_transformer_flops_6n(const rp_transformer *m, double samples);

typedef enum rp_recompute {
    RP_RECOMPUTE_NONE = 0,
    RP_RECOMPUTE_SELECTIVE, /* attention's core (softmax, dropout, the products with Q, K, V);
                            ** with latent attention its up products too (Megatron-LM's
                            ** mla_up_proj) */
    RP_RECOMPUTE_FULL,      /* every block from its input */
    RP_RECOMPUTE_BLOCKS     /* the first recompute_blocks blocks of each chunk from their
                            ** inputs, the rest kept (Megatron-LM's --recompute-method block
                            ** --recompute-num-layers n: megatron-core 0.19's recompute.py takes
                            ** a model chunk's first n layers; Galvatron's checkpoint on some) */
} rp_recompute;
/* bf16: bf16 products, weights and activations, fp32 master weights,
** gradients and Adam's state (Megatron-LM's --bf16); fp8: the same with fp8
** products (Transformer Engine); fp32: fp32 throughout, products at the
** device's peak_fp32 (PyTorch's default, and a CPU's) */
typedef enum rp_precision {
    RP_PRECISION_BF16 = 0,
    RP_PRECISION_FP8,
    RP_PRECISION_FP32
} rp_precision;
typedef enum rp_sharding {
    RP_SHARD_NONE = 0,  /* every replica holds everything (DDP) */
    RP_SHARD_OPTIMIZER, /* fp32 weights and Adam's moments sharded (Megatron-LM's distributed optimizer, ZeRO-1) */
    RP_SHARD_FULL       /* weights, gradients and state sharded (FSDP as torchtitan runs it) */
} rp_sharding;

const char *rp_recompute_name(rp_recompute r);
const char *rp_precision_name(rp_precision p);
/* The device's peak FLOP/s of products in precision p (0 where it has none). */
double rp_precision_peak(const rp_device *d, rp_precision p);
/* rp_cluster_sim_options' optimizer pass and gradients for precision p:
** mixed precision's (bf16 gradients on the wire, 30 bytes a parameter read
** and written) or fp32's (fp32 gradients, 28 bytes). */
void rp_cluster_sim_precision(const rp_cluster *c, rp_precision p, rp_sim_options *o);
const char *rp_sharding_name(rp_sharding s);

/* How the model runs: one micro-batch of `micro_batch` sequences on a rank
** of a tensor group of t and a context group of cp. A mixture's experts are
** split over expert groups of ep ranks (each holding experts / ep of them)
** and each expert over etp ranks (its MLP's columns, as the tensor group
** splits a dense one); Megatron-LM folds the expert groups into the same
** devices as t x cp x d (its expert data parallelism is t cp d / (ep etp)). */
typedef struct rp_transformer_run {
    int micro_batch, tensor_parallel, context_parallel;
    int expert_parallel, expert_tensor_parallel;
    bool sequence_parallel;
    rp_recompute recompute;
    int recompute_blocks; /* RP_RECOMPUTE_BLOCKS' n (a chunk of fewer: every block) */
    rp_precision precision;
    /* communication behind compute where today's Megatron-LM hides it: the
    ** tensor group's gathers behind its products (--tp-comm-overlap, with
    ** sequence parallelism), the replicas' reduction in buckets during the
    ** last backward (--overlap-grad-reduce); off, as Megatron-LM ran in 2021 */
    bool overlap;
    /* a mixture's all-to-alls of one micro-batch behind another's
    ** computation: DualPipe's pairing of a forward with a backward, and
    ** Megatron-LM's --overlap-moe-expert-parallel-comm under interleaved
    ** 1F1B (what a schedule with such pairs runs; the planner sets it) */
    bool a2a_overlap;
    /* a mixture's experts' capacity factor: each expert takes `capacity` times
    ** its share of the routed tokens, the rest dropped, its input padded up to
    ** it (Megatron-LM's --moe-expert-capacity-factor with
    ** --moe-pad-expert-input-to-capacity); 0: dropless, every token its own */
    double capacity;
    /* the activations' bytes over repipe's count of them (a device's
    ** activation_scale; 0: 1) */
    double activation_scale;
} rp_transformer_run;

/* How many of a chunk's `blocks` blocks run r recomputes (its first ones):
** all under full recomputation, the first recompute_blocks under
** RP_RECOMPUTE_BLOCKS, none otherwise. */
int rp_transformer_recomputed_blocks(const rp_transformer_run *r, int blocks);

/* b 1, t 1, cp 1, ep 1, etp 1, no sequence parallelism, no recomputation,
** bf16, overlap. */
void rp_transformer_run_default(rp_transformer_run *r);

/* Fails, naming the rule, where the run cannot split the model: t must
** divide the heads, the key/value heads (or be divided by them) and the
** MLP; cp the sequence (into 2 cp chunks, for the causal mask's balance);
** t the cluster's nodes; ep the experts, etp the expert's MLP (and ep and
** etp are 1 for a dense model). Whether ep etp divides t cp d is the
** layout's (rp_transformer_rank_memory's) check. */
rp_status rp_transformer_run_check(const rp_transformer *m, const rp_cluster *c,
                                   const rp_transformer_run *r, rp_error *err);

/* The profile (graph.txt text) of the model: its embedding, blocks and
** head, each node one rank's share of a micro-batch's work on cluster c's
** devices (forward, input and weight gradients; what it keeps for its
** backward, and under full recomputation; its parameters in fp32 bytes).
** The caller frees *out. */
rp_status rp_transformer_profile(const rp_transformer *m, const rp_cluster *c,
                                 const rp_transformer_run *r, char **out, rp_error *err);
/* The model and run from a profile rp_transformer_profile wrote (its
** Input's description); false for any other profile. */
bool rp_transformer_of_profile(const char *input_desc, rp_transformer *m,
                               rp_transformer_run *r);

/* What a device of pipeline rank `rank` holds, in bytes, counted in closed
** form as Megatron-LM's theoretical memory report counts it where that
** applies (megatron/training/theoretical_memory_usage.py) and beyond it:
** weights, gradients and optimizer state (18 bytes a parameter with bf16
** weights, fp32 gradients and Adam; 6 + 12 / (d cp) with the distributed
** optimizer; FSDP's 16 / (d cp) and the stage's bf16 weights gathered), and
** the activations of the micro-batches the schedule keeps in flight. */
typedef struct rp_transformer_memory {
    double parameters;  /* the rank's share, a count */
    double weights;     /* bf16 weights, fp32 master weights and gradients, Adam's moments */
    double activations; /* in flight at the rank's peak */
    double total;
} rp_transformer_memory;

typedef struct rp_transformer_layout {
    int p, d;     /* pipeline ranks, replicas */
    int v;        /* chunks a rank (interleaved 1F1B; DualPipeV's 2) [1] */
    bool v_shape; /* DualPipeV's V: rank r holds chunks r and 2 p - 1 - r */
    int micro_batches; /* an update's, each replica's */
    rp_sharding sharding;
    const int *layers_per_stage; /* p v entries, the embedding and the head counted as
                                 ** layers (L + 2); NULL: Megatron-LM's, blocks evenly */
} rp_transformer_layout;

rp_status rp_transformer_rank_memory(const rp_transformer *m, const rp_transformer_run *r,
                                     const rp_transformer_layout *lay, int rank,
                                     rp_transformer_memory *out, rp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_TRANSFORMER_H */
