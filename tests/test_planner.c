/*
** Planner: the optimised dynamic programme against a plain transcription of
** the recurrence (docs/planner.md) on random profiles and every option, plus the
** antichain DAG of small graphs counted by hand, the rank layout, the
** infeasible cases, and PipeDream's branch compression against the file
** PipeDream's own code wrote.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/util.h"
#include "../src/plan/pipedream/antichain.h"
#include "repipe/planner.h"
#include "test.h"

#ifndef REPIPE_FIXTURES
#define REPIPE_FIXTURES "tests/fixtures/pipedream"
#endif

/* ---- a plain reference ---------------------------------------------------- */

typedef struct ref_cell {
    double t; /* INFINITY: infeasible */
    double sumsq;
    int k, mrest, nmach, stages;
} ref_cell;

static bool ref_pred(const rp_states *st, int j, int k) {
    for (int q = 0; q < st->num_pred[j]; q++)
        if (st->pred[j][q] == k)
            return true;
    return false;
}

static double ref_range(const double *cum, int i, int j) {
    if (i == 0)
        return cum[j];
    return j > i - 1 ? cum[j] - cum[i - 1] : NAN;
}

/* (time, stages, sum of squares): strictly smaller wins; equal keeps the
** earlier candidate. */
static bool ref_less(const ref_cell *a, const ref_cell *b) {
    if (isinf(a->t))
        return false;
    if (isinf(b->t))
        return true;
    if (a->t != b->t)
        return a->t < b->t;
    if (a->stages != b->stages)
        return a->stages < b->stages;
    return a->sumsq < b->sumsq;
}

/* One level, every cell in PipeDream's loop order: for each (i, j, m) the
** single stage, the cell with a machine fewer, then every split k in
** ascending order and m' ascending. */
static ref_cell *ref_level(const rp_states *st, const ref_cell *prev, int Mprev, int M, double b,
                           double w, const rp_plan_options *o, bool final) {
    int N = st->n, R = N + 1;
    ref_cell *A = malloc(sizeof(ref_cell) * (size_t)R * N * M);
#define A_(i, j, m) A[((size_t)(i)*N + (j)) * M + (m)]
    for (size_t q = 0; q < (size_t)R * N * M; q++)
        A[q] = (ref_cell){INFINITY, 0, -1, 0, 0, 0};
    for (int i = 0; i < R; i++)
        for (int j = i; j < N; j++) {
            double tc = prev ? prev[((size_t)i * N + j) * Mprev + Mprev - 1].t
                             : ref_range(st->compute, i, j);
            double act = ref_range(st->activation, i, j), par = ref_range(st->parameter, i, j);
            for (int m = 0; m < (o->straight ? 1 : M); m++) {
                double stashed = ceil((double)(M - (m + 1)) / (m + 1)) * (act + par);
                if (o->memory_constraint && stashed > o->memory_size)
                    continue;
                if (isnan(tc) || isinf(tc))
                    continue;
                double dp = (4.0 * m * par) / (b * (m + 1)) / w;
                double t = (tc + dp) / (m + 1);
                A_(i, j, m) = (ref_cell){t, t * t, -1, 0, m + 1, 1};
            }
        }
    for (int i = 0; i < (final ? 1 : R); i++)
        for (int m = 1; m < M; m++)
            for (int j = i + 1; j < N; j++) {
                ref_cell best = A_(i, j, m);
                if (o->fewer_machines && ref_less(&A_(i, j, m - 1), &best))
                    best = A_(i, j, m - 1);
                for (int k = 0; k < N; k++) {
                    if (!ref_pred(st, j, k) || (i > 0 && ref_pred(st, i - 1, k)) || k < i)
                        continue;
                    for (int mp = 1; mp <= (o->straight ? 1 : m); mp++) {
                        double lt = prev ? prev[((size_t)(k + 1) * N + j) * Mprev + Mprev - 1].t
                                         : ref_range(st->compute, k + 1, j);
                        if (isnan(lt) || isinf(lt))
                            continue;
                        double lp = ref_range(st->parameter, k + 1, j);
                        double stashed = (ref_range(st->activation, k + 1, j) + lp) *
                                         ceil((double)(M - (m + 1)) / mp);
                        if (o->memory_constraint && stashed > o->memory_size)
                            continue;
                        double last = (lt + (4.0 * (mp - 1) * lp) / (b * mp)) / mp;
                        const ref_cell *pre = &A_(i, k, m - mp);
                        if (isinf(pre->t))
                            continue;
                        double pt = pre->t > last ? pre->t : last;
                        if (o->activation_compression > 0) {
                            double in = 2.0 * st->out_activation[k] / (b * mp) /
                                        o->activation_compression;
                            pt = in > pt ? in : pt;
                            if (j < N - 1) {
                                double out = 2.0 * st->out_activation[j] / (b * mp) /
                                             o->activation_compression;
                                pt = out > pt ? out : pt;
                            }
                        }
                        ref_cell c = {pt, pre->sumsq + last * last, k, m - mp, mp,
                                      pre->stages + 1};
                        if (ref_less(&c, &best))
                            best = c;
                    }
                }
                A_(i, j, m) = best;
            }
#undef A_
    return A;
}

