/* Minimal test harness: CHECK records a failure and goes on; main returns the count, so
 * ctest fails on any mismatch. */
#ifndef CT_TEST_UTIL_H
#define CT_TEST_UTIL_H

#include "ctorch/ctorch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_failures;
static int t_checks;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        t_checks++;                                                                        \
        if (!(cond)) {                                                                     \
            t_failures++;                                                                  \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
        }                                                                                  \
    } while (0)

#define CHECK_OK(expr)                                                                     \
    do {                                                                                   \
        ct_status s_ = (expr);                                                             \
        t_checks++;                                                                        \
        if (s_ != CT_OK) {                                                                 \
            t_failures++;                                                                  \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #expr,      \
                    ct_status_name(s_), ct_last_error());                                  \
        }                                                                                  \
    } while (0)

/* Expect a given failure status and a non-empty message. */
#define CHECK_STATUS(expr, want)                                                           \
    do {                                                                                   \
        ct_clear_error();                                                                  \
        ct_status s_ = (expr);                                                             \
        t_checks++;                                                                        \
        if (s_ != (want) || (want != CT_OK && ct_last_error()[0] == '\0')) {               \
            t_failures++;                                                                  \
            fprintf(stderr, "%s:%d: %s returned %s (want %s), message '%s'\n", __FILE__,   \
                    __LINE__, #expr, ct_status_name(s_), ct_status_name(want),             \
                    ct_last_error());                                                      \
        }                                                                                  \
    } while (0)

/* max |a-b| / (atol + rtol |b|) <= 1 over n values; NaN must match NaN. */
static inline int t_close(const float *a, const float *b, size_t n, double atol, double rtol,
                          const char *what)
{
    double worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) {
            if (isnan(a[i]) != isnan(b[i])) {
                fprintf(stderr, "  %s[%zu]: %g vs %g (NaN mismatch)\n", what, i, a[i], b[i]);
                return 0;
            }
            continue;
        }
        if (isinf(a[i]) || isinf(b[i])) {
            if (a[i] != b[i]) {
                fprintf(stderr, "  %s[%zu]: %g vs %g\n", what, i, a[i], b[i]);
                return 0;
            }
            continue;
        }
        double e = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (e > worst) worst = e, wi = i;
    }
    if (worst > 1.0) {
        fprintf(stderr, "  %s[%zu]: %.9g vs %.9g (error ratio %.3g)\n", what, wi, a[wi], b[wi], worst);
        return 0;
    }
    return 1;
}

/* Deterministic pseudo-random numbers (splitmix64). */
static uint64_t t_rng = 0x9E3779B97F4A7C15ull;
static inline uint64_t t_next(void)
{
    uint64_t z = (t_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline float t_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((t_next() >> 40) * (1.0 / 16777216.0));
}
static inline void t_fill(float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) x[i] = t_uniform(lo, hi);
}

/* CT_TEST_REDUCED=1 (scripts/test-aarch64.sh sets it under qemu, ~10-50x slower than the
 * host): a test may cut the sizes of its heaviest cases, keeping every path they reach. */
static inline int t_reduced(void)
{
    const char *e = getenv("CT_TEST_REDUCED");
    return e && e[0] == '1' && e[1] == '\0';
}

static inline int t_report(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, t_checks, t_failures);
    return t_failures ? 1 : 0;
}

#endif
