/*
** The model spec's parser (docs/training.md): words, options, each layer's
** line, the graph's names and inputs. Shapes are inferred line by line in
** shapes.c; what a parsed graph means at a stage boundary is graph.c's.
*/
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "graph.h"
#include "spec_impl.h"
#include "layers.h"
#include "repipe/model.h"

/* One line split into words; options are the words holding '='. */
typedef struct words {
    int n;
    char *w[32];
} words;

static void split_words(char *s, words *out) {
    out->n = 0;
    while (*s && out->n < 32) {
        while (isspace((unsigned char)*s))
            s++;
        if (!*s)
            break;
        out->w[out->n++] = s;
        while (*s && !isspace((unsigned char)*s))
            s++;
        if (*s)
            *s++ = '\0';
    }
}

static bool parse_int(const char *s, long *v) {
    char *end;
    errno = 0;
    *v = strtol(s, &end, 10);
    return !errno && end != s && !*end;
}

static bool parse_float(const char *s, double *v) {
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return !errno && end != s && !*end && isfinite(*v);
}

static rp_status want_int(pctx *c, const char *what, const char *s, long lo, long hi, int *out) {
    long v;
    if (!parse_int(s, &v) || v < lo || v > hi)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s: '%s' is not a whole number from %ld to %ld",
                       c->name, c->line, what, s, lo, hi);
    *out = (int)v;
    return RP_OK;
}

/* Applies key=value options; `allowed` lists the keys this layer takes. */
static rp_status apply_options(pctx *c, rp_layer *L, words *w, int first, const char *allowed) {
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
        rp_status s = RP_OK;
        if (strcmp(k, "kernel") == 0)
            s = want_int(c, k, v, 1, 1 << 16, &L->kernel);
        else if (strcmp(k, "stride") == 0)
            s = want_int(c, k, v, 1, 1 << 16, &L->stride);
        else if (strcmp(k, "pad") == 0)
            s = want_int(c, k, v, 0, 1 << 16, &L->pad);
        else if (strcmp(k, "groups") == 0)
            s = want_int(c, k, v, 1, 1 << 20, &L->groups);
        else if (strcmp(k, "group_size") == 0)
            s = want_int(c, k, v, 1, 1 << 20, &L->group_size);
        else if (strcmp(k, "tie") == 0) {
            s = want_int(c, k, v, 0, 1 << 24, &L->tie);
            L->tie++;
        } else if (strcmp(k, "heads") == 0)
            s = want_int(c, k, v, 1, 1 << 16, &L->heads);
        else if (strcmp(k, "kv_heads") == 0)
            s = want_int(c, k, v, 1, 1 << 16, &L->kv_heads);
        else if (strcmp(k, "rope_theta") == 0) {
            double d;
            if (!parse_float(v, &d) || d < 0 || d > 1e12)
                s = rp_fail(c->err, RP_ERR_PARSE,
                            "%s:%d: rope_theta: '%s' is not a number in [0, 1e12] (0: no rotary "
                            "embeddings)",
                            c->name, c->line, v);
            else
                L->rope_theta = (float)d;
        }
        else if (strcmp(k, "mlp") == 0)
            s = want_int(c, k, v, 1, 64, &L->mlp);
        else if (strcmp(k, "gelu") == 0) {
            if (strcmp(v, "tanh") == 0 || strcmp(v, "erf") == 0)
                L->gelu_erf = v[0] == 'e';
            else
                s = rp_fail(c->err, RP_ERR_PARSE, "%s:%d: gelu: '%s' is not tanh or erf",
                            c->name, c->line, v);
        }
        else if (strcmp(k, "bias") == 0) {
            if (strcmp(v, "true") == 0)
                L->bias = true;
            else if (strcmp(v, "false") == 0)
                L->bias = false;
            else
                s = rp_fail(c->err, RP_ERR_PARSE, "%s:%d: bias: '%s' is not true or false",
                            c->name, c->line, v);
        } else if (strcmp(k, "std") == 0) {
            double d;
            if (!parse_float(v, &d) || !(d > 0) || d > 1e3)
                s = rp_fail(c->err, RP_ERR_PARSE, "%s:%d: std: '%s' is not a number in (0, 1000]",
                            c->name, c->line, v);
            else
                L->std = (float)d;
        } else if (strcmp(k, "momentum") == 0) {
            double d;
            if (!parse_float(v, &d) || !(d > 0) || d > 1)
                s = rp_fail(c->err, RP_ERR_PARSE, "%s:%d: momentum: '%s' is not a number in (0, 1]",
                            c->name, c->line, v);
            else
                L->momentum = (float)d;
        } else if (strcmp(k, "eps") == 0 || strcmp(k, "p") == 0 || strcmp(k, "dropout") == 0) {
            double d;
            bool is_p = k[0] != 'e';
            if (!parse_float(v, &d) || (is_p ? (d < 0 || d >= 1) : d <= 0))
                s = rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s: '%s' is not a number %s", c->name,
                            c->line, k, v, is_p ? "in [0, 1)" : "> 0");
            else if (is_p)
                L->p = (float)d;
            else
                L->eps = (float)d;
        }
        if (s)
            return s;
    }
    return RP_OK;
}

