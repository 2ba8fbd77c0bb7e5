/*
** The planner: PipeDream's hierarchical optimizer over a profile's
** antichain DAG. It checks the options and that the tables fit in memory,
** builds the states (compressing wide branches as PipeDream's README has
** users do by hand), runs the dynamic programme of dp.c level by level from
** the innermost out, then unfolds the plan from the top down into stages,
** workers (replica-major) and the stage of every profile node.
*/
#include "repipe/planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/util.h"
#include "antichain.h"
#include "dp.h"

size_t rp_plan_options_size(void) { return sizeof(rp_plan_options); }

void rp_plan_options_default(rp_plan_options *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < RP_PLAN_MAX_LEVELS; i++)
        o->bandwidth[i] = 1e9;
    o->memory_size = 16e9;
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

/* What planning holds from the states to the plan (planning_free frees it). */
typedef struct planning {
    const rp_plan_options *o;
    int threads;
    rp_states st;
    bool built;             /* st holds states */
    rp_profile *compressed; /* the branch-compressed graph, when the profile's was too wide */
    int *member;            /* each node's compressed node */
    const rp_profile *work; /* the graph planned: the profile's or the compressed one */
    double *below_time[RP_PLAN_MAX_LEVELS];
    double *smax;
    size_t *soff;
    level_ctx ctx[RP_PLAN_MAX_LEVELS];
    row_buf row;
} planning;

static void planning_free(planning *g) {
    for (int l = 0; l < g->o->num_levels; l++)
        free(g->below_time[l]);
    rpi_dp_row_free(&g->row);
    free(g->smax), free(g->soff);
    if (g->built)
        rp_states_free(&g->st);
    rp_profile_free(g->compressed);
    free(g->member);
}

/* The profile's states; where its antichains are too many, those of its
** graph with the branches compressed (PipeDream's README compresses them
** by hand; this is that compression). */
static rp_status build_states(planning *g, const rp_profile *profile, rp_error *err) {
    g->work = profile;
    rp_status s = rp_states_build(profile, states_cap(profile), &g->st, err);
    if (s != RP_ERR_INFEASIBLE) {
        g->built = !s;
        return s;
    }
    rp_error more;
    g->member = malloc(sizeof(int) * (profile->num_nodes ? profile->num_nodes : 1));
    if (!g->member)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    if ((s = rpi_profile_compress_branches(profile, &g->compressed, g->member, err)))
        return s;
    g->work = g->compressed;
    s = rp_states_build(g->compressed, states_cap(g->compressed), &g->st, &more);
    g->built = !s;
    if (s == RP_ERR_INFEASIBLE)
        return rp_fail(err, s,
                       "its antichain DAG has more than %d states (the branches of a fork "
                       "multiply them), and more than %d with PipeDream's branch compression "
                       "(every chain from a fork to a join as one node: %d nodes to %d); "
                       "PipeDream's optimizer would not finish either. Profile coarser layers "
                       "(one node per block or cell), or make the graph's branches shorter",
                       states_cap(profile), states_cap(g->compressed), profile->num_nodes,
                       g->compressed->num_nodes);
    if (s)
        *err = more;
    return s;
}

/* Why no plan of N states fits: with no memory limit only a straight
** pipeline can fail (it needs a state for every machine); else the memory. */
static rp_status no_fit(const rp_plan_options *o, int N, rp_error *err) {
    if (!o->memory_constraint) {
        int total = 1;
        for (int l = 0; l < o->num_levels; l++)
            total *= o->machines[l];
        return rp_fail(err, RP_ERR_INFEASIBLE,
                       "no plan fits: --straight gives each of the %d machines a stage of its "
                       "own, and the profile has %d states%s", total, N,
                       o->fewer_machines ? "" : " (fewer --machines, or --fewer-machines)");
    }
    return rp_fail(err, RP_ERR_INFEASIBLE,
                   "no plan fits: every way of splitting %d states over these machines "
                   "exceeds the memory size of %.4g bytes per machine%s",
                   N, o->memory_size, o->fewer_machines ? "" : " (--fewer-machines may help)");
}

