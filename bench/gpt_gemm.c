/*
** The matrix products of one GPT training step alone, on one thread at their
** shapes, as the engine runs them (rpi_sgemm: oneDNN's sgemm where it is
** ahead, OpenBLAS's elsewhere; src/core/blas.c): the bound no trainer that
** uses these products can beat. Beside it, the same products all through
** OpenBLAS. Per block forward: QKV, the attention's Q K^T and P V for every
** (sample, head), the projection, the MLP's two; backward: the two products
** (weights, inputs) of each. Then the head (V x C) both ways.
** Beside them AdamW's pass over the model's parameters (learned positions, a
** tied head), as the engine runs it: work every step does besides its
** products, here with nothing between passes to push its arrays out of the
** caches, so the two together are a bound the step cannot beat either.
** Usage: bench_gpt_gemm B T C L V HEADS [REPEATS]; prints tokens/s.
*/
#include <cblas.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "../src/core/blas.h"
#include "../src/core/util.h"
#include "repipe/repipe.h"

static bool openblas_only; /* the second pass: cblas_sgemm, OpenBLAS's own */

static float *buf(size_t n) {
    float *p = malloc(sizeof(float) * n);
    for (size_t i = 0; p && i < n; i++)
        p[i] = (float)((i * 7919) % 2003) / 2003.0f - 0.5f;
    return p;
}

/* out (M x N) = a (M x K) b (K x N), in row-major terms with transposes */
static void mm(int M, int N, int K, const float *a, const float *b, float *c, bool ta, bool tb) {
    (openblas_only ? cblas_sgemm : rpi_sgemm)(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                                              tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, a,
                                              ta ? M : K, b, tb ? K : N, 0.0f, c, N);
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s B T C L V HEADS [REPEATS]\n", argv[0]);
        return 2;
    }
    int B = atoi(argv[1]), T = atoi(argv[2]), C = atoi(argv[3]), L = atoi(argv[4]);
    int V = atoi(argv[5]), H = atoi(argv[6]), reps = argc > 7 ? atoi(argv[7]) : 20;
    int R = B * T, hs = C / H;
    rp_error err;
    if (rpi_blas_single(&err)) {
        fprintf(stderr, "bench_gpt_gemm: %s\n", err.msg);
        return 1;
    }
    openblas_set_num_threads(1);
    rp_fpu_fast_denormals();
    size_t big = (size_t)R * 4 * C > (size_t)R * V ? (size_t)R * 4 * C : (size_t)R * V;
    float *x = buf(big), *y = buf(big), *w = buf((size_t)4 * C * C > (size_t)V * C ? (size_t)4 * C * C : (size_t)V * C);
    float *s = buf((size_t)T * T), *q = buf((size_t)T * hs), *o = buf((size_t)T * hs);
    if (!x || !y || !w || !s || !q || !o)
        return 1;
    /* the parameters: the token and position tables, each block's two norms,
    ** QKV, projection and MLP with their biases, the final norm */
    size_t np = (size_t)V * C + (size_t)T * C + (size_t)L * (12 * (size_t)C * C + 13 * C) + 2 * C;
    float *p = buf(np), *g = buf(np), *st = calloc(2 * np, sizeof(float));
    if (!p || !g || !st)
        return 1;
    rp_optimizer_config adamw = {.type = RP_OPT_ADAMW, .lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999,
                                 .eps = 1e-8};
    double best[3] = {1e30, 1e30, 1e30};
    for (int r = 0; r < reps; r++) {
        double t0 = rp_now();
        rp_optimizer_step(&adamw, r + 1, p, g, st, np);
        double t = rp_now() - t0;
        best[2] = t < best[2] ? t : best[2];
    }
    for (int r = 0; r < 2 * reps; r++) {
        openblas_only = r % 2; /* the two alternate */
        double t0 = rp_now();
        for (int l = 0; l < L; l++) {
            static const int outs[4] = {3, 1, 4, 1}, ins[4] = {1, 1, 1, 4}; /* x C */
            for (int k = 0; k < 4; k++) {
                int N = outs[k] * C, D = ins[k] * C;
                mm(R, N, D, x, w, y, false, true);  /* forward */
                mm(N, D, R, y, x, w, true, false);  /* weight gradient */
                mm(R, D, N, y, w, x, false, false); /* input gradient */
            }
            for (int bh = 0; bh < B * H; bh++) {
                mm(T, T, hs, q, o, s, false, true);  /* S = Q K^T */
                mm(T, hs, T, s, q, o, false, false); /* P V */
                mm(T, T, hs, o, q, s, false, true);  /* dP = dO V^T */
                mm(T, hs, T, s, o, q, true, false);  /* dV = P^T dO */
                mm(T, hs, T, s, q, o, false, false); /* dQ = dS K */
                mm(T, hs, T, s, o, q, true, false);  /* dK = dS^T Q */
            }
        }
        mm(R, V, C, x, w, y, false, true); /* the head */
        mm(V, C, R, y, x, w, true, false);
        mm(R, C, V, y, w, x, false, false);
        double t = rp_now() - t0;
        best[openblas_only] = t < best[openblas_only] ? t : best[openblas_only];
    }
    printf("gemm bound B=%d T=%d C=%d L=%d V=%d heads=%d: %.2f ms a step, %.0f tokens/s\n", B, T,
           C, L, V, H, best[0] * 1e3, R / best[0]);
    printf("the same products through OpenBLAS alone: %.2f ms, %.0f tokens/s\n", best[1] * 1e3,
           R / best[1]);
    printf("AdamW's pass over the %.2f M parameters: %.2f ms; with the products %.2f ms a step, "
           "%.0f tokens/s at most\n", np / 1e6, best[2] * 1e3, (best[0] + best[2]) * 1e3,
           R / (best[0] + best[2]));
    free(x), free(y), free(w), free(s), free(q), free(o), free(p), free(g), free(st);
    return 0;
}
