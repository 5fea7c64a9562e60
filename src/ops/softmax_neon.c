/* AArch64 Advanced SIMD softmax-family row bodies (see softmax_kernels.h): the row
 * reductions are the NEON vecmath bodies (ct_vec_neon, bitwise the AVX2 ones), the element
 * passes 4 lanes at a time with zero-padded tails and the FMAs of softmax_avx2.c; exp(out)
 * of the log_softmax backward is ct_exp_n4. Every result is bitwise the AVX2 body's. */
#include "ops/softmax_kernels.h"
#include "ops/vecmath_kernels.h"
#include "simd/simd_neon.h"

#define CT_INLINE static inline __attribute__((always_inline))

CT_INLINE float lse_row(const float *x, int64_t C)
{
    float m = ct_vec_neon.vmax(x, C);
    return m == -INFINITY ? -INFINITY : m + logf(ct_vec_neon.vexpsum(NULL, x, m, C));
}

static void softmax_rows_neon(float *out, const float *inp, int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        float *y = out + r * C;
        float m = ct_vec_neon.vmax(x, C);
        if (m == -INFINITY) { /* fully masked row: PyTorch gives NaN; keep that */
            for (int64_t j = 0; j < C; j++) y[j] = NAN;
            continue;
        }
        float s = ct_vec_neon.vexpsum(y, x, m, C);
        ct_vec_neon.vscale(y, 1.0f / s, C);
    }
}

static void log_softmax_rows_neon(float *out, const float *inp, int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        float *y = out + r * C;
        float32x4_t lv = vdupq_n_f32(lse_row(x, C));
        int64_t j = 0;
        for (; j + 4 <= C; j += 4) vst1q_f32(y + j, vsubq_f32(vld1q_f32(x + j), lv));
        if (j < C) ct_st4n_part(y, j, C - j, vsubq_f32(ct_ld4n_part(x, j, C - j, 0), lv), 0);
    }
}

static void logsumexp_rows_neon(float *lse, const float *inp, int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) lse[r] = lse_row(inp + r * C, C);
}

static void softmax_backward_rows_neon(float *dinp, const float *dout, const float *out,
                                       int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *g = dout + r * C, *y = out + r * C;
        float *d = dinp + r * C;
        float32x4_t dv = vdupq_n_f32(ct_vec_neon.vdot(g, y, C));
        int64_t j = 0;
        for (; j + 4 <= C; j += 4)
            vst1q_f32(d + j, vmulq_f32(vld1q_f32(y + j), vsubq_f32(vld1q_f32(g + j), dv)));
        if (j < C) {
            float32x4_t t = vmulq_f32(ct_ld4n_part(y, j, C - j, 0),
                                      vsubq_f32(ct_ld4n_part(g, j, C - j, 0), dv));
            ct_st4n_part(d, j, C - j, t, 0);
        }
    }
}

static void log_softmax_backward_rows_neon(float *dinp, const float *dout, const float *out,
                                           int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *g = dout + r * C, *y = out + r * C;
        float *d = dinp + r * C;
        float32x4_t sv = vdupq_n_f32(ct_vec_neon.vsum(g, C));
        int64_t j = 0;
        for (; j + 4 <= C; j += 4)
            vst1q_f32(d + j, vfmsq_f32(vld1q_f32(g + j), ct_exp_n4(vld1q_f32(y + j)), sv));
        if (j < C) {
            float32x4_t t = vfmsq_f32(ct_ld4n_part(g, j, C - j, 0),
                                      ct_exp_n4(ct_ld4n_part(y, j, C - j, 0)), sv);
            ct_st4n_part(d, j, C - j, t, 0);
        }
    }
}

const ct_softmax_kernels ct_softmax_neon = {
    .softmax_rows = softmax_rows_neon,
    .log_softmax_rows = log_softmax_rows_neon,
    .logsumexp_rows = logsumexp_rows_neon,
    .softmax_backward_rows = softmax_backward_rows_neon,
    .log_softmax_backward_rows = log_softmax_backward_rows_neon,
};
