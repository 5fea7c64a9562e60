/*
 * ctorch/ops_index.h - embedding, row reductions, sort / top-k, gather / scatter.
 *
 * Conventions of ops.h: raw pointers and explicit sizes, row-major contiguous, every
 * result the same bits for any thread count. "Rows" are the last dim of a [N, C] array;
 * reduce over a whole tensor by calling with N = 1. Values are f32, indices int64.
 * Output buffers must not overlap the inputs unless a function says otherwise. A NULL
 * pointer is allowed only where the array it stands for is empty, or where a parameter
 * is documented as optional. Bad arguments give CT_EINVAL with a message that names the
 * argument (and, for an index, its position and value); nothing is written then.
 *
 * NaN follows PyTorch: it is the largest value for sort and top-k (last ascending, first
 * descending), and ct_max_rows / ct_min_rows / ct_argmax_rows return the first NaN of a row.
 */
#ifndef CTORCH_OPS_INDEX_H
#define CTORCH_OPS_INDEX_H

#include "ctorch/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- embedding -------------------------------------------------------------------------- */

/** padding_idx value meaning "no padding row" for ct_embedding_backward. */
#define CT_EMBEDDING_NO_PADDING (-1)

/** out[N, D] = table[ids[n], :] (torch.nn.functional.embedding).
 *  ids [N] is int64 or int32 (ids_dtype CT_DTYPE_I64 / CT_DTYPE_I32); table is [V, D] f32.
 *  Every id must lie in [0, V): otherwise CT_EINVAL naming the first bad position and its
 *  value, and out is untouched. */
CT_API ct_status ct_embedding_forward(float *out, const void *ids, ct_dtype ids_dtype,
                                      const float *table, int64_t N, int64_t V, int64_t D);

/** As ct_embedding_forward with a bf16 table [V, D] (uint16_t bit patterns): rows are
 *  widened exactly to f32 into out[N, D]. */
CT_API ct_status ct_embedding_forward_bf16(float *out, const void *ids, ct_dtype ids_dtype,
                                           const uint16_t *table, int64_t N, int64_t V, int64_t D);

/** Backward of the embedding: dtable[ids[n], :] += dout[n, :] for every n, ACCUMULATED
 *  into dtable [V, D] (zero it first for a fresh gradient). dout is [N, D]; ids as in the
 *  forward. Tokens whose id equals padding_idx are skipped (torch's padding_idx); pass
 *  CT_EMBEDDING_NO_PADDING (any negative value) for none; a torch-style negative padding
 *  index must be turned into V + padding_idx by the caller. Each dtable row receives its
 *  tokens in token order (n ascending) with no atomics: threads own column blocks of
 *  dtable, so the bits do not depend on the thread count. Ids outside [0, V): CT_EINVAL
 *  naming the position and value, dtable untouched. */
CT_API ct_status ct_embedding_backward(float *dtable, const float *dout, const void *ids,
                                       ct_dtype ids_dtype, int64_t N, int64_t V, int64_t D,
                                       int64_t padding_idx);

/* ---- reductions over the last dim --------------------------------------------------------- */

/** out[N] = sum of each row of inp[N, C]; 0 for C == 0. The sum is accumulated in double
 *  in a fixed order (8 interleaved lanes per block of 4096 elements, block sums added in
 *  order) and rounded to f32 once, so the result is independent of threads and ISA. Long
 *  rows are split into blocks across threads when N is small. */
CT_API ct_status ct_sum_rows(float *out, const float *inp, int64_t N, int64_t C);

/** out[N] = mean of each row of inp[N, C] (the ct_sum_rows sum divided by C in double);
 *  NaN for C == 0, as torch. */
CT_API ct_status ct_mean_rows(float *out, const float *inp, int64_t N, int64_t C);

/** values[N] = max of each row of inp[N, C], indices[N] = its position (int64): the first
 *  occurrence on ties, the first NaN if the row has one (torch.max(x, dim=-1)). Either
 *  output may be NULL (not computed). C must be >= 1 when N > 0. */
CT_API ct_status ct_max_rows(float *values, int64_t *indices, const float *inp, int64_t N,
                             int64_t C);

