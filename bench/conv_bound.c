/*
** bench/conv_bound: the convolutions of a model against the bound of their
** matrix products. For every conv2d of the spec, the three products of its
** lowering to matrices per micro-batch of B (forward W x col, the weight
** gradient dout x col^T, the column gradient W^T x dout), timed alone with
** the same shapes and the same BLAS: with every kernel tap (im2col's
** textbook lowering, "full"), and with the taps that reach the input
** ("kept": what the engine multiplies; fewer only where a tap lands on
** padding alone, as a 3 x 3 kernel on a 1 x 1 plane); beside them the
** layer's forward and backward as the engine runs them (a net of the one
** layer, fed what it reads). The products run as the engine runs them
** (rpi_sgemm: oneDNN's sgemm where it is ahead, OpenBLAS's elsewhere), and
** for a 1 x 1 convolution the engine runs as a product a sample
** (rpi_conv_pointwise), a product a sample. Best of R runs of each. kept / layer is the
** fraction of a layer's time its products take: the rest is im2col,
** col2im, bias and copies.
** Where the engine runs a layer through oneDNN (column "kernel"), its bound
** is oneDNN's three kernels alone (forward, the input's gradient, the
** weights'), each in the layouts it chose, timed here with oneDNN itself:
** bound / layer is then the fraction the kernels take of the layer as run,
** the rest the reorders to and from the engine's NCHW buffers. Without
** oneDNN's header at build, that column reads "-".
** Usage: bench_conv_bound MODEL [B] [R]
*/
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/blas.h"
#include "../src/core/util.h"
#include "../src/layers/layers_impl.h"
#include "repipe/repipe.h"

static double best_of(double a, double b) { return a < b ? a : b; }

#ifdef REPIPE_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

/* A memory object of md, filled with small values. */
static dnnl_memory_t filled(dnnl_engine_t e, const dnnl_memory_desc_t *md) {
    dnnl_memory_t m;
    void *h;
    dnnl_memory_create(&m, md, e, DNNL_MEMORY_ALLOCATE);
    dnnl_memory_get_data_handle(m, &h);
    for (size_t i = 0; i < dnnl_memory_desc_get_size(md) / sizeof(float); i++)
        ((float *)h)[i] = (float)(i % 13) * 0.01f;
    return m;
}

/* One kernel of pd run R times with its arguments' layouts as pd chose
** them: the best time. */
static double kernel_time(dnnl_engine_t e, dnnl_stream_t s, const_dnnl_primitive_desc_t pd,
                          const int *args, const dnnl_query_t *q, int n, int R) {
    dnnl_primitive_t p;
    dnnl_exec_arg_t a[4];
    dnnl_primitive_create(&p, pd);
    for (int i = 0; i < n; i++)
        a[i] = (dnnl_exec_arg_t){args[i], filled(e, dnnl_primitive_desc_query_md(pd, q[i], 0))};
    double best = 1e30;
    for (int r = 0; r <= R; r++) {
        double t = rp_now();
        dnnl_primitive_execute(p, s, n, a);
        dnnl_stream_wait(s);
        if (r > 0)
            best = best_of(best, rp_now() - t);
    }
    for (int i = 0; i < n; i++)
        dnnl_memory_destroy(a[i].memory);
    dnnl_primitive_destroy(p);
    return best;
}

