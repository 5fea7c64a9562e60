/* AVX-512 row reduction bodies (see reduce_kernels.h). Sums: the scalar bodies (their fixed
 * order is latency bound, as in reduce_avx2.c). Max/min: four 16-lane accumulators (64 values
 * per step) with a NaN flag, then the first position of the extreme (or of the first NaN) by
 * compare masks. The result is a position fixed by the definition, so the same as the scalar
 * and AVX2 bodies. */
#include "ops/reduce_kernels.h"
#include "simd/simd_avx512.h"

/* First i in [0, n) with x[i] == m (nan: with x[i] a NaN); the caller knows one exists. */
static int64_t first_match16(const float *x, int64_t n, float m, int nan)
{
    const __m512 mv = _mm512_set1_ps(m);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 in = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(in, x + i);
        __mmask16 k = nan ? _mm512_mask_cmp_ps_mask(in, v, v, _CMP_UNORD_Q)
                          : _mm512_mask_cmp_ps_mask(in, v, mv, _CMP_EQ_OQ);
        if (k) return i + __builtin_ctz((unsigned)k);
    }
    return 0; /* not reached */
}

/* One step of the max (MAX = 1) or min scan; vmaxps(v, a) returns a when v is NaN. */
#define EXT(MAX, v, a) ((MAX) ? _mm512_max_ps((v), (a)) : _mm512_min_ps((v), (a)))

static inline __attribute__((always_inline)) int64_t extreme_index16(const float *x, int64_t n,
                                                                      const int MAX)
{
    float m = x[0];
    int any_nan = 0;
    int64_t i = 0;
    if (n >= 16) {
        __m512 a0 = _mm512_set1_ps(x[0]), a1 = a0, a2 = a0, a3 = a0;
        __mmask16 nan = 0;
        for (; i + 64 <= n; i += 64) {
            __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
            __m512 v2 = _mm512_loadu_ps(x + i + 32), v3 = _mm512_loadu_ps(x + i + 48);
            nan |= _mm512_cmp_ps_mask(v0, v1, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v2, v3, _CMP_UNORD_Q);
            a0 = EXT(MAX, v0, a0);
            a1 = EXT(MAX, v1, a1);
            a2 = EXT(MAX, v2, a2);
            a3 = EXT(MAX, v3, a3);
        }
        for (; i + 16 <= n; i += 16) {
            __m512 v = _mm512_loadu_ps(x + i);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            a0 = EXT(MAX, v, a0);
        }
        float l[16];
        _mm512_storeu_ps(l, EXT(MAX, EXT(MAX, a0, a1), EXT(MAX, a2, a3)));
        for (int j = 0; j < 16; j++)
            if (MAX ? l[j] > m : l[j] < m) m = l[j];
        any_nan = nan != 0;
    }
    for (; i < n; i++) {
        float v = x[i];
        if (MAX ? v > m : v < m) m = v;
        any_nan |= v != v;
    }
    return first_match16(x, n, m, any_nan || m != m);
}

static void extreme_rows_avx512(float *values, int64_t *idx, const float *inp, int64_t r0,
                                int64_t r1, int64_t C, int sign)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        int64_t i = sign > 0 ? extreme_index16(x, C, 1) : extreme_index16(x, C, 0);
        if (values) values[r] = x[i];
        if (idx) idx[r] = i;
    }
}

const ct_reduce_kernels ct_reduce_avx512 = {
    .sum_block = ct_reduce_sum_block_scalar,
    .sum_rows = ct_reduce_sum_rows_scalar,
    .extreme_rows = extreme_rows_avx512,
};
