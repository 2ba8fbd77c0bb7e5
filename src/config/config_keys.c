/*
** repipe's own keys of the execution configuration (those no IPUConfig
** release reads), the rules between keys, and the message helpers both
** readers use. Each handler validates its own value and writes it; the
** rules between keys run once every key is in (docs/configuration.md).
*/
#include "../core/json.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "config_impl.h"

/* ---- messages ------------------------------------------------------------ */

/* The value as compact JSON for messages, truncated to fit. */
void rpi_value_text(const cJSON *v, char *buf, size_t n) {
    char *s = v ? cJSON_PrintUnformatted(v) : NULL;
    if (!s) {
        snprintf(buf, n, "?");
        return;
    }
    if (strlen(s) >= n && n > 4) {
        memcpy(buf, s, n - 4);
        strcpy(buf + n - 4, "...");
    } else {
        snprintf(buf, n, "%s", s);
    }
    cJSON_free(s);
}

rp_status rpi_bad_value(rpi_load *c, const char *key, const cJSON *v, const char *rule) {
    char vt[96];
    rpi_value_text(v, vt, sizeof vt);
    return rp_fail(c->err, RP_ERR_INVALID, "%s: key '%s': %s is invalid: %s%s", c->name, key,
                   vt, rule, c->as);
}

void rpi_warn(rp_config *cfg, const char *fmt, ...) {
    if (cfg->num_warnings >= RP_MAX_WARNINGS)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->warnings[cfg->num_warnings++], RP_WARNING_MAX, fmt, ap);
    va_end(ap);
}

/* ---- values ---------------------------------------------------------------- */

bool rpi_is_whole(const cJSON *v, double lo, double hi) {
    if (!cJSON_IsNumber(v) || (v->type & RP_JSON_FRACTION))
        return false;
    double d = v->valuedouble;
    return d == floor(d) && d >= lo && d <= hi;
}

rp_status rpi_get_int(rpi_load *c, const char *key, const cJSON *v, int lo, int *out) {
    if (!rpi_is_whole(v, lo, 1e9)) {
        char rule[96];
        snprintf(rule, sizeof rule, "must be a whole number >= %d%s", lo,
                 cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble)
                     ? ", written without a fraction"
                     : "");
        return rpi_bad_value(c, key, v, rule);
    }
    *out = (int)v->valuedouble;
    return RP_OK;
}

rp_status rpi_get_bool(rpi_load *c, const char *key, const cJSON *v, bool *out) {
    if (!cJSON_IsBool(v))
        return rpi_bad_value(c, key, v, "must be true or false");
    *out = cJSON_IsTrue(v);
    return RP_OK;
}

rp_status rpi_get_layer_list(rpi_load *c, const char *key, const cJSON *v, rp_layer_list *out) {
    if (!cJSON_IsArray(v))
        return rpi_bad_value(c, key, v, "must be a list of whole numbers >= -1 (-1 is a wildcard)");
    int n = cJSON_GetArraySize(v);
    if (n < 1)
        return rpi_bad_value(c, key, v, "must list at least one stage");
    if (n > RP_MAX_STAGES)
        return rpi_bad_value(c, key, v, "has more than 256 stages");
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!rpi_is_whole(e, -1, 1e9))
            return rpi_bad_value(c, key, v,
                                 "every entry must be a whole number >= -1 (-1 is a wildcard)");
        out->layers[i++] = (int)e->valuedouble;
    }
    out->count = n;
    return RP_OK;
}

/* ---- repipe's keys ------------------------------------------------------- */

typedef rp_status (*key_fn)(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v);

static rp_status k_micro_batch(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    return rpi_get_int(c, key, v, 1, &cfg->micro_batch_size);
}

static rp_status k_growth(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    return rpi_get_int(c, key, v, 1, &cfg->loss_scaling_growth_interval);
}

static rp_status k_vsync(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    return rpi_get_bool(c, key, v, &cfg->pipedream_vertical_sync);
}

