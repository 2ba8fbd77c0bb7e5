/*
** Weight files.
**
**   "RPWEIGHT"  u32 version (1)  u32 tensors
**   per tensor: u32 name length, name, u32 ndim, u32 dims[ndim], u32 groups,
**               float32 data[groups * prod(dims)]
**   u32 CRC-32 of every byte before it
**
** All integers and floats little-endian. Files are written to a temporary
** name, fsynced and renamed, so a crash never leaves a half-written file
** under the real name; a damaged file fails its checksum.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../core/util.h"
#include "repipe/weights.h"

#define MAGIC "RPWEIGHT"
#define VERSION 1u

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "weight files are written in the host's byte order, which must be little-endian"
#endif

void rp_weights_free(rp_weights *w) {
    if (!w)
        return;
    for (int i = 0; i < w->num_tensors; i++)
        free(w->tensors[i].data);
    free(w->tensors);
    free(w);
}

const rp_tensor *rp_weights_find(const rp_weights *w, const char *name) {
    for (int i = 0; i < w->num_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return &w->tensors[i];
    return NULL;
}

static void put_u32(unsigned char **p, uint32_t v) {
    memcpy(*p, &v, 4);
    *p += 4;
}

rp_status rp_weights_serialize(const rp_weights *w, unsigned char **out, size_t *len,
                               rp_error *err) {
    size_t bytes = 8 + 4 + 4 + 4;
    for (int i = 0; i < w->num_tensors; i++) {
        const rp_tensor *t = &w->tensors[i];
        bytes += 4 + strlen(t->name) + 4 + 4 * (size_t)t->shape.ndim + 4 +
                 sizeof(float) * rp_shape_size(&t->shape) * t->groups;
    }
    unsigned char *buf = malloc(bytes), *p = buf;
    if (!buf)
        return rp_fail(err, RP_ERR_NOMEM, "weights: out of memory for %zu bytes", bytes);
    memcpy(p, MAGIC, 8);
    p += 8;
    put_u32(&p, VERSION);
    put_u32(&p, (uint32_t)w->num_tensors);
    for (int i = 0; i < w->num_tensors; i++) {
        const rp_tensor *t = &w->tensors[i];
        size_t nl = strlen(t->name);
        put_u32(&p, (uint32_t)nl);
        memcpy(p, t->name, nl);
        p += nl;
        put_u32(&p, (uint32_t)t->shape.ndim);
        for (int d = 0; d < t->shape.ndim; d++)
            put_u32(&p, (uint32_t)t->shape.dim[d]);
        put_u32(&p, (uint32_t)t->groups);
        size_t n = rp_shape_size(&t->shape) * t->groups;
        memcpy(p, t->data, sizeof(float) * n);
        p += sizeof(float) * n;
    }
    put_u32(&p, rp_crc32(0, buf, (size_t)(p - buf)));
    *out = buf;
    *len = bytes;
    return RP_OK;
}

rp_status rp_weights_save(const rp_weights *w, const char *path, rp_error *err) {
    unsigned char *buf;
    size_t bytes;
    rp_status s = rp_weights_serialize(w, &buf, &bytes, err);
    if (s)
        return s;
    s = rp_write_file_atomic(path, (const char *)buf, bytes, err);
    free(buf);
    return s;
}

typedef struct reader {
    const unsigned char *p, *end;
} reader;

static bool get_u32(reader *r, uint32_t *v) {
    if (r->end - r->p < 4)
        return false;
    memcpy(v, r->p, 4);
    r->p += 4;
    return true;
}

/* Tensor i of the file: its name, shape, groups and data, its name unlike
** the earlier ones'. w counts it once its data is read. */
static rp_status read_tensor(reader *r, rp_weights *w, uint32_t i, const char *name,
                             rp_error *err) {
    rp_tensor *t = &w->tensors[i];
    uint32_t nl, nd, g;
    if (!get_u32(r, &nl) || nl == 0 || nl >= RP_NAME_MAX || (size_t)(r->end - r->p) < nl)
        return rp_fail(err, RP_ERR_PARSE, "%s: tensor %u: bad name", name, i);
    memcpy(t->name, r->p, nl);
    t->name[nl] = '\0';
    r->p += nl;
    if (!get_u32(r, &nd) || nd < 1 || nd > RP_MAX_DIMS)
        return rp_fail(err, RP_ERR_PARSE, "%s: tensor '%s': bad number of dimensions", name,
                       t->name);
    t->shape.ndim = (int)nd;
    size_t n = 1;
    bool ok = true;
    for (uint32_t d = 0; d < nd && ok; d++) {
        uint32_t v = 0;
        ok = get_u32(r, &v) && v >= 1 && v <= (1u << 30);
        t->shape.dim[d] = (int)v;
        n *= ok ? v : 1;
        ok = ok && n <= ((size_t)1 << 32);
    }
    if (!ok || !get_u32(r, &g) || g < 1 || g > (1u << 20))
        return rp_fail(err, RP_ERR_PARSE, "%s: tensor '%s': bad shape or group count", name,
                       t->name);
    t->groups = (int)g;
    n *= g;
    if ((size_t)(r->end - r->p) / sizeof(float) < n)
        return rp_fail(err, RP_ERR_PARSE, "%s: tensor '%s': data truncated", name, t->name);
    if (!(t->data = malloc(sizeof(float) * n)))
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name);
    memcpy(t->data, r->p, sizeof(float) * n);
    r->p += sizeof(float) * n;
    w->num_tensors++;
    for (int j = 0; j < w->num_tensors - 1; j++)
        if (strcmp(w->tensors[j].name, t->name) == 0)
            return rp_fail(err, RP_ERR_PARSE, "%s: tensor '%s' appears twice", name, t->name);
    return RP_OK;
}

