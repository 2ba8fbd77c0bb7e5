/*
** Predicting an update's time: the workers' operation lists, played on a
** clock per worker with the profile's layer times.
*/
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/model.h"
#include "repipe/schedule.h"
#include "repipe/session.h"
#include "repipe/simulate.h"

rp_status rp_simulate(const rp_config *cfg, const double *fwd_ms, const double *bwd_ms,
                      const double *out_bytes, const double *param_bytes, int num_layers,
                      const rp_sim_options *opt, rp_sim_result *res, rp_error *err) {
    memset(res, 0, sizeof *res);
    int counts[RP_MAX_STAGES];
    rp_status st = rp_config_stage_layers(cfg, false, num_layers, counts, err);
    if (st)
        return st;
    rp_workplan *plan;
    if ((st = rp_workplan_build(cfg, &plan, err)))
        return st;
    if ((st = rp_workplan_check(plan, NULL, err))) {
        rp_workplan_free(plan);
        return st;
    }
    int P = plan->stages, W = plan->workers;
    double tf[RP_MAX_STAGES], tb[RP_MAX_STAGES], act[RP_MAX_STAGES], par[RP_MAX_STAGES];
    double scale = opt->compute_scale > 0 ? opt->compute_scale : 1;
    /* fp16 exchange halves what crosses between workers: activations, their
    ** gradients and the replicas' sums (a sharded reduction stays fp32) */
    double wire = cfg->enable_half_partials ? 0.5 : 1.0;
    double wire_sum = cfg->enable_half_partials && !cfg->replicated_tensor_sharding ? 0.5 : 1.0;
    for (int s = 0, l = 0; s < P; s++) {
        tf[s] = tb[s] = par[s] = 0;
        for (int k = 0; k < counts[s]; k++, l++) {
            tf[s] += fwd_ms[l] * 1e-3 * scale;
            tb[s] += bwd_ms[l] * 1e-3 * scale;
            par[s] += param_bytes[l];
        }
        if (cfg->recompute_checkpoint_every_layer) /* backward runs the stage forward again */
            tb[s] += tf[s];
        act[s] = l > 0 ? out_bytes[l - 1] * wire : 0; /* the stage's output, per micro-batch */
    }
    int nev = 0;
    for (int w = 0; w < W; w++)
        nev += plan->w[w].num_ops;
    res->events = malloc(sizeof(rp_sim_event) * (nev ? nev : 1));
    double *clock = calloc(W, sizeof(double));
    int *pc = calloc(W, sizeof(int));
    /* when each message is available: per (to, kind, mb) */
    int GA = cfg->gradient_accumulation_steps;
    double *avail = malloc(sizeof(double) * (size_t)W * 2 * GA);
    double *arrive = malloc(sizeof(double) * W);
    if (!res->events || !clock || !pc || !avail || !arrive) {
        free(clock), free(pc), free(avail), free(arrive);
        rp_workplan_free(plan);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < (size_t)W * 2 * GA; i++)
        avail[i] = -1;
    for (int w = 0; w < W; w++)
        arrive[w] = -1;
    int G = rp_grouping_num_groups(&cfg->replica_grouping);
    for (bool progress = true; progress;) {
        progress = false;
        for (int w = 0; w < W; w++) {
            const rp_worker_ops *wo = &plan->w[w];
            int s = wo->stage;
            while (pc[w] < wo->num_ops) {
                const rp_op *op = &wo->ops[pc[w]];
                double t0 = clock[w], t1 = t0;
                switch (op->kind) {
                case RP_OP_RECV_ACT:
                case RP_OP_RECV_GRAD: {
                    double a = avail[((size_t)w * 2 + (op->kind == RP_OP_RECV_GRAD)) * GA + op->mb];
                    if (a < 0)
                        goto blocked;
                    t1 = a > t0 ? a : t0;
                    break;
                }
                case RP_OP_SEND_ACT:
                case RP_OP_SEND_GRAD: {
                    double bytes = (op->kind == RP_OP_SEND_ACT ? act[s] : act[s - 1]) *
                                   cfg->micro_batch_size / opt->profile_batch;
                    avail[((size_t)op->peer * 2 + (op->kind == RP_OP_SEND_GRAD)) * GA + op->mb] =
                        t0 + opt->latency + bytes / opt->bandwidth;
                    break;
                }
                case RP_OP_FORWARD:
                    t1 = t0 + tf[s] * cfg->micro_batch_size / opt->profile_batch;
                    break;
                case RP_OP_BACKWARD:
                    t1 = t0 + tb[s] * cfg->micro_batch_size / opt->profile_batch;
                    break;
                case RP_OP_WAIT_SENDS:
                    break;
                case RP_OP_REDUCE: {
                    /* everyone of the stage and group, then an allreduce */
                    arrive[w] = t0;
                    int gid = s * G + rp_grouping_group_of(&cfg->replica_grouping, wo->replica);
                    double last = 0;
                    int n = 0;
                    for (int v = 0; v < W; v++) {
                        const rp_worker_ops *vo = &plan->w[v];
                        if (vo->stage * G + rp_grouping_group_of(&cfg->replica_grouping,
                                                                 vo->replica) != gid)
                            continue;
                        if (arrive[v] < 0)
                            goto blocked;
                        last = arrive[v] > last ? arrive[v] : last;
                        n++;
                    }
                    t1 = last + (n > 1 ? opt->latency +
                                             2.0 * (n - 1) / n * par[s] * wire_sum / opt->bandwidth
                                       : 0);
                    break;
                }
                case RP_OP_STEP:
                    t1 = t0 + par[s] / opt->bandwidth; /* one pass over the parameters */
                    break;
                }
                res->events[res->num_events++] =
                    (rp_sim_event){w, op->kind, op->mb, t0, t1};
                clock[w] = t1;
                pc[w]++;
                progress = true;
            }
        blocked:;
        }
    }
    for (int w = 0; w < W; w++)
        res->update_time = clock[w] > res->update_time ? clock[w] : res->update_time;
    res->workers = W;
    res->stages = P;
    for (int s = 0, l = 0; s < P; s++) {
        /* activations a micro-batch keeps: every output, or with recomputation
        ** the outputs that end a segment (the next layer has parameters, or
        ** the stage ends) and one segment's worth of the others, shared */
        double acts = 0, seg = 0, most = 0;
        for (int k = 0; k < counts[s]; k++, l++) {
            bool end = k == counts[s] - 1 || param_bytes[l + 1] > 0;
            if (!cfg->recompute_checkpoint_every_layer || end)
                acts += out_bytes[l];
            else
                seg += out_bytes[l];
            if (end)
                most = seg > most ? seg : most, seg = 0;
        }
        int slots = 0;
        for (int w = 0; w < W; w++)
            if (plan->w[w].stage == s && plan->w[w].slots > slots)
                slots = plan->w[w].slots;
        /* optimizer state: per parameter, sharded over the workers that share
        ** the stage's variables, streamed a chunk at a time when offchip */
        double state = par[s] * rp_optimizer_state_per_param(&cfg->optimizer);
        int sharers = cfg->replica_grouping.group_size *
                      (cfg->stage_replication_count ? cfg->stage_replication[s] : 1);
        if (cfg->replicated_tensor_sharding && sharers > 1)
            state /= sharers;
        double chunk = sizeof(float) * (double)RP_OFFCHIP_CHUNK *
                       rp_optimizer_state_per_param(&cfg->optimizer);
        if (cfg->optimizer_state_offchip && state > chunk)
            state = chunk;
        res->stage_bytes[s] = 2 * par[s] + state +
                              (slots * acts + most) * cfg->micro_batch_size / opt->profile_batch;
    }
    free(clock), free(pc), free(avail), free(arrive);
    rp_workplan_free(plan);
    return RP_OK;
}