/* Positional arguments (before the options) of a layer line. */
static int positional(const words *w) {
    int n = 1;
    while (n < w->n && !strchr(w->w[n], '='))
        n++;
    return n - 1;
}

static rp_status parse_layer(pctx *c, words *w, rp_layer *L) {
    static const struct {
        const char *name;
        rp_layer_type type;
        int args; /* positional arguments */
        const char *options;
    } kinds[] = {
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
    };
    int k = 0, nk = (int)(sizeof kinds / sizeof kinds[0]);
    while (k < nk && strcmp(kinds[k].name, w->w[0]) != 0)
        k++;
    if (k == nk) {
        const char *names[32];
        for (int i = 0; i < nk; i++)
            names[i] = kinds[i].name;
        const char *hint = rp_closest_word(w->w[0], names, nk);
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: unknown layer '%s'%s%s%s", c->name, c->line,
                       w->w[0], hint ? " (did you mean '" : "", hint ? hint : "",
                       hint ? "'?)" : "");
    }
    L->type = kinds[k].type;
    L->line = c->line;
    L->bias = true;
    L->eps = 1e-5f;
    L->stride = 0;
    L->mlp = 4;
    L->std = 1;
    L->groups = 1;
    L->momentum = 0.1f;
    if (L->type == RP_LAYER_RMSNORM)
        L->eps = 1e-6f; /* LLaMA's */
    int npos = positional(w);
    int want = kinds[k].args;
    if (want >= 0 && npos != want)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s takes %d argument%s before its options, not %d",
                       c->name, c->line, kinds[k].name, want, want == 1 ? "" : "s", npos);
    rp_status s = RP_OK;
    switch (L->type) {
    case RP_LAYER_LINEAR:
        s = want_int(c, "output features", w->w[1], 1, 1 << 24, &L->units);
        break;
    case RP_LAYER_CONV2D:
        s = want_int(c, "output channels", w->w[1], 1, 1 << 20, &L->units);
        break;
    case RP_LAYER_MAXPOOL2D:
    case RP_LAYER_AVGPOOL2D:
        s = want_int(c, "kernel size", w->w[1], 1, 1 << 16, &L->kernel);
        break;
    case RP_LAYER_ADAPTIVE_AVGPOOL2D: /* the output's height and width, 1 unless given */
        if (npos > 1)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: adaptive_avgpool2d takes one output size",
                           c->name, c->line);
        L->units = 1;
        if (npos == 1)
            s = want_int(c, "output size", w->w[1], 1, 1 << 16, &L->units);
        break;
    case RP_LAYER_EMBEDDING:
        s = want_int(c, "vocabulary size", w->w[1], 1, 1 << 28, &L->vocab);
        if (!s)
            s = want_int(c, "embedding size", w->w[2], 1, 1 << 20, &L->dim);
        break;
    case RP_LAYER_DROPOUT:
        if (npos > 1)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: dropout takes one probability", c->name,
                           c->line);
        if (npos == 1) {
            double d;
            if (!parse_float(w->w[1], &d) || d < 0 || d >= 1)
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
    if (s)
        return s;
    s = apply_options(c, L, w, 1 + npos, kinds[k].options);
    if (s)
        return s;
    if (L->type == RP_LAYER_CONV2D && L->kernel == 0)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: conv2d needs kernel=K", c->name, c->line);
    if (L->type == RP_LAYER_ATTENTION && L->heads == 0)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: attention needs heads=H", c->name, c->line);
    if (L->type == RP_LAYER_ATTENTION && L->kv_heads == 0)
        L->kv_heads = L->heads;
    if (L->type == RP_LAYER_TRANSFORMER_BLOCK && L->heads == 0)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: transformer_block needs heads=H", c->name,
                       c->line);
    if (L->stride == 0)
        L->stride = L->type == RP_LAYER_MAXPOOL2D || L->type == RP_LAYER_AVGPOOL2D ? L->kernel : 1;
    return RP_OK;
}


