/*
** Error reporting. Messages are formatted into the caller's buffer; nothing
** is allocated, so reporting an out-of-memory condition cannot itself fail.
*/
#include "repipe/core.h"

#include <stdio.h>
#include <string.h>

rp_status rp_fail(rp_error *err, rp_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

void rp_error_clear(rp_error *err) {
    if (err) {
        err->status = RP_OK;
        err->msg[0] = '\0';
    }
}

const char *rp_status_name(rp_status status) {
    switch (status) {
    case RP_OK: return "ok";
    case RP_ERR_INVALID: return "invalid value";
    case RP_ERR_PARSE: return "parse error";
    case RP_ERR_IO: return "i/o error";
    case RP_ERR_NOMEM: return "out of memory";
    case RP_ERR_INFEASIBLE: return "infeasible";
    case RP_ERR_ABORTED: return "aborted";
    }
    return "unknown status";
}

const char *rp_version(void) { return "0.2.0"; }
