/*
** Fuzz target: the model spec parser, and a forward and backward pass of
** one row through what it accepts (small models only).
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rp_model *m;
    rp_error err;
    if (rp_model_parse(&m, (const char *)data, size, "fuzz", &err) != RP_OK) {
        if (err.msg[0] == '\0')
            abort();
        return 0;
    }
    size_t biggest = rp_shape_size(&m->input);
    for (int l = 0; l < m->num_layers; l++) {
        const rp_layer *L = &m->layers[l];
        size_t o = rp_shape_size(&L->out);
        if (L->type == RP_LAYER_TRANSFORMER_BLOCK) /* attention keeps heads x T x T */
            o += (size_t)L->heads * L->in.dim[0] * L->in.dim[0] + (size_t)L->mlp * o;
        biggest = o > biggest ? o : biggest;
    }
    rp_net *net;
    rp_acts *acts;
    if (m->num_params < 100000 && biggest < 100000 &&
        rp_net_create(m, 0, m->num_layers, 1, &net, &err) == RP_OK) {
        if (rp_acts_create(net, 1, &acts, &err) == RP_OK) {
            rp_model_init_params(m, 0, m->num_layers, 1, NULL, rp_net_params(net));
            float *x = calloc(rp_net_in_size(net), sizeof(float));
            int32_t *labels = calloc((size_t)m->num_targets, sizeof(int32_t)); /* class 0 */
            int64_t id = 0;
            rp_step_ctx ctx = {.training = true, .sample_id = &id, .labels = labels,
                               .loss_scale = 1};
            const float *y = x && labels ? rp_net_forward(net, acts, x, 1, &ctx, NULL) : NULL;
            if (y) {
                float *dy = calloc(rp_net_out_size(net), sizeof(float));
                if (dy)
                    rp_net_backward(net, acts, dy, &ctx, true);
                free(dy);
            }
            free(x), free(labels);
            rp_acts_free(acts);
        }
        rp_net_free(net);
    }
    rp_model_free(m);
    return 0;
}
