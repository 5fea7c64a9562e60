/* ctorch's GEMM: the AVX2 + FMA micro-kernel, 6 x 16 (12 ymm accumulators, two B vectors
 * and one A broadcast per k). Contract in gemm_kernels.h; same bits as every FMA kernel. */
#include "ops/gemm_kernels.h"

#include <immintrin.h>
#include <math.h>

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

const ct_gemm_kernels ct_gemm_avx2 = {
    .name = "avx2 6x16",
    .mr = MR,
    .nr = NR,
    .mc = 144,
    .nc = 3072,
    .kernel = kernel_6x16,
    .pack_a = ct_gemm_pack_a_generic,
    .pack_b = ct_gemm_pack_b_generic,
};
