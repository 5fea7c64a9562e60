/* AArch64 SVE RMSNorm and LayerNorm row bodies (see norm_kernels.h), vector-length
 * agnostic: every loop steps by svcntw() lanes under a whilelt predicate (the tail is the
 * last, partial predicate; no per-length code). Each element pass does the operations of
 * norm_avx2.c per lane (same fused multiply-adds); row sums use one accumulator updated
 * under the predicate (inactive lanes keep their value) and fold it by svaddv, whose order
 * depends on the vector length (see simd/simd_sve.h). */
#include "ops/norm_kernels.h"
#include "simd/simd_sve.h"

#define CT_INLINE static inline __attribute__((always_inline))

/* ---- RMSNorm ------------------------------------------------------------------------- */

/* sum_i x[i] * y[i] over a row of C values (x may be y). */
CT_INLINE float row_dot(const void *x, const void *y, int64_t C, int bf)
{
    svfloat32_t acc = svdup_n_f32(0.0f);
    for (int64_t i = 0; i < C; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, C);
        acc = svmla_f32_m(pg, acc, ct_ld_sv(pg, x, i, bf), ct_ld_sv(pg, y, i, bf));
    }
    return svaddv_f32(svptrue_b32(), acc);
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
        for (int64_t i = 0; i < C; i += (int64_t)svcntw()) {
            svbool_t pg = svwhilelt_b32_s64(i, C);
            svfloat32_t v = svmul_n_f32_x(pg, ct_ld_sv(pg, x, i, bf), rs);
            if (w) v = svmul_f32_x(pg, v, ct_ld_sv(pg, w, i, bf));
            ct_st_sv(pg, y, i, v, bf);
        }
    }
}

static void rms_forward_rows_sve(void *out, float *rstd, const void *inp, const void *w,
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
    const int64_t VL = (int64_t)svcntw();
    for (int64_t r = r0; r < r1; r++) {
        size_t off = (size_t)(r * C) * es;
        const unsigned char *x = (const unsigned char *)inp + off;
        const unsigned char *g = (const unsigned char *)dout + off;
        unsigned char *dx = (unsigned char *)dinp + off;
        float rs = rstd[r];
        /* dot = sum_c (g w)_c x_c */
        svfloat32_t acc = svdup_n_f32(0.0f);
        for (int64_t i = 0; i < C; i += VL) {
            svbool_t pg = svwhilelt_b32_s64(i, C);
            svfloat32_t gw = ct_ld_sv(pg, g, i, bf);
            if (w) gw = svmul_f32_x(pg, gw, ct_ld_sv(pg, w, i, bf));
            acc = svmla_f32_m(pg, acc, gw, ct_ld_sv(pg, x, i, bf));
        }
        float dot = svaddv_f32(svptrue_b32(), acc);
        svfloat32_t rv = svdup_n_f32(rs), kv = svdup_n_f32(dot / (float)C * rs * rs * rs);
        for (int64_t i = 0; i < C; i += VL) {
            svbool_t pg = svwhilelt_b32_s64(i, C);
            svfloat32_t gv = ct_ld_sv(pg, g, i, bf), xv = ct_ld_sv(pg, x, i, bf), gw = gv;
            if (w) gw = svmul_f32_x(pg, gv, ct_ld_sv(pg, w, i, bf));
            if (pw) {
                svfloat32_t p = svld1_f32(pg, pw + i);
                p = svmla_f32_x(pg, p, gv, svmul_f32_x(pg, xv, rv));
                svst1_f32(pg, pw + i, p);
            }
            /* rstd * gw - k * x, fused (the AVX2 fmsub) */
            svfloat32_t d = svnmls_f32_x(pg, svmul_f32_x(pg, kv, xv), rv, gw);
            ct_st_sv(pg, dx, i, d, bf);
        }
    }
}

static void rms_backward_rows_sve(void *dinp, float *pw, const void *dout, const void *inp,
                                  const void *w, const float *rstd, int64_t r0, int64_t r1,
                                  int64_t C, int bf)
{
    if (bf)
        rms_bwd_rows(dinp, pw, dout, inp, w, rstd, r0, r1, C, 1);
    else
        rms_bwd_rows(dinp, pw, dout, inp, w, rstd, r0, r1, C, 0);
}

/* ---- LayerNorm ----------------------------------------------------------------------- */

