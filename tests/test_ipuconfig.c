/*
** IPUConfig files against Optimum Graphcore's own IPUConfig.
**
** tests/fixtures/optimum-graphcore holds every IPUConfig file of Optimum
** Graphcore's repository history, the Hub copies, what every release's
** save_pretrained writes for a set of settings, and files at the edges of
** its rules; expected.json, what the IPUConfig class of every release tag
** (and, for a history file, of its own commit) made of each: accepted or
** refused and why, the replication, accumulation and device iterations of
** training and inference, the IPUs per replica, and where parallelize()
** placed the layers of models of 7, 12, 24 layers and the file's own count.
**
** For every file repipe says which release it read it as; that release's
** IPUConfig must agree with repipe on everything above. Against each history
** file's own commit the agreement is counted and printed, and a divergence
** is allowed only where the list below says why.
**
** loads.json splits the current IPUConfig's answer in two: what
** from_pretrained loads, and what to_options() then refuses (release v0.7.1
** and main). repipe refuses what it cannot load, and of what it loads only
** what to_options() refuses for a reason that reaches training; the two
** refusals that do not are read with a warning (USE_ONLY).
*/
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/util.h"
#include "repipe/repipe.h"
#include "test.h"

/* The file's text, NUL-terminated; NULL when it cannot be read. */
static char *slurp(const char *path) {
    char *text;
    size_t len;
    rp_error err;
    return rp_read_file(path, &text, &len, &err) ? NULL : text;
}

/* The release tag whose IPUConfig stands for repipe's reading: the newest
** of the release range it names. */
static const char *tag_of(const char *release) {
    static const char *const map[][2] = {
        {"a development version before 0.1.0", "own"}, {"0.1.0-0.2.0", "v0.2.0"},
        {"0.2.1-0.2.2", "v0.2.2"}, {"0.2.3-0.5", "v0.5.0"}, {"0.6.0", "v0.6.0"},
        {"0.6.1", "v0.6.1"}, {"0.7.0", "v0.7.0"}, {"0.7.1", "v0.7.1"}, {"", "v0.7.1"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i][0], release) == 0)
            return map[i][1];
    return NULL;
}

/* The release a refusal names: "(as Optimum Graphcore X reads this ...)". */
static void refused_as(const char *msg, char *out, size_t cap) {
    const char *p = strstr(msg, "(as Optimum Graphcore ");
    out[0] = '\0';
    if (!p)
        return;
    p += strlen("(as Optimum Graphcore ");
    const char *e = strstr(p, " reads this");
    if (e && (size_t)(e - p) < cap) {
        memcpy(out, p, (size_t)(e - p));
        out[e - p] = '\0';
    }
}

static const cJSON *group_for(const cJSON *groups, const char *tag) {
    const cJSON *g;
    cJSON_ArrayForEach(g, groups) {
        const cJSON *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(g, "releases"))
            if (strcmp(r->valuestring, tag) == 0)
                return g;
    }
    return NULL;
}

static int num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valueint : -1;
}

/* Transformers of n blocks, made once each: kind 0 a chain of GPT blocks
** (2 embedding lines before them, a layernorm, the head and the loss after:
** 3), kind 1 a LLaMA graph of 12-line blocks (1 line before, 3 after). */
enum { MAX_BLOCKS = 64 };
static rp_model *models[2][MAX_BLOCKS + 1];
static const int PRE[2] = {2, 1}, PER[2] = {1, 12}, POST[2] = {3, 3};
static int placements; /* pipelines of transformers compared */

