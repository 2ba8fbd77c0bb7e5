/*
** Executable cache entries. An entry is
**
**     "RPEXEC01"                  magic
**     char[16]                    library version that wrote it
**     u64                         key: hash of model, configuration, version
**     u32 workers, u32 stages
**     stages x 5 u64              memory plan: parameters, gradients,
**                                 optimizer state, activations, scratch
**     workers x (5 i32 + ops)     stage, replica, stage replica, slots,
**                                 number of ops; each op as kind, mb, peer, slot
**     u32                         CRC-32 of everything before it
**
** little-endian, written atomically. An entry from another version is stale,
** one that fails its checksum or its structural checks is damaged; both are
** rebuilt and overwritten. The file name hashes the model and configuration
** alone, so a new version finds (and replaces) the old version's entry.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "../core/util.h"
#include "cache.h"

#define MAGIC "RPEXEC01"

static uint64_t fnv(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

void rpi_cache_key(const rp_model *m, const rp_config *cfg, char *path, size_t n, uint64_t *key) {
    uint64_t h = 0xcbf29ce484222325ull;
    char line[256];
    for (int l = 0; l < m->num_layers; l++) { /* everything that shapes the model */
        const rp_layer *L = &m->layers[l];
        int k = snprintf(line, sizeof line, "%d %d %d %d %d %d %d %d %d %d %.9g %.9g %d %d %d|",
                         (int)L->type, L->in.ndim, L->in.dim[0], L->in.dim[1], L->in.dim[2],
                         L->in.dim[3], L->units, L->kernel, L->stride, L->pad, L->p, L->eps,
                         L->vocab, L->dim, L->group_size * 2 + L->bias);
        h = fnv(h, line, (size_t)k);
    }
    /* and what those fields leave out: a graph's edges, groups, attention's heads */
    uint32_t fp = rp_model_fingerprint(m);
    h = fnv(h, &fp, sizeof fp);
    rp_config c = *cfg;
    c.executable_cache_dir[0] = 0; /* where the cache is does not change what is in it */
    char *json = NULL;
    rp_error err;
    if (rp_config_to_json(&c, &json, &err) == RP_OK) {
        h = fnv(h, json, strlen(json));
        free(json);
    }
    snprintf(path, n, "%s/%016llx.rpx", cfg->executable_cache_dir, (unsigned long long)h);
    *key = fnv(h, rp_version(), strlen(rp_version()));
}

/* ---- encoding ---------------------------------------------------------------- */

typedef struct buf {
    unsigned char *p;
    size_t len, cap;
    bool bad;
} buf;

static void put(buf *b, const void *x, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->bad = true;
            return;
        }
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->len, x, n);
    b->len += n;
}

static void put_u64(buf *b, uint64_t v) {
    unsigned char x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    put(b, x, 8);
}

static void put_u32(buf *b, uint32_t v) {
    unsigned char x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    put(b, x, 4);
}

rp_status rpi_cache_store(const char *path, uint64_t key, const rp_workplan *plan,
                      const rp_memory *mem, rp_error *err) {
    buf b = {0};
    char version[16] = {0};
    snprintf(version, sizeof version, "%s", rp_version());
    put(&b, MAGIC, 8);
    put(&b, version, 16);
    put_u64(&b, key);
    put_u32(&b, (uint32_t)plan->workers);
    put_u32(&b, (uint32_t)plan->stages);
    for (int t = 0; t < plan->stages; t++) {
        put_u64(&b, mem[t].params), put_u64(&b, mem[t].grads);
        put_u64(&b, mem[t].optimizer), put_u64(&b, mem[t].activations);
        put_u64(&b, mem[t].scratch);
    }
    for (int i = 0; i < plan->workers; i++) {
        const rp_worker_ops *w = &plan->w[i];
        put_u32(&b, (uint32_t)w->stage), put_u32(&b, (uint32_t)w->replica);
        put_u32(&b, (uint32_t)w->stage_replica), put_u32(&b, (uint32_t)w->slots);
        put_u32(&b, (uint32_t)w->num_ops);
        for (int k = 0; k < w->num_ops; k++) {
            const rp_op *op = &w->ops[k];
            put_u32(&b, (uint32_t)op->kind), put_u32(&b, (uint32_t)op->mb);
            put_u32(&b, (uint32_t)op->peer), put_u32(&b, (uint32_t)op->slot);
        }
    }
    if (!b.bad)
        put_u32(&b, rp_crc32(0, b.p, b.len));
    rp_status st = b.bad ? rp_fail(err, RP_ERR_NOMEM, "out of memory")
                         : rp_write_file_atomic(path, (const char *)b.p, b.len, err);
    free(b.p);
    return st;
}

/* ---- decoding ---------------------------------------------------------------- */

typedef struct reader {
    const unsigned char *p;
    size_t left;
    bool bad;
} reader;

static uint64_t get(reader *r, int bytes) {
    if (r->left < (size_t)bytes) {
        r->bad = true;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)r->p[i] << (8 * i);
    r->p += bytes, r->left -= (size_t)bytes;
    return v;
}

