/*
** Convolutions through oneDNN (Debian's libdnnl), opened on first use as
** OpenBLAS and cJSON are (core/dlib.h).
**
** Why: lowered to one matrix product (im2col, layers_conv.c), a
** convolution pays for writing and reading its columns. oneDNN's direct
** kernels read the input in place, in a channel-blocked layout. On one
** core (Xeon, AVX-512), torchvision's resnet18 on 28 x 28 images, batch 64:
** the convolutions took 132 ms forward and backward by im2col, 99 ms with
** oneDNN's where they are ahead (its 3 x 3 layers 5.5 against 8.6 ms at 64
** channels on 7 x 7). Where they are not, im2col stays: few input
** channels (a stem), few output positions (the last stage's 2 x 2 and
** 1 x 1 planes), or a lowering that keeps only the taps that reach the
** input; rpi_conv_direct (layers_conv.c) holds the rule and its
** measurements, bench/conv_bound.c measures both.
**
** The engine's buffers stay in its flat NCHW layout: each call reorders
** what a kernel wants in a blocked layout into the net's workspace and
** back. Every kernel runs on one thread (OpenMP's count for the calling
** thread is set to 1): the engine's workers are its threads, and a fixed
** count keeps each result the same bit for bit from run to run.
**
** A kernel is built once per layer and batch when the net is made, never in
** the step loop; where oneDNN is absent, refuses a shape, or the build had
** no header (REPIPE_HAVE_DNNL unset), the layer keeps im2col.
** REPIPE_CONV=im2col keeps it everywhere (the tests compare the two).
*/
#define _POSIX_C_SOURCE 200809L
#include "layers_impl.h"

#include <stdlib.h>
#include <string.h>

#ifndef REPIPE_HAVE_DNNL

bool rpi_conv_accel_wanted(const rp_layer *L) {
    (void)L;
    return false;
}
rpi_conv_accel *rpi_conv_accel_create(const rp_layer *L, int B, size_t *ws_bytes) {
    (void)L, (void)B, (void)ws_bytes;
    return NULL;
}
void rpi_conv_accel_free(rpi_conv_accel *c) { (void)c; }
bool rpi_conv_accel_forward(rpi_conv_accel *c, const layer_args *a) {
    (void)c, (void)a;
    return false;
}
bool rpi_conv_accel_backward(rpi_conv_accel *c, const layer_args *a, const float *dout,
                             float *din) {
    (void)c, (void)a, (void)dout, (void)din;
    return false;
}

#else

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>

#include "../core/dlib.h"

/* The functions taken from the library, each as a pointer named after it. */
#define DNNL_FUNCTIONS(X)                                                                    \
    X(dnnl_engine_create) X(dnnl_stream_create) X(dnnl_stream_destroy) X(dnnl_stream_wait)   \
    X(dnnl_memory_desc_init_by_tag) X(dnnl_memory_desc_equal) X(dnnl_memory_desc_get_size)   \
    X(dnnl_convolution_forward_desc_init) X(dnnl_convolution_backward_data_desc_init)        \
    X(dnnl_convolution_backward_weights_desc_init) X(dnnl_primitive_attr_create)             \
    X(dnnl_primitive_attr_destroy) X(dnnl_primitive_attr_set_scratchpad_mode)                \
    X(dnnl_primitive_desc_create) X(dnnl_primitive_desc_destroy)                             \
    X(dnnl_primitive_desc_query_md) X(dnnl_primitive_create) X(dnnl_primitive_destroy)       \
    X(dnnl_primitive_execute) X(dnnl_memory_create) X(dnnl_memory_destroy)                   \
    X(dnnl_memory_set_data_handle) X(dnnl_reorder_primitive_desc_create)

#define DECLARE(f) static __typeof__(f) *p_##f;
DNNL_FUNCTIONS(DECLARE)
#undef DECLARE
static void (*set_omp_threads)(int); /* OpenMP's, where the library runs on it */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static dnnl_engine_t engine; /* NULL: oneDNN is not there */

static bool bind_dnnl(void *h) {
    bool ok = true;
#define BIND(f) ok = ok && (p_##f = (__typeof__(f) *)dlsym(h, #f)) != NULL;
    DNNL_FUNCTIONS(BIND)
#undef BIND
    set_omp_threads = (void (*)(int))dlsym(h, "omp_set_num_threads");
    return ok;
}

