/*
** Pipelines: every configuration of the sweep equals one worker on the same
** samples; the schedule checker accepts them all and rejects a hanging op
** list; 1F1B keeps P - s micro-batches in flight at stage s, and with stage
** replication as many as the stage and those after it have workers.
**
**   test_pipeline          local backend: the whole sweep
**   test_pipeline --mpi    under mpirun -np W: the sweep's cases of W workers
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "repipe/data.h"
#include "repipe/schedule.h"
#include "repipe/session.h"
#include "support.h"
#include "test.h"

static const char *MLP = "input 1 28 28\nflatten\nlinear 256\nrelu\nlinear 128\nrelu\n"
                         "linear 10\nsoftmax_cross_entropy\n";
static const char *CNN = "input 1 28 28\nconv2d 4 kernel=3 pad=1\nrelu\nmaxpool2d 2\n"
                         "conv2d 8 kernel=3 pad=1\nrelu\nmaxpool2d 2\nflatten\ndropout 0.2\n"
                         "linear 10\nsoftmax_cross_entropy\n";

static rp_dataset *data;
static rp_comm *mpi;

typedef struct pcase {
    int P, R;
    int r[4];
    int GA;
    const char *schedule;
} pcase;

/* Every axis and corner: P 2 and 3, R 1 and 2, stage replication [2,1],
** [1,3,1], [3,1], [2,2] and [4,3,1], GA 1, 3, 4, 5, 9 (also not multiples
** of r_s), both schedules. */
static const pcase CASES[] = {
    {2, 1, {1, 1}, 1, "1f1b"},    {2, 1, {1, 1}, 3, "gpipe"},   {2, 1, {1, 1}, 4, "1f1b"},
    {2, 1, {1, 1}, 5, "gpipe"},   {2, 2, {1, 1}, 3, "1f1b"},    {2, 2, {1, 1}, 4, "gpipe"},
    {2, 1, {2, 1}, 3, "1f1b"},    {2, 1, {2, 1}, 4, "gpipe"},   {2, 1, {2, 1}, 5, "1f1b"},
    {2, 2, {2, 1}, 5, "gpipe"},   {3, 1, {1, 1, 1}, 1, "gpipe"}, {3, 1, {1, 1, 1}, 4, "1f1b"},
    {3, 1, {1, 1, 1}, 5, "gpipe"}, {3, 1, {1, 3, 1}, 3, "1f1b"}, {3, 1, {1, 3, 1}, 4, "gpipe"},
    {3, 1, {1, 3, 1}, 5, "1f1b"}, {3, 2, {1, 1, 1}, 4, "1f1b"}, {2, 1, {3, 1}, 3, "gpipe"},
    {2, 1, {3, 1}, 4, "1f1b"},    {2, 1, {3, 1}, 5, "gpipe"},   {2, 2, {3, 1}, 5, "1f1b"},
    {2, 1, {2, 2}, 9, "1f1b"},    {3, 1, {4, 3, 1}, 9, "1f1b"}, {3, 1, {4, 3, 1}, 5, "gpipe"},
};


static rp_config config(const pcase *pc, bool single, const char *opt) {
    char layers[64] = "[-1", reps[64] = "[1";
    int P = single ? 1 : pc->P;
    for (int s = 1; s < P; s++)
        strcat(layers, ", -1");
    snprintf(reps, sizeof reps, "[%d", single ? 1 : pc->r[0]);
    for (int s = 1; s < P; s++)
        snprintf(reps + strlen(reps), sizeof reps - strlen(reps), ", %d", pc->r[s]);
    char json[1024];
    snprintf(json, sizeof json,
             "{\"seed\": 3, \"micro_batch_size\": 4, \"gradient_accumulation_steps\": %d, "
             "\"replication_factor\": %d, \"layers_per_stage\": %s], \"stage_replication\": %s], "
             "\"schedule\": \"%s\", \"output_mode\": \"all\", \"optimizer\": %s}",
             single ? pc->GA * pc->R : pc->GA, single ? 1 : pc->R, layers, reps,
             single && strncmp(pc->schedule, "dualpipe", 8) == 0 ? "1f1b" : pc->schedule, opt);
    return test_config(json);
}