/* ---- the graph's words: "NAME = ..." before a layer, "< A B" after it ---- */

static bool is_name(const char *s) {
    if (!isalpha((unsigned char)*s) && *s != '_')
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '.')
            return false;
    return true;
}

/* Takes a line's name and inputs out of its words. */
static rp_status graph_words(pctx *c, words *w, char **lname, char **ins, int *nin) {
    *lname = NULL;
    *nin = 0;
    if (w->n >= 2 && strcmp(w->w[1], "=") == 0) {
        if (!is_name(w->w[0]) || strlen(w->w[0]) >= RP_NAME_MAX)
            return rp_fail(c->err, RP_ERR_PARSE,
                           "%s:%d: '%s' is not a name (a letter or '_', then letters, digits, "
                           "'_' or '.', under %d characters)",
                           c->name, c->line, w->w[0], RP_NAME_MAX);
        if (w->n == 2)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: '%s =' names no layer", c->name, c->line,
                           w->w[0]);
        *lname = w->w[0];
        for (int i = 2; i < w->n; i++)
            w->w[i - 2] = w->w[i];
        w->n -= 2;
    } else if (strchr(w->w[0], '=')) {
        return rp_fail(c->err, RP_ERR_PARSE,
                       "%s:%d: '%s': a name is given with spaces around '=' ('b1 = conv2d ...')",
                       c->name, c->line, w->w[0]);
    }
    for (int i = 0; i < w->n; i++) {
        if (w->w[i][0] != '<')
            continue;
        if (i == 0)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: '<' comes after the layer", c->name,
                           c->line);
        int n = w->n;
        w->n = i;
        if (w->w[i][1])
            ins[(*nin)++] = w->w[i] + 1;
        for (int j = i + 1; j < n; j++) {
            if (*nin == RP_MAX_INPUTS)
                return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: more than %d inputs", c->name,
                               c->line, RP_MAX_INPUTS);
            ins[(*nin)++] = w->w[j];
        }
        if (*nin == 0)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: '<' names no input", c->name, c->line);
        break;
    }
    return RP_OK;
}

typedef struct named {
    char name[RP_NAME_MAX];
    int tensor, line;
} named;

