/*
** OpenBLAS, opened on first use (blas.h says why).
**
** The library is opened RTLD_LOCAL: its cblas_sgemm stays out of the
** process's global names, so a program that loads another BLAS beside
** repipe (PyTorch's MKL, numpy's) keeps its own and repipe keeps OpenBLAS.
*/
#include "blas.h"

#include "dlib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

typedef void (*sgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, int, int,
                         int, float, const float *, int, const float *, int, float, float *,
                         int);
typedef void (*threads_fn)(int);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static sgemm_fn sgemm;
static threads_fn set_threads; /* OpenBLAS's own; absent from another CBLAS */
static char why[512];          /* the loader's message when it failed */

static bool bind_blas(void *h) {
    sgemm = (sgemm_fn)dlsym(h, "cblas_sgemm");
    set_threads = (threads_fn)dlsym(h, "openblas_set_num_threads");
    return sgemm != NULL;
}

static void load(void) {
    const char *names[] = {getenv("REPIPE_BLAS_LIBRARY"), "libopenblas.so.0",
#ifdef REPIPE_OPENBLAS_FILE
                           REPIPE_OPENBLAS_FILE, /* where the build found it */
#endif
                           "libopenblas.so"};
    rpi_library_open(names, sizeof names / sizeof *names, bind_blas, "has no cblas_sgemm", why,
                     sizeof why);
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
    (sgemm ? sgemm : reference_sgemm)(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                      ldc);
}
