/*
 * The emulated CUDA device (tests only): the scheduler of kernel threads and the runtime API
 * of tests/cuda_emu/cuda_runtime.h, on the host. See that header for the execution model.
 *
 * Threads are fibers: on x86-64 a six-register context switch written below (about 10 ns);
 * elsewhere ucontext (swapcontext makes a system call per switch: slower, the same
 * semantics). Under AddressSanitizer every switch is announced with its fiber annotations
 * (__sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber), so the kernels run
 * instrumented with their own stacks known to it. Each fiber stack has a guard page below it.
 *
 * One host thread runs launches at a time (a mutex); launches are synchronous. A kernel bug
 * the emulator sees (a barrier not every thread reaches, divergent warp operations, a
 * partial-mask shuffle, too much shared memory) prints "ctorch cuda emulator: ..." with the
 * kernel, block and threads on stderr and aborts: a test tool, never part of libctorch.
 *
 * Environment: CTORCH_CUDA_EMU_REVERSE=1 runs the blocks of every launch in reverse order and
 * resumes the threads of a block from the last to the first (a schedule a GPU may choose too):
 * a kernel whose result depends on either order has a race.
 */
#include "cuda_runtime.h"

#include <map>
#include <mutex>
#include <set>
#include <vector>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__) && !defined(CT_CUDA_EMU_UCONTEXT)
#define EMU_OWN_SWITCH 1
#else
#include <ucontext.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

/* ---- failures ----------------------------------------------------------------------------- */

const unsigned POISON = 0xFFF8DEADu; /* a NaN as f32, and two of them a NaN as f64 */
const size_t STATIC_SMEM_MAX = 48 * 1024;
const size_t DYN_SMEM_DEFAULT = 48 * 1024;
const int DYN_SMEM_OPTIN_MAX = 227 * 1024; /* sm_90 */
const size_t TOTAL_BYTES = (size_t)16 << 30;

void poison(void *p, size_t bytes)
{
    unsigned char *c = (unsigned char *)p;
    size_t i = 0;
    for (; i + 4 <= bytes; i += 4) memcpy(c + i, &POISON, 4);
    if (i < bytes) memcpy(c + i, &POISON, bytes - i);
}

/* ---- the launch in progress ----------------------------------------------------------------- */

enum { RUN = 0, AT_BLOCK = 1, AT_WARP = 2, DONE = 3 };

struct Fiber {
    void *sp;          /* saved stack pointer (own switch) */
    char *stack;       /* usable stack (above the guard page) */
    size_t stack_size;
    int state;
    int warp_op;       /* the warp operation waited at: kind * 16 + bytes (0: __syncwarp) */
    unsigned warp_mask;
    unsigned seq;      /* warp operations done: the exchange buffer's parity */
    void *asan_fake;
#ifndef EMU_OWN_SWITCH
    ucontext_t uc;
#endif
};

const size_t STACK_BYTES = 256 * 1024;

std::mutex launch_mu;
std::vector<Fiber> fibers;
int cur = -1;
#ifdef EMU_OWN_SWITCH
void *sched_sp;
#else
ucontext_t sched_uc;
#endif
void *sched_fake;
const void *sched_bottom;
size_t sched_size;

const char *k_name = "";
void (*k_body)(void *);
void *k_ctx;
unsigned k_threads;
unsigned char xchg[2][1024][8];
void *dyn_smem;
size_t dyn_bytes;
std::vector<void *> shared_seen; /* static __shared__ variables poisoned in this block */
size_t static_bytes;

[[noreturn]] void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ctorch cuda emulator: kernel %s, block (%u, %u, %u) of grid (%u, %u, %u), %u threads: ",
            k_name, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, k_threads);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    abort();
}

bool reverse_order()
{
    static int r = -1;
    if (r < 0) {
        const char *e = getenv("CTORCH_CUDA_EMU_REVERSE");
        r = e && !strcmp(e, "1");
    }
    return r == 1;
}

/* ---- context switches ----------------------------------------------------------------------- */

#ifdef EMU_OWN_SWITCH
extern "C" void emu_ctx_switch(void **save_sp, void *to_sp);
asm(R"(
    .text
    .p2align 4
    .type emu_ctx_switch,@function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_ctx_switch, .-emu_ctx_switch
)");
#endif