/* The levels' tables from the innermost out, each reading the times of the
** one below, to the top level's row; the best time in *top_time. */
static rp_status solve_levels(planning *g, rp_plan *p, double *top_time, rp_error *err) {
    const rp_plan_options *o = g->o;
    int L = o->num_levels, N = g->st.n, most = 1; /* the row is solved again on every level */
    for (int l = 0; l < L; l++)
        most = o->machines[l] > most ? o->machines[l] : most;
    if (rpi_dp_row_alloc(&g->row, N, most))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    bool mono = rpi_dp_monotone(&g->st);
    rp_status s;
    if (o->memory_constraint && !mono && (s = rpi_dp_stash_blocks(&g->st, &g->smax, &g->soff, err)))
        return s;
    double below = 1;
    for (int l = 0; l < L; l++) {
        if (l)
            below *= o->machines[l - 1];
        if (l < L - 1 && !(g->below_time[l] = malloc(sizeof(double) * (size_t)(N + 1) * N)))
            return rp_fail(err, RP_ERR_NOMEM,
                           "out of memory: level %d needs a table of %d x %d times", l + 1,
                           N + 1, N);
        g->ctx[l] = (level_ctx){&g->st,
                                l ? g->below_time[l - 1] : NULL,
                                o->machines[l],
                                o->bandwidth[l],
                                l ? o->machines[l - 1] : 1,
                                below,
                                o->memory_constraint ? o->memory_size : NAN,
                                o->activation_compression,
                                o->straight,
                                o->fewer_machines,
                                mono,
                                g->smax,
                                g->soff};
    }
    s = RP_OK;
    for (int l = 0; l < L - 2 && !s; l++)
        s = rpi_dp_solve_level(&g->ctx[l], g->below_time[l], NULL, N, N > 64 ? g->threads : 1,
                               err);
    if (!s && L >= 2)
        s = rpi_dp_solve_below_top(&g->ctx[L - 2], &g->ctx[L - 1], g->below_time[L - 2],
                                   &g->row, o->all_rows, g->threads, &p->rows_solved, err);
    else if (!s) {
        rpi_dp_solve_row(&g->ctx[0], 0, &g->row); /* the top level has one row */
        p->rows_solved = N;
    }
    if (s)
        return s;
    const cell *top = at(&g->row, o->machines[L - 1], N - 1, o->machines[L - 1] - 1);
    *top_time = top->time;
    return isinf(top->time) ? no_fit(o, N, err) : RP_OK;
}

/* The plan's levels, unfolded from the top level down, solving again the
** row of every stage of the level above. */
static rp_status unfold(planning *g, rp_plan *p, rp_error *err) {
    const rp_plan_options *o = g->o;
    int L = o->num_levels, N = g->st.n;
    p->num_levels = L;
    p->levels = calloc(L, sizeof(rp_plan_level));
    if (!p->levels)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    for (int li = 0; li < L; li++) {
        int l = L - 1 - li; /* index into options and contexts */
        int M = o->machines[l];
        rp_plan_level *lvl = &p->levels[li];
        lvl->level = l + 1;
        lvl->machines = M;
        lvl->bandwidth = o->bandwidth[l];
        lvl->stages = calloc(N, sizeof(rp_plan_stage));
        if (!lvl->stages)
            return rp_fail(err, RP_ERR_NOMEM, "out of memory");
        rp_status s = RP_OK;
        if (li == 0) {
            s = analyze(&g->row, M, &g->st, 0, N, -1, lvl, err);
        } else {
            const rp_plan_level *up = &p->levels[li - 1];
            for (int k = 0; k < up->num_stages && !s; k++) {
                rpi_dp_solve_row(&g->ctx[l], up->stages[k].start, &g->row);
                s = analyze(&g->row, M, &g->st, up->stages[k].start, up->stages[k].end, k, lvl,
                            err);
            }
        }
        if (s)
            return s;
    }
    return RP_OK;
}

