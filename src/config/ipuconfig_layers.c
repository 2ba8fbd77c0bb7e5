/*
** An IPUConfig's pipelines as a release of Optimum Graphcore placed them: the
** layers of training and inference, the memory proportions per IPU, and the
** serialized embedding (docs/configuration.md, "IPUConfig files").
*/
#include "../core/json.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../core/util.h"
#include "ipuconfig.h"

/* ---- layers ------------------------------------------------------------------- */

/* Layers per IPU as written: a list of whole numbers (from 0.6.1 each >= -1),
** or, as 0.1 and 0.2.1 saved their default, one number. Releases before
** 0.6.1 took any value and failed only when the model placed its layers:
** `bad` then says why, and the list holds no layers. */
static rp_status raw_layers(og_read *o, const char *key, const cJSON *v, rp_layer_list *l,
                            char *bad, size_t cap) {
    bad[0] = '\0';
    char vt[64];
    if (o->r < OG_0_6_0 && rpi_is_whole(v, 0, 1e9)) {
        l->count = 1;
        l->layers[0] = (int)v->valuedouble;
        snprintf(bad, cap, "'%s' is the number %d, not a list of layers per IPU (the "
                 "placeholder 0.1 and 0.2.1 saved by default); list the layers of every IPU",
                 key, l->layers[0]);
        return RP_OK;
    }
    bool list = cJSON_IsArray(v) && cJSON_GetArraySize(v) >= 1 &&
                cJSON_GetArraySize(v) <= RP_MAX_STAGES;
    int i = 0;
    for (const cJSON *e = list ? v->child : NULL; e; e = e->next) {
        if (!rpi_is_whole(e, o->r >= OG_0_6_1 ? -1 : -1e9, 1e9))
            list = false;
        else
            l->layers[i++] = (int)e->valuedouble;
    }
    l->count = i;
    if (list)
        return RP_OK;
    if (o->r >= OG_0_6_1)
        return rpi_og_fail(o, key, v, "must be a list of 1 to 256 whole numbers >= -1 (-1 a wildcard)");
    rpi_value_text(v, vt, sizeof vt);
    snprintf(bad, cap, "'%s' is %s, not a list of whole numbers", key, vt);
    l->count = 1;
    l->layers[0] = 0;
    return RP_OK;
}

static bool has_wildcard(const rp_layer_list *l) {
    for (int i = 0; i < l->count; i++)
        if (l->layers[i] == -1)
            return true;
    return false;
}

static bool is_default(const rp_layer_list *l) { return l->count == 1 && l->layers[0] == -1; }

/* One pipeline's stages from its layers per IPU and IPUs per replica, as
** the model's parallelize() of release r placed them. `bad` receives why no
** model's layers can be placed, for the message of the expansion. */
static void place(og_read *o, const rp_layer_list *given, int ipus, const char *lkey,
                  const char *ikey, rp_layer_list *out, char *bad, size_t cap) {
    bad[0] = '\0';
    if (o->r < OG_0_6_0 && (o->val[K_LAYERS] || o->c->layers)) { /* the counts as they stand, one IPU after another */
        o->c->cfg->layers_by_index = true;
        int n = given->count > ipus ? given->count : ipus;
        out->count = n;
        bool minus = false;
        for (int i = 0; i < n; i++) {
            int x = i < given->count ? given->layers[i] : 0;
            minus |= x < 0;
            out->layers[i] = x < 0 ? 0 : x;
        }
        if (minus)
            rpi_warn(o->c->cfg, "%s: key '%s': before 0.6.0 a negative count placed no layers "
                     "(wildcards came in 0.6.0); read as 0", o->c->name, lkey);
        return;
    }
    if (!o->f->ipu) { /* repipe's own file: its list, as it stands */
        *out = *given;
        if (given->count != ipus)
            snprintf(bad, cap, "'%s' lists %d stages but '%s' is %d", lkey, given->count, ikey,
                     ipus);
        return;
    }
    out->count = ipus;
    if (ipus == 1) { /* everything on one IPU, whatever the list says */
        out->layers[0] = -1;
        if (given->count > 1)
            rpi_warn(o->c->cfg, "%s: key '%s': with one IPU per replica IPUConfig puts every "
                     "layer on it and ignores the list", o->c->name, lkey);
        return;
    }
    bool all_wild = true;
    for (int i = 0; i < given->count; i++)
        all_wild &= given->layers[i] == -1;
    if (all_wild && (given->count == 1 || given->count == ipus)) {
        for (int i = 0; i < ipus; i++)
            out->layers[i] = -1;
        return;
    }
    if (given->count != ipus) {
        snprintf(bad, cap, "'%s' lists %d IPUs but '%s' is %d", lkey, given->count, ikey, ipus);
        for (int i = 0; i < ipus; i++)
            out->layers[i] = -1;
        return;
    }
    *out = *given;
}

