/*
** One line of a model spec as a layer: its kind, its positional arguments
** and its key=value options, each checked with a message that names the
** file, the line and what was wrong (docs/training.md lists them).
*/
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "spec_impl.h"
#include "repipe/spec.h"

static bool parse_int(const char *s, long *v) {
    char *end;
    errno = 0;
    *v = strtol(s, &end, 10);
    return !errno && end != s && !*end;
}

bool rpi_spec_parse_float(const char *s, double *v) {
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return !errno && end != s && !*end && isfinite(*v);
}

rp_status rpi_spec_want_int(pctx *c, const char *what, const char *s, long lo, long hi,
                           int *out) {
    long v;
    if (!parse_int(s, &v) || v < lo || v > hi)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s: '%s' is not a whole number from %ld to %ld",
                       c->name, c->line, what, s, lo, hi);
    *out = (int)v;
    return RP_OK;
}

/* Where integer option k goes in L, and its bounds; NULL for others. */
static int *int_option(rp_layer *L, const char *k, long *lo, long *hi) {
    static const struct {
        const char *key;
        long lo, hi;
        size_t at;
    } ints[] = {
        {"kernel", 1, 1 << 16, offsetof(rp_layer, kernel)},
        {"stride", 1, 1 << 16, offsetof(rp_layer, stride)},
        {"pad", 0, 1 << 16, offsetof(rp_layer, pad)},
        {"groups", 1, 1 << 20, offsetof(rp_layer, groups)},
        {"group_size", 1, 1 << 20, offsetof(rp_layer, group_size)},
        {"tie", 0, 1 << 24, offsetof(rp_layer, tie)},
        {"heads", 1, 1 << 16, offsetof(rp_layer, heads)},
        {"kv_heads", 1, 1 << 16, offsetof(rp_layer, kv_heads)},
        {"mlp", 1, 64, offsetof(rp_layer, mlp)},
        {"experts", 1, 1 << 12, offsetof(rp_layer, experts)},
        {"top_k", 1, 1 << 12, offsetof(rp_layer, top_k)},
        {"ffn", 1, 1 << 20, offsetof(rp_layer, ffn)},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (strcmp(k, ints[i].key) == 0) {
            *lo = ints[i].lo, *hi = ints[i].hi;
            return (int *)((char *)L + ints[i].at);
        }
    return NULL;
}

/* A number option: rope_theta, std, momentum, eps, and dropout's p. */
static rp_status float_option(pctx *c, rp_layer *L, const char *k, const char *v) {
    double d;
    bool ok = rpi_spec_parse_float(v, &d);
    if (strcmp(k, "rope_theta") == 0) {
        if (!ok || d < 0 || d > 1e12)
            return rp_fail(c->err, RP_ERR_PARSE,
                           "%s:%d: rope_theta: '%s' is not a number in [0, 1e12] (0: no rotary "
                           "embeddings)",
                           c->name, c->line, v);
        L->rope_theta = (float)d;
    } else if (strcmp(k, "std") == 0) {
        if (!ok || !(d > 0) || d > 1e3)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: std: '%s' is not a number in (0, 1000]",
                           c->name, c->line, v);
        L->std = (float)d;
    } else if (strcmp(k, "momentum") == 0) {
        if (!ok || !(d > 0) || d > 1)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: momentum: '%s' is not a number in (0, 1]",
                           c->name, c->line, v);
        L->momentum = (float)d;
    } else if (strcmp(k, "balance") == 0) {
        if (!ok || d < 0 || d > 1e3)
            return rp_fail(c->err, RP_ERR_PARSE,
                           "%s:%d: balance: '%s' is not a number in [0, 1000] (the balance "
                           "loss's weight)",
                           c->name, c->line, v);
        L->balance = (float)d;
    } else if (strcmp(k, "eps") == 0 || strcmp(k, "p") == 0 || strcmp(k, "dropout") == 0) {
        bool is_p = k[0] != 'e';
        if (!ok || (is_p ? (d < 0 || d >= 1) : d <= 0))
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s: '%s' is not a number %s", c->name,
                           c->line, k, v, is_p ? "in [0, 1)" : "> 0");
        if (is_p)
            L->p = (float)d;
        else
            L->eps = (float)d;
    }
    return RP_OK;
}

