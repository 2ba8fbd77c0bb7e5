/*
** Execution configuration: the IPUConfig vocabulary (docs/configuration.md).
**
** A configuration is loaded from a JSON object, either repipe's own keys or
** an Optimum Graphcore `ipu_config.json`, which is read as the release of
** Optimum Graphcore that wrote it read it (docs/configuration.md). Every key
** is validated on load; an unknown key is an error that names it (with a
** "did you mean" hint) except in a file of a release that ignored such keys;
** a key that has no meaning here is accepted with a warning that names it.
**
** Layer lists keep their -1 wildcards; rp_config_stage_layers() expands them
** once the model's number of layers is known.
*/
#ifndef REPIPE_CONFIG_H
#define REPIPE_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "repipe/core.h"
#include "repipe/grouping.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RP_MAX_STAGES 256
#define RP_MAX_WARNINGS 32
#define RP_WARNING_MAX 256
#define RP_PATH_MAX 1024
/* recompute_layers names layers 0 .. RP_MAX_RECOMPUTE_LAYERS - 1 */
#define RP_MAX_RECOMPUTE_LAYERS 4096

typedef enum rp_output_mode {
    RP_OUTPUT_FINAL = 0, /* training default */
    RP_OUTPUT_ALL,
    RP_OUTPUT_SUM,
    RP_OUTPUT_DEFAULT /* `all` for inference, `final` for training */
} rp_output_mode;

/* 1f1b and gpipe flush every update (each equals SGD); pipedream is
** PipeDream's asynchronous 1F1B: a stage updates after each backward, and
** weight stashing gives a micro-batch's backward the weights of its
** forward; pipedream_2bw is PipeDream-2BW: 1F1B whose update uses the
** gradient of the weights one update older (docs/pipelines.md). */
typedef enum rp_schedule {
    RP_SCHEDULE_1F1B = 0,
    RP_SCHEDULE_GPIPE,
    RP_SCHEDULE_ZB_H1, /* zero bubble (schedule.h), at 1f1b's activation memory */
    RP_SCHEDULE_ZB_H2, /* zero bubble, about twice 1f1b's activation memory */
    RP_SCHEDULE_ZB_AUTO, /* zero bubble ordered by the passes' times, under a limit */
    RP_SCHEDULE_INTERLEAVED, /* Megatron-LM's interleaved 1F1B: virtual_stages chunks a worker */
    RP_SCHEDULE_ZB_V, /* zero bubble in a V: worker r holds chunks r and 2P - 1 - r */
    RP_SCHEDULE_DUALPIPEV, /* DeepSeek's DualPipeV: zb-v's V, forwards paired with backwards */
    RP_SCHEDULE_DUALPIPE, /* DeepSeek's DualPipe: two replicas' pipelines in opposite directions */
    RP_SCHEDULE_PIPEDREAM, /* the asynchronous ones last: >= PIPEDREAM tests for them */
    RP_SCHEDULE_PIPEDREAM_2BW
} rp_schedule;

typedef enum rp_optimizer_type { RP_OPT_SGD = 0, RP_OPT_ADAM, RP_OPT_ADAMW } rp_optimizer_type;

typedef struct rp_optimizer_config {
    rp_optimizer_type type;
    double lr;           /* [0.05 for sgd, 0.001 for adam] */
    double momentum;     /* sgd [0] */
    double weight_decay; /* [0] */
    double beta1, beta2; /* adam [0.9, 0.999] */
    double eps;          /* adam [1e-8] */
} rp_optimizer_config;

/* The learning rate over a run, by update u (0, 1, ...): first a linear
** warm-up, lr * (u + 1) / warmup_updates for u < warmup_updates; then
** constant, cosine (from lr down to min_lr at decay_updates, min_lr after)
** or step (lr * gamma^floor((u - warmup_updates) / step_updates)). */
typedef enum rp_lr_schedule_type { RP_LR_CONSTANT = 0, RP_LR_COSINE, RP_LR_STEP } rp_lr_schedule_type;

typedef struct rp_lr_schedule {
    rp_lr_schedule_type type;
    long long warmup_updates; /* [0] */
    long long decay_updates;  /* cosine: the update min_lr is reached at (required) */
    double min_lr;            /* cosine [0] */
    long long step_updates;   /* step: updates between decays (required) */
    double gamma;             /* step [0.1] */
} rp_lr_schedule;

/* A list of layer counts per stage; -1 entries are wildcards. */
typedef struct rp_layer_list {
    int count;
    int layers[RP_MAX_STAGES];
} rp_layer_list;

