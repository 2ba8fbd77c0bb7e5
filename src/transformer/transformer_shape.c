/*
** Transformer shapes: KEY=VALUE text, presets and Hugging Face config.json
** files read into one rp_transformer, and what a shape alone decides: its
** parameters and its FLOPs as Megatron-LM, its SC'21 paper and PyTorch's
** users count them.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/transformer.h"

/* The presets, from each model's own config.json (Meta's Llama 3 and 2
** releases on Hugging Face; Llama 3 paper, table 3) and, for GPT-3 175B,
** the shape Megatron-LM's papers train (Narayanan et al. 2021, table 1;
** Korthikanti et al. 2022, table 3: the GPT-2 vocabulary padded to 51200). */
static const struct {
    const char *name;
    rp_transformer m;
} PRESETS[] = {
#define LLAMA(L, H, A, G, F, V, S)                                                            \
    {.layers = L, .hidden = H, .heads = A, .seq = S, .vocab = V, .kv_heads = G,              \
     .head_dim = H / A, .ffn = F, .mlp = RP_MLP_SWIGLU, .norm = RP_NORM_RMS,                  \
     .position = RP_POSITION_ROPE, .bias = RP_BIAS_NONE, .untied = true, .flash = true,        \
     .dropout = false}
    {"llama3-8b", LLAMA(32, 4096, 32, 8, 14336, 128256, 8192)},
    {"llama3-70b", LLAMA(80, 8192, 64, 8, 28672, 128256, 8192)},
    {"llama3-405b", LLAMA(126, 16384, 128, 8, 53248, 128256, 8192)},
    {"llama2-7b", LLAMA(32, 4096, 32, 32, 11008, 32000, 4096)},
    {"llama2-70b", LLAMA(80, 8192, 64, 8, 28672, 32000, 4096)},
#undef LLAMA
    {"gpt3-175b",
     {.layers = 96, .hidden = 12288, .heads = 96, .seq = 2048, .vocab = 51200, .kv_heads = 96,
      .head_dim = 128, .ffn = 4 * 12288, .dropout = true}},
};

const char *const *rp_transformer_presets(void) {
    static const char *names[sizeof PRESETS / sizeof *PRESETS + 1];
    for (size_t i = 0; i < sizeof PRESETS / sizeof *PRESETS; i++)
        names[i] = PRESETS[i].name;
    return names;
}

bool rp_transformer_preset(const char *name, rp_transformer *out) {
    for (size_t i = 0; i < sizeof PRESETS / sizeof *PRESETS; i++)
        if (strcmp(name, PRESETS[i].name) == 0) {
            *out = PRESETS[i].m;
            return true;
        }
    return false;
}

enum key {
    K_LAYERS, K_HIDDEN, K_HEADS, K_SEQ, K_VOCAB, K_KV_HEADS, K_HEAD_DIM, K_FFN, K_MLP, K_NORM,
    K_POSITION, K_BIAS, K_TIED, K_FLASH, K_DROPOUT, K_EXPERTS, K_TOP_K, K_MOE_FFN,
    K_SHARED_FFN, K_MOE_EVERY, K_DENSE_FIRST, K_QK_NORM, K_Q_LORA, K_KV_LORA, K_ROPE_DIM,
    K_V_DIM, K_MTP, K_COUNT
};
static const char *const KEYS[K_COUNT] = {
    "layers", "hidden", "heads", "seq", "vocab", "kv_heads", "head_dim", "ffn", "mlp", "norm",
    "position", "bias", "tied", "flash", "dropout", "experts", "top_k", "moe_ffn",
    "shared_ffn", "moe_every", "dense_first", "qk_norm", "q_lora", "kv_lora", "rope_dim",
    "v_dim", "mtp"};
