/*
** The LLaMA-family example (examples/llama-kjv.model: grouped-query
** attention with rotary embeddings, SwiGLU, RMSNorm, as graphs of layers)
** from its initial weights (seed 0): its first 10 AdamW losses on 10
** updates of 4 windows of the KJV text within 1e-4 of a PyTorch
** implementation written from the public architecture
** (bench/llama_vs_torch.py, which stored the windows and PyTorch's losses in
** tests/torch/llama_losses.txt; this test needs no torch).
**
**   test_llama MODEL LOSSES
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "../src/core/util.h"
#include "repipe/session.h"
#include "support.h"
#include "test.h"

enum { T = 64, B = 4, UPDATES = 10 };

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_llama MODEL LOSSES\n");
        return 2;
    }
    rp_model *m;
    rp_error err;
    if (rp_model_load(&m, argv[1], &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    char *text;
    size_t len;
    if (rp_read_file(argv[2], &text, &len, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    static float x[UPDATES * B * T];
    static double want[UPDATES];
    static int32_t y[UPDATES * B * T];
    int losses, windows = test_read_windows(text, T, UPDATES * B, x, y, want, UPDATES, &losses);
    free(text);
    CHECK_INT(windows, UPDATES * B);
    CHECK_INT(losses, UPDATES);
    rp_config c = test_config("{\"micro_batch_size\": 4, \"optimizer\": {\"type\": \"adamw\", "
                              "\"lr\": 0.003, \"beta1\": 0.9, \"beta2\": 0.999, \"eps\": 1e-8, "
                              "\"weight_decay\": 0}}");
    rp_session *s = test_session(m, &c, NULL);
    CHECK(s != NULL);
    double worst = 0;
    for (int u = 0; s && u < UPDATES; u++) {
        int64_t ids[B] = {4 * u, 4 * u + 1, 4 * u + 2, 4 * u + 3};
        rp_result r;
        CHECK_OK(rp_session_run(s, x + (size_t)u * B * T, y + (size_t)u * B * T, ids, &r, &err),
                 err);
        double d = fabs(r.losses[r.count - 1] - want[u]);
        worst = d > worst ? d : worst;
    }
    CHECKF(worst <= 1e-4, "LLaMA-family losses off PyTorch's by %g", worst);
    printf("10 AdamW losses within %.2g of PyTorch's\n", worst);
    rp_session_free(s);

    /* the same model in one line a block: its layers, parameters and losses
    ** are the written-out graph's, bit for bit */
    const char *spec = "input 64\nembedding 256 128 std=0.02\n"
                       "llama_block heads=8 kv_heads=2\nllama_block heads=8 kv_heads=2\n"
                       "b2 = llama_block heads=8 kv_heads=2 mlp=344\n"
                       "llama_block heads=8 kv_heads=2 rope_theta=10000 eps=1e-6 < b2\n"
                       "rmsnorm\nlinear 256 bias=false\nsoftmax_cross_entropy\n";
    rp_model *one;
    CHECK_OK(rp_model_parse(&one, spec, strlen(spec), "llama_block", &err), err);
    if (one) {
        CHECK_INT(one->num_layers, m->num_layers);
        CHECK(one->num_params == m->num_params);
        for (int l = 0; l < m->num_layers && l < one->num_layers; l++) {
            const rp_layer *a = &m->layers[l], *b = &one->layers[l];
            CHECKF(a->type == b->type && a->units == b->units && a->num_inputs == b->num_inputs &&
                       memcmp(a->inputs, b->inputs, sizeof(int) * a->num_inputs) == 0 &&
                       a->heads == b->heads && a->kv_heads == b->kv_heads &&
                       a->rope_theta == b->rope_theta && a->eps == b->eps,
                   "layer %d: %s against the graph's %s", l, rp_layer_name(b->type),
                   rp_layer_name(a->type));
        }
        rp_session *s1 = test_session(m, &c, NULL), *s2 = test_session(one, &c, NULL);
        for (int u = 0; s1 && s2 && u < 3; u++) {
            int64_t ids[B] = {4 * u, 4 * u + 1, 4 * u + 2, 4 * u + 3};
            rp_result r1, r2;
            CHECK_OK(rp_session_run(s1, x + (size_t)u * B * T, y + (size_t)u * B * T, ids, &r1,
                                    &err),
                     err);
            CHECK_OK(rp_session_run(s2, x + (size_t)u * B * T, y + (size_t)u * B * T, ids, &r2,
                                    &err),
                     err);
            CHECKF(r1.count == r2.count &&
                       memcmp(r1.losses, r2.losses, sizeof(float) * r1.count) == 0,
                   "update %d: llama_block's loss %.9g, the graph's %.9g", u, r2.losses[0],
                   r1.losses[0]);
        }
        rp_session_free(s1);
        rp_session_free(s2);
        rp_model_free(one);
    }
    static const struct {
        const char *spec, *says;
    } bad[] = {
        {"input 8\nembedding 16 16\nllama_block kv_heads=2\n", "llama_block needs heads=H"},
        {"input 8\nembedding 16 16\nllama_block heads=3\n", "C divisible by heads"},
        {"input 8\nembedding 16 16\nllama_block heads=4 kv_heads=3\n",
         "heads divisible by kv_heads"},
        {"input 8\nembedding 16 16\nllama_block heads=4 bias=true\n",
         "llama_block takes no option 'bias'"},
        {"input 8\nembedding 16 16\nllama_block 4\n", "takes options only"},
        {"input 8\nembedding 16 16\nllama_block heads=4 < nowhere\n",
         "'nowhere' is not the name of an earlier line"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        rp_model *no;
        CHECK(rp_model_parse(&no, bad[k].spec, strlen(bad[k].spec), "bad", &err) != RP_OK);
        CHECK_STR_HAS(err.msg, bad[k].says);
        CHECK_STR_HAS(err.msg, "bad:3");
    }
    rp_model_free(m);
    return test_finish("test_llama");
}
