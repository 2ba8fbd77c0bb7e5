/*
** Plans for the trainers people already run: torchtitan's and Megatron-LM's
** settings for an engine configuration, over a profile whose nodes are
** named by module ("layers.3: Llama3TransformerBlock", as
** repipe.torch.profile writes them).
**
** What each trainer can express bounds what the planner may choose for it
** (rp_trainer_restrict); a configuration outside that is refused with the
** reason (rp_trainer_runs), and settings are written only for one inside it
** (rp_trainer_settings). The forms are those of the releases the fixtures
** in tests/fixtures/trainers/ were read back by:
**
** torchtitan 0.3.0 takes its settings on the command line. Model parts are
** lists of module names (--parallelism.module_fqns_per_model_part), and its
** split keeps a model part's top-level children and entries of its layer
** container ("tok_embeddings", "layers.3", "norm", "lm_head"), so any
** contiguous run of such modules is a stage. Every stage is one rank of a
** pipeline; data parallelism replicates (or shards) whole pipelines. It
** runs PyTorch's schedules by name, or any schedule as a CSV file of
** actions (pipeline_parallel_schedule_csv), which is how repipe's
** zero-bubble orders reach it. It refuses pipelines with CUDA graphs, so
** they are turned off.
**
** Megatron-LM (megatron-core 0.19) lays stages out with
** --pipeline-model-parallel-layout: for each stage in order ('|' between
** them) its embedding 'E', its transformer layers 't' and its output layer
** with the loss 'L', which also carries the final norm. The embedding, a
** block, and the norm with the head are therefore whole; its schedules are
** 1F1B and interleaved 1F1B (the layout's stages c P + r on rank r, as
** repipe's interleaved-1f1b places chunks).
*/
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/planner.h"

enum { ROLE_EMBED, ROLE_BLOCK, ROLE_HEAD };

/* The profile's layers by module: each layer's name (into its node's
** description), its length, and its role for Megatron-LM's layout. */
typedef struct modules {
    int L;
    const char **name;
    int *len, *role, *node;
    int blocks, first_block, last_block;
} modules;

static void modules_free(modules *m) {
    free(m->name), free(m->len), free(m->role), free(m->node);
}

/* The module name of a description: what comes before ": "; 0 where there
** is none, or it is not a dotted name of letters, digits and '_'. */
static int name_len(const char *desc) {
    const char *colon = strstr(desc, ": ");
    if (!colon || colon == desc)
        return 0;
    for (const char *c = desc; c < colon; c++)
        if (!isalnum((unsigned char)*c) && *c != '_' && *c != '.')
            return 0;
    return (int)(colon - desc);
}

/* "layers.3": an entry of a container, by index. */
static bool is_block(const char *name, int len) {
    const char *dot = memchr(name, '.', (size_t)len);
    if (!dot || dot == name || dot == name + len - 1)
        return false;
    for (const char *c = dot + 1; c < name + len; c++)
        if (!isdigit((unsigned char)*c))
            return false;
    return true;
}

