/*
** Plans for a transformer on a cluster of devices: the search over tensor,
** context, pipeline and data-parallel sizes, micro-batch, chunks a rank,
** recomputation and sharding that 'repipe plan --cluster' runs.
**
** The engine's own planner (autoplan.c) searches stage replication and cuts
** worker by worker, which a cluster of thousands of devices makes too many.
** A transformer's blocks are alike, so here a shape is priced in closed
** form: its stages cut to balance them (the embedding and the head count
** where they fall); the pipeline's steady state, m - 1 micro-batches of the
** busiest rank, plus one pass through every stage (a v-th of it with v
** chunks a rank) and the transfers of the fill; the replicas' reduction,
** hidden behind the last backward where the run overlaps it, and the
** optimizer's pass over the rank's share. Memory is rp_transformer_rank_memory.
** The best few estimates that fit are then simulated (rp_simulate plays one
** pipeline's operation lists with its ranks' costs, the replicas' reduction
** included), and the fastest wins.
**
** Sequence parallelism is on wherever there is a tensor group (it splits
** the activations outside the products and moves the same bytes: never
** slower, never larger) unless asked off; the optimizer state is sharded
** wherever there are replicas (Megatron-LM's distributed optimizer: the
** same bytes on the wire, less held, a d-th of the optimizer's pass) unless
** asked otherwise, and FSDP is tried beside it.
*/
#include <float.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/planner.h"
#include "scale_impl.h"

void rp_scale_options_default(rp_scale_options *o) {
    memset(o, 0, sizeof *o);
    o->recompute = -1;
    o->sharding = -1;
    o->precision = RP_PRECISION_BF16;
    o->candidates = 4;
}

/* A shape under consideration. */
typedef struct cand {
    rp_transformer_run run;
    int p, d, v, m;
    bool dv; /* DualPipeV's V, chunks c and 2p - 1 - c on rank c */
    rp_sharding sharding;
    double estimate, memory;
} cand;

static int by_estimate(const void *a, const void *b) {
    double x = ((const cand *)a)->estimate, y = ((const cand *)b)->estimate;
    return x < y ? -1 : x > y;
}

/* A pass's cost (forward and backward, a recomputed forward too) of each
** kind of node. */
static void pass_costs(const rpi_xf_part *x, bool full, double cost[RPI_XF_PARTS]) {
    for (int k = 0; k < RPI_XF_PARTS; k++)
        cost[k] = x[k].f * (full && rpi_xf_is_block(k) ? 2 : 1) + x[k].bi + x[k].bw;
}

/* The blocks spread over C chunks as evenly as the embedding's and the
** head's costs allow: the first and the last chunk fewer blocks by what
** those take, the rest alike (one more in the first ones where they do not
** divide), so that the chunks' times and memories are alike; counts of the
** L + 2 layers. */
static void spread(const rp_transformer *m, const double cost[RPI_XF_PARTS], int C,
                   int *counts) {
    int L = m->layers;
    if (C == 1) {
        counts[0] = L + 2;
        return;
    }
    /* (a mixture's blocks and the dense ones, as their mean) */
    double moe = rp_transformer_moe_blocks(m);
    double e = cost[RPI_XF_EMBED], h = cost[RPI_XF_HEAD];
    double b = ((L - moe) * cost[RPI_XF_BLOCK] + moe * cost[RPI_XF_MOE]) / L;
    double target = (e + L * b + h) / C;
    int first = (int)fmax(0, floor((target - e) / b + 0.5));
    int last = (int)fmax(0, floor((target - h) / b + 0.5));
    if (C == 2) {
        first = first > L ? L : first;
        last = L - first;
    } else {
        first = first > L ? L : first;
        last = last > L - first ? L - first : last;
        while (L - first - last < C - 2) /* every chunk between holds a block */
            (first >= last ? first-- : last--);
    }
    int middle = L - first - last;
    counts[0] = first + 1, counts[C - 1] = last + 1;
    for (int c = 1; c < C - 1; c++)
        counts[c] = middle / (C - 2) + (c - 1 < middle % (C - 2));
}

