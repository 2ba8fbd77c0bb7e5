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
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "config_impl.h"

typedef enum og_release {
    OG_PRE,   /* the development versions before 0.1.0 */
    OG_0_1,   /* 0.1.0-0.2.0: inference with the training replication and iterations */
    OG_0_2_1, /* 0.2.1-0.2.2: values per pod type; inference replication of its own */
    OG_0_2_3, /* 0.2.3-0.5: another list of pod types */
    OG_0_6_0, /* -1 wildcards; ipus_per_replica from the layer list */
    OG_0_6_1, /* inference pipelines; every value checked; null means not set */
    OG_0_7_0, /* keys it does not know are refused */
    OG_0_7_1, /* parallelize_kwargs, explicit_ir_inference */
    OG_COUNT
} og_release;
#define OG_CURRENT OG_0_7_1

static const char *const OG_NAME[OG_COUNT] = {
    "a development version before 0.1.0", "0.1.0-0.2.0", "0.2.1-0.2.2", "0.2.3-0.5",
    "0.6.0", "0.6.1", "0.7.0", "0.7.1",
};

typedef enum og_kind {
    OK_INT,     /* a whole number */
    OK_BOOL,
    OK_LAYERS,  /* layers per IPU: whole numbers, -1 a wildcard from 0.6.0 */
    OK_MATMUL,  /* a float, or a list of numbers one per IPU */
    OK_SPLITS,  /* pieces of a serialized layer per IPU */
    OK_STRING,
    OK_KWARGS,  /* keyword arguments of the model's parallelize() */
    OK_META,    /* the writers' versions, the trainer's pod type */
    OK_IGNORED, /* read by IPUConfig, with no meaning on this backend */
} og_kind;

enum {
    K_R, K_INF_R, K_GA, K_GA_PRE, K_D, K_INF_D, K_IPUS, K_INF_IPUS, K_LAYERS, K_INF_LAYERS,
    K_MATMUL, K_INF_MATMUL, K_ESF, K_INF_ESF, K_PSF, K_INF_PSF, K_ES, K_INF_ES, K_PS, K_INF_PS,
    K_OFFCHIP, K_RTS, K_RECOMPUTE, K_HALF, K_ALS, K_CACHE, K_OUTPUT, K_SEED, K_RANDOM_SEED,
    K_SHARDED, K_HALF_MOMENTUM, K_ENCODER_CPU, K_PARALLELIZE, K_INF_PARALLELIZE,
    K_EXPLICIT_IR, K_COMPILE_ONLY, K_SYNTHETIC, K_POPDIST, K_PROFILE_DIR, K_ROUND_IPUS,
    K_DECOMPOSE, K_OPTIMUM, K_TRANSFORMERS, K_POD_TYPE, K_COUNT
};