/* Unfolds the reference tables into (start, end, replication) per level,
** outermost first, in the order the planner lists its stages. */
static int ref_unfold(ref_cell **tabs, const rp_plan_options *o, int N, int out[][3],
                      int *counts) {
    int L = o->num_levels, total = 0;
    int ranges[512][2], nr = 1;
    ranges[0][0] = 0;
    ranges[0][1] = N;
    for (int l = L - 1; l >= 0; l--) {
        int M = o->machines[l], next[512][2], nn = 0, cnt = 0;
        for (int r = 0; r < nr; r++) {
            int start = ranges[r][0], end = ranges[r][1];
            int splits[512], reps[512], n = 0;
            const ref_cell *c = &tabs[l][((size_t)start * N + end - 1) * M + M - 1];
            while (c->k >= 0) {
                splits[n] = c->k + 1;
                reps[n++] = c->nmach;
                c = &tabs[l][((size_t)start * N + c->k) * M + c->mrest];
            }
            reps[n] = c->nmach;
            int prev = start;
            for (int s = n; s >= 0; s--) {
                int split = s > 0 ? splits[s - 1] : end;
                out[total][0] = prev;
                out[total][1] = split;
                out[total++][2] = reps[s];
                next[nn][0] = prev;
                next[nn++][1] = split;
                cnt++;
                prev = split;
            }
        }
        counts[L - 1 - l] = cnt;
        memcpy(ranges, next, sizeof(int) * 2 * nn);
        nr = nn;
    }
    return total;
}

/* ---- random profiles ------------------------------------------------------ */

static unsigned long long rng = 88172645463325252ull;
static unsigned next_u(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng >> 32);
}

