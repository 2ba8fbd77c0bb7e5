/*
** repipe plan --emit torchtitan|megatron: the engine objective's plan in
** the words of a trainer people already run. A plan the trainer cannot run
** (a replicated stage, a schedule it lacks, a cut it cannot make) is not
** bent into one it can: the reason is printed, the planner searches again
** over what the trainer expresses, and both predicted times stand side by
** side so that the cost of the restriction is plain.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/util.h"
#include "plan_trainers.h"

static void describe(const rp_autoplan_entry *e) {
    rp_derived d;
    rp_config_derive(&e->cfg, &d);
    int P = rp_config_chunked(&e->cfg) ? d.stages / e->cfg.virtual_stages : d.stages;
    printf("%.4f s per update: %d stage%s", e->seconds, d.stages, d.stages == 1 ? "" : "s");
    if (rp_config_chunked(&e->cfg))
        printf(" (%d chunks on each of %d ranks)", e->cfg.virtual_stages, P);
    printf(", %d replica%s, micro-batch %d x %d, %s", e->cfg.replication_factor,
           e->cfg.replication_factor == 1 ? "" : "s", e->cfg.micro_batch_size,
           e->cfg.gradient_accumulation_steps, rp_schedule_name(e->cfg.schedule));
    if (e->cfg.tensor_parallel > 1)
        printf(", tensor groups of %d", e->cfg.tensor_parallel);
    if (e->cfg.recompute_checkpoint_every_layer)
        printf(", recomputed");
    if (e->cfg.replicated_tensor_sharding)
        printf(", optimizer state sharded");
    if (e->cfg.workers_per_server > 0)
        printf(", summed per server of %d", e->cfg.workers_per_server);
    if (e->cfg.reduction_bucket_mb > 0)
        printf(", reduced in %g MB buckets", e->cfg.reduction_bucket_mb);
    printf("\n");
}

/* A value as the shell reads it: quoted where it holds anything but
** letters, digits and ._,:/=- */
static void shell_word(const char *w, size_t n) {
    bool plain = n > 0;
    for (size_t i = 0; i < n; i++)
        plain &= (w[i] >= 'a' && w[i] <= 'z') || (w[i] >= 'A' && w[i] <= 'Z') ||
                 (w[i] >= '0' && w[i] <= '9') || strchr("._,:/=-", w[i]) != NULL;
    printf(plain ? "%.*s" : "'%.*s'", (int)n, w);
}

/* The plan the trainer runs: repipe's where it can, else the fastest over
** what it expresses, said beside repipe's (*alt holds that search);
** NULL (said) when there is none. */
static const rp_autoplan_entry *plan_to_run(const cli_cmd *cmd, const plan_emit *e,
                                            const rp_profile *prof,
                                            const rp_profile *const *profs,
                                            const double *batches, int np,
                                            const rp_config *base, rp_autoplan_options *ao,
                                            const rp_autoplan_entry *want, rp_autoplan *alt) {
    const char *name = rp_trainer_name(e->trainer);
    rp_error err;
    char why[512];
    if (rp_trainer_runs(e->trainer, prof, &want->cfg, why, sizeof why)) {
        printf("  runs repipe's plan: ");
        describe(want);
        return want;
    }
    printf("  cannot run repipe's plan: %s\n", why);
    unsigned char *cuts;
    if (rp_trainer_restrict(e->trainer, prof, ao, &cuts, &err)) {
        cli_error(cmd, "%s", err.msg);
        return NULL;
    }
    rp_status st = rp_autoplan_compute(profs, batches, np, base, NULL, ao, alt, &err);
    free(cuts);
    if (st) {
        cli_error(cmd, "%s runs no plan on these machines: %s", name, err.msg);
        return NULL;
    }
    printf("  the fastest plan %s runs instead (the engine objective over what it "
           "expresses):\n", name);
    printf("    %-22s ", "repipe's plan");
    describe(want);
    printf("    %-22s ", name);
    describe(&alt->best);
    printf("    %s's plan takes %.2fx repipe's time per update\n", name,
           alt->best.seconds / want->seconds);
    return &alt->best;
}

/* torchtitan runs repipe's zero-bubble orders from a CSV of actions: one
** pipeline's (every replica runs the same). Its text in *text and the path
** the settings name in path (a file only where asked: without --emit-out
** the settings name the file --emit-out would write); *text NULL where
** none is needed. */
static rp_status schedule_csv(const plan_emit *e, const rp_config *c, char *path, size_t cap,
                              char **text, rp_error *err) {
    rp_derived d;
    rp_config_derive(c, &d);
    *text = NULL;
    if (e->trainer != RP_TRAINER_TORCHTITAN || d.stages < 2 ||
        (c->schedule != RP_SCHEDULE_ZB_H1 && c->schedule != RP_SCHEDULE_ZB_H2 &&
         c->schedule != RP_SCHEDULE_ZB_AUTO && c->schedule != RP_SCHEDULE_ZB_V))
        return RP_OK;
    snprintf(path, cap, "%s%s", e->out ? e->out : "SETTINGS", ".schedule.csv");
    rp_config one = *c;
    one.replication_factor = 1;
    one.tensor_parallel = 1;
    return rp_schedule_csv(&one, text, err);
}