inline void asan_start(void **fake, const void *bottom, size_t size)
{
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(fake, bottom, size);
#else
    (void)fake, (void)bottom, (void)size;
#endif
}
inline void asan_finish(void *fake, const void **bottom, size_t *size)
{
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, bottom, size);
#else
    (void)fake, (void)bottom, (void)size;
#endif
}

/* Fiber side: back to the scheduler (state already set). */
void to_scheduler(Fiber &f, bool exiting)
{
    asan_start(exiting ? nullptr : &f.asan_fake, sched_bottom, sched_size);
#ifdef EMU_OWN_SWITCH
    emu_ctx_switch(&f.sp, sched_sp);
#else
    swapcontext(&f.uc, &sched_uc);
#endif
    asan_finish(f.asan_fake, &sched_bottom, &sched_size);
}

void fiber_entry()
{
    asan_finish(nullptr, &sched_bottom, &sched_size);
    k_body(k_ctx);
    Fiber &f = fibers[cur];
    f.state = DONE;
    to_scheduler(f, true);
    fail("a finished thread was resumed"); /* not reached */
}

void fiber_init(Fiber &f)
{
    f.state = RUN;
    f.seq = 0;
    f.warp_op = 0;
    f.warp_mask = 0;
    f.asan_fake = nullptr;
#ifdef EMU_OWN_SWITCH
    /* The stack as emu_ctx_switch leaves it: mxcsr / x87 control word, r15..r12, rbx, rbp,
     * then the return address (fiber_entry) at a 16-byte boundary, and a zero return address
     * for fiber_entry itself (it never returns). */
    uintptr_t top = ((uintptr_t)(f.stack + f.stack_size)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;
    *--sp = (uint64_t)(uintptr_t)&fiber_entry;
    for (int i = 0; i < 6; i++) *--sp = 0;
    uint32_t mx = 0;
    uint16_t cw = 0;
    asm volatile("stmxcsr %0" : "=m"(mx));
    asm volatile("fnstcw %0" : "=m"(cw));
    *--sp = (uint64_t)mx | ((uint64_t)cw << 32);
    f.sp = sp;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = f.stack_size;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, fiber_entry, 0);
#endif
}

void resume(int i)
{
    Fiber &f = fibers[i];
    cur = i;
    unsigned bx = blockDim.x, by = blockDim.y;
    threadIdx.x = (unsigned)i % bx;
    threadIdx.y = ((unsigned)i / bx) % by;
    threadIdx.z = (unsigned)i / (bx * by);
    asan_start(&sched_fake, f.stack, f.stack_size);
#ifdef EMU_OWN_SWITCH
    emu_ctx_switch(&sched_sp, f.sp);
#else
    swapcontext(&sched_uc, &f.uc);
#endif
    asan_finish(sched_fake, nullptr, nullptr);
    cur = -1;
}

void park(int state)
{
    if (cur < 0) {
        fprintf(stderr, "ctorch cuda emulator: a barrier or shuffle outside a kernel\n");
        abort();
    }
    Fiber &f = fibers[cur];
    f.state = state;
    to_scheduler(f, false);
}

bool ensure_fibers(unsigned n)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t pg = page > 0 ? (size_t)page : 4096;
    while (fibers.size() < n) {
        size_t total = STACK_BYTES + pg;
        void *m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return false;
        if (mprotect(m, pg, PROT_NONE) != 0) { /* the guard page */
            munmap(m, total);
            return false;
        }
        Fiber f;
        memset((void *)&f, 0, sizeof f);
        f.stack = (char *)m + pg;
        f.stack_size = STACK_BYTES;
        fibers.push_back(f);
    }
    return true;
}

const char *op_name(int op)
{
    switch (op >> 4) {
    case 0: return "__syncwarp";
    case EMU_SHFL_IDX: return "__shfl_sync";
    case EMU_SHFL_DOWN: return "__shfl_down_sync";
    case EMU_SHFL_UP: return "__shfl_up_sync";
    case EMU_SHFL_XOR: return "__shfl_xor_sync";
    default: return "?";
    }
}

const char *state_name(int s)
{
    return s == RUN ? "running" : s == AT_BLOCK ? "at __syncthreads" : s == AT_WARP ? "at a warp operation" : "exited";
}

