/* Scalar activation bodies (see elementwise_kernels.h): libm erfcf / expf. GELU is x Phi(x)
 * with Phi(x) = erfc(-x / sqrt 2) / 2, the tanh form x sigmoid(2u). */
#include "ops/elementwise_kernels.h"
#include "ctorch/ops.h"

#include <math.h>

#define ACT_SILU 2 /* activation kinds: CT_GELU_NONE (0), CT_GELU_TANH (1), ACT_SILU */
#define SQRT1_2 0.70710678118654752f
#define GELU_K 0.79788456080286536f /* sqrt(2 / pi) */
#define GELU_C 0.044715f
#define INV_SQRT_2PI 0.39894228040143268f

/* ---- scalar maths --------------------------------------------------------------------- */

static inline float ldx(const void *p, int64_t i, int bf)
{
    return bf ? ct_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void stx(void *p, int64_t i, float v, int bf)
{
    if (bf)
        ((uint16_t *)p)[i] = ct_f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

static inline float sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static inline float gelu_tanh_s(float x)
{
    float u = GELU_K * (GELU_C * (x * x) * x + x);
    return sigmoidf(u + u);
}

static inline float act_f(float x, int kind)
{
    if (kind == CT_GELU_NONE) return x * (0.5f * erfcf(-x * SQRT1_2));
    if (kind == CT_GELU_TANH) return x * gelu_tanh_s(x);
    return x / (1.0f + expf(-x));
}

static inline float act_d(float x, int kind)
{
    if (kind == CT_GELU_NONE)
        return x * (INV_SQRT_2PI * expf(-0.5f * (x * x))) + 0.5f * erfcf(-x * SQRT1_2);
    if (kind == CT_GELU_TANH) {
        float s = gelu_tanh_s(x);
        float du = 2.0f * GELU_K * (3.0f * GELU_C * (x * x) + 1.0f);
        return x * (s * (1.0f - s)) * du + s;
    }
    float s = sigmoidf(x);
    return s * (x * (1.0f - s) + 1.0f);
}

static void act_forward_scalar(int kind, void *out, const void *inp, int64_t n, int bf)
{
    for (int64_t i = 0; i < n; i++)
        stx(out, i, act_f(ldx(inp, i, bf), kind), bf);
}

static void act_backward_scalar(int kind, void *dinp, const void *dout, const void *inp, int64_t n,
                                int bf)
{
    for (int64_t i = 0; i < n; i++)
        stx(dinp, i, ldx(dout, i, bf) * act_d(ldx(inp, i, bf), kind), bf);
}

static void swiglu_forward_scalar(void *out, const void *a, const void *b, int64_t n, int bf)
{
    for (int64_t j = 0; j < n; j++)
        stx(out, j, act_f(ldx(a, j, bf), ACT_SILU) * ldx(b, j, bf), bf);
}

static void swiglu_backward_scalar(void *da, void *db, const void *dout, const void *a,
                                   const void *b, int64_t n, int bf)
{
    for (int64_t j = 0; j < n; j++) {
        float x = ldx(a, j, bf), y = ldx(b, j, bf), gj = ldx(dout, j, bf);
        float s = sigmoidf(x);
        stx(da, j, gj * y * (s * (x * (1.0f - s) + 1.0f)), bf);
        stx(db, j, gj * (x * s), bf);
    }
}

const ct_elementwise_kernels ct_elementwise_scalar = {act_forward_scalar, act_backward_scalar,
                                                      swiglu_forward_scalar, swiglu_backward_scalar};
