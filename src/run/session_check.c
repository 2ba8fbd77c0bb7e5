/*
** What a configuration may ask of a model, checked before a session is made
** (rp_session_check): every refusal names the key, the layer and its line,
** or the schedule, so that nothing starts that could not run. The session
** (src/run/session.c) makes nothing this has not passed, and `repipe
** config` asks it alone. It reads a model, a configuration and the
** schedules' own checks, nothing of a session, so it sits beside the
** schedules, below the sessions.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/schedule.h"
#include "repipe/session.h"
#include "../core/util.h"

static rp_status check(const rp_model *m, const rp_config *cfg, rp_error *err);

rp_status rp_session_check(const rp_model *m, const rp_config *cfg, rp_error *err) {
    if (!cfg->layers_count_blocks)
        return check(m, cfg, err);
    rp_config *fit = malloc(sizeof *fit);
    if (!fit)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a configuration");
    *fit = *cfg;
    rp_status st = rp_session_fit_config(m, fit, err);
    bool fitted = !st;
    if (fitted)
        st = check(m, fit, err);
    free(fit);
    int *first = st && fitted ? malloc(sizeof(int) * m->num_layers) : NULL, end;
    int B = first ? rp_model_blocks(m, first, &end) : 0;
    free(first);
    if (B > 0) { /* the layers the lists gave, as the file counted them */
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        rp_fail(err, st, "%s (the IPUConfig file's lists count the model's %d blocks, the "
                "embeddings on the first stage and the head on the last)", why, B);
    }
    return st;
}

/* The PipeDream schedules beside what they do not go with: sharded or
** offchip state (2BW), batch normalisation's running statistics (both),
** and under PipeDream's the features that sum over stages or replicas that
** update apart; and its stage replicas updating together. */
static rp_status check_pipedream(const rp_model *m, const rp_config *cfg, rp_error *err) {
    if (cfg->schedule == RP_SCHEDULE_PIPEDREAM_2BW &&
        (cfg->replicated_tensor_sharding || cfg->optimizer_state_offchip))
        return rp_fail(err, RP_ERR_INVALID,
                       "schedule \"pipedream_2bw\" does not go with %s",
                       cfg->replicated_tensor_sharding ? "replicated_tensor_sharding"
                                                       : "optimizer_state_offchip");
    for (int l = 0; l < m->num_layers && (cfg->schedule == RP_SCHEDULE_PIPEDREAM ||
                                           cfg->schedule == RP_SCHEDULE_PIPEDREAM_2BW); l++)
        if (m->layers[l].type == RP_LAYER_BATCHNORM2D ||
            m->layers[l].type == RP_LAYER_BATCHNORM1D)
            return rp_fail(err, RP_ERR_INVALID,
                           "schedule \"%s\" does not go with %s (line %d): its running "
                           "statistics follow the updates of one synchronous pipeline",
                           rp_schedule_name(cfg->schedule), rp_layer_name(m->layers[l].type),
                           m->layers[l].line);
    if (cfg->schedule != RP_SCHEDULE_PIPEDREAM)
        return RP_OK;
    const char *why = cfg->replicated_tensor_sharding ? "replicated_tensor_sharding"
                      : cfg->optimizer_state_offchip  ? "optimizer_state_offchip"
                      : cfg->gradient_clipping > 0    ? "gradient_clipping (a global norm "
                                                        "over stages that update apart)"
                      : cfg->auto_loss_scaling        ? "auto_loss_scaling"
                      : cfg->fp16_exchange     ? "fp16_exchange"
                      : cfg->replica_grouping.group_size != cfg->replication_factor
                          ? "replica groupings"
                          : NULL;
    for (int l = 0; !why && l < m->num_layers; l++)
        if (m->layers[l].tie || m->layers[l].group_size)
            why = m->layers[l].tie ? "tied layers" : "per-layer replica groupings";
    if (why)
        return rp_fail(err, RP_ERR_INVALID, "schedule \"pipedream\" does not go with %s", why);
    for (int t = 0; t < cfg->layers_per_stage.count; t++) {
        int r = rp_config_stage_replicas(cfg, t);
        if (cfg->gradient_accumulation_steps % r)
            return rp_fail(err, RP_ERR_INVALID,
                           "schedule \"pipedream\": stage %d's %d replicas update together, "
                           "so gradient_accumulation_steps (%d) must be a multiple of %d",
                           t, r, cfg->gradient_accumulation_steps, r);
    }
    return RP_OK;
}

