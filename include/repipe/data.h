/*
** Datasets: IDX files (MNIST, Fashion-MNIST; gzipped or not) and synthetic
** data for tests, and the global sample stream of docs/replicas.md: sample
** order is fixed by (seed, epoch) and consumed an update at a time.
*/
#ifndef REPIPE_DATA_H
#define REPIPE_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "repipe/core.h"
#include "repipe/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rp_dataset {
    int n;           /* samples */
    rp_shape sample; /* shape of one sample */
    float *x;        /* n * size(sample) values (pixels scaled to [0, 1]) */
    int32_t *labels; /* n * label_count labels */
    int label_count; /* per sample: 1 for a class, T for a target per token */
    int num_classes;
} rp_dataset;

/* Whether a model can train on or be evaluated with the dataset: its
** samples are the model's input, and its labels are classes the model
** scores. `what` names the dataset in the message ("the test set of DIR"). */
rp_status rp_dataset_fits(const rp_dataset *d, const rp_model *m, const char *what,
                          rp_error *err);

/* Parses one IDX file's bytes (after decompression): magic 0x0000 08 NDIM,
** NDIM big-endian u32 sizes, then the unsigned bytes. *dims receives the
** sizes; *values points into data. */
rp_status rp_idx_parse(const unsigned char *data, size_t len, const char *name, int *ndim,
                       int dims[4], const unsigned char **values, rp_error *err);

/* Loads DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]. */
rp_status rp_dataset_load_idx(rp_dataset **out, const char *dir, bool train, rp_error *err);

/* Debian's dataset-fashion-mnist. */
#define RP_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* n samples of the given shape whose class is decided by a random linear
** function of the values, so that a model can learn it. */
rp_status rp_dataset_synthetic(rp_dataset **out, int n, rp_shape sample, int classes,
                               uint64_t seed, rp_error *err);

void rp_dataset_free(rp_dataset *d);

/* Tokens of a file: its bytes (vocabulary 256), or with llmc llm.c's token
** file (a 256 x int32 header [20240520, 1, count], then uint16 tokens;
** vocabulary: the largest token + 1). The caller frees *tokens. */
rp_status rp_tokens_read(const char *path, bool llmc, int32_t **tokens, size_t *count,
                         int *vocab, rp_error *err);
/* The same from bytes in memory; messages name `name`. */
rp_status rp_tokens_parse(const unsigned char *data, size_t len, bool llmc, const char *name,
                          int32_t **tokens, size_t *count, int *vocab, rp_error *err);
/* Samples of T tokens at a stride of T, each token's label the one after
** it: (count - 1) / T samples, label_count T. `what` names the source in
** messages. */
rp_status rp_dataset_from_tokens(const int32_t *tokens, size_t count, int T, int vocab,
                                 const char *what, rp_dataset **out, rp_error *err);

/* Copies the samples idx[0..count) into x (rows) and their labels
** (label_count each). */
void rp_dataset_gather(const rp_dataset *d, const int64_t *idx, int count, float *x,
                       int32_t *labels);

/* The global sample stream: epoch e visits all n samples in the order of
** a permutation fixed by (seed, e); an update takes the next `per_update`
** samples of its epoch, and an epoch's remainder smaller than an update is
** skipped. */
typedef struct rp_stream {
    uint64_t seed;
    int n, per_update;
    long long cached_epoch;
    int32_t *perm;
    bool sequential; /* set after init: every epoch in the dataset's order */
} rp_stream;

rp_status rp_stream_init(rp_stream *s, uint64_t seed, int n, int per_update, rp_error *err);
void rp_stream_free(rp_stream *s);
long long rp_stream_updates_per_epoch(const rp_stream *s);
/* Dataset indices of the samples of update u >= 0 (per_update of them).
** It reshuffles s->perm in place when u is of another epoch than the last
** call's, so a stream is one thread's at a time: callers that share one
** take turns (repipe.Stream holds a lock). */
rp_status rp_stream_update(rp_stream *s, long long u, int64_t *idx, rp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_DATA_H */
