/*
** What the simulator and the engine's planner share: the machine hierarchy's
** prices and a worker's memory.
*/
#ifndef REPIPE_SIMULATE_IMPL_H
#define REPIPE_SIMULATE_IMPL_H

#include "repipe/config.h"
#include "repipe/simulate.h"

/* The machine hierarchy the workers are laid on: span[l] workers share a
** unit of level l, and bw[l] is the slowest link up to it. */
typedef struct rpi_cluster {
    int levels;
    long long span[RP_SIM_MAX_LEVELS];
    double bw[RP_SIM_MAX_LEVELS], latency;
} rpi_cluster;

/* From the options' levels (none: one level of W workers at 1e10 B/s);
** fails when the machines hold fewer than W workers. */
rp_status rpi_cluster_make(const rp_sim_options *o, int W, rpi_cluster *c, rp_error *err);

/* The innermost level whose units hold both workers. */
int rpi_level_of(const rpi_cluster *c, int a, int b);

/* Per stage of a configuration (counts[s] layers each, from the profile's
** per-layer figures): seconds of a micro-batch's forward f, backward b and
** a split backward's halves bi (input) and bw (weights), parameter bytes,
** and the bytes act[s] that stage s sends on with each micro-batch (its
** output, and the gradient that comes back for it). */
typedef struct rpi_stage_costs {
    double f[RP_MAX_STAGES], b[RP_MAX_STAGES], bi[RP_MAX_STAGES], bw[RP_MAX_STAGES];
    double par[RP_MAX_STAGES], act[RP_MAX_STAGES];
    double tp_sums[RP_MAX_STAGES]; /* a micro-batch's tensor-group all-reduces, both ways */
    double per_mb; /* the micro-batch over the profile's batch, which scales the times */
} rpi_stage_costs;
void rpi_stage_costs_make(const rp_config *cfg, const int *counts, int P, const double *fwd_ms,
                          const double *bwd_ms, const double *out_bytes,
                          const double *param_bytes, int num_layers, const rp_sim_options *opt,
                          rpi_stage_costs *c);

/* Seconds to allreduce `bytes` among n workers over links of bw bytes/s. */
double rpi_allreduce_time(int n, double bytes, double bw, double latency);

/* How a group of n workers all-reduces (sim_reduce.c): over the slowest
** level it spans, top; with open_mpi (--backend mpi) and 4 or more, a power
** of two, as Open MPI's recursive halving and doubling, at step i partners
** 2^i apart meeting over level lvl[i], crossing[i] of a unit's members
** through its link at once; with workers_per_server, when the group is
** laid out a server at a time, per_server members a server meeting inside
** one over level inner (0: flat). */
enum { RP_SIM_MAX_STEPS = 24 };
typedef struct rpi_reduction {
    int n, top, per_server, inner;
    int steps, lvl[RP_SIM_MAX_STEPS], crossing[RP_SIM_MAX_STEPS];
} rpi_reduction;
/* members: the group's m worker ids, ascending (read only with open_mpi or
** workers_per_server); pos: where each worker runs. */
void rpi_reduction_make(rpi_reduction *r, const rpi_cluster *net, const int *members, int m,
                        const int *pos, int top, bool open_mpi, int workers_per_server);
/* Seconds to all-reduce `bytes`; network: across machines (the chain over
** servers runs there only). */
double rpi_reduction_time(const rpi_reduction *r, double bytes, const rpi_cluster *net,
                          bool network);

/* Bytes a worker of a stage holds: layers [first, first + count) on r stage
** replicas, `slots` micro-batches in flight, per_mb = micro-batch / profile
** batch: parameters, gradients, optimizer state, activations; mpi: on MPI
** ranks, where reduction_bucket_mb keeps an exchange's copy of the
** gradients. */
double rpi_stage_bytes(const rp_config *cfg, const double *out_bytes, const double *param_bytes,
                       int first, int count, int r, int slots, double per_mb,
                       const rp_sim_options *opt);

/* The same a layer at a time, for a planner that grows a stage: begin at
** layer `first`, push the layers before the stage's last one by one, and
** read the bytes of the stage ending at layer `next` (kept as its last;
** the layers pushed are not last). rpi_stage_bytes is these, so each
** gives the same bytes. */
typedef struct rpi_stage_acc {
    const rp_config *cfg;
    const double *out_bytes, *param_bytes;
    const rp_sim_options *opt;
    const double *kept, *ck; /* what a layer keeps, and keeps when recomputed (or NULL) */
    bool split, rc, net;     /* backward split in two; recomputed; a profile of repipe's nets */
    bool by_layer;           /* recompute_layers */
    int T;                   /* the tensor group */
    int first, next;
    double acts, seg, most, par, scratch, grads; /* the running sums of the layers pushed */
} rpi_stage_acc;
void rpi_stage_acc_begin(rpi_stage_acc *a, const rp_config *cfg, const double *out_bytes,
                         const double *param_bytes, int first, const rp_sim_options *opt);
void rpi_stage_acc_push(rpi_stage_acc *a);
double rpi_stage_acc_bytes(const rpi_stage_acc *a, int r, int slots, double per_mb);
/* What the layers pushed hold without a run made again, their weights,
** gradients and state on r replicas and slots micro-batches of what they
** keep: a floor under every longer stage that recomputes by layer what a
** recomputes or less (with no slots and per_mb 0, its weights alone: a
** floor under every longer stage). */
double rpi_stage_acc_held(const rpi_stage_acc *a, int r, int slots, double per_mb);
/* The same for the stage ending at layer `next` (rpi_stage_acc_bytes's
** stage, without its run made again): a floor under its bytes with any of
** the layers a recomputes named (what every layer kept is summed in the
** same order, with fewer terms), so none fits where this does not. */
double rpi_stage_acc_least(const rpi_stage_acc *a, int r, int slots, double per_mb);

/* What a tensor group of T does to layer l (RP_SIM_TP_*): its tensor_split,
** nothing on one worker, where nothing is split, or where the profile was
** measured on a rank of the group (tensor_measured: it says the rank's
** share already). */
static inline unsigned rpi_tensor_split_of(const rp_sim_options *opt, int T, int l) {
    return T > 1 && opt && opt->tensor_split && !opt->tensor_measured ? opt->tensor_split[l] : 0;
}

/* reduction_bucket_mb: each stage's buckets, from its last layer down, as
** the engine starts them: the bytes of each and the fraction of the
** stage's last backward (its weights' half under the zero-bubble
** schedules) done when its lowest layer is, by the profile's times. */
typedef struct rpi_buckets {
    int first[RP_MAX_STAGES + 1]; /* stage s holds buckets [first[s], first[s + 1]) */
    double *bytes, *frac;
} rpi_buckets;
rp_status rpi_buckets_make(const rp_config *cfg, const int *counts, int P, const double *bwd_ms,
                           const double *param_bytes, const rp_sim_options *opt, rpi_buckets *b,
                           rp_error *err);
void rpi_buckets_free(rpi_buckets *b);
/* When the last of stage s's buckets is summed, its group's n members
** having run their last backward over [t0[i], t1[i]): a bucket starts once
** every member has it and the one before is over, and takes a ring's time
** of its bytes x wire over links of bw. */
double rpi_buckets_end(const rpi_buckets *b, int s, const double *t0, const double *t1, int n,
                       double bw, double latency, double wire);

#endif /* REPIPE_SIMULATE_IMPL_H */
