/* AVX2 + FMA bodies of the attention tile kernels (see attn_kernels.h). */
#include "attention/attn_kernels.h"

#include "simd/simd_avx2.h"

#include <immintrin.h>
#include <math.h>

#define AI static inline __attribute__((always_inline))

/* ---- GEMM micro-kernel: an mr x (8 nv) block of C, A broadcast, B rows loaded ----------- */

AI void kern(const int mr, const int nv, const int masked, __m256i mk0, __m256i mk1, int64_t K,
             const float *A, int64_t ars, int64_t acs, const float *B, int64_t ldb, float *C,
             int64_t ldc, bool acc, const float *rs)
{
    __m256 c[6][2];
    for (int r = 0; r < 6; r++)
        c[r][0] = c[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m256 b0 = masked ? _mm256_maskload_ps(B, mk0) : _mm256_loadu_ps(B);
        __m256 b1 = _mm256_setzero_ps();
        if (nv == 2) b1 = masked ? _mm256_maskload_ps(B + 8, mk1) : _mm256_loadu_ps(B + 8);
        for (int r = 0; r < mr; r++) {
            __m256 a = _mm256_broadcast_ss(A + r * ars);
            c[r][0] = _mm256_fmadd_ps(a, b0, c[r][0]);
            if (nv == 2) c[r][1] = _mm256_fmadd_ps(a, b1, c[r][1]);
        }
        A += acs;
        B += ldb;
    }
    for (int r = 0; r < mr; r++) {
        for (int v = 0; v < nv; v++) {
            float *p = C + r * ldc + 8 * v;
            __m256i mk = v ? mk1 : mk0;
            __m256 x = c[r][v];
            if (acc) {
                __m256 old = masked ? _mm256_maskload_ps(p, mk) : _mm256_loadu_ps(p);
                x = rs ? _mm256_fmadd_ps(_mm256_set1_ps(rs[r]), old, x) : _mm256_add_ps(x, old);
            }
            if (masked)
                _mm256_maskstore_ps(p, mk, x);
            else
                _mm256_storeu_ps(p, x);
        }
    }
}

#define KERN_ARGS                                                                                  \
    mk0, mk1, K, A + i0 *ars, ars, acs, B + j0, ldb, C + i0 *ldc + j0, ldc, acc, rs ? rs + i0 : NULL
#define KERN_CASE(MR)                                                                              \
    case MR:                                                                                       \
        if (nv == 2) {                                                                             \
            if (masked)                                                                            \
                kern(MR, 2, 1, KERN_ARGS);                                                         \
            else                                                                                   \
                kern(MR, 2, 0, KERN_ARGS);                                                         \
        } else {                                                                                   \
            if (masked)                                                                            \
                kern(MR, 1, 1, KERN_ARGS);                                                         \
            else                                                                                   \
                kern(MR, 1, 0, KERN_ARGS);                                                         \
        }                                                                                          \
        break;

void at_gemm_avx2(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
                  const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs)
{
    for (int64_t j0 = 0; j0 < N; j0 += 16) {
        int nr = N - j0 < 16 ? (int)(N - j0) : 16;
        int nv = nr > 8 ? 2 : 1;
        int masked = nr != 8 * nv;
        int n0 = nr < 8 ? nr : 8, n1 = nr - n0;
        __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i mk0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(n0), lane);
        __m256i mk1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(n1), lane);
        for (int64_t i0 = 0; i0 < M; i0 += 6) {
            int mr = M - i0 < 6 ? (int)(M - i0) : 6;
            switch (mr) {
                KERN_CASE(1)
                KERN_CASE(2)
                KERN_CASE(3)
                KERN_CASE(4)
                KERN_CASE(5)
                KERN_CASE(6)
            }
        }
    }
}

/* ---- column-wise softmax pieces ------------------------------------------------------- */

void at_softmax_update_avx2(float *S, int64_t nk, int64_t ld, int64_t ncols, float *m, float *l,
                            float *alpha)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < ncols; i += 8) {
        __m256 mo = _mm256_loadu_ps(m + i), mx = mo;
        float *s = S + i;
        for (int64_t j = 0; j < nk; j++)
            mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j * ld));
        __m256 use = _mm256_blendv_ps(mx, zero, _mm256_cmp_ps(mx, ninf, _CMP_EQ_OQ));
        __m256 a = ct_exp256(_mm256_sub_ps(mo, use));
        __m256 sum0 = zero, sum1 = zero;
        int64_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            __m256 p0 = ct_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j * ld), use));
            __m256 p1 = ct_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + (j + 1) * ld), use));
            _mm256_storeu_ps(s + j * ld, p0);
            _mm256_storeu_ps(s + (j + 1) * ld, p1);
            sum0 = _mm256_add_ps(sum0, p0);
            sum1 = _mm256_add_ps(sum1, p1);
        }
        if (j < nk) {
            __m256 p0 = ct_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j * ld), use));
            _mm256_storeu_ps(s + j * ld, p0);
            sum0 = _mm256_add_ps(sum0, p0);
        }
        __m256 lv = _mm256_fmadd_ps(_mm256_loadu_ps(l + i), a, _mm256_add_ps(sum0, sum1));
        _mm256_storeu_ps(l + i, lv);
        _mm256_storeu_ps(m + i, mx);
        _mm256_storeu_ps(alpha + i, a);
    }
}

