/*
** IEEE 754 binary16 conversion in integer arithmetic: the same bits on
** every machine and compiler, whatever the FPU's denormal mode, with no
** need for F16C instructions.
*/
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "repipe/core.h"

uint16_t rp_half_from_float(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf, or NaN kept quiet */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));
    if (a >= 0x477ff000u) /* 65520 and up round past the largest half, 65504 */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* a normal half: rebias, round to nearest even */
        uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    if (a < 0x33000000u) /* at most 2^-25: rounds to zero */
        return (uint16_t)sign;
    /* a subnormal half: the significand in units of 2^-24 */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

float rp_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0x1f)
        bits = sign | 0x7f800000u | (m << 13);
    else if (e)
        bits = sign | ((e + 112) << 23) | (m << 13);
    else if (!m)
        bits = sign;
    else { /* subnormal: normalise */
        e = 113;
        while (!(m & 0x400u))
            m <<= 1, e--;
        bits = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The arrays go eight at a time through F16C's conversions where the build
** has them (IEEE round to nearest even as above, whatever MXCSR's flush
** modes say; only NaN payloads may differ), the rest one at a time. */
void rp_half_encode(const float *in, uint16_t *out, size_t n) {
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++)
        out[i] = rp_half_from_float(in[i]);
}

void rp_half_decode(const uint16_t *in, float *out, size_t n) {
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
#endif
    for (; i < n; i++)
        out[i] = rp_half_to_float(in[i]);
}