/* oneDNN's forward, input-gradient and weight-gradient kernels of layer L
** at batch B (no bias: the layers here have none, or a bias's share is
** small), one thread, layouts of oneDNN's choosing. */
static double dnnl_bound(const rp_layer *L, int B, int R) {
    static dnnl_engine_t e;
    static dnnl_stream_t s;
    if (!e && (dnnl_engine_create(&e, dnnl_cpu, 0) ||
               dnnl_stream_create(&s, e, dnnl_stream_default_flags)))
        return -1;
    int G = L->groups;
    dnnl_dims_t src = {B, L->in.dim[0], L->in.dim[1], L->in.dim[2]};
    dnnl_dims_t dst = {B, L->out.dim[0], L->out.dim[1], L->out.dim[2]};
    dnnl_dims_t w4 = {L->units, L->in.dim[0], L->kernel, L->kernel};
    dnnl_dims_t w5 = {G, L->units / G, L->in.dim[0] / G, L->kernel, L->kernel};
    dnnl_dims_t st = {L->stride, L->stride}, pad = {L->pad, L->pad};
    dnnl_memory_desc_t ms, mw, md;
    dnnl_memory_desc_init_by_tag(&ms, 4, src, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&md, 4, dst, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&mw, G > 1 ? 5 : 4, G > 1 ? w5 : w4, dnnl_f32,
                                 dnnl_format_tag_any);
    dnnl_convolution_desc_t f, bd, bw;
    dnnl_primitive_desc_t pf, pbd, pbw;
    if (dnnl_convolution_forward_desc_init(&f, dnnl_forward_training, dnnl_convolution_direct,
                                           &ms, &mw, NULL, &md, st, pad, pad) ||
        dnnl_primitive_desc_create(&pf, &f, NULL, e, NULL) ||
        dnnl_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct, &ms, &mw, &md, st,
                                                 pad, pad) ||
        dnnl_primitive_desc_create(&pbd, &bd, NULL, e, pf) ||
        dnnl_convolution_backward_weights_desc_init(&bw, dnnl_convolution_direct, &ms, &mw, NULL,
                                                    &md, st, pad, pad) ||
        dnnl_primitive_desc_create(&pbw, &bw, NULL, e, pf))
        return -1;
    static const int fa[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
    static const dnnl_query_t fq[] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md};
    static const int da[] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
    static const dnnl_query_t dq[] = {dnnl_query_diff_dst_md, dnnl_query_weights_md,
                                      dnnl_query_diff_src_md};
    static const int wa[] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS};
    static const dnnl_query_t wq[] = {dnnl_query_src_md, dnnl_query_diff_dst_md,
                                      dnnl_query_diff_weights_md};
    double t = kernel_time(e, s, pf, fa, fq, 3, R) + kernel_time(e, s, pbd, da, dq, 3, R) +
               kernel_time(e, s, pbw, wa, wq, 3, R);
    dnnl_primitive_desc_destroy(pf), dnnl_primitive_desc_destroy(pbd);
    dnnl_primitive_desc_destroy(pbw);
    return t;
}
#else
static double dnnl_bound(const rp_layer *L, int B, int R) {
    (void)L, (void)B, (void)R;
    return -1;
}
#endif

/* Kernel offsets k whose input index o S - P + k lies inside [0, n) for
** some output o: the engine's rule for the taps it keeps. */
static int reaching(int K, int n_out, int n_in, int S, int P) {
    int r = 0;
    for (int k = 0; k < K; k++)
        for (int o = 0; o < n_out; o++)
            if (o * S - P + k >= 0 && o * S - P + k < n_in) {
                r++;
                break;
            }
    return r;
}

