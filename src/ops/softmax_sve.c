/* AArch64 SVE softmax-family row bodies (see softmax_kernels.h), vector-length agnostic: the
 * row reductions are the SVE vecmath bodies (ct_vec_sve), the element passes step svcntw()
 * lanes under a whilelt predicate with the FMAs of softmax_avx2.c; exp(out) of the
 * log_softmax backward is ct_exp_sv. */
#include "ops/softmax_kernels.h"
#include "ops/vecmath_kernels.h"
#include "simd/simd_sve.h"

#define CT_INLINE static inline __attribute__((always_inline))

CT_INLINE float lse_row(const float *x, int64_t C)
{
    float m = ct_vec_sve.vmax(x, C);
    return m == -INFINITY ? -INFINITY : m + logf(ct_vec_sve.vexpsum(NULL, x, m, C));
}

static void softmax_rows_sve(float *out, const float *inp, int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        float *y = out + r * C;
        float m = ct_vec_sve.vmax(x, C);
        if (m == -INFINITY) { /* fully masked row: PyTorch gives NaN; keep that */
            for (int64_t j = 0; j < C; j++) y[j] = NAN;
            continue;
        }
        float s = ct_vec_sve.vexpsum(y, x, m, C);
        ct_vec_sve.vscale(y, 1.0f / s, C);
    }
}

static void log_softmax_rows_sve(float *out, const float *inp, int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        float *y = out + r * C;
        float lse = lse_row(x, C);
        for (int64_t j = 0; j < C; j += (int64_t)svcntw()) {
            svbool_t pg = svwhilelt_b32_s64(j, C);
            svst1_f32(pg, y + j, svsub_n_f32_x(pg, svld1_f32(pg, x + j), lse));
        }
    }
}

static void logsumexp_rows_sve(float *lse, const float *inp, int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) lse[r] = lse_row(inp + r * C, C);
}

static void softmax_backward_rows_sve(float *dinp, const float *dout, const float *out,
                                      int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *g = dout + r * C, *y = out + r * C;
        float *d = dinp + r * C;
        float dot = ct_vec_sve.vdot(g, y, C);
        for (int64_t j = 0; j < C; j += (int64_t)svcntw()) {
            svbool_t pg = svwhilelt_b32_s64(j, C);
            svfloat32_t t = svsub_n_f32_x(pg, svld1_f32(pg, g + j), dot);
            svst1_f32(pg, d + j, svmul_f32_x(pg, svld1_f32(pg, y + j), t));
        }
    }
}

static void log_softmax_backward_rows_sve(float *dinp, const float *dout, const float *out,
                                          int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *g = dout + r * C, *y = out + r * C;
        float *d = dinp + r * C;
        float s = ct_vec_sve.vsum(g, C);
        for (int64_t j = 0; j < C; j += (int64_t)svcntw()) {
            svbool_t pg = svwhilelt_b32_s64(j, C);
            svfloat32_t e = ct_exp_sv(pg, svld1_f32(pg, y + j));
            svst1_f32(pg, d + j, svmls_n_f32_x(pg, svld1_f32(pg, g + j), e, s));
        }
    }
}

const ct_softmax_kernels ct_softmax_sve = {
    .softmax_rows = softmax_rows_sve,
    .log_softmax_rows = log_softmax_rows_sve,
    .logsumexp_rows = logsumexp_rows_sve,
    .softmax_backward_rows = softmax_backward_rows_sve,
    .log_softmax_backward_rows = log_softmax_backward_rows_sve,
};
