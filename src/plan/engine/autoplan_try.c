/*
** The engine's planner, pricing and choosing: a candidate shape made a
** configuration and simulated (with the reductions' keys that pay on the
** machines), its pipeline under the zero-bubble schedules and with two
** chunks a worker, and the choice between what was simulated: the fastest,
** and within 1 % the simplest.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autoplan_impl.h"

/* The profile measured nearest B rows (by ratio): the fewer rows its times
** are scaled over, the truer they are. */
int rpi_plan_nearest(const search *S, double B) {
    int best = 0;
    for (int k = 1; k < S->nm; k++)
        if (fabs(log(B / S->m[k].batch)) < fabs(log(B / S->m[best].batch)))
            best = k;
    return best;
}

void rpi_plan_config(const search *S, const cand *k, rp_config *cfg) {
    *cfg = *S->base;
    cfg->replication_factor = k->R;
    cfg->gradient_accumulation_steps = k->GA;
    cfg->micro_batch_size = k->B;
    cfg->schedule = RP_SCHEDULE_1F1B;
    cfg->recompute_checkpoint_every_layer = S->base->recompute_checkpoint_every_layer || k->recompute;
    cfg->replicated_tensor_sharding = S->base->replicated_tensor_sharding || k->shard;
    cfg->layers_per_stage.count = k->P;
    cfg->stage_replication_count = k->P;
    for (int s = 0; s < k->P; s++) {
        cfg->layers_per_stage.layers[s] = k->layers[s];
        cfg->stage_replication[s] = k->reps[s];
    }
    cfg->matmul_proportion_count = 1;
    cfg->grouping_set = false;
    cfg->replica_grouping = rp_grouping_all(k->R);
    rpi_rungs_stages(S, k, cfg);
}

/* zb-auto's relative pass times for a candidate: the forward, input
** gradient and weight gradient of its busiest stage replica, from the
** profile it was planned on. */
static void pass_times(const search *S, const cand *k, double out[3]) {
    const measured *m = &S->m[k->prof];
    double most = -1;
    for (int s = 0, first = 0; s < k->P; s++) {
        int last = s == k->P - 1 ? S->L : first + k->layers[s];
        double t[3] = {0, 0, 0};
        for (int l = first; l < last; l++)
            t[0] += m->fw[l], t[1] += m->bi[l], t[2] += m->bwt[l];
        double busy = (t[0] + t[1] + t[2]) / k->reps[s];
        if (busy > most && t[0] > 0 && t[1] > 0 && t[2] > 0)
            most = busy, memcpy(out, t, sizeof t);
        first = last;
    }
    if (most < 0)
        out[0] = out[1] = out[2] = 1;
}

/* Simulates a configuration as it is: seconds per update, the most a
** worker holds, and (far) the seconds its messages and reductions spend
** beyond the innermost level; false when it cannot run on these machines. */
bool rpi_plan_simulate_as_is(const search *S, const rp_config *cfg, double *t, double *bytes,
                              double *far) {
    rp_sim_result r;
    rp_error err;
    const measured *m = &S->m[rpi_plan_nearest(S, cfg->micro_batch_size)];
    rp_sim_options so = S->sim;
    so.profile_batch = m->batch;
    so.cut_bytes = m->cut;
    so.bwd_input_ms = m->bi, so.bwd_weight_ms = m->bwt;
    /* what the layers keep, as the profile's net lays them out: a whole
    ** model's, so not for a tensor rank, whose share the model would say */
    if (rp_config_tensor_parallel(cfg) == 1 || so.tensor_measured) {
        rp_sim_options_memory(&so, m->mem);
    }
    if (rp_simulate(cfg, m->fw, m->bw, m->out, m->par, S->L, &so, &r, &err))
        return false;
    *t = r.update_time;
    *bytes = 0;
    for (int s = 0; s < r.stages; s++) { /* (dualpipe's device: stages s and P - 1 - s) */
        double b = r.stage_bytes[s];
        if (rp_config_paired(cfg))
            b += r.stage_bytes[r.stages - 1 - s];
        *bytes = b > *bytes ? b : *bytes;
    }
    *far = 0;
    for (int l = 1; l < r.num_levels; l++)
        *far += r.comm_seconds[l];
    bool fits = !(S->o->memory_size > 0 && *bytes > S->o->memory_size);
    if (S->o->device_memory) { /* each worker against its own device's */
        const double *v = S->o->device_memory;
        int devices = 1;
        for (int l = 0; l < S->o->num_levels; l++)
            devices *= S->o->machines[l];
        double least = v[0];
        for (int d = 1; d < devices; d++)
            least = v[d] < least ? v[d] : least;
        fits = true;
        for (int w = 0; w < r.workers; w++) {
            /* (a worker of chunks shares its device: against the least of all) */
            bool shared = rp_config_chunked(cfg) || rp_config_paired(cfg);
            double cap = shared || w >= devices ? least : v[w];
            fits = fits && (shared ? *bytes : r.stage_bytes[r.stage_of[w]]) <= cap;
        }
    }
    rp_sim_result_free(&r);
    return fits;
}

