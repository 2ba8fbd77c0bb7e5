/*
** The "pipedream" schedule against an emulator of its semantics, written
** from their definition (docs/pipelines.md) and not from the engine's code:
**
**   - stage s runs one host call's GA micro-batches in the 1F1B order one
**     worker would use: n_s - 1 forwards, then a forward and a backward in
**     turn, then the last backwards, n_s = min(GA, r_s + ... + r_{P-1});
**     micro-batch m goes to stage replica m mod r_s;
**   - update k of stage s averages the gradients of micro-batches
**     k r_s .. k r_s + r_s - 1 of every replica, and follows the last of
**     their backwards;
**   - the forward of m uses the weights after the updates its stage replica
**     has taken before it, in its own part of that order; its backward uses
**     the same weights (weight stashing);
**   - the pipeline drains at the end of each host call.
**
** The emulator runs each micro-batch forward and backward at once, on the
** versions that rule gives, and applies updates when their last backward is
** done. Three host calls; weights within 1e-6 of the engine's, on threads
** and on MPI ranks.
*/
#include <math.h>

#include "repipe/session.h"
#include "support.h"
#include "test.h"

static rp_dataset *data;
static rp_comm *mpi;
static int ran; /* cases compared */

static const char *MLP = "input 1 28 28\nflatten\nlinear 24\nrelu\nlinear 16\nrelu\nlinear 10\n"
                         "softmax_cross_entropy\n";
/* A graph: cut at 3 the skip r0 crosses with c1, and at 5 it passes the
** middle stage untouched beside c2. */
static const char *RESIDUAL = "input 1 28 28\nc0 = conv2d 3 kernel=3 pad=1 stride=2\nr0 = relu\n"
                              "conv2d 3 kernel=3 pad=1\nrelu\nc2 = conv2d 3 kernel=3 pad=1\n"
                              "add < c2 r0\nrelu\navgpool2d 2\nflatten\nlinear 10\n"
                              "softmax_cross_entropy\n";
static const char *spec; /* the model compare() trains */

typedef struct pdcase {
    int P, R, r[3], layers[3], GA;
    bool bw; /* pipedream_2bw */
} pdcase;

/* The version each forward of stage s sees: backwards of the same stage
** replica earlier in the stage's 1F1B order. */
static void versions(const pdcase *pc, int s, int *vf) {
    int n = 0;
    for (int t = s; t < pc->P; t++)
        n += pc->r[t];
    n = n < pc->GA ? n : pc->GA;
    int order[64], fw[64], len = 0, f = 0, b = 0; /* (forward?, micro-batch) */
    while (f < n - 1)
        fw[len] = 1, order[len++] = f++;
    while (b < pc->GA) {
        if (f < pc->GA)
            fw[len] = 1, order[len++] = f++;
        fw[len] = 0, order[len++] = b++;
    }
    for (int j = 0; j < pc->r[s]; j++) {
        int done = 0;
        for (int i = 0; i < len; i++) {
            if (order[i] % pc->r[s] != j)
                continue;
            if (fw[i])
                vf[order[i]] = done;
            else
                done++;
        }
    }
}

