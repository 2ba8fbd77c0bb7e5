/*
** Floating-point environment of worker threads.
*/
#include "repipe/core.h"
#include "util.h"

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define RP_FTZ 0x8000 /* MXCSR flush-to-zero */
#define RP_DAZ 0x0040 /* MXCSR denormals-are-zero */
#endif

void rp_fpu_fast_denormals(void) {
#if defined(__SSE__) || defined(__x86_64__)
    _mm_setcsr(_mm_getcsr() | RP_FTZ | RP_DAZ);
#endif
}

unsigned rpi_fpu_enter(void) {
#if defined(__SSE__) || defined(__x86_64__)
    unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | RP_FTZ | RP_DAZ);
    return saved;
#else
    return 0;
#endif
}

void rpi_fpu_leave(unsigned saved) {
#if defined(__SSE__) || defined(__x86_64__)
    _mm_setcsr(saved);
#else
    (void)saved;
#endif
}
