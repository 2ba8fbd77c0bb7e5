/*
** What repipe train is made of: its options and the state of a run, the
** checkpoint writer, the outputs it checks, the evaluation and the text
** (train_parts.c); the lines that report progress and the trace
** (train_report.c); the loop over host calls (train_loop.c).
*/
#ifndef REPIPE_TOOLS_TRAIN_PARTS_H
#define REPIPE_TOOLS_TRAIN_PARTS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include "cli.h"
#include "repipe/repipe.h"

/* Checkpoints are written behind the training: the state is taken at the
** update (every rank gives its own, rank 0 keeps the whole), and a thread
** of rank 0 writes and fsyncs the file while the next updates run. A write
** still under way is finished before the next checkpoint and before exit,
** and its failure fails the run then. */
typedef struct ck_writer {
    pthread_t thread;
    bool busy;
    rp_checkpoint ck;
    rp_checkpoint_dir *dir; /* rank 0's, held for the run */
    int keep;
    rp_status status;
    rp_error err;
} ck_writer;

/* Takes the state at this update (collective) and, on rank 0, writes it
** behind the training, after the write under way if any. */
rp_status train_checkpoint(ck_writer *cw, rp_session *s, const rp_model *m, const rp_config *cfg,
                           bool mpi, bool lead, long long samples, rp_error *err);
/* Waits for the write under way, if any; its status. */
rp_status train_finish_checkpoint(ck_writer *cw, rp_error *err);

/* Fails, naming the path, when a file cannot be written there: before
** training, not after it. */
rp_status train_check_writable(const char *what, const char *path, rp_error *err);
/* Every rank gives its weights, rank 0 writes them. */
rp_status train_save_weights(rp_session *s, const char *path, bool lead, rp_error *err);
/* The mean loss of a host call's result. */
double train_result_loss(const rp_result *r);
/* Accuracy of a session on a dataset, predicting in chunks. */
rp_status train_evaluate(rp_session *s, const rp_dataset *d, double *acc, rp_error *err);
/* A token model's data: the tokens of a file (its bytes, or llm.c's token
** file), cut into the model's T-token samples; validation from another
** file, or the last 10 % of the tokens. */
rp_status train_load_text(const rp_model *m, const char *path, bool llmc, const char *val,
                          bool val_llmc, rp_dataset **train, rp_dataset **test, rp_error *err);

/* One host call's place in the run, for the lines that report it. */
typedef struct train_progress {
    rp_session *s;
    long long update, first;   /* the update reached; the run's first (resumed: later than 0) */
    long long done, total;     /* updates of this run done, and to do */
    long long per_epoch, samples_per_update;
    double loss, ema;          /* this call's mean loss; its moving average */
    double elapsed;            /* seconds since the run's first call */
    bool loss_scaling;
} train_progress;
/* On a terminal, redraws the progress bar; where `log`, prints the update's
** line (lead rank, not on a terminal) and writes its JSON record to jl
** (when not NULL). */
void train_report_progress(const train_progress *p, bool tty, bool lead, bool log, FILE *jl);
/* Writes the session's trace to path (rank >= 0: path.RANK, one a rank);
** a trace that cannot be written is a warning, not a failed run. */
void train_write_trace(rp_session *s, const char *path, int rank, bool lead);
/* What repipe train's command line asked for. */
typedef struct train_opts {
    const char *model_path, *config_path, *data, *save, *load, *json_log;
    const char *trace, *plan, *ckdir, *resume, *pod_type, *text, *val;
    long long epochs, updates, log_every, ck_every, keep, eval_every, val_max;
    bool use_mpi, allow_nonfinite, text_llmc, val_llmc, resume_anyway;
} train_opts;


/* What a run holds from its start to its end (cmd_train.c's run frees it). */
typedef struct train_job {
    cli_job j;      /* the model, the datasets, the session, MPI's communicator */
    rp_config cfg;
    char what[2][600]; /* the training and test sets, for messages */
    int nval;       /* samples of the test set evaluated */
    FILE *jl;       /* --json-log */
    ck_writer writer;
    rp_checkpoint resumed; /* --resume's, until the session takes it */
    char resumed_path[4096];
    long long start; /* updates done before this run: a checkpoint's */
} train_job;

/* The training: every host call (each its updates, the progress line, the
** validation and the checkpoint due; SIGINT or SIGTERM stop it after the
** call), then the last checkpoint on disk and the trace written (train_loop.c).
** *stopped: the signal that stopped it, 0 if none did; *t0 when it began. */
rp_status train_loop_run(const train_opts *o, train_job *t, long long *stopped, double *t0,
                         rp_error *err);
#endif /* REPIPE_TOOLS_TRAIN_PARTS_H */
