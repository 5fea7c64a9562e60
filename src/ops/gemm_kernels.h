/* ctorch's own GEMM: the per-ISA micro-kernels and packing (private table).
 *
 * The driver (gemm.c) computes C = alpha op(A) op(B) + beta C in the usual packed,
 * cache-blocked way: C is cut into NC-column and MC-row blocks, K into CT_GEMM_KC slices
 * taken in ascending order; each slice packs its A rows into MR-row strips and its B columns
 * into NR-column strips (f32 panels; bf16 operands are widened while packing), and the
 * micro-kernel multiplies one A strip by one B strip into one MR x NR tile of C.
 *
 * Determinism by construction: every C element is owned by one micro-kernel call per K
 * slice, the slices are applied in ascending k, and within a slice the kernel sums k in
 * ascending order. The bits therefore depend only on CT_GEMM_KC and the kernel's arithmetic,
 * never on MR, NR, MC, NC, the tile a thread takes or the thread count.
 *
 * Contract of a micro-kernel (what a new ISA body must do, e.g. gemm_neon.c / gemm_sve.c):
 *     kernel(kc, ap, bp, c, ldc, m, n, alpha, beta)
 *   ap: kc x MR floats, element (i, k) at ap[k * MR + i]   (rows past m are zero)
 *   bp: kc x NR floats, element (k, j) at bp[k * NR + j]   (columns past n are zero)
 *   acc[i][j] = sum over k = 0..kc-1 in ascending order (acc = fma(a, b, acc), starting at 0)
 *   for i < m, j < n (row-major C, row stride ldc):
 *       c[i*ldc+j] = beta == 0 ? alpha * acc : fma(alpha, acc, beta * c[i*ldc+j])
 *   (beta == 0 must not read C, which may hold NaN). The driver passes beta = 1 for every K
 *   slice after the first. m in 1..MR, n in 1..NR; kc >= 1. ap / bp are 4-byte aligned only.
 * A kernel that follows it with fused multiply-adds gives the same bits as every other such
 * kernel (AVX2 = AVX-512 = NEON = SVE, any vector length); the scalar body uses separate
 * multiply and add where the compiler does not contract them, so it agrees only within the
 * error bound documented in docs/architecture.md (tests/c/test_gemm_own.c checks it).
 *
 * Packing (the generic C of gemm_scalar.c, except avx512's own in gemm_avx512.c; a table slot
 * so an ISA may specialise, as long as the panels are the same values):
 *   pack_a(dst, A, lda, ta, bf, m, kc, mr): A points at element (i0, k0) of op(A); writes
 *     ceil(m / mr) strips of kc x mr (zero rows past m), strip s at dst + s * kc * mr.
 *     op(A)(i, k) = ta ? A[k * lda + i] : A[i * lda + k]; bf: A holds bf16 (uint16_t).
 *   pack_b(dst, B, ldb, tb, bf, kc, n, nr): B points at (k0, j0) of op(B); writes
 *     ceil(n / nr) strips of kc x nr (zero columns past n), strip s at dst + s * kc * nr.
 *     op(B)(k, j) = tb ? B[j * ldb + k] : B[k * ldb + j].
 *   Both pack the strips [s0, s1) only, so the driver can split packing over threads. */
#ifndef CT_GEMM_KERNELS_H
#define CT_GEMM_KERNELS_H

#include "core/internal.h"

#include <stdbool.h>
#include <stdint.h>

/* K slice length: the one blocking parameter that decides the bits (see above). */
#define CT_GEMM_KC 256

typedef void (*ct_gemm_micro_fn)(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc, int m,
                                 int n, float alpha, float beta);
typedef void (*ct_gemm_pack_a_fn)(float *dst, const void *A, int64_t lda, bool ta, bool bf, int64_t m,
                                  int64_t kc, int mr, int64_t s0, int64_t s1);
typedef void (*ct_gemm_pack_b_fn)(float *dst, const void *B, int64_t ldb, bool tb, bool bf, int64_t kc,
                                  int64_t n, int nr, int64_t s0, int64_t s1);

typedef struct ct_gemm_kernels {
    const char *name;   /* "scalar", "avx2 6x16", ... (for logs and benchmarks) */
    int mr, nr;         /* micro-tile */
    int mc, nc;         /* cache blocks: MC rows of A (a multiple of mr), NC columns of B (of nr) */
    ct_gemm_micro_fn kernel;
    ct_gemm_pack_a_fn pack_a;
    ct_gemm_pack_b_fn pack_b;
    /* bf16 operands with the CPU's bf16 dot instruction (NULL where the table has none; used
     * only where ct_gemm_bf16_dot() says the CPU has it): panels of bf16 pairs, the bf16
     * contract below. kernel_dot takes the same arguments (ap / bp point at uint16_t). */
    ct_gemm_micro_fn kernel_dot;
    ct_gemm_pack_a_fn pack_a_dot;
    ct_gemm_pack_b_fn pack_b_dot;
} ct_gemm_kernels;

/* The bf16 contract (ct_gemm_bf16 where the active table has kernel_dot and the CPU has
 * AVX512_BF16, i.e. vdpbf16ps): within each CT_GEMM_KC slice, k is taken in pairs
 * (2p, 2p + 1) (a slice of odd length pads its last pair with zero) and
 *     acc = fma(a[2p+1], b[2p+1], acc); acc = fma(a[2p], b[2p], acc)
 * for p ascending, each product exact (bf16 x bf16 fits f32), one rounding per step, input
 * and output denormals flushed to zero (the instruction's DAZ / FTZ), starting at 0; slices
 * and the epilogue as in the f32 contract. So the bits of a bf16 product differ from the
 * widened f32 product's (which sums k one at a time), and from a CPU without the
 * instruction, but never depend on the thread count or the split.
 * Panels: ap strip of ceil(kc/2) x MR pairs, pair (p, i) at ap16[(p * MR + i) * 2 + {0, 1}]
 * = op(A)(i, 2p), op(A)(i, 2p + 1); bp: pair (p, j) at bp16[(p * NR + j) * 2 + {0, 1}]. */
bool ct_gemm_bf16_dot(void);

/* A bf16 value widened to f32 (exact: the 16 bits become the high half), inline for the
 * packers' scalar paths. */
static inline float bf16f(uint16_t v)
{
    union {
        uint32_t u;
        float f;
    } x = {(uint32_t)v << 16};
    return x.f;
}

/* Generic packers (gemm_scalar.c), used by every table. */
void ct_gemm_pack_a_generic(float *dst, const void *A, int64_t lda, bool ta, bool bf, int64_t m, int64_t kc,
                            int mr, int64_t s0, int64_t s1);
void ct_gemm_pack_b_generic(float *dst, const void *B, int64_t ldb, bool tb, bool bf, int64_t kc, int64_t n,
                            int nr, int64_t s0, int64_t s1);

extern const ct_gemm_kernels ct_gemm_scalar;
#if defined(__x86_64__)
extern const ct_gemm_kernels ct_gemm_avx2;
#if defined(CT_HAVE_AVX512_KERNELS)
extern const ct_gemm_kernels ct_gemm_avx512;
#endif
#endif
#if defined(__aarch64__)
extern const ct_gemm_kernels ct_gemm_neon;
extern const ct_gemm_kernels ct_gemm_sve;
#endif
/* One slot per ct_isa (an ISA without bodies points at the next one down). */
extern const ct_gemm_kernels *const ct_gemm_tables[CT_ISA_COUNT];

#endif
