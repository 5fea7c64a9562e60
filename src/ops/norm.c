/* RMSNorm and LayerNorm, forward and backward, f32 and bf16 (f32 statistics and maths).
 *
 * Rows are independent, so dinp and the outputs are the same bits for any thread count.
 * The weight/bias gradients are sums over rows: each of K = min(N, CT_NORM_ROW_CHUNKS)
 * fixed row chunks (chosen from N alone) accumulates its own f32 partial [C], then the
 * partials are added in chunk order in double and added to dweight/dbias. The rows of both
 * (forward and backward, f32 and bf16) go through the kernel table of norm_kernels.h
 * (bodies: norm_scalar.c, norm_avx2.c, norm_neon.c, norm_sve.c); this file holds the argument checks, the threading
 * and the chunk reduction. */
#include "core/internal.h"
#include "ops/norm_kernels.h"
#include "ctorch/ops.h"

#include <math.h>

#define COL_BLOCK 256 /* columns per task when summing the chunk partials */

/* ---- argument checks ------------------------------------------------------------------ */

static ct_status check_sizes(const char *fn, int64_t N, int64_t C)
{
    if (N < 0) return ct_error(CT_EINVAL, "%s: N must be >= 0 (got %lld)", fn, (long long)N);
    if (C < 0 || (N > 0 && C < 1))
        return ct_error(CT_EINVAL, "%s: C must be >= 1 when N > 0 (got C = %lld)", fn,
                        (long long)C);
    int64_t nc;
    if (__builtin_mul_overflow(N, C, &nc) || nc > INT64_MAX / 4)
        return ct_error(CT_EOVERFLOW, "%s: N * C overflows (N = %lld, C = %lld)", fn, (long long)N,
                        (long long)C);
    return CT_OK;
}

static ct_status need(const char *fn, const char *name, const void *p, int64_t N)
{
    if (N > 0 && !p)
        return ct_error(CT_EINVAL, "%s: %s must not be NULL (N = %lld)", fn, name, (long long)N);
    return CT_OK;
}

static ct_status check_eps(const char *fn, float eps)
{
    if (!(eps >= 0.0f) || isinf(eps))
        return ct_error(CT_EINVAL, "%s: eps must be finite and >= 0 (got %g)", fn, (double)eps);
    return CT_OK;
}

/* ---- shared machinery ----------------------------------------------------------------- */

typedef struct {
    int bf;
    int64_t N, C, K;
    float eps;
    void *out;              /* forward out / backward dinp */
    const void *inp, *dout; /* dout: backward only */
    const void *w, *b;
    float *mean, *rstd;         /* forward outputs (may be NULL) */
    const float *smean, *srstd; /* backward inputs */
    float *pw, *pb;             /* backward partials [K, C] or NULL */
    float *dweight, *dbias;
    bool nt; /* out streamed (ct_stream_stores): rows computed into a buffer, then copied out */
} norm_ctx;

typedef void (*rows_fn)(const norm_ctx *c, int64_t r0, int64_t r1, float *pw, float *pb);

/* First row of chunk k of K over N rows. */
static inline int64_t chunk_start(int64_t N, int64_t K, int64_t k)
{
    int64_t q = N / K, rem = N % K;
    return k * q + (k < rem ? k : rem);
}

typedef struct {
    const norm_ctx *c;
    rows_fn fn;
} run_ctx;

#define NORM_STREAM_ROW_MAX 32768 /* bytes of one row that a streamed task buffers (on its stack) */

/* Whether out [N, C] is streamed, and rows [r0, r1) of it: directly, or (c->nt) a few rows at
 * a time into an L1-sized buffer copied out with streaming stores (the same bytes). */
static bool stream_out(const norm_ctx *c)
{
    size_t row = (size_t)c->C * (c->bf ? 2 : 4);
    return row <= NORM_STREAM_ROW_MAX && ct_stream_stores(row * (size_t)c->N);
}

