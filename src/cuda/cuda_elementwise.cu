/*
 * Element-wise slots of the CUDA backend: add, scale, to_bf16, bias_add_rows, bias_grad_rows,
 * swiglu forward / backward (semantics: src/device/backend.h; the CPU kernels they follow:
 * src/ops/elementwise*.c, src/ops/bias.c, ct_f32_to_bf16 in src/core/tensor.c).
 *
 * Every operation is written with the explicitly rounded intrinsics (__fadd_rn, __fmul_rn,
 * __fmaf_rn, ...) so that nvcc never contracts a multiply and an add the CPU keeps apart:
 * - add, scale, to_bf16, bias_add_rows: one IEEE operation (or bit manipulation) per element,
 *   the CPU's bits.
 * - bias_grad_rows: each column is summed by one thread, starting from db[c] and adding the
 *   rows in order, as ct_bias_grad_rows does: the CPU's bits. The rows of a block's 32 columns
 *   are staged through shared memory by seven loader warps while the eighth adds.
 * - swiglu: the x86 vector bodies' formulas (src/ops/elementwise_x86.h) with their exp
 *   (cv_exp in src/simd/simd_x86.h, written again below operation for operation), so the
 *   results are the AVX2 / AVX-512 CPU bits; against the scalar libm-expf body they agree
 *   within rounding (a few ulp).
 * Grid-stride loops with int64 indices; launch shapes depend on the sizes only.
 */
#include "cuda/cuda_internal.cuh"

#include <math.h>
#include <stdint.h>

#define EW_THREADS 256
#define EW_MAX_BLOCKS (1 << 20) /* grid-stride beyond this */
#define ROW_MAX_BLOCKS 65535     /* grid y limit */

#define CTCU_LAUNCH_CHECK(what)                                                                    \
    do {                                                                                           \
        int rc_ = ctcu_launched(what);                                                             \
        if (rc_) return rc_;                                                                       \
    } while (0)

static unsigned ew_blocks(int64_t n)
{
    unsigned b = ctcu_blocks(n, EW_THREADS);
    return b > EW_MAX_BLOCKS ? EW_MAX_BLOCKS : b;
}

/* Grid over (column blocks of EW_THREADS, row groups): rows stride by gridDim.y. */
static dim3 rows_grid(int64_t N, int64_t C)
{
    unsigned gx = ctcu_blocks(C, EW_THREADS);
    int64_t gy = N < ROW_MAX_BLOCKS ? N : ROW_MAX_BLOCKS;
    /* keep the whole grid near EW_MAX_BLOCKS blocks: fewer row groups for wide rows */
    int64_t cap = EW_MAX_BLOCKS / (int64_t)gx;
    if (cap < 1) cap = 1;
    if (gy > cap) gy = cap;
    return dim3(gx, (unsigned)(gy < 1 ? 1 : gy), 1);
}

/* ---- add, scale, to_bf16 ------------------------------------------------------------------ */

__global__ void k_add(float *out, const float *x, const float *y, int64_t n)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = __fadd_rn(x[i], y[i]);
}

__global__ void k_scale(float *x, float s, int64_t n)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = __fmul_rn(s, x[i]);
}

/* ct_f32_to_bf16: NaN keeps its sign and top mantissa bits with the quiet bit set; the rest
 * round to nearest even on the upper 16 bits. */
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__global__ void k_to_bf16(uint16_t *dst, const float *src, int64_t n)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = f32_to_bf16_bits(src[i]);
}

extern "C" int ctcu_add(ct_backend *b, float *out, const float *x, const float *y, int64_t n)
{
    if (n <= 0) return 0;
    k_add<<<ew_blocks(n), EW_THREADS, 0, ctcu_stream(b)>>>(out, x, y, n);
    CTCU_LAUNCH_CHECK("ctcu_add");
    return 0;
}

extern "C" int ctcu_scale(ct_backend *b, float *x, float s, int64_t n)
{
    if (n <= 0) return 0;
    k_scale<<<ew_blocks(n), EW_THREADS, 0, ctcu_stream(b)>>>(x, s, n);
    CTCU_LAUNCH_CHECK("ctcu_scale");
    return 0;
}

