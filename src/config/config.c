/*
** Execution configuration: defaults, saving, comparison and the numbers
** derived from a configuration (its loading is config_load.c's).
*/
#include "repipe/config.h"

#include "../core/json.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"

void rp_config_default(rp_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->micro_batch_size = 1;
    cfg->replication_factor = 1;
    cfg->inference_replication_factor = 1;
    cfg->gradient_accumulation_steps = 1;
    cfg->layers_per_stage.count = 1;
    cfg->layers_per_stage.layers[0] = -1;
    cfg->device_iterations = 1;
    cfg->inference_device_iterations = 1;
    cfg->output_mode = RP_OUTPUT_FINAL;
    cfg->schedule = RP_SCHEDULE_1F1B;
    cfg->zb_pass_times[0] = cfg->zb_pass_times[1] = cfg->zb_pass_times[2] = 1.0;
    cfg->tensor_parallel = 1;
    cfg->expert_parallel = 1;
    cfg->vocab_parallel = true;
    cfg->virtual_stages = 1;
    cfg->replica_grouping = rp_grouping_all(1);
    cfg->embedding_serialization_factor = 1;
    cfg->inference_embedding_serialization_factor = 1;
    cfg->matmul_proportion_count = 1;
    cfg->matmul_proportion[0] = 0.2; /* Optimum Graphcore's default since 0.6.0 */
    cfg->enable_half_partials = true;
    cfg->loss_scaling_growth_interval = 2000;
    cfg->optimizer.type = RP_OPT_SGD;
    cfg->optimizer.lr = 0.05;
    cfg->optimizer.beta1 = 0.9;
    cfg->optimizer.beta2 = 0.999;
    cfg->optimizer.eps = 1e-8;
    cfg->lr_schedule.gamma = 0.1;
}

double rp_config_lr(const rp_config *cfg, long long u) {
    const rp_lr_schedule *ls = &cfg->lr_schedule;
    double lr = cfg->optimizer.lr;
    if (u < ls->warmup_updates)
        return lr * (double)(u + 1) / (double)ls->warmup_updates;
    long long t = u - ls->warmup_updates;
    if (ls->type == RP_LR_COSINE) {
        double p = (double)t / (double)(ls->decay_updates - ls->warmup_updates);
        if (p >= 1)
            return ls->min_lr;
        return ls->min_lr + 0.5 * (1 + cos(3.14159265358979323846 * p)) * (lr - ls->min_lr);
    }
    if (ls->type == RP_LR_STEP)
        return lr * pow(ls->gamma, (double)(t / ls->step_updates));
    return lr;
}

/* ---- saving ------------------------------------------------------------- */

const char *rp_output_mode_name(rp_output_mode m) {
    switch (m) {
    case RP_OUTPUT_ALL: return "all";
    case RP_OUTPUT_SUM: return "sum";
    case RP_OUTPUT_DEFAULT: return "default";
    case RP_OUTPUT_FINAL: break;
    }
    return "final";
}

const char *rp_schedule_name(rp_schedule s) {
    return s == RP_SCHEDULE_GPIPE           ? "gpipe"
           : s == RP_SCHEDULE_ZB_H1         ? "zb-h1"
           : s == RP_SCHEDULE_ZB_H2         ? "zb-h2"
           : s == RP_SCHEDULE_ZB_AUTO       ? "zb-auto"
           : s == RP_SCHEDULE_INTERLEAVED   ? "interleaved-1f1b"
           : s == RP_SCHEDULE_ZB_V          ? "zb-v"
           : s == RP_SCHEDULE_DUALPIPEV     ? "dualpipev"
           : s == RP_SCHEDULE_DUALPIPE      ? "dualpipe"
           : s == RP_SCHEDULE_PIPEDREAM     ? "pipedream"
           : s == RP_SCHEDULE_PIPEDREAM_2BW ? "pipedream_2bw"
                                            : "1f1b";
}

const char *rp_optimizer_name(rp_optimizer_type t) {
    return t == RP_OPT_ADAM ? "adam" : t == RP_OPT_ADAMW ? "adamw" : "sgd";
}

