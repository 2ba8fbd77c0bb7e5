/*
** Execution configuration: JSON loading, validation, wildcard expansion and
** saving. Keys are handled by one table; each handler validates its own
** value, and cross-key rules (list lengths, groupings) are checked once all
** keys are in.
*/
#include "repipe/config.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"

void rp_config_default(rp_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->micro_batch_size = 1;
    cfg->replication_factor = 1;
    cfg->inference_replication_factor = 1;
    cfg->gradient_accumulation_steps = 1;
    cfg->layers_per_stage.count = 1;
    cfg->layers_per_stage.layers[0] = -1;
    cfg->device_iterations = 1;
    cfg->inference_device_iterations = 1;
    cfg->output_mode = RP_OUTPUT_FINAL;
    cfg->schedule = RP_SCHEDULE_1F1B;
    cfg->replica_grouping = rp_grouping_all(1);
    cfg->embedding_serialization_factor = 1;
    cfg->inference_embedding_serialization_factor = 1;
    cfg->matmul_proportion_count = 1;
    cfg->matmul_proportion[0] = 0.6;
    cfg->loss_scaling_growth_interval = 2000;
    cfg->optimizer.type = RP_OPT_SGD;
    cfg->optimizer.lr = 0.05;
    cfg->optimizer.beta1 = 0.9;
    cfg->optimizer.beta2 = 0.999;
    cfg->optimizer.eps = 1e-8;
    cfg->lr_schedule.gamma = 0.1;
}

/* ---- loading ------------------------------------------------------------ */

typedef struct load_ctx {
    const char *name; /* file name for messages */
    rp_error *err;
    int ipus_per_replica;           /* 0 = not given */
    int inference_ipus_per_replica; /* 0 = not given */
    bool layers_seen, inference_layers_seen;
    const char *layers_key, *inference_layers_key; /* spelling used */
    int group_size, group_stride; /* from replica_grouping */
    /* IPUConfig's layer serializations, training and inference, of
    ** embeddings and projections: which factors were given, and the length
    ** of each *_splits_per_ipu list (0: not given) */
    bool factor_given[4];
    int splits_len[4];
} load_ctx;

/* The value as compact JSON for messages, truncated to fit. */
static void value_text(const cJSON *v, char *buf, size_t n) {
    char *s = cJSON_PrintUnformatted(v);
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

static rp_status bad_value(load_ctx *c, const char *key, const cJSON *v, const char *rule) {
    char vt[96];
    value_text(v, vt, sizeof vt);
    return rp_fail(c->err, RP_ERR_INVALID, "%s: key '%s': %s is invalid: %s", c->name, key, vt,
                   rule);
}

static void warn(rp_config *cfg, const char *fmt, const char *name, const char *key) {
    if (cfg->num_warnings >= RP_MAX_WARNINGS)
        return;
    snprintf(cfg->warnings[cfg->num_warnings++], RP_WARNING_MAX, fmt, name, key);
}

static bool is_int(const cJSON *v, double lo, double hi) {
    if (!cJSON_IsNumber(v))
        return false;
    double d = v->valuedouble;
    return d == floor(d) && d >= lo && d <= hi;
}

static rp_status get_int(load_ctx *c, const char *key, const cJSON *v, int lo, int *out) {
    if (!is_int(v, lo, 1e9)) {
        char rule[64];
        snprintf(rule, sizeof rule, "must be an integer >= %d", lo);
        return bad_value(c, key, v, rule);
    }
    *out = (int)v->valuedouble;
    return RP_OK;
}

static rp_status get_bool(load_ctx *c, const char *key, const cJSON *v, bool *out) {
    if (!cJSON_IsBool(v))
        return bad_value(c, key, v, "must be true or false");
    *out = cJSON_IsTrue(v);
    return RP_OK;
}

static rp_status get_layer_list(load_ctx *c, const char *key, const cJSON *v,
                                rp_layer_list *out) {
    if (!cJSON_IsArray(v))
        return bad_value(c, key, v, "must be a list of integers >= -1 (-1 is a wildcard)");
    int n = cJSON_GetArraySize(v);
    if (n < 1)
        return bad_value(c, key, v, "must list at least one stage");
    if (n > RP_MAX_STAGES)
        return bad_value(c, key, v, "has more than 256 stages");
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!is_int(e, -1, 1e9))
            return bad_value(c, key, v,
                             "every entry must be an integer >= -1 (-1 is a wildcard)");
        out->layers[i++] = (int)e->valuedouble;
    }
    out->count = n;
    return RP_OK;
}

/* A scalar, or a list with one value per stage (the length is checked later). */
static rp_status get_proportions(load_ctx *c, const char *key, const cJSON *v, double *vals,
                                 int *count) {
    const char *rule = "must be a number > 0 and <= 1, or a list of them (one per stage)";
    if (cJSON_IsNumber(v)) {
        if (!(v->valuedouble > 0 && v->valuedouble <= 1))
            return bad_value(c, key, v, rule);
        vals[0] = v->valuedouble;
        *count = 1;
        return RP_OK;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1 ||
        cJSON_GetArraySize(v) > RP_MAX_STAGES)
        return bad_value(c, key, v, rule);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0 && e->valuedouble <= 1))
            return bad_value(c, key, v, rule);
        vals[i++] = e->valuedouble;
    }
    *count = i;
    return RP_OK;
}

typedef rp_status (*key_fn)(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v);