extern "C" int ctcu_to_bf16(ct_backend *b, uint16_t *dst, const float *src, int64_t n)
{
    if (n <= 0) return 0;
    k_to_bf16<<<ew_blocks(n), EW_THREADS, 0, ctcu_stream(b)>>>(dst, src, n);
    CTCU_LAUNCH_CHECK("ctcu_to_bf16");
    return 0;
}

/* ---- bias rows ---------------------------------------------------------------------------- */

__global__ void k_bias_add_rows(float *x, const float *bias, int64_t N, int64_t C)
{
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float bc = bias[c];
    for (int64_t r = blockIdx.y; r < N; r += gridDim.y)
        x[r * C + c] = __fadd_rn(x[r * C + c], bc);
}

extern "C" int ctcu_bias_add_rows(ct_backend *b, float *x, const float *bias, int64_t N, int64_t C)
{
    if (N <= 0 || C <= 0) return 0;
    k_bias_add_rows<<<rows_grid(N, C), EW_THREADS, 0, ctcu_stream(b)>>>(x, bias, N, C);
    CTCU_LAUNCH_CHECK("ctcu_bias_add_rows");
    return 0;
}

#define BG_COLS 32    /* columns per block: one warp adds them */
#define BG_ROWS 64    /* rows per shared-memory tile */
#define BG_LOADERS 7  /* loader warps (the block has BG_LOADERS + 1 warps) */

/* Block: 8 warps over columns [c0, c0 + 32). Warp 0 owns the sums: lane j keeps db[c0 + j]
 * in a register and adds the rows of each tile in row order. Warps 1..7 load tile t + 1 into
 * the other buffer while warp 0 adds tile t; a barrier separates the iterations. */
__global__ void __launch_bounds__((BG_LOADERS + 1) * 32)
    k_bias_grad_rows(float *db, const float *d, int64_t N, int64_t C)
{
    __shared__ float tile[2][BG_ROWS][BG_COLS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t c = (int64_t)blockIdx.x * BG_COLS + lane;
    const bool col_ok = c < C;
    const int64_t ntiles = (N + BG_ROWS - 1) / BG_ROWS;
    float acc = 0.0f;
    if (warp == 0 && col_ok) acc = db[c];

    /* prologue: tile 0 into buffer 0 */
    if (warp > 0) {
        for (int rr = warp - 1; rr < BG_ROWS; rr += BG_LOADERS) {
            int64_t r = rr;
            tile[0][rr][lane] = (r < N && col_ok) ? d[r * C + c] : 0.0f;
        }
    }
    __syncthreads();
    for (int64_t t = 0; t < ntiles; t++) {
        const int cur = (int)(t & 1);
        if (warp > 0) {
            if (t + 1 < ntiles) {
                int64_t r0 = (t + 1) * BG_ROWS;
                for (int rr = warp - 1; rr < BG_ROWS; rr += BG_LOADERS) {
                    int64_t r = r0 + rr;
                    tile[cur ^ 1][rr][lane] = (r < N && col_ok) ? d[r * C + c] : 0.0f;
                }
            }
        } else {
            int64_t left = N - t * BG_ROWS;
            int m = left < BG_ROWS ? (int)left : BG_ROWS;
            for (int rr = 0; rr < m; rr++)
                acc = __fadd_rn(acc, tile[cur][rr][lane]);
        }
        __syncthreads();
    }
    if (warp == 0 && col_ok) db[c] = acc;
}

extern "C" int ctcu_bias_grad_rows(ct_backend *b, float *db, const float *d, int64_t N, int64_t C)
{
    if (N <= 0 || C <= 0) return 0;
    int64_t nb = (C + BG_COLS - 1) / BG_COLS;
    if (nb > 0x7fffffff)
        return ctcu_fail(CT_EOVERFLOW, "ctcu_bias_grad_rows: C = %lld columns is too many",
                         (long long)C);
    k_bias_grad_rows<<<(unsigned)nb, (BG_LOADERS + 1) * 32, 0, ctcu_stream(b)>>>(db, d, N, C);
    CTCU_LAUNCH_CHECK("ctcu_bias_grad_rows");
    return 0;
}

/* ---- SwiGLU ------------------------------------------------------------------------------- */

/* e^x as the x86 vector bodies compute it (cv_exp, src/simd/simd_x86.h): clamp, n =
 * round-to-even(x log2 e), r = x - n ln2 in two fused steps, a degree-5 polynomial,
 * 2^n as two power-of-two factors; 0 below -87.33654, +inf above 88.72283, NaN stays. Each
 * step is the same IEEE operation (fused where the vector code fuses), so the same bits. */
__device__ __forceinline__ float ct_exp(float x)
{
    float xc = fmaxf(fminf(x, 88.72283f), -87.33654f);
    float n = rintf(__fmul_rn(xc, 1.44269504088896341f));
    float r = __fmaf_rn(-n, 0.693359375f, xc);
    r = __fmaf_rn(-n, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = __fmaf_rn(p, r, 1.3981999507e-3f);
    p = __fmaf_rn(p, r, 8.3334519073e-3f);
    p = __fmaf_rn(p, r, 4.1665795894e-2f);
    p = __fmaf_rn(p, r, 1.6666665459e-1f);
    p = __fmaf_rn(p, r, 5.0000001201e-1f);
    p = __fmaf_rn(p, __fmul_rn(r, r), r);
    p = __fadd_rn(p, 1.0f);
    int ni = (int)n; /* an integer in [-126, 128] */
    int hn = ni >> 1;
    float f1 = __int_as_float((hn + 127) << 23);
    float f2 = __int_as_float((ni - hn + 127) << 23);
    float res = __fmul_rn(__fmul_rn(p, f1), f2);
    if (x < -87.33654f) res = 0.0f;
    if (x > 88.72283f) res = INFINITY;
    if (isnan(x)) res = x;
    return res;
}

/* 1 / (1 + e^-x) */
__device__ __forceinline__ float ct_sigmoid(float x)
{
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, ct_exp(__fsub_rn(0.0f, x))));
}

