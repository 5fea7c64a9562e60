/* AArch64 Advanced SIMD bulk conversions; bitwise equal to the scalar ones in tensor.c
 * (bf16 by the rounding of simd/simd_neon.h, f16 by FCVTL / FCVTN, round to nearest even). */
#include "core/convert_kernels.h"
#include "core/internal.h"
#include "ctorch/tensor.h"
#include "simd/simd_neon.h"

static void convert_bf16_to_f32_neon(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8_t h = vld1q_u16(src + i);
        vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
        vst1q_f32(dst + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
    }
    for (; i < n; i++) dst[i] = ct_bf16_to_f32(src[i]);
}

static void convert_f32_to_bf16_neon(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(dst + i, ct_to_bf16_n4(vld1q_f32(src + i)));
    for (; i < n; i++) dst[i] = ct_f32_to_bf16(src[i]);
}

static void convert_f16_to_f32_neon(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + i))));
    for (; i < n; i++) dst[i] = ct_f16_to_f32(src[i]);
}

static void convert_f32_to_f16_neon(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
    for (; i < n; i++) dst[i] = ct_f32_to_f16(src[i]);
}

const ct_convert_kernels ct_convert_neon = {convert_bf16_to_f32_neon, convert_f32_to_bf16_neon,
                                            convert_f16_to_f32_neon, convert_f32_to_f16_neon};
