/*
** Devices and clusters: the presets, with where their numbers come from,
** and a user's own as JSON.
**
** The peaks, memories and bandwidths are the vendors' datasheets. The two
** efficiencies are what kernels reach of them, set once per device and not
** fitted to any model or run: large bf16 products reach about 80 % of the
** tensor cores' peak in cuBLAS (NVIDIA's "Matrix Multiplication Background"
** guide shows A100 products of thousands a side at 250-270 of 312
** TFLOP/s), and a product whose smallest side is d reaches
** d / (d + 64) of that (a side of 64, an attention head's, fills half the
** tiles' work; of 1024, 94 %); elementwise kernels stream at about 80 % of
** the memory's bandwidth. The links are what NCCL's all-reduce moves
** (nccl-tests' bus bandwidth): on a DGX A100 about 230 GB/s a GPU through
** the NVSwitch (NVLink 3: 300 GB/s each way) and 23 GB/s a GPU through its
** own 200 Gb/s HDR InfiniBand adapter; on a DGX H100 about 360 GB/s (NVLink
** 4: 450 GB/s each way) and 45 GB/s (400 Gb/s NDR).
*/
#include "../core/json.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "repipe/device.h"

static const rp_device DEVICES[] = {
    /* A100 SXM4 80GB datasheet: 312 TFLOP/s bf16 dense, 80 GB HBM2e, 2039 GB/s */
    {"a100-80gb", 312e12, 80e9, 2039e9, 0.80, 64, 0.80},
    /* H100 SXM5 80GB datasheet: 989 TFLOP/s bf16 dense, 80 GB HBM3, 3.35 TB/s
    ** (its products reach a smaller share of a higher peak: about 70 %) */
    {"h100-80gb", 989e12, 80e9, 3350e9, 0.70, 64, 0.80},
    /* V100 SXM2 32GB datasheet: 125 TFLOP/s fp16 tensor cores, 32 GB HBM2,
    ** 900 GB/s */
    {"v100-32gb", 125e12, 32e9, 900e9, 0.80, 64, 0.80},
};

static const struct {
    const char *name, *device;
    int per_node;
    double node_bandwidth, network_bandwidth, latency;
} CLUSTERS[] = {
    /* DGX A100: 8 A100 80GB on NVSwitch, 8 x 200 Gb/s HDR InfiniBand */
    {"dgx-a100", "a100-80gb", 8, 230e9, 23e9, 1e-5},
    /* DGX H100: 8 H100 on NVSwitch (NVLink 4), 8 x 400 Gb/s NDR InfiniBand */
    {"dgx-h100", "h100-80gb", 8, 360e9, 45e9, 1e-5},
};

const char *const *rp_device_presets(void) {
    static const char *const names[] = {"a100-80gb", "h100-80gb", "v100-32gb", NULL};
    return names;
}

const char *const *rp_cluster_presets(void) {
    static const char *const names[] = {"dgx-a100", "dgx-h100", NULL};
    return names;
}

/* A positive number at key, into *v (kept where the key is absent and
** `need` is false). */
static rp_status number(const cJSON *o, const char *file, const char *key, bool need, double *v,
                        rp_error *err) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x && !need)
        return RP_OK;
    if (!x)
        return rp_fail(err, RP_ERR_INVALID, "%s: \"%s\" is missing", file, key);
    if (!cJSON_IsNumber(x) || !(x->valuedouble > 0) || x->valuedouble > 1e30)
        return rp_fail(err, RP_ERR_INVALID, "%s: \"%s\" must be a number > 0", file, key);
    *v = x->valuedouble;
    return RP_OK;
}

static rp_status device_json(const cJSON *o, const char *file, rp_device *d, rp_error *err) {
    static const char *const keys[] = {"name", "peak_flops", "memory_bytes", "memory_bandwidth",
                                       "gemm_efficiency", "gemm_half", "memory_efficiency"};
    if (!cJSON_IsObject(o))
        return rp_fail(err, RP_ERR_INVALID, "%s: a device is an object of %s, %s, ...", file,
                       keys[1], keys[2]);
    for (const cJSON *k = o->child; k; k = k->next) {
        size_t i = 0;
        while (i < sizeof keys / sizeof *keys && strcmp(k->string, keys[i]) != 0)
            i++;
        if (i == sizeof keys / sizeof *keys)
            return rp_fail(err, RP_ERR_INVALID, "%s: \"%s\" is not a device's key (%s, %s, %s, "
                           "%s, %s, %s, %s)", file, k->string, keys[0], keys[1], keys[2],
                           keys[3], keys[4], keys[5], keys[6]);
    }
    memset(d, 0, sizeof *d);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name");
    snprintf(d->name, sizeof d->name, "%s", cJSON_IsString(n) ? n->valuestring : file);
    d->gemm_efficiency = 0.8, d->gemm_half = 64, d->memory_efficiency = 0.8;
    rp_status st;
    if ((st = number(o, file, "peak_flops", true, &d->peak_flops, err)) ||
        (st = number(o, file, "memory_bytes", true, &d->memory_bytes, err)) ||
        (st = number(o, file, "memory_bandwidth", true, &d->memory_bandwidth, err)) ||
        (st = number(o, file, "gemm_efficiency", false, &d->gemm_efficiency, err)) ||
        (st = number(o, file, "gemm_half", false, &d->gemm_half, err)) ||
        (st = number(o, file, "memory_efficiency", false, &d->memory_efficiency, err)))
        return st;
    if (d->gemm_efficiency > 1 || d->memory_efficiency > 1)
        return rp_fail(err, RP_ERR_INVALID, "%s: gemm_efficiency and memory_efficiency are shares "
                       "of a peak: at most 1", file);
    return RP_OK;
}

