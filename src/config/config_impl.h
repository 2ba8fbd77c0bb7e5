/*
** Inside the configuration loader: what its two readers share. config_keys.c
** reads repipe's own keys and checks the rules between keys; ipuconfig.c
** reads the keys of Optimum Graphcore's IPUConfig the way the release that
** wrote the file read them, and drives the load (config_load.c is the entry).
*/
#ifndef REPIPE_CONFIG_IMPL_H
#define REPIPE_CONFIG_IMPL_H

#include <stdbool.h>

#include "repipe/config.h"

struct cJSON;

typedef struct rpi_load {
    const char *name; /* file name for messages */
    rp_error *err;
    rp_config *cfg;
    /* repipe's layer keys, when given (they are aliases of IPUConfig's) */
    const struct cJSON *layers, *inference_layers;
    const char *layers_key, *inference_layers_key; /* the spelling the file used */
    int group_size, group_stride; /* from replica_grouping */
    /* matmul_proportion given as a list (a list of one value is not a
    ** scalar: it names one stage) */
    bool matmul_list, inference_matmul_list;
    /* an IPUConfig release that ignored keys it did not know: repipe's own
    ** keys whose value is not repipe's form are then ignored with a warning */
    bool lenient;
    /* " (read as ...)" for messages of an IPUConfig file; "" for repipe's */
    char as[96];
} rpi_load;

/* Message helpers: every one names the file, the key, the value and the rule. */
void rpi_value_text(const struct cJSON *v, char *buf, size_t n);
rp_status rpi_bad_value(rpi_load *c, const char *key, const struct cJSON *v, const char *rule);
void rpi_warn(rp_config *cfg, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* A whole number written without a fraction, in [lo, hi] ("2.0" is not
** one: Python reads it as a float, and IPUConfig refuses it). */
bool rpi_is_whole(const struct cJSON *v, double lo, double hi);
rp_status rpi_get_int(rpi_load *c, const char *key, const struct cJSON *v, int lo, int *out);
rp_status rpi_get_bool(rpi_load *c, const char *key, const struct cJSON *v, bool *out);
/* A list of whole numbers >= -1 (-1 a wildcard), 1 to RP_MAX_STAGES of them. */
rp_status rpi_get_layer_list(rpi_load *c, const char *key, const struct cJSON *v,
                             rp_layer_list *out);

/* repipe's own keys: those no IPUConfig release reads. */
bool rpi_is_repipe_key(const char *key);
rp_status rpi_repipe_key(rpi_load *c, const char *key, const struct cJSON *v);
/* Whether v has the JSON type of repipe's key (an object for "optimizer"). */
bool rpi_repipe_form(const char *key, const struct cJSON *v);
/* The i-th of repipe's own keys, NULL past the last. */
const char *rpi_repipe_key_name(int i);
/* Every key a configuration may hold, repipe's and IPUConfig's, for the
** "did you mean" of an unknown key. */
const char *rpi_closest_key(const char *key);

/* The rules between keys, once every key is in (stage replication and
** groupings against the stages, the worker and sample limits). */
rp_status rpi_validate(rpi_load *c);

/* Reads the whole object: IPUConfig's keys as the release that wrote the
** file read them (or as the current release, in a file of repipe's own
** keys), repipe's keys, then the rules between keys. */
rp_status rpi_read_object(rpi_load *c, const struct cJSON *root, const char *pod_type);

#endif /* REPIPE_CONFIG_IMPL_H */
