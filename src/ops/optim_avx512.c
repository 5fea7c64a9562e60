/* AVX-512 AdamW body: optim_x86.h at 16 lanes (bitwise the AVX2 body and the scalar loop). */
#include "simd/simd_avx512.h"

#define CT_OPTIM_TABLE ct_optim_avx512
#include "ops/optim_x86.h"