/* the largest value of each whole-number key */
static const long MAX[K_COUNT] = {
    [K_LAYERS] = RP_TRANSFORMER_MAX_LAYERS, [K_HIDDEN] = RP_TRANSFORMER_MAX_WIDTH,
    [K_HEADS] = RP_TRANSFORMER_MAX_WIDTH,   [K_SEQ] = RP_TRANSFORMER_MAX_SEQ,
    [K_VOCAB] = RP_TRANSFORMER_MAX_VOCAB,   [K_KV_HEADS] = RP_TRANSFORMER_MAX_WIDTH,
    [K_HEAD_DIM] = RP_TRANSFORMER_MAX_WIDTH, [K_FFN] = RP_TRANSFORMER_MAX_WIDTH,
    [K_TIED] = 1,                           [K_FLASH] = 1,
    [K_DROPOUT] = 1,                        [K_EXPERTS] = 1 << 16,
    [K_TOP_K] = 1 << 16,                    [K_MOE_FFN] = RP_TRANSFORMER_MAX_WIDTH,
    [K_SHARED_FFN] = RP_TRANSFORMER_MAX_WIDTH, [K_MOE_EVERY] = RP_TRANSFORMER_MAX_LAYERS,
    [K_DENSE_FIRST] = RP_TRANSFORMER_MAX_LAYERS, [K_QK_NORM] = 1,
    [K_Q_LORA] = RP_TRANSFORMER_MAX_WIDTH,  [K_KV_LORA] = RP_TRANSFORMER_MAX_WIDTH,
    [K_ROPE_DIM] = RP_TRANSFORMER_MAX_WIDTH, [K_V_DIM] = RP_TRANSFORMER_MAX_WIDTH,
    [K_MTP] = 16};
static const char *const WORDS[K_COUNT][4] = {
    [K_MLP] = {"gelu", "swiglu"},
    [K_NORM] = {"layernorm", "rmsnorm"},
    [K_POSITION] = {"learned", "rope"},
    [K_BIAS] = {"all", "none", "qkv"},
};

/* Megatron-LM's MLP width when none is given (megatron/training/arguments.py):
** 4 h, or for SwiGLU's three matrices 8 h / 3 rounded down to 64. */
static int default_ffn(const rp_transformer *m) {
    return m->mlp == RP_MLP_SWIGLU ? (int)(4.0 * m->hidden * 2 / 3 / 64) * 64 : 4 * m->hidden;
}

/* A key whose value is a word (mlp, norm, position, bias): its index among
** the key's words. */
static rp_status word_value(const char *spec, int key, const char *v, size_t vn,
                            rp_transformer *m, rp_error *err) {
    int w = 0;
    while (w < 4 && WORDS[key][w] &&
           !(strlen(WORDS[key][w]) == vn && strncmp(v, WORDS[key][w], vn) == 0))
        w++;
    if (w == 4 || !WORDS[key][w])
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': %s is %s%s%s%s%s, not '%.*s'",
                       spec, KEYS[key], WORDS[key][0], WORDS[key][2] ? ", " : " or ",
                       WORDS[key][1], WORDS[key][2] ? " or " : "",
                       WORDS[key][2] ? WORDS[key][2] : "", (int)vn, v);
    if (key == K_MLP)
        m->mlp = (rp_mlp_kind)w;
    else if (key == K_NORM)
        m->norm = (rp_norm_kind)w;
    else if (key == K_POSITION)
        m->position = (rp_position_kind)w;
    else
        m->bias = (rp_bias_kind)w;
    return RP_OK;
}

