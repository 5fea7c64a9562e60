/* SVE bulk conversions, vector-length agnostic (whilelt-predicated loops); bitwise equal to
 * the scalar ones in tensor.c (bf16 by the rounding of simd/simd_sve.h, f16 by FCVT, round to
 * nearest even, the 16-bit values in the low half of each 32-bit lane). */
#include "core/convert_kernels.h"
#include "core/internal.h"
#include "ctorch/tensor.h"
#include "simd/simd_sve.h"

static void convert_bf16_to_f32_sve(float *dst, const uint16_t *src, size_t n)
{
    for (int64_t i = 0; i < (int64_t)n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, (int64_t)n);
        svst1_f32(pg, dst + i, ct_ld_sv(pg, src, i, 1));
    }
}

static void convert_f32_to_bf16_sve(uint16_t *dst, const float *src, size_t n)
{
    for (int64_t i = 0; i < (int64_t)n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, (int64_t)n);
        ct_st_sv(pg, dst, i, svld1_f32(pg, src + i), 1);
    }
}

static void convert_f16_to_f32_sve(float *dst, const uint16_t *src, size_t n)
{
    for (int64_t i = 0; i < (int64_t)n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, (int64_t)n);
        svfloat16_t h = svreinterpret_f16_u32(svld1uh_u32(pg, src + i));
        svst1_f32(pg, dst + i, svcvt_f32_f16_x(pg, h));
    }
}

static void convert_f32_to_f16_sve(uint16_t *dst, const float *src, size_t n)
{
    for (int64_t i = 0; i < (int64_t)n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, (int64_t)n);
        svfloat16_t h = svcvt_f16_f32_x(pg, svld1_f32(pg, src + i));
        svst1h_u32(pg, dst + i, svreinterpret_u32_f16(h));
    }
}

const ct_convert_kernels ct_convert_sve = {convert_bf16_to_f32_sve, convert_f32_to_bf16_sve,
                                           convert_f16_to_f32_sve, convert_f32_to_f16_sve};
