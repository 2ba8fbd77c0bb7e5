/*
** Half-precision conversion: every binary16 value survives a round trip,
** and every float rounds to a nearest half (ties to an even significand),
** checked against the neighbouring halves in double arithmetic.
*/
#include <stdbool.h>
#include <stdint.h>

#include "repipe/core.h"
#include "test.h"

/* Positive halves ordered by bit pattern are ordered by value: h - 1 and
** h + 1 are the neighbours of h. */
static double dec(uint16_t h) { return (double)rp_half_to_float(h); }

int main(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = rp_half_to_float((uint16_t)h);
        uint16_t back = rp_half_from_float(f);
        bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (nan ? !(f != f) || (back & 0x7c00) != 0x7c00 || !(back & 0x3ff) : back != h)
            bad++;
    }
    CHECK_INT(bad, 0);
    /* values fixed by the format itself */
    CHECK(rp_half_to_float(0x3c00) == 1.0f);
    CHECK(rp_half_to_float(0xc000) == -2.0f);
    CHECK(rp_half_to_float(0x7bff) == 65504.0f);
    CHECK(rp_half_to_float(0x0400) == ldexpf(1.0f, -14));
    CHECK(rp_half_to_float(0x0001) == ldexpf(1.0f, -24));
    CHECK(rp_half_from_float(65519.0f) == 0x7bff);
    CHECK(rp_half_from_float(65520.0f) == 0x7c00);
    CHECK(rp_half_from_float(-1e10f) == 0xfc00);
    CHECK(rp_half_from_float(ldexpf(1.0f, -25)) == 0x0000);              /* tie to even: 0 */
    CHECK(rp_half_from_float(ldexpf(3.0f, -25)) == 0x0002);              /* tie to even: 2 */
    CHECK(rp_half_from_float(1.0f + ldexpf(1.0f, -11)) == 0x3c00);       /* tie to even */
    CHECK(rp_half_from_float(1.0f + ldexpf(3.0f, -11)) == 0x3c02);
    /* nearest rounding over a sweep of float bit patterns in half's range */
    bad = 0;
    uint32_t x = 12345;
    for (int i = 0; i < 2000000; i++) {
        x = x * 1664525u + 1013904223u;
        uint32_t bits = 0x30000000u + x % (0x477fe000u - 0x30000000u);
        float f;
        memcpy(&f, &bits, sizeof f);
        uint16_t h = rp_half_from_float(f);
        double d = fabs((double)f - dec(h));
        double up = fabs((double)f - dec((uint16_t)(h + 1)));
        double down = h ? fabs((double)f - dec((uint16_t)(h - 1))) : d + 1;
        if (d > up || d > down || ((d == up || d == down) && (h & 1)))
            bad++;
    }
    CHECK_INT(bad, 0);
    /* the array conversions (vectorised where the build allows) give the
    ** scalar ones' bits, NaN aside, with the workers' flush modes on */
    rp_fpu_fast_denormals();
    static uint16_t hs[65536], back[65536];
    static float fs[65536];
    for (uint32_t h = 0; h < 0x10000; h++)
        hs[h] = (uint16_t)h;
    rp_half_decode(hs, fs, 65536);
    rp_half_encode(fs, back, 65536);
    bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        float f = rp_half_to_float((uint16_t)h);
        if (nan ? fs[h] == fs[h] : (memcmp(&fs[h], &f, sizeof f) != 0 || back[h] != h))
            bad++;
    }
    CHECK_INT(bad, 0);
    static float sweep[65536];
    static uint16_t enc[65536];
    for (int i = 0; i < 65536; i++) {
        x = x * 1664525u + 1013904223u;
        uint32_t bits = x % 0x47800000u | (x & 0x80000000u); /* both signs, up to 65536 */
        memcpy(&sweep[i], &bits, sizeof bits);
    }
    rp_half_encode(sweep, enc, 65536);
    bad = 0;
    for (int i = 0; i < 65536; i++)
        bad += enc[i] != rp_half_from_float(sweep[i]);
    CHECK_INT(bad, 0);
    return test_finish("test_half");
}
