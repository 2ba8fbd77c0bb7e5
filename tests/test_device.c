/*
** Devices, clusters and transformer profiles from shapes: the presets and a
** user's JSON (errors name the file and the key), the shape's parser, the
** FLOPs of Megatron-LM's equation 3, a profile's parameters against the
** paper's count of a GPT's, and the planner's answers at scale.
*/
#define _DEFAULT_SOURCE /* mkdtemp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/transformer/transformer_impl.h"
#include "repipe/repipe.h"
#include "test.h"

static char dir[] = "/tmp/repipe-device-XXXXXX";

static const char *put(const char *name, const char *text) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

static void presets(void) {
    rp_device d;
    rp_cluster c;
    rp_error err;
    CHECK(rp_device_get("a100-80gb", &d, &err) == RP_OK);
    CHECK(d.peak_flops == 312e12 && d.memory_bytes == 80e9 && d.memory_bandwidth == 2039e9);
    CHECK(rp_cluster_get("dgx-h100", &c, &err) == RP_OK);
    CHECK(c.per_node == 8 && strcmp(c.device.name, "h100-80gb") == 0);
    CHECK(rp_device_get("a100", &d, &err) == RP_ERR_INVALID);
    CHECK(strstr(err.msg, "a100-80gb, h100-80gb, h200-141gb, b200, v100-32gb") != NULL);
    const char *const *n = rp_cluster_presets();
    int k = 0;
    for (; n[k]; k++)
        CHECK(rp_cluster_get(n[k], &c, &err) == RP_OK);
    CHECK_INT(k, 4);
    /* the H100 datasheet: 989 TFLOP/s bf16, 1979 fp8 (dense); an H200 is
    ** an H100 with more and faster memory */
    CHECK(rp_device_get("h100-80gb", &d, &err) == RP_OK && d.peak_fp8 == 1979e12 &&
          d.peak_flops == 989e12);
    rp_device h200;
    CHECK(rp_device_get("h200-141gb", &h200, &err) == RP_OK);
    CHECK(h200.peak_flops == d.peak_flops && h200.memory_bytes == 141e9);
    /* a tensor group of 8 fills a node: one worker a node */
    rp_sim_options o;
    CHECK(rp_cluster_get("dgx-a100", &c, &err) == RP_OK);
    CHECK(rp_cluster_sim_options(&c, 8, 12, &o, &err) == RP_OK);
    CHECK(o.machines[0] == 1 && o.machines[1] == 12 && o.mixed_precision);
    CHECK(rp_cluster_sim_options(&c, 3, 12, &o, &err) == RP_ERR_INVALID);
    /* a worker of 16 devices (tensor 8 x context 2) is two whole nodes */
    CHECK(rp_cluster_sim_options(&c, 16, 12, &o, &err) == RP_OK);
    CHECK(o.machines[0] == 1 && o.machines[1] == 12);
}

static void user_files(void) {
    rp_cluster c;
    rp_error err;
    const char *p = put("mine.json", "{\"name\": \"mine\", \"device\": {\"peak_flops\": 1e14, "
                                       "\"memory_bytes\": 2.4e10, \"memory_bandwidth\": 9e11}, "
                                       "\"per_node\": 4, \"node_bandwidth\": 1e11, "
                                       "\"network_bandwidth\": 1e10}");
    CHECK(rp_cluster_get(p, &c, &err) == RP_OK);
    CHECK(c.per_node == 4 && c.device.peak_flops == 1e14 && c.device.gemm_efficiency == 0.8);
    CHECK(c.latency == 1e-5);
    p = put("typo.json", "{\"device\": \"a100-80gb\", \"per_node\": 8, \"node_bandwith\": 1e11, "
                           "\"network_bandwidth\": 1e10}");
    CHECK(rp_cluster_get(p, &c, &err) == RP_ERR_INVALID);
    CHECK(strstr(err.msg, "typo.json") && strstr(err.msg, "\"node_bandwith\" is not a cluster's key"));
    p = put("neg.json", "{\"device\": \"a100-80gb\", \"per_node\": 8, \"node_bandwidth\": -1, "
                          "\"network_bandwidth\": 1e10}");
    CHECK(rp_cluster_get(p, &c, &err) == RP_ERR_INVALID);
    CHECK(strstr(err.msg, "\"node_bandwidth\" must be a number from 1e+06 to 1e+15") != NULL);
    /* a link of 1e-300 bytes/s would make every time infinite */
    p = put("tiny.json", "{\"device\": \"a100-80gb\", \"per_node\": 8, \"node_bandwidth\": 1e-300, "
                           "\"network_bandwidth\": 1e10}");
    CHECK(rp_cluster_get(p, &c, &err) == RP_ERR_INVALID && strstr(err.msg, "node_bandwidth"));
    /* names are printed in profiles and JSON: no quotes, no newlines */
    p = put("quote.json", "{\"name\": \"my \\\"big\\\" cluster\", \"device\": \"a100-80gb\", "
                            "\"per_node\": 8, \"node_bandwidth\": 1e11, \"network_bandwidth\": 1e10}");
    CHECK(rp_cluster_get(p, &c, &err) == RP_ERR_INVALID && strstr(err.msg, "\"name\""));
    p = put("nl.json", "{\"name\": \"a\\nb\", \"peak_flops\": 1e14, \"memory_bytes\": 1e9, "
                         "\"memory_bandwidth\": 1e11}");
    rp_device dn;
    CHECK(rp_device_get(p, &dn, &err) == RP_ERR_INVALID && strstr(err.msg, "printable"));
    p = put("eff.json", "{\"peak_flops\": 1e14, \"memory_bytes\": 1e9, \"memory_bandwidth\": 1e11, "
                          "\"gemm_efficiency\": 1.5}");
    rp_device d;
    CHECK(rp_device_get(p, &d, &err) == RP_ERR_INVALID);
    CHECK(strstr(err.msg, "\"gemm_efficiency\" must be a number from 0.001 to 1") != NULL);
    p = put("scale.json", "{\"peak_flops\": 1e14, \"memory_bytes\": 1e9, \"memory_bandwidth\": 1e11, "
                            "\"activation_scale\": 1000}");
    CHECK(rp_device_get(p, &d, &err) == RP_ERR_INVALID &&
          strstr(err.msg, "\"activation_scale\" must be a number from 0.01 to 100"));
}

