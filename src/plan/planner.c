/*
** The planner's dynamic programme.
**
** For a level with M machines, cell (i, j, m) holds the best time per step
** of states i..j (row i = "after state i-1", row 0 = from the start) on m+1
** machines: either one stage replicated on m+1 machines, or a split after a
** DAG predecessor k of j, with m' machines for the last stage (k+1..j) and
** the rest for the prefix (i..k). The arithmetic follows PipeDream's
** optimizer_graph_hierarchical.py operation by operation, so that times
** agree to the last few bits.
**
** Ties. Where candidates reach exactly the same time PipeDream keeps the
** first one it meets, in the iteration order of a hash set, which differs
** from run to run. repipe prefers, at every cell, (1) the smaller time,
** then (2) fewer stages, then (3) the smaller sum of squared stage times
** (the more balanced plan), then (4) one stage over the cell with one
** machine fewer (--fewer-machines) over a split, and between splits the
** smaller split point k, then the fewer machines for the last stage.
*/
#include "repipe/planner.h"

#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "antichain.h"

void rp_plan_options_default(rp_plan_options *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < RP_PLAN_MAX_LEVELS; i++)
        o->bandwidth[i] = 1e9;
    o->memory_size = 16e9;
}

typedef struct cell {
    double time; /* INFINITY: infeasible */
    double sumsq;
    int k;     /* split after state k; -1 for a single stage */
    int mrest; /* machine index of the prefix cell */
    int nmach; /* machines of the last stage */
    int stages;
} cell;

/* Cells of a level; the times are also kept apart, densely, because the
** inner loop reads nothing else. */
typedef struct level_table {
    int rows, n, m; /* rows: N + 1, or 1 for the top level */
    cell *c;
    double *time;
} level_table;

static inline size_t idx(const level_table *t, int i, int j, int m) {
    return ((size_t)i * t->n + j) * t->m + m;
}

static inline cell *at(const level_table *t, int i, int j, int m) { return &t->c[idx(t, i, j, m)]; }

static inline void put(level_table *t, int i, int j, int m, const cell *c) {
    size_t q = idx(t, i, j, m);
    t->c[q] = *c;
    t->time[q] = c->time;
}

/* Infeasible cells have an infinite time. */
static inline bool better(const cell *a, const cell *b) {
    if (isinf(a->time))
        return false;
    if (a->time != b->time)
        return a->time < b->time;
    if (a->stages != b->stages)
        return a->stages < b->stages;
    return a->sumsq < b->sumsq;
}

/* Range sums over states (i..j]: row 0 counts from the start. */
static inline double range(const double *cum, int i, int j) {
    if (i == 0)
        return cum[j];
    return j > i - 1 ? cum[j] - cum[i - 1] : NAN;
}

typedef struct level_ctx {
    const rp_states *st;
    const level_table *prev; /* NULL at level 1 */
    int M;
    double b;       /* bandwidth */
    double w;       /* machines of the previous level; 1 at level 1 */
    double below;   /* machines under one machine of this level, all levels */
    double memsize; /* NAN: no memory constraint */
    double acr;     /* 0: no activation compression */
    bool straight, fewer;
} level_ctx;

/* Compute time of states (i..j] at this level. */
static inline double level_time(const level_ctx *x, int i, int j) {
    if (!x->prev)
        return range(x->st->compute, i, j);
    if (j < i)
        return NAN;
    double t = x->prev->time[idx(x->prev, i, j, x->prev->m - 1)];
    return isinf(t) ? NAN : t;
}

static inline double ceil_div(int a, int b) { return ceil((double)a / (double)b); }

/* Between two splits that tie on time, stages and balance, the smaller
** split point k wins, then the fewer machines for the last stage. */
static inline bool split_better(const cell *a, const cell *b) {
    if (better(a, b))
        return true;
    if (isinf(a->time) || better(b, a))
        return false;
    return a->k < b->k || (a->k == b->k && a->nmach < b->nmach);
}

typedef struct sort_key {
    double v;
    int q;
} sort_key;

