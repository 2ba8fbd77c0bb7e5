/*
** Checkpoint files and directories (repipe/checkpoint.h).
*/
#define _POSIX_C_SOURCE 200809L
#include "repipe/checkpoint.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "../core/util.h"

#define MAGIC "RPCHKPT1"
#define VERSION 1u
#define PREFIX "ckpt-"
#define SUFFIX ".rpc"

void rp_checkpoint_free(rp_checkpoint *c) {
    if (!c)
        return;
    rp_train_state_free(&c->state);
    memset(c, 0, sizeof *c);
}

/* ---- the file ----------------------------------------------------------------- */

typedef struct buf {
    unsigned char *p;
    size_t len, cap;
} buf;

static bool put(buf *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p)
            return false;
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return true;
}

static bool put_u32(buf *b, uint32_t v) { return put(b, &v, 4); }
static bool put_u64(buf *b, uint64_t v) { return put(b, &v, 8); }

static char *header_json(const rp_checkpoint *c, rp_error *err) {
    char *config = NULL;
    if (rp_config_to_json(&c->config, &config, err))
        return NULL;
    cJSON *h = cJSON_CreateObject(), *cfg = cJSON_Parse(config);
    free(config);
    char scale[40];
    snprintf(scale, sizeof scale, "%.17g", c->state.loss_scale); /* exact as text */
    cJSON_AddNumberToObject(h, "update", (double)c->state.updates);
    cJSON_AddNumberToObject(h, "steps", (double)c->state.steps);
    cJSON_AddNumberToObject(h, "skipped", (double)c->state.skipped);
    cJSON_AddStringToObject(h, "loss_scale", scale);
    cJSON_AddNumberToObject(h, "clean", c->state.clean);
    cJSON_AddNumberToObject(h, "model", c->model);
    cJSON_AddNumberToObject(h, "samples", (double)c->samples);
    cJSON *layout = cJSON_AddObjectToObject(h, "layout");
    cJSON_AddNumberToObject(layout, "workers", c->workers);
    cJSON_AddNumberToObject(layout, "stages", c->stages);
    cJSON_AddStringToObject(layout, "backend", c->backend);
    cJSON_AddItemToObject(h, "config", cfg ? cfg : cJSON_CreateNull());
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!text)
        rp_fail(err, RP_ERR_NOMEM, "checkpoint: out of memory");
    return text;
}

rp_status rp_checkpoint_save(const rp_checkpoint *c, const char *path, rp_error *err) {
    buf b = {0};
    unsigned char *w = NULL, *o = NULL;
    size_t wl = 0, ol = 0;
    char *h = header_json(c, err);
    rp_status st = h ? RP_OK : RP_ERR_NOMEM;
    if (!st)
        st = rp_weights_serialize(c->state.weights, &w, &wl, err);
    if (!st)
        st = rp_weights_serialize(c->state.optimizer, &o, &ol, err);
    if (!st) {
        size_t hl = strlen(h);
        bool ok = put(&b, MAGIC, 8) && put_u32(&b, VERSION) && put_u32(&b, (uint32_t)hl) &&
                  put(&b, h, hl) && put_u32(&b, (uint32_t)crc32(0L, (const Bytef *)h, (uInt)hl)) &&
                  put_u64(&b, wl) && put(&b, w, wl) && put_u64(&b, ol) && put(&b, o, ol);
        ok = ok && put_u32(&b, (uint32_t)crc32(0L, b.p, (uInt)b.len));
        st = ok ? rp_write_file_atomic(path, (const char *)b.p, b.len, err)
                : rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", path);
    }
    free(h), free(w), free(o), free(b.p);
    return st;
}

typedef struct reader {
    const unsigned char *p, *end;
} reader;

static bool take(reader *r, void *out, size_t n) {
    if ((size_t)(r->end - r->p) < n)
        return false;
    memcpy(out, r->p, n);
    r->p += n;
    return true;
}