/* Bytes a rank's parameters move in the replicas' reduction (bf16
** gradients, or FSDP's fp32 reduce-scatter and bf16 all-gather; in fp32,
** fp32 both) and the seconds of the optimizer's pass over them (30 bytes a
** parameter read and written: fp32 weight and two moments, the fp32
** gradient, the bf16 weight; 28 in fp32, which has no bf16 copy). */
static double ring_time(int n, double bytes, double bw, double latency) {
    return n > 1 ? 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * latency : 0;
}

/* The most any rank of shape k holds, its chunks as counts lay them;
** *params: the most parameters a rank holds; *busiest (unless NULL): that
** rank. */
static double shape_memory(const rp_transformer *m, const rpi_xf_part *x, const cand *k,
                           const int *counts, double *params, int *busiest) {
    rp_transformer_layout lay = {.p = k->p, .d = k->d, .v = k->dv ? 2 : k->v, .v_shape = k->dv,
                                 .micro_batches = k->m, .sharding = k->sharding};
    double most = 0;
    *params = 0;
    for (int r = 0; r < k->p; r++) {
        rp_transformer_memory mem;
        rpi_xf_rank_memory(m, &k->run, x, &lay, counts, r, &mem);
        if (mem.total > most && busiest)
            *busiest = r;
        most = fmax(most, mem.total);
        *params = fmax(*params, mem.parameters);
    }
    return most;
}

/* Where a balanced cut of a plain pipeline (a chunk a rank) does not fit,
** blocks move to later stages, one at a time from the rank that holds the
** most to the quickest stage after it, until it fits or the next move
** would empty a stage or leave the last: under 1F1B rank r keeps p - r
** micro-batches' activations, so a block moved later is kept fewer times,
** and where the stages' times were uneven by a block anyway the slowest
** stage, and so the step, may take no longer. Not under block
** recomputation, whose count is chosen for the cut, nor for Megatron-LM's
** even split. */
static void relieve(const rp_transformer *m, const rpi_xf_part *x,
                    const double cost[RPI_XF_PARTS], const cand *k, double memory, int *counts) {
    int C = k->p * (k->dv ? 2 : k->v);
    if (C != k->p || k->run.recompute == RP_RECOMPUTE_BLOCKS)
        return;
    double params;
    for (int moves = 0; moves < m->layers; moves++) {
        int r = 0, at = 0, to = -1;
        if (shape_memory(m, x, k, counts, &params, &r) <= memory || r == C - 1)
            return;
        double quickest = DBL_MAX;
        for (int c = 0; c < C; at += counts[c++]) {
            if (c == r && rpi_xf_blocks(at, at + counts[c], m->layers) < 2)
                return;
            double t = 0;
            for (int j = at; j < at + counts[c]; j++)
                t += cost[rpi_xf_kind(m, j)];
            if (c > r && t < quickest)
                quickest = t, to = c;
        }
        counts[r]--, counts[to]++;
    }
}

/* The chunks' layer counts of shape k: Megatron-LM's even split, or
** spread by the passes' costs (pass_costs') and relieved where that does
** not fit `memory`. */
static void cut(const rp_transformer *m, const rpi_xf_part *x, const double cost[RPI_XF_PARTS],
                const cand *k, bool even, double memory, int *counts) {
    int C = k->p * (k->dv ? 2 : k->v);
    if (even) {
        rpi_xf_split(m->layers, C, counts);
        return;
    }
    spread(m, cost, C, counts);
    relieve(m, x, cost, k, memory, counts);
}

static int imax(int a, int b) {
    return a > b ? a : b;
}

