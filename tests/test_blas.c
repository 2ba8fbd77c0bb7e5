/*
** The products (src/core/blas.c): which library runs each shape, that
** oneDNN's sgemm and OpenBLAS's give the product a double-precision sum
** gives, transposed or not, through strided rows, written (over NaNs: beta 0
** reads nothing) or added to, the same bits every time on any thread, and
** that a product leaves no thread behind (oneDNN's OpenMP count set to one
** for the calling thread). Where oneDNN is built in (REPIPE_EXPECT_DNNL) it
** is expected on the larger products; `--openblas` runs under
** REPIPE_GEMM=openblas and expects OpenBLAS on every one.
*/
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/blas.h"
#include "test.h"

static bool expect_openblas; /* --openblas: REPIPE_GEMM=openblas is set */

static const char *expected(bool dnnl_side) {
#ifndef REPIPE_EXPECT_DNNL
    dnnl_side = false;
#endif
    return dnnl_side && !expect_openblas ? "onednn" : "openblas";
}

/* Threads: the process's count, from /proc */
static int threads_now(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    if (f)
        fclose(f);
    return n;
}

static void library_choice(void) {
    static const struct {
        int M, N, K;
        bool ta, tb, dnnl;
    } cases[] = {
        {256, 1024, 256, false, true, true},   /* a GPT block's MLP, forward */
        {1024, 256, 256, true, false, true},   /* its weights' gradient */
        {256, 256, 1024, false, false, true},  /* its input's */
        {128, 128, 128, false, false, true},   /* 2^21: the least that goes */
        {127, 128, 128, false, false, false},  /* just under */
        {64, 64, 64, false, true, false},      /* attention's, a head at a time */
        {64, 10, 512, false, true, false},     /* a classifier's head */
        {64, 576, 3136, false, true, false},   /* a weight gradient over many positions */
        {256, 256, 1024, false, true, true},   /* four times its side: still oneDNN's */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *got = rpi_sgemm_library(cases[i].ta ? CblasTrans : CblasNoTrans,
                                            cases[i].tb ? CblasTrans : CblasNoTrans, cases[i].M,
                                            cases[i].N, cases[i].K);
        const char *want = expected(cases[i].dnnl);
        CHECKF(strcmp(got, want) == 0, "%d x %d x %d (%c%c): %s, not %s", cases[i].M, cases[i].N,
               cases[i].K, cases[i].ta ? 'T' : 'N', cases[i].tb ? 'T' : 'N', got, want);
    }
}

/* C (M x N) = alpha op(A) op(B) + beta C, each matrix stored with rows
** wider than it needs (lda, ldb: 5 more; ldc: 3 more) */
typedef struct product {
    int M, N, K;
    bool ta, tb;
    int lda, ldb, ldc;
    float *a, *b, *c;
} product;

static product make(int M, int N, int K, bool ta, bool tb) {
    product p = {M, N, K, ta, tb, (ta ? M : K) + 5, (tb ? K : N) + 5, N + 3, NULL, NULL, NULL};
    size_t na = (size_t)p.lda * (ta ? K : M), nb = (size_t)p.ldb * (tb ? N : K);
    p.a = malloc(sizeof(float) * na), p.b = malloc(sizeof(float) * nb);
    p.c = malloc(sizeof(float) * (size_t)p.ldc * M);
    for (size_t i = 0; i < na; i++)
        p.a[i] = (float)((i * 7919) % 2003) / 2003.0f - 0.5f;
    for (size_t i = 0; i < nb; i++)
        p.b[i] = (float)((i * 104729) % 1999) / 1999.0f - 0.5f;
    return p;
}

static void run(const product *p, float alpha, float beta) {
    rpi_sgemm(CblasRowMajor, p->ta ? CblasTrans : CblasNoTrans, p->tb ? CblasTrans : CblasNoTrans,
              p->M, p->N, p->K, alpha, p->a, p->lda, p->b, p->ldb, beta, p->c, p->ldc);
}

