/*
** repipe config show|check FILE: validates a configuration and prints the
** numbers derived from it.
*/
#include <stdlib.h>
#include <string.h>

#include "../src/core/json.h"

#include "cli.h"
#include "repipe/repipe.h"

static const cli_opt OPTS[] = {
    {"layers", 'l', "L", "number of layers of the model, to resolve -1 wildcards"},
    {"json", 0, NULL, "print JSON instead of text (show)"},
    {"model", 'm', "FILE", "check against this model: its layers, its loss, its embeddings (sets --layers)"},
    {"pod-type", 0, "POD", "an IPUConfig of Optimum Graphcore 0.2.1-0.6.0: the pod type (pod4, pod16, ...) whose values to take [the file's pod_type, else \"default\"]"},
    {NULL, 0, NULL, NULL},
};

static void print_list(const int *v, int n) {
    printf("[");
    for (int i = 0; i < n; i++)
        printf("%s%d", i ? ", " : "", v[i]);
    printf("]");
}

/* Stage layer ranges, or a note when wildcards need the layer count. */
/* The layers of every stage into out: 1; 0 when wildcards need --layers;
** -1 after printing why they cannot be split. */
static int stage_ranges(const cli_cmd *cmd, const rp_config *cfg, bool inference, int layers,
                        int *out) {
    const rp_layer_list *l =
        inference && cfg->inference_layers_set ? &cfg->inference_layers_per_stage
                                               : &cfg->layers_per_stage;
    bool wild = false;
    int sum = 0;
    for (int i = 0; i < l->count; i++) {
        wild |= l->layers[i] == -1;
        sum += l->layers[i];
    }
    if (layers == 0 && wild)
        return 0;
    rp_error err;
    if (rp_config_stage_layers(cfg, inference, layers ? layers : sum, out, &err)) {
        cli_error(cmd, "%s", err.msg);
        return -1;
    }
    return 1;
}

/* What a graph's stage receives: every tensor alive at its first layer. */
static void print_cut(const rp_model *m, int first) {
    int *t = malloc(sizeof(int) * (m->num_layers + 1)), n = t ? rp_model_boundary(m, first, t) : 0;
    printf("            receives %d tensor%s (", n, n == 1 ? "" : "s");
    for (int i = 0; i < n; i++)
        printf(t[i] < 0 ? "%sthe input" : "%slayer %d", i ? ", " : "", t[i]);
    printf("), %zu floats a sample\n", rp_model_boundary_size(m, first));
    free(t);
}

/* The tensor groups in PopXL's words, over the workers: the tensor group,
** and its transpose, the copies of one slice (PopXL's GPT-J shards a
** variable this way, all-reducing its gradient over the transpose). Under
** the chunked schedules a worker runs the same rank of each of its chunks'
** tensor groups: the groups over the workers, a slice's copies then each
** chunk's replicas of that rank. */
static void show_tensor_groups(const rp_config *cfg, const rp_derived *d) {
    char gbuf[96];
    bool chunked = rp_config_chunked(cfg);
    int T = cfg->tensor_parallel, W = chunked ? rp_config_devices(cfg, d) : d->workers;
    rp_grouping tg, dg;
    rp_error gerr;
    rp_grouping_init(&tg, W, T, 1, &gerr);
    printf("  tensor parallel            %d: attention, MLP%s split over workers %d..%d, "
           "%d..%d, ...\n", T, cfg->vocab_parallel ? ", embedding and head" : " (the "
           "vocabulary whole)", 0, T - 1, T, 2 * T - 1);
    printf("    tensor groups            %s over the %d workers%s\n",
           rp_grouping_to_string(&tg, gbuf, sizeof gbuf), W,
           chunked ? ", each the same rank of its chunks' groups" : "");
    if (!chunked && rp_grouping_transpose(&tg, &dg, &gerr) == RP_OK)
        printf("    a slice's copies         %s, the transpose: its gradient is all-reduced "
               "over it%s\n", rp_grouping_to_string(&dg, gbuf, sizeof gbuf),
               d->stages > 1 ? ", among the workers of its stage" : "");
}

