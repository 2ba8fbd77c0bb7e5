/*
** repipe profile: measures a model's layers and writes PipeDream's graph.txt.
*/
#include <stdlib.h>

#include "cli.h"
#include "repipe/repipe.h"

static const cli_opt OPTS[] = {
    {"model", 'm', "FILE", "model spec (required)"},
    {"micro-batch", 'b', "B", "rows per forward and backward [64]"},
    {"repeats", 'r', "N", "timed runs per layer and whole passes; the median is kept [20]"},
    {"out", 'o', "FILE", "where to write the profile (required)"},
    {"alone", 0, NULL, "time each layer alone on what it reads, not inside whole passes"},
    {NULL, 0, NULL, NULL},
};

static int run(const cli_cmd *cmd, int argc, char **argv) {
    const char *model_path = NULL, *out = NULL;
    long long batch = 64, repeats = 20;
    bool help, alone = false;
    const char *arg;
    for (int o; (o = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        if (o == -2)
            return help ? 0 : 2;
        if ((o == 1 && !cli_int("micro-batch", arg, 1, 1 << 20, &batch)) ||
            (o == 2 && !cli_int("repeats", arg, 1, 100000, &repeats)))
            return 2;
        if (o == 0)
            model_path = arg;
        if (o == 3)
            out = arg;
        if (o == 4)
            alone = true;
    }
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
    "--model FILE --out graph.txt [--micro-batch B] [--repeats N] [--alone]",
    "The profile is PipeDream's graph.txt: an Input source, then one node per\n"
    "layer with its median forward and backward time (ms), output bytes and\n"
    "parameter bytes, chained in order. Each layer is timed inside whole\n"
    "passes of the model, as a stage runs it (or alone, where the whole model\n"
    "would take over a quarter of the memory, or with --alone; the Input's\n"
    "description says which). 'repipe plan --profile graph.txt --config-out\n"
    "exec.json' turns it into an execution configuration.",
    OPTS,
    run,
};
