/*
** Memory features: each one on gives the weights of it off after three
** updates, and changes what a worker holds the way it should.
**
**   replicated_tensor_sharding, optimizer_state_offchip, both:
**       bit-identical on the local backend (a shard's sum is the
**       allreduce's, the arithmetic the same); each worker keeps its share
**       of the optimizer state, offchip one chunk at most;
**   recompute_checkpoint_every_layer, and recompute_layers (by layer):
**       bit-identical (the same products on the same rows, dropout masks
**       from a counter-based stream); fewer activation bytes;
**   auto_loss_scaling, and a fixed loss_scaling: bit-identical while
**       nothing overflows (the scale is a power of two, so scaling and
**       unscaling are exact);
**   fp16_exchange: activations and gradients cross stage boundaries
**       as fp16, and the replicas' gradient sums are exchanged as fp16: each
**       value rounded with a relative error of at most 2^-11 (the sum of g
**       members, at most (g + 1) 2^-11 of the sum of their magnitudes). That
**       error enters the weights only through the lr-sized updates: three
**       updates stay far within 2^-11 of a tensor's scale, the bound checked.
**       Checked with SGD + momentum, whose update is linear in the gradient:
**       Adam divides each gradient by its own RMS, so a gradient that nearly
**       cancels can change sign under any rounding (see test_training.c).
**       Plain SGD is left out too: on R = 4 with groups of 2 one layer ends
**       8.2e-4 of its scale away (the rounding is relative to the members'
**       magnitudes, and that layer's sums nearly cancel), with or without
**       the fused sum-and-update.
**
**   Plain SGD keeps no state, so its replicas sum and update in one
**   collective (rp_comm_reduce_update); the other paths reduce, then step.
**   Every EXACT variant compares the two.
**
**   test_memory          local backend
**   test_memory --mpi    under mpirun -np 4: R = 4 and R = 2 x P = 2
*/
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "repipe/data.h"
#include "repipe/session.h"
#include "run/cache.h"
#include "support.h"
#include "test.h"

static const char *MLP = "input 1 28 28\nflatten\nlinear 400\nrelu\ndropout 0.1\nlinear 37\n"
                         "relu\nlinear 10\nsoftmax_cross_entropy\n";
/* Under ThreadSanitizer (REPIPE_TEST_NARROW, set by its build's tests) the
** first layer is 128 wide: the same workers, threads and buffers, a third of
** the parameters the sanitizer's instrumented loops walk. (The fp16
** exchange's bound below is the 400-wide model's: at 200 wide one case
** ends 1.8e-3 of its scale away, at 64 wide 2.1e-3.) */
static const char *NARROW = "input 1 28 28\nflatten\nlinear 128\nrelu\ndropout 0.1\nlinear 37\n"
                            "relu\nlinear 10\nsoftmax_cross_entropy\n";

static rp_dataset *data;
static rp_comm *mpi;

static rp_config config(const char *shape, const char *opt, const char *extra) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"seed\": 4, \"micro_batch_size\": 4, \"gradient_accumulation_steps\": 3, %s, "
             "\"optimizer\": %s%s%s}",
             shape, opt, *extra ? ", " : "", extra);
    return test_config(json);
}

static rp_weights *train_n(const rp_model *m, const rp_config *c, int updates, rp_memory *mem,
                           double *scale, long long *skipped) {
    rp_session *s;
    rp_error err;
    rp_status st = mpi ? rp_session_create_mpi(m, c, mpi, &s, &err) : rp_session_create(m, c, &s, &err);
    if (st) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    if (mem)
        CHECK(rp_session_memory(s, 0, mem, &err) == RP_OK);
    long long per = rp_session_samples_per_call(s);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    float *x = malloc(sizeof(float) * per * 784);
    int32_t *y = malloc(sizeof(int32_t) * per);
    for (int k = 0; k < updates; k++) {
        for (long long i = 0; i < per; i++)
            ids[i] = (k * per + i) % data->n;
        rp_dataset_gather(data, ids, (int)per, x, y);
        rp_result r;
        CHECK(rp_session_run(s, x, y, ids, &r, &err) == RP_OK);
    }
    rp_weights *w;
    CHECK(rp_session_get_weights(s, RP_ALL_REPLICAS, &w, &err) == RP_OK);
    if (scale)
        rp_session_loss_scale(s, scale, skipped);
    free(ids), free(x), free(y);
    rp_session_free(s);
    return w;
}