static int get_int(reader *r, int lo, int hi) {
    int v = (int)(int32_t)(uint32_t)get(r, 4);
    if (v < lo || v > hi)
        r->bad = true;
    return v;
}

/* A worker's list, each operation in range: a pass in one of its slots, a
** receive of activations feeding the forward after it, a send taking the
** forward before it; r->bad where not. */
static void read_worker(reader *r, rp_worker_ops *w, int workers, int stages, int ga) {
    w->stage = get_int(r, 0, stages - 1);
    w->replica = get_int(r, 0, workers - 1);
    w->stage_replica = get_int(r, 0, workers - 1);
    w->slots = get_int(r, 0, ga);
    int n = get_int(r, 0, 8 * ga + 8);
    if (r->bad || !(w->ops = calloc((size_t)n + 1, sizeof(rp_op)))) {
        r->bad = true;
        return;
    }
    w->num_ops = n;
    for (int k = 0; k < n && !r->bad; k++) {
        rp_op *op = &w->ops[k];
        op->kind = (rp_op_kind)get_int(r, RP_OP_RECV_ACT, RP_OP_COUNT - 1);
        op->mb = get_int(r, -1, ga - 1);
        op->peer = get_int(r, -1, workers - 1);
        op->slot = get_int(r, -1, ga - 1);
        bool pass = op->kind == RP_OP_FORWARD || op->kind == RP_OP_BACKWARD ||
                    op->kind == RP_OP_BACKWARD_INPUT || op->kind == RP_OP_BACKWARD_WEIGHT;
        if (pass && (op->slot < 0 || op->slot >= w->slots))
            r->bad = true;
    }
    for (int k = 0; k < w->num_ops && !r->bad; k++)
        if ((w->ops[k].kind == RP_OP_RECV_ACT &&
             (k + 1 == w->num_ops || w->ops[k + 1].kind != RP_OP_FORWARD)) ||
            (w->ops[k].kind == RP_OP_SEND_ACT && (k == 0 || w->ops[k - 1].kind != RP_OP_FORWARD)))
            r->bad = true;
}

cache_result rpi_cache_parse(const unsigned char *d, size_t len, uint64_t key, int workers,
                         int stages, int ga, rp_workplan **plan, rp_memory *mem, char *why,
                         size_t why_n) {
    *plan = NULL;
    cache_result res = CACHE_REBUILD;
    rp_workplan *pl = NULL;
    if (len < 8 + 16 + 8 + 4 || memcmp(d, MAGIC, 8) != 0) {
        snprintf(why, why_n, "damaged: not an executable cache entry");
        goto done;
    }
    reader r = {d + len - 4, 4, false};
    if ((uint32_t)get(&r, 4) != rp_crc32(0, d, len - 4)) {
        snprintf(why, why_n, "damaged: checksum mismatch");
        goto done;
    }
    char version[17] = {0};
    memcpy(version, d + 8, 16);
    if (strcmp(version, rp_version()) != 0) {
        snprintf(why, why_n, "stale: written by version %.16s", version);
        goto done;
    }
    r = (reader){d + 24, len - 28, false};
    if (get(&r, 8) != key) {
        snprintf(why, why_n, "stale: written for another model or configuration");
        goto done;
    }
    if (get_int(&r, workers, workers) != workers || get_int(&r, stages, stages) != stages ||
        r.bad) {
        snprintf(why, why_n, "damaged: wrong number of workers or stages");
        goto done;
    }
    for (int t = 0; t < stages; t++) {
        mem[t].params = get(&r, 8), mem[t].grads = get(&r, 8);
        mem[t].optimizer = get(&r, 8), mem[t].activations = get(&r, 8);
        mem[t].scratch = get(&r, 8);
    }
    pl = calloc(1, sizeof *pl);
    if (!pl || !(pl->w = calloc((size_t)workers, sizeof(rp_worker_ops)))) {
        snprintf(why, why_n, "out of memory");
        goto done;
    }
    pl->workers = workers, pl->stages = stages;
    for (int i = 0; i < workers && !r.bad; i++)
        read_worker(&r, &pl->w[i], workers, stages, ga);
    if (r.bad || r.left) {
        snprintf(why, why_n, "damaged: inconsistent contents");
        goto done;
    }
    res = CACHE_HIT;
done:
    if (res == CACHE_HIT)
        *plan = pl;
    else
        rp_workplan_free(pl);
    return res;
}

cache_result rpi_cache_load(const char *path, uint64_t key, int workers, int stages, int ga,
                        rp_workplan **plan, rp_memory *mem, char *why, size_t why_n) {
    *plan = NULL;
    if (access(path, F_OK) != 0)
        return CACHE_MISS;
    char *data;
    size_t len;
    rp_error err;
    if (rp_read_regular_file(path, &data, &len, &err)) {
        snprintf(why, why_n, "unreadable (%s)", err.msg);
        return CACHE_REBUILD;
    }
    cache_result res = rpi_cache_parse((const unsigned char *)data, len, key, workers, stages, ga,
                                   plan, mem, why, why_n);
    free(data);
    return res;
}
