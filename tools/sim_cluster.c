/*
** repipe simulate --cluster: the cluster's devices under the configuration's
** workers, and what a run on them is worth: FLOP/s a device as Megatron-LM
** counts them, and each pipeline rank's memory before launch.
*/
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <stdlib.h>
#include <string.h>

#include "sim_cluster.h"

bool sim_cluster_setup(const cli_cmd *cmd, const char *name, const rp_profile *p, rp_config *cfg,
                       rp_sim_options *opt, sim_cluster *sc) {
    rp_error err;
    memset(sc, 0, sizeof *sc);
    sc->t = 1;
    for (int i = 0; i < p->num_nodes; i++)
        if (strncmp(p->nodes[i].desc, "Input", 5) == 0 &&
            rp_transformer_of_profile(p->nodes[i].desc, &sc->m, &sc->run)) {
            sc->transformer = true;
            sc->t = sc->run.tensor_parallel * sc->run.context_parallel;
        }
    if (!name)
        return true;
    sc->on = true;
    if (rp_cluster_get(name, &sc->c, &err)) {
        cli_error(cmd, "--cluster: %s", err.msg);
        return false;
    }
    int T = rp_config_tensor_parallel(cfg);
    if (sc->transformer) {
        if (T != 1 && T != sc->run.tensor_parallel) {
            cli_error(cmd, "the configuration's tensor_parallel %d is not the profile's tensor "
                           "groups of %d ('repipe profile --transformer ... --tensor-parallel %d')",
                      T, sc->run.tensor_parallel, T);
            return false;
        }
        if (cfg->micro_batch_size != sc->run.micro_batch) {
            cli_error(cmd, "the configuration's micro_batch_size %d is not the profile's %d "
                           "('repipe profile --transformer ... --micro-batch %d')",
                      cfg->micro_batch_size, sc->run.micro_batch, cfg->micro_batch_size);
            return false;
        }
        cfg->tensor_parallel = 1; /* (in the profile's times) */
    } else if (T > 1) {
        cli_error(cmd, "--cluster with tensor_parallel %d needs a transformer profile ('repipe "
                       "profile --transformer'), whose nodes are one rank of a group", T);
        return false;
    }
    rp_derived d;
    rp_config_derive(cfg, &d);
    int workers = rp_config_devices(cfg, &d);
    rp_sim_options o;
    if (rp_cluster_sim_options(&sc->c, sc->t, workers, &o, &err)) {
        cli_error(cmd, "%s", err.msg);
        return false;
    }
    if (sc->transformer)
        rp_cluster_sim_precision(&sc->c, sc->run.precision, &o);
    opt->num_levels = o.num_levels;
    memcpy(opt->machines, o.machines, sizeof o.machines);
    memcpy(opt->bandwidth, o.bandwidth, sizeof o.bandwidth);
    opt->latency = o.latency;
    opt->memory_bandwidth = o.memory_bandwidth;
    opt->mixed_precision = o.mixed_precision;
    return true;
}

/* Pipeline rank r's bytes: its stage's, or its chunks' together (under
** dualpipe stages r and P - 1 - r, one of each replica of a pair); a
** transformer's as rp_transformer_rank_memory counts them. */
int sim_rank_bytes(const sim_cluster *sc, const rp_config *cfg, const rp_sim_result *res,
                   double *out) {
    int P = rp_config_chunked(cfg) ? res->stages / cfg->virtual_stages : res->stages;
    if (sc && sc->transformer && !rp_config_paired(cfg)) {
        rp_transformer_run run = sc->run;
        if (cfg->recompute_checkpoint_every_layer)
            run.recompute = RP_RECOMPUTE_FULL;
        rp_transformer_layout lay = {
            .p = P, .d = cfg->replication_factor, .v = rp_config_chunked(cfg) ? cfg->virtual_stages : 1,
            .v_shape = rp_config_v_shaped(cfg), .micro_batches = cfg->gradient_accumulation_steps,
            .sharding = cfg->replicated_tensor_sharding ? RP_SHARD_OPTIMIZER : RP_SHARD_NONE,
            .layers_per_stage = cfg->layers_per_stage.count > 1 ? cfg->layers_per_stage.layers : NULL};
        rp_error err;
        for (int r = 0; r < P; r++) {
            rp_transformer_memory x;
            out[r] = rp_transformer_rank_memory(&sc->m, &run, &lay, r, &x, &err) ? 0 : x.total;
        }
        return P;
    }
    for (int r = 0; r < P; r++) {
        if (rp_config_paired(cfg)) {
            out[r] = res->stage_bytes[r] + res->stage_bytes[P - 1 - r];
            continue;
        }
        out[r] = 0;
        int k = rp_config_chunked(cfg) ? cfg->virtual_stages : 1;
        for (int j = 0; j < k; j++)
            out[r] += res->stage_bytes[rp_config_chunked(cfg) ? rp_config_chunk(cfg, P, r, j) : r];
    }
    return P;
}

