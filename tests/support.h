/*
** Helpers shared by the tests that build models from spec text.
*/
#ifndef REPIPE_TEST_SUPPORT_H
#define REPIPE_TEST_SUPPORT_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/comm.h"
#include "repipe/config.h"
#include "repipe/data.h"
#include "repipe/layers.h"
#include "repipe/net.h"
#include "repipe/weights.h"
#include "repipe/profile.h"
#include "repipe/schedule.h"
#include "repipe/session.h"
#include "repipe/simulate.h"
#include "test.h"

/* The small models the schedule and reduction tests train every layout of
** (784-pixel images, or 8 tokens of 13 symbols): an MLP; a CNN with a
** layernorm and dropout; a GPT of two blocks with dropout and a head tied
** to its embedding. */
#define TEST_SPEC_MLP                                                                             \
    "input 1 28 28\nflatten\nlinear 64\nrelu\nlinear 32\nrelu\nlinear 10\n"                   \
    "softmax_cross_entropy\n"
#define TEST_SPEC_CNN                                                                             \
    "input 1 28 28\nconv2d 4 kernel=3 pad=1\nrelu\nmaxpool2d 2\nconv2d 8 kernel=3 pad=1\n"      \
    "layernorm\nrelu\nmaxpool2d 2\nflatten\ndropout 0.2\nlinear 10\nsoftmax_cross_entropy\n"
#define TEST_SPEC_GPT                                                                             \
    "input 8\nembedding 13 8 std=0.3\nposition_embedding\n"                                     \
    "transformer_block heads=2 dropout=0.1\ntransformer_block heads=2 mlp=2 dropout=0.1\n"      \
    "layernorm\nlinear 13 bias=false tie=0\nsoftmax_cross_entropy\n"

/* Parses a model spec or ends the test with the parser's message. */
static inline rp_model *test_model(const char *spec) {
    rp_model *m;
    rp_error err;
    if (rp_model_parse(&m, spec, strlen(spec), "test", &err) != RP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return m;
}

/* Parses a configuration or ends the test with the JSON and the message. */
/* A reference file's token windows and losses, as the PyTorch scripts write
** them: "window t_0 ... t_T" (inputs t_0 .. t_{T-1}, targets the same shifted
** by one) and "losses l_0 l_1 ...". Up to `max` windows into x and y (T
** each) and up to `max_losses` losses; returns the windows read, the
** losses' count in *nlosses. text is cut up (strtok). */
static inline int test_read_windows(char *text, int T, int max, float *x, int32_t *y,
                                    double *losses, int max_losses, int *nlosses) {
    int windows = 0;
    *nlosses = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *p = line + 7;
        if (strncmp(line, "window ", 7) == 0 && windows < max) {
            for (int t = 0; t <= T; t++) {
                long v = strtol(p, &p, 10);
                if (t < T)
                    x[(size_t)windows * T + t] = (float)v;
                if (t > 0)
                    y[(size_t)windows * T + t - 1] = (int32_t)v;
            }
            windows++;
        } else if (strncmp(line, "losses ", 7) == 0) {
            for (; *nlosses < max_losses; (*nlosses)++)
                losses[*nlosses] = strtod(p, &p);
        }
    }
    return windows;
}

/* layers_per_stage of S one-layer stages, "[1, 1, ..., 1]", into buf. */
static inline const char *test_ones(char *buf, size_t n, int S) {
    int k = snprintf(buf, n, "[1");
    for (int l = 1; l < S && k > 0 && (size_t)k < n; l++)
        k += snprintf(buf + k, n - (size_t)k, ", 1");
    if (k > 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, "]");
    return buf;
}

