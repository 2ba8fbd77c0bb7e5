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
#include "dp.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/util.h"

static inline void put(row_buf *r, int M, int j, int m, const cell *c) {
    r->c[(size_t)j * M + m] = *c;
    r->time[(size_t)m * r->n + j] = c->time;
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
void rpi_dp_solve_row(const level_ctx *x, int i, row_buf *r) {
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
                        double pre = r->time[(size_t)(m - mp) * N + k];
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

rp_status rpi_dp_row_alloc(row_buf *r, int N, int M) {
    r->n = N;
    r->c = malloc(sizeof(cell) * (size_t)N * M);
    r->time = malloc(sizeof(double) * (size_t)N * M);
    r->hint = malloc(sizeof(int) * (size_t)M * M);
    r->cdiv = malloc(sizeof(double) * (size_t)M * M);
    r->cfeas = malloc(sizeof(double) * (size_t)M);
    return r->c && r->time && r->hint && r->cdiv && r->cfeas ? RP_OK : RP_ERR_NOMEM;
}

void rpi_dp_row_free(row_buf *r) {
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
    if (rpi_dp_row_alloc(&r, N, M)) {
        rpi_dp_row_free(&r);
        sv->status = RP_ERR_NOMEM;
        return NULL;
    }
    for (int q = sv->first; q < sv->nrows; q += sv->step) {
        int i = sv->rows ? sv->rows[q] : q;
        rpi_dp_solve_row(x, i, &r);
        for (int j = i; j < N; j++)
            sv->out[(size_t)j * (N + 1) + i] = r.time[(size_t)(M - 1) * N + j];
    }
    rpi_dp_row_free(&r);
    sv->status = RP_OK;
    return NULL;
}

/* Solves rows of a level below the top into out (all N when rows is NULL),
** over up to `threads` workers, interleaved: rows further down are
** shorter. */
rp_status rpi_dp_solve_level(const level_ctx *x, double *out, const int *rows, int nrows,
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
rp_status rpi_dp_stash_blocks(const rp_states *st, double **smax, size_t **soff,
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

bool rpi_dp_monotone(const rp_states *st) {
    for (int j = 1; j < st->n; j++)
        if (!(st->compute[j] >= st->compute[j - 1] &&
              st->activation[j] >= st->activation[j - 1] &&
              st->parameter[j] >= st->parameter[j - 1]))
            return false;
    return st->compute[0] >= 0 && st->activation[0] >= 0 && st->parameter[0] >= 0;
}

/* Fills out (all infinite first) with the rows the top level can use, and
** solves the top level's row into top_row. */
rp_status rpi_dp_solve_below_top(const level_ctx *x, const level_ctx *top, double *out,
                                 row_buf *top_row, bool all_rows, int threads, int *solved,
                                 rp_error *err) {
    const rp_states *st = x->st;
    int N = st->n, Mt = top->M;
    size_t cells = (size_t)(N + 1) * N;
    rp_status s;
    *solved = N;
    if (all_rows || Mt < 2 || !x->monotone) {
        if ((s = rpi_dp_solve_level(x, out, NULL, N, N > 64 ? threads : 1, err)))
            return s;
        rpi_dp_solve_row(top, 0, top_row);
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
    if ((s = rpi_dp_solve_level(x, out, rows, n, threads, err)))
        goto out;
    rpi_dp_solve_row(top, 0, top_row);
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
        if ((s = rpi_dp_solve_level(x, out, rows, n, n > 16 ? threads : 1, err)))
            goto out;
        rpi_dp_solve_row(top, 0, top_row);
    }
out:
    free(rows), free(done);
    return s;
}

