/*
 * ctorch/ops_norm.h - the per-row transforms around attention: RMSNorm, LayerNorm and
 * rotary position embedding (RoPE).
 *
 * Norms work on rows: inp is [N, C] contiguous (N = B*T tokens, C channels) and normalise
 * each row over its C values; the statistics are computed in f32. Forward kernels may save
 * per-row statistics (mean[N], rstd[N]) for the backward. Backward kernels WRITE dinp and
 * ACCUMULATE (+=) dweight / dbias. dweight and dbias are summed over a fixed partition of
 * the rows (at most CT_NORM_ROW_CHUNKS chunks, chosen from N alone) and the chunk partials
 * are added in chunk order in double, so the gradients are bitwise identical for every thread
 * count. Such backwards allocate CT_NORM_ROW_CHUNKS x C floats of scratch (ct_alloc) and
 * may fail with CT_ENOMEM.
 *
 * Aliasing: out may be inp (in place) and dinp may be dout; nothing else may overlap.
 * bf16 variants take bf16 activations and weights, keep rstd/mean and the weight gradients
 * in f32, compute in f32 and round once on the way out.
 *
 * Common errors (CT_EINVAL, the message names the argument): N < 0, C < 1 while N > 0,
 * a required array NULL while N > 0, eps < 0 or not finite.
 */
#ifndef CTORCH_OPS_NORM_H
#define CTORCH_OPS_NORM_H

#include "ctorch/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Upper bound on the row chunks that partial weight gradients are summed over. */
#define CT_NORM_ROW_CHUNKS 64

/* ---- RMSNorm ----------------------------------------------------------------------------- */

/** RMSNorm (Llama; torch 2.x F.rms_norm over the last dim):
 *    rstd[n] = 1 / sqrt(mean_c inp[n,c]^2 + eps),  out[n,c] = inp[n,c] * rstd[n] * weight[c].
 *  out [N,C] written; rstd [N] written when not NULL (the backward needs it);
 *  weight [C] or NULL for none (all ones); inp [N,C]. */
CT_API ct_status ct_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                                    int64_t N, int64_t C, float eps);

/** Backward of ct_rmsnorm_forward, from the forward's saved rstd[N] (required).
 *  dinp [N,C] written; dweight [C] += sum_n dout * inp * rstd (NULL: skip);
 *  dout, inp [N,C]; weight [C] or NULL as in the forward. */
CT_API ct_status ct_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                     const float *inp, const float *weight, const float *rstd,
                                     int64_t N, int64_t C);

/** bf16 ct_rmsnorm_forward: out, inp, weight bf16 (weight may be NULL); rstd f32. */
CT_API ct_status ct_rmsnorm_forward_bf16(uint16_t *out, float *rstd, const uint16_t *inp,
                                         const uint16_t *weight, int64_t N, int64_t C, float eps);

/** bf16 ct_rmsnorm_backward: dinp, dout, inp, weight bf16; dweight and rstd f32. */
CT_API ct_status ct_rmsnorm_backward_bf16(uint16_t *dinp, float *dweight, const uint16_t *dout,
                                          const uint16_t *inp, const uint16_t *weight,
                                          const float *rstd, int64_t N, int64_t C);

/* ---- LayerNorm --------------------------------------------------------------------------- */

/** LayerNorm (torch F.layer_norm over the last dim, biased variance):
 *    mean[n] = mean_c inp[n,c],  rstd[n] = 1 / sqrt(mean_c (inp[n,c] - mean[n])^2 + eps),
 *    out[n,c] = (inp[n,c] - mean[n]) * rstd[n] * weight[c] + bias[c].
 *  out [N,C] written; mean [N] and rstd [N] written when not NULL; weight [C] or NULL (ones);
 *  bias [C] or NULL (zeros). */
CT_API ct_status ct_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                      const float *weight, const float *bias, int64_t N, int64_t C,
                                      float eps);

/** Backward of ct_layernorm_forward from its saved mean[N] and rstd[N] (both required).
 *  dinp [N,C] written; dweight [C] += sum_n dout * xhat and dbias [C] += sum_n dout, with
 *  xhat = (inp - mean) * rstd (each NULL to skip). */
CT_API ct_status ct_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                       const float *inp, const float *weight, const float *mean,
                                       const float *rstd, int64_t N, int64_t C);

/** bf16 ct_layernorm_forward: out, inp, weight, bias bf16; mean and rstd f32. */
CT_API ct_status ct_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd,
                                           const uint16_t *inp, const uint16_t *weight,
                                           const uint16_t *bias, int64_t N, int64_t C, float eps);

/** bf16 ct_layernorm_backward: dinp, dout, inp, weight bf16; dweight, dbias, mean, rstd f32. */
CT_API ct_status ct_layernorm_backward_bf16(uint16_t *dinp, float *dweight, float *dbias,
                                            const uint16_t *dout, const uint16_t *inp,
                                            const uint16_t *weight, const float *mean,
                                            const float *rstd, int64_t N, int64_t C);

/* ---- RoPE -------------------------------------------------------------------------------- */

/** Rotary position embedding, rotate-half convention (Llama / Hugging Face).
 *  inp and out are [B, T, H, E] contiguous (batch, time, heads, head dim); E must be even.
 *  With P = E / 2, the token at time t has position p = positions[t] (positions is int32
 *  [T], shared by the whole batch) or p = t when positions is NULL, and for i < P
 *    inv_freq[i] = 1 / base^(2i / E),  angle = p * inv_freq[i]   (both in f32, as HF does),
 *    out[i]     = x[i] cos(angle) - x[i + P] sin(angle),
 *    out[i + P] = x[i + P] cos(angle) + x[i] sin(angle).
 *  out may alias inp. base > 0 and finite (10000 for Llama 2, 500000 for Llama 3).
 *  Allocates T x E floats of cos/sin tables (CT_ENOMEM possible).
 *  CT_EINVAL: a negative size, odd E, bad base, NULL arrays with elements. */
CT_API ct_status ct_rope_forward(float *out, const float *inp, const int32_t *positions, int64_t B,
                                 int64_t T, int64_t H, int64_t E, float base);

/** Backward of ct_rope_forward: the inverse rotation (angle -> -angle) of dout [B, T, H, E]
 *  into dinp (written; may alias dout). Same arguments and rules as the forward. */
CT_API ct_status ct_rope_backward(float *dinp, const float *dout, const int32_t *positions,
                                  int64_t B, int64_t T, int64_t H, int64_t E, float base);

/** ct_rope_forward with the E / 2 inverse frequencies given (inv_freq[i] replaces
 *  1 / base^(2i / E): scaled RoPE such as Llama 3.1's, see ct_gpt_rope_inv_freq). Each must be
 *  finite; CT_EINVAL names the first that is not. */
CT_API ct_status ct_rope_forward_freqs(float *out, const float *inp, const int32_t *positions,
                                       int64_t B, int64_t T, int64_t H, int64_t E,
                                       const float *inv_freq);

/** Backward of ct_rope_forward_freqs (the inverse rotation); dinp may alias dout. */
CT_API ct_status ct_rope_backward_freqs(float *dinp, const float *dout, const int32_t *positions,
                                        int64_t B, int64_t T, int64_t H, int64_t E,
                                        const float *inv_freq);

#ifdef __cplusplus
}
#endif
#endif
