/*
** Fuzz target: the safetensors reader. An accepted file must write and read
** back to the same tensors, values bit for bit.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/weights.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rp_weights *w, *back;
    rp_error err;
    if (rp_safetensors_parse(&w, data, size, "fuzz", &err) != RP_OK) {
        if (err.msg[0] == '\0')
            abort();
        return 0;
    }
    unsigned char *buf;
    size_t len;
    if (rp_safetensors_serialize(w, &buf, &len, &err) != RP_OK)
        abort();
    if (rp_safetensors_parse(&back, buf, len, "again", &err) != RP_OK ||
        back->num_tensors != w->num_tensors)
        abort();
    for (int i = 0; i < w->num_tensors; i++) {
        const rp_tensor *a = &w->tensors[i], *b = &back->tensors[i];
        size_t n = rp_shape_size(&a->shape);
        if (strcmp(a->name, b->name) != 0 || n != rp_shape_size(&b->shape) ||
            memcmp(a->data, b->data, sizeof(float) * n) != 0)
            abort();
    }
    free(buf);
    rp_weights_free(back);
    rp_weights_free(w);
    return 0;
}