/* A device's block_latency: a block's forward and each half of its
** backward take that much longer, the embedding and the head not; its
** activation_scale: the activations a rank holds that many times repipe's
** count, its weights as they were. */
static void calibration(void) {
    rp_cluster c;
    rp_transformer m;
    rp_error err;
    CHECK(rp_cluster_get("dgx-a100", &c, &err) == RP_OK);
    CHECK(rp_transformer_parse("llama2-7b,seq=2048", &m, &err) == RP_OK);
    CHECK(c.device.block_latency == 0 && c.device.activation_scale == 0);
    rp_transformer_run r;
    rp_transformer_run_default(&r);
    rpi_xf_part plain[RPI_XF_PARTS], slow[RPI_XF_PARTS];
    rpi_xf_parts(&m, &c, &r, plain);
    c.device.block_latency = 1e-3;
    rpi_xf_parts(&m, &c, &r, slow);
    CHECK(fabs(slow[RPI_XF_BLOCK].f - plain[RPI_XF_BLOCK].f - 1e-3) < 1e-12 &&
          fabs(slow[RPI_XF_BLOCK].bi - plain[RPI_XF_BLOCK].bi - 1e-3) < 1e-12 &&
          fabs(slow[RPI_XF_BLOCK].bw - plain[RPI_XF_BLOCK].bw - 1e-3) < 1e-12);
    CHECK(slow[RPI_XF_EMBED].f == plain[RPI_XF_EMBED].f && slow[RPI_XF_HEAD].f == plain[RPI_XF_HEAD].f);
    rp_transformer_layout lay = {.p = 2, .d = 4, .v = 1, .micro_batches = 8,
                                 .sharding = RP_SHARD_OPTIMIZER};
    rp_transformer_memory one, two;
    CHECK_OK(rp_transformer_rank_memory(&m, &r, &lay, 0, &one, &err), err);
    r.activation_scale = 2.5;
    CHECK_OK(rp_transformer_rank_memory(&m, &r, &lay, 0, &two, &err), err);
    CHECK(fabs(two.activations - 2.5 * one.activations) < 1e-9 * two.activations &&
          two.weights == one.weights);
    /* the planner's runs carry the device's */
    c.device.block_latency = 0, c.device.activation_scale = 2.5;
    rp_scale_options o;
    rp_scale_options_default(&o);
    o.devices = 8, o.global_batch = 16;
    rp_scale_plan plan;
    CHECK_OK(rp_scale_plan_compute(&m, &c, &o, &plan, &err), err);
    CHECK(plan.run.activation_scale == 2.5);
}

/* A device's tensor_efficiency: a rank of a tensor group of that size has
** every kernel's rate times it, its collectives' as they were; other sizes
** keep the device's own. */
static void tensor_efficiency(void) {
    rp_device d;
    rp_error err;
    const char *p = put("te.json", "{\"peak_flops\": 1e14, \"memory_bytes\": 1e9, "
                                   "\"memory_bandwidth\": 1e11, \"tensor_efficiency\": "
                                   "{\"2\": 0.5, \"8\": 0.9}}");
    CHECK_OK(rp_device_get(p, &d, &err), err);
    CHECK(rp_device_tensor_efficiency(&d, 1) == 1 && rp_device_tensor_efficiency(&d, 2) == 0.5 &&
          rp_device_tensor_efficiency(&d, 4) == 1 && rp_device_tensor_efficiency(&d, 8) == 0.9 &&
          rp_device_tensor_efficiency(&d, 3) == 1);
    p = put("te3.json", "{\"peak_flops\": 1e14, \"memory_bytes\": 1e9, \"memory_bandwidth\": "
                        "1e11, \"tensor_efficiency\": {\"3\": 0.5}}");
    CHECK(rp_device_get(p, &d, &err) == RP_ERR_INVALID &&
          strstr(err.msg, "te3.json: \"tensor_efficiency\": \"3\" is not a tensor group's size"));
    p = put("te4.json", "{\"peak_flops\": 1e14, \"memory_bytes\": 1e9, \"memory_bandwidth\": "
                        "1e11, \"tensor_efficiency\": {\"4\": 3}}");
    CHECK(rp_device_get(p, &d, &err) == RP_ERR_INVALID &&
          strstr(err.msg, "\"4\" must be a number from 0.01 to 2"));
    p = put("te5.json", "{\"peak_flops\": 1e14, \"memory_bytes\": 1e9, \"memory_bandwidth\": "
                        "1e11, \"tensor_efficiency\": 0.9}");
    CHECK(rp_device_get(p, &d, &err) == RP_ERR_INVALID && strstr(err.msg, "is an object"));

    rp_cluster c;
    rp_transformer m;
    CHECK(rp_cluster_get("dgx-a100", &c, &err) == RP_OK);
    CHECK(rp_transformer_parse("llama2-7b,seq=2048", &m, &err) == RP_OK);
    rp_transformer_run r;
    rp_transformer_run_default(&r);
    rpi_xf_part plain[3][RPI_XF_PARTS], slow[3][RPI_XF_PARTS];
    for (int i = 0; i < 3; i++) { /* tensor groups of 1, 2 and 4 */
        r.tensor_parallel = 1 << i;
        c.device.tensor_efficiency[1] = 0;
        rpi_xf_parts(&m, &c, &r, plain[i]);
        c.device.tensor_efficiency[1] = 0.5;
        rpi_xf_parts(&m, &c, &r, slow[i]);
    }
    CHECK(memcmp(plain[0], slow[0], sizeof plain[0]) == 0 &&
          memcmp(plain[2], slow[2], sizeof plain[2]) == 0);
    /* at 2: the weights' half (products alone) takes twice as long, and so
    ** does the forward but for its two all-reduces of the block's output (b
    ** s h bf16 values each, a ring of 2 over the node's link) */
    const rpi_xf_part *a = &plain[1][RPI_XF_BLOCK], *b = &slow[1][RPI_XF_BLOCK];
    double bytes = 2.0 * 1 * 2048 * 4096;
    double comm = 2 * (bytes / c.node_bandwidth + 2 * c.latency);
    CHECK(fabs(b->bw - 2 * a->bw) < 1e-12 * b->bw);
    CHECK(fabs((b->f - comm) - 2 * (a->f - comm)) < 1e-9 * b->f);
    CHECK(fabs(slow[1][RPI_XF_HEAD].bw - 2 * plain[1][RPI_XF_HEAD].bw) < 1e-12 &&
          fabs(slow[1][RPI_XF_EMBED].bi - 2 * plain[1][RPI_XF_EMBED].bi) < 1e-12);
    CHECK(b->saved == a->saved && b->params == a->params);
}