/* Under RP_RECOMPUTE_BLOCKS, the fewest blocks a chunk recomputes for
** shape k to fit `memory` (its time grows with them, its memory shrinks),
** set in k's run. False where no recomputation fits already or only every
** block does (the shapes of none and of full recomputation) unless blocks
** were asked for (`asked`), or where none fits at all. */
static bool fewest_blocks(const rp_transformer *m, const rpi_xf_part *x, cand *k,
                          const int *counts, double memory, bool asked) {
    int C = k->p * (k->dv ? 2 : k->v), most = 0;
    double params;
    for (int c = 0, l = 0; c < C; l += counts[c++])
        most = imax(most, rpi_xf_blocks(l, l + counts[c], m->layers));
    int lo = 1, hi = asked ? imax(most, 1) : most - 1;
    if (hi < lo)
        return false;
    if (!asked) {
        k->run.recompute = RP_RECOMPUTE_NONE;
        bool none = shape_memory(m, x, k, counts, &params, NULL) <= memory;
        k->run.recompute = RP_RECOMPUTE_BLOCKS;
        if (none)
            return false;
    }
    k->run.recompute_blocks = hi;
    if (shape_memory(m, x, k, counts, &params, NULL) > memory)
        return false;
    while (lo < hi) {
        k->run.recompute_blocks = (lo + hi) / 2;
        if (shape_memory(m, x, k, counts, &params, NULL) <= memory)
            hi = k->run.recompute_blocks;
        else
            lo = k->run.recompute_blocks + 1;
    }
    k->run.recompute_blocks = lo;
    return true;
}

/* The estimate of shape k (DBL_MAX where it does not fit); under
** RP_RECOMPUTE_BLOCKS, with the fewest recomputed blocks that fit. */
static double estimate(const rp_transformer *m, const rp_cluster *c, const rpi_xf_part *x,
                       cand *k, double memory, const rp_scale_options *o) {
    int L = m->layers, P = k->p, C = P * k->v;
    double cost[RPI_XF_PARTS];
    pass_costs(x, k->run.recompute == RP_RECOMPUTE_FULL, cost);
    int counts[RP_MAX_STAGES];
    cut(m, x, cost, k, o->even_stages, memory, counts);
    bool partial = k->run.recompute == RP_RECOMPUTE_BLOCKS;
    if (partial && !fewest_blocks(m, x, k, counts, memory, o->recompute == RP_RECOMPUTE_BLOCKS))
        return DBL_MAX;
    /* each rank's passes, its chunks' layers as the cut lays them, a
    ** recomputed block's forward twice (full recomputation's are in cost) */
    double rank[RP_MAX_STAGES] = {0}, most = 0, all = 0;
    for (int c = 0, l = 0; c < C; l += counts[c++]) {
        int r = k->dv ? (c < P ? c : 2 * P - 1 - c) : c % P;
        int redo = partial ? rp_transformer_recomputed_blocks(
                                 &k->run, rpi_xf_blocks(l, l + counts[c], L))
                           : 0;
        for (int j = l, b = 0; j < l + counts[c]; j++) {
            int kind = rpi_xf_kind(m, j);
            rank[r] += cost[kind];
            if (rpi_xf_is_block(kind) && b++ < redo)
                rank[r] += x[kind].f;
        }
    }
    for (int r = 0; r < P; r++)
        most = fmax(most, rank[r]), all += rank[r];
    /* memory: every rank's, as the cut lays the layers */
    double params;
    k->memory = shape_memory(m, x, k, counts, &params, NULL);
    if (k->memory > memory)
        return DBL_MAX;
    /* the transfers of the fill: a stage's output, over the node's link
    ** where the pipeline's ranks share a node (workers of t cp devices) */
    double width = (double)k->run.tensor_parallel * k->run.context_parallel;
    bool across = width * P > c->per_node;
    double xfer = c->latency + x[RPI_XF_BLOCK].out / (across ? c->network_bandwidth
                                                             : c->node_bandwidth);
    /* the steady state, a micro-batch of the busiest rank each, and the fill
    ** and drain of the other ranks' passes, a v-th of them with v chunks a
    ** rank (Narayanan et al.: a bubble of (p - 1) / v micro-batches); the V
    ** as two chunks */
    double fill = (all - most) / (k->dv ? 2 : k->v);
    double pipe = k->m * most + fill + 2.0 * (C - 1) * xfer;
    /* the replicas' reduction: the rank's bf16 gradients over d (cp ranks
    ** hold the same weights and reduce with them), hidden behind the last
    ** micro-batch's backward where the run overlaps it */
    double n = (double)k->d * k->run.context_parallel;
    bool dp_across = width * P * k->d > c->per_node;
    double bw = dp_across ? c->network_bandwidth : c->node_bandwidth;
    bool fp32 = k->run.precision == RP_PRECISION_FP32;
    double value = fp32 ? 4 : 2;
    double reduce = ring_time((int)n, value * params, bw, c->latency);
    if (k->sharding == RP_SHARD_FULL) /* fp32 reduce-scatter and bf16 all-gather */
        reduce = ring_time((int)n, (4 + value) / 2 * params, bw, c->latency);
    if (k->sharding == RP_SHARD_FULL && P == 1) /* gathered again for each micro-batch */
        pipe += k->m * fmax(0, ring_time((int)n, value * params, bw, c->latency) - most / 2);
    if (k->run.overlap)
        reduce = fmax(reduce / (2 * k->v), reduce - most / k->v * 2 / 3);
    double step = params * (fp32 ? 28 : 30) /
                  (c->device.memory_bandwidth * c->device.memory_efficiency);
    if (k->sharding != RP_SHARD_NONE)
        step /= n;
    return pipe + reduce + step;
}

