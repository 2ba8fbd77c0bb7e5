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

#include "layers.h"

struct rp_net {
    const rp_model *m;
    int first, last, max_batch;
    float *params, *grads;
    size_t num_params;
    float *col, *tmp;
    size_t col_n, tmp_n;
    float *g[2]; /* gradient ping-pong, max_batch * gmax floats each */
    size_t gmax;
    bool grads_clean; /* zero by contract: the next backward overwrites */
    rp_net_options opt;
    bool *keep_out, *keep_aux; /* per layer: held by the activation set */
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
    bool *written;
    float *gtmp, *gpack;
    size_t graph_bytes;
    /* batchnorm: per layer of the net, where its statistics slots start in
    ** `stats` (SIZE_MAX: not a batchnorm); the running statistics next */
    size_t *stat_at;
    float *stats, *running;
    size_t stats_n, running_n;
    rp_error err;
};

struct rp_acts {
    int capacity, rows;
    float *input;
    float **bt;    /* a graph's received tensors unpacked (bt[0] = input when one) */
    float *packed; /* a graph's packed output, when not the last layer's */
    float **out; /* one per layer of the net */
    void **aux;
    unsigned char *block;
};

static inline size_t in_size(const rp_layer *L) { return rp_shape_size(&L->in); }
static inline size_t out_size(const rp_layer *L) { return rp_shape_size(&L->out); }

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

static bool is_checkpoint(const rp_net *n, int l) {
    return l == n->first || n->m->layers[l].num_vars > 0;
}

/* The checkpoint that begins layer l's segment. */
static int segment_of(const rp_net *n, int l) {
    while (!is_checkpoint(n, l))
        l--;
    return l;
}

/* Whether a graph's tensor l is read after its segment (or sent): it must
** be kept, since recomputation runs one segment at a time. */
static bool read_later(const rp_net *n, int l) {
    int r = n->m->last_reader[l + 1];
    return r >= n->last || segment_of(n, r) != segment_of(n, l);
}

static size_t tensor_size(const rp_net *n, int t) {
    return rp_shape_size(rp_model_tensor_shape(n->m, t));
}

/* The slot of tensor t: received ones first, then the net's layers. */
static int slot_of(const rp_net *n, int t) {
    return t >= n->first ? n->nin + (t - n->first) : n->in_slot[t + 1];
}

