/*
** The session's insides, shared by the files of the engine that run it
** (session.c) and that read and write its whole training state (state.c).
*/
#ifndef REPIPE_SESSION_IMPL_H
#define REPIPE_SESSION_IMPL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "repipe/layers.h"
#include "repipe/net.h"
#include "repipe/schedule.h"
#include "repipe/session.h"

#define MAX_GROUPINGS 8

/* A run of consecutive variables of a stage that share a grouping. */
typedef struct var_run {
    size_t offset, count; /* in the worker's flat buffers */
    int grouping;         /* index into the session's distinct groupings */
    float rescale;
    bool sharded;         /* replicated tensor sharding: this worker updates one shard */
    bool fused;           /* summed and updated by one rp_comm_reduce_update */
    bool tp_whole;        /* tensor parallelism: whole on every rank of the group */
    size_t shard;         /* elements per shard: ceil(count / members) */
    size_t state_offset;  /* of its optimizer state */
    size_t shard_offset;  /* of its reduced gradient shard in shard_g */
} var_run;

/* A linear layer's weight tied to an embedding's table (GPT-2's LM head):
** each keeps its copy, and their gradients are summed once per update. */
#define MAX_TIES RP_MAX_TIES
typedef struct tie {
    int emb_var, head_var; /* the two copies, as variables of the model */
    int emb_stage, head_stage;
    int emb_rep, head_rep; /* the worker of each stage whose sum counts */
} tie;

typedef struct trace_event {
    int kind, mb;
    double t0, t1;
} trace_event;

/* Trace events of a tensor group's all-reduces, in a forward or a
** backward, and of its all-gathers (a vocabulary-split loss's), beside the
** operations' kinds. */
enum { RPI_TRACE_TP_FORWARD = RP_OP_COUNT, RPI_TRACE_TP_BACKWARD, RPI_TRACE_TP_GATHER,
       RPI_TRACE_EP_ALLTOALL, /* an moe layer's exchange with its expert-parallel group */
       RPI_TRACE_BUCKET /* a bucket's sum, from its start until it was seen done */ };
/* A worker's buckets are drawn on a track of their own, this far from its
** own: they run beside its operations, not inside them. */
#define RPI_BUCKET_TRACK 1000