/* The three products of one group's lowering, best of R runs. */
/* The three products of a group's lowering, G times: one of N columns, or
** with samples > 0 one per sample of N / samples columns (the weights'
** gradient added over the samples), as the engine runs a pointwise layer. */
static double products(int G, int O, int K, int N, int samples, int R) {
    size_t big = (size_t)K * N > (size_t)O * N ? (size_t)K * N : (size_t)O * N;
    float *w = calloc((size_t)O * K, sizeof(float)), *col = calloc(big, sizeof(float));
    float *out = calloc(big, sizeof(float)), *dw = calloc((size_t)O * K, sizeof(float));
    for (size_t i = 0; i < big; i++)
        col[i] = (float)(i % 7) * 0.1f, out[i] = (float)(i % 5) * 0.1f;
    int S = samples > 0 ? samples : 1, n = N / S;
    double g = 1e30;
    for (int r = 0; r < R; r++) {
        double t = rp_now();
        for (int k = 0; k < G; k++)
            for (int s = 0; s < S; s++) {
                float *c = col + (size_t)s * K * n, *o = out + (size_t)s * O * n;
                rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, O, n, K, 1, w, K, c, n, 0,
                          o, n);
                rpi_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, O, K, n, 1, o, n, c, n,
                          s > 0 ? 1 : 0, dw, K);
                rpi_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, n, O, 1, w, K, o, n, 0, c,
                          n);
            }
        g = best_of(g, rp_now() - t);
    }
    free(w), free(col), free(out), free(dw);
    return g;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_conv_bound MODEL [B] [R]\n");
        return 2;
    }
    int B = argc > 2 ? atoi(argv[2]) : 64, R = argc > 3 ? atoi(argv[3]) : 5;
    rp_model *m;
    rp_error err;
    if (rp_model_load(&m, argv[1], &err)) {
        fprintf(stderr, "bench_conv_bound: %s\n", err.msg);
        return 1;
    }
    if (rpi_blas_single(&err)) {
        fprintf(stderr, "bench_conv_bound: %s\n", err.msg);
        return 1;
    }
    openblas_set_num_threads(1);
    double full_total = 0, gemm_total = 0, layer_total = 0, bound_total = 0;
    printf("%-6s %-28s %10s %10s %8s %10s %10s %13s\n", "layer", "shape (O, CKK/G, B*HW)", "full",
           "kept", "kernel", "bound", "layer", "bound / layer");
    for (int l = 0; l < m->num_layers; l++) {
        const rp_layer *L = &m->layers[l];
        if (L->type != RP_LAYER_CONV2D)
            continue;
        int G = L->groups, O = L->units / G, K = L->in.dim[0] * L->kernel * L->kernel / G;
        int N = B * L->out.dim[1] * L->out.dim[2];
        int T = reaching(L->kernel, L->out.dim[1], L->in.dim[1], L->stride, L->pad) *
                reaching(L->kernel, L->out.dim[2], L->in.dim[2], L->stride, L->pad);
        if (L->kernel * L->kernel > 64) /* the engine keeps every tap of larger kernels */
            T = L->kernel * L->kernel;
        int per_sample = rpi_conv_pointwise(L) ? B : 0;
        double full = products(G, O, K, N, per_sample, R);
        double g = T == L->kernel * L->kernel
                       ? full
                       : products(G, O, L->in.dim[0] / G * T, N, per_sample, R);
        double bound = g; /* im2col's: the kept products */
        /* the layer as the engine runs it */
        rp_net *net;
        rp_acts *acts;
        rp_net_options alone = {.alone = true};
        if (rp_net_create_with(m, l, l + 1, B, &alone, &net, &err) ||
            rp_acts_create(net, B, &acts, &err)) {
            fprintf(stderr, "bench_conv_bound: %s\n", err.msg);
            return 1;
        }
        const char *kernel = rp_net_conv_kernel(net, l);
        if (strcmp(kernel, "onednn") == 0)
            bound = dnnl_bound(L, B, R);
        size_t ni = rp_net_in_size(net) * B, no = rp_net_out_size(net) * B;
        float *x = malloc(sizeof(float) * ni), *dy = malloc(sizeof(float) * no);
        for (size_t i = 0; i < ni; i++)
            x[i] = (float)(i % 17) * 0.1f;
        for (size_t i = 0; i < no; i++)
            dy[i] = 1e-3f;
        rp_model_init_params(m, l, l + 1, 1, NULL, rp_net_params(net));
        rp_step_ctx ctx = {.training = true, .loss_scale = 1};
        double lt = 1e30;
        for (int r = 0; r <= R; r++) {
            double t = rp_now();
            rp_net_forward(net, acts, x, B, &ctx, NULL);
            rp_net_backward(net, acts, dy, &ctx, true);
            if (r > 0) /* the first warms up */
                lt = best_of(lt, rp_now() - t);
        }
        free(x), free(dy);
        rp_acts_free(acts);
        rp_net_free(net);
        char shape[64];
        snprintf(shape, sizeof shape, "%d x (%d, %d, %d)", G, O, K, N);
        printf("%-6d %-28s %7.2f ms %7.2f ms %8s %7.2f ms %7.2f ms %13.2f\n", l, shape,
               full * 1e3, g * 1e3, kernel, bound * 1e3, lt * 1e3, bound / lt);
        full_total += full, gemm_total += g, layer_total += lt, bound_total += bound;
    }
    printf("all    %-28s %7.2f ms %7.2f ms %8s %7.2f ms %7.2f ms %13.2f\n", "", full_total * 1e3,
           gemm_total * 1e3, "", bound_total * 1e3, layer_total * 1e3, bound_total / layer_total);
    rp_model_free(m);
    return 0;
}
