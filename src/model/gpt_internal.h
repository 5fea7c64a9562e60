/* Private layout of the GPT model, shared by the model and the trainer. */
#ifndef CT_MODEL_GPT_INTERNAL_H
#define CT_MODEL_GPT_INTERNAL_H

#include "core/internal.h"
#include "device/device_internal.h"
#include "ctorch/attention.h"
#include "ctorch/loss.h"
#include "ctorch/model.h"
#include "ctorch/ops.h"

/* One parameter tensor of the size table: [r] or [r, c] floats at a flat offset. */
typedef struct gpt_tensor {
    char name[96];
    int ndim;
    int64_t shape[2];
    int64_t offset, numel;
    bool decay;
} gpt_tensor;

/* The parameter tensors of configuration c (checked) without a model, for the checkpoint
 * checks that run before anything the model's size is allocated: a new table of *n entries
 * in the model's order (names, shapes; offsets as in the model), ct_free it. Its size is
 * bounded by the layer cap (a few KB per layer), not by the tensors' sizes. */
ct_status gpt_tensor_table(const ct_gpt_config *c, gpt_tensor **tensors, int *n);

/* A weight matrix left in a mapped file as bf16 or f16 bits (ct_hf_map_model): p NULL when
 * the matrix is f32 (its float view is used); otherwise the float view is NULL. Only the
 * inference paths read these (gpt_linear, gpt_embed); a mapped model never trains. */
typedef struct gpt_half {
    const uint16_t *p;
    ct_dtype dt; /* CT_DTYPE_BF16 or CT_DTYPE_F16 */
} gpt_half;

/* Views of one layer's tensors inside a flat array (parameters or gradients). */
typedef struct gpt_layer {
    float *wq, *wk, *wv, *wo, *wgu, *wdown, *norm1, *norm2;
    float *wup;              /* the up rows [F, C]: wgu + F C unless pointed elsewhere */
    float *bq, *bk, *bv, *bo; /* NULL unless qkv_bias / o_bias */
    gpt_half hq, hk, hv, ho, hgu, hup, hdown; /* mapped bf16 / f16 matrices (p NULL: f32) */
} gpt_layer;

typedef struct gpt_weights {
    float *emb, *out, *norm; /* out == emb when tied */
    gpt_half hemb, hout;     /* mapped bf16 / f16 embedding and head (p NULL: f32) */
    gpt_layer *layer;
} gpt_weights;

/* Views into the activation allocation. Per-layer arrays hold n_layer blocks of B*T rows. */
typedef struct gpt_acts {
    int32_t *inp, *tgt, *doc; /* [N] */
    float *resid;             /* [L + 1][N, C]: the residual stream */
    float *x2;                /* [L][N, C]: after the attention block */
    float *ln1, *rstd1, *q, *k, *v, *att,
        *lse;                     /* [L][N, C], [L][N], [L][N, H E], .., [L][B, H, T] */
    float *ln2, *rstd2, *gu, *hb; /* [L][N, C], [L][N], [L][N, 2F], [L][N, F] */
    float *lnf, *rstdf;           /* [N, C], [N] */
    float *dres, *dtmp, *dln, *dq, *dk, *dv, *datt, *dgu, *dh; /* backward scratch, one layer */
    float *logits, *dlogits; /* [N, V] each: the unfused head only */
    uint16_t *xb, *dyb; /* dtype bf16 only: a GEMM's activation operand [N, max(C, HE, F)]
                           and its output gradient [N, max(C, HE, 2F)], rounded to bf16 */
    uint8_t *dmask;          /* [B, T, T]: dense attention with a window or documents only */
    float *scal;             /* [4]: a loss written on the device, read back once */
} gpt_acts;