/* A chain with residual skips and, when branchy, parallel branches of
** layers (whose states' cumulative compute can fall from one state to the
** next), an Input source first and sometimes a __getitem__ sink, in
** graph.txt form. */
static char *random_profile(int n, bool branchy) {
    size_t cap = 256 * (size_t)(n + 4) * 3;
    char *s = malloc(cap);
    size_t len = 0;
    len += snprintf(s + len, cap - len,
                    "node0 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, "
                    "activation_size=%.1f, parameter_size=0.000\n",
                    (double)(next_u() % 1000));
    for (int i = 1; i <= n; i++) {
        /* coarse values make exact ties between plans common */
        double f = (next_u() % 8) * 0.5, bw = (next_u() % 8) * 0.5;
        double act = (double)(next_u() % 5) * 1e6, par = (double)(next_u() % 4) * 4e6;
        len += snprintf(s + len, cap - len,
                        "node%d -- Layer%d -- forward_compute_time=%.3f, "
                        "backward_compute_time=%.3f, activation_size=%.1f, "
                        "parameter_size=%.3f\n",
                        i, i, f, bw, act, par);
    }
    bool getitem = next_u() % 3 == 0;
    if (getitem)
        len += snprintf(s + len, cap - len,
                        "node%d -- __getitem__ -- forward_compute_time=1.000, "
                        "backward_compute_time=0.000, activation_size=4.0, parameter_size=0.0\n",
                        n + 1);
    for (int i = 1; i <= n;) {
        int a = 1 + next_u() % 3, b = 1 + next_u() % 3;
        if (branchy && i + a + b <= n && next_u() % 2 == 0) {
            /* two branches of a and b layers from node i-1, joined after */
            for (int q = 0; q < a; q++)
                len += snprintf(s + len, cap - len, "\tnode%d -- node%d\n", q ? i + q - 1 : i - 1,
                                i + q);
            for (int q = 0; q < b; q++)
                len += snprintf(s + len, cap - len, "\tnode%d -- node%d\n",
                                q ? i + a + q - 1 : i - 1, i + a + q);
            len += snprintf(s + len, cap - len, "\tnode%d -- node%d\n\tnode%d -- node%d\n",
                            i + a - 1, i + a + b, i + a + b - 1, i + a + b);
            i += a + b + 1;
            continue;
        }
        len += snprintf(s + len, cap - len, "\tnode%d -- node%d\n", i - 1, i);
        if (i >= 3 && next_u() % 4 == 0) /* residual skip */
            len += snprintf(s + len, cap - len, "\tnode%d -- node%d\n", i - 2 - next_u() % 2, i);
        i++;
    }
    if (getitem)
        len += snprintf(s + len, cap - len, "\tnode%d -- node%d\n", n, n + 1);
    return s;
}

static void random_options(rp_plan_options *o) {
    rp_plan_options_default(o);
    o->num_levels = 1 + next_u() % 3;
    for (int l = 0; l < o->num_levels; l++) {
        o->machines[l] = 1 + next_u() % (o->num_levels == 1 ? 7 : 4);
        o->bandwidth[l] = (1 + next_u() % 4) * 1e9;
    }
    o->straight = next_u() % 5 == 0;
    o->fewer_machines = next_u() % 3 == 0;
    o->memory_constraint = next_u() % 3 == 0;
    o->memory_size = (1 + next_u() % 40) * 1e6;
    o->activation_compression = next_u() % 3 == 0 ? 0.5 + next_u() % 4 : 0;
    o->threads = 1 + next_u() % 3;
}

/* Cumulative compute falls somewhere over the states. */
static bool falls(const rp_states *st) {
    for (int j = 1; j < st->n; j++)
        if (st->compute[j] < st->compute[j - 1])
            return true;
    return false;
}

