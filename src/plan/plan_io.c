/*
** Plan output: JSON (the parity fixtures' keys) and PipeDream's
** hybrid_conf.json.
*/
#include "../core/json.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "repipe/planner.h"

static rp_status finish(cJSON *root, char **out, rp_error *err) {
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text)
        return rpi_json_nomem("a plan's JSON", err);
    size_t n = strlen(text);
    *out = malloc(n + 2);
    if (*out) {
        memcpy(*out, text, n);
        memcpy(*out + n, "\n", 2);
    }
    cJSON_free(text);
    return *out ? RP_OK : rp_fail(err, RP_ERR_NOMEM, "out of memory");
}

static cJSON *rank_map(const rp_plan *p) {
    cJSON *m = cJSON_CreateObject();
    for (int s = 0; s < p->num_stages; s++) {
        char key[16];
        snprintf(key, sizeof key, "%d", s);
        cJSON *ranks = cJSON_CreateArray();
        for (int r = 0; r < p->num_workers; r++)
            if (p->worker_stage[r] == s)
                cJSON_AddItemToArray(ranks, cJSON_CreateNumber(r));
        cJSON_AddItemToObject(m, key, ranks);
    }
    return m;
}

size_t rp_plan_pipedream_stage_map(const rp_plan *p, char *buf, size_t cap) {
    size_t at = 0;
    for (int s = 0; s < p->num_stages; s++) {
        int k = snprintf(at < cap ? buf + at : NULL, at < cap ? cap - at : 0, "%s%d:%d",
                         s ? "," : "", s, p->stage_num_ranks[s]);
        at += (size_t)k;
    }
    if (cap && at >= cap)
        buf[cap - 1] = '\0';
    if (!p->num_stages && cap)
        buf[0] = '\0';
    return at;
}

/* The stage_to_rank_map convert_graph_to_model.py writes for that map:
** stage s takes the next stage_num_ranks[s] ranks. */
static cJSON *contiguous_rank_map(const rp_plan *p) {
    cJSON *m = cJSON_CreateObject();
    for (int s = 0, first = 0; s < p->num_stages; first += p->stage_num_ranks[s++]) {
        char key[16];
        snprintf(key, sizeof key, "%d", s);
        cJSON *ranks = cJSON_CreateArray();
        for (int r = first; r < first + p->stage_num_ranks[s]; r++)
            cJSON_AddItemToArray(ranks, cJSON_CreateNumber(r));
        cJSON_AddItemToObject(m, key, ranks);
    }
    return m;
}

