/*
** repipe plan's words for a plan (plan_print.c): its stages and workers, and
** the PipeDream commands that run it.
*/
#ifndef REPIPE_TOOLS_PLAN_PRINT_H
#define REPIPE_TOOLS_PLAN_PRINT_H

#include "repipe/repipe.h"

/* A node's description as a name: without the numbers 'repipe profile'
** records after it (its memory, a split backward's halves). Returns its length, to
** print with "%.*s". */
int plan_node_name_len(const char *desc);

/* The plan's levels, stages, workers and predicted times, on stdout. */
void plan_print(const rp_plan *p, const char *profile_path, const rp_profile *prof);

/* PipeDream's own commands for the plan: its code generator, with the stage
** map in the form it parses, and its runtime on every rank. */
void plan_print_pipedream(const rp_plan *p, const char *name, const char *graph_out,
                          const char *conf, long long batch);

#endif /* REPIPE_TOOLS_PLAN_PRINT_H */
