/*
 * The emulated CUDA device (tests only): a host stand-in for the part of the CUDA runtime and
 * of the CUDA C++ language that the .cu files of src/cuda use, so that they compile with the host
 * C++ compiler into libctorch_cuda_emu.so and run on the CPU (docs/cuda.md, "Emulated device").
 *
 * The .cu files reach this header through `#include <cuda_runtime.h>` (tests/cuda_emu is on
 * the include path before any CUDA installation); tests/cuda_emu/emu_gen.cmake rewrites the
 * three constructs plain C++ cannot express:
 *   k<<<grid, block, smem, stream>>>(args)  ->  emu_kernel(k)[emu_cfg(grid, block, smem, stream)](args)
 *   __shared__ T name[...];                  ->  static T name[...]; emu_shared(name, sizeof name);
 *   extern __shared__ T name[];              ->  T *name = (T *)emu_dyn_shared();
 *
 * Execution model (tests/cuda_emu/emu_runtime.cpp): a launch runs its blocks one after
 * another; the threads of a block are fibers (one stack each) run in thread order, each until
 * it reaches a barrier (__syncthreads, __syncwarp, a shuffle) or returns. A block barrier
 * releases when every thread of the block waits at it; a warp barrier when all 32 lanes wait at
 * the same kind of warp operation. Anything else (a barrier some threads never reach, lanes of
 * a warp in different warp operations or exited, a shuffle with a partial mask) is a bug of
 * the kernel: the emulator prints a message naming the kernel, block and threads, and aborts.
 * Shared memory (static and dynamic) is filled with a NaN pattern (0xFFF8DEAD words) at the
 * start of every block, device memory at allocation and again at free; launches are checked
 * against the documented limits (threads per block, grid sizes, shared memory with its opt-in);
 * memory copies and top-level pointer arguments of kernels must lie in device allocations.
 * Streams are synchronous: every operation has finished when its call returns.
 */
#ifndef CT_CUDA_EMU_RUNTIME_H
#define CT_CUDA_EMU_RUNTIME_H

#ifndef __cplusplus
#error "the emulated CUDA runtime is C++"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#define CUDART_VERSION 13000
#define CT_CUDA_EMULATED 1

/* ---- the language ---------------------------------------------------------------------- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
/* Left over by the generator: a compile error that names it. */
#define __shared__ __shared___was_not_rewritten_by_emu_gen

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 {
    unsigned x, y, z;
};

/* Set by the scheduler before it resumes a thread (one host thread runs launches at a time). */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

void emu_syncthreads();
void emu_syncwarp(unsigned mask);
/* The shuffle exchange: lane publishes `bytes` of v, waits for its warp, reads lane src's. */
void emu_shfl(void *out, const void *v, size_t bytes, unsigned mask, int src_lane, int width, int kind);
void *emu_dyn_shared();
void emu_shared(void *p, size_t bytes);

inline void __syncthreads() { emu_syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu_syncwarp(mask); }

enum { EMU_SHFL_IDX = 1, EMU_SHFL_DOWN, EMU_SHFL_UP, EMU_SHFL_XOR };

template <typename T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of <= 8 bytes");
    T r;
    emu_shfl(&r, &v, sizeof(T), mask, src, width, EMU_SHFL_IDX);
    return r;
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of <= 8 bytes");
    T r;
    emu_shfl(&r, &v, sizeof(T), mask, (int)delta, width, EMU_SHFL_DOWN);
    return r;
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of <= 8 bytes");
    T r;
    emu_shfl(&r, &v, sizeof(T), mask, (int)delta, width, EMU_SHFL_UP);
    return r;
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of <= 8 bytes");
    T r;
    emu_shfl(&r, &v, sizeof(T), mask, lane_mask, width, EMU_SHFL_XOR);
    return r;
}

/* ---- intrinsics: IEEE operations, round to nearest (the host build uses -ffp-contract=off) */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __double2float_rn(double a) { return (float)a; }
/* The fast approximations are exact here (a GPU's differ in the last bits). */
inline float __expf(float a) { return expf(a); }
inline float __logf(float a) { return logf(a); }
inline float __fdividef(float a, float b) { return a / b; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
inline double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }

/* ---- the runtime API ------------------------------------------------------------------- */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorLaunchFailure = 719,
} cudaError_t;

typedef struct emu_stream *cudaStream_t;
typedef struct emu_pool *cudaMemPool_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
    cudaDevAttrMemoryPoolsSupported = 115,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3,
};
enum cudaMemAllocationType { cudaMemAllocationTypeInvalid = 0, cudaMemAllocationTypePinned = 1 };
enum cudaMemAllocationHandleType { cudaMemHandleTypeNone = 0 };
enum cudaMemLocationType { cudaMemLocationTypeInvalid = 0, cudaMemLocationTypeDevice = 1 };
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01

struct cudaMemLocation {
    enum cudaMemLocationType type;
    int id;
};
struct cudaMemPoolProps {
    enum cudaMemAllocationType allocType;
    enum cudaMemAllocationHandleType handleTypes;
    struct cudaMemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned char reserved[64];
};
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    int major, minor;
    int multiProcessorCount;
    int maxThreadsPerBlock;
    int warpSize;
};

