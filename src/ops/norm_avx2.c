/* AVX2 + FMA RMSNorm and LayerNorm row bodies (see norm_kernels.h). Row sums use two
 * 8-lane accumulators folded by ct_hsum256; tails go through zero-padded vectors (masked
 * where a padded lane would not contribute zero). */
#include "ops/norm_kernels.h"
#include "simd/simd_avx2.h"

#define CT_INLINE static inline __attribute__((always_inline))

/* ---- RMSNorm ------------------------------------------------------------------------- */

/* sum_i x[i] * y[i] over a row of C values (x may be y). */
CT_INLINE float row_dot(const void *x, const void *y, int64_t C, int bf)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= C; i += 16) {
        a0 = _mm256_fmadd_ps(ct_ld8(x, i, bf), ct_ld8(y, i, bf), a0);
        a1 = _mm256_fmadd_ps(ct_ld8(x, i + 8, bf), ct_ld8(y, i + 8, bf), a1);
    }
    if (i + 8 <= C) {
        a0 = _mm256_fmadd_ps(ct_ld8(x, i, bf), ct_ld8(y, i, bf), a0);
        i += 8;
    }
    if (i < C) a1 = _mm256_fmadd_ps(ct_ld8_part(x, i, C - i, bf), ct_ld8_part(y, i, C - i, bf), a1);
    return ct_hsum256(_mm256_add_ps(a0, a1));
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
        __m256 rv = _mm256_set1_ps(rs);
        int64_t i = 0;
        for (; i + 8 <= C; i += 8) {
            __m256 v = _mm256_mul_ps(ct_ld8(x, i, bf), rv);
            if (w) v = _mm256_mul_ps(v, ct_ld8(w, i, bf));
            ct_st8(y, i, v, bf);
        }
        if (i < C) {
            int64_t k = C - i;
            __m256 v = _mm256_mul_ps(ct_ld8_part(x, i, k, bf), rv);
            if (w) v = _mm256_mul_ps(v, ct_ld8_part(w, i, k, bf));
            ct_st8_part(y, i, k, v, bf);
        }
    }
}

/* Rows [r0, r1) of the RMSNorm forward (see ct_rmsnorm_forward). */
static void ct_rmsnorm_forward_rows_avx2(void *out, float *rstd, const void *inp, const void *w,
                                  int64_t r0, int64_t r1, int64_t C, float eps, int bf)
{
    if (bf)
        rms_fwd_rows(out, rstd, inp, w, r0, r1, C, eps, 1);
    else
        rms_fwd_rows(out, rstd, inp, w, r0, r1, C, eps, 0);
}

CT_INLINE void rms_bwd_vec(void *dx, float *pw, const void *g, const void *x, const void *w,
                           __m256 rv, __m256 kv, int64_t i, int64_t k, int bf)
{
    __m256 gv = k == 8 ? ct_ld8(g, i, bf) : ct_ld8_part(g, i, k, bf);
    __m256 xv = k == 8 ? ct_ld8(x, i, bf) : ct_ld8_part(x, i, k, bf);
    __m256 gw = gv;
    if (w) gw = _mm256_mul_ps(gv, k == 8 ? ct_ld8(w, i, bf) : ct_ld8_part(w, i, k, bf));
    if (pw) {
        __m256 p = k == 8 ? ct_ld8(pw, i, 0) : ct_ld8_part(pw, i, k, 0);
        p = _mm256_fmadd_ps(gv, _mm256_mul_ps(xv, rv), p);
        if (k == 8)
            ct_st8(pw, i, p, 0);
        else
            ct_st8_part(pw, i, k, p, 0);
    }
    __m256 d = _mm256_fmsub_ps(rv, gw, _mm256_mul_ps(kv, xv));
    if (k == 8)
        ct_st8(dx, i, d, bf);
    else
        ct_st8_part(dx, i, k, d, bf);
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
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= C; i += 8) {
            __m256 gw = ct_ld8(g, i, bf);
            if (w) gw = _mm256_mul_ps(gw, ct_ld8(w, i, bf));
            if ((i & 8) == 0)
                a0 = _mm256_fmadd_ps(gw, ct_ld8(x, i, bf), a0);
            else
                a1 = _mm256_fmadd_ps(gw, ct_ld8(x, i, bf), a1);
        }
        if (i < C) {
            __m256 gw = ct_ld8_part(g, i, C - i, bf);
            if (w) gw = _mm256_mul_ps(gw, ct_ld8_part(w, i, C - i, bf));
            a1 = _mm256_fmadd_ps(gw, ct_ld8_part(x, i, C - i, bf), a1);
        }
        float dot = ct_hsum256(_mm256_add_ps(a0, a1));
        __m256 rv = _mm256_set1_ps(rs);
        __m256 kv = _mm256_set1_ps(dot / (float)C * rs * rs * rs);
        for (i = 0; i + 8 <= C; i += 8)
            rms_bwd_vec(dx, pw, g, x, w, rv, kv, i, 8, bf);
        if (i < C) rms_bwd_vec(dx, pw, g, x, w, rv, kv, i, C - i, bf);
    }
}

