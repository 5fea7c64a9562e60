/* Row primitives: entry points of vecmath.h over the per-ISA kernel tables. */
#include "ops/vecmath.h"
#include "ops/vecmath_kernels.h"

#if defined(__x86_64__)
#define VEC_AVX2 &ct_vec_avx2
#define VEC_AVX512 &ct_vec_avx512
#else
#define VEC_AVX2 &ct_vec_scalar
#define VEC_AVX512 &ct_vec_scalar
#endif

#if defined(__aarch64__)
#define VEC_NEON &ct_vec_neon
#define VEC_SVE &ct_vec_sve
#else
#define VEC_NEON &ct_vec_scalar
#define VEC_SVE &ct_vec_scalar
#endif

const ct_vec_kernels *const ct_vec_tables[CT_ISA_COUNT] = {
    [CT_ISA_SCALAR] = &ct_vec_scalar, [CT_ISA_AVX2] = VEC_AVX2, [CT_ISA_AVX512] = VEC_AVX512,
    [CT_ISA_NEON] = VEC_NEON,         [CT_ISA_SVE] = VEC_SVE,
};

float ct_vmax(const float *x, int64_t n) { return CT_KERNELS(ct_vec_tables)->vmax(x, n); }
float ct_vexpsum(float *out, const float *x, float m, int64_t n)
{
    return CT_KERNELS(ct_vec_tables)->vexpsum(out, x, m, n);
}
float ct_vsum(const float *x, int64_t n) { return CT_KERNELS(ct_vec_tables)->vsum(x, n); }
float ct_vdot(const float *a, const float *b, int64_t n) { return CT_KERNELS(ct_vec_tables)->vdot(a, b, n); }
void ct_vaxpy(float *y, float a, const float *x, int64_t n) { CT_KERNELS(ct_vec_tables)->vaxpy(y, a, x, n); }
void ct_vscale(float *x, float a, int64_t n) { CT_KERNELS(ct_vec_tables)->vscale(x, a, n); }