/* cfg for shape k, its chunks' layers counts */
static void config_of(const cand *k, const int *counts, rp_config *cfg) {
    rp_config_default(cfg);
    cfg->micro_batch_size = k->run.micro_batch;
    cfg->gradient_accumulation_steps = k->m;
    cfg->replication_factor = k->d;
    cfg->replica_grouping = rp_grouping_all(k->d);
    cfg->optimizer.type = RP_OPT_ADAM;
    cfg->recompute_checkpoint_every_layer = k->run.recompute == RP_RECOMPUTE_FULL;
    cfg->replicated_tensor_sharding = k->sharding != RP_SHARD_NONE && k->d > 1;
    cfg->tensor_parallel = k->run.tensor_parallel;
    int C = k->p * (k->dv ? 2 : k->v);
    if (C > 1) {
        cfg->layers_per_stage.count = C;
        memcpy(cfg->layers_per_stage.layers, counts, sizeof(int) * (size_t)C);
    }
    if (k->dv || k->v > 1) {
        cfg->schedule = k->dv ? RP_SCHEDULE_DUALPIPEV : RP_SCHEDULE_INTERLEAVED;
        cfg->virtual_stages = k->dv ? 2 : k->v;
    }
}

/* Whether the option o (0 or -1: any) admits x. */
static bool admits(int o, int x) {
    return o <= 0 || o == x;
}

/* The runs of one tensor, context group and micro-batch to price: the
** recomputations, precisions and sequence parallelism the options admit. */
static int runs_of(const rp_transformer *m, const rp_cluster *c, const rp_scale_options *o,
                   int t, int cp, int b, rp_transformer_run *out) {
    int n = 0;
    for (int rc = RP_RECOMPUTE_NONE; rc <= RP_RECOMPUTE_BLOCKS; rc++)
        for (int pr = RP_PRECISION_BF16; pr <= RP_PRECISION_FP32; pr++) {
            /* either of bf16 and fp8 where the device has it; fp32 only where asked */
            if ((o->recompute >= 0 && rc != o->recompute) ||
                (o->precision >= 0 ? pr != o->precision
                                   : pr == RP_PRECISION_FP32 ||
                                         (pr == RP_PRECISION_FP8 && !(c->device.peak_fp8 > 0))))
                continue;
            /* selective recomputation saves nothing a fused kernel keeps
            ** (but latent attention's up products' outputs) */
            if (rc == RP_RECOMPUTE_SELECTIVE && m->flash && !m->kv_lora && o->recompute < 0)
                continue;
            rp_transformer_run r;
            rp_transformer_run_default(&r);
            r.micro_batch = b, r.tensor_parallel = t, r.context_parallel = cp;
            r.sequence_parallel = t > 1 && o->sequence_parallel >= 0;
            r.recompute = (rp_recompute)rc, r.precision = (rp_precision)pr;
            r.recompute_blocks = rc == RP_RECOMPUTE_BLOCKS; /* (the estimate's to choose) */
            r.overlap = !o->no_overlap;
            r.capacity = o->capacity;
            r.activation_scale = c->device.activation_scale;
            rp_error err;
            if (rp_transformer_run_check(m, c, &r, &err) == RP_OK)
                out[n++] = r;
        }
    return n;
}