typedef struct rp_config {
    uint64_t seed;
    int micro_batch_size;
    int replication_factor;
    int inference_replication_factor;
    int gradient_accumulation_steps;
    rp_layer_list layers_per_stage;
    bool inference_layers_set; /* else inference uses the training list */
    rp_layer_list inference_layers_per_stage;
    int stage_replication_count;          /* 0: every stage has r_s = 1 */
    int stage_replication[RP_MAX_STAGES]; /* r_s, one per training stage */
    int device_iterations;
    int inference_device_iterations;
    rp_output_mode output_mode;
    rp_schedule schedule;
    rp_grouping replica_grouping; /* over replication_factor replicas */
    bool grouping_set; /* replica_grouping given; else one group of all */
    bool replicated_tensor_sharding;
    bool optimizer_state_offchip;
    bool recompute_checkpoint_every_layer;
    /* recompute_layers: the layers (of the whole model, from 0) whose
    ** outputs and state an activation set does not keep; the backward makes
    ** them again from the nearest kept output before them, a run of them at
    ** a time (Aceso's recomputation by operator). A stage's last layer is
    ** kept whatever the list says. A bit a layer; recompute_layers_count
    ** bits set (0: none). Not with recompute_checkpoint_every_layer. */
    int recompute_layers_count;
    uint64_t recompute_layers[RP_MAX_RECOMPUTE_LAYERS / 64];
    /* schedule pipedream: every stage runs micro-batch m on the version that
    ** reflects the micro-batches the input stage's version for m did
    ** (PipeDream's vertical sync) */
    bool pipedream_vertical_sync;
    /* schedule zb-auto: the relative times of a stage's forward, input
    ** gradient and weight gradient [1, 1, 1], and the most micro-batches a
    ** stage replica holds from F to W [0: 1f1b's most on one worker] */
    double zb_pass_times[3];
    int zb_max_in_flight;
    /* schedule interleaved-1f1b: the model chunks (stages of
    ** layers_per_stage) each pipeline worker holds, v: worker r of P holds
    ** stages r, P + r, ..., (v - 1) P + r [1] */
    int virtual_stages;
    /* Megatron-LM's tensor parallelism: every attention and MLP of the model
    ** split over this many workers of each (replica, stage, stage replica),
    ** its tensor group [1: none] */
    int tensor_parallel;
    /* Megatron-LM's expert parallelism: the experts of every moe layer split
    ** over groups of this many consecutive replicas, each running its share
    ** of the experts for the group's tokens (exchanged by all-to-all) [1:
    ** none] */
    int expert_parallel;
    /* ...and the embeddings, the head and the loss split by vocabulary over
    ** the group too (Megatron's parallel embedding and cross-entropy) [true] */
    bool vocab_parallel;
    bool auto_loss_scaling;
    /* Optimum's fp16 partial sums of products and convolutions: accepted, no
    ** effect (repipe's products sum in fp32) [true, as in Optimum] */
    bool enable_half_partials;
    /* activations and their gradients cross stage boundaries in fp16 */
    bool fp16_exchange;
    /* > 0: each worker starts reducing its gradients during the update's
    ** last backward, a bucket of about this many MB at a time from the last
    ** layer down, while the layers below compute (PyTorch DDP's buckets);
    ** the same sums as one reduction after it. 0: one reduction after the
    ** last backward [0] */
    double reduction_bucket_mb;
    /* Consecutive workers (MPI ranks) that share a server: a reduction whose
    ** group spans servers sums inside each over its fast links and crosses
    ** between them once each way, in worker order (rp_comm_set_servers); the
    ** local backend's workers share memory and ignore it. 0: flat [0] */
    int workers_per_server;
    /* The loss scale (a power of two): fixed, or the first of auto_loss_scaling.
    ** 0: the default, 2^16 with auto_loss_scaling and 1 without. */
    double loss_scaling;
    int loss_scaling_growth_interval; /* clean updates before the scale doubles [2000] */
    int embedding_serialization_factor;
    int inference_embedding_serialization_factor;
    /* One value for every stage, or a single value for all (count == 1). */
    int matmul_proportion_count;
    double matmul_proportion[RP_MAX_STAGES];
    int inference_matmul_proportion_count; /* 0: as for training */
    double inference_matmul_proportion[RP_MAX_STAGES];
    int64_t device_memory; /* bytes; 0 = unlimited */
    char executable_cache_dir[RP_PATH_MAX];
    rp_optimizer_config optimizer;
    rp_lr_schedule lr_schedule;
    /* > 0: gradients scaled by min(1, C / (norm + 1e-6)), norm the global L2
    ** norm over every variable of every stage and replica group, computed
    ** once per update (PyTorch's clip_grad_norm_); 0: off */
    double gradient_clipping;
    /* "data_order": "sequential": every epoch visits the samples in the
    ** dataset's order (a text's windows front to back) instead of a
    ** permutation fixed by (seed, epoch) ("shuffled", the default) */
    bool sequential_data;

    /* Why the layers of the training (0) or inference (1) pipeline cannot be
    ** placed for any model, as IPUConfig's release found at placement (a
    ** layer list of 3 IPUs for ipus_per_replica 4); "" when they can. */
    char layers_error[2][RP_WARNING_MAX];
    /* Placement by index, as IPUConfig before 0.6.0 placed layers: layer i
    ** goes to the IPU the list's i-th layer names, so a model with fewer
    ** layers than the list leaves the tail empty (one with more cannot be
    ** placed); the list has no wildcards. */
    bool layers_by_index;
    /* The layer lists count a transformer's blocks, as Optimum Graphcore's
    ** layers_per_ipu does, with the embeddings on the first stage and the
    ** head on the last: set for every IPUConfig file. rp_session_fit_config
    ** makes them counts of a model's layers. */
    bool layers_count_blocks;
    /* The layer keys as the file spelled them, for messages. */
    char layers_key[2][48];
    /* How the file was read: "" for repipe's own keys, else which release of
    ** Optimum Graphcore's IPUConfig it was read as, and why. */
    char origin[RP_WARNING_MAX];
    /* That release, "0.6.0" or "0.2.3-0.5"; "" for repipe's own keys (read
    ** as the current release reads them). */
    char ipu_release[40];
    /* Keys accepted without effect, one message each. */
    int num_warnings;
    char warnings[RP_MAX_WARNINGS][RP_WARNING_MAX];
} rp_config;

