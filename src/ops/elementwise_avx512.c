/* AVX-512 activation bodies: elementwise_x86.h at 16 lanes (maths of simd/simd_avx512.h),
 * bitwise the AVX2 bodies. */
#include "simd/simd_avx512.h"

#define CT_EW_TABLE ct_elementwise_avx512
#include "ops/elementwise_x86.h"
