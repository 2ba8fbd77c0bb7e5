/*
** Replica groupings. All maps are closed-form; see grouping.h for the rules.
*/
#include "repipe/grouping.h"

#include <stdio.h>

rp_status rp_grouping_init(rp_grouping *out, int replicas, int group_size, int stride,
                           rp_error *err) {
    if (replicas < 1)
        return rp_fail(err, RP_ERR_INVALID,
                       "replica grouping: replicas must be >= 1 (got %d)", replicas);
    if (group_size < 1)
        return rp_fail(err, RP_ERR_INVALID,
                       "replica grouping: group_size must be >= 1 (got %d)", group_size);
    if (stride < 1)
        return rp_fail(err, RP_ERR_INVALID,
                       "replica grouping: stride must be >= 1 (got %d)", stride);
    if (group_size == 1)
        stride = 1; /* singletons: the stride has no meaning */
    if ((long long)stride * group_size > replicas || replicas % (stride * group_size) != 0)
        return rp_fail(err, RP_ERR_INVALID,
                       "replica grouping: replicas must be a multiple of stride * group_size "
                       "(replicas=%d, stride=%d, group_size=%d, stride * group_size=%lld)",
                       replicas, stride, group_size, (long long)stride * group_size);
    out->replicas = replicas;
    out->group_size = group_size;
    out->stride = stride;
    return RP_OK;
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
                   "replica grouping: replicas=%d group_size=%d stride=%d has no transpose "
                   "(needs stride == 1 or stride * group_size == replicas)",
                   g->replicas, g->group_size, g->stride);
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
