/*
** Sessions: a model, an execution configuration and the workers that run
** them (docs/replicas.md, docs/groupings.md, docs/pipelines.md). A host
** call (rp_session_run) performs
** device_iterations updates on data handed over at once and returns the
** losses shaped by output_mode.
**
** Workers run a stage of a replica: R replicas of a pipeline of P stages,
** stage s on r_s workers inside each replica (layers_per_stage,
** stage_replication), numbered as rp_workplan_worker says. They are threads
** of this process (the local backend) or MPI ranks, one worker per rank.
** Every update equals plain mini-batch SGD on the update's samples within
** each variable's replica group.
**
** A session keeps a pointer to its model, which must outlive it; it copies
** the configuration. Objects returned through **out belong to the caller
** (rp_session_free, rp_weights_free, rp_train_state_free); an rp_result
** belongs to the session until its next call. Under MPI these calls are
** collective, made by every rank in the same order: rp_session_create_mpi,
** rp_session_run, rp_session_run_samples, rp_session_predict,
** rp_session_get_weights, rp_session_get_state and rp_session_free.
*/
#ifndef REPIPE_SESSION_H
#define REPIPE_SESSION_H

#include <stdint.h>

#include "repipe/comm.h"
#include "repipe/config.h"
#include "repipe/core.h"
#include "repipe/data.h"
#include "repipe/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rp_session rp_session;

/* Losses of a host call (docs/replicas.md): `all` gives [D][R][GA] micro-batch
** losses, `sum` (per replica, over its D * GA micro-batches) and `final`
** (per replica, its last micro-batch) give [R]. Each loss is the mean over
** the samples of its micro-batch. Owned by the session until the next call. */
typedef struct rp_result {
    int ndim;
    int dims[3];
    int count;
    const float *losses;
} rp_result;

/* Weight ties (a linear head sharing an embedding's table) a session holds. */
#define RP_MAX_TIES 4

/* What rp_session_create checks of a model and a configuration, without
** making workers: the model ends with a loss, the training and inference
** layer lists resolve for its layers, no training stage is empty, and
** embedding tables divide by their serialization factors. */
rp_status rp_session_check(const rp_model *m, const rp_config *cfg, rp_error *err);

/* An IPUConfig file's layer lists count a transformer's blocks
** (layers_count_blocks): for model m, rewrites them as counts of m's layers
** (lines of its spec), the layers before its first block (the embeddings)
** on the first stage and those after its last (the final norm, the head,
** the loss) on the last, and clears the flag. A model without blocks
** (rp_model_blocks: an MLP, a CNN) takes the lists as counts of its layers.
** Sessions and rp_session_check do this on their own copy; a caller that
** shows the stages of cfg for m does it first. Refused, with the key, where
** the lists do not fit m's blocks. */
rp_status rp_session_fit_config(const rp_model *m, rp_config *cfg, rp_error *err);

/* Local backend: one thread per worker. */
rp_status rp_session_create(const rp_model *m, const rp_config *cfg, rp_session **out,
                            rp_error *err);
/* MPI backend: this rank is one worker; the world size must equal the
** workers the configuration needs. */
rp_status rp_session_create_mpi(const rp_model *m, const rp_config *cfg, rp_comm *comm,
                                rp_session **out, rp_error *err);
void rp_session_free(rp_session *s);

/* Samples one host call takes: B * GA * R * D. */
long long rp_session_samples_per_call(const rp_session *s);
/* Updates done so far (skipped ones included). */
long long rp_session_updates(const rp_session *s);
/* The last update's learning rate (lr_schedule), and with gradient_clipping
** its global gradient norm before clipping (-1 without). */
void rp_session_last_update(const rp_session *s, double *lr, double *grad_norm);
/* The loss scale of the next update, and the updates skipped so far by
** auto_loss_scaling because their gradients were not finite. */
void rp_session_loss_scale(const rp_session *s, double *scale, long long *skipped);

/* One host call: D updates on rows x (samples_per_call of them, in stream
** order: update by update, replica by replica, micro-batch by micro-batch),
** their labels (the model's num_targets per sample) and global sample ids.
** Under MPI every rank passes the same data and receives the same result.
**
** If a worker fails (a label that is no class of the loss, found by the
** worker whose micro-batch holds it), the call returns that worker's
** message; the local backend's other workers stop, the update is left half
** done, and every later run is refused, naming that failure: close the
** session and open another (weights and predictions can still be read).
** Under MPI the other ranks are left waiting: the caller reports the
** message and calls rp_comm_fail, which ends the job. */
rp_status rp_session_run(rp_session *s, const float *x, const int32_t *labels,
                         const int64_t *sample_ids, rp_result *res, rp_error *err);

/* rp_session_run on samples of d: sample_ids (samples_per_call of them, in
** the same order) index d, and the labels are d's. Each worker of the first
** stage copies its own micro-batches' rows, straight into its activations:
** the copy is spread over the workers, and under MPI a rank reads only the
** rows it trains on. Ids outside d are refused before any work. */
rp_status rp_session_run_samples(rp_session *s, const rp_dataset *d, const int64_t *sample_ids,
                                 rp_result *res, rp_error *err);

