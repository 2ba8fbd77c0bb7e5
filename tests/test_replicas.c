#define _POSIX_C_SOURCE 200809L
/*
** Replicas: every configuration of R replicas equals one worker on the same
** samples; groupings train independent models; per-layer groupings keep
** per-replica heads; device iterations, output modes, weights modes and
** failures; workers that copy their own rows (rp_session_run_samples) match
** a host that hands them over.
**
**   test_replicas              local backend, R = 1..4 and the groupings
**   test_replicas --mpi        under mpirun -np R: the equivalence sweep, rows
**                              from the dataset, inference over the ranks
**   test_replicas --mpi --fail replica 2 gets a bad label: the job must end
*/
#include <stdlib.h>
#include <time.h>

#include "../src/core/util.h"
#include "repipe/data.h"
#include "repipe/session.h"
#include "support.h"
#include "test.h"

static const char *MLP = "input 1 28 28\nflatten\nlinear 512\nrelu\nlinear 512\nrelu\n"
                         "linear 10\nsoftmax_cross_entropy\n";
/* Under ThreadSanitizer (REPIPE_TEST_NARROW, set by its build's tests) the
** MLP is 64 wide: the same threads, messages and reductions, an eighth of
** the arithmetic, which the sanitizer makes the bulk of the suite's time. */
static const char *NARROW = "input 1 28 28\nflatten\nlinear 64\nrelu\nlinear 64\nrelu\n"
                            "linear 10\nsoftmax_cross_entropy\n";
static const char *DROP = "input 1 28 28\nflatten\nlinear 48\ngelu\ndropout 0.25\nlinear 32\n"
                          "layernorm\nrelu\nlinear 10\nsoftmax_cross_entropy\n";
/* see test_training.c for why Adam's eps is 1e-5 in equivalence tests */
/* plain SGD keeps no state: its replicas sum and update in one collective */
static const char *OPTS[] = {"{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}",
                             "{\"type\": \"adam\", \"lr\": 0.001, \"eps\": 1e-5}",
                             "{\"type\": \"sgd\", \"lr\": 0.05, \"weight_decay\": 0.01}"};

static rp_dataset *data;
static rp_comm *mpi; /* NULL: local backend */

static rp_config config(int B, int GA, int R, int D, const char *opt, const char *extra) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"seed\": 21, \"micro_batch_size\": %d, \"gradient_accumulation_steps\": %d, "
             "\"replication_factor\": %d, \"device_iterations\": %d, \"output_mode\": \"all\", "
             "\"optimizer\": %s%s}",
             B, GA, R, D, opt, extra ? extra : "");
    return test_config(json);
}

static rp_session *session(const rp_model *m, const rp_config *c, bool use_mpi) {
    rp_session *s = test_session(m, c, use_mpi ? mpi : NULL);
    if (!s)
        exit(1);
    return s;
}

/* Host call k over the data: rows k*per .. (mod n), in stream order. */
static rp_status call(rp_session *s, int k, const int64_t *order, rp_result *r, rp_error *err) {
    long long per = rp_session_samples_per_call(s);
    size_t in = rp_shape_size(&data->sample);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    float *x = malloc(sizeof(float) * per * in);
    int32_t *y = malloc(sizeof(int32_t) * per);
    for (long long i = 0; i < per; i++)
        ids[i] = order ? order[k * per + i] : (k * per + i) % data->n;
    rp_dataset_gather(data, ids, (int)per, x, y);
    rp_status st = rp_session_run(s, x, y, ids, r, err);
    free(ids), free(x), free(y);
    return st;
}

/* Largest relative difference over the tensors of two weight sets, group
** ga of a and group gb of b. */
static double diff(const rp_weights *a, int ga, const rp_weights *b, int gb) {
    double worst = 0;
    for (int t = 0; t < a->num_tensors; t++) {
        const rp_tensor *ta = &a->tensors[t], *tb = rp_weights_find(b, ta->name);
        size_t n = rp_shape_size(&ta->shape);
        double d = rp_tensor_rel_diff(ta->data + ga * n, tb->data + gb * n, n);
        worst = d > worst ? d : worst;
    }
    return worst;
}

