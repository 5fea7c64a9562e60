/* Bulk dtype conversion kernels (private). The scalar bodies are in tensor.c, the AVX2/F16C
 * bodies in convert_avx2.c; both give the same bits. */
#ifndef CT_CONVERT_KERNELS_H
#define CT_CONVERT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

void ct_convert_bf16_to_f32_avx2(float *dst, const uint16_t *src, size_t n);
void ct_convert_f32_to_bf16_avx2(uint16_t *dst, const float *src, size_t n);
void ct_convert_f16_to_f32_avx2(float *dst, const uint16_t *src, size_t n);
void ct_convert_f32_to_f16_avx2(uint16_t *dst, const float *src, size_t n);

#endif
