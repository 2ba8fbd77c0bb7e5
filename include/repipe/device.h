/*
** Devices and clusters as data, and transformer profiles from shapes.
**
** A device is what its datasheet says (peak dense FLOP/s, memory, memory
** bandwidth) and how much of it its kernels reach: a matrix product of
** smallest dimension d reaches gemm_efficiency * d / (d + gemm_half) of the
** peak, an elementwise kernel memory_efficiency of the bandwidth. These are
** set once per device, not per model (src/device/device.c says where each
** number comes from). A cluster is nodes of such devices: the link between
** the devices of a node and each device's link between nodes, as a ring
** all-reduce of NCCL's moves bytes over them, and a message's latency.
**
** A transformer profile (rp_transformer_profile) is the embedding, the
** blocks and the head of a GPT-style model as a chain profile, priced on
** a device for one micro-batch and one tensor-parallel size t: each node is
** one rank of a tensor group of t, its share of the work and of the
** parameters, its group's all-reduces inside the node included, the
** activations it keeps for its backward (bf16, attention's scores too where
** the attention kernel keeps them) and what it keeps when recomputed (its
** input). 'repipe simulate' and 'repipe plan' run such a profile with t
** devices to a worker (docs/simulate.md "Transformers on GPU clusters").
*/
#ifndef REPIPE_DEVICE_H
#define REPIPE_DEVICE_H

#include <stdbool.h>

#include "repipe/core.h"
#include "repipe/simulate.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rp_device {
    char name[32];
    double peak_flops;        /* dense bf16 (fp16 where there is no bf16) FLOP/s */
    double memory_bytes;
    double memory_bandwidth;  /* bytes/s */
    double gemm_efficiency;   /* the share of peak_flops large matrix products reach */
    double gemm_half;         /* the smallest dimension at which they reach half of that */
    double memory_efficiency; /* the share of memory_bandwidth elementwise kernels reach */
} rp_device;

typedef struct rp_cluster {
    char name[32];
    rp_device device;
    int per_node;             /* devices a node */
    double node_bandwidth;    /* bytes/s a device moves to the others of its node */
    double network_bandwidth; /* bytes/s a device moves to other nodes */
    double latency;           /* seconds a message */
} rp_cluster;

/* A preset by name (a100-80gb, h100-80gb, v100-32gb; clusters dgx-a100,
** dgx-h100, dgx-v100), or a JSON file of the same keys (a cluster's
** "device" a preset's name or an object). */
rp_status rp_device_get(const char *name_or_file, rp_device *out, rp_error *err);
rp_status rp_cluster_get(const char *name_or_file, rp_cluster *out, rp_error *err);
/* The presets' names, NULL-terminated. */
const char *const *rp_device_presets(void);
const char *const *rp_cluster_presets(void);

/* Options to simulate `workers` workers of t devices each (a tensor group)
** on the cluster: t devices of a node share a worker, so a node holds
** per_node / t of them; transfers and reductions between them take the
** node's link, between nodes the network's; the optimizer's pass reads and
** writes a parameter's mixed-precision state at the device's memory
** bandwidth. Fails where t does not divide a node. */
rp_status rp_cluster_sim_options(const rp_cluster *c, int t, int workers, rp_sim_options *o,
                                 rp_error *err);

typedef struct rp_transformer {
    int layers, hidden, heads, seq, vocab;
    int ffn;   /* the MLP's width [0: 4 x hidden] */
    bool flash; /* the attention kernel keeps no scores (FlashAttention) [false] */
} rp_transformer;

/* "layers=L,hidden=H,heads=A,seq=S,vocab=V[,ffn=F][,flash=1]". */
rp_status rp_transformer_parse(const char *spec, rp_transformer *out, rp_error *err);

/* The profile (graph.txt text) of the model for micro-batches of b
** sequences on tensor groups of t devices of cluster c. The caller frees
** *out. */
rp_status rp_transformer_profile(const rp_transformer *m, const rp_cluster *c, int b, int t,
                                 char **out, rp_error *err);
/* The model's shape and t from a profile rp_transformer_profile wrote
** (its Input's description); false for any other profile. */
bool rp_transformer_of_profile(const char *input_desc, rp_transformer *m, int *t);

/* FLOPs of an update of `samples` sequences as Megatron-LM counts them
** (Narayanan et al., SC'21, equation 3: forward, recomputed forward and
** backward of the blocks, forward and backward of the head):
** 96 B s l h^2 (1 + s / 6h + V / 16 l h). */
double rp_transformer_flops(const rp_transformer *m, double samples);

/* Plans for a transformer on a cluster (src/device/scale.c): tensor,
** pipeline and data-parallel sizes, micro-batch, virtual stages (1f1b, or
** interleaved-1f1b with 2 or 4 chunks a rank) and recomputation, for a
** global batch on `devices` devices within their memory. Every shape is
** priced by the pipeline's steady state and fill from its stages' times
** (the stages cut to balance them, the embedding and the head included),
** the replicas' reduction and the optimizer's pass; the best few that fit
** by the same count of memory are simulated exactly (rp_simulate), and the
** fastest of those that fit by the simulation wins. */
typedef struct rp_scale_options {
    long long global_batch; /* sequences an update (required) */
    int devices;            /* (required) */
    int tensor_parallel;    /* 0: any of 1, 2, 4, 8 that divide a node, the heads and the vocabulary */
    int pipeline_parallel;  /* 0: any that divides the devices left */
    int micro_batch;        /* 0: any of 1, 2, 4, 8 */
    int recompute;          /* 0: either; 1: every block recomputed; -1: none */
    int candidates;         /* the best estimates simulated exactly [3] */
    /* bit s set for each schedule s the search may choose [0: Megatron-LM's,
    ** 1f1b and interleaved-1f1b]; with RP_SCHEDULE_DUALPIPEV, DualPipeV's V
    ** too (two chunks a rank, gradient accumulation of twice the ranks or
    ** more) */
    unsigned schedules;
} rp_scale_options;

void rp_scale_options_default(rp_scale_options *o);

typedef struct rp_scale_plan {
    rp_config cfg; /* the configuration (tensor_parallel t; the profile of b and t holds it) */
    int t, p, d, b, v;
    bool recompute;
    double seconds;           /* simulated, an update */
    double tflops_per_device; /* equation 3 over it */
    double peak_bytes;        /* the most a device holds, simulated */
    int considered, simulated;
} rp_scale_plan;

rp_status rp_scale_plan_compute(const rp_transformer *m, const rp_cluster *c,
                                const rp_scale_options *o, rp_scale_plan *out, rp_error *err);

/* One configuration of the model on the cluster, simulated (cfg's
** tensor_parallel t: the profile of its micro-batch and t is made here). */
rp_status rp_scale_simulate(const rp_transformer *m, const rp_cluster *c, const rp_config *cfg,
                            double *seconds, double *peak_bytes, rp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_DEVICE_H */