struct ct_gpt {
    ct_gpt_config cfg;
    ct_gpt_options opt;
    ct_device *dev; /* opt.device, or the CPU: every op of the model runs through its table */
    size_t pbytes;  /* bytes of params (and of grads) */
    float *inv_freq_dev; /* the RoPE frequencies on the device (== inv_freq on the CPU) */
    int32_t *stage;      /* a GPU model: the host staging of a batch's inputs and targets */
    gpt_tensor *tensors;
    int ntensors;
    int64_t nparams, ndecay;
    float *params, *grads; /* one allocation each */
    gpt_weights w, g;
    void *acts; /* one allocation */
    size_t acts_bytes;
    gpt_acts a;
    ct_mask_mod base_mask, doc_mask, and_mask;
    ct_mask_mod causal_mask, user_mask; /* with cfg.mask_mod: base_mask = causal AND user */
    ct_score_mod user_score;            /* cfg.score_mod compiled (fwd NULL: none) */
    ct_dev_flex_jit *fj;       /* a GPU model with compiled mods: their device code */
    const struct ct_flex_jit *fj_mods; /* fj bound (the model's mods bind no arrays) */
    ct_block_mask *bm;
    ct_dev_block_mask dbm; /* a GPU model: bm's lists on the device (flex_fwd / flex_bwd) */
    int64_t bm_T; /* T of the cached causal block mask (0: none cached) */
    float *inv_freq; /* [E / 2] RoPE inverse frequencies (ct_gpt_rope_inv_freq) */
    bool mapped;     /* weight views point into a mapped file (ct_hf_map_params): inference only */
    float *own;      /* a mapped model without parameter arrays: the tensors converted to f32
                        (norms, biases, anything misaligned in its file) */
    size_t own_bytes;
    uint16_t *wbf; /* dtype bf16: the matrices' bf16 copy (params[0, ndecay) rounded) */
    bool wbf_held; /* set by the trainer while a step's micro-batches or an evaluation run
                      (it refreshed wbf just before); otherwise every forward refreshes it (the
                      f32 weights may have been written since) */
    /* dtype bf16 without parameters of its own (gpt_create_sharded): wbf is NULL and the bf16
     * copy of a matrix is found through wbf_of(wbf_ctx, w) */
    const uint16_t *(*wbf_of)(const void *ctx, const float *w);
    const void *wbf_ctx;
    double grad_rows; /* > 0 (the distributed trainer, host memory): gpt_head_backward gives
                         every row the loss gradient grad_scale / grad_rows, the one-process
                         model's for a batch of grad_rows rows of which the call holds some
                         (its *loss stays the mean over its own rows); 0: the mean's */
};

/* ---- bf16 mixed precision (ct_gpt_options.dtype == CT_DTYPE_BF16) --------------------------- */
static inline bool gpt_bf16(const ct_gpt *m)
{
    return m->opt.dtype == CT_DTYPE_BF16;
}
/* The bf16 copy of matrix w (a view into m->params, or one the owner of a sharded model's
 * parameters bound: wbf_of). */
static inline const uint16_t *gpt_wb(const ct_gpt *m, const float *w)
{
    return m->wbf_of ? m->wbf_of(m->wbf_ctx, w) : m->wbf + (w - m->params);
}
/* dst[0, n) = src rounded to bf16 (round to nearest even) on the model's device. */
ct_status gpt_to_bf16(const ct_gpt *m, uint16_t *dst, const float *src, int64_t n);
/* Round the f32 matrices into m->wbf (CT_EINVAL when the model has no parameters of its own). */
ct_status gpt_bf16_refresh(ct_gpt *m);
/* out[N, V] (row stride ldo) = xb[N, D] (bf16) W[V, D]^T (bf16 copy of w) (+ out when
 * accumulate) + bias (f32, may be NULL; added first as ct_linear_forward does). */
ct_status gpt_linear_bf16(float *out, int64_t ldo, const uint16_t *xb, const ct_gpt *m,
                          const float *w, const float *bias, int64_t N, int64_t D, int64_t V,
                          bool accumulate);

/* ---- one product of a layer, in the model's dtype (src/model/gpt_linear.c) ----------------
 * The block forward and backward (and the head's logits) do every matrix product through
 * these, so one layer serves both dtypes: f32 multiplies the f32 activation by the f32 (or
 * mapped bf16 / f16) weights as gpt_linear does; bf16 (gpt_bf16) multiplies the activation
 * rounded to bf16 by the weights' bf16 copy (gpt_wb), accumulating in f32. */