/* Tied layers (as many as the engine holds, shared by every replica, not
** sharded apart) and embeddings whose rows split into the serialization's
** blocks. */
static rp_status check_layers(const rp_model *m, const rp_config *cfg, rp_error *err) {
    int nties = 0;
    for (int l = 0; l < m->num_layers; l++) {
        const rp_layer *L = &m->layers[l];
        if (L->tie) {
            const rp_layer *E = &m->layers[L->tie - 1];
            const char *why = ++nties > RP_MAX_TIES ? "more ties than the engine holds"
                              : cfg->replicated_tensor_sharding
                                  ? "replicated_tensor_sharding would shard the two copies apart: "
                                    "set it false, or untie the head (drop tie=)"
                              : L->group_size || E->group_size ||
                                      cfg->replica_grouping.group_size != cfg->replication_factor
                                  ? "its copies must be shared by every replica: drop the replica "
                                    "grouping, or untie the head (drop tie=)"
                                  : NULL;
            if (why)
                return rp_fail(err, RP_ERR_INVALID, "layer %d (linear, line %d) tie=%d: %s", l,
                               L->line, L->tie - 1, why);
        }
        int f[2] = {cfg->embedding_serialization_factor,
                    cfg->inference_embedding_serialization_factor};
        for (int k = 0; k < 2 && L->type == RP_LAYER_EMBEDDING; k++)
            if (L->vocab % f[k] != 0)
                return rp_fail(err, RP_ERR_INVALID,
                               "%sembedding_serialization_factor %d: the vocabulary of layer %d "
                               "(embedding, line %d) has %d rows, not a multiple of %d",
                               k ? "inference_" : "", f[k], l, L->line, L->vocab, f[k]);
    }
    return RP_OK;
}

/* Expert parallelism: groups of G replicas that run the same operations (a
** synchronous schedule whose replicas run alike), within the moe layers'
** replica groupings, and experts G divides. */
static rp_status check_experts(const rp_model *m, const rp_config *cfg, rp_error *err) {
    int G = cfg->expert_parallel, R = cfg->replication_factor, moe = 0;
    if (G <= 1)
        return RP_OK;
    const char *why = R % G ? "does not divide replication_factor"
                      : cfg->schedule >= RP_SCHEDULE_PIPEDREAM
                          ? "needs a synchronous schedule (not pipedream or pipedream-2bw: "
                            "the group's members would run different weight versions)"
                          : NULL;
    if (why)
        return rp_fail(err, RP_ERR_INVALID, "expert_parallel %d %s", G, why);
    for (int l = 0; l < m->num_layers; l++) {
        const rp_layer *L = &m->layers[l];
        if (L->type != RP_LAYER_MOE)
            continue;
        moe++;
        int g = L->group_size ? L->group_size : cfg->replica_grouping.group_size;
        int stride = L->group_size ? 1 : cfg->replica_grouping.stride;
        if (L->experts % G || g % G || stride != 1)
            return rp_fail(err, RP_ERR_INVALID,
                           "expert_parallel %d: layer %d (moe, line %d) %s", G, l, L->line,
                           L->experts % G ? "has a number of experts it does not divide"
                                          : "is reduced over a replica grouping that does not "
                                            "hold whole expert groups (group_size a multiple "
                                            "of it, stride 1)");
    }
    if (!moe)
        return rp_fail(err, RP_ERR_INVALID, "expert_parallel %d: the model has no moe layer", G);
    return RP_OK;
}

