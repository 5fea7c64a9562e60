/* AVX2 row reduction bodies (see reduce_kernels.h).
 *
 * Sums: the scalar bodies (ct_reduce_sum_block_scalar / ct_reduce_sum_rows_scalar). The
 * fixed order is 8 dependent chains of double adds whichever way it is written; an AVX2
 * body of the same order (two 4-lane double vectors) measured the same speed as the
 * compiler's code for the scalar one (within 2 %, 256 x 4096, 1 thread), so it is not kept;
 * the scan below measured 2.8-4x the scalar (GCC vector extension) one there.
 * Max/min: four 8-lane accumulators of vmaxps/vminps (32 values per step) with a NaN flag,
 * then the first position of the extreme (or of the first NaN) by compare + movemask. The
 * result is a position, fixed by the definition, so again the same as the scalar body. */
#include "ops/reduce_kernels.h"
#include "simd/simd_avx2.h"

/* First i in [0, n) with x[i] == m (nan: with x[i] a NaN); the caller knows one exists. */
static int64_t first_match(const float *x, int64_t n, float m, int nan)
{
    __m256 mv = _mm256_set1_ps(m);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 c = nan ? _mm256_cmp_ps(v, v, _CMP_UNORD_Q) : _mm256_cmp_ps(v, mv, _CMP_EQ_OQ);
        int k = _mm256_movemask_ps(c);
        if (k) return i + __builtin_ctz((unsigned)k);
    }
    for (; i < n; i++)
        if (nan ? isnan(x[i]) : x[i] == m) return i;
    return 0; /* not reached */
}

/* One step of the max (MAX = 1) or min scan; vmaxps(v, a) returns a when v is NaN. */
#define EXT(MAX, v, a) ((MAX) ? _mm256_max_ps((v), (a)) : _mm256_min_ps((v), (a)))

static inline __attribute__((always_inline)) int64_t extreme_index_t(const float *x, int64_t n,
                                                                      const int MAX)
{
    float m = x[0];
    int any_nan = 0;
    int64_t i = 0;
    if (n >= 8) {
        __m256 a0 = _mm256_set1_ps(x[0]), a1 = a0, a2 = a0, a3 = a0;
        __m256 nan = _mm256_setzero_ps();
        for (; i + 32 <= n; i += 32) {
            __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
            __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
            nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_cmp_ps(v0, v1, _CMP_UNORD_Q),
                                                 _mm256_cmp_ps(v2, v3, _CMP_UNORD_Q)));
            a0 = EXT(MAX, v0, a0);
            a1 = EXT(MAX, v1, a1);
            a2 = EXT(MAX, v2, a2);
            a3 = EXT(MAX, v3, a3);
        }
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            a0 = EXT(MAX, v, a0);
        }
        float l[8];
        _mm256_storeu_ps(l, EXT(MAX, EXT(MAX, a0, a1), EXT(MAX, a2, a3)));
        for (int j = 0; j < 8; j++)
            if (MAX ? l[j] > m : l[j] < m) m = l[j];
        any_nan = _mm256_movemask_ps(nan) != 0;
    }
    for (; i < n; i++) {
        float v = x[i];
        if (MAX ? v > m : v < m) m = v;
        any_nan |= v != v;
    }
    return first_match(x, n, m, any_nan || m != m);
}

static void extreme_rows_avx2(float *values, int64_t *idx, const float *inp, int64_t r0,
                              int64_t r1, int64_t C, int sign)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        int64_t i = sign > 0 ? extreme_index_t(x, C, 1) : extreme_index_t(x, C, 0);
        if (values) values[r] = x[i];
        if (idx) idx[r] = i;
    }
}

const ct_reduce_kernels ct_reduce_avx2 = {
    .sum_block = ct_reduce_sum_block_scalar,
    .sum_rows = ct_reduce_sum_rows_scalar,
    .extreme_rows = extreme_rows_avx2,
};