#define INT_KEY(fn, field, lo)                                                            \
    static rp_status fn(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {   \
        return get_int(c, key, v, lo, &cfg->field);                                       \
    }
#define BOOL_KEY(fn, field)                                                               \
    static rp_status fn(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {   \
        return get_bool(c, key, v, &cfg->field);                                          \
    }

INT_KEY(k_micro_batch, micro_batch_size, 1)
INT_KEY(k_replication, replication_factor, 1)
INT_KEY(k_inf_replication, inference_replication_factor, 1)
INT_KEY(k_ga, gradient_accumulation_steps, 1)
INT_KEY(k_device_iterations, device_iterations, 1)
INT_KEY(k_inf_device_iterations, inference_device_iterations, 1)
INT_KEY(k_embedding_factor, embedding_serialization_factor, 1)
INT_KEY(k_inf_embedding_factor, inference_embedding_serialization_factor, 1)

/* The serialization keys of IPUConfig, numbered as load_ctx counts them. */
static const char *const SERIALIZATIONS[4][2] = {
    {"embedding_serialization_factor", "serialized_embedding_splits_per_ipu"},
    {"inference_embedding_serialization_factor", "inference_serialized_embedding_splits_per_ipu"},
    {"projection_serialization_factor", "serialized_projection_splits_per_ipu"},
    {"inference_projection_serialization_factor",
     "inference_serialized_projection_splits_per_ipu"},
};

static int serialization_of(const char *key) {
    for (int k = 0; k < 4; k++)
        if (strcmp(key, SERIALIZATIONS[k][0]) == 0 || strcmp(key, SERIALIZATIONS[k][1]) == 0)
            return k;
    return -1;
}

static rp_status k_embedding_ser(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    c->factor_given[serialization_of(key)] = true;
    return k_embedding_factor(cfg, c, key, v);
}

static rp_status k_inf_embedding_ser(rp_config *cfg, load_ctx *c, const char *key,
                                     const cJSON *v) {
    c->factor_given[serialization_of(key)] = true;
    return k_inf_embedding_factor(cfg, c, key, v);
}

/* projection_serialization_factor: checked as IPUConfig checks it, and
** without meaning here (repipe does not split a linear layer's product). */
static rp_status k_projection_ser(rp_config *cfg, load_ctx *c, const char *key,
                                  const cJSON *v) {
    int f;
    rp_status s = get_int(c, key, v, 1, &f);
    if (s)
        return s;
    c->factor_given[serialization_of(key)] = true;
    warn(cfg, "%s: key '%s' has no meaning in repipe and is ignored", c->name, key);
    return RP_OK;
}

/* *_splits_per_ipu: per stage, how many pieces of the serialized layer it
** holds; IPUConfig's rules: whole numbers >= 0, at least one piece, on
** consecutive stages. repipe serializes a layer on the stage that holds it
** (embedding_serialization_factor), so the placement itself is ignored. */
static rp_status k_splits(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1, sum = 0, last = -1;
    bool gap = false;
    if (n < 1 || n > RP_MAX_STAGES)
        return bad_value(c, key, v, "must be a list of 1 to 64 whole numbers >= 0");
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(e) || e->valuedouble != (int)e->valuedouble || e->valuedouble < 0)
            return bad_value(c, key, v, "must be a list of whole numbers >= 0");
        int x = (int)e->valuedouble;
        if (x > 0 && last >= 0 && gap)
            return bad_value(c, key, v, "the pieces must lie on consecutive stages");
        if (x > 0)
            last = i;
        else if (last >= 0)
            gap = true;
        sum += x;
    }
    if (sum < 1)
        return bad_value(c, key, v, "at least one piece, on one stage");
    c->splits_len[serialization_of(key)] = n;
    warn(cfg,
         "%s: key '%s': repipe serializes a layer on the stage that holds it; the placement "
         "is ignored",
         c->name, key);
    return RP_OK;
}

/* Keys older Optimum Graphcore releases wrote, or deprecated. */
static rp_status k_deprecated(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    (void)v;
    warn(cfg, "%s: key '%s' is deprecated in IPUConfig and has no meaning in repipe; it is "
              "ignored",
         c->name, key);
    return RP_OK;
}
BOOL_KEY(k_rts, replicated_tensor_sharding)
BOOL_KEY(k_offchip, optimizer_state_offchip)
BOOL_KEY(k_recompute, recompute_checkpoint_every_layer)
BOOL_KEY(k_vsync, pipedream_vertical_sync)
BOOL_KEY(k_als, auto_loss_scaling)
BOOL_KEY(k_half, enable_half_partials)
INT_KEY(k_growth, loss_scaling_growth_interval, 1)

/* JSON numbers are doubles: integers beyond 2^53 would not survive. */
static rp_status get_int53(load_ctx *c, const char *key, const cJSON *v, const char *rule,
                           int64_t *out) {
    if (!is_int(v, 0, 9007199254740992.0))
        return bad_value(c, key, v, rule);
    *out = (int64_t)v->valuedouble;
    return RP_OK;
}

static rp_status k_seed(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    int64_t seed = 0;
    rp_status st = get_int53(c, key, v, "must be an integer between 0 and 2^53", &seed);
    cfg->seed = st ? cfg->seed : (uint64_t)seed;
    return st;
}

static rp_status k_ipus(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    (void)cfg;
    return get_int(c, key, v, 1, &c->ipus_per_replica);
}

static rp_status k_inf_ipus(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    (void)cfg;
    return get_int(c, key, v, 1, &c->inference_ipus_per_replica);
}

