/*
** The planner: PipeDream's hierarchical partitioning (docs/planner.md).
**
** Given a profile and a machine hierarchy (level 1 innermost: e.g. 8 devices
** per server, then 2 servers) it finds, per level, pipeline stages and the
** number of machines replicating each one, minimising the time per step of
** the slowest stage. The objective and every number are PipeDream's; ties
** between optimal plans are broken deterministically (planner.c).
*/
#ifndef REPIPE_PLANNER_H
#define REPIPE_PLANNER_H

#include <stdbool.h>

#include "repipe/config.h"
#include "repipe/core.h"
#include "repipe/spec.h"
#include "repipe/profile.h"
#include "repipe/transformer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RP_PLAN_MAX_LEVELS 8
#define RP_PLAN_MAX_MACHINES 4096 /* per level, and all levels multiplied */

typedef struct rp_plan_options {
    int num_levels;
    int machines[RP_PLAN_MAX_LEVELS];     /* per level, innermost first */
    double bandwidth[RP_PLAN_MAX_LEVELS]; /* bytes/s per level [1e9] */
    double memory_size;                   /* bytes per machine [16e9] */
    bool memory_constraint; /* reject stages whose stashed data exceed memory_size */
    bool straight;          /* no replication of stages */
    bool fewer_machines;    /* a level may leave machines unused */
    double activation_compression; /* > 0: also bound by activation transfers; 0 = off */
    int threads; /* workers for the lower levels' tables; 0 = automatic (2) */
    /* Solve every row of the level below the top, not only those a plan as
    ** fast as a first feasible one can use: the same plan, slower (tests). */
    bool all_rows;
} rp_plan_options;

/* Defaults: no levels yet, bandwidth 1e9, memory 16e9, options off. */
void rp_plan_options_default(rp_plan_options *o);
/* sizeof(rp_plan_options), for bindings (Python's ctypes). */
size_t rp_plan_options_size(void);

/* Reads options from JSON as rp_plan_to_json writes them: an object with
** "machines", "bandwidths", "memory_size", "straight_pipeline",
** "use_memory_constraint", "use_fewer_machines" and
** "activation_compression_ratio" (null: off), or an object holding such an
** object under "options". */
rp_status rp_plan_options_from_json(rp_plan_options *o, const char *text, size_t len,
                                    const char *name, rp_error *err);

typedef struct rp_plan_stage {
    int start, end;          /* states [start, end) in state order */
    double compute_time;     /* seconds per step on one machine */
    int replication;         /* machines of this level that run it */
    int parent;              /* stage of the level above that holds it; -1 at the top */
    double activation_bytes; /* stashed activations of one step, unreplicated */
    double parameter_bytes;
} rp_plan_stage;

typedef struct rp_plan_level {
    int level; /* 1 = innermost */
    int machines;
    double bandwidth;
    int num_stages;
    rp_plan_stage *stages;
} rp_plan_level;

typedef struct rp_plan {
    int num_states;
    int num_levels;
    rp_plan_level *levels; /* levels[0] is the outermost (highest) level */
    double single_stage_time; /* one machine, seconds per step */
    double data_parallel_time; /* every machine replicating the whole model */
    double pipeline_time;      /* this plan */
    double speedup_vs_single, dp_speedup_vs_single, speedup_vs_dp;
    int machines_available, machines_used;
    int rows_solved; /* rows of the level below the top solved, of num_states
                     ** (num_states with one level) */
    /* Final stages are the stages of level 1, numbered across the levels
    ** above; workers are numbered replica-major (docs/cluster.md). */
    int num_stages;
    int *stage_num_ranks;  /* per final stage */
    int num_workers;
    int *worker_stage;     /* per worker: its final stage */
    int num_nodes;
    int *node_stage;       /* per profile node: final stage, -1 if none */
    /* > 0: the profile's antichain DAG had more than RP_PLAN_MAX_STATES
    ** states, and the plan is that of its graph with PipeDream's branch
    ** compression (docs/planner.md), of this many nodes; a branch's nodes
    ** share their stage */
    int compressed_nodes;
    rp_plan_options options;
} rp_plan;