/* zb-auto's relative pass times: three positive numbers, F, B and W */
static rp_status k_zb_times(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    const char *rule = "must be three positive numbers: the forward's, the input gradient's "
                       "and the weight gradient's relative times";
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 3)
        return rpi_bad_value(c, key, v, rule);
    for (int k = 0; k < 3; k++) {
        const cJSON *e = cJSON_GetArrayItem(v, k);
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0 && e->valuedouble <= 1e9))
            return rpi_bad_value(c, key, v, rule);
        cfg->zb_pass_times[k] = e->valuedouble;
    }
    return RP_OK;
}

static rp_status k_zb_limit(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    return rpi_get_int(c, key, v, 0, &cfg->zb_max_in_flight);
}

static rp_status k_tensor_parallel(rp_config *cfg, rpi_load *c, const char *key,
                                   const cJSON *v) {
    return rpi_get_int(c, key, v, 1, &cfg->tensor_parallel);
}

static rp_status k_expert_parallel(rp_config *cfg, rpi_load *c, const char *key,
                                   const cJSON *v) {
    return rpi_get_int(c, key, v, 1, &cfg->expert_parallel);
}

static rp_status k_virtual_stages(rp_config *cfg, rpi_load *c, const char *key,
                                  const cJSON *v) {
    return rpi_get_int(c, key, v, 1, &cfg->virtual_stages);
}

static rp_status k_vocab_parallel(rp_config *cfg, rpi_load *c, const char *key,
                                  const cJSON *v) {
    return rpi_get_bool(c, key, v, &cfg->vocab_parallel);
}

static rp_status k_fp16(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    return rpi_get_bool(c, key, v, &cfg->fp16_exchange);
}

/* The layer lists are IPUConfig's layers_per_ipu under repipe's name: the
** IPUConfig reader places them. */
static rp_status k_layers(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    (void)cfg;
    c->layers = v;
    c->layers_key = key;
    return RP_OK;
}

static rp_status k_inf_layers(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    (void)cfg;
    c->inference_layers = v;
    c->inference_layers_key = key;
    return RP_OK;
}

static rp_status k_optimizer(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    if (!cJSON_IsObject(v))
        return rpi_bad_value(c, key, v, "must be an object such as {\"type\": \"sgd\", \"lr\": 0.05}");
    rp_optimizer_config *o = &cfg->optimizer;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (t) {
        if (cJSON_IsString(t) && strcmp(t->valuestring, "sgd") == 0)
            o->type = RP_OPT_SGD;
        else if (cJSON_IsString(t) && strcmp(t->valuestring, "adam") == 0)
            o->type = RP_OPT_ADAM;
        else if (cJSON_IsString(t) && strcmp(t->valuestring, "adamw") == 0)
            o->type = RP_OPT_ADAMW;
        else
            return rpi_bad_value(c, "optimizer.type", t, "must be \"sgd\", \"adam\" or \"adamw\"");
    }
    if (o->type != RP_OPT_SGD)
        o->lr = 0.001; /* Adam's customary default, unless lr is given */
    static const char *const known[] = {"type", "lr", "momentum", "weight_decay",
                                        "beta1", "beta2", "eps"};
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        const char *k = e->string;
        if (strcmp(k, "type") == 0)
            continue;
        double *dst = NULL;
        double lo = 0, hi = INFINITY;
        bool open_lo = false, open_hi = false;
        if (strcmp(k, "lr") == 0) {
            dst = &o->lr;
            open_lo = true;
        } else if (strcmp(k, "momentum") == 0) {
            dst = &o->momentum;
            hi = 1;
            open_hi = true;
        } else if (strcmp(k, "weight_decay") == 0) {
            dst = &o->weight_decay;
        } else if (strcmp(k, "beta1") == 0) {
            dst = &o->beta1;
            hi = 1;
            open_hi = true;
        } else if (strcmp(k, "beta2") == 0) {
            dst = &o->beta2;
            hi = 1;
            open_hi = true;
        } else if (strcmp(k, "eps") == 0) {
            dst = &o->eps;
            open_lo = true;
        } else {
            const char *hint = rp_closest_word(k, known, 7);
            return rp_fail(c->err, RP_ERR_INVALID, "%s: unknown key 'optimizer.%s'%s%s%s",
                           c->name, k, hint ? " (did you mean 'optimizer." : "",
                           hint ? hint : "", hint ? "'?)" : "");
        }
        bool sgd_only = dst == &o->momentum;
        bool adam_only = dst == &o->beta1 || dst == &o->beta2 || dst == &o->eps;
        if ((sgd_only && o->type != RP_OPT_SGD) || (adam_only && o->type == RP_OPT_SGD)) {
            char full[64];
            snprintf(full, sizeof full, "optimizer.%s", k);
            return rpi_bad_value(c, full, e,
                             o->type == RP_OPT_SGD ? "is an Adam setting; sgd takes lr, "
                                                     "momentum and weight_decay"
                                                   : "is an sgd setting; adam takes lr, beta1, "
                                                     "beta2, eps and weight_decay");
        }
        double d = cJSON_IsNumber(e) ? e->valuedouble : NAN;
        bool ok = cJSON_IsNumber(e) && isfinite(d) && (open_lo ? d > lo : d >= lo) &&
                  (open_hi ? d < hi : d <= hi);
        if (!ok) {
            char full[64], rule[96];
            snprintf(full, sizeof full, "optimizer.%s", k);
            snprintf(rule, sizeof rule, "must be a number %s %g%s", open_lo ? ">" : ">=", lo,
                     isinf(hi) ? "" : (open_hi ? " and < 1" : " and <= 1"));
            return rpi_bad_value(c, full, e, rule);
        }
        *dst = d;
    }
    return RP_OK;
}