static int cmp_key(const void *a, const void *b) {
    const sort_key *x = a, *y = b;
    if (x->v != y->v)
        return x->v < y->v ? -1 : 1;
    return (x->q > y->q) - (x->q < y->q);
}

/* Lower bounds. Any plan for states (i..k] on d machines of the lowest
** level takes at least raw(i..k) / d, raw being the difference of the
** cumulative compute times: the stage times of a plan add up to raw (the
** differences telescope), a stage on r machines takes at least its time / r,
** and max(t_s / r_s) >= sum(t_s) / sum(r_s). Transfers, communication and
** memory limits only add. A negative raw (a range that is not a contiguous
** part of the DAG) is bounded by raw itself, as fewer machines may be used. */
static inline double lower_bound(double raw, double d) { return raw >= 0 ? raw / d : raw; }

/* The largest raw whose lower bound is at most b. */
static inline double lb_inverse(double b, double d) { return b >= 0 ? b * d : b; }

typedef struct solver {
    const level_ctx *x;
    level_table *t;
    int first_row, row_step; /* this worker's rows: first, first + step, ... */
    rp_status status;
} solver;

/* Fills rows first_row, first_row + row_step, ... of the table. Rows are
** independent (row i reads only row i and the level below), so workers
** share nothing but read-only inputs.
**
** j runs outermost: cell (i, j, m) needs only cells of columns k < j and
** (i, j, m-1), so the last-stage terms of every split point k of j are
** computed, and sorted, once per j. A split's time is at least its last
** stage's time, so split points are visited by ascending last-stage time
** and the scan stops at the first one whose last stage alone is slower than
** the best candidate so far. The order of visits does not change the
** result: ties are decided by better() and split_better(). */
static void *solve_rows(void *arg) {
    solver *sv = arg;
    const level_ctx *x = sv->x;
    level_table *t = sv->t;
    const rp_states *st = x->st;
    int N = st->n, M = x->M;
    bool mem = !isnan(x->memsize);
    /* last[q * M + mp]: time of the last stage (k+1..j) on mp machines, for
    ** the q-th predecessor k of j, including the transfer bounds when
    ** activations are compressed; lraw: without them; lstash: its stashed
    ** bytes per copy; order[r]: the r-th q by descending C[k], csorted[r]
    ** that C[k]. */
    double *last = malloc(sizeof(double) * (size_t)N * M);
    double *lraw = malloc(sizeof(double) * (size_t)N * M);
    double *lstash = malloc(sizeof(double) * N);
    double *cdiv = malloc(sizeof(double) * (size_t)M * M);
    int *order = malloc(sizeof(int) * N);
    double *csorted = malloc(sizeof(double) * N);
    sort_key *keys = malloc(sizeof(sort_key) * N);
    if (!last || !lraw || !lstash || !cdiv || !order || !keys || !csorted) {
        free(last), free(lraw), free(lstash), free(cdiv), free(order), free(keys);
        free(csorted);
        sv->status = RP_ERR_NOMEM;
        return NULL;
    }
    /* cdiv[m * M + d] = ceil((M - (m+1)) / d): copies of stashed data */
    for (int m = 0; m < M; m++)
        for (int d = 1; d < M; d++)
            cdiv[m * M + d] = ceil_div(M - (m + 1), d);
    const cell none = {INFINITY, 0, -1, 0, 0, 0};
    /* Slack for rounding between a lower bound and the time it bounds. */
    double margin = 1e-9 * fabs(st->compute[N - 1]);
    int max_mp = x->straight ? 1 : M - 1;
    for (int j = sv->first_row; j < N; j++) {
        const int *pred = st->pred[j];
        int np = st->num_pred[j];
        for (int q = 0; q < np; q++) {
            int k = pred[q];
            double tl = level_time(x, k + 1, j);
            double lpar = range(st->parameter, k + 1, j);
            lstash[q] = range(st->activation, k + 1, j) + lpar;
            for (int mp = 1; mp <= max_mp; mp++) {
                double l = tl + (4.0 * (mp - 1) * lpar) / (x->b * mp);
                l = isnan(tl) ? INFINITY : l / mp;
                lraw[(size_t)q * M + mp] = l;
                if (x->acr > 0) {
                    double in = (2.0 * st->out_activation[k]) / (x->b * mp) / x->acr;
                    if (in > l)
                        l = in;
                    if (j < N - 1) {
                        double out = (2.0 * st->out_activation[j]) / (x->b * mp) / x->acr;
                        if (out > l)
                            l = out;
                    }
                }
                last[(size_t)q * M + mp] = l;
            }
        }
        /* Split points by descending cumulative compute C[k]. */
        for (int q = 0; q < np; q++)
            keys[q] = (sort_key){-st->compute[pred[q]], q};
        qsort(keys, np, sizeof *keys, cmp_key);
        for (int r = 0; r < np; r++) {
            order[r] = keys[r].q;
            csorted[r] = st->compute[pred[keys[r].q]];
        }
        int rows = t->rows < j + 1 ? t->rows : j + 1;
        for (int i = sv->first_row; i < rows; i += sv->row_step) {
            /* One stage on m+1 machines. */
            double tc = level_time(x, i, j);
            double act = range(st->activation, i, j), par = range(st->parameter, i, j);
            for (int m = 0; m < M; m++) {
                cell c = none;
                double stashed = ceil_div(M - (m + 1), m + 1) * (act + par);
                if ((m == 0 || !x->straight) && !isnan(tc) && !(mem && stashed > x->memsize)) {
                    double dp = (4.0 * m * par) / (x->b * (m + 1));
                    dp /= x->w;
                    double time = (tc + dp) / (m + 1);
                    c = (cell){time, time * time, -1, 0, m + 1, 1};
                }
                put(t, i, j, m, &c);
            }
            if (j == i)
                continue;
            /* Splits after a predecessor k >= i of j (the prefix cell exists
            ** only from i on; PipeDream's "not a predecessor of i-1"). */
            const double *trow = t->time + idx(t, i, 0, 0);
            double cbase = i > 0 ? st->compute[i - 1] : 0;
            for (int m = 1; m < M; m++) {
                cell c = *at(t, i, j, m);
                if (x->fewer && better(at(t, i, j, m - 1), &c))
                    c = *at(t, i, j, m - 1);
                cell split = none;
                double bound = c.time; /* a split slower than this cannot win */
                int mps = x->straight ? 1 : m;
                for (int mp = 1; mp <= mps; mp++) {
                    /* Candidates whose prefix or last stage cannot beat the
                    ** bound lie outside [r, end of the window): skip them
                    ** by binary search at the start, stop at the end. */
                    double dpre = (double)(m - mp + 1) * x->below;
                    double dlast = (double)mp * x->below;
                    double cmax = cbase + lb_inverse(bound + margin, dpre);
                    int lo = 0, hi = np;
                    while (lo < hi) {
                        int mid = (lo + hi) / 2;
                        if (csorted[mid] > cmax)
                            lo = mid + 1;
                        else
                            hi = mid;
                    }
                    for (int r = lo; r < np; r++) {
                        if (lower_bound(st->compute[j] - csorted[r], dlast) - margin > bound)
                            break;
                        int q = order[r];
                        int k = pred[q];
                        if (k < i)
                            continue;
                        double l = last[(size_t)q * M + mp];
                        double pre = trow[(size_t)k * M + m - mp];
                        double pt = pre > l ? pre : l;
                        if (pt > bound)
                            continue; /* also skips infeasible cells */
                        if (mem && lstash[q] * cdiv[m * M + mp] > x->memsize)
                            continue;
                        const cell *prefix = at(t, i, k, m - mp);
                        double lr = lraw[(size_t)q * M + mp];
                        cell cand = {pt, prefix->sumsq + lr * lr, k, m - mp, mp,
                                     prefix->stages + 1};
                        if (split_better(&cand, &split)) {
                            split = cand;
                            if (pt < bound)
                                bound = pt;
                        }
                    }
                }
                if (better(&split, &c))
                    c = split;
                put(t, i, j, m, &c);
            }
        }
    }
    free(last), free(lraw), free(lstash), free(cdiv), free(order), free(keys);
    free(csorted);
    sv->status = RP_OK;
    return NULL;
}

