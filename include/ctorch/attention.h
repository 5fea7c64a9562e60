/*
 * ctorch/attention.h - FlexAttention on the CPU: block masks, mask and score mods, a tiled
 * forward, a deterministic backward, and dense scaled-dot-product attention (SDPA).
 *
 * Shapes (PyTorch's): q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev], out [B, Hq, L, Ev],
 * lse [B, Hq, L]. Hq must be a multiple of Hkv (grouped-query attention: query head h reads
 * key/value head h / (Hq / Hkv)). Tensors are ct_tensor views with any strides, but the last
 * dim must be contiguous (stride 1). q, k, v share one dtype, f32 or bf16 (bf16 is computed
 * with f32 accumulation); out, dout and the gradients are f32 or that dtype.
 *
 * For query i and key j:  s = scale * q_i . k_j;  s = score_mod(s, b, h, i, j);
 * s = -inf where mask_mod(b, h, i, j) is false;  out_i = softmax_j(s) v.  A row whose keys are
 * all masked gives out = 0 and lse = -inf (its gradients are 0).
 *
 * A block mask splits the L x S grid into blocks of block_size x block_size and lists, per
 * (b, h, query block), the key blocks that are FULL (attended without evaluating the mask) and
 * PARTIAL (the mask is evaluated inside); all other blocks are skipped. Transposed lists per
 * key block drive the backward. Built-in masks classify blocks from their structure in O(1)
 * each; any other mask is evaluated tile by tile, in parallel, never as a whole L x S array.
 *
 * Kernels follow FlashAttention-2: a query tile visits its key tiles with an online softmax;
 * tile products are AVX2 micro-kernels (scalar fallback). The backward recomputes the
 * probabilities from the lse in two passes, one owning each key block (dK, dV), one owning each
 * query block (dQ and score-mod parameter gradients), each summing in a fixed order: the
 * gradients are bitwise identical across runs and thread counts. It is the only backward.
 */
#ifndef CTORCH_ATTENTION_H
#define CTORCH_ATTENTION_H

#include "ctorch/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tiles and callbacks --------------------------------------------------------------- */
/* Mods are C callbacks over a tile, not one call per element, so they can vectorise. They are
 * called concurrently from the library's threads on disjoint tiles, must be pure functions of
 * their arguments (the results, and their determinism, depend on it) and cannot fail. */

/** A rectangle of the score grid handed to a mod: queries q0 .. q0+nq-1 and keys
 *  kv0 .. kv0+nkv-1 of batch b and query head h. Element (i, j) of the tile buffer (query
 *  q0+i, key kv0+j) lives at index i * q_stride + j * kv_stride. */
typedef struct ct_attn_tile {
    int64_t b, h;
    int64_t q0, nq;
    int64_t kv0, nkv;
    int64_t q_stride, kv_stride;
} ct_attn_tile;

/** What a mask is over one block of the grid. */
typedef enum ct_block_kind {
    CT_BLOCK_EMPTY = 0,   /**< every pair masked: the block is skipped */
    CT_BLOCK_PARTIAL = 1, /**< some pairs masked (or not known): the mask is evaluated inside */
    CT_BLOCK_FULL = 2,    /**< no pair masked: attended without evaluating the mask */
    CT_BLOCK_UNKNOWN = 3, /**< a classifier's answer "evaluate the tile to find out" */
} ct_block_kind;

/** Fill keep (tile layout) with 1 where query may attend key, 0 where it may not. */
typedef void (*ct_mask_tile_fn)(void *ctx, const ct_attn_tile *t, uint8_t *keep);

/** Classify the block of queries [q0, q0+nq) x keys [kv0, kv0+nkv) of (b, h). EMPTY and FULL
 *  must be exact; PARTIAL is always a safe answer; UNKNOWN asks for tile evaluation. */
typedef ct_block_kind (*ct_mask_block_fn)(void *ctx, int64_t b, int64_t h, int64_t q0, int64_t nq,
                                          int64_t kv0, int64_t nkv);

