/* Scalar row primitives (see vecmath_kernels.h): plain left-to-right loops, libm expf. */
#include "ops/vecmath_kernels.h"

#include <math.h>

static float vmax_scalar(const float *x, int64_t n)
{
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > m || isnan(x[i])) m = x[i];
    return m;
}

static float vexpsum_scalar(float *out, const float *x, float m, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float e = expf(x[i] - m);
        if (out) out[i] = e;
        s += e;
    }
    return s;
}

static float vsum_scalar(const float *x, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s;
}

static float vdot_scalar(const float *a, const float *b, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void vaxpy_scalar(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void vscale_scalar(float *x, float a, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] *= a;
}

const ct_vec_kernels ct_vec_scalar = {vmax_scalar, vexpsum_scalar, vsum_scalar,
                                      vdot_scalar, vaxpy_scalar,   vscale_scalar};
