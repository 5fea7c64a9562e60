/*
 * The backend table: what a device (the CPU, or a GPU through its own shared library) gives
 * libctorch. One table per backend kind; libctorch's device layer (src/device/device.c) keeps
 * the memory accounting, the argument checks and the error messages above it, so every device
 * is counted and checked the same way.
 *
 * This header is the ABI between libctorch and libctorch_cuda.so (loaded with dlopen), so it
 * depends only on ctorch's public headers (plain structs and enums) and is C and C++ alike.
 * A backend library exports one symbol:
 *
 *     int ct_backend_cuda_entry(int api_version, const ct_backend_ops **ops);
 *
 * returning 0 and its table when it speaks api_version (CT_BACKEND_API_VERSION), else a
 * non-zero ct_status. Change the version with any change of this file's structs or slots.
 * (Version 1 has not shipped: slots added at the end of ct_backend_ops before its release,
 * flex_fwd / flex_bwd, keep it at 1.)
 *
 * Rules every slot follows:
 * - The first argument is the backend's context (ct_backend *, from open). Pointers are the
 *   device's memory (from alloc) unless said otherwise; sizes are element counts.
 * - Work is ordered on the device's one stream; a slot may return before the device finished
 *   (sync waits). Host-visible results (a loss, a norm) are read with copy_d2h.
 * - A slot returns 0 or a ct_status value; on failure last_error() (thread-local, valid until
 *   the next failing call on the thread) names the slot and the cause. A slot never prints,
 *   never exits, never aborts. A NULL slot means "not on this device": the device layer
 *   answers CT_EUNSUPPORTED naming the op and the device.
 * - Arguments reach a slot already checked (sizes >= 0, pointers non-NULL where needed,
 *   token ids in range): slots check only what only they can (their own limits).
 * - Results are deterministic: the same bits run to run on the same device model (launch
 *   shapes from tensor shapes only, no atomic accumulation of floats, fixed-order sums).
 * - dtype arguments say the element type of the activation / weight operands (CT_DTYPE_F32 or
 *   CT_DTYPE_BF16, stored as uint16_t bits); accumulation is f32 (sums of squares in double
 *   where the CPU kernels use double); gradients of parameters are f32.
 */
#ifndef CT_DEVICE_BACKEND_H
#define CT_DEVICE_BACKEND_H

#include "ctorch/core.h"
#include "ctorch/device.h"
#include "ctorch/loss.h"
#include "ctorch/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CT_BACKEND_API_VERSION 1

typedef struct ct_backend ct_backend; /* a backend's own context for one device */

/* What libctorch gives a backend at open: the device's accounting, so that the backend's own
 * memory (scratch of the ops, the GEMM workspace) is counted with the device's buffers in
 * ct_device_memory_stats and held to the device's limit. account(ctx, +bytes) before taking
 * memory: non-zero means the limit would be passed (take nothing, answer CT_ENOMEM);
 * account(ctx, -bytes) after giving it back (in stream order is fine). */
typedef struct ct_backend_host {
    void *ctx;
    int (*account)(void *ctx, int64_t delta_bytes);
} ct_backend_host;

/* What a backend says of its device (describe). */
typedef struct ct_backend_info {
    char name[128];          /* "NVIDIA H200" / the CPU's name */
    size_t total_bytes;      /* device memory (0: host memory, unbounded here) */
    int driver_version;      /* CUDA: cudaDriverGetVersion (e.g. 13000); 0 elsewhere */
    int runtime_version;     /* CUDA: the runtime the library was built with */
    int compute_capability;  /* CUDA: major * 10 + minor (90 for sm_90); 0 elsewhere */
    int multiprocessors;     /* CUDA: SM count; CPU: online cores */
} ct_backend_info;

/* Attention of the model's layout: q [B, T, H, E], k and v [B, T, Hk, E] (H % Hk == 0, GQA),
 * out [B, T, H, E], lse [B, H, T] (natural log), all contiguous on the device. `scale` is the
 * softmax scale (1/sqrt(E) by default). Masks: causal only in slot sdpa (mask == NULL); the
 * CPU backend also takes a dense boolean mask [B, 1, T, T] (mask != NULL, host = device
 * memory there). Flex (block masks, mods) is its own slot family (flex_fwd / flex_bwd). */
typedef struct ct_attn_args {
    int64_t B, T, H, Hk, E;
    float scale;
    const void *q, *k, *v; /* dtype */
    void *out;             /* dtype */
    float *lse;
    const uint8_t *mask;   /* NULL: causal */
    ct_dtype dtype;
} ct_attn_args;

