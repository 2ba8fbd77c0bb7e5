/*
** repipe simulate --cluster (sim_cluster.c): a configuration on a cluster of
** devices; with a transformer profile, its FLOP/s a device and each pipeline
** rank's memory beside the devices'.
*/
#ifndef REPIPE_TOOLS_SIM_CLUSTER_H
#define REPIPE_TOOLS_SIM_CLUSTER_H

#include <stdio.h>

#include "cli.h"
#include "repipe/repipe.h"

typedef struct sim_cluster {
    bool on;
    rp_cluster c;
    bool transformer; /* the profile is rp_transformer_profile's */
    rp_transformer m;
    rp_transformer_run run; /* its run: a micro-batch on a tensor and context group */
    int t;            /* devices a worker: its tensor group times its context group */
} sim_cluster;

/* Reads the cluster (a preset or a JSON file) and what the profile says of
** itself; a transformer profile of tensor groups of t runs the
** configuration (tensor_parallel 1 or t) with t devices a worker: cfg's
** tensor_parallel becomes 1, the profile's times already hold the group's
** share and its all-reduces. Sets opt for the workers. False (said) on
** error. */
bool sim_cluster_setup(const cli_cmd *cmd, const char *name, const rp_profile *p, rp_config *cfg,
                       rp_sim_options *opt, sim_cluster *sc);

/* The devices, each pipeline rank's peak memory (a list, bytes) beside the
** device's, and for a transformer its TFLOP/s a device (equation 3 over the
** predicted time); as words, and as JSON keys ("devices",
** "tflops_per_device", "peak_memory_per_rank", "device_memory_bytes") to
** add before an object's closing brace (the caller frees). */
/* Each pipeline rank's memory (bytes, into out[RP_MAX_STAGES]): its
** stage's estimate, or with interleaving the sum of its chunks'; for a
** transformer profile, rp_transformer_rank_memory's count. Returns the
** number of ranks. */
int sim_rank_bytes(const sim_cluster *sc, const rp_config *cfg, const rp_sim_result *res,
                   double *out);

void sim_cluster_print(FILE *f, const sim_cluster *sc, const rp_config *cfg,
                       const rp_sim_result *res);
char *sim_cluster_json(const sim_cluster *sc, const rp_config *cfg, const rp_sim_result *res);

#endif /* REPIPE_TOOLS_SIM_CLUSTER_H */