static void load(void) {
    const char *mode = getenv("REPIPE_CONV");
    if (mode && strcmp(mode, "im2col") == 0)
        return;
    const char *names[] = {getenv("REPIPE_DNNL_LIBRARY"), "libdnnl.so.2", "libdnnl.so"};
    char why[256];
    if (!rpi_library_open(names, sizeof names / sizeof *names, bind_dnnl, "lacks oneDNN's API",
                          why, sizeof why))
        return;
    if (p_dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success)
        engine = NULL;
}

/* One tensor a kernel reads or writes: the engine's plain layout (user)
** and the kernel's (prim); where they differ, a reorder through the
** workspace at `off`. */
typedef struct port {
    int arg;  /* DNNL_ARG_* */
    bool out; /* written by the kernel */
    dnnl_memory_t user, prim;
    dnnl_primitive_t reorder; /* NULL: the kernel reads or writes the user's buffer */
    size_t off;
} port;

/* One kernel (forward, the input's gradient, the weights') with its ports
** and scratchpad. */
typedef struct kernel {
    dnnl_primitive_t prim;
    dnnl_memory_t scratch;
    size_t scratch_off;
    int n;
    port ports[4];
} kernel;

struct rpi_conv_accel {
    int B;
    dnnl_stream_t stream;
    kernel fwd, bdata, bweights;
    size_t nw;      /* the weights' count; the bias follows them */
    size_t acc_off; /* the weights' gradient made here, then added, when accumulating */
    bool share_dout; /* the backward kernels read the output's gradient in one layout */
};

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The plain layout of a layer's tensor: data (B, C, H, W), weights
** (O, C, K, K), or with groups (G, O / G, C / G, K, K), bias (O). */
enum { T_DATA_IN, T_DATA_OUT, T_WEIGHTS, T_BIAS };
static bool plain_md(const rp_layer *L, int B, int which, dnnl_memory_desc_t *md) {
    int G = L->groups, C = L->in.dim[0], O = L->units, K = L->kernel;
    dnnl_dims_t d;
    int nd = 4;
    dnnl_format_tag_t tag = dnnl_nchw;
    if (which == T_DATA_IN || which == T_DATA_OUT) {
        const rp_shape *s = which == T_DATA_IN ? &L->in : &L->out;
        d[0] = B, d[1] = s->dim[0], d[2] = s->dim[1], d[3] = s->dim[2];
    } else if (which == T_BIAS) {
        nd = 1, d[0] = O, tag = dnnl_x;
    } else if (G == 1) {
        d[0] = O, d[1] = C, d[2] = K, d[3] = K, tag = dnnl_oihw;
    } else {
        nd = 5, d[0] = G, d[1] = O / G, d[2] = C / G, d[3] = K, d[4] = K, tag = dnnl_goihw;
    }
    return p_dnnl_memory_desc_init_by_tag(md, nd, d, dnnl_f32, tag) == dnnl_success;
}

/* The port for argument `arg` of kernel pd, the layout it wants asked by
** query q (the bias's: the weights' second); *ws grows by what its
** reorder needs. */
static bool add_port(kernel *k, const_dnnl_primitive_desc_t pd, dnnl_query_t q, int arg,
                     bool out, const dnnl_memory_desc_t *user_md, size_t *ws) {
    port *p = &k->ports[k->n++];
    memset(p, 0, sizeof *p);
    p->arg = arg, p->out = out;
    int index = arg == DNNL_ARG_BIAS || arg == DNNL_ARG_DIFF_BIAS;
    const dnnl_memory_desc_t *want = p_dnnl_primitive_desc_query_md(pd, q, index);
    if (!want || p_dnnl_memory_create(&p->user, user_md, engine, DNNL_MEMORY_NONE))
        return false;
    if (p_dnnl_memory_desc_equal(want, user_md))
        return true;
    dnnl_primitive_desc_t rpd;
    if (p_dnnl_memory_create(&p->prim, want, engine, DNNL_MEMORY_NONE) ||
        p_dnnl_reorder_primitive_desc_create(&rpd, out ? want : user_md, engine,
                                             out ? user_md : want, engine, NULL))
        return false;
    dnnl_status_t s = p_dnnl_primitive_create(&p->reorder, rpd);
    p_dnnl_primitive_desc_destroy(rpd);
    p->off = *ws;
    *ws += align64(p_dnnl_memory_desc_get_size(want));
    return s == dnnl_success;
}

