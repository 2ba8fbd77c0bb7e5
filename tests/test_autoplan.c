/*
** The engine's planner on profiles whose answer is known by construction:
** one dominant layer without parameters beside layers whose gradients are
** expensive to reduce (that layer alone on its stage, on every worker but
** one), a model too large for one worker (a pipeline), layers without
** parameters (data parallelism: nothing to reduce, no bubble); a memory
** only sharded optimizer state fits, and a memory nothing fits.
*/
#include <math.h>
#include <stdlib.h>

#include "plan/engine/autoplan_impl.h"
#include "repipe/planner.h"
#include "repipe/schedule.h"
#include "repipe/simulate.h"
#include "support.h"
#include "test.h"

/* A chain profile: an Input source, then one node per layer. */
/* wt (may be NULL): each layer's weight-gradient part of bw, written as
** the backward_input_time and backward_weight_time of repipe's profiles;
** saved (may be NULL): what each layer keeps, as their saved_bytes */
static rp_profile *chain_kept(int n, const double *fw, const double *bw, const double *wt,
                              const double *saved, const double *act, const double *par) {
    char text[8192];
    size_t at = (size_t)snprintf(text, sizeof text,
                                 "node0 -- Input0 -- forward_compute_time=0, "
                                 "backward_compute_time=0, activation_size=1000, "
                                 "parameter_size=0\n");
    for (int l = 0; l < n; l++) {
        char split[96] = "", kept[48] = "";
        if (wt)
            snprintf(split, sizeof split, " backward_input_time=%g backward_weight_time=%g",
                     bw[l] - wt[l], wt[l]);
        if (saved)
            snprintf(kept, sizeof kept, " saved_bytes=%g", saved[l]);
        at += (size_t)snprintf(text + at, sizeof text - at,
                               "node%d -- layer%d%s%s -- forward_compute_time=%g, "
                               "backward_compute_time=%g, activation_size=%g, "
                               "parameter_size=%g\n",
                               l + 1, l, split, kept, fw[l], bw[l], act[l], par[l]);
    }
    return test_profile_chain(text, sizeof text, at, n, "chain");
}

static rp_profile *chain_split(int n, const double *fw, const double *bw, const double *wt,
                               const double *act, const double *par) {
    return chain_kept(n, fw, bw, wt, NULL, act, par);
}

static rp_profile *chain(int n, const double *fw, const double *bw, const double *act,
                         const double *par) {
    return chain_split(n, fw, bw, NULL, act, par);
}

/* Plans from one profile measured on 16 rows, over the default
** configuration. */
static rp_status plan(const rp_profile *p, const rp_autoplan_options *o, rp_autoplan *r,
                      rp_error *err) {
    double batch = 16;
    rp_config base;
    rp_config_default(&base);
    return rp_autoplan_compute(&p, &batch, 1, &base, NULL, o, r, err);
}

static rp_autoplan_options machines(int W, double bw, long long batch) {
    rp_autoplan_options o;
    rp_autoplan_options_default(&o);
    o.num_levels = 1;
    o.machines[0] = W;
    o.bandwidth[0] = bw;
    o.global_batch = batch;
    return o;
}

/* Two workers, a stage each, under 1F1B at micro-batches of 16 samples. */
static rp_autoplan_options two_stages(double bw, long long batch) {
    rp_autoplan_options o = machines(2, bw, batch);
    o.micro_batch = 16;
    o.pipeline_stages = 2;
    o.one_worker_a_stage = true;
    o.schedules = 1u << RP_SCHEDULE_1F1B;
    return o;
}

static void dominant_layer(void) {
    double fw[] = {10, 0.1, 0.1, 0.1}, bw[] = {20, 0.2, 0.2, 0.2};
    double act[] = {1000, 1000, 1000, 1000}, par[] = {0, 2e7, 2e7, 2e7};
    rp_profile *p = chain(4, fw, bw, act, par);
    rp_autoplan_options o = machines(4, 1e9, 64);
    rp_autoplan r;
    rp_error err;
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    const rp_config *c = &r.best.cfg;
    CHECK_INT(c->replication_factor, 1);
    CHECK_INT(c->layers_per_stage.count, 2);
    CHECK_INT(c->layers_per_stage.layers[0], 1);
    CHECK_INT(rp_config_stage_replicas(c, 0), 3);
    CHECK_INT(rp_config_stage_replicas(c, 1), 1);
    CHECK_INT((long long)c->micro_batch_size * c->gradient_accumulation_steps, 64);
    CHECK(r.data_parallel.found && r.best.seconds < r.data_parallel.seconds);
    CHECK(r.single.found && r.best.seconds < r.single.seconds);
    rp_profile_free(p);
}

static void too_big(void) {
    double fw[] = {1, 1}, bw[] = {2, 2}, act[] = {1000, 1000}, par[] = {6e8, 6e8};
    rp_profile *p = chain(2, fw, bw, act, par);
    rp_autoplan_options o = machines(2, 1e10, 32);
    o.memory_size = 2e9; /* parameters and gradients of one layer fit, of two do not */
    rp_autoplan r;
    rp_error err;
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    CHECK_INT(r.best.cfg.layers_per_stage.count, 2);
    CHECK(!r.single.found && !r.data_parallel.found);
    CHECK(r.best.worker_bytes <= 2e9);
    /* a memory nothing fits */
    o.memory_size = 1e9;
    CHECK(plan(p, &o, &r, &err) == RP_ERR_INFEASIBLE);
    CHECK_STR_HAS(err.msg, "no configuration of 2 workers fits");
    rp_profile_free(p);
}

