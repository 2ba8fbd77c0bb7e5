/*
** Weight files: repipe's, safetensors, llm.c's GPT-2 checkpoints and LLaMA's
** name schemes (src/weights/).
*/
#ifndef REPIPE_WEIGHTS_H
#define REPIPE_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "repipe/core.h"
#include "repipe/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of a weight file: `groups` copies of `shape` (replica groups;
** 1 without groupings). */
typedef struct rp_tensor {
    char name[RP_NAME_MAX];
    rp_shape shape;
    int groups;
    float *data; /* groups * size(shape) floats */
} rp_tensor;

typedef struct rp_weights {
    int num_tensors;
    rp_tensor *tensors;
} rp_weights;

/* Weight file: magic "RPWEIGHT", version, then each tensor's name, shape and
** groups, its data (little-endian float32), and a CRC-32 of everything
** before it. Written to a temporary file, fsynced and renamed. */
rp_status rp_weights_save(const rp_weights *w, const char *path, rp_error *err);
/* The bytes of a weight file, in *out (the caller frees it). */
rp_status rp_weights_serialize(const rp_weights *w, unsigned char **out, size_t *len,
                               rp_error *err);
rp_status rp_weights_load(rp_weights **out, const char *path, rp_error *err);
rp_status rp_weights_parse(rp_weights **out, const unsigned char *data, size_t len,
                           const char *name, rp_error *err);
void rp_weights_free(rp_weights *w);
/* Fails, naming the file, the tensor and the first bad value, when a
** tensor holds NaN or infinity: what a diverged run leaves, and no start
** for training or evaluation. */
rp_status rp_weights_check_finite(const rp_weights *w, const char *name, rp_error *err);
const rp_tensor *rp_weights_find(const rp_weights *w, const char *name);

/* The tensor of a model variable, checked: present, with the variable's
** shape. Errors name the variable and both shapes. */
rp_status rp_weights_var(const rp_weights *w, const rp_variable *var, const rp_tensor **out,
                         rp_error *err);

/* The weights of a model from its flat parameters (one group). */
rp_status rp_weights_from_params(const rp_model *m, const float *params, rp_weights **out,
                                 rp_error *err);
/* Copies weights into flat parameters; every variable must be present with
** its shape (group `group` when the file holds several). */
rp_status rp_weights_to_params(const rp_model *m, const rp_weights *w, int group, float *params,
                               rp_error *err);

/* safetensors files (PyTorch users' state_dicts): a little-endian u64 N,
** N bytes of JSON naming each tensor's dtype, shape and [begin, end) in the
** data, then the data. parse reads F32, F16, BF16 and F64 tensors as float32
** under their own names and shapes (a scalar as [1]), one group each, in
** the header's order, and refuses any other dtype, a key given twice, and
** offsets that do not tile the data exactly, naming the file and tensor.
** serialize writes F32 tensors of one group in w's order, with
** {"format": "pt"} as metadata and the header padded to 8 bytes; save
** writes it atomically. */
rp_status rp_safetensors_parse(rp_weights **out, const unsigned char *data, size_t len,
                               const char *name, rp_error *err);
rp_status rp_safetensors_load(rp_weights **out, const char *path, rp_error *err);
rp_status rp_safetensors_serialize(const rp_weights *w, unsigned char **out, size_t *len,
                                   rp_error *err);
rp_status rp_safetensors_save(const rp_weights *w, const char *path, rp_error *err);

/* Name schemes of LLaMA-family state_dicts: Meta's (llama/model.py:
** tok_embeddings.weight, layers.i.attention.wq ... feed_forward.w3,
** attention_norm, ffn_norm, norm.weight, output.weight) and Hugging Face's
** (transformers' LlamaForCausalLM: model.embed_tokens.weight,
** model.layers.i.self_attn.q_proj ... mlp.down_proj, input_layernorm,
** post_attention_layernorm, model.norm.weight, lm_head.weight; each head's
** Q and K rows in its half-split rotary order, which import and export
** permute to and from Meta's interleaved pairs). */
typedef enum rp_llama_names { RP_LLAMA_META, RP_LLAMA_HF } rp_llama_names;

/* A LLaMA-family model of repipe's graph: an embedding, blocks of rmsnorm
** -> linear (fused Q, K, V rows) -> attention -> linear + residual, rmsnorm
** -> SwiGLU (w1 / gate the linear under silu, w3 / up the other, w2 / down
** after their mul) + residual, then rmsnorm, a linear head and
** softmax_cross_entropy, none with biases; the blocks are found by what
** reads what. Import fills params (the whole model's) from `file` (named
** `name` in errors): every tensor must be there with its shape, and none
** may be left over (but the schemes' rotary buffers, rope.freqs and
** ...rotary_emb.inv_freq); a tied head takes the embedding's table (a file
** without a head is one), and a head in the file must then equal it.
** Export gives the scheme's tensors in its state_dict's order (a tied head
** under Hugging Face's names not at all, as transformers saves one). */
/* The scheme whose embedding `file` holds (tok_embeddings.weight: Meta's,
** model.embed_tokens.weight: Hugging Face's); false when neither. */
bool rp_llama_names_of(const rp_weights *file, rp_llama_names *out);
rp_status rp_llama_import(const rp_model *m, const rp_weights *file, rp_llama_names names,
                          const char *name, float *params, rp_error *err);
rp_status rp_llama_export(const rp_model *m, const float *params, rp_llama_names names,
                          rp_weights **out, rp_error *err);

/* Largest difference of two tensors relative to their scale:
** max |a - b| / max(max |a|, max |b|); 0 for two zero tensors. */
double rp_tensor_rel_diff(const float *a, const float *b, size_t n);


/* llm.c's GPT-2 checkpoints: a header of 256 int32 [20240326, 3, maxT, V,
** L, NH, C, Vp], then float32 tensors in its order (wte, wpe, then each
** block tensor stacked over the L blocks, then the final LayerNorm). The
** model must be llm.c's shape: embedding V C, position_embedding, L
** transformer_blocks (heads NH, mlp 4, gelu tanh), layernorm, linear V
** bias=false tie=0, softmax_cross_entropy, with T <= maxT and V <= Vp.
** Import fills params (the whole model's); export writes maxT = T, Vp = V
** and the embedding's copy of a tied table. */
rp_status rp_llmc_import(const rp_model *m, const unsigned char *data, size_t len,
                         const char *name, float *params, rp_error *err);
rp_status rp_llmc_export(const rp_model *m, const float *params, unsigned char **out,
                         size_t *len, rp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_WEIGHTS_H */
