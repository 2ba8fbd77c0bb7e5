/*
** repipe plan --cluster: the plan of a transformer on a cluster of devices,
** the question asked before a launch: which sizes, how fast, and will it
** fit.
*/
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/core/util.h"
#include "plan_scale.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int plan_scale_run(const cli_cmd *cmd, const plan_scale *ps) {
    rp_error err;
    rp_cluster c;
    rp_transformer m;
    int t0;
    if (rp_cluster_get(ps->cluster, &c, &err)) {
        cli_error(cmd, "--cluster: %s", err.msg);
        return 1;
    }
    if (ps->transformer) {
        if (rp_transformer_parse(ps->transformer, &m, &err)) {
            cli_error(cmd, "--transformer: %s", err.msg);
            return 2;
        }
    } else {
        rp_profile *p;
        if (!ps->profile) {
            cli_error(cmd, "--cluster plans a transformer: give --transformer SPEC, or --profile "
                           "F of 'repipe profile --transformer'");
            return 2;
        }
        if (rp_profile_read(&p, ps->profile, &err)) {
            cli_error(cmd, "%s", err.msg);
            return 1;
        }
        bool ok = false;
        for (int i = 0; i < p->num_nodes && !ok; i++)
            ok = strncmp(p->nodes[i].desc, "Input", 5) == 0 &&
                 rp_transformer_of_profile(p->nodes[i].desc, &m, &t0);
        rp_profile_free(p);
        if (!ok) {
            cli_error(cmd, "%s: not a profile of 'repipe profile --transformer' (its Input says "
                           "no transformer=...): --cluster plans a transformer's shape",
                      ps->profile);
            return 2;
        }
    }
    if (!ps->o.devices || !ps->o.global_batch) {
        cli_error(cmd, "--cluster needs --devices N and --global-batch B");
        return 2;
    }
    double start = now();
    rp_scale_plan r;
    if (rp_scale_plan_compute(&m, &c, &ps->o, &r, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    double took = now() - start;
    bool quiet = ps->json && strcmp(ps->json, "-") == 0;
    FILE *f = quiet ? stderr : stdout;
    const char *sched = rp_schedule_name(r.cfg.schedule);
    fprintf(f, "a transformer of %d layers (hidden %d, %d heads, sequences of %d, vocabulary %d) "
               "on %d %s of %s, %lld sequences an update:\n",
            m.layers, m.hidden, m.heads, m.seq, m.vocab, ps->o.devices, c.device.name, c.name,
            ps->o.global_batch);
    fprintf(f, "  tensor groups of %d, %d pipeline rank%s", r.t, r.p, r.p == 1 ? "" : "s");
    if (r.v > 1)
        fprintf(f, " of %d chunks each", r.v);
    fprintf(f, " (%s), %d replica%s, micro-batches of %d x %d, %s\n", sched, r.d,
            r.d == 1 ? "" : "s", r.b, r.cfg.gradient_accumulation_steps,
            r.recompute ? "each block recomputed" : "no recomputation");
    fprintf(f, "  predicted %.3f s an update, %.1f TFLOP/s a device (equation 3 of Megatron-LM's "
               "paper; %.0f %% of the peak), at most %.1f of %.1f GB a device\n",
            r.seconds, r.tflops_per_device, 100 * r.tflops_per_device * 1e12 / c.device.peak_flops,
            r.peak_bytes / 1e9, c.device.memory_bytes / 1e9);
    fprintf(f, "  %d shapes considered, the %d best estimates that fit simulated, in %.2f s\n",
            r.considered, r.simulated, took);
    if (r.cfg.layers_per_stage.count > 1) {
        fprintf(f, "  layers a %s (the embedding in the first, the head in the last):",
                r.v > 1 ? "chunk" : "stage");
        for (int s = 0; s < r.cfg.layers_per_stage.count && s < 24; s++)
            fprintf(f, " %d", r.cfg.layers_per_stage.layers[s]);
        fprintf(f, "%s\n", r.cfg.layers_per_stage.count > 24 ? " ..." : "");
    }
    fprintf(f, "  Megatron-LM: --tensor-model-parallel-size %d --pipeline-model-parallel-size %d "
               "--micro-batch-size %d --global-batch-size %lld",
            r.t, r.p, r.b, ps->o.global_batch);
    if (r.v > 1 && r.cfg.schedule != RP_SCHEDULE_DUALPIPEV)
        fprintf(f, " --num-virtual-stages-per-pipeline-rank %d", r.v);
    if (r.recompute)
        fprintf(f, " --recompute-granularity full --recompute-method uniform "
                   "--recompute-num-layers 1");
    fprintf(f, "\n");
    if (r.cfg.schedule == RP_SCHEDULE_DUALPIPEV)
        fprintf(f, "  (Megatron-LM has no DualPipeV: the line above is its shape under 1f1b; "
                   "repipe's engine runs the V as --config-out writes it)\n");
    int rc = 0;
    if (ps->config_out) {
        if (rp_config_save_file(&r.cfg, ps->config_out, &err)) {
            cli_error(cmd, "%s", err.msg);
            return 1;
        }
        fprintf(f, "configuration written to %s; simulate it with the profile of its micro-batch "
                   "and tensor groups:\n  repipe profile --transformer layers=%d,hidden=%d,"
                   "heads=%d,seq=%d,vocab=%d --cluster %s --micro-batch %d --tensor-parallel %d "
                   "--out F && repipe simulate --profile F --config %s --cluster %s\n",
                ps->config_out, m.layers, m.hidden, m.heads, m.seq, m.vocab, ps->cluster, r.b,
                r.t, ps->config_out, ps->cluster);
    }
    if (ps->json) {
        char *text = NULL;
        size_t len;
        FILE *j = open_memstream(&text, &len);
        if (!j) {
            cli_error(cmd, "out of memory");
            return 1;
        }
        fprintf(j, "{\n\t\"cluster\":\t\"%s\",\n\t\"devices\":\t%d,\n\t\"global_batch\":\t%lld,\n"
                   "\t\"tensor_parallel\":\t%d,\n\t\"pipeline_parallel\":\t%d,\n"
                   "\t\"data_parallel\":\t%d,\n\t\"micro_batch\":\t%d,\n\t\"virtual_stages\":\t%d,\n"
                   "\t\"schedule\":\t\"%s\",\n\t\"recompute\":\t%s,\n"
                   "\t\"seconds_per_update\":\t%.9g,\n\t\"tflops_per_device\":\t%.6g,\n"
                   "\t\"peak_memory_bytes\":\t%.0f,\n\t\"considered\":\t%d,\n\t\"simulated\":\t%d,\n"
                   "\t\"layers_per_stage\":\t[",
                c.name, ps->o.devices, ps->o.global_batch, r.t, r.p, r.d, r.b, r.v, sched,
                r.recompute ? "true" : "false", r.seconds, r.tflops_per_device, r.peak_bytes,
                r.considered, r.simulated);
        for (int s = 0; s < r.cfg.layers_per_stage.count; s++)
            fprintf(j, "%s%d", s ? ", " : "", r.cfg.layers_per_stage.layers[s]);
        fprintf(j, "]\n}\n");
        fclose(j);
        if (quiet)
            fputs(text, stdout);
        else if (rp_write_file_atomic(ps->json, text, strlen(text), &err)) {
            cli_error(cmd, "%s", err.msg);
            rc = 1;
        }
        free(text);
    }
    return rc;
}