typedef struct ct_attn_grads {
    const void *dout; /* [B, T, H, E] dtype */
    void *dq, *dk, *dv; /* written, dtype */
} ct_attn_grads;

/* ---- FlexAttention (slots flex_fwd / flex_bwd) --------------------------------------------- */

/* A block mask on a device: the lists of a host ct_block_mask (include/ctorch/attention.h)
 * copied to the device's memory (src/device/flex_upload.c: ct_dev_block_mask_upload), same
 * meaning: rows r = (b * H + h) * num_q_blocks + qb list the key blocks of query block qb in
 * ascending order, partial ones kv_idx[kv_ptr[r] .. kv_ptr[r+1]) (the mask is evaluated per
 * element there) and full ones full_kv_idx[full_kv_ptr[r] .. full_kv_ptr[r+1]) (attended
 * without it); columns c = (b * H + h) * num_kv_blocks + kb list the query blocks of key
 * block kb the same way (q_ptr / q_idx, full_q_ptr / full_q_idx: the backward's dK / dV).
 * Blocks in neither list are skipped. B (H) is 1 when the mask is the same for every batch
 * (head): batch b reads row b (0 when B == 1), head h row h (0 when H == 1). */
typedef struct ct_dev_block_mask {
    int64_t B, H;
    int64_t q_len, kv_len, block_size;
    int64_t num_q_blocks, num_kv_blocks;
    const int64_t *kv_ptr, *full_kv_ptr; /* device, [B * H * num_q_blocks + 1] */
    const int32_t *kv_idx, *full_kv_idx; /* device */
    const int64_t *q_ptr, *full_q_ptr;   /* device, [B * H * num_kv_blocks + 1] */
    const int32_t *q_idx, *full_q_idx;   /* device */
    void *base;   /* the one device buffer holding the lists (the uploader's; slots ignore it) */
    size_t bytes; /* its size */
} ct_dev_block_mask;

/* The built-in mask_mods a flex slot evaluates inside partial blocks: the AND of the masks of
 * the bits set (0: every pair of a partial block attends). They must describe the mask the
 * block mask was built from (ct_mask_mod_causal, _sliding_window, _prefix_lm, _document, and
 * ct_mask_mod_and of them), or the block lists and the pairs disagree. */
enum {
    CT_FLEX_MASK_CAUSAL = 1u << 0,   /* kv <= q */
    CT_FLEX_MASK_WINDOW = 1u << 1,   /* |q - kv| <= window (with CAUSAL: 0 <= q - kv <= window) */
    CT_FLEX_MASK_PREFIX = 1u << 2,   /* kv < prefix or kv <= q (prefix LM) */
    CT_FLEX_MASK_DOCUMENT = 1u << 3, /* q_doc[b][q] == kv_doc[b][kv] */
};

/* The built-in score_mods (applied to s = scale * q . k before the mask). */
typedef enum ct_flex_score {
    CT_FLEX_SCORE_NONE = 0,
    CT_FLEX_SCORE_SOFTCAP = 1, /* s -> softcap * tanh(s / softcap) (ct_score_mod_softcap) */
    CT_FLEX_SCORE_ALIBI = 2,   /* s -> s + alibi_slopes[h] * (kv - q) (ct_score_mod_alibi) */
} ct_flex_score;

typedef struct ct_flex_mods {
    unsigned mask;      /* CT_FLEX_MASK_* bits */
    int64_t window;     /* CT_FLEX_MASK_WINDOW: >= 0 */
    int64_t prefix;     /* CT_FLEX_MASK_PREFIX: >= 0 */
    const int32_t *q_doc, *kv_doc; /* CT_FLEX_MASK_DOCUMENT: device int32 [doc_batch, T];
                                      kv_doc NULL: q_doc */
    int64_t doc_batch;  /* 1 (shared by the batches) or B */
    ct_flex_score score;
    float softcap;              /* CT_FLEX_SCORE_SOFTCAP: finite, > 0 */
    const float *alibi_slopes;  /* CT_FLEX_SCORE_ALIBI: device f32 [H] (query heads) */
    const struct ct_flex_jit *compiled; /* compiled (jit) mods (below); NULL: none */
} ct_flex_mods;

