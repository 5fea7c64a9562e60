/*
 * ctorch/model.h - a decoder-only transformer (a small GPT / Llama) with its forward and
 * backward written as layer pairs on the library's kernels, and a trainer around it.
 *
 * The model, for tokens x [B, T] (N = B T rows, C = d_model, H query heads and Hkv key/value
 * heads of E = head_dim dims (C / H by default), F = d_ff):
 *
 *     h = tok_embeddings[x]                                       [N, C]
 *     for each layer:
 *         a = rmsnorm(h) * attention_norm
 *         q = rope(a wq^T + bq), k = rope(a wk^T + bk), v = a wv^T + bv   [B, T, H|Hkv, E]
 *         h = h + flex_attention(q, k, v, mask) wo^T              (GQA: head i reads kv head
 *                                                                  i / (H / Hkv))
 *         f = rmsnorm(h) * ffn_norm
 *         g|u = f w_gate_up^T;  h = h + (silu(g) * u) w_down^T    (SwiGLU)
 *     loss = cross_entropy(rmsnorm(h) * norm  W^T, next tokens)   W = tok_embeddings when tied
 *
 * The mask is causal, or a causal sliding window (token i sees tokens i - window .. i), and
 * with document masking (eos_token >= 0) a token sees only tokens of its own document (the
 * document id increases after each EOS token, which ends the document it belongs to). RoPE is
 * the rotate-half form with positions 0 .. T-1 of each sequence, its frequencies optionally
 * scaled (linear or llama3, see rope_scaling). Biases (bq, bk, bv, bo) exist only when
 * configured (qkv_bias, o_bias). The head is the fused linear
 * cross-entropy (no [N, V] logits), or, as a baseline, the unfused linear + cross-entropy.
 *
 * Memory: parameters, gradients and activations are each ONE accounted allocation carved by a
 * size table (ct_gpt_memory); the optimizer moments of a trainer are a fourth. The activations
 * (for opt.batch x opt.seq tokens) are allocated by the first forward that needs them
 * (training, ct_gpt_logits, ct_gpt_next_logits): generation through the KV cache
 * (ct_gpt_generate, ct_gpt_cache_*) never allocates them. Parameters are
 * laid out weights first (the tensors AdamW decays: every matrix) then the norm weights.
 *
 * Tensor names (PyTorch shapes, [out, in] for linear weights):
 *   tok_embeddings.weight [V, C], output.weight [V, C] (untied only),
 *   layers.{i}.attention.wq.weight [H E, C], .wk.weight [Hkv E, C], .wv.weight [Hkv E, C],
 *   layers.{i}.attention.wo.weight [C, H E],
 *   layers.{i}.feed_forward.w_gate_up.weight [2 F, C] (gate rows first), .w_down.weight [C, F],
 *   layers.{i}.attention_norm.weight [C], layers.{i}.ffn_norm.weight [C], norm.weight [C],
 *   with qkv_bias: layers.{i}.attention.{wq,wk,wv}.bias [H E], [Hkv E], [Hkv E]; with o_bias:
 *   layers.{i}.attention.wo.bias [C] (biases start at zero and are not weight-decayed).
 * E is head_dim (d_model / n_head by default; Hugging Face models may have H E != C).
 *
 * Determinism: every kernel used gives the same bits for any thread count, and the model adds
 * its terms in a fixed order, so a forward and backward (and so a training run) are bitwise
 * reproducible across runs and thread counts.
 */
#ifndef CTORCH_MODEL_H
#define CTORCH_MODEL_H

#include "ctorch/data.h"
#include "ctorch/io.h"
#include "ctorch/optim.h"
#include "ctorch/device.h"
#include "ctorch/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configuration ------------------------------------------------------------------------ */

/** Bytes of ct_gpt_config.score_mod / mask_mod, the terminating NUL included. */
#define CT_GPT_MOD_MAX 256

/** Shape of a model. */
typedef struct ct_gpt_config {
    int64_t vocab_size; /**< V >= 2; default 32768 */
    int64_t context;    /**< longest sequence T >= 1; default 128 */
    int64_t n_layer;    /**< >= 1; default 4 */
    int64_t d_model;    /**< C, a multiple of n_head; default 128 */
    int64_t n_head;     /**< H >= 1, with an even head dim C / H (RoPE); default 4 */
    int64_t n_kv_head;  /**< Hkv dividing H (grouped-query attention); default 2 */
    int64_t d_ff;       /**< F >= 1, the SwiGLU hidden size; default 384 */
    float rope_base;    /**< > 0; default 10000 */
    int64_t window;     /**< 0: full causal attention; W > 0: causal sliding window of W
                             previous tokens; default 0 */
    bool tied;          /**< head weight = token embedding; default true */
    float norm_eps;     /**< RMSNorm epsilon > 0; default 1e-5 */
    float init_std;     /**< std of the initial weights; 0 (default): 1 / sqrt(d_model), so
                             token embeddings have norm ~1 and the tied head's logits start at
                             std ~1; the residual projections (wo, w_down) get
                             init_std / sqrt(2 n_layer) */
    int64_t head_dim;   /**< E, even; 0 (default): d_model / n_head (which must then divide);
                             may differ from d_model / n_head (H E != C is allowed) */
    bool qkv_bias;      /**< biases on the q, k, v projections (Qwen2; Llama attention_bias);
                             default false */
    bool o_bias;        /**< a bias on the output projection (Llama attention_bias); default
                             false */
    int32_t rope_scaling;  /**< CT_ROPE_SCALING_NONE (default), _LINEAR or _LLAMA3 (below) */
    float rope_factor;     /**< linear and llama3: inverse frequencies divided by it (> 0);
                                default 1 */
    float rope_low_freq_factor, rope_high_freq_factor; /**< llama3 only: low < high, both > 0;
                                                            default 1, 4 */
    int64_t rope_original_context; /**< llama3 only: original_max_position_embeddings (>= 1);
                                        default 8192 */
    /** A compiled score_mod / mask_mod in the expression language of jit.h (docs/compile.md),
     *  "" (default): none. The mask is ANDed with causal (and the document mask); it is
     *  exclusive with window; flex attention only (not dense_attention). */
    char score_mod[CT_GPT_MOD_MAX];
    char mask_mod[CT_GPT_MOD_MAX];
} ct_gpt_config;

