/*
 * AdamW and the gradient sum of squares: slots of the CUDA backend (semantics:
 * src/device/backend.h; the CPU code: ct_adamw_step and ct_grad_sumsq in src/model/optim.c).
 *
 * AdamW: the host derives the per-step constants exactly as ct_adamw_step does (bias
 * corrections in double with pow, then rounded to f32), and each element runs the CPU loop's
 * f32 operations in its order, with the explicitly rounded intrinsics so nothing is
 * contracted: the CPU's bits.
 *
 * sumsq: the CPU splits g into blocks of 16384 values; in a block, four double accumulators
 * take the values i = 4q + k (k = 0..3) in order, a tail of fewer than four goes to
 * accumulator 0, the block sum is (a0 + a1) + (a2 + a3), and the block sums are added in
 * block order from 0. Here four adjacent threads of a warp are the four accumulators of one
 * block (each product (double)g * g is exact, so fused or not it is the same), shuffles form
 * (a0 + a1) + (a2 + a3) into scratch, and one thread adds the block sums in order: the CPU's
 * bits. *out is written on the device (0 when n = 0).
 */
#include "cuda/cuda_internal.cuh"

#include <math.h>
#include <stdint.h>

#define CTCU_LAUNCH_CHECK(what)                                                                    \
    do {                                                                                           \
        int rc_ = ctcu_launched(what);                                                             \
        if (rc_) return rc_;                                                                       \
    } while (0)

#define OPT_THREADS 256
#define OPT_MAX_BLOCKS (1 << 20)
#define NORM_BLOCK 16384 /* optim.c's NORM_BLOCK */
#define SUMSQ_THREADS 128
#define SUMSQ_MAX_BLOCKS 65535
#define FINAL_THREADS 256

/* ---- AdamW -------------------------------------------------------------------------------- */

struct adamw_consts {
    float decay, b1, one_b1, b2, one_b2, step_size, bc2_sqrt, eps;
};

__global__ void k_adamw(float *param, const float *grad, float *m, float *v, int64_t n,
                        adamw_consts k)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = grad[i];
        /* m = b1 * m + one_b1 * g;  v = b2 * v + one_b2 * g * g  (left to right) */
        const float mi = __fadd_rn(__fmul_rn(k.b1, m[i]), __fmul_rn(k.one_b1, g));
        const float vi =
            __fadd_rn(__fmul_rn(k.b2, v[i]), __fmul_rn(__fmul_rn(k.one_b2, g), g));
        m[i] = mi;
        v[i] = vi;
        /* p = p * decay;  p - step_size * m / (sqrtf(v) / bc2_sqrt + eps) */
        const float p = __fmul_rn(param[i], k.decay);
        const float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
        param[i] = __fsub_rn(p, __fdiv_rn(__fmul_rn(k.step_size, mi), den));
    }
}

extern "C" int ctcu_adamw(ct_backend *b, float *param, const float *grad, float *m, float *v,
                          int64_t n, int64_t step, float lr, float beta1, float beta2, float eps,
                          float weight_decay)
{
    if (n <= 0) return 0;
    if (step < 1)
        return ctcu_fail(CT_EINVAL, "ctcu_adamw: step must be >= 1 (1-based), got %lld",
                         (long long)step);
    /* ct_adamw_step's constants, operation for operation. */
    const double b1 = beta1, b2 = beta2;
    const double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
    adamw_consts k;
    /* lr * weight_decay rounded on its own (volatile: no host compiler may fuse it into the
     * subtraction; the CPU's ISO C build does not either). */
    volatile double lr_wd = (double)lr * weight_decay;
    k.decay = (float)(1.0 - lr_wd);
    k.b1 = beta1;
    k.one_b1 = (float)(1.0 - b1);
    k.b2 = beta2;
    k.one_b2 = (float)(1.0 - b2);
    k.step_size = (float)(lr / bc1);
    k.bc2_sqrt = (float)sqrt(bc2);
    k.eps = eps;
    unsigned nb = ctcu_blocks(n, OPT_THREADS);
    if (nb > OPT_MAX_BLOCKS) nb = OPT_MAX_BLOCKS;
    k_adamw<<<nb, OPT_THREADS, 0, ctcu_stream(b)>>>(param, grad, m, v, n, k);
    CTCU_LAUNCH_CHECK("ctcu_adamw");
    return 0;
}

