/*
** Schedules from outside: each rank's list of compute actions, in the CSV
** form of PyTorch's torch.distributed.pipelining (one row per rank, one
** cell per action: "2F0" is stage 2's forward of micro-batch 0, "I" the
** input half of a backward, "W" its weight half, "B" a whole backward, and
** "(0F7;7B3)OVERLAP_F_B" two actions run back to back; an empty cell is a
** step where the rank idles). A rank may hold several stages (interleaved
** and V-shaped schedules), which repipe's own schedules do not, so these are
** checked and predicted here, not run.
**
** Played on one clock as rp_simulate plays operation lists: a rank runs its
** next action as soon as what it needs has arrived — a forward the previous
** stage's output for its micro-batch, a backward the next stage's gradient
** (or the stage's own forward, on the last stage), a W its own B — with a
** transfer between two ranks priced by the level they share. A list that
** would wait for ever is refused with what each rank waits for.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/schedule.h"
#include "repipe/simulate.h"
#include "simulate_impl.h"

enum { ACT_F, ACT_B, ACT_I, ACT_W }; /* B: the whole backward; I, W: its halves */

typedef struct action {
    int stage, kind, mb;
} action;

struct rp_sim_actions {
    int ranks, stages, micro_batches; /* while parsing: the largest stage and micro-batch seen */
    int *count;      /* actions per rank */
    action **list;   /* per rank, in order */
    int *rank_of;    /* per stage */
    bool *split;     /* per (stage, mb): its backward comes as B or I, then W */
};

void rp_sim_actions_free(rp_sim_actions *a) {
    if (!a)
        return;
    for (int r = 0; r < a->ranks; r++)
        free(a->list[r]);
    free(a->list), free(a->count), free(a->rank_of), free(a->split);
    free(a);
}

int rp_sim_actions_ranks(const rp_sim_actions *a) { return a->ranks; }
int rp_sim_actions_stages(const rp_sim_actions *a) { return a->stages; }
int rp_sim_actions_micro_batches(const rp_sim_actions *a) { return a->micro_batches; }

/* "12F3" → stage 12, F, micro-batch 3. Returns false for anything else. */
static bool parse_one(const char *s, size_t n, action *out) {
    size_t i = 0;
    long stage = 0, mb = 0;
    if (i == n || s[i] < '0' || s[i] > '9')
        return false;
    for (; i < n && s[i] >= '0' && s[i] <= '9' && stage < 100000; i++)
        stage = stage * 10 + (s[i] - '0');
    if (i == n)
        return false;
    const char *kinds = "FBIW", *k = strchr(kinds, s[i]);
    if (!k || !*k)
        return false;
    out->kind = (int)(k - kinds);
    if (++i == n)
        return false;
    for (; i < n && s[i] >= '0' && s[i] <= '9' && mb < 1000000; i++)
        mb = mb * 10 + (s[i] - '0');
    if (i != n)
        return false;
    out->stage = (int)stage, out->mb = (int)mb;
    return true;
}

/* PyTorch's communication and memory actions, which its lowering adds to a
** compute-only list: the transfers are derived here, so they are skipped. */
static bool is_comm(const char *s, size_t n) {
    static const char *const names[] = {"SEND_F", "RECV_F", "SEND_B", "RECV_B",
                                        "UNSHARD", "RESHARD", "REDUCE_GRAD"};
    size_t i = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        size_t m = strlen(names[k]);
        if (n - i >= m && memcmp(s + i, names[k], m) == 0)
            return true;
    }
    return false;
}

static rp_status push(rp_sim_actions *a, int r, int *cap, action x, rp_error *err) {
    a->stages = x.stage > a->stages ? x.stage : a->stages;
    a->micro_batches = x.mb > a->micro_batches ? x.mb : a->micro_batches;
    if (a->count[r] == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        action *nl = realloc(a->list[r], sizeof(action) * nc);
        if (!nl)
            return rp_fail(err, RP_ERR_NOMEM, "out of memory");
        a->list[r] = nl, *cap = nc;
    }
    a->list[r][a->count[r]++] = x;
    return RP_OK;
}