/* Run one block to its end. */
void run_block()
{
    const int n = (int)k_threads;
    const bool rev = reverse_order();
    for (int i = 0; i < n; i++) fiber_init(fibers[i]);
    shared_seen.clear();
    static_bytes = 0;
    if (dyn_smem) poison(dyn_smem, dyn_bytes);
    for (;;) {
        for (int s = 0; s < n; s++) {
            int i = rev ? n - 1 - s : s;
            if (fibers[i].state == RUN) resume(i);
        }
        /* every thread waits or has exited: warps first */
        bool released = false;
        for (int w = 0; w * 32 < n; w++) {
            int lanes = n - w * 32 < 32 ? n - w * 32 : 32, at = 0;
            for (int l = 0; l < lanes; l++) at += fibers[w * 32 + l].state == AT_WARP;
            if (at == 0) continue;
            int first = 0;
            while (fibers[w * 32 + first].state != AT_WARP) first++;
            const Fiber &f0 = fibers[w * 32 + first];
            for (int l = 0; l < lanes; l++) {
                const Fiber &f = fibers[w * 32 + l];
                if (f.state != AT_WARP)
                    fail("warp %d: lane %d is %s while lane %d of its warp waits at %s: divergent warp "
                         "synchronisation", w, l, state_name(f.state), first, op_name(f0.warp_op));
                if (f.warp_op != f0.warp_op || f.seq != f0.seq || f.warp_mask != f0.warp_mask)
                    fail("warp %d: lane %d is at %s (its warp operation #%u), lane %d at %s (#%u): divergent "
                         "warp operations", w, first, op_name(f0.warp_op), f0.seq, l, op_name(f.warp_op), f.seq);
            }
            for (int l = 0; l < lanes; l++) fibers[w * 32 + l].state = RUN;
            released = true;
        }
        if (released) continue;
        int at = 0, done = 0;
        for (int i = 0; i < n; i++) {
            at += fibers[i].state == AT_BLOCK;
            done += fibers[i].state == DONE;
        }
        if (done == n) return;
        if (at == n) {
            for (int i = 0; i < n; i++) fibers[i].state = RUN;
            continue;
        }
        int first_done = -1;
        for (int i = 0; i < n && first_done < 0; i++)
            if (fibers[i].state == DONE) first_done = i;
        fail("__syncthreads reached by %d of %d threads; the others exited (thread %d first): a barrier not "
             "every thread of the block reaches (deadlock on a GPU)", at, n, first_done);
    }
}

/* ---- launch bookkeeping ------------------------------------------------------------------- */

cudaError_t last_error = cudaSuccess;
char last_detail[512];
std::map<const void *, int> dyn_optin; /* kernel -> its max dynamic shared memory */

cudaError_t launch_error(cudaError_t e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_detail, sizeof last_detail, fmt, ap);
    va_end(ap);
    last_error = e;
    return e;
}

/* ---- device memory -------------------------------------------------------------------------- */

std::mutex mem_mu;
std::map<uintptr_t, size_t> allocs; /* base -> bytes */
size_t allocated;
std::set<const void *> streams, pools;

/* The allocation holding [p, p + bytes) (bytes 0: p may be its end); false if none. */
bool in_device(const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return false;
    --it;
    uintptr_t base = it->first;
    size_t size = it->second;
    if (a < base || a - base > size) return false;
    return bytes <= size - (a - base) && (bytes > 0 || a - base <= size);
}

bool stream_ok(cudaStream_t s)
{
    return s == nullptr || streams.count((const void *)s) != 0;
}

} /* namespace */

/* ---- kernel side ---------------------------------------------------------------------------- */

void emu_syncthreads()
{
    park(AT_BLOCK);
}

static void check_mask(unsigned mask, const char *what)
{
    int w = cur / 32, lanes = (int)k_threads - w * 32 < 32 ? (int)k_threads - w * 32 : 32;
    unsigned full = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
    if (mask != full)
        fail("thread %d: %s with mask 0x%08x; the emulator takes the warp's full mask (0x%08x) only", cur, what,
             mask, full);
}

void emu_syncwarp(unsigned mask)
{
    check_mask(mask, "__syncwarp");
    Fiber &f = fibers[cur];
    f.warp_op = 0;
    f.warp_mask = mask;
    f.seq++;
    park(AT_WARP);
}

