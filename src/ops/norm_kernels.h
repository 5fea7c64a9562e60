/* RMSNorm and LayerNorm row kernels (private table). Bodies: norm_scalar.c (plain loops,
 * left-to-right f32 sums), norm_avx2.c (AVX2 + FMA, two 8-lane accumulators folded by
 * ct_hsum256), norm_avx512.c (the two accumulators as the halves of one 16-lane one: the same
 * bits), norm_neon.c (lane for lane the AVX2 bodies, ct_hsum_n8), norm_sve.c (vector-
 * length agnostic whilelt loops, one accumulator folded by svaddv). bf selects bf16 arrays (0: f32); statistics and maths are f32 either way.
 * Each row is a pure function of its inputs, so the bits never depend on the row split. */
#ifndef CT_NORM_KERNELS_H
#define CT_NORM_KERNELS_H

#include "core/internal.h"

#include <stdint.h>

typedef struct ct_norm_kernels {
    /* Rows [r0, r1) of the RMSNorm forward: out = inp * rstd (* w); rstd[r] (NULL to skip). */
    void (*rms_forward_rows)(void *out, float *rstd, const void *inp, const void *w, int64_t r0,
                             int64_t r1, int64_t C, float eps, int bf);
    /* Rows [r0, r1) of the RMSNorm backward: dinp written; pw[C] (NULL to skip) += dout * xhat. */
    void (*rms_backward_rows)(void *dinp, float *pw, const void *dout, const void *inp,
                              const void *w, const float *rstd, int64_t r0, int64_t r1, int64_t C,
                              int bf);
    /* Rows [r0, r1) of the LayerNorm forward: out = (inp - mean) * rstd (* w) (+ b);
     * mean[r], rstd[r] stored (each NULL to skip). w, b may be NULL. */
    void (*ln_forward_rows)(void *out, float *mean, float *rstd, const void *inp, const void *w,
                            const void *b, int64_t r0, int64_t r1, int64_t C, float eps, int bf);
    /* Rows [r0, r1) of the LayerNorm backward from the saved mean/rstd: dinp written;
     * pw[C] += dout * xhat and pb[C] += dout (each NULL to skip). */
    void (*ln_backward_rows)(void *dinp, float *pw, float *pb, const void *dout, const void *inp,
                             const void *w, const float *mean, const float *rstd, int64_t r0,
                             int64_t r1, int64_t C, int bf);
} ct_norm_kernels;

extern const ct_norm_kernels ct_norm_scalar;
#if defined(__x86_64__)
extern const ct_norm_kernels ct_norm_avx2;
extern const ct_norm_kernels ct_norm_avx512; /* norm_avx512.c: bitwise the AVX2 bodies */
#endif
#if defined(__aarch64__)
extern const ct_norm_kernels ct_norm_neon; /* norm_neon.c: bitwise the AVX2 bodies */
extern const ct_norm_kernels ct_norm_sve;  /* norm_sve.c: vector-length agnostic */
#endif
extern const ct_norm_kernels *const ct_norm_tables[CT_ISA_COUNT];

#endif
