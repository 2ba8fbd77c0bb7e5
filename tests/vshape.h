/*
** What the tests of the schedules whose devices hold two workers share
** (test_zbv, test_dualpipev, test_dualpipe): a case of P pipeline workers
** on `per` P stages (2: a V's chunks; 1: DualPipe's stages, two replicas'
** on a device), each case's training against 1f1b's on the same stages,
** bit for bit, and a device's passes in micro-batch order.
*/
#ifndef REPIPE_TEST_VSHAPE_H
#define REPIPE_TEST_VSHAPE_H

#include "support.h"

typedef struct vcase {
    int P, R, GA;
    const char *extra;
} vcase;

/* The case on per P stages under `schedule` ("zb-v"), or under 1f1b (NULL). */
static inline rp_config vconfig(const vcase *vc, int per, const char *schedule, bool adam) {
    char key[64];
    snprintf(key, sizeof key, "\"schedule\": \"%s\"", schedule ? schedule : "1f1b");
    return test_stages_config(per * vc->P, vc->GA, vc->R, key, adam, vc->extra);
}

/* Each case against 1f1b on threads, the MLP, the CNN and the GPT (the GPT
** alone where tensor groups split its blocks; no tie sharded); with ranks,
** on as many MPI ranks (a rank a device) where the case has that many
** devices. `plain`: the case's keys 1f1b does not take dropped for it. */
static inline void v_exact(const vcase *cases, size_t n, int per, const char *schedule,
                           int ranks, rp_comm *mpi, const rp_dataset *data) {
    static const char *const models[] = {"mlp", "cnn", "gpt"};
    const char *const specs[] = {TEST_SPEC_MLP, TEST_SPEC_CNN, TEST_SPEC_GPT};
    int run = 0, equal = 0;
    for (size_t k = 0; k < n; k++) {
        const vcase *vc = &cases[k];
        if (ranks && test_devices(vconfig(vc, per, schedule, false)) != ranks)
            continue;
        for (int mi = 0; mi < 3; mi++) {
            if (mi == 2 && strstr(vc->extra, "sharding")) /* a tie is never sharded */
                continue;
            if (mi < 2 && strstr(vc->extra, "tensor_parallel"))
                continue;
            vcase plain = *vc;
            if (strstr(vc->extra, "zb_pass_times"))
                plain.extra = "";
            rp_config base = vconfig(&plain, per, NULL, mi != 2);
            rp_config c = vconfig(vc, per, schedule, mi != 2);
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

/* A training state (Adam's) moves between the case under `schedule` on
** the MPI world `on` (NULL: threads) and 1f1b on threads, either way, and
** the MLP's run goes on as if never stopped. */
static inline void v_resume(const vcase *vc, int per, const char *schedule, rp_comm *on,
                            const rp_dataset *data) {
    rp_model *m = test_model(TEST_SPEC_MLP);
    rp_config one = vconfig(vc, per, NULL, true), c = vconfig(vc, per, schedule, true);
    float losses[128];
    rp_weights *straight = test_two_calls(m, &one, false, NULL, data, losses);
    CHECK(straight && test_resumed_same(m, &c, on, &one, NULL, straight, data));
    CHECK(straight && test_resumed_same(m, &one, NULL, &c, on, straight, data));
    rp_weights_free(straight);
    rp_model_free(m);
}

/* A pass's kind: 0 a forward, 1 a backward's input half, 2 its weights'
** half, -1 anything else. */
static inline int v_pass(const rp_op *op) {
    return op->kind == RP_OP_FORWARD           ? 0
           : op->kind == RP_OP_BACKWARD_INPUT  ? 1
           : op->kind == RP_OP_BACKWARD_WEIGHT ? 2
                                               : -1;
}

/* Device d of p: each of its workers' forwards, input halves and weights'
** halves in micro-batch order, m of each (checked; `what` names the case).
** Returns the most micro-batches' activations the device holds from F to
** W, and in *fwd_first (unless NULL) its forwards before its first
** backward. */
static inline int v_device_passes(const rp_workplan *p, int d, int m, const char *what,
                                  int *fwd_first) {
    int (*next)[3] = calloc((size_t)p->workers, sizeof *next);
    int held = 0, most = 0, first = 0, seen_b = 0;
    const rp_device_ops *dv = &p->dev[d];
    for (int j = 0; next && j < dv->num; j++) {
        int w = dv->worker[j];
        const rp_op *op = &p->w[w].ops[dv->op[j]];
        int k = v_pass(op);
        if (k < 0)
            continue;
        CHECKF(op->mb == next[w][k], "%s device %d: worker %d's pass %d of micro-batch %d, "
               "want %d", what, d, w, k, op->mb, next[w][k]);
        next[w][k] = op->mb + 1;
        seen_b += k == 1;
        held += (k == 0) - (k == 2);
        most = held > most ? held : most;
        first += k == 0 && !seen_b;
    }
    CHECK(next != NULL);
    for (int w = 0; next && w < p->workers; w++)
        if (p->device_of[w] == d)
            CHECK(next[w][0] == m && next[w][1] == m && next[w][2] == m);
    free(next);
    if (fwd_first)
        *fwd_first = first;
    return most;
}

/* Device d's first operation of `kind` on worker w (-1: none). */
static inline int v_find_op(const rp_workplan *p, int d, int w, rp_op_kind kind) {
    const rp_device_ops *dv = &p->dev[d];
    for (int j = 0; j < dv->num; j++)
        if (dv->worker[j] == w && p->w[w].ops[dv->op[j]].kind == kind)
            return j;
    return -1;
}

#endif /* REPIPE_TEST_VSHAPE_H */
