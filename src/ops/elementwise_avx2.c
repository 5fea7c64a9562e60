/* AVX2 + FMA activation bodies (see elementwise_kernels.h). Each body takes `bf` (0: f32
 * arrays, 1: bf16 arrays) and is always inlined with a constant, so every dtype gets its
 * own loop. Tails shorter than a vector go through a zero-padded 8-lane buffer, so every
 * element is computed by the same vector code whatever its index: results never depend on
 * how callers split the work. exp, sigmoid and erfc are those of simd/simd_avx2.h. */
#include "ctorch/ops.h"
#include "ops/elementwise_kernels.h"
#include "simd/simd_avx2.h"

#define CT_INLINE static inline __attribute__((always_inline))
#define ACT_SILU 2 /* activation kinds: CT_GELU_NONE (0), CT_GELU_TANH (1), ACT_SILU */

/* ---- vector math ------------------------------------------------------------------------ */

/* Phi(x) = 0.5 erfc(-x / sqrt 2), the standard normal CDF. */
CT_INLINE __m256 v_phi(__m256 x)
{
    const __m256 half = _mm256_set1_ps(0.5f);
    __m256 w = _mm256_mul_ps(x, _mm256_set1_ps(-0.70710678118654752f));
    __m256 aw = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), w);
    __m256 h = _mm256_mul_ps(half, ct_erfc_pos256(aw));
    /* w < 0 (x > 0): erfc(w) = 2 - erfc(|w|) */
    return _mm256_blendv_ps(h, _mm256_sub_ps(_mm256_set1_ps(1.0f), h),
                            _mm256_cmp_ps(w, _mm256_setzero_ps(), _CMP_LT_OQ));
}

#define GELU_K 0.79788456080286536f /* sqrt(2 / pi) */
#define GELU_C 0.044715f
#define INV_SQRT_2PI 0.39894228040143268f

/* sigmoid(2 u), u = sqrt(2/pi) (x + c x^3): equals 0.5 (1 + tanh u) without its cancellation. */
CT_INLINE __m256 v_gelu_tanh_s(__m256 x)
{
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(GELU_K),
                             _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_C), x2), x, x));
    return ct_sigmoid256(_mm256_add_ps(u, u));
}

CT_INLINE __m256 act_f(__m256 x, int kind)
{
    if (kind == CT_GELU_NONE) return _mm256_mul_ps(x, v_phi(x));
    if (kind == CT_GELU_TANH) return _mm256_mul_ps(x, v_gelu_tanh_s(x));
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(x, _mm256_add_ps(one, ct_exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

/* d act / dx */
CT_INLINE __m256 act_d(__m256 x, int kind)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    if (kind == CT_GELU_NONE) {
        __m256 pdf =
            _mm256_mul_ps(_mm256_set1_ps(INV_SQRT_2PI),
                          ct_exp256(_mm256_mul_ps(_mm256_set1_ps(-0.5f), _mm256_mul_ps(x, x))));
        return _mm256_fmadd_ps(x, pdf, v_phi(x));
    }
    if (kind == CT_GELU_TANH) {
        __m256 s = v_gelu_tanh_s(x);
        __m256 x2 = _mm256_mul_ps(x, x);
        __m256 du = _mm256_mul_ps(_mm256_set1_ps(2.0f * GELU_K),
                                  _mm256_fmadd_ps(_mm256_set1_ps(3.0f * GELU_C), x2, one));
        __m256 ss = _mm256_mul_ps(s, _mm256_sub_ps(one, s));
        return _mm256_fmadd_ps(_mm256_mul_ps(x, ss), du, s);
    }
    __m256 s = ct_sigmoid256(x);
    return _mm256_mul_ps(s, _mm256_fmadd_ps(x, _mm256_sub_ps(one, s), one));
}

/* ---- activations --------------------------------------------------------------------- */

CT_INLINE void act_fwd_loop(void *out, const void *inp, int64_t n, int kind, int bf)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        ct_st8(out, i, act_f(ct_ld8(inp, i, bf), kind), bf);
    if (i < n) ct_st8_part(out, i, n - i, act_f(ct_ld8_part(inp, i, n - i, bf), kind), bf);
}

CT_INLINE void act_bwd_loop(void *dinp, const void *dout, const void *inp, int64_t n, int kind,
                            int bf)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        ct_st8(dinp, i, _mm256_mul_ps(ct_ld8(dout, i, bf), act_d(ct_ld8(inp, i, bf), kind)), bf);
    if (i < n) {
        int64_t k = n - i;
        __m256 d = _mm256_mul_ps(ct_ld8_part(dout, i, k, bf), act_d(ct_ld8_part(inp, i, k, bf), kind));
        ct_st8_part(dinp, i, k, d, bf);
    }
}