static rp_weights *train(const rp_model *m, const rp_config *c, rp_memory *mem) {
    return train_n(m, c, 3, mem, NULL, NULL);
}

enum { EXACT, SUM_ORDER, HALF };

static const struct variant {
    const char *name, *json;
    int tolerance; /* EXACT: bit for bit; SUM_ORDER: bit for bit locally, 1e-5 under MPI */
} VARIANTS[] = {
    {"sharded", "\"replicated_tensor_sharding\": true", SUM_ORDER},
    {"offchip", "\"optimizer_state_offchip\": true", EXACT},
    {"sharded + offchip",
     "\"replicated_tensor_sharding\": true, \"optimizer_state_offchip\": true", SUM_ORDER},
    {"recompute", "\"recompute_checkpoint_every_layer\": true", EXACT},
    {"recompute by layer", "\"recompute_layers\": [1, 2, 3, 5]", EXACT},
    {"loss scaling", "\"auto_loss_scaling\": true", EXACT},
    {"fp16 exchange", "\"auto_loss_scaling\": true, \"fp16_exchange\": true", HALF},
    {"fixed loss scale", "\"loss_scaling\": 1024", EXACT},
};
#define NVARIANTS (int)(sizeof VARIANTS / sizeof VARIANTS[0])

static void compare(const char *shape, int sharers, int workers) {
    /* Adam's eps as in test_training.c: under MPI the reduce-scatter and the
    ** allreduce sum in different orders, which eps = 1e-8 would amplify */
    static const char *opts[] = {"{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}",
                                 "{\"type\": \"adam\", \"lr\": 0.001, \"eps\": 1e-5}",
                                 "{\"type\": \"sgd\", \"lr\": 0.05}"};
    if (mpi && workers != rp_comm_size(mpi))
        return;
    rp_model *m = test_model(MLP);
    for (int o = 0; o < 3; o++) { /* plain SGD: summed and updated in one collective */
        rp_config off = config(shape, opts[o], "");
        rp_memory mo, mem[NVARIANTS];
        rp_weights *a = train(m, &off, &mo);
        for (int k = 0; k < NVARIANTS; k++) {
            if (VARIANTS[k].tolerance == HALF && o > 0) /* see the top of the file */
                continue;
            rp_config on = config(shape, opts[o], VARIANTS[k].json);
            rp_weights *b = train(m, &on, &mem[k]);
            double d = test_weights_diff(a, b);
            bool ok;
            switch (VARIANTS[k].tolerance) {
            case EXACT: ok = d == 0; break;
            case SUM_ORDER: ok = mpi ? d <= 1e-5 : d == 0; break;
            default: ok = d > 0 && d <= 0x1p-11; break;
            }
            test_checks++;
            if (!ok) {
                fprintf(stderr, "%s, optimizer %d, %s: differs by %g\n", shape, o,
                        VARIANTS[k].name, d);
                test_failures++;
            }
            rp_weights_free(b);
        }
        if (o == 2) { /* no state to keep */
            CHECK(mo.optimizer == 0);
            rp_weights_free(a);
            continue;
        }
        /* a worker of stage 0 keeps ceil(n / sharers) of each run's state */
        CHECK(mo.optimizer > 0);
        CHECK(mem[0].optimizer * sharers <= mo.optimizer + (size_t)sharers * 64 * sizeof(float));
        CHECK(mem[0].optimizer * sharers >= mo.optimizer);
        /* offchip: one chunk of state in memory at most */
        CHECK(mem[1].optimizer <= mo.optimizer);
        CHECK(mem[2].optimizer <= mem[0].optimizer);
        /* recomputation keeps fewer activations and adds one segment's buffer */
        CHECK(mem[3].activations < mo.activations);
        CHECK(mem[3].scratch > mo.scratch);
        CHECK(mem[4].activations < mo.activations); /* (the linear, relu, dropout and a relu) */
        rp_weights_free(a);
    }
    rp_model_free(m);
}

