/* ctorch's GEMM: the AVX-512F micro-kernel, 12 x 32 (24 zmm accumulators, two B vectors and
 * one A broadcast per k). Contract in gemm_kernels.h: the same bits as the AVX2 kernel (both
 * sum k in ascending order with FMA per C element and share the epilogue). */
#include "ops/gemm_kernels.h"

#include <immintrin.h>
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
 * m / n come from zero-masked loads. Strided sides (A not transposed, B transposed) gather one
 * k at a time; int32 gather offsets bound the stride, wider strides use the generic packers. */

static inline __m512 widen16(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* lanes r < cnt: the element at p + r * ld (f32), k = the element's column index in its row */
static inline __m512 gather_f32(const float *p, __m512i idx, __mmask16 mk)
{
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mk, idx, p, 4);
}

/* bf16: a 32-bit gather at the element (its low half, little endian) then a shift; the high
 * half is the next element of the row, so the caller uses it only where that exists. */
static inline __m512 gather_bf16(const uint16_t *p, __m512i idx2, __mmask16 mk)
{
    __m512i x = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mk, idx2, p, 1);
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}

/* the lanes of row / column offsets r * ld (elements, or bytes for bf16) */
static inline __m512i offsets(int64_t ld, int first, int scale)
{
    __m512i r = _mm512_add_epi32(_mm512_set1_epi32(first), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                                             12, 13, 14, 15));
    return _mm512_mullo_epi32(r, _mm512_set1_epi32((int)(ld * scale)));
}

static bool gather_fits(int64_t ld, int lanes, bool bf)
{
    return ld * (int64_t)(lanes - 1) * (bf ? 2 : 1) + 1 < (int64_t)INT32_MAX;
}

static inline float bf16_1(uint16_t v)
{
    union {
        uint32_t u;
        float f;
    } x = {(uint32_t)v << 16};
    return x.f;
}

static void pack_a_12(float *dst, const void *A, int64_t lda, bool ta, bool bf, int64_t m, int64_t kc, int mr,
                      int64_t s0, int64_t s1)
{
    if (mr != MR || (!ta && !gather_fits(lda, MR, bf))) {
        ct_gemm_pack_a_generic(dst, A, lda, ta, bf, m, kc, mr, s0, s1);
        return;
    }
    const float *af = A;
    const uint16_t *ab = A;
    __m512i idx = ta ? _mm512_setzero_si512() : offsets(lda, 0, bf ? 2 : 1);
    for (int64_t s = s0; s < s1; s++) {
        float *d = dst + s * kc * MR;
        int64_t i0 = s * MR, rows = m - i0 < MR ? m - i0 : MR;
        __mmask16 mk = (__mmask16)((1u << rows) - 1);
        if (ta) { /* row k of A holds the strip's rows contiguously */
            for (int64_t k = 0; k < kc; k++) {
                __m512 v = bf ? widen16(_mm256_maskz_loadu_epi16(mk, ab + k * lda + i0))
                              : _mm512_maskz_loadu_ps(mk, af + k * lda + i0);
                _mm512_mask_storeu_ps(d + k * MR, 0xfff, v);
            }
        } else if (bf) {
            const uint16_t *p = ab + i0 * lda;
            for (int64_t k = 0; k + 1 < kc; k++) _mm512_mask_storeu_ps(d + k * MR, 0xfff, gather_bf16(p + k, idx, mk));
            for (int64_t r = 0; r < MR; r++) d[(kc - 1) * MR + r] = r < rows ? bf16_1(p[r * lda + kc - 1]) : 0.0f;
        } else {
            const float *p = af + i0 * lda;
            for (int64_t k = 0; k < kc; k++) _mm512_mask_storeu_ps(d + k * MR, 0xfff, gather_f32(p + k, idx, mk));
        }
    }
}

static void pack_b_32(float *dst, const void *B, int64_t ldb, bool tb, bool bf, int64_t kc, int64_t n, int nr,
                      int64_t s0, int64_t s1)
{
    if (nr != NR || (tb && !gather_fits(ldb, NR, bf))) {
        ct_gemm_pack_b_generic(dst, B, ldb, tb, bf, kc, n, nr, s0, s1);
        return;
    }
    const float *bfp = B;
    const uint16_t *bb = B;
    __m512i idx0 = _mm512_setzero_si512(), idx1 = idx0;
    if (tb) idx0 = offsets(ldb, 0, bf ? 2 : 1), idx1 = offsets(ldb, 16, bf ? 2 : 1);
    for (int64_t s = s0; s < s1; s++) {
        float *d = dst + s * kc * NR;
        int64_t j0 = s * NR, cols = n - j0 < NR ? n - j0 : NR;
        __mmask16 m0 = (__mmask16)(cols >= 16 ? 0xffff : (1u << cols) - 1);
        __mmask16 m1 = (__mmask16)(cols <= 16 ? 0 : cols >= 32 ? 0xffff : (1u << (cols - 16)) - 1);
        if (!tb) { /* row k of B holds the strip's columns contiguously */
            for (int64_t k = 0; k < kc; k++) {
                __m512 v0, v1;
                if (bf) {
                    const uint16_t *p = bb + k * ldb + j0;
                    v0 = widen16(_mm256_maskz_loadu_epi16(m0, p));
                    v1 = widen16(_mm256_maskz_loadu_epi16(m1, p + 16));
                } else {
                    const float *p = bfp + k * ldb + j0;
                    v0 = _mm512_maskz_loadu_ps(m0, p);
                    v1 = _mm512_maskz_loadu_ps(m1, p + 16);
                }
                _mm512_storeu_ps(d + k * NR, v0);
                _mm512_storeu_ps(d + k * NR + 16, v1);
            }
        } else if (bf) {
            const uint16_t *p = bb + j0 * ldb;
            for (int64_t k = 0; k + 1 < kc; k++) {
                _mm512_storeu_ps(d + k * NR, gather_bf16(p + k, idx0, m0));
                _mm512_storeu_ps(d + k * NR + 16, gather_bf16(p + k, idx1, m1));
            }
            for (int64_t c = 0; c < NR; c++) d[(kc - 1) * NR + c] = c < cols ? bf16_1(p[c * ldb + kc - 1]) : 0.0f;
        } else {
            const float *p = bfp + j0 * ldb;
            for (int64_t k = 0; k < kc; k++) {
                _mm512_storeu_ps(d + k * NR, gather_f32(p + k, idx0, m0));
                _mm512_storeu_ps(d + k * NR + 16, gather_f32(p + k, idx1, m1));
            }
        }
    }
}

const ct_gemm_kernels ct_gemm_avx512 = {
    .name = "avx512 12x32",
    .mr = MR,
    .nr = NR,
    .mc = 192,
    .nc = 3072,
    .kernel = kernel_12x32,
    .pack_a = pack_a_12,
    .pack_b = pack_b_32,
};
