/*
** The spec parser's insides (internal): spec.c reads the lines, shapes.c
** infers each layer's output and lays out the model's parameters.
*/
#ifndef REPIPE_SPEC_IMPL_H
#define REPIPE_SPEC_IMPL_H

#include "repipe/spec.h"

/* where the parser is, for its messages */
typedef struct pctx {
    const char *name;
    int line;
    rp_error *err;
} pctx;

/* One line split into words; options are the words holding '='. */
typedef struct rpi_words {
    int n;
    char *w[32];
} rpi_words;

/* The layer of one line's words (the kind first; no name or inputs). */
rp_status rpi_spec_parse_layer(pctx *c, rpi_words *w, rp_layer *L);
/* A whole number in [lo, hi], or a message naming `what` and the line. */
rp_status rpi_spec_want_int(pctx *c, const char *what, const char *s, long lo, long hi,
                            int *out);
/* A finite number written whole, as strtod reads it. */
bool rpi_spec_parse_float(const char *s, double *v);

/* Output shape and parameter count of a layer whose input shape is set. */
rp_status rpi_spec_infer(pctx *c, rp_layer *L, rp_model *m);
/* Fills the layers' variables and parameter offsets. */
rp_status rpi_spec_layout(rp_model *m, rp_error *err);

#endif /* REPIPE_SPEC_IMPL_H */
