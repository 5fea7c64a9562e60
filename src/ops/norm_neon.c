/* AArch64 Advanced SIMD RMSNorm and LayerNorm row bodies (see norm_kernels.h), lane for
 * lane the AVX2 bodies of norm_avx2.c: every __m256 is a pair of float32x4_t (lanes 0-3,
 * 4-7) with the same operations and fused multiply-adds, tails go through zero-padded
 * vectors (masked where a padded lane would not contribute zero), and each row sum folds
 * its two 8-lane accumulators by ct_hsum_n8 in ct_hsum256's order, so the results are the
 * AVX2 body's bit for bit. */
#include "ops/norm_kernels.h"
#include "simd/simd_neon.h"

#define CT_INLINE static inline __attribute__((always_inline))

/* Eight lanes as two NEON vectors: the NEON twin of one __m256. */
typedef struct v8 {
    float32x4_t lo, hi;
} v8;

CT_INLINE v8 v8_zero(void)
{
    v8 r = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    return r;
}
CT_INLINE v8 v8_dup(float s)
{
    v8 r = {vdupq_n_f32(s), vdupq_n_f32(s)};
    return r;
}
CT_INLINE v8 v8_add(v8 a, v8 b)
{
    v8 r = {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)};
    return r;
}
CT_INLINE v8 v8_sub(v8 a, v8 b)
{
    v8 r = {vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)};
    return r;
}
CT_INLINE v8 v8_mul(v8 a, v8 b)
{
    v8 r = {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)};
    return r;
}
/* a * b + c, fused (_mm256_fmadd_ps). */
CT_INLINE v8 v8_fmadd(v8 a, v8 b, v8 c)
{
    v8 r = {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)};
    return r;
}
/* a * b - c, fused (_mm256_fmsub_ps): -(c - a * b) rounds to the same value. */
CT_INLINE v8 v8_fmsub(v8 a, v8 b, v8 c)
{
    v8 r = {vnegq_f32(vfmsq_f32(c.lo, a.lo, b.lo)), vnegq_f32(vfmsq_f32(c.hi, a.hi, b.hi))};
    return r;
}
/* c - a * b, fused (_mm256_fnmadd_ps). */
CT_INLINE v8 v8_fnmadd(v8 a, v8 b, v8 c)
{
    v8 r = {vfmsq_f32(c.lo, a.lo, b.lo), vfmsq_f32(c.hi, a.hi, b.hi)};
    return r;
}
CT_INLINE float v8_hsum(v8 a)
{
    return ct_hsum_n8(a.lo, a.hi);
}

CT_INLINE v8 ld8(const void *p, int64_t i, int bf)
{
    v8 r = {ct_ld4n(p, i, bf), ct_ld4n(p, i + 4, bf)};
    return r;
}
/* The first k (0 < k < 8) elements at index i, zero-padded. */
CT_INLINE v8 ld8_part(const void *p, int64_t i, int64_t k, int bf)
{
    v8 r;
    if (k >= 4) {
        r.lo = ct_ld4n(p, i, bf);
        r.hi = k > 4 ? ct_ld4n_part(p, i + 4, k - 4, bf) : vdupq_n_f32(0.0f);
    } else {
        r.lo = ct_ld4n_part(p, i, k, bf);
        r.hi = vdupq_n_f32(0.0f);
    }
    return r;
}
CT_INLINE v8 ld8k(const void *p, int64_t i, int64_t k, int bf)
{
    return k == 8 ? ld8(p, i, bf) : ld8_part(p, i, k, bf);
}
CT_INLINE void st8(void *p, int64_t i, v8 v, int bf)
{
    ct_st4n(p, i, v.lo, bf);
    ct_st4n(p, i + 4, v.hi, bf);
}
CT_INLINE void st8k(void *p, int64_t i, int64_t k, v8 v, int bf)
{
    if (k == 8) {
        st8(p, i, v, bf);
    } else if (k >= 4) {
        ct_st4n(p, i, v.lo, bf);
        if (k > 4) ct_st4n_part(p, i + 4, k - 4, v.hi, bf);
    } else {
        ct_st4n_part(p, i, k, v.lo, bf);
    }
}
/* Lanes [0, k) kept, the rest zeroed (0 < k < 8). */
CT_INLINE v8 v8_keep(v8 a, int64_t k)
{
    static const int32_t idx[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32x4_t kv = vdupq_n_s32((int32_t)k);
    uint32x4_t mlo = vcgtq_s32(kv, vld1q_s32(idx)), mhi = vcgtq_s32(kv, vld1q_s32(idx + 4));
    v8 r = {vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(a.lo), mlo)),
            vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(a.hi), mhi))};
    return r;
}