/* A profile of a chain from its nodes' text (node0 .. node n, `at` bytes
** of the `cap` of text): appends the edges from each node to the next and
** parses it, or ends the test with the parser's message. */
static inline rp_profile *test_profile_chain(char *text, size_t cap, size_t at, int n,
                                             const char *name) {
    for (int l = 0; l < n; l++)
        at += (size_t)snprintf(text + at, cap - at, "\tnode%d -- node%d\n", l, l + 1);
    rp_profile *p;
    rp_error err;
    if (at >= cap || rp_profile_parse(&p, text, at, name, &err)) {
        fprintf(stderr, "%s: %s\n", name, at >= cap ? "profile text too long" : err.msg);
        exit(1);
    }
    return p;
}

static inline rp_config test_config(const char *json) {
    rp_config c;
    rp_error err;
    if (rp_config_load_string(&c, json, strlen(json), "test", &err) != RP_OK) {
        fprintf(stderr, "%s\n%s\n", json, err.msg);
        exit(1);
    }
    return c;
}

/* One update of the configuration `json`, whose layers_per_stage is S
** one-layer stages (test_ones), each stage's forward f, input half bi and
** weights' half bw (ms; its whole backward bi + bw), no bytes and free
** transfers, in the simulator. Milliseconds. */
static inline double test_pass_update_ms(const char *json, int S, double f, double bi,
                                         double bw) {
    double fw[32], b[32], in[32], wt[32], out[32], par[32];
    for (int l = 0; l < S && l < 32; l++)
        fw[l] = f, in[l] = bi, wt[l] = bw, b[l] = bi + bw, out[l] = 0, par[l] = 0;
    rp_config c = test_config(json);
    rp_sim_options so;
    rp_sim_options_default(&so);
    so.latency = 0;
    so.bwd_input_ms = in, so.bwd_weight_ms = wt;
    rp_sim_result r;
    rp_error err;
    CHECK_OK(rp_simulate(&c, fw, b, out, par, S, &so, &r, &err), err);
    double t = r.update_time * 1e3;
    rp_sim_result_free(&r);
    return t;
}

