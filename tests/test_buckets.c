/*
** A reduction in buckets (reduction_bucket_mb): the sums start during the
** update's last backward, a bucket at a time from the last layer down, and
** end as the one reduction after it would. Each element is summed by the
** same members in the same order whatever bucket carries it, so every
** configuration's weights and losses equal those of reduction_bucket_mb 0
** bit for bit: data parallelism, pipelines with stage replication,
** zero-bubble, tensor groups, clipping, accumulation, recomputation and
** device iterations; MLP, CNN, a GPT with dropout and a tied head, a LLaMA
** block; buckets smaller than a layer (a layer in pieces) and holding
** several. A trace shows the buckets: as many as the layers' sizes give,
** the first started before the last backward ends.
**
**   test_buckets          local backend: everything
**   test_buckets --mpi    under mpirun -np W: the cases of W workers (two
**                         ranks exchange and add; more, MPI_Iallreduce);
**                         with 4, servers of 2 (workers_per_server) give
**                         the threads' bits
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "repipe/data.h"
#include "repipe/session.h"
#include "support.h"
#include "test.h"

static const char *MLP = TEST_SPEC_MLP;
static const char *CNN = TEST_SPEC_CNN;
static const char *GPT = TEST_SPEC_GPT;
static const char *LLAMA = "input 8\nx = embedding 13 8\nrmsnorm\nlinear 24 bias=false\n"
                           "attention heads=2 kv_heads=2 rope_theta=10000\n"
                           "o = linear 8 bias=false\nx1 = add < o x\nn2 = rmsnorm\n"
                           "linear 12 bias=false\ng = silu\nu = linear 12 bias=false < n2\n"
                           "mul < g u\nd = linear 8 bias=false\nadd < d x1\n"
                           "linear 13 bias=false\nsoftmax_cross_entropy\n";

static rp_dataset *data;
static rp_comm *mpi;

typedef struct bcase {
    int P, R, r[4], GA, T; /* T: tensor_parallel (LLaMA and GPT only) */
    const char *extra;
} bcase;

static const bcase CASES[] = {
    {1, 2, {1}, 1, 1, ""},
    {1, 4, {1}, 3, 1, ""},
    {1, 2, {1}, 2, 1, ", \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05}"}, /* (fused without) */
    {2, 2, {1, 1}, 4, 1, ""},
    {2, 1, {2, 1}, 4, 1, ", \"schedule\": \"zb-h1\""},
    {2, 2, {1, 1}, 4, 1, ", \"gradient_clipping\": 0.5, \"schedule\": \"zb-h2\""},
    {2, 1, {1, 2}, 4, 1, ", \"auto_loss_scaling\": true"},
    {2, 2, {1, 1}, 4, 1, ", \"device_iterations\": 2, \"recompute_checkpoint_every_layer\": true"},
    {1, 2, {1}, 2, 2, ""},
    /* two chunks a worker: each chunk's replicas sum its buckets, a device
    ** holding two chunks' requests at once (a worker's chunks are
    ** replicated together) */
    {4, 2, {1, 1, 1, 1}, 4, 1, ", \"schedule\": \"interleaved-1f1b\", \"virtual_stages\": 2"},
    {4, 1, {2, 1, 2, 1}, 4, 1, ", \"schedule\": \"interleaved-1f1b\", \"virtual_stages\": 2"},
    {4, 2, {1, 1, 1, 1}, 4, 1, ", \"schedule\": \"zb-v\", \"virtual_stages\": 2"},
    {4, 1, {1, 2, 2, 1}, 8, 1, ", \"schedule\": \"zb-v\", \"virtual_stages\": 2, "
                               "\"gradient_clipping\": 0.5"},
};