static void rows_call(const norm_ctx *c, rows_fn fn, int64_t r0, int64_t r1, float *pw, float *pb)
{
    if (!c->nt) {
        fn(c, r0, r1, pw, pb);
        return;
    }
    _Alignas(64) unsigned char buf[NORM_STREAM_ROW_MAX];
    size_t es = c->bf ? 2 : 4, row = (size_t)c->C * es;
    int64_t per = CT_STREAM_TILE_BYTES / (int64_t)row;
    if (per < 1) per = 1;
    for (int64_t r = r0; r < r1; r += per) {
        int64_t k = r1 - r < per ? r1 - r : per;
        norm_ctx t = *c; /* rows [r, r + k) as rows [0, k) of shifted arrays */
        size_t off = (size_t)r * row;
        t.out = buf;
        t.inp = (const unsigned char *)c->inp + off;
        if (c->dout) t.dout = (const unsigned char *)c->dout + off;
        if (c->mean) t.mean = c->mean + r;
        if (c->rstd) t.rstd = c->rstd + r;
        if (c->smean) t.smean = c->smean + r;
        if (c->srstd) t.srstd = c->srstd + r;
        fn(&t, 0, k, pw, pb);
        ct_stream_copy((unsigned char *)c->out + off, buf, (size_t)k * row);
    }
    ct_stream_fence();
}

static void run_rows_body(void *arg, int64_t r0, int64_t r1, int tid)
{
    const run_ctx *rc = arg;
    rows_call(rc->c, rc->fn, r0, r1, NULL, NULL);
}

static void run_chunks_body(void *arg, int64_t k0, int64_t k1, int tid)
{
    const run_ctx *rc = arg;
    const norm_ctx *c = rc->c;
    for (int64_t k = k0; k < k1; k++) {
        float *pw = c->pw ? c->pw + k * c->C : NULL;
        float *pb = c->pb ? c->pb + k * c->C : NULL;
        rows_call(c, rc->fn, chunk_start(c->N, c->K, k), chunk_start(c->N, c->K, k + 1), pw, pb);
    }
}

/* dweight[c] += sum_k pw[k, c] (and dbias from pb), in chunk order, in double. */
static void reduce_cols_body(void *arg, int64_t b0, int64_t b1, int tid)
{
    const norm_ctx *c = arg;
    double sw[COL_BLOCK], sb[COL_BLOCK];
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t c0 = blk * COL_BLOCK, c1 = c0 + COL_BLOCK < c->C ? c0 + COL_BLOCK : c->C;
        int64_t m = c1 - c0;
        for (int64_t j = 0; j < m; j++)
            sw[j] = sb[j] = 0.0;
        for (int64_t k = 0; k < c->K; k++) {
            if (c->pw)
                for (int64_t j = 0; j < m; j++)
                    sw[j] += c->pw[k * c->C + c0 + j];
            if (c->pb)
                for (int64_t j = 0; j < m; j++)
                    sb[j] += c->pb[k * c->C + c0 + j];
        }
        if (c->dweight)
            for (int64_t j = 0; j < m; j++)
                c->dweight[c0 + j] += (float)sw[j];
        if (c->dbias)
            for (int64_t j = 0; j < m; j++)
                c->dbias[c0 + j] += (float)sb[j];
    }
}

/* Run a backward over all rows; with weight/bias gradients requested, over the fixed row
 * chunks with partials, then reduce them. */
static ct_status run_backward(norm_ctx *c, rows_fn fn)
{
    run_ctx rc = {c, fn};
    if (c->N == 0) return CT_OK;
    c->nt = stream_out(c);
    if (!c->dweight && !c->dbias) {
        ct_parallel_for(c->N, run_rows_body, &rc);
        return CT_OK;
    }
    c->K = c->N < CT_NORM_ROW_CHUNKS ? c->N : CT_NORM_ROW_CHUNKS;
    size_t per = (size_t)c->K * (size_t)c->C, bytes;
    int parts = (c->dweight != NULL) + (c->dbias != NULL);
    if (!ct_mul_size(per, sizeof(float) * (size_t)parts, &bytes))
        return ct_error(CT_EOVERFLOW, "norm backward: scratch size overflows");
    float *scratch = NULL;
    CT_TRY(ct_calloc((void **)&scratch, bytes));
    c->pw = c->dweight ? scratch : NULL;
    c->pb = c->dbias ? scratch + (c->dweight ? per : 0) : NULL;
    ct_parallel_for(c->K, run_chunks_body, &rc);
    ct_parallel_for((c->C + COL_BLOCK - 1) / COL_BLOCK, reduce_cols_body, c);
    ct_free(scratch);
    return CT_OK;
}