static rp_model *transformer(int kind, int n) {
    if (n < 1 || n > MAX_BLOCKS)
        return NULL;
    if (models[kind][n])
        return models[kind][n];
    size_t cap = 64 + (size_t)n * 600, at;
    char *spec = malloc(cap);
    if (kind == 0) {
        at = (size_t)snprintf(spec, cap, "input 8\nembedding 16 8\nposition_embedding\n");
        for (int b = 0; b < n; b++)
            at += (size_t)snprintf(spec + at, cap - at, "transformer_block heads=2\n");
        snprintf(spec + at, cap - at, "layernorm\nlinear 16 bias=false\nsoftmax_cross_entropy\n");
    } else {
        at = (size_t)snprintf(spec, cap, "input 8\nx0 = embedding 16 8\n");
        for (int b = 0; b < n; b++)
            at += (size_t)snprintf(
                spec + at, cap - at,
                "n%d = rmsnorm < x%d\nlinear 16 bias=false\nattention heads=2 kv_heads=1\n"
                "o%d = linear 8 bias=false\nh%d = add < o%d x%d\nm%d = rmsnorm\n"
                "linear 16 bias=false\ng%d = silu\nu%d = linear 16 bias=false < m%d\n"
                "mul < g%d u%d\nd%d = linear 8 bias=false\nx%d = add < d%d h%d\n",
                b, b, b, b, b, b, b, b, b, b, b, b, b, b + 1, b, b);
        snprintf(spec + at, cap - at, "rmsnorm\nlinear 16 bias=false\nsoftmax_cross_entropy\n");
    }
    rp_error err;
    if (rp_model_parse(&models[kind][n], spec, strlen(spec), "transformer", &err)) {
        fprintf(stderr, "%s\n%s\n", spec, err.msg);
        exit(1);
    }
    free(spec);
    CHECK_INT(models[kind][n]->num_layers, PRE[kind] + PER[kind] * n + POST[kind]);
    return models[kind][n];
}

/* Whether cfg, fitted to a transformer of L blocks of each kind, gives
** stage s the blocks Optimum placed (sp), the embeddings on the first stage
** and the head on the last; why not where not. */
static const char *blocks_placed(const rp_config *cfg, bool inf, int L, const cJSON *sp,
                                 char *why, size_t cap) {
    for (int kind = 0; kind < 2; kind++) {
        rp_model *m = transformer(kind, L);
        if (!m)
            return NULL;
        rp_config *fit = malloc(sizeof *fit);
        *fit = *cfg;
        rp_error err;
        int counts[RP_MAX_STAGES], n = rp_config_num_stages(cfg, inf);
        bool ok = rp_session_fit_config(m, fit, &err) == RP_OK &&
                  rp_config_stage_layers(fit, inf, m->num_layers, counts, &err) == RP_OK;
        free(fit);
        placements += ok;
        for (int s = 0; ok && s < n; s++) {
            int want = PER[kind] * cJSON_GetArrayItem(sp, s)->valueint +
                       (s == 0 ? PRE[kind] : 0) + (s == n - 1 ? POST[kind] : 0);
            if (counts[s] != want) {
                snprintf(why, cap, "%s stage %d of a %s of %d blocks: %d layers, want %d",
                         inf ? "inference" : "training", s, kind ? "LLaMA" : "GPT", L,
                         counts[s], want);
                return why;
            }
        }
        if (!ok) {
            snprintf(why, cap, "%s %s of %d blocks: %s", inf ? "inference" : "training",
                     kind ? "LLaMA" : "GPT", L, err.msg);
            return why;
        }
    }
    return NULL;
}

