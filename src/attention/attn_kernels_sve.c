/* AArch64 SVE bodies of the attention tile kernels (see attn_kernels.h), vector-length
 * agnostic: every loop steps by svcntw() lanes under a whilelt predicate. Each element is
 * computed as in attn_kernels_avx2.c (the same FMA chains in k for the tile product, the
 * exp / tanh of simd/simd_sve.h, the same even/odd key partial sums of the online softmax),
 * and none of these kernels reduces across lanes, so the results are bitwise the AVX2
 * bodies' at every vector length. */
#include "attention/attn_kernels.h"

#include "simd/simd_sve.h"

#include <math.h>

#define AI static inline __attribute__((always_inline))

/* ---- GEMM micro-kernel: mr rows x one vector of columns, A broadcast ------------------- */

AI void kern(const int mr, svbool_t pg, int64_t K, const float *A, int64_t ars, int64_t acs,
             const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs)
{
    svfloat32_t c0 = svdup_n_f32(0.0f), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t k = 0; k < K; k++) {
        svfloat32_t b = svld1_f32(pg, B);
        c0 = svmla_n_f32_x(pg, c0, b, A[0]);
        if (mr > 1) c1 = svmla_n_f32_x(pg, c1, b, A[ars]);
        if (mr > 2) c2 = svmla_n_f32_x(pg, c2, b, A[2 * ars]);
        if (mr > 3) c3 = svmla_n_f32_x(pg, c3, b, A[3 * ars]);
        A += acs;
        B += ldb;
    }
#define KSTORE(R, X)                                                                       \
    do {                                                                                   \
        float *p = C + (R) * ldc;                                                          \
        svfloat32_t x = (X);                                                               \
        if (acc) {                                                                         \
            svfloat32_t old = svld1_f32(pg, p);                                            \
            x = rs ? svmla_n_f32_x(pg, x, old, rs[R]) : svadd_f32_x(pg, x, old);           \
        }                                                                                  \
        svst1_f32(pg, p, x);                                                               \
    } while (0)
    KSTORE(0, c0);
    if (mr > 1) KSTORE(1, c1);
    if (mr > 2) KSTORE(2, c2);
    if (mr > 3) KSTORE(3, c3);
#undef KSTORE
}

static void at_gemm_sve(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
                        const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs)
{
    for (int64_t j0 = 0; j0 < N; j0 += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(j0, N);
        for (int64_t i0 = 0; i0 < M; i0 += 4) {
            int mr = M - i0 < 4 ? (int)(M - i0) : 4;
            const float *a = A + i0 * ars, *r = rs ? rs + i0 : NULL;
            float *c = C + i0 * ldc + j0;
            switch (mr) {
            case 1: kern(1, pg, K, a, ars, acs, B + j0, ldb, c, ldc, acc, r); break;
            case 2: kern(2, pg, K, a, ars, acs, B + j0, ldb, c, ldc, acc, r); break;
            case 3: kern(3, pg, K, a, ars, acs, B + j0, ldb, c, ldc, acc, r); break;
            default: kern(4, pg, K, a, ars, acs, B + j0, ldb, c, ldc, acc, r); break;
            }
        }
    }
}

/* ---- column-wise softmax pieces ------------------------------------------------------- */

static void at_softmax_update_sve(float *S, int64_t nk, int64_t ld, int64_t ncols, float *m,
                                  float *l, float *alpha)
{
    for (int64_t i = 0; i < ncols; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, ncols);
        svfloat32_t mo = svld1_f32(pg, m + i), mx = mo;
        float *s = S + i;
        for (int64_t j = 0; j < nk; j++) {
            /* vmaxps(mx, v): v unless mx > v */
            svfloat32_t v = svld1_f32(pg, s + j * ld);
            mx = svsel_f32(svcmpgt_f32(pg, mx, v), mx, v);
        }
        svfloat32_t use = svsel_f32(svcmpeq_n_f32(pg, mx, -INFINITY), svdup_n_f32(0.0f), mx);
        svfloat32_t a = ct_exp_sv(pg, svsub_f32_x(pg, mo, use));
        svfloat32_t sum0 = svdup_n_f32(0.0f), sum1 = sum0;
        int64_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            svfloat32_t p0 = ct_exp_sv(pg, svsub_f32_x(pg, svld1_f32(pg, s + j * ld), use));
            svfloat32_t p1 = ct_exp_sv(pg, svsub_f32_x(pg, svld1_f32(pg, s + (j + 1) * ld), use));
            svst1_f32(pg, s + j * ld, p0);
            svst1_f32(pg, s + (j + 1) * ld, p1);
            sum0 = svadd_f32_x(pg, sum0, p0);
            sum1 = svadd_f32_x(pg, sum1, p1);
        }
        if (j < nk) {
            svfloat32_t p0 = ct_exp_sv(pg, svsub_f32_x(pg, svld1_f32(pg, s + j * ld), use));
            svst1_f32(pg, s + j * ld, p0);
            sum0 = svadd_f32_x(pg, sum0, p0);
        }
        svfloat32_t lv = svmla_f32_x(pg, svadd_f32_x(pg, sum0, sum1), svld1_f32(pg, l + i), a);
        svst1_f32(pg, l + i, lv);
        svst1_f32(pg, m + i, mx);
        svst1_f32(pg, alpha + i, a);
    }
}

