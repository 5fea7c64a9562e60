/* Private: what ct_gemm_f32 allocates, so callers with a memory budget can plan for it. */
#ifndef CT_OPS_GEMM_H
#define CT_OPS_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctorch/core.h"

/* Scratch bytes ct_gemm_f32 takes for an M x N x K product, whichever GEMM runs: the
 * OpenBLAS path's K-split partial sums (0 for its tile grid; at most 8 M N floats) or ctorch's
 * packed panels (double-buffered: at most 2 (8 MC + NC) * CT_GEMM_KC floats of the active
 * kernel table, whatever the thread count). */
size_t ct_gemm_scratch_bytes(int64_t M, int64_t N, int64_t K);

/* Upper bound of that scratch per row of M: 8 N floats. */
#define CT_GEMM_SCRATCH_PER_ROW(N) ((size_t)8 * (size_t)(N) * sizeof(float))

/* C = alpha op(A) op(B) + beta C where each operand is f32 or bf16 (a_bf16 / b_bf16; strides as
 * ct_gemm_f32's). Both f32: ct_gemm_f32. Any bf16 operand: ctorch's own GEMM whatever the rule
 * says, widening bf16 while it packs (nothing converted ahead: OpenBLAS's bf16 path converts a
 * whole operand), never the bf16 dot instructions: the bits are those of ctorch's f32 GEMM on
 * the operands widened to f32 (widening is exact), on every CPU. Scratch: the panels of
 * ct_gemm_mixed_scratch_bytes. */
size_t ct_gemm_mixed_scratch_bytes(int64_t M, int64_t N, int64_t K, bool a_bf16, bool b_bf16);
ct_status ct_gemm_mixed(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                        bool a_bf16, int64_t lda, const void *B, bool b_bf16, int64_t ldb, float beta, float *C,
                        int64_t ldc);

#endif