/* The plan's times and speed-ups beside one stage and data parallelism. */
static void times(const planning *g, rp_plan *p, double top_time) {
    const rp_plan_options *o = g->o;
    int N = g->st.n;
    p->single_stage_time = g->st.compute[N - 1];
    double total_par = g->st.parameter[N - 1], dp = p->single_stage_time, w = 1;
    for (int l = 0; l < o->num_levels; l++) {
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
    for (int l = 0; l < o->num_levels; l++)
        p->machines_available *= o->machines[l];
}

/* The workers, replica-major, and each node's stage: each final stage
** takes the nodes covered by its last state that no earlier stage took;
** Input sources go to stage 0. A compressed graph's node stands for its
** branch's nodes. */
static rp_status workers_and_nodes(const planning *g, rp_plan *p, const rp_profile *profile,
                                   rp_error *err) {
    const rp_plan_level *bottom = &p->levels[p->num_levels - 1];
    const rp_profile *work = g->work;
    p->num_stages = bottom->num_stages;
    p->worker_stage = malloc(sizeof(int) * p->machines_available);
    p->stage_num_ranks = calloc(p->num_stages, sizeof(int));
    p->num_nodes = profile->num_nodes;
    p->node_stage = malloc(sizeof(int) * (profile->num_nodes ? profile->num_nodes : 1));
    if (!p->worker_stage || !p->stage_num_ranks || !p->node_stage)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < p->levels[0].num_stages; k++)
        emit_workers(p, 0, k);
    for (int r = 0; r < p->num_workers; r++)
        p->stage_num_ranks[p->worker_stage[r]]++;
    p->machines_used = p->num_workers;
    int *stage = g->compressed ? malloc(sizeof(int) * (work->num_nodes ? work->num_nodes : 1))
                               : p->node_stage;
    if (!stage)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < work->num_nodes; i++)
        stage[i] = g->st.input_source[i] ? 0 : -1;
    for (int k = 0; k < bottom->num_stages; k++) {
        const uint64_t *cov = g->st.covers + (size_t)(bottom->stages[k].end - 1) * g->st.nwords;
        for (int i = 0; i < work->num_nodes; i++)
            if (stage[i] < 0 && ((cov[i >> 6] >> (i & 63)) & 1))
                stage[i] = k;
    }
    if (g->compressed) {
        for (int i = 0; i < profile->num_nodes; i++)
            p->node_stage[i] = g->member[i] >= 0 ? stage[g->member[i]] : -1;
        free(stage);
    }
    return RP_OK;
}

/* PipeDream's optimizer, in the steps above: the options checked, the
** states built (compressed where too many) and their memory checked, the
** levels solved, the plan unfolded, its times, workers and nodes. */
rp_status rp_plan_compute(const rp_profile *profile, const rp_plan_options *o, rp_plan **out,
                          rp_error *err) {
    *out = NULL;
    rp_status s = check_options(o, err);
    if (s)
        return s;
    planning g = {.o = o, .threads = o->threads > 0 ? (o->threads > 16 ? 16 : o->threads) : 2};
    /* a profile has at least as many states as nodes after its input (on
    ** PipeDream's profiles, up to 15 times as many): refuse before
    ** building them */
    if ((s = fits(profile->num_nodes - 1, profile->num_nodes, o, g.threads, "nodes", err)))
        return s;
    rp_plan *p = NULL;
    double top_time = 0;
    s = build_states(&g, profile, err);
    if (!s && !(p = calloc(1, sizeof *p)))
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
    if (!s) {
        p->options = *o;
        p->compressed_nodes = g.compressed ? g.compressed->num_nodes : 0;
        p->num_states = g.st.n;
        s = fits(g.st.n, g.work->num_nodes, o, g.threads, "states", err);
    }
    if (!s)
        s = solve_levels(&g, p, &top_time, err);
    if (!s)
        s = unfold(&g, p, err);
    if (!s) {
        times(&g, p, top_time);
        s = workers_and_nodes(&g, p, profile, err);
    }
    planning_free(&g);
    if (s) {
        rp_plan_free(p);
        return s;
    }
    *out = p;
    return RP_OK;
}
