/* GEMM: the public entry points, their checks, the choice between the two GEMMs, and both
 * drivers.
 *
 * 1. OpenBLAS, made deterministic. A multi-threaded OpenBLAS call does not give the same
 * bits for 1 and 2 threads (it picks kernels and splits by thread count), so OpenBLAS runs
 * single-threaded and ctorch cuts the product into blocks whose layout depends on the shape
 * alone; the pool's threads take the blocks. Two layouts:
 *   - C split into a grid of up to GEMM_TILES tiles of at least GEMM_MIN_TILE a side (the
 *     longer side halved first, so that re-packing the shared operand stays cheap), each
 *     tile one sgemm over the whole K: enough tiles for 16+ threads on big products;
 *   - when K dominates a small C (e.g. dh = G W in the fused loss: 130 x 1024, K = 128256),
 *     K is cut into GEMM_BLOCKS slices, each slice's product goes to its own partial buffer,
 *     and the partials are added in slice order. Splitting C there would re-pack the huge
 *     operand once per tile.
 * Every output element is computed by the same calls in the same order for any thread count.
 *
 * 2. ctorch's own packed GEMM (own_*), micro-kernels per ISA behind gemm_kernels.h: C rows in
 * chunks of OWN_MCHUNK_BLOCKS MC blocks, C columns in blocks of the table's NC, K in
 * CT_GEMM_KC slices in ascending order. Each (rows, columns, slice) step packs its A rows and
 * B columns into strips and multiplies the C tiles (MC rows x a group of NR strips). The
 * panels are double-buffered, so one parallel region per step: each task multiplies its
 * tiles of step s, then packs its share of step s + 1's strips; the region's end is the one
 * barrier per slice. Each C element is written by one kernel call per slice, so its bits
 * never depend on the thread count or the split (see gemm_kernels.h). bf16 operands use the
 * table's dot kernel (vdpbf16ps) where the CPU has it: ct_gemm_bf16_dot(). */
#include "core/internal.h"
#include "ctorch/ops.h"

#include "ops/blas.h"
#include "ops/gemm.h"
#include "ops/gemm_kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEMM_BLOCK 256          /* rows of a bf16 operand converted at a time */
#define GEMM_BLOCKS 8           /* K slices of a K-split product */
#define GEMM_TILES 32           /* at most this many C tiles (two per thread on 16 cores) */
#define GEMM_MIN_TILE 256       /* smallest tile side worth a split */
#define GEMM_KSPLIT_MAX_C (1 << 20) /* K-split only for C of at most this many elements */
#define OWN_STACK_FLOATS 4096       /* ctorch's GEMM packs up to 16 KiB of panels on the stack */

typedef struct {
    bool ta, tb;
    int64_t M, N, K;
    float alpha;
    const float *A;
    int64_t lda;
    const float *B;
    int64_t ldb;
    float beta;
    float *C;
    int64_t ldc;
    int64_t nbm, nbn;   /* tile grid (C split) */
    int64_t nbk;        /* K slices (K split); 0 for a C split */
    float *partial;     /* nbk x M x N (K split) */
    ct_sgemm_fn sgemm;
} gemm_job;

static int64_t cut(int64_t n, int64_t parts, int64_t i)
{
    return n * i / parts;
}

static void gemm_blocks(void *arg, int64_t b0, int64_t b1, int tid)
{
    const gemm_job *j = arg;
    for (int64_t b = b0; b < b1; b++) {
        const float *A = j->A, *B = j->B;
        if (j->nbk) { /* K slice b into its partial buffer (dense M x N) */
            int64_t k0 = cut(j->K, j->nbk, b), k1 = cut(j->K, j->nbk, b + 1);
            A += j->ta ? k0 * j->lda : k0;
            B += j->tb ? k0 : k0 * j->ldb;
            j->sgemm(j->ta, j->tb, (int)j->M, (int)j->N, (int)(k1 - k0), j->alpha, A, (int)j->lda, B,
                     (int)j->ldb, 0.0f, j->partial + b * j->M * j->N, (int)j->N);
            continue;
        }
        int64_t bi = b / j->nbn, bj = b % j->nbn;
        int64_t m0 = cut(j->M, j->nbm, bi), m1 = cut(j->M, j->nbm, bi + 1);
        int64_t n0 = cut(j->N, j->nbn, bj), n1 = cut(j->N, j->nbn, bj + 1);
        A += j->ta ? m0 : m0 * j->lda;
        B += j->tb ? n0 * j->ldb : n0;
        j->sgemm(j->ta, j->tb, (int)(m1 - m0), (int)(n1 - n0), (int)j->K, j->alpha, A, (int)j->lda, B,
                 (int)j->ldb, j->beta, j->C + m0 * j->ldc + n0, (int)j->ldc);
    }
}

