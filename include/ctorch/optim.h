/*
 * ctorch/optim.h - what a training step does after the backward: gradient norm and clipping,
 * the AdamW update, and the warmup + cosine learning-rate schedule.
 *
 * All work on flat f32 arrays (a model keeps its parameters, gradients and optimizer moments
 * each in one allocation, so one call covers a whole model or a contiguous group of it).
 * Results are the same bits for any thread count: the update is element-wise, and the norm
 * sums fixed blocks of 16384 squares in double, the block sums then added in block order.
 */
#ifndef CTORCH_OPTIM_H
#define CTORCH_OPTIM_H

#include "ctorch/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Hyper-parameters of AdamW (torch.optim.AdamW; decoupled weight decay, bias correction). */
typedef struct ct_adamw_options {
    float lr;           /**< learning rate of this step; default 1e-3 */
    float beta1, beta2; /**< moment decay rates in [0, 1); default 0.9, 0.95 */
    float eps;          /**< > 0; default 1e-8 */
    float weight_decay; /**< >= 0; default 0.1 (lr * weight_decay is taken off each weight) */
} ct_adamw_options;

/** The defaults listed above. */
CT_API ct_adamw_options ct_adamw_options_default(void);

/** One AdamW step over n parameters, as torch.optim.AdamW does (t = step, 1-based):
 *    p = p * (1 - lr * wd);  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
 *    p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
 *  param, m, v [n] are updated in place; grad [n] is read. m and v start at zero. The four
 *  arrays must not overlap.
 *  CT_EINVAL: n < 0, step < 1, NULL arrays with n > 0, options out of range. */
CT_API ct_status ct_adamw_step(float *param, const float *grad, float *m, float *v, int64_t n,
                               int64_t step, const ct_adamw_options *opt);

/** *norm = sqrt(sum_i g[i]^2) over n >= 0 values, accumulated in double (deterministic, see
 *  the top of this header). Allocates a double per 16384 values (CT_ENOMEM possible). */
CT_API ct_status ct_grad_norm(const float *g, int64_t n, double *norm);

/** Clip by global norm (torch.nn.utils.clip_grad_norm_): with N = ct_grad_norm(g), when
 *  max_norm > 0 and N > max_norm every g[i] is multiplied by max_norm / (N + 1e-6).
 *  max_norm <= 0 only measures. *norm (may be NULL) receives N, before clipping. */
CT_API ct_status ct_clip_grad_norm(float *g, int64_t n, float max_norm, double *norm);

/** Learning rate of optimizer step `step` (0-based) of `total`: a linear warmup
 *  lr_max * (step + 1) / warmup for step < warmup, then a cosine from lr_max down to lr_min
 *  reached at step total - 1 (and kept after). warmup >= 0, total >= 1. */
CT_API float ct_lr_cosine(int64_t step, int64_t warmup, int64_t total, float lr_max, float lr_min);

#ifdef __cplusplus
}
#endif
#endif
