/* NEON activation bodies (see elementwise_kernels.h): lane for lane the AVX2 bodies of
 * elementwise_avx2.c, on 4-lane vectors with the maths of simd/simd_neon.h, so each element
 * gets the AVX2 bits. `bf` (0: f32 arrays, 1: bf16 arrays) is a constant in each inlined loop.
 * Tails shorter than a vector go through a zero-padded 4-lane buffer, so every element is
 * computed by the same vector code whatever its index. */
#include "ctorch/ops.h"
#include "ops/elementwise_kernels.h"
#include "simd/simd_neon.h"

#define CT_INLINE static inline __attribute__((always_inline))
#define ACT_SILU 2 /* activation kinds: CT_GELU_NONE (0), CT_GELU_TANH (1), ACT_SILU */

#define GELU_K 0.79788456080286536f /* sqrt(2 / pi) */
#define GELU_C 0.044715f
#define INV_SQRT_2PI 0.39894228040143268f

/* Phi(x) = 0.5 erfc(-x / sqrt 2), the standard normal CDF; erfc(w) = 2 - erfc(|w|) for w < 0. */
CT_INLINE float32x4_t v_phi(float32x4_t x)
{
    const float32x4_t half = vdupq_n_f32(0.5f);
    float32x4_t w = vmulq_f32(x, vdupq_n_f32(-0.70710678118654752f));
    float32x4_t h = vmulq_f32(half, ct_erfc_pos_n4(vabsq_f32(w)));
    return vbslq_f32(vcltq_f32(w, vdupq_n_f32(0.0f)), vsubq_f32(vdupq_n_f32(1.0f), h), h);
}

/* sigmoid(2 u), u = sqrt(2/pi) (x + c x^3) */
CT_INLINE float32x4_t v_gelu_tanh_s(float32x4_t x)
{
    float32x4_t x2 = vmulq_f32(x, x);
    float32x4_t u = vmulq_f32(vdupq_n_f32(GELU_K), vfmaq_f32(x, vmulq_f32(vdupq_n_f32(GELU_C), x2), x));
    return ct_sigmoid_n4(vaddq_f32(u, u));
}

CT_INLINE float32x4_t act_f(float32x4_t x, int kind)
{
    if (kind == CT_GELU_NONE) return vmulq_f32(x, v_phi(x));
    if (kind == CT_GELU_TANH) return vmulq_f32(x, v_gelu_tanh_s(x));
    const float32x4_t one = vdupq_n_f32(1.0f);
    return vdivq_f32(x, vaddq_f32(one, ct_exp_n4(vsubq_f32(vdupq_n_f32(0.0f), x))));
}

/* d act / dx */
CT_INLINE float32x4_t act_d(float32x4_t x, int kind)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    if (kind == CT_GELU_NONE) {
        float32x4_t pdf = vmulq_f32(vdupq_n_f32(INV_SQRT_2PI),
                                    ct_exp_n4(vmulq_f32(vdupq_n_f32(-0.5f), vmulq_f32(x, x))));
        return vfmaq_f32(v_phi(x), x, pdf);
    }
    if (kind == CT_GELU_TANH) {
        float32x4_t s = v_gelu_tanh_s(x);
        float32x4_t x2 = vmulq_f32(x, x);
        float32x4_t du = vmulq_f32(vdupq_n_f32(2.0f * GELU_K),
                                   vfmaq_f32(one, vdupq_n_f32(3.0f * GELU_C), x2));
        float32x4_t ss = vmulq_f32(s, vsubq_f32(one, s));
        return vfmaq_f32(s, vmulq_f32(x, ss), du);
    }
    float32x4_t s = ct_sigmoid_n4(x);
    return vmulq_f32(s, vfmaq_f32(one, x, vsubq_f32(one, s)));
}

CT_INLINE void act_fwd_loop(void *out, const void *inp, int64_t n, int kind, int bf)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) ct_st4n(out, i, act_f(ct_ld4n(inp, i, bf), kind), bf);
    if (i < n) ct_st4n_part(out, i, n - i, act_f(ct_ld4n_part(inp, i, n - i, bf), kind), bf);
}

