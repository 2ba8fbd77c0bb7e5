/*
** The shape of a tensor as a value: its size and its text ("3x32x32"). Every
** layer file and the model read them; what shape each layer gives its
** output is inferred in shapes.c.
*/
#include <stdio.h>

#include "repipe/spec.h"

size_t rp_shape_size(const rp_shape *s) {
    size_t n = 1;
    for (int i = 0; i < s->ndim; i++)
        n *= (size_t)s->dim[i];
    return n;
}

char *rp_shape_to_string(const rp_shape *s, char *buf, size_t n) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < s->ndim && at < n; i++)
        at += snprintf(buf + at, n - at, "%s%d", i ? "x" : "", s->dim[i]);
    return buf;
}
