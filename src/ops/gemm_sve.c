/* ctorch's GEMM: the SVE micro-kernel, vector-length agnostic. The tile is 8 x 16 at every
 * vector length (the packing and blocking do not depend on it); each k step covers the 16
 * columns in chunks of svcntw() lanes under a whilelt predicate (4 chunks at 128 bits, 2 at
 * 256, one partly active vector at 512 and above), eight accumulators per chunk, one
 * broadcast A value per row (svmla_n). Contract in gemm_kernels.h: one FMA chain per C
 * element in ascending k, so the bits equal the AVX2, AVX-512 and NEON kernels' at every
 * vector length. */
#include "ops/gemm_kernels.h"

#include <arm_sve.h>
#include <math.h>

#define MR 8
#define NR 16

static void kernel_8x16(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc, int m, int n,
                        float alpha, float beta)
{
    int b0 = beta == 0.0f;
    const int64_t vl = (int64_t)svcntw();
    for (int64_t j0 = 0; j0 < n; j0 += vl) {
        svbool_t pg = svwhilelt_b32_s64(j0, NR);
        svfloat32_t c0 = svdup_n_f32(0.0f), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
        const float *a = ap, *b = bp + j0;
        for (int64_t k = 0; k < kc; k++) {
            svfloat32_t bv = svld1_f32(pg, b);
            c0 = svmla_n_f32_x(pg, c0, bv, a[0]);
            c1 = svmla_n_f32_x(pg, c1, bv, a[1]);
            c2 = svmla_n_f32_x(pg, c2, bv, a[2]);
            c3 = svmla_n_f32_x(pg, c3, bv, a[3]);
            c4 = svmla_n_f32_x(pg, c4, bv, a[4]);
            c5 = svmla_n_f32_x(pg, c5, bv, a[5]);
            c6 = svmla_n_f32_x(pg, c6, bv, a[6]);
            c7 = svmla_n_f32_x(pg, c7, bv, a[7]);
            a += MR;
            b += NR;
        }
        /* the columns of this chunk that exist in C */
        svbool_t pc = svwhilelt_b32_s64(j0, (int64_t)n);
        float *p = c + j0;
#define ROW(i, acc)                                                                                   \
    if (i < m) {                                                                                      \
        float *q = p + (i) * ldc;                                                                     \
        svst1_f32(pc, q,                                                                              \
                  b0 ? svmul_n_f32_x(pc, acc, alpha)                                                 \
                     : svmla_n_f32_x(pc, svmul_n_f32_x(pc, svld1_f32(pc, q), beta), acc, alpha));   \
    }
        ROW(0, c0) ROW(1, c1) ROW(2, c2) ROW(3, c3) ROW(4, c4) ROW(5, c5) ROW(6, c6) ROW(7, c7)
#undef ROW
    }
}

const ct_gemm_kernels ct_gemm_sve = {
    .name = "sve 8x16 (vector-length agnostic)",
    .mr = MR,
    .nr = NR,
    .mc = 128,
    .nc = 3072,
    .kernel = kernel_8x16,
    .pack_a = ct_gemm_pack_a_generic,
    .pack_b = ct_gemm_pack_b_generic,
};