/** RoPE frequency scaling, as Hugging Face's rope_scaling "rope_type" (ct_gpt_config). */
enum {
    CT_ROPE_SCALING_NONE = 0,   /**< inv_freq[i] = 1 / rope_base^(2i / E) */
    CT_ROPE_SCALING_LINEAR = 1, /**< inv_freq / rope_factor */
    CT_ROPE_SCALING_LLAMA3 = 2  /**< Llama 3.1: with wavelength w = 2 pi / inv_freq and
                                     Lo = original_context / low, Lh = original_context / high:
                                     w < Lh keeps inv_freq, w > Lo divides it by rope_factor, and
                                     between, s = (original_context / w - low) / (high - low),
                                     inv_freq ((1 - s) / factor + s) */
};

/** The head dim E of a configuration (head_dim, or d_model / n_head when 0). */
CT_API int64_t ct_gpt_head_dim(const ct_gpt_config *cfg);

/** The E / 2 RoPE inverse frequencies of a (checked) configuration into inv_freq, in f32 as
 *  Hugging Face computes them (rope_base, then the rope_scaling above). CT_EINVAL for a bad
 *  configuration. */
CT_API ct_status ct_gpt_rope_inv_freq(const ct_gpt_config *cfg, float *inv_freq);

/** The defaults listed above. */
CT_API ct_gpt_config ct_gpt_config_default(void);

/** Check a configuration; CT_EINVAL names the first field that breaks its rule. */
CT_API ct_status ct_gpt_config_check(const ct_gpt_config *cfg);

/** Serialise a configuration to compact JSON (the keys are the field names) into a new
 *  NUL-terminated string (ct_alloc'ed: release with ct_free). */
CT_API ct_status ct_gpt_config_to_json(const ct_gpt_config *cfg, char **json);

/** Parse JSON written by ct_gpt_config_to_json (or by hand): keys absent keep the value *cfg
 *  holds, so start from ct_gpt_config_default(). CT_EFORMAT names an unknown key or a value of
 *  the wrong type; the result is then checked with ct_gpt_config_check. */
CT_API ct_status ct_gpt_config_from_json(const char *json, ct_gpt_config *cfg);

/* ---- the model ---------------------------------------------------------------------------- */

/** How a model instance runs (fixed at creation: the activation table depends on it). */
typedef struct ct_gpt_options {
    int64_t batch;         /**< most sequences per call (B >= 1); default 8 */
    int64_t seq;           /**< longest sequence per call, 1 .. context; 0 (default): context */
    bool fused_head;       /**< fused linear cross-entropy (default true); false: logits and
                                their gradient as [B T, V] arrays (the unfused baseline) */
    bool dense_attention;  /**< false (default): FlexAttention with a block mask; true: dense
                                SDPA reading a [B, T, T] boolean mask (the baseline) */
    int32_t eos_token;     /**< >= 0: document masking on this token; -1 (default): none */
    float z_loss;          /**< training loss z-loss scale (default 0); evaluation never has it */
    float label_smoothing; /**< training label smoothing (default 0); not in evaluation */
    size_t lce_scratch_bytes; /**< fused loss tile budget; 0 (default): on the CPU, blocks of
                                   512 token rows of full-vocabulary logits
                                   (ct_lce_scratch_bytes_for_rows), at least the loss's
                                   64 MiB (250 MiB at V 128256, 98 MiB at V 50304; N < 512
                                   rows take less); on a device, the device's budget */
    ct_dtype dtype; /**< operand dtype of the matrix products: CT_DTYPE_F32 (default) or
                         CT_DTYPE_BF16 (mixed precision as PyTorch's CPU autocast does for
                         linear / matmul: the weights' bf16 copies and the activations
                         entering each product rounded to bf16, products accumulated and
                         written in f32; embedding, norms, attention, softmax, the loss, the
                         gradients and the f32 master weights stay f32). bf16 needs the
                         model's own parameters (not ct_hf_map_model); the KV cache's decode
                         computes in f32. docs/train.md, "bf16". */
    struct ct_device *device; /**< where the parameters, gradients and activations live and the
                                   ops run (ctorch/device.h); NULL (default): the CPU. On a GPU
                                   (API 1): dense causal attention only (dense_attention true,
                                   no window, no eos_token, no score/mask mods), f32 parameters
                                   of the model's own (not mapped, not sharded); host access
                                   through ct_gpt_read_params / ct_gpt_write_params. */
} ct_gpt_options;

/** The defaults listed above. */
CT_API ct_gpt_options ct_gpt_options_default(void);

struct ct_train_options;
/** The model options a training run's options give (batch, seq, fused_head, dense_attention,
 *  eos_token, z_loss, label_smoothing, dtype, device; the rest default): the one mapping the
 *  trainers and the CLI use. */
CT_API ct_gpt_options ct_train_model_options(const struct ct_train_options *o);

/** A model instance: parameters, gradients, activations (opaque). */
typedef struct ct_gpt ct_gpt;

/** Sizes of the four allocations, in bytes (optimizer: what a trainer adds, 2 x the f32
 *  params; with dtype bf16, params includes the matrices' bf16 copy). */
typedef struct ct_gpt_memory {
    size_t params, grads, activations, optimizer;
} ct_gpt_memory;

/** Create a model (weights zero: call ct_gpt_init or load them). opt NULL: the defaults.
 *  CT_EINVAL names a bad config or option; CT_ENOMEM. *out NULL on failure. */