/* How to read an IPUConfig file of Optimum Graphcore 0.2.1-0.6.0, whose
** values may be dictionaries by pod type. */
typedef struct rp_config_load_options {
    const char *pod_type; /* "pod16", ...; NULL: the file's pod_type, else "default" */
} rp_config_load_options;

/* The learning rate of update u (counted from 0, skipped updates included). */
double rp_config_lr(const rp_config *cfg, long long u);

/* Fills cfg with the defaults of docs/configuration.md (one stage, one replica, ...). */
void rp_config_default(rp_config *cfg);

/* Parses a JSON object. `name` (a file name) prefixes every message. */
rp_status rp_config_load_string(rp_config *cfg, const char *text, size_t len, const char *name,
                                rp_error *err);
rp_status rp_config_load_file(rp_config *cfg, const char *path, rp_error *err);
/* The same with options (opts may be NULL). */
rp_status rp_config_load_string_opts(rp_config *cfg, const char *text, size_t len,
                                     const char *name, const rp_config_load_options *opts,
                                     rp_error *err);
rp_status rp_config_load_file_opts(rp_config *cfg, const char *path,
                                   const rp_config_load_options *opts, rp_error *err);

/* Applies the "execution_config" object of a plan written by `repipe plan
** --json` (replication_factor, layers_per_stage, stage_replication) to cfg,
** keeping its other settings. */
rp_status rp_config_apply_plan(rp_config *cfg, const char *plan_text, size_t len,
                               const char *name, rp_error *err);

/* Writes cfg as repipe JSON (its own keys only). The caller frees *out. */
rp_status rp_config_to_json(const rp_config *cfg, char **out, rp_error *err);
rp_status rp_config_save_file(const rp_config *cfg, const char *path, rp_error *err);

bool rp_config_equal(const rp_config *a, const rp_config *b);

/* The loss scale a run starts with (loss_scaling or its default). */
double rp_config_loss_scale(const rp_config *cfg);

/* Number of stages for training or inference. */
int rp_config_num_stages(const rp_config *cfg, bool inference);

/* Expands the wildcards of a layer list for a model of num_layers layers.
** out receives one count per stage. */
rp_status rp_layers_expand(const rp_layer_list *list, int num_layers, int *out,
                           const char *key, rp_error *err);

/* The expanded layer counts of the training or inference stages. */
rp_status rp_config_stage_layers(const rp_config *cfg, bool inference, int num_layers,
                                 int *out, rp_error *err);

