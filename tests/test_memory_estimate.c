/*
** The simulator's memory per stage (what 'repipe simulate' and 'repipe
** plan' print) against the engine's memory plan for the same model and
** configuration (rp_session_memory: the bytes its workers allocate for
** parameters, gradients, optimizer state, activations and scratch), for the
** example GPT and LLaMA under 1f1b, zb-h2, interleaved-1f1b, tensor
** parallelism and recomputation (of every layer, and by layer): within
** 10 % on every stage.
**
**   test_memory_estimate GPT_MODEL LLAMA_MODEL
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "repipe/profile.h"
#include "repipe/profile.h"
#include "repipe/simulate.h"
#include "support.h"
#include "test.h"

/* Each case's settings, its stages written where %s is: two stages, or
** for interleaving four (two a worker). */
static const struct {
    const char *name, *json;
    bool four;
} CASES[] = {
    {"1f1b", "\"layers_per_stage\": %s, \"gradient_accumulation_steps\": 4", false},
    {"zb-h2", "\"layers_per_stage\": %s, \"gradient_accumulation_steps\": 4, \"schedule\": \"zb-h2\"",
     false},
    {"interleaved", "\"layers_per_stage\": %s, \"gradient_accumulation_steps\": 4, "
                    "\"schedule\": \"interleaved-1f1b\", \"virtual_stages\": 2", true},
    {"tp2", "\"layers_per_stage\": %s, \"gradient_accumulation_steps\": 4, \"tensor_parallel\": 2",
     false},
    {"recompute", "\"layers_per_stage\": %s, \"gradient_accumulation_steps\": 4, "
                  "\"recompute_checkpoint_every_layer\": true", false},
    {"by layer", "\"layers_per_stage\": %s, \"gradient_accumulation_steps\": 4, "
                 "\"recompute_layers\": [1, 2, 3, 5, 6, 7]", false},
};