/* Rows [r0, r1) of the RMSNorm backward: dinp written; pw[C] (NULL to skip) += dout * xhat. */
static void ct_rmsnorm_backward_rows_avx2(void *dinp, float *pw, const void *dout, const void *inp,
                                   const void *w, const float *rstd, int64_t r0, int64_t r1,
                                   int64_t C, int bf)
{
    if (bf)
        rms_bwd_rows(dinp, pw, dout, inp, w, rstd, r0, r1, C, 1);
    else
        rms_bwd_rows(dinp, pw, dout, inp, w, rstd, r0, r1, C, 0);
}

/* ---- LayerNorm ----------------------------------------------------------------------- */

/* Lanes [0, k) all ones, the rest zero (0 < k < 8). */
CT_INLINE __m256 lane_mask(int64_t k)
{
    return _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/* sum_i x[i] over a row of C values. */
CT_INLINE float row_sum(const void *x, int64_t C, int bf)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= C; i += 16) {
        a0 = _mm256_add_ps(a0, ct_ld8(x, i, bf));
        a1 = _mm256_add_ps(a1, ct_ld8(x, i + 8, bf));
    }
    if (i + 8 <= C) {
        a0 = _mm256_add_ps(a0, ct_ld8(x, i, bf));
        i += 8;
    }
    if (i < C) a1 = _mm256_add_ps(a1, ct_ld8_part(x, i, C - i, bf));
    return ct_hsum256(_mm256_add_ps(a0, a1));
}

/* sum_i (x[i] - m)^2 over a row of C values (the padded tail lanes masked out). */
CT_INLINE float row_sqdev(const void *x, float m, int64_t C, int bf)
{
    __m256 mv = _mm256_set1_ps(m), a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= C; i += 16) {
        __m256 d0 = _mm256_sub_ps(ct_ld8(x, i, bf), mv), d1 = _mm256_sub_ps(ct_ld8(x, i + 8, bf), mv);
        a0 = _mm256_fmadd_ps(d0, d0, a0);
        a1 = _mm256_fmadd_ps(d1, d1, a1);
    }
    if (i + 8 <= C) {
        __m256 d = _mm256_sub_ps(ct_ld8(x, i, bf), mv);
        a0 = _mm256_fmadd_ps(d, d, a0);
        i += 8;
    }
    if (i < C) {
        __m256 d = _mm256_and_ps(_mm256_sub_ps(ct_ld8_part(x, i, C - i, bf), mv), lane_mask(C - i));
        a1 = _mm256_fmadd_ps(d, d, a1);
    }
    return ct_hsum256(_mm256_add_ps(a0, a1));
}

CT_INLINE __m256 ln_out_vec(__m256 xv, __m256 mv, __m256 rv, const void *w, const void *b,
                            int64_t i, int64_t k, int bf)
{
    __m256 o = _mm256_mul_ps(_mm256_sub_ps(xv, mv), rv);
    if (w) o = _mm256_mul_ps(o, k == 8 ? ct_ld8(w, i, bf) : ct_ld8_part(w, i, k, bf));
    if (b) o = _mm256_add_ps(o, k == 8 ? ct_ld8(b, i, bf) : ct_ld8_part(b, i, k, bf));
    return o;
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
        __m256 mv = _mm256_set1_ps(m), rv = _mm256_set1_ps(rs);
        int64_t i = 0;
        for (; i + 8 <= C; i += 8)
            ct_st8(y, i, ln_out_vec(ct_ld8(x, i, bf), mv, rv, w, b, i, 8, bf), bf);
        if (i < C) {
            int64_t k = C - i;
            ct_st8_part(y, i, k, ln_out_vec(ct_ld8_part(x, i, k, bf), mv, rv, w, b, i, k, bf), bf);
        }
    }
}

