/*
** Fuzz target: schedule CSVs as 'simulate --schedule-csv' reads them. Any
** input must either parse or fail with a message; what parses is played
** with unit times (a stage a layer) and must either end, with a time and a
** bubble that make sense, or be refused with a message.
*/
#include <stdint.h>
#include <stdlib.h>

#include "repipe/config.h"
#include "repipe/simulate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rp_sim_actions *a;
    rp_error err;
    if (rp_sim_actions_parse((const char *)data, size, "fuzz", &a, &err) != RP_OK) {
        if (!err.msg[0])
            abort();
        return 0;
    }
    int S = rp_sim_actions_stages(a), R = rp_sim_actions_ranks(a);
    if (S < 1 || S > RP_MAX_STAGES || R < 1 || rp_sim_actions_micro_batches(a) < 1)
        abort();
    static double one[RP_MAX_STAGES], two[RP_MAX_STAGES];
    for (int s = 0; s < S; s++)
        one[s] = 1, two[s] = 2;
    rp_config cfg;
    rp_config_default(&cfg);
    cfg.micro_batch_size = 1;
    cfg.layers_per_stage.count = S;
    for (int s = 0; s < S; s++)
        cfg.layers_per_stage.layers[s] = 1;
    rp_sim_options o;
    rp_sim_options_default(&o);
    rp_sim_result r;
    if (R <= RP_MAX_WORKERS && rp_simulate_actions(&cfg, a, one, two, one, one, S, &o, &r, &err) == RP_OK) {
        if (!(r.update_time >= 0) || !(r.bubble_fraction >= -1e-9 && r.bubble_fraction <= 1))
            abort();
        rp_sim_result_free(&r);
    } else if (R <= RP_MAX_WORKERS && !err.msg[0]) {
        abort();
    }
    rp_sim_actions_free(a);
    return 0;
}
