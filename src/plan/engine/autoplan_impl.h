/*
** The engine's planner's parts (autoplan_programme.c plans every shape's
** stages, autoplan.c simulates them, autoplan_try.c prices and chooses
** them, autoplan_rungs.c recomputes by layer, autoplan_setup.c makes the
** state): its candidates, its profiles and its search state. Not part of
** the API.
*/
#ifndef REPIPE_AUTOPLAN_IMPL_H
#define REPIPE_AUTOPLAN_IMPL_H

#include <stdbool.h>

#include "repipe/layers.h"
#include "repipe/planner.h"
#include "repipe/simulate.h"
#include "../../sim/simulate_impl.h"

/* The most stages the programme plans a pipeline in. */
#define RP_AUTOPLAN_STAGES 8

/* Recomputation by layer: rung q of RPI_RUNGS names the layers that keep
** the most bytes for a millisecond of their forward, RPI_SHARE[q] of what
** all layers keep; rung 0 names none (autoplan_rungs.c). */
#define RPI_RUNGS 10

/* A shape whose stages the programme chose, with its estimate. */
typedef struct cand {
    int R, per, GA, B, P, prof; /* prof: the profile its times come from */
    bool recompute, shard; /* recomputation, replicated tensor sharding */
    unsigned char rung[RP_MAX_STAGES]; /* each stage's recomputation by layer */
    int layers[RP_MAX_STAGES], reps[RP_MAX_STAGES];
    double estimate;
    int ord, seq; /* its shape's place in the enumeration, its own among the pushed */
} cand;

/* Whether some stage of k recomputes by layer. */
static inline bool rpi_cand_by_layer(const cand *k) {
    for (int s = 0; s < k->P; s++)
        if (k->rung[s])
            return true;
    return false;
}

/* One profile of the model: its layers, measured on `batch` rows, and
** prefix sums of forward and backward seconds and parameter bytes. */
typedef struct measured {
    double batch;
    double *fw, *bw, *out, *par;
    double *bi, *bwt; /* a split backward's halves */
    double *cut; /* bytes crossing the cut before each layer */
    /* what each layer keeps, where the profile says (rp_layer_memory) */
    double *mem[5];
    double *cf, *cb, *cp;
    /* recomputation by layer: each layer's place in the ranking (INT_MAX
    ** where it keeps nothing), how many of the first each rung names, and
    ** its layers' forward seconds summed (crf[0] NULL) */
    int *rank;
    int named[RPI_RUNGS + 1];
    double *crf[RPI_RUNGS + 1];
} measured;

/* A stage's first layer's stop: the layer from which it no longer fits cap
** bytes on r replicas with slots micro-batches in flight. */
#define RPI_FIT_STOPS 64
typedef struct rpi_fit_stop {
    long long gen;
    int r, slots, fits, stop; /* stages to layer `fits` fit; from `stop` none */
    double cap;
} rpi_fit_stop;

typedef struct search {
    const rp_config *base;
    const rp_autoplan_options *o;
    int L;
    measured m[RP_AUTOPLAN_MAX_PROFILES];
    int nm;
    rpi_cluster net;
    rp_sim_options sim;
    /* the programme's tables, stages x (L + 1) x (per + 1) */
    double *best;
    /* the micro-batch's round trip through the stages of each cell's plan:
    ** their passes and the messages between them (autoplan.c) */
    double *loop;
    int *cut, *rep;
    unsigned char *rung;  /* the stage's rung of recomputation by layer */
    rp_config *rung_cfg;  /* a shape's configuration with each rung's layers */
    /* the stage memory's running sums from one first layer, (L + 1) rows of
    ** RPI_RUNGS + 1 (autoplan_programme.c) */
    rpi_stage_acc *sums;
    /* for the stages from one first layer (generation stop_gen): the layer
    ** at which they no longer fit (autoplan_programme.c) */
    rpi_fit_stop stops[RPI_FIT_STOPS];
    long long stop_gen;
    /* each (stages, first layer) row's least and most workers with a plan */
    int *kmin, *kmax;
    cand *c;
    int n, cap;
    double *top; /* the least estimates pushed, `candidates` at most (autoplan_programme.c) */
    int ntop;
    int ord; /* the place of the shape being planned in the enumeration */
    double *fastest; /* the fastest simulation so far (the keys are tried near it) */
} search;

