/*
 * ctorch/core.h - status codes, errors, logging, memory accounting, threads, CPU features.
 *
 * Every fallible ctorch function returns a ct_status (CT_OK == 0). On failure the message
 * for the last error on the calling thread is available from ct_last_error(); it names
 * the argument and the rule it broke. The library never prints and never exits.
 */
#ifndef CTORCH_CORE_H
#define CTORCH_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define CT_API __declspec(dllexport)
#elif defined(__GNUC__)
#define CT_API __attribute__((visibility("default")))
#else
#define CT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Result of every fallible call. Values are stable (the Python binding relies on them). */
typedef enum ct_status {
    CT_OK = 0,
    CT_EINVAL = 1,        /**< an argument broke a documented rule */
    CT_ENOMEM = 2,        /**< allocation failed or the memory limit was reached */
    CT_EOVERFLOW = 3,     /**< a size computation overflowed */
    CT_EIO = 4,           /**< an operating-system I/O call failed */
    CT_EFORMAT = 5,       /**< input bytes do not follow the file format */
    CT_EUNSUPPORTED = 6,  /**< recognised but not supported (yet) */
    CT_ETIMEDOUT = 7,     /**< a deadline passed */
    CT_ECANCELLED = 8,    /**< the operation was aborted */
    CT_EPEER = 9,         /**< a remote peer failed */
    CT_EINTERNAL = 10,    /**< a broken internal invariant (a bug: please report) */
} ct_status;

/** Short stable name of a status ("CT_EINVAL"); never NULL. */
CT_API const char *ct_status_name(ct_status s);

/** Message of the last error set on this thread ("" if none). Valid until the next call
 *  into ctorch on this thread. */
CT_API const char *ct_last_error(void);

/** Clear this thread's error message. */
CT_API void ct_clear_error(void);

/* ---- logging ------------------------------------------------------------------------ */

typedef enum ct_log_level {
    CT_LOG_DEBUG = 0,
    CT_LOG_INFO = 1,
    CT_LOG_WARN = 2,
    CT_LOG_ERROR = 3,
} ct_log_level;

/** A log sink: receives a level, a component name ("core", "comm", ...) and a message. */
typedef void (*ct_log_fn)(void *user, ct_log_level level, const char *component,
                          const char *message);

/** Install a sink (NULL: discard everything, the default) and the minimum level. */
CT_API void ct_log_set_sink(ct_log_fn fn, void *user, ct_log_level min_level);

/** Ready-made sinks writing to a FILE* given as `user`: plain text lines, or JSON lines
 *  {"ts":..,"level":..,"component":..,"msg":..}. For the CLI and tests. */
CT_API void ct_log_sink_text(void *file, ct_log_level level, const char *component,
                             const char *message);
CT_API void ct_log_sink_json(void *file, ct_log_level level, const char *component,
                             const char *message);

