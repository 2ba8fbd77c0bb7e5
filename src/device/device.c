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

/* Attention: FlashAttention-2 reaches up to 225 TFLOP/s forward and
** backward on an A100 at head size 128 (Dao, "FlashAttention-2", 2023,
** figure 6: 72 % of the peak); on an H100 the fused kernels Megatron-LM
** runs (cuDNN's, through Transformer Engine) about 500-600 TFLOP/s forward
** and backward (FlashAttention-3's paper, 2024, figures 5-7, cuDNN beside
** it: 55 % of the bf16 peak). fp8 peaks are the datasheets' dense ones; fp8
** products reach the same share of theirs as bf16 ones of theirs (cuBLAS:
** about 1300-1450 of 1979 TFLOP/s on an H100 for products of thousands a
** side). */
static const rp_device DEVICES[] = {
    /* A100 SXM4 80GB datasheet: 312 TFLOP/s bf16 dense, 19.5 fp32 (without
    ** TF32, PyTorch's default for products), 80 GB HBM2e, 2039 GB/s */
    {.name = "a100-80gb", .peak_flops = 312e12, .peak_fp32 = 19.5e12, .memory_bytes = 80e9,
     .memory_bandwidth = 2039e9, .gemm_efficiency = 0.75, .gemm_half = 64,
     .memory_efficiency = 0.80, .attention_efficiency = 0.70},
    /* H100 SXM5 80GB datasheet: 989 TFLOP/s bf16 dense, 1979 fp8 dense, 67
    ** fp32, 80 GB HBM3, 3.35 TB/s (its products reach a smaller share of a
    ** higher peak: about 70 %) */
    {.name = "h100-80gb", .peak_flops = 989e12, .peak_fp8 = 1979e12, .peak_fp32 = 67e12,
     .memory_bytes = 80e9,
     .memory_bandwidth = 3350e9, .gemm_efficiency = 0.70, .fp8_efficiency = 0.55, .gemm_half = 64,
     .memory_efficiency = 0.80, .attention_efficiency = 0.55},
    /* H200 SXM 141GB datasheet: the H100's compute (989 bf16, 1979 fp8, 67
    ** fp32), 141 GB HBM3e, 4.8 TB/s */
    {.name = "h200-141gb", .peak_flops = 989e12, .peak_fp8 = 1979e12, .peak_fp32 = 67e12,
     .memory_bytes = 141e9,
     .memory_bandwidth = 4800e9, .gemm_efficiency = 0.70, .fp8_efficiency = 0.55, .gemm_half = 64,
     .memory_efficiency = 0.80, .attention_efficiency = 0.55},
    /* B200 (HGX B200 datasheet, a GPU): 2.25 PFLOP/s bf16 dense, 4.5 fp8
    ** dense, 180 GB HBM3e (DGX B200: 1440 GB in 8), 8 TB/s */
    {.name = "b200", .peak_flops = 2250e12, .peak_fp8 = 4500e12, .memory_bytes = 180e9,
     .memory_bandwidth = 8000e9, .gemm_efficiency = 0.70, .fp8_efficiency = 0.55, .gemm_half = 64,
     .memory_efficiency = 0.80, .attention_efficiency = 0.55},
    /* V100 SXM2 32GB datasheet: 125 TFLOP/s fp16 tensor cores, 15.7 fp32,
    ** 32 GB HBM2, 900 GB/s (no fused attention kernel of its own: the
    ** products') */
    {.name = "v100-32gb", .peak_flops = 125e12, .peak_fp32 = 15.7e12, .memory_bytes = 32e9,
     .memory_bandwidth = 900e9, .gemm_efficiency = 0.80, .gemm_half = 64,
     .memory_efficiency = 0.80, .attention_efficiency = 0.50},
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
    /* DGX H200: 8 H200 on the same NVSwitch (NVLink 4) and ConnectX-7 400 Gb/s adapters */
    {"dgx-h200", "h200-141gb", 8, 360e9, 45e9, 1e-5},
    /* DGX B200: 8 B200 on NVLink 5 (1.8 TB/s a GPU, twice NVLink 4: about
    ** 720 GB/s of all-reduce bus bandwidth), 8 x 400 Gb/s ConnectX-7 */
    {"dgx-b200", "b200", 8, 720e9, 45e9, 1e-5},
};

const char *const *rp_device_presets(void) {
    static const char *const names[] = {"a100-80gb", "h100-80gb", "h200-141gb", "b200",
                                        "v100-32gb", NULL};
    return names;
}

const char *const *rp_cluster_presets(void) {
    static const char *const names[] = {"dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", NULL};
    return names;
}

/* The names of a NULL-terminated list, comma-separated, into buf. */
static const char *names_of(const char *const *names, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; names[i] && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", names[i]);
    return buf;
}

