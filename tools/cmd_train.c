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

/* A bounded integer option; false (said) when out of bounds. */
static bool int_opt(int o, const char *arg, train_opts *t) {
    switch (o) {
    case OPT_EPOCHS: return cli_int("epochs", arg, 1, 1000000, &t->epochs);
    case OPT_UPDATES: return cli_int("updates", arg, 1, 1LL << 40, &t->updates);
    case OPT_LOG_EVERY: return cli_int("log-every", arg, 1, 1LL << 40, &t->log_every);
    case OPT_CHECKPOINT_EVERY: return cli_int("checkpoint-every", arg, 1, 1LL << 40, &t->ck_every);
    case OPT_KEEP: return cli_int("keep", arg, 1, 1000000, &t->keep);
    case OPT_EVAL_EVERY: return cli_int("eval-every", arg, 1, 1LL << 40, &t->eval_every);
    case OPT_VAL_MAX: return cli_int("val-max", arg, 0, 1LL << 40, &t->val_max);
    }
    return true;
}

/* Reads the options into t; -1 to go on, else the exit code. */
static int parse_options(const cli_cmd *cmd, int argc, char **argv, train_opts *t) {
    *t = (train_opts){.data = RP_FASHION_MNIST_DIR, .keep = 3, .val_max = 4096};
    bool help;
    const char *arg;
    for (int o; (o = cli_next_option(cmd, argc, argv, &arg, &help)) != -1;) {
        if (o == -2)
            return help ? 0 : 2;
        if (!int_opt(o, arg, t))
            return 2;
        switch (o) {
        case OPT_MODEL: t->model_path = arg; break;
        case OPT_CONFIG: t->config_path = arg; break;
        case OPT_DATA: t->data = arg; break;
        case OPT_SAVE: t->save = arg; break;
        case OPT_LOAD: t->load = arg; break;
        case OPT_JSON_LOG: t->json_log = arg; break;
        case OPT_TRACE: t->trace = arg; break;
        case OPT_PLAN: t->plan = arg; break;
        case OPT_ALLOW_NONFINITE: t->allow_nonfinite = true; break;
        case OPT_CHECKPOINT_DIR: t->ckdir = arg; break;
        case OPT_RESUME: t->resume = arg; break;
        case OPT_RESUME_ANYWAY: t->resume_anyway = true; break;
        case OPT_POD_TYPE: t->pod_type = arg; break;
        case OPT_TEXT:
        case OPT_TOKENS:
            t->text = arg;
            t->text_llmc = o == OPT_TOKENS;
            break;
        case OPT_VAL_TEXT:
        case OPT_VAL_TOKENS:
            t->val = arg;
            t->val_llmc = o == OPT_VAL_TOKENS;
            break;
        case OPT_BACKEND:
            if (!cli_backend(cmd, arg, &t->use_mpi))
                return 2;
            break;
        }
    }
    const char *wrong = !t->model_path || !t->config_path
                            ? "--model and --config are required (see 'repipe train --help')"
                        : t->epochs && t->updates ? "give --epochs or --updates, not both"
                        : t->load && t->resume
                            ? "give --load (weights only) or --resume (the whole state), not both"
                        : t->val && !t->text ? "--val-text and --val-tokens go with --text or --tokens"
                        : (t->ck_every || t->keep != 3) && !t->ckdir
                            ? "--checkpoint-every and --keep need --checkpoint-dir"
                            : NULL;
    if (wrong) {
        cli_error(cmd, "%s", wrong);
        return 2;
    }
    return -1;
}

/* The configuration, and what --plan replaces of it (said). */
static rp_status load_config(const train_opts *o, train_job *t, rp_error *err) {
    if (rp_config_load_file_opts(&t->cfg, o->config_path,
                                 &(rp_config_load_options){.pod_type = o->pod_type}, err))
        return RP_ERR_INVALID;
    rp_config *cfg = &t->cfg;
    for (int i = 0; t->j.lead && i < cfg->num_warnings; i++)
        fprintf(stderr, "warning: %s\n", cfg->warnings[i]);
    if (!o->plan)
        return RP_OK;
    char *text;
    size_t len;
    rp_config before = *cfg;
    rp_status ps = rp_read_file(o->plan, &text, &len, err);
    if (!ps) {
        ps = rp_config_apply_plan(cfg, text, len, o->plan, err);
        free(text);
    }
    if (ps || !t->j.lead)
        return ps;
    /* say what the plan replaced of the configuration */
    if (before.replication_factor != cfg->replication_factor)
        printf("%s: replication_factor %d (the configuration's %d)\n", o->plan,
               cfg->replication_factor, before.replication_factor);
    if (before.grouping_set)
        printf("%s: replica_grouping: one group of all %d replicas (the configuration's "
               "group_size %d, stride %d is dropped)\n",
               o->plan, cfg->replication_factor, before.replica_grouping.group_size,
               before.replica_grouping.stride);
    return RP_OK;
}