/* C = beta C + sum of the partials in slice order; threads own rows. */
static void gemm_sum(void *arg, int64_t r0, int64_t r1, int tid)
{
    const gemm_job *j = arg;
    for (int64_t r = r0; r < r1; r++) {
        float *c = j->C + r * j->ldc;
        for (int64_t x = 0; x < j->N; x++) {
            float acc = j->partial[r * j->N + x];
            for (int64_t k = 1; k < j->nbk; k++) acc += j->partial[(k * j->M + r) * j->N + x];
            c[x] = j->beta == 0.0f ? acc : j->beta * c[x] + acc;
        }
    }
}

static size_t own_scratch(int64_t M, int64_t N, int64_t K, size_t *abytes, size_t *bbytes);

size_t ct_gemm_scratch_bytes(int64_t M, int64_t N, int64_t K)
{
    size_t own = 0, blas = 0, a, b;
    if (M > 0 && N > 0 && K > 0) own = own_scratch(M, N, K, &a, &b);
    if (own <= OWN_STACK_FLOATS * sizeof(float)) own = 0; /* packed on the stack */
    int64_t big = M > N ? M : N;
    if (K >= 4 * big && K >= GEMM_BLOCKS * GEMM_MIN_TILE && M * N <= GEMM_KSPLIT_MAX_C)
        blas = (size_t)(GEMM_BLOCKS * M * N) * sizeof(float);
    ct_gemm_impl impl;
    ct_status st = ct_gemm_select(M, N, K, &impl);
    if (st != CT_OK) { /* the GEMM will fail; plan for either */
        ct_clear_error();
        return blas > own ? blas : own;
    }
    return impl == CT_GEMM_CTORCH ? own : blas;
}

size_t ct_gemm_mixed_scratch_bytes(int64_t M, int64_t N, int64_t K, bool a_bf16, bool b_bf16)
{
    if (!a_bf16 && !b_bf16) return ct_gemm_scratch_bytes(M, N, K);
    size_t own = 0, a, b;
    if (M > 0 && N > 0 && K > 0) own = own_scratch(M, N, K, &a, &b);
    return own <= OWN_STACK_FLOATS * sizeof(float) ? 0 : own; /* packed on the stack */
}

static ct_status gemm_check(const char *fn, int64_t M, int64_t N, int64_t K, const void *A,
                            const void *B, const float *C)
{
    if (M < 0 || N < 0 || K < 0)
        return ct_error(CT_EINVAL, "%s: sizes must be >= 0 (M=%lld N=%lld K=%lld)", fn, (long long)M,
                        (long long)N, (long long)K);
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
        return ct_error(CT_EINVAL, "%s: sizes must fit in 32 bits for CBLAS", fn);
    if ((M && N && !C) || (M && K && N && (!A || !B)))
        return ct_error(CT_EINVAL, "%s: A, B and C must not be NULL for non-empty sizes", fn);
    return CT_OK;
}

/* The OpenBLAS path of ct_gemm_f32 (arguments checked, M, N, K > 0, strides resolved). */
static ct_status blas_gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                               const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                               int64_t ldc)
{
    if (lda > INT32_MAX || ldb > INT32_MAX || ldc > INT32_MAX)
        return ct_error(CT_EINVAL, "ct_gemm_f32: leading dimensions must fit in 32 bits for CBLAS");
    gemm_job j = {trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, 1, 0, NULL, NULL};
    CT_TRY(ct_blas_sgemm(&j.sgemm));
    if (ct_gemm_scratch_bytes(M, N, K)) {
        j.nbk = GEMM_BLOCKS;
        CT_TRY(ct_alloc((void **)&j.partial, (size_t)(j.nbk * M * N) * sizeof(float)));
        ct_parallel_for(j.nbk, gemm_blocks, &j);
        ct_parallel_for(M, gemm_sum, &j);
        ct_free(j.partial);
        return CT_OK;
    }
    /* The grid from the shape alone (never the thread count): halve the longer tile side
     * while it stays >= GEMM_MIN_TILE, up to GEMM_TILES tiles (2048^3: 32 tiles of 512 x 256;
     * every tile one sgemm over the whole K, so the bits do not depend on the grid). */
    while (j.nbm * j.nbn < GEMM_TILES) {
        int64_t bm = M / j.nbm, bn = N / j.nbn;
        if (bm >= bn && bm >= 2 * GEMM_MIN_TILE) j.nbm *= 2;
        else if (bn >= 2 * GEMM_MIN_TILE) j.nbn *= 2;
        else if (bm >= 2 * GEMM_MIN_TILE) j.nbm *= 2;
        else break;
    }
    ct_parallel_for(j.nbm * j.nbn, gemm_blocks, &j);
    return CT_OK;
}