/* ---- RMSNorm ------------------------------------------------------------------------- */

/* sum_i x[i] * y[i] over a row of C values (x may be y). */
CT_INLINE float row_dot(const void *x, const void *y, int64_t C, int bf)
{
    v8 a0 = v8_zero(), a1 = v8_zero();
    int64_t i = 0;
    for (; i + 16 <= C; i += 16) {
        a0 = v8_fmadd(ld8(x, i, bf), ld8(y, i, bf), a0);
        a1 = v8_fmadd(ld8(x, i + 8, bf), ld8(y, i + 8, bf), a1);
    }
    if (i + 8 <= C) {
        a0 = v8_fmadd(ld8(x, i, bf), ld8(y, i, bf), a0);
        i += 8;
    }
    if (i < C) a1 = v8_fmadd(ld8_part(x, i, C - i, bf), ld8_part(y, i, C - i, bf), a1);
    return v8_hsum(v8_add(a0, a1));
}

CT_INLINE void rms_fwd_rows(void *out, float *rstd, const void *inp, const void *w, int64_t r0,
                            int64_t r1, int64_t C, float eps, int bf)
{
    size_t es = bf ? 2 : 4;
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *x = (const unsigned char *)inp + (size_t)(r * C) * es;
        unsigned char *y = (unsigned char *)out + (size_t)(r * C) * es;
        float rs = 1.0f / sqrtf(row_dot(x, x, C, bf) / (float)C + eps);
        if (rstd) rstd[r] = rs;
        v8 rv = v8_dup(rs);
        for (int64_t i = 0; i < C; i += 8) {
            int64_t k = C - i < 8 ? C - i : 8;
            v8 v = v8_mul(ld8k(x, i, k, bf), rv);
            if (w) v = v8_mul(v, ld8k(w, i, k, bf));
            st8k(y, i, k, v, bf);
        }
    }
}

static void rms_forward_rows_neon(void *out, float *rstd, const void *inp, const void *w,
                                  int64_t r0, int64_t r1, int64_t C, float eps, int bf)
{
    if (bf)
        rms_fwd_rows(out, rstd, inp, w, r0, r1, C, eps, 1);
    else
        rms_fwd_rows(out, rstd, inp, w, r0, r1, C, eps, 0);
}

CT_INLINE void rms_bwd_vec(void *dx, float *pw, const void *g, const void *x, const void *w,
                           v8 rv, v8 kv, int64_t i, int64_t k, int bf)
{
    v8 gv = ld8k(g, i, k, bf), xv = ld8k(x, i, k, bf), gw = gv;
    if (w) gw = v8_mul(gv, ld8k(w, i, k, bf));
    if (pw) st8k(pw, i, k, v8_fmadd(gv, v8_mul(xv, rv), ld8k(pw, i, k, 0)), 0);
    st8k(dx, i, k, v8_fmsub(rv, gw, v8_mul(kv, xv)), bf);
}

CT_INLINE void rms_bwd_rows(void *dinp, float *pw, const void *dout, const void *inp, const void *w,
                            const float *rstd, int64_t r0, int64_t r1, int64_t C, int bf)
{
    size_t es = bf ? 2 : 4;
    for (int64_t r = r0; r < r1; r++) {
        size_t off = (size_t)(r * C) * es;
        const unsigned char *x = (const unsigned char *)inp + off;
        const unsigned char *g = (const unsigned char *)dout + off;
        unsigned char *dx = (unsigned char *)dinp + off;
        float rs = rstd[r];
        /* dot = sum_c (g w)_c x_c */
        v8 a0 = v8_zero(), a1 = v8_zero();
        int64_t i = 0;
        for (; i + 8 <= C; i += 8) {
            v8 gw = ld8(g, i, bf);
            if (w) gw = v8_mul(gw, ld8(w, i, bf));
            if ((i & 8) == 0)
                a0 = v8_fmadd(gw, ld8(x, i, bf), a0);
            else
                a1 = v8_fmadd(gw, ld8(x, i, bf), a1);
        }
        if (i < C) {
            v8 gw = ld8_part(g, i, C - i, bf);
            if (w) gw = v8_mul(gw, ld8_part(w, i, C - i, bf));
            a1 = v8_fmadd(gw, ld8_part(x, i, C - i, bf), a1);
        }
        float dot = v8_hsum(v8_add(a0, a1));
        v8 rv = v8_dup(rs), kv = v8_dup(dot / (float)C * rs * rs * rs);
        for (i = 0; i < C; i += 8)
            rms_bwd_vec(dx, pw, g, x, w, rv, kv, i, C - i < 8 ? C - i : 8, bf);
    }
}