/* The largest difference of two weight sets' tensors relative to their
** scale (rp_tensor_rel_diff), every group's copy; b's tensors found by name. */
static inline double test_weights_diff(const rp_weights *a, const rp_weights *b) {
    double worst = 0;
    for (int t = 0; t < a->num_tensors; t++) {
        const rp_tensor *tb = rp_weights_find(b, a->tensors[t].name);
        if (!tb)
            return INFINITY;
        size_t n = rp_shape_size(&a->tensors[t].shape) * a->tensors[t].groups;
        double d = rp_tensor_rel_diff(a->tensors[t].data, tb->data, n);
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* A session on threads, or on the MPI world mpi when not NULL; NULL, with
** the message on stderr, when it cannot be made. */
static inline rp_session *test_session(const rp_model *m, const rp_config *c, rp_comm *mpi) {
    rp_session *s;
    rp_error err;
    rp_status st = mpi ? rp_session_create_mpi(m, c, mpi, &s, &err) : rp_session_create(m, c, &s, &err);
    if (st) {
        fprintf(stderr, "session: %s\n", err.msg);
        return NULL;
    }
    return s;
}

/* Whether two weight sets hold the same bits, tensor by tensor. */
static inline bool test_same_bits(const rp_weights *a, const rp_weights *b) {
    if (!a || !b || a->num_tensors != b->num_tensors)
        return false;
    for (int t = 0; t < a->num_tensors; t++) {
        size_t n = rp_shape_size(&a->tensors[t].shape) * a->tensors[t].groups;
        if (memcmp(a->tensors[t].data, b->tensors[t].data, sizeof(float) * n) != 0)
            return false;
    }
    return true;
}

/* Two host calls of a new session (threads, or the MPI world mpi) on other
** samples of data, or for a token model (tokens) on a text of 13 symbols
** (8 a sample); the weights of every replica come back, and every loss in
** losses (room for two calls of 64). */
static inline rp_weights *test_two_calls(const rp_model *m, const rp_config *c, bool tokens,
                                         rp_comm *mpi, const rp_dataset *data, float *losses) {
    rp_error err;
    rp_session *s = test_session(m, c, mpi);
    if (!s) {
        test_failures++;
        return NULL;
    }
    long long per = rp_session_samples_per_call(s);
    size_t in = tokens ? 8 : rp_shape_size(&m->input), k = tokens ? 8 : 1;
    int64_t *ids = malloc(sizeof(int64_t) * per);
    float *x = malloc(sizeof(float) * per * in);
    int32_t *y = malloc(sizeof(int32_t) * per * k);
    for (int call = 0; call < 2; call++) {
        for (long long i = 0; i < per; i++) {
            ids[i] = (i * 7 + call * per) % data->n;
            for (size_t t = 0; tokens && t < 8; t++) {
                int tok = (int)((ids[i] * 5 + (long long)t * 3) % 13);
                x[i * 8 + t] = (float)tok;
                y[i * 8 + t] = (tok * 7 + 2) % 13;
            }
        }
        if (!tokens)
            rp_dataset_gather(data, ids, (int)per, x, y);
        rp_result r;
        CHECK_OK(rp_session_run(s, x, y, ids, &r, &err), err);
        CHECK(r.count <= 64);
        memcpy(losses + call * r.count, r.losses, sizeof(float) * (r.count <= 64 ? r.count : 64));
    }
    rp_weights *w = NULL;
    CHECK_OK(rp_session_get_weights(s, RP_ALL_REPLICAS, &w, &err), err);
    free(ids), free(x), free(y);
    rp_session_free(s);
    return w;
}

/* A pipeline test's configuration: `stages` stages split evenly ([-1,
** ...]), seed 5, micro-batches of 3, GA and R as given, every loss out,
** `schedule` (the schedule's keys, "\"schedule\": \"1f1b\""), Adam or SGD
** with momentum, then the keys in extra (", \"key\": value"). */
static inline rp_config test_stages_config(int stages, int GA, int R, const char *schedule,
                                           bool adam, const char *extra) {
    char layers[128] = "[-1", json[1024];
    for (int s = 1; s < stages; s++)
        strcat(layers, ", -1");
    snprintf(json, sizeof json,
             "{\"seed\": 5, \"micro_batch_size\": 3, \"gradient_accumulation_steps\": %d, "
             "\"replication_factor\": %d, \"layers_per_stage\": %s], %s, "
             "\"output_mode\": \"all\", \"optimizer\": %s%s}",
             GA, R, layers, schedule,
             adam ? "{\"type\": \"adam\", \"lr\": 0.01}"
                  : "{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}",
             extra);
    return test_config(json);
}

/* Whether a model (spec; a token model: tokens) trains to the same bits,
** weights and every loss, under configurations a on threads and b on the
** MPI world mpi (NULL: on threads too), two host calls each; the weights'
** largest difference in *diff (-1 when a run failed). */
static inline bool test_same_training(const char *spec, bool tokens, const rp_config *a,
                                      const rp_config *b, rp_comm *mpi, const rp_dataset *data,
                                      double *diff) {
    rp_model *m = test_model(spec);
    float l0[128] = {0}, l1[128] = {0};
    rp_weights *want = test_two_calls(m, a, tokens, NULL, data, l0);
    rp_weights *got = test_two_calls(m, b, tokens, mpi, data, l1);
    bool same = test_same_bits(want, got) && memcmp(l0, l1, sizeof l0) == 0;
    *diff = want && got ? test_weights_diff(want, got) : -1.0;
    rp_weights_free(want), rp_weights_free(got);
    rp_model_free(m);
    return same;
}

/* Host call `call` of an image model on session s, on test_two_calls's
** samples. */
static inline void test_image_call(rp_session *s, const rp_model *m, const rp_dataset *data,
                                   int call) {
    long long per = rp_session_samples_per_call(s);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    float *x = malloc(sizeof(float) * per * rp_shape_size(&m->input));
    int32_t *y = malloc(sizeof(int32_t) * per);
    for (long long i = 0; i < per; i++)
        ids[i] = (i * 7 + call * per) % data->n;
    rp_dataset_gather(data, ids, (int)per, x, y);
    rp_result r;
    rp_error err;
    CHECK_OK(rp_session_run(s, x, y, ids, &r, &err), err);
    free(ids), free(x), free(y);
}

/* One call under `first`, its training state (Adam's moments too) into a
** session under `second`, a second call there: whether that gives the
** weights of two calls straight. */
static inline bool test_resumed_same(const rp_model *m, const rp_config *first,
                                     rp_comm *on_first, const rp_config *second,
                                     rp_comm *on_second, const rp_weights *straight,
                                     const rp_dataset *data) {
    rp_error err;
    rp_train_state half = {0};
    rp_weights *w = NULL;
    rp_session *a = test_session(m, first, on_first), *b = test_session(m, second, on_second);
    if (a && b) {
        test_image_call(a, m, data, 0);
        CHECK_OK(rp_session_get_state(a, &half, &err), err);
        CHECK_OK(rp_session_set_state(b, &half, &err), err);
        test_image_call(b, m, data, 1);
        CHECK_OK(rp_session_get_weights(b, RP_ALL_REPLICAS, &w, &err), err);
    }
    bool same = w && test_same_bits(straight, w);
    rp_weights_free(w);
    rp_train_state_free(&half);
    rp_session_free(a), rp_session_free(b);
    return same;
}

/* A planted mistake in a device's order: its operation at `from` moved back
** to `to` (< from), those between one later. */
static inline void test_move_device_op(rp_device_ops *d, int from, int to) {
    int w = d->worker[from], op = d->op[from];
    memmove(d->worker + to + 1, d->worker + to, sizeof(int) * (from - to));
    memmove(d->op + to + 1, d->op + to, sizeof(int) * (from - to));
    d->worker[to] = w, d->op[to] = op;
}

/* A file's text (a trace the test wrote) into buf of cap bytes, and the
** file removed; its length, 0 when it could not be read. */
static inline size_t test_take_file(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    size_t len = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[len] = 0;
    if (f)
        fclose(f);
    remove(path);
    return len;
}

/* The start of an engine test: n synthetic samples shaped like
** Fashion-MNIST's, and with --mpi the MPI world in *mpi (else NULL). Ends
** the test with the message when either fails. */
static inline void test_start(int argc, char **argv, int n, uint64_t seed, rp_dataset **data,
                              rp_comm **mpi) {
    rp_error err;
    rp_shape shape = {3, {1, 28, 28}};
    *mpi = NULL;
    if (rp_dataset_synthetic(data, n, shape, 10, seed, &err) != RP_OK ||
        (argc > 1 && strcmp(argv[1], "--mpi") == 0 && rp_comm_mpi_init(&argc, &argv, mpi, &err))) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
}

/* Workers of R replicas of a pipeline whose P stages have r[s] workers each. */
static inline int test_workers(int P, const int *r, int R) {
    int w = 0;
    for (int s = 0; s < P; s++)
        w += r[s];
    return w * R;
}

/* The threads or MPI ranks a configuration trains on. */
static inline int test_devices(rp_config c) {
    rp_derived d;
    rp_config_derive(&c, &d);
    return rp_config_devices(&c, &d);
}

/* An engine test's main after test_start: under MPI the part for as many
** workers as there are ranks, else the local part; then the tally (named
** after the test and the rank) and the data freed. */
static inline int test_main(const char *name, rp_comm *mpi, rp_dataset *data,
                            void (*with_mpi)(int ranks), void (*local)(void)) {
    char full[96];
    int rc;
    if (mpi) {
        with_mpi(rp_comm_size(mpi));
        snprintf(full, sizeof full, "%s (mpi rank %d)", name, rp_comm_rank(mpi));
        rc = test_finish(full);
        rp_comm_mpi_finalize(mpi);
    } else {
        local();
        snprintf(full, sizeof full, "%s (local)", name);
        rc = test_finish(full);
    }
    rp_dataset_free(data);
    return rc;
}

#endif /* REPIPE_TEST_SUPPORT_H */