static void at_exp_sub_sve(float *S, int64_t nk, int64_t ld, int64_t ncols, const float *lse)
{
    for (int64_t i = 0; i < ncols; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, ncols);
        svfloat32_t lv = svld1_f32(pg, lse + i);
        for (int64_t j = 0; j < nk; j++) {
            float *p = S + j * ld + i;
            svst1_f32(pg, p, ct_exp_sv(pg, svsub_f32_x(pg, svld1_f32(pg, p), lv)));
        }
    }
}

static void at_dsoftmax_sve(const float *P, float *dP, int64_t nk, int64_t ld, int64_t ncols,
                            const float *D)
{
    for (int64_t i = 0; i < ncols; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, ncols);
        svfloat32_t dv = svld1_f32(pg, D + i);
        for (int64_t j = 0; j < nk; j++) {
            float *q = dP + j * ld + i;
            svfloat32_t p = svld1_f32(pg, P + j * ld + i);
            svst1_f32(pg, q, svmul_f32_x(pg, p, svsub_f32_x(pg, svld1_f32(pg, q), dv)));
        }
    }
}

static void at_apply_keep_sve(float *S, int64_t ld, const uint8_t *keep, int64_t kld, int64_t nk,
                              int64_t nq)
{
    const svfloat32_t ninf = svdup_n_f32(-INFINITY);
    for (int64_t j = 0; j < nk; j++) {
        float *s = S + j * ld;
        const uint8_t *k = keep + j * kld;
        for (int64_t i = 0; i < nq; i += (int64_t)svcntw()) {
            svbool_t pg = svwhilelt_b32_s64(i, nq);
            svbool_t drop = svcmpeq_n_u32(pg, svld1ub_u32(pg, k + i), 0);
            svst1_f32(drop, s + i, ninf);
        }
    }
}

/* ---- transposed packing: one gathered vector of a destination row at a time ---------- */

static void at_pack_t_sve(const float *src, int64_t lds, int64_t n, int64_t width, float mult,
                          float *dst, int64_t ldd, int64_t ncols)
{
    for (int64_t i0 = 0; i0 < n; i0 += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i0, n);
        for (int64_t e = 0; e < width; e++) {
            /* lanes i0 + t read src[(i0 + t) * lds + e]; 32-bit indices off a row base */
            const float *base = src + i0 * lds + e;
            float *d = dst + e * ldd + i0;
            if (lds <= INT32_MAX / (int64_t)svcntw()) {
                svint32_t idx = svindex_s32(0, (int32_t)lds);
                svfloat32_t v = svld1_gather_s32index_f32(pg, base, idx);
                svst1_f32(pg, d, svmul_n_f32_x(pg, v, mult));
            } else {
                int64_t cnt = n - i0 < (int64_t)svcntw() ? n - i0 : (int64_t)svcntw();
                for (int64_t t = 0; t < cnt; t++) d[t] = mult * base[t * lds];
            }
        }
    }
    for (int64_t e = 0; e < width; e++)
        for (int64_t i = n; i < ncols; i += (int64_t)svcntw())
            svst1_f32(svwhilelt_b32_s64(i, ncols), dst + e * ldd + i, svdup_n_f32(0.0f));
}

/* ---- soft-capping ---------------------------------------------------------------------- */

static void at_softcap_fwd_sve(float *x, int64_t n, float cap)
{
    float ic = 1.0f / cap;
    for (int64_t i = 0; i < n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        svfloat32_t t = ct_tanh_sv(pg, svmul_n_f32_x(pg, svld1_f32(pg, x + i), ic));
        svst1_f32(pg, x + i, svmul_f32_x(pg, svdup_n_f32(cap), t));
    }
}

static void at_softcap_bwd_sve(const float *s, float *g, int64_t n, float cap)
{
    float ic = 1.0f / cap;
    for (int64_t i = 0; i < n; i += (int64_t)svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, n);
        svfloat32_t t = ct_tanh_sv(pg, svmul_n_f32_x(pg, svld1_f32(pg, s + i), ic));
        svfloat32_t f = svmls_f32_x(pg, svdup_n_f32(1.0f), t, t);
        svst1_f32(pg, g + i, svmul_f32_x(pg, svld1_f32(pg, g + i), f));
    }
}

const ct_attn_kernels ct_attn_sve = {at_gemm_sve,        at_softmax_update_sve, at_exp_sub_sve,
                                     at_dsoftmax_sve,    at_apply_keep_sve,     at_pack_t_sve,
                                     at_softcap_fwd_sve, at_softcap_bwd_sve};
