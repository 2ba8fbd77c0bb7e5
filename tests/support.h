/*
** Helpers shared by the tests that build models from spec text.
*/
#ifndef REPIPE_TEST_SUPPORT_H
#define REPIPE_TEST_SUPPORT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/model.h"

/* Parses a model spec or ends the test with the parser's message. */
static inline rp_model *test_model(const char *spec) {
    rp_model *m;
    rp_error err;
    if (rp_model_parse(&m, spec, strlen(spec), "test", &err) != RP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return m;
}

#endif /* REPIPE_TEST_SUPPORT_H */