/* --emit-out: the settings, the schedule, the configuration: all or none. */
static rp_status write_outputs(const plan_emit *e, const rp_config *c, const char *settings,
                               const char *csv_path, const char *csv_text, rp_error *err) {
    char cfg_path[4096], *cfg_text;
    snprintf(cfg_path, sizeof cfg_path, "%s.config.json", e->out);
    if (rp_config_to_json(c, &cfg_text, err))
        return RP_ERR_INVALID;
    const char *paths[3] = {e->out, cfg_path, csv_path};
    const char *texts[3] = {settings, cfg_text, csv_text};
    rp_status st = rp_write_files_atomic(csv_text ? 3 : 2, paths, texts, err);
    free(cfg_text);
    return st;
}

/* The launch line: the ranks on the machines of the innermost level, a
** node each, then the settings, an option and its values a line, each
** value as the shell reads it. */
static void print_launch(const plan_emit *e, const rp_config *c, const rp_autoplan_options *ao,
                         const char *settings) {
    rp_derived d;
    rp_config_derive(c, &d);
    int ranks = rp_config_devices(c, &d) * (c->tensor_parallel > 1 ? c->tensor_parallel : 1);
    int per_node = ao->num_levels > 1 && ranks > ao->machines[0] ? ao->machines[0] : ranks;
    char launch[96];
    if (per_node < ranks)
        snprintf(launch, sizeof launch, "--nnodes=%d --nproc_per_node=%d", ranks / per_node,
                 per_node);
    else
        snprintf(launch, sizeof launch, "--nproc_per_node=%d", ranks);
    if (e->trainer == RP_TRAINER_TORCHTITAN)
        printf("  on %d GPUs, with your model's --module and --config:\n"
               "    torchrun %s -m torchtitan.train --module MODULE --config CONFIG",
               ranks, launch);
    else
        printf("  on %d GPUs, with your model's own arguments (its sizes, data, optimizer):\n"
               "    torchrun %s pretrain_gpt.py MODEL-ARGUMENTS", ranks, launch);
    for (const char *line = settings; *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        printf(" \\\n      ");
        for (size_t i = 0; i < n;) { /* the option, then each value */
            size_t k = i;
            while (k < n && line[k] != ' ')
                k++;
            if (i)
                printf(" ");
            if (i == 0)
                printf("%.*s", (int)(k - i), line + i);
            else
                shell_word(line + i, k - i);
            i = k < n ? k + 1 : k;
        }
        line += n + (end != NULL);
    }
    printf("\n");
}

int plan_emit_trainer(const cli_cmd *cmd, const plan_emit *e, const rp_profile *prof,
                      const rp_profile *const *profs, const double *batches, int np,
                      const rp_config *base, rp_autoplan_options ao,
                      const rp_autoplan_entry *want, const rp_autoplan *r) {
    const char *name = rp_trainer_name(e->trainer);
    rp_autoplan alt;
    rp_error err;
    printf("\n%s\n", name);
    if (!want->found) {
        cli_error(cmd, "no plan to write for %s: %s", name,
                  want == &r->pipedream ? "PipeDream's plan does not run synchronously here"
                                        : "none was found");
        return 1;
    }
    const rp_autoplan_entry *use = plan_to_run(cmd, e, prof, profs, batches, np, base, &ao,
                                               want, &alt);
    if (!use)
        return 1;
    rp_config pipelines;
    rp_trainer_pipelines(&use->cfg, &pipelines);
    const rp_config *c = &pipelines;
    char csv_path[4096], *csv_text, *settings;
    if (schedule_csv(e, c, csv_path, sizeof csv_path, &csv_text, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    const char *csv = csv_text ? csv_path : NULL;
    fflush(stdout); /* (the words so far before any error) */
    if (rp_trainer_settings(e->trainer, prof, c, csv, &settings, &err)) {
        cli_error(cmd, "%s's settings cannot be written: %s", name, err.msg);
        free(csv_text);
        return 1;
    }
    rp_status st = e->out ? write_outputs(e, c, settings, csv_path, csv_text, &err) : RP_OK;
    free(csv_text);
    if (st) {
        cli_error(cmd, "%s (nothing written)", err.msg);
        free(settings);
        return 1;
    }
    print_launch(e, c, &ao, settings);
    if (csv && e->out)
        printf("  %s: the schedule, one rank a row (PyTorch's CSV of actions)\n", csv);
    else if (csv)
        printf("  (the schedule is a CSV of actions: --emit-out SETTINGS writes it to "
               "SETTINGS.schedule.csv)\n");
    if (e->out)
        printf("  %s: these settings, one option a line; %s.config.json: the plan as repipe's "
               "configuration\n", e->out, e->out);
    free(settings);
    return 0;
}
