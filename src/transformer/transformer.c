/*
** A transformer's nodes priced for one rank of a run, and written as a
** profile.
**
** A rank of a tensor group of t and a context group of cp computes, of each
** micro-batch of b sequences of s tokens, s / cp tokens and a t-th of the
** products (Shoeybi et al.: attention's heads and the MLP's columns split,
** two collectives a block each way, the vocabulary split in the embedding
** and the head). Each product takes its FLOPs over the device's peak (fp8's
** where the run asks for fp8) at the efficiency its smallest side reaches;
** a fused attention kernel its FLOPs (halved by the causal mask) at the
** device's attention efficiency, its backward two and a half forwards
** (FlashAttention's five products to two); each elementwise kernel its bytes
** read and written at the memory's bandwidth; each collective of the tensor
** group a ring over the node's link, each of the context group ring
** attention's passes of K and V round its ranks, hidden behind attention's
** own blocks where they are long enough.
**
** What a block keeps for its backward is Korthikanti et al.'s count
** ("Reducing Activation Recomputation in Large Transformer Models", 2022,
** section 4), generalised to GQA and SwiGLU: the norms' inputs, the
** products' inputs, Q, K, V, the MLP's activations, two dropout masks, and
** unless attention is fused or recomputed its scores; with sequence
** parallelism what lies outside the products split over the tensor group
** too. For GPT-2's block (4h GELU, heads = kv heads) that is
** s b h (10 + 24 / t + 5 a s / (h t)) bytes, and s b h 34 / t with sequence
** parallelism and selective recomputation.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transformer_impl.h"

void rp_transformer_run_default(rp_transformer_run *r) {
    *r = (rp_transformer_run){.micro_batch = 1, .tensor_parallel = 1, .context_parallel = 1,
                              .expert_parallel = 1, .expert_tensor_parallel = 1,
                              .recompute = RP_RECOMPUTE_NONE, .precision = RP_PRECISION_BF16,
                              .overlap = true};
}

const char *rp_recompute_name(rp_recompute r) {
    return r == RP_RECOMPUTE_FULL        ? "full"
           : r == RP_RECOMPUTE_SELECTIVE ? "selective"
           : r == RP_RECOMPUTE_BLOCKS    ? "blocks"
                                         : "none";
}

int rp_transformer_recomputed_blocks(const rp_transformer_run *r, int blocks) {
    if (r->recompute == RP_RECOMPUTE_FULL)
        return blocks;
    if (r->recompute == RP_RECOMPUTE_BLOCKS)
        return r->recompute_blocks < blocks ? r->recompute_blocks : blocks;
    return 0;
}

const char *rp_precision_name(rp_precision p) {
    return p == RP_PRECISION_FP8 ? "fp8" : p == RP_PRECISION_FP32 ? "fp32" : "bf16";
}

void rp_cluster_sim_precision(const rp_cluster *c, rp_precision p, rp_sim_options *o) {
    if (p != RP_PRECISION_FP32)
        return; /* (rp_cluster_sim_options' own) */
    o->mixed_precision = false;
    o->memory_bandwidth = c->device.memory_bandwidth * c->device.memory_efficiency / 7;
}

double rp_precision_peak(const rp_device *d, rp_precision p) {
    return p == RP_PRECISION_FP8 ? d->peak_fp8 : p == RP_PRECISION_FP32 ? d->peak_fp32
                                                                        : d->peak_flops;
}

const char *rp_sharding_name(rp_sharding s) {
    return s == RP_SHARD_FULL ? "fsdp" : s == RP_SHARD_OPTIMIZER ? "optimizer" : "none";
}