/* One host call on the same samples for every layout; its losses, and the
** last update's learning rate and gradient norm (when asked), come back. */
static rp_weights *train(const rp_model *m, const rp_config *c, bool use_mpi, float *losses,
                         double *lr_norm) {
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
    for (long long i = 0; i < per; i++)
        ids[i] = (i * 7) % data->n;
    rp_dataset_gather(data, ids, (int)per, x, y);
    rp_result r;
    CHECK(rp_session_run(s, x, y, ids, &r, &err) == RP_OK);
    if (losses)
        memcpy(losses, r.losses, sizeof(float) * r.count);
    if (lr_norm)
        rp_session_last_update(s, &lr_norm[0], &lr_norm[1]);
    rp_weights *w;
    CHECK(rp_session_get_weights(s, RP_ONE_PER_GROUP, &w, &err) == RP_OK);
    free(ids), free(x), free(y);
    rp_session_free(s);
    return w;
}

static void sweep(bool use_mpi, int only_workers) {
    const char *sgd = "{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}";
    int run = 0;
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        const pcase *pc = &CASES[k];
        if (only_workers && test_workers(pc->P, pc->r, pc->R) != only_workers)
            continue;
        for (int mi = 0; mi < 2; mi++) {
            rp_model *m = test_model(mi ? CNN : MLP);
            rp_config pipe = config(pc, false, sgd), one = config(pc, true, sgd);
            float lp[64], lo[64];
            rp_weights *a = train(m, &pipe, use_mpi, lp, NULL);
            rp_weights *b = train(m, &one, false, lo, NULL);
            if (a && b) {
                double d = test_weights_diff(a, b);
                test_checks++;
                if (!(d <= 1e-5)) {
                    fprintf(stderr, "%s P=%d R=%d r=[%d,%d,%d] GA=%d %s: differs by %g\n",
                            mi ? "cnn" : "mlp", pc->P, pc->R, pc->r[0], pc->r[1], pc->r[2],
                            pc->GA, pc->schedule, d);
                    test_failures++;
                }
                /* the first update's losses: [1][R][GA] == [1][1][R*GA] */
                size_t bad = 0;
                for (int i = 0; i < pc->R * pc->GA; i++)
                    bad += fabs(lp[i] - lo[i]) > 1e-6 * (1 + fabs(lo[i]));
                CHECK(bad == 0);
            }
            rp_weights_free(a), rp_weights_free(b);
            rp_model_free(m);
            run++;
        }
    }
    CHECK(run > 0);
    printf("%d pipeline configurations compared with one worker\n", run);
}

