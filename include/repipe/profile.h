/*
** Per-layer profiles in PipeDream's graph.txt format (docs/planner.md).
**
** One node per line:
**   ID -- DESCRIPTION -- forward_compute_time=F, backward_compute_time=B,
**         activation_size=A, parameter_size=P[ -- stage_id=S]
** where A may be a list "[a; b; ...]" (summed), times are milliseconds and
** sizes bytes. Edge lines start with a tab: "\tX -- Y".
*/
#ifndef REPIPE_PROFILE_H
#define REPIPE_PROFILE_H

#include <stddef.h>

#include "repipe/core.h"
#include "repipe/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rp_profile_node {
    char *id;
    char *desc;
    double forward_ms;
    double backward_ms;
    double activation_bytes; /* a list is summed */
    double parameter_bytes;
    int stage_id; /* -1 when the line has none */
    int line;     /* 1-based line in the file */
} rp_profile_node;

typedef struct rp_profile_edge {
    int from, to; /* node indices */
    int line;
} rp_profile_edge;

typedef struct rp_profile {
    int num_nodes;
    rp_profile_node *nodes; /* in file order */
    int num_edges;
    rp_profile_edge *edges; /* in file order */
} rp_profile;

/* Parses graph.txt text; `name` prefixes messages ("graph.txt:12: ..."). The
** graph must be non-empty, acyclic, with unique ids and known edge ends. */
rp_status rp_profile_parse(rp_profile **out, const char *text, size_t len, const char *name,
                           rp_error *err);
rp_status rp_profile_read(rp_profile **out, const char *path, rp_error *err);

/* Writes the profile in the same format (nodes, then each node's incoming
** edges). stage_ids, if not NULL, overrides the nodes' stage ids (-1: none).
** The caller frees *out. */
rp_status rp_profile_to_string(const rp_profile *p, const int *stage_ids, char **out,
                               rp_error *err);
rp_status rp_profile_write(const rp_profile *p, const int *stage_ids, const char *path,
                           rp_error *err);

/* The profile's layers: its nodes in topological order (ties by file
** order), Input sources left out, as parallel arrays (forward and backward
** ms, output and parameter bytes) of *n entries. The caller frees each. */
rp_status rp_profile_layers(const rp_profile *p, double **fwd_ms, double **bwd_ms,
                            double **out_bytes, double **param_bytes, int **node, int *n,
                            rp_error *err);

/* Bytes a cut of that order carries: cut[k] (0 < k < n) is the output of
** every node before position k that a node at k or later reads (Input
** sources included); cut[0] = 0. A chain's cut[k] is out_bytes[k - 1]; a
** residual block cut in its middle carries its skip too. `node` and `n`
** are rp_profile_layers' order; the caller frees *cut (n + 1 entries). */
rp_status rp_profile_cut_bytes(const rp_profile *p, const int *node, int n, double **cut,
                               rp_error *err);

/* The micro-batch the profile was measured on, as 'repipe profile' records
** it in the Input source's description ("Input0 micro_batch=64"); 0 when
** the profile does not say. */
int rp_profile_micro_batch(const rp_profile *p);

/* The tensor group the profile was measured on a rank of
** ("Input0 micro_batch=1 tensor_parallel=2": its times hold the group's
** all-reduces, its parameters and memory are the rank's); 1 when the
** profile does not say, 0 where it says something else than 1 to 64. */
int rp_profile_tensor_parallel(const rp_profile *p);

/* Per layer of rp_profile_layers' order (node, n), the two halves of a
** split backward (the zero-bubble schedules'): the input's gradient (B)
** and the weights' (W). 'repipe profile' times them apart and records them
** in the node's description ("... backward_input_time=B
** backward_weight_time=W"), where PipeDream's reader ignores them (its
** numbers must be exactly four). A node that does not record them: W half
** the backward of a node with parameters (a product's two products are of
** equal size), none of one without, and B the rest. A bad number is
** refused with the node's line. The caller frees *b and *w (n entries). */
rp_status rp_profile_split_ms(const rp_profile *p, const int *node, int n, double **b,
                              double **w, rp_error *err);

/* Per layer of rp_profile_layers' order (node, n), the number a node's
** description records after `key` ("saved_bytes="): *out NULL where no
** layer records it; refused, with the node's line, where some do and one
** does not, or it is not a number >= 0. The caller frees *out. */
rp_status rp_profile_numbers(const rp_profile *p, const int *node, int n, const char *key,
                             double **out, rp_error *err);
/* The five memory counts 'repipe profile' records per layer (saved_bytes,
** checkpoint_bytes, wstash_bytes, scratch_bytes, grad_bytes: net.h's
** rp_layer_bytes), each read as rp_profile_numbers reads one into out[k]
** (NULL where no layer records it). On error none is kept. The caller
** frees each. */
rp_status rp_profile_memory(const rp_profile *p, const int *node, int n, double *out[5],
                            rp_error *err);

/* Index of the node with this id, or -1. */
int rp_profile_find(const rp_profile *p, const char *id);

void rp_profile_free(rp_profile *p);

/* Profiling a repipe model on this machine (src/profile/measure.c): it runs
** the model's layers, so the profiles' room sits above the nets'. */
/* Measures a repipe model on this machine: per layer the median forward and
** backward time of `repeats` runs on `batch` rows, its output bytes and its
** parameter bytes, as a profile that starts with an Input source and chains
** the layers in order (PipeDream's optimizer reads it too). Each layer is
** timed inside whole passes of the model, as a stage runs it; where the
** model, its gradients and a micro-batch's activations would take over a
** quarter of the memory, each layer alone on what it reads. The Input's
** description says which (timed_in=whole_passes or timed_in=layers_alone).
** The caller frees *out with rp_profile_free. */
rp_status rp_profile_measure(const rp_model *m, int batch, int repeats, rp_profile **out,
                             rp_error *err);
/* The same with every layer timed alone, whatever the model's size. */
rp_status rp_profile_measure_alone(const rp_model *m, int batch, int repeats, rp_profile **out,
                                   rp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_PROFILE_H */