rp_status rp_transformer_run_check(const rp_transformer *m, const rp_cluster *c,
                                   const rp_transformer_run *r, rp_error *err) {
    int t = r->tensor_parallel, cp = r->context_parallel, b = r->micro_batch;
    if (b < 1 || t < 1 || cp < 1)
        return rp_fail(err, RP_ERR_INVALID, "transformer: micro-batches, tensor and context "
                       "groups are each 1 or more (%d, %d, %d)", b, t, cp);
    if (m->heads % t || (m->kv_heads % t && t % m->kv_heads) || m->ffn % t)
        return rp_fail(err, RP_ERR_INVALID, "transformer: tensor groups of %d must divide the "
                       "%d heads and the MLP's %d, and divide or be divided by the %d key/value "
                       "heads", t, m->heads, m->ffn, m->kv_heads);
    if (m->seq % (2 * cp) && cp > 1)
        return rp_fail(err, RP_ERR_INVALID, "transformer: context groups of %d split each "
                       "sequence into %d chunks (two a rank, for the causal mask's balance): "
                       "%d does not divide", cp, 2 * cp, m->seq);
    if (cp > 1 && !m->flash)
        return rp_fail(err, RP_ERR_INVALID, "transformer: context parallelism runs a fused "
                       "attention kernel (flash=1)");
    if (c->per_node % t)
        return rp_fail(err, RP_ERR_INVALID, "transformer: tensor groups of %d do not divide %s's "
                       "nodes of %d", t, c->name, c->per_node);
    if (r->precision == RP_PRECISION_FP8 && !(c->device.peak_fp8 > 0))
        return rp_fail(err, RP_ERR_INVALID, "transformer: %s has no fp8 products (no peak_fp8)",
                       c->device.name);
    if (r->precision == RP_PRECISION_FP32 && !(c->device.peak_fp32 > 0))
        return rp_fail(err, RP_ERR_INVALID, "transformer: %s has no fp32 rate (no peak_fp32): "
                       "add it to the device's file, or measure the device with "
                       "python -m repipe.calibrate", c->device.name);
    if (r->recompute == RP_RECOMPUTE_BLOCKS && r->recompute_blocks < 1)
        return rp_fail(err, RP_ERR_INVALID, "transformer: recomputing the first blocks of each "
                       "chunk needs 1 or more of them (not %d)", r->recompute_blocks);
    if (r->sequence_parallel && t < 2)
        return rp_fail(err, RP_ERR_INVALID, "transformer: sequence parallelism splits over a "
                       "tensor group: it needs tensor groups of 2 or more");
    int ep = rpi_xf_ep(r), etp = rpi_xf_etp(r);
    if (!m->experts && (ep > 1 || etp > 1))
        return rp_fail(err, RP_ERR_INVALID, "transformer: expert groups (ep %d, etp %d) need a "
                       "mixture of experts (experts=E in the shape)", ep, etp);
    if (m->experts && (m->experts % ep || m->moe_ffn % etp))
        return rp_fail(err, RP_ERR_INVALID, "transformer: expert groups of %d must divide the "
                       "%d experts, and expert tensor groups of %d their MLP's %d", ep,
                       m->experts, etp, m->moe_ffn);
    if (r->capacity < 0 || r->capacity > 64 || (r->capacity > 0 && !m->experts))
        return rp_fail(err, RP_ERR_INVALID, "transformer: a capacity factor is a mixture's, from "
                       "0 (dropless) to 64, not %g", r->capacity);
    if (m->experts && t > 1 && !r->sequence_parallel)
        return rp_fail(err, RP_ERR_INVALID, "transformer: a mixture of experts with tensor "
                       "groups of %d runs sequence parallel (Megatron-LM's rule: each rank "
                       "routes its own tokens)", t);
    return RP_OK;
}

/* What communication hidden behind compute still costs, as a share of the
** time they overlap: its kernels take streaming multiprocessors and memory
** bandwidth from the products beside them (Transformer Engine's
** tensor-parallel overlap hides about two thirds of the collectives' time
** on an H100, not all of it). */
#define OVERLAP_COST 0.5

/* The device's rates for one run. */
typedef struct rates {
    const rp_cluster *c;
    double peak;     /* the products' peak: bf16's, fp8's or fp32's */
    double peak16;   /* ...and of those fp8 leaves in bf16 (attention's core, the head) */
    double gemm_eff, gemm_half, stream_bw, attn_flops;
    double vb;       /* a value's bytes over bf16's: 2 in fp32, else 1 */
    double cp_bw;    /* the link the context group's passes take */
} rates;

/* Seconds of a product of an m x k and a k x n matrix, `count` times. */
static double gemm(const rates *x, double m, double k, double n, double count) {
    double side = fmin(m, fmin(k, n));
    return count * 2 * m * k * n / (x->peak * x->gemm_eff * side / (side + x->gemm_half));
}

/* ...and at bf16's peak and efficiency under fp8 (attention's core, the
** head), fp32's under fp32. */
static double gemm16(const rates *x, double m, double k, double n, double count) {
    const rp_device *d = &x->c->device;
    double side = fmin(m, fmin(k, n));
    return count * 2 * m * k * n / (x->peak16 * d->gemm_efficiency * side / (side + x->gemm_half));
}

