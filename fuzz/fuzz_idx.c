/*
** Fuzz target: the IDX parser. Accepted input must describe exactly the
** bytes it was given.
*/
#include <stdint.h>
#include <stdlib.h>

#include "repipe/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int nd, dims[4];
    const unsigned char *v;
    rp_error err;
    if (rp_idx_parse(data, size, "fuzz", &nd, dims, &v, &err) != RP_OK) {
        if (err.msg[0] == '\0')
            abort();
        return 0;
    }
    size_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= (size_t)dims[i];
    if (v + n != data + size)
        abort();
    return 0;
}
