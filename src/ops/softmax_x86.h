/* The x86 softmax-family row bodies (see softmax_kernels.h), written once over simd_x86.h's
 * vector type: softmax_avx2.c includes this at 8 lanes with CT_SM_VEC = ct_vec_avx2,
 * softmax_avx512.c at 16 lanes with ct_vec_avx512 (bitwise the AVX2 vecmath), each naming
 * its table CT_SM_TABLE. The row reductions are the vecmath bodies; the element passes go
 * CV_W lanes at a time with zero-padded tails, the same operations per element in both
 * widths, so the two tables give the same bits. exp(out) of the log_softmax backward is
 * cv_exp (at most 2 ulp). */
#if !defined(CT_SM_TABLE) || !defined(CT_SM_VEC)
#error "define CT_SM_TABLE and CT_SM_VEC and include simd_avx2.h or simd_avx512.h first"
#endif

#include "ops/softmax_kernels.h"
#include "ops/vecmath_kernels.h"

#define CT_INLINE static inline __attribute__((always_inline))

CT_INLINE float lse_row(const float *x, int64_t C)
{
    float m = CT_SM_VEC.vmax(x, C);
    return m == -INFINITY ? -INFINITY : m + logf(CT_SM_VEC.vexpsum(NULL, x, m, C));
}

static void softmax_rows(float *out, const float *inp, int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        float *y = out + r * C;
        float m = CT_SM_VEC.vmax(x, C);
        if (m == -INFINITY) { /* fully masked row: PyTorch gives NaN; keep that */
            for (int64_t j = 0; j < C; j++) y[j] = NAN;
            continue;
        }
        float s = CT_SM_VEC.vexpsum(y, x, m, C);
        CT_SM_VEC.vscale(y, 1.0f / s, C);
    }
}

static void log_softmax_rows(float *out, const float *inp, int64_t r0, int64_t r1,
                                  int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        float *y = out + r * C;
        ct_vf lv = cv_set1(lse_row(x, C));
        int64_t j = 0;
        for (; j + CV_W <= C; j += CV_W) cv_storeu(y + j, cv_sub(cv_loadu(x + j), lv));
        if (j < C) cv_st_part(y, j, C - j, cv_sub(cv_ld_part(x, j, C - j, 0), lv), 0);
    }
}

static void logsumexp_rows(float *lse, const float *inp, int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) lse[r] = lse_row(inp + r * C, C);
}

static void softmax_backward_rows(float *dinp, const float *dout, const float *out,
                                       int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *g = dout + r * C, *y = out + r * C;
        float *d = dinp + r * C;
        ct_vf dv = cv_set1(CT_SM_VEC.vdot(g, y, C));
        int64_t j = 0;
        for (; j + CV_W <= C; j += CV_W)
            cv_storeu(d + j, cv_mul(cv_loadu(y + j),
                                                  cv_sub(cv_loadu(g + j), dv)));
        if (j < C) {
            ct_vf t = cv_mul(cv_ld_part(y, j, C - j, 0),
                                     cv_sub(cv_ld_part(g, j, C - j, 0), dv));
            cv_st_part(d, j, C - j, t, 0);
        }
    }
}

static void log_softmax_backward_rows(float *dinp, const float *dout, const float *out,
                                           int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *g = dout + r * C, *y = out + r * C;
        float *d = dinp + r * C;
        ct_vf sv = cv_set1(CT_SM_VEC.vsum(g, C));
        int64_t j = 0;
        for (; j + CV_W <= C; j += CV_W)
            cv_storeu(d + j, cv_fnmadd(cv_exp(cv_loadu(y + j)), sv,
                                                     cv_loadu(g + j)));
        if (j < C) {
            ct_vf t = cv_fnmadd(cv_exp(cv_ld_part(y, j, C - j, 0)), sv,
                                        cv_ld_part(g, j, C - j, 0));
            cv_st_part(d, j, C - j, t, 0);
        }
    }
}

const ct_softmax_kernels CT_SM_TABLE = {
    .softmax_rows = softmax_rows,
    .log_softmax_rows = log_softmax_rows,
    .logsumexp_rows = logsumexp_rows,
    .softmax_backward_rows = softmax_backward_rows,
    .log_softmax_backward_rows = log_softmax_backward_rows,
};