static const struct og_key {
    const char *name;
    og_release from, to; /* the releases that read it (for files: wrote it) */
    og_kind kind;
    bool shared;   /* a key of repipe's own files too */
    bool optional; /* Optional from 0.6.1: null is "not set" */
    const char *note; /* OK_IGNORED: what IPUConfig did with it */
} KEYS[K_COUNT] = {
    [K_R] = {"replication_factor", OG_PRE, OG_CURRENT, OK_INT, true},
    [K_INF_R] = {"inference_replication_factor", OG_0_2_1, OG_CURRENT, OK_INT, true},
    [K_GA] = {"gradient_accumulation_steps", OG_PRE, OG_CURRENT, OK_INT, true},
    [K_GA_PRE] = {"gradient_accumulation", OG_PRE, OG_PRE, OK_INT},
    [K_D] = {"device_iterations", OG_PRE, OG_CURRENT, OK_INT, true},
    [K_INF_D] = {"inference_device_iterations", OG_0_2_1, OG_CURRENT, OK_INT, true},
    [K_IPUS] = {"ipus_per_replica", OG_PRE, OG_CURRENT, OK_INT, false, true},
    [K_INF_IPUS] = {"inference_ipus_per_replica", OG_0_6_1, OG_CURRENT, OK_INT, false, true},
    [K_LAYERS] = {"layers_per_ipu", OG_PRE, OG_CURRENT, OK_LAYERS},
    [K_INF_LAYERS] = {"inference_layers_per_ipu", OG_0_6_1, OG_CURRENT, OK_LAYERS, false, true},
    [K_MATMUL] = {"matmul_proportion", OG_PRE, OG_CURRENT, OK_MATMUL, true},
    [K_INF_MATMUL] = {"inference_matmul_proportion", OG_0_6_1, OG_CURRENT, OK_MATMUL, true,
                      true},
    [K_ESF] = {"embedding_serialization_factor", OG_0_1, OG_CURRENT, OK_INT, true, true},
    [K_INF_ESF] = {"inference_embedding_serialization_factor", OG_0_6_1, OG_CURRENT, OK_INT,
                   true, true},
    [K_PSF] = {"projection_serialization_factor", OG_0_6_1, OG_CURRENT, OK_INT, false, true},
    [K_INF_PSF] = {"inference_projection_serialization_factor", OG_0_6_1, OG_CURRENT, OK_INT,
                   false, true},
    [K_ES] = {"serialized_embedding_splits_per_ipu", OG_0_6_1, OG_CURRENT, OK_SPLITS, false,
              true},
    [K_INF_ES] = {"inference_serialized_embedding_splits_per_ipu", OG_0_6_1, OG_CURRENT,
                  OK_SPLITS, false, true},
    [K_PS] = {"serialized_projection_splits_per_ipu", OG_0_6_1, OG_CURRENT, OK_SPLITS, false,
              true},
    [K_INF_PS] = {"inference_serialized_projection_splits_per_ipu", OG_0_6_1, OG_CURRENT,
                  OK_SPLITS, false, true},
    [K_OFFCHIP] = {"optimizer_state_offchip", OG_0_1, OG_CURRENT, OK_BOOL, true},
    [K_RTS] = {"replicated_tensor_sharding", OG_0_1, OG_CURRENT, OK_BOOL, true},
    [K_RECOMPUTE] = {"recompute_checkpoint_every_layer", OG_0_1, OG_CURRENT, OK_BOOL, true},
    [K_HALF] = {"enable_half_partials", OG_0_1, OG_CURRENT, OK_BOOL, true},
    [K_ALS] = {"auto_loss_scaling", OG_0_2_3, OG_CURRENT, OK_BOOL, true},
    [K_CACHE] = {"executable_cache_dir", OG_0_1, OG_CURRENT, OK_STRING, true},
    [K_OUTPUT] = {"output_mode", OG_0_2_1, OG_CURRENT, OK_STRING, true},
    [K_SEED] = {"seed", OG_0_2_1, OG_CURRENT, OK_INT, true, true},
    [K_RANDOM_SEED] = {"random_seed", OG_PRE, OG_0_1, OK_INT},
    [K_SHARDED] = {"sharded_execution_for_inference", OG_0_2_3, OG_CURRENT, OK_IGNORED, true,
                   false, "inference always runs sharded, stage after stage (deprecated from "
                          "0.6.0)"},
    [K_HALF_MOMENTUM] = {"enable_half_first_order_momentum", OG_PRE, OG_CURRENT, OK_IGNORED,
                         false, false,
                         "the optimizer's first moment in fp16 (deprecated from 0.6.0); "
                         "repipe keeps optimizer state in fp32"},
    [K_ENCODER_CPU] = {"execute_encoder_on_cpu_for_generation", OG_0_2_3, OG_CURRENT,
                       OK_BOOL},
    [K_PARALLELIZE] = {"parallelize_kwargs", OG_0_7_1, OG_CURRENT, OK_KWARGS, false, true},
    [K_INF_PARALLELIZE] = {"inference_parallelize_kwargs", OG_0_7_1, OG_CURRENT, OK_KWARGS,
                           false, true},
    [K_EXPLICIT_IR] = {"explicit_ir_inference", OG_0_7_1, OG_CURRENT, OK_IGNORED, false, false,
                       "PopART's explicit IR for inference"},
    [K_COMPILE_ONLY] = {"compile_only", OG_0_1, OG_0_1, OK_IGNORED, false, false,
                        "compile for an offline IPU target"},
    [K_SYNTHETIC] = {"synthetic_data", OG_PRE, OG_0_2_1, OK_IGNORED, false, false,
                     "random data generated on the device"},
    [K_POPDIST] = {"use_popdist", OG_PRE, OG_0_2_3, OK_IGNORED, false, false,
                   "PopDist's options for multi-host runs; repipe's multi-host runs use MPI"},
    [K_PROFILE_DIR] = {"profile_dir", OG_PRE, OG_0_2_3, OK_IGNORED, false, false,
                       "where PopVision reports go; repipe writes traces with --trace"},
    [K_ROUND_IPUS] = {"auto_round_num_ipus", OG_PRE, OG_PRE, OK_IGNORED, false, false,
                      "round the IPUs requested up to a power of two"},
    [K_DECOMPOSE] = {"decompose_grad_sum", OG_0_2_3, OG_0_2_3, OK_IGNORED, false, false,
                     "PopART's decomposition of gradient sums"},
    [K_OPTIMUM] = {"optimum_version", OG_0_2_1, OG_CURRENT, OK_META},
    [K_TRANSFORMERS] = {"transformers_version", OG_PRE, OG_CURRENT, OK_META},
    [K_POD_TYPE] = {"pod_type", OG_0_2_1, OG_0_6_0, OK_META},
};

/* The attributes of transformers' PretrainedConfig (4.29), which IPUConfig
** inherited: every release accepts them (0.7 too, which refuses other keys
** it does not know), and a model's config.json holds them. */
static const char *const PRETRAINED[] = {
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "torch_dtype",
    "use_bfloat16", "tf_legacy_loss", "pruned_heads", "tie_word_embeddings",
    "is_encoder_decoder", "is_decoder", "cross_attention_hidden_size", "add_cross_attention",
    "tie_encoder_decoder", "max_length", "min_length", "do_sample", "early_stopping",
    "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "chunk_size_feed_forward", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "architectures", "finetuning_task", "id2label", "label2id", "tokenizer_class", "prefix",
    "bos_token_id", "pad_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id",
    "task_specific_params", "problem_type", "_name_or_path", "model_type", NULL,
};

static bool pretrained_attribute(const char *key) {
    for (int i = 0; PRETRAINED[i]; i++)
        if (strcmp(PRETRAINED[i], key) == 0)
            return true;
    return false;
}

