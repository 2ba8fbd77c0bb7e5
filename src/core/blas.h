/*
** The one BLAS routine repipe calls, loaded on first use (OpenBLAS's, and
** oneDNN's sgemm for the larger products: blas.c).
**
** OpenBLAS's start-up (its kernels picked for the CPU, its thread pool made)
** is most of what a small command costs: `repipe plan` or `repipe config`
** never multiply a matrix, so the library links no BLAS and opens OpenBLAS
** (libopenblas.so.0, or the file REPIPE_BLAS_LIBRARY names) the first time
** a product is asked for. Entry points that will run layers call
** rpi_blas_single() first, which loads it and reports a missing library as
** an error; the products themselves then never fail.
*/
#ifndef REPIPE_BLAS_H
#define REPIPE_BLAS_H

#include <cblas.h>

#include "repipe/core.h"

/* cblas_sgemm, row-major or column-major as CBLAS has it. */
void rpi_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M,
               int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc);

/* The library rpi_sgemm runs a row-major product of these sides with:
** "onednn", "openblas", or "none" where no BLAS loads (blas.c says why). */
const char *rpi_sgemm_library(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N,
                              int K);

/* Loads the BLAS and has it run each product on the calling thread alone,
** as an engine worker runs them (and the profiler that predicts one). */
rp_status rpi_blas_single(rp_error *err);

#endif /* REPIPE_BLAS_H */
