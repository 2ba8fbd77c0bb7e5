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

#include "../core/util.h"
#include "antichain.h"

size_t rp_plan_options_size(void) { return sizeof(rp_plan_options); }

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

/* One row of a level's table: cells (i, j, m) for a fixed first state i,
** at c[j * M + m], and their times apart, densely, because the inner loop
** reads nothing else. Rows are independent (row i reads only row i and the
** level below), so a level below the top is solved a row at a time and
** keeps only what the level above reads: the time of each range on all its
** machines. The rows the plan uses are solved again when it is unfolded. */
typedef struct row_buf {
    cell *c;
    double *time;
    int *hint;    /* M x M: where the scan of (m, mp) started in the last column */
    double *cdiv; /* M x M: ceil((M - (m+1)) / mp), copies of a stash */
    double *cfeas; /* M: the largest C[j] of a feasible cell (i, j, m) so far */
} row_buf;

static inline cell *at(const row_buf *r, int M, int j, int m) { return &r->c[(size_t)j * M + m]; }

static inline void put(row_buf *r, int M, int j, int m, const cell *c) {
    size_t q = (size_t)j * M + m;
    r->c[q] = *c;
    r->time[q] = c->time;
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
    /* The level below (NULL at level 1): the time of states (i..j] on all
    ** its machines at below_time[j * (N + 1) + i], by column, as the last
    ** stages of one column are read together. */
    const double *below_time;
    int M;
    double b;       /* bandwidth */
    double w;       /* machines of the previous level; 1 at level 1 */
    double below;   /* machines under one machine of this level, all levels */
    double memsize; /* NAN: no memory constraint */
    double acr;     /* 0: no activation compression */
    bool straight, fewer;
    /* Cumulative compute, activations and parameters never decrease over
    ** the states (chains, most profiles): then predecessors in descending C
    ** are in descending state, and a last stage's stash grows as its split
    ** point moves back. */
    bool monotone;
    /* With the memory constraint on other profiles: per block of 2^SBLOCK
    ** of pred[j], the largest A[k] + P[k], at smax[soff[j] + block]. */
    const double *smax;
    const size_t *soff;
} level_ctx;

#define SBLOCK 4

