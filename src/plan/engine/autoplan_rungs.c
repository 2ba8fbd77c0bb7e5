/*
** The engine's planner's recomputation by layer: which layers a stage
** recomputes when memory is short and recomputing every layer would pay a
** second forward of all of them.
**
** A layer's worth to recompute is the bytes its output keeps for a
** millisecond of its forward (a dropout's mask and output, an attention's
** scores: large and cheap; a product's: small for its time). The layers
** are ranked by it once a profile, and rung q names the best of them until
** they keep RPI_SHARE[q] of what all layers keep; the programme gives each
** stage the lowest rung that fits its memory (autoplan.c), so the first
** stages of 1F1B, which hold the most micro-batches, recompute the most.
** Aceso chooses operators the same way, by the bytes they save.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autoplan_impl.h"

static const double RPI_SHARE[RPI_RUNGS + 1] = {0,    0.05, 0.1, 0.15, 0.2, 0.3,
                                                0.4,  0.5,  0.6, 0.8,  1.0};

/* The bytes a layer keeps for a millisecond of its forward (infinite where
** its forward takes no time). */
static double worth(const measured *m, int l) {
    return m->fw[l] > 0 ? m->out[l] / m->fw[l] : INFINITY;
}

static int by_worth_down(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y;
}

bool rpi_rung_names(const measured *m, int q, int l) {
    return q > 0 && m->out[l] > 0 && worth(m, l) >= m->theta[q];
}

rp_status rpi_rungs_make(measured *m, int L, rp_error *err) {
    /* (worth, bytes) pairs, best first */
    double *w = malloc(sizeof(double) * 2 * (L > 0 ? L : 1)), total = 0;
    if (!w)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for %d layers", L);
    int n = 0;
    for (int l = 0; l < L; l++)
        if (m->out[l] > 0) {
            w[2 * n] = worth(m, l), w[2 * n + 1] = m->out[l];
            total += m->out[l], n++;
        }
    qsort(w, n, 2 * sizeof(double), by_worth_down);
    m->theta[0] = INFINITY;
    for (int q = 1, i = 0; q <= RPI_RUNGS; q++) {
        double kept = 0;
        for (i = 0; i < n && kept < RPI_SHARE[q] * total; i++)
            kept += w[2 * i + 1];
        m->theta[q] = i > 0 ? w[2 * (i - 1)] : INFINITY;
    }
    free(w);
    for (int q = 1; q <= RPI_RUNGS; q++) {
        if (!(m->crf[q] = calloc(L + 1, sizeof(double))))
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for %d layers", L);
        for (int l = 0; l < L; l++)
            m->crf[q][l + 1] = m->crf[q][l] + (rpi_rung_names(m, q, l) ? m->fw[l] * 1e-3 : 0);
    }
    return RP_OK;
}

/* cfg's recompute_layers emptied. */
static void name_none(rp_config *cfg) {
    memset(cfg->recompute_layers, 0, sizeof cfg->recompute_layers);
    cfg->recompute_layers_count = 0;
}

void rpi_rungs_config(const measured *m, int q, int L, rp_config *cfg) {
    name_none(cfg);
    for (int l = 0; l < L; l++)
        if (rpi_rung_names(m, q, l))
            rp_config_recompute_layer(cfg, l);
}

void rpi_rungs_stages(const search *S, const cand *k, rp_config *cfg) {
    bool any = false;
    for (int s = 0; s < k->P; s++)
        any = any || k->rung[s];
    if (!any)
        return; /* (the base configuration's, if it names any) */
    name_none(cfg);
    const measured *m = &S->m[k->prof];
    for (int s = 0, first = 0; s < k->P; first += k->layers[s++])
        for (int l = first; l < first + k->layers[s] - 1; l++) /* (the last is kept) */
            if (rpi_rung_names(m, k->rung[s], l))
                rp_config_recompute_layer(cfg, l);
}
