/*
** Replica groupings (PopXL semantics).
**
** A grouping partitions R replicas into G = R / g groups of g replicas each.
** Members of a group are `stride` apart: with R = 16, g = 4, stride = 4 the
** groups are {0,4,8,12}, {1,5,9,13}, ... A variable with this grouping has
** one value per group; replicas of one group hold identical copies.
**
** PopXL's rules (docs/groupings.md): 1 <= stride <= R and stride a factor of
** R; 1 <= g <= R; with g == 1 the stride is set to 1; and R a multiple of
** stride * g (PopART's ReplicaGrouping; PopXL's own list of groups would
** leave replicas in none). Not given, the stride is 1 and g is R / stride.
*/
#ifndef REPIPE_GROUPING_H
#define REPIPE_GROUPING_H

#include <stdbool.h>
#include <stddef.h>

#include "repipe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rp_grouping {
    int replicas;   /* R */
    int group_size; /* g */
    int stride;     /* s */
} rp_grouping;

/* Validates and normalises (R, g, s) into *out. On failure the message
** states the rule and the numbers as given. */
rp_status rp_grouping_init(rp_grouping *out, int replicas, int group_size, int stride,
                           rp_error *err);
/* PopXL's ir.replica_grouping(stride, group_size) on R replicas, either
** argument possibly not given (NULL): the stride then is 1, the group size
** R / stride. */
rp_status rp_grouping_popxl(rp_grouping *out, int replicas, const int *stride,
                            const int *group_size, rp_error *err);

/* The default grouping: one group holding all R replicas. */
rp_grouping rp_grouping_all(int replicas);

int rp_grouping_num_groups(const rp_grouping *g);
/* Group of replica r (0 <= r < R). */
int rp_grouping_group_of(const rp_grouping *g, int replica);
/* Position of replica r inside its group (0 <= result < g). */
int rp_grouping_index_in_group(const rp_grouping *g, int replica);
/* Lowest replica of group k. */
int rp_grouping_first(const rp_grouping *g, int group);
/* Member i of group k, in ascending order. */
int rp_grouping_member(const rp_grouping *g, int group, int i);
/* Writes the g members of group k, ascending, into out[0..g-1]. */
void rp_grouping_members(const rp_grouping *g, int group, int *out);

/* The grouping whose groups take one replica from each group of g:
** (s=1, g) -> (s=g, g=G) and (s*g == R) -> (s=1, g=s). Other groupings' transposes
** have no stride (s=2, g=2 on 8 replicas: groups {0,1,4,5} and {2,3,6,7});
** for them this is an error, and PopXL's list of groups is
** rp_grouping_transpose_assignment's. */
rp_status rp_grouping_transpose(const rp_grouping *g, rp_grouping *out, rp_error *err);
/* The transpose as PopXL's assignment: out[r] is replica r's group of it, its
** index in its group of g (R entries). */
void rp_grouping_transpose_assignment(const rp_grouping *g, int *out);

bool rp_grouping_equal(const rp_grouping *a, const rp_grouping *b);

/* "replicas=16 group_size=4 stride=1 (4 groups)"; returns buf. */
char *rp_grouping_to_string(const rp_grouping *g, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_GROUPING_H */