static rp_status modules_of(const rp_profile *p, modules *m, rp_error *err) {
    memset(m, 0, sizeof *m);
    double *fw, *bw, *ob, *pb;
    rp_status st = rp_profile_layers(p, &fw, &bw, &ob, &pb, &m->node, &m->L, err);
    if (st)
        return st;
    free(fw), free(bw), free(ob), free(pb);
    m->name = calloc((size_t)m->L, sizeof *m->name);
    m->len = calloc((size_t)m->L, sizeof *m->len);
    m->role = calloc((size_t)m->L, sizeof *m->role);
    if (!m->name || !m->len || !m->role) {
        modules_free(m);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    m->first_block = -1;
    for (int l = 0; l < m->L; l++) {
        m->name[l] = p->nodes[m->node[l]].desc;
        m->len[l] = name_len(m->name[l]);
        if (m->len[l] && is_block(m->name[l], m->len[l])) {
            m->blocks++;
            m->last_block = l;
            if (m->first_block < 0)
                m->first_block = l;
        }
    }
    for (int l = 0; l < m->L; l++)
        m->role[l] = m->blocks == 0 || l < m->first_block ? ROLE_EMBED
                     : l > m->last_block                  ? ROLE_HEAD
                                                          : ROLE_BLOCK;
    return RP_OK;
}

const char *rp_trainer_name(rp_trainer t) {
    return t == RP_TRAINER_TORCHTITAN ? "torchtitan" : "Megatron-LM";
}

/* Whether the profile's layers can be named to trainer t at all (every
** layer a module it can place); the reason where not. */
static rp_status nameable(rp_trainer t, const rp_profile *p, const modules *m, rp_error *err) {
    for (int l = 0; l < m->L; l++) {
        const rp_profile_node *n = &p->nodes[m->node[l]];
        if (!m->len[l])
            return rp_fail(err, RP_ERR_INVALID,
                           "%s: node %s (line %d of the profile) has no module name (\"NAME: "
                           "Class\", as repipe.torch.profile writes): the trainer places modules by "
                           "name",
                           rp_trainer_name(t), n->id, n->line);
        const char *dot = memchr(m->name[l], '.', (size_t)m->len[l]);
        if (dot && !is_block(m->name[l], m->len[l]))
            return rp_fail(err, RP_ERR_INVALID,
                           "%s: node %s (line %d of the profile) is '%.*s', part of a module: the "
                           "trainer places a model's top-level modules and the entries of its "
                           "layer list, so a stage cannot begin inside one",
                           rp_trainer_name(t), n->id, n->line, m->len[l], m->name[l]);
    }
    if (t == RP_TRAINER_MEGATRON) {
        if (m->blocks == 0 || m->first_block == 0 || m->last_block == m->L - 1)
            return rp_fail(err, RP_ERR_INVALID,
                           "Megatron-LM lays out an embedding, transformer layers (\"layers.N\") "
                           "and the output layer: the profile has %d such layers%s",
                           m->blocks,
                           m->blocks == 0          ? ""
                           : m->first_block == 0   ? " and nothing before the first (the embedding)"
                                                   : " and nothing after the last (the head)");
        for (int l = m->first_block; l <= m->last_block; l++)
            if (!is_block(m->name[l], m->len[l]))
                return rp_fail(err, RP_ERR_INVALID,
                               "Megatron-LM's layout has transformer layers between the "
                               "embedding and the head, but node %s (line %d of the profile) is "
                               "'%.*s'",
                               p->nodes[m->node[l]].id, p->nodes[m->node[l]].line, m->len[l],
                               m->name[l]);
    }
    return RP_OK;
}

static unsigned schedules_of(rp_trainer t) {
    if (t == RP_TRAINER_MEGATRON)
        return 1u << RP_SCHEDULE_1F1B | 1u << RP_SCHEDULE_INTERLEAVED;
    return 1u << RP_SCHEDULE_1F1B | 1u << RP_SCHEDULE_GPIPE | 1u << RP_SCHEDULE_ZB_H1 |
           1u << RP_SCHEDULE_ZB_H2 | 1u << RP_SCHEDULE_ZB_AUTO | 1u << RP_SCHEDULE_INTERLEAVED |
           1u << RP_SCHEDULE_ZB_V;
}

/* Whether a stage of trainer t may begin at layer j: where both pass one
** tensor from a stage to the next (torchtitan's PipelineStage, Megatron-LM's
** hidden states), no edge of the graph may cross the cut but the one from
** layer j - 1 to layer j; and Megatron-LM keeps the embedding whole and the
** final norm with the head. *from and *to name a crossing edge's layers
** where that is why. */
static bool cut_ok(rp_trainer t, const rp_profile *p, const modules *m, int j, int *from,
                   int *to) {
    *from = *to = -1;
    if (j <= 0 || j >= m->L)
        return true;
    for (int e = 0; e < p->num_edges; e++) {
        int a = -1, b = -1;
        for (int l = 0; l < m->L && (a < 0 || b < 0); l++) {
            a = m->node[l] == p->edges[e].from ? l : a;
            b = m->node[l] == p->edges[e].to ? l : b;
        }
        if (a >= 0 && b >= 0 && a < j && b >= j && !(a == j - 1 && b == j)) {
            *from = a, *to = b;
            return false;
        }
    }
    if (t != RP_TRAINER_MEGATRON)
        return true;
    return m->role[j - 1] != m->role[j] || m->role[j] == ROLE_BLOCK;
}

rp_status rp_trainer_restrict(rp_trainer t, const rp_profile *p, rp_autoplan_options *o,
                              unsigned char **cuts, rp_error *err) {
    *cuts = NULL;
    modules m;
    rp_status st = modules_of(p, &m, err);
    if (st)
        return st;
    /* the cuts the trainer can make (where the layers cannot be named the
    ** plan is still priced, and rp_trainer_settings says why it cannot be
    ** written) */
    if (!(*cuts = calloc((size_t)m.L + 1, 1))) {
        modules_free(&m);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    for (int j = 0, a, b; j <= m.L; j++)
        (*cuts)[j] = cut_ok(t, p, &m, j, &a, &b);
    o->cuts = *cuts;
    o->one_worker_a_stage = true;
    o->no_recompute_by_layer = true; /* (whole blocks, or attention's core) */
    o->schedules = o->schedules ? o->schedules & schedules_of(t) : schedules_of(t);
    modules_free(&m);
    return RP_OK;
}

/* cfg with every stage replicated r ways is r pipelines of GA / r
** micro-batches each (the stage replicas take the micro-batches in turns,
** so replica j of every stage sees micro-batches j, j + r, ...): in a
** trainer's words, r times the data parallelism. Writes that form to out;
** false where the stages' replication differs or r does not divide GA. */
bool rp_trainer_pipelines(const rp_config *cfg, rp_config *out) {
    *out = *cfg;
    int n = cfg->layers_per_stage.count > 0 ? cfg->layers_per_stage.count : 1;
    int r = rp_config_stage_replicas(cfg, 0);
    for (int s = 1; s < n; s++)
        if (rp_config_stage_replicas(cfg, s) != r)
            return false;
    if (r == 1)
        return true;
    if (cfg->gradient_accumulation_steps % r)
        return false;
    out->replication_factor *= r;
    out->gradient_accumulation_steps /= r;
    out->stage_replication_count = 0;
    return true;
}

bool rp_trainer_runs(rp_trainer t, const rp_profile *p, const rp_config *plan, char *why,
                     size_t cap) {
    rp_config same;
    const rp_config *cfg = rp_trainer_pipelines(plan, &same) ? &same : plan;
    rp_error err;
    modules m;
    if (modules_of(p, &m, &err)) {
        snprintf(why, cap, "%s", err.msg);
        return false;
    }
    bool ok = false;
    for (int s = 0; s < cfg->layers_per_stage.count; s++) {
        int r = rp_config_stage_replicas(cfg, s);
        if (r > 1) {
            snprintf(why, cap,
                     "%s runs every stage on one rank of a pipeline (data parallelism copies whole "
                     "pipelines); this plan replicates %s %d %d ways",
                     rp_trainer_name(t), rp_config_chunked(cfg) ? "chunk" : "stage", s, r);
            goto done;
        }
    }
    if (cfg->recompute_layers_count) {
        snprintf(why, cap, "%s recomputes whole blocks (or attention's core), not a list of "
                 "layers; this plan recomputes %d layers by recompute_layers",
                 rp_trainer_name(t), cfg->recompute_layers_count);
        goto done;
    }
    if (!(schedules_of(t) & (1u << cfg->schedule))) {
        snprintf(why, cap, "%s has no %s schedule", rp_trainer_name(t),
                 rp_schedule_name(cfg->schedule));
        goto done;
    }
    if (nameable(t, p, &m, &err)) {
        snprintf(why, cap, "%s", err.msg);
        goto done;
    }
    for (int s = 0, l = 0, a, b; s < cfg->layers_per_stage.count;
         l += cfg->layers_per_stage.layers[s++])
        if (!cut_ok(t, p, &m, l, &a, &b)) {
            if (a >= 0)
                snprintf(why, cap,
                         "%s passes one tensor from a stage to the next; this plan begins stage %d "
                         "at '%.*s', but '%.*s' before it also feeds '%.*s' (the graph's edge "
                         "crosses the cut)",
                         rp_trainer_name(t), s, m.len[l], m.name[l], m.len[a], m.name[a], m.len[b],
                         m.name[b]);
            else
                snprintf(why, cap,
                         "Megatron-LM keeps the embedding whole and the final norm with the head; "
                         "this plan begins stage %d at '%.*s'",
                         s, m.len[l], m.name[l]);
            goto done;
        }
    ok = true;
done:
    modules_free(&m);
    return ok;
}

/* The number of pipeline ranks of cfg (chunks share a rank). */
static int pipeline_ranks(const rp_config *cfg) {
    int stages = cfg->layers_per_stage.count > 0 ? cfg->layers_per_stage.count : 1;
    return rp_config_chunked(cfg) ? stages / cfg->virtual_stages : stages;
}

static void torchtitan(FILE *f, const rp_config *cfg, const modules *m, const char *csv) {
    int P = pipeline_ranks(cfg), R = cfg->replication_factor;
    int T = cfg->tensor_parallel > 1 ? cfg->tensor_parallel : 1;
    long long B = cfg->micro_batch_size, GA = cfg->gradient_accumulation_steps;
    if (P > 1) {
        fprintf(f, "--parallelism.pipeline_parallel_degree %d\n", P);
        fprintf(f, "--parallelism.module_fqns_per_model_part");
        for (int s = 0, l = 0; s < cfg->layers_per_stage.count; s++) {
            fputc(' ', f);
            for (int k = 0; k < cfg->layers_per_stage.layers[s]; k++, l++)
                fprintf(f, "%s%.*s", k ? "," : "", m->len[l], m->name[l]);
        }
        fputc('\n', f);
        const char *name = cfg->schedule == RP_SCHEDULE_GPIPE         ? "GPipe"
                           : cfg->schedule == RP_SCHEDULE_INTERLEAVED ? "Interleaved1F1B"
                           : cfg->schedule == RP_SCHEDULE_ZB_V        ? "ZBVZeroBubble"
                           : cfg->schedule == RP_SCHEDULE_1F1B        ? "1F1B"
                                                                      : "PipelineScheduleSingle";
        fprintf(f, "--parallelism.pipeline_parallel_schedule %s\n", name);
        if (csv)
            fprintf(f, "--parallelism.pipeline_parallel_schedule_csv %s\n", csv);
        fprintf(f, "--parallelism.pipeline_parallel_microbatch_size %lld\n", B);
    }
    fprintf(f, "--parallelism.tensor_parallel_degree %d\n", T);
    /* repipe's replicas keep whole copies (DDP); sharded optimizer state
    ** becomes FSDP's sharding over the same ranks */
    if (cfg->replicated_tensor_sharding && R > 1)
        fprintf(f, "--parallelism.data_parallel_replicate_degree 1\n"
                   "--parallelism.data_parallel_shard_degree %d\n", R);
    else
        fprintf(f, "--parallelism.data_parallel_replicate_degree %d\n"
                   "--parallelism.data_parallel_shard_degree 1\n", R);
    fprintf(f, "--training.local_batch_size %lld\n", B * GA);
    fprintf(f, "--training.global_batch_size %lld\n", B * GA * R);
    if (P > 1)
        fprintf(f, "--training.disable_cuda_graphs\n");
    fprintf(f, "%s\n", cfg->recompute_checkpoint_every_layer ? "activation-checkpoint:full"
                                                              : "activation-checkpoint:none");
}

static void megatron(FILE *f, const rp_config *cfg, const modules *m) {
    int P = pipeline_ranks(cfg), R = cfg->replication_factor;
    int T = cfg->tensor_parallel > 1 ? cfg->tensor_parallel : 1;
    long long B = cfg->micro_batch_size, GA = cfg->gradient_accumulation_steps;
    fprintf(f, "--tensor-model-parallel-size %d\n", T);
    fprintf(f, "--pipeline-model-parallel-size %d\n", P);
    fprintf(f, "--num-layers %d\n", m->blocks);
    if (P > 1) {
        /* E, t*k, L per stage, '|' between stages: the whole layout */
        fprintf(f, "--pipeline-model-parallel-layout ");
        for (int s = 0, l = 0; s < cfg->layers_per_stage.count; s++) {
            int n = cfg->layers_per_stage.layers[s], t = 0;
            bool embed = false, head = false;
            for (int k = 0; k < n; k++, l++) {
                embed |= m->role[l] == ROLE_EMBED;
                head |= m->role[l] == ROLE_HEAD;
                t += m->role[l] == ROLE_BLOCK;
            }
            fprintf(f, "%s%s", s ? "|" : "", embed ? "E" : "");
            if (t > 1)
                fprintf(f, "t*%d", t);
            else if (t == 1)
                fputc('t', f);
            if (head)
                fputc('L', f);
        }
        fputc('\n', f);
    }
    fprintf(f, "--micro-batch-size %lld\n", B);
    fprintf(f, "--global-batch-size %lld\n", B * GA * R);
    if (cfg->recompute_checkpoint_every_layer)
        fprintf(f, "--recompute-granularity full\n--recompute-method uniform\n"
                   "--recompute-num-layers 1\n");
    if (cfg->replicated_tensor_sharding && R > 1)
        fprintf(f, "--use-distributed-optimizer\n");
}

rp_status rp_trainer_settings(rp_trainer t, const rp_profile *p, const rp_config *cfg,
                              const char *csv, char **out, rp_error *err) {
    *out = NULL;
    char why[512];
    if (!rp_trainer_runs(t, p, cfg, why, sizeof why))
        return rp_fail(err, RP_ERR_INVALID, "%s", why);
    rp_config same;
    rp_trainer_pipelines(cfg, &same); /* (rp_trainer_runs: every stage alike) */
    cfg = &same;
    bool needs_csv = t == RP_TRAINER_TORCHTITAN && pipeline_ranks(cfg) > 1 &&
                     (cfg->schedule == RP_SCHEDULE_ZB_H1 || cfg->schedule == RP_SCHEDULE_ZB_H2 ||
                      cfg->schedule == RP_SCHEDULE_ZB_AUTO || cfg->schedule == RP_SCHEDULE_ZB_V);
    if (needs_csv && !csv)
        return rp_fail(err, RP_ERR_INVALID,
                       "torchtitan runs %s as a schedule CSV file: give its path "
                       "(rp_schedule_csv writes it)",
                       rp_schedule_name(cfg->schedule));
    modules m;
    rp_status st = modules_of(p, &m, err);
    if (st)
        return st;
    size_t len;
    FILE *f = open_memstream(out, &len);
    if (!f) {
        modules_free(&m);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    if (t == RP_TRAINER_TORCHTITAN)
        torchtitan(f, cfg, &m, needs_csv ? csv : NULL);
    else
        megatron(f, cfg, &m);
    modules_free(&m);
    if (fclose(f) != 0 || !*out) {
        free(*out);
        *out = NULL;
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    return RP_OK;
}
