/*
** Pipeline schedules (docs/pipelines.md): each worker's list of operations for
** one update, built from the configuration and checked by simulation before
** anything runs.
**
** Worker w = (c * sum(r) + sum(r_t, t < s) + j) * T + k runs stage s of replica c as
** stage replica j, tensor rank k of T (tensor_parallel); micro-batch m of a replica goes to stage replica
** m mod r_s at every stage. A stage's operations are ordered as if one
** worker ran them all (gpipe: every forward, then every backward in reverse;
** 1f1b: n_s - 1 warm-up forwards, then one forward and one backward in
** turn, then the remaining backwards, where n_s = rp_workplan_in_flight);
** each stage replica takes the operations of its own micro-batches in that
** order, and so keeps ceil(n_s / r_s) of them in flight. Taking a
** subsequence only drops waits, so a stage order that cannot hang with one
** worker per stage cannot hang with many.
**
** zb-h1 and zb-h2 (Qi et al., Zero Bubble Pipeline Parallelism) split each
** backward into BACKWARD_INPUT (B: the input's gradient, which the previous
** stage waits for) and BACKWARD_WEIGHT (W: the weights', which only the
** step needs), and place the W passes where 1f1b idles. A stage's order is
** a list schedule of one worker per stage on equal pass times: a stage free
** at time t runs the next F if its input has arrived and room is left, else
** the next B if its gradient has, else the next W, else it waits for the
** first arrival (on equal times this reaches the least update time of one
** update, 3 m F + (P - 1) F, for P 2 to 6). Room: under zb-h1 at most n_s micro-batches between F and
** B, as 1f1b, and every worker holding (from F to W) no more micro-batches
** than 1f1b's busiest worker does: later stages hold their Ws back to let
** the earlier ones' Bs through. zb-h2
** allows 2 n_s - 1 and twice that peak less one. zb-auto runs the same
** list on the configuration's zb_pass_times, with every worker holding at
** most zb_max_in_flight = L micro-batches and stage s's room from F to B
** n_s L / peak (peak: 1f1b's busiest worker), so that L = peak is zb-h1's
** rooms and 2 peak - 1 zb-h2's. B and W each run in
** micro-batch order on every worker, so every gradient is summed in 1f1b's
** order: the same bits.
**
** Sends never block (they are buffered until received); a receive waits
** for its message, WAIT_SENDS for all the worker's messages to be received,
** REDUCE for every worker of the reduction group.
*/
#ifndef REPIPE_SCHEDULE_H
#define REPIPE_SCHEDULE_H

#include "repipe/config.h"
#include "repipe/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rp_op_kind {
    RP_OP_RECV_ACT, /* activation of micro-batch mb from the previous stage */
    RP_OP_FORWARD,
    RP_OP_SEND_ACT,
    RP_OP_RECV_GRAD, /* gradient from the next stage */
    RP_OP_BACKWARD,
    RP_OP_SEND_GRAD,
    RP_OP_WAIT_SENDS,
    RP_OP_REDUCE,
    RP_OP_STEP,
    RP_OP_BACKWARD_INPUT,  /* a split backward's first half (B) */
    RP_OP_BACKWARD_WEIGHT  /* and its second (W), on the same activation slot */
} rp_op_kind;
#define RP_OP_COUNT (RP_OP_BACKWARD_WEIGHT + 1) /* the kinds: switches need no case for it */

/* Whether a schedule splits backward into BACKWARD_INPUT and BACKWARD_WEIGHT. */
bool rp_schedule_splits_backward(rp_schedule s);

typedef struct rp_op {
    rp_op_kind kind;
    int mb;   /* micro-batch, -1 for the last three kinds */
    int peer; /* worker sent to or received from, -1 if none */
    int slot; /* activation slot of the micro-batch (forward, backward) */
} rp_op;

typedef struct rp_worker_ops {
    int stage, replica, stage_replica;
    int tensor_rank; /* its number in its tensor group (tensor_parallel) */
    int num_ops;
    rp_op *ops;
    int slots; /* activation sets the worker needs: its in-flight bound */
} rp_worker_ops;

/* A device runs the operations of several workers on one thread, one after
** another in this order (interleaved-1f1b: a pipeline worker's chunks). */
typedef struct rp_device_ops {
    int num;          /* operations */
    int *worker, *op; /* the i-th is operation op[i] of worker worker[i] */
} rp_device_ops;

typedef struct rp_workplan {
    int workers, stages;
    rp_worker_ops *w;
    int devices;          /* 0: every worker runs alone, on a thread or rank of its own */
    rp_device_ops *dev;
    int *device_of;       /* each worker's device, when devices > 0 */
} rp_workplan;

/* The worker running stage s of replica c as stage replica j; with
** tensor_parallel t, the first of its tensor group, whose ranks k are
** workers rp_workplan_worker + k (tensor ranks vary fastest, so that a
** group lies inside a server, as Megatron-LM places it). */
int rp_workplan_worker(const rp_config *cfg, int c, int s, int j);

/* Micro-batches stage s keeps in flight over all its stage replicas: under
** 1f1b the workers of stages s..P-1 of one replica (P - s without stage
** replication), under gpipe all of them; never more than GA. */
int rp_workplan_in_flight(const rp_config *cfg, int s);

/* Interleaved 1F1B (Megatron-LM): the passes of pipeline worker r of P
** holding v chunks, over m micro-batches (a multiple of P), in the order it
** runs them: 2 m v of them, the i-th the forward (fwd[i]) or backward of
** micro-batch mb[i] at stage stage[i] = chunk P + r. The micro-batches go
** through the chunks in groups of P: the k-th forward is of chunk (k / P)
** mod v and micro-batch (k / (P v)) P + k mod P, the k-th backward the same
** with the chunks in reverse; the worker runs (P - r - 1) 2 + (v - 1) P
** forwards first (all of them when m = P), then a forward and a backward in
** turn, then the backwards left. Each chunk thus runs its forwards and its
** backwards in micro-batch order, as 1f1b does. */
void rp_interleaved_order(int P, int v, int m, int r, int *stage, bool *fwd, int *mb);

rp_status rp_workplan_build(const rp_config *cfg, rp_workplan **out, rp_error *err);
void rp_workplan_free(rp_workplan *s);

/* Simulates the schedule: every receive must meet its send, every worker
** must finish. A schedule that would wait forever is rejected with the
** workers, operations and micro-batches that would wait. `reduce_group`
** gives, for each worker, an id shared by the workers that reduce together
** (NULL: the workers of a stage across all replicas). */
rp_status rp_workplan_check(const rp_workplan *s, const int *reduce_group, rp_error *err);

/* What the configuration asks of its schedule, refused with the key that
** asks it where no model is needed to tell: virtual_stages and the
** chunked schedules' rules (a worker's chunks replicated together, GA a
** multiple of the workers under interleaved-1f1b), zb-auto's keys, the
** keys that do not go with a schedule. rp_session_check and rp_simulate
** both run it before building a plan. */
rp_status rp_schedule_check_config(const rp_config *cfg, rp_error *err);

const char *rp_op_name(rp_op_kind k);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_SCHEDULE_H */
