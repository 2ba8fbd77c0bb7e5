/*
** Fuzz target: plan files as 'train --plan' and 'simulate --plan' read
** them: the execution configuration they carry, applied over a default
** configuration, and the machine options. Any input must either apply or
** fail with a message; what applies must still derive sane numbers.
*/
#include <stdint.h>
#include <stdlib.h>

#include "repipe/config.h"
#include "repipe/planner.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rp_config cfg;
    rp_error err;
    rp_config_default(&cfg);
    if (rp_config_apply_plan(&cfg, (const char *)data, size, "fuzz", &err) == RP_OK) {
        rp_derived d;
        rp_config_derive(&cfg, &d);
        if (d.workers < 1 || d.workers > RP_MAX_WORKERS || d.samples_per_host_call < 1)
            abort();
    } else if (!err.msg[0]) {
        abort();
    }
    rp_plan_options o;
    if (rp_plan_options_from_json(&o, (const char *)data, size, "fuzz", &err) == RP_OK) {
        for (int l = 0; l < o.num_levels; l++)
            if (o.machines[l] < 1)
                abort();
    } else if (!err.msg[0]) {
        abort();
    }
    return 0;
}
