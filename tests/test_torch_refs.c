/*
** Agreement with PyTorch: every layer and both example models against the
** outputs and gradients in tests/torch/refs.txt (written by
** tests/torch/make_refs.py with python3-torch; this test needs no torch).
** Parameters, inputs and output weights come from the same integer formula
** on both sides.
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "../src/core/util.h"
#include "../src/layers/layers_impl.h"
#include "repipe/net.h"
#include "test.h"

static double value(long long i, long long salt, double scale) {
    return (((i * 7919 + salt * 104729) % 2003) / 2003.0 - 0.5) * scale;
}

static void fill(float *x, size_t n, long long salt, double scale) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)value((long long)i, salt, scale);
}

/* |got - want| <= atol + rtol * |want| for every element */
static void check_vec(const char *what, const float *got, const float *want, size_t n,
                      double atol, double rtol) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= atol + rtol * fabs(want[i]))) {
            if (!bad++)
                first = i;
        }
    test_checks++;
    if (bad) {
        fprintf(stderr, "%s: %zu of %zu differ; first [%zu]: %.9g vs torch %.9g\n", what, bad, n,
                first, got[first], want[first]);
        test_failures++;
    }
}

typedef struct entry {
    char name[64];
    int n;
    float *v;
    double *d; /* the same numbers as read in double precision */
} entry;

typedef struct tcase {
    char name[64], kind[16];
    int batch;
    char spec[1024];
    int num;
    entry e[16];
} tcase;

static const entry *get(const tcase *c, const char *name) {
    for (int i = 0; i < c->num; i++)
        if (strcmp(c->e[i].name, name) == 0)
            return &c->e[i];
    fprintf(stderr, "case %s: no entry %s\n", c->name, name);
    test_failures++;
    return NULL;
}

/* An entry the case may hold. */
static const entry *find(const tcase *c, const char *name) {
    for (int i = 0; i < c->num; i++)
        if (strcmp(c->e[i].name, name) == 0)
            return &c->e[i];
    return NULL;
}

static void layer_case(const tcase *c, const rp_model *m) {
    int B = c->batch;
    rp_net *net;
    rp_acts *acts;
    rp_error err;
    rp_net_options no = {.stat_slots = 1}; /* batchnorm records its statistics */
    CHECK(rp_net_create_with(m, 0, m->num_layers, B, &no, &net, &err) == RP_OK);
    CHECK(rp_acts_create(net, B, &acts, &err) == RP_OK);
    float *p = rp_net_params(net);
    for (int v = 0; v < m->num_vars; v++)
        fill(p + m->vars[v].offset, m->vars[v].count, 100 + v, 0.5);
    size_t in = rp_net_in_size(net) * B, out = rp_net_out_size(net) * B;
    float *x = malloc(sizeof(float) * in), *r = malloc(sizeof(float) * out);
    if (m->layers[0].type == RP_LAYER_EMBEDDING) {
        int T = m->input.dim[0];
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                x[b * T + t] = (float)((b * T + t) * 13 % m->layers[0].vocab);
    } else {
        fill(x, in, 1, 4.0);
    }
    fill(r, out, 7, 2.0);
    rp_step_ctx ctx = {.training = true, .loss_scale = 1, .stat_slot = 1};
    const float *y = rp_net_forward(net, acts, x, B, &ctx, NULL);
    const entry *e = get(c, "out");
    char what[256];
    if (y && e) {
        CHECK_INT(e->n, (long long)out);
        snprintf(what, sizeof what, "%s: out", c->name);
        check_vec(what, y, e->v, out, 1e-6, 1e-5);
    }
    memset(rp_net_grads(net), 0, sizeof(float) * rp_net_num_params(net));
    bool want_din = m->layers[0].type != RP_LAYER_EMBEDDING;
    const float *din = rp_net_backward(net, acts, r, &ctx, want_din);
    if (want_din && (e = get(c, "din"))) {
        snprintf(what, sizeof what, "%s: input gradient", c->name);
        check_vec(what, din, e->v, in, 1e-6, 1e-5);
    }
    rp_net_running_next(net); /* a batchnorm's running statistics after the forward */
    rp_net_running_commit(net);
    for (int v = 0; v < m->num_vars; v++) {
        char key[24];
        snprintf(key, sizeof key, "after%d", v);
        if ((e = find(c, key))) {
            CHECK_INT(e->n, (long long)m->vars[v].count);
            snprintf(what, sizeof what, "%s: %s after the forward", c->name, m->vars[v].name);
            check_vec(what, rp_net_params(net) + m->vars[v].offset, e->v, m->vars[v].count,
                      1e-6, 1e-5);
            continue;
        }
        snprintf(key, sizeof key, "grad%d", v);
        if ((e = get(c, key))) {
            CHECK_INT(e->n, (long long)m->vars[v].count);
            snprintf(what, sizeof what, "%s: gradient of %s", c->name, m->vars[v].name);
            check_vec(what, rp_net_grads(net) + m->vars[v].offset, e->v, m->vars[v].count, 1e-5,
                      1e-5);
        }
    }
    free(x), free(r);
    rp_acts_free(acts);
    rp_net_free(net);
}

