/*
** repipe plan: splits a profiled model over a machine hierarchy.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "repipe/repipe.h"

static const cli_opt OPTS[] = {
    {"profile", 'f', "FILE", "per-layer profile in PipeDream's graph.txt format (required)"},
    {"machines", 'n', "N1 [N2 ...]", "machines per level, innermost first (required)"},
    {"bandwidth", 'b', "B1 [B2 ...]", "bytes/s per level [1e9 each]"},
    {"memory-size", 's', "BYTES", "memory per machine, for --memory-constraint [16e9]"},
    {"memory-constraint", 0, NULL, "reject stages whose stashed data exceed the memory size"},
    {"straight", 0, NULL, "a straight pipeline: no stage is replicated"},
    {"fewer-machines", 0, NULL, "allow plans that leave machines unused"},
    {"activation-compression", 0, "RATIO", "bound stages by activation transfers, compressed by RATIO"},
    {"json", 0, "OUT", "write the plan as JSON to OUT ('-' for standard output)"},
    {"graph-out", 0, "FILE", "write the profile with the stage_id of every node"},
    {"pipedream-conf", 0, "FILE", "write PipeDream's hybrid_conf.json"},
    {"config-out", 0, "FILE", "write the plan as an execution configuration (chain profiles)"},
    {"base-config", 0, "FILE", "keep this configuration's other settings (--config-out), memory features (--schedule)"},
    {"schedule", 0, "gpipe|1f1b", "also predict repipe's engine running the plan with this schedule"},
    {"micro-batches", 0, "M", "with --schedule: micro-batches per replica and update [8]"},
    {"device-memory", 0, "BYTES", "with --schedule: reject a plan whose workers need more [the base config's]"},
    {NULL, 0, NULL, NULL},
};

static bool write_text(const cli_cmd *cmd, const char *path, const char *text) {
    if (strcmp(path, "-") == 0) {
        fputs(text, stdout);
        return true;
    }
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        cli_error(cmd, "%s: cannot write", path);
        return false;
    }
    return true;
}

/* "ranks 0–6 and 8–14": runs of consecutive ranks, joined in words. */
static void print_ranks(const rp_plan *p, int s) {
    int runs[4096][2], n = 0;
    for (int r = 0; r < p->num_workers; r++) {
        if (p->worker_stage[r] != s)
            continue;
        if (n && runs[n - 1][1] == r - 1)
            runs[n - 1][1] = r;
        else if (n < 4096) {
            runs[n][0] = runs[n][1] = r;
            n++;
        }
    }
    int count = p->stage_num_ranks[s];
    printf("  stage %d: %d worker%s \u2014 rank%s ", s, count, count == 1 ? "" : "s",
           count == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
        if (i)
            printf(i == n - 1 ? " and " : ", ");
        if (runs[i][0] == runs[i][1])
            printf("%d", runs[i][0]);
        else
            printf("%d\u2013%d", runs[i][0], runs[i][1]);
    }
    printf("\n");
}

static void print_plan(const rp_plan *p, const char *profile_path, const rp_profile *prof) {
    const rp_plan_options *o = &p->options;
    printf("profile   %s (%d nodes, %d states)\n", profile_path, prof->num_nodes,
           p->num_states);
    cli_print_machines(stdout, o->machines, o->bandwidth, o->num_levels);
    for (int l = 0; l < p->num_levels; l++) {
        const rp_plan_level *lv = &p->levels[l];
        printf("\nlevel %d: %d machine%s%s, %.3g GB/s\n", lv->level, lv->machines,
               lv->machines == 1 ? "" : "s", l ? " inside each of the level above" : "",
               lv->bandwidth / 1e9);
        printf("  %-6s %-12s %-14s %-12s %s\n", "stage", "states", "compute (s)",
               "replication", l ? "within" : "");
        for (int s = 0; s < lv->num_stages; s++) {
            const rp_plan_stage *ps = &lv->stages[s];
            char states[32];
            snprintf(states, sizeof states, "%d-%d", ps->start, ps->end);
            printf("  %-6d %-12s %-14.6f %-12d", s, states, ps->compute_time, ps->replication);
            if (ps->parent >= 0)
                printf(" stage %d above", ps->parent);
            printf("\n");
        }
    }
    printf("\nworkers (%d, replica-major; PipeDream's --stage_to_num_ranks ", p->num_workers);
    for (int s = 0; s < p->num_stages; s++)
        printf("%s%d", s ? "," : "", p->stage_num_ranks[s]);
    printf(")\n");
    for (int s = 0; s < p->num_stages; s++)
        print_ranks(p, s);
    if (p->machines_used < p->machines_available)
        printf("  %d machine%s left unused\n", p->machines_available - p->machines_used,
               p->machines_available - p->machines_used == 1 ? "" : "s");
    char dp[48];
    snprintf(dp, sizeof dp, "data parallel (%d)", p->machines_available);
    printf("\npredicted time per step\n");
    printf("  %-22s %.6f s\n", "one machine", p->single_stage_time);
    printf("  %-22s %.6f s  %.2fx one machine\n", dp, p->data_parallel_time,
           p->dp_speedup_vs_single);
    printf("  %-22s %.6f s  %.2fx one machine, %.2fx data parallel\n", "this plan",
           p->pipeline_time, p->speedup_vs_single, p->speedup_vs_dp);
}