/* out[r, j] = silu(a) b with a = inp[r, j], b = inp[r, F + j]; silu(a) = a / (1 + e^-a). */
__global__ void k_swiglu_fwd(float *out, const float *inp, int64_t N, int64_t F)
{
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= F) return;
    for (int64_t r = blockIdx.y; r < N; r += gridDim.y) {
        const float *row = inp + r * 2 * F;
        float a = row[j], bv = row[F + j];
        float silu = __fdiv_rn(a, __fadd_rn(1.0f, ct_exp(__fsub_rn(0.0f, a))));
        out[r * F + j] = __fmul_rn(silu, bv);
    }
}

/* da = (g b) s (a (1 - s) + 1), db = g (a s), s = sigmoid(a): swiglu_bwd_vec's operations. */
__global__ void k_swiglu_bwd(float *dinp, const float *dout, const float *inp, int64_t N, int64_t F)
{
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= F) return;
    for (int64_t r = blockIdx.y; r < N; r += gridDim.y) {
        const float *row = inp + r * 2 * F;
        float a = row[j], bv = row[F + j], g = dout[r * F + j];
        float s = ct_sigmoid(a);
        float silu = __fmul_rn(a, s);
        float dsilu = __fmul_rn(s, __fmaf_rn(a, __fsub_rn(1.0f, s), 1.0f));
        float da = __fmul_rn(__fmul_rn(g, bv), dsilu);
        float dbv = __fmul_rn(g, silu);
        dinp[r * 2 * F + j] = da;
        dinp[r * 2 * F + F + j] = dbv;
    }
}

extern "C" int ctcu_swiglu_fwd(ct_backend *b, float *out, const float *inp, int64_t N, int64_t F)
{
    if (N <= 0 || F <= 0) return 0;
    k_swiglu_fwd<<<rows_grid(N, F), EW_THREADS, 0, ctcu_stream(b)>>>(out, inp, N, F);
    CTCU_LAUNCH_CHECK("ctcu_swiglu_fwd");
    return 0;
}

extern "C" int ctcu_swiglu_bwd(ct_backend *b, float *dinp, const float *dout, const float *inp,
                               int64_t N, int64_t F)
{
    if (N <= 0 || F <= 0) return 0;
    k_swiglu_bwd<<<rows_grid(N, F), EW_THREADS, 0, ctcu_stream(b)>>>(dinp, dout, inp, N, F);
    CTCU_LAUNCH_CHECK("ctcu_swiglu_bwd");
    return 0;
}