/* The kernel of pd and its scratchpad. */
static bool make_kernel(kernel *k, const_dnnl_primitive_desc_t pd, size_t *ws) {
    const dnnl_memory_desc_t *smd = p_dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    bool ok = smd && !p_dnnl_primitive_create(&k->prim, pd) &&
              !p_dnnl_memory_create(&k->scratch, smd, engine, DNNL_MEMORY_NONE);
    if (ok) {
        k->scratch_off = *ws;
        *ws += align64(p_dnnl_memory_desc_get_size(smd));
    }
    return ok;
}

static void free_kernel(kernel *k) {
    for (int i = 0; i < k->n; i++) {
        port *p = &k->ports[i];
        if (p->user)
            p_dnnl_memory_destroy(p->user);
        if (p->prim)
            p_dnnl_memory_destroy(p->prim);
        if (p->reorder)
            p_dnnl_primitive_destroy(p->reorder);
    }
    if (k->scratch)
        p_dnnl_memory_destroy(k->scratch);
    if (k->prim)
        p_dnnl_primitive_destroy(k->prim);
    memset(k, 0, sizeof *k);
}

bool rpi_conv_accel_wanted(const rp_layer *L) {
    if (L->type != RP_LAYER_CONV2D)
        return false;
    pthread_once(&once, load);
    return engine != NULL;
}

void rpi_conv_accel_free(rpi_conv_accel *c) {
    if (!c)
        return;
    free_kernel(&c->fwd);
    free_kernel(&c->bdata);
    free_kernel(&c->bweights);
    if (c->stream)
        p_dnnl_stream_destroy(c->stream);
    free(c);
}

/* The three operations' primitive descriptors, the backward ones hinted by
** the forward's, each layout left to oneDNN; false where it refuses the
** shape. */
static bool describe(const rp_layer *L, const dnnl_memory_desc_t md[4],
                     dnnl_primitive_desc_t pd[3]) {
    dnnl_memory_desc_t any[3];
    dnnl_dims_t strides = {L->stride, L->stride}, pad = {L->pad, L->pad};
    for (int i = 0; i < 3; i++)
        if (p_dnnl_memory_desc_init_by_tag(&any[i], md[i].ndims, md[i].dims, dnnl_f32,
                                           dnnl_format_tag_any))
            return false;
    const dnnl_memory_desc_t *bias = L->bias ? &md[T_BIAS] : NULL;
    dnnl_convolution_desc_t f, bd, bw;
    dnnl_primitive_attr_t attr;
    if (p_dnnl_primitive_attr_create(&attr))
        return false;
    bool ok =
        !p_dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) &&
        !p_dnnl_convolution_forward_desc_init(&f, dnnl_forward_training, dnnl_convolution_direct,
                                              &any[T_DATA_IN], &any[T_WEIGHTS], bias,
                                              &any[T_DATA_OUT], strides, pad, pad) &&
        !p_dnnl_primitive_desc_create(&pd[0], &f, attr, engine, NULL) &&
        !p_dnnl_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct,
                                                    &any[T_DATA_IN], &any[T_WEIGHTS],
                                                    &any[T_DATA_OUT], strides, pad, pad) &&
        !p_dnnl_primitive_desc_create(&pd[1], &bd, attr, engine, pd[0]) &&
        !p_dnnl_convolution_backward_weights_desc_init(&bw, dnnl_convolution_direct,
                                                       &any[T_DATA_IN], &any[T_WEIGHTS], bias,
                                                       &any[T_DATA_OUT], strides, pad, pad) &&
        !p_dnnl_primitive_desc_create(&pd[2], &bw, attr, engine, pd[0]);
    p_dnnl_primitive_attr_destroy(attr);
    return ok;
}

