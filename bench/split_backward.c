/*
** A split backward against the fused one, per layer kind: the input's half
** (B) and the weights' half (W) of a net made with split_backward, beside
** rp_net_backward of the same layers with the same weights and input, on
** one thread. Each round runs a forward and the fused backward on one net,
** a forward and B then W on the other, in turn (which first alternates),
** and times the backward calls alone; the ratio (B + W) / fused is taken
** per round, and its median printed with both medians. The output's
** gradient is handed to each net where it would be received: in its own
** buffer for the fused one, in the stash for the split one
** (rp_net_grad_in_place), as the engine's workers receive it.
**
**   bench_split_backward [ROUNDS [BATCH]]
**
** The kinds: a linear, an attention (fused Q K V rows in, grouped query,
** rotary), GPT-2's transformer_block, and a LLaMA block (llama_block's
** twelve layers), each at 64 rows of 128 features a sample, batch 8 unless
** BATCH says (1 to 64: the stash then grows with it, see
** docs/performance.md).
*/
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/blas.h"
#include "../src/core/util.h"
#include "repipe/repipe.h"

static const struct {
    const char *name, *spec;
    int layers; /* the net: the spec's first this many layers */
} KINDS[] = {
    {"linear", "input 64 128\nlinear 512\nlinear 16\nsoftmax_cross_entropy\n", 1},
    {"attention", "input 64 192\nattention heads=8 kv_heads=2 rope_theta=10000\nlinear 16\n"
                  "softmax_cross_entropy\n", 1},
    {"transformer_block", "input 64 128\ntransformer_block heads=4\nlinear 16\n"
                          "softmax_cross_entropy\n", 1},
    {"llama_block", "input 64 128\nllama_block heads=8 kv_heads=2\nlinear 16\n"
                    "softmax_cross_entropy\n", 12},
};

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 41, B = argc > 2 ? atoi(argv[2]) : 8;
    if (rounds < 1 || B < 1 || B > 64) {
        fprintf(stderr, "usage: bench_split_backward [ROUNDS [BATCH 1..64]]\n");
        return 2;
    }
    rp_error err;
    if (rpi_blas_single(&err)) {
        fprintf(stderr, "bench_split_backward: %s\n", err.msg);
        return 1;
    }
    rp_fpu_fast_denormals();
    printf("%-18s %12s %12s %12s %10s   (%d rounds, batch %d, one thread)\n", "layer kind",
           "fused (ms)", "B (ms)", "W (ms)", "(B+W)/fused", rounds, B);
    for (size_t k = 0; k < sizeof KINDS / sizeof KINDS[0]; k++) {
        rp_model *m;
        rp_error err;
        if (rp_model_parse(&m, KINDS[k].spec, strlen(KINDS[k].spec), KINDS[k].name, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        int L = KINDS[k].layers;
        rp_net *net[2];
        rp_acts *acts[2];
        rp_net_options o[2] = {{.split_backward = false}, {.split_backward = true}};
        for (int i = 0; i < 2; i++)
            if (rp_net_create_with(m, 0, L, B, &o[i], &net[i], &err) ||
                rp_acts_create(net[i], B, &acts[i], &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
        rp_model_init_params(m, 0, L, 1, NULL, rp_net_params(net[0]));
        rp_model_init_params(m, 0, L, 1, NULL, rp_net_params(net[1]));
        size_t in = rp_net_in_size(net[0]) * B, out = rp_net_out_size(net[0]) * B;
        float *x = malloc(sizeof(float) * in), *dy = malloc(sizeof(float) * out);
        for (size_t i = 0; i < in; i++)
            x[i] = (float)((i * 7919) % 2003) / 2003.0f - 0.5f;
        for (size_t i = 0; i < out; i++)
            dy[i] = (float)((i * 104729) % 1009) / 1009.0f - 0.5f;
        int64_t ids[64] = {0};
        rp_step_ctx ctx = {.training = true, .sample_id = ids, .loss_scale = 1.0};
        double *fused = malloc(sizeof(double) * rounds), *bh = malloc(sizeof(double) * rounds);
        double *wh = malloc(sizeof(double) * rounds), *ratio = malloc(sizeof(double) * rounds);
        for (int r = -3; r < rounds; r++) { /* three rounds to warm up */
            double t[3] = {0};
            for (int j = 0; j < 2; j++) {
                int i = (j + r + 3) % 2; /* which net first alternates */
                rp_net_forward(net[i], acts[i], x, B, &ctx, NULL);
                double t0 = rp_now();
                if (i == 0) {
                    rp_net_backward(net[0], acts[0], dy, &ctx, true);
                    t[0] = rp_now() - t0;
                } else {
                    /* the engine receives the gradient where the split keeps it
                    ** (rp_net_grad_in_place): the receive's copy, not timed, as
                    ** the fused net's receive into its own buffer is not */
                    float *home = rp_net_grad_in_place(net[1], acts[1]);
                    if (home)
                        memcpy(home, dy, sizeof(float) * out);
                    t0 = rp_now();
                    rp_net_backward_input(net[1], acts[1], home ? home : dy, &ctx, true);
                    double t1 = rp_now();
                    rp_net_backward_weight(net[1], acts[1], &ctx);
                    t[1] = t1 - t0, t[2] = rp_now() - t1;
                }
            }
            if (r < 0)
                continue;
            fused[r] = t[0] * 1e3, bh[r] = t[1] * 1e3, wh[r] = t[2] * 1e3;
            ratio[r] = (t[1] + t[2]) / t[0];
        }
        double rr = median(ratio, rounds);
        printf("%-18s %12.3f %12.3f %12.3f %10.3f\n", KINDS[k].name, median(fused, rounds),
               median(bh, rounds), median(wh, rounds), rr);
        free(fused), free(bh), free(wh), free(ratio), free(x), free(dy);
        for (int i = 0; i < 2; i++)
            rp_acts_free(acts[i]), rp_net_free(net[i]);
        rp_model_free(m);
    }
    return 0;
}
