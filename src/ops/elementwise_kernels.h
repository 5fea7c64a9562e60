/* Activation kernels (private table). Bodies: elementwise_scalar.c (libm erfcf / expf, the
 * reference the SIMD bodies are tested against), elementwise_avx2.c and elementwise_avx512.c
 * (elementwise_x86.h at 8 and 16 lanes, maths of simd/simd_x86.h: the same bits), elementwise_neon.c and elementwise_sve.c (lane for lane the AVX2
 * operations, maths of simd/simd_neon.h and simd/simd_sve.h, so the same bits). kind: CT_GELU_NONE (0), CT_GELU_TANH (1), 2 = SiLU; bf selects bf16
 * arrays (0: f32). elementwise.c calls CT_KERNELS(ct_elementwise_tables). */
#ifndef CT_ELEMENTWISE_KERNELS_H
#define CT_ELEMENTWISE_KERNELS_H

#include "core/internal.h"

#include <stdint.h>

typedef struct ct_elementwise_kernels {
    /* out[0..n) = act(inp[0..n)) */
    void (*act_forward)(int kind, void *out, const void *inp, int64_t n, int bf);
    /* dinp[0..n) = dout * act'(inp) */
    void (*act_backward)(int kind, void *dinp, const void *dout, const void *inp, int64_t n, int bf);
    /* out[0..n) = silu(a) * b */
    void (*swiglu_forward)(void *out, const void *a, const void *b, int64_t n, int bf);
    /* da = dout b silu'(a), db = dout silu(a) */
    void (*swiglu_backward)(void *da, void *db, const void *dout, const void *a, const void *b,
                            int64_t n, int bf);
} ct_elementwise_kernels;

extern const ct_elementwise_kernels ct_elementwise_scalar;
#if defined(__x86_64__)
extern const ct_elementwise_kernels ct_elementwise_avx2;
extern const ct_elementwise_kernels ct_elementwise_avx512; /* bitwise the AVX2 bodies */
#endif
#if defined(__aarch64__)
extern const ct_elementwise_kernels ct_elementwise_neon;
extern const ct_elementwise_kernels ct_elementwise_sve;
#endif
extern const ct_elementwise_kernels *const ct_elementwise_tables[CT_ISA_COUNT];

#endif
