/* AVX2 + FMA bodies of the activation kernels (elementwise.c) and of RMSNorm (norm.c); the
 * callers dispatch here only when ct_use_avx2(). Each body takes `bf` (0: f32 arrays,
 * 1: bf16 arrays) and is always inlined with a constant, so every dtype gets its own loop.
 * Tails shorter than a vector go through a zero-padded 8-lane buffer, so every element is
 * computed by the same vector code whatever its index: results never depend on how callers
 * split the work. bf16 rounding is round-to-nearest-even, bitwise as ct_f32_to_bf16.
 *
 * exp is the Cephes-style polynomial (relative error ~1e-7); erfc is the Chebyshev fit of
 * Numerical Recipes (fractional error < 1.2e-7 for all arguments). */
#include "ctorch/ops.h"
#include "ops/elementwise_kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define CT_INLINE static inline __attribute__((always_inline))
#define ACT_SILU 2 /* activation kinds: CT_GELU_NONE (0), CT_GELU_TANH (1), ACT_SILU */

/* ---- loads, stores, reductions --------------------------------------------------------- */

CT_INLINE __m256 ld(const void *p, int64_t i, int bf)
{
    if (bf) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)p + i);
}

CT_INLINE void st(void *p, int64_t i, __m256 v, int bf)
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
CT_INLINE __m256 ld_part(const void *p, int64_t i, int64_t k, int bf)
{
    size_t es = bf ? 2 : 4;
    unsigned char buf[32] = {0};
    memcpy(buf, (const unsigned char *)p + (size_t)i * es, (size_t)k * es);
    return ld(buf, 0, bf);
}

CT_INLINE void st_part(void *p, int64_t i, int64_t k, __m256 v, int bf)
{
    size_t es = bf ? 2 : 4;
    unsigned char buf[32];
    st(buf, 0, v, bf);
    memcpy((unsigned char *)p + (size_t)i * es, buf, (size_t)k * es);
}

CT_INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- vector math ------------------------------------------------------------------------ */

