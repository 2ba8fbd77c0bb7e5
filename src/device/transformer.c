/*
** Transformer profiles from shapes: a GPT-style model (an embedding, L
** pre-norm blocks of attention and a 4h MLP, a final norm and a head tied to
** the embedding) priced on a device, the way Megatron-LM runs it: bf16
** products on the tensor cores, tensor groups of t (Shoeybi et al.:
** attention's heads and the MLP's columns split, two all-reduces a block
** each way, the vocabulary split in the embedding and the head), a stage's
** output sent in t pieces and gathered inside the node, and what a block
** keeps for its backward as Korthikanti et al. ("Reducing Activation
** Recomputation in Large Transformer Models", 2022, section 4) count it:
** s b h (10 + 24 / t + 5 a s / (h t)) bytes without sequence parallelism,
** the last term attention's scores and their dropout mask, which a fused
** attention kernel (flash) does not keep.
**
** Each product takes its FLOPs over the device's peak at the efficiency its
** smallest side reaches; each elementwise kernel its bytes read and written
** over the memory's bandwidth; each all-reduce of a group a ring over the
** node's link. A node of the profile is one rank of a tensor group: its
** share of the time, parameters (fp32 bytes: the master weights) and
** activations.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/device.h"

rp_status rp_transformer_parse(const char *spec, rp_transformer *m, rp_error *err) {
    memset(m, 0, sizeof *m);
    const char *p = spec;
    while (*p) {
        const char *eq = strchr(p, '=');
        size_t n = strcspn(p, ",");
        if (!eq || (size_t)(eq - p) >= n)
            return rp_fail(err, RP_ERR_INVALID, "transformer '%s': '%.*s' is not KEY=VALUE", spec,
                           (int)n, p);
        char *end;
        long v = strtol(eq + 1, &end, 10);
        if (end != p + n || v < 0 || v > 1000000000L)
            return rp_fail(err, RP_ERR_INVALID, "transformer '%s': '%.*s' needs a whole number",
                           spec, (int)n, p);
        size_t k = (size_t)(eq - p);
#define KEY(name) (k == strlen(name) && strncmp(p, name, k) == 0)
        if (KEY("layers"))
            m->layers = (int)v;
        else if (KEY("hidden"))
            m->hidden = (int)v;
        else if (KEY("heads"))
            m->heads = (int)v;
        else if (KEY("seq"))
            m->seq = (int)v;
        else if (KEY("vocab"))
            m->vocab = (int)v;
        else if (KEY("ffn"))
            m->ffn = (int)v;
        else if (KEY("flash"))
            m->flash = v != 0;
        else
            return rp_fail(err, RP_ERR_INVALID, "transformer '%s': '%.*s' is not one of layers, "
                           "hidden, heads, seq, vocab, ffn, flash", spec, (int)k, p);
#undef KEY
        p += n + (p[n] == ',');
    }
    if (m->layers < 1 || m->hidden < 1 || m->heads < 1 || m->seq < 1 || m->vocab < 1)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': layers, hidden, heads, seq and "
                       "vocab are each needed, and at least 1", spec);
    if (m->hidden % m->heads)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': %d heads do not divide hidden %d",
                       spec, m->heads, m->hidden);
    if (m->layers > 100000)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': at most 100000 layers", spec);
    return RP_OK;
}

double rp_transformer_flops(const rp_transformer *m, double samples) {
    double s = m->seq, l = m->layers, h = m->hidden, V = m->vocab;
    double f = m->ffn > 0 ? m->ffn : 4.0 * h;
    /* equation 3 is for f = 4h: its 24 B s h^2 a block is 8 B s h^2 of
    ** attention's products and 4 B s h f of the MLP's */
    double block = 8 * h * h + 4 * h * f; /* per token, forward */
    return 4 * samples * s * l * (block + 4 * s * h) + 6 * samples * s * h * V;
}

