/*
** Simulation: the time of one update of a configuration, predicted from a
** profile's layer times by playing every worker's checked operation list
** (schedule.h) on its own clock: a receive waits for its send, a reduction
** for its group, compute takes the profile's time scaled to the
** micro-batch, and messages cross the machine hierarchy the workers are laid
** out on.
*/
#ifndef REPIPE_SIMULATE_H
#define REPIPE_SIMULATE_H

#include "repipe/config.h"
#include "repipe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RP_SIM_MAX_LEVELS 8

/* Where the workers run. Workers are laid on the machine hierarchy in rank
** order (replica-major, then stage, then stage replica): with machines
** {8, 2}, workers 0-7 share the first server and 8-15 the second. A
** transfer between two workers costs latency + bytes / bandwidth of the
** innermost level they share; a reduction is a ring (or, where cheaper, a
** tree) allreduce limited by the slowest level its group spans
** (docs/simulate.md). On one machine (no levels) transfers and sums take
** the workers' own cores; with levels the network moves them, even where
** the workers share cores. */
typedef struct rp_sim_options {
    double profile_batch; /* rows the profile's times were measured on [0: the micro-batch] */
    int num_levels;       /* levels of the hierarchy [0: one level holding every worker] */
    int machines[RP_SIM_MAX_LEVELS];     /* per level, innermost first, as 'repipe plan' */
    double bandwidth[RP_SIM_MAX_LEVELS]; /* bytes/s per level [with no levels: 1e10,
                                         ** one machine's shared memory] */
    double latency;          /* seconds per message [2e-5] */
    double memory_bandwidth; /* bytes/s of the optimizer's pass over a worker's parameters [1e10] */
    int cores; /* the workers share one machine's cores: when more compute at once,
               ** each runs at cores / computing of its speed [0: a core each] */
    bool polling; /* waiting workers poll and take their share of the cores, as
                  ** MPI ranks do [false: they sleep, as threads of the local backend] */
    const double *cut_bytes; /* bytes per profiled batch crossing the cut before layer
                             ** k, as rp_profile_cut_bytes [NULL: out_bytes[k - 1], a
                             ** chain's] */
    /* per layer, a split backward's halves: the input's gradient (B) and the
    ** weights' (W), as rp_profile_split_ms gives them [NULL: W half of bwd_ms
    ** for a layer with parameters, none for one without; B the rest] */
    const double *bwd_input_ms, *bwd_weight_ms;
    /* per layer, what tensor_parallel t does to it (RP_SIM_TP_*, from
    ** rp_model_tensor_split; needed when t > 1): a split layer computes and
    ** holds 1 / t of its work and parameters; the group all-reduces a
    ** layer's output in forward, or its output's gradient in backward,
    ** over the innermost level that holds the group's t workers */
    const unsigned char *tensor_split;
    /* the profile was measured on a rank of a tensor group of tensor_parallel
    ** (its Input's tensor_parallel=, rp_profile_tensor_parallel): its times
    ** hold the group's all-reduces, and its parameters and memory are a
    ** rank's, so nothing is split again (tensor_split unused) [false] */
    bool tensor_measured;
    /* per layer, the activation bytes a micro-batch keeps for the layer's
    ** backward [NULL: its output, out_bytes], and what it keeps of them when
    ** the layer is recomputed (its input, a checkpoint; one layer's whole is
    ** held again while it is recomputed) [NULL: as the outputs say] */
    const double *kept_bytes, *recompute_kept_bytes;
    /* per layer, where the profile says (rp_layer_memory): what a split
    ** backward keeps besides for the weights' half, the scratch the layer
    ** needs (a stage's is the most of its layers'), and a graph's gradient
    ** buffer for its output (held once a stage) [NULL: the layer's output
    ** waits for its W; no scratch counted]. With tensor_parallel, these and
    ** kept_bytes are a tensor rank's (rp_layer_memory_table). */
    const double *wstash_bytes, *scratch_bytes, *grad_bytes;
    /* (rp_sim_options_memory sets these five from rp_profile_memory's arrays) */
    /* parameters as Megatron-LM trains them: bf16 weights beside the fp32
    ** master weights, gradients and optimizer state (a fourth more than
    ** fp32 alone), and the replicas' reduction of bf16 gradients [false] */
    bool mixed_precision;
    /* per device, in rank order as the machines hold them (the product of
    ** machines[]; without levels, per worker): its speed relative to the
    ** device the profile was measured on. Its passes and its optimizer's
    ** take time / speed; transfers and sums keep the links' times. A worker
    ** is a device; interleaved chunks share theirs [NULL: every one 1] */
    const double *device_speed;
    /* the configuration is one of `replicas` alike copies of itself, laid
    ** after it in rank order, whose stages reduce their gradients together:
    ** only this copy is played, each reduction priced over all of them
    ** (what a cluster of thousands of devices needs: the copies' timelines
    ** are the same) [0 or 1: the configuration alone] */
    int replicas;
    /* the optimizer's pass covers 1 / state_shards of a worker's parameters:
    ** their state is sharded over that many devices that reduce together
    ** (Megatron-LM's distributed optimizer) [0 or 1: all of them] */
    double state_shards;
    /* across machines a send holds its worker until its bytes are across,
    ** as Megatron-LM's point-to-point exchanges did before
    ** --overlap-p2p-communication [false: the worker goes on] */
    bool blocking_sends;
} rp_sim_options;

