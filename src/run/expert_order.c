/*
** Expert parallelism on devices that run several workers (the V shapes,
** DualPipe): an expert group's members may sit on different devices, each
** device running its workers' operations one after another. Every moe layer
** of a forward or backward runs its group's all-to-alls inside it, so two
** devices must reach the groups they share in one order, or each would wait
** in a group the other has not reached. DualPipe keeps them in step by its
** symmetry (stage s of replica 1 on the mirror device of replica 0's); this
** checks it of the plan at hand rather than trusting it, and refuses a plan
** that would hang.
*/
#include <stdlib.h>

#include "session_impl.h"

/* A worker's expert group (its first member), or -1 where its stage has no
** moe layer. */
static int group_of(const rp_session *s, int x) {
    const rp_worker_ops *w = &s->plan->w[x];
    bool moe = false;
    for (int l = s->first[w->stage]; l < s->first[w->stage + 1]; l++)
        moe = moe || s->m->layers[l].type == RP_LAYER_MOE;
    if (!moe)
        return -1;
    int G = s->cfg.expert_parallel;
    return rp_workplan_worker(&s->cfg, w->replica - w->replica % G, w->stage, w->stage_replica) +
           w->tensor_rank;
}

/* Whether worker x's expert group has a member on device e: its G members,
** one a replica of the group, at x's stage, stage replica and tensor rank. */
static bool on_device(const rp_session *s, int x, int e) {
    const rp_worker_ops *w = &s->plan->w[x];
    int G = s->cfg.expert_parallel, first = w->replica - w->replica % G;
    for (int i = 0; i < G; i++)
        if (s->plan->device_of[rp_workplan_worker(&s->cfg, first + i, w->stage,
                                                  w->stage_replica) + w->tensor_rank] == e)
            return true;
    return false;
}

/* Device d's passes, in order, of the groups that also have a member on
** device e: (group, backward, micro-batch) into out; their number. */
static int passes(const rp_session *s, const int *group, int d, int e, int *out) {
    const rp_workplan *p = s->plan;
    const rp_device_ops *dv = &p->dev[d];
    int n = 0;
    for (int i = 0; i < dv->num; i++) {
        int x = dv->worker[i], g = group[x];
        const rp_op *op = &p->w[x].ops[dv->op[i]];
        bool fwd = op->kind == RP_OP_FORWARD;
        bool back = op->kind == RP_OP_BACKWARD || op->kind == RP_OP_BACKWARD_INPUT;
        if ((fwd || back) && g >= 0 && on_device(s, x, e)) {
            out[n++] = g, out[n++] = back, out[n++] = op->mb;
        }
    }
    return n;
}

rp_status rpi_expert_order_check(const rp_session *s, rp_error *err) {
    const rp_workplan *p = s->plan;
    if (s->cfg.expert_parallel <= 1 || !p->devices)
        return RP_OK;
    size_t most = 0;
    for (int d = 0; d < p->devices; d++)
        most = (size_t)p->dev[d].num > most ? (size_t)p->dev[d].num : most;
    int *group = malloc(sizeof(int) * p->workers);
    int *a = malloc(sizeof(int) * 3 * (most + 1)), *b = malloc(sizeof(int) * 3 * (most + 1));
    rp_status st = !group || !a || !b ? rp_fail(err, RP_ERR_NOMEM, "out of memory") : RP_OK;
    for (int x = 0; !st && x < p->workers; x++)
        group[x] = group_of(s, x);
    for (int d = 0; !st && d < p->devices; d++)
        for (int e = d + 1; !st && e < p->devices; e++) {
            int na = passes(s, group, d, e, a), nb = passes(s, group, e, d, b), k = 0;
            while (k < na && k < nb && a[k] == b[k])
                k++;
            if (k < na || k < nb)
                st = rp_fail(err, RP_ERR_INVALID,
                             "expert_parallel %d: devices %d and %d of this schedule reach their "
                             "expert groups' all-to-alls in different orders (micro-batch %d "
                             "against %d), which would hang: choose another shape or schedule",
                             s->cfg.expert_parallel, d, e, k < na ? a[k - k % 3 + 2] : -1,
                             k < nb ? b[k - k % 3 + 2] : -1);
        }
    free(group), free(a), free(b);
    return st;
}
