/*
** A Hugging Face config.json as a transformer shape: the keys transformers'
** own config classes write for GPT-2 (GPT2Config), LLaMA (LlamaConfig),
** Mistral (MistralConfig), Qwen2 (Qwen2Config), Qwen3 (Qwen3Config) and the
** mixtures of experts of Mixtral (MixtralConfig), Qwen3 (Qwen3MoeConfig) and
** DeepSeek-V3 (DeepseekV3Config: latent attention, multi-token prediction).
**
** Every key is one of three kinds. A shape's key is read. A key that cannot
** change the arithmetic (token ids, rope's theta, epsilons, dropout rates,
** the dtype the weights were saved in) is read past. A key that would change
** it in a way this model does not price (experts, a sliding window shorter
** than the sequence, latent attention) is an error that names it. Anything
** else is named back to the caller, so that a key of a newer release is
** said rather than silently dropped.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/json.h"
#include "../core/util.h"
#include "repipe/transformer.h"

/* Keys that change nothing this model prices. */
static const char *const INERT[] = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
    "initializer_range", "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "use_cache",
    "pad_token_id", "bos_token_id", "eos_token_id", "rope_theta", "rope_scaling",
    "rope_parameters", "attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
    "reorder_and_upcast_attn", "pretraining_tp", "output_attentions", "output_hidden_states",
    "return_dict", "id2label", "label2id", "task_specific_params", "_name_or_path",
    "use_sliding_window", "max_window_layers", "hidden_act", "activation_function",
    "attention_bias", "mlp_bias", "sliding_window", "layer_types", "n_ctx",
    "router_aux_loss_coef", "output_router_logits", "router_jitter_noise", "norm_topk_prob",
    /* DeepSeek's routing among groups of experts and its scaling: the same
    ** experts a token */
    "n_group", "topk_group", "routed_scaling_factor", "scoring_func", "topk_method",
    "aux_loss_alpha", "seq_aux", "ep_size", "rope_interleave", NULL};

/* Latent attention's and multi-token prediction's keys: read in a
** DeepSeek-V3 config, refused in another's. */
static const char *const LATENT[] = {
    "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "qk_head_dim", "num_nextn_predict_layers", NULL};

/* A mixture's keys: read in a Mixtral's, a Qwen3-MoE's or a DeepSeek-V3's
** config, refused in another's. */
static const char *const EXPERTS[] = {
    "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
    "n_routed_experts", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", NULL};

static bool listed(const char *const *list, const char *key) {
    for (int i = 0; list[i]; i++)
        if (strcmp(list[i], key) == 0)
            return true;
    return false;
}

/* A whole number at key (or at its GPT-2 name), into *v; 0 where absent or
** null. */
static rp_status whole(const cJSON *o, const char *path, const char *key, const char *alt,
                       long long *v, rp_error *err) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x && alt)
        x = cJSON_GetObjectItemCaseSensitive(o, key = alt);
    *v = 0;
    if (!x || cJSON_IsNull(x))
        return RP_OK;
    if (!cJSON_IsNumber(x) || x->valuedouble != (double)(long long)x->valuedouble ||
        x->valuedouble < 1 || x->valuedouble > 1e9)
        return rp_fail(err, RP_ERR_INVALID, "%s: \"%s\" must be a whole number from 1 to 1e9",
                       path, key);
    *v = (long long)x->valuedouble;
    return RP_OK;
}

/* A count at key that may be 0, into *v (0 where absent or null). */
static rp_status count(const cJSON *o, const char *path, const char *key, long long *v,
                       rp_error *err) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(x) && x->valuedouble == 0) {
        *v = 0;
        return RP_OK;
    }
    return whole(o, path, key, NULL, v, err);
}

static bool truth(const cJSON *o, const char *key, bool dflt) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(x) ? cJSON_IsTrue(x) : dflt;
}

static const char *model_type(const cJSON *o) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    return cJSON_IsString(type) ? type->valuestring : "";
}

static bool deepseek(const char *type) {
    return strcmp(type, "deepseek_v3") == 0;
}

static bool has_experts(const char *type) {
    return strcmp(type, "mixtral") == 0 || strcmp(type, "qwen3_moe") == 0 || deepseek(type);
}