/* Fills the table, splitting its rows over up to `threads` workers. */
static rp_status solve_level(const level_ctx *x, level_table *t, int threads, rp_error *err) {
    if (threads > t->rows)
        threads = t->rows;
    if (threads > 16)
        threads = 16;
    if (threads < 1)
        threads = 1;
    solver sv[16];
    pthread_t tid[16];
    int started = 1;
    for (int w = 0; w < threads; w++)
        sv[w] = (solver){x, t, w, threads, RP_OK};
    for (int w = 1; w < threads; w++) {
        if (pthread_create(&tid[w], NULL, solve_rows, &sv[w]) != 0)
            break;
        started++;
    }
    /* Rows of workers that could not start are done here, in turn. */
    solve_rows(&sv[0]);
    for (int w = started; w < threads; w++)
        solve_rows(&sv[w]);
    for (int w = 1; w < started; w++)
        pthread_join(tid[w], NULL);
    for (int w = 0; w < threads; w++)
        if (sv[w].status != RP_OK)
            return rp_fail(err, RP_ERR_NOMEM, "out of memory while planning");
    return RP_OK;
}

void rp_plan_free(rp_plan *p) {
    if (!p)
        return;
    for (int l = 0; l < p->num_levels; l++)
        free(p->levels[l].stages);
    free(p->levels), free(p->stage_num_ranks), free(p->worker_stage), free(p->node_stage);
    free(p);
}