/* IPUs per replica (or for inference), as the file gives them or by
** default: each is a stage, so no more than repipe's most stages. */
static rp_status ipus_of(og_read *o, int k, int dflt, int *out) {
    rp_status s = rpi_og_int(o, k, 1, dflt, out);
    if (!s && *out > RP_MAX_STAGES)
        return rpi_og_fail(o, rpi_og_keys[k].name, o->val[k],
                           "must be at most 256 (each IPU is a stage, and repipe runs at most "
                           "256)");
    return s;
}

rp_status rpi_og_layers(og_read *o) {
    rpi_load *c = o->c;
    rp_config *cfg = c->cfg;
    rp_status s;
    /* repipe's names are the same lists */
    const cJSON *lv = o->val[K_LAYERS], *iv = o->val[K_INF_LAYERS];
    const char *lkey = "layers_per_ipu", *ikey = "inference_layers_per_ipu";
    if (c->layers) {
        if (o->f->raw[K_LAYERS])
            return rp_fail(c->err, RP_ERR_INVALID, "%s: keys 'layers_per_ipu' and '%s' both "
                           "given; they are the same setting, keep one", c->name, c->layers_key);
        lv = c->layers;
        lkey = c->layers_key;
    }
    if (c->inference_layers) {
        if (o->f->raw[K_INF_LAYERS])
            return rp_fail(c->err, RP_ERR_INVALID, "%s: keys 'inference_layers_per_ipu' and "
                           "'%s' both given; they are the same setting, keep one", c->name,
                           c->inference_layers_key);
        if (o->r < OG_0_6_1)
            return rpi_og_fail(o, c->inference_layers_key, c->inference_layers,
                        "inference pipelines of their own came in 0.6.1");
        iv = c->inference_layers;
        ikey = c->inference_layers_key;
    }
    c->layers_key = lkey;
    c->inference_layers_key = ikey;
    snprintf(cfg->layers_key[0], sizeof cfg->layers_key[0], "%s", lkey);
    snprintf(cfg->layers_key[1], sizeof cfg->layers_key[1], "%s", ikey);
    /* a key the file does not hold takes the current release's default: the
    ** layers split evenly over ipus_per_replica IPUs, as many as the list has */
    rp_layer_list L = {1, {-1}}, IL;
    char bad[RP_WARNING_MAX] = "", ibad[RP_WARNING_MAX] = "";
    if (lv && (s = raw_layers(o, lkey, lv, &L, bad, sizeof bad)))
        return s;
    int ipus, inf_ipus;
    if (o->r < OG_0_6_0 && lv) {
        if ((s = ipus_of(o, K_IPUS, L.count, &ipus)))
            return s;
        place(o, &L, ipus, lkey, "ipus_per_replica", &cfg->layers_per_stage,
              cfg->layers_error[0], sizeof cfg->layers_error[0]);
        if (bad[0])
            snprintf(cfg->layers_error[0], sizeof cfg->layers_error[0], "%s", bad);
        snprintf(cfg->layers_error[1], sizeof cfg->layers_error[1], "%s", cfg->layers_error[0]);
        return RP_OK; /* inference runs the training pipeline */
    }
    if (!lv && (s = ipus_of(o, K_IPUS, L.count, &ipus)))
        return s;
    if (lv && (s = ipus_of(o, K_IPUS, L.count, &ipus)))
        return s;
    if (o->r <= OG_0_6_0) { /* inference runs the training pipeline */
        place(o, &L, ipus, lkey, "ipus_per_replica", &cfg->layers_per_stage,
              cfg->layers_error[0], sizeof cfg->layers_error[0]);
        if (bad[0])
            snprintf(cfg->layers_error[0], sizeof cfg->layers_error[0], "%s", bad);
        snprintf(cfg->layers_error[1], sizeof cfg->layers_error[1], "%s", cfg->layers_error[0]);
        return RP_OK;
    }
    /* 0.6.1 on: an inference pipeline of its own, by these fallbacks */
    IL = L;
    if (iv && (s = raw_layers(o, ikey, iv, &IL, ibad, sizeof ibad)))
        return s;
    int fallback = ipus;
    if (ipus == L.count || !is_default(&IL))
        fallback = IL.count;
    if ((s = ipus_of(o, K_INF_IPUS, fallback, &inf_ipus)))
        return s;
    /* both modes: a list without wildcards names its IPUs */
    const rp_layer_list *lists[2] = {&L, &IL};
    const int counts[2] = {ipus, inf_ipus};
    const char *lkeys[2] = {lkey, ikey};
    const char *ikeys[2] = {"ipus_per_replica", "inference_ipus_per_replica"};
    for (int m = 0; m < 2; m++)
        if (!has_wildcard(lists[m]) && lists[m]->count != counts[m]) {
            char rule[160];
            snprintf(rule, sizeof rule, "it lists %d IPUs but %s is %d (a list without "
                     "wildcards names every IPU)", lists[m]->count, ikeys[m], counts[m]);
            return rpi_og_fail(o, lkeys[m], m ? (iv ? iv : lv) : lv, rule);
        }
    place(o, &L, ipus, lkey, ikeys[0], &cfg->layers_per_stage, cfg->layers_error[0],
          sizeof cfg->layers_error[0]);
    place(o, &IL, inf_ipus, ikey, ikeys[1], &cfg->inference_layers_per_stage,
          cfg->layers_error[1], sizeof cfg->layers_error[1]);
    /* an inference pipeline the same as training's is training's */
    const rp_layer_list *a = &cfg->layers_per_stage, *b = &cfg->inference_layers_per_stage;
    cfg->inference_layers_set =
        a->count != b->count || memcmp(a->layers, b->layers, sizeof(int) * a->count) != 0 ||
        strcmp(cfg->layers_error[0], cfg->layers_error[1]) != 0;
    return RP_OK;
}

