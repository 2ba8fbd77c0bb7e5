/*
** The engine's planner's dynamic programme (autoplan.c says what it
** minimises): for every shape of the run, the stages, their replication
** and each stage's recomputation by layer that make the busiest stage, or
** a micro-batch's round trip, the least; each shape's best plan for every
** number of stages pushed as a candidate with its estimate, sorted by it.
*/
#include <float.h>
#include <limits.h>
#include <stdlib.h>

#include "autoplan_impl.h"

bool rpi_plan_exhaustive = false;

/* A candidate pushed; S->top keeps the least `candidates` estimates of all
** (the most of them first once full), those simulated whatever else. */
static bool push(search *S, const cand *k) {
    if (S->n == S->cap) {
        int cap = S->cap ? 2 * S->cap : 64;
        cand *c = realloc(S->c, sizeof(cand) * cap);
        if (!c)
            return false;
        S->c = c;
        S->cap = cap;
    }
    S->c[S->n] = *k;
    S->c[S->n].ord = S->ord;
    S->c[S->n].seq = S->n;
    S->n++;
    int want = S->o->candidates;
    if (S->ntop < want)
        S->top[S->ntop++] = k->estimate;
    else if (want > 0 && k->estimate < S->top[0])
        S->top[0] = k->estimate;
    else
        return true;
    for (int i = 1; i < S->ntop; i++) /* the most first again */
        if (S->top[i] > S->top[0]) {
            double t = S->top[0];
            S->top[0] = S->top[i], S->top[i] = t;
        }
    return true;
}

/* Whether a shape of R replicas of per workers at accumulation GA cannot
** make a candidate that is simulated: every candidate's estimate is at
** least its busiest stage, which is at least the shape's work shared
** evenly over its workers at the fastest device's pace, and that is past
** the `candidates` least estimates already pushed. Shapes simulated
** whatever their estimates (one worker a replica) and those whose workers
** tensor groups fill (tensor_shapes tries their best) are always planned,
** so the plans chosen are the same as without this. */
static bool cannot_place(const search *S, int R, int per, int GA, int W) {
    const rp_autoplan_options *o = S->o;
    if (per == 1 || o->candidates <= 0 || S->ntop < o->candidates || rpi_plan_exhaustive)
        return false;
    for (int t = 2; t <= 8 && o->tensor_split && o->num_levels > 0; t *= 2)
        if (R * per * t == W)
            return false;
    double B = (double)(o->global_batch / ((long long)R * GA));
    const measured *M = &S->m[rpi_plan_nearest(S, B)];
    double fastest = 1;
    for (int w = 0; o->device_speed && w < W; w++)
        fastest = w == 0 || o->device_speed[w] > fastest ? o->device_speed[w] : fastest;
    double work = GA * (M->cf[S->L] + M->cb[S->L]) * (B / M->batch) / fastest;
    return work / per > S->top[0];
}

/* The programme for one shape; pushes its best plan for every number of
** stages up to RP_AUTOPLAN_STAGES (fewer stages, fewer messages: the
** programme's bottleneck does not see them, the estimate and the
** simulation do). best[p][i][k]: the busiest stage of layers i..L-1 in p
** stages on k workers. */
#define AT(p, i, k) ((((size_t)(p) * (L + 1)) + (i)) * W1 + (k))

/* The least of v over a stage's devices: workers off .. off + r - 1 of each
** of the R replicas of per workers. */
static double stage_least(const double *v, int R, int per, int off, int r) {
    double least = DBL_MAX;
    for (int q = 0; q < R; q++)
        for (int i = off; i < off + r; i++)
            least = v[q * per + i] < least ? v[q * per + i] : least;
    return least;
}

/* How much longer a stage's passes take than the profile's: its
** micro-batches dealt round-robin, the slowest device sets the pace. */
static double stage_slowness(const search *S, int R, int per, int off, int r) {
    return S->o->device_speed ? 1 / stage_least(S->o->device_speed, R, per, off, r) : 1;
}

/* The bytes a worker of the stage may hold: the least of its devices' (0:
** no limit). */
static double stage_memory(const search *S, int R, int per, int off, int r) {
    return S->o->device_memory ? stage_least(S->o->device_memory, R, per, off, r)
                               : S->o->memory_size;
}