/* layers_per_stage and its alias (and the inference pair) may be given once. */
static rp_status once(load_ctx *c, bool *seen, const char **first, const char *key) {
    if (*seen)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: keys '%s' and '%s' both given; they are the same setting, keep one",
                       c->name, *first, key);
    *seen = true;
    *first = key;
    return RP_OK;
}

static rp_status k_layers(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    rp_status st = once(c, &c->layers_seen, &c->layers_key, key);
    return st ? st : get_layer_list(c, key, v, &cfg->layers_per_stage);
}

static rp_status k_inf_layers(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    rp_status st = once(c, &c->inference_layers_seen, &c->inference_layers_key, key);
    if (st)
        return st;
    cfg->inference_layers_set = true;
    return get_layer_list(c, key, v, &cfg->inference_layers_per_stage);
}

static rp_status k_stage_replication(rp_config *cfg, load_ctx *c, const char *key,
                                     const cJSON *v) {
    const char *rule = "must be a list of integers >= 1, one per stage";
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1 ||
        cJSON_GetArraySize(v) > RP_MAX_STAGES)
        return bad_value(c, key, v, rule);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!is_int(e, 1, 1e6))
            return bad_value(c, key, v, rule);
        cfg->stage_replication[i++] = (int)e->valuedouble;
    }
    cfg->stage_replication_count = i;
    return RP_OK;
}

static rp_status k_output_mode(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    static const char *const names[] = {"final", "all", "sum", "default"};
    if (cJSON_IsString(v))
        for (int i = 0; i < 4; i++)
            if (strcmp(v->valuestring, names[i]) == 0) {
                cfg->output_mode = (rp_output_mode)i;
                return RP_OK;
            }
    return bad_value(c, key, v, "must be one of \"all\", \"sum\", \"final\", \"default\"");
}

static rp_status k_schedule(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    if (cJSON_IsString(v) && strcmp(v->valuestring, "1f1b") == 0)
        cfg->schedule = RP_SCHEDULE_1F1B;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "gpipe") == 0)
        cfg->schedule = RP_SCHEDULE_GPIPE;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "pipedream") == 0)
        cfg->schedule = RP_SCHEDULE_PIPEDREAM;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "pipedream_2bw") == 0)
        cfg->schedule = RP_SCHEDULE_PIPEDREAM_2BW;
    else
        return bad_value(c, key, v,
                         "must be \"gpipe\", \"1f1b\", \"pipedream\" or \"pipedream_2bw\"");
    return RP_OK;
}

static rp_status k_grouping(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    const char *rule = "must be an object {\"group_size\": g, \"stride\": s} with integers >= 1";
    if (!cJSON_IsObject(v))
        return bad_value(c, key, v, rule);
    c->group_size = 0;
    c->group_stride = 1;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (strcmp(e->string, "group_size") == 0) {
            if (!is_int(e, 1, 1e6))
                return bad_value(c, "replica_grouping.group_size", e, "must be an integer >= 1");
            c->group_size = (int)e->valuedouble;
        } else if (strcmp(e->string, "stride") == 0) {
            if (!is_int(e, 1, 1e6))
                return bad_value(c, "replica_grouping.stride", e, "must be an integer >= 1");
            c->group_stride = (int)e->valuedouble;
        } else {
            return rp_fail(c->err, RP_ERR_INVALID,
                           "%s: unknown key 'replica_grouping.%s' (known: group_size, stride)",
                           c->name, e->string);
        }
    }
    if (c->group_size == 0)
        return bad_value(c, key, v, "needs \"group_size\"");
    cfg->grouping_set = true;
    return RP_OK;
}

static rp_status k_matmul(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    return get_proportions(c, key, v, cfg->matmul_proportion, &cfg->matmul_proportion_count);
}

static rp_status k_inf_matmul(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    return get_proportions(c, key, v, cfg->inference_matmul_proportion,
                           &cfg->inference_matmul_proportion_count);
}

static rp_status k_device_memory(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    return get_int53(c, key, v, "must be a number of bytes >= 0 (0 = unlimited)",
                     &cfg->device_memory);
}

/* A power of two, so that scaling the loss and unscaling the gradients is
** exact: with nothing overflowing, the weights are those of no scaling. */
static rp_status k_loss_scaling(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    int e;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1 && v->valuedouble <= 0x1p100) ||
        frexp(v->valuedouble, &e) != 0.5)
        return bad_value(c, key, v, "must be a power of two between 1 and 2^100");
    cfg->loss_scaling = v->valuedouble;
    return RP_OK;
}

static rp_status k_cache_dir(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= RP_PATH_MAX)
        return bad_value(c, key, v, "must be a path string shorter than 1024 bytes");
    snprintf(cfg->executable_cache_dir, RP_PATH_MAX, "%s", v->valuestring);
    return RP_OK;
}

static rp_status k_optimizer(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    if (!cJSON_IsObject(v))
        return bad_value(c, key, v, "must be an object such as {\"type\": \"sgd\", \"lr\": 0.05}");
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
            return bad_value(c, "optimizer.type", t, "must be \"sgd\", \"adam\" or \"adamw\"");
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
            return bad_value(c, full, e,
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
            return bad_value(c, full, e, rule);
        }
        *dst = d;
    }
    return RP_OK;
}

