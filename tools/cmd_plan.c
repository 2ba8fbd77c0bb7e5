/*
** repipe plan: splits a profiled model over a machine hierarchy.
*/
#define _XOPEN_SOURCE 700 /* realpath */
#include <limits.h>
#include <math.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plan_print.h"
#include "plan_scale.h"
#include "plan_trainers.h"
#include "repipe/repipe.h"

enum {
    OPT_PROFILE,
    OPT_MACHINES,
    OPT_BANDWIDTH,
    OPT_MEMORY_SIZE,
    OPT_MEMORY_CONSTRAINT,
    OPT_STRAIGHT,
    OPT_FEWER_MACHINES,
    OPT_ACTIVATION_COMPRESSION,
    OPT_JSON,
    OPT_GRAPH_OUT,
    OPT_PIPEDREAM_CONF,
    OPT_CONFIG_OUT,
    OPT_BASE_CONFIG,
    OPT_SCHEDULE,
    OPT_MICRO_BATCHES,
    OPT_DEVICE_MEMORY,
    OPT_OBJECTIVE,
    OPT_GLOBAL_BATCH,
    OPT_PROFILE_BATCH,
    OPT_CORES,
    OPT_LATENCY,
    OPT_BACKEND,
    OPT_MIN_MICRO_BATCH,
    OPT_TENSOR_SPLIT,
    OPT_ARCH,
    OPT_EMIT,
    OPT_EMIT_OUT,
    OPT_PP,
    OPT_SCHEDULES,
    OPT_CLUSTER,
    OPT_DEVICES,
    OPT_TRANSFORMER,
    OPT_TP,
    OPT_MICRO_BATCH,
    OPT_RECOMPUTE,
};

