/*
** Optimum Graphcore's IPUConfig files, read as the release that wrote them.
**
** Optimum Graphcore's IPUConfig changed what a file means from release to
** release: 0.1 ran inference with the training replication; 0.2.1 to 0.6.0
** chose values by pod type from dictionaries; 0.6.0 brought -1 wildcards
** and 0.6.1 separate inference pipelines, checks on every value and null as
** "not set"; 0.7 refuses keys it does not know, where every earlier release
** ignored them. A file does not say which release wrote it (optimum_version
** is the version of the optimum package underneath), so repipe reads it as
** the newest release that accepts it, among those its keys allow: a key a
** release introduced bounds it from below, one a release dropped from
** above. A file that no release accepts is refused with the reason the
** newest of them gives. A file of repipe's own keys (none of them only
** IPUConfig's) is read as the current release reads its keys.
**
** What each key meant, release by release, and what repipe does with it is
** the table in docs/configuration.md; the numbers derived from every file of
** Optimum Graphcore's repository history, and from what every release's
** save_pretrained writes, are checked against that release's own IPUConfig
** in tests/test_ipuconfig.c.
*/
#include "../core/json.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "ipuconfig.h"

/* ---- the file, before any release reads it -------------------------------- */

static void bound_from(og_file *f, og_release r, const char *why) {
    if (r > f->lo) {
        f->lo = r;
        snprintf(f->lo_why, sizeof f->lo_why, "%s", why);
    }
}

static void bound_to(og_file *f, og_release r, const char *why) {
    if (r < f->hi) {
        f->hi = r;
        snprintf(f->hi_why, sizeof f->hi_why, "%s", why);
    }
}

/* Releases before 0.6.0 pinned no optimum: a version below 1.6.1 (the pin
** from 0.6.0 on) was written by 0.2.1-0.5. */
static bool optimum_before_pin(const char *v) {
    int a = 0, b = 0, c = 0;
    if (sscanf(v, "%d.%d.%d", &a, &b, &c) < 2)
        return false;
    return a < 1 || (a == 1 && (b < 6 || (b == 6 && c < 1)));
}

/* A wildcard came in 0.6.0: before, -1 placed no layers, and no one wrote it. */
static void wildcard_mark(og_file *f, const cJSON *v, const char *key) {
    if (!cJSON_IsArray(v))
        return;
    for (const cJSON *e = v->child; e; e = e->next) {
        if (cJSON_IsNumber(e) && e->valuedouble == -1) {
            char why[96];
            snprintf(why, sizeof why, "its wildcard (-1) in '%s'", key);
            bound_from(f, OG_0_6_0, why);
            return;
        }
    }
}