void emu_shfl(void *out, const void *v, size_t bytes, unsigned mask, int src, int width, int kind)
{
    if (cur < 0) {
        fprintf(stderr, "ctorch cuda emulator: a shuffle outside a kernel\n");
        abort();
    }
    int op = kind * 16 + (int)bytes;
    check_mask(mask, op_name(op));
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("thread %d: %s with width %d (a power of two <= 32)", cur, op_name(op), width);
    const int tid = cur, lane = tid & 31, base = tid & ~31;
    Fiber &f = fibers[tid];
    const int par = (int)(f.seq & 1u);
    memcpy(xchg[par][tid], v, bytes);
    f.warp_op = op;
    f.warp_mask = mask;
    f.seq++;
    park(AT_WARP);
    /* Every lane has written this round's value; the next round writes the other buffer, and
     * the one after waits for every lane to have read this one. */
    const int seg = lane & ~(width - 1), lw = lane & (width - 1);
    int s = lane;
    switch (kind) {
    case EMU_SHFL_IDX: s = seg + (((src % width) + width) % width); break;
    case EMU_SHFL_DOWN: s = lw + src < width ? lane + src : lane; break;
    case EMU_SHFL_UP: s = lw >= src ? lane - src : lane; break;
    case EMU_SHFL_XOR: s = lane ^ src; if (s >= seg + width || s < 0 || s > 31) s = lane; break;
    default: fail("unknown shuffle kind %d", kind);
    }
    int lanes = (int)k_threads - base < 32 ? (int)k_threads - base : 32;
    if (s >= lanes) fail("thread %d: %s reads lane %d of a warp of %d threads", tid, op_name(op), s, lanes);
    memcpy(out, xchg[par][base + s], bytes);
}

void *emu_dyn_shared()
{
    if (cur < 0) {
        fprintf(stderr, "ctorch cuda emulator: extern __shared__ outside a kernel\n");
        abort();
    }
    return dyn_smem;
}

void emu_shared(void *p, size_t bytes)
{
    for (void *q : shared_seen)
        if (q == p) return;
    shared_seen.push_back(p);
    static_bytes += bytes;
    if (static_bytes > STATIC_SMEM_MAX)
        fail("%zu bytes of static __shared__ memory (at most %zu)", static_bytes, STATIC_SMEM_MAX);
    poison(p, bytes);
}

bool emu_device_pointer_ok(const void *p)
{
    if (!p) return true;
    std::lock_guard<std::mutex> g(mem_mu);
    return in_device(p, 0);
}

void emu_bad_argument(const char *name, int index, const void *p)
{
    fprintf(stderr,
            "ctorch cuda emulator: kernel %s: argument %d is the pointer %p, which is not in any device "
            "allocation (host memory passed to a kernel?)\n",
            name, index, p);
    fflush(stderr);
    abort();
}

cudaError_t emu_set_max_dyn_smem(const void *kernel, int bytes)
{
    kernel = emu_rtc_kernel_key(kernel);
    if (bytes < 0 || bytes > DYN_SMEM_OPTIN_MAX)
        return launch_error(cudaErrorInvalidValue,
                            "cudaFuncSetAttribute: %d bytes of dynamic shared memory (the device's opt-in "
                            "maximum is %d)", bytes, DYN_SMEM_OPTIN_MAX);
    std::lock_guard<std::mutex> g(launch_mu);
    dyn_optin[kernel] = bytes;
    return cudaSuccess;
}

