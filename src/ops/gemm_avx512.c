/* ctorch's GEMM: the AVX-512F micro-kernel, 12 x 32 (24 zmm accumulators, two B vectors and
 * one A broadcast per k). Contract in gemm_kernels.h: the same bits as the AVX2 kernel (both
 * sum k in ascending order with FMA per C element and share the epilogue), and its own packers
 * (exact copies: the generic packers' panels). */
#include "ops/gemm_kernels.h"
#include "simd/simd_avx512.h"

#include <math.h>
#include <stdint.h>

#define MR 12
#define NR 32

static void kernel_12x32(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc, int m, int n,
                         float alpha, float beta)
{
    /* C is read (beta != 0) and written after the k loop: fetch its rows now, so the loop
     * hides the misses (the rows are ldc apart, which the hardware prefetchers do not follow) */
    for (int i = 0; i < m; i++) {
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + i * ldc + n - 1), _MM_HINT_T0);
    }
    __m512 acc[MR][2];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            __m512 a = _mm512_set1_ps(ap[i]);
            acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
        }
        ap += MR;
        bp += NR;
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    int b0 = beta == 0.0f;
    if (m == MR && n == NR) {
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++)
            for (int h = 0; h < 2; h++) {
                float *p = c + i * ldc + 16 * h;
                __m512 r = b0 ? _mm512_mul_ps(va, acc[i][h])
                              : _mm512_fmadd_ps(va, acc[i][h], _mm512_mul_ps(vb, _mm512_loadu_ps(p)));
                _mm512_storeu_ps(p, r);
            }
        return;
    }
    float t[MR][NR];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        _mm512_storeu_ps(t[i], acc[i][0]);
        _mm512_storeu_ps(t[i] + 16, acc[i][1]);
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float *p = c + i * ldc + j;
            *p = b0 ? alpha * t[i][j] : fmaf(alpha, t[i][j], beta * *p);
        }
}

/* ---- packing (AVX-512 F/BW/VL): the layouts of gemm_kernels.h, exact copies (bf16 widened
 * by a 16-bit shift), so the packed panels are the generic packers' bits. Rows or columns past
 * m / n come from zero-masked loads. The strided sides (A not transposed, B transposed) are
 * transposed in blocks of 16 k: each source row's 16 values are loaded once (its cache line
 * used whole: rows a power-of-two stride apart fall into one L1 set, so reading them one k
 * at a time thrashed) into a small buffer, then gathered out one k at a time. */

/* Bytes ahead of the current block that pack_strided asks for: the rows are a stride apart
 * that the hardware prefetchers do not follow (the source loads were half the time of a
 * 130 x 32768 x 1024 product with B transposed, the shape of the fused loss's logits). */
#define PACK_PREFETCH 256

/* d[k * lanes + r] = op(X)(r, k) for k < kc, r < lanes, where row r of the source starts at
 * X + r * ld (f32, or bf16 when bf); rows r >= rows are zero. lanes is MR or NR. */
static void pack_strided(float *d, int lanes, const void *X, bool bf, int64_t ld, int64_t rows, int64_t kc)
{
    _Alignas(64) float t[NR * 16];
    const float *xf = X;
    const uint16_t *xb = X;
    const __m512i idx = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
    __mmask16 tail = (__mmask16)(lanes >= 16 ? 0xffff : (1u << lanes) - 1);
    for (int r = 0; r < lanes; r++)
        if (r >= rows) _mm512_store_ps(t + r * 16, _mm512_setzero_ps());
    for (int64_t k0 = 0; k0 < kc; k0 += 16) {
        int kn = kc - k0 < 16 ? (int)(kc - k0) : 16;
        __mmask16 km = (__mmask16)((1u << kn) - 1);
        for (int64_t r = 0; r < rows; r++) {
            const char *row = bf ? (const char *)(xb + r * ld + k0) : (const char *)(xf + r * ld + k0);
            _mm_prefetch(row + PACK_PREFETCH, _MM_HINT_T0);
            _mm512_store_ps(t + r * 16, bf ? cv_widen_bf16(_mm256_maskz_loadu_epi16(km, row)) : _mm512_maskz_loadu_ps(km, row));
        }
        float *dk = d + k0 * lanes;
        for (int kk = 0; kk < kn; kk++, dk += lanes) {
            __m512i ik = _mm512_add_epi32(idx, _mm512_set1_epi32(kk));
            for (int g = 0; g < lanes; g += 16) {
                if (lanes - g >= 16) {
                    _mm512_storeu_ps(dk + g, _mm512_i32gather_ps(ik, t + g * 16, 4));
                } else { /* lanes past the strip: neither read nor written */
                    __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), tail, ik, t + g * 16, 4);
                    _mm512_mask_storeu_ps(dk + g, tail, v);
                }
            }
        }
    }
}