/* Follows the split chain of cell (start, end-1, M-1) and appends the
** stages of range [start, end) to lvl. */
static rp_status analyze(const level_table *t, const rp_states *st, int start, int end,
                         int parent, rp_plan_level *lvl, rp_error *err) {
    int splits[1024], reps[1024], n = 0;
    const cell *c = at(t, start, end - 1, t->m - 1);
    if (isinf(c->time))
        return rp_fail(err, RP_ERR_INFEASIBLE, "no stage layout fits");
    while (c->k >= 0) {
        if (n == 1023)
            return rp_fail(err, RP_ERR_INVALID, "a level has more than 1023 stages");
        splits[n] = c->k + 1;
        reps[n++] = c->nmach;
        c = at(t, start, c->k, c->mrest);
    }
    reps[n] = c->nmach;
    int prev = start;
    for (int s = n; s >= 0; s--) {
        int split = s > 0 ? splits[s - 1] : end;
        rp_plan_stage *ps = &lvl->stages[lvl->num_stages++];
        ps->start = prev;
        ps->end = split;
        ps->compute_time = prev > 0 ? st->compute[split - 1] - st->compute[prev - 1]
                                    : st->compute[split - 1];
        ps->activation_bytes = range(st->activation, prev, split - 1);
        ps->parameter_bytes = range(st->parameter, prev, split - 1);
        ps->replication = reps[s];
        ps->parent = parent;
        prev = split;
    }
    return RP_OK;
}

/* Appends the workers of stage s of level l (and of its sub-stages),
** replica-major. */
static void emit_workers(rp_plan *p, int l, int s) {
    const rp_plan_stage *ps = &p->levels[l].stages[s];
    for (int c = 0; c < ps->replication; c++) {
        if (l == p->num_levels - 1) {
            p->worker_stage[p->num_workers++] = s;
            continue;
        }
        const rp_plan_level *below = &p->levels[l + 1];
        for (int k = 0; k < below->num_stages; k++)
            if (below->stages[k].parent == s)
                emit_workers(p, l + 1, k);
    }
}

