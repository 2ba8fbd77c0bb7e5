#define _POSIX_C_SOURCE 200809L
/*
** Execution configuration: per-key validation messages, wildcard expansion,
** an IPUConfig file of the current release, derived numbers and the
** save/load round trip (the IPUConfig releases: tests/test_ipuconfig.c).
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/util.h"
#include "repipe/config.h"
#include "test.h"

static rp_status load(rp_config *cfg, const char *json, rp_error *err) {
    return rp_config_load_string(cfg, json, strlen(json), "t.json", err);
}

/* Each bad value must be rejected with a message naming the key and rule. */
static void test_key_errors(void) {
    static const struct {
        const char *json, *key, *rule;
    } cases[] = {
        {"{\"seed\": -1}", "'seed'", "whole number between 0"},
        /* products that wrapped: refused with the keys that make them */
        {"{\"micro_batch_size\": 2000000, \"gradient_accumulation_steps\": 2000000, "
         "\"replication_factor\": 20, \"device_iterations\": 100000}",
         "a host call takes 8e+18 samples", "at most 1099511627776"},
        {"{\"replication_factor\": 1000, \"layers_per_stage\": [1, 1], "
         "\"stage_replication\": [3, 2]}",
         "replication_factor 1000 x 5 workers per replica", "needs 5000 workers; at most 4096"},
        {"{\"inference_replication_factor\": 5000}", "inference_replication_factor 5000",
         "at most 4096"},
        {"{\"seed\": 1.5}", "'seed'", "whole number between 0"},
        {"{\"replication_factor\": 2.0}", "'replication_factor': 2", "written without a fraction"},
        {"{\"micro_batch_size\": 0}", "'micro_batch_size': 0", ">= 1"},
        {"{\"replication_factor\": \"2\"}", "'replication_factor': \"2\"", "whole number >= 1"},
        {"{\"inference_replication_factor\": 0}", "'inference_replication_factor'", ">= 1"},
        {"{\"gradient_accumulation_steps\": 0}", "'gradient_accumulation_steps'", ">= 1"},
        {"{\"layers_per_stage\": [2, -2]}", "'layers_per_stage'", ">= -1"},
        {"{\"layers_per_stage\": []}", "'layers_per_stage'", "list of 1 to 256"},
        {"{\"inference_layers_per_stage\": [1.5]}", "'inference_layers_per_stage'", ">= -1"},
        {"{\"stage_replication\": [1, 0]}", "'stage_replication'", "integers >= 1"},
        {"{\"device_iterations\": 0}", "'device_iterations'", ">= 1"},
        {"{\"inference_device_iterations\": -3}", "'inference_device_iterations'", ">= 1"},
        {"{\"output_mode\": \"last\"}", "'output_mode': \"last\"", "\"all\", \"sum\""},
        {"{\"schedule\": \"pipedreams\"}", "'schedule'",
         "\"gpipe\", \"1f1b\", \"zb-h1\", \"zb-h2\", \"zb-auto\", \"interleaved-1f1b\", \"zb-v\", "
         "\"dualpipev\", \"dualpipe\", \"pipedream\" or \"pipedream_2bw\""},
        {"{\"replica_grouping\": 2}", "'replica_grouping'", "group_size"},
        {"{\"replica_grouping\": {\"group_size\": 0}}", "'replica_grouping.group_size'",
         ">= 1"},
        {"{\"replica_grouping\": {\"group_size\": 2, \"stride\": 0}}",
         "'replica_grouping.stride'", ">= 1"},
        {"{\"replica_grouping\": {\"group_size\": 2, \"strde\": 1}}",
         "'replica_grouping.strde'", "known: group_size, stride"},
        {"{\"replication_factor\": 8, \"replica_grouping\": {\"group_size\": 3}}",
         "'replica_grouping'", "8 replicas, group_size=3 (stride not given: 1)"},
        {"{\"replicated_tensor_sharding\": 1}", "'replicated_tensor_sharding'", "true or false"},
        {"{\"optimizer_state_offchip\": \"yes\"}", "'optimizer_state_offchip'", "true or false"},
        {"{\"recompute_checkpoint_every_layer\": null}", "'recompute_checkpoint_every_layer'",
         "optional keys only"},
        {"{\"auto_loss_scaling\": 0}", "'auto_loss_scaling'", "true or false"},
        {"{\"enable_half_partials\": []}", "'enable_half_partials'", "true or false"},
        {"{\"embedding_serialization_factor\": 0}", "'embedding_serialization_factor'",
         ">= 1"},
        {"{\"matmul_proportion\": -0.5}", "'matmul_proportion': -0.5", ">= 0"},
        {"{\"matmul_proportion\": [0.2, 0.3]}", "'matmul_proportion': [0.2,0.3]",
         "it lists 2 values for 1 IPUs"},
        {"{\"layers_per_stage\": [1, 1, 1, 1], \"matmul_proportion\": [0.25]}",
         "'matmul_proportion': [0.25]", "it lists 1 values for 4 IPUs"},
        {"{\"device_memory\": -1}", "'device_memory'", "bytes >= 0"},
        {"{\"executable_cache_dir\": 3}", "'executable_cache_dir'", "path string"},
        {"{\"optimizer\": \"sgd\"}", "'optimizer'", "must be an object"},
        {"{\"optimizer\": {\"type\": \"lamb\"}}", "'optimizer.type'", "\"sgd\", \"adam\""},
        {"{\"optimizer\": {\"lr\": 0}}", "'optimizer.lr': 0", "> 0"},
        {"{\"optimizer\": {\"momentum\": 1}}", "'optimizer.momentum'", "< 1"},
        {"{\"optimizer\": {\"beta1\": 0.9}}", "'optimizer.beta1'", "is an Adam setting"},
        {"{\"optimizer\": {\"type\": \"adam\", \"momentum\": 0.9}}", "'optimizer.momentum'",
         "is an sgd setting"},
        {"{\"optimizer\": {\"type\": \"adam\", \"beta2\": 1}}", "'optimizer.beta2'", "< 1"},
        {"{\"optimizer\": {\"weight_decay\": -0.1}}", "'optimizer.weight_decay'", ">= 0"},
        {"{\"optimizer\": {\"lrr\": 0.1}}", "'optimizer.lrr'", "did you mean 'optimizer.lr'"},
        {"{\"ipus_per_replica\": 0}", "'ipus_per_replica'", ">= 1"},
        {"{\"ipus_per_replica\": 3, \"layers_per_ipu\": [1, 2], \"inference_ipus_per_replica\": 3}",
         "'layers_per_ipu': [1,2]", "it lists 2 IPUs but ipus_per_replica is 3"},
        {"{\"layers_per_stage\": [1, 2], \"stage_replication\": [1]}",
         "'stage_replication' lists 1 stages", "has 2"},
        {"{\"layers_per_stage\": [1], \"layers_per_ipu\": [1]}", "'layers_per_ipu' and "
         "'layers_per_stage' both given", "keep one"},
        /* one document, nothing after it */
        {"{\"seed\": 1} {\"seed\": 2}", "t.json:1:13", "more text after the JSON document"},
        {"{\"seed\": 1}\n\n  x", "t.json:3:3", "more text after the JSON document"},
        {"{\"replication_factr\": 2}", "unknown key 'replication_factr'",
         "did you mean 'replication_factor'"},
        {"{\"zzz\": 2}", "unknown key 'zzz'", ""},
        {"[1, 2]", "JSON object", ""},
        {"{\"seed\": 1,\n \"micro_batch_size\": }", "t.json:2:", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rp_config cfg;
        rp_error err;
        rp_status s = load(&cfg, cases[i].json, &err);
        CHECK(s != RP_OK);
        if (s == RP_OK) {
            fprintf(stderr, "  accepted: %s\n", cases[i].json);
            continue;
        }
        CHECK_STR_HAS(err.msg, "t.json");
        CHECK_STR_HAS(err.msg, cases[i].key);
        CHECK_STR_HAS(err.msg, cases[i].rule);
    }
}

/* A NUL byte and more after the document: refused, not read as the end. */
static void test_nul(void) {
    const char text[] = "{\"seed\": 1}\0garbage";
    rp_config cfg;
    rp_error err;
    CHECK(rp_config_load_string(&cfg, text, sizeof text - 1, "t.json", &err) == RP_ERR_PARSE);
    CHECK_STR_HAS(err.msg, "t.json:1:12: a NUL byte after the JSON document");
}

static void check_expand(const char *layers, int L, const int *expect, int n) {
    char json[128];
    snprintf(json, sizeof json, "{\"layers_per_stage\": %s}", layers);
    rp_config cfg;
    rp_error err;
    CHECK(load(&cfg, json, &err) == RP_OK);
    int out[RP_MAX_STAGES];
    CHECK(rp_config_stage_layers(&cfg, false, L, out, &err) == RP_OK);
    CHECK_INT(rp_config_num_stages(&cfg, false), n);
    for (int i = 0; i < n; i++)
        CHECK_INT(out[i], expect[i]);
}

static void test_wildcards(void) {
    check_expand("[-1, -1]", 7, (int[]){3, 4}, 2);
    check_expand("[-1, -1, -1, -1]", 10, (int[]){2, 2, 2, 4}, 4);
    check_expand("[2, -1]", 6, (int[]){2, 4}, 2);
    check_expand("[-1, 2]", 6, (int[]){4, 2}, 2);
    check_expand("[-1, 2, -1, 2]", 7, (int[]){1, 2, 2, 2}, 4);
    check_expand("[3, 0, 4]", 7, (int[]){3, 0, 4}, 3);
    /* [-1] on P stages comes from ipus_per_replica, as in IPUConfig */
    rp_config cfg;
    rp_error err;
    int out[RP_MAX_STAGES];
    CHECK(load(&cfg, "{\"ipus_per_replica\": 2}", &err) == RP_OK);
    CHECK(rp_config_stage_layers(&cfg, false, 7, out, &err) == RP_OK);
    CHECK_INT(out[0], 3);
    CHECK_INT(out[1], 4);
    CHECK(load(&cfg, "{\"layers_per_stage\": [-1]}", &err) == RP_OK);
    CHECK(rp_config_stage_layers(&cfg, false, 5, out, &err) == RP_OK);
    CHECK_INT(out[0], 5);
    /* sum != L, both ways, states both numbers */
    CHECK(load(&cfg, "{\"layers_per_stage\": [2, 3]}", &err) == RP_OK);
    CHECK(rp_config_stage_layers(&cfg, false, 7, out, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "hold 5 layers in all but the model has 7");
    CHECK(rp_config_stage_layers(&cfg, false, 4, out, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "hold 5 layers in all but the model has 4");
    CHECK(load(&cfg, "{\"layers_per_stage\": [4, -1, 3]}", &err) == RP_OK);
    CHECK(rp_config_stage_layers(&cfg, false, 6, out, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "already hold 7 layers, more than the model's 6");
    CHECK(load(&cfg, "{\"layers_per_stage\": [0, 0]}", &err) == RP_OK);
    CHECK(rp_config_stage_layers(&cfg, false, 0, out, &err) == RP_ERR_INVALID);
}

/* An Optimum Graphcore ipu_config.json with the memory options, a per-stage
** matmul_proportion and inference values. */
static const char *IPU_JSON =
    "{\n"
    "  \"optimum_version\": \"1.6.1\",\n"
    "  \"seed\": 42,\n"
    "  \"replication_factor\": 4,\n"
    "  \"inference_replication_factor\": 2,\n"
    "  \"gradient_accumulation_steps\": 16,\n"
    "  \"layers_per_ipu\": [0, 4, 4, 4],\n"
    "  \"inference_layers_per_ipu\": [6, 6],\n"
    "  \"ipus_per_replica\": 4,\n"
    "  \"matmul_proportion\": [0.1, 0.15, 0.15, 0.15],\n"
    "  \"replicated_tensor_sharding\": true,\n"
    "  \"optimizer_state_offchip\": true,\n"
    "  \"recompute_checkpoint_every_layer\": true,\n"
    "  \"enable_half_partials\": true,\n"
    "  \"embedding_serialization_factor\": 2,\n"
    "  \"device_iterations\": 8,\n"
    "  \"inference_device_iterations\": 32,\n"
    "  \"output_mode\": \"final\",\n"
    "  \"executable_cache_dir\": \"./exe_cache\",\n"
    "  \"auto_loss_scaling\": true,\n"
    "  \"parallelize_kwargs\": {\"use_cache\": true},\n"
    "  \"explicit_ir_inference\": false,\n"
    "  \"sharded_execution_for_inference\": true\n"
    "}\n";

/* The learning-rate schedule and clipping: values derived by hand, the
** rules, and a save/load round trip. */
static void test_lr_schedule(void) {
    rp_config cfg;
    rp_error err;
    CHECK(load(&cfg, "{\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"lr_schedule\": "
                     "{\"type\": \"step\", \"warmup_updates\": 4, \"step_updates\": 10, "
                     "\"gamma\": 0.5}, \"gradient_clipping\": 2}",
               &err) == RP_OK);
    CHECK(rp_config_lr(&cfg, 0) == 0.1 * 1 / 4);
    CHECK(rp_config_lr(&cfg, 3) == 0.1);
    CHECK(rp_config_lr(&cfg, 13) == 0.1);       /* 9 updates after the warm-up */
    CHECK(rp_config_lr(&cfg, 14) == 0.1 * 0.5); /* 10 */
    CHECK(rp_config_lr(&cfg, 34) == 0.1 * 0.125);
    CHECK(cfg.gradient_clipping == 2);
    char *text;
    rp_config back;
    CHECK(rp_config_to_json(&cfg, &text, &err) == RP_OK);
    CHECK(load(&back, text, &err) == RP_OK);
    CHECK(rp_config_equal(&cfg, &back));
    free(text);
    /* cosine: halfway down at the middle of the decay */
    CHECK(load(&cfg, "{\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.3}, \"lr_schedule\": "
                     "{\"type\": \"cosine\", \"decay_updates\": 10, \"min_lr\": 0.1}}",
               &err) == RP_OK);
    CHECK(rp_config_lr(&cfg, 0) == 0.3);
    CHECK(fabs(rp_config_lr(&cfg, 5) - 0.2) < 1e-15);
    CHECK(rp_config_lr(&cfg, 10) == 0.1 && rp_config_lr(&cfg, 1000) == 0.1);
    /* the rules name the key */
    CHECK(load(&cfg, "{\"lr_schedule\": {\"type\": \"cosine\", \"warmup_updates\": 5}}",
               &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "a cosine schedule needs decay_updates");
    CHECK(load(&cfg, "{\"lr_schedule\": {\"type\": \"linear\"}}", &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "'lr_schedule.type'");
    CHECK(load(&cfg, "{\"lr_schedule\": {\"type\": \"step\", \"step_update\": 3}}", &err) ==
          RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "unknown key 'lr_schedule.step_update' (did you mean "
                           "'lr_schedule.step_updates'?)");
    CHECK(load(&cfg, "{\"gradient_clipping\": -1}", &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "'gradient_clipping'");
    CHECK(load(&cfg, "{\"data_order\": \"sequential\"}", &err) == RP_OK && cfg.sequential_data);
    CHECK(load(&cfg, "{\"data_order\": \"shuffled\"}", &err) == RP_OK && !cfg.sequential_data);
    CHECK(load(&cfg, "{\"data_order\": \"random\"}", &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "'data_order'");
    CHECK_STR_HAS(err.msg, "must be \"shuffled\" or \"sequential\"");
}

/* An ipu_config.json of the current release (its parallelize_kwargs came in
** 0.7.1) with the memory options, a per-IPU matmul_proportion and an
** inference pipeline of its own: every number derived by hand. The
** release-by-release reading is tests/test_ipuconfig.c's. */
static void test_ipu_config(void) {
    rp_config cfg;
    rp_error err;
    CHECK_OK(load(&cfg, IPU_JSON, &err), err);
    CHECK_STR_HAS(cfg.ipu_release, "0.7.1");
    CHECK_INT(cfg.num_warnings, 3);
    CHECK_STR_HAS(cfg.warnings[0], "'enable_half_partials': fp16 partial sums");
    CHECK_STR_HAS(cfg.warnings[1], "'parallelize_kwargs': keyword arguments");
    CHECK_STR_HAS(cfg.warnings[2], "'sharded_execution_for_inference' (inference always runs "
                                   "sharded");
    CHECK(cfg.replicated_tensor_sharding && cfg.optimizer_state_offchip);
    CHECK(cfg.recompute_checkpoint_every_layer && !cfg.fp16_exchange);
    CHECK(cfg.auto_loss_scaling);
    CHECK_INT(cfg.embedding_serialization_factor, 2);
    CHECK_INT(cfg.inference_embedding_serialization_factor, 1); /* not inherited from 0.6.1 */
    CHECK_INT(cfg.matmul_proportion_count, 4);
    CHECK(cfg.matmul_proportion[1] == 0.15);
    /* a list for another number of IPUs than inference's: 0.2 there */
    CHECK(cfg.inference_matmul_proportion_count == 1 && cfg.inference_matmul_proportion[0] == 0.2);
    CHECK(strcmp(cfg.executable_cache_dir, "./exe_cache") == 0);
    rp_derived d;
    rp_config_derive(&cfg, &d);
    CHECK_INT(d.stages, 4);
    CHECK_INT(d.inference_stages, 2);
    CHECK_INT(d.workers, 16);          /* 4 replicas x 4 stages */
    CHECK_INT(d.inference_workers, 4); /* 2 replicas x 2 stages */
    CHECK_INT(d.samples_per_micro_batch, 1);
    CHECK_INT(d.samples_per_update, 64);     /* 1 x 16 x 4 */
    CHECK_INT(d.samples_per_host_call, 512); /* x 8 */
    CHECK_INT(d.inference_samples_per_step, 2);
    CHECK_INT(d.inference_samples_per_host_call, 64);
    int out[RP_MAX_STAGES];
    CHECK_OK(rp_config_stage_layers(&cfg, true, 12, out, &err), err);
    CHECK_INT(out[0], 6);
    CHECK_OK(rp_config_stage_layers(&cfg, false, 12, out, &err), err);
    CHECK_INT(out[0], 0);
    CHECK_INT(out[3], 4);
    /* repipe's own file: the inference replication factor does not inherit */
    CHECK_OK(load(&cfg, "{\"replication_factor\": 4}", &err), err);
    CHECK_INT(cfg.inference_replication_factor, 1);
    CHECK_STR_HAS(cfg.origin, "");
    CHECK(cfg.ipu_release[0] == '\0');
}

static void test_round_trip(void) {
    static const char *inputs[] = {
        "{}",
        "{\"seed\": 7, \"micro_batch_size\": 16, \"replication_factor\": 8, "
        "\"replica_grouping\": {\"group_size\": 2, \"stride\": 4}, \"layers_per_stage\": "
        "[2, -1, 3], \"stage_replication\": [2, 1, 3], \"schedule\": \"gpipe\", "
        "\"output_mode\": \"sum\", \"device_memory\": 1000000, \"optimizer\": "
        "{\"type\": \"adamw\", \"lr\": 0.002, \"weight_decay\": 0.01, \"beta2\": 0.98}}",
        NULL,
    };
    for (int i = 0; inputs[i]; i++) {
        rp_config a, b;
        rp_error err;
        CHECK(load(&a, inputs[i], &err) == RP_OK);
        char *text;
        CHECK(rp_config_to_json(&a, &text, &err) == RP_OK);
        CHECK(rp_config_load_string(&b, text, strlen(text), "saved", &err) == RP_OK);
        CHECK(rp_config_equal(&a, &b));
        free(text);
    }
    rp_config a;
    rp_error err;
    CHECK(load(&a, IPU_JSON, &err) == RP_OK);
    char path[] = "/tmp/repipe-config-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    rp_config b;
    CHECK(rp_config_save_file(&a, path, &err) == RP_OK);
    CHECK(rp_config_load_file(&b, path, &err) == RP_OK);
    CHECK(rp_config_equal(&a, &b));
    CHECK_INT(b.num_warnings, 0); /* the saved file uses repipe's own keys only */
    remove(path);
    /* equal() does see a difference */
    b.gradient_accumulation_steps++;
    CHECK(!rp_config_equal(&a, &b));
    CHECK(rp_config_load_file(&b, "/nonexistent/cfg.json", &err) == RP_ERR_IO);
    CHECK_STR_HAS(err.msg, "/nonexistent/cfg.json");
}

/* 100 000 keys: a repeated one (the last counts, a warning says so) and
** distinct ones (the first unknown key refused by name), each in a fraction
** of a second here: every key checked against every later one took over a
** minute (the 5 s bound leaves room for a loaded machine and sanitizers). */
static void test_many_repeats(void) {
    enum { N = 100000 };
    size_t cap = (size_t)N * 16 + 16, at = 0;
    char *text = malloc(cap);
    CHECK(text != NULL);
    if (!text)
        return;
    at = (size_t)snprintf(text, cap, "{");
    for (int i = 0; i < N; i++)
        at += (size_t)snprintf(text + at, cap - at, "%s\"seed\":%d", i ? "," : "", i);
    snprintf(text + at, cap - at, "}");
    rp_config cfg;
    rp_error err;
    double t0 = rp_now();
    CHECK_OK(rp_config_load_string(&cfg, text, strlen(text), "repeats.json", &err), err);
    double took = rp_now() - t0;
    CHECK(cfg.seed == N - 1);
    CHECK(cfg.num_warnings >= 1 && strstr(cfg.warnings[0], "seed"));
    CHECK(took < 5.0); /* minutes when pairwise; room for a loaded machine */
    if (took >= 5.0)
        fprintf(stderr, "  100 000 repeated keys read in %.2f s\n", took);
    at = (size_t)snprintf(text, cap, "{");
    for (int i = 0; i < N; i++)
        at += (size_t)snprintf(text + at, cap - at, "%s\"k%d\":%d", i ? "," : "", i, i);
    snprintf(text + at, cap - at, "}");
    t0 = rp_now();
    CHECK(rp_config_load_string(&cfg, text, strlen(text), "keys.json", &err) == RP_ERR_INVALID);
    took = rp_now() - t0;
    CHECK(strstr(err.msg, "'k0'") != NULL);
    CHECK(took < 5.0); /* minutes when pairwise; room for a loaded machine */
    if (took >= 5.0)
        fprintf(stderr, "  100 000 keys refused in %.2f s\n", took);
    free(text);
}

int main(void) {
    test_nul();
    test_many_repeats();
    test_key_errors();
    test_wildcards();
    test_ipu_config();
    test_lr_schedule();
    test_round_trip();
    return test_finish("test_config");
}