/** A mask_mod. Fill the fields for a mask of your own, or take a built-in below. */
typedef struct ct_mask_mod {
    ct_mask_tile_fn tile;       /**< required */
    ct_mask_block_fn block;     /**< optional O(1) classifier; NULL: every block is evaluated */
    void *ctx;                  /**< passed to the callbacks */
    void (*destroy)(void *ctx); /**< called by ct_mask_mod_free; NULL when ctx is not owned */
    bool uses_b;                /**< false: the mask is the same for every batch (broadcast) */
    bool uses_h;                /**< false: the mask is the same for every head (broadcast) */
} ct_mask_mod;

/** Edit a tile of scores in place: s = score_mod(s, b, h, q, kv). */
typedef void (*ct_score_tile_fn)(void *ctx, const ct_attn_tile *t, float *s);

/** Backward of a score_mod over a tile: s holds the scores before the mod, g the gradient
 *  with respect to the modded scores; overwrite g with the gradient with respect to s, and
 *  when dparam != NULL ADD the parameters' gradients into dparam[0 .. param_len) (a buffer no
 *  other thread uses meanwhile). Called on elements that may be masked (their g is 0). */
typedef void (*ct_score_grad_fn)(void *ctx, const ct_attn_tile *t, const float *s, float *g,
                                 float *dparam);

/** A score_mod: forward tile callback, its derivative, and optional parameters. */
typedef struct ct_score_mod {
    ct_score_tile_fn fwd;  /**< required */
    ct_score_grad_fn grad; /**< NULL: the derivative is 1 and there are no parameters */
    void *ctx;
    void (*destroy)(void *ctx); /**< called by ct_score_mod_free; NULL when ctx is not owned */
    float *param_grad;          /**< [param_len] gradients are ADDED here; NULL: not wanted */
    int64_t param_len;
} ct_score_mod;

/* ---- built-in mask mods (ctx owned: release with ct_mask_mod_free) ------------------------ */

/** q >= kv. */
CT_API ct_status ct_mask_mod_causal(ct_mask_mod *out);
/** causal: 0 <= q - kv <= window; two-sided (causal false): |q - kv| <= window. window >= 0. */
CT_API ct_status ct_mask_mod_sliding_window(int64_t window, bool causal, ct_mask_mod *out);
/** Prefix-LM: kv < prefix_len or q >= kv. prefix_len >= 0. */
CT_API ct_status ct_mask_mod_prefix_lm(int64_t prefix_len, ct_mask_mod *out);
/** Document / jagged masking: q_doc[b][q] == kv_doc[b][kv]. q_doc is [batch, q_len] and kv_doc
 *  [batch, kv_len] (kv_doc NULL: the same array as q_doc, kv_len must equal q_len); batch 1
 *  shares the ids across batches. The ids are copied. Non-decreasing ids (packed sequences)
 *  classify blocks in O(1); other ids are evaluated per block. Combine with causal through
 *  ct_mask_mod_and for causal document masking. A block mask made from it (alone or inside
 *  and/or/not) needs batch == 1 or batch >= B, q_len >= Q_LEN and kv_len >= KV_LEN: else
 *  ct_block_mask_create fails with CT_EINVAL (the ids would be read past their end). */
CT_API ct_status ct_mask_mod_document(const int32_t *q_doc, const int32_t *kv_doc, int64_t batch,
                                      int64_t q_len, int64_t kv_len, ct_mask_mod *out);
/** Every pair attends (PyTorch's noop_mask). */
CT_API ct_status ct_mask_mod_noop(ct_mask_mod *out);
/** Conjunction / disjunction of n >= 1 mods. The children are referenced, not owned: keep
 *  them alive until this mod (and block masks made from it) are freed. */
CT_API ct_status ct_mask_mod_and(const ct_mask_mod *mods, int n, ct_mask_mod *out);
CT_API ct_status ct_mask_mod_or(const ct_mask_mod *mods, int n, ct_mask_mod *out);
/** Negation of m (referenced, not owned). */
CT_API ct_status ct_mask_mod_not(const ct_mask_mod *m, ct_mask_mod *out);
/** Release a mod's context (calls destroy) and zero the struct. NULL is a no-op. */
CT_API void ct_mask_mod_free(ct_mask_mod *m);

