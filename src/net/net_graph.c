/*
** A net of a graph: the tensors it receives and sends (boundaries of
** graph.c, packed sample by sample), and backward's gradient per tensor,
** the sum over the layers that read it in descending layer order.
*/
#include <stdlib.h>
#include <string.h>

#include "net_impl.h"

/* Whether a graph's tensor l is read after its segment (or sent): it must
** be kept, since recomputation runs one segment at a time. */
bool rpi_net_read_later(const rp_net *n, int l) {
    int r = n->m->last_reader[l + 1];
    return r >= n->last || rpi_net_segment_of(n, r) != rpi_net_segment_of(n, l);
}

/* A graph's boundaries and gradient buffers. */
rp_status rpi_net_plan_graph(rp_net *n, rp_error *err) {
    const rp_model *m = n->m;
    int L = n->last - n->first;
    n->bin = malloc(sizeof(int) * (m->num_layers + 1));
    n->bout = malloc(sizeof(int) * (m->num_layers + 1));
    n->in_slot = malloc(sizeof(int) * (n->first + 1));
    if (!n->bin || !n->bout || !n->in_slot)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    n->nin = rp_model_boundary(m, n->first, n->bin);
    n->nout = rp_model_boundary(m, n->last, n->bout);
    n->in_n = rp_model_boundary_size(m, n->first);
    n->out_n = rp_model_boundary_size(m, n->last);
    if (n->opt.alone && L == 1) { /* its distinct inputs in ascending order, its output */
        const rp_layer *Ly = &m->layers[n->first];
        n->nin = 0, n->in_n = 0;
        for (int t = -1; t < n->first; t++)
            for (int i = 0; i < Ly->num_inputs; i++)
                if (Ly->inputs[i] == t) {
                    n->bin[n->nin++] = t;
                    n->in_n += rpi_net_tensor_size(n, t);
                    break;
                }
        n->nout = 1, n->bout[0] = n->first, n->out_n = rpi_net_tensor_size(n, n->first);
    }
    n->packed_out = n->nout != 1 || n->bout[0] != n->last - 1;
    for (int j = 0; j < n->nin; j++)
        n->in_slot[n->bin[j] + 1] = j;
    int slots = n->nin + L;
    n->gt = calloc(slots, sizeof(float *));
    n->gcur = calloc(slots, sizeof(float *));
    n->written = calloc(slots, sizeof(bool));
    if (!n->gt || !n->gcur || !n->written)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    size_t most = n->in_n;
    for (int k = 0; k < slots; k++) {
        int t = k < n->nin ? n->bin[k] : n->first + (k - n->nin);
        size_t sz = rpi_net_tensor_size(n, t);
        most = sz > most ? sz : most;
        if (!(n->gt[k] = malloc(sizeof(float) * sz * n->max_batch)))
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for a graph's gradients");
        n->graph_bytes += sizeof(float) * sz * n->max_batch;
    }
    n->gtmp = malloc(sizeof(float) * most * n->max_batch);
    n->gpack = malloc(sizeof(float) * n->in_n * n->max_batch);
    if (!n->gtmp || !n->gpack)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a graph's gradients");
    n->graph_bytes += sizeof(float) * (most + n->in_n) * n->max_batch;
    return RP_OK;
}

/* Rows of `row` floats, each sample's k tensors `ts` one after another,
** into a buffer per tensor. */
void rpi_net_unpack(const rp_net *n, int k, const int *ts, size_t row, const float *in,
                   float **parts, int batch) {
    size_t at = 0;
    for (int j = 0; j < k; j++) {
        size_t sz = rpi_net_tensor_size(n, ts[j]);
        for (int r = 0; r < batch; r++)
            memcpy(parts[j] + r * sz, in + r * row + at, sizeof(float) * sz);
        at += sz;
    }
}

/* The tensors sent, packed sample by sample. */
void rpi_net_pack_output(const rp_net *n, rp_acts *a, int batch) {
    size_t at = 0;
    for (int j = 0; j < n->nout; j++) {
        size_t sz = rpi_net_tensor_size(n, n->bout[j]);
        const float *p = rpi_net_tensor_at(n, a, n->bout[j]);
        for (int r = 0; r < batch; r++)
            memcpy(a->packed + r * n->out_n + at, p + r * sz, sizeof(float) * sz);
        at += sz;
    }
}

