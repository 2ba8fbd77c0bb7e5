/*
** The planner's dynamic programme (dp.c), for planner.c: the table of a
** level, one row at a time, and the levels below the top.
*/
#ifndef REPIPE_PLAN_DP_H
#define REPIPE_PLAN_DP_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>

#include "antichain.h"

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
    int n;   /* states */
    cell *c;
    double *time; /* by machine count: (i, j, m) at time[m * n + j], as a scan
                  ** of split points k reads one machine count */
    int *hint;    /* M x M: where the scan of (m, mp) started in the last column */
    double *cdiv; /* M x M: ceil((M - (m+1)) / mp), copies of a stash */
    double *cfeas; /* M: the largest C[j] of a feasible cell (i, j, m) so far */
} row_buf;

static inline cell *at(const row_buf *r, int M, int j, int m) { return &r->c[(size_t)j * M + m]; }

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

/* Fills row i of level x: cells (i, j, m) for every j >= i and m. */
void rpi_dp_solve_row(const level_ctx *x, int i, row_buf *r);
rp_status rpi_dp_row_alloc(row_buf *r, int N, int M);
void rpi_dp_row_free(row_buf *r);

/* Solves rows of a level below the top into out, by column: the time of
** states (i..j] on all its machines at out[j * (N + 1) + i] (all N rows
** when rows is NULL), over up to `threads` workers. */
rp_status rpi_dp_solve_level(const level_ctx *x, double *out, const int *rows, int nrows,
                             int threads, rp_error *err);

/* The level below the top, only the rows a best plan of the top can use
** (all when all_rows, or when the states are not monotone); then the top's
** row 0 into top_row. *solved receives the rows solved. */
rp_status rpi_dp_solve_below_top(const level_ctx *x, const level_ctx *top, double *out,
                                 row_buf *top_row, bool all_rows, int threads, int *solved,
                                 rp_error *err);

/* level_ctx.smax and soff, for the memory constraint on states that are
** not monotone. */
rp_status rpi_dp_stash_blocks(const rp_states *st, double **smax, size_t **soff,
                              rp_error *err);

/* Whether cumulative compute, activations and parameters never decrease
** over the states (level_ctx.monotone). */
bool rpi_dp_monotone(const rp_states *st);

#endif /* REPIPE_PLAN_DP_H */
