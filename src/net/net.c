/*
** A worker's executor for a contiguous range of layers: flat parameter and
** gradient slices, convolution scratch, and two gradient buffers that
** backward passes between layers. Everything is allocated at creation;
** forward and backward allocate nothing.
**
** With recomputation, the layers fall into segments that each begin at a
** checkpoint (the net's first layer, or a layer with parameters). An
** activation set keeps a segment's output and nothing inside it: those
** outputs and aux states live in one overlay buffer the net shares, laid
** out for the largest segment. Forward writes them there and forgets them;
** backward runs the segment forward again from its kept input, then back.
** Dropout masks come from a counter-based stream, so the recomputed forward
** is the same bit for bit.
**
** A graph (a model that is not a chain) runs the same layers with their
** inputs looked up: tensor t is layer t's output, or one of the tensors
** the net receives (graph.c packs them sample by sample). Backward keeps a
** gradient buffer per tensor instead of the chain's two, since a tensor
** read by several layers (a residual's skip) gets the sum of their
** gradients: the first to arrive is written, the others are added, in
** descending layer order. A pipeline adds in the same order, since the
** later stage's readers come first there too, so a cut changes no bit.
*/
#include <stdlib.h>
#include <string.h>

#include "repipe/config.h"
#include "../core/util.h"
#include "net_impl.h"

/* A layer's aux state in this net: an moe layer's holds its expert-parallel
** group's rows. */
static size_t aux_bytes(const rp_net *n, const rp_layer *L, int batch) {
    if (L->type == RP_LAYER_MOE && n->opt.ep_size > 1)
        return rpi_moe_aux_bytes(L, batch, n->opt.ep_size);
    return rpi_layer_aux_bytes(L, batch);
}

/* Which outputs and aux states an activation set keeps, and where the
** others go in the overlay: each segment's from offset 0. */
static rp_status plan_recompute(rp_net *n, rp_error *err) {
    int L = n->last - n->first;
    n->keep_out = malloc(sizeof(bool) * L);
    n->keep_aux = malloc(sizeof(bool) * L);
    n->ov_out = calloc(L, sizeof(size_t));
    n->ov_aux = calloc(L, sizeof(size_t));
    n->alias = calloc(L, sizeof(bool));
    if (!n->keep_out || !n->keep_aux || !n->ov_out || !n->ov_aux || !n->alias)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    if (n->opt.recompute_layers) { /* (the caller's bits are read here only) */
        if (!(n->rc_layer = calloc(L, sizeof(bool))))
            return rp_fail(err, RP_ERR_NOMEM, "out of memory");
        for (int l = n->first; l < n->last - 1; l++)
            n->rc_layer[l - n->first] = l < RP_MAX_RECOMPUTE_LAYERS &&
                                        (n->opt.recompute_layers[l / 64] >> (l % 64) & 1);
        n->opt.recompute_layers = NULL;
    }
    n->recomputes = n->opt.recompute || n->rc_layer;
    size_t at = 0;
    for (int l = n->first; l < n->last; l++) {
        const rp_layer *Ly = &n->m->layers[l];
        int i = l - n->first;
        bool end = l == n->last - 1 || rpi_net_is_checkpoint(n, l + 1);
        n->keep_out[i] = !n->recomputes || end || (n->graph && rpi_net_read_later(n, l));
        /* by layer, a layer not named keeps its state too: only the run
        ** before it is made again */
        n->keep_aux[i] = !n->recomputes || l == n->last - 1 || (n->rc_layer && end);
        if (rpi_net_is_checkpoint(n, l))
            at = 0;
        if (!n->keep_out[i]) {
            n->ov_out[i] = at;
            at += ALIGN64(sizeof(float) * out_size(Ly) * n->max_batch);
        }
        if (!n->keep_aux[i]) {
            n->ov_aux[i] = at;
            at += ALIGN64(aux_bytes(n, Ly, n->max_batch));
        }
        n->overlay_bytes = at > n->overlay_bytes ? at : n->overlay_bytes;
        /* a flatten changes only the shape: its output is its input's memory,
        ** unless that would make a kept output live in the overlay */
        n->alias[i] = !n->graph && Ly->type == RP_LAYER_FLATTEN &&
                      (i == 0 || n->keep_out[i - 1] || !n->keep_out[i]);
    }
    if (n->overlay_bytes && !(n->overlay = aligned_alloc(64, n->overlay_bytes)))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the recomputation buffer");
    return RP_OK;
}