/* A release's own words where it differs from the current one's. */
static bool reads(int k, og_release r) { return KEYS[k].from <= r && r <= KEYS[k].to; }

static int og_find(const char *name) {
    for (int k = 0; k < K_COUNT; k++)
        if (strcmp(KEYS[k].name, name) == 0)
            return k;
    return -1;
}

/* A development version between 0.6.0 and 0.6.1 (April-May 2023) named the
** training values training_X; the releases never did. */
static int og_training_alias(const char *name) {
    static const int keys[] = {K_R, K_D, K_IPUS, K_LAYERS, K_MATMUL, K_ESF};
    if (strncmp(name, "training_", 9) != 0)
        return -1;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(KEYS[keys[i]].name, name + 9) == 0)
            return keys[i];
    return -1;
}

const char *rpi_closest_key(const char *key) {
    const char *names[K_COUNT + 64];
    int n = 0;
    for (int k = 0; k < K_COUNT; k++)
        names[n++] = KEYS[k].name;
    for (int i = 0; rpi_repipe_key_name(i) && n < K_COUNT + 64; i++)
        names[n++] = rpi_repipe_key_name(i);
    return rp_closest_word(key, names, n);
}

/* ---- the file, before any release reads it -------------------------------- */

typedef struct og_file {
    const cJSON *raw[K_COUNT]; /* as written; NULL when absent */
    const cJSON *unknown[64];  /* keys no release and not repipe reads */
    int num_unknown;
    const cJSON *own[32]; /* repipe's own keys */
    int num_own;
    const cJSON *inherited[64]; /* PretrainedConfig's attributes */
    int num_inherited;
    const char *aliases[8]; /* training_X of a development version, read as X */
    int num_aliases;
    bool ipu;             /* holds a key only IPUConfig reads: an IPUConfig file */
    og_release lo, hi;    /* the releases its keys allow */
    char lo_why[160], hi_why[160];
    const char *pod_type; /* the trainer's, from --pod-type or the file */
} og_file;

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
        int k = og_find(item->string);
        if (k >= 0 && KEYS[k].to == OG_PRE && !cJSON_IsNull(item))
            f->lo = OG_PRE;
    }
    cJSON_ArrayForEach(item, root) {
        const char *key = item->string;
        int k = og_find(key), alias = og_training_alias(key);
        if (alias >= 0) {
            if (f->raw[alias] || cJSON_GetObjectItemCaseSensitive(root, KEYS[alias].name))
                return rp_fail(c->err, RP_ERR_INVALID, "%s: keys '%s' and '%s' both given; they "
                               "are the same setting, keep one", c->name, KEYS[alias].name, key);
            f->aliases[f->num_aliases++] = key;
            k = alias;
        }
        if (k == K_LAYERS || k == K_INF_LAYERS || (k < 0 && strstr(key, "layers_per_stage")))
            wildcard_mark(f, item, key);
        if (k >= 0) {
            f->raw[k] = item;
            f->ipu |= !KEYS[k].shared;
            char why[160];
            if (cJSON_IsNull(item)) { /* null for "not set" came in 0.6.1 */
                if (KEYS[k].optional && KEYS[k].from < OG_0_6_1 && k != K_SEED) {
                    snprintf(why, sizeof why, "its '%s' set to null", key);
                    bound_from(f, OG_0_6_1, why);
                }
                continue;
            }
            snprintf(why, sizeof why, "its key '%s'", key);
            if (k != K_OPTIMUM && k != K_TRANSFORMERS) {
                /* the development versions kept every key they were given */
                bound_from(f, KEYS[k].from == OG_0_1 ? OG_PRE : KEYS[k].from, why);
                bound_to(f, KEYS[k].to, why);
            }
            if (cJSON_IsObject(item) && KEYS[k].kind != OK_KWARGS) {
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
        } else if (pretrained_attribute(key)) {
            if (f->num_inherited < 64)
                f->inherited[f->num_inherited++] = item;
        } else {
            const char *hint = rpi_closest_key(key);
            if (hint)
                return rp_fail(c->err, RP_ERR_INVALID, "%s: unknown key '%s' (did you mean '%s'?)",
                               c->name, key, hint);
            if (f->num_unknown < 64)
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

typedef struct og_read {
    rpi_load *c;
    const og_file *f;
    og_release r;
    const cJSON *val[K_COUNT]; /* the values this release takes, pod types resolved */
    cJSON *resolved;           /* holds nothing: values point into the file */
} og_read;

static const char *const PODS_0_2_1[] = {"pod4", "pod16", "pod64", "pod128", "pod256", NULL};
static const char *const PODS_0_2_3[] = {"pod4", "pod8", "pod16", "pod32", "pod64", NULL};

static bool in_list(const char *s, const char *const *list) {
    for (; *list; list++)
        if (strcmp(s, *list) == 0)
            return true;
    return false;
}

static rp_status fail(og_read *o, const char *key, const cJSON *v, const char *rule) {
    return rpi_bad_value(o->c, key, v, rule);
}

/* A value per pod type, as 0.2.1-0.6.0 chose it for the trainer's pod type
** (and 0.6.1 for the replication factors, from "default" only). */
static rp_status resolve_pod(og_read *o, int k, const cJSON *v, const cJSON **out) {
    const char *key = KEYS[k].name, *pod = o->f->pod_type;
    char rule[256];
    if (o->r == OG_0_6_1 && (k == K_R || k == K_INF_R)) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(v, "default");
        if (!d)
            return fail(o, key, v,
                        "values per pod type are deprecated in 0.6.1, which takes the "
                        "\"default\" one, and there is none");
        rpi_warn(o->c->cfg, "%s: key '%s': values per pod type are deprecated; 0.6.1 takes the "
                 "\"default\" one", o->c->name, key);
        *out = d;
        return RP_OK;
    }
    if (o->r < OG_0_2_1 || o->r > OG_0_6_0)
        return fail(o, key, v,
                    "values per pod type are read by Optimum Graphcore 0.2.1 to 0.6.0 only");
    const char *const *pods = o->r < OG_0_2_3 ? PODS_0_2_1 : PODS_0_2_3;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (strcmp(e->string, "default") != 0 && !in_list(e->string, pods)) {
            snprintf(rule, sizeof rule,
                     "'%s' is not a pod type of %s (%s, %s, %s, %s, %s), so the dictionary is "
                     "not one of values per pod type", e->string, OG_NAME[o->r], pods[0],
                     pods[1], pods[2], pods[3], pods[4]);
            return fail(o, key, v, rule);
        }
    }
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(v, "default");
    if (!pod) {
        if (!d)
            return fail(o, key, v,
                        "no pod type was given (--pod-type or the file's pod_type) and the "
                        "dictionary has no \"default\"");
        *out = d;
        return RP_OK;
    }
    if (!in_list(pod, pods)) {
        snprintf(rule, sizeof rule, "the pod type %.32s is not one of %s's (%s, %s, %s, %s, %s)",
                 pod, OG_NAME[o->r], pods[0], pods[1], pods[2], pods[3], pods[4]);
        return fail(o, key, v, rule);
    }
    d = cJSON_GetObjectItemCaseSensitive(v, pod);
    if (!d) {
        snprintf(rule, sizeof rule, "it holds no value for the pod type %s", pod);
        return fail(o, key, v, rule);
    }
    *out = d;
    return RP_OK;
}

/* The value of key k for this release, or NULL when it is not set. */
static rp_status value(og_read *o, int k) {
    const cJSON *v = o->f->raw[k];
    o->val[k] = NULL;
    if (!v || !reads(k, o->r))
        return RP_OK;
    if (cJSON_IsNull(v)) {
        og_kind kind = KEYS[k].kind;
        bool numeric = kind == OK_INT || kind == OK_LAYERS || kind == OK_MATMUL;
        if (o->r >= OG_0_6_1 && !KEYS[k].optional && kind != OK_META && kind != OK_IGNORED)
            return fail(o, KEYS[k].name, v, "not set (null) is allowed from 0.6.1 for optional "
                                            "keys only");
        if (o->r < OG_0_6_1 && numeric && k != K_SEED && k != K_RANDOM_SEED)
            return fail(o, KEYS[k].name, v,
                        "null is not a number (releases before 0.6.1 pass it on as None)");
        return RP_OK;
    }
    if (cJSON_IsObject(v) && KEYS[k].kind != OK_KWARGS && KEYS[k].kind != OK_META)
        return resolve_pod(o, k, v, &o->val[k]);
    o->val[k] = v;
    return RP_OK;
}

static rp_status get_int(og_read *o, int k, int lo, int dflt, int *out) {
    *out = dflt;
    if (!o->val[k])
        return RP_OK;
    return rpi_get_int(o->c, KEYS[k].name, o->val[k], lo, out);
}

static rp_status get_bool(og_read *o, int k, bool *out) {
    if (!o->val[k])
        return RP_OK;
    return rpi_get_bool(o->c, KEYS[k].name, o->val[k], out);
}

/* ---- layers ------------------------------------------------------------------- */

/* Layers per IPU as written: a list of whole numbers (from 0.6.1 each >= -1),
** or, as 0.1 and 0.2.1 saved their default, one number. Releases before
** 0.6.1 took any value and failed only when the model placed its layers:
** `bad` then says why, and the list holds no layers. */
static rp_status raw_layers(og_read *o, const char *key, const cJSON *v, rp_layer_list *l,
                            char *bad, size_t cap) {
    bad[0] = '\0';
    char vt[64];
    if (o->r < OG_0_6_0 && rpi_is_whole(v, 0, 1e9)) {
        l->count = 1;
        l->layers[0] = (int)v->valuedouble;
        snprintf(bad, cap, "'%s' is the number %d, not a list of layers per IPU (the "
                 "placeholder 0.1 and 0.2.1 saved by default); list the layers of every IPU",
                 key, l->layers[0]);
        return RP_OK;
    }
    bool list = cJSON_IsArray(v) && cJSON_GetArraySize(v) >= 1 &&
                cJSON_GetArraySize(v) <= RP_MAX_STAGES;
    int i = 0;
    for (const cJSON *e = list ? v->child : NULL; e; e = e->next) {
        if (!rpi_is_whole(e, o->r >= OG_0_6_1 ? -1 : -1e9, 1e9))
            list = false;
        else
            l->layers[i++] = (int)e->valuedouble;
    }
    l->count = i;
    if (list)
        return RP_OK;
    if (o->r >= OG_0_6_1)
        return fail(o, key, v, "must be a list of 1 to 256 whole numbers >= -1 (-1 a wildcard)");
    rpi_value_text(v, vt, sizeof vt);
    snprintf(bad, cap, "'%s' is %s, not a list of whole numbers", key, vt);
    l->count = 1;
    l->layers[0] = 0;
    return RP_OK;
}

static bool has_wildcard(const rp_layer_list *l) {
    for (int i = 0; i < l->count; i++)
        if (l->layers[i] == -1)
            return true;
    return false;
}

static bool is_default(const rp_layer_list *l) { return l->count == 1 && l->layers[0] == -1; }

/* One pipeline's stages from its layers per IPU and IPUs per replica, as
** the model's parallelize() of release r placed them. `bad` receives why no
** model's layers can be placed, for the message of the expansion. */
static void place(og_read *o, const rp_layer_list *given, int ipus, const char *lkey,
                  const char *ikey, rp_layer_list *out, char *bad, size_t cap) {
    bad[0] = '\0';
    if (o->r < OG_0_6_0 && (o->val[K_LAYERS] || o->c->layers)) { /* the counts as they stand, one IPU after another */
        o->c->cfg->layers_by_index = true;
        int n = given->count > ipus ? given->count : ipus;
        out->count = n;
        bool minus = false;
        for (int i = 0; i < n; i++) {
            int x = i < given->count ? given->layers[i] : 0;
            minus |= x < 0;
            out->layers[i] = x < 0 ? 0 : x;
        }
        if (minus)
            rpi_warn(o->c->cfg, "%s: key '%s': before 0.6.0 a negative count placed no layers "
                     "(wildcards came in 0.6.0); read as 0", o->c->name, lkey);
        return;
    }
    if (!o->f->ipu) { /* repipe's own file: its list, as it stands */
        *out = *given;
        if (given->count != ipus)
            snprintf(bad, cap, "'%s' lists %d stages but '%s' is %d", lkey, given->count, ikey,
                     ipus);
        return;
    }
    out->count = ipus;
    if (ipus == 1) { /* everything on one IPU, whatever the list says */
        out->layers[0] = -1;
        if (given->count > 1)
            rpi_warn(o->c->cfg, "%s: key '%s': with one IPU per replica IPUConfig puts every "
                     "layer on it and ignores the list", o->c->name, lkey);
        return;
    }
    bool all_wild = true;
    for (int i = 0; i < given->count; i++)
        all_wild &= given->layers[i] == -1;
    if (all_wild && (given->count == 1 || given->count == ipus)) {
        for (int i = 0; i < ipus; i++)
            out->layers[i] = -1;
        return;
    }
    if (given->count != ipus) {
        snprintf(bad, cap, "'%s' lists %d IPUs but '%s' is %d", lkey, given->count, ikey, ipus);
        for (int i = 0; i < ipus; i++)
            out->layers[i] = -1;
        return;
    }
    *out = *given;
}

static rp_status layers(og_read *o) {
    rpi_load *c = o->c;
    rp_config *cfg = c->cfg;
    rp_status s;
    /* repipe's names are the same lists */
    const cJSON *lv = o->val[K_LAYERS], *iv = o->val[K_INF_LAYERS];
    const char *lkey = "layers_per_ipu", *ikey = "inference_layers_per_ipu";
    if (c->layers) {
        if (o->f->raw[K_LAYERS])
            return rp_fail(c->err, RP_ERR_INVALID, "%s: keys 'layers_per_ipu' and '%s' both "
                           "given; they are the same setting, keep one", c->name, c->layers_key);
        lv = c->layers;
        lkey = c->layers_key;
    }
    if (c->inference_layers) {
        if (o->f->raw[K_INF_LAYERS])
            return rp_fail(c->err, RP_ERR_INVALID, "%s: keys 'inference_layers_per_ipu' and "
                           "'%s' both given; they are the same setting, keep one", c->name,
                           c->inference_layers_key);
        if (o->r < OG_0_6_1)
            return fail(o, c->inference_layers_key, c->inference_layers,
                        "inference pipelines of their own came in 0.6.1");
        iv = c->inference_layers;
        ikey = c->inference_layers_key;
    }
    c->layers_key = lkey;
    c->inference_layers_key = ikey;
    snprintf(cfg->layers_key[0], sizeof cfg->layers_key[0], "%s", lkey);
    snprintf(cfg->layers_key[1], sizeof cfg->layers_key[1], "%s", ikey);
    /* a key the file does not hold takes the current release's default: the
    ** layers split evenly over ipus_per_replica IPUs, as many as the list has */
    rp_layer_list L = {1, {-1}}, IL;
    char bad[RP_WARNING_MAX] = "", ibad[RP_WARNING_MAX] = "";
    if (lv && (s = raw_layers(o, lkey, lv, &L, bad, sizeof bad)))
        return s;
    int ipus, inf_ipus;
    if (o->r < OG_0_6_0 && lv) {
        if ((s = get_int(o, K_IPUS, 1, L.count, &ipus)))
            return s;
        place(o, &L, ipus, lkey, "ipus_per_replica", &cfg->layers_per_stage,
              cfg->layers_error[0], sizeof cfg->layers_error[0]);
        if (bad[0])
            snprintf(cfg->layers_error[0], sizeof cfg->layers_error[0], "%s", bad);
        snprintf(cfg->layers_error[1], sizeof cfg->layers_error[1], "%s", cfg->layers_error[0]);
        return RP_OK; /* inference runs the training pipeline */
    }
    if (!lv && (s = get_int(o, K_IPUS, 1, L.count, &ipus)))
        return s;
    if (lv && (s = get_int(o, K_IPUS, 1, L.count, &ipus)))
        return s;
    if (o->r <= OG_0_6_0) { /* inference runs the training pipeline */
        place(o, &L, ipus, lkey, "ipus_per_replica", &cfg->layers_per_stage,
              cfg->layers_error[0], sizeof cfg->layers_error[0]);
        if (bad[0])
            snprintf(cfg->layers_error[0], sizeof cfg->layers_error[0], "%s", bad);
        snprintf(cfg->layers_error[1], sizeof cfg->layers_error[1], "%s", cfg->layers_error[0]);
        return RP_OK;
    }
    /* 0.6.1 on: an inference pipeline of its own, by these fallbacks */
    IL = L;
    if (iv && (s = raw_layers(o, ikey, iv, &IL, ibad, sizeof ibad)))
        return s;
    int fallback = ipus;
    if (ipus == L.count || !is_default(&IL))
        fallback = IL.count;
    if ((s = get_int(o, K_INF_IPUS, 1, fallback, &inf_ipus)))
        return s;
    /* both modes: a list without wildcards names its IPUs */
    const rp_layer_list *lists[2] = {&L, &IL};
    const int counts[2] = {ipus, inf_ipus};
    const char *lkeys[2] = {lkey, ikey};
    const char *ikeys[2] = {"ipus_per_replica", "inference_ipus_per_replica"};
    for (int m = 0; m < 2; m++)
        if (!has_wildcard(lists[m]) && lists[m]->count != counts[m]) {
            char rule[160];
            snprintf(rule, sizeof rule, "it lists %d IPUs but %s is %d (a list without "
                     "wildcards names every IPU)", lists[m]->count, ikeys[m], counts[m]);
            return fail(o, lkeys[m], m ? (iv ? iv : lv) : lv, rule);
        }
    place(o, &L, ipus, lkey, ikeys[0], &cfg->layers_per_stage, cfg->layers_error[0],
          sizeof cfg->layers_error[0]);
    place(o, &IL, inf_ipus, ikey, ikeys[1], &cfg->inference_layers_per_stage,
          cfg->layers_error[1], sizeof cfg->layers_error[1]);
    /* an inference pipeline the same as training's is training's */
    const rp_layer_list *a = &cfg->layers_per_stage, *b = &cfg->inference_layers_per_stage;
    cfg->inference_layers_set =
        a->count != b->count || memcmp(a->layers, b->layers, sizeof(int) * a->count) != 0 ||
        strcmp(cfg->layers_error[0], cfg->layers_error[1]) != 0;
    return RP_OK;
}

/* ---- memory proportions -------------------------------------------------------- */

static rp_status proportions(og_read *o, int k, const cJSON *v, int stages, double *vals,
                             int *count, bool *list) {
    const char *key = KEYS[k].name;
    char rule[160];
    *list = cJSON_IsArray(v);
    if (cJSON_IsNumber(v)) {
        /* IPUConfig tests isinstance(value, float): 1 is not, 1.0 is */
        if (!(v->type & RP_JSON_FRACTION))
            return fail(o, key, v, "IPUConfig takes a float here (write 1 as 1.0)");
        if (!(v->valuedouble >= 0) || !isfinite(v->valuedouble))
            return fail(o, key, v, "must be >= 0");
        vals[0] = v->valuedouble;
        *count = 1;
        return RP_OK;
    }
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    if (n < 1 || n > RP_MAX_STAGES)
        return fail(o, key, v, "must be a number >= 0, or a list of them, one per IPU");
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0) || !isfinite(e->valuedouble))
            return fail(o, key, v, "every entry must be a number >= 0");
        vals[i++] = e->valuedouble;
    }
    *count = n;
    if (n == stages)
        return RP_OK;
    if (o->r >= OG_0_6_1 || (n > 1 && n < stages)) {
        snprintf(rule, sizeof rule, "it lists %d values for %d IPUs (one value, or one per IPU)",
                 n, stages);
        return fail(o, key, v, rule);
    }
    if (n == 1) { /* before 0.6.1 one listed value served every IPU */
        for (int j = 1; j < stages; j++)
            vals[j] = vals[0];
        rpi_warn(o->c->cfg, "%s: key '%s': one value for %d IPUs serves them all, as releases "
                 "before 0.6.1 read it (0.6.1 and later refuse this)", o->c->name, key, stages);
    } else {
        rpi_warn(o->c->cfg, "%s: key '%s': %d values for %d IPUs; the last %d are not used, "
                 "as releases before 0.6.1 read it", o->c->name, key, n, stages, n - stages);
    }
    *count = stages;
    return RP_OK;
}

