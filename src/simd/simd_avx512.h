/* AVX-512 (F + BW + DQ + VL) vector maths shared by every *_avx512.c kernel file (include
 * only from files compiled with the AVX-512 flags of CMakeLists.txt): simd_x86.h's maths at
 * 16 lanes, lane for lane the AVX2 functions (so element-wise results are bitwise AVX2's),
 * and the halves a body needs to keep the AVX2 bodies' 8-lane summation order. */
#ifndef CT_SIMD_AVX512_H
#define CT_SIMD_AVX512_H

#define CT_SIMD_LANES 16
#include "simd/simd_x86.h"

/* Lanes 0-7 and 8-15 of v. */
CT_SIMD_INLINE __m256 cv_lo8(__m512 v) { return _mm512_castps512_ps256(v); }
CT_SIMD_INLINE __m256 cv_hi8(__m512 v) { return _mm512_extractf32x8_ps(v, 1); }

/* acc += the low 8 lanes of v, then the high 8: the AVX2 bodies' sum over two consecutive
 * 8-element blocks, bit for bit. */
CT_SIMD_INLINE __m256 cv_acc8(__m256 acc, __m512 v)
{
    return _mm256_add_ps(_mm256_add_ps(acc, cv_lo8(v)), cv_hi8(v));
}

#endif
