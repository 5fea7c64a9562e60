/* The accounting allocator: every tensor byte of ctorch passes through here, so the peak
 * it reports is the figure the benchmarks quote. A 64-byte header before each block holds
 * its size. */
#include "core/internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define CT_ALIGN 64

static _Atomic size_t mem_current;
static _Atomic size_t mem_peak;
static _Atomic uint64_t mem_allocs;
static _Atomic uint64_t mem_frees;
static _Atomic size_t mem_limit;

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
    unsigned char *base = aligned_alloc(CT_ALIGN, total);
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