/* DeepSeek-V3's latent attention, multi-token prediction and experts as
** KEY=VALUE text: its routed experts and shared ones (n_shared_experts of
** moe_intermediate_size, as one shared expert of their sum), the dense
** first blocks (first_k_dense_replace) and moe_layer_freq, which counts as
** Megatron-LM's does; each head's query and key qk_nope_head_dim wide
** beside the shared rotary qk_rope_head_dim (transformers writes head_dim
** as the rotary part: read past). */
static rp_status deepseek_text(const cJSON *o, const char *path, char *out, size_t cap,
                               rp_error *err) {
    long long E, k, f, shared, dense, every, ql, kl, nope, rope, vd, mtp;
    rp_status st;
    if ((st = whole(o, path, "n_routed_experts", NULL, &E, err)) ||
        (st = whole(o, path, "num_experts_per_tok", NULL, &k, err)) ||
        (st = whole(o, path, "moe_intermediate_size", NULL, &f, err)) ||
        (st = count(o, path, "n_shared_experts", &shared, err)) ||
        (st = count(o, path, "first_k_dense_replace", &dense, err)) ||
        (st = whole(o, path, "moe_layer_freq", NULL, &every, err)) ||
        (st = count(o, path, "q_lora_rank", &ql, err)) ||
        (st = whole(o, path, "kv_lora_rank", NULL, &kl, err)) ||
        (st = whole(o, path, "qk_nope_head_dim", NULL, &nope, err)) ||
        (st = count(o, path, "qk_rope_head_dim", &rope, err)) ||
        (st = whole(o, path, "v_head_dim", NULL, &vd, err)) ||
        (st = count(o, path, "num_nextn_predict_layers", &mtp, err)))
        return st;
    if (!E || !k || !f || !kl || !nope || !vd)
        return rp_fail(err, RP_ERR_INVALID, "%s: a deepseek_v3 config needs n_routed_experts, "
                       "num_experts_per_tok, moe_intermediate_size, kv_lora_rank, "
                       "qk_nope_head_dim and v_head_dim", path);
    if ((size_t)snprintf(out, cap, ",experts=%lld,top_k=%lld,moe_ffn=%lld,shared_ffn=%lld,"
                         "dense_first=%lld,moe_every=%lld,kv_lora=%lld,q_lora=%lld,head_dim=%lld,"
                         "rope_dim=%lld,v_dim=%lld,mtp=%lld", E, k, f, shared * f, dense,
                         every ? every : 1, kl, ql, nope, rope, vd, mtp) >= cap)
        return rp_fail(err, RP_ERR_INVALID, "%s: the shape does not fit", path);
    return RP_OK;
}

/* A mixture's keys (Mixtral's num_local_experts of intermediate_size each;
** Qwen3-MoE's num_experts, as Qwen's files write it, or num_local_experts,
** as transformers 5 does, of moe_intermediate_size, its dense blocks'
** intermediate_size) as KEY=VALUE text. Qwen's mlp_only_layers are read
** where they are the first blocks (dense_first); its decoder_sparse_step
** counts from the k-th block where Megatron-LM's --moe-layer-freq counts
** from the first, so only 1 (every block) is read. */
static rp_status experts_text(const cJSON *o, const char *path, const char *type,
                              long long layers, char *out, size_t cap, rp_error *err) {
    out[0] = '\0';
    if (deepseek(type))
        return deepseek_text(o, path, out, cap, err);
    if (!has_experts(type))
        return RP_OK;
    bool mixtral = strcmp(type, "mixtral") == 0;
    long long E, k, f, step;
    rp_status st;
    if ((st = whole(o, path, "num_local_experts", "num_experts", &E, err)) ||
        (st = whole(o, path, "num_experts_per_tok", NULL, &k, err)) ||
        (st = whole(o, path, mixtral ? "intermediate_size" : "moe_intermediate_size", NULL, &f,
                    err)) ||
        (st = whole(o, path, "decoder_sparse_step", NULL, &step, err)))
        return st;
    if (!E || !k || !f)
        return rp_fail(err, RP_ERR_INVALID, "%s: a %s config needs its experts, experts a token "
                       "and their MLP's width (num_local_experts or num_experts, "
                       "num_experts_per_tok, %s)", path, type,
                       mixtral ? "intermediate_size" : "moe_intermediate_size");
    if (step > 1)
        return rp_fail(err, RP_ERR_INVALID, "%s: \"decoder_sparse_step\" %lld: repipe reads "
                       "mixtures in every block, or after dense first blocks", path, step);
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(o, "mlp_only_layers");
    long long dense = 0;
    for (const cJSON *x = cJSON_IsArray(only) ? only->child : NULL; x; x = x->next, dense++)
        if (!cJSON_IsNumber(x) || x->valuedouble != (double)dense || dense >= layers - 1)
            return rp_fail(err, RP_ERR_INVALID, "%s: \"mlp_only_layers\": repipe reads dense "
                           "blocks that come first (0, 1, ...), leaving one a mixture", path);
    if ((size_t)snprintf(out, cap, ",experts=%lld,top_k=%lld,moe_ffn=%lld,dense_first=%lld", E,
                         k, f, dense) >= cap)
        return rp_fail(err, RP_ERR_INVALID, "%s: the shape does not fit", path);
    return RP_OK;
}