static rp_status check_options(const rp_plan_options *o, rp_error *err) {
    if (o->num_levels < 1 || o->num_levels > RP_PLAN_MAX_LEVELS)
        return rp_fail(err, RP_ERR_INVALID, "machines: give 1 to %d levels (got %d)",
                       RP_PLAN_MAX_LEVELS, o->num_levels);
    for (int l = 0; l < o->num_levels; l++) {
        if (o->machines[l] < 1 || o->machines[l] > RP_PLAN_MAX_MACHINES)
            return rp_fail(err, RP_ERR_INVALID,
                           "machines: level %d has %d machines; give 1 to %d", l + 1,
                           o->machines[l], RP_PLAN_MAX_MACHINES);
        if (!(o->bandwidth[l] > 0) || !isfinite(o->bandwidth[l]))
            return rp_fail(err, RP_ERR_INVALID, "bandwidth: level %d has %g; it must be > 0",
                           l + 1, o->bandwidth[l]);
    }
    /* in 64 bits: 4096 x 4096 x 4096 machines would wrap an int */
    long long all = 1;
    for (int l = 0; l < o->num_levels; l++)
        all *= o->machines[l];
    if (all > RP_PLAN_MAX_MACHINES)
        return rp_fail(err, RP_ERR_INVALID,
                       "machines: the levels hold %lld machines in all; at most %d", all,
                       RP_PLAN_MAX_MACHINES);
    if (!(o->memory_size > 0))
        return rp_fail(err, RP_ERR_INVALID, "memory size must be > 0 bytes (got %g)",
                       o->memory_size);
    if (o->activation_compression < 0 || !isfinite(o->activation_compression))
        return rp_fail(err, RP_ERR_INVALID,
                       "activation compression ratio must be > 0 (got %g)",
                       o->activation_compression);
    return RP_OK;
}

/* Fails, with the figure, when the tables for N states and the states'
** predecessor lists cannot fit in this machine's memory: before allocating
** them, rather than after minutes of swapping. */
static rp_status fits(int N, const rp_plan_options *o, const char *what, rp_error *err) {
    int L = o->num_levels;
    double need = (double)N * N / 2 * sizeof(int);
    for (int l = 0; l < L; l++)
        need += (double)(l == L - 1 ? 1 : N + 1) * N * o->machines[l] *
                (sizeof(cell) + sizeof(double));
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && need > (double)pages * page)
        return rp_fail(err, RP_ERR_NOMEM,
                       "the plan's tables need %.1f GB for %d %s on these machines, more than "
                       "this machine's %.1f GB: use fewer levels, or a coarser profile",
                       need / 1e9, N, what, (double)pages * page / 1e9);
    return RP_OK;
}