/* A whole number of the header, in range. */
static bool header_int(const cJSON *h, const char *key, long long lo, long long hi,
                       long long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return false;
    *out = (long long)v->valuedouble;
    return true;
}

static rp_status parse_header(rp_checkpoint *c, const char *text, size_t len, const char *name,
                              rp_error *err) {
    cJSON *h;
    rp_status st = rp_json_parse(text, len, name, &h, err);
    if (st)
        return st;
    long long upd, steps, skipped, clean, model, samples, workers, stages;
    const cJSON *scale = cJSON_GetObjectItemCaseSensitive(h, "loss_scale");
    const cJSON *layout = cJSON_GetObjectItemCaseSensitive(h, "layout");
    const cJSON *backend = cJSON_GetObjectItemCaseSensitive(layout, "backend");
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(h, "config");
    char *end = NULL;
    double ls = cJSON_IsString(scale) ? strtod(scale->valuestring, &end) : NAN;
    if (!header_int(h, "update", 0, 1LL << 50, &upd) ||
        !header_int(h, "steps", 0, upd, &steps) ||
        !header_int(h, "skipped", 0, upd, &skipped) ||
        !header_int(h, "clean", 0, 1LL << 31, &clean) ||
        !header_int(h, "model", 0, 0xffffffffLL, &model) ||
        !header_int(h, "samples", 1, 1LL << 40, &samples) ||
        !header_int(layout, "workers", 1, RP_MAX_WORKERS, &workers) ||
        !header_int(layout, "stages", 1, RP_MAX_STAGES, &stages) || !(ls > 0) || !end ||
        *end || !isfinite(ls) || !cJSON_IsString(backend) || strlen(backend->valuestring) >= 8 ||
        !cJSON_IsObject(cfg)) {
        cJSON_Delete(h);
        return rp_fail(err, RP_ERR_PARSE, "%s: the header lacks a field or holds one out of range",
                       name);
    }
    char *ctext = cJSON_PrintUnformatted(cfg);
    st = ctext ? rp_config_load_string(&c->config, ctext, strlen(ctext), name, err)
               : rp_fail(err, RP_ERR_NOMEM, "%s: out of memory", name);
    free(ctext);
    if (!st) {
        c->state.updates = upd, c->state.steps = steps, c->state.skipped = skipped;
        c->state.clean = (int)clean, c->state.loss_scale = ls;
        c->model = (uint32_t)model, c->samples = samples;
        c->workers = (int)workers, c->stages = (int)stages;
        snprintf(c->backend, sizeof c->backend, "%s", backend->valuestring);
    }
    cJSON_Delete(h);
    return st;
}

rp_status rp_checkpoint_parse(rp_checkpoint *out, const unsigned char *data, size_t len,
                              const char *name, rp_error *err) {
    memset(out, 0, sizeof *out);
    uint32_t version = 0, hl = 0, hcrc = 0, crc;
    if (len < 8 + 4 + 4 + 4 + 8 + 8 + 4 || memcmp(data, MAGIC, 8) != 0)
        return rp_fail(err, RP_ERR_PARSE, "%s: not a repipe checkpoint (bad magic)", name);
    memcpy(&crc, data + len - 4, 4);
    if ((uint32_t)crc32(0L, data, (uInt)(len - 4)) != crc)
        return rp_fail(err, RP_ERR_PARSE,
                       "%s: checksum mismatch: the checkpoint is damaged or truncated", name);
    reader r = {data + 8, data + len - 4};
    take(&r, &version, 4);
    if (version != VERSION)
        return rp_fail(err, RP_ERR_PARSE,
                       "%s: checkpoint version %u is not supported (this is version %u)", name,
                       version, VERSION);
    char part[600];
    if (!take(&r, &hl, 4) || (size_t)(r.end - r.p) < (size_t)hl + 4)
        return rp_fail(err, RP_ERR_PARSE, "%s: the header is cut short", name);
    const char *htext = (const char *)r.p;
    r.p += hl;
    take(&r, &hcrc, 4);
    if ((uint32_t)crc32(0L, (const Bytef *)htext, hl) != hcrc)
        return rp_fail(err, RP_ERR_PARSE, "%s: the header's checksum does not match", name);
    snprintf(part, sizeof part, "%s (header)", name);
    rp_status st = parse_header(out, htext, hl, part, err);
    for (int k = 0; k < 2 && !st; k++) {
        uint64_t n;
        if (!take(&r, &n, 8) || (uint64_t)(r.end - r.p) < n) {
            st = rp_fail(err, RP_ERR_PARSE, "%s: the %s are cut short", name,
                         k ? "optimizer state" : "weights");
            break;
        }
        snprintf(part, sizeof part, "%s (%s)", name, k ? "optimizer state" : "weights");
        st = rp_weights_parse(k ? &out->state.optimizer : &out->state.weights, r.p, (size_t)n,
                              part, err);
        r.p += n;
    }
    if (!st && r.p != r.end)
        st = rp_fail(err, RP_ERR_PARSE, "%s: %zu bytes after the optimizer state", name,
                     (size_t)(r.end - r.p));
    if (st)
        rp_checkpoint_free(out);
    return st;
}

