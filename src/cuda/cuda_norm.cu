/*
 * RMSNorm forward / backward and RoPE slots of the CUDA backend (semantics: src/device/backend.h;
 * the CPU kernels: src/ops/norm.c with the row bodies of norm_avx2.c / norm_scalar.c, and
 * src/ops/rope.c with rope_scalar.c).
 *
 * RMSNorm rows: 16 threads per row reproduce the AVX2 body's sums exactly. That body keeps two
 * 8-lane accumulators, a0 for the 8-float blocks at even block index and a1 for the odd ones
 * (a partial tail block, zero-padded, always goes to a1), each lane a chain of fused
 * multiply-adds in index order; then a0 + a1 and ct_hsum256, whose order
 * ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) is what shuffles at distances 8, 4, 2, 1 give. Thread
 * h * 8 + l of a row is lane l of accumulator h. So rstd, out and dinp are the bits of the
 * AVX2 / AVX-512 / NEON bodies (norm_kernels.h says those agree bit for bit); against the
 * scalar body (left-to-right sums, no FMA) within rounding.
 *
 * dweight: as ct_rmsnorm_backward, K = min(N, 64) fixed row chunks each accumulate an f32
 * partial row (pw += g * (x * rstd), fused, rows in order: the AVX2 body's operation), then
 * each column adds the K partials in chunk order in double and adds the f32 rounding of that
 * to dweight. Same bits as the AVX2 CPU path, no atomics.
 *
 * RoPE: the cos / sin table [T, 2P] is built first (the angle an f32 product t * inv_freq[i]
 * as on the CPU; cos and sin evaluated in double and rounded once to f32: correctly rounded
 * in practice, which glibc's cosf / sinf are too in nearly every case, so the table agrees
 * with the CPU's bit for bit except in rare last-bit cases), then each pair is rotated with
 * separate multiplies and adds as rope_kernels.h prescribes: identical given the same table.
 */
#include "cuda/cuda_internal.cuh"

#include <math.h>
#include <stdint.h>

#define CTCU_LAUNCH_CHECK(what)                                                                    \
    do {                                                                                           \
        int rc_ = ctcu_launched(what);                                                             \
        if (rc_) return rc_;                                                                       \
    } while (0)

#define NORM_THREADS 256
#define ROW_THREADS 16                         /* threads per row */
#define ROWS_PER_BLOCK (NORM_THREADS / ROW_THREADS)
#define NORM_MAX_BLOCKS 65535
#define NORM_ROW_CHUNKS 64                     /* CT_NORM_ROW_CHUNKS (ops_norm.h) */
#define PART_THREADS 256
#define FULL_MASK 0xffffffffu