typedef struct gpt_input {
    const float *f;    /* the f32 activation [N, D] */
    const uint16_t *b; /* bf16: f rounded into m->a.xb (NULL in f32) */
} gpt_input;
/* The input x [n values] of the products that follow: bf16 rounds it into m->a.xb (valid
 * until the next call), f32 only points at it. */
ct_status gpt_layer_input(const ct_gpt *m, const float *x, int64_t n, gpt_input *in);
/* out[N, V] (row stride ldo) = x W^T (+ out when accumulate) + bias (may be NULL), W [V, D]
 * the matrix w of the model (h: its mapped bits, f32 only). */
ct_status gpt_layer_linear(const ct_gpt *m, float *out, int64_t ldo, gpt_input x, const float *w,
                           gpt_half h, const float *bias, int64_t N, int64_t D, int64_t V,
                           bool accumulate);
/* Its backward for dy [N, V] (row stride ldy): gw[V, D] += dy^T x (gw NULL: skipped) and
 * dx[N, D] = dy W (+ dx when dx_accumulate; dx NULL: skipped). bf16 rounds dy into m->a.dyb. */
ct_status gpt_layer_linear_backward(ct_gpt *m, float *dx, bool dx_accumulate, float *gw,
                                    const float *dy, int64_t ldy, gpt_input x, const float *w,
                                    int64_t N, int64_t D, int64_t V);

/* True when the model's memory is host memory (the CPU device): the host-side paths (mapped
 * half weights, GEMV, document ids and masks built in place) apply. */
static inline bool gpt_host(const ct_gpt *m)
{
    return ct_device_get_kind(m->dev) == CT_DEVICE_CPU;
}
/* Run slot `slot` of the model's device (CT_DEV of device_internal.h). */
#define GPT_DEV(m, slot, ...) CT_DEV((m)->dev, slot, __VA_ARGS__)

/* Head dim of the model (cfg.head_dim or d_model / n_head). */
static inline int64_t gpt_E(const ct_gpt *m)
{
    return ct_gpt_head_dim(&m->cfg);
}

/* ---- linear layers on mapped bf16 / f16 weights (src/model/gpt_linear.c) -------------------
 * out[N, V] (row stride ldo) = inp[N, D] W^T (+ out when accumulate) + bias[V] (may be NULL),
 * for W [V, D] (row stride D): f32 `w` when h.p is NULL (ct_linear_forward / ct_gemm_f32, as
 * before), else the bf16 / f16 bits h.p. Half weights: gemv (and N <= GPT_GEMV_MAX) reads the
 * bits directly, row by row (the f32 GEMV's sums, gpt_gemv_f32); otherwise fixed panels of
 * weight rows are converted into a per-thread scratch (ct_alloc'ed for the call: 2 MiB for
 * D <= 32768, 4 MiB at most) and multiplied with ct_gemm_f32. Panel sizes depend on D alone:
 * the same bits for any thread count. gemv: the KV cache's decode (N <= GPT_GEMV_MAX). */
#define GPT_GEMV_MAX 4
ct_status gpt_linear(float *out, int64_t ldo, const float *inp, const float *w, gpt_half h,
                     const float *bias, int64_t N, int64_t D, int64_t V, bool accumulate,
                     bool gemv);
/* The f32 GEMV of gpt_linear: out[N, V] (ldo) = inp[N, D] W[V, D]^T (row stride ldw) (+ out),
 * N <= GPT_GEMV_MAX, rows of W split across threads, 8 partial sums per row in a fixed order. */
void gpt_gemv_f32(float *out, int64_t ldo, const float *inp, const float *w, int64_t ldw,
                  int64_t N, int64_t D, int64_t V, bool accumulate);
/* out[N, D] = table[ids[n]] for int32 ids checked against V, the table f32 (w) or half (h). */
ct_status gpt_embed(float *out, const int32_t *ids, const float *w, gpt_half h, int64_t N,
                    int64_t V, int64_t D);

