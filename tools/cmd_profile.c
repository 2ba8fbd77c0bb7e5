/*
** repipe profile: measures a model's layers and writes PipeDream's graph.txt.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/util.h"
#include "cli.h"
#include "repipe/repipe.h"

static const cli_opt OPTS[] = {
    {"model", 'm', "FILE", "model spec (required)"},
    {"micro-batch", 'b', "B", "rows per forward and backward [64]"},
    {"repeats", 'r', "N", "timed runs per layer and whole passes; the median is kept [20]"},
    {"out", 'o', "FILE", "where to write the profile (required)"},
    {"alone", 0, NULL, "time each layer alone on what it reads, not inside whole passes"},
    {"transformer", 0, "SPEC", "no model: a GPT-style transformer of this shape priced on a device, layers=L,hidden=H,heads=A,seq=S,vocab=V[,ffn=F][,flash=1]"},
    {"device", 0, "NAME|FILE", "with --transformer: the device (a100-80gb, h100-80gb, v100-32gb, or a JSON file)"},
    {"cluster", 0, "NAME|FILE", "with --transformer: the cluster, whose nodes' link the tensor groups' all-reduces take (dgx-a100, dgx-h100, or a JSON file) [the device's DGX]"},
    {"tensor-parallel", 't', "T", "with --transformer: each node is one rank of a tensor group of T [1]"},
    {NULL, 0, NULL, NULL},
};

/* --transformer: the profile of a shape on a cluster's devices. */
static int transformer(const cli_cmd *cmd, const char *spec, const char *device,
                       const char *cluster, int b, int t, const char *out) {
    rp_error err;
    rp_transformer m;
    rp_cluster c;
    if (rp_transformer_parse(spec, &m, &err)) {
        cli_error(cmd, "--transformer: %s", err.msg);
        return 2;
    }
    if (!cluster && !device) {
        cli_error(cmd, "--transformer needs --device or --cluster");
        return 2;
    }
    if (cluster) {
        if (rp_cluster_get(cluster, &c, &err)) {
            cli_error(cmd, "--cluster: %s", err.msg);
            return 1;
        }
    } else {
        /* a device alone: the DGX of it, else a node of its own (no group
        ** to all-reduce over) */
        const char *dgx = strcmp(device, "a100-80gb") == 0   ? "dgx-a100"
                          : strcmp(device, "h100-80gb") == 0 ? "dgx-h100"
                                                             : NULL;
        if (dgx) {
            rp_cluster_get(dgx, &c, &err);
        } else {
            memset(&c, 0, sizeof c);
            if (rp_device_get(device, &c.device, &err)) {
                cli_error(cmd, "--device: %s", err.msg);
                return 1;
            }
            if (t > 1) {
                cli_error(cmd, "--tensor-parallel %d: give --cluster, whose nodes' link the "
                               "groups' all-reduces take", t);
                return 2;
            }
            snprintf(c.name, sizeof c.name, "%s", c.device.name);
            c.per_node = 1, c.node_bandwidth = c.network_bandwidth = 1e9, c.latency = 1e-5;
        }
    }
    char *text;
    if (rp_transformer_profile(&m, &c, b, t, &text, &err) ||
        rp_write_file_atomic(out, text, strlen(text), &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    free(text);
    printf("a transformer of %d layers (hidden %d, %d heads, sequences of %d, vocabulary %d) on "
           "%s, micro-batches of %d, tensor groups of %d: profile written to %s\n",
           m.layers, m.hidden, m.heads, m.seq, m.vocab, c.device.name, b, t, out);
    return 0;
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    const char *model_path = NULL, *out = NULL, *spec = NULL, *device = NULL, *cluster = NULL;
    long long batch = 64, repeats = 20, tp = 1;
    bool batch_given = false;
    bool help, alone = false;
    const char *arg;
    for (int o; (o = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        if (o == -2)
            return help ? 0 : 2;
        if ((o == 1 && !cli_int("micro-batch", arg, 1, 1 << 20, &batch)) ||
            (o == 2 && !cli_int("repeats", arg, 1, 100000, &repeats)) ||
            (o == 8 && !cli_int("tensor-parallel", arg, 1, 4096, &tp)))
            return 2;
        batch_given |= o == 1;
        if (o == 5)
            spec = arg;
        if (o == 6)
            device = arg;
        if (o == 7)
            cluster = arg;
        if (o == 0)
            model_path = arg;
        if (o == 3)
            out = arg;
        if (o == 4)
            alone = true;
    }
    if (spec && out && !model_path)
        return transformer(cmd, spec, device, cluster, batch_given ? (int)batch : 1, (int)tp,
                           out);
    if (!model_path || !out) {
        cli_error(cmd, "--model and --out are required (see 'repipe profile --help')");
        return 2;
    }
    rp_error err;
    rp_model *m;
    rp_profile *p;
    if (rp_model_load(&m, model_path, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    int rc = 0;
    if ((alone ? rp_profile_measure_alone : rp_profile_measure)(m, (int)batch, (int)repeats, &p,
                                                                 &err) ||
        rp_profile_write(p, NULL, out, &err)) {
        cli_error(cmd, "%s", err.msg);
        rc = 1;
    } else {
        double total = 0;
        for (int i = 0; i < p->num_nodes; i++)
            total += p->nodes[i].forward_ms + p->nodes[i].backward_ms;
        printf("%d layers of %s measured on micro-batches of %lld (median of %lld runs): "
               "%.3f ms forward + backward in all\nprofile written to %s\n",
               m->num_layers, model_path, batch, repeats, total, out);
        rp_profile_free(p);
    }
    rp_model_free(m);
    return rc;
}

const cli_cmd cmd_profile = {
    "profile",
    "measure a model's layers and write a profile for the planner",
    "--model FILE --out graph.txt [--micro-batch B] [--repeats N] [--alone] | --transformer SPEC "
    "--device NAME [--cluster NAME] [--micro-batch B] [--tensor-parallel T] --out graph.txt",
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
