/*
** Graphs on the engine: a residual model and a concat model, cut where two
** tensors are alive (a skip crossing a stage, one passing through a whole
** stage), equal one worker running the same micro-batches, on every axis:
** P 2 and 3, stage replication [2,1] and [1,2,1], R 1 and 2, GA 1 and 4,
** gpipe and 1f1b, recomputation on and off, replicated tensor sharding.
** A residual model with batchnorm too: its running statistics are those of
** one worker running the same micro-batches, bit for bit on every layout.
**
**   test_graph          local backend: the whole sweep
**   test_graph --mpi    under mpirun -np W: the sweep's cases of W workers
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "repipe/data.h"
#include "repipe/session.h"
#include "support.h"
#include "test.h"

/* layers: 0 c0, 1 r0, 2 c1, 3 r1, 4 c2, 5 add, ... 10 the loss. Boundary 3
** carries r0 and c1; boundary 5 r0 and c2, so with cuts at 3 and 5 r0
** passes through the middle stage untouched. */
static const char *RESIDUAL =
    "input 1 28 28\n"
    "c0 = conv2d 4 kernel=3 pad=1 stride=2\n"
    "r0 = relu\n"
    "c1 = conv2d 4 kernel=3 pad=1\n"
    "relu\n"
    "c2 = conv2d 4 kernel=3 pad=1\n"
    "add < c2 r0\n"
    "relu\n"
    "avgpool2d 2\n"
    "flatten\n"
    "linear 10\n"
    "softmax_cross_entropy\n";

/* layers: 0 c0, 1 r0, 2 c1, 3 r1, 4 cat1, 5 c2, 6 r2, 7 cat2, ... 12 the
** loss. Boundary 3 carries r0 and c1, 4 r0 and r1, 7 cat1 and r2. */
static const char *DENSE =
    "input 1 28 28\n"
    "c0 = conv2d 3 kernel=3 pad=1 stride=2\n"
    "r0 = relu\n"
    "conv2d 2 kernel=3 pad=1\n"
    "r1 = relu\n"
    "cat1 = concat < r0 r1\n"
    "conv2d 2 kernel=1\n"
    "r2 = relu\n"
    "concat < cat1 r2\n"
    "maxpool2d 2\n"
    "flatten\n"
    "dropout 0.2\n"
    "linear 10\n"
    "softmax_cross_entropy\n";

/* ResNet's block: conv, batchnorm, relu, conv, batchnorm, the sum. Layers:
** 0 c0, 1 bn0, 2 r0, 3 conv, 4 bn, 5 relu, 6 c2, 7 bn2, 8 add, ... 13 the
** loss; boundary 4 carries r0 and the middle conv, 7 r0 and c2. */
static const char *RESNET =
    "input 1 28 28\n"
    "conv2d 4 kernel=3 pad=1 stride=2 bias=false\n"
    "batchnorm2d\n"
    "r0 = relu\n"
    "conv2d 4 kernel=3 pad=1 bias=false\n"
    "batchnorm2d\n"
    "relu\n"
    "conv2d 4 kernel=3 pad=1 bias=false\n"
    "b2 = batchnorm2d\n"
    "add < b2 r0\n"
    "relu\n"
    "adaptive_avgpool2d 2\n"
    "flatten\n"
    "linear 10\n"
    "softmax_cross_entropy\n";

static rp_dataset *data;
static rp_comm *mpi;

typedef struct gcase {
    int P, R;
    int r[3];
    int GA;
    const char *schedule;
    bool recompute, sharding;
} gcase;

static const gcase CASES[] = {
    {2, 1, {1, 1}, 1, "1f1b", false, false},  {2, 1, {1, 1}, 4, "gpipe", true, false},
    {2, 2, {1, 1}, 4, "1f1b", false, true},   {2, 2, {1, 1}, 1, "gpipe", false, false},
    {2, 1, {2, 1}, 4, "1f1b", true, false},   {2, 1, {2, 1}, 1, "gpipe", false, false},
    {2, 2, {2, 1}, 4, "gpipe", false, false}, {3, 1, {1, 1, 1}, 4, "1f1b", false, false},
    {3, 1, {1, 1, 1}, 1, "gpipe", true, false}, {3, 1, {1, 2, 1}, 4, "1f1b", true, false},
    {3, 1, {1, 2, 1}, 4, "gpipe", false, false}, {3, 2, {1, 1, 1}, 4, "1f1b", false, true},
};