/* Why no shape was considered at all, when none was: the sizes asked
** for, not the memory. */
static rp_status nothing_to_try(const rp_transformer *m, const rp_cluster *c,
                                const rp_scale_options *o, rp_error *err) {
    int N = o->devices, t = o->tensor_parallel, cp = o->context_parallel;
    int pp = o->pipeline_parallel, b = o->micro_batch;
    if (m->experts && t > 1 && o->sequence_parallel < 0)
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: a mixture of experts with --tp %d runs "
                       "sequence parallel (Megatron-LM's rule): leave --sequence-parallel on", t);
    if (t && (N % t || c->per_node % t || m->heads % t || m->ffn % t))
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: --tp %d must divide the %d devices, %s's "
                       "nodes of %d, the %d heads and the MLP's %d", t, N, c->name, c->per_node,
                       m->heads, m->ffn);
    if (pp && pp > m->layers + 2)
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: --pp %d: the model has %d layers (and "
                       "the embedding and the head) to share among them", pp, m->layers);
    if (pp && N % pp)
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: --pp %d does not divide the %d devices",
                       pp, N);
    if (cp && (N % cp || m->seq % (2 * cp)))
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: --cp %d must divide the %d devices, and "
                       "2 x %d the sequence of %d", cp, N, cp, m->seq);
    if (b && o->global_batch % b)
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: micro-batches of %d do not divide the "
                       "global batch of %lld", b, o->global_batch);
    int M = o->micro_batches;
    if (M && o->global_batch % M)
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: --micro-batches %d does not divide the "
                       "global batch of %lld", M, o->global_batch);
    int ep = o->expert_parallel, etp = o->expert_tensor_parallel;
    if (o->capacity > 0 && !m->experts)
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: --capacity is a mixture's experts': the "
                       "model has none (experts=E in the shape)");
    if ((ep > 1 || etp > 1) && !m->experts)
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: --ep and --etp split a mixture's experts: "
                       "the model has none (experts=E in the shape)");
    if (m->experts && ((ep && m->experts % ep) || (etp && m->moe_ffn % etp) ||
                       (long long)(ep ? ep : 1) * (etp ? etp : 1) > N))
        return rp_fail(err, RP_ERR_INFEASIBLE, "plan: --ep %d must divide the %d experts, "
                       "--etp %d their MLP's %d, and ep x etp the devices of a pipeline stage",
                       ep, m->experts, etp, m->moe_ffn);
    return rp_fail(err, RP_ERR_INFEASIBLE, "plan: no tensor, context and pipeline sizes, "
                   "replicas and micro-batches multiply to %d devices and divide %lld sequences "
                   "an update%s", N, o->global_batch,
                   t || cp || pp || b || M ? " with the sizes given" : "");
}

/* The shapes priced so far: those that fit, and how many were tried. */
typedef struct cand_list {
    cand *cs;
    int n, cap, shapes;
} cand_list;

static bool push_cand(cand_list *l, const cand *k) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        cand *more = realloc(l->cs, sizeof(cand) * (size_t)cap);
        if (!more)
            return false;
        l->cs = more, l->cap = cap;
    }
    l->cs[l->n++] = *k;
    return true;
}

/* Whether virtual stages v (0: DualPipeV's two) go with p stages of mb
** micro-batches under the schedules and options asked for. */
static bool admits_chunks(const rp_transformer *m, const rp_scale_options *o, unsigned sched,
                          int p, long long mb, int v) {
    bool dv = v == 0;
    int vv = dv ? 2 : v, L = m->layers + 2;
    int kind = dv ? RP_SCHEDULE_DUALPIPEV : v > 1 ? RP_SCHEDULE_INTERLEAVED : RP_SCHEDULE_1F1B;
    return (sched & (1u << kind)) && (!o->virtual_stages || vv == o->virtual_stages || dv) &&
           !(v > 1 && (p < 2 || p * v > L || p * v > RP_MAX_STAGES || mb % p)) &&
           !(dv && (p < 2 || 2 * p > L || mb < 2 * p)) &&
           !(o->even_stages && m->layers % (p * vv));
}

