/*
** safetensors files, the format PyTorch users keep state_dicts in:
**
**   u64 N (little-endian)   N bytes of JSON   the data
**
** The JSON maps each tensor's name to {"dtype", "shape", "data_offsets":
** [begin, end)} (offsets into the data), beside an optional "__metadata__"
** of strings. Floating-point tensors (F32, F16, BF16, F64) are read as
** float32; anything else is refused by name, since repipe's parameters are
** all floats and a silent cast of an integer buffer would hide a wrong file.
**
** The reader holds a file to the rules the format's own library enforces,
** so that a file repipe accepts is one PyTorch's tools accept too: a header
** of at most 100 MB, no key twice, and tensors that tile the data exactly
** (sorted by offset, each starting where the one before ends, the last
** ending at the file's end), so no two tensors share bytes and none hides
** past another.
*/
#include "../core/json.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "repipe/weights.h"

#define HEADER_MAX 100000000u /* bytes, the format's own limit */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian and read in the host's order"
#endif

typedef enum { DT_F32, DT_F16, DT_BF16, DT_F64 } dtype;
static const struct {
    const char *name;
    int bytes;
} DTYPES[] = {{"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}};

/* One tensor of the header while the file is checked. */
typedef struct {
    const char *name;
    dtype dt;
    rp_shape shape;
    size_t begin, end;
} entry;

static int by_begin(const void *a, const void *b) {
    const entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* A non-negative integer of the header below limit, or false. */
static bool header_size(const cJSON *v, double limit, size_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble >= limit ||
        v->valuedouble != floor(v->valuedouble))
        return false;
    *out = (size_t)v->valuedouble;
    return true;
}

/* Fills e from the header's entry for one tensor; the error names it. */
static rp_status read_entry(const cJSON *t, const char *file, entry *e, size_t data_len,
                            rp_error *err) {
    e->name = t->string;
    if (strlen(e->name) == 0 || strlen(e->name) >= RP_NAME_MAX)
        return rp_fail(err, RP_ERR_PARSE, "%s: tensor '%.80s': names of 1 to %d bytes only",
                       file, e->name, RP_NAME_MAX - 1);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsObject(t) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) ||
        !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return rp_fail(err, RP_ERR_PARSE,
                       "%s: tensor '%s': expected {\"dtype\": string, \"shape\": [...], "
                       "\"data_offsets\": [begin, end]}",
                       file, e->name);
    int k = 0;
    while (k < 4 && strcmp(dt->valuestring, DTYPES[k].name) != 0)
        k++;
    if (k == 4)
        return rp_fail(err, RP_ERR_INVALID,
                       "%s: tensor '%s' is %s; repipe reads F32, F16, BF16 and F64 tensors",
                       file, e->name, dt->valuestring);
    e->dt = (dtype)k;
    int nd = cJSON_GetArraySize(sh);
    if (nd > RP_MAX_DIMS)
        return rp_fail(err, RP_ERR_INVALID, "%s: tensor '%s' has %d dimensions (at most %d)",
                       file, e->name, nd, RP_MAX_DIMS);
    size_t count = 1;
    e->shape.ndim = nd ? nd : 1; /* a scalar is a tensor of one value */
    e->shape.dim[0] = 1;
    for (int d = 0; d < nd; d++) {
        size_t v;
        if (!header_size(cJSON_GetArrayItem(sh, d), (double)(1u << 30) + 1, &v))
            return rp_fail(err, RP_ERR_PARSE, "%s: tensor '%s': shape[%d] is not a size", file,
                           e->name, d);
        if (v == 0)
            return rp_fail(err, RP_ERR_INVALID,
                           "%s: tensor '%s' is empty (shape[%d] = 0): no parameter is", file,
                           e->name, d);
        e->shape.dim[d] = (int)v;
        count *= v;
        if (count > ((size_t)1 << 34))
            return rp_fail(err, RP_ERR_INVALID, "%s: tensor '%s' is too large", file, e->name);
    }
    if (!header_size(cJSON_GetArrayItem(off, 0), 9007199254740992.0, &e->begin) ||
        !header_size(cJSON_GetArrayItem(off, 1), 9007199254740992.0, &e->end) ||
        e->end < e->begin || e->end > data_len)
        return rp_fail(err, RP_ERR_PARSE,
                       "%s: tensor '%s': data_offsets outside the file's %zu bytes of data", file,
                       e->name, data_len);
    if (e->end - e->begin != count * (size_t)DTYPES[k].bytes)
        return rp_fail(err, RP_ERR_PARSE,
                       "%s: tensor '%s': %zu bytes between its offsets, but %zu values of %s "
                       "take %zu",
                       file, e->name, e->end - e->begin, count, DTYPES[k].name,
                       count * (size_t)DTYPES[k].bytes);
    return RP_OK;
}

static float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void decode(const unsigned char *p, dtype dt, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        double d;
        switch (dt) {
        case DT_F32: memcpy(&out[i], p + 4 * i, 4); break;
        case DT_F16: memcpy(&h, p + 2 * i, 2), out[i] = rp_half_to_float(h); break;
        case DT_BF16: memcpy(&h, p + 2 * i, 2), out[i] = bf16_to_float(h); break;
        case DT_F64: memcpy(&d, p + 8 * i, 8), out[i] = (float)d; break;
        }
    }
}