enum { RP_SIM_TP_SPLIT = 1, RP_SIM_TP_REDUCE_OUTPUT = 2, RP_SIM_TP_REDUCE_GRAD = 4 };
/* ...and a transformer_block's two all-reduces each way, of its output's size */
enum { RP_SIM_TP_TWICE = 8 };

/* Every worker on one machine with a core of its own. */
void rp_sim_options_default(rp_sim_options *o);
/* What each layer keeps, as rp_profile_memory read it (its five arrays,
** any NULL): kept_bytes, recompute_kept_bytes, wstash_bytes, scratch_bytes
** and grad_bytes. */
static inline void rp_sim_options_memory(rp_sim_options *o, double *const mem[5]) {
    o->kept_bytes = mem[0], o->recompute_kept_bytes = mem[1];
    o->wstash_bytes = mem[2], o->scratch_bytes = mem[3], o->grad_bytes = mem[4];
}

typedef struct rp_sim_event {
    int worker, kind, mb;
    double t0, t1; /* seconds */
} rp_sim_event;

typedef struct rp_sim_result {
    double update_time; /* seconds */
    int workers, stages;
    /* A worker of each stage holds its parameters and gradients, its
    ** optimizer state (its shard with replicated_tensor_sharding, one chunk
    ** with optimizer_state_offchip) and the activations of every
    ** micro-batch it has in flight, in bytes. */
    double stage_bytes[RP_MAX_STAGES];
    /* Per worker (workers entries): the fraction of the update it computes
    ** (forwards, backwards, step), the most micro-batches it holds, its
    ** stage. */
    double *busy;
    int *in_flight;
    int *stage_of;
    /* Worker time neither computing nor reducing, over workers x update:
    ** waits for the pipeline to fill and drain and for slower stages. */
    double bubble_fraction;
    /* What one more update adds to the call once it is under way, and the
    ** share of that time the workers idle (rp_simulate_steady; 0 until it
    ** ran). A worker starts its next update as soon as it has stepped: under
    ** zb-h2 the first stages start the next update while the last ones finish
    ** this one, and a long call's update takes less than update_time; under
    ** gpipe, 1f1b and zb-h1 the first stage finishes last and the two agree.
    ** This is the update time and the bubble rate of the Zero Bubble paper's
    ** tables (docs/pipelines.md). */
    double steady_update_time, steady_bubble_fraction;
    /* Seconds the links of each level carry data: every transfer once,
    ** every group's allreduce once. */
    int num_levels;
    double comm_seconds[RP_SIM_MAX_LEVELS];
    int num_events;
    rp_sim_event *events;
} rp_sim_result;

