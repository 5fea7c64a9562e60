/*
 * ctorch/ops.h - the kernels everything else is built from.
 *
 * Kernels take raw pointers and explicit sizes (llm.c style); every shape is stated at
 * the top of each declaration, row-major and contiguous unless said otherwise. Backward
 * kernels ACCUMULATE (+=) into parameter gradients (dweight, dbias) and WRITE input
 * gradients unless documented otherwise. All are deterministic: the same bits for any
 * thread count. Every fast kernel has a scalar path (CT_FORCE_ISA=scalar) and a naive
 * reference in its test (tests/c/test_ops_*.c, test_gemm.c) that it is compared against.
 *
 * This header gathers the per-topic headers.
 */
#ifndef CTORCH_OPS_H
#define CTORCH_OPS_H

#include "ctorch/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- GEMM (OpenBLAS sgemm in fixed blocks, or ctorch's own packed GEMM) ---------------- */

/** C[M,N] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T. A is [M,K] ([K,M] if
 *  trans_a), B is [K,N] ([N,K] if trans_b); lda/ldb/ldc are row strides (0 = dense; else at
 *  least the row length). beta == 0 never reads C. Which GEMM runs: see ct_gemm_select. */
CT_API ct_status ct_gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                             float alpha, const float *A, int64_t lda, const float *B,
                             int64_t ldb, float beta, float *C, int64_t ldc);

/** bf16 operands, f32 result and accumulation: same contract as ct_gemm_f32 with A and B
 *  in bf16 (ctorch's GEMM widens them while packing; the OpenBLAS path converts them in
 *  blocks, never all at once). */
CT_API ct_status ct_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                              float alpha, const uint16_t *A, int64_t lda, const uint16_t *B,
                              int64_t ldb, float beta, float *C, int64_t ldc);

/** The two GEMMs behind ct_gemm_f32 / ct_gemm_bf16. Both are deterministic (the same bits
 *  for any thread count); they differ from each other in the last bits. */
typedef enum ct_gemm_impl {
    CT_GEMM_AUTO = 0,     /**< the fixed rule of ct_gemm_select (or CT_GEMM when set) */
    CT_GEMM_OPENBLAS = 1, /**< OpenBLAS sgemm, single-threaded, on shape-fixed blocks */
    CT_GEMM_CTORCH = 2,   /**< ctorch's packed, cache-blocked GEMM (per-ISA micro-kernels) */
} ct_gemm_impl;

/** The GEMM an M x N x K product runs. In order: the impl forced by ct_gemm_set_impl; else
 *  CT_GEMM=openblas|ctorch from the environment; else a fixed rule on (instruction set, M,
 *  N, K), never a timing: ctorch's GEMM when OpenBLAS cannot be loaded or for the shapes
 *  where it measured faster (docs/architecture.md, "GEMM"), OpenBLAS otherwise. Errors:
 *  CT_EINVAL naming the value when CT_GEMM is neither openblas nor ctorch; CT_EUNSUPPORTED
 *  with the cause when OpenBLAS is forced and cannot be loaded. ct_gemm_f32 / ct_gemm_bf16
 *  fail with the same errors. The first GEMM logs once (component "gemm") which one runs:
 *  INFO, or WARN when OpenBLAS cannot be loaded. */
CT_API ct_status ct_gemm_select(int64_t M, int64_t N, int64_t K, ct_gemm_impl *out);

/** Force one GEMM for the process (tests and benchmarks); CT_GEMM_AUTO returns to CT_GEMM /
 *  the rule. CT_EINVAL for an unknown value, CT_EUNSUPPORTED (with the cause) when
 *  CT_GEMM_OPENBLAS is asked for and cannot be loaded. Not thread-safe against running GEMMs. */
CT_API ct_status ct_gemm_set_impl(ct_gemm_impl impl);

/** One line naming the GEMM policy in use, e.g. "openblas (ctorch avx2 6x16 for small
 *  shapes)", "ctorch avx2 6x16 (CT_GEMM)", "ctorch scalar 4x8 (OpenBLAS not loaded)", or
 *  "invalid CT_GEMM" (for `ctorch version`); valid until the thread calls it again. */
CT_API const char *ct_gemm_describe(void);

/** out[N,V] = inp[N,D] weight[V,D]^T + bias[V] (bias may be NULL). */
CT_API ct_status ct_linear_forward(float *out, const float *inp, const float *weight,
                                   const float *bias, int64_t N, int64_t D, int64_t V);

/** Backward of ct_linear_forward. dinp[N,D] is written (may be NULL to skip); dweight[V,D]
 *  and dbias[V] are accumulated (either may be NULL to skip). dout is [N,V]. */
CT_API ct_status ct_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, int64_t N, int64_t D,
                                    int64_t V);

/* ---- softmax ------------------------------------------------------------------------- */

/** out[N,C] = softmax(inp[N,C]) over the last dim (rows of length C). out may alias inp. */
CT_API ct_status ct_softmax_forward(float *out, const float *inp, int64_t N, int64_t C);
/** dinp[N,C] = out * (dout - sum(dout * out)) for out = softmax output. */
CT_API ct_status ct_softmax_backward(float *dinp, const float *dout, const float *out,
                                     int64_t N, int64_t C);
/** out[N,C] = log_softmax(inp[N,C]) over the last dim. out may alias inp. */
CT_API ct_status ct_log_softmax_forward(float *out, const float *inp, int64_t N, int64_t C);
/** dinp = dout - exp(out) * sum(dout) for out = log_softmax output. */
CT_API ct_status ct_log_softmax_backward(float *dinp, const float *dout, const float *out,
                                         int64_t N, int64_t C);

/** Row logsumexp: lse[N] = log(sum_c exp(inp[n,c])). Rows of -inf give -inf. */
CT_API ct_status ct_logsumexp_rows(float *lse, const float *inp, int64_t N, int64_t C);

#ifdef __cplusplus
}
#endif

#include "ctorch/ops_elementwise.h"
#include "ctorch/ops_norm.h"
#include "ctorch/ops_index.h"

#endif
