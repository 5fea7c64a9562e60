/* AVX-512 RMSNorm and LayerNorm row bodies (see norm_kernels.h), bitwise the AVX2 bodies of
 * norm_avx2.c. The AVX2 row sums keep two 8-lane accumulators: one for the 8-blocks at
 * i % 16 == 0, one for those at i % 16 == 8 and for a partial tail, folded as
 * ct_hsum256(a0 + a1). Here they are the low and high halves of one 16-lane accumulator, and
 * a tail shorter than 8 is loaded into the high half (tail16), so every sum is the AVX2 sum
 * bit for bit; the element passes run 16 lanes with a masked tail (simd/simd_avx512.h). */
#include "ops/norm_kernels.h"
#include "simd/simd_avx512.h"

#define CT_INLINE static inline __attribute__((always_inline))

CT_INLINE __mmask16 mask_n(int64_t k) { return (__mmask16)((1u << k) - 1); }

/* ct_hsum256(a0 + a1) of the AVX2 bodies. */
CT_INLINE float fold16(__m512 a) { return ct_hsum256(_mm256_add_ps(cv_lo8(a), cv_hi8(a))); }

/* The last r (0 < r < 16) elements of a row from index i, in the lanes the AVX2 accumulators
 * give them (r >= 8: lanes 0 .. r-1; r < 8: lanes 8 .. 8+r-1), zeros elsewhere; *valid gets
 * the lanes that hold elements. */
CT_INLINE __m512 tail16(const void *p, int64_t i, int64_t r, int bf, __mmask16 *valid)
{
    __m512 v = cv_ld_part(p, i, r, bf);
    if (r >= 8) {
        if (valid) *valid = mask_n(r);
        return v;
    }
    if (valid) *valid = (__mmask16)(mask_n(r) << 8);
    return _mm512_insertf32x8(_mm512_setzero_ps(), cv_lo8(v), 1);
}

/* The k (1 .. 16) elements at i, zero-padded. */
CT_INLINE __m512 ld_k(const void *p, int64_t i, int64_t k, int bf)
{
    return k == 16 ? cv_ld(p, i, bf) : cv_ld_part(p, i, k, bf);
}

CT_INLINE void st_k(void *p, int64_t i, int64_t k, __m512 v, int bf)
{
    if (k == 16)
        cv_st(p, i, v, bf);
    else
        cv_st_part(p, i, k, v, bf);
}

/* ---- RMSNorm ------------------------------------------------------------------------- */

/* sum_i x[i] * y[i] over a row of C values (x may be y). */
CT_INLINE float row_dot(const void *x, const void *y, int64_t C, int bf)
{
    __m512 a = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= C; i += 16) a = _mm512_fmadd_ps(cv_ld(x, i, bf), cv_ld(y, i, bf), a);
    if (i < C) a = _mm512_fmadd_ps(tail16(x, i, C - i, bf, NULL), tail16(y, i, C - i, bf, NULL), a);
    return fold16(a);
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
        __m512 rv = _mm512_set1_ps(rs);
        for (int64_t i = 0; i < C; i += 16) {
            int64_t k = C - i < 16 ? C - i : 16;
            __m512 v = _mm512_mul_ps(ld_k(x, i, k, bf), rv);
            if (w) v = _mm512_mul_ps(v, ld_k(w, i, k, bf));
            st_k(y, i, k, v, bf);
        }
    }
}

static void rms_forward_rows_avx512(void *out, float *rstd, const void *inp, const void *w,
                                    int64_t r0, int64_t r1, int64_t C, float eps, int bf)
{
    if (bf)
        rms_fwd_rows(out, rstd, inp, w, r0, r1, C, eps, 1);
    else
        rms_fwd_rows(out, rstd, inp, w, r0, r1, C, eps, 0);
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
        __m512 a = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= C; i += 16) {
            __m512 gw = cv_ld(g, i, bf);
            if (w) gw = _mm512_mul_ps(gw, cv_ld(w, i, bf));
            a = _mm512_fmadd_ps(gw, cv_ld(x, i, bf), a);
        }
        if (i < C) {
            __m512 gw = tail16(g, i, C - i, bf, NULL);
            if (w) gw = _mm512_mul_ps(gw, tail16(w, i, C - i, bf, NULL));
            a = _mm512_fmadd_ps(gw, tail16(x, i, C - i, bf, NULL), a);
        }
        float dot = fold16(a);
        __m512 rv = _mm512_set1_ps(rs);
        __m512 kv = _mm512_set1_ps(dot / (float)C * rs * rs * rs);
        for (i = 0; i < C; i += 16) {
            int64_t k = C - i < 16 ? C - i : 16;
            __m512 gv = ld_k(g, i, k, bf), xv = ld_k(x, i, k, bf), gw = gv;
            if (w) gw = _mm512_mul_ps(gv, ld_k(w, i, k, bf));
            if (pw) st_k(pw, i, k, _mm512_fmadd_ps(gv, _mm512_mul_ps(xv, rv), ld_k(pw, i, k, 0)), 0);
            st_k(dx, i, k, _mm512_fmsub_ps(rv, gw, _mm512_mul_ps(kv, xv)), bf);
        }
    }
}