/* Gradient clipping by the global norm and a cosine schedule with warm-up,
** over three updates in one host call: the pipeline equals one worker, the
** clip was active (the norm is above it), and the last update's learning
** rate is the schedule's. The norm sums every stage's and replica's share
** once, so a clipped pipeline update is the clipped single-worker one. */
static void clipped(bool use_mpi, int only_workers) {
    static const pcase picks[] = {
        {2, 2, {2, 1}, 3, "1f1b"}, {3, 1, {1, 3, 1}, 4, "gpipe"}, {2, 2, {1, 1}, 3, "gpipe"},
        {2, 1, {3, 1}, 4, "1f1b"},
    };
    const char *opt = "{\"type\": \"sgd\", \"lr\": 0.2, \"momentum\": 0.9}, "
                      "\"gradient_clipping\": 0.25, \"device_iterations\": 3, "
                      "\"lr_schedule\": {\"type\": \"cosine\", \"warmup_updates\": 1, "
                      "\"decay_updates\": 4, \"min_lr\": 0.01}";
    int run = 0;
    for (size_t k = 0; k < sizeof picks / sizeof picks[0]; k++) {
        const pcase *pc = &picks[k];
        if (only_workers && test_workers(pc->P, pc->r, pc->R) != only_workers)
            continue;
        rp_model *m = test_model(MLP);
        rp_config pipe = config(pc, false, opt), one = config(pc, true, opt);
        rp_weights *a = train(m, &pipe, use_mpi, NULL, NULL);
        rp_weights *b = train(m, &one, false, NULL, NULL);
        if (a && b) {
            double d = test_weights_diff(a, b);
            if (!(d <= 1e-5))
                fprintf(stderr, "clipped P=%d R=%d r=[%d,%d,%d] GA=%d: differs by %g\n", pc->P,
                        pc->R, pc->r[0], pc->r[1], pc->r[2], pc->GA, d);
            CHECK(d <= 1e-5);
        }
        rp_weights_free(a), rp_weights_free(b);
        rp_model_free(m);
        run++;
    }
    /* on one worker: the norm it clipped at, the rate of update 2 */
    rp_model *m = test_model(MLP);
    rp_config one = config(&picks[0], true, opt);
    double last[2];
    rp_weights_free(train(m, &one, false, NULL, last));
    double lr = last[0], norm = last[1];
    CHECK(norm > 0.25); /* the clip was active */
    /* update 2: (2 - 1) / (4 - 1) of the way down the cosine */
    double want = 0.01 + 0.5 * (1 + cos(3.14159265358979323846 / 3)) * (0.2 - 0.01);
    CHECK(fabs(lr - want) < 1e-12);
    CHECK(fabs(rp_config_lr(&one, 0) - 0.2) < 1e-15); /* warm-up of one update: full rate */
    CHECK(rp_config_lr(&one, 7) == 0.01);
    rp_model_free(m);
    CHECK(run > 0);
    printf("%d clipped, scheduled pipelines compared with one worker\n", run);
}

