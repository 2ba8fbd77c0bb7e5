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
#include "plan_engine.h"
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
    OPT_SPEED,
    OPT_TRANSFORMER_CONFIG,
    OPT_CP,
    OPT_VP,
    OPT_SEQUENCE_PARALLEL,
    OPT_SHARDING,
    OPT_PRECISION,
    OPT_OVERLAP,
    OPT_STAGES,
    OPT_COUNT
};

static const cli_opt OPTS[] = {
    [OPT_PROFILE] = {"profile", 'f', "FILE", "per-layer profile in PipeDream's graph.txt format (required); again: the same model profiled at another micro-batch, for the engine objective"},
    [OPT_MACHINES] = {"machines", 'n', "N1 [N2 ...]", "machines per level, innermost first (required)"},
    [OPT_BANDWIDTH] = {"bandwidth", 'b', "B1 [B2 ...]", "bytes/s per level [1e9 each]"},
    [OPT_MEMORY_SIZE] = {"memory-size", 's', "BYTES [B2 ...]", "memory per machine, for --memory-constraint [16e9] and the engine objective [no limit]; several: one for each machine of the outermost level (a server) or for every machine, as --speed (PipeDream's objective takes the least)"},
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
    [OPT_SCHEDULES] = {"schedules", 0, "S1,S2,...", "engine objective: choose among these schedules only (1f1b, gpipe, zb-h1, zb-h2, zb-auto, interleaved-1f1b, zb-v, dualpipev, dualpipe) [all but dualpipe, tried only where named]; with --cluster, among 1f1b, interleaved-1f1b and dualpipev [Megatron-LM's two]"},
    [OPT_CLUSTER] = {"cluster", 0, "NAME|FILE", "plan a transformer on a cluster of devices (dgx-a100, dgx-h100, dgx-h200, dgx-b200, or a JSON file): with --devices, --global-batch, and --transformer, --transformer-config or a --profile of 'repipe profile --transformer'"},
    [OPT_DEVICES] = {"devices", 0, "N", "with --cluster: the devices to use"},
    [OPT_TRANSFORMER] = {"transformer", 0, "SPEC", "with --cluster: the shape, [PRESET,]layers=L,hidden=H,heads=A,seq=S,vocab=V[,kv_heads=G][,ffn=F][,mlp=gelu|swiglu][,norm=layernorm|rmsnorm][,position=learned|rope][,bias=all|none|qkv][,tied=0|1][,flash=0|1] (presets: llama3-8b, llama3-70b, llama3-405b, llama2-7b, llama2-70b, gpt3-175b); with --transformer-config, keys that change the file's (seq=S)"},
    [OPT_TRANSFORMER_CONFIG] = {"transformer-config", 0, "FILE", "with --cluster: the shape from a Hugging Face config.json (GPT-2, LLaMA, Mistral, Qwen2)"},
    [OPT_TP] = {"tp", 0, "T", "with --cluster: tensor groups of T [any of 1, 2, 4, 8 that divide a node, the heads and the MLP]"},
    [OPT_CP] = {"cp", 0, "C", "with --cluster: context groups of C, each rank a C-th of every sequence (ring attention) [any of 1, 2, 4, ..., 64]"},
    [OPT_VP] = {"vp", 0, "V", "with --cluster: V chunks a pipeline rank (interleaved 1F1B; 1: 1F1B) [any]"},
    [OPT_MICRO_BATCH] = {"micro-batch", 0, "B", "with --cluster: micro-batches of B sequences [any of 1, 2, 4, 8]"},
    [OPT_RECOMPUTE] = {"recompute", 0, "none|selective|full", "with --cluster: recompute nothing, attention's core, or every block, in the backward (on: full, off: none) [any, as it pays]"},
    [OPT_SEQUENCE_PARALLEL] = {"sequence-parallel", 0, "on|off", "with --cluster: split the activations outside the products over the tensor group too [on wherever there is one]"},
    [OPT_SHARDING] = {"sharding", 0, "none|optimizer|fsdp", "with --cluster: the optimizer state sharded over the replicas (Megatron-LM's distributed optimizer), everything sharded (FSDP), or neither [optimizer or fsdp, wherever there are replicas]"},
    [OPT_PRECISION] = {"precision", 0, "bf16|fp8|fp32|any", "with --cluster: the products' precision (fp32: fp32 throughout, on a device with peak_fp32; any: bf16 or fp8) [bf16]"},
    [OPT_OVERLAP] = {"overlap", 0, "on|off", "with --cluster: communication behind compute where today's Megatron-LM hides it (the replicas' reduction during the last backward, the tensor group's with sequence parallelism); off: as Megatron-LM ran in 2021 [on]"},
    [OPT_SPEED] = {"speed", 0, "S1 [S2 ...]", "engine objective: devices of several kinds, a speed for each machine of the outermost level (a server) or for every machine, relative to the profile's device (0.5: takes twice as long); the plan is set beside the best one for equal devices [all 1]"},
    [OPT_STAGES] = {"stages", 0, "balanced|even", "with --cluster: the blocks cut to balance the stages' times (Megatron-LM's --pipeline-model-parallel-layout runs it), or split evenly, the embedding and the head beside them, as Megatron-LM does without a layout [balanced]"},
    [OPT_COUNT] = {NULL, 0, NULL, NULL},
};

