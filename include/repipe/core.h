/*
** repipe core: status codes and error reporting shared by every module.
**
** Every library function that can fail returns an rp_status and, when it
** fails, fills the caller's rp_error with one sentence that names the file,
** line or key at fault. The library never prints and never exits.
*/
#ifndef REPIPE_CORE_H
#define REPIPE_CORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rp_status {
    RP_OK = 0,
    RP_ERR_INVALID = 1,   /* bad argument or value */
    RP_ERR_PARSE = 2,     /* malformed input text */
    RP_ERR_IO = 3,        /* a file could not be read or written */
    RP_ERR_NOMEM = 4,     /* allocation failed */
    RP_ERR_INFEASIBLE = 5, /* no solution satisfies the constraints */
    RP_ERR_ABORTED = 6     /* another worker failed; the message is its own */
} rp_status;

#define RP_ERROR_MAX 1024

/* Workers of one run: threads of a local world, or MPI ranks. */
#define RP_MAX_WORKERS 4096
/* Samples of one host call (2^40): more than any dataset holds, and far
** from the 64-bit products that would wrap. */
#define RP_MAX_SAMPLES (1LL << 40)

typedef struct rp_error {
    rp_status status;
    char msg[RP_ERROR_MAX];
} rp_error;

/* Records status and a printf-style message in err (if err is not NULL) and
** returns status, so that callers can write `return rp_fail(err, ...)`. */
rp_status rp_fail(rp_error *err, rp_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Clears err to RP_OK and an empty message. */
void rp_error_clear(rp_error *err);

/* A short name for a status ("invalid value", "parse error", ...). */
const char *rp_status_name(rp_status status);

/* Counter-based randomness: a pure function of its keys, so a random
** number does not depend on how work is split across workers or on the
** order it is done in (dropout masks, initialisation, shuffling). */
uint64_t rp_hash64(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d);
/* Uniform in [0, 1) with 24 bits, from the same keys. */
float rp_uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d);

/* Turns on flush-to-zero and denormals-are-zero for the calling thread:
** denormal floats make products many times slower and carry no useful
** precision in training. */
void rp_fpu_fast_denormals(void);

/* IEEE half precision (binary16), rounded to nearest even; values past
** 65504 become infinities, as on a device that exchanges fp16. */
uint16_t rp_half_from_float(float f);
float rp_half_to_float(uint16_t h);
void rp_half_encode(const float *in, uint16_t *out, size_t n);
void rp_half_decode(const uint16_t *in, float *out, size_t n);

/* The library version as "MAJOR.MINOR.PATCH". */
const char *rp_version(void);

#ifdef __cplusplus
}
#endif
#endif /* REPIPE_CORE_H */
