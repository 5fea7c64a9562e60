/* x86 vector maths written once for two widths. Include it after defining CT_SIMD_LANES:
 *   8   AVX2 + FMA + F16C (a ct_vf is an __m256), from simd_avx2.h;
 *   16  AVX-512 F + BW + DQ + VL (a ct_vf is an __m512), from simd_avx512.h.
 * Every function is the same sequence of IEEE operations lane for lane in both widths (no
 * operation depends on the lane count, and C11 mode keeps GCC from contracting the separate
 * multiplies and adds), so an element computed by the 16-lane code has the bits the 8-lane
 * code gives it. Comparisons give a ct_vm: a lane-wide all-ones mask in AVX2, a k-register
 * in AVX-512; cv_select(m, t, f) is t where m holds, f elsewhere. */
#ifndef CT_SIMD_X86_H
#define CT_SIMD_X86_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define CT_SIMD_INLINE static inline __attribute__((always_inline))

#if CT_SIMD_LANES == 8
typedef __m256 ct_vf;
typedef __m256i ct_vi;
typedef __m256 ct_vm;
#define CV_(op) _mm256_##op
#define CV_SI(op) _mm256_##op##_si256 /* the integer operations' names end in the width */
#define CV_CAST_I _mm256_castps_si256
#define CV_CAST_F _mm256_castsi256_ps
CT_SIMD_INLINE ct_vm cv_lt(ct_vf a, ct_vf b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
CT_SIMD_INLINE ct_vm cv_gt(ct_vf a, ct_vf b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
CT_SIMD_INLINE ct_vm cv_isnan(ct_vf a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
CT_SIMD_INLINE ct_vf cv_select(ct_vm m, ct_vf t, ct_vf f) { return _mm256_blendv_ps(f, t, m); }
CT_SIMD_INLINE ct_vf cv_round(ct_vf x)
{
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#elif CT_SIMD_LANES == 16
typedef __m512 ct_vf;
typedef __m512i ct_vi;
typedef __mmask16 ct_vm;
#define CV_(op) _mm512_##op
#define CV_SI(op) _mm512_##op##_si512
#define CV_CAST_I _mm512_castps_si512
#define CV_CAST_F _mm512_castsi512_ps
CT_SIMD_INLINE ct_vm cv_lt(ct_vf a, ct_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
CT_SIMD_INLINE ct_vm cv_gt(ct_vf a, ct_vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
CT_SIMD_INLINE ct_vm cv_isnan(ct_vf a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
CT_SIMD_INLINE ct_vf cv_select(ct_vm m, ct_vf t, ct_vf f) { return _mm512_mask_blend_ps(m, f, t); }
CT_SIMD_INLINE ct_vf cv_round(ct_vf x)
{
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#else
#error "define CT_SIMD_LANES as 8 (AVX2) or 16 (AVX-512) before including simd_x86.h"
#endif

#define CV_W CT_SIMD_LANES

/* ---- 8-lane folds, in both widths: the AVX-512 bodies fold their sums through them in the
 * AVX2 bodies' order, so that the sums are bitwise equal too ---------------------------- */

/* Horizontal sum of the 8 lanes: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
CT_SIMD_INLINE float ct_hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Horizontal max of the 8 lanes (NaN lanes are not propagated: callers check for them). */
CT_SIMD_INLINE float ct_hmax256(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}


CT_SIMD_INLINE ct_vf cv_set1(float a) { return CV_(set1_ps)(a); }
CT_SIMD_INLINE ct_vf cv_zero(void) { return CV_(setzero_ps)(); }
CT_SIMD_INLINE ct_vf cv_add(ct_vf a, ct_vf b) { return CV_(add_ps)(a, b); }
CT_SIMD_INLINE ct_vf cv_sub(ct_vf a, ct_vf b) { return CV_(sub_ps)(a, b); }
CT_SIMD_INLINE ct_vf cv_mul(ct_vf a, ct_vf b) { return CV_(mul_ps)(a, b); }
CT_SIMD_INLINE ct_vf cv_div(ct_vf a, ct_vf b) { return CV_(div_ps)(a, b); }
CT_SIMD_INLINE ct_vf cv_max(ct_vf a, ct_vf b) { return CV_(max_ps)(a, b); }
CT_SIMD_INLINE ct_vf cv_min(ct_vf a, ct_vf b) { return CV_(min_ps)(a, b); }
/* a b + c, -(a b) + c, a b - c: one rounding each */
CT_SIMD_INLINE ct_vf cv_fmadd(ct_vf a, ct_vf b, ct_vf c) { return CV_(fmadd_ps)(a, b, c); }
CT_SIMD_INLINE ct_vf cv_fnmadd(ct_vf a, ct_vf b, ct_vf c) { return CV_(fnmadd_ps)(a, b, c); }
CT_SIMD_INLINE ct_vf cv_fmsub(ct_vf a, ct_vf b, ct_vf c) { return CV_(fmsub_ps)(a, b, c); }
CT_SIMD_INLINE ct_vf cv_and(ct_vf a, ct_vf b) { return CV_(and_ps)(a, b); }
CT_SIMD_INLINE ct_vf cv_or(ct_vf a, ct_vf b) { return CV_(or_ps)(a, b); }
/* ~a & b */
CT_SIMD_INLINE ct_vf cv_andnot(ct_vf a, ct_vf b) { return CV_(andnot_ps)(a, b); }
CT_SIMD_INLINE ct_vf cv_loadu(const float *p) { return CV_(loadu_ps)(p); }
CT_SIMD_INLINE void cv_storeu(float *p, ct_vf v) { CV_(storeu_ps)(p, v); }

/* ---- f32 / bf16 arrays ------------------------------------------------------------------ */

/* v rounded to bf16, to nearest even, a NaN kept quiet (bitwise ct_f32_to_bf16): the bf16
 * bits are the high 16 bits of each 32-bit lane. */
CT_SIMD_INLINE ct_vi cv_bf16_round(ct_vf v)
{
    const ct_vi u = CV_CAST_I(v);
    const ct_vi absu = CV_SI(and)(u, CV_(set1_epi32)(0x7FFFFFFF));
    ct_vi lsb = CV_SI(and)(CV_(srli_epi32)(u, 16), CV_(set1_epi32)(1));
    ct_vi r = CV_(add_epi32)(u, CV_(add_epi32)(CV_(set1_epi32)(0x7FFF), lsb));
    ct_vi q = CV_SI(or)(u, CV_(set1_epi32)(0x00400000));
#if CV_W == 8
    return _mm256_blendv_epi8(r, q, _mm256_cmpgt_epi32(absu, _mm256_set1_epi32(0x7F800000)));
#else
    return _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(absu, _mm512_set1_epi32(0x7F800000)), r, q);
#endif
}

#if CV_W == 16
/* The 16 high halves of cv_bf16_round's lanes, packed in order into 256 bits. (A register
 * permute: the narrowing store vpmovdw to memory is microcoded and slow on AMD Zen 4/5.) */
CT_SIMD_INLINE __m256i cv_bf16_pack(ct_vf v)
{
    const __m512i odd = _mm512_setr_epi32(0x00030001, 0x00070005, 0x000B0009, 0x000F000D, 0x00130011,
                                          0x00170015, 0x001B0019, 0x001F001D, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi16(odd, cv_bf16_round(v)));
}
#endif

/* CV_W bf16 values (packed 16-bit) widened to f32: exact, the bits shifted up 16. */
#if CV_W == 8
CT_SIMD_INLINE ct_vf cv_widen_bf16(__m128i h)
#else
CT_SIMD_INLINE ct_vf cv_widen_bf16(__m256i h)
#endif
{
    return CV_CAST_F(CV_(slli_epi32)(CV_(cvtepu16_epi32)(h), 16));
}

/* CV_W values at index i of an f32 (bf = 0) or bf16 (bf = 1) array, as f32. Always inlined,
 * so a constant bf gives each dtype its own loop. */
CT_SIMD_INLINE ct_vf cv_ld(const void *p, int64_t i, int bf)
{
    if (!bf) return CV_(loadu_ps)((const float *)p + i);
#if CV_W == 8
    return cv_widen_bf16(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
#else
    return cv_widen_bf16(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
#endif
}

CT_SIMD_INLINE void cv_st(void *p, int64_t i, ct_vf v, int bf)
{
    if (!bf) {
        CV_(storeu_ps)((float *)p + i, v);
        return;
    }
#if CV_W == 8
    ct_vi r = _mm256_srli_epi32(cv_bf16_round(v), 16);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), packed);
#else
    _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), cv_bf16_pack(v));
#endif
}

/* The first k (0 < k < CV_W) elements at index i, zero-padded to a vector. */
CT_SIMD_INLINE ct_vf cv_ld_part(const void *p, int64_t i, int64_t k, int bf)
{
#if CV_W == 8
    size_t es = bf ? 2 : 4;
    unsigned char buf[32] = {0};
    memcpy(buf, (const unsigned char *)p + (size_t)i * es, (size_t)k * es);
    return cv_ld(buf, 0, bf);
#else
    __mmask16 m = (__mmask16)((1u << k) - 1);
    if (!bf) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    return cv_widen_bf16(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
#endif
}

CT_SIMD_INLINE void cv_st_part(void *p, int64_t i, int64_t k, ct_vf v, int bf)
{
#if CV_W == 8
    size_t es = bf ? 2 : 4;
    unsigned char buf[32];
    cv_st(buf, 0, v, bf);
    memcpy((unsigned char *)p + (size_t)i * es, buf, (size_t)k * es);
#else
    __mmask16 m = (__mmask16)((1u << k) - 1);
    if (!bf)
        _mm512_mask_storeu_ps((float *)p + i, m, v);
    else
        _mm256_mask_storeu_epi16((uint16_t *)p + i, m, cv_bf16_pack(v));
#endif
}

/* ---- functions ---------------------------------------------------------------------------- */

/* exp(x), the one x86 exp of ctorch: x = n ln2 + r (Cody-Waite, |r| <= ln2 / 2), e^r by the
 * Cephes minimax polynomial of degree 7, 2^n as two exponent factors (so n = 128 near the top
 * does not overflow the field). Below -87.33654 the result is 0 (exp(-inf) = 0 for masked
 * entries), above 88.72283 it is +inf, NaN stays NaN. Error: at most 2 ulp from the correctly
 * rounded exp over the normal range (1 measured; tests/c/test_kernels_isa.c checks it). */
CT_SIMD_INLINE ct_vf cv_exp(ct_vf x)
{
    const ct_vf lo = cv_set1(-87.33654f), hi = cv_set1(88.72283f);
    ct_vm under = cv_lt(x, lo), over = cv_gt(x, hi);
    ct_vf xc = cv_max(cv_min(x, hi), lo);
    ct_vf n = cv_round(cv_mul(xc, cv_set1(1.44269504088896341f)));
    ct_vf r = cv_fnmadd(n, cv_set1(0.693359375f), xc);
    r = cv_fnmadd(n, cv_set1(-2.12194440e-4f), r);
    ct_vf p = cv_set1(1.9875691500e-4f);
    p = cv_fmadd(p, r, cv_set1(1.3981999507e-3f));
    p = cv_fmadd(p, r, cv_set1(8.3334519073e-3f));
    p = cv_fmadd(p, r, cv_set1(4.1665795894e-2f));
    p = cv_fmadd(p, r, cv_set1(1.6666665459e-1f));
    p = cv_fmadd(p, r, cv_set1(5.0000001201e-1f));
    p = cv_fmadd(p, cv_mul(r, r), r);
    p = cv_add(p, cv_set1(1.0f));
    ct_vi ni = CV_(cvtps_epi32)(n);
    ct_vi hn = CV_(srai_epi32)(ni, 1);
    ct_vi e127 = CV_(set1_epi32)(127);
    ct_vf f1 = CV_CAST_F(CV_(slli_epi32)(CV_(add_epi32)(hn, e127), 23));
    ct_vf f2 = CV_CAST_F(CV_(slli_epi32)(CV_(add_epi32)(CV_(sub_epi32)(ni, hn), e127), 23));
    ct_vf res = cv_mul(cv_mul(p, f1), f2);
    res = cv_select(under, cv_zero(), res);
    res = cv_select(over, cv_set1(INFINITY), res);
    return cv_select(cv_isnan(x), x, res);
}

/* tanh(y): an odd Taylor polynomial below |y| = 0.25, 1 - 2 / (e^{2|y|} + 1) above. */
CT_SIMD_INLINE ct_vf cv_tanh(ct_vf y)
{
    const ct_vf sign = cv_set1(-0.0f);
    ct_vf ay = cv_andnot(sign, y);
    ct_vf y2 = cv_mul(y, y);
    ct_vf p = cv_set1(62.0f / 2835.0f);
    p = cv_fmadd(p, y2, cv_set1(-17.0f / 315.0f));
    p = cv_fmadd(p, y2, cv_set1(2.0f / 15.0f));
    p = cv_fmadd(p, y2, cv_set1(-1.0f / 3.0f));
    p = cv_mul(p, y2);
    ct_vf small = cv_fmadd(p, y, y);
    ct_vf e = cv_exp(cv_add(ay, ay));
    ct_vf big = cv_sub(cv_set1(1.0f), cv_div(cv_set1(2.0f), cv_add(e, cv_set1(1.0f))));
    big = cv_or(big, cv_and(y, sign));
    return cv_select(cv_lt(ay, cv_set1(0.25f)), small, big);
}

/* 1 / (1 + exp(-x)) */
CT_SIMD_INLINE ct_vf cv_sigmoid(ct_vf x)
{
    const ct_vf one = cv_set1(1.0f);
    return cv_div(one, cv_add(one, cv_exp(cv_sub(cv_zero(), x))));
}

/* erfc(z) for z >= 0: the Chebyshev fit of Numerical Recipes (fractional error < 1.2e-7). */
CT_SIMD_INLINE ct_vf cv_erfc_pos(ct_vf z)
{
    const ct_vf one = cv_set1(1.0f);
    ct_vf t = cv_div(one, cv_fmadd(cv_set1(0.5f), z, one));
    ct_vf p = cv_set1(0.17087277f);
    p = cv_fmadd(p, t, cv_set1(-0.82215223f));
    p = cv_fmadd(p, t, cv_set1(1.48851587f));
    p = cv_fmadd(p, t, cv_set1(-1.13520398f));
    p = cv_fmadd(p, t, cv_set1(0.27886807f));
    p = cv_fmadd(p, t, cv_set1(-0.18628806f));
    p = cv_fmadd(p, t, cv_set1(0.09678418f));
    p = cv_fmadd(p, t, cv_set1(0.37409196f));
    p = cv_fmadd(p, t, cv_set1(1.00002368f));
    p = cv_fmadd(p, t, cv_set1(-1.26551223f));
    p = cv_fnmadd(z, z, p);
    return cv_mul(t, cv_exp(p));
}

#endif
