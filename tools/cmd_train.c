/*
** repipe train: trains a model on an IDX dataset and evaluates it.
*/
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/core/util.h"
#include "cli.h"
#include "repipe/repipe.h"

enum {
    OPT_MODEL,
    OPT_CONFIG,
    OPT_EPOCHS,
    OPT_UPDATES,
    OPT_DATA,
    OPT_SAVE,
    OPT_LOAD,
    OPT_JSON_LOG,
    OPT_LOG_EVERY,
    OPT_BACKEND,
    OPT_TRACE,
    OPT_PLAN,
    OPT_ALLOW_NONFINITE,
};

static const cli_opt OPTS[] = {
    [OPT_MODEL] = {"model", 'm', "FILE", "model spec (required)"},
    [OPT_CONFIG] = {"config", 'c', "FILE", "execution configuration (required)"},
    [OPT_EPOCHS] = {"epochs", 'e', "N", "passes over the training set [1]"},
    [OPT_UPDATES] = {"updates", 'u', "N", "optimizer updates to run (instead of --epochs)"},
    [OPT_DATA] = {"data", 'd', "DIR", "IDX dataset directory [" RP_FASHION_MNIST_DIR "]"},
    [OPT_SAVE] = {"save", 's', "FILE", "write the trained weights"},
    [OPT_LOAD] = {"load", 'l', "FILE", "start from these weights"},
    [OPT_JSON_LOG] = {"json-log", 0, "FILE", "write one JSON object per logged update and one for the evaluation"},
    [OPT_LOG_EVERY] = {"log-every", 0, "N", "updates between log lines when not on a terminal [1/10 epoch]"},
    [OPT_BACKEND] = {"backend", 'b', "local|mpi", "workers as threads, or as MPI ranks under mpirun [local]"},
    [OPT_TRACE] = {"trace", 't', "FILE", "write a Chrome trace-event JSON of every worker's operations"},
    [OPT_PLAN] = {"plan", 'p', "FILE", "run this plan ('repipe plan --json'): its stages and replication"},
    [OPT_ALLOW_NONFINITE] = {"allow-nonfinite", 0, NULL, "--load weights holding NaN or infinity too"},
    {NULL, 0, NULL, NULL},
};