/* Convert a rows x cols block of a bf16 matrix (row stride ld) to dense f32. */
static void bf16_block(float *dst, const uint16_t *src, int64_t rows, int64_t cols, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++) ct_convert_bf16_to_f32(dst + r * cols, src + r * ld, (size_t)cols);
}

/* The OpenBLAS path of ct_gemm_bf16 (arguments checked, M, N, K > 0, strides resolved). */
static ct_status blas_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
                                float *C, int64_t ldc)
{
    /* B is converted whole (it is the shared operand); A in blocks of GEMM_BLOCK rows of C.
     * Scratch: K*N + GEMM_BLOCK*K floats, tracked by the allocator. */
    int64_t brows = trans_b ? N : K, bcols = trans_b ? K : N;
    float *bf = NULL, *af = NULL;
    size_t bbytes, abytes;
    if (!ct_mul_size((size_t)brows * (size_t)bcols, sizeof(float), &bbytes) ||
        !ct_mul_size((size_t)GEMM_BLOCK * (size_t)(K ? K : 1), sizeof(float), &abytes))
        return ct_error(CT_EOVERFLOW, "ct_gemm_bf16: operand size overflows");
    CT_TRY(ct_alloc((void **)&bf, bbytes));
    ct_status s = ct_alloc((void **)&af, abytes);
    if (s != CT_OK) {
        ct_free(bf);
        return s;
    }
    bf16_block(bf, B, brows, bcols, ldb);
    for (int64_t m0 = 0; m0 < M && s == CT_OK; m0 += GEMM_BLOCK) {
        int64_t mb = M - m0 < GEMM_BLOCK ? M - m0 : GEMM_BLOCK;
        if (trans_a) /* A is [K, M]: take columns m0..m0+mb as a [K, mb] block */
            for (int64_t k = 0; k < K; k++) ct_convert_bf16_to_f32(af + k * mb, A + k * lda + m0, (size_t)mb);
        else
            bf16_block(af, A + m0 * lda, mb, K, lda);
        s = blas_gemm_f32(trans_a, trans_b, mb, N, K, alpha, af, trans_a ? mb : K, bf, bcols, beta,
                          C + m0 * ldc, ldc);
    }
    ct_free(af);
    ct_free(bf);
    return s;
}

/* ---- ctorch's packed GEMM ---------------------------------------------------------------- */

#define OWN_MCHUNK_BLOCKS 8      /* C rows per chunk: this many MC blocks */
#define OWN_SERIAL_FLOPS 4000000 /* below this many flops one thread runs the whole product */
#define OWN_TASKS_PER_THREAD 4   /* C tiles per thread and step, for balance */

#if defined(__x86_64__)
#define GEMM_AVX2 &ct_gemm_avx2
#if defined(CT_HAVE_AVX512_KERNELS)
#define GEMM_AVX512 &ct_gemm_avx512
#else
#define GEMM_AVX512 &ct_gemm_avx2
#endif
#else
#define GEMM_AVX2 &ct_gemm_scalar
#define GEMM_AVX512 &ct_gemm_scalar
#endif

#if defined(__aarch64__)
#define GEMM_NEON &ct_gemm_neon
#define GEMM_SVE &ct_gemm_sve
#else
#define GEMM_NEON &ct_gemm_scalar
#define GEMM_SVE &ct_gemm_scalar
#endif

const ct_gemm_kernels *const ct_gemm_tables[CT_ISA_COUNT] = {
    [CT_ISA_SCALAR] = &ct_gemm_scalar, [CT_ISA_AVX2] = GEMM_AVX2, [CT_ISA_AVX512] = GEMM_AVX512,
    [CT_ISA_NEON] = GEMM_NEON,         [CT_ISA_SVE] = GEMM_SVE,
};

/* One step of the product: C rows [i0, i0 + mb) x columns [j0, j0 + nb), K slice [k0, k0 + kb),
 * packed into sa A strips and sb B strips; tiles: nic row blocks of spi A strips x njg groups
 * of spg B strips. */
typedef struct {
    int64_t i0, mb, j0, nb, k0, kb, sa, sb;
    int64_t nic, spi, njg, spg;
    float beta; /* beta for the first slice, 1 after */
    float *ap, *bp;
} own_step;

typedef struct {
    const ct_gemm_kernels *kt;
    bool ta, tb;
    bool abf, bbf;  /* A / B in bf16 (widened while packing) or f32 */
    bool dot;       /* bf16 pair panels and kt->kernel_dot (the bf16 contract) */
    float alpha;
    const unsigned char *A, *B; /* element (0, 0) of op(A) / op(B) */
    int64_t lda, ldb, ldc;
    float *C;
    own_step run;   /* the step whose tiles this region computes (run.kb == 0: none) */
    own_step pack;  /* the step whose panels this region packs (pack.kb == 0: none) */
    int64_t ntask;  /* tasks of the region: the run step's tiles, or pack work alone */
} own_job;