static unsigned row_blocks(int64_t N)
{
    int64_t g = (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    return (unsigned)(g < 1 ? 1 : (g > NORM_MAX_BLOCKS ? NORM_MAX_BLOCKS : g));
}

/* The AVX2 row fold: per-thread accumulators (thread 8h + l = lane l of a_h) summed as
 * (a0 + a1), then ct_hsum256. Every lane of the warp must call it; the result is returned to
 * all 16 threads of the row. */
__device__ __forceinline__ float fold16(float acc)
{
    acc = __fadd_rn(acc, __shfl_down_sync(FULL_MASK, acc, 8, ROW_THREADS)); /* a0 + a1 */
    acc = __fadd_rn(acc, __shfl_down_sync(FULL_MASK, acc, 4, ROW_THREADS)); /* l + (l + 4) */
    acc = __fadd_rn(acc, __shfl_down_sync(FULL_MASK, acc, 2, ROW_THREADS));
    acc = __fadd_rn(acc, __shfl_down_sync(FULL_MASK, acc, 1, ROW_THREADS));
    return __shfl_sync(FULL_MASK, acc, 0, ROW_THREADS);
}

/* sum_i x[i] * y[i] over a row in the AVX2 body's order (see the top of the file): the part of
 * thread t = 8h + l, before fold16. Full 8-blocks b with b % 2 == h; the partial tail block
 * (zero-padded) in a1. If w is non-NULL, x[i] is replaced by x[i] * w[i] (rounded). */
__device__ __forceinline__ float row_dot_part(const float *x, const float *w, const float *y,
                                              int64_t C, int t)
{
    const int h = t >> 3, l = t & 7;
    const int64_t nfull = C >> 3;
    float acc = 0.0f;
    for (int64_t blk = h; blk < nfull; blk += 2) {
        int64_t i = blk * 8 + l;
        float xv = x[i];
        if (w) xv = __fmul_rn(xv, w[i]);
        acc = __fmaf_rn(xv, y[i], acc);
    }
    if (h == 1 && (C & 7)) {
        int64_t i = nfull * 8 + l;
        float xv = 0.0f, yv = 0.0f;
        if (i < C) {
            xv = x[i];
            if (w) xv = __fmul_rn(xv, w[i]);
            yv = y[i];
        }
        acc = __fmaf_rn(xv, yv, acc);
    }
    return acc;
}

/* ---- RMSNorm forward ---------------------------------------------------------------------- */

__global__ void __launch_bounds__(NORM_THREADS)
    k_rms_fwd(float *out, float *rstd, const float *inp, const float *weight, int64_t N, int64_t C,
              float eps)
{
    const int t = threadIdx.x & (ROW_THREADS - 1);
    const int g = threadIdx.x / ROW_THREADS;
    const float fC = (float)C;
    for (int64_t base = (int64_t)blockIdx.x * ROWS_PER_BLOCK; base < N;
         base += (int64_t)gridDim.x * ROWS_PER_BLOCK) {
        const int64_t r = base + g;
        const bool ok = r < N;
        const float *x = inp + (ok ? r : 0) * C;
        float part = ok ? row_dot_part(x, NULL, x, C, t) : 0.0f;
        float ss = fold16(part);
        if (!ok) continue; /* after the shuffles: all lanes took part */
        float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, fC), eps)));
        if (rstd && t == 0) rstd[r] = rs;
        float *y = out + r * C;
        for (int64_t i = t; i < C; i += ROW_THREADS) {
            float v = __fmul_rn(x[i], rs);
            if (weight) v = __fmul_rn(v, weight[i]);
            y[i] = v;
        }
    }
}

extern "C" int ctcu_rmsnorm_fwd(ct_backend *b, float *out, float *rstd, const float *inp,
                                const float *weight, int64_t N, int64_t C, float eps)
{
    if (N <= 0 || C <= 0) return 0;
    k_rms_fwd<<<row_blocks(N), NORM_THREADS, 0, ctcu_stream(b)>>>(out, rstd, inp, weight, N, C,
                                                                   eps);
    CTCU_LAUNCH_CHECK("ctcu_rmsnorm_fwd");
    return 0;
}

/* ---- RMSNorm backward --------------------------------------------------------------------- */

/* dinp[r, i] = rs (g w)_i - k x_i (one fused step), k = dot / C * rs^3 (left to right),
 * dot = sum_i (g w)_i x_i in the AVX2 order. */
__global__ void __launch_bounds__(NORM_THREADS)
    k_rms_bwd_rows(float *dinp, const float *dout, const float *inp, const float *weight,
                   const float *rstd, int64_t N, int64_t C)
{
    const int t = threadIdx.x & (ROW_THREADS - 1);
    const int g = threadIdx.x / ROW_THREADS;
    const float fC = (float)C;
    for (int64_t base = (int64_t)blockIdx.x * ROWS_PER_BLOCK; base < N;
         base += (int64_t)gridDim.x * ROWS_PER_BLOCK) {
        const int64_t r = base + g;
        const bool ok = r < N;
        const int64_t off = (ok ? r : 0) * C;
        const float *x = inp + off, *gr = dout + off;
        float part = ok ? row_dot_part(gr, weight, x, C, t) : 0.0f;
        float dot = fold16(part);
        if (!ok) continue;
        float rs = rstd[r];
        float k = __fmul_rn(__fmul_rn(__fmul_rn(__fdiv_rn(dot, fC), rs), rs), rs);
        float *dx = dinp + off;
        for (int64_t i = t; i < C; i += ROW_THREADS) {
            float gw = gr[i];
            if (weight) gw = __fmul_rn(gw, weight[i]);
            float xi = x[i];
            dx[i] = __fmaf_rn(rs, gw, -__fmul_rn(k, xi));
        }
    }
}

