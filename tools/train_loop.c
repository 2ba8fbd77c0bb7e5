/*
** repipe train's loop: the host calls of a run, each its updates, its
** progress line, the validation and the checkpoint due, and the stop that
** SIGINT or SIGTERM asks for.
*/
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/core/util.h"
#include "train_parts.h"

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

/* The loop's state: the host calls to make and where they stand. */
typedef struct train_loop {
    rp_stream stream;
    int64_t *ids;       /* the samples of a host call */
    long long calls, per_epoch, samples_per_update;
    long long log_every, next_log, ck_every, next_ck;
    double t0, ema;
    bool tty;
    long long stopped; /* the signal that stopped the run */
} train_loop;

/* The sample stream and the number of host calls; the last checkpoint
** already at the end says there is nothing left (calls 0). */
static rp_status plan_calls(const train_opts *o, train_job *t, train_loop *l, rp_error *err) {
    rp_derived d;
    rp_config_derive(&t->cfg, &d);
    l->samples_per_update = d.samples_per_update;
    if (rp_stream_init(&l->stream, t->cfg.seed, t->j.train->n, (int)d.samples_per_update, err))
        return RP_ERR_INVALID;
    l->stream.sequential = t->cfg.sequential_data;
    l->per_epoch = rp_stream_updates_per_epoch(&l->stream);
    /* --updates and --epochs count from the run's beginning, resumed or not */
    long long total = o->updates ? o->updates : (o->epochs ? o->epochs : 1) * l->per_epoch;
    int D = t->cfg.device_iterations;
    l->calls = total > t->start ? (total - t->start) / D : 0;
    if (l->calls < 1 && !o->resume)
        return rp_fail(err, RP_ERR_INVALID,
                       "%lld updates are fewer than one host call (%d updates)", total, D);
    bool lead = t->j.lead;
    if (l->calls < 1 && lead)
        printf("the checkpoint is at update %lld of %lld: nothing left to train\n", t->start,
               total);
    if (total > t->start && (total - t->start) % D && lead)
        fprintf(stderr, "note: running %lld updates, a whole number of host calls of %d\n",
                l->calls * D, D);
    l->ck_every = o->ck_every ? o->ck_every : l->per_epoch;
    l->log_every = o->log_every ? o->log_every : l->per_epoch / 10 > 0 ? l->per_epoch / 10 : 1;
    l->next_log = l->log_every;
    l->next_ck = l->ck_every;
    if (!(l->ids = malloc(sizeof(int64_t) * rp_session_samples_per_call(t->j.s))))
        return rp_fail(err, RP_ERR_NOMEM, "out of memory");
    l->tty = lead && !t->j.comm && isatty(STDOUT_FILENO); /* mpirun forwards through a pty */
    if (o->trace && rp_session_trace(t->j.s, true, err))
        return RP_ERR_INVALID;
    if (lead && l->calls > 0)
        printf("training %s on %d samples (%lld updates of %lld samples, %lld per epoch)\n",
               o->model_path, t->j.train->n, l->calls * D, l->samples_per_update, l->per_epoch);
    return RP_OK;
}

/* After update `at`: a stop asked of any rank stops them all, after the
** same update; the checkpoint due (or the stop's) is written. */
static rp_status after_update(const train_opts *o, train_job *t, train_loop *l, long long at,
                              bool last, rp_error *err) {
    float asked = (float)stop_signal;
    rp_status st = t->j.comm ? rp_comm_allreduce(t->j.comm, NULL, &asked, 1, err) : RP_OK;
    if (st)
        return st;
    if (asked > 0)
        l->stopped = stop_signal ? stop_signal : SIGTERM;
    if (o->ckdir && (l->stopped || at >= l->next_ck || last)) {
        while (l->next_ck <= at)
            l->next_ck += l->ck_every;
        if ((st = train_checkpoint(&t->writer, t->j.s, t->j.m, &t->cfg, t->j.comm != NULL,
                                   t->j.lead, t->j.train->n, err)))
            return st;
    }
    if (!l->stopped)
        return RP_OK;
    const char *sig = l->stopped == SIGINT ? "SIGINT" : "SIGTERM";
    if (l->tty)
        printf("\n");
    if (t->j.lead)
        fprintf(stderr, "stopped by %s after update %lld%s\n", sig, at,
                o->ckdir ? ": a checkpoint of it is written" : "");
    if (t->jl)
        fprintf(t->jl, "{\"stopped\":\"%s\",\"update\":%lld}\n", sig, at);
    return RP_OK;
}