/* The three kernels' ports, in the order their callers pass buffers:
** forward (input, weights, output, bias), the input's gradient (output's
** gradient, weights, input's gradient), the weights' (output's gradient,
** input, weights' gradient, bias's); ws[k] the workspace of each. The two
** backward kernels take the output's gradient first, at the same place in
** the workspace: where they want it in one layout, the input's kernel
** reads what the weights' reordered. */
static bool make_ports(rpi_conv_accel *c, const rp_layer *L, const dnnl_memory_desc_t md[4],
                       dnnl_primitive_desc_t pd[3], size_t ws[3]) {
    kernel *f = &c->fwd, *d = &c->bdata, *w = &c->bweights;
    const dnnl_memory_desc_t *in = &md[T_DATA_IN], *out = &md[T_DATA_OUT];
    const dnnl_memory_desc_t *wt = &md[T_WEIGHTS], *bias = &md[T_BIAS];
    return add_port(f, pd[0], dnnl_query_src_md, DNNL_ARG_SRC, false, in, &ws[0]) &&
           add_port(f, pd[0], dnnl_query_weights_md, DNNL_ARG_WEIGHTS, false, wt, &ws[0]) &&
           add_port(f, pd[0], dnnl_query_dst_md, DNNL_ARG_DST, true, out, &ws[0]) &&
           (!L->bias ||
            add_port(f, pd[0], dnnl_query_weights_md, DNNL_ARG_BIAS, false, bias, &ws[0])) &&
           make_kernel(f, pd[0], &ws[0]) &&
           add_port(d, pd[1], dnnl_query_diff_dst_md, DNNL_ARG_DIFF_DST, false, out, &ws[1]) &&
           add_port(d, pd[1], dnnl_query_weights_md, DNNL_ARG_WEIGHTS, false, wt, &ws[1]) &&
           add_port(d, pd[1], dnnl_query_diff_src_md, DNNL_ARG_DIFF_SRC, true, in, &ws[1]) &&
           make_kernel(d, pd[1], &ws[1]) &&
           add_port(w, pd[2], dnnl_query_diff_dst_md, DNNL_ARG_DIFF_DST, false, out, &ws[2]) &&
           add_port(w, pd[2], dnnl_query_src_md, DNNL_ARG_SRC, false, in, &ws[2]) &&
           add_port(w, pd[2], dnnl_query_diff_weights_md, DNNL_ARG_DIFF_WEIGHTS, true, wt,
                    &ws[2]) &&
           (!L->bias || add_port(w, pd[2], dnnl_query_diff_weights_md, DNNL_ARG_DIFF_BIAS, true,
                                 bias, &ws[2])) &&
           make_kernel(w, pd[2], &ws[2]);
}

rpi_conv_accel *rpi_conv_accel_create(const rp_layer *L, int B, size_t *ws_bytes) {
    *ws_bytes = 0;
    if (!rpi_conv_accel_wanted(L))
        return NULL;
    /* a kernel splits its work for the threads there are when it is made:
    ** one, as when it runs */
    if (set_omp_threads)
        set_omp_threads(1);
    dnnl_memory_desc_t md[4];
    for (int t = T_DATA_IN; t <= T_BIAS; t++)
        if (!plain_md(L, B, t, &md[t]))
            return NULL;
    dnnl_primitive_desc_t pd[3] = {NULL, NULL, NULL};
    rpi_conv_accel *c = calloc(1, sizeof *c);
    size_t ws[3] = {0, 0, 0};
    bool ok = c && describe(L, md, pd) &&
              !p_dnnl_stream_create(&c->stream, engine, dnnl_stream_default_flags) &&
              make_ports(c, L, md, pd, ws);
    if (ok) {
        c->B = B;
        const port *wd = &c->bweights.ports[0], *dd = &c->bdata.ports[0];
        c->share_dout = wd->reorder && dd->reorder && wd->off == dd->off &&
                        p_dnnl_memory_desc_equal(
                            p_dnnl_primitive_desc_query_md(pd[1], dnnl_query_diff_dst_md, 0),
                            p_dnnl_primitive_desc_query_md(pd[2], dnnl_query_diff_dst_md, 0));
    }
    for (int i = 0; i < 3; i++)
        if (pd[i])
            p_dnnl_primitive_desc_destroy(pd[i]);
    if (!ok) {
        rpi_conv_accel_free(c);
        return NULL;
    }
    /* the kernels run one after another and keep nothing in the workspace
    ** between calls (but the output's gradient, reordered, from the
    ** weights' kernel to the input's in one backward): they share it; the
    ** weights' gradient, when added to what is there, is made after the
    ** weights' kernel's own */
    c->nw = (size_t)L->units * (L->in.dim[0] / L->groups) * L->kernel * L->kernel;
    c->acc_off = ws[2];
    ws[2] += align64(sizeof(float) * (c->nw + (size_t)L->units));
    for (int i = 0; i < 3; i++)
        *ws_bytes = ws[i] > *ws_bytes ? ws[i] : *ws_bytes;
    return c;
}