/* Inference on n rows: the predicted class of each row, in row order, with
** replica 0's weights. inference_replication_factor replicas (threads, or
** under MPI ranks, at most the world) take every R-th micro-batch of B rows;
** under MPI the call is collective and every rank receives every row. */
rp_status rp_session_predict(rp_session *s, const float *x, int n, int32_t *pred,
                             rp_error *err);

/* The mean loss of n rows (their labels: the model's num_targets per row)
** with replica 0's weights, run as rp_session_predict runs: a validation
** loss. For a model with a target per token, the mean over tokens. Under
** MPI the call is collective. */
rp_status rp_session_loss(rp_session *s, const float *x, const int32_t *labels, int n,
                          double *mean, rp_error *err);

/* How weights are read and written (PopXL's retrieval modes). */
typedef enum rp_weights_mode {
    RP_ONE_PER_GROUP = 0, /* [G] + shape: each group's value, from its first member */
    RP_ALL_REPLICAS       /* [R] + shape, in replica order */
} rp_weights_mode;

/* The model's weights; tensors have `groups` copies (1 when G == 1). */
rp_status rp_session_get_weights(rp_session *s, rp_weights_mode mode, rp_weights **out,
                                 rp_error *err);
/* Replaces the weights. A tensor with one copy sets every group; with G
** copies, group by group. Writing in all_replicas mode is refused when a
** group has more than one member (its replicas must stay identical). */
rp_status rp_session_set_weights(rp_session *s, const rp_weights *w, rp_weights_mode mode,
                                 rp_error *err);

/* The whole training state of a session, free of its layout: what another
** session, of any R, stages, stage replication, sharding or backend, needs
** to continue exactly where this one stands. Every variable one value per
** group (as RP_ONE_PER_GROUP); the optimizer's state arrays per variable
** and group, named "NAME#0", "NAME#1" (SGD's momentum; Adam's first and
** second moments), gathered from the shards of replicated tensor sharding
** and from offchip files; and the counters. Owned by the caller:
** rp_train_state_free. */
typedef struct rp_train_state {
    rp_weights *weights;
    rp_weights *optimizer; /* no tensors when the optimizer keeps no state */
    long long updates;     /* updates run, skipped ones included */
    long long steps;       /* optimizer steps taken: Adam's bias correction counts them */
    long long skipped;     /* updates auto_loss_scaling skipped */
    double loss_scale;     /* of the next update */
    int clean;             /* updates without inf or NaN since the scale last changed */
    /* Under PipeDream's schedules each stage's steps (its stages step once
    ** a micro-batch they run); 0: every stage took `steps`. */
    int num_stage_steps;
    long long stage_steps[RP_MAX_STAGES];
} rp_train_state;

/* Under MPI both are collective: every rank calls them, and every rank gets
** (or gives) the whole state. */
rp_status rp_session_get_state(rp_session *s, rp_train_state *out, rp_error *err);
/* Checks every tensor against the model and the session's groupings before
** changing anything. */
rp_status rp_session_set_state(rp_session *s, const rp_train_state *st, rp_error *err);
void rp_train_state_free(rp_train_state *st);

/* Elements of each optimizer state array that a worker with
** optimizer_state_offchip streams through memory at a time: the only part
** of its state in working memory during an update. */
#define RP_OFFCHIP_CHUNK ((size_t)1 << 18)

/* What one worker holds, in bytes. */
typedef struct rp_memory {
    size_t params, grads, optimizer, activations, scratch;
} rp_memory;

/* What a worker of `stage` holds: the session's memory plan, made at
** creation or read from the executable cache. */
rp_status rp_session_memory(const rp_session *s, int stage, rp_memory *out, rp_error *err);
int rp_session_workers(const rp_session *s);
/* With executable_cache_dir: whether the session reused a cached schedule
** and memory plan, stored a new one, or rebuilt a stale or damaged entry
** (one line for the log); "" without. */
const char *rp_session_cache_note(const rp_session *s);
int rp_session_stages(const rp_session *s);

/* Records every worker's operations from now on (on) or stops (off), and
** writes them as Chrome trace-event JSON, one track per worker (Perfetto
** and chrome://tracing open it). A worker keeps its first RP_TRACE_EVENTS
** operations (recording allocates nothing in the step loop) and counts the
** rest: rp_session_trace_dropped says how many, and the trace file says it
** too. Turning tracing on fails when its buffers cannot be allocated. */
#define RP_TRACE_EVENTS (1 << 16)
rp_status rp_session_trace(rp_session *s, bool on, rp_error *err);
rp_status rp_session_write_trace(const rp_session *s, const char *path, rp_error *err);
long long rp_session_trace_dropped(const rp_session *s);
/* The grouping of a variable over the replicas. */
rp_grouping rp_session_var_grouping(const rp_session *s, int var);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_SESSION_H */
