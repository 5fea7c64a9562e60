/* Portable row reduction bodies (see reduce_kernels.h): the fixed-order sums as plain double
 * loops; the max/min scan in GCC vector extensions (GCC and clang, any target), since the
 * compilers will not vectorise a pure selection from scalar code without fast-math. */
#include "ops/reduce_kernels.h"

#include <math.h>
#include <string.h>

double ct_reduce_sum_block_scalar(const float *x, int64_t n)
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

void ct_reduce_sum_rows_scalar(float *out, const float *inp, int64_t r0, int64_t r1, int64_t C,
                               int mean)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        double s = 0.0;
        for (int64_t b = 0; b < C; b += CT_SUM_BLOCK)
            s += ct_reduce_sum_block_scalar(x + b, C - b < CT_SUM_BLOCK ? C - b : CT_SUM_BLOCK);
        out[r] = (float)(mean ? s / (double)C : s);
    }
}

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

static void extreme_rows_scalar(float *values, int64_t *idx, const float *inp, int64_t r0,
                                int64_t r1, int64_t C, int sign)
{
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        int64_t i = extreme_index(x, C, sign);
        if (values) values[r] = x[i];
        if (idx) idx[r] = i;
    }
}

const ct_reduce_kernels ct_reduce_scalar = {
    .sum_block = ct_reduce_sum_block_scalar,
    .sum_rows = ct_reduce_sum_rows_scalar,
    .extreme_rows = extreme_rows_scalar,
};