static void emulate(const rp_model *m, const pdcase *pc, bool vsync, double lr, double mu,
                    int calls, const float *x, const int32_t *y, const int64_t *ids,
                    float *params) {
    int B = 4, P = pc->P, GA = pc->GA, R = pc->R, first[4] = {0};
    for (int s = 0; s < P; s++)
        first[s + 1] = first[s] + pc->layers[s];
    rp_model_init_params(m, 0, m->num_layers, 3, NULL, params);
    float *vel = calloc(m->num_params, sizeof(float));
    rp_net *net[3];
    rp_acts *acts[3];
    float *versions_of[3], *sum[3];
    int vf[3][64];
    rp_error err;
    for (int s = 0; s < P; s++) {
        CHECK_OK(rp_net_create(m, first[s], first[s + 1], B, &net[s], &err), err);
        CHECK_OK(rp_acts_create(net[s], B, &acts[s], &err), err);
        size_t n = rp_net_num_params(net[s]);
        /* every version a call makes: one an update, and the first */
        versions_of[s] = malloc(sizeof(float) * n * (GA + 1));
        sum[s] = calloc(n, sizeof(float));
        versions(pc, s, vf[s]);
    }
    for (int s = P - 1; vsync && s >= 0; s--) /* the input stage's micro-batches, in r_s groups */
        for (int mb = 0; mb < GA; mb++)
            vf[s][mb] = vf[0][mb] * pc->r[0] / pc->r[s];
    for (int call = 0; call < calls; call++) {
        for (int s = 0; s < P; s++) { /* version 0 of this call: the weights so far */
            size_t n = rp_net_num_params(net[s]), off = m->layers[first[s]].param_offset;
            memcpy(versions_of[s], params + off, sizeof(float) * n);
        }
        for (int mb = 0; mb < GA; mb++) {
            for (int c = 0; c < R; c++) {
                size_t row = (size_t)call * B * GA * R + ((size_t)c * GA + mb) * B;
                rp_step_ctx ctx = {.training = true, .seed = 3, .update = (uint64_t)call,
                                   .sample_id = ids + row, .labels = y + row,
                                   .loss_scale = 1.0 / B};
                const float *in = x + row * 784;
                for (int s = 0; s < P; s++) {
                    size_t n = rp_net_num_params(net[s]);
                    memcpy(rp_net_params(net[s]), versions_of[s] + n * vf[s][mb], sizeof(float) * n);
                    in = rp_net_forward(net[s], acts[s], in, B, &ctx, NULL);
                }
                const float *g = NULL;
                for (int s = P - 1; s >= 0; s--) {
                    size_t n = rp_net_num_params(net[s]);
                    memcpy(rp_net_params(net[s]), versions_of[s] + n * vf[s][mb], sizeof(float) * n);
                    memset(rp_net_grads(net[s]), 0, sizeof(float) * n);
                    g = rp_net_backward(net[s], acts[s], g, &ctx, s > 0);
                    const float *gr = rp_net_grads(net[s]);
                    for (size_t e = 0; e < n; e++)
                        sum[s][e] += gr[e];
                }
            }
            for (int s = 0; s < P; s++) { /* the update whose last backward this was */
                if (mb % pc->r[s] != pc->r[s] - 1)
                    continue;
                int k = mb / pc->r[s];
                size_t n = rp_net_num_params(net[s]), off = m->layers[first[s]].param_offset;
                float mean = 1.0f / (float)(pc->r[s] * R), *p = params + off, *v = vel + off;
                for (size_t e = 0; e < n; e++) {
                    v[e] = (float)mu * v[e] + sum[s][e] * mean;
                    p[e] -= (float)lr * v[e];
                    sum[s][e] = 0;
                }
                memcpy(versions_of[s] + n * (k + 1), p, sizeof(float) * n);
            }
        }
    }
    for (int s = 0; s < P; s++) {
        rp_acts_free(acts[s]);
        rp_net_free(net[s]);
        free(versions_of[s]), free(sum[s]);
    }
    free(vel);
}