/* The states a plan is made over, at most, are this many or 16 per node,
** whichever is more (a chain has one per node; PipeDream's profiles up to
** 15): a graph with more (wide branches: an Inception module's states are
** the product of its branch lengths) is planned with PipeDream's branch
** compression, or refused when that has more too. */
#define RP_PLAN_MAX_STATES 20000

rp_status rp_plan_compute(const rp_profile *profile, const rp_plan_options *options,
                          rp_plan **out, rp_error *err);
void rp_plan_free(rp_plan *plan);

/* The plan as JSON (the keys of the PipeDream parity fixtures, plus
** stage_to_rank_map and stage_to_num_ranks). The caller frees *out. */
rp_status rp_plan_to_json(const rp_plan *plan, const rp_profile *profile, char **out,
                          rp_error *err);

/* Writes a plan of a chain profile (one node per layer after the Input
** source, as rp_profile_measure makes) into cfg: layers_per_stage,
** stage_replication and replication_factor; the rest of cfg is kept. A top
** level that only replicates becomes the replication factor; otherwise every
** level's stages are flattened into one pipeline. explain (if not NULL)
** receives a sentence on the mapping. */
rp_status rp_plan_to_config(const rp_plan *plan, const rp_profile *profile, rp_config *cfg,
                            char *explain, size_t explain_len, rp_error *err);

/* The engine's objective (docs/planner.md): the configuration repipe's
** synchronous pipelines run fastest on the machines, for a global batch.
** Chosen together: contiguous stages, stage replication (at most GA, so
** every stage replica gets micro-batches), replicas R, micro-batch B and
** accumulation GA with B GA R = global_batch, the schedule (1f1b, or for
** a pipeline zb-h1, zb-h2 or zb-auto where they are faster within the
** memory), and
** recomputation where memory is short. Times are rp_simulate's. */
typedef struct rp_autoplan_options {
    int num_levels;
    int machines[RP_PLAN_MAX_LEVELS];     /* per level, innermost first */
    double bandwidth[RP_PLAN_MAX_LEVELS]; /* bytes/s per level */
    long long global_batch; /* samples per update (required) */
    double memory_size;     /* bytes a worker may hold; 0: no limit */
    int max_accumulation;   /* largest GA tried [64]; more, up to 65536, where that leaves
                            ** micro-batches as small as the smallest profiled */
    int min_micro_batch;    /* smallest micro-batch tried [1]: batchnorm normalises by a
                            ** micro-batch's statistics, which a few samples make poor */
    int candidates;         /* the programme's best shapes simulated exactly [24] */
    int cores;              /* the workers share one machine's cores, as rp_sim_options [0] */
    double latency;         /* seconds per message, as rp_sim_options [2e-5] */
    bool polling;           /* waiting workers poll (MPI ranks), as rp_sim_options */
    /* Tensor parallelism: per layer, what tensor_parallel does to it
    ** (rp_sim_options.tensor_split; NULL: not tried), and the t it may take
    ** (bit t set for t = 2, 4, 8: those the model's heads and widths divide).
    ** A tensor group stays inside a unit of the innermost level. */
    const unsigned char *tensor_split;
    unsigned tensor_degrees;
    /* Profiles measured on a rank of a tensor group (per profile its t,
    ** rp_profile_tensor_parallel; NULL: every one 1): those of t = 1 are
    ** planned as above; those of each t > 1 by the same programme with a
    ** group of t as its worker (a unit of the innermost level holds
    ** machines[0] / t of them), its best estimates simulated on every
    ** worker with tensor_parallel t (rp_sim_options.tensor_measured).
    ** tensor_parallel: only that t, from its profiles or tensor_split [0:
    ** any]. */
    const int *profile_tensor;
    int tensor_parallel;
    /* What another trainer can run (rp_trainer_restrict sets them; zero:
    ** anything repipe's engine runs). pipeline_stages: pipelines of exactly
    ** this many stages (with two chunks a worker, this many workers), the
    ** pipeline-parallel size; one_worker_a_stage: no stage replication;
    ** schedules: bit s set where schedule s may be chosen; cuts (L + 1
    ** entries, NULL: anywhere): cuts[j] nonzero where a stage may begin at
    ** layer j. */
    int pipeline_stages;
    bool one_worker_a_stage;
    /* no_sharding: never the optimizer state sharded over a stage's
    ** workers (a trainer or planner whose memory has no such thing) */
    bool no_sharding;
    /* Where memory is short the planner tries sharding, then recomputation
    ** by layer (recompute_layers: stage by stage the least that fits, the
    ** layers that keep the most bytes for their forward's time first, as
    ** Aceso recomputes operators), then recomputing every layer.
    ** no_recompute_by_layer: recompute every layer or none (a trainer that
    ** recomputes whole blocks) */
    bool no_recompute_by_layer;
    /* micro_batch: micro-batches of exactly this many samples (a planner
    ** that prices only the sizes it profiled) [0: any] */
    int micro_batch;
    unsigned schedules;
    const unsigned char *cuts;
    /* Devices of several kinds: per machine (the product of machines[]), in
    ** rank order, its speed relative to the profile's device [NULL: all 1].
    ** A stage's replicas keep taking micro-batches in turn, so the slowest
    ** device of a stage sets its pace: the plan gives slow devices fewer
    ** layers or more replicas, and the update stays mini-batch SGD's. */
    const double *device_speed;
    /* and per machine the bytes a worker there may hold [NULL: memory_size
    ** each]: a stage fits where it fits its smallest device */
    const double *device_memory;
} rp_autoplan_options;

