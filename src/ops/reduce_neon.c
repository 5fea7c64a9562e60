/* AArch64 Advanced SIMD row reduction bodies (see reduce_kernels.h). Sums: the scalar
 * bodies (the fixed order is latency bound, as in reduce_avx2.c). Max/min: four float32x4
 * accumulators (16 values per step) with a NaN flag, then the first position of the extreme
 * (or of the first NaN). The result is a position fixed by the definition, so the same as
 * the scalar and AVX2 bodies. */
#include "ops/reduce_kernels.h"
#include "simd/simd_neon.h"

/* First i in [0, n) with x[i] == m (nan: with x[i] a NaN); the caller knows one exists. */
static int64_t first_match(const float *x, int64_t n, float m, int nan)
{
    float32x4_t mv = vdupq_n_f32(m);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t v = vld1q_f32(x + i);
        uint32x4_t c = nan ? vmvnq_u32(vceqq_f32(v, v)) : vceqq_f32(v, mv);
        if (vmaxvq_u32(c))
            for (int t = 0; t < 4; t++)
                if (nan ? isnan(x[i + t]) : x[i + t] == m) return i + t;
    }
    for (; i < n; i++)
        if (nan ? isnan(x[i]) : x[i] == m) return i;
    return 0; /* not reached */
}

#define EXT(MAX, v, a) ((MAX) ? vmaxq_f32((v), (a)) : vminq_f32((v), (a)))

static inline __attribute__((always_inline)) int64_t extreme_index_t(const float *x, int64_t n,
                                                                      const int MAX)
{
    float m = x[0];
    int any_nan = 0;
    int64_t i = 0;
    if (n >= 4) {
        float32x4_t a0 = vdupq_n_f32(x[0]), a1 = a0, a2 = a0, a3 = a0;
        uint32x4_t nan = vdupq_n_u32(0);
        for (; i + 16 <= n; i += 16) {
            float32x4_t v0 = vld1q_f32(x + i), v1 = vld1q_f32(x + i + 4);
            float32x4_t v2 = vld1q_f32(x + i + 8), v3 = vld1q_f32(x + i + 12);
            uint32x4_t ok = vandq_u32(vandq_u32(vceqq_f32(v0, v0), vceqq_f32(v1, v1)),
                                      vandq_u32(vceqq_f32(v2, v2), vceqq_f32(v3, v3)));
            nan = vorrq_u32(nan, vmvnq_u32(ok));
            a0 = EXT(MAX, v0, a0);
            a1 = EXT(MAX, v1, a1);
            a2 = EXT(MAX, v2, a2);
            a3 = EXT(MAX, v3, a3);
        }
        for (; i + 4 <= n; i += 4) {
            float32x4_t v = vld1q_f32(x + i);
            nan = vorrq_u32(nan, vmvnq_u32(vceqq_f32(v, v)));
            a0 = EXT(MAX, v, a0);
        }
        any_nan = vmaxvq_u32(nan) != 0;
        if (!any_nan) {
            float32x4_t f = EXT(MAX, EXT(MAX, a0, a1), EXT(MAX, a2, a3));
            float l = MAX ? vmaxvq_f32(f) : vminvq_f32(f);
            if (MAX ? l > m : l < m) m = l;
        }
    }
    for (; i < n; i++) {
        float v = x[i];
        if (MAX ? v > m : v < m) m = v;
        any_nan |= v != v;
    }
    return first_match(x, n, m, any_nan || m != m);
}

static void extreme_rows_neon(float *values, int64_t *idx, const float *inp, int64_t r0,
                              int64_t r1, int64_t C, int sign)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        int64_t i = sign > 0 ? extreme_index_t(x, C, 1) : extreme_index_t(x, C, 0);
        if (values) values[r] = x[i];
        if (idx) idx[r] = i;
    }
}

const ct_reduce_kernels ct_reduce_neon = {
    .sum_block = ct_reduce_sum_block_scalar,
    .sum_rows = ct_reduce_sum_rows_scalar,
    .extreme_rows = extreme_rows_neon,
};