/* Where one difference is found, why; NULL when repipe agrees with g. The
** layers are placed as in `placing`: g, or for a file without a layer list,
** whose lists take the current release's default, the current release's
** result (NULL: not compared). */
static const char *compare(const rp_config *cfg, bool ok, const char *msg, const cJSON *g,
                           const cJSON *placing, bool literal, char *why, size_t cap) {
    bool accepted = cJSON_IsTrue(cJSON_GetObjectItem(g, "accepted"));
    if (ok != accepted) {
        snprintf(why, cap, "repipe %s, IPUConfig %s (%s)", ok ? "accepts" : "refuses",
                 accepted ? "accepts" : "refuses",
                 ok ? cJSON_GetStringValue(cJSON_GetObjectItem(g, "error")) : msg);
        return why;
    }
    if (!ok) { /* both refuse: for the same key, where IPUConfig's message names one */
        const char *key = cJSON_GetStringValue(cJSON_GetObjectItem(g, "key"));
        if (key && !strstr(msg, key)) {
            snprintf(why, cap, "refused for another reason: IPUConfig names '%s' (%s), repipe "
                     "says: %s", key, cJSON_GetStringValue(cJSON_GetObjectItem(g, "error")), msg);
            return why;
        }
        return NULL;
    }
    rp_derived d;
    rp_config_derive(cfg, &d);
    for (int inf = 0; inf < 2; inf++) {
        const cJSON *m = cJSON_GetObjectItem(g, inf ? "inference" : "training");
        int R = num(m, "replication_factor"), D = num(m, "device_iterations");
        int GA = num(m, "gradient_accumulation"), ipus = num(m, "ipus_per_replica");
        const cJSON *lp = cJSON_GetObjectItem(m, "layers_per_ipu");
        if (literal && cJSON_IsArray(lp) && cJSON_GetArraySize(lp) > ipus)
            ipus = cJSON_GetArraySize(lp); /* before 0.6.0 the list placed layers on its IPUs */
        long long got[4] = {inf ? cfg->inference_replication_factor : cfg->replication_factor,
                            inf ? d.inference_workers : d.workers,
                            inf ? d.inference_samples_per_step : d.samples_per_update,
                            inf ? d.inference_samples_per_host_call : d.samples_per_host_call};
        long long want[4] = {R, (long long)R * ipus, (long long)R * GA, (long long)R * GA * D};
        static const char *const names[4] = {"replication factor", "workers",
                                             "samples per update", "samples per host call"};
        for (int i = 0; i < 4; i++)
            if (got[i] != want[i]) {
                snprintf(why, cap, "%s %s: repipe %lld, IPUConfig %lld",
                         inf ? "inference" : "training", names[i], got[i], want[i]);
                return why;
            }
        const cJSON *sp, *pm = placing && cJSON_IsTrue(cJSON_GetObjectItem(placing, "accepted"))
                                   ? cJSON_GetObjectItem(placing, inf ? "inference" : "training")
                                   : NULL;
        cJSON_ArrayForEach(sp, cJSON_GetObjectItem(pm, "splits")) {
            int L = atoi(sp->string), counts[RP_MAX_STAGES];
            rp_error err;
            bool placed = rp_config_stage_layers(cfg, inf, L, counts, &err) == RP_OK;
            int n = rp_config_num_stages(cfg, inf);
            if (placed != cJSON_IsArray(sp)) {
                snprintf(why, cap, "%s layers of a %d-layer model: repipe %s, IPUConfig %s",
                         inf ? "inference" : "training", L, placed ? "places them" : err.msg,
                         placed ? "cannot" : "places them");
                return why;
            }
            if (!placed)
                continue;
            bool same = cJSON_GetArraySize(sp) == n;
            for (int s = 0; same && s < n; s++)
                same = cJSON_GetArrayItem(sp, s)->valueint == counts[s];
            if (!same) {
                char *w = cJSON_PrintUnformatted(sp);
                snprintf(why, cap, "%s layers of a %d-layer model: IPUConfig %s, repipe differs "
                         "(stage 0: %d of %d stages)", inf ? "inference" : "training", L, w,
                         counts[0], n);
                free(w);
                return why;
            }
            /* and the same blocks of a transformer, as its lines */
            if (cfg->layers_count_blocks && blocks_placed(cfg, inf, L, sp, why, cap))
                return why;
        }
    }
    return NULL;
}

/* History files whose own commit's IPUConfig repipe does not follow, and why. */
static const char *const OWN_DIVERGES[][2] = {
    {"tests_ipu_config_trainer_test@66f25fb6.json",
     "its commit's IPUConfig (a development branch) fails on every file, its own default "
     "included: to_dict() deep-copies type hints that name a TypeVar it never defines"},
    {"hubert-base_ipu_config@",
     "its commit's list of pod types (pod4 to pod64, the list of 0.2.3 on) lacks the pod128 "
     "and pod256 its dictionaries name; 0.2.1 and 0.2.2, whose list has them, read it"},
    {"examples_language-modeling_ipu_config@87e9273f.json",
     "its commit (a development branch) had 0.2.1's inference replication of its own; the "
     "file holds no key of 0.2.1 or later, so it is read as 0.1.0-0.2.0 read it"},
    {"examples_language-modeling_ipu_config@b0314dc6.json",
     "its commit (a development branch) had 0.2.1's inference replication of its own; the "
     "file holds no key of 0.2.1 or later, so it is read as 0.1.0-0.2.0 read it"},
};

/* Files the IPUConfig of no release reads as repipe does, and why. */
static const char *const RELEASE_DIVERGES[][2] = {
    {"tests_ipu_config_trainer_test@66f25fb6.json",
     "its training_ipus_per_replica and the other training_X names of a development "
     "version, which no release read, are read as ipus_per_replica and so on"},
};

