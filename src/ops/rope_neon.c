/* NEON RoPE rotation (see rope_kernels.h): 4 pairs per step, the scalar tail for P % 4;
 * multiplies and adds kept separate (vmulq/vsubq/vaddq, never vfmaq) so the bits equal the
 * scalar and AVX2 bodies'. */
#include "ops/rope_kernels.h"

#include <arm_neon.h>

static void rotate_rows_neon(float *out, const float *inp, const float *tab, int64_t r0,
                             int64_t r1, int64_t T, int64_t H, int64_t P, float sign)
{
    const float32x4_t sg = vdupq_n_f32(sign);
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = (r / H) % T;
        const float *cs = tab + t * 2 * P, *sn = cs + P;
        const float *x = inp + r * 2 * P;
        float *y = out + r * 2 * P;
        int64_t i = 0;
        for (; i + 4 <= P; i += 4) {
            float32x4_t x1 = vld1q_f32(x + i), x2 = vld1q_f32(x + P + i);
            float32x4_t c = vld1q_f32(cs + i), s = vmulq_f32(sg, vld1q_f32(sn + i));
            vst1q_f32(y + i, vsubq_f32(vmulq_f32(x1, c), vmulq_f32(x2, s)));
            vst1q_f32(y + P + i, vaddq_f32(vmulq_f32(x2, c), vmulq_f32(x1, s)));
        }
        for (; i < P; i++) {
            float x1 = x[i], x2 = x[P + i], s = sign * sn[i];
            y[i] = x1 * cs[i] - x2 * s;
            y[P + i] = x2 * cs[i] + x1 * s;
        }
    }
}

const ct_rope_kernels ct_rope_neon = {rotate_rows_neon};