CT_API ct_status ct_gpt_create(const ct_gpt_config *cfg, const ct_gpt_options *opt, ct_gpt **out);

/** The device the model lives on (never NULL: the CPU device by default). */
CT_API struct ct_device *ct_gpt_device(const ct_gpt *m);

/** Copy the n = ct_gpt_num_params f32 parameters (or, with grads, the gradients) from the
 *  model's device into host memory dst / from host memory src. Works on every device (a
 *  memcpy on the CPU). CT_EINVAL for a model without parameters of its own. */
CT_API ct_status ct_gpt_read_params(const ct_gpt *m, bool grads, float *dst);
CT_API ct_status ct_gpt_write_params(ct_gpt *m, const float *src);

/** Free a model. NULL is a no-op. */
CT_API void ct_gpt_free(ct_gpt *m);

/** The configuration and options the model was created with. */
CT_API const ct_gpt_config *ct_gpt_get_config(const ct_gpt *m);
CT_API const ct_gpt_options *ct_gpt_get_options(const ct_gpt *m);

/** The allocation sizes of this instance (a model from ct_hf_map_model: params is the bytes of
 *  the tensors it converted to f32, grads 0). */
CT_API ct_gpt_memory ct_gpt_memory_sizes(const ct_gpt *m);

/** Initialise the weights from a seed: normal(0, init_std) in tensor order from one ct_rng
 *  (residual projections scaled as documented), norm weights 1. Gradients are zeroed. */
CT_API ct_status ct_gpt_init(ct_gpt *m, uint64_t seed);

/** Number of parameter tensors, and of scalars in all of them. */
CT_API int ct_gpt_num_tensors(const ct_gpt *m);
CT_API int64_t ct_gpt_num_params(const ct_gpt *m);

/** Number of leading scalars of the flat parameter array that weight decay applies to (the
 *  matrices; the norm weights follow them). */
CT_API int64_t ct_gpt_num_decayed(const ct_gpt *m);

/** The flat parameter and gradient arrays (ct_gpt_num_params floats each). */
CT_API float *ct_gpt_params(ct_gpt *m);
CT_API float *ct_gpt_grads(ct_gpt *m);

/** Tensor i (0 .. num_tensors-1): its name (valid while m lives) and views of its parameter
 *  and gradient (either out pointer may be NULL). CT_EINVAL for a bad index. */
CT_API ct_status ct_gpt_tensor(ct_gpt *m, int i, const char **name, ct_tensor *param,
                               ct_tensor *grad);

/** Set every gradient to zero. */
CT_API void ct_gpt_zero_grad(ct_gpt *m);

/** Forward and backward on B sequences of T + 1 tokens each (tokens [B, T+1], int32: inputs
 *  are the first T, targets the last T of each row); 1 <= B <= batch, 1 <= T <= seq.
 *  *loss (may be NULL) receives the mean training loss (with the z-loss and smoothing of the
 *  options). Gradients are ACCUMULATED: grads += grad_scale * d loss / d params (pass
 *  1 / micro-batches for gradient accumulation). CT_EINVAL names a token outside [0, V). */
CT_API ct_status ct_gpt_forward_backward(ct_gpt *m, const int32_t *tokens, int64_t B, int64_t T,
                                         float grad_scale, float *loss);

/** Forward only: the mean plain cross-entropy (no z-loss, no smoothing) of the same batch
 *  layout into *loss. Gradients are untouched. */
CT_API ct_status ct_gpt_forward(ct_gpt *m, const int32_t *tokens, int64_t B, int64_t T,
                                float *loss);

/** Next-token logits [V] after one sequence tokens[T] (1 <= T <= seq), into logits. */
CT_API ct_status ct_gpt_next_logits(ct_gpt *m, const int32_t *tokens, int64_t T, float *logits);

/** Logits of every position: tokens [B, T] int32 (1 <= B <= batch, 1 <= T <= seq) into
 *  logits [B, T, V] f32. CT_EINVAL names a token outside [0, V). Gradients are untouched. */
CT_API ct_status ct_gpt_logits(ct_gpt *m, const int32_t *tokens, int64_t B, int64_t T,
                               float *logits);

/** Load the parameters named as above from a tensor file (f32 or any float dtype, converted).
 *  CT_EFORMAT names a missing tensor or a shape that does not match the configuration. */
CT_API ct_status ct_gpt_load_params(ct_gpt *m, const ct_tensor_file *f);

/* ---- generation: KV cache, sampling, the generate loop ----------------------------------- */

/** A key/value cache of a model for incremental decoding (opaque). It holds, for every layer,
 *  the RoPE'd keys and the values of the tokens appended so far, [batch, max_len] positions,
 *  plus the scratch rows of one step; all of it is ONE accounted allocation (ct_alloc) sized
 *  from (batch, max_len) with checked arithmetic before anything is allocated. Every row holds
 *  the same number of tokens (positions 0 .. length-1). The model must outlive the cache and
 *  keep its weights while the cache is used (changing them invalidates what is cached). */
typedef struct ct_gpt_cache ct_gpt_cache;

/** Create an empty cache for up to batch rows (1 .. 2^20) of max_len tokens (1 .. context).
 *  CT_EINVAL names a bad size; CT_EOVERFLOW / CT_ENOMEM when it does not fit. *out NULL on
 *  failure. */
CT_API ct_status ct_gpt_cache_create(const ct_gpt *m, int64_t batch, int64_t max_len,
                                     ct_gpt_cache **out);

/** Free a cache. NULL is a no-op. */
CT_API void ct_gpt_cache_free(ct_gpt_cache *c);

/** Forget every cached token (length 0); nothing is freed. */
CT_API void ct_gpt_cache_reset(ct_gpt_cache *c);