/* One shape the programme plans: R replicas of per workers, GA
** micro-batches of B samples an update, priced from profile prof (M)
** scaled to B rows, with recomputation and sharding as asked; PM stages at
** most. */
typedef struct shape {
    int R, per, GA, B, prof, PM;
    const measured *M;
    double scale;
    bool recompute, shard;
    int rungs; /* recomputation by layer: rungs 0 .. rungs - 1 (1: none) */
    rp_config cfg;
    rp_sim_options sim; /* the search's, with what the profile says its layers keep */
} shape;

/* Seconds a micro-batch's activation at cut j takes one way, sent from
** worker w of a replica to worker w + 1 (fp16 exchange halves it). */
static double cut_seconds(const search *S, const shape *h, int j, int w) {
    double wire = S->base->fp16_exchange ? 0.5 : 1.0;
    int l = rpi_level_of(&S->net, w, w + 1);
    return S->net.latency + h->M->cut[j] * h->scale * wire / S->net.bw[l];
}

/* Stage i..j-1's passes of a micro-batch on the profile's device (its
** forward twice where every layer is recomputed), and, on r of the k
** workers left, *slow (how much longer its devices take) and *fixed
** (seconds an update: the reduction, the step). */
static double stage_passes(const search *S, const shape *h, int i, int j, int k, int r,
                           double *slow, double *fixed) {
    const measured *M = h->M;
    double f = (M->cf[j] - M->cf[i]) * h->scale;
    double t = f + (M->cb[j] - M->cb[i]) * h->scale;
    if (h->cfg.recompute_checkpoint_every_layer)
        t += f;
    double par = M->cp[j] - M->cp[i];
    /* this stage's workers: offset per - k in every replica */
    int off = h->per - k;
    int top = rpi_level_of(&S->net, off, (h->R - 1) * h->per + off + r - 1);
    *slow = stage_slowness(S, h->R, h->per, off, r);
    *fixed = rpi_allreduce_time(h->R * r, par, S->net.bw[top], S->net.latency) +
             par / S->sim.memory_bandwidth * *slow;
    return t;
}

/* A stage's busiest worker: its share of the GA micro-batches, each of
** passes seconds on a profile's device, and the fixed seconds. */
static double stage_busy(const shape *h, double passes, int r, double slow, double fixed) {
    return (double)((h->GA + r - 1) / r) * passes * slow + fixed;
}

/* Stage i..j-1 on r of the k workers left, under the rest's best: its
** busiest time (a worker's micro-batches, the reduction, the step), or
** DBL_MAX where it does not fit the memory or beat best. acc: for each
** rung of recomputation by layer, layers i..j-2 pushed, so that a stage's
** bytes cost a layer's work, not the stage's (a T5's 821 operators: 20 s a
** shape before); *rung: the least that fits.
**
** A micro-batch's round trip bounds the pace too: with `inflight` of them
** in the stages from here on, each must come back through every stage
** after this one, and the messages both ways, before the next can start
** (*loop: that trip, for the stage before). A stage cut where a large
** tensor crosses (an attention's scores) costs every micro-batch its
** transfer twice, though no stage is busier. */
static double stage_cost(const search *S, const shape *h, int i, int j, int k, int r, double rest,
                         double loop_rest, double best, const rpi_stage_acc *acc, int *rung,
                         double *loop) {
    const measured *M = h->M;
    int GA = h->GA, off = h->per - k;
    double slow, fixed, t = stage_passes(S, h, i, j, k, r, &slow, &fixed);
    double cap = stage_memory(S, h->R, h->per, off, r);
    int inflight = k < GA ? k : GA, slots = (inflight + r - 1) / r;
    double trip = loop_rest; /* and the activation out and its gradient back: */
    if (j < S->L)
        trip += 2 * cut_seconds(S, h, j, off + r - 1);
    for (int q = 0; q < h->rungs; q++) { /* each rung recomputes more than the last */
        double again = q ? (M->crf[q][j - 1] - M->crf[q][i]) * h->scale : 0;
        double cost = stage_busy(h, t + again, r, slow, fixed);
        double round = (double)GA / inflight * ((t + again) * slow + trip);
        double m = cost > rest ? cost : rest;
        m = round > m ? round : m;
        if (m >= best)
            return DBL_MAX;
        /* the last rung names every layer the others do (rung 0 none, where
        ** the base names none): where what it keeps outside its runs is too
        ** much, no rung fits */
        if (q == 0 && cap > 0 && h->rungs > 1 && h->cfg.recompute_layers_count == 0 &&
            !rpi_plan_exhaustive &&
            rpi_stage_acc_least(&acc[h->rungs - 1], r, slots, h->scale) > cap)
            return DBL_MAX;
        if (cap > 0 && rpi_stage_acc_bytes(&acc[q], r, slots, h->scale) > cap)
            continue;
        *rung = q;
        *loop = (t + again) * slow + trip;
        return m;
    }
    return DBL_MAX;
}

