/*
** Sampling text from a token model: one forward pass of the whole model per
** new token over the last T tokens (a shorter prompt is padded at the end;
** the model's causal attention keeps the padding from the positions before
** it), then a draw from the probabilities of the last real position.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "repipe/net.h"

/* sorts probabilities into descending order */
static int by_prob(const void *a, const void *b) {
    float x = ((const float *)a)[0], y = ((const float *)b)[0];
    return (x < y) - (x > y);
}

rp_status rp_model_check_tokens(const rp_model *m, const char *what, rp_error *err) {
    int T = m->input.ndim == 1 ? m->input.dim[0] : 0;
    if (!T || m->num_targets != T)
        return rp_fail(err, RP_ERR_INVALID,
                       "%s need%s a token model: an input of T token ids and a loss with a "
                       "target per token (T x classes scores); this model's input is "
                       "%d-dimensional and its loss takes %d target%s",
                       what, strchr(what, ' ') ? "" : "s", m->input.ndim, m->num_targets,
                       m->num_targets == 1 ? "" : "s");
    return RP_OK;
}

static rp_status generate(const rp_model *m, const float *params, int32_t *tokens, int len,
                          int n, double temperature, int top_k, uint64_t seed, rp_error *err) {
    int T = m->input.dim[0], V = m->num_classes;
    rp_status bad = rp_model_check_tokens(m, "generate", err);
    if (bad)
        return bad;
    if (len < 1 || n < 0 || !(temperature >= 0) || top_k < 0)
        return rp_fail(err, RP_ERR_INVALID,
                       "generate: a prompt of at least one token, n >= 0, temperature >= 0 and "
                       "top_k >= 0 (got %d, %d, %g, %d)",
                       len, n, temperature, top_k);
    for (int i = 0; i < len; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return rp_fail(err, RP_ERR_INVALID,
                           "generate: prompt token %d is %d, outside the vocabulary [0, %d)", i,
                           tokens[i], V);
    rp_net *net = NULL;
    rp_acts *acts = NULL;
    float *x = malloc(sizeof(float) * T), *cand = malloc(sizeof(float) * 2 * V);
    rp_status st = RP_OK;
    if (!x || !cand)
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
    if (!st && !(st = rp_net_create(m, 0, m->num_layers, 1, &net, err)))
        st = rp_acts_create(net, 1, &acts, err);
    if (!st)
        memcpy(rp_net_params(net), params, sizeof(float) * m->num_params);
    int64_t id = 0;
    rp_step_ctx ctx = {.training = false, .sample_id = &id, .loss_scale = 1};
    for (int k = 0; k < n && !st; k++) {
        int have = len + k, from = have > T ? have - T : 0, rows = have - from;
        for (int t = 0; t < T; t++)
            x[t] = t < rows ? (float)tokens[from + t] : 0.0f;
        if (!rp_net_forward(net, acts, x, 1, &ctx, NULL)) {
            st = rp_fail(err, RP_ERR_INVALID, "generate: %s", rp_net_error(net));
            break;
        }
        const float *p = rp_net_probabilities(net, acts) + (size_t)(rows - 1) * V;
        int next = 0;
        for (int v = 0; v < V && !st; v++)
            if (!(p[v] >= 0 && p[v] <= 1)) /* NaN weights give NaN scores */
                st = rp_fail(err, RP_ERR_INVALID,
                             "generate: token %d: the probability of token %d is %g; the "
                             "weights hold NaN or infinity",
                             have, v, p[v]);
        if (st)
            break;
        for (int v = 1; v < V; v++)
            next = p[v] > p[next] ? v : next;
        if (temperature > 0) {
            /* softmax(z / temperature) is p^(1 / temperature), renormalised:
            ** taken as (p / p_max)^(1 / temperature), in logarithms, which
            ** keeps the likeliest at 1 however small the temperature (p^(1/T)
            ** itself underflows to 0 for every token, and the draw took the
            ** last) and tends to the likeliest token as T goes to 0 */
            double lmax = log(p[next]);
            for (int v = 0; v < V; v++) {
                cand[2 * v] = (float)exp((log(p[v]) - lmax) / temperature);
                cand[2 * v + 1] = (float)v;
            }
            int keep = top_k && top_k < V ? top_k : V;
            if (keep < V)
                qsort(cand, V, 2 * sizeof(float), by_prob);
            double total = 0;
            for (int i = 0; i < keep; i++)
                total += cand[2 * i];
            double u = rp_uniform(seed, (uint64_t)k, 0, 0, 0) * total, run = 0;
            next = (int)cand[2 * (keep - 1) + 1];
            for (int i = 0; i < keep; i++)
                if ((run += cand[2 * i]) > u) {
                    next = (int)cand[2 * i + 1];
                    break;
                }
        }
        tokens[have] = next;
    }
    rp_acts_free(acts);
    rp_net_free(net);
    free(x), free(cand);
    return st;
}

rp_status rp_model_generate(const rp_model *m, const float *params, int32_t *tokens, int len,
                            int n, double temperature, int top_k, uint64_t seed, rp_error *err) {
    unsigned fpu = rpi_fpu_enter(); /* the draws as the engine computes: denormals flushed */
    rp_status st = generate(m, params, tokens, len, n, temperature, top_k, seed, err);
    rpi_fpu_leave(fpu);
    return st;
}