/* matmul_proportion with device_memory: convolution scratch tiled to fit
** the proportion (here one sample per tile instead of the cache's four) gives
** the weights of the untiled run within summation order (the weight
** gradient sums over tiles); recomputation of a convolutional model is
** exact. A proportion below one sample's scratch is refused, naming the
** layer; a proportion of 0 asks for the least scratch and gets one sample a
** tile. */
static void cnn_features(const char *shape, int workers) {
    if (mpi && workers != rp_comm_size(mpi))
        return;
    rp_model *m = test_model("input 1 28 28\nconv2d 8 kernel=3 pad=1\nrelu\nmaxpool2d 2\n"
                             "conv2d 4 kernel=3 pad=1\nrelu\nflatten\nlinear 10\n"
                             "softmax_cross_entropy\n");
    const char *sgd = "{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}";
    rp_config off = config(shape, sgd, "\"device_memory\": 10000000");
    /* one sample of the first convolution: (9 + 8) x 784 floats = 53 312 bytes */
    rp_config tiled = config(shape, sgd, "\"device_memory\": 10000000, "
                                         "\"matmul_proportion\": 0.006");
    rp_config rc = config(shape, sgd, "\"device_memory\": 10000000, "
                                      "\"recompute_checkpoint_every_layer\": true");
    /* 0, IPUConfig's own lower bound: the least scratch, one sample a tile, as
    ** the proportion above gives */
    rp_config least = config(shape, sgd, "\"device_memory\": 10000000, "
                                         "\"matmul_proportion\": 0.0");
    rp_memory mo, mt, mr, ml;
    rp_weights *a = train(m, &off, &mo), *b = train(m, &tiled, &mt), *c = train(m, &rc, &mr);
    rp_weights *l = train(m, &least, &ml);
    double dt = test_weights_diff(a, b), dr = test_weights_diff(a, c);
    CHECK(dt <= 1e-5);
    CHECK(dr == 0);
    CHECK(test_weights_diff(b, l) == 0);
    CHECK_INT(ml.scratch, mt.scratch);
    rp_weights_free(l);
    if (dt > 1e-5 || dr != 0)
        fprintf(stderr, "%s: tiled differs by %g, recomputed by %g\n", shape, dt, dr);
    CHECK(mt.scratch < mo.scratch);
    CHECK(mr.activations < mo.activations);
    rp_weights_free(a), rp_weights_free(b), rp_weights_free(c);
    if (!mpi) {
        rp_config tiny = config(shape, sgd, "\"device_memory\": 10000000, "
                                            "\"matmul_proportion\": 0.001");
        rp_session *s;
        rp_error err;
        CHECK(rp_session_create(m, &tiny, &s, &err) == RP_ERR_INFEASIBLE);
        CHECK_STR_HAS(err.msg, "matmul_proportion: layer 0 (conv2d, line 2) needs 53312 bytes "
                               "of scratch for one sample but the proportion of device_memory "
                               "allows 10000");
    }
    rp_model_free(m);
}