CT_INLINE void act_bwd_loop(void *dinp, const void *dout, const void *inp, int64_t n, int kind,
                            int bf)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        ct_st4n(dinp, i, vmulq_f32(ct_ld4n(dout, i, bf), act_d(ct_ld4n(inp, i, bf), kind)), bf);
    if (i < n) {
        int64_t k = n - i;
        float32x4_t d =
            vmulq_f32(ct_ld4n_part(dout, i, k, bf), act_d(ct_ld4n_part(inp, i, k, bf), kind));
        ct_st4n_part(dinp, i, k, d, bf);
    }
}

/* One constant-kind, constant-dtype loop per (kind, bf): LOOP(K, BF) is the call. */
#define ACT_DISPATCH(kind, bf, LOOP)                                                               \
    switch (kind) {                                                                                \
    case CT_GELU_NONE: if (bf) LOOP(CT_GELU_NONE, 1); else LOOP(CT_GELU_NONE, 0); break;          \
    case CT_GELU_TANH: if (bf) LOOP(CT_GELU_TANH, 1); else LOOP(CT_GELU_TANH, 0); break;          \
    case ACT_SILU: if (bf) LOOP(ACT_SILU, 1); else LOOP(ACT_SILU, 0); break;                      \
    }

static void act_forward_neon(int kind, void *out, const void *inp, int64_t n, int bf)
{
#define FWD(K, BF) act_fwd_loop(out, inp, n, K, BF)
    ACT_DISPATCH(kind, bf, FWD)
#undef FWD
}

static void act_backward_neon(int kind, void *dinp, const void *dout, const void *inp, int64_t n,
                              int bf)
{
#define BWD(K, BF) act_bwd_loop(dinp, dout, inp, n, K, BF)
    ACT_DISPATCH(kind, bf, BWD)
#undef BWD
}

CT_INLINE float32x4_t ld_k(const void *p, int64_t i, int64_t k, int bf)
{
    return k == 4 ? ct_ld4n(p, i, bf) : ct_ld4n_part(p, i, k, bf);
}

CT_INLINE void st_k(void *p, int64_t i, int64_t k, float32x4_t v, int bf)
{
    if (k == 4)
        ct_st4n(p, i, v, bf);
    else
        ct_st4n_part(p, i, k, v, bf);
}

CT_INLINE void swiglu_fwd_loop(void *out, const void *a, const void *b, int64_t n, int bf)
{
    for (int64_t i = 0; i < n; i += 4) {
        int64_t k = n - i < 4 ? n - i : 4;
        st_k(out, i, k, vmulq_f32(act_f(ld_k(a, i, k, bf), ACT_SILU), ld_k(b, i, k, bf)), bf);
    }
}

CT_INLINE void swiglu_bwd_loop(void *da, void *db, const void *dout, const void *a, const void *b,
                               int64_t n, int bf)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    for (int64_t i = 0; i < n; i += 4) {
        int64_t k = n - i < 4 ? n - i : 4;
        float32x4_t av = ld_k(a, i, k, bf), bv = ld_k(b, i, k, bf), g = ld_k(dout, i, k, bf);
        float32x4_t s = ct_sigmoid_n4(av);
        float32x4_t silu = vmulq_f32(av, s);
        float32x4_t dsilu = vmulq_f32(s, vfmaq_f32(one, av, vsubq_f32(one, s)));
        st_k(da, i, k, vmulq_f32(vmulq_f32(g, bv), dsilu), bf);
        st_k(db, i, k, vmulq_f32(g, silu), bf);
    }
}

static void swiglu_forward_neon(void *out, const void *a, const void *b, int64_t n, int bf)
{
    if (bf)
        swiglu_fwd_loop(out, a, b, n, 1);
    else
        swiglu_fwd_loop(out, a, b, n, 0);
}

static void swiglu_backward_neon(void *da, void *db, const void *dout, const void *a,
                                 const void *b, int64_t n, int bf)
{
    if (bf)
        swiglu_bwd_loop(da, db, dout, a, b, n, 1);
    else
        swiglu_bwd_loop(da, db, dout, a, b, n, 0);
}

const ct_elementwise_kernels ct_elementwise_neon = {act_forward_neon, act_backward_neon,
                                                    swiglu_forward_neon, swiglu_backward_neon};
