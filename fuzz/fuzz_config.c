/*
** Fuzz target: the execution-configuration loader. Any input must either
** load or fail with a message; a loaded configuration's derived products
** must be in range, and it must survive a save/load round trip unchanged.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "repipe/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rp_config a, b;
    rp_error err;
    if (rp_config_load_string(&a, (const char *)data, size, "fuzz", &err) != RP_OK) {
        if (err.msg[0] == '\0')
            abort(); /* every failure must say why */
        return 0;
    }
    /* a loaded configuration's products stay in range: no signed overflow
    ** (UBSan) and no negative counts */
    rp_derived d;
    rp_config_derive(&a, &d);
    if (d.workers < 1 || d.inference_workers < 1 || d.samples_per_host_call < 1 ||
        d.inference_samples_per_host_call < 1)
        abort();
    int out[RP_MAX_STAGES];
    for (int L = 1; L < 40; L += 7)
        (void)rp_config_stage_layers(&a, L & 1, L, out, &err);
    char *text;
    if (rp_config_to_json(&a, &text, &err) != RP_OK)
        return 0;
    if (rp_config_load_string(&b, text, strlen(text), "saved", &err) != RP_OK ||
        !rp_config_equal(&a, &b))
        abort();
    free(text);
    return 0;
}
