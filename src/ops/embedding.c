/* Embedding lookup and its gradient. The backward gives each task a block of dtable
 * COLUMNS (and, when there are fewer column blocks than threads, a range of vocabulary
 * rows): every task walks all tokens in order and adds the columns it owns for the ids in
 * its range, so each dtable element is summed in token order by one owner, without atomics
 * or scratch, and the same bits come out for any thread count. Column blocks alone keep the
 * work balanced however skewed the ids are; the vocabulary split (only for narrow tables
 * on many threads) relies on the pool's dynamic chunks for balance. */
#include "core/internal.h"
#include "ctorch/ops.h"

#include <string.h>

/* Columns per block of the backward: 16 floats = one cache line. */
#define EMB_COL_BLOCK 16

static inline int64_t load_id(const void *ids, ct_dtype dt, int64_t n)
{
    return dt == CT_DTYPE_I64 ? ((const int64_t *)ids)[n] : ((const int32_t *)ids)[n];
}

/* Argument rules shared by the three entry points; then every id must be in [0, V). */
static ct_status emb_check(const char *fn, const void *a, const char *a_name, const void *ids,
                           ct_dtype dt, const void *table, const char *table_name, int64_t N,
                           int64_t V, int64_t D)
{
    if (N < 0) return ct_error(CT_EINVAL, "%s: N must be >= 0, got %lld", fn, (long long)N);
    if (V < 0) return ct_error(CT_EINVAL, "%s: V must be >= 0, got %lld", fn, (long long)V);
    if (D < 0) return ct_error(CT_EINVAL, "%s: D must be >= 0, got %lld", fn, (long long)D);
    if (dt != CT_DTYPE_I64 && dt != CT_DTYPE_I32)
        return ct_error(CT_EINVAL, "%s: ids_dtype must be CT_DTYPE_I64 or CT_DTYPE_I32, got %s", fn,
                        ct_dtype_name(dt));
    size_t bytes;
    if (!ct_mul_size((size_t)N, (size_t)D, &bytes) || !ct_mul_size((size_t)V, (size_t)D, &bytes))
        return ct_error(CT_EOVERFLOW, "%s: N * D or V * D overflows", fn);
    if (N && !ids) return ct_error(CT_EINVAL, "%s: ids must not be NULL", fn);
    if (N && D && !a) return ct_error(CT_EINVAL, "%s: %s must not be NULL", fn, a_name);
    if (N && D && !table) return ct_error(CT_EINVAL, "%s: %s must not be NULL", fn, table_name);
    for (int64_t n = 0; n < N; n++) {
        int64_t id = load_id(ids, dt, n);
        if (id < 0 || id >= V)
            return ct_error(CT_EINVAL, "%s: ids[%lld] = %lld is outside [0, V = %lld)", fn,
                            (long long)n, (long long)id, (long long)V);
    }
    return CT_OK;
}

typedef struct {
    float *out;
    const void *ids;
    const void *table;
    const float *dout;
    ct_dtype dt;
    int64_t N, D, pad;
    int64_t V, nb, parts; /* backward: vocabulary size, column blocks, vocabulary parts */
} emb_ctx;

static void emb_fwd_f32(void *p, int64_t n0, int64_t n1, int tid)
{
    emb_ctx *c = p;
    const float *table = c->table;
    for (int64_t n = n0; n < n1; n++)
        memcpy(c->out + n * c->D, table + load_id(c->ids, c->dt, n) * c->D,
               (size_t)c->D * sizeof(float));
}

static void emb_fwd_bf16(void *p, int64_t n0, int64_t n1, int tid)
{
    emb_ctx *c = p;
    const uint16_t *table = c->table;
    for (int64_t n = n0; n < n1; n++)
        ct_convert_bf16_to_f32(c->out + n * c->D, table + load_id(c->ids, c->dt, n) * c->D,
                               (size_t)c->D);
}

ct_status ct_embedding_forward(float *out, const void *ids, ct_dtype ids_dtype, const float *table,
                               int64_t N, int64_t V, int64_t D)
{
    CT_TRY(emb_check("ct_embedding_forward", out, "out", ids, ids_dtype, table, "table", N, V, D));
    emb_ctx c = {out, ids, table, NULL, ids_dtype, N, D, -1, 0, 0, 0};
    ct_parallel_for(D ? N : 0, emb_fwd_f32, &c);
    return CT_OK;
}

ct_status ct_embedding_forward_bf16(float *out, const void *ids, ct_dtype ids_dtype,
                                    const uint16_t *table, int64_t N, int64_t V, int64_t D)
{
    CT_TRY(emb_check("ct_embedding_forward_bf16", out, "out", ids, ids_dtype, table, "table", N, V,
                     D));
    emb_ctx c = {out, ids, table, NULL, ids_dtype, N, D, -1, 0, 0, 0};
    ct_parallel_for(D ? N : 0, emb_fwd_bf16, &c);
    return CT_OK;
}

/* Tasks [t0, t1) of the backward: task t owns column block t % nb of the vocabulary rows
 * in part t / nb, and adds all of its tokens in order. */
static void emb_bwd_cols(void *p, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    emb_ctx *c = p;
    for (int64_t t = t0; t < t1; t++) {
        int64_t b = t % c->nb, part = t / c->nb;
        int64_t v0 = c->V * part / c->parts, v1 = c->V * (part + 1) / c->parts;
        int64_t c0 = b * EMB_COL_BLOCK, c1 = c0 + EMB_COL_BLOCK;
        if (c1 > c->D) c1 = c->D;
        const int64_t w = c1 - c0;
        for (int64_t n = 0; n < c->N; n++) {
            int64_t id = load_id(c->ids, c->dt, n);
            if (id == c->pad || id < v0 || id >= v1) continue;
            float *restrict dst = c->out + id * c->D + c0;
            const float *restrict src = c->dout + n * c->D + c0;
            for (int64_t j = 0; j < w; j++)
                dst[j] += src[j];
        }
    }
}

ct_status ct_embedding_backward(float *dtable, const float *dout, const void *ids,
                                ct_dtype ids_dtype, int64_t N, int64_t V, int64_t D,
                                int64_t padding_idx)
{
    const char *fn = "ct_embedding_backward";
    CT_TRY(emb_check(fn, dout, "dout", ids, ids_dtype, dtable, "dtable", N, V, D));
    if (padding_idx >= V)
        return ct_error(CT_EINVAL,
                        "%s: padding_idx = %lld must be < V = %lld (or negative for none)", fn,
                        (long long)padding_idx, (long long)V);
    if (!N || !D) return CT_OK;
    int64_t nb = (D + EMB_COL_BLOCK - 1) / EMB_COL_BLOCK, T = ct_num_threads();
    /* Split the vocabulary too when the column blocks alone leave threads idle (narrow
     * tables); never so finely that a task's share of the tokens is tiny. */
    int64_t parts = nb >= 2 * T ? 1 : (2 * T + nb - 1) / nb;
    if (parts > V) parts = V;
    if (parts > N / 64 + 1) parts = N / 64 + 1;
    emb_ctx c = {dtable, ids, NULL, dout, ids_dtype, N, D, padding_idx < 0 ? -1 : padding_idx,
                 V, nb, parts};
    /* A task adds about N / parts rows of 16 floats: a grain of about 16 K floats. */
    int64_t per = N / parts * EMB_COL_BLOCK, grain = per >= 16384 ? 1 : 16384 / (per + 1) + 1;
    ct_parallel_for_grain(nb * parts, grain, emb_bwd_cols, &c);
    return CT_OK;
}
