/*
 * Embedding forward (gather) and backward slots of the CUDA backend (semantics:
 * src/device/backend.h; the CPU kernel: src/ops/embedding.c).
 *
 * Forward: out[n, :] = table[ids[n], :], a copy: the CPU's bits.
 *
 * Backward without atomics: dtable[v, :] must receive the rows dout[n, :] of the tokens with
 * ids[n] == v in token order, starting from its current value, as the CPU adds them. The
 * tokens are grouped by id with a sort of the 64-bit keys (id << 32 | n): the keys are all
 * distinct, so the sorted order is unique (whatever the sort's schedule) and within one id it
 * is token order. The sort is a bitonic network over the next power of two (padding keys
 * ~0 sort last): tiles of 2048 keys in shared memory, the longer distances in global passes.
 * Then each run of equal ids is summed by one block column-parallel (a thread per column,
 * adding that id's tokens in order into a register started from dtable[v, c]): the CPU's bits.
 * Scratch: 8 bytes per padded token. Limit: N < 2^32 tokens.
 */
#include "cuda/cuda_internal.cuh"

#include <stdint.h>

#define CTCU_LAUNCH_CHECK(what)                                                                    \
    do {                                                                                           \
        int rc_ = ctcu_launched(what);                                                             \
        if (rc_) return rc_;                                                                       \
    } while (0)

#define EMB_THREADS 256
#define EMB_MAX_BLOCKS (1 << 20)
#define SORT_TILE 2048       /* keys per shared-memory tile (a power of two) */
#define SORT_THREADS 1024    /* SORT_TILE / 2: one compare-exchange per thread per step */
#define ACC_THREADS 256      /* columns per accumulation block */
#define ACC_MAX_RUN_BLOCKS 8192
#define ACC_BATCH 8          /* tokens whose loads are in flight together */

typedef unsigned long long u64;

/* ---- forward ------------------------------------------------------------------------------ */

__global__ void k_embed_fwd(float *out, const int32_t *ids, const float *table, int64_t N,
                            int64_t D)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= D) return;
    for (int64_t n = blockIdx.y; n < N; n += gridDim.y)
        out[n * D + c] = table[(int64_t)ids[n] * D + c];
}

extern "C" int ctcu_embed_fwd(ct_backend *b, float *out, const int32_t *ids, const float *table,
                              int64_t N, int64_t V, int64_t D)
{
    (void)V;
    if (N <= 0 || D <= 0) return 0;
    unsigned gx = ctcu_blocks(D, EMB_THREADS);
    int64_t gy = N < 65535 ? N : 65535;
    int64_t cap = EMB_MAX_BLOCKS / (int64_t)gx;
    if (cap < 1) cap = 1;
    if (gy > cap) gy = cap;
    k_embed_fwd<<<dim3(gx, (unsigned)gy, 1), EMB_THREADS, 0, ctcu_stream(b)>>>(out, ids, table, N,
                                                                               D);
    CTCU_LAUNCH_CHECK("ctcu_embed_fwd");
    return 0;
}

/* ---- backward: the sort ------------------------------------------------------------------- */

__global__ void k_keys(u64 *keys, const int32_t *ids, int64_t N, int64_t P)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < P; i += stride)
        keys[i] = i < N ? ((u64)(uint32_t)ids[i] << 32) | (u64)i : ~0ull;
}

/* One compare-exchange of the bitonic network at distance j for sequences of length k: pair
 * (i, i + j) with i = 2t - t % j; ascending where (global index & k) == 0. */
__device__ __forceinline__ void cmpx(u64 *a, u64 gbase, u64 t, u64 j, u64 k)
{
    const u64 i = 2 * t - (t & (j - 1));
    const u64 x = a[i], y = a[i + j];
    const bool asc = ((gbase + i) & k) == 0;
    if ((x > y) == asc) {
        a[i] = y;
        a[i + j] = x;
    }
}

/* Sort each tile of len keys (len = min(P, SORT_TILE)) with the full network for k <= len. */
__global__ void __launch_bounds__(SORT_THREADS) k_sort_tile(u64 *keys, int64_t len)
{
    __shared__ u64 s[SORT_TILE];
    const u64 base = (u64)blockIdx.x * (u64)len;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
        s[i] = keys[base + i];
    __syncthreads();
    for (u64 k = 2; k <= (u64)len; k <<= 1)
        for (u64 j = k >> 1; j > 0; j >>= 1) {
            if (threadIdx.x < (unsigned)(len / 2)) cmpx(s, base, threadIdx.x, j, k);
            __syncthreads();
        }
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
        keys[base + i] = s[i];
}

/* The steps j = len / 2 .. 1 of merge size k on each tile (k > len). */
__global__ void __launch_bounds__(SORT_THREADS) k_merge_tile(u64 *keys, int64_t len, u64 k)
{
    __shared__ u64 s[SORT_TILE];
    const u64 base = (u64)blockIdx.x * (u64)len;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
        s[i] = keys[base + i];
    __syncthreads();
    for (u64 j = (u64)len >> 1; j > 0; j >>= 1) {
        if (threadIdx.x < (unsigned)(len / 2)) cmpx(s, base, threadIdx.x, j, k);
        __syncthreads();
    }
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
        keys[base + i] = s[i];
}

