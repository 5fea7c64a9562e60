/*
 * ctorch/ops_elementwise.h - element-wise arithmetic and the activations of transformer MLPs.
 *
 * Every array is contiguous; n (or N x H) counts elements, not bytes. Sizes are int64_t and
 * must be >= 0; a pointer may be NULL only when its array is empty. Results are computed
 * element by element, so they are bitwise identical for any thread count; the AVX2 path
 * (used when ct_active_isa() is CT_ISA_AVX2 or CT_ISA_AVX512) evaluates exp/erf with polynomials and agrees
 * with the scalar path (libm) to a few units in the last place (relative error < 2e-6).
 *
 * bf16 variants take and return bfloat16 bit patterns (uint16_t), compute in f32 and round
 * once to nearest even on the way out.
 *
 * Aliasing: an output may be the SAME array as an input of the same shape (in place), never
 * a partially overlapping one. The SwiGLU kernels allow no aliasing at all.
 */
#ifndef CTORCH_OPS_ELEMENTWISE_H
#define CTORCH_OPS_ELEMENTWISE_H

#include "ctorch/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- arithmetic ------------------------------------------------------------------------ */

/** out[i] = a[i] + b[i] for i < n. Backward: da = db = dout (nothing to compute). */
CT_API ct_status ct_add(float *out, const float *a, const float *b, int64_t n);

/** out[i] = a[i] * b[i] for i < n. Backward: da = ct_mul(dout, b), db = ct_mul(dout, a). */
CT_API ct_status ct_mul(float *out, const float *a, const float *b, int64_t n);

/** out[i] = alpha * a[i] for i < n. Backward: da = ct_scale(dout, alpha). */
CT_API ct_status ct_scale(float *out, const float *a, float alpha, int64_t n);

/* ---- GELU -------------------------------------------------------------------------------- */

/** Which GELU: torch.nn.functional.gelu(x, approximate='none' | 'tanh'). */
typedef enum ct_gelu_approx {
    CT_GELU_NONE = 0, /**< exact: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) */
    CT_GELU_TANH = 1, /**< 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
} ct_gelu_approx;

/** out[n] = gelu(inp[n]) with the chosen formula. out may alias inp.
 *  CT_EINVAL: n < 0, a NULL array with n > 0, or an unknown approx. */
CT_API ct_status ct_gelu_forward(float *out, const float *inp, int64_t n, ct_gelu_approx approx);

/** dinp[n] = dout[n] * gelu'(inp[n]) (written, not accumulated). inp is the forward's input.
 *  dinp may alias dout or inp. */
CT_API ct_status ct_gelu_backward(float *dinp, const float *dout, const float *inp, int64_t n,
                                  ct_gelu_approx approx);

/** bf16 ct_gelu_forward: bf16 in and out, f32 math. */
CT_API ct_status ct_gelu_forward_bf16(uint16_t *out, const uint16_t *inp, int64_t n,
                                      ct_gelu_approx approx);

/** bf16 ct_gelu_backward: all three arrays bf16, f32 math. */
CT_API ct_status ct_gelu_backward_bf16(uint16_t *dinp, const uint16_t *dout, const uint16_t *inp,
                                       int64_t n, ct_gelu_approx approx);

/* ---- SiLU (swish) ------------------------------------------------------------------------ */

/** out[n] = silu(inp[n]) = inp * sigmoid(inp). out may alias inp. */
CT_API ct_status ct_silu_forward(float *out, const float *inp, int64_t n);

/** dinp[n] = dout * s (1 + x (1 - s)), s = sigmoid(x), x = inp (written). dinp may alias
 *  dout or inp. */
CT_API ct_status ct_silu_backward(float *dinp, const float *dout, const float *inp, int64_t n);

/** bf16 ct_silu_forward (f32 math). */
CT_API ct_status ct_silu_forward_bf16(uint16_t *out, const uint16_t *inp, int64_t n);

/** bf16 ct_silu_backward (f32 math). */
CT_API ct_status ct_silu_backward_bf16(uint16_t *dinp, const uint16_t *dout, const uint16_t *inp,
                                       int64_t n);

/* ---- SwiGLU ------------------------------------------------------------------------------ */

/** Gated SiLU of the Llama MLP. inp is [N, 2H]: each row holds the gate a = row[0..H) and
 *  then the value b = row[H..2H) (torch: `a, b = inp.chunk(2, dim=-1)`).
 *  out[N, H] = silu(a) * b. No aliasing. H >= 0, N >= 0. */
CT_API ct_status ct_swiglu_forward(float *out, const float *inp, int64_t N, int64_t H);

/** Backward of ct_swiglu_forward: dinp[N, 2H] is written, in the same [a | b] row layout:
 *  da = dout * b * silu'(a), db = dout * silu(a). dout is [N, H], inp [N, 2H]. No aliasing. */
CT_API ct_status ct_swiglu_backward(float *dinp, const float *dout, const float *inp, int64_t N,
                                    int64_t H);

/** bf16 ct_swiglu_forward (f32 math). */
CT_API ct_status ct_swiglu_forward_bf16(uint16_t *out, const uint16_t *inp, int64_t N, int64_t H);

/** bf16 ct_swiglu_backward (f32 math). */
CT_API ct_status ct_swiglu_backward_bf16(uint16_t *dinp, const uint16_t *dout, const uint16_t *inp,
                                         int64_t N, int64_t H);

#ifdef __cplusplus
}
#endif
#endif
