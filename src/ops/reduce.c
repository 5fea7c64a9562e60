/* Row reductions: sum, mean, max/min (+ index), argmax, and the whole-tensor sum: argument
 * checks and threading. The row bodies are the reduce kernel table of reduce_kernels.h
 * (reduce_scalar.c, reduce_avx2.c), which also documents the one fixed summation order
 * every body follows, so the bits are the same on every thread count and ISA. Many rows run
 * one row per thread; a few long rows run their blocks in parallel, in batches whose partial
 * sums are then added in block order, which yields the same bits. */
#include "core/internal.h"
#include "ctorch/ops.h"
#include "ops/reduce_kernels.h"

#define SUM_BLOCK CT_SUM_BLOCK
#define SUM_BATCH 256 /* blocks per parallel batch when splitting a long row */

#if defined(__x86_64__)
#define REDUCE_AVX2 &ct_reduce_avx2
#define REDUCE_AVX512 &ct_reduce_avx512
#else
#define REDUCE_AVX2 &ct_reduce_scalar
#define REDUCE_AVX512 &ct_reduce_scalar
#endif

#if defined(__aarch64__)
#define REDUCE_NEON &ct_reduce_neon
#define REDUCE_SVE &ct_reduce_sve
#else
#define REDUCE_NEON &ct_reduce_scalar
#define REDUCE_SVE &ct_reduce_scalar
#endif

/* avx2 / avx512 / neon / sve have their own max/min scans (their sums are the scalar bodies:
 * latency bound in the fixed order); AArch64's bodies only on AArch64, the scalar table
 * elsewhere. */
const ct_reduce_kernels *const ct_reduce_tables[CT_ISA_COUNT] = {
    [CT_ISA_SCALAR] = &ct_reduce_scalar, [CT_ISA_AVX2] = REDUCE_AVX2,
    [CT_ISA_AVX512] = REDUCE_AVX512,     [CT_ISA_NEON] = REDUCE_NEON,
    [CT_ISA_SVE] = REDUCE_SVE,
};

static ct_status rows_check(const char *fn, const void *out, const char *out_name, const float *inp,
                            int64_t N, int64_t C)
{
    if (N < 0) return ct_error(CT_EINVAL, "%s: N must be >= 0, got %lld", fn, (long long)N);
    if (C < 0) return ct_error(CT_EINVAL, "%s: C must be >= 0, got %lld", fn, (long long)C);
    size_t bytes;
    if (!ct_mul_size((size_t)N, (size_t)C, &bytes))
        return ct_error(CT_EOVERFLOW, "%s: N * C overflows", fn);
    if (N && out_name && !out) return ct_error(CT_EINVAL, "%s: %s must not be NULL", fn, out_name);
    if (N && C && !inp) return ct_error(CT_EINVAL, "%s: inp must not be NULL", fn);
    return CT_OK;
}

typedef struct {
    float *out;
    int64_t *idx;
    const float *inp;
    int64_t C;
    int mean; /* divide the sum by C */
    int sign; /* +1 max, -1 min */
    double *partial;
} red_ctx;

static void sum_rows_body(void *p, int64_t r0, int64_t r1, int tid)
{
    red_ctx *c = p;
    CT_KERNELS(ct_reduce_tables)->sum_rows(c->out, c->inp, r0, r1, c->C, c->mean);
}

static void sum_blocks_body(void *p, int64_t b0, int64_t b1, int tid)
{
    red_ctx *c = p; /* inp: start of the batch, C: elements left from there */
    double (*sum_block)(const float *, int64_t) = CT_KERNELS(ct_reduce_tables)->sum_block;
    for (int64_t b = b0; b < b1; b++) {
        int64_t off = b * SUM_BLOCK, len = c->C - off < SUM_BLOCK ? c->C - off : SUM_BLOCK;
        c->partial[b] = sum_block(c->inp + off, len);
    }
}

