/*
 * libctorch_cuda.so: the entry point, the backend table, the device context and its memory.
 *
 * libctorch dlopen()s this library and calls ct_backend_cuda_entry (the only exported symbol)
 * for the table of device/backend.h. One ct_backend per opened GPU holds:
 *   - the CUDA device index, its SM count and compute capability;
 *   - one non-blocking stream on which every slot queues its work;
 *   - its own stream-ordered memory pool (cudaMemPoolCreate) whose release threshold is
 *     UINT64_MAX, so memory freed during a training step stays in the pool and the steps after
 *     the first never call the driver to allocate;
 *   - the GEMM state (cuBLASLt handle, fixed workspace, algorithm cache), made on the first
 *     GEMM by cuda_gemm.cu.
 * Errors become a ct_status and a thread-local message (ctcu_fail / ctcu_check); nothing
 * here prints, exits or aborts. cudart is linked statically: the machine needs only the
 * NVIDIA driver (libcuda.so.1), which cudart loads itself.
 */
#include "cuda/cuda_internal.cuh"

#include <cuda_runtime.h>
#include <mutex>
#include <new>
#include <stdarg.h>
#include <unordered_map>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors --------------------------------------------------------------------------------- */

static thread_local char ctcu_message[1024];

int ctcu_fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctcu_message, sizeof ctcu_message, fmt, ap);
    va_end(ap);
    return status;
}

int ctcu_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    int status = e == cudaErrorMemoryAllocation ? CT_ENOMEM : CT_EINTERNAL;
    return ctcu_fail(status, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

int ctcu_launched(const char *what)
{
    return ctcu_check(cudaGetLastError(), what);
}

const char *ctcu_last_error(void)
{
    return ctcu_message;
}

/* ---- the context ---------------------------------------------------------------------------- */

struct ct_backend {
    int device;             /* CUDA device index */
    int sm_count;           /* multiprocessors */
    int cc;                 /* compute capability, major * 10 + minor */
    size_t total_bytes;     /* device memory */
    cudaStream_t stream;    /* the one stream every slot queues on */
    cudaMemPool_t pool;     /* this backend's stream-ordered pool */
    struct ctcu_gemm_state *gemm; /* cuda_gemm.cu's, NULL until the first GEMM */
    ct_backend_host host;         /* the device's accounting (host.account NULL: none) */
    std::mutex *scratch_mu;       /* guards scratch_sizes */
    std::unordered_map<void *, size_t> *scratch_sizes; /* live scratch, for the accounting */
};

cudaStream_t ctcu_stream(ct_backend *b)
{
    return b->stream;
}

int ctcu_device(ct_backend *b)
{
    return b->device;
}

int ctcu_sm_count(ct_backend *b)
{
    return b->sm_count;
}

struct ctcu_gemm_state **ctcu_gemm_state_of(ct_backend *b)
{
    return &b->gemm;
}

int ctcu_use_device(ct_backend *b)
{
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == b->device) return 0;
    return ctcu_check(cudaSetDevice(b->device), "cudaSetDevice");
}

/* Pool allocation of `bytes` (> 0) on the stream; 256-byte aligned (checked). */
static int pool_alloc(ct_backend *b, size_t bytes, void **out, const char *what)
{
    *out = NULL;
    if (bytes > b->total_bytes)
        return ctcu_fail(CT_ENOMEM, "%s of %zu bytes on cuda:%d: more than the device's %zu bytes", what, bytes,
                         b->device, b->total_bytes);
    void *p = NULL;
    cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, b->pool, b->stream);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* not sticky: clear it so later launches do not see it */
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        (void)cudaGetLastError();
        return ctcu_fail(CT_ENOMEM, "%s of %zu bytes on cuda:%d: out of device memory (%zu of %zu bytes free)",
                         what, bytes, b->device, free_b, total_b);
    }
    if (e != cudaSuccess) return ctcu_check(e, what);
    if (((uintptr_t)p & 255u) != 0) {
        (void)cudaFreeAsync(p, b->stream);
        return ctcu_fail(CT_EINTERNAL, "%s: the pool returned %p, not 256-byte aligned", what, p);
    }
    *out = p;
    return 0;
}

/* Scratch is counted with the device's buffers (ct_backend_host): refused past the device's
 * limit, and its size kept until it is freed. */
