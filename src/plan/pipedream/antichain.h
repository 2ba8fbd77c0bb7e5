/*
** The antichain DAG of a profile graph (internal to the planner).
**
** A state is an antichain of the profile graph, "augmented" with the nodes
** whose outputs still cross it; states are ordered by a depth-first
** topological sort of the antichain DAG (PipeDream's construction, with a
** fixed order where PipeDream iterates hash sets: see antichain.c).
*/
#ifndef REPIPE_ANTICHAIN_H
#define REPIPE_ANTICHAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "repipe/profile.h"

typedef struct rp_states {
    int n;                   /* number of states */
    double *compute;         /* C[s]: seconds of all predecessors of state s */
    double *activation;      /* bytes, cumulative like compute */
    double *parameter;       /* bytes, cumulative like compute */
    double *out_activation;  /* bytes leaving the augmented antichain */
    /* pred[s]: the DAG predecessors of s by descending compute, ties by
    ** descending state (the order the planner scans split points in) */
    int **pred;
    int *num_pred;
    int *pred_all; /* the lists, one after another */
    /* Per state, the profile nodes it covers (all predecessors of its
    ** augmented antichain), as a bitset of nwords words over the nodes. */
    int nwords;
    uint64_t *covers;
    /* Nodes removed before planning: Input sources (stage 0) and
    ** __getitem__ sinks (no stage). */
    unsigned char *input_source; /* per profile node */
} rp_states;

/* Builds the states, at most max_states of them (0: no limit): past that
** the exploration stops with RP_ERR_INFEASIBLE, the message saying how many
** states it had found and how long it took, before the memory a larger DAG
** would take is spent. */
rp_status rp_states_build(const rp_profile *p, int max_states, rp_states *out, rp_error *err);
void rp_states_free(rp_states *s);

/* PipeDream's Graph.compress_branches (compress.c): every branch that runs
** as a chain from a fork to a join as one node. member_of (num_nodes
** entries) receives the compressed node each profile node went into. */
rp_status rpi_profile_compress_branches(const rp_profile *p, rp_profile **out, int *member_of,
                                        rp_error *err);

#endif /* REPIPE_ANTICHAIN_H */
