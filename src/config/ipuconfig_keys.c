/*
** The keys of Optimum Graphcore's IPUConfig, release by release, and the
** helpers that read one key's value as one release did.
*/
#include "../core/json.h"
#include <stdio.h>
#include <string.h>

#include "../core/util.h"
#include "ipuconfig.h"

const char *const rpi_og_name[OG_COUNT] = {
    "a development version before 0.1.0", "0.1.0-0.2.0", "0.2.1-0.2.2", "0.2.3-0.5",
    "0.6.0", "0.6.1", "0.7.0", "0.7.1",
};

/* Each key with the releases that read it (for files: that wrote it). */
const og_key rpi_og_keys[K_COUNT] = {
    [K_R] = {"replication_factor", OG_PRE, OG_CURRENT, OK_INT, true, false, NULL},
    [K_INF_R] = {"inference_replication_factor", OG_0_2_1, OG_CURRENT, OK_INT, true, false, NULL},
    [K_GA] = {"gradient_accumulation_steps", OG_PRE, OG_CURRENT, OK_INT, true, false, NULL},
    [K_GA_PRE] = {"gradient_accumulation", OG_PRE, OG_PRE, OK_INT, false, false, NULL},
    [K_D] = {"device_iterations", OG_PRE, OG_CURRENT, OK_INT, true, false, NULL},
    [K_INF_D] = {"inference_device_iterations", OG_0_2_1, OG_CURRENT, OK_INT, true, false, NULL},
    [K_IPUS] = {"ipus_per_replica", OG_PRE, OG_CURRENT, OK_INT, false, true, NULL},
    [K_INF_IPUS] = {"inference_ipus_per_replica", OG_0_6_1, OG_CURRENT, OK_INT, false, true, NULL},
    [K_LAYERS] = {"layers_per_ipu", OG_PRE, OG_CURRENT, OK_LAYERS, false, false, NULL},
    [K_INF_LAYERS] = {"inference_layers_per_ipu", OG_0_6_1, OG_CURRENT, OK_LAYERS, false, true,
                      NULL},
    [K_MATMUL] = {"matmul_proportion", OG_PRE, OG_CURRENT, OK_MATMUL, true, false, NULL},
    [K_INF_MATMUL] = {"inference_matmul_proportion", OG_0_6_1, OG_CURRENT, OK_MATMUL, true,
                      true, NULL},
    [K_ESF] = {"embedding_serialization_factor", OG_0_1, OG_CURRENT, OK_INT, true, true, NULL},
    [K_INF_ESF] = {"inference_embedding_serialization_factor", OG_0_6_1, OG_CURRENT, OK_INT,
                   true, true, NULL},
    [K_PSF] = {"projection_serialization_factor", OG_0_6_1, OG_CURRENT, OK_INT, false, true, NULL},
    [K_INF_PSF] = {"inference_projection_serialization_factor", OG_0_6_1, OG_CURRENT, OK_INT,
                   false, true, NULL},
    [K_ES] = {"serialized_embedding_splits_per_ipu", OG_0_6_1, OG_CURRENT, OK_SPLITS, false,
              true, NULL},
    [K_INF_ES] = {"inference_serialized_embedding_splits_per_ipu", OG_0_6_1, OG_CURRENT,
                  OK_SPLITS, false, true, NULL},
    [K_PS] = {"serialized_projection_splits_per_ipu", OG_0_6_1, OG_CURRENT, OK_SPLITS, false,
              true, NULL},
    [K_INF_PS] = {"inference_serialized_projection_splits_per_ipu", OG_0_6_1, OG_CURRENT,
                  OK_SPLITS, false, true, NULL},
    [K_OFFCHIP] = {"optimizer_state_offchip", OG_0_1, OG_CURRENT, OK_BOOL, true, false, NULL},
    [K_RTS] = {"replicated_tensor_sharding", OG_0_1, OG_CURRENT, OK_BOOL, true, false, NULL},
    [K_RECOMPUTE] = {"recompute_checkpoint_every_layer", OG_0_1, OG_CURRENT, OK_BOOL, true, false,
                     NULL},
    [K_HALF] = {"enable_half_partials", OG_0_1, OG_CURRENT, OK_BOOL, true, false, NULL},
    [K_ALS] = {"auto_loss_scaling", OG_0_2_3, OG_CURRENT, OK_BOOL, true, false, NULL},
    [K_CACHE] = {"executable_cache_dir", OG_0_1, OG_CURRENT, OK_STRING, true, false, NULL},
    [K_OUTPUT] = {"output_mode", OG_0_2_1, OG_CURRENT, OK_STRING, true, false, NULL},
    [K_SEED] = {"seed", OG_0_2_1, OG_CURRENT, OK_INT, true, true, NULL},
    [K_RANDOM_SEED] = {"random_seed", OG_PRE, OG_0_1, OK_INT, false, false, NULL},
    [K_SHARDED] = {"sharded_execution_for_inference", OG_0_2_3, OG_CURRENT, OK_IGNORED, true,
                   false, "inference always runs sharded, stage after stage (deprecated from "
                          "0.6.0)"},
    [K_HALF_MOMENTUM] = {"enable_half_first_order_momentum", OG_PRE, OG_CURRENT, OK_IGNORED,
                         false, false,
                         "the optimizer's first moment in fp16 (deprecated from 0.6.0); "
                         "repipe keeps optimizer state in fp32"},
    [K_ENCODER_CPU] = {"execute_encoder_on_cpu_for_generation", OG_0_2_3, OG_CURRENT,
                       OK_BOOL, false, false, NULL},
    [K_PARALLELIZE] = {"parallelize_kwargs", OG_0_7_1, OG_CURRENT, OK_KWARGS, false, true, NULL},
    [K_INF_PARALLELIZE] = {"inference_parallelize_kwargs", OG_0_7_1, OG_CURRENT, OK_KWARGS,
                           false, true, NULL},
    [K_EXPLICIT_IR] = {"explicit_ir_inference", OG_0_7_1, OG_CURRENT, OK_IGNORED, false, false,
                       "PopART's explicit IR for inference"},
    [K_COMPILE_ONLY] = {"compile_only", OG_0_1, OG_0_1, OK_IGNORED, false, false,
                        "compile for an offline IPU target"},
    [K_SYNTHETIC] = {"synthetic_data", OG_PRE, OG_0_2_1, OK_IGNORED, false, false,
                     "random data generated on the device"},
    [K_POPDIST] = {"use_popdist", OG_PRE, OG_0_2_3, OK_IGNORED, false, false,
                   "PopDist's options for multi-host runs; repipe's multi-host runs use MPI"},
    [K_PROFILE_DIR] = {"profile_dir", OG_PRE, OG_0_2_3, OK_IGNORED, false, false,
                       "where PopVision reports go; repipe writes traces with --trace"},
    [K_ROUND_IPUS] = {"auto_round_num_ipus", OG_PRE, OG_PRE, OK_IGNORED, false, false,
                      "round the IPUs requested up to a power of two"},
    [K_DECOMPOSE] = {"decompose_grad_sum", OG_0_2_3, OG_0_2_3, OK_IGNORED, false, false,
                     "PopART's decomposition of gradient sums"},
    [K_OPTIMUM] = {"optimum_version", OG_0_2_1, OG_CURRENT, OK_META, false, false, NULL},
    [K_TRANSFORMERS] = {"transformers_version", OG_PRE, OG_CURRENT, OK_META, false, false, NULL},
    [K_POD_TYPE] = {"pod_type", OG_0_2_1, OG_0_6_0, OK_META, false, false, NULL},
};