/* TFLOP/s a device as Megatron-LM counts them (num_floating_point_operations)
** and (eq3) as its SC'21 paper's equation 3 does. */
static double tflops(const sim_cluster *sc, const rp_config *cfg, const rp_sim_result *res,
                     int devices, bool eq3) {
    rp_derived d;
    rp_config_derive(cfg, &d);
    double f = eq3 ? rp_transformer_flops_eq3(&sc->m, d.samples_per_update)
                   : rp_transformer_flops_megatron(&sc->m, sc->run.tensor_parallel,
                                                   d.samples_per_update);
    return f / (res->update_time * devices) / 1e12;
}

static int devices_of(const sim_cluster *sc, const rp_config *cfg) {
    rp_derived d;
    rp_config_derive(cfg, &d);
    return rp_config_devices(cfg, &d) * sc->t;
}

void sim_cluster_print(FILE *f, const sim_cluster *sc, const rp_config *cfg,
                       const rp_sim_result *res) {
    if (!sc->on)
        return;
    int devices = devices_of(sc, cfg);
    fprintf(f, "on %s: %d %s devices (%d a node, %d a worker)", sc->c.name, devices,
            sc->c.device.name, sc->c.per_node, sc->t);
    if (sc->transformer) {
        double peak = rp_precision_peak(&sc->c.device, sc->run.precision);
        fprintf(f, ", %.1f TFLOP/s a device as Megatron-LM counts them (%.0f %% of the %s "
                   "peak; %.1f by equation 3 of its SC'21 paper)",
                tflops(sc, cfg, res, devices, false),
                100 * tflops(sc, cfg, res, devices, false) * 1e12 / peak,
                rp_precision_name(sc->run.precision), tflops(sc, cfg, res, devices, true));
    }
    fprintf(f, "\n");
    double bytes[RP_MAX_STAGES];
    int P = sim_rank_bytes(sc, cfg, res, bytes);
    double most = 0;
    for (int r = 0; r < P; r++)
        most = bytes[r] > most ? bytes[r] : most;
    fprintf(f, "memory a device holds, by pipeline rank (of %.1f GB):", sc->c.device.memory_bytes / 1e9);
    for (int r = 0; r < P && r < 16; r++)
        fprintf(f, " %.1f", bytes[r] / 1e9);
    fprintf(f, "%s GB%s\n", P > 16 ? " ..." : "",
            most > sc->c.device.memory_bytes ? "  -- does not fit" : "");
}

char *sim_cluster_json(const sim_cluster *sc, const rp_config *cfg, const rp_sim_result *res) {
    if (!sc->on)
        return NULL;
    char *text = NULL;
    size_t len;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    int devices = devices_of(sc, cfg);
    fprintf(f, ",\n\t\"cluster\":\t\"%s\",\n\t\"devices\":\t%d,\n\t\"device_memory_bytes\":\t%.0f",
            sc->c.name, devices, sc->c.device.memory_bytes);
    if (sc->transformer)
        fprintf(f, ",\n\t\"tflops_per_device\":\t%.6g,\n\t\"tflops_per_device_eq3\":\t%.6g",
                tflops(sc, cfg, res, devices, false), tflops(sc, cfg, res, devices, true));
    double bytes[RP_MAX_STAGES];
    int P = sim_rank_bytes(sc, cfg, res, bytes);
    fprintf(f, ",\n\t\"peak_memory_per_rank\":\t[");
    for (int r = 0; r < P; r++)
        fprintf(f, "%s%.0f", r ? ", " : "", bytes[r]);
    fprintf(f, "]");
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}