/** Tokens held per row; the rows; the capacity; the bytes of the cache's allocation. */
CT_API int64_t ct_gpt_cache_length(const ct_gpt_cache *c);
CT_API int64_t ct_gpt_cache_batch(const ct_gpt_cache *c);
CT_API int64_t ct_gpt_cache_capacity(const ct_gpt_cache *c);
CT_API size_t ct_gpt_cache_bytes(const ct_gpt_cache *c);

/** Append n >= 1 tokens to every row (tokens [batch, n] int32, row-major) at positions
 *  length .. length+n-1, run them through the model against everything cached (the model's
 *  causal / sliding-window mask, and its document mask when the model has an eos_token), and
 *  write the next-token logits: [batch, V] after each row's last token (all false) or
 *  [batch, n, V] for every appended position (all true). Long inputs run in chunks of at most
 *  256 positions. They equal ct_gpt_logits / ct_gpt_next_logits of the whole sequence up to
 *  rounding (the attention and GEMM shapes differ; not bitwise). CT_EINVAL names a token
 *  outside [0, V) or an n that does not fit the capacity; the cache is unchanged on failure. */
CT_API ct_status ct_gpt_cache_prefill(ct_gpt_cache *c, const int32_t *tokens, int64_t n, bool all,
                                      float *logits);

/** Append one token per row (tokens [batch]) and write the next-token logits [batch, V]:
 *  ct_gpt_cache_prefill with n = 1. */
CT_API ct_status ct_gpt_cache_decode(ct_gpt_cache *c, const int32_t *tokens, float *logits);

/** How the next token is drawn from logits, in this order (Hugging Face's warpers):
 *  logits / temperature, then keep the top_k largest (ties with the k-th are kept), then keep
 *  the smallest set of most likely tokens whose probability reaches top_p (the token crossing
 *  top_p included, at least one kept), then draw from the softmax of what is kept. */
typedef struct ct_sample_options {
    float temperature; /**< >= 0, finite; 0: greedy (the first largest logit); default 1 */
    int64_t top_k;     /**< >= 0; 0 (default): no top-k filter */
    float top_p;       /**< in [0, 1]; 1 (default): no top-p filter */
} ct_sample_options;

/** The defaults listed above. */
CT_API ct_sample_options ct_sample_options_default(void);

/** Check sampling options; CT_EINVAL names the field that breaks its rule. */
CT_API ct_status ct_sample_options_check(const ct_sample_options *o);

/** The distribution ct_sample_token draws from: probs[V] (0 for the tokens filtered out; a
 *  one-hot row at the argmax when greedy). CT_EINVAL for a NaN or +inf logit, or when every
 *  logit is -inf. Scratch is allocated per call (O(V)). */
CT_API ct_status ct_sample_probs(const float *logits, int64_t V, const ct_sample_options *o,
                                 float *probs);

/** Draw one token from logits[V]: one ct_rng_uniform draw u (none when greedy); the kept tokens
 *  are walked from the most likely (ties: lower id first) until their cumulative weight
 *  exceeds u times the total. Same rules as ct_sample_probs. */
CT_API ct_status ct_sample_token(const float *logits, int64_t V, const ct_sample_options *o,
                                 ct_rng *rng, int32_t *token);

/** Called by ct_gpt_generate after each step with the batch tokens just chosen (finished rows
 *  get the EOS token); step counts from 0. */
typedef void (*ct_generate_fn)(void *ctx, int64_t step, const int32_t *tokens, int64_t batch);

/** Parse len bytes of token ids written in decimal, separated by spaces, tabs, newlines or
 *  commas ("1 2 3", "1,2,3"), into a new array *ids (ct_alloc'ed: release with ct_free) of *n
 *  ids, each in [0, vocab). NUL bytes are refused. CT_EINVAL names the offending text and its
 *  byte offset; no id: *n 0 and *ids NULL. At most len / 2 + 1 ids are allocated. */
CT_API ct_status ct_token_ids_parse(const char *text, size_t len, int64_t vocab, int32_t **ids,
                                    int64_t *n);

/** Options of ct_gpt_generate. */
typedef struct ct_generate_options {
    int64_t max_new_tokens;   /**< >= 0; default 64 */
    ct_sample_options sample; /**< default: ct_sample_options_default() */
    uint64_t seed;            /**< seeds the one ct_rng of the run; every step draws once per row,
                                   rows in order (finished rows too, so a row's tokens do not
                                   depend on when the others end); default 1 */
    int32_t eos_token;        /**< a row stops after producing it (later columns hold it); the
                                   run stops when every row has; -1 (default): never stop */
    bool no_cache;            /**< the baseline: recompute ct_gpt_next_logits over the whole
                                   sequence for every token, row by row; default false */
    ct_generate_fn on_step;   /**< NULL (default): no callback */
    void *ctx;                /**< passed to on_step */
} ct_generate_options;

/** The defaults listed above. */
CT_API ct_generate_options ct_generate_options_default(void);

/** What a ct_gpt_generate run did: the prompt step (the forward over the prompt and the first
 *  token) and the decode steps (every token after the first), with their wall-clock times. */
typedef struct ct_generate_stats {
    int64_t prompt_tokens, new_tokens;
    double prompt_seconds, decode_seconds;
} ct_generate_stats;

/** Continue each of the batch rows of prompt [batch, T] (int32, 1 <= T, tokens in [0, V)) by up
 *  to max_new_tokens tokens into out [batch, T + max_new_tokens] (row-major: the prompt, then
 *  the new tokens; columns after the run stopped hold eos_token). *n_new (may be NULL) gets the
 *  number of steps run. The next token always comes from the last min(length, seq) tokens
 *  (seq of the model's options): with the cache (sized min(seq, T + max_new_tokens)), a prompt
 *  is prefilled once and each token decoded; once a sequence outgrows seq every step re-fills
 *  the cache with the last seq tokens (exactly what the baseline computes). Deterministic for a
 *  seed. stats may be NULL. */