/* Numbers derived from a configuration (docs/configuration.md). */
typedef struct rp_derived {
    int stages, inference_stages;
    int workers, inference_workers;               /* R * sum(r_s); R_inf * P_inf */
    long long samples_per_micro_batch;            /* B */
    long long samples_per_update;                 /* B * GA * R */
    long long samples_per_host_call;              /* B * GA * R * D */
    long long inference_samples_per_step;         /* B * R_inf */
    long long inference_samples_per_host_call;    /* B * R_inf * D_inf */
} rp_derived;

/* r_s: the workers that share training stage s inside a replica (1 when
** stage_replication is not given). */
/* Workers of a tensor group: tensor_parallel, 1 when unset. */
static inline int rp_config_tensor_parallel(const rp_config *cfg) {
    return cfg->tensor_parallel > 1 ? cfg->tensor_parallel : 1;
}
/* Whether recompute_layers names layer l. */
static inline bool rp_config_recomputes_layer(const rp_config *cfg, int l) {
    return cfg->recompute_layers_count > 0 && l >= 0 && l < RP_MAX_RECOMPUTE_LAYERS &&
           (cfg->recompute_layers[l / 64] >> (l % 64) & 1);
}
/* Names layer l in recompute_layers (nothing where it is named already or
** past RP_MAX_RECOMPUTE_LAYERS). */
static inline void rp_config_recompute_layer(rp_config *cfg, int l) {
    if (l >= 0 && l < RP_MAX_RECOMPUTE_LAYERS && !rp_config_recomputes_layer(cfg, l)) {
        cfg->recompute_layers[l / 64] |= 1ull << (l % 64);
        cfg->recompute_layers_count++;
    }
}
/* The highest layer recompute_layers names, or -1 where it names none. */
static inline int rp_config_last_recomputed(const rp_config *cfg) {
    for (int w = RP_MAX_RECOMPUTE_LAYERS / 64 - 1; cfg->recompute_layers_count > 0 && w >= 0; w--)
        for (int b = 63; cfg->recompute_layers[w] && b >= 0; b--)
            if (cfg->recompute_layers[w] >> b & 1)
                return w * 64 + b;
    return -1;
}
/* The flags of rp_model_tensor_split (spec.h) the configuration asks for. */
static inline unsigned rp_config_tp_flags(const rp_config *cfg) {
    return cfg->vocab_parallel ? 1u /* RP_TP_VOCAB */ : 0u;
}
/* The schedules in a V: two chunks a worker, r on the way down and
** 2 P - 1 - r on the way up (zb-v, dualpipev). */
static inline bool rp_config_v_shaped(const rp_config *cfg) {
    return cfg->schedule == RP_SCHEDULE_ZB_V || cfg->schedule == RP_SCHEDULE_DUALPIPEV;
}
/* The schedules whose workers each hold virtual_stages chunks of the model
** (a device each runs them): interleaved-1f1b and the V's. */
static inline bool rp_config_chunked(const rp_config *cfg) {
    return cfg->schedule == RP_SCHEDULE_INTERLEAVED || rp_config_v_shaped(cfg);
}
/* Chunk k (of virtual_stages) of pipeline worker r of P under a chunked
** schedule: interleaved-1f1b's r, P + r, ..., zb-v's V, r on the way down
** and 2 P - 1 - r on the way up (the first and the last chunk on worker 0). */
static inline int rp_config_chunk(const rp_config *cfg, int P, int r, int k) {
    if (rp_config_v_shaped(cfg))
        return k == 0 ? r : 2 * P - 1 - r;
    return k * P + r;
}
/* DualPipe: replicas 2q and 2q + 1 run their pipelines in opposite
** directions over the same P devices, device r holding stage r of the one
** and stage P - 1 - r of the other. */
static inline bool rp_config_paired(const rp_config *cfg) {
    return cfg->schedule == RP_SCHEDULE_DUALPIPE;
}
/* The threads or ranks a training run of d's workers takes: under
** interleaved-1f1b and zb-v each runs virtual_stages of them, under
** dualpipe two (of two replicas). */
static inline int rp_config_devices(const rp_config *cfg, const rp_derived *d) {
    return rp_config_chunked(cfg) ? d->workers / cfg->virtual_stages
           : rp_config_paired(cfg) ? d->workers / 2
                                   : d->workers;
}
int rp_config_stage_replicas(const rp_config *cfg, int s);

void rp_config_derive(const rp_config *cfg, rp_derived *out);

/* sizeof(rp_config), for bindings that hold one without its definition
** (Python's ctypes). */
size_t rp_config_size(void);

const char *rp_output_mode_name(rp_output_mode m);
const char *rp_schedule_name(rp_schedule s);
const char *rp_optimizer_name(rp_optimizer_type t);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_CONFIG_H */