int ctcu_scratch(ct_backend *b, size_t bytes, void **out)
{
    *out = NULL;
    if (bytes == 0) return 0;
    if (b->host.account && b->host.account(b->host.ctx, (int64_t)bytes) != 0)
        return ctcu_fail(CT_ENOMEM, "scratch of %zu bytes on cuda:%d would pass the device's memory limit",
                         bytes, b->device);
    int rc = pool_alloc(b, bytes, out, "scratch");
    if (rc == 0 && b->host.account) {
        try {
            std::lock_guard<std::mutex> g(*b->scratch_mu);
            (*b->scratch_sizes)[*out] = bytes;
        } catch (...) {
            (void)cudaFreeAsync(*out, b->stream);
            *out = NULL;
            rc = ctcu_fail(CT_ENOMEM, "scratch: out of host memory for its bookkeeping");
        }
    }
    if (rc != 0 && b->host.account) b->host.account(b->host.ctx, -(int64_t)bytes);
    return rc;
}

void ctcu_scratch_free(ct_backend *b, void *p)
{
    if (!p) return;
    (void)cudaFreeAsync(p, b->stream);
    if (!b->host.account) return;
    size_t bytes = 0;
    {
        std::lock_guard<std::mutex> g(*b->scratch_mu);
        auto it = b->scratch_sizes->find(p);
        if (it == b->scratch_sizes->end()) return;
        bytes = it->second;
        b->scratch_sizes->erase(it);
    }
    b->host.account(b->host.ctx, -(int64_t)bytes);
}

/* ---- device slots ----------------------------------------------------------------------------- */

/* "13.0" from 13000. */
static void version_text(int v, char *buf, size_t n)
{
    snprintf(buf, n, "%d.%d", v / 1000, (v % 1000) / 10);
}

/* Why no CUDA device can be used, for count / open (e is cudaGetDeviceCount's error). */
static int no_device(cudaError_t e)
{
    int drv = 0;
    (void)cudaDriverGetVersion(&drv);
    (void)cudaGetLastError();
    char have[16], built[16];
    version_text(drv, have, sizeof have);
    version_text(CUDART_VERSION, built, sizeof built);
    if (e == cudaErrorNoDevice)
        return ctcu_fail(CT_EUNSUPPORTED, "no CUDA GPU is present (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
    if (e == cudaErrorInsufficientDriver) {
        if (drv == 0)
            return ctcu_fail(CT_EUNSUPPORTED, "no NVIDIA driver is installed (libcuda.so.1 could not be loaded); "
                             "this library was built with CUDA %s", built);
        return ctcu_fail(CT_EUNSUPPORTED, "the NVIDIA driver supports CUDA %s, this library was built with CUDA %s: "
                         "update the driver", have, built);
    }
    return ctcu_fail(CT_EUNSUPPORTED, "no usable CUDA GPU: cudaGetDeviceCount: %s: %s", cudaGetErrorName(e),
                     cudaGetErrorString(e));
}

static int cuda_count(int *n)
{
    *n = 0;
    int c = 0;
    cudaError_t e = cudaGetDeviceCount(&c);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return no_device(e);
    }
    if (c <= 0) return no_device(cudaErrorNoDevice);
    *n = c;
    return 0;
}

static int attr(int *v, cudaDeviceAttr a, int dev, const char *what)
{
    return ctcu_check(cudaDeviceGetAttribute(v, a, dev), what);
}

static void cuda_close(ct_backend *b);