/* Seconds of a product of an m x k and a k x n matrix, `count` times. */
static double gemm(const rp_device *d, double m, double k, double n, double count) {
    double side = fmin(m, fmin(k, n));
    double eff = d->gemm_efficiency * side / (side + d->gemm_half);
    return count * 2 * m * k * n / (d->peak_flops * eff);
}

static double stream(const rp_device *d, double bytes) {
    return bytes / (d->memory_bandwidth * d->memory_efficiency);
}

/* A ring all-reduce of `bytes` over t devices of a node. */
static double allreduce(const rp_cluster *c, int t, double bytes) {
    if (t < 2)
        return 0;
    return 2.0 * (t - 1) / t * bytes / c->node_bandwidth + 2.0 * (t - 1) * c->latency;
}

typedef struct node {
    const char *name;
    double f, bi, bw; /* seconds: forward, the input's gradient, the weights' */
    double out, saved, checkpoint, params; /* bytes */
} node;

static void block(const rp_transformer *m, const rp_cluster *c, int b, int t, node *x) {
    const rp_device *d = &c->device;
    double B = b, S = m->seq, H = m->hidden, A = m->heads, hd = H / A, T = t, BS = B * S;
    double F = m->ffn > 0 ? m->ffn : 4 * H;
    double weights = gemm(d, BS, H, 3 * H / T, 1) + gemm(d, BS, H / T, H, 1) +
                     gemm(d, BS, H, F / T, 1) + gemm(d, BS, F / T, H, 1);
    double core = gemm(d, S, hd, S, B * A / T) + gemm(d, S, S, hd, B * A / T);
    /* bf16 bytes read and written: two norms (8 B S H), the MLP's bias and
    ** GeLU (4 B S F / t), two dropouts and residual adds (14 B S H), and
    ** unless fused, the scores' scaled, masked softmax and its dropout
    ** (9 B A S^2 / t) */
    double elem = stream(d, 22 * BS * H + 4 * BS * F / T +
                                (m->flash ? 0 : 9 * B * A * S * S / T));
    double ar = allreduce(c, t, 2 * BS * H);
    x->f = weights + core + elem + 2 * ar;
    x->bi = weights + 2 * core + 2 * elem + 2 * ar;
    x->bw = weights;
    x->out = 2 * BS * H / T;
    x->saved = S * B * H * (10 + 24 / T + (m->flash ? 0 : 5 * A * S / (H * T)));
    x->checkpoint = 2 * BS * H; /* its input */
    /* the products' weights and the column-split biases (QKV's, the MLP's
    ** first) are the rank's share; the row-split biases and the norms are
    ** whole on every rank */
    x->params = 4 * ((4 * H * H + 2 * H * F) / T + (3 * H + F) / T + 2 * H + 4 * H);
}

static void embedding(const rp_transformer *m, const rp_cluster *c, int b, int t, node *x) {
    const rp_device *d = &c->device;
    double BS = (double)b * m->seq, H = m->hidden, T = t;
    /* the lookup and the position's add, dropout: ~10 B S H bytes; its
    ** vocabulary split all-reduces the output */
    double elem = stream(d, 10 * BS * H);
    x->f = elem + allreduce(c, t, 2 * BS * H);
    x->bi = 2 * elem;
    x->bw = elem; /* the rows' gradients added into the table */
    x->out = 2 * BS * H / T;
    x->saved = x->checkpoint = BS * H; /* the dropout's mask */
    x->params = 4 * ((double)m->vocab * H / T + (double)m->seq * H);
}

