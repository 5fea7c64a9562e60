/* ctorch's GEMM: the AVX-512F micro-kernel, 12 x 32 (24 zmm accumulators, two B vectors and
 * one A broadcast per k). Contract in gemm_kernels.h: the same bits as the AVX2 kernel (both
 * sum k in ascending order with FMA per C element and share the epilogue). */
#include "ops/gemm_kernels.h"

#include <immintrin.h>
#include <math.h>

#define MR 12
#define NR 32

static void kernel_12x32(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc, int m, int n,
                         float alpha, float beta)
{
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

const ct_gemm_kernels ct_gemm_avx512 = {
    .name = "avx512 12x32",
    .mr = MR,
    .nr = NR,
    .mc = 192,
    .nc = 3072,
    .kernel = kernel_12x32,
    .pack_a = ct_gemm_pack_a_generic,
    .pack_b = ct_gemm_pack_b_generic,
};
