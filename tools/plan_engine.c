/*
** repipe plan's engine objective and --schedule (plan_engine.h).
*/
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan_engine.h"
#include "plan_print.h"

/* Whether hay holds needle (lower case), letters of either case alike. */
static bool holds_nocase(const char *hay, const char *needle) {
    for (; *hay; hay++) {
        size_t i = 0;
        while (needle[i] && hay[i] && tolower((unsigned char)hay[i]) == needle[i])
            i++;
        if (!needle[i])
            return true;
    }
    return false;
}

bool plan_write_text(const cli_cmd *cmd, const char *path, const char *text) {
    if (strcmp(path, "-") == 0) {
        fputs(text, stdout);
        return true;
    }
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        cli_error(cmd, "%s: cannot write", path);
        return false;
    }
    return true;
}


/* The plan run by repipe's engine: its time per update with the flush of
** the schedule (the bubble) and each stage's memory, written to out. */
int plan_engine_mode(const cli_cmd *cmd, const rp_plan *plan, const rp_profile *prof,
                       const char *base_config, const char *schedule, int M, double device_memory,
                       FILE *out) {
    rp_config cfg;
    rp_error err;
    rp_config_default(&cfg);
    if (base_config && rp_config_load_file(&cfg, base_config, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    cfg.gradient_accumulation_steps = M;
    cfg.schedule = strcmp(schedule, "gpipe") == 0 ? RP_SCHEDULE_GPIPE : RP_SCHEDULE_1F1B;
    if (device_memory == 0 && cfg.device_memory > 0) /* the base configuration's budget */
        device_memory = (double)cfg.device_memory;
    double *fw = NULL, *bw = NULL, *ob = NULL, *pb = NULL;
    int L = 0, rc = 1;
    rp_sim_result res = {0};
    /* the profile's times are per micro-batch as profiled: no rescaling;
    ** the workers sit on the plan's machines */
    rp_sim_options opt;
    rp_sim_options_default(&opt);
    opt.num_levels = plan->options.num_levels;
    memcpy(opt.machines, plan->options.machines, sizeof(int) * opt.num_levels);
    memcpy(opt.bandwidth, plan->options.bandwidth, sizeof(double) * opt.num_levels);
    /* and what each layer keeps, where the profile says */
    int *node = NULL;
    double *mem[5] = {0};
    rp_status st = rp_plan_to_config(plan, prof, &cfg, NULL, 0, &err);
    if (!st)
        st = rp_profile_layers(prof, &fw, &bw, &ob, &pb, &node, &L, &err);
    if (!st)
        st = rp_profile_memory(prof, node, L, mem, &err);
    rp_sim_options_memory(&opt, mem);
    if (st || rp_simulate(&cfg, fw, bw, ob, pb, L, &opt, &res, &err)) {
        cli_error(cmd, "%s", err.msg);
        goto done;
    }
    rp_derived d;
    rp_config_derive(&cfg, &d);
    fprintf(out, "\nrepipe's engine, %s with %d micro-batches per replica and update (micro-batches as "
           "profiled):\n",
           schedule, M);
    fprintf(out, "  predicted %.6f s per update, %.6f s per micro-batch (flush included; %.2fx the "
           "plan's steady-state time)\n",
           res.update_time, res.update_time / M,
           res.update_time / M / plan->pipeline_time);
    rc = 0;
    for (int s = 0; s < res.stages; s++) {
        bool over = device_memory > 0 && res.stage_bytes[s] > device_memory;
        fprintf(out, "  stage %d: a worker holds %.1f MB (parameters, gradients, activations in "
               "flight)%s\n",
               s, res.stage_bytes[s] / 1e6, over ? "  > device memory" : "");
        if (over)
            rc = 1;
    }
    if (rc)
        cli_error(cmd, "the plan needs more than --device-memory %.0f bytes on a worker; try "
                       "more machines, --memory-constraint, or fewer micro-batches with 1f1b",
                  device_memory);
done:
    rp_sim_result_free(&res);
    free(fw), free(bw), free(ob), free(pb), free(node);
    for (int k = 0; k < 5; k++)
        free(mem[k]);
    return rc;
}

/* Prints one configuration's row of the comparison; false for a kind with no
** configuration (the legend under the table says why there can be none). */
static bool print_row(const char *what, const rp_autoplan_entry *e) {
    if (!e->found) {
        printf("  %-34s %s\n", what, "none (below)");
        return false;
    }
    rp_derived d;
    rp_config_derive(&e->cfg, &d);
    printf("  %-34s %7d %7d %9d %5d %-16s %11.4f s %11.0f", what,
           rp_config_devices(&e->cfg, &d), d.stages,
           e->cfg.micro_batch_size, e->cfg.gradient_accumulation_steps,
           rp_schedule_name(e->cfg.schedule), e->seconds, d.samples_per_update / e->seconds);
    if (e->cfg.tensor_parallel > 1) /* the third axis: workers = replicas x stages' x t */
        printf("  tensor groups of %d", e->cfg.tensor_parallel);
    if (e->cfg.workers_per_server > 0)
        printf("  summed per server of %d", e->cfg.workers_per_server);
    if (e->cfg.reduction_bucket_mb > 0)
        printf("  reduced in %g MB buckets", e->cfg.reduction_bucket_mb);
    printf("\n");
    return true;
}

/* The keys a plan sets, in words: what --config-out writes. */
static void print_keys(const rp_config *c) {
    printf("  replication_factor %d, micro_batch_size %d, gradient_accumulation_steps %d, "
           "schedule %s, layers_per_stage [",
           c->replication_factor, c->micro_batch_size, c->gradient_accumulation_steps,
           rp_schedule_name(c->schedule));
    for (int s = 0; s < c->layers_per_stage.count; s++)
        printf("%s%d", s ? ", " : "", c->layers_per_stage.layers[s]);
    printf("], stage_replication [");
    for (int s = 0; s < c->layers_per_stage.count; s++)
        printf("%s%d", s ? ", " : "", rp_config_stage_replicas(c, s));
    printf("], recompute_checkpoint_every_layer %s, replicated_tensor_sharding %s",
           c->recompute_checkpoint_every_layer ? "true" : "false",
           c->replicated_tensor_sharding ? "true" : "false");
    if (c->recompute_layers_count) /* (the list itself: --config-out) */
        printf(", recompute_layers: %d layers", c->recompute_layers_count);
    if (c->tensor_parallel > 1)
        printf(", tensor_parallel %d", c->tensor_parallel);
    if (c->workers_per_server > 0)
        printf(", workers_per_server %d", c->workers_per_server);
    if (c->reduction_bucket_mb > 0)
        printf(", reduction_bucket_mb %g", c->reduction_bucket_mb);
    if (rp_config_chunked(c))
        printf(", virtual_stages %d", c->virtual_stages);
    if (c->schedule == RP_SCHEDULE_ZB_AUTO)
        printf(", zb_pass_times [%.4g, %.4g, %.4g], zb_max_in_flight %d", c->zb_pass_times[0],
               c->zb_pass_times[1], c->zb_pass_times[2], c->zb_max_in_flight);
    printf("\n");
}

/* The mpirun line that puts the configuration's workers where the plan
** placed them: worker (rank) w on the machine w / M1 of the innermost level
** M1, which is where Open MPI's ppr mapping puts it when the hostfile lists
** the outer machines in order (docs/cluster.md). */
void plan_print_launch(const rp_config *c, const rp_plan_options *o, const char *config) {
    rp_derived d;
    rp_config_derive(c, &d);
    int ranks = rp_config_devices(c, &d); /* a rank holds a device's chunks */
    printf("\nlaunch it on MPI ranks (docs/cluster.md):\n  mpirun -np %d", ranks);
    if (o->num_levels > 1)
        printf(" --hostfile HOSTS --map-by ppr:%d:node", o->machines[0]);
    printf(" --bind-to core repipe train --model MODEL --config %s --backend mpi\n", config);
    if (o->num_levels > 1) {
        int hosts = (ranks + o->machines[0] - 1) / o->machines[0];
        printf("  HOSTS: the %d server%s in order, %d slots each; the same paths on each\n", hosts,
               hosts == 1 ? "" : "s", o->machines[0]);
    }
    /* the same ranks under torchrun: a server a node, the innermost level's
    ** machines its processes (rt.Pipeline numbers them as the engine does) */
    int nodes = o->num_levels > 1 ? (ranks + o->machines[0] - 1) / o->machines[0] : 1;
    int per = nodes > 1 ? o->machines[0] : ranks;
    if (c->recompute_layers_count || rp_config_tensor_parallel(c) > 1) {
        printf("(not with PyTorch's rt.Pipeline: it runs neither recompute_layers nor "
               "tensor_parallel)\n");
        return;
    }
    printf("or with PyTorch (docs/python.md): rt.Pipeline(module, \"%s\", ...) in your "
           "script, over the module the profile came from, then\n  torchrun", config);
    if (nodes > 1)
        printf(" --nnodes %d --node-rank N --master-addr HOST0", nodes);
    printf(" --nproc-per-node %d YOUR_SCRIPT.py\n", per);
}

/* The engine objective's options from the command's and the base
** configuration; -1 to go on, else the exit code. */
static int engine_options(const cli_cmd *cmd, const plan_engine *x, rp_config *base,
                          rp_autoplan_options *ao, long long *profile_batch) {
    const rp_plan_options *o = x->o;
    const rp_profile *prof = x->prof;
    rp_error err;
    rp_config_default(base);
    if (x->base_config && rp_config_load_file(base, x->base_config, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    rp_autoplan_options_default(ao);
    ao->num_levels = o->num_levels;
    memcpy(ao->machines, o->machines, sizeof o->machines);
    memcpy(ao->bandwidth, o->bandwidth, sizeof o->bandwidth);
    long long pb = x->profile_batch ? x->profile_batch : rp_profile_micro_batch(prof);
    if (!pb && x->base_config)
        pb = base->micro_batch_size;
    if (!pb) {
        cli_error(cmd, "the engine objective needs --profile-batch B, the micro-batch the profile "
                       "was measured on (profiles of 'repipe profile' say it), or a --base-config");
        return 2;
    }
    *profile_batch = pb;
    rp_derived d;
    rp_config_derive(base, &d);
    ao->global_batch = x->global_batch  ? x->global_batch
                       : x->base_config ? d.samples_per_update
                                        : pb * x->plan->machines_available;
    ao->memory_size = x->memory > 0 ? x->memory : (double)base->device_memory;
    ao->cores = x->cores;
    ao->latency = x->latency;
    ao->polling = x->polling;
    ao->min_micro_batch = (int)x->min_micro;
    ao->pipeline_stages = x->pp;
    ao->tensor_parallel = x->tp;
    ao->one_worker_a_stage = o->straight; /* replicas of whole pipelines only */
    ao->no_sharding = x->no_sharding;
    ao->no_recompute_by_layer = x->whole_recompute;
    ao->micro_batch = x->micro_batch;
    ao->schedules = x->schedules;
    ao->device_speed = x->speed;
    ao->device_memory = x->device_memory;
    /* batch normalisation of a micro-batch of one sample has nothing to
    ** normalise by where a plane is one value (train refuses it): a profile
    ** that names one plans micro-batches of 2 or more */
    for (int i = 0; i < prof->num_nodes && ao->min_micro_batch < 2; i++)
        if (prof->nodes[i].desc && holds_nocase(prof->nodes[i].desc, "batchnorm")) {
            ao->min_micro_batch = 2;
            printf("%s (line %d of the profile) normalises by a micro-batch's statistics: "
                   "micro-batches of 2 or more (--min-micro-batch)\n",
                   prof->nodes[i].id, prof->nodes[i].line);
        }
    return -1;
}

/* --tensor-split: the profile's layers a tensor group may split; false
** (said) when it fails. */
static bool tensor_split(const cli_cmd *cmd, const plan_engine *x, rp_autoplan_options *ao,
                         unsigned char **split) {
    double *fw, *bw, *ob, *pb;
    int *node, L;
    rp_error err;
    if (rp_profile_layers(x->prof, &fw, &bw, &ob, &pb, &node, &L, &err)) {
        cli_error(cmd, "%s", err.msg);
        return false;
    }
    free(fw), free(bw), free(ob), free(pb), free(node);
    if (!cli_tensor_split(cmd, x->split_model, L, 0, RP_TP_VOCAB, split, &ao->tensor_degrees))
        return false;
    ao->tensor_split = *split;
    return true;
}

/* The profiles of the same model at other micro-batches, after the first;
** *np counts those read (the caller frees them); false (said) on failure. */
static bool read_more(const cli_cmd *cmd, const plan_engine *x, const rp_profile **profs,
                      double *batches, int *np) {
    rp_error err;
    for (int k = 0; k < x->num_more; k++) {
        rp_profile *q;
        if (rp_profile_read(&q, x->more[k], &err)) {
            cli_error(cmd, "%s", err.msg);
            return false;
        }
        profs[(*np)++] = q;
        if (!(batches[*np - 1] = rp_profile_micro_batch(q))) {
            cli_error(cmd, "%s: the profile does not say its micro-batch (write it with "
                           "'repipe profile')", x->more[k]);
            return false;
        }
    }
    return true;
}

/* The tensor group each profile was measured on a rank of (its Input's
** tensor_parallel=), into sizes and ao where one says more than 1; false (said) where
** one says what is not a size, or the first (PipeDream's plan's) is not
** one worker's. */
static bool tensor_sizes(const cli_cmd *cmd, const plan_engine *x, const rp_profile **profs,
                         int np, int *sizes, rp_autoplan_options *ao) {
    bool any = false;
    for (int k = 0; k < np; k++) {
        const char *path = k ? x->more[k - 1] : "the first profile";
        if (!(sizes[k] = rp_profile_tensor_parallel(profs[k]))) {
            cli_error(cmd, "%s: tensor_parallel= in its Input's description must be a tensor "
                           "group's size, 1 to 64", path);
            return false;
        }
        any = any || sizes[k] > 1;
    }
    if (sizes[0] != 1) {
        cli_error(cmd, "the first --profile must be measured on one worker (tensor_parallel=1): "
                       "PipeDream's plan is made from it");
        return false;
    }
    bool given = x->tp <= 1 || x->split_model;
    for (int k = 0; k < np; k++)
        given = given || sizes[k] == x->tp;
    if (!given) {
        cli_error(cmd, "--tp %d: give the profiles measured on a rank of a tensor group of %d "
                       "(tensor_parallel=%d in their Input's description) or --tensor-split MODEL",
                  x->tp, x->tp, x->tp);
        return false;
    }
    ao->profile_tensor = any ? sizes : NULL;
    return true;
}

/* The table of what was simulated: a row a kind of configuration. */
static void print_rows(const rp_autoplan *r, const rp_autoplan_options *ao,
                       const double *batches, int np, bool split, bool devices) {
    printf("\nrepipe's engine, %lld samples per update (micro-batches as profiled: ",
           ao->global_batch);
    for (int k = 0; k < np; k++)
        printf("%s%.0f", k ? ", " : "", batches[k]);
    printf("), %d configurations simulated:\n", r->simulated);
    printf("  %-34s %7s %7s %9s %5s %-16s %13s %11s\n", "", "workers", "stages", "micro-b", "GA",
           "schedule", "per update", "samples/s");
    bool all = print_row("one worker", &r->single);
    all &= print_row("data parallel", &r->data_parallel);
    all &= print_row("PipeDream's plan, synchronous", &r->pipedream);
    all &= print_row("fastest pipeline under 1f1b", &r->pipeline_1f1b);
    all &= print_row("fastest pipeline, zero bubble", &r->pipeline_zero_bubble);
    all &= print_row("two chunks a worker", &r->pipeline_interleaved);
    if (split)
        all &= print_row("fastest with tensor groups", &r->tensor_parallel);
    all &= print_row("fastest for the engine", &r->best);
    if (devices) /* devices of several kinds */
        print_row("planned as if all were alike", &r->equal_devices);
    if (all)
        return;
    printf("  none: no configuration of that kind runs here: each needs the workers and "
           "stages of its kind, and its replicas' micro-batches must split %lld samples an "
           "update evenly (", ao->global_batch);
    if (ao->micro_batch > 0) /* (the accumulation is what the micro-batch makes) */
        printf("micro-batches of %d samples exactly", ao->micro_batch);
    else
        printf("1 to %d micro-batches a replica, or as many as leave micro-batches as small as "
               "the smallest profiled, of %d samples or more", ao->max_accumulation,
               ao->min_micro_batch);
    printf(")");
    if (ao->one_worker_a_stage)
        printf(", no stage replicated inside a pipeline");
    if (ao->device_memory)
        printf(", within each machine's --memory-size");
    else if (ao->memory_size > 0)
        printf(", within --memory-size %.0f bytes a worker", ao->memory_size);
    printf("\n");
}

/* The choice in words: its shape, and how it stands beside data
** parallelism and a plan for devices all alike. */
static void print_choice(const rp_autoplan *r, const rp_plan *plan, bool devices) {
    const rp_config *c = &r->best.cfg;
    rp_derived d;
    rp_config_derive(c, &d);
    if (d.stages == 1) {
        printf("data parallelism on %d of the %d workers is predicted fastest: every worker holds "
               "the whole model\n",
               d.workers, plan->machines_available);
    } else {
        if (rp_config_chunked(c))
            printf("a pipeline of %d chunks, %d on each of its %d workers (%s) on %d of the %d "
                   "machines",
                   d.stages, c->virtual_stages, d.stages / c->virtual_stages,
                   rp_schedule_name(c->schedule), rp_config_devices(c, &d),
                   plan->machines_available);
        else if (rp_config_paired(c))
            printf("a pipeline of %d stages, its replicas in pairs running opposite ways over the "
                   "same %d workers (dualpipe: each holds stages s and %d - s), on %d of the %d "
                   "workers", d.stages, d.stages, d.stages - 1, rp_config_devices(c, &d),
                   plan->machines_available);
        else
            printf("a pipeline of %d stages on %d of the %d workers", d.stages, d.workers,
                   plan->machines_available);
        printf(", %d replica%s of it, is predicted fastest", c->replication_factor,
               c->replication_factor == 1 ? "" : "s");
        if (r->data_parallel.found) /* (data parallelism may not fit) */
            printf(": %.2fx data parallelism", r->data_parallel.seconds / r->best.seconds);
        printf("\n");
    }
    if (devices && r->equal_devices.found)
        printf("on these devices it is predicted %.2fx as fast as the plan for devices all "
               "alike (%.4f s against %.4f s an update)\n",
               r->equal_devices.seconds / r->best.seconds, r->best.seconds,
               r->equal_devices.seconds);
}

/* Each stage (or chunk) of c: its layers, named by the profile's nodes,
** and its workers. */
static void print_stages(const rp_profile *prof, const rp_config *c) {
    double *fw, *bw, *ob, *pb;
    int *node, L;
    rp_error err;
    if (rp_profile_layers(prof, &fw, &bw, &ob, &pb, &node, &L, &err))
        return;
    rp_derived d;
    rp_config_derive(c, &d);
    for (int s = 0, l = 0; s < c->layers_per_stage.count; l += c->layers_per_stage.layers[s++]) {
        const char *a = prof->nodes[node[l]].desc;
        const char *b = prof->nodes[node[l + c->layers_per_stage.layers[s] - 1]].desc;
        int P = d.stages / c->virtual_stages, at = 0; /* chunked: the worker of chunk s */
        for (int r = 0; r < P; r++)
            for (int k = 0; k < c->virtual_stages; k++)
                if (rp_config_chunk(c, P, r, k) == s)
                    at = r;
        int reps = rp_config_stage_replicas(c, s), last = l + c->layers_per_stage.layers[s] - 1;
        if (!rp_config_chunked(c)) {
            printf("  stage %d: layers %d-%d (%.*s ... %.*s) on %d worker%s per replica\n", s, l,
                   last, plan_node_name_len(a), a, plan_node_name_len(b), b, reps,
                   reps == 1 ? "" : "s");
            continue;
        }
        printf("  chunk %d: layers %d-%d (%.*s ... %.*s) on worker %d of each replica", s, l,
               last, plan_node_name_len(a), a, plan_node_name_len(b), b, at);
        if (reps > 1) /* (its stage replicas: a device each, the micro-batches in turns) */
            printf(", a worker of %d devices", reps);
        printf("\n");
    }
    free(fw), free(bw), free(ob), free(pb), free(node);
}

/* --config-out: the engine's choice, or PipeDream's plan with a batch that
** feeds every stage replica; the exit code. */
static int write_config(const cli_cmd *cmd, const plan_engine *x, const rp_autoplan *r,
                        long long global_batch, bool quiet) {
    const rp_autoplan_entry *e = x->pipedream_out ? &r->pipedream : &r->best;
    rp_error err;
    if (!e->found) {
        cli_error(cmd, "PipeDream's plan cannot run %lld samples per update with every stage "
                       "replica fed (GA a multiple of each stage's replication); try "
                       "--objective engine or another --global-batch",
                  global_batch);
        return 1;
    }
    if (rp_config_save_file(&e->cfg, x->config_out, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    if (quiet)
        return 0;
    printf("\nexecution configuration written to %s%s%s, %s; it sets:\n", x->config_out,
           x->base_config ? ", based on " : "", x->base_config ? x->base_config : "",
           x->pipedream_out ? "PipeDream's plan" : "the engine's plan");
    print_keys(&e->cfg);
    plan_print_launch(&e->cfg, x->o, x->config_out);
    return 0;
}

/* The search, said and written: its table, its choice, its stages and
** keys, the trainers' settings (--emit), the configuration; the exit
** code. */
static int report(const cli_cmd *cmd, const plan_engine *x, const rp_autoplan *r,
                  const rp_config *base, const rp_autoplan_options *ao,
                  const rp_profile *const *profs, const double *batches, int np, bool split) {
    rp_error err;
    bool quiet = x->json && strcmp(x->json, "-") == 0; /* standard output carries the JSON */
    if (x->json) { /* the plan's JSON with the engine's comparison */
        char *text;
        if (rp_autoplan_to_json(r, ao->global_batch, x->plan, x->prof, &text, &err)) {
            cli_error(cmd, "%s", err.msg);
            return 1;
        }
        bool ok = plan_write_text(cmd, x->json, text);
        free(text);
        if (!ok)
            return 1;
    }
    if (!quiet) {
        bool devices = x->speed || x->device_memory;
        print_rows(r, ao, batches, np, split, devices);
        print_choice(r, x->plan, devices);
        print_stages(x->prof, &r->best.cfg);
        print_keys(&r->best.cfg);
        if (x->emit->on &&
            plan_emit_trainer(cmd, x->emit, x->prof, profs, batches, np, base, *ao,
                              x->pipedream_out ? &r->pipedream : &r->best, r))
            return 1;
    }
    return x->config_out ? write_config(cmd, x, r, ao->global_batch, quiet) : 0;
}

/* The engine objective: the fastest synchronous configuration beside one
** worker, data parallelism and PipeDream's plan run synchronously; with
** config_out, written (the engine's choice, or PipeDream's plan with a
** batch that feeds every stage replica when pipedream_out). */
int plan_engine_run(const cli_cmd *cmd, const plan_engine *x) {
    rp_config base;
    rp_autoplan_options ao;
    long long profile_batch;
    int rc = engine_options(cmd, x, &base, &ao, &profile_batch);
    if (rc >= 0)
        return rc;
    unsigned char *split = NULL;
    if (x->split_model && !tensor_split(cmd, x, &ao, &split))
        return 1;
    /* the profile, and those of the same model at other micro-batches */
    const rp_profile *profs[RP_AUTOPLAN_MAX_PROFILES] = {x->prof};
    double batches[RP_AUTOPLAN_MAX_PROFILES] = {(double)profile_batch};
    int np = 1, sizes[RP_AUTOPLAN_MAX_PROFILES];
    rc = 1;
    rp_error err;
    rp_autoplan *r = malloc(sizeof *r);
    if (!r)
        cli_error(cmd, "out of memory");
    else if (!read_more(cmd, x, profs, batches, &np) ||
             !tensor_sizes(cmd, x, profs, np, sizes, &ao))
        ;
    else if (rp_autoplan_compute(profs, batches, np, &base, x->plan, &ao, r, &err))
        cli_error(cmd, "%s", err.msg);
    else
        rc = report(cmd, x, r, &base, &ao, profs, batches, np,
                    split != NULL || ao.profile_tensor);
    free(r);
    for (int k = 1; k < np; k++)
        rp_profile_free((rp_profile *)profs[k]);
    free(split);
    return rc;
}