void rp_autoplan_options_default(rp_autoplan_options *o);

typedef struct rp_autoplan_entry {
    bool found;
    rp_config cfg;       /* the base configuration with the plan's keys set */
    double seconds;      /* simulated time per update */
    double worker_bytes; /* the most a worker holds */
} rp_autoplan_entry;

typedef struct rp_autoplan {
    rp_autoplan_entry best;          /* the fastest (the simplest within 1 %) */
    rp_autoplan_entry single;        /* one worker */
    rp_autoplan_entry data_parallel; /* every worker a replica */
    rp_autoplan_entry pipedream;     /* the given PipeDream-objective plan, at its best GA */
    /* the fastest pipelines (two stages or more) under 1f1b and under a
    ** zero-bubble schedule (zb-h1, zb-h2 or zb-auto), side by side */
    rp_autoplan_entry pipeline_1f1b, pipeline_zero_bubble;
    rp_autoplan_entry tensor_parallel; /* the fastest with tensor groups (t > 1) */
    /* the fastest of interleaved-1f1b and zb-v on a pipeline's workers (2
    ** chunks each) */
    rp_autoplan_entry pipeline_interleaved;
    /* with device_speed: the plan the search makes when every device is
    ** taken as equal, simulated on these devices (what a planner that
    ** knows one kind would run here) */
    rp_autoplan_entry equal_devices;
    int simulated;                   /* configurations simulated exactly */
} rp_autoplan;

#define RP_AUTOPLAN_MAX_PROFILES 16

/* Plans for the engine from profiles of one model measured on batches[k]
** rows each (one is enough; a micro-batch takes the times of the profile
** measured nearest it, scaled linearly). base gives everything the plan
** does not choose (optimizer, memory features, seed); pipedream (may be
** NULL; a plan of profiles[0]) is also run synchronously at every
** accumulation that fits, and wins if it is faster. Fails
** (RP_ERR_INFEASIBLE) when nothing fits the memory. */
rp_status rp_autoplan_compute(const rp_profile *const *profiles, const double *batches,
                              int num_profiles, const rp_config *base, const rp_plan *pipedream,
                              const rp_autoplan_options *options, rp_autoplan *out,
                              rp_error *err);