/* Cuts between blocks: the GPT's blocks are one line each, after its
** embedding's two; the LLaMA's are graphs of 12 lines after its
** embedding's one. */
static const char *STAGES[2][2] = {
    {"[4, -1]", "[2, 2, 1, -1]"},
    {"[25, -1]", "[13, 12, 12, -1]"},
};

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_memory_estimate GPT_MODEL LLAMA_MODEL\n");
        return 2;
    }
    for (int mi = 1; mi <= 2; mi++) {
        rp_model *m;
        rp_error err;
        if (rp_model_load(&m, argv[mi], &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        rp_profile *p;
        CHECK_OK(rp_profile_measure(m, 4, 1, &p, &err), err);
        double *fw, *bw, *ob, *pb, *cut, *bi, *bwt, *saved, *ck, *ws, *sc, *gr;
        int *node, L;
        CHECK_OK(rp_profile_layers(p, &fw, &bw, &ob, &pb, &node, &L, &err), err);
        CHECK_OK(rp_profile_cut_bytes(p, node, L, &cut, &err), err);
        CHECK_OK(rp_profile_split_ms(p, node, L, &bi, &bwt, &err), err);
        CHECK_OK(rp_profile_numbers(p, node, L, "saved_bytes=", &saved, &err), err);
        CHECK_OK(rp_profile_numbers(p, node, L, "checkpoint_bytes=", &ck, &err), err);
        CHECK_OK(rp_profile_numbers(p, node, L, "wstash_bytes=", &ws, &err), err);
        CHECK_OK(rp_profile_numbers(p, node, L, "scratch_bytes=", &sc, &err), err);
        CHECK_OK(rp_profile_numbers(p, node, L, "grad_bytes=", &gr, &err), err);
        /* a tensor rank's: the layers it splits, and what it keeps of them */
        double rsaved[L], rck[L], rws[L], rsc[L], rgr[L];
        unsigned char split[L];
        rp_model *rank;
        size_t *map;
        CHECK_OK(rp_model_tensor_split(m, 2, 1, RP_TP_VOCAB, &rank, &map, &err), err);
        for (int l = 0; l < L; l++)
            split[l] = rank->layers[l].param_count != m->layers[l].param_count ? RP_SIM_TP_SPLIT : 0;
        rp_model_free(rank), free(map);
        CHECK_OK(rp_layer_memory_table(m, 2, RP_TP_VOCAB, 4, rsaved, rck, rws, rsc, rgr, &err), err);
        for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
            char shape[512], json[1024];
            snprintf(shape, sizeof shape, CASES[c].json, STAGES[mi - 1][CASES[c].four]);
            snprintf(json, sizeof json,
                     "{\"seed\": 1, \"micro_batch_size\": 4, %s, \"optimizer\": {\"type\": "
                     "\"adamw\", \"lr\": 0.001}}",
                     shape);
            rp_config cfg = test_config(json);
            rp_session *s = test_session(m, &cfg, NULL);
            CHECK(s != NULL);
            rp_sim_options opt;
            rp_sim_options_default(&opt);
            opt.profile_batch = 4;
            opt.cut_bytes = cut, opt.bwd_input_ms = bi, opt.bwd_weight_ms = bwt;
            opt.kept_bytes = saved, opt.recompute_kept_bytes = ck;
            opt.wstash_bytes = ws, opt.scratch_bytes = sc, opt.grad_bytes = gr;
            if (rp_config_tensor_parallel(&cfg) > 1) {
                opt.tensor_split = split;
                opt.kept_bytes = rsaved, opt.recompute_kept_bytes = rck;
                opt.wstash_bytes = rws, opt.scratch_bytes = rsc, opt.grad_bytes = rgr;
            }
            rp_sim_result res;
            CHECK_OK(rp_simulate(&cfg, fw, bw, ob, pb, L, &opt, &res, &err), err);
            for (int k = 0; s && k < rp_session_stages(s); k++) {
                rp_memory mem;
                CHECK_OK(rp_session_memory(s, k, &mem, &err), err);
                double eng = (double)(mem.params + mem.grads + mem.optimizer + mem.activations +
                                      mem.scratch);
                double r = res.stage_bytes[k] / eng;
                printf("%s %-12s stage %d  engine %9.0f (p %zu g %zu o %zu a %zu s %zu)  est %9.0f  "
                       "%.3f\n",
                       mi == 1 ? "gpt  " : "llama", CASES[c].name, k, eng, mem.params, mem.grads,
                       mem.optimizer, mem.activations, mem.scratch, res.stage_bytes[k], r);
                CHECKF(r > 0.9 && r < 1.1, "%s %s stage %d: estimate %.3f of the engine's",
                       argv[mi], CASES[c].name, k, r);
            }
            rp_sim_result_free(&res);
            rp_session_free(s);
        }
        /* the time: one worker, one micro-batch, so an update is its forward,
        ** backward and step; recomputing layers 1 to 3 adds their forwards
        ** (layer 4 the last: it is kept) */
        double t[3];
        for (int k = 0; k < 3; k++) {
            static const char *rc[3] = {"", ", \"recompute_layers\": [1, 2, 3]",
                                        ", \"recompute_layers\": [1, 2, 3, 4]"};
            char json[256];
            snprintf(json, sizeof json, "{\"micro_batch_size\": 4, \"layers_per_stage\": [5, -1], "
                                        "\"stage_replication\": [1, 1]%s}", rc[k]);
            rp_config cfg = test_config(json);
            rp_sim_options opt;
            rp_sim_options_default(&opt);
            opt.profile_batch = 4;
            rp_sim_result res;
            CHECK_OK(rp_simulate(&cfg, fw, bw, ob, pb, L, &opt, &res, &err), err);
            t[k] = res.update_time;
            rp_sim_result_free(&res);
        }
        double again = (fw[1] + fw[2] + fw[3]) * 1e-3;
        CHECKF(fabs(t[1] - t[0] - again) < 1e-9 * t[0], "%s: recomputing layers 1-3 adds %g s, "
               "not their forwards' %g", argv[mi], t[1] - t[0], again);
        CHECKF(t[2] == t[1], "%s: the stage's last layer is kept, yet it adds %g s", argv[mi],
               t[2] - t[1]);
        free(fw), free(bw), free(ob), free(pb), free(cut), free(bi), free(bwt);
        free(saved), free(ck), free(ws), free(sc), free(gr), free(node);
        rp_profile_free(p);
        rp_model_free(m);
    }
    return test_finish("test_memory_estimate");
}