static rp_config config(const bcase *bc, double bucket_mb, bool adam) {
    char layers[64] = "[-1", reps[64];
    for (int s = 1; s < bc->P; s++)
        strcat(layers, ", -1");
    snprintf(reps, sizeof reps, "[%d", bc->r[0]);
    for (int s = 1; s < bc->P; s++)
        snprintf(reps + strlen(reps), sizeof reps - strlen(reps), ", %d", bc->r[s]);
    char json[1024];
    snprintf(json, sizeof json,
             "{\"seed\": 3, \"micro_batch_size\": 3, \"gradient_accumulation_steps\": %d, "
             "\"replication_factor\": %d, \"layers_per_stage\": %s], \"stage_replication\": %s], "
             "\"tensor_parallel\": %d, \"output_mode\": \"all\", \"reduction_bucket_mb\": %g, "
             "\"optimizer\": %s%s}",
             bc->GA, bc->R, layers, reps, bc->T, bucket_mb,
             adam ? "{\"type\": \"adam\", \"lr\": 0.01}"
                  : "{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}",
             bc->extra);
    return test_config(json);
}

/* Two calls on other samples; the weights, and every loss, come back. */
static rp_weights *train(const rp_model *m, const rp_config *c, bool tokens, float *losses) {
    return test_two_calls(m, c, tokens, mpi, data, losses);
}

/* The threads or ranks a case takes (a chunked schedule's device holds two
** of its workers). */
static int workers(const bcase *bc) { return test_devices(config(bc, 0, false)); }

static void exact(int only_workers) {
    static const char *const models[] = {"mlp", "cnn", "gpt", "llama"};
    /* 100 bytes: every layer in pieces of 25 floats; 4 kB: several small layers a bucket */
    static const double sizes[] = {1e-4, 4e-3};
    int run = 0;
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        const bcase *bc = &CASES[k];
        if (only_workers && workers(bc) != only_workers)
            continue;
        for (int mi = 0; mi < 4; mi++) {
            if (bc->T > 1 && mi < 2) /* tensor groups split attention and MLP blocks */
                continue;
            if (mi == 3 && bc->P > 2)
                continue;
            bool tokens = mi >= 2;
            rp_model *m = test_model(mi == 0 ? MLP : mi == 1 ? CNN : mi == 2 ? GPT : LLAMA);
            rp_config base = config(bc, 0, mi != 2);
            float l0[128] = {0}, l1[128];
            rp_weights *want = train(m, &base, tokens, l0);
            for (int si = 0; si < 2; si++) {
                rp_config c = config(bc, sizes[si], mi != 2);
                memset(l1, 0, sizeof l1);
                rp_weights *got = train(m, &c, tokens, l1);
                CHECKF(test_same_bits(want, got) && memcmp(l0, l1, sizeof l0) == 0,
                       "%s, buckets of %g MB, P=%d R=%d r=[%d,%d,%d,%d] GA=%d T=%d%s: not the "
                       "bits of one reduction (weights differ by %g)",
                       models[mi], sizes[si], bc->P, bc->R, bc->r[0], bc->r[1], bc->r[2], bc->r[3],
                       bc->GA,
                       bc->T, bc->extra, want && got ? test_weights_diff(want, got) : -1.0);
                rp_weights_free(got);
                run++;
            }
            rp_weights_free(want);
            rp_model_free(m);
        }
    }
    CHECK(run > 0);
    printf("%d runs in buckets equal to one reduction bit for bit\n", run);
}