/* The engine objective's comparison as JSON: {"global_batch", "simulated",
** "best", "single", "data_parallel", "pipedream", "pipeline_1f1b",
** "pipeline_zero_bubble", "tensor_parallel", "pipeline_interleaved", "equal_devices"}, each
** row {"found",
** "workers", "stages", "seconds_per_update", "samples_per_second",
** "worker_bytes", "config"} with the whole configuration. With a plan (may
** be NULL), the object is the "engine" key of rp_plan_to_json's. The
** caller frees *out. */
rp_status rp_autoplan_to_json(const rp_autoplan *a, long long global_batch, const rp_plan *plan,
                              const rp_profile *profile, char **out, rp_error *err);

/* Other trainers (src/plan/trainers.c): torchtitan (0.3.0's command line)
** and Megatron-LM (megatron-core 0.19's arguments), over a profile whose
** nodes are named by module ("layers.3: Block", as repipe.torch.profile
** writes them). */
typedef enum rp_trainer { RP_TRAINER_TORCHTITAN = 0, RP_TRAINER_MEGATRON } rp_trainer;

const char *rp_trainer_name(rp_trainer t);
/* Narrows o to what trainer t runs: no stage replication, its schedules
** (of those o allows),
** its cuts (*cuts, L + 1 entries that o->cuts points to, or NULL; the
** caller frees it after the plan). */
rp_status rp_trainer_restrict(rp_trainer t, const rp_profile *p, rp_autoplan_options *o,
                              unsigned char **cuts, rp_error *err);
/* cfg as the trainers say it: every stage replicated r ways is r pipelines
** (data parallelism) of GA / r micro-batches each, written to out; false
** (out a copy) where the stages' replication differs or r does not divide
** GA. */
bool rp_trainer_pipelines(const rp_config *cfg, rp_config *out);
/* Whether trainer t runs cfg over the profile's layers as planned; where
** not, why (a sentence naming what it cannot do). */
bool rp_trainer_runs(rp_trainer t, const rp_profile *p, const rp_config *cfg, char *why,
                     size_t cap);
/* The trainer's settings for cfg, one option (with its values) a line:
** torchtitan's --parallelism.* and --training.* arguments and its
** activation-checkpoint choice, Megatron-LM's parallel sizes, layout,
** batch and recomputation arguments. csv: the schedule CSV's path where
** torchtitan runs the schedule from one (zb-h1, zb-h2, zb-auto, zb-v).
** Fails with rp_trainer_runs' reason where the trainer cannot run cfg.
** The caller frees *out. */
rp_status rp_trainer_settings(rp_trainer t, const rp_profile *p, const rp_config *cfg,
                              const char *csv, char **out, rp_error *err);

/* sizeof(rp_autoplan_options) and sizeof(rp_autoplan), for bindings. */
size_t rp_autoplan_options_size(void);
size_t rp_autoplan_size(void);

/* PipeDream's hybrid_conf.json: module_to_stage_map and stage_to_rank_map. */
rp_status rp_plan_pipedream_conf(const rp_plan *plan, char **out, rp_error *err);

/* PipeDream's --stage_to_num_ranks_map of convert_graph_to_model.py for the
** plan, "0:14,1:2" (stage:workers, in stage order), snprintf-style: the
** length it needs, written to buf when it fits cap. That script numbers the
** ranks of stage s contiguously after those of stage s-1; repipe's layout
** (and --pipedream-conf's) is replica-major (docs/planner.md). */
size_t rp_plan_pipedream_stage_map(const rp_plan *plan, char *buf, size_t cap);

/* Plans for a transformer on a cluster (src/plan/scale/): tensor,
** context, pipeline and data-parallel sizes, micro-batch, virtual stages
** (1f1b, or interleaved-1f1b with 2 or more chunks a rank; DualPipeV's V
** where asked), sequence parallelism, recomputation, sharding and precision,
** for a global batch on `devices` devices within their memory. Each shape
** is priced in closed form from its stages' times; the best few that fit
** are simulated (rp_simulate, one replica; the replicas' reduction priced
** beside it), and the fastest that fits wins. */
/* The largest cluster and batch a plan takes: their search and its
** simulations stay within a second or two and a few MB (docs/simulate.md
** measures the bound). */
#define RP_SCALE_MAX_DEVICES (1 << 17)
#define RP_SCALE_MAX_BATCH (1LL << 24)

