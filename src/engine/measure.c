/*
** Profiles of repipe models, measured on this machine, and execution
** configurations from plans of them.
*/
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/util.h"
#include "repipe/measure.h"
#include "repipe/planner.h"

static char *dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static rp_status measure(const rp_model *m, int batch, int repeats, rp_profile **out,
                         rp_error *err) {
    *out = NULL;
    if (batch < 1 || repeats < 1)
        return rp_fail(err, RP_ERR_INVALID, "profile: batch and repeats must be >= 1");
    rp_profile *p = calloc(1, sizeof *p);
    if (!p || !(p->nodes = calloc(m->num_layers + 1, sizeof(rp_profile_node))) ||
        !(p->edges = calloc((size_t)m->num_layers * RP_MAX_INPUTS + 1, sizeof(rp_profile_edge)))) {
        rp_profile_free(p);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    double *fw = malloc(sizeof(double) * repeats), *bw = malloc(sizeof(double) * repeats);
    double *bi = calloc(repeats, sizeof(double)), *bwt = calloc(repeats, sizeof(double));
    int32_t *labels = calloc((size_t)batch * m->num_targets, sizeof(int32_t)); /* a row each */
    int64_t *ids = calloc(batch, sizeof(int64_t));
    rp_status st = RP_OK;
    if (!fw || !bw || !labels || !ids) {
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* the input: PipeDream's convention, a source named Input */
    rp_profile_node *in = &p->nodes[p->num_nodes++];
    in->id = dupstr("node0");
    /* the micro-batch rides in the description, where PipeDream's reader
    ** ignores it and simulate and plan find it (rp_profile_micro_batch) */
    char desc0[64];
    snprintf(desc0, sizeof desc0, "Input0 micro_batch=%d", batch);
    in->desc = dupstr(desc0);
    in->activation_bytes = sizeof(float) * rp_shape_size(&m->input) * (double)batch;
    in->stage_id = -1;
    openblas_set_num_threads(1); /* as a worker of the engine runs them */
    /* A layer's backward computes its input's gradient only when a layer
    ** below it has parameters, as the engine's first stage does: the first
    ** linear of an MLP skips a product as large as its weight gradient. */
    bool below = false;
    for (int l = 0; l < m->num_layers && !st; l++) {
        const rp_layer *L = &m->layers[l];
        rp_net *net = NULL;
        rp_acts *acts = NULL;
        /* its inputs in, its output out; a layer with parameters also timed
        ** in a split backward's two halves */
        rp_net_options alone = {.alone = true, .split_backward = L->param_count > 0};
        if ((st = rp_net_create_with(m, l, l + 1, batch, &alone, &net, err)) ||
            (st = rp_acts_create(net, batch, &acts, err))) {
            rp_net_free(net);
            break;
        }
        rp_model_init_params(m, l, l + 1, 1, NULL, rp_net_params(net));
        size_t ni = rp_net_in_size(net) * batch, no = rp_net_out_size(net) * batch;
        float *x = malloc(sizeof(float) * ni), *dy = malloc(sizeof(float) * no);
        if (!x || !dy) {
            free(x), free(dy);
            rp_acts_free(acts);
            rp_net_free(net);
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
            break;
        }
        for (size_t i = 0; i < ni; i++) /* token ids for embeddings, values otherwise */
            x[i] = L->type == RP_LAYER_EMBEDDING ? (float)(i % L->vocab) : (float)((i % 17) * 0.1);
        for (size_t i = 0; i < no; i++)
            dy[i] = 1e-3f;
        rp_step_ctx ctx = {.training = true, .sample_id = ids, .labels = labels,
                           .loss_scale = 1.0 / batch};
        rp_net_forward(net, acts, x, batch, &ctx, NULL); /* warm up */
        for (int r = 0; r < repeats; r++) {
            double t = rp_now();
            rp_net_forward(net, acts, x, batch, &ctx, NULL);
            fw[r] = rp_now() - t;
            t = rp_now();
            rp_net_backward(net, acts, dy, &ctx, below);
            bw[r] = rp_now() - t;
            if (!alone.split_backward)
                continue;
            rp_net_forward(net, acts, x, batch, &ctx, NULL);
            t = rp_now();
            rp_net_backward_input(net, acts, dy, &ctx, below);
            bi[r] = rp_now() - t;
            t = rp_now();
            rp_net_backward_weight(net, acts, &ctx);
            bwt[r] = rp_now() - t;
        }
        qsort(fw, repeats, sizeof(double), rp_cmp_double);
        qsort(bw, repeats, sizeof(double), rp_cmp_double);
        qsort(bi, repeats, sizeof(double), rp_cmp_double);
        qsort(bwt, repeats, sizeof(double), rp_cmp_double);
        below = below || L->param_count > 0;
        rp_profile_node *n = &p->nodes[p->num_nodes];
        char id[32], desc[160];
        snprintf(id, sizeof id, "node%d", l + 1);
        int dl = snprintf(desc, sizeof desc, "%s (layer %d, line %d)", rp_layer_name(L->type), l,
                          L->line);
        if (alone.split_backward) /* the halves as they run: their sum is the whole's and the split's copies */
            snprintf(desc + dl, sizeof desc - dl,
                     " backward_input_time=%.3f backward_weight_time=%.3f",
                     bi[repeats / 2] * 1e3, bwt[repeats / 2] * 1e3);
        n->id = dupstr(id);
        n->desc = dupstr(desc);
        n->forward_ms = fw[repeats / 2] * 1e3;
        n->backward_ms = bw[repeats / 2] * 1e3;
        n->activation_bytes = sizeof(float) * (double)no;
        n->parameter_bytes = sizeof(float) * (double)L->param_count;
        n->stage_id = -1;
        n->line = L->line;
        p->num_nodes++;
        for (int i = 0; i < L->num_inputs; i++) { /* node t + 1 is tensor t's maker */
            bool seen = false;
            for (int j = 0; j < i; j++)
                seen = seen || L->inputs[j] == L->inputs[i];
            if (!seen)
                p->edges[p->num_edges++] = (rp_profile_edge){L->inputs[i] + 1, l + 1, 0};
        }
        free(x), free(dy);
        rp_acts_free(acts);
        rp_net_free(net);
        if (!n->id || !n->desc)
            st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
done:
    free(fw), free(bw), free(bi), free(bwt), free(labels), free(ids);
    if (st) {
        rp_profile_free(p);
        return st;
    }
    *out = p;
    return RP_OK;
}

/* Times as the engine's workers see them: denormals flushed. */
rp_status rp_profile_measure(const rp_model *m, int batch, int repeats, rp_profile **out,
                             rp_error *err) {
    unsigned fpu = rpi_fpu_enter();
    rp_status st = measure(m, batch, repeats, out, err);
    rpi_fpu_leave(fpu);
    return st;
}

rp_status rp_plan_to_config(const rp_plan *plan, const rp_profile *prof, rp_config *cfg,
                            char *explain, size_t explain_len, rp_error *err) {
    int S = plan->num_stages;
    if (S > RP_MAX_STAGES)
        return rp_fail(err, RP_ERR_INVALID, "the plan has %d stages, more than %d", S,
                       RP_MAX_STAGES);
    /* layers: the profile's nodes in topological order, Input sources left out */
    double *fw, *bw, *ob, *pb;
    int *node, L, counts[RP_MAX_STAGES] = {0}, last = 0;
    rp_status bad = rp_profile_layers(prof, &fw, &bw, &ob, &pb, &node, &L, err);
    if (bad)
        return bad;
    for (int k = 0; k < L && !bad; k++) {
        int i = node[k], st = plan->node_stage[i];
        if (st < 0)
            continue;
        if (st < last)
            bad = rp_fail(err, RP_ERR_INVALID,
                          "the plan puts node %s (line %d) in stage %d after a node of stage "
                          "%d: its stages are not consecutive runs of the profile's layers, so "
                          "they are not layers_per_stage",
                          prof->nodes[i].id, prof->nodes[i].line, st, last);
        last = st;
        counts[st]++;
    }
    free(fw), free(bw), free(ob), free(pb), free(node);
    if (bad)
        return bad;
    /* a top level that only replicates is the replication factor */
    int R = plan->levels[0].num_stages == 1 ? plan->levels[0].stages[0].replication : 1;
    cfg->replication_factor = R;
    cfg->layers_per_stage.count = S;
    cfg->stage_replication_count = S;
    for (int k = 0; k < S; k++) {
        cfg->layers_per_stage.layers[k] = counts[k];
        cfg->stage_replication[k] = plan->stage_num_ranks[k] / R;
    }
    if (cfg->matmul_proportion_count != 1 && cfg->matmul_proportion_count != S) {
        cfg->matmul_proportion_count = 1; /* a per-stage list of the old pipeline */
    }
    cfg->grouping_set = false;
    cfg->replica_grouping = rp_grouping_all(R);
    if (explain) {
        size_t at = (size_t)snprintf(explain, explain_len, "replication_factor %d, layers_per_stage [", R);
        for (int k = 0; k < S && at < explain_len; k++)
            at += (size_t)snprintf(explain + at, explain_len - at, "%s%d", k ? ", " : "", counts[k]);
        at += at < explain_len ? (size_t)snprintf(explain + at, explain_len - at, "], stage_replication [") : 0;
        for (int k = 0; k < S && at < explain_len; k++)
            at += (size_t)snprintf(explain + at, explain_len - at, "%s%d", k ? ", " : "",
                                   cfg->stage_replication[k]);
        if (at < explain_len)
            snprintf(explain + at, explain_len - at, "]: %s",
                     R > 1 ? "the top level replicates the whole pipeline, so its copies are "
                             "the replicas"
                           : "the stages of every level are flattened into one pipeline, each "
                             "stage on as many workers as the plan gives it");
    }
    return RP_OK;
}
