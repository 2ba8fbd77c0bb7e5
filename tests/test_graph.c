/*
** Graphs on the engine: a residual model and a concat model, cut where two
** tensors are alive (a skip crossing a stage, one passing through a whole
** stage), equal one worker running the same micro-batches, on every axis:
** P 2 and 3, stage replication [2,1] and [1,2,1], R 1 and 2, GA 1 and 4,
** gpipe and 1f1b, recomputation on and off, replicated tensor sharding.
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

/* Cuts where two tensors cross: for P 2 and 3 of each model */
static const char *cuts(bool dense, int P) {
    if (P == 1)
        return "[-1]";
    if (dense)
        return P == 2 ? "[4, -1]" : "[3, 4, -1]";
    return P == 2 ? "[3, -1]" : "[3, 2, -1]";
}

static rp_config config(const gcase *gc, bool dense, bool single) {
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

/* Two host calls on the same samples for every layout; the first call's
** losses come back. */
static rp_weights *train(const rp_model *m, const rp_config *c, bool use_mpi, float *losses) {
    rp_session *s;
    rp_error err;
    rp_status st = use_mpi ? rp_session_create_mpi(m, c, mpi, &s, &err)
                           : rp_session_create(m, c, &s, &err);
    if (st) {
        fprintf(stderr, "session: %s\n", err.msg);
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
    }
    rp_weights *w;
    CHECK(rp_session_get_weights(s, RP_ONE_PER_GROUP, &w, &err) == RP_OK);
    free(ids), free(x), free(y);
    rp_session_free(s);
    return w;
}

static double diff(const rp_weights *a, const rp_weights *b) {
    double worst = 0;
    for (int t = 0; t < a->num_tensors; t++) {
        const rp_tensor *tb = rp_weights_find(b, a->tensors[t].name);
        double d = rp_tensor_rel_diff(a->tensors[t].data, tb->data,
                                      rp_shape_size(&a->tensors[t].shape));
        worst = d > worst ? d : worst;
    }
    return worst;
}

static int workers_of(const gcase *gc) {
    int w = 0;
    for (int s = 0; s < gc->P; s++)
        w += gc->r[s];
    return w * gc->R;
}

static void sweep(bool use_mpi, int only_workers) {
    int run = 0;
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        const gcase *gc = &CASES[k];
        if (only_workers && workers_of(gc) != only_workers)
            continue;
        for (int dense = 0; dense < 2; dense++) {
            rp_model *m = test_model(dense ? DENSE : RESIDUAL);
            rp_config pipe = config(gc, dense, false), one = config(gc, dense, true);
            float lp[64], lo[64];
            rp_weights *a = train(m, &pipe, use_mpi, lp);
            rp_weights *b = train(m, &one, false, lo);
            if (a && b) {
                double d = diff(a, b);
                test_checks++;
                if (!(d <= 1e-5)) {
                    fprintf(stderr, "%s P=%d R=%d r=[%d,%d,%d] GA=%d %s%s%s: differs by %g\n",
                            dense ? "dense" : "residual", gc->P, gc->R, gc->r[0], gc->r[1],
                            gc->r[2], gc->GA, gc->schedule, gc->recompute ? " recompute" : "",
                            gc->sharding ? " sharding" : "", d);
                    test_failures++;
                }
                size_t bad = 0;
                for (int i = 0; i < gc->R * gc->GA; i++)
                    bad += fabs(lp[i] - lo[i]) > 1e-6 * (1 + fabs(lo[i]));
                CHECK(bad == 0);
            }
            rp_weights_free(a), rp_weights_free(b);
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
    rp_model_free(r), rp_model_free(d);
}

int main(int argc, char **argv) {
    test_start(argc, argv, 512, 9, &data, &mpi);
    int rc;
    if (mpi) {
        sweep(true, rp_comm_size(mpi));
        char name[64];
        snprintf(name, sizeof name, "test_graph (mpi rank %d)", rp_comm_rank(mpi));
        rc = test_finish(name);
        rp_comm_mpi_finalize(mpi);
    } else {
        boundaries();
        sweep(false, 0);
        rc = test_finish("test_graph (local)");
    }
    rp_dataset_free(data);
    return rc;
}
