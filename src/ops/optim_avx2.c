/* AVX2 AdamW body: optim_x86.h at 8 lanes (bitwise the scalar loop of src/model/optim.c). */
#include "simd/simd_avx2.h"

#define CT_OPTIM_TABLE ct_optim_avx2
#include "ops/optim_x86.h"