enum { RESIDUAL_M, DENSE_M, RESNET_M, MODELS };
static const char *spec_of(int k) { return k == RESIDUAL_M ? RESIDUAL : k == DENSE_M ? DENSE : RESNET; }
static const char *const NAMES[MODELS] = {"residual", "dense", "resnet"};

/* Cuts where two tensors cross: for P 2 and 3 of each model */
static const char *cuts(int model, int P) {
    if (P == 1)
        return "[-1]";
    if (model == DENSE_M)
        return P == 2 ? "[4, -1]" : "[3, 4, -1]";
    if (model == RESNET_M)
        return P == 2 ? "[4, -1]" : "[4, 3, -1]";
    return P == 2 ? "[3, -1]" : "[3, 2, -1]";
}

static rp_config config(const gcase *gc, int dense, bool single) {
    char reps[64];
    int P = single ? 1 : gc->P;
    snprintf(reps, sizeof reps, "[%d", single ? 1 : gc->r[0]);
    for (int s = 1; s < P; s++)
        snprintf(reps + strlen(reps), sizeof reps - strlen(reps), ", %d", gc->r[s]);
    char json[1024];
    snprintf(json, sizeof json,
             "{\"seed\": 3, \"micro_batch_size\": 4, \"gradient_accumulation_steps\": %d, "
             "\"replication_factor\": %d, \"layers_per_stage\": %s, \"stage_replication\": %s], "
             "\"schedule\": \"%s\", \"recompute_checkpoint_every_layer\": %s, "
             "\"replicated_tensor_sharding\": %s, \"output_mode\": \"all\", "
             "\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}}",
             single ? gc->GA * gc->R : gc->GA, single ? 1 : gc->R, cuts(dense, P), reps,
             gc->schedule, gc->recompute && !single ? "true" : "false",
             gc->sharding && !single ? "true" : "false");
    return test_config(json);
}

/* The running statistics tensors that are not bit for bit equal. */
static size_t stats_differ(const rp_weights *a, const rp_weights *b) {
    size_t bad = 0;
    for (int t = 0; t < a->num_tensors; t++) {
        if (!strstr(a->tensors[t].name, ".running_"))
            continue;
        const rp_tensor *tb = rp_weights_find(b, a->tensors[t].name);
        bad += memcmp(a->tensors[t].data, tb->data,
                      sizeof(float) * rp_shape_size(&a->tensors[t].shape)) != 0;
    }
    return bad;
}

/* Two host calls on the same samples for every layout; the first call's
** losses and weights come back. (After the first update the weights differ
** in their last bits, as sums in another order do, and so do the
** statistics of the second update's micro-batches: bit for bit is the
** first update's promise.) */
static rp_weights *train(const rp_model *m, const rp_config *c, bool use_mpi, float *losses,
                         rp_weights **first) {
    rp_error err;
    rp_session *s = test_session(m, c, use_mpi ? mpi : NULL);
    if (!s) {
        test_failures++;
        return NULL;
    }
    long long per = rp_session_samples_per_call(s);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    float *x = malloc(sizeof(float) * per * 784);
    int32_t *y = malloc(sizeof(int32_t) * per);
    for (int call = 0; call < 2; call++) {
        for (long long i = 0; i < per; i++)
            ids[i] = (i * 7 + call * 101) % data->n;
        rp_dataset_gather(data, ids, (int)per, x, y);
        rp_result r;
        CHECK(rp_session_run(s, x, y, ids, &r, &err) == RP_OK);
        if (call == 0 && losses)
            memcpy(losses, r.losses, sizeof(float) * r.count);
        if (call == 0)
            CHECK(rp_session_get_weights(s, RP_ONE_PER_GROUP, first, &err) == RP_OK);
    }
    rp_weights *w;
    CHECK(rp_session_get_weights(s, RP_ONE_PER_GROUP, &w, &err) == RP_OK);
    free(ids), free(x), free(y);
    rp_session_free(s);
    return w;
}