static cJSON *plan_json(const rp_plan *p, const rp_profile *profile) {
    cJSON *r = cJSON_CreateObject();
    const rp_plan_options *o = &p->options;
    cJSON *opt = cJSON_CreateObject();
    cJSON_AddItemToObject(opt, "machines", cJSON_CreateIntArray(o->machines, o->num_levels));
    cJSON_AddItemToObject(opt, "bandwidths", cJSON_CreateDoubleArray(o->bandwidth, o->num_levels));
    cJSON_AddNumberToObject(opt, "memory_size", o->memory_size);
    cJSON_AddBoolToObject(opt, "straight_pipeline", o->straight);
    cJSON_AddBoolToObject(opt, "use_memory_constraint", o->memory_constraint);
    cJSON_AddBoolToObject(opt, "use_fewer_machines", o->fewer_machines);
    if (o->activation_compression > 0)
        cJSON_AddNumberToObject(opt, "activation_compression_ratio", o->activation_compression);
    else
        cJSON_AddNullToObject(opt, "activation_compression_ratio");
    cJSON_AddItemToObject(r, "options", opt);
    cJSON_AddNumberToObject(r, "num_states", p->num_states);
    cJSON *levels = cJSON_AddArrayToObject(r, "levels");
    for (int l = 0; l < p->num_levels; l++) {
        const rp_plan_level *lv = &p->levels[l];
        cJSON *jl = cJSON_CreateObject();
        cJSON_AddNumberToObject(jl, "level", lv->level);
        cJSON_AddNumberToObject(jl, "machines", lv->machines);
        cJSON_AddNumberToObject(jl, "bandwidth", lv->bandwidth);
        cJSON *stages = cJSON_AddArrayToObject(jl, "stages");
        for (int s = 0; s < lv->num_stages; s++) {
            const rp_plan_stage *ps = &lv->stages[s];
            cJSON *js = cJSON_CreateObject();
            cJSON_AddNumberToObject(js, "start", ps->start);
            cJSON_AddNumberToObject(js, "end", ps->end);
            cJSON_AddNumberToObject(js, "compute_time", ps->compute_time);
            cJSON_AddNumberToObject(js, "replication", ps->replication);
            cJSON_AddNumberToObject(js, "parent", ps->parent);
            cJSON_AddNumberToObject(js, "activation_bytes", ps->activation_bytes);
            cJSON_AddNumberToObject(js, "parameter_bytes", ps->parameter_bytes);
            cJSON_AddItemToArray(stages, js);
        }
        cJSON_AddNumberToObject(jl, "total_stages", lv->num_stages);
        cJSON_AddItemToArray(levels, jl);
    }
    cJSON_AddNumberToObject(r, "single_stage_time", p->single_stage_time);
    cJSON_AddNumberToObject(r, "data_parallel_time", p->data_parallel_time);
    cJSON_AddNumberToObject(r, "pipeline_time", p->pipeline_time);
    cJSON_AddNumberToObject(r, "speedup_vs_single", p->speedup_vs_single);
    cJSON_AddNumberToObject(r, "dp_speedup_vs_single", p->dp_speedup_vs_single);
    cJSON_AddNumberToObject(r, "speedup_vs_dp", p->speedup_vs_dp);
    cJSON_AddNumberToObject(r, "machines_available", p->machines_available);
    cJSON_AddNumberToObject(r, "machines_used", p->machines_used);
    cJSON *ns = cJSON_AddObjectToObject(r, "node_stage");
    for (int i = 0; i < p->num_nodes; i++)
        if (p->node_stage[i] >= 0)
            cJSON_AddNumberToObject(ns, profile->nodes[i].id, p->node_stage[i]);
    cJSON_AddItemToObject(r, "stage_to_num_ranks",
                          cJSON_CreateIntArray(p->stage_num_ranks, p->num_stages));
    cJSON_AddItemToObject(r, "stage_to_rank_map", rank_map(p));
    cJSON *pd = cJSON_AddObjectToObject(r, "pipedream");
    size_t need = rp_plan_pipedream_stage_map(p, NULL, 0) + 1;
    char *map = malloc(need);
    if (map) {
        rp_plan_pipedream_stage_map(p, map, need);
        cJSON_AddStringToObject(pd, "stage_to_num_ranks_map", map);
        free(map);
    }
    cJSON_AddItemToObject(pd, "converted_stage_to_rank_map", contiguous_rank_map(p));
    /* what the engine runs, when the stages are runs of consecutive layers */
    rp_config cfg;
    rp_error ignored;
    rp_config_default(&cfg);
    if (rp_plan_to_config(p, profile, &cfg, NULL, 0, &ignored) == RP_OK) {
        cJSON *ec = cJSON_AddObjectToObject(r, "execution_config");
        cJSON_AddNumberToObject(ec, "replication_factor", cfg.replication_factor);
        cJSON_AddItemToObject(ec, "layers_per_stage",
                              cJSON_CreateIntArray(cfg.layers_per_stage.layers,
                                                   cfg.layers_per_stage.count));
        cJSON_AddItemToObject(ec, "stage_replication",
                              cJSON_CreateIntArray(cfg.stage_replication,
                                                   cfg.stage_replication_count));
    }
    return r;
}

rp_status rp_plan_to_json(const rp_plan *p, const rp_profile *profile, char **out,
                          rp_error *err) {
    return finish(plan_json(p, profile), out, err);
}

