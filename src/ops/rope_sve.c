/* SVE RoPE rotation (see rope_kernels.h): vector-length agnostic, one predicated loop per row
 * half (svwhilelt covers the tail, so there is no scalar one); multiplies and adds kept
 * separate (svmul/svsub/svadd, never svmla) so the bits equal the scalar body's at every
 * vector length. */
#include "ops/rope_kernels.h"

#include <arm_sve.h>

static void rotate_rows_sve(float *out, const float *inp, const float *tab, int64_t r0,
                            int64_t r1, int64_t T, int64_t H, int64_t P, float sign)
{
    const int64_t vl = (int64_t)svcntw();
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = (r / H) % T;
        const float *cs = tab + t * 2 * P, *sn = cs + P;
        const float *x = inp + r * 2 * P;
        float *y = out + r * 2 * P;
        for (int64_t i = 0; i < P; i += vl) {
            svbool_t pg = svwhilelt_b32_s64(i, P);
            svfloat32_t x1 = svld1_f32(pg, x + i), x2 = svld1_f32(pg, x + P + i);
            svfloat32_t c = svld1_f32(pg, cs + i);
            svfloat32_t s = svmul_n_f32_x(pg, svld1_f32(pg, sn + i), sign);
            svfloat32_t y1 = svsub_f32_x(pg, svmul_f32_x(pg, x1, c), svmul_f32_x(pg, x2, s));
            svfloat32_t y2 = svadd_f32_x(pg, svmul_f32_x(pg, x2, c), svmul_f32_x(pg, x1, s));
            svst1_f32(pg, y + i, y1);
            svst1_f32(pg, y + P + i, y2);
        }
    }
}

const ct_rope_kernels ct_rope_sve = {rotate_rows_sve};
