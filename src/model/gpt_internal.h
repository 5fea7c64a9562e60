/* Private layout of the GPT model, shared by the model and the trainer. */
#ifndef CT_MODEL_GPT_INTERNAL_H
#define CT_MODEL_GPT_INTERNAL_H

#include "core/internal.h"
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

/* Views of one layer's tensors inside a flat array (parameters or gradients). */
typedef struct gpt_layer {
    float *wq, *wk, *wv, *wo, *wgu, *wdown, *norm1, *norm2;
    float *wup;              /* the up rows [F, C]: wgu + F C unless pointed elsewhere */
    float *bq, *bk, *bv, *bo; /* NULL unless qkv_bias / o_bias */
} gpt_layer;

typedef struct gpt_weights {
    float *emb, *out, *norm; /* out == emb when tied */
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
    uint8_t *dmask;          /* [B, T, T]: dense attention only */
} gpt_acts;

struct ct_gpt {
    ct_gpt_config cfg;
    ct_gpt_options opt;
    gpt_tensor *tensors;
    int ntensors;
    int64_t nparams, ndecay;
    float *params, *grads; /* one allocation each */
    gpt_weights w, g;
    void *acts; /* one allocation */
    size_t acts_bytes;
    gpt_acts a;
    ct_mask_mod base_mask, doc_mask, and_mask;
    ct_block_mask *bm;
    int64_t bm_T; /* T of the cached causal block mask (0: none cached) */
    float *inv_freq; /* [E / 2] RoPE inverse frequencies (ct_gpt_rope_inv_freq) */
    bool mapped;     /* weight views point into a mapped file (ct_hf_map_params): inference only */
};

/* Head dim of the model (cfg.head_dim or d_model / n_head). */
static inline int64_t gpt_E(const ct_gpt *m)
{
    return ct_gpt_head_dim(&m->cfg);
}

#endif