/* The training and test (or validation) sets, checked against the model
** and the configuration before any worker starts. */
static rp_status load_data(const train_opts *o, train_job *t, rp_error *err) {
    cli_job *j = &t->j;
    if (o->text) {
        if (train_load_text(j->m, o->text, o->text_llmc, o->val, o->val_llmc, &j->train,
                            &j->test, err))
            return RP_ERR_INVALID;
        snprintf(t->what[0], sizeof t->what[0], "the training tokens of %s", o->text);
        snprintf(t->what[1], sizeof t->what[1], "the validation tokens of %s",
                 o->val ? o->val : o->text);
    } else {
        if (rp_dataset_load_idx(&j->train, o->data, true, err) ||
            rp_dataset_load_idx(&j->test, o->data, false, err))
            return RP_ERR_INVALID;
        snprintf(t->what[0], sizeof t->what[0], "the training set of %s", o->data);
        snprintf(t->what[1], sizeof t->what[1], "the test set of %s", o->data);
    }
    /* a token model validates on the first --val-max held-out samples: the
    ** whole tenth of a large token file took ten times the run */
    t->nval = j->test->n;
    if (o->text && o->val_max && o->val_max < j->test->n) {
        t->nval = (int)o->val_max;
        if (j->lead)
            fprintf(stderr, "note: validating on the first %d of the %d held-out samples "
                            "(--val-max N; 0 takes all)\n", t->nval, j->test->n);
    }
    /* both sets: a test image of another size would be read past its end */
    if (rp_dataset_fits(j->train, j->m, t->what[0], err) ||
        rp_dataset_fits(j->test, j->m, t->what[1], err))
        return RP_ERR_INVALID;
    /* before any worker starts: an update the dataset cannot fill */
    rp_derived need;
    rp_config_derive(&t->cfg, &need);
    if (need.samples_per_update > j->train->n)
        return rp_fail(err, RP_ERR_INVALID,
                       "%s: an update takes %lld samples (micro_batch_size x "
                       "gradient_accumulation_steps x replication_factor) but %s has %d",
                       o->config_path, need.samples_per_update, t->what[0], j->train->n);
    return RP_OK;
}

/* The checkpoint to resume, read and held to the model, the data and the
** configuration, before any work. */
static rp_status read_resumed(const train_opts *o, train_job *t, rp_error *err) {
    if ((o->ckdir || o->resume) && t->cfg.schedule == RP_SCHEDULE_PIPEDREAM_2BW)
        return rp_fail(err, RP_ERR_INVALID,
                       "%s: schedule pipedream_2bw keeps two versions of the weights and a "
                       "checkpoint holds one, so --checkpoint-dir and --resume do not go with "
                       "it; --save writes the weights at the end",
                       o->config_path);
    if (!o->resume)
        return RP_OK;
    char note[2048], why[200];
    rp_checkpoint *r = &t->resumed;
    if (rp_checkpoint_latest(o->resume, r, t->resumed_path, sizeof t->resumed_path, note,
                             sizeof note, err))
        return RP_ERR_INVALID;
    if (t->j.lead && note[0])
        fprintf(stderr, "warning: %s\n", note);
    if (r->model != rp_model_fingerprint(t->j.m))
        return rp_fail(err, RP_ERR_INVALID, "%s was made for another model than %s",
                       t->resumed_path, o->model_path);
    if (!o->resume_anyway && r->samples != t->j.train->n)
        return rp_fail(err, RP_ERR_INVALID,
                       "%s was made on a training set of %lld samples, %s has %d: the sample "
                       "order would differ (--resume-anyway continues all the same)",
                       t->resumed_path, r->samples, o->data, t->j.train->n);
    if (!o->resume_anyway && !rp_checkpoint_compatible(&r->config, &t->cfg, why, sizeof why))
        return rp_fail(err, RP_ERR_INVALID,
                       "%s: %s differs from the checkpoint's configuration and changes the "
                       "mathematics (--resume-anyway continues all the same)",
                       o->config_path, why);
    return RP_OK;
}

