/* Scalar bulk conversions (see convert_kernels.h). */
#include "core/convert_kernels.h"
#include "ctorch/tensor.h"

static void bf16_to_f32_scalar(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = ct_bf16_to_f32(src[i]);
}
static void f32_to_bf16_scalar(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = ct_f32_to_bf16(src[i]);
}
static void f16_to_f32_scalar(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = ct_f16_to_f32(src[i]);
}
static void f32_to_f16_scalar(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = ct_f32_to_f16(src[i]);
}

const ct_convert_kernels ct_convert_scalar = {bf16_to_f32_scalar, f32_to_bf16_scalar,
                                              f16_to_f32_scalar, f32_to_f16_scalar};