static rp_weights *weights(rp_session *s, rp_weights_mode mode) {
    rp_weights *w;
    rp_error err;
    CHECK(rp_session_get_weights(s, mode, &w, &err) == RP_OK);
    return w;
}

/* R replicas with GA each against one worker with GA * R, after one and
** after three updates. */
static void equivalence(int R, bool use_mpi) {
    const char *specs[] = {MLP, DROP};
    for (int sp = 0; sp < 2; sp++) {
        rp_model *m = test_model(specs[sp]);
        for (int o = 0; o < 3; o++)
            for (int GA = 1; GA <= 4; GA += (GA == 1 ? 2 : 1)) {
                rp_config rc = config(8, GA, R, 1, OPTS[o], NULL);
                rp_config one = config(8, GA * R, 1, 1, OPTS[o], NULL);
                rp_session *a = session(m, &rc, use_mpi), *b = session(m, &one, false);
                rp_result r;
                rp_error err;
                for (int k = 0; k < 3; k++) {
                    CHECK(call(a, k, NULL, &r, &err) == RP_OK);
                    CHECK(call(b, k, NULL, &r, &err) == RP_OK);
                    if (k == 1)
                        continue;
                    rp_weights *wa = weights(a, RP_ONE_PER_GROUP), *wb = weights(b, RP_ONE_PER_GROUP);
                    double d = diff(wa, 0, wb, 0);
                    test_checks++;
                    if (!(d <= 1e-5)) {
                        fprintf(stderr, "R=%d GA=%d model %d optimizer %d after %d updates: %g\n",
                                R, GA, sp, o, k + 1, d);
                        test_failures++;
                    }
                    /* every replica of the group holds the same bits */
                    rp_weights *all = weights(a, RP_ALL_REPLICAS);
                    for (int c = 1; c < R; c++)
                        CHECK(diff(all, c, all, 0) == 0);
                    rp_weights_free(wa), rp_weights_free(wb), rp_weights_free(all);
                }
                rp_session_free(a), rp_session_free(b);
            }
        rp_model_free(m);
    }
}