/* The convolutions' oneDNN kernels for max_batch rows, built here so that
** the step loop builds nothing, and their one workspace. A layer oneDNN
** does not take keeps im2col. */
static rp_status make_accels(rp_net *n, rp_error *err) {
    size_t ws = 0;
    for (int l = n->first; l < n->last; l++) {
        const rp_layer *L = &n->m->layers[l];
        int k = n->opt.conv_kernel;
        if (k == RP_CONV_IM2COL || n->opt.scratch_least || L->type != RP_LAYER_CONV2D ||
            rpi_conv_reduced(L) || (k == RP_CONV_AUTO && !rpi_conv_direct(L, n->max_batch)) ||
            !rpi_conv_accel_wanted(L))
            continue;
        if (!n->accel && !(n->accel = calloc(n->last - n->first, sizeof *n->accel)))
            return rp_fail(err, RP_ERR_NOMEM, "out of memory");
        size_t need;
        rpi_conv_accel *c = rpi_conv_accel_create(L, n->max_batch, &need);
        if (c && n->opt.scratch_limit && need > n->opt.scratch_limit) {
            rpi_conv_accel_free(c); /* matmul_proportion's bound holds for oneDNN too */
            c = NULL;
        }
        n->accel[l - n->first] = c;
        ws = c && need > ws ? need : ws;
    }
    n->accel_bytes = (ws + 63) & ~(size_t)63;
    if (ws && !(n->accel_ws = aligned_alloc(64, n->accel_bytes)))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the convolutions' workspace");
    return RP_OK;
}

const char *rp_net_conv_kernel(const rp_net *n, int l) {
    if (l < n->first || l >= n->last || n->m->layers[l].type != RP_LAYER_CONV2D)
        return NULL;
    return n->accel && n->accel[l - n->first] ? "onednn" : "im2col";
}

rp_status rp_net_create(const rp_model *m, int first, int last, int max_batch, rp_net **out,
                        rp_error *err) {
    return rp_net_create_with(m, first, last, max_batch, NULL, out, err);
}

rp_status rp_net_create_with(const rp_model *m, int first, int last, int max_batch,
                             const rp_net_options *opt, rp_net **out, rp_error *err) {
    *out = NULL;
    if (first < 0 || last > m->num_layers || first >= last || max_batch < 1)
        return rp_fail(err, RP_ERR_INVALID, "net: bad layer range [%d, %d) of %d layers or batch %d",
                       first, last, m->num_layers, max_batch);
    rp_net *n = calloc(1, sizeof *n);
    if (!n)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    n->m = m;
    n->first = first;
    n->last = last;
    n->max_batch = max_batch;
    if (opt)
        n->opt = *opt;
    size_t begin = m->layers[first].param_offset;
    size_t end = m->layers[last - 1].param_offset + m->layers[last - 1].param_count;
    n->num_params = end - begin;
    for (int l = first; l < last; l++) {
        const rp_layer *L = &m->layers[l];
        size_t c, t;
        if (n->opt.scratch_least)
            n->opt.scratch_limit = 1; /* tiles of one sample */
        else if (L->type == RP_LAYER_CONV2D && n->opt.scratch_limit &&
                 rpi_conv_sample_scratch(L) > n->opt.scratch_limit) {
            size_t need = rpi_conv_sample_scratch(L), limit = n->opt.scratch_limit;
            free(n);
            return rp_fail(err, RP_ERR_INFEASIBLE,
                           "matmul_proportion: layer %d (conv2d, line %d) needs %zu bytes of "
                           "scratch for one sample but the proportion of device_memory allows "
                           "%zu",
                           l, L->line, need, limit);
        }
        rpi_layer_scratch(L, max_batch, n->opt.scratch_limit, &c, &t);
        if (L->type == RP_LAYER_MOE && n->opt.ep_size > 1) /* the group's rows */
            t = rpi_moe_scratch(L, max_batch, n->opt.ep_size);
        n->col_n = c > n->col_n ? c : n->col_n;
        n->tmp_n = t > n->tmp_n ? t : n->tmp_n;
        n->gmax = in_size(L) > n->gmax ? in_size(L) : n->gmax;
        n->gmax = out_size(L) > n->gmax ? out_size(L) : n->gmax;
    }
    size_t np = n->num_params ? n->num_params : 1;
    n->params = calloc(np + n->opt.param_slack, sizeof(float));
    n->grads = calloc(np, sizeof(float));
    n->col = n->col_n ? malloc(sizeof(float) * n->col_n) : NULL;
    n->tmp = n->tmp_n ? malloc(sizeof(float) * n->tmp_n) : NULL;
    n->g[0] = malloc(sizeof(float) * n->gmax * max_batch);
    n->g[1] = malloc(sizeof(float) * n->gmax * max_batch);
    n->dirty = calloc(last - first, sizeof(bool));
    if (!n->params || !n->grads || (n->col_n && !n->col) || (n->tmp_n && !n->tmp) || !n->g[0] ||
        !n->g[1] || !n->dirty) {
        size_t count = n->num_params;
        rp_net_free(n);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a net of %zu parameters", count);
    }
    n->graph = !rp_model_is_chain(m);
    rp_status st = make_accels(n, err);
    if (!st && n->graph)
        st = rpi_net_plan_graph(n, err);
    if (!st)
        st = rpi_net_plan_stats(n, err);
    if (!st)
        st = plan_recompute(n, err);
    if (st) {
        rp_net_free(n);
        return st;
    }
    *out = n;
    return RP_OK;
}

