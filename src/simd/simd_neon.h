/* AArch64 Advanced SIMD (NEON) vector maths shared by every *_neon.c kernel file. Each
 * function exists once here and is the lane-for-lane twin of simd/simd_avx2.h: the same
 * Cephes exp (Cody-Waite reduction, degree-7 polynomial with fused multiply-adds, 2^n as two
 * exponent factors), the same tanh / sigmoid / erfc, the same bf16 rounding. Each lane gets
 * the bits the AVX2 lane gets, and reductions that run 8 elements per step with two
 * float32x4_t accumulators (lanes 0-3, 4-7) and fold them by ct_hsum_n8 add in the order of
 * ct_hsum256, so those results equal the AVX2 bodies' bit for bit. */
#ifndef CT_SIMD_NEON_H
#define CT_SIMD_NEON_H

#include <arm_neon.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define CT_SIMD_INLINE static inline __attribute__((always_inline))

/* The sum of the 8 lanes lo[0..3], hi[0..3] in ct_hsum256's order:
 * ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
CT_SIMD_INLINE float ct_hsum_n8(float32x4_t lo, float32x4_t hi)
{
    float32x4_t s = vaddq_f32(lo, hi);
    float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s)); /* s0+s2, s1+s3 */
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

/* The sum of 4 lanes: (l0+l2) + (l1+l3). */
CT_SIMD_INLINE float ct_hsum_n4(float32x4_t v)
{
    float32x2_t t = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

/* 4 values at index i of an f32 (bf = 0) or bf16 (bf = 1) array, as f32. */
CT_SIMD_INLINE float32x4_t ct_ld4n(const void *p, int64_t i, int bf)
{
    if (bf) return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p + i), 16));
    return vld1q_f32((const float *)p + i);
}

/* Round 4 f32 to bf16, to nearest even; NaN stays a quiet NaN (bitwise ct_f32_to_bf16). */
CT_SIMD_INLINE uint16x4_t ct_to_bf16_n4(float32x4_t v)
{
    uint32x4_t u = vreinterpretq_u32_f32(v);
    uint32x4_t isnan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7FFFFFFFu)), vdupq_n_u32(0x7F800000u));
    uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    uint32x4_t r = vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7FFF), lsb));
    r = vbslq_u32(isnan, vorrq_u32(u, vdupq_n_u32(0x00400000u)), r);
    return vshrn_n_u32(r, 16);
}

CT_SIMD_INLINE void ct_st4n(void *p, int64_t i, float32x4_t v, int bf)
{
    if (bf)
        vst1_u16((uint16_t *)p + i, ct_to_bf16_n4(v));
    else
        vst1q_f32((float *)p + i, v);
}

/* The first k (< 4) elements at index i, zero-padded to a vector. */
CT_SIMD_INLINE float32x4_t ct_ld4n_part(const void *p, int64_t i, int64_t k, int bf)
{
    size_t es = bf ? 2 : 4;
    unsigned char buf[16] = {0};
    memcpy(buf, (const unsigned char *)p + (size_t)i * es, (size_t)k * es);
    return ct_ld4n(buf, 0, bf);
}

CT_SIMD_INLINE void ct_st4n_part(void *p, int64_t i, int64_t k, float32x4_t v, int bf)
{
    size_t es = bf ? 2 : 4;
    unsigned char buf[16];
    ct_st4n(buf, 0, v, bf);
    memcpy((unsigned char *)p + (size_t)i * es, buf, (size_t)k * es);
}

/* exp(x): see ct_exp256. Below -87.33654 the result is 0, above 88.72283 +inf, NaN stays
 * NaN; at most 2 ulp from the correctly rounded exp over the normal range. */