/* rp_session_run_samples (each worker copies its own rows from the dataset)
** gives the bits of rp_session_run on the same rows: weights of every
** replica and every loss, with dropout (sample ids) and device iterations,
** with one stage and with two (R replicas over 2R workers); ids outside the
** dataset are refused. */
static void from_dataset(int R, bool use_mpi) {
    static const char *shapes[] = {"", ", \"layers_per_stage\": [5, -1]"};
    rp_model *m = test_model(DROP);
    for (int sh = 0; sh < 2; sh++) {
        if (use_mpi && rp_comm_size(mpi) != R * (sh + 1))
            continue;
        rp_config c = config(8, 2, R, 2, OPTS[1], shapes[sh]);
        rp_session *a = session(m, &c, use_mpi), *b = session(m, &c, use_mpi);
        long long per = rp_session_samples_per_call(b);
        int64_t *ids = malloc(sizeof(int64_t) * per);
        rp_result ra, rb;
        rp_error err;
        for (int k = 0; k < 3; k++) {
            CHECK(call(a, k, NULL, &ra, &err) == RP_OK);
            for (long long i = 0; i < per; i++)
                ids[i] = (k * per + i) % data->n;
            CHECK(rp_session_run_samples(b, data, ids, &rb, &err) == RP_OK);
            CHECK(ra.count == rb.count && memcmp(ra.losses, rb.losses, sizeof(float) * ra.count) == 0);
        }
        rp_weights *wa = weights(a, RP_ALL_REPLICAS), *wb = weights(b, RP_ALL_REPLICAS);
        for (int r = 0; r < R; r++)
            CHECK(diff(wa, r, wb, r) == 0);
        ids[per - 1] = data->n;
        CHECK(rp_session_run_samples(b, data, ids, &rb, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, "sample id 1024");
        rp_weights_free(wa), rp_weights_free(wb);
        free(ids);
        rp_session_free(a), rp_session_free(b);
    }
    rp_model_free(m);
}

/* A grouping of R replicas trains G models; group k equals one worker that
** starts from group k's initial weights and sees its members' samples. */
static void groupings(int R, int g, int s, const char *opt) {
    char extra[96];
    snprintf(extra, sizeof extra, ", \"replica_grouping\": {\"group_size\": %d, \"stride\": %d}",
             g, s);
    rp_model *m = test_model(DROP);
    int GA = 2, B = 8, G = R / g;
    rp_config rc = config(B, GA, R, 1, opt, extra);
    rp_session *a = session(m, &rc, false);
    rp_weights *init = weights(a, RP_ONE_PER_GROUP);
    CHECK_INT(init->tensors[0].groups, G);
    CHECK(diff(init, 0, init, G - 1) > 0.1); /* groups start different */
    rp_result r;
    rp_error err;
    CHECK(call(a, 0, NULL, &r, &err) == RP_OK);
    rp_weights *after = weights(a, RP_ONE_PER_GROUP);
    rp_grouping gr;
    CHECK(rp_grouping_init(&gr, R, g, s, &err) == RP_OK);
    for (int k = 0; k < G; k++) {
        /* the group's samples: its members' micro-batches, members ascending */
        int64_t order[4096];
        int at = 0;
        for (int i = 0; i < g; i++) {
            int c = rp_grouping_member(&gr, k, i);
            for (int x = 0; x < GA * B; x++)
                order[at++] = c * GA * B + x;
        }
        rp_config one = config(B, GA * g, 1, 1, opt, NULL);
        rp_session *b = session(m, &one, false);
        /* group k's initial weights */
        rp_weights *wk;
        CHECK(rp_session_get_weights(a, RP_ONE_PER_GROUP, &wk, &err) == RP_OK);
        for (int t = 0; t < init->num_tensors; t++) {
            size_t n = rp_shape_size(&init->tensors[t].shape);
            memcpy(wk->tensors[t].data, init->tensors[t].data + k * n, sizeof(float) * n);
            wk->tensors[t].groups = 1;
        }
        CHECK(rp_session_set_weights(b, wk, RP_ONE_PER_GROUP, &err) == RP_OK);
        CHECK(call(b, 0, order, &r, &err) == RP_OK);
        rp_weights *wb = weights(b, RP_ONE_PER_GROUP);
        double d = diff(after, k, wb, 0);
        test_checks++;
        if (!(d <= 1e-5)) {
            fprintf(stderr, "R=%d g=%d s=%d: group %d differs from one worker by %g\n", R, g, s, k,
                    d);
            test_failures++;
        }
        rp_weights_free(wk), rp_weights_free(wb);
        rp_session_free(b);
    }
    /* all_replicas: R copies, members of a group identical */
    rp_weights *all = weights(a, RP_ALL_REPLICAS);
    CHECK_INT(all->tensors[0].groups, R);
    for (int c = 0; c < R; c++)
        CHECK(diff(all, c, after, rp_grouping_group_of(&gr, c)) == 0);
    /* writing one value per replica would split a group */
    if (g > 1) {
        CHECK(rp_session_set_weights(a, all, RP_ALL_REPLICAS, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, "write one value per group");
    }
    rp_weights_free(all), rp_weights_free(init), rp_weights_free(after);
    rp_session_free(a);
    rp_model_free(m);
}

/* A head with group_size=1 stays per replica while the body is shared. */
static void per_replica_head(void) {
    const char *spec = "input 1 28 28\nflatten\nlinear 32\nrelu\nlinear 10 group_size=1\n"
                       "softmax_cross_entropy\n";
    rp_model *m = test_model(spec);
    const char *sgd = "{\"type\": \"sgd\", \"lr\": 0.1}";
    int R = 4, B = 8, GA = 1;
    rp_config rc = config(B, GA, R, 1, sgd, NULL);
    rp_session *a = session(m, &rc, false);
    rp_weights *init = weights(a, RP_ALL_REPLICAS);
    rp_result r;
    rp_error err;
    CHECK(call(a, 0, NULL, &r, &err) == RP_OK);
    rp_weights *all = weights(a, RP_ALL_REPLICAS);
    const rp_tensor *head = rp_weights_find(all, "3.weight"), *body = rp_weights_find(all, "1.weight");
    size_t hn = rp_shape_size(&head->shape), bn = rp_shape_size(&body->shape);
    CHECK_INT(body->groups, R);
    CHECK(memcmp(body->data, body->data + bn, sizeof(float) * bn) == 0); /* shared */
    CHECK(rp_tensor_rel_diff(head->data, head->data + hn, hn) > 0.01);  /* per replica */
    rp_weights *per_group = weights(a, RP_ONE_PER_GROUP);
    CHECK_INT(rp_weights_find(per_group, "3.weight")->groups, R); /* G = R for the head */
    CHECK_INT(rp_weights_find(per_group, "1.weight")->groups, 1);
    rp_weights_free(per_group);
    /* replica c's head moved as one worker's on replica c's own samples */
    for (int c = 0; c < R; c++) {
        rp_config one = config(B, GA, 1, 1, sgd, NULL);
        rp_session *b = session(m, &one, false);
        rp_weights *wc = weights(b, RP_ONE_PER_GROUP);
        for (int t = 0; t < wc->num_tensors; t++) {
            const rp_tensor *src = rp_weights_find(init, wc->tensors[t].name);
            size_t n = rp_shape_size(&src->shape);
            memcpy(wc->tensors[t].data, src->data + c * n, sizeof(float) * n);
        }
        CHECK(rp_session_set_weights(b, wc, RP_ONE_PER_GROUP, &err) == RP_OK);
        int64_t order[64];
        for (int x = 0; x < B; x++)
            order[x] = c * B + x;
        CHECK(call(b, 0, order, &r, &err) == RP_OK);
        rp_weights *wb = weights(b, RP_ONE_PER_GROUP);
        const rp_tensor *hb = rp_weights_find(wb, "3.weight");
        CHECK(rp_tensor_rel_diff(head->data + c * hn, hb->data, hn) <= 1e-5);
        rp_weights_free(wc), rp_weights_free(wb);
        rp_session_free(b);
    }
    rp_weights_free(init), rp_weights_free(all);
    rp_session_free(a);
    rp_model_free(m);
}

/* D = 3 in one call equals three calls; output modes; determinism. */
static void iterations_and_outputs(void) {
    rp_model *m = test_model(DROP);
    int R = 3, GA = 2, B = 4;
    rp_config c1 = config(B, GA, R, 1, OPTS[0], NULL), c3 = config(B, GA, R, 3, OPTS[0], NULL);
    rp_session *a = session(m, &c1, false), *b = session(m, &c3, false), *a2 = session(m, &c1, false);
    rp_result r, r3;
    rp_error err;
    float last_all[64];
    for (int k = 0; k < 3; k++) {
        CHECK(call(a, k, NULL, &r, &err) == RP_OK);
        CHECK(call(a2, k, NULL, &r, &err) == RP_OK);
    }
    memcpy(last_all, r.losses, sizeof(float) * r.count);
    CHECK_INT(r.ndim, 3);
    CHECK_INT(r.dims[1], R);
    CHECK(call(b, 0, NULL, &r3, &err) == RP_OK);
    CHECK_INT(r3.dims[0], 3);
    CHECK_INT(r3.count, 3 * R * GA);
    CHECK(memcmp(r3.losses + 2 * R * GA, last_all, sizeof(float) * R * GA) == 0);
    rp_weights *wa = weights(a, RP_ALL_REPLICAS), *wb = weights(b, RP_ALL_REPLICAS),
               *wa2 = weights(a2, RP_ALL_REPLICAS);
    CHECK(diff(wa, 0, wb, 0) == 0); /* D=3 == 3 x D=1, bit for bit */
    CHECK(diff(wa, 2, wa2, 2) == 0); /* repeated runs, bit for bit */
    /* sum and final, from the same run's all */
    float all[64];
    memcpy(all, r3.losses, sizeof(float) * r3.count);
    for (int mode = 0; mode < 2; mode++) {
        rp_config cm = c3;
        cm.output_mode = mode ? RP_OUTPUT_SUM : RP_OUTPUT_FINAL;
        rp_session *s = session(m, &cm, false);
        CHECK(call(s, 0, NULL, &r, &err) == RP_OK);
        CHECK_INT(r.ndim, 1);
        CHECK_INT(r.dims[0], R);
        for (int c = 0; c < R; c++) {
            double sum = 0;
            for (int d = 0; d < 3; d++)
                for (int k = 0; k < GA; k++)
                    sum += all[(d * R + c) * GA + k];
            if (mode)
                CHECK_CLOSE(r.losses[c], sum, 1e-6);
            else
                CHECK(r.losses[c] == all[(2 * R + c) * GA + GA - 1]);
        }
        rp_session_free(s);
    }
    /* the losses of the first update, computed apart with one worker */
    rp_config one = config(B, GA * R, 1, 1, OPTS[0], NULL);
    rp_session *o = session(m, &one, false);
    CHECK(call(o, 0, NULL, &r, &err) == RP_OK);
    for (int i = 0; i < R * GA; i++)
        CHECK(r.losses[i] == all[i]); /* [1][R][GA] == [1][1][R*GA] */
    rp_session_free(o);
    rp_weights_free(wa), rp_weights_free(wb), rp_weights_free(wa2);
    rp_session_free(a), rp_session_free(b), rp_session_free(a2);
    rp_model_free(m);
}

/* A bad label in replica 2's rows: that worker fails, the others wake, and
** the call returns replica 2's message. */
/* Inference: predictions in row order whatever the inference replication
** and sharding (under MPI, spread over the ranks), each the class a plain
** forward pass with replica 0's weights scores highest (the rows are not a
** whole number of micro-batches). */
static void inference(bool use_mpi) {
    rp_model *m = test_model(MLP);
    enum { N = 203, B = 8 };
    size_t in = rp_shape_size(&data->sample);
    float *x = malloc(sizeof(float) * N * in);
    int32_t y[N], want[N], got[N];
    int64_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = i;
    rp_dataset_gather(data, ids, N, x, y);
    /* the reference: trained weights through one net, B rows at a time */
    rp_config base = config(B, 1, 2, 1, OPTS[0], NULL);
    rp_session *s = session(m, &base, false);
    rp_result r;
    rp_error err;
    CHECK(call(s, 0, NULL, &r, &err) == RP_OK);
    rp_weights *w = weights(s, RP_ONE_PER_GROUP);
    rp_session_free(s);
    rp_net *net;
    rp_acts *acts;
    CHECK(rp_net_create(m, 0, m->num_layers, B, &net, &err) == RP_OK);
    CHECK(rp_acts_create(net, B, &acts, &err) == RP_OK);
    CHECK(rp_weights_to_params(m, w, 0, rp_net_params(net), &err) == RP_OK);
    rp_step_ctx ctx = {.training = false, .loss_scale = 1.0, .labels = y};
    for (int at = 0; at < N; at += B) {
        int k = N - at < B ? N - at : B;
        ctx.labels = y + at;
        CHECK(rp_net_forward(net, acts, x + (size_t)at * in, k, &ctx, NULL) != NULL);
        rp_net_predictions(net, acts, want + at);
    }
    static const char *shapes[] = {"", ", \"inference_replication_factor\": 3",
                                   (", \"inference_replication_factor\": 4, "
                                    "\"inference_layers_per_stage\": [2, -1]"),
                                   ", \"inference_replication_factor\": 40"};
    for (int k = 0; k < 4; k++) {
        rp_config c = config(B, 1, use_mpi ? rp_comm_size(mpi) : 2, 1, OPTS[0], shapes[k]);
        s = session(m, &c, use_mpi);
        CHECK(rp_session_set_weights(s, w, RP_ONE_PER_GROUP, &err) == RP_OK);
        memset(got, 0xff, sizeof got);
        CHECK(rp_session_predict(s, x, N, got, &err) == RP_OK);
        CHECK(memcmp(got, want, sizeof got) == 0);
        rp_session_free(s);
    }
    rp_acts_free(acts);
    rp_net_free(net);
    rp_weights_free(w);
    free(x);
    rp_model_free(m);
}

static void failure(void) {
    rp_model *m = test_model(MLP);
    int R = 4, B = 8;
    rp_config c = config(B, 1, R, 1, OPTS[0], NULL);
    rp_session *s = session(m, &c, false);
    long long per = rp_session_samples_per_call(s);
    int64_t ids[64];
    float *x = malloc(sizeof(float) * per * 784);
    int32_t y[64];
    for (int i = 0; i < per; i++)
        ids[i] = i;
    rp_dataset_gather(data, ids, (int)per, x, y);
    y[2 * B + 3] = 99;
    rp_result r;
    rp_error err;
    double t0 = rp_now();
    CHECK(rp_session_run(s, x, y, ids, &r, &err) == RP_ERR_INVALID);
    CHECK(rp_now() - t0 < 5);
    CHECK_STR_HAS(err.msg, "replica 2");
    CHECK_STR_HAS(err.msg, "label 99");
    free(x);
    rp_session_free(s); /* the worker threads end cleanly */
    rp_model_free(m);
}

int main(int argc, char **argv) {
    rp_error err;
    rp_shape shape = {3, {1, 28, 28}};
    if (rp_dataset_synthetic(&data, 1024, shape, 10, 5, &err) != RP_OK)
        return 1;
    bool use_mpi = argc > 1 && strcmp(argv[1], "--mpi") == 0;
    if (getenv("REPIPE_TEST_NARROW"))
        MLP = NARROW;
    if (!use_mpi) {
        for (int R = 1; R <= 4; R++)
            equivalence(R, false);
        from_dataset(1, false);
        from_dataset(3, false);
        for (int o = 0; o < 3; o += 2) {
            groupings(4, 2, 1, OPTS[o]);
            groupings(8, 2, 4, OPTS[o]);
            groupings(8, 2, 2, OPTS[o]);
        }
        per_replica_head();
        iterations_and_outputs();
        inference(false);
        failure();
        rp_dataset_free(data);
        return test_finish("test_replicas (local)");
    }
    if (rp_comm_mpi_init(&argc, &argv, &mpi, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int R = rp_comm_size(mpi);
    if (argc > 2 && strcmp(argv[2], "--fail") == 0) {
        rp_model *m = test_model(MLP);
        rp_config c = config(8, 1, R, 1, OPTS[0], NULL);
        rp_session *s = session(m, &c, true);
        int64_t ids[64];
        float *x = malloc(sizeof(float) * 8 * R * 784);
        int32_t y[64];
        for (int i = 0; i < 8 * R; i++)
            ids[i] = i;
        rp_dataset_gather(data, ids, 8 * R, x, y);
        y[2 * 8 + 1] = 77;
        rp_result r;
        if (rp_session_run(s, x, y, ids, &r, &err)) {
            fprintf(stderr, "rank %d: %s\n", rp_comm_rank(mpi), err.msg);
            rp_comm_fail(mpi, err.msg);
        }
        return 0;
    }
    equivalence(R, true);
    from_dataset(R, true);
    if (R % 2 == 0)
        from_dataset(R / 2, true);
    inference(true);
    /* a world of the wrong size is refused with both numbers */
    rp_model *m = test_model(MLP);
    rp_config c = config(8, 1, R + 1, 1, OPTS[0], NULL);
    rp_session *s;
    CHECK(rp_session_create_mpi(m, &c, mpi, &s, &err) == RP_ERR_INVALID);
    char want[128];
    snprintf(want, sizeof want, "needs %d workers", R + 1);
    CHECK_STR_HAS(err.msg, want);
    rp_model_free(m);
    char name[64];
    snprintf(name, sizeof name, "test_replicas (mpi, rank %d of %d)", rp_comm_rank(mpi), R);
    int rc = test_finish(name);
    rp_dataset_free(data);
    rp_comm_mpi_finalize(mpi);
    return rc;
}
