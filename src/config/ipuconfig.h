/*
** Inside the IPUConfig reader: Optimum Graphcore's releases, the keys of its
** IPUConfig with the releases that read them, and one release's reading of
** one file. ipuconfig_keys.c holds the table and the value helpers,
** ipuconfig_layers.c the pipelines (layers per IPU, memory proportions,
** serialized layers), and ipuconfig.c reads a file with them.
*/
#ifndef REPIPE_IPUCONFIG_H
#define REPIPE_IPUCONFIG_H

#include <stdbool.h>

#include "config_impl.h"

struct cJSON;

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

/* The releases' names for messages ("0.6.0", "0.2.3-0.5"). */
extern const char *const rpi_og_name[OG_COUNT];

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

typedef struct og_key {
    const char *name;
    og_release from, to; /* the releases that read it (for files: wrote it) */
    og_kind kind;
    bool shared;   /* a key of repipe's own files too */
    bool optional; /* Optional from 0.6.1: null is "not set" */
    const char *note; /* OK_IGNORED: what IPUConfig did with it */
} og_key;
extern const og_key rpi_og_keys[K_COUNT];

/* Whether release r reads key k. */
static inline bool rpi_og_reads(int k, og_release r) {
    return rpi_og_keys[k].from <= r && r <= rpi_og_keys[k].to;
}
/* The key of that name, or -1. */
int rpi_og_find(const char *name);
/* The key a development version's training_X stands for, or -1. */
int rpi_og_training_alias(const char *name);
/* Whether the key is an attribute of transformers' PretrainedConfig. */
bool rpi_og_pretrained(const char *key);

/* The file, before any release reads it. */
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

/* One release reading the file. */
typedef struct og_read {
    rpi_load *c;
    const og_file *f;
    og_release r;
    const cJSON *val[K_COUNT]; /* the values this release takes, pod types resolved */
} og_read;

/* A value refused, with the release's reading in the message. */
rp_status rpi_og_fail(og_read *o, const char *key, const struct cJSON *v, const char *rule);
/* Key k's value as a whole number >= lo (dflt when not set), a boolean. */
rp_status rpi_og_int(og_read *o, int k, int lo, int dflt, int *out);
rp_status rpi_og_bool(og_read *o, int k, bool *out);

/* The pipelines: training's and inference's layers (ipuconfig_layers.c). */
rp_status rpi_og_layers(og_read *o);
rp_status rpi_og_matmul(og_read *o);
rp_status rpi_og_serialization(og_read *o);

#endif /* REPIPE_IPUCONFIG_H */
