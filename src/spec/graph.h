/*
** A parsed model as a graph (internal): who reads what, checked once after
** parsing.
*/
#ifndef REPIPE_GRAPH_H
#define REPIPE_GRAPH_H

#include "repipe/spec.h"

/* Fills m->last_reader and refuses an output that nothing reads (but the
** last layer's); errors name the file `name` and the line. */
rp_status rpi_model_link(rp_model *m, const char *name, rp_error *err);

#endif /* REPIPE_GRAPH_H */
