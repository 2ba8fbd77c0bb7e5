/*
** The profile graph as the antichain search walks it (internal to
** antichain.c and antichain_graph.c): PipeDream's reduction, with Input
** sources and __getitem__ sinks removed, and per node its transitive
** predecessors and successors as bitsets.
*/
#ifndef REPIPE_ANTICHAIN_GRAPH_H
#define REPIPE_ANTICHAIN_GRAPH_H

#include <stdint.h>

#include "repipe/profile.h"

typedef uint64_t word;

#define BIT_SET(b, i) ((b)[(i) >> 6] |= (word)1 << ((i)&63))
#define BIT_GET(b, i) (((b)[(i) >> 6] >> ((i)&63)) & 1)

typedef struct graph {
    int n, nw;             /* nodes, words per bitset */
    unsigned char *alive;  /* not removed */
    int *out_start, *out;  /* out-neighbours in edge order (alive only) */
    word *pred, *succ;     /* transitive, n bitsets each */
    /* Per node x: the predecessors p of x with an out-neighbour outside
    ** x's past that is not x itself, which an antichain holding x is
    ** augmented with. It depends on x alone, so it is found once here, not
    ** for every antichain. */
    word *extra;
} graph;

/* Builds g from p; input_source (num_nodes bytes, zeroed) marks the Input
** sources removed. */
rp_status rpi_graph_build(const rp_profile *p, graph *g, unsigned char *input_source,
                          rp_error *err);
void rpi_graph_free(graph *g);

/* The first node left without an input, where the antichain DAG starts;
** fails, naming up to four, when a node left is not connected to it. */
rp_status rpi_graph_first_source(const rp_profile *p, const graph *g, int *first,
                                 rp_error *err);

#endif /* REPIPE_ANTICHAIN_GRAPH_H */
