/* SVE row primitives (see vecmath_kernels.h), vector-length agnostic: one whilelt-predicated
 * loop of svcntw() lanes, sums folded by svaddv. The exp is simd/simd_sve.h's (lane results
 * bitwise the AVX2 ones); sums depend on the vector length only through the lane count. */
#include "ops/vecmath_kernels.h"
#include "simd/simd_sve.h"

static float ct_vmax_sve(const float *x, int64_t n)
{
    svbool_t all = svptrue_b32();
    svfloat32_t m = svdup_n_f32(-INFINITY);
    svbool_t bad = svpfalse_b();
    for (int64_t i = 0; i < n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        svfloat32_t v = svld1_f32(pg, x + i);
        bad = svorr_b_z(all, bad, svcmpuo_f32(pg, v, v));
        m = svmax_f32_m(pg, m, v);
    }
    if (svptest_any(all, bad)) return NAN;
    return n > 0 ? svmaxv_f32(all, m) : -INFINITY;
}

static float ct_vexpsum_sve(float *out, const float *x, float m, int64_t n)
{
    svfloat32_t acc = svdup_n_f32(0.0f);
    for (int64_t i = 0; i < n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        svfloat32_t e = ct_exp_sv(pg, svsub_n_f32_x(pg, svld1_f32(pg, x + i), m));
        if (out) svst1_f32(pg, out + i, e);
        acc = svadd_f32_m(pg, acc, e);
    }
    return svaddv_f32(svptrue_b32(), acc);
}

static float ct_vsum_sve(const float *x, int64_t n)
{
    svfloat32_t acc = svdup_n_f32(0.0f);
    for (int64_t i = 0; i < n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        acc = svadd_f32_m(pg, acc, svld1_f32(pg, x + i));
    }
    return svaddv_f32(svptrue_b32(), acc);
}

static float ct_vdot_sve(const float *a, const float *b, int64_t n)
{
    svfloat32_t acc = svdup_n_f32(0.0f);
    for (int64_t i = 0; i < n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        acc = svmla_f32_m(pg, acc, svld1_f32(pg, a + i), svld1_f32(pg, b + i));
    }
    return svaddv_f32(svptrue_b32(), acc);
}

static void ct_vaxpy_sve(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        svst1_f32(pg, y + i, svmla_n_f32_x(pg, svld1_f32(pg, y + i), svld1_f32(pg, x + i), a));
    }
}

static void ct_vscale_sve(float *x, float a, int64_t n)
{
    for (int64_t i = 0; i < n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        svst1_f32(pg, x + i, svmul_n_f32_x(pg, svld1_f32(pg, x + i), a));
    }
}

const ct_vec_kernels ct_vec_sve = {ct_vmax_sve, ct_vexpsum_sve, ct_vsum_sve,
                                   ct_vdot_sve, ct_vaxpy_sve,   ct_vscale_sve};