/* One layer, so no pipeline; Adam keeps two floats of state per parameter:
** parameters, gradients and state take 4 x 1e9 bytes on a worker, 2.5e9
** with the state sharded over 4 and 3e9 over 2. In 3e9 bytes only sharding
** fits, and the most workers are fastest when compute dominates. */
static void sharded_state(void) {
    double fw[] = {100}, bw[] = {200}, act[] = {1000}, par[] = {1e9};
    rp_profile *p = chain(1, fw, bw, act, par);
    rp_autoplan_options o = machines(4, 1e11, 64);
    o.memory_size = 3e9;
    double batch = 16;
    rp_config base;
    rp_config_default(&base);
    base.optimizer.type = RP_OPT_ADAM;
    rp_autoplan r;
    rp_error err;
    CHECK(rp_autoplan_compute((const rp_profile *const *)&p, &batch, 1, &base, NULL, &o, &r,
                              &err) == RP_OK);
    CHECK(r.best.cfg.replicated_tensor_sharding);
    CHECK(!r.best.cfg.recompute_checkpoint_every_layer);
    CHECK_INT(r.best.cfg.replication_factor, 4);
    CHECK(r.best.worker_bytes <= 3e9);
    CHECK(!r.single.found);
    /* with plain SGD there is no state to shard, and it fits as it is */
    base.optimizer.type = RP_OPT_SGD;
    CHECK(rp_autoplan_compute((const rp_profile *const *)&p, &batch, 1, &base, NULL, &o, &r,
                              &err) == RP_OK);
    CHECK(!r.best.cfg.replicated_tensor_sharding);
    CHECK_INT(r.best.cfg.replication_factor, 4);
    rp_profile_free(p);
}

static void no_parameters(void) {
    double fw[] = {1, 2, 1, 3}, bw[] = {2, 4, 2, 6}, act[] = {1e5, 1e5, 1e5, 1e3};
    double par[] = {0, 0, 0, 0};
    rp_profile *p = chain(4, fw, bw, act, par);
    rp_autoplan_options o = machines(4, 1e9, 256);
    rp_autoplan r;
    rp_error err;
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    CHECK_INT(r.best.cfg.layers_per_stage.count, 1);
    CHECK_INT(r.best.cfg.replication_factor, 4);
    CHECK(r.best.seconds <= r.data_parallel.seconds);
    rp_profile_free(p);
}

