/*
** What the tests of the V-shaped schedules share (test_zbv, test_dualpipev):
** a case of P pipeline workers on 2 P stages, and each case's training
** against 1f1b's on the same stages, bit for bit.
*/
#ifndef REPIPE_TEST_VSHAPE_H
#define REPIPE_TEST_VSHAPE_H

#include "support.h"

typedef struct vcase {
    int P, R, GA;
    const char *extra;
} vcase;

/* The case on 2 P stages under `schedule` ("zb-v"), or under 1f1b (NULL). */
static inline rp_config vconfig(const vcase *vc, const char *schedule, bool adam) {
    char key[64];
    snprintf(key, sizeof key, "\"schedule\": \"%s\"", schedule ? schedule : "1f1b");
    return test_stages_config(2 * vc->P, vc->GA, vc->R, key, adam, vc->extra);
}

/* Each case against 1f1b on threads, the MLP, the CNN and the GPT (the GPT
** alone where tensor groups split its blocks; no tie sharded); with ranks,
** on as many MPI ranks (a rank a device) where the case has that many
** devices. `plain`: the case's keys 1f1b does not take dropped for it. */
static inline void v_exact(const vcase *cases, size_t n, const char *schedule, int ranks,
                           rp_comm *mpi, const rp_dataset *data) {
    static const char *const models[] = {"mlp", "cnn", "gpt"};
    const char *const specs[] = {TEST_SPEC_MLP, TEST_SPEC_CNN, TEST_SPEC_GPT};
    int run = 0, equal = 0;
    for (size_t k = 0; k < n; k++) {
        const vcase *vc = &cases[k];
        if (ranks && test_devices(vconfig(vc, schedule, false)) != ranks)
            continue;
        for (int mi = 0; mi < 3; mi++) {
            if (mi == 2 && strstr(vc->extra, "sharding")) /* a tie is never sharded */
                continue;
            if (mi < 2 && strstr(vc->extra, "tensor_parallel"))
                continue;
            vcase plain = *vc;
            if (strstr(vc->extra, "zb_pass_times"))
                plain.extra = "";
            rp_config base = vconfig(&plain, NULL, mi != 2), c = vconfig(vc, schedule, mi != 2);
            double diff;
            bool same = test_same_training(specs[mi], mi == 2, &base, &c, ranks ? mpi : NULL,
                                           data, &diff);
            equal += same;
            CHECKF(same, "%s %s P=%d R=%d GA=%d%s: not 1f1b's bits (weights differ by %g)",
                   models[mi], schedule, vc->P, vc->R, vc->GA, vc->extra, diff);
            run++;
        }
    }
    CHECK(run > 0);
    printf("%d of %d %s runs%s equal to 1f1b bit for bit\n", equal, run, schedule,
           ranks ? " on MPI ranks" : "");
}

#endif /* REPIPE_TEST_VSHAPE_H */