static double stream(const rates *x, double bytes) {
    return bytes / x->stream_bw;
}

/* A ring all-reduce of `bytes` over n devices of a node (or the
** reduce-scatter and all-gather that move the same bytes). */
static double ring(const rp_cluster *c, int n, double bytes) {
    if (n < 2)
        return 0;
    return 2.0 * (n - 1) / n * bytes / c->node_bandwidth + 2.0 * (n - 1) * c->latency;
}

/* A block's MLP for one rank: a dense one, or a mixture's router, experts
** and shared expert. */
typedef struct mlp_cost {
    double linear;        /* the products' seconds, forward (and each backward half) */
    double elem;          /* bytes read and written by its elementwise kernels, forward */
    double comm_f, comm_b; /* the expert groups' all-to-alls' seconds */
    double kept;          /* bytes kept for the backward, beyond the MLP's input */
    double params, expert_params;
} mlp_cost;

/* A dense MLP of width f split over the tensor group: up (and gate) and
** down; GELU's activation reads and writes 4 B S f / t bytes, SwiGLU's 6;
** kept: the activation's input and output (w bytes an element: fp8's copy
** or bf16's). */
static mlp_cost dense_mlp(const rp_transformer *m, const rates *x, double BS, double T,
                          double f, double w) {
    double H = m->hidden, up = m->mlp == RP_MLP_SWIGLU ? 2 : 1, vb = x->vb;
    mlp_cost c = {.linear = gemm(x, BS, H, up * f / T, 1) + gemm(x, BS, f / T, H, 1),
                  .elem = vb * (2 + 2 * up) * BS * f / T,
                  .kept = (2 * vb * up * BS * f + w * BS * f) / T,
                  .params = (up * H * f + f * H + (m->bias == RP_BIAS_ALL ? up * f : 0)) / T +
                            (m->bias == RP_BIAS_ALL ? H : 0)};
    return c;
}

/* A mixture's MLP on one rank. The rank's B S / t tokens (the tensor group
** splits them, sequence parallel) are routed, each to top_k experts: N
** slots a rank, sent by all-to-all to the ranks of the expert group that
** hold their experts (experts / ep a rank), gathered over the expert's etp
** ranks, and back (dispatch and combine, forward and backward). With the
** routing balanced a rank computes N etp slots at moe_ffn / etp, its
** local experts' products each of N etp ep / experts tokens: the same
** FLOPs as a dense MLP of top_k moe_ffn over t, in smaller products. With
** a capacity factor each expert takes that many times its share, padded or
** dropped to it: N scales by it. */
static mlp_cost moe_mlp(const rp_transformer *m, const rates *x, const rp_transformer_run *r,
                        double BS, double T, double w) {
    double H = m->hidden, up = m->mlp == RP_MLP_SWIGLU ? 2 : 1, vb = x->vb;
    double E = m->experts, F = m->moe_ffn, ep = rpi_xf_ep(r), etp = rpi_xf_etp(r);
    /* the slots the experts take: their share, or `capacity` times it */
    double N = BS * m->top_k / T * (r->capacity > 0 ? r->capacity : 1);
    double local = E / ep, tokens = N * etp * ep / E;
    mlp_cost c = {0};
    if (m->shared_ffn)
        c = dense_mlp(m, x, BS, T, m->shared_ffn, w);
    double router = gemm(x, BS / T, H, E, 1);
    c.linear += router + gemm(x, tokens, H, up * F / etp, local) +
                gemm(x, tokens, F / etp, H, local);
    /* the router's softmax and choice (fp32, 3 passes), the slots' copies
    ** into and out of expert order, the experts' activations */
    c.elem += 12 * BS / T * E + 8 * vb * N * etp * H + vb * (2 + 2 * up) * N * F;
    double slots = 2 * vb * N * H;
    double a2a = rp_cluster_all_to_all(x->c, (int)ep, (int)etp, slots) +
                 (etp > 1 ? ring(x->c, (int)etp, slots * etp) / 2 : 0);
    c.comm_f = 2 * a2a;
    c.comm_b = 2 * a2a;
    /* kept: the router's probabilities, the slots the experts read (as
    ** their products keep them: fp8's copy or bf16's), their up products
    ** and activations, their outputs (for the gates' gradients) */
    c.kept += 4 * BS / T * E + (w + 2 * vb) * N * etp * H + 2 * vb * up * N * F + w * N * F;
    c.params += H * E + (m->bias == RP_BIAS_ALL ? E : 0);
    c.expert_params = local * ((up * H * F + F * H) / etp +
                               (m->bias == RP_BIAS_ALL ? up * F / etp + H : 0));
    return c;
}

