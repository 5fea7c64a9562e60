/* Scalar RoPE rotation (see rope_kernels.h). */
#include "ops/rope_kernels.h"

static void rotate_rows_scalar(float *out, const float *inp, const float *tab, int64_t r0,
                               int64_t r1, int64_t T, int64_t H, int64_t P, float sign)
{
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = (r / H) % T;
        const float *cs = tab + t * 2 * P, *sn = cs + P;
        const float *x = inp + r * 2 * P;
        float *y = out + r * 2 * P;
        for (int64_t i = 0; i < P; i++) {
            float x1 = x[i], x2 = x[P + i], s = sign * sn[i];
            y[i] = x1 * cs[i] - x2 * s;
            y[P + i] = x2 * cs[i] + x1 * s;
        }
    }
}

const ct_rope_kernels ct_rope_scalar = {rotate_rows_scalar};
