/*
** What repipe train is made of besides its loop (train_parts.c): the
** checkpoint writer, the outputs it checks, the evaluation and the text.
*/
#ifndef REPIPE_TOOLS_TRAIN_PARTS_H
#define REPIPE_TOOLS_TRAIN_PARTS_H

#include <pthread.h>
#include <stdbool.h>

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

#endif /* REPIPE_TOOLS_TRAIN_PARTS_H */