/* A gradient g (rows of tensor t) for tensor t: written when it is the
** first, added when another reader's came before it. */
static void give_grad(rp_net *n, int t, const float *g, int rows) {
    int k = rpi_net_slot_of(n, t);
    size_t len = rpi_net_tensor_size(n, t) * rows;
    float *restrict d = n->gcur[k];
    if (!n->written[k]) {
        if (g != d)
            memcpy(d, g, sizeof(float) * len);
        n->written[k] = true;
    } else {
        for (size_t i = 0; i < len; i++)
            d[i] += g[i];
    }
}

const float *rpi_net_graph_backward(rp_net *n, rp_acts *a, const float *dout,
                                   const rp_step_ctx *ctx, bool need_input_grad, int stop,
                                   int part) {
    int rows = a->rows, slots = n->nin + (n->last - n->first);
    memset(n->written, 0, sizeof(bool) * slots);
    bool loss = n->m->layers[n->last - 1].type == RP_LAYER_SOFTMAX_CE;
    /* each tensor's gradient in its slot's buffer, or, in a split
    ** backward's input half, straight in the stash where its layer's
    ** weights' half will read it (a received one copied there, not twice) */
    for (int k = 0; k < slots; k++) {
        float *home = k < n->nin ? NULL : rpi_net_grad_home(n, a, n->first + k - n->nin, part);
        n->gcur[k] = home ? home : n->gt[k];
    }
    if (!loss) { /* the gradients received, one per tensor sent */
        size_t at = 0;
        for (int j = 0; j < n->nout; j++) {
            int t = n->bout[j];
            size_t sz = rpi_net_tensor_size(n, t);
            float *d = n->gcur[rpi_net_slot_of(n, t)];
            for (int r = 0; r < rows; r++)
                memcpy(d + r * sz, dout + r * n->out_n + at, sizeof(float) * sz);
            n->written[rpi_net_slot_of(n, t)] = true;
            at += sz;
        }
    }
    const float *ins[RP_MAX_INPUTS];
    for (int l = n->last - 1; l >= stop; l--) {
        rpi_net_recompute(n, a, l, ctx);
        const rp_layer *L = &n->m->layers[l];
        layer_args x = rpi_net_args(n, a, l, ctx, ins);
        if (n->written[rpi_net_slot_of(n, l)]) /* here, where its readers' parts are in */
            rpi_net_reduce_grad(n, l, n->gcur[rpi_net_slot_of(n, l)], rows);
        const float *g = n->gcur[rpi_net_slot_of(n, l)];
        for (int i = 0; i < L->num_inputs; i++) {
            int t = L->inputs[i];
            bool want = t >= stop || (t < n->first && need_input_grad);
            if (L->type == RP_LAYER_ADD) {
                if (want)
                    give_grad(n, t, g, rows);
            } else if (L->type == RP_LAYER_MUL) {
                if (want) {
                    int k = rpi_net_slot_of(n, t);
                    float *din = n->written[k] ? n->gtmp : n->gcur[k];
                    rpi_mul_backward(&x, i, g, din);
                    give_grad(n, t, din, rows);
                }
            } else if (L->type == RP_LAYER_CONCAT) {
                if (want) {
                    int k = rpi_net_slot_of(n, t);
                    rpi_concat_backward(&x, i, g, n->gcur[k], n->written[k]);
                    n->written[k] = true;
                }
            } else { /* one input: straight into its buffer when first */
                int k = rpi_net_slot_of(n, t);
                float *din = !want ? NULL : n->written[k] ? n->gtmp : n->gcur[k];
                rpi_net_layer_backward(n, &x, loss && l == n->last - 1 ? NULL : g, din, part);
                if (din)
                    give_grad(n, t, din, rows);
            }
        }
        if (ctx->grads_done && part != RPI_BACK_INPUT)
            ctx->grads_done(ctx->grads_arg, l);
    }
    if (!need_input_grad)
        return NULL;
    if (n->nin == 1 && n->written[0])
        return n->gcur[0];
    size_t at = 0; /* packed as they came; a tensor no reader differentiates gets zeros */
    for (int j = 0; j < n->nin; j++) {
        size_t sz = rpi_net_tensor_size(n, n->bin[j]);
        for (int r = 0; r < rows; r++) {
            float *d = n->gpack + r * n->in_n + at;
            if (n->written[j])
                memcpy(d, n->gcur[j] + r * sz, sizeof(float) * sz);
            else
                memset(d, 0, sizeof(float) * sz);
        }
        at += sz;
    }
    return n->gpack;
}