/* Applies one KEY=VALUE (n characters at p) to m. */
static rp_status apply(const char *spec, const char *p, size_t n, rp_transformer *m,
                       unsigned *seen, rp_error *err) {
    const char *eq = memchr(p, '=', n);
    if (!eq)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': '%.*s' is not KEY=VALUE", spec,
                       (int)n, p);
    size_t k = (size_t)(eq - p), vn = n - k - 1;
    int key = 0;
    while (key < K_COUNT && !(strlen(KEYS[key]) == k && strncmp(p, KEYS[key], k) == 0))
        key++;
    if (key == K_COUNT)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': '%.*s' is not one of layers, "
                       "hidden, heads, seq, vocab, kv_heads, head_dim, ffn, mlp, norm, position, "
                       "bias, tied, flash, dropout, experts, top_k, moe_ffn, shared_ffn, "
                       "moe_every, dense_first, qk_norm, q_lora, kv_lora, rope_dim, v_dim, mtp",
                       spec, (int)k, p);
    if (*seen & 1u << key)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': %s is given twice", spec,
                       KEYS[key]);
    *seen |= 1u << key;
    const char *v = eq + 1;
    if (WORDS[key][0])
        return word_value(spec, key, v, vn, m, err);
    long x = 0;
    size_t i = 0;
    for (; i < vn && v[i] >= '0' && v[i] <= '9'; i++)
        if ((x = x * 10 + (v[i] - '0')) > MAX[key])
            break;
    if (vn == 0 || (i < vn && !(v[i] >= '0' && v[i] <= '9')))
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': %s needs a whole number, not '%.*s'",
                       spec, KEYS[key], (int)vn, v);
    bool flag = key == K_TIED || key == K_FLASH || key == K_DROPOUT || key == K_QK_NORM ||
                key == K_SHARED_FFN || key == K_DENSE_FIRST || key == K_Q_LORA ||
                key == K_ROPE_DIM || key == K_MTP; /* (those that may be 0) */
    if (x > MAX[key] || (x < 1 && !flag))
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': %s is %s, from %d to %ld", spec,
                       KEYS[key], x > MAX[key] ? "too large" : "too small", flag ? 0 : 1,
                       MAX[key]);
    int *field[K_COUNT] = {&m->layers, &m->hidden, &m->heads, &m->seq, &m->vocab,
                           &m->kv_heads, &m->head_dim, &m->ffn,
                           [K_EXPERTS] = &m->experts, [K_TOP_K] = &m->top_k,
                           [K_MOE_FFN] = &m->moe_ffn, [K_SHARED_FFN] = &m->shared_ffn,
                           [K_MOE_EVERY] = &m->moe_every, [K_DENSE_FIRST] = &m->dense_first,
                           [K_Q_LORA] = &m->q_lora, [K_KV_LORA] = &m->kv_lora,
                           [K_ROPE_DIM] = &m->rope_dim, [K_V_DIM] = &m->v_dim, [K_MTP] = &m->mtp};
    if (key == K_TIED)
        m->untied = x == 0;
    else if (key == K_FLASH)
        m->flash = x == 1;
    else if (key == K_DROPOUT)
        m->dropout = x == 1;
    else if (key == K_QK_NORM)
        m->qk_norm = x == 1;
    else
        *field[key] = (int)x;
    return RP_OK;
}

/* A mixture's keys: only with experts, the defaults filled (Megatron-LM's:
** top 2, each expert the dense MLP's width, every block). */
static rp_status experts_check(const char *spec, rp_transformer *m, unsigned seen,
                               rp_error *err) {
    unsigned moe_keys = 1u << K_TOP_K | 1u << K_MOE_FFN | 1u << K_SHARED_FFN |
                        1u << K_MOE_EVERY | 1u << K_DENSE_FIRST;
    if (!m->experts) {
        if (seen & moe_keys)
            return rp_fail(err, RP_ERR_INVALID, "transformer '%s': top_k, moe_ffn, shared_ffn, "
                           "moe_every and dense_first describe a mixture of experts: give "
                           "experts too", spec);
        return RP_OK;
    }
    if (!m->top_k)
        m->top_k = m->experts < 2 ? m->experts : 2;
    if (!m->moe_ffn)
        m->moe_ffn = m->ffn;
    if (!m->moe_every)
        m->moe_every = 1;
    if (m->top_k > m->experts)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': top_k %d is more than the %d "
                       "experts", spec, m->top_k, m->experts);
    if (m->dense_first >= m->layers)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': dense_first %d leaves none of "
                       "the %d blocks a mixture of experts", spec, m->dense_first, m->layers);
    return RP_OK;
}

/* Latent attention's keys: only with kv_lora; every head its own key and
** value (no groups); v_dim defaults to head_dim. */
static rp_status latent_check(const char *spec, rp_transformer *m, unsigned seen, rp_error *err) {
    unsigned keys = 1u << K_Q_LORA | 1u << K_ROPE_DIM | 1u << K_V_DIM;
    if (!m->kv_lora) {
        if (seen & keys)
            return rp_fail(err, RP_ERR_INVALID, "transformer '%s': q_lora, rope_dim and v_dim "
                           "describe latent attention: give kv_lora too", spec);
        return RP_OK;
    }
    if (m->kv_heads != m->heads)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': latent attention gives every head "
                       "its own key and value: kv_heads is the %d heads", spec, m->heads);
    if (!m->v_dim)
        m->v_dim = m->head_dim;
    return RP_OK;
}