/* One global step (distance j >= len) of merge size k over all P / 2 pairs. */
__global__ void k_merge_step(u64 *keys, int64_t P, u64 j, u64 k)
{
    const int64_t pairs = P / 2, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < pairs; t += stride)
        cmpx(keys, 0, (u64)t, j, k);
}

/* ---- backward: the sums ------------------------------------------------------------------- */

/* Block (x: runs, y: column blocks): for each sorted position s that starts a run of one id v
 * (s == 0 or a different id before it), thread c adds dout[n, c] for the run's tokens n in
 * order to dtable[v, c]. */
__global__ void __launch_bounds__(ACC_THREADS)
    k_embed_acc(float *dtable, const float *dout, const u64 *keys, int64_t N, int64_t D)
{
    for (int64_t s = blockIdx.x; s < N; s += gridDim.x) {
        const u64 key = keys[s];
        const u64 id = key >> 32;
        if (s > 0 && (keys[s - 1] >> 32) == id) continue; /* not the start of a run */
        for (int64_t c = (int64_t)blockIdx.y * ACC_THREADS + threadIdx.x; c < D;
             c += (int64_t)gridDim.y * ACC_THREADS) {
            float *dst = dtable + (int64_t)id * D + c;
            float acc = *dst;
            int64_t e = s;
            for (;;) {
                float v[ACC_BATCH];
                int m = 0; /* tokens of this run in the batch (a prefix: the run is contiguous) */
#pragma unroll
                for (int u = 0; u < ACC_BATCH; u++) {
                    const int64_t q = e + u;
                    v[u] = 0.0f;
                    if (q < N) {
                        const u64 kq = keys[q];
                        if ((kq >> 32) == id) {
                            v[u] = dout[(int64_t)(kq & 0xffffffffull) * D + c];
                            m = u + 1;
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < ACC_BATCH; u++)
                    if (u < m) acc = __fadd_rn(acc, v[u]);
                if (m < ACC_BATCH) break;
                e += ACC_BATCH;
            }
            *dst = acc;
        }
    }
}

extern "C" int ctcu_embed_bwd(ct_backend *b, float *dtable, const float *dout, const int32_t *ids,
                              int64_t N, int64_t V, int64_t D)
{
    (void)V;
    if (N <= 0 || D <= 0) return 0;
    if (N > (int64_t)0xffffffffll)
        return ctcu_fail(CT_EOVERFLOW,
                         "ctcu_embed_bwd: N = %lld tokens; this kernel sorts at most 2^32 - 1",
                         (long long)N);
    int64_t P = 2;
    while (P < N) P <<= 1;
    const int64_t len = P < SORT_TILE ? P : SORT_TILE;
    cudaStream_t st = ctcu_stream(b);
    void *scratch = NULL;
    int rc = ctcu_scratch(b, (size_t)P * sizeof(u64), &scratch);
    if (rc) return rc;
    u64 *keys = (u64 *)scratch;

    unsigned kb = ctcu_blocks(P, EMB_THREADS);
    if (kb > EMB_MAX_BLOCKS) kb = EMB_MAX_BLOCKS;
    k_keys<<<kb, EMB_THREADS, 0, st>>>(keys, ids, N, P);
    rc = ctcu_launched("ctcu_embed_bwd (keys)");
    const unsigned tiles = (unsigned)(P / len);
    if (!rc) {
        k_sort_tile<<<tiles, SORT_THREADS, 0, st>>>(keys, len);
        rc = ctcu_launched("ctcu_embed_bwd (tile sort)");
    }
    unsigned sb = ctcu_blocks(P / 2, EMB_THREADS);
    if (sb > EMB_MAX_BLOCKS) sb = EMB_MAX_BLOCKS;
    for (u64 k = 2 * (u64)len; !rc && k <= (u64)P; k <<= 1) {
        for (u64 j = k >> 1; !rc && j >= (u64)len; j >>= 1) {
            k_merge_step<<<sb, EMB_THREADS, 0, st>>>(keys, P, j, k);
            rc = ctcu_launched("ctcu_embed_bwd (merge step)");
        }
        if (!rc) {
            k_merge_tile<<<tiles, SORT_THREADS, 0, st>>>(keys, len, k);
            rc = ctcu_launched("ctcu_embed_bwd (tile merge)");
        }
    }
    if (!rc) {
        int64_t gx = N < ACC_MAX_RUN_BLOCKS ? N : ACC_MAX_RUN_BLOCKS;
        int64_t gy = (D + ACC_THREADS - 1) / ACC_THREADS;
        if (gy > 65535) gy = 65535;
        k_embed_acc<<<dim3((unsigned)gx, (unsigned)gy, 1), ACC_THREADS, 0, st>>>(dtable, dout,
                                                                                 keys, N, D);
        rc = ctcu_launched("ctcu_embed_bwd (sums)");
    }
    ctcu_scratch_free(b, scratch);
    return rc;
}
