/* Row reduction kernels (private table): the fixed-order sums and the max/min scans of
 * reduce.c. Bodies: reduce_scalar.c (plain double loops; the max/min scan in GCC vector
 * extensions, portable to any target), reduce_avx2.c (AVX2 max/min scan; its sums are the
 * scalar bodies, which are latency bound in the fixed order and no faster in AVX2).
 *
 * The sum order is part of the contract (ops_index.h) and every body follows it exactly: a
 * block of at most CT_SUM_BLOCK elements is summed in double over 8 interleaved lanes
 * (element i goes to lane i % 8, in increasing i), the lanes are combined as
 * ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)); a row is its blocks' sums added in
 * order in double, rounded to f32 once. Plain double adds (f32 -> double is exact, no FMA,
 * no reassociation), so every body gives the same bits, for any thread count. */
#ifndef CT_OPS_REDUCE_KERNELS_H
#define CT_OPS_REDUCE_KERNELS_H

#include "core/internal.h"

#include <stdint.h>

#define CT_SUM_BLOCK 4096

typedef struct ct_reduce_kernels {
    /* The fixed-order double sum of x[0..n), 0 <= n <= CT_SUM_BLOCK. */
    double (*sum_block)(const float *x, int64_t n);
    /* out[r] = the fixed-order sum of row r of inp[., C] (divided by C in double when
     * mean), rounded to f32, for r in [r0, r1). */
    void (*sum_rows)(float *out, const float *inp, int64_t r0, int64_t r1, int64_t C, int mean);
    /* For r in [r0, r1), C >= 1: the max (sign > 0) or min (sign < 0) of row r into
     * values[r] and its position into idx[r] (each NULL to skip): the first occurrence on
     * ties (-0.0 and +0.0 tie), the first NaN if the row has one. */
    void (*extreme_rows)(float *values, int64_t *idx, const float *inp, int64_t r0, int64_t r1,
                         int64_t C, int sign);
} ct_reduce_kernels;

/* The scalar sum bodies (reduce_scalar.c), shared by the tables without sums of their own. */
double ct_reduce_sum_block_scalar(const float *x, int64_t n);
void ct_reduce_sum_rows_scalar(float *out, const float *inp, int64_t r0, int64_t r1, int64_t C,
                               int mean);

extern const ct_reduce_kernels ct_reduce_scalar;
#if defined(__x86_64__)
extern const ct_reduce_kernels ct_reduce_avx2;
extern const ct_reduce_kernels ct_reduce_avx512; /* reduce_avx512.c: 16-lane max/min scans */
#endif
#if defined(__aarch64__)
extern const ct_reduce_kernels ct_reduce_neon; /* reduce_neon.c: NEON max/min scan, scalar sums */
extern const ct_reduce_kernels ct_reduce_sve;  /* reduce_sve.c: SVE max/min scan, scalar sums */
#endif
/* One entry per ct_isa (reduce.c). */
extern const ct_reduce_kernels *const ct_reduce_tables[CT_ISA_COUNT];

#endif