static rp_status scan(rpi_load *c, const cJSON *root, og_file *f) {
    /* the development versions before 0.1.0 only for their own keys */
    f->lo = OG_0_1;
    f->hi = OG_CURRENT;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        int k = rpi_og_find(item->string);
        if (k >= 0 && rpi_og_keys[k].to == OG_PRE && !cJSON_IsNull(item))
            f->lo = OG_PRE;
    }
    cJSON_ArrayForEach(item, root) {
        const char *key = item->string;
        int k = rpi_og_find(key), alias = rpi_og_training_alias(key);
        if (alias >= 0) {
            if (f->raw[alias] || cJSON_GetObjectItemCaseSensitive(root, rpi_og_keys[alias].name))
                return rp_fail(c->err, RP_ERR_INVALID, "%s: keys '%s' and '%s' both given; they "
                               "are the same setting, keep one", c->name, rpi_og_keys[alias].name, key);
            f->aliases[f->num_aliases++] = key;
            k = alias;
        }
        if (k == K_LAYERS || k == K_INF_LAYERS || (k < 0 && strstr(key, "layers_per_stage")))
            wildcard_mark(f, item, key);
        if (k >= 0) {
            f->raw[k] = item;
            f->ipu |= !rpi_og_keys[k].shared;
            char why[160];
            if (cJSON_IsNull(item)) { /* null for "not set" came in 0.6.1 */
                if (rpi_og_keys[k].optional && rpi_og_keys[k].from < OG_0_6_1 && k != K_SEED) {
                    snprintf(why, sizeof why, "its '%s' set to null", key);
                    bound_from(f, OG_0_6_1, why);
                }
                continue;
            }
            snprintf(why, sizeof why, "its key '%s'", key);
            if (k != K_OPTIMUM && k != K_TRANSFORMERS) {
                /* the development versions kept every key they were given */
                bound_from(f, rpi_og_keys[k].from == OG_0_1 ? OG_PRE : rpi_og_keys[k].from, why);
                bound_to(f, rpi_og_keys[k].to, why);
            }
            if (cJSON_IsObject(item) && rpi_og_keys[k].kind != OK_KWARGS) {
                f->ipu = true; /* only IPUConfig ever took values per pod type */
                snprintf(why, sizeof why, "its values per pod type in '%s'", key);
                bound_from(f, OG_0_2_1, why);
                bound_to(f, k == K_R || k == K_INF_R ? OG_0_6_1 : OG_0_6_0, why);
            }
            if (k == K_OPTIMUM && cJSON_IsString(item)) {
                bound_from(f, OG_0_2_1, "its key 'optimum_version'");
                if (optimum_before_pin(item->valuestring)) {
                    snprintf(why, sizeof why, "its optimum_version %.20s (from 0.6.0 on, 1.6.1)",
                             item->valuestring);
                    bound_to(f, OG_0_2_3, why);
                }
            }
        } else if (rpi_is_repipe_key(key)) {
            if (f->num_own < 32)
                f->own[f->num_own++] = item;
        } else if (rpi_og_pretrained(key)) {
            if (f->num_inherited < 64)
                f->inherited[f->num_inherited++] = item;
        } else if (f->num_unknown < 64) {
            /* a hint costs an edit distance to every known name: past 64
            ** unknown keys the file is no configuration with a typo, and
            ** 100 000 of them would take seconds */
            const char *hint = rpi_closest_key(key);
            if (hint)
                return rp_fail(c->err, RP_ERR_INVALID, "%s: unknown key '%s' (did you mean '%s'?)",
                               c->name, key, hint);
            f->unknown[f->num_unknown++] = item;
        }
    }
    if (f->raw[K_TRANSFORMERS] && !f->raw[K_OPTIMUM])
        bound_to(f, OG_0_1,
                 "its transformers_version without an optimum_version (IPUConfig was a "
                 "transformers PretrainedConfig up to 0.2.0)");
    if (f->raw[K_POD_TYPE] && cJSON_IsString(f->raw[K_POD_TYPE]) && !f->pod_type)
        f->pod_type = f->raw[K_POD_TYPE]->valuestring;
    return RP_OK;
}

/* ---- one release reading the file ------------------------------------------ */

static const char *const PODS_0_2_1[] = {"pod4", "pod16", "pod64", "pod128", "pod256", NULL};
static const char *const PODS_0_2_3[] = {"pod4", "pod8", "pod16", "pod32", "pod64", NULL};

static bool in_list(const char *s, const char *const *list) {
    for (; *list; list++)
        if (strcmp(s, *list) == 0)
            return true;
    return false;
}

