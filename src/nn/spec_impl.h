/*
** The spec parser's insides (internal): spec.c reads the lines, shapes.c
** infers each layer's output and lays out the model's parameters.
*/
#ifndef REPIPE_SPEC_IMPL_H
#define REPIPE_SPEC_IMPL_H

#include "repipe/model.h"

/* where the parser is, for its messages */
typedef struct pctx {
    const char *name;
    int line;
    rp_error *err;
} pctx;

/* Output shape and parameter count of a layer whose input shape is set. */
rp_status rpi_spec_infer(pctx *c, rp_layer *L, rp_model *m);
/* Fills the layers' variables and parameter offsets. */
rp_status rpi_spec_layout(rp_model *m, rp_error *err);

#endif /* REPIPE_SPEC_IMPL_H */