/* Every chunking and sharding of one run on p pipeline ranks and d
** replicas, priced in closed form; those that fit kept. False: out of
** memory. */
static bool shapes_of_layout(const rp_transformer *m, const rp_cluster *c,
                             const rp_scale_options *o, const rp_transformer_run *run,
                             const rpi_xf_part *x, const rpi_xf_part *x_a2a, int p, int d,
                             long long mb, double memory, cand_list *l) {
    int cp = run->context_parallel;
    unsigned sched = o->schedules ? o->schedules
                                  : 1u << RP_SCHEDULE_1F1B | 1u << RP_SCHEDULE_INTERLEAVED;
    /* v = 1, then interleaved's chunks, then (v = 0) DualPipeV's two */
    for (int v = 1; v <= 16; v = v == 16 ? 0 : v + 1) {
        /* a schedule that pairs one micro-batch's forward with another's
        ** backward (interleaved 1F1B's, DualPipeV's) hides a mixture's
        ** all-to-alls where the run overlaps; not under full recomputation
        ** (Megatron-LM's rule) */
        bool pairs = x_a2a && v != 1 && run->recompute != RP_RECOMPUTE_FULL &&
                     run->recompute != RP_RECOMPUTE_BLOCKS;
        for (int sh = RP_SHARD_NONE; admits_chunks(m, o, sched, p, mb, v) &&
                                     sh <= RP_SHARD_FULL; sh++) {
            if ((o->sharding >= 0 ? sh != o->sharding : sh == RP_SHARD_NONE && d * cp > 1) ||
                (sh != RP_SHARD_NONE && d * cp == 1))
                continue;
            cand k = {.run = *run, .p = p, .d = d, .v = v ? v : 2, .m = (int)mb,
                      .dv = v == 0, .sharding = (rp_sharding)sh};
            k.run.a2a_overlap = pairs;
            l->shapes++;
            k.estimate = estimate(m, c, pairs ? x_a2a : x, &k, memory, o);
            if (k.estimate != DBL_MAX && !push_cand(l, &k))
                return false;
        }
        if (v == 0)
            break;
    }
    return true;
}

/* Every pipeline, expert group, chunking and sharding of one run (its
** tensor, context group and micro-batch) on N devices; those that fit
** kept. A mixture's expert groups: ep of the powers of two that divide the
** experts and a stage's t cp d ranks over etp [1, or the one asked for].
** False: out of memory. */
static bool shapes_of_run(const rp_transformer *m, const rp_cluster *c, const rp_scale_options *o,
                          const rp_transformer_run *run, double memory, cand_list *l) {
    long long B = o->global_batch;
    int t = run->tensor_parallel, cp = run->context_parallel, b = run->micro_batch;
    int left = o->devices / (t * cp), L = m->layers + 2;
    int etp = o->expert_tensor_parallel > 0 ? o->expert_tensor_parallel : 1;
    int ep0 = o->expert_parallel > 0 ? o->expert_parallel : 1;
    int ep1 = o->expert_parallel > 0 ? ep0 : m->experts > 0 ? m->experts : 1;
    /* each expert group's parts, priced once (the pipeline does not change
    ** them): as the run goes, and with its all-to-alls behind paired passes */
    struct {
        int ep;
        bool hide;
        rpi_xf_part x[RPI_XF_PARTS], x_a2a[RPI_XF_PARTS];
    } g[18];
    int ng = 0;
    for (int ep = ep0; ep <= ep1 && ng < 18; ep *= 2) {
        rp_transformer_run r = *run;
        r.expert_parallel = ep, r.expert_tensor_parallel = etp;
        rp_error err;
        if (rp_transformer_run_check(m, c, &r, &err))
            continue;
        g[ng].ep = ep;
        rpi_xf_parts(m, c, &r, g[ng].x);
        g[ng].hide = m->experts && r.overlap && ep > 1;
        r.a2a_overlap = true;
        if (g[ng].hide)
            rpi_xf_parts(m, c, &r, g[ng].x_a2a);
        ng++;
    }
    for (int p = 1; p <= left && p <= L && p <= RP_MAX_STAGES; p++) {
        if (!admits(o->pipeline_parallel, p) || left % p)
            continue;
        int d = left / p;
        if (B % ((long long)b * d))
            continue;
        long long mb = B / ((long long)b * d);
        if (mb > 1 << 20 || (o->micro_batches > 0 && mb != o->micro_batches))
            continue;
        for (int k = 0; k < ng; k++) {
            if (((long long)t * cp * d) % ((long long)g[k].ep * etp))
                continue;
            rp_transformer_run r = *run;
            r.expert_parallel = g[k].ep, r.expert_tensor_parallel = etp;
            if (!shapes_of_layout(m, c, o, &r, g[k].x, g[k].hide ? g[k].x_a2a : NULL, p, d, mb,
                                  memory, l))
                return false;
        }
    }
    return true;
}