/* Ranks that run other commands would wait for ever in collectives the
** others never enter: they must agree before the first one. */
static rp_status agree(const train_opts *o, const train_job *t, rp_error *err) {
    if (!t->j.comm)
        return RP_OK;
    long long from = o->resume ? t->resumed.state.updates : -1;
    long long length[2] = {o->updates, o->epochs}, every[2] = {o->ckdir != NULL, o->ck_every};
    const char *what[] = {"repipe's version", "the model", "the configuration",
                          "the training data", "the test or validation data",
                          "the update resumed from", "--updates or --epochs",
                          "--checkpoint-dir and --checkpoint-every", "--save", "--trace",
                          "--eval-every and --val-max"};
    uint32_t digest[] = {rp_crc32(0, rp_version(), strlen(rp_version())),
                         rp_model_fingerprint(t->j.m),
                         cli_config_digest(&t->cfg),
                         cli_dataset_digest(t->j.train),
                         cli_dataset_digest(t->j.test),
                         rp_crc32(0, &from, sizeof from),
                         rp_crc32(0, length, sizeof length),
                         rp_crc32(0, every, sizeof every),
                         o->save != NULL,
                         o->trace != NULL,
                         rp_crc32(rp_crc32(0, &o->eval_every, sizeof o->eval_every), &t->nval,
                                  sizeof t->nval)};
    return rp_comm_agree(t->j.comm, what, digest, (int)(sizeof digest / sizeof digest[0]), err);
}

/* Each stage's memory on a worker, as the session lays it out. */
static rp_status print_memory(const train_job *t, rp_error *err) {
    rp_session *s = t->j.s;
    printf("%d worker%s (%s backend), %d stage%s; memory of a worker (MB):\n",
           rp_session_workers(s), rp_session_workers(s) == 1 ? "" : "s",
           t->j.comm ? "mpi" : "local", rp_session_stages(s),
           rp_session_stages(s) == 1 ? "" : "s");
    printf("  %-6s %11s %10s %10s %12s %8s %8s\n", "stage", "parameters", "gradients",
           "optimizer", "activations", "scratch", "total");
    for (int k = 0; k < rp_session_stages(s); k++) {
        rp_memory mem;
        if (rp_session_memory(s, k, &mem, err))
            return RP_ERR_INVALID;
        size_t total = mem.params + mem.grads + mem.optimizer + mem.activations + mem.scratch;
        printf("  %-6d %11.2f %10.2f %10.2f %12.2f %8.2f %8.2f\n", k, mem.params / 1e6,
               mem.grads / 1e6, mem.optimizer / 1e6, mem.activations / 1e6, mem.scratch / 1e6,
               total / 1e6);
    }
    if (t->cfg.schedule >= RP_SCHEDULE_PIPEDREAM)
        printf("  (parameters count the weight versions %s keeps beside the weights)\n",
               rp_schedule_name(t->cfg.schedule));
    return RP_OK;
}

/* The session, its weights (--load) or whole state (--resume), and every
** output checked writable: before training, not after it. */
static rp_status start_session(const train_opts *o, train_job *t, rp_error *err) {
    cli_job *j = &t->j;
    if (j->lead && o->ckdir &&
        rp_checkpoint_dir_open(o->ckdir, o->resume ? t->resumed.run : NULL,
                               o->resume ? t->resumed_path : NULL, &t->writer.dir, err))
        return RP_ERR_IO;
    t->writer.keep = (int)o->keep;
    if ((j->comm ? rp_session_create_mpi(j->m, &t->cfg, j->comm, &j->s, err)
                 : rp_session_create(j->m, &t->cfg, &j->s, err)))
        return RP_ERR_INVALID;
    if (j->lead && rp_session_cache_note(j->s)[0])
        printf("%s\n", rp_session_cache_note(j->s));
    if (j->lead && print_memory(t, err))
        return RP_ERR_INVALID;
    if (o->load) {
        rp_weights *w;
        if (cli_load_model_weights(o->load, j->m, &w, err))
            return RP_ERR_INVALID;
        rp_status st = o->allow_nonfinite ? RP_OK : rp_weights_check_finite(w, o->load, err);
        if (!st)
            st = rp_session_set_weights(j->s, w, RP_ONE_PER_GROUP, err);
        rp_weights_free(w);
        if (st)
            return st;
    }
    if ((j->lead && o->save && train_check_writable("--save", o->save, err)) ||
        (o->trace && train_check_writable("--trace", o->trace, err)))
        return RP_ERR_IO;
    if (j->lead && o->json_log && !(t->jl = fopen(o->json_log, "w")))
        return rp_fail(err, RP_ERR_IO, "--json-log %s: cannot write: %s", o->json_log,
                       strerror(errno));
    if (t->jl) /* whole lines, as they happen: a killed run leaves no half record */
        setvbuf(t->jl, NULL, _IOLBF, 0);
    if (!o->resume)
        return RP_OK;
    rp_status rs = rp_session_set_state(j->s, &t->resumed.state, err);
    t->start = t->resumed.state.updates;
    if (!rs && j->lead)
        printf("resuming from %s: update %lld (written by %d worker%s, %d stage%s, %s "
               "backend)\n",
               t->resumed_path, t->start, t->resumed.workers,
               t->resumed.workers == 1 ? "" : "s", t->resumed.stages,
               t->resumed.stages == 1 ? "" : "s", t->resumed.backend);
    rp_checkpoint_free(&t->resumed);
    return rs;
}