/* The plan run by repipe's engine: its time per update with the flush of
** the schedule (the bubble) and each stage's memory. */
static int engine_mode(const cli_cmd *cmd, const rp_plan *plan, const rp_profile *prof,
                       const char *base_config, const char *schedule, int M, double device_memory) {
    rp_config cfg;
    rp_error err;
    rp_config_default(&cfg);
    if (base_config && rp_config_load_file(&cfg, base_config, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    cfg.gradient_accumulation_steps = M;
    cfg.schedule = strcmp(schedule, "gpipe") == 0 ? RP_SCHEDULE_GPIPE : RP_SCHEDULE_1F1B;
    if (device_memory == 0 && cfg.device_memory > 0) /* the base configuration's budget */
        device_memory = (double)cfg.device_memory;
    double *fw = NULL, *bw = NULL, *ob = NULL, *pb = NULL;
    int L = 0, rc = 1;
    rp_sim_result res = {0};
    /* the profile's times are per micro-batch as profiled: no rescaling;
    ** the workers sit on the plan's machines */
    rp_sim_options opt;
    rp_sim_options_default(&opt);
    opt.num_levels = plan->options.num_levels;
    memcpy(opt.machines, plan->options.machines, sizeof(int) * opt.num_levels);
    memcpy(opt.bandwidth, plan->options.bandwidth, sizeof(double) * opt.num_levels);
    if (rp_plan_to_config(plan, prof, &cfg, NULL, 0, &err) ||
        rp_profile_layers(prof, &fw, &bw, &ob, &pb, NULL, &L, &err) ||
        rp_simulate(&cfg, fw, bw, ob, pb, L, &opt, &res, &err)) {
        cli_error(cmd, "%s", err.msg);
        goto done;
    }
    rp_derived d;
    rp_config_derive(&cfg, &d);
    printf("\nrepipe's engine, %s with %d micro-batches per replica and update (micro-batches as "
           "profiled):\n",
           schedule, M);
    printf("  predicted %.6f s per update, %.6f s per micro-batch (flush included; %.2fx the "
           "plan's steady-state time)\n",
           res.update_time, res.update_time / M,
           res.update_time / M / plan->pipeline_time);
    rc = 0;
    for (int s = 0; s < res.stages; s++) {
        bool over = device_memory > 0 && res.stage_bytes[s] > device_memory;
        printf("  stage %d: a worker holds %.1f MB (parameters, gradients, activations in "
               "flight)%s\n",
               s, res.stage_bytes[s] / 1e6, over ? "  > device memory" : "");
        if (over)
            rc = 1;
    }
    if (rc)
        cli_error(cmd, "the plan needs more than --device-memory %.0f bytes on a worker; try "
                       "more machines, --memory-constraint, or fewer micro-batches with 1f1b",
                  device_memory);
done:
    rp_sim_result_free(&res);
    free(fw), free(bw), free(ob), free(pb);
    return rc;
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    rp_plan_options o;
    rp_plan_options_default(&o);
    const char *profile = NULL, *json = NULL, *graph_out = NULL, *conf = NULL;
    const char *config_out = NULL, *base_config = NULL, *schedule = NULL;
    long long micro_batches = 8;
    double device_memory = 0;
    double vals[RP_PLAN_MAX_LEVELS + 1];
    int nbw = 0;
    bool help;
    const char *arg;
    for (int i; (i = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        if (i == -2)
            return help ? 0 : 2;
        const char *name = OPTS[i].name;
        int n;
        switch (i) {
        case 0: profile = arg; break;
        case 1:
            if ((n = cli_machines(cmd, arg, argc, argv, o.machines, RP_PLAN_MAX_LEVELS)) < 0)
                return 2;
            o.num_levels = n;
            break;
        case 2:
            if ((n = cli_double_list(name, arg, argc, argv, vals, RP_PLAN_MAX_LEVELS)) < 0)
                return 2;
            for (int k = 0; k < n; k++)
                o.bandwidth[k] = vals[k];
            nbw = n;
            break;
        case 3:
            if (!cli_double(name, arg, &o.memory_size))
                return 2;
            break;
        case 4: o.memory_constraint = true; break;
        case 5: o.straight = true; break;
        case 6: o.fewer_machines = true; break;
        case 7:
            if (!cli_double(name, arg, &o.activation_compression))
                return 2;
            if (!(o.activation_compression > 0)) {
                cli_error(cmd, "--activation-compression must be > 0");
                return 2;
            }
            break;
        case 8: json = arg; break;
        case 9: graph_out = arg; break;
        case 10: conf = arg; break;
        case 11: config_out = arg; break;
        case 12: base_config = arg; break;
        case 13:
            if (strcmp(arg, "gpipe") != 0 && strcmp(arg, "1f1b") != 0) {
                cli_error(cmd, "--schedule: '%s' is not 'gpipe' or '1f1b'", arg);
                return 2;
            }
            schedule = arg;
            break;
        case 14:
            if (!cli_int(name, arg, 1, 1 << 20, &micro_batches))
                return 2;
            break;
        case 15:
            if (!cli_double(name, arg, &device_memory) || device_memory < 0)
                return 2;
            break;
        }
    }
    if (!profile || !o.num_levels) {
        cli_error(cmd, "--profile and --machines are required (see 'repipe plan --help')");
        return 2;
    }
    if (!cli_levels_match(cmd, o.num_levels, nbw))
        return 2;
    rp_error err;
    rp_profile *prof;
    if (rp_profile_read(&prof, profile, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    rp_plan *plan;
    if (rp_plan_compute(prof, &o, &plan, &err)) {
        cli_error(cmd, "%s: %s", profile, err.msg);
        rp_profile_free(prof);
        return 1;
    }
    int rc = 0;
    char *text;
    if (json) {
        if (rp_plan_to_json(plan, prof, &text, &err) == RP_OK) {
            rc |= !write_text(cmd, json, text);
            free(text);
        } else {
            cli_error(cmd, "%s", err.msg);
            rc = 1;
        }
    }
    if (conf) {
        if (rp_plan_pipedream_conf(plan, &text, &err) == RP_OK) {
            rc |= !write_text(cmd, conf, text);
            free(text);
        } else {
            cli_error(cmd, "%s", err.msg);
            rc = 1;
        }
    }
    if (graph_out && rp_profile_write(prof, plan->node_stage, graph_out, &err)) {
        cli_error(cmd, "%s", err.msg);
        rc = 1;
    }
    if (!json || strcmp(json, "-") != 0)
        print_plan(plan, profile, prof);
    if (schedule && rc == 0)
        rc = engine_mode(cmd, plan, prof, base_config, schedule, (int)micro_batches,
                         device_memory);
    if (config_out) {
        rp_config cfg;
        char explain[512];
        rp_config_default(&cfg);
        if ((base_config && rp_config_load_file(&cfg, base_config, &err)) ||
            rp_plan_to_config(plan, prof, &cfg, explain, sizeof explain, &err) ||
            rp_config_save_file(&cfg, config_out, &err)) {
            cli_error(cmd, "%s", err.msg);
            rc = 1;
        } else {
            printf("\nexecution configuration written to %s%s%s:\n  %s\n", config_out,
                   base_config ? ", based on " : "", base_config ? base_config : "", explain);
        }
    }
    rp_plan_free(plan);
    rp_profile_free(prof);
    return rc;
}

const cli_cmd cmd_plan = {
    "plan",
    "split a profiled model into pipeline stages and replicas over a machine hierarchy",
    "--profile FILE --machines N1 [N2 ...] [--bandwidth B1 [B2 ...]] [options]",
    "Level 1 is innermost: '--machines 8 2 --bandwidth 4.29e9 2.15e9' means 2 servers\n"
    "of 8 devices, 4.29 GB/s between devices of a server and 2.15 GB/s between\n"
    "servers. The objective and numbers are those of PipeDream's optimizer; see\n"
    "docs/planner.md for how to read the output.",
    OPTS,
    run,
};
