/*
 * ctorch/jit.h - user-written score_mod / mask_mod compiled to native tile kernels.
 *
 * An expression (the grammar below) is parsed into a small IR, turned into C for the tile
 * callbacks of attention.h (loops over a tile that the compiler vectorises, the score_mod's
 * derivative by symbolic differentiation, parameter-gradient accumulation, a block
 * classifier for masks by interval arithmetic), compiled by the system C compiler in worker
 * processes, cached on disk and dlopen()ed. The result is an ordinary ct_score_mod /
 * ct_mask_mod: pass it to ct_flex_attention_forward / ct_block_mask_create as a built-in.
 *
 * Expression language (C syntax and precedence, lowest first):
 *   expr    := lor [ '?' expr ':' expr ]
 *   lor     := land { '||' land }        land := bor { '&&' bor }
 *   bor     := bxor { '|' bxor }         bxor := band { '^' band }
 *   band    := eq { '&' eq }             eq   := rel { ('==' | '!=') rel }
 *   rel     := add { ('<' | '<=' | '>' | '>=') add }
 *   add     := mul { ('+' | '-') mul }   mul  := unary { ('*' | '/' | '%') unary }
 *   unary   := ('-' | '+' | '!' | '~') unary | postfix
 *   postfix := primary { '[' expr { ',' expr } ']' }
 *   primary := INT | FLOAT | NAME | NAME '(' [ expr { ',' expr } ] ')' | '(' expr ')'
 * Names: score (the score, f32; score mods only), b, h, q, kv (int64; q_idx and kv_idx are
 * accepted too), true, false, inf (a float), and the bound arrays. An array of n dims is indexed with n
 * indices, a[i, j] or a[i][j] (an array of 0 dims is used by its name). Functions: exp log
 * tanh sigmoid sqrt abs min max clamp(x, lo, hi) where(c, a, b) float(x) int(x).
 * Types: int (int64), float (f32) and bool. int op float is float; bool in arithmetic is int.
 * On ints, / and % have Python's floor semantics (-7 / 2 == -4, -7 % 2 == 1; by 0: 0);
 * + - * wrap. On floats / is true division and % is Python's (sign of the divisor).
 * & | ^ are bitwise on ints and logical on bools, ~ is bitwise not on ints and logical not on
 * bools, ! && || are logical; ?: and where() evaluate both sides (no short circuit).
 * A score mod's value is converted to f32; a mask mod's to bool (nonzero = attend).
 *
 * Every index into a bound array is range-checked: before attention or a block mask uses a
 * compiled mod, ct_jit_check_mask / ct_jit_check_score bound each index by interval arithmetic over
 * b < B, h < H, q < Q_LEN, kv < KV_LEN (and the values of arrays used as indices) and fails
 * with CT_EINVAL naming the array and the reachable range when it can leave the array. The
 * kernels also clamp indices, so memory is never read out of bounds.
 *
 * Environment: CC (compiler, default `cc` on PATH), CT_COMPILE_THREADS (compiler processes
 * run at once; default the core count), CT_COMPILE_TIMEOUT (seconds per job; default 60),
 * CT_CACHE_DIR (default $XDG_CACHE_HOME/ctorch or ~/.cache/ctorch). See docs/compile.md.
 */
#ifndef CTORCH_JIT_H
#define CTORCH_JIT_H

#include "ctorch/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Most arrays one expression may bind, and most dims of one array. */
#define CT_JIT_MAX_ARRAYS 16
#define CT_JIT_MAX_DIMS 4

/** An array an expression may index, referenced (not copied): it must stay alive and
 *  unchanged while the mod is used. Row-major contiguous. */
typedef struct ct_jit_binding {
    const char *name;      /**< identifier used in the expression ([A-Za-z_][A-Za-z0-9_]*) */
    ct_dtype dtype;        /**< CT_DTYPE_F32, CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_BOOL or U8 */
    int ndim;              /**< 0 .. CT_JIT_MAX_DIMS */
    int64_t shape[CT_JIT_MAX_DIMS];
    const void *data;      /**< the elements */
    bool requires_grad;    /**< f32, score mods only: its gradient is accumulated into the
                                mod's param_grad, packed in binding order */
} ct_jit_binding;

