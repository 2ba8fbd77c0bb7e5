/*
** The simulator's reductions: what an allreduce among a group costs, by
** the algorithm the engine's backend runs for it (a ring or tree; Open
** MPI's recursive halving and doubling; the chain over servers of
** workers_per_server), and the model of a reduction in buckets
** (reduction_bucket_mb): which bytes of a stage can start summing when,
** during its last backward. The engine announces its layers from the top
** down and starts what they hold once it is bucket_mb or more, or its
** lowest layer with parameters is done, as pieces of at most bucket_mb
** (rpi_bucket_ready); the model places the same pieces on the profile's
** backward times of those layers.
*/
#include <stdlib.h>
#include <string.h>

#include "repipe/schedule.h"
#include "../sched/servers.h"
#include "simulate_impl.h"

/* An allreduce of `bytes` among n workers whose links are no faster than bw:
** a ring moves 2 (n - 1) / n of the bytes through every worker in 2 (n - 1)
** steps; a binary tree reduces and broadcasts the whole in 2 log2 n steps. */
double rpi_allreduce_time(int n, double bytes, double bw, double latency) {
    if (n <= 1)
        return 0;
    int depth = 0;
    while ((1 << depth) < n)
        depth++;
    double ring = 2.0 * (n - 1) * latency + 2.0 * (n - 1) / n * bytes / bw;
    double tree = 2.0 * depth * (latency + bytes / bw);
    return ring < tree ? ring : tree;
}

/* Open MPI 4.1's allreduce of a sum among 4 or more ranks, a power of two
** (coll/tuned's fixed rules): from 8 KB, Rabenseifner's, a reduce-scatter
** by recursive halving (step i: half of what is left, N / 2^(i+1), to the
** partner 2^i away) and an all-gather by recursive doubling, the same steps
** back; below, recursive doubling (the whole N at each step). Ranks that
** fill servers in order meet their near partners with the most bytes: a
** flat ring's 2 (n - 1) / n N across the slow link becomes N / 2 x the
** crossing steps' shares (4 ranks on 2 servers of 2 at 100 Mbit: the ring
** predicted 0.97 s for 7.6 MB, this 0.67 s; measured 0.80 s). */
static double mpi_allreduce_time(int steps, const int *lvl, const int *crossing, double bytes,
                                 const rpi_cluster *net) {
    double t = 0, part = bytes;
    for (int i = 0; i < steps; i++) {
        part = bytes < 8192 ? bytes : part / 2;
        double step = net->latency + crossing[i] * part / net->bw[lvl[i]];
        t += bytes < 8192 ? step : 2 * step;
    }
    return t;
}

/* The allreduce over servers (rp_comm_set_servers) of n workers, k a
** server, q = n / k servers: inside each, every member sends and receives
** k - 1 chunks of bytes / k over links of bw_in, twice (to the chunks'
** owners, and their sums back); between them the k owners' chunks, the
** whole buffer, cross each link once forward while the totals go back the
** other way a piece (16384 floats an owner) behind, along 2 (q - 1) hops. */
static double servers_allreduce_time(int n, int k, double bytes, double bw_in, double bw_out,
                                     double latency) {
    int q = n / k;
    double chunk = bytes / k, piece = 16384.0 * sizeof(float) * k;
    double inside = (k - 1) * latency + (k - 1) * chunk / bw_in;
    double fill = (2 * q - 3) * (piece < bytes ? piece : bytes) / bw_out;
    return 2 * inside + 2 * (q - 1) * latency + bytes / bw_out + (fill > 0 ? fill : 0);
}

void rpi_reduction_make(rpi_reduction *r, const rpi_cluster *net, const int *members, int m,
                        const int *pos, int top, bool open_mpi, int workers_per_server) {
    memset(r, 0, sizeof *r);
    r->n = m, r->top = top;
    if (open_mpi && m >= 4 && !(m & (m - 1)))
        for (int d = 1; d < m; d *= 2, r->steps++) {
            int l = 0, most = 0;
            for (int a = 0; a < m; a++) {
                int la = rpi_level_of(net, pos[members[a]], pos[members[a ^ d]]);
                l = la > l ? la : l;
            }
            for (int a = 0; a < m; a++) { /* a unit's members whose partners are a level-l hop away */
                int n = 0;
                for (int b = 0; b < m; b++)
                    n += rpi_level_of(net, pos[members[a]], pos[members[b]]) < l &&
                         rpi_level_of(net, pos[members[b]], pos[members[b ^ d]]) == l;
                most = n > most ? n : most;
            }
            r->lvl[r->steps] = l, r->crossing[r->steps] = most > 0 ? most : 1;
        }
    r->per_server = rpi_per_server(members, m, workers_per_server);
    for (int i = 1; r->per_server && i < m; i++)
        if (i % r->per_server) { /* the same server as the one before */
            int l = rpi_level_of(net, pos[members[i - 1]], pos[members[i]]);
            r->inner = l > r->inner ? l : r->inner;
        }
    if (r->per_server && r->inner >= r->top) /* one level: nothing to gain */
        r->per_server = 0;
}

double rpi_reduction_time(const rpi_reduction *r, double bytes, const rpi_cluster *net,
                          bool network) {
    if (r->per_server && network)
        return servers_allreduce_time(r->n, r->per_server, bytes, net->bw[r->inner],
                                      net->bw[r->top], net->latency);
    if (r->steps)
        return mpi_allreduce_time(r->steps, r->lvl, r->crossing, bytes, net);
    return rpi_allreduce_time(r->n, bytes, net->bw[r->top], net->latency);
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
    bool split = rp_schedule_splits_backward(cfg->schedule); /* (zb-v too: its last is a W) */
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
            bool part = rpi_tensor_split_of(opt, T, l) & RP_SIM_TP_SPLIT;
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