CT_API ct_status ct_gpt_generate(ct_gpt *m, const int32_t *prompt, int64_t batch, int64_t T,
                                 const ct_generate_options *opt, int32_t *out, int64_t *n_new,
                                 ct_generate_stats *stats);

/* ---- training ----------------------------------------------------------------------------- */

/** Caps of ct_train_options (the CLI's too): batch and eval_batches <= 2^20, accum in
 *  [1, 2^20]. A checkpoint's "train" metadata beyond them is refused. */
#define CT_TRAIN_MAX_BATCH (1 << 20)
#define CT_TRAIN_MAX_ACCUM (1 << 20)

/** Options of a training run. */
typedef struct ct_train_options {
    uint64_t seed;      /**< weights and data order; default 1 */
    int64_t batch;      /**< sequences per micro-batch, 1 .. 2^20; default 8 */
    int64_t seq;        /**< tokens per sequence, 1 .. context; 0 (default): context */
    int64_t accum; /**< micro-batches per optimizer step (gradient accumulation), 1 .. 2^20; default 1 */
    int64_t steps;      /**< optimizer steps of the schedule; default 350 */
    int64_t warmup;     /**< warmup steps; default 20 */
    float lr, min_lr;   /**< peak and final learning rate; default 3e-3, 3e-4 */
    float beta1, beta2; /**< default 0.9, 0.95 */
    float eps;          /**< default 1e-8 */
    float weight_decay; /**< on matrices only; default 0.1 */
    float clip;         /**< global gradient-norm clip; <= 0: none; default 1 */
    float z_loss;       /**< default 0 */
    float label_smoothing; /**< default 0 */
    bool fused_head;       /**< default true */
    bool dense_attention;  /**< default false */
    int32_t eos_token;     /**< document masking token, -1 (default): none */
    int64_t eval_batches;  /**< held-out micro-batches per evaluation; default 8 */
    ct_dtype dtype;        /**< CT_DTYPE_F32 (default) or CT_DTYPE_BF16: ct_gpt_options.dtype
                                of the model (f32 master weights, gradients and AdamW state
                                either way; checkpoints stay f32; the "train" metadata keeps
                                it as "dtype": "f32" | "bf16", absent meaning f32) */
    struct ct_device *device; /**< ct_gpt_options.device of the model: NULL (default) the CPU;
                                   a GPU keeps the weights, gradients and AdamW moments there
                                   (not in checkpoints or the "train" metadata: a run resumes
                                   on any device) */
} ct_train_options;

/** The defaults listed above. */
CT_API ct_train_options ct_train_options_default(void);

/** Serialise options to compact JSON (keys are the field names) into a new NUL-terminated
 *  string (ct_alloc'ed: release with ct_free). */
CT_API ct_status ct_train_options_to_json(const ct_train_options *opt, char **json);

/** Parse JSON of ct_train_options_to_json: absent keys keep *opt's values. CT_EFORMAT names an
 *  unknown key or a value of the wrong type. */
CT_API ct_status ct_train_options_from_json(const char *json, ct_train_options *opt);

/** A training run: model, AdamW moments, step, data position and random state (opaque). */
typedef struct ct_trainer ct_trainer;

/** What a step did. */
typedef struct ct_train_step_info {
    int64_t step;     /**< the step just taken (1-based) */
    float loss;       /**< mean training loss over its micro-batches */
    float lr;         /**< learning rate used */
    double grad_norm; /**< global gradient norm before clipping */
    int64_t tokens;   /**< tokens processed by the step */
    int64_t epoch;    /**< passes over the training tokens started so far (0-based) */
} ct_train_step_info;

/** Create a trainer: a model initialised from opt->seed and zero moments. train[n_train] and
 *  eval[n_eval] are borrowed (they must outlive the trainer); each needs at least seq + 1 tokens
 *  (eval may be NULL with n_eval 0: no evaluation). CT_EINVAL names a bad option, a config that
 *  does not fit, or a token outside the vocabulary (the first one found). */
CT_API ct_status ct_trainer_create(const ct_gpt_config *cfg, const ct_train_options *opt,
                                   const int32_t *train, int64_t n_train, const int32_t *eval,
                                   int64_t n_eval, ct_trainer **out);

/** Free a trainer. NULL is a no-op. */
CT_API void ct_trainer_free(ct_trainer *t);

/** The model being trained. */
CT_API ct_gpt *ct_trainer_model(ct_trainer *t);

/** Optimizer steps taken so far. */
CT_API int64_t ct_trainer_step_count(const ct_trainer *t);

/** Run one optimizer step: accum micro-batches of forward + backward, clipping, AdamW at the
 *  scheduled learning rate. info may be NULL. */
CT_API ct_status ct_trainer_step(ct_trainer *t, ct_train_step_info *info);

/** Mean held-out loss (plain cross-entropy) over eval_batches micro-batches of consecutive,
 *  non-overlapping windows from the start of the held-out tokens (the same every time).
 *  CT_EINVAL when the trainer has no held-out tokens. */
CT_API ct_status ct_trainer_evaluate(ct_trainer *t, float *loss);

/** Save a checkpoint (safetensors, atomic): the parameters under their names, the AdamW
 *  moments as optimizer.exp_avg.<name> / optimizer.exp_avg_sq.<name>, and metadata
 *  "format" = "ctorch-gpt", "config" (JSON), "train" (JSON of the options), "step", "epoch",
 *  "data_pos", "rng" (4 hex words), plus n_extra caller pairs (keys must differ from those). */
CT_API ct_status ct_trainer_save(const ct_trainer *t, const char *path, size_t n_extra,
                                 const char *const *keys, const char *const *values);