/* ---- memory proportions -------------------------------------------------------- */

static rp_status proportions(og_read *o, int k, const cJSON *v, int stages, double *vals,
                             int *count, bool *list) {
    const char *key = rpi_og_keys[k].name;
    char rule[160];
    *list = cJSON_IsArray(v);
    if (cJSON_IsNumber(v)) {
        if (!(v->valuedouble >= 0) || !isfinite(v->valuedouble))
            return rpi_og_fail(o, key, v, "must be >= 0");
        /* IPUConfig loads a whole number, but its to_options() spreads the
        ** value over the IPUs only where it is a float, and fails on 1 */
        if (!(v->type & RP_JSON_FRACTION))
            rpi_warn(o->c->cfg, "%s: key '%s': a whole number, read as %g; IPUConfig loads it, "
                     "but its to_options() fails on it (write %g.0 for an IPU)", o->c->name, key,
                     v->valuedouble, v->valuedouble);
        vals[0] = v->valuedouble;
        *count = 1;
        return RP_OK;
    }
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    if (n < 1 || n > RP_MAX_STAGES)
        return rpi_og_fail(o, key, v, "must be a number >= 0, or a list of them, one per IPU");
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0) || !isfinite(e->valuedouble))
            return rpi_og_fail(o, key, v, "every entry must be a number >= 0");
        vals[i++] = e->valuedouble;
    }
    *count = n;
    if (n == stages)
        return RP_OK;
    if (o->r >= OG_0_6_1 || (n > 1 && n < stages)) {
        snprintf(rule, sizeof rule, "it lists %d values for %d IPUs (one value, or one per IPU)",
                 n, stages);
        return rpi_og_fail(o, key, v, rule);
    }
    if (n == 1) { /* before 0.6.1 one listed value served every IPU */
        for (int j = 1; j < stages; j++)
            vals[j] = vals[0];
        rpi_warn(o->c->cfg, "%s: key '%s': one value for %d IPUs serves them all, as releases "
                 "before 0.6.1 read it (0.6.1 and later refuse this)", o->c->name, key, stages);
    } else {
        rpi_warn(o->c->cfg, "%s: key '%s': %d values for %d IPUs; the last %d are not used, "
                 "as releases before 0.6.1 read it", o->c->name, key, n, stages, n - stages);
    }
    *count = stages;
    return RP_OK;
}