/* exp(x): 0 below -87.34 (the normal range), +inf above 88.38, NaN stays NaN. */
CT_INLINE __m256 v_exp(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.336544f), hi = _mm256_set1_ps(88.376262f);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
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
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    res = _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), res);
    res = _mm256_blendv_ps(res, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
    return _mm256_blendv_ps(res, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* 1 / (1 + exp(-x)) */
CT_INLINE __m256 v_sigmoid(__m256 x)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(one, _mm256_add_ps(one, v_exp(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

/* erfc(z) for z >= 0. */
CT_INLINE __m256 v_erfc_pos(__m256 z)
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
    return _mm256_mul_ps(t, v_exp(p));
}

/* Phi(x) = 0.5 erfc(-x / sqrt 2), the standard normal CDF. */
CT_INLINE __m256 v_phi(__m256 x)
{
    const __m256 half = _mm256_set1_ps(0.5f);
    __m256 w = _mm256_mul_ps(x, _mm256_set1_ps(-0.70710678118654752f));
    __m256 aw = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), w);
    __m256 h = _mm256_mul_ps(half, v_erfc_pos(aw));
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
    return v_sigmoid(_mm256_add_ps(u, u));
}

CT_INLINE __m256 act_f(__m256 x, int kind)
{
    if (kind == CT_GELU_NONE) return _mm256_mul_ps(x, v_phi(x));
    if (kind == CT_GELU_TANH) return _mm256_mul_ps(x, v_gelu_tanh_s(x));
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(x, _mm256_add_ps(one, v_exp(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

/* d act / dx */
CT_INLINE __m256 act_d(__m256 x, int kind)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    if (kind == CT_GELU_NONE) {
        __m256 pdf =
            _mm256_mul_ps(_mm256_set1_ps(INV_SQRT_2PI),
                          v_exp(_mm256_mul_ps(_mm256_set1_ps(-0.5f), _mm256_mul_ps(x, x))));
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
    __m256 s = v_sigmoid(x);
    return _mm256_mul_ps(s, _mm256_fmadd_ps(x, _mm256_sub_ps(one, s), one));
}

/* ---- activations --------------------------------------------------------------------- */

CT_INLINE void act_fwd_loop(void *out, const void *inp, int64_t n, int kind, int bf)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        st(out, i, act_f(ld(inp, i, bf), kind), bf);
    if (i < n) st_part(out, i, n - i, act_f(ld_part(inp, i, n - i, bf), kind), bf);
}

CT_INLINE void act_bwd_loop(void *dinp, const void *dout, const void *inp, int64_t n, int kind,
                            int bf)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        st(dinp, i, _mm256_mul_ps(ld(dout, i, bf), act_d(ld(inp, i, bf), kind)), bf);
    if (i < n) {
        int64_t k = n - i;
        __m256 d = _mm256_mul_ps(ld_part(dout, i, k, bf), act_d(ld_part(inp, i, k, bf), kind));
        st_part(dinp, i, k, d, bf);
    }
}

/* out[0..n) = act(inp[0..n)); kind: CT_GELU_NONE, CT_GELU_TANH or ACT_SILU. */
void ct_act_forward_avx2(int kind, void *out, const void *inp, int64_t n, int bf)
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
void ct_act_backward_avx2(int kind, void *dinp, const void *dout, const void *inp, int64_t n,
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
        st(out, i, _mm256_mul_ps(act_f(ld(a, i, bf), ACT_SILU), ld(b, i, bf)), bf);
    if (i < n) {
        int64_t k = n - i;
        __m256 y = _mm256_mul_ps(act_f(ld_part(a, i, k, bf), ACT_SILU), ld_part(b, i, k, bf));
        st_part(out, i, k, y, bf);
    }
}

CT_INLINE void swiglu_bwd_vec(void *da, void *db, const void *dout, const void *a, const void *b,
                              int64_t i, int64_t k, int bf)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 av = k == 8 ? ld(a, i, bf) : ld_part(a, i, k, bf);
    __m256 bv = k == 8 ? ld(b, i, bf) : ld_part(b, i, k, bf);
    __m256 g = k == 8 ? ld(dout, i, bf) : ld_part(dout, i, k, bf);
    __m256 s = v_sigmoid(av);
    __m256 silu = _mm256_mul_ps(av, s);
    __m256 dsilu = _mm256_mul_ps(s, _mm256_fmadd_ps(av, _mm256_sub_ps(one, s), one));
    __m256 dav = _mm256_mul_ps(_mm256_mul_ps(g, bv), dsilu);
    __m256 dbv = _mm256_mul_ps(g, silu);
    if (k == 8) {
        st(da, i, dav, bf);
        st(db, i, dbv, bf);
    } else {
        st_part(da, i, k, dav, bf);
        st_part(db, i, k, dbv, bf);
    }
}

/* One row segment of SwiGLU: out[0..n) = silu(a) * b. */
void ct_swiglu_forward_avx2(void *out, const void *a, const void *b, int64_t n, int bf)
{
    if (bf)
        swiglu_fwd_loop(out, a, b, n, 1);
    else
        swiglu_fwd_loop(out, a, b, n, 0);
}

/* One row segment of the SwiGLU backward: da = dout b silu'(a), db = dout silu(a). */
void ct_swiglu_backward_avx2(void *da, void *db, const void *dout, const void *a, const void *b,
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

/* ---- RMSNorm ------------------------------------------------------------------------- */

/* sum_i x[i] * y[i] over a row of C values (x may be y). */
CT_INLINE float row_dot(const void *x, const void *y, int64_t C, int bf)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= C; i += 16) {
        a0 = _mm256_fmadd_ps(ld(x, i, bf), ld(y, i, bf), a0);
        a1 = _mm256_fmadd_ps(ld(x, i + 8, bf), ld(y, i + 8, bf), a1);
    }
    if (i + 8 <= C) {
        a0 = _mm256_fmadd_ps(ld(x, i, bf), ld(y, i, bf), a0);
        i += 8;
    }
    if (i < C) a1 = _mm256_fmadd_ps(ld_part(x, i, C - i, bf), ld_part(y, i, C - i, bf), a1);
    return hsum(_mm256_add_ps(a0, a1));
}

CT_INLINE void rms_fwd_rows(void *out, float *rstd, const void *inp, const void *w, int64_t r0,
                            int64_t r1, int64_t C, float eps, int bf)
{
    size_t es = bf ? 2 : 4;
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *x = (const unsigned char *)inp + (size_t)(r * C) * es;
        unsigned char *y = (unsigned char *)out + (size_t)(r * C) * es;
        float rs = 1.0f / sqrtf(row_dot(x, x, C, bf) / (float)C + eps);
        if (rstd) rstd[r] = rs;
        __m256 rv = _mm256_set1_ps(rs);
        int64_t i = 0;
        for (; i + 8 <= C; i += 8) {
            __m256 v = _mm256_mul_ps(ld(x, i, bf), rv);
            if (w) v = _mm256_mul_ps(v, ld(w, i, bf));
            st(y, i, v, bf);
        }
        if (i < C) {
            int64_t k = C - i;
            __m256 v = _mm256_mul_ps(ld_part(x, i, k, bf), rv);
            if (w) v = _mm256_mul_ps(v, ld_part(w, i, k, bf));
            st_part(y, i, k, v, bf);
        }
    }
}

/* Rows [r0, r1) of the RMSNorm forward (see ct_rmsnorm_forward). */
void ct_rmsnorm_forward_rows_avx2(void *out, float *rstd, const void *inp, const void *w,
                                  int64_t r0, int64_t r1, int64_t C, float eps, int bf)
{
    if (bf)
        rms_fwd_rows(out, rstd, inp, w, r0, r1, C, eps, 1);
    else
        rms_fwd_rows(out, rstd, inp, w, r0, r1, C, eps, 0);
}

CT_INLINE void rms_bwd_vec(void *dx, float *pw, const void *g, const void *x, const void *w,
                           __m256 rv, __m256 kv, int64_t i, int64_t k, int bf)
{
    __m256 gv = k == 8 ? ld(g, i, bf) : ld_part(g, i, k, bf);
    __m256 xv = k == 8 ? ld(x, i, bf) : ld_part(x, i, k, bf);
    __m256 gw = gv;
    if (w) gw = _mm256_mul_ps(gv, k == 8 ? ld(w, i, bf) : ld_part(w, i, k, bf));
    if (pw) {
        __m256 p = k == 8 ? ld(pw, i, 0) : ld_part(pw, i, k, 0);
        p = _mm256_fmadd_ps(gv, _mm256_mul_ps(xv, rv), p);
        if (k == 8)
            st(pw, i, p, 0);
        else
            st_part(pw, i, k, p, 0);
    }
    __m256 d = _mm256_fmsub_ps(rv, gw, _mm256_mul_ps(kv, xv));
    if (k == 8)
        st(dx, i, d, bf);
    else
        st_part(dx, i, k, d, bf);
}

CT_INLINE void rms_bwd_rows(void *dinp, float *pw, const void *dout, const void *inp, const void *w,
                            const float *rstd, int64_t r0, int64_t r1, int64_t C, int bf)
{
    size_t es = bf ? 2 : 4;
    for (int64_t r = r0; r < r1; r++) {
        size_t off = (size_t)(r * C) * es;
        const unsigned char *x = (const unsigned char *)inp + off;
        const unsigned char *g = (const unsigned char *)dout + off;
        unsigned char *dx = (unsigned char *)dinp + off;
        float rs = rstd[r];
        /* dot = sum_c (g w)_c x_c */
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= C; i += 8) {
            __m256 gw = ld(g, i, bf);
            if (w) gw = _mm256_mul_ps(gw, ld(w, i, bf));
            if ((i & 8) == 0)
                a0 = _mm256_fmadd_ps(gw, ld(x, i, bf), a0);
            else
                a1 = _mm256_fmadd_ps(gw, ld(x, i, bf), a1);
        }
        if (i < C) {
            __m256 gw = ld_part(g, i, C - i, bf);
            if (w) gw = _mm256_mul_ps(gw, ld_part(w, i, C - i, bf));
            a1 = _mm256_fmadd_ps(gw, ld_part(x, i, C - i, bf), a1);
        }
        float dot = hsum(_mm256_add_ps(a0, a1));
        __m256 rv = _mm256_set1_ps(rs);
        __m256 kv = _mm256_set1_ps(dot / (float)C * rs * rs * rs);
        for (i = 0; i + 8 <= C; i += 8)
            rms_bwd_vec(dx, pw, g, x, w, rv, kv, i, 8, bf);
        if (i < C) rms_bwd_vec(dx, pw, g, x, w, rv, kv, i, C - i, bf);
    }
}

/* Rows [r0, r1) of the RMSNorm backward: dinp written; pw[C] (NULL to skip) += dout * xhat. */
void ct_rmsnorm_backward_rows_avx2(void *dinp, float *pw, const void *dout, const void *inp,
                                   const void *w, const float *rstd, int64_t r0, int64_t r1,
                                   int64_t C, int bf)
{
    if (bf)
        rms_bwd_rows(dinp, pw, dout, inp, w, rstd, r0, r1, C, 1);
    else
        rms_bwd_rows(dinp, pw, dout, inp, w, rstd, r0, r1, C, 0);
}