typedef struct rp_scale_options {
    long long global_batch; /* sequences an update (required) */
    int devices;            /* (required) */
    /* 0: any. Tensor groups: 1, 2, 4, 8 that divide a node, the heads and the
    ** MLP; context groups: 1, 2, 4, ... up to 32; pipelines: any that divides
    ** what is left; micro-batches: 1, 2, 4, 8; virtual: 1 (1f1b) and the
    ** chunks a rank that divide the layers */
    int tensor_parallel, context_parallel, pipeline_parallel, micro_batch, virtual_stages;
    /* micro-batches a pipeline and update [0: any]: with the replicas and
    ** the micro-batch, what Galvatron's settle_chunk and Megatron-LM's global
    ** batch over micro-batch and replicas fix */
    int micro_batches;
    /* a mixture's expert groups (0: any; expert groups of the powers of two
    ** that divide the experts and a stage's ranks) and each expert's tensor
    ** group [0: 1] */
    int expert_parallel, expert_tensor_parallel;
    double capacity;       /* a mixture's capacity factor (rp_transformer_run's) [0: dropless] */
    int sequence_parallel; /* 0: either; 1: on; -1: off */
    int recompute;         /* -1: any; else an rp_recompute */
    int sharding;          /* -1: any; else an rp_sharding */
    int precision;         /* -1: bf16 or fp8; else an rp_precision [bf16] */
    bool no_overlap;       /* communication not overlapped (Megatron-LM in 2021) */
    /* the blocks split evenly over the chunks, the embedding and the head
    ** beside them, as Megatron-LM splits them without a layout (the layers
    ** must divide evenly) [false: cut to balance the chunks' times, which
    ** --pipeline-model-parallel-layout expresses] */
    bool even_stages;
    double memory_bytes;   /* a device's memory to plan for [0: the device's] */
    int candidates;        /* the best estimates simulated [4] */
    /* bit s set for each schedule s the search may choose [0: Megatron-LM's,
    ** 1f1b and interleaved-1f1b]; with RP_SCHEDULE_DUALPIPEV, DualPipeV's V
    ** too (two chunks a rank, gradient accumulation of twice the ranks or
    ** more) */
    unsigned schedules;
} rp_scale_options;

void rp_scale_options_default(rp_scale_options *o);

typedef struct rp_scale_plan {
    rp_config cfg; /* the configuration (repipe's form: layers_per_stage, schedule, ...) */
    rp_transformer_run run; /* (its expert groups: run.expert_parallel, ...) */
    int t, cp, p, d, b, v;
    rp_sharding sharding;
    double seconds;           /* simulated, an update */
    double tflops_per_device; /* Megatron-LM's count (num_floating_point_operations) over it */
    double tflops_eq3;        /* equation 3 (SC'21) over it */
    double mfu;               /* 6N + attention over the devices' peak in the run's precision */
    rp_transformer_memory memory; /* the rank that holds the most */
    int busiest_rank;
    int considered, simulated;
} rp_scale_plan;

rp_status rp_scale_plan_compute(const rp_transformer *m, const rp_cluster *c,
                                const rp_scale_options *o, rp_scale_plan *out, rp_error *err);

/* One configuration simulated as the planner simulates it: cfg's layout and
** schedule, run's features, d = cfg's replication factor. */
rp_status rp_scale_simulate(const rp_transformer *m, const rp_cluster *c,
                            const rp_transformer_run *run, rp_sharding sharding,
                            const rp_config *cfg, double *seconds,
                            rp_transformer_memory *busiest, rp_error *err);

/* The plan as trainer t's settings, one option and its value a line (the
** caller frees *out): Megatron-LM's arguments, or torchtitan's. `why` says
** what the trainer cannot express and what the settings run instead ("" when
** they run the plan as it is). */
rp_status rp_scale_settings(rp_trainer t, const rp_transformer *m, const rp_scale_plan *p,
                            long long global_batch, char **out, char *why, size_t cap,
                            rp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_PLANNER_H */
