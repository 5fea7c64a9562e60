#include "ops/vecmath.h"
#include "core/internal.h"

#include <math.h>

float ct_vmax(const float *x, int64_t n)
{
    if (ct_use_avx2()) return ct_vmax_avx2(x, n);
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > m || isnan(x[i])) m = x[i];
    return m;
}

float ct_vexpsum(float *out, const float *x, float m, int64_t n)
{
    if (ct_use_avx2()) return ct_vexpsum_avx2(out, x, m, n);
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float e = expf(x[i] - m);
        if (out) out[i] = e;
        s += e;
    }
    return s;
}

float ct_vsum(const float *x, int64_t n)
{
    if (ct_use_avx2()) return ct_vsum_avx2(x, n);
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s;
}

float ct_vdot(const float *a, const float *b, int64_t n)
{
    if (ct_use_avx2()) return ct_vdot_avx2(a, b, n);
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void ct_vaxpy(float *y, float a, const float *x, int64_t n)
{
    if (ct_use_avx2()) {
        ct_vaxpy_avx2(y, a, x, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void ct_vscale(float *x, float a, int64_t n)
{
    if (ct_use_avx2()) {
        ct_vscale_avx2(x, a, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) x[i] *= a;
}