static void pack_a_12(float *dst, const void *A, int64_t lda, bool ta, bool bf, int64_t m, int64_t kc, int mr,
                      int64_t s0, int64_t s1)
{
    if (mr != MR) {
        ct_gemm_pack_a_generic(dst, A, lda, ta, bf, m, kc, mr, s0, s1);
        return;
    }
    size_t es = bf ? 2 : 4;
    for (int64_t s = s0; s < s1; s++) {
        float *d = dst + s * kc * MR;
        int64_t i0 = s * MR, rows = m - i0 < MR ? m - i0 : MR;
        if (!ta) {
            pack_strided(d, MR, (const char *)A + (size_t)(i0 * lda) * es, bf, lda, rows, kc);
            continue;
        }
        __mmask16 mk = (__mmask16)((1u << rows) - 1);
        for (int64_t k = 0; k < kc; k++) { /* row k of A holds the strip's rows contiguously */
            const char *p = (const char *)A + (size_t)(k * lda + i0) * es;
            __m512 v = bf ? cv_widen_bf16(_mm256_maskz_loadu_epi16(mk, p)) : _mm512_maskz_loadu_ps(mk, p);
            _mm512_mask_storeu_ps(d + k * MR, 0xfff, v);
        }
    }
}

static void pack_b_32(float *dst, const void *B, int64_t ldb, bool tb, bool bf, int64_t kc, int64_t n, int nr,
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
            pack_strided(dst + s * kc * NR, NR, (const char *)B + (size_t)(j0 * ldb) * es, bf, ldb, cols, kc);
        }
        return;
    }
    /* row k of B holds the strips' columns contiguously: k outer, so each row is read in one
     * sweep across the strips [s0, s1) */
    for (int64_t k = 0; k < kc; k++)
        for (int64_t s = s0; s < s1; s++) {
            int64_t j0 = s * NR, cols = n - j0 < NR ? n - j0 : NR;
            __mmask16 m0 = (__mmask16)(cols >= 16 ? 0xffff : (1u << cols) - 1);
            __mmask16 m1 = (__mmask16)(cols <= 16 ? 0 : cols >= 32 ? 0xffff : (1u << (cols - 16)) - 1);
            const char *p = (const char *)B + (size_t)(k * ldb + j0) * es;
            __m512 v0, v1;
            if (bf) {
                v0 = cv_widen_bf16(_mm256_maskz_loadu_epi16(m0, p));
                v1 = cv_widen_bf16(_mm256_maskz_loadu_epi16(m1, p + 32));
            } else {
                v0 = _mm512_maskz_loadu_ps(m0, p);
                v1 = _mm512_maskz_loadu_ps(m1, p + 64);
            }
            float *d = dst + s * kc * NR + k * NR;
            _mm512_storeu_ps(d, v0);
            _mm512_storeu_ps(d + 16, v1);
        }
}

/* ---- bf16 operands with vdpbf16ps (AVX512_BF16): the bf16 contract of gemm_kernels.h.
 * Panels hold bf16 pairs (k = 2p, 2p + 1) as 32-bit words: one broadcast word of A against
 * 16 words of B gives 16 columns' two products per instruction. The target attribute lets
 * this file build with the AVX-512 F/BW/DQ/VL options alone; it runs only where
 * ct_gemm_bf16_dot() found the instruction. */

