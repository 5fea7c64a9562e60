/* Naive double-precision references of the kernel families (issue 12), shared by the C
 * tests (tests/c/test_kernels_isa.c) and `ctorch bench kernels` (cli/bench_kernels.c): the
 * straightforward formula in double, no blocking, no vectors. Header-only, static inline. */
#ifndef CT_TESTS_REF_KERNELS_H
#define CT_TESTS_REF_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- row primitives (softmax / cross-entropy / attention rows) ---- */
static inline double ref_vmax(const float *x, int64_t n)
{
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (isnan(x[i]) || x[i] > m) m = x[i];
    return m;
}
/* The argument x - m is rounded to float first, as the kernels compute it. */
static inline double ref_vexpsum(double *out, const float *x, float m, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = exp((double)(x[i] - m));
        if (out) out[i] = e;
        s += e;
    }
    return s;
}
static inline double ref_vdot(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* ---- activations (kind 0: GELU erf, 1: GELU tanh, 2: SiLU) ---- */
static inline double ref_act(double x, int kind)
{
    if (kind == 0) return 0.5 * x * erfc(-x / sqrt(2.0));
    if (kind == 1) return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    return x / (1 + exp(-x));
}
static inline double ref_act_grad(double x, int kind)
{
    if (kind == 0) return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
    if (kind == 1) {
        double u = sqrt(2 / M_PI) * (x + 0.044715 * x * x * x), t = tanh(u);
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
    }
    double s = 1 / (1 + exp(-x));
    return s * (1 + x * (1 - s));
}

/* ---- RMSNorm of one row: y = x / sqrt(mean(x^2) + eps) * w; returns rstd ---- */
static inline double ref_rmsnorm_row(double *y, const float *x, const float *w, int64_t C, double eps)
{
    double ss = 0;
    for (int64_t i = 0; i < C; i++) ss += (double)x[i] * x[i];
    double rs = 1 / sqrt(ss / (double)C + eps);
    for (int64_t i = 0; i < C; i++) y[i] = x[i] * rs * (w ? w[i] : 1.0);
    return rs;
}

/* ---- conversions: f32 -> bf16 round to nearest even (NaN quiet), bf16 -> f32 exact ---- */
static inline uint16_t ref_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u | 0x00400000u) >> 16);
    double v = f, lo, hi; /* the two bf16 neighbours, chosen in double */
    uint32_t t = u & 0xFFFF0000u, t2 = t + 0x10000u;
    float a, b;
    memcpy(&a, &t, 4);
    memcpy(&b, &t2, 4);
    lo = a;
    hi = b;
    if ((u & 0x7F800000u) == 0x7F800000u) return (uint16_t)(u >> 16); /* inf */
    double dl = fabs(v - lo), dh = fabs(hi - v);
    if (dl < dh || (dl == dh && !(t & 0x10000u))) return (uint16_t)(t >> 16);
    return (uint16_t)(t2 >> 16);
}

/* Distance in units in the last place between two finite floats of the same sign or zero. */
static inline int64_t ref_ulp_diff(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = (int32_t)0x80000000 - ia;
    if (ib < 0) ib = (int32_t)0x80000000 - ib;
    int64_t d = (int64_t)ia - ib;
    return d < 0 ? -d : d;
}

#endif
