/*
** A cluster plan as the trainers' own settings: Megatron-LM's command-line
** arguments (megatron-core 0.19's megatron/training/arguments.py) and
** torchtitan's (0.3's JobConfig, --section.key value). Each line is one
** option and its value. What a trainer cannot express is said, in `why`,
** with what the settings run instead; nothing is dropped without a word
** (tests/fixtures/trainers/ holds the trainers' own reading of them).
*/
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/planner.h"
#include "../../transformer/transformer_impl.h"

/* Megatron-LM's --pipeline-model-parallel-layout of the plan's chunks in
** order (chunk c p + r on rank r): E for the embedding, t*k for k blocks,
** m for each multi-token prediction block and L for the head with the loss,
** '|' between them. */
static void layout(FILE *f, const rp_transformer *m, const rp_config *cfg) {
    fprintf(f, "--pipeline-model-parallel-layout ");
    for (int s = 0, l = 0; s < cfg->layers_per_stage.count; s++) {
        int n = cfg->layers_per_stage.layers[s], blocks = 0;
        bool embed = false, head = false;
        for (int k = 0; k < n; k++, l++) {
            int kind = rpi_xf_kind(m, l);
            embed |= kind == RPI_XF_EMBED;
            head |= kind == RPI_XF_HEAD;
            blocks += rpi_xf_is_block(kind);
        }
        fprintf(f, "%s%s", s ? "|" : "", embed ? "E" : "");
        if (blocks > 1)
            fprintf(f, "t*%d", blocks);
        else if (blocks == 1)
            fputc('t', f);
        for (int k = 0; head && k < m->mtp; k++) /* multi-token prediction, with the loss */
            fputc('m', f);
        if (head)
            fputc('L', f);
    }
    fputc('\n', f);
}

/* A mixture's arguments: its shape, the blocks that are mixtures
** (--moe-layer-freq: every k-th, or a pattern where the first are dense),
** the expert groups (Megatron-LM's expert tensor group is the tensor
** group's size unless given: always given), the all-to-all dispatcher and
** grouped products the expert groups are priced with. */
static void megatron_moe(FILE *f, const rp_transformer *m, const rp_scale_plan *p) {
    fprintf(f, "--num-experts %d\n--moe-router-topk %d\n--moe-ffn-hidden-size %d\n", m->experts,
            m->top_k, m->moe_ffn);
    if (m->shared_ffn)
        fprintf(f, "--moe-shared-expert-intermediate-size %d\n", m->shared_ffn);
    if (!m->dense_first)
        fprintf(f, "--moe-layer-freq %d\n", m->moe_every);
    else if (m->moe_every == 1)
        fprintf(f, "--moe-layer-freq ([0]*%d+[1]*%d)\n", m->dense_first,
                m->layers - m->dense_first);
    else
        for (int i = 0; i < m->layers; i++)
            fprintf(f, "%s%d%s", i ? "," : "--moe-layer-freq [", rp_transformer_moe_block(m, i),
                    i == m->layers - 1 ? "]\n" : "");
    if (p->run.capacity > 0)
        fprintf(f, "--moe-expert-capacity-factor %g\n--moe-pad-expert-input-to-capacity\n",
                p->run.capacity);
    fprintf(f, "--expert-model-parallel-size %d\n--expert-tensor-parallel-size %d\n"
               "--moe-token-dispatcher-type alltoall\n--moe-grouped-gemm\n",
            p->run.expert_parallel > 1 ? p->run.expert_parallel : 1,
            p->run.expert_tensor_parallel > 1 ? p->run.expert_tensor_parallel : 1);
}