static rp_status matmul(og_read *o) {
    rp_config *cfg = o->c->cfg;
    rp_status s;
    int stages = cfg->layers_per_stage.count;
    int inf = rp_config_num_stages(cfg, true);
    if (o->val[K_MATMUL] &&
        (s = proportions(o, K_MATMUL, o->val[K_MATMUL], stages, cfg->matmul_proportion,
                         &cfg->matmul_proportion_count, &o->c->matmul_list)))
        return s;
    if (o->r < OG_0_6_1)
        return RP_OK; /* inference takes the training values */
    if (o->val[K_INF_MATMUL])
        return proportions(o, K_INF_MATMUL, o->val[K_INF_MATMUL], inf,
                           cfg->inference_matmul_proportion,
                           &cfg->inference_matmul_proportion_count,
                           &o->c->inference_matmul_list);
    /* a list of another length than the inference pipeline's falls back to 0.2 */
    if (o->c->matmul_list && cfg->matmul_proportion_count != inf) {
        cfg->inference_matmul_proportion[0] = 0.2;
        cfg->inference_matmul_proportion_count = 1;
    }
    return RP_OK;
}

/* ---- serialized layers ----------------------------------------------------------- */

/* *_splits_per_ipu: pieces of a layer per IPU, whole numbers >= 0, at least
** one piece, on consecutive IPUs, one entry per IPU; the sum of pieces. */
static rp_status splits(og_read *o, int k, int ipus, int *pieces) {
    const cJSON *v = o->val[k];
    const char *key = KEYS[k].name;
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1, sum = 0, last = -1;
    bool gap = false;
    if (n < 1 || n > RP_MAX_STAGES)
        return fail(o, key, v, "must be a list of whole numbers >= 0, one per IPU");
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        if (!rpi_is_whole(e, 0, 1e9))
            return fail(o, key, v, "every entry must be a whole number >= 0");
        int x = (int)e->valuedouble;
        if (x > 0 && last >= 0 && gap)
            return fail(o, key, v, "the pieces must lie on consecutive IPUs");
        if (x > 0)
            last = i;
        else if (last >= 0)
            gap = true;
        sum += x;
    }
    if (sum < 1)
        return fail(o, key, v, "at least one piece, on one IPU");
    if (n != ipus) {
        char rule[96];
        snprintf(rule, sizeof rule, "it lists %d IPUs but the pipeline has %d", n, ipus);
        return fail(o, key, v, rule);
    }
    *pieces = sum;
    return RP_OK;
}