static int cuda_open(int index, const ct_backend_host *host, ct_backend **out)
{
    *out = NULL;
    int n = 0, rc = cuda_count(&n);
    if (rc) return rc;
    if (index < 0 || index >= n)
        return ctcu_fail(CT_EINVAL, "cuda:%d: no such device (%d CUDA device%s: cuda:0..cuda:%d)", index, n,
                         n == 1 ? "" : "s", n - 1);
    /* The driver must speak the CUDA major version this library was built with; within a major
     * version the runtime works on any driver of that version (CUDA minor version
     * compatibility: the library carries SASS for sm_80 and sm_90a, no PTX JIT needed there). */
    int drv = 0;
    if ((rc = ctcu_check(cudaDriverGetVersion(&drv), "cudaDriverGetVersion"))) return rc;
    if (drv / 1000 < CUDART_VERSION / 1000) {
        char have[16], built[16];
        version_text(drv, have, sizeof have);
        version_text(CUDART_VERSION, built, sizeof built);
        return ctcu_fail(CT_EUNSUPPORTED, "cuda:%d: the NVIDIA driver supports CUDA %s, this library was built with "
                         "CUDA %s: update the driver", index, have, built);
    }
    int major = 0, minor = 0, sms = 0, pools = 0;
    if ((rc = attr(&major, cudaDevAttrComputeCapabilityMajor, index, "compute capability"))) return rc;
    if ((rc = attr(&minor, cudaDevAttrComputeCapabilityMinor, index, "compute capability"))) return rc;
    if ((rc = attr(&sms, cudaDevAttrMultiProcessorCount, index, "multiprocessor count"))) return rc;
    if ((rc = attr(&pools, cudaDevAttrMemoryPoolsSupported, index, "memory pools supported"))) return rc;
    if (major < 8) {
        char name[256] = "?";
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) snprintf(name, sizeof name, "%s", prop.name);
        (void)cudaGetLastError();
        return ctcu_fail(CT_EUNSUPPORTED, "cuda:%d (%s) has compute capability %d.%d; this library holds code for "
                         "compute capability 8.0 and newer (sm_80, sm_90a, compute_90)", index, name, major, minor);
    }
    if (!pools)
        return ctcu_fail(CT_EUNSUPPORTED, "cuda:%d: the device or driver has no stream-ordered memory pools "
                         "(cudaDevAttrMemoryPoolsSupported is 0)", index);

    ct_backend *b = (ct_backend *)calloc(1, sizeof *b);
    if (!b) return ctcu_fail(CT_ENOMEM, "cuda:%d: out of host memory for the backend context", index);
    b->device = index;
    b->sm_count = sms;
    b->cc = major * 10 + minor;
    if (host) b->host = *host;
    b->scratch_mu = new (std::nothrow) std::mutex();
    b->scratch_sizes = new (std::nothrow) std::unordered_map<void *, size_t>();
    if (!b->scratch_mu || !b->scratch_sizes) {
        rc = ctcu_fail(CT_ENOMEM, "cuda:%d: out of host memory for the backend context", index);
        goto fail;
    }
    if ((rc = ctcu_check(cudaSetDevice(index), "cudaSetDevice"))) goto fail;
    {
        size_t free_b = 0;
        if ((rc = ctcu_check(cudaMemGetInfo(&free_b, &b->total_bytes), "cudaMemGetInfo"))) goto fail;
    }
    if ((rc = ctcu_check(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags")))
        goto fail;
    {
        cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.handleTypes = cudaMemHandleTypeNone;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = index;
        if ((rc = ctcu_check(cudaMemPoolCreate(&b->pool, &props), "cudaMemPoolCreate"))) goto fail;
        uint64_t keep = UINT64_MAX;
        if ((rc = ctcu_check(cudaMemPoolSetAttribute(b->pool, cudaMemPoolAttrReleaseThreshold, &keep),
                             "cudaMemPoolSetAttribute(release threshold)")))
            goto fail;
    }
    *out = b;
    return 0;
fail:
    cuda_close(b);
    return rc;
}

static void cuda_close(ct_backend *b)
{
    if (!b) return;
    (void)cudaSetDevice(b->device);
    if (b->stream) (void)cudaStreamSynchronize(b->stream);
    ctcu_gemm_close(b); /* frees its workspace on the stream: before the pool goes */
    if (b->stream) (void)cudaStreamSynchronize(b->stream);
    if (b->pool) (void)cudaMemPoolDestroy(b->pool);
    if (b->stream) (void)cudaStreamDestroy(b->stream);
    (void)cudaGetLastError();
    delete b->scratch_sizes;
    delete b->scratch_mu;
    free(b);
}

static const char *cuda_last_error(void)
{
    return ctcu_message;
}

static int cuda_describe(ct_backend *b, ct_backend_info *info)
{
    memset(info, 0, sizeof *info);
    cudaDeviceProp prop;
    int rc = ctcu_check(cudaGetDeviceProperties(&prop, b->device), "cudaGetDeviceProperties");
    if (rc) return rc;
    size_t len = strnlen(prop.name, sizeof prop.name);
    if (len >= sizeof info->name) len = sizeof info->name - 1;
    memcpy(info->name, prop.name, len);
    info->name[len] = '\0';
    info->total_bytes = prop.totalGlobalMem;
    int drv = 0;
    if ((rc = ctcu_check(cudaDriverGetVersion(&drv), "cudaDriverGetVersion"))) return rc;
    info->driver_version = drv;
    info->runtime_version = CUDART_VERSION;
    info->compute_capability = b->cc;
    info->multiprocessors = b->sm_count;
    return 0;
}

static int cuda_alloc(ct_backend *b, size_t bytes, void **out)
{
    *out = NULL;
    if (bytes == 0) return ctcu_fail(CT_EINVAL, "alloc: 0 bytes");
    return pool_alloc(b, bytes, out, "alloc");
}

static void cuda_free(ct_backend *b, void *p)
{
    if (!p) return;
    if (ctcu_use_device(b)) return;
    (void)cudaFreeAsync(p, b->stream);
}

static int cuda_copy_h2d(ct_backend *b, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0) return 0;
    int rc = ctcu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, b->stream), "copy_h2d");
    if (rc) return rc;
    /* From pageable memory the copy has left src when cudaMemcpyAsync returns; from page-locked
     * memory it has not: wait, so that the caller may reuse src at once in both cases. */
    cudaPointerAttributes pa;
    if (cudaPointerGetAttributes(&pa, src) == cudaSuccess && pa.type == cudaMemoryTypeHost)
        return ctcu_check(cudaStreamSynchronize(b->stream), "copy_h2d (waiting for the copy)");
    (void)cudaGetLastError();
    return 0;
}

