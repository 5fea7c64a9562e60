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

/* ---- GEMM (CBLAS sgemm underneath) ----------------------------------------------------- */

/** C[M,N] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T. A is [M,K] ([K,M] if
 *  trans_a), B is [K,N] ([N,K] if trans_b); lda/ldb/ldc are row strides (0 = dense). */
CT_API ct_status ct_gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                             float alpha, const float *A, int64_t lda, const float *B,
                             int64_t ldb, float beta, float *C, int64_t ldc);

/** bf16 operands, f32 result and accumulation: same contract as ct_gemm_f32 with A and B
 *  in bf16 (converted to f32 in blocks, never all at once). */
CT_API ct_status ct_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                              float alpha, const uint16_t *A, int64_t lda, const uint16_t *B,
                              int64_t ldb, float beta, float *C, int64_t ldc);

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
