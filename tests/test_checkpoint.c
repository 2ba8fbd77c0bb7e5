/*
** Resuming from a session's whole training state (rp_train_state):
**
**   the same layout: 20 updates straight equal 10, a new session given the
**       state of the first, and 10 more, bit for bit (weights, optimizer
**       state, counters), for SGD with momentum, Adam with replicated tensor
**       sharding, offchip state, auto loss scaling with fp16 exchange,
**       dropout and GA > 1;
**   another layout (R 2 -> 4, one stage -> two with [2, 1] replication,
**       sharding on -> off, local -> MPI): within 1e-5 of a tensor's scale,
**       the order of sums being the only difference;
**   a state that does not fit the session is refused, naming the tensor.
**
** With --mpi (under mpirun -np 4) the same on MPI ranks, and from a local
** session's state onto ranks.
*/
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "repipe/checkpoint.h"
#include "repipe/data.h"
#include "repipe/session.h"
#include "../src/core/util.h"
#include "support.h"
#include "test.h"

static const char *MLP = "input 1 28 28\nflatten\nlinear 96\nrelu\ndropout 0.1\nlinear 37\n"
                         "relu\nlinear 10\nsoftmax_cross_entropy\n";
/* Under ThreadSanitizer (REPIPE_TEST_NARROW, set by its build's tests) the
** first layer is 24 wide: the same workers, states and files, a quarter of
** the arithmetic the sanitizer's instrumented loops walk. */
static const char *NARROW = "input 1 28 28\nflatten\nlinear 24\nrelu\ndropout 0.1\nlinear 37\n"
                            "relu\nlinear 10\nsoftmax_cross_entropy\n";

/* A graph with batchnorm: a residual block whose skip crosses a cut at 3;
** the running statistics are part of the state to resume. */
static const char *RESNET = "input 1 28 28\nconv2d 4 kernel=3 pad=1 stride=2 bias=false\n"
                            "r0 = relu\nconv2d 4 kernel=3 pad=1 bias=false\nbatchnorm2d\n"
                            "b = relu\nadd < b r0\nflatten\nlinear 10\n"
                            "softmax_cross_entropy\n";
static const char *spec = NULL; /* resume()'s model: MLP unless set */

static rp_dataset *data;
static rp_comm *mpi;

static rp_config config(const char *layout, const char *opt, const char *extra) {
    char json[1024];
    snprintf(json, sizeof json, "{\"seed\": 11, %s, \"optimizer\": %s%s%s}", layout, opt,
             *extra ? ", " : "", extra);
    return test_config(json);
}