static cJSON *int_array(const int *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static cJSON *proportions(const double *v, int n) {
    if (n == 1)
        return cJSON_CreateNumber(v[0]);
    return cJSON_CreateDoubleArray(v, n);
}

/* The run's shape: batch, replicas, stages and their layers, schedule. */
static void layout_json(cJSON *r, const rp_config *cfg) {
    cJSON_AddNumberToObject(r, "seed", (double)cfg->seed);
    cJSON_AddNumberToObject(r, "micro_batch_size", cfg->micro_batch_size);
    cJSON_AddNumberToObject(r, "replication_factor", cfg->replication_factor);
    cJSON_AddNumberToObject(r, "inference_replication_factor",
                            cfg->inference_replication_factor);
    cJSON_AddNumberToObject(r, "gradient_accumulation_steps", cfg->gradient_accumulation_steps);
    cJSON_AddItemToObject(r, "layers_per_stage",
                          int_array(cfg->layers_per_stage.layers, cfg->layers_per_stage.count));
    if (cfg->inference_layers_set)
        cJSON_AddItemToObject(r, "inference_layers_per_stage",
                              int_array(cfg->inference_layers_per_stage.layers,
                                        cfg->inference_layers_per_stage.count));
    if (cfg->stage_replication_count)
        cJSON_AddItemToObject(r, "stage_replication",
                              int_array(cfg->stage_replication, cfg->stage_replication_count));
    cJSON_AddNumberToObject(r, "device_iterations", cfg->device_iterations);
    cJSON_AddNumberToObject(r, "inference_device_iterations", cfg->inference_device_iterations);
    cJSON_AddStringToObject(r, "output_mode", rp_output_mode_name(cfg->output_mode));
    cJSON_AddStringToObject(r, "schedule", rp_schedule_name(cfg->schedule));
    if (cfg->grouping_set) {
        cJSON *g = cJSON_CreateObject();
        cJSON_AddNumberToObject(g, "group_size", cfg->replica_grouping.group_size);
        cJSON_AddNumberToObject(g, "stride", cfg->replica_grouping.stride);
        cJSON_AddItemToObject(r, "replica_grouping", g);
    }
}

/* The schedule's variants, tensor groups, and the memory and speed
** features. */
static void features_json(cJSON *r, const rp_config *cfg) {
    cJSON_AddBoolToObject(r, "replicated_tensor_sharding", cfg->replicated_tensor_sharding);
    cJSON_AddBoolToObject(r, "optimizer_state_offchip", cfg->optimizer_state_offchip);
    cJSON_AddBoolToObject(r, "recompute_checkpoint_every_layer",
                          cfg->recompute_checkpoint_every_layer);
    if (cfg->recompute_layers_count) {
        cJSON *l = cJSON_AddArrayToObject(r, "recompute_layers");
        for (int k = 0; l && k < RP_MAX_RECOMPUTE_LAYERS; k++)
            if (rp_config_recomputes_layer(cfg, k))
                cJSON_AddItemToArray(l, cJSON_CreateNumber(k));
    }
    if (cfg->pipedream_vertical_sync)
        cJSON_AddBoolToObject(r, "pipedream_vertical_sync", true);
    if (cfg->schedule == RP_SCHEDULE_ZB_AUTO) {
        cJSON *t = cJSON_AddArrayToObject(r, "zb_pass_times");
        for (int k = 0; t && k < 3; k++)
            cJSON_AddItemToArray(t, cJSON_CreateNumber(cfg->zb_pass_times[k]));
        cJSON_AddNumberToObject(r, "zb_max_in_flight", cfg->zb_max_in_flight);
    }
    if (rp_config_chunked(cfg))
        cJSON_AddNumberToObject(r, "virtual_stages", cfg->virtual_stages);
    if (cfg->tensor_parallel > 1)
        cJSON_AddNumberToObject(r, "tensor_parallel", cfg->tensor_parallel);
    if (cfg->expert_parallel > 1)
        cJSON_AddNumberToObject(r, "expert_parallel", cfg->expert_parallel);
    if (!cfg->vocab_parallel)
        cJSON_AddBoolToObject(r, "vocab_parallel", false);
    cJSON_AddBoolToObject(r, "auto_loss_scaling", cfg->auto_loss_scaling);
    cJSON_AddBoolToObject(r, "fp16_exchange", cfg->fp16_exchange);
    if (cfg->reduction_bucket_mb > 0)
        cJSON_AddNumberToObject(r, "reduction_bucket_mb", cfg->reduction_bucket_mb);
    if (cfg->workers_per_server > 0)
        cJSON_AddNumberToObject(r, "workers_per_server", cfg->workers_per_server);
    if (cfg->loss_scaling > 0)
        cJSON_AddNumberToObject(r, "loss_scaling", cfg->loss_scaling);
    cJSON_AddNumberToObject(r, "loss_scaling_growth_interval", cfg->loss_scaling_growth_interval);
    cJSON_AddNumberToObject(r, "embedding_serialization_factor",
                            cfg->embedding_serialization_factor);
    cJSON_AddNumberToObject(r, "inference_embedding_serialization_factor",
                            cfg->inference_embedding_serialization_factor);
    cJSON_AddItemToObject(r, "matmul_proportion",
                          proportions(cfg->matmul_proportion, cfg->matmul_proportion_count));
    if (cfg->inference_matmul_proportion_count)
        cJSON_AddItemToObject(r, "inference_matmul_proportion",
                              proportions(cfg->inference_matmul_proportion,
                                          cfg->inference_matmul_proportion_count));
    cJSON_AddNumberToObject(r, "device_memory", (double)cfg->device_memory);
    cJSON_AddStringToObject(r, "executable_cache_dir", cfg->executable_cache_dir);
}

/* The optimizer, its learning rate's schedule, clipping and the data's
** order. */
static void optimizer_json(cJSON *r, const rp_config *cfg) {
    cJSON *o = cJSON_CreateObject();
    const rp_optimizer_config *oc = &cfg->optimizer;
    cJSON_AddStringToObject(o, "type", rp_optimizer_name(oc->type));
    cJSON_AddNumberToObject(o, "lr", oc->lr);
    if (oc->type == RP_OPT_SGD) {
        cJSON_AddNumberToObject(o, "momentum", oc->momentum);
    } else {
        cJSON_AddNumberToObject(o, "beta1", oc->beta1);
        cJSON_AddNumberToObject(o, "beta2", oc->beta2);
        cJSON_AddNumberToObject(o, "eps", oc->eps);
    }
    cJSON_AddNumberToObject(o, "weight_decay", oc->weight_decay);
    cJSON_AddItemToObject(r, "optimizer", o);
    const rp_lr_schedule *ls = &cfg->lr_schedule;
    if (ls->type != RP_LR_CONSTANT || ls->warmup_updates) {
        static const char *const names[] = {"constant", "cosine", "step"};
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "type", names[ls->type]);
        cJSON_AddNumberToObject(j, "warmup_updates", (double)ls->warmup_updates);
        if (ls->type == RP_LR_COSINE) {
            cJSON_AddNumberToObject(j, "decay_updates", (double)ls->decay_updates);
            cJSON_AddNumberToObject(j, "min_lr", ls->min_lr);
        } else if (ls->type == RP_LR_STEP) {
            cJSON_AddNumberToObject(j, "step_updates", (double)ls->step_updates);
            cJSON_AddNumberToObject(j, "gamma", ls->gamma);
        }
        cJSON_AddItemToObject(r, "lr_schedule", j);
    }
    if (cfg->gradient_clipping > 0)
        cJSON_AddNumberToObject(r, "gradient_clipping", cfg->gradient_clipping);
    if (cfg->sequential_data)
        cJSON_AddStringToObject(r, "data_order", "sequential");
}

