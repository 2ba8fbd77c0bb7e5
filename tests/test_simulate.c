/*
** The simulator: transfers and reductions priced by the machine hierarchy
** (docs/simulate.md's formulas, worked here by hand on small cases),
** replicated stages as fast as replicated pipelines, and the seed case's
** plan on its cluster near its compute bound.
*/
#include <stdlib.h>

#include "repipe/profile.h"
#include "repipe/simulate.h"
#include "support.h"
#include "test.h"

#ifndef REPIPE_FIXTURES
#define REPIPE_FIXTURES "tests/fixtures/pipedream"
#endif

static double sim(const char *json, const double *fw, const double *bw, const double *out,
                  const double *par, int L, const rp_sim_options *o, rp_sim_result *keep) {
    rp_config c = test_config(json);
    rp_sim_result r;
    rp_error err;
    if (rp_simulate(&c, fw, bw, out, par, L, o, &r, &err) != RP_OK) {
        fprintf(stderr, "%s\n%s\n", json, err.msg);
        test_failures++;
        return -1;
    }
    double t = r.update_time;
    if (keep)
        *keep = r;
    else
        rp_sim_result_free(&r);
    return t;
}

/* Two servers of two workers: 1e10 B/s inside one, 1e9 between them; a
** latency of 1e-5 s and a step of 1e12 B/s, round numbers to work by hand. */
static rp_sim_options two_servers(void) {
    rp_sim_options o;
    rp_sim_options_default(&o);
    o.latency = 1e-5;
    o.memory_bandwidth = 1e12;
    o.num_levels = 2;
    o.machines[0] = 2, o.machines[1] = 2;
    o.bandwidth[0] = 1e10, o.bandwidth[1] = 1e9;
    return o;
}