static void test_against_reference(void) {
    int compared = 0, infeasible = 0, falling = 0;
    for (int trial = 0; trial < 300; trial++) {
        int failures_before = test_failures;
        char *text = random_profile(4 + next_u() % 20, trial % 2);
        rp_profile *p;
        rp_error err;
        CHECK(rp_profile_parse(&p, text, strlen(text), "random", &err) == RP_OK);
        rp_plan_options o;
        random_options(&o);
        rp_states st;
        CHECK(rp_states_build(p, 0, &st, &err) == RP_OK);
        falling += o.memory_constraint && falls(&st);
        ref_cell *tabs[RP_PLAN_MAX_LEVELS];
        double w = 1;
        for (int l = 0; l < o.num_levels; l++) {
            tabs[l] = ref_level(&st, l ? tabs[l - 1] : NULL, l ? o.machines[l - 1] : 0,
                                o.machines[l], o.bandwidth[l], w, &o, l == o.num_levels - 1);
            w = o.machines[l];
        }
        int N = st.n, Mt = o.machines[o.num_levels - 1];
        const ref_cell *top = &tabs[o.num_levels - 1][(size_t)(N - 1) * Mt + Mt - 1];
        rp_plan *plan = NULL;
        rp_status s = rp_plan_compute(p, &o, &plan, &err);
        if (isinf(top->t)) {
            CHECK(s == RP_ERR_INFEASIBLE);
            CHECK_STR_HAS(err.msg, "no plan fits");
            infeasible++;
        } else {
            CHECK(s == RP_OK);
            if (s == RP_OK) {
                compared++;
                CHECK(plan->pipeline_time == top->t);
                static int stages[4096][3];
                int counts[RP_PLAN_MAX_LEVELS];
                int total = ref_unfold(tabs, &o, N, stages, counts);
                int at = 0;
                for (int l = 0; l < plan->num_levels; l++) {
                    CHECK_INT(plan->levels[l].num_stages, counts[l]);
                    for (int k = 0; k < plan->levels[l].num_stages && at < total; k++, at++) {
                        CHECK_INT(plan->levels[l].stages[k].start, stages[at][0]);
                        CHECK_INT(plan->levels[l].stages[k].end, stages[at][1]);
                        CHECK_INT(plan->levels[l].stages[k].replication, stages[at][2]);
                    }
                }
                /* every worker is counted once and the layout covers them */
                int sum = 0;
                for (int k = 0; k < plan->num_stages; k++)
                    sum += plan->stage_num_ranks[k];
                CHECK_INT(sum, plan->num_workers);
                CHECK(plan->num_workers <= plan->machines_available);
                if (!o.fewer_machines)
                    CHECK_INT(plan->num_workers, plan->machines_available);
            }
        }
        if (test_failures > failures_before) {
            fprintf(stderr, "trial %d: levels %d, straight %d fewer %d mem %d acr %g\n%s", trial,
                    o.num_levels, o.straight, o.fewer_machines, o.memory_constraint,
                    o.activation_compression, text);
            trial = 1 << 20;
        }
        rp_plan_free(plan);
        for (int l = 0; l < o.num_levels; l++)
            free(tabs[l]);
        rp_states_free(&st);
        rp_profile_free(p);
        free(text);
    }
    CHECK(compared > 150);
    CHECK(infeasible > 5);
    CHECK(falling > 20); /* the scan's stash blocks, not its monotone shortcuts */
    printf("reference: %d plans compared, %d infeasible agreed, %d with falling compute and "
           "the memory constraint\n",
           compared, infeasible, falling);
}

/* Bounding the level below the top leaves most of its rows unsolved, and
** must not change the plan: larger random profiles on two levels, every
** option, planned with and without it. */
static void test_bounded_rows(void) {
    int pruned = 0;
    for (int trial = 0; trial < 60; trial++) {
        int failures_before = test_failures;
        char *text = random_profile(20 + next_u() % 120, trial % 2);
        rp_profile *p;
        rp_error err;
        CHECK(rp_profile_parse(&p, text, strlen(text), "random", &err) == RP_OK);
        rp_plan_options o;
        random_options(&o);
        o.num_levels = 2;
        o.machines[0] = 2 + next_u() % 7;
        o.machines[1] = 2 + next_u() % 3;
        rp_plan *a = NULL, *b = NULL;
        rp_status sa = rp_plan_compute(p, &o, &a, &err);
        o.all_rows = true;
        rp_status sb = rp_plan_compute(p, &o, &b, &err);
        CHECK_INT(sa, sb);
        if (sa == RP_OK && sb == RP_OK) {
            CHECK(a->pipeline_time == b->pipeline_time);
            CHECK_INT(b->rows_solved, b->num_states);
            if (a->rows_solved < a->num_states / 2)
                pruned++;
            for (int l = 0; l < 2; l++) {
                CHECK_INT(a->levels[l].num_stages, b->levels[l].num_stages);
                for (int k = 0; k < a->levels[l].num_stages && k < b->levels[l].num_stages;
                     k++) {
                    CHECK_INT(a->levels[l].stages[k].start, b->levels[l].stages[k].start);
                    CHECK_INT(a->levels[l].stages[k].end, b->levels[l].stages[k].end);
                    CHECK_INT(a->levels[l].stages[k].replication,
                              b->levels[l].stages[k].replication);
                }
            }
        }
        if (test_failures > failures_before) {
            fprintf(stderr, "trial %d: %d x %d, straight %d fewer %d mem %d acr %g\n%s", trial,
                    o.machines[0], o.machines[1], o.straight, o.fewer_machines,
                    o.memory_constraint, o.activation_compression, text);
            trial = 1 << 20;
        }
        rp_plan_free(a), rp_plan_free(b);
        rp_profile_free(p);
        free(text);
    }
    /* the bound does its work on most chains */
    CHECK(pruned > 10);
    printf("bounded rows: %d of 60 plans solved under half the rows, all equal\n", pruned);
}

