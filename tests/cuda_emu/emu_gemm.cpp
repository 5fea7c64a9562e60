/*
 * The emulated CUDA device (tests only): the gemm slot in place of src/cuda/cuda_gemm.cu
 * (cuBLASLt does not run on the CPU). The same contract, ct_gemm_f32's, row-major:
 * C[M, N] (ldc) = alpha op(A) op(B) + beta C with op(X) = X or X^T, A and B f32 or bf16 (bf16
 * widened exactly to f32), C f32; beta == 0 never reads C (NaN there stays out); K == 0 gives
 * beta C. Each element is one double sum over k in order, then alpha * sum + beta * C in double
 * rounded once to f32: deterministic, and within rounding of any f32 GEMM.
 */
#include "cuda/cuda_internal.cuh"

#include <string.h>

static double elem(const void *p, int64_t i, bool bf16)
{
    if (!bf16) return (double)((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return (double)__uint_as_float((uint32_t)h << 16);
}

extern "C" int ctcu_gemm(ct_backend *b, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc,
                         ct_dtype dtype)
{
    (void)b;
    if (dtype != CT_DTYPE_F32 && dtype != CT_DTYPE_BF16)
        return ctcu_fail(CT_EUNSUPPORTED, "gemm: operands of dtype %d (f32 or bf16 only)", (int)dtype);
    if (M == 0 || N == 0) return 0;
    if (M < 0 || N < 0 || K < 0)
        return ctcu_fail(CT_EINVAL, "gemm: M = %lld, N = %lld, K = %lld must be >= 0", (long long)M, (long long)N,
                         (long long)K);
    if (!emu_device_pointer_ok(C) || (K > 0 && (!emu_device_pointer_ok(A) || !emu_device_pointer_ok(B))))
        return ctcu_fail(CT_EINTERNAL, "gemm (emulated device): an operand is not in device memory (A %p, B %p, C %p)",
                         A, B, (void *)C);
    const bool bf = dtype == CT_DTYPE_BF16;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double a = elem(A, trans_a ? k * lda + m : m * lda + k, bf);
                double v = elem(B, trans_b ? n * ldb + k : k * ldb + n, bf);
                s += a * v;
            }
            double r = (double)alpha * s;
            if (beta != 0.0f) r += (double)beta * (double)C[m * ldc + n];
            C[m * ldc + n] = (float)r;
        }
    return 0;
}

extern "C" const char *ctcu_gemm_describe(void)
{
    return "reference GEMM of the emulated device (double sums in k order; no cuBLASLt)";
}

extern "C" void ctcu_gemm_close(ct_backend *b)
{
    (void)b;
}
