/* AVX2 RoPE rotation (see rope_kernels.h): 8 pairs per step, the scalar tail of rope_scalar.c
 * for P % 8; multiplies and adds kept separate so the bits equal the scalar body's. */
#include "ops/rope_kernels.h"

#include <immintrin.h>

static void rotate_rows_avx2(float *out, const float *inp, const float *tab, int64_t r0,
                             int64_t r1, int64_t T, int64_t H, int64_t P, float sign)
{
    const __m256 sg = _mm256_set1_ps(sign);
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = (r / H) % T;
        const float *cs = tab + t * 2 * P, *sn = cs + P;
        const float *x = inp + r * 2 * P;
        float *y = out + r * 2 * P;
        int64_t i = 0;
        for (; i + 8 <= P; i += 8) {
            __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + P + i);
            __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_mul_ps(sg, _mm256_loadu_ps(sn + i));
            _mm256_storeu_ps(y + i, _mm256_sub_ps(_mm256_mul_ps(x1, c), _mm256_mul_ps(x2, s)));
            _mm256_storeu_ps(y + P + i, _mm256_add_ps(_mm256_mul_ps(x2, c), _mm256_mul_ps(x1, s)));
        }
        for (; i < P; i++) {
            float x1 = x[i], x2 = x[P + i], s = sign * sn[i];
            y[i] = x1 * cs[i] - x2 * s;
            y[P + i] = x2 * cs[i] + x1 * s;
        }
    }
}

const ct_rope_kernels ct_rope_avx2 = {rotate_rows_avx2};
