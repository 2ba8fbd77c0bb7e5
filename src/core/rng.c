/*
** Counter-based random numbers. Each value is a hash of its keys (the
** SplitMix64 finaliser applied to each key in turn), so the stream needs no
** state and any worker can draw any element.
*/
#include "repipe/core.h"

static inline uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t rp_hash64(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    uint64_t h = mix(seed + 0x9e3779b97f4a7c15ull);
    h = mix(h ^ (a + 0x632be59bd9b4e019ull));
    h = mix(h ^ (b + 0x8cb92ba72f3d8dd7ull));
    h = mix(h ^ (c + 0xd6e8feb86659fd93ull));
    h = mix(h ^ (d + 0xa0761d6478bd642full));
    return h;
}

float rp_uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    return (float)(rp_hash64(seed, a, b, c, d) >> 40) * (1.0f / 16777216.0f);
}
