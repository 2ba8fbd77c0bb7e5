/*
** repipe plan --emit (plan_trainers.c): the plan as another trainer's
** settings, or the best plan that trainer can run, with both predicted times.
*/
#ifndef REPIPE_TOOLS_PLAN_TRAINERS_H
#define REPIPE_TOOLS_PLAN_TRAINERS_H

#include "cli.h"
#include "repipe/repipe.h"

typedef struct plan_emit {
    bool on;
    rp_trainer trainer;
    const char *out; /* the settings, one option a line (NULL: printed only) */
} plan_emit;

/* Plan `want` (of the engine objective's comparison r: its best, or
** PipeDream's plan run synchronously) for e->trainer. Where the trainer
** cannot run it, says why, plans again over what it can run (the same
** profiles, base and options ao, narrowed by rp_trainer_restrict) and
** prints both predicted times; then prints (and writes to e->out, with the
** configuration to e->out.config.json) the settings of the plan it runs.
** Returns the command's exit status. */
int plan_emit_trainer(const cli_cmd *cmd, const plan_emit *e, const rp_profile *prof,
                      const rp_profile *const *profs, const double *batches, int np,
                      const rp_config *base, rp_autoplan_options ao,
                      const rp_autoplan_entry *want, const rp_autoplan *r);

#endif /* REPIPE_TOOLS_PLAN_TRAINERS_H */