/* A value per pod type, as 0.2.1-0.6.0 chose it for the trainer's pod type
** (and 0.6.1 for the replication factors, from "default" only). */
static rp_status resolve_pod(og_read *o, int k, const cJSON *v, const cJSON **out) {
    const char *key = rpi_og_keys[k].name, *pod = o->f->pod_type;
    char rule[256];
    if (o->r == OG_0_6_1 && (k == K_R || k == K_INF_R)) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(v, "default");
        if (!d)
            return rpi_og_fail(o, key, v,
                        "values per pod type are deprecated in 0.6.1, which takes the "
                        "\"default\" one, and there is none");
        rpi_warn(o->c->cfg, "%s: key '%s': values per pod type are deprecated; 0.6.1 takes the "
                 "\"default\" one", o->c->name, key);
        *out = d;
        return RP_OK;
    }
    if (o->r < OG_0_2_1 || o->r > OG_0_6_0)
        return rpi_og_fail(o, key, v,
                    "values per pod type are read by Optimum Graphcore 0.2.1 to 0.6.0 only");
    const char *const *pods = o->r < OG_0_2_3 ? PODS_0_2_1 : PODS_0_2_3;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (strcmp(e->string, "default") != 0 && !in_list(e->string, pods)) {
            snprintf(rule, sizeof rule,
                     "'%s' is not a pod type of %s (%s, %s, %s, %s, %s), so the dictionary is "
                     "not one of values per pod type", e->string, rpi_og_name[o->r], pods[0],
                     pods[1], pods[2], pods[3], pods[4]);
            return rpi_og_fail(o, key, v, rule);
        }
    }
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(v, "default");
    if (!pod) {
        if (!d)
            return rpi_og_fail(o, key, v,
                        "no pod type was given (--pod-type or the file's pod_type) and the "
                        "dictionary has no \"default\"");
        *out = d;
        return RP_OK;
    }
    if (!in_list(pod, pods)) {
        snprintf(rule, sizeof rule, "the pod type %.32s is not one of %s's (%s, %s, %s, %s, %s)",
                 pod, rpi_og_name[o->r], pods[0], pods[1], pods[2], pods[3], pods[4]);
        return rpi_og_fail(o, key, v, rule);
    }
    d = cJSON_GetObjectItemCaseSensitive(v, pod);
    if (!d) {
        snprintf(rule, sizeof rule, "it holds no value for the pod type %s", pod);
        return rpi_og_fail(o, key, v, rule);
    }
    *out = d;
    return RP_OK;
}

/* The value of key k for this release, or NULL when it is not set. */
static rp_status value(og_read *o, int k) {
    const cJSON *v = o->f->raw[k];
    o->val[k] = NULL;
    if (!v || !rpi_og_reads(k, o->r))
        return RP_OK;
    if (cJSON_IsNull(v)) {
        og_kind kind = rpi_og_keys[k].kind;
        bool numeric = kind == OK_INT || kind == OK_LAYERS || kind == OK_MATMUL;
        if (o->r >= OG_0_6_1 && !rpi_og_keys[k].optional && kind != OK_META && kind != OK_IGNORED)
            return rpi_og_fail(o, rpi_og_keys[k].name, v, "not set (null) is allowed from 0.6.1 for optional "
                                            "keys only");
        if (o->r < OG_0_6_1 && numeric && k != K_SEED && k != K_RANDOM_SEED)
            return rpi_og_fail(o, rpi_og_keys[k].name, v,
                        "null is not a number (releases before 0.6.1 pass it on as None)");
        return RP_OK;
    }
    if (cJSON_IsObject(v) && rpi_og_keys[k].kind != OK_KWARGS && rpi_og_keys[k].kind != OK_META)
        return resolve_pod(o, k, v, &o->val[k]);
    o->val[k] = v;
    return RP_OK;
}

/* ---- the whole reading --------------------------------------------------------------- */

/* The counts: replicas, accumulation, device iterations, and inference's. */
static rp_status read_counts(og_read *o) {
    rp_config *cfg = o->c->cfg;
    rp_status s;
    if ((s = rpi_og_int(o, K_R, 1, 1, &cfg->replication_factor)))
        return s;
    int ga = K_GA;
    if (o->r == OG_PRE && !o->val[K_GA])
        ga = K_GA_PRE;
    if ((s = rpi_og_int(o, ga, 1, 1, &cfg->gradient_accumulation_steps)) ||
        (s = rpi_og_int(o, K_D, 1, 1, &cfg->device_iterations)))
        return s;
    if (o->r < OG_0_2_1) { /* inference ran on the training options */
        cfg->inference_replication_factor = cfg->replication_factor;
        cfg->inference_device_iterations = cfg->device_iterations;
    } else if ((s = rpi_og_int(o, K_INF_R, 1, 1, &cfg->inference_replication_factor)) ||
               (s = rpi_og_int(o, K_INF_D, 1, 1, &cfg->inference_device_iterations))) {
        return s;
    }
    return RP_OK;
}

