/* SVE activation bodies (see elementwise_kernels.h), vector-length agnostic: one whilelt
 * predicated loop per call (the predicate covers the tail), each lane computing what an AVX2
 * and NEON lane computes with the maths of simd/simd_sve.h, so every element gets the same
 * bits at any vector length. `bf` (0: f32 arrays, 1: bf16 arrays) is a constant in each
 * inlined loop. */
#include "ctorch/ops.h"
#include "ops/elementwise_kernels.h"
#include "simd/simd_sve.h"

#define CT_INLINE static inline __attribute__((always_inline))
#define ACT_SILU 2 /* activation kinds: CT_GELU_NONE (0), CT_GELU_TANH (1), ACT_SILU */

#define GELU_K 0.79788456080286536f /* sqrt(2 / pi) */
#define GELU_C 0.044715f
#define INV_SQRT_2PI 0.39894228040143268f

/* Phi(x) = 0.5 erfc(-x / sqrt 2), the standard normal CDF; erfc(w) = 2 - erfc(|w|) for w < 0. */
CT_INLINE svfloat32_t v_phi(svbool_t pg, svfloat32_t x)
{
    svfloat32_t w = svmul_n_f32_x(pg, x, -0.70710678118654752f);
    svfloat32_t h = svmul_n_f32_x(pg, ct_erfc_pos_sv(pg, svabs_f32_x(pg, w)), 0.5f);
    return svsel_f32(svcmplt_n_f32(pg, w, 0.0f), svsubr_n_f32_x(pg, h, 1.0f), h);
}

/* sigmoid(2 u), u = sqrt(2/pi) (x + c x^3) */
CT_INLINE svfloat32_t v_gelu_tanh_s(svbool_t pg, svfloat32_t x)
{
    svfloat32_t x2 = svmul_f32_x(pg, x, x);
    svfloat32_t cx2 = svmul_f32_x(pg, svdup_n_f32(GELU_C), x2);
    svfloat32_t u = svmul_f32_x(pg, svdup_n_f32(GELU_K), svmla_f32_x(pg, x, cx2, x));
    return ct_sigmoid_sv(pg, svadd_f32_x(pg, u, u));
}

CT_INLINE svfloat32_t act_f(svbool_t pg, svfloat32_t x, int kind)
{
    if (kind == CT_GELU_NONE) return svmul_f32_x(pg, x, v_phi(pg, x));
    if (kind == CT_GELU_TANH) return svmul_f32_x(pg, x, v_gelu_tanh_s(pg, x));
    svfloat32_t e = ct_exp_sv(pg, svsubr_n_f32_x(pg, x, 0.0f));
    return svdiv_f32_x(pg, x, svadd_n_f32_x(pg, e, 1.0f));
}

/* d act / dx */
CT_INLINE svfloat32_t act_d(svbool_t pg, svfloat32_t x, int kind)
{
    const svfloat32_t one = svdup_n_f32(1.0f);
    if (kind == CT_GELU_NONE) {
        svfloat32_t q = svmul_f32_x(pg, svdup_n_f32(-0.5f), svmul_f32_x(pg, x, x));
        svfloat32_t pdf = svmul_f32_x(pg, svdup_n_f32(INV_SQRT_2PI), ct_exp_sv(pg, q));
        return svmla_f32_x(pg, v_phi(pg, x), x, pdf);
    }
    if (kind == CT_GELU_TANH) {
        svfloat32_t s = v_gelu_tanh_s(pg, x);
        svfloat32_t x2 = svmul_f32_x(pg, x, x);
        svfloat32_t du = svmul_f32_x(pg, svdup_n_f32(2.0f * GELU_K),
                                     svmla_f32_x(pg, one, svdup_n_f32(3.0f * GELU_C), x2));
        svfloat32_t ss = svmul_f32_x(pg, s, svsub_f32_x(pg, one, s));
        return svmla_f32_x(pg, s, svmul_f32_x(pg, x, ss), du);
    }
    svfloat32_t s = ct_sigmoid_sv(pg, x);
    return svmul_f32_x(pg, s, svmla_f32_x(pg, one, x, svsub_f32_x(pg, one, s)));
}

