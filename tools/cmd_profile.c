/*
** repipe profile: measures a model's layers and writes PipeDream's graph.txt.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/util.h"
#include "cli.h"
#include "repipe/repipe.h"

enum {
    OPT_MODEL,
    OPT_MICRO_BATCH,
    OPT_REPEATS,
    OPT_OUT,
    OPT_ALONE,
    OPT_TRANSFORMER,
    OPT_DEVICE,
    OPT_CLUSTER,
    OPT_TENSOR_PARALLEL,
    OPT_TRANSFORMER_CONFIG,
    OPT_CONTEXT_PARALLEL,
    OPT_SEQUENCE_PARALLEL,
    OPT_RECOMPUTE,
    OPT_PRECISION,
    OPT_OVERLAP,
    OPT_EXPERT_PARALLEL,
    OPT_COUNT
};

static const cli_opt OPTS[] = {
    [OPT_MODEL] = {"model", 'm', "FILE", "model spec (required)"},
    [OPT_MICRO_BATCH] = {"micro-batch", 'b', "B", "rows per forward and backward [64; with --transformer, sequences: 1]"},
    [OPT_REPEATS] = {"repeats", 'r', "N", "timed runs per layer and whole passes; the median is kept [20]"},
    [OPT_OUT] = {"out", 'o', "FILE", "where to write the profile (required)"},
    [OPT_ALONE] = {"alone", 0, NULL, "time each layer alone on what it reads, not inside whole passes"},
    [OPT_TRANSFORMER] = {"transformer", 0, "SPEC", "no model: a transformer of this shape priced on a device, [PRESET,]layers=L,hidden=H,heads=A,seq=S,vocab=V[,kv_heads=G][,ffn=F][,mlp=gelu|swiglu][,norm=...][,position=...][,bias=...][,tied=0|1][,flash=0|1] ('repipe plan --help' lists the keys); with --transformer-config, keys over the file's"},
    [OPT_DEVICE] = {"device", 0, "NAME|FILE", "with --transformer: the device (a100-80gb, h100-80gb, h200-141gb, b200, v100-32gb, or a JSON file); with --cluster, in place of its nodes' devices"},
    [OPT_CLUSTER] = {"cluster", 0, "NAME|FILE", "with --transformer: the cluster, whose nodes' link the tensor groups' collectives take (dgx-a100, dgx-h100, dgx-h200, dgx-b200, or a JSON file) [the device's DGX]"},
    [OPT_TENSOR_PARALLEL] = {"tensor-parallel", 't', "T", "with --transformer: each node is one rank of a tensor group of T [1]"},
    [OPT_TRANSFORMER_CONFIG] = {"transformer-config", 0, "FILE", "no model: the shape of a Hugging Face config.json (GPT-2, LLaMA, Mistral, Qwen2, Qwen3, Mixtral, Qwen3-MoE, DeepSeek-V3)"},
    [OPT_CONTEXT_PARALLEL] = {"context-parallel", 0, "C", "with --transformer: ... and of a context group of C, a C-th of each sequence [1]"},
    [OPT_SEQUENCE_PARALLEL] = {"sequence-parallel", 0, "on|off", "with --transformer: the activations outside the products split over the tensor group too [off]"},
    [OPT_RECOMPUTE] = {"recompute", 0, "none|selective|full", "with --transformer: what is recomputed in the backward (full: the configuration's recompute_checkpoint_every_layer does it; the profile says what a block keeps then) [none]"},
    [OPT_PRECISION] = {"precision", 0, "bf16|fp8|fp32", "with --transformer: the products' precision (fp32: fp32 throughout, on a device with peak_fp32) [bf16]"},
    [OPT_OVERLAP] = {"overlap", 0, "on|off", "with --transformer: the tensor group's collectives behind its products, with sequence parallelism [on]"},
    [OPT_EXPERT_PARALLEL] = {"expert-parallel", 0, "E", "with --transformer, a mixture of experts: ... and of an expert group of E, holding an E-th of each layer's experts, its tokens exchanged by all-to-all [1]"},
    [OPT_COUNT] = {NULL, 0, NULL, NULL},
};

/* --transformer: the shape and run's options as the command line gave them. */
typedef struct xf_args {
    const char *spec, *config, *device, *cluster, *sequence_parallel, *recompute, *precision;
    const char *overlap, *out;
    long long b, t, cp, ep;
} xf_args;

