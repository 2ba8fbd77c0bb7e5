/*
** repipe plan --cluster: the plan of a transformer on a cluster of devices,
** the question asked before a launch: which sizes and features, how fast,
** and will it fit.
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

/* The index of word w in words (NULL-terminated), or -1 after saying what
** --opt takes. */
static int word(const cli_cmd *cmd, const char *opt, const char *w, const char *const *words) {
    for (int i = 0; words[i]; i++)
        if (strcmp(w, words[i]) == 0)
            return i;
    char list[200];
    size_t n = 0;
    for (int i = 0; words[i] && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", words[i]);
    cli_error(cmd, "--%s: '%s' is not one of %s", opt, w, list);
    return -1;
}

/* The words of the feature options into o. */
static bool features(const cli_cmd *cmd, const plan_scale *ps, rp_scale_options *o) {
    static const char *const recompute[] = {"none", "selective", "full", "any", "off", "on",
                                            "blocks", NULL};
    static const char *const onoff[] = {"off", "on", NULL};
    static const char *const sharding[] = {"none", "optimizer", "fsdp", "any", NULL};
    static const char *const precision[] = {"bf16", "fp8", "fp32", "any", NULL};
    int k;
    if (ps->recompute) {
        if ((k = word(cmd, "recompute", ps->recompute, recompute)) < 0)
            return false;
        o->recompute = k == 3   ? -1
                       : k == 4 ? RP_RECOMPUTE_NONE
                       : k == 5 ? RP_RECOMPUTE_FULL
                       : k == 6 ? RP_RECOMPUTE_BLOCKS
                                : k;
    }
    if (ps->sequence_parallel) {
        if ((k = word(cmd, "sequence-parallel", ps->sequence_parallel, onoff)) < 0)
            return false;
        o->sequence_parallel = k ? 1 : -1;
    }
    if (ps->sharding) {
        if ((k = word(cmd, "sharding", ps->sharding, sharding)) < 0)
            return false;
        o->sharding = k == 3 ? -1 : k;
    }
    if (ps->precision) {
        if ((k = word(cmd, "precision", ps->precision, precision)) < 0)
            return false;
        o->precision = k == 3 ? -1 : k;
    }
    if (ps->overlap) {
        if ((k = word(cmd, "overlap", ps->overlap, onoff)) < 0)
            return false;
        o->no_overlap = k == 0;
    }
    if (ps->stages) {
        static const char *const stages[] = {"balanced", "even", NULL};
        if ((k = word(cmd, "stages", ps->stages, stages)) < 0)
            return false;
        o->even_stages = k == 1;
    }
    return true;
}

/* The model: --transformer, --transformer-config (with --transformer's keys
** over the file's), or the shape a --profile of 'repipe profile
** --transformer' was made of. */
static int model(const cli_cmd *cmd, const plan_scale *ps, rp_transformer *m) {
    rp_error err;
    if (ps->profile && (ps->transformer || ps->transformer_config)) {
        cli_error(cmd, "--profile or --transformer%s, not both: the plan's shape is one or the "
                       "other", ps->transformer_config ? "-config" : "");
        return 2;
    }
    if (ps->transformer_config) {
        char *unknown;
        if (rp_transformer_from_config(ps->transformer_config, ps->transformer, m, &unknown,
                                       &err)) {
            cli_error(cmd, "--transformer-config: %s", err.msg);
            return 1;
        }
        if (*unknown)
            fprintf(stderr, "repipe plan: note: %s: keys repipe does not know, not used: %s\n",
                    ps->transformer_config, unknown);
        free(unknown);
        return 0;
    }
    if (ps->transformer) {
        if (rp_transformer_parse(ps->transformer, m, &err)) {
            cli_error(cmd, "--transformer: %s", err.msg);
            return 2;
        }
        return 0;
    }
    if (!ps->profile) {
        cli_error(cmd, "--cluster plans a transformer: give --transformer SPEC (or a preset), "
                       "--transformer-config config.json, or --profile F of 'repipe profile "
                       "--transformer'");
        return 2;
    }
    rp_profile *p;
    if (rp_profile_read(&p, ps->profile, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    bool ok = false;
    rp_transformer_run run;
    for (int i = 0; i < p->num_nodes && !ok; i++)
        ok = strncmp(p->nodes[i].desc, "Input", 5) == 0 &&
             rp_transformer_of_profile(p->nodes[i].desc, m, &run);
    rp_profile_free(p);
    if (!ok) {
        cli_error(cmd, "%s: not a profile of 'repipe profile --transformer' (its Input says no "
                       "transformer=...): --cluster plans a transformer's shape", ps->profile);
        return 2;
    }
    return 0;
}

static void describe_model(FILE *f, const rp_transformer *m) {
    fprintf(f, "a transformer of %d layers (hidden %d, %d heads", m->layers, m->hidden, m->heads);
    if (m->kv_heads != m->heads)
        fprintf(f, ", %d key/value heads", m->kv_heads);
    fprintf(f, ", %s of %d, sequences of %d, vocabulary %d%s", m->mlp == RP_MLP_SWIGLU ?
            "SwiGLU" : "GELU MLP", m->ffn, m->seq, m->vocab, m->untied ? ", untied head" : "");
    if (m->experts)
        fprintf(f, "; %d of %d blocks a mixture of %d experts of %d, %d a token%s%.0d; %.2fB "
                "parameters, %.2fB active)", rp_transformer_moe_blocks(m), m->layers,
                m->experts, m->moe_ffn, m->top_k, m->shared_ffn ? ", a shared expert of " : "",
                m->shared_ffn, rp_transformer_parameters(m) / 1e9,
                rp_transformer_active_parameters(m) / 1e9);
    else
        fprintf(f, "; %.2fB parameters)", rp_transformer_parameters(m) / 1e9);
}

static void describe_plan(FILE *f, const rp_scale_plan *r, const rp_cluster *c, int devices) {
    const char *sched = rp_schedule_name(r->cfg.schedule);
    fprintf(f, "  tensor groups of %d%s", r->t,
            r->run.sequence_parallel ? " with sequence parallelism" : "");
    if (r->cp > 1)
        fprintf(f, ", context groups of %d", r->cp);
    if (r->run.expert_parallel > 1 || r->run.expert_tensor_parallel > 1)
        fprintf(f, ", expert groups of %d (each expert over %d)", r->run.expert_parallel,
                r->run.expert_tensor_parallel > 1 ? r->run.expert_tensor_parallel : 1);
    fprintf(f, ", %d pipeline rank%s", r->p, r->p == 1 ? "" : "s");
    if (r->v > 1)
        fprintf(f, " of %d chunks each", r->v);
    fprintf(f, " (%s), %d replica%s", sched, r->d, r->d == 1 ? "" : "s");
    if (r->sharding != RP_SHARD_NONE)
        fprintf(f, " (%s)", r->sharding == RP_SHARD_FULL ? "fully sharded, FSDP"
                                                         : "optimizer state sharded");
    char redo[96];
    snprintf(redo, sizeof redo, "the first %d block%s of each %s recomputed",
             r->run.recompute_blocks, r->run.recompute_blocks == 1 ? "" : "s",
             r->v > 1 ? "chunk" : "stage");
    fprintf(f, ", micro-batches of %d x %d, %s, %s\n", r->b, r->cfg.gradient_accumulation_steps,
            r->run.recompute == RP_RECOMPUTE_FULL        ? "every block recomputed"
            : r->run.recompute == RP_RECOMPUTE_SELECTIVE ? "attention's core recomputed"
            : r->run.recompute == RP_RECOMPUTE_BLOCKS    ? redo
                                                         : "no recomputation",
            rp_precision_name(r->run.precision));
    double peak = rp_precision_peak(&c->device, r->run.precision);
    fprintf(f, "  predicted %.3f s an update, %.1f TFLOP/s a device as Megatron-LM counts them "
               "(%.0f %% of the %s peak); %.1f by equation 3 of its SC'21 paper; MFU %.1f %% as "
               "PyTorch users count it (6N + attention)\n",
            r->seconds, r->tflops_per_device, 100 * r->tflops_per_device * 1e12 / peak,
            rp_precision_name(r->run.precision), r->tflops_eq3, 100 * r->mfu);
    fprintf(f, "  memory: at most %.1f of %.1f GB a device (pipeline rank %d: %.1f GB of weights "
               "and optimizer state for %.2fB parameters, %.1f GB of activations)\n",
            r->memory.total / 1e9, c->device.memory_bytes / 1e9, r->busiest_rank,
            r->memory.weights / 1e9, r->memory.parameters / 1e9, r->memory.activations / 1e9);
    (void)devices;
}

/* each pipeline rank's memory, as the plan counts it */
static void memory_by_rank(FILE *j, const rp_scale_plan *r, const rp_transformer *m) {
    fprintf(j, "],\n\t\"memory_by_rank\":\t[");
    rp_transformer_layout lay = {
        .p = r->p, .d = r->d, .v = r->v, .v_shape = r->cfg.schedule == RP_SCHEDULE_DUALPIPEV,
        .micro_batches = r->cfg.gradient_accumulation_steps, .sharding = r->sharding,
        .layers_per_stage = r->cfg.layers_per_stage.count > 1 ? r->cfg.layers_per_stage.layers
                                                              : NULL};
    for (int k = 0; k < r->p; k++) {
        rp_transformer_memory x;
        rp_error err;
        if (rp_transformer_rank_memory(m, &r->run, &lay, k, &x, &err))
            memset(&x, 0, sizeof x);
        fprintf(j, "%s{\"parameters\": %.0f, \"weights_and_optimizer\": %.0f, "
                   "\"activations\": %.0f}", k ? ", " : "", x.parameters, x.weights,
                x.activations);
    }
}

static char *json_of(const rp_scale_plan *r, const rp_cluster *c, const rp_transformer *m,
                     const rp_scale_options *o) {
    char *text = NULL, shape[512];
    size_t len;
    FILE *j = open_memstream(&text, &len);
    if (!j)
        return NULL;
    rp_transformer_format(m, shape, sizeof shape);
    fprintf(j, "{\n\t\"cluster\":\t\"%s\",\n\t\"device\":\t\"%s\",\n\t\"devices\":\t%d,\n"
               "\t\"global_batch\":\t%lld,\n\t\"transformer\":\t\"%s\",\n"
               "\t\"parameters\":\t%.0f,\n"
               "\t\"active_parameters\":\t%.0f,\n"
               "\t\"tensor_parallel\":\t%d,\n\t\"context_parallel\":\t%d,\n"
               "\t\"expert_parallel\":\t%d,\n\t\"expert_tensor_parallel\":\t%d,\n"
               "\t\"capacity\":\t%g,\n"
               "\t\"pipeline_parallel\":\t%d,\n\t\"data_parallel\":\t%d,\n\t\"micro_batch\":\t%d,\n"
               "\t\"micro_batches\":\t%d,\n\t\"virtual_stages\":\t%d,\n\t\"schedule\":\t\"%s\",\n"
               "\t\"sequence_parallel\":\t%s,\n\t\"recompute\":\t\"%s\",\n"
               "\t\"recompute_blocks\":\t%d,\n\t\"sharding\":\t\"%s\",\n"
               "\t\"precision\":\t\"%s\",\n\t\"overlap\":\t%s,\n"
               "\t\"seconds_per_update\":\t%.9g,\n\t\"tflops_per_device\":\t%.6g,\n"
               "\t\"tflops_per_device_eq3\":\t%.6g,\n\t\"mfu\":\t%.6g,\n"
               "\t\"flops_per_update\":\t{\"megatron\": %.17g, \"eq3\": %.17g, \"6n\": %.17g},\n"
               "\t\"peak_memory_bytes\":\t%.0f,\n\t\"busiest_rank\":\t%d,\n"
               "\t\"memory\":\t{\"parameters\": %.0f, \"weights_and_optimizer\": %.0f, "
               "\"activations\": %.0f},\n"
               "\t\"considered\":\t%d,\n\t\"simulated\":\t%d,\n\t\"layers_per_stage\":\t[",
            c->name, c->device.name, o->devices, o->global_batch, shape,
            rp_transformer_parameters(m), rp_transformer_active_parameters(m), r->t, r->cp,
            r->run.expert_parallel > 1 ? r->run.expert_parallel : 1,
            r->run.expert_tensor_parallel > 1 ? r->run.expert_tensor_parallel : 1,
            r->run.capacity, r->p, r->d,
            r->b,
            r->cfg.gradient_accumulation_steps, r->v, rp_schedule_name(r->cfg.schedule),
            r->run.sequence_parallel ? "true" : "false", rp_recompute_name(r->run.recompute),
            r->run.recompute == RP_RECOMPUTE_BLOCKS ? r->run.recompute_blocks : 0,
            rp_sharding_name(r->sharding), rp_precision_name(r->run.precision),
            r->run.overlap ? "true" : "false", r->seconds, r->tflops_per_device, r->tflops_eq3,
            r->mfu, rp_transformer_flops_megatron(m, r->t, (double)o->global_batch),
            rp_transformer_flops_eq3(m, (double)o->global_batch),
            rp_transformer_flops_6n(m, (double)o->global_batch), r->memory.total,
            r->busiest_rank, r->memory.parameters, r->memory.weights, r->memory.activations,
            r->considered, r->simulated);
    for (int s = 0; s < r->cfg.layers_per_stage.count; s++)
        fprintf(j, "%s%d", s ? ", " : "", r->cfg.layers_per_stage.layers[s]);
    memory_by_rank(j, r, m);
    fprintf(j, "]\n}\n");
    if (fclose(j) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* The files to write, written only once all of them are ready. */
typedef struct outputs {
    const char *paths[4], *texts[4];
    char *owned[4], settings_path[4096];
    int n;
} outputs;

static void keep(outputs *w, const char *path, char *text) {
    w->paths[w->n] = path, w->texts[w->n] = w->owned[w->n] = text, w->n++;
}

/* The trainers' settings, said (Megatron-LM's always, unless --emit names
** the other) and kept for --emit-out. */
static bool settings(const cli_cmd *cmd, const plan_scale *ps, const rp_transformer *m,
                     const rp_scale_plan *r, long long global_batch, FILE *f, outputs *w) {
    rp_error err;
    for (int k = 0; k < 2; k++) {
        rp_trainer t = k == 0 ? RP_TRAINER_MEGATRON : RP_TRAINER_TORCHTITAN;
        if ((k == 1 && !(ps->emit->on && ps->emit->trainer == t)) ||
            (k == 0 && ps->emit->on && ps->emit->trainer != t))
            continue;
        char *text, why[512];
        if (rp_scale_settings(t, m, r, global_batch, &text, why, sizeof why, &err)) {
            cli_error(cmd, "%s", err.msg);
            return false;
        }
        fprintf(f, "  %s:", rp_trainer_name(t));
        for (const char *p = text; *p;) {
            size_t len = strcspn(p, "\n");
            fprintf(f, " %.*s", (int)len, p);
            p += len + (p[len] == '\n');
        }
        fprintf(f, "\n");
        if (*why)
            fprintf(f, "  (%s)\n", why);
        if (ps->emit->on && ps->emit->out && t == ps->emit->trainer) {
            snprintf(w->settings_path, sizeof w->settings_path, "%s", ps->emit->out);
            keep(w, w->settings_path, text);
        } else {
            free(text);
        }
    }
    return true;
}

/* --config-out and --json made and kept (--json - printed); false (said)
** when either cannot be made. */
static bool files(const cli_cmd *cmd, const plan_scale *ps, const rp_transformer *m,
                  const rp_cluster *c, const rp_scale_options *o, const rp_scale_plan *r,
                  outputs *w) {
    rp_error err;
    char *text;
    if (ps->config_out) {
        if (rp_config_to_json(&r->cfg, &text, &err)) {
            cli_error(cmd, "%s", err.msg);
            return false;
        }
        keep(w, ps->config_out, text);
    }
    if (!ps->json)
        return true;
    if (!(text = json_of(r, c, m, o))) {
        cli_error(cmd, "out of memory for the JSON");
        return false;
    }
    if (strcmp(ps->json, "-") == 0) {
        fputs(text, stdout);
        free(text);
    } else {
        keep(w, ps->json, text);
    }
    return true;
}

/* The plan in words: the model, the cluster, the shape, its stages. */
static void report(FILE *f, const rp_transformer *m, const rp_cluster *c,
                   const rp_scale_options *o, const rp_scale_plan *r, double took) {
    describe_model(f, m);
    fprintf(f, " on %d %s of %s, %lld sequences an update:\n", o->devices, c->device.name,
            c->name, o->global_batch);
    describe_plan(f, r, c, o->devices);
    fprintf(f, "  %d shapes considered, the %d best estimates that fit simulated, in %.2f s\n",
            r->considered, r->simulated, took);
    if (r->cfg.layers_per_stage.count > 1) {
        fprintf(f, "  layers a %s (the embedding in the first, the head in the last):",
                r->v > 1 ? "chunk" : "stage");
        for (int s = 0; s < r->cfg.layers_per_stage.count && s < 24; s++)
            fprintf(f, " %d", r->cfg.layers_per_stage.layers[s]);
        fprintf(f, "%s\n", r->cfg.layers_per_stage.count > 24 ? " ..." : "");
    }
}

int plan_scale_run(const cli_cmd *cmd, const plan_scale *ps) {
    rp_error err;
    rp_cluster c;
    rp_transformer m;
    rp_scale_options o = ps->o;
    if (!features(cmd, ps, &o))
        return 2;
    if (rp_cluster_get(ps->cluster, &c, &err)) {
        cli_error(cmd, "--cluster: %s", err.msg);
        return 1;
    }
    int rc = model(cmd, ps, &m);
    if (rc)
        return rc;
    if (!o.devices || !o.global_batch) {
        cli_error(cmd, "--cluster needs --devices N and --global-batch B");
        return 2;
    }
    if (ps->emit->out && !ps->emit->on) {
        cli_error(cmd, "--emit-out needs --emit torchtitan|megatron");
        return 2;
    }
    double start = now();
    rp_scale_plan r;
    if (rp_scale_plan_compute(&m, &c, &o, &r, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    FILE *f = ps->json && strcmp(ps->json, "-") == 0 ? stderr : stdout;
    report(f, &m, &c, &o, &r, now() - start);
    outputs w = {.n = 0};
    if (!settings(cmd, ps, &m, &r, o.global_batch, f, &w) || !files(cmd, ps, &m, &c, &o, &r, &w))
        rc = 1;
    else if (w.n && rp_write_files_atomic(w.n, w.paths, w.texts, &err)) {
        cli_error(cmd, "%s (nothing written)", err.msg);
        rc = 1;
    } else if (ps->config_out && r.run.recompute == RP_RECOMPUTE_BLOCKS) {
        fprintf(f, "configuration written to %s (its recomputation of some blocks is not a "
                   "configuration's: the engine's recomputes every layer or none)\n",
                ps->config_out);
    } else if (ps->config_out) {
        char shape[512];
        rp_transformer_format(&m, shape, sizeof shape);
        fprintf(f, "configuration written to %s; simulate it with the profile of its run:\n"
                   "  repipe profile --transformer %s --cluster %s --micro-batch %d "
                   "--tensor-parallel %d --context-parallel %d --sequence-parallel %s "
                   "--recompute %s --precision %s --out F && repipe simulate --profile F "
                   "--config %s --cluster %s\n",
                ps->config_out, shape, ps->cluster, r.b, r.t, r.cp,
                r.run.sequence_parallel ? "on" : "off", rp_recompute_name(r.run.recompute),
                rp_precision_name(r.run.precision), ps->config_out, ps->cluster);
    }
    for (int k = 0; k < w.n; k++)
        free(w.owned[k]);
    return rc;
}
