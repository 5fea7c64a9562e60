/* AVX2 + FMA activation bodies: elementwise_x86.h at 8 lanes (maths of simd/simd_avx2.h). */
#include "simd/simd_avx2.h"

#define CT_EW_TABLE ct_elementwise_avx2
#include "ops/elementwise_x86.h"