/* First row of chunk k of K over N rows (norm.c's chunk_start). */
__device__ __forceinline__ int64_t chunk_start(int64_t N, int64_t K, int64_t k)
{
    int64_t q = N / K, rem = N % K;
    return k * q + (k < rem ? k : rem);
}

/* pw[k, c] = sum over the rows r of chunk k, in order, of g[r, c] * (x[r, c] * rstd[r]) (each
 * step fused, from 0). Grid: x over columns, y over the K chunks. */
__global__ void k_rms_dw_partials(float *pw, const float *dout, const float *inp, const float *rstd,
                                  int64_t N, int64_t C, int64_t K)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int64_t k = blockIdx.y; k < K; k += gridDim.y) {
        const int64_t r0 = chunk_start(N, K, k), r1 = chunk_start(N, K, k + 1);
        float p = 0.0f;
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) { /* four rows' loads in flight, added in order */
            float g0 = dout[r * C + c], x0 = inp[r * C + c], s0 = rstd[r];
            float g1 = dout[(r + 1) * C + c], x1 = inp[(r + 1) * C + c], s1 = rstd[r + 1];
            float g2 = dout[(r + 2) * C + c], x2 = inp[(r + 2) * C + c], s2 = rstd[r + 2];
            float g3 = dout[(r + 3) * C + c], x3 = inp[(r + 3) * C + c], s3 = rstd[r + 3];
            p = __fmaf_rn(g0, __fmul_rn(x0, s0), p);
            p = __fmaf_rn(g1, __fmul_rn(x1, s1), p);
            p = __fmaf_rn(g2, __fmul_rn(x2, s2), p);
            p = __fmaf_rn(g3, __fmul_rn(x3, s3), p);
        }
        for (; r < r1; r++)
            p = __fmaf_rn(dout[r * C + c], __fmul_rn(inp[r * C + c], rstd[r]), p);
        pw[k * C + c] = p;
    }
}

/* dweight[c] += f32(sum_k pw[k, c]) with the sum in double in chunk order. */
__global__ void k_rms_dw_reduce(float *dweight, const float *pw, int64_t C, int64_t K)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C; c += stride) {
        double s = 0.0;
        for (int64_t k = 0; k < K; k++)
            s = __dadd_rn(s, (double)pw[k * C + c]);
        dweight[c] = __fadd_rn(dweight[c], __double2float_rn(s));
    }
}

extern "C" int ctcu_rmsnorm_bwd(ct_backend *b, float *dinp, float *dweight, const float *dout,
                                const float *inp, const float *weight, const float *rstd,
                                int64_t N, int64_t C)
{
    if (N <= 0 || C <= 0) return 0;
    cudaStream_t st = ctcu_stream(b);
    /* The weight gradient first: it reads dout, which dinp may overwrite when they alias. */
    if (dweight) {
        const int64_t K = N < NORM_ROW_CHUNKS ? N : NORM_ROW_CHUNKS;
        void *scratch = NULL;
        int rc = ctcu_scratch(b, (size_t)K * (size_t)C * sizeof(float), &scratch);
        if (rc) return rc;
        float *pw = (float *)scratch;
        dim3 grid(ctcu_blocks(C, PART_THREADS), (unsigned)K, 1);
        k_rms_dw_partials<<<grid, PART_THREADS, 0, st>>>(pw, dout, inp, rstd, N, C, K);
        rc = ctcu_launched("ctcu_rmsnorm_bwd (weight partials)");
        if (!rc) {
            unsigned nb = ctcu_blocks(C, PART_THREADS);
            if (nb > NORM_MAX_BLOCKS) nb = NORM_MAX_BLOCKS;
            k_rms_dw_reduce<<<nb, PART_THREADS, 0, st>>>(dweight, pw, C, K);
            rc = ctcu_launched("ctcu_rmsnorm_bwd (weight reduction)");
        }
        ctcu_scratch_free(b, scratch);
        if (rc) return rc;
    }
    k_rms_bwd_rows<<<row_blocks(N), NORM_THREADS, 0, st>>>(dinp, dout, inp, weight, rstd, N, C);
    CTCU_LAUNCH_CHECK("ctcu_rmsnorm_bwd");
    return 0;
}