/* The inputs of layer L (number l) from the names after its '<', or the
** line above. */
static rp_status resolve_inputs(pctx *c, rp_layer *L, int l, char **ins, int nin,
                                const named *names, int nnames) {
    bool multi = L->type == RP_LAYER_ADD || L->type == RP_LAYER_CONCAT || L->type == RP_LAYER_MUL;
    if (L->type == RP_LAYER_MUL && nin != 2)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: mul reads two inputs ('mul < a b'), not %d",
                       c->name, c->line, nin);
    if (nin == 0) {
        if (multi)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s needs two or more inputs ('%s < a b')",
                           c->name, c->line, rp_layer_name(L->type), rp_layer_name(L->type));
        L->num_inputs = 1;
        L->inputs[0] = l - 1;
        return RP_OK;
    }
    if (multi ? nin < 2 : nin != 1)
        return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: %s reads %s, not %d inputs", c->name,
                       c->line, rp_layer_name(L->type), multi ? "two or more" : "one input", nin);
    for (int i = 0; i < nin; i++) {
        int k = 0;
        while (k < nnames && strcmp(names[k].name, ins[i]) != 0)
            k++;
        if (k == nnames)
            return rp_fail(c->err, RP_ERR_PARSE,
                           "%s:%d: '%s' is not the name of an earlier line (names are defined "
                           "before they are read)",
                           c->name, c->line, ins[i]);
        L->inputs[i] = names[k].tensor;
    }
    L->num_inputs = nin;
    return RP_OK;
}

/* Adds a name for tensor t; a name is given once. */
static rp_status add_name(pctx *c, named **names, int *n, int *cap, const char *lname, int t) {
    for (int k = 0; k < *n; k++)
        if (strcmp((*names)[k].name, lname) == 0)
            return rp_fail(c->err, RP_ERR_PARSE, "%s:%d: the name '%s' is taken (line %d)",
                           c->name, c->line, lname, (*names)[k].line);
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        named *nn = realloc(*names, sizeof(named) * nc);
        if (!nn)
            return rp_fail(c->err, RP_ERR_NOMEM, "out of memory");
        *names = nn, *cap = nc;
    }
    named *e = &(*names)[(*n)++];
    snprintf(e->name, sizeof e->name, "%s", lname);
    e->tensor = t;
    e->line = c->line;
    return RP_OK;
}

