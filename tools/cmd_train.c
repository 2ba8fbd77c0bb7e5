/*
** repipe train: trains a model on an IDX dataset and evaluates it.
*/
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../src/core/util.h"
#include "cli.h"
#include "train_parts.h"
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
    OPT_CHECKPOINT_DIR,
    OPT_CHECKPOINT_EVERY,
    OPT_KEEP,
    OPT_RESUME,
    OPT_RESUME_ANYWAY,
    OPT_TEXT,
    OPT_TOKENS,
    OPT_VAL_TEXT,
    OPT_VAL_TOKENS,
    OPT_EVAL_EVERY,
    OPT_VAL_MAX,
    OPT_POD_TYPE,
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
    [OPT_CHECKPOINT_DIR] = {"checkpoint-dir", 0, "DIR", "write checkpoints of the whole training state here (made if missing)"},
    [OPT_CHECKPOINT_EVERY] = {"checkpoint-every", 0, "N", "updates between checkpoints [one epoch]; one is also written at the end and on SIGINT or SIGTERM"},
    [OPT_KEEP] = {"keep", 0, "K", "checkpoints to keep, the newest [3]"},
    [OPT_RESUME] = {"resume", 'r', "DIR", "continue from the newest checkpoint of DIR that loads, on this configuration's layout"},
    [OPT_RESUME_ANYWAY] = {"resume-anyway", 0, NULL, "--resume even where the configuration changes the mathematics"},
    [OPT_TEXT] = {"text", 0, "FILE", "train a token model on the bytes of FILE (vocabulary 256), the last 10% held out"},
    [OPT_TOKENS] = {"tokens", 0, "FILE", "train a token model on llm.c's token file FILE, the last 10% held out"},
    [OPT_VAL_TEXT] = {"val-text", 0, "FILE", "validate on the bytes of FILE instead"},
    [OPT_VAL_TOKENS] = {"val-tokens", 0, "FILE", "validate on llm.c's token file FILE instead"},
    [OPT_EVAL_EVERY] = {"eval-every", 0, "N", "token models: the validation loss every N updates too"},
    [OPT_VAL_MAX] = {"val-max", 0, "N", "token models: validate on the first N held-out samples; 0: all [4096]"},
    [OPT_POD_TYPE] = {"pod-type", 0, "POD", "an IPUConfig of Optimum Graphcore 0.2.1-0.6.0: the pod type (pod4, pod16, ...) whose values to take [the file's pod_type, else \"default\"]"},
    {NULL, 0, NULL, NULL},
};

/* The signal that asked the run to stop, 0 while none did. The first
** SIGINT or SIGTERM stops it after the current host call, with a
** checkpoint; the handler then steps aside, so a second one ends the
** process at once. */
static volatile sig_atomic_t stop_signal;

static void on_stop(int sig) { stop_signal = sig; }

