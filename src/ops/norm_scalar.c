/* Scalar RMSNorm and LayerNorm row bodies (see norm_kernels.h): plain loops, left-to-right
 * f32 sums (ISO C: no FMA contraction, no reassociation). */
#include "ops/norm_kernels.h"
#include "ctorch/tensor.h"

#include <math.h>

#define CT_INLINE static inline __attribute__((always_inline))

CT_INLINE float ldx(const void *p, int64_t i, int bf)
{
    return bf ? ct_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

CT_INLINE void stx(void *p, int64_t i, float v, int bf)
{
    if (bf)
        ((uint16_t *)p)[i] = ct_f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

CT_INLINE const void *row_c(const void *p, int64_t r, int64_t C, int bf)
{
    return (const unsigned char *)p + (size_t)(r * C) * (bf ? 2u : 4u);
}

CT_INLINE void *row_m(void *p, int64_t r, int64_t C, int bf)
{
    return (unsigned char *)p + (size_t)(r * C) * (bf ? 2u : 4u);
}

CT_INLINE void rms_fwd_t(void *out, float *rstd, const void *inp, const void *w, int64_t r0,
                         int64_t r1, int64_t C, float eps, const int bf)
{
    for (int64_t r = r0; r < r1; r++) {
        const void *x = row_c(inp, r, C, bf);
        void *y = row_m(out, r, C, bf);
        float ss = 0.0f;
        for (int64_t i = 0; i < C; i++) {
            float v = ldx(x, i, bf);
            ss += v * v;
        }
        float rs = 1.0f / sqrtf(ss / (float)C + eps);
        if (rstd) rstd[r] = rs;
        for (int64_t i = 0; i < C; i++) {
            float v = ldx(x, i, bf) * rs;
            if (w) v *= ldx(w, i, bf);
            stx(y, i, v, bf);
        }
    }
}

static void rms_forward_rows_scalar(void *out, float *rstd, const void *inp, const void *w,
                                    int64_t r0, int64_t r1, int64_t C, float eps, int bf)
{
    if (bf)
        rms_fwd_t(out, rstd, inp, w, r0, r1, C, eps, 1);
    else
        rms_fwd_t(out, rstd, inp, w, r0, r1, C, eps, 0);
}

CT_INLINE void rms_bwd_t(void *dinp, float *pw, const void *dout, const void *inp, const void *w,
                         const float *rstd, int64_t r0, int64_t r1, int64_t C, const int bf)
{
    for (int64_t r = r0; r < r1; r++) {
        const void *x = row_c(inp, r, C, bf), *g = row_c(dout, r, C, bf);
        void *dx = row_m(dinp, r, C, bf);
        float rs = rstd[r], dot = 0.0f;
        for (int64_t i = 0; i < C; i++) {
            float gw = ldx(g, i, bf);
            if (w) gw *= ldx(w, i, bf);
            dot += gw * ldx(x, i, bf);
        }
        float k = dot / (float)C * rs * rs * rs;
        for (int64_t i = 0; i < C; i++) {
            float gi = ldx(g, i, bf), xi = ldx(x, i, bf), gw = gi;
            if (w) gw *= ldx(w, i, bf);
            if (pw) pw[i] += gi * (xi * rs);
            stx(dx, i, rs * gw - k * xi, bf);
        }
    }
}

static void rms_backward_rows_scalar(void *dinp, float *pw, const void *dout, const void *inp,
                                     const void *w, const float *rstd, int64_t r0, int64_t r1,
                                     int64_t C, int bf)
{
    if (bf)
        rms_bwd_t(dinp, pw, dout, inp, w, rstd, r0, r1, C, 1);
    else
        rms_bwd_t(dinp, pw, dout, inp, w, rstd, r0, r1, C, 0);
}

/* ---- LayerNorm ------------------------------------------------------------------------ */

CT_INLINE void ln_fwd_t(void *out, float *mean, float *rstd, const void *inp, const void *w,
                        const void *b, int64_t r0, int64_t r1, int64_t C, float eps, const int bf)
{
    for (int64_t r = r0; r < r1; r++) {
        const void *x = row_c(inp, r, C, bf);
        void *y = row_m(out, r, C, bf);
        float s = 0.0f;
        for (int64_t i = 0; i < C; i++)
            s += ldx(x, i, bf);
        float m = s / (float)C, v = 0.0f;
        for (int64_t i = 0; i < C; i++) {
            float d = ldx(x, i, bf) - m;
            v += d * d;
        }
        float rs = 1.0f / sqrtf(v / (float)C + eps);
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = rs;
        for (int64_t i = 0; i < C; i++) {
            float o = (ldx(x, i, bf) - m) * rs;
            if (w) o *= ldx(w, i, bf);
            if (b) o += ldx(b, i, bf);
            stx(y, i, o, bf);
        }
    }
}

static void ln_forward_rows_scalar(void *out, float *mean, float *rstd, const void *inp,
                                   const void *w, const void *b, int64_t r0, int64_t r1, int64_t C,
                                   float eps, int bf)
{
    if (bf)
        ln_fwd_t(out, mean, rstd, inp, w, b, r0, r1, C, eps, 1);
    else
        ln_fwd_t(out, mean, rstd, inp, w, b, r0, r1, C, eps, 0);
}

CT_INLINE void ln_bwd_t(void *dinp, float *pw, float *pb, const void *dout, const void *inp,
                        const void *w, const float *mean, const float *rstd, int64_t r0,
                        int64_t r1, int64_t C, const int bf)
{
    for (int64_t r = r0; r < r1; r++) {
        const void *x = row_c(inp, r, C, bf), *g = row_c(dout, r, C, bf);
        void *dx = row_m(dinp, r, C, bf);
        float m = mean[r], rs = rstd[r];
        float s1 = 0.0f, s2 = 0.0f; /* sum dnorm, sum dnorm * xhat */
        for (int64_t i = 0; i < C; i++) {
            float xh = (ldx(x, i, bf) - m) * rs, dn = ldx(g, i, bf);
            if (w) dn *= ldx(w, i, bf);
            s1 += dn;
            s2 += dn * xh;
        }
        s1 /= (float)C;
        s2 /= (float)C;
        for (int64_t i = 0; i < C; i++) {
            float xh = (ldx(x, i, bf) - m) * rs, gi = ldx(g, i, bf), dn = gi;
            if (w) dn *= ldx(w, i, bf);
            if (pw) pw[i] += gi * xh;
            if (pb) pb[i] += gi;
            stx(dx, i, (dn - s1 - xh * s2) * rs, bf);
        }
    }
}

static void ln_backward_rows_scalar(void *dinp, float *pw, float *pb, const void *dout,
                                    const void *inp, const void *w, const float *mean,
                                    const float *rstd, int64_t r0, int64_t r1, int64_t C, int bf)
{
    if (bf)
        ln_bwd_t(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C, 1);
    else
        ln_bwd_t(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C, 0);
}

const ct_norm_kernels ct_norm_scalar = {
    .rms_forward_rows = rms_forward_rows_scalar,
    .rms_backward_rows = rms_backward_rows_scalar,
    .ln_forward_rows = ln_forward_rows_scalar,
    .ln_backward_rows = ln_backward_rows_scalar,
};
