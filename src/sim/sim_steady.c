/*
** The update of a long call: what one more device iteration adds.
**
** Why a difference of two plays and not the first update's time: the
** updates of one call follow each other without a barrier, each worker
** starting its next forward once it has stepped. Where the first stage is
** the last to finish (gpipe, 1f1b, zb-h1) nothing overlaps and the two
** agree; where it is not (zb-h2's parallelogram) the next update's first
** stages work while the last ones drain, and the period of a long call is
** shorter than its first update. The period is reached after one update,
** so one extra iteration measures it exactly: with the Zero Bubble paper's
** pass times it gives the bubble rates of its Table 5 to 1e-4.
*/
#include "repipe/simulate.h"

rp_status rp_simulate_steady(const rp_config *cfg, const double *fwd_ms, const double *bwd_ms,
                             const double *out_bytes, const double *param_bytes, int num_layers,
                             const rp_sim_options *opt, rp_sim_result *res, rp_error *err) {
    int D = cfg->device_iterations > 1 ? cfg->device_iterations : 1;
    rp_config more = *cfg;
    more.device_iterations = D + 1;
    rp_sim_result r;
    rp_status st = rp_simulate(&more, fwd_ms, bwd_ms, out_bytes, param_bytes, num_layers, opt, &r,
                               err);
    if (st)
        return st;
    /* a call's idle time per worker is its bubble fraction of its length */
    double t0 = res->update_time * D, t1 = r.update_time * (D + 1);
    res->steady_update_time = t1 - t0;
    res->steady_bubble_fraction =
        t1 > t0 ? (r.bubble_fraction * t1 - res->bubble_fraction * t0) / (t1 - t0) : 0;
    rp_sim_result_free(&r);
    return RP_OK;
}
