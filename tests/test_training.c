/*
** One worker, whole updates: gradient accumulation equals one big batch,
** runs are bit-identical, device iterations equal separate calls, and the
** output modes return what separate computations give.
*/
#include <stdlib.h>
#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "repipe/data.h"
#include "repipe/session.h"
#include "support.h"
#include "test.h"

static const char *MLP = "input 1 28 28\nflatten\nlinear 512\nrelu\nlinear 512\nrelu\n"
                         "linear 10\nsoftmax_cross_entropy\n";
static const char *DROP = "input 1 28 28\nflatten\nlinear 64\ngelu\ndropout 0.25\nlinear 32\n"
                          "layernorm\nrelu\nlinear 10\nsoftmax_cross_entropy\n";

static rp_dataset *data;


static rp_config config(int B, int GA, int D, const char *opt) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"seed\": 11, \"micro_batch_size\": %d, \"gradient_accumulation_steps\": %d, "
             "\"device_iterations\": %d, \"output_mode\": \"all\", \"optimizer\": %s}",
             B, GA, D, opt);
    return test_config(json);
}

/* Runs `calls` host calls over the first samples of the data; returns the
** flat parameters (caller frees) and copies the losses of the last call. */
static float *train(const rp_model *m, const rp_config *c, int calls, float *losses) {
    rp_session *s;
    rp_error err;
    CHECK(rp_session_create(m, c, &s, &err) == RP_OK);
    long long per = rp_session_samples_per_call(s);
    size_t in = rp_shape_size(&data->sample);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    float *x = malloc(sizeof(float) * per * in);
    int32_t *y = malloc(sizeof(int32_t) * per);
    for (int k = 0; k < calls; k++) {
        for (long long i = 0; i < per; i++)
            ids[i] = (k * per + i) % data->n;
        rp_dataset_gather(data, ids, (int)per, x, y);
        rp_result r;
        CHECK(rp_session_run(s, x, y, ids, &r, &err) == RP_OK);
        if (losses)
            memcpy(losses, r.losses, sizeof(float) * r.count);
    }
    rp_weights *w;
    CHECK(rp_session_get_weights(s, RP_ONE_PER_GROUP, &w, &err) == RP_OK);
    float *p = malloc(sizeof(float) * m->num_params);
    CHECK(rp_weights_to_params(m, w, 0, p, &err) == RP_OK);
    rp_weights_free(w);
    rp_session_free(s);
    free(ids), free(x), free(y);
    return p;
}