/* Updates [from, to) of a session on `comm` (NULL: threads), started from
** `in` when given; its state after them. Update u takes samples u * N ..
** u * N + N - 1 of the data (N per update), whatever the layout. */
static rp_train_state run(const rp_model *m, const rp_config *c, rp_comm *comm,
                          const rp_train_state *in, int from, int to) {
    rp_session *s;
    rp_error err;
    rp_status st = comm ? rp_session_create_mpi(m, c, comm, &s, &err)
                        : rp_session_create(m, c, &s, &err);
    if (st) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    if (in && rp_session_set_state(s, in, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    CHECK_INT(rp_session_updates(s), in ? in->updates : 0);
    long long per = rp_session_samples_per_call(s);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    float *x = malloc(sizeof(float) * per * 784);
    int32_t *y = malloc(sizeof(int32_t) * per);
    for (int u = from; u < to; u++) {
        for (long long i = 0; i < per; i++)
            ids[i] = (u * per + i) % data->n;
        rp_dataset_gather(data, ids, (int)per, x, y);
        rp_result r;
        CHECK_OK(rp_session_run(s, x, y, ids, &r, &err), err);
    }
    rp_train_state out;
    CHECK_OK(rp_session_get_state(s, &out, &err), err);
    free(ids), free(x), free(y);
    rp_session_free(s);
    return out;
}

/* Bit for bit, or the largest difference relative to a tensor's scale. */
static double diff(const rp_weights *a, const rp_weights *b, bool *same) {
    double worst = 0;
    CHECK_INT(a->num_tensors, b->num_tensors);
    for (int t = 0; t < a->num_tensors && t < b->num_tensors; t++) {
        CHECK(strcmp(a->tensors[t].name, b->tensors[t].name) == 0);
        CHECK_INT(a->tensors[t].groups, b->tensors[t].groups);
        size_t n = rp_shape_size(&a->tensors[t].shape) * a->tensors[t].groups;
        *same = *same && memcmp(a->tensors[t].data, b->tensors[t].data, sizeof(float) * n) == 0;
        double d = rp_tensor_rel_diff(a->tensors[t].data, b->tensors[t].data, n);
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* 20 updates straight against 10 under `a`, then 10 under `b` from its
** state. exact: bit for bit, counters included. */
static void resume(const char *what, const rp_config *a, rp_comm *ca, const rp_config *b,
                   rp_comm *cb, bool exact) {
    rp_model *m = test_model(spec ? spec : MLP);
    rp_train_state straight = run(m, a, ca, NULL, 0, 20);
    rp_train_state half = run(m, a, ca, NULL, 0, 10);
    rp_train_state rest = run(m, b, cb, &half, 10, 20);
    bool same = true;
    double dw = diff(straight.weights, rest.weights, &same);
    double ds = diff(straight.optimizer, rest.optimizer, &same);
    CHECK(straight.weights->num_tensors > 0);
    CHECK_INT(rest.updates, 20);
    CHECK_INT(rest.steps, straight.steps);
    CHECK_INT(rest.skipped, straight.skipped);
    CHECK(rest.loss_scale == straight.loss_scale);
    CHECK_INT(rest.clean, straight.clean);
    /* the run did move: the resumed half is not the state it started from */
    bool moved = false;
    CHECK(diff(half.weights, rest.weights, &moved) > 1e-4);
    if (exact)
        CHECK(same);
    else
        CHECK(dw < 1e-5 && ds < 1e-5);
    if (!mpi || rp_comm_rank(mpi) == 0)
        printf("  %-58s weights %.1e, optimizer %.1e%s\n", what, dw, ds,
               same ? " (bit for bit)" : "");
    rp_train_state_free(&straight), rp_train_state_free(&half), rp_train_state_free(&rest);
    rp_model_free(m);
}

static const char *SGD = "{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}";
static const char *ADAM = "{\"type\": \"adam\", \"lr\": 0.002}";

static void same_layout(rp_comm *comm, const char *layout) {
    static const struct {
        const char *name, *opt, *extra;
    } cases[] = {
        {"SGD with momentum", "SGD", ""},
        {"Adam, replicated tensor sharding", "ADAM", "\"replicated_tensor_sharding\": true"},
        {"Adam, offchip state", "ADAM", "\"optimizer_state_offchip\": true"},
        {"auto loss scaling, fp16 exchange", "SGD",
         "\"auto_loss_scaling\": true, \"fp16_exchange\": true, \"loss_scaling\": 1024"},
        {"cosine schedule, gradient clipping", "SGD",
         "\"gradient_clipping\": 0.5, \"lr_schedule\": {\"type\": \"cosine\", "
         "\"warmup_updates\": 3, \"decay_updates\": 16, \"min_lr\": 0.001}"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *opt = strcmp(cases[k].opt, "SGD") == 0 ? SGD : ADAM;
        rp_config c = config(layout, opt, cases[k].extra);
        char what[160];
        snprintf(what, sizeof what, "%s: %s", cases[k].name, layout);
        resume(what, &c, comm, &c, comm, true);
    }
}

static void other_layouts(void) {
    static const struct {
        const char *name, *a, *b;
    } cases[] = {
        {"R 2 -> 4", "\"replication_factor\": 2, \"micro_batch_size\": 4",
         "\"replication_factor\": 4, \"micro_batch_size\": 2"},
        {"1 stage -> 2 stages [2, 1]", "\"replication_factor\": 2, \"micro_batch_size\": 4",
         "\"replication_factor\": 2, \"micro_batch_size\": 4, \"layers_per_stage\": [3, -1], "
         "\"stage_replication\": [2, 1]"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int opt = 0; opt < 2; opt++) {
            char la[256], lb[256], what[160];
            snprintf(la, sizeof la, "%s, \"gradient_accumulation_steps\": 3", cases[k].a);
            snprintf(lb, sizeof lb, "%s, \"gradient_accumulation_steps\": 3", cases[k].b);
            rp_config a = config(la, opt ? ADAM : SGD, ""), b = config(lb, opt ? ADAM : SGD, "");
            snprintf(what, sizeof what, "%s, %s", cases[k].name, opt ? "Adam" : "SGD");
            resume(what, &a, NULL, &b, NULL, false);
        }
    const char *r4 = "\"replication_factor\": 4, \"micro_batch_size\": 2, "
                     "\"gradient_accumulation_steps\": 3";
    rp_config a = config(r4, ADAM, "\"replicated_tensor_sharding\": true");
    rp_config b = config(r4, ADAM, "");
    resume("sharding on -> off, Adam, R 4", &a, NULL, &b, NULL, false);
    resume("sharding off -> on, Adam, R 4", &b, NULL, &a, NULL, false);
    /* a layer of its own grouping makes a second run of variables: each
    ** run's optimizer state is its own (one array for the whole net would
    ** put its moments where the state's reader does not look) */
    spec = "input 1 28 28\nflatten\nlinear 24\nrelu\nlinear 10 group_size=1\n"
           "softmax_cross_entropy\n";
    rp_config pg = config("\"replication_factor\": 2, \"micro_batch_size\": 4", ADAM, "");
    resume("per-layer grouping, Adam, R 2", &pg, NULL, &pg, NULL, true);
    /* a graph with batchnorm: on its own layout bit for bit, and from one
    ** stage to two cut where the skip crosses */
    spec = RESNET;
    rp_config g1 = config("\"replication_factor\": 2, \"micro_batch_size\": 4", SGD, "");
    rp_config g2 = config("\"replication_factor\": 2, \"micro_batch_size\": 4, "
                          "\"layers_per_stage\": [3, -1], \"stage_replication\": [2, 1]",
                          SGD, "");
    resume("residual graph with batchnorm, 2 stages [2, 1]", &g2, NULL, &g2, NULL, true);
    resume("residual graph with batchnorm, 1 stage -> 2", &g1, NULL, &g2, NULL, false);
    spec = NULL;
}

/* A state that does not fit is refused before anything changes. */
static void refusals(void) {
    rp_model *m = test_model(MLP);
    rp_config c = config("\"micro_batch_size\": 4", ADAM, "");
    rp_train_state st = run(m, &c, NULL, NULL, 0, 2);
    rp_session *s;
    rp_error err;
    CHECK_OK(rp_session_create(m, &c, &s, &err), err);
    /* a moment missing */
    rp_tensor *t = &st.optimizer->tensors[st.optimizer->num_tensors - 1];
    char name[RP_NAME_MAX];
    snprintf(name, sizeof name, "%s", t->name);
    snprintf(t->name, RP_NAME_MAX, "gone");
    CHECK(rp_session_set_state(s, &st, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "no optimizer state");
    CHECK_STR_HAS(err.msg, name);
    CHECK_INT(rp_session_updates(s), 0);
    snprintf(t->name, RP_NAME_MAX, "%s", name);
    /* two copies where the session has one group */
    int groups = t->groups;
    t->groups = 2;
    CHECK(rp_session_set_state(s, &st, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "has 2 copies");
    t->groups = groups;
    /* counters */
    st.steps = st.updates + 1;
    CHECK(rp_session_set_state(s, &st, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "training state: steps out of range (updates 2, steps 3");
    st.steps = st.updates;
    CHECK_OK(rp_session_set_state(s, &st, &err), err);
    CHECK_INT(rp_session_updates(s), 2);
    rp_session_free(s);
    rp_train_state_free(&st);
    rp_model_free(m);
}

static bool same_weights(const rp_weights *a, const rp_weights *b) {
    bool same = true;
    diff(a, b, &same);
    return same;
}

/* Files: a saved checkpoint loads as it was; a directory keeps the newest;
** damaged files are refused, naming the damage, and passed over. */
static void files(void) {
    rp_model *m = test_model(MLP);
    rp_config c = config("\"micro_batch_size\": 4, \"auto_loss_scaling\": true", ADAM, "");
    char dir[] = "/tmp/repipe-checkpoint-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    rp_checkpoint ck = {.config = c, .model = rp_model_fingerprint(m), .samples = data->n,
                        .workers = 1, .stages = 1};
    snprintf(ck.backend, sizeof ck.backend, "local");
    char path[512], note[1024];
    rp_error err;
    char orphan[600];
    snprintf(orphan, sizeof orphan, "%s/ckpt-000000000009.rpc.tmpAbCdEf", dir);
    rp_checkpoint_dir *cd = NULL;
    CHECK_OK(rp_checkpoint_dir_open(dir, NULL, NULL, &cd, &err), err);
    CHECK_INT(strlen(rp_checkpoint_dir_run(cd)), 32);
    for (int k = 1; k <= 4; k++) {
        if (k == 3) { /* what a writer killed half-way leaves */
            FILE *o = fopen(orphan, "w");
            fputs("half", o);
            fclose(o);
        }
        ck.state = run(m, &c, NULL, NULL, 0, k);
        CHECK_OK(rp_checkpoint_dir_write(cd, &ck, 2, path, sizeof path, &err), err);
        if (k < 4)
            rp_train_state_free(&ck.state);
    }
    char run_id[RP_RUN_ID_MAX];
    snprintf(run_id, sizeof run_id, "%s", rp_checkpoint_dir_run(cd));
    /* one run a directory: a second one is refused while the first holds it */
    rp_checkpoint_dir *again = NULL;
    CHECK(rp_checkpoint_dir_open(dir, run_id, NULL, &again, &err) == RP_ERR_IO);
    CHECK_STR_HAS(err.msg, "is in use by another run (run ");
    CHECK_STR_HAS(err.msg, run_id);
    rp_checkpoint_dir_close(cd);
    /* the newest two remain; a killed writer's leftover went with the next write */
    CHECK(access(orphan, F_OK) != 0);
    char name[600];
    snprintf(name, sizeof name, "%s/ckpt-000000000001.rpc", dir);
    CHECK(access(name, F_OK) != 0);
    snprintf(name, sizeof name, "%s/ckpt-000000000003.rpc", dir);
    CHECK(access(name, F_OK) == 0);
    rp_checkpoint back;
    CHECK_OK(rp_checkpoint_latest(dir, &back, path, sizeof path, note, sizeof note, &err), err);
    CHECK_STR_HAS(path, "ckpt-000000000004.rpc");
    CHECK(note[0] == '\0');
    CHECK_STR_HAS(back.run, run_id);
    CHECK_INT(back.state.updates, 4);
    CHECK_INT(back.state.steps, ck.state.steps);
    CHECK(back.state.loss_scale == ck.state.loss_scale);
    CHECK(back.model == ck.model && back.samples == data->n);
    CHECK(same_weights(back.state.weights, ck.state.weights));
    CHECK(same_weights(back.state.optimizer, ck.state.optimizer));
    char why[200];
    CHECK(rp_checkpoint_compatible(&back.config, &c, why, sizeof why));
    rp_checkpoint_free(&back);
    /* a damaged newest one: reported, and the one before used */
    char *bytes;
    size_t len;
    CHECK_OK(rp_read_file(path, &bytes, &len, &err), err);
    FILE *f = fopen(path, "r+b");
    fseek(f, (long)len / 2, SEEK_SET);
    fputc(bytes[len / 2] ^ 0x10, f);
    fclose(f);
    CHECK(rp_checkpoint_load(&back, path, &err) == RP_ERR_PARSE);
    CHECK_STR_HAS(err.msg, "checksum mismatch");
    CHECK_OK(rp_checkpoint_latest(dir, &back, path, sizeof path, note, sizeof note, &err), err);
    CHECK_STR_HAS(path, "ckpt-000000000003.rpc");
    CHECK_STR_HAS(note, "ckpt-000000000004.rpc: skipped");
    CHECK_INT(back.state.updates, 3);
    rp_checkpoint_free(&back);
    /* cut short, and another kind of file */
    CHECK(rp_checkpoint_parse(&back, (unsigned char *)bytes, len - 100, "cut", &err) ==
          RP_ERR_PARSE);
    CHECK_STR_HAS(err.msg, "cut: checksum mismatch");
    CHECK(rp_checkpoint_parse(&back, (unsigned char *)"RPWEIGHT0000000000000000000000000000",
                              36, "w", &err) == RP_ERR_PARSE);
    CHECK_STR_HAS(err.msg, "w: not a repipe checkpoint");
    free(bytes);
    /* the mathematics must match; the layout need not */
    rp_config other = c;
    other.replication_factor = 2, other.micro_batch_size = 2;
    other.replica_grouping = rp_grouping_all(2);
    CHECK(rp_checkpoint_compatible(&c, &other, why, sizeof why));
    other.optimizer.lr *= 2;
    CHECK(!rp_checkpoint_compatible(&c, &other, why, sizeof why));
    CHECK_STR_HAS(why, "optimizer.lr");
    other = c;
    other.micro_batch_size = 8;
    CHECK(!rp_checkpoint_compatible(&c, &other, why, sizeof why));
    CHECK_STR_HAS(why, "samples per update");
    /* leave nothing behind */
    for (int k = 1; k <= 4; k++) {
        snprintf(name, sizeof name, "%s/ckpt-%012d.rpc", dir, k);
        unlink(name);
    }
    snprintf(name, sizeof name, "%s/repipe.lock", dir);
    unlink(name);
    CHECK(rmdir(dir) == 0);
    rp_checkpoint_free(&ck);
    rp_model_free(m);
}

/* The checksum of files and sections of 4 GiB and more (a GPT-2-large
** Adam checkpoint is 6.2 GB) covers every byte: zlib takes 32-bit
** lengths, and covered only len mod 2^32. Over 4 GiB + 10 bytes of the
** zero page (read, never resident), against zlib's own combination of the
** pieces' checksums. */
static void crc_beyond_4gib(void) {
    size_t giga = (size_t)1 << 30, n = 4 * giga + 10;
    unsigned char *zero = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                               -1, 0);
    if (zero == MAP_FAILED) {
        fprintf(stderr, "crc beyond 4 GiB: mmap of %zu bytes failed\n", n);
        CHECK(!"mmap");
        return;
    }
    uLong one = crc32(0L, zero, (uInt)giga), want = one;
    for (int k = 1; k < 4; k++)
        want = crc32_combine64(want, one, (z_off64_t)giga);
    want = crc32_combine64(want, crc32(0L, zero, 10), 10);
    uint32_t got = rp_crc32(0, zero, n);
    CHECK(got == (uint32_t)want);
    CHECK(got != (uint32_t)crc32(0L, zero, 10)); /* what the cast gave */
    munmap(zero, n);
}

int main(int argc, char **argv) {
    test_start(argc, argv, 512, 5, &data, &mpi);
    if (getenv("REPIPE_TEST_NARROW"))
        MLP = NARROW;
    if (!mpi)
        crc_beyond_4gib();
    const char *four[] = {
        "\"replication_factor\": 4, \"micro_batch_size\": 2, \"gradient_accumulation_steps\": 3",
        "\"replication_factor\": 2, \"micro_batch_size\": 4, \"gradient_accumulation_steps\": 3, "
        "\"layers_per_stage\": [3, -1]",
    };
    for (int k = 0; k < 2; k++)
        same_layout(mpi, four[k]);
    if (!mpi) {
        same_layout(NULL, "\"micro_batch_size\": 4, \"gradient_accumulation_steps\": 3, "
                          "\"layers_per_stage\": [3, -1], \"stage_replication\": [2, 1]");
        other_layouts();
        refusals();
        files();
    } else {
        /* threads in each rank, then ranks */
        rp_config a = config(four[0], ADAM, ""), b = config(four[1], ADAM, "");
        resume("local R 4 -> MPI 2 stages, Adam", &a, NULL, &b, mpi, false);
    }
    char name[64];
    snprintf(name, sizeof name, "test_checkpoint (%s)", mpi ? "mpi" : "local");
    int rc = test_finish(name);
    rp_dataset_free(data);
    if (mpi)
        rp_comm_mpi_finalize(mpi);
    return rc;
}