/* A pipeline whose balanced cut does not fit: blocks move from the rank
** that keeps the most to a later stage until it fits (1F1B keeps p - r
** micro-batches on rank r), where the planner had answered that no shape
** fits. The memory is set between what the balanced cut and that cut with
** one block of the first stage moved to the third need, each simulated. */
static void relieved_cut(void) {
    rp_cluster c;
    rp_transformer m;
    rp_error err;
    CHECK(rp_cluster_get("dgx-a100", &c, &err) == RP_OK);
    CHECK(rp_transformer_parse("layers=24,hidden=2048,heads=32,seq=2048,vocab=51200", &m,
                               &err) == RP_OK);
    rp_scale_options o;
    rp_scale_options_default(&o);
    o.devices = 4, o.global_batch = 64, o.tensor_parallel = 1, o.pipeline_parallel = 4;
    o.micro_batch = 1, o.virtual_stages = 1, o.context_parallel = 1;
    o.recompute = RP_RECOMPUTE_NONE, o.sharding = RP_SHARD_NONE, o.memory_bytes = 1e15;
    rp_scale_plan balanced, plan;
    CHECK_OK(rp_scale_plan_compute(&m, &c, &o, &balanced, &err), err);
    const int *cut = balanced.cfg.layers_per_stage.layers;
    CHECK(balanced.cfg.layers_per_stage.count == 4 && cut[0] > 2 && balanced.busiest_rank == 0);
    rp_config cfg = balanced.cfg;
    cfg.layers_per_stage.layers[0]--, cfg.layers_per_stage.layers[2]++;
    double sec;
    rp_transformer_memory mem;
    CHECK_OK(rp_scale_simulate(&m, &c, &balanced.run, RP_SHARD_NONE, &cfg, &sec, &mem, &err), err);
    CHECK(mem.total < balanced.memory.total);
    o.memory_bytes = (mem.total + balanced.memory.total) / 2;
    CHECK_OK(rp_scale_plan_compute(&m, &c, &o, &plan, &err), err);
    CHECK(plan.memory.total <= o.memory_bytes && plan.cfg.layers_per_stage.layers[0] < cut[0]);
    int sum = 0;
    for (int i = 0; i < plan.cfg.layers_per_stage.count; i++)
        sum += plan.cfg.layers_per_stage.layers[i];
    CHECK(sum == 26);
}

static void shapes(void) {
    rp_transformer m;
    rp_error err;
    CHECK(rp_transformer_parse("layers=2,hidden=4,heads=2,seq=8,vocab=16", &m, &err) == RP_OK);
    CHECK(m.kv_heads == 2 && m.head_dim == 2 && m.ffn == 16 && m.mlp == RP_MLP_GELU &&
          !m.untied && m.dropout && m.bias == RP_BIAS_ALL);
    /* equation 3 by hand: 96 B s l h^2 (1 + s / 6h + V / 16 l h) with B 1,
    ** s 8, l 2, h 4, V 16: 24576 (1 + 1/3 + 1/8) = 35840 */
    CHECK(fabs(rp_transformer_flops_eq3(&m, 1) - 35840) < 1e-6);
    CHECK(rp_transformer_parse("layers=2,hidden=5,heads=2,seq=8,vocab=16", &m, &err) ==
          RP_ERR_INVALID);
    CHECK(strstr(err.msg, "2 heads do not divide hidden 5") != NULL);
    CHECK(rp_transformer_parse("layers=2,hidden=4,heads=2,seq=8,vocab=16,depth=3", &m, &err) ==
          RP_ERR_INVALID);
    CHECK(strstr(err.msg, "'depth' is not one of") != NULL);
    CHECK(rp_transformer_parse("layers=2,hidden=4,seq=8,vocab=16", &m, &err) == RP_ERR_INVALID);
    /* a key given twice, a flag of 2, a number too large are each said */
    CHECK(rp_transformer_parse("layers=2,hidden=4,heads=2,seq=8,vocab=16,layers=3", &m, &err) ==
          RP_ERR_INVALID && strstr(err.msg, "layers is given twice"));
    CHECK(rp_transformer_parse("layers=2,hidden=4,heads=2,seq=8,vocab=16,flash=2", &m, &err) ==
          RP_ERR_INVALID && strstr(err.msg, "flash is too large, from 0 to 1"));
    CHECK(rp_transformer_parse("layers=2,hidden=4294967296,heads=2,seq=8,vocab=16", &m, &err) ==
          RP_ERR_INVALID && strstr(err.msg, "hidden is too large, from 1 to 1048576"));
    CHECK(rp_transformer_parse("layers=2,hidden=4x,heads=2,seq=8,vocab=16", &m, &err) ==
          RP_ERR_INVALID && strstr(err.msg, "hidden needs a whole number, not '4x'"));
    /* SwiGLU's default width is Megatron-LM's: 8h/3 down to a multiple of 64 */
    CHECK(rp_transformer_parse("layers=2,hidden=4096,heads=32,seq=8,vocab=16,mlp=swiglu", &m,
                               &err) == RP_OK && m.ffn == 10880);
    /* a preset, and its keys given again */
    CHECK(rp_transformer_parse("llama3-70b", &m, &err) == RP_OK);
    CHECK(m.layers == 80 && m.hidden == 8192 && m.heads == 64 && m.kv_heads == 8 &&
          m.ffn == 28672 && m.vocab == 128256 && m.mlp == RP_MLP_SWIGLU && m.untied &&
          m.norm == RP_NORM_RMS && m.position == RP_POSITION_ROPE && !m.dropout);
    CHECK(rp_transformer_parse("llama3-70b,seq=4096,layers=40", &m, &err) == RP_OK);
    CHECK(m.seq == 4096 && m.layers == 40 && m.ffn == 28672 && m.kv_heads == 8);
    CHECK(rp_transformer_parse("llama9-1t,seq=4096", &m, &err) == RP_ERR_INVALID &&
          strstr(err.msg, "nor a preset (llama3-8b"));
    /* the written form reads back the same */
    char text[512];
    rp_transformer back;
    CHECK(rp_transformer_parse("llama3-405b", &m, &err) == RP_OK);
    rp_transformer_format(&m, text, sizeof text);
    CHECK(rp_transformer_parse(text, &back, &err) == RP_OK && memcmp(&m, &back, sizeof m) == 0);
}