/** Emit a log record (printf-style) through the installed sink. */
CT_API void ct_log(ct_log_level level, const char *component, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- memory ------------------------------------------------------------------------- */

/** Default working-memory budget of the calls that tile their work (64 MiB): the fused
 *  loss's logit tiles (ct_ce_options.scratch_bytes) and FlexAttention's score-mod parameter
 *  gradients (ct_flex_options.grad_scratch_bytes); a budget of 0 means this one. */
#define CT_DEFAULT_SCRATCH_BYTES ((size_t)64 << 20)

/** Allocator figures (process wide). */
typedef struct ct_memory_stats_t {
    size_t current_bytes; /**< bytes live now */
    size_t peak_bytes;    /**< high-water mark since start or the last reset */
    uint64_t alloc_count; /**< successful allocations since start */
    uint64_t free_count;  /**< frees since start */
    size_t limit_bytes;   /**< 0 = unlimited */
} ct_memory_stats_t;

/** Allocate `bytes` (64-byte aligned, uninitialised) into *out. bytes == 0 gives a valid
 *  unique pointer. Fails with CT_ENOMEM when the OS refuses or the limit would be passed. */
CT_API ct_status ct_alloc(void **out, size_t bytes);
/** Same as ct_alloc, zero-filled. */
CT_API ct_status ct_calloc(void **out, size_t bytes);
/** Free memory from ct_alloc/ct_calloc. NULL is a no-op. */
CT_API void ct_free(void *p);
/** Copy the current figures into *out. */
CT_API void ct_memory_stats(ct_memory_stats_t *out);
/** Set the peak to the current live bytes (like torch.cuda.reset_peak_memory_stats). */
CT_API void ct_memory_reset_peak(void);
/** Cap the live bytes (0 = no cap); allocations that would pass it fail with CT_ENOMEM. */
CT_API void ct_memory_set_limit(size_t bytes);

/* ---- layouts of the public structs (for bindings) ----------------------------------- */

/** Layout of public struct `name` ("ct_tensor", "ct_ce_options", ...) as this library was
 *  compiled: *size is its sizeof, *nfields the number of fields listed (those a binding
 *  mirrors; see ct_abi_struct_field). The Python package checks its ctypes mirrors with it at
 *  import. CT_EINVAL names a struct whose layout is not exported. */
CT_API ct_status ct_abi_struct_layout(const char *name, size_t *size, int *nfields);
/** Field i (0 .. nfields - 1) of struct `name`: its name (static), offsetof and sizeof. */
CT_API ct_status ct_abi_struct_field(const char *name, int i, const char **field, size_t *offset,
                                     size_t *size);

/* ---- threads ------------------------------------------------------------------------ */

/** Body of a parallel loop: handles indices [begin, end) as worker `tid`. */
typedef void (*ct_parallel_fn)(void *ctx, int64_t begin, int64_t end, int tid);

/** Run fn over [0, n) split into contiguous chunks (about 4 per thread, sized from n and
 *  ct_num_threads()) that the caller and the pool's workers claim as they go; returns when
 *  every chunk is done. Each index is in exactly one chunk; tid is < ct_num_threads() and
 *  no two chunks running at once share it (per-tid scratch is safe), but which thread runs
 *  which chunk is not fixed: make every output depend on its inputs alone. Several threads
 *  may run regions at once (none waits for another's region); nested calls from inside a
 *  body run serially on the calling thread. */
CT_API void ct_parallel_for(int64_t n, ct_parallel_fn fn, void *ctx);

/** Worker count used by ct_parallel_for. Defaults to CT_NUM_THREADS from the environment,
 *  else the number of online CPUs divided by the ranks on this host when a launcher says
 *  (LOCAL_WORLD_SIZE, MPI_LOCALNRANKS or OMPI_COMM_WORLD_LOCAL_SIZE; at least 1). OpenBLAS itself is kept single-threaded: ctorch's pool
 *  splits each GEMM into blocks (so results do not depend on the count and nothing
 *  oversubscribes). */
CT_API int ct_num_threads(void);
/** Set the worker count (1..256). */
CT_API ct_status ct_set_num_threads(int n);

/* ---- CPU features ------------------------------------------------------------------- */

/** Instruction sets the kernels may use. Each op family keeps one table of kernels per
 *  instruction set; the table of the active one is used (families without bodies for an
 *  instruction set use the next one down: avx512 -> avx2 -> scalar, sve -> neon -> scalar). */
typedef enum ct_isa {
    CT_ISA_SCALAR = 0,
    CT_ISA_AVX2 = 1,   /**< AVX2 + FMA + F16C */
    CT_ISA_AVX512 = 2, /**< AVX-512 F + BW + DQ + VL (and AVX2 + FMA + F16C) */
    CT_ISA_NEON = 3,   /**< AArch64 Advanced SIMD */
    CT_ISA_SVE = 4,    /**< AArch64 SVE (vector-length agnostic) */
    CT_ISA_COUNT = 5
} ct_isa;

/** The instruction set in use: the best the CPU has, unless the environment forced one
 *  (CT_FORCE_ISA=scalar|avx2|avx512|neon|sve; CT_FORCE_SCALAR=1 is an alias of
 *  CT_FORCE_ISA=scalar) or ct_set_isa() chose another. Detected once per process. A forced
 *  instruction set the CPU lacks leaves the best available in use; ct_isa_env_status()
 *  reports it. */
CT_API ct_isa ct_active_isa(void);
/** CT_OK unless CT_FORCE_ISA names an unknown instruction set (CT_EINVAL) or one this CPU
 *  lacks (CT_EUNSUPPORTED, the message names the CPU); programs should refuse to run then. */
CT_API ct_status ct_isa_env_status(void);
/** Force an instruction set (for tests); CT_EINVAL for an unknown value, CT_EUNSUPPORTED
 *  (naming the CPU) if the CPU lacks it. */
CT_API ct_status ct_set_isa(ct_isa isa);
/** True when this CPU can run the instruction set. */
CT_API bool ct_cpu_has_isa(ct_isa isa);
/** True when this CPU has bf16 dot-product instructions (x86 AVX512_BF16, AArch64 BF16).
 *  Without them bf16 operands are widened to f32 and multiplied in f32 (same results, no
 *  bf16 speed-up): `ctorch train --dtype bf16` says so. */
CT_API bool ct_cpu_has_bf16(void);
/** The CPU's name as it reports it (x86: the CPUID brand string), or "this CPU". */
CT_API const char *ct_cpu_name(void);
/** The SVE vector length in bytes (svcntb(): 16 for 128-bit vectors ... 256 for 2048-bit),
 *  0 when the CPU lacks SVE (and on every non-AArch64 build). */
CT_API size_t ct_cpu_sve_bytes(void);
/** Name of an instruction set ("scalar", "avx2", "avx512", "neon", "sve"; "unknown"). */
CT_API const char *ct_isa_name(ct_isa isa);

/** Library version string ("0.1.0"). */
CT_API const char *ct_version(void);

#ifdef __cplusplus
}
#endif
#endif