/* A graph's boundaries and gradient buffers. */
static rp_status plan_graph(rp_net *n, rp_error *err) {
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
                    n->in_n += tensor_size(n, t);
                    break;
                }
        n->nout = 1, n->bout[0] = n->first, n->out_n = tensor_size(n, n->first);
    }
    n->packed_out = n->nout != 1 || n->bout[0] != n->last - 1;
    for (int j = 0; j < n->nin; j++)
        n->in_slot[n->bin[j] + 1] = j;
    int slots = n->nin + L;
    n->gt = calloc(slots, sizeof(float *));
    n->written = calloc(slots, sizeof(bool));
    if (!n->gt || !n->written)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    size_t most = n->in_n;
    for (int k = 0; k < slots; k++) {
        int t = k < n->nin ? n->bin[k] : n->first + (k - n->nin);
        size_t sz = tensor_size(n, t);
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

static bool is_bn(const rp_layer *L) {
    return L->type == RP_LAYER_BATCHNORM2D || L->type == RP_LAYER_BATCHNORM1D;
}

/* Each batchnorm layer's slots: stat_slots of 2C + 1 floats (mean,
** variance, filled); and room for its next running statistics (2C). */
static rp_status plan_stats(rp_net *n, rp_error *err) {
    int L = n->last - n->first;
    if (!(n->stat_at = malloc(sizeof(size_t) * L)))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    for (int l = n->first; l < n->last; l++) {
        const rp_layer *Ly = &n->m->layers[l];
        n->stat_at[l - n->first] = SIZE_MAX;
        if (!is_bn(Ly) || n->opt.stat_slots < 1)
            continue;
        n->stat_at[l - n->first] = n->stats_n;
        n->stats_n += (size_t)n->opt.stat_slots * (2 * Ly->in.dim[0] + 1);
        n->running_n += 2 * (size_t)Ly->in.dim[0];
    }
    if (n->stats_n && (!(n->stats = calloc(n->stats_n, sizeof(float))) ||
                       !(n->running = malloc(sizeof(float) * n->running_n))))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for batchnorm's statistics");
    return RP_OK;
}

float *rp_net_stats(rp_net *n, size_t *count) {
    *count = n->stats_n;
    return n->stats;
}

/* running <- (1 - momentum) running + momentum x, for each filled slot in
** order: what one worker's forwards of those micro-batches would leave.
** Computed into n->running from the parameters (next), or written into
** them (commit). */
static void running(rp_net *n, bool commit) {
    size_t base = n->m->layers[n->first].param_offset, at = 0;
    for (int l = n->first; n->stats && l < n->last; l++) {
        const rp_layer *Ly = &n->m->layers[l];
        if (n->stat_at[l - n->first] == SIZE_MAX)
            continue;
        int C = Ly->in.dim[0];
        float *p = n->params + (Ly->param_offset - base) + 2 * C, *r = n->running + at;
        at += 2 * (size_t)C;
        if (commit) {
            memcpy(p, r, sizeof(float) * 2 * C);
            continue;
        }
        memcpy(r, p, sizeof(float) * 2 * C);
        for (int k = 0; k < n->opt.stat_slots; k++) {
            const float *s = n->stats + n->stat_at[l - n->first] + (size_t)k * (2 * C + 1);
            if (s[2 * C] == 0.0f)
                continue;
            for (int e = 0; e < 2 * C; e++)
                r[e] = (1.0f - Ly->momentum) * r[e] + Ly->momentum * s[e];
        }
    }
}

void rp_net_running_next(rp_net *n) { running(n, false); }
void rp_net_running_commit(rp_net *n) { running(n, true); }

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
    size_t at = 0;
    for (int l = n->first; l < n->last; l++) {
        const rp_layer *Ly = &n->m->layers[l];
        int i = l - n->first;
        bool end = l == n->last - 1 || is_checkpoint(n, l + 1);
        n->keep_out[i] = !n->opt.recompute || end || (n->graph && read_later(n, l));
        n->keep_aux[i] = !n->opt.recompute || l == n->last - 1;
        if (is_checkpoint(n, l))
            at = 0;
        if (!n->keep_out[i]) {
            n->ov_out[i] = at;
            at += ALIGN64(sizeof(float) * out_size(Ly) * n->max_batch);
        }
        if (!n->keep_aux[i]) {
            n->ov_aux[i] = at;
            at += ALIGN64(rpi_layer_aux_bytes(Ly, n->max_batch));
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
    if (!n->params || !n->grads || (n->col_n && !n->col) || (n->tmp_n && !n->tmp) || !n->g[0] ||
        !n->g[1]) {
        size_t count = n->num_params;
        rp_net_free(n);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a net of %zu parameters", count);
    }
    n->graph = !rp_model_is_chain(m);
    rp_status st = n->graph ? plan_graph(n, err) : RP_OK;
    if (!st)
        st = plan_stats(n, err);
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
    free(n->params), free(n->grads), free(n->col), free(n->tmp), free(n->g[0]), free(n->g[1]);
    free(n->keep_out), free(n->keep_aux), free(n->ov_out), free(n->ov_aux), free(n->overlay);
    free(n->alias);
    if (n->gt)
        for (int k = 0; k < n->nin + (n->last - n->first); k++)
            free(n->gt[k]);
    free(n->gt), free(n->written), free(n->gtmp), free(n->gpack);
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
    if (n->grads_clean) { /* materialise the zeros before anyone reads them */
        memset(n->grads, 0, sizeof(float) * n->num_params);
        n->grads_clean = false;
    }
    return n->grads;
}

void rp_net_zero_grads(rp_net *n) { n->grads_clean = true; }
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
           n->overlay_bytes + n->graph_bytes;
}

/* Layout of an activation set: input, then each kept output and aux state,
** each 64-byte aligned. */
static size_t acts_layout(const rp_net *n, int batch, size_t *off_out, size_t *off_aux,
                          size_t *off_graph) {
    size_t at = ALIGN64(sizeof(float) * rp_net_in_size(n) * batch);
    if (n->graph) { /* received tensors unpacked (when several), the packed output */
        for (int j = 0; n->nin > 1 && j < n->nin; j++) {
            if (off_graph)
                off_graph[j] = at;
            at += ALIGN64(sizeof(float) * tensor_size(n, n->bin[j]) * batch);
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
            at += ALIGN64(rpi_layer_aux_bytes(L, batch));
        }
    }
    return at;
}

size_t rp_acts_bytes(const rp_net *n, int batch) {
    return acts_layout(n, batch, NULL, NULL, NULL);
}

rp_status rp_acts_create(const rp_net *n, int batch, rp_acts **out, rp_error *err) {
    int L = n->last - n->first;
    rp_acts *a = calloc(1, sizeof *a);
    size_t *oo = calloc(L, sizeof(size_t)), *oa = calloc(L, sizeof(size_t));
    size_t *og = calloc(n->nin + 1, sizeof(size_t));
    if (!a || !oo || !oa || !og) {
        free(a), free(oo), free(oa), free(og);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    size_t bytes = acts_layout(n, batch, oo, oa, og);
    a->block = aligned_alloc(64, ALIGN64(bytes ? bytes : 64));
    a->out = malloc(sizeof(float *) * L);
    a->aux = malloc(sizeof(void *) * L);
    a->bt = malloc(sizeof(float *) * (n->nin + 1));
    if (!a->block || !a->out || !a->aux || !a->bt) {
        free(oo), free(oa), free(og);
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
    }
    for (int j = 0; j < n->nin; j++)
        a->bt[j] = n->nin == 1 ? a->input : (float *)(a->block + og[j]);
    a->packed = n->packed_out ? (float *)(a->block + og[n->nin]) : NULL;
    free(oo), free(oa), free(og);
    *out = a;
    return RP_OK;
}

float *rp_acts_input(rp_acts *a) { return a->input; }

void rp_acts_free(rp_acts *a) {
    if (!a)
        return;
    free(a->block), free(a->out), free(a->aux), free(a->bt);
    free(a);
}

/* Where tensor t of a graph is in an activation set. */
static float *tensor_at(const rp_net *n, rp_acts *a, int t) {
    return t >= n->first ? a->out[t - n->first] : a->bt[n->in_slot[t + 1]];
}

/* A layer's arguments; a graph's inputs are looked up into ins. */
static layer_args args_for(rp_net *n, rp_acts *a, int l, const rp_step_ctx *ctx,
                           const float **ins) {
    const rp_layer *L = &n->m->layers[l];
    size_t base = n->m->layers[n->first].param_offset;
    if (n->graph)
        for (int i = 0; i < L->num_inputs; i++)
            ins[i] = tensor_at(n, a, L->inputs[i]);
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
        .ctx = ctx,
        .accumulate = !n->grads_clean,
        .scratch_limit = n->opt.scratch_limit,
    };
    return x;
}

/* Rows of `row` floats, each sample's k tensors `ts` one after another,
** into a buffer per tensor. */
static void unpack(const rp_net *n, int k, const int *ts, size_t row, const float *in,
                   float **parts, int batch) {
    size_t at = 0;
    for (int j = 0; j < k; j++) {
        size_t sz = tensor_size(n, ts[j]);
        for (int r = 0; r < batch; r++)
            memcpy(parts[j] + r * sz, in + r * row + at, sizeof(float) * sz);
        at += sz;
    }
}

/* The tensors sent, packed sample by sample. */
static void pack_output(const rp_net *n, rp_acts *a, int batch) {
    size_t at = 0;
    for (int j = 0; j < n->nout; j++) {
        size_t sz = tensor_size(n, n->bout[j]);
        const float *p = tensor_at(n, a, n->bout[j]);
        for (int r = 0; r < batch; r++)
            memcpy(a->packed + r * n->out_n + at, p + r * sz, sizeof(float) * sz);
        at += sz;
    }
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
        unpack(n, n->nin, n->bin, n->in_n, a->input, a->bt, batch);
    const float *ins[RP_MAX_INPUTS];
    for (int l = n->first; l < n->last; l++) {
        if (n->alias[l - n->first])
            continue;
        layer_args x = args_for(n, a, l, ctx, ins);
        if (rpi_layer_forward(&x, &n->err) != RP_OK)
            return NULL;
    }
    const float *out = a->out[n->last - 1 - n->first];
    if (n->graph && n->packed_out) {
        pack_output(n, a, batch);
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

/* At the end of a segment (backward reaching layer l), runs it forward
** again from its checkpoint, skipping a layer whose output and aux are
** kept. */
static void recompute_segment(rp_net *n, rp_acts *a, int l, const rp_step_ctx *ctx) {
    if (!n->opt.recompute || (l != n->last - 1 && !is_checkpoint(n, l + 1)))
        return;
    const float *ins[RP_MAX_INPUTS];
    for (int k = segment_of(n, l); k <= l; k++) {
        int i = k - n->first;
        if (n->alias[i] ||
            (n->keep_out[i] && (n->keep_aux[i] || !rpi_layer_aux_bytes(&n->m->layers[k], 1))))
            continue;
        layer_args x = args_for(n, a, k, ctx, ins);
        rpi_layer_forward(&x, &n->err); /* it succeeded on these rows before */
    }
}

/* A gradient g (rows of tensor t) for tensor t: written when it is the
** first, added when another reader's came before it. */
static void give_grad(rp_net *n, int t, const float *g, int rows) {
    int k = slot_of(n, t);
    size_t len = tensor_size(n, t) * rows;
    float *restrict d = n->gt[k];
    if (!n->written[k]) {
        if (g != d)
            memcpy(d, g, sizeof(float) * len);
        n->written[k] = true;
    } else {
        for (size_t i = 0; i < len; i++)
            d[i] += g[i];
    }
}

static const float *graph_backward(rp_net *n, rp_acts *a, const float *dout,
                                   const rp_step_ctx *ctx, bool need_input_grad, int stop) {
    int rows = a->rows, slots = n->nin + (n->last - n->first);
    memset(n->written, 0, sizeof(bool) * slots);
    bool loss = n->m->layers[n->last - 1].type == RP_LAYER_SOFTMAX_CE;
    if (!loss) { /* the gradients received, one per tensor sent */
        size_t at = 0;
        for (int j = 0; j < n->nout; j++) {
            int t = n->bout[j];
            size_t sz = tensor_size(n, t);
            float *d = n->gt[slot_of(n, t)];
            for (int r = 0; r < rows; r++)
                memcpy(d + r * sz, dout + r * n->out_n + at, sizeof(float) * sz);
            n->written[slot_of(n, t)] = true;
            at += sz;
        }
    }
    const float *ins[RP_MAX_INPUTS];
    for (int l = n->last - 1; l >= stop; l--) {
        recompute_segment(n, a, l, ctx);
        const rp_layer *L = &n->m->layers[l];
        layer_args x = args_for(n, a, l, ctx, ins);
        const float *g = n->gt[slot_of(n, l)];
        for (int i = 0; i < L->num_inputs; i++) {
            int t = L->inputs[i];
            bool want = t >= stop || (t < n->first && need_input_grad);
            if (L->type == RP_LAYER_ADD) {
                if (want)
                    give_grad(n, t, g, rows);
            } else if (L->type == RP_LAYER_CONCAT) {
                if (want) {
                    int k = slot_of(n, t);
                    rpi_concat_backward(&x, i, g, n->gt[k], n->written[k]);
                    n->written[k] = true;
                }
            } else { /* one input: straight into its buffer when first */
                int k = slot_of(n, t);
                float *din = !want ? NULL : n->written[k] ? n->gtmp : n->gt[k];
                rpi_layer_backward(&x, loss && l == n->last - 1 ? NULL : g, din);
                if (din)
                    give_grad(n, t, din, rows);
            }
        }
    }
    n->grads_clean = false;
    if (!need_input_grad)
        return NULL;
    if (n->nin == 1 && n->written[0])
        return n->gt[0];
    size_t at = 0; /* packed as they came; a tensor no reader differentiates gets zeros */
    for (int j = 0; j < n->nin; j++) {
        size_t sz = tensor_size(n, n->bin[j]);
        for (int r = 0; r < rows; r++) {
            float *d = n->gpack + r * n->in_n + at;
            if (n->written[j])
                memcpy(d, n->gt[j] + r * sz, sizeof(float) * sz);
            else
                memset(d, 0, sizeof(float) * sz);
        }
        at += sz;
    }
    return n->gpack;
}

const float *rp_net_backward(rp_net *n, rp_acts *a, const float *dout, const rp_step_ctx *ctx,
                             bool need_input_grad) {
    /* Below the first layer with parameters, gradients are only wanted if
    ** the caller wants the input's: otherwise stop there (no layer below
    ** it has anything to learn). */
    int stop = n->first;
    if (!need_input_grad)
        while (stop < n->last && n->m->layers[stop].num_vars == 0)
            stop++;
    if (n->graph)
        return graph_backward(n, a, dout, ctx, need_input_grad, stop);
    const float *g = dout;
    int buf = 0;
    const float *ins[RP_MAX_INPUTS];
    for (int l = n->last - 1; l >= stop; l--) {
        recompute_segment(n, a, l, ctx);
        if (n->alias[l - n->first])
            continue; /* the gradient passes through as it is */
        layer_args x = args_for(n, a, l, ctx, ins);
        bool want = l > stop || need_input_grad;
        float *din = want ? n->g[buf] : NULL;
        rpi_layer_backward(&x, g, din);
        g = din;
        buf ^= 1;
    }
    n->grads_clean = false;
    return need_input_grad ? g : NULL;
}

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
