/*
** One configuration of a transformer on a cluster played as the planner
** plays its best estimates (rp_scale_simulate): the model's layers as a
** profile of one rank's costs, one replica's operation lists simulated, the
** replicas' reduction priced beside it; and every pipeline rank's memory of
** a configuration, which the search asks of its plan too.
*/
#include <stdlib.h>
#include <string.h>

#include "repipe/planner.h"
#include "scale_impl.h"

rp_status rpi_scale_ranks_memory(const rp_transformer *m, const rp_transformer_run *run,
                                 rp_sharding sharding, const rp_config *cfg,
                                 rp_transformer_memory *busiest, int *at, rp_error *err) {
    rp_derived d;
    rp_config_derive(cfg, &d);
    bool chunked = rp_config_chunked(cfg);
    int v = chunked ? cfg->virtual_stages : 1, P = d.stages / v;
    rp_transformer_layout lay = {.p = P, .d = cfg->replication_factor, .v = v,
                                 .v_shape = cfg->schedule == RP_SCHEDULE_DUALPIPEV,
                                 .micro_batches = cfg->gradient_accumulation_steps,
                                 .sharding = sharding,
                                 .layers_per_stage = cfg->layers_per_stage.count > 1
                                                         ? cfg->layers_per_stage.layers
                                                         : NULL};
    memset(busiest, 0, sizeof *busiest);
    *at = 0;
    for (int r = 0; r < P; r++) {
        rp_transformer_memory x;
        rp_status st = rp_transformer_rank_memory(m, run, &lay, r, &x, err);
        if (st)
            return st;
        if (x.total > busiest->total)
            *busiest = x, *at = r;
    }
    return RP_OK;
}

rp_status rp_scale_simulate(const rp_transformer *m, const rp_cluster *c,
                            const rp_transformer_run *run, rp_sharding sharding,
                            const rp_config *cfg, double *seconds,
                            rp_transformer_memory *busiest, rp_error *err) {
    rp_status st = rp_transformer_run_check(m, c, run, err);
    if (st)
        return st;
    int L = m->layers + 2;
    rpi_xf_part x[RPI_XF_PARTS];
    rpi_xf_parts(m, c, run, x);
    double *a = malloc(sizeof(double) * (size_t)L * 8);
    bool *redo = run->recompute == RP_RECOMPUTE_BLOCKS ? calloc((size_t)L, sizeof(bool)) : NULL;
    if (!a || (run->recompute == RP_RECOMPUTE_BLOCKS && !redo)) {
        free(a), free(redo);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for a profile of %d layers", L);
    }
    double *fw = a, *bw = a + L, *ob = a + 2 * L, *pb = a + 3 * L, *bi = a + 4 * L,
           *bwt = a + 5 * L, *saved = a + 6 * L, *ck = a + 7 * L;
    for (int l = 0; l < L; l++) {
        const rpi_xf_part *p = &x[rpi_xf_kind(m, l)];
        fw[l] = p->f * 1e3, bw[l] = (p->bi + p->bw) * 1e3, bi[l] = p->bi * 1e3;
        bwt[l] = p->bw * 1e3, ob[l] = p->out, pb[l] = 4 * (p->params + p->expert_params);
        saved[l] = p->saved, ck[l] = p->checkpoint;
    }
    /* some blocks recomputed: each such block's forward again before its
    ** backward, and only its input kept (the rest as the profile says) */
    if (redo) {
        rp_derived dc;
        rp_config_derive(cfg, &dc);
        int counts[RP_MAX_STAGES], C = dc.stages;
        if (cfg->layers_per_stage.count > 1)
            memcpy(counts, cfg->layers_per_stage.layers, sizeof(int) * (size_t)C);
        else
            rpi_xf_split(m->layers, C, counts);
        rpi_xf_recomputed(m, run, counts, C, redo);
        for (int l = 0; l < L; l++)
            if (redo[l])
                bw[l] += fw[l], bi[l] += fw[l], saved[l] = ck[l];
    }
    free(redo);
    /* one replica played, the others' reductions priced with it */
    rp_config sim = *cfg;
    int d = cfg->replication_factor;
    sim.replication_factor = 1;
    sim.replica_grouping = rp_grouping_all(1);
    sim.tensor_parallel = 1; /* (the profile's ranks hold it) */
    sim.recompute_checkpoint_every_layer = run->recompute == RP_RECOMPUTE_FULL;
    /* buckets of 40M parameters (Megatron-LM's default), moving while the
    ** last backward computes; the engine's own sharding does not bucket,
    ** so the state's shards are the options' */
    sim.replicated_tensor_sharding = false;
    sim.reduction_bucket_mb = run->overlap && d > 1 ? 160 : 0;
    rp_derived dv;
    rp_config_derive(&sim, &dv);
    rp_sim_options o;
    int width = run->tensor_parallel * run->context_parallel;
    if ((st = rp_cluster_sim_options(c, width, rp_config_devices(&sim, &dv) * d, &o, err))) {
        free(a);
        return st;
    }
    rp_cluster_sim_precision(c, run->precision, &o);
    o.replicas = d;
    o.blocking_sends = !run->overlap;
    o.profile_batch = cfg->micro_batch_size;
    o.bwd_input_ms = bi, o.bwd_weight_ms = bwt;
    o.kept_bytes = saved, o.recompute_kept_bytes = ck;
    if (sharding != RP_SHARD_NONE)
        o.state_shards = (double)d * run->context_parallel;
    /* A long update is its steady state repeated: past a few rounds of the
    ** pipeline, two shorter ones are played and the rest is the line through
    ** them (each further micro-batch adds the same time once the pipeline
    ** is full). */
    long long mb = cfg->gradient_accumulation_steps, step = 1;
    int P = dv.stages / (rp_config_chunked(&sim) ? sim.virtual_stages : 1);
    if (sim.schedule == RP_SCHEDULE_INTERLEAVED || sim.schedule == RP_SCHEDULE_DUALPIPEV)
        step = sim.schedule == RP_SCHEDULE_DUALPIPEV ? 2 : P;
    long long m1 = (2LL * P + step - 1) / step * step, m2 = m1 + (P + step - 1) / step * step;
    double t[2];
    for (int k = 0; k < (mb > m2 ? 2 : 1); k++) {
        sim.gradient_accumulation_steps = mb > m2 ? (int)(k ? m2 : m1) : (int)mb;
        rp_sim_result r;
        if ((st = rp_simulate(&sim, fw, bw, ob, pb, L, &o, &r, err))) {
            free(a);
            return st;
        }
        t[k] = r.update_time;
        rp_sim_result_free(&r);
    }
    free(a);
    *seconds = mb > m2 ? t[0] + (t[1] - t[0]) / (double)(m2 - m1) * (double)(mb - m1) : t[0];
    int at;
    return rpi_scale_ranks_memory(m, run, sharding, cfg, busiest, &at, err);
}

