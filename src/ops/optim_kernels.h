/* Optimizer update kernels (private table). The scalar body lives in src/model/optim.c (that
 * file alone is compiled with -fno-math-errno, so its loop vectorises at the baseline width:
 * SSE2 on x86-64, Advanced SIMD on AArch64); optim_avx2.c and optim_avx512.c hold the same
 * update at 8 and 16 lanes (optim_x86.h). Every element goes through the scalar loop's IEEE
 * operations in the scalar loop's order (mul, add, sqrt and div are correctly rounded; no FMA
 * contraction), so every body, any width, any split, gives the scalar loop's bits. */
#ifndef CT_OPTIM_KERNELS_H
#define CT_OPTIM_KERNELS_H

#include "core/internal.h"

#include <stdint.h>

/* AdamW's per-step constants, as f32 (computed once per step in ct_adamw_step). */
typedef struct ct_adamw_consts {
    float decay;     /* 1 - lr * weight_decay */
    float b1, one_b1; /* beta1, 1 - beta1 */
    float b2, one_b2; /* beta2, 1 - beta2 */
    float step_size; /* lr / (1 - beta1^step) */
    float bc2_sqrt;  /* sqrt(1 - beta2^step) */
    float eps;
} ct_adamw_consts;

typedef struct ct_optim_kernels {
    /* Elements [0, n) of one AdamW step, torch.optim.AdamW's order of operations:
     *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;
     *   p = p decay - step_size m / (sqrt(v) / bc2_sqrt + eps).
     * p, g, m and v are distinct arrays. */
    void (*adamw)(float *p, const float *g, float *m, float *v, int64_t n,
                  const ct_adamw_consts *k);
} ct_optim_kernels;

extern const ct_optim_kernels ct_optim_scalar;
#if defined(__x86_64__)
extern const ct_optim_kernels ct_optim_avx2;
extern const ct_optim_kernels ct_optim_avx512; /* optim_avx512.c: bitwise the scalar loop */
#endif
extern const ct_optim_kernels *const ct_optim_tables[CT_ISA_COUNT];

#endif