/* A number at key in [lo, hi], into *v (kept where the key is absent and
** `need` is false). The bounds are wide but finite: a bandwidth of 1e-300
** bytes/s would make every time infinite and every count of messages
** overflow. */
static rp_status number(const cJSON *o, const char *file, const char *key, bool need, double lo,
                        double hi, double *v, rp_error *err) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x && !need)
        return RP_OK;
    if (!x)
        return rp_fail(err, RP_ERR_INVALID, "%s: \"%s\" is missing", file, key);
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= lo && x->valuedouble <= hi))
        return rp_fail(err, RP_ERR_INVALID, "%s: \"%s\" must be a number from %g to %g", file,
                       key, lo, hi);
    *v = x->valuedouble;
    return RP_OK;
}

/* A name as it is printed, in profiles and JSON: printable, no quotes or
** backslashes, at most 31 characters. */
static rp_status name_of(const cJSON *o, const char *file, const char *dflt, char *out,
                         size_t cap, rp_error *err) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!n) {
        const char *slash = strrchr(dflt, '/');
        dflt = slash ? slash + 1 : dflt;
        size_t k = 0;
        for (; *dflt && k + 1 < cap; dflt++) /* a file's name, made printable */
            out[k++] = (*dflt > ' ' && *dflt < 127 && *dflt != '"' && *dflt != '\\') ? *dflt : '_';
        out[k] = '\0';
        return RP_OK;
    }
    const char *s = cJSON_IsString(n) ? n->valuestring : NULL;
    bool ok = s && *s && strlen(s) < cap;
    for (const char *c = s; ok && *c; c++)
        ok = *c >= ' ' && *c < 127 && *c != '"' && *c != '\\';
    if (!ok)
        return rp_fail(err, RP_ERR_INVALID, "%s: \"name\" must be text of 1 to %zu printable "
                       "characters without quotes or backslashes", file, cap - 1);
    snprintf(out, cap, "%s", s);
    return RP_OK;
}

/* k where n is 2^k (k 1 to 7: a tensor group's size tensor_efficiency
** holds), else 0 */
static int size_index(long n) {
    for (int k = 1; k < 8; k++)
        if (1L << k == n)
            return k;
    return 0;
}

/* "tensor_efficiency": {"2": e, "4": e, ...}: a share for each tensor
** group's size, a power of two from 2 to 128 (each kept in
** tensor_efficiency[log2 size]); a size not given keeps 1. */
static rp_status tensor_efficiency(const cJSON *o, const char *file, rp_device *d,
                                   rp_error *err) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tensor_efficiency");
    if (!t)
        return RP_OK;
    if (!cJSON_IsObject(t))
        return rp_fail(err, RP_ERR_INVALID, "%s: \"tensor_efficiency\" is an object of a share "
                       "for each tensor group's size ({\"2\": 0.95, \"4\": 0.9})", file);
    for (const cJSON *e = t->child; e; e = e->next) {
        char *end;
        int k = size_index(strtol(e->string, &end, 10));
        if (*end || end == e->string || !k)
            return rp_fail(err, RP_ERR_INVALID, "%s: \"tensor_efficiency\": \"%s\" is not a "
                           "tensor group's size (2, 4, 8, ..., 128)", file, e->string);
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0.01 && e->valuedouble <= 2))
            return rp_fail(err, RP_ERR_INVALID, "%s: \"tensor_efficiency\": \"%s\" must be a "
                           "number from 0.01 to 2", file, e->string);
        d->tensor_efficiency[k] = e->valuedouble;
    }
    return RP_OK;
}

static rp_status device_json(const cJSON *o, const char *file, rp_device *d, rp_error *err) {
    static const char *const keys[] = {"name", "peak_flops", "peak_fp8", "memory_bytes",
                                       "memory_bandwidth", "gemm_efficiency", "gemm_half",
                                       "memory_efficiency", "attention_efficiency",
                                       "fp8_efficiency", "peak_fp32", "block_latency",
                                       "activation_scale", "tensor_efficiency"};
    if (!cJSON_IsObject(o))
        return rp_fail(err, RP_ERR_INVALID, "%s: a device is an object of %s, %s, ...", file,
                       keys[1], keys[3]);
    for (const cJSON *k = o->child; k; k = k->next) {
        size_t i = 0;
        while (i < sizeof keys / sizeof *keys && strcmp(k->string, keys[i]) != 0)
            i++;
        if (i == sizeof keys / sizeof *keys)
            return rp_fail(err, RP_ERR_INVALID, "%s: \"%s\" is not a device's key (%s, %s, %s, "
                           "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", file, k->string,
                           keys[0], keys[1], keys[2], keys[3], keys[4], keys[5], keys[6],
                           keys[7], keys[8], keys[9], keys[10], keys[11], keys[12], keys[13]);
    }
    memset(d, 0, sizeof *d);
    rp_status st = name_of(o, file, file, d->name, sizeof d->name, err);
    if (st)
        return st;
    d->gemm_efficiency = 0.8, d->gemm_half = 64, d->memory_efficiency = 0.8;
    d->attention_efficiency = 0.5, d->activation_scale = 1;
    if ((st = number(o, file, "peak_flops", true, 1e6, 1e18, &d->peak_flops, err)) ||
        (st = number(o, file, "peak_fp8", false, 0, 1e18, &d->peak_fp8, err)) ||
        (st = number(o, file, "peak_fp32", false, 0, 1e18, &d->peak_fp32, err)) ||
        (st = number(o, file, "memory_bytes", true, 1e6, 1e15, &d->memory_bytes, err)) ||
        (st = number(o, file, "memory_bandwidth", true, 1e6, 1e15, &d->memory_bandwidth, err)) ||
        (st = number(o, file, "gemm_efficiency", false, 1e-3, 1, &d->gemm_efficiency, err)) ||
        (st = number(o, file, "gemm_half", false, 0, 1e6, &d->gemm_half, err)) ||
        (st = number(o, file, "memory_efficiency", false, 1e-3, 1, &d->memory_efficiency, err)) ||
        (st = number(o, file, "attention_efficiency", false, 1e-3, 1, &d->attention_efficiency,
                     err)) ||
        (st = number(o, file, "block_latency", false, 0, 1, &d->block_latency, err)) ||
        (st = number(o, file, "activation_scale", false, 0.01, 100, &d->activation_scale, err)))
        return st;
    d->fp8_efficiency = d->gemm_efficiency;
    if ((st = number(o, file, "fp8_efficiency", false, 1e-3, 1, &d->fp8_efficiency, err)))
        return st;
    return tensor_efficiency(o, file, d, err);
}