/* A word option: gelu's form, bias, an moe's gate and whether it is normalised. */
static rp_status word_option(pctx *c, rp_layer *L, const char *k, const char *v) {
    if (strcmp(k, "gelu") == 0) {
        if (strcmp(v, "tanh") != 0 && strcmp(v, "erf") != 0)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: gelu: '%s' is not tanh or erf",
                           c->name, c->line, v);
        L->gelu_erf = v[0] == 'e';
    } else if (strcmp(k, "gate") == 0) {
        if (strcmp(v, "softmax") != 0 && strcmp(v, "sigmoid") != 0)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: gate: '%s' is not softmax or sigmoid",
                           c->name, c->line, v);
        L->gate_sigmoid = v[1] == 'i';
    } else if (strcmp(k, "bias") == 0 || strcmp(k, "norm") == 0) {
        if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s: '%s' is not true or false",
                           c->name, c->line, k, v);
        *(k[0] == 'b' ? &L->bias : &L->gate_norm) = v[0] == 't';
    }
    return RP_OK;
}

/* Applies key=value options; `allowed` lists the keys this layer takes. */
static rp_status apply_options(pctx *c, rp_layer *L, rpi_words *w, int first, const char *allowed) {
    for (int i = first; i < w->n; i++) {
        char *eq = strchr(w->w[i], '=');
        if (!eq)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: unexpected '%s' (options are key=value)",
                           c->name, c->line, w->w[i]);
        *eq = '\0';
        const char *k = w->w[i], *v = eq + 1;
        char key[40];
        snprintf(key, sizeof key, " %s ", k);
        if (!strstr(allowed, key))
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s takes no option '%s' (it takes:%s)",
                           c->name, c->line, rp_layer_name(L->type), k,
                           strlen(allowed) > 1 ? allowed : " none");
        long lo, hi;
        int *at = int_option(L, k, &lo, &hi);
        rp_status s = at ? rpi_spec_want_int(c, k, v, lo, hi, at) : float_option(c, L, k, v);
        if (!s && !at)
            s = word_option(c, L, k, v);
        if (s)
            return s;
        if (at == &L->tie) /* tie=N is layer N; 0 in L->tie is none */
            L->tie++;
    }
    return RP_OK;
}

/* Positional arguments (before the options) of a layer line. */
static int positional(const rpi_words *w) {
    int n = 1;
    while (n < w->n && !strchr(w->w[n], '='))
        n++;
    return n - 1;
}

/* The layers a spec names, their positional arguments and options. */
static const struct layer_kind {
    const char *name;
    rp_layer_type type;
    int args; /* positional arguments */
    const char *options;
} KINDS[] = {
    {"linear", RP_LAYER_LINEAR, 1, " bias group_size tie "},
    {"conv2d", RP_LAYER_CONV2D, 1, " kernel stride pad groups bias group_size "},
    {"relu", RP_LAYER_RELU, 0, " "},
    {"gelu", RP_LAYER_GELU, 0, " "},
    {"maxpool2d", RP_LAYER_MAXPOOL2D, 1, " stride pad "},
    {"flatten", RP_LAYER_FLATTEN, 0, " "},
    {"dropout", RP_LAYER_DROPOUT, -1, " p "},
    {"layernorm", RP_LAYER_LAYERNORM, 0, " eps group_size "},
    {"embedding", RP_LAYER_EMBEDDING, 2, " group_size std "},
    {"softmax_cross_entropy", RP_LAYER_SOFTMAX_CE, 0, " "},
    {"position_embedding", RP_LAYER_POSITION_EMBEDDING, 0, " group_size "},
    {"transformer_block", RP_LAYER_TRANSFORMER_BLOCK, 0, " heads mlp dropout gelu group_size "},
    {"add", RP_LAYER_ADD, 0, " "},
    {"concat", RP_LAYER_CONCAT, 0, " "},
    {"avgpool2d", RP_LAYER_AVGPOOL2D, 1, " stride pad "},
    {"adaptive_avgpool2d", RP_LAYER_ADAPTIVE_AVGPOOL2D, -1, " "},
    {"sigmoid", RP_LAYER_SIGMOID, 0, " "},
    {"tanh", RP_LAYER_TANH, 0, " "},
    {"batchnorm2d", RP_LAYER_BATCHNORM2D, 0, " eps momentum group_size "},
    {"batchnorm1d", RP_LAYER_BATCHNORM1D, 0, " eps momentum group_size "},
    {"rmsnorm", RP_LAYER_RMSNORM, 0, " eps group_size "},
    {"silu", RP_LAYER_SILU, 0, " "},
    {"mul", RP_LAYER_MUL, 0, " "},
    {"attention", RP_LAYER_ATTENTION, 0, " heads kv_heads rope_theta "},
    {"moe", RP_LAYER_MOE, 0, " experts top_k ffn gate norm balance "},
};