/** As ct_max_rows for the minimum (torch.min(x, dim=-1)). */
CT_API ct_status ct_min_rows(float *values, int64_t *indices, const float *inp, int64_t N,
                             int64_t C);

/** indices[N] = position of the max of each row of inp[N, C] (torch.argmax(x, -1)): first
 *  occurrence on ties, first NaN if any. C must be >= 1 when N > 0. */
CT_API ct_status ct_argmax_rows(int64_t *indices, const float *inp, int64_t N, int64_t C);

/** *out = sum of inp[n] (n >= 0 elements; 0 when n == 0): the ct_sum_rows sum with N = 1,
 *  its blocks spread over the threads. Same bits for any thread count. */
CT_API ct_status ct_sum_all(float *out, const float *inp, int64_t n);

/* ---- sort and top-k ----------------------------------------------------------------------- */

/** Sort each row of inp[N, C]: values[N, C] gets the sorted values, indices[N, C] (int64)
 *  their positions in the row (torch.sort(x, dim=-1, descending, stable)). Either output
 *  may be NULL (not written); values must not overlap inp. NaN is the largest value; -0.0
 *  and +0.0 compare equal. The order is always the stable one (ties keep their input
 *  order, in both directions), so `stable` only documents intent. Scratch: 24 * C bytes
 *  per thread in use, from ct_alloc (CT_ENOMEM if refused). */
CT_API ct_status ct_sort_rows(float *values, int64_t *indices, const float *inp, int64_t N,
                              int64_t C, bool descending, bool stable);

/** indices[N, C] = torch.argsort(inp, dim=-1, descending, stable): ct_sort_rows without
 *  the values. */
CT_API ct_status ct_argsort_rows(int64_t *indices, const float *inp, int64_t N, int64_t C,
                                 bool descending, bool stable);

/** The k largest (largest = true) or smallest values of each row of inp[N, C] into
 *  values[N, k] and their positions into indices[N, k] (torch.topk(x, k, -1, largest,
 *  sorted)); 0 <= k <= C. Either output may be NULL. Results are always sorted (best first)
 *  whatever `sorted` says. On ties the lower position wins and comes first: the result is
 *  the first k of the stable ct_sort_rows order (torch leaves tie order unspecified).
 *  NaN counts as the largest value. Scratch from ct_alloc per thread in use: 16 * k bytes
 *  when k <= C / 8 (a bounded heap), else 24 * C (a full sort). */
CT_API ct_status ct_topk_rows(float *values, int64_t *indices, const float *inp, int64_t N,
                              int64_t C, int64_t k, bool largest, bool sorted);

/* ---- gather / scatter along the last dim -------------------------------------------------- */

/** out[n, k] = inp[n, index[n, k]] for inp [N, C], index and out [N, K]
 *  (torch.gather(inp, -1, index)). Every index must lie in [0, C) (no wrap-around, as
 *  torch): otherwise CT_EINVAL naming row, column and value. The backward is a scatter-add:
 *  dinp = 0; ct_scatter_add_rows(dinp, dout, index, N, C, K). */
CT_API ct_status ct_gather_rows(float *out, const float *inp, const int64_t *index, int64_t N,
                                int64_t C, int64_t K);

/** In place: out[n, index[n, k]] = src[n, k] for out [N, C], src and index [N, K]
 *  (torch.Tensor.scatter_(-1, index, src)). k runs in increasing order, so with duplicate
 *  indices in a row the LAST k wins, deterministically. Index rules as ct_gather_rows. */
CT_API ct_status ct_scatter_rows(float *out, const float *src, const int64_t *index, int64_t N,
                                 int64_t C, int64_t K);

/** In place: out[n, index[n, k]] += src[n, k] in increasing k order (deterministic with
 *  duplicates; torch.Tensor.scatter_add_(-1, index, src)). Index rules as ct_gather_rows. */
CT_API ct_status ct_scatter_add_rows(float *out, const float *src, const int64_t *index, int64_t N,
                                     int64_t C, int64_t K);

#ifdef __cplusplus
}
#endif
#endif
