/* RoPE rotation kernels (private table). Bodies: rope_scalar.c, rope_avx2.c, rope_neon.c,
 * rope_sve.c. All compute
 * y1 = x1 c - x2 s, y2 = x2 c + x1 s with separate multiplies and adds (no FMA: the build
 * is ISO C, so the compiler does not contract either; the vector bodies use no fused
 * multiply-add), hence the same bits on every ISA. */
#ifndef CT_ROPE_KERNELS_H
#define CT_ROPE_KERNELS_H

#include "core/internal.h"

#include <stdint.h>

typedef struct ct_rope_kernels {
    /* Rows [r0, r1) of [rows, 2P]: row r uses table row t = (r / H) % T of tab [T, 2P]
     * (cos in the first P, sin in the second); sign -1 rotates backwards. out may be inp. */
    void (*rotate_rows)(float *out, const float *inp, const float *tab, int64_t r0, int64_t r1,
                        int64_t T, int64_t H, int64_t P, float sign);
} ct_rope_kernels;

extern const ct_rope_kernels ct_rope_scalar;
#if defined(__x86_64__)
extern const ct_rope_kernels ct_rope_avx2;
#endif
#if defined(__aarch64__)
extern const ct_rope_kernels ct_rope_neon;
extern const ct_rope_kernels ct_rope_sve;
#endif
extern const ct_rope_kernels *const ct_rope_tables[CT_ISA_COUNT];

#endif