static double max_rel_diff(const rp_model *m, const float *a, const float *b) {
    double worst = 0;
    for (int v = 0; v < m->num_vars; v++) {
        double d = rp_tensor_rel_diff(a + m->vars[v].offset, b + m->vars[v].offset,
                                      m->vars[v].count);
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* Adam divides by sqrt(v) + eps: a gradient whose true value is near zero
** is, in float, a sum of much larger terms, and its rounding (which differs
** between one 64-row product and four 16-row ones) moves the weight by up
** to lr * |rounding| / eps. With eps = 1e-8 that is up to 1.5e-4 of a
** tensor's scale here, so the Adam cases use eps = 1e-5, where the bound is
** below 1e-5 and the comparison tests the accumulation, not Adam's
** conditioning. SGD is compared with its defaults. */
static void test_accumulation(void) {
    static const char *opts[] = {
        "{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}",
        "{\"type\": \"adam\", \"lr\": 0.001, \"eps\": 1e-5}",
        "{\"type\": \"adamw\", \"lr\": 0.001, \"weight_decay\": 0.1, \"eps\": 1e-5}"};
    const char *specs[] = {MLP, DROP};
    for (int sp = 0; sp < 2; sp++) {
        rp_model *m = test_model(specs[sp]);
        for (int o = 0; o < 3; o++)
            for (int calls = 1; calls <= 3; calls += 2) {
                rp_config big = config(64, 1, 1, opts[o]), acc = config(16, 4, 1, opts[o]);
                float *a = train(m, &big, calls, NULL), *b = train(m, &acc, calls, NULL);
                double d = max_rel_diff(m, a, b);
                test_checks++;
                if (!(d <= 1e-5)) {
                    fprintf(stderr, "model %d, optimizer %d, %d updates: GA=4 x B=16 differs from "
                                    "B=64 by %g\n", sp, o, calls, d);
                    test_failures++;
                }
                /* and the update did something */
                float *init = train(m, &big, 0, NULL);
                CHECK(max_rel_diff(m, a, init) > 1e-4);
                free(a), free(b), free(init);
            }
        rp_model_free(m);
    }
}

static void test_determinism_and_iterations(void) {
    rp_model *m = test_model(DROP);
    const char *opt = "{\"type\": \"sgd\", \"lr\": 0.1, \"momentum\": 0.5}";
    rp_config c1 = config(8, 2, 1, opt), c3 = config(8, 2, 3, opt);
    float l1[8], l3[8];
    float *a = train(m, &c1, 3, l1), *b = train(m, &c1, 3, NULL), *d = train(m, &c3, 1, l3);
    CHECK(memcmp(a, b, sizeof(float) * m->num_params) == 0);     /* bit-identical */
    CHECK(memcmp(a, d, sizeof(float) * m->num_params) == 0);     /* D=3 == 3 x D=1 */
    CHECK(memcmp(l1, l3 + 4, sizeof(float) * 2) == 0);           /* same last losses */
    rp_config other = c1;
    other.seed = 12;
    float *e = train(m, &other, 3, NULL);
    CHECK(max_rel_diff(m, a, e) > 1e-3); /* another seed, other weights */
    free(a), free(b), free(d), free(e);
    rp_model_free(m);
}

static void test_output_modes(void) {
    rp_model *m = test_model(MLP);
    const char *opt = "{\"type\": \"sgd\", \"lr\": 0.05}";
    rp_config c = config(8, 3, 2, opt);
    float all[6];
    free(train(m, &c, 1, all));
    /* The first micro-batch's loss, computed apart: initial weights. */
    rp_net *net;
    rp_acts *acts;
    rp_error err;
    CHECK(rp_net_create(m, 0, m->num_layers, 8, &net, &err) == RP_OK);
    CHECK(rp_acts_create(net, 8, &acts, &err) == RP_OK);
    rp_model_init_params(m, 0, m->num_layers, 11, NULL, rp_net_params(net));
    int64_t ids[8];
    float x[8 * 784];
    int32_t y[8];
    for (int i = 0; i < 8; i++)
        ids[i] = i;
    rp_dataset_gather(data, ids, 8, x, y);
    rp_step_ctx ctx = {.training = true, .seed = 11, .sample_id = ids, .labels = y,
                       .loss_scale = 1};
    double sum;
    CHECK(rp_net_forward(net, acts, x, 8, &ctx, &sum) != NULL);
    CHECK(all[0] == (float)(sum / 8));
    rp_acts_free(acts);
    rp_net_free(net);
    /* final = the last of all; sum = the sum of all */
    rp_session *s;
    c.output_mode = RP_OUTPUT_FINAL;
    for (int mode = 0; mode < 2; mode++) {
        CHECK(rp_session_create(m, &c, &s, &err) == RP_OK);
        long long per = rp_session_samples_per_call(s);
        CHECK_INT(per, 48);
        int64_t id[48];
        float xx[48 * 784];
        int32_t yy[48];
        for (int i = 0; i < 48; i++)
            id[i] = i;
        rp_dataset_gather(data, id, 48, xx, yy);
        rp_result r;
        CHECK(rp_session_run(s, xx, yy, id, &r, &err) == RP_OK);
        CHECK_INT(r.count, 1);
        double total = 0;
        for (int i = 0; i < 6; i++)
            total += all[i];
        if (mode == 0)
            CHECK(r.losses[0] == all[5]);
        else
            CHECK_CLOSE(r.losses[0], total, 1e-6);
        rp_session_free(s);
        c.output_mode = RP_OUTPUT_SUM;
    }
    c.output_mode = RP_OUTPUT_ALL;
    CHECK(rp_session_create(m, &c, &s, &err) == RP_OK);
    rp_result r;
    int64_t id[48];
    float xx[48 * 784];
    int32_t yy[48];
    for (int i = 0; i < 48; i++)
        id[i] = i;
    rp_dataset_gather(data, id, 48, xx, yy);
    CHECK(rp_session_run(s, xx, yy, id, &r, &err) == RP_OK);
    CHECK_INT(r.ndim, 3);
    CHECK_INT(r.dims[0], 2);
    CHECK_INT(r.dims[1], 1);
    CHECK_INT(r.dims[2], 3);
    CHECK(memcmp(r.losses, all, sizeof all) == 0);
    /* a label out of range is an error that says so */
    yy[3] = 10;
    CHECK(rp_session_run(s, xx, yy, id, &r, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "label 10");
    rp_session_free(s);
    rp_model_free(m);
}

/* The calling thread is worker 0: it computes with denormals flushed, as
** the others, and has its own floating-point mode back after each call, so
** the caller's mode neither leaks nor changes a result. */
static void test_callers_fpu_mode(void) {
#if defined(__SSE__) || defined(__x86_64__)
    const unsigned FTZ_DAZ = 0x8000 | 0x0040;
    unsigned mode = _mm_getcsr();
    rp_model *m = test_model(DROP);
    rp_config c = config(8, 2, 1, "{\"type\": \"sgd\", \"lr\": 0.1}");
    _mm_setcsr(mode & ~FTZ_DAZ);
    float *plain = train(m, &c, 2, NULL); /* create, run, get weights, free */
    CHECK(_mm_getcsr() == (mode & ~FTZ_DAZ));
    rp_session *s;
    rp_error err;
    CHECK(rp_session_create(m, &c, &s, &err) == RP_OK);
    int32_t pred[8];
    double loss;
    CHECK(rp_session_predict(s, data->x, 8, pred, &err) == RP_OK);
    CHECK(rp_session_loss(s, data->x, data->labels, 8, &loss, &err) == RP_OK);
    CHECK(_mm_getcsr() == (mode & ~FTZ_DAZ));
    rp_session_free(s);
    _mm_setcsr(mode | FTZ_DAZ); /* a caller that flushes already */
    float *flushed = train(m, &c, 2, NULL);
    CHECK(_mm_getcsr() == (mode | FTZ_DAZ));
    CHECK(memcmp(plain, flushed, sizeof(float) * m->num_params) == 0);
    _mm_setcsr(mode);
    free(plain), free(flushed);
    rp_model_free(m);
#endif
}

int main(void) {
    rp_error err;
    rp_shape shape = {3, {1, 28, 28}};
    if (rp_dataset_synthetic(&data, 512, shape, 10, 3, &err) != RP_OK)
        return 1;
    test_accumulation();
    test_determinism_and_iterations();
    test_output_modes();
    test_callers_fpu_mode();
    rp_dataset_free(data);
    return test_finish("test_training");
}