__attribute__((target("avx512f,avx512bf16"))) static void kernel_dot_12x32(int64_t kc, const float *apf,
                                                                           const float *bpf, float *c, int64_t ldc,
                                                                           int m, int n, float alpha, float beta)
{
    const uint32_t *ap = (const uint32_t *)apf; /* pair (p, i) at ap[p * MR + i] */
    const uint32_t *bp = (const uint32_t *)bpf; /* pair (p, j) at bp[p * NR + j] */
    for (int i = 0; i < m; i++) {
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + i * ldc + n - 1), _MM_HINT_T0);
    }
    __m512 acc[MR][2];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    int64_t np = (kc + 1) / 2;
#pragma GCC unroll 2
    for (int64_t p = 0; p < np; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp), b1 = (__m512bh)_mm512_loadu_si512(bp + 16);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[i]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], a, b1);
        }
        ap += MR;
        bp += NR;
    }
    float t[MR][NR];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        _mm512_storeu_ps(t[i], acc[i][0]);
        _mm512_storeu_ps(t[i] + 16, acc[i][1]);
    }
    int b0 = beta == 0.0f;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float *q = c + i * ldc + j;
            *q = b0 ? alpha * t[i][j] : fmaf(alpha, t[i][j], beta * *q);
        }
}

/* Pair panels (bf16 operands only): strip s at dst16 + s * ceil(kc/2) * 2 * lanes. */
static void pack_pairs(uint16_t *d, int lanes, const uint16_t *X, bool t, int64_t ld, int64_t rows, int64_t kc)
{ /* element (r, k) of the strip: t ? X[k * ld + r] : X[r * ld + k] */
    int64_t np = (kc + 1) / 2;
    for (int64_t p = 0; p < np; p++)
        for (int r = 0; r < lanes; r++)
            for (int q = 0; q < 2; q++) {
                int64_t k = 2 * p + q;
                d[(p * lanes + r) * 2 + q] = r < rows && k < kc ? (t ? X[k * ld + r] : X[r * ld + k]) : 0;
            }
}

static void pack_a_dot(float *dst, const void *A, int64_t lda, bool ta, bool bf, int64_t m, int64_t kc, int mr,
                       int64_t s0, int64_t s1)
{
    (void)bf;
    int64_t np = (kc + 1) / 2;
    for (int64_t s = s0; s < s1; s++) {
        int64_t i0 = s * mr, rows = m - i0 < mr ? m - i0 : mr;
        const uint16_t *a = (const uint16_t *)A + (ta ? i0 : i0 * lda);
        pack_pairs((uint16_t *)dst + s * np * 2 * mr, mr, a, ta, lda, rows, kc);
    }
}

static void pack_b_dot(float *dst, const void *B, int64_t ldb, bool tb, bool bf, int64_t kc, int64_t n, int nr,
                       int64_t s0, int64_t s1)
{
    (void)bf;
    int64_t np = (kc + 1) / 2;
    for (int64_t s = s0; s < s1; s++) {
        int64_t j0 = s * nr, cols = n - j0 < nr ? n - j0 : nr;
        const uint16_t *b = (const uint16_t *)B + (tb ? j0 * ldb : j0);
        /* element (c, k) of the strip: op(B)(k, j0 + c) = tb ? B[c * ldb + k] : B[k * ldb + c] */
        pack_pairs((uint16_t *)dst + s * np * 2 * nr, nr, b, !tb, ldb, cols, kc);
    }
}

const ct_gemm_kernels ct_gemm_avx512 = {
    .name = "avx512 12x32",
    .mr = MR,
    .nr = NR,
    .mc = 192,
    .nc = 768,
    .kernel = kernel_12x32,
    .pack_a = pack_a_12,
    .pack_b = pack_b_32,
    .kernel_dot = kernel_dot_12x32,
    .pack_a_dot = pack_a_dot,
    .pack_b_dot = pack_b_dot,
};