/* recompute_layers names the model's layers; a tensor group's nets are of
** a model split anew, whose layers it does not name. */
static rp_status check_recompute_layers(const rp_model *m, const rp_config *cfg, rp_error *err) {
    if (!cfg->recompute_layers_count)
        return RP_OK;
    int l = rp_config_last_recomputed(cfg);
    if (l >= m->num_layers)
        return rp_fail(err, RP_ERR_INVALID,
                       "recompute_layers: layer %d; the model's layers are 0 to %d", l,
                       m->num_layers - 1);
    if (rp_config_tensor_parallel(cfg) > 1)
        return rp_fail(err, RP_ERR_INVALID,
                       "recompute_layers with tensor_parallel %d: the layers of a tensor "
                       "group's split model are not the model's; recompute whole stages "
                       "(recompute_checkpoint_every_layer) there",
                       cfg->tensor_parallel);
    return RP_OK;
}

static rp_status check(const rp_model *m, const rp_config *cfg, rp_error *err) {
    if (m->num_classes == 0 || m->layers[m->num_layers - 1].type != RP_LAYER_SOFTMAX_CE)
        return rp_fail(err, RP_ERR_INVALID,
                       "the model must end with softmax_cross_entropy to be trained");
    int counts[RP_MAX_STAGES];
    rp_status st = rp_config_stage_layers(cfg, false, m->num_layers, counts, err);
    if (st)
        return st;
    if ((st = rp_schedule_check_config(cfg, err)))
        return st;
    if (rp_config_tensor_parallel(cfg) > 1) { /* the split must exist: its error names the line */
        rp_model *lm;
        size_t *map;
        if ((st = rp_model_tensor_split(m, cfg->tensor_parallel, 0, rp_config_tp_flags(cfg), &lm,
                                        &map, err)))
            return st;
        rp_model_free(lm);
        free(map);
    }
    if ((st = check_recompute_layers(m, cfg, err)) || (st = check_pipedream(m, cfg, err)) ||
        (st = check_layers(m, cfg, err)) ||
        (st = check_experts(m, cfg, err)))
        return st;
    rp_derived der;
    rp_config_derive(cfg, &der);
    for (int t = 0; t < der.stages; t++)
        if (counts[t] == 0)
            return rp_fail(err, RP_ERR_INVALID,
                           "layers_per_stage: stage %d has no layers; every stage of a training "
                           "pipeline needs at least one",
                           t);
    /* inference runs stage after stage: an empty one is allowed */
    return rp_config_stage_layers(cfg, true, m->num_layers, counts, err);
}

rp_status rp_session_fit_config(const rp_model *m, rp_config *cfg, rp_error *err) {
    if (!cfg->layers_count_blocks)
        return RP_OK;
    int L = m->num_layers, end, *first = malloc(sizeof(int) * L);
    if (!first)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for %d layers", L);
    int B = rp_model_blocks(m, first, &end);
    rp_layer_list lists[2];
    rp_status st = RP_OK;
    for (int inf = 0; B > 0 && !st && inf < 2; inf++) {
        int counts[RP_MAX_STAGES], n = rp_config_num_stages(cfg, inf);
        if ((st = rp_config_stage_layers(cfg, inf, B, counts, err)))
            break;
        lists[inf].count = n;
        for (int s = 0, b = 0; s < n; s++) {
            int lines = 0;
            for (int j = 0; j < counts[s]; j++, b++)
                lines += (b + 1 < B ? first[b + 1] : end) - first[b];
            lists[inf].layers[s] = lines + (s == 0 ? first[0] : 0) + (s == n - 1 ? L - end : 0);
        }
    }
    free(first);
    if (st) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return rp_fail(err, st, "%s (the lists count the model's %d blocks, as Optimum "
                       "Graphcore counts a transformer's layers)", why, B);
    }
    if (B > 0) { /* explicit counts of lines from here on */
        cfg->layers_per_stage = lists[0];
        cfg->inference_layers_per_stage = lists[1];
        cfg->inference_layers_set = true;
        cfg->layers_by_index = false;
    }
    cfg->layers_count_blocks = false;
    return RP_OK;
}