/* A whole number >= lo of an object's key, or the default when absent. */
static rp_status get_count(load_ctx *c, const cJSON *obj, const char *key, const char *full,
                           long long lo, long long *out) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!e)
        return RP_OK;
    if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < lo ||
        e->valuedouble > 1e15) {
        char rule[64];
        snprintf(rule, sizeof rule, "must be a whole number >= %lld", lo);
        return bad_value(c, full, e, rule);
    }
    *out = (long long)e->valuedouble;
    return RP_OK;
}

static rp_status k_lr_schedule(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    if (!cJSON_IsObject(v))
        return bad_value(c, key, v,
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
        return bad_value(c, "lr_schedule.type", t ? t : v,
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
        return bad_value(c, "lr_schedule.min_lr", m, "must be a number >= 0");
    if (m)
        ls->min_lr = m->valuedouble;
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(v, "gamma");
    if (g && !(cJSON_IsNumber(g) && g->valuedouble > 0 && g->valuedouble <= 1))
        return bad_value(c, "lr_schedule.gamma", g, "must be a number > 0 and <= 1");
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

static rp_status k_data_order(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    if (!cJSON_IsString(v) ||
        (strcmp(v->valuestring, "shuffled") != 0 && strcmp(v->valuestring, "sequential") != 0))
        return bad_value(c, key, v, "must be \"shuffled\" or \"sequential\"");
    cfg->sequential_data = v->valuestring[1] == 'e';
    return RP_OK;
}

static rp_status k_clipping(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || !isfinite(v->valuedouble))
        return bad_value(c, key, v, "must be a number >= 0 (0: no clipping)");
    cfg->gradient_clipping = v->valuedouble;
    return RP_OK;
}

double rp_config_lr(const rp_config *cfg, long long u) {
    const rp_lr_schedule *ls = &cfg->lr_schedule;
    double lr = cfg->optimizer.lr;
    if (u < ls->warmup_updates)
        return lr * (double)(u + 1) / (double)ls->warmup_updates;
    long long t = u - ls->warmup_updates;
    if (ls->type == RP_LR_COSINE) {
        double p = (double)t / (double)(ls->decay_updates - ls->warmup_updates);
        if (p >= 1)
            return ls->min_lr;
        return ls->min_lr + 0.5 * (1 + cos(3.14159265358979323846 * p)) * (lr - ls->min_lr);
    }
    if (ls->type == RP_LR_STEP)
        return lr * pow(ls->gamma, (double)(t / ls->step_updates));
    return lr;
}

/* Keys of Optimum Graphcore's IPUConfig with no meaning in repipe. */
static rp_status k_ignored(rp_config *cfg, load_ctx *c, const char *key, const cJSON *v) {
    (void)v;
    warn(cfg, "%s: key '%s' has no meaning in repipe and is ignored", c->name, key);
    return RP_OK;
}

static rp_status k_sharded_inference(rp_config *cfg, load_ctx *c, const char *key,
                                     const cJSON *v) {
    if (!cJSON_IsBool(v))
        return bad_value(c, key, v, "must be true or false");
    warn(cfg,
         "%s: key '%s' is deprecated: inference always runs sharded (stage after stage); "
         "the key is ignored",
         c->name, key);
    return RP_OK;
}

static const struct key_def {
    const char *name;
    key_fn fn;
} KEYS[] = {
    {"seed", k_seed},
    {"micro_batch_size", k_micro_batch},
    {"replication_factor", k_replication},
    {"inference_replication_factor", k_inf_replication},
    {"gradient_accumulation_steps", k_ga},
    {"layers_per_stage", k_layers},
    {"layers_per_ipu", k_layers},
    {"inference_layers_per_stage", k_inf_layers},
    {"inference_layers_per_ipu", k_inf_layers},
    {"ipus_per_replica", k_ipus},
    {"inference_ipus_per_replica", k_inf_ipus},
    {"stage_replication", k_stage_replication},
    {"device_iterations", k_device_iterations},
    {"inference_device_iterations", k_inf_device_iterations},
    {"output_mode", k_output_mode},
    {"schedule", k_schedule},
    {"replica_grouping", k_grouping},
    {"replicated_tensor_sharding", k_rts},
    {"optimizer_state_offchip", k_offchip},
    {"recompute_checkpoint_every_layer", k_recompute},
    {"pipedream_vertical_sync", k_vsync},
    {"auto_loss_scaling", k_als},
    {"enable_half_partials", k_half},
    {"loss_scaling", k_loss_scaling},
    {"loss_scaling_growth_interval", k_growth},
    {"embedding_serialization_factor", k_embedding_ser},
    {"inference_embedding_serialization_factor", k_inf_embedding_ser},
    {"matmul_proportion", k_matmul},
    {"inference_matmul_proportion", k_inf_matmul},
    {"device_memory", k_device_memory},
    {"executable_cache_dir", k_cache_dir},
    {"optimizer", k_optimizer},
    {"lr_schedule", k_lr_schedule},
    {"gradient_clipping", k_clipping},
    {"data_order", k_data_order},
    {"sharded_execution_for_inference", k_sharded_inference},
    {"parallelize_kwargs", k_ignored},
    {"inference_parallelize_kwargs", k_ignored},
    {"explicit_ir_inference", k_ignored},
    {"serialized_embedding_splits_per_ipu", k_splits},
    {"inference_serialized_embedding_splits_per_ipu", k_splits},
    {"serialized_projection_splits_per_ipu", k_splits},
    {"inference_serialized_projection_splits_per_ipu", k_splits},
    {"projection_serialization_factor", k_projection_ser},
    {"inference_projection_serialization_factor", k_projection_ser},
    {"execute_encoder_on_cpu_for_generation", k_ignored},
    {"profile_dir", k_ignored},
    {"use_popdist", k_ignored},
    {"optimum_version", k_ignored},
    {"transformers_version", k_ignored},
    {"enable_half_first_order_momentum", k_deprecated},
    {"pod_type", k_deprecated},
    {"decompose_grad_sum", k_deprecated},
};
#define NUM_KEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

/* Applies ipus_per_replica to a layer list: [-1] becomes n wildcards; any
** other list must already have n entries. */
static rp_status apply_ipus(load_ctx *c, rp_layer_list *list, int n, const char *ipus_key,
                            const char *layers_key) {
    if (n == 0)
        return RP_OK;
    if (n > RP_MAX_STAGES)
        return rp_fail(c->err, RP_ERR_INVALID, "%s: key '%s': %d is invalid: at most %d stages",
                       c->name, ipus_key, n, RP_MAX_STAGES);
    if (list->count == 1 && list->layers[0] == -1) {
        list->count = n;
        for (int i = 0; i < n; i++)
            list->layers[i] = -1;
        return RP_OK;
    }
    if (list->count != n)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: key '%s': %d does not match '%s', which lists %d stages", c->name,
                       ipus_key, n, layers_key, list->count);
    return RP_OK;
}

static rp_status validate(rp_config *cfg, load_ctx *c) {
    rp_status s;
    s = apply_ipus(c, &cfg->layers_per_stage, c->ipus_per_replica, "ipus_per_replica",
                   c->layers_key ? c->layers_key : "layers_per_stage");
    if (s)
        return s;
    if (c->inference_ipus_per_replica && !cfg->inference_layers_set) {
        cfg->inference_layers_set = true;
        cfg->inference_layers_per_stage.count = 1;
        cfg->inference_layers_per_stage.layers[0] = -1;
    }
    s = apply_ipus(c, &cfg->inference_layers_per_stage, c->inference_ipus_per_replica,
                   "inference_ipus_per_replica",
                   c->inference_layers_key ? c->inference_layers_key
                                           : "inference_layers_per_stage");
    if (s)
        return s;
    int stages = cfg->layers_per_stage.count;
    /* IPUConfig: a layer is serialized by a factor or by its splits, not
    ** both; the splits list one entry per stage */
    for (int k = 0; k < 4; k++) {
        bool inference = k & 1;
        int n = inference ? cfg->inference_layers_per_stage.count : stages;
        if (c->factor_given[k] && c->splits_len[k])
            return rp_fail(c->err, RP_ERR_INVALID,
                           "%s: keys '%s' and '%s': give one of them, not both (a factor "
                           "serializes the layer where it is, the splits place its pieces)",
                           c->name, SERIALIZATIONS[k][0], SERIALIZATIONS[k][1]);
        if (c->splits_len[k] && c->splits_len[k] != n &&
            !(inference && !cfg->inference_layers_set && c->splits_len[k] == stages))
            return rp_fail(c->err, RP_ERR_INVALID,
                           "%s: key '%s' lists %d stages but the %s pipeline has %d",
                           c->name, SERIALIZATIONS[k][1], c->splits_len[k],
                           inference ? "inference" : "training", n);
    }
    if (cfg->stage_replication_count && cfg->stage_replication_count != stages)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: key 'stage_replication' lists %d stages but the pipeline has %d "
                       "(one entry per stage of layers_per_stage)",
                       c->name, cfg->stage_replication_count, stages);
    if (cfg->matmul_proportion_count != 1 && cfg->matmul_proportion_count != stages)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: key 'matmul_proportion' lists %d values but the pipeline has %d "
                       "stages (give one value, or one per stage)",
                       c->name, cfg->matmul_proportion_count, stages);
    int inf_stages = rp_config_num_stages(cfg, true);
    if (cfg->inference_matmul_proportion_count > 1 &&
        cfg->inference_matmul_proportion_count != inf_stages)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: key 'inference_matmul_proportion' lists %d values but inference has "
                       "%d stages (give one value, or one per stage)",
                       c->name, cfg->inference_matmul_proportion_count, inf_stages);
    /* derived products, in doubles so that nothing wraps: every worker a
    ** thread or rank of one world, every host call's samples a count */
    double per = 0, B = cfg->micro_batch_size;
    for (int st = 0; st < stages; st++)
        per += rp_config_stage_replicas(cfg, st);
    double workers = cfg->replication_factor * per;
    double inf_workers = (double)cfg->inference_replication_factor * inf_stages;
    if (workers > RP_MAX_WORKERS)
        return rp_fail(c->err, RP_ERR_INVALID,
                       "%s: replication_factor %d x %.0f workers per replica (stage_replication) "
                       "needs %.0f workers; at most %d",
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
        if (rp_grouping_init(&cfg->replica_grouping, cfg->replication_factor, c->group_size,
                             c->group_stride, &gerr))
            return rp_fail(c->err, RP_ERR_INVALID, "%s: key 'replica_grouping': %s", c->name,
                           gerr.msg);
    } else {
        cfg->replica_grouping = rp_grouping_all(cfg->replication_factor);
    }
    return RP_OK;
}