/* Megatron-LM's arguments of the model's shape. */
static void megatron_model(FILE *f, const rp_transformer *m, const rp_scale_plan *p) {
    fprintf(f, "--num-layers %d\n--hidden-size %d\n--num-attention-heads %d\n", m->layers,
            m->hidden, m->heads);
    if (m->kv_heads != m->heads)
        fprintf(f, "--group-query-attention\n--num-query-groups %d\n", m->kv_heads);
    if (m->kv_lora)
        fprintf(f, "--multi-latent-attention\n--q-lora-rank %d\n--kv-lora-rank %d\n"
                   "--qk-head-dim %d\n--qk-pos-emb-head-dim %d\n--v-head-dim %d\n",
                m->q_lora, m->kv_lora, m->head_dim, m->rope_dim, m->v_dim);
    else if (m->head_dim * m->heads != m->hidden)
        fprintf(f, "--kv-channels %d\n", m->head_dim);
    if (m->mtp)
        fprintf(f, "--mtp-num-layers %d\n", m->mtp);
    if (m->qk_norm)
        fprintf(f, "--qk-layernorm\n");
    fprintf(f, "--ffn-hidden-size %d\n", m->ffn);
    if (m->experts)
        megatron_moe(f, m, p);
    if (m->mlp == RP_MLP_SWIGLU)
        fprintf(f, "--swiglu\n");
    if (m->norm == RP_NORM_RMS)
        fprintf(f, "--normalization RMSNorm\n");
    if (m->position == RP_POSITION_ROPE)
        fprintf(f, "--position-embedding-type rope\n");
    if (m->bias != RP_BIAS_ALL)
        fprintf(f, "--disable-bias-linear\n%s", m->bias == RP_BIAS_QKV ? "--add-qkv-bias\n" : "");
    if (m->untied)
        fprintf(f, "--untie-embeddings-and-output-weights\n");
    fprintf(f, "--seq-length %d\n--max-position-embeddings %d\n--vocab-size %d\n"
               "--make-vocab-size-divisible-by 128\n",
            m->seq, m->seq, m->vocab);
}

static void megatron(FILE *f, const rp_transformer *m, const rp_scale_plan *p, long long B,
                     char *why, size_t cap) {
    megatron_model(f, m, p);
    if (m->flash)
        fprintf(f, "--attention-backend flash\n");
    fprintf(f, "--tensor-model-parallel-size %d\n--pipeline-model-parallel-size %d\n", p->t, p->p);
    if (p->cp > 1)
        fprintf(f, "--context-parallel-size %d\n", p->cp);
    bool dv = p->cfg.schedule == RP_SCHEDULE_DUALPIPEV;
    /* the layout says the chunks a rank too (Megatron-LM takes one or the other) */
    if (p->p > 1 && !dv)
        layout(f, m, &p->cfg);
    if (p->run.sequence_parallel)
        fprintf(f, "--sequence-parallel\n");
    if (p->sharding == RP_SHARD_OPTIMIZER)
        fprintf(f, "--use-distributed-optimizer\n");
    else if (p->sharding == RP_SHARD_FULL)
        fprintf(f, "--use-megatron-fsdp\n--data-parallel-sharding-strategy optim_grads_params\n"
                   "--ckpt-format fsdp_dtensor\n");
    if (p->run.recompute == RP_RECOMPUTE_SELECTIVE)
        fprintf(f, "--recompute-granularity selective\n%s",
                m->kv_lora ? "--recompute-modules core_attn mla_up_proj\n" : "");
    else if (p->run.recompute == RP_RECOMPUTE_FULL)
        fprintf(f, "--recompute-granularity full\n--recompute-method uniform\n"
                   "--recompute-num-layers 1\n");
    else if (p->run.recompute == RP_RECOMPUTE_BLOCKS)
        fprintf(f, "--recompute-granularity full\n--recompute-method block\n"
                   "--recompute-num-layers %d\n", p->run.recompute_blocks);
    fprintf(f, "--micro-batch-size %d\n--global-batch-size %lld\n%s", p->b, B,
            p->run.precision == RP_PRECISION_FP32 ? "" : "--bf16\n"); /* (fp32: its default) */
    if (p->run.precision == RP_PRECISION_FP8)
        fprintf(f, "--fp8-format hybrid\n--fp8-recipe tensorwise\n");
    if (p->run.overlap && p->d * p->cp > 1)
        fprintf(f, "--overlap-grad-reduce\n%s",
                p->sharding == RP_SHARD_OPTIMIZER ? "--overlap-param-gather\n" : "");
    if (p->run.overlap && p->run.sequence_parallel)
        fprintf(f, "--tp-comm-overlap\n");
    if (p->run.a2a_overlap && !dv) /* the experts' all-to-alls behind the paired pass */
        fprintf(f, "--overlap-moe-expert-parallel-comm\n");
    if (dv)
        snprintf(why, cap, "Megatron-LM has no DualPipeV: the settings are its shape under 1F1B, "
                 "with Megatron-LM's own stages; repipe's engine runs the V as --config-out "
                 "writes it");
}

