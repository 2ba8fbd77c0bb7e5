/*
** Batchnorm's statistics in a net: the slots its forwards record into, and
** the running statistics one worker would reach from them (docs/training.md).
*/
#include <stdlib.h>
#include <string.h>

#include "net_impl.h"

static bool is_bn(const rp_layer *L) {
    return L->type == RP_LAYER_BATCHNORM2D || L->type == RP_LAYER_BATCHNORM1D;
}

/* Each batchnorm layer's slots: stat_slots of 2C + 1 floats (mean,
** variance, filled); and room for its next running statistics (2C). */
rp_status rpi_net_plan_stats(rp_net *n, rp_error *err) {
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
