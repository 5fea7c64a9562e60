/* Bulk dtype conversion kernels (private table). Bodies: convert_scalar.c (the bit-exact
 * ct_bf16/f16 helpers of internal.h), convert_avx2.c (AVX2/F16C, the same bits). */
#ifndef CT_CONVERT_KERNELS_H
#define CT_CONVERT_KERNELS_H

#include "core/internal.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ct_convert_kernels {
    void (*bf16_to_f32)(float *dst, const uint16_t *src, size_t n);
    void (*f32_to_bf16)(uint16_t *dst, const float *src, size_t n);
    void (*f16_to_f32)(float *dst, const uint16_t *src, size_t n);
    void (*f32_to_f16)(uint16_t *dst, const float *src, size_t n);
} ct_convert_kernels;

extern const ct_convert_kernels ct_convert_scalar;
#if defined(__x86_64__)
extern const ct_convert_kernels ct_convert_avx2;
#endif
#if defined(__aarch64__)
extern const ct_convert_kernels ct_convert_neon;
extern const ct_convert_kernels ct_convert_sve;
#endif
/* One entry per ct_isa (convert.c). */
extern const ct_convert_kernels *const ct_convert_tables[CT_ISA_COUNT];

#endif
