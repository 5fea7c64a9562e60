/* The compile backend's private interface: the IR of a mod expression, its parser, the
 * interval evaluator, the C code generator and the compile / cache layer. */
#ifndef CT_JIT_INTERNAL_H
#define CT_JIT_INTERNAL_H

#include "core/internal.h"
#include "ctorch/jit.h"

#include <stddef.h>

#define JIT_MAX_NODES 1024 /* IR nodes of one mod (after sharing) */
#define JIT_MAX_EXPR 65536 /* bytes of one expression */
#define JIT_MAX_DEPTH 200  /* nesting of the parser */
#define JIT_ABI 1          /* bump when the generated code's interface changes */

typedef enum jtype { JT_BOOL = 0, JT_INT = 1, JT_FLOAT = 2 } jtype;

typedef enum jop {
    J_CONST, /* iv (bool, int) or fv (float) */
    J_VAR,   /* iv: 0 score, 1 b, 2 h, 3 q, 4 kv */
    J_ARR,   /* arr: binding index; k[0..nk): indices (int) */
    J_CAST,  /* to t */
    J_NEG, J_NOT, J_BNOT,
    J_ADD, J_SUB, J_MUL, J_DIV, J_MOD,
    J_LT, J_LE, J_GT, J_GE, J_EQ, J_NE,
    J_AND, J_OR, J_XOR, /* on bools (logical) or ints (bitwise) */
    J_SEL,              /* k0 ? k1 : k2 */
    J_EXP, J_LOG, J_TANH, J_SIGMOID, J_SQRT, J_FLOOR, J_ABS,
    J_MIN, J_MAX, J_CLAMP, /* clamp(k0, k1, k2) = min(max(k0, k1), k2) */
    J_NOPS
} jop;

enum { JV_SCORE, JV_B, JV_H, JV_Q, JV_KV };

typedef struct jnode {
    uint8_t op, t, nk;
    int8_t arr;
    int k[CT_JIT_MAX_DIMS];
    int64_t iv;
    double fv;
} jnode;

/* A bound array's type (what the IR depends on; its shape and data are runtime values). */
typedef struct jarr {
    char name[64];
    ct_dtype dtype;
    int ndim;
    bool grad;
} jarr;

typedef struct jir {
    jnode n[JIT_MAX_NODES];
    int len;
    int root;
    bool is_mask;
    int narr;
    jarr arr[CT_JIT_MAX_ARRAYS];
} jir;

/* Build a node (shared when an identical one exists); -1 with the error recorded when the IR
 * is full. Types are the caller's business (the parser promotes). */
int jir_node(jir *ir, jop op, jtype t, int nk, const int *k, int64_t iv, double fv, int arr);

/* Parse expr into ir (cleared first). fn names the API function for messages. */
ct_status jit_parse(const char *fn, const char *expr, bool is_mask, const ct_jit_binding *bind,
                    int nbind, jir *ir);

/* d(root) / d(score) (wrt < 0) or d(root) / d(the array-element node wrt). -1: zero. */
int jir_deriv(jir *ir, int node, int wrt, int *memo);

/* Canonical text of the IR (hash input); *out allocated with ct_alloc. */
ct_status jir_serialize(const jir *ir, char **out, size_t *len);

/* The code generators' text buffer (codegen.c, codegen_cuda.c): jit_put appends printf-style,
 * growing with ct_alloc; the first failure is kept in st and later calls do nothing. */