/* Layer l of the model: forward and backward milliseconds, output bytes
** and parameter bytes, for the profile's batch. */
rp_status rp_simulate(const rp_config *cfg, const double *fwd_ms, const double *bwd_ms,
                      const double *out_bytes, const double *param_bytes, int num_layers,
                      const rp_sim_options *opt, rp_sim_result *res, rp_error *err);
void rp_sim_result_free(rp_sim_result *r);

/* Fills res->steady_update_time and res->steady_bubble_fraction, res being
** rp_simulate's result for the same arguments: the configuration is played
** once more with one more device iteration, and the difference is the
** update that call adds. */
rp_status rp_simulate_steady(const rp_config *cfg, const double *fwd_ms, const double *bwd_ms,
                             const double *out_bytes, const double *param_bytes, int num_layers,
                             const rp_sim_options *opt, rp_sim_result *res, rp_error *err);

/* A schedule given from outside as each rank's list of compute actions, in
** the CSV form of PyTorch's torch.distributed.pipelining: a line per rank,
** a cell per action ("2F0": stage 2's forward of micro-batch 0; B a whole
** backward, I and W its halves, B beside a W the input half; "(a;b)
** OVERLAP_F_B" a then b; empty: idle; PyTorch's SEND/RECV, UNSHARD,
** RESHARD and REDUCE_GRAD are skipped, as transfers are derived). A rank
** may hold several stages. Parsing checks that each stage lives on one
** rank and has, for every micro-batch, one forward and one backward, in
** order; `name` names the text in errors, with its line and column. */
typedef struct rp_sim_actions rp_sim_actions;
rp_status rp_sim_actions_parse(const char *text, size_t len, const char *name,
                               rp_sim_actions **out, rp_error *err);
void rp_sim_actions_free(rp_sim_actions *a);
int rp_sim_actions_ranks(const rp_sim_actions *a);
int rp_sim_actions_stages(const rp_sim_actions *a);
int rp_sim_actions_micro_batches(const rp_sim_actions *a);

/* The actions on one clock: rank r is worker r of the options' hierarchy,
** stage s holds the configuration's layers_per_stage[s] layers (one entry
** per stage of the schedule) at its micro_batch_size; each rank runs its
** next action once its input is there. The result's update_time ends with
** the last backward (no reduction, no step), its workers are the ranks and
** its bubble what they idle. Refused, with each rank's next action, where
** the lists would wait for ever. */
rp_status rp_simulate_actions(const rp_config *cfg, const rp_sim_actions *a,
                              const double *fwd_ms, const double *bwd_ms,
                              const double *out_bytes, const double *param_bytes, int num_layers,
                              const rp_sim_options *opt, rp_sim_result *res, rp_error *err);

/* The configuration's schedule (gpipe, 1f1b, zb-h1, zb-h2, zb-auto; one pipeline,
** one update) in that CSV form; the caller frees *out with free(). */
rp_status rp_schedule_csv(const rp_config *cfg, char **out, rp_error *err);

/* Megatron-LM's interleaved 1F1B for P ranks of v chunks each (rank r holds
** stages c P + r) over m micro-batches (a multiple of P), in that CSV form;
** the caller frees *out with free(). */
rp_status rp_schedule_csv_interleaved(int P, int v, int m, char **out, rp_error *err);

/* The timeline as SVG: one row per worker, forwards, backwards, reductions
** and steps as boxes labelled with their micro-batch, and under them the
** micro-batches the worker holds in flight, so that the fill shows. */
rp_status rp_sim_svg(const rp_sim_result *r, const char *title, const char *path,
                     rp_error *err);

/* The result as JSON: seconds_per_update, samples_per_second (for the
** configuration's samples per update), bubble_fraction (and
** steady_seconds_per_update, steady_bubble_fraction where
** rp_simulate_steady filled them), per worker its
** stage, busy fraction and in-flight maximum, and communication seconds by
** level. The caller frees *out with free(). */
rp_status rp_sim_to_json(const rp_sim_result *r, const rp_config *cfg, char **out,
                         rp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_SIMULATE_H */