/* PipeDream-2BW, from its rule W(t + 1) = W(t) - step(grad f(W(t - 1))),
** W(-1) = W(0): each update's micro-batches all run on the version one
** update older than the one the update is applied to. One net, the whole
** model: the stages do not matter to the rule. */
static void emulate_2bw(const rp_model *m, const pdcase *pc, double lr, double mu, int calls,
                        const float *x, const int32_t *y, const int64_t *ids, float *params) {
    int B = 4, GA = pc->GA, R = pc->R;
    size_t n = m->num_params;
    rp_model_init_params(m, 0, m->num_layers, 3, NULL, params);
    float *vel = calloc(n, sizeof(float)), *older = malloc(sizeof(float) * n);
    float *sum = calloc(n, sizeof(float));
    memcpy(older, params, sizeof(float) * n);
    rp_net *net;
    rp_acts *acts;
    rp_error err;
    CHECK_OK(rp_net_create(m, 0, m->num_layers, B, &net, &err), err);
    CHECK_OK(rp_acts_create(net, B, &acts, &err), err);
    for (int call = 0; call < calls; call++) {
        memcpy(rp_net_params(net), older, sizeof(float) * n);
        for (int c = 0; c < R; c++)
            for (int mb = 0; mb < GA; mb++) {
                size_t row = (size_t)call * B * GA * R + ((size_t)c * GA + mb) * B;
                rp_step_ctx ctx = {.training = true, .seed = 3, .update = (uint64_t)call,
                                   .sample_id = ids + row, .labels = y + row,
                                   .loss_scale = 1.0 / ((double)B * GA * R)};
                rp_net_forward(net, acts, x + row * 784, B, &ctx, NULL);
                memset(rp_net_grads(net), 0, sizeof(float) * n);
                rp_net_backward(net, acts, NULL, &ctx, false);
                for (size_t e = 0; e < n; e++)
                    sum[e] += rp_net_grads(net)[e];
            }
        memcpy(older, params, sizeof(float) * n);
        for (size_t e = 0; e < n; e++) {
            vel[e] = (float)mu * vel[e] + sum[e];
            params[e] -= (float)lr * vel[e];
            sum[e] = 0;
        }
    }
    rp_acts_free(acts);
    rp_net_free(net);
    free(vel), free(older), free(sum);
}

/* D device iterations a host call: each drains, as a call does (D calls of
** the emulator's). With recompute, backward recomputes each layer's forward
** from the stashed version, so the weights must not change. */
static void compare(const pdcase *pc, bool vsync, int D, bool recompute) {
    int workers = 0;
    for (int s = 0; s < pc->P; s++)
        workers += pc->r[s] * pc->R;
    if (mpi && workers != rp_comm_size(mpi))
        return;
    rp_model *m = test_model(spec);
    char json[512], layers[32], reps[32];
    snprintf(layers, sizeof layers, "[%d, %d%s", pc->layers[0], pc->layers[1], pc->P == 3 ? ", " : "]");
    snprintf(reps, sizeof reps, "[%d, %d%s", pc->r[0], pc->r[1], pc->P == 3 ? ", " : "]");
    if (pc->P == 3) {
        snprintf(layers + strlen(layers), sizeof layers - strlen(layers), "%d]", pc->layers[2]);
        snprintf(reps + strlen(reps), sizeof reps - strlen(reps), "%d]", pc->r[2]);
    }
    const double lr = 0.05, mu = 0.9;
    snprintf(json, sizeof json,
             "{\"seed\": 3, \"micro_batch_size\": 4, \"gradient_accumulation_steps\": %d, "
             "\"device_iterations\": %d, "
             "\"replication_factor\": %d, \"layers_per_stage\": %s, \"stage_replication\": %s, "
             "\"schedule\": \"%s\", \"pipedream_vertical_sync\": %s, "
             "\"recompute_checkpoint_every_layer\": %s, "
             "\"optimizer\": {\"type\": \"sgd\", \"lr\": %g, \"momentum\": %g}}",
             pc->GA, D, pc->R, layers, reps, pc->bw ? "pipedream_2bw" : "pipedream",
             vsync ? "true" : "false", recompute ? "true" : "false", lr, mu);
    rp_config cfg = test_config(json);
    rp_session *s;
    rp_error err;
    CHECK_OK(mpi ? rp_session_create_mpi(m, &cfg, mpi, &s, &err) : rp_session_create(m, &cfg, &s, &err),
             err);
    const int calls = 3;
    long long per = rp_session_samples_per_call(s);
    int64_t *ids = malloc(sizeof(int64_t) * per * calls);
    float *x = malloc(sizeof(float) * per * calls * 784);
    int32_t *y = malloc(sizeof(int32_t) * per * calls);
    for (long long i = 0; i < per * calls; i++)
        ids[i] = (i * 37) % data->n;
    rp_dataset_gather(data, ids, (int)(per * calls), x, y);
    for (int call = 0; call < calls; call++) {
        rp_result r;
        CHECK_OK(rp_session_run(s, x + call * per * 784, y + call * per, ids + call * per, &r, &err),
                 err);
    }
    rp_weights *got, *want;
    CHECK_OK(rp_session_get_weights(s, RP_ONE_PER_GROUP, &got, &err), err);
    float *params = malloc(sizeof(float) * m->num_params);
    if (pc->bw)
        emulate_2bw(m, pc, lr, mu, calls * D, x, y, ids, params);
    else
        emulate(m, pc, vsync, lr, mu, calls * D, x, y, ids, params);
    CHECK_OK(rp_weights_from_params(m, params, &want, &err), err);
    double worst = 0, moved = 0;
    float *init = malloc(sizeof(float) * m->num_params);
    rp_model_init_params(m, 0, m->num_layers, 3, NULL, init);
    for (int t = 0; t < got->num_tensors; t++) {
        size_t n = rp_shape_size(&got->tensors[t].shape);
        double d = rp_tensor_rel_diff(got->tensors[t].data, want->tensors[t].data, n);
        worst = d > worst ? d : worst;
        double e = rp_tensor_rel_diff(got->tensors[t].data, init + m->vars[t].offset, n);
        moved = e > moved ? e : moved;
    }
    CHECKF(worst <= 1e-6, "%s%s%s%s P=%d R=%d r=[%d,%d,%d] GA=%d: %g from the emulator",
           pc->bw ? "pipedream_2bw" : "pipedream", vsync ? " (vertical sync)" : "",
           recompute ? " (recompute)" : "", spec == RESIDUAL ? " (residual)" : "", pc->P, pc->R, pc->r[0], pc->r[1], pc->r[2], pc->GA,
           worst);
    CHECK(moved > 1e-3); /* the updates did something */
    ran++;
    free(init), free(params), free(ids), free(x), free(y);
    rp_weights_free(got), rp_weights_free(want);
    rp_session_free(s);
    rp_model_free(m);
}

