/*
 * ctorch/loss.h - cross-entropy on logits, and the fused linear + cross-entropy.
 *
 * Semantics are those of torch.nn.functional.cross_entropy (PyTorch 1.13 .. 2.13), with two
 * additions users of large vocabularies ask for:
 *   z_loss   (PaLM):    z_n = s * lse_n^2 added to each non-ignored row's loss;
 *   softcap  (Gemma 2): logits x -> cap * tanh(x / cap) before everything else.
 * Per non-ignored row n with logits z (after softcap), p = softmax(z), lse = logsumexp(z),
 * class weights w (all 1 when none are given), W = sum_c w_c, y = target, eps = smoothing:
 *   loss_n = (1 - eps) * w_y * (lse - z_y) + (eps / V) * (W * lse - sum_c w_c z_c) + s * lse^2
 * Ignored rows (target == ignore_index) contribute 0 and get zero gradient.
 * reduction MEAN divides the sum by the number of non-ignored rows, or by sum_n w_{y_n} when
 * class weights are given (PyTorch's weighted mean; the z term shares that denominator);
 * when every row is ignored, MEAN gives NaN as PyTorch does. SUM adds; NONE returns [N].
 * A target outside [0, V) that is not ignore_index is CT_EINVAL naming the row and value.
 */
#ifndef CTORCH_LOSS_H
#define CTORCH_LOSS_H

#include "ctorch/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ct_reduction {
    CT_REDUCTION_NONE = 0,
    CT_REDUCTION_MEAN = 1,
    CT_REDUCTION_SUM = 2,
} ct_reduction;

/** Options shared by ct_cross_entropy_* and ct_linear_cross_entropy_*. */
typedef struct ct_ce_options {
    int64_t ignore_index;      /**< default -100 */
    ct_reduction reduction;    /**< default CT_REDUCTION_MEAN */
    float label_smoothing;     /**< in [0, 1]; default 0 */
    const float *class_weight; /**< [V] f32, or NULL (default) for none */
    float z_loss;              /**< PaLM z-loss scale s >= 0; default 0 (off) */
    float softcap;             /**< > 0 applies cap * tanh(x / cap); 0 (default) = off */
    size_t scratch_bytes;      /**< fused loss only: budget for logit tiles; default 64 MiB */
} ct_ce_options;

/** The defaults listed above. */
CT_API ct_ce_options ct_ce_options_default(void);

/** Outputs of a forward pass. loss and z_loss point to 1 float for MEAN/SUM or N floats
 *  for NONE (z_loss may be NULL; it is the z term alone, already included in loss).
 *  lse (N floats, may be NULL) receives each row's logsumexp of the (soft-capped) logits:
 *  the O(N) state the backward needs. */
typedef struct ct_ce_outputs {
    float *loss;
    float *z_loss;
    float *lse;
} ct_ce_outputs;

/* ---- on materialised logits (the unfused reference) ------------------------------------- */

/** Cross-entropy of logits[N, V] (f32) against target[N] (target_dtype CT_DTYPE_I64 or
 *  CT_DTYPE_I32). Writes out->loss (required), out->z_loss and out->lse (optional). */
CT_API ct_status ct_cross_entropy_forward(const ct_ce_outputs *out, const float *logits,
                                          const void *target, ct_dtype target_dtype, int64_t N,
                                          int64_t V, const ct_ce_options *opt);

/** Gradient of the loss w.r.t. logits: dlogits[N, V] is written. dloss is the upstream
 *  gradient: 1 float for MEAN/SUM, N floats for NONE. */
CT_API ct_status ct_cross_entropy_backward(float *dlogits, const float *dloss, const float *logits,
                                           const void *target, ct_dtype target_dtype, int64_t N,
                                           int64_t V, const ct_ce_options *opt);

/* ---- fused linear + cross-entropy --------------------------------------------------------- */

/** Operands of loss = cross_entropy(h W^T + b, y).
 *  h [N, D] and W [V, D] are both f32 or both bf16 (`dtype`); bias [V] f32 or NULL;
 *  target [N] int64 or int32. Nothing of size N x V or V x D is ever allocated: logits
 *  are computed in tiles that fit opt->scratch_bytes. */
typedef struct ct_lce_inputs {
    const void *h;
    const void *weight;
    const float *bias;
    ct_dtype dtype;
    const void *target;
    ct_dtype target_dtype;
    int64_t N, D, V;
} ct_lce_inputs;

/** Gradients (f32, accumulated in f32). Any pointer may be NULL to skip it. dh [N, D],
 *  dweight [V, D], dbias [V]. With accumulate the gradients are ADDED to the buffers
 *  (weight tying: pass the embedding's gradient as dweight); otherwise overwritten. */
typedef struct ct_lce_grads {
    float *dh;
    float *dweight;
    float *dbias;
    bool accumulate;
} ct_lce_grads;

/** The scratch budget (ct_ce_options.scratch_bytes) with which the fused loss takes token
 *  blocks of `rows` full-vocabulary rows (three GEMMs a step, the [V, D] weight gradient
 *  crossed once per block) for h and W of `dtype` (f32 or bf16): the rows' logits, their row
 *  state, h widened for bf16, and the GEMMs' own panels. The loss allocates only what a call
 *  needs (N < rows takes N rows), so a budget sized for more rows than N costs nothing more.
 *  0 when rows, D or V is not positive or dtype is neither, or the size overflows. */
CT_API size_t ct_lce_scratch_bytes_for_rows(int64_t rows, int64_t D, int64_t V, ct_dtype dtype);

/** Forward only: loss (and z_loss, lse) as in ct_ce_outputs. Keep lse for the backward. */
CT_API ct_status ct_linear_cross_entropy_forward(const ct_ce_outputs *out, const ct_lce_inputs *in,
                                                 const ct_ce_options *opt);

/** Backward from the forward's lse: recomputes logits tile by tile. dloss is 1 float for
 *  MEAN/SUM or N floats for NONE (the upstream gradient, any values). The gradients are the
 *  same bits as ct_linear_cross_entropy_forward_backward's: when opt->scratch_bytes holds a
 *  tile of full-vocabulary rows, each row's statistics are recomputed with its logits (as the
 *  forward computed them, so lse must be the forward's); with vocabulary tiles lse is used. */
CT_API ct_status ct_linear_cross_entropy_backward(const ct_lce_grads *grads, const float *dloss,
                                                  const float *lse, const ct_lce_inputs *in,
                                                  const ct_ce_options *opt);

/** Training fast path: loss and gradients in one pass over the vocabulary (three GEMMs when
 *  opt->scratch_bytes holds a tile of full-vocabulary rows, four otherwise). dloss as in the
 *  backward; NULL means 1 (for MEAN/SUM) or all ones (for NONE). */
CT_API ct_status ct_linear_cross_entropy_forward_backward(const ct_ce_outputs *out,
                                                          const ct_lce_grads *grads,
                                                          const float *dloss,
                                                          const ct_lce_inputs *in,
                                                          const ct_ce_options *opt);

#ifdef __cplusplus
}
#endif
#endif