static const cli_opt OPTS[] = {
    [OPT_PROFILE] = {"profile", 'f', "FILE", "per-layer profile in PipeDream's graph.txt format (required); again: the same model profiled at another micro-batch, for the engine objective"},
    [OPT_MACHINES] = {"machines", 'n', "N1 [N2 ...]", "machines per level, innermost first (required)"},
    [OPT_BANDWIDTH] = {"bandwidth", 'b', "B1 [B2 ...]", "bytes/s per level [1e9 each]"},
    [OPT_MEMORY_SIZE] = {"memory-size", 's', "BYTES", "memory per machine, for --memory-constraint [16e9] and the engine objective [no limit]"},
    [OPT_MEMORY_CONSTRAINT] = {"memory-constraint", 0, NULL, "reject stages whose stashed data exceed the memory size"},
    [OPT_STRAIGHT] = {"straight", 0, NULL, "a straight pipeline: no stage is replicated"},
    [OPT_FEWER_MACHINES] = {"fewer-machines", 0, NULL, "allow plans that leave machines unused"},
    [OPT_ACTIVATION_COMPRESSION] = {"activation-compression", 0, "RATIO", "bound stages by activation transfers, compressed by RATIO"},
    [OPT_JSON] = {"json", 0, "OUT", "write the plan as JSON to OUT, with the engine objective's rows when it runs ('-': standard output, the words then go to standard error)"},
    [OPT_GRAPH_OUT] = {"graph-out", 0, "FILE", "write the profile with the stage_id of every node"},
    [OPT_PIPEDREAM_CONF] = {"pipedream-conf", 0, "FILE", "write PipeDream's hybrid_conf.json"},
    [OPT_CONFIG_OUT] = {"config-out", 0, "FILE", "write the plan as an execution configuration (chain profiles)"},
    [OPT_BASE_CONFIG] = {"base-config", 0, "FILE", "keep this configuration's other settings and its samples per update"},
    [OPT_SCHEDULE] = {"schedule", 0, "gpipe|1f1b", "also predict repipe's engine running the plan with this schedule"},
    [OPT_MICRO_BATCHES] = {"micro-batches", 0, "M", "with --schedule: micro-batches per replica and update [8]"},
    [OPT_DEVICE_MEMORY] = {"device-memory", 0, "BYTES", "with --schedule: reject a plan whose workers need more [the base config's]"},
    [OPT_OBJECTIVE] = {"objective", 0, "engine|pipedream", "engine: the fastest synchronous run of repipe's engine [with --config-out]; pipedream: PipeDream's objective [otherwise]"},
    [OPT_GLOBAL_BATCH] = {"global-batch", 0, "N", "engine objective: samples per update [the base config's, else profile batch x machines]"},
    [OPT_PROFILE_BATCH] = {"profile-batch", 0, "B", "micro-batch the profile was measured on [the profile's, else the base config's micro_batch_size]"},
    [OPT_CORES] = {"cores", 0, "N", "engine objective: the workers share one machine's N cores, as 'repipe simulate --cores' [a core each]"},
    [OPT_LATENCY] = {"latency", 0, "S", "engine objective: seconds per message, as 'repipe simulate --latency' [2e-5]"},
    [OPT_BACKEND] = {"backend", 0, "local|mpi", "engine objective: mpi ranks poll while they wait, as 'repipe simulate --backend' [local]"},
    [OPT_MIN_MICRO_BATCH] = {"min-micro-batch", 0, "B", "engine objective: micro-batches of at least B samples (batchnorm normalises by a micro-batch's statistics) [1]"},
    [OPT_TENSOR_SPLIT] = {"tensor-split", 0, "MODEL", "engine objective: the profiled model; also try its attention and MLP split over tensor groups of 2, 4 and 8 workers inside a machine of the innermost level (tensor_parallel)"},
    [OPT_ARCH] = {"arch", 0, "NAME", "the architecture's name in PipeDream's commands (-a NAME, -n NamePartitioned) [the profile's directory for .../graph.txt, else its file name]"},
    [OPT_EMIT] = {"emit", 0, "torchtitan|megatron", "engine objective: the plan as that trainer's settings (a profile of repipe.torch.profile names its modules), or the best plan it can run, with both times"},
    [OPT_EMIT_OUT] = {"emit-out", 0, "FILE", "with --emit: also write the settings to FILE, one option a line (a schedule torchtitan reads from a CSV goes to FILE.schedule.csv)"},
    [OPT_PP] = {"pp", 0, "N", "engine objective: pipelines of N stages, or of N workers with two chunks each (the pipeline-parallel size, at most 8) [any]"},
    [OPT_SCHEDULES] = {"schedules", 0, "S1,S2,...", "engine objective: choose among these schedules only (1f1b, gpipe, zb-h1, zb-h2, zb-auto, interleaved-1f1b, zb-v, dualpipev) [all]"},
    [OPT_CLUSTER] = {"cluster", 0, "NAME|FILE", "plan a transformer on a cluster of devices (dgx-a100, dgx-h100, or a JSON file): with --devices, --global-batch, and --transformer or a --profile of 'repipe profile --transformer'"},
    [OPT_DEVICES] = {"devices", 0, "N", "with --cluster: the devices to use"},
    [OPT_TRANSFORMER] = {"transformer", 0, "SPEC", "with --cluster: the shape, layers=L,hidden=H,heads=A,seq=S,vocab=V[,ffn=F][,flash=1]"},
    [OPT_TP] = {"tp", 0, "T", "with --cluster: tensor groups of T [any of 1, 2, 4, 8]"},
    [OPT_MICRO_BATCH] = {"micro-batch", 0, "B", "with --cluster: micro-batches of B sequences [any of 1, 2, 4, 8]"},
    [OPT_RECOMPUTE] = {"recompute", 0, "on|off", "with --cluster: every block recomputed in its backward, or none [either, as it pays]"},
    {NULL, 0, NULL, NULL},
};

/* Whether hay holds needle (lower case), letters of either case alike. */
static bool holds_nocase(const char *hay, const char *needle) {
    for (; *hay; hay++) {
        size_t i = 0;
        while (needle[i] && hay[i] && tolower((unsigned char)hay[i]) == needle[i])
            i++;
        if (!needle[i])
            return true;
    }
    return false;
}

/* "1f1b,zb-h1": bit s set for each schedule named (the synchronous ones). */
static bool parse_schedules(const cli_cmd *cmd, const char *list, unsigned *out) {
    *out = 0;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        int s = 0;
        while (s < RP_SCHEDULE_PIPEDREAM &&
               !(strlen(rp_schedule_name((rp_schedule)s)) == n &&
                 strncmp(rp_schedule_name((rp_schedule)s), p, n) == 0))
            s++;
        if (s == RP_SCHEDULE_PIPEDREAM) {
            cli_error(cmd, "--schedules: '%.*s' is not one of 1f1b, gpipe, zb-h1, zb-h2, zb-auto, "
                           "interleaved-1f1b, zb-v, dualpipev", (int)n, p);
            return false;
        }
        *out |= 1u << s;
        p += n + (p[n] == ',');
    }
    if (!*out)
        cli_error(cmd, "--schedules: name one schedule or more");
    return *out != 0;
}

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