/* A block's attention for one rank: its products' seconds and parameters,
** and the widths (over the rank's heads) of what it keeps: queries, keys,
** values, the output, and latent attention's latents (whole on each rank). */
typedef struct attn_cost {
    double linear, params;
    double up; /* latent attention's up products' seconds (what selective recomputation redoes) */
    double q, k, v, out, latents;
} attn_cost;

static attn_cost attention_products(const rp_transformer *m, const rates *x, double BS,
                                    double T) {
    double H = m->hidden, A = m->heads, D = m->head_dim, norm = m->norm == RP_NORM_LAYER ? 2 : 1;
    attn_cost a = {0};
    if (!m->kv_lora) { /* QKV (each key/value head's D) and the output */
        double Q = A * D, K = (double)m->kv_heads * D;
        double col_bias = m->bias == RP_BIAS_ALL || m->bias == RP_BIAS_QKV ? Q + 2 * K : 0;
        a.linear = gemm(x, BS, H, (Q + 2 * K) / T, 1) + gemm(x, BS, Q / T, H, 1);
        a.params = (H * (Q + 2 * K) + Q * H + col_bias) / T + (m->bias == RP_BIAS_ALL ? H : 0);
        a.q = Q / T, a.k = a.v = K / T, a.out = Q / T;
        return a;
    }
    /* latent attention: the down products (to the query's latent, to the
    ** keys' and values' latent and the shared rotary key) on every rank of
    ** the tensor group, the up products and the output split over it */
    double qk = D + m->rope_dim, ql = m->q_lora, kl = m->kv_lora, vd = m->v_dim;
    double down = H * (ql + kl + m->rope_dim);
    a.up = gemm(x, BS, kl, A * (D + vd) / T, 1) + (ql ? gemm(x, BS, ql, A * qk / T, 1) : 0);
    a.linear = a.up + gemm(x, BS, H, kl + m->rope_dim, 1) + gemm(x, BS, A * vd / T, H, 1) +
               (ql ? gemm(x, BS, H, ql, 1) : gemm(x, BS, H, A * qk / T, 1));
    a.params = down + norm * (ql + kl) +
               ((ql ? ql * A * qk : H * A * qk) + kl * A * (D + vd) + A * vd * H) / T;
    a.q = a.k = A * qk / T, a.v = a.out = A * vd / T, a.latents = ql + kl + m->rope_dim;
    return a;
}