/* Host call c: its samples, the updates, the progress line and the
** validation due. */
static rp_status one_call(const train_opts *o, train_job *t, train_loop *l, long long c,
                          rp_error *err) {
    int D = t->cfg.device_iterations;
    rp_session *s = t->j.s;
    for (int k = 0; k < D; k++)
        if (rp_stream_update(&l->stream, t->start + c * D + k,
                             l->ids + (size_t)k * l->samples_per_update, err))
            return RP_ERR_INVALID;
    rp_result r; /* the workers copy their own rows */
    rp_status st = rp_session_run_samples(s, t->j.train, l->ids, &r, err);
    if (st)
        return st;
    double loss = train_result_loss(&r);
    if (!isfinite(loss) && !t->cfg.auto_loss_scaling) /* the weights are lost: say so */
        return rp_fail(err, RP_ERR_INVALID,
                       "update %lld: the loss is %g, training diverged; nothing is saved%s "
                       "(lower optimizer.lr, now %g, or set auto_loss_scaling to skip such "
                       "updates)",
                       t->start + (c + 1) * D, loss,
                       o->ckdir ? ", and the newest checkpoint is the last good one" : "",
                       t->cfg.optimizer.lr);
    l->ema = l->ema < 0 ? loss : 0.95 * l->ema + 0.05 * loss;
    long long done = (c + 1) * D, at = t->start + done;
    train_progress pr = {.s = s, .update = at, .first = t->start, .done = done,
                         .total = l->calls * D, .per_epoch = l->per_epoch,
                         .samples_per_update = l->samples_per_update, .loss = loss,
                         .ema = l->ema, .elapsed = rp_now() - l->t0,
                         .loss_scaling = t->cfg.auto_loss_scaling};
    bool log = done >= l->next_log || c == l->calls - 1;
    if (log)
        l->next_log += l->log_every;
    train_report_progress(&pr, l->tty, t->j.lead, log, t->jl);
    if (o->text && o->eval_every && at % o->eval_every == 0) { /* every rank: collective */
        double vl;
        if ((st = rp_session_loss(s, t->j.test->x, t->j.test->labels, t->nval, &vl, err)))
            return st;
        if (t->j.lead)
            printf("update %lld  validation loss %.4f\n", at, vl);
        if (t->jl)
            fprintf(t->jl, "{\"update\":%lld,\"validation_loss\":%.6f}\n", at, vl);
    }
    return after_update(o, t, l, at, c == l->calls - 1, err);
}

rp_status train_loop_run(const train_opts *o, train_job *t, long long *stopped, double *t0,
                         rp_error *err) {
    train_loop l = {.ema = -1};
    rp_status st = plan_calls(o, t, &l, err);
    l.t0 = *t0 = rp_now();
    if (!st) {
        catch_stops(true);
        for (long long c = 0; c < l.calls && !st && !l.stopped; c++)
            st = one_call(o, t, &l, c, err);
        catch_stops(false);
    }
    if (!st) /* the last checkpoint is on disk before anything else */
        st = train_finish_checkpoint(&t->writer, err);
    if (l.tty)
        printf("\n");
    free(l.ids);
    rp_stream_free(&l.stream);
    if (!st && o->trace)
        train_write_trace(t->j.s, o->trace, t->j.comm ? rp_comm_rank(t->j.comm) : -1,
                          t->j.lead);
    *stopped = l.stopped;
    return st;
}