/* For the tests: plan every shape and stage in full, none passed over by
** the bounds that leave the plans as they are (test_autoplan compares the
** two on random chains). Not an option: the plans are the same. */
extern bool rpi_plan_exhaustive;

/* The search's state (autoplan_setup.c): the options checked (the
** workers in *W), profile i's rows read into S->m[S->nm++], the
** simulator's options and the programme's tables, all freed; and the
** error that says why nothing was found. */
rp_status rpi_plan_check_options(const rp_autoplan_options *o, int num_profiles, int *W,
                                 rp_error *err);
rp_status rpi_plan_read_profile(search *S, const rp_profile *p, double batch, rp_error *err);
rp_status rpi_plan_prepare(search *S, int W, rp_error *err);
void rpi_plan_free(search *S);
rp_status rpi_plan_none_found(const search *S, int W, const rp_autoplan_options *o,
                              rp_error *err);
/* The most micro-batches an update the shapes on R replicas take (N
** samples): at most max_accumulation, or as many as leave micro-batches no
** smaller than the smallest profiled. */
int rpi_accumulation_cap(const search *S, long long N, int R);

/* The programme (autoplan_programme.c): profiles ps (n, measured on bs
** rows) read into S, and every shape's stages on W workers as o lays them
** out pushed into S->c, sorted by estimate (*too_big: shapes whose
** micro-batches pass an int, passed over); and the accumulation that an
** exact micro-batch (o->micro_batch) makes on R replicas, 0 where none. */
rp_status rpi_plan_programme(search *S, const rp_profile *const *ps, const double *bs, int n,
                             int W, bool *too_big, rp_error *err);
int rpi_exact_accumulation(const rp_autoplan_options *o, long long N, int R);

/* Recomputation by layer (autoplan_rungs.c): each rung's layers of
** profile m and their running sums; whether rung q names layer l; cfg's
** recompute_layers for stages that each take a rung. */
rp_status rpi_rungs_make(measured *m, int L, rp_error *err);
bool rpi_rung_names(const measured *m, int q, int l);
void rpi_rungs_config(const measured *m, int q, int L, rp_config *cfg);
void rpi_rungs_stages(const search *S, const cand *k, rp_config *cfg);

/* The profile measured nearest B rows (by ratio). */
int rpi_plan_nearest(const search *S, double B);
/* Candidate k as a configuration of 1f1b over the base's other keys. */
void rpi_plan_config(const search *S, const cand *k, rp_config *cfg);
/* Seconds per update, the most a worker holds and the seconds beyond the
** innermost level of cfg as it is; false where it cannot run or does not
** fit. */
bool rpi_plan_simulate_as_is(const search *S, const rp_config *cfg, double *t, double *bytes,
                             double *far);
/* Seconds per update and the most a worker holds, with the reductions'
** keys that pay; false where it cannot run or does not fit. */
bool rpi_plan_simulate(const search *S, rp_config *cfg, double *t, double *bytes);
/* Keeps cfg in e where it is faster, or as fast and simpler. */
void rpi_plan_consider(const search *S, rp_autoplan_entry *e, const rp_config *cfg, double t,
                       double bytes);
/* Pipeline k under the zero-bubble schedules, with two chunks a worker,
** and as DualPipe where asked; each returns how many it simulated. */
int rpi_plan_zero_bubble(const search *S, const cand *k, rp_config cfg, rp_autoplan_entry *into,
                         rp_autoplan_entry *best);
int rpi_plan_interleaved(const search *S, const cand *k, rp_config cfg, rp_autoplan_entry *into,
                         rp_autoplan_entry *best);
int rpi_plan_dualpipe(const search *S, const cand *k, rp_config cfg, rp_autoplan_entry *into,
                      rp_autoplan_entry *best);

#endif