/* The three FLOP counts by hand, for a small GQA SwiGLU shape: h 64, 4 heads
** of 16, 2 key/value heads, f 96, l 2, s 32, V 100 (padded to 128 for t 1,
** to 256 for t 2). Megatron-LM's: 6 tokens (l (h (q + 2k) + q h + 3 h f) +
** h V) + 6 q s^2 l a sequence (its causal half of 2 q s^2, three passes);
** 6N: 6 (parameters but the embedding) a token + 12 l a d s. */
static void flop_counts(void) {
    rp_transformer m;
    rp_error err;
    CHECK(rp_transformer_parse("layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,mlp=swiglu,seq=32,"
                               "vocab=100,norm=rmsnorm,position=rope,bias=none,tied=0", &m,
                               &err) == RP_OK);
    double h = 64, q = 64, k = 32, f = 96, l = 2, s = 32;
    double per_token = 6 * (l * (h * (q + 2 * k) + q * h + 3 * h * f) + h * 128);
    double want = 3 * (s * per_token + 6 * q * s * s * l);
    CHECK(fabs(rp_transformer_flops_megatron(&m, 1, 3) - want) < 1e-9 * want);
    per_token = 6 * (l * (h * (q + 2 * k) + q * h + 3 * h * f) + h * 256);
    want = 3 * (s * per_token + 6 * q * s * s * l);
    CHECK(fabs(rp_transformer_flops_megatron(&m, 2, 3) - want) < 1e-9 * want);
    /* parameters: the blocks' products and norms, the final norm, the head */
    double n = l * (h * (q + 2 * k) + q * h + 3 * h * f + 2 * h) + h + 100 * h;
    CHECK(fabs(rp_transformer_parameters(&m) - (n + 100 * h)) < 1e-9);
    want = 2 * s * (6 * n + 12 * l * 4 * 16 * s);
    CHECK(fabs(rp_transformer_flops_6n(&m, 2) - want) < 1e-9 * want);
}