bool rp_transformer_moe_block(const rp_transformer *m, int i) {
    return m->experts > 0 && i >= m->dense_first && i % m->moe_every == 0;
}

int rp_transformer_moe_blocks(const rp_transformer *m) {
    if (m->experts < 1)
        return 0;
    int n = 0;
    for (int i = m->dense_first; i < m->layers; i++)
        n += i % m->moe_every == 0;
    return n;
}

rp_status rp_transformer_parse(const char *spec, rp_transformer *m, rp_error *err) {
    memset(m, 0, sizeof *m);
    const char *p = spec;
    unsigned seen = 0;
    size_t n = strcspn(p, ",");
    if (n && !memchr(p, '=', n)) { /* a preset first */
        char name[32];
        if (n >= sizeof name || (memcpy(name, p, n), name[n] = '\0', !rp_transformer_preset(name, m))) {
            const char *const *names = rp_transformer_presets();
            char list[256];
            size_t k = 0;
            for (int i = 0; names[i] && k < sizeof list; i++)
                k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", names[i]);
            return rp_fail(err, RP_ERR_INVALID, "transformer '%s': '%.*s' is neither KEY=VALUE "
                           "nor a preset (%s)", spec, (int)n, p, list);
        }
        /* a preset's keys may be given again, once each */
        p += n + (p[n] == ',');
    } else { /* GPT-2's kind: the zeros of the other kinds */
        m->bias = RP_BIAS_ALL;
        m->dropout = true;
    }
    bool preset = p != spec;
    int ffn0 = m->ffn, head_dim0 = m->head_dim, kv0 = m->kv_heads;
    if (preset)
        m->ffn = m->head_dim = m->kv_heads = 0; /* re-derived unless given */
    while (*p) {
        n = strcspn(p, ",");
        rp_status st = apply(spec, p, n, m, &seen, err);
        if (st)
            return st;
        p += n + (p[n] == ',');
    }
    if (preset) { /* the preset's own where the text did not change what they follow from */
        rp_transformer base;
        char name[32];
        size_t k = strcspn(spec, ",");
        memcpy(name, spec, k), name[k] = '\0';
        rp_transformer_preset(name, &base);
        if (!m->ffn && m->hidden == base.hidden && m->mlp == base.mlp)
            m->ffn = ffn0;
        if (!m->head_dim && m->hidden == base.hidden && m->heads == base.heads)
            m->head_dim = head_dim0;
        if (!m->kv_heads && m->heads == base.heads)
            m->kv_heads = kv0;
    }
    if (m->layers < 1 || m->hidden < 1 || m->heads < 1 || m->seq < 1 || m->vocab < 1)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': layers, hidden, heads, seq and "
                       "vocab are each needed, and at least 1", spec);
    if (!m->head_dim) {
        if (m->hidden % m->heads)
            return rp_fail(err, RP_ERR_INVALID, "transformer '%s': %d heads do not divide hidden "
                           "%d (give head_dim)", spec, m->heads, m->hidden);
        m->head_dim = m->hidden / m->heads;
    }
    if (!m->kv_heads)
        m->kv_heads = m->heads;
    if (m->heads % m->kv_heads)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': %d key/value heads do not divide "
                       "the %d heads", spec, m->kv_heads, m->heads);
    if ((double)m->heads * m->head_dim > RP_TRANSFORMER_MAX_WIDTH)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': heads x head_dim is %.0f, more "
                       "than %d", spec, (double)m->heads * m->head_dim, RP_TRANSFORMER_MAX_WIDTH);
    if (!m->ffn)
        m->ffn = default_ffn(m);
    if (m->ffn < 1)
        return rp_fail(err, RP_ERR_INVALID, "transformer '%s': hidden %d leaves SwiGLU's default "
                       "MLP width at 0 (give ffn)", spec, m->hidden);
    rp_status st = experts_check(spec, m, seen, err);
    return st ? st : latent_check(spec, m, seen, err);
}

