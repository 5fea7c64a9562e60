/* AArch64 SVE row reduction bodies (see reduce_kernels.h), vector-length agnostic. Sums: the
 * scalar bodies (the fixed order is latency bound, as in reduce_avx2.c). Max/min: one
 * predicated accumulator (svmax/svmin merging) with a NaN flag, folded by svmaxv/svminv,
 * then the first position of the extreme (or of the first NaN) by compare + break-before
 * count. The result is a position fixed by the definition, so the same as the scalar body
 * at every vector length. */
#include "ops/reduce_kernels.h"
#include "simd/simd_sve.h"

/* First i in [0, n) with x[i] == m (nan: with x[i] a NaN); the caller knows one exists. */
static int64_t first_match(const float *x, int64_t n, float m, int nan)
{
    for (int64_t i = 0; i < n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        svfloat32_t v = svld1_f32(pg, x + i);
        svbool_t c = nan ? svcmpuo_f32(pg, v, v) : svcmpeq_n_f32(pg, v, m);
        if (svptest_any(pg, c)) return i + (int64_t)svcntp_b32(pg, svbrkb_b_z(pg, c));
    }
    return 0; /* not reached */
}

static inline __attribute__((always_inline)) int64_t extreme_index_t(const float *x, int64_t n,
                                                                      const int MAX)
{
    svfloat32_t a = svdup_n_f32(x[0]);
    svbool_t nan = svpfalse_b();
    for (int64_t i = 0; i < n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        svfloat32_t v = svld1_f32(pg, x + i);
        nan = svorr_b_z(svptrue_b32(), nan, svcmpuo_f32(pg, v, v));
        a = MAX ? svmax_f32_m(pg, a, v) : svmin_f32_m(pg, a, v);
    }
    if (svptest_any(svptrue_b32(), nan)) return first_match(x, n, 0.0f, 1);
    float m = MAX ? svmaxv_f32(svptrue_b32(), a) : svminv_f32(svptrue_b32(), a);
    return first_match(x, n, m, 0);
}

static void extreme_rows_sve(float *values, int64_t *idx, const float *inp, int64_t r0,
                             int64_t r1, int64_t C, int sign)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        int64_t i = sign > 0 ? extreme_index_t(x, C, 1) : extreme_index_t(x, C, 0);
        if (values) values[r] = x[i];
        if (idx) idx[r] = i;
    }
}

const ct_reduce_kernels ct_reduce_sve = {
    .sum_block = ct_reduce_sum_block_scalar,
    .sum_rows = ct_reduce_sum_rows_scalar,
    .extreme_rows = extreme_rows_sve,
};
