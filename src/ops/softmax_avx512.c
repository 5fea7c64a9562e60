/* AVX-512 softmax-family row bodies: softmax_x86.h at 16 lanes over ct_vec_avx512, bitwise
 * the AVX2 bodies. */
#include "simd/simd_avx512.h"

#define CT_SM_TABLE ct_softmax_avx512
#define CT_SM_VEC ct_vec_avx512
#include "ops/softmax_x86.h"