/* The plan run by repipe's engine: its time per update with the flush of
** the schedule (the bubble) and each stage's memory, written to out. */
static int engine_mode(const cli_cmd *cmd, const rp_plan *plan, const rp_profile *prof,
                       const char *base_config, const char *schedule, int M, double device_memory,
                       FILE *out) {
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
    /* and what each layer keeps, where the profile says */
    int *node = NULL;
    double *mem[5] = {0};
    rp_status st = rp_plan_to_config(plan, prof, &cfg, NULL, 0, &err);
    if (!st)
        st = rp_profile_layers(prof, &fw, &bw, &ob, &pb, &node, &L, &err);
    if (!st)
        st = rp_profile_memory(prof, node, L, mem, &err);
    rp_sim_options_memory(&opt, mem);
    if (st || rp_simulate(&cfg, fw, bw, ob, pb, L, &opt, &res, &err)) {
        cli_error(cmd, "%s", err.msg);
        goto done;
    }
    rp_derived d;
    rp_config_derive(&cfg, &d);
    fprintf(out, "\nrepipe's engine, %s with %d micro-batches per replica and update (micro-batches as "
           "profiled):\n",
           schedule, M);
    fprintf(out, "  predicted %.6f s per update, %.6f s per micro-batch (flush included; %.2fx the "
           "plan's steady-state time)\n",
           res.update_time, res.update_time / M,
           res.update_time / M / plan->pipeline_time);
    rc = 0;
    for (int s = 0; s < res.stages; s++) {
        bool over = device_memory > 0 && res.stage_bytes[s] > device_memory;
        fprintf(out, "  stage %d: a worker holds %.1f MB (parameters, gradients, activations in "
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
    free(fw), free(bw), free(ob), free(pb), free(node);
    for (int k = 0; k < 5; k++)
        free(mem[k]);
    return rc;
}

/* Prints one configuration's row of the comparison; false for a kind with no
** configuration (the legend under the table says why there can be none). */
static bool print_row(const char *what, const rp_autoplan_entry *e) {
    if (!e->found) {
        printf("  %-34s %s\n", what, "none (below)");
        return false;
    }
    rp_derived d;
    rp_config_derive(&e->cfg, &d);
    printf("  %-34s %7d %7d %9d %5d %-16s %11.4f s %11.0f", what,
           rp_config_devices(&e->cfg, &d), d.stages,
           e->cfg.micro_batch_size, e->cfg.gradient_accumulation_steps,
           rp_schedule_name(e->cfg.schedule), e->seconds, d.samples_per_update / e->seconds);
    if (e->cfg.tensor_parallel > 1) /* the third axis: workers = replicas x stages' x t */
        printf("  tensor groups of %d", e->cfg.tensor_parallel);
    if (e->cfg.workers_per_server > 0)
        printf("  summed per server of %d", e->cfg.workers_per_server);
    if (e->cfg.reduction_bucket_mb > 0)
        printf("  reduced in %g MB buckets", e->cfg.reduction_bucket_mb);
    printf("\n");
    return true;
}

/* The keys a plan sets, in words: what --config-out writes. */
static void print_keys(const rp_config *c) {
    printf("  replication_factor %d, micro_batch_size %d, gradient_accumulation_steps %d, "
           "schedule %s, layers_per_stage [",
           c->replication_factor, c->micro_batch_size, c->gradient_accumulation_steps,
           rp_schedule_name(c->schedule));
    for (int s = 0; s < c->layers_per_stage.count; s++)
        printf("%s%d", s ? ", " : "", c->layers_per_stage.layers[s]);
    printf("], stage_replication [");
    for (int s = 0; s < c->layers_per_stage.count; s++)
        printf("%s%d", s ? ", " : "", rp_config_stage_replicas(c, s));
    printf("], recompute_checkpoint_every_layer %s, replicated_tensor_sharding %s",
           c->recompute_checkpoint_every_layer ? "true" : "false",
           c->replicated_tensor_sharding ? "true" : "false");
    if (c->tensor_parallel > 1)
        printf(", tensor_parallel %d", c->tensor_parallel);
    if (c->workers_per_server > 0)
        printf(", workers_per_server %d", c->workers_per_server);
    if (c->reduction_bucket_mb > 0)
        printf(", reduction_bucket_mb %g", c->reduction_bucket_mb);
    if (rp_config_chunked(c))
        printf(", virtual_stages %d", c->virtual_stages);
    if (c->schedule == RP_SCHEDULE_ZB_AUTO)
        printf(", zb_pass_times [%.4g, %.4g, %.4g], zb_max_in_flight %d", c->zb_pass_times[0],
               c->zb_pass_times[1], c->zb_pass_times[2], c->zb_max_in_flight);
    printf("\n");
}

/* The mpirun line that puts the configuration's workers where the plan
** placed them: worker (rank) w on the machine w / M1 of the innermost level
** M1, which is where Open MPI's ppr mapping puts it when the hostfile lists
** the outer machines in order (docs/cluster.md). */
static void print_launch(const rp_config *c, const rp_plan_options *o, const char *config) {
    rp_derived d;
    rp_config_derive(c, &d);
    int ranks = rp_config_devices(c, &d); /* a rank holds a device's chunks */
    printf("\nlaunch it on MPI ranks (docs/cluster.md):\n  mpirun -np %d", ranks);
    if (o->num_levels > 1)
        printf(" --hostfile HOSTS --map-by ppr:%d:node", o->machines[0]);
    printf(" --bind-to core repipe train --model MODEL --config %s --backend mpi\n", config);
    if (o->num_levels > 1) {
        int hosts = (ranks + o->machines[0] - 1) / o->machines[0];
        printf("  HOSTS: the %d server%s in order, %d slots each; the same paths on each\n", hosts,
               hosts == 1 ? "" : "s", o->machines[0]);
    }
    /* the same ranks under torchrun: a server a node, the innermost level's
    ** machines its processes (rt.Pipeline numbers them as the engine does) */
    int nodes = o->num_levels > 1 ? (ranks + o->machines[0] - 1) / o->machines[0] : 1;
    int per = nodes > 1 ? o->machines[0] : ranks;
    printf("or with PyTorch (docs/python.md): rt.Pipeline(module, \"%s\", ...) in your "
           "script, over the module the profile came from, then\n  torchrun", config);
    if (nodes > 1)
        printf(" --nnodes %d --node-rank N --master-addr HOST0", nodes);
    printf(" --nproc-per-node %d YOUR_SCRIPT.py\n", per);
}

/* The engine objective: the fastest synchronous configuration beside one
** worker, data parallelism and PipeDream's plan run synchronously; with
** config_out, written (the engine's choice, or PipeDream's plan with a
** batch that feeds every stage replica when pipedream_out). */
static int engine_objective(const cli_cmd *cmd, const rp_profile *prof, const char *const *more,
                            int num_more, const rp_plan *plan,
                            const rp_plan_options *o, const char *base_config,
                            long long global_batch, long long profile_batch, double memory,
                            int cores, double latency, bool polling, long long min_micro,
                            const char *split_model, const char *config_out,
                            bool pipedream_out, const char *json, const plan_emit *emit,
                            int pp, unsigned schedules) {
    bool quiet = json && strcmp(json, "-") == 0; /* standard output carries the JSON */
    rp_config base;
    rp_error err;
    rp_config_default(&base);
    if (base_config && rp_config_load_file(&base, base_config, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    rp_autoplan_options ao;
    rp_autoplan_options_default(&ao);
    ao.num_levels = o->num_levels;
    memcpy(ao.machines, o->machines, sizeof o->machines);
    memcpy(ao.bandwidth, o->bandwidth, sizeof o->bandwidth);
    if (!profile_batch)
        profile_batch = rp_profile_micro_batch(prof);
    if (!profile_batch && base_config)
        profile_batch = base.micro_batch_size;
    if (!profile_batch) {
        cli_error(cmd, "the engine objective needs --profile-batch B, the micro-batch the profile "
                       "was measured on (profiles of 'repipe profile' say it), or a --base-config");
        return 2;
    }
    rp_derived d;
    rp_config_derive(&base, &d);
    ao.global_batch = global_batch             ? global_batch
                      : base_config            ? d.samples_per_update
                                               : profile_batch * plan->machines_available;
    ao.memory_size = memory > 0 ? memory : (double)base.device_memory;
    ao.cores = cores;
    ao.latency = latency;
    ao.polling = polling;
    ao.min_micro_batch = (int)min_micro;
    ao.pipeline_stages = pp;
    ao.schedules = schedules;
    /* batch normalisation of a micro-batch of one sample has nothing to
    ** normalise by where a plane is one value (train refuses it): a profile
    ** that names one plans micro-batches of 2 or more */
    for (int i = 0; i < prof->num_nodes && ao.min_micro_batch < 2; i++)
        if (prof->nodes[i].desc && holds_nocase(prof->nodes[i].desc, "batchnorm")) {
            ao.min_micro_batch = 2;
            printf("%s (line %d of the profile) normalises by a micro-batch's statistics: micro-batches "
                   "of 2 or more (--min-micro-batch)\n",
                   prof->nodes[i].id, prof->nodes[i].line);
        }
    unsigned char *split = NULL;
    if (split_model) {
        double *fw, *bw, *ob, *pb;
        int *node, L;
        if (rp_profile_layers(prof, &fw, &bw, &ob, &pb, &node, &L, &err)) {
            cli_error(cmd, "%s", err.msg);
            return 1;
        }
        free(fw), free(bw), free(ob), free(pb), free(node);
        if (!cli_tensor_split(cmd, split_model, L, 0, RP_TP_VOCAB, &split,
                              &ao.tensor_degrees))
            return 1;
        ao.tensor_split = split;
    }
    /* the profile, and those of the same model at other micro-batches */
    const rp_profile *profs[RP_AUTOPLAN_MAX_PROFILES] = {prof};
    double batches[RP_AUTOPLAN_MAX_PROFILES] = {(double)profile_batch};
    int np = 1, rc = 1;
    for (int k = 0; k < num_more; k++, np++) {
        rp_profile *q;
        if (rp_profile_read(&q, more[k], &err)) {
            cli_error(cmd, "%s", err.msg);
            goto done;
        }
        profs[np] = q;
        if (!(batches[np] = rp_profile_micro_batch(q))) {
            np++;
            cli_error(cmd, "%s: the profile does not say its micro-batch (write it with "
                           "'repipe profile')", more[k]);
            goto done;
        }
    }
    rp_autoplan r;
    if (rp_autoplan_compute(profs, batches, np, &base, plan, &ao, &r, &err)) {
        cli_error(cmd, "%s", err.msg);
        goto done;
    }
    const rp_config *c = &r.best.cfg;
    if (json) { /* the plan's JSON with the engine's comparison */
        char *text;
        if (rp_autoplan_to_json(&r, ao.global_batch, plan, prof, &text, &err)) {
            cli_error(cmd, "%s", err.msg);
            goto done;
        }
        bool ok = write_text(cmd, json, text);
        free(text);
        if (!ok)
            goto done;
    }
    if (quiet)
        goto write_config;
    printf("\nrepipe's engine, %lld samples per update (micro-batches as profiled: ",
           ao.global_batch);
    for (int k = 0; k < np; k++)
        printf("%s%.0f", k ? ", " : "", batches[k]);
    printf("), %d configurations simulated:\n", r.simulated);
    printf("  %-34s %7s %7s %9s %5s %-16s %13s %11s\n", "", "workers", "stages", "micro-b", "GA",
           "schedule", "per update", "samples/s");
    bool all = print_row("one worker", &r.single);
    all &= print_row("data parallel", &r.data_parallel);
    all &= print_row("PipeDream's plan, synchronous", &r.pipedream);
    all &= print_row("fastest pipeline under 1f1b", &r.pipeline_1f1b);
    all &= print_row("fastest pipeline, zero bubble", &r.pipeline_zero_bubble);
    all &= print_row("two chunks a worker", &r.pipeline_interleaved);
    if (split)
        all &= print_row("fastest with tensor groups", &r.tensor_parallel);
    all &= print_row("fastest for the engine", &r.best);
    if (!all) {
        printf("  none: no configuration of that kind runs here: each needs the workers and "
               "stages of its kind, and its replicas' micro-batches must split %lld samples an "
               "update evenly (1 to %d micro-batches a replica, of %d samples or more)",
               ao.global_batch, ao.max_accumulation, ao.min_micro_batch);
        if (ao.memory_size > 0)
            printf(", within --memory-size %.0f bytes a worker", ao.memory_size);
        printf("\n");
    }
    rp_config_derive(c, &d);
    if (d.stages == 1) {
        printf("data parallelism on %d of the %d workers is predicted fastest: every worker holds "
               "the whole model\n",
               d.workers, plan->machines_available);
    } else {
        if (rp_config_chunked(c))
            printf("a pipeline of %d chunks, %d on each of its %d workers (%s) on %d of the %d "
                   "machines",
                   d.stages, c->virtual_stages, d.stages / c->virtual_stages,
                   rp_schedule_name(c->schedule), rp_config_devices(c, &d),
                   plan->machines_available);
        else
            printf("a pipeline of %d stages on %d of the %d workers", d.stages, d.workers,
                   plan->machines_available);
        printf(", %d replica%s of it, is predicted fastest", c->replication_factor,
               c->replication_factor == 1 ? "" : "s");
        if (r.data_parallel.found) /* (data parallelism may not fit) */
            printf(": %.2fx data parallelism", r.data_parallel.seconds / r.best.seconds);
        printf("\n");
    }
    double *fw, *bw, *ob, *pb;
    int *node, L;
    if (!rp_profile_layers(prof, &fw, &bw, &ob, &pb, &node, &L, &err)) {
        for (int s = 0, l = 0; s < c->layers_per_stage.count; l += c->layers_per_stage.layers[s++]) {
            const char *a = prof->nodes[node[l]].desc;
            const char *b = prof->nodes[node[l + c->layers_per_stage.layers[s] - 1]].desc;
            int P = d.stages / c->virtual_stages, at = 0; /* chunked: the worker of chunk s */
            for (int r = 0; r < P; r++)
                for (int k = 0; k < c->virtual_stages; k++)
                    if (rp_config_chunk(c, P, r, k) == s)
                        at = r;
            int reps = rp_config_stage_replicas(c, s);
            if (rp_config_chunked(c)) {
                printf("  chunk %d: layers %d-%d (%.*s ... %.*s) on worker %d of each replica",
                       s, l, l + c->layers_per_stage.layers[s] - 1, plan_node_name_len(a), a,
                       plan_node_name_len(b), b, at);
                if (reps > 1) /* (its stage replicas: a device each, the micro-batches in turns) */
                    printf(", a worker of %d devices", reps);
                printf("\n");
            } else
                printf("  stage %d: layers %d-%d (%.*s ... %.*s) on %d worker%s per replica\n",
                       s, l, l + c->layers_per_stage.layers[s] - 1, plan_node_name_len(a), a,
                       plan_node_name_len(b), b, reps, reps == 1 ? "" : "s");
        }
        free(fw), free(bw), free(ob), free(pb), free(node);
    }
    print_keys(c);
    if (emit->on && plan_emit_trainer(cmd, emit, prof, profs, batches, np, &base, ao,
                                      pipedream_out ? &r.pipedream : &r.best, &r))
        goto done;
write_config:
    rc = 0;
    if (!config_out)
        goto done;
    const rp_autoplan_entry *e = pipedream_out ? &r.pipedream : &r.best;
    if (!e->found) {
        cli_error(cmd, "PipeDream's plan cannot run %lld samples per update with every stage "
                       "replica fed (GA a multiple of each stage's replication); try "
                       "--objective engine or another --global-batch",
                  ao.global_batch);
        rc = 1;
        goto done;
    }
    if (rp_config_save_file(&e->cfg, config_out, &err)) {
        cli_error(cmd, "%s", err.msg);
        rc = 1;
        goto done;
    }
    if (quiet)
        goto done;
    printf("\nexecution configuration written to %s%s%s, %s; it sets:\n", config_out,
           base_config ? ", based on " : "", base_config ? base_config : "",
           pipedream_out ? "PipeDream's plan" : "the engine's plan");
    print_keys(&e->cfg);
    print_launch(&e->cfg, o, config_out);
done:
    for (int k = 1; k < np; k++)
        rp_profile_free((rp_profile *)profs[k]);
    free(split);
    return rc;
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    rp_plan_options o;
    rp_plan_options_default(&o);
    const char *profile = NULL, *json = NULL, *graph_out = NULL, *conf = NULL;
    const char *config_out = NULL, *base_config = NULL, *schedule = NULL;
    const char *objective = NULL, *more[RP_AUTOPLAN_MAX_PROFILES], *split_model = NULL;
    const char *arch = NULL;
    int num_more = 0;
    plan_emit emit = {0};
    plan_scale scale = {0};
    long long devices = 0, tp = 0, micro = 0;
    int recompute = 0;
    long long pp = 0;
    unsigned schedules = 0;
    long long micro_batches = 8, global_batch = 0, profile_batch = 0, cores = 0, min_micro = 1;
    double latency = 2e-5;
    bool memory_given = false, polling = false;
    double device_memory = 0;
    int nbw = 0;
    bool help;
    const char *arg;
    for (int i; (i = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        if (i == -2)
            return help ? 0 : 2;
        const char *name = OPTS[i].name;
        int n;
        switch (i) {
        case OPT_PROFILE:
            if (!profile) {
                profile = arg;
            } else if (num_more < RP_AUTOPLAN_MAX_PROFILES - 1) {
                more[num_more++] = arg;
            } else {
                cli_error(cmd, "--profile: at most %d profiles", RP_AUTOPLAN_MAX_PROFILES);
                return 2;
            }
            break;
        case OPT_MACHINES:
            if ((n = cli_machines(cmd, arg, argc, argv, o.machines, RP_PLAN_MAX_LEVELS)) < 0)
                return 2;
            o.num_levels = n;
            break;
        case OPT_BANDWIDTH:
            if ((nbw = cli_double_list(name, arg, argc, argv, o.bandwidth, RP_PLAN_MAX_LEVELS)) < 0)
                return 2;
            break;
        case OPT_MEMORY_SIZE:
            memory_given = true;
            if (!cli_double(name, arg, &o.memory_size))
                return 2;
            break;
        case OPT_MEMORY_CONSTRAINT: o.memory_constraint = true; break;
        case OPT_STRAIGHT: o.straight = true; break;
        case OPT_FEWER_MACHINES: o.fewer_machines = true; break;
        case OPT_ACTIVATION_COMPRESSION:
            if (!cli_double(name, arg, &o.activation_compression))
                return 2;
            if (!(o.activation_compression > 0)) {
                cli_error(cmd, "--activation-compression must be > 0");
                return 2;
            }
            break;
        case OPT_JSON: json = arg; break;
        case OPT_GRAPH_OUT: graph_out = arg; break;
        case OPT_PIPEDREAM_CONF: conf = arg; break;
        case OPT_CONFIG_OUT: config_out = arg; break;
        case OPT_BASE_CONFIG: base_config = arg; break;
        case OPT_SCHEDULE:
            if (strcmp(arg, "gpipe") != 0 && strcmp(arg, "1f1b") != 0) {
                cli_error(cmd, "--schedule: '%s' is not 'gpipe' or '1f1b'", arg);
                return 2;
            }
            schedule = arg;
            break;
        case OPT_MICRO_BATCHES:
            if (!cli_int(name, arg, 1, 1 << 20, &micro_batches))
                return 2;
            break;
        case OPT_DEVICE_MEMORY:
            if (!cli_double(name, arg, &device_memory) || device_memory < 0)
                return 2;
            break;
        case OPT_OBJECTIVE:
            if (strcmp(arg, "engine") != 0 && strcmp(arg, "pipedream") != 0) {
                cli_error(cmd, "--objective: '%s' is not 'engine' or 'pipedream'", arg);
                return 2;
            }
            objective = arg;
            break;
        case OPT_GLOBAL_BATCH:
            if (!cli_int(name, arg, 1, 1LL << 40, &global_batch))
                return 2;
            break;
        case OPT_MIN_MICRO_BATCH:
            if (!cli_int(name, arg, 1, 1 << 30, &min_micro))
                return 2;
            break;
        case OPT_PROFILE_BATCH:
            if (!cli_int(name, arg, 1, 1 << 20, &profile_batch))
                return 2;
            break;
        case OPT_CORES:
            if (!cli_int(name, arg, 1, 1 << 20, &cores))
                return 2;
            break;
        case OPT_TENSOR_SPLIT:
            split_model = arg;
            break;
        case OPT_ARCH:
            arch = arg;
            break;
        case OPT_EMIT:
            if (strcmp(arg, "torchtitan") != 0 && strcmp(arg, "megatron") != 0) {
                cli_error(cmd, "--emit: '%s' is not 'torchtitan' or 'megatron'", arg);
                return 2;
            }
            emit.on = true;
            emit.trainer = arg[0] == 't' ? RP_TRAINER_TORCHTITAN : RP_TRAINER_MEGATRON;
            break;
        case OPT_EMIT_OUT: emit.out = arg; break;
        case OPT_CLUSTER: scale.cluster = arg; break;
        case OPT_RECOMPUTE:
            if (strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0) {
                cli_error(cmd, "--recompute: '%s' is not 'on' or 'off'", arg);
                return 2;
            }
            recompute = arg[1] == 'n' ? 1 : -1;
            break;
        case OPT_TRANSFORMER: scale.transformer = arg; break;
        case OPT_DEVICES:
            if (!cli_int(name, arg, 1, 1 << 24, &devices))
                return 2;
            break;
        case OPT_TP:
            if (!cli_int(name, arg, 1, 8, &tp))
                return 2;
            break;
        case OPT_MICRO_BATCH:
            if (!cli_int(name, arg, 1, 1 << 20, &micro))
                return 2;
            break;
        case OPT_SCHEDULES:
            if (!parse_schedules(cmd, arg, &schedules))
                return 2;
            break;
        case OPT_PP:
            if (!cli_int(name, arg, 1, RP_MAX_STAGES, &pp))
                return 2;
            break;
        case OPT_LATENCY:
            if (!cli_double(name, arg, &latency))
                return 2;
            if (latency < 0) {
                cli_error(cmd, "--latency takes seconds >= 0, not '%s'", arg);
                return 2;
            }
            break;
        case OPT_BACKEND:
            if (!cli_backend(cmd, arg, &polling))
                return 2;
            break;
        }
    }
    if (scale.cluster) { /* a transformer on a cluster of devices */
        rp_scale_options_default(&scale.o);
        scale.profile = profile, scale.json = json, scale.config_out = config_out;
        scale.o.devices = (int)devices, scale.o.global_batch = global_batch;
        scale.o.tensor_parallel = (int)tp, scale.o.pipeline_parallel = (int)pp;
        scale.o.micro_batch = (int)micro;
        scale.o.recompute = recompute;
        return plan_scale_run(cmd, &scale);
    }
    if (pp > 8) {
        cli_error(cmd, "--pp %lld: the engine objective plans pipelines of at most 8 stages "
                       "(with --cluster, any)", pp);
        return 2;
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
    if (emit.out && !emit.on) {
        cli_error(cmd, "--emit-out needs --emit torchtitan|megatron");
        rp_plan_free(plan);
        rp_profile_free(prof);
        return 2;
    }
    /* --emit and --pp are the engine objective's */
    bool engine = objective ? strcmp(objective, "engine") == 0
                            : config_out != NULL || emit.on || pp > 0 || schedules;
    if (json && !engine) { /* with the engine objective, written with its rows */
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
    /* with the JSON on standard output, words go to standard error */
    FILE *text_out = json && strcmp(json, "-") == 0 ? stderr : stdout;
    if (text_out == stdout) {
        /* the commands run elsewhere: the files they read by absolute paths */
        char gpath[PATH_MAX], cpath[PATH_MAX];
        const char *g = graph_out && realpath(graph_out, gpath) ? gpath : graph_out;
        const char *cf = conf && realpath(conf, cpath) ? cpath : conf;
        plan_print(plan, profile, prof);
        plan_print_pipedream(plan, arch ? arch : profile, g, cf,
                        profile_batch ? profile_batch : rp_profile_micro_batch(prof));
    }
    if (schedule && rc == 0)
        rc = engine_mode(cmd, plan, prof, base_config, schedule, (int)micro_batches,
                         device_memory, text_out);
    if (rc == 0 && (engine || config_out || emit.on)) {
        bool written = false;
        if (config_out && !engine) { /* PipeDream's stages: how they map onto the config */
            rp_config cfg;
            char explain[512];
            rp_config_default(&cfg);
            if (base_config && rp_config_load_file(&cfg, base_config, &err)) {
                cli_error(cmd, "%s", err.msg);
                rc = 1;
            } else if (rp_plan_to_config(plan, prof, &cfg, explain, sizeof explain, &err)) {
                cli_error(cmd, "%s", err.msg);
                rc = 1;
            } else {
                fprintf(text_out, "\n%s\n", explain);
            }
            /* without the micro-batch the profile was measured on, the engine's
            ** rows cannot be priced: PipeDream's stages alone, on the base's
            ** (or the default) micro-batch and accumulation; simulate says what
            ** it assumes when it meets this profile */
            if (rc == 0 && !profile_batch && !rp_profile_micro_batch(prof)) {
                if (rp_config_save_file(&cfg, config_out, &err)) {
                    cli_error(cmd, "%s", err.msg);
                    rc = 1;
                } else {
                    fprintf(text_out, "execution configuration written to %s with PipeDream's "
                            "stages and micro_batch_size %d (the profile does not say the "
                            "micro-batch it was measured on: --profile-batch B also prices the "
                            "synchronous run and sets B)\n", config_out, cfg.micro_batch_size);
                    print_launch(&cfg, &o, config_out);
                }
                written = true;
            }
        }
        if (rc == 0 && !written)
            rc = engine_objective(cmd, prof, more, num_more, plan, &o, base_config, global_batch,
                                  profile_batch,
                                  memory_given ? o.memory_size : 0, (int)cores, latency, polling,
                                  min_micro, split_model, config_out, !engine,
                                  engine ? json : NULL, &emit, (int)pp, schedules);
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