/* ---- small graphs by hand ------------------------------------------------- */

static rp_profile *parse(const char *text) {
    rp_profile *p = NULL;
    rp_error err;
    if (rp_profile_parse(&p, text, strlen(text), "t.txt", &err) != RP_OK)
        fprintf(stderr, "parse: %s\n", err.msg);
    return p;
}

#define NODE(id, f) id " -- L -- forward_compute_time=" f ", backward_compute_time=0.000, "  \
                       "activation_size=1.0, parameter_size=0.0\n"

static void test_states(void) {
    /* A diamond a -> {b, c} -> d. From {a}: {b} and {c}. {b} is augmented
    ** with a (a still feeds c), so it leads to {b,c} (a -> c) and to {d}
    ** (b -> d, a dropped as d's predecessor); likewise {c}; {b,c} leads to
    ** {d}. States: {a}, {b}, {c}, {b,c}, {d}. */
    rp_profile *p = parse(NODE("a", "1.0") NODE("b", "2.0") NODE("c", "3.0") NODE("d", "4.0")
                              "\ta -- b\n\ta -- c\n\tb -- d\n\tc -- d\n");
    CHECK(p != NULL);
    rp_states st;
    rp_error err;
    CHECK(rp_states_build(p, 0, &st, &err) == RP_OK);
    CHECK_INT(st.n, 5);
    /* first state is {a}: 1 ms; last covers everything: 10 ms */
    CHECK_CLOSE(st.compute[0], 0.001, 1e-12);
    CHECK_CLOSE(st.compute[st.n - 1], 0.010, 1e-12);
    /* the last state has all the others as predecessors */
    CHECK_INT(st.num_pred[st.n - 1], st.n - 1);
    rp_states_free(&st);
    rp_profile_free(p);
    /* A chain of 5 with an Input source: the source is removed, 4 states,
    ** cumulative times 1, 3, 6, 10 ms. */
    p = parse("n0 -- Input -- forward_compute_time=9.0, backward_compute_time=9.0, "
              "activation_size=1.0, parameter_size=0.0\n" NODE("n1", "1.0") NODE("n2", "2.0")
                  NODE("n3", "3.0") NODE("n4", "4.0") "\tn0 -- n1\n\tn1 -- n2\n\tn2 -- n3\n"
                                                      "\tn3 -- n4\n");
    CHECK(rp_states_build(p, 0, &st, &err) == RP_OK);
    CHECK_INT(st.n, 4);
    static const double cum[] = {0.001, 0.003, 0.006, 0.010};
    for (int i = 0; i < 4 && i < st.n; i++)
        CHECK_CLOSE(st.compute[i], cum[i], 1e-12);
    CHECK(st.input_source[0] == 1);
    rp_states_free(&st);
    /* Two machines, fast network: the best split of 1,2,3,4 ms is after
    ** the third layer (6 ms | 4 ms), one machine each. */
    rp_plan_options o;
    rp_plan_options_default(&o);
    o.num_levels = 1;
    o.machines[0] = 2;
    o.bandwidth[0] = 1e15;
    o.straight = true;
    rp_plan *plan;
    CHECK(rp_plan_compute(p, &o, &plan, &err) == RP_OK);
    CHECK_INT(plan->levels[0].num_stages, 2);
    CHECK_INT(plan->levels[0].stages[0].end, 3);
    CHECK_CLOSE(plan->pipeline_time, 0.006, 1e-9);
    CHECK_INT(plan->node_stage[0], 0); /* the Input source */
    CHECK_INT(plan->node_stage[3], 0);
    CHECK_INT(plan->node_stage[4], 1);
    rp_plan_free(plan);
    rp_profile_free(p);
}