/* The shape's keys as KEY=VALUE text for rp_transformer_parse, which checks
** them as it checks any shape. */
static rp_status shape_text(const cJSON *o, const char *path, char *spec, size_t cap,
                            rp_error *err) {
    const char *t = model_type(o);
    bool gpt2 = strcmp(t, "gpt2") == 0, qwen2 = strcmp(t, "qwen2") == 0;
    bool qwen3 = strncmp(t, "qwen3", 5) == 0;
    if (!gpt2 && !qwen2 && !qwen3 && strcmp(t, "llama") != 0 && strcmp(t, "mistral") != 0 &&
        strcmp(t, "mixtral") != 0 && !deepseek(t))
        return rp_fail(err, RP_ERR_INVALID, "%s: \"model_type\" '%s' is not one repipe reads "
                       "(gpt2, llama, mistral, qwen2, qwen3, mixtral, qwen3_moe, deepseek_v3)",
                       path, t);
    long long layers, hidden, heads, kv, head_dim, ffn, vocab, seq;
    rp_status st;
    if ((st = whole(o, path, "num_hidden_layers", "n_layer", &layers, err)) ||
        (st = whole(o, path, "hidden_size", "n_embd", &hidden, err)) ||
        (st = whole(o, path, "num_attention_heads", "n_head", &heads, err)) ||
        (st = whole(o, path, "num_key_value_heads", NULL, &kv, err)) ||
        (st = whole(o, path, "head_dim", NULL, &head_dim, err)) ||
        (st = whole(o, path, "intermediate_size", "n_inner", &ffn, err)) ||
        (st = whole(o, path, "vocab_size", NULL, &vocab, err)) ||
        (st = whole(o, path, "max_position_embeddings", "n_positions", &seq, err)))
        return st;
    if (!layers || !hidden || !heads || !vocab || !seq)
        return rp_fail(err, RP_ERR_INVALID, "%s: a %s config needs its layers, hidden size, "
                       "heads, vocabulary and positions (%s)", path, t,
                       gpt2 ? "n_layer, n_embd, n_head, vocab_size, n_positions"
                            : "num_hidden_layers, hidden_size, num_attention_heads, vocab_size, "
                              "max_position_embeddings");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(o, gpt2 ? "activation_function"
                                                                : "hidden_act");
    const char *a = cJSON_IsString(act) ? act->valuestring : gpt2 ? "gelu_new" : "silu";
    if (gpt2 ? strncmp(a, "gelu", 4) != 0 : strcmp(a, "silu") != 0)
        return rp_fail(err, RP_ERR_INVALID, "%s: \"%s\" '%s': repipe prices %s", path,
                       gpt2 ? "activation_function" : "hidden_act", a,
                       gpt2 ? "GPT-2's GELU MLP" : "SwiGLU (silu) MLPs");
    const cJSON *win = cJSON_GetObjectItemCaseSensitive(o, "sliding_window");
    bool windowed = cJSON_IsNumber(win) && win->valuedouble < seq &&
                    truth(o, "use_sliding_window", true);
    if (windowed)
        return rp_fail(err, RP_ERR_INVALID, "%s: \"sliding_window\" %g is shorter than the "
                       "sequence (%lld): repipe prices attention over the whole sequence", path,
                       win->valuedouble, seq);
    const cJSON *kinds = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    for (const cJSON *k = cJSON_IsArray(kinds) ? kinds->child : NULL; k; k = k->next)
        if (!cJSON_IsString(k) || strcmp(k->valuestring, "full_attention") != 0)
            return rp_fail(err, RP_ERR_INVALID, "%s: \"layer_types\" names a layer that is not "
                           "full_attention: repipe prices attention over the whole sequence",
                           path);
    bool mlp_bias = truth(o, "mlp_bias", false), attn_bias = truth(o, "attention_bias", false);
    if (!gpt2 && mlp_bias)
        return rp_fail(err, RP_ERR_INVALID, "%s: \"mlp_bias\" true: repipe prices biases on "
                       "every product, on none or on QKV only", path);
    const char *bias = gpt2 ? "all" : qwen2 || attn_bias ? "qkv" : "none";
    /* dropout after attention and the MLP: GPT-2's resid_pdrop (0.1 unless
    ** set); the others have none */
    const cJSON *pd = cJSON_GetObjectItemCaseSensitive(o, "resid_pdrop");
    int dropout = gpt2 && !(cJSON_IsNumber(pd) && pd->valuedouble == 0);
    size_t n = (size_t)snprintf(spec, cap,
                                "layers=%lld,hidden=%lld,heads=%lld,seq=%lld,vocab=%lld,%s,bias=%s,"
                                "tied=%d,flash=1,dropout=%d",
                                layers, hidden, heads, seq, vocab,
                                gpt2 ? "mlp=gelu,norm=layernorm,position=learned"
                                     : "mlp=swiglu,norm=rmsnorm,position=rope",
                                bias, truth(o, "tie_word_embeddings", gpt2), dropout);
    if (kv && n < cap)
        n += (size_t)snprintf(spec + n, cap - n, ",kv_heads=%lld", kv);
    if (head_dim && n < cap && !deepseek(t)) /* (DeepSeek's: its qk_nope_head_dim) */
        n += (size_t)snprintf(spec + n, cap - n, ",head_dim=%lld", head_dim);
    if (ffn && n < cap)
        n += (size_t)snprintf(spec + n, cap - n, ",ffn=%lld", ffn);
    else if (gpt2 && n < cap)
        n += (size_t)snprintf(spec + n, cap - n, ",ffn=%lld", 4 * hidden);
    if (qwen3 && n < cap) /* each head's queries and keys normed */
        n += (size_t)snprintf(spec + n, cap - n, ",qk_norm=1");
    if (n < cap && (st = experts_text(o, path, t, layers, spec + n, cap - n, err)))
        return st;
    if (strlen(spec) >= cap - 1)
        return rp_fail(err, RP_ERR_INVALID, "%s: the shape does not fit %zu characters", path, cap);
    return RP_OK;
}

