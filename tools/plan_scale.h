/*
** repipe plan --cluster (plan_scale.c): a transformer's tensor, pipeline and
** data-parallel sizes, micro-batch, virtual stages and recomputation on a
** cluster of devices.
*/
#ifndef REPIPE_TOOLS_PLAN_SCALE_H
#define REPIPE_TOOLS_PLAN_SCALE_H

#include "cli.h"
#include "repipe/repipe.h"

typedef struct plan_scale {
    const char *cluster, *transformer, *profile, *json, *config_out;
    rp_scale_options o;
} plan_scale;

/* The plan, printed (and written as JSON and a configuration where asked).
** Returns the command's exit status. */
int plan_scale_run(const cli_cmd *cmd, const plan_scale *ps);

#endif /* REPIPE_TOOLS_PLAN_SCALE_H */
