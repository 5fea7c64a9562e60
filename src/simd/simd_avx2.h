/* AVX2 + FMA vector maths shared by every *_avx2.c kernel file (include only from files
 * compiled with -mavx2 -mfma -mf16c). The maths is simd_x86.h's at 8 lanes (the AVX-512
 * files get the same functions at 16 lanes from simd_avx512.h); the 8-lane names below
 * are what the AVX2 bodies call. */
#ifndef CT_SIMD_AVX2_H
#define CT_SIMD_AVX2_H

#define CT_SIMD_LANES 8
#include "simd/simd_x86.h"

/* 8 values at index i of an f32 (bf = 0) or bf16 (bf = 1) array, as f32; stores round to
 * bf16 to nearest even (NaN stays a quiet NaN), bitwise as ct_f32_to_bf16. */
CT_SIMD_INLINE __m256 ct_ld8(const void *p, int64_t i, int bf) { return cv_ld(p, i, bf); }
CT_SIMD_INLINE void ct_st8(void *p, int64_t i, __m256 v, int bf) { cv_st(p, i, v, bf); }
/* The first k (< 8) elements at index i, zero-padded to a vector. */
CT_SIMD_INLINE __m256 ct_ld8_part(const void *p, int64_t i, int64_t k, int bf)
{
    return cv_ld_part(p, i, k, bf);
}
CT_SIMD_INLINE void ct_st8_part(void *p, int64_t i, int64_t k, __m256 v, int bf)
{
    cv_st_part(p, i, k, v, bf);
}

/* exp (at most 2 ulp), tanh, sigmoid, erfc for z >= 0: see simd_x86.h. */
CT_SIMD_INLINE __m256 ct_exp256(__m256 x) { return cv_exp(x); }
CT_SIMD_INLINE __m256 ct_tanh256(__m256 y) { return cv_tanh(y); }
CT_SIMD_INLINE __m256 ct_sigmoid256(__m256 x) { return cv_sigmoid(x); }
CT_SIMD_INLINE __m256 ct_erfc_pos256(__m256 z) { return cv_erfc_pos(z); }

#endif