/* A whole number >= lo of an object's key, or the default when absent. */
static rp_status get_count(rpi_load *c, const cJSON *obj, const char *key, const char *full,
                           long long lo, long long *out) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!e)
        return RP_OK;
    if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < lo ||
        e->valuedouble > 1e15) {
        char rule[64];
        snprintf(rule, sizeof rule, "must be a whole number >= %lld", lo);
        return rpi_bad_value(c, full, e, rule);
    }
    *out = (long long)e->valuedouble;
    return RP_OK;
}

static rp_status k_lr_schedule(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    if (!cJSON_IsObject(v))
        return rpi_bad_value(c, key, v,
                         "must be an object such as {\"type\": \"cosine\", \"warmup_updates\": "
                         "100, \"decay_updates\": 5000, \"min_lr\": 0.0001}");
    rp_lr_schedule *ls = &cfg->lr_schedule;
    static const char *const known[] = {"type",          "warmup_updates", "decay_updates",
                                        "min_lr",        "step_updates",   "gamma"};
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        bool found = false;
        for (int k = 0; k < 6; k++)
            found |= strcmp(e->string, known[k]) == 0;
        if (!found) {
            const char *hint = rp_closest_word(e->string, known, 6);
            return rp_fail(c->err, RP_ERR_INVALID, "%s: unknown key 'lr_schedule.%s'%s%s%s",
                           c->name, e->string, hint ? " (did you mean 'lr_schedule." : "",
                           hint ? hint : "", hint ? "'?)" : "");
        }
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (!t || !cJSON_IsString(t) ||
        (strcmp(t->valuestring, "constant") && strcmp(t->valuestring, "cosine") &&
         strcmp(t->valuestring, "step")))
        return rpi_bad_value(c, "lr_schedule.type", t ? t : v,
                         "must be \"constant\", \"cosine\" or \"step\"");
    ls->type = strcmp(t->valuestring, "cosine") == 0 ? RP_LR_COSINE
               : strcmp(t->valuestring, "step") == 0 ? RP_LR_STEP
                                                     : RP_LR_CONSTANT;
    rp_status s;
    if ((s = get_count(c, v, "warmup_updates", "lr_schedule.warmup_updates", 0,
                       &ls->warmup_updates)) ||
        (s = get_count(c, v, "decay_updates", "lr_schedule.decay_updates", 1,
                       &ls->decay_updates)) ||
        (s = get_count(c, v, "step_updates", "lr_schedule.step_updates", 1, &ls->step_updates)))
        return s;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(v, "min_lr");
    if (m && !(cJSON_IsNumber(m) && m->valuedouble >= 0 && isfinite(m->valuedouble)))
        return rpi_bad_value(c, "lr_schedule.min_lr", m, "must be a number >= 0");
    if (m)
        ls->min_lr = m->valuedouble;
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(v, "gamma");
    if (g && !(cJSON_IsNumber(g) && g->valuedouble > 0 && g->valuedouble <= 1))
        return rpi_bad_value(c, "lr_schedule.gamma", g, "must be a number > 0 and <= 1");
    if (g)
        ls->gamma = g->valuedouble;
    if (ls->type == RP_LR_COSINE && ls->decay_updates <= ls->warmup_updates)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: key 'lr_schedule': a cosine schedule needs decay_updates (the "
                       "update min_lr is reached at) after warmup_updates (%lld); got %lld",
                       c->name, ls->warmup_updates, ls->decay_updates);
    if (ls->type == RP_LR_STEP && ls->step_updates < 1)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: key 'lr_schedule': a step schedule needs step_updates >= 1",
                       c->name);
    return RP_OK;
}

