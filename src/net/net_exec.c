/*
** What running one layer of a net takes: its arguments (a graph's inputs
** looked up), where a graph's tensors live, and the forward again of a
** recomputed segment.
*/
#include <string.h>

#include "../core/util.h"
#include "net_impl.h"

bool rpi_net_is_checkpoint(const rp_net *n, int l) {
    if (n->rc_layer) /* by layer: a segment begins after each output kept */
        return l == n->first || !n->rc_layer[l - 1 - n->first];
    return l == n->first || n->m->layers[l].num_vars > 0;
}

/* The checkpoint that begins layer l's segment. */
int rpi_net_segment_of(const rp_net *n, int l) {
    while (!rpi_net_is_checkpoint(n, l))
        l--;
    return l;
}

size_t rpi_net_tensor_size(const rp_net *n, int t) {
    return rp_shape_size(rp_model_tensor_shape(n->m, t));
}

/* The slot of tensor t: received ones first, then the net's layers. */
int rpi_net_slot_of(const rp_net *n, int t) {
    return t >= n->first ? n->nin + (t - n->first) : n->in_slot[t + 1];
}

/* Where tensor t of a graph is in an activation set. */
float *rpi_net_tensor_at(const rp_net *n, rp_acts *a, int t) {
    return t >= n->first ? a->out[t - n->first] : a->bt[n->in_slot[t + 1]];
}

/* A layer's arguments; a graph's inputs are looked up into ins. */
layer_args rpi_net_args(rp_net *n, rp_acts *a, int l, const rp_step_ctx *ctx,
                           const float **ins) {
    const rp_layer *L = &n->m->layers[l];
    size_t base = n->m->layers[n->first].param_offset;
    if (n->graph)
        for (int i = 0; i < L->num_inputs; i++)
            ins[i] = rpi_net_tensor_at(n, a, L->inputs[i]);
    layer_args x = {
        .m = n->m,
        .L = L,
        .index = l,
        .B = a->rows,
        .in = n->graph ? ins[0] : l == n->first ? a->input : a->out[l - 1 - n->first],
        .ins = n->graph ? ins : NULL,
        .out = a->out[l - n->first],
        .w = n->params + (L->param_offset - base),
        .dw = n->grads + (L->param_offset - base),
        .aux = a->aux[l - n->first],
        .stats = n->stats && n->stat_at[l - n->first] != SIZE_MAX && ctx->stat_slot >= 1 &&
                         ctx->stat_slot <= n->opt.stat_slots
                     ? n->stats + n->stat_at[l - n->first]
                     : NULL,
        .col = n->col,
        .tmp = n->tmp,
        .accel = n->accel ? n->accel[l - n->first] : NULL,
        .accel_ws = n->accel_ws,
        .ctx = ctx,
        .accumulate = n->dirty[l - n->first],
        .scratch_limit = n->opt.scratch_limit,
        .wstash = a->ws ? a->ws[l - n->first] : NULL,
        .tp_allreduce = n->opt.tp_allreduce,
        .tp_allgather = n->opt.tp_allgather,
        .tp_ctx = n->opt.tp_ctx,
        .ep_size = n->opt.ep_size,
        .ep_rank = n->opt.ep_rank,
        .ep_alltoall = n->opt.ep_alltoall,
        .ep_ctx = n->opt.ep_ctx,
    };
    return x;
}

/* Where the gradient of layer l's output is best made in a split backward's
** input half: straight in the stash its weights' half will read, where the
** layer keeps its output's gradient (no copy); NULL where it does not. */
float *rpi_net_grad_home(const rp_net *n, const rp_acts *a, int l, int part) {
    if (part != RPI_BACK_INPUT || !a->ws || l < n->first || l >= n->last)
        return NULL;
    const rp_layer *L = &n->m->layers[l];
    if (!rpi_layer_splits(L) || rpi_layer_stashes_itself(L))
        return NULL;
    return a->ws[l - n->first];
}

/* One layer's backward, or its input half (part RPI_BACK_INPUT: a layer
** that splits keeps its output gradient for the weights' half; one that
** does not runs whole). */
void rpi_net_layer_backward(rp_net *n, layer_args *x, const float *dout, float *din, int part) {
    const rp_layer *L = x->L;
    bool split = part == RPI_BACK_INPUT && rpi_layer_splits(L);
    if (split && !rpi_layer_stashes_itself(L) && x->wstash != dout) /* (else made there) */
        memcpy(x->wstash, dout, sizeof(float) * out_size(L) * x->B);
    x->part = split ? RPI_BACK_INPUT : RPI_BACK_BOTH;
    double t0 = n->clock ? rp_now() : 0;
    rpi_layer_backward(x, dout, din);
    if (n->clock)
        n->clock[3 * (x->index - n->first) + 1] += rp_now() - t0;
    if (!split && L->num_vars)
        n->dirty[x->index - n->first] = true;
}

/* A layer's forward; a row-split linear's partial sums are then summed over
** the tensor group (tensor parallelism). */
rp_status rpi_net_layer_forward(rp_net *n, const layer_args *x) {
    double t0 = n->clock ? rp_now() : 0;
    rp_status st = rpi_layer_forward(x, &n->err);
    if (n->clock)
        n->clock[3 * (x->index - n->first)] += rp_now() - t0;
    if (!st && (x->L->tp_reduce & RP_TP_REDUCE_OUTPUT) && n->opt.tp_allreduce)
        n->opt.tp_allreduce(n->opt.tp_ctx, x->out, out_size(x->L) * x->B);
    return st;
}

/* Tensor t's gradient, complete on this rank, summed over the tensor group
** when column-split linears read t: each gave a part of it. The net that
** makes t sums it, before t's layer runs backward: a later stage sends
** its readers' parts as they are, to be added to this stage's own. */
void rpi_net_reduce_grad(rp_net *n, int t, float *g, int rows) {
    if (t >= 0 && (n->m->layers[t].tp_reduce & RP_TP_REDUCE_GRAD) && n->opt.tp_allreduce)
        n->opt.tp_allreduce(n->opt.tp_ctx, g, rpi_net_tensor_size(n, t) * rows);
}

/* At the end of a segment (backward reaching layer l), runs it forward
** again from its checkpoint, skipping a layer whose output and aux are
** kept. */
void rpi_net_recompute(rp_net *n, rp_acts *a, int l, const rp_step_ctx *ctx) {
    if (!n->recomputes || (l != n->last - 1 && !rpi_net_is_checkpoint(n, l + 1)))
        return;
    const float *ins[RP_MAX_INPUTS];
    for (int k = rpi_net_segment_of(n, l); k <= l; k++) {
        int i = k - n->first;
        if (n->alias[i] ||
            (n->keep_out[i] && (n->keep_aux[i] || !rpi_layer_aux_bytes(&n->m->layers[k], 1))))
            continue;
        layer_args x = rpi_net_args(n, a, k, ctx, ins);
        rpi_net_layer_forward(n, &x); /* it succeeded on these rows before */
    }
}