/* A 2-stage pipeline, one micro-batch: forward 1 ms, send, forward 3 ms,
** backward 4 ms, send back, backward 2 ms. No parameters, so no reduction
** and no step. The two transfers cost latency + bytes / bandwidth of the
** level the two workers share. */
static void transfers(void) {
    double fw[] = {1, 3}, bw[] = {2, 4}, out[] = {1e6, 10}, par[] = {0, 0};
    const char *cfg = "{\"layers_per_stage\": [1, 1]}";
    rp_sim_options o;
    rp_sim_options_default(&o);
    o.latency = 1e-4;
    o.num_levels = 2;
    o.machines[0] = 2, o.machines[1] = 2;
    o.bandwidth[0] = 1e9, o.bandwidth[1] = 1e8;
    /* workers 0 and 1 share a level-1 machine: 1e6 bytes at 1e9 */
    double link = 1e-4 + 1e6 / 1e9;
    CHECK_CLOSE(sim(cfg, fw, bw, out, par, 2, &o, NULL), 10e-3 + 2 * link, 1e-12);
    /* one worker per level-1 unit: they meet at level 2, 1e6 bytes at 1e8 */
    o.machines[0] = 1;
    link = 1e-4 + 1e6 / 1e8;
    rp_sim_result r;
    CHECK_CLOSE(sim(cfg, fw, bw, out, par, 2, &o, &r), 10e-3 + 2 * link, 1e-12);
    CHECK_INT(r.num_levels, 2);
    CHECK_CLOSE(r.comm_seconds[1], 2 * link, 1e-12);
    CHECK(r.comm_seconds[0] == 0);
    CHECK_CLOSE(r.busy[0], 3e-3 / r.update_time, 1e-12);
    CHECK_CLOSE(r.busy[1], 7e-3 / r.update_time, 1e-12);
    /* idle: worker 0 waits 2 links + 7 ms, worker 1 waits 1 ms + 2 links + 2 ms */
    CHECK_CLOSE(r.bubble_fraction, (2 * link + 7e-3 + 2 * link + 3e-3) / (2 * r.update_time),
                1e-12);
    rp_sim_result_free(&r);
    /* three micro-batches under gpipe: a worker's messages leave over its one
    ** link one after another (a link is 10.1 ms, longer than any pass): the
    ** activations arrive at 1 + L, 1 + 2L, 1 + 3L; stage 1's last forward and
    ** first backward end at 8 + 3L; the gradients arrive at 8 + 4L, 8 + 5L,
    ** 8 + 6L; the last backward of stage 0 ends 2 ms later */
    CHECK_CLOSE(sim("{\"layers_per_stage\": [1, 1], \"gradient_accumulation_steps\": 3, "
                    "\"schedule\": \"gpipe\"}",
                    fw, bw, out, par, 2, &o, NULL),
                10e-3 + 6 * link, 1e-12);
    /* a profile measured on 4 rows, run on micro-batches of 2: half of everything */
    o.profile_batch = 4;
    link = 1e-4 + 0.5e6 / 1e8;
    CHECK_CLOSE(sim("{\"layers_per_stage\": [1, 1], \"micro_batch_size\": 2}", fw, bw, out, par,
                    2, &o, NULL),
                5e-3 + 2 * link, 1e-12);
    /* too few machines for the workers: refused, with both numbers */
    o.machines[1] = 1;
    rp_config c = test_config("{\"layers_per_stage\": [1, 1], \"replication_factor\": 2}");
    rp_sim_result bad;
    rp_error err;
    CHECK(rp_simulate(&c, fw, bw, out, par, 2, &o, &bad, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "needs 4 workers but the machines hold 1");
}

/* A graph's cut carries every tensor alive there: with cut_bytes the link
** moves 3e6 bytes where layer 0's output is 1e6 (a skip crossing beside
** it), both ways. */
static void graph_cuts(void) {
    double fw[] = {1, 3}, bw[] = {2, 4}, out[] = {1e6, 10}, par[] = {0, 0}, cut[] = {0, 3e6, 0};
    rp_sim_options o;
    rp_sim_options_default(&o);
    o.latency = 1e-4;
    o.num_levels = 1;
    o.machines[0] = 2;
    o.bandwidth[0] = 1e9;
    const char *cfg = "{\"layers_per_stage\": [1, 1]}";
    CHECK_CLOSE(sim(cfg, fw, bw, out, par, 2, &o, NULL), 10e-3 + 2 * (1e-4 + 1e6 / 1e9), 1e-12);
    o.cut_bytes = cut;
    CHECK_CLOSE(sim(cfg, fw, bw, out, par, 2, &o, NULL), 10e-3 + 2 * (1e-4 + 3e6 / 1e9), 1e-12);
}

/* Data parallelism over 2 machines of 2: after the compute, a ring
** allreduce of the parameters over the slower level, 2 (n - 1) steps of
** latency and 2 (n - 1) / n of the bytes; a tree when that is cheaper. */
static void reductions(void) {
    double fw[] = {1}, bw[] = {2}, out[] = {10}, par[] = {4e8};
    rp_sim_options o = two_servers();
    const char *cfg = "{\"replication_factor\": 4}";
    double ring = 6 * 1e-5 + 1.5 * 4e8 / 1e9, step = 4e8 / 1e12;
    rp_sim_result r;
    CHECK_CLOSE(sim(cfg, fw, bw, out, par, 1, &o, &r), 3e-3 + ring + step, 1e-12);
    CHECK_CLOSE(r.comm_seconds[1], ring, 1e-12); /* one allreduce, counted once */
    CHECK(r.comm_seconds[0] == 0);
    rp_sim_result_free(&r);
    /* two replicas on one machine: the faster level */
    ring = 2 * 1e-5 + 1.0 * 4e8 / 1e10;
    CHECK_CLOSE(sim("{\"replication_factor\": 2}", fw, bw, out, par, 1, &o, NULL),
                3e-3 + ring + step, 1e-12);
    /* the two on machines of their own but sharing one core (namespaces on
    ** one machine): the compute and the step at half speed, while the
    ** network moves the allreduce's bytes at the level's full rate */
    o.machines[0] = 1;
    o.cores = 1;
    ring = 2 * 1e-5 + 1.0 * 4e8 / 1e9;
    CHECK_CLOSE(sim("{\"replication_factor\": 2}", fw, bw, out, par, 1, &o, NULL),
                2 * 3e-3 + ring + 2 * step, 1e-12);
    o.cores = 0;
    /* servers of 2 (workers_per_server): each member sends and receives its
    ** 2e8-byte chunk inside its server twice (1e-5 + 2e8 / 1e10 each), the
    ** whole 4e8 crosses between the servers once (4e8 / 1e9) with the totals a
    ** piece behind (16384 floats for each of the 2 owners), 2 latencies */
    double servers = 2 * (1e-5 + 2e8 / 1e10) + 2 * 1e-5 + 4e8 / 1e9 + 16384.0 * 4 * 2 / 1e9;
    rp_sim_options o2 = two_servers();
    CHECK_CLOSE(sim("{\"replication_factor\": 4, \"workers_per_server\": 2}", fw, bw, out, par,
                    1, &o2, NULL),
                3e-3 + servers + step, 1e-12);
    /* servers that are not the hierarchy's (one member each): the flat ring */
    CHECK_CLOSE(sim("{\"replication_factor\": 4, \"workers_per_server\": 1}", fw, bw, out, par,
                    1, &o2, NULL),
                3e-3 + 6 * 1e-5 + 1.5 * 4e8 / 1e9 + step, 1e-12);
    /* a small tensor among many: the tree's 2 log2 n steps beat the ring's 2 (n - 1) */
    double tiny[] = {40};
    o.machines[0] = 16, o.machines[1] = 1;
    double tree = 2 * 4 * (1e-5 + 40 / 1e10);
    CHECK_CLOSE(sim("{\"replication_factor\": 16}", fw, bw, out, tiny, 1, &o, NULL),
                3e-3 + tree + 40 / 1e12, 1e-12);
}

/* Buckets (reduction_bucket_mb 1.5) on two replicas a server apart: forward
** 3 ms; the backward runs layer 2 (5 ms, 2 MB), layer 1 (3 ms, none), layer
** 0 (2 ms, 1 MB). Layer 2's 2 MB are ready at 8 ms and go as pieces of 1.5
** and 0.5 MB, each a ring of two (2 latencies + its bytes at 1e9 B/s): over
** at 9.52 and 10.04 ms; layer 0's 1 MB is ready at 13 ms, over at 14.02;
** then the step. One reduction after the backward ends at 16.02 ms. On one
** machine nothing overlaps (the local backend sums each bucket where it is
** announced). */
static void buckets(void) {
    double fw[] = {1, 1, 1}, bw[] = {2, 3, 5}, out[] = {10, 10, 10}, par[] = {1e6, 0, 2e6};
    rp_sim_options o = two_servers();
    o.machines[0] = 1;
    double step = 3e6 / 1e12;
    CHECK_CLOSE(sim("{\"replication_factor\": 2, \"reduction_bucket_mb\": 1.5}", fw, bw, out,
                    par, 3, &o, NULL),
                14.02e-3 + step, 1e-12);
    CHECK_CLOSE(sim("{\"replication_factor\": 2}", fw, bw, out, par, 3, &o, NULL),
                16.02e-3 + step, 1e-12);
    /* buckets of 4 MB: one, started when layer 0 is done, as without */
    CHECK_CLOSE(sim("{\"replication_factor\": 2, \"reduction_bucket_mb\": 4}", fw, bw, out,
                    par, 3, &o, NULL),
                16.02e-3 + step, 1e-12);
    rp_sim_options one;
    rp_sim_options_default(&one);
    CHECK_CLOSE(sim("{\"replication_factor\": 2, \"reduction_bucket_mb\": 1.5}", fw, bw, out,
                    par, 3, &one, NULL),
                sim("{\"replication_factor\": 2}", fw, bw, out, par, 3, &one, NULL), 1e-15);
}

/* Gradient clipping (and loss scaling) sum a norm over every worker after
** the reductions: no stage steps before every stage has reduced. Two
** stages, F 1 and B 2 ms each, stage 1 a 3 ms step (3e9 bytes at 1e12 B/s),
** stage 0 none, two updates a call, copies free. Without the norm stage 1
** steps at 4-7 and 10-13 ms (the call ends at 13); with it at 6-9, so its
** second forward waits until 9, its backward ends at 12, stage 0's at 14,
** and its step runs 14-17: 6.5 and 8.5 ms an update. */
static void norm_sync(void) {
    double fw[] = {1, 1}, bw[] = {2, 2}, out[] = {0, 0}, par[] = {0, 3e9};
    rp_sim_options o;
    rp_sim_options_default(&o);
    o.latency = 0;
    o.memory_bandwidth = 1e12;
    const char *plain = "{\"layers_per_stage\": [1, 1], \"device_iterations\": 2}";
    const char *clip = "{\"layers_per_stage\": [1, 1], \"device_iterations\": 2, "
                       "\"gradient_clipping\": 1}";
    const char *als = "{\"layers_per_stage\": [1, 1], \"device_iterations\": 2, "
                      "\"auto_loss_scaling\": true}";
    CHECK_CLOSE(sim(plain, fw, bw, out, par, 2, &o, NULL), 6.5e-3, 1e-12);
    CHECK_CLOSE(sim(clip, fw, bw, out, par, 2, &o, NULL), 8.5e-3, 1e-12);
    CHECK_CLOSE(sim(als, fw, bw, out, par, 2, &o, NULL), 8.5e-3, 1e-12);
    /* A reduction its buckets hid ends as it starts, and its stage still
    ** waits for the norm and steps. R = 2, a replica a server (1e9 B/s
    ** between), no latency, free messages, steps at 1e9 B/s. Stage 0: layer
    ** 0 (F 1, B 1 ms, 1 MB); stage 1: layers 1 (F 1, B 5, nothing) and 2
    ** (F 1, B 1, 2 MB). Stage 0 forwards 0-1, stage 1 1-3 and backwards 3-9,
    ** its two 1 MB buckets crossing 4-6 under layer 1's backward: nothing
    ** left at its reduction. Stage 0 backwards 9-10, its bucket crosses
    ** 10-11; the norm at 11, the steps 1 and 2 ms: 13 ms. */
    double fw3[] = {1, 1, 1}, bw3[] = {1, 5, 1}, out3[] = {0, 0, 0}, par3[] = {1e6, 0, 2e6};
    rp_sim_options t = two_servers();
    t.latency = 0, t.memory_bandwidth = 1e9;
    CHECK_CLOSE(sim("{\"layers_per_stage\": [1, 2], \"replication_factor\": 2, "
                    "\"reduction_bucket_mb\": 1, \"gradient_clipping\": 1}",
                    fw3, bw3, out3, par3, 3, &t, NULL),
                13e-3, 1e-12);
}

/* Reductions that cross one link at the same time share it. R = 2 x 2
** stages, one replica a server: both stages' allreduces (1e8 bytes, 1 s
** each alone at 1e8 B/s) cross the link between the two servers from t = 0
** (no compute), so each moves at half the rate and both end at 2 s. With a
** server for each worker, each stage's pair has links of its own: 1 s. */
static void shared_links(void) {
    double fw[] = {0, 0}, bw[] = {0, 0}, out[] = {0, 0}, par[] = {1e8, 1e8};
    rp_sim_options o;
    rp_sim_options_default(&o);
    o.latency = 0;
    o.memory_bandwidth = 1e15;
    o.num_levels = 2;
    o.machines[0] = 2, o.machines[1] = 2;
    o.bandwidth[0] = 1e10, o.bandwidth[1] = 1e8;
    const char *cfg = "{\"replication_factor\": 2, \"layers_per_stage\": [1, 1]}";
    double step = 1e8 / 1e15;
    CHECK_CLOSE(sim(cfg, fw, bw, out, par, 2, &o, NULL), 2.0 + step, 1e-9);
    o.machines[0] = 1, o.machines[1] = 4;
    CHECK_CLOSE(sim(cfg, fw, bw, out, par, 2, &o, NULL), 1.0 + step, 1e-9);
}

/* A replicated stage fed round-robin is r pipelines in all but the
** reduction: R = 1 x [2, 2] at GA 8 runs like R = 2 x [1, 1] at GA 4, and
** 1F1B is no slower than GPipe with it. Before stage replicas kept their own
** micro-batches in flight, [2, 2] under 1F1B took 1.6 times as long. */
static void replication(void) {
    double fw[] = {2, 1, 2}, bw[] = {4, 2, 3}, out[] = {2e5, 1e5, 40}, par[] = {1e5, 0, 4e4};
    rp_sim_options o;
    rp_sim_options_default(&o);
    const char *fmt = "{\"micro_batch_size\": 8, \"replication_factor\": %d, \"layers_per_stage\": "
                      "[1, 2], \"stage_replication\": [%d, %d], \"gradient_accumulation_steps\": "
                      "%d, \"schedule\": \"%s\"}";
    char a[512], b[512], g[512];
    snprintf(a, sizeof a, fmt, 1, 2, 2, 8, "1f1b");
    snprintf(b, sizeof b, fmt, 2, 1, 1, 4, "1f1b");
    snprintf(g, sizeof g, fmt, 1, 2, 2, 8, "gpipe");
    double ta = sim(a, fw, bw, out, par, 3, &o, NULL), tb = sim(b, fw, bw, out, par, 3, &o, NULL);
    double tg = sim(g, fw, bw, out, par, 3, &o, NULL);
    CHECKF(fabs(ta - tb) <= 0.05 * tb, "[2,2] GA 8: %.4f ms, 2 x [1,1] GA 4: %.4f ms", ta * 1e3,
           tb * 1e3);
    CHECKF(ta <= 1.05 * tg, "[2,2] 1f1b: %.4f ms, gpipe: %.4f ms", ta * 1e3, tg * 1e3);
}

/* The seed case: VGG-16's PipeDream profile on 2 servers of 8 at 4.29 and
** 2.15 GB/s, layers [24, 16] on [7, 1] workers, R = 2, micro-batches of
** 64 (the profile's), GA 28. Its compute bound is R B min_s r_s / (f_s +
** b_s): stage 0's 7 workers finish 7 micro-batches per 0.62212 s. */
static void seed(void) {
    rp_profile *p;
    rp_error err;
    int L;
    double *fw, *bw, *out, *par;
    if (rp_profile_read(&p, REPIPE_FIXTURES "/profiles/vgg16/graph.txt", &err) ||
        rp_profile_layers(p, &fw, &bw, &out, &par, NULL, &L, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        test_failures++;
        return;
    }
    double stage0 = 0;
    for (int l = 0; l < 24; l++)
        stage0 += (fw[l] + bw[l]) * 1e-3;
    CHECK_CLOSE(stage0, 0.62212, 1e-9); /* PipeDream's stage time for the seed plan */
    double bound = 2 * 64 * 7 / stage0;
    rp_sim_options o;
    rp_sim_options_default(&o);
    o.num_levels = 2;
    o.machines[0] = 8, o.machines[1] = 2;
    o.bandwidth[0] = 4294967296.0, o.bandwidth[1] = 2147483648.0;
    const char *cfg = "{\"micro_batch_size\": 64, \"replication_factor\": 2, "
                      "\"gradient_accumulation_steps\": 28, \"layers_per_stage\": [24, 16], "
                      "\"stage_replication\": [7, 1]}";
    rp_sim_result r;
    double t = sim(cfg, fw, bw, out, par, L, &o, &r);
    double rate = 2 * 64 * 28 / t;
    CHECKF(rate >= 0.85 * bound, "seed plan: %.0f samples/s, bound %.0f", rate, bound);
    for (int w = 0; t > 0 && w < r.workers; w++)
        CHECK_INT(r.in_flight[w], r.stage_of[w] == 0 ? 2 : 1);
    /* the JSON carries the numbers */
    rp_config c = test_config(cfg);
    char *json;
    CHECK(rp_sim_to_json(&r, &c, &json, &err) == RP_OK);
    CHECK_STR_HAS(json, "\"seconds_per_update\"");
    CHECK_STR_HAS(json, "\"communication_by_level\"");
    CHECK_STR_HAS(json, "\"in_flight\":\t2");
    free(json);
    rp_sim_result_free(&r);
    free(fw), free(bw), free(out), free(par);
    rp_profile_free(p);
}

/* Tensor parallelism, worked by hand: three layers, a split one (forward
** 4 ms, backward 8 ms, 4e6 bytes of parameters) whose group all-reduces its
** output (8e5 bytes) in forward, then a whole one (1 ms, 2 ms) whose
** output's gradient (8e5 bytes) the group sums in backward, then a whole
** one without parameters. At t = 2 on one machine of two levels: the split
** layer takes half its times, each all-reduce a ring of two over the inner
** level, the step half the split parameters and the whole ones. */
static void tensor_groups(void) {
    double fw[] = {4, 1, 0}, bw[] = {8, 2, 0}, out[] = {8e5, 8e5, 8e5}, par[] = {4e6, 2e6, 0};
    unsigned char split[] = {RP_SIM_TP_SPLIT | RP_SIM_TP_REDUCE_OUTPUT, RP_SIM_TP_REDUCE_GRAD, 0};
    rp_sim_options o = two_servers();
    o.tensor_split = split;
    double sum = 2 * 1e-5 + 1.0 * 8e5 / 1e10;
    double want = (2e-3 + 1e-3 + sum) + (4e-3 + 2e-3 + sum) + (2e6 + 2e6) / 1e12;
    CHECK_CLOSE(sim("{\"tensor_parallel\": 2}", fw, bw, out, par, 3, &o, NULL), want, 1e-12);
    /* two replicas of the group, one a server: each rank's parameters (the
    ** split ones' half and the whole ones) reduced with its peer over the
    ** outer level, the two ranks' rings at once on the one link, at half
    ** its rate each */
    double ring = 2 * 1e-5 + 1.0 * 4e6 / 1e9;
    CHECK_CLOSE(sim("{\"tensor_parallel\": 2, \"replication_factor\": 2}", fw, bw, out, par, 3,
                    &o, NULL), want + 2 * ring, 1e-12);
    /* without the layers' split it is refused */
    o.tensor_split = NULL;
    rp_config c = test_config("{\"tensor_parallel\": 2}");
    rp_sim_result r;
    rp_error err;
    CHECK(rp_simulate(&c, fw, bw, out, par, 3, &o, &r, &err) == RP_ERR_INVALID);
    CHECK_STR_HAS(err.msg, "tensor_parallel 2 needs the layers' split");
}

int main(void) {
    norm_sync();
    tensor_groups();
    graph_cuts();
    transfers();
    reductions();
    buckets();
    replication();
    shared_links();
    seed();
    return test_finish("test_simulate");
}