/* torchtitan's module names of layers [l, l + n): tok_embeddings, layers.K,
** and the head as norm and lm_head (torchtitan 0.3's Llama 3 names). */
static void modules(FILE *f, const rp_transformer *m, int l, int n) {
    for (int k = 0; k < n; k++, l++) {
        int kind = rpi_xf_kind(m, l);
        fprintf(f, "%s%s", k ? "," : "",
                kind == RPI_XF_EMBED ? "tok_embeddings" : kind == RPI_XF_HEAD ? "norm,lm_head" : "");
        if (rpi_xf_is_block(kind))
            fprintf(f, "layers.%d", l - 1);
    }
}

/* torchtitan's expert groups, and what it cannot run of the plan's, said
** after the n characters of why already written; the new length. */
static size_t torchtitan_experts(FILE *f, const rp_transformer *m, const rp_scale_plan *p,
                                 char *why, size_t cap, size_t n) {
#define SAY(...) (n += (size_t)snprintf(why + n, n < cap ? cap - n : 0, __VA_ARGS__))
    int ep = p->run.expert_parallel > 1 ? p->run.expert_parallel : 1;
    if (ep > 1)
        fprintf(f, "--parallelism.expert_parallel_degree %d\n", ep);
    /* torchtitan's CUDA graphs refuse its all-to-all dispatcher, which waits
    ** on the host for the tokens' counts (its parser says so); a pipeline
    ** has turned them off already */
    if (ep > 1 && p->p <= 1)
        fprintf(f, "--training.disable_cuda_graphs\n");
    if (p->run.expert_tensor_parallel > 1)
        SAY("%storchtitan 0.3 has no expert tensor parallelism: each expert whole on a rank",
            n ? "; " : "");
    /* torchtitan's expert groups take their ranks from FSDP's and the tensor
    ** and context groups, not from the replicas (dp_replicate) */
    int sharded = p->sharding != RP_SHARD_NONE && p->d > 1 ? p->d : 1;
    if (ep > 1 && ((long long)sharded * p->cp * p->t) % ep)
        SAY("%storchtitan's expert groups come from the sharded data-parallel, context and "
            "tensor ranks (%d here), which %d does not divide", n ? "; " : "",
            sharded * p->cp * p->t, ep);
    if (p->run.capacity > 0)
        SAY("%storchtitan's mixtures are dropless: no capacity factor", n ? "; " : "");
    if (m->experts)
        SAY("%storchtitan's mixtures of experts are its own models (deepseek_v3, qwen3, "
            "gpt_oss, ...), chosen by --module and --config (qwen3 and qwen3_30b_a3b, say): the "
            "shape is theirs, the settings above are the plan's", n ? "; " : "");
#undef SAY
    return n;
}

/* torchtitan's pipeline: its schedule, each stage's modules, and CUDA graphs
** off (torchtitan 0.3 runs no pipeline under them). */
static void torchtitan_pipeline(FILE *f, const rp_transformer *m, const rp_scale_plan *p) {
    bool dv = p->cfg.schedule == RP_SCHEDULE_DUALPIPEV;
    fprintf(f, "--parallelism.pipeline_parallel_degree %d\n", p->p);
    fprintf(f, "--parallelism.pipeline_parallel_schedule %s\n",
            dv ? "DualPipeV" : p->v > 1 ? "Interleaved1F1B" : "1F1B");
    fprintf(f, "--parallelism.module_fqns_per_model_part");
    for (int s = 0, l = 0; s < p->cfg.layers_per_stage.count; s++) {
        fputc(' ', f);
        modules(f, m, l, p->cfg.layers_per_stage.layers[s]);
        l += p->cfg.layers_per_stage.layers[s];
    }
    fprintf(f, "\n--parallelism.pipeline_parallel_microbatch_size %d\n", p->b);
    fprintf(f, "--training.disable_cuda_graphs\n");
}