/* A language model of tokens: embedding, positions, a per-token output layer
** and a target per token (the next one). Pipelined, replicated and
** accumulated, it equals one worker on the same samples, the loss of a
** sample being the mean over its tokens. The GPT variant has two
** transformer blocks with dropout and a cosine schedule, and runs two
** updates; the MoE variant, the same with LLaMA-family blocks whose MLP is
** a mixture of 4 experts, 2 a token, with the balance loss. */
enum { LM, GPT, MOE };
static void tokens(bool use_mpi, int only_workers, int kind) {
    static const char *LM_TEXT = "input 8\nembedding 13 6\nposition_embedding\ngelu\n"
                            "linear 13\nsoftmax_cross_entropy\n";
    /* GPT-2's head: the embedding's table again, on the last stage */
    static const char *GPT_TEXT = "input 8\nembedding 13 8 std=0.3\nposition_embedding\n"
                             "transformer_block heads=2 dropout=0.1\n"
                             "transformer_block heads=2 mlp=2 dropout=0.1\nlayernorm\n"
                             "linear 13 bias=false tie=0\nsoftmax_cross_entropy\n";
    static const char *MOE_GPT =
        "input 8\nembedding 13 8 std=0.3\nx = position_embedding\nrmsnorm\n"
        "linear 24 bias=false\nattention heads=2\no = linear 8 bias=false\nx1 = add < o x\n"
        "n = rmsnorm\nm = moe experts=4 top_k=2 ffn=6 balance=0.1\nx2 = add < m x1\nrmsnorm\n"
        "linear 24 bias=false\nattention heads=2\no2 = linear 8 bias=false\nx3 = add < o2 x2\n"
        "n2 = rmsnorm\nm2 = moe experts=4 top_k=2 ffn=6 gate=sigmoid balance=0.1\n"
        "add < m2 x3\nrmsnorm\nlinear 13 bias=false\nsoftmax_cross_entropy\n";
    const char *const SPECS[] = {LM_TEXT, GPT_TEXT, MOE_GPT};
    bool gpt = kind != LM;
    static const pcase lm_picks[] = {
        {2, 2, {1, 1}, 3, "1f1b"}, {2, 1, {2, 1}, 4, "gpipe"}, {3, 1, {1, 2, 1}, 3, "1f1b"}};
    static const pcase gpt_picks[] = {{2, 2, {1, 1}, 1, "1f1b"}, {2, 1, {2, 1}, 4, "gpipe"},
                                      {2, 2, {2, 1}, 4, "1f1b"}, {3, 1, {1, 2, 1}, 4, "1f1b"},
                                      {3, 2, {1, 1, 1}, 1, "gpipe"}};
    /* and with expert parallelism: the experts over 2 or 4 replicas, one group or two */
    static const pcase moe_picks[] = {{2, 2, {1, 1}, 1, "1f1b"},  {2, 1, {2, 1}, 4, "gpipe"},
                                      {2, 2, {1, 1}, 3, "1f1b"},  {2, 2, {1, 1}, 4, "zb-h1"},
                                      {1, 4, {1}, 2, "gpipe"},    {1, 4, {1}, 3, "1f1b"},
                                      {3, 2, {1, 1, 1}, 2, "gpipe"}, {2, 2, {1, 1}, 2, "1f1b"},
                                      {4, 2, {1, 1, 1, 1}, 4, "dualpipev"},
                                      {2, 2, {2, 1}, 4, "1f1b"},  {2, 2, {1, 1}, 4, "dualpipe"},
                                      {4, 2, {1, 1, 1, 1}, 8, "dualpipe"}};
    static const int moe_ep[] = {1, 1, 2, 2, 4, 2, 2, 2, 2, 2, 2, 2}; /* expert_parallel of each */
    int moe_tp = 7; /* the pick with tensor groups of 2 too: 8 workers */
    const pcase *picks = kind == MOE ? moe_picks : gpt ? gpt_picks : lm_picks;
    size_t npicks = kind == MOE ? sizeof moe_picks / sizeof *moe_picks
                    : gpt       ? sizeof gpt_picks / sizeof *gpt_picks
                                : sizeof lm_picks / sizeof *lm_picks;
    /* SGD for the GPT: a key bias's gradient is zero up to rounding (softmax
    ** ignores a constant added to a row's scores), which Adam would scale up */
    const char *adam = gpt ? "{\"type\": \"sgd\", \"lr\": 0.1, \"momentum\": 0.9}, \"gradient_clipping\": 1, "
                             "\"lr_schedule\": {\"type\": \"cosine\", \"warmup_updates\": 1, "
                             "\"decay_updates\": 3, \"min_lr\": 0.001}"
                           : "{\"type\": \"adam\", \"lr\": 0.01}, \"gradient_clipping\": 1";
    int run = 0;
    for (size_t k = 0; k < npicks; k++) {
        const pcase *pc = &picks[k];
        /* MPI ranks: a rank a worker, or a device of two chunks (the V and DualPipe) */
        int ranks = strncmp(pc->schedule, "dualpipe", 8) == 0 ? pc->P * pc->R / 2
                                                               : test_workers(pc->P, pc->r, pc->R);
        if (only_workers && (ranks != only_workers || (kind == MOE && (int)k == moe_tp)))
            continue; /* (the tensor groups' workers are not test_workers') */
        rp_model *m = test_model(SPECS[kind]);
        CHECK_INT(m->num_targets, 8);
        rp_config pipe = config(pc, false, adam), one = config(pc, true, adam);
        int ep = kind == MOE ? moe_ep[k] : 1;
        pipe.expert_parallel = ep;
        pipe.tensor_parallel = kind == MOE && (int)k == moe_tp ? 2 : 1;
        if (gpt) { /* one micro-batch of them all: rows differ, dropout must not */
            one.micro_batch_size *= one.gradient_accumulation_steps;
            one.gradient_accumulation_steps = 1;
        }
        rp_weights *w[2];
        float first[2];
        for (int v = 0; v < 2; v++) {
            rp_session *s;
            rp_error err;
            const rp_config *c = v ? &one : &pipe;
            CHECK_OK(v || !use_mpi ? rp_session_create(m, c, &s, &err)
                                   : rp_session_create_mpi(m, c, mpi, &s, &err),
                     err);
            long long per = rp_session_samples_per_call(s);
            float *x = malloc(sizeof(float) * per * 8);
            int32_t *y = malloc(sizeof(int32_t) * per * 8);
            int64_t *ids = malloc(sizeof(int64_t) * per);
            for (long long i = 0; i < per; i++) { /* a text of 13 symbols: next = f(this) */
                ids[i] = i;
                for (int t = 0; t < 8; t++) {
                    int tok = (int)((i * 5 + t * 3) % 13);
                    x[i * 8 + t] = (float)tok;
                    y[i * 8 + t] = (tok * 7 + 2) % 13;
                }
            }
            /* the loss of the first micro-batch before the update, as a validation
            ** loss, against the one the update measured */
            double before = 0, all = 0;
            CHECK_OK(rp_session_loss(s, x, y, v ? one.micro_batch_size : pipe.micro_batch_size,
                                     &before, &err),
                     err);
            CHECK_OK(rp_session_loss(s, x, y, (int)per, &all, &err), err);
            rp_result r;
            CHECK_OK(rp_session_run(s, x, y, ids, &r, &err), err);
            first[v] = r.losses[0];
            double mean = 0; /* equal micro-batches: the mean of their means */
            for (int i = 0; i < r.count; i++)
                mean += r.losses[i] / r.count;
            CHECKF(gpt || /* dropout: training's loss is not inference's */
                       (fabs(before - r.losses[0]) <= 1e-6 * fabs(before) &&
                        fabs(all - mean) <= 1e-6 * fabs(all)),
                   "loss %.9g and %.9g, the update's %.9g and %.9g", before, all, r.losses[0],
                   mean);
            for (int u = 0; u < (kind == MOE ? 4 : gpt); u++) { /* updates 2 to 5: other samples */
                for (long long i = 0; i < per; i++)
                    ids[i] += per;
                rp_result r2;
                CHECK_OK(rp_session_run(s, x, y, ids, &r2, &err), err);
            }
            CHECK_OK(rp_session_get_weights(s, RP_ONE_PER_GROUP, &w[v], &err), err);
            free(x), free(y), free(ids);
            rp_session_free(s);
        }
        for (int v = 0; kind == GPT && v < 2; v++) { /* the tie held: one table, two copies */
            const rp_tensor *e = rp_weights_find(w[v], "0.weight"), *h = rp_weights_find(w[v], "5.weight");
            CHECK(e && h && memcmp(e->data, h->data, sizeof(float) * 13 * 8) == 0);
        }
        double d = test_weights_diff(w[0], w[1]);
        CHECKF(d <= 1e-5, "%s P=%d R=%d r=[%d,%d,%d] GA=%d ep=%d: differs by %g", SPECS[kind],
               pc->P, pc->R, pc->r[0], pc->r[1], pc->r[2], pc->GA, ep, d);
        CHECK(first[0] > 2.0f && first[0] < 3.5f); /* about log 13: per token, not per sample */
        rp_weights_free(w[0]), rp_weights_free(w[1]);
        rp_model_free(m);
        run++;
    }
    CHECK(run > 0);
    static const char *const NAMES[] = {"token-model", "GPT", "MoE GPT"};
    printf("%d %s pipelines compared with one worker\n", run, NAMES[kind]);
}