/* A whole model as two stages: the layers, then the loss. */
static void model_case(const tcase *c, const rp_model *m) {
    int B = c->batch, L = m->num_layers;
    rp_net *body, *loss;
    rp_acts *ab, *al;
    rp_error err;
    CHECK(rp_net_create(m, 0, L - 1, B, &body, &err) == RP_OK);
    CHECK(rp_net_create(m, L - 1, L, B, &loss, &err) == RP_OK);
    CHECK(rp_acts_create(body, B, &ab, &err) == RP_OK);
    CHECK(rp_acts_create(loss, B, &al, &err) == RP_OK);
    float *p = rp_net_params(body);
    for (int v = 0; v < m->num_vars; v++)
        fill(p + m->vars[v].offset, m->vars[v].count, 100 + v, 0.5);
    size_t in = rp_net_in_size(body) * B;
    float *x = malloc(sizeof(float) * in);
    for (size_t i = 0; i < in; i++)
        x[i] = (float)value((long long)i, 1, 2.0) + 0.5f;
    int32_t labels[64];
    for (int i = 0; i < B; i++)
        labels[i] = (i * 31 + 3) % 10;
    rp_step_ctx ctx = {.training = true, .labels = labels, .loss_scale = 1.0 / B};
    const float *logits = rp_net_forward(body, ab, x, B, &ctx, NULL);
    double sum;
    CHECK(rp_net_forward(loss, al, logits, B, &ctx, &sum) != NULL);
    char what[256];
    const entry *e = get(c, "logits");
    if (e) {
        snprintf(what, sizeof what, "%s: logits", c->name);
        check_vec(what, logits, e->v, (size_t)B * 10, 1e-5, 1e-4);
    }
    if ((e = get(c, "loss")))
        CHECK_CLOSE(sum / B, e->v[0], 1e-5);
    memset(rp_net_grads(body), 0, sizeof(float) * rp_net_num_params(body));
    const float *dlogits = rp_net_backward(loss, al, NULL, &ctx, true);
    rp_net_backward(body, ab, dlogits, &ctx, false);
    for (int v = 0; v < m->num_vars; v++) {
        char key[32];
        snprintf(key, sizeof key, "grad%d.stats", v);
        if (!(e = get(c, key)))
            continue;
        const float *g = rp_net_grads(body) + m->vars[v].offset;
        size_t n = m->vars[v].count;
        double s = 0, sa = 0;
        for (size_t i = 0; i < n; i++) {
            s += g[i];
            sa += fabs(g[i]);
        }
        snprintf(what, sizeof what, "%s: gradient of %s", c->name, m->vars[v].name);
        CHECK(fabs(s - e->v[0]) <= 1e-4 * e->v[1] + 1e-7);
        CHECK_CLOSE(sa, e->v[1], 1e-4);
        float picks[64];
        for (int k = 0; k < 64; k++)
            picks[k] = g[(size_t)k * n / 64];
        check_vec(what, picks, e->v + 2, 64, 1e-4 * e->v[1] / n + 1e-7, 1e-3);
    }
    free(x);
    rp_acts_free(ab), rp_acts_free(al);
    rp_net_free(body), rp_net_free(loss);
}