/* The optimizer, its learning rate's schedule, clipping, the data's order
** and the reduction's buckets. */
static void show_optimizer(const rp_config *cfg) {
    printf("  optimizer                  %s, lr %g\n", rp_optimizer_name(cfg->optimizer.type),
           cfg->optimizer.lr);
    const rp_lr_schedule *ls = &cfg->lr_schedule;
    if (ls->warmup_updates)
        printf("  lr warm-up                 %lld updates\n", ls->warmup_updates);
    if (ls->type == RP_LR_COSINE)
        printf("  lr schedule                cosine to %g at update %lld\n", ls->min_lr,
               ls->decay_updates);
    else if (ls->type == RP_LR_STEP)
        printf("  lr schedule                x %g every %lld updates\n", ls->gamma,
               ls->step_updates);
    if (cfg->gradient_clipping > 0)
        printf("  gradient clipping          global norm %g\n", cfg->gradient_clipping);
    if (cfg->sequential_data)
        printf("  data order                 sequential\n");
    if (cfg->reduction_bucket_mb > 0)
        printf("  gradient reduction         in buckets of %g MB, started during the last "
               "backward\n",
               cfg->reduction_bucket_mb);
}

/* The memory features that are on, one line each, and the device's memory. */
static void show_memory(const rp_config *cfg) {
    bool any = cfg->replicated_tensor_sharding || cfg->optimizer_state_offchip ||
               cfg->recompute_checkpoint_every_layer || cfg->recompute_layers_count ||
               cfg->auto_loss_scaling ||
               cfg->fp16_exchange || cfg->loss_scaling > 0 ||
               cfg->embedding_serialization_factor > 1 || cfg->executable_cache_dir[0];
    printf("  memory features%s\n", any ? "" : "            none");
    if (cfg->replicated_tensor_sharding)
        printf("    optimizer state sharded over the workers that share a variable\n");
    if (cfg->optimizer_state_offchip)
        printf("    optimizer state in files, streamed in for the update\n");
    if (cfg->recompute_checkpoint_every_layer)
        printf("    activations recomputed from checkpoints in backward\n");
    if (cfg->recompute_layers_count) {
        printf("    the outputs of %d layers recomputed in backward:", cfg->recompute_layers_count);
        for (int l = 0; l < RP_MAX_RECOMPUTE_LAYERS; l++)
            if (rp_config_recomputes_layer(cfg, l))
                printf(" %d", l);
        printf("\n");
    }
    if (cfg->auto_loss_scaling)
        printf("    dynamic loss scaling from %g, doubling after %d clean updates\n",
               rp_config_loss_scale(cfg), cfg->loss_scaling_growth_interval);
    else if (cfg->loss_scaling > 0)
        printf("    loss scaled by %g\n", cfg->loss_scaling);
    if (cfg->fp16_exchange)
        printf("    fp16 activations and gradients between stages\n");
    if (cfg->embedding_serialization_factor > 1)
        printf("    embedding tables in %d row blocks\n", cfg->embedding_serialization_factor);
    if (cfg->executable_cache_dir[0])
        printf("    executable cache in %s\n", cfg->executable_cache_dir);
    if (cfg->device_memory > 0)
        printf("  device memory              %lld bytes; products' scratch within %g of it\n",
               (long long)cfg->device_memory, cfg->matmul_proportion[0]);
}

/* Each stage's layers, training's and inference's; false (said) when the
** configuration's lists do not fit the layers. */
static bool show_stages(const cli_cmd *cmd, const rp_config *cfg, const rp_derived *d,
                        int layers, const rp_model *m) {
    int counts[RP_MAX_STAGES];
    for (int inf = 0; inf < 2; inf++) {
        int n = inf ? d->inference_stages : d->stages;
        printf("\n%s stages\n", inf ? "inference" : "training");
        int known = stage_ranges(cmd, cfg, inf, layers, counts);
        if (known < 0)
            return false;
        if (!known) {
            const rp_layer_list *l = inf && cfg->inference_layers_set
                                         ? &cfg->inference_layers_per_stage
                                         : &cfg->layers_per_stage;
            printf("  layers per stage ");
            print_list(l->layers, l->count);
            printf(" has wildcards; pass --layers L to resolve them\n");
            continue;
        }
        /* an IPUConfig file without the model: Optimum's counts of blocks */
        const char *u = cfg->layers_count_blocks ? "block" : "layer";
        if (cfg->layers_count_blocks)
            printf("  (an IPUConfig file counts a transformer's blocks, the embeddings on the "
                   "first stage and the head on the last; --model M shows M's layers)\n");
        int first = 0;
        for (int s = 0; s < n; s++) {
            const char *with = !cfg->layers_count_blocks ? ""
                               : s == 0 && s == n - 1   ? ", the embeddings and the head"
                               : s == 0                 ? ", the embeddings"
                               : s == n - 1             ? ", the head"
                                                        : "";
            if (counts[s] == 0)
                printf("  stage %-3d no %ss%s\n", s, u, with);
            else
                printf("  stage %-3d %ss %d-%d (%d %s%s%s)\n", s, u, first,
                       first + counts[s] - 1, counts[s], u, counts[s] == 1 ? "" : "s", with);
            if (m && !rp_model_is_chain(m) && s > 0 && counts[s] && first < m->num_layers)
                print_cut(m, first);
            first += counts[s];
        }
    }
    return true;
}

