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

/* ---- RMSNorm backward of one row from the saved rstd: dx = rs g w - (sum g w x / C) rs^3 x;
 * pw[i] += g x rs (pw may be NULL) ---- */
static inline void ref_rmsnorm_backward_row(double *dx, double *pw, const float *g, const float *x,
                                            const float *w, double rs, int64_t C)
{
    double dot = 0;
    for (int64_t i = 0; i < C; i++) dot += (double)g[i] * (w ? w[i] : 1.0) * x[i];
    double k = dot / (double)C * rs * rs * rs;
    for (int64_t i = 0; i < C; i++) {
        dx[i] = rs * g[i] * (w ? w[i] : 1.0) - k * x[i];
        if (pw) pw[i] += (double)g[i] * x[i] * rs;
    }
}

/* ---- LayerNorm of one row: y = (x - mean) / sqrt(var + eps) * w + b (biased variance);
 * stores the mean, returns rstd. w, b may be NULL ---- */
static inline double ref_layernorm_row(double *y, double *mean, const float *x, const float *w,
                                       const float *b, int64_t C, double eps)
{
    double s = 0, v = 0;
    for (int64_t i = 0; i < C; i++) s += x[i];
    double m = s / (double)C;
    for (int64_t i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    double rs = 1 / sqrt(v / (double)C + eps);
    for (int64_t i = 0; i < C; i++) y[i] = (x[i] - m) * rs * (w ? w[i] : 1.0) + (b ? b[i] : 0.0);
    *mean = m;
    return rs;
}

/* LayerNorm backward of one row from the saved (f32) mean and rstd: with xh = (x - m) rs and
 * dn = g w, dx = (dn - mean(dn) - xh mean(dn xh)) rs; pw += g xh, pb += g (each may be NULL). */
static inline void ref_layernorm_backward_row(double *dx, double *pw, double *pb, const float *g,
                                              const float *x, const float *w, double m, double rs,
                                              int64_t C)
{
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < C; i++) {
        double xh = (x[i] - m) * rs, dn = g[i] * (w ? w[i] : 1.0);
        s1 += dn, s2 += dn * xh;
    }
    s1 /= (double)C, s2 /= (double)C;
    for (int64_t i = 0; i < C; i++) {
        double xh = (x[i] - m) * rs, dn = g[i] * (w ? w[i] : 1.0);
        dx[i] = (dn - s1 - xh * s2) * rs;
        if (pw) pw[i] += g[i] * xh;
        if (pb) pb[i] += g[i];
    }
}

/* ---- softmax family over one row (C >= 1) ---- */
/* log sum exp(x); -inf for a row of all -inf */
static inline double ref_logsumexp(const float *x, int64_t C)
{
    double m = ref_vmax(x, C), s = 0;
    if (m == -INFINITY) return -INFINITY;
    for (int64_t i = 0; i < C; i++) s += exp((double)x[i] - m);
    return m + log(s);
}
static inline void ref_softmax_row(double *y, const float *x, int64_t C)
{
    double l = ref_logsumexp(x, C);
    for (int64_t i = 0; i < C; i++) y[i] = l == -INFINITY ? NAN : exp((double)x[i] - l);
}
static inline void ref_log_softmax_row(double *y, const float *x, int64_t C)
{
    double l = ref_logsumexp(x, C);
    for (int64_t i = 0; i < C; i++) y[i] = (double)x[i] - l;
}
/* dx = y (g - sum g y), y the softmax output */
static inline void ref_softmax_backward_row(double *dx, const float *g, const float *y, int64_t C)
{
    double dot = 0;
    for (int64_t i = 0; i < C; i++) dot += (double)g[i] * y[i];
    for (int64_t i = 0; i < C; i++) dx[i] = y[i] * (g[i] - dot);
}
/* dx = g - exp(y) sum g, y the log_softmax output */
static inline void ref_log_softmax_backward_row(double *dx, const float *g, const float *y,
                                                int64_t C)
{
    double s = 0;
    for (int64_t i = 0; i < C; i++) s += g[i];
    for (int64_t i = 0; i < C; i++) dx[i] = g[i] - exp((double)y[i]) * s;
}

/* ---- reductions ---- */
/* The documented fixed order of the row sums (reduce_kernels.h, ops_index.h), written out
 * plainly: blocks of 4096, lane i % 8 in double, lanes combined pairwise, blocks in order. */
static inline double ref_sum_fixed(const float *x, int64_t n)
{
    double s = 0;
    for (int64_t b = 0; b < n; b += 4096) {
        double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t i = b; i < n && i < b + 4096; i++) l[(i - b) % 8] += (double)x[i];
        s += ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
    return s;
}
/* Position of the max (sign > 0) or min of x[0..n), n >= 1: first on ties, first NaN. */
static inline int64_t ref_extreme_index(const float *x, int64_t n, int sign)
{
    int64_t bi = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) return i;
        if (sign > 0 ? x[i] > x[bi] : x[i] < x[bi]) bi = i;
    }
    return bi;
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