static const unsigned char *own_at(const unsigned char *X, bool t, int64_t ld, int64_t r, int64_t c, size_t es)
{ /* element (r, c) of op(X): X is [rows, ld] (t: op(X) = X^T) */
    return X + (size_t)(t ? c * ld + r : r * ld + c) * es;
}

/* Pack strips [s0, s1) of step p's sa + sb strips (A strips first). */
static void own_pack_strips(const own_job *j, const own_step *p, int64_t s0, int64_t s1)
{
    size_t ea = j->abf ? 2 : 4, eb = j->bbf ? 2 : 4;
    int64_t a1 = s1 < p->sa ? s1 : p->sa;
    ct_gemm_pack_a_fn pa = j->dot ? j->kt->pack_a_dot : j->kt->pack_a;
    ct_gemm_pack_b_fn pb = j->dot ? j->kt->pack_b_dot : j->kt->pack_b;
    if (s0 < a1)
        pa(p->ap, own_at(j->A, j->ta, j->lda, p->i0, p->k0, ea), j->lda, j->ta, j->abf, p->mb, p->kb,
                      j->kt->mr, s0, a1);
    int64_t b0 = s0 > p->sa ? s0 - p->sa : 0, b1 = s1 - p->sa;
    if (b0 < b1)
        pb(p->bp, own_at(j->B, j->tb, j->ldb, p->k0, p->j0, eb), j->ldb, j->tb, j->bbf, p->kb, p->nb,
                      j->kt->nr, b0, b1);
}

/* The tiles [t0, t1) of step r. */
static void own_tiles(const own_job *j, const own_step *r, int64_t t0, int64_t t1)
{
    const ct_gemm_kernels *kt = j->kt;
    int mr = kt->mr, nr = kt->nr;
    ct_gemm_micro_fn kern = j->dot ? kt->kernel_dot : kt->kernel;
    /* floats per k of a strip: bf16 pair panels take ceil(kb/2) pairs of 2 bytes x 2 */
    int64_t kfl = j->dot ? (r->kb + 1) / 2 : r->kb;
    for (int64_t t = t0; t < t1; t++) {
        int64_t ic = t / r->njg, g = t % r->njg;
        int64_t r0 = ic * r->spi * mr, r1 = r0 + r->spi * mr < r->mb ? r0 + r->spi * mr : r->mb;
        int64_t s0 = g * r->spg, s1 = s0 + r->spg < r->sb ? s0 + r->spg : r->sb;
        for (int64_t sj = s0; sj < s1; sj++) {
            const float *bp = r->bp + sj * kfl * nr;
            int64_t c0 = sj * nr, nn = r->nb - c0 < nr ? r->nb - c0 : nr;
            for (int64_t i = r0; i < r1; i += mr) {
                int64_t mm = r->mb - i < mr ? r->mb - i : mr;
                float *c = j->C + (r->i0 + i) * j->ldc + r->j0 + c0;
                kern(r->kb, r->ap + (i / mr) * kfl * mr, bp, c, j->ldc, (int)mm, (int)nn, j->alpha,
                           r->beta);
            }
        }
    }
}

/* Strip of a step whose panel starts at or after `u` floats per k into the step's panels (A
 * strips of mr floats first, then B strips of nr): pack pieces split by bytes, not strips. */
static int64_t own_strip_at(const own_step *p, int mr, int nr, int64_t u)
{
    int64_t ua = p->sa * mr;
    return u <= ua ? (u + mr - 1) / mr : p->sa + (u - ua + nr - 1) / nr;
}

/* One parallel region (ct_parallel_tasks): task t computes tile t of the run step (if any),
 * then packs piece t of the next step's panels (pieces of equal bytes, not strips). The
 * panels are double-buffered, so a step's tiles and the next step's packing share a region
 * (its end is the one barrier per step); each thread alternates arithmetic and packing, so the
 * packing's memory traffic overlaps the other threads' arithmetic. */
static void own_region(void *arg, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const own_job *j = arg;
    for (int64_t t = t0; t < t1; t++) {
        if (j->run.kb) own_tiles(j, &j->run, t, t + 1);
        if (j->pack.kb) {
            const own_step *p = &j->pack;
            int mr = j->kt->mr, nr = j->kt->nr;
            int64_t u = p->sa * mr + p->sb * nr;
            own_pack_strips(j, p, own_strip_at(p, mr, nr, u * t / j->ntask),
                            own_strip_at(p, mr, nr, u * (t + 1) / j->ntask));
        }
    }
}

