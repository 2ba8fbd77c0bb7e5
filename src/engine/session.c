/*
** Sessions on one worker: the whole model on the calling thread.
**
** An update runs GA micro-batches forward and backward, each micro-batch's
** loss gradient scaled by 1 / (B * GA) at the loss layer (the mean over the
** update's samples), then one optimizer step on the flat buffers.
*/
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/session.h"

/* OpenBLAS's own thread control (not part of CBLAS). */
void openblas_set_num_threads(int num_threads);

struct rp_session {
    const rp_model *m;
    rp_config cfg;
    rp_net *net;
    rp_acts *acts;
    float *opt_state;
    long long updates;
    float *losses; /* D * R * GA */
    int32_t *pred_tmp;
    float reduced; /* the `sum` output */
};

rp_status rp_session_create(const rp_model *m, const rp_config *cfg, rp_session **out,
                            rp_error *err) {
    *out = NULL;
    rp_derived d;
    rp_config_derive(cfg, &d);
    if (d.workers != 1 || d.inference_workers != 1)
        return rp_fail(err, RP_ERR_INVALID,
                       "this configuration needs %d training and %d inference workers; sessions "
                       "run one worker (replication_factor 1, one stage)",
                       d.workers, d.inference_workers);
    if (m->num_classes == 0 || m->layers[m->num_layers - 1].type != RP_LAYER_SOFTMAX_CE)
        return rp_fail(err, RP_ERR_INVALID,
                       "the model must end with softmax_cross_entropy to be trained");
    int counts[RP_MAX_STAGES];
    rp_status st = rp_config_stage_layers(cfg, false, m->num_layers, counts, err);
    if (st)
        return st;
    rp_session *s = calloc(1, sizeof *s);
    if (!s)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    s->m = m;
    s->cfg = *cfg;
    rp_fpu_fast_denormals();
    openblas_set_num_threads(1);
    int B = cfg->micro_batch_size;
    if ((st = rp_net_create(m, 0, m->num_layers, B, &s->net, err)) ||
        (st = rp_acts_create(s->net, B, &s->acts, err)))
        goto fail;
    size_t n = rp_net_num_params(s->net);
    int per = rp_optimizer_state_per_param(&cfg->optimizer);
    s->opt_state = calloc(per ? n * per : 1, sizeof(float));
    s->losses = malloc(sizeof(float) * (size_t)cfg->device_iterations *
                       cfg->gradient_accumulation_steps);
    s->pred_tmp = malloc(sizeof(int32_t) * B);
    if (!s->opt_state || !s->losses || !s->pred_tmp) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    rp_model_init_params(m, 0, m->num_layers, cfg->seed, 0, rp_net_params(s->net));
    *out = s;
    return RP_OK;
fail:
    rp_session_free(s);
    return st;
}

void rp_session_free(rp_session *s) {
    if (!s)
        return;
    rp_acts_free(s->acts);
    rp_net_free(s->net);
    free(s->opt_state), free(s->losses), free(s->pred_tmp);
    free(s);
}

long long rp_session_samples_per_call(const rp_session *s) {
    const rp_config *c = &s->cfg;
    return (long long)c->micro_batch_size * c->gradient_accumulation_steps *
           c->replication_factor * c->device_iterations;
}

long long rp_session_updates(const rp_session *s) { return s->updates; }

rp_status rp_session_run(rp_session *s, const float *x, const int32_t *labels,
                         const int64_t *sample_ids, rp_result *res, rp_error *err) {
    const rp_config *c = &s->cfg;
    int B = c->micro_batch_size, GA = c->gradient_accumulation_steps, D = c->device_iterations;
    size_t in = rp_net_in_size(s->net), n = rp_net_num_params(s->net);
    for (int d = 0; d < D; d++) {
        rp_net_zero_grads(s->net);
        for (int mb = 0; mb < GA; mb++) {
            size_t row = ((size_t)d * GA + mb) * B;
            rp_step_ctx ctx = {.training = true,
                               .seed = c->seed,
                               .update = (uint64_t)s->updates,
                               .sample_id = sample_ids + row,
                               .labels = labels + row,
                               .loss_scale = 1.0 / ((double)B * GA)};
            double loss;
            if (!rp_net_forward(s->net, s->acts, x + row * in, B, &ctx, &loss))
                return rp_fail(err, RP_ERR_INVALID, "%s", rp_net_error(s->net));
            rp_net_backward(s->net, s->acts, NULL, &ctx, false);
            s->losses[(size_t)d * GA + mb] = (float)(loss / B);
        }
        s->updates++;
        rp_optimizer_step(&c->optimizer, s->updates, rp_net_params(s->net),
                          rp_net_grads(s->net), s->opt_state, n);
    }
    /* Shape the losses by output mode (training: default means final). */
    if (c->output_mode == RP_OUTPUT_ALL) {
        *res = (rp_result){3, {D, 1, GA}, D * GA, s->losses};
    } else if (c->output_mode == RP_OUTPUT_SUM) {
        double sum = 0;
        for (int i = 0; i < D * GA; i++)
            sum += s->losses[i];
        s->reduced = (float)sum;
        *res = (rp_result){1, {1}, 1, &s->reduced};
    } else {
        *res = (rp_result){1, {1}, 1, s->losses + D * GA - 1};
    }
    return RP_OK;
}

rp_status rp_session_predict(rp_session *s, const float *x, int n, int32_t *pred,
                             rp_error *err) {
    int B = s->cfg.micro_batch_size;
    size_t in = rp_net_in_size(s->net);
    rp_step_ctx ctx = {.training = false, .seed = s->cfg.seed, .loss_scale = 1.0};
    for (int at = 0; at < n; at += B) {
        int rows = n - at < B ? n - at : B;
        if (!rp_net_forward(s->net, s->acts, x + (size_t)at * in, rows, &ctx, NULL))
            return rp_fail(err, RP_ERR_INVALID, "%s", rp_net_error(s->net));
        rp_net_predictions(s->net, s->acts, pred + at);
    }
    return RP_OK;
}

rp_status rp_session_get_weights(rp_session *s, rp_weights **out, rp_error *err) {
    return rp_weights_from_params(s->m, rp_net_params(s->net), out, err);
}

rp_status rp_session_set_weights(rp_session *s, const rp_weights *w, rp_error *err) {
    return rp_weights_to_params(s->m, w, 0, rp_net_params(s->net), err);
}