/* Compute time of states (i..j] at this level. */
static inline double level_time(const level_ctx *x, int i, int j) {
    if (!x->below_time)
        return range(x->st->compute, i, j);
    if (j < i)
        return NAN;
    double t = x->below_time[(size_t)j * (x->st->n + 1) + i];
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

/* Lower bounds. Any plan for states (i..k] on d machines of the lowest
** level takes at least raw(i..k) / d, raw being the difference of the
** cumulative compute times: the stage times of a plan add up to raw (the
** differences telescope), a stage on r machines takes at least its time / r,
** and max(t_s / r_s) >= sum(t_s) / sum(r_s). Transfers, communication and
** memory limits only add. (A negative raw, a range that is not a contiguous
** part of the DAG, bounds nothing, and is never pruned.) */

/* The last stage (k+1..j) on mp machines: its time (*raw without the
** transfer bounds of activation compression, which count only towards the
** stage's time, not its balance). */
static inline double last_stage(const level_ctx *x, int k, int j, int mp, double *raw) {
    const rp_states *st = x->st;
    double tl = level_time(x, k + 1, j);
    double lpar = range(st->parameter, k + 1, j);
    double l = tl + (4.0 * (mp - 1) * lpar) / (x->b * mp);
    l = isnan(tl) ? INFINITY : l / mp;
    *raw = l;
    if (x->acr > 0) {
        double in = (2.0 * st->out_activation[k]) / (x->b * mp) / x->acr;
        if (in > l)
            l = in;
        if (j < st->n - 1) {
            double out = (2.0 * st->out_activation[j]) / (x->b * mp) / x->acr;
            if (out > l)
                l = out;
        }
    }
    return l;
}

/* The first q with C[pred[q]] <= v, pred being ordered by descending C:
** galloping from the guess h, since a column's answer lies near the last
** column's (a state's predecessors are mostly its predecessor's and one
** more, first in the order). */
static int first_at_most(const double *C, const int *pred, int np, double v, int h) {
    int lo, hi; /* the answer lies in [lo, hi] */
    if (h > np)
        h = np;
    if (h < np && C[pred[h]] > v) {
        int step = 1;
        lo = h + 1;
        while (lo + step - 1 < np && C[pred[lo + step - 1]] > v) {
            lo += step;
            step *= 2;
        }
        hi = lo + step - 1 < np ? lo + step - 1 : np;
    } else {
        int step = 1;
        hi = h;
        while (hi - step >= 0 && C[pred[hi - step]] <= v) {
            hi -= step;
            step *= 2;
        }
        lo = hi - step + 1 > 0 ? hi - step + 1 : 0;
    }
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (C[pred[mid]] > v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Solves row i of a level into r.
**
** Cell (i, j, m) needs cells of columns k < j and (i, j, m-1). For each
** machine count mp of the last stage, split points are scanned outwards
** from where the lower bounds of prefix and last stage balance (the best
** split if both took exactly their bound): the bound on the cell tightens
** at once, and each side stops at its first candidate whose prefix, or last
** stage, alone is bounded above the best so far. pred[j] lists the split
** points by descending cumulative compute, so both sides are monotone in
** their bound. The order of visits does not change the result: ties are
** decided by better() and split_better(). */
static void solve_row(const level_ctx *x, int i, row_buf *r) {
    int *hint = r->hint;
    const double *cdiv = r->cdiv;
    const rp_states *st = x->st;
    int N = st->n, M = x->M;
    bool mem = !isnan(x->memsize);
    const cell none = {INFINITY, 0, -1, 0, 0, 0};
    /* Slack for rounding between a lower bound and the time it bounds. */
    double margin = 1e-9 * fabs(st->compute[N - 1]);
    double cbase = i > 0 ? st->compute[i - 1] : 0;
    double smargin = 1e-9 * (fabs(st->activation[N - 1]) + fabs(st->parameter[N - 1]));
    for (int q = 0; q < M * M; q++)
        hint[q] = 0;
    for (int m = 0; m < M; m++)
        r->cfeas[m] = -INFINITY;
    for (int m = 0; m < M; m++)
        for (int mp = 1; mp < M; mp++)
            r->cdiv[m * M + mp] = ceil_div(M - (m + 1), mp);
    for (int j = i; j < N; j++) {
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
            put(r, M, j, m, &c);
            if (!isinf(c.time) && st->compute[j] > r->cfeas[m])
                r->cfeas[m] = st->compute[j];
        }
        if (j == i)
            continue;
        /* Splits after a predecessor k >= i of j (the prefix cell exists
        ** only from i on; PipeDream's "not a predecessor of i-1"). */
        const int *pred = st->pred[j];
        int np = st->num_pred[j];
        double cj = st->compute[j];
        for (int m = 1; m < M; m++) {
            cell c = *at(r, M, j, m);
            if (x->fewer && better(at(r, M, j, m - 1), &c))
                c = *at(r, M, j, m - 1);
            cell split = none;
            double bound = c.time; /* a split slower than this cannot win */
            int mps = x->straight ? 1 : m;
            for (int mp = 1; mp <= mps; mp++) {
                double dpre = (double)(m - mp + 1) * x->below;
                double dlast = (double)mp * x->below;
                double cmid = (cbase * dlast + cj * dpre) / (dpre + dlast);
                int *h = &hint[m * M + mp];
                int lo = first_at_most(st->compute, pred, np, cmid, *h);
                *h = lo + 1;
                /* from lo up: smaller prefixes and larger last stages,
                ** down to the first whose last stage is bounded above the
                ** bound; from lo - 1 down: the other way, up to the first
                ** whose prefix is (the bounds, solved for C[k]) */
                double cfloor = cj - (bound + margin) * dlast;
                double cceil = cbase + (bound + margin) * dpre;
                /* a split point k fits in memory only if A[k] + P[k] >= sneed */
                double sneed = -INFINITY;
                if (x->smax && cdiv[m * M + mp] > 0)
                    sneed = st->activation[j] + st->parameter[j] -
                            x->memsize / cdiv[m * M + mp] - smargin;
                for (int side = 0; side < 2; side++) {
                    int step = side ? -1 : 1;
                    for (int q = side ? lo - 1 : lo; q >= 0 && q < np; q += step) {
                        int k = pred[q];
                        double ck = st->compute[k];
                        if (side ? ck > cceil : ck < cfloor)
                            break;
                        /* larger prefixes from here on: none is feasible past
                        ** the largest C of a feasible one */
                        if (side && ck > r->cfeas[m - mp])
                            break;
                        if (k < i)
                            continue;
                        double pre = r->time[(size_t)k * M + m - mp];
                        if (pre > bound)
                            continue;
                        if (mem && (range(st->activation, k + 1, j) +
                                    range(st->parameter, k + 1, j)) *
                                           cdiv[m * M + mp] >
                                       x->memsize) {
                            if (!side && x->monotone)
                                break;
                            /* skip the rest of a block whose every stash is
                            ** too large */
                            if (x->smax && x->smax[x->soff[j] + (q >> SBLOCK)] < sneed)
                                q = side ? q & ~((1 << SBLOCK) - 1)
                                         : q | ((1 << SBLOCK) - 1);
                            continue;
                        }
                        if (isinf(pre))
                            continue; /* infeasible: passed above while the bound is too */
                        double lr, l = last_stage(x, k, j, mp, &lr);
                        double pt = pre > l ? pre : l;
                        if (pt > bound)
                            continue;
                        const cell *prefix = at(r, M, k, m - mp);
                        cell cand = {pt, prefix->sumsq + lr * lr, k, m - mp, mp,
                                     prefix->stages + 1};
                        if (split_better(&cand, &split)) {
                            split = cand;
                            if (pt < bound) {
                                bound = pt;
                                cfloor = cj - (bound + margin) * dlast;
                                cceil = cbase + (bound + margin) * dpre;
                            }
                        }
                    }
                }
            }
            if (better(&split, &c))
                c = split;
            put(r, M, j, m, &c);
            if (!isinf(c.time) && cj > r->cfeas[m])
                r->cfeas[m] = cj;
        }
    }
}

static rp_status row_alloc(row_buf *r, int N, int M) {
    r->c = malloc(sizeof(cell) * (size_t)N * M);
    r->time = malloc(sizeof(double) * (size_t)N * M);
    r->hint = malloc(sizeof(int) * (size_t)M * M);
    r->cdiv = malloc(sizeof(double) * (size_t)M * M);
    r->cfeas = malloc(sizeof(double) * (size_t)M);
    return r->c && r->time && r->hint && r->cdiv && r->cfeas ? RP_OK : RP_ERR_NOMEM;
}

static void row_free(row_buf *r) {
    free(r->c), free(r->time), free(r->hint), free(r->cdiv), free(r->cfeas);
}

typedef struct solver {
    const level_ctx *x;
    double *out;     /* the level's times on all its machines, by column */
    const int *rows; /* the rows to solve; NULL: all */
    int nrows;
    int first, step; /* this worker's: first, first + step, ... of them */
    rp_status status;
} solver;

static void *solve_rows(void *arg) {
    solver *sv = arg;
    const level_ctx *x = sv->x;
    int N = x->st->n, M = x->M;
    row_buf r;
    if (row_alloc(&r, N, M)) {
        row_free(&r);
        sv->status = RP_ERR_NOMEM;
        return NULL;
    }
    for (int q = sv->first; q < sv->nrows; q += sv->step) {
        int i = sv->rows ? sv->rows[q] : q;
        solve_row(x, i, &r);
        for (int j = i; j < N; j++)
            sv->out[(size_t)j * (N + 1) + i] = r.time[(size_t)j * M + M - 1];
    }
    row_free(&r);
    sv->status = RP_OK;
    return NULL;
}

/* Solves rows of a level below the top into out (all N when rows is NULL),
** over up to `threads` workers, interleaved: rows further down are
** shorter. */
static rp_status solve_level(const level_ctx *x, double *out, const int *rows, int nrows,
                             int threads, rp_error *err) {
    if (threads > 16)
        threads = 16;
    if (threads > nrows)
        threads = nrows;
    if (threads < 1)
        threads = 1;
    solver sv[16];
    pthread_t tid[16];
    int started = 1;
    for (int w = 0; w < threads; w++)
        sv[w] = (solver){x, out, rows, nrows, w, threads, RP_OK};
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

/* The level below the top, bounded.
**
** The top level reads row i of the level below (states after i-1) only for
** stages that start after a split point k = i-1 of its own. A plan of the
** top level no slower than u with such a split, c of the top's M machines
** before it and at most M - c after it, has C[k] <= u * c * D and
** C[N-1] - C[k] <= u * (M - c) * D, D machines under each of the top's, by
** the lower bounds above (which need every range's compute to be
** non-negative: C non-decreasing over the states, level_ctx.monotone).
** Other rows can only serve plans slower than u; they are left
** infinite, and the top level's best plan, and every cell it is built from,
** come out as if they had been solved.
**
** u is the time of the plan the top level finds when only row 0 and, for
** each c, the row after the state nearest to a c / M share of the compute
** are solved: a feasible plan, often close to the best. */

/* The states whose rows a plan no slower than u can use, ascending, after
** row 0; their number. */
static int useful_rows(const rp_states *st, int Mt, double D, double u, double margin,
                       int *rows) {
    int n = 0, N = st->n;
    double total = st->compute[N - 1], ub = u + margin;
    rows[n++] = 0;
    for (int i = 1; i < N; i++) {
        double ck = st->compute[i - 1];
        for (int c = 1; c < Mt; c++)
            if (ck <= ub * c * D && total - ck <= ub * (Mt - c) * D) {
                rows[n++] = i;
                break;
            }
    }
    return n;
}

/* level_ctx.smax and soff, for predecessors in scan order. */
static rp_status stash_blocks(const rp_states *st, double **smax, size_t **soff,
                              rp_error *err) {
    size_t n = 0;
    *soff = malloc(sizeof(size_t) * st->n);
    if (*soff)
        for (int j = 0; j < st->n; j++) {
            (*soff)[j] = n;
            n += ((size_t)st->num_pred[j] >> SBLOCK) + 1;
        }
    *smax = *soff ? malloc(sizeof(double) * n) : NULL;
    if (!*smax)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    for (int j = 0; j < st->n; j++)
        for (int q = 0; q < st->num_pred[j]; q++) {
            int k = st->pred[j][q];
            double v = st->activation[k] + st->parameter[k];
            double *b = &(*smax)[(*soff)[j] + (q >> SBLOCK)];
            if ((q & ((1 << SBLOCK) - 1)) == 0 || v > *b)
                *b = v;
        }
    return RP_OK;
}

static bool monotone(const rp_states *st) {
    for (int j = 1; j < st->n; j++)
        if (!(st->compute[j] >= st->compute[j - 1] &&
              st->activation[j] >= st->activation[j - 1] &&
              st->parameter[j] >= st->parameter[j - 1]))
            return false;
    return st->compute[0] >= 0 && st->activation[0] >= 0 && st->parameter[0] >= 0;
}

/* Fills out (all infinite first) with the rows the top level can use, and
** solves the top level's row into top_row. */
static rp_status solve_below_top(const level_ctx *x, const level_ctx *top, double *out,
                                 row_buf *top_row, bool all_rows, int threads, int *solved,
                                 rp_error *err) {
    const rp_states *st = x->st;
    int N = st->n, Mt = top->M;
    size_t cells = (size_t)(N + 1) * N;
    rp_status s;
    *solved = N;
    if (all_rows || Mt < 2 || !x->monotone) {
        if ((s = solve_level(x, out, NULL, N, N > 64 ? threads : 1, err)))
            return s;
        solve_row(top, 0, top_row);
        return RP_OK;
    }
    for (size_t q = 0; q < cells; q++)
        out[q] = INFINITY;
    int *rows = malloc(sizeof(int) * N);
    unsigned char *done = calloc(N, 1);
    if (!rows || !done) {
        free(rows), free(done);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    /* A first plan: row 0 and a row at each c / M share of the compute. */
    int n = 0;
    double total = st->compute[N - 1];
    rows[n++] = 0;
    for (int c = 1; c < Mt; c++) {
        int k = 0;
        while (k + 1 < N && st->compute[k + 1] <= total * c / Mt)
            k++;
        if (k + 1 < N && !done[k + 1]) {
            done[k + 1] = 1;
            rows[n++] = k + 1;
        }
    }
    done[0] = 1;
    *solved = n;
    if ((s = solve_level(x, out, rows, n, threads, err)))
        goto out;
    solve_row(top, 0, top_row);
    double u = at(top_row, Mt, N - 1, Mt - 1)->time;
    /* Then every other row a plan no slower than it can use. */
    int m = isinf(u) ? 0 : useful_rows(st, Mt, top->below, u, 1e-9 * fabs(total), rows);
    if (isinf(u))
        for (int i = 0; i < N; i++)
            rows[m++] = i;
    n = 0;
    for (int q = 0; q < m; q++)
        if (!done[rows[q]])
            rows[n++] = rows[q];
    *solved += n;
    if (n > 0) {
        if ((s = solve_level(x, out, rows, n, n > 16 ? threads : 1, err)))
            goto out;
        solve_row(top, 0, top_row);
    }
out:
    free(rows), free(done);
    return s;
}

void rp_plan_free(rp_plan *p) {
    if (!p)
        return;
    for (int l = 0; l < p->num_levels; l++)
        free(p->levels[l].stages);
    free(p->levels), free(p->stage_num_ranks), free(p->worker_stage), free(p->node_stage);
    free(p);
}

/* Follows the split chain of cell (start, end-1, M-1) in row `start` and
** appends the stages of range [start, end) to lvl. */
static rp_status analyze(const row_buf *r, int M, const rp_states *st, int start, int end,
                         int parent, rp_plan_level *lvl, rp_error *err) {
    int splits[1024], reps[1024], n = 0;
    const cell *c = at(r, M, end - 1, M - 1);
    if (isinf(c->time))
        return rp_fail(err, RP_ERR_INFEASIBLE, "no stage layout fits");
    while (c->k >= 0) {
        if (n == 1023)
            return rp_fail(err, RP_ERR_INVALID, "a level has more than 1023 stages");
        splits[n] = c->k + 1;
        reps[n++] = c->nmach;
        c = at(r, M, c->k, c->mrest);
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

/* Fails, with the figure, when what planning N states of a profile of
** `nodes` nodes holds at once cannot fit in the memory this process has
** left: before allocating it, rather than after minutes of swapping or a
** kill. It holds the states' predecessor lists (N^2 / 2 on a chain),
** bitsets of transitive predecessors and successors of nodes and states,
** the tables of the levels below the top (a time per range) and the
** workers' rows. */
static rp_status fits(int N, int nodes, const rp_plan_options *o, int threads,
                      const char *what, rp_error *err) {
    int L = o->num_levels, most = 1;
    double need = (double)N * N / 2 * sizeof(int);
    need += (2.0 * nodes * nodes + (double)N * N + (double)N * nodes) / 8;
    for (int l = 0; l < L; l++) {
        if (l < L - 1)
            need += (double)(N + 1) * N * sizeof(double);
        if (o->machines[l] > most)
            most = o->machines[l];
    }
    need += (double)(threads + 1) * N * most * (sizeof(cell) + sizeof(double));
    if (need < 256e6)
        return RP_OK; /* small: not worth reading /proc for */
    double avail = rp_memory_available();
    if (need > avail)
        return rp_fail(err, RP_ERR_NOMEM,
                       "planning %d %s on these machines needs %.1f GB, more than the %.1f GB "
                       "of memory available: use a coarser profile%s",
                       N, what, need / 1e9, avail / 1e9, L > 1 ? ", or fewer levels" : "");
    return RP_OK;
}

/* RP_PLAN_MAX_STATES, or 16 states a node when that is more */
static int states_cap(const rp_profile *p) {
    return p->num_nodes > RP_PLAN_MAX_STATES / 16 ? 16 * p->num_nodes : RP_PLAN_MAX_STATES;
}

rp_status rp_plan_compute(const rp_profile *profile, const rp_plan_options *o, rp_plan **out,
                          rp_error *err) {
    *out = NULL;
    rp_status s = check_options(o, err);
    if (s)
        return s;
    int L = o->num_levels;
    int threads = o->threads > 0 ? (o->threads > 16 ? 16 : o->threads) : 2;
    /* a profile has at least as many states as nodes after its input (on
    ** PipeDream's profiles, up to 15 times as many): refuse before
    ** building them */
    if ((s = fits(profile->num_nodes - 1, profile->num_nodes, o, threads, "nodes", err)))
        return s;
    rp_states st;
    rp_profile *compressed = NULL;
    int *member = NULL;
    const rp_profile *work = profile;
    if ((s = rp_states_build(profile, states_cap(profile), &st, err)) == RP_ERR_INFEASIBLE) {
        /* too many antichains: PipeDream's README compresses the branches by
        ** hand; this is that compression, and the plan of its graph */
        rp_error more;
        member = malloc(sizeof(int) * (profile->num_nodes ? profile->num_nodes : 1));
        if (!member)
            return rp_fail(err, RP_ERR_NOMEM, "out of memory");
        if ((s = rpi_profile_compress_branches(profile, &compressed, member, err))) {
            free(member);
            return s;
        }
        s = rp_states_build(compressed, states_cap(compressed), &st, &more);
        if (s == RP_ERR_INFEASIBLE)
            rp_fail(err, s,
                    "its antichain DAG has more than %d states (the branches of a fork "
                    "multiply them), and more than %d with PipeDream's branch compression "
                    "(every chain from a fork to a join as one node: %d nodes to %d); "
                    "PipeDream's optimizer would not finish either. Profile coarser layers "
                    "(one node per block or cell), or make the graph's branches shorter",
                    states_cap(profile), states_cap(compressed), profile->num_nodes,
                    compressed->num_nodes);
        else if (s)
            *err = more;
        work = compressed;
    }
    if (s) {
        rp_profile_free(compressed);
        free(member);
        return s;
    }
    int N = st.n;
    double *below_time[RP_PLAN_MAX_LEVELS] = {NULL};
    double *smax = NULL;
    size_t *soff = NULL;
    level_ctx ctx[RP_PLAN_MAX_LEVELS];
    row_buf row = {0};
    rp_plan *p = calloc(1, sizeof *p);
    if (!p) {
        rp_states_free(&st);
        rp_profile_free(compressed);
        free(member);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    p->options = *o;
    p->compressed_nodes = compressed ? compressed->num_nodes : 0;
    p->num_states = N;
    if ((s = fits(N, work->num_nodes, o, threads, "states", err)))
        goto done;
    int most = 1; /* the row is solved again on every level */
    for (int l = 0; l < L; l++)
        if (o->machines[l] > most)
            most = o->machines[l];
    if (row_alloc(&row, N, most)) {
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* Levels from the innermost out; each reads the times of the one below. */
    bool mono = monotone(&st);
    if (o->memory_constraint && !mono && (s = stash_blocks(&st, &smax, &soff, err)))
        goto done;
    double below = 1;
    for (int l = 0; l < L; l++) {
        if (l)
            below *= o->machines[l - 1];
        if (l < L - 1 && !(below_time[l] = malloc(sizeof(double) * (size_t)(N + 1) * N))) {
            s = rp_fail(err, RP_ERR_NOMEM,
                        "out of memory: level %d needs a table of %d x %d times", l + 1, N + 1,
                        N);
            goto done;
        }
        ctx[l] = (level_ctx){&st,
                             l ? below_time[l - 1] : NULL,
                             o->machines[l],
                             o->bandwidth[l],
                             l ? o->machines[l - 1] : 1,
                             below,
                             o->memory_constraint ? o->memory_size : NAN,
                             o->activation_compression,
                             o->straight,
                             o->fewer_machines,
                             mono,
                             smax,
                             soff};
    }
    for (int l = 0; l < L - 2 && !s; l++)
        s = solve_level(&ctx[l], below_time[l], NULL, N, N > 64 ? threads : 1, err);
    if (!s && L >= 2)
        s = solve_below_top(&ctx[L - 2], &ctx[L - 1], below_time[L - 2], &row, o->all_rows,
                            threads, &p->rows_solved, err);
    else if (!s) {
        solve_row(&ctx[0], 0, &row); /* the top level has one row */
        p->rows_solved = N;
    }
    if (s)
        goto done;
    const cell *top = at(&row, o->machines[L - 1], N - 1, o->machines[L - 1] - 1);
    if (isinf(top->time) && !o->memory_constraint) {
        /* with no memory limit only a straight pipeline can fail: it needs
        ** a state for every machine */
        int total = 1;
        for (int l = 0; l < L; l++)
            total *= o->machines[l];
        s = rp_fail(err, RP_ERR_INFEASIBLE,
                    "no plan fits: --straight gives each of the %d machines a stage of its own, "
                    "and the profile has %d states%s",
                    total, N, o->fewer_machines ? "" : " (fewer --machines, or --fewer-machines)");
        goto done;
    }
    if (isinf(top->time)) {
        s = rp_fail(err, RP_ERR_INFEASIBLE,
                    "no plan fits: every way of splitting %d states over these machines "
                    "exceeds the memory size of %.4g bytes per machine%s",
                    N, o->memory_size,
                    o->fewer_machines ? "" : " (--fewer-machines may help)");
        goto done;
    }
    double top_time = top->time;
    /* Unfold from the top level down, solving again the row of every stage
    ** of the level above. */
    p->num_levels = L;
    p->levels = calloc(L, sizeof(rp_plan_level));
    if (!p->levels) {
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int li = 0; li < L; li++) {
        int l = L - 1 - li; /* index into options and contexts */
        int M = o->machines[l];
        rp_plan_level *lvl = &p->levels[li];
        lvl->level = l + 1;
        lvl->machines = M;
        lvl->bandwidth = o->bandwidth[l];
        lvl->stages = calloc(N, sizeof(rp_plan_stage));
        if (!lvl->stages) {
            s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (li == 0) {
            s = analyze(&row, M, &st, 0, N, -1, lvl, err);
        } else {
            const rp_plan_level *up = &p->levels[li - 1];
            for (int k = 0; k < up->num_stages && !s; k++) {
                solve_row(&ctx[l], up->stages[k].start, &row);
                s = analyze(&row, M, &st, up->stages[k].start, up->stages[k].end, k, lvl,
                            err);
            }
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
    p->pipeline_time = top_time;
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
    ** no earlier stage took; Input sources go to stage 0. A compressed
    ** graph's node stands for its branch's nodes. */
    int *stage = compressed ? malloc(sizeof(int) * (work->num_nodes ? work->num_nodes : 1))
                            : p->node_stage;
    if (!stage) {
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < work->num_nodes; i++)
        stage[i] = st.input_source[i] ? 0 : -1;
    for (int k = 0; k < bottom->num_stages; k++) {
        const uint64_t *cov = st.covers + (size_t)(bottom->stages[k].end - 1) * st.nwords;
        for (int i = 0; i < work->num_nodes; i++)
            if (stage[i] < 0 && ((cov[i >> 6] >> (i & 63)) & 1))
                stage[i] = k;
    }
    if (compressed) {
        for (int i = 0; i < profile->num_nodes; i++)
            p->node_stage[i] = member[i] >= 0 ? stage[member[i]] : -1;
        free(stage);
    }
done:
    for (int l = 0; l < L; l++)
        free(below_time[l]);
    row_free(&row);
    free(smax), free(soff);
    rp_states_free(&st);
    rp_profile_free(compressed);
    free(member);
    if (s) {
        rp_plan_free(p);
        return s;
    }
    *out = p;
    return RP_OK;
}
