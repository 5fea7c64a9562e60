/* AArch64 Advanced SIMD row primitives (see vecmath_kernels.h): 8 elements per step in two
 * float32x4_t accumulators folded by ct_hsum_n8, the tails of vecmath_avx2.c and the exp of
 * simd/simd_neon.h, so every result is bitwise the AVX2 body's. */
#include "ops/vecmath_kernels.h"
#include "simd/simd_neon.h"

static float ct_vmax_neon(const float *x, int64_t n)
{
    float32x4_t m0 = vdupq_n_f32(-INFINITY), m1 = m0;
    uint32x4_t bad = vdupq_n_u32(0);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t v0 = vld1q_f32(x + i), v1 = vld1q_f32(x + i + 4);
        bad = vorrq_u32(bad, vmvnq_u32(vandq_u32(vceqq_f32(v0, v0), vceqq_f32(v1, v1))));
        m0 = vmaxq_f32(m0, v0);
        m1 = vmaxq_f32(m1, v1);
    }
    if (vmaxvq_u32(bad)) return NAN;
    float r = vmaxvq_f32(vmaxq_f32(m0, m1));
    for (; i < n; i++) {
        if (isnan(x[i])) return NAN;
        if (x[i] > r) r = x[i];
    }
    return r;
}

static float ct_vexpsum_neon(float *out, const float *x, float m, int64_t n)
{
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, mv = vdupq_n_f32(m);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t e0 = ct_exp_n4(vsubq_f32(vld1q_f32(x + i), mv));
        float32x4_t e1 = ct_exp_n4(vsubq_f32(vld1q_f32(x + i + 4), mv));
        if (out) vst1q_f32(out + i, e0), vst1q_f32(out + i + 4, e1);
        a0 = vaddq_f32(a0, e0);
        a1 = vaddq_f32(a1, e1);
    }
    if (i < n) {
        float buf[8], ob[8];
        int k = (int)(n - i);
        for (int j = 0; j < 8; j++) buf[j] = j < k ? x[i + j] - m : -INFINITY;
        float32x4_t e0 = ct_exp_n4(vld1q_f32(buf)), e1 = ct_exp_n4(vld1q_f32(buf + 4));
        vst1q_f32(ob, e0), vst1q_f32(ob + 4, e1);
        if (out)
            for (int j = 0; j < k; j++) out[i + j] = ob[j];
        a0 = vaddq_f32(a0, e0);
        a1 = vaddq_f32(a1, e1);
    }
    return ct_hsum_n8(a0, a1);
}

static float ct_vsum_neon(const float *x, int64_t n)
{
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 = vaddq_f32(a0, vld1q_f32(x + i));
        a1 = vaddq_f32(a1, vld1q_f32(x + i + 4));
    }
    float s = ct_hsum_n8(a0, a1);
    for (; i < n; i++) s += x[i];
    return s;
}

static float ct_vdot_neon(const float *a, const float *b, int64_t n)
{
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 = vfmaq_f32(a0, vld1q_f32(a + i), vld1q_f32(b + i));
        a1 = vfmaq_f32(a1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    }
    float s = ct_hsum_n8(a0, a1);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void ct_vaxpy_neon(float *y, float a, const float *x, int64_t n)
{
    float32x4_t av = vdupq_n_f32(a);
    int64_t i = 0;
    /* 8 per step as the AVX2 body, so the same elements are fused (the tail is not) */
    for (; i + 8 <= n; i += 8) {
        vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), av, vld1q_f32(x + i)));
        vst1q_f32(y + i + 4, vfmaq_f32(vld1q_f32(y + i + 4), av, vld1q_f32(x + i + 4)));
    }
    for (; i < n; i++) y[i] += a * x[i];
}

static void ct_vscale_neon(float *x, float a, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_n_f32(vld1q_f32(x + i), a));
    for (; i < n; i++) x[i] *= a;
}

const ct_vec_kernels ct_vec_neon = {ct_vmax_neon, ct_vexpsum_neon, ct_vsum_neon,
                                    ct_vdot_neon, ct_vaxpy_neon,   ct_vscale_neon};