/* The sizes tried: the powers of two, or the one asked for (any); each
** tensor and context group and micro-batch under every run the options
** admit. */
static rp_status enumerate(const rp_transformer *m, const rp_cluster *c,
                           const rp_scale_options *o, double memory, cand_list *l,
                           rp_error *err) {
    int N = o->devices;
    int t0 = o->tensor_parallel > 0 ? o->tensor_parallel : 1;
    int c0 = o->context_parallel > 0 ? o->context_parallel : 1;
    int b0 = o->micro_batch > 0 ? o->micro_batch : 1;
    for (int t = t0; t <= (o->tensor_parallel > 0 ? t0 : c->per_node); t *= 2)
        for (int cp = c0; cp <= (o->context_parallel > 0 ? c0 : 64); cp *= 2)
            for (int b = b0; b <= (o->micro_batch > 0 ? b0 : 8); b *= 2) {
                if (N % (t * cp) || o->global_batch % b)
                    continue;
                rp_transformer_run runs[12];
                int nr = runs_of(m, c, o, t, cp, b, runs);
                for (int ri = 0; ri < nr; ri++)
                    if (!shapes_of_run(m, c, o, &runs[ri], memory, l))
                        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
            }
    return RP_OK;
}

/* Simulates shape k; where it fits and beats the plan so far, it becomes
** the plan. *fits: whether it fits. */
static rp_status try_cand(const rp_transformer *m, const rp_cluster *c,
                          const rp_scale_options *o, const cand *k, double memory,
                          rp_scale_plan *out, bool *fits, rp_error *err) {
    rpi_xf_part x[RPI_XF_PARTS];
    rpi_xf_parts(m, c, &k->run, x);
    double cost[RPI_XF_PARTS];
    pass_costs(x, k->run.recompute == RP_RECOMPUTE_FULL, cost);
    int counts[RP_MAX_STAGES];
    cut(m, x, cost, k, o->even_stages, memory, counts);
    rp_config cfg;
    config_of(k, counts, &cfg);
    double sec;
    rp_transformer_memory mem;
    rp_status st = rp_scale_simulate(m, c, &k->run, k->sharding, &cfg, &sec, &mem, err);
    if (st)
        return st;
    out->simulated++;
    *fits = mem.total <= memory;
    if (!*fits || (out->seconds > 0 && sec >= out->seconds))
        return RP_OK;
    out->cfg = cfg;
    out->run = k->run;
    out->t = k->run.tensor_parallel, out->cp = k->run.context_parallel;
    out->p = k->p, out->d = k->d, out->b = k->run.micro_batch, out->v = k->dv ? 2 : k->v;
    out->sharding = k->sharding;
    out->seconds = sec;
    out->memory = mem;
    return RP_OK;
}

