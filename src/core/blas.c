/*
** OpenBLAS, opened on first use (blas.h says why), and beside it oneDNN's
** sgemm (Debian's libdnnl, which the convolutions open too) for the
** products where it is ahead.
**
** The libraries are opened RTLD_LOCAL: their names stay out of the
** process's global scope, so a program that loads another BLAS beside
** repipe (PyTorch's MKL, numpy's) keeps its own and repipe keeps its own.
**
** Why two: on one core (AVX-512, 2026-12-07) oneDNN's sgemm ran the
** products of a GPT block (256 rows, C 256, MLP 1024) at 104-111 GFLOP/s
** where OpenBLAS's ran them at 96-103, an MLP's (batch 64, 784-512) 1.10 to
** 1.23 times OpenBLAS's rate, im2col's forward products 1.1 to 1.4 times;
** it was behind on small products (64 x 64 x 64: 0.86-0.90; a 10-class head:
** 0.43) and on a weight gradient summed over many more positions than its
** sides (64 x 576 over 3136: 0.80). dnnl_ahead() holds the rule. Each
** product runs on the calling thread alone (OpenMP's count for it set to 1,
** as the convolutions do), so a shape always takes the same kernel and its
** result is the same bit for bit from run to run. REPIPE_GEMM=openblas
** keeps OpenBLAS for every product.
*/
#include "blas.h"

#include "dlib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*sgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, int, int,
                         int, float, const float *, int, const float *, int, float, float *,
                         int);
typedef void (*threads_fn)(int);

/* dnnl_sgemm as oneapi/dnnl/dnnl.h declares it (row-major; dnnl_dim_t is
** int64_t; dnnl_success is 0), so that the build needs no header */
typedef int (*dnnl_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *,
                             int64_t, const float *, int64_t, float, float *, int64_t);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static sgemm_fn sgemm;
static threads_fn set_threads; /* OpenBLAS's own; absent from another CBLAS */
static char why[512];          /* the loader's message when it failed */
static dnnl_sgemm_fn dnnl_sgemm;   /* NULL: oneDNN is not there, or not wanted */
static threads_fn set_omp_threads; /* OpenMP's, which oneDNN runs on */

static bool bind_blas(void *h) {
    sgemm = (sgemm_fn)dlsym(h, "cblas_sgemm");
    set_threads = (threads_fn)dlsym(h, "openblas_set_num_threads");
    return sgemm != NULL;
}

static bool bind_dnnl(void *h) {
    dnnl_sgemm = (dnnl_sgemm_fn)dlsym(h, "dnnl_sgemm");
    set_omp_threads = (threads_fn)dlsym(h, "omp_set_num_threads");
    return dnnl_sgemm != NULL;
}

static void load(void) {
    const char *names[] = {getenv("REPIPE_BLAS_LIBRARY"), "libopenblas.so.0",
#ifdef REPIPE_OPENBLAS_FILE
                           REPIPE_OPENBLAS_FILE, /* where the build found it */
#endif
                           "libopenblas.so"};
    if (!rpi_library_open(names, sizeof names / sizeof *names, bind_blas, "has no cblas_sgemm",
                          why, sizeof why))
        return;
#ifdef REPIPE_HAVE_DNNL /* the build's rule (CMakeLists.txt): not under ThreadSanitizer */
    const char *mode = getenv("REPIPE_GEMM");
    if (mode && strcmp(mode, "openblas") == 0)
        return;
    const char *dnnl[] = {getenv("REPIPE_DNNL_LIBRARY"), "libdnnl.so.2", "libdnnl.so"};
    char ignored[256]; /* without oneDNN every product is OpenBLAS's */
    if (!rpi_library_open(dnnl, sizeof dnnl / sizeof *dnnl, bind_dnnl, "has no dnnl_sgemm",
                          ignored, sizeof ignored))
        dnnl_sgemm = NULL, set_omp_threads = NULL;
#else
    (void)bind_dnnl;
#endif
}

/* Which library runs a row-major product (blas.c's opening comment has the
** measurements): oneDNN's from 2^21 multiply-adds up, but for a product
** of B transposed summed over more than four times its larger side. */
static bool dnnl_ahead(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K) {
    int side = M > N ? M : N;
    if ((int64_t)M * N * K < ((int64_t)1 << 21))
        return false;
    return !(ta == CblasNoTrans && tb == CblasTrans && K > 4 * side);
}

const char *rpi_sgemm_library(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N,
                              int K) {
    pthread_once(&once, load);
    if (!sgemm)
        return "none";
    return dnnl_sgemm && dnnl_ahead(ta, tb, M, N, K) ? "onednn" : "openblas";
}

rp_status rpi_blas_single(rp_error *err) {
    pthread_once(&once, load);
    if (!sgemm) {
        const char *named = getenv("REPIPE_BLAS_LIBRARY");
        return rp_fail(err, RP_ERR_IO,
                       "cannot load the BLAS library %s: %s (install OpenBLAS: Debian's "
                       "libopenblas0, or set REPIPE_BLAS_LIBRARY to a CBLAS library)",
                       named && named[0] ? named : "libopenblas.so.0", why);
    }
    if (set_threads)
        set_threads(1);
    return RP_OK;
}

/* A plain product for the one case the library's entry points rule out: a
** kernel called directly, in a process where no BLAS could be loaded. */
static void reference_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta,
                            enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, int ldb, float beta,
                            float *C, int ldc) {
    if (order == CblasColMajor) { /* C' = B' A' in row-major terms */
        reference_sgemm(CblasRowMajor, tb, ta, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
        return;
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)(ta == CblasNoTrans ? A[(size_t)i * lda + k]
                                                 : A[(size_t)k * lda + i]) *
                     (tb == CblasNoTrans ? B[(size_t)k * ldb + j] : B[(size_t)j * ldb + k]);
            float *c = &C[(size_t)i * ldc + j];
            *c = (float)(alpha * s + (beta == 0 ? 0 : beta * *c));
        }
}

void rpi_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M,
               int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc) {
    pthread_once(&once, load);
    if (dnnl_sgemm && order == CblasRowMajor && dnnl_ahead(ta, tb, M, N, K)) {
        if (set_omp_threads)
            set_omp_threads(1); /* this thread's count: the engine's workers are threads */
        if (dnnl_sgemm(ta == CblasTrans ? 'T' : 'N', tb == CblasTrans ? 'T' : 'N', M, N, K,
                       alpha, A, lda, B, ldb, beta, C, ldc) == 0)
            return;
    }
    (sgemm ? sgemm : reference_sgemm)(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                      ldc);
}