/* Panels of one step (M, N, K > 0), bounded by the blocking, not the shape: at most
 * OWN_MCHUNK_BLOCKS MC rows and NC columns by KC. */
static size_t own_scratch1(int64_t M, int64_t N, int64_t K, size_t *abytes, size_t *bbytes)
{
    const ct_gemm_kernels *kt = CT_KERNELS(ct_gemm_tables);
    int64_t mchunk = (int64_t)kt->mc * OWN_MCHUNK_BLOCKS;
    int64_t mrows = M < mchunk ? M : mchunk, ncols = N < kt->nc ? N : kt->nc, kmax = K < CT_GEMM_KC ? K : CT_GEMM_KC;
    int64_t sa_max = (mrows + kt->mr - 1) / kt->mr, sb_max = (ncols + kt->nr - 1) / kt->nr;
    /* each panel rounded up to a cache line, so the second buffer starts aligned */
    *abytes = ((size_t)(sa_max * kt->mr * kmax) * sizeof(float) + 63) & ~(size_t)63;
    *bbytes = ((size_t)(sb_max * kt->nr * kmax) * sizeof(float) + 63) & ~(size_t)63;
    return *abytes + *bbytes;
}

static bool own_serial(int64_t M, int64_t N, int64_t K)
{
    return 2.0 * (double)M * (double)N * (double)K < OWN_SERIAL_FLOPS;
}

/* What own_gemm allocates: one set of panels for a serial product, two (double-buffered)
 * otherwise, whatever the thread count (so callers' memory plans do not depend on it). */
static size_t own_scratch(int64_t M, int64_t N, int64_t K, size_t *abytes, size_t *bbytes)
{
    size_t one = own_scratch1(M, N, K, abytes, bbytes);
    return own_serial(M, N, K) ? one : 2 * one;
}

/* Step s of the product: chunks of crows rows outer, NC column blocks, K slices inner. */
static void own_step_at(const own_job *j, int64_t s, int64_t M, int64_t N, int64_t K, int64_t crows, int T,
                        float beta, float *ap[2], float *bp[2], own_step *p)
{
    const ct_gemm_kernels *kt = j->kt;
    int64_t nkb = (K + CT_GEMM_KC - 1) / CT_GEMM_KC, ncb = (N + kt->nc - 1) / kt->nc;
    int64_t pc = s % nkb, jc = (s / nkb) % ncb, ic = s / nkb / ncb;
    memset(p, 0, sizeof *p);
    p->i0 = ic * crows, p->mb = M - p->i0 < crows ? M - p->i0 : crows;
    p->j0 = jc * kt->nc, p->nb = N - p->j0 < kt->nc ? N - p->j0 : kt->nc;
    p->k0 = pc * CT_GEMM_KC, p->kb = K - p->k0 < CT_GEMM_KC ? K - p->k0 : CT_GEMM_KC;
    p->beta = pc == 0 ? beta : 1.0f;
    p->ap = ap[s & 1], p->bp = bp[s & 1];
    p->sa = (p->mb + kt->mr - 1) / kt->mr;
    p->sb = (p->nb + kt->nr - 1) / kt->nr;
    /* Tiles: row blocks of at most MC rows, of (nearly) equal size, times column groups of
     * (nearly) equal size, at least OWN_TASKS_PER_THREAD tiles per thread, so the threads
     * claiming them get equal work whatever M is (121 rows are 21 strips: two row blocks
     * would be 11 and 10 strips, while 8 column groups of all 21 are equal). Any split gives
     * the same bits. */
    int64_t per_mc = kt->mc / kt->mr, nic = (p->sa + per_mc - 1) / per_mc;
    p->spi = (p->sa + nic - 1) / nic;
    p->nic = (p->sa + p->spi - 1) / p->spi;
    int64_t want = (int64_t)T * OWN_TASKS_PER_THREAD;
    p->njg = p->nic >= want ? 1 : (want + p->nic - 1) / p->nic;
    if (p->njg > p->sb) p->njg = p->sb;
    p->spg = (p->sb + p->njg - 1) / p->njg;
    p->njg = (p->sb + p->spg - 1) / p->spg;
}