/* Micro-batch m of stage s (line `line`): k its passes' places + 1 (0:
** absent), a forward and one backward (B, or I then W), in order. */
static rp_status check_passes(const int *k, int line, int s, int m, int M, const char *name,
                              rp_error *err) {
    int back = k[ACT_B] ? k[ACT_B] : k[ACT_I]; /* its place + 1, or 0 */
    if (!k[ACT_F] || !back)
        return rp_fail(err, RP_ERR_INVALID, "%s: line %d: stage %d's micro-batch %d has no %s "
                       "(micro-batches 0 to %d appear)", name, line, s, m,
                       k[ACT_F] ? "backward (B or I)" : "forward (F)", M - 1);
    if (k[ACT_B] && k[ACT_I])
        return rp_fail(err, RP_ERR_INVALID, "%s: line %d: %dB%d and %dI%d: one backward a "
                       "micro-batch", name, line, s, m, s, m);
    if (k[ACT_I] && !k[ACT_W])
        return rp_fail(err, RP_ERR_INVALID, "%s: line %d: %dI%d has no %dW%d", name, line, s, m,
                       s, m);
    if (k[ACT_F] > back)
        return rp_fail(err, RP_ERR_INVALID, "%s: line %d: %dF%d comes after its backward", name,
                       line, s, m);
    if (k[ACT_W] && k[ACT_W] < back)
        return rp_fail(err, RP_ERR_INVALID, "%s: line %d: %dW%d comes before its B (or I)", name,
                       line, s, m);
    return RP_OK;
}

