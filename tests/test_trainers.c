/*
** What another trainer can run: rp_trainer_restrict narrows the engine
** objective to it (no stage replication, its schedules, its cuts),
** rp_trainer_runs says why a plan is out of its reach, and
** rp_trainer_pipelines reads uniform stage replication as data parallelism.
** (The settings themselves are held to torchtitan's and Megatron-LM's own
** reading in tests/trainers_test.py.)
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/repipe.h"
#include "support.h"
#include "test.h"

/* tok_embeddings, layers.0 .. layers.{n-1}, norm, lm_head: a chain whose
** head takes `head` ms forward and twice that backward, each block 1 and 2
** and holds `par` bytes of parameters (the rest 1 MB each). */
static rp_profile *llama(int n, double head, double par) {
    char text[8192];
    size_t at = (size_t)snprintf(text, sizeof text,
                                 "node0 -- Input0 micro_batch=16 -- forward_compute_time=0, "
                                 "backward_compute_time=0, activation_size=1000, "
                                 "parameter_size=0\n");
    for (int l = 0; l < n + 3; l++) {
        char name[64];
        double f = 1, b = 1e6;
        if (l == 0)
            snprintf(name, sizeof name, "tok_embeddings: Embedding"), f = 0.1;
        else if (l <= n)
            snprintf(name, sizeof name, "layers.%d: Block", l - 1), b = par;
        else if (l == n + 1)
            snprintf(name, sizeof name, "norm: RMSNorm"), f = 0.05;
        else
            snprintf(name, sizeof name, "lm_head: Linear"), f = head;
        at += (size_t)snprintf(text + at, sizeof text - at,
                               "node%d -- %s -- forward_compute_time=%g, "
                               "backward_compute_time=%g, activation_size=1000, "
                               "parameter_size=%g\n",
                               l + 1, name, f, 2 * f, b);
    }
    return test_profile_chain(text, sizeof text, at, n + 3, "llama");
}

static rp_status plan(const rp_profile *p, const rp_autoplan_options *o, rp_autoplan *r,
                      rp_error *err) {
    double batch = 16;
    rp_config base;
    rp_config_default(&base);
    return rp_autoplan_compute(&p, &batch, 1, &base, NULL, o, r, err);
}

static rp_autoplan_options machines(int W, long long batch) {
    rp_autoplan_options o;
    rp_autoplan_options_default(&o);
    o.num_levels = 1;
    o.machines[0] = W;
    o.bandwidth[0] = 1e10;
    o.global_batch = batch;
    return o;
}

static bool replicated(const rp_config *c) {
    for (int s = 0; s < c->layers_per_stage.count; s++)
        if (rp_config_stage_replicas(c, s) > 1)
            return true;
    return false;
}

/* A head of 16 blocks' time, and blocks whose gradients are costly to sum:
** repipe replicates the head's stage alone; neither trainer can, and each
** gets its best plan without. */
static void heavy_head(void) {
    rp_profile *p = llama(4, 16, 2e8);
    rp_autoplan_options o = machines(3, 48);
    rp_autoplan r, alt;
    rp_error err;
    char why[512];
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    CHECK(replicated(&r.best.cfg));
    for (int t = 0; t < 2; t++) {
        rp_autoplan_options a = o;
        unsigned char *cuts;
        CHECK(!rp_trainer_runs((rp_trainer)t, p, &r.best.cfg, why, sizeof why));
        CHECK(strstr(why, "replicates stage") != NULL);
        CHECK(rp_trainer_restrict((rp_trainer)t, p, &a, &cuts, &err) == RP_OK);
        CHECK(plan(p, &a, &alt, &err) == RP_OK);
        rp_config pipes;
        rp_trainer_pipelines(&alt.best.cfg, &pipes);
        CHECK(!replicated(&pipes));
        CHECK(rp_trainer_runs((rp_trainer)t, p, &alt.best.cfg, why, sizeof why));
        CHECK(alt.best.seconds >= r.best.seconds * 0.99); /* the restriction costs */
        /* Megatron-LM: the norm stays with the head (no stage begins at lm_head) */
        for (int s = 0, l = 0; t == RP_TRAINER_MEGATRON && s < pipes.layers_per_stage.count;
             l += pipes.layers_per_stage.layers[s++])
            CHECK(l != 6);
        free(cuts);
        char *text;
        CHECK(rp_trainer_settings((rp_trainer)t, p, &r.best.cfg, NULL, &text, &err) ==
              RP_ERR_INVALID);
        CHECK(strstr(err.msg, "replicates") != NULL);
    }
    rp_profile_free(p);
}