/* C = alpha op(A) op(B) + beta C with M, N, K > 0, strides resolved; A / B f32 or bf16. */
static ct_status own_gemm(bool ta, bool tb, bool abf, bool bbf, bool dot, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                          int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    const ct_gemm_kernels *kt = CT_KERNELS(ct_gemm_tables);
    int64_t mchunk = (int64_t)kt->mc * OWN_MCHUNK_BLOCKS;
    size_t abytes, bbytes;
    own_scratch1(M, N, K, &abytes, &bbytes);
    bool serial = own_serial(M, N, K);
    int nbuf = serial ? 1 : 2;
    own_job j = {.kt = kt, .ta = ta, .tb = tb, .abf = abf, .bbf = bbf, .dot = dot && abf && bbf, .alpha = alpha, .A = A, .B = B, .lda = lda, .ldb = ldb,
                 .ldc = ldc, .C = C};
    _Alignas(64) float small[OWN_STACK_FLOATS]; /* small products pack on the stack */
    float *buf = small, *ap[2], *bp[2];
    bool heap = (size_t)nbuf * (abytes + bbytes) > sizeof small;
    if (heap) CT_TRY(ct_alloc((void **)&buf, (size_t)nbuf * (abytes + bbytes)));
    for (int b = 0; b < 2; b++) {
        int u = b % nbuf;
        ap[b] = buf + u * (abytes + bbytes) / sizeof(float);
        bp[b] = ap[b] + abytes / sizeof(float);
    }
    int T = serial ? 1 : ct_num_threads();
    /* Row chunks of (nearly) equal size, a multiple of mr rows, at most OWN_MCHUNK_BLOCKS MC. */
    int64_t nchunk = (M + mchunk - 1) / mchunk;
    int64_t crows = ((M + nchunk - 1) / nchunk + kt->mr - 1) / kt->mr * kt->mr; /* <= mchunk */
    int64_t steps = ((M + crows - 1) / crows) * ((N + kt->nc - 1) / kt->nc) * ((K + CT_GEMM_KC - 1) / CT_GEMM_KC);
    if (serial) {
        for (int64_t s = 0; s < steps; s++) {
            own_step_at(&j, s, M, N, K, crows, T, beta, ap, bp, &j.run);
            own_pack_strips(&j, &j.run, 0, j.run.sa + j.run.sb);
            own_tiles(&j, &j.run, 0, j.run.nic * j.run.njg);
        }
    } else {
        /* region s computes step s - 1 and packs step s */
        for (int64_t s = 0; s <= steps; s++) {
            if (s > 0) j.run = j.pack;
            else memset(&j.run, 0, sizeof j.run);
            if (s < steps) own_step_at(&j, s, M, N, K, crows, T, beta, ap, bp, &j.pack);
            else memset(&j.pack, 0, sizeof j.pack);
            j.ntask = j.run.kb ? j.run.nic * j.run.njg : (int64_t)T * OWN_TASKS_PER_THREAD;
            ct_parallel_tasks(j.ntask, own_region, &j);
        }
    }
    if (heap) ct_free(buf);
    return CT_OK;
}

/* ---- bf16 dot instructions --------------------------------------------------------------- */

static pthread_once_t dot_once = PTHREAD_ONCE_INIT;
static bool dot_cpu; /* AVX512_BF16: CPUID leaf 7 subleaf 1, EAX bit 5 */

static void dot_detect(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned a, b, c, d;
    dot_cpu = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
#endif
}

bool ct_gemm_bf16_dot(void)
{
    pthread_once(&dot_once, dot_detect);
    return dot_cpu && CT_KERNELS(ct_gemm_tables)->kernel_dot != NULL;
}

/* ---- which GEMM runs ---------------------------------------------------------------------- */

static pthread_once_t sel_once = PTHREAD_ONCE_INIT;
static ct_gemm_impl sel_env = CT_GEMM_AUTO; /* CT_GEMM */
static ct_status sel_env_status = CT_OK;
static char sel_env_msg[160];
static ct_gemm_impl sel_forced = CT_GEMM_AUTO; /* ct_gemm_set_impl */
static bool sel_blas_ok;
static char sel_blas_msg[400];
static int sel_logged;

static void sel_init(void)
{
    const char *v = getenv("CT_GEMM");
    if (v && v[0]) {
        if (!strcmp(v, "openblas")) sel_env = CT_GEMM_OPENBLAS;
        else if (!strcmp(v, "ctorch")) sel_env = CT_GEMM_CTORCH;
        else {
            sel_env_status = CT_EINVAL;
            snprintf(sel_env_msg, sizeof sel_env_msg, "CT_GEMM=%.60s: expected openblas or ctorch", v);
        }
    }
    ct_sgemm_fn f;
    sel_blas_ok = ct_blas_sgemm(&f) == CT_OK;
    if (!sel_blas_ok) snprintf(sel_blas_msg, sizeof sel_blas_msg, "%s", ct_last_error());
    ct_clear_error();
}

/* The fixed rule (from `ctorch bench gemm`, see docs/architecture.md "GEMM" and
 * docs/benchmarks.md): with the avx2 kernel, ctorch's GEMM for the small products where
 * OpenBLAS's per-call cost and its edge handling lose (every side >= 32, M N K <= 256^3),
 * OpenBLAS otherwise; with the avx512 kernel, ctorch's GEMM for every side >= 32 (on the
 * Zen 5 machine of docs/benchmarks.md 1.4-1.9x Debian's OpenBLAS with the Haswell kernels
 * the environment there forces, and level with its SkylakeX kernels, from 512 x 768 x 768
 * up to 2048^3), OpenBLAS for the skinny products (decode steps, a few tokens), where it
 * measured faster. The scalar kernel never beats OpenBLAS. */