/* spec with the overrides' keys in place of its own. */
static rp_status merge(const char *spec, const char *overrides, char *out, size_t cap,
                       rp_error *err) {
    size_t n = 0;
    out[0] = '\0';
    for (const char *p = spec; *p;) {
        size_t k = strcspn(p, ","), key = strcspn(p, "=");
        bool replaced = false;
        for (const char *q = overrides; q && *q && !replaced;) {
            size_t j = strcspn(q, ",");
            replaced = key < k && strncmp(p, q, key + 1) == 0 && j > key;
            q += j + (q[j] == ',');
        }
        if (!replaced)
            n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%.*s", n ? "," : "", (int)k, p);
        p += k + (p[k] == ',');
    }
    if (overrides && *overrides)
        n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", n ? "," : "", overrides);
    if (n >= cap)
        return rp_fail(err, RP_ERR_INVALID, "the shape and '%s' do not fit %zu characters",
                       overrides, cap);
    return RP_OK;
}

rp_status rp_transformer_from_config(const char *path, const char *overrides,
                                     rp_transformer *m, char **unknown, rp_error *err) {
    *unknown = NULL;
    cJSON *o;
    rp_status st = rp_json_read(path, &o, err);
    if (st)
        return st;
    char spec[512], all[1024];
    size_t cap = 1, n = 0;
    if (!cJSON_IsObject(o)) {
        st = rp_fail(err, RP_ERR_INVALID, "%s: a config.json is an object of keys", path);
        goto done;
    }
    bool experts = has_experts(model_type(o));
    for (const cJSON *k = o->child; k; k = k->next) {
        bool set = !cJSON_IsNull(k) && !(cJSON_IsNumber(k) && k->valuedouble == 0) &&
                   !(cJSON_IsArray(k) && !k->child);
        if (set && !deepseek(model_type(o)) && listed(LATENT, k->string)) {
            st = rp_fail(err, RP_ERR_INVALID, "%s: \"%s\": latent attention or multi-token "
                         "prediction in a '%s' config, whose model has neither (repipe reads "
                         "them in deepseek_v3 configs)", path, k->string, model_type(o));
            goto done;
        }
        if (set && !experts && listed(EXPERTS, k->string)) {
            st = rp_fail(err, RP_ERR_INVALID, "%s: \"%s\": a mixture of experts in a '%s' "
                         "config, whose model has none (repipe reads experts in mixtral, "
                         "qwen3_moe and deepseek_v3 configs)", path, k->string, model_type(o));
            goto done;
        }
        cap += strlen(k->string) + 2;
    }
    if ((st = shape_text(o, path, spec, sizeof spec, err)) ||
        (st = merge(spec, overrides, all, sizeof all, err)))
        goto done;
    if ((st = rp_transformer_parse(all, m, err))) {
        char msg[RP_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", err->msg);
        st = rp_fail(err, st, "%s: %s", path, msg);
        goto done;
    }
    if (!(*unknown = malloc(cap))) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    (*unknown)[0] = '\0';
    static const char *const SHAPE[] = {
        "num_hidden_layers", "n_layer", "hidden_size", "n_embd", "num_attention_heads", "n_head",
        "num_key_value_heads", "head_dim", "intermediate_size", "n_inner", "vocab_size",
        "max_position_embeddings", "n_positions", "tie_word_embeddings", NULL};
    for (const cJSON *k = o->child; k; k = k->next)
        if (!listed(INERT, k->string) && !listed(SHAPE, k->string) &&
            !listed(LATENT, k->string) && !listed(EXPERTS, k->string))
            n += (size_t)snprintf(*unknown + n, cap - n, "%s%s", n ? ", " : "", k->string);
done:
    cJSON_Delete(o);
    return st;
}
