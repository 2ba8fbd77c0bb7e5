/*
** Replica groupings. All maps are closed-form; see grouping.h for the rules.
*/
#include "repipe/grouping.h"

#include <stdio.h>

/* PopXL's ir.replica_grouping(stride, group_size), in its order of checks:
** the stride within [1, R] and a factor of R, the group size within [1, R];
** a group of one has stride 1; and, as PopART's ReplicaGrouping requires
** (PopXL's own list of groups would leave replicas out), R a multiple of
** stride x group_size. `given` is what the user wrote, for the message. */
static rp_status check(rp_grouping *out, int R, int s, int g, const char *given, rp_error *err) {
    if (R < 1)
        return rp_fail(err, RP_ERR_INVALID, "replica grouping of %d replicas: there must be at "
                       "least one replica", R);
    if (s < 1 || s > R)
        return rp_fail(err, RP_ERR_INVALID, "replica grouping of %d replicas, %s: the stride "
                       "must be at least 1 and at most the number of replicas", R, given);
    if (R % s != 0)
        return rp_fail(err, RP_ERR_INVALID, "replica grouping of %d replicas, %s: the stride "
                       "must be a factor of the number of replicas", R, given);
    if (g < 1 || g > R)
        return rp_fail(err, RP_ERR_INVALID, "replica grouping of %d replicas, %s: the group "
                       "size must be at least 1 and at most the number of replicas", R, given);
    if (g == 1)
        s = 1; /* singletons: the stride has no meaning */
    if (R % (s * g) != 0)
        return rp_fail(err, RP_ERR_INVALID, "replica grouping of %d replicas, %s: the number "
                       "of replicas must be a multiple of stride x group size (%d), or some "
                       "replicas are in no group", R, given, s * g);
    out->replicas = R;
    out->group_size = g;
    out->stride = s;
    return RP_OK;
}

rp_status rp_grouping_init(rp_grouping *out, int replicas, int group_size, int stride,
                           rp_error *err) {
    char given[96];
    snprintf(given, sizeof given, "stride=%d group_size=%d", stride, group_size);
    return check(out, replicas, stride, group_size, given, err);
}

rp_status rp_grouping_popxl(rp_grouping *out, int replicas, const int *stride,
                            const int *group_size, rp_error *err) {
    int s = stride ? *stride : 1;
    char given[128];
    if (stride && group_size)
        snprintf(given, sizeof given, "stride=%d group_size=%d", *stride, *group_size);
    else if (stride)
        snprintf(given, sizeof given, "stride=%d (group_size not given: replicas / stride)",
                 *stride);
    else if (group_size)
        snprintf(given, sizeof given, "group_size=%d (stride not given: 1)", *group_size);
    else
        snprintf(given, sizeof given, "no stride or group_size (one group of all)");
    if (!group_size && (s < 1 || s > replicas))
        return check(out, replicas, s, 1, given, err); /* refused for the stride */
    int g = group_size ? *group_size : replicas / s;
    return check(out, replicas, s, g, given, err);
}

rp_grouping rp_grouping_all(int replicas) {
    rp_grouping g = {replicas, replicas, 1};
    return g;
}

int rp_grouping_num_groups(const rp_grouping *g) { return g->replicas / g->group_size; }

int rp_grouping_group_of(const rp_grouping *g, int r) {
    int span = g->stride * g->group_size;
    return (r % g->stride) + g->stride * (r / span);
}

int rp_grouping_index_in_group(const rp_grouping *g, int r) {
    return (r % (g->stride * g->group_size)) / g->stride;
}

int rp_grouping_first(const rp_grouping *g, int k) {
    return (k / g->stride) * g->stride * g->group_size + (k % g->stride);
}

int rp_grouping_member(const rp_grouping *g, int k, int i) {
    return rp_grouping_first(g, k) + i * g->stride;
}

void rp_grouping_members(const rp_grouping *g, int k, int *out) {
    for (int i = 0; i < g->group_size; i++)
        out[i] = rp_grouping_member(g, k, i);
}

rp_status rp_grouping_transpose(const rp_grouping *g, rp_grouping *out, rp_error *err) {
    int groups = rp_grouping_num_groups(g);
    if (g->stride == 1)
        return rp_grouping_init(out, g->replicas, groups, g->group_size, err);
    if (g->stride * g->group_size == g->replicas)
        return rp_grouping_init(out, g->replicas, g->stride, 1, err);
    return rp_fail(err, RP_ERR_INVALID,
                   "replica grouping of %d replicas, stride=%d group_size=%d: its transpose has "
                   "no stride (the distances between members differ), so it is no grouping of "
                   "a stride and a group size; PopXL holds it as a list of groups, which "
                   "collectives cannot use (rp_grouping_transpose_assignment gives it)",
                   g->replicas, g->stride, g->group_size);
}

void rp_grouping_transpose_assignment(const rp_grouping *g, int *out) {
    for (int r = 0; r < g->replicas; r++)
        out[r] = rp_grouping_index_in_group(g, r);
}

bool rp_grouping_equal(const rp_grouping *a, const rp_grouping *b) {
    return a->replicas == b->replicas && a->group_size == b->group_size &&
           a->stride == b->stride;
}

char *rp_grouping_to_string(const rp_grouping *g, char *buf, size_t n) {
    snprintf(buf, n, "replicas=%d group_size=%d stride=%d (%d group%s)", g->replicas,
             g->group_size, g->stride, rp_grouping_num_groups(g),
             rp_grouping_num_groups(g) == 1 ? "" : "s");
    return buf;
}