/* out[0..n) = act(inp[0..n)); kind: CT_GELU_NONE, CT_GELU_TANH or ACT_SILU. */
static void ct_act_forward_avx2(int kind, void *out, const void *inp, int64_t n, int bf)
{
#define ACT_CASE(K)                                                                                \
    case K:                                                                                        \
        if (bf)                                                                                    \
            act_fwd_loop(out, inp, n, K, 1);                                                       \
        else                                                                                       \
            act_fwd_loop(out, inp, n, K, 0);                                                       \
        break;
    switch (kind) {
        ACT_CASE(CT_GELU_NONE)
        ACT_CASE(CT_GELU_TANH)
        ACT_CASE(ACT_SILU)
    }
#undef ACT_CASE
}

/* dinp[0..n) = dout * act'(inp). */
static void ct_act_backward_avx2(int kind, void *dinp, const void *dout, const void *inp, int64_t n,
                          int bf)
{
#define ACT_CASE(K)                                                                                \
    case K:                                                                                        \
        if (bf)                                                                                    \
            act_bwd_loop(dinp, dout, inp, n, K, 1);                                                \
        else                                                                                       \
            act_bwd_loop(dinp, dout, inp, n, K, 0);                                                \
        break;
    switch (kind) {
        ACT_CASE(CT_GELU_NONE)
        ACT_CASE(CT_GELU_TANH)
        ACT_CASE(ACT_SILU)
    }
#undef ACT_CASE
}

CT_INLINE void swiglu_fwd_loop(void *out, const void *a, const void *b, int64_t n, int bf)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        ct_st8(out, i, _mm256_mul_ps(act_f(ct_ld8(a, i, bf), ACT_SILU), ct_ld8(b, i, bf)), bf);
    if (i < n) {
        int64_t k = n - i;
        __m256 y = _mm256_mul_ps(act_f(ct_ld8_part(a, i, k, bf), ACT_SILU), ct_ld8_part(b, i, k, bf));
        ct_st8_part(out, i, k, y, bf);
    }
}

CT_INLINE void swiglu_bwd_vec(void *da, void *db, const void *dout, const void *a, const void *b,
                              int64_t i, int64_t k, int bf)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 av = k == 8 ? ct_ld8(a, i, bf) : ct_ld8_part(a, i, k, bf);
    __m256 bv = k == 8 ? ct_ld8(b, i, bf) : ct_ld8_part(b, i, k, bf);
    __m256 g = k == 8 ? ct_ld8(dout, i, bf) : ct_ld8_part(dout, i, k, bf);
    __m256 s = ct_sigmoid256(av);
    __m256 silu = _mm256_mul_ps(av, s);
    __m256 dsilu = _mm256_mul_ps(s, _mm256_fmadd_ps(av, _mm256_sub_ps(one, s), one));
    __m256 dav = _mm256_mul_ps(_mm256_mul_ps(g, bv), dsilu);
    __m256 dbv = _mm256_mul_ps(g, silu);
    if (k == 8) {
        ct_st8(da, i, dav, bf);
        ct_st8(db, i, dbv, bf);
    } else {
        ct_st8_part(da, i, k, dav, bf);
        ct_st8_part(db, i, k, dbv, bf);
    }
}

/* One row segment of SwiGLU: out[0..n) = silu(a) * b. */
static void ct_swiglu_forward_avx2(void *out, const void *a, const void *b, int64_t n, int bf)
{
    if (bf)
        swiglu_fwd_loop(out, a, b, n, 1);
    else
        swiglu_fwd_loop(out, a, b, n, 0);
}

/* One row segment of the SwiGLU backward: da = dout b silu'(a), db = dout silu(a). */
static void ct_swiglu_backward_avx2(void *da, void *db, const void *dout, const void *a, const void *b,
                             int64_t n, int bf)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        if (bf)
            swiglu_bwd_vec(da, db, dout, a, b, i, 8, 1);
        else
            swiglu_bwd_vec(da, db, dout, a, b, i, 8, 0);
    }
    if (i < n) {
        if (bf)
            swiglu_bwd_vec(da, db, dout, a, b, i, n - i, 1);
        else
            swiglu_bwd_vec(da, db, dout, a, b, i, n - i, 0);
    }
}

const ct_elementwise_kernels ct_elementwise_avx2 = {ct_act_forward_avx2, ct_act_backward_avx2,
                                                    ct_swiglu_forward_avx2, ct_swiglu_backward_avx2};