/* m: the model of --model, or NULL */
static bool show_text(const cli_cmd *cmd, const char *path, const rp_config *cfg, int layers,
                      const rp_model *m) {
    rp_derived d;
    rp_config_derive(cfg, &d);
    char gbuf[96];
    printf("configuration: %s\n", path);
    if (cfg->origin[0])
        printf("  %s\n", cfg->origin);
    printf("\ntraining\n");
    printf("  stages (pipeline depth)    %d\n", d.stages);
    printf("  stage replication          ");
    for (int s = 0; s < d.stages; s++)
        printf("%s%d", s ? ", " : "", rp_config_stage_replicas(cfg, s));
    printf("\n  replication factor         %d\n", cfg->replication_factor);
    if (rp_config_chunked(cfg))
        printf("  workers needed             %d  (each holds %d of the %d stages: "
               "%s)\n", rp_config_devices(cfg, &d), cfg->virtual_stages,
               d.stages, rp_schedule_name(cfg->schedule));
    else if (rp_config_paired(cfg))
        printf("  workers needed             %d  (each holds stage s of one replica and %d - s "
               "of its pair's: dualpipe)\n", rp_config_devices(cfg, &d), d.stages - 1);
    else
        printf("  workers needed             %d\n", d.workers);
    printf("  replica grouping           %s\n",
           rp_grouping_to_string(&cfg->replica_grouping, gbuf, sizeof gbuf));
    if (rp_config_tensor_parallel(cfg) > 1)
        show_tensor_groups(cfg, &d);
    printf("  samples per micro-batch    %lld\n", d.samples_per_micro_batch);
    printf("  samples per update         %lld  (%d x %d accumulation x %d replicas)\n",
           d.samples_per_update, cfg->micro_batch_size, cfg->gradient_accumulation_steps,
           cfg->replication_factor);
    printf("  samples per host call      %lld  (%d device iterations)\n",
           d.samples_per_host_call, cfg->device_iterations);
    printf("  schedule                   %s\n", rp_schedule_name(cfg->schedule));
    printf("  output mode                %s\n", rp_output_mode_name(cfg->output_mode));
    show_optimizer(cfg);
    show_memory(cfg);
    printf("\ninference\n");
    printf("  stages                     %d\n", d.inference_stages);
    printf("  replication factor         %d\n", cfg->inference_replication_factor);
    printf("  workers needed             %d\n", d.inference_workers);
    printf("  samples per step           %lld\n", d.inference_samples_per_step);
    printf("  samples per host call      %lld  (%d device iterations)\n",
           d.inference_samples_per_host_call, cfg->inference_device_iterations);
    return show_stages(cmd, cfg, &d, layers, m);
}

/* known: stage_ranges' answer for this pipeline (1, or 0 for wildcards). */
static void json_stages(int known, const int *counts, int n) {
    if (!known) {
        printf("null");
        return;
    }
    printf("[");
    int first = 0;
    for (int s = 0; s < n; s++) {
        printf("%s{\"stage\":%d,\"first_layer\":%d,\"layers\":%d}", s ? "," : "", s, first,
               counts[s]);
        first += counts[s];
    }
    printf("]");
}

static bool show_json(const cli_cmd *cmd, const rp_config *cfg, int layers) {
    rp_derived d;
    rp_config_derive(cfg, &d);
    /* every check before the first byte, so that a failure prints no JSON */
    int counts[2][RP_MAX_STAGES], known[2];
    for (int inf = 0; inf < 2; inf++)
        if ((known[inf] = stage_ranges(cmd, cfg, inf, layers, counts[inf])) < 0)
            return false;
    printf("{\"training\":{\"stages\":%d,\"replication_factor\":%d,\"workers\":%d,"
           "\"samples_per_micro_batch\":%lld,\"samples_per_update\":%lld,"
           "\"samples_per_host_call\":%lld,\"stage_layers\":",
           d.stages, cfg->replication_factor, d.workers, d.samples_per_micro_batch,
           d.samples_per_update, d.samples_per_host_call);
    json_stages(known[0], counts[0], d.stages);
    printf("},\"inference\":{\"stages\":%d,\"replication_factor\":%d,\"workers\":%d,"
           "\"samples_per_micro_batch\":%lld,\"samples_per_step\":%lld,"
           "\"samples_per_host_call\":%lld,\"stage_layers\":",
           d.inference_stages, cfg->inference_replication_factor, d.inference_workers,
           d.samples_per_micro_batch, d.inference_samples_per_step,
           d.inference_samples_per_host_call);
    json_stages(known[1], counts[1], d.inference_stages);
    /* true: stage_layers count a transformer's blocks (an IPUConfig file, no --model) */
    printf("},\"counts_blocks\":%s,\"read_as\":", cfg->layers_count_blocks ? "true" : "false");
    cJSON *origin = cfg->origin[0] ? cJSON_CreateString(cfg->origin) : cJSON_CreateNull();
    char *text = origin ? cJSON_PrintUnformatted(origin) : NULL;
    printf("%s", text ? text : "null");
    cJSON_free(text);
    cJSON_Delete(origin);
    printf("}\n");
    return true;
}