void emu_launch(const emu_cfg_t &c, const void *kernel, const char *name, void (*body)(void *), void *ctx)
{
    std::lock_guard<std::mutex> g(launch_mu);
    const dim3 gr = c.grid, bl = c.block;
    uint64_t nt = (uint64_t)bl.x * bl.y * bl.z;
    if (nt == 0 || nt > 1024 || bl.z > 64) {
        launch_error(cudaErrorInvalidConfiguration, "launch of %s: block (%u, %u, %u)", name, bl.x, bl.y, bl.z);
        return;
    }
    if (gr.x == 0 || gr.x > 0x7fffffffu || gr.y == 0 || gr.y > 65535 || gr.z == 0 || gr.z > 65535) {
        launch_error(cudaErrorInvalidConfiguration, "launch of %s: grid (%u, %u, %u)", name, gr.x, gr.y, gr.z);
        return;
    }
    size_t limit = DYN_SMEM_DEFAULT;
    auto it = dyn_optin.find(kernel);
    if (it != dyn_optin.end() && (size_t)it->second > limit) limit = (size_t)it->second;
    if (c.smem > limit) {
        launch_error(cudaErrorInvalidValue, "launch of %s: %zu bytes of dynamic shared memory (allowed: %zu)",
                     name, c.smem, limit);
        return;
    }
    {
        std::lock_guard<std::mutex> m(mem_mu);
        if (!stream_ok(c.stream)) {
            launch_error(cudaErrorInvalidResourceHandle, "launch of %s: not a live stream", name);
            return;
        }
    }
    if (!ensure_fibers((unsigned)nt)) {
        launch_error(cudaErrorLaunchFailure, "launch of %s: no memory for %u fiber stacks", name, (unsigned)nt);
        return;
    }
    dyn_smem = nullptr;
    dyn_bytes = c.smem;
    if (c.smem && posix_memalign(&dyn_smem, 128, c.smem) != 0) {
        launch_error(cudaErrorLaunchFailure, "launch of %s: no host memory for its shared memory", name);
        return;
    }
    k_name = name;
    k_body = body;
    k_ctx = ctx;
    k_threads = (unsigned)nt;
    gridDim = gr;
    blockDim = bl;
    const bool rev = reverse_order();
    const uint64_t nblocks = (uint64_t)gr.x * gr.y * gr.z;
    for (uint64_t s = 0; s < nblocks; s++) {
        uint64_t b = rev ? nblocks - 1 - s : s;
        blockIdx.x = (unsigned)(b % gr.x);
        blockIdx.y = (unsigned)((b / gr.x) % gr.y);
        blockIdx.z = (unsigned)(b / ((uint64_t)gr.x * gr.y));
        run_block();
    }
    free(dyn_smem);
    dyn_smem = nullptr;
    k_name = "";
}

/* ---- the runtime API ---------------------------------------------------------------------- */

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
    /* The emulator's own detail of its last refusal (launch limits, bad pointers). */
    if (e != cudaSuccess && e == last_error && last_detail[0]) return last_detail;
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory (emulated device)";
    case cudaErrorInvalidValue: return "invalid argument (emulated device)";
    default: return "error (emulated device)";
    }
}

cudaError_t cudaGetLastError(void)
{
    std::lock_guard<std::mutex> g(launch_mu);
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}

static thread_local int current_device;

