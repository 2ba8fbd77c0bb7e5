/*
** IDX datasets, synthetic data and the sample stream.
*/
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "../core/util.h"
#include "repipe/data.h"

void rp_dataset_free(rp_dataset *d) {
    if (!d)
        return;
    free(d->x);
    free(d->labels);
    free(d);
}

rp_status rp_idx_parse(const unsigned char *data, size_t len, const char *name, int *ndim,
                       int dims[4], const unsigned char **values, rp_error *err) {
    if (len < 4 || data[0] != 0 || data[1] != 0)
        return rp_fail(err, RP_ERR_PARSE, "%s: not an IDX file (bad magic)", name);
    if (data[2] != 0x08)
        return rp_fail(err, RP_ERR_PARSE,
                       "%s: IDX element type 0x%02x is not supported (only unsigned bytes, 0x08)",
                       name, data[2]);
    int nd = data[3];
    if (nd < 1 || nd > 4)
        return rp_fail(err, RP_ERR_PARSE, "%s: IDX files with %d dimensions are not supported",
                       name, nd);
    if (len < 4 + 4 * (size_t)nd)
        return rp_fail(err, RP_ERR_PARSE, "%s: truncated IDX header", name);
    size_t count = 1;
    for (int i = 0; i < nd; i++) {
        const unsigned char *p = data + 4 + 4 * i;
        uint32_t v = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        if (v == 0 || v > (1u << 30))
            return rp_fail(err, RP_ERR_PARSE, "%s: dimension %d has size %u", name, i, v);
        dims[i] = (int)v;
        count *= v;
        if (count > ((size_t)1 << 34))
            return rp_fail(err, RP_ERR_PARSE, "%s: the data would be too large", name);
    }
    size_t have = len - 4 - 4 * (size_t)nd;
    if (have < count)
        return rp_fail(err, RP_ERR_PARSE,
                       "%s: truncated: the header promises %zu values but %zu are present", name,
                       count, have);
    if (have > count)
        return rp_fail(err, RP_ERR_PARSE, "%s: more data than the %zu values its header "
                                          "declares", name, count);
    *ndim = nd;
    *values = data + 4 + 4 * nd;
    return RP_OK;
}

/* Bytes an IDX file declares (header and values) from its first bytes,
** or 0 when they are not an IDX header: then the parser says why. */
static size_t idx_declared(const unsigned char *h, size_t n) {
    if (n < 4 || h[0] != 0 || h[1] != 0 || h[2] != 0x08 || h[3] < 1 || h[3] > 4 ||
        n < 4 + 4 * (size_t)h[3])
        return 0;
    size_t count = 1;
    for (int i = 0; i < h[3]; i++) {
        const unsigned char *p = h + 4 + 4 * i;
        uint32_t v = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        if (v == 0 || v > (1u << 30) || (count *= v) > ((size_t)1 << 34))
            return 0;
    }
    return 4 + 4 * (size_t)h[3] + count;
}

/* Reads a file through zlib, which also reads uncompressed files. An IDX
** file is read only as far as its header declares, and one byte more to
** tell trailing data: a small file that inflates to gigabytes of zeros
** stops there. */
static rp_status read_gz(const char *path, unsigned char **out, size_t *len, rp_error *err) {
    rp_status st = rp_check_regular(path, err); /* a FIFO would block gzopen */
    if (st)
        return st;
    gzFile f = gzopen(path, "rb");
    if (!f)
        return rp_fail(err, RP_ERR_IO, "%s: cannot open", path);
    size_t cap = 1 << 20, n = 0, limit = (size_t)1 << 35;
    unsigned char *buf = malloc(cap);
    while (buf && n < limit) {
        if (n == cap) {
            size_t want = cap * 2 < limit ? cap * 2 : limit;
            unsigned char *nb = realloc(buf, want);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap = want;
        }
        size_t room = cap - n < limit - n ? cap - n : limit - n;
        if (n < 20) /* the header first: it says how much there is */
            room = 20 - n;
        int got = gzread(f, buf + n, (unsigned)(room > (1u << 30) ? (1u << 30) : room));
        if (got < 0) {
            int code;
            const char *msg = gzerror(f, &code);
            rp_status s = rp_fail(err, RP_ERR_PARSE, "%s: %s (damaged or truncated gzip data)",
                                  path, msg);
            free(buf);
            gzclose(f);
            return s;
        }
        if (got == 0)
            break;
        n += (size_t)got;
        if (n >= 20 || got == 0) {
            size_t declared = idx_declared(buf, n);
            if (declared && declared + 1 < limit)
                limit = declared + 1;
        }
    }
    gzclose(f);
    if (!buf)
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", path);
    *out = buf;
    *len = n;
    return RP_OK;
}