/* auto_loss_scaling: a scale that overflows fp16 on the way between stages
** makes every worker skip the update (the weights stay as they were) and
** halves the scale until gradients fit; clean updates double it after
** loss_scaling_growth_interval of them. */
static void loss_scale_recovery(void) {
    rp_model *m = test_model(MLP);
    const char *shape = "\"layers_per_stage\": [3, -1]", *sgd = "{\"type\": \"sgd\"}";
    const char *huge = "\"auto_loss_scaling\": true, \"loss_scaling\": 1152921504606846976";
    char json[256];
    snprintf(json, sizeof json, "%s, \"fp16_exchange\": true", huge);
    rp_config half = config(shape, sgd, json), full = config(shape, sgd, huge);
    double scale;
    long long skipped;
    rp_weights *w0 = train_n(m, &half, 0, NULL, &scale, &skipped);
    CHECK(scale == 0x1p60 && skipped == 0);
    /* 2^60 overflows fp16 (65504) but not fp32 */
    rp_weights *w1 = train_n(m, &half, 1, NULL, &scale, &skipped);
    CHECK(skipped == 1 && scale == 0x1p59);
    CHECK(test_weights_diff(w0, w1) == 0);
    rp_weights *f1 = train_n(m, &full, 1, NULL, &scale, &skipped);
    CHECK(skipped == 0 && scale == 0x1p60);
    CHECK(test_weights_diff(w0, f1) > 0);
    /* the replicas' fp16 gradient sums overflow too, without any stage boundary */
    rp_config r2 = config("\"replication_factor\": 2", sgd, json);
    rp_weights *q0 = train_n(m, &r2, 0, NULL, &scale, &skipped);
    rp_weights *q1 = train_n(m, &r2, 1, NULL, &scale, &skipped);
    CHECK(skipped == 1 && scale == 0x1p59);
    CHECK(test_weights_diff(q0, q1) == 0);
    rp_weights_free(q0), rp_weights_free(q1);
    /* it recovers: skips until the scale fits, then trains */
    rp_weights *wn = train_n(m, &half, 60, NULL, &scale, &skipped);
    CHECK(skipped > 30 && skipped < 60 && scale <= 0x1p30);
    CHECK(test_weights_diff(w0, wn) > 0);
    for (int t = 0; t < wn->num_tensors; t++) {
        const rp_tensor *x = &wn->tensors[t];
        size_t n = rp_shape_size(&x->shape) * x->groups;
        bool finite = true;
        for (size_t e = 0; e < n; e++)
            finite &= isfinite(x->data[e]);
        CHECK(finite);
    }
    /* growth: with an interval of one, every clean update doubles it */
    rp_config grow = config(shape, sgd, "\"auto_loss_scaling\": true, \"loss_scaling\": 2, "
                                        "\"loss_scaling_growth_interval\": 1");
    rp_weights *g3 = train_n(m, &grow, 3, NULL, &scale, &skipped);
    CHECK(scale == 16 && skipped == 0);
    rp_weights_free(w0), rp_weights_free(w1), rp_weights_free(f1), rp_weights_free(wn);
    rp_weights_free(g3);
    rp_model_free(m);
}

/* Two graphs with the same layers and shapes, read along other edges, are
** other models to the cache: their memory plans differ. */
static void cache_keys_of_graphs(void) {
    rp_model *a = test_model("x = input 8\nh = linear 8\nr = relu\nadd < r h\nlinear 2\n"
                             "softmax_cross_entropy\n");
    rp_model *b = test_model("x = input 8\nh = linear 8\nr = relu\nadd < r x\nlinear 2\n"
                             "softmax_cross_entropy\n");
    rp_config cfg = test_config("{\"executable_cache_dir\": \"/nonexistent\"}");
    char pa[512], pb[512];
    uint64_t ka, kb;
    rpi_cache_key(a, &cfg, pa, sizeof pa, &ka);
    rpi_cache_key(b, &cfg, pb, sizeof pb, &kb);
    CHECK(ka != kb && strcmp(pa, pb) != 0); /* the same layers; add reads h, or x */
    rp_model_free(a), rp_model_free(b);
}