rp_status rp_weights_parse(rp_weights **out, const unsigned char *data, size_t len,
                           const char *name, rp_error *err) {
    *out = NULL;
    if (len < 8 + 4 + 4 + 4 || memcmp(data, MAGIC, 8) != 0)
        return rp_fail(err, RP_ERR_PARSE, "%s: not a repipe weight file (bad magic)", name);
    uint32_t stored;
    memcpy(&stored, data + len - 4, 4);
    if (rp_crc32(0, data, len - 4) != stored)
        return rp_fail(err, RP_ERR_PARSE,
                       "%s: checksum mismatch: the file is damaged or truncated", name);
    reader r = {data + 8, data + len - 4};
    uint32_t version = 0, count = 0;
    get_u32(&r, &version);
    get_u32(&r, &count);
    if (version != VERSION)
        return rp_fail(err, RP_ERR_PARSE, "%s: version %u is not supported (this is version %u)",
                       name, version, VERSION);
    if (count > 1u << 20)
        return rp_fail(err, RP_ERR_PARSE, "%s: %u tensors is implausible", name, count);
    rp_weights *w = calloc(1, sizeof *w);
    if (!w || !(w->tensors = calloc(count ? count : 1, sizeof(rp_tensor)))) {
        free(w);
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name);
    }
    rp_status s = RP_OK;
    for (uint32_t i = 0; i < count && !s; i++)
        s = read_tensor(&r, w, i, name, err);
    if (!s && r.p != r.end)
        s = rp_fail(err, RP_ERR_PARSE, "%s: %zu unexpected bytes after the last tensor", name,
                    (size_t)(r.end - r.p));
    if (s) {
        rp_weights_free(w);
        return s;
    }
    *out = w;
    return RP_OK;
}

static rp_status parse_weights(const char *data, size_t len, const char *path, void *out,
                               rp_error *err) {
    return rp_weights_parse(out, (const unsigned char *)data, len, path, err);
}

rp_status rp_weights_load(rp_weights **out, const char *path, rp_error *err) {
    return rp_parse_file(path, false, parse_weights, out, err);
}

rp_status rp_weights_from_params(const rp_model *m, const float *params, rp_weights **out,
                                 rp_error *err) {
    rp_weights *w = calloc(1, sizeof *w);
    if (!w || !(w->tensors = calloc(m->num_vars ? m->num_vars : 1, sizeof(rp_tensor)))) {
        free(w);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    for (int v = 0; v < m->num_vars; v++) {
        const rp_variable *var = &m->vars[v];
        rp_tensor *t = &w->tensors[v];
        snprintf(t->name, RP_NAME_MAX, "%s", var->name);
        t->shape = var->shape;
        t->groups = 1;
        t->data = malloc(sizeof(float) * var->count);
        if (!t->data) {
            rp_weights_free(w);
            return rp_fail(err, RP_ERR_NOMEM, "out of memory");
        }
        memcpy(t->data, params + var->offset, sizeof(float) * var->count);
        w->num_tensors++;
    }
    *out = w;
    return RP_OK;
}

rp_status rp_weights_var(const rp_weights *w, const rp_variable *var, const rp_tensor **out,
                         rp_error *err) {
    const rp_tensor *t = rp_weights_find(w, var->name);
    char a[64], b[64];
    if (!t)
        return rp_fail(err, RP_ERR_INVALID, "weights: the model's variable '%s' is missing",
                       var->name);
    if (t->shape.ndim != var->shape.ndim ||
        memcmp(t->shape.dim, var->shape.dim, sizeof(int) * t->shape.ndim) != 0)
        return rp_fail(err, RP_ERR_INVALID,
                       "weights: variable '%s' has shape %s in the file but %s in the model",
                       var->name, rp_shape_to_string(&t->shape, a, sizeof a),
                       rp_shape_to_string(&var->shape, b, sizeof b));
    *out = t;
    return RP_OK;
}

rp_status rp_weights_to_params(const rp_model *m, const rp_weights *w, int group, float *params,
                               rp_error *err) {
    for (int v = 0; v < m->num_vars; v++) {
        const rp_variable *var = &m->vars[v];
        const rp_tensor *t;
        rp_status st = rp_weights_var(w, var, &t, err);
        if (st)
            return st;
        int g = t->groups == 1 ? 0 : group;
        if (g >= t->groups)
            return rp_fail(err, RP_ERR_INVALID,
                           "weights: variable '%s' has %d groups; group %d asked for", var->name,
                           t->groups, group);
        memcpy(params + var->offset, t->data + (size_t)g * var->count,
               sizeof(float) * var->count);
    }
    return RP_OK;
}

double rp_tensor_rel_diff(const float *a, const float *b, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > diff || isnan(d))
            diff = isnan(d) ? INFINITY : d;
        double s = fabs(a[i]) > fabs(b[i]) ? fabs(a[i]) : fabs(b[i]);
        scale = s > scale ? s : scale;
    }
    if (diff == 0)
        return 0;
    return scale > 0 ? diff / scale : INFINITY;
}

rp_status rp_weights_check_finite(const rp_weights *w, const char *name, rp_error *err) {
    for (int t = 0; t < w->num_tensors; t++) {
        const rp_tensor *x = &w->tensors[t];
        size_t n = rp_shape_size(&x->shape) * (size_t)x->groups;
        for (size_t i = 0; i < n; i++)
            if (!isfinite(x->data[i]))
                return rp_fail(err, RP_ERR_INVALID,
                               "%s: tensor '%s' holds %g at element %zu (a diverged run?); "
                               "give --allow-nonfinite to load it anyway",
                               name, x->name, (double)x->data[i], i);
    }
    return RP_OK;
}