/* Two replicas of the MLP, GA 2, buckets of 1000 floats: the last backward
** holds 330 (linear 10), then 2080 (linear 32: 2410 held, 3 pieces), then
** 50240 (linear 64: 51 pieces), 54 buckets an update; the first starts while
** that backward runs. */
/* One call of case bc in buckets of mb MB, traced: the trace's text. */
static bool trace_of(const bcase *bc, double mb, char *text, size_t cap) {
    rp_model *m = test_model(MLP);
    rp_config c = config(bc, mb, true);
    rp_error err;
    rp_session *s = test_session(m, &c, NULL);
    CHECK(s != NULL);
    if (!s) {
        rp_model_free(m);
        return false;
    }
    CHECK_OK(rp_session_trace(s, true, &err), err);
    long long per = rp_session_samples_per_call(s);
    float *x = malloc(sizeof(float) * per * 784);
    int32_t *y = malloc(sizeof(int32_t) * per);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    for (long long i = 0; i < per; i++)
        ids[i] = i;
    rp_dataset_gather(data, ids, (int)per, x, y);
    rp_result r;
    CHECK_OK(rp_session_run(s, x, y, ids, &r, &err), err);
    const char *path = "test_buckets.trace.json";
    CHECK_OK(rp_session_write_trace(s, path, &err), err);
    rp_session_free(s);
    free(x), free(y), free(ids);
    rp_model_free(m);
    return test_take_file(path, text, cap) > 0;
}

static void traced(void) {
    static char text[1 << 20];
    bcase bc = {1, 2, {1}, 2, 1, ""};
    CHECK(trace_of(&bc, 4e-3, text, sizeof text));
    /* worker 0: its buckets on track 1000, its last backward (micro-batch 1) on 0 */
    int buckets = 0;
    double first = -1, back_end = -1;
    for (char *p = text; (p = strstr(p, "{\"name\":\"")); p++) {
        char *tid = strstr(p, "\"tid\":"), *ts = strstr(p, "\"ts\":"), *dur = strstr(p, "\"dur\":");
        if (!tid || !ts || !dur)
            break;
        int t = atoi(tid + 6);
        double t0 = atof(ts + 5), t1 = t0 + atof(dur + 6);
        if (t == 1000 && strncmp(p + 9, "reduce bucket ", 14) == 0) {
            buckets++;
            if (first < 0 || t0 < first)
                first = t0;
        } else if (t == 0 && strncmp(p + 9, "backward 1\"", 11) == 0) {
            back_end = t1;
        }
    }
    CHECKF(buckets == 54, "%d buckets in an update, not 54", buckets);
    CHECKF(first >= 0 && back_end > 0 && first < back_end,
           "the first bucket (at %g us) did not start inside the last backward (ending %g us)",
           first, back_end);
    CHECK_STR_HAS(text, "worker 0: its gradients' buckets");
    /* zb-v on 2 devices a replica: device 0 runs chunks 0 and 3, device 1
    ** chunks 1 and 2; their buckets (of 1000 floats) on the devices' bucket
    ** tracks, named after their stages */
    bcase v = {4, 2, {1, 1, 1, 1}, 4, 1, ", \"schedule\": \"zb-v\", \"virtual_stages\": 2"};
    CHECK(trace_of(&v, 4e-3, text, sizeof text));
    CHECK_STR_HAS(text, "\"tid\":1000,\"args\":{\"name\":\"worker 0: its chunks' gradients' buckets\"}");
    int on[2][4] = {{0}};
    for (char *p = text; (p = strstr(p, "{\"name\":\"reduce bucket ")); p++) {
        char *tid = strstr(p, "\"tid\":"), *st = strstr(p, " (stage "); /* "reduce bucket K (stage S)" */
        int stage = st && tid && st < tid ? atoi(st + 8) : -1, t = tid ? atoi(tid + 6) - 1000 : -1;
        if (t >= 0 && t < 2 && stage >= 0 && stage < 4)
            on[t][stage]++;
    }
    CHECKF(on[0][0] + on[0][3] > 0 && on[1][1] + on[1][2] > 0 && on[0][1] + on[0][2] == 0 &&
               on[1][0] + on[1][3] == 0,
           "bucket tracks: device 0's stages 0-3 %d, %d, %d, %d; device 1's %d, %d, %d, %d",
           on[0][0], on[0][1], on[0][2], on[0][3], on[1][0], on[1][1], on[1][2], on[1][3]);
}

