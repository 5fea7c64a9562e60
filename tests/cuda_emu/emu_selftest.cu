/*
 * Self-test of the emulated CUDA device (ctest test_cuda_emu_selftest): CUDA source that goes
 * through tests/cuda_emu/emu_gen.cmake like the .cu files of src/cuda (a launch over several lines, a
 * template kernel, static and dynamic shared memory), then
 *   - correct kernels whose results are known: shuffles (idx, down, up, xor, widths 32 / 16 /
 *     4), block reductions through shared memory, 2-D blocks and grids, dynamic shared memory;
 *   - kernels with a bug the emulator must stop with its message (each in a child process):
 *     a barrier inside a branch, divergent warp operations, a lane that exited before a
 *     shuffle, a partial mask, too much static shared memory, a host pointer argument;
 *   - refused launches reported by cudaGetLastError (block of 1025 threads, 64 KiB dynamic
 *     shared memory without the opt-in), copies whose ranges do not match their kind,
 *     uninitialised shared memory reading as NaN.
 */
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;
#define EXPECT(cond)                                                                                 \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond);                       \
            failures++;                                                                              \
        }                                                                                            \
    } while (0)

/* ---- correct kernels ---------------------------------------------------------------------- */

__global__ void k_shuffles(int *out)
{
    int lane = threadIdx.x & 31, t = threadIdx.x;
    int v = 100 * t;
    out[t * 6 + 0] = __shfl_sync(0xffffffffu, v, 3);             /* lane 3 of the warp */
    out[t * 6 + 1] = __shfl_down_sync(0xffffffffu, v, 5);        /* lane + 5, or own */
    out[t * 6 + 2] = __shfl_up_sync(0xffffffffu, v, 2);          /* lane - 2, or own */
    out[t * 6 + 3] = __shfl_xor_sync(0xffffffffu, v, 9);         /* lane ^ 9 */
    out[t * 6 + 4] = __shfl_down_sync(0xffffffffu, v, 8, 16);    /* within 16-lane halves */
    out[t * 6 + 5] = __shfl_sync(0xffffffffu, v, lane + 1, 4);   /* within groups of 4 */
}