/* ---- sum of squares ----------------------------------------------------------------------- */

/* part[blk] = (a0 + a1) + (a2 + a3) for each block of NORM_BLOCK values; thread 4 blk + k is
 * accumulator k. Loops run per warp (the bound is warp-uniform) so the shuffles see all lanes. */
__global__ void __launch_bounds__(SUMSQ_THREADS)
    k_sumsq_blocks(double *part, const float *g, int64_t n, int64_t nblocks)
{
    const int lane = threadIdx.x & 31;
    const int64_t warps_per_grid = (int64_t)gridDim.x * (blockDim.x / 32);
    const int64_t warp0 = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int64_t total = nblocks * 4;
    for (int64_t wbase = warp0 * 32; wbase < total; wbase += warps_per_grid * 32) {
        const int64_t tid = wbase + lane;
        double acc = 0.0;
        if (tid < total) {
            const int64_t blk = tid >> 2;
            const int k = (int)(tid & 3);
            const int64_t s = blk * NORM_BLOCK;
            const int64_t e = s + NORM_BLOCK < n ? s + NORM_BLOCK : n;
            const int64_t nq = (e - s) / 4;
            const float *p = g + s + k;
#pragma unroll 8
            for (int64_t q = 0; q < nq; q++) {
                const double x = (double)p[4 * q];
                acc = __dadd_rn(acc, __dmul_rn(x, x));
            }
            if (k == 0)
                for (int64_t i = s + 4 * nq; i < e; i++) {
                    const double x = (double)g[i];
                    acc = __dadd_rn(acc, __dmul_rn(x, x));
                }
        }
        /* (a0 + a1) at k = 0 and (a2 + a3) at k = 2, then their sum at k = 0 */
        double t1 = __dadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 1, 4));
        double t2 = __dadd_rn(t1, __shfl_down_sync(0xffffffffu, t1, 2, 4));
        if (tid < total && (tid & 3) == 0) part[tid >> 2] = t2;
    }
}

/* *out = sum of part[0 .. nblocks) in order, from 0: staged through shared memory, added by
 * thread 0. */
__global__ void __launch_bounds__(FINAL_THREADS)
    k_sumsq_final(double *out, const double *part, int64_t nblocks)
{
    __shared__ double buf[FINAL_THREADS];
    double s = 0.0;
    for (int64_t c0 = 0; c0 < nblocks; c0 += FINAL_THREADS) {
        const int64_t i = c0 + threadIdx.x;
        buf[threadIdx.x] = i < nblocks ? part[i] : 0.0;
        __syncthreads();
        if (threadIdx.x == 0) {
            const int64_t m = nblocks - c0 < FINAL_THREADS ? nblocks - c0 : FINAL_THREADS;
            for (int64_t u = 0; u < m; u++)
                s = __dadd_rn(s, buf[u]);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = s;
}

extern "C" int ctcu_sumsq(ct_backend *b, double *out, const float *g, int64_t n)
{
    cudaStream_t st = ctcu_stream(b);
    if (n <= 0) return ctcu_check(cudaMemsetAsync(out, 0, sizeof(double), st), "ctcu_sumsq");
    const int64_t nblocks = (n + NORM_BLOCK - 1) / NORM_BLOCK;
    void *scratch = NULL;
    int rc = ctcu_scratch(b, (size_t)nblocks * sizeof(double), &scratch);
    if (rc) return rc;
    double *part = (double *)scratch;
    int64_t gb = (nblocks * 4 + SUMSQ_THREADS - 1) / SUMSQ_THREADS;
    if (gb > SUMSQ_MAX_BLOCKS) gb = SUMSQ_MAX_BLOCKS;
    k_sumsq_blocks<<<(unsigned)gb, SUMSQ_THREADS, 0, st>>>(part, g, n, nblocks);
    rc = ctcu_launched("ctcu_sumsq (blocks)");
    if (!rc) {
        k_sumsq_final<<<1, FINAL_THREADS, 0, st>>>(out, part, nblocks);
        rc = ctcu_launched("ctcu_sumsq (block sums)");
    }
    ctcu_scratch_free(b, scratch);
    return rc;
}