static double want(const product *p, int i, int j) {
    double s = 0;
    for (int k = 0; k < p->K; k++)
        s += (double)(p->ta ? p->a[(size_t)k * p->lda + i] : p->a[(size_t)i * p->lda + k]) *
             (p->tb ? p->b[(size_t)j * p->ldb + k] : p->b[(size_t)k * p->ldb + j]);
    return s;
}

/* the largest error against the double sum over the largest value: C
** written over NaNs (alpha 0.5, beta 0), then added to (beta 1) */
static void products_agree(void) {
    for (int t = 0; t < 8; t++) { /* four transposes, oneDNN's size then OpenBLAS's */
        product p = t < 4 ? make(160, 144, 256, t & 1, t & 2) : make(40, 36, 64, t & 1, t & 2);
        for (size_t i = 0; i < (size_t)p.ldc * p.M; i++)
            p.c[i] = NAN;
        run(&p, 0.5f, 0.0f);
        double err = 0, big = 0;
        for (int i = 0; i < p.M; i++)
            for (int j = 0; j < p.N; j++) {
                double w = 0.5 * want(&p, i, j);
                err = fmax(err, fabs(p.c[(size_t)i * p.ldc + j] - w));
                big = fmax(big, fabs(w));
            }
        CHECKF(err <= 1e-5 * big, "%c%c, beta 0: error %g of %g", t & 1 ? 'T' : 'N',
               t & 2 ? 'T' : 'N', err, big);
        /* the padding between rows is left as it was */
        CHECK(isnan(p.c[p.N]) && isnan(p.c[(size_t)(p.M - 1) * p.ldc + p.N + 2]));
        for (int i = 0; i < p.M; i++)
            for (int j = 0; j < p.N; j++)
                p.c[(size_t)i * p.ldc + j] = (float)(i - j) * 0.25f;
        run(&p, 1.0f, 1.0f);
        err = 0;
        for (int i = 0; i < p.M; i++)
            for (int j = 0; j < p.N; j++) {
                double w = want(&p, i, j) + (i - j) * 0.25;
                err = fmax(err, fabs(p.c[(size_t)i * p.ldc + j] - w));
            }
        CHECKF(err <= 1e-5 * (big * 2 + 40), "%c%c, beta 1: error %g", t & 1 ? 'T' : 'N',
               t & 2 ? 'T' : 'N', err);
        free(p.a), free(p.b), free(p.c);
    }
}

typedef struct job {
    product p;
    float *out;
} job;

static void *on_thread(void *arg) {
    job *j = arg;
    run(&j->p, 1.0f, 0.0f);
    memcpy(j->out, j->p.c, sizeof(float) * (size_t)j->p.ldc * j->p.M);
    return NULL;
}

/* The same product twice on this thread and once on another: the same bits,
** and no more threads than the process had before its first product. */
static void same_bits_one_thread(int before) {
    job j = {make(256, 256, 512, false, true), NULL};
    size_t n = (size_t)j.p.ldc * j.p.M;
    float *first = calloc(n, sizeof(float)), *other = calloc(n, sizeof(float));
    memset(j.p.c, 0, sizeof(float) * n);
    run(&j.p, 1.0f, 0.0f);
    memcpy(first, j.p.c, sizeof(float) * n);
    CHECKF(threads_now() == before, "threads: %d before any product, %d after", before,
           threads_now());
    run(&j.p, 1.0f, 0.0f);
    CHECK(memcmp(first, j.p.c, sizeof(float) * n) == 0);
    j.out = other;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, on_thread, &j) == 0);
    pthread_join(t, NULL);
    CHECK(memcmp(first, other, sizeof(float) * n) == 0);
    CHECKF(threads_now() == before, "threads: %d before, %d after a product on another",
           before, threads_now());
    free(first), free(other), free(j.p.a), free(j.p.b), free(j.p.c);
}

int main(int argc, char **argv) {
    expect_openblas = argc > 1 && strcmp(argv[1], "--openblas") == 0;
    rp_error err;
    CHECK(rpi_blas_single(&err) == RP_OK); /* OpenBLAS's pool, if any, is made when it loads */
    int threads = threads_now();
    library_choice();
    products_agree();
    same_bits_one_thread(threads);
    return test_finish("test_blas");
}
