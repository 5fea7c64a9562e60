/* Bulk dtype conversions (ctorch/tensor.h) over the per-ISA kernel tables. */
#include "core/convert_kernels.h"
#include "ctorch/tensor.h"

#if defined(__x86_64__)
#define CONV_AVX2 &ct_convert_avx2
#else
#define CONV_AVX2 &ct_convert_scalar
#endif

#if defined(__aarch64__)
#define CONV_NEON &ct_convert_neon
#define CONV_SVE &ct_convert_sve
#else
#define CONV_NEON &ct_convert_scalar
#define CONV_SVE &ct_convert_scalar
#endif

/* Memory bound: AVX-512 would not pay over AVX2. */
const ct_convert_kernels *const ct_convert_tables[CT_ISA_COUNT] = {
    [CT_ISA_SCALAR] = &ct_convert_scalar, [CT_ISA_AVX2] = CONV_AVX2, [CT_ISA_AVX512] = CONV_AVX2,
    [CT_ISA_NEON] = CONV_NEON,            [CT_ISA_SVE] = CONV_SVE,
};

void ct_convert_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    CT_KERNELS(ct_convert_tables)->bf16_to_f32(dst, src, n);
}
void ct_convert_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    CT_KERNELS(ct_convert_tables)->f32_to_bf16(dst, src, n);
}
void ct_convert_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    CT_KERNELS(ct_convert_tables)->f16_to_f32(dst, src, n);
}
void ct_convert_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    CT_KERNELS(ct_convert_tables)->f32_to_f16(dst, src, n);
}
