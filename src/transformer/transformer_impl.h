/*
** The device room's shared pieces: a transformer's three kinds of node (the
** embedding, a block, the head) priced for one rank of a run, which the
** profile writer, the memory count and the planner all read.
*/
#ifndef REPIPE_TRANSFORMER_IMPL_H
#define REPIPE_TRANSFORMER_IMPL_H

#include "repipe/transformer.h"

/* the embedding, a dense block, the head, a mixture-of-experts block */
enum { RPI_XF_EMBED = 0, RPI_XF_BLOCK, RPI_XF_HEAD, RPI_XF_MOE, RPI_XF_PARTS };

/* One rank's share of a node, for one micro-batch. */
typedef struct rpi_xf_part {
    double f, bi, bw;  /* seconds: forward, the input's gradient (with what selective
                       ** recomputation redoes), the weights' gradient */
    double out;        /* bytes sent to the next stage */
    double saved;      /* bytes kept for the backward (none or selective recomputation) */
    double checkpoint; /* bytes kept under full recomputation: the input */
    double params;     /* parameters the rank holds, a count: the tensor group's share... */
    double expert_params; /* ...and apart, its experts' (replicated over t cp d / (ep etp)) */
} rpi_xf_part;

/* parts[RPI_XF_EMBED], [RPI_XF_BLOCK] (every dense block is alike),
** [RPI_XF_HEAD], [RPI_XF_MOE] (a mixture's blocks; zeros for a dense model)
** for run r on cluster c (checked by rp_transformer_run_check). */
void rpi_xf_parts(const rp_transformer *m, const rp_cluster *c, const rp_transformer_run *r,
                  rpi_xf_part parts[RPI_XF_PARTS]);

/* Megatron-LM's stages when none are given: the blocks evenly over
** `chunks` (the first ones one more where they do not divide), the
** embedding in the first, the head in the last; counts of L + 2 layers. */
void rpi_xf_split(int layers, int chunks, int *counts);

/* What rank `rank` of the layout holds (rp_transformer_rank_memory, of
** the parts' bytes and the chunks' counts of the L + 2 layers), in O(L). */
void rpi_xf_rank_memory(const rp_transformer *m, const rp_transformer_run *r,
                        const rpi_xf_part parts[RPI_XF_PARTS], const rp_transformer_layout *lay,
                        const int *counts, int rank, rp_transformer_memory *out);

/* The part of layer l of L + 2 (the embedding first, the head last). */
static inline int rpi_xf_kind(const rp_transformer *m, int l) {
    return l == 0             ? RPI_XF_EMBED
           : l > m->layers    ? RPI_XF_HEAD
           : rp_transformer_moe_block(m, l - 1) ? RPI_XF_MOE
                                                : RPI_XF_BLOCK;
}

static inline bool rpi_xf_is_block(int kind) {
    return kind == RPI_XF_BLOCK || kind == RPI_XF_MOE;
}

/* The blocks among layers [first, end) of the L + 2. */
static inline int rpi_xf_blocks(int first, int end, int layers) {
    int a = first > 1 ? first : 1, b = end < layers + 1 ? end : layers + 1;
    return b > a ? b - a : 0;
}

/* Which of the L + 2 layers run r recomputes, its C chunks holding counts
** of them: each chunk's first rp_transformer_recomputed_blocks blocks. */
void rpi_xf_recomputed(const rp_transformer *m, const rp_transformer_run *r, const int *counts,
                       int C, bool *out);

/* A run's expert groups: ep and etp, 1 where unset. */
static inline int rpi_xf_ep(const rp_transformer_run *r) {
    return r->expert_parallel > 1 ? r->expert_parallel : 1;
}
static inline int rpi_xf_etp(const rp_transformer_run *r) {
    return r->expert_tensor_parallel > 1 ? r->expert_tensor_parallel : 1;
}

/* Bytes a parameter the rank holds costs, by sharding over n = d cp ranks:
** bf16 weights (2) beside fp32 gradients (4), fp32 master weights and Adam's
** two moments (12); in fp32, the weights are the master (4), beside the
** gradients (4) and the moments (8). The distributed optimizer shards the
** master weights and moments; FSDP shards everything, but under a pipeline
** (torchtitan's) it keeps a stage's weights gathered and its gradients
** whole through the micro-batches, as the distributed optimizer does;
** without one only a layer is whole at a time (counted apart, at
** rpi_xf_gathered_bytes a parameter). */
static inline double rpi_xf_bytes_per_parameter(rp_sharding s, double n, bool pipelined,
                                                rp_precision p) {
    bool fp32 = p == RP_PRECISION_FP32;
    if (s == RP_SHARD_FULL && !pipelined)
        return 16 / n;
    if (s != RP_SHARD_NONE)
        return fp32 ? 8 + 8 / n : 6 + 12 / n;
    return fp32 ? 16 : 18;
}

/* A gathered parameter's weight and gradient: bf16 and fp32, or fp32 twice. */
static inline double rpi_xf_gathered_bytes(rp_precision p) {
    return p == RP_PRECISION_FP32 ? 8 : 6;
}

#endif /* REPIPE_TRANSFORMER_IMPL_H */