/* DIR/base.gz if it exists, else DIR/base. */
static void find_file(const char *dir, const char *base, char *path, size_t n) {
    snprintf(path, n, "%s/%s.gz", dir, base);
    struct stat sb;
    if (stat(path, &sb) == 0) /* what it is, read_gz says */
        return;
    snprintf(path, n, "%s/%s", dir, base);
}

rp_status rp_dataset_load_idx(rp_dataset **out, const char *dir, bool train, rp_error *err) {
    *out = NULL;
    char ipath[4096], lpath[4096];
    find_file(dir, train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte", ipath,
              sizeof ipath);
    find_file(dir, train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte", lpath,
              sizeof lpath);
    unsigned char *ib = NULL, *lb = NULL;
    size_t il, ll;
    rp_status s = read_gz(ipath, &ib, &il, err);
    if (s)
        return s;
    if ((s = read_gz(lpath, &lb, &ll, err))) {
        free(ib);
        return s;
    }
    int ind, lnd, idims[4], ldims[4];
    const unsigned char *iv, *lv;
    rp_dataset *d = NULL;
    if ((s = rp_idx_parse(ib, il, ipath, &ind, idims, &iv, err)) ||
        (s = rp_idx_parse(lb, ll, lpath, &lnd, ldims, &lv, err)))
        goto done;
    if (ind < 2 || lnd != 1) {
        s = rp_fail(err, RP_ERR_PARSE, "%s: images need 2 or more dimensions and labels 1", dir);
        goto done;
    }
    if (idims[0] != ldims[0]) {
        s = rp_fail(err, RP_ERR_PARSE, "%s: %d images but %d labels", dir, idims[0], ldims[0]);
        goto done;
    }
    d = calloc(1, sizeof *d);
    if (!d) {
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    d->n = idims[0];
    d->label_count = 1;
    /* images of h x w become 1 x h x w: one channel */
    d->sample.ndim = ind == 3 ? 3 : ind - 1;
    if (ind == 3) {
        d->sample.dim[0] = 1;
        d->sample.dim[1] = idims[1];
        d->sample.dim[2] = idims[2];
    } else {
        for (int i = 1; i < ind; i++)
            d->sample.dim[i - 1] = idims[i];
    }
    size_t per = rp_shape_size(&d->sample);
    d->x = malloc(sizeof(float) * per * d->n);
    d->labels = malloc(sizeof(int32_t) * d->n);
    if (!d->x || !d->labels) {
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory for %d samples", d->n);
        goto done;
    }
    for (size_t i = 0; i < per * d->n; i++)
        d->x[i] = iv[i] * (1.0f / 255.0f);
    for (int i = 0; i < d->n; i++) {
        d->labels[i] = lv[i];
        if (lv[i] + 1 > d->num_classes)
            d->num_classes = lv[i] + 1;
    }
done:
    free(ib);
    free(lb);
    if (s) {
        rp_dataset_free(d);
        return s;
    }
    *out = d;
    return RP_OK;
}

rp_status rp_dataset_synthetic(rp_dataset **out, int n, rp_shape sample, int classes,
                               uint64_t seed, rp_error *err) {
    *out = NULL;
    rp_dataset *d = calloc(1, sizeof *d);
    size_t per = rp_shape_size(&sample);
    if (d) {
        d->x = malloc(sizeof(float) * per * n);
        d->labels = malloc(sizeof(int32_t) * n);
    }
    float *proj = malloc(sizeof(float) * per * classes);
    if (!d || !d->x || !d->labels || !proj) {
        rp_dataset_free(d);
        free(proj);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    d->n = n;
    d->label_count = 1;
    d->sample = sample;
    d->num_classes = classes;
    for (size_t i = 0; i < per * classes; i++)
        proj[i] = 2.0f * rp_uniform(seed, 0xda7a, 1, i, 0) - 1.0f;
    for (int s = 0; s < n; s++) {
        float *x = d->x + (size_t)s * per;
        for (size_t e = 0; e < per; e++)
            x[e] = rp_uniform(seed, 0xda7a, 2, (uint64_t)s, e);
        int best = 0;
        float best_v = -1e30f;
        for (int c = 0; c < classes; c++) {
            float v = 0;
            for (size_t e = 0; e < per; e++)
                v += (x[e] - 0.5f) * proj[(size_t)c * per + e];
            if (v > best_v) {
                best_v = v;
                best = c;
            }
        }
        d->labels[s] = best;
    }
    free(proj);
    *out = d;
    return RP_OK;
}

void rp_dataset_gather(const rp_dataset *d, const int64_t *idx, int count, float *x,
                       int32_t *labels) {
    size_t per = rp_shape_size(&d->sample);
    for (int i = 0; i < count; i++) {
        if (x)
            memcpy(x + (size_t)i * per, d->x + (size_t)idx[i] * per, sizeof(float) * per);
        if (labels)
            memcpy(labels + (size_t)i * d->label_count, d->labels + idx[i] * d->label_count,
                   sizeof(int32_t) * d->label_count);
    }
}

rp_status rp_stream_init(rp_stream *s, uint64_t seed, int n, int per_update, rp_error *err) {
    memset(s, 0, sizeof *s);
    if (n < per_update || per_update < 1)
        return rp_fail(err, RP_ERR_INVALID,
                       "the dataset has %d samples, fewer than one update takes (%d)", n,
                       per_update);
    s->seed = seed;
    s->n = n;
    s->per_update = per_update;
    s->cached_epoch = -1;
    s->perm = malloc(sizeof(int32_t) * n);
    if (!s->perm)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    return RP_OK;
}

void rp_stream_free(rp_stream *s) {
    free(s->perm);
    s->perm = NULL;
}

long long rp_stream_updates_per_epoch(const rp_stream *s) { return s->n / s->per_update; }

rp_status rp_stream_update(rp_stream *s, long long u, int64_t *idx, rp_error *err) {
    if (u < 0) /* epoch and offset would be negative: before the permutation */
        return rp_fail(err, RP_ERR_INVALID, "sample stream: update %lld; updates count from 0",
                       u);
    long long per_epoch = rp_stream_updates_per_epoch(s);
    long long epoch = u / per_epoch;
    if (epoch != s->cached_epoch) {
        /* Fisher-Yates with counter-based draws keyed by (seed, epoch, i) */
        for (int i = 0; i < s->n; i++)
            s->perm[i] = i;
        for (int i = s->n - 1; i > 0; i--) {
            int j = s->sequential ? i
                                  : (int)(rp_hash64(s->seed, 0x5eed, (uint64_t)epoch,
                                                    (uint64_t)i, 0) %
                                          (uint64_t)(i + 1));
            int32_t t = s->perm[i];
            s->perm[i] = s->perm[j];
            s->perm[j] = t;
        }
        s->cached_epoch = epoch;
    }
    long long first = (u % per_epoch) * s->per_update;
    for (int i = 0; i < s->per_update; i++)
        idx[i] = s->perm[first + i];
    return RP_OK;
}

rp_status rp_dataset_fits(const rp_dataset *d, const rp_model *m, const char *what,
                          rp_error *err) {
    char a[64], b[64];
    if (rp_shape_size(&d->sample) != rp_shape_size(&m->input))
        return rp_fail(err, RP_ERR_INVALID, "%s: its samples are %s but the model's input is %s",
                       what, rp_shape_to_string(&d->sample, a, sizeof a),
                       rp_shape_to_string(&m->input, b, sizeof b));
    if (d->label_count != m->num_targets)
        return rp_fail(err, RP_ERR_INVALID,
                       "%s: its samples have %d label%s each but the model's loss takes %d",
                       what, d->label_count, d->label_count == 1 ? "" : "s", m->num_targets);
    if (d->num_classes > m->num_classes)
        return rp_fail(err, RP_ERR_INVALID, "%s: its labels run to class %d but the model scores "
                                            "%d classes",
                       what, d->num_classes - 1, m->num_classes);
    return RP_OK;
}
