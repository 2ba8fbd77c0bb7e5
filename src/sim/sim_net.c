/*
** The machine hierarchy the simulator lays workers on: who shares which
** link. Below both the stage costs (sim_costs.c) and the reductions
** (sim_reduce.c), which price messages and sums by the level two workers
** share.
*/
#include "simulate_impl.h"

/* The machine hierarchy the workers are laid on: span[l] workers share a
** unit of level l, and bw[l] is the slowest link up to it. */
rp_status rpi_cluster_make(const rp_sim_options *o, int W, rpi_cluster *c, rp_error *err) {
    c->latency = o->latency;
    if (o->num_levels == 0) {
        c->levels = 1;
        c->span[0] = W;
        c->bw[0] = 1e10;
        return RP_OK;
    }
    if (o->num_levels < 0 || o->num_levels > RP_SIM_MAX_LEVELS)
        return rp_fail(err, RP_ERR_INVALID, "simulate: %d levels of machines (1 to %d)",
                       o->num_levels, RP_SIM_MAX_LEVELS);
    c->levels = o->num_levels;
    long long n = 1;
    for (int l = 0; l < o->num_levels; l++) {
        if (o->machines[l] < 1 || !(o->bandwidth[l] > 0))
            return rp_fail(err, RP_ERR_INVALID,
                           "simulate: level %d has %d machines at %g bytes/s (need at least 1 "
                           "machine and a positive bandwidth)",
                           l + 1, o->machines[l], o->bandwidth[l]);
        n *= o->machines[l];
        c->span[l] = n;
        c->bw[l] = l == 0 || o->bandwidth[l] < c->bw[l - 1] ? o->bandwidth[l] : c->bw[l - 1];
    }
    if (n < W)
        return rp_fail(err, RP_ERR_INVALID,
                       "simulate: the configuration needs %d workers but the machines hold %lld",
                       W, n);
    return RP_OK;
}

/* The innermost level whose units hold both workers. */
int rpi_level_of(const rpi_cluster *c, int a, int b) {
    int l = 0;
    while (l < c->levels - 1 && a / c->span[l] != b / c->span[l])
        l++;
    return l;
}
