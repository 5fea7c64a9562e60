/* ctorch's GEMM: the AVX2 + FMA micro-kernel, 6 x 16 (12 ymm accumulators, two B vectors
 * and one A broadcast per k). Contract in gemm_kernels.h; same bits as every FMA kernel. */
#include "ops/gemm_kernels.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define MR 6
#define NR 16

/* The epilogue of one row of 8: c = beta == 0 ? alpha acc : fma(alpha, acc, beta c). */
static inline __attribute__((always_inline)) void row8(float *c, __m256 acc, __m256 va, __m256 vb, int b0)
{
    __m256 r = b0 ? _mm256_mul_ps(va, acc) : _mm256_fmadd_ps(va, acc, _mm256_mul_ps(vb, _mm256_loadu_ps(c)));
    _mm256_storeu_ps(c, r);
}

/* The k loop alone (not inlined: alpha and beta are not live here, so the 12 accumulators,
 * two B vectors and the broadcast fit the 16 ymm registers without spills). */
static __attribute__((noinline)) void mul_6x16(int64_t kc, const float *ap, const float *bp, float *t)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
        __m256 a;
        a = _mm256_broadcast_ss(ap + 0);
        c00 = _mm256_fmadd_ps(a, b0, c00);
        c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(ap + 1);
        c10 = _mm256_fmadd_ps(a, b0, c10);
        c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(ap + 2);
        c20 = _mm256_fmadd_ps(a, b0, c20);
        c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(ap + 3);
        c30 = _mm256_fmadd_ps(a, b0, c30);
        c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(ap + 4);
        c40 = _mm256_fmadd_ps(a, b0, c40);
        c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(ap + 5);
        c50 = _mm256_fmadd_ps(a, b0, c50);
        c51 = _mm256_fmadd_ps(a, b1, c51);
        ap += MR;
        bp += NR;
    }
    _mm256_store_ps(t, c00), _mm256_store_ps(t + 8, c01);
    _mm256_store_ps(t + 16, c10), _mm256_store_ps(t + 24, c11);
    _mm256_store_ps(t + 32, c20), _mm256_store_ps(t + 40, c21);
    _mm256_store_ps(t + 48, c30), _mm256_store_ps(t + 56, c31);
    _mm256_store_ps(t + 64, c40), _mm256_store_ps(t + 72, c41);
    _mm256_store_ps(t + 80, c50), _mm256_store_ps(t + 88, c51);
}

static void kernel_6x16(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc, int m, int n,
                        float alpha, float beta)
{
    _Alignas(32) float t[MR * NR];
    /* C is read (beta != 0) and written after the k loop: fetch its rows now so the k loop
     * hides the misses (rows ldc apart, which the hardware prefetchers do not follow; C of a
     * big product leaves the caches between K slices). */
    for (int i = 0; i < m; i++) {
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + i * ldc + n - 1), _MM_HINT_T0);
    }
    mul_6x16(kc, ap, bp, t);
    int b0 = beta == 0.0f;
    if (m == MR && n == NR) {
        __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
        for (int i = 0; i < MR; i++) {
            row8(c + i * ldc, _mm256_load_ps(t + i * NR), va, vb, b0);
            row8(c + i * ldc + 8, _mm256_load_ps(t + i * NR + 8), va, vb, b0);
        }
        return;
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float *p = c + i * ldc + j;
            *p = b0 ? alpha * t[i * NR + j] : fmaf(alpha, t[i * NR + j], beta * *p);
        }
}

/* ---- packing: the layouts of gemm_kernels.h, exact copies of the generic packers' panels
 * (bf16 widened by a 16-bit shift), vectorised: the strided sides (A not transposed, B
 * transposed) go through 8 x 8 transposes of 8 k at a time, the contiguous sides copy one
 * k row at a time. Rows / columns past m / n are zero. */