/* A cut before lm_head is torchtitan's to make, not Megatron-LM's. */
static void cuts(void) {
    rp_profile *p = llama(2, 1, 1e6);
    rp_config c;
    rp_config_default(&c);
    c.layers_per_stage.count = 2;
    c.layers_per_stage.layers[0] = 4; /* tok_embeddings, 2 blocks, norm | lm_head */
    c.layers_per_stage.layers[1] = 1;
    c.gradient_accumulation_steps = 4;
    char why[512], *text;
    rp_error err;
    CHECK(rp_trainer_runs(RP_TRAINER_TORCHTITAN, p, &c, why, sizeof why));
    CHECK(!rp_trainer_runs(RP_TRAINER_MEGATRON, p, &c, why, sizeof why));
    CHECK(strstr(why, "'lm_head'") != NULL);
    CHECK(rp_trainer_settings(RP_TRAINER_TORCHTITAN, p, &c, NULL, &text, &err) == RP_OK);
    CHECK(strstr(text, "module_fqns_per_model_part tok_embeddings,layers.0,layers.1,norm "
                       "lm_head\n") != NULL);
    free(text);
    c.layers_per_stage.layers[0] = 3, c.layers_per_stage.layers[1] = 2;
    CHECK(rp_trainer_settings(RP_TRAINER_MEGATRON, p, &c, NULL, &text, &err) == RP_OK);
    CHECK(strstr(text, "--pipeline-model-parallel-layout Et*2|L\n") != NULL);
    CHECK(strstr(text, "--num-layers 2\n") != NULL);
    free(text);
    c.schedule = RP_SCHEDULE_ZB_H1; /* torchtitan: from a CSV, whose path it needs */
    CHECK(!rp_trainer_runs(RP_TRAINER_MEGATRON, p, &c, why, sizeof why));
    CHECK(strstr(why, "no zb-h1 schedule") != NULL);
    CHECK(rp_trainer_settings(RP_TRAINER_TORCHTITAN, p, &c, NULL, &text, &err) ==
          RP_ERR_INVALID);
    CHECK(rp_trainer_settings(RP_TRAINER_TORCHTITAN, p, &c, "s.csv", &text, &err) == RP_OK);
    CHECK(strstr(text, "--parallelism.pipeline_parallel_schedule_csv s.csv\n") != NULL);
    free(text);
    rp_profile_free(p);
}

/* Every stage replicated 2 ways over GA 4: two pipelines of 2 micro-batches. */
static void uniform_replication(void) {
    rp_config c, d;
    rp_config_default(&c);
    c.layers_per_stage.count = 2;
    c.layers_per_stage.layers[0] = c.layers_per_stage.layers[1] = 3;
    c.stage_replication_count = 2;
    c.stage_replication[0] = c.stage_replication[1] = 2;
    c.gradient_accumulation_steps = 4;
    c.replication_factor = 3;
    CHECK(rp_trainer_pipelines(&c, &d));
    CHECK_INT(d.replication_factor, 6);
    CHECK_INT(d.gradient_accumulation_steps, 2);
    CHECK_INT(rp_config_stage_replicas(&d, 1), 1);
    c.stage_replication[1] = 1;
    CHECK(!rp_trainer_pipelines(&c, &d));
}

/* --pp and --schedules: the stages and the schedule asked for. */
static void asked(void) {
    rp_profile *p = llama(8, 1, 1e6);
    rp_autoplan_options o = machines(4, 32);
    rp_autoplan r;
    rp_error err;
    o.pipeline_stages = 2;
    o.schedules = 1u << RP_SCHEDULE_1F1B;
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    CHECK_INT(r.best.cfg.layers_per_stage.count, 2);
    CHECK_INT(r.best.cfg.schedule, RP_SCHEDULE_1F1B);
    o.schedules = 1u << RP_SCHEDULE_INTERLEAVED;
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    CHECK_INT(r.best.cfg.layers_per_stage.count, 4); /* 2 chunks on each of 2 workers */
    CHECK_INT(r.best.cfg.schedule, RP_SCHEDULE_INTERLEAVED);
    o.pipeline_stages = 9;
    CHECK(plan(p, &o, &r, &err) == RP_ERR_INVALID);
    rp_profile_free(p);
}

int main(void) {
    heavy_head();
    cuts();
    uniform_replication();
    asked();
    return test_finish("test_trainers");
}