static rp_status load(const char *file, cJSON **out, rp_error *err) {
    char *text;
    size_t len;
    rp_status st = rp_read_regular_file(file, &text, &len, err);
    if (st)
        return st;
    st = rp_json_parse(text, len, file, out, err);
    free(text);
    return st;
}

static bool preset_device(const char *name, rp_device *out) {
    for (size_t i = 0; i < sizeof DEVICES / sizeof *DEVICES; i++)
        if (strcmp(name, DEVICES[i].name) == 0) {
            *out = DEVICES[i];
            return true;
        }
    return false;
}

rp_status rp_device_get(const char *what, rp_device *out, rp_error *err) {
    if (preset_device(what, out))
        return RP_OK;
    if (!strchr(what, '/') && !strstr(what, ".json"))
        return rp_fail(err, RP_ERR_INVALID, "device '%s': not a preset (a100-80gb, h100-80gb, "
                       "v100-32gb) or a JSON file", what);
    cJSON *o;
    rp_status st = load(what, &o, err);
    if (st)
        return st;
    st = device_json(o, what, out, err);
    cJSON_Delete(o);
    return st;
}

rp_status rp_cluster_get(const char *what, rp_cluster *out, rp_error *err) {
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < sizeof CLUSTERS / sizeof *CLUSTERS; i++)
        if (strcmp(what, CLUSTERS[i].name) == 0) {
            snprintf(out->name, sizeof out->name, "%s", CLUSTERS[i].name);
            preset_device(CLUSTERS[i].device, &out->device);
            out->per_node = CLUSTERS[i].per_node;
            out->node_bandwidth = CLUSTERS[i].node_bandwidth;
            out->network_bandwidth = CLUSTERS[i].network_bandwidth;
            out->latency = CLUSTERS[i].latency;
            return RP_OK;
        }
    if (!strchr(what, '/') && !strstr(what, ".json"))
        return rp_fail(err, RP_ERR_INVALID, "cluster '%s': not a preset (dgx-a100, dgx-h100) or "
                       "a JSON file", what);
    cJSON *o;
    rp_status st = load(what, &o, err);
    if (st)
        return st;
    static const char *const keys[] = {"name", "device", "per_node", "node_bandwidth",
                                       "network_bandwidth", "latency"};
    for (const cJSON *k = cJSON_IsObject(o) ? o->child : NULL; k; k = k->next) {
        size_t i = 0;
        while (i < sizeof keys / sizeof *keys && strcmp(k->string, keys[i]) != 0)
            i++;
        if (i == sizeof keys / sizeof *keys) {
            st = rp_fail(err, RP_ERR_INVALID, "%s: \"%s\" is not a cluster's key (name, device, "
                         "per_node, node_bandwidth, network_bandwidth, latency)", what, k->string);
            goto done;
        }
    }
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "device");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name");
    snprintf(out->name, sizeof out->name, "%s", cJSON_IsString(n) ? n->valuestring : what);
    if (!cJSON_IsObject(o) || !d) {
        st = rp_fail(err, RP_ERR_INVALID, "%s: a cluster is an object with a \"device\" (a "
                     "preset's name or a device object)", what);
        goto done;
    }
    if (cJSON_IsString(d)) {
        if (!preset_device(d->valuestring, &out->device)) {
            st = rp_fail(err, RP_ERR_INVALID, "%s: \"device\": '%s' is not a preset (a100-80gb, "
                         "h100-80gb, v100-32gb)", what, d->valuestring);
            goto done;
        }
    } else if ((st = device_json(d, what, &out->device, err))) {
        goto done;
    }
    double per = 0;
    out->latency = 1e-5;
    if ((st = number(o, what, "per_node", true, &per, err)) ||
        (st = number(o, what, "node_bandwidth", true, &out->node_bandwidth, err)) ||
        (st = number(o, what, "network_bandwidth", true, &out->network_bandwidth, err)) ||
        (st = number(o, what, "latency", false, &out->latency, err)))
        goto done;
    if (per != (int)per || per > 4096) {
        st = rp_fail(err, RP_ERR_INVALID, "%s: \"per_node\" must be a whole number of devices "
                     "(1 to 4096)", what);
        goto done;
    }
    out->per_node = (int)per;
done:
    cJSON_Delete(o);
    return st;
}

rp_status rp_cluster_sim_options(const rp_cluster *c, int t, int workers, rp_sim_options *o,
                                 rp_error *err) {
    if (t < 1 || c->per_node % t)
        return rp_fail(err, RP_ERR_INVALID, "cluster %s: tensor groups of %d do not divide its "
                       "nodes of %d devices", c->name, t, c->per_node);
    rp_sim_options_default(o);
    int per = c->per_node / t, nodes = (workers + per - 1) / per;
    o->num_levels = 2;
    o->machines[0] = per;
    o->machines[1] = nodes > 0 ? nodes : 1;
    /* a worker's t devices each move their share over their own link: the
    ** profile's bytes are one device's (a stage's output sent in t pieces
    ** and gathered inside the node, as Megatron-LM's scatter/gather does;
    ** a rank's parameters reduced with the same rank of the other
    ** replicas) */
    o->bandwidth[0] = c->node_bandwidth;
    o->bandwidth[1] = c->network_bandwidth;
    o->latency = c->latency;
    /* the optimizer's pass per fp32 byte of parameters (the profile's):
    ** Adam with mixed precision reads and writes the fp32 weight, its two
    ** moments, reads the fp32 gradient and writes the bf16 weight, 30 bytes
    ** a parameter, 7.5 per byte profiled */
    o->memory_bandwidth = c->device.memory_bandwidth * c->device.memory_efficiency / 7.5;
    o->mixed_precision = true;
    return RP_OK;
}
