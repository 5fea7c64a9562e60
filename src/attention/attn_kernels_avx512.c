/* AVX-512 body of the attention tile product (see attn_kernels.h): an mr x 32 block of C
 * per step (mr <= 8), two 16-wide accumulators per row, A broadcast from memory, B rows
 * loaded under the column mask. When B's row stride would put the rows of a 32-wide panel
 * into few L1 sets (a power-of-two-ish stride, e.g. V read in place from [B, L, H, E]) and
 * the panel is reused by more than one row block, the panel is first copied into a
 * contiguous zero-padded buffer on the stack (K <= KPACK rows). Each output element is still
 * one FMA chain over k in ascending order from zero, then the AVX2 epilogue, so results are
 * bitwise those of the AVX2 kernel; only the width and the blocking differ. */
#include "attention/attn_kernels.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

AI void kern16(const int mr, const int nv, __mmask16 mk0, __mmask16 mk1, int64_t K, const float *A,
               int64_t ars, int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc, bool acc,
               const float *rs)
{
    __m512 c[8][2];
    for (int r = 0; r < 8; r++)
        c[r][0] = c[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 b0 = _mm512_maskz_loadu_ps(mk0, B);
        __m512 b1 = _mm512_setzero_ps();
        if (nv == 2) b1 = _mm512_maskz_loadu_ps(mk1, B + 16);
        for (int r = 0; r < mr; r++) {
            __m512 a = _mm512_set1_ps(A[r * ars]);
            c[r][0] = _mm512_fmadd_ps(a, b0, c[r][0]);
            if (nv == 2) c[r][1] = _mm512_fmadd_ps(a, b1, c[r][1]);
        }
        A += acs;
        B += ldb;
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < nv; v++) {
            float *p = C + r * ldc + 16 * v;
            __mmask16 mk = v ? mk1 : mk0;
            __m512 x = c[r][v];
            if (acc) {
                __m512 old = _mm512_maskz_loadu_ps(mk, p);
                x = rs ? _mm512_fmadd_ps(_mm512_set1_ps(rs[r]), old, x) : _mm512_add_ps(x, old);
            }
            _mm512_mask_storeu_ps(p, mk, x);
        }
}

#define K16_ARGS mk0, mk1, K, A + i0 * ars, ars, acs, B + j0, ldb, C + i0 * ldc + j0, ldc, acc, rs ? rs + i0 : NULL
#define K16_CASE(MR)                                                                               \
    case MR:                                                                                       \
        if (nv == 2)                                                                               \
            kern16(MR, 2, K16_ARGS);                                                               \
        else                                                                                       \
            kern16(MR, 1, K16_ARGS);                                                               \
        break;

/* B panels of up to KPACK rows are copied to a contiguous, zero-padded 32-wide buffer once
 * per column panel when more than one row block reuses them. */
enum { KPACK = 512 };

static void pack_b(float *restrict dst, const float *B, int64_t ldb, int64_t K, int nv, __mmask16 mk0,
                   __mmask16 mk1)
{
    for (int64_t k = 0; k < K; k++) {
        _mm512_storeu_ps(dst + 32 * k, _mm512_maskz_loadu_ps(mk0, B + k * ldb));
        if (nv == 2) _mm512_storeu_ps(dst + 32 * k + 16, _mm512_maskz_loadu_ps(mk1, B + k * ldb + 16));
    }
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
    float panel[32 * KPACK] __attribute__((aligned(64)));
    const bool pack = M > 8 && K <= KPACK && K > 8 * conflict_period(ldb);
    const float *Bsrc = B;
    int64_t ldbsrc = ldb;
    for (int64_t j0 = 0; j0 < N; j0 += 32) {
        int nr = N - j0 < 32 ? (int)(N - j0) : 32;
        int nv = nr > 16 ? 2 : 1;
        int n0 = nr < 16 ? nr : 16, n1 = nr - n0;
        __mmask16 mk0 = (__mmask16)(n0 == 16 ? 0xFFFF : (1u << n0) - 1);
        __mmask16 mk1 = (__mmask16)(n1 == 16 ? 0xFFFF : (1u << n1) - 1);
        if (pack) {
            pack_b(panel, Bsrc + j0, ldbsrc, K, nv, mk0, mk1);
            B = panel - j0, ldb = 32;
        }
        for (int64_t i0 = 0; i0 < M; i0 += 8) {
            int mr = M - i0 < 8 ? (int)(M - i0) : 8;
            switch (mr) {
                K16_CASE(1)
                K16_CASE(2)
                K16_CASE(3)
                K16_CASE(4)
                K16_CASE(5)
                K16_CASE(6)
                K16_CASE(7)
                K16_CASE(8)
            }
        }
    }
}
