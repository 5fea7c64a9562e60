/* The x86 activation bodies (see elementwise_kernels.h), written once over simd_x86.h's
 * vector type: elementwise_avx2.c includes this at 8 lanes, elementwise_avx512.c at 16, and
 * each defines CT_EW_TABLE, the name of its table. Each body takes `bf` (0: f32 arrays, 1:
 * bf16 arrays) and is always inlined with a constant, so every dtype gets its own loop.
 * Tails shorter than a vector are zero-padded (a buffer in AVX2, masked loads and stores in
 * AVX-512), so every element goes through the same lane operations whatever its index or
 * the width: results never depend on how callers split the work, and the 16-lane bodies
 * give the 8-lane bodies' bits (test_kernels_isa). */
#ifndef CT_EW_TABLE
#error "define CT_EW_TABLE and include simd_avx2.h or simd_avx512.h first"
#endif

#include "ctorch/ops.h"
#include "ops/elementwise_kernels.h"

#define CT_INLINE static inline __attribute__((always_inline))
#define ACT_SILU 2 /* activation kinds: CT_GELU_NONE (0), CT_GELU_TANH (1), ACT_SILU */

/* ---- vector math ------------------------------------------------------------------------ */

/* Phi(x) = 0.5 erfc(-x / sqrt 2), the standard normal CDF. */
CT_INLINE ct_vf v_phi(ct_vf x)
{
    const ct_vf half = cv_set1(0.5f);
    ct_vf w = cv_mul(x, cv_set1(-0.70710678118654752f));
    ct_vf aw = cv_andnot(cv_set1(-0.0f), w);
    ct_vf h = cv_mul(half, cv_erfc_pos(aw));
    /* w < 0 (x > 0): erfc(w) = 2 - erfc(|w|) */
    return cv_select(cv_lt(w, cv_zero()), cv_sub(cv_set1(1.0f), h), h);
}

#define GELU_K 0.79788456080286536f /* sqrt(2 / pi) */
#define GELU_C 0.044715f
#define INV_SQRT_2PI 0.39894228040143268f

/* sigmoid(2 u), u = sqrt(2/pi) (x + c x^3): equals 0.5 (1 + tanh u) without its cancellation. */
CT_INLINE ct_vf v_gelu_tanh_s(ct_vf x)
{
    ct_vf x2 = cv_mul(x, x);
    ct_vf u = cv_mul(cv_set1(GELU_K),
                             cv_fmadd(cv_mul(cv_set1(GELU_C), x2), x, x));
    return cv_sigmoid(cv_add(u, u));
}

CT_INLINE ct_vf act_f(ct_vf x, int kind)
{
    if (kind == CT_GELU_NONE) return cv_mul(x, v_phi(x));
    if (kind == CT_GELU_TANH) return cv_mul(x, v_gelu_tanh_s(x));
    const ct_vf one = cv_set1(1.0f);
    return cv_div(x, cv_add(one, cv_exp(cv_sub(cv_zero(), x))));
}

/* d act / dx */
CT_INLINE ct_vf act_d(ct_vf x, int kind)
{
    const ct_vf one = cv_set1(1.0f);
    if (kind == CT_GELU_NONE) {
        ct_vf pdf =
            cv_mul(cv_set1(INV_SQRT_2PI),
                          cv_exp(cv_mul(cv_set1(-0.5f), cv_mul(x, x))));
        return cv_fmadd(x, pdf, v_phi(x));
    }
    if (kind == CT_GELU_TANH) {
        ct_vf s = v_gelu_tanh_s(x);
        ct_vf x2 = cv_mul(x, x);
        ct_vf du = cv_mul(cv_set1(2.0f * GELU_K),
                                  cv_fmadd(cv_set1(3.0f * GELU_C), x2, one));
        ct_vf ss = cv_mul(s, cv_sub(one, s));
        return cv_fmadd(cv_mul(x, ss), du, s);
    }
    ct_vf s = cv_sigmoid(x);
    return cv_mul(s, cv_fmadd(x, cv_sub(one, s), one));
}

/* ---- activations --------------------------------------------------------------------- */