/* A mixture of experts by hand: h 64, 4 heads of 16, f 96 dense, 8 experts
** of 32, 2 a token, a shared expert of 48, every other block from the
** second (dense_first 1, moe_every 2: blocks 2 of 0..3; block 1 is odd, so
** only block 2). Its parameters: attention and norms in every block, the
** dense MLP in three, and in the mixture 8 experts, the shared expert and
** the router; a token passes 2 experts. Megatron-LM's FLOPs: the MLPs' 3 h f
** a dense block, 3 h (2 x 32 + 48) the mixture. */
static void experts(void) {
    rp_transformer m, back;
    rp_error err;
    const char *spec = "layers=4,hidden=64,heads=4,ffn=96,mlp=swiglu,seq=32,vocab=128,"
                       "norm=rmsnorm,position=rope,bias=none,tied=0,experts=8,top_k=2,"
                       "moe_ffn=32,shared_ffn=48,moe_every=2,dense_first=1";
    CHECK(rp_transformer_parse(spec, &m, &err) == RP_OK);
    CHECK(rp_transformer_moe_blocks(&m) == 1 && rp_transformer_moe_block(&m, 2) &&
          !rp_transformer_moe_block(&m, 0) && !rp_transformer_moe_block(&m, 1) &&
          !rp_transformer_moe_block(&m, 3));
    double h = 64, att = 4 * h * h + 2 * h, mlp = 3 * h * 96;
    double moe = 8 * 3 * h * 32 + 3 * h * 48 + h * 8, active = 2 * 3 * h * 32 + 3 * h * 48 + h * 8;
    double rest = 2 * 128 * h + h;
    CHECK(fabs(rp_transformer_parameters(&m) - (4 * att + 3 * mlp + moe + rest)) < 1e-9);
    CHECK(fabs(rp_transformer_active_parameters(&m) - (4 * att + 3 * mlp + active + rest)) <
          1e-9);
    double s = 32, tokens = 2 * s;
    double want = tokens * (6 * h * 3 * (3 * 96 + 2 * 32 + 48) + 4 * 6 * 4 * h * h + 6 * h * 128) +
                  2 * s * s * 6 * h * 4;
    CHECK(fabs(rp_transformer_flops_megatron(&m, 1, 2) - want) < 1e-9 * want);
    char text[512];
    rp_transformer_format(&m, text, sizeof text);
    CHECK(rp_transformer_parse(text, &back, &err) == RP_OK && memcmp(&m, &back, sizeof m) == 0);
    /* the defaults (top 2, the dense width), and the rules */
    CHECK(rp_transformer_parse("layers=2,hidden=64,heads=4,seq=32,vocab=128,experts=4", &m,
                               &err) == RP_OK && m.top_k == 2 && m.moe_ffn == 256 &&
          m.moe_every == 1 && rp_transformer_moe_blocks(&m) == 2);
    CHECK(rp_transformer_parse("layers=2,hidden=64,heads=4,seq=32,vocab=128,top_k=2", &m, &err) ==
              RP_ERR_INVALID && strstr(err.msg, "give experts too"));
    CHECK(rp_transformer_parse("layers=2,hidden=64,heads=4,seq=32,vocab=128,experts=4,top_k=5",
                               &m, &err) == RP_ERR_INVALID &&
          strstr(err.msg, "top_k 5 is more than the 4 experts"));
    CHECK(rp_transformer_parse("layers=2,hidden=64,heads=4,seq=32,vocab=128,experts=4,"
                               "dense_first=2", &m, &err) == RP_ERR_INVALID &&
          strstr(err.msg, "dense_first 2 leaves none"));
    /* expert groups must divide the experts, a dense model has none, and
    ** tensor groups run sequence parallel */
    rp_cluster c;
    CHECK(rp_cluster_get("dgx-h100", &c, &err) == RP_OK);
    CHECK(rp_transformer_parse(spec, &m, &err) == RP_OK);
    rp_transformer_run r;
    rp_transformer_run_default(&r);
    r.expert_parallel = 3;
    CHECK(rp_transformer_run_check(&m, &c, &r, &err) == RP_ERR_INVALID &&
          strstr(err.msg, "expert groups of 3 must divide the 8 experts"));
    r.expert_parallel = 4, r.tensor_parallel = 2;
    CHECK(rp_transformer_run_check(&m, &c, &r, &err) == RP_ERR_INVALID &&
          strstr(err.msg, "runs sequence parallel"));
    r.sequence_parallel = true;
    CHECK(rp_transformer_run_check(&m, &c, &r, &err) == RP_OK);
    /* ep 4 over a stage of t 2 x d 1 ranks: refused; of t 2 x d 2, the rank
    ** holds half the products (the vocabulary padded to 256 for t 2), the
    ** norms and the router whole, and a quarter of the experts */
    rp_transformer_layout lay = {.p = 1, .d = 1, .v = 1, .micro_batches = 1};
    rp_transformer_memory mem;
    CHECK(rp_transformer_rank_memory(&m, &r, &lay, 0, &mem, &err) == RP_ERR_INVALID &&
          strstr(err.msg, "do not divide a stage's 2 ranks"));
    lay.d = 2;
    CHECK(rp_transformer_rank_memory(&m, &r, &lay, 0, &mem, &err) == RP_OK);
    double shard = (4 * (4 * h * h) + 3 * 3 * h * 96 + 3 * h * 48 + 2 * 256 * h) / 2 +
                   4 * 2 * h + h * 8 + h + 8.0 / 4 * 3 * h * 32;
    CHECK(fabs(mem.parameters - shard) < 1e-6);
    /* a capacity factor scales what the experts take (padded or dropped to
    ** it), not the model's FLOPs; a dense model has none */
    rpi_xf_part plain[RPI_XF_PARTS], padded[RPI_XF_PARTS], dropped[RPI_XF_PARTS];
    r.tensor_parallel = 1, r.sequence_parallel = false, r.expert_parallel = 2;
    rpi_xf_parts(&m, &c, &r, plain);
    r.capacity = 1.5;
    CHECK(rp_transformer_run_check(&m, &c, &r, &err) == RP_OK);
    rpi_xf_parts(&m, &c, &r, padded);
    r.capacity = 0.5;
    rpi_xf_parts(&m, &c, &r, dropped);
    CHECK(padded[RPI_XF_MOE].bw > plain[RPI_XF_MOE].bw && padded[RPI_XF_MOE].f > plain[RPI_XF_MOE].f &&
          padded[RPI_XF_MOE].saved > plain[RPI_XF_MOE].saved);
    CHECK(dropped[RPI_XF_MOE].bw < plain[RPI_XF_MOE].bw &&
          dropped[RPI_XF_MOE].saved < plain[RPI_XF_MOE].saved);
    CHECK(padded[RPI_XF_BLOCK].f == plain[RPI_XF_BLOCK].f &&
          padded[RPI_XF_MOE].params == plain[RPI_XF_MOE].params);
    rp_transformer dense;
    CHECK(rp_transformer_parse("llama3-8b", &dense, &err) == RP_OK);
    rp_transformer_run_default(&r);
    r.expert_parallel = 2;
    CHECK(rp_transformer_run_check(&dense, &c, &r, &err) == RP_ERR_INVALID &&
          strstr(err.msg, "need a mixture of experts"));
    r.expert_parallel = 1, r.capacity = 1.25;
    CHECK(rp_transformer_run_check(&dense, &c, &r, &err) == RP_ERR_INVALID &&
          strstr(err.msg, "a capacity factor is a mixture's"));
}

/* The profile's parameters against the paper's count of a GPT's
** (Narayanan et al., appendix: 12 l h^2 (1 + 13 / 12h + (V + s) / 12 l h)),
** the head's tied copy aside; and a tensor group's ranks hold a t-th of
** the products. */
static void profile_parameters(void) {
    rp_transformer m;
    rp_cluster c;
    rp_error err;
    rp_profile *p;
    char *text;
    CHECK(rp_transformer_parse("layers=24,hidden=2304,heads=24,seq=2048,vocab=51200", &m, &err) ==
          RP_OK);
    CHECK(rp_cluster_get("dgx-a100", &c, &err) == RP_OK);
    double l = 24, h = 2304, s = 2048, V = 51200;
    double want = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
    double got[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        rp_transformer_run run;
        rp_transformer_run_default(&run);
        run.micro_batch = 4, run.tensor_parallel = k ? 8 : 1;
        CHECK(rp_transformer_profile(&m, &c, &run, &text, &err) == RP_OK);
        CHECK(rp_profile_parse(&p, text, strlen(text), "t", &err) == RP_OK);
        free(text);
        for (int i = 1; i < p->num_nodes - 1; i++) /* (the head: the tied copy) */
            got[k] += p->nodes[i].parameter_bytes / 4;
        CHECK(strstr(p->nodes[p->num_nodes - 1].desc, "head: ") == p->nodes[p->num_nodes - 1].desc);
        rp_profile_free(p);
    }
    CHECK(fabs(got[0] - want) < 1e-9 * want);
    CHECK(got[1] < want / 7 && got[1] > want / 8); /* the products split, the rest whole */
}

