/*
** What a session's workers hold (the memory plan), and their traces.
*/
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "session_impl.h"
#include "../sched/sharding.h"

/* ---- memory and traces -------------------------------------------------------------- */

/* Floats of optimizer state a worker of `stage` holds: each run of its
** variables that share a grouping, or, sharded, one shard of it; *shards
** receives the floats of the reduce-scattered runs' shards (their reduced
** gradients; a fused run needs none). */
static size_t stage_state_floats(const rp_session *s, int stage, size_t *shards) {
    /* the last tensor rank's: it holds the most, a vocabulary's larger share */
    const rp_model *m = s->T > 1 ? s->tpm[s->T - 1] : s->m;
    int l0 = s->first[stage], l1 = s->first[stage + 1];
    size_t total = 0, run = 0;
    int run_q = -1;
    for (int v = 0; v <= m->num_vars; v++) {
        int q = -1;
        if (v < m->num_vars && m->vars[v].layer >= l0 && m->vars[v].layer < l1) {
            q = 0;
            while (!rp_grouping_equal(&s->groupings[q], &s->var_group[v]))
                q++;
            q = 2 * q + m->vars[v].split; /* runs end where a split begins or ends */
        } else if (v < m->num_vars) {
            continue;
        }
        if (q != run_q && run) { /* close the run */
            int k = s->groupings[run_q / 2].group_size * rp_config_stage_replicas(&s->cfg, stage);
            bool sharded = rpi_sharded(&s->cfg, k, s->state_per_param);
            total += (sharded ? (run + k - 1) / k : run) * s->state_per_param;
            *shards += sharded && !rpi_fused_run(s, k, true) ? (run + k - 1) / k : 0;
            run = 0;
        }
        if (q >= 0) {
            run += m->vars[v].count;
            run_q = q;
        }
    }
    return total;
}

rp_status rp_session_memory(const rp_session *s, int stage, rp_memory *out, rp_error *err) {
    if (stage < 0 || stage >= s->P)
        return rp_fail(err, RP_ERR_INVALID, "stage %d: the pipeline has %d stages", stage, s->P);
    *out = s->mem[stage];
    return RP_OK;
}

/* What a worker of `stage` holds, from a net of the stage: of its last
** tensor rank, which holds the most (where a vocabulary splits unevenly,
** the larger share). */
rp_status rpi_plan_memory(const rp_session *s, int stage, rp_memory *out, rp_error *err) {
    const worker *w = NULL;
    for (int i = 0; i < s->nlocal && !w; i++)
        if (s->w[i].stage == stage && s->w[i].net && s->w[i].tensor_rank == s->T - 1)
            w = &s->w[i];
    rp_net *tmp = NULL;
    const rp_net *net = w ? w->net : NULL;
    if (!net) { /* under MPI, another rank's stage: measure a net of it */
        rp_net_options no = rpi_net_options(&s->cfg, stage, false);
        rp_status st = rp_net_create_with(s->T > 1 ? s->tpm[s->T - 1] : s->m, s->first[stage],
                                          s->first[stage + 1], s->B, &no,
                                          &tmp, err);
        if (st)
            return st;
        net = tmp;
    }
    int slots = 0; /* the stage's largest in-flight bound */
    for (int k = 0; k < s->W; k++)
        if (s->plan->w[k].stage == stage && s->plan->w[k].slots > slots)
            slots = s->plan->w[k].slots;
    size_t n = rp_net_num_params(net);
    out->params = sizeof(float) * n;
    if (s->cfg.schedule == RP_SCHEDULE_PIPEDREAM)
        out->params += sizeof(float) * n * (size_t)rpi_pipedream_versions(s, stage, slots);
    if (s->cfg.schedule == RP_SCHEDULE_PIPEDREAM_2BW) /* the older version */
        out->params += sizeof(float) * n;
    out->grads = sizeof(float) * n;
    /* sharded: each worker keeps its shard of the state */
    size_t shards = 0;
    out->optimizer = sizeof(float) * stage_state_floats(s, stage, &shards);
    out->grads += sizeof(float) * shards;
    if (s->cfg.reduction_bucket_mb > 0 && s->backend == RP_BACKEND_MPI) /* an exchange's copy */
        out->grads += sizeof(float) * n;
    if (s->cfg.optimizer_state_offchip && out->optimizer) { /* one chunk in memory */
        size_t chunk = sizeof(float) * RP_OFFCHIP_CHUNK * s->state_per_param;
        out->optimizer = out->optimizer < chunk ? out->optimizer : chunk;
    }
    out->activations = rp_acts_bytes(net, s->B) * (size_t)slots;
    out->scratch = rp_net_scratch_bytes(net);
    rp_net_free(tmp);
    return RP_OK;
}

rp_status rp_session_trace(rp_session *s, bool on, rp_error *err) {
    if (on && !s->tracing) {
        for (int i = 0; i < s->nlocal; i++) {
            worker *w = &s->w[i];
            if (!w->trace) {
                w->trace = malloc(sizeof(trace_event) * RP_TRACE_EVENTS);
                if (!w->trace)
                    return rp_fail(err, RP_ERR_NOMEM,
                                   "out of memory for the trace of worker %d (%d events)", w->id,
                                   RP_TRACE_EVENTS);
                w->trace_cap = RP_TRACE_EVENTS;
            }
        }
        s->t_origin = rp_now();
    }
    s->tracing = on;
    return RP_OK;
}