/* The test accuracy, or a token model's validation loss, said and logged;
** then the weights saved. */
static rp_status evaluate(const train_opts *o, train_job *t, double t0, rp_error *err) {
    rp_session *s = t->j.s;
    const rp_dataset *test = t->j.test;
    bool lead = t->j.lead;
    double acc = 0, vloss = 0, te = rp_now();
    if (o->text ? rp_session_loss(s, test->x, test->labels, t->nval, &vloss, err) /* collective */
                : train_evaluate(s, test, &acc, err))
        return RP_ERR_INVALID;
    if (lead && t->cfg.auto_loss_scaling) {
        double scale;
        long long skipped;
        rp_session_loss_scale(s, &scale, &skipped);
        printf("loss scaling: %lld update%s skipped (gradients not finite); "
               "the scale is now %.10g\n",
               skipped, skipped == 1 ? "" : "s", scale);
    }
    if (lead) {
        printf("training took %.1f s; evaluation of %d samples %.1f s\n", te - t0,
               o->text ? t->nval : test->n, rp_now() - te);
        if (o->text)
            printf("validation loss: %.4f (nats per token; %.4f bits)\n", vloss,
                   vloss / log(2.0));
        else
            printf("test accuracy: %.4f\n", acc);
    }
    if (t->jl && o->text)
        fprintf(t->jl, "{\"eval\":\"validation\",\"samples\":%d,\"loss\":%.6f}\n", t->nval,
                vloss);
    else if (t->jl)
        fprintf(t->jl, "{\"eval\":\"test\",\"samples\":%d,\"accuracy\":%.6f}\n", test->n, acc);
    return o->save ? train_save_weights(s, o->save, lead, err) : RP_OK;
}

static int run(const cli_cmd *cmd, int argc, char **argv) {
    train_opts o;
    int rc = parse_options(cmd, argc, argv, &o);
    if (rc >= 0)
        return rc;
    train_job t = {0};
    rp_error err;
    if (!cli_mpi_start(cmd, o.use_mpi, &argc, &argv, &t.j.comm, &t.j.lead))
        return 1;
    long long stopped = 0;
    double t0 = 0;
    rp_status st = rp_model_load(&t.j.m, o.model_path, &err);
    if (!st)
        st = load_config(&o, &t, &err);
    /* the log shows each update's mean loss over all its micro-batches and
    ** replicas, the same on every layout of a run; output_mode only shapes
    ** what a program gets back from the session */
    t.cfg.output_mode = RP_OUTPUT_ALL;
    if (!st)
        st = load_data(&o, &t, &err);
    if (!st)
        st = read_resumed(&o, &t, &err);
    if (!st)
        st = agree(&o, &t, &err);
    if (!st)
        st = start_session(&o, &t, &err);
    if (!st)
        st = train_loop_run(&o, &t, &stopped, &t0, &err);
    if (!st && stopped) /* no evaluation: what was asked is an end */
        st = !o.ckdir && o.save ? train_save_weights(t.j.s, o.save, t.j.lead, &err) : RP_OK;
    else if (!st)
        st = evaluate(&o, &t, t0, &err);
    rc = st ? 1 : stopped ? 128 + (int)stopped : 0;
    if (st)
        cli_job_fail(cmd, &t.j, &err);
    if (train_finish_checkpoint(&t.writer, &err)) /* a write still under way after a failure */
        fprintf(stderr, "warning: %s\n", err.msg);
    rp_checkpoint_dir_close(t.writer.dir);
    rp_checkpoint_free(&t.resumed);
    if (t.jl && (ferror(t.jl) | fclose(t.jl)))
        fprintf(stderr, "warning: --json-log %s: writing failed\n", o.json_log);
    return cli_job_end(&t.j, rc);
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
