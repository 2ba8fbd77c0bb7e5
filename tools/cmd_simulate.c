/*
** repipe simulate: predicts an update's time from a profile and draws the
** schedule; with --model, also measures it.
*/
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/core/util.h"
#include "cli.h"
#include "sim_cluster.h"
#include "repipe/repipe.h"

enum {
    OPT_CONFIG,
    OPT_PLAN,
    OPT_PROFILE,
    OPT_PROFILE_BATCH,
    OPT_SVG,
    OPT_MODEL,
    OPT_CORES,
    OPT_MACHINES,
    OPT_BANDWIDTH,
    OPT_LATENCY,
    OPT_JSON,
    OPT_BACKEND,
    OPT_POD_TYPE,
    OPT_SCHEDULE_CSV,
    OPT_WRITE_SCHEDULE_CSV,
    OPT_VIRTUAL_STAGES,
    OPT_TENSOR_SPLIT,
    OPT_CLUSTER,
    OPT_SPEED,
};

static const cli_opt OPTS[] = {
    [OPT_CONFIG] = {"config", 'c', "FILE", "execution configuration, e.g. from 'repipe plan --config-out'"},
    [OPT_PLAN] = {"plan", 'p', "FILE", "a plan ('repipe plan --json'): its stages, replication and machines"},
    [OPT_PROFILE] = {"profile", 'f', "FILE", "per-layer profile, e.g. from 'repipe profile' (required)"},
    [OPT_PROFILE_BATCH] = {"profile-batch", 'b', "B", "micro-batch the profile was measured on [the profile's, else the config's]"},
    [OPT_SVG] = {"svg", 's', "FILE", "draw the schedule and the micro-batches in flight: one row per worker"},
    [OPT_MODEL] = {"model", 'm', "FILE", "also run the configuration with this model and measure it"},
    [OPT_CORES] = {"cores", 0, "N", "the workers share N cores: k computing at once run at N / k of their speed [a core each]"},
    [OPT_MACHINES] = {"machines", 'n', "N1 [N2 ...]", "machines per level, innermost first, as 'repipe plan' [one machine]"},
    [OPT_BANDWIDTH] = {"bandwidth", 0, "B1 [B2 ...]", "bytes/s per level [1e9 each; 1e10 without --machines]"},
    [OPT_LATENCY] = {"latency", 0, "S", "seconds per message [2e-5]"},
    [OPT_JSON] = {"json", 0, "FILE", "write the prediction as JSON ('-' for standard output)"},
    [OPT_BACKEND] = {"backend", 0, "local|mpi", "mpi: waiting ranks poll, taking their share of --cores [local]"},
    [OPT_POD_TYPE] = {"pod-type", 0, "POD", "an IPUConfig of Optimum Graphcore 0.2.1-0.6.0: the pod type (pod4, pod16, ...) whose values to take [the file's pod_type, else \"default\"]"},
    [OPT_SCHEDULE_CSV] = {"schedule-csv", 0, "FILE", "predict this schedule instead: each rank's actions in PyTorch's pipelining CSV form (2F0, 1I3, 0W3, ...), a rank per line; layers_per_stage gives every stage"},
    [OPT_WRITE_SCHEDULE_CSV] = {"write-schedule-csv", 0, "FILE", "write the configuration's schedule in that form"},
    [OPT_VIRTUAL_STAGES] = {"virtual-stages", 0, "V", "predict interleaved 1F1B instead (Megatron-LM's): layers_per_stage's P x V stages on P ranks, V each, over GA micro-batches"},
    [OPT_TENSOR_SPLIT] = {"tensor-split", 0, "MODEL", "the profiled model: which of its layers tensor_parallel splits and where its group all-reduces (needed with tensor_parallel)"},
    [OPT_CLUSTER] = {"cluster", 0, "NAME|FILE", "the machines: a cluster of devices (dgx-a100, dgx-h100, or a JSON file); with a transformer profile ('repipe profile --transformer') also its TFLOP/s a device and each rank's memory"},
    [OPT_SPEED] = {"speed", 0, "S1 [S2 ...]", "devices of several kinds: a speed for each machine of the outermost level of --machines (a server) or for every machine, relative to the profile's device (0.5: takes twice as long) [all 1]"},
    {NULL, 0, NULL, NULL},
};