static void block(const rp_transformer *m, const rates *x, const rp_transformer_run *r,
                  bool moe, rpi_xf_part *p) {
    const rp_cluster *c = x->c;
    double T = r->tensor_parallel, C = r->context_parallel, B = r->micro_batch;
    double S = (double)m->seq / C, Sk = m->seq, H = m->hidden, A = m->heads;
    double BS = B * S, vb = x->vb;
    double rep = r->sequence_parallel ? T : 1; /* what lies outside the products */
    bool fp8 = r->precision == RP_PRECISION_FP8;
    double w = fp8 ? 1 : 2 * vb; /* a product's input kept: fp8's copy, or bf16's */
    mlp_cost mlp = moe ? moe_mlp(m, x, r, BS, T, w) : dense_mlp(m, x, BS, T, m->ffn, w);
    attn_cost at = attention_products(m, x, BS, T);
    /* the products: attention's, then the MLP's */
    double linear = at.linear + mlp.linear;
    /* attention's core: each rank's s / cp queries against all s keys, of
    ** its a / t heads (query-key and value widths a head); a fused kernel
    ** skips what the causal mask hides */
    double dqk = at.q * T / A, dv = at.v * T / A * (m->kv_lora ? 1 : (double)m->heads / m->kv_heads);
    double core_f, core_b, scores;
    if (m->flash) {
        double flops = 2 * B * (A / T) * S * Sk * (dqk + dv) / 2;
        core_f = flops / x->attn_flops;
        core_b = 2.5 * core_f;
        scores = 4 * B * (A / T) * S; /* the softmax's statistics, fp32 */
    } else {
        core_f = gemm16(x, S, dqk, Sk, B * A / T) + gemm16(x, S, Sk, dv, B * A / T);
        core_b = 2 * core_f;
        scores = 5 * vb * B * (A / T) * S * Sk; /* softmax's output, its dropout mask and output */
    }
    /* bytes read and written: two norms (8 B S H), residual adds (12 B S H,
    ** and 2 more for dropout's masks), the MLP's, rotary embeddings on the
    ** queries and keys (latent attention's: their rope_dim columns), an
    ** unfused softmax and its dropout (9 B a s^2 / t), and fp8's casts of
    ** the products' inputs (3 bytes an element); twice as many in fp32 */
    double F = moe ? (double)m->moe_ffn * m->top_k + m->shared_ffn : m->ffn; /* (fp8's casts) */
    double rope = m->kv_lora ? A * m->rope_dim / T + m->rope_dim : at.q + at.k;
    double elem = vb * (((m->dropout ? 22 : 20) * BS * H) / rep +
                        (m->position == RP_POSITION_ROPE ? 4 * BS * rope : 0) +
                        (m->flash ? 0 : 9 * B * (A / T) * S * Sk)) +
                  mlp.elem;
    double casts = fp8 ? 3 * BS * (2 * H + at.out + F / T) : 0;
    double ef = stream(x, elem + casts), eb = stream(x, 2 * elem + 2 * casts);
    /* the tensor group's collectives: two all-reduces of the block's output
    ** each way, or with sequence parallelism as many all-gathers and
    ** reduce-scatters (the same bytes); overlapped with the products where
    ** today's Megatron-LM overlaps them */
    double tp = 2 * ring(c, r->tensor_parallel, 2 * vb * BS * H);
    double tpf = tp, tpb = tp;
    if (r->overlap && r->sequence_parallel) {
        tpf = fmax(0, tp - linear) + OVERLAP_COST * fmin(tp, linear);
        tpb = fmax(0, tp - 2 * linear) + OVERLAP_COST * fmin(tp, 2 * linear);
    }
    /* the context group: K and V (and in backward their gradients) passed
    ** round the cp ranks, each pass behind the block of attention it feeds */
    double kv = 2 * vb * BS * (at.k + at.v) * (C - 1);
    double cpf = C > 1 ? fmax(0, kv / x->cp_bw - core_f) + 2 * (C - 1) * c->latency : 0;
    double cpb = C > 1 ? fmax(0, 2 * kv / x->cp_bw - core_b) + 2 * (C - 1) * c->latency : 0;
    bool selective = r->recompute == RP_RECOMPUTE_SELECTIVE;
    double a2a_f = mlp.comm_f, a2a_b = mlp.comm_b;
    if (r->a2a_overlap) {
        /* a forward's all-to-alls behind the paired backward's computation
        ** (two products a product and attention's backward), a backward's
        ** behind the paired forward's, at what overlapped communication
        ** still costs */
        double fwd = linear + core_f + ef, bwd = 2 * linear + core_b + eb;
        a2a_f = fmax(0, a2a_f - bwd) + OVERLAP_COST * fmin(a2a_f, bwd);
        a2a_b = fmax(0, a2a_b - fwd) + OVERLAP_COST * fmin(a2a_b, fwd);
    }
    /* selective recomputation redoes attention's core (and latent
    ** attention's up products, as Megatron-LM's mla_up_proj does: their
    ** queries, keys and values are not kept) */
    p->f = linear + core_f + ef + tpf + cpf + a2a_f;
    p->bi = linear + core_b + eb + tpb + cpb + a2a_b +
            (selective ? core_f + at.up + (m->flash ? 0 : ef / 4) : 0);
    p->bw = linear;
    /* the pass's own time beyond its kernels' (a device's block_latency) */
    double lat = x->c->device.block_latency;
    p->f += lat, p->bi += lat, p->bw += lat;
    p->out = 2 * vb * BS * H / T; /* sent in t pieces, gathered on the next rank */
    /* kept: the norms' inputs, the attention's and the MLP's inputs (fp8
    ** copies where the products run in fp8, as Transformer Engine keeps
    ** them), the dropout masks where there is dropout (a byte an element),
    ** all split with sequence parallelism; latent attention's latents; Q, K,
    ** V; attention's output (the projection's input, a fused kernel's own
    ** too, and its fp8 copy); the MLP's; attention's scores unless fused or
    ** recomputed */
    bool redo_qkv = selective && m->kv_lora;
    double kept = (4 * vb + 2 * w + (m->dropout ? 2 : 0)) * BS * H / rep +
                  2 * vb * BS * at.latents +
                  (redo_qkv ? 0 : 2 * vb * BS * (at.q + at.k + at.v)) +
                  (2 * vb + (fp8 && m->flash ? 1 : 0)) * BS * at.out + mlp.kept;
    p->saved = kept + (selective && !m->flash ? 0 : scores);
    p->checkpoint = 2 * vb * BS * H / rep;
    double norm = m->norm == RP_NORM_LAYER ? 2 : 1;
    p->params = at.params + 2 * norm * H + mlp.params + (m->qk_norm ? 2 * m->head_dim : 0);
    p->expert_params = mlp.expert_params;
}

