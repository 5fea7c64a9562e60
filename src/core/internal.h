/* Private helpers shared by every module of libctorch. */
#ifndef CT_CORE_INTERNAL_H
#define CT_CORE_INTERNAL_H

#include "ctorch/core.h"
#include <stdbool.h>

/* Record a message for ct_last_error() and return `s`, so callers can write
 * `return ct_error(CT_EINVAL, "h: expected 2 dims, got %d", nd);`. */
ct_status ct_error(ct_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Prefix this thread's current message (the cause a callee recorded) with a formatted
 * context and return `s`: the message becomes "<context>: <cause>" (just "<context>" when
 * there is no cause). Use it instead of ct_error(s, "...: %s", ct_last_error()), which
 * formats the message buffer into itself (undefined behaviour). The cause is truncated
 * first when the whole does not fit the 1 KiB buffer. */
ct_status ct_error_wrap(ct_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Propagate a failing status. */
#define CT_TRY(expr)                                                                       \
    do {                                                                                   \
        ct_status ct_try_s_ = (expr);                                                      \
        if (ct_try_s_ != CT_OK) return ct_try_s_;                                          \
    } while (0)

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool ct_mul_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool ct_add_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* ---- files ctorch reads (src/core/file.c): every reader of a path goes through these ----
 * The path is opened O_RDONLY|O_NONBLOCK|O_CLOEXEC (a FIFO cannot block the open), fstat must
 * say it is a regular file (a FIFO, /dev/zero or another device, a socket or a folder: CT_EINVAL,
 * "<what> '<path>' is not a regular file (a FIFO)"), its size must be at most max (CT_EFORMAT
 * naming the size and the limit; SIZE_MAX: the file's own size is the only bound, as for
 * weights), and O_NONBLOCK is cleared. `what` names the input in messages ("model config"). */
#include <stddef.h>
#include <stdint.h>
#define CT_FILE_CONFIG_MAX ((size_t)16 << 20) /* config.json and other JSON side files */
#define CT_FILE_INDEX_MAX ((size_t)64 << 20)  /* indexes and other large JSON */
ct_status ct_file_open_regular(const char *path, const char *what, size_t max, int *fd,
                               size_t *size);
/* size bytes from offset 0 of an opened file into *buf (ct_alloc'd, NUL-terminated). */
ct_status ct_file_read_fd(int fd, const char *path, const char *what, size_t size, char **buf);
/* The whole file (at most max bytes) into *buf (ct_alloc'd, NUL-terminated after *len). */
ct_status ct_file_read_all(const char *path, const char *what, size_t max, char **buf,
                           size_t *len);
/* Copy src_dir/name (a side file of a model directory: tokenizer_config.json, ...) into
 * dst_dir/name, keeping its permission bits. Absent: CT_OK with *copied false. Refused
 * (CT_EINVAL) when it is not a regular file or a link resolving outside src_dir (the Hugging
 * Face hub cache's "snapshots/<rev>" -> "blobs/" links are inside); larger than max:
 * CT_EFORMAT. The copy is a new file (O_EXCL|O_NOFOLLOW) renamed over dst_dir/name. */
ct_status ct_file_copy_side(const char *src_dir, const char *name, size_t max,
                            const char *dst_dir, bool *copied);

#if defined(__aarch64__)
/* svcntb() (src/core/cpu_sve.c, built with SVE enabled): call only when the CPU has SVE. */
size_t ct_sve_cntb(void);
#endif
/* The kernel table of a family for the active instruction set: tab[ct_active_isa()], where
 * the family fills every slot (an instruction set without bodies points at the next one
 * down). Chosen by index, so ct_set_isa() re-selects every family at once. */
#define CT_KERNELS(tab) ((tab)[ct_active_isa()])


/* ---- thread pool (src/core/threads.c) ----
 * ct_parallel_for_grain: ct_parallel_for with chunks of at least `grain` indices (a cost
 * hint: indices per chunk below which the pool's overhead would dominate; n <= grain runs
 * serially on the caller). Chunks are contiguous, sized from n and the thread count, and
 * claimed dynamically; tid < ct_num_threads() and no two chunks running at once share a
 * tid. Kernels must make every output depend on its inputs alone (never on the chunking
 * or on tid). Regions from several threads run at once; nested regions run serially. */
void ct_parallel_for_grain(int64_t n, int64_t grain, ct_parallel_fn fn, void *ctx);
/* ct_parallel_for_grain on at most max_threads threads: tid < max_threads. A caller that sizes
 * per-tid scratch from ct_num_threads() passes the count it read, so a ct_set_num_threads()
 * from another thread between the read and the region cannot hand out a tid past the
 * scratch. */
void ct_parallel_for_capped(int64_t n, int64_t grain, int max_threads, ct_parallel_fn fn, void *ctx);
/* A region of n tasks, each its own chunk, claimed in index order (serially, or nested: one
 * call over [0, n)): for callers that cut their work into tasks of equal cost themselves,
 * which ct_parallel_for's chunking would merge unevenly (ctorch's GEMM: tile t, then pack
 * piece t of the next step). */
void ct_parallel_tasks(int64_t n, ct_parallel_fn fn, void *ctx);

/* Streaming stores (src/core/memory.c). ct_stream_stores(bytes): whether an output of that many
 * bytes is written with non-temporal stores: above the last-level cache's size, where it leaves
 * the caches anyway (the read-for-ownership of each line saved). ct_stream_copy copies like
 * memcpy with such stores; a task that used it calls ct_stream_fence before its writes are read
 * by another thread. The bytes written are the same either way. ct_stream_set_min_bytes sets
 * the threshold (tests: 0 streams everything) and returns the old one. */
bool ct_stream_stores(size_t bytes);
void ct_stream_copy(void *dst, const void *src, size_t n);
void ct_stream_fence(void);
size_t ct_stream_set_min_bytes(size_t bytes);
/* The rows a task computes into an L1-sized buffer before streaming them out. */
#define CT_STREAM_TILE_BYTES 16384

/* A device buffer (ctorch/device.h; made by src/device/device.c). Core reads only where it lives,
 * so that tensors over buffers need nothing of the device layer above it. */
struct ct_buffer {
    struct ct_device *dev;
    void *data;
    size_t bytes;
    bool host;         /* the memory is host memory (the CPU device) */
    const char *where; /* the device's name ("cpu", "cuda:0"), valid while it is open */
};

/* Row-broadcast bias and its gradient, parallel and deterministic (src/ops/bias.c):
 * x[n, :] += b for N rows of C; db[j] += sum over the rows of d[n, j], each column summed
 * by one thread in row order (the bits of the serial loop, for any thread count). */
void ct_bias_add_rows(float *x, const float *b, int64_t N, int64_t C);
void ct_bias_grad_rows(float *db, const float *d, int64_t N, int64_t C);
/* x[n, :] = b for N rows of C (the bias as the starting value of a GEMM's output). */
void ct_bias_fill_rows(float *x, const float *b, int64_t N, int64_t C);
/* Zero n floats in parallel (large gradient buffers). */
void ct_zero_floats(float *x, int64_t n);

#endif
