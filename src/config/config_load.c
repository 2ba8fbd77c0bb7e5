/*
** Loading an execution configuration: the JSON as Python's json module reads
** it (a key given twice keeps its last value, with a warning), then the
** readers of config_impl.h.
*/
#include "../core/json.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "config_impl.h"

rp_status rp_config_load_string_opts(rp_config *cfg, const char *text, size_t len,
                                     const char *name, const rp_config_load_options *opts,
                                     rp_error *err) {
    rp_config_default(cfg);
    cJSON *root;
    int dups;
    char first[128];
    rp_status s = rp_json_parse_config(text, len, name, &root, &dups, first, sizeof first, err);
    if (s)
        return s;
    if (!cJSON_IsObject(root)) {
        s = rp_fail(err, RP_ERR_PARSE, "%s: the configuration must be a JSON object", name);
        goto done;
    }
    rpi_load c = {.name = name, .err = err, .cfg = cfg};
    s = rpi_read_object(&c, root, opts && opts->pod_type && opts->pod_type[0] ? opts->pod_type
                                                                                 : NULL);
    /* a V is two chunks a worker: virtual_stages 2 unless given */
    if (!s && rp_config_v_shaped(cfg) && !cJSON_GetObjectItemCaseSensitive(root, "virtual_stages"))
        cfg->virtual_stages = 2;
    if (!s && dups)
        rpi_warn(cfg, "%s: key '%s'%s given more than once; the last value counts, as Python's "
                 "json module (and so IPUConfig) reads it", name, first,
                 dups > 1 ? " and others are" : " is");
done:
    cJSON_Delete(root);
    return s;
}

rp_status rp_config_load_string(rp_config *cfg, const char *text, size_t len, const char *name,
                                rp_error *err) {
    return rp_config_load_string_opts(cfg, text, len, name, NULL, err);
}

/* A configuration file's parse: where it goes and how it is read. */
struct config_file {
    rp_config *cfg;
    const rp_config_load_options *opts;
};

static rp_status parse_config(const char *text, size_t len, const char *path, void *out,
                              rp_error *err) {
    const struct config_file *f = out;
    return rp_config_load_string_opts(f->cfg, text, len, path, f->opts, err);
}

rp_status rp_config_load_file_opts(rp_config *cfg, const char *path,
                                   const rp_config_load_options *opts, rp_error *err) {
    struct config_file f = {cfg, opts};
    return rp_parse_file(path, false, parse_config, &f, err);
}

rp_status rp_config_load_file(rp_config *cfg, const char *path, rp_error *err) {
    return rp_config_load_file_opts(cfg, path, NULL, err);
}

rp_status rp_config_apply_plan(rp_config *cfg, const char *plan_text, size_t len,
                               const char *name, rp_error *err) {
    cJSON *root;
    rp_status ps = rp_json_parse(plan_text, len, name, &root, err);
    if (ps)
        return ps;
    const cJSON *ec = cJSON_GetObjectItem(root, "execution_config");
    rp_status s = RP_OK;
    if (!cJSON_IsObject(ec)) {
        s = rp_fail(err, RP_ERR_INVALID,
                    "%s: no 'execution_config': the plan's stages are not runs of consecutive "
                    "layers of a 'repipe profile' profile (PipeDream's objective cuts a graph "
                    "where its branches allow); the engine objective's are: write its "
                    "configuration with 'repipe plan --config-out FILE' and train with --config "
                    "FILE",
                    name);
        goto done;
    }
    /* through the loader, so that every value is validated */
    char *text = cJSON_PrintUnformatted(ec);
    if (!text) {
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    rp_config part;
    s = rp_config_load_string(&part, text, strlen(text), name, err);
    cJSON_free(text);
    if (s)
        goto done;
    cfg->replication_factor = part.replication_factor;
    cfg->layers_per_stage = part.layers_per_stage;
    cfg->stage_replication_count = part.stage_replication_count;
    memcpy(cfg->stage_replication, part.stage_replication, sizeof part.stage_replication);
    cfg->grouping_set = false;
    cfg->replica_grouping = rp_grouping_all(cfg->replication_factor);
    if (cfg->matmul_proportion_count != 1 &&
        cfg->matmul_proportion_count != cfg->layers_per_stage.count)
        cfg->matmul_proportion_count = 1;
done:
    cJSON_Delete(root);
    return s;
}