static void head(const rp_transformer *m, const rp_cluster *c, int b, int t, node *x) {
    const rp_device *d = &c->device;
    double BS = (double)b * m->seq, H = m->hidden, V = m->vocab, T = t;
    double logits = gemm(d, BS, H, V / T, 1);
    /* the final norm (4 B S H), the cross entropy in fp32 over the rank's
    ** share of the vocabulary (3 passes of 4 B S V / t) */
    double elem = stream(d, 4 * BS * H + 12 * BS * V / T);
    x->f = logits + elem + 3 * 2 * c->latency * (t > 1);
    x->bi = logits + elem + allreduce(c, t, 2 * BS * H);
    x->bw = logits;
    x->out = 4 * BS; /* the loss, a float a token */
    x->saved = x->checkpoint = 2 * BS * H + 4 * BS * V / T; /* the norm's input, the softmax */
    x->params = 4 * (V * H / T + 2 * H); /* the embedding's copy, tied */
}

rp_status rp_transformer_profile(const rp_transformer *m, const rp_cluster *c, int b, int t,
                                 char **out, rp_error *err) {
    *out = NULL;
    if (b < 1 || t < 1 || m->heads % t || m->vocab % t || (m->ffn > 0 ? m->ffn : 4 * m->hidden) % t)
        return rp_fail(err, RP_ERR_INVALID, "transformer: tensor groups of %d must divide the "
                       "heads (%d), the vocabulary (%d) and the MLP; micro-batches of %d must be "
                       "at least 1", t, m->heads, m->vocab, b);
    if (c->per_node % t)
        return rp_fail(err, RP_ERR_INVALID, "transformer: tensor groups of %d do not divide %s's "
                       "nodes of %d", t, c->name, c->per_node);
    size_t cap = (size_t)(m->layers + 3) * 320 + 512, n = 0;
    char *s = malloc(cap);
    if (!s)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    n += (size_t)snprintf(s + n, cap - n,
                          "node0 -- Input0 micro_batch=%d transformer=layers=%d,hidden=%d,"
                          "heads=%d,seq=%d,vocab=%d,ffn=%d,flash=%d tensor_parallel=%d "
                          "device=%s -- forward_compute_time=0, backward_compute_time=0, "
                          "activation_size=%.0f, parameter_size=0\n",
                          b, m->layers, m->hidden, m->heads, m->seq, m->vocab,
                          m->ffn > 0 ? m->ffn : 4 * m->hidden, m->flash, t, c->device.name,
                          4.0 * b * m->seq);
    for (int l = 0; l < m->layers + 2; l++) {
        node x;
        char name[48];
        if (l == 0)
            embedding(m, c, b, t, &x), snprintf(name, sizeof name, "embedding: Embedding");
        else if (l <= m->layers)
            block(m, c, b, t, &x), snprintf(name, sizeof name, "layers.%d: TransformerBlock", l - 1);
        else
            head(m, c, b, t, &x), snprintf(name, sizeof name, "head: OutputLayer");
        n += (size_t)snprintf(s + n, cap - n,
                              "node%d -- %s backward_input_time=%.6f backward_weight_time=%.6f "
                              "saved_bytes=%.0f checkpoint_bytes=%.0f -- "
                              "forward_compute_time=%.6f, backward_compute_time=%.6f, "
                              "activation_size=%.0f, parameter_size=%.0f\n",
                              l + 1, name, x.bi * 1e3, x.bw * 1e3, x.saved, x.checkpoint,
                              x.f * 1e3, (x.bi + x.bw) * 1e3, x.out, x.params);
    }
    for (int l = 0; l < m->layers + 2; l++)
        n += (size_t)snprintf(s + n, cap - n, "\tnode%d -- node%d\n", l, l + 1);
    *out = s;
    return RP_OK;
}

bool rp_transformer_of_profile(const char *desc, rp_transformer *m, int *t) {
    const char *at = strstr(desc, " transformer="), *tp = strstr(desc, " tensor_parallel=");
    if (!at || !tp)
        return false;
    char spec[256];
    size_t n = strcspn(at + 13, " ");
    if (n >= sizeof spec)
        return false;
    memcpy(spec, at + 13, n);
    spec[n] = '\0';
    rp_error err;
    *t = atoi(tp + 17);
    return *t >= 1 && rp_transformer_parse(spec, m, &err) == RP_OK;
}