/* --model: what a session would refuse, before any worker starts; an
** IPUConfig file's lists (which count the model's blocks) fitted to its
** layers, and *layers its count; false (said) where refused. */
static bool with_model(const cli_cmd *cmd, const char *path, const char *model, rp_config *cfg,
                       long long *layers, rp_model **m) {
    rp_error err;
    if (rp_model_load(m, model, &err)) {
        cli_error(cmd, "%s", err.msg);
        return false;
    }
    rp_status ms = rp_session_check(*m, cfg, &err);
    if (!ms)
        ms = rp_session_fit_config(*m, cfg, &err);
    if (*layers && *layers != (*m)->num_layers && !ms)
        ms = rp_fail(&err, RP_ERR_INVALID, "--layers %lld, but %s has %d layers", *layers, model,
                     (*m)->num_layers);
    *layers = (*m)->num_layers;
    if (ms) {
        cli_error(cmd, "%s with %s: %s", path, model, err.msg);
        rp_model_free(*m);
        *m = NULL;
        return false;
    }
    return true;
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    long long layers = 0;
    const char *model = NULL, *pod_type = NULL;
    bool json = false, help;
    const char *pos[4];
    int npos = 0;
    const char *arg;
    for (int o; (o = cli_next_arg(cmd, argc, argv, &arg, &help, pos, &npos, 4)) != -1;) {
        if (o == -2)
            return help ? 0 : 2;
        if (o == 0 && !cli_int("layers", arg, 1, 1 << 24, &layers))
            return 2;
        if (o == 1)
            json = true;
        if (o == 2)
            model = arg;
        if (o == 3)
            pod_type = arg;
    }
    if (npos != 2 || (strcmp(pos[0], "show") != 0 && strcmp(pos[0], "check") != 0)) {
        cli_error(cmd, "expected 'show FILE' or 'check FILE' (see 'repipe config --help')");
        return 2;
    }
    rp_config cfg;
    rp_error err;
    if (rp_config_load_file_opts(&cfg, pos[1], &(rp_config_load_options){.pod_type = pod_type},
                                 &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    for (int i = 0; i < cfg.num_warnings; i++)
        fprintf(stderr, "warning: %s\n", cfg.warnings[i]);
    /* what train refuses before it reads the model, refused here by the same rule */
    if (rp_schedule_check_config(&cfg, &err)) {
        cli_error(cmd, "%s: %s", pos[1], err.msg);
        return 1;
    }
    rp_model *m = NULL;
    if (model && !with_model(cmd, pos[1], model, &cfg, &layers, &m))
        return 1;
    if (strcmp(pos[0], "check") == 0) {
        rp_model_free(m);
        if (layers) {
            int counts[RP_MAX_STAGES];
            for (int inf = 0; inf < 2; inf++)
                if (rp_config_stage_layers(&cfg, inf, (int)layers, counts, &err)) {
                    cli_error(cmd, "%s: %s", pos[1], err.msg);
                    return 1;
                }
        }
        printf("%s: ok\n", pos[1]);
        return 0;
    }
    bool shown = json ? show_json(cmd, &cfg, (int)layers)
                      : show_text(cmd, pos[1], &cfg, (int)layers, m);
    rp_model_free(m);
    return shown ? 0 : 1;
}

const cli_cmd cmd_config = {
    "config",
    "check an execution configuration and print the numbers derived from it",
    "show|check FILE [--layers L | --model M] [--json]",
    "FILE is repipe's JSON configuration or an Optimum Graphcore ipu_config.json.\n"
    "'show' prints the workers needed, the samples per micro-batch, update and\n"
    "host call for training and inference, and the layers of every stage.\n"
    "'check' exits non-zero with the reason when the file is not valid, and with\n"
    "--model, when the model could not train under it (a stage without layers, a\n"
    "model without a loss, an embedding the serialization factor does not divide).",
    OPTS,
    run,
};