/* Numbers that wrapped or looped: a global batch past 2^31 (micro-batch 1
** for 2^32 + 1, 0 for 2^40; 2^31 never ended), a NaN memory size and no
** accumulation; each refused, naming what is wrong, or planned right. The
** profile's micro-batches of 16 let an update take up to 65536 of them:
** 2^32 + 1 = 641 x 6700417 splits into 641, 2^40 into 65536; a prime past
** 2^31 splits into none. */
static void bad_numbers(void) {
    double fw[] = {1, 1}, bw[] = {2, 2}, act[] = {1000, 1000}, par[] = {1e6, 1e6};
    rp_profile *p = chain(2, fw, bw, act, par);
    rp_autoplan r;
    rp_error err;
    rp_autoplan_options o = machines(2, 1e10, (1LL << 32) + 1);
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    CHECK_INT(r.best.cfg.gradient_accumulation_steps, 641);
    CHECK_INT(r.best.cfg.micro_batch_size, 6700417);
    o.global_batch = 1LL << 40;
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    CHECK((long long)r.best.cfg.micro_batch_size * r.best.cfg.gradient_accumulation_steps *
              r.best.cfg.replication_factor == 1LL << 40);
    o.global_batch = 1099511627689LL; /* a prime */
    CHECK(plan(p, &o, &r, &err) == RP_ERR_INFEASIBLE);
    CHECK_STR_HAS(err.msg, "1099511627689 samples per update split over at most 2 replicas and "
                           "65536 micro-batches");
    CHECK_STR_HAS(err.msg, "micro-batches of more than 2147483647 samples");
    o.global_batch = (1LL << 40) + 1;
    CHECK(plan(p, &o, &r, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "a global batch of 1 to 1099511627776 samples, not 1099511627777");
    o.global_batch = 1LL << 31; /* planned: every micro-batch an int */
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    CHECK((long long)r.best.cfg.micro_batch_size * r.best.cfg.gradient_accumulation_steps *
              r.best.cfg.replication_factor == 1LL << 31);
    CHECK(r.best.cfg.micro_batch_size > 0);
    o = machines(2, 1e10, 64);
    o.memory_size = NAN;
    CHECK(plan(p, &o, &r, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "memory_size must be a number of bytes >= 0 (0: no limit), not nan");
    o.memory_size = 0;
    o.max_accumulation = 0;
    CHECK(plan(p, &o, &r, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "max_accumulation must be at least 1");
    rp_profile_free(p);
}

/* Two large linears split by tensor parallelism (3 and 1 of compute, 4e8
** bytes of parameters each) behind a small whole layer, on 2 workers of one
** server with a slow link: data parallelism reduces 8e8 bytes (8 s at
** 1e8 B/s), a pipeline's stages are 3 to 1, and a tensor group of 2 halves
** both layers and reduces nothing but 1000-byte activations. Without the
** layers' split the planner does not try it. */
static void tensor_groups(void) {
    double fw[] = {0.1, 30, 10}, bw[] = {0.2, 60, 20};
    double act[] = {1000, 1000, 1000}, par[] = {1000, 4e8, 4e8};
    unsigned char split[] = {RP_SIM_TP_REDUCE_GRAD, RP_SIM_TP_SPLIT,
                             RP_SIM_TP_SPLIT | RP_SIM_TP_REDUCE_OUTPUT};
    rp_profile *p = chain(3, fw, bw, act, par);
    rp_autoplan_options o = machines(2, 1e8, 64);
    rp_autoplan r;
    rp_error err;
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    CHECK(!r.tensor_parallel.found && r.best.cfg.tensor_parallel <= 1);
    double without = r.best.seconds;
    o.tensor_split = split;
    o.tensor_degrees = 1u << 2 | 1u << 4;
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    const rp_config *c = &r.best.cfg;
    CHECK(r.tensor_parallel.found);
    CHECK_INT(c->tensor_parallel, 2); /* 4 does not fit in 2 workers */
    CHECK_INT(c->layers_per_stage.count, 1);
    CHECK_INT(c->replication_factor, 1);
    CHECK(r.best.seconds < 0.8 * without);
    rp_profile_free(p);
}

/* Eight equal layers on 2 workers: two chunks a worker (the fastest of
** interleaved 1F1B, zb-v and dualpipev) shown beside the rest,
** the model cut into 4 equal chunks, faster than the fastest 1f1b pipeline
** (half its bubble), and chosen where it is the fastest; on 3 workers,
** with a pipeline worker replicated. */
static void interleaved_row(void) {
    double fw[8], bw[8], act[8], par[8];
    for (int l = 0; l < 8; l++)
        fw[l] = 1, bw[l] = 2, act[l] = 1000, par[l] = 1e6;
    rp_profile *p = chain(8, fw, bw, act, par);
    rp_autoplan_options o = machines(2, 1e9, 64);
    rp_autoplan r;
    rp_error err;
    CHECK_OK(plan(p, &o, &r, &err), err);
    const rp_config *c = &r.pipeline_interleaved.cfg;
    CHECK(r.pipeline_interleaved.found && rp_config_chunked(c) && c->virtual_stages == 2 &&
          c->layers_per_stage.count == 4);
    printf("two chunks a worker: %s, %g s\n", rp_schedule_name(c->schedule),
           r.pipeline_interleaved.seconds);
    for (int k = 0; k < 4; k++)
        CHECK_INT(c->layers_per_stage.layers[k], 2);
    CHECKF(r.pipeline_1f1b.found && r.pipeline_interleaved.seconds < r.pipeline_1f1b.seconds,
           "interleaved %g s, 1f1b %g s", r.pipeline_interleaved.seconds,
           r.pipeline_1f1b.seconds);
    /* at 64 samples zb-h2 comes within 1 % of it, on fewer workers: the plan */
    CHECK(r.best.cfg.schedule == RP_SCHEDULE_ZB_H2);
    rp_profile_free(p);
    /* the same layers with a weight gradient of 0.1 of their 2 ms (few
    ** parameters, large activations): W fills little of a zero-bubble
    ** schedule's bubble, and at 8 samples an update (GA 8 at most) the
    ** chunked schedules' halved bubble wins by more than the 1 % the
    ** simpler plans get; the engine runs them on MPI ranks too, so they are
    ** the plan */
    double wt[8];
    for (int l = 0; l < 8; l++)
        wt[l] = 0.1;
    p = chain_split(8, fw, bw, wt, act, par);
    o = machines(2, 1e8, 8);
    CHECK_OK(plan(p, &o, &r, &err), err);
    c = &r.best.cfg;
    CHECK(rp_config_chunked(c) && c->layers_per_stage.count == 4 &&
          c->gradient_accumulation_steps == 8 && r.best.seconds == r.pipeline_interleaved.seconds);
    CHECKF(r.best.seconds < 0.99 * r.pipeline_1f1b.seconds &&
               r.best.seconds < 0.99 * r.pipeline_zero_bubble.seconds &&
               r.best.seconds < 0.99 * r.data_parallel.seconds,
           "chunked %g s, 1f1b %g s, zero bubble %g s, data parallel %g s", r.best.seconds,
           r.pipeline_1f1b.seconds, r.pipeline_zero_bubble.seconds, r.data_parallel.seconds);
    rp_profile_free(p);
    /* eight layers of F 1, 2, 3, 2, 3, 1, 1, 2 ms (B twice F, W 0.1 of B)
    ** on 3 workers, 12 samples; 4 MB of parameters (a 0.1 GB/s link) on
    ** layers 3 and 7 alone. A pipeline worker of two devices takes two
    ** thirds of the time, its chunks a third each: the cut nearest 15, 22.5
    ** and 37.5 of the 45 ms gives [3, 1, 2, 2], and the two devices hold no
    ** parameters (nothing to reduce). Interleaved (GA 12, a multiple of the
    ** 2 workers) beats 1f1b on 3 stages and zero bubble by more than the 1 % */
    double f8[] = {1, 2, 3, 2, 3, 1, 1, 2}, b8[8], w8[8], a8[8];
    double p8[] = {0, 0, 0, 4e6, 0, 0, 0, 4e6};
    for (int l = 0; l < 8; l++)
        b8[l] = 2 * f8[l], w8[l] = 0.1 * b8[l], a8[l] = 1000;
    p = chain_split(8, f8, b8, w8, a8, p8);
    o = machines(3, 1e8, 12);
    CHECK_OK(plan(p, &o, &r, &err), err);
    c = &r.best.cfg;
    static const int layers[] = {3, 1, 2, 2}, reps[] = {2, 1, 2, 1};
    CHECK(c->schedule == RP_SCHEDULE_INTERLEAVED && c->layers_per_stage.count == 4 &&
          c->stage_replication_count == 4 && c->replication_factor == 1);
    for (int k = 0; k < 4 && c->layers_per_stage.count == 4; k++) {
        CHECK_INT(c->layers_per_stage.layers[k], layers[k]);
        CHECK_INT(rp_config_stage_replicas(c, k), reps[k]);
    }
    CHECKF(r.best.seconds < 0.99 * r.pipeline_1f1b.seconds &&
               r.best.seconds < 0.99 * r.pipeline_zero_bubble.seconds,
           "chunked %g s, 1f1b %g s, zero bubble %g s", r.best.seconds, r.pipeline_1f1b.seconds,
           r.pipeline_zero_bubble.seconds);
    rp_error cerr;
    CHECK_OK(rp_schedule_check_config(c, &cerr), cerr); /* the engine takes it */
    rp_profile_free(p);
}

/* DualPipe, where --schedules names it: eight equal layers of few
** parameters (10 kB: the replicas' sums cost little) on 2 workers, 16
** samples an update. Unnamed, no plan is dualpipe. Named, the two-chunks
** row is a 1f1b pipeline's 2 stages with twice the replicas at half the
** accumulation, the same 16 samples on the same 2 workers: no bubble on two
** devices (P/2 - 1 = 0), so faster than the fastest 1f1b pipeline; a worker
** holds both stages, about twice the 1f1b pipeline worker's bytes, and
** with memory for one stage and not two it is not chosen. (With 1 MB a
** layer the sum of each stage's 4 MB over the 1 GB/s link makes it slower
** than the 1f1b pipeline, which sums nothing.) */
static void dualpipe_row(void) {
    double fw[8], bw[8], wt[8], act[8], par[8];
    for (int l = 0; l < 8; l++)
        fw[l] = 1, bw[l] = 2, wt[l] = 1, act[l] = 1000, par[l] = 1e4;
    rp_profile *p = chain_split(8, fw, bw, wt, act, par);
    rp_autoplan_options o = machines(2, 1e9, 16);
    rp_autoplan r;
    rp_error err;
    CHECK_OK(plan(p, &o, &r, &err), err);
    CHECK(r.best.cfg.schedule != RP_SCHEDULE_DUALPIPE &&
          r.pipeline_interleaved.cfg.schedule != RP_SCHEDULE_DUALPIPE);
    double one_stage = r.pipeline_1f1b.worker_bytes, t1f1b = r.pipeline_1f1b.seconds;
    CHECK(r.pipeline_1f1b.found && r.pipeline_1f1b.cfg.layers_per_stage.count == 2);
    for (int s = 0; s <= RP_SCHEDULE_DUALPIPE; s++)
        o.schedules |= 1u << s;
    CHECK_OK(plan(p, &o, &r, &err), err);
    const rp_config *c = &r.pipeline_interleaved.cfg;
    CHECK(r.pipeline_interleaved.found && c->schedule == RP_SCHEDULE_DUALPIPE);
    CHECK(c->layers_per_stage.count == 2 && c->replication_factor == 2 &&
          c->gradient_accumulation_steps * c->micro_batch_size * 2 == 16);
    CHECKF(r.pipeline_interleaved.seconds < t1f1b, "dualpipe %g s, 1f1b %g s",
           r.pipeline_interleaved.seconds, t1f1b);
    double two = r.pipeline_interleaved.worker_bytes;
    CHECKF(two > 1.8 * one_stage && two < 2.2 * one_stage, "dualpipe %g bytes a worker, a 1f1b "
           "stage %g", two, one_stage);
    rp_error cerr;
    CHECK_OK(rp_schedule_check_config(c, &cerr), cerr); /* the engine takes it */
    printf("dualpipe: %g s against 1f1b's %g s, %g bytes a worker against %g\n",
           r.pipeline_interleaved.seconds, t1f1b, two, one_stage);
    o.memory_size = (one_stage + two) / 2;
    CHECK_OK(plan(p, &o, &r, &err), err);
    CHECK(r.best.cfg.schedule != RP_SCHEDULE_DUALPIPE &&
          (!r.pipeline_interleaved.found ||
           r.pipeline_interleaved.cfg.schedule != RP_SCHEDULE_DUALPIPE));
    rp_profile_free(p);
}

/* Levels of the hierarchy, innermost first: machines and bandwidths. */
static rp_autoplan_options hierarchy(int levels, const int *m, const double *bw, long long batch) {
    rp_autoplan_options o;
    rp_autoplan_options_default(&o);
    o.num_levels = levels;
    for (int l = 0; l < levels; l++)
        o.machines[l] = m[l], o.bandwidth[l] = bw[l];
    o.global_batch = batch;
    return o;
}

/* The reductions' keys, set where they pay. Four equal layers of 1 MB of
** parameters, 300 ms of compute a micro-batch of 16 each: data
** parallelism on 2 machines (a worker each) joined at 1e8 B/s computes
** 1.2 s and reduces 4 MB in 40 ms (2 ranks' ring: the bytes once over the
** link). In buckets of 1 MB (a layer each) the first three move while the
** layers below compute: about 30 ms saved; 25 MB is one bucket, after the
** backward, and saves nothing. On one machine nothing is set (nothing to
** overlap), nor with a base configuration that refuses buckets. On 3
** servers of 2 MPI ranks, the sum inside the servers first sends the
** buffer once each way over a server's link, the flat ring 5/3 of it:
** workers_per_server 2 for data parallelism; not on threads (it is a key
** of MPI's). */
static void reductions_that_pay(void) {
    double fw[] = {100, 100, 100, 100}, bw[] = {200, 200, 200, 200};
    double act[] = {1000, 1000, 1000, 1000}, par[] = {1e6, 1e6, 1e6, 1e6};
    rp_profile *p = chain(4, fw, bw, act, par);
    int two[] = {1, 2};
    double link[] = {1e10, 1e8};
    rp_autoplan_options o = hierarchy(2, two, link, 32);
    rp_autoplan r;
    rp_error err;
    CHECK_OK(plan(p, &o, &r, &err), err);
    const rp_config *c = &r.best.cfg;
    CHECK_INT(c->replication_factor, 2);
    CHECK(c->reduction_bucket_mb == 1);
    CHECK_INT(c->workers_per_server, 0);
    /* the same configuration with one reduction after the backward */
    rp_config off = *c;
    off.reduction_bucket_mb = 0;
    double fw16[4], bw16[4], out[4];
    for (int l = 0; l < 4; l++)
        fw16[l] = fw[l], bw16[l] = bw[l], out[l] = act[l];
    rp_sim_options so;
    rp_sim_options_default(&so);
    so.num_levels = 2;
    so.machines[0] = 1, so.machines[1] = 2;
    so.bandwidth[0] = 1e10, so.bandwidth[1] = 1e8;
    so.profile_batch = 16;
    rp_sim_result sr;
    CHECK_OK(rp_simulate(&off, fw16, bw16, out, par, 4, &so, &sr, &err), err);
    double saved = sr.update_time - r.best.seconds;
    CHECKF(saved > 0.025 && saved < 0.031, "buckets saved %g s (about 0.03 predicted by hand)",
           saved);
    rp_sim_result_free(&sr);
    /* one machine of 2 workers: nothing leaves it */
    int one[] = {2};
    o = hierarchy(1, one, link, 32);
    CHECK_OK(plan(p, &o, &r, &err), err);
    CHECK(r.best.cfg.reduction_bucket_mb == 0);
    /* a base configuration whose reduction the buckets do not go with */
    o = hierarchy(2, two, link, 32);
    double batch = 16;
    rp_config base;
    rp_config_default(&base);
    base.fp16_exchange = true;
    CHECK_OK(rp_autoplan_compute((const rp_profile *const *)&p, &batch, 1, &base, NULL, &o, &r,
                                 &err), err);
    CHECK(r.best.cfg.reduction_bucket_mb == 0);
    /* 3 servers x 2 ranks */
    int six[] = {2, 3};
    double slow[] = {1e10, 1e7};
    o = hierarchy(2, six, slow, 96);
    o.polling = true;
    CHECK_OK(plan(p, &o, &r, &err), err);
    CHECK_INT(r.data_parallel.cfg.replication_factor, 6);
    CHECK_INT(r.data_parallel.cfg.workers_per_server, 2);
    /* (and 3 replicas of two chunks a worker beat it: each chunk's buckets
    ** cross the slow link while the device's other chunk computes) */
    const rp_config *b = &r.best.cfg;
    CHECK(rp_config_chunked(b) && b->replication_factor == 3 && b->reduction_bucket_mb == 1 &&
          r.best.seconds < 0.99 * r.data_parallel.seconds);
    o.polling = false;
    CHECK_OK(plan(p, &o, &r, &err), err);
    CHECK_INT(r.data_parallel.cfg.workers_per_server, 0);
    rp_profile_free(p);
}


/* Devices of several kinds: six equal layers on 2 machines, the second at
** half speed. The simulator prices the slow device's passes at twice the
** time, as a profile whose layers there took twice as long; the engine
** objective gives the fast device 4 layers and the slow 2 (4 units a
** micro-batch each), and taken as equal 3 and 3, whose time on these
** devices is the equal_devices row, slower. Per-device memory: a device
** that holds one layer's parameters and gradients gets one layer. */
static void unequal_devices(void) {
    double fw[6], bw[6], act[6], par[6], fw2[6], bw2[6];
    for (int l = 0; l < 6; l++)
        fw[l] = 1, bw[l] = 2, act[l] = 1000, par[l] = 1e8, fw2[l] = l < 3 ? 1 : 2,
        bw2[l] = l < 3 ? 2 : 4;
    rp_profile *p = chain(6, fw, bw, act, par);
    double fast_slow[2] = {1, 0.5}, slow_fast[2] = {0.5, 1}, bad[2] = {1, 0};
    rp_config c = test_config("{\"micro_batch_size\": 16, \"gradient_accumulation_steps\": 8, "
                              "\"layers_per_stage\": [3, 3]}");
    rp_sim_options so;
    rp_sim_options_default(&so);
    so.num_levels = 1, so.machines[0] = 2, so.bandwidth[0] = 1e9;
    so.memory_bandwidth = 1e300; /* (no optimizer pass: the scaled profile has none to scale) */
    rp_sim_result a, b;
    rp_error err;
    so.device_speed = fast_slow;
    CHECK(rp_simulate(&c, fw, bw, act, par, 6, &so, &a, &err) == RP_OK);
    so.device_speed = NULL;
    CHECK(rp_simulate(&c, fw2, bw2, act, par, 6, &so, &b, &err) == RP_OK);
    CHECK(fabs(a.update_time - b.update_time) <= 1e-12 * b.update_time);
    rp_sim_result_free(&a), rp_sim_result_free(&b);
    so.device_speed = bad;
    CHECK(rp_simulate(&c, fw, bw, act, par, 6, &so, &a, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "device 1's speed is 0");

    rp_autoplan_options o = machines(2, 1e9, 128);
    o.pipeline_stages = 2, o.one_worker_a_stage = true;
    o.schedules = 1u << RP_SCHEDULE_1F1B;
    rp_autoplan r;
    o.device_speed = fast_slow;
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    CHECK_INT(r.best.cfg.layers_per_stage.layers[0], 4);
    CHECK(r.equal_devices.found);
    CHECK_INT(r.equal_devices.cfg.layers_per_stage.layers[0], 3);
    CHECK(r.equal_devices.seconds > 1.2 * r.best.seconds);
    o.device_speed = slow_fast;
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    CHECK_INT(r.best.cfg.layers_per_stage.layers[0], 2);
    o.device_speed = bad;
    CHECK(plan(p, &o, &r, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "device 1's speed is 0");
    /* the second device holds 2.5e8 bytes: one layer's parameters and
    ** gradients (SGD keeps no state), not two */
    double mem[2] = {1e12, 2.5e8};
    o.device_speed = NULL, o.device_memory = mem;
    CHECK(plan(p, &o, &r, &err) == RP_OK);
    CHECK_INT(r.best.cfg.layers_per_stage.layers[1], 1);
    CHECK(r.best.worker_bytes > 2.5e8); /* (the first device's stage holds more) */
    CHECK(!r.equal_devices.found); /* 2.5e8 on each: six layers do not fit two */
    rp_profile_free(p);
}

/* Recomputation by layer: two stages of a worker each, four micro-batches
** of 16 an update, so the first stage holds two in flight. Each stage's
** layers alternate a cheap layer that keeps 1e8 bytes (a dropout: its
** forward 1 ms) and one that keeps 1e6 (10 ms); the first of each four
** has parameters, so recomputing every layer keeps a stage's last output
** and makes the rest again. In 2.5e8 bytes the first stage cannot keep
** its two micro-batches' 4e8: naming its two cheap layers keeps 2e6 a
** micro-batch and makes one of them again at a time (1e8), for 2 ms more a
** micro-batch, where recomputing every layer pays all 22 ms of forward
** again; the second stage, one micro-batch in flight, fits as it is.
** Told not to recompute by layer, the planner recomputes every layer. */
static void by_layer(void) {
    double fw[8], bw[8], act[8], par[8];
    for (int l = 0; l < 8; l++) {
        bool cheap = l % 2 == 0;
        fw[l] = cheap ? 1 : 10, bw[l] = 2 * fw[l];
        act[l] = cheap ? 1e8 : 1e6, par[l] = l == 0 || l == 4 ? 1e3 : 0;
    }
    rp_profile *p = chain(8, fw, bw, act, par);
    rp_autoplan_options o = two_stages(1e10, 64);
    o.memory_size = 2.5e8;
    rp_autoplan whole, r;
    rp_error err;
    o.no_recompute_by_layer = true;
    CHECK_OK(plan(p, &o, &whole, &err), err);
    CHECK(whole.best.cfg.recompute_checkpoint_every_layer);
    CHECK_INT(whole.best.cfg.recompute_layers_count, 0);
    o.no_recompute_by_layer = false;
    CHECK_OK(plan(p, &o, &r, &err), err);
    const rp_config *c = &r.best.cfg;
    CHECK(!c->recompute_checkpoint_every_layer);
    CHECK_INT(c->layers_per_stage.layers[0], 4);
    CHECK_INT(c->recompute_layers_count, 2);
    CHECK(rp_config_recomputes_layer(c, 0) && rp_config_recomputes_layer(c, 2));
    CHECK(r.best.worker_bytes <= 2.5e8);
    /* 4 micro-batches through the first stage: 4 x 20 ms of forwards saved */
    CHECKF(r.best.seconds < whole.best.seconds - 0.06, "by layer %g s, every layer %g s",
           r.best.seconds, whole.best.seconds);
    rp_profile_free(p);
}

/* Seconds an update of cfg on the chain of machines(2, 1e9, ...), by the
** simulator as the planner calls it. */
static double simulated(const rp_config *cfg, const double *fw, const double *bw,
                        const double *act, const double *par, int n) {
    rp_sim_options so;
    rp_sim_options_default(&so);
    so.num_levels = 1, so.machines[0] = 2, so.bandwidth[0] = 1e9, so.profile_batch = 16;
    rp_sim_result res;
    rp_error err;
    CHECK_OK(rp_simulate(cfg, fw, bw, act, par, n, &so, &res, &err), err);
    double t = res.update_time;
    rp_sim_result_free(&res);
    return t;
}

/* A balanced cut where a large tensor crosses (an attention's scores) costs
** every micro-batch its transfer both ways on the way round the pipeline,
** though neither stage is busier: 4 | 4 here sends 100 MB each way a
** micro-batch at 1 GB/s, 0.2 s beside 0.24 s of passes; 5 | 3 sends 1 MB. */
static void cut_where_little_crosses(void) {
    double fw[8], bw[8], act[8], par[8];
    for (int l = 0; l < 8; l++)
        fw[l] = 10, bw[l] = 20, act[l] = l == 3 ? 1e8 : 1e6, par[l] = 1e3;
    rp_profile *p = chain(8, fw, bw, act, par);
    rp_autoplan_options o = two_stages(1e9, 64);
    rp_autoplan r;
    rp_error err;
    CHECK_OK(plan(p, &o, &r, &err), err);
    rp_config even = r.best.cfg;
    CHECK_INT(even.layers_per_stage.count, 2);
    CHECKF(even.layers_per_stage.layers[0] != 4, "cut after layer %d",
           even.layers_per_stage.layers[0]);
    even.layers_per_stage.layers[0] = even.layers_per_stage.layers[1] = 4;
    double mine = simulated(&r.best.cfg, fw, bw, act, par, 8);
    double balanced = simulated(&even, fw, bw, act, par, 8);
    CHECKF(mine < 0.8 * balanced, "the plan's cut %g s, the balanced cut %g s", mine, balanced);
    rp_profile_free(p);
}

/* Layers of one worth (a transformer's blocks repeat their operators) are
** named spread along the model, each stage its share: twenty alike layers
** in two stages of one micro-batch each, where a stage must drop four of
** every ten. Named in the model's order instead, a rung names a run of the
** first stage's layers, which is made again all at once and saves nothing,
** and none of the second's: nothing fits. */
static void alike_layers_spread(void) {
    double fw[20], bw[20], act[20], par[20];
    for (int l = 0; l < 20; l++)
        fw[l] = 1, bw[l] = 2, act[l] = 1e8, par[l] = 1e3;
    rp_profile *p = chain(20, fw, bw, act, par);
    rp_autoplan_options o = two_stages(1e10, 16);
    o.memory_size = 7.5e8;
    rp_autoplan r;
    rp_error err;
    CHECK_OK(plan(p, &o, &r, &err), err);
    const rp_config *c = &r.best.cfg;
    int first = c->layers_per_stage.layers[0], named[2] = {0, 0};
    CHECK(!c->recompute_checkpoint_every_layer);
    for (int l = 0; l < 20; l++)
        if (rp_config_recomputes_layer(c, l)) {
            named[l >= first]++;
            CHECKF(!rp_config_recomputes_layer(c, l + 1), "layers %d and %d", l, l + 1);
        }
    /* each stage keeps at most 6 x 1e8 of its own and makes one layer again */
    CHECKF(first - named[0] <= 6 && 20 - first - named[1] <= 6, "%d layers, %d named; %d, %d",
           first, named[0], 20 - first, named[1]);
    CHECK(r.best.worker_bytes <= 7.5e8);
    rp_profile_free(p);
}

/* What a profile says its layers keep (saved_bytes) is what the planner
** counts, as the simulator does, not their outputs (activation_size, what
** crosses a cut): eight layers whose outputs of 1 GB keep 1 MB each plan in
** two stages of 100 MB, nothing recomputed; by their outputs nothing fits. */
static void kept_not_outputs(void) {
    double fw[8], bw[8], act[8], par[8], saved[8];
    for (int l = 0; l < 8; l++)
        fw[l] = 1, bw[l] = 2, act[l] = 1e9, par[l] = 1e3, saved[l] = 1e6;
    rp_profile *p = chain_kept(8, fw, bw, NULL, saved, act, par);
    rp_autoplan_options o = machines(2, 1e10, 16);
    o.memory_size = 1e8;
    o.pipeline_stages = 2;
    rp_autoplan r;
    rp_error err;
    CHECK_OK(plan(p, &o, &r, &err), err);
    CHECK(!r.best.cfg.recompute_checkpoint_every_layer);
    CHECK_INT(r.best.cfg.recompute_layers_count, 0);
    CHECK(r.best.worker_bytes <= 1e8);
    rp_profile_free(p);
    p = chain(8, fw, bw, act, par);
    CHECK(plan(p, &o, &r, &err) == RP_ERR_INFEASIBLE);
    rp_profile_free(p);
}

/* A plan of one micro-batch is its round trip, once: its estimate holds
** the fill already. Eight layers profiled at 16 rows and at 32 (1.3 times
** as long, so more done a second), 32 samples an update in two stages:
** one micro-batch of 32 takes 2 x 1.3 stage times, two of 16 three stage
** times under 1F1B. With only the best estimate simulated the planner
** must still find the one of 32; its trip counted twice (3.9 against 3)
** ranks the two of 16 first. */
static void one_micro_batch_trip(void) {
    double fw[8], bw[8], act[8], par[8], fw2[8], bw2[8];
    for (int l = 0; l < 8; l++)
        fw[l] = 10, bw[l] = 20, act[l] = 1e4, par[l] = 1e3, fw2[l] = 13, bw2[l] = 26;
    const rp_profile *p[2] = {chain(8, fw, bw, act, par), chain(8, fw2, bw2, act, par)};
    double batch[2] = {16, 32};
    rp_autoplan_options o = machines(2, 1e10, 32);
    o.pipeline_stages = 2;
    o.one_worker_a_stage = true;
    o.schedules = 1u << RP_SCHEDULE_1F1B;
    o.max_accumulation = 2;
    o.candidates = 1;
    rp_config base;
    rp_config_default(&base);
    rp_autoplan r;
    rp_error err;
    CHECK_OK(rp_autoplan_compute(p, batch, 2, &base, NULL, &o, &r, &err), err);
    CHECK(r.pipeline_1f1b.found);
    CHECK_INT(r.pipeline_1f1b.cfg.micro_batch_size, 32);
    CHECK_INT(r.pipeline_1f1b.cfg.gradient_accumulation_steps, 1);
    /* 2 stage times of 4 x 39 ms, and two messages of 10 kB */
    CHECKF(r.pipeline_1f1b.seconds < 2 * 0.156 * 1.01, "%g s", r.pipeline_1f1b.seconds);
    rp_profile_free((rp_profile *)p[0]);
    rp_profile_free((rp_profile *)p[1]);
}

/* Profiles measured on a rank of a tensor group (profile_tensor): two
** layers whose 30 ms at 16 rows take 12 ms on a rank of a group of 2 (its
** all-reduces in them). 32 samples on 2 workers: data parallelism's 16 rows
** a worker take 2 x 30 ms; one group of 2, its rank's times as they are,
** 2 x 2 x 12 ms. Asked for no groups (tensor_parallel 1), data parallelism;
** the profiles of groups alone, their plan too. */
static void measured_tensor_groups(void) {
    double fw[2] = {10, 10}, bw[2] = {20, 20}, act[2] = {1e3, 1e3}, par[2] = {1e3, 1e3};
    double fw2[2] = {4, 4}, bw2[2] = {8, 8}, par2[2] = {5e2, 5e2};
    rp_profile *one = chain(2, fw, bw, act, par), *two = chain(2, fw2, bw2, act, par2);
    const rp_profile *p[2] = {one, two};
    double batch[2] = {16, 16};
    int sizes[2] = {1, 2};
    rp_autoplan_options o = machines(2, 1e10, 32);
    o.profile_tensor = sizes;
    rp_config base;
    rp_config_default(&base);
    rp_autoplan r;
    rp_error err;
    CHECK_OK(rp_autoplan_compute(p, batch, 2, &base, NULL, &o, &r, &err), err);
    CHECK_INT(rp_config_tensor_parallel(&r.best.cfg), 2);
    CHECK_INT(r.best.cfg.replication_factor, 1);
    CHECKF(fabs(r.best.seconds - 0.048) < 0.002, "%g s", r.best.seconds);
    CHECK(r.tensor_parallel.found && r.tensor_parallel.seconds == r.best.seconds);
    CHECKF(fabs(r.data_parallel.seconds - 0.060) < 0.002, "%g s", r.data_parallel.seconds);
    o.tensor_parallel = 1;
    CHECK_OK(rp_autoplan_compute(p, batch, 2, &base, NULL, &o, &r, &err), err);
    CHECK_INT(rp_config_tensor_parallel(&r.best.cfg), 1);
    CHECK(!r.tensor_parallel.found);
    o.tensor_parallel = 2;
    CHECK_OK(rp_autoplan_compute(p, batch, 2, &base, NULL, &o, &r, &err), err);
    CHECK_INT(rp_config_tensor_parallel(&r.best.cfg), 2);
    CHECK(!r.data_parallel.found);
    sizes[0] = 2; /* none measured on one worker */
    CHECK(rp_autoplan_compute(p, batch, 2, &base, NULL, &o, &r, &err) == RP_ERR_INVALID);
    rp_profile_free(one);
    rp_profile_free(two);
}

/* A profile of one sample a micro-batch, 1024 an update on a pipeline of
** two workers (a large model on a slow link: replicas would exchange 8 GB of
** gradients): the bubble shrinks with the micro-batch, so the best plan
** runs 1024 micro-batches of one, past the 64 the option holds by default,
** as the profile was measured that small. */
static void many_micro_batches(void) {
    double fw[] = {1, 1}, bw[] = {2, 2}, act[] = {1e3, 1e3}, par[] = {4e9, 4e9};
    rp_profile *p = chain(2, fw, bw, act, par);
    rp_autoplan_options o = machines(2, 1e8, 1024);
    rp_autoplan r;
    rp_error err;
    double batch = 1;
    rp_config base;
    rp_config_default(&base);
    CHECK(rp_autoplan_compute((const rp_profile *const *)&p, &batch, 1, &base, NULL, &o, &r,
                              &err) == RP_OK);
    CHECK_INT(r.best.cfg.layers_per_stage.count, 2);
    CHECK_INT(r.best.cfg.micro_batch_size, 1);
    CHECK_INT(r.best.cfg.gradient_accumulation_steps, 1024);
    /* measured on 16 samples, the profile says nothing below them: 64 at most */
    batch = 16;
    CHECK(rp_autoplan_compute((const rp_profile *const *)&p, &batch, 1, &base, NULL, &o, &r,
                              &err) == RP_OK);
    CHECK_INT(r.best.cfg.micro_batch_size, 16);
    CHECK_INT(r.best.cfg.gradient_accumulation_steps, 64);
    rp_profile_free(p);
}

/* The bounds that pass shapes and stages over leave the plans as they are:
** random chains (some layers heavy in memory, a memory limit near what the
** model holds, so that some shapes and stages fit and others not, profiles
** of 1 or 16 samples, one level or two, few candidates simulated so that
** the shapes' bound bites, with recomputation by layer and without), each
** planned with them and in full
** (rpi_plan_exhaustive), give the same best plan, the same seconds and as
** many simulations. */
static void bounds_keep_plans(void) {
    srand(11);
    int differ = 0;
    for (int c = 0; c < 60; c++) {
        int n = 4 + rand() % 21;
        double fw[24], bw[24], act[24], par[24], saved[24], held = 0;
        for (int l = 0; l < n; l++) {
            fw[l] = 1 + rand() % 9, bw[l] = fw[l] * (1 + rand() % 3);
            act[l] = 1e5 * (1 + rand() % 50), saved[l] = act[l] * (rand() % 4);
            par[l] = rand() % 3 ? 1e6 * (1 + rand() % 20) : 0;
            held += 4 * par[l] + saved[l];
        }
        rp_profile *p = chain_kept(n, fw, bw, NULL, saved, act, par);
        int workers[] = {2, 3, 4, 6, 8, 12, 16};
        long long batches[] = {16, 24, 64, 96};
        rp_autoplan_options o = machines(workers[rand() % 7], 1e9, batches[rand() % 4]);
        int W = o.machines[0];
        if (o.machines[0] % 2 == 0 && rand() % 2) { /* two levels */
            o.num_levels = 2, o.machines[1] = 2, o.machines[0] /= 2, o.bandwidth[1] = 2e8;
        }
        o.memory_size = rand() % 4 ? held / W * (0.5 + 0.25 * (rand() % 12)) : 0;
        o.candidates = 1 + rand() % 8;
        o.no_recompute_by_layer = rand() % 2; /* (then a stage's kept bytes bound it) */
        double batch = rand() % 2 ? 1 : 16;
        rp_config base;
        rp_config_default(&base);
        base.optimizer.type = RP_OPT_ADAM;
        rp_autoplan a, b;
        rp_error ea, eb;
        rp_status sa = rp_autoplan_compute((const rp_profile *const *)&p, &batch, 1, &base,
                                           NULL, &o, &a, &ea);
        rpi_plan_exhaustive = true;
        rp_status sb = rp_autoplan_compute((const rp_profile *const *)&p, &batch, 1, &base,
                                           NULL, &o, &b, &eb);
        rpi_plan_exhaustive = false;
        bool same = sa == sb && (sa != RP_OK || (a.best.found == b.best.found &&
                                                 a.best.seconds == b.best.seconds &&
                                                 a.simulated == b.simulated &&
                                                 rp_config_equal(&a.best.cfg, &b.best.cfg)));
        CHECKF(same, "chain %d (%d layers, %d workers, batch %lld): %g s, %d simulated against "
                     "%g s, %d in full", c, n, W, o.global_batch, a.best.seconds, a.simulated,
               b.best.seconds, b.simulated);
        differ += !same;
        rp_profile_free(p);
    }
    CHECK_INT(differ, 0);
}

int main(void) {
    bounds_keep_plans();
    many_micro_batches();
    measured_tensor_groups();
    one_micro_batch_trip();
    kept_not_outputs();
    alike_layers_spread();
    cut_where_little_crosses();
    by_layer();
    unequal_devices();
    reductions_that_pay();
    interleaved_row();
    dualpipe_row();
    tensor_groups();
    bad_numbers();
    dominant_layer();
    too_big();
    no_parameters();
    sharded_state();
    return test_finish("test_autoplan");
}