/* ---- compiled (jit) mods on a device (slots flex_jit_build / _load / _unload) --------------
 * A user's score_mod / mask_mod compiled by libctorch's jit (src/jit) runs on a GPU as device
 * functions compiled into the flex kernels at run time. libctorch writes the mods' source
 * (src/jit/codegen_cuda.c), keeps the on-disk cache of built images (docs/compile.md) and
 * uploads the bound arrays; the backend compiles (flex_jit_build: NVRTC on CUDA, the host
 * compiler on the emulated device), loads (flex_jit_load) and launches.
 *
 * The mods' source (C++ for the device, no #include) relies on a prelude the backend puts
 * before it: int32_t / int64_t / uint8_t / uint16_t, INFINITY and NAN, the device math of
 * CUDA (expf, logf, tanhf, sqrtf, floorf, fabsf, fminf, fmaxf, __fdiv_rn, ...), the
 * __device__ / __forceinline__ keywords, and
 *     struct ctj_arr { const void *data; int64_t shape[4], stride[4], numel, gofs; };
 * (the layout of ct_flex_jit_arr). It defines, with names starting ctj_ only:
 *     #define CTJ_MASK 0|1     a mask mod is present
 *     #define CTJ_SCORE 0|1    a score mod is present
 *     #define CTJ_NPG n        param-grad terms per element (0: no array has a gradient)
 *     __device__ bool ctj_mask(const ctj_arr *A, int64_t b, int64_t h, int64_t q, int64_t kv);
 *     __device__ float ctj_score(const ctj_arr *A, float s, int64_t b, int64_t h, int64_t q,
 *                                int64_t kv);
 *     __device__ float ctj_score_grad(const ctj_arr *A, float s, int64_t b, int64_t h,
 *                                     int64_t q, int64_t kv, float g, int64_t *pidx,
 *                                     float *pval);
 * (only those present; ctj_score_grad only with CTJ_SCORE). ctj_score_grad gets the score s
 * before the mod and g = dL / d score_mod(s), returns dL / ds and writes CTJ_NPG terms
 * (pidx[t]: an index into the param-grad vector, pval[t]: the value to add there; pval 0
 * adds nothing). A's entries are the bound arrays, mask mod's first then the score mod's,
 * indices already clamped into their arrays by the generated code.
 *
 * The kernels evaluate the built-in mods of ct_flex_mods as without jit and AND the compiled
 * mask into the pair mask (partial blocks only: the block mask, built on the host from the
 * same mask mod, decides empty and full blocks); a compiled score mod replaces the built-in
 * score (score must be CT_FLEX_SCORE_NONE with it). */
#define CT_FLEX_JIT_MAX_ARRAYS 32

typedef struct ct_flex_jit_arr {
    const void *data; /* device memory */
    int64_t shape[4], stride[4]; /* elements, row-major */
    int64_t numel;
    int64_t gofs; /* offset of its gradient in the param-grad vector (arrays with gradients) */
} ct_flex_jit_arr;

typedef struct ct_flex_jit {
    /* The host mods the source was generated from (the CPU backend runs these through
     * ct_flex_attention_forward / _backward; a GPU backend ignores them). */
    const struct ct_score_mod *host_score; /* NULL: no compiled score mod */
    const struct ct_mask_mod *host_mask;   /* NULL: no compiled mask mod */
    void *module; /* from flex_jit_load: the kernels with these mods, for one dtype and E */
    int narr;
    ct_flex_jit_arr arr[CT_FLEX_JIT_MAX_ARRAYS];
    float *param_grad;   /* device [param_len]: flex_bwd ADDS the arrays' gradients (NULL: not
                            wanted); deterministic (fixed-order partial sums, no atomics) */
    int64_t param_len;
    size_t grad_scratch_bytes; /* bound on the param-grad partial sums (0: the backend's) */
} ct_flex_jit;

/* Flex attention of the model's layout (ct_attn_args: q [B, T, H, E], k, v [B, T, Hk, E],
 * out [B, T, H, E], lse [B, H, T], attn.mask NULL) over a block mask (required; its q_len and
 * kv_len are T, its B / H are 1 or B / H) with the mods: the definitions of
 * ct_flex_attention_forward / _backward (a row whose keys are all masked: out 0, lse -inf,
 * gradients 0). The CPU backend's slots are those calls; the CUDA backend takes block sizes
 * 64 and 128 and head dims up to 256. */
typedef struct ct_flex_args {
    ct_attn_args attn;
    const ct_dev_block_mask *block_mask; /* a host struct whose lists are device memory */
    ct_flex_mods mods;
} ct_flex_args;

