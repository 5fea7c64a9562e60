/* Portable softmax-family row bodies (see softmax_kernels.h): the row reductions through a
 * vecmath table, the element passes as plain loops (libm expf). ct_softmax_scalar uses
 * ct_vec_scalar; ct_softmax_portable uses the active vecmath table (CT_KERNELS), so an
 * instruction set with vecmath bodies but no softmax bodies still gets its vecmath. */
#include "ops/softmax_kernels.h"
#include "ops/vecmath_kernels.h"

#include <math.h>

#define CT_INLINE static inline __attribute__((always_inline))

CT_INLINE void softmax_t(const ct_vec_kernels *v, float *out, const float *inp, int64_t r0,
                         int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        float *y = out + r * C;
        float m = v->vmax(x, C);
        if (m == -INFINITY) { /* fully masked row: PyTorch gives NaN; keep that */
            for (int64_t j = 0; j < C; j++) y[j] = NAN;
            continue;
        }
        float s = v->vexpsum(y, x, m, C);
        v->vscale(y, 1.0f / s, C);
    }
}

CT_INLINE float lse_t(const ct_vec_kernels *v, const float *x, int64_t C)
{
    float m = v->vmax(x, C);
    return m == -INFINITY ? -INFINITY : m + logf(v->vexpsum(NULL, x, m, C));
}

CT_INLINE void log_softmax_t(const ct_vec_kernels *v, float *out, const float *inp, int64_t r0,
                             int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        float *y = out + r * C;
        float lse = lse_t(v, x, C);
        for (int64_t j = 0; j < C; j++) y[j] = x[j] - lse;
    }
}

CT_INLINE void logsumexp_t(const ct_vec_kernels *v, float *lse, const float *inp, int64_t r0,
                           int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) lse[r] = lse_t(v, inp + r * C, C);
}

CT_INLINE void softmax_bwd_t(const ct_vec_kernels *v, float *dinp, const float *dout,
                             const float *out, int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *g = dout + r * C, *y = out + r * C;
        float *d = dinp + r * C;
        float dot = v->vdot(g, y, C);
        for (int64_t j = 0; j < C; j++) d[j] = y[j] * (g[j] - dot);
    }
}

CT_INLINE void log_softmax_bwd_t(const ct_vec_kernels *v, float *dinp, const float *dout,
                                 const float *out, int64_t r0, int64_t r1, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *g = dout + r * C, *y = out + r * C;
        float *d = dinp + r * C;
        float s = v->vsum(g, C);
        for (int64_t j = 0; j < C; j++) d[j] = g[j] - expf(y[j]) * s;
    }
}

/* Instantiate the five bodies over the vecmath table expression V under suffix S. */
#define SOFTMAX_BODIES(S, V)                                                                \
    static void softmax_rows_##S(float *out, const float *inp, int64_t r0, int64_t r1,      \
                                 int64_t C)                                                 \
    {                                                                                       \
        softmax_t(V, out, inp, r0, r1, C);                                                  \
    }                                                                                       \
    static void log_softmax_rows_##S(float *out, const float *inp, int64_t r0, int64_t r1,  \
                                     int64_t C)                                             \
    {                                                                                       \
        log_softmax_t(V, out, inp, r0, r1, C);                                              \
    }                                                                                       \
    static void logsumexp_rows_##S(float *lse, const float *inp, int64_t r0, int64_t r1,    \
                                   int64_t C)                                               \
    {                                                                                       \
        logsumexp_t(V, lse, inp, r0, r1, C);                                                \
    }                                                                                       \
    static void softmax_backward_rows_##S(float *dinp, const float *dout, const float *out, \
                                          int64_t r0, int64_t r1, int64_t C)                \
    {                                                                                       \
        softmax_bwd_t(V, dinp, dout, out, r0, r1, C);                                       \
    }                                                                                       \
    static void log_softmax_backward_rows_##S(float *dinp, const float *dout,               \
                                              const float *out, int64_t r0, int64_t r1,     \
                                              int64_t C)                                    \
    {                                                                                       \
        log_softmax_bwd_t(V, dinp, dout, out, r0, r1, C);                                   \
    }                                                                                       \
    const ct_softmax_kernels ct_softmax_##S = {                                             \
        .softmax_rows = softmax_rows_##S,                                                   \
        .log_softmax_rows = log_softmax_rows_##S,                                           \
        .logsumexp_rows = logsumexp_rows_##S,                                               \
        .softmax_backward_rows = softmax_backward_rows_##S,                                 \
        .log_softmax_backward_rows = log_softmax_backward_rows_##S,                         \
    };

SOFTMAX_BODIES(scalar, &ct_vec_scalar)
SOFTMAX_BODIES(portable, CT_KERNELS(ct_vec_tables))