/* The tensors' byte ranges tile the data: sorted by their beginnings,
** each begins where the one before it ends, and the last ends with it. */
static rp_status check_tiling(const entry *es, int count, size_t data_len, const char *name,
                              rp_error *err) {
    entry *sorted = malloc(sizeof *sorted * (count ? (size_t)count : 1));
    if (!sorted)
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name);
    memcpy(sorted, es, sizeof *sorted * (size_t)count);
    qsort(sorted, (size_t)count, sizeof *sorted, by_begin);
    size_t at = 0;
    rp_status s = RP_OK;
    for (int i = 0; i < count && !s; i++) {
        if (sorted[i].begin != at)
            s = rp_fail(err, RP_ERR_PARSE,
                        "%s: tensor '%s' begins at byte %zu of the data, not %zu where the one "
                        "before it ends: tensors must tile the data",
                        name, sorted[i].name, sorted[i].begin, at);
        at = sorted[i].end;
    }
    if (!s && at != data_len)
        s = rp_fail(err, RP_ERR_PARSE,
                    "%s: %zu bytes of data, but the tensors end at byte %zu", name, data_len,
                    at);
    free(sorted);
    return s;
}

/* Each entry's values as floats, in the header's order, into w. */
static rp_status decode_all(const entry *es, int count, const unsigned char *base, rp_weights *w,
                            const char *name, rp_error *err) {
    for (int i = 0; i < count; i++) {
        rp_tensor *t = &w->tensors[i];
        size_t values = rp_shape_size(&es[i].shape);
        snprintf(t->name, RP_NAME_MAX, "%s", es[i].name);
        t->shape = es[i].shape;
        t->groups = 1;
        if (!(t->data = malloc(sizeof(float) * values)))
            return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory for tensor '%s'", name,
                           t->name);
        w->num_tensors++;
        decode(base + es[i].begin, es[i].dt, t->data, values);
    }
    return RP_OK;
}

rp_status rp_safetensors_parse(rp_weights **out, const unsigned char *data, size_t len,
                               const char *name, rp_error *err) {
    *out = NULL;
    uint64_t n;
    if (len < 8)
        return rp_fail(err, RP_ERR_PARSE, "%s: %zu bytes, less than safetensors' 8-byte length",
                       name, len);
    memcpy(&n, data, 8);
    if (n > HEADER_MAX || n > len - 8)
        return rp_fail(err, RP_ERR_PARSE,
                       "%s: not a safetensors file (a header of %llu bytes in a file of %zu)",
                       name, (unsigned long long)n, len);
    cJSON *root;
    rp_status s = rp_json_parse((const char *)data + 8, (size_t)n, name, &root, err);
    if (s)
        return s;
    const unsigned char *base = data + 8 + n;
    size_t data_len = len - 8 - (size_t)n;
    int count = 0;
    entry *es = NULL;
    rp_weights *w = NULL;
    if (!cJSON_IsObject(root)) {
        s = rp_fail(err, RP_ERR_PARSE, "%s: the header is not a JSON object", name);
        goto done;
    }
    int items = cJSON_GetArraySize(root);
    if (!(es = calloc(items ? (size_t)items : 1, sizeof *es)) ||
        !(w = calloc(1, sizeof *w)) ||
        !(w->tensors = calloc(items ? (size_t)items : 1, sizeof(rp_tensor)))) {
        s = rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name);
        goto done;
    }
    for (const cJSON *t = root->child; t; t = t->next) {
        if (strcmp(t->string, "__metadata__") == 0)
            continue;
        if ((s = read_entry(t, name, &es[count], data_len, err)))
            goto done;
        count++;
    }
    if ((s = check_tiling(es, count, data_len, name, err)))
        goto done;
    s = decode_all(es, count, base, w, name, err);
