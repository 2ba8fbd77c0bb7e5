/*
** Execution configurations from plans: a plan's stages, replication and
** grouping as the engine's keys.
*/
#include <stdio.h>
#include <stdlib.h>

#include "../core/util.h"
#include "repipe/profile.h"
#include "repipe/planner.h"

rp_status rp_plan_to_config(const rp_plan *plan, const rp_profile *prof, rp_config *cfg,
                            char *explain, size_t explain_len, rp_error *err) {
    int S = plan->num_stages;
    if (S > RP_MAX_STAGES)
        return rp_fail(err, RP_ERR_INVALID, "the plan has %d stages, more than %d", S,
                       RP_MAX_STAGES);
    /* layers: the profile's nodes in topological order, Input sources left out */
    double *fw, *bw, *ob, *pb;
    int *node, L, counts[RP_MAX_STAGES] = {0}, last = 0;
    rp_status bad = rp_profile_layers(prof, &fw, &bw, &ob, &pb, &node, &L, err);
    if (bad)
        return bad;
    for (int k = 0; k < L && !bad; k++) {
        int i = node[k], st = plan->node_stage[i];
        if (st < 0)
            continue;
        if (st < last)
            bad = rp_fail(err, RP_ERR_INVALID,
                          "the plan puts node %s (line %d) in stage %d after a node of stage "
                          "%d: its stages are not consecutive runs of the profile's layers, so "
                          "they are not layers_per_stage",
                          prof->nodes[i].id, prof->nodes[i].line, st, last);
        last = st;
        counts[st]++;
    }
    free(fw), free(bw), free(ob), free(pb), free(node);
    if (bad)
        return bad;
    /* a top level that only replicates is the replication factor */
    int R = plan->levels[0].num_stages == 1 ? plan->levels[0].stages[0].replication : 1;
    cfg->replication_factor = R;
    cfg->layers_per_stage.count = S;
    cfg->stage_replication_count = S;
    for (int k = 0; k < S; k++) {
        cfg->layers_per_stage.layers[k] = counts[k];
        cfg->stage_replication[k] = plan->stage_num_ranks[k] / R;
    }
    if (cfg->matmul_proportion_count != 1 && cfg->matmul_proportion_count != S) {
        cfg->matmul_proportion_count = 1; /* a per-stage list of the old pipeline */
    }
    cfg->grouping_set = false;
    cfg->replica_grouping = rp_grouping_all(R);
    if (explain) {
        size_t at = (size_t)snprintf(explain, explain_len, "replication_factor %d, layers_per_stage [", R);
        for (int k = 0; k < S && at < explain_len; k++)
            at += (size_t)snprintf(explain + at, explain_len - at, "%s%d", k ? ", " : "", counts[k]);
        at += at < explain_len ? (size_t)snprintf(explain + at, explain_len - at, "], stage_replication [") : 0;
        for (int k = 0; k < S && at < explain_len; k++)
            at += (size_t)snprintf(explain + at, explain_len - at, "%s%d", k ? ", " : "",
                                   cfg->stage_replication[k]);
        if (at < explain_len)
            snprintf(explain + at, explain_len - at, "]: %s",
                     R > 1 ? "the top level replicates the whole pipeline, so its copies are "
                             "the replicas"
                           : "the stages of every level are flattened into one pipeline, each "
                             "stage on as many workers as the plan gives it");
    }
    return RP_OK;
}
