/* AVX-512 body of the attention tile product (see attn_kernels.h). C is cut into column
 * panels of 32 (two 16-wide vectors), except that a last remainder of 33..48 columns is one
 * 48-wide panel (three vectors) rather than 32 + a narrow tail, and a remainder <= 16 one
 * vector; each panel is swept in blocks of <= 8 rows (16 or 24 accumulators, enough chains
 * for two FMA pipes of latency 4), A broadcast from memory, B rows loaded under the column
 * masks. When B's row stride would put the rows of a panel into few L1 sets (a
 * power-of-two-ish stride, e.g. V read in place from [B, L, H, E]) and the panel is reused
 * by more than one row block, the panel is first copied into a contiguous zero-padded buffer
 * on the stack (K <= KPACK rows). Each output element is still one FMA chain over k in
 * ascending order from zero, then the AVX2 epilogue, so results are bitwise those of the
 * AVX2 kernel; only the width and the blocking differ. Also AVX-512 bodies of dsoftmax,
 * apply_keep, the online softmax update, exp_sub and the soft-capping (element-wise or per
 * column, the AVX2 operations on 16 lanes with simd_x86.h's exp and tanh: the same bits). */
#include "attention/attn_kernels.h"
#include "simd/simd_avx512.h"

#include <math.h>

#define AI static inline __attribute__((always_inline))

/* An mr x (16 nv) block of C: mr nv accumulators, mk[v] the column mask of vector v. */
AI void kern16(const int mr, const int nv, const __mmask16 *mk, int64_t K, const float *A, int64_t ars,
               int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs)
{
    __m512 c[16][3];
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            c[r][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 b[3];
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            b[v] = _mm512_maskz_loadu_ps(mk[v], B + 16 * v);
#pragma GCC unroll 16
        for (int r = 0; r < mr; r++) {
            __m512 a = _mm512_set1_ps(A[r * ars]);
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++)
                c[r][v] = _mm512_fmadd_ps(a, b[v], c[r][v]);
        }
        A += acs;
        B += ldb;
    }
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) {
            float *p = C + r * ldc + 16 * v;
            __m512 x = c[r][v];
            if (acc) {
                __m512 old = _mm512_maskz_loadu_ps(mk[v], p);
                x = rs ? _mm512_fmadd_ps(_mm512_set1_ps(rs[r]), old, x) : _mm512_add_ps(x, old);
            }
            _mm512_mask_storeu_ps(p, mk[v], x);
        }
}

#define K16_ARGS mk, K, A + i0 * ars, ars, acs, Bp, ldp, C + i0 * ldc + j0, ldc, acc, rs ? rs + i0 : NULL
#define K16_CASE(MR, NV)                                                                           \
    case MR:                                                                                       \
        kern16(MR, NV, K16_ARGS);                                                                  \
        break;
#define K16_CASES8(NV)                                                                             \
    K16_CASE(1, NV) K16_CASE(2, NV) K16_CASE(3, NV) K16_CASE(4, NV) K16_CASE(5, NV) K16_CASE(6, NV) \
    K16_CASE(7, NV) K16_CASE(8, NV)
#define ROWS(RB, CASES)                                                                            \
    for (int64_t i0 = 0; i0 < M; i0 += RB) {                                                       \
        int mr = M - i0 < RB ? (int)(M - i0) : RB;                                                 \
        switch (mr) { CASES }                                                                      \
    }

/* B panels of up to KPACK rows are copied to a contiguous, zero-padded buffer once per
 * column panel when more than one row block reuses them. */
enum { KPACK = 256 }; /* 48 KiB of stack */

static void pack_b(float *restrict dst, const float *B, int64_t ldb, int64_t K, int nv, const __mmask16 *mk)
{
    for (int64_t k = 0; k < K; k++)
        for (int v = 0; v < nv; v++)
            _mm512_storeu_ps(dst + (16 * nv) * k + 16 * v, _mm512_maskz_loadu_ps(mk[v], B + k * ldb + 16 * v));
}

/* Rows of B that fall in distinct L1 sets before the pattern repeats (4 KiB way size):
 * 4096 / gcd(4 ldb mod 4096, 4096). */
static int64_t conflict_period(int64_t ldb)
{
    int64_t s = (4 * ldb) & 4095, g = 4096;
    while (s) {
        int64_t t = g % s;
        g = s, s = t;
    }
    return 4096 / g;
}

void at_gemm_avx512(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
                    const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs)
{
    float panel[48 * KPACK] __attribute__((aligned(64)));
    const bool pack = M > 8 && K <= KPACK && K > 8 * conflict_period(ldb);
    for (int64_t j0 = 0; j0 < N;) {
        int64_t rem = N - j0;
        int nv = rem > 32 && rem <= 48 ? 3 : rem > 16 ? 2 : 1;
        int nr = rem < 16 * nv ? (int)rem : 16 * nv;
        __mmask16 mk[3];
        for (int v = 0; v < 3; v++) {
            int n = nr - 16 * v;
            mk[v] = (__mmask16)(n >= 16 ? 0xFFFF : n > 0 ? (1u << n) - 1 : 0);
        }
        const float *Bp = B + j0;
        int64_t ldp = ldb;
        if (pack) {
            pack_b(panel, B + j0, ldb, K, nv, mk);
            Bp = panel, ldp = 16 * nv;
        }
        if (nv == 3) {
            ROWS(8, K16_CASES8(3))
        } else if (nv == 2) {
            ROWS(8, K16_CASES8(2))
        } else {
            ROWS(8, K16_CASES8(1))
        }
        j0 += nr;
    }
}

/* ---- element-wise tile passes: the AVX2 operations on 16 lanes ------------------------- */

