/*
** Profiles of repipe models, measured on this machine: every layer timed
** inside whole passes of the model, or alone where the whole is too big.
*/
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/blas.h"
#include "../core/util.h"
#include "repipe/profile.h"
#include "repipe/net.h"

static char *dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), rp_cmp_double);
    return v[n / 2];
}

/* The passes whole_passes times: a warm-up, then each repeat a whole
** backward and (any: some layer has parameters) a split one; the net's
** input needs no gradient, as on a first stage. t: per layer and repeat,
** forward, backward, and the split's halves. */
static rp_status time_passes(rp_net *net, rp_acts *acts, int L, int batch, int repeats, bool any,
                             const float *x, const float *dy, const int32_t *labels,
                             const int64_t *ids, double *clk, double *t, rp_error *err) {
    rp_step_ctx ctx = {.training = true, .sample_id = ids, .labels = labels,
                       .loss_scale = 1.0 / batch};
    for (int r = -1; r < repeats; r++) {
        memset(clk, 0, sizeof(double) * 3 * L);
        rp_net_time_layers(net, clk);
        if (!rp_net_forward(net, acts, x, batch, &ctx, NULL)) {
            return rp_fail(err, RP_ERR_INVALID, "profile: %s", rp_net_error(net));
        }
        rp_net_backward(net, acts, dy, &ctx, false);
        for (int l = 0; r >= 0 && l < L; l++)
            t[(0 * L + l) * repeats + r] = clk[3 * l], t[(1 * L + l) * repeats + r] = clk[3 * l + 1];
        rp_net_time_layers(net, NULL);
        if (!any || r < 0)
            continue;
        rp_net_forward(net, acts, x, batch, &ctx, NULL);
        memset(clk, 0, sizeof(double) * 3 * L);
        rp_net_time_layers(net, clk);
        rp_net_backward_input(net, acts, dy, &ctx, false);
        rp_net_backward_weight(net, acts, &ctx);
        rp_net_time_layers(net, NULL);
        for (int l = 0; l < L; l++)
            t[(2 * L + l) * repeats + r] = clk[3 * l + 1], t[(3 * L + l) * repeats + r] = clk[3 * l + 2];
    }
    return RP_OK;
}

/* Every layer timed inside whole passes of the model, as a stage runs
** it (PipeDream's profiler times layers so). Why: a layer timed alone keeps
** its weights and their gradients in the caches from one run to the next,
** while in a pass the other layers' take their place. An MLP of six
** 768-wide layers, 28 MB of both, took 7-11 % longer forward and 8-18 %
** longer backward in whole passes than its layers alone (2 cores sharing
** a 32 MB cache), as it does in the engine; a GPT of four blocks, whose
** products reuse each weight over many more rows, moved less. ms receives
** per layer its median forward, backward, backward's input half and
** weights' half (labels and ids: a micro-batch's). *done stays false, and
** ms untouched, where the parameters, their gradients and a micro-batch's
** activations would take more than a quarter of the memory, or cannot be
** had: the layers are then timed alone. */
static rp_status whole_passes(const rp_model *m, int batch, int repeats,
                              const int32_t *labels, const int64_t *ids, double *ms, bool *done,
                              rp_error *err) {
    *done = false;
    int L = m->num_layers;
    double params = 0;
    bool any = false;
    for (int l = 0; l < L; l++)
        params += m->layers[l].param_count, any = any || m->layers[l].param_count > 0;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double room = pages > 0 && page > 0 ? (double)pages * page / 4 : 1e300;
    if (2 * sizeof(float) * params > room) /* not even the net: no need to try */
        return RP_OK;
    rp_net_options o = {.split_backward = any};
    rp_net *net = NULL;
    rp_acts *acts = NULL;
    rp_status st = rp_net_create_with(m, 0, L, batch, &o, &net, err);
    if (st) /* too big a net is no error: its layers are timed alone */
        return st == RP_ERR_NOMEM ? RP_OK : st;
    double bytes = 2 * sizeof(float) * params + (double)rp_acts_bytes(net, batch);
    if (bytes > room || (st = rp_acts_create(net, batch, &acts, err))) {
        rp_net_free(net);
        return st == RP_ERR_NOMEM ? RP_OK : st;
    }
    rp_model_init_params(m, 0, L, 1, NULL, rp_net_params(net));
    size_t ni = rp_net_in_size(net) * batch, no = rp_net_out_size(net) * batch;
    float *x = malloc(sizeof(float) * ni), *dy = malloc(sizeof(float) * no);
    double *clk = malloc(sizeof(double) * 3 * L), *t = malloc(sizeof(double) * 4 * L * repeats);
    if (!x || !dy || !clk || !t) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    int vocab = 0; /* token ids where an embedding reads the input */
    for (int l = 0; l < L; l++)
        for (int i = 0; i < m->layers[l].num_inputs; i++)
            if (m->layers[l].inputs[i] < 0 && m->layers[l].type == RP_LAYER_EMBEDDING)
                vocab = m->layers[l].vocab;
    for (size_t i = 0; i < ni; i++)
        x[i] = vocab ? (float)(i % vocab) : (float)((i % 17) * 0.1);
    for (size_t i = 0; i < no; i++)
        dy[i] = 1e-3f;
    if ((st = time_passes(net, acts, L, batch, repeats, any, x, dy, labels, ids, clk, t, err)))
        goto done;
    for (int k = 0; k < (any ? 4 : 2); k++)
        for (int l = 0; l < L; l++)
            ms[4 * l + k] = 1e3 * median(t + (k * L + l) * repeats, repeats);
    *done = true;
done:
    free(x), free(dy), free(clk), free(t);
    rp_acts_free(acts);
    rp_net_free(net);
    return st;
}