CT_INLINE void act_fwd_loop(void *out, const void *inp, int64_t n, int kind, int bf)
{
    int64_t i = 0;
    for (; i + CV_W <= n; i += CV_W)
        cv_st(out, i, act_f(cv_ld(inp, i, bf), kind), bf);
    if (i < n) cv_st_part(out, i, n - i, act_f(cv_ld_part(inp, i, n - i, bf), kind), bf);
}

CT_INLINE void act_bwd_loop(void *dinp, const void *dout, const void *inp, int64_t n, int kind,
                            int bf)
{
    int64_t i = 0;
    for (; i + CV_W <= n; i += CV_W)
        cv_st(dinp, i, cv_mul(cv_ld(dout, i, bf), act_d(cv_ld(inp, i, bf), kind)), bf);
    if (i < n) {
        int64_t k = n - i;
        ct_vf d = cv_mul(cv_ld_part(dout, i, k, bf), act_d(cv_ld_part(inp, i, k, bf), kind));
        cv_st_part(dinp, i, k, d, bf);
    }
}

/* out[0..n) = act(inp[0..n)); kind: CT_GELU_NONE, CT_GELU_TANH or ACT_SILU. */
static void x86_act_forward(int kind, void *out, const void *inp, int64_t n, int bf)
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
static void x86_act_backward(int kind, void *dinp, const void *dout, const void *inp, int64_t n,
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
    for (; i + CV_W <= n; i += CV_W)
        cv_st(out, i, cv_mul(act_f(cv_ld(a, i, bf), ACT_SILU), cv_ld(b, i, bf)), bf);
    if (i < n) {
        int64_t k = n - i;
        ct_vf y = cv_mul(act_f(cv_ld_part(a, i, k, bf), ACT_SILU), cv_ld_part(b, i, k, bf));
        cv_st_part(out, i, k, y, bf);
    }
}

CT_INLINE void swiglu_bwd_vec(void *da, void *db, const void *dout, const void *a, const void *b,
                              int64_t i, int64_t k, int bf)
{
    const ct_vf one = cv_set1(1.0f);
    ct_vf av = k == CV_W ? cv_ld(a, i, bf) : cv_ld_part(a, i, k, bf);
    ct_vf bv = k == CV_W ? cv_ld(b, i, bf) : cv_ld_part(b, i, k, bf);
    ct_vf g = k == CV_W ? cv_ld(dout, i, bf) : cv_ld_part(dout, i, k, bf);
    ct_vf s = cv_sigmoid(av);
    ct_vf silu = cv_mul(av, s);
    ct_vf dsilu = cv_mul(s, cv_fmadd(av, cv_sub(one, s), one));
    ct_vf dav = cv_mul(cv_mul(g, bv), dsilu);
    ct_vf dbv = cv_mul(g, silu);
    if (k == CV_W) {
        cv_st(da, i, dav, bf);
        cv_st(db, i, dbv, bf);
    } else {
        cv_st_part(da, i, k, dav, bf);
        cv_st_part(db, i, k, dbv, bf);
    }
}

/* One row segment of SwiGLU: out[0..n) = silu(a) * b. */
static void x86_swiglu_forward(void *out, const void *a, const void *b, int64_t n, int bf)
{
    if (bf)
        swiglu_fwd_loop(out, a, b, n, 1);
    else
        swiglu_fwd_loop(out, a, b, n, 0);
}

/* One row segment of the SwiGLU backward: da = dout b silu'(a), db = dout silu(a). */
static void x86_swiglu_backward(void *da, void *db, const void *dout, const void *a, const void *b,
                             int64_t n, int bf)
{
    int64_t i = 0;
    for (; i + CV_W <= n; i += CV_W) {
        if (bf)
            swiglu_bwd_vec(da, db, dout, a, b, i, CV_W, 1);
        else
            swiglu_bwd_vec(da, db, dout, a, b, i, CV_W, 0);
    }
    if (i < n) {
        if (bf)
            swiglu_bwd_vec(da, db, dout, a, b, i, n - i, 1);
        else
            swiglu_bwd_vec(da, db, dout, a, b, i, n - i, 0);
    }
}

const ct_elementwise_kernels CT_EW_TABLE = {x86_act_forward, x86_act_backward,
                                           x86_swiglu_forward, x86_swiglu_backward};