static rp_status serialization(og_read *o) {
    rpi_load *c = o->c;
    rp_config *cfg = c->cfg;
    rp_status s;
    if (o->r < OG_0_6_1) { /* one factor for both; 0 meant "not serialized" */
        int f;
        if ((s = get_int(o, K_ESF, 0, 1, &f)))
            return s;
        if (f == 0) {
            rpi_warn(cfg, "%s: key 'embedding_serialization_factor': 0 meant not serialized "
                     "before 0.6.1 (read as 1; 0.6.1 and later refuse 0)", c->name);
            f = 1;
        }
        cfg->embedding_serialization_factor = cfg->inference_embedding_serialization_factor = f;
        return RP_OK;
    }
    static const int factor[4] = {K_ESF, K_INF_ESF, K_PSF, K_INF_PSF};
    static const int split[4] = {K_ES, K_INF_ES, K_PS, K_INF_PS};
    for (int m = 0; m < 4; m++) {
        int ipus = m & 1 ? rp_config_num_stages(cfg, true) : cfg->layers_per_stage.count;
        int f = 1, pieces = 0;
        if ((s = get_int(o, factor[m], 1, 1, &f)))
            return s;
        if (o->val[split[m]]) {
            if (o->val[factor[m]])
                return rp_fail(c->err, RP_ERR_INVALID,
                               "%s: keys '%s' and '%s': give one of them, not both (a factor "
                               "serializes the layer where it is, the splits place its "
                               "pieces)%s", c->name, KEYS[factor[m]].name, KEYS[split[m]].name,
                               c->as);
            if ((s = splits(o, split[m], ipus, &pieces)))
                return s;
            f = pieces;
            if (m < 2)
                rpi_warn(cfg, "%s: key '%s': the embedding is serialized into its %d pieces on "
                         "the stage that holds it; their placement is ignored", c->name,
                         KEYS[split[m]].name, pieces);
        }
        if (m == 0)
            cfg->embedding_serialization_factor = f;
        else if (m == 1)
            cfg->inference_embedding_serialization_factor = f;
        else if (f > 1)
            rpi_warn(cfg, "%s: key '%s': repipe does not split a linear layer's product; "
                     "ignored", c->name, KEYS[o->val[split[m]] ? split[m] : factor[m]].name);
    }
    return RP_OK;
}