/* The switches: optimizer state and recomputation, half partials and the
** encoder on the host (both said to have no effect). */
static rp_status read_flags(og_read *o) {
    rp_config *cfg = o->c->cfg;
    const cJSON *half = o->f->raw[K_HALF];
    bool encoder = false;
    rp_status s;
    if ((s = rpi_og_bool(o, K_OFFCHIP, &cfg->optimizer_state_offchip)) ||
        (s = rpi_og_bool(o, K_RTS, &cfg->replicated_tensor_sharding)) ||
        (s = rpi_og_bool(o, K_RECOMPUTE, &cfg->recompute_checkpoint_every_layer)) ||
        (s = rpi_og_bool(o, K_HALF, &cfg->enable_half_partials)) ||
        (s = rpi_og_bool(o, K_ALS, &cfg->auto_loss_scaling)))
        return s;
    if (cfg->enable_half_partials && half && !cJSON_IsNull(half))
        rpi_warn(cfg, "%s: key 'enable_half_partials': fp16 partial sums of products are an "
                 "IPU's; repipe's products sum in fp32, so it has no effect (fp16 traffic "
                 "between stages is 'fp16_exchange')", o->c->name);
    if ((s = rpi_og_bool(o, K_ENCODER_CPU, &encoder)))
        return s;
    if (encoder) /* IPUConfig loads it and refuses it only in to_options() */
        rpi_warn(cfg, "%s: key 'execute_encoder_on_cpu_for_generation': text generation's "
                 "encoder on the host, which repipe does not run: no effect (IPUConfig loads "
                 "it; its to_options() says \"not supported yet\")", o->c->name);
    return RP_OK;
}

/* The seed, the executable cache's folder and the output mode. */
static rp_status read_values(og_read *o) {
    rp_config *cfg = o->c->cfg;
    int seed = o->r < OG_0_2_1 ? K_RANDOM_SEED : K_SEED;
    if (o->val[seed]) {
        if (!rpi_is_whole(o->val[seed], 0, 9007199254740992.0))
            return rpi_og_fail(o, rpi_og_keys[seed].name, o->val[seed], "must be a whole number between 0 "
                                                          "and 2^53");
        cfg->seed = (uint64_t)o->val[seed]->valuedouble;
    }
    const cJSON *v = o->val[K_CACHE];
    if (v) {
        if (!cJSON_IsString(v) || strlen(v->valuestring) >= RP_PATH_MAX)
            return rpi_og_fail(o, "executable_cache_dir", v,
                        "must be a path string shorter than 1024 bytes");
        /* "disabled" turns the cache off (0.2.3 on; repipe reads it so in every file) */
        if (strcmp(v->valuestring, "disabled") != 0)
            snprintf(cfg->executable_cache_dir, RP_PATH_MAX, "%s", v->valuestring);
    }
    if ((v = o->val[K_OUTPUT])) {
        static const char *const names[] = {"final", "all", "sum", "default"};
        int m = -1;
        for (int i = 0; cJSON_IsString(v) && i < 4; i++)
            if (strcmp(v->valuestring, names[i]) == 0)
                m = i;
        if (m < 0)
            return rpi_og_fail(o, "output_mode", v, "must be one of \"all\", \"sum\", \"final\", "
                                             "\"default\"");
        cfg->output_mode = (rp_output_mode)m;
    }
    return RP_OK;
}