/* The attributes of transformers' PretrainedConfig (4.29), which IPUConfig
** inherited: every release accepts them (0.7 too, which refuses other keys
** it does not know), and a model's config.json holds them. */
static const char *const PRETRAINED[] = {
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "torch_dtype",
    "use_bfloat16", "tf_legacy_loss", "pruned_heads", "tie_word_embeddings",
    "is_encoder_decoder", "is_decoder", "cross_attention_hidden_size", "add_cross_attention",
    "tie_encoder_decoder", "max_length", "min_length", "do_sample", "early_stopping",
    "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "chunk_size_feed_forward", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "architectures", "finetuning_task", "id2label", "label2id", "tokenizer_class", "prefix",
    "bos_token_id", "pad_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id",
    "task_specific_params", "problem_type", "_name_or_path", "model_type", NULL,
};

bool rpi_og_pretrained(const char *key) {
    for (int i = 0; PRETRAINED[i]; i++)
        if (strcmp(PRETRAINED[i], key) == 0)
            return true;
    return false;
}

int rpi_og_find(const char *name) {
    for (int k = 0; k < K_COUNT; k++)
        if (strcmp(rpi_og_keys[k].name, name) == 0)
            return k;
    return -1;
}

/* A development version between 0.6.0 and 0.6.1 (April-May 2023) named the
** training values training_X; the releases never did. */
int rpi_og_training_alias(const char *name) {
    static const int keys[] = {K_R, K_D, K_IPUS, K_LAYERS, K_MATMUL, K_ESF};
    if (strncmp(name, "training_", 9) != 0)
        return -1;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(rpi_og_keys[keys[i]].name, name + 9) == 0)
            return keys[i];
    return -1;
}

const char *rpi_closest_key(const char *key) {
    const char *names[K_COUNT + 64];
    int n = 0;
    for (int k = 0; k < K_COUNT; k++)
        names[n++] = rpi_og_keys[k].name;
    for (int i = 0; rpi_repipe_key_name(i) && n < K_COUNT + 64; i++)
        names[n++] = rpi_repipe_key_name(i);
    return rp_closest_word(key, names, n);
}

rp_status rpi_og_fail(og_read *o, const char *key, const cJSON *v, const char *rule) {
    return rpi_bad_value(o->c, key, v, rule);
}

rp_status rpi_og_int(og_read *o, int k, int lo, int dflt, int *out) {
    *out = dflt;
    if (!o->val[k])
        return RP_OK;
    return rpi_get_int(o->c, rpi_og_keys[k].name, o->val[k], lo, out);
}

rp_status rpi_og_bool(og_read *o, int k, bool *out) {
    if (!o->val[k])
        return RP_OK;
    return rpi_get_bool(o->c, rpi_og_keys[k].name, o->val[k], out);
}