static void torchtitan(FILE *f, const rp_transformer *m, const rp_scale_plan *p, long long B,
                       char *why, size_t cap) {
    size_t n = 0;
    why[0] = '\0';
#define SAY(...) (n += (size_t)snprintf(why + n, n < cap ? cap - n : 0, __VA_ARGS__))
    fprintf(f, "--training.seq_len %d\n", m->seq);
    fprintf(f, "--parallelism.tensor_parallel_degree %d\n", p->t);
    if (p->cp > 1)
        fprintf(f, "--parallelism.context_parallel_degree %d\n", p->cp);
    if (p->p > 1)
        torchtitan_pipeline(f, m, p);
    /* torchtitan's data parallelism replicates (DDP) or shards everything
    ** (FSDP): no ZeRO-1 */
    int R = p->d;
    if (p->sharding != RP_SHARD_NONE && R > 1)
        fprintf(f, "--parallelism.data_parallel_replicate_degree 1\n"
                   "--parallelism.data_parallel_shard_degree %d\n", R);
    else
        fprintf(f, "--parallelism.data_parallel_replicate_degree %d\n"
                   "--parallelism.data_parallel_shard_degree 1\n", R);
    if (p->sharding == RP_SHARD_OPTIMIZER && R > 1)
        SAY("torchtitan has no distributed optimizer (ZeRO-1): its data parallelism shards the "
            "weights and gradients too (FSDP), which holds less and gathers the weights each "
            "update");
    if (p->t > 1 && !p->run.sequence_parallel)
        SAY("%storchtitan's tensor parallelism always splits the norms' activations too "
            "(sequence parallelism)", n ? "; " : "");
    fprintf(f, "--training.local_batch_size %lld\n--training.global_batch_size %lld\n",
            (long long)p->b * p->cfg.gradient_accumulation_steps, B);
    fprintf(f, "--training.mixed_precision_param %s\n",
            p->run.precision == RP_PRECISION_FP32 ? "float32" : "bfloat16");
    n = torchtitan_experts(f, m, p, why, cap, n);
    /* activation checkpointing is a subcommand of torchtitan's settings: what
    ** follows it would be the subcommand's, so it comes last */
    fprintf(f, "activation-checkpoint:%s\n",
            p->run.recompute == RP_RECOMPUTE_FULL || p->run.recompute == RP_RECOMPUTE_BLOCKS
                ? "full"
            : p->run.recompute == RP_RECOMPUTE_SELECTIVE ? "selective"
                                                         : "none");
    if (p->run.recompute == RP_RECOMPUTE_BLOCKS)
        SAY("%storchtitan recomputes every block or every k-th one, not the first %d of each "
            "stage: every block here, which holds less and costs a forward of the others",
            n ? "; " : "", p->run.recompute_blocks);
    if (p->run.recompute == RP_RECOMPUTE_SELECTIVE)
        SAY("%storchtitan's selective recomputation is per operation: it keeps the products' "
            "outputs (every other one) and redoes the rest, attention's core among it",
            n ? "; " : "");
    if (p->run.precision == RP_PRECISION_FP8)
        SAY("%storchtitan 0.3 turns fp8 on in a model's config function (a "
            "Float8LinearConverter in its model_spec, as its llama3_debugmodel_float8 does), not "
            "by a setting: the settings above run bf16 until the model's config adds it",
            n ? "; " : "");
#undef SAY
}

rp_status rp_scale_settings(rp_trainer t, const rp_transformer *m, const rp_scale_plan *p,
                            long long global_batch, char **out, char *why, size_t cap,
                            rp_error *err) {
    *out = NULL;
    why[0] = '\0';
    size_t len;
    FILE *f = open_memstream(out, &len);
    if (!f)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the settings");
    if (t == RP_TRAINER_MEGATRON)
        megatron(f, m, p, global_batch, why, cap);
    else
        torchtitan(f, m, p, global_batch, why, cap);
    if (fclose(f) != 0 || !*out) {
        free(*out);
        *out = NULL;
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the settings");
    }
    return RP_OK;
}