rp_status rp_plan_compute(const rp_profile *profile, const rp_plan_options *o, rp_plan **out,
                          rp_error *err) {
    *out = NULL;
    rp_status s = check_options(o, err);
    if (s)
        return s;
    /* a profile has at least as many states as nodes after its input (on
    ** PipeDream's profiles, up to 15 times as many): refuse before
    ** building them */
    if ((s = fits(profile->num_nodes - 1, o, "nodes", err)))
        return s;
    rp_states st;
    if ((s = rp_states_build(profile, &st, err)))
        return s;
    int N = st.n, L = o->num_levels;
    level_table tables[RP_PLAN_MAX_LEVELS] = {{0}};
    rp_plan *p = calloc(1, sizeof *p);
    if (!p) {
        rp_states_free(&st);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    p->options = *o;
    p->num_states = N;
    if ((s = fits(N, o, "states", err)))
        goto done;
    double below = 1;
    for (int l = 0; l < L; l++) {
        if (l)
            below *= o->machines[l - 1];
        level_table *t = &tables[l];
        t->rows = l == L - 1 ? 1 : N + 1;
        t->n = N;
        t->m = o->machines[l];
        t->c = malloc(sizeof(cell) * (size_t)t->rows * N * t->m);
        t->time = malloc(sizeof(double) * (size_t)t->rows * N * t->m);
        if (!t->c || !t->time) {
            s = rp_fail(err, RP_ERR_NOMEM,
                        "out of memory: level %d needs a table of %d x %d x %d cells", l + 1,
                        t->rows, N, t->m);
            goto done;
        }
        level_ctx x = {&st,
                       l ? &tables[l - 1] : NULL,
                       o->machines[l],
                       o->bandwidth[l],
                       l ? o->machines[l - 1] : 1,
                       below,
                       o->memory_constraint ? o->memory_size : NAN,
                       o->activation_compression,
                       o->straight,
                       o->fewer_machines};
        int threads = o->threads > 0 ? o->threads : (t->rows > 64 ? 2 : 1);
        if ((s = solve_level(&x, t, threads, err)))
            goto done;
    }
    const cell *top = at(&tables[L - 1], 0, N - 1, o->machines[L - 1] - 1);
    if (isinf(top->time)) {
        s = rp_fail(err, RP_ERR_INFEASIBLE,
                    "no plan fits: every way of splitting %d states over these machines "
                    "exceeds the memory size of %.4g bytes per machine%s",
                    N, o->memory_size,
                    o->fewer_machines ? "" : " (--fewer-machines may help)");
        goto done;
    }
    /* Unfold from the top level down. */
    p->num_levels = L;
    p->levels = calloc(L, sizeof(rp_plan_level));
    if (!p->levels) {
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int li = 0; li < L; li++) {
        int l = L - 1 - li; /* index into options/tables */
        rp_plan_level *lvl = &p->levels[li];
        lvl->level = l + 1;
        lvl->machines = o->machines[l];
        lvl->bandwidth = o->bandwidth[l];
        lvl->stages = calloc(N, sizeof(rp_plan_stage));
        if (!lvl->stages) {
            s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (li == 0) {
            s = analyze(&tables[l], &st, 0, N, -1, lvl, err);
        } else {
            const rp_plan_level *up = &p->levels[li - 1];
            for (int k = 0; k < up->num_stages && !s; k++)
                s = analyze(&tables[l], &st, up->stages[k].start, up->stages[k].end, k, lvl,
                            err);
        }
        if (s)
            goto done;
    }
    /* Times and speed-ups. */
    p->single_stage_time = st.compute[N - 1];
    double total_par = st.parameter[N - 1], dp = p->single_stage_time, w = 1;
    for (int l = 0; l < L; l++) {
        double comm = ((4.0 * (o->machines[l] - 1) * total_par) /
                       (o->bandwidth[l] * o->machines[l])) / w;
        dp = (dp + comm) / o->machines[l];
        w = o->machines[l];
    }
    p->data_parallel_time = dp;
    p->pipeline_time = top->time;
    p->speedup_vs_single = p->single_stage_time / p->pipeline_time;
    p->dp_speedup_vs_single = p->single_stage_time / p->data_parallel_time;
    p->speedup_vs_dp = p->data_parallel_time / p->pipeline_time;
    p->machines_available = 1;
    for (int l = 0; l < L; l++)
        p->machines_available *= o->machines[l];
    /* Workers, replica-major. */
    const rp_plan_level *bottom = &p->levels[L - 1];
    p->num_stages = bottom->num_stages;
    p->worker_stage = malloc(sizeof(int) * p->machines_available);
    p->stage_num_ranks = calloc(p->num_stages, sizeof(int));
    p->num_nodes = profile->num_nodes;
    p->node_stage = malloc(sizeof(int) * (profile->num_nodes ? profile->num_nodes : 1));
    if (!p->worker_stage || !p->stage_num_ranks || !p->node_stage) {
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int k = 0; k < p->levels[0].num_stages; k++)
        emit_workers(p, 0, k);
    for (int r = 0; r < p->num_workers; r++)
        p->stage_num_ranks[p->worker_stage[r]]++;
    p->machines_used = p->num_workers;
    /* Nodes: each final stage takes the nodes covered by its last state that
    ** no earlier stage took; Input sources go to stage 0. */
    for (int i = 0; i < profile->num_nodes; i++)
        p->node_stage[i] = st.input_source[i] ? 0 : -1;
    for (int k = 0; k < bottom->num_stages; k++) {
        const uint64_t *cov = st.covers + (size_t)(bottom->stages[k].end - 1) * st.nwords;
        for (int i = 0; i < profile->num_nodes; i++)
            if (p->node_stage[i] < 0 && ((cov[i >> 6] >> (i & 63)) & 1))
                p->node_stage[i] = k;
    }
done:
    for (int l = 0; l < L; l++)
        free(tables[l].c), free(tables[l].time);
    rp_states_free(&st);
    if (s) {
        rp_plan_free(p);
        return s;
    }
    *out = p;
    return RP_OK;
}
