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
                              .recompute = RP_RECOMPUTE_NONE, .precision = RP_PRECISION_BF16,
                              .overlap = true};
}

const char *rp_recompute_name(rp_recompute r) {
    return r == RP_RECOMPUTE_FULL ? "full" : r == RP_RECOMPUTE_SELECTIVE ? "selective" : "none";
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
    if (r->sequence_parallel && t < 2)
        return rp_fail(err, RP_ERR_INVALID, "transformer: sequence parallelism splits over a "
                       "tensor group: it needs tensor groups of 2 or more");
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

static void block(const rp_transformer *m, const rates *x, const rp_transformer_run *r,
                  rpi_xf_part *p) {
    const rp_cluster *c = x->c;
    double T = r->tensor_parallel, C = r->context_parallel, B = r->micro_batch;
    double S = (double)m->seq / C, Sk = m->seq, H = m->hidden, A = m->heads;
    double D = m->head_dim, Q = A * D, K = (double)m->kv_heads * D, F = m->ffn;
    double up = m->mlp == RP_MLP_SWIGLU ? 2 : 1, BS = B * S, vb = x->vb;
    double rep = r->sequence_parallel ? T : 1; /* what lies outside the products */
    bool fp8 = r->precision == RP_PRECISION_FP8;
    /* the products: QKV, the projection, the MLP's up (and gate) and down */
    double linear = gemm(x, BS, H, (Q + 2 * K) / T, 1) + gemm(x, BS, Q / T, H, 1) +
                    gemm(x, BS, H, up * F / T, 1) + gemm(x, BS, F / T, H, 1);
    /* attention's core: each rank's s / cp queries against all s keys, of
    ** its a / t heads; a fused kernel skips what the causal mask hides */
    double core_f, core_b, scores;
    if (m->flash) {
        double flops = 4 * B * (A / T) * S * Sk * D / 2;
        core_f = flops / x->attn_flops;
        core_b = 2.5 * core_f;
        scores = 4 * B * (A / T) * S; /* the softmax's statistics, fp32 */
    } else {
        core_f = gemm16(x, S, D, Sk, B * A / T) + gemm16(x, S, Sk, D, B * A / T);
        core_b = 2 * core_f;
        scores = 5 * vb * B * (A / T) * S * Sk; /* softmax's output, its dropout mask and output */
    }
    /* bytes read and written: two norms (8 B S H), residual adds (12 B S H,
    ** and 2 more for dropout's masks), the MLP's activation (GELU: 4 B S F / t; SwiGLU
    ** 6), rotary embeddings on Q and K, an unfused softmax and its dropout
    ** (9 B a s^2 / t), and fp8's casts of the products' inputs (3 bytes an
    ** element); twice as many in fp32 */
    double elem = vb * (((m->dropout ? 22 : 20) * BS * H) / rep + (2 + 2 * up) * BS * F / T +
                        (m->position == RP_POSITION_ROPE ? 4 * BS * (Q + K) / T : 0) +
                        (m->flash ? 0 : 9 * B * (A / T) * S * Sk));
    double casts = fp8 ? 3 * BS * (2 * H + Q / T + F / T) : 0;
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
    double kv = 2 * 2 * vb * BS * K / T * (C - 1);
    double cpf = C > 1 ? fmax(0, kv / x->cp_bw - core_f) + 2 * (C - 1) * c->latency : 0;
    double cpb = C > 1 ? fmax(0, 2 * kv / x->cp_bw - core_b) + 2 * (C - 1) * c->latency : 0;
    bool selective = r->recompute == RP_RECOMPUTE_SELECTIVE;
    p->f = linear + core_f + ef + tpf + cpf;
    p->bi = linear + core_b + eb + tpb + cpb + (selective ? core_f + (m->flash ? 0 : ef / 4) : 0);
    p->bw = linear;
    p->out = 2 * vb * BS * H / T; /* sent in t pieces, gathered on the next rank */
    /* kept: the norms' inputs, QKV's and the MLP's inputs (fp8 copies where
    ** the products run in fp8, as Transformer Engine keeps them), the dropout
    ** masks where there is dropout (a byte an element), all split with
    ** sequence parallelism; Q, K, V; attention's output (the projection's
    ** input, a fused kernel's own too, and its fp8 copy); the MLP's
    ** activation's input and output; attention's scores unless fused or
    ** recomputed */
    double w = fp8 ? 1 : 2 * vb;
    double kept = (4 * vb + 2 * w + (m->dropout ? 2 : 0)) * BS * H / rep +
                  (2 * vb * BS * (Q + 2 * K) + (2 * vb + (fp8 && m->flash ? 1 : 0)) * BS * Q +
                   2 * vb * up * BS * F + w * BS * F) / T;
    p->saved = kept + (selective && !m->flash ? 0 : scores);
    p->checkpoint = 2 * vb * BS * H / rep;
    double h = H, norm = m->norm == RP_NORM_LAYER ? 2 : 1;
    double col_bias = m->bias == RP_BIAS_ALL ? Q + 2 * K + up * F
                      : m->bias == RP_BIAS_QKV ? Q + 2 * K
                                               : 0;
    double row_bias = m->bias == RP_BIAS_ALL ? 2 * h : 0; /* the projection's and down's: whole */
    p->params = (h * (Q + 2 * K) + Q * h + up * h * F + F * h + col_bias) / T + row_bias +
                2 * norm * h;
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

void rpi_xf_parts(const rp_transformer *m, const rp_cluster *c, const rp_transformer_run *r,
                  rpi_xf_part parts[RPI_XF_PARTS]) {
    const rp_device *d = &c->device;
    bool fp32 = r->precision == RP_PRECISION_FP32;
    double peak16 = fp32 ? d->peak_fp32 : d->peak_flops;
    rates x = {.c = c,
               .peak = rp_precision_peak(d, r->precision),
               .peak16 = peak16,
               .gemm_eff = r->precision == RP_PRECISION_FP8 ? d->fp8_efficiency
                                                            : d->gemm_efficiency,
               .gemm_half = d->gemm_half,
               .stream_bw = d->memory_bandwidth * d->memory_efficiency,
               .attn_flops = peak16 * d->attention_efficiency,
               .vb = fp32 ? 2 : 1,
               .cp_bw = (double)r->tensor_parallel * r->context_parallel <= c->per_node
                            ? c->node_bandwidth
                            : c->network_bandwidth};
    memset(parts, 0, sizeof(rpi_xf_part) * RPI_XF_PARTS);
    embedding(m, &x, r, &parts[RPI_XF_EMBED]);
    block(m, &x, r, &parts[RPI_XF_BLOCK]);
    head(m, &x, r, &parts[RPI_XF_HEAD]);
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
        if (!isfinite(parts[k].f + parts[k].bi + parts[k].bw + parts[k].saved + parts[k].params))
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
        int kind = rpi_xf_kind((int)l, m->layers);
        const rpi_xf_part *x = &parts[kind];
        char name[48];
        if (kind == RPI_XF_EMBED)
            snprintf(name, sizeof name, "embedding: Embedding");
        else if (kind == RPI_XF_BLOCK)
            snprintf(name, sizeof name, "layers.%zu: TransformerBlock", l - 1);
        else
            snprintf(name, sizeof name, "head: OutputLayer");
        n += (size_t)snprintf(s + n, cap - n,
                              "node%zu -- %s backward_input_time=%.6g backward_weight_time=%.6g "
                              "saved_bytes=%.0f checkpoint_bytes=%.0f -- "
                              "forward_compute_time=%.6g, backward_compute_time=%.6g, "
                              "activation_size=%.0f, parameter_size=%.0f\n",
                              l + 1, name, x->bi * 1e3, x->bw * 1e3, x->saved, x->checkpoint,
                              x->f * 1e3, (x->bi + x->bw) * 1e3, x->out, 4 * x->params);
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
    if (field(desc, "micro_batch", v, sizeof v))
        r->micro_batch = atoi(v);
    if (field(desc, "tensor_parallel", v, sizeof v))
        r->tensor_parallel = atoi(v);
    if (field(desc, "context_parallel", v, sizeof v))
        r->context_parallel = atoi(v);
    if (field(desc, "sequence_parallel", v, sizeof v))
        r->sequence_parallel = atoi(v) != 0;
    if (field(desc, "recompute", v, sizeof v))
        r->recompute = strcmp(v, "selective") == 0 ? RP_RECOMPUTE_SELECTIVE
                       : strcmp(v, "full") == 0    ? RP_RECOMPUTE_FULL
                                                   : RP_RECOMPUTE_NONE;
    if (field(desc, "precision", v, sizeof v))
        r->precision = strcmp(v, "fp8") == 0    ? RP_PRECISION_FP8
                       : strcmp(v, "fp32") == 0 ? RP_PRECISION_FP32
                                                : RP_PRECISION_BF16;
    if (field(desc, "overlap", v, sizeof v))
        r->overlap = atoi(v) != 0;
    return r->micro_batch >= 1 && r->tensor_parallel >= 1 && r->context_parallel >= 1;
}