rp_status rpi_og_matmul(og_read *o) {
    rp_config *cfg = o->c->cfg;
    rp_status s;
    int stages = cfg->layers_per_stage.count;
    int inf = rp_config_num_stages(cfg, true);
    if (o->val[K_MATMUL] &&
        (s = proportions(o, K_MATMUL, o->val[K_MATMUL], stages, cfg->matmul_proportion,
                         &cfg->matmul_proportion_count, &o->c->matmul_list)))
        return s;
    if (o->r < OG_0_6_1)
        return RP_OK; /* inference takes the training values */
    if (o->val[K_INF_MATMUL])
        return proportions(o, K_INF_MATMUL, o->val[K_INF_MATMUL], inf,
                           cfg->inference_matmul_proportion,
                           &cfg->inference_matmul_proportion_count,
                           &o->c->inference_matmul_list);
    /* a list of another length than the inference pipeline's falls back to 0.2 */
    if (o->c->matmul_list && cfg->matmul_proportion_count != inf) {
        cfg->inference_matmul_proportion[0] = 0.2;
        cfg->inference_matmul_proportion_count = 1;
    }
    return RP_OK;
}

/* ---- serialized layers ----------------------------------------------------------- */

/* *_splits_per_ipu: pieces of a layer per IPU, whole numbers >= 0, at least
** one piece, on consecutive IPUs, one entry per IPU; the sum of pieces. */
static rp_status splits(og_read *o, int k, int ipus, int *pieces) {
    const cJSON *v = o->val[k];
    const char *key = rpi_og_keys[k].name;
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1, sum = 0, last = -1;
    bool gap = false;
    if (n < 1 || n > RP_MAX_STAGES)
        return rpi_og_fail(o, key, v, "must be a list of whole numbers >= 0, one per IPU");
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        if (!rpi_is_whole(e, 0, 1e9))
            return rpi_og_fail(o, key, v, "every entry must be a whole number >= 0");
        int x = (int)e->valuedouble;
        if (x > 0 && last >= 0 && gap)
            return rpi_og_fail(o, key, v, "the pieces must lie on consecutive IPUs");
        if (x > 0)
            last = i;
        else if (last >= 0)
            gap = true;
        sum += x;
    }
    if (sum < 1)
        return rpi_og_fail(o, key, v, "at least one piece, on one IPU");
    if (n != ipus) {
        char rule[96];
        snprintf(rule, sizeof rule, "it lists %d IPUs but the pipeline has %d", n, ipus);
        return rpi_og_fail(o, key, v, rule);
    }
    *pieces = sum;
    return RP_OK;
}

rp_status rpi_og_serialization(og_read *o) {
    rpi_load *c = o->c;
    rp_config *cfg = c->cfg;
    rp_status s;
    if (o->r < OG_0_6_1) { /* one factor for both; 0 meant "not serialized" */
        int f;
        if ((s = rpi_og_int(o, K_ESF, 0, 1, &f)))
            return s;
        if (f == 0) {
            rpi_warn(cfg, "%s: key 'embedding_serialization_factor': 0 meant not serialized "
                     "before 0.6.1 (read as 1; 0.6.1 and later refuse 0)", c->name);
            f = 1;
        }
        cfg->embedding_serialization_factor = cfg->inference_embedding_serialization_factor = f;
        return RP_OK;
    }
    static const int factor[4] = {K_ESF, K_INF_ESF, K_PSF, K_INF_PSF};
    static const int split[4] = {K_ES, K_INF_ES, K_PS, K_INF_PS};
    for (int m = 0; m < 4; m++) {
        int ipus = m & 1 ? rp_config_num_stages(cfg, true) : cfg->layers_per_stage.count;
        int f = 1, pieces = 0;
        if ((s = rpi_og_int(o, factor[m], 1, 1, &f)))
            return s;
        if (o->val[split[m]]) {
            if (o->val[factor[m]])
                return rp_fail(c->err, RP_ERR_INVALID,
                               "%s: keys '%s' and '%s': give one of them, not both (a factor "
                               "serializes the layer where it is, the splits place its "
                               "pieces)%s", c->name, rpi_og_keys[factor[m]].name, rpi_og_keys[split[m]].name,
                               c->as);
            if ((s = splits(o, split[m], ipus, &pieces)))
                return s;
            f = pieces;
            if (m < 2)
                rpi_warn(cfg, "%s: key '%s': the embedding is serialized into its %d pieces on "
                         "the stage that holds it; their placement is ignored", c->name,
                         rpi_og_keys[split[m]].name, pieces);
        }
        if (m == 0)
            cfg->embedding_serialization_factor = f;
        else if (m == 1)
            cfg->inference_embedding_serialization_factor = f;
        else if (f > 1)
            rpi_warn(cfg, "%s: key '%s': repipe does not split a linear layer's product; "
                     "ignored", c->name, rpi_og_keys[o->val[split[m]] ? split[m] : factor[m]].name);
    }
    return RP_OK;
}