void rp_transformer_format(const rp_transformer *m, char *out, size_t cap) {
    snprintf(out, cap, "layers=%d,hidden=%d,heads=%d,seq=%d,vocab=%d,kv_heads=%d,head_dim=%d,"
                       "ffn=%d,mlp=%s,norm=%s,position=%s,bias=%s,tied=%d,flash=%d,dropout=%d",
             m->layers, m->hidden, m->heads, m->seq, m->vocab, m->kv_heads, m->head_dim, m->ffn,
             WORDS[K_MLP][m->mlp], WORDS[K_NORM][m->norm], WORDS[K_POSITION][m->position],
             WORDS[K_BIAS][m->bias], !m->untied, m->flash, m->dropout);
    size_t n = strlen(out);
    if (m->qk_norm && n < cap)
        n += (size_t)snprintf(out + n, cap - n, ",qk_norm=1");
    if (m->kv_lora && n < cap)
        n += (size_t)snprintf(out + n, cap - n, ",kv_lora=%d,q_lora=%d,rope_dim=%d,v_dim=%d",
                              m->kv_lora, m->q_lora, m->rope_dim, m->v_dim);
    if (m->mtp && n < cap)
        n += (size_t)snprintf(out + n, cap - n, ",mtp=%d", m->mtp);
    if (m->experts && n < cap)
        snprintf(out + n, cap - n, ",experts=%d,top_k=%d,moe_ffn=%d,shared_ffn=%d,moe_every=%d,"
                 "dense_first=%d", m->experts, m->top_k, m->moe_ffn, m->shared_ffn,
                 m->moe_every, m->dense_first);
}

double rp_transformer_padded_vocab(const rp_transformer *m, int t) {
    double k = 128.0 * (t > 0 ? t : 1);
    return ceil(m->vocab / k) * k;
}

double rp_transformer_qkv_width(const rp_transformer *m) {
    double qk = m->head_dim + (m->kv_lora ? m->rope_dim : 0);
    return (double)m->heads * (qk + (m->kv_lora ? m->v_dim : m->head_dim));
}

double rp_transformer_attention_macs(const rp_transformer *m) {
    double h = m->hidden, A = m->heads, D = m->head_dim;
    if (!m->kv_lora)
        return h * A * D + 2 * h * m->kv_heads * D + A * D * h;
    /* queries (through their latent), the keys' and values' latent and its
    ** rotary keys, keys and values up from it, the output */
    double qk = D + m->rope_dim, ql = m->q_lora, kl = m->kv_lora, vd = m->v_dim;
    return (ql ? h * ql + ql * A * qk : h * A * qk) + h * (kl + m->rope_dim) +
           kl * A * (D + vd) + A * vd * h;
}

/* An MLP of width f: its products and, with biases everywhere, theirs. */
static double mlp_parameters(const rp_transformer *m, double f) {
    double h = m->hidden, up = m->mlp == RP_MLP_SWIGLU ? 2 : 1;
    return up * h * f + f * h + (m->bias == RP_BIAS_ALL ? up * f + h : 0);
}

/* A block's parameters (its products, their biases, its two norms): of a
** mixture, its experts (or the top_k a token passes when `active`), the
** shared expert and the router (with a bias where every product has one). */
static double block_parameters(const rp_transformer *m, bool moe, bool active) {
    double h = m->hidden, q = (double)m->heads * m->head_dim, k = (double)m->kv_heads * m->head_dim;
    double norm = m->norm == RP_NORM_LAYER ? 2 : 1;
    double bias = m->bias == RP_BIAS_ALL ? (q + 2 * k) + h : m->bias == RP_BIAS_QKV ? q + 2 * k : 0;
    /* latent attention: its products, and the latents' norms */
    double products = m->kv_lora ? rp_transformer_attention_macs(m) +
                                       norm * ((double)m->q_lora + m->kv_lora)
                                 : h * (q + 2 * k) + q * h;
    double attention = products + bias + 2 * norm * h + (m->qk_norm ? 2.0 * m->head_dim : 0);
    if (!moe)
        return attention + mlp_parameters(m, m->ffn);
    double E = m->experts;
    return attention + (active ? m->top_k : E) * mlp_parameters(m, m->moe_ffn) +
           (m->shared_ffn ? mlp_parameters(m, m->shared_ffn) : 0) + h * E +
           (m->bias == RP_BIAS_ALL ? E : 0);
}