/* Row by row (the AVX2 body walks 8-column strips down the tile; each element is the same
 * mul(p, sub(dp, D)) either way), an 8-lane strip for ncols = 8 mod 16. */
void at_dsoftmax_avx512(const float *P, float *dP, int64_t nk, int64_t ld, int64_t ncols,
                        const float *D)
{
    int64_t n16 = ncols & ~(int64_t)15;
    for (int64_t j = 0; j < nk; j++) {
        const float *p = P + j * ld;
        float *q = dP + j * ld;
        for (int64_t i = 0; i < n16; i += 16)
            _mm512_storeu_ps(q + i, _mm512_mul_ps(_mm512_loadu_ps(p + i),
                                                  _mm512_sub_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(D + i))));
        if (n16 < ncols)
            _mm256_storeu_ps(q + n16, _mm256_mul_ps(_mm256_loadu_ps(p + n16),
                                                    _mm256_sub_ps(_mm256_loadu_ps(q + n16), _mm256_loadu_ps(D + n16))));
    }
}

/* 16 keep bytes compared with zero into a lane mask; -inf stored under it. */
void at_apply_keep_avx512(float *S, int64_t ld, const uint8_t *keep, int64_t kld, int64_t nk,
                          int64_t nq)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < nk; j++) {
        float *s = S + j * ld;
        const uint8_t *k = keep + j * kld;
        int64_t i = 0;
        for (; i + 16 <= nq; i += 16) {
            __mmask16 drop = _mm_cmpeq_epi8_mask(_mm_loadu_si128((const __m128i *)(k + i)), _mm_setzero_si128());
            if (drop) _mm512_mask_storeu_ps(s + i, drop, ninf);
        }
        if (i < nq) {
            __mmask16 in = (__mmask16)((1u << (nq - i)) - 1);
            __mmask16 drop = _mm_mask_cmpeq_epi8_mask(in, _mm_maskz_loadu_epi8(in, k + i), _mm_setzero_si128());
            if (drop) _mm512_mask_storeu_ps(s + i, drop, ninf);
        }
    }
}

/* ---- column-wise softmax pieces and soft-capping: 16 columns a step ---------------------- */

/* Columns [i, i + 16) of the tile under mask mk (the 8 columns of a last half step): the
 * AVX2 body per column, including its two row accumulators (even and odd rows). */
AI void softmax_update16(float *S, int64_t nk, int64_t ld, int64_t i, __mmask16 mk, float *m,
                         float *l, float *alpha)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY), zero = _mm512_setzero_ps();
    __m512 mo = _mm512_maskz_loadu_ps(mk, m + i), mx = mo;
    float *s = S + i;
    for (int64_t j = 0; j < nk; j++) mx = _mm512_max_ps(mx, _mm512_maskz_loadu_ps(mk, s + j * ld));
    __m512 use = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mx, ninf, _CMP_EQ_OQ), mx, zero);
    __m512 a = cv_exp(_mm512_sub_ps(mo, use));
    __m512 sum0 = zero, sum1 = zero;
    int64_t j = 0;
    for (; j + 2 <= nk; j += 2) {
        __m512 p0 = cv_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j * ld), use));
        __m512 p1 = cv_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + (j + 1) * ld), use));
        _mm512_mask_storeu_ps(s + j * ld, mk, p0);
        _mm512_mask_storeu_ps(s + (j + 1) * ld, mk, p1);
        sum0 = _mm512_add_ps(sum0, p0);
        sum1 = _mm512_add_ps(sum1, p1);
    }
    if (j < nk) {
        __m512 p0 = cv_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j * ld), use));
        _mm512_mask_storeu_ps(s + j * ld, mk, p0);
        sum0 = _mm512_add_ps(sum0, p0);
    }
    __m512 lv = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, l + i), a, _mm512_add_ps(sum0, sum1));
    _mm512_mask_storeu_ps(l + i, mk, lv);
    _mm512_mask_storeu_ps(m + i, mk, mx);
    _mm512_mask_storeu_ps(alpha + i, mk, a);
}

void at_softmax_update_avx512(float *S, int64_t nk, int64_t ld, int64_t ncols, float *m, float *l,
                              float *alpha)
{
    int64_t i = 0;
    for (; i + 16 <= ncols; i += 16) softmax_update16(S, nk, ld, i, 0xFFFF, m, l, alpha);
    if (i < ncols) softmax_update16(S, nk, ld, i, 0x00FF, m, l, alpha); /* ncols % 8 == 0 */
}

void at_exp_sub_avx512(float *S, int64_t nk, int64_t ld, int64_t ncols, const float *lse)
{
    for (int64_t i = 0; i < ncols; i += 16) {
        __mmask16 mk = ncols - i >= 16 ? 0xFFFF : 0x00FF;
        __m512 lv = _mm512_maskz_loadu_ps(mk, lse + i);
        for (int64_t j = 0; j < nk; j++) {
            float *p = S + j * ld + i;
            _mm512_mask_storeu_ps(p, mk, cv_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, p), lv)));
        }
    }
}

void at_softcap_fwd_avx512(float *x, int64_t n, float cap)
{
    const __m512 c = _mm512_set1_ps(cap), ic = _mm512_set1_ps(1.0f / cap);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mk = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_mul_ps(c, cv_tanh(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + i), ic)));
        _mm512_mask_storeu_ps(x + i, mk, v);
    }
}

void at_softcap_bwd_avx512(const float *s, float *g, int64_t n, float cap)
{
    const __m512 ic = _mm512_set1_ps(1.0f / cap), one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mk = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 t = cv_tanh(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, s + i), ic));
        __m512 d = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, g + i), _mm512_fnmadd_ps(t, t, one));
        _mm512_mask_storeu_ps(g + i, mk, d);
    }
}
