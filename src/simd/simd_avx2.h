/* AVX2 + FMA vector maths shared by every *_avx2.c kernel file (include only from files
 * compiled with -mavx2 -mfma -mf16c). Each function exists once here. */
#ifndef CT_SIMD_AVX2_H
#define CT_SIMD_AVX2_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define CT_SIMD_INLINE static inline __attribute__((always_inline))

/* Horizontal sum of the 8 lanes: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
static inline float ct_hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Horizontal max of the 8 lanes (NaN lanes are not propagated: callers check for them). */
static inline float ct_hmax256(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 values at index i of an f32 (bf = 0) or bf16 (bf = 1) array, as f32; stores round to
 * bf16 to nearest even (NaN stays a quiet NaN), bitwise as ct_f32_to_bf16. Always inlined so
 * a constant bf gives each dtype its own loop. */
CT_SIMD_INLINE __m256 ct_ld8(const void *p, int64_t i, int bf)
{
    if (bf) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)p + i);
}

CT_SIMD_INLINE void ct_st8(void *p, int64_t i, __m256 v, int bf)
{
    if (!bf) {
        _mm256_storeu_ps((float *)p + i, v);
        return;
    }
    const __m256i u = _mm256_castps_si256(v);
    const __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                             _mm256_set1_epi32(0x7F800000));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), isnan);
    r = _mm256_srli_epi32(r, 16);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), packed);
}

/* The first k (< 8) elements at index i, zero-padded to a vector. */
CT_SIMD_INLINE __m256 ct_ld8_part(const void *p, int64_t i, int64_t k, int bf)
{
    size_t es = bf ? 2 : 4;
    unsigned char buf[32] = {0};
    memcpy(buf, (const unsigned char *)p + (size_t)i * es, (size_t)k * es);
    return ct_ld8(buf, 0, bf);
}

CT_SIMD_INLINE void ct_st8_part(void *p, int64_t i, int64_t k, __m256 v, int bf)
{
    size_t es = bf ? 2 : 4;
    unsigned char buf[32];
    ct_st8(buf, 0, v, bf);
    memcpy((unsigned char *)p + (size_t)i * es, buf, (size_t)k * es);
}

/* exp(x), the one AVX2 exp of ctorch: x = n ln2 + r (Cody-Waite, |r| <= ln2 / 2), e^r by
 * the Cephes minimax polynomial of degree 7, 2^n as two exponent factors (so n = 128 near
 * the top does not overflow the field). Below -87.33654 the result is 0 (exp(-inf) = 0 for
 * masked entries), above 88.72283 it is +inf, NaN stays NaN. Error: at most 2 ulp from the
 * correctly rounded exp over the normal range (1 measured; tests/c/test_kernels_isa.c checks it). */
static inline __m256 ct_exp256(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.72283f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    __m256 xc = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i hn = _mm256_srai_epi32(ni, 1);
    __m256 f1 =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(hn, _mm256_set1_epi32(127)), 23));
    __m256 f2 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, hn), _mm256_set1_epi32(127)), 23));
    __m256 res = _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
    res = _mm256_andnot_ps(under, res);
    res = _mm256_blendv_ps(res, _mm256_set1_ps(INFINITY), over);
    return _mm256_blendv_ps(res, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* tanh(y): an odd Taylor polynomial below |y| = 0.25, 1 - 2 / (e^{2|y|} + 1) above. */
static inline __m256 ct_tanh256(__m256 y)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 ay = _mm256_andnot_ps(sign, y);
    __m256 y2 = _mm256_mul_ps(y, y);
    __m256 p = _mm256_set1_ps(62.0f / 2835.0f);
    p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(-17.0f / 315.0f));
    p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(-1.0f / 3.0f));
    p = _mm256_mul_ps(p, y2);
    __m256 small = _mm256_fmadd_ps(p, y, y);
    __m256 e = ct_exp256(_mm256_add_ps(ay, ay));
    __m256 big =
        _mm256_sub_ps(_mm256_set1_ps(1.0f),
                      _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    big = _mm256_or_ps(big, _mm256_and_ps(y, sign));
    return _mm256_blendv_ps(big, small, _mm256_cmp_ps(ay, _mm256_set1_ps(0.25f), _CMP_LT_OQ));
}

/* 1 / (1 + exp(-x)) */
static inline __m256 ct_sigmoid256(__m256 x)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(one, _mm256_add_ps(one, ct_exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

/* erfc(z) for z >= 0: the Chebyshev fit of Numerical Recipes (fractional error < 1.2e-7). */
static inline __m256 ct_erfc_pos256(__m256 z)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.5f), z, one));
    __m256 p = _mm256_set1_ps(0.17087277f);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.82215223f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.48851587f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.13520398f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.27886807f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.18628806f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.09678418f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.37409196f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.00002368f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.26551223f));
    p = _mm256_fnmadd_ps(z, z, p);
    return _mm256_mul_ps(t, ct_exp256(p));
}

#endif
