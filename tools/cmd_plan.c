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
    OPT_EP,
    OPT_ETP,
    OPT_CAPACITY,
    OPT_COUNT
};

static const cli_opt OPTS[] = {
    [OPT_PROFILE] = {"profile", 'f', "FILE", "per-layer profile in PipeDream's graph.txt format (required); again: the same model profiled at another micro-batch, for the engine objective"},
    [OPT_MACHINES] = {"machines", 'n', "N1 [N2 ...]", "machines per level, innermost first (required)"},
    [OPT_BANDWIDTH] = {"bandwidth", 'b', "B1 [B2 ...]", "bytes/s per level [1e9 each]"},
    [OPT_MEMORY_SIZE] = {"memory-size", 's', "BYTES [B2 ...]", "memory per machine, for --memory-constraint [16e9] and the engine objective [no limit]; several: one for each machine of the outermost level (a server) or for every machine, as --speed (PipeDream's objective takes the least)"},
    [OPT_MEMORY_CONSTRAINT] = {"memory-constraint", 0, NULL, "reject stages whose stashed data exceed the memory size"},
    [OPT_STRAIGHT] = {"straight", 0, NULL, "a straight pipeline: no stage is replicated (engine objective: only whole pipelines are)"},
    [OPT_FEWER_MACHINES] = {"fewer-machines", 0, NULL, "allow plans that leave machines unused"},
    [OPT_ACTIVATION_COMPRESSION] = {"activation-compression", 0, "RATIO", "bound stages by activation transfers, compressed by RATIO"},
    [OPT_JSON] = {"json", 0, "OUT", "write the plan as JSON to OUT, with the engine objective's rows when it runs ('-': standard output, the words then go to standard error)"},
    [OPT_GRAPH_OUT] = {"graph-out", 0, "FILE", "write the profile with the stage_id of every node"},
    [OPT_PIPEDREAM_CONF] = {"pipedream-conf", 0, "FILE", "write PipeDream's hybrid_conf.json"},
    [OPT_CONFIG_OUT] = {"config-out", 0, "FILE", "write the plan as an execution configuration (chain profiles)"},
    [OPT_BASE_CONFIG] = {"base-config", 0, "FILE", "keep this configuration's other settings and its samples per update"},
    [OPT_SCHEDULE] = {"schedule", 0, "gpipe|1f1b", "also predict repipe's engine running the plan with this schedule"},
    [OPT_MICRO_BATCHES] = {"micro-batches", 0, "M", "with --schedule: micro-batches per replica and update [8]; with --cluster: micro-batches a pipeline and update (Galvatron's settle_chunk) [any]"},
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
    [OPT_TRANSFORMER] = {"transformer", 0, "SPEC", "with --cluster: the shape, [PRESET,]layers=L,hidden=H,heads=A,seq=S,vocab=V[,kv_heads=G][,ffn=F][,mlp=gelu|swiglu][,norm=layernorm|rmsnorm][,position=learned|rope][,bias=all|none|qkv][,tied=0|1][,flash=0|1][,qk_norm=0|1]; a mixture of experts: experts=E[,top_k=K][,moe_ffn=F][,shared_ffn=S][,moe_every=N][,dense_first=N]; latent attention: kv_lora=R[,q_lora=R][,rope_dim=D][,v_dim=D]; [,mtp=N] (presets: llama3-8b, llama3-70b, llama3-405b, llama2-7b, llama2-70b, gpt3-175b); with --transformer-config, keys that change the file's (seq=S)"},
    [OPT_TRANSFORMER_CONFIG] = {"transformer-config", 0, "FILE", "with --cluster: the shape from a Hugging Face config.json (GPT-2, LLaMA, Mistral, Qwen2, Qwen3, Mixtral, Qwen3-MoE, DeepSeek-V3)"},
    [OPT_TP] = {"tp", 0, "T", "with --cluster: tensor groups of T [any of 1, 2, 4, 8 that divide a node, the heads and the MLP]; engine objective: tensor groups of T only (1: none), from the profiles measured on a rank of one (tensor_parallel=T in the Input's description) or --tensor-split [any]"},
    [OPT_CP] = {"cp", 0, "C", "with --cluster: context groups of C, each rank a C-th of every sequence (ring attention) [any of 1, 2, 4, ..., 64]"},
    [OPT_EP] = {"ep", 0, "E", "with --cluster, a mixture of experts: expert groups of E, each rank an E-th of each layer's experts, tokens exchanged by all-to-all [any power of two that divides the experts and a stage's devices]"},
    [OPT_CAPACITY] = {"capacity", 0, "C", "with --cluster, a mixture of experts: each expert takes C times its share of the routed tokens, the rest dropped, its input padded to it (Megatron-LM's --moe-expert-capacity-factor with padding) [dropless]"},
    [OPT_ETP] = {"etp", 0, "T", "with --cluster, a mixture of experts: each expert's MLP split over T ranks [1]"},
    [OPT_VP] = {"vp", 0, "V", "with --cluster: V chunks a pipeline rank (interleaved 1F1B; 1: 1F1B) [any]"},
    [OPT_MICRO_BATCH] = {"micro-batch", 0, "B", "with --cluster: micro-batches of B sequences [any of 1, 2, 4, 8]; engine objective: of exactly B samples [any]"},
    [OPT_RECOMPUTE] = {"recompute", 0, "none|selective|full|blocks|layers", "with --cluster: recompute nothing, attention's core, every block, or the fewest first blocks of each stage that fit (Megatron-LM's --recompute-method block), in the backward (on: full, off: none) [any, as it pays]; with a profile (engine objective), where memory is short: layers, recomputation by layer (recompute_layers: each stage the least that fits, the layers that keep the most bytes for their forward's time first), then of every layer; full, of every layer only [layers]"},
    [OPT_SEQUENCE_PARALLEL] = {"sequence-parallel", 0, "on|off", "with --cluster: split the activations outside the products over the tensor group too [on wherever there is one]"},
    [OPT_SHARDING] = {"sharding", 0, "none|optimizer|fsdp", "with --cluster: the optimizer state sharded over the replicas (Megatron-LM's distributed optimizer), everything sharded (FSDP), or neither [optimizer or fsdp, wherever there are replicas]; engine objective: none or optimizer [optimizer, where memory is short]"},
    [OPT_PRECISION] = {"precision", 0, "bf16|fp8|fp32|any", "with --cluster: the products' precision (fp32: fp32 throughout, on a device with peak_fp32; any: bf16 or fp8) [bf16]"},
    [OPT_OVERLAP] = {"overlap", 0, "on|off", "with --cluster: communication behind compute where today's Megatron-LM hides it (the replicas' reduction during the last backward, the tensor group's with sequence parallelism); off: as Megatron-LM ran in 2021 [on]"},
    [OPT_SPEED] = {"speed", 0, "S1 [S2 ...]", "engine objective: devices of several kinds, a speed for each machine of the outermost level (a server) or for every machine, relative to the profile's device (0.5: takes twice as long); the plan is set beside the best one for equal devices [all 1]"},
    [OPT_STAGES] = {"stages", 0, "balanced|even", "with --cluster: the blocks cut to balance the stages' times, moved to later stages where that does not fit (Megatron-LM's --pipeline-model-parallel-layout runs it), or split evenly, the embedding and the head beside them, as Megatron-LM does without a layout [balanced]"},
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

/* What the command line asked for. */
typedef struct plan_args {
    rp_plan_options o;
    const char *profile, *json, *graph_out, *conf, *config_out, *base_config, *schedule;
    const char *objective, *more[RP_AUTOPLAN_MAX_PROFILES], *split_model, *arch;
    int num_more;
    plan_emit emit;
    plan_scale scale;
    long long devices, tp, cp, vp, micro, pp, ep, etp;
    unsigned long long given; /* the options seen, by OPT_ */
    unsigned schedules;
    long long micro_batches, global_batch, profile_batch, cores, min_micro;
    double latency, device_memory, capacity;
    bool memory_given, polling;
    double speed_v[RP_PLAN_MAX_MACHINES], mem_v[RP_PLAN_MAX_MACHINES];
    int nspeed, nmem, nbw;
} plan_args;

/* Where integer option i goes, and its bounds; NULL for other options. */
static long long *int_option(plan_args *a, int i, long long *lo, long long *hi) {
    *lo = 1;
    switch (i) {
    case OPT_MICRO_BATCHES: *hi = 1 << 20; return &a->micro_batches;
    case OPT_GLOBAL_BATCH: *hi = 1LL << 40; return &a->global_batch;
    case OPT_MIN_MICRO_BATCH: *hi = 1 << 30; return &a->min_micro;
    case OPT_PROFILE_BATCH: *hi = 1 << 20; return &a->profile_batch;
    case OPT_CORES: *hi = 1 << 20; return &a->cores;
    case OPT_DEVICES: *hi = RP_SCALE_MAX_DEVICES; return &a->devices;
    case OPT_TP: *hi = 4096; return &a->tp;
    case OPT_CP: *hi = 4096; return &a->cp;
    case OPT_EP: *hi = 1 << 16; return &a->ep;
    case OPT_ETP: *hi = 4096; return &a->etp;
    case OPT_VP: *hi = RP_MAX_STAGES; return &a->vp;
    case OPT_MICRO_BATCH: *hi = 1 << 20; return &a->micro;
    case OPT_PP: *hi = RP_MAX_STAGES; return &a->pp;
    }
    return NULL;
}

/* Where a string option goes, for those taken as they are; NULL for others. */
static const char **text_option(plan_args *a, int i) {
    switch (i) {
    case OPT_JSON: return &a->json;
    case OPT_GRAPH_OUT: return &a->graph_out;
    case OPT_PIPEDREAM_CONF: return &a->conf;
    case OPT_CONFIG_OUT: return &a->config_out;
    case OPT_BASE_CONFIG: return &a->base_config;
    case OPT_TENSOR_SPLIT: return &a->split_model;
    case OPT_ARCH: return &a->arch;
    case OPT_EMIT_OUT: return &a->emit.out;
    case OPT_CLUSTER: return &a->scale.cluster;
    case OPT_RECOMPUTE: return &a->scale.recompute;
    case OPT_TRANSFORMER: return &a->scale.transformer;
    case OPT_TRANSFORMER_CONFIG: return &a->scale.transformer_config;
    case OPT_SEQUENCE_PARALLEL: return &a->scale.sequence_parallel;
    case OPT_SHARDING: return &a->scale.sharding;
    case OPT_PRECISION: return &a->scale.precision;
    case OPT_OVERLAP: return &a->scale.overlap;
    case OPT_STAGES: return &a->scale.stages;
    }
    return NULL;
}

/* A word among two, or fails naming the option. */
static bool one_of(const cli_cmd *cmd, const char *opt, const char *arg, const char *x,
                   const char *y) {
    if (strcmp(arg, x) == 0 || strcmp(arg, y) == 0)
        return true;
    cli_error(cmd, "--%s: '%s' is not '%s' or '%s'", opt, arg, x, y);
    return false;
}

/* The options that take lists, words or checks of their own; false (said)
** when one is wrong. */
static bool other_option(const cli_cmd *cmd, int i, const char *arg, int argc, char **argv,
                         plan_args *a) {
    const char *name = OPTS[i].name;
    rp_plan_options *o = &a->o;
    int n;
    switch (i) {
    case OPT_PROFILE:
        if (!a->profile)
            a->profile = arg;
        else if (a->num_more < RP_AUTOPLAN_MAX_PROFILES - 1)
            a->more[a->num_more++] = arg;
        else
            return cli_error(cmd, "--profile: at most %d profiles", RP_AUTOPLAN_MAX_PROFILES);
        return true;
    case OPT_MACHINES:
        if ((n = cli_machines(cmd, arg, argc, argv, o->machines, RP_PLAN_MAX_LEVELS)) < 0)
            return false;
        o->num_levels = n;
        return true;
    case OPT_BANDWIDTH:
        return (a->nbw = cli_double_list(name, arg, argc, argv, o->bandwidth,
                                         RP_PLAN_MAX_LEVELS)) >= 0;
    case OPT_MEMORY_SIZE:
        a->memory_given = true;
        if ((a->nmem = cli_double_list(name, arg, argc, argv, a->mem_v,
                                       RP_PLAN_MAX_MACHINES)) < 0)
            return false;
        o->memory_size = a->mem_v[0];
        for (int k = 1; k < a->nmem; k++) /* PipeDream's objective: the least of them */
            o->memory_size = a->mem_v[k] < o->memory_size ? a->mem_v[k] : o->memory_size;
        return true;
    case OPT_SPEED:
        return (a->nspeed = cli_double_list(name, arg, argc, argv, a->speed_v,
                                            RP_PLAN_MAX_MACHINES)) >= 0;
    case OPT_MEMORY_CONSTRAINT: o->memory_constraint = true; return true;
    case OPT_STRAIGHT: o->straight = true; return true;
    case OPT_FEWER_MACHINES: o->fewer_machines = true; return true;
    case OPT_ACTIVATION_COMPRESSION:
        if (!cli_double(name, arg, &o->activation_compression))
            return false;
        if (!(o->activation_compression > 0))
            return cli_error(cmd, "--activation-compression must be > 0");
        return true;
    case OPT_SCHEDULE:
        a->schedule = arg;
        return one_of(cmd, name, arg, "gpipe", "1f1b");
    case OPT_OBJECTIVE:
        a->objective = arg;
        return one_of(cmd, name, arg, "engine", "pipedream");
    case OPT_EMIT:
        if (!one_of(cmd, name, arg, "torchtitan", "megatron"))
            return false;
        a->emit.on = true;
        a->emit.trainer = arg[0] == 't' ? RP_TRAINER_TORCHTITAN : RP_TRAINER_MEGATRON;
        return true;
    case OPT_DEVICE_MEMORY:
        return cli_double(name, arg, &a->device_memory) && a->device_memory >= 0;
    case OPT_SCHEDULES:
        return parse_schedules(cmd, arg, &a->schedules);
    case OPT_LATENCY:
        if (!cli_double(name, arg, &a->latency))
            return false;
        if (a->latency < 0)
            return cli_error(cmd, "--latency takes seconds >= 0, not '%s'", arg);
        return true;
    case OPT_BACKEND:
        return cli_backend(cmd, arg, &a->polling);
    case OPT_CAPACITY:
        if (!cli_double(name, arg, &a->capacity) || !(a->capacity > 0 && a->capacity <= 64))
            return cli_error(cmd, "--capacity takes a factor in (0, 64], not '%s'", arg);
        return true;
    }
    return true;
}

/* Reads the options into a; -1 to go on, else the exit code. */
static int parse_options(const cli_cmd *cmd, int argc, char **argv, plan_args *a) {
    memset(a, 0, sizeof *a);
    rp_plan_options_default(&a->o);
    a->micro_batches = 8, a->min_micro = 1, a->latency = 2e-5;
    bool help;
    const char *arg;
    for (int i; (i = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        if (i == -2)
            return help ? 0 : 2;
        a->given |= 1ull << i;
        long long lo, hi, *v = int_option(a, i, &lo, &hi);
        const char **text = text_option(a, i);
        if (v && !cli_int(OPTS[i].name, arg, lo, hi, v))
            return 2;
        if (text)
            *text = arg;
        if (!v && !text && !other_option(cmd, i, arg, argc, argv, a))
            return 2;
    }
    return -1;
}

/* A transformer on a cluster of devices (plan_scale.c), with the options
** that apply to it. */
static int run_cluster(const cli_cmd *cmd, plan_args *a) {
    static const int cluster_opts[] = {
        OPT_CLUSTER, OPT_DEVICES, OPT_TRANSFORMER, OPT_TRANSFORMER_CONFIG, OPT_PROFILE,
        OPT_TP, OPT_CP, OPT_VP, OPT_PP, OPT_MICRO_BATCH, OPT_MICRO_BATCHES, OPT_RECOMPUTE,
        OPT_SEQUENCE_PARALLEL, OPT_SHARDING, OPT_PRECISION, OPT_OVERLAP, OPT_STAGES,
        OPT_GLOBAL_BATCH, OPT_EP, OPT_ETP, OPT_CAPACITY,
        OPT_SCHEDULES, OPT_JSON, OPT_CONFIG_OUT, OPT_EMIT, OPT_EMIT_OUT, OPT_MEMORY_SIZE};
    unsigned long long allowed = 0;
    for (size_t k = 0; k < sizeof cluster_opts / sizeof *cluster_opts; k++)
        allowed |= 1ull << cluster_opts[k];
    for (int k = 0; k < OPT_COUNT; k++)
        if (a->given & ~allowed & (1ull << k)) {
            cli_error(cmd, "--%s does not apply with --cluster (it plans from the model's "
                           "shape: see 'repipe plan --help')", OPTS[k].name);
            return 2;
        }
    if (a->nmem > 1) {
        cli_error(cmd, "--memory-size with --cluster: one size, every device's");
        return 2;
    }
    unsigned known = 1u << RP_SCHEDULE_1F1B | 1u << RP_SCHEDULE_INTERLEAVED |
                     1u << RP_SCHEDULE_DUALPIPEV;
    if (a->schedules & ~known) {
        cli_error(cmd, "--schedules with --cluster: 1f1b, interleaved-1f1b and dualpipev "
                       "(the schedules a transformer's plan at scale chooses among)");
        return 2;
    }
    plan_scale *s = &a->scale;
    rp_scale_options_default(&s->o);
    s->profile = a->profile, s->json = a->json, s->config_out = a->config_out;
    s->emit = &a->emit;
    s->o.devices = (int)a->devices, s->o.global_batch = a->global_batch;
    s->o.tensor_parallel = (int)a->tp, s->o.pipeline_parallel = (int)a->pp;
    s->o.context_parallel = (int)a->cp, s->o.virtual_stages = (int)a->vp;
    s->o.expert_parallel = (int)a->ep, s->o.expert_tensor_parallel = (int)a->etp;
    s->o.capacity = a->capacity;
    s->o.micro_batch = (int)a->micro;
    s->o.micro_batches = a->given & (1ull << OPT_MICRO_BATCHES) ? (int)a->micro_batches : 0;
    s->o.memory_bytes = a->memory_given ? a->mem_v[0] : 0;
    s->o.schedules = a->schedules;
    return plan_scale_run(cmd, s);
}

/* Without --cluster: its options refused, and what a profile's plan needs
** given; 0 to go on, else the exit code. */
static int check_profile_options(const cli_cmd *cmd, const plan_args *a) {
    static const int scale_only[] = {OPT_DEVICES, OPT_TRANSFORMER, OPT_TRANSFORMER_CONFIG,
                                     OPT_CP, OPT_VP,
                                     OPT_SEQUENCE_PARALLEL, OPT_PRECISION,
                                     OPT_OVERLAP, OPT_STAGES, OPT_EP, OPT_ETP, OPT_CAPACITY};
    for (size_t k = 0; k < sizeof scale_only / sizeof *scale_only; k++)
        if (a->given & (1ull << scale_only[k])) {
            cli_error(cmd, "--%s plans a transformer on a cluster: it needs --cluster",
                      OPTS[scale_only[k]].name);
            return 2;
        }
    if (a->scale.recompute && strcmp(a->scale.recompute, "layers") != 0 &&
        strcmp(a->scale.recompute, "full") != 0) {
        cli_error(cmd, "--recompute %s with a profile: layers (by layer, then every layer, "
                       "where memory is short) or full (every layer, never by layer); none, "
                       "selective and blocks need --cluster",
                  a->scale.recompute);
        return 2;
    }
    if (a->scale.sharding && strcmp(a->scale.sharding, "none") != 0 &&
        strcmp(a->scale.sharding, "optimizer") != 0) {
        cli_error(cmd, "--sharding %s with a profile: none (the optimizer state never sharded) "
                       "or optimizer (sharded where memory is short); fsdp needs --cluster",
                  a->scale.sharding);
        return 2;
    }
    if (a->tp > 64) {
        cli_error(cmd, "--tp %lld: the engine objective plans tensor groups of at most 64",
                  a->tp);
        return 2;
    }
    if (a->pp > 8) {
        cli_error(cmd, "--pp %lld: the engine objective plans pipelines of at most 8 stages "
                       "(with --cluster, any)", a->pp);
        return 2;
    }
    if (!a->profile || !a->o.num_levels) {
        cli_error(cmd, "--profile and --machines are required (see 'repipe plan --help')");
        return 2;
    }
    if (!cli_levels_match(cmd, a->o.num_levels, a->nbw))
        return 2;
    if (a->emit.out && !a->emit.on) {
        cli_error(cmd, "--emit-out needs --emit torchtitan|megatron");
        return 2;
    }
    return 0;
}

/* Writes text, made with status `made`, to path (and frees it); 0, or 1
** (said). */
static int write_made(const cli_cmd *cmd, const char *path, rp_status made, char *text,
                      const rp_error *err) {
    if (made) {
        cli_error(cmd, "%s", err->msg);
        return 1;
    }
    int rc = !plan_write_text(cmd, path, text);
    free(text);
    return rc;
}

/* PipeDream's plan as its files (--json, --pipedream-conf, --graph-out) and
** its words; the exit code so far. */
static int pipedream_outputs(const cli_cmd *cmd, const plan_args *a, bool engine,
                             const rp_plan *plan, const rp_profile *prof, FILE *text_out) {
    int rc = 0;
    char *text = NULL;
    rp_error err;
    rp_status made;
    if (a->json && !engine) { /* with the engine objective, written with its rows */
        made = rp_plan_to_json(plan, prof, &text, &err);
        rc |= write_made(cmd, a->json, made, text, &err);
    }
    if (a->conf) {
        made = rp_plan_pipedream_conf(plan, &text, &err);
        rc |= write_made(cmd, a->conf, made, text, &err);
    }
    if (a->graph_out && rp_profile_write(prof, plan->node_stage, a->graph_out, &err)) {
        cli_error(cmd, "%s", err.msg);
        rc = 1;
    }
    if (text_out != stdout)
        return rc;
    /* the commands run elsewhere: the files they read by absolute paths */
    char gpath[PATH_MAX], cpath[PATH_MAX];
    const char *g = a->graph_out && realpath(a->graph_out, gpath) ? gpath : a->graph_out;
    const char *cf = a->conf && realpath(a->conf, cpath) ? cpath : a->conf;
    plan_print(plan, a->profile, prof);
    plan_print_pipedream(plan, a->arch ? a->arch : a->profile, g, cf,
                         a->profile_batch ? a->profile_batch : rp_profile_micro_batch(prof));
    return rc;
}

/* --config-out under PipeDream's objective: its stages mapped onto the
** configuration, said; written here (*written) where the profile gives no
** micro-batch to price the engine's rows with. The exit code. */
static int pipedream_config(const cli_cmd *cmd, const plan_args *a, const rp_plan *plan,
                            const rp_profile *prof, FILE *text_out, bool *written) {
    rp_config cfg;
    char explain[512];
    rp_error err;
    rp_config_default(&cfg);
    if ((a->base_config && rp_config_load_file(&cfg, a->base_config, &err)) ||
        rp_plan_to_config(plan, prof, &cfg, explain, sizeof explain, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    fprintf(text_out, "\n%s\n", explain);
    /* without the micro-batch the profile was measured on, the engine's
    ** rows cannot be priced: PipeDream's stages alone, on the base's (or
    ** the default) micro-batch and accumulation; simulate says what it
    ** assumes when it meets this profile */
    if (a->profile_batch || rp_profile_micro_batch(prof))
        return 0;
    *written = true;
    if (rp_config_save_file(&cfg, a->config_out, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    fprintf(text_out, "execution configuration written to %s with PipeDream's stages and "
            "micro_batch_size %d (the profile does not say the micro-batch it was measured "
            "on: --profile-batch B also prices the synchronous run and sets B)\n",
            a->config_out, cfg.micro_batch_size);
    plan_print_launch(&cfg, &a->o, a->config_out);
    return 0;
}

/* A profile's plan: PipeDream's, its outputs, then the engine objective's
** where asked (--objective engine, or what only it writes). */
static int run_profile(const cli_cmd *cmd, plan_args *a, const rp_profile *prof,
                       const rp_plan *plan) {
    double *speed = NULL, *memory = NULL;
    /* --emit and --pp are the engine objective's */
    bool engine = a->objective ? strcmp(a->objective, "engine") == 0
                               : a->config_out || a->emit.on || a->pp > 0 || a->tp > 0 ||
                                     a->schedules ||
                                     a->nspeed || a->micro > 0;
    if (a->nspeed && !engine) {
        cli_error(cmd, "--speed plans with the engine objective, not PipeDream's");
        return 2;
    }
    if ((a->nspeed && !cli_per_machine(cmd, "speed", a->speed_v, a->nspeed, a->o.machines,
                                       a->o.num_levels, &speed)) ||
        (a->nmem > 1 && engine && !cli_per_machine(cmd, "memory-size", a->mem_v, a->nmem,
                                                   a->o.machines, a->o.num_levels, &memory))) {
        free(speed);
        return 2;
    }
    /* with the JSON on standard output, words go to standard error */
    FILE *text_out = a->json && strcmp(a->json, "-") == 0 ? stderr : stdout;
    int rc = pipedream_outputs(cmd, a, engine, plan, prof, text_out);
    if (a->schedule && rc == 0)
        rc = plan_engine_mode(cmd, plan, prof, a->base_config, a->schedule,
                              (int)a->micro_batches, a->device_memory, text_out);
    bool written = false;
    if (rc == 0 && a->config_out && !engine) /* PipeDream's stages: how they map onto it */
        rc = pipedream_config(cmd, a, plan, prof, text_out, &written);
    if (rc == 0 && !written && (engine || a->config_out || a->emit.on))
        rc = plan_engine_run(cmd, &(plan_engine){
            .prof = prof, .more = a->more, .num_more = a->num_more, .plan = plan, .o = &a->o,
            .base_config = a->base_config, .global_batch = a->global_batch,
            .profile_batch = a->profile_batch, .memory = a->memory_given ? a->o.memory_size : 0,
            .cores = (int)a->cores, .latency = a->latency, .polling = a->polling,
            .min_micro = a->min_micro, .split_model = a->split_model,
            .config_out = a->config_out, .pipedream_out = !engine,
            .json = engine ? a->json : NULL, .emit = &a->emit, .pp = (int)a->pp,
            .tp = (int)a->tp,
            .schedules = a->schedules,
            .no_sharding = a->scale.sharding && strcmp(a->scale.sharding, "none") == 0,
            .whole_recompute = a->scale.recompute && strcmp(a->scale.recompute, "full") == 0,
            .micro_batch = (int)a->micro,
            .speed = speed, .device_memory = memory});
    free(speed), free(memory);
    return rc;
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    static plan_args a; /* the lists of machines' speeds and memories are large */
    int rc = parse_options(cmd, argc, argv, &a);
    if (rc >= 0)
        return rc;
    if (a.scale.cluster)
        return run_cluster(cmd, &a);
    if ((rc = check_profile_options(cmd, &a)))
        return rc;
    rp_error err;
    rp_profile *prof;
    if (rp_profile_read(&prof, a.profile, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    rp_plan *plan;
    if (rp_plan_compute(prof, &a.o, &plan, &err)) {
        cli_error(cmd, "%s: %s", a.profile, err.msg);
        rp_profile_free(prof);
        return 1;
    }
    rc = run_profile(cmd, &a, prof, plan);
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
