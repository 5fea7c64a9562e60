/* AVX2 + FMA softmax-family row bodies (see softmax_kernels.h): the row reductions are the
 * AVX2 vecmath bodies (ct_vec_avx2), the element passes 8 lanes at a time with zero-padded
 * tails; exp(out) of the log_softmax backward is ct_exp256 (at most 2 ulp). */
#include "ops/softmax_kernels.h"
#include "ops/vecmath_kernels.h"
#include "simd/simd_avx2.h"

#define CT_INLINE static inline __attribute__((always_inline))

CT_INLINE float lse_row(const float *x, int64_t C)
{
    float m = ct_vec_avx2.vmax(x, C);
    return m == -INFINITY ? -INFINITY : m + logf(ct_vec_avx2.vexpsum(NULL, x, m, C));
}

static void softmax_rows_avx2(float *out, const float *inp, int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        float *y = out + r * C;
        float m = ct_vec_avx2.vmax(x, C);
        if (m == -INFINITY) { /* fully masked row: PyTorch gives NaN; keep that */
            for (int64_t j = 0; j < C; j++) y[j] = NAN;
            continue;
        }
        float s = ct_vec_avx2.vexpsum(y, x, m, C);
        ct_vec_avx2.vscale(y, 1.0f / s, C);
    }
}

static void log_softmax_rows_avx2(float *out, const float *inp, int64_t r0, int64_t r1,
                                  int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        float *y = out + r * C;
        __m256 lv = _mm256_set1_ps(lse_row(x, C));
        int64_t j = 0;
        for (; j + 8 <= C; j += 8) _mm256_storeu_ps(y + j, _mm256_sub_ps(_mm256_loadu_ps(x + j), lv));
        if (j < C) ct_st8_part(y, j, C - j, _mm256_sub_ps(ct_ld8_part(x, j, C - j, 0), lv), 0);
    }
}

static void logsumexp_rows_avx2(float *lse, const float *inp, int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) lse[r] = lse_row(inp + r * C, C);
}

static void softmax_backward_rows_avx2(float *dinp, const float *dout, const float *out,
                                       int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *g = dout + r * C, *y = out + r * C;
        float *d = dinp + r * C;
        __m256 dv = _mm256_set1_ps(ct_vec_avx2.vdot(g, y, C));
        int64_t j = 0;
        for (; j + 8 <= C; j += 8)
            _mm256_storeu_ps(d + j, _mm256_mul_ps(_mm256_loadu_ps(y + j),
                                                  _mm256_sub_ps(_mm256_loadu_ps(g + j), dv)));
        if (j < C) {
            __m256 t = _mm256_mul_ps(ct_ld8_part(y, j, C - j, 0),
                                     _mm256_sub_ps(ct_ld8_part(g, j, C - j, 0), dv));
            ct_st8_part(d, j, C - j, t, 0);
        }
    }
}

static void log_softmax_backward_rows_avx2(float *dinp, const float *dout, const float *out,
                                           int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *g = dout + r * C, *y = out + r * C;
        float *d = dinp + r * C;
        __m256 sv = _mm256_set1_ps(ct_vec_avx2.vsum(g, C));
        int64_t j = 0;
        for (; j + 8 <= C; j += 8)
            _mm256_storeu_ps(d + j, _mm256_fnmadd_ps(ct_exp256(_mm256_loadu_ps(y + j)), sv,
                                                     _mm256_loadu_ps(g + j)));
        if (j < C) {
            __m256 t = _mm256_fnmadd_ps(ct_exp256(ct_ld8_part(y, j, C - j, 0)), sv,
                                        ct_ld8_part(g, j, C - j, 0));
            ct_st8_part(d, j, C - j, t, 0);
        }
    }
}

const ct_softmax_kernels ct_softmax_avx2 = {
    .softmax_rows = softmax_rows_avx2,
    .log_softmax_rows = log_softmax_rows_avx2,
    .logsumexp_rows = logsumexp_rows_avx2,
    .softmax_backward_rows = softmax_backward_rows_avx2,
    .log_softmax_backward_rows = log_softmax_backward_rows_avx2,
};