static void catch_stops(bool on) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on ? on_stop : SIG_DFL;
    sa.sa_flags = on ? (int)(SA_RESETHAND | SA_RESTART) : 0; /* writes under way finish */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    const char *model_path = NULL, *config_path = NULL, *data = RP_FASHION_MNIST_DIR;
    const char *save = NULL, *load = NULL, *json_log = NULL;
    long long epochs = 0, updates = 0, log_every = 0;
    bool use_mpi = false, allow_nonfinite = false;
    const char *trace = NULL, *plan = NULL, *ckdir = NULL, *resume = NULL, *pod_type = NULL;
    long long ck_every = 0, keep = 3, eval_every = 0, val_max = 4096;
    const char *text = NULL, *val = NULL;
    bool text_llmc = false, val_llmc = false;
    bool resume_anyway = false;
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
        case OPT_CHECKPOINT_DIR: ckdir = arg; break;
        case OPT_CHECKPOINT_EVERY:
            if (!cli_int("checkpoint-every", arg, 1, 1LL << 40, &ck_every))
                return 2;
            break;
        case OPT_KEEP:
            if (!cli_int("keep", arg, 1, 1000000, &keep))
                return 2;
            break;
        case OPT_RESUME: resume = arg; break;
        case OPT_RESUME_ANYWAY: resume_anyway = true; break;
        case OPT_TEXT:
        case OPT_TOKENS:
            text = arg;
            text_llmc = o == OPT_TOKENS;
            break;
        case OPT_VAL_TEXT:
        case OPT_VAL_TOKENS:
            val = arg;
            val_llmc = o == OPT_VAL_TOKENS;
            break;
        case OPT_POD_TYPE: pod_type = arg; break;
        case OPT_EVAL_EVERY:
            if (!cli_int("eval-every", arg, 1, 1LL << 40, &eval_every))
                return 2;
            break;
        case OPT_VAL_MAX:
            if (!cli_int("val-max", arg, 0, 1LL << 40, &val_max))
                return 2;
            break;
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
    if (load && resume) {
        cli_error(cmd, "give --load (weights only) or --resume (the whole state), not both");
        return 2;
    }
    if (val && !text) {
        cli_error(cmd, "--val-text and --val-tokens go with --text or --tokens");
        return 2;
    }
    if ((ck_every || keep != 3) && !ckdir) {
        cli_error(cmd, "--checkpoint-every and --keep need --checkpoint-dir");
        return 2;
    }
    rp_error err;
    rp_model *m = NULL;
    rp_config cfg;
    rp_dataset *train = NULL, *test = NULL;
    rp_session *s = NULL;
    rp_comm *comm;
    FILE *jl = NULL;
    ck_writer writer = {0};
    rp_checkpoint resumed = {0}; /* --resume's, until the session takes it */
    char resumed_path[4096] = "";
    int rc = 1;
    bool lead; /* prints: rank 0 under MPI */
    if (!cli_mpi_start(cmd, use_mpi, &argc, &argv, &comm, &lead))
        return 1;
    if (rp_model_load(&m, model_path, &err) || rp_config_load_file_opts(&cfg, config_path, &(rp_config_load_options){.pod_type = pod_type},
                                 &err))
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
    char what[2][600];
    if (text) {
        if (train_load_text(m, text, text_llmc, val, val_llmc, &train, &test, &err))
            goto fail;
        snprintf(what[0], sizeof what[0], "the training tokens of %s", text);
        snprintf(what[1], sizeof what[1], "the validation tokens of %s", val ? val : text);
    } else {
        if (rp_dataset_load_idx(&train, data, true, &err) ||
            rp_dataset_load_idx(&test, data, false, &err))
            goto fail;
        snprintf(what[0], sizeof what[0], "the training set of %s", data);
        snprintf(what[1], sizeof what[1], "the test set of %s", data);
    }
    /* a token model validates on the first --val-max held-out samples: the
    ** whole tenth of a large token file took ten times the run */
    int nval = test->n;
    if (text && val_max && val_max < test->n) {
        nval = (int)val_max;
        if (lead)
            fprintf(stderr, "note: validating on the first %d of the %d held-out samples "
                            "(--val-max N; 0 takes all)\n", nval, test->n);
    }
    /* both sets: a test image of another size would be read past its end */
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
    /* the checkpoint to resume, and the directory to write, before any work */
    if ((ckdir || resume) && cfg.schedule == RP_SCHEDULE_PIPEDREAM_2BW) {
        rp_fail(&err, RP_ERR_INVALID,
                "%s: schedule pipedream_2bw keeps two versions of the weights and a checkpoint "
                "holds one, so --checkpoint-dir and --resume do not go with it; --save writes "
                "the weights at the end",
                config_path);
        goto fail;
    }
    if (resume) {
        char note[2048], why[200];
        if (rp_checkpoint_latest(resume, &resumed, resumed_path, sizeof resumed_path, note,
                                 sizeof note, &err))
            goto fail;
        if (lead && note[0])
            fprintf(stderr, "warning: %s\n", note);
        if (resumed.model != rp_model_fingerprint(m)) {
            rp_fail(&err, RP_ERR_INVALID, "%s was made for another model than %s", resumed_path,
                    model_path);
            goto fail;
        }
        if (!resume_anyway && resumed.samples != train->n) {
            rp_fail(&err, RP_ERR_INVALID,
                    "%s was made on a training set of %lld samples, %s has %d: the sample order "
                    "would differ (--resume-anyway continues all the same)",
                    resumed_path, resumed.samples, data, train->n);
            goto fail;
        }
        if (!resume_anyway && !rp_checkpoint_compatible(&resumed.config, &cfg, why, sizeof why)) {
            rp_fail(&err, RP_ERR_INVALID,
                    "%s: %s differs from the checkpoint's configuration and changes the "
                    "mathematics (--resume-anyway continues all the same)",
                    config_path, why);
            goto fail;
        }
    }
    /* ranks that run other commands would wait for ever in collectives the
    ** others never enter: they must agree before the first one */
    if (comm) {
        long long from = resume ? resumed.state.updates : -1;
        long long length[2] = {updates, epochs}, every[2] = {ckdir != NULL, ck_every};
        const char *what[] = {"repipe's version", "the model", "the configuration",
                              "the training data", "the test or validation data",
                              "the update resumed from", "--updates or --epochs",
                              "--checkpoint-dir and --checkpoint-every", "--save", "--trace",
                              "--eval-every and --val-max"};
        uint32_t digest[] = {rp_crc32(0, rp_version(), strlen(rp_version())),
                             rp_model_fingerprint(m),
                             cli_config_digest(&cfg),
                             cli_dataset_digest(train),
                             cli_dataset_digest(test),
                             rp_crc32(0, &from, sizeof from),
                             rp_crc32(0, length, sizeof length),
                             rp_crc32(0, every, sizeof every),
                             save != NULL,
                             trace != NULL,
                             rp_crc32(rp_crc32(0, &eval_every, sizeof eval_every), &nval,
                                      sizeof nval)};
        if (rp_comm_agree(comm, what, digest, (int)(sizeof digest / sizeof digest[0]), &err))
            goto fail;
    }
    if (lead && ckdir &&
        rp_checkpoint_dir_open(ckdir, resume ? resumed.run : NULL, resume ? resumed_path : NULL,
                               &writer.dir, &err))
        goto fail;
    writer.keep = (int)keep;
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
        if (cfg.schedule >= RP_SCHEDULE_PIPEDREAM)
            printf("  (parameters count the weight versions %s keeps beside the weights)\n",
                   rp_schedule_name(cfg.schedule));
    }
    if (load) {
        rp_weights *w;
        if (cli_load_model_weights(load, m, &w, &err))
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
    /* every output is checked before training, not after it */
    if ((lead && save && train_check_writable("--save", save, &err)) ||
        (trace && train_check_writable("--trace", trace, &err)))
        goto fail;
    if (lead && json_log && !(jl = fopen(json_log, "w"))) {
        rp_fail(&err, RP_ERR_IO, "--json-log %s: cannot write: %s", json_log, strerror(errno));
        goto fail;
    }
    if (jl) /* whole lines, as they happen: a killed run leaves no half record */
        setvbuf(jl, NULL, _IOLBF, 0);
    long long start = 0; /* updates done before this run: a checkpoint's */
    if (resume) {
        rp_status rs = rp_session_set_state(s, &resumed.state, &err);
        start = resumed.state.updates;
        if (!rs && lead)
            printf("resuming from %s: update %lld (written by %d worker%s, %d stage%s, %s "
                   "backend)\n",
                   resumed_path, start, resumed.workers, resumed.workers == 1 ? "" : "s",
                   resumed.stages, resumed.stages == 1 ? "" : "s", resumed.backend);
        rp_checkpoint_free(&resumed);
        if (rs)
            goto fail;
    }
    rp_derived d;
    rp_config_derive(&cfg, &d);
    rp_stream stream;
    if (rp_stream_init(&stream, cfg.seed, train->n, (int)d.samples_per_update, &err))
        goto fail;
    stream.sequential = cfg.sequential_data;
    long long per_epoch = rp_stream_updates_per_epoch(&stream);
    /* --updates and --epochs count from the run's beginning, resumed or not */
    long long total = updates ? updates : (epochs ? epochs : 1) * per_epoch;
    int D = cfg.device_iterations;
    long long calls = total > start ? (total - start) / D : 0;
    if (calls < 1 && !resume) {
        rp_fail(&err, RP_ERR_INVALID, "%lld updates are fewer than one host call (%d updates)",
                total, D);
        rp_stream_free(&stream);
        goto fail;
    }
    if (calls < 1 && lead)
        printf("the checkpoint is at update %lld of %lld: nothing left to train\n", start, total);
    if (total > start && (total - start) % D && lead)
        fprintf(stderr, "note: running %lld updates, a whole number of host calls of %d\n",
                calls * D, D);
    if (!ck_every)
        ck_every = per_epoch;
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
    if (lead && calls > 0)
        printf("training %s on %d samples (%lld updates of %lld samples, %lld per epoch)\n",
           model_path, train->n, calls * D, d.samples_per_update, per_epoch);
    double t0 = rp_now(), ema = -1;
    long long next_log = log_every, next_ck = ck_every;
    long long stopped = 0; /* the signal that stopped the run */
    rp_status st = RP_OK;
    catch_stops(true);
    for (long long c = 0; c < calls && !st; c++) {
        for (int k = 0; k < D && !st; k++)
            st = rp_stream_update(&stream, start + c * D + k,
                                  ids + (size_t)k * d.samples_per_update, &err);
        if (st)
            break;
        rp_result r; /* the workers copy their own rows */
        if ((st = rp_session_run_samples(s, train, ids, &r, &err)))
            break;
        double loss = train_result_loss(&r);
        if (!isfinite(loss) && !cfg.auto_loss_scaling) { /* the weights are lost: say so */
            st = rp_fail(&err, RP_ERR_INVALID,
                         "update %lld: the loss is %g, training diverged; nothing is saved%s "
                         "(lower optimizer.lr, now %g, or set auto_loss_scaling to skip such "
                         "updates)",
                         start + (c + 1) * D, loss,
                         ckdir ? ", and the newest checkpoint is the last good one" : "",
                         cfg.optimizer.lr);
            break;
        }
        ema = ema < 0 ? loss : 0.95 * ema + 0.05 * loss;
        long long done = (c + 1) * D, at = start + done;
        train_progress pr = {.s = s, .update = at, .first = start, .done = done,
                             .total = calls * D, .per_epoch = per_epoch,
                             .samples_per_update = d.samples_per_update, .loss = loss,
                             .ema = ema, .elapsed = rp_now() - t0,
                             .loss_scaling = cfg.auto_loss_scaling};
        bool log = done >= next_log || c == calls - 1;
        if (log)
            next_log += log_every;
        train_report_progress(&pr, tty, lead, log, jl);
        if (text && eval_every && at % eval_every == 0) { /* every rank: collective */
            double vl;
            if ((st = rp_session_loss(s, test->x, test->labels, nval, &vl, &err)))
                break;
            if (lead)
                printf("update %lld  validation loss %.4f\n", at, vl);
            if (jl)
                fprintf(jl, "{\"update\":%lld,\"validation_loss\":%.6f}\n", at, vl);
        }
        /* a stop asked of any rank stops them all, after the same update */
        float asked = (float)stop_signal;
        if (comm && (st = rp_comm_allreduce(comm, NULL, &asked, 1, &err)))
            break;
        if (asked > 0)
            stopped = stop_signal ? stop_signal : SIGTERM;
        if (ckdir && (stopped || at >= next_ck || c == calls - 1)) {
            while (next_ck <= at)
                next_ck += ck_every;
            if ((st = train_checkpoint(&writer, s, m, &cfg, comm != NULL, lead, train->n, &err)))
                break;
        }
        if (stopped) {
            if (tty)
                printf("\n");
            if (lead)
                fprintf(stderr, "stopped by %s after update %lld%s\n",
                        stopped == SIGINT ? "SIGINT" : "SIGTERM", at,
                        ckdir ? ": a checkpoint of it is written" : "");
            if (jl)
                fprintf(jl, "{\"stopped\":\"%s\",\"update\":%lld}\n",
                        stopped == SIGINT ? "SIGINT" : "SIGTERM", at);
            break;
        }
    }
    catch_stops(false);
    if (!st) /* the last checkpoint is on disk before anything else */
        st = train_finish_checkpoint(&writer, &err);
    if (tty)
        printf("\n");
    free(ids);
    rp_stream_free(&stream);
    if (st)
        goto fail;
    if (trace)
        train_write_trace(s, trace, comm ? rp_comm_rank(comm) : -1, lead);
    if (stopped) { /* no evaluation: what was asked is an end */
        if (!ckdir && save && train_save_weights(s, save, lead, &err))
            goto fail;
        rc = 128 + (int)stopped;
        goto done;
    }
    double acc = 0, vloss = 0;
    double te = rp_now();
    if (text ? rp_session_loss(s, test->x, test->labels, nval, &vloss, &err) /* collective */
             : train_evaluate(s, test, &acc, &err))
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
        printf("training took %.1f s; evaluation of %d samples %.1f s\n", te - t0,
               text ? nval : test->n, rp_now() - te);
        if (text)
            printf("validation loss: %.4f (nats per token; %.4f bits)\n", vloss,
                   vloss / log(2.0));
        else
            printf("test accuracy: %.4f\n", acc);
    }
    if (jl && text)
        fprintf(jl, "{\"eval\":\"validation\",\"samples\":%d,\"loss\":%.6f}\n", nval,
                vloss);
    else if (jl)
        fprintf(jl, "{\"eval\":\"test\",\"samples\":%d,\"accuracy\":%.6f}\n", test->n, acc);
    if (save && train_save_weights(s, save, lead, &err))
        goto fail;
    rc = 0;
    goto done;
