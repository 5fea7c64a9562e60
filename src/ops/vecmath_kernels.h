/* Row primitives (softmax / cross-entropy / attention rows): the private kernel table.
 * Bodies: vecmath_scalar.c (libm expf, the reference order), vecmath_avx2.c (8-lane
 * accumulators folded by ct_hsum256, exp = ct_exp256, relative error < 2e-7), vecmath_avx512.c
 * (16-lane exp and element passes, the AVX2 summation order: the same bits). The entry
 * points of vecmath.h index ct_vec_tables by the active instruction set. */
#ifndef CT_OPS_VECMATH_KERNELS_H
#define CT_OPS_VECMATH_KERNELS_H

#include "core/internal.h"

#include <stdint.h>

typedef struct ct_vec_kernels {
    float (*vmax)(const float *x, int64_t n);
    float (*vexpsum)(float *out, const float *x, float m, int64_t n);
    float (*vsum)(const float *x, int64_t n);
    float (*vdot)(const float *a, const float *b, int64_t n);
    void (*vaxpy)(float *y, float a, const float *x, int64_t n);
    void (*vscale)(float *x, float a, int64_t n);
} ct_vec_kernels;

extern const ct_vec_kernels ct_vec_scalar;
#if defined(__x86_64__)
extern const ct_vec_kernels ct_vec_avx2;
extern const ct_vec_kernels ct_vec_avx512; /* vecmath_avx512.c: bitwise the AVX2 body */
#endif
#if defined(__aarch64__)
extern const ct_vec_kernels ct_vec_neon; /* vecmath_neon.c: bitwise the AVX2 body */
extern const ct_vec_kernels ct_vec_sve;  /* vecmath_sve.c: vector-length agnostic */
#endif
/* One entry per ct_isa (vecmath.c). */
extern const ct_vec_kernels *const ct_vec_tables[CT_ISA_COUNT];

#endif