static void ln_forward_rows_avx2(void *out, float *mean, float *rstd, const void *inp,
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
                          const void *w, __m256 mv, __m256 rv, __m256 s1v, __m256 s2v, int64_t i,
                          int64_t k, int bf)
{
    __m256 gv = k == 8 ? ct_ld8(g, i, bf) : ct_ld8_part(g, i, k, bf);
    __m256 xv = k == 8 ? ct_ld8(x, i, bf) : ct_ld8_part(x, i, k, bf);
    __m256 xh = _mm256_mul_ps(_mm256_sub_ps(xv, mv), rv), dn = gv;
    if (w) dn = _mm256_mul_ps(gv, k == 8 ? ct_ld8(w, i, bf) : ct_ld8_part(w, i, k, bf));
    if (pw) {
        __m256 p = k == 8 ? ct_ld8(pw, i, 0) : ct_ld8_part(pw, i, k, 0);
        p = _mm256_fmadd_ps(gv, xh, p);
        if (k == 8)
            ct_st8(pw, i, p, 0);
        else
            ct_st8_part(pw, i, k, p, 0);
    }
    if (pb) {
        __m256 p = _mm256_add_ps(k == 8 ? ct_ld8(pb, i, 0) : ct_ld8_part(pb, i, k, 0), gv);
        if (k == 8)
            ct_st8(pb, i, p, 0);
        else
            ct_st8_part(pb, i, k, p, 0);
    }
    __m256 d = _mm256_mul_ps(_mm256_fnmadd_ps(xh, s2v, _mm256_sub_ps(dn, s1v)), rv);
    if (k == 8)
        ct_st8(dx, i, d, bf);
    else
        ct_st8_part(dx, i, k, d, bf);
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
        __m256 mv = _mm256_set1_ps(mean[r]), rv = _mm256_set1_ps(rstd[r]);
        /* s1 = sum dnorm, s2 = sum dnorm * xhat (padded lanes have dnorm = 0) */
        __m256 a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps();
        __m256 b1 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= C; i += 8) {
            __m256 xh = _mm256_mul_ps(_mm256_sub_ps(ct_ld8(x, i, bf), mv), rv);
            __m256 dn = ct_ld8(g, i, bf);
            if (w) dn = _mm256_mul_ps(dn, ct_ld8(w, i, bf));
            if ((i & 8) == 0) {
                a1 = _mm256_add_ps(a1, dn);
                a2 = _mm256_fmadd_ps(dn, xh, a2);
            } else {
                b1 = _mm256_add_ps(b1, dn);
                b2 = _mm256_fmadd_ps(dn, xh, b2);
            }
        }
        if (i < C) {
            int64_t k = C - i;
            __m256 xh = _mm256_mul_ps(_mm256_sub_ps(ct_ld8_part(x, i, k, bf), mv), rv);
            __m256 dn = ct_ld8_part(g, i, k, bf);
            if (w) dn = _mm256_mul_ps(dn, ct_ld8_part(w, i, k, bf));
            b1 = _mm256_add_ps(b1, dn);
            b2 = _mm256_fmadd_ps(dn, xh, b2);
        }
        __m256 s1v = _mm256_set1_ps(ct_hsum256(_mm256_add_ps(a1, b1)) / (float)C);
        __m256 s2v = _mm256_set1_ps(ct_hsum256(_mm256_add_ps(a2, b2)) / (float)C);
        for (i = 0; i + 8 <= C; i += 8)
            ln_bwd_vec(dx, pw, pb, g, x, w, mv, rv, s1v, s2v, i, 8, bf);
        if (i < C) ln_bwd_vec(dx, pw, pb, g, x, w, mv, rv, s1v, s2v, i, C - i, bf);
    }
}

static void ln_backward_rows_avx2(void *dinp, float *pw, float *pb, const void *dout,
                                  const void *inp, const void *w, const float *mean,
                                  const float *rstd, int64_t r0, int64_t r1, int64_t C, int bf)
{
    if (bf)
        ln_bwd_rows(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C, 1);
    else
        ln_bwd_rows(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C, 0);
}

const ct_norm_kernels ct_norm_avx2 = {
    .rms_forward_rows = ct_rmsnorm_forward_rows_avx2,
    .rms_backward_rows = ct_rmsnorm_backward_rows_avx2,
    .ln_forward_rows = ln_forward_rows_avx2,
    .ln_backward_rows = ln_backward_rows_avx2,
};