/* ---- the whole reading --------------------------------------------------------------- */

static rp_status read_keys(og_read *o) {
    rpi_load *c = o->c;
    rp_config *cfg = c->cfg;
    const og_file *f = o->f;
    rp_status s;
    for (int k = 0; k < K_COUNT; k++) {
        if ((s = value(o, k)))
            return s;
        /* a key this release dropped: a warning, in every release */
        if (f->raw[k] && !cJSON_IsNull(f->raw[k]) && !reads(k, o->r))
            rpi_warn(cfg, "%s: key '%s' was read by Optimum Graphcore %s to %s only; ignored%s",
                     c->name, KEYS[k].name, OG_NAME[KEYS[k].from], OG_NAME[KEYS[k].to], c->as);
    }
    if ((s = get_int(o, K_R, 1, 1, &cfg->replication_factor)))
        return s;
    int ga = K_GA;
    if (o->r == OG_PRE && !o->val[K_GA])
        ga = K_GA_PRE;
    if ((s = get_int(o, ga, 1, 1, &cfg->gradient_accumulation_steps)) ||
        (s = get_int(o, K_D, 1, 1, &cfg->device_iterations)))
        return s;
    if (o->r < OG_0_2_1) { /* inference ran on the training options */
        cfg->inference_replication_factor = cfg->replication_factor;
        cfg->inference_device_iterations = cfg->device_iterations;
    } else if ((s = get_int(o, K_INF_R, 1, 1, &cfg->inference_replication_factor)) ||
               (s = get_int(o, K_INF_D, 1, 1, &cfg->inference_device_iterations))) {
        return s;
    }
    if ((s = get_bool(o, K_OFFCHIP, &cfg->optimizer_state_offchip)) ||
        (s = get_bool(o, K_RTS, &cfg->replicated_tensor_sharding)) ||
        (s = get_bool(o, K_RECOMPUTE, &cfg->recompute_checkpoint_every_layer)) ||
        (s = get_bool(o, K_HALF, &cfg->enable_half_partials)) ||
        (s = get_bool(o, K_ALS, &cfg->auto_loss_scaling)))
        return s;
    if (cfg->enable_half_partials && f->raw[K_HALF] && !cJSON_IsNull(f->raw[K_HALF]))
        rpi_warn(cfg, "%s: key 'enable_half_partials': fp16 partial sums of products are an "
                 "IPU's; repipe's products sum in fp32, so it has no effect (fp16 traffic "
                 "between stages is 'fp16_exchange')", c->name);
    bool encoder = false;
    if ((s = get_bool(o, K_ENCODER_CPU, &encoder)))
        return s;
    if (encoder)
        return fail(o, "execute_encoder_on_cpu_for_generation", o->val[K_ENCODER_CPU],
                    "IPUConfig refuses it (\"not supported yet\")");
    int seed = o->r < OG_0_2_1 ? K_RANDOM_SEED : K_SEED;
    if (o->val[seed]) {
        if (!rpi_is_whole(o->val[seed], 0, 9007199254740992.0))
            return fail(o, KEYS[seed].name, o->val[seed], "must be a whole number between 0 "
                                                          "and 2^53");
        cfg->seed = (uint64_t)o->val[seed]->valuedouble;
    }
    const cJSON *v = o->val[K_CACHE];
    if (v) {
        if (!cJSON_IsString(v) || strlen(v->valuestring) >= RP_PATH_MAX)
            return fail(o, "executable_cache_dir", v,
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
            return fail(o, "output_mode", v, "must be one of \"all\", \"sum\", \"final\", "
                                             "\"default\"");
        cfg->output_mode = (rp_output_mode)m;
    }
    for (int k = K_PARALLELIZE; k <= K_INF_PARALLELIZE; k++)
        if ((v = o->val[k])) {
            if (!cJSON_IsObject(v))
                return fail(o, KEYS[k].name, v, "must be an object of keyword arguments");
            if (v->child)
                rpi_warn(cfg, "%s: key '%s': keyword arguments of a PyTorch model's "
                         "parallelize(); a repipe model has none; ignored", c->name,
                         KEYS[k].name);
        }
    for (int k = 0; k < K_COUNT; k++)
        if (KEYS[k].kind == OK_IGNORED && o->val[k] && !cJSON_IsFalse(o->val[k]))
            rpi_warn(cfg, "%s: key '%s' (%s) has no meaning in repipe; ignored", c->name,
                     KEYS[k].name, KEYS[k].note);
    if (o->val[K_SYNTHETIC] && !cJSON_IsBool(o->val[K_SYNTHETIC]))
        return fail(o, "synthetic_data", o->val[K_SYNTHETIC], "must be true or false");
    if ((s = layers(o)) || (s = matmul(o)) || (s = serialization(o)))
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
                 "Optimum Graphcore %s ignored it", c->name, item->string, vt, OG_NAME[o->r]);
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
                 c->name, key, OG_NAME[o->r]);
    }
    return RP_OK;
}