static void rms_backward_rows_avx512(void *dinp, float *pw, const void *dout, const void *inp,
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
    __m512 a = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= C; i += 16) a = _mm512_add_ps(a, cv_ld(x, i, bf));
    if (i < C) a = _mm512_add_ps(a, tail16(x, i, C - i, bf, NULL));
    return fold16(a);
}

/* sum_i (x[i] - m)^2 over a row of C values (the lanes without an element give 0). */
CT_INLINE float row_sqdev(const void *x, float m, int64_t C, int bf)
{
    __m512 mv = _mm512_set1_ps(m), a = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= C; i += 16) {
        __m512 d = _mm512_sub_ps(cv_ld(x, i, bf), mv);
        a = _mm512_fmadd_ps(d, d, a);
    }
    if (i < C) {
        __mmask16 valid;
        __m512 t = tail16(x, i, C - i, bf, &valid);
        __m512 d = _mm512_maskz_sub_ps(valid, t, mv);
        a = _mm512_fmadd_ps(d, d, a);
    }
    return fold16(a);
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
        __m512 mv = _mm512_set1_ps(m), rv = _mm512_set1_ps(rs);
        for (int64_t i = 0; i < C; i += 16) {
            int64_t k = C - i < 16 ? C - i : 16;
            __m512 o = _mm512_mul_ps(_mm512_sub_ps(ld_k(x, i, k, bf), mv), rv);
            if (w) o = _mm512_mul_ps(o, ld_k(w, i, k, bf));
            if (b) o = _mm512_add_ps(o, ld_k(b, i, k, bf));
            st_k(y, i, k, o, bf);
        }
    }
}

static void ln_forward_rows_avx512(void *out, float *mean, float *rstd, const void *inp,
                                   const void *w, const void *b, int64_t r0, int64_t r1, int64_t C,
                                   float eps, int bf)
{
    if (bf)
        ln_fwd_rows(out, mean, rstd, inp, w, b, r0, r1, C, eps, 1);
    else
        ln_fwd_rows(out, mean, rstd, inp, w, b, r0, r1, C, eps, 0);
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
        __m512 mv = _mm512_set1_ps(mean[r]), rv = _mm512_set1_ps(rstd[r]);
        /* s1 = sum dnorm, s2 = sum dnorm * xhat (lanes without an element have dnorm = 0) */
        __m512 a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= C; i += 16) {
            __m512 xh = _mm512_mul_ps(_mm512_sub_ps(cv_ld(x, i, bf), mv), rv);
            __m512 dn = cv_ld(g, i, bf);
            if (w) dn = _mm512_mul_ps(dn, cv_ld(w, i, bf));
            a1 = _mm512_add_ps(a1, dn);
            a2 = _mm512_fmadd_ps(dn, xh, a2);
        }
        if (i < C) {
            __m512 xh = _mm512_mul_ps(_mm512_sub_ps(tail16(x, i, C - i, bf, NULL), mv), rv);
            __m512 dn = tail16(g, i, C - i, bf, NULL);
            if (w) dn = _mm512_mul_ps(dn, tail16(w, i, C - i, bf, NULL));
            a1 = _mm512_add_ps(a1, dn);
            a2 = _mm512_fmadd_ps(dn, xh, a2);
        }
        __m512 s1v = _mm512_set1_ps(fold16(a1) / (float)C);
        __m512 s2v = _mm512_set1_ps(fold16(a2) / (float)C);
        for (i = 0; i < C; i += 16) {
            int64_t k = C - i < 16 ? C - i : 16;
            __m512 gv = ld_k(g, i, k, bf), xv = ld_k(x, i, k, bf);
            __m512 xh = _mm512_mul_ps(_mm512_sub_ps(xv, mv), rv), dn = gv;
            if (w) dn = _mm512_mul_ps(gv, ld_k(w, i, k, bf));
            if (pw) st_k(pw, i, k, _mm512_fmadd_ps(gv, xh, ld_k(pw, i, k, 0)), 0);
            if (pb) st_k(pb, i, k, _mm512_add_ps(ld_k(pb, i, k, 0), gv), 0);
            st_k(dx, i, k, _mm512_mul_ps(_mm512_fnmadd_ps(xh, s2v, _mm512_sub_ps(dn, s1v)), rv), bf);
        }
    }
}

static void ln_backward_rows_avx512(void *dinp, float *pw, float *pb, const void *dout,
                                    const void *inp, const void *w, const float *mean,
                                    const float *rstd, int64_t r0, int64_t r1, int64_t C, int bf)
{
    if (bf)
        ln_bwd_rows(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C, 1);
    else
        ln_bwd_rows(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C, 0);
}

const ct_norm_kernels ct_norm_avx512 = {
    .rms_forward_rows = rms_forward_rows_avx512,
    .rms_backward_rows = rms_backward_rows_avx512,
    .ln_forward_rows = ln_forward_rows_avx512,
    .ln_backward_rows = ln_backward_rows_avx512,
};