rp_status rp_model_parse(rp_model **out, const char *text, size_t len, const char *name,
                         rp_error *err) {
    *out = NULL;
    rp_model *m = calloc(1, sizeof *m);
    char *buf = malloc(len + 1);
    int cap = 16;
    if (m) {
        m->layers = calloc(cap, sizeof(rp_layer));
        m->num_targets = 1;
    }
    if (!m || !buf || !m->layers) {
        free(buf);
        rp_model_free(m);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    memcpy(buf, text, len);
    buf[len] = '\0';
    rp_status s = RP_OK;
    pctx c = {name, 0, err};
    bool have_input = false;
    named *names = NULL;
    int nnames = 0, names_cap = 0;
    char *lname, *ins[RP_MAX_INPUTS];
    int nin;
    if (memchr(text, '\0', len)) {
        s = rp_fail(err, RP_ERR_PARSE, "%s: the file contains a NUL byte; not a model spec", name);
        goto done;
    }
    char *line = buf;
    while (line) {
        c.line++;
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        words w;
        split_words(line, &w);
        line = nl ? nl + 1 : NULL;
        if (w.n == 0)
            continue;
        if (w.n == 32) {
            s = rp_fail(err, RP_ERR_PARSE, "%s:%d: too many words on one line", name, c.line);
            goto done;
        }
        if ((s = graph_words(&c, &w, &lname, ins, &nin)))
            goto done;
        if (strcmp(w.w[0], "input") == 0) {
            if (nin) {
                s = rp_fail(err, RP_ERR_PARSE, "%s:%d: the input reads nothing", name, c.line);
                goto done;
            }
            if (have_input) {
                s = rp_fail(err, RP_ERR_PARSE, "%s:%d: a second 'input' line (a model has one)",
                            name, c.line);
                goto done;
            }
            if (m->num_layers) {
                s = rp_fail(err, RP_ERR_PARSE, "%s:%d: 'input' must come before the layers", name,
                            c.line);
                goto done;
            }
            if (w.n < 2 || w.n > 4) {
                s = rp_fail(err, RP_ERR_PARSE,
                            "%s:%d: input takes 1 to 3 dimensions (e.g. 'input 1 28 28')", name,
                            c.line);
                goto done;
            }
            m->input.ndim = w.n - 1;
            for (int i = 1; i < w.n; i++)
                if ((s = want_int(&c, "input dimension", w.w[i], 1, 1 << 24,
                                  &m->input.dim[i - 1])))
                    goto done;
            if (rp_shape_size(&m->input) > (1u << 28)) {
                s = rp_fail(err, RP_ERR_PARSE, "%s:%d: the input is too large", name, c.line);
                goto done;
            }
            /* "input" names it whatever else it is called */
            if ((s = add_name(&c, &names, &nnames, &names_cap, "input", -1)) ||
                (lname && strcmp(lname, "input") != 0 &&
                 (s = add_name(&c, &names, &nnames, &names_cap, lname, -1))))
                goto done;
            have_input = true;
            continue;
        }
        if (!have_input) {
            s = rp_fail(err, RP_ERR_PARSE,
                        "%s:%d: the first line must declare the input shape ('input 1 28 28')",
                        name, c.line);
            goto done;
        }
        if (m->num_layers == cap) {
            rp_layer *nl2 = realloc(m->layers, sizeof(rp_layer) * cap * 2);
            if (!nl2) {
                s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
                goto done;
            }
            memset(nl2 + cap, 0, sizeof(rp_layer) * cap);
            m->layers = nl2;
            cap *= 2;
        }
        rp_layer *L = &m->layers[m->num_layers];
        if (m->num_layers && m->layers[m->num_layers - 1].type == RP_LAYER_SOFTMAX_CE) {
            s = rp_fail(err, RP_ERR_INVALID,
                        "%s:%d: softmax_cross_entropy (line %d) must be the last layer", name,
                        c.line, m->layers[m->num_layers - 1].line);
            goto done;
        }
        if ((s = parse_layer(&c, &w, L)))
            goto done;
        if ((s = resolve_inputs(&c, L, m->num_layers, ins, nin, names, nnames)))
            goto done;
        if (lname && (s = add_name(&c, &names, &nnames, &names_cap, lname, m->num_layers)))
            goto done;
        L->in = *rp_model_tensor_shape(m, L->inputs[0]);
        if ((s = rpi_spec_infer(&c, L, m)))
            goto done;
        if (rp_shape_size(&L->out) > (1u << 28)) {
            s = rp_fail(err, RP_ERR_INVALID, "%s:%d: the layer's output is too large", name,
                        c.line);
            goto done;
        }
        m->num_layers++;
    }
    if (!have_input) {
        s = rp_fail(err, RP_ERR_PARSE, "%s: no 'input' line: the model is empty", name);
        goto done;
    }
    if (m->num_layers == 0) {
        s = rp_fail(err, RP_ERR_PARSE, "%s: the model has no layers", name);
        goto done;
    }
    if ((s = rpi_model_link(m, name, err)))
        goto done;
    s = rpi_spec_layout(m, err);
    if (!s && m->num_params > ((size_t)1 << 31))
        s = rp_fail(err, RP_ERR_INVALID, "%s: %zu parameters: more than 2^31 is not supported",
                    name, m->num_params);
done:
    free(buf);
    free(names);
    if (s) {
        rp_model_free(m);
        return s;
    }
    *out = m;
    return RP_OK;
}

rp_status rp_model_load(rp_model **out, const char *path, rp_error *err) {
    char *text;
    size_t len;
    rp_status s = rp_read_file(path, &text, &len, err);
    if (s)
        return s;
    s = rp_model_parse(out, text, len, path, err);
    free(text);
    return s;
}