/* executable_cache_dir: the first start stores the schedule and memory plan,
** the second reuses them and trains the same weights; a damaged entry and an
** entry written for another configuration are rebuilt, and the next start
** reuses the rebuilt one. */
static char *cache_note(const rp_model *m, const rp_config *c) {
    rp_session *s;
    rp_error err;
    if (rp_session_create(m, c, &s, &err) != RP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    char *note = strdup(rp_session_cache_note(s));
    rp_session_free(s);
    return note;
}

static void check_note(const rp_model *m, const rp_config *c, const char *want) {
    char *note = cache_note(m, c);
    CHECK_STR_HAS(note, want);
    free(note);
}

static void cache_entries(const char *shape) {
    char dir[] = "/tmp/repipe-cache-test-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(!"mkdtemp");
        return;
    }
    rp_model *m = test_model(MLP);
    const char *sgd = "{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}";
    char extra[256];
    snprintf(extra, sizeof extra, "\"executable_cache_dir\": \"%s\"", dir);
    rp_config plain = config(shape, sgd, ""), c = config(shape, sgd, extra);
    check_note(m, &plain, ""); /* no cache, nothing said */
    check_note(m, &c, "executable cache: stored ");
    char *note = cache_note(m, &c);
    CHECK_STR_HAS(note, "executable cache: reused the schedule and memory plan in ");
    const char *path = strstr(note, dir);
    char entry[512];
    snprintf(entry, sizeof entry, "%s", path ? path : "");
    free(note);
    /* a cached plan trains exactly as a fresh one */
    rp_memory m1, m2;
    rp_weights *a = train(m, &plain, &m1), *b = train(m, &c, &m2);
    CHECK(test_weights_diff(a, b) == 0);
    CHECK(memcmp(&m1, &m2, sizeof m1) == 0);
    rp_weights_free(a), rp_weights_free(b);
    /* damage one byte in the middle */
    FILE *f = fopen(entry, "r+b");
    CHECK(f != NULL);
    if (f) {
        fseek(f, 40, SEEK_SET);
        int ch = fgetc(f);
        fseek(f, 40, SEEK_SET);
        fputc(ch ^ 0x5a, f);
        fclose(f);
    }
    check_note(m, &c, "was damaged: checksum mismatch; rebuilt it");
    check_note(m, &c, "executable cache: reused");
    /* an entry of another configuration (GA 4) under this one's name */
    char extra4[300];
    snprintf(extra4, sizeof extra4, "%s, \"device_iterations\": 2", extra);
    rp_config other = config(shape, sgd, extra4);
    char *n4 = cache_note(m, &other), other_entry[512];
    CHECK_STR_HAS(n4, "executable cache: stored ");
    const char *p4 = strstr(n4, dir);
    snprintf(other_entry, sizeof other_entry, "%s", p4 ? p4 : "");
    other_entry[strcspn(other_entry, " ")] = 0;
    free(n4);
    CHECK(strcmp(entry, other_entry) != 0);
    CHECK(rename(other_entry, entry) == 0);
    check_note(m, &c, "was stale: written for another model or configuration; rebuilt it");
    check_note(m, &c, "executable cache: reused");
    /* entries forged with a valid checksum: a schedule whose first worker
    ** runs one micro-batch twice and another never (the structure holds,
    ** nothing hangs, the update is wrong), then a memory plan that would
    ** pass any device_memory */
    uint64_t key;
    char kpath[512];
    rpi_cache_key(m, &c, kpath, sizeof kpath, &key);
    rp_derived d;
    rp_config_derive(&c, &d);
    rp_workplan *plan;
    rp_memory mem[RP_MAX_STAGES];
    char why[160];
    CHECK(rpi_cache_load(entry, key, d.workers, d.stages, c.gradient_accumulation_steps, &plan, mem,
                     why, sizeof why) == CACHE_HIT);
    int first = -1, second = -1;
    for (int k = 0; plan && k < plan->w[0].num_ops; k++) {
        int mb = plan->w[0].ops[k].mb;
        if (plan->w[0].ops[k].kind == RP_OP_FORWARD && first < 0)
            first = mb;
        else if (plan->w[0].ops[k].kind == RP_OP_FORWARD && mb != first && second < 0)
            second = mb;
    }
    CHECK(second >= 0);
    if (plan && second >= 0) {
        for (int k = 0; k < plan->w[0].num_ops; k++)
            if (plan->w[0].ops[k].mb == second)
                plan->w[0].ops[k].mb = first;
        rp_error err;
        CHECK(rpi_cache_store(entry, key, plan, mem, &err) == RP_OK);
        check_note(m, &c, "held another schedule than this configuration's; rebuilt it");
        rp_workplan_free(plan);
        CHECK(rpi_cache_load(entry, key, d.workers, d.stages, c.gradient_accumulation_steps, &plan,
                         mem, why, sizeof why) == CACHE_HIT);
        mem[0].activations = 1;
        CHECK(rpi_cache_store(entry, key, plan, mem, &err) == RP_OK);
        check_note(m, &c, "held another memory plan than this configuration's; rebuilt it");
        check_note(m, &c, "executable cache: reused");
    }
    rp_workplan_free(plan);
    /* what others may leave at an entry's name in a shared cache (mode
    ** 1777) costs the cache, never the run: a FIFO is passed over, not read
    ** (it would block), and replaced; a directory cannot be, and the run
    ** goes on without storing */
    remove(entry);
    CHECK(mkfifo(entry, 0666) == 0);
    check_note(m, &c, "a FIFO, not a file");
    check_note(m, &c, "executable cache: reused");
    remove(entry);
    CHECK(mkdir(entry, 0777) == 0);
    check_note(m, &c, "executable cache: not stored (");
    char *nd = cache_note(m, &c);
    CHECK_STR_HAS(nd, "the run goes on without it");
    free(nd);
    rmdir(entry);
    rmdir(dir);
    rp_model_free(m);
}