/** Restore a checkpoint saved by ct_trainer_save into a trainer created with the same
 *  configuration, options and data: parameters, moments, step, epoch, data position and random
 *  state, so training continues exactly as if never interrupted. CT_EFORMAT names what does not
 *  match (not a ctorch-gpt checkpoint, another configuration, a missing tensor, a bad field);
 *  CT_EIO / CT_EFORMAT from opening the file. After a failure the trainer's weights may be
 *  partly overwritten: free it. */
CT_API ct_status ct_trainer_load(ct_trainer *t, const char *path);

/** Validate a checkpoint before anything the size of its model is allocated (the one check
 *  behind ct_gpt_checkpoint_config, ct_trainer_load, `ctorch generate` and `ctorch train
 *  --resume`): its "format" is "ctorch-gpt", its "config" metadata parses and passes
 *  ct_gpt_config_check (into *cfg), and every parameter tensor that configuration has is in
 *  the file with the configuration's shape and a floating-point dtype. So a small file
 *  whose configuration describes a huge model fails here, having allocated nothing of it.
 *  With trainer_state, also the AdamW moments (optimizer.exp_avg.<name>,
 *  optimizer.exp_avg_sq.<name>, same shapes), the "train" options when present (the rules
 *  of ct_trainer_create, caps included), "step", "epoch" and "data_pos" (integers in
 *  [0, 2^63)) and "rng" (64 hex digits, not all zero). CT_EFORMAT names the first tensor or
 *  field that breaks a rule, and the rule. */
CT_API ct_status ct_gpt_checkpoint_check(const ct_tensor_file *f, bool trainer_state,
                                         ct_gpt_config *cfg);

/** Read the "config" metadata of a checkpoint file into *cfg, validated with its parameter
 *  tensors: ct_gpt_checkpoint_check(f, false, cfg). CT_EFORMAT if absent or bad. */
CT_API ct_status ct_gpt_checkpoint_config(const ct_tensor_file *f, ct_gpt_config *cfg);

/* ---- Hugging Face Llama-family directories -------------------------------------------------- */
/*
 * A directory holding config.json and model.safetensors, or shards listed by
 * model.safetensors.index.json ({"metadata": {"total_size": N}, "weight_map": {name: file}}).
 * Architectures: LlamaForCausalLM (Llama 2/3, SmolLM...), Qwen2ForCausalLM (q/k/v biases),
 * MistralForCausalLM. config.json keys read: hidden_size,
 * intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
 * rms_norm_eps, rope_theta, rope_scaling (rope_type / type "linear" or "llama3", factor,
 * low_freq_factor, high_freq_factor, original_max_position_embeddings),
 * max_position_embeddings (the model's context), tie_word_embeddings, vocab_size,
 * torch_dtype (or dtype), attention_bias, bos_token_id, eos_token_id, sliding_window (Mistral:
 * every layer; Qwen2: with use_sliding_window true, the layers of layer_types or from
 * max_window_layers on, which must be all or none) as window = sliding_window - 1
 * (transformers' sliding_window S shows a token itself and S - 1 earlier ones; S = 1 refused);
 * keys that do not change the maths are accepted (transformers_version, use_cache,
 * initializer_range, pad_token_id, pretraining_tp, _name_or_path, max_window_layers and
 * sliding_window where unused), keys fixed to one value are checked (hidden_act "silu",
 * mlp_bias false, attention_dropout 0, partial_rotary_factor 1); any other key is refused by
 * name.
 * Tensor names: model.embed_tokens.weight, model.norm.weight, lm_head.weight (untied),
 * model.layers.N.{input_layernorm,post_attention_layernorm}.weight,
 * model.layers.N.self_attn.{q,k,v,o}_proj.{weight,bias}, model.layers.N.mlp.{gate,up,down}_proj.weight;
 * gate_proj and up_proj are the two halves of ctorch's w_gate_up. The derived buffer
 * model.layers.N.self_attn.rotary_emb.inv_freq of older checkpoints is ignored; a tied model's
 * lm_head.weight must equal the embedding. Any other tensor, a missing one, or a shape that
 * does not match the configuration is refused by name.
 */

/** Architectures of ct_hf_info. */
typedef enum ct_hf_arch { CT_HF_LLAMA = 1, CT_HF_QWEN2 = 2, CT_HF_MISTRAL = 3 } ct_hf_arch;

/** What config.json says beyond the model's shape. */
typedef struct ct_hf_info {
    ct_hf_arch arch;
    ct_dtype dtype;    /**< torch_dtype: F32, F16 or BF16 (F32 when absent) */
    int32_t bos_token; /**< bos_token_id, -1 when absent or null */
    int32_t eos_token; /**< eos_token_id (the first of a list), -1 when absent or null */
} ct_hf_info;

/** Parse config.json text (len bytes) into *cfg (init_std 0) and *info. CT_EFORMAT
 *  names the key that is unknown, missing, of the wrong type or value; CT_EUNSUPPORTED names
 *  an architecture or a rope_scaling type ctorch does not implement. */
CT_API ct_status ct_hf_config_parse(const char *json, size_t len, ct_gpt_config *cfg,
                                    ct_hf_info *info);

/** The Hugging Face name of part `part` of ctorch tensor `name` (part 0; w_gate_up has part 0,
 *  gate_proj, and part 1, up_proj) into buf[n]. *parts (may be NULL) receives how many parts the
 *  tensor has. CT_EINVAL for a name that is not a ctorch model tensor. */
CT_API ct_status ct_hf_tensor_name(const char *name, int part, char *buf, size_t n, int *parts);

/** An opened directory: its configuration and mapped shard files (opaque). */
typedef struct ct_hf_model ct_hf_model;

/** Open a directory: parse config.json, map model.safetensors (or the index and every shard it
 *  names: plain file names inside the directory, each tensor in exactly one shard, the index
 *  and the shards agreeing), check every tensor name and shape against the configuration.
 *  Nothing is read beyond the headers. CT_EIO / CT_EFORMAT naming the file and what is wrong. */
