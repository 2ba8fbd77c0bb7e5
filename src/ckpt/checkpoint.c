/*
** Checkpoint files and directories (repipe/checkpoint.h).
*/
#define _POSIX_C_SOURCE 200809L
#include "repipe/checkpoint.h"

#include "../core/json.h"
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
#include "checkpoint_impl.h"

#define MAGIC "RPCHKPT1"
#define VERSION 1u

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
    if (c->run[0])
        cJSON_AddStringToObject(h, "run", c->run);
    if (c->state.num_stage_steps > 0) { /* stages that stepped apart (PipeDream) */
        cJSON *ss = cJSON_AddArrayToObject(h, "stage_steps");
        for (int t = 0; t < c->state.num_stage_steps; t++)
            cJSON_AddItemToArray(ss, cJSON_CreateNumber((double)c->state.stage_steps[t]));
    }
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
        rpi_json_nomem("a checkpoint's header", err);
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
                  put(&b, h, hl) && put_u32(&b, rp_crc32(0, h, hl)) &&
                  put_u64(&b, wl) && put(&b, w, wl) && put_u64(&b, ol) && put(&b, o, ol);
        ok = ok && put_u32(&b, rp_crc32(0, b.p, b.len));
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
    long long upd = 0, steps = 0, skipped = 0, clean = 0, model = 0, samples = 0, workers = 0,
              stages = 0;
    const cJSON *scale = cJSON_GetObjectItemCaseSensitive(h, "loss_scale");
    const cJSON *layout = cJSON_GetObjectItemCaseSensitive(h, "layout");
    const cJSON *backend = cJSON_GetObjectItemCaseSensitive(layout, "backend");
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(h, "config");
    char *end = NULL;
    double ls = cJSON_IsString(scale) ? strtod(scale->valuestring, &end) : NAN;
    const char *bad = NULL; /* the first field missing or out of range */
    if (!header_int(h, "update", 0, 1LL << 50, &upd))
        bad = "update";
    else if (!header_int(h, "steps", 0, 1LL << 50, &steps))
        bad = "steps";
    else if (!header_int(h, "skipped", 0, upd, &skipped))
        bad = "skipped";
    else if (!header_int(h, "clean", 0, 1LL << 31, &clean))
        bad = "clean";
    else if (!header_int(h, "model", 0, 0xffffffffLL, &model))
        bad = "model";
    else if (!header_int(h, "samples", 1, 1LL << 40, &samples))
        bad = "samples";
    else if (!header_int(layout, "workers", 1, RP_MAX_WORKERS, &workers))
        bad = "layout.workers";
    else if (!header_int(layout, "stages", 1, RP_MAX_STAGES, &stages))
        bad = "layout.stages";
    else if (!(ls > 0) || !end || *end || !isfinite(ls))
        bad = "loss_scale";
    else if (!cJSON_IsString(backend) || strlen(backend->valuestring) >= 8)
        bad = "layout.backend";
    else if (!cJSON_IsObject(cfg))
        bad = "config";
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(h, "run");
    if (!bad && run && (!cJSON_IsString(run) || strlen(run->valuestring) >= RP_RUN_ID_MAX))
        bad = "run";
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(h, "stage_steps"), *e;
    int nss = 0;
    if (!bad && ss && (!cJSON_IsArray(ss) || cJSON_GetArraySize(ss) != stages))
        bad = "stage_steps";
    cJSON_ArrayForEach(e, ss) {
        if (bad)
            break;
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) ||
            e->valuedouble < 0 || e->valuedouble > (double)(1LL << 50))
            bad = "stage_steps";
        else
            c->state.stage_steps[nss++] = (long long)e->valuedouble;
    }
    if (bad) {
        cJSON_Delete(h);
        return rp_fail(err, RP_ERR_PARSE, "%s: the header's '%s' is missing or out of range", name,
                       bad);
    }
    c->state.num_stage_steps = nss;
    if (run)
        snprintf(c->run, sizeof c->run, "%s", run->valuestring);
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
    if (rp_crc32(0, data, len - 4) != crc)
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
    if (rp_crc32(0, htext, hl) != hcrc)
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

static rp_status parse_checkpoint(const char *data, size_t len, const char *path, void *out,
                                  rp_error *err) {
    return rp_checkpoint_parse(out, (const unsigned char *)data, len, path, err);
}

rp_status rp_checkpoint_load(rp_checkpoint *out, const char *path, rp_error *err) {
    memset(out, 0, sizeof *out);
    return rp_parse_file(path, true, parse_checkpoint, out, err);
}

/* ---- a header alone ------------------------------------------------------------ */

bool rpi_checkpoint_peek(const char *path, char *run, size_t cap, long long *update) {
    rp_error err;
    if (rp_check_regular(path, &err))
        return false;
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    unsigned char head[16];
    uint32_t version, hl, hcrc;
    bool ok = fread(head, 1, 16, f) == 16 && memcmp(head, MAGIC, 8) == 0;
    memcpy(&version, head + 8, 4), memcpy(&hl, head + 12, 4);
    ok = ok && version == VERSION && hl > 0 && hl <= (1u << 24);
    char *text = ok ? malloc((size_t)hl + 1) : NULL;
    ok = text && fread(text, 1, hl, f) == hl && fread(&hcrc, 1, 4, f) == 4 &&
         rp_crc32(0, text, hl) == hcrc;
    fclose(f);
    cJSON *h = ok ? cJSON_ParseWithLength(text, hl) : NULL;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(h, "run");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(h, "update");
    ok = cJSON_IsNumber(u);
    if (ok) {
        *update = (long long)u->valuedouble;
        snprintf(run, cap, "%s", cJSON_IsString(r) ? r->valuestring : "");
    }
    cJSON_Delete(h);
    free(text);
    return ok;
}

/* ---- resuming under another configuration ------------------------------------ */

static bool same_schedule(const rp_lr_schedule *a, const rp_lr_schedule *b) {
    return a->type == b->type && a->warmup_updates == b->warmup_updates &&
           a->decay_updates == b->decay_updates && a->min_lr == b->min_lr &&
           a->step_updates == b->step_updates && a->gamma == b->gamma;
}

/* Under PipeDream's schedules each stage steps after every micro-batch it
** runs, on weights as old as its place in the pipeline: the stages, their
** replication, the micro-batch and the accumulation are the mathematics,
** not only its layout. The first of them that differs, or NULL. */
static const char *async_layout(const rp_config *was, const rp_config *now) {
    if (was->micro_batch_size != now->micro_batch_size)
        return "micro_batch_size (under schedule pipedream it is part of the mathematics)";
    if (was->gradient_accumulation_steps != now->gradient_accumulation_steps)
        return "gradient_accumulation_steps (under schedule pipedream it is part of the "
               "mathematics)";
    if (was->replication_factor != now->replication_factor)
        return "replication_factor (under schedule pipedream it is part of the mathematics)";
    const rp_layer_list *a = &was->layers_per_stage, *b = &now->layers_per_stage;
    if (a->count != b->count || memcmp(a->layers, b->layers, sizeof(int) * a->count) != 0)
        return "layers_per_stage (under schedule pipedream the stages are part of the "
               "mathematics)";
    for (int t = 0; t < a->count; t++)
        if (rp_config_stage_replicas(was, t) != rp_config_stage_replicas(now, t))
            return "stage_replication (under schedule pipedream it is part of the mathematics)";
    return NULL;
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
    else if (was->schedule >= RP_SCHEDULE_PIPEDREAM) /* its layout is its mathematics */
        key = async_layout(was, now);
    if (key && cap)
        snprintf(why, cap, "%s", key);
    return !key;
}