/* Whether stage i..j-1 on k workers left, and so every longer stage, cannot
** beat best: its passes alone, on as many replicas as it may take and at
** the pace of its fastest device, take longer. */
static bool longer_loses(const search *S, const shape *h, int i, int j, int k, int rtop,
                         double best) {
    if (best == DBL_MAX)
        return false;
    const measured *M = h->M;
    double f = (M->cf[j] - M->cf[i]) * h->scale;
    double t = f + (M->cb[j] - M->cb[i]) * h->scale; /* (as stage_cost sums it) */
    int off = h->per - k;
    return (double)((h->GA + rtop - 1) / rtop) * t * stage_slowness(S, h->R, h->per, off, 1) >=
           best;
}

/* Row j of the stage memory's running sums for stages from layer i: each
** rung's accumulator with layers i..j-2 pushed (row i + 1 begun), made
** from row j - 1. They depend on the stages' first and last layers alone,
** so one row serves every number of stages and workers. */
static void stage_sums(search *S, const shape *h, int i, int j) {
    rpi_stage_acc *a = S->sums + (size_t)j * (RPI_RUNGS + 1);
    for (int q = 0; q < h->rungs; q++) {
        if (j == i + 1) {
            rpi_stage_acc_begin(&a[q], q ? &S->rung_cfg[q] : &h->cfg, h->M->out, h->M->par, i,
                                &h->sim);
            continue;
        }
        a[q] = a[q - (RPI_RUNGS + 1)];
        rpi_stage_acc_push(&a[q]); /* layer j - 2 */
    }
}

/* Whether stage i..j-1 on r replicas, slots micro-batches in flight, may
** fit cap bytes by what every rung holds: the weights, their gradients and
** state, and what the layers kept outside the last rung's runs (rung 0
** names none, where the base names none; else the weights alone). That
** grows with every layer, so where it fails no longer stage fits: each
** (i, r, slots, cap) keeps in a small cache how far it fits and where it
** stops, the layers read once; made: rows i + 1 .. *made of the running
** sums, made as far as j. */
static bool may_fit(search *S, const shape *h, int i, int j, int r, int slots, double cap,
                    int *made) {
    bool acts = (h->rungs == 1 || h->cfg.recompute_layers_count == 0) && !rpi_plan_exhaustive;
    rpi_fit_stop *e = &S->stops[((unsigned)r * 31u + (unsigned)slots) % RPI_FIT_STOPS];
    if (e->gen != S->stop_gen || e->r != r || e->slots != slots || e->cap != cap)
        *e = (rpi_fit_stop){.gen = S->stop_gen, .r = r, .slots = slots, .fits = i,
                            .stop = S->L + 1, .cap = cap};
    for (; e->fits < j && e->stop > S->L; e->fits++) {
        int at = e->fits + 1;
        for (; *made < at; (*made)++)
            stage_sums(S, h, i, *made + 1);
        const rpi_stage_acc *row = &S->sums[(size_t)at * (RPI_RUNGS + 1)];
        if (acts ? rpi_stage_acc_held(&row[h->rungs - 1], r, slots, h->scale) > cap
                 : rpi_stage_acc_held(&row[0], r, 0, 0) > cap)
            e->stop = at;
    }
    return j < e->stop;
}