/* Layer l timed alone, on what it reads: a[0..3] its median forward,
** backward and, for a layer with parameters, a split backward's input and
** weights' halves. below: a layer below it has parameters (then its
** backward computes its input's gradient, as on a later stage). fw, bw,
** bi, bwt: repeats doubles each; labels and ids: a micro-batch's. */
static rp_status time_alone(const rp_model *m, int l, int batch, int repeats, bool below,
                            double *fw, double *bw, double *bi, double *bwt,
                            const int32_t *labels, const int64_t *ids, double *a, rp_error *err) {
    const rp_layer *L = &m->layers[l];
    rp_net *net = NULL;
    rp_acts *acts = NULL;
    /* its inputs in, its output out; a layer with parameters also timed
    ** in a split backward's two halves */
    rp_net_options one = {.alone = true, .split_backward = L->param_count > 0};
    rp_status st = rp_net_create_with(m, l, l + 1, batch, &one, &net, err);
    if (st || (st = rp_acts_create(net, batch, &acts, err))) {
        rp_net_free(net);
        return st;
    }
    rp_model_init_params(m, l, l + 1, 1, NULL, rp_net_params(net));
    size_t ni = rp_net_in_size(net) * batch, no = rp_net_out_size(net) * batch;
    float *x = malloc(sizeof(float) * ni), *dy = malloc(sizeof(float) * no);
    if (!x || !dy) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < ni; i++) /* token ids for embeddings, values otherwise */
        x[i] = L->type == RP_LAYER_EMBEDDING ? (float)(i % L->vocab) : (float)((i % 17) * 0.1);
    for (size_t i = 0; i < no; i++)
        dy[i] = 1e-3f;
    rp_step_ctx ctx = {.training = true, .sample_id = ids, .labels = labels,
                       .loss_scale = 1.0 / batch};
    rp_net_forward(net, acts, x, batch, &ctx, NULL); /* warm up */
    for (int r = 0; r < repeats; r++) {
        double t = rp_now();
        rp_net_forward(net, acts, x, batch, &ctx, NULL);
        fw[r] = rp_now() - t;
        t = rp_now();
        rp_net_backward(net, acts, dy, &ctx, below);
        bw[r] = rp_now() - t;
        if (!one.split_backward)
            continue;
        rp_net_forward(net, acts, x, batch, &ctx, NULL);
        t = rp_now();
        rp_net_backward_input(net, acts, dy, &ctx, below);
        bi[r] = rp_now() - t;
        t = rp_now();
        rp_net_backward_weight(net, acts, &ctx);
        bwt[r] = rp_now() - t;
    }
    a[0] = 1e3 * median(fw, repeats), a[1] = 1e3 * median(bw, repeats);
    if (one.split_backward)
        a[2] = 1e3 * median(bi, repeats), a[3] = 1e3 * median(bwt, repeats);
done:
    free(x), free(dy);
    rp_acts_free(acts);
    rp_net_free(net);
    return st;
}

/* Layer l's node, after the input's: its times (t: forward, backward and
** the split backward's halves), its output's and parameters' bytes, its
** memory as a net lays it out (which the simulator counts) in its
** description, and an edge from the maker of each tensor it reads (node
** k + 1 made tensor k). */
static rp_status add_node(const rp_model *m, int l, int batch, const double *t, rp_profile *p,
                          rp_error *err) {
    const rp_layer *L = &m->layers[l];
    rp_profile_node *n = &p->nodes[p->num_nodes];
    char id[32], desc[320];
    snprintf(id, sizeof id, "node%d", l + 1);
    int dl = snprintf(desc, sizeof desc, "%s (layer %d, line %d)", rp_layer_name(L->type), l,
                      L->line);
    if (L->param_count > 0) /* the halves as they run: their sum is the whole's and the split's copies */
        dl += snprintf(desc + dl, sizeof desc - dl,
                       " backward_input_time=%.3f backward_weight_time=%.3f", t[2], t[3]);
    rp_layer_bytes lb;
    rp_layer_memory(m, l, batch, &lb);
    snprintf(desc + dl, sizeof desc - dl,
             " saved_bytes=%zu checkpoint_bytes=%zu wstash_bytes=%zu scratch_bytes=%zu"
             " grad_bytes=%zu",
             lb.saved, lb.checkpoint, lb.wstash, lb.scratch, lb.grads);
    n->id = dupstr(id);
    n->desc = dupstr(desc);
    n->forward_ms = t[0];
    n->backward_ms = t[1];
    n->activation_bytes = sizeof(float) * rp_shape_size(&L->out) * (double)batch;
    n->parameter_bytes = sizeof(float) * (double)L->param_count;
    n->stage_id = -1;
    n->line = L->line;
    p->num_nodes++;
    for (int i = 0; i < L->num_inputs; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++)
            seen = seen || L->inputs[j] == L->inputs[i];
        if (!seen)
            p->edges[p->num_edges++] = (rp_profile_edge){L->inputs[i] + 1, l + 1, 0};
    }
    if (!n->id || !n->desc)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    return RP_OK;
}