/* to_options() refusals of files IPUConfig loads that repipe reads, with
** a warning that names the key, and why. */
static const char *const USE_ONLY[][3] = {
    {"'int' object is not subscriptable", "matmul_proportion",
     "a whole-number matmul_proportion: to_options() spreads a value over the IPUs only where "
     "it is a float; the number's meaning is the same"},
    {"execute_encoder_on_cpu_for_generation is not supported yet",
     "execute_encoder_on_cpu_for_generation",
     "text generation's encoder on the host: a setting of generation, which repipe does not "
     "run"},
};

/* What the current IPUConfig (v0.7.1 and main agree: checked) makes of a
** file, and whether repipe, reading it as that release, does the same:
** NULL when so, else why not. */
static const char *check_load(const cJSON *rec, const char *file, bool ok, const rp_config *cfg,
                              const char *msg, bool *use_only, char *why, size_t cap) {
    *use_only = false;
    const cJSON *a = cJSON_GetObjectItem(rec, "v0.7.1");
    const cJSON *b = cJSON_GetObjectItem(rec, "main@b8cd6e09");
    char *ta = cJSON_PrintUnformatted(a), *tb = cJSON_PrintUnformatted(b);
    bool same = ta && tb && strcmp(ta, tb) == 0;
    free(ta), free(tb);
    if (!same) {
        snprintf(why, cap, "%s: v0.7.1 and main differ; not compared", file);
        return why;
    }
    const char *load = cJSON_GetStringValue(cJSON_GetObjectItem(a, "load"));
    const char *train = cJSON_GetStringValue(cJSON_GetObjectItem(a, "training"));
    if (!load || strcmp(load, "accepted") != 0) {
        if (ok)
            snprintf(why, cap, "repipe accepts what IPUConfig cannot load (%s)", load);
        return ok ? why : NULL;
    }
    if (train && strcmp(train, "accepted") != 0) {
        for (size_t i = 0; i < sizeof USE_ONLY / sizeof USE_ONLY[0]; i++)
            if (strstr(train, USE_ONLY[i][0])) {
                bool said = false;
                for (int w = 0; ok && w < cfg->num_warnings; w++)
                    said = said || strstr(cfg->warnings[w], USE_ONLY[i][1]);
                *use_only = true;
                if (!ok || !said)
                    snprintf(why, cap, "IPUConfig loads it and only to_options() refuses it (%s): "
                             "repipe %s", train, ok ? "reads it without a warning" : msg);
                return ok && said ? NULL : why;
            }
        if (ok)
            snprintf(why, cap, "repipe accepts what to_options() refuses (%s)", train);
        return ok ? why : NULL;
    }
    if (!ok)
        snprintf(why, cap, "repipe refuses what IPUConfig loads and runs: %s", msg);
    return ok ? NULL : why;
}

static const char *release_divergence(const char *file) {
    for (size_t i = 0; i < sizeof RELEASE_DIVERGES / sizeof RELEASE_DIVERGES[0]; i++)
        if (strstr(file, RELEASE_DIVERGES[i][0]))
            return RELEASE_DIVERGES[i][1];
    return NULL;
}

static const char *own_divergence(const char *file) {
    for (size_t i = 0; i < sizeof OWN_DIVERGES / sizeof OWN_DIVERGES[0]; i++)
        if (strstr(file, OWN_DIVERGES[i][0]))
            return OWN_DIVERGES[i][1];
    return NULL;
}

static rp_status load(rp_config *cfg, const char *json, const char *pod, rp_error *err) {
    rp_config_load_options o = {.pod_type = pod};
    return rp_config_load_string_opts(cfg, json, strlen(json), "f.json", &o, err);
}

static bool warned(const rp_config *cfg, const char *text) {
    for (int i = 0; i < cfg->num_warnings; i++)
        if (strstr(cfg->warnings[i], text))
            return true;
    return false;
}

