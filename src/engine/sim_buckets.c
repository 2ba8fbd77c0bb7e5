/*
** The simulator's model of a reduction in buckets (reduction_bucket_mb):
** which bytes of a stage can start summing when, during its last backward.
** The engine announces its layers from the top down and starts what they
** hold once it is bucket_mb or more, or its lowest layer with parameters is
** done, as pieces of at most bucket_mb (rpi_bucket_ready); the model places
** the same pieces on the profile's backward times of those layers.
*/
#include <stdlib.h>

#include "simulate_impl.h"

static bool split_backward(rp_schedule s) {
    return s == RP_SCHEDULE_ZB_H1 || s == RP_SCHEDULE_ZB_H2 || s == RP_SCHEDULE_ZB_AUTO;
}

rp_status rpi_buckets_make(const rp_config *cfg, const int *counts, int P, const double *bwd_ms,
                           const double *param_bytes, const rp_sim_options *opt, rpi_buckets *b,
                           rp_error *err) {
    double cap = cfg->reduction_bucket_mb * 1e6, most = 0; /* buckets, at most */
    for (int s = 0, l = 0; s < P; s++)
        for (int k = 0; k < counts[s]; k++, l++)
            most += 1 + param_bytes[l] / cap;
    if (most > 1e8)
        return rp_fail(err, RP_ERR_INVALID,
                       "reduction_bucket_mb %g makes more than 1e8 buckets of these parameters",
                       cfg->reduction_bucket_mb);
    b->bytes = malloc(sizeof(double) * ((size_t)most + 1));
    b->frac = malloc(sizeof(double) * ((size_t)most + 1));
    if (!b->bytes || !b->frac) {
        rpi_buckets_free(b);
        return rp_fail(err, RP_ERR_NOMEM, "out of memory for the reduction's buckets");
    }
    bool split = split_backward(cfg->schedule);
    int T = rp_config_tensor_parallel(cfg);
    int k = 0;
    for (int s = 0, l0 = 0; s < P; l0 += counts[s], s++) {
        b->first[s] = k;
        double total = 0, done = 0, held = 0;
        for (int l = l0; l < l0 + counts[s]; l++) /* what the last backward op runs */
            total += !split ? bwd_ms[l]
                     : opt->bwd_weight_ms ? opt->bwd_weight_ms[l]
                     : param_bytes[l] > 0 ? 0.5 * bwd_ms[l] : 0;
        int lowest = l0; /* the stage's first layer with parameters ends its last bucket */
        while (lowest < l0 + counts[s] - 1 && param_bytes[lowest] <= 0)
            lowest++;
        for (int l = l0 + counts[s] - 1; l >= l0; l--) {
            done += !split ? bwd_ms[l]
                    : opt->bwd_weight_ms ? opt->bwd_weight_ms[l]
                    : param_bytes[l] > 0 ? 0.5 * bwd_ms[l] : 0;
            bool part = T > 1 && opt->tensor_split && (opt->tensor_split[l] & RP_SIM_TP_SPLIT);
            held += part ? param_bytes[l] / T : param_bytes[l];
            if (held > 0 && (held >= cap || l == lowest)) /* as pieces of at most cap */
                for (; held > 0; held -= cap) {
                    b->bytes[k] = held < cap ? held : cap;
                    b->frac[k++] = total > 0 ? done / total : 1;
                }
            held = held < 0 ? 0 : held;
        }
    }
    b->first[P] = k;
    return RP_OK;
}

void rpi_buckets_free(rpi_buckets *b) {
    free(b->bytes), free(b->frac);
    b->bytes = b->frac = NULL;
}

double rpi_buckets_end(const rpi_buckets *b, int s, const double *t0, const double *t1, int n,
                       double bw, double latency, double wire) {
    double end = 0;
    for (int k = b->first[s]; k < b->first[s + 1]; k++) {
        double ready = 0;
        for (int i = 0; i < n; i++) {
            double t = t0[i] + b->frac[k] * (t1[i] - t0[i]);
            ready = t > ready ? t : ready;
        }
        end = (end > ready ? end : ready) + rpi_allreduce_time(n, b->bytes[k] * wire, bw, latency);
    }
    return end;
}