/* "1f1b,zb-h1": bit s set for each schedule named (the synchronous ones;
** dualpipe, which doubles the replicas, only where named). */
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
                           "interleaved-1f1b, zb-v, dualpipev, dualpipe", (int)n, p);
            return false;
        }
        *out |= 1u << s;
        p += n + (p[n] == ',');
    }
    if (!*out)
        cli_error(cmd, "--schedules: name one schedule or more");
    return *out != 0;
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
    long long devices = 0, tp = 0, cp = 0, vp = 0, micro = 0;
    long long pp = 0;
    unsigned long long given = 0; /* the options seen, by OPT_ */
    unsigned schedules = 0;
    long long micro_batches = 8, global_batch = 0, profile_batch = 0, cores = 0, min_micro = 1;
    double latency = 2e-5;
    bool memory_given = false, polling = false;
    double device_memory = 0;
    static double speed_v[RP_PLAN_MAX_MACHINES], mem_v[RP_PLAN_MAX_MACHINES];
    double *speed = NULL, *memory = NULL;
    int nspeed = 0, nmem = 0;
    int nbw = 0;
    bool help;
    const char *arg;
    for (int i; (i = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        if (i == -2)
            return help ? 0 : 2;
        const char *name = OPTS[i].name;
        int n;
        given |= 1ull << i;
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
            if ((nmem = cli_double_list(name, arg, argc, argv, mem_v, RP_PLAN_MAX_MACHINES)) < 0)
                return 2;
            o.memory_size = mem_v[0];
            for (int k = 1; k < nmem; k++) /* PipeDream's objective: the least of them */
                o.memory_size = mem_v[k] < o.memory_size ? mem_v[k] : o.memory_size;
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
        case OPT_RECOMPUTE: scale.recompute = arg; break;
        case OPT_TRANSFORMER: scale.transformer = arg; break;
        case OPT_TRANSFORMER_CONFIG: scale.transformer_config = arg; break;
        case OPT_SEQUENCE_PARALLEL: scale.sequence_parallel = arg; break;
        case OPT_SHARDING: scale.sharding = arg; break;
        case OPT_PRECISION: scale.precision = arg; break;
        case OPT_OVERLAP: scale.overlap = arg; break;
        case OPT_STAGES: scale.stages = arg; break;
        case OPT_DEVICES:
            if (!cli_int(name, arg, 1, RP_SCALE_MAX_DEVICES, &devices))
                return 2;
            break;
        case OPT_TP:
            if (!cli_int(name, arg, 1, 4096, &tp))
                return 2;
            break;
        case OPT_CP:
            if (!cli_int(name, arg, 1, 4096, &cp))
                return 2;
            break;
        case OPT_VP:
            if (!cli_int(name, arg, 1, RP_MAX_STAGES, &vp))
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
        case OPT_SPEED:
            if ((nspeed = cli_double_list(name, arg, argc, argv, speed_v,
                                          RP_PLAN_MAX_MACHINES)) < 0)
                return 2;
            break;
        }
    }
    if (scale.cluster) { /* a transformer on a cluster of devices */
        static const int cluster_opts[] = {
            OPT_CLUSTER, OPT_DEVICES, OPT_TRANSFORMER, OPT_TRANSFORMER_CONFIG, OPT_PROFILE,
            OPT_TP, OPT_CP, OPT_VP, OPT_PP, OPT_MICRO_BATCH, OPT_RECOMPUTE,
            OPT_SEQUENCE_PARALLEL, OPT_SHARDING, OPT_PRECISION, OPT_OVERLAP, OPT_STAGES,
            OPT_GLOBAL_BATCH,
            OPT_SCHEDULES, OPT_JSON, OPT_CONFIG_OUT, OPT_EMIT, OPT_EMIT_OUT, OPT_MEMORY_SIZE};
        unsigned long long allowed = 0;
        for (size_t k = 0; k < sizeof cluster_opts / sizeof *cluster_opts; k++)
            allowed |= 1ull << cluster_opts[k];
        for (int k = 0; k < OPT_COUNT; k++)
            if (given & ~allowed & (1ull << k)) {
                cli_error(cmd, "--%s does not apply with --cluster (it plans from the model's "
                               "shape: see 'repipe plan --help')", OPTS[k].name);
                return 2;
            }
        if (nmem > 1) {
            cli_error(cmd, "--memory-size with --cluster: one size, every device's");
            return 2;
        }
        rp_scale_options_default(&scale.o);
        scale.profile = profile, scale.json = json, scale.config_out = config_out;
        scale.emit = &emit;
        scale.o.devices = (int)devices, scale.o.global_batch = global_batch;
        scale.o.tensor_parallel = (int)tp, scale.o.pipeline_parallel = (int)pp;
        scale.o.context_parallel = (int)cp, scale.o.virtual_stages = (int)vp;
        scale.o.micro_batch = (int)micro;
        scale.o.memory_bytes = memory_given ? mem_v[0] : 0;
        scale.o.schedules = schedules;
        unsigned known = 1u << RP_SCHEDULE_1F1B | 1u << RP_SCHEDULE_INTERLEAVED |
                         1u << RP_SCHEDULE_DUALPIPEV;
        if (schedules & ~known) {
            cli_error(cmd, "--schedules with --cluster: 1f1b, interleaved-1f1b and dualpipev "
                           "(the schedules a transformer's plan at scale chooses among)");
            return 2;
        }
        return plan_scale_run(cmd, &scale);
    }
    static const int scale_only[] = {OPT_DEVICES, OPT_TRANSFORMER, OPT_TRANSFORMER_CONFIG,
                                     OPT_TP, OPT_CP, OPT_VP, OPT_MICRO_BATCH, OPT_RECOMPUTE,
                                     OPT_SEQUENCE_PARALLEL, OPT_SHARDING, OPT_PRECISION,
                                     OPT_OVERLAP, OPT_STAGES};
    for (size_t k = 0; k < sizeof scale_only / sizeof *scale_only; k++)
        if (given & (1ull << scale_only[k])) {
            cli_error(cmd, "--%s plans a transformer on a cluster: it needs --cluster",
                      OPTS[scale_only[k]].name);
            return 2;
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
                            : config_out != NULL || emit.on || pp > 0 || schedules || nspeed;
    if ((nspeed && (!engine || !cli_per_machine(cmd, "speed", speed_v, nspeed, o.machines,
                                                o.num_levels, &speed))) ||
        (nmem > 1 && engine && !cli_per_machine(cmd, "memory-size", mem_v, nmem, o.machines,
                                                o.num_levels, &memory))) {
        if (nspeed && !engine)
            cli_error(cmd, "--speed plans with the engine objective, not PipeDream's");
        free(speed);
        rp_plan_free(plan);
        rp_profile_free(prof);
        return 2;
    }
    if (json && !engine) { /* with the engine objective, written with its rows */
        if (rp_plan_to_json(plan, prof, &text, &err) == RP_OK) {
            rc |= !plan_write_text(cmd, json, text);
            free(text);
        } else {
            cli_error(cmd, "%s", err.msg);
            rc = 1;
        }
    }
    if (conf) {
        if (rp_plan_pipedream_conf(plan, &text, &err) == RP_OK) {
            rc |= !plan_write_text(cmd, conf, text);
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
        rc = plan_engine_mode(cmd, plan, prof, base_config, schedule, (int)micro_batches,
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
                    plan_print_launch(&cfg, &o, config_out);
                }
                written = true;
            }
        }
        if (rc == 0 && !written)
            rc = plan_engine_run(cmd, &(plan_engine){
                .prof = prof, .more = more, .num_more = num_more, .plan = plan, .o = &o,
                .base_config = base_config, .global_batch = global_batch,
                .profile_batch = profile_batch, .memory = memory_given ? o.memory_size : 0,
                .cores = (int)cores, .latency = latency, .polling = polling,
                .min_micro = min_micro, .split_model = split_model, .config_out = config_out,
                .pipedream_out = !engine, .json = engine ? json : NULL, .emit = &emit,
                .pp = (int)pp, .schedules = schedules, .speed = speed, .device_memory = memory});
    }
    free(speed), free(memory);
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