const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemPoolCreate(cudaMemPool_t *p, const struct cudaMemPoolProps *props);
cudaError_t cudaMemPoolDestroy(cudaMemPool_t p);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t p, enum cudaMemPoolAttr a, void *v);
cudaError_t cudaMallocFromPoolAsync(void **p, size_t bytes, cudaMemPool_t pool, cudaStream_t s);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k);
cudaError_t cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaMemset(void *dst, int v, size_t bytes);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);

/* ---- launches -------------------------------------------------------------------------- */
struct emu_cfg_t {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};
inline emu_cfg_t emu_cfg(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = 0)
{
    return emu_cfg_t{grid, block, smem, stream};
}

/* Run a launch: checks the configuration (a launch error is kept for cudaGetLastError, and
 * nothing runs), then every block, each thread calling body(ctx). `kernel` identifies the
 * kernel (its address: the shared-memory opt-in, messages); `name` is its source text. */
void emu_launch(const emu_cfg_t &c, const void *kernel, const char *name, void (*body)(void *), void *ctx);
/* Whether p (a kernel's pointer argument) lies in a device allocation (or is NULL). */
bool emu_device_pointer_ok(const void *p);
void emu_bad_argument(const char *name, int index, const void *p);
cudaError_t emu_set_max_dyn_smem(const void *kernel, int bytes);

template <typename Arg> inline void emu_check_arg(const char *name, int index, const Arg &a)
{
    if constexpr (std::is_pointer<Arg>::value) {
        if (!emu_device_pointer_ok((const void *)a)) emu_bad_argument(name, index, (const void *)a);
    }
}

template <typename... P> struct emu_bound {
    void (*k)(P...);
    const char *name;
    emu_cfg_t c;
    template <typename... A> void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "kernel argument count");
        /* the arguments converted to the kernel's parameter types once, as a launch copies
         * them; each thread then gets its own copy (its by-value parameters) */
        std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
        int i = 0;
        std::apply([&](const auto &...x) { (emu_check_arg(name, i++, x), ...); }, args);
        struct Ctx {
            void (*k)(P...);
            std::tuple<typename std::decay<P>::type...> *args;
        } ctx = {k, &args};
        emu_launch(c, (const void *)k, name,
                   [](void *p) {
                       Ctx *cx = (Ctx *)p;
                       std::apply(cx->k, *cx->args);
                   },
                   &ctx);
    }
};
template <typename... P> struct emu_kernel_t {
    void (*k)(P...);
    const char *name;
    emu_bound<P...> operator[](const emu_cfg_t &c) const { return emu_bound<P...>{k, name, c}; }
};
template <typename... P> inline emu_kernel_t<P...> emu_kernel_named(void (*k)(P...), const char *name)
{
    return emu_kernel_t<P...>{k, name};
}
#define emu_kernel(...) emu_kernel_named(__VA_ARGS__, #__VA_ARGS__)

template <typename K> inline cudaError_t cudaFuncSetAttribute(K kernel, enum cudaFuncAttribute a, int v)
{
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
    return emu_set_max_dyn_smem((const void *)kernel, v);
}

/* ---- run-time compiled modules (tests/cuda_emu/emu_rtc.cpp) ----------------------------------
 * The emulated device's stand-in for NVRTC + the library API, used by cuda_flex_jit.cu under
 * CT_CUDA_EMULATED: emu_rtc_compile compiles a module's text (a compiled-mods module for the
 * emulated device: src/cuda/cuda_flex_jit.h) with the host C++ compiler found at configure time
 * into a shared object linked against this library (the emulator's symbols resolve to the
 * running one); the image is that object's bytes. cudaLibraryLoadData writes it to an
 * anonymous file (memfd) and dlopens it; cudaLibraryGetKernel finds the entry point and its
 * launcher "<name>__launch", which cudaLaunchKernel calls with the launch's configuration and
 * argument array (the emulator's launch machinery then runs it like any kernel).
 * cudaFuncSetAttribute on a kernel handle sets the entry point's shared-memory opt-in. */
typedef struct emu_library *cudaLibrary_t;
typedef struct emu_kernel_handle *cudaKernel_t;
enum cudaJitOption { cudaJitMaxRegisters = 0 };
enum cudaLibraryOption { cudaLibraryHostUniversalFunctionAndDataTable = 0 };

/* 0, or -1 with the reason (the compiler's first output lines) in msg. *image malloc()ed. */
int emu_rtc_compile(const char *text, void **image, size_t *len, char *msg, size_t cap);
/* The compiler emu_rtc_compile runs (for messages and identities). */
const char *emu_rtc_compiler(void);
/* Why the thread's last cudaLibraryLoadData failed (the loader's message). */
const char *emu_rtc_last_error(void);
cudaError_t cudaLibraryLoadData(cudaLibrary_t *lib, const void *code, enum cudaJitOption *jo, void **jv,
                                unsigned njo, enum cudaLibraryOption *lo, void **lv, unsigned nlo);
cudaError_t cudaLibraryGetKernel(cudaKernel_t *k, cudaLibrary_t lib, const char *name);
cudaError_t cudaLibraryUnload(cudaLibrary_t lib);
/* func: a cudaKernel_t of cudaLibraryGetKernel (the only kind launched this way here). */
cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t smem,
                             cudaStream_t stream);
/* The key of a kernel for its shared-memory opt-in: a module's entry point for its handle. */
const void *emu_rtc_kernel_key(const void *kernel);

#endif
