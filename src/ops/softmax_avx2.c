/* AVX2 + FMA softmax-family row bodies: softmax_x86.h at 8 lanes over ct_vec_avx2. */
#include "simd/simd_avx2.h"

#define CT_SM_TABLE ct_softmax_avx2
#define CT_SM_VEC ct_vec_avx2
#include "ops/softmax_x86.h"