/* A stage keeps a version of its weights for each micro-batch in flight,
** beside its own; the configurations PipeDream's updates cannot meet are
** refused. */
static void memory_and_refusals(void) {
    rp_model *m = test_model(MLP);
    rp_config c = test_config("{\"micro_batch_size\": 4, \"gradient_accumulation_steps\": 4, "
                              "\"layers_per_stage\": [4, -1], \"schedule\": \"pipedream\"}");
    rp_config sync = c;
    sync.schedule = RP_SCHEDULE_1F1B;
    rp_session *s, *t;
    rp_error err;
    CHECK_OK(rp_session_create(m, &c, &s, &err), err);
    CHECK_OK(rp_session_create(m, &sync, &t, &err), err);
    rp_memory a, b;
    CHECK_OK(rp_session_memory(s, 0, &a, &err), err);
    CHECK_OK(rp_session_memory(t, 0, &b, &err), err);
    /* stage 0 of 2 keeps 2 micro-batches in flight: 2 versions beside its weights */
    CHECK(a.params == 3 * b.params);
    CHECK(a.activations == b.activations);
    rp_session_free(s), rp_session_free(t);
    /* 2BW: two versions; its state is not one a checkpoint holds */
    rp_config bw = c;
    bw.schedule = RP_SCHEDULE_PIPEDREAM_2BW;
    CHECK_OK(rp_session_create(m, &bw, &s, &err), err);
    CHECK_OK(rp_session_memory(s, 0, &a, &err), err);
    CHECK(a.params == 2 * b.params);
    rp_train_state state;
    CHECK(rp_session_get_state(s, &state, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "\"pipedream_2bw\" keeps two, so it cannot be checkpointed yet");
    rp_session_free(s);
    bw.replicated_tensor_sharding = true;
    bw.replication_factor = 2;
    bw.replica_grouping.group_size = 2;
    CHECK(rp_session_create(m, &bw, &s, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "schedule \"pipedream_2bw\" does not go with replicated_tensor_sharding");
    static const struct {
        const char *json, *msg;
    } bad[] = {
        {"\"gradient_clipping\": 1", "schedule \"pipedream\" does not go with gradient_clipping"},
        {"\"replicated_tensor_sharding\": true, \"replication_factor\": 2",
         "does not go with replicated_tensor_sharding"},
        {"\"stage_replication\": [3, 1]",
         "stage 0's 3 replicas update together, so gradient_accumulation_steps (4) must be a "
         "multiple of 3"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char json[400];
        snprintf(json, sizeof json,
                 "{\"micro_batch_size\": 4, \"gradient_accumulation_steps\": 4, "
                 "\"layers_per_stage\": [4, -1], \"schedule\": \"pipedream\", %s}",
                 bad[k].json);
        rp_config cb = test_config(json);
        CHECK(rp_session_create(m, &cb, &s, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, bad[k].msg);
    }
    rp_model_free(m);
}

int main(int argc, char **argv) {
    test_start(argc, argv, 512, 9, &data, &mpi);
    spec = MLP;
    static const pdcase CASES[] = {
        {2, 1, {1, 1}, {4, 3}, 4, false},       {2, 2, {1, 1}, {4, 3}, 4, false},
        {2, 1, {2, 1}, {4, 3}, 8, false},       {2, 2, {2, 1}, {4, 3}, 6, false},
        {3, 1, {1, 2, 1}, {2, 2, 3}, 8, false}, {3, 2, {1, 2, 1}, {2, 2, 3}, 6, false},
        {3, 1, {1, 1, 1}, {2, 2, 3}, 8, false},
        /* PipeDream-2BW */
        {2, 1, {1, 1}, {4, 3}, 2, true},        {2, 2, {1, 1}, {4, 3}, 4, true},
        {2, 1, {2, 1}, {4, 3}, 4, true},        {3, 1, {1, 2, 1}, {2, 2, 3}, 2, true},
        {3, 2, {1, 1, 1}, {2, 2, 3}, 4, true},
    };
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        compare(&CASES[k], false, 1, false);
        if (!CASES[k].bw)
            compare(&CASES[k], true, 1, false);
    }
    compare(&CASES[4], true, 2, false);  /* [1, 2, 1], vertical sync: 2 iterations a call */
    compare(&CASES[10], false, 2, false); /* 2BW, [1, 2, 1] */
    /* per-layer recomputation runs on the stashed versions */
    compare(&CASES[3], false, 1, true);  /* [2, 1], R 2 */
    compare(&CASES[5], true, 1, true);   /* [1, 2, 1], R 2, vertical sync */
    compare(&CASES[10], false, 1, true); /* 2BW, [1, 2, 1] */
    /* the same schedules on a graph cut where two tensors cross */
    spec = RESIDUAL;
    static const pdcase GRAPH[] = {
        {2, 1, {2, 1}, {3, 8}, 4, false},       {3, 1, {1, 2, 1}, {3, 2, 6}, 8, false},
        {2, 2, {2, 1}, {3, 8}, 6, false},       {2, 1, {2, 1}, {3, 8}, 4, true},
        {3, 1, {1, 2, 1}, {3, 2, 6}, 2, true},
    };
    for (size_t k = 0; k < sizeof GRAPH / sizeof GRAPH[0]; k++)
        compare(&GRAPH[k], false, 1, false);
    compare(&GRAPH[1], true, 1, true); /* [1, 2, 1], vertical sync, recompute */
    CHECK(ran > 0);
    if (!mpi)
        memory_and_refusals();
    char name[64];
    snprintf(name, sizeof name, "test_pipedream (%s)", mpi ? "mpi" : "local");
    int rc = test_finish(name);
    rp_dataset_free(data);
    if (mpi)
        rp_comm_mpi_finalize(mpi);
    return rc;
}