/* Simulates a configuration with the reductions that pay on these
** machines, where the base configuration left them to the planner:
** across servers on MPI ranks, the sum inside each server first
** (workers_per_server: one server's workers of every level below the
** outermost); then the reduction in buckets during the last backward, at
** PyTorch DDP's two sizes (its first bucket's 1 MB, its 25 MB), each where
** the model makes at most RP_AUTOPLAN_BUCKETS of them (the simulation
** plays every bucket of every reduction: a fuzzed 1e12-byte profile in
** 1 MB buckets took seconds a candidate). A key is
** set only where the simulation is faster with it: off is the simpler
** run. Tried on up to RP_AUTOPLAN_KEY_WORKERS workers, and only within 1.5 times the fastest simulation so far (the
** keys save at most the reductions' time; a 2 916-worker plan tried them
** on every candidate for seconds). cfg's two keys are the base's again
** first, then the choice. */
#define RP_AUTOPLAN_BUCKETS 1024
#define RP_AUTOPLAN_KEY_WORKERS 64
bool rpi_plan_simulate(const search *S, rp_config *cfg, double *t, double *bytes) {
    double far;
    cfg->workers_per_server = S->base->workers_per_server;
    cfg->reduction_bucket_mb = S->base->reduction_bucket_mb;
    if (!rpi_plan_simulate_as_is(S, cfg, t, bytes, &far))
        return false;
    int levels = S->o->num_levels, servers = levels > 1 ? S->o->machines[levels - 1] : 1;
    rp_derived der;
    rp_config_derive(cfg, &der);
    if (der.workers > RP_AUTOPLAN_KEY_WORKERS)
        return true; /* (each try plays every worker again: seconds on thousands) */
    bool reduces = cfg->replication_factor > 1; /* some stage's gradients summed over workers */
    for (int st = 0; st < cfg->layers_per_stage.count && !reduces; st++)
        reduces = rp_config_stage_replicas(cfg, st) > 1;
    if (*t < *S->fastest)
        *S->fastest = *t;
    if (far <= 0 || servers < 2 || !reduces || *t > 1.5 * *S->fastest)
        return true; /* nothing leaves a machine, nothing is reduced, or far from the best */
    rp_config c = *cfg;
    double t2, b2, f2;
    if (S->o->polling && cfg->workers_per_server == 0) {
        int W = 1;
        for (int l = 0; l < levels; l++)
            W *= S->o->machines[l];
        c.workers_per_server = W / servers;
        if (c.workers_per_server > 1 && rpi_plan_simulate_as_is(S, &c, &t2, &b2, &f2) && t2 < *t * 0.999)
            *cfg = c, *t = t2, *bytes = b2;
        c = *cfg;
    }
    bool buckets_go = cfg->schedule < RP_SCHEDULE_PIPEDREAM &&
                      !cfg->replicated_tensor_sharding && !cfg->fp16_exchange;
    static const double sizes[] = {1, 25};
    rp_config keep = *cfg;
    double bytes_all = S->m[0].cp[S->L]; /* the model's parameters */
    for (int i = 0; i < 2 && buckets_go && cfg->reduction_bucket_mb == 0; i++) {
        if (bytes_all / (sizes[i] * 1e6) > RP_AUTOPLAN_BUCKETS)
            continue; /* the simulation plays every bucket: too many to try */
        c = *cfg;
        c.reduction_bucket_mb = sizes[i];
        if (rpi_plan_simulate_as_is(S, &c, &t2, &b2, &f2) && t2 < *t * 0.999)
            keep = c, *t = t2, *bytes = b2;
    }
    *cfg = keep;
    if (*t < *S->fastest)
        *S->fastest = *t;
    return true;
}