/* Cell best[p][i][k]: stage i..j-1 on r workers before the best of the
** rest, over every cut j and r. The cells of p - 1 stages read are those
** of later layers, already made; made: rows i + 1 .. *made of the running
** sums. One stage reads only the end (j = L): the longer stages it passes
** lose as it would. */
static void fill_cell(search *S, const shape *h, int p, int i, int k, int rmax, int *made) {
    int L = S->L, per = h->per, W1 = per + 1;
    double *b = &S->best[AT(p, i, k)];
    int rtop = k - (p - 1) < rmax ? k - (p - 1) : rmax;
    double cap1 = stage_memory(S, h->R, per, per - k, 1);
    int inflight = k < h->GA ? k : h->GA, least = (inflight + rtop - 1) / rtop;
    for (int j = p == 1 ? L : i + 1; j <= L - (p - 1); j++) {
        if (longer_loses(S, h, i, j, k, rtop, *b) ||
            (cap1 > 0 && !may_fit(S, h, i, j, rtop, least, cap1, made)))
            break; /* (nor can any longer stage) */
        for (; *made < j; (*made)++)
            stage_sums(S, h, i, *made + 1);
        const rpi_stage_acc *acc = S->sums + (size_t)j * (RPI_RUNGS + 1);
        if (j < L && S->o->cuts && !S->o->cuts[j])
            continue; /* (a cut the trainer cannot make) */
        size_t below = (size_t)(p - 1) * (L + 1) + j;
        int r0 = k - S->kmax[below] > 1 ? k - S->kmax[below] : 1;
        int r1 = k - S->kmin[below] < rtop ? k - S->kmin[below] : rtop;
        for (int r = r0; r <= r1; r++) {
            double rest = S->best[AT(p - 1, j, k - r)]; /* finite: stages fill k */
            if (rest == DBL_MAX || (rest >= *b && !rpi_plan_exhaustive))
                continue; /* (none, or the rest alone loses) */
            int rung = 0;
            double loop = 0;
            double m = stage_cost(S, h, i, j, k, r, rest, S->loop[AT(p - 1, j, k - r)], *b, acc,
                                  &rung, &loop);
            if (m == DBL_MAX)
                continue;
            *b = m;
            S->loop[AT(p, i, k)] = loop;
            S->cut[AT(p, i, k)] = j;
            S->rep[AT(p, i, k)] = r;
            S->rung[AT(p, i, k)] = (unsigned char)rung;
        }
    }
}

/* The programme's table: best[p][i][k], the busiest stage of layers
** i..L-1 in p stages on k workers, with the cut and the replicas that make
** it. A cell reads the cells of one stage fewer from later layers, so the
** layers are the outer loop: each first layer's running sums are made
** once, as far as any cell reads them. kmin and kmax hold each row's
** least and most workers with a plan (a cell reads only those of the row
** below), rows[p] how many rows of p stages hold one: a row of p stages
** holds none while no later row of p - 1 does. */
static void fill_table(search *S, const shape *h) {
    int L = S->L, per = h->per, W1 = per + 1, GA = h->GA;
    for (size_t x = 0; x < AT(h->PM + 1, 0, 0); x++)
        S->best[x] = DBL_MAX;
    S->best[AT(0, L, 0)] = 0;
    S->loop[AT(0, L, 0)] = 0;
    for (size_t x = 0; x < (size_t)(h->PM + 1) * (L + 1); x++)
        S->kmin[x] = INT_MAX, S->kmax[x] = -1;
    S->kmin[L] = S->kmax[L] = 0;
    int rows[RP_AUTOPLAN_STAGES + 1] = {1};
    int rmax = S->o->one_worker_a_stage ? 1 : GA;
    for (int i = L - 1; i >= 0; i--) {
        int made = i;
        S->stop_gen++; /* (the cache's stops are this first layer's) */
        for (int p = 1; p <= h->PM; p++) {
            if (!rows[p - 1])
                continue;
            size_t row = (size_t)p * (L + 1) + i;
            for (int k = p; k <= per; k++) {
                if ((long long)p * rmax < k)
                    continue; /* (p stages of rmax workers at most cannot fill k) */
                fill_cell(S, h, p, i, k, rmax, &made);
                if (S->best[AT(p, i, k)] < DBL_MAX) {
                    S->kmin[row] = k < S->kmin[row] ? k : S->kmin[row];
                    S->kmax[row] = k > S->kmax[row] ? k : S->kmax[row];
                }
            }
            rows[p] += S->kmax[row] >= 0;
        }
    }
}

/* The table's plan of P stages as a candidate, with its estimate: the
** busiest stage, plus a micro-batch through the others and the messages
** between them (fill and drain); or the table's pace where a micro-batch's
** round trip set it, which holds the fill already (a plan of one
** micro-batch is its trip, not twice it). */
static cand unfold_plan(const search *S, const shape *h, int P) {
    int L = S->L, per = h->per, W1 = per + 1;
    const measured *M = h->M;
    cand c = {.R = h->R, .per = per, .GA = h->GA, .B = h->B, .recompute = h->recompute,
              .shard = h->shard, .P = P, .prof = h->prof};
    double sum = 0, most = 0, busiest = 0;
    for (int p = P, i = 0, k = per; p > 0; p--) {
        int j = S->cut[AT(p, i, k)], r = S->rep[AT(p, i, k)], q = S->rung[AT(p, i, k)];
        c.layers[P - p] = j - i;
        c.reps[P - p] = r;
        c.rung[P - p] = q;
        double slow, fixed, passes = stage_passes(S, h, i, j, k, r, &slow, &fixed);
        double again = q ? (M->crf[q][j - 1] - M->crf[q][i]) * h->scale : 0;
        double busy = stage_busy(h, passes + again, r, slow, fixed);
        busiest = busy > busiest ? busy : busiest;
        double t = (M->cf[j] - M->cf[i] + M->cb[j] - M->cb[i]) * h->scale * slow;
        sum += t;
        most = t > most ? t : most;
        if (j < L) { /* the activation out and its gradient back, at the level they cross */
            sum += 2 * cut_seconds(S, h, j, per - k + r - 1);
        }
        i = j, k -= r;
    }
    double pace = S->best[AT(P, 0, per)];
    c.estimate = busiest + sum - most > pace ? busiest + sum - most : pace;
    return c;
}