/* ---- building blocks for running the model one block at a time (src/dist) ----------------
 * ct_gpt_forward_backward is exactly: gpt_load_batch, gpt_embed_forward, gpt_block_forward for
 * l = 0 .. L-1, gpt_final_norm_forward, gpt_head_backward, gpt_block_backward for l = L-1 .. 0,
 * gpt_embed_backward (ct_gpt_forward ends with gpt_head_loss instead). Each reads the
 * parameter views m->w and accumulates into the gradient views m->g that the step touches, so
 * a caller may point them (gpt_bind) at buffers it fills block by block. */

/* Create a model; own_params false: no parameter or gradient arrays (m->params, m->grads
 * NULL, views unset: bind them with gpt_bind before running a block). */
ct_status gpt_create(const ct_gpt_config *cfg, const ct_gpt_options *opt, bool own_params,
                     ct_gpt **out);
/* The model of a sharded or replicated trainer (src/dist): gpt_create without parameters of
 * its own; in dtype bf16 the caller holds the bf16 copies of the weights it binds (rounded,
 * round to nearest even, from the f32 weights it gathered or replicates) and wbf_of(ctx, w)
 * gives the copy of the matrix that a bound view w points into (wbf_of may be NULL in f32). */
ct_status gpt_create_sharded(const ct_gpt_config *cfg, const ct_gpt_options *opt,
                             const uint16_t *(*wbf_of)(const void *ctx, const float *w),
                             const void *ctx, ct_gpt **out);
/* Point the views of w at ptrs[k] for tensor k (0 .. ntensors-1; unused ones may be NULL). */
void gpt_bind(const ct_gpt *m, gpt_weights *w, float *const *ptrs);
/* The initial values of tensor i (ct_gpt_init's, from r advanced over the whole tensor);
 * rows [row0, row1) of them into dst. */
void gpt_init_tensor(const ct_gpt *m, int i, ct_rng *r, int64_t row0, int64_t row1, float *dst);
/* Allocate the activations if they are not yet (the first forward that needs them). */
ct_status gpt_acts_ready(ct_gpt *m);
/* Validate and copy a batch of B sequences of T + 1 tokens into the activations. */
ct_status gpt_load_batch(ct_gpt *m, const int32_t *tokens, int64_t B, int64_t T, const char *fn);
ct_status gpt_embed_forward(ct_gpt *m, int64_t B, int64_t T);          /* w.emb */
ct_status gpt_block_forward(ct_gpt *m, int64_t l, int64_t B, int64_t T); /* w.layer[l] */
ct_status gpt_final_norm_forward(ct_gpt *m, int64_t B, int64_t T);     /* w.norm */
ct_status gpt_head_loss(ct_gpt *m, int64_t B, int64_t T, float *loss); /* w.out */
/* w.out, w.norm -> g.out, g.norm */
ct_status gpt_head_backward(ct_gpt *m, int64_t B, int64_t T, float grad_scale, float *loss);
ct_status gpt_block_backward(ct_gpt *m, int64_t l, int64_t B, int64_t T); /* -> g.layer[l] */
ct_status gpt_embed_backward(ct_gpt *m, int64_t B, int64_t T);            /* -> g.emb */

/* ---- one block forward for the trainer and the KV cache -------------------------------------
 * gpt_block_run is the only forward of a block (rmsnorm, q / k / v products, RoPE, attention,
 * wo, rmsnorm, gate-up, SwiGLU, down): gpt_block_forward runs it on the training activations of
 * layer l, the KV cache (src/model/kvcache.c) on its chunk scratch. `io` says where each
 * intermediate lives and which attention runs:
 * - training (kv NULL): attention over the batch (FlexAttention with the model's block mask,
 *   or the device's sdpa slot), writing lse for the backward; products through
 *   gpt_layer_linear in the model's dtype.
 * - cached (kv set): k and v appended to the cache at positions kv->past .. past + T - 1 of
 *   every row, then attention of the T new queries over positions 0 .. past + T - 1
 *   (gpt_kv_attention); products f32 through gpt_linear (its GEMV for B T <= GPT_GEMV_MAX
 *   rows: the decode; mapped half weights read in place), whatever the model's dtype.
 * x2 and out may equal x (the residual updated in place); a separate x2 / out receives a copy
 * of its input first. Every op goes through the device table except three host-only parts of
 * the cached mode: RoPE at given positions (the rope slot takes positions 0 .. T-1 only), the
 * gpt_linear products and gpt_kv_attention's decode / flex attention. A cache on another
 * device needs slots for those (and its memory), not another block forward. */