/* ---- built-in score mods (ctx owned: release with ct_score_mod_free) ---------------------- */

/** Soft-capping (Gemma 2): s -> cap * tanh(s / cap). cap > 0. */
CT_API ct_status ct_score_mod_softcap(float cap, ct_score_mod *out);
/** ALiBi: s + slope[h] * (kv - q) for num_heads query heads. slopes NULL: the standard
 *  2^(-8 (h+1) / num_heads); otherwise num_heads values (copied). */
CT_API ct_status ct_score_mod_alibi(int64_t num_heads, const float *slopes, ct_score_mod *out);
/** Relative position bias: s + table[h][clamp(q - kv + offset, 0, table_len - 1)].
 *  table is [num_heads, table_len] (num_heads 0: one row [table_len] shared by all heads);
 *  referenced, not copied, so it can be a trained parameter. dtable (same shape, or NULL)
 *  receives the table's gradient in the backward (accumulated +=). */
CT_API ct_status ct_score_mod_relative_bias(const float *table, int64_t num_heads,
                                            int64_t table_len, int64_t offset, float *dtable,
                                            ct_score_mod *out);
/** Release a mod's context (calls destroy) and zero the struct. NULL is a no-op. */
CT_API void ct_score_mod_free(ct_score_mod *m);

/* ---- block masks ------------------------------------------------------------------------- */

/** A block mask (read-only for users). Rows r = (b * H + h) * num_q_blocks + qb list key blocks
 *  in ascending order: partial ones kv_idx[kv_ptr[r] .. kv_ptr[r+1]) and full ones
 *  full_kv_idx[full_kv_ptr[r] .. full_kv_ptr[r+1]). Columns c = (b * H + h) * num_kv_blocks + kb
 *  list query blocks the same way (q_ptr/q_idx, full_q_ptr/full_q_idx). */
typedef struct ct_block_mask {
    int64_t B, H; /**< 1 where the mask broadcasts */
    int64_t q_len, kv_len, block_size;
    int64_t num_q_blocks, num_kv_blocks;
    ct_mask_mod mask_mod;          /**< a copy: its ctx must outlive the block mask */
    int64_t *kv_ptr, *full_kv_ptr; /**< [B * H * num_q_blocks + 1] */
    int32_t *kv_idx, *full_kv_idx;
    int64_t *q_ptr, *full_q_ptr; /**< [B * H * num_kv_blocks + 1] */
    int32_t *q_idx, *full_q_idx;
    /** With store_partial: the evaluated mask of each partial block, block_size^2 bytes per
     *  kv_idx entry at tiles + e * block_size^2, key-major (element (i, j) at
     *  j * block_size + i); q_tile[e'] is the kv_idx entry of q_idx entry e'. Else NULL. */
    uint8_t *tiles;
    int64_t *q_tile;
    size_t bytes; /**< bytes held by this mask */
} ct_block_mask;

/** Options of ct_block_mask_create_ex. */
typedef struct ct_block_mask_options {
    int64_t block_size; /**< 1 .. 1024; default 128 */
    bool store_partial; /**< keep each partial block's evaluated mask so attention never calls
                             mask_mod again (for costly masks, e.g. Python); default false */
} ct_block_mask_options;

/** The defaults listed above. */
CT_API ct_block_mask_options ct_block_mask_options_default(void);

/** Build the block mask of `mask` for a batch of B, H heads, q_len queries and kv_len keys
 *  (all >= 1) with square blocks of block_size (1 .. 1024). B (H) becomes 1 when the mask does
 *  not use b (h). *out is allocated; free it with ct_block_mask_free. Built-in masks cost
 *  O(blocks); masks without a classifier are evaluated block by block in parallel. */
CT_API ct_status ct_block_mask_create(const ct_mask_mod *mask, int64_t B, int64_t H, int64_t q_len,
                                      int64_t kv_len, int64_t block_size, ct_block_mask **out);