/* Keys repipe reads and has no use for: said, or refused where mistyped. */
static rp_status read_ignored(og_read *o) {
    rpi_load *c = o->c;
    rp_config *cfg = c->cfg;
    const cJSON *v;
    for (int k = K_PARALLELIZE; k <= K_INF_PARALLELIZE; k++)
        if ((v = o->val[k])) {
            if (!cJSON_IsObject(v))
                return rpi_og_fail(o, rpi_og_keys[k].name, v, "must be an object of keyword arguments");
            if (v->child)
                rpi_warn(cfg, "%s: key '%s': keyword arguments of a PyTorch model's "
                         "parallelize(); a repipe model has none; ignored", c->name,
                         rpi_og_keys[k].name);
        }
    for (int k = 0; k < K_COUNT; k++)
        if (rpi_og_keys[k].kind == OK_IGNORED && o->val[k] && !cJSON_IsFalse(o->val[k]))
            rpi_warn(cfg, "%s: key '%s' (%s) has no meaning in repipe; ignored", c->name,
                     rpi_og_keys[k].name, rpi_og_keys[k].note);
    if (o->val[K_SYNTHETIC] && !cJSON_IsBool(o->val[K_SYNTHETIC]))
        return rpi_og_fail(o, "synthetic_data", o->val[K_SYNTHETIC], "must be true or false");
    return RP_OK;
}

static rp_status read_keys(og_read *o) {
    rpi_load *c = o->c;
    rp_config *cfg = c->cfg;
    const og_file *f = o->f;
    rp_status s;
    for (int k = 0; k < K_COUNT; k++) {
        if ((s = value(o, k)))
            return s;
        /* a key this release dropped: a warning, in every release */
        if (f->raw[k] && !cJSON_IsNull(f->raw[k]) && !rpi_og_reads(k, o->r))
            rpi_warn(cfg, "%s: key '%s' was read by Optimum Graphcore %s to %s only; ignored%s",
                     c->name, rpi_og_keys[k].name, rpi_og_name[rpi_og_keys[k].from], rpi_og_name[rpi_og_keys[k].to], c->as);
    }
    if ((s = read_counts(o)) || (s = read_flags(o)) || (s = read_values(o)) ||
        (s = read_ignored(o)))
        return s;
    if ((s = rpi_og_layers(o)) || (s = rpi_og_matmul(o)) || (s = rpi_og_serialization(o)))
        return s;
    return RP_OK;
}

/* repipe's keys in the file, then the keys no one reads. */
static rp_status other_keys(og_read *o) {
    rpi_load *c = o->c;
    const og_file *f = o->f;
    for (int i = 0; i < f->num_own; i++) {
        const cJSON *item = f->own[i];
        if (cJSON_IsNull(item) || strcmp(item->string, "layers_per_stage") == 0 ||
            strcmp(item->string, "inference_layers_per_stage") == 0)
            continue; /* read with IPUConfig's layers */
        if (!c->lenient || rpi_repipe_form(item->string, item)) {
            rp_status s = rpi_repipe_key(c, item->string, item);
            if (s)
                return s;
            continue;
        }
        /* not repipe's form: a training script's setting of the same name, which
        ** Optimum Graphcore ignored */
        char vt[64];
        rpi_value_text(item, vt, sizeof vt);
        rpi_warn(c->cfg, "%s: key '%s': %s is not repipe's form of this key; ignored, as "
                 "Optimum Graphcore %s ignored it", c->name, item->string, vt, rpi_og_name[o->r]);
    }
    for (int i = 0; i < f->num_aliases; i++)
        rpi_warn(c->cfg, "%s: key '%s' is a development version's name (April-May 2023, before "
                 "0.6.1) of '%s'; read as that", c->name, f->aliases[i], f->aliases[i] + 9);
    for (int i = 0; i < f->num_inherited; i++)
        rpi_warn(c->cfg, "%s: key '%s' is an attribute of transformers' PretrainedConfig "
                 "(a model's configuration); no meaning here; ignored", c->name,
                 f->inherited[i]->string);
    for (int i = 0; i < f->num_unknown; i++) {
        const char *key = f->unknown[i]->string;
        if (!c->lenient)
            return rp_fail(c->err, RP_ERR_INVALID, "%s: unknown key '%s'%s", c->name, key,
                           f->ipu ? " (Optimum Graphcore 0.7 refuses keys it does not know; "
                                    "releases up to 0.6.1 ignored them)"
                                  : "");
        rpi_warn(c->cfg, "%s: key '%s' is not a key of any IPUConfig release or of repipe; "
                 "ignored, as Optimum Graphcore %s ignored keys it did not know",
                 c->name, key, rpi_og_name[o->r]);
    }
    return RP_OK;
}

