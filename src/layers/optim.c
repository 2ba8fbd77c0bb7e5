/*
** Optimizers over flat buffers, with PyTorch's update rules:
**   sgd:   g += wd*p; v = momentum*v + g; p -= lr*v   (v only with momentum)
**   adam:  g += wd*p; m, v moments; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
**   adamw: p *= 1 - lr*wd, then adam without the wd term
*/
#include <math.h>

#include "layers_impl.h" /* RP_HOT */
#include "repipe/layers.h"

int rp_optimizer_state_per_param(const rp_optimizer_config *o) {
    if (o->type == RP_OPT_SGD)
        return o->momentum != 0 ? 1 : 0;
    return 2;
}

RP_HOT
void rp_optimizer_step_at(const rp_optimizer_config *o, long long step, float *p, const float *g,
                          float *state, size_t stride, size_t n) {
    float lr = (float)o->lr, wd = (float)o->weight_decay;
    if (o->type == RP_OPT_SGD) {
        float mu = (float)o->momentum;
        if (mu == 0) {
            for (size_t i = 0; i < n; i++)
                p[i] -= lr * (g[i] + wd * p[i]);
            return;
        }
        float *v = state;
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] + wd * p[i];
            v[i] = step <= 1 ? gi : mu * v[i] + gi;
            p[i] -= lr * v[i];
        }
        return;
    }
    float b1 = (float)o->beta1, b2 = (float)o->beta2, eps = (float)o->eps;
    double bc1 = 1.0 - pow(o->beta1, (double)step), bc2 = 1.0 - pow(o->beta2, (double)step);
    float step_size = (float)(o->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    bool decoupled = o->type == RP_OPT_ADAMW;
    float *m = state, *v = state + stride;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        if (decoupled)
            p[i] *= 1.0f - lr * wd;
        else
            gi += wd * p[i];
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
    }
}

/* After the definition: clang makes a function multiversioned only before
** its first use. */
void rp_optimizer_step(const rp_optimizer_config *o, long long step, float *p, const float *g,
                       float *state, size_t n) {
    rp_optimizer_step_at(o, step, p, g, state, n, n);
}