fail:
    cli_error(cmd, "%s", err.msg);
    cli_mpi_abort(comm, err.msg);
done:
    if (train_finish_checkpoint(&writer, &err)) /* a write still under way after a failure */
        fprintf(stderr, "warning: %s\n", err.msg);
    rp_checkpoint_dir_close(writer.dir);
    rp_checkpoint_free(&resumed);
    if (jl && (ferror(jl) | fclose(jl)))
        fprintf(stderr, "warning: --json-log %s: writing failed\n", json_log);
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
    "train a model on an IDX dataset, or a token model on text, and report its test accuracy or validation loss",
    "--model FILE --config FILE [--epochs N | --updates N] [options]",
    "The sample order is fixed by the configuration's seed and the epoch. With\n"
    "--checkpoint-dir the whole training state is written every --checkpoint-every\n"
    "updates, at the end, and when SIGINT or SIGTERM stops the run (exit 130 or\n"
    "143; a second signal ends it at once). --resume continues from the newest\n"
    "checkpoint, on any layout of the same mathematics; --updates and --epochs\n"
    "count from the run's beginning. On a\n"
    "terminal a progress bar shows samples/s, the loss and the time left;\n"
    "otherwise one line is printed every --log-every updates.\n"
    "With --backend mpi, start it as 'mpirun -np R repipe train ... --backend mpi',\n"
    "R being the workers the configuration needs.",
    OPTS,
    run,
};