template <typename T> __global__ void k_block_sum(T *out, const T *in, int n)
{
    __shared__ T part[256];
    T s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += in[blockIdx.x * n + i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}

__global__ void k_dims(int *out)
{
    int bx = blockIdx.x + gridDim.x * blockIdx.y, tx = threadIdx.x + blockDim.x * threadIdx.y;
    out[bx * (blockDim.x * blockDim.y) + tx] = 1000 * bx + tx;
}

__global__ void k_dyn(float *out)
{
    extern __shared__ float dyn[];
    dyn[blockDim.x - 1 - threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = dyn[threadIdx.x];
}

__global__ void k_read_uninit(float *out)
{
    __shared__ float never_written[64];
    out[threadIdx.x] = never_written[threadIdx.x];
}

/* ---- kernels with bugs -------------------------------------------------------------------- */

__global__ void k_branch_barrier(int *out)
{
    if (threadIdx.x < 16) __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void k_divergent_warp(int *out)
{
    int v = threadIdx.x;
    if (threadIdx.x & 1) v = __shfl_xor_sync(0xffffffffu, v, 1);
    else __syncwarp();
    out[threadIdx.x] = v;
}

__global__ void k_exited_lane(int *out)
{
    if (threadIdx.x == 7) return;
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void k_partial_mask(int *out)
{
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, (int)threadIdx.x, 0);
}

__global__ void k_big_static(float *out)
{
    __shared__ float a[8192];
    __shared__ float b[8192];
    a[threadIdx.x] = 1.0f;
    b[threadIdx.x] = 2.0f;
    out[threadIdx.x] = a[threadIdx.x] + b[threadIdx.x];
}

__global__ void k_noop(float *p)
{
    if (p && threadIdx.x == 0 && blockIdx.x == 1000000) p[0] = 0.0f;
}

/* ---- driver ------------------------------------------------------------------------------- */

/* Run f in a child: it must abort with `needle` on stderr. */
static void expect_abort(const char *what, void (*f)(int *), int *dev, const char *needle)
{
    int fds[2];
    if (pipe(fds) != 0) {
        failures++;
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        f(dev);
        _exit(0); /* not stopped: the parent reports it */
    }
    close(fds[1]);
    char buf[4096];
    size_t n = 0;
    ssize_t r;
    while (n + 1 < sizeof buf && (r = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
    buf[n] = 0;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    bool aborted = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
    bool named = strstr(buf, needle) != NULL;
    printf("%-34s %s%s\n", what, aborted && named ? "stopped: " : "NOT STOPPED as expected: ", buf);
    if (!aborted || !named) failures++;
}

static void run_branch_barrier(int *d) { k_branch_barrier<<<1, 64>>>(d); }
static void run_divergent_warp(int *d) { k_divergent_warp<<<1, 32>>>(d); }
static void run_exited_lane(int *d) { k_exited_lane<<<1, 32>>>(d); }
static void run_partial_mask(int *d) { k_partial_mask<<<1, 32>>>(d); }
static void run_big_static(int *d) { k_big_static<<<1, 32>>>((float *)d); }
static void run_host_pointer(int *d)
{
    (void)d;
    static float host[4];
    k_noop<<<1, 32>>>(host);
}

int main(void)
{
    int *d = NULL;
    EXPECT(cudaMalloc((void **)&d, 64 * 6 * sizeof(int)) == cudaSuccess);

    /* shuffles, two warps */
    k_shuffles<<<1, 64, 0,
                 0>>>(d);
    EXPECT(cudaGetLastError() == cudaSuccess);
    int h[64 * 6];
    EXPECT(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int t = 0; t < 64; t++) {
        int lane = t & 31, base = t & ~31;
        EXPECT(h[t * 6 + 0] == 100 * (base + 3));
        EXPECT(h[t * 6 + 1] == 100 * (lane + 5 < 32 ? t + 5 : t));
        EXPECT(h[t * 6 + 2] == 100 * (lane >= 2 ? t - 2 : t));
        EXPECT(h[t * 6 + 3] == 100 * (base + (lane ^ 9)));
        EXPECT(h[t * 6 + 4] == 100 * ((lane & 15) + 8 < 16 ? t + 8 : t));
        EXPECT(h[t * 6 + 5] == 100 * (base + (lane & ~3) + ((lane + 1) & 3)));
    }

    /* a template kernel with a shared-memory tree, three blocks */
    double *in = NULL, *out = NULL, hin[3 * 1000], hout[3];
    for (int i = 0; i < 3000; i++) hin[i] = (double)(i % 1000);
    EXPECT(cudaMalloc((void **)&in, sizeof hin) == cudaSuccess);
    EXPECT(cudaMalloc((void **)&out, sizeof hout) == cudaSuccess);
    EXPECT(cudaMemcpy(in, hin, sizeof hin, cudaMemcpyHostToDevice) == cudaSuccess);
    k_block_sum<double><<<3, 256>>>(out, in, 1000);
    EXPECT(cudaMemcpy(hout, out, sizeof hout, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int b = 0; b < 3; b++) EXPECT(hout[b] == 999.0 * 1000.0 / 2.0);

    /* 2-D grid and block */
    int *dd = NULL, hd[6 * 32];
    EXPECT(cudaMalloc((void **)&dd, sizeof hd) == cudaSuccess);
    k_dims<<<dim3(3, 2, 1), dim3(8, 4, 1)>>>(dd);
    EXPECT(cudaMemcpy(hd, dd, sizeof hd, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int b = 0; b < 6; b++)
        for (int t = 0; t < 32; t++) EXPECT(hd[b * 32 + t] == 1000 * b + t);

    /* dynamic shared memory, and the opt-in above 48 KiB */
    float *f = NULL, hf[128];
    EXPECT(cudaMalloc((void **)&f, sizeof hf) == cudaSuccess);
    k_dyn<<<1, 128, 128 * sizeof(float)>>>(f);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(cudaMemcpy(hf, f, sizeof hf, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int t = 0; t < 128; t++) EXPECT(hf[t] == (float)(127 - t));
    k_dyn<<<1, 128, 64 * 1024>>>(f);
    EXPECT(cudaGetLastError() == cudaErrorInvalidValue);
    EXPECT(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) == cudaSuccess);
    k_dyn<<<1, 128, 64 * 1024>>>(f);
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) != cudaSuccess);
    (void)cudaGetLastError();

    /* launch limits */
    k_dyn<<<1, 1025>>>(f);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration);
    k_dyn<<<dim3(1, 65536, 1), 32>>>(f);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration);
    EXPECT(cudaGetLastError() == cudaSuccess); /* read once */

    /* uninitialised shared memory reads as NaN */
    k_read_uninit<<<2, 64>>>(f);
    EXPECT(cudaMemcpy(hf, f, 64 * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int t = 0; t < 64; t++) EXPECT(isnan(hf[t]));

    /* copies whose ranges do not match their kind */
    EXPECT(cudaMemcpy(hf, f, sizeof hf, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    EXPECT(cudaMemcpy(f, f + 1, sizeof hf, cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue); /* past the end */
    EXPECT(cudaMemset(hf, 0, 4) == cudaErrorInvalidValue);
    (void)cudaGetLastError();

    /* bugs the emulator stops */
    expect_abort("__syncthreads in a branch", run_branch_barrier, d, "__syncthreads reached by 16 of 64");
    expect_abort("divergent warp operations", run_divergent_warp, d, "divergent warp");
    expect_abort("a lane exited before a shuffle", run_exited_lane, d, "exited");
    expect_abort("a partial shuffle mask", run_partial_mask, d, "mask 0x0000ffff");
    expect_abort("64 KiB of static shared memory", run_big_static, d, "bytes of static");
    expect_abort("a host pointer argument", run_host_pointer, d, "not in any device allocation");

    EXPECT(cudaFree(d) == cudaSuccess && cudaFree(in) == cudaSuccess && cudaFree(out) == cudaSuccess);
    EXPECT(cudaFree(dd) == cudaSuccess && cudaFree(f) == cudaSuccess);
    EXPECT(cudaFree(f) == cudaErrorInvalidValue); /* twice */
    printf("test_cuda_emu_selftest: %d failed\n", failures);
    return failures ? 1 : 0;
}