void rp_net_free(rp_net *n) {
    if (!n)
        return;
    for (int l = 0; n->accel && l < n->last - n->first; l++)
        rpi_conv_accel_free(n->accel[l]);
    free(n->accel), free(n->accel_ws);
    free(n->params), free(n->grads), free(n->col), free(n->tmp), free(n->g[0]), free(n->g[1]);
    free(n->keep_out), free(n->keep_aux), free(n->ov_out), free(n->ov_aux), free(n->overlay);
    free(n->alias), free(n->dirty), free(n->rc_layer);
    if (n->gt)
        for (int k = 0; k < n->nin + (n->last - n->first); k++)
            free(n->gt[k]);
    free(n->gt), free(n->gcur), free(n->written), free(n->gtmp), free(n->gpack);
    free(n->bin), free(n->bout), free(n->in_slot);
    free(n->stat_at), free(n->stats), free(n->running);
    free(n);
}

float *rp_net_params(rp_net *n) { return n->params; }

float *rp_net_use_params(rp_net *n, float *p) {
    float *was = n->params;
    n->params = p;
    return was;
}
float *rp_net_grads(rp_net *n) {
    size_t base = n->m->layers[n->first].param_offset;
    for (int l = n->first; l < n->last; l++) { /* materialise the zeros before anyone reads them */
        const rp_layer *L = &n->m->layers[l];
        if (!n->dirty[l - n->first] && L->param_count)
            memset(n->grads + (L->param_offset - base), 0, sizeof(float) * L->param_count);
        n->dirty[l - n->first] = true;
    }
    return n->grads;
}

void rp_net_zero_grads(rp_net *n) { memset(n->dirty, 0, sizeof(bool) * (n->last - n->first)); }
size_t rp_net_num_params(const rp_net *n) { return n->num_params; }
size_t rp_net_in_size(const rp_net *n) {
    return n->graph ? n->in_n : in_size(&n->m->layers[n->first]);
}
size_t rp_net_out_size(const rp_net *n) {
    return n->graph ? n->out_n : out_size(&n->m->layers[n->last - 1]);
}
const char *rp_net_error(const rp_net *n) { return n->err.msg; }

size_t rp_net_scratch_bytes(const rp_net *n) {
    return sizeof(float) * (n->col_n + n->tmp_n + 2 * n->gmax * n->max_batch + n->stats_n +
                            n->running_n) +
           n->overlay_bytes + n->graph_bytes + n->accel_bytes;
}