static rp_status k_data_order(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    if (!cJSON_IsString(v) ||
        (strcmp(v->valuestring, "shuffled") != 0 && strcmp(v->valuestring, "sequential") != 0))
        return rpi_bad_value(c, key, v, "must be \"shuffled\" or \"sequential\"");
    cfg->sequential_data = v->valuestring[1] == 'e';
    return RP_OK;
}

static rp_status k_clipping(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || !isfinite(v->valuedouble))
        return rpi_bad_value(c, key, v, "must be a number >= 0 (0: no clipping)");
    cfg->gradient_clipping = v->valuedouble;
    return RP_OK;
}

static rp_status k_bucket(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || !(v->valuedouble <= 1e6))
        return rpi_bad_value(c, key, v,
                             "must be a number of MB from 0 to 1e6 (0: one reduction after the "
                             "last backward)");
    cfg->reduction_bucket_mb = v->valuedouble;
    return RP_OK;
}

static rp_status k_per_server(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    return rpi_get_int(c, key, v, 0, &cfg->workers_per_server);
}

static rp_status k_grouping(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    const char *rule = "must be an object {\"group_size\": g, \"stride\": s} with integers >= 1";
    if (!cJSON_IsObject(v))
        return rpi_bad_value(c, key, v, rule);
    c->group_size = c->group_stride = 0; /* not given */
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (strcmp(e->string, "group_size") == 0) {
            if (!rpi_is_whole(e, 1, 1e6))
                return rpi_bad_value(c, "replica_grouping.group_size", e, "must be an integer >= 1");
            c->group_size = (int)e->valuedouble;
        } else if (strcmp(e->string, "stride") == 0) {
            if (!rpi_is_whole(e, 1, 1e6))
                return rpi_bad_value(c, "replica_grouping.stride", e, "must be an integer >= 1");
            c->group_stride = (int)e->valuedouble;
        } else {
            return rp_fail(c->err, RP_ERR_INVALID,
                           "%s: unknown key 'replica_grouping.%s' (known: group_size, stride)",
                           c->name, e->string);
        }
    }
    /* either may be left out, as in PopXL: stride 1, group size R / stride */
    cfg->grouping_set = true;
    return RP_OK;
}

static rp_status k_schedule(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    if (cJSON_IsString(v) && strcmp(v->valuestring, "1f1b") == 0)
        cfg->schedule = RP_SCHEDULE_1F1B;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "gpipe") == 0)
        cfg->schedule = RP_SCHEDULE_GPIPE;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "zb-h1") == 0)
        cfg->schedule = RP_SCHEDULE_ZB_H1;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "zb-h2") == 0)
        cfg->schedule = RP_SCHEDULE_ZB_H2;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "zb-auto") == 0)
        cfg->schedule = RP_SCHEDULE_ZB_AUTO;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "interleaved-1f1b") == 0)
        cfg->schedule = RP_SCHEDULE_INTERLEAVED;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "zb-v") == 0)
        cfg->schedule = RP_SCHEDULE_ZB_V;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "dualpipev") == 0)
        cfg->schedule = RP_SCHEDULE_DUALPIPEV;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "dualpipe") == 0)
        cfg->schedule = RP_SCHEDULE_DUALPIPE;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "pipedream") == 0)
        cfg->schedule = RP_SCHEDULE_PIPEDREAM;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "pipedream_2bw") == 0)
        cfg->schedule = RP_SCHEDULE_PIPEDREAM_2BW;
    else
        return rpi_bad_value(c, key, v,
                         "must be \"gpipe\", \"1f1b\", \"zb-h1\", \"zb-h2\", \"zb-auto\", "
                         "\"interleaved-1f1b\", \"zb-v\", \"dualpipev\", \"dualpipe\", "
                         "\"pipedream\" or \"pipedream_2bw\"");
    return RP_OK;
}