static bool rule_ctorch(ct_isa isa, int64_t M, int64_t N, int64_t K)
{
    bool sides = M >= 32 && N >= 32 && K >= 32;
    if (isa == CT_ISA_AVX512) return sides;
    if (isa != CT_ISA_AVX2) return false;
    return sides && (double)M * (double)N * (double)K <= 256.0 * 256.0 * 256.0;
}

ct_status ct_gemm_set_impl(ct_gemm_impl impl)
{
    pthread_once(&sel_once, sel_init);
    if (impl != CT_GEMM_AUTO && impl != CT_GEMM_OPENBLAS && impl != CT_GEMM_CTORCH)
        return ct_error(CT_EINVAL, "ct_gemm_set_impl: impl must be CT_GEMM_AUTO, CT_GEMM_OPENBLAS or "
                                   "CT_GEMM_CTORCH, got %d", (int)impl);
    if (impl == CT_GEMM_OPENBLAS && !sel_blas_ok)
        return ct_error(CT_EUNSUPPORTED, "ct_gemm_set_impl: OpenBLAS cannot be loaded: %s", sel_blas_msg);
    sel_forced = impl;
    return CT_OK;
}

static void sel_log(ct_gemm_impl mode, ct_gemm_impl got)
{
    if (__atomic_exchange_n(&sel_logged, 1, __ATOMIC_RELAXED)) return;
    const char *kn = CT_KERNELS(ct_gemm_tables)->name;
    if (!sel_blas_ok && mode != CT_GEMM_CTORCH)
        ct_log(CT_LOG_WARN, "gemm", "OpenBLAS cannot be loaded (%s): ctorch's GEMM (%s) runs", sel_blas_msg, kn);
    else if (mode == CT_GEMM_AUTO)
        ct_log(CT_LOG_INFO, "gemm", "GEMM: OpenBLAS, and ctorch's GEMM (%s) for the shapes of the fixed rule "
                                    "(this one: %s)", kn, got == CT_GEMM_CTORCH ? "ctorch" : "openblas");
    else
        ct_log(CT_LOG_INFO, "gemm", "GEMM: %s (forced)", mode == CT_GEMM_CTORCH ? kn : "OpenBLAS");
}

ct_status ct_gemm_select(int64_t M, int64_t N, int64_t K, ct_gemm_impl *out)
{
    pthread_once(&sel_once, sel_init);
    if (!out) return ct_error(CT_EINVAL, "ct_gemm_select: out must not be NULL");
    ct_gemm_impl mode = sel_forced;
    if (mode == CT_GEMM_AUTO) {
        if (sel_env_status != CT_OK) return ct_error(sel_env_status, "%s", sel_env_msg);
        mode = sel_env;
    }
    if (mode == CT_GEMM_OPENBLAS && !sel_blas_ok)
        return ct_error(CT_EUNSUPPORTED, "CT_GEMM=openblas: OpenBLAS cannot be loaded: %s", sel_blas_msg);
    ct_gemm_impl got = mode;
    if (mode == CT_GEMM_AUTO)
        got = !sel_blas_ok || rule_ctorch(ct_active_isa(), M, N, K) ? CT_GEMM_CTORCH : CT_GEMM_OPENBLAS;
    sel_log(mode, got);
    *out = got;
    return CT_OK;
}

const char *ct_gemm_describe(void)
{
    pthread_once(&sel_once, sel_init);
    static _Thread_local char buf[200];
    const char *kn = CT_KERNELS(ct_gemm_tables)->name;
    ct_gemm_impl mode = sel_forced != CT_GEMM_AUTO ? sel_forced : sel_env;
    if (sel_forced == CT_GEMM_AUTO && sel_env_status != CT_OK)
        snprintf(buf, sizeof buf, "invalid CT_GEMM (%s)", sel_env_msg);
    else if (mode == CT_GEMM_OPENBLAS)
        snprintf(buf, sizeof buf, "openblas (%s)", sel_blas_ok ? "forced" : "forced, cannot be loaded");
    else if (mode == CT_GEMM_CTORCH)
        snprintf(buf, sizeof buf, "ctorch %s (forced)", kn);
    else if (!sel_blas_ok)
        snprintf(buf, sizeof buf, "ctorch %s (OpenBLAS not loaded)", kn);
    else if (ct_active_isa() == CT_ISA_AVX512)
        snprintf(buf, sizeof buf, "ctorch %s (openblas where a side < 32)", kn);
    else
        snprintf(buf, sizeof buf, "openblas (ctorch %s for small shapes)", kn);
    /* bf16 operands: the dot instruction in ctorch's GEMM (its own contract), else widened */
    size_t used = strlen(buf);
    bool dot = ct_gemm_bf16_dot() && mode != CT_GEMM_OPENBLAS;
    snprintf(buf + used, sizeof buf - used, ", bf16: %s", dot ? "vdpbf16ps" : "widened to f32");
    return buf;
}