static bool programme(search *S, int R, int per, int GA, bool recompute, bool shard,
                      bool by_layer) {
    int L = S->L, W1 = per + 1;
    shape h = {.R = R, .per = per, .GA = GA, .recompute = recompute, .shard = shard,
               .PM = per < RP_AUTOPLAN_STAGES ? per : RP_AUTOPLAN_STAGES,
               .rungs = by_layer ? RPI_RUNGS + 1 : 1};
    if (h.PM > L)
        h.PM = L;
    if (S->o->pipeline_stages > 0 && h.PM > S->o->pipeline_stages)
        h.PM = S->o->pipeline_stages; /* (the table's rows past it are never read) */
    h.B = (int)(S->o->global_batch / ((long long)R * GA));
    h.prof = rpi_plan_nearest(S, h.B);
    h.M = &S->m[h.prof];
    h.scale = h.B / h.M->batch;
    h.cfg = *S->base;
    h.cfg.recompute_checkpoint_every_layer = S->base->recompute_checkpoint_every_layer || recompute;
    h.cfg.replicated_tensor_sharding = S->base->replicated_tensor_sharding || shard;
    h.cfg.replica_grouping = rp_grouping_all(R);
    /* what the layers keep as the simulation counts it (rpi_plan_simulate_as_is) */
    h.sim = S->sim;
    if (rp_config_tensor_parallel(&h.cfg) == 1)
        rp_sim_options_memory(&h.sim, h.M->mem);
    for (int q = 1; q < h.rungs; q++) {
        S->rung_cfg[q] = h.cfg;
        rpi_rungs_config(h.M, q, L, &S->rung_cfg[q]);
    }
    fill_table(S, &h);
    for (int P = 1; P <= h.PM; P++) {
        if (S->best[AT(P, 0, per)] == DBL_MAX)
            continue; /* nothing fits */
        if (S->o->pipeline_stages > 0 && P != S->o->pipeline_stages)
            continue;
        cand c = unfold_plan(S, &h, P);
        if (!push(S, &c))
            return false;
    }
    return true;
}

/* By estimate; equal ones in the order the shapes were enumerated and
** pushed (a stable sort of that order, whatever qsort's own). */
static int by_estimate(const void *a, const void *b) {
    const cand *p = a, *q = b;
    if (p->estimate != q->estimate)
        return p->estimate < q->estimate ? -1 : 1;
    if (p->ord != q->ord)
        return p->ord < q->ord ? -1 : 1;
    return (p->seq > q->seq) - (p->seq < q->seq);
}

/* Whether a candidate of the shape's, from the first'th on, recomputes no
** layer. */
static bool pushed_plain(const search *S, int first) {
    for (int i = first; i < S->n; i++)
        if (!rpi_cand_by_layer(&S->c[i]))
            return true;
    return false;
}

