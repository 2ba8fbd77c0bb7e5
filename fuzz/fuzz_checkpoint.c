/*
** Fuzz target: the checkpoint reader. Any input must either load or fail
** with a message; a loaded checkpoint holds weights and optimizer state,
** counters in range, and a configuration compatible with itself.
**
** Each input is read twice: as it is (its checksums then almost never
** match), and with every checksum made right where its lengths allow, so
** that mutations reach the header's JSON and the weight images behind the
** checksums.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "repipe/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void parse(const uint8_t *data, size_t size) {
    rp_checkpoint c;
    rp_error err;
    if (rp_checkpoint_parse(&c, data, size, "fuzz", &err) != RP_OK) {
        if (err.msg[0] == '\0')
            abort(); /* every failure must say why */
        return;
    }
    char why[128];
    if (!c.state.weights || !c.state.optimizer || c.state.steps > c.state.updates ||
        c.state.skipped > c.state.updates || !(c.state.loss_scale > 0) ||
        !rp_checkpoint_compatible(&c.config, &c.config, why, sizeof why))
        abort();
    rp_checkpoint_free(&c);
}

static void put_crc(uint8_t *at, const uint8_t *from, size_t n) {
    uint32_t crc = (uint32_t)crc32(0L, from, (uInt)n);
    memcpy(at, &crc, 4);
}

/* Recomputes the header's, the two weight images' and the file's CRC-32s
** where the lengths before them fit in the input. */
static void repair(uint8_t *d, size_t size) {
    if (size < 20 + 4)
        return;
    size_t at = 12, end = size - 4;
    uint32_t hl;
    memcpy(&hl, d + at, 4);
    at += 4;
    if (hl > end - at || end - at - hl < 4)
        goto whole;
    put_crc(d + at + hl, d + at, hl);
    at += hl + 4;
    for (int k = 0; k < 2; k++) {
        uint64_t n;
        if (end - at < 8)
            goto whole;
        memcpy(&n, d + at, 8);
        at += 8;
        if (n > end - at || n < 4)
            goto whole;
        put_crc(d + at + n - 4, d + at, (size_t)n - 4);
        at += (size_t)n;
    }
whole:
    put_crc(d + size - 4, d, size - 4);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    parse(data, size);
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    repair(copy, size);
    parse(copy, size);
    free(copy);
    return 0;
}