static rp_status k_stage_replication(rp_config *cfg, rpi_load *c, const char *key,
                                     const cJSON *v) {
    const char *rule = "must be a list of integers >= 1, one per stage";
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1 ||
        cJSON_GetArraySize(v) > RP_MAX_STAGES)
        return rpi_bad_value(c, key, v, rule);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!rpi_is_whole(e, 1, 1e6))
            return rpi_bad_value(c, key, v, rule);
        cfg->stage_replication[i++] = (int)e->valuedouble;
    }
    cfg->stage_replication_count = i;
    return RP_OK;
}

/* The layers recomputed, each named once, in any order. */
static rp_status k_recompute_layers(rp_config *cfg, rpi_load *c, const char *key,
                                    const cJSON *v) {
    char rule[96];
    snprintf(rule, sizeof rule, "must be a list of layer indices 0 to %d, each once",
             RP_MAX_RECOMPUTE_LAYERS - 1);
    memset(cfg->recompute_layers, 0, sizeof cfg->recompute_layers);
    cfg->recompute_layers_count = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!rpi_is_whole(e, 0, RP_MAX_RECOMPUTE_LAYERS - 1) ||
            rp_config_recomputes_layer(cfg, (int)e->valuedouble))
            return rpi_bad_value(c, key, v, rule);
        rp_config_recompute_layer(cfg, (int)e->valuedouble);
    }
    return RP_OK;
}

/* JSON numbers are doubles: integers beyond 2^53 would not survive. */
static rp_status get_int53(rpi_load *c, const char *key, const cJSON *v, const char *rule,
                           int64_t *out) {
    if (!rpi_is_whole(v, 0, 9007199254740992.0))
        return rpi_bad_value(c, key, v, rule);
    *out = (int64_t)v->valuedouble;
    return RP_OK;
}

/* A power of two, so that scaling the loss and unscaling the gradients is
** exact: with nothing overflowing, the weights are those of no scaling. */
static rp_status k_loss_scaling(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    int e;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1 && v->valuedouble <= 0x1p100) ||
        frexp(v->valuedouble, &e) != 0.5)
        return rpi_bad_value(c, key, v, "must be a power of two between 1 and 2^100");
    cfg->loss_scaling = v->valuedouble;
    return RP_OK;
}

static rp_status k_device_memory(rp_config *cfg, rpi_load *c, const char *key, const cJSON *v) {
    return get_int53(c, key, v, "must be a number of bytes >= 0 (0 = unlimited)",
                     &cfg->device_memory);
}

/* Each key with the JSON type of its value (cJSON's type bits). */
static const struct key_def {
    const char *name;
    key_fn fn;
    int form;
} KEYS[] = {
    {"micro_batch_size", k_micro_batch, cJSON_Number},
    {"layers_per_stage", k_layers, cJSON_Array},
    {"inference_layers_per_stage", k_inf_layers, cJSON_Array},
    {"stage_replication", k_stage_replication, cJSON_Array},
    {"schedule", k_schedule, cJSON_String},
    {"recompute_layers", k_recompute_layers, cJSON_Array},
    {"replica_grouping", k_grouping, cJSON_Object},
    {"pipedream_vertical_sync", k_vsync, cJSON_True | cJSON_False},
    {"zb_pass_times", k_zb_times, cJSON_Array},
    {"zb_max_in_flight", k_zb_limit, cJSON_Number},
    {"tensor_parallel", k_tensor_parallel, cJSON_Number},
    {"expert_parallel", k_expert_parallel, cJSON_Number},
    {"vocab_parallel", k_vocab_parallel, cJSON_True | cJSON_False},
    {"virtual_stages", k_virtual_stages, cJSON_Number},
    {"fp16_exchange", k_fp16, cJSON_True | cJSON_False},
    {"loss_scaling", k_loss_scaling, cJSON_Number},
    {"loss_scaling_growth_interval", k_growth, cJSON_Number},
    {"device_memory", k_device_memory, cJSON_Number},
    {"optimizer", k_optimizer, cJSON_Object},
    {"lr_schedule", k_lr_schedule, cJSON_Object},
    {"gradient_clipping", k_clipping, cJSON_Number},
    {"reduction_bucket_mb", k_bucket, cJSON_Number},
    {"workers_per_server", k_per_server, cJSON_Number},
    {"data_order", k_data_order, cJSON_String},
};
#define NUM_KEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