static void embedding(const rp_transformer *m, const rates *x, const rp_transformer_run *r,
                      rpi_xf_part *p) {
    double T = r->tensor_parallel, BS = (double)r->micro_batch * m->seq / r->context_parallel;
    double H = m->hidden, rep = r->sequence_parallel ? T : 1;
    /* the lookup, the position's add and dropout: ~10 B S H bytes; the
    ** vocabulary's split all-reduces (or reduce-scatters) the output */
    double elem = stream(x, 10 * x->vb * BS * H / rep);
    p->f = elem + ring(x->c, r->tensor_parallel, 2 * x->vb * BS * H) /
                      (r->sequence_parallel ? 2 : 1);
    p->bi = 2 * elem;
    p->bw = elem; /* the rows' gradients added into the table */
    p->out = 2 * x->vb * BS * H / T;
    /* the token ids, the dropout's mask */
    p->saved = p->checkpoint = 8 * BS + (m->dropout ? BS * H / rep : 0);
    p->params = rp_transformer_padded_vocab(m, r->tensor_parallel) * H / T +
                (m->position == RP_POSITION_LEARNED ? (double)m->seq * H : 0);
}

static void head(const rp_transformer *m, const rates *x, const rp_transformer_run *r,
                 rpi_xf_part *p) {
    double T = r->tensor_parallel, BS = (double)r->micro_batch * m->seq / r->context_parallel;
    double H = m->hidden, V = rp_transformer_padded_vocab(m, r->tensor_parallel);
    double rep = r->sequence_parallel ? T : 1;
    double logits = gemm16(x, BS, H, V / T, 1);
    /* the final norm (4 B S H), the cross entropy in fp32 over the rank's
    ** share of the vocabulary (3 passes of 4 B S V / t) */
    double elem = stream(x, 4 * x->vb * BS * H / rep + 12 * BS * V / T);
    double gather = ring(x->c, r->tensor_parallel, 2 * x->vb * BS * H) /
                    (r->sequence_parallel ? 2 : 1);
    p->f = logits + elem + 3 * 2 * x->c->latency * (T > 1) + (r->sequence_parallel ? gather : 0);
    p->bi = logits + elem + gather;
    p->bw = logits;
    p->out = 4 * BS; /* the loss, a float a token */
    /* the norm's input and output, the logits in fp32 */
    p->saved = p->checkpoint = 4 * x->vb * BS * H / rep + 4 * BS * V / T;
    p->params = V * H / T + (m->norm == RP_NORM_LAYER ? 2 : 1) * H; /* the embedding's copy,
                                                                     ** or its own */
}

/* Multi-token prediction with the head: each of its mtp depths the two
** norms and the projection (2 h to h) of the hidden state and the next
** token's embedding, a block of the last block's kind, and the head's
** products and loss again (its weights the head's). */
static void predict_further(const rp_transformer *m, const rates *x, const rp_transformer_run *r,
                            rpi_xf_part parts[RPI_XF_PARTS]) {
    double T = r->tensor_parallel, BS = (double)r->micro_batch * m->seq / r->context_parallel;
    double H = m->hidden, k = m->mtp, rep = r->sequence_parallel ? T : 1;
    double norm = m->norm == RP_NORM_LAYER ? 2 : 1;
    const rpi_xf_part b = parts[rp_transformer_moe_block(m, m->layers - 1) ? RPI_XF_MOE
                                                                           : RPI_XF_BLOCK];
    rpi_xf_part *h = &parts[RPI_XF_HEAD], h0 = *h;
    double proj = gemm(x, BS, 2 * H, H / T, 1) + stream(x, 12 * x->vb * BS * H / rep);
    h->f += k * (proj + b.f + h0.f);
    h->bi += k * (proj + b.bi + h0.bi);
    h->bw += k * (proj + b.bw + h0.bw);
    h->saved += k * (4 * x->vb * BS * H / rep + b.saved + h0.saved);
    h->checkpoint += k * (4 * x->vb * BS * H / rep + b.checkpoint + h0.checkpoint);
    h->params += k * (2 * H * H / T + 3 * norm * H + b.params);
    h->expert_params += k * b.expert_params;
}

