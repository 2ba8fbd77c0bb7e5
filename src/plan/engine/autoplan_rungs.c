/*
** The engine's planner's recomputation by layer: which layers a stage
** recomputes when memory is short and recomputing every layer would pay a
** second forward of all of them.
**
** A layer's worth to recompute is the bytes its output keeps for a
** millisecond of its forward (a dropout's mask and output, an attention's
** scores: large and cheap; a product's: small for its time). The layers
** are ranked by it once a profile, and rung q names the best of them until
** they keep RPI_SHARE[q] of what all layers keep (those of one worth spread
** along the model); the programme gives each
** stage the lowest rung that fits its memory (autoplan.c), so the first
** stages of 1F1B, which hold the most micro-batches, recompute the most.
** Aceso chooses operators the same way, by the bytes they save.
*/
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autoplan_impl.h"

static const double RPI_SHARE[RPI_RUNGS + 1] = {0,    0.05, 0.1, 0.15, 0.2, 0.3,
                                                0.4,  0.5,  0.6, 0.8,  1.0};

/* The bytes a layer keeps: what the profile says, else its output. */
static double kept(const measured *m, int l) {
    return m->mem[0] ? m->mem[0][l] : m->out[l];
}

/* The bytes a layer keeps for a millisecond of its forward (infinite where
** its forward takes no time). */
static double worth(const measured *m, int l) {
    return m->fw[l] > 0 ? kept(m, l) / m->fw[l] : INFINITY;
}

/* A layer in the ranking: its worth, and among layers of the same worth
** (a transformer's blocks, each the same operators) its place spread over
** them, so that a rung naming some of them names them evenly along the
** model, each stage its share, rather than all of the first blocks'. */
typedef struct ranked {
    double worth, spread;
    int l;
} ranked;

static int by_worth_down(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->worth != y->worth)
        return x->worth > y->worth ? -1 : 1;
    if (x->spread != y->spread)
        return x->spread < y->spread ? -1 : 1;
    return (x->l > y->l) - (x->l < y->l);
}

/* The radical inverse of i in base 2 (0, 1/2, 1/4, 3/4, 1/8, ...): the
** first n of it split [0, 1) most evenly for every n. */
static double radical_inverse(unsigned i) {
    double r = 0, f = 0.5;
    for (; i; i >>= 1, f *= 0.5)
        r += (i & 1) * f;
    return r;
}

bool rpi_rung_names(const measured *m, int q, int l) {
    return q > 0 && m->rank[l] < m->named[q];
}

rp_status rpi_rungs_make(measured *m, int L, rp_error *err) {
    ranked *w = malloc(sizeof(ranked) * (L > 0 ? L : 1));
    m->rank = malloc(sizeof(int) * (L > 0 ? L : 1));
    if (!w || !m->rank) {
        free(w);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for %d layers", L);
    }
    int n = 0;
    double total = 0;
    for (int l = 0; l < L; l++) {
        m->rank[l] = INT_MAX; /* (keeps nothing: never named) */
        if (kept(m, l) > 0) {
            w[n++] = (ranked){.worth = worth(m, l), .l = l};
            total += kept(m, l);
        }
    }
    /* each layer's place among those of its worth, in the model's order */
    qsort(w, n, sizeof(ranked), by_worth_down);
    for (int i = 0, j; i < n; i = j)
        for (j = i; j < n && w[j].worth == w[i].worth; j++)
            w[j].spread = radical_inverse((unsigned)(j - i));
    qsort(w, n, sizeof(ranked), by_worth_down);
    for (int i = 0; i < n; i++)
        m->rank[w[i].l] = i;
    m->named[0] = 0;
    for (int q = 1, i = 0; q <= RPI_RUNGS; q++) {
        double sum = 0;
        for (i = 0; i < n && sum < RPI_SHARE[q] * total; i++)
            sum += kept(m, w[i].l);
        m->named[q] = i;
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
    if (!rpi_cand_by_layer(k))
        return; /* (the base configuration's, if it names any) */
    name_none(cfg);
    const measured *m = &S->m[k->prof];
    for (int s = 0, first = 0; s < k->P; first += k->layers[s++])
        for (int l = first; l < first + k->layers[s] - 1; l++) /* (the last is kept) */
            if (rpi_rung_names(m, k->rung[s], l))
                rp_config_recompute_layer(cfg, l);
}