rp_status rp_config_load_string(rp_config *cfg, const char *text, size_t len, const char *name,
                                rp_error *err) {
    rp_config_default(cfg);
    cJSON *root;
    rp_status s = rp_json_parse(text, len, name, &root, err);
    if (s)
        return s;
    if (!cJSON_IsObject(root)) {
        s = rp_fail(err, RP_ERR_PARSE, "%s: the configuration must be a JSON object", name);
        goto done;
    }
    load_ctx c = {.name = name, .err = err};
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        const char *key = item->string;
        int k = 0;
        while (k < NUM_KEYS && strcmp(KEYS[k].name, key) != 0)
            k++;
        if (k == NUM_KEYS) {
            const char *names[NUM_KEYS];
            for (int i = 0; i < NUM_KEYS; i++)
                names[i] = KEYS[i].name;
            const char *hint = rp_closest_word(key, names, NUM_KEYS);
            if (hint)
                s = rp_fail(err, RP_ERR_INVALID, "%s: unknown key '%s' (did you mean '%s'?)",
                            name, key, hint);
            else
                s = rp_fail(err, RP_ERR_INVALID, "%s: unknown key '%s'", name, key);
            goto done;
        }
        /* A key given twice in one object is a mistake JSON itself allows. */
        for (const cJSON *o = root->child; o != item; o = o->next)
            if (strcmp(o->string, key) == 0) {
                s = rp_fail(err, RP_ERR_INVALID, "%s: key '%s' appears twice", name, key);
                goto done;
            }
        s = KEYS[k].fn(cfg, &c, key, item);
        if (s)
            goto done;
    }
    s = validate(cfg, &c);