/* What a new user met, one case each (the corpus above covers them too). */
static void test_findings(void) {
    rp_config *c = malloc(sizeof *c);
    rp_error err;
    int out[RP_MAX_STAGES];
    /* nulls of Optimum 0.7's save_pretrained are "not set" */
    CHECK_OK(load(c, "{\"seed\": null, \"layers_per_ipu\": [-1, -1], \"ipus_per_replica\": 2, "
                     "\"serialized_embedding_splits_per_ipu\": null, "
                     "\"inference_serialized_embedding_splits_per_ipu\": null, "
                     "\"optimum_version\": \"1.6.1\"}", NULL, &err), err);
    CHECK_STR_HAS(c->ipu_release, "0.6");
    /* values per pod type: the pod type given, the file's, else "default" */
    const char *pods = "{\"replication_factor\": {\"pod16\": 4, \"pod64\": 16, \"default\": 2}, "
                       "\"gradient_accumulation_steps\": {\"pod16\": 8, \"default\": 32}}";
    CHECK_OK(load(c, pods, NULL, &err), err);
    CHECK(c->replication_factor == 2 && c->gradient_accumulation_steps == 32);
    CHECK_OK(load(c, pods, "pod16", &err), err);
    CHECK(c->replication_factor == 4 && c->gradient_accumulation_steps == 8);
    CHECK(load(c, pods, "pod64", &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "'gradient_accumulation_steps'");
    CHECK_STR_HAS(err.msg, "holds no value for the pod type pod64");
    /* more IPUs than stages repipe runs: refused, not placed past the list (a
    ** fuzzer's find: ipus_per_replica 2000000 wrote past layers_per_stage) */
    for (int k = 0; k < 2; k++) {
        CHECK(load(c, k ? "{\"ipus_per_replica\": 2000000, \"layers_per_ipu\": [-1]}"
                        : "{\"ipus_per_replica\": 2, \"inference_ipus_per_replica\": 257}",
                   NULL, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, "must be at most 256");
    }
    CHECK_OK(load(c, "{\"ipus_per_replica\": 256}", NULL, &err), err);
    /* 0 meant "not serialized" before 0.6.1 */
    CHECK_OK(load(c, "{\"embedding_serialization_factor\": 0, \"ipus_per_replica\": 2}", NULL,
                  &err), err);
    CHECK_INT(c->embedding_serialization_factor, 1);
    CHECK(warned(c, "0 meant not serialized"));
    /* a key given twice: the last counts, with a warning */
    CHECK_OK(load(c, "{\"replication_factor\": 2, \"replication_factor\": 4}", NULL, &err), err);
    CHECK_INT(c->replication_factor, 4);
    CHECK(warned(c, "given more than once; the last value counts"));
    /* keys a release dropped, and a training script's, are warnings there */
    CHECK_OK(load(c, "{\"random_seed\": 7, \"synthetic_data\": true, \"fp32\": false, "
                     "\"ipus_per_replica\": 2, \"layers_per_ipu\": [3, 4]}", NULL, &err), err);
    CHECK_INT(c->seed, 7);
    CHECK(warned(c, "'synthetic_data' (random data generated on the device)"));
    CHECK(warned(c, "'fp32' is not a key of any IPUConfig release"));
    /* ... but a misspelling is refused in every release */
    CHECK(load(c, "{\"replicaton_factor\": 2, \"ipus_per_replica\": 2}", NULL, &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "did you mean 'replication_factor'");
    /* four IPUs, three counts: the last IPU empty, as before 0.6.0 */
    CHECK_OK(load(c, "{\"ipus_per_replica\": 4, \"layers_per_ipu\": [0, 2, 2]}", NULL, &err), err);
    CHECK_INT(c->layers_per_stage.count, 4);
    CHECK_OK(rp_config_stage_layers(c, false, 4, out, &err), err);
    CHECK(out[0] == 0 && out[1] == 2 && out[2] == 2 && out[3] == 0);
    /* the current release's defaults; enable_half_partials has Optimum's meaning */
    CHECK_OK(load(c, "{\"ipus_per_replica\": 2}", NULL, &err), err);
    CHECK(c->matmul_proportion[0] == 0.2 && c->enable_half_partials && !c->fp16_exchange);
    /* inference: [-1] keeps ipus_per_replica; inference_ipus_per_replica alone
    ** keeps the training list, which then does not fit */
    CHECK_OK(load(c, "{\"ipus_per_replica\": 4, \"inference_layers_per_ipu\": [-1]}", NULL, &err),
             err);
    CHECK_INT(rp_config_num_stages(c, true), 4);
    CHECK(load(c, "{\"ipus_per_replica\": 4, \"layers_per_ipu\": [2, 2, 2, 2], "
                  "\"inference_ipus_per_replica\": 2}", NULL, &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "it lists 4 IPUs but inference_ipus_per_replica is 2");
    /* splits serialize the embedding into the sum of their pieces */
    CHECK_OK(load(c, "{\"ipus_per_replica\": 4, \"serialized_embedding_splits_per_ipu\": "
                     "[3, 1, 0, 0]}", NULL, &err), err);
    CHECK_INT(c->embedding_serialization_factor, 4);
    /* matmul_proportion: 0 and above 1 are IPUConfig's; one value for four
    ** IPUs is refused by the current release */
    CHECK_OK(load(c, "{\"matmul_proportion\": 0.0, \"ipus_per_replica\": 1}", NULL, &err), err);
    CHECK_OK(load(c, "{\"matmul_proportion\": 2.5, \"ipus_per_replica\": 1}", NULL, &err), err);
    CHECK(load(c, "{\"ipus_per_replica\": 4, \"layers_per_ipu\": [-1], \"matmul_proportion\": "
                  "[0.25], \"inference_ipus_per_replica\": 4}", NULL, &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "it lists 1 values for 4 IPUs");
    /* "disabled" is no cache; one IPU takes every layer, whatever its list */
    CHECK_OK(load(c, "{\"executable_cache_dir\": \"disabled\", \"ipus_per_replica\": 1, "
                     "\"layers_per_ipu\": [12], \"optimum_version\": \"1.6.1\", "
                     "\"inference_ipus_per_replica\": 1}", NULL, &err), err);
    CHECK(c->executable_cache_dir[0] == '\0');
    CHECK_OK(rp_config_stage_layers(c, false, 24, out, &err), err);
    CHECK_INT(out[0], 24);
    /* 2.0 is a float to Python and to IPUConfig */
    CHECK(load(c, "{\"replication_factor\": 2.0}", NULL, &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "written without a fraction");
    /* before 0.2.1 inference ran on the training replication and iterations */
    CHECK_OK(load(c, "{\"random_seed\": 1, \"replication_factor\": 4, \"device_iterations\": 3}",
                  NULL, &err), err);
    CHECK(c->inference_replication_factor == 4 && c->inference_device_iterations == 3);
    free(c);
}

int main(int argc, char **argv) {
    test_findings();
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures/optimum-graphcore";
    char path[1024];
    snprintf(path, sizeof path, "%s/expected.json", dir);
    char *text = slurp(path);
    if (!text) {
        fprintf(stderr, "cannot read %s\n", path);
        return 1;
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    CHECK(root != NULL);
    const cJSON *files = cJSON_GetObjectItem(root, "files"), *f;
    snprintf(path, sizeof path, "%s/loads.json", dir);
    char *ltext = slurp(path);
    cJSON *lroot = ltext ? cJSON_Parse(ltext) : NULL;
    free(ltext);
    CHECK(lroot != NULL);
    const cJSON *lfiles = cJSON_GetObjectItem(lroot, "files");
    int load_checked = 0, load_use_only = 0;
    int loads = 0, agree = 0, own_total = 0, own_agree = 0, own_both = 0, own_accepted = 0;
    int per_kind[4][2] = {{0}};
    static const char *const kinds[4] = {"history/", "hub/", "saves/", "cases/"};
    cJSON_ArrayForEach(f, files) {
        const cJSON *pods, *own_commit = cJSON_GetObjectItem(f, "own_commit");
        cJSON_ArrayForEach(pods, f) {
            if (pods == own_commit)
                continue;
            const char *pod = strcmp(pods->string, "-") == 0 ? NULL : pods->string;
            snprintf(path, sizeof path, "%s/%s", dir, f->string);
            rp_config *cfg = malloc(sizeof *cfg);
            rp_error err;
            rp_config_load_options opts = {.pod_type = pod};
            char *ftext = slurp(path);
            cJSON *fjson = ftext ? cJSON_Parse(ftext) : NULL;
            free(ftext);
            const cJSON *lk = cJSON_GetObjectItem(fjson, "layers_per_ipu");
            bool holds_layers = (lk && !cJSON_IsNull(lk)) ||
                                cJSON_GetObjectItem(fjson, "layers_per_stage");
            cJSON_Delete(fjson);
            const cJSON *current = group_for(pods, "v0.7.1");
            bool ok = rp_config_load_file_opts(cfg, path, &opts, &err) == RP_OK;
            char rel[64];
            if (ok)
                snprintf(rel, sizeof rel, "%s", cfg->ipu_release);
            else
                refused_as(err.msg, rel, sizeof rel);
            const char *tag = tag_of(rel);
            const cJSON *g = tag ? group_for(pods, tag) : NULL;
            loads++;
            char why[2048];
            bool literal = tag && (strcmp(tag, "v0.2.0") == 0 || strcmp(tag, "v0.2.2") == 0 ||
                                   strcmp(tag, "v0.5.0") == 0 || strcmp(tag, "own") == 0);
            const char *diff = g ? compare(cfg, ok, err.msg, g, holds_layers ? g : current,
                                           literal, why, sizeof why)
                                 : "no result of that release";
            const cJSON *lrec = cJSON_GetObjectItem(lfiles, f->string);
            if (!pod && tag && strcmp(tag, "v0.7.1") == 0 && lrec) {
                /* the current release: what it loads, beside what it runs */
                char why2[2048];
                bool use_only;
                const char *d2 = check_load(lrec, f->string, ok, cfg, err.msg, &use_only, why2,
                                            sizeof why2);
                CHECKF(!d2, "%s: %s", f->string, d2);
                load_checked++;
                load_use_only += use_only;
                if (!d2 && use_only) /* IPUConfig refused it in to_options() alone */
                    diff = NULL;
            }
            const char *excused = release_divergence(f->string);
            if (diff && excused) {
                printf("  %s differs from the release it is read as: %s\n", f->string, excused);
                diff = NULL;
            }
            CHECKF(!diff, "%s%s%s, read as %s: %.1200s", f->string, pod ? " --pod-type " : "",
                   pod ? pod : "", rel[0] ? rel : "repipe's own keys", diff);
            agree += !diff;
            for (int k = 0; k < 4; k++)
                if (strncmp(f->string, kinds[k], strlen(kinds[k])) == 0) {
                    per_kind[k][0]++;
                    per_kind[k][1] += ok;
                }
            const cJSON *own = group_for(pods, "own");
            if (own) { /* a file of the repository's history, against its own commit */
                own_total++;
                bool own_ok = cJSON_IsTrue(cJSON_GetObjectItem(own, "accepted"));
                own_accepted += own_ok;
                bool lit = cJSON_IsTrue(cJSON_GetObjectItem(own_commit, "literal"));
                const char *d2 = compare(cfg, ok, err.msg, own, holds_layers ? own : current, lit,
                                         why, sizeof why);
                own_agree += !d2;
                own_both += ok && own_ok && !d2;
                const char *allowed = own_divergence(f->string);
                CHECKF(!d2 || allowed, "%s against its own commit: %s", f->string, d2);
                if (d2 && allowed)
                    printf("  %s differs from its own commit: %s\n", f->string, allowed);
            }
            free(cfg);
        }
    }
    /* the files loads.json has that expected.json does not: saves of main,
    ** and cases of to_options()' refusals */
    const cJSON *lf;
    cJSON_ArrayForEach(lf, lfiles) {
        if (cJSON_GetObjectItem(files, lf->string))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, lf->string);
        rp_config *cfg = malloc(sizeof *cfg);
        rp_error err;
        bool ok = rp_config_load_file(cfg, path, &err) == RP_OK;
        char why[2048];
        bool use_only;
        const char *d2 = check_load(lf, lf->string, ok, cfg, err.msg, &use_only, why, sizeof why);
        CHECKF(!d2, "%s: %s", lf->string, d2);
        load_checked++;
        load_use_only += use_only;
        free(cfg);
    }
    printf("%d loads, %d agree with the IPUConfig of the release repipe read them as\n", loads,
           agree);
    printf("layers placed as IPUConfig placed a transformer's blocks: %d pipelines of GPT and "
           "LLaMA models\n", placements);
    printf("against the current IPUConfig's load and to_options(): %d files, %d of them read "
           "where only to_options() refuses\n", load_checked, load_use_only);
    cJSON_Delete(lroot);
    for (int k = 0; k < 4; k++)
        printf("  %-9s %3d loads, %3d accepted\n", kinds[k], per_kind[k][0], per_kind[k][1]);
    printf("history against each file's own commit: %d files, %d accepted by it, %d agree "
           "(%d accepted by both with the same numbers)\n",
           own_total, own_accepted, own_agree, own_both);
    cJSON_Delete(root);
    for (int k = 0; k < 2; k++)
        for (int n = 0; n <= MAX_BLOCKS; n++)
            rp_model_free(models[k][n]);
    printf("test_ipuconfig: %d checks, %d failed\n", test_checks, test_failures);
    return test_failures != 0;
}