CT_API ct_status ct_hf_open(const char *dir, ct_hf_model **out);

/** Close a directory (models mapped from it must be freed first). NULL is a no-op. */
CT_API void ct_hf_close(ct_hf_model *h);

/** The configuration and facts of an opened directory. */
CT_API const ct_gpt_config *ct_hf_get_config(const ct_hf_model *h);
CT_API const ct_hf_info *ct_hf_get_info(const ct_hf_model *h);

/** Number of shard files (1 for model.safetensors alone). */
CT_API int ct_hf_num_shards(const ct_hf_model *h);

/** Copy every weight into the model's own f32 parameters (bf16 and f16 converted exactly). m
 *  must have the directory's configuration (CT_EINVAL otherwise). For training. */
CT_API ct_status ct_hf_load_params(const ct_hf_model *h, ct_gpt *m);

/** Point the model's weights at the mapped files without a copy: f32 tensors (aligned) and
 *  bf16 / f16 matrices (embedding, head, q/k/v/o, gate/up/down; 2-byte aligned) are read in
 *  place, keeping their dtype; the norm weights and biases in bf16 / f16, and anything
 *  misaligned, are converted to f32 into the model's own parameter array. The forward
 *  (ct_gpt_logits, ct_gpt_next_logits, the KV cache, ct_gpt_generate) reads half weights
 *  directly: decode's GEMV widens each weight row as it goes; more rows convert fixed panels
 *  of weight rows (a function of the row length alone) into a scratch of 2 MiB per thread
 *  (4 MiB at most, for rows over 32768 values) and multiply them with ct_gemm_f32: the
 *  results are the f32 maths on the widened weights, bitwise the same for any thread count.
 *  The model becomes inference-only (ct_gpt_forward_backward, ct_gpt_init,
 *  ct_gpt_load_params, ct_lora_create and ct_gpt_tensor's parameter views refuse it; so does
 *  ct_gpt_forward when the head is half) and h must outlive it. *mapped (may be NULL)
 *  receives how many of the HF tensors were read in place. m must hold parameter arrays
 *  (ct_gpt_create); ct_hf_map_model below makes a model without them. */
CT_API ct_status ct_hf_map_params(const ct_hf_model *h, ct_gpt *m, int *mapped);

/** Create a model of the directory's configuration (opt: batch and seq of its activations,
 *  NULL: the defaults) whose weights are mapped as ct_hf_map_params maps them, but holding
 *  no parameter or gradient arrays: its tracked memory is the activations and the tensors
 *  converted to f32 (ct_gpt_memory_sizes: params = their bytes, grads 0), not the weights.
 *  What inference should use. h must outlive the model; *out NULL on failure. */
CT_API ct_status ct_hf_map_model(const ct_hf_model *h, const ct_gpt_options *opt, ct_gpt **out,
                                 int *mapped);

/** Options of ct_hf_save. */
typedef struct ct_hf_save_options {
    int dtype;          /**< -1 (default): the source's torch_dtype (like) or F32; else
                             CT_DTYPE_F32, _F16 or _BF16 */
    ct_hf_arch arch;    /**< without `like`: 0 (default) picks Qwen2 for q/k/v biases without
                             an o bias, else Mistral for a window, else Llama (which has no
                             window: refused with one) */
} ct_hf_save_options;

/** The defaults listed above. */
CT_API ct_hf_save_options ct_hf_save_options_default(void);

/** Write the model as a Hugging Face directory `dir` (created if absent): config.json, and
 *  model.safetensors, or, when `like` (may be NULL) came from shards, the same shard files and
 *  assignment with model.safetensors.index.json. With `like`, config.json keeps its keys (the
 *  shape ones rewritten from the model, torch_dtype set to the saved dtype, the window as
 *  sliding_window = window + 1). Each file is
 *  written atomically. opt NULL: the defaults. */
CT_API ct_status ct_hf_save(ct_gpt *m, const ct_hf_model *like, const char *dir,
                            const ct_hf_save_options *opt);

/** Load a PyTorch state dict (a torch.save file read by ct_load, or any tensor file) into the
 *  model's own f32 parameters (any float dtype and strides, converted). Names are ctorch's or
 *  Hugging Face's (model.layers.N.self_attn.q_proj.weight, ...; gate_proj and up_proj the row
 *  halves of w_gate_up), all under one prefix, found from the embedding: the first tensor named
 *  [prefix]tok_embeddings.weight or [prefix]model.embed_tokens.weight (prefix "model." for
 *  torch.save({"model": state_dict}); "" for a bare one). Tensors outside the prefix are not
 *  looked at; under it, any tensor that is not the model's is refused by name, except
 *  Hugging Face's derived self_attn.rotary_emb.inv_freq buffers, a tied model's lm_head.weight
 *  equal to the embedding, and a ctorch checkpoint's optimizer.* / grad.* entries. CT_EFORMAT
 *  names a missing tensor, a shape or dtype that does not match or a foreign tensor, checked
 *  (ct_gpt_state_dict_check) before any weight is written; only a tied lm_head that differs
 *  from the embedding is found after the weights are read. */
CT_API ct_status ct_gpt_load_state_dict(ct_gpt *m, const ct_tensor_file *f);

/** What ct_gpt_load_state_dict checks before reading, against a configuration alone, before
 *  anything the model's size is allocated: every tensor of cfg present under the prefix with
 *  its shape and a floating-point dtype, no foreign tensor under the prefix. CT_EFORMAT names
 *  the tensor, its shape and the configuration's. */
CT_API ct_status ct_gpt_state_dict_check(const ct_tensor_file *f, const ct_gpt_config *cfg);