static int cuda_copy_d2h(ct_backend *b, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0) return 0;
    int rc = ctcu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, b->stream), "copy_d2h");
    if (rc) return rc;
    return ctcu_check(cudaStreamSynchronize(b->stream), "copy_d2h (waiting for the device)");
}

static int cuda_copy_d2d(ct_backend *b, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0) return 0;
    return ctcu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, b->stream), "copy_d2d");
}

static int cuda_memset0(ct_backend *b, void *dst, size_t bytes)
{
    if (bytes == 0) return 0;
    return ctcu_check(cudaMemsetAsync(dst, 0, bytes, b->stream), "memset0");
}

static int cuda_sync(ct_backend *b)
{
    return ctcu_check(cudaStreamSynchronize(b->stream), "sync");
}

/* ---- the table ---------------------------------------------------------------------------------- */

/* Every slot that takes the context runs with the backend's device current on the calling
 * thread (the runtime API's device is per thread; the caller may have changed it). */
template <auto F> struct on_device;
template <typename... A, int (*F)(ct_backend *, A...)> struct on_device<F> {
    static int call(ct_backend *b, A... a)
    {
        int rc = ctcu_use_device(b);
        if (rc) return rc;
        return F(b, a...);
    }
};
#define CTCU_SLOT(f) (&on_device<f>::call)

static const ct_backend_ops ct_cuda_ops = {
    CT_BACKEND_API_VERSION,
    "cuda",
    /* device */
    cuda_count,
    cuda_open,
    cuda_close,
    cuda_last_error,
    CTCU_SLOT(cuda_describe),
    CTCU_SLOT(cuda_alloc),
    cuda_free,
    CTCU_SLOT(cuda_copy_h2d),
    CTCU_SLOT(cuda_copy_d2h),
    CTCU_SLOT(cuda_copy_d2d),
    CTCU_SLOT(cuda_memset0),
    CTCU_SLOT(cuda_sync),
    /* linear algebra */
    CTCU_SLOT(ctcu_gemm),
    /* element-wise and rows */
    CTCU_SLOT(ctcu_add),
    CTCU_SLOT(ctcu_scale),
    CTCU_SLOT(ctcu_to_bf16),
    CTCU_SLOT(ctcu_bias_add_rows),
    CTCU_SLOT(ctcu_bias_grad_rows),
    /* normalisation, position, activation */
    CTCU_SLOT(ctcu_rmsnorm_fwd),
    CTCU_SLOT(ctcu_rmsnorm_bwd),
    CTCU_SLOT(ctcu_rope),
    CTCU_SLOT(ctcu_swiglu_fwd),
    CTCU_SLOT(ctcu_swiglu_bwd),
    /* embedding */
    CTCU_SLOT(ctcu_embed_fwd),
    CTCU_SLOT(ctcu_embed_bwd),
    /* losses */
    CTCU_SLOT(ctcu_ce_fwd),
    CTCU_SLOT(ctcu_ce_bwd),
    CTCU_SLOT(ctcu_lce),
    /* attention */
    CTCU_SLOT(ctcu_sdpa_fwd),
    CTCU_SLOT(ctcu_sdpa_bwd),
    /* optimizer */
    CTCU_SLOT(ctcu_adamw),
    CTCU_SLOT(ctcu_sumsq),
    /* flex attention */
    CTCU_SLOT(ctcu_flex_fwd),
    CTCU_SLOT(ctcu_flex_bwd),
    /* compiled mods */
    CTCU_SLOT(ctcu_flex_jit_identity),
    CTCU_SLOT(ctcu_flex_jit_build),
    CTCU_SLOT(ctcu_flex_jit_load),
    ctcu_flex_jit_unload,
};

extern "C" __attribute__((visibility("default"))) int ct_backend_cuda_entry(int api_version,
                                                                            const ct_backend_ops **ops)
{
    if (!ops) return ctcu_fail(CT_EINVAL, "ct_backend_cuda_entry: ops is NULL");
    *ops = NULL;
    if (api_version != CT_BACKEND_API_VERSION)
        return ctcu_fail(CT_EUNSUPPORTED, "libctorch_cuda speaks backend API version %d, the caller asked for %d: "
                         "libctorch and libctorch_cuda.so come from different builds", CT_BACKEND_API_VERSION,
                         api_version);
    *ops = &ct_cuda_ops;
    return 0;
}