static void run_rows_fwd(norm_ctx *c, rows_fn fn)
{
    run_ctx rc = {c, fn};
    c->nt = c->N > 0 && stream_out(c);
    ct_parallel_for(c->N, run_rows_body, &rc);
}

/* ---- kernel table --------------------------------------------------------------------- */

#if defined(__x86_64__)
#define NORM_AVX2 &ct_norm_avx2
#define NORM_AVX512 &ct_norm_avx512
#else
#define NORM_AVX2 &ct_norm_scalar
#define NORM_AVX512 &ct_norm_scalar
#endif
#if defined(__aarch64__)
#define NORM_NEON &ct_norm_neon
#define NORM_SVE &ct_norm_sve
#else
#define NORM_NEON &ct_norm_scalar
#define NORM_SVE &ct_norm_scalar
#endif

/* avx512 and neon are bitwise the AVX2 bodies, sve vector-length agnostic. */
const ct_norm_kernels *const ct_norm_tables[CT_ISA_COUNT] = {
    [CT_ISA_SCALAR] = &ct_norm_scalar, [CT_ISA_AVX2] = NORM_AVX2, [CT_ISA_AVX512] = NORM_AVX512,
    [CT_ISA_NEON] = NORM_NEON,        [CT_ISA_SVE] = NORM_SVE,
};

/* ---- RMSNorm -------------------------------------------------------------------------- */

static void rms_fwd_rows(const norm_ctx *c, int64_t r0, int64_t r1, float *pw, float *pb)
{
    CT_KERNELS(ct_norm_tables)->rms_forward_rows(c->out, c->rstd, c->inp, c->w, r0, r1, c->C, c->eps, c->bf);
}

static void rms_bwd_rows(const norm_ctx *c, int64_t r0, int64_t r1, float *pw, float *pb)
{
    CT_KERNELS(ct_norm_tables)->rms_backward_rows(c->out, pw, c->dout, c->inp, c->w, c->srstd, r0, r1,
                                                  c->C, c->bf);
}

static ct_status rms_forward(const char *fn, int bf, void *out, float *rstd, const void *inp,
                             const void *weight, int64_t N, int64_t C, float eps)
{
    CT_TRY(check_sizes(fn, N, C));
    CT_TRY(need(fn, "out", out, N));
    CT_TRY(need(fn, "inp", inp, N));
    CT_TRY(check_eps(fn, eps));
    norm_ctx c = {
        .bf = bf, .N = N, .C = C, .eps = eps, .out = out, .inp = inp, .w = weight, .rstd = rstd};
    run_rows_fwd(&c, rms_fwd_rows);
    return CT_OK;
}

static ct_status rms_backward(const char *fn, int bf, void *dinp, float *dweight, const void *dout,
                              const void *inp, const void *weight, const float *rstd, int64_t N,
                              int64_t C)
{
    CT_TRY(check_sizes(fn, N, C));
    CT_TRY(need(fn, "dinp", dinp, N));
    CT_TRY(need(fn, "dout", dout, N));
    CT_TRY(need(fn, "inp", inp, N));
    CT_TRY(need(fn, "rstd", rstd, N));
    norm_ctx c = {.bf = bf,
                  .N = N,
                  .C = C,
                  .out = dinp,
                  .inp = inp,
                  .dout = dout,
                  .w = weight,
                  .srstd = rstd,
                  .dweight = dweight};
    return run_backward(&c, rms_bwd_rows);
}

ct_status ct_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                             int64_t N, int64_t C, float eps)
{
    return rms_forward("ct_rmsnorm_forward", 0, out, rstd, inp, weight, N, C, eps);
}

ct_status ct_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                              const float *weight, const float *rstd, int64_t N, int64_t C)
{
    return rms_backward("ct_rmsnorm_backward", 0, dinp, dweight, dout, inp, weight, rstd, N, C);
}

ct_status ct_rmsnorm_forward_bf16(uint16_t *out, float *rstd, const uint16_t *inp,
                                  const uint16_t *weight, int64_t N, int64_t C, float eps)
{
    return rms_forward("ct_rmsnorm_forward_bf16", 1, out, rstd, inp, weight, N, C, eps);
}