/* ---- public entry points ------------------------------------------------------------------ */

static ct_status gemm_args(const char *fn, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A,
                           int64_t *lda, const void *B, int64_t *ldb, const float *C, int64_t *ldc)
{
    CT_TRY(gemm_check(fn, M, N, K, A, B, C));
    int64_t ca = ta ? M : K, cb = tb ? K : N;
    if (!*lda) *lda = ca;
    if (!*ldb) *ldb = cb;
    if (!*ldc) *ldc = N;
    if (*lda < ca || *ldb < cb || *ldc < N)
        return ct_error(CT_EINVAL, "%s: row strides must be 0 or at least the row length (lda=%lld >= %lld, "
                        "ldb=%lld >= %lld, ldc=%lld >= %lld)", fn, (long long)*lda, (long long)ca,
                        (long long)*ldb, (long long)cb, (long long)*ldc, (long long)N);
    return CT_OK;
}

static void scale_c(int64_t M, int64_t N, float beta, float *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

ct_status ct_gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                      float *C, int64_t ldc)
{
    CT_TRY(gemm_args("ct_gemm_f32", trans_a, trans_b, M, N, K, A, &lda, B, &ldb, C, &ldc));
    ct_gemm_impl impl;
    CT_TRY(ct_gemm_select(M, N, K, &impl));
    if (M == 0 || N == 0) return CT_OK;
    if (K == 0) {
        scale_c(M, N, beta, C, ldc);
        return CT_OK;
    }
    if (impl == CT_GEMM_CTORCH) return own_gemm(trans_a, trans_b, false, false, false, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return blas_gemm_f32(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

ct_status ct_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
                       float *C, int64_t ldc)
{
    CT_TRY(gemm_args("ct_gemm_bf16", trans_a, trans_b, M, N, K, A, &lda, B, &ldb, C, &ldc));
    ct_gemm_impl impl;
    CT_TRY(ct_gemm_select(M, N, K, &impl));
    if (M == 0 || N == 0) return CT_OK;
    if (K == 0) {
        scale_c(M, N, beta, C, ldc);
        return CT_OK;
    }
    if (impl == CT_GEMM_CTORCH) return own_gemm(trans_a, trans_b, true, true, ct_gemm_bf16_dot(), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return blas_gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* C = alpha op(A) op(B) + beta C with either operand f32 or bf16 (ops/gemm.h). */
ct_status ct_gemm_mixed(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                        bool a_bf16, int64_t lda, const void *B, bool b_bf16, int64_t ldb, float beta, float *C,
                        int64_t ldc)
{
    if (!a_bf16 && !b_bf16) return ct_gemm_f32(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    CT_TRY(gemm_args("ct_gemm_mixed", trans_a, trans_b, M, N, K, A, &lda, B, &ldb, C, &ldc));
    ct_gemm_impl impl;
    CT_TRY(ct_gemm_select(M, N, K, &impl)); /* a forced or invalid CT_GEMM still speaks */
    if (M == 0 || N == 0) return CT_OK;
    if (K == 0) {
        scale_c(M, N, beta, C, ldc);
        return CT_OK;
    }
    return own_gemm(trans_a, trans_b, a_bf16, b_bf16, false, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

ct_status ct_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                            int64_t N, int64_t D, int64_t V)
{
    CT_TRY(gemm_check("ct_linear_forward", N, V, D, inp, weight, out));
    if (bias) ct_bias_fill_rows(out, bias, N, V);
    return ct_gemm_f32(false, true, N, V, D, 1.0f, inp, D, weight, D, bias ? 1.0f : 0.0f, out, V);
}

ct_status ct_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int64_t N, int64_t D, int64_t V)
{
    CT_TRY(gemm_check("ct_linear_backward", N, V, D, inp, weight, dout));
    if (dinp) CT_TRY(ct_gemm_f32(false, false, N, D, V, 1.0f, dout, V, weight, D, 0.0f, dinp, D));
    if (dweight) CT_TRY(ct_gemm_f32(true, false, V, D, N, 1.0f, dout, V, inp, D, 1.0f, dweight, D));
    if (dbias) ct_bias_grad_rows(dbias, dout, N, V); /* threads own columns, rows in order */
    return CT_OK;
}