/* Every stage on one rank, every (stage, micro-batch) with one forward and
** one backward (B, or B or I then W), each in order on its rank. */
static rp_status check(rp_sim_actions *a, const char *name, rp_error *err) {
    int S = a->stages, M = a->micro_batches;
    int *seen = calloc((size_t)S * M * 4, sizeof(int)); /* per (stage, mb, kind): its place + 1 */
    a->rank_of = malloc(sizeof(int) * S);
    a->split = calloc((size_t)S * M, sizeof(bool));
    if (!seen || !a->rank_of || !a->split) {
        free(seen);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    for (int s = 0; s < S; s++)
        a->rank_of[s] = -1;
    rp_status st = RP_OK;
    for (int r = 0; r < a->ranks && !st; r++)
        for (int i = 0; i < a->count[r] && !st; i++) {
            action x = a->list[r][i];
            int *k = &seen[((size_t)x.stage * M + x.mb) * 4 + x.kind];
            if (a->rank_of[x.stage] >= 0 && a->rank_of[x.stage] != r)
                st = rp_fail(err, RP_ERR_INVALID, "%s: stage %d has actions on ranks %d and %d "
                             "(line %d): a stage lives on one rank", name, x.stage,
                             a->rank_of[x.stage], r, r + 1);
            else if (*k)
                st = rp_fail(err, RP_ERR_INVALID, "%s: line %d: %d%c%d appears twice", name,
                             r + 1, x.stage, "FBIW"[x.kind], x.mb);
            a->rank_of[x.stage] = r;
            *k = i + 1;
        }
    for (int s = 0; s < S && !st; s++)
        if (a->rank_of[s] < 0)
            st = rp_fail(err, RP_ERR_INVALID, "%s: stage %d has no actions (stages 0 to %d "
                         "appear)", name, s, S - 1);
    /* first a micro-batch that a stage's line holds in part (a forward
    ** without its backward, or the other way): that line is the wrong one;
    ** then one that a line lacks altogether */
    for (int pass = 0; pass < 2 && !st; pass++)
        for (int s = 0; s < S && !st; s++)
            for (int m = 0; m < M && !st; m++) {
                const int *k = &seen[((size_t)s * M + m) * 4];
                if (pass == 0 && !k[ACT_F] && !k[ACT_B] && !k[ACT_I] && !k[ACT_W])
                    continue;
                st = check_passes(k, a->rank_of[s] + 1, s, m, M, name, err);
                /* a B with a W beside it is the input half (PyTorch's older name for I) */
                a->split[(size_t)s * M + m] = k[ACT_W] > 0;
            }
    free(seen);
    return st;
}

/* Cell col of rank r's line: nothing (an idle step, or a transfer that is
** derived here), an action, or PyTorch's overlapped pair "(0F7;7B3)OVERLAP_F_B",
** its actions in order. */
static rp_status parse_cell(rp_sim_actions *a, int r, int *cap, const char *cell, size_t n,
                            size_t col, const char *name, rp_error *err) {
    static const char overlap[] = ")OVERLAP_F_B";
    size_t ol = sizeof overlap - 1;
    action x;
    if (n == 0 || is_comm(cell, n))
        return RP_OK;
    if (cell[0] != '(' || n <= ol + 1 || memcmp(cell + n - ol, overlap, ol) != 0) {
        if (!parse_one(cell, n, &x))
            return rp_fail(err, RP_ERR_PARSE, "%s: line %d, column %zu: '%.*s' is not an "
                           "action (stage, F, B, I or W, micro-batch: 2F0, 1I3)", name, r + 1,
                           col, (int)(n < 40 ? n : 40), cell);
        return push(a, r, cap, x, err);
    }
    rp_status st = RP_OK;
    for (size_t s0 = 1; !st && s0 < n - ol;) {
        size_t s1 = s0;
        while (s1 < n - ol && cell[s1] != ';')
            s1++;
        if (!parse_one(cell + s0, s1 - s0, &x))
            st = rp_fail(err, RP_ERR_PARSE, "%s: line %d, column %zu: '%.*s' is not an action "
                         "of the form 2F0", name, r + 1, col, (int)n, cell);
        else
            st = push(a, r, cap, x, err);
        s0 = s1 + 1;
    }
    return st;
}

/* The schedule's stages and micro-batches, from the largest seen, each
** within bounds; blank lines at the end dropped. */
static rp_status sizes(rp_sim_actions *a, const char *name, rp_error *err) {
    int max_stage = a->stages, max_mb = a->micro_batches;
    if (max_stage < 0)
        return rp_fail(err, RP_ERR_PARSE, "%s: no actions (one line per rank: 0F0,0F1,...)",
                       name);
    if (max_stage >= RP_MAX_STAGES)
        return rp_fail(err, RP_ERR_INVALID, "%s: stage %d: at most %d stages", name, max_stage,
                       RP_MAX_STAGES);
    long long pairs = ((long long)max_stage + 1) * ((long long)max_mb + 1);
    if (max_mb >= 65536 || pairs > 1 << 22)
        return rp_fail(err, RP_ERR_INVALID, "%s: micro-batch %d on %d stages: at most 65536 "
                       "micro-batches and 4194304 (stage, micro-batch) pairs", name, max_mb,
                       max_stage + 1);
    while (a->ranks > 1 && a->count[a->ranks - 1] == 0) /* blank lines at the end */
        free(a->list[--a->ranks]), a->list[a->ranks] = NULL;
    a->stages = max_stage + 1, a->micro_batches = max_mb + 1;
    return RP_OK;
}

rp_status rp_sim_actions_parse(const char *text, size_t len, const char *name,
                               rp_sim_actions **out, rp_error *err) {
    *out = NULL;
    rp_sim_actions *a = calloc(1, sizeof *a);
    if (!a)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    int lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    lines += len && text[len - 1] != '\n';
    a->count = calloc(lines ? lines : 1, sizeof(int));
    a->list = calloc(lines ? lines : 1, sizeof(action *));
    int *cap = calloc(lines ? lines : 1, sizeof(int));
    rp_status st = !a->count || !a->list || !cap ? rp_fail(err, RP_ERR_NOMEM, "out of memory")
                                                 : RP_OK;
    a->stages = a->micro_batches = -1; /* the largest seen, until the end */
    size_t at = 0;
    for (int r = 0; !st && at < len; r++) {
        size_t end = at;
        while (end < len && text[end] != '\n')
            end++;
        size_t line_end = end > at && text[end - 1] == '\r' ? end - 1 : end;
        a->ranks = r + 1;
        for (size_t c0 = at, col = 1; !st && c0 <= line_end; col++) {
            size_t c1 = c0;
            while (c1 < line_end && text[c1] != ',')
                c1++;
            size_t b = c0, e = c1; /* the cell, trimmed */
            while (b < e && (text[b] == ' ' || text[b] == '\t'))
                b++;
            while (e > b && (text[e - 1] == ' ' || text[e - 1] == '\t'))
                e--;
            st = parse_cell(a, r, &cap[r], text + b, e - b, col, name, err);
            c0 = c1 + 1;
        }
        at = end + 1;
    }
    free(cap);
    if (!st)
        st = sizes(a, name, err);
    if (!st)
        st = check(a, name, err);
    if (st) {
        rp_sim_actions_free(a);
        return st;
    }
    *out = a;
    return RP_OK;
}

/* A message's time from stage s to its neighbour t: none on one rank. */
static double hop(const rp_sim_actions *a, const rpi_cluster *net, int s, int t, double bytes) {
    int rs = a->rank_of[s], rt = a->rank_of[t];
    return rs == rt ? 0 : net->latency + bytes / net->bw[rpi_level_of(net, rs, rt)];
}

/* The replay's state: each rank's next action and when it is free, what
** each micro-batch's passes finished at (-1: not yet). */
typedef struct replay {
    const rp_sim_actions *a;
    const rpi_cluster *net;
    const rpi_stage_costs *c;
    double *done_f, *done_b, *free_at, end;
    int *pc, *held;
} replay;

/* Rank r's next action, where what it waits for is done: its event added
** to res. False where it must wait. */
static bool play_next(replay *p, int r, rp_sim_result *res) {
    const rp_sim_actions *a = p->a;
    const rpi_stage_costs *c = p->c;
    int S = a->stages, M = a->micro_batches;
    action x = a->list[r][p->pc[r]];
    size_t k = (size_t)x.stage * M + x.mb;
    double ready = p->free_at[r], t = 0;
    int kind = RP_OP_FORWARD;
    if (x.kind == ACT_F) {
        if (x.stage > 0) {
            double d = p->done_f[k - M];
            if (d < 0)
                return false;
            d += hop(a, p->net, x.stage - 1, x.stage, c->act[x.stage - 1]);
            ready = d > ready ? d : ready;
        }
        t = c->f[x.stage];
        if (++p->held[r] > res->in_flight[r])
            res->in_flight[r] = p->held[r];
    } else if (x.kind == ACT_W) {
        if (p->done_b[k] < 0) /* its B is earlier on this rank: only out of order */
            return false;
        t = c->bw[x.stage], kind = RP_OP_BACKWARD_WEIGHT;
        p->held[r]--;
    } else { /* B or I: the gradient from the next stage, or the loss */
        double d = x.stage < S - 1 ? p->done_b[k + M] : p->done_f[k];
        if (d < 0)
            return false;
        if (x.stage < S - 1)
            d += hop(a, p->net, x.stage + 1, x.stage, c->act[x.stage]);
        ready = d > ready ? d : ready;
        bool split = a->split[k];
        t = split ? c->bi[x.stage] : c->b[x.stage];
        kind = split ? RP_OP_BACKWARD_INPUT : RP_OP_BACKWARD;
        if (!split)
            p->held[r]--;
    }
    double t1 = ready + t;
    res->events[res->num_events++] = (rp_sim_event){r, kind, x.mb, ready, t1};
    res->busy[r] += t;
    p->free_at[r] = t1;
    p->end = t1 > p->end ? t1 : p->end;
    if (x.kind == ACT_F)
        p->done_f[k] = t1;
    else if (x.kind != ACT_W)
        p->done_b[k] = t1;
    p->pc[r]++;
    return true;
}

/* Fails naming each rank's action that waits, where some rank did not
** finish its list. */
static rp_status stuck(const replay *p, rp_error *err) {
    const rp_sim_actions *a = p->a;
    char what[512];
    size_t at = 0;
    for (int q = 0; q < a->ranks && at < sizeof what - 64; q++)
        if (p->pc[q] < a->count[q]) {
            action x = a->list[q][p->pc[q]];
            at += (size_t)snprintf(what + at, sizeof what - at, "%srank %d at %d%c%d",
                                   at ? ", " : "", q, x.stage, "FBIW"[x.kind], x.mb);
        }
    if (!at)
        return RP_OK;
    return rp_fail(err, RP_ERR_INVALID, "the schedule waits for ever: %s (each waits for an "
                   "action that comes later on its rank or another)", what);
}

/* The result's arrays: an event an action, a figure a rank. */
static bool result_arrays(const rp_sim_actions *a, rp_sim_result *res) {
    int total = 0, R = a->ranks;
    for (int r = 0; r < R; r++)
        total += a->count[r];
    res->events = malloc(sizeof(rp_sim_event) * (total ? total : 1));
    res->busy = calloc(R, sizeof(double));
    res->in_flight = calloc(R, sizeof(int));
    res->stage_of = malloc(sizeof(int) * R);
    return res->events && res->busy && res->in_flight && res->stage_of;
}

/* An update of `end` seconds on R ranks: each rank's busy share, and the
** bubble. */
static void finish(rp_sim_result *res, int R, int S, int levels, double end) {
    double busy = 0;
    res->update_time = end;
    res->workers = R;
    res->stages = S;
    res->num_levels = levels;
    for (int r = 0; r < R; r++) {
        busy += res->busy[r];
        res->busy[r] = end > 0 ? res->busy[r] / end : 0;
    }
    res->bubble_fraction = end > 0 ? 1 - busy / (R * end) : 0;
}

rp_status rp_simulate_actions(const rp_config *cfg, const rp_sim_actions *a,
                              const double *fwd_ms, const double *bwd_ms,
                              const double *out_bytes, const double *param_bytes, int num_layers,
                              const rp_sim_options *opt, rp_sim_result *res, rp_error *err) {
    memset(res, 0, sizeof *res);
    int counts[RP_MAX_STAGES], S = a->stages, M = a->micro_batches, R = a->ranks;
    rp_status st = rp_config_stage_layers(cfg, false, num_layers, counts, err);
    if (st)
        return st;
    rp_derived d;
    rp_config_derive(cfg, &d);
    if (d.stages != S)
        return rp_fail(err, RP_ERR_INVALID, "the schedule has %d stages and the configuration "
                       "%d: its layers_per_stage needs one entry a stage", S, d.stages);
    rpi_cluster net;
    if ((st = rpi_cluster_make(opt, R, &net, err)))
        return st;
    rpi_stage_costs c;
    rpi_stage_costs_make(cfg, counts, S, fwd_ms, bwd_ms, out_bytes, param_bytes, num_layers, opt,
                         &c);
    size_t cells = (size_t)S * M;
    replay p = {.a = a, .net = &net, .c = &c, .done_f = malloc(sizeof(double) * cells),
                .done_b = malloc(sizeof(double) * cells), .free_at = calloc(R, sizeof(double)),
                .pc = calloc(R, sizeof(int)), .held = calloc(R, sizeof(int))};
    if (!p.done_f || !p.done_b || !p.pc || !p.held || !p.free_at || !result_arrays(a, res))
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory for the simulation of %d ranks", R);
    if (!st) {
        for (size_t i = 0; i < cells; i++)
            p.done_f[i] = p.done_b[i] = -1;
        for (int r = 0; r < R; r++)
            res->stage_of[r] = S;
        for (int s = S - 1; s >= 0; s--)
            res->stage_of[a->rank_of[s]] = s;
        for (bool moved = true; moved;) {
            moved = false;
            for (int r = 0; r < R; r++)
                while (p.pc[r] < a->count[r] && play_next(&p, r, res))
                    moved = true;
        }
        st = stuck(&p, err);
    }
    free(p.done_f), free(p.done_b), free(p.pc), free(p.held), free(p.free_at);
    if (st) {
        rp_sim_result_free(res);
        return st;
    }
    finish(res, R, S, net.levels, p.end);
    return RP_OK;
}

rp_status rp_schedule_csv(const rp_config *cfg, char **out, rp_error *err) {
    *out = NULL;
    if (cfg->replication_factor > 1 || cfg->device_iterations > 1)
        return rp_fail(err, RP_ERR_INVALID, "a schedule CSV holds one pipeline and one update: "
                       "replication_factor and device_iterations must be 1");
    for (int s = 0; s < cfg->stage_replication_count; s++)
        if (cfg->stage_replication[s] > 1)
            return rp_fail(err, RP_ERR_INVALID, "a schedule CSV has one rank a stage: no stage "
                           "replication (stage %d has %d)", s, cfg->stage_replication[s]);
    if (cfg->schedule >= RP_SCHEDULE_PIPEDREAM)
        return rp_fail(err, RP_ERR_INVALID, "a schedule CSV holds the schedules that end an "
                       "update with every backward done: gpipe, 1f1b, zb-h1, zb-h2, zb-auto");
    if (cfg->schedule == RP_SCHEDULE_INTERLEAVED) /* a rank a device, its chunks' passes */
        return rp_schedule_csv_interleaved(cfg->layers_per_stage.count / cfg->virtual_stages,
                                           cfg->virtual_stages,
                                           cfg->gradient_accumulation_steps, out, err);
    rp_workplan *plan;
    rp_status st = rp_workplan_build(cfg, &plan, err);
    if (st)
        return st;
    size_t cap = 64, n = 0;
    for (int w = 0; w < plan->workers; w++)
        cap += (size_t)plan->w[w].num_ops * 16 + 2;
    char *s = malloc(cap);
    if (!s) {
        rp_workplan_free(plan);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    /* a row a rank: a worker's operations, or a device's (zb-v) */
    int rows = plan->devices ? plan->devices : plan->workers;
    for (int row = 0; row < rows; row++) {
        const rp_device_ops *dv = plan->devices ? &plan->dev[row] : NULL;
        int num = dv ? dv->num : plan->w[row].num_ops;
        bool first = true;
        for (int j = 0; j < num; j++) {
            const rp_worker_ops *wo = &plan->w[dv ? dv->worker[j] : row];
            int i = dv ? dv->op[j] : j;
            char k;
            switch (wo->ops[i].kind) {
            case RP_OP_FORWARD: k = 'F'; break;
            case RP_OP_BACKWARD: k = 'B'; break;
            case RP_OP_BACKWARD_INPUT: k = 'I'; break;
            case RP_OP_BACKWARD_WEIGHT: k = 'W'; break;
            default: continue; /* transfers, the reduction and the step: derived */
            }
            n += (size_t)snprintf(s + n, cap - n, "%s%d%c%d", first ? "" : ",", wo->stage, k,
                                  wo->ops[i].mb);
            first = false;
        }
        s[n++] = '\n';
    }
    s[n] = '\0';
    rp_workplan_free(plan);
    *out = s;
    return RP_OK;
}

/* Megatron-LM's interleaved 1F1B (Narayanan et al., SC'21), in the order of
** rp_interleaved_order (schedule.h): rank r holds chunks c = 0 .. v-1 as
** stages c P + r. Its bubble is (P - 1) / v of one micro-batch's forward
** and backward through the rank's chunks. As
** forward_backward_pipelining_with_interleaving in Megatron-LM's
** megatron/core/pipeline_parallel/schedules.py orders them. */
rp_status rp_schedule_csv_interleaved(int P, int v, int m, char **out, rp_error *err) {
    *out = NULL;
    if (P < 1 || v < 2 || m < 1 || (long long)P * v > RP_MAX_STAGES || m % P || m > 65536)
        return rp_fail(err, RP_ERR_INVALID, "interleaved 1F1B: %d ranks, %d chunks a rank, %d "
                       "micro-batches: needs 2 chunks or more, at most %d stages, and "
                       "micro-batches a multiple of the ranks", P, v, m, RP_MAX_STAGES);
    int total = 2 * m * v;
    size_t cap = (size_t)P * total * 16 + 2 * (size_t)P + 1, n = 0;
    char *s = malloc(cap);
    int *stage = malloc(sizeof(int) * total), *mb = malloc(sizeof(int) * total);
    bool *fwd = malloc(sizeof(bool) * total);
    if (!s || !stage || !mb || !fwd) {
        free(s), free(stage), free(mb), free(fwd);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    for (int r = 0; r < P; r++) {
        rp_interleaved_order(P, v, m, r, stage, fwd, mb);
        for (int i = 0; i < total; i++)
            n += (size_t)snprintf(s + n, cap - n, "%s%d%c%d", i ? "," : "", stage[i],
                                  fwd[i] ? 'F' : 'B', mb[i]);
        s[n++] = '\n';
    }
    free(stage), free(mb), free(fwd);
    s[n] = '\0';
    *out = s;
    return RP_OK;
}