/* 8 values of row p (f32, or bf16 when bf) from element k on, widened to f32. */
static inline __m256 load8(const void *p, bool bf, int64_t k)
{
    if (!bf) return _mm256_loadu_ps((const float *)p + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float load1(const void *p, bool bf, int64_t k)
{
    return bf ? bf16f(((const uint16_t *)p)[k]) : ((const float *)p)[k];
}

/* r[i] = row i, 8 lanes; afterwards r[k] = lane k of every row (column k). */
static inline void transpose8(__m256 r[8])
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* d[k * lanes + r] = row r's element k, for r < rows (else 0), k < kc; lanes is 6 or 16 and
 * the rows start at X + r * ld (elements of size es). */
static void pack_rows(float *d, int lanes, const void *X, bool bf, int64_t ld, int64_t rows, int64_t kc)
{
    size_t es = bf ? 2 : 4;
    int64_t k8 = kc & ~(int64_t)7;
    for (int g = 0; g < lanes; g += 8) { /* 8 rows at a time (6 for A: lanes 6, 7 unused) */
        const void *p[8];
        int nr = lanes - g < 8 ? lanes - g : 8;
        for (int r = 0; r < 8; r++) p[r] = g + r < rows && r < nr ? (const char *)X + (size_t)((g + r) * ld) * es : NULL;
        for (int64_t k = 0; k < k8; k += 8) {
            __m256 v[8];
            for (int r = 0; r < 8; r++) v[r] = p[r] ? load8(p[r], bf, k) : _mm256_setzero_ps();
            transpose8(v);
            float *dk = d + k * lanes + g;
            if (nr == 8) {
                for (int q = 0; q < 8; q++) _mm256_storeu_ps(dk + q * lanes, v[q]);
            } else { /* 6 lanes: 4 + 2 floats, never past the strip */
                for (int q = 0; q < 8; q++) {
                    _mm_storeu_ps(dk + q * lanes, _mm256_castps256_ps128(v[q]));
                    _mm_storel_pi((__m64 *)(dk + q * lanes + 4), _mm256_extractf128_ps(v[q], 1));
                }
            }
        }
        for (int64_t k = k8; k < kc; k++)
            for (int r = 0; r < nr; r++) d[k * lanes + g + r] = p[r] ? load1(p[r], bf, k) : 0.0f;
    }
}

static void pack_a_6(float *dst, const void *A, int64_t lda, bool ta, bool bf, int64_t m, int64_t kc, int mr,
                     int64_t s0, int64_t s1)
{
    if (mr != MR || ta) { /* A transposed: row k of A holds a strip's 6 values, the generic copy */
        ct_gemm_pack_a_generic(dst, A, lda, ta, bf, m, kc, mr, s0, s1);
        return;
    }
    size_t es = bf ? 2 : 4;
    for (int64_t s = s0; s < s1; s++) {
        int64_t i0 = s * MR, rows = m - i0 < MR ? m - i0 : MR;
        pack_rows(dst + s * kc * MR, MR, (const char *)A + (size_t)(i0 * lda) * es, bf, lda, rows, kc);
    }
}

static void pack_b_16(float *dst, const void *B, int64_t ldb, bool tb, bool bf, int64_t kc, int64_t n, int nr,
                      int64_t s0, int64_t s1)
{
    if (nr != NR) {
        ct_gemm_pack_b_generic(dst, B, ldb, tb, bf, kc, n, nr, s0, s1);
        return;
    }
    size_t es = bf ? 2 : 4;
    if (tb) {
        for (int64_t s = s0; s < s1; s++) {
            int64_t j0 = s * NR, cols = n - j0 < NR ? n - j0 : NR;
            pack_rows(dst + s * kc * NR, NR, (const char *)B + (size_t)(j0 * ldb) * es, bf, ldb, cols, kc);
        }
        return;
    }
    /* row k of B holds the strips' columns contiguously: k outer, one sweep per row */
    for (int64_t k = 0; k < kc; k++) {
        const char *row = (const char *)B + (size_t)(k * ldb) * es;
        for (int64_t s = s0; s < s1; s++) {
            int64_t j0 = s * NR, cols = n - j0 < NR ? n - j0 : NR;
            float *d = dst + s * kc * NR + k * NR;
            if (cols == NR) {
                _mm256_storeu_ps(d, load8(row, bf, j0));
                _mm256_storeu_ps(d + 8, load8(row, bf, j0 + 8));
            } else {
                for (int64_t c = 0; c < NR; c++) d[c] = c < cols ? load1(row, bf, j0 + c) : 0.0f;
            }
        }
    }
}

const ct_gemm_kernels ct_gemm_avx2 = {
    .name = "avx2 6x16",
    .mr = MR,
    .nr = NR,
    .mc = 144,
    .nc = 3072,
    .kernel = kernel_6x16,
    .pack_a = pack_a_6,
    .pack_b = pack_b_16,
};
