/*
** What the schedule builder (schedule.c) and the orders of the V-shaped
** schedules (schedule_v.c) share.
*/
#ifndef REPIPE_SCHEDULE_IMPL_H
#define REPIPE_SCHEDULE_IMPL_H

#include "repipe/config.h"
#include "repipe/core.h"

/* A stage order's passes: a forward, a backward (whole, or its input's
** half) and a backward's weights' half. */
enum { PASS_F, PASS_B, PASS_W };

/* Each device's passes of one update in order, as (stage, pass, mb) at
** 6 GA r for device r: zb-v's list schedule, and DualPipeV's steps. */
rp_status rpi_zbv_orders(const rp_config *cfg, int *seq_stage, int *seq_pass, int *seq_mb,
                         rp_error *err);
void rpi_dualpipev_orders(const rp_config *cfg, int *seq_stage, int *seq_pass, int *seq_mb);

#endif /* REPIPE_SCHEDULE_IMPL_H */