/* Median time of an update over a few host calls of Fashion-MNIST samples
** (the median, as the profile's times are). */
static rp_status measure(const char *model_path, const rp_config *cfg, double *best,
                         rp_error *err) {
    rp_model *m = NULL;
    rp_dataset *d = NULL;
    rp_session *s = NULL;
    rp_status st;
    if ((st = rp_model_load(&m, model_path, err)) ||
        (st = rp_dataset_load_idx(&d, RP_FASHION_MNIST_DIR, true, err)) ||
        (st = rp_session_create(m, cfg, &s, err)))
        goto done;
    long long per = rp_session_samples_per_call(s);
    size_t in = rp_shape_size(&d->sample);
    float *x = malloc(sizeof(float) * per * in);
    int32_t *y = malloc(sizeof(int32_t) * per);
    int64_t *ids = malloc(sizeof(int64_t) * per);
    if (!x || !y || !ids) {
        free(x), free(y), free(ids);
        st = rp_fail(err, RP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (long long i = 0; i < per; i++)
        ids[i] = i % d->n;
    rp_dataset_gather(d, ids, (int)per, x, y);
    double times[25];
    int nt = 0;
    for (int k = 0; k < 25 && !st; k++) {
        rp_result r;
        double t = rp_now();
        st = rp_session_run(s, x, y, ids, &r, err);
        t = (rp_now() - t) / cfg->device_iterations;
        if (k >= 3)
            times[nt++] = t;
    }
    qsort(times, nt, sizeof(double), rp_cmp_double);
    *best = nt ? times[nt / 2] : 0;
    free(x), free(y), free(ids);
done:
    rp_session_free(s);
    rp_dataset_free(d);
    rp_model_free(m);
    return st;
}

/* Puts keys (text that begins with a comma) before the closing brace of
** *text's object; false, said, when out of memory (*text freed). */
static bool before_brace(const cli_cmd *cmd, char **text, const char *keys) {
    if (!keys || !keys[0])
        return true;
    size_t n = strlen(*text), k = strlen(keys);
    char *more = realloc(*text, n + k + 8);
    if (!more) {
        free(*text);
        cli_error(cmd, "out of memory");
        return false;
    }
    *text = more;
    snprintf(strrchr(more, '}'), k + 8, "%s\n}\n", keys);
    return true;
}

static bool write_json(const cli_cmd *cmd, const char *path, const rp_sim_result *res,
                       const rp_config *cfg, double measured, const char *extra) {
    char *text;
    rp_error err;
    if (rp_sim_to_json(res, cfg, &text, &err)) {
        cli_error(cmd, "%s", err.msg);
        return false;
    }
    char key[64] = "";
    if (measured > 0)
        snprintf(key, sizeof key, ",\n\t\"measured_seconds_per_update\":\t%.9g", measured);
    if (!before_brace(cmd, &text, extra) || !before_brace(cmd, &text, key))
        return false;
    bool ok = true;
    if (strcmp(path, "-") == 0) {
        ok = fputs(text, stdout) >= 0;
        if (!ok)
            cli_error(cmd, "standard output: cannot write");
    } else if (rp_write_file_atomic(path, text, strlen(text), &err)) {
        /* a new file or the old one whole, never half of either (a full disk, a crash) */
        cli_error(cmd, "%s", err.msg);
        ok = false;
    }
    free(text);
    return ok;
}

/* --schedule-csv: the file's actions, checked and played; what it prints. */
static int simulate_csv(const cli_cmd *cmd, const char *path, const char *text,
                        const rp_config *cfg, const double *fw, const double *bw,
                        const double *ob, const double *pb, int L, const rp_sim_options *opt,
                        const char *svg, const char *json) {
    rp_error err;
    rp_sim_actions *a = NULL;
    rp_sim_result res;
    char *read = NULL;
    size_t len = text ? strlen(text) : 0;
    rp_status st = text ? RP_OK : rp_read_file(path, &read, &len, &err);
    if (!st)
        st = rp_sim_actions_parse(text ? text : read, len, path, &a, &err);
    free(read);
    if (!st)
        st = rp_simulate_actions(cfg, a, fw, bw, ob, pb, L, opt, &res, &err);
    if (st) {
        cli_error(cmd, "%s", err.msg);
        rp_sim_actions_free(a);
        return 1;
    }
    FILE *txt = json && strcmp(json, "-") == 0 ? stderr : stdout;
    fprintf(txt, "%s: %d ranks, %d stages, %d micro-batches of %d; checked: every stage on one "
                 "rank, each micro-batch's forward and backward once and in order\n",
            path, rp_sim_actions_ranks(a), rp_sim_actions_stages(a),
            rp_sim_actions_micro_batches(a), cfg->micro_batch_size);
    if (opt->num_levels)
        cli_print_machines(txt, opt->machines, opt->bandwidth, opt->num_levels);
    fprintf(txt, "predicted time of the schedule   %.3f ms  (its forwards, backwards and "
                 "transfers; no reduction or step)\n",
            res.update_time * 1e3);
    fprintf(txt, "ranks compute %.1f %% of it; bubble %.4f\n", 100 * (1 - res.bubble_fraction),
            res.bubble_fraction);
    int rc = 0;
    if (svg && rp_sim_svg(&res, path, svg, &err)) {
        cli_error(cmd, "%s", err.msg);
        rc = 1;
    } else if (svg) {
        fprintf(txt, "timeline written to %s\n", svg);
    }
    if (!rc && json && !write_json(cmd, json, &res, cfg, 0, NULL))
        rc = 1;
    rp_sim_result_free(&res);
    rp_sim_actions_free(a);
    return rc;
}

/* What the command line asked for, and what the run holds from the start
** to the end (free_job frees it). */
typedef struct sim_job {
    const char *config_path, *profile_path, *svg, *model, *pod_type, *split_model, *cluster;
    const char *plan, *json, *csv_in, *csv_out;
    long long pbatch, cores, virtual_stages;
    int nbw, nspeed;
    double speed_v[RP_PLAN_MAX_MACHINES];
    bool from_plan; /* the machines are --plan's */
    rp_sim_options opt;
    rp_config cfg;
    rp_derived d;
    rp_profile *p;
    int L, *node;
    double *fw, *bw, *ob, *pb, *cut, *bi, *bwt; /* the profile's rows, by layer */
    double *mem[5];         /* what each layer keeps, where the profile says */
    unsigned char *split;   /* --tensor-split's layers */
    char *interleaved;      /* --virtual-stages: the schedule made */
    double *speed;          /* --speed, per machine */
    sim_cluster sc;
} sim_job;

/* The options that check what they take; false (said) when one is wrong. */
static bool checked_option(const cli_cmd *cmd, int o, const char *arg, int argc, char **argv,
                           sim_job *j) {
    rp_sim_options *opt = &j->opt;
    int n;
    switch (o) {
    case OPT_BACKEND: return cli_backend(cmd, arg, &opt->polling);
    case OPT_VIRTUAL_STAGES: return cli_int("virtual-stages", arg, 2, 256, &j->virtual_stages);
    case OPT_PROFILE_BATCH: return cli_int("profile-batch", arg, 1, 1 << 20, &j->pbatch);
    case OPT_CORES: return cli_int("cores", arg, 1, 1 << 20, &j->cores);
    case OPT_MACHINES:
        if ((n = cli_machines(cmd, arg, argc, argv, opt->machines, RP_SIM_MAX_LEVELS)) < 0)
            return false;
        opt->num_levels = n;
        return true;
    case OPT_BANDWIDTH:
        if ((j->nbw = cli_double_list("bandwidth", arg, argc, argv, opt->bandwidth,
                                      RP_SIM_MAX_LEVELS)) < 0)
            return false;
        for (int k = 0; k < j->nbw; k++)
            if (!(opt->bandwidth[k] > 0)) {
                cli_error(cmd, "--bandwidth: '%g' is not a positive number of bytes/s",
                          opt->bandwidth[k]);
                return false;
            }
        return true;
    case OPT_SPEED:
        return (j->nspeed = cli_double_list("speed", arg, argc, argv, j->speed_v,
                                            RP_PLAN_MAX_MACHINES)) >= 0;
    case OPT_LATENCY:
        if (!cli_double("latency", arg, &opt->latency))
            return false;
        if (opt->latency < 0) {
            cli_error(cmd, "--latency takes seconds >= 0, not '%s'", arg);
            return false;
        }
        return true;
    }
    return true;
}

/* Reads the options into j; -1 to go on, else the exit code. */
static int parse_options(const cli_cmd *cmd, int argc, char **argv, sim_job *j) {
    rp_sim_options_default(&j->opt);
    bool help;
    const char *arg;
    for (int o; (o = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        switch (o) {
        case -2: return help ? 0 : 2;
        case OPT_CONFIG: j->config_path = arg; break;
        case OPT_PLAN: j->plan = arg; break;
        case OPT_PROFILE: j->profile_path = arg; break;
        case OPT_SVG: j->svg = arg; break;
        case OPT_MODEL: j->model = arg; break;
        case OPT_JSON: j->json = arg; break;
        case OPT_POD_TYPE: j->pod_type = arg; break;
        case OPT_TENSOR_SPLIT: j->split_model = arg; break;
        case OPT_CLUSTER: j->cluster = arg; break;
        case OPT_SCHEDULE_CSV: j->csv_in = arg; break;
        case OPT_WRITE_SCHEDULE_CSV: j->csv_out = arg; break;
        default:
            if (!checked_option(cmd, o, arg, argc, argv, j))
                return 2;
        }
    }
    if ((!j->config_path && !j->plan) || !j->profile_path) {
        cli_error(cmd, "--profile and --config or --plan are required (see 'repipe simulate "
                       "--help')");
        return 2;
    }
    if (j->opt.num_levels && !cli_levels_match(cmd, j->opt.num_levels, j->nbw))
        return 2;
    if (j->opt.polling && j->model) {
        cli_error(cmd, "--model measures threads of the local backend; for MPI ranks run "
                       "bench/simulate_vs_measured.sh");
        return 2;
    }
    return -1;
}

/* The configuration, the profile, and --plan's stages and replication
** (and its machines, unless the command line gives others). */
static rp_status load_inputs(sim_job *j, rp_error *err) {
    rp_config_default(&j->cfg);
    if ((j->config_path &&
         rp_config_load_file_opts(&j->cfg, j->config_path,
                                  &(rp_config_load_options){.pod_type = j->pod_type}, err)) ||
        rp_profile_read(&j->p, j->profile_path, err))
        return RP_ERR_INVALID;
    if (!j->plan)
        return RP_OK;
    char *text;
    size_t len;
    rp_plan_options po;
    rp_plan_options_default(&po);
    rp_status ps = rp_read_file(j->plan, &text, &len, err);
    if (ps)
        return ps;
    ps = rp_config_apply_plan(&j->cfg, text, len, j->plan, err);
    rp_sim_options *opt = &j->opt;
    if (!ps && !opt->num_levels && !j->nbw &&
        !(ps = rp_plan_options_from_json(&po, text, len, j->plan, err))) {
        opt->num_levels = po.num_levels;
        j->from_plan = true;
        memcpy(opt->machines, po.machines, sizeof(int) * po.num_levels);
        memcpy(opt->bandwidth, po.bandwidth, sizeof(double) * po.num_levels);
    }
    free(text);
    if (!j->config_path)
        j->config_path = j->plan;
    return ps;
}

/* The profile's rows by layer, and the machines they run on: --cluster's,
** --machines and --bandwidth (or their defaults), --speed; false (said)
** when they do not go together. */
static bool rows_and_machines(const cli_cmd *cmd, sim_job *j, rp_error *err) {
    rp_sim_options *opt = &j->opt;
    if (rp_profile_layers(j->p, &j->fw, &j->bw, &j->ob, &j->pb, &j->node, &j->L, err) ||
        rp_profile_cut_bytes(j->p, j->node, j->L, &j->cut, err) ||
        rp_profile_split_ms(j->p, j->node, j->L, &j->bi, &j->bwt, err))
        return cli_error(cmd, "%s", err->msg);
    if (j->cluster && (opt->num_levels || j->nbw))
        return cli_error(cmd, "--cluster gives the machines: no --machines, --bandwidth or "
                              "--plan's");
    if (!sim_cluster_setup(cmd, j->cluster, j->p, &j->cfg, opt, &j->sc))
        return false;
    /* what each layer keeps for its backward, where the profile says */
    if (rp_profile_memory(j->p, j->node, j->L, j->mem, err))
        return cli_error(cmd, "%s", err->msg);
    rp_sim_options_memory(opt, j->mem);
    rp_config_derive(&j->cfg, &j->d);
    if (!opt->num_levels && j->nbw) { /* --bandwidth alone: one level of every worker */
        opt->num_levels = 1;
        opt->machines[0] = j->d.workers;
    } else if (opt->num_levels && !j->nbw && !j->from_plan && !j->cluster) {
        for (int l = 0; l < opt->num_levels; l++)
            opt->bandwidth[l] = 1e9; /* repipe plan's default */
    }
    if (j->nspeed) {
        if (!cli_per_machine(cmd, "speed", j->speed_v, j->nspeed, opt->machines,
                             opt->num_levels, &j->speed))
            return false;
        opt->device_speed = j->speed;
    }
    opt->profile_batch = j->pbatch ? j->pbatch : rp_profile_micro_batch(j->p);
    opt->cores = (int)j->cores;
    opt->cut_bytes = j->cut; /* a graph's cuts carry every tensor alive there */
    opt->bwd_input_ms = j->bi, opt->bwd_weight_ms = j->bwt; /* the zero-bubble halves */
    return true;
}

/* --tensor-split: the layers a tensor group splits, and what a tensor rank
** keeps, from the split model itself; or a profile measured on a rank of
** the configuration's tensor group, as it is; false (said) when it fails. */
static bool tensor_split(const cli_cmd *cmd, sim_job *j, rp_error *err) {
    const rp_config *cfg = &j->cfg;
    int measured = rp_profile_tensor_parallel(j->p);
    if (measured == 1 && !j->split_model && rp_config_tensor_parallel(cfg) > 1) {
        cli_error(cmd, "the configuration's tensor_parallel %d needs --tensor-split MODEL (the "
                       "layers a group splits) or a profile measured on a rank of such a group "
                       "(tensor_parallel=%d in its Input's description)",
                  cfg->tensor_parallel, cfg->tensor_parallel);
        return false;
    }
    if (measured != 1) {
        if (measured != rp_config_tensor_parallel(cfg) || j->split_model) {
            cli_error(cmd, "the profile was measured on a rank of a tensor group of %d "
                           "(tensor_parallel= in its Input's description): the "
                           "configuration's tensor_parallel is %d%s",
                      measured, rp_config_tensor_parallel(cfg),
                      j->split_model ? ", and --tensor-split splits one worker's profile" : "");
            return false;
        }
        j->opt.tensor_measured = true;
        return true;
    }
    if (!j->split_model || rp_config_tensor_parallel(cfg) <= 1)
        return true;
    unsigned degrees;
    if (!cli_tensor_split(cmd, j->split_model, j->L, cfg->tensor_parallel,
                          rp_config_tp_flags(cfg), &j->split, &degrees))
        return false;
    j->opt.tensor_split = j->split;
    double **mem = j->mem;
    if (!(mem[0] && mem[1] && mem[2] && mem[3] && mem[4]))
        return true;
    rp_model *tm = NULL;
    rp_status st = rp_model_load(&tm, j->split_model, err);
    if (!st)
        st = rp_layer_memory_table(tm, cfg->tensor_parallel, rp_config_tp_flags(cfg),
                                   (int)j->opt.profile_batch, mem[0], mem[1], mem[2], mem[3],
                                   mem[4], err);
    rp_model_free(tm);
    if (st)
        cli_error(cmd, "%s", err->msg);
    return !st;
}

/* --virtual-stages' schedule made, and --write-schedule-csv's written;
** false (said) when either fails. */
static bool schedule_csvs(const cli_cmd *cmd, sim_job *j, rp_error *err) {
    int stages = j->d.stages;
    if (j->virtual_stages && j->csv_in)
        return cli_error(cmd, "--virtual-stages makes the schedule; --schedule-csv reads one: "
                              "give one");
    if (j->virtual_stages && stages % j->virtual_stages)
        return cli_error(cmd, "--virtual-stages %lld: the configuration's %d stages are not a "
                              "multiple of it", j->virtual_stages, stages);
    if (j->virtual_stages &&
        rp_schedule_csv_interleaved(stages / (int)j->virtual_stages, (int)j->virtual_stages,
                                    j->cfg.gradient_accumulation_steps, &j->interleaved, err))
        return cli_error(cmd, "%s", err->msg);
    if (!j->csv_out)
        return true;
    char *csv = NULL;
    rp_status st = j->interleaved ? RP_OK : rp_schedule_csv(&j->cfg, &csv, err);
    const char *text = j->interleaved ? j->interleaved : csv;
    if (!st)
        st = rp_write_file_atomic(j->csv_out, text, strlen(text), err);
    free(csv);
    if (st)
        return cli_error(cmd, "%s", err->msg);
    fprintf(j->json && strcmp(j->json, "-") == 0 ? stderr : stdout,
            "%s's schedule written to %s, a rank a line\n", j->config_path, j->csv_out);
    return true;
}

/* The prediction in words: the run's shape, its machines, the time of an
** update, the workers' busy share and the levels' traffic, the memory a
** rank holds. */
static void report(FILE *txt, const sim_job *j, const rp_sim_result *res) {
    const rp_config *cfg = &j->cfg;
    const rp_sim_options *opt = &j->opt;
    int nw = rp_config_devices(cfg, &j->d); /* interleaved-1f1b: each holds several stages */
    fprintf(txt, "%s: %d workers, %d stages, %d micro-batches of %d per replica\n",
            j->config_path, nw, j->d.stages, cfg->gradient_accumulation_steps,
            cfg->micro_batch_size);
    if (!opt->profile_batch) /* the simulator prices the profile's rows as one micro-batch */
        fprintf(txt, "note: %s does not say the micro-batch it was measured on; taken to be "
                     "the configuration's %d (--profile-batch B says otherwise)\n",
                j->profile_path, cfg->micro_batch_size);
    if (opt->num_levels)
        cli_print_machines(txt, opt->machines, opt->bandwidth, opt->num_levels);
    else
        fprintf(txt, "machines one, every worker on it (shared memory at 10 GB/s)\n");
    bool shared = j->cores > 0 && j->cores < nw;
    fprintf(txt, "predicted time per update   %.3f ms  (%.0f samples/s)", res->update_time * 1e3,
            j->d.samples_per_update / res->update_time);
    if (shared)
        fprintf(txt, "  (%d workers share %lld cores)", nw, j->cores);
    fprintf(txt, "\n");
    if (shared)
        fprintf(txt, "note: the operating system's time slicing, and the caches and memory "
                     "bus that cores share, are not modelled; they made oversubscribed "
                     "pipelines run up to 25 %% slower than predicted (docs/simulate.md)\n");
    double busy = 0;
    for (int w = 0; w < res->workers; w++)
        busy += res->busy[w];
    fprintf(txt, "workers compute %.0f %% of the time, wait in the pipeline's bubble %.0f %%",
            100 * busy / nw, 100 * res->bubble_fraction);
    for (int l = 0; l < res->num_levels; l++)
        if (res->comm_seconds[l] > 0)
            fprintf(txt, "; level %d carries data %.3f ms", l + 1, res->comm_seconds[l] * 1e3);
    fprintf(txt, "\n");
    if (res->steady_update_time < res->update_time * (1 - 1e-6))
        fprintf(txt, "under way, an update adds %.3f ms to a call (bubble %.1f %%): each "
                     "worker starts the next update once it has stepped, while later stages "
                     "finish this one (device_iterations over 1 runs them in one call)\n",
                res->steady_update_time * 1e3, 100 * res->steady_bubble_fraction);
    if (!j->sc.on) { /* with --cluster, by rank beside the device's */
        double bytes[RP_MAX_STAGES];
        int P = sim_rank_bytes(NULL, cfg, res, bytes);
        fprintf(txt, "memory a worker holds, by pipeline rank (MB, as the engine lays it "
                     "out):");
        for (int r = 0; r < P && r < 16; r++)
            fprintf(txt, " %.2f", bytes[r] / 1e6);
        fprintf(txt, "%s\n", P > 16 ? " ..." : "");
    }
    sim_cluster_print(txt, &j->sc, cfg, res);
}

/* --model: the configuration run here, beside the prediction; 0 or 1. */
static int measured(const cli_cmd *cmd, FILE *txt, const sim_job *j, const rp_sim_result *res,
                    double *t) {
    rp_error err;
    int nw = rp_config_devices(&j->cfg, &j->d);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (!j->cores && cpus > 0 && nw > cpus)
        fprintf(txt, "note: %d workers share this machine's %ld cores; --cores %ld predicts "
                     "that\n", nw, cpus, cpus);
    if (measure(j->model, &j->cfg, t, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    fprintf(txt, "measured time per update    %.3f ms  (%.0f samples/s): prediction %+.1f %%\n",
            *t * 1e3, j->d.samples_per_update / *t, 100 * (res->update_time - *t) / *t);
    return 0;
}

/* The simulation of the configuration's own schedule, said, drawn (--svg),
** measured (--model) and written (--json); the exit code. */
static int simulate(const cli_cmd *cmd, sim_job *j) {
    rp_error err;
    rp_sim_result res;
    const rp_config *cfg = &j->cfg;
    if (rp_simulate(cfg, j->fw, j->bw, j->ob, j->pb, j->L, &j->opt, &res, &err)) {
        cli_error(cmd, "%s", err.msg);
        return 1;
    }
    if (rp_simulate_steady(cfg, j->fw, j->bw, j->ob, j->pb, j->L, &j->opt, &res, &err)) {
        cli_error(cmd, "%s", err.msg);
        rp_sim_result_free(&res);
        return 1;
    }
    /* with the JSON on standard output, the words go to standard error */
    FILE *txt = j->json && strcmp(j->json, "-") == 0 ? stderr : stdout;
    report(txt, j, &res);
    int rc = 0;
    if (j->svg && rp_sim_svg(&res, j->config_path, j->svg, &err)) {
        cli_error(cmd, "%s", err.msg);
        rc = 1;
    } else if (j->svg) {
        fprintf(txt, "timeline written to %s\n", j->svg);
    }
    double t = 0;
    if (!rc && j->model)
        rc = measured(cmd, txt, j, &res, &t);
    char *extra = sim_cluster_json(&j->sc, cfg, &res);
    if (!rc && j->json && !write_json(cmd, j->json, &res, cfg, t, extra))
        rc = 1;
    free(extra);
    rp_sim_result_free(&res);
    return rc;
}

static void free_job(sim_job *j) {
    free(j->fw), free(j->bw), free(j->ob), free(j->pb), free(j->cut), free(j->node);
    free(j->bi), free(j->bwt), free(j->split), free(j->interleaved), free(j->speed);
    for (int k = 0; k < 5; k++)
        free(j->mem[k]);
    rp_profile_free(j->p);
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    static sim_job j; /* --speed's list is large */
    memset(&j, 0, sizeof j);
    int rc = parse_options(cmd, argc, argv, &j);
    if (rc >= 0)
        return rc;
    rp_error err;
    if (load_inputs(&j, &err)) {
        cli_error(cmd, "%s", err.msg);
        rp_profile_free(j.p);
        return 1;
    }
    rc = 1;
    if (rows_and_machines(cmd, &j, &err) && tensor_split(cmd, &j, &err) &&
        schedule_csvs(cmd, &j, &err))
        rc = j.csv_in || j.interleaved
                 ? simulate_csv(cmd, j.csv_in ? j.csv_in : "interleaved 1F1B", j.interleaved,
                                &j.cfg, j.fw, j.bw, j.ob, j.pb, j.L, &j.opt, j.svg, j.json)
                 : simulate(cmd, &j);
    free_job(&j);
    return rc;
}

const cli_cmd cmd_simulate = {
    "simulate",
    "predict a configuration's time per update on a cluster from a profile, and draw its schedule",
    "--profile FILE (--config FILE | --plan FILE [--config FILE]) [--machines N1 [N2 ...] "
    "--bandwidth B1 [B2 ...]] [--svg F] [--json F] [--model FILE] [--schedule-csv F] "
    "[--write-schedule-csv F] [--tensor-split MODEL]",
    "--plan takes the stages, replication and machines of a plan written by\n"
    "'repipe plan --json'; --config adds the batch, accumulation and schedule (or\n"
    "gives all). Level 1 of --machines is innermost, as in 'repipe plan':\n"
    "'--machines 8 2 --bandwidth 4.29e9 2.15e9' means 2 servers of 8 workers.\n"
    "Workers are laid on them in rank order; a transfer costs latency + bytes /\n"
    "bandwidth of the innermost level both workers share, a reduction a ring (or\n"
    "tree) allreduce over the slowest level its group spans. Every worker's\n"
    "checked operation list is played on its own clock with the profile's\n"
    "compute times; each worker has a core of its own unless --cores is given.\n"
    "Where updates overlap (zb-h2: the next one starts on the first stages while\n"
    "the last finish), it also prints what one more update adds to a call of\n"
    "several device iterations ('under way'; steady_* in the JSON).\n"
    "With --model the configuration also runs on Fashion-MNIST here and the\n"
    "measured time per update is printed beside the prediction. --schedule-csv F\n"
    "predicts a schedule given as each rank's actions instead, in PyTorch's\n"
    "torch.distributed.pipelining CSV form (a rank may hold several stages;\n"
    "docs/pipelines.md). docs/simulate.md states the formulas.",
    OPTS,
    run,
};
