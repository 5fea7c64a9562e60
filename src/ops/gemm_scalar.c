/* ctorch's GEMM: the generic packers and the scalar micro-kernel (see gemm_kernels.h).
 * The scalar kernel is plain C (4 x 8 tile); the compiler may vectorise or contract it,
 * so it meets the FMA kernels' bits only where it contracts (it is checked against the
 * double reference within the documented bound). */
#include "ops/gemm_kernels.h"
#include "ctorch/tensor.h"

#include <string.h>

#define SC_MR 4
#define SC_NR 8

void ct_gemm_pack_a_generic(float *dst, const void *A, int64_t lda, bool ta, bool bf, int64_t m, int64_t kc,
                            int mr, int64_t s0, int64_t s1)
{
    const float *af = A;
    const uint16_t *ab = A;
    for (int64_t s = s0; s < s1; s++) {
        float *d = dst + s * kc * mr;
        int64_t i0 = s * mr, rows = m - i0 < mr ? m - i0 : mr;
        if (rows < mr) memset(d, 0, (size_t)(kc * mr) * sizeof(float));
        if (ta) { /* op(A)(i, k) = A[k * lda + i]: row k of A holds the strip's mr values */
            for (int64_t k = 0; k < kc; k++) {
                float *dk = d + k * mr;
                if (bf)
                    for (int64_t r = 0; r < rows; r++) dk[r] = bf16f(ab[k * lda + i0 + r]);
                else
                    for (int64_t r = 0; r < rows; r++) dk[r] = af[k * lda + i0 + r];
            }
        } else {
            for (int64_t r = 0; r < rows; r++) {
                if (bf) {
                    const uint16_t *src = ab + (i0 + r) * lda;
                    for (int64_t k = 0; k < kc; k++) d[k * mr + r] = bf16f(src[k]);
                } else {
                    const float *src = af + (i0 + r) * lda;
                    for (int64_t k = 0; k < kc; k++) d[k * mr + r] = src[k];
                }
            }
        }
    }
}

void ct_gemm_pack_b_generic(float *dst, const void *B, int64_t ldb, bool tb, bool bf, int64_t kc, int64_t n,
                            int nr, int64_t s0, int64_t s1)
{
    const float *bfp = B;
    const uint16_t *bb = B;
    for (int64_t s = s0; s < s1; s++) {
        float *d = dst + s * kc * nr;
        int64_t j0 = s * nr, cols = n - j0 < nr ? n - j0 : nr;
        if (cols < nr) memset(d, 0, (size_t)(kc * nr) * sizeof(float));
        if (!tb) { /* op(B)(k, j) = B[k * ldb + j]: a row of B gives the strip's nr values */
            for (int64_t k = 0; k < kc; k++) {
                float *dk = d + k * nr;
                if (bf)
                    for (int64_t c = 0; c < cols; c++) dk[c] = bf16f(bb[k * ldb + j0 + c]);
                else
                    memcpy(dk, bfp + k * ldb + j0, (size_t)cols * sizeof(float));
            }
        } else {
            for (int64_t c = 0; c < cols; c++) {
                if (bf) {
                    const uint16_t *src = bb + (j0 + c) * ldb;
                    for (int64_t k = 0; k < kc; k++) d[k * nr + c] = bf16f(src[k]);
                } else {
                    const float *src = bfp + (j0 + c) * ldb;
                    for (int64_t k = 0; k < kc; k++) d[k * nr + c] = src[k];
                }
            }
        }
    }
}

static void kernel_4x8(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc, int m, int n,
                       float alpha, float beta)
{
    float acc[SC_MR][SC_NR] = {{0}};
    for (int64_t k = 0; k < kc; k++) {
        const float *a = ap + k * SC_MR, *b = bp + k * SC_NR;
        for (int i = 0; i < SC_MR; i++)
            for (int j = 0; j < SC_NR; j++) acc[i][j] += a[i] * b[j];
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float *p = c + i * ldc + j;
            *p = beta == 0.0f ? alpha * acc[i][j] : alpha * acc[i][j] + beta * *p;
        }
}

const ct_gemm_kernels ct_gemm_scalar = {
    .name = "scalar 4x8",
    .mr = SC_MR,
    .nr = SC_NR,
    .mc = 64,
    .nc = 1024,
    .kernel = kernel_4x8,
    .pack_a = ct_gemm_pack_a_generic,
    .pack_b = ct_gemm_pack_b_generic,
};