/* Runs kernel k: the user's buffers ptr[i] for its ports, ws its workspace;
** where `reordered`, its first port's reorder is in the workspace already. */
static bool run(rpi_conv_accel *c, kernel *k, void *const *ptr, unsigned char *ws,
                bool reordered) {
    dnnl_exec_arg_t args[5];
    bool ok = true;
    for (int i = 0; i < k->n && ok; i++) {
        port *p = &k->ports[i];
        ok = !p_dnnl_memory_set_data_handle(p->user, ptr[i]);
        if (p->reorder) {
            ok = ok && !p_dnnl_memory_set_data_handle(p->prim, ws + p->off);
            dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, p->user}, {DNNL_ARG_TO, p->prim}};
            if (!p->out && !(reordered && i == 0))
                ok = ok && !p_dnnl_primitive_execute(p->reorder, c->stream, 2, r);
        }
        args[i] = (dnnl_exec_arg_t){p->arg, p->reorder ? p->prim : p->user};
    }
    args[k->n] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, k->scratch};
    ok = ok && !p_dnnl_memory_set_data_handle(k->scratch, ws + k->scratch_off) &&
         !p_dnnl_primitive_execute(k->prim, c->stream, k->n + 1, args);
    for (int i = 0; i < k->n && ok; i++) {
        port *p = &k->ports[i];
        dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, p->prim}, {DNNL_ARG_TO, p->user}};
        if (p->out && p->reorder)
            ok = !p_dnnl_primitive_execute(p->reorder, c->stream, 2, r);
    }
    return ok && !p_dnnl_stream_wait(c->stream);
}

/* Whether the call is the kernels' to make (a batch of B, a workspace),
** with OpenMP's count of threads for this thread set to one. */
static bool ready(const rpi_conv_accel *c, const layer_args *a) {
    if (!c || c->B != a->B || !a->accel_ws)
        return false;
    if (set_omp_threads)
        set_omp_threads(1);
    return true;
}

bool rpi_conv_accel_forward(rpi_conv_accel *c, const layer_args *a) {
    if (!ready(c, a))
        return false;
    void *ptr[4] = {(void *)a->in, (void *)a->w, a->out, (void *)(a->w + c->nw)};
    return run(c, &c->fwd, ptr, a->accel_ws, false);
}

bool rpi_conv_accel_backward(rpi_conv_accel *c, const layer_args *a, const float *dout,
                             float *din) {
    if (!ready(c, a))
        return false;
    size_t nw = c->nw;
    unsigned char *ws = a->accel_ws;
    /* the weights' gradient first: din may be where the net kept the
    ** layer's input, which it reads */
    if (a->part != RPI_BACK_INPUT) {
        float *acc = (float *)(ws + c->acc_off);
        float *dw = a->accumulate ? acc : a->dw;
        void *ptr[4] = {(void *)dout, (void *)a->in, dw, dw + nw};
        if (!run(c, &c->bweights, ptr, ws, false))
            return false;
        if (a->accumulate) {
            size_t n = nw + (a->L->bias ? (size_t)a->L->units : 0);
            for (size_t i = 0; i < n; i++)
                a->dw[i] += acc[i];
        }
    }
    if (a->part == RPI_BACK_WEIGHT || !din)
        return true;
    void *ptr[3] = {(void *)dout, (void *)a->w, din};
    return run(c, &c->bdata, ptr, ws, c->share_dout && a->part == RPI_BACK_BOTH);
}

#endif /* REPIPE_HAVE_DNNL */
