/* Softmax-family row kernels (private table): softmax, log_softmax, logsumexp and the two
 * backwards over rows [r0, r1) of a row-major [N, C] f32 array (C >= 1). The row
 * reductions (max, sum of exp, sum, dot) are the vecmath primitives of vecmath_kernels.h;
 * the bodies add the per-element passes. Bodies: softmax_scalar.c (ct_softmax_scalar over
 * ct_vec_scalar; ct_softmax_portable, the same C over the active vecmath table, for the
 * instruction sets without softmax bodies of their own), softmax_avx2.c and softmax_avx512.c
 * (softmax_x86.h at 8 and 16 lanes over ct_vec_avx2 / ct_vec_avx512: the same bits). Each row is a pure function of its inputs. */
#ifndef CT_OPS_SOFTMAX_KERNELS_H
#define CT_OPS_SOFTMAX_KERNELS_H

#include "core/internal.h"

#include <stdint.h>

typedef struct ct_softmax_kernels {
    /* out = exp(x - max) / sum; a row of all -inf gives NaN (as PyTorch). out may be inp. */
    void (*softmax_rows)(float *out, const float *inp, int64_t r0, int64_t r1, int64_t C);
    /* out = x - logsumexp(x) (-inf rows: x + inf). */
    void (*log_softmax_rows)(float *out, const float *inp, int64_t r0, int64_t r1, int64_t C);
    /* lse[r] = max + log(sum exp(x - max)); -inf for a row of all -inf. */
    void (*logsumexp_rows)(float *lse, const float *inp, int64_t r0, int64_t r1, int64_t C);
    /* dinp = out * (dout - sum(dout * out)) */
    void (*softmax_backward_rows)(float *dinp, const float *dout, const float *out, int64_t r0,
                                  int64_t r1, int64_t C);
    /* dinp = dout - exp(out) * sum(dout) (out: the log_softmax output) */
    void (*log_softmax_backward_rows)(float *dinp, const float *dout, const float *out,
                                      int64_t r0, int64_t r1, int64_t C);
} ct_softmax_kernels;

extern const ct_softmax_kernels ct_softmax_scalar;
extern const ct_softmax_kernels ct_softmax_portable;
#if defined(__x86_64__)
extern const ct_softmax_kernels ct_softmax_avx2;
extern const ct_softmax_kernels ct_softmax_avx512; /* bitwise the AVX2 bodies */
#endif
#if defined(__aarch64__)
extern const ct_softmax_kernels ct_softmax_neon; /* softmax_neon.c: bitwise the AVX2 bodies */
extern const ct_softmax_kernels ct_softmax_sve;  /* softmax_sve.c: vector-length agnostic */
#endif
/* One entry per ct_isa (softmax.c). */
extern const ct_softmax_kernels *const ct_softmax_tables[CT_ISA_COUNT];

#endif