/* One row of the engine objective's comparison: its configuration whole,
** as rp_config_to_json writes it, so that it can be saved and run. */
static cJSON *autoplan_entry(const rp_autoplan_entry *e, rp_error *err) {
    cJSON *j = cJSON_CreateObject();
    if (!j) {
        rp_fail(err, RP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    cJSON_AddBoolToObject(j, "found", e->found);
    if (!e->found)
        return j;
    rp_derived d;
    rp_config_derive(&e->cfg, &d);
    /* workers: the machines it takes (a chunked schedule's device holds
    ** virtual_stages of the plan's workers), as the table says */
    cJSON_AddNumberToObject(j, "workers", rp_config_devices(&e->cfg, &d));
    cJSON_AddNumberToObject(j, "stages", d.stages);
    cJSON_AddNumberToObject(j, "seconds_per_update", e->seconds);
    cJSON_AddNumberToObject(j, "samples_per_second", (double)d.samples_per_update / e->seconds);
    cJSON_AddNumberToObject(j, "worker_bytes", e->worker_bytes);
    char *text;
    if (rp_config_to_json(&e->cfg, &text, err)) {
        cJSON_Delete(j);
        return NULL;
    }
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    if (!cfg) {
        cJSON_Delete(j);
        rp_fail(err, RP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    cJSON_AddItemToObject(j, "config", cfg);
    return j;
}

rp_status rp_autoplan_to_json(const rp_autoplan *a, long long global_batch, const rp_plan *plan,
                              const rp_profile *profile, char **out, rp_error *err) {
    cJSON *root = plan ? plan_json(plan, profile) : NULL;
    cJSON *e = cJSON_CreateObject();
    if (!e || (plan && !root)) {
        cJSON_Delete(e), cJSON_Delete(root);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    cJSON_AddNumberToObject(e, "global_batch", (double)global_batch);
    cJSON_AddNumberToObject(e, "simulated", a->simulated);
    static const char *const names[] = {"best",          "single",
                                        "data_parallel", "pipedream",
                                        "pipeline_1f1b", "pipeline_zero_bubble",
                                        "tensor_parallel", "pipeline_interleaved",
                                        "equal_devices"};
    const rp_autoplan_entry *rows[] = {&a->best,      &a->single,        &a->data_parallel,
                                       &a->pipedream, &a->pipeline_1f1b, &a->pipeline_zero_bubble,
                                       &a->tensor_parallel, &a->pipeline_interleaved,
                                       &a->equal_devices};
    for (int k = 0; k < 9; k++) {
        cJSON *j = autoplan_entry(rows[k], err);
        if (!j) {
            cJSON_Delete(e), cJSON_Delete(root);
            return err->status;
        }
        cJSON_AddItemToObject(e, names[k], j);
    }
    if (!root)
        return finish(e, out, err);
    cJSON_AddItemToObject(root, "engine", e);
    return finish(root, out, err);
}

rp_status rp_plan_options_from_json(rp_plan_options *o, const char *text, size_t len,
                                    const char *name, rp_error *err) {
    rp_plan_options_default(o);
    cJSON *root;
    rp_status ps = rp_json_parse(text, len, name, &root, err);
    if (ps)
        return ps;
    const cJSON *opt = cJSON_GetObjectItem(root, "options");
    if (!opt)
        opt = root;
    const cJSON *mach = cJSON_GetObjectItem(opt, "machines"), *bw = cJSON_GetObjectItem(opt, "bandwidths");
    rp_status st = RP_OK;
    if (!cJSON_IsArray(mach) || cJSON_GetArraySize(mach) < 1 ||
        cJSON_GetArraySize(mach) > RP_PLAN_MAX_LEVELS ||
        (bw && (!cJSON_IsArray(bw) || cJSON_GetArraySize(bw) != cJSON_GetArraySize(mach)))) {
        st = rp_fail(err, RP_ERR_INVALID,
                     "%s: 'machines' must list 1 to %d levels, and 'bandwidths' as many", name,
                     RP_PLAN_MAX_LEVELS);
        goto done;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, mach) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : 0;
        if (!(v >= 1 && v <= RP_PLAN_MAX_MACHINES) || v != floor(v)) {
            st = rp_fail(err, RP_ERR_INVALID,
                         "%s: 'machines' level %d is %s; it must be a whole number from 1 to %d",
                         name, o->num_levels + 1, cJSON_IsNumber(e) ? "out of range" : "not a number",
                         RP_PLAN_MAX_MACHINES);
            goto done;
        }
        o->machines[o->num_levels++] = (int)v;
    }
    int n = 0;
    cJSON_ArrayForEach(e, bw) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0) || !isfinite(e->valuedouble)) {
            st = rp_fail(err, RP_ERR_INVALID,
                         "%s: 'bandwidths' level %d must be a positive number of bytes/s", name,
                         n + 1);
            goto done;
        }
        o->bandwidth[n++] = e->valuedouble;
    }
    const cJSON *v = cJSON_GetObjectItem(opt, "memory_size");
    if (cJSON_IsNumber(v))
        o->memory_size = v->valuedouble;
    o->straight = cJSON_IsTrue(cJSON_GetObjectItem(opt, "straight_pipeline"));
    o->memory_constraint = cJSON_IsTrue(cJSON_GetObjectItem(opt, "use_memory_constraint"));
    o->fewer_machines = cJSON_IsTrue(cJSON_GetObjectItem(opt, "use_fewer_machines"));
    v = cJSON_GetObjectItem(opt, "activation_compression_ratio");
    o->activation_compression = cJSON_IsNumber(v) ? v->valuedouble : 0;
done:
    cJSON_Delete(root);
    return st;
}

rp_status rp_plan_pipedream_conf(const rp_plan *p, char **out, rp_error *err) {
    cJSON *r = cJSON_CreateObject();
    /* One module per stage, then the loss, which runs on the last stage. */
    cJSON *mods = cJSON_AddArrayToObject(r, "module_to_stage_map");
    for (int s = 0; s < p->num_stages; s++)
        cJSON_AddItemToArray(mods, cJSON_CreateNumber(s));
    cJSON_AddItemToArray(mods, cJSON_CreateNumber(p->num_stages - 1));
    cJSON_AddItemToObject(r, "stage_to_rank_map", rank_map(p));
    return finish(r, out, err);
}
