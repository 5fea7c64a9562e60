/* AArch64 Advanced SIMD bodies of the attention tile kernels (see attn_kernels.h). Every
 * element is computed as in attn_kernels_avx2.c (the same FMA chains in k for the tile
 * product, the same exp / tanh of simd/simd_neon.h, the same even/odd key partial sums of
 * the online softmax), so each result is bitwise the AVX2 body's. */
#include "attention/attn_kernels.h"

#include "simd/simd_neon.h"

#include <math.h>

#define AI static inline __attribute__((always_inline))

/* ---- GEMM micro-kernel: an mr x (4 nv) block of C, A broadcast, B rows loaded ----------- */

AI float32x4_t ldb4(const float *p, int kk) { return kk == 4 ? vld1q_f32(p) : ct_ld4n_part(p, 0, kk, 0); }

AI void kern(const int mr, int64_t nc, int64_t K, const float *A, int64_t ars, int64_t acs,
             const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs)
{
    /* nc in 1..16 columns; vector v covers columns 4v..4v+3 */
    float32x4_t c[4][4];
    int nv = (int)((nc + 3) / 4);
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < 4; v++) c[r][v] = vdupq_n_f32(0.0f);
    for (int64_t k = 0; k < K; k++) {
        float32x4_t b[4];
        for (int v = 0; v < nv; v++) {
            int64_t kk = nc - 4 * v < 4 ? nc - 4 * v : 4;
            b[v] = ldb4(B + 4 * v, (int)kk);
        }
        for (int r = 0; r < mr; r++) {
            float32x4_t a = vdupq_n_f32(A[r * ars]);
            for (int v = 0; v < nv; v++) c[r][v] = vfmaq_f32(c[r][v], a, b[v]);
        }
        A += acs;
        B += ldb;
    }
    for (int r = 0; r < mr; r++) {
        for (int v = 0; v < nv; v++) {
            float *p = C + r * ldc + 4 * v;
            int64_t kk = nc - 4 * v < 4 ? nc - 4 * v : 4;
            float32x4_t x = c[r][v];
            if (acc) {
                float32x4_t old = ldb4(p, (int)kk);
                x = rs ? vfmaq_f32(x, vdupq_n_f32(rs[r]), old) : vaddq_f32(x, old);
            }
            if (kk == 4)
                vst1q_f32(p, x);
            else
                ct_st4n_part(p, 0, kk, x, 0);
        }
    }
}

static void at_gemm_neon(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
                         const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs)
{
    for (int64_t j0 = 0; j0 < N; j0 += 16) {
        int64_t nc = N - j0 < 16 ? N - j0 : 16;
        for (int64_t i0 = 0; i0 < M; i0 += 4) {
            int mr = M - i0 < 4 ? (int)(M - i0) : 4;
            const float *a = A + i0 * ars, *r = rs ? rs + i0 : NULL;
            float *c = C + i0 * ldc + j0;
            switch (mr) {
            case 1: kern(1, nc, K, a, ars, acs, B + j0, ldb, c, ldc, acc, r); break;
            case 2: kern(2, nc, K, a, ars, acs, B + j0, ldb, c, ldc, acc, r); break;
            case 3: kern(3, nc, K, a, ars, acs, B + j0, ldb, c, ldc, acc, r); break;
            default: kern(4, nc, K, a, ars, acs, B + j0, ldb, c, ldc, acc, r); break;
            }
        }
    }
}

/* ---- column-wise softmax pieces (ncols is a multiple of 8, so of 4) ------------------- */

static void at_softmax_update_neon(float *S, int64_t nk, int64_t ld, int64_t ncols, float *m,
                                   float *l, float *alpha)
{
    const float32x4_t ninf = vdupq_n_f32(-INFINITY), zero = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < ncols; i += 4) {
        float32x4_t mo = vld1q_f32(m + i), mx = mo;
        float *s = S + i;
        for (int64_t j = 0; j < nk; j++) {
            /* vmaxps(mx, v): v unless mx > v */
            float32x4_t v = vld1q_f32(s + j * ld);
            mx = vbslq_f32(vcgtq_f32(mx, v), mx, v);
        }
        float32x4_t use = vbslq_f32(vceqq_f32(mx, ninf), zero, mx);
        float32x4_t a = ct_exp_n4(vsubq_f32(mo, use));
        float32x4_t sum0 = zero, sum1 = zero;
        int64_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            float32x4_t p0 = ct_exp_n4(vsubq_f32(vld1q_f32(s + j * ld), use));
            float32x4_t p1 = ct_exp_n4(vsubq_f32(vld1q_f32(s + (j + 1) * ld), use));
            vst1q_f32(s + j * ld, p0);
            vst1q_f32(s + (j + 1) * ld, p1);
            sum0 = vaddq_f32(sum0, p0);
            sum1 = vaddq_f32(sum1, p1);
        }
        if (j < nk) {
            float32x4_t p0 = ct_exp_n4(vsubq_f32(vld1q_f32(s + j * ld), use));
            vst1q_f32(s + j * ld, p0);
            sum0 = vaddq_f32(sum0, p0);
        }
        float32x4_t lv = vfmaq_f32(vaddq_f32(sum0, sum1), vld1q_f32(l + i), a);
        vst1q_f32(l + i, lv);
        vst1q_f32(m + i, mx);
        vst1q_f32(alpha + i, a);
    }
}

static void at_exp_sub_neon(float *S, int64_t nk, int64_t ld, int64_t ncols, const float *lse)
{
    for (int64_t i = 0; i < ncols; i += 4) {
        float32x4_t lv = vld1q_f32(lse + i);
        for (int64_t j = 0; j < nk; j++) {
            float *p = S + j * ld + i;
            vst1q_f32(p, ct_exp_n4(vsubq_f32(vld1q_f32(p), lv)));
        }
    }
}