void rp_sim_result_free(rp_sim_result *r) {
    free(r->events);
    memset(r, 0, sizeof *r);
}

rp_status rp_sim_svg(const rp_sim_result *r, const char *title, const char *path,
                     rp_error *err) {
    FILE *f = fopen(path, "w");
    if (!f)
        return rp_fail(err, RP_ERR_IO, "%s: cannot write", path);
    int row = 28, left = 110, width = 900, top = 40;
    double scale = r->update_time > 0 ? width / r->update_time : 1;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\" font-size=\"11\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"10\" y=\"20\" font-size=\"14\">%s: %.3f ms per update</text>\n",
            left + width + 20, top + row * r->workers + 30, title, r->update_time * 1e3);
    for (int w = 0; w < r->workers; w++)
        fprintf(f, "<text x=\"10\" y=\"%d\">worker %d</text>\n", top + w * row + 17, w);
    static const char *const colors[] = {"#dddddd", "#4e79a7", "#dddddd", "#dddddd", "#59a14f",
                                         "#dddddd", "#dddddd", "#f28e2b", "#9c755f"};
    for (int i = 0; i < r->num_events; i++) {
        const rp_sim_event *e = &r->events[i];
        if (e->kind != RP_OP_FORWARD && e->kind != RP_OP_BACKWARD && e->kind != RP_OP_REDUCE &&
            e->kind != RP_OP_STEP)
            continue;
        double x = left + e->t0 * scale, wpx = (e->t1 - e->t0) * scale;
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" "
                "stroke=\"white\"><title>%s %d</title></rect>\n",
                x, top + e->worker * row, wpx > 0.5 ? wpx : 0.5, row - 6, colors[e->kind],
                rp_op_name((rp_op_kind)e->kind), e->mb);
        if (e->mb >= 0 && wpx > 12)
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" fill=\"white\">%s%d</text>\n", x + 2,
                    top + e->worker * row + 15, e->kind == RP_OP_FORWARD ? "F" : "B", e->mb);
    }
    fprintf(f,
            "<text x=\"%d\" y=\"%d\">blue: forward, green: backward, orange: reduce, brown: "
            "step</text>\n</svg>\n",
            left, top + row * r->workers + 20);
    if (fclose(f) != 0)
        return rp_fail(err, RP_ERR_IO, "%s: write failed", path);
    return RP_OK;
}
