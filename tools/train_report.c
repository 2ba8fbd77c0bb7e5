/*
** What repipe train prints while it runs: the progress bar on a terminal,
** a line every --log-every updates elsewhere, the JSON log's records, and
** the trace at the end.
*/
#include <stdio.h>
#include <string.h>

#include "train_parts.h"

static void fmt_time(double s, char *buf, size_t n) {
    long t = s < 0 ? 0 : (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

void train_report_progress(const train_progress *p, bool tty, bool lead, bool log, FILE *jl) {
    double sps = p->done * p->samples_per_update / p->elapsed;
    char eta[32];
    fmt_time(p->elapsed / p->done * (p->total - p->done), eta, sizeof eta);
    if (tty) {
        int width = 30, filled = (int)(width * p->done / p->total);
        printf("\r[%.*s%s%*s] %3d%%  %lld/%lld  %.0f samples/s  loss %.4f  ETA %s   ", filled,
               "==============================", filled < width ? ">" : "",
               width - filled - (filled < width), "", (int)(100 * p->done / p->total), p->done,
               p->total, sps, p->ema, eta);
        fflush(stdout);
    }
    if (!log)
        return;
    double scale;
    long long skipped;
    rp_session_loss_scale(p->s, &scale, &skipped);
    char ls[192] = "", ljs[192] = "";
    if (p->loss_scaling) {
        snprintf(ls, sizeof ls, "  loss scale %.10g (%lld skipped)", scale, skipped);
        snprintf(ljs, sizeof ljs, ",\"loss_scale\":%.17g,\"skipped_updates\":%lld", scale,
                 skipped);
    }
    double lr, norm; /* the schedule's rate and, when clipping, the norm */
    rp_session_last_update(p->s, &lr, &norm);
    size_t l1 = strlen(ls), l2 = strlen(ljs);
    snprintf(ls + l1, sizeof ls - l1, "  lr %.4g", lr);
    snprintf(ljs + l2, sizeof ljs - l2, ",\"lr\":%.9g", lr);
    if (norm >= 0) {
        l1 = strlen(ls), l2 = strlen(ljs);
        snprintf(ls + l1, sizeof ls - l1, "  grad norm %.4g", norm);
        snprintf(ljs + l2, sizeof ljs - l2, ",\"grad_norm\":%.9g", norm);
    }
    double epoch = (double)p->update / p->per_epoch;
    if (!tty && lead) { /* a log file shows each line as it comes */
        printf("update %lld/%lld  epoch %.2f  loss %.4f  %.0f samples/s  ETA %s%s\n", p->update,
               p->first + p->total, epoch, p->ema, sps, eta, ls);
        fflush(stdout);
    }
    if (jl)
        fprintf(jl,
                "{\"update\":%lld,\"epoch\":%.4f,\"loss\":%.6f,\"samples_per_s\":%.1f,"
                "\"elapsed_s\":%.3f%s}\n",
                p->update, epoch, p->loss, sps, p->elapsed, ljs);
}

void train_write_trace(rp_session *s, const char *trace, int rank, bool lead) {
    char path[4096];
    if (rank >= 0) /* one file per rank */
        snprintf(path, sizeof path, "%s.%d", trace, rank);
    else
        snprintf(path, sizeof path, "%s", trace);
    rp_error terr;
    if (rp_session_write_trace(s, path, &terr))
        fprintf(stderr, "warning: %s\n", terr.msg);
    else if (lead)
        printf("trace written to %s%s\n", trace, rank >= 0 ? ".RANK" : "");
    long long dropped = rp_session_trace_dropped(s);
    if (dropped)
        fprintf(stderr, "warning: %s: %lld operations were not recorded: a worker keeps its "
                        "first %d (trace fewer updates with --updates)\n",
                path, dropped, RP_TRACE_EVENTS);
}