/** Options of the compile calls. */
typedef struct ct_jit_options {
    const char *cc;        /**< compiler command; NULL (default): $CC, else `cc` on PATH */
    int threads;           /**< compiler processes at once; 0 (default): $CT_COMPILE_THREADS or
                                the core count */
    double timeout_s;      /**< deadline per compile job; 0 (default): $CT_COMPILE_TIMEOUT or 60 */
    const char *cache_dir; /**< NULL (default): $CT_CACHE_DIR, $XDG_CACHE_HOME/ctorch or
                                ~/.cache/ctorch */
} ct_jit_options;

/** The defaults listed above. */
CT_API ct_jit_options ct_jit_options_default(void);

/** Compile a score mod expression over `bindings` (n of them; NULL when n is 0). *out is an
 *  owned mod (release with ct_score_mod_free); its param_len is the total element count of
 *  the bindings with requires_grad (0: none): set out->param_grad to a buffer of that many
 *  floats to receive their gradients (added). opt NULL: the defaults. Errors: a syntax or type
 *  error names the token and its position (CT_EINVAL); no compiler (CT_EUNSUPPORTED); a
 *  compile error at a line of the generated source shows the source around it (CT_EINTERNAL,
 *  a bug); a compiler failure from its surroundings (disk full, limits, a broken compiler)
 *  names the compiler, its first output line and the cache dir (CT_EIO); a deadline
 *  (CT_ETIMEDOUT); an unusable cache directory (CT_EIO; CT_EINVAL when it or a parent is
 *  another user's or writable by others, or a link on the way is: docs/compile.md). */
CT_API ct_status ct_score_mod_compile(const char *expr, const ct_jit_binding *bindings, int n,
                                      const ct_jit_options *opt, ct_score_mod *out);

/** Compile a mask mod expression (bool). *out is owned (ct_mask_mod_free); it has a block
 *  classifier: EMPTY / FULL where interval arithmetic over the block's index ranges proves
 *  it, PARTIAL otherwise, so block masks cost O(blocks). */
CT_API ct_status ct_mask_mod_compile(const char *expr, const ct_jit_binding *bindings, int n,
                                     const ct_jit_options *opt, ct_mask_mod *out);

/** Range-check a compiled mod's array indices for a grid of B x H x q_len x kv_len (what
 *  ct_block_mask_create and the flex calls do first): CT_EINVAL naming the array, the dim and
 *  the reachable range when an index can leave its array. CT_OK for mods not compiled here. */
CT_API ct_status ct_jit_check_mask(const ct_mask_mod *m, int64_t B, int64_t H, int64_t q_len,
                                   int64_t kv_len);
CT_API ct_status ct_jit_check_score(const ct_score_mod *m, int64_t B, int64_t H, int64_t q_len,
                                    int64_t kv_len);

/** One mod of a batch for ct_mod_compile_many: exactly one of score_out / mask_out set. */
typedef struct ct_jit_request {
    const char *expr;
    const ct_jit_binding *bindings;
    int n;
    ct_score_mod *score_out;
    ct_mask_mod *mask_out;
} ct_jit_request;

/** Compile n mods at once: the cache misses are compiled by up to opt->threads compiler
 *  processes in parallel. On failure no output is set (all are zeroed). */
CT_API ct_status ct_mod_compile_many(const ct_jit_request *reqs, int n, const ct_jit_options *opt);

/** Counters of this process's compile layer (for tests and benchmarks). */
typedef struct ct_jit_stats {
    int64_t table_hits;    /**< served by the in-process table */
    int64_t cache_hits;    /**< loaded from the disk cache */
    int64_t compiles;      /**< compiler runs (misses) */
    int64_t rebuilt;       /**< damaged cache entries detected and rebuilt */
    int64_t processes;     /**< child processes started (compilers and --version) */
} ct_jit_stats;

/** Read the counters. */
CT_API void ct_jit_get_stats(ct_jit_stats *out);
/** Forget the in-process table (kernels stay loaded; the next compile goes to the disk cache).
 *  For tests and benchmarks; not safe while another thread compiles. */
CT_API void ct_jit_reset_table(void);
/** The C source generated for an expression (for docs and tests): *out is allocated with
 *  ct_alloc (free with ct_free). */
CT_API ct_status ct_jit_generate_source(const char *expr, bool is_mask,
                                        const ct_jit_binding *bindings, int n, char **out);

#ifdef __cplusplus
}
#endif
#endif