static bool on_off(const cli_cmd *cmd, const char *opt, const char *w, bool *out) {
    if (w && strcmp(w, "on") != 0 && strcmp(w, "off") != 0) {
        cli_error(cmd, "--%s: '%s' is not 'on' or 'off'", opt, w);
        return false;
    }
    if (w)
        *out = strcmp(w, "on") == 0;
    return true;
}

/* The cluster whose devices price the profile: --cluster (its devices
** replaced by --device's where both are given), or --device's DGX, else a
** node of that device alone. */
static int pricing_cluster(const cli_cmd *cmd, const xf_args *a, rp_cluster *c) {
    rp_error err;
    if (a->cluster) {
        if (rp_cluster_get(a->cluster, c, &err)) {
            cli_error(cmd, "--cluster: %s", err.msg);
            return 1;
        }
        if (a->device && rp_device_get(a->device, &c->device, &err)) {
            cli_error(cmd, "--device: %s", err.msg);
            return 1;
        }
        return 0;
    }
    const char *dgx = strcmp(a->device, "a100-80gb") == 0    ? "dgx-a100"
                      : strcmp(a->device, "h100-80gb") == 0  ? "dgx-h100"
                      : strcmp(a->device, "h200-141gb") == 0 ? "dgx-h200"
                      : strcmp(a->device, "b200") == 0       ? "dgx-b200"
                                                             : NULL;
    if (dgx)
        return rp_cluster_get(dgx, c, &err) ? 1 : 0;
    memset(c, 0, sizeof *c);
    if (rp_device_get(a->device, &c->device, &err)) {
        cli_error(cmd, "--device: %s", err.msg);
        return 1;
    }
    if (a->t > 1 || a->cp > 1) {
        cli_error(cmd, "--tensor-parallel and --context-parallel on a device alone: give "
                       "--cluster, whose nodes' link their collectives take");
        return 2;
    }
    snprintf(c->name, sizeof c->name, "%s", c->device.name);
    c->per_node = 1, c->node_bandwidth = c->network_bandwidth = 1e9, c->latency = 1e-5;
    return 0;
}

static const char *const RECOMPUTES[] = {"none", "selective", "full", NULL};
static const char *const PRECISIONS[] = {"bf16", "fp8", "fp32", NULL};

/* The index of `word` among `words` (NULL-ended) in *k; false (said) when
** it is none of them. No word (NULL) is fine. */
static bool word_of(const cli_cmd *cmd, const char *opt, const char *word,
                    const char *const *words, int *k) {
    *k = 0;
    if (!word)
        return true;
    while (words[*k] && strcmp(word, words[*k]) != 0)
        (*k)++;
    if (words[*k])
        return true;
    cli_error(cmd, "--%s: '%s' is not %s, %s or %s", opt, word, words[0], words[1], words[2]);
    return false;
}

