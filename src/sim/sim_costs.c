/*
** The prices the simulator plays and the engine's planner reads: a stage's
** compute and message costs per micro-batch from the profile, and the bytes
** a worker holds (the machine hierarchy they are priced on: sim_net.c).
*/
#include <stdbool.h>

#include "repipe/layers.h"
#include "repipe/schedule.h"
#include "repipe/session.h"
#include "repipe/simulate.h"
#include "simulate_impl.h"
#include "../sched/sharding.h"

void rp_sim_options_default(rp_sim_options *o) {
    *o = (rp_sim_options){
        .profile_batch = 0,
        .num_levels = 0,
        .latency = 2e-5,
        .memory_bandwidth = 1e10,
        .cores = 0,
    };
}

/* One layer's part of what a stage holds (last: the stage's last layer),
** into the running sums of a (see rpi_stage_bytes for what each holds). */
static void stage_acc_layer(rpi_stage_acc *a, int l, bool last) {
    const rp_sim_options *opt = a->opt;
    const double *out_bytes = a->out_bytes, *param_bytes = a->param_bytes;
    const double *kept = a->kept, *ck = a->ck;
    bool split = a->split, rc = a->rc, net = a->net;
    int T = a->T;
    bool end = last || param_bytes[l + 1] > 0;
    /* a tensor rank holds its share of a split layer's parameters */
    bool part = rpi_tensor_split_of(opt, T, l) & RP_SIM_TP_SPLIT;
    a->par += part ? param_bytes[l] / T : param_bytes[l];
    if (opt && opt->grad_bytes)
        a->grads += opt->grad_bytes[l];
    if (opt && opt->scratch_bytes)
        a->scratch = opt->scratch_bytes[l] > a->scratch ? opt->scratch_bytes[l] : a->scratch;
    if (split && opt && opt->wstash_bytes)
        a->acts += opt->wstash_bytes[l];
    else if (split && param_bytes[l] > 0) /* the output gradient waiting for its W */
        a->acts += out_bytes[l];
    if (a->by_layer) { /* a layer named keeps nothing; a run of them is made again at a
                       ** time, before the layer after it, which keeps all */
        if (!last && rp_config_recomputes_layer(a->cfg, l)) {
            a->seg += kept[l];
        } else {
            a->acts += kept[l];
            a->most = a->seg > a->most ? a->seg : a->most, a->seg = 0;
        }
        return;
    }
    if (rc && ck && !net) { /* the checkpoints kept; one layer made again at a time */
        a->acts += ck[l];
        a->most = kept[l] > a->most ? kept[l] : a->most;
        return;
    }
    if (rc && ck) { /* the checkpoints kept; a segment's rest made again, one at a
                    ** time; the stage's last layer kept whole, its backward next */
        a->acts += last ? kept[l] : ck[l];
        a->seg += !last && kept[l] > ck[l] ? kept[l] - ck[l] : 0;
        if (ck[l] > 0 || last)
            a->most = a->seg > a->most ? a->seg : a->most, a->seg = 0;
        return;
    }
    if (!rc || end)
        a->acts += kept[l];
    else
        a->seg += kept[l];
    if (end)
        a->most = a->seg > a->most ? a->seg : a->most, a->seg = 0;
}

void rpi_stage_acc_begin(rpi_stage_acc *a, const rp_config *cfg, const double *out_bytes,
                         const double *param_bytes, int first, const rp_sim_options *opt) {
    *a = (rpi_stage_acc){.cfg = cfg, .out_bytes = out_bytes, .param_bytes = param_bytes,
                         .opt = opt, .first = first, .next = first,
                         .kept = opt && opt->kept_bytes ? opt->kept_bytes : out_bytes,
                         .ck = opt ? opt->recompute_kept_bytes : NULL,
                         .split = rp_schedule_splits_backward(cfg->schedule),
                         .rc = cfg->recompute_checkpoint_every_layer,
                         .by_layer = cfg->recompute_layers_count > 0,
                         .net = opt && opt->scratch_bytes,
                         .T = rp_config_tensor_parallel(cfg)};
    /* A profile of repipe's own nets (it says each layer's scratch) counts
    ** as a net lays a stage out: the input received held beside the
    ** layers' outputs, and when recomputed the stage's last layer kept
    ** whole, its backward the first. A transformer profile's checkpoints
    ** are each block's input, the stage's own among them, as Megatron-LM
    ** keeps them. */
    if (a->net && opt->kept_bytes && first > 0) /* the stage's input, received */
        a->acts += opt->cut_bytes ? opt->cut_bytes[first] : out_bytes[first - 1];
}

void rpi_stage_acc_push(rpi_stage_acc *a) { stage_acc_layer(a, a->next++, false); }

/* What a stage of the layers in a holds. */
static double stage_acc_finish(const rpi_stage_acc *s, int r, int slots, double per_mb) {
    const rp_config *cfg = s->cfg;
    const rp_sim_options *opt = s->opt;
    /* a graph's gradient buffers, one per tensor, shared by the sets */
    double par = s->par, scratch = s->scratch + s->grads;
    /* optimizer state: per parameter, sharded over the workers that share
    ** the stage's variables, streamed a chunk at a time when offchip */
    int per_param = rp_optimizer_state_per_param(&cfg->optimizer);
    double state = par * per_param;
    int sharers = cfg->replica_grouping.group_size * r;
    if (rpi_sharded(cfg, sharers, (size_t)per_param))
        state /= sharers;
    double chunk = sizeof(float) * (double)RP_OFFCHIP_CHUNK * per_param;
    if (cfg->optimizer_state_offchip && state > chunk)
        state = chunk;
    bool mpi = opt && opt->polling;
    double copy = cfg->reduction_bucket_mb > 0 && mpi ? par : 0; /* (as the engine's plan) */
    double half = opt && opt->mixed_precision ? par / 2 : 0; /* the bf16 weights */
    return 2 * par + half + copy + state + (slots * s->acts + s->most + scratch) * per_mb;
}

