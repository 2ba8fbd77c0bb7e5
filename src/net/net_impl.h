/*
** A net's insides (internal), shared by the files that build and run it:
** net.c (creation, activation sets, forward and backward), net_exec.c (a
** layer's arguments and recomputation), net_graph.c (a graph's tensors and
** gradients) and net_stats.c (batchnorm's statistics). Each file calls only
** the ones listed after it.
*/
#ifndef REPIPE_NET_IMPL_H
#define REPIPE_NET_IMPL_H

#include "repipe/net.h"
#include "../layers/layers_impl.h"

struct rp_net {
    const rp_model *m;
    int first, last, max_batch;
    float *params, *grads;
    size_t num_params;
    float *col, *tmp;
    size_t col_n, tmp_n;
    float *g[2]; /* gradient ping-pong, max_batch * gmax floats each */
    size_t gmax;
    bool *dirty; /* per layer: its gradients written since rp_net_zero_grads
                 ** (until then zero by contract: the next backward overwrites) */
    rp_net_options opt;
    bool *keep_out, *keep_aux; /* per layer: held by the activation set */
    /* recomputation: of every layer (opt.recompute) or by layer (rc_layer:
    ** per layer, named in opt.recompute_layers and not the net's last) */
    bool recomputes, *rc_layer;
    bool *alias;               /* per layer: a flatten whose output is its input */
    size_t *ov_out, *ov_aux;   /* per layer not kept: offset in the overlay */
    unsigned char *overlay;
    size_t overlay_bytes;
    /* a graph's tensors: those received (boundary `first`) and sent
    ** (boundary `last`), a slot of each tensor, gradient buffers per slot */
    bool graph;
    int nin, nout;
    int *bin, *bout;
    size_t in_n, out_n; /* floats per sample of the two boundaries */
    int *in_slot;       /* [t + 1] for t < first: its place in bin */
    bool packed_out;    /* the output is not the last layer's alone */
    float **gt;         /* per slot: nin received, then each layer's */
    float **gcur;       /* per slot, where a backward makes it: gt's, or a stash */
    bool *written;
    float *gtmp, *gpack;
    size_t graph_bytes;
    /* batchnorm: per layer of the net, where its statistics slots start in
    ** `stats` (SIZE_MAX: not a batchnorm); the running statistics next */
    size_t *stat_at;
    float *stats, *running;
    size_t stats_n, running_n;
    /* rp_net_time_layers: per layer of the net, seconds spent forward, in
    ** the whole backward or its input half, and in the weights' half (NULL:
    ** not timed) */
    double *clock;
    /* per layer of the net: a convolution's oneDNN kernels for max_batch
    ** rows (NULL: im2col), and the workspace they share */
    struct rpi_conv_accel **accel;
    void *accel_ws;
    size_t accel_bytes;
    rp_error err;
};

struct rp_acts {
    int capacity, rows;
    float *input;
    float **bt;    /* a graph's received tensors unpacked (bt[0] = input when one) */
    float *packed; /* a graph's packed output, when not the last layer's */
    float **out; /* one per layer of the net */
    void **aux;
    float **ws;  /* split backward: per layer, what its weights' half reads */
    unsigned char *block;
};

static inline size_t in_size(const rp_layer *L) { return rp_shape_size(&L->in); }
static inline size_t out_size(const rp_layer *L) { return rp_shape_size(&L->out); }

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

/* net_exec.c */
bool rpi_net_is_checkpoint(const rp_net *n, int l);
int rpi_net_segment_of(const rp_net *n, int l);
size_t rpi_net_tensor_size(const rp_net *n, int t);
int rpi_net_slot_of(const rp_net *n, int t);
float *rpi_net_tensor_at(const rp_net *n, rp_acts *a, int t);
layer_args rpi_net_args(rp_net *n, rp_acts *a, int l, const rp_step_ctx *ctx, const float **ins);
void rpi_net_recompute(rp_net *n, rp_acts *a, int l, const rp_step_ctx *ctx);
void rpi_net_layer_backward(rp_net *n, layer_args *x, const float *dout, float *din, int part);
/* In a split backward's input half (part RPI_BACK_INPUT), the stash where
** layer l's weights' half will read its output's gradient, for that
** gradient to be made there rather than copied in; NULL for a layer that
** does not keep it so (no split, or its own stash). */
float *rpi_net_grad_home(const rp_net *n, const rp_acts *a, int l, int part);
rp_status rpi_net_layer_forward(rp_net *n, const layer_args *x);
void rpi_net_reduce_grad(rp_net *n, int t, float *g, int rows);

/* net_graph.c */
bool rpi_net_read_later(const rp_net *n, int l);
rp_status rpi_net_plan_graph(rp_net *n, rp_error *err);
void rpi_net_unpack(const rp_net *n, int k, const int *ts, size_t row, const float *in,
                    float **parts, int batch);
void rpi_net_pack_output(const rp_net *n, rp_acts *a, int batch);
const float *rpi_net_graph_backward(rp_net *n, rp_acts *a, const float *dout,
                                    const rp_step_ctx *ctx, bool need_input_grad, int stop,
                                    int part);

/* net_stats.c */
rp_status rpi_net_plan_stats(rp_net *n, rp_error *err);

#endif /* REPIPE_NET_IMPL_H */
