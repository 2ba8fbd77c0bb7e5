/*
** Fuzz target: the model spec parser, and a forward and backward pass of
** one row through what it accepts (small models only).
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/net.h"

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
        /* the same model as two stages cut in the middle: a graph's cut packs
        ** every tensor alive there */
        int k = m->num_layers / 2;
        rp_net *a = NULL, *b = NULL;
        rp_acts *aa = NULL, *ab = NULL;
        if (k > 0 && rp_net_create(m, 0, k, 1, &a, &err) == RP_OK &&
            rp_net_create(m, k, m->num_layers, 1, &b, &err) == RP_OK &&
            rp_acts_create(a, 1, &aa, &err) == RP_OK && rp_acts_create(b, 1, &ab, &err) == RP_OK) {
            rp_model_init_params(m, 0, k, 1, NULL, rp_net_params(a));
            rp_model_init_params(m, k, m->num_layers, 1, NULL, rp_net_params(b));
            float *x = calloc(rp_net_in_size(a), sizeof(float));
            float *dy = calloc(rp_net_out_size(b), sizeof(float));
            int32_t *labels = calloc((size_t)m->num_targets, sizeof(int32_t));
            int64_t id = 0;
            rp_step_ctx ctx = {.training = true, .sample_id = &id, .labels = labels,
                               .loss_scale = 1};
            const float *h = x && dy && labels ? rp_net_forward(a, aa, x, 1, &ctx, NULL) : NULL;
            if (h && rp_net_in_size(b) != rp_net_out_size(a))
                abort(); /* what one stage sends is what the next receives */
            if (h && rp_net_forward(b, ab, h, 1, &ctx, NULL)) {
                const float *g = rp_net_backward(b, ab, dy, &ctx, true);
                if (g)
                    rp_net_backward(a, aa, g, &ctx, true);
            }
            free(x), free(dy), free(labels);
        }
        rp_acts_free(aa), rp_acts_free(ab);
        rp_net_free(a), rp_net_free(b);
    }
    rp_model_free(m);
    return 0;
}