static int key_index(const char *key) {
    for (int k = 0; k < NUM_KEYS; k++)
        if (strcmp(KEYS[k].name, key) == 0)
            return k;
    return -1;
}

bool rpi_is_repipe_key(const char *key) { return key_index(key) >= 0; }

rp_status rpi_repipe_key(rpi_load *c, const char *key, const cJSON *v) {
    int k = key_index(key);
    return KEYS[k].fn(c->cfg, c, key, v);
}

bool rpi_repipe_form(const char *key, const cJSON *v) {
    int k = key_index(key);
    return k >= 0 && (v->type & 0xFF & KEYS[k].form) != 0;
}

const char *rpi_repipe_key_name(int i) { return i < NUM_KEYS ? KEYS[i].name : NULL; }

/* ---- the rules between keys ------------------------------------------------ */

rp_status rpi_validate(rpi_load *c) {
    rp_config *cfg = c->cfg;
    int stages = cfg->layers_per_stage.count;
    if (cfg->stage_replication_count && cfg->stage_replication_count != stages)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: key 'stage_replication' lists %d stages but the pipeline has %d "
                       "(one entry per stage of %s)",
                       c->name, cfg->stage_replication_count, stages,
                       c->layers_key ? c->layers_key : "layers_per_stage");
    if (cfg->recompute_layers_count && cfg->recompute_checkpoint_every_layer)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: key 'recompute_layers' names layers to recompute, and "
                       "'recompute_checkpoint_every_layer' recomputes every one: give one of "
                       "them", c->name);
    int inf_stages = rp_config_num_stages(cfg, true);
    /* derived products, in doubles so that nothing wraps: every worker a
    ** thread or rank of one world, every host call's samples a count */
    double per = 0, B = cfg->micro_batch_size;
    for (int st = 0; st < stages; st++)
        per += rp_config_stage_replicas(cfg, st);
    double workers = cfg->replication_factor * per;
    double inf_workers = (double)cfg->inference_replication_factor * inf_stages;
    if (workers > RP_MAX_WORKERS)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: replication_factor %d x %.0f workers per replica needs %.0f "
                       "workers; at most %d",
                       c->name, cfg->replication_factor, per, workers, RP_MAX_WORKERS);
    if (inf_workers > RP_MAX_WORKERS)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: inference_replication_factor %d x %d inference stages needs %.0f "
                       "workers; at most %d",
                       c->name, cfg->inference_replication_factor, inf_stages, inf_workers,
                       RP_MAX_WORKERS);
    double call = B * cfg->gradient_accumulation_steps * cfg->replication_factor *
                  cfg->device_iterations;
    double inf_call = B * cfg->inference_replication_factor * cfg->inference_device_iterations;
    if (call > RP_MAX_SAMPLES || inf_call > RP_MAX_SAMPLES)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: a host call takes %.3g samples (micro_batch_size x "
                       "gradient_accumulation_steps x replication_factor x device_iterations, "
                       "or for inference micro_batch_size x inference_replication_factor x "
                       "inference_device_iterations); at most %.0f",
                       c->name, call > inf_call ? call : inf_call, (double)RP_MAX_SAMPLES);
    if (cfg->grouping_set) {
        rp_error gerr;
        if (rp_grouping_popxl(&cfg->replica_grouping, cfg->replication_factor,
                              c->group_stride ? &c->group_stride : NULL,
                              c->group_size ? &c->group_size : NULL, &gerr))
            return rp_fail(c->err, RP_ERR_INVALID, "%s: key 'replica_grouping': %s", c->name,
                           gerr.msg);
    } else {
        cfg->replica_grouping = rp_grouping_all(cfg->replication_factor);
    }
    return RP_OK;
}