typedef struct gpt_kv {
    float *k, *v;            /* this layer's cache [B][max_len][Hkv E], a row's positions
                                contiguous */
    const int32_t *doc;      /* [B][max_len] document ids of the cached tokens (NULL: none) */
    int64_t max_len, past;   /* positions a row holds; the first position of this call */
    const ct_block_mask *bm; /* FlexAttention over the cache (past + T keys, the cache's mask);
                                NULL: the decode pass (a few queries) */
} gpt_kv;

typedef struct gpt_block_io {
    int64_t B, T;              /* B rows of T positions: N = B T rows of activations */
    float *x, *x2, *out;       /* [N, C]: input, after attention, after the MLP */
    float *ln1, *rstd1, *ln2, *rstd2; /* [N, C], [N] each */
    float *q, *k, *v, *att;    /* [N, H E], [N, Hkv E], [N, Hkv E], [N, H E] */
    float *gu, *h;             /* [N, 2F], [N, F] */
    const int32_t *pos;        /* [T] RoPE positions (NULL: 0 .. T-1) */
    float *lse;                /* training: [B, H, T] the attention's log-sum-exp (NULL: cached) */
    const gpt_kv *kv;          /* NULL: training attention; else the cached attention */
} gpt_block_io;

/* One block forward with the weights w (see above). */
ct_status gpt_block_run(const ct_gpt *m, const gpt_layer *w, const gpt_block_io *io);

/* The cached attention of one block (src/model/kvcache.c): append k, v [B, T, Hkv, E] to the
 * cache kv at positions past .. past + T - 1, then att [B, T, H, E] = attention of q [B, T, H,
 * E] over the cache (causal from position past, the model's window and document mask): the
 * decode pass when kv->bm is NULL, FlexAttention with kv->bm otherwise. Host memory only
 * today (a cache on a GPU would add a decode-attention slot here). */
ct_status gpt_kv_attention(const ct_gpt *m, const gpt_kv *kv, const float *q, const float *k,
                           const float *v, float *att, int64_t B, int64_t T);

/* The trainer's data order (train.c): the next micro-batch of B windows of T + 1 tokens from
 * position *pos, starting a new epoch at a random offset in [0, T) when the stream runs out. */
void gpt_next_batch(const int32_t *train, int64_t n_train, int64_t B, int64_t T, int64_t *pos,
                    int64_t *epoch, ct_rng *rng, int32_t *batch);
/* ct_trainer_create's checks of the options (seq 0 becomes the context) and of the tokens,
 * with fn naming the caller in the messages. */
ct_status gpt_check_train_options(const ct_gpt_config *c, ct_train_options *o, const char *fn);

/* ct_clip_grad_norm on the model's device (its sumsq and scale slots; on the CPU the same bits):
 * *norm = sqrt(sum g^2); when max_norm > 0 and the norm exceeds it, g *= max_norm / (norm +
 * 1e-6). One read-back (the norm) on a GPU. */
ct_status gpt_clip_grad_norm(ct_gpt *m, float *g, int64_t n, float max_norm, double *norm);

/* A checkpoint's metadata by key (NULL when absent), from a tensor file or an index. */
typedef const char *(*gpt_meta_get)(const void *src, const char *key);
/* The trainer state of a checkpoint, the one parser for every trainer (single-process and
 * sharded): "step", "epoch", "data_pos" integers in [0, 2^63) (a larger one is refused, never
 * clamped) and "rng" 64 hex digits, not all zero. CT_EFORMAT names the field. */
ct_status gpt_read_trainer_state(gpt_meta_get get, const void *src, int64_t *step,
                                 int64_t *epoch, int64_t *pos, ct_rng *rng);
ct_status gpt_check_tokens(const int32_t *x, int64_t n, int64_t V, const char *what,
                           const char *fn);

#endif
