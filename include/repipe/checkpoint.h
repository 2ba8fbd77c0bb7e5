/*
** Checkpoints: a training run's whole state in one file, free of the layout
** it ran on, so that a run continues from it exactly, on the same workers
** or on others (see docs/checkpoints.md).
**
**   "RPCHKPT1"  u32 version (1)
**   u32 header length, header (JSON), u32 CRC-32 of the header
**   u64 length, the weights as a weight file (its own CRC-32 at its end)
**   u64 length, the optimizer state as a weight file
**   u32 CRC-32 of every byte before it
**
** The header holds the counters, the model's fingerprint, the training
** set's size, the configuration the run used and the layout it ran on.
** Files are written to a temporary name, fsynced, renamed and the
** directory fsynced, so a killed writer never leaves a damaged file under
** a checkpoint's name.
*/
#ifndef REPIPE_CHECKPOINT_H
#define REPIPE_CHECKPOINT_H

#include <stdint.h>

#include "repipe/config.h"
#include "repipe/core.h"
#include "repipe/session.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A run's identity: hexadecimal, made when a run starts and kept by the
** runs that resume it (a lineage of checkpoints). */
#define RP_RUN_ID_MAX 33

typedef struct rp_checkpoint {
    rp_train_state state;
    char run[RP_RUN_ID_MAX]; /* the run that wrote it; empty in older files */
    rp_config config;      /* the configuration of the run that wrote it */
    uint32_t model;        /* rp_model_fingerprint of its model */
    long long samples;     /* of its training set: the sample order depends on it */
    int workers, stages;   /* the layout it was written from, for people */
    char backend[8];       /* "local" or "mpi" */
} rp_checkpoint;

rp_status rp_checkpoint_save(const rp_checkpoint *c, const char *path, rp_error *err);
rp_status rp_checkpoint_load(rp_checkpoint *out, const char *path, rp_error *err);
/* Parses a checkpoint's bytes; errors name `name` and the damaged part. */
rp_status rp_checkpoint_parse(rp_checkpoint *out, const unsigned char *data, size_t len,
                              const char *name, rp_error *err);
void rp_checkpoint_free(rp_checkpoint *c);

/* A directory of checkpoints, ckpt-UPDATE.rpc, held by one run at a time
** (docs/checkpoints.md). Opening makes it if missing and takes its lock
** (DIR/repipe.lock, which names the holder: released when the holder
** closes it or dies, on any host that shares the directory's file system).
** Refused, before any work: a path that is not a directory or cannot be
** written; a directory another process holds (its run, host and pid are
** named); a directory with checkpoints of another run: for a new run (run
** NULL, given a new identity) any checkpoint, for a resumed one (run: the
** identity of the checkpoint it resumed) one of another identity. `from`,
** the checkpoint the run resumed from, is never pruned. */
typedef struct rp_checkpoint_dir rp_checkpoint_dir;
rp_status rp_checkpoint_dir_open(const char *dir, const char *run, const char *from,
                                 rp_checkpoint_dir **out, rp_error *err);
/* The identity the directory's run writes its checkpoints under. */
const char *rp_checkpoint_dir_run(const rp_checkpoint_dir *d);
/* Writes c as this run's ckpt-UPDATE.rpc (removing first the temporary
** files a killed writer left), then removes this run's older checkpoints
** beyond the newest `keep` (keep >= 1): never another run's, a file whose
** run cannot be read, or the one resumed from. The path written goes to
** path (cap bytes). */
rp_status rp_checkpoint_dir_write(rp_checkpoint_dir *d, const rp_checkpoint *c, int keep,
                                  char *path, size_t cap, rp_error *err);
/* Releases the lock. */
void rp_checkpoint_dir_close(rp_checkpoint_dir *d);

/* The newest checkpoint of dir that loads. One that does not (damaged,
** truncated, not a regular file) is passed over and named in note (cap
** bytes; empty when none was). Fails when the directory holds none that
** loads. */
rp_status rp_checkpoint_latest(const char *dir, rp_checkpoint *out, char *path, size_t cap,
                               char *note, size_t note_cap, rp_error *err);

/* Whether a run under `now` may continue from a checkpoint made under
** `was`: everything that changes the mathematics must be equal (samples
** per update, the optimizer, its learning-rate schedule, gradient
** clipping, the seed, replica groupings, loss scaling, fp16 exchange); the
** layout (replicas with the same samples per update, stages, stage
** replication, sharding, offchip state, schedule, device iterations,
** recomputation, backend) may differ, except under schedule pipedream,
** where the micro-batch, accumulation, replication, stages and stage
** replication are the mathematics too. False, with the first key that
** differs in `why`, otherwise. */
bool rp_checkpoint_compatible(const rp_config *was, const rp_config *now, char *why,
                              size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* REPIPE_CHECKPOINT_H */