double rpi_stage_acc_bytes(const rpi_stage_acc *a, int r, int slots, double per_mb) {
    rpi_stage_acc s = *a; /* the layers pushed, then layer `next` as the stage's last */
    stage_acc_layer(&s, s.next++, true);
    return stage_acc_finish(&s, r, slots, per_mb);
}

double rpi_stage_acc_held(const rpi_stage_acc *a, int r, int slots, double per_mb) {
    rpi_stage_acc s = *a; /* the layers pushed, no run of them made again */
    s.most = 0;
    return stage_acc_finish(&s, r, slots, per_mb);
}

double rpi_stage_acc_least(const rpi_stage_acc *a, int r, int slots, double per_mb) {
    rpi_stage_acc s = *a; /* as rpi_stage_acc_bytes: the last layer kept */
    stage_acc_layer(&s, s.next++, true);
    return rpi_stage_acc_held(&s, r, slots, per_mb);
}

/* activations a micro-batch keeps: every output, or with recomputation the
** outputs that end a segment (the next layer has parameters, or the stage
** ends) and one segment's worth of the others, shared; where the profile
** says what each layer keeps, and keeps when recomputed, those */
double rpi_stage_bytes(const rp_config *cfg, const double *out_bytes, const double *param_bytes,
                       int first, int count, int r, int slots, double per_mb,
                       const rp_sim_options *opt) {
    rpi_stage_acc a;
    rpi_stage_acc_begin(&a, cfg, out_bytes, param_bytes, first, opt);
    if (count < 1)
        return stage_acc_finish(&a, r, slots, per_mb);
    while (a.next < first + count - 1)
        rpi_stage_acc_push(&a);
    return rpi_stage_acc_bytes(&a, r, slots, per_mb);
}

/* The link a tensor group of t consecutive workers all-reduces over: the
** cluster's, of the innermost level that holds the group (one machine's
** memory without levels). */
static double tensor_bandwidth(const rp_sim_options *opt, int t) {
    rpi_cluster c;
    rp_error err;
    if (rpi_cluster_make(opt, t, &c, &err)) /* the run itself fails with the machines' error */
        return 1e10;
    return c.bw[rpi_level_of(&c, 0, t - 1)];
}

void rpi_stage_costs_make(const rp_config *cfg, const int *counts, int P, const double *fwd_ms,
                          const double *bwd_ms, const double *out_bytes,
                          const double *param_bytes, int num_layers, const rp_sim_options *opt,
                          rpi_stage_costs *c) {
    double pbatch = opt->profile_batch > 0 ? opt->profile_batch : cfg->micro_batch_size;
    double per_mb = c->per_mb = cfg->micro_batch_size / pbatch;
    /* fp16 exchange halves what crosses between workers: activations and
    ** their gradients */
    double wire = cfg->fp16_exchange ? 0.5 : 1.0;
    int T = rp_config_tensor_parallel(cfg);
    double tbw = tensor_bandwidth(opt, T);
    for (int s = 0, l = 0; s < P; s++) {
        c->f[s] = c->b[s] = c->bi[s] = c->bw[s] = c->par[s] = c->tp_sums[s] = 0;
        double again = 0; /* recompute_layers: the forwards made again */
        for (int k = 0; k < counts[s]; k++, l++) {
            double w = opt->bwd_weight_ms ? opt->bwd_weight_ms[l]
                       : param_bytes[l] > 0 ? 0.5 * bwd_ms[l]
                                            : 0;
            unsigned tp = rpi_tensor_split_of(opt, T, l);
            double part = tp & RP_SIM_TP_SPLIT ? 1.0 / T : 1.0;
            double sum = out_bytes[l] * per_mb; /* a tensor group's all-reduce, when it has one */
            double n = tp & RP_SIM_TP_TWICE ? 2 : 1;
            double fsum = tp & RP_SIM_TP_REDUCE_OUTPUT
                              ? n * rpi_allreduce_time(T, sum, tbw, opt->latency) : 0;
            double bsum = tp & RP_SIM_TP_REDUCE_GRAD
                              ? n * rpi_allreduce_time(T, sum, tbw, opt->latency) : 0;
            c->f[s] += fwd_ms[l] * 1e-3 * per_mb * part + fsum;
            c->b[s] += bwd_ms[l] * 1e-3 * per_mb * part + bsum;
            c->bi[s] += (opt->bwd_input_ms ? opt->bwd_input_ms[l] : bwd_ms[l] - w) * 1e-3 * per_mb *
                            part + bsum;
            c->bw[s] += w * 1e-3 * per_mb * part;
            c->par[s] += param_bytes[l] * part;
            c->tp_sums[s] += fsum + bsum;
            if (k < counts[s] - 1 && rp_config_recomputes_layer(cfg, l))
                again += fwd_ms[l] * 1e-3 * per_mb * part + fsum;
        }
        if (cfg->recompute_checkpoint_every_layer) /* backward runs the stage forward again */
            c->b[s] += c->f[s], c->bi[s] += c->f[s];
        c->b[s] += again, c->bi[s] += again;
        /* what the stage sends, per micro-batch: a graph's cut may carry
        ** several tensors */
        c->act[s] = l > 0 ? (opt->cut_bytes && l < num_layers ? opt->cut_bytes[l] : out_bytes[l - 1]) *
                                wire * per_mb
                          : 0;
    }
}