static double parameters(const rp_transformer *m, bool active) {
    double h = m->hidden, V = m->vocab, norm = m->norm == RP_NORM_LAYER ? 2 : 1;
    double pos = m->position == RP_POSITION_LEARNED ? (double)m->seq * h : 0;
    double moe = rp_transformer_moe_blocks(m);
    return V * h + pos + (m->layers - moe) * block_parameters(m, false, active) +
           moe * block_parameters(m, true, active) + norm * h + (m->untied ? V * h : 0);
}

double rp_transformer_parameters(const rp_transformer *m) {
    return parameters(m, false);
}

double rp_transformer_active_parameters(const rp_transformer *m) {
    return parameters(m, true);
}

double rp_transformer_flops_megatron(const rp_transformer *m, int t, double samples) {
    /* as num_floating_point_operations writes it for a dense model of
    ** sequences of equal length: 3 passes (forward, the input's and the
    ** weights' gradients) of 2 FLOPs a multiply-add */
    double h = m->hidden, s = m->seq, V = rp_transformer_padded_vocab(m, t);
    double ffn_expansion = m->mlp == RP_MLP_SWIGLU ? 3 : 2;
    /* latent attention's latents' norms, counted as a product's column each */
    double attention = 6 * (rp_transformer_attention_macs(m) + (double)m->q_lora + m->kv_lora);
    /* the causal mask halves Q K^T and its product with V */
    double core = 6 * rp_transformer_qkv_width(m) / 2;
    double tokens = samples * s, moe = rp_transformer_moe_blocks(m), mtp = m->mtp;
    /* multi-token prediction's blocks are of the last block's kind */
    bool last_moe = rp_transformer_moe_block(m, m->layers - 1);
    double L = m->layers + mtp, dense = m->layers - moe + (last_moe ? 0 : mtp);
    moe += last_moe ? mtp : 0;
    /* the MLPs: dense blocks' of ffn, a mixture's top_k experts and shared
    ** expert a token */
    double mlp = m->ffn * dense + ((double)m->moe_ffn * m->top_k + m->shared_ffn) * moe;
    return tokens * (6 * h * mlp * ffn_expansion + attention * L + 6 * h * V * (mtp + 1) +
                     6 * mtp * (3 * h + 2 * h * h)) +
           samples * s * s * core * L;
}

double rp_transformer_flops_eq3(const rp_transformer *m, double samples) {
    /* equation 3 counts, per token, the blocks' forward four times (forward,
    ** recomputed forward, backward's two) and the head's three: for a GPT
    ** of hidden h (4 h MLP, a = h / heads) its 24 h^2 + 4 s h a block */
    double h = m->hidden, s = m->seq, L = m->layers, V = m->vocab;
    double mats = m->mlp == RP_MLP_SWIGLU ? 3 : 2, moe = rp_transformer_moe_blocks(m);
    double mlp = m->ffn * (L - moe) + ((double)m->moe_ffn * m->top_k + m->shared_ffn) * moe;
    double block = 2 * rp_transformer_attention_macs(m) +
                   2 * s * rp_transformer_qkv_width(m);
    return 4 * samples * s * (L * block + 2 * mats * h * mlp) + 6 * samples * s * h * V;
}

double rp_transformer_flops_6n(const rp_transformer *m, double samples) {
    double h = m->hidden, s = m->seq;
    double pos = m->position == RP_POSITION_LEARNED ? s * h : 0;
    double n = rp_transformer_active_parameters(m) - (double)m->vocab * h - pos;
    return samples * s *
           (6 * n + 6.0 * m->layers * rp_transformer_qkv_width(m) * s);
}