/* ---- LoRA adapters ---------------------------------------------------------------------------- */
/*
 * Low-rank adapters in PEFT's layout: for each targeted projection W [out, in] of each layer,
 * A [r, in] and B [out, r] with W_effective = W + (alpha / r) B A (alpha / sqrt(r) with
 * use_rslora). A starts as PEFT's kaiming_uniform(a = sqrt(5)) (uniform in +-1 / sqrt(in)),
 * B at zero, so training starts from the base model exactly.
 *
 * Training: ct_lora_apply writes W0 + s B A into the model's weights (W0, the frozen base, is
 * kept apart), the model's forward and backward run as usual, and ct_lora_backward turns the
 * weight gradient G into the adapters' (dA = s B^T G, dB = s G A^T: exact, as W_effective is
 * linear in each). The other weights never change. (The model computes the frozen weights'
 * gradients too and they are dropped: LoRA saves optimizer memory here, not compute.)
 *
 * Files: adapter_config.json (r, lora_alpha, target_modules, lora_dropout, bias, task_type,
 * base_model_name_or_path, peft_type, ...) and adapter_model.safetensors with
 * base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight [r, in] / .lora_B.weight [out, r]
 * (mlp.gate_proj, mlp.up_proj, mlp.down_proj, self_attn.{q,k,v,o}_proj).
 */

/** Projections an adapter can target (bits of ct_lora_options.targets). */
enum {
    CT_LORA_Q = 1,
    CT_LORA_K = 2,
    CT_LORA_V = 4,
    CT_LORA_O = 8,
    CT_LORA_GATE = 16,
    CT_LORA_UP = 32,
    CT_LORA_DOWN = 64
};

/** Shape of a set of adapters. */
typedef struct ct_lora_options {
    int64_t rank;     /**< r in [1, 4096]; default 8 */
    float alpha;      /**< lora_alpha > 0; default 8 (PEFT's) */
    uint32_t targets; /**< CT_LORA_* bits; default CT_LORA_Q | CT_LORA_V (PEFT's for Llama) */
} ct_lora_options;

/** The defaults listed above. */
CT_API ct_lora_options ct_lora_options_default(void);

/** Parse a comma-separated list of q, k, v, o, gate, up, down (or the PEFT module names
 *  q_proj, ..., down_proj) into CT_LORA_* bits. CT_EINVAL names an unknown entry. */
CT_API ct_status ct_lora_targets_parse(const char *list, uint32_t *targets);

/** Adapters on a model (opaque). */
typedef struct ct_lora ct_lora;

/** Create adapters on m (its weights at this moment become the frozen base; m must outlive
 *  the adapters and not be mapped). A from seed, B zero; then ct_lora_apply. CT_EINVAL for a
 *  bad option (rank above min(in, out) of a target included). */
CT_API ct_status ct_lora_create(ct_gpt *m, const ct_lora_options *o, uint64_t seed,
                                ct_lora **out);

/** Free adapters (the model keeps its current weights). NULL is a no-op. */
CT_API void ct_lora_free(ct_lora *l);

/** The options the adapters were created with. */
CT_API const ct_lora_options *ct_lora_get_options(const ct_lora *l);

/** Write base + s B A into the model's targeted weights. */
CT_API ct_status ct_lora_apply(ct_lora *l);

/** The adapters' gradients (written, not accumulated) from the model's weight gradients of the
 *  targets, after ct_gpt_forward_backward at applied weights. */
CT_API ct_status ct_lora_backward(ct_lora *l);

/** Flat adapter parameters and gradients: per adapter A then B, in layer order. */
CT_API int64_t ct_lora_num_params(const ct_lora *l);
CT_API float *ct_lora_params(ct_lora *l);
CT_API float *ct_lora_grads(ct_lora *l);

/** Number of adapter tensors (2 per adapted projection), and tensor i: its PEFT name (valid
 *  while l lives) and views of its parameter and gradient (either may be NULL). */
CT_API int ct_lora_num_tensors(const ct_lora *l);
CT_API ct_status ct_lora_tensor(ct_lora *l, int i, const char **name, ct_tensor *param,
                                ct_tensor *grad);

/** The frozen base weight of ctorch tensor `name` (a view, valid while l lives), when the
 *  adapters target it; CT_EINVAL otherwise. */
CT_API ct_status ct_lora_base(ct_lora *l, const char *name, ct_tensor *base);

/** Write dir/adapter_config.json and dir/adapter_model.safetensors (f32), atomically each;
 *  dir is created if absent. base_model may be NULL (null in the file). */
CT_API ct_status ct_lora_save(const ct_lora *l, const char *dir, const char *base_model);

/** Fold a PEFT adapter directory into the model's weights: W += s B A for every adapter in it
 *  (f32, f16, bf16 or f64 tensors). adapter_config.json keys it does not implement (use_dora,
 *  rank_pattern, a regex target_modules, ...), tensors that are not adapters of this model's
 *  layers, integer adapters and adapters holding NaN or an infinity are refused by name, all
 *  before anything is merged (on an error the weights are as they were). *n_merged (may be
 *  NULL) receives the adapter count. */
CT_API ct_status ct_lora_merge(ct_gpt *m, const char *dir, int *n_merged);

/** Train only LoRA adapters from now on: the trainer's model weights (already loaded) become
 *  the frozen base; AdamW (with the trainer's schedule, clipping and weight decay) updates the
 *  adapters alone. Checkpoints then also hold the adapters, their moments and the base
 *  ("lora" metadata), so --resume is exact; ct_trainer_load of such a checkpoint needs a
 *  trainer with the same adapters enabled. */
CT_API ct_status ct_trainer_enable_lora(ct_trainer *t, const ct_lora_options *o);

/** The trainer's adapters (NULL when none). */
CT_API ct_lora *ct_trainer_lora(ct_trainer *t);

/** The "lora" metadata of a checkpoint into *o: CT_OK with *found false when it has none. */
CT_API ct_status ct_lora_checkpoint_options(const ct_tensor_file *f, ct_lora_options *o,
                                            bool *found);

#ifdef __cplusplus
}
#endif
#endif
