/*
** Expert parallelism in the moe layer: G threads, each a net of the whole
** layer on its own B samples, member j running experts [j E / G, (j + 1) E /
** G) for all of them through the local backend's all-to-all, against one
** net on the G B samples. Outputs and input gradients equal bit for bit
** (an expert sees the same rows in the same order); the experts' weight
** gradients, summed over the members as the replicas' all-reduce sums them,
** bit for bit too (one member's are the sums, the others' zeros); the
** router's, each member's own tokens' sum, within float rounding.
*/
#include <pthread.h>
#include <stdlib.h>

#include "repipe/comm.h"
#include "repipe/net.h"
#include "test.h"

typedef struct member {
    rp_comm *comm;
    rp_net *net;
    rp_acts *acts;
    const float *x, *r;
    int B;
    rp_step_ctx ctx;
    const float *out, *din;
    rp_error err;
    rp_status st;
} member;

static void alltoall(void *ctx, const float *in, size_t n, float *out) {
    member *m = ctx;
    if (!m->st)
        m->st = rp_comm_alltoall(m->comm, NULL, in, n, out, &m->err);
}

static void *run(void *arg) {
    member *m = arg;
    m->out = rp_net_forward(m->net, m->acts, m->x, m->B, &m->ctx, NULL);
    m->din = rp_net_backward(m->net, m->acts, m->r, &m->ctx, true);
    return NULL;
}

static float value(size_t i, int salt) {
    return (float)((((long long)i * 7919 + salt * 104729) % 2003) / 2003.0 - 0.5);
}

static void check(const char *spec, int G, int B) {
    rp_model *m;
    rp_error err;
    CHECK_OK(rp_model_parse(&m, spec, strlen(spec), "moe", &err), err);
    if (!m)
        return;
    size_t in = rp_shape_size(&m->input), np = m->num_params;
    float *x = malloc(sizeof(float) * in * G * B), *r = malloc(sizeof(float) * in * G * B);
    for (size_t i = 0; i < in * G * B; i++)
        x[i] = 2 * value(i, 1), r[i] = value(i, 7);
    /* one worker on every sample */
    rp_net *one;
    rp_acts *oa;
    CHECK_OK(rp_net_create(m, 0, m->num_layers, G * B, &one, &err), err);
    CHECK_OK(rp_acts_create(one, G * B, &oa, &err), err);
    for (size_t i = 0; i < np; i++)
        rp_net_params(one)[i] = value(i, 3);
    rp_step_ctx ctx = {.training = true, .loss_scale = 1.0 / (G * B)};
    const float *y = rp_net_forward(one, oa, x, G * B, &ctx, NULL);
    const float *dx = rp_net_backward(one, oa, r, &ctx, true);
    /* G members */
    rp_world *world;
    CHECK_OK(rp_world_create(G, &world, &err), err);
    member mb[8];
    pthread_t t[8];
    for (int j = 0; j < G; j++) {
        member *p = &mb[j];
        *p = (member){.comm = rp_world_comm(world, j), .x = x + j * B * in, .r = r + j * B * in,
                      .B = B, .ctx = ctx};
        rp_net_options no = {.ep_size = G, .ep_rank = j, .ep_alltoall = alltoall, .ep_ctx = p};
        CHECK_OK(rp_net_create_with(m, 0, m->num_layers, B, &no, &p->net, &err), err);
        CHECK_OK(rp_acts_create(p->net, B, &p->acts, &err), err);
        memcpy(rp_net_params(p->net), rp_net_params(one), sizeof(float) * np);
    }
    for (int j = 0; j < G; j++)
        pthread_create(&t[j], NULL, run, &mb[j]);
    for (int j = 0; j < G; j++)
        pthread_join(t[j], NULL);
    const rp_layer *L = &m->layers[m->num_layers - 1];
    size_t router = (size_t)L->experts * L->in.dim[L->in.ndim - 1];
    for (int j = 0; j < G; j++) {
        CHECK_OK(mb[j].st, mb[j].err);
        CHECKF(mb[j].out && memcmp(mb[j].out, y + j * B * in, sizeof(float) * B * in) == 0,
               "%s G=%d: member %d's output differs from one worker's", spec, G, j);
        CHECKF(mb[j].din && memcmp(mb[j].din, dx + j * B * in, sizeof(float) * B * in) == 0,
               "%s G=%d: member %d's input gradient differs", spec, G, j);
    }
    size_t bad = 0;
    for (size_t i = 0; i < np; i++) {
        float sum = 0;
        for (int j = 0; j < G; j++)
            sum += rp_net_grads(mb[j].net)[i];
        float want = rp_net_grads(one)[i];
        bad += i < router ? !(fabsf(sum - want) <= 1e-6f * (1 + fabsf(want))) : sum != want;
    }
    CHECKF(bad == 0, "%s G=%d: %zu of %zu weight gradients differ", spec, G, bad, np);
    for (int j = 0; j < G; j++) {
        rp_acts_free(mb[j].acts);
        rp_net_free(mb[j].net);
    }
    rp_world_free(world);
    rp_acts_free(oa);
    rp_net_free(one);
    free(x), free(r);
    rp_model_free(m);
}

int main(void) {
    check("input 6 8\nmoe experts=4 top_k=2 ffn=5 balance=0.2\n", 2, 3);
    check("input 6 8\nmoe experts=4 top_k=2 ffn=5 balance=0.2\n", 4, 2);
    check("input 5 6\nmoe experts=8 top_k=3 ffn=4 gate=sigmoid balance=0.5\n", 4, 3);
    check("input 7\nmoe experts=6 top_k=1 ffn=3 norm=false\n", 2, 5);
    /* every token to one owner's experts: the padded blocks' worst case */
    check("input 4 6\nmoe experts=2 top_k=2 ffn=3\n", 2, 2);
    return test_finish("test_moe");
}