static void rms_backward_rows_neon(void *dinp, float *pw, const void *dout, const void *inp,
                                   const void *w, const float *rstd, int64_t r0, int64_t r1,
                                   int64_t C, int bf)
{
    if (bf)
        rms_bwd_rows(dinp, pw, dout, inp, w, rstd, r0, r1, C, 1);
    else
        rms_bwd_rows(dinp, pw, dout, inp, w, rstd, r0, r1, C, 0);
}

/* ---- LayerNorm ----------------------------------------------------------------------- */

/* sum_i x[i] over a row of C values. */
CT_INLINE float row_sum(const void *x, int64_t C, int bf)
{
    v8 a0 = v8_zero(), a1 = v8_zero();
    int64_t i = 0;
    for (; i + 16 <= C; i += 16) {
        a0 = v8_add(a0, ld8(x, i, bf));
        a1 = v8_add(a1, ld8(x, i + 8, bf));
    }
    if (i + 8 <= C) {
        a0 = v8_add(a0, ld8(x, i, bf));
        i += 8;
    }
    if (i < C) a1 = v8_add(a1, ld8_part(x, i, C - i, bf));
    return v8_hsum(v8_add(a0, a1));
}

/* sum_i (x[i] - m)^2 over a row of C values (the padded tail lanes masked out). */
CT_INLINE float row_sqdev(const void *x, float m, int64_t C, int bf)
{
    v8 mv = v8_dup(m), a0 = v8_zero(), a1 = v8_zero();
    int64_t i = 0;
    for (; i + 16 <= C; i += 16) {
        v8 d0 = v8_sub(ld8(x, i, bf), mv), d1 = v8_sub(ld8(x, i + 8, bf), mv);
        a0 = v8_fmadd(d0, d0, a0);
        a1 = v8_fmadd(d1, d1, a1);
    }
    if (i + 8 <= C) {
        v8 d = v8_sub(ld8(x, i, bf), mv);
        a0 = v8_fmadd(d, d, a0);
        i += 8;
    }
    if (i < C) {
        v8 d = v8_keep(v8_sub(ld8_part(x, i, C - i, bf), mv), C - i);
        a1 = v8_fmadd(d, d, a1);
    }
    return v8_hsum(v8_add(a0, a1));
}

CT_INLINE void ln_fwd_rows(void *out, float *mean, float *rstd, const void *inp, const void *w,
                           const void *b, int64_t r0, int64_t r1, int64_t C, float eps, int bf)
{
    size_t es = bf ? 2 : 4;
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *x = (const unsigned char *)inp + (size_t)(r * C) * es;
        unsigned char *y = (unsigned char *)out + (size_t)(r * C) * es;
        float m = row_sum(x, C, bf) / (float)C;
        float rs = 1.0f / sqrtf(row_sqdev(x, m, C, bf) / (float)C + eps);
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = rs;
        v8 mv = v8_dup(m), rv = v8_dup(rs);
        for (int64_t i = 0; i < C; i += 8) {
            int64_t k = C - i < 8 ? C - i : 8;
            v8 o = v8_mul(v8_sub(ld8k(x, i, k, bf), mv), rv);
            if (w) o = v8_mul(o, ld8k(w, i, k, bf));
            if (b) o = v8_add(o, ld8k(b, i, k, bf));
            st8k(y, i, k, o, bf);
        }
    }
}