static rp_status attempt(rpi_load *c, const og_file *f, og_release r) {
    rp_config_default(c->cfg);
    c->layers = c->inference_layers = NULL;
    c->layers_key = c->inference_layers_key = NULL;
    c->group_size = c->group_stride = 0;
    c->matmul_list = c->inference_matmul_list = false;
    c->lenient = f->ipu && r <= OG_0_6_1;
    if (f->ipu)
        snprintf(c->as, sizeof c->as, " (as Optimum Graphcore %s reads this IPUConfig file)",
                 rpi_og_name[r]);
    else
        c->as[0] = '\0';
    /* repipe's layer keys first: they stand for IPUConfig's */
    for (int i = 0; i < f->num_own; i++) {
        const char *key = f->own[i]->string;
        if (!cJSON_IsNull(f->own[i]) &&
            (strcmp(key, "layers_per_stage") == 0 || strcmp(key, "inference_layers_per_stage") == 0)) {
            rp_status s = rpi_repipe_key(c, key, f->own[i]);
            if (s)
                return s;
        }
    }
    og_read o = {.c = c, .f = f, .r = r};
    rp_status s = read_keys(&o);
    if (!s)
        s = other_keys(&o);
    if (!s)
        s = rpi_validate(c);
    return s;
}

rp_status rpi_read_object(rpi_load *c, const cJSON *root, const char *pod_type) {
    og_file f = {.pod_type = pod_type};
    rp_status s = scan(c, root, &f);
    if (s)
        return s;
    if (!f.ipu) /* repipe's own keys: the current release's reading of IPUConfig's */
        return attempt(c, &f, OG_CURRENT);
    og_release hi = f.hi, lo = f.lo;
    bool mixed = lo > hi; /* keys of releases that never met: the newer ones win */
    if (mixed)
        hi = OG_CURRENT;
    rp_error first;
    bool failed = false;
    for (int r = lo; r <= (int)hi; r++) {
        rp_error *keep = c->err;
        rp_error err;
        c->err = &err;
        s = attempt(c, &f, (og_release)r);
        c->err = keep;
        if (!s) {
            rp_config *cfg = c->cfg;
            if (mixed)
                rpi_warn(cfg, "%s: %s is of Optimum Graphcore %s or later but %s of %s or "
                         "earlier; read as the later", c->name, f.lo_why, rpi_og_name[f.lo],
                         f.hi_why, rpi_og_name[f.hi]);
            if (failed) {
                char *m = strstr(first.msg, ": ");
                rpi_warn(cfg, "%s: read as Optimum Graphcore %s reads it: %s, the oldest "
                         "release its keys allow, refuses it: %s", c->name, rpi_og_name[r],
                         rpi_og_name[lo], m ? m + 2 : first.msg);
            }
            snprintf(cfg->ipu_release, sizeof cfg->ipu_release, "%s", rpi_og_name[r]);
            cfg->layers_count_blocks = true;
            snprintf(cfg->origin, sizeof cfg->origin,
                     "an Optimum Graphcore IPUConfig file, read as release %s reads it (%s%.120s)",
                     rpi_og_name[r], r == (int)lo && lo > OG_0_1 ? "the oldest release for "
                     : r == (int)lo ? "the oldest release: no key of a later one" : "the oldest "
                     "release that accepts it", r == (int)lo && lo > OG_0_1 ? f.lo_why : "");
            return RP_OK;
        }
        if (!failed) {
            first = err;
            failed = true;
        }
    }
    if (c->err)
        *c->err = first;
    return first.status;
}