done:
    free(es);
    cJSON_Delete(root);
    if (s) {
        rp_weights_free(w);
        return s;
    }
    *out = w;
    return RP_OK;
}

static rp_status parse_safetensors(const char *data, size_t len, const char *path, void *out,
                                   rp_error *err) {
    return rp_safetensors_parse(out, (const unsigned char *)data, len, path, err);
}

rp_status rp_safetensors_load(rp_weights **out, const char *path, rp_error *err) {
    return rp_parse_file(path, false, parse_safetensors, out, err);
}

/* Tensor t's header entry: dtype, shape and its bytes [at, at + bytes) of
** the data. False: out of memory. */
static bool header_entry(cJSON *root, const rp_tensor *t, size_t at, size_t bytes) {
    cJSON *e = cJSON_AddObjectToObject(root, t->name), *sh = cJSON_CreateArray();
    cJSON *off = cJSON_CreateArray();
    bool ok = e && sh && off && cJSON_AddStringToObject(e, "dtype", "F32");
    for (int d = 0; ok && d < t->shape.ndim; d++)
        ok = cJSON_AddItemToArray(sh, cJSON_CreateNumber(t->shape.dim[d]));
    ok = ok && cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at)) &&
         cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(at + bytes)));
    if (!ok || !cJSON_AddItemToObject(e, "shape", sh)) {
        cJSON_Delete(sh), cJSON_Delete(off);
        return false;
    }
    if (!cJSON_AddItemToObject(e, "data_offsets", off)) {
        cJSON_Delete(off);
        return false;
    }
    return true;
}

rp_status rp_safetensors_serialize(const rp_weights *w, unsigned char **out, size_t *len,
                                   rp_error *err) {
    *out = NULL;
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "__metadata__");
    bool ok = root && meta && cJSON_AddStringToObject(meta, "format", "pt");
    size_t at = 0;
    for (int i = 0; ok && i < w->num_tensors; i++) {
        const rp_tensor *t = &w->tensors[i];
        if (t->groups != 1) {
            cJSON_Delete(root);
            return rp_fail(err, RP_ERR_INVALID,
                           "tensor '%s' holds %d replica groups' values; a safetensors file "
                           "holds one (take one group first)",
                           t->name, t->groups);
        }
        size_t bytes = sizeof(float) * rp_shape_size(&t->shape);
        ok = header_entry(root, t, at, bytes);
        at += bytes;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json)
        return rpi_json_nomem("a safetensors header", err);
    /* the header padded with spaces to a multiple of 8 bytes, so that the
    ** data begins aligned for whoever maps the file */
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    unsigned char *buf = malloc(8 + padded + at);
    if (!buf) {
        cJSON_free(json);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for %zu bytes", 8 + padded + at);
    }
    uint64_t h = padded;
    memcpy(buf, &h, 8);
    memcpy(buf + 8, json, n);
    memset(buf + 8 + n, ' ', padded - n);
    cJSON_free(json);
    unsigned char *p = buf + 8 + padded;
    for (int i = 0; i < w->num_tensors; i++) {
        size_t bytes = sizeof(float) * rp_shape_size(&w->tensors[i].shape);
        memcpy(p, w->tensors[i].data, bytes);
        p += bytes;
    }
    *out = buf;
    *len = 8 + padded + at;
    return RP_OK;
}

rp_status rp_safetensors_save(const rp_weights *w, const char *path, rp_error *err) {
    unsigned char *buf;
    size_t len;
    rp_status s = rp_safetensors_serialize(w, &buf, &len, err);
    if (s)
        return s;
    s = rp_write_file_atomic(path, (const char *)buf, len, err);
    free(buf);
    return s;
}