static rp_status measure(const rp_model *m, int batch, int repeats, bool alone,
                         rp_profile **out, rp_error *err) {
    *out = NULL;
    if (batch < 1 || repeats < 1)
        return rp_fail(err, RP_ERR_INVALID, "profile: batch and repeats must be >= 1");
    rp_profile *p = calloc(1, sizeof *p);
    if (!p || !(p->nodes = calloc(m->num_layers + 1, sizeof(rp_profile_node))) ||
        !(p->edges = calloc((size_t)m->num_layers * RP_MAX_INPUTS + 1, sizeof(rp_profile_edge)))) {
        rp_profile_free(p);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    double *fw = malloc(sizeof(double) * repeats), *bw = malloc(sizeof(double) * repeats);
    double *bi = calloc(repeats, sizeof(double)), *bwt = calloc(repeats, sizeof(double));
    /* per layer: forward, backward, and the split backward's two halves */
    double *t = calloc(4 * (size_t)m->num_layers + 1, sizeof(double));
    int32_t *labels = calloc((size_t)batch * m->num_targets, sizeof(int32_t)); /* a row each */
    int64_t *ids = calloc(batch, sizeof(int64_t));
    rp_status st = RP_OK;
    bool in_passes = false;
    if (!fw || !bw || !bi || !bwt || !t || !labels || !ids) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* the input: PipeDream's convention, a source named Input */
    rp_profile_node *in = &p->nodes[p->num_nodes++];
    in->id = dupstr("node0");
    in->activation_bytes = sizeof(float) * rp_shape_size(&m->input) * (double)batch;
    in->stage_id = -1;
    if ((st = rpi_blas_single(err))) /* one thread, as a worker of the engine runs them */
        goto done;
    if (!alone && (st = whole_passes(m, batch, repeats, labels, ids, t, &in_passes, err)))
        goto done;
    /* A layer's backward computes its input's gradient only when a layer
    ** below it has parameters, as the engine's first stage does: the first
    ** linear of an MLP skips a product as large as its weight gradient. */
    bool below = false;
    for (int l = 0; l < m->num_layers && !st; l++) {
        const rp_layer *L = &m->layers[l];
        if (!in_passes && (st = time_alone(m, l, batch, repeats, below, fw, bw, bi, bwt, labels,
                                           ids, t + 4 * l, err)))
            break;
        below = below || L->param_count > 0;
        st = add_node(m, l, batch, t + 4 * l, p, err);
    }
    /* the micro-batch rides in the description, where PipeDream's reader
    ** ignores it and simulate and plan find it (rp_profile_micro_batch) */
    char desc0[80];
    snprintf(desc0, sizeof desc0, "Input0 micro_batch=%d %s", batch,
             in_passes ? "timed_in=whole_passes" : "timed_in=layers_alone");
    if (!st && !(in->desc = dupstr(desc0)))
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
done:
    free(fw), free(bw), free(bi), free(bwt), free(t), free(labels), free(ids);
    if (st) {
        rp_profile_free(p);
        return st;
    }
    *out = p;
    return RP_OK;
}

/* Times as the engine's workers see them: denormals flushed. */
static rp_status measure_flushed(const rp_model *m, int batch, int repeats, bool alone,
                                 rp_profile **out, rp_error *err) {
    unsigned fpu = rpi_fpu_enter();
    rp_status st = measure(m, batch, repeats, alone, out, err);
    rpi_fpu_leave(fpu);
    return st;
}

rp_status rp_profile_measure(const rp_model *m, int batch, int repeats, rp_profile **out,
                             rp_error *err) {
    return measure_flushed(m, batch, repeats, false, out, err);
}

rp_status rp_profile_measure_alone(const rp_model *m, int batch, int repeats, rp_profile **out,
                                   rp_error *err) {
    return measure_flushed(m, batch, repeats, true, out, err);
}
