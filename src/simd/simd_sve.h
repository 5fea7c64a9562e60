/* AArch64 SVE vector maths shared by every *_sve.c kernel file, vector-length agnostic:
 * every loop steps by svcntw() lanes under a whilelt predicate, so one body runs at any
 * vector length (128..2048 bits) with no per-length switch. Each lane computes what the
 * AVX2 and NEON lanes compute (simd/simd_avx2.h, simd/simd_neon.h): the same Cephes exp,
 * tanh, sigmoid, erfc and bf16 rounding, so element-wise results are bitwise those of the
 * other ISAs. Reductions fold with svaddv / svmaxv, whose (architecturally fixed, pairwise)
 * order depends on the vector length: sums are bitwise across runs and thread counts at one
 * vector length, and within the bounds tests/c/test_kernels_isa.c checks across lengths.
 * Inactive lanes of every helper are don't-care: callers store under the same predicate. */
#ifndef CT_SIMD_SVE_H
#define CT_SIMD_SVE_H

#include <arm_sve.h>
#include <math.h>
#include <stdint.h>

#define CT_SIMD_INLINE static inline __attribute__((always_inline))

/* Active lanes of f32 (bf = 0) or bf16 (bf = 1) at index i as f32; inactive lanes are 0. */
CT_SIMD_INLINE svfloat32_t ct_ld_sv(svbool_t pg, const void *p, int64_t i, int bf)
{
    if (bf) {
        svuint32_t w = svld1uh_u32(pg, (const uint16_t *)p + i);
        return svreinterpret_f32_u32(svlsl_n_u32_x(pg, w, 16));
    }
    return svld1_f32(pg, (const float *)p + i);
}

/* Round to bf16, to nearest even; NaN stays a quiet NaN (bitwise ct_f32_to_bf16). The
 * result holds the bf16 bits in the low half of each 32-bit lane. */
CT_SIMD_INLINE svuint32_t ct_to_bf16_sv(svbool_t pg, svfloat32_t v)
{
    svuint32_t u = svreinterpret_u32_f32(v);
    svbool_t isnan = svcmpgt_n_u32(pg, svand_n_u32_x(pg, u, 0x7FFFFFFFu), 0x7F800000u);
    svuint32_t lsb = svand_n_u32_x(pg, svlsr_n_u32_x(pg, u, 16), 1);
    svuint32_t r = svadd_u32_x(pg, u, svadd_n_u32_x(pg, lsb, 0x7FFF));
    r = svsel_u32(isnan, svorr_n_u32_x(pg, u, 0x00400000u), r);
    return svlsr_n_u32_x(pg, r, 16);
}

CT_SIMD_INLINE void ct_st_sv(svbool_t pg, void *p, int64_t i, svfloat32_t v, int bf)
{
    if (bf)
        svst1h_u32(pg, (uint16_t *)p + i, ct_to_bf16_sv(pg, v));
    else
        svst1_f32(pg, (float *)p + i, v);
}

/* exp(x): see ct_exp256. Below -87.33654 the result is 0, above 88.72283 +inf, NaN stays
 * NaN; at most 2 ulp from the correctly rounded exp over the normal range. */
CT_SIMD_INLINE svfloat32_t ct_exp_sv(svbool_t pg, svfloat32_t x)
{
    const float lo = -87.33654f, hi = 88.72283f;
    svbool_t under = svcmplt_n_f32(pg, x, lo);
    svbool_t over = svcmpgt_n_f32(pg, x, hi);
    svbool_t nan = svcmpuo_f32(pg, x, x);
    svfloat32_t xc = svmax_n_f32_x(pg, svmin_n_f32_x(pg, x, hi), lo);
    svfloat32_t n = svrintn_f32_x(pg, svmul_n_f32_x(pg, xc, 1.44269504088896341f));
    svfloat32_t r = svmls_f32_x(pg, xc, n, svdup_n_f32(0.693359375f));
    r = svmls_f32_x(pg, r, n, svdup_n_f32(-2.12194440e-4f));
    svfloat32_t p = svdup_n_f32(1.9875691500e-4f);
    p = svmad_f32_x(pg, p, r, svdup_n_f32(1.3981999507e-3f));
    p = svmad_f32_x(pg, p, r, svdup_n_f32(8.3334519073e-3f));
    p = svmad_f32_x(pg, p, r, svdup_n_f32(4.1665795894e-2f));
    p = svmad_f32_x(pg, p, r, svdup_n_f32(1.6666665459e-1f));
    p = svmad_f32_x(pg, p, r, svdup_n_f32(5.0000001201e-1f));
    p = svmad_f32_x(pg, p, svmul_f32_x(pg, r, r), r);
    p = svadd_n_f32_x(pg, p, 1.0f);
    svint32_t ni = svcvt_s32_f32_x(pg, n); /* integral and in range: exact */
    svint32_t hn = svasr_n_s32_x(pg, ni, 1);
    svfloat32_t f1 = svreinterpret_f32_s32(svlsl_n_s32_x(pg, svadd_n_s32_x(pg, hn, 127), 23));
    svfloat32_t f2 =
        svreinterpret_f32_s32(svlsl_n_s32_x(pg, svadd_n_s32_x(pg, svsub_s32_x(pg, ni, hn), 127), 23));
    svfloat32_t res = svmul_f32_x(pg, svmul_f32_x(pg, p, f1), f2);
    res = svsel_f32(under, svdup_n_f32(0.0f), res);
    res = svsel_f32(over, svdup_n_f32(INFINITY), res);
    return svsel_f32(nan, x, res);
}

