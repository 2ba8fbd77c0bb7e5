/*
** Runs a fuzz target without libFuzzer: every file named on the command
** line, then a fixed number of deterministic mutations of each (bytes
** flipped, inserted, deleted, cut). Used by CTest, under the sanitizers, so
** the parsers' robustness is checked on every build and not only when a
** fuzzing campaign runs.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t next(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static const char *const TOKENS[] = {"-1", "0", "1e308", "\"", "{", "}", "[", "]", ",", ":",
                                     "null", "--", "\t", "\n", "=", ";", "[1; 2]", "nan"};

int main(int argc, char **argv) {
    int rounds = 2000;
    int files = 0;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "-rounds=", 8) == 0) {
            rounds = atoi(argv[i] + 8);
            continue;
        }
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "cannot open %s\n", argv[i]);
            return 2;
        }
        static uint8_t seed[1 << 16];
        size_t n = fread(seed, 1, sizeof seed, f);
        fclose(f);
        files++;
        LLVMFuzzerTestOneInput(seed, n);
        uint8_t *buf = malloc(sizeof seed + 64);
        for (int r = 0; r < rounds; r++) {
            size_t len = n;
            memcpy(buf, seed, n);
            int edits = 1 + (int)(next() % 4);
            for (int e = 0; e < edits; e++) {
                size_t at = len ? next() % len : 0;
                switch (next() % 5) {
                case 0: /* flip a byte */
                    if (len)
                        buf[at] ^= (uint8_t)(1u << (next() % 8));
                    break;
                case 1: /* delete a run */
                    if (len) {
                        size_t k = 1 + next() % 8;
                        if (at + k > len)
                            k = len - at;
                        memmove(buf + at, buf + at + k, len - at - k);
                        len -= k;
                    }
                    break;
                case 2: { /* insert a token */
                    const char *t = TOKENS[next() % (sizeof TOKENS / sizeof TOKENS[0])];
                    size_t k = strlen(t);
                    if (len + k <= sizeof seed + 64) {
                        memmove(buf + at + k, buf + at, len - at);
                        memcpy(buf + at, t, k);
                        len += k;
                    }
                    break;
                }
                case 3: /* cut the tail */
                    len = at;
                    break;
                default: /* overwrite with a digit */
                    if (len)
                        buf[at] = (uint8_t)('0' + next() % 10);
                }
            }
            LLVMFuzzerTestOneInput(buf, len);
        }
        free(buf);
    }
    printf("fuzz driver: %d seed files, %d mutations each, no crash\n", files, rounds);
    return files ? 0 : 2;
}