/* Layout of an activation set: input, then each kept output and aux state,
** each 64-byte aligned. */
static size_t acts_layout(const rp_net *n, int batch, size_t *off_out, size_t *off_aux,
                          size_t *off_graph, size_t *off_ws) {
    size_t at = ALIGN64(sizeof(float) * rp_net_in_size(n) * batch);
    if (n->graph) { /* received tensors unpacked (when several), the packed output */
        for (int j = 0; n->nin > 1 && j < n->nin; j++) {
            if (off_graph)
                off_graph[j] = at;
            at += ALIGN64(sizeof(float) * rpi_net_tensor_size(n, n->bin[j]) * batch);
        }
        if (off_graph)
            off_graph[n->nin] = at;
        if (n->packed_out)
            at += ALIGN64(sizeof(float) * n->out_n * batch);
    }
    for (int l = n->first; l < n->last; l++) {
        const rp_layer *L = &n->m->layers[l];
        int i = l - n->first;
        if (n->keep_out[i] && !n->alias[i]) {
            if (off_out)
                off_out[i] = at;
            at += ALIGN64(sizeof(float) * out_size(L) * batch);
        }
        if (n->keep_aux[i]) {
            if (off_aux)
                off_aux[i] = at;
            at += ALIGN64(aux_bytes(n, L, batch));
        }
        if (n->opt.split_backward && rpi_layer_wstash_floats(L, batch)) {
            if (off_ws)
                off_ws[i] = at;
            at += ALIGN64(sizeof(float) * rpi_layer_wstash_floats(L, batch));
        }
    }
    return at;
}

void rp_layer_memory(const rp_model *m, int l, int batch, rp_layer_bytes *out) {
    const rp_layer *L = &m->layers[l];
    size_t o = ALIGN64(sizeof(float) * out_size(L) * batch);
    size_t a = ALIGN64(rpi_layer_aux_bytes(L, batch));
    bool graph = !rp_model_is_chain(m);
    bool flatten = !graph && L->type == RP_LAYER_FLATTEN; /* its input's memory */
    bool end = l == m->num_layers - 1 || m->layers[l + 1].num_vars > 0;
    if (graph && !end) { /* read past the next checkpoint: kept too */
        int r = m->last_reader[l + 1], k = l + 1;
        while (k < r && m->layers[k].num_vars == 0)
            k++;
        end = k < r;
    }
    out->saved = (flatten ? 0 : o) + a;
    out->checkpoint = end && !flatten ? o : 0;
    out->wstash = ALIGN64(sizeof(float) * rpi_layer_wstash_floats(L, batch));
    size_t col, tmp, g = in_size(L) > out_size(L) ? in_size(L) : out_size(L);
    rpi_layer_scratch(L, batch, 0, &col, &tmp);
    out->scratch = sizeof(float) * (col + tmp + 2 * g * (size_t)batch);
    out->grads = graph ? sizeof(float) * out_size(L) * (size_t)batch : 0;
}

rp_status rp_layer_memory_table(const rp_model *m, int t, unsigned tp_flags, int batch,
                                double *saved, double *checkpoint, double *wstash,
                                double *scratch, double *grads, rp_error *err) {
    rp_model *rank = NULL;
    size_t *map = NULL;
    if (t > 1) {
        rp_status st = rp_model_tensor_split(m, t, t - 1, tp_flags, &rank, &map, err);
        if (st)
            return st;
        free(map);
    }
    const rp_model *r = rank ? rank : m;
    for (int l = 0; l < r->num_layers; l++) {
        rp_layer_bytes b;
        rp_layer_memory(r, l, batch, &b);
        if (saved)
            saved[l] = (double)b.saved;
        if (checkpoint)
            checkpoint[l] = (double)b.checkpoint;
        if (wstash)
            wstash[l] = (double)b.wstash;
        if (scratch)
            scratch[l] = (double)b.scratch;
        if (grads)
            grads[l] = (double)b.grads;
    }
    rp_model_free(rank);
    return RP_OK;
}

size_t rp_acts_bytes(const rp_net *n, int batch) {
    return acts_layout(n, batch, NULL, NULL, NULL, NULL);
}