/* What expert parallelism cannot be, each refused with its reason. */
static void expert_refusals(void) {
    static const struct {
        const char *spec, *json, *msg;
    } cases[] = {
        {"input 4\nembedding 9 6\nmoe experts=4 ffn=3\nlinear 9\nsoftmax_cross_entropy\n",
         "{\"replication_factor\": 3, \"expert_parallel\": 2}",
         "expert_parallel 2 does not divide replication_factor"},
        {"input 4\nembedding 9 6\nmoe experts=4 ffn=3\nlinear 9\nsoftmax_cross_entropy\n",
         "{\"replication_factor\": 2, \"expert_parallel\": 2, \"schedule\": \"pipedream\"}",
         "needs a synchronous schedule (not pipedream or pipedream-2bw"},
        {"input 4\nembedding 9 6\nmoe experts=3 ffn=3\nlinear 9\nsoftmax_cross_entropy\n",
         "{\"replication_factor\": 2, \"expert_parallel\": 2}",
         "layer 1 (moe, line 3) has a number of experts it does not divide"},
        {"input 4\nembedding 9 6\nmoe experts=4 ffn=3\nlinear 9\nsoftmax_cross_entropy\n",
         "{\"replication_factor\": 4, \"expert_parallel\": 2, "
         "\"replica_grouping\": {\"group_size\": 2, \"stride\": 2}}",
         "does not hold whole expert groups"},
        {"input 4\nembedding 9 6\nlinear 9\nsoftmax_cross_entropy\n",
         "{\"replication_factor\": 2, \"expert_parallel\": 2}", "the model has no moe layer"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        rp_model *m = test_model(cases[k].spec);
        rp_config c = test_config(cases[k].json);
        rp_session *s;
        rp_error err;
        CHECK(rp_session_create(m, &c, &s, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, cases[k].msg);
        rp_model_free(m);
    }
}

/* What a tie cannot be: sharded apart, or shared by some replicas only. */
static void tie_refusals(void) {
    rp_model *m = test_model("input 4\nembedding 9 6\nlinear 9 bias=false tie=0\n"
                             "softmax_cross_entropy\n");
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"{\"replication_factor\": 2, \"replicated_tensor_sharding\": true}",
         "layer 1 (linear, line 3) tie=0: replicated_tensor_sharding would shard the two copies "
         "apart"},
        {"{\"replication_factor\": 4, \"replica_grouping\": {\"group_size\": 2}}",
         "tie=0: its copies must be shared by every replica"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        rp_config c = test_config(cases[k].json);
        rp_session *s;
        rp_error err;
        CHECK(rp_session_create(m, &c, &s, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, cases[k].msg);
    }
    /* weights whose two copies differ would stay apart: refused, the session untouched */
    rp_config c = test_config("{\"layers_per_stage\": [1, -1]}");
    rp_session *s;
    rp_error err;
    rp_weights *w;
    CHECK_OK(rp_session_create(m, &c, &s, &err), err);
    CHECK_OK(rp_session_get_weights(s, RP_ONE_PER_GROUP, &w, &err), err);
    CHECK_OK(rp_session_set_weights(s, w, RP_ONE_PER_GROUP, &err), err);
    rp_tensor *h = (rp_tensor *)rp_weights_find(w, "1.weight");
    h->data[5] += 1;
    CHECK(rp_session_set_weights(s, w, RP_ONE_PER_GROUP, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "weights: '0.weight' and '1.weight' are tied, one tensor, but the "
                           "file holds two different ones");
    rp_weights_free(w);
    rp_session_free(s);
    rp_model_free(m);
}

/* A pipeline twice: the same bits. */
static void determinism(void) {
    rp_model *m = test_model(CNN);
    pcase pc = {3, 2, {1, 3, 1}, 5, "1f1b"};
    rp_config c = config(&pc, false, "{\"type\": \"adam\", \"lr\": 0.001}");
    rp_weights *a = train(m, &c, false, NULL, NULL), *b = train(m, &c, false, NULL, NULL);
    CHECK(test_weights_diff(a, b) == 0);
    rp_weights_free(a), rp_weights_free(b);
    rp_model_free(m);
}

/* Stage replication: stage s keeps one micro-batch in flight for every
** worker of stages s..P-1 of its replica, spread over its r_s replicas, so
** each stage replica holds ceil((r_s + ... + r_{P-1}) / r_s) of them. The
** tables are that rule worked by hand; [4, 3, 1] hangs PipeDream's
** runtime. */
static void in_flight(void) {
    static const struct {
        int P, r[3], slots[3];
    } T[] = {
        {2, {7, 1}, {2, 1}},       /* 8 / 7, 1 / 1 */
        {2, {3, 1}, {2, 1}},       /* 4 / 3 */
        {3, {1, 3, 1}, {5, 2, 1}}, /* 5 / 1, 4 / 3 */
        {2, {2, 2}, {2, 1}},       /* 4 / 2, 2 / 2: two 2-stage pipelines */
        {3, {4, 3, 1}, {2, 2, 1}}, /* 8 / 4, 4 / 3 */
    };
    for (size_t k = 0; k < sizeof T / sizeof T[0]; k++)
        for (int R = 1; R <= 2; R++) {
            pcase pc = {T[k].P, R, {T[k].r[0], T[k].r[1], T[k].r[2]}, 24, "1f1b"};
            rp_config c = config(&pc, false, "{\"type\": \"sgd\"}");
            rp_workplan *p;
            rp_error err;
            CHECK(rp_workplan_build(&c, &p, &err) == RP_OK);
            CHECK(rp_workplan_check(p, NULL, &err) == RP_OK);
            for (int w = 0; w < p->workers; w++)
                CHECK_INT(p->w[w].slots, T[k].slots[p->w[w].stage]);
            rp_workplan_free(p);
            /* fewer micro-batches than the rule asks for: all in flight,
            ** one each where a replica gets only one */
            pc.GA = 3;
            c = config(&pc, false, "{\"type\": \"sgd\"}");
            CHECK(rp_workplan_build(&c, &p, &err) == RP_OK);
            CHECK(rp_workplan_check(p, NULL, &err) == RP_OK);
            for (int w = 0; w < p->workers; w++) {
                int s = p->w[w].stage, r = T[k].r[s], mine = 0;
                for (int m = 0; m < 3; m++)
                    mine += m % r == p->w[w].stage_replica;
                int want = mine < T[k].slots[s] ? mine : T[k].slots[s];
                CHECK_INT(p->w[w].slots, want);
            }
            rp_workplan_free(p);
        }
}

static void checker(void) {
    /* every configuration of the sweep is accepted */
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        rp_config c = config(&CASES[k], false, "{\"type\": \"sgd\"}");
        rp_workplan *p;
        rp_error err;
        CHECK(rp_workplan_build(&c, &p, &err) == RP_OK);
        CHECK(rp_workplan_check(p, NULL, &err) == RP_OK);
        rp_workplan_free(p);
    }
    /* 1F1B: at most P - s micro-batches in flight at stage s (r = 1);
    ** GPipe keeps all GA */
    for (int P = 2; P <= 4; P++) {
        pcase pc = {P, 1, {1, 1, 1}, 8, "1f1b"};
        char json[256];
        snprintf(json, sizeof json,
                 "{\"gradient_accumulation_steps\": 8, \"ipus_per_replica\": %d, "
                 "\"schedule\": \"1f1b\"}",
                 P);
        (void)pc;
        rp_config c;
        rp_error err;
        CHECK(rp_config_load_string(&c, json, strlen(json), "t", &err) == RP_OK);
        rp_workplan *p;
        CHECK(rp_workplan_build(&c, &p, &err) == RP_OK);
        for (int s = 0; s < P; s++)
            CHECK_INT(p->w[s].slots, P - s);
        rp_workplan_free(p);
        c.schedule = RP_SCHEDULE_GPIPE;
        CHECK(rp_workplan_build(&c, &p, &err) == RP_OK);
        for (int s = 0; s < P; s++)
            CHECK_INT(p->w[s].slots, 8);
        rp_workplan_free(p);
    }
    in_flight();
    /* a crafted list that hangs: stage 1 wants micro-batch 1 before 0, but
    ** stage 0 waits for 0's gradient before sending 1 */
    rp_config c;
    rp_error err;
    const char *json = "{\"gradient_accumulation_steps\": 2, \"ipus_per_replica\": 2, "
                       "\"schedule\": \"gpipe\"}";
    CHECK(rp_config_load_string(&c, json, strlen(json), "t", &err) == RP_OK);
    rp_workplan *p;
    CHECK(rp_workplan_build(&c, &p, &err) == RP_OK);
    rp_op stage0[] = {{RP_OP_FORWARD, 0, -1, 0},   {RP_OP_SEND_ACT, 0, 1, -1},
                      {RP_OP_RECV_GRAD, 0, 1, -1}, {RP_OP_BACKWARD, 0, -1, 0},
                      {RP_OP_FORWARD, 1, -1, 0},   {RP_OP_SEND_ACT, 1, 1, -1},
                      {RP_OP_RECV_GRAD, 1, 1, -1}, {RP_OP_BACKWARD, 1, -1, 0}};
    rp_op stage1[] = {{RP_OP_RECV_ACT, 1, 0, -1}, {RP_OP_FORWARD, 1, -1, 0},
                      {RP_OP_RECV_ACT, 0, 0, -1}, {RP_OP_FORWARD, 0, -1, 1},
                      {RP_OP_BACKWARD, 0, -1, 1}, {RP_OP_SEND_GRAD, 0, 0, -1},
                      {RP_OP_BACKWARD, 1, -1, 0}, {RP_OP_SEND_GRAD, 1, 0, -1}};
    memcpy(p->w[0].ops, stage0, sizeof stage0);
    p->w[0].num_ops = 8;
    memcpy(p->w[1].ops, stage1, sizeof stage1);
    p->w[1].num_ops = 8;
    CHECK(rp_workplan_check(p, NULL, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "schedule would hang");
    CHECK_STR_HAS(err.msg, "receive");
    /* and a send nobody receives */
    p->w[1].num_ops = 0;
    p->w[0].num_ops = 2;
    CHECK(rp_workplan_check(p, NULL, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "never received");
    rp_workplan_free(p);
}

int main(int argc, char **argv) {
    rp_error err;
    rp_shape shape = {3, {1, 28, 28}};
    if (rp_dataset_synthetic(&data, 512, shape, 10, 9, &err) != RP_OK)
        return 1;
    int rc;
    if (argc > 1 && strcmp(argv[1], "--mpi") == 0) {
        if (rp_comm_mpi_init(&argc, &argv, &mpi, &err))
            return 1;
        sweep(true, rp_comm_size(mpi));
        clipped(true, rp_comm_size(mpi));
        tokens(true, rp_comm_size(mpi), LM);
        tokens(true, rp_comm_size(mpi), GPT);
        tokens(true, rp_comm_size(mpi), MOE);
        char name[64];
        snprintf(name, sizeof name, "test_pipeline (mpi rank %d)", rp_comm_rank(mpi));
        rc = test_finish(name);
        rp_comm_mpi_finalize(mpi);
    } else {
        checker();
        sweep(false, 0);
        clipped(false, 0);
        tokens(false, 0, LM);
        tokens(false, 0, GPT);
        tokens(false, 0, MOE);
        tie_refusals();
        expert_refusals();
        determinism();
        rc = test_finish("test_pipeline (local)");
    }
    rp_dataset_free(data);
    return rc;
}
