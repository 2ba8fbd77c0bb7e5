/*
** repipe train's parts (train_parts.h).
*/
#define _POSIX_C_SOURCE 200809L
#include "train_parts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

rp_status train_check_writable(const char *what, const char *path, rp_error *err) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        slash[slash == dir ? 1 : 0] = '\0';
    if (access(dir, W_OK) != 0)
        return rp_fail(err, RP_ERR_IO, "%s %s: cannot write in %s: %s", what, path, dir,
                       strerror(errno));
    if (access(path, F_OK) == 0 && access(path, W_OK) != 0)
        return rp_fail(err, RP_ERR_IO, "%s %s: the file cannot be overwritten: %s", what, path,
                       strerror(errno));
    return RP_OK;
}

static void *write_checkpoint(void *arg) {
    ck_writer *cw = arg;
    char path[4096];
    cw->status = rp_checkpoint_dir_write(cw->dir, &cw->ck, cw->keep, path, sizeof path, &cw->err);
    rp_checkpoint_free(&cw->ck);
    return NULL;
}

rp_status train_finish_checkpoint(ck_writer *cw, rp_error *err) {
    if (!cw->busy)
        return RP_OK;
    pthread_join(cw->thread, NULL);
    cw->busy = false;
    if (cw->status)
        *err = cw->err;
    return cw->status;
}

rp_status train_checkpoint(ck_writer *cw, rp_session *s, const rp_model *m, const rp_config *cfg,
                           bool mpi, bool lead, long long samples, rp_error *err) {
    rp_status st = train_finish_checkpoint(cw, err);
    if (st)
        return st;
    rp_derived d; /* the workers as launched: a chunked schedule's hold several chunks,
                  ** dualpipe's a stage of two replicas */
    rp_config_derive(cfg, &d);
    bool devices = rp_config_chunked(cfg) || rp_config_paired(cfg);
    cw->ck = (rp_checkpoint){.config = *cfg,
                             .model = rp_model_fingerprint(m),
                             .samples = samples,
                             .workers = devices ? rp_config_devices(cfg, &d)
                                                : rp_session_workers(s),
                             .stages = rp_session_stages(s)};
    snprintf(cw->ck.backend, sizeof cw->ck.backend, "%s", mpi ? "mpi" : "local");
    if ((st = rp_session_get_state(s, &cw->ck.state, err)) || !lead) { /* collective */
        rp_checkpoint_free(&cw->ck);
        return st;
    }
    if (pthread_create(&cw->thread, NULL, write_checkpoint, cw) == 0) {
        cw->busy = true;
        return RP_OK;
    }
    write_checkpoint(cw); /* no thread: here and now */
    if (cw->status)
        *err = cw->err;
    return cw->status;
}

rp_status train_save_weights(rp_session *s, const char *path, bool lead, rp_error *err) {
    rp_weights *w;
    rp_status st = rp_session_get_weights(s, RP_ONE_PER_GROUP, &w, err); /* collective */
    if (st)
        return st;
    st = lead ? rp_weights_save(w, path, err) : RP_OK;
    rp_weights_free(w);
    if (!st && lead)
        printf("weights written to %s\n", path);
    return st;
}

double train_result_loss(const rp_result *r) {
    double s = 0;
    for (int i = 0; i < r->count; i++)
        s += r->losses[i];
    return s / r->count;
}

rp_status train_evaluate(rp_session *s, const rp_dataset *d, double *acc, rp_error *err) {
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

rp_status train_load_text(const rp_model *m, const char *path, bool llmc, const char *val,
                           bool val_llmc, rp_dataset **train, rp_dataset **test, rp_error *err) {
    int T = m->input.dim[0];
    rp_status st0 = rp_model_check_tokens(m, "--text and --tokens", err);
    if (st0)
        return st0;
    int32_t *tok, *vtok = NULL;
    size_t n, vn = 0;
    int vocab, vvocab = 0;
    rp_status st = rp_tokens_read(path, llmc, &tok, &n, &vocab, err);
    if (st)
        return st;
    if (val)
        st = rp_tokens_read(val, val_llmc, &vtok, &vn, &vvocab, err);
    size_t cut = val ? n : n - n / 10; /* the last tenth, unless a file validates */
    char a[600], b[600];
    snprintf(a, sizeof a, "%s (the first %zu tokens)", path, cut);
    snprintf(b, sizeof b, "%s (%s)", val ? val : path, val ? "validation" : "the last tenth");
    if (!st)
        st = rp_dataset_from_tokens(tok, cut, T, vocab, a, train, err);
    if (!st)
        st = val ? rp_dataset_from_tokens(vtok, vn, T, vocab > vvocab ? vocab : vvocab, b, test,
                                          err)
                 : rp_dataset_from_tokens(tok + cut, n - cut, T, vocab, b, test, err);
    free(tok), free(vtok);
    return st;
}