long long rp_session_trace_dropped(const rp_session *s) {
    long long n = 0;
    for (int i = 0; i < s->nlocal; i++)
        n += s->w[i].trace_dropped;
    return n;
}

/* The trace is built in memory and renamed into place: a run stopped while
** writing it leaves the last trace whole. */
rp_status rp_session_write_trace(const rp_session *s, const char *path, rp_error *err) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return rp_fail(err, RP_ERR_NOMEM, "%s: out of memory for the trace", path);
    fprintf(f, "{\"traceEvents\":[\n");
    bool first = true;
    const rp_workplan *pl = s->plan;
    for (int i = 0; i < s->nlocal; i++) {
        const worker *w = &s->w[i];
        /* the chunked schedules: a device's chunks on its track, each event naming its stage */
        int tid = pl->devices ? pl->device_of[w->id] : w->id;
        char rank[32] = "", chunk[24] = "";
        if (s->T > 1)
            snprintf(rank, sizeof rank, ", tensor rank %d", w->tensor_rank);
        if (pl->devices)
            snprintf(chunk, sizeof chunk, " (stage %d)", w->stage);
        if (pl->devices && pl->dev[tid].worker[0] == w->id) {
            /* (dualpipe's device holds a stage of each of two replicas) */
            bool paired = rp_config_paired(&s->cfg);
            char stages[128] = "", of[32] = "";
            for (int x = 0, n = 0; x < pl->workers && n < (int)sizeof stages - 24; x++)
                if (pl->device_of[x] == tid)
                    n += snprintf(stages + n, sizeof stages - n, paired ? "%s%d of replica %d"
                                  : "%s%d", n ? ", " : "", pl->w[x].stage, pl->w[x].replica);
            if (!paired)
                snprintf(of, sizeof of, "replica %d, ", w->replica);
            fprintf(f, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                       "\"args\":{\"name\":\"worker %d: %sstages %s (%s)\"}}",
                    first ? "" : ",\n", tid, tid, of, stages,
                    s->cfg.schedule == RP_SCHEDULE_INTERLEAVED ? "interleaved"
                                                               : rp_schedule_name(s->cfg.schedule));
            if (w->last_back >= 0) /* (a device's chunks all sum in buckets, or none) */
                fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                           "\"args\":{\"name\":\"worker %d: its chunks' gradients' buckets\"}}",
                        tid + RPI_BUCKET_TRACK, tid);
        }
        else if (!pl->devices) /* (worker 0 leads device 0: the file opens with a name) */
            fprintf(f, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                       "\"args\":{\"name\":\"worker %d: replica %d, stage %d.%d%s\"}}",
                    first ? "" : ",\n", tid, w->id, w->replica, w->stage, w->stage_replica, rank);
        first = false;
        if (w->last_back >= 0 && !pl->devices)
            fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                       "\"args\":{\"name\":\"worker %d: its gradients' buckets\"}}",
                    tid + RPI_BUCKET_TRACK, w->id);
        if (w->trace_dropped) /* said where the reader looks: on the worker's track */
            fprintf(f, ",\n{\"name\":\"%lld later operations not recorded (the first %d are)\","
                       "\"ph\":\"i\",\"s\":\"t\",\"pid\":0,\"tid\":%d,\"ts\":%.3f}",
                    w->trace_dropped, w->trace_cap, tid,
                    w->ntrace ? (w->trace[w->ntrace - 1].t1 - s->t_origin) * 1e6 : 0.0);
        for (int e = 0; e < w->ntrace; e++) {
            const trace_event *ev = &w->trace[e];
            char name[64];
            const char *kind = ev->kind == RPI_TRACE_TP_FORWARD    ? "tensor all-reduce (forward)"
                               : ev->kind == RPI_TRACE_TP_BACKWARD ? "tensor all-reduce (backward)"
                               : ev->kind == RPI_TRACE_TP_GATHER   ? "tensor all-gather (loss)"
                               : ev->kind == RPI_TRACE_EP_ALLTOALL ? "expert all-to-all"
                               : ev->kind == RPI_TRACE_BUCKET      ? "reduce bucket"
                                                                   : rp_op_name((rp_op_kind)ev->kind);
            if (ev->mb >= 0)
                snprintf(name, sizeof name, "%s %d%s", kind, ev->mb, chunk);
            else
                snprintf(name, sizeof name, "%s%s", kind, chunk);
            fprintf(f,
                    ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,"
                    "\"ts\":%.3f,\"dur\":%.3f}",
                    name, kind, ev->kind == RPI_TRACE_BUCKET ? tid + RPI_BUCKET_TRACK : tid,
                    (ev->t0 - s->t_origin) * 1e6, (ev->t1 - ev->t0) * 1e6);
        }
    }
    /* where ts 0 is on the host's monotonic clock: the traces of the ranks
    ** of one host line up */
    fprintf(f, "\n],\"otherData\":{\"clock_origin_s\":%.9f}}\n", s->t_origin);
    return rp_write_memstream_atomic(f, &text, &len, path, "the trace", err);
}
