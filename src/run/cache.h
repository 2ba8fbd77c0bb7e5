/*
** The executable cache (internal): a session's checked schedule and memory
** plan, stored under executable_cache_dir and keyed by a hash of the model,
** the configuration and the library version.
*/
#ifndef REPIPE_CACHE_H
#define REPIPE_CACHE_H

#include <stdint.h>

#include "repipe/spec.h"
#include "repipe/schedule.h"
#include "repipe/session.h"

/* What a cache lookup found. */
typedef enum cache_result {
    CACHE_HIT,     /* a valid entry: its schedule and memory plan are used */
    CACHE_MISS,    /* no entry */
    CACHE_REBUILD  /* an entry that is stale or damaged; `why` says which */
} cache_result;

/* The entry's path (dir/<16 hex digits>.rpx) and the key stored in it. */
void rpi_cache_key(const rp_model *m, const rp_config *cfg, char *path, size_t n, uint64_t *key);

/* Looks the entry up: on a hit, *plan (owned by the caller) and mem[0..P)
** are filled. `why` receives the reason of a rebuild. */
cache_result rpi_cache_load(const char *path, uint64_t key, int workers, int stages, int ga,
                        rp_workplan **plan, rp_memory *mem, char *why, size_t why_n);

/* The same on an entry's bytes (fuzzed). */
cache_result rpi_cache_parse(const unsigned char *data, size_t len, uint64_t key, int workers,
                         int stages, int ga, rp_workplan **plan, rp_memory *mem, char *why,
                         size_t why_n);

rp_status rpi_cache_store(const char *path, uint64_t key, const rp_workplan *plan,
                      const rp_memory *mem, rp_error *err);

#endif /* REPIPE_CACHE_H */