rp_status rp_acts_create(const rp_net *n, int batch, rp_acts **out, rp_error *err) {
    int L = n->last - n->first;
    rp_acts *a = calloc(1, sizeof *a);
    size_t *oo = calloc(L, sizeof(size_t)), *oa = calloc(L, sizeof(size_t));
    size_t *og = calloc(n->nin + 1, sizeof(size_t)), *ow = calloc(L, sizeof(size_t));
    if (!a || !oo || !oa || !og || !ow) {
        free(a), free(oo), free(oa), free(og), free(ow);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    size_t bytes = acts_layout(n, batch, oo, oa, og, ow);
    a->block = aligned_alloc(64, ALIGN64(bytes ? bytes : 64));
    a->out = malloc(sizeof(float *) * L);
    a->aux = malloc(sizeof(void *) * L);
    a->bt = malloc(sizeof(float *) * (n->nin + 1));
    a->ws = n->opt.split_backward ? calloc(L, sizeof(float *)) : NULL;
    if (!a->block || !a->out || !a->aux || !a->bt || (n->opt.split_backward && !a->ws)) {
        free(oo), free(oa), free(og), free(ow);
        rp_acts_free(a);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for activations of batch %d", batch);
    }
    a->capacity = batch;
    a->input = (float *)a->block;
    for (int l = 0; l < L; l++) { /* what is not kept lives in the overlay */
        a->out[l] = (float *)(n->keep_out[l] ? a->block + oo[l] : n->overlay + n->ov_out[l]);
        if (n->alias[l])
            a->out[l] = l ? a->out[l - 1] : a->input;
        a->aux[l] = n->keep_aux[l] ? a->block + oa[l] : n->overlay + n->ov_aux[l];
        if (a->ws && rpi_layer_wstash_floats(&n->m->layers[n->first + l], batch))
            a->ws[l] = (float *)(a->block + ow[l]);
    }
    for (int j = 0; j < n->nin; j++)
        a->bt[j] = n->nin == 1 ? a->input : (float *)(a->block + og[j]);
    a->packed = n->packed_out ? (float *)(a->block + og[n->nin]) : NULL;
    free(oo), free(oa), free(og), free(ow);
    *out = a;
    return RP_OK;
}

float *rp_acts_input(rp_acts *a) { return a->input; }

void rp_acts_free(rp_acts *a) {
    if (!a)
        return;
    free(a->block), free(a->out), free(a->aux), free(a->bt), free(a->ws);
    free(a);
}


const float *rp_net_forward(rp_net *n, rp_acts *a, const float *input, int batch,
                            const rp_step_ctx *ctx, double *loss_sum) {
    if (batch < 1 || batch > a->capacity || batch > n->max_batch) {
        rp_fail(&n->err, RP_ERR_INVALID, "forward: batch %d exceeds the capacity %d", batch,
                a->capacity < n->max_batch ? a->capacity : n->max_batch);
        return NULL;
    }
    a->rows = batch;
    if (input != a->input)
        memcpy(a->input, input, sizeof(float) * rp_net_in_size(n) * batch);
    if (n->graph && n->nin > 1)
        rpi_net_unpack(n, n->nin, n->bin, n->in_n, a->input, a->bt, batch);
    const float *ins[RP_MAX_INPUTS];
    for (int l = n->first; l < n->last; l++) {
        if (n->alias[l - n->first])
            continue;
        layer_args x = rpi_net_args(n, a, l, ctx, ins);
        if (rpi_net_layer_forward(n, &x) != RP_OK)
            return NULL;
    }
    const float *out = a->out[n->last - 1 - n->first];
    if (n->graph && n->packed_out) {
        rpi_net_pack_output(n, a, batch);
        return a->packed;
    }
    if (loss_sum) {
        double s = 0;
        if (n->m->layers[n->last - 1].type == RP_LAYER_SOFTMAX_CE)
            for (int r = 0; r < batch; r++)
                s += out[r];
        *loss_sum = s;
    }
    return out;
}


static const float *backward(rp_net *n, rp_acts *a, const float *dout, const rp_step_ctx *ctx,
                             bool need_input_grad, int part) {
    /* Below the first layer with parameters, gradients are only wanted if
    ** the caller wants the input's: otherwise stop there (no layer below
    ** it has anything to learn). */
    int stop = n->first;
    if (!need_input_grad)
        while (stop < n->last && n->m->layers[stop].num_vars == 0)
            stop++;
    if (n->graph)
        return rpi_net_graph_backward(n, a, dout, ctx, need_input_grad, stop, part);
    const float *g = dout;
    int buf = 0;
    if (dout && (n->m->layers[n->last - 1].tp_reduce & RP_TP_REDUCE_GRAD) && n->opt.tp_allreduce) {
        memcpy(n->g[1], dout, sizeof(float) * out_size(&n->m->layers[n->last - 1]) * a->rows);
        rpi_net_reduce_grad(n, n->last - 1, n->g[1], a->rows); /* the next stage's parts */
        g = n->g[1];
    }
    const float *ins[RP_MAX_INPUTS];
    for (int l = n->last - 1; l >= stop; l--) {
        rpi_net_recompute(n, a, l, ctx);
        if (n->alias[l - n->first])
            continue; /* the gradient passes through as it is */
        layer_args x = rpi_net_args(n, a, l, ctx, ins);
        bool want = l > stop || need_input_grad;
        /* the gradient for layer l - 1 goes straight into its stash where
        ** its weights' half will read it */
        float *home = l > n->first && !n->alias[l - 1 - n->first]
                          ? rpi_net_grad_home(n, a, l - 1, part)
                          : NULL;
        float *din = !want ? NULL : home ? home : n->g[buf];
        rpi_net_layer_backward(n, &x, g, din, part);
        if (ctx->grads_done && part != RPI_BACK_INPUT)
            ctx->grads_done(ctx->grads_arg, l);
        if (din && l > n->first)
            rpi_net_reduce_grad(n, l - 1, din, a->rows);
        g = din;
        buf ^= 1;
    }
    return need_input_grad ? g : NULL;
}

const float *rp_net_backward(rp_net *n, rp_acts *a, const float *dout, const rp_step_ctx *ctx,
                             bool need_input_grad) {
    return backward(n, a, dout, ctx, need_input_grad, RPI_BACK_BOTH);
}

float *rp_net_grad_in_place(rp_net *n, rp_acts *a) {
    const rp_layer *L = &n->m->layers[n->last - 1];
    if (n->graph || n->alias[n->last - 1 - n->first] ||
        ((L->tp_reduce & RP_TP_REDUCE_GRAD) && n->opt.tp_allreduce))
        return NULL; /* (a graph packs what it receives; a tensor group sums it first) */
    return rpi_net_grad_home(n, a, n->last - 1, RPI_BACK_INPUT);
}

const float *rp_net_backward_input(rp_net *n, rp_acts *a, const float *dout,
                                   const rp_step_ctx *ctx, bool need_input_grad) {
    return backward(n, a, dout, ctx, need_input_grad, a->ws ? RPI_BACK_INPUT : RPI_BACK_BOTH);
}

/* The weights' half reads each layer's input and aux from the activation
** set. Inputs of layers with parameters are checkpoints, always kept; an
** aux state recomputation does not keep was written by the input half's
** recomputed forward into the overlay, which other sets share since: the
** layer runs forward once more (the same bits) to have it back. */
void rp_net_backward_weight(rp_net *n, rp_acts *a, const rp_step_ctx *ctx) {
    if (!a->ws)
        return;
    const float *ins[RP_MAX_INPUTS];
    for (int l = n->last - 1; l >= n->first; l--) {
        int i = l - n->first;
        const rp_layer *L = &n->m->layers[l];
        if (!a->ws[i])
            continue;
        layer_args x = rpi_net_args(n, a, l, ctx, ins);
        if (!n->keep_aux[i] && rpi_layer_aux_bytes(L, 1))
            rpi_layer_forward(&x, &n->err); /* it succeeded on these rows before */
        x.part = RPI_BACK_WEIGHT;
        double t0 = n->clock ? rp_now() : 0;
        rpi_layer_backward(&x, a->ws[i], NULL);
        if (n->clock)
            n->clock[3 * i + 2] += rp_now() - t0;
        n->dirty[i] = true;
        if (ctx->grads_done)
            ctx->grads_done(ctx->grads_arg, l);
    }
}

void rp_net_time_layers(rp_net *n, double *ms) { n->clock = ms; }

void rp_net_predictions(const rp_net *n, const rp_acts *a, int32_t *out) {
    const rp_layer *L = &n->m->layers[n->last - 1];
    int C = L->in.dim[0];
    const float *prob = L->type == RP_LAYER_SOFTMAX_CE ? a->aux[n->last - 1 - n->first]
                                                        : a->out[n->last - 1 - n->first];
    for (int r = 0; r < a->rows; r++) {
        const float *p = prob + (size_t)r * C;
        int best = 0;
        for (int c = 1; c < C; c++)
            if (p[c] > p[best])
                best = c;
        out[r] = best;
    }
}

const float *rp_net_probabilities(const rp_net *n, const rp_acts *a) {
    if (n->m->layers[n->last - 1].type != RP_LAYER_SOFTMAX_CE)
        return NULL;
    return a->aux[n->last - 1 - n->first];
}