/* Every stage replica gets as many micro-batches as the others of its
** stage. */
static bool balanced(const rp_config *c) {
    for (int s = 0; s < c->layers_per_stage.count; s++)
        if (c->gradient_accumulation_steps % rp_config_stage_replicas(c, s))
            return false;
    return true;
}

/* Keeps e if it is faster, or as fast (within 1 %) and simpler: first a
** plan whose stage replicas share the micro-batches evenly (an uneven one
** is only as fast as predicted where nothing else competes for the cores). */
void rpi_plan_consider(const search *S, rp_autoplan_entry *e, const rp_config *cfg, double t,
                       double bytes) {
    if (S->o->schedules && !(S->o->schedules & (1u << cfg->schedule)))
        return; /* (a schedule the trainer does not have) */
    rp_derived d, de;
    rp_config_derive(cfg, &d);
    if (e->found) {
        rp_config_derive(&e->cfg, &de);
        /* then fewer workers, fewer stages, fewer layers recomputed by
        ** layer, then the micro-batch nearest the profiles': their times
        ** were measured there, and scaling them to other micro-batches is
        ** where the model is weakest (a CPU's caches favour small ones, a
        ** GPU's width large ones) */
        double B = cfg->micro_batch_size, Be = e->cfg.micro_batch_size;
        double near = fabs(log(B / S->m[rpi_plan_nearest(S, B)].batch));
        double near_e = fabs(log(Be / S->m[rpi_plan_nearest(S, Be)].batch));
        bool even = balanced(cfg), even_e = balanced(&e->cfg);
        bool simpler = even != even_e           ? even
                       : d.workers != de.workers ? d.workers < de.workers
                       : d.stages != de.stages   ? d.stages < de.stages
                       : cfg->recompute_layers_count != e->cfg.recompute_layers_count
                           ? cfg->recompute_layers_count < e->cfg.recompute_layers_count
                           : near < near_e;
        if (!(t < e->seconds * (simpler ? 1.01 : 0.99)))
            return;
    }
    e->found = true;
    e->cfg = *cfg;
    e->seconds = t;
    e->worker_bytes = bytes;
}

/* The 2 P chunks of pipeline k as cfg's schedule places them: each chunk
** the replicas of its worker's stage, its layers to the one nearest its
** share of the compute (weighted by its replicas), one layer a chunk at
** least. False where no cut the trainer can make leaves every chunk a
** layer. */
static bool split_chunks(const search *S, const cand *k, const measured *m, double total,
                         rp_config *cfg) {
    int P = k->P, C = 2 * P;
    int dev[RP_MAX_STAGES], weights = 0;
    for (int r = 0; r < P; r++)
        for (int j = 0; j < 2; j++)
            dev[rp_config_chunk(cfg, P, r, j)] = r;
    for (int c = 0; c < C; c++)
        weights += k->reps[dev[c]];
    double acc = 0;
    bool cut = true;
    for (int c = 0, l = 0, upto = 0; c < C; c++) {
        cfg->stage_replication[c] = k->reps[dev[c]];
        upto += k->reps[dev[c]];
        if (c == C - 1) {
            cfg->layers_per_stage.layers[c] = S->L - l;
            break;
        }
        int layers = 0; /* to the layer nearest its share, leaving one a chunk */
        double goal = total * upto / weights;
        do {
            acc += m->fw[l] + m->bw[l];
            l++, layers++;
        } while (l < S->L - (C - 1 - c) &&
                 ((S->o->cuts && !S->o->cuts[l]) || acc + (m->fw[l] + m->bw[l]) / 2 < goal));
        if (S->o->cuts && !S->o->cuts[l]) {
            cut = false; /* no cut the trainer can make leaves every chunk a layer */
            break;
        }
        cfg->layers_per_stage.layers[c] = layers;
    }
    return cut;
}