/* The seed case's layout: R = 2 copies of a (7, 1) pipeline. */
static void test_rank_layout(void) {
    char text[8192];
    size_t len = 0;
    for (int i = 0; i < 6; i++)
        len += snprintf(text + len, sizeof text - len,
                        "n%d -- L -- forward_compute_time=%s, backward_compute_time=0.0, "
                        "activation_size=1.0, parameter_size=%s\n",
                        i, i < 5 ? "20.0" : "5.0", i < 5 ? "1.0" : "1e9");
    for (int i = 1; i < 6; i++)
        len += snprintf(text + len, sizeof text - len, "\tn%d -- n%d\n", i - 1, i);
    rp_profile *p = parse(text);
    rp_plan_options o;
    rp_plan_options_default(&o);
    o.num_levels = 2;
    o.machines[0] = 8;
    o.machines[1] = 2;
    o.bandwidth[0] = 1e9;
    o.bandwidth[1] = 1e9;
    rp_plan *plan;
    rp_error err;
    CHECK(rp_plan_compute(p, &o, &plan, &err) == RP_OK);
    /* Whatever the split, ranks are replica-major: a final stage has the
    ** product of its and its ancestors' replication, and inside the block
    ** of 8 ranks of one level-2 machine its ranks are consecutive. */
    CHECK_INT(plan->num_workers, 16);
    for (int k = 0; k < plan->num_stages; k++) {
        const rp_plan_stage *ps = &plan->levels[1].stages[k];
        CHECK_INT(plan->stage_num_ranks[k],
                  ps->replication * plan->levels[0].stages[ps->parent].replication);
    }
    for (int blk = 0; blk < 16; blk += 8)
        for (int r = blk + 1; r < blk + 8; r++)
            CHECK(plan->worker_stage[r] >= plan->worker_stage[r - 1]);
    char *json;
    CHECK(rp_plan_to_json(plan, p, &json, &err) == RP_OK);
    CHECK_STR_HAS(json, "\"stage_to_rank_map\"");
    CHECK_STR_HAS(json, "\"node_stage\"");
    /* the options written are the options read back */
    rp_plan_options back;
    CHECK(rp_plan_options_from_json(&back, json, strlen(json), "plan", &err) == RP_OK);
    CHECK_INT(back.num_levels, 2);
    CHECK_INT(back.machines[0], 8);
    CHECK_INT(back.machines[1], 2);
    CHECK(back.bandwidth[1] == o.bandwidth[1] && back.memory_size == o.memory_size);
    CHECK(rp_plan_options_from_json(&back, "{\"machines\": 3}", 15, "bad", &err) ==
          RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "bad: 'machines' must list");
    free(json);
    CHECK(rp_plan_pipedream_conf(plan, &json, &err) == RP_OK);
    CHECK_STR_HAS(json, "\"module_to_stage_map\"");
    free(json);
    rp_plan_free(plan);
    /* memory constraint + fewer machines (PipeDream crashes here) */
    o.memory_constraint = true;
    o.fewer_machines = true;
    o.memory_size = 3e9;
    CHECK(rp_plan_compute(p, &o, &plan, &err) == RP_OK);
    rp_plan_free(plan);
    /* A straight pipeline stashes on every stage: 1 byte fits nothing. */
    o.straight = true;
    o.memory_size = 1;
    CHECK(rp_plan_compute(p, &o, &plan, &err) == RP_ERR_INFEASIBLE);
    CHECK_STR_HAS(err.msg, "no plan fits");
    o.num_levels = 0;
    CHECK(rp_plan_compute(p, &o, &plan, &err) == RP_ERR_INVALID);
    rp_profile_free(p);
}