done:
    cJSON_Delete(root);
    return s;
}

rp_status rp_config_load_file(rp_config *cfg, const char *path, rp_error *err) {
    char *text;
    size_t len;
    rp_status s = rp_read_file(path, &text, &len, err);
    if (s)
        return s;
    s = rp_config_load_string(cfg, text, len, path, err);
    free(text);
    return s;
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
                    "%s: no 'execution_config': the plan's profile was not a chain of layers "
                    "(write one with 'repipe plan --json' from a 'repipe profile' profile)",
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

/* ---- saving ------------------------------------------------------------- */

const char *rp_output_mode_name(rp_output_mode m) {
    switch (m) {
    case RP_OUTPUT_ALL: return "all";
    case RP_OUTPUT_SUM: return "sum";
    case RP_OUTPUT_DEFAULT: return "default";
    case RP_OUTPUT_FINAL: break;
    }
    return "final";
}

const char *rp_schedule_name(rp_schedule s) {
    return s == RP_SCHEDULE_GPIPE           ? "gpipe"
           : s == RP_SCHEDULE_PIPEDREAM     ? "pipedream"
           : s == RP_SCHEDULE_PIPEDREAM_2BW ? "pipedream_2bw"
                                            : "1f1b";
}

const char *rp_optimizer_name(rp_optimizer_type t) {
    return t == RP_OPT_ADAM ? "adam" : t == RP_OPT_ADAMW ? "adamw" : "sgd";
}

static cJSON *int_array(const int *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static cJSON *proportions(const double *v, int n) {
    if (n == 1)
        return cJSON_CreateNumber(v[0]);
    return cJSON_CreateDoubleArray(v, n);
}

rp_status rp_config_to_json(const rp_config *cfg, char **out, rp_error *err) {
    cJSON *r = cJSON_CreateObject();
    if (!r)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    cJSON_AddNumberToObject(r, "seed", (double)cfg->seed);
    cJSON_AddNumberToObject(r, "micro_batch_size", cfg->micro_batch_size);
    cJSON_AddNumberToObject(r, "replication_factor", cfg->replication_factor);
    cJSON_AddNumberToObject(r, "inference_replication_factor",
                            cfg->inference_replication_factor);
    cJSON_AddNumberToObject(r, "gradient_accumulation_steps", cfg->gradient_accumulation_steps);
    cJSON_AddItemToObject(r, "layers_per_stage",
                          int_array(cfg->layers_per_stage.layers, cfg->layers_per_stage.count));
    if (cfg->inference_layers_set)
        cJSON_AddItemToObject(r, "inference_layers_per_stage",
                              int_array(cfg->inference_layers_per_stage.layers,
                                        cfg->inference_layers_per_stage.count));
    if (cfg->stage_replication_count)
        cJSON_AddItemToObject(r, "stage_replication",
                              int_array(cfg->stage_replication, cfg->stage_replication_count));
    cJSON_AddNumberToObject(r, "device_iterations", cfg->device_iterations);
    cJSON_AddNumberToObject(r, "inference_device_iterations", cfg->inference_device_iterations);
    cJSON_AddStringToObject(r, "output_mode", rp_output_mode_name(cfg->output_mode));
    cJSON_AddStringToObject(r, "schedule", rp_schedule_name(cfg->schedule));
    if (cfg->grouping_set) {
        cJSON *g = cJSON_CreateObject();
        cJSON_AddNumberToObject(g, "group_size", cfg->replica_grouping.group_size);
        cJSON_AddNumberToObject(g, "stride", cfg->replica_grouping.stride);
        cJSON_AddItemToObject(r, "replica_grouping", g);
    }
    cJSON_AddBoolToObject(r, "replicated_tensor_sharding", cfg->replicated_tensor_sharding);
    cJSON_AddBoolToObject(r, "optimizer_state_offchip", cfg->optimizer_state_offchip);
    cJSON_AddBoolToObject(r, "recompute_checkpoint_every_layer",
                          cfg->recompute_checkpoint_every_layer);
    if (cfg->pipedream_vertical_sync)
        cJSON_AddBoolToObject(r, "pipedream_vertical_sync", true);
    cJSON_AddBoolToObject(r, "auto_loss_scaling", cfg->auto_loss_scaling);
    cJSON_AddBoolToObject(r, "enable_half_partials", cfg->enable_half_partials);
    if (cfg->loss_scaling > 0)
        cJSON_AddNumberToObject(r, "loss_scaling", cfg->loss_scaling);
    cJSON_AddNumberToObject(r, "loss_scaling_growth_interval", cfg->loss_scaling_growth_interval);
    cJSON_AddNumberToObject(r, "embedding_serialization_factor",
                            cfg->embedding_serialization_factor);
    cJSON_AddNumberToObject(r, "inference_embedding_serialization_factor",
                            cfg->inference_embedding_serialization_factor);
    cJSON_AddItemToObject(r, "matmul_proportion",
                          proportions(cfg->matmul_proportion, cfg->matmul_proportion_count));
    if (cfg->inference_matmul_proportion_count)
        cJSON_AddItemToObject(r, "inference_matmul_proportion",
                              proportions(cfg->inference_matmul_proportion,
                                          cfg->inference_matmul_proportion_count));
    cJSON_AddNumberToObject(r, "device_memory", (double)cfg->device_memory);
    cJSON_AddStringToObject(r, "executable_cache_dir", cfg->executable_cache_dir);
    cJSON *o = cJSON_CreateObject();
    const rp_optimizer_config *oc = &cfg->optimizer;
    cJSON_AddStringToObject(o, "type", rp_optimizer_name(oc->type));
    cJSON_AddNumberToObject(o, "lr", oc->lr);
    if (oc->type == RP_OPT_SGD) {
        cJSON_AddNumberToObject(o, "momentum", oc->momentum);
    } else {
        cJSON_AddNumberToObject(o, "beta1", oc->beta1);
        cJSON_AddNumberToObject(o, "beta2", oc->beta2);
        cJSON_AddNumberToObject(o, "eps", oc->eps);
    }
    cJSON_AddNumberToObject(o, "weight_decay", oc->weight_decay);
    cJSON_AddItemToObject(r, "optimizer", o);
    const rp_lr_schedule *ls = &cfg->lr_schedule;
    if (ls->type != RP_LR_CONSTANT || ls->warmup_updates) {
        static const char *const names[] = {"constant", "cosine", "step"};
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "type", names[ls->type]);
        cJSON_AddNumberToObject(j, "warmup_updates", (double)ls->warmup_updates);
        if (ls->type == RP_LR_COSINE) {
            cJSON_AddNumberToObject(j, "decay_updates", (double)ls->decay_updates);
            cJSON_AddNumberToObject(j, "min_lr", ls->min_lr);
        } else if (ls->type == RP_LR_STEP) {
            cJSON_AddNumberToObject(j, "step_updates", (double)ls->step_updates);
            cJSON_AddNumberToObject(j, "gamma", ls->gamma);
        }
        cJSON_AddItemToObject(r, "lr_schedule", j);
    }
    if (cfg->gradient_clipping > 0)
        cJSON_AddNumberToObject(r, "gradient_clipping", cfg->gradient_clipping);
    if (cfg->sequential_data)
        cJSON_AddStringToObject(r, "data_order", "sequential");
    char *text = cJSON_Print(r);
    cJSON_Delete(r);
    if (!text)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    /* Hand the caller a plain malloc'd string. */
    size_t n = strlen(text);
    *out = malloc(n + 2);
    if (!*out) {
        cJSON_free(text);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    memcpy(*out, text, n);
    (*out)[n] = '\n';
    (*out)[n + 1] = '\0';
    cJSON_free(text);
    return RP_OK;
}

rp_status rp_config_save_file(const rp_config *cfg, const char *path, rp_error *err) {
    char *text;
    rp_status s = rp_config_to_json(cfg, &text, err);
    if (s)
        return s;
    s = rp_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return s;
}

static bool list_equal(const rp_layer_list *a, const rp_layer_list *b) {
    return a->count == b->count && memcmp(a->layers, b->layers, sizeof(int) * a->count) == 0;
}

bool rp_config_equal(const rp_config *a, const rp_config *b) {
    const rp_optimizer_config *oa = &a->optimizer, *ob = &b->optimizer;
    bool inf_equal = a->inference_layers_set == b->inference_layers_set &&
                     (!a->inference_layers_set ||
                      list_equal(&a->inference_layers_per_stage, &b->inference_layers_per_stage));
    return a->seed == b->seed && a->micro_batch_size == b->micro_batch_size &&
           a->replication_factor == b->replication_factor &&
           a->inference_replication_factor == b->inference_replication_factor &&
           a->gradient_accumulation_steps == b->gradient_accumulation_steps &&
           list_equal(&a->layers_per_stage, &b->layers_per_stage) && inf_equal &&
           a->stage_replication_count == b->stage_replication_count &&
           memcmp(a->stage_replication, b->stage_replication,
                  sizeof(int) * a->stage_replication_count) == 0 &&
           a->device_iterations == b->device_iterations &&
           a->inference_device_iterations == b->inference_device_iterations &&
           a->output_mode == b->output_mode && a->schedule == b->schedule &&
           a->grouping_set == b->grouping_set &&
           rp_grouping_equal(&a->replica_grouping, &b->replica_grouping) &&
           a->replicated_tensor_sharding == b->replicated_tensor_sharding &&
           a->optimizer_state_offchip == b->optimizer_state_offchip &&
           a->recompute_checkpoint_every_layer == b->recompute_checkpoint_every_layer &&
           a->auto_loss_scaling == b->auto_loss_scaling &&
           a->enable_half_partials == b->enable_half_partials &&
           a->loss_scaling == b->loss_scaling &&
           a->loss_scaling_growth_interval == b->loss_scaling_growth_interval &&
           a->embedding_serialization_factor == b->embedding_serialization_factor &&
           a->inference_embedding_serialization_factor ==
               b->inference_embedding_serialization_factor &&
           a->matmul_proportion_count == b->matmul_proportion_count &&
           memcmp(a->matmul_proportion, b->matmul_proportion,
                  sizeof(double) * a->matmul_proportion_count) == 0 &&
           a->inference_matmul_proportion_count == b->inference_matmul_proportion_count &&
           memcmp(a->inference_matmul_proportion, b->inference_matmul_proportion,
                  sizeof(double) * a->inference_matmul_proportion_count) == 0 &&
           a->device_memory == b->device_memory &&
           strcmp(a->executable_cache_dir, b->executable_cache_dir) == 0 &&
           a->lr_schedule.type == b->lr_schedule.type &&
           a->lr_schedule.warmup_updates == b->lr_schedule.warmup_updates &&
           (a->lr_schedule.type != RP_LR_COSINE ||
            (a->lr_schedule.decay_updates == b->lr_schedule.decay_updates &&
             a->lr_schedule.min_lr == b->lr_schedule.min_lr)) &&
           (a->lr_schedule.type != RP_LR_STEP ||
            (a->lr_schedule.step_updates == b->lr_schedule.step_updates &&
             a->lr_schedule.gamma == b->lr_schedule.gamma)) &&
           a->gradient_clipping == b->gradient_clipping &&
           a->pipedream_vertical_sync == b->pipedream_vertical_sync &&
           a->sequential_data == b->sequential_data &&
           oa->type == ob->type && oa->lr == ob->lr && oa->momentum == ob->momentum &&
           oa->weight_decay == ob->weight_decay && oa->beta1 == ob->beta1 &&
           oa->beta2 == ob->beta2 && oa->eps == ob->eps;
}

/* ---- derived numbers ---------------------------------------------------- */

double rp_config_loss_scale(const rp_config *cfg) {
    if (cfg->loss_scaling > 0)
        return cfg->loss_scaling;
    return cfg->auto_loss_scaling ? 65536.0 : 1.0;
}

int rp_config_num_stages(const rp_config *cfg, bool inference) {
    if (inference && cfg->inference_layers_set)
        return cfg->inference_layers_per_stage.count;
    return cfg->layers_per_stage.count;
}

rp_status rp_layers_expand(const rp_layer_list *list, int num_layers, int *out,
                           const char *key, rp_error *err) {
    if (num_layers < 1)
        return rp_fail(err, RP_ERR_INVALID, "%s: the model has %d layers; it needs at least one",
                       key, num_layers);
    long long fixed = 0;
    int wild = 0, last_wild = -1;
    for (int i = 0; i < list->count; i++) {
        if (list->layers[i] == -1) {
            wild++;
            last_wild = i;
        } else {
            fixed += list->layers[i];
        }
    }
    if (wild == 0) {
        if (fixed != num_layers)
            return rp_fail(err, RP_ERR_INVALID,
                           "%s: the stages hold %lld layers in all but the model has %d", key,
                           fixed, num_layers);
        memcpy(out, list->layers, sizeof(int) * list->count);
        return RP_OK;
    }
    if (fixed > num_layers)
        return rp_fail(err, RP_ERR_INVALID,
                       "%s: the fixed entries already hold %lld layers, more than the model's %d",
                       key, fixed, num_layers);
    int rest = num_layers - (int)fixed;
    int q = rest / wild, r = rest % wild;
    for (int i = 0; i < list->count; i++)
        out[i] = list->layers[i] == -1 ? q + (i == last_wild ? r : 0) : list->layers[i];
    return RP_OK;
}

rp_status rp_config_stage_layers(const rp_config *cfg, bool inference, int num_layers,
                                 int *out, rp_error *err) {
    if (inference && cfg->inference_layers_set)
        return rp_layers_expand(&cfg->inference_layers_per_stage, num_layers, out,
                                "inference_layers_per_stage", err);
    return rp_layers_expand(&cfg->layers_per_stage, num_layers, out, "layers_per_stage", err);
}

int rp_config_stage_replicas(const rp_config *cfg, int s) {
    return cfg->stage_replication_count ? cfg->stage_replication[s] : 1;
}

size_t rp_config_size(void) { return sizeof(rp_config); }

void rp_config_derive(const rp_config *cfg, rp_derived *d) {
    memset(d, 0, sizeof *d);
    d->stages = rp_config_num_stages(cfg, false);
    d->inference_stages = rp_config_num_stages(cfg, true);
    int per_replica = 0;
    for (int s = 0; s < d->stages; s++)
        per_replica += rp_config_stage_replicas(cfg, s);
    d->workers = cfg->replication_factor * per_replica;
    d->inference_workers = cfg->inference_replication_factor * d->inference_stages;
    long long b = cfg->micro_batch_size;
    d->samples_per_micro_batch = b;
    d->samples_per_update = b * cfg->gradient_accumulation_steps * cfg->replication_factor;
    d->samples_per_host_call = d->samples_per_update * cfg->device_iterations;
    d->inference_samples_per_step = b * cfg->inference_replication_factor;
    d->inference_samples_per_host_call =
        d->inference_samples_per_step * cfg->inference_device_iterations;
}
