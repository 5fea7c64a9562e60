/* The accounting allocator: every tensor byte of ctorch passes through here, so the peak
 * it reports is the figure the benchmarks quote. A 64-byte header before each block holds
 * its size. */
#include "core/internal.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__x86_64__) || defined(__SSE2__)
#include <emmintrin.h>
#endif

#define CT_ALIGN 64

static _Atomic size_t mem_current;
static _Atomic size_t mem_peak;
static _Atomic uint64_t mem_allocs;
static _Atomic uint64_t mem_frees;
static _Atomic size_t mem_limit;

/* Big blocks (at least 4 MiB: weights, gradients, activations, the fused loss's tile, GEMM
 * panels) are 2 MiB aligned and advised as transparent huge pages where Linux has them (its
 * "madvise" mode, the common default, gives huge pages only to advised memory). A fresh 64 MiB
 * tile then takes 32 page faults instead of 16384, and strided walks (a GEMM's packing, rows
 * V floats apart) miss the TLB far less: the default train model's fused head took 0.195
 * instead of 0.208 s (2 threads). CT_HUGEPAGES=0 turns it off. The advice is only advice: a
 * kernel without huge pages ignores it, and the block is the same either way. */
#define HUGE_MIN ((size_t)4 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

static pthread_once_t huge_once = PTHREAD_ONCE_INIT;
static bool huge_on;

static void huge_init(void)
{
    const char *e = getenv("CT_HUGEPAGES");
    huge_on = !(e && !strcmp(e, "0"));
}

static unsigned char *block_alloc(size_t total)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    pthread_once(&huge_once, huge_init);
    if (huge_on && total >= HUGE_MIN) {
        size_t t2;
        if (!ct_add_size(total, HUGE_PAGE - 1, &t2)) return NULL;
        t2 &= ~(HUGE_PAGE - 1);
        unsigned char *b = aligned_alloc(HUGE_PAGE, t2);
        if (b) (void)madvise(b, t2, MADV_HUGEPAGE);
        return b;
    }
#else
    (void)huge_once, (void)huge_on, (void)huge_init;
#endif
    return aligned_alloc(CT_ALIGN, total);
}

static ct_status alloc_impl(void **out, size_t bytes, int zero)
{
    if (!out) return ct_error(CT_EINVAL, "ct_alloc: out must not be NULL");
    *out = NULL;
    size_t total;
    if (!ct_add_size(bytes, CT_ALIGN, &total) || !ct_add_size(total, CT_ALIGN - 1, &total))
        return ct_error(CT_EOVERFLOW, "ct_alloc: %zu bytes overflows size_t", bytes);
    total &= ~(size_t)(CT_ALIGN - 1);
    size_t limit = atomic_load(&mem_limit);
    size_t cur = atomic_fetch_add(&mem_current, bytes) + bytes;
    if (limit && cur > limit) {
        atomic_fetch_sub(&mem_current, bytes);
        return ct_error(CT_ENOMEM, "ct_alloc: %zu bytes would pass the memory limit of %zu bytes (%zu live)",
                        bytes, limit, cur - bytes);
    }
    unsigned char *base = block_alloc(total);
    if (!base) {
        atomic_fetch_sub(&mem_current, bytes);
        return ct_error(CT_ENOMEM, "ct_alloc: the system refused %zu bytes", bytes);
    }
    if (zero) memset(base + CT_ALIGN, 0, bytes);
    memcpy(base, &bytes, sizeof bytes);
    size_t peak = atomic_load(&mem_peak);
    while (cur > peak && !atomic_compare_exchange_weak(&mem_peak, &peak, cur)) {
    }
    atomic_fetch_add(&mem_allocs, 1);
    *out = base + CT_ALIGN;
    return CT_OK;
}

ct_status ct_alloc(void **out, size_t bytes)
{
    return alloc_impl(out, bytes, 0);
}

ct_status ct_calloc(void **out, size_t bytes)
{
    return alloc_impl(out, bytes, 1);
}

void ct_free(void *p)
{
    if (!p) return;
    unsigned char *base = (unsigned char *)p - CT_ALIGN;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    atomic_fetch_sub(&mem_current, bytes);
    atomic_fetch_add(&mem_frees, 1);
    free(base);
}

void ct_memory_stats(ct_memory_stats_t *out)
{
    if (!out) return;
    out->current_bytes = atomic_load(&mem_current);
    out->peak_bytes = atomic_load(&mem_peak);
    out->alloc_count = atomic_load(&mem_allocs);
    out->free_count = atomic_load(&mem_frees);
    out->limit_bytes = atomic_load(&mem_limit);
}

void ct_memory_reset_peak(void)
{
    atomic_store(&mem_peak, atomic_load(&mem_current));
}

void ct_memory_set_limit(size_t bytes)
{
    atomic_store(&mem_limit, bytes);
}

/* ---- streaming stores ----------------------------------------------------------------------
 * An output bigger than the last-level cache leaves the caches anyway: writing it with
 * non-temporal stores skips the read-for-ownership of every line (a third of a streaming
 * kernel's traffic for one input and one output). The stores write the same bytes, so the
 * results are the same bits either way. */

static pthread_once_t stream_once = PTHREAD_ONCE_INIT;
static _Atomic size_t stream_min = SIZE_MAX;

static void stream_init(void)
{
    long llc = -1;
#if defined(_SC_LEVEL3_CACHE_SIZE)
    llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
#if defined(_SC_LEVEL2_CACHE_SIZE)
    if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    /* at most 32 MiB: a core sees its own slice of a split L3 (a Zen CCX: 32 MiB), while sysconf
     * may give the whole socket's (256 MiB on an 8-CCD EPYC); unknown: 32 MiB */
    size_t cap = (size_t)32 << 20;
    size_t v = llc > 0 && (size_t)llc < cap ? (size_t)llc : cap;
    size_t expect = SIZE_MAX; /* ct_stream_set_min_bytes before the first use wins */
    atomic_compare_exchange_strong(&stream_min, &expect, v);
}

bool ct_stream_stores(size_t bytes)
{
    pthread_once(&stream_once, stream_init);
    return bytes > atomic_load_explicit(&stream_min, memory_order_relaxed);
}

size_t ct_stream_set_min_bytes(size_t bytes)
{
    pthread_once(&stream_once, stream_init);
    return atomic_exchange(&stream_min, bytes);
}

void ct_stream_copy(void *dst, const void *src, size_t n)
{
#if defined(__x86_64__) || defined(__SSE2__)
    unsigned char *d = dst;
    const unsigned char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n) head = n;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    for (; n >= 16; n -= 16, d += 16, s += 16)
        _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    memcpy(d, s, n);
#else
    memcpy(dst, src, n);
#endif
}

void ct_stream_fence(void)
{
#if defined(__x86_64__) || defined(__SSE2__)
    _mm_sfence();
#endif
}