/** ct_block_mask_create with options (NULL: the defaults). */
CT_API ct_status ct_block_mask_create_ex(const ct_mask_mod *mask, int64_t B, int64_t H,
                                         int64_t q_len, int64_t kv_len,
                                         const ct_block_mask_options *opt, ct_block_mask **out);
/** Free a block mask (not its mask_mod's ctx). NULL is a no-op. */
CT_API void ct_block_mask_free(ct_block_mask *m);
/** Write the block kinds into out[B][H][num_q_blocks][num_kv_blocks] (ct_block_kind values). */
CT_API ct_status ct_block_mask_to_dense(const ct_block_mask *m, uint8_t *out);

/* ---- FlexAttention ---------------------------------------------------------------------- */

/** Options of the flex attention calls. */
typedef struct ct_flex_options {
    float scale;                   /**< score scale; 0 (default) means 1 / sqrt(E) */
    const ct_score_mod *score_mod; /**< NULL (default): none */
    size_t grad_scratch_bytes;     /**< cap on the partial sums of score-mod parameter
                                        gradients; default 64 MiB */
} ct_flex_options;

/** The defaults listed above. */
CT_API ct_flex_options ct_flex_options_default(void);

/** Forward. mask NULL: every pair attends. mask's q_len / kv_len must be L / S and its B / H
 *  either 1 or B / Hq. out [B, Hq, L, Ev] is written; lse [B, Hq, L] f32 is written when not
 *  NULL (keep it for the backward). opt NULL: the defaults. */
CT_API ct_status ct_flex_attention_forward(const ct_tensor *q, const ct_tensor *k,
                                           const ct_tensor *v, const ct_block_mask *mask,
                                           const ct_flex_options *opt, ct_tensor *out,
                                           ct_tensor *lse);

/** Backward from the forward's out and lse. dout [B, Hq, L, Ev]; dq, dk, dv (shapes of q, k, v)
 *  are written; any may be NULL to skip it (dk and dv come from one pass, dq from the other).
 *  Score-mod parameter gradients are added into opt->score_mod->param_grad when set. */
CT_API ct_status ct_flex_attention_backward(const ct_tensor *q, const ct_tensor *k,
                                            const ct_tensor *v, const ct_tensor *out,
                                            const ct_tensor *lse, const ct_tensor *dout,
                                            const ct_block_mask *mask, const ct_flex_options *opt,
                                            ct_tensor *dq, ct_tensor *dk, ct_tensor *dv);

/* ---- dense scaled-dot-product attention --------------------------------------------------- */

/** Options of ct_sdpa_forward / ct_sdpa_backward
 * (torch.nn.functional.scaled_dot_product_attention). */
typedef struct ct_sdpa_options {
    float scale;                /**< 0 (default): 1 / sqrt(E) */
    bool is_causal;             /**< q >= kv (top-left aligned, as PyTorch); default false */
    const ct_tensor *attn_mask; /**< NULL (default), or broadcastable to [B, Hq, L, S]: bool/u8
                                     (nonzero = attend) or f32 added to the scores (constant:
                                     no gradient). Not with is_causal. */
} ct_sdpa_options;

/** The defaults listed above. */
CT_API ct_sdpa_options ct_sdpa_options_default(void);

/** Dense attention with the flex kernels: every key block is visited (is_causal skips the
 *  blocks above the diagonal), a mask tensor is read for every score. Shapes as above. */
CT_API ct_status ct_sdpa_forward(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                                 const ct_sdpa_options *opt, ct_tensor *out, ct_tensor *lse);

/** Backward of ct_sdpa_forward (lse required); dq, dk, dv as in ct_flex_attention_backward. */
CT_API ct_status ct_sdpa_backward(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                                  const ct_tensor *out, const ct_tensor *lse, const ct_tensor *dout,
                                  const ct_sdpa_options *opt, ct_tensor *dq, ct_tensor *dk,
                                  ct_tensor *dv);

#ifdef __cplusplus
}
#endif
#endif
