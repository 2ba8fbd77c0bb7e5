/*
** What the schedule builder (schedule.c), the devices' orders
** (schedule_devices.c) and the orders of the V-shaped schedules
** (schedule_v.c) share.
*/
#ifndef REPIPE_SCHEDULE_IMPL_H
#define REPIPE_SCHEDULE_IMPL_H

#include "repipe/config.h"
#include "repipe/core.h"
#include "repipe/schedule.h"

/* A stage order's passes: a forward, a backward (whole, or its input's
** half) and a backward's weights' half. */
enum { PASS_F, PASS_B, PASS_W };

/* Each device's passes of one update in order, as (stage, pass, mb) at
** 6 GA r for device r: zb-v's list schedule, and DualPipeV's steps. */
rp_status rpi_zbv_orders(const rp_config *cfg, int *seq_stage, int *seq_pass, int *seq_mb,
                         rp_error *err);
void rpi_dualpipev_orders(const rp_config *cfg, int *seq_stage, int *seq_pass, int *seq_mb);

/* The worker of replica c's stage s as stage replica j, as if there were
** no tensor groups (schedule_devices.c). */
int rpi_base_worker(const rp_config *cfg, int c, int s, int j);

/* The chunked schedules and dualpipe (schedule_devices.c): each device's
** passes in order as (stage, pass, mb), and each stage's from them into
** kind and mbs at 3 GA s; then sc's devices over its workers' operations. */
rp_status rpi_device_orders(const rp_config *cfg, int *seq_stage, int *seq_pass, int *seq_mb,
                            int *kind, int *mbs, rp_error *err);
rp_status rpi_make_devices(const rp_config *cfg, rp_workplan *sc, const int *seq_stage,
                           const int *seq_mb, rp_error *err);

#endif /* REPIPE_SCHEDULE_IMPL_H */
