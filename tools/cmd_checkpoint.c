/*
** repipe checkpoint show: what a checkpoint holds.
*/
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "repipe/repipe.h"

static const cli_opt OPTS[] = {
    {NULL, 0, NULL, NULL},
};

static size_t values(const rp_weights *w) {
    size_t n = 0;
    for (int i = 0; w && i < w->num_tensors; i++)
        n += rp_shape_size(&w->tensors[i].shape) * w->tensors[i].groups;
    return n;
}

static const char *optimizer_name(rp_optimizer_type t) {
    return t == RP_OPT_ADAM ? "adam" : t == RP_OPT_ADAMW ? "adamw" : "sgd";
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    bool help;
    const char *pos[3], *arg;
    int npos = 0;
    for (int o; (o = cli_next_arg(cmd, argc, argv, &arg, &help, pos, &npos, 2)) != -1;)
        if (o == -2)
            return help ? 0 : 2;
    if (npos != 2 || strcmp(pos[0], "show") != 0) {
        cli_error(cmd, "expected 'show DIR' or 'show FILE' (see 'repipe checkpoint --help')");
        return 2;
    }
    rp_checkpoint c;
    rp_error err;
    char path[4096], note[2048] = "";
    struct stat sb;
    rp_status st;
    if (stat(pos[1], &sb) == 0 && S_ISDIR(sb.st_mode)) {
        st = rp_checkpoint_latest(pos[1], &c, path, sizeof path, note, sizeof note, &err);
    } else {
        snprintf(path, sizeof path, "%s", pos[1]);
        st = rp_checkpoint_load(&c, path, &err);
    }
    if (note[0])
        fprintf(stderr, "warning: %s\n", note);
    if (st) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    rp_derived d;
    rp_config_derive(&c.config, &d);
    size_t wv = values(c.state.weights), ov = values(c.state.optimizer);
    printf("checkpoint %s\n", path);
    printf("  update              %lld (%lld optimizer steps, %lld skipped)\n", c.state.updates,
           c.state.steps, c.state.skipped);
    printf("  loss scale          %.10g (%d clean updates since it last changed)\n",
           c.state.loss_scale, c.state.clean);
    printf("  run                 %s\n", c.run[0] ? c.run : "(not named: an older file)");
    printf("  written from        %d worker%s, %d stage%s, %d replica%s", c.workers,
           c.workers == 1 ? "" : "s", c.stages, c.stages == 1 ? "" : "s",
           c.config.replication_factor, c.config.replication_factor == 1 ? "" : "s");
    if (c.config.tensor_parallel > 1) /* the state is whole: it resumes at any t */
        printf(", tensor groups of %d%s", c.config.tensor_parallel,
               c.config.vocab_parallel ? "" : " (vocabulary whole)");
    printf(", %s backend\n", c.backend);
    printf("  model               fingerprint %08x\n", c.model);
    printf("  training set        %lld samples\n", c.samples);
    printf("  samples per update  %lld, seed %llu, optimizer %s (lr %g)\n",
           d.samples_per_update, (unsigned long long)c.config.seed,
           optimizer_name(c.config.optimizer.type), c.config.optimizer.lr);
    printf("  weights             %d tensors, %zu values (%.2f MB)\n",
           c.state.weights->num_tensors, wv, wv * 4 / 1e6);
    printf("  optimizer state     %d tensors, %zu values (%.2f MB)\n",
           c.state.optimizer->num_tensors, ov, ov * 4 / 1e6);
    rp_checkpoint_free(&c);
    return 0;
}

const cli_cmd cmd_checkpoint = {
    "checkpoint",
    "show what a checkpoint holds",
    "show DIR|FILE",
    "DIR: the newest checkpoint of a --checkpoint-dir that loads (damaged ones are\n"
    "named and passed over). 'repipe weights show' and 'compare', and --load, read\n"
    "a checkpoint's weights directly.",
    OPTS,
    run,
};
