/*
** Devices and clusters as data (transformers on them: transformer.h).
**
** A device is what its datasheet says (peak dense FLOP/s, memory, memory
** bandwidth) and how much of it its kernels reach: a matrix product of
** smallest dimension d reaches gemm_efficiency * d / (d + gemm_half) of the
** peak, an elementwise kernel memory_efficiency of the bandwidth. These are
** set once per device, not per model (src/device/device.c says where each
** number comes from). A cluster is nodes of such devices: the link between
** the devices of a node and each device's link between nodes, as a ring
** all-reduce of NCCL's moves bytes over them, and a message's latency.
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
    double peak_fp8;          /* dense fp8 FLOP/s [0: no fp8 products] */
    double peak_fp32;         /* dense fp32 FLOP/s of products [0: no fp32 runs] */
    double memory_bytes;
    double memory_bandwidth;  /* bytes/s */
    double gemm_efficiency;   /* the share of peak_flops large matrix products reach */
    double gemm_half;         /* the smallest dimension at which they reach half of that */
    /* the share of peak_fp8 large fp8 products reach, their inputs' casts
    ** and scales included [gemm_efficiency] */
    double fp8_efficiency;
    double memory_efficiency; /* the share of memory_bandwidth elementwise kernels reach */
    /* the share of peak_flops a fused attention kernel (FlashAttention,
    ** cuDNN's) reaches on long sequences, forward and backward together */
    double attention_efficiency;
    /* seconds a transformer block's pass of one micro-batch costs beyond its
    ** kernels' work (their launches, the framework's own time), forward and
    ** each half of the backward alike: a trainer's profile's intercept, as
    ** Galvatron fits one [0: Megatron-LM's fused kernels hide it] */
    double block_latency;
    /* what a trainer keeps for its backward over repipe's count of it (a
    ** measured or another planner's count; the cluster planner's runs carry
    ** it) [1] */
    double activation_scale;
    /* tensor_efficiency[k]: what a rank of a tensor group of 2^k (k 1 to 7)
    ** reaches of the rates its split kernels' shapes predict, its products,
    ** attention and elementwise kernels alike (not its collectives): a
    ** trainer's profile at each group size over repipe's prediction of it
    ** [0: 1] */
    double tensor_efficiency[8];
} rp_device;

typedef struct rp_cluster {
    char name[32];
    rp_device device;
    int per_node;             /* devices a node */
    double node_bandwidth;    /* bytes/s a device moves to the others of its node */
    double network_bandwidth; /* bytes/s a device moves to other nodes */
    double latency;           /* seconds a message */
} rp_cluster;

/* A preset by name (rp_device_presets, rp_cluster_presets), or a JSON file of the same keys (a cluster's
** "device" a preset's name or an object). */
rp_status rp_device_get(const char *name_or_file, rp_device *out, rp_error *err);
rp_status rp_cluster_get(const char *name_or_file, rp_cluster *out, rp_error *err);
/* The presets' names, NULL-terminated. */
const char *const *rp_device_presets(void);
const char *const *rp_cluster_presets(void);

/* The device's tensor_efficiency for a tensor group of t (1 for t = 1, and
** where none is given). */
double rp_device_tensor_efficiency(const rp_device *d, int t);

/* Seconds of an all-to-all in which each of n ranks sends `bytes` in all,
** an n-th to each (its own n-th stays), the ranks `stride` apart in a node's
** order (a mixture's expert group: its expert tensor group's size): what
** stays in a node moves at the node's link and what leaves it at the
** network's, both at once, after one message's latency. */
double rp_cluster_all_to_all(const rp_cluster *c, int n, int stride, double bytes);

/* Options to simulate `workers` workers of t devices each (a tensor group,
** or a tensor group times a context group) on the cluster: t devices of a
** node share a worker, so a node holds per_node / t of them (a worker wider
** than a node spans per t / per_node nodes); transfers and reductions between them take the
** node's link, between nodes the network's; the optimizer's pass reads and
** writes a parameter's mixed-precision state at the device's memory
** bandwidth. Fails where t does not divide a node. */
rp_status rp_cluster_sim_options(const rp_cluster *c, int t, int workers, rp_sim_options *o,
                                 rp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_DEVICE_H */