/* ---- RoPE --------------------------------------------------------------------------------- */

#define ROPE_THREADS 128
#define ROPE_MAX_ROW_BLOCKS 65535

/* tab[t, i] = cos(t * inv_freq[i]), tab[t, P + i] = sin(...), i < P. */
__global__ void k_rope_table(float *tab, const float *inv_freq, int64_t T, int64_t P)
{
    const int64_t n = T * P, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t t = e / P, i = e - t * P;
        float ang = __fmul_rn((float)t, inv_freq[i]);
        double s, c;
        sincos((double)ang, &s, &c);
        tab[t * 2 * P + i] = __double2float_rn(c);
        tab[t * 2 * P + P + i] = __double2float_rn(s);
    }
}

/* Row r of [rows, 2P] uses table row (r / H) % T; y1 = x1 c - x2 s, y2 = x2 c + x1 s with
 * s = sign * sin (sign -1: the inverse rotation). */
__global__ void k_rope_rotate(float *x, const float *tab, int64_t rows, int64_t T, int64_t H,
                              int64_t P, float sign)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= P) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const int64_t t = (r / H) % T;
        const float c = tab[t * 2 * P + i], s = sign * tab[t * 2 * P + P + i];
        float *row = x + r * 2 * P;
        const float x1 = row[i], x2 = row[P + i];
        row[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
        row[P + i] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
    }
}

extern "C" int ctcu_rope(ct_backend *b, float *x, int64_t B, int64_t T, int64_t H, int64_t E,
                         const float *inv_freq, bool backward)
{
    if (B <= 0 || T <= 0 || H <= 0 || E <= 0) return 0;
    if (E % 2)
        return ctcu_fail(CT_EINVAL, "ctcu_rope: E (head dim) must be even (got %lld)",
                         (long long)E);
    const int64_t P = E / 2, rows = B * T * H;
    cudaStream_t st = ctcu_stream(b);
    void *scratch = NULL;
    int rc = ctcu_scratch(b, (size_t)T * (size_t)E * sizeof(float), &scratch);
    if (rc) return rc;
    float *tab = (float *)scratch;
    unsigned tb = ctcu_blocks(T * P, ROPE_THREADS);
    if (tb > (1u << 20)) tb = 1u << 20;
    k_rope_table<<<tb, ROPE_THREADS, 0, st>>>(tab, inv_freq, T, P);
    rc = ctcu_launched("ctcu_rope (table)");
    if (!rc) {
        unsigned gx = ctcu_blocks(P, ROPE_THREADS);
        int64_t gy = rows < ROPE_MAX_ROW_BLOCKS ? rows : ROPE_MAX_ROW_BLOCKS;
        dim3 grid(gx, (unsigned)gy, 1);
        k_rope_rotate<<<grid, ROPE_THREADS, 0, st>>>(x, tab, rows, T, H, P,
                                                     backward ? -1.0f : 1.0f);
        rc = ctcu_launched("ctcu_rope (rotation)");
    }
    ctcu_scratch_free(b, scratch);
    return rc;
}
