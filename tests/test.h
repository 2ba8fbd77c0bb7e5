/*
** A minimal test harness: CHECK records a failure and carries on, so one run
** reports every broken expectation; main returns non-zero if any failed.
*/
#ifndef REPIPE_TEST_H
#define REPIPE_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int test_failures;
static int test_checks;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        test_checks++;                                                                  \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);    \
            test_failures++;                                                            \
        }                                                                               \
    } while (0)

#define CHECK_INT(a, b)                                                                  \
    do {                                                                                 \
        long long va_ = (long long)(a), vb_ = (long long)(b);                            \
        test_checks++;                                                                   \
        if (va_ != vb_) {                                                                \
            fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, __LINE__, \
                    #a, va_, #b, vb_);                                                   \
            test_failures++;                                                             \
        }                                                                                \
    } while (0)

#define CHECK_STR_HAS(hay, needle)                                                       \
    do {                                                                                 \
        const char *h_ = (hay), *n_ = (needle);                                          \
        test_checks++;                                                                   \
        if (!h_ || !strstr(h_, n_)) {                                                    \
            fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, \
                    h_ ? h_ : "(null)", n_);                                             \
            test_failures++;                                                             \
        }                                                                                \
    } while (0)

/* A condition, and on failure a message saying why. */
#define CHECKF(cond, ...)                                                               \
    do {                                                                                \
        test_checks++;                                                                  \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
            test_failures++;                                                            \
        }                                                                               \
    } while (0)

/* A call that must succeed; on failure its message (err.msg) is printed. */
#define CHECK_OK(call, err)                                                              \
    do {                                                                                 \
        int st_ = (int)(call);                                                           \
        test_checks++;                                                                   \
        if (st_ != 0) {                                                                  \
            fprintf(stderr, "%s:%d: %s failed (%d): %s\n", __FILE__, __LINE__, #call, st_, \
                    (err).msg);                                                          \
            test_failures++;                                                             \
        }                                                                                \
    } while (0)

/* Relative closeness: |a - b| <= rtol * max(|a|, |b|). */
#define CHECK_CLOSE(a, b, rtol)                                                          \
    do {                                                                                 \
        double ca_ = (a), cb_ = (b);                                                     \
        double m_ = fabs(ca_) > fabs(cb_) ? fabs(ca_) : fabs(cb_);                       \
        test_checks++;                                                                   \
        if (!(fabs(ca_ - cb_) <= (rtol) * m_)) {                                         \
            fprintf(stderr, "%s:%d: %s = %.17g, expected %.17g (rtol %g)\n", __FILE__,   \
                    __LINE__, #a, ca_, cb_, (double)(rtol));                             \
            test_failures++;                                                             \
        }                                                                                \
    } while (0)

static inline int test_finish(const char *name) {
    printf("%s: %d checks, %d failed\n", name, test_checks, test_failures);
    return test_failures ? 1 : 0;
}

#endif /* REPIPE_TEST_H */