static rp_status attempt(rpi_load *c, const og_file *f, og_release r) {
    rp_config_default(c->cfg);
    c->layers = c->inference_layers = NULL;
    c->layers_key = c->inference_layers_key = NULL;
    c->group_size = 0;
    c->group_stride = 1;
    c->matmul_list = c->inference_matmul_list = false;
    c->lenient = f->ipu && r <= OG_0_6_1;
    if (f->ipu)
        snprintf(c->as, sizeof c->as, " (as Optimum Graphcore %s reads this IPUConfig file)",
                 OG_NAME[r]);
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
                         "earlier; read as the later", c->name, f.lo_why, OG_NAME[f.lo],
                         f.hi_why, OG_NAME[f.hi]);
            if (failed) {
                char *m = strstr(first.msg, ": ");
                rpi_warn(cfg, "%s: read as Optimum Graphcore %s reads it: %s, the oldest "
                         "release its keys allow, refuses it: %s", c->name, OG_NAME[r],
                         OG_NAME[lo], m ? m + 2 : first.msg);
            }
            snprintf(cfg->ipu_release, sizeof cfg->ipu_release, "%s", OG_NAME[r]);
            snprintf(cfg->origin, sizeof cfg->origin,
                     "an Optimum Graphcore IPUConfig file, read as release %s reads it (%s%.120s)",
                     OG_NAME[r], r == (int)lo && lo > OG_0_1 ? "the oldest release for "
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
