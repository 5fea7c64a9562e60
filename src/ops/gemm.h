/* Private: what ct_gemm_f32 allocates, so callers with a memory budget can plan for it. */
#ifndef CT_OPS_GEMM_H
#define CT_OPS_GEMM_H

#include <stddef.h>
#include <stdint.h>

/* Scratch bytes ct_gemm_f32 takes for an M x N x K product, whichever GEMM runs: the
 * OpenBLAS path's K-split partial sums (0 for its tile grid; at most 8 M N floats) or ctorch's
 * packed panels (double-buffered: at most 2 (8 MC + NC) * CT_GEMM_KC floats of the active
 * kernel table, whatever the thread count). */
size_t ct_gemm_scratch_bytes(int64_t M, int64_t N, int64_t K);

/* Upper bound of that scratch per row of M: 8 N floats. */
#define CT_GEMM_SCRATCH_PER_ROW(N) ((size_t)8 * (size_t)(N) * sizeof(float))

#endif
