/*
** The simulator's books (simulate.c sets them up, sim_play.c plays the
** operation lists on them): each worker's place in its list, the
** reduction groups, and one simulation's state. Not part of the API.
*/
#ifndef REPIPE_SIM_PLAY_H
#define REPIPE_SIM_PLAY_H

#include <stdbool.h>

#include "repipe/schedule.h"
#include "repipe/simulate.h"
#include "simulate_impl.h"

/* A worker in the simulation: at its operation pc, computing (work
** seconds of compute left) or waiting until a known time, or blocked. */
typedef struct sim_worker {
    int pc, held;
    bool started;    /* the operation at pc has begun, at t0 */
    double t0;
    double work;     /* compute left, seconds at full speed; -1: not computing */
    double until;    /* end of a wait whose end is known; -1: none */
    double arrive;   /* when it reached the reduction; -1: not yet */
    double reducing; /* the allreduce's own time, for the bubble */
    double copying;  /* time spent copying messages */
    int rounds;      /* reductions passed */
    bool at_norm;    /* waiting at its step for every worker's norm (clipping, loss scaling) */
    int steps;       /* such waits passed */
    int flow;        /* the group whose reduction it waits for on the network; -1: none */
    long long delivers; /* a send being copied: the message it makes available */
    double lb0, lb1;    /* its last backward (or weights' half): when it ran */
} sim_worker;

/* A reduction group: a stage's workers in one replica group. */
typedef struct red_group {
    int n, first, top, arrived;
    rpi_reduction how; /* the algorithm its allreduce runs */
    double *last; /* per round of reductions, its last arrival */
    int round;    /* the round of its reduction on the network, if active */
    bool active;
    double left;  /* seconds of it left at the link's full rate */
    double share; /* the flows it shares its busiest link with, itself too */
    int bucket_round; /* the round whose buckets' time is in bucket_cost (0: none yet) */
    double bucket_cost;
} red_group;

/* One simulation: the operation lists played, their prices, and the
** clock's books. */
typedef struct sim {
    const rp_config *cfg;
    const rp_sim_options *opt;
    rp_sim_result *res;
    rp_workplan *plan;
    rpi_cluster net;
    rpi_stage_costs c;
    rpi_buckets bk;
    int P, W, T, G, GA, D;
    bool buckets;   /* reduction_bucket_mb across machines */
    bool cpu;       /* one machine: the workers' cores copy and sum */
    bool norm_sync; /* every worker waits at its step for all the norms */
    double membw;   /* bytes/s of one pass over the parameters at the step */
    double wire_sum; /* the replicas' sums' bytes per float's 4 */
    int done;       /* workers through their list */
    int normed;     /* workers that reached their step's norm, over every update */
    sim_worker *sw;
    int *dpc;       /* each device's next operation */
    int *pos;       /* where each worker runs: its device, or itself */
    double *avail;  /* when each message is available: per (to, kind, mb) */
    double *copy;   /* a message's copy left to its receiver: the sender did not wait */
    double *link_free; /* across machines, when each worker's link is free */
    int *gid;       /* each worker's reduction group */
    red_group *rg;
    double *lasts;  /* the groups' last arrivals, rounds of them each */
    int *shared;    /* links_shared's counts */
    double *mt0, *mt1; /* a group's members' last backwards, for the buckets */
} sim;

/* Plays the operation lists from time 0 to the last one's end (*end). */
rp_status rpi_sim_play(sim *m, double *end, rp_error *err);

#endif /* REPIPE_SIM_PLAY_H */