/* What cannot go with buckets yet is refused, naming it. */
static void refused(void) {
    rp_model *m = test_model(MLP);
    static const char *const why[][2] = {
        {"\"replicated_tensor_sharding\": true", "replicated_tensor_sharding"},
        {"\"fp16_exchange\": true, \"layers_per_stage\": [3, -1]", "fp16_exchange"},
        {"\"schedule\": \"pipedream\", \"layers_per_stage\": [3, -1]", "PipeDream"},
    };
    for (int i = 0; i < 3; i++) {
        char json[256];
        snprintf(json, sizeof json,
                 "{\"replication_factor\": 2, \"reduction_bucket_mb\": 1, %s}", why[i][0]);
        rp_config c = test_config(json);
        rp_error err;
        CHECK(rp_session_check(m, &c, &err) == RP_ERR_INVALID);
        CHECK_STR_HAS(err.msg, "reduction_bucket_mb does not go with");
        CHECK_STR_HAS(err.msg, why[i][1]);
    }
    rp_config c;
    rp_error err;
    const char *bad = "{\"reduction_bucket_mb\": -1}";
    CHECK(rp_config_load_string(&c, bad, strlen(bad), "bad.json", &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "reduction_bucket_mb");
    bad = "{\"workers_per_server\": -2}";
    CHECK(rp_config_load_string(&c, bad, strlen(bad), "bad.json", &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "workers_per_server");
    rp_model_free(m);
}

/* workers_per_server 2 on 4 ranks: data parallelism's sums go inside each
** server of two, across, and back, in worker order: the bits of the same
** run on threads (whose sums are in member order), with and without
** buckets. The flat MPI allreduce of 4 ranks groups its sums its own way. */
static void servers(void) {
    static const char *const models[] = {"mlp", "cnn", "gpt"};
    int equal = 0, flat_equal = 0;
    for (int mi = 0; mi < 3; mi++) {
        rp_model *m = test_model(mi == 0 ? MLP : mi == 1 ? CNN : GPT);
        bool tokens = mi == 2;
        for (int bi = 0; bi < 2; bi++) {
            bcase bc = {1, 4, {1}, 2, 1, ", \"workers_per_server\": 2"};
            rp_config c = config(&bc, bi ? 4e-3 : 0, mi != 2);
            bcase flat = {1, 4, {1}, 2, 1, ""};
            rp_config cf = config(&flat, bi ? 4e-3 : 0, mi != 2);
            float l0[128] = {0}, l1[128] = {0}, l2[128] = {0};
            rp_comm *keep = mpi;
            mpi = NULL; /* the same run on threads, in this process */
            rp_weights *want = train(m, &c, tokens, l0);
            mpi = keep;
            rp_weights *got = train(m, &c, tokens, l1);
            rp_weights *flat_got = train(m, &cf, tokens, l2);
            CHECKF(test_same_bits(want, got) && memcmp(l0, l1, sizeof l0) == 0,
                   "%s, workers_per_server 2%s: MPI's sums not the threads' bits (weights differ "
                   "by %g)",
                   models[mi], bi ? ", buckets" : "", want && got ? test_weights_diff(want, got) : -1.0);
            equal += test_same_bits(want, got);
            flat_equal += test_same_bits(want, flat_got);
            rp_weights_free(want), rp_weights_free(got), rp_weights_free(flat_got);
        }
        rp_model_free(m);
    }
    printf("4 ranks on 2 servers: %d of 6 runs the threads' bits (flat MPI: %d of 6)\n", equal,
           flat_equal);
}

static void with_mpi(int ranks) {
    exact(ranks);
    if (ranks == 4)
        servers();
}

static void local(void) {
    refused();
    traced();
    exact(0);
}

int main(int argc, char **argv) {
    test_start(argc, argv, 512, 11, &data, &mpi);
    return test_main("test_buckets", mpi, data, with_mpi, local);
}