/* --transformer: the profile of a shape on a cluster's devices. */
static int transformer(const cli_cmd *cmd, const xf_args *a) {
    rp_error err;
    rp_transformer m;
    rp_cluster c;
    if (a->config) {
        char *unknown;
        if (rp_transformer_from_config(a->config, a->spec, &m, &unknown, &err)) {
            cli_error(cmd, "--transformer-config: %s", err.msg);
            return 1;
        }
        if (*unknown)
            fprintf(stderr, "repipe profile: note: %s: keys repipe does not know, not used: %s\n",
                    a->config, unknown);
        free(unknown);
    } else if (rp_transformer_parse(a->spec, &m, &err)) {
        cli_error(cmd, "--transformer: %s", err.msg);
        return 2;
    }
    if (!a->cluster && !a->device) {
        cli_error(cmd, "--transformer needs --device or --cluster");
        return 2;
    }
    int rc = pricing_cluster(cmd, a, &c);
    if (rc)
        return rc;
    rp_transformer_run r;
    int k;
    rp_transformer_run_default(&r);
    r.micro_batch = (int)a->b, r.tensor_parallel = (int)a->t, r.context_parallel = (int)a->cp;
    r.expert_parallel = (int)a->ep;
    if (!on_off(cmd, "sequence-parallel", a->sequence_parallel, &r.sequence_parallel) ||
        !on_off(cmd, "overlap", a->overlap, &r.overlap))
        return 2;
    if (!word_of(cmd, "recompute", a->recompute, RECOMPUTES, &k))
        return 2;
    r.recompute = a->recompute ? (rp_recompute)k : r.recompute;
    if (!word_of(cmd, "precision", a->precision, PRECISIONS, &k))
        return 2;
    r.precision = a->precision ? (rp_precision)k : r.precision;
    char *text;
    if (rp_transformer_profile(&m, &c, &r, &text, &err) ||
        rp_write_file_atomic(a->out, text, strlen(text), &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    free(text);
    printf("a transformer of %d layers (hidden %d, %d heads, sequences of %d, vocabulary %d) on "
           "%s of %s, micro-batches of %d, tensor groups of %d, context groups of %d: profile "
           "written to %s\n",
           m.layers, m.hidden, m.heads, m.seq, m.vocab, c.device.name, c.name, r.micro_batch,
           r.tensor_parallel, r.context_parallel, a->out);
    return 0;
}

/* What the command line asked for: a model to measure, or a shape (x). */
typedef struct profile_args {
    const char *model_path;
    long long batch, repeats;
    xf_args x;
    unsigned given; /* the options seen, by OPT_ */
    bool alone;
} profile_args;

/* Reads the options into a; -1 to go on, else the exit code. */
static int parse_options(const cli_cmd *cmd, int argc, char **argv, profile_args *a) {
    *a = (profile_args){.batch = 64, .repeats = 20, .x = {.t = 1, .cp = 1, .ep = 1}};
    xf_args *x = &a->x;
    bool help;
    const char *arg;
    for (int o; (o = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        if (o == -2)
            return help ? 0 : 2;
        a->given |= 1u << o;
        bool ok = true;
        switch (o) {
        case OPT_MICRO_BATCH: ok = cli_int("micro-batch", arg, 1, 1 << 20, &a->batch); break;
        case OPT_REPEATS: ok = cli_int("repeats", arg, 1, 100000, &a->repeats); break;
        case OPT_TENSOR_PARALLEL: ok = cli_int("tensor-parallel", arg, 1, 4096, &x->t); break;
        case OPT_CONTEXT_PARALLEL: ok = cli_int("context-parallel", arg, 1, 4096, &x->cp); break;
        case OPT_EXPERT_PARALLEL: ok = cli_int("expert-parallel", arg, 1, 1 << 16, &x->ep); break;
        case OPT_MODEL: a->model_path = arg; break;
        case OPT_OUT: x->out = arg; break;
        case OPT_ALONE: a->alone = true; break;
        case OPT_TRANSFORMER: x->spec = arg; break;
        case OPT_TRANSFORMER_CONFIG: x->config = arg; break;
        case OPT_DEVICE: x->device = arg; break;
        case OPT_CLUSTER: x->cluster = arg; break;
        case OPT_SEQUENCE_PARALLEL: x->sequence_parallel = arg; break;
        case OPT_RECOMPUTE: x->recompute = arg; break;
        case OPT_PRECISION: x->precision = arg; break;
        case OPT_OVERLAP: x->overlap = arg; break;
        }
        if (!ok)
            return 2;
    }
    return -1;
}

/* The first option given of `set` (an OPT_ mask), or -1. */
static int first_given(unsigned given, unsigned set) {
    for (int k = 0; k < OPT_COUNT; k++)
        if (given & set & (1u << k))
            return k;
    return -1;
}

/* A model measured here, layer by layer, and its profile written. */
static int measure(const cli_cmd *cmd, const profile_args *a) {
    const char *out = a->x.out;
    rp_error err;
    rp_model *m;
    rp_profile *p;
    if (rp_model_load(&m, a->model_path, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    int rc = 0;
    if ((a->alone ? rp_profile_measure_alone : rp_profile_measure)(
            m, (int)a->batch, (int)a->repeats, &p, &err) ||
        rp_profile_write(p, NULL, out, &err)) {
        cli_error(cmd, "%s", err.msg);
        rc = 1;
    } else {
        double total = 0;
        for (int i = 0; i < p->num_nodes; i++)
            total += p->nodes[i].forward_ms + p->nodes[i].backward_ms;
        printf("%d layers of %s measured on micro-batches of %lld (median of %lld runs): "
               "%.3f ms forward + backward in all\nprofile written to %s\n",
               m->num_layers, a->model_path, a->batch, a->repeats, total, out);
        rp_profile_free(p);
    }
    rp_model_free(m);
    return rc;
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    profile_args a;
    int rc = parse_options(cmd, argc, argv, &a);
    if (rc >= 0)
        return rc;
    unsigned measured = 1u << OPT_MODEL | 1u << OPT_REPEATS | 1u << OPT_ALONE;
    unsigned shaped = 1u << OPT_TRANSFORMER | 1u << OPT_TRANSFORMER_CONFIG | 1u << OPT_DEVICE |
                      1u << OPT_CLUSTER | 1u << OPT_TENSOR_PARALLEL |
                      1u << OPT_CONTEXT_PARALLEL | 1u << OPT_SEQUENCE_PARALLEL |
                      1u << OPT_RECOMPUTE | 1u << OPT_PRECISION | 1u << OPT_OVERLAP |
                      1u << OPT_EXPERT_PARALLEL;
    int k;
    if (a.given & (1u << OPT_TRANSFORMER | 1u << OPT_TRANSFORMER_CONFIG)) {
        if ((k = first_given(a.given, measured)) >= 0) {
            cli_error(cmd, "--%s measures a model; --transformer prices a shape: not both",
                      OPTS[k].name);
            return 2;
        }
        if (!a.x.out) {
            cli_error(cmd, "--out is required (see 'repipe profile --help')");
            return 2;
        }
        a.x.b = a.given & (1u << OPT_MICRO_BATCH) ? a.batch : 1;
        return transformer(cmd, &a.x);
    }
    if ((k = first_given(a.given, shaped)) >= 0) {
        cli_error(cmd, "--%s prices a transformer's shape: it needs --transformer",
                  OPTS[k].name);
        return 2;
    }
    if (!a.model_path || !a.x.out) {
        cli_error(cmd, "--model and --out are required (see 'repipe profile --help')");
        return 2;
    }
    return measure(cmd, &a);
}

const cli_cmd cmd_profile = {
    "profile",
    "measure a model's layers and write a profile for the planner",
    "--model FILE --out graph.txt [--micro-batch B] [--repeats N] [--alone] | --transformer SPEC "
    "| --transformer-config FILE, --device NAME | --cluster NAME [--micro-batch B] "
    "[--tensor-parallel T] [--context-parallel C] [...] --out graph.txt",
    "The profile is PipeDream's graph.txt: an Input source, then one node per\n"
    "layer with its median forward and backward time (ms), output bytes and\n"
    "parameter bytes, chained in order. Each layer is timed inside whole\n"
    "passes of the model, as a stage runs it (or alone, where the whole model\n"
    "would take over a quarter of the memory, or with --alone; the Input's\n"
    "description says which). 'repipe plan --profile graph.txt --config-out\n"
    "exec.json' turns it into an execution configuration. --transformer writes\n"
    "one without a model: a GPT-style transformer's embedding, blocks and head\n"
    "priced on a device (docs/simulate.md, \"Transformers on GPU clusters\").",
    OPTS,
    run,
};