typedef struct worker {
    struct rp_session *s;
    int id, replica, stage, stage_replica;
    int tensor_rank;                   /* in its tensor group (tensor_parallel) */
    const rp_model *lm;                /* the model as this worker holds it: its rank's */
    const rp_worker_ops *plan;
    rp_comm *comm;                     /* the world */
    rp_comm *tp;                       /* its tensor group, or NULL */
    rp_status tp_status;               /* the first failed all-reduce of the group */
    const rp_op *tp_op;                /* the operation its all-reduces run in */
    rp_comm *ep;                       /* its expert-parallel group, or NULL */
    rp_comm *reduce[MAX_GROUPINGS];    /* per distinct grouping: this stage, this group */
    rp_net *net;
    rp_acts **acts;                    /* one per slot */
    const float **out;                 /* output rows of each slot's forward */
    float *opt;
    float *losses;                     /* D * GA, last stage: this worker's micro-batches */
    float *grad_in;                    /* gradient received from the next stage */
    float *grad_at;                    /* where the last one was received: grad_in, or
                                       ** the stash a split backward keeps it in */
    float *grad_out;                   /* GA gradients sent to the previous stage */
    rp_request *req;                   /* 2 * GA: activation and gradient sends */
    bool *req_live;
    var_run *runs;
    int nruns;
    bool any_sharded, any_fused;
    size_t state_floats;     /* optimizer state held by this worker */
    float *shard_g;          /* the reduced gradient shard of every sharded run */
    float *shard_p;          /* a padded shard's parameters (the last member's) */
    float *tail;             /* gradients under a padded all-gather's tail */
    int state_fd;            /* optimizer_state_offchip: the state's file, else -1 */
    float *chunk;            /* offchip: the state of one chunk, streamed in and out */
    uint16_t *h_act, *h_grad; /* fp16_exchange: GA fp16 sends each way */
    uint16_t *h_recv;         /* an fp16 receive */
    uint16_t *h_stage;        /* the fp16 gradients of a reduction */
    double scale;             /* the loss scale of the next update */
    int clean;                /* updates without inf/NaN since the scale last changed */
    long long applied;        /* optimizer steps taken (skipped updates take none) */
    rp_optimizer_config opt_now; /* the optimizer of this update: its learning rate */
    double grad_norm;         /* gradient_clipping: the last update's global norm, else -1 */
    long long skipped;
    bool skip;                /* this update's gradients were not finite */
    rp_status status;
    rp_error err;
    pthread_t thread;
    /* interleaved-1f1b: each tie's sum among the workers of its two stages
    ** (NULL: not one of them), as a device cannot join a world sum once
    ** for each of its workers */
    rp_comm *tie_comm[MAX_TIES];
    /* clipping's squares (and loss scaling's overflows): a slot a worker,
    ** W + 1 floats; a device's first worker also holds its devices' sum
    ** (dcomm, on threads) and the update it last took them for, + 1 */
    float *parts;
    rp_comm *dcomm;
    uint64_t verdict;
    bool tie_half[MAX_TIES]; /* a tie on this worker's device: its half reduced, the sum not */
    bool threaded; /* a thread of its own (worker 0 is the caller's; interleaved-1f1b:
                   ** a device's first worker runs its others) */
    trace_event *trace;
    int ntrace, trace_cap;
    long long trace_dropped; /* operations past trace_cap, not recorded */
    float *tie_buf;          /* a tie across stages that skips this worker's: its zeros */
    float *stash;            /* pipedream: the weights each slot's forward used */
    float *history;          /* vertical sync: every version of a call, GA / r_s + 1 */
    int *version_of;         /* vertical sync: the version micro-batch m runs on */
    const float **slot_ver;  /* pipedream: the version each slot's forward used */
    int versions;            /* vertical sync: the versions of this call so far, - 1 */
    float *stale;            /* pipedream_2bw: the version the passes use, one update older */
    float *own;              /* the net's own parameters: the newest version */
    float mean;              /* pipedream: 1 / the micro-batches an update of this stage sums */
    /* reduction_bucket_mb: the update's last backward starts each bucket's
    ** sum as its layers finish (rpi_bucket_ready); REDUCE waits for them */
    int last_back;           /* that operation's index in the list; -1: no buckets */
    size_t bucket;           /* floats a bucket holds at least (a run's last may hold fewer) */
    size_t bucket_lo;        /* gradients from here up are summing or summed */
    rp_request *breq;        /* the buckets started this update, breq_cap at most */
    rp_comm **breq_comm;
    double *bstart;          /* when each began (tracing) */
    float *bscratch;         /* MPI: the other rank's gradients of a 2-rank sum */
    int nbreq, breq_cap, bdone; /* started, room, known finished */
    rp_status bucket_status; /* the first failure of a start or a test */
} worker;

struct rp_session {
    const rp_model *m;
    rp_config cfg;
    rp_backend backend;
    int R, B, GA, D, P, W;
    int T;             /* tensor_parallel */
    rp_model **tpm;    /* T > 1: rank k's model (rp_model_tensor_split) */
    size_t **tpmap;    /* T > 1: rank k's parameter i is the model's tpmap[k][i] */
    int first[RP_MAX_STAGES + 1]; /* layer range of stage s: [first[s], first[s+1]) */
    rp_workplan *plan;
    rp_world *world;
    rp_comm *comm; /* MPI: the world communicator (not owned) */
    int nlocal;
    worker *w;
    /* MPI under a chunked schedule: a rank is a device and holds its chunks'
    ** workers. rank_of[id] is the rank of worker id, lidx[id] its place among
    ** that rank's workers (ascending id), which also tells its messages apart
    ** from its device's other chunks'. NULL otherwise: a rank is a worker. */
    int *rank_of, *lidx;
    rp_grouping *var_group;
    rp_grouping groupings[MAX_GROUPINGS];
    int ngroupings;
    tie ties[MAX_TIES];
    int nties;
    double loss_scale;
    size_t state_per_param;
    bool tracing;
    double t_origin;
    /* host calls to the worker threads */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long gen;
    int done;
    bool quit;
    int started; /* worker threads running (those with `threaded`) */
    /* A training call that failed once its workers started (a bad label
    ** found by the loss layer of one of them) leaves the update half done:
    ** later calls are refused with its message. */
    bool failed;
    char failed_msg[RP_ERROR_MAX];
    bool spin;   /* every worker has a core: hand-overs spin before sleeping */
    const float *x;         /* the call's rows, or NULL: */
    const rp_dataset *data; /* rp_session_run_samples: workers copy their own rows */
    const int32_t *y;
    const int64_t *ids;
    int32_t *labels;        /* the call's labels when read from a dataset */
    long long updates;
    float *all;     /* D * R * GA */
    float *gather;  /* MPI: every worker's D * GA losses */
    float *reduced; /* R */
    rp_memory mem[RP_MAX_STAGES]; /* the memory plan: a worker of each stage */
    char cache_note[RP_PATH_MAX + 512];
    char run_dir[RP_PATH_MAX]; /* optimizer_state_offchip: this process's state files */
};

