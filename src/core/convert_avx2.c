/* AVX2/F16C bulk conversions; bitwise equal to the scalar ones in tensor.c. */
#include "core/convert_kernels.h"
#include "core/internal.h"
#include "ctorch/tensor.h"

#include <immintrin.h>

static void convert_bf16_to_f32_avx2(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
    }
    for (; i < n; i++) dst[i] = ct_bf16_to_f32(src[i]);
}

static void convert_f32_to_bf16_avx2(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    const __m256i bias = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
    const __m256i absmask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
    const __m256i quiet = _mm256_set1_epi32(0x00400000);
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i));
        __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
        __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, lsb));
        r = _mm256_blendv_epi8(r, _mm256_or_si256(u, quiet), isnan);
        r = _mm256_srli_epi32(r, 16);
        __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
        _mm_storeu_si128((__m128i *)(dst + i), _mm_packus_epi32(lo, hi));
    }
    for (; i < n; i++) dst[i] = ct_f32_to_bf16(src[i]);
}

static void convert_f16_to_f32_avx2(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = ct_f16_to_f32(src[i]);
}

static void convert_f32_to_f16_avx2(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = ct_f32_to_f16(src[i]);
}

const ct_convert_kernels ct_convert_avx2 = {convert_bf16_to_f32_avx2, convert_f32_to_bf16_avx2,
                                            convert_f16_to_f32_avx2, convert_f32_to_f16_avx2};