void rpi_xf_parts(const rp_transformer *m, const rp_cluster *c, const rp_transformer_run *r,
                  rpi_xf_part parts[RPI_XF_PARTS]) {
    const rp_device *d = &c->device;
    bool fp32 = r->precision == RP_PRECISION_FP32;
    /* a tensor group's rank at what the device reaches at that size: every
    ** kernel's rate, not the links' */
    double e = rp_device_tensor_efficiency(d, r->tensor_parallel);
    double peak16 = e * (fp32 ? d->peak_fp32 : d->peak_flops);
    rates x = {.c = c,
               .peak = e * rp_precision_peak(d, r->precision),
               .peak16 = peak16,
               .gemm_eff = r->precision == RP_PRECISION_FP8 ? d->fp8_efficiency
                                                            : d->gemm_efficiency,
               .gemm_half = d->gemm_half,
               .stream_bw = e * d->memory_bandwidth * d->memory_efficiency,
               .attn_flops = peak16 * d->attention_efficiency,
               .vb = fp32 ? 2 : 1,
               .cp_bw = (double)r->tensor_parallel * r->context_parallel <= c->per_node
                            ? c->node_bandwidth
                            : c->network_bandwidth};
    memset(parts, 0, sizeof(rpi_xf_part) * RPI_XF_PARTS);
    embedding(m, &x, r, &parts[RPI_XF_EMBED]);
    block(m, &x, r, false, &parts[RPI_XF_BLOCK]);
    head(m, &x, r, &parts[RPI_XF_HEAD]);
    if (m->experts)
        block(m, &x, r, true, &parts[RPI_XF_MOE]);
    if (m->mtp)
        predict_further(m, &x, r, parts);
}

/* The description of the profile's Input, which rp_transformer_of_profile
** reads back. */
static void describe(const rp_transformer *m, const rp_cluster *c, const rp_transformer_run *r,
                     char *out, size_t cap) {
    char shape[400];
    rp_transformer_format(m, shape, sizeof shape);
    snprintf(out, cap, "Input0 micro_batch=%d transformer=%s tensor_parallel=%d "
                       "context_parallel=%d sequence_parallel=%d recompute=%s precision=%s "
                       "overlap=%d device=%s",
             r->micro_batch, shape, r->tensor_parallel, r->context_parallel,
             r->sequence_parallel, rp_recompute_name(r->recompute),
             rp_precision_name(r->precision), r->overlap, c->device.name);
    size_t n = strlen(out);
    if (r->recompute == RP_RECOMPUTE_BLOCKS && n < cap)
        snprintf(out + n, cap - n, " recompute_blocks=%d", r->recompute_blocks);
    n = strlen(out);
    if (m->experts && n < cap)
        snprintf(out + n, cap - n, " expert_parallel=%d expert_tensor_parallel=%d a2a_overlap=%d "
                 "capacity=%g", rpi_xf_ep(r), rpi_xf_etp(r), r->a2a_overlap, r->capacity);
}