rp_status rp_config_to_json(const rp_config *cfg, char **out, rp_error *err) {
    cJSON *r = cJSON_CreateObject();
    if (!r)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    layout_json(r, cfg);
    features_json(r, cfg);
    optimizer_json(r, cfg);
    char *text = cJSON_Print(r);
    cJSON_Delete(r);
    if (!text)
        return rpi_json_nomem("a configuration's JSON", err);
    /* Hand the caller a plain malloc'd string. */
    size_t n = strlen(text);
    *out = malloc(n + 2);
    if (!*out) {
        cJSON_free(text);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    memcpy(*out, text, n);
    (*out)[n] = '\n';
    (*out)[n + 1] = '\0';
    cJSON_free(text);
    return RP_OK;
}

rp_status rp_config_save_file(const rp_config *cfg, const char *path, rp_error *err) {
    char *text;
    rp_status s = rp_config_to_json(cfg, &text, err);
    if (s)
        return s;
    s = rp_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return s;
}

static bool list_equal(const rp_layer_list *a, const rp_layer_list *b) {
    return a->count == b->count && memcmp(a->layers, b->layers, sizeof(int) * a->count) == 0;
}

bool rp_config_equal(const rp_config *a, const rp_config *b) {
    const rp_optimizer_config *oa = &a->optimizer, *ob = &b->optimizer;
    bool inf_equal = a->inference_layers_set == b->inference_layers_set &&
                     (!a->inference_layers_set ||
                      list_equal(&a->inference_layers_per_stage, &b->inference_layers_per_stage));
    return a->seed == b->seed && a->micro_batch_size == b->micro_batch_size &&
           a->replication_factor == b->replication_factor &&
           a->inference_replication_factor == b->inference_replication_factor &&
           a->gradient_accumulation_steps == b->gradient_accumulation_steps &&
           list_equal(&a->layers_per_stage, &b->layers_per_stage) && inf_equal &&
           a->stage_replication_count == b->stage_replication_count &&
           memcmp(a->stage_replication, b->stage_replication,
                  sizeof(int) * a->stage_replication_count) == 0 &&
           a->device_iterations == b->device_iterations &&
           a->inference_device_iterations == b->inference_device_iterations &&
           a->output_mode == b->output_mode && a->schedule == b->schedule &&
           a->grouping_set == b->grouping_set &&
           rp_grouping_equal(&a->replica_grouping, &b->replica_grouping) &&
           a->replicated_tensor_sharding == b->replicated_tensor_sharding &&
           a->optimizer_state_offchip == b->optimizer_state_offchip &&
           a->recompute_checkpoint_every_layer == b->recompute_checkpoint_every_layer &&
           a->recompute_layers_count == b->recompute_layers_count &&
           memcmp(a->recompute_layers, b->recompute_layers, sizeof a->recompute_layers) == 0 &&
           a->auto_loss_scaling == b->auto_loss_scaling &&
           a->fp16_exchange == b->fp16_exchange &&
           a->reduction_bucket_mb == b->reduction_bucket_mb &&
           a->workers_per_server == b->workers_per_server &&
           a->loss_scaling == b->loss_scaling &&
           a->loss_scaling_growth_interval == b->loss_scaling_growth_interval &&
           a->embedding_serialization_factor == b->embedding_serialization_factor &&
           a->inference_embedding_serialization_factor ==
               b->inference_embedding_serialization_factor &&
           a->matmul_proportion_count == b->matmul_proportion_count &&
           memcmp(a->matmul_proportion, b->matmul_proportion,
                  sizeof(double) * a->matmul_proportion_count) == 0 &&
           a->inference_matmul_proportion_count == b->inference_matmul_proportion_count &&
           memcmp(a->inference_matmul_proportion, b->inference_matmul_proportion,
                  sizeof(double) * a->inference_matmul_proportion_count) == 0 &&
           a->device_memory == b->device_memory &&
           strcmp(a->executable_cache_dir, b->executable_cache_dir) == 0 &&
           a->lr_schedule.type == b->lr_schedule.type &&
           a->lr_schedule.warmup_updates == b->lr_schedule.warmup_updates &&
           (a->lr_schedule.type != RP_LR_COSINE ||
            (a->lr_schedule.decay_updates == b->lr_schedule.decay_updates &&
             a->lr_schedule.min_lr == b->lr_schedule.min_lr)) &&
           (a->lr_schedule.type != RP_LR_STEP ||
            (a->lr_schedule.step_updates == b->lr_schedule.step_updates &&
             a->lr_schedule.gamma == b->lr_schedule.gamma)) &&
           a->gradient_clipping == b->gradient_clipping &&
           a->pipedream_vertical_sync == b->pipedream_vertical_sync &&
           memcmp(a->zb_pass_times, b->zb_pass_times, sizeof a->zb_pass_times) == 0 &&
           a->zb_max_in_flight == b->zb_max_in_flight && a->virtual_stages == b->virtual_stages &&
           a->tensor_parallel == b->tensor_parallel && a->vocab_parallel == b->vocab_parallel &&
           a->expert_parallel == b->expert_parallel &&
           a->sequential_data == b->sequential_data &&
           oa->type == ob->type && oa->lr == ob->lr && oa->momentum == ob->momentum &&
           oa->weight_decay == ob->weight_decay && oa->beta1 == ob->beta1 &&
           oa->beta2 == ob->beta2 && oa->eps == ob->eps;
}

/* ---- derived numbers ---------------------------------------------------- */

double rp_config_loss_scale(const rp_config *cfg) {
    if (cfg->loss_scaling > 0)
        return cfg->loss_scaling;
    return cfg->auto_loss_scaling ? 65536.0 : 1.0;
}

int rp_config_num_stages(const rp_config *cfg, bool inference) {
    if (inference && cfg->inference_layers_set)
        return cfg->inference_layers_per_stage.count;
    return cfg->layers_per_stage.count;
}

rp_status rp_layers_expand(const rp_layer_list *list, int num_layers, int *out,
                           const char *key, rp_error *err) {
    if (num_layers < 1)
        return rp_fail(err, RP_ERR_INVALID, "%s: the model has %d layers; it needs at least one",
                       key, num_layers);
    long long fixed = 0;
    int wild = 0, last_wild = -1;
    for (int i = 0; i < list->count; i++) {
        if (list->layers[i] == -1) {
            wild++;
            last_wild = i;
        } else {
            fixed += list->layers[i];
        }
    }
    if (wild == 0) {
        if (fixed != num_layers)
            return rp_fail(err, RP_ERR_INVALID,
                           "%s: the stages hold %lld layers in all but the model has %d", key,
                           fixed, num_layers);
        memcpy(out, list->layers, sizeof(int) * list->count);
        return RP_OK;
    }
    if (fixed > num_layers)
        return rp_fail(err, RP_ERR_INVALID,
                       "%s: the fixed entries already hold %lld layers, more than the model's %d",
                       key, fixed, num_layers);
    int rest = num_layers - (int)fixed;
    int q = rest / wild, r = rest % wild;
    for (int i = 0; i < list->count; i++)
        out[i] = list->layers[i] == -1 ? q + (i == last_wild ? r : 0) : list->layers[i];
    return RP_OK;
}

rp_status rp_config_stage_layers(const rp_config *cfg, bool inference, int num_layers,
                                 int *out, rp_error *err) {
    int m = inference && cfg->inference_layers_set;
    const char *key = cfg->layers_key[m][0] ? cfg->layers_key[m]
                      : m                     ? "inference_layers_per_stage"
                                              : "layers_per_stage";
    if (cfg->layers_error[inference][0])
        return rp_fail(err, RP_ERR_INVALID, "the %s layers cannot be placed: %s",
                       inference ? "inference" : "training", cfg->layers_error[inference]);
    const rp_layer_list *l = m ? &cfg->inference_layers_per_stage : &cfg->layers_per_stage;
    if (cfg->layers_by_index && num_layers >= 1) {
        long long sum = 0;
        for (int i = 0; i < l->count; i++)
            sum += l->layers[i];
        if (num_layers > sum)
            return rp_fail(err, RP_ERR_INVALID,
                           "%s: the list places %lld layers but the model has %d (before "
                           "Optimum Graphcore 0.6.0, layer i went where the list's i-th "
                           "layer did)", key, sum, num_layers);
        int left = num_layers;
        for (int i = 0; i < l->count; i++) {
            out[i] = l->layers[i] < left ? l->layers[i] : left;
            left -= out[i];
        }
        return RP_OK;
    }
    return rp_layers_expand(m ? &cfg->inference_layers_per_stage : &cfg->layers_per_stage,
                            num_layers, out, key, err);
}

int rp_config_stage_replicas(const rp_config *cfg, int s) {
    return cfg->stage_replication_count ? cfg->stage_replication[s] : 1;
}

size_t rp_config_size(void) { return sizeof(rp_config); }

void rp_config_derive(const rp_config *cfg, rp_derived *d) {
    memset(d, 0, sizeof *d);
    d->stages = rp_config_num_stages(cfg, false);
    d->inference_stages = rp_config_num_stages(cfg, true);
    int per_replica = 0;
    for (int s = 0; s < d->stages; s++)
        per_replica += rp_config_stage_replicas(cfg, s);
    d->workers = cfg->replication_factor * per_replica * rp_config_tensor_parallel(cfg);
    d->inference_workers = cfg->inference_replication_factor * d->inference_stages;
    long long b = cfg->micro_batch_size;
    d->samples_per_micro_batch = b;
    d->samples_per_update = b * cfg->gradient_accumulation_steps * cfg->replication_factor;
    d->samples_per_host_call = d->samples_per_update * cfg->device_iterations;
    d->inference_samples_per_step = b * cfg->inference_replication_factor;
    d->inference_samples_per_host_call =
        d->inference_samples_per_step * cfg->inference_device_iterations;
}