static void sweep(bool use_mpi, int only_workers) {
    int run = 0;
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        const gcase *gc = &CASES[k];
        if (only_workers && test_workers(gc->P, gc->r, gc->R) != only_workers)
            continue;
        for (int dense = 0; dense < MODELS; dense++) {
            rp_model *m = test_model(spec_of(dense));
            rp_config pipe = config(gc, dense, false), one = config(gc, dense, true);
            float lp[64], lo[64];
            rp_weights *a1 = NULL, *b1 = NULL;
            rp_weights *a = train(m, &pipe, use_mpi, lp, &a1);
            rp_weights *b = train(m, &one, false, lo, &b1);
            if (a && b) {
                double d = test_weights_diff(a, b);
                test_checks++;
                if (!(d <= 1e-5)) {
                    fprintf(stderr, "%s P=%d R=%d r=[%d,%d,%d] GA=%d %s%s%s: differs by %g\n",
                            NAMES[dense], gc->P, gc->R, gc->r[0], gc->r[1],
                            gc->r[2], gc->GA, gc->schedule, gc->recompute ? " recompute" : "",
                            gc->sharding ? " sharding" : "", d);
                    test_failures++;
                }
                CHECKF(stats_differ(a1, b1) == 0,
                       "%s P=%d R=%d r=[%d,%d,%d] GA=%d %s%s: running statistics differ",
                       NAMES[dense], gc->P, gc->R, gc->r[0], gc->r[1], gc->r[2], gc->GA,
                       gc->schedule, gc->sharding ? " sharding" : "");
                size_t bad = 0;
                for (int i = 0; i < gc->R * gc->GA; i++)
                    bad += fabs(lp[i] - lo[i]) > 1e-6 * (1 + fabs(lo[i]));
                CHECK(bad == 0);
            }
            rp_weights_free(a), rp_weights_free(b), rp_weights_free(a1), rp_weights_free(b1);
            rp_model_free(m);
            run++;
        }
    }
    CHECK(run > 0);
    printf("%d graph pipelines compared with one worker\n", run);
}

/* What is alive at each cut: the boundaries the sweep relies on. */
static void boundaries(void) {
    rp_model *r = test_model(RESIDUAL), *d = test_model(DENSE);
    int t[32];
    CHECK(!rp_model_is_chain(r) && !rp_model_is_chain(d));
    CHECK(rp_model_boundary(r, 0, t) == 1 && t[0] == -1);
    CHECK(rp_model_boundary(r, 3, t) == 2 && t[0] == 1 && t[1] == 2);
    CHECK(rp_model_boundary(r, 5, t) == 2 && t[0] == 1 && t[1] == 4);
    CHECK(rp_model_boundary(r, 6, t) == 1 && t[0] == 5);
    CHECK(rp_model_boundary_size(r, 3) == 2 * 4 * 14 * 14);
    CHECK(rp_model_boundary(d, 4, t) == 2 && t[0] == 1 && t[1] == 3);
    CHECK(rp_model_boundary(d, 7, t) == 2 && t[0] == 4 && t[1] == 6);
    CHECK(rp_model_boundary_size(d, 7) == (5 + 2) * 14 * 14);
    CHECK(rp_model_boundary(d, d->num_layers, t) == 1 && t[0] == d->num_layers - 1);
    /* what the memory table counts for a stage that receives two tensors: the
    ** packed rows and each tensor unpacked, and a gradient buffer per tensor */
    rp_net *n;
    rp_error err;
    CHECK_OK(rp_net_create(r, 3, r->num_layers, 4, &n, &err), err);
    size_t two = rp_model_boundary_size(r, 3) * 4 * sizeof(float), outs = 0;
    for (int l = 3; l < r->num_layers; l++)
        outs += rp_shape_size(&r->layers[l].out) * 4 * sizeof(float);
    CHECK(rp_acts_bytes(n, 4) >= 2 * two + outs);
    CHECK(rp_net_scratch_bytes(n) >= two + outs);
    rp_net_free(n);
    rp_model_free(r), rp_model_free(d);
}