rp_status rp_transformer_profile(const rp_transformer *m, const rp_cluster *c,
                                 const rp_transformer_run *r, char **out, rp_error *err) {
    *out = NULL;
    rp_status st = rp_transformer_run_check(m, c, r, err);
    if (st)
        return st;
    rpi_xf_part parts[RPI_XF_PARTS];
    rpi_xf_parts(m, c, r, parts);
    for (int k = 0; k < RPI_XF_PARTS; k++) /* a device too slow or too small to price */
        if (!isfinite(parts[k].f + parts[k].bi + parts[k].bw + parts[k].saved + parts[k].params +
                      parts[k].expert_params))
            return rp_fail(err, RP_ERR_INVALID, "transformer: on %s the model's times or bytes "
                           "overflow", c->device.name);
    /* a line is at most the description (~600 bytes) or a node (~300 with
    ** numbers of up to 40 digits), an edge 32 */
    size_t L = (size_t)m->layers, cap = 1024 + (L + 3) * 400, n = 0;
    char *s = malloc(cap);
    if (!s)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a profile of %zu layers", L);
    char desc[800];
    describe(m, c, r, desc, sizeof desc);
    n += (size_t)snprintf(s + n, cap - n, "node0 -- %s -- forward_compute_time=0, "
                          "backward_compute_time=0, activation_size=%.0f, parameter_size=0\n",
                          desc, 4.0 * r->micro_batch * m->seq);
    for (size_t l = 0; l < L + 2 && n < cap; l++) {
        int kind = rpi_xf_kind(m, (int)l);
        const rpi_xf_part *x = &parts[kind];
        char name[48];
        if (kind == RPI_XF_EMBED)
            snprintf(name, sizeof name, "embedding: Embedding");
        else if (kind == RPI_XF_BLOCK)
            snprintf(name, sizeof name, "layers.%zu: TransformerBlock", l - 1);
        else if (kind == RPI_XF_MOE)
            snprintf(name, sizeof name, "layers.%zu: MoEBlock", l - 1);
        else
            snprintf(name, sizeof name, "head: OutputLayer");
        n += (size_t)snprintf(s + n, cap - n,
                              "node%zu -- %s backward_input_time=%.6g backward_weight_time=%.6g "
                              "saved_bytes=%.0f checkpoint_bytes=%.0f -- "
                              "forward_compute_time=%.6g, backward_compute_time=%.6g, "
                              "activation_size=%.0f, parameter_size=%.0f\n",
                              l + 1, name, x->bi * 1e3, x->bw * 1e3, x->saved, x->checkpoint,
                              x->f * 1e3, (x->bi + x->bw) * 1e3, x->out,
                              4 * (x->params + x->expert_params));
    }
    for (size_t l = 0; l < L + 2 && n < cap; l++)
        n += (size_t)snprintf(s + n, cap - n, "\tnode%zu -- node%zu\n", l, l + 1);
    if (n >= cap) { /* (cannot happen with the bounds above: said, not written past) */
        free(s);
        return rp_fail(err, RP_ERR_INVALID, "transformer: the profile outgrew its %zu bytes",
                       cap);
    }
    *out = s;
    return RP_OK;
}

/* The value after " key=" in desc, up to the next space, into out. */
static bool field(const char *desc, const char *key, char *out, size_t cap) {
    char pat[40];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *at = strstr(desc, pat);
    if (!at)
        return false;
    at += strlen(pat);
    size_t n = strcspn(at, " ");
    if (n >= cap)
        return false;
    memcpy(out, at, n);
    out[n] = '\0';
    return true;
}

bool rp_transformer_of_profile(const char *desc, rp_transformer *m, rp_transformer_run *r) {
    char spec[512], v[32];
    rp_error err;
    if (!field(desc, "transformer", spec, sizeof spec) ||
        rp_transformer_parse(spec, m, &err) != RP_OK)
        return false;
    rp_transformer_run_default(r);
    const struct { const char *key; int *at; } counts[] = {
        {"micro_batch", &r->micro_batch},         {"tensor_parallel", &r->tensor_parallel},
        {"context_parallel", &r->context_parallel}, {"expert_parallel", &r->expert_parallel},
        {"expert_tensor_parallel", &r->expert_tensor_parallel},
        {"recompute_blocks", &r->recompute_blocks}};
    const struct { const char *key; bool *at; } flags[] = {
        {"sequence_parallel", &r->sequence_parallel}, {"overlap", &r->overlap},
        {"a2a_overlap", &r->a2a_overlap}};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++)
        if (field(desc, counts[i].key, v, sizeof v))
            *counts[i].at = atoi(v);
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        if (field(desc, flags[i].key, v, sizeof v))
            *flags[i].at = atoi(v) != 0;
    if (field(desc, "recompute", v, sizeof v))
        r->recompute = strcmp(v, "selective") == 0 ? RP_RECOMPUTE_SELECTIVE
                       : strcmp(v, "full") == 0    ? RP_RECOMPUTE_FULL
                       : strcmp(v, "blocks") == 0  ? RP_RECOMPUTE_BLOCKS
                                                   : RP_RECOMPUTE_NONE;
    if (field(desc, "capacity", v, sizeof v))
        r->capacity = atof(v);
    if (field(desc, "precision", v, sizeof v))
        r->precision = strcmp(v, "fp8") == 0    ? RP_PRECISION_FP8
                       : strcmp(v, "fp32") == 0 ? RP_PRECISION_FP32
                                                : RP_PRECISION_BF16;
    return r->micro_batch >= 1 && r->tensor_parallel >= 1 && r->context_parallel >= 1;
}