/* Machines whose product wraps an int, and tables too large for this
** machine, are refused at once with the figures (they spun, or ran out of
** memory after minutes). */
static void test_limits(void) {
    int n = 400000; /* a chain: 320 GB of predecessor lists on one level */
    size_t cap = (size_t)n * 160, len = 0;
    char *text = malloc(cap);
    len += (size_t)snprintf(text, cap, "node0 -- Input0 -- forward_compute_time=0, "
                                       "backward_compute_time=0, activation_size=1, "
                                       "parameter_size=0\n");
    for (int i = 1; i <= n; i++)
        len += (size_t)snprintf(text + len, cap - len,
                                "node%d -- L -- forward_compute_time=1, backward_compute_time=1, "
                                "activation_size=1, parameter_size=1\n",
                                i);
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(text + len, cap - len, "\tnode%d -- node%d\n", i, i + 1);
    rp_profile *p;
    rp_error err;
    CHECK(rp_profile_parse(&p, text, len, "chain", &err) == RP_OK);
    rp_plan_options o;
    rp_plan_options_default(&o);
    o.num_levels = 3;
    o.machines[0] = o.machines[1] = o.machines[2] = 4096;
    rp_plan *plan;
    CHECK(rp_plan_compute(p, &o, &plan, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "68719476736 machines in all; at most 4096");
    o.num_levels = 2;
    o.machines[0] = 8, o.machines[1] = 2;
    double t0 = rp_now();
    CHECK(rp_plan_compute(p, &o, &plan, &err) == RP_ERR_NOMEM);
    CHECK_STR_HAS(err.msg, "planning 400000 nodes on these machines needs");
    CHECK_STR_HAS(err.msg, "or fewer levels");
    o.num_levels = 1;
    CHECK(rp_plan_compute(p, &o, &plan, &err) == RP_ERR_NOMEM);
    CHECK_STR_HAS(err.msg, "GB of memory available: use a coarser profile");
    CHECK(rp_now() - t0 < 5); /* refused before building anything */
    rp_profile_free(p);
    free(text);
}

/* Two chains that never join: refused naming the nodes left out (they
** were dropped from the plan without a word). */
static void test_disconnected(void) {
    const char *text =
        "node0 -- Input0 -- forward_compute_time=0, backward_compute_time=0, activation_size=1, "
        "parameter_size=0\n"
        "node1 -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=1, "
        "parameter_size=1\n"
        "node2 -- B -- forward_compute_time=1, backward_compute_time=1, activation_size=1, "
        "parameter_size=1\n"
        "node3 -- C -- forward_compute_time=5, backward_compute_time=5, activation_size=1, "
        "parameter_size=1\n"
        "\tnode0 -- node1\n\tnode1 -- node2\n";
    rp_profile *p;
    rp_error err;
    CHECK(rp_profile_parse(&p, text, strlen(text), "two", &err) == RP_OK);
    rp_plan_options o;
    rp_plan_options_default(&o);
    o.num_levels = 1;
    o.machines[0] = 2;
    rp_plan *plan;
    CHECK(rp_plan_compute(p, &o, &plan, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "1 node not connected to the first source node1 (line 2): node3 (line 4)");
    rp_profile_free(p);
}

/* PipeDream's Graph.compress_branches, run unmodified on inception_v3's
** profile, wrote profiles/inception_v3/compressed.txt: repipe's
** compression gives the same nodes (names, descriptions, times to its three
** decimals), edges in the same order, and every profile node inside one of
** them, its forward times summing to the node's. */
static void test_compression(void) {
    rp_profile *p, *want, *got = NULL;
    rp_error err;
    CHECK(rp_profile_read(&p, REPIPE_FIXTURES "/profiles/inception_v3/graph.txt", &err) == RP_OK);
    CHECK(rp_profile_read(&want, REPIPE_FIXTURES "/profiles/inception_v3/compressed.txt", &err) ==
          RP_OK);
    int *member = malloc(sizeof(int) * p->num_nodes);
    CHECK(rpi_profile_compress_branches(p, &got, member, &err) == RP_OK);
    if (!got) {
        free(member);
        rp_profile_free(p), rp_profile_free(want);
        return;
    }
    CHECK_INT(p->num_nodes, 326);
    CHECK_INT(got->num_nodes, want->num_nodes);
    CHECK_INT(got->num_nodes, 92);
    int same = 0;
    for (int i = 0; i < got->num_nodes && i < want->num_nodes; i++) {
        const rp_profile_node *a = &got->nodes[i], *b = &want->nodes[i];
        same += strcmp(a->id, b->id) == 0 && strcmp(a->desc, b->desc) == 0 &&
                a->forward_ms == b->forward_ms && a->backward_ms == b->backward_ms &&
                a->activation_bytes == b->activation_bytes &&
                a->parameter_bytes == b->parameter_bytes;
    }
    CHECK_INT(same, want->num_nodes);
    CHECK_INT(got->num_edges, want->num_edges);
    int edges = 0;
    for (int e = 0; e < got->num_edges && e < want->num_edges; e++)
        edges += got->edges[e].from == want->edges[e].from && got->edges[e].to == want->edges[e].to;
    CHECK_INT(edges, want->num_edges);
    double *sum = calloc(got->num_nodes, sizeof(double));
    int inside = 0;
    for (int v = 0; v < p->num_nodes; v++)
        if (member[v] >= 0 && member[v] < got->num_nodes) {
            inside++;
            sum[member[v]] += p->nodes[v].forward_ms;
        }
    CHECK_INT(inside, p->num_nodes);
    int sums = 0;
    for (int i = 0; i < got->num_nodes; i++)
        sums += fabs(sum[i] - got->nodes[i].forward_ms) <= 5e-4 + 1e-12;
    CHECK_INT(sums, got->num_nodes);
    free(sum);
    free(member);
    rp_profile_free(got), rp_profile_free(want), rp_profile_free(p);
}

/* Graphs too wide to plan even compressed are refused at once, with the
** counts; a straight pipeline longer than the profile names --straight,
** not memory. */
static void test_refusals(void) {
    rp_profile *p;
    rp_error err;
    rp_plan_options o;
    rp_plan_options_default(&o);
    o.num_levels = 1;
    o.machines[0] = 4;
    rp_plan *plan = NULL;
    CHECK(rp_profile_read(&p, REPIPE_FIXTURES "/profiles/nasnetamobile/graph.txt", &err) == RP_OK);
    double t0 = rp_now();
    CHECK(rp_plan_compute(p, &o, &plan, &err) == RP_ERR_INFEASIBLE);
    CHECK(rp_now() - t0 < 10);
    CHECK_STR_HAS(err.msg, "its antichain DAG has more than 20000 states");
    CHECK_STR_HAS(err.msg, "921 nodes to 290");
    CHECK_STR_HAS(err.msg, "Profile coarser layers");
    rp_profile_free(p);
    CHECK(rp_profile_read(&p, REPIPE_FIXTURES "/profiles/alexnet/graph.txt", &err) == RP_OK);
    o.machines[0] = 64;
    o.straight = true;
    CHECK(rp_plan_compute(p, &o, &plan, &err) == RP_ERR_INFEASIBLE);
    CHECK_STR_HAS(err.msg, "--straight gives each of the 64 machines a stage of its own, and the "
                           "profile has 22 states");
    o.memory_constraint = true;
    o.machines[0] = 4;
    o.memory_size = 1;
    CHECK(rp_plan_compute(p, &o, &plan, &err) == RP_ERR_INFEASIBLE);
    CHECK_STR_HAS(err.msg, "exceeds the memory size of 1 bytes per machine");
    rp_profile_free(p);
}

int main(void) {
    test_compression();
    test_refusals();
    test_disconnected();
    test_limits();
    test_states();
    test_rank_layout();
    test_against_reference();
    test_bounded_rows();
    return test_finish("test_planner");
}