/* The best estimates, simulated; those that do not fit make room for the
** next; DualPipeV's best few too, where asked for (the closed form prices
** it as interleaving's two chunks, not its overlap of passes); and the best
** of each kind of shape (no pipeline, 1F1B, interleaving; by sharding,
** recomputation, and with a tensor group or without) within 5 % of the
** best estimate: the estimates come within a few percent of the
** simulation, and where kinds of shape are that close the simulation is to
** choose between them. *fit: how many fitted. */
static rp_status simulate_best(const rp_transformer *m, const rp_cluster *c,
                               const rp_scale_options *o, const cand_list *l, double memory,
                               rp_scale_plan *out, int *fit, rp_error *err) {
    const cand *cs = l->cs;
    int want = o->candidates > 0 ? o->candidates : 3, dv_tried = 0, dv_left = 0;
    for (int i = 0; i < l->n; i++)
        dv_left += cs[i].dv;
    bool kind_seen[2][2][3][4][2] = {{{{{false}}}}};
    *fit = 0;
    for (int i = 0; i < l->n; i++) {
        /* (an estimate a tenth worse than the best is not simulated) */
        bool best = *fit < want && i < 4 * want && cs[i].estimate <= 1.1 * cs[0].estimate;
        bool dv = cs[i].dv && dv_tried < want;
        bool *seen = &kind_seen[cs[i].p > 1][cs[i].v > 1][cs[i].sharding][cs[i].run.recompute]
                               [cs[i].run.tensor_parallel > 1];
        bool kind = !cs[i].dv && !*seen && cs[i].estimate <= 1.05 * cs[0].estimate;
        *seen = *seen || !cs[i].dv;
        dv_left -= cs[i].dv;
        if (!best && !dv && !kind) {
            if (*fit >= want && cs[i].estimate > 1.05 * cs[0].estimate &&
                (dv_tried >= want || dv_left == 0))
                break;
            continue;
        }
        dv_tried += cs[i].dv;
        bool fits;
        rp_status st = try_cand(m, c, o, &cs[i], memory, out, &fits, err);
        if (st)
            return st;
        *fit += fits;
    }
    return RP_OK;
}

/* The plan's search, in the steps above: every shape priced in closed form,
** the best simulated, the winner's busiest rank and rates. */
rp_status rp_scale_plan_compute(const rp_transformer *m, const rp_cluster *c,
                                const rp_scale_options *o, rp_scale_plan *out, rp_error *err) {
    memset(out, 0, sizeof *out);
    long long B = o->global_batch;
    int N = o->devices, fit = 0;
    double memory = o->memory_bytes > 0 ? o->memory_bytes : c->device.memory_bytes;
    if (B < 1 || N < 1)
        return rp_fail(err, RP_ERR_INVALID, "plan: a global batch and a number of devices of 1 "
                       "or more are needed");
    if (N > RP_SCALE_MAX_DEVICES || B > RP_SCALE_MAX_BATCH)
        return rp_fail(err, RP_ERR_INVALID, "plan: at most %d devices and %lld sequences an "
                       "update", RP_SCALE_MAX_DEVICES, (long long)RP_SCALE_MAX_BATCH);
    cand_list l = {0};
    rp_status st = enumerate(m, c, o, memory, &l, err);
    out->considered = l.shapes;
    if (!st && l.shapes == 0)
        st = nothing_to_try(m, c, o, err);
    else if (!st && l.n == 0)
        st = rp_fail(err, RP_ERR_INFEASIBLE,
                     "plan: no shape of %d devices fits %.0f bytes a device for %lld sequences "
                     "an update (%d shapes tried: tensor, context and pipeline sizes, "
                     "micro-batches of 1 to 8, recomputation, sharded state)",
                     N, memory, B, l.shapes);
    if (!st) {
        qsort(l.cs, (size_t)l.n, sizeof *l.cs, by_estimate);
        st = simulate_best(m, c, o, &l, memory, out, &fit, err);
    }
    free(l.cs);
    if (!st && !fit)
        st = rp_fail(err, RP_ERR_INFEASIBLE,
                     "plan: the %d best estimates of %d devices do not fit %.0f bytes a device "
                     "when simulated", out->simulated, N, memory);
    if (st)
        return st;
    int at;
    (void)rpi_scale_ranks_memory(m, &out->run, out->sharding, &out->cfg, &out->memory, &at, err);
    out->busiest_rank = at;
    double sec = out->seconds * N;
    out->tflops_per_device = rp_transformer_flops_megatron(m, out->t, (double)B) / sec / 1e12;
    out->tflops_eq3 = rp_transformer_flops_eq3(m, (double)B) / sec / 1e12;
    double peak = rp_precision_peak(&c->device, out->run.precision);
    out->mfu = rp_transformer_flops_6n(m, (double)B) / sec / peak;
    return RP_OK;
}