CT_INLINE void ln_fwd_rows(void *out, float *mean, float *rstd, const void *inp, const void *w,
                           const void *b, int64_t r0, int64_t r1, int64_t C, float eps, int bf)
{
    size_t es = bf ? 2 : 4;
    const int64_t VL = (int64_t)svcntw();
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *x = (const unsigned char *)inp + (size_t)(r * C) * es;
        unsigned char *y = (unsigned char *)out + (size_t)(r * C) * es;
        svfloat32_t acc = svdup_n_f32(0.0f);
        for (int64_t i = 0; i < C; i += VL) {
            svbool_t pg = svwhilelt_b32_s64(i, C);
            acc = svadd_f32_m(pg, acc, ct_ld_sv(pg, x, i, bf));
        }
        float m = svaddv_f32(svptrue_b32(), acc) / (float)C;
        svfloat32_t mv = svdup_n_f32(m);
        acc = svdup_n_f32(0.0f);
        for (int64_t i = 0; i < C; i += VL) {
            svbool_t pg = svwhilelt_b32_s64(i, C);
            svfloat32_t d = svsub_f32_x(pg, ct_ld_sv(pg, x, i, bf), mv);
            acc = svmla_f32_m(pg, acc, d, d); /* inactive lanes keep acc */
        }
        float rs = 1.0f / sqrtf(svaddv_f32(svptrue_b32(), acc) / (float)C + eps);
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = rs;
        for (int64_t i = 0; i < C; i += VL) {
            svbool_t pg = svwhilelt_b32_s64(i, C);
            svfloat32_t o = svmul_n_f32_x(pg, svsub_f32_x(pg, ct_ld_sv(pg, x, i, bf), mv), rs);
            if (w) o = svmul_f32_x(pg, o, ct_ld_sv(pg, w, i, bf));
            if (b) o = svadd_f32_x(pg, o, ct_ld_sv(pg, b, i, bf));
            ct_st_sv(pg, y, i, o, bf);
        }
    }
}

static void ln_forward_rows_sve(void *out, float *mean, float *rstd, const void *inp,
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
    const int64_t VL = (int64_t)svcntw();
    for (int64_t r = r0; r < r1; r++) {
        size_t off = (size_t)(r * C) * es;
        const unsigned char *x = (const unsigned char *)inp + off;
        const unsigned char *g = (const unsigned char *)dout + off;
        unsigned char *dx = (unsigned char *)dinp + off;
        svfloat32_t mv = svdup_n_f32(mean[r]), rv = svdup_n_f32(rstd[r]);
        /* s1 = sum dnorm, s2 = sum dnorm * xhat */
        svfloat32_t a1 = svdup_n_f32(0.0f), a2 = svdup_n_f32(0.0f);
        for (int64_t i = 0; i < C; i += VL) {
            svbool_t pg = svwhilelt_b32_s64(i, C);
            svfloat32_t xh = svmul_f32_x(pg, svsub_f32_x(pg, ct_ld_sv(pg, x, i, bf), mv), rv);
            svfloat32_t dn = ct_ld_sv(pg, g, i, bf);
            if (w) dn = svmul_f32_x(pg, dn, ct_ld_sv(pg, w, i, bf));
            a1 = svadd_f32_m(pg, a1, dn);
            a2 = svmla_f32_m(pg, a2, dn, xh);
        }
        svfloat32_t s1v = svdup_n_f32(svaddv_f32(svptrue_b32(), a1) / (float)C);
        svfloat32_t s2v = svdup_n_f32(svaddv_f32(svptrue_b32(), a2) / (float)C);
        for (int64_t i = 0; i < C; i += VL) {
            svbool_t pg = svwhilelt_b32_s64(i, C);
            svfloat32_t gv = ct_ld_sv(pg, g, i, bf);
            svfloat32_t xh = svmul_f32_x(pg, svsub_f32_x(pg, ct_ld_sv(pg, x, i, bf), mv), rv);
            svfloat32_t dn = gv;
            if (w) dn = svmul_f32_x(pg, gv, ct_ld_sv(pg, w, i, bf));
            if (pw) svst1_f32(pg, pw + i, svmla_f32_x(pg, svld1_f32(pg, pw + i), gv, xh));
            if (pb) svst1_f32(pg, pb + i, svadd_f32_x(pg, svld1_f32(pg, pb + i), gv));
            /* ((dn - s1) - xhat * s2) * rstd, the AVX2 fnmadd */
            svfloat32_t d = svmls_f32_x(pg, svsub_f32_x(pg, dn, s1v), xh, s2v);
            ct_st_sv(pg, dx, i, svmul_f32_x(pg, d, rv), bf);
        }
    }
}

static void ln_backward_rows_sve(void *dinp, float *pw, float *pb, const void *dout,
                                 const void *inp, const void *w, const float *mean,
                                 const float *rstd, int64_t r0, int64_t r1, int64_t C, int bf)
{
    if (bf)
        ln_bwd_rows(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C, 1);
    else
        ln_bwd_rows(dinp, pw, pb, dout, inp, w, mean, rstd, r0, r1, C, 0);
}

const ct_norm_kernels ct_norm_sve = {
    .rms_forward_rows = rms_forward_rows_sve,
    .rms_backward_rows = rms_backward_rows_sve,
    .ln_forward_rows = ln_forward_rows_sve,
    .ln_backward_rows = ln_backward_rows_sve,
};