rp_status rp_checkpoint_load(rp_checkpoint *out, const char *path, rp_error *err) {
    memset(out, 0, sizeof *out);
    char *data;
    size_t len;
    rp_status st = rp_read_file(path, &data, &len, err);
    if (st)
        return st;
    st = rp_checkpoint_parse(out, (const unsigned char *)data, len, path, err);
    free(data);
    return st;
}

/* ---- directories -------------------------------------------------------------- */

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The checkpoints of dir, oldest first (their names sort by update). */
static int list(const char *dir, char ***out) {
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0, cap = 16;
    char **names = malloc(sizeof(char *) * cap);
    for (struct dirent *e; names && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, PREFIX, strlen(PREFIX)) != 0 || l < strlen(SUFFIX) ||
            strcmp(e->d_name + l - strlen(SUFFIX), SUFFIX) != 0)
            continue;
        if (n == cap) {
            char **more = realloc(names, sizeof(char *) * (cap *= 2));
            if (!more)
                break;
            names = more;
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (!names)
        return -1;
    qsort(names, n, sizeof(char *), by_name);
    *out = names;
    return n;
}

static void free_list(char **names, int n) {
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* Temporary files a killed writer left (a checkpoint's name, then ".tmp"). */
static void remove_orphans(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, PREFIX, strlen(PREFIX)) == 0 &&
            strstr(e->d_name, SUFFIX ".tmp")) {
            char path[RP_PATH_MAX * 2];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
}

rp_status rp_checkpoint_write_dir(const rp_checkpoint *c, const char *dir, int keep,
                                  char *path, size_t cap, rp_error *err) {
    if (keep < 1)
        return rp_fail(err, RP_ERR_INVALID, "checkpoints: keep at least 1 (got %d)", keep);
    remove_orphans(dir);
    snprintf(path, cap, "%s/" PREFIX "%012lld" SUFFIX, dir, c->state.updates);
    rp_status st = rp_checkpoint_save(c, path, err);
    if (st)
        return st;
    char **names;
    int n = list(dir, &names);
    for (int i = 0; i < n - keep; i++) {
        char old[RP_PATH_MAX * 2];
        snprintf(old, sizeof old, "%s/%s", dir, names[i]);
        unlink(old);
    }
    if (n >= 0)
        free_list(names, n);
    return RP_OK;
}

rp_status rp_checkpoint_latest(const char *dir, rp_checkpoint *out, char *path, size_t cap,
                               char *note, size_t note_cap, rp_error *err) {
    memset(out, 0, sizeof *out);
    if (note_cap)
        note[0] = '\0';
    char **names;
    int n = list(dir, &names);
    if (n < 0)
        return rp_fail(err, RP_ERR_IO, "%s: cannot read the checkpoint directory: %s", dir,
                       strerror(errno));
    rp_status st = rp_fail(err, RP_ERR_IO, "%s: no checkpoint (" PREFIX "*" SUFFIX ") here",
                           dir);
    size_t used = 0;
    for (int i = n - 1; i >= 0; i--) {
        snprintf(path, cap, "%s/%s", dir, names[i]);
        rp_error why;
        if (rp_checkpoint_load(out, path, &why) == RP_OK) {
            st = RP_OK;
            break;
        }
        if (used < note_cap)
            used += (size_t)snprintf(note + used, note_cap - used, "%s%s: skipped: %s",
                                     used ? "\n" : "", names[i], why.msg);
        if (i == 0)
            st = rp_fail(err, RP_ERR_PARSE, "%s: no checkpoint here loads (the oldest: %s)", dir,
                         why.msg);
    }
    free_list(names, n);
    return st;
}

/* ---- resuming under another configuration ------------------------------------ */

static bool same_schedule(const rp_lr_schedule *a, const rp_lr_schedule *b) {
    return a->type == b->type && a->warmup_updates == b->warmup_updates &&
           a->decay_updates == b->decay_updates && a->min_lr == b->min_lr &&
           a->step_updates == b->step_updates && a->gamma == b->gamma;
}

bool rp_checkpoint_compatible(const rp_config *was, const rp_config *now, char *why,
                              size_t cap) {
    rp_derived a, b;
    rp_config_derive(was, &a);
    rp_config_derive(now, &b);
    const rp_optimizer_config *oa = &was->optimizer, *ob = &now->optimizer;
    bool all_a = was->replica_grouping.group_size == was->replication_factor;
    bool all_b = now->replica_grouping.group_size == now->replication_factor;
    const char *key = NULL;
    if (a.samples_per_update != b.samples_per_update)
        key = "samples per update (micro_batch_size x gradient_accumulation_steps x "
              "replication_factor)";
    else if (was->seed != now->seed)
        key = "seed";
    else if (oa->type != ob->type)
        key = "optimizer.type";
    else if (oa->lr != ob->lr)
        key = "optimizer.lr";
    else if (oa->momentum != ob->momentum)
        key = "optimizer.momentum";
    else if (oa->weight_decay != ob->weight_decay)
        key = "optimizer.weight_decay";
    else if (oa->beta1 != ob->beta1 || oa->beta2 != ob->beta2)
        key = "optimizer.beta1/beta2";
    else if (oa->eps != ob->eps)
        key = "optimizer.eps";
    else if (!(all_a && all_b) &&
             (was->replication_factor != now->replication_factor ||
              !rp_grouping_equal(&was->replica_grouping, &now->replica_grouping)))
        key = "replica_grouping";
    else if (was->auto_loss_scaling != now->auto_loss_scaling)
        key = "auto_loss_scaling";
    else if (was->auto_loss_scaling &&
             was->loss_scaling_growth_interval != now->loss_scaling_growth_interval)
        key = "loss_scaling_growth_interval";
    else if (!was->auto_loss_scaling && was->loss_scaling != now->loss_scaling)
        key = "loss_scaling";
    else if (was->fp16_exchange != now->fp16_exchange)
        key = "fp16_exchange";
    else if (was->gradient_clipping != now->gradient_clipping)
        key = "gradient_clipping";
    else if (was->sequential_data != now->sequential_data)
        key = "data_order";
    else if ((was->schedule >= RP_SCHEDULE_PIPEDREAM || now->schedule >= RP_SCHEDULE_PIPEDREAM) &&
             was->schedule != now->schedule)
        key = "schedule"; /* asynchronous updates are other mathematics */
    else if (was->pipedream_vertical_sync != now->pipedream_vertical_sync)
        key = "pipedream_vertical_sync";
    else if (!same_schedule(&was->lr_schedule, &now->lr_schedule))
        key = "lr_schedule";
    if (key && cap)
        snprintf(why, cap, "%s", key);
    return !key;
}
