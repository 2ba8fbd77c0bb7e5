/*
** The model as a graph: which tensors are alive where a pipeline is cut.
**
** Tensor t is layer t's output (t = -1: the model's input). A cut before
** layer k must carry every tensor made before k and read at k or later; a
** chain carries one, a residual block cut in its middle two. Stages pack
** those tensors sample by sample in ascending order, so a message is still
** rows of samples, and everything that moves rows between workers
** (pipelines, stage replicas, fp16 exchange) needs no change for graphs.
*/
#include <stdlib.h>

#include "graph.h"

const rp_shape *rp_model_tensor_shape(const rp_model *m, int t) {
    return t < 0 ? &m->input : &m->layers[t].out;
}

bool rp_model_is_chain(const rp_model *m) {
    for (int l = 0; l < m->num_layers; l++)
        if (m->layers[l].num_inputs != 1 || m->layers[l].inputs[0] != l - 1)
            return false;
    return true;
}

rp_status rpi_model_link(rp_model *m, const char *name, rp_error *err) {
    int L = m->num_layers;
    if (L < 1)
        return rp_fail(err, RP_ERR_PARSE, "%s: the model has no layers", name);
    m->last_reader = malloc(sizeof(int) * (L + 1));
    if (!m->last_reader)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    for (int i = 0; i <= L; i++)
        m->last_reader[i] = -1;
    for (int l = 0; l < L; l++)
        for (int i = 0; i < m->layers[l].num_inputs; i++)
            m->last_reader[m->layers[l].inputs[i] + 1] = l;
    if (m->last_reader[0] < 0)
        return rp_fail(err, RP_ERR_INVALID, "%s: no layer reads the input", name);
    for (int t = 0; t < L - 1; t++)
        if (m->last_reader[t + 1] < 0)
            return rp_fail(err, RP_ERR_INVALID,
                           "%s:%d: nothing reads the output of this %s (every output but the "
                           "last layer's must be read)",
                           name, m->layers[t].line, rp_layer_name(m->layers[t].type));
    return RP_OK;
}

int rp_model_boundary(const rp_model *m, int k, int *tensors) {
    int n = 0;
    if (k >= m->num_layers) {
        tensors[0] = m->num_layers - 1;
        return 1;
    }
    for (int t = -1; t < k; t++)
        if (m->last_reader[t + 1] >= k)
            tensors[n++] = t;
    return n;
}

size_t rp_model_boundary_size(const rp_model *m, int k) {
    size_t n = 0;
    if (k >= m->num_layers)
        return rp_shape_size(&m->layers[m->num_layers - 1].out);
    for (int t = -1; t < k; t++)
        if (m->last_reader[t + 1] >= k)
            n += rp_shape_size(rp_model_tensor_shape(m, t));
    return n;
}

/* How many tensors cross boundary k (rp_model_boundary's count). */
static int crossing(const rp_model *m, int k) {
    int n = 0;
    for (int t = -1; t < k; t++)
        n += m->last_reader[t + 1] >= k;
    return n;
}

int rp_model_blocks(const rp_model *m, int *first, int *end) {
    /* The spans between boundaries one tensor crosses: one that holds a
    ** transformer_block or an attention starts a block, and the spans after
    ** it that end in a residual (an add that reads the span's input: a
    ** LLaMA block's MLP half) are the block's too. Whatever else lies
    ** between two blocks is the earlier one's; after the last, the head. */
    int L = m->num_layers, n = 0, start = 0;
    bool open = false;
    *end = 0;
    for (int k = 1; k <= L; k++) {
        if (k < L && crossing(m, k) != 1)
            continue;
        bool block = false;
        for (int l = start; l < k; l++)
            block = block || m->layers[l].type == RP_LAYER_TRANSFORMER_BLOCK ||
                    m->layers[l].type == RP_LAYER_ATTENTION;
        const rp_layer *last = &m->layers[k - 1];
        bool residual = false; /* an add that reads the span's input */
        for (int i = 0; last->type == RP_LAYER_ADD && i < last->num_inputs; i++)
            residual = residual || last->inputs[i] == start - 1;
        if (block)
            first[n++] = start;
        open = block || (open && residual);
        if (open)
            *end = k;
        start = k;
    }
    return n;
}
