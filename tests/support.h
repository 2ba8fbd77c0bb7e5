/*
** Helpers shared by the tests that build models from spec text.
*/
#ifndef REPIPE_TEST_SUPPORT_H
#define REPIPE_TEST_SUPPORT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/config.h"
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

/* Parses a configuration or ends the test with the JSON and the message. */
static inline rp_config test_config(const char *json) {
    rp_config c;
    rp_error err;
    if (rp_config_load_string(&c, json, strlen(json), "test", &err) != RP_OK) {
        fprintf(stderr, "%s\n%s\n", json, err.msg);
        exit(1);
    }
    return c;
}

#endif /* REPIPE_TEST_SUPPORT_H */