typedef struct ct_backend_ops {
    int api_version; /* CT_BACKEND_API_VERSION */
    const char *kind; /* "cpu", "cuda" */

    /* ---- device ------------------------------------------------------------------------ */
    /* Number of devices of this kind (0 with the reason in last_error when none). */
    int (*count)(int *n);
    int (*open)(int index, const ct_backend_host *host, ct_backend **out);
    void (*close)(ct_backend *b);
    const char *(*last_error)(void);
    int (*describe)(ct_backend *b, ct_backend_info *info);
    /* Device memory of `bytes` (> 0), 256-byte aligned, uninitialised; stream-ordered. */
    int (*alloc)(ct_backend *b, size_t bytes, void **out);
    void (*free)(ct_backend *b, void *p);
    int (*copy_h2d)(ct_backend *b, void *dst, const void *src, size_t bytes);
    int (*copy_d2h)(ct_backend *b, void *dst, const void *src, size_t bytes); /* waits */
    int (*copy_d2d)(ct_backend *b, void *dst, const void *src, size_t bytes);
    int (*memset0)(ct_backend *b, void *dst, size_t bytes);
    int (*sync)(ct_backend *b);

    /* ---- linear algebra ------------------------------------------------------------------ */
    /* ct_gemm_f32's contract, row-major: C[M,N] (ldc) = alpha op(A) op(B) + beta C; A and B
     * in dtype (f32 or bf16), C f32; lda/ldb/ldc row strides in elements (never 0 here). */
    int (*gemm)(ct_backend *b, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                float *C, int64_t ldc, ct_dtype dtype);

    /* ---- element-wise and rows ----------------------------------------------------------- */
    /* out[n] = a[n] + b[n] (f32; out may alias a or b). */
    int (*add)(ct_backend *b, float *out, const float *x, const float *y, int64_t n);
    /* x[n] *= s (f32). */
    int (*scale)(ct_backend *b, float *x, float s, int64_t n);
    /* dst[n] = src[n] rounded to bf16, round to nearest even (NaN stays NaN). */
    int (*to_bf16)(ct_backend *b, uint16_t *dst, const float *src, int64_t n);
    /* x[r, :] += bias for r < N, rows of C (f32). */
    int (*bias_add_rows)(ct_backend *b, float *x, const float *bias, int64_t N, int64_t C);
    /* db[c] += sum over rows r (in order) of d[r, c] (f32). */
    int (*bias_grad_rows)(ct_backend *b, float *db, const float *d, int64_t N, int64_t C);

    /* ---- normalisation, position, activation --------------------------------------------- */
    /* ct_rmsnorm_forward / _backward (f32: the model keeps activations in f32 in both of its
     * dtypes; bf16 reaches only the GEMM, loss and attention operands). */
    int (*rmsnorm_fwd)(ct_backend *b, float *out, float *rstd, const float *inp,
                       const float *weight, int64_t N, int64_t C, float eps);
    int (*rmsnorm_bwd)(ct_backend *b, float *dinp, float *dweight, const float *dout,
                       const float *inp, const float *weight, const float *rstd, int64_t N,
                       int64_t C);
    /* In-place RoPE of x [B, T, H, E] at positions 0..T-1 with inv_freq [E/2] (device memory,
     * f32): ct_rope_forward_freqs (inverse rotation when backward). The angle p * inv_freq[i]
     * is an f32 product; cos / sin of it in f32 as the CPU kernel does (within rounding). */
    int (*rope)(ct_backend *b, float *x, int64_t B, int64_t T, int64_t H, int64_t E,
                const float *inv_freq, bool backward);
    /* ct_swiglu_forward / _backward (f32). */
    int (*swiglu_fwd)(ct_backend *b, float *out, const float *inp, int64_t N, int64_t F);
    int (*swiglu_bwd)(ct_backend *b, float *dinp, const float *dout, const float *inp,
                      int64_t N, int64_t F);

    /* ---- embedding ------------------------------------------------------------------------ */
    /* out[n, :] = table[ids[n], :] (ids int32 in [0, V), checked by the caller). */
    int (*embed_fwd)(ct_backend *b, float *out, const int32_t *ids, const float *table,
                     int64_t N, int64_t V, int64_t D);
    /* dtable[ids[n], :] += dout[n, :], each row receiving its tokens in token order (no
     * atomics: the CPU's bits). */
    int (*embed_bwd)(ct_backend *b, float *dtable, const float *dout, const int32_t *ids,
                     int64_t N, int64_t V, int64_t D);

    /* ---- losses ---------------------------------------------------------------------------- */
    /* ct_cross_entropy_forward / _backward on logits [N, V] f32 with int32 targets (device),
     * options as in ct_ce_options (class_weight a device pointer; scratch_bytes ignored).
     * out->loss (and z_loss, lse when set) are device pointers. grad_scale a host float: the
     * upstream gradient of the loss (with reduction NONE, of every row's loss). */
    int (*ce_fwd)(ct_backend *b, ct_ce_outputs *out, const float *logits, const int32_t *target,
                  int64_t N, int64_t V, const ct_ce_options *o);
    int (*ce_bwd)(ct_backend *b, float *dlogits, float grad_scale, const float *logits,
                  const int32_t *target, int64_t N, int64_t V, const ct_ce_options *o);
    /* The fused linear + cross-entropy (ct_linear_cross_entropy_forward[_backward]): inputs
     * in->h, weight, bias, target device pointers (in->dtype f32 or bf16, target int32 or
     * int64); never the N x V logits in memory (scratch bounded by o->scratch_bytes, or the
     * backend's own bound when 0); grads NULL for forward only; dh and dW in a fixed order.
     * The upstream gradient: grad_rows (device f32 [N], reduction NONE only, checked by the
     * device layer) gives row n's, else grad_scale (a host float) is the loss's (MEAN / SUM)
     * or every row's (NONE). flags: CT_LCE_* of ctorch/device.h (CT_LCE_F32_GRADS: bf16
     * inputs keep the logits' gradient in f32 for the gradient GEMMs; without it a GPU rounds
     * it to bf16 and runs bf16 GEMMs; the CPU backend always keeps f32). */
    int (*lce)(ct_backend *b, ct_ce_outputs *out, ct_lce_grads *grads, float grad_scale,
               const float *grad_rows, unsigned flags, const ct_lce_inputs *in,
               const ct_ce_options *o);

    /* ---- attention ----------------------------------------------------------------------- */
    int (*sdpa_fwd)(ct_backend *b, const ct_attn_args *a);
    int (*sdpa_bwd)(ct_backend *b, const ct_attn_args *a, const ct_attn_grads *g);

    /* ---- optimizer ----------------------------------------------------------------------- */
    /* ct_adamw_step's update of n values (t = step, 1-based; hyper-parameters as there). */
    int (*adamw)(ct_backend *b, float *param, const float *grad, float *m, float *v, int64_t n,
                 int64_t step, float lr, float beta1, float beta2, float eps, float weight_decay);
    /* *out (device, one double) = sum of g[i]^2 over n values, in double, blocks of 16384
     * values summed in order and the block sums added in block order (ct_grad_norm's sum). */
    int (*sumsq)(ct_backend *b, double *out, const float *g, int64_t n);

    /* ---- FlexAttention (added in version 1 before its release; see ct_flex_args) --------- */
    /* out and lse (required) from q, k, v. */
    int (*flex_fwd)(ct_backend *b, const ct_flex_args *a);
    /* dq, dk, dv (each may be NULL) from q, k, v, out, lse and g->dout: deterministic (fixed
     * order sums, no atomics); GQA's kv heads sum their query heads in head order. */
    int (*flex_bwd)(ct_backend *b, const ct_flex_args *a, const ct_attn_grads *g);

    /* ---- compiled mods (added in version 1 before its release; see ct_flex_jit) ---------- */
    /* The compiler's identity for cache keys ("nvrtc 13.0 sm_90a", ...; stable for one
     * compiler and device model): written into out (cap bytes, NUL-terminated). */
    int (*flex_jit_identity)(ct_backend *b, char *out, size_t cap);
    /* Compile the prelude, `source` (the mods, above) and the flex kernels for q / k / v of
     * `dtype` and head dim E into a loadable image: *image malloc()ed (the caller free()s),
     * *len bytes. A compile error answers CT_EINTERNAL with the compiler's log (a bug of the
     * generated source); a missing compiler CT_EUNSUPPORTED naming what was looked for. */
    int (*flex_jit_build)(ct_backend *b, const char *source, ct_dtype dtype, int64_t E,
                          void **image, size_t *len);
    /* Load an image of flex_jit_build (from this call or the cache: check it, never trust
     * it blindly: a damaged image answers CT_EFORMAT) into *module for ct_flex_jit.module. */
    int (*flex_jit_load)(ct_backend *b, const void *image, size_t len, void **module);
    void (*flex_jit_unload)(ct_backend *b, void *module);
} ct_backend_ops;

/* The entry point a backend library exports (see the top of this file). */
typedef int (*ct_backend_entry_fn)(int api_version, const ct_backend_ops **ops);

#ifdef __cplusplus
}
#endif
#endif
