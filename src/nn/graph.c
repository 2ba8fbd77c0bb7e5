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