cudaError_t cudaGetDevice(int *d)
{
    *d = current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    if (d != 0) return launch_error(cudaErrorInvalidDevice, "cudaSetDevice(%d): the emulator has device 0 only", d);
    current_device = d;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev)
{
    if (dev != 0) return cudaErrorInvalidDevice;
    switch (a) {
    case cudaDevAttrMultiProcessorCount: *v = 132; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = DYN_SMEM_OPTIN_MAX; return cudaSuccess;
    case cudaDevAttrMemoryPoolsSupported: *v = 1; return cudaSuccess;
    }
    return cudaErrorInvalidValue;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev)
{
    if (dev != 0) return cudaErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CUDA sm_90 device emulated on the CPU (ctorch test emulator)");
    p->totalGlobalMem = TOTAL_BYTES;
    p->sharedMemPerBlock = STATIC_SMEM_MAX;
    p->sharedMemPerBlockOptin = DYN_SMEM_OPTIN_MAX;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->maxThreadsPerBlock = 1024;
    p->warpSize = 32;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    std::lock_guard<std::mutex> g(mem_mu);
    *total_b = TOTAL_BYTES;
    *free_b = TOTAL_BYTES - allocated;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    void *h = malloc(1);
    if (!h) return cudaErrorMemoryAllocation;
    std::lock_guard<std::mutex> g(mem_mu);
    streams.insert(h);
    *s = (cudaStream_t)h;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    std::lock_guard<std::mutex> g(mem_mu);
    if (!s || !streams.erase((const void *)s)) return cudaErrorInvalidResourceHandle;
    free((void *)s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    std::lock_guard<std::mutex> g(mem_mu);
    return stream_ok(s) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaDeviceSynchronize(void)
{
    return cudaSuccess;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t *p, const struct cudaMemPoolProps *props)
{
    if (!props || props->location.type != cudaMemLocationTypeDevice || props->location.id != 0)
        return cudaErrorInvalidValue;
    void *h = malloc(1);
    if (!h) return cudaErrorMemoryAllocation;
    std::lock_guard<std::mutex> g(mem_mu);
    pools.insert(h);
    *p = (cudaMemPool_t)h;
    return cudaSuccess;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t p)
{
    std::lock_guard<std::mutex> g(mem_mu);
    if (!p || !pools.erase((const void *)p)) return cudaErrorInvalidValue;
    free((void *)p);
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t p, enum cudaMemPoolAttr a, void *v)
{
    std::lock_guard<std::mutex> g(mem_mu);
    if (!p || !pools.count((const void *)p) || a != cudaMemPoolAttrReleaseThreshold || !v) return cudaErrorInvalidValue;
    return cudaSuccess;
}

static cudaError_t emu_alloc(void **out, size_t bytes)
{
    *out = nullptr;
    if (bytes == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> g(mem_mu);
        if (bytes > TOTAL_BYTES - allocated) return cudaErrorMemoryAllocation;
        allocated += bytes;
    }
    void *p = nullptr;
    if (posix_memalign(&p, 256, bytes) != 0) {
        std::lock_guard<std::mutex> g(mem_mu);
        allocated -= bytes;
        return cudaErrorMemoryAllocation;
    }
    poison(p, bytes); /* device memory starts uninitialised */
    std::lock_guard<std::mutex> g(mem_mu);
    allocs[(uintptr_t)p] = bytes;
    *out = p;
    return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void **p, size_t bytes, cudaMemPool_t pool, cudaStream_t s)
{
    {
        std::lock_guard<std::mutex> g(mem_mu);
        if (!pool || !pools.count((const void *)pool) || !stream_ok(s)) return cudaErrorInvalidValue;
    }
    return emu_alloc(p, bytes);
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s)
{
    {
        std::lock_guard<std::mutex> g(mem_mu);
        if (!stream_ok(s)) return cudaErrorInvalidValue;
    }
    return emu_alloc(p, bytes);
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    return emu_alloc(p, bytes);
}

cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    size_t bytes;
    {
        std::lock_guard<std::mutex> g(mem_mu);
        auto it = allocs.find((uintptr_t)p);
        if (it == allocs.end())
            return launch_error(cudaErrorInvalidValue, "free of %p: not the start of a device allocation", p);
        bytes = it->second;
        allocs.erase(it);
        allocated -= bytes;
    }
    poison(p, bytes); /* a later read through a stale pointer sees NaN */
    free(p);
    return cudaSuccess;
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    {
        std::lock_guard<std::mutex> g(mem_mu);
        if (!stream_ok(s)) return cudaErrorInvalidValue;
    }
    return cudaFree(p);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k, cudaStream_t s)
{
    if (bytes == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> g(mem_mu);
        if (!stream_ok(s)) return cudaErrorInvalidResourceHandle;
        bool dd = in_device(dst, bytes), sd = in_device(src, bytes);
        bool ok = k == cudaMemcpyDefault || (k == cudaMemcpyHostToDevice && dd && !sd) ||
                  (k == cudaMemcpyDeviceToHost && sd && !dd) || (k == cudaMemcpyDeviceToDevice && sd && dd) ||
                  (k == cudaMemcpyHostToHost && !sd && !dd);
        if (!ok)
            return launch_error(cudaErrorInvalidValue,
                                "cudaMemcpy of %zu bytes, kind %d, from %p (%s) to %p (%s): the ranges do not "
                                "match the kind", bytes, (int)k, src, sd ? "device" : "not device", dst,
                                dd ? "device" : "not device");
    }
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k)
{
    return cudaMemcpyAsync(dst, src, bytes, k, nullptr);
}

cudaError_t cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t s)
{
    if (bytes == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> g(mem_mu);
        if (!stream_ok(s)) return cudaErrorInvalidResourceHandle;
        if (!in_device(dst, bytes))
            return launch_error(cudaErrorInvalidValue, "cudaMemset of %zu bytes at %p: not in a device allocation",
                                bytes, dst);
    }
    memset(dst, v, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int v, size_t bytes)
{
    return cudaMemsetAsync(dst, v, bytes, nullptr);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    memset(a, 0, sizeof *a);
    std::lock_guard<std::mutex> g(mem_mu);
    if (p && in_device(p, 1)) {
        a->type = cudaMemoryTypeDevice;
        a->device = 0;
        a->devicePointer = (void *)p;
    } else {
        a->type = cudaMemoryTypeUnregistered;
        a->device = -1;
    }
    return cudaSuccess;
}