CT_INLINE void act_fwd_loop(void *out, const void *inp, int64_t n, int kind, int bf)
{
    const int64_t vl = (int64_t)svcntw();
    for (int64_t i = 0; i < n; i += vl) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        ct_st_sv(pg, out, i, act_f(pg, ct_ld_sv(pg, inp, i, bf), kind), bf);
    }
}

CT_INLINE void act_bwd_loop(void *dinp, const void *dout, const void *inp, int64_t n, int kind,
                            int bf)
{
    const int64_t vl = (int64_t)svcntw();
    for (int64_t i = 0; i < n; i += vl) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        svfloat32_t d = svmul_f32_x(pg, ct_ld_sv(pg, dout, i, bf),
                                    act_d(pg, ct_ld_sv(pg, inp, i, bf), kind));
        ct_st_sv(pg, dinp, i, d, bf);
    }
}

/* One constant-kind, constant-dtype loop per (kind, bf): LOOP(K, BF) is the call. */
#define ACT_DISPATCH(kind, bf, LOOP)                                                               \
    switch (kind) {                                                                                \
    case CT_GELU_NONE: if (bf) LOOP(CT_GELU_NONE, 1); else LOOP(CT_GELU_NONE, 0); break;          \
    case CT_GELU_TANH: if (bf) LOOP(CT_GELU_TANH, 1); else LOOP(CT_GELU_TANH, 0); break;          \
    case ACT_SILU: if (bf) LOOP(ACT_SILU, 1); else LOOP(ACT_SILU, 0); break;                      \
    }

static void act_forward_sve(int kind, void *out, const void *inp, int64_t n, int bf)
{
#define FWD(K, BF) act_fwd_loop(out, inp, n, K, BF)
    ACT_DISPATCH(kind, bf, FWD)
#undef FWD
}

static void act_backward_sve(int kind, void *dinp, const void *dout, const void *inp, int64_t n,
                             int bf)
{
#define BWD(K, BF) act_bwd_loop(dinp, dout, inp, n, K, BF)
    ACT_DISPATCH(kind, bf, BWD)
#undef BWD
}

CT_INLINE void swiglu_fwd_loop(void *out, const void *a, const void *b, int64_t n, int bf)
{
    const int64_t vl = (int64_t)svcntw();
    for (int64_t i = 0; i < n; i += vl) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        svfloat32_t y = svmul_f32_x(pg, act_f(pg, ct_ld_sv(pg, a, i, bf), ACT_SILU),
                                    ct_ld_sv(pg, b, i, bf));
        ct_st_sv(pg, out, i, y, bf);
    }
}

CT_INLINE void swiglu_bwd_loop(void *da, void *db, const void *dout, const void *a, const void *b,
                               int64_t n, int bf)
{
    const int64_t vl = (int64_t)svcntw();
    const svfloat32_t one = svdup_n_f32(1.0f);
    for (int64_t i = 0; i < n; i += vl) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        svfloat32_t av = ct_ld_sv(pg, a, i, bf), bv = ct_ld_sv(pg, b, i, bf);
        svfloat32_t g = ct_ld_sv(pg, dout, i, bf);
        svfloat32_t s = ct_sigmoid_sv(pg, av);
        svfloat32_t silu = svmul_f32_x(pg, av, s);
        svfloat32_t dsilu = svmul_f32_x(pg, s, svmla_f32_x(pg, one, av, svsub_f32_x(pg, one, s)));
        ct_st_sv(pg, da, i, svmul_f32_x(pg, svmul_f32_x(pg, g, bv), dsilu), bf);
        ct_st_sv(pg, db, i, svmul_f32_x(pg, g, silu), bf);
    }
}

static void swiglu_forward_sve(void *out, const void *a, const void *b, int64_t n, int bf)
{
    if (bf)
        swiglu_fwd_loop(out, a, b, n, 1);
    else
        swiglu_fwd_loop(out, a, b, n, 0);
}

static void swiglu_backward_sve(void *da, void *db, const void *dout, const void *a,
                                const void *b, int64_t n, int bf)
{
    if (bf)
        swiglu_bwd_loop(da, db, dout, a, b, n, 1);
    else
        swiglu_bwd_loop(da, db, dout, a, b, n, 0);
}

const ct_elementwise_kernels ct_elementwise_sve = {act_forward_sve, act_backward_sve,
                                                   swiglu_forward_sve, swiglu_backward_sve};