/* The running statistics by their definition: one worker, 3 micro-batches
** of 4 through a batchnorm on the input, whose channel's statistics are the
** data's own; after the update, running = 0.9 running + 0.1 x_k in order,
** from 0 and 1, whatever weight decay the step applies. Evaluation
** normalises with them; a micro-batch of one value per channel is refused
** in training, and so are the asynchronous schedules. */
static void running_statistics(void) {
    rp_model *m = test_model("input 1 28 28\nbatchnorm2d\nflatten\nlinear 10\nsoftmax_cross_entropy\n");
    rp_config c = test_config("{\"micro_batch_size\": 4, \"gradient_accumulation_steps\": 3, "
                              "\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1, \"weight_decay\": 0.5}}");
    rp_session *s;
    rp_error err;
    CHECK_OK(rp_session_create(m, &c, &s, &err), err);
    int64_t ids[12];
    static float x[12 * 784];
    int32_t y[12];
    for (int i = 0; i < 12; i++)
        ids[i] = i * 5;
    rp_dataset_gather(data, ids, 12, x, y);
    rp_result r;
    CHECK_OK(rp_session_run(s, x, y, ids, &r, &err), err);
    double rm = 0, rv = 1;
    for (int k = 0; k < 3; k++) {
        double mean = 0, ss = 0, n = 4 * 784;
        for (int i = 0; i < 4 * 784; i++)
            mean += x[k * 4 * 784 + i] / n;
        for (int i = 0; i < 4 * 784; i++)
            ss += (x[k * 4 * 784 + i] - mean) * (x[k * 4 * 784 + i] - mean);
        rm = 0.9 * rm + 0.1 * mean;
        rv = 0.9 * rv + 0.1 * ss / (n - 1); /* unbiased, as PyTorch's */
    }
    rp_weights *w;
    CHECK_OK(rp_session_get_weights(s, RP_ONE_PER_GROUP, &w, &err), err);
    const rp_tensor *tm = rp_weights_find(w, "0.running_mean"), *tv = rp_weights_find(w, "0.running_var");
    CHECK(tm && tv);
    if (tm && tv) {
        CHECKF(fabs(tm->data[0] - rm) < 1e-6 && fabs(tv->data[0] - rv) < 1e-5,
               "running %.9g %.9g, by definition %.9g %.9g", tm->data[0], tv->data[0], rm, rv);
        /* mean 0, variance 1 - eps, weight 1 and bias 0: evaluation passes
        ** the input through */
        tm->data[0] = 0;
        tv->data[0] = 1 - 1e-5f;
        rp_weights_find(w, "0.weight")->data[0] = 1;
        rp_weights_find(w, "0.bias")->data[0] = 0;
    }
    CHECK_OK(rp_session_set_weights(s, w, RP_ONE_PER_GROUP, &err), err);
    rp_model *plain = test_model("input 1 28 28\nflatten\nlinear 10\nsoftmax_cross_entropy\n");
    rp_config c1 = test_config("{\"micro_batch_size\": 4}");
    rp_session *s1;
    CHECK_OK(rp_session_create(plain, &c1, &s1, &err), err);
    rp_weights *w1;
    CHECK_OK(rp_session_get_weights(s1, RP_ONE_PER_GROUP, &w1, &err), err);
    memcpy(w1->tensors[0].data, rp_weights_find(w, "2.weight")->data, sizeof(float) * 7840);
    memcpy(w1->tensors[1].data, rp_weights_find(w, "2.bias")->data, sizeof(float) * 10);
    CHECK_OK(rp_session_set_weights(s1, w1, RP_ONE_PER_GROUP, &err), err);
    int32_t p[12], p1[12];
    CHECK_OK(rp_session_predict(s, x, 12, p, &err), err);
    CHECK_OK(rp_session_predict(s1, x, 12, p1, &err), err);
    CHECK(memcmp(p, p1, sizeof p) == 0);
    rp_weights_free(w), rp_weights_free(w1);
    rp_session_free(s), rp_session_free(s1);
    rp_model_free(plain);
    rp_model *one = test_model("input 5\nbatchnorm1d\nlinear 2\nsoftmax_cross_entropy\n");
    rp_config c2 = test_config("{\"micro_batch_size\": 1}");
    CHECK_OK(rp_session_create(one, &c2, &s, &err), err);
    float x5[5] = {1, 2, 3, 4, 5};
    int32_t y5 = 1;
    int64_t id5 = 0;
    CHECK(rp_session_run(s, x5, &y5, &id5, &r, &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "no variance to normalise by");
    rp_session_free(s);
    rp_model_free(one);
    rp_config pd = test_config("{\"layers_per_stage\": [2, -1], \"schedule\": \"pipedream\"}");
    CHECK(rp_session_check(m, &pd, &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "does not go with batchnorm2d (line 2)");
    rp_model_free(m);
}

/* Recomputation by layer (recompute_layers) on each graph, two stages of
** 1f1b: the first update's weights, running statistics and losses are the
** same bit for bit as keeping every layer (each layer made again runs the
** same products on the same rows), and the activation sets hold less. The
** lists: every layer (each stage's last is kept), every other layer, and
** the two layers before the sum or concat that a skip crosses. */
static void by_layer(void) {
    static const char *lists[3][MODELS] = {
        {"[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]", "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]",
         "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]"},
        {"[1, 3, 5, 7, 9]", "[0, 2, 4, 6, 8, 10]", "[1, 3, 5, 7, 9, 11]"},
        {"[3, 4]", "[5, 6]", "[6, 7]"}};
    for (int k = 0; k < MODELS; k++) {
        rp_model *m = test_model(spec_of(k));
        rp_memory mem[4] = {0};
        rp_weights *w[4] = {0}, *w1[4] = {0};
        float loss[4][8];
        for (int v = 0; v < 4; v++) {
            char json[640];
            snprintf(json, sizeof json,
                     "{\"seed\": 3, \"micro_batch_size\": 4, \"gradient_accumulation_steps\": 2, "
                     "\"layers_per_stage\": %s, \"schedule\": \"1f1b\", \"output_mode\": \"all\", "
                     "%s%s%s \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}}",
                     cuts(k, 2), v ? "\"recompute_layers\": " : "", v ? lists[v - 1][k] : "",
                     v ? "," : "");
            rp_config c = test_config(json);
            w[v] = train(m, &c, false, loss[v], &w1[v]);
            rp_session *s = test_session(m, &c, NULL);
            rp_error err;
            mem[v].activations = 0;
            for (int st = 0; s && st < 2; st++) { /* both stages' sets */
                rp_memory ms;
                CHECK_OK(rp_session_memory(s, st, &ms, &err), err);
                mem[v].activations += ms.activations;
            }
            rp_session_free(s);
        }
        for (int v = 1; v < 4 && w1[0]; v++) {
            if (!w1[v])
                continue;
            for (int t = 0; t < w1[0]->num_tensors; t++)
                CHECKF(memcmp(w1[0]->tensors[t].data, w1[v]->tensors[t].data,
                              sizeof(float) * rp_shape_size(&w1[0]->tensors[t].shape)) == 0,
                       "%s, recompute_layers %s: tensor %s differs", NAMES[k],
                       lists[v - 1][k], w1[0]->tensors[t].name);
            CHECKF(memcmp(loss[0], loss[v], sizeof loss[0]) == 0, "%s, recompute_layers %s: "
                   "the losses differ", NAMES[k], lists[v - 1][k]);
            CHECKF(mem[v].activations < mem[0].activations, "%s, recompute_layers %s: the "
                   "activation sets hold %zu bytes, keeping all %zu", NAMES[k],
                   lists[v - 1][k], mem[v].activations, mem[0].activations);
        }
        for (int v = 0; v < 4; v++)
            rp_weights_free(w[v]), rp_weights_free(w1[v]);
        rp_model_free(m);
    }
    /* a layer the model does not have, and with every layer recomputed */
    rp_model *m = test_model(RESIDUAL);
    rp_error err;
    rp_config c = test_config("{\"recompute_layers\": [2, 11]}");
    CHECK(rp_session_check(m, &c, &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "recompute_layers: layer 11; the model's layers are 0 to 10");
    rp_config both;
    const char *two = "{\"recompute_layers\": [2], \"recompute_checkpoint_every_layer\": true}";
    CHECK(rp_config_load_string(&both, two, strlen(two), "t", &err) != RP_OK);
    CHECK_STR_HAS(err.msg, "give one of them");
    rp_model_free(m);
}

static void with_mpi(int ranks) {
    sweep(true, ranks);
}

static void local(void) {
    boundaries();
    running_statistics();
    by_layer();
    sweep(false, 0);
}

int main(int argc, char **argv) {
    test_start(argc, argv, 512, 9, &data, &mpi);
    return test_main("test_graph", mpi, data, with_mpi, local);
}