/* The fixed-order sum of x[0..n) with its blocks computed in parallel: same bits. */
static double sum_row_parallel(const float *x, int64_t n)
{
    double partial[SUM_BATCH];
    double s = 0.0;
    for (int64_t start = 0; start < n; start += (int64_t)SUM_BLOCK * SUM_BATCH) {
        int64_t left = n - start;
        int64_t nb = (left + SUM_BLOCK - 1) / SUM_BLOCK;
        if (nb > SUM_BATCH) nb = SUM_BATCH;
        red_ctx c = {NULL, NULL, x + start, left, 0, 0, partial};
        ct_parallel_for(nb, sum_blocks_body, &c);
        for (int64_t b = 0; b < nb; b++)
            s += partial[b];
    }
    return s;
}

static ct_status sum_rows_impl(const char *fn, float *out, const float *inp, int64_t N, int64_t C,
                               int mean)
{
    CT_TRY(rows_check(fn, out, "out", inp, N, C));
    if (N == 0) return CT_OK;
    if (C > SUM_BLOCK && N < ct_num_threads()) {
        for (int64_t r = 0; r < N; r++) {
            double s = sum_row_parallel(inp + r * C, C);
            out[r] = (float)(mean ? s / (double)C : s);
        }
        return CT_OK;
    }
    red_ctx c = {out, NULL, inp, C, mean, 0, NULL};
    ct_parallel_for(N, sum_rows_body, &c);
    return CT_OK;
}

ct_status ct_sum_rows(float *out, const float *inp, int64_t N, int64_t C)
{
    return sum_rows_impl("ct_sum_rows", out, inp, N, C, 0);
}

ct_status ct_mean_rows(float *out, const float *inp, int64_t N, int64_t C)
{
    return sum_rows_impl("ct_mean_rows", out, inp, N, C, 1);
}

ct_status ct_sum_all(float *out, const float *inp, int64_t n)
{
    if (!out) return ct_error(CT_EINVAL, "ct_sum_all: out must not be NULL");
    if (n < 0) return ct_error(CT_EINVAL, "ct_sum_all: n must be >= 0, got %lld", (long long)n);
    if (n && !inp) return ct_error(CT_EINVAL, "ct_sum_all: inp must not be NULL");
    if (n > SUM_BLOCK)
        *out = (float)sum_row_parallel(inp, n);
    else if (n > 0)
        CT_KERNELS(ct_reduce_tables)->sum_rows(out, inp, 0, 1, n, 0); /* one row of n */
    else
        *out = 0.0f;
    return CT_OK;
}

static void extreme_body(void *p, int64_t r0, int64_t r1, int tid)
{
    red_ctx *c = p;
    CT_KERNELS(ct_reduce_tables)->extreme_rows(c->out, c->idx, c->inp, r0, r1, c->C, c->sign);
}

static ct_status extreme_impl(const char *fn, float *values, int64_t *indices, const float *inp,
                              int64_t N, int64_t C, int sign)
{
    CT_TRY(rows_check(fn, NULL, NULL, inp, N, C));
    if (N && C == 0)
        return ct_error(CT_EINVAL, "%s: C must be >= 1 (a reduction over an empty row has no %s)",
                        fn, sign > 0 ? "maximum" : "minimum");
    if (!values && !indices) return CT_OK;
    red_ctx c = {values, indices, inp, C, 0, sign, NULL};
    ct_parallel_for(N, extreme_body, &c);
    return CT_OK;
}

ct_status ct_max_rows(float *values, int64_t *indices, const float *inp, int64_t N, int64_t C)
{
    return extreme_impl("ct_max_rows", values, indices, inp, N, C, 1);
}

ct_status ct_min_rows(float *values, int64_t *indices, const float *inp, int64_t N, int64_t C)
{
    return extreme_impl("ct_min_rows", values, indices, inp, N, C, -1);
}

ct_status ct_argmax_rows(int64_t *indices, const float *inp, int64_t N, int64_t C)
{
    if (N > 0 && !indices) return ct_error(CT_EINVAL, "ct_argmax_rows: indices must not be NULL");
    return extreme_impl("ct_argmax_rows", NULL, indices, inp, N, C, 1);
}