/* tanh(y): an odd Taylor polynomial below |y| = 0.25, 1 - 2 / (e^{2|y|} + 1) above. */
CT_SIMD_INLINE svfloat32_t ct_tanh_sv(svbool_t pg, svfloat32_t y)
{
    svfloat32_t ay = svabs_f32_x(pg, y);
    svfloat32_t y2 = svmul_f32_x(pg, y, y);
    svfloat32_t p = svdup_n_f32(62.0f / 2835.0f);
    p = svmad_f32_x(pg, p, y2, svdup_n_f32(-17.0f / 315.0f));
    p = svmad_f32_x(pg, p, y2, svdup_n_f32(2.0f / 15.0f));
    p = svmad_f32_x(pg, p, y2, svdup_n_f32(-1.0f / 3.0f));
    p = svmul_f32_x(pg, p, y2);
    svfloat32_t small = svmad_f32_x(pg, p, y, y);
    svfloat32_t e = ct_exp_sv(pg, svadd_f32_x(pg, ay, ay));
    svfloat32_t big = svsub_f32_x(pg, svdup_n_f32(1.0f), svdiv_f32_x(pg, svdup_n_f32(2.0f), svadd_n_f32_x(pg, e, 1.0f)));
    svuint32_t sign = svand_n_u32_x(pg, svreinterpret_u32_f32(y), 0x80000000u);
    big = svreinterpret_f32_u32(svorr_u32_x(pg, svreinterpret_u32_f32(big), sign));
    return svsel_f32(svcmplt_n_f32(pg, ay, 0.25f), small, big);
}

/* 1 / (1 + exp(-x)) */
CT_SIMD_INLINE svfloat32_t ct_sigmoid_sv(svbool_t pg, svfloat32_t x)
{
    svfloat32_t e = ct_exp_sv(pg, svsub_f32_x(pg, svdup_n_f32(0.0f), x));
    return svdiv_f32_x(pg, svdup_n_f32(1.0f), svadd_n_f32_x(pg, e, 1.0f));
}

/* erfc(z) for z >= 0: the Chebyshev fit of Numerical Recipes (fractional error < 1.2e-7). */
CT_SIMD_INLINE svfloat32_t ct_erfc_pos_sv(svbool_t pg, svfloat32_t z)
{
    svfloat32_t t = svdiv_f32_x(pg, svdup_n_f32(1.0f), svmad_f32_x(pg, svdup_n_f32(0.5f), z, svdup_n_f32(1.0f)));
    svfloat32_t p = svdup_n_f32(0.17087277f);
    p = svmad_f32_x(pg, p, t, svdup_n_f32(-0.82215223f));
    p = svmad_f32_x(pg, p, t, svdup_n_f32(1.48851587f));
    p = svmad_f32_x(pg, p, t, svdup_n_f32(-1.13520398f));
    p = svmad_f32_x(pg, p, t, svdup_n_f32(0.27886807f));
    p = svmad_f32_x(pg, p, t, svdup_n_f32(-0.18628806f));
    p = svmad_f32_x(pg, p, t, svdup_n_f32(0.09678418f));
    p = svmad_f32_x(pg, p, t, svdup_n_f32(0.37409196f));
    p = svmad_f32_x(pg, p, t, svdup_n_f32(1.00002368f));
    p = svmad_f32_x(pg, p, t, svdup_n_f32(-1.26551223f));
    p = svmls_f32_x(pg, p, z, z);
    return svmul_f32_x(pg, t, ct_exp_sv(pg, p));
}

#endif