/* What a block keeps, from Korthikanti et al.'s terms written out by hand
** (section 4.1 of the paper, each product's input and each activation's,
** in 16-bit), for two blocks the paper does not count: LLaMA 3 8B's (GQA,
** SwiGLU, no dropout, a fused attention kernel) with sequence parallelism
** over t 4, in bf16 and with fp8 products (whose saved inputs are fp8
** copies, a byte an element); and GPT-2's with its scores, without
** sequence parallelism. */
static void block_bytes(void) {
    rp_transformer m;
    rp_cluster c;
    rp_error err;
    rp_profile *p;
    char *text;
    CHECK(rp_cluster_get("dgx-h100", &c, &err) == RP_OK);
    CHECK(rp_transformer_parse("llama3-8b,seq=4096", &m, &err) == RP_OK);
    double b = 2, s = 4096, h = 4096, q = 4096, k = 1024, f = 14336, a = 32, t = 4;
    for (int fp8 = 0; fp8 < 2; fp8++) {
        rp_transformer_run run;
        rp_transformer_run_default(&run);
        run.micro_batch = 2, run.tensor_parallel = 4, run.sequence_parallel = true;
        run.precision = fp8 ? RP_PRECISION_FP8 : RP_PRECISION_BF16;
        CHECK_OK(rp_transformer_profile(&m, &c, &run, &text, &err), err);
        CHECK_OK(rp_profile_parse(&p, text, strlen(text), "llama", &err), err);
        free(text);
        double w = fp8 ? 1 : 2;
        /* split over t by sequence parallelism: the two norms' inputs (2 each)
        ** and the inputs of QKV and of the MLP's first product (w each);
        ** split over t by the heads and columns: Q, K and V (2 each),
        ** attention's output (2, and its fp8 copy for the projection), the
        ** MLP's gate and up outputs (2 each) and their product, the second
        ** product's input (w); the softmax's statistics (fp32 a head and token) */
        double want = b * s * h * (4 + 2 * w) / t +
                      b * s * (2 * (q + 2 * k) + (2 + (fp8 ? 1 : 0)) * q + 4 * f + w * f) / t +
                      4 * b * (a / t) * s;
        double got = 0;
        CHECK(sscanf(strstr(p->nodes[2].desc, "saved_bytes="), "saved_bytes=%lf", &got) == 1);
        CHECK(fabs(got - want) < 1e-9 * want);
        rp_profile_free(p);
    }
    /* GPT-2's block, 1.5B's shape, no sequence parallelism, t 2: Korthikanti's
    ** s b h (10 + 24 / t + 5 a s / (h t)) */
    CHECK(rp_transformer_parse("layers=48,hidden=1600,heads=25,seq=1024,vocab=50257", &m, &err) ==
          RP_OK);
    rp_transformer_run run;
    rp_transformer_run_default(&run);
    run.micro_batch = 4, run.tensor_parallel = 1;
    CHECK_OK(rp_transformer_profile(&m, &c, &run, &text, &err), err);
    CHECK_OK(rp_profile_parse(&p, text, strlen(text), "gpt", &err), err);
    free(text);
    b = 4, s = 1024, h = 1600, a = 25, t = 1;
    double want = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), got = 0;
    CHECK(sscanf(strstr(p->nodes[2].desc, "saved_bytes="), "saved_bytes=%lf", &got) == 1);
    CHECK(fabs(got - want) < 1e-9 * want);
    rp_profile_free(p);
}