/* One shape's stages at accumulation GA: where memory is short, the
** savings the engine has, cheapest first: sharding the optimizer state
** over a stage's workers (its reduction becomes a reduce-scatter and a
** gather, as much traffic), then recomputation of every layer, then both.
** Recomputation by layer (a second forward of the layers that save the
** most, stage by stage) goes with the steps that do not recompute every
** layer: its lowest rung names nothing, so a stage that fits only cut
** short (a first stage of 1F1B, with the most micro-batches in flight)
** may instead recompute a few layers and leave the others less to do. Its
** plans that recompute nothing end the ladder there, as nothing saved did;
** those that recompute some go on to sharding beside them. */
static rp_status shape_ladder(search *S, int R, int per, int GA, bool saves_shard,
                              rp_error *err) {
    static const bool ladder[4][2] = {{false, false}, {false, true}, {true, false},
                                      {true, true}};
    const rp_autoplan_options *o = S->o;
    bool bounded = o->memory_size > 0 || o->device_memory;
    int before = S->n;
    for (int q = 0; q < 4; q++) {
        bool rc = ladder[q][0], sh = ladder[q][1], bl = bounded && S->rung_cfg && !rc;
        if (q > 0 && !bounded)
            break;
        if ((rc && S->base->recompute_checkpoint_every_layer) || (sh && !saves_shard))
            continue; /* already on, or saves nothing */
        int from = S->n;
        if (!programme(S, R, per, GA, rc, sh, bl))
            return rp_fail(err, RP_ERR_NOMEM, "out of memory for the engine's planner");
        if (q == 0 && bl ? pushed_plain(S, from) : S->n > before)
            break;
    }
    return RP_OK;
}

/* The accumulation an exact micro-batch makes on R replicas (N samples an
** update), or 0 where it does not split them evenly or is past an int. */
int rpi_exact_accumulation(const rp_autoplan_options *o, long long N, int R) {
    if (N % R || (N / R) % o->micro_batch)
        return 0;
    long long GA = N / R / o->micro_batch;
    return GA <= INT_MAX ? (int)GA : 0;
}

/* Every shape: workers per replica, replicas, accumulation (up to
** max_accumulation; with an exact micro-batch, the one it makes, however
** many micro-batches that is), each through shape_ladder. Each shape's
** stages come from the programme; *too_big: shapes passed over, their
** micro-batches beyond an int. */
static rp_status enumerate_shapes(search *S, int W, bool *too_big, rp_error *err) {
    const rp_autoplan_options *o = S->o;
    const rp_config *base = S->base;
    long long N = o->global_batch;
    bool saves_shard = !o->no_sharding && !base->replicated_tensor_sharding && W > 1 &&
                       rp_optimizer_state_per_param(&base->optimizer) != 0 &&
                       base->reduction_bucket_mb <= 0; /* (buckets refuse sharding) */
    *too_big = false;
    rp_status st = RP_OK;
    /* the shapes of every worker first, then the others, which the first
    ** mostly outrun (cannot_place); each keeps its place in the one order
    ** (ord), which sorts the candidates of equal estimates */
    for (int pass = 0; pass < 2; pass++) {
        int ord = 0;
        for (int per = 1; per <= W && per <= S->L; per++)
            for (int R = 1; !st && R * per <= W; R++) {
                if (per < o->pipeline_stages || N % R)
                    continue; /* (fewer workers than the stages asked for) */
                if (o->one_worker_a_stage && o->pipeline_stages && per != o->pipeline_stages)
                    continue; /* (a worker a stage: as many workers as stages) */
                bool now = (R * per == W) == (pass == 0);
                if (o->micro_batch > 0) {
                    int GA = rpi_exact_accumulation(o, N, R);
                    S->ord = ord++;
                    if (GA && now && !cannot_place(S, R, per, GA, W))
                        st = shape_ladder(S, R, per, GA, saves_shard, err);
                    continue;
                }
                int most = rpi_accumulation_cap(S, N, R);
                for (int GA = 1; !st && GA <= most && GA <= N / R; GA++) {
                    if ((N / R) % GA)
                        continue;
                    if (N / R / GA > INT_MAX) { /* a micro-batch is an int of samples */
                        *too_big = true;
                        continue;
                    }
                    S->ord = ord++;
                    if (now && N / R / GA >= o->min_micro_batch &&
                        !cannot_place(S, R, per, GA, W))
                        st = shape_ladder(S, R, per, GA, saves_shard, err);
                }
            }
    }
    return st;
}

/* The shapes of one profile set: read, every shape's stages by the
** programme (on W workers, as o lays them out), sorted by estimate (none
** where none runs; *too_big: micro-batches past an int passed over). */
rp_status rpi_plan_programme(search *S, const rp_profile *const *ps, const double *bs, int n,
                             int W, bool *too_big, rp_error *err) {
    rp_status st = RP_OK;
    while (!st && S->nm < n)
        st = rpi_plan_read_profile(S, ps[S->nm], bs[S->nm], err);
    if (!st)
        st = rpi_plan_prepare(S, W, err);
    if (!st)
        st = enumerate_shapes(S, W, too_big, err);
    if (!st && S->n) /* (S->c is NULL where nothing was pushed) */
        qsort(S->c, S->n, sizeof(cand), by_estimate);
    return st;
}