/* Entries under dir (recursively), "." and ".." not counted. */
static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char sub[1024];
        snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
        n += 1 + count_entries(sub);
    }
    if (d)
        closedir(d);
    return n;
}

/* optimizer_state_offchip: one file per worker in a run directory under
** $TMPDIR while the session lives, nothing left after it. */
static void offchip_files(void) {
    char dir[] = "/tmp/repipe-offchip-test-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(!"mkdtemp");
        return;
    }
    const char *old = getenv("TMPDIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("TMPDIR", dir, 1);
    rp_model *m = test_model(MLP);
    rp_config c = config("\"replication_factor\": 4", "{\"type\": \"adam\"}",
                         "\"optimizer_state_offchip\": true");
    rp_session *s;
    rp_error err;
    CHECK(rp_session_create(m, &c, &s, &err) == RP_OK);
    CHECK_INT(count_entries(dir), 1 + 4); /* repipe-run-XXXXXX/worker-{0..3}.state */
    rp_session_free(s);
    CHECK_INT(count_entries(dir), 0);
    if (saved)
        setenv("TMPDIR", saved, 1);
    else
        unsetenv("TMPDIR");
    free(saved);
    rmdir(dir);
    rp_model_free(m);
}

/* embedding_serialization_factor (and recomputation from an embedding
** checkpoint): the table as row blocks, the same weights
** bit for bit; a vocabulary the factor does not divide is refused. */
static void embedding_blocks(const char *shape) {
    rp_model *m = test_model("input 12\nembedding 60 8\nlayernorm\nflatten\nlinear 10\n"
                             "softmax_cross_entropy\n");
    rp_weights *w[4] = {0};
    static const int factors[4] = {1, 4, 3, 1};
    for (int k = 0; k < 4; k++) { /* the last recomputes: the embedding is a checkpoint */
        char json[320];
        snprintf(json, sizeof json,
                 "{\"seed\": 2, \"micro_batch_size\": 4, %s, "
                 "\"embedding_serialization_factor\": %d, \"optimizer\": {\"type\": \"adam\"}, "
                 "\"recompute_checkpoint_every_layer\": %s}",
                 shape, factors[k], k == 3 ? "true" : "false");
        rp_config c;
        rp_error err;
        rp_session *s;
        CHECK(rp_config_load_string(&c, json, strlen(json), "t", &err) == RP_OK);
        CHECK(rp_session_create(m, &c, &s, &err) == RP_OK);
        float x[16 * 12];
        int32_t y[16];
        int64_t ids[16];
        int n = (int)rp_session_samples_per_call(s);
        CHECK(n <= 16);
        for (int call = 0; call < 3 && n <= 16; call++) {
            for (int i = 0; i < n; i++) {
                ids[i] = call * n + i;
                y[i] = (i * 3 + call) % 10;
                for (int t = 0; t < 12; t++) /* repeated tokens too */
                    x[i * 12 + t] = (float)((i * 7 + t * 5 + call) % 60);
            }
            rp_result r;
            CHECK(rp_session_run(s, x, y, ids, &r, &err) == RP_OK);
        }
        CHECK(rp_session_get_weights(s, RP_ONE_PER_GROUP, &w[k], &err) == RP_OK);
        rp_session_free(s);
    }
    for (int k = 1; k < 4; k++)
        for (int t = 0; t < w[0]->num_tensors; t++)
            CHECK(memcmp(w[0]->tensors[t].data, w[k]->tensors[t].data,
                         sizeof(float) * rp_shape_size(&w[0]->tensors[t].shape)) == 0);
    for (int k = 0; k < 4; k++)
        rp_weights_free(w[k]);
    const char *bad = "{\"embedding_serialization_factor\": 7}";
    rp_config c;
    rp_error err;
    rp_session *s;
    CHECK(rp_config_load_string(&c, bad, strlen(bad), "t", &err) == RP_OK);
    CHECK(rp_session_create(m, &c, &s, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "embedding_serialization_factor 7: the vocabulary of layer 0 "
                           "(embedding, line 2) has 60 rows, not a multiple of 7");
    rp_model_free(m);
}

/* Two updates of a GPT with `extra` on; the activation bytes a worker of the
** last stage keeps (its block is not the stage's last layer). */
static rp_weights *gpt_run(const rp_model *m, const char *shape, const char *opt,
                           const char *extra, size_t *acts) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"seed\": 6, \"micro_batch_size\": 2, \"gradient_accumulation_steps\": 2, %s, "
             "\"optimizer\": %s%s%s}",
             shape, opt, *extra ? ", " : "", extra);
    rp_config c = test_config(json);
    rp_error err;
    rp_session *s;
    rp_weights *w = NULL;
    CHECK_OK(rp_session_create(m, &c, &s, &err), err);
    rp_memory mem;
    CHECK_OK(rp_session_memory(s, rp_session_stages(s) - 1, &mem, &err), err);
    *acts = mem.activations;
    int n = (int)rp_session_samples_per_call(s);
    float x[16 * 8];
    int32_t y[16 * 8];
    int64_t ids[16];
    CHECK(n <= 16);
    for (int call = 0; call < 2 && n <= 16; call++) {
        for (int i = 0; i < n; i++) {
            ids[i] = call * n + i;
            for (int t = 0; t < 8; t++) {
                x[i * 8 + t] = (float)((i * 5 + t * 3 + call) % 16);
                y[i * 8 + t] = (i + t * 7 + call) % 16;
            }
        }
        rp_result r;
        CHECK_OK(rp_session_run(s, x, y, ids, &r, &err), err);
    }
    CHECK_OK(rp_session_get_weights(s, RP_ONE_PER_GROUP, &w, &err), err);
    rp_session_free(s);
    return w;
}