/* fp32 throughout (a CPU's, PyTorch's default): products at the device's
** peak_fp32, every value kept and moved in 4 bytes, 16 bytes a parameter of
** weights, gradients and Adam's moments; refused on a device without the
** rate, saying how to give it. */
static void fp32_runs(void) {
    rp_cluster c;
    rp_error err;
    rp_transformer m;
    char *text;
    rp_profile *p;
    /* products and attention at half the rate in fp32, memory far too fast to count */
    const char *f = put("half.json", "{\"name\": \"half\", \"device\": {\"peak_flops\": 1e14, "
                                       "\"peak_fp32\": 5e13, \"memory_bytes\": 1e11, "
                                       "\"memory_bandwidth\": 1e15, \"gemm_efficiency\": 0.5, "
                                       "\"attention_efficiency\": 0.5}, \"per_node\": 8, "
                                       "\"node_bandwidth\": 1e11, \"network_bandwidth\": 1e10}");
    CHECK_OK(rp_cluster_get(f, &c, &err), err);
    CHECK(c.device.peak_fp32 == 5e13);
    CHECK(rp_precision_peak(&c.device, RP_PRECISION_FP32) == 5e13);
    CHECK(strcmp(rp_precision_name(RP_PRECISION_FP32), "fp32") == 0);
    CHECK(rp_transformer_parse("llama3-8b,seq=4096", &m, &err) == RP_OK);
    double fwd[2], saved[2];
    for (int fp32 = 0; fp32 < 2; fp32++) {
        rp_transformer_run run;
        rp_transformer_run_default(&run);
        run.micro_batch = 2, run.precision = fp32 ? RP_PRECISION_FP32 : RP_PRECISION_BF16;
        CHECK_OK(rp_transformer_profile(&m, &c, &run, &text, &err), err);
        CHECK_OK(rp_profile_parse(&p, text, strlen(text), "llama", &err), err);
        free(text);
        fwd[fp32] = p->nodes[2].forward_ms;
        CHECK(sscanf(strstr(p->nodes[2].desc, "saved_bytes="), "saved_bytes=%lf",
                     &saved[fp32]) == 1);
        /* the description says the precision, which the simulator reads back */
        CHECK(strstr(p->nodes[0].desc, fp32 ? "precision=fp32" : "precision=bf16") != NULL);
        rp_profile_free(p);
    }
    CHECK(fabs(fwd[1] / fwd[0] - 2) < 0.01);
    /* the block's kept values (block_bytes' terms, t 1, no sequence parallelism) in 4
    ** bytes where bf16 keeps 2; the softmax's statistics are fp32 either way */
    double b = 2, s = 4096, h = 4096, q = 4096, k = 1024, ff = 14336, a = 32;
    double stats = 4 * b * a * s;
    double bf16 = b * s * h * (4 + 2 * 2) + b * s * (2 * (q + 2 * k) + 2 * q + 4 * ff + 2 * ff);
    CHECK(fabs(saved[0] - (bf16 + stats)) < 1e-9 * saved[0]);
    CHECK(fabs(saved[1] - (2 * bf16 + stats)) < 1e-9 * saved[1]);
    /* 16 bytes a parameter without sharding, 8 + 8 / n with the optimizer's state
    ** sharded over n; bf16's 18 and 6 + 12 / n */
    rp_transformer_run run;
    rp_transformer_run_default(&run);
    rp_transformer_layout lay = {.p = 1, .d = 4, .micro_batches = 1};
    rp_transformer_memory mem;
    for (int sh = 0; sh < 2; sh++) {
        lay.sharding = sh ? RP_SHARD_OPTIMIZER : RP_SHARD_NONE;
        run.precision = RP_PRECISION_FP32;
        CHECK_OK(rp_transformer_rank_memory(&m, &run, &lay, 0, &mem, &err), err);
        CHECK(fabs(mem.weights / mem.parameters - (sh ? 8 + 8 / 4.0 : 16)) < 1e-9);
        run.precision = RP_PRECISION_BF16;
        CHECK_OK(rp_transformer_rank_memory(&m, &run, &lay, 0, &mem, &err), err);
        CHECK(fabs(mem.weights / mem.parameters - (sh ? 6 + 12 / 4.0 : 18)) < 1e-9);
    }
    /* a device without the rate */
    CHECK(rp_cluster_get("dgx-b200", &c, &err) == RP_OK);
    run.precision = RP_PRECISION_FP32;
    CHECK(rp_transformer_run_check(&m, &c, &run, &err) == RP_ERR_INVALID);
    CHECK(strstr(err.msg, "no fp32 rate (no peak_fp32)") && strstr(err.msg, "python -m repipe.calibrate"));
}

/* Megatron-LM's Table 1 row of 1.7B on 32 GPUs (t 1, p 1, 512 sequences):
** published 137 TFLOP/s a GPU by equation 3; the row of 18.4B (t 8, 256
** GPUs, 1024): 135. Within 10 % with one device setting for all rows
** (docs/simulate.md has all, tests/scale_test.py holds them), run as
** Megatron-LM ran in 2021: full recomputation, no sequence parallelism,
** no sharded state, nothing overlapped, even stages. */
static void table1(void) {
    rp_transformer m;
    rp_cluster c;
    rp_error err;
    rp_scale_options o;
    rp_scale_plan r;
    CHECK(rp_cluster_get("dgx-a100", &c, &err) == RP_OK);
    static const struct {
        const char *shape;
        int t, p, n, batch;
        double published;
    } rows[] = {
        {"layers=24,hidden=2304,heads=24,seq=2048,vocab=51200", 1, 1, 32, 512, 137},
        {"layers=40,hidden=6144,heads=48,seq=2048,vocab=51200", 8, 1, 256, 1024, 135},
    };
    for (int i = 0; i < 2; i++) {
        CHECK(rp_transformer_parse(rows[i].shape, &m, &err) == RP_OK);
        rp_scale_options_default(&o);
        o.devices = rows[i].n, o.global_batch = rows[i].batch;
        o.tensor_parallel = rows[i].t, o.pipeline_parallel = rows[i].p;
        o.recompute = RP_RECOMPUTE_FULL, o.sequence_parallel = -1, o.sharding = RP_SHARD_NONE;
        o.no_overlap = true, o.even_stages = true;
        CHECK_OK(rp_scale_plan_compute(&m, &c, &o, &r, &err), err);
        CHECK(fabs(r.tflops_eq3 - rows[i].published) < 0.10 * rows[i].published);
        CHECK(r.memory.total <= c.device.memory_bytes && r.t == rows[i].t && r.p == rows[i].p);
        double published = r.seconds;
        /* free: no worse than the published shape, and within memory */
        rp_scale_options_default(&o);
        o.devices = rows[i].n, o.global_batch = rows[i].batch;
        CHECK_OK(rp_scale_plan_compute(&m, &c, &o, &r, &err), err);
        CHECK(r.seconds <= published && r.memory.total <= c.device.memory_bytes);
        /* the simulation of the chosen configuration agrees with the plan */
        double sec;
        rp_transformer_memory mem;
        CHECK_OK(rp_scale_simulate(&m, &c, &r.run, r.sharding, &r.cfg, &sec, &mem, &err), err);
        CHECK(fabs(sec - r.seconds) < 1e-9 * sec && mem.total == r.memory.total);
    }
    /* too little memory: refused, saying how much there was */
    c.device.memory_bytes = 1e9;
    CHECK(rp_transformer_parse(rows[1].shape, &m, &err) == RP_OK);
    rp_scale_options_default(&o);
    o.devices = 8, o.global_batch = 8;
    CHECK(rp_scale_plan_compute(&m, &c, &o, &r, &err) == RP_ERR_INFEASIBLE);
    CHECK(strstr(err.msg, "fits 1000000000 bytes") != NULL);
    /* sizes that cannot be are said as such, not as memory */
    c.device.memory_bytes = 80e9;
    rp_scale_options_default(&o);
    o.devices = 8, o.global_batch = 8, o.tensor_parallel = 3;
    CHECK(rp_scale_plan_compute(&m, &c, &o, &r, &err) == RP_ERR_INFEASIBLE);
    CHECK(strstr(err.msg, "--tp 3 must divide") != NULL);
    rp_scale_options_default(&o);
    o.devices = 8, o.global_batch = 8, o.pipeline_parallel = 60;
    CHECK(rp_scale_plan_compute(&m, &c, &o, &r, &err) == RP_ERR_INFEASIBLE);
    CHECK(strstr(err.msg, "--pp 60: the model has 40 layers") != NULL);
    rp_scale_options_default(&o);
    o.devices = 8, o.global_batch = 4, o.micro_batch = 8;
    CHECK(rp_scale_plan_compute(&m, &c, &o, &r, &err) == RP_ERR_INFEASIBLE);
    CHECK(strstr(err.msg, "micro-batches of 8 do not divide the global batch of 4") != NULL);
}