ct_status ct_rmsnorm_backward_bf16(uint16_t *dinp, float *dweight, const uint16_t *dout,
                                   const uint16_t *inp, const uint16_t *weight, const float *rstd,
                                   int64_t N, int64_t C)
{
    return rms_backward("ct_rmsnorm_backward_bf16", 1, dinp, dweight, dout, inp, weight, rstd, N,
                        C);
}

/* ---- LayerNorm ------------------------------------------------------------------------ */

static void ln_fwd_rows(const norm_ctx *c, int64_t r0, int64_t r1, float *pw, float *pb)
{
    CT_KERNELS(ct_norm_tables)->ln_forward_rows(c->out, c->mean, c->rstd, c->inp, c->w, c->b, r0,
                                                r1, c->C, c->eps, c->bf);
}

static void ln_bwd_rows(const norm_ctx *c, int64_t r0, int64_t r1, float *pw, float *pb)
{
    CT_KERNELS(ct_norm_tables)->ln_backward_rows(c->out, pw, pb, c->dout, c->inp, c->w, c->smean,
                                                 c->srstd, r0, r1, c->C, c->bf);
}

static ct_status ln_forward(const char *fn, int bf, void *out, float *mean, float *rstd,
                            const void *inp, const void *weight, const void *bias, int64_t N,
                            int64_t C, float eps)
{
    CT_TRY(check_sizes(fn, N, C));
    CT_TRY(need(fn, "out", out, N));
    CT_TRY(need(fn, "inp", inp, N));
    CT_TRY(check_eps(fn, eps));
    norm_ctx c = {.bf = bf,
                  .N = N,
                  .C = C,
                  .eps = eps,
                  .out = out,
                  .inp = inp,
                  .w = weight,
                  .b = bias,
                  .mean = mean,
                  .rstd = rstd};
    run_rows_fwd(&c, ln_fwd_rows);
    return CT_OK;
}

static ct_status ln_backward(const char *fn, int bf, void *dinp, float *dweight, float *dbias,
                             const void *dout, const void *inp, const void *weight,
                             const float *mean, const float *rstd, int64_t N, int64_t C)
{
    CT_TRY(check_sizes(fn, N, C));
    CT_TRY(need(fn, "dinp", dinp, N));
    CT_TRY(need(fn, "dout", dout, N));
    CT_TRY(need(fn, "inp", inp, N));
    CT_TRY(need(fn, "mean", mean, N));
    CT_TRY(need(fn, "rstd", rstd, N));
    norm_ctx c = {.bf = bf,
                  .N = N,
                  .C = C,
                  .out = dinp,
                  .inp = inp,
                  .dout = dout,
                  .w = weight,
                  .smean = mean,
                  .srstd = rstd,
                  .dweight = dweight,
                  .dbias = dbias};
    return run_backward(&c, ln_bwd_rows);
}

ct_status ct_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int64_t N, int64_t C,
                               float eps)
{
    return ln_forward("ct_layernorm_forward", 0, out, mean, rstd, inp, weight, bias, N, C, eps);
}

ct_status ct_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *mean,
                                const float *rstd, int64_t N, int64_t C)
{
    return ln_backward("ct_layernorm_backward", 0, dinp, dweight, dbias, dout, inp, weight, mean,
                       rstd, N, C);
}

ct_status ct_layernorm_forward_bf16(uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
                                    const uint16_t *weight, const uint16_t *bias, int64_t N,
                                    int64_t C, float eps)
{
    return ln_forward("ct_layernorm_forward_bf16", 1, out, mean, rstd, inp, weight, bias, N, C,
                      eps);
}

ct_status ct_layernorm_backward_bf16(uint16_t *dinp, float *dweight, float *dbias,
                                     const uint16_t *dout, const uint16_t *inp,
                                     const uint16_t *weight, const float *mean, const float *rstd,
                                     int64_t N, int64_t C)
{
    return ln_backward("ct_layernorm_backward_bf16", 1, dinp, dweight, dbias, dout, inp, weight,
                       mean, rstd, N, C);
}
