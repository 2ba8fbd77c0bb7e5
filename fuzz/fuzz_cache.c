/*
** Fuzz target: the executable cache entry parser. The checksum is
** recomputed after mutation, so the structural checks behind it are reached;
** the key, worker and stage counts are taken from the entry itself. An
** accepted entry must describe workers whose operations stay in range, and
** pass through the hang checker (which answers, with a reason when it
** refuses).
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../src/run/cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 44 || size > (1 << 20))
        return 0;
    unsigned char *d = malloc(size);
    if (!d)
        return 0;
    memcpy(d, data, size);
    uint32_t crc = (uint32_t)crc32(0L, d, (uInt)(size - 4));
    for (int i = 0; i < 4; i++)
        d[size - 4 + i] = (unsigned char)(crc >> (8 * i));
    int workers = (int)le(d + 32, 4), stages = (int)le(d + 36, 4);
    if (workers < 1 || workers > 64)
        workers = 1;
    if (stages < 1 || stages > 8)
        stages = 1;
    rp_workplan *plan;
    rp_memory mem[8];
    char why[160];
    if (rpi_cache_parse(d, size, le(d + 24, 8), workers, stages, 4, &plan, mem, why, sizeof why) ==
        CACHE_HIT) {
        for (int i = 0; i < plan->workers; i++)
            for (int k = 0; k < plan->w[i].num_ops; k++)
                if (plan->w[i].ops[k].peer >= workers || plan->w[i].ops[k].mb >= 4)
                    abort();
        /* through the hang checker, as a session checks a cached entry: it
        ** must answer, whatever the operations are */
        rp_error err;
        if (rp_workplan_check(plan, NULL, &err) != RP_OK && !err.msg[0])
            abort();
        rp_workplan_free(plan);
    } else if (!why[0]) {
        abort();
    }
    free(d);
    return 0;
}