static void ln_forward_rows_neon(void *out, float *mean, float *rstd, const void *inp,
                                 const void *w, const void *b, int64_t r0, int64_t r1, int64_t C,
                                 float eps, int bf)
{
    if (bf)
        ln_fwd_rows(out, mean, rstd, inp, w, b, r0, r1, C, eps, 1);
    else
        ln_fwd_rows(out, mean, rstd, inp, w, b, r0, r1, C, eps, 0);
}

/* One vector (k lanes) of the second LayerNorm backward pass. */
CT_INLINE void ln_bwd_vec(void *dx, float *pw, float *pb, const void *g, const void *x,
                          const void *w, v8 mv, v8 rv, v8 s1v, v8 s2v, int64_t i, int64_t k,
                          int bf)
{
    v8 gv = ld8k(g, i, k, bf), xv = ld8k(x, i, k, bf);
    v8 xh = v8_mul(v8_sub(xv, mv), rv), dn = gv;
    if (w) dn = v8_mul(gv, ld8k(w, i, k, bf));
    if (pw) st8k(pw, i, k, v8_fmadd(gv, xh, ld8k(pw, i, k, 0)), 0);
    if (pb) st8k(pb, i, k, v8_add(ld8k(pb, i, k, 0), gv), 0);
    st8k(dx, i, k, v8_mul(v8_fnmadd(xh, s2v, v8_sub(dn, s1v)), rv), bf);
}

CT_INLINE void ln_bwd_rows(void *dinp, float *pw, float *pb, const void *dout, const void *inp,
                           const void *w, const float *mean, const float *rstd, int64_t r0,
                           int64_t r1, int64_t C, int bf)
{
    size_t es = bf ? 2 : 4;
    for (int64_t r = r0; r < r1; r++) {
        size_t off = (size_t)(r * C) * es;
        const unsigned char *x = (const unsigned char *)inp + off;
        const unsigned char *g = (const unsigned char *)dout + off;
        unsigned char *dx = (unsigned char *)dinp + off;
        v8 mv = v8_dup(mean[r]), rv = v8_dup(rstd[r]);
        /* s1 = sum dnorm, s2 = sum dnorm * xhat (padded lanes have dnorm = 0) */
        v8 a1 = v8_zero(), a2 = v8_zero(), b1 = v8_zero(), b2 = v8_zero();
        int64_t i = 0;
        for (; i + 8 <= C; i += 8) {
            v8 xh = v8_mul(v8_sub(ld8(x, i, bf), mv), rv);
            v8 dn = ld8(g, i, bf);
            if (w) dn = v8_mul(dn, ld8(w, i, bf));
            if ((i & 8) == 0) {
                a1 = v8_add(a1, dn);
                a2 = v8_fmadd(dn, xh, a2);
            } else {
                b1 = v8_add(b1, dn);
                b2 = v8_fmadd(dn, xh, b2);
            }
        }
        if (i < C) {
            int64_t k = C - i;
            v8 xh = v8_mul(v8_sub(ld8_part(x, i, k, bf), mv), rv);
            v8 dn = ld8_part(g, i, k, bf);
            if (w) dn = v8_mul(dn, ld8_part(w, i, k, bf));
            b1 = v8_add(b1, dn);
            b2 = v8_fmadd(dn, xh, b2);
        }
        v8 s1v = v8_dup(v8_hsum(v8_add(a1, b1)) / (float)C);
        v8 s2v = v8_dup(v8_hsum(v8_add(a2, b2)) / (float)C);
        for (i = 0; i < C; i += 8)
            ln_bwd_vec(dx, pw, pb, g, x, w, mv, rv, s1v, s2v, i, C - i < 8 ? C - i : 8, bf);
    }
}

static void ln_backward_rows_neon(void *dinp, float *pw, float *pb, const void *dout,
                                  const void *inp, const void *w, const float *mean,
                                  const float *rstd, int64_t r0, int64_t r1, int64_t C, int bf)
{
    if (bf)
        ln_bwd_rows(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C, 1);
    else
        ln_bwd_rows(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C, 0);
}

const ct_norm_kernels ct_norm_neon = {
    .rms_forward_rows = rms_forward_rows_neon,
    .rms_backward_rows = rms_backward_rows_neon,
    .ln_forward_rows = ln_forward_rows_neon,
    .ln_backward_rows = ln_backward_rows_neon,
};