/* The positional arguments: units, a kernel, a vocabulary and its size, a
** probability. */
static rp_status arguments(pctx *c, const rpi_words *w, rp_layer *L, int npos) {
    rp_status s = RP_OK;
    switch (L->type) {
    case RP_LAYER_LINEAR:
        s = rpi_spec_want_int(c, "output features", w->w[1], 1, 1 << 24, &L->units);
        break;
    case RP_LAYER_CONV2D:
        s = rpi_spec_want_int(c, "output channels", w->w[1], 1, 1 << 20, &L->units);
        break;
    case RP_LAYER_MAXPOOL2D:
    case RP_LAYER_AVGPOOL2D:
        s = rpi_spec_want_int(c, "kernel size", w->w[1], 1, 1 << 16, &L->kernel);
        break;
    case RP_LAYER_ADAPTIVE_AVGPOOL2D: /* the output's height and width, 1 unless given */
        if (npos > 1)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: adaptive_avgpool2d takes one output size",
                           c->name, c->line);
        L->units = 1;
        if (npos == 1)
            s = rpi_spec_want_int(c, "output size", w->w[1], 1, 1 << 16, &L->units);
        break;
    case RP_LAYER_EMBEDDING:
        s = rpi_spec_want_int(c, "vocabulary size", w->w[1], 1, 1 << 28, &L->vocab);
        if (!s)
            s = rpi_spec_want_int(c, "embedding size", w->w[2], 1, 1 << 20, &L->dim);
        break;
    case RP_LAYER_DROPOUT:
        if (npos > 1)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: dropout takes one probability", c->name,
                           c->line);
        if (npos == 1) {
            double d;
            if (!rpi_spec_parse_float(w->w[1], &d) || d < 0 || d >= 1)
                return rp_fail(c->err, RP_ERR_PARSE,
                               "%s:%d: dropout probability '%s' is not a number in [0, 1)",
                               c->name, c->line, w->w[1]);
            L->p = (float)d;
        } else {
            L->p = 0.5f;
        }
        break;
    default:
        break;
    }
    return s;
}

/* What a layer's options default to. */
static void defaults(rp_layer *L) {
    L->bias = true;
    L->eps = L->type == RP_LAYER_RMSNORM ? 1e-6f /* LLaMA's */ : 1e-5f;
    L->stride = 0;
    L->mlp = 4;
    L->std = 1;
    L->groups = 1;
    L->momentum = 0.1f;
    L->top_k = 2; /* Megatron-LM's --moe-router-topk */
    L->gate_norm = true;
}

/* The options a layer cannot go without, and those that default to others. */
static rp_status required(pctx *c, rp_layer *L) {
    if (L->type == RP_LAYER_CONV2D && L->kernel == 0)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: conv2d needs kernel=K", c->name, c->line);
    if (L->type == RP_LAYER_ATTENTION && L->heads == 0)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: attention needs heads=H", c->name, c->line);
    if (L->type == RP_LAYER_ATTENTION && L->kv_heads == 0)
        L->kv_heads = L->heads;
    if (L->type == RP_LAYER_TRANSFORMER_BLOCK && L->heads == 0)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: transformer_block needs heads=H", c->name,
                       c->line);
    if (L->type == RP_LAYER_MOE && (L->experts == 0 || L->ffn == 0))
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: moe needs experts=E and ffn=F", c->name,
                       c->line);
    if (L->type == RP_LAYER_MOE && L->top_k > L->experts)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: moe: top_k=%d is more than its %d experts",
                       c->name, c->line, L->top_k, L->experts);
    if (L->stride == 0)
        L->stride = L->type == RP_LAYER_MAXPOOL2D || L->type == RP_LAYER_AVGPOOL2D ? L->kernel : 1;
    return RP_OK;
}

rp_status rpi_spec_parse_layer(pctx *c, rpi_words *w, rp_layer *L) {
    int k = 0, nk = (int)(sizeof KINDS / sizeof KINDS[0]);
    while (k < nk && strcmp(KINDS[k].name, w->w[0]) != 0)
        k++;
    if (k == nk) {
        const char *names[32];
        for (int i = 0; i < nk; i++)
            names[i] = KINDS[i].name;
        const char *hint = rp_closest_word(w->w[0], names, nk);
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: unknown layer '%s'%s%s%s", c->name, c->line,
                       w->w[0], hint ? " (did you mean '" : "", hint ? hint : "",
                       hint ? "'?)" : "");
    }
    L->type = KINDS[k].type;
    L->line = c->line;
    defaults(L);
    int npos = positional(w);
    int want = KINDS[k].args;
    if (want >= 0 && npos != want)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s takes %d argument%s before its options, not %d",
                       c->name, c->line, KINDS[k].name, want, want == 1 ? "" : "s", npos);
    rp_status s = arguments(c, w, L, npos);
    if (!s)
        s = apply_options(c, L, w, 1 + npos, KINDS[k].options);
    return s ? s : required(c, L);
}