/* moe's router alone, in double precision, against PyTorch's float64: the
** chosen experts, their gates, the balance loss and the scores' gradient
** within 1e-10 (make_refs.py's router_case). */
static void router_case(const tcase *c, const rp_model *m) {
    const rp_layer *L = &m->layers[0];
    int E = L->experts, K = L->top_k, T = L->in.dim[0], B = c->batch;
    size_t R = (size_t)B * T;
    double *s = malloc(sizeof(double) * R * E), *u = malloc(sizeof(double) * R * E);
    double *g = malloc(sizeof(double) * R * K), *dg = malloc(sizeof(double) * R * K);
    double *ds = malloc(sizeof(double) * R * E);
    int *chosen = malloc(sizeof(int) * R * K);
    for (size_t i = 0; i < R * E; i++)
        s[i] = value((long long)i, 3, 6.0);
    for (size_t i = 0; i < R * K; i++)
        dg[i] = value((long long)i, 9, 2.0);
    rpi_moe_route(L, s, R, u, chosen, g);
    const entry *e;
    if ((e = get(c, "chosen")) && e->n == (int)(R * K))
        for (size_t i = 0; i < R * K; i++)
            CHECK_INT(chosen[i], (long long)e->d[i]);
    if ((e = get(c, "gate")) && e->n == (int)(R * K))
        for (size_t i = 0; i < R * K; i++)
            CHECK_CLOSE(g[i], e->d[i], 1e-10);
    double loss = rpi_moe_balance_loss(L, u, chosen, R, T);
    if ((e = get(c, "loss")))
        CHECK_CLOSE(loss, e->d[0], 1e-10);
    rpi_moe_route_backward(L, u, chosen, g, dg, 1.0 / B, R, T, ds);
    if ((e = get(c, "dlogits")) && e->n == (int)(R * E))
        for (size_t i = 0; i < R * E; i++)
            CHECK(fabs(ds[i] - e->d[i]) <= 1e-10 * (1 + fabs(e->d[i])));
    free(s), free(u), free(g), free(dg), free(ds), free(chosen);
}

static int read_cases(const char *path);

int main(int argc, char **argv) {
    int cases = 0;
    for (int f = 1; f < argc; f++)
        cases += read_cases(argv[f]);
    /* every case make_refs.py writes (refs.txt, and moe_refs.txt with --moe): a missing one
    ** is a failure */
    CHECK_INT(cases, 36 + 7);
    printf("%d cases compared with PyTorch\n", cases);
    return test_finish("test_torch_refs");
}

/* The cases of one file, each compared as it ends; their number. */
static int read_cases(const char *path) {
    char *text;
    size_t len;
    rp_error err;
    if (rp_read_file(path, &text, &len, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        test_failures++;
        return 0;
    }
    int cases = 0;
    char *save = NULL;
    tcase c;
    memset(&c, 0, sizeof c);
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#')
            continue;
        if (strncmp(line, "case ", 5) == 0) {
            memset(&c, 0, sizeof c);
            sscanf(line, "case %63s %15s %d", c.name, c.kind, &c.batch);
        } else if (strncmp(line, "spec ", 5) == 0) {
            /* " | " separates the lines of the spec */
            size_t o = 0;
            for (const char *s = line + 5; *s && o < sizeof c.spec - 1; s++) {
                if (strncmp(s, " | ", 3) == 0) {
                    c.spec[o++] = '\n';
                    s += 2;
                } else {
                    c.spec[o++] = *s;
                }
            }
        } else if (strcmp(line, "end") == 0) {
            rp_model *m;
            CHECK(rp_model_parse(&m, c.spec, strlen(c.spec), c.name, &err) == RP_OK);
            if (m) {
                if (strcmp(c.kind, "layer") == 0)
                    layer_case(&c, m);
                else if (strcmp(c.kind, "router") == 0)
                    router_case(&c, m);
                else
                    model_case(&c, m);
                rp_model_free(m);
            }
            for (int i = 0; i < c.num; i++)
                free(c.e[i].v), free(c.e[i].d);
            cases++;
        } else if (c.num < 16) {
            entry *e = &c.e[c.num++];
            char *p = line;
            int used = 0;
            sscanf(p, "%63s %d%n", e->name, &e->n, &used);
            p += used;
            e->v = malloc(sizeof(float) * (e->n ? e->n : 1));
            e->d = malloc(sizeof(double) * (e->n ? e->n : 1));
            for (int i = 0; i < e->n; i++) {
                e->d[i] = strtod(p, &p);
                e->v[i] = (float)e->d[i];
            }
        }
    }
    free(text);
    return cases;
}