/* The memory features on transformer blocks: recomputing each block in
** backward, sharding the optimizer state over the replicas, a fixed loss
** scale and a serialised embedding leave the weights bit for bit;
** recomputation keeps less; fp16 exchange stays within 2^-11 of a tensor's
** scale (SGD with momentum, as compare() explains). */
static void gpt_features(const char *shape) {
    rp_model *m = test_model("input 8\nembedding 16 8\nposition_embedding\n"
                             "transformer_block heads=2 dropout=0.1\n"
                             "transformer_block heads=2\nlayernorm\nlinear 16\n"
                             "softmax_cross_entropy\n");
    static const char *extra[] = {"", "\"recompute_checkpoint_every_layer\": true",
                                  "\"replicated_tensor_sharding\": true",
                                  "\"loss_scaling\": 128", "\"embedding_serialization_factor\": 4"};
    enum { NX = sizeof extra / sizeof extra[0] };
    const char *adamw = "{\"type\": \"adamw\", \"lr\": 0.01, \"eps\": 1e-5}";
    rp_weights *w[NX] = {0};
    size_t acts[NX];
    for (int k = 0; k < NX; k++)
        w[k] = gpt_run(m, shape, adamw, extra[k], &acts[k]);
    for (int k = 1; k < NX; k++)
        for (int t = 0; w[k] && t < w[0]->num_tensors; t++)
            CHECKF(memcmp(w[0]->tensors[t].data, w[k]->tensors[t].data,
                          sizeof(float) * rp_shape_size(&w[0]->tensors[t].shape)) == 0,
                   "%s: tensor %s differs", extra[k], w[0]->tensors[t].name);
    CHECKF(acts[1] < acts[0], "recomputed blocks keep %zu bytes, not less than %zu", acts[1],
           acts[0]);
    for (int k = 0; k < NX; k++)
        rp_weights_free(w[k]);
    const char *sgd = "{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}";
    size_t unused;
    rp_weights *a = gpt_run(m, shape, sgd, "", &unused),
               *b = gpt_run(m, shape, sgd,
                            "\"auto_loss_scaling\": true, \"fp16_exchange\": true",
                            &unused);
    /* A bias starts at zero, so its scale is its own two updates and its
    ** difference that of a gradient's relative rounding, which sums that
    ** nearly cancel enlarge (as compare() found for plain SGD): 4 x 2^-11 for
    ** biases (measured: 5.9e-4), 2^-11 for the rest (measured: 2.9e-5). */
    double most = 0;
    for (int t = 0; t < a->num_tensors; t++) {
        size_t n = rp_shape_size(&a->tensors[t].shape) * a->tensors[t].groups;
        double d = rp_tensor_rel_diff(a->tensors[t].data, b->tensors[t].data, n);
        bool bias = strstr(a->tensors[t].name, "bias") != NULL;
        CHECKF(d <= (bias ? 0x1p-9 : 0x1p-11), "fp16 exchange: %s differs by %g",
               a->tensors[t].name, d);
        most = d > most ? d : most;
    }
    CHECK(most > 0); /* fp16 did round something */
    rp_weights_free(a), rp_weights_free(b);
    rp_model_free(m);
}