static void fmt_time(double s, char *buf, size_t n) {
    long t = s < 0 ? 0 : (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

/* The mean loss of a host call's result. */
static double result_loss(const rp_result *r) {
    double s = 0;
    for (int i = 0; i < r->count; i++)
        s += r->losses[i];
    return s / r->count;
}

/* Accuracy of a session on a dataset, predicting in chunks. */
static rp_status evaluate(rp_session *s, const rp_dataset *d, double *acc, rp_error *err) {
    int32_t *pred = malloc(sizeof(int32_t) * d->n);
    if (!pred)
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    rp_status st = rp_session_predict(s, d->x, d->n, pred, err);
    int right = 0;
    for (int i = 0; !st && i < d->n; i++)
        right += pred[i] == d->labels[i];
    *acc = (double)right / d->n;
    free(pred);
    return st;
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    const char *model_path = NULL, *config_path = NULL, *data = RP_FASHION_MNIST_DIR;
    const char *save = NULL, *load = NULL, *json_log = NULL;
    long long epochs = 0, updates = 0, log_every = 0;
    bool use_mpi = false, allow_nonfinite = false;
    const char *trace = NULL, *plan = NULL;
    bool help;
    const char *arg;
    for (int o; (o = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        if (o == -2)
            return help ? 0 : 2;
        switch (o) {
        case OPT_MODEL: model_path = arg; break;
        case OPT_CONFIG: config_path = arg; break;
        case OPT_EPOCHS:
            if (!cli_int("epochs", arg, 1, 1000000, &epochs))
                return 2;
            break;
        case OPT_UPDATES:
            if (!cli_int("updates", arg, 1, 1LL << 40, &updates))
                return 2;
            break;
        case OPT_DATA: data = arg; break;
        case OPT_SAVE: save = arg; break;
        case OPT_LOAD: load = arg; break;
        case OPT_JSON_LOG: json_log = arg; break;
        case OPT_LOG_EVERY:
            if (!cli_int("log-every", arg, 1, 1LL << 40, &log_every))
                return 2;
            break;
        case OPT_TRACE: trace = arg; break;
        case OPT_PLAN: plan = arg; break;
        case OPT_ALLOW_NONFINITE: allow_nonfinite = true; break;
        case OPT_BACKEND:
            if (!cli_backend(cmd, arg, &use_mpi))
                return 2;
            break;
        }
    }
    if (!model_path || !config_path) {
        cli_error(cmd, "--model and --config are required (see 'repipe train --help')");
        return 2;
    }
    if (epochs && updates) {
        cli_error(cmd, "give --epochs or --updates, not both");
        return 2;
    }
    rp_error err;
    rp_model *m = NULL;
    rp_config cfg;
    rp_dataset *train = NULL, *test = NULL;
    rp_session *s = NULL;
    rp_comm *comm;
    FILE *jl = NULL;
    int rc = 1;
    bool lead; /* prints: rank 0 under MPI */
    if (!cli_mpi_start(cmd, use_mpi, &argc, &argv, &comm, &lead))
        return 1;
    if (rp_model_load(&m, model_path, &err) || rp_config_load_file(&cfg, config_path, &err))
        goto fail;
    for (int i = 0; lead && i < cfg.num_warnings; i++)
        fprintf(stderr, "warning: %s\n", cfg.warnings[i]);
    if (plan) {
        char *text;
        size_t len;
        rp_config before = cfg;
        rp_status ps = rp_read_file(plan, &text, &len, &err);
        if (!ps) {
            ps = rp_config_apply_plan(&cfg, text, len, plan, &err);
            free(text);
        }
        if (ps)
            goto fail;
        /* say what the plan replaced of the configuration */
        if (lead && before.replication_factor != cfg.replication_factor)
            printf("%s: replication_factor %d (the configuration's %d)\n", plan,
                   cfg.replication_factor, before.replication_factor);
        if (lead && before.grouping_set)
            printf("%s: replica_grouping: one group of all %d replicas (the configuration's "
                   "group_size %d, stride %d is dropped)\n",
                   plan, cfg.replication_factor, before.replica_grouping.group_size,
                   before.replica_grouping.stride);
    }
    /* the log shows each update's mean loss over all its micro-batches and
    ** replicas, the same on every layout of a run; output_mode only shapes
    ** what a program gets back from the session */
    cfg.output_mode = RP_OUTPUT_ALL;
    if (rp_dataset_load_idx(&train, data, true, &err) ||
        rp_dataset_load_idx(&test, data, false, &err))
        goto fail;
    /* both sets: a test image of another size would be read past its end */
    char what[2][600];
    snprintf(what[0], sizeof what[0], "the training set of %s", data);
    snprintf(what[1], sizeof what[1], "the test set of %s", data);
    if (rp_dataset_fits(train, m, what[0], &err) || rp_dataset_fits(test, m, what[1], &err))
        goto fail;
    /* before any worker starts: an update the dataset cannot fill */
    rp_derived need;
    rp_config_derive(&cfg, &need);
    if (need.samples_per_update > train->n) {
        rp_fail(&err, RP_ERR_INVALID,
                "%s: an update takes %lld samples (micro_batch_size x "
                "gradient_accumulation_steps x replication_factor) but %s has %d",
                config_path, need.samples_per_update, what[0], train->n);
        goto fail;
    }
    if ((comm ? rp_session_create_mpi(m, &cfg, comm, &s, &err)
              : rp_session_create(m, &cfg, &s, &err)))
        goto fail;
    if (lead && rp_session_cache_note(s)[0])
        printf("%s\n", rp_session_cache_note(s));
    if (lead) {
        printf("%d worker%s (%s backend), %d stage%s; memory of a worker (MB):\n",
               rp_session_workers(s), rp_session_workers(s) == 1 ? "" : "s",
               comm ? "mpi" : "local", rp_session_stages(s),
               rp_session_stages(s) == 1 ? "" : "s");
        printf("  %-6s %11s %10s %10s %12s %8s %8s\n", "stage", "parameters", "gradients",
               "optimizer", "activations", "scratch", "total");
        for (int t = 0; t < rp_session_stages(s); t++) {
            rp_memory mem;
            if (rp_session_memory(s, t, &mem, &err))
                goto fail;
            size_t total = mem.params + mem.grads + mem.optimizer + mem.activations + mem.scratch;
            printf("  %-6d %11.2f %10.2f %10.2f %12.2f %8.2f %8.2f\n", t, mem.params / 1e6,
                   mem.grads / 1e6, mem.optimizer / 1e6, mem.activations / 1e6,
                   mem.scratch / 1e6, total / 1e6);
        }
    }
    if (load) {
        rp_weights *w;
        if (rp_weights_load(&w, load, &err))
            goto fail;
        if (!allow_nonfinite && rp_weights_check_finite(w, load, &err)) {
            rp_weights_free(w);
            goto fail;
        }
        rp_status st = rp_session_set_weights(s, w, RP_ONE_PER_GROUP, &err);
        rp_weights_free(w);
        if (st)
            goto fail;
    }
    if (lead && json_log && !(jl = fopen(json_log, "w"))) {
        rp_fail(&err, RP_ERR_IO, "%s: cannot write", json_log);
        goto fail;
    }
    rp_derived d;
    rp_config_derive(&cfg, &d);
    rp_stream stream;
    if (rp_stream_init(&stream, cfg.seed, train->n, (int)d.samples_per_update, &err))
        goto fail;
    long long per_epoch = rp_stream_updates_per_epoch(&stream);
    long long total = updates ? updates : (epochs ? epochs : 1) * per_epoch;
    int D = cfg.device_iterations;
    long long calls = total / D;
    if (calls < 1) {
        rp_fail(&err, RP_ERR_INVALID, "%lld updates are fewer than one host call (%d updates)",
                total, D);
        rp_stream_free(&stream);
        goto fail;
    }
    if (total % D)
        fprintf(stderr, "note: running %lld updates, a whole number of host calls of %d\n",
                calls * D, D);
    if (!log_every)
        log_every = per_epoch / 10 > 0 ? per_epoch / 10 : 1;
    long long per_call = rp_session_samples_per_call(s);
    int64_t *ids = malloc(sizeof(int64_t) * per_call);
    if (!ids) {
        rp_stream_free(&stream);
        rp_fail(&err, RP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    bool tty = lead && !comm && isatty(STDOUT_FILENO); /* mpirun forwards through a pty */
    if (trace && rp_session_trace(s, true, &err)) {
        free(ids);
        rp_stream_free(&stream);
        goto fail;
    }
    if (lead)
        printf("training %s on %d samples (%lld updates of %lld samples, %lld per epoch)\n",
           model_path, train->n, calls * D, d.samples_per_update, per_epoch);
    double t0 = rp_now(), ema = -1;
    long long next_log = log_every;
    rp_status st = RP_OK;
    for (long long c = 0; c < calls && !st; c++) {
        for (int k = 0; k < D; k++)
            rp_stream_update(&stream, c * D + k, ids + (size_t)k * d.samples_per_update);
        rp_result r; /* the workers copy their own rows */
        if ((st = rp_session_run_samples(s, train, ids, &r, &err)))
            break;
        double loss = result_loss(&r);
        if (!isfinite(loss) && !cfg.auto_loss_scaling) { /* the weights are lost: say so */
            st = rp_fail(&err, RP_ERR_INVALID,
                         "update %lld: the loss is %g, training diverged; nothing is saved "
                         "(lower optimizer.lr, now %g, or set auto_loss_scaling to skip such "
                         "updates)",
                         (c + 1) * D, loss, cfg.optimizer.lr);
            break;
        }
        ema = ema < 0 ? loss : 0.95 * ema + 0.05 * loss;
        long long done = (c + 1) * D;
        double el = rp_now() - t0, sps = done * d.samples_per_update / el;
        char eta[32];
        fmt_time(el / done * (calls * D - done), eta, sizeof eta);
        if (tty) {
            int width = 30, filled = (int)(width * done / (calls * D));
            printf("\r[%.*s%s%*s] %3d%%  %lld/%lld  %.0f samples/s  loss %.4f  ETA %s   ",
                   filled, "==============================", filled < width ? ">" : "",
                   width - filled - (filled < width), "", (int)(100 * done / (calls * D)), done,
                   calls * D, sps, ema, eta);
            fflush(stdout);
        }
        if (done >= next_log || c == calls - 1) {
            next_log += log_every;
            double scale;
            long long skipped;
            rp_session_loss_scale(s, &scale, &skipped);
            char ls[96] = "", ljs[96] = "";
            if (cfg.auto_loss_scaling) {
                snprintf(ls, sizeof ls, "  loss scale %.10g (%lld skipped)", scale, skipped);
                snprintf(ljs, sizeof ljs, ",\"loss_scale\":%.17g,\"skipped_updates\":%lld",
                         scale, skipped);
            }
            if (!tty && lead)
                printf("update %lld/%lld  epoch %.2f  loss %.4f  %.0f samples/s  ETA %s%s\n",
                       done, calls * D, (double)done / per_epoch, ema, sps, eta, ls);
            if (jl)
                fprintf(jl,
                        "{\"update\":%lld,\"epoch\":%.4f,\"loss\":%.6f,\"samples_per_s\":%.1f,"
                        "\"elapsed_s\":%.3f%s}\n",
                        done, (double)done / per_epoch, loss, sps, el, ljs);
        }
    }
    if (tty)
        printf("\n");
    free(ids);
    rp_stream_free(&stream);
    if (st)
        goto fail;
    if (trace) {
        char path[4096];
        if (comm) /* one file per rank */
            snprintf(path, sizeof path, "%s.%d", trace, rp_comm_rank(comm));
        else
            snprintf(path, sizeof path, "%s", trace);
        if (rp_session_write_trace(s, path, &err))
            goto fail;
        if (lead)
            printf("trace written to %s%s\n", trace, comm ? ".RANK" : "");
        long long dropped = rp_session_trace_dropped(s);
        if (dropped)
            fprintf(stderr, "warning: %s: %lld operations were not recorded: a worker keeps its "
                            "first %d (trace fewer updates with --updates)\n",
                    path, dropped, RP_TRACE_EVENTS);
    }
    double acc = 0;
    double te = rp_now();
    if (evaluate(s, test, &acc, &err))
        goto fail;
    if (lead && cfg.auto_loss_scaling) {
        double scale;
        long long skipped;
        rp_session_loss_scale(s, &scale, &skipped);
        printf("loss scaling: %lld update%s skipped (gradients not finite); "
               "the scale is now %.10g\n",
               skipped, skipped == 1 ? "" : "s", scale);
    }
    if (lead) {
        printf("training took %.1f s; evaluation of %d samples %.1f s\n", te - t0, test->n,
               rp_now() - te);
        printf("test accuracy: %.4f\n", acc);
    }
    if (jl)
        fprintf(jl, "{\"eval\":\"test\",\"samples\":%d,\"accuracy\":%.6f}\n", test->n, acc);
    if (save) {
        rp_weights *w;
        if (rp_session_get_weights(s, RP_ONE_PER_GROUP, &w, &err)) /* collective */
            goto fail;
        rp_status ws = lead ? rp_weights_save(w, save, &err) : RP_OK;
        rp_weights_free(w);
        if (ws)
            goto fail;
        if (lead)
            printf("weights written to %s\n", save);
    }
    rc = 0;
    goto done;
fail:
    cli_error(cmd, "%s", err.msg);
    cli_mpi_abort(comm, err.msg);
done:
    if (jl)
        fclose(jl);
    rp_session_free(s);
    rp_dataset_free(train);
    rp_dataset_free(test);
    rp_model_free(m);
    if (comm)
        rp_comm_mpi_finalize(comm);
    return rc;
}

const cli_cmd cmd_train = {
    "train",
    "train a model on an IDX dataset and report its test accuracy",
    "--model FILE --config FILE [--epochs N | --updates N] [options]",
    "The sample order is fixed by the configuration's seed and the epoch. On a\n"
    "terminal a progress bar shows samples/s, the loss and the time left;\n"
    "otherwise one line is printed every --log-every updates.\n"
    "With --backend mpi, start it as 'mpirun -np R repipe train ... --backend mpi',\n"
    "R being the workers the configuration needs.",
    OPTS,
    run,
};
