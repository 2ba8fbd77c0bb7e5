/*
** What a device of a transformer's run holds, counted in closed form.
**
** Weights: the rank's parameters (its chunks' blocks, the embedding on the
** first, the head on the last; a tied head keeps a copy of the embedding
** where they are apart, as Megatron-LM does) at the bytes a parameter costs
** under the run's sharding. Activations: what each of the rank's chunks
** keeps for a micro-batch, times the micro-batches the schedule holds in
** flight there: 1F1B's p - r on rank r (at most the update's), interleaved
** 1F1B's warm-up of 2 (p - r - 1) + (v - 1) p + 1 chunk passes, DualPipeV's
** p + 1; a recomputed block (every one under full recomputation, a chunk's
** first n under RP_RECOMPUTE_BLOCKS) keeps its input, and the one being
** recomputed its whole. This is Megatron-LM's theoretical memory
** report's count (megatron/training/theoretical_memory_usage.py) where that
** applies; tests/fixtures/megatron holds the two side by side.
*/
#include <math.h>
#include <string.h>

#include "transformer_impl.h"

void rpi_xf_split(int layers, int chunks, int *counts) {
    /* the blocks as evenly as they go, the first chunks one more where they
    ** do not divide; the embedding with the first, the head with the last */
    for (int c = 0; c < chunks; c++)
        counts[c] = layers / chunks + (c < layers % chunks);
    counts[0]++;
    counts[chunks - 1]++;
}

void rpi_xf_recomputed(const rp_transformer *m, const rp_transformer_run *r, const int *counts,
                       int C, bool *out) {
    for (int c = 0, l = 0; c < C; l += counts[c++]) {
        int redo = rp_transformer_recomputed_blocks(r, rpi_xf_blocks(l, l + counts[c],
                                                                     m->layers));
        for (int j = l, b = 0; j < l + counts[c]; j++)
            out[j] = rpi_xf_is_block(rpi_xf_kind(m, j)) && b++ < redo;
    }
}

void rpi_xf_rank_memory(const rp_transformer *m, const rp_transformer_run *r,
                        const rpi_xf_part parts[RPI_XF_PARTS], const rp_transformer_layout *lay,
                        const int *counts, int rank, rp_transformer_memory *out) {
    int p = lay->p, v = lay->v > 1 ? lay->v : 1, C = p * v;
    bool redone = false;
    double params = 0, experts = 0, kept = 0, most = 0, gathered = 0;
    int first[RP_MAX_STAGES + 1]; /* chunk c's first layer */
    first[0] = 0;
    for (int c = 0; c < C; c++)
        first[c + 1] = first[c] + counts[c];
    for (int k = 0; k < v; k++) {
        /* chunk k of the rank: interleaved, k p + rank; in a V (DualPipeV),
        ** rank and 2 p - 1 - rank; the embedding opens the first chunk, the
        ** head closes the last, blocks between */
        int c = lay->v_shape ? (k == 0 ? rank : 2 * p - 1 - rank) : k * p + rank;
        int redo = rp_transformer_recomputed_blocks(r, rpi_xf_blocks(first[c], first[c + 1],
                                                                     m->layers));
        redone = redone || redo > 0;
        for (int l = first[c], b = 0; l < first[c + 1]; l++) {
            int kind = rpi_xf_kind(m, l);
            const rpi_xf_part *x = &parts[kind];
            bool block = rpi_xf_is_block(kind);
            params += x->params, experts += x->expert_params;
            kept += block && b++ < redo ? x->checkpoint : x->saved;
            most = fmax(most, x->saved);
            gathered = fmax(gathered, block ? x->params + x->expert_params : 0);
            /* a tied head on the embedding's rank is the embedding's table */
            if (kind == RPI_XF_HEAD && !m->untied && C == 1)
                params -= rp_transformer_padded_vocab(m, r->tensor_parallel) * m->hidden /
                          r->tensor_parallel;
        }
    }
    double n = (double)lay->d * r->context_parallel;
    /* the experts' replicas: the t cp d ranks of a stage over ep etp */
    double ne = (double)r->tensor_parallel * n / (rpi_xf_ep(r) * rpi_xf_etp(r));
    double flight;
    long long mb = lay->micro_batches > 0 ? lay->micro_batches : p;
    if (lay->v_shape)
        flight = p + 1.0; /* of the rank's two chunks together (DualPipe's README) */
    else if (v == 1)
        flight = fmin(p - rank, (double)mb);
    else
        flight = fmin((2.0 * (p - rank - 1) + (v - 1.0) * p + 1) / v, (double)mb);
    out->parameters = params + experts;
    out->weights = params * rpi_xf_bytes_per_parameter(lay->sharding, n, C > 1, r->precision) +
                   experts * rpi_xf_bytes_per_parameter(lay->sharding, ne, C > 1, r->precision);
    if (lay->sharding == RP_SHARD_FULL && C == 1) /* two blocks gathered: one computing, the next */
        out->weights += 2 * rpi_xf_gathered_bytes(r->precision) * gathered;
    out->activations = (flight * kept + (redone ? most : 0)) *
                       (r->activation_scale > 0 ? r->activation_scale : 1);
    out->total = out->weights + out->activations;
}

rp_status rp_transformer_rank_memory(const rp_transformer *m, const rp_transformer_run *r,
                                     const rp_transformer_layout *lay, int rank,
                                     rp_transformer_memory *out, rp_error *err) {
    memset(out, 0, sizeof *out);
    int p = lay->p, v = lay->v > 1 ? lay->v : 1, C = p * v, L = m->layers + 2;
    if (p < 1 || lay->d < 1 || rank < 0 || rank >= p || C > RP_MAX_STAGES || C > L)
        return rp_fail(err, RP_ERR_INVALID, "transformer memory: pipeline rank %d of %d, %d "
                       "chunks each, %d replicas, for %d layers and the embedding and head",
                       rank, p, v, lay->d, m->layers);
    long long width = (long long)r->tensor_parallel * r->context_parallel * lay->d;
    if (width % ((long long)rpi_xf_ep(r) * rpi_xf_etp(r)))
        return rp_fail(err, RP_ERR_INVALID, "transformer memory: expert groups of ep %d x etp %d "
                       "do not divide a stage's %lld ranks (t %d x cp %d x d %d)", rpi_xf_ep(r),
                       rpi_xf_etp(r), width, r->tensor_parallel, r->context_parallel, lay->d);
    int counts[RP_MAX_STAGES];
    if (lay->layers_per_stage) {
        int sum = 0;
        for (int c = 0; c < C; c++)
            sum += lay->layers_per_stage[c], counts[c] = lay->layers_per_stage[c];
        if (sum != L)
            return rp_fail(err, RP_ERR_INVALID, "transformer memory: the stages hold %d layers, "
                           "not the model's %d (the embedding and the head counted)", sum, L);
    } else {
        rpi_xf_split(m->layers, C, counts);
    }
    rpi_xf_part parts[RPI_XF_PARTS];
    rp_cluster any = {.per_node = r->tensor_parallel, .node_bandwidth = 1, .network_bandwidth = 1,
                      .latency = 0};
    any.device = (rp_device){.peak_flops = 1, .peak_fp8 = 1, .peak_fp32 = 1, .memory_bandwidth = 1,
                             .gemm_efficiency = 1, .memory_efficiency = 1,
                             .attention_efficiency = 1};
    rpi_xf_parts(m, &any, r, parts); /* (their bytes; the times are not read) */
    rpi_xf_rank_memory(m, r, parts, lay, counts, rank, out);
    return RP_OK;
}
