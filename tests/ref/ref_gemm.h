/* Naive double reference of the GEMM family (issue 12), shared by tests/c/test_gemm_own.c
 * and `ctorch bench gemm`'s checks: C = alpha op(A) op(B) + beta C in double, plus the sum
 * of |terms| that the error bound of docs/architecture.md ("GEMM") scales with.
 * Header-only, static inline. Row-major, row strides lda / ldb / ldc; op(A)(i, k) =
 * ta ? A[k * lda + i] : A[i * lda + k], op(B)(k, j) = tb ? B[j * ldb + k] : B[k * ldb + j]. */
#ifndef CT_TESTS_REF_GEMM_H
#define CT_TESTS_REF_GEMM_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* ref[i * N + j] = alpha sum_k op(A)(i,k) op(B)(k,j) + beta c0 (beta == 0: c0 ignored);
 * mag[i * N + j] = |alpha| sum_k |op(A)(i,k) op(B)(k,j)| + |beta c0| (mag may be NULL). */
static inline void ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const float *A,
                            int64_t lda, const float *B, int64_t ldb, double beta, const float *C0, int64_t ldc,
                            double *ref, double *mag)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, m = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
                s += p;
                m += fabs(p);
            }
            double c = beta == 0 ? 0 : beta * (double)C0[i * ldc + j];
            ref[i * N + j] = alpha * s + c;
            if (mag) mag[i * N + j] = fabs(alpha) * m + fabs(c);
        }
}

/* The documented bound for an f32 GEMM with f32 accumulation, any summation order and any
 * K slicing of at least 64: |C - ref| <= (K + K / 64 + 4) u mag, u = 2^-24 (one rounding per
 * product and addition, one per K slice folded into C, alpha, beta, the last), plus a
 * denormal-scale slack. */
static inline double ref_gemm_bound(int64_t K, double mag)
{
    return (double)(K + K / 64 + 4) * 0x1p-24 * mag + 1e-30;
}

#endif
