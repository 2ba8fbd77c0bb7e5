/*
** repipe plan's engine objective (plan_engine.c): the fastest synchronous
** configuration of repipe's engine beside one worker, data parallelism and
** PipeDream's plan run synchronously, printed and written; and the plan run
** under a schedule (--schedule).
*/
#ifndef REPIPE_TOOLS_PLAN_ENGINE_H
#define REPIPE_TOOLS_PLAN_ENGINE_H

#include <stdio.h>

#include "cli.h"
#include "plan_trainers.h"
#include "repipe/repipe.h"

typedef struct plan_engine {
    const rp_profile *prof;
    const char *const *more; /* the same model profiled at other micro-batches */
    int num_more;
    const rp_plan *plan; /* PipeDream's, on the options o */
    const rp_plan_options *o;
    const char *base_config;
    long long global_batch, profile_batch, min_micro;
    double memory, latency;
    int cores, pp, tp;
    bool polling;
    const char *split_model; /* --tensor-split */
    const char *config_out;
    bool pipedream_out; /* write PipeDream's plan (run synchronously), not the engine's */
    const char *json;
    const plan_emit *emit;
    unsigned schedules;
    bool no_sharding;     /* --sharding none */
    bool whole_recompute; /* --recompute full: never by layer */
    int micro_batch;      /* --micro-batch B: exactly B samples [0: any] */
    const double *speed; /* per machine, its speed (--speed); NULL: all alike */
    const double *device_memory; /* per machine, its memory (--memory-size B1 B2 ...) */
} plan_engine;

/* Returns the command's exit status. */
int plan_engine_run(const cli_cmd *cmd, const plan_engine *x);
int plan_engine_mode(const cli_cmd *cmd, const rp_plan *plan, const rp_profile *prof,
                     const char *base_config, const char *schedule, int M, double device_memory,
                     FILE *out);
/* How to launch the configuration written to `config` on MPI ranks and
** under torchrun. */
void plan_print_launch(const rp_config *c, const rp_plan_options *o, const char *config);
/* text to path ("-": standard output); false, having said so, on failure */
bool plan_write_text(const cli_cmd *cmd, const char *path, const char *text);

#endif /* REPIPE_TOOLS_PLAN_ENGINE_H */