double rp_device_tensor_efficiency(const rp_device *d, int t) {
    int k = size_index(t);
    return k && d->tensor_efficiency[k] > 0 ? d->tensor_efficiency[k] : 1;
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
    char names[256];
    if (!strchr(what, '/') && !strstr(what, ".json"))
        return rp_fail(err, RP_ERR_INVALID, "device '%s': not a preset (%s) or a JSON file", what,
                       names_of(rp_device_presets(), names, sizeof names));
    cJSON *o;
    rp_status st = rp_json_read(what, &o, err);
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
    char names[256];
    if (!strchr(what, '/') && !strstr(what, ".json"))
        return rp_fail(err, RP_ERR_INVALID, "cluster '%s': not a preset (%s) or a JSON file", what,
                       names_of(rp_cluster_presets(), names, sizeof names));
    cJSON *o;
    rp_status st = rp_json_read(what, &o, err);
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
    if (!cJSON_IsObject(o) || !d) {
        st = rp_fail(err, RP_ERR_INVALID, "%s: a cluster is an object with a \"device\" (a "
                     "preset's name or a device object)", what);
        goto done;
    }
    if ((st = name_of(o, what, what, out->name, sizeof out->name, err)))
        goto done;
    if (cJSON_IsString(d)) {
        if (!preset_device(d->valuestring, &out->device)) {
            st = rp_fail(err, RP_ERR_INVALID, "%s: \"device\": '%s' is not a preset (%s)", what,
                         d->valuestring, names_of(rp_device_presets(), names, sizeof names));
            goto done;
        }
    } else if ((st = device_json(d, what, &out->device, err))) {
        goto done;
    }
    double per = 0;
    out->latency = 1e-5;
    if ((st = number(o, what, "per_node", true, 1, 4096, &per, err)) ||
        (st = number(o, what, "node_bandwidth", true, 1e6, 1e15, &out->node_bandwidth, err)) ||
        (st = number(o, what, "network_bandwidth", true, 1e6, 1e15, &out->network_bandwidth,
                     err)) ||
        (st = number(o, what, "latency", false, 0, 1, &out->latency, err)))
        goto done;
    if (per != (int)per) {
        st = rp_fail(err, RP_ERR_INVALID, "%s: \"per_node\" must be a whole number of devices "
                     "(1 to 4096)", what);
        goto done;
    }
    out->per_node = (int)per;
done:
    cJSON_Delete(o);
    return st;
}

double rp_cluster_all_to_all(const rp_cluster *c, int n, int stride, double bytes) {
    if (n < 2)
        return 0;
    int per = stride > 0 ? c->per_node / stride : c->per_node; /* the group's ranks a node */
    int in_node = per < 1 ? 1 : per < n ? per : n;
    double near = (in_node - 1.0) / n * bytes / c->node_bandwidth;
    double far = (double)(n - in_node) / n * bytes / c->network_bandwidth;
    return (near > far ? near : far) + c->latency;
}

rp_status rp_cluster_sim_options(const rp_cluster *c, int t, int workers, rp_sim_options *o,
                                 rp_error *err) {
    if (t < 1 || (c->per_node % t && t % c->per_node))
        return rp_fail(err, RP_ERR_INVALID, "cluster %s: workers of %d devices neither divide "
                       "its nodes of %d devices nor are whole nodes", c->name, t, c->per_node);
    rp_sim_options_default(o);
    /* a worker wider than a node is whole nodes: one to a unit, the
    ** network between them */
    int per = t <= c->per_node ? c->per_node / t : 1, nodes = (workers + per - 1) / per;
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
