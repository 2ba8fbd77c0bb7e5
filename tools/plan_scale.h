/*
** repipe plan --cluster (plan_scale.c): a transformer's tensor, context,
** pipeline and data-parallel sizes, micro-batch, chunks a rank,
** recomputation, sharding and precision on a cluster of devices.
*/
#ifndef REPIPE_TOOLS_PLAN_SCALE_H
#define REPIPE_TOOLS_PLAN_SCALE_H

#include "cli.h"
#include "plan_trainers.h"
#include "repipe/repipe.h"

typedef struct plan_scale {
    const char *cluster, *transformer, *transformer_config, *profile, *json, *config_out;
    /* the words of --recompute, --sequence-parallel, --sharding, --precision,
    ** --overlap, --stages (NULL: not given) */
    const char *recompute, *sequence_parallel, *sharding, *precision, *overlap, *stages;
    const plan_emit *emit;
    rp_scale_options o;
} plan_scale;

/* The plan, printed (and written as JSON, a configuration and a trainer's
** settings where asked: every file whole, and none unless all are ready).
** Returns the command's exit status. */
int plan_scale_run(const cli_cmd *cmd, const plan_scale *ps);

#endif /* REPIPE_TOOLS_PLAN_SCALE_H */
