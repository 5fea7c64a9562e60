/* GEMM through CBLAS (OpenBLAS), made deterministic. A multi-threaded OpenBLAS call does
 * not give the same bits for 1 and 2 threads (it picks kernels and splits by thread count),
 * so OpenBLAS runs single-threaded and ctorch cuts the product into blocks whose layout
 * depends on the shape alone; the pool's threads take the blocks. Two layouts:
 *   - C split into a grid of about GEMM_BLOCKS tiles (rows and columns cut in proportion
 *     to M and N, so that re-packing the shared operand stays cheap), each tile one sgemm
 *     over the whole K;
 *   - when K dominates a small C (e.g. dh = G W in the fused loss: 130 x 1024, K = 128256),
 *     K is cut into GEMM_BLOCKS slices, each slice's product goes to its own partial buffer,
 *     and the partials are added in slice order. Splitting C there would re-pack the huge
 *     operand once per tile.
 * Every output element is computed by the same calls in the same order for any thread count. */
#include "core/internal.h"
#include "ctorch/ops.h"

#include "ops/blas.h"
#include "ops/gemm.h"
#include <string.h>

#define GEMM_BLOCK 256          /* rows of a bf16 operand converted at a time */
#define GEMM_BLOCKS 8           /* blocks per product (enough for 8 threads) */
#define GEMM_MIN_TILE 256       /* smallest tile side worth a split */
#define GEMM_KSPLIT_MAX_C (1 << 20) /* K-split only for C of at most this many elements */

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

size_t ct_gemm_scratch_bytes(int64_t M, int64_t N, int64_t K)
{
    int64_t big = M > N ? M : N;
    if (K >= 4 * big && K >= GEMM_BLOCKS * GEMM_MIN_TILE && M * N <= GEMM_KSPLIT_MAX_C)
        return (size_t)(GEMM_BLOCKS * M * N) * sizeof(float);
    return 0;
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

ct_status ct_gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                      float *C, int64_t ldc)
{
    CT_TRY(gemm_check("ct_gemm_f32", M, N, K, A, B, C));
    if (M == 0 || N == 0) return CT_OK;
    if (!lda) lda = trans_a ? M : K;
    if (!ldb) ldb = trans_b ? K : N;
    if (!ldc) ldc = N;
    if (K == 0) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return CT_OK;
    }
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
    while (j.nbm * j.nbn < GEMM_BLOCKS) {
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

ct_status ct_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
                       float *C, int64_t ldc)
{
    CT_TRY(gemm_check("ct_gemm_bf16", M, N, K, A, B, C));
    if (M == 0 || N == 0) return CT_OK;
    if (!lda) lda = trans_a ? M : K;
    if (!ldb) ldb = trans_b ? K : N;
    if (!ldc) ldc = N;
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
        s = ct_gemm_f32(trans_a, trans_b, mb, N, K, alpha, af, trans_a ? mb : K, bf, bcols, beta,
                        C + m0 * ldc, ldc);
    }
    ct_free(af);
    ct_free(bf);
    return s;
}

ct_status ct_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                            int64_t N, int64_t D, int64_t V)
{
    CT_TRY(gemm_check("ct_linear_forward", N, V, D, inp, weight, out));
    if (bias)
        for (int64_t n = 0; n < N; n++) memcpy(out + n * V, bias, (size_t)V * sizeof(float));
    return ct_gemm_f32(false, true, N, V, D, 1.0f, inp, D, weight, D, bias ? 1.0f : 0.0f, out, V);
}

ct_status ct_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int64_t N, int64_t D, int64_t V)
{
    CT_TRY(gemm_check("ct_linear_backward", N, V, D, inp, weight, dout));
    if (dinp) CT_TRY(ct_gemm_f32(false, false, N, D, V, 1.0f, dout, V, weight, D, 0.0f, dinp, D));
    if (dweight) CT_TRY(ct_gemm_f32(true, false, V, D, N, 1.0f, dout, V, inp, D, 1.0f, dweight, D));
    if (dbias)
        for (int64_t n = 0; n < N; n++) /* fixed row order: deterministic */
            for (int64_t v = 0; v < V; v++) dbias[v] += dout[n * V + v];
    return CT_OK;
}