/* Recomputing the first n blocks of each chunk (Megatron-LM's block
** method): a middle rank of blocks alone holds, by the two ends' counts,
** B blocks' whole s each without recomputation and B inputs c plus one
** whole while recomputing all of them; with n recomputed, n inputs, B - n
** wholes and the one being recomputed. The planner recomputes the fewest
** that fit, the simulation of its choice agrees, and Megatron-LM's
** settings say it. */
static void block_recompute(void) {
    rp_transformer m;
    rp_cluster c;
    rp_error err;
    CHECK(rp_cluster_get("dgx-h100", &c, &err) == RP_OK);
    CHECK(rp_transformer_parse("llama3-8b", &m, &err) == RP_OK);
    rp_transformer_run run;
    rp_transformer_run_default(&run);
    int counts[3] = {9, 16, 9}; /* the embedding and 8 blocks, 16 blocks, 8 and the head */
    rp_transformer_layout lay = {.p = 3, .d = 1, .v = 1, .micro_batches = 8,
                                 .layers_per_stage = counts};
    rp_transformer_memory none, full, part;
    CHECK_OK(rp_transformer_rank_memory(&m, &run, &lay, 1, &none, &err), err);
    run.recompute = RP_RECOMPUTE_FULL;
    CHECK_OK(rp_transformer_rank_memory(&m, &run, &lay, 1, &full, &err), err);
    double flight = 2, B = 16, s = none.activations / (flight * B);
    double ck = (full.activations - s) / (flight * B);
    run.recompute = RP_RECOMPUTE_BLOCKS;
    for (int n = 1; n <= 20; n += 6) {
        run.recompute_blocks = n;
        CHECK_OK(rp_transformer_rank_memory(&m, &run, &lay, 1, &part, &err), err);
        double k = n < B ? n : B;
        CHECK(fabs(part.activations - (flight * (k * ck + (B - k) * s) + s)) <
              1e-9 * part.activations);
        CHECK(part.weights == none.weights);
    }
    run.recompute_blocks = 0;
    CHECK(rp_transformer_run_check(&m, &c, &run, &err) == RP_ERR_INVALID &&
          strstr(err.msg, "needs 1 or more"));
    /* 40 GB: no recomputation does not fit one stage of 8 replicas, every
    ** block does; the planner's choice is the fewest first blocks that fit */
    rp_scale_options o;
    rp_scale_options_default(&o);
    o.devices = 8, o.global_batch = 64, o.tensor_parallel = 1, o.context_parallel = 1;
    o.pipeline_parallel = 1, o.memory_bytes = 40e9;
    rp_scale_plan r, rf;
    CHECK_OK(rp_scale_plan_compute(&m, &c, &o, &r, &err), err);
    CHECK(r.run.recompute == RP_RECOMPUTE_BLOCKS && r.run.recompute_blocks > 0 &&
          r.run.recompute_blocks < m.layers && r.memory.total <= o.memory_bytes);
    rp_transformer_run fewer = r.run;
    fewer.recompute_blocks--;
    rp_transformer_layout one = {.p = 1, .d = r.d, .v = 1,
                                 .micro_batches = r.cfg.gradient_accumulation_steps,
                                 .sharding = r.sharding};
    CHECK_OK(rp_transformer_rank_memory(&m, &fewer, &one, 0, &part, &err), err);
    CHECK(part.total > o.memory_bytes);
    double sec;
    rp_transformer_memory mem;
    CHECK_OK(rp_scale_simulate(&m, &c, &r.run, r.sharding, &r.cfg, &sec, &mem, &err), err);
    CHECK(fabs(sec - r.seconds) < 1e-9 * sec && mem.total == r.memory.total);
    /* faster than every block recomputed, slower than none with room for it */
    o.recompute = RP_RECOMPUTE_FULL;
    CHECK_OK(rp_scale_plan_compute(&m, &c, &o, &rf, &err), err);
    CHECK(r.seconds < rf.seconds);
    o.recompute = -1, o.memory_bytes = 80e9;
    CHECK_OK(rp_scale_plan_compute(&m, &c, &o, &rf, &err), err);
    CHECK(rf.run.recompute == RP_RECOMPUTE_NONE && rf.seconds < r.seconds);
    char *text, why[512];
    CHECK_OK(rp_scale_settings(RP_TRAINER_MEGATRON, &m, &r, 64, &text, why, sizeof why, &err),
             err);
    char want[128];
    snprintf(want, sizeof want, "--recompute-granularity full\n--recompute-method block\n"
             "--recompute-num-layers %d\n", r.run.recompute_blocks);
    CHECK(strstr(text, want) != NULL);
    free(text);
}

int main(void) {
    if (!mkdtemp(dir))
        return 1;
    presets();
    user_files();
    shapes();
    flop_counts();
    experts();
    profile_parameters();
    block_bytes();
    fp32_runs();
    table1();
    block_recompute();
    calibration();
    tensor_efficiency();
    relieved_cut();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {
    }
    return test_finish("test_device");
}