typedef struct jit_buf {
    char *s;
    size_t len, cap;
    ct_status st;
} jit_buf;
void jit_put(jit_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
const char *jit_ctype(int t);          /* C type of a jtype: float, int64_t, int (bool) */
const char *jit_elt_type(ct_dtype dt); /* C type of a bound array's elements */
/* need[x] = true for node x and everything it depends on. */
void jit_mark(const jir *ir, int x, bool *need);

/* The generated C translation unit; *out allocated with ct_alloc. */
ct_status jit_codegen(const jir *ir, char **out);

/* The mods' device source (src/device/backend.h, "compiled (jit) mods on a device") of a mask
 * IR, a score IR or both (either may be NULL, not both): CTJ_MASK / CTJ_SCORE / CTJ_NPG,
 * ctj_mask, ctj_score and ctj_score_grad, the arrays numbered the mask's first, then the
 * score's (src/jit/codegen_cuda.c). *out allocated with ct_alloc. */
ct_status jit_codegen_device(const jir *mask, const jir *score, char **out);

/* ---- intervals -------------------------------------------------------------------------- */

typedef struct jival {
    int64_t lo, hi; /* bool / int values; floats: unknown (full) */
} jival;

/* Runtime view of a bound array, as the generated code sees it (keep in sync with the
 * preamble in codegen.c). */
typedef struct ctj_arr {
    const void *data;
    int64_t shape[CT_JIT_MAX_DIMS];
    int64_t stride[CT_JIT_MAX_DIMS];
    int64_t numel;
    int64_t gofs; /* offset of its gradient in param_grad (grad arrays) */
} ctj_arr;

typedef struct jbound {
    const ctj_arr *a;     /* [ir->narr] */
    const jival *vrange;  /* [ir->narr] value range of each int / bool array (whole array) */
    jival var[5];         /* score (unused), b, h, q, kv */
} jbound;

/* Evaluate intervals over every node (out[ir->len]). Array values use exact min / max over
 * small index boxes, the whole-array range otherwise. */
void jit_intervals(const jir *ir, const jbound *bd, jival *out);

/* A mod made by ct_mask_mod_compile / ct_score_mod_compile (recognised by its callbacks,
 * src/jit/mod.c): its IR and, when arrs is not NULL, its bound arrays' views (*arrs[ir->narr],
 * host memory, gofs the offsets in the mod's param_grad). NULL for any other mod. Both live
 * as long as the mod. */
const jir *jit_mask_mod_ir(const ct_mask_mod *m, const ctj_arr **arrs);
const jir *jit_score_mod_ir(const ct_score_mod *m, const ctj_arr **arrs);

/* ---- compile layer ---------------------------------------------------------------------- */

typedef struct jkernel {
    void *dl;
    void (*score_fwd)(const ctj_arr *, const ct_attn_tile *, float *);
    void (*score_grad)(const ctj_arr *, const ct_attn_tile *, const float *, float *, float *);
    void (*mask_tile)(const ctj_arr *, const ct_attn_tile *, uint8_t *);
    jir *ir; /* owned */
    char key[65];
    struct jkernel *retired_next; /* ct_jit_reset_table keeps dropped kernels on a list */
} jkernel;

/* Compile (or find) the kernels of n IRs; kernels[i] are process-lifetime objects. The IRs
 * are moved into the kernels when new (irs[i] set to NULL), else left to the caller. */
ct_status jit_build(jir **irs, int n, const ct_jit_options *opt, jkernel **kernels);

/* Open the cache directory spec (created 0700 where missing) by walking it from "/" without
 * following links that others could change; every directory on the way must be root's or
 * this user's and writable by nobody else (sticky world-writable ones, like /tmp, pass), the
 * last one this user's. *dfd: its descriptor (O_CLOEXEC). CT_EINVAL / CT_EIO with a message
 * naming the directory and the rule. */
ct_status jit_open_cache_dir(const char *fn, const char *spec, int *dfd);

/* CT_OK when sum (a .sum file's bytes) names exactly these .so bytes under this key. */
ct_status jit_cache_verify(const char *key, const uint8_t *sum, size_t sl, const uint8_t *so,
                           size_t ol);

/* Read <key>.sum and <key>.so relative to the directory descriptor (regular files of this
 * user that nobody else may write, never through links, never blocking) and verify them:
 * CT_OK with the verified bytes in *so (ct_free them), CT_EIO absent, CT_EFORMAT damaged. */
ct_status jit_cache_read(int dfd, const char *key, uint8_t **so, size_t *ol);

/* jit_cache_read for an entry <key><ext> (".so": the CPU kernels; ".cubin": a device's image
 * of compiled mods, src/device/flex_jit.c) with its <key>.sum. */
ct_status jit_cache_read_ext(int dfd, const char *key, const char *ext, uint8_t **data, size_t *len);

/* Publish <key><ext> and <key>.sum (checksum, size, key, then the free text note) atomically
 * (temp names, renamed into place, the checksum last). CT_EIO (errno kept) on failure. */
ct_status jit_cache_write(int dfd, const char *key, const char *ext, const void *data, size_t len,
                          const char *note);

/* The cache directory of the compile calls (spec, else $CT_CACHE_DIR, $XDG_CACHE_HOME/ctorch,
 * ~/.cache/ctorch) opened and checked as jit_open_cache_dir does: *dfd, its path into dir. */
ct_status jit_cache_open(const char *fn, const char *spec, char *dir, size_t cap, int *dfd);

/* SHA-256 of data into 32 bytes. */
void jit_sha256(const void *data, size_t len, uint8_t out[32]);

#endif