void at_exp_sub_avx2(float *S, int64_t nk, int64_t ld, int64_t ncols, const float *lse)
{
    for (int64_t i = 0; i < ncols; i += 8) {
        __m256 lv = _mm256_loadu_ps(lse + i);
        for (int64_t j = 0; j < nk; j++) {
            float *p = S + j * ld + i;
            _mm256_storeu_ps(p, ct_exp256(_mm256_sub_ps(_mm256_loadu_ps(p), lv)));
        }
    }
}

void at_dsoftmax_avx2(const float *P, float *dP, int64_t nk, int64_t ld, int64_t ncols,
                      const float *D)
{
    for (int64_t i = 0; i < ncols; i += 8) {
        __m256 dv = _mm256_loadu_ps(D + i);
        for (int64_t j = 0; j < nk; j++) {
            float *q = dP + j * ld + i;
            __m256 p = _mm256_loadu_ps(P + j * ld + i);
            _mm256_storeu_ps(q, _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(q), dv)));
        }
    }
}

void at_apply_keep_avx2(float *S, int64_t ld, const uint8_t *keep, int64_t kld, int64_t nk,
                        int64_t nq)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < nk; j++) {
        float *s = S + j * ld;
        const uint8_t *k = keep + j * kld;
        int64_t i = 0;
        for (; i + 8 <= nq; i += 8) {
            long long bits;
            __builtin_memcpy(&bits, k + i, 8);
            if (bits == 0x0101010101010101LL) continue;
            __m256i w = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bits));
            __m256 drop = _mm256_castsi256_ps(_mm256_cmpeq_epi32(w, _mm256_setzero_si256()));
            _mm256_storeu_ps(s + i, _mm256_blendv_ps(_mm256_loadu_ps(s + i), ninf, drop));
        }
        for (; i < nq; i++)
            if (!k[i]) s[i] = -INFINITY;
    }
}

/* ---- transposed packing: 8 x 8 blocks through registers ------------------------------- */

void at_pack_t_avx2(const float *src, int64_t lds, int64_t n, int64_t width, float mult, float *dst,
                    int64_t ldd, int64_t ncols)
{
    __m256 mv = _mm256_set1_ps(mult);
    int64_t n8 = n & ~(int64_t)7, w8 = width & ~(int64_t)7;
    for (int64_t i0 = 0; i0 < n8; i0 += 8)
        for (int64_t e0 = 0; e0 < w8; e0 += 8) {
            __m256 r[8], t[8];
            for (int k = 0; k < 8; k++)
                r[k] = _mm256_loadu_ps(src + (i0 + k) * lds + e0);
            for (int k = 0; k < 8; k += 2) {
                t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
                t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
            }
            for (int k = 0; k < 8; k += 4) {
                r[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
                r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
                r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
                r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            for (int k = 0; k < 4; k++) {
                t[k] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x20);
                t[k + 4] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x31);
            }
            for (int k = 0; k < 8; k++)
                _mm256_storeu_ps(dst + (e0 + k) * ldd + i0, _mm256_mul_ps(mv, t[k]));
        }
    for (int64_t i = 0; i < n; i++) /* the edges */
        for (int64_t e = i < n8 ? w8 : 0; e < width; e++)
            dst[e * ldd + i] = mult * src[i * lds + e];
    for (int64_t e = 0; e < width; e++)
        for (int64_t i = n; i < ncols; i++)
            dst[e * ldd + i] = 0.0f;
}

/* ---- soft-capping ---------------------------------------------------------------------- */

void at_softcap_fwd_avx2(float *x, int64_t n, float cap)
{
    __m256 c = _mm256_set1_ps(cap), ic = _mm256_set1_ps(1.0f / cap);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(c, ct_tanh256(_mm256_mul_ps(_mm256_loadu_ps(x + i), ic))));
    if (i < n) {
        float buf[8] = {0};
        for (int64_t t = 0; t < n - i; t++)
            buf[t] = x[i + t];
        _mm256_storeu_ps(buf, _mm256_mul_ps(c, ct_tanh256(_mm256_mul_ps(_mm256_loadu_ps(buf), ic))));
        for (int64_t t = 0; t < n - i; t++)
            x[i + t] = buf[t];
    }
}

void at_softcap_bwd_avx2(const float *s, float *g, int64_t n, float cap)
{
    __m256 ic = _mm256_set1_ps(1.0f / cap), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 t = ct_tanh256(_mm256_mul_ps(_mm256_loadu_ps(s + i), ic));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_fnmadd_ps(t, t, one)));
    }
    if (i < n) {
        float sb[8] = {0}, gb[8] = {0};
        for (int64_t t = 0; t < n - i; t++)
            sb[t] = s[i + t], gb[t] = g[i + t];
        __m256 t = ct_tanh256(_mm256_mul_ps(_mm256_loadu_ps(sb), ic));
        _mm256_storeu_ps(gb, _mm256_mul_ps(_mm256_loadu_ps(gb), _mm256_fnmadd_ps(t, t, one)));
        for (int64_t t2 = 0; t2 < n - i; t2++)
            g[i + t2] = gb[t2];
    }
}