CT_SIMD_INLINE float32x4_t ct_exp_n4(float32x4_t x)
{
    const float32x4_t lo = vdupq_n_f32(-87.33654f), hi = vdupq_n_f32(88.72283f);
    uint32x4_t under = vcltq_f32(x, lo);
    uint32x4_t over = vcgtq_f32(x, hi);
    uint32x4_t isnum = vceqq_f32(x, x);
    float32x4_t xc = vmaxq_f32(vminq_f32(x, hi), lo);
    float32x4_t n = vrndnq_f32(vmulq_f32(xc, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(xc, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(r, p, vmulq_f32(r, r));
    p = vaddq_f32(p, vdupq_n_f32(1.0f));
    int32x4_t ni = vcvtq_s32_f32(n); /* n is integral and in range: exact */
    int32x4_t hn = vshrq_n_s32(ni, 1);
    float32x4_t f1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(hn, vdupq_n_s32(127)), 23));
    float32x4_t f2 =
        vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vsubq_s32(ni, hn), vdupq_n_s32(127)), 23));
    float32x4_t res = vmulq_f32(vmulq_f32(p, f1), f2);
    res = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(res), under));
    res = vbslq_f32(over, vdupq_n_f32(INFINITY), res);
    return vbslq_f32(isnum, res, x);
}

/* tanh(y): an odd Taylor polynomial below |y| = 0.25, 1 - 2 / (e^{2|y|} + 1) above. */
CT_SIMD_INLINE float32x4_t ct_tanh_n4(float32x4_t y)
{
    float32x4_t ay = vabsq_f32(y);
    float32x4_t y2 = vmulq_f32(y, y);
    float32x4_t p = vdupq_n_f32(62.0f / 2835.0f);
    p = vfmaq_f32(vdupq_n_f32(-17.0f / 315.0f), p, y2);
    p = vfmaq_f32(vdupq_n_f32(2.0f / 15.0f), p, y2);
    p = vfmaq_f32(vdupq_n_f32(-1.0f / 3.0f), p, y2);
    p = vmulq_f32(p, y2);
    float32x4_t small = vfmaq_f32(y, p, y);
    float32x4_t e = ct_exp_n4(vaddq_f32(ay, ay));
    float32x4_t big = vsubq_f32(vdupq_n_f32(1.0f), vdivq_f32(vdupq_n_f32(2.0f), vaddq_f32(e, vdupq_n_f32(1.0f))));
    uint32x4_t sign = vandq_u32(vreinterpretq_u32_f32(y), vdupq_n_u32(0x80000000u));
    big = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(big), sign));
    return vbslq_f32(vcltq_f32(ay, vdupq_n_f32(0.25f)), small, big);
}

/* 1 / (1 + exp(-x)) */
CT_SIMD_INLINE float32x4_t ct_sigmoid_n4(float32x4_t x)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    return vdivq_f32(one, vaddq_f32(one, ct_exp_n4(vsubq_f32(vdupq_n_f32(0.0f), x))));
}

/* erfc(z) for z >= 0: the Chebyshev fit of Numerical Recipes (fractional error < 1.2e-7). */
CT_SIMD_INLINE float32x4_t ct_erfc_pos_n4(float32x4_t z)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    float32x4_t t = vdivq_f32(one, vfmaq_f32(one, vdupq_n_f32(0.5f), z));
    float32x4_t p = vdupq_n_f32(0.17087277f);
    p = vfmaq_f32(vdupq_n_f32(-0.82215223f), p, t);
    p = vfmaq_f32(vdupq_n_f32(1.48851587f), p, t);
    p = vfmaq_f32(vdupq_n_f32(-1.13520398f), p, t);
    p = vfmaq_f32(vdupq_n_f32(0.27886807f), p, t);
    p = vfmaq_f32(vdupq_n_f32(-0.18628806f), p, t);
    p = vfmaq_f32(vdupq_n_f32(0.09678418f), p, t);
    p = vfmaq_f32(vdupq_n_f32(0.37409196f), p, t);
    p = vfmaq_f32(vdupq_n_f32(1.00002368f), p, t);
    p = vfmaq_f32(vdupq_n_f32(-1.26551223f), p, t);
    p = vfmsq_f32(p, z, z);
    return vmulq_f32(t, ct_exp_n4(p));
}

#endif