static void at_dsoftmax_neon(const float *P, float *dP, int64_t nk, int64_t ld, int64_t ncols,
                             const float *D)
{
    for (int64_t i = 0; i < ncols; i += 4) {
        float32x4_t dv = vld1q_f32(D + i);
        for (int64_t j = 0; j < nk; j++) {
            float *q = dP + j * ld + i;
            float32x4_t p = vld1q_f32(P + j * ld + i);
            vst1q_f32(q, vmulq_f32(p, vsubq_f32(vld1q_f32(q), dv)));
        }
    }
}

static void at_apply_keep_neon(float *S, int64_t ld, const uint8_t *keep, int64_t kld, int64_t nk,
                               int64_t nq)
{
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    for (int64_t j = 0; j < nk; j++) {
        float *s = S + j * ld;
        const uint8_t *k = keep + j * kld;
        int64_t i = 0;
        for (; i + 8 <= nq; i += 8) {
            uint8x8_t b = vld1_u8(k + i);
            if (vget_lane_u64(vreinterpret_u64_u8(b), 0) == 0x0101010101010101ULL) continue;
            uint16x8_t w = vmovl_u8(b);
            uint32x4_t d0 = vceqq_u32(vmovl_u16(vget_low_u16(w)), vdupq_n_u32(0));
            uint32x4_t d1 = vceqq_u32(vmovl_u16(vget_high_u16(w)), vdupq_n_u32(0));
            vst1q_f32(s + i, vbslq_f32(d0, ninf, vld1q_f32(s + i)));
            vst1q_f32(s + i + 4, vbslq_f32(d1, ninf, vld1q_f32(s + i + 4)));
        }
        for (; i < nq; i++)
            if (!k[i]) s[i] = -INFINITY;
    }
}

/* ---- transposed packing: 4 x 4 blocks through registers ------------------------------- */

static void at_pack_t_neon(const float *src, int64_t lds, int64_t n, int64_t width, float mult,
                           float *dst, int64_t ldd, int64_t ncols)
{
    float32x4_t mv = vdupq_n_f32(mult);
    int64_t n4 = n & ~(int64_t)3, w4 = width & ~(int64_t)3;
    for (int64_t i0 = 0; i0 < n4; i0 += 4)
        for (int64_t e0 = 0; e0 < w4; e0 += 4) {
            float32x4_t r0 = vld1q_f32(src + i0 * lds + e0), r1 = vld1q_f32(src + (i0 + 1) * lds + e0);
            float32x4_t r2 = vld1q_f32(src + (i0 + 2) * lds + e0), r3 = vld1q_f32(src + (i0 + 3) * lds + e0);
            float32x4x2_t t01 = vtrnq_f32(r0, r1), t23 = vtrnq_f32(r2, r3);
            float32x4_t c0 = vcombine_f32(vget_low_f32(t01.val[0]), vget_low_f32(t23.val[0]));
            float32x4_t c1 = vcombine_f32(vget_low_f32(t01.val[1]), vget_low_f32(t23.val[1]));
            float32x4_t c2 = vcombine_f32(vget_high_f32(t01.val[0]), vget_high_f32(t23.val[0]));
            float32x4_t c3 = vcombine_f32(vget_high_f32(t01.val[1]), vget_high_f32(t23.val[1]));
            vst1q_f32(dst + e0 * ldd + i0, vmulq_f32(mv, c0));
            vst1q_f32(dst + (e0 + 1) * ldd + i0, vmulq_f32(mv, c1));
            vst1q_f32(dst + (e0 + 2) * ldd + i0, vmulq_f32(mv, c2));
            vst1q_f32(dst + (e0 + 3) * ldd + i0, vmulq_f32(mv, c3));
        }
    for (int64_t i = 0; i < n; i++) /* the edges */
        for (int64_t e = i < n4 ? w4 : 0; e < width; e++)
            dst[e * ldd + i] = mult * src[i * lds + e];
    for (int64_t e = 0; e < width; e++)
        for (int64_t i = n; i < ncols; i++)
            dst[e * ldd + i] = 0.0f;
}

/* ---- soft-capping ---------------------------------------------------------------------- */

static void at_softcap_fwd_neon(float *x, int64_t n, float cap)
{
    float32x4_t c = vdupq_n_f32(cap), ic = vdupq_n_f32(1.0f / cap);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(x + i, vmulq_f32(c, ct_tanh_n4(vmulq_f32(vld1q_f32(x + i), ic))));
    if (i < n)
        ct_st4n_part(x, i, n - i, vmulq_f32(c, ct_tanh_n4(vmulq_f32(ct_ld4n_part(x, i, n - i, 0), ic))), 0);
}

static void at_softcap_bwd_neon(const float *s, float *g, int64_t n, float cap)
{
    float32x4_t ic = vdupq_n_f32(1.0f / cap), one = vdupq_n_f32(1.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t t = ct_tanh_n4(vmulq_f32(vld1q_f32(s + i), ic));
        vst1q_f32(g + i, vmulq_f32(vld1q_f32(g + i), vfmsq_f32(one, t, t)));
    }
    if (i < n) {
        float32x4_t t = ct_tanh_n4(vmulq_f32(ct_ld4n_part(s, i, n - i, 0), ic));
        ct_st4n_part(g, i, n - i, vmulq_f32(ct_ld4n_part(g, i, n - i, 0), vfmsq_f32(one, t, t)), 0);
    }
}

const ct_attn_kernels ct_attn_neon = {at_gemm_neon,        at_softmax_update_neon, at_exp_sub_neon,
                                      at_dsoftmax_neon,    at_apply_keep_neon,     at_pack_t_neon,
                                      at_softcap_fwd_neon, at_softcap_bwd_neon};
