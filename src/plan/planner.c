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

#include "../core/util.h"
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
    if (rpi_dp_row_alloc(&row, N, most)) {
        s = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* Levels from the innermost out; each reads the times of the one below. */
    bool mono = rpi_dp_monotone(&st);
    if (o->memory_constraint && !mono && (s = rpi_dp_stash_blocks(&st, &smax, &soff, err)))
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
        s = rpi_dp_solve_level(&ctx[l], below_time[l], NULL, N, N > 64 ? threads : 1, err);
    if (!s && L >= 2)
        s = rpi_dp_solve_below_top(&ctx[L - 2], &ctx[L - 1], below_time[L - 2], &row, o->all_rows,
                            threads, &p->rows_solved, err);
    else if (!s) {
        rpi_dp_solve_row(&ctx[0], 0, &row); /* the top level has one row */
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
                rpi_dp_solve_row(&ctx[l], up->stages[k].start, &row);
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
    rpi_dp_row_free(&row);
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
