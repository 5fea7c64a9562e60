/* Row reductions: sum, mean, max/min (+ index), argmax, and the whole-tensor sum.
 *
 * The sum of a row is defined by one fixed order, whatever runs it: the row is cut into
 * blocks of SUM_BLOCK elements; a block is summed in double over 8 interleaved lanes
 * (element i goes to lane i % 8; lanes are then combined pairwise); block sums are added
 * in order in double; the total is rounded to f32 once. Plain double adds (no FMA, no
 * reassociation) make the bits the same on every thread count and ISA. Many rows run one
 * row per thread; a few long rows run their blocks in parallel, in batches whose partial
 * sums are then added in block order, which yields the same bits. */
#include "core/internal.h"
#include "ctorch/ops.h"

#include <math.h>
#include <string.h>

#define SUM_BLOCK 4096
#define SUM_BATCH 256 /* blocks per parallel batch when splitting a long row */

static double sum_block(const float *x, int64_t n)
{
    double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            l[j] += (double)x[i + j];
    for (int j = 0; i < n; i++, j++)
        l[j] += (double)x[i];
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static double sum_row(const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t b = 0; b < n; b += SUM_BLOCK)
        s += sum_block(x + b, n - b < SUM_BLOCK ? n - b : SUM_BLOCK);
    return s;
}

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
    for (int64_t r = r0; r < r1; r++) {
        double s = sum_row(c->inp + r * c->C, c->C);
        c->out[r] = (float)(c->mean ? s / (double)c->C : s);
    }
}

static void sum_blocks_body(void *p, int64_t b0, int64_t b1, int tid)
{
    red_ctx *c = p; /* inp: start of the batch, C: elements left from there */
    for (int64_t b = b0; b < b1; b++) {
        int64_t off = b * SUM_BLOCK, len = c->C - off < SUM_BLOCK ? c->C - off : SUM_BLOCK;
        c->partial[b] = sum_block(c->inp + off, len);
    }
}

/* sum_row(x, n) with the blocks computed in parallel: same bits. */
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
    *out = (float)(n > SUM_BLOCK ? sum_row_parallel(inp, n) : sum_row(inp, n));
    return CT_OK;
}

/* Four floats as a GNU vector (GCC and clang, any target): the max/min scan is a pure
 * selection, which compilers will not vectorise from scalar code without fast-math. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f v4_load(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* m ? a : b lane by lane (m lanes are 0 or -1) */
static inline v4f v4_pick(v4i m, v4f a, v4f b)
{
    return (v4f)((m & (v4i)a) | (~m & (v4i)b));
}

/* Position of the max (sign > 0) or min (sign < 0) of x[0..n), n >= 1: first occurrence
 * on ties, the first NaN if any. Two passes: the extreme value over 8 lanes with a NaN
 * flag, then the first position holding it (or the first NaN). */
static int64_t extreme_index(const float *x, int64_t n, int sign)
{
    v4f a0 = {x[0], x[0], x[0], x[0]}, a1 = a0;
    v4i nan = {0, 0, 0, 0};
    int64_t i = 0;
    if (sign > 0) {
        for (; i + 8 <= n; i += 8) {
            v4f v0 = v4_load(x + i), v1 = v4_load(x + i + 4);
            nan |= (v0 != v0) | (v1 != v1);
            a0 = v4_pick(v0 > a0, v0, a0);
            a1 = v4_pick(v1 > a1, v1, a1);
        }
    } else {
        for (; i + 8 <= n; i += 8) {
            v4f v0 = v4_load(x + i), v1 = v4_load(x + i + 4);
            nan |= (v0 != v0) | (v1 != v1);
            a0 = v4_pick(v0 < a0, v0, a0);
            a1 = v4_pick(v1 < a1, v1, a1);
        }
    }
    float m = x[0];
    int any_nan = nan[0] | nan[1] | nan[2] | nan[3];
    for (int j = 0; j < 8; j++) {
        float v = j < 4 ? a0[j] : a1[j - 4];
        if (sign > 0 ? v > m : v < m) m = v;
    }
    for (; i < n; i++) {
        float v = x[i];
        if (sign > 0 ? v > m : v < m) m = v;
        any_nan |= v != v;
    }
    if (any_nan || m != m) {
        for (i = 0; !isnan(x[i]); i++) {
        }
        return i;
    }
    for (i = 0; x[i] != m; i++) {
    }
    return i;
}

static void extreme_body(void *p, int64_t r0, int64_t r1, int tid)
{
    red_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->inp + r * c->C;
        int64_t i = extreme_index(x, c->C, c->sign);
        if (c->out) c->out[r] = x[i];
        if (c->idx) c->idx[r] = i;
    }
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