/* Two chunks a worker on pipeline k's workers, each worker replicated as
** the pipeline's stage on it is: the model cut into 2 P chunks by the
** profile, each worker's two of about equal forward and backward time and
** the workers' shares in proportion to their replicas (a stage's
** replicas take its micro-batches in turns), under interleaved-1f1b
** (chunk c on worker c mod P; GA a multiple of P), under zb-v (chunks r
** and 2 P - 1 - r on worker r, ordered on the busiest stage's pass times)
** and under dualpipev (the same V; GA at least 2 P), each considered for
** `into` and `best`.
** Returns how many were simulated. */
int rpi_plan_interleaved(const search *S, const cand *k, rp_config cfg, rp_autoplan_entry *into,
                         rp_autoplan_entry *best) {
    int P = k->P, C = 2 * P;
    if (P < 2 || C > RP_MAX_STAGES || S->L < C)
        return 0;
    const measured *m = &S->m[k->prof];
    double total = 0;
    for (int l = 0; l < S->L; l++)
        total += m->fw[l] + m->bw[l];
    cfg.virtual_stages = 2;
    cfg.stage_replication_count = 0; /* (none written where every worker is one device) */
    for (int r = 0; r < P; r++)
        cfg.stage_replication_count = k->reps[r] > 1 ? C : cfg.stage_replication_count;
    int n = 0;
    for (int z = 0; z < 3; z++) {
        cfg.schedule = z == 0 ? RP_SCHEDULE_INTERLEAVED : z == 1 ? RP_SCHEDULE_ZB_V
                                                                 : RP_SCHEDULE_DUALPIPEV;
        if ((z == 0 && k->GA % P) || (z == 2 && k->GA < 2 * P))
            continue;
        /* zb-v orders on the busiest stage's pass times, as zb-auto does */
        if (z == 1)
            pass_times(S, k, cfg.zb_pass_times);
        else
            cfg.zb_pass_times[0] = cfg.zb_pass_times[1] = cfg.zb_pass_times[2] = 1;
        bool cut = split_chunks(S, k, m, total, &cfg);
        if (!cut)
            continue;
        cfg.layers_per_stage.count = C;
        double t, bytes;
        if (!rpi_plan_simulate(S, &cfg, &t, &bytes))
            continue;
        rpi_plan_consider(S, into, &cfg, t, bytes);
        rpi_plan_consider(S, best, &cfg, t, bytes);
        n++;
    }
    return n;
}

/* Pipeline k of cfg as DeepSeek's DualPipe, where the options ask for it
** (--schedules): twice the replicas at half the accumulation, the same
** samples an update and the same devices, each pair of replicas running
** its pipelines in opposite directions over one pipeline's devices (a
** device holds stages s and P - 1 - s, replicated alike); considered for
** `into` and `best`. Returns how many were simulated (0 or 1). */
int rpi_plan_dualpipe(const search *S, const cand *k, rp_config cfg, rp_autoplan_entry *into,
                      rp_autoplan_entry *best) {
    int P = k->P, GA = k->GA;
    if (!(S->o->schedules & (1u << RP_SCHEDULE_DUALPIPE)) || P < 2 || P % 2 || GA % 2 ||
        GA / 2 < P || 2 * k->R > RP_MAX_WORKERS)
        return 0;
    for (int s = 0; s < P / 2; s++)
        if (k->reps[s] != k->reps[P - 1 - s])
            return 0;
    cfg.schedule = RP_SCHEDULE_DUALPIPE;
    cfg.replication_factor = 2 * k->R;
    cfg.gradient_accumulation_steps = GA / 2;
    cfg.replica_grouping = rp_grouping_all(2 * k->R);
    double t, bytes;
    if (!rpi_plan_simulate(S, &cfg, &t, &bytes))
        return 0;
    rpi_plan_consider(S, into, &cfg, t, bytes);
    rpi_plan_consider(S, best, &cfg, t, bytes);
    return 1;
}

/* Pipeline k of cfg under zb-h1, zb-h2, then zb-auto on the busiest
** stage's pass times at zb-h1's memory, at about zb-h2's and at room for
** 3 P micro-batches (where the passes differ, more room lets it fill the
** bubble; the memory limit decides whether it fits), each considered for
** `into` and `best`. Returns how many were simulated. */
int rpi_plan_zero_bubble(const search *S, const cand *k, rp_config cfg, rp_autoplan_entry *into,
                         rp_autoplan_entry *best) {
    int n = 0;
    for (int z = 0; z < 5; z++) {
        double t, bytes;
        cfg.schedule = z == 0 ? RP_SCHEDULE_ZB_H1 : z == 1 ? RP_SCHEDULE_ZB_H2 : RP_SCHEDULE_ZB_AUTO;
        if (z >= 2)
            pass_times(S, k, cfg.zb_pass_times);
        cfg.zb_max_in_flight = z == 3 ? 2 * k->P - 1 : z == 4 ? 3 * k->P : 0;
        if (!rpi_plan_simulate(S, &cfg, &t, &bytes))
            continue;
        n++;
        rpi_plan_consider(S, into, &cfg, t, bytes);
        rpi_plan_consider(S, best, &cfg, t, bytes);
    }
    return n;
}