static inline int rpi_rank_of(const rp_session *s, int id) {
    return s->rank_of ? s->rank_of[id] : id;
}

/* This process's worker of id (one of its own). */
static inline worker *rpi_worker_of(rp_session *s, int id) {
    return s->lidx ? &s->w[s->lidx[id]] : &s->w[id];
}

/* This process's workers set up, with every communicator they sum over
** (session_comms.c). */
rp_status rpi_session_comms(rp_session *s, rp_error *err);
/* Expert parallelism where devices run several workers: every two devices
** reach the expert groups they share in one order (expert_order.c). */
rp_status rpi_expert_order_check(const rp_session *s, rp_error *err);
/* Worker id's net, buffers, state and first weights (setup.c). */
rp_status rpi_setup_worker(rp_session *s, worker *w, int id, rp_error *err);

/* How the nets of a stage trade memory for compute (layout.c). */
rp_net_options rpi_net_options(const rp_config *cfg, int stage, bool inference);
/* Whether a run reduced over k workers is summed and updated by one
** rp_comm_reduce_update (layout.c). */
bool rpi_fused_run(const rp_session *s, int k, bool sharded);
/* A worker's operation list for one host call, and the loop of a worker
** thread that waits for calls (worker.c). */
void rpi_worker_run(worker *w);
/* The nets' all-reduce and all-gather over the worker's tensor group
** (worker.c). */
void rpi_tp_allreduce(void *worker, float *buf, size_t n);
void rpi_tp_allgather(void *worker, const float *in, size_t n, float *out);
/* Expert parallelism: an moe layer's all-to-all over the worker's group
** (rp_net_options.ep_alltoall), its failure kept as the tensor group's are. */
void rpi_ep_alltoall(void *worker, const float *in, size_t n, float *out);
void *rpi_worker_thread(void *arg);
/* The gradient exchange and step of an update (exchange.c). */
rp_status rpi_reduce(worker *w);
void rpi_bucket_ready(void *arg, int layer);
void rpi_bucket_begin(worker *w);
rp_status rpi_reduce_stats(worker *w);
/* Whether loss scaling's overflow and clipping's norm wait for a device's
** step (its chunks all reduced), and that step's verdicts. */
static inline bool rpi_verdict_at_step(const rp_session *s) {
    return s->plan->devices && (s->cfg.auto_loss_scaling || s->cfg.gradient_clipping > 0);
}
rp_status rpi_step_verdict(worker *w, uint64_t update);
rp_status rpi_opt_step(worker *w, long long step, float *p, const float *g, size_t state_offset,
                       size_t count);
/* Every replica's parameters, [R][num_params]; under MPI collective (state.c). */
rp_status rpi_all_params(rp_session *s, float **out, rp_error *err);
/* What a worker of `stage` holds (memory.c). */
rp_status rpi_plan_memory(const rp_session *s, int stage, rp_memory *out, rp_error *err);

/* Reads (write_it false) or writes bytes of a file at an offset, whole. */
rp_status rpi_pio(int fd, void *buf, size_t bytes, off_t at, bool write_it);

/* The workers that reduce worker (c, s, tensor rank k) under grouping g:
** every stage replica of stage s in every replica of c's group, of tensor
** rank k, by worker id (layout.c). */
int rpi_reduce_members(const rp_session *s, const rp_grouping *g, int c, int stage, int k,
                       int *out);

/* Schedule pipedream: the weight versions a worker of `stage` keeps beside
** its own. One a micro-batch in flight (its activation slots); with vertical
** sync every version of a call, GA / r_s + 1. */
static inline int rpi_pipedream_versions(const rp_session *s, int stage, int slots) {
    return s->cfg.pipedream_vertical_sync
               ? s->GA / rp_config_stage_replicas(&s->cfg, stage) + 1
               : slots;
}

#endif /* REPIPE_SESSION_IMPL_H */