int main(int argc, char **argv) {
    test_start(argc, argv, 256, 2, &data, &mpi);
    if (getenv("REPIPE_TEST_NARROW"))
        MLP = NARROW;
    compare("\"replication_factor\": 4", 4, 4);
    compare("\"replication_factor\": 2, \"layers_per_stage\": [3, -1]", 2, 4);
    compare("\"replication_factor\": 2, \"layers_per_stage\": [3, -1], "
            "\"stage_replication\": [2, 1]", 4, 6);
    compare("\"replication_factor\": 4, \"replica_grouping\": {\"group_size\": 2}", 2, 4);
    cnn_features("\"replication_factor\": 4", 4);
    cnn_features("\"replication_factor\": 2, \"layers_per_stage\": [4, -1]", 4);
    if (!mpi) {
        embedding_blocks("\"replication_factor\": 4");
        embedding_blocks("\"replication_factor\": 2, \"layers_per_stage\": [2, -1]");
        gpt_features("\"replication_factor\": 2");
        gpt_features("\"replication_factor\": 2, \"layers_per_stage\": [3, -1]");
        loss_scale_recovery();
        offchip_files();
        cache_entries("\"replication_factor\": 4");
        cache_entries("\"replication_factor\": 2, \"layers_per_stage\": [3, -1]");
        cache_keys_of_graphs();
    }
    char name[64];
    snprintf(name, sizeof name, "test_memory (%s)", mpi ? "mpi" : "local");
    int rc = test_finish(name);
    rp_dataset_free(data);
    if (mpi)
        rp_comm_mpi_finalize(mpi);
    return rc;
}
