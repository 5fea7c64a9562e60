/* The GPT model of include/ctorch/model.h: size tables, initialisation, and the forward and
 * backward as layer pairs on the library's kernels (llm.c style: raw arrays, shapes stated). */
#include "model/gpt_internal.h"
#include "ctorch/jit.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

ct_gpt_options ct_gpt_options_default(void)
{
    ct_gpt_options o = {8, 0, true, false, -1, 0.0f, 0.0f, 0, CT_DTYPE_F32, NULL};
    return o;
}

/* ---- size tables ------------------------------------------------------------------------ */

/* a * b, saturated at SIZE_MAX (carve then reports the overflow). */
static size_t sat(size_t a, size_t b)
{
    size_t r;
    return ct_mul_size(a, b, &r) ? r : SIZE_MAX;
}

/* One allocation for n arrays: slot i gets bytes[i] bytes at a 64-byte aligned offset (base
 * NULL: only the total is computed and checked). */
static ct_status carve(ct_device *dev, void **base, size_t *total, void ***slots,
                       const size_t *bytes, int n)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t a = (off + 63) & ~(size_t)63;
        if (a < off || !ct_add_size(a, bytes[i], &off))
            return ct_error(CT_EOVERFLOW, "ct_gpt_create: activation sizes overflow");
    }
    *total = off;
    if (!base) return CT_OK;
    CT_TRY(ct_dev_alloc(dev, off ? off : 64, "ct_gpt activations", base));
    off = 0;
    for (int i = 0; i < n; i++) {
        off = (off + 63) & ~(size_t)63;
        *slots[i] = (char *)*base + off;
        off += bytes[i];
    }
    return CT_OK;
}

/* Dense attention reads a [B, T, T] mask only with a window or documents (else: causal). */
static bool gpt_dense_mask(const ct_gpt *m)
{
    return m->opt.dense_attention && (m->cfg.window != 0 || m->opt.eos_token >= 0);
}

/* The activation table: [B T] rows of each quantity the backward needs, per layer, carved
 * from one allocation (alloc) or only sized into acts_bytes (!alloc: the creation's check). */
static ct_status acts_layout(ct_gpt *m, bool alloc)
{
    const ct_gpt_config *cfg = &m->cfg;
    int64_t L = cfg->n_layer;
    size_t B = (size_t)m->opt.batch, T = (size_t)m->opt.seq, N = sat(B, T);
    size_t C = (size_t)cfg->d_model, E = (size_t)ct_gpt_head_dim(cfg), HE = (size_t)cfg->n_head * E;
    size_t KE = (size_t)cfg->n_kv_head * E, F = (size_t)cfg->d_ff, Ls = (size_t)L;
    size_t V = (size_t)cfg->vocab_size, Nf = sat(N, sizeof(float)), LNf = sat(Ls, Nf);
    size_t NC = sat(Nf, C), LNC = sat(LNf, C); /* bytes of [N, C] and [L][N, C] */
    /* bf16: one GEMM operand and one output gradient of a layer at a time, 2 bytes a value */
    bool bf = m->opt.dtype == CT_DTYPE_BF16;
    size_t xw = C > HE ? C : HE, dw = 2 * F;
    if (F > xw) xw = F;
    if (xw > dw) dw = xw;
    size_t Nh = sat(N, sizeof(uint16_t));
    gpt_acts *a = &m->a;
    void **slots[] = {
        (void **)&a->inp,     (void **)&a->tgt,   (void **)&a->doc,   (void **)&a->resid,
        (void **)&a->x2,      (void **)&a->ln1,   (void **)&a->rstd1, (void **)&a->q,
        (void **)&a->k,       (void **)&a->v,     (void **)&a->att,   (void **)&a->lse,
        (void **)&a->ln2,     (void **)&a->rstd2, (void **)&a->gu,    (void **)&a->hb,
        (void **)&a->lnf,     (void **)&a->rstdf, (void **)&a->dres,  (void **)&a->dtmp,
        (void **)&a->dln,     (void **)&a->dq,    (void **)&a->dk,    (void **)&a->dv,
        (void **)&a->datt,    (void **)&a->dgu,   (void **)&a->dh,    (void **)&a->logits,
        (void **)&a->dlogits, (void **)&a->dmask,   (void **)&a->xb,    (void **)&a->dyb,
        (void **)&a->scal};
    size_t bytes[] = {Nf,
                      Nf,
                      Nf,
                      sat(Ls + 1, NC),
                      LNC,
                      LNC,
                      LNf,
                      sat(LNf, HE),
                      sat(LNf, KE),
                      sat(LNf, KE),
                      sat(LNf, HE),
                      sat(LNf, (size_t)cfg->n_head),
                      LNC,
                      LNf,
                      sat(LNf, 2 * F),
                      sat(LNf, F),
                      NC,
                      Nf,
                      NC,
                      NC,
                      NC,
                      sat(Nf, HE),
                      sat(Nf, KE),
                      sat(Nf, KE),
                      sat(Nf, HE),
                      sat(Nf, 2 * F),
                      sat(Nf, F),
                      m->opt.fused_head ? 0 : sat(Nf, V),
                      m->opt.fused_head ? 0 : sat(Nf, V),
                      gpt_dense_mask(m) ? sat(B, sat(T, T)) : 0,
                      bf ? sat(Nh, xw) : 0,
                      bf ? sat(Nh, dw) : 0,
                      4 * sizeof(float)};
    return carve(m->dev, alloc ? &m->acts : NULL, &m->acts_bytes, slots, bytes,
                 (int)(sizeof bytes / sizeof bytes[0]));
}

/* The activations are allocated at the first forward that needs them (training, ct_gpt_logits,
 * ct_gpt_next_logits): a model that only generates through the KV cache never holds them. */
ct_status gpt_acts_ready(ct_gpt *m)
{
    return m->acts ? CT_OK : acts_layout(m, true);
}

/* Register parameter tensor `name` of shape [r] or [r, c] at the next flat offset. */
static void add_tensor(ct_gpt *m, const char *name, int64_t r, int64_t c)
{
    gpt_tensor *t = &m->tensors[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = c ? 2 : 1;
    t->shape[0] = r;
    t->shape[1] = c;
    t->offset = m->nparams;
    t->numel = c ? r * c : r;
    t->decay = c != 0;
    m->nparams += t->numel;
}

static void tensor_table(ct_gpt *m)
{
    const ct_gpt_config *c = &m->cfg;
    int64_t C = c->d_model, E = ct_gpt_head_dim(c), HE = c->n_head * E, KE = c->n_kv_head * E,
            F = c->d_ff;
    char nm[80];
    add_tensor(m, "tok_embeddings.weight", c->vocab_size, C);
    if (!c->tied) add_tensor(m, "output.weight", c->vocab_size, C);
    for (int64_t l = 0; l < c->n_layer; l++) {
        snprintf(nm, sizeof nm, "layers.%lld.attention.wq.weight", (long long)l);
        add_tensor(m, nm, HE, C);
        snprintf(nm, sizeof nm, "layers.%lld.attention.wk.weight", (long long)l);
        add_tensor(m, nm, KE, C);
        snprintf(nm, sizeof nm, "layers.%lld.attention.wv.weight", (long long)l);
        add_tensor(m, nm, KE, C);
        snprintf(nm, sizeof nm, "layers.%lld.attention.wo.weight", (long long)l);
        add_tensor(m, nm, C, HE);
        snprintf(nm, sizeof nm, "layers.%lld.feed_forward.w_gate_up.weight", (long long)l);
        add_tensor(m, nm, 2 * F, C);
        snprintf(nm, sizeof nm, "layers.%lld.feed_forward.w_down.weight", (long long)l);
        add_tensor(m, nm, C, F);
    }
    m->ndecay = m->nparams;
    for (int64_t l = 0; l < c->n_layer; l++) {
        snprintf(nm, sizeof nm, "layers.%lld.attention_norm.weight", (long long)l);
        add_tensor(m, nm, C, 0);
        snprintf(nm, sizeof nm, "layers.%lld.ffn_norm.weight", (long long)l);
        add_tensor(m, nm, C, 0);
        if (c->qkv_bias) {
            snprintf(nm, sizeof nm, "layers.%lld.attention.wq.bias", (long long)l);
            add_tensor(m, nm, HE, 0);
            snprintf(nm, sizeof nm, "layers.%lld.attention.wk.bias", (long long)l);
            add_tensor(m, nm, KE, 0);
            snprintf(nm, sizeof nm, "layers.%lld.attention.wv.bias", (long long)l);
            add_tensor(m, nm, KE, 0);
        }
        if (c->o_bias) {
            snprintf(nm, sizeof nm, "layers.%lld.attention.wo.bias", (long long)l);
            add_tensor(m, nm, C, 0);
        }
    }
    add_tensor(m, "norm.weight", C, 0);
}

/* Entries tensor_table may fill: embedding, head, final norm, at most 12 per layer. */
static size_t table_cap(const ct_gpt_config *c)
{
    return (size_t)(3 + 12 * c->n_layer);
}

ct_status gpt_tensor_table(const ct_gpt_config *c, gpt_tensor **tensors, int *n)
{
    *tensors = NULL;
    *n = 0;
    CT_TRY(ct_gpt_config_check(c));
    ct_gpt tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.cfg = *c;
    CT_TRY(ct_calloc((void **)&tmp.tensors, table_cap(c) * sizeof(gpt_tensor)));
    tensor_table(&tmp);
    *tensors = tmp.tensors;
    *n = tmp.ntensors;
    return CT_OK;
}

/* Point the per-layer views at the flat arrays (base = params or grads), or, with ptrs, at
 * ptrs[k] for tensor k (gpt_bind: src/dist's gathered block buffers). */
static void bind_any(const ct_gpt *m, float *base, float *const *ptrs, gpt_weights *w)
{
#define AT(k) (ptrs ? ptrs[k] : base + m->tensors[k].offset)
    int k = 0;
    w->emb = AT(k++);
    w->out = m->cfg.tied ? w->emb : AT(k++);
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        gpt_layer *L = &w->layer[l];
        L->wq = AT(k++);
        L->wk = AT(k++);
        L->wv = AT(k++);
        L->wo = AT(k++);
        L->wgu = AT(k++);
        L->wdown = AT(k++);
        L->wup = L->wgu + m->cfg.d_ff * m->cfg.d_model;
    }
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        gpt_layer *L = &w->layer[l];
        L->norm1 = AT(k++);
        L->norm2 = AT(k++);
        L->bq = L->bk = L->bv = L->bo = NULL;
        if (m->cfg.qkv_bias) {
            L->bq = AT(k++);
            L->bk = AT(k++);
            L->bv = AT(k++);
        }
        if (m->cfg.o_bias) L->bo = AT(k++);
    }
    w->norm = AT(k);
#undef AT
}

static void bind(const ct_gpt *m, float *base, gpt_weights *w)
{
    bind_any(m, base, NULL, w);
}

void gpt_bind(const ct_gpt *m, gpt_weights *w, float *const *ptrs)
{
    bind_any(m, NULL, ptrs, w);
}

static ct_status check_options(const ct_gpt_config *c, ct_gpt_options *o)
{
    if (o->seq == 0) o->seq = c->context;
    if (o->batch < 1 || o->batch > (1 << 20))
        return ct_error(CT_EINVAL, "ct_gpt_create: batch must be in [1, 2^20], got %lld",
                        (long long)o->batch);
    if (o->seq < 1 || o->seq > c->context)
        return ct_error(CT_EINVAL, "ct_gpt_create: seq must be in [1, context = %lld], got %lld",
                        (long long)c->context, (long long)o->seq);
    if (o->eos_token >= c->vocab_size)
        return ct_error(CT_EINVAL,
                        "ct_gpt_create: eos_token %d is outside the vocabulary [0, %lld)",
                        o->eos_token, (long long)c->vocab_size);
    if (o->dtype != CT_DTYPE_F32 && o->dtype != CT_DTYPE_BF16)
        return ct_error(CT_EINVAL, "ct_gpt_create: dtype must be f32 or bf16, got %s",
                        ct_dtype_name(o->dtype));
    if (!(o->z_loss >= 0) || !(o->label_smoothing >= 0 && o->label_smoothing <= 1))
        return ct_error(
            CT_EINVAL, "ct_gpt_create: need z_loss >= 0 and label_smoothing in [0, 1] (got %g, %g)",
            o->z_loss, o->label_smoothing);
    return CT_OK;
}

ct_status ct_gpt_create(const ct_gpt_config *cfg, const ct_gpt_options *opt, ct_gpt **out)
{
    return gpt_create(cfg, opt, true, out);
}

static ct_status create_model(const ct_gpt_config *cfg, const ct_gpt_options *opt,
                              bool own_params,
                              const uint16_t *(*wbf_of)(const void *ctx, const float *w),
                              const void *wbf_ctx, ct_gpt **out);

ct_status gpt_create(const ct_gpt_config *cfg, const ct_gpt_options *opt, bool own_params,
                     ct_gpt **out)
{
    return create_model(cfg, opt, own_params, NULL, NULL, out);
}

ct_status gpt_create_sharded(const ct_gpt_config *cfg, const ct_gpt_options *opt,
                             const uint16_t *(*wbf_of)(const void *ctx, const float *w),
                             const void *ctx, ct_gpt **out)
{
    return create_model(cfg, opt, false, wbf_of, ctx, out);
}

static ct_status create_model(const ct_gpt_config *cfg, const ct_gpt_options *opt,
                              bool own_params,
                              const uint16_t *(*wbf_of)(const void *ctx, const float *w),
                              const void *wbf_ctx, ct_gpt **out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_gpt_create: out must not be NULL");
    *out = NULL;
    CT_TRY(ct_gpt_config_check(cfg));
    ct_gpt_options o = opt ? *opt : ct_gpt_options_default();
    CT_TRY(check_options(cfg, &o));
    if (o.dtype == CT_DTYPE_BF16 && !own_params && !wbf_of)
        return ct_error(CT_EUNSUPPORTED, "ct_gpt_create: dtype bf16 needs the model's own f32 "
                                         "parameters (not a mapped model)");
    ct_device *dev = o.device ? o.device : ct_device_cpu();
    if (ct_device_get_kind(dev) != CT_DEVICE_CPU) {
        const char *dn = ct_device_name(dev);
        if (!own_params)
            return ct_error(CT_EUNSUPPORTED, "ct_gpt_create: a sharded model runs on the CPU only "
                                             "(%s asked)", dn);
        if (o.dense_attention && (cfg->window || o.eos_token >= 0))
            return ct_error(CT_EUNSUPPORTED,
                            "ct_gpt_create: on %s dense attention is causal only (a window or "
                            "documents run through FlexAttention: dense_attention false)",
                            dn);
    }
    ct_gpt *m;
    CT_TRY(ct_calloc((void **)&m, sizeof *m));
    m->cfg = *cfg;
    m->opt = o;
    m->dev = dev;
    if (o.dtype == CT_DTYPE_BF16) m->wbf_of = wbf_of, m->wbf_ctx = wbf_ctx;
    int64_t L = cfg->n_layer;
    ct_status s;
    if ((s = ct_calloc((void **)&m->tensors, table_cap(cfg) * sizeof(gpt_tensor))) ||
        (s = ct_calloc((void **)&m->inv_freq, (size_t)ct_gpt_head_dim(cfg) / 2 * sizeof(float))) ||
        (s = ct_gpt_rope_inv_freq(cfg, m->inv_freq)) ||
        (s = ct_calloc((void **)&m->w.layer, (size_t)L * sizeof(gpt_layer))) ||
        (s = ct_calloc((void **)&m->g.layer, (size_t)L * sizeof(gpt_layer)))) {
        ct_gpt_free(m);
        return s;
    }
    tensor_table(m);
    size_t pbytes;
    if (!ct_mul_size((size_t)m->nparams, sizeof(float), &pbytes)) {
        ct_gpt_free(m);
        return ct_error(CT_EOVERFLOW, "ct_gpt_create: parameter count overflows");
    }
    m->pbytes = pbytes;
    size_t fbytes = (size_t)ct_gpt_head_dim(cfg) / 2 * sizeof(float);
    if (own_params && ((s = ct_dev_alloc(dev, pbytes, "ct_gpt parameters", (void **)&m->params)) ||
                       (s = ct_dev_zero(dev, m->params, pbytes)) ||
                       (s = ct_dev_alloc(dev, pbytes, "ct_gpt gradients", (void **)&m->grads)) ||
                       (s = ct_dev_zero(dev, m->grads, pbytes)))) {
        ct_gpt_free(m);
        return s;
    }
    if (own_params && o.dtype == CT_DTYPE_BF16 &&
        (s = ct_dev_alloc(dev, (size_t)m->ndecay * sizeof(uint16_t), "ct_gpt bf16 weights",
                          (void **)&m->wbf))) {
        ct_gpt_free(m);
        return s;
    }
    if (gpt_host(m)) {
        m->inv_freq_dev = m->inv_freq;
    } else if ((s = ct_dev_alloc(dev, fbytes ? fbytes : 4, "ct_gpt RoPE frequencies",
                                 (void **)&m->inv_freq_dev)) ||
               (s = ct_dev_h2d(dev, m->inv_freq_dev, m->inv_freq, fbytes)) ||
               (s = ct_calloc((void **)&m->stage, 3 * (size_t)o.batch * (size_t)o.seq *
                                                      sizeof(int32_t)))) {
        ct_gpt_free(m);
        return s;
    }
    if (own_params) {
        bind(m, m->params, &m->w);
        bind(m, m->grads, &m->g);
    }

    /* the activations: sized (and their arithmetic checked) now, allocated at first use */
    if ((s = acts_layout(m, false))) {
        ct_gpt_free(m);
        return s;
    }
    if ((cfg->score_mod[0] || cfg->mask_mod[0]) && o.dense_attention) {
        ct_gpt_free(m);
        return ct_error(CT_EINVAL, "ct_gpt_create: score_mod / mask_mod need flex attention (not "
                                   "dense_attention)");
    }
    if (cfg->mask_mod[0]) { /* the user's mask, ANDed with causal (docs/compile.md) */
        s = ct_mask_mod_causal(&m->causal_mask);
        if (!s) s = ct_mask_mod_compile(cfg->mask_mod, NULL, 0, NULL, &m->user_mask);
        ct_mask_mod two[2] = {m->causal_mask, m->user_mask};
        if (!s) s = ct_mask_mod_and(two, 2, &m->base_mask);
    } else {
        s = cfg->window ? ct_mask_mod_sliding_window(cfg->window, true, &m->base_mask)
                        : ct_mask_mod_causal(&m->base_mask);
    }
    if (!s && cfg->score_mod[0]) s = ct_score_mod_compile(cfg->score_mod, NULL, 0, NULL, &m->user_score);
    if (!s && !gpt_host(m) && (cfg->score_mod[0] || cfg->mask_mod[0])) {
        /* a GPU: the compiled mods' device code, the mask ANDed with the causal bit (flex_args);
         * the model's mods bind no arrays, so one bind serves every call */
        ct_flex_mods fm;
        memset(&fm, 0, sizeof fm);
        s = ct_dev_flex_jit_create(dev, cfg->score_mod[0] ? &m->user_score : NULL,
                                   cfg->mask_mod[0] ? &m->user_mask : NULL, CT_DTYPE_F32,
                                   ct_gpt_head_dim(cfg), &m->fj);
        if (!s) s = ct_dev_flex_jit_check(m->fj, o.batch, cfg->n_head, o.seq, o.seq);
        if (!s) s = ct_dev_flex_jit_bind(m->fj, false, &fm);
        m->fj_mods = fm.compiled;
    }
    if (s) {
        ct_gpt_free(m);
        return s;
    }
    *out = m;
    return CT_OK;
}

static void free_masks(ct_gpt *m)
{
    ct_dev_block_mask_free(m->dev, &m->dbm);
    ct_block_mask_free(m->bm);
    m->bm = NULL;
    ct_mask_mod_free(&m->and_mask);
    ct_mask_mod_free(&m->doc_mask);
    m->bm_T = 0;
}

void ct_gpt_free(ct_gpt *m)
{
    if (!m) return;
    free_masks(m);
    ct_dev_flex_jit_free(m->fj);
    ct_mask_mod_free(&m->base_mask);
    ct_mask_mod_free(&m->user_mask);
    ct_mask_mod_free(&m->causal_mask);
    ct_score_mod_free(&m->user_score);
    ct_dev_free(m->dev, m->acts, m->acts_bytes ? m->acts_bytes : 64);
    ct_dev_free(m->dev, m->params, m->pbytes);
    ct_dev_free(m->dev, m->grads, m->pbytes);
    ct_dev_free(m->dev, m->wbf, (size_t)m->ndecay * sizeof(uint16_t));
    if (m->inv_freq_dev != m->inv_freq)
        ct_dev_free(m->dev, m->inv_freq_dev, (size_t)ct_gpt_head_dim(&m->cfg) / 2 * sizeof(float));
    ct_free(m->stage);
    ct_free(m->own);
    ct_free(m->w.layer);
    ct_free(m->g.layer);
    ct_free(m->tensors);
    ct_free(m->inv_freq);
    ct_free(m);
}

const ct_gpt_config *ct_gpt_get_config(const ct_gpt *m)
{
    return &m->cfg;
}

const ct_gpt_options *ct_gpt_get_options(const ct_gpt *m)
{
    return &m->opt;
}

ct_gpt_memory ct_gpt_memory_sizes(const ct_gpt *m)
{
    size_t p = (size_t)m->nparams * sizeof(float);
    bool bare = m->mapped && !m->params; /* ct_hf_map_model: views and a few converted tensors */
    size_t wbf = m->wbf ? (size_t)m->ndecay * sizeof(uint16_t) : 0; /* the bf16 copy */
    ct_gpt_memory r = {bare ? m->own_bytes : p + wbf, bare ? 0 : p, m->acts_bytes, 2 * p};
    return r;
}

int ct_gpt_num_tensors(const ct_gpt *m)
{
    return m->ntensors;
}

int64_t ct_gpt_num_params(const ct_gpt *m)
{
    return m->nparams;
}

int64_t ct_gpt_num_decayed(const ct_gpt *m)
{
    return m->ndecay;
}

float *ct_gpt_params(ct_gpt *m)
{
    return m->params;
}

float *ct_gpt_grads(ct_gpt *m)
{
    return m->grads;
}

ct_status ct_gpt_tensor(ct_gpt *m, int i, const char **name, ct_tensor *param, ct_tensor *grad)
{
    if (!m || i < 0 || i >= m->ntensors)
        return ct_error(CT_EINVAL, "ct_gpt_tensor: index %d is outside [0, %d)", i,
                        m ? m->ntensors : 0);
    const gpt_tensor *t = &m->tensors[i];
    if (name) *name = t->name;
    if (param && m->mapped)
        return ct_error(CT_EINVAL,
                        "ct_gpt_tensor: the weights of this model are mapped from a file (read "
                        "them there)");
    if ((param || grad) && !m->params)
        return ct_error(CT_EINVAL, "ct_gpt_tensor: this model holds no parameters (sharded)");
    if ((param || grad) && !gpt_host(m))
        return ct_error(CT_EINVAL, "ct_gpt_tensor: the model lives on %s (read its parameters with "
                                   "ct_gpt_read_params)",
                        ct_device_name(m->dev));
    if (param)
        CT_TRY(ct_tensor_wrap(param, m->params + t->offset, CT_DTYPE_F32, t->ndim, t->shape, NULL));
    if (grad)
        CT_TRY(ct_tensor_wrap(grad, m->grads + t->offset, CT_DTYPE_F32, t->ndim, t->shape, NULL));
    return CT_OK;
}

void ct_gpt_zero_grad(ct_gpt *m)
{
    if (!m->grads) return;
    if (gpt_host(m))
        ct_zero_floats(m->grads, m->nparams); /* parallel: the step's first pass */
    else
        (void)ct_dev_zero(m->dev, m->grads, m->pbytes); /* queued; a failure shows at the next op */
}

ct_device *ct_gpt_device(const ct_gpt *m)
{
    return m ? m->dev : NULL;
}

ct_status ct_gpt_read_params(const ct_gpt *m, bool grads, float *dst)
{
    if (!m || !dst) return ct_error(CT_EINVAL, "ct_gpt_read_params: m and dst must not be NULL");
    if (!m->params || m->mapped)
        return ct_error(CT_EINVAL, "ct_gpt_read_params: the model holds no parameters of its own");
    return ct_dev_d2h(m->dev, dst, grads ? m->grads : m->params, m->pbytes);
}

ct_status ct_gpt_write_params(ct_gpt *m, const float *src)
{
    if (!m || !src) return ct_error(CT_EINVAL, "ct_gpt_write_params: m and src must not be NULL");
    if (!m->params || m->mapped)
        return ct_error(CT_EINVAL, "ct_gpt_write_params: the model holds no parameters of its own");
    return ct_dev_h2d(m->dev, m->params, src, m->pbytes);
}

/* Tensor i's initial values from r (advanced over the whole tensor, in order); rows
 * [row0, row1) of them go to dst (row1 - row0 rows). */
void gpt_init_tensor(const ct_gpt *m, int i, ct_rng *r, int64_t row0, int64_t row1, float *dst)
{
    float std = m->cfg.init_std > 0 ? m->cfg.init_std : 1.0f / sqrtf((float)m->cfg.d_model);
    float proj = std / sqrtf(2.0f * (float)m->cfg.n_layer);
    const gpt_tensor *t = &m->tensors[i];
    int64_t cols = t->ndim == 2 ? t->shape[1] : 1, j0 = row0 * cols, j1 = row1 * cols;
    if (!t->decay) {
        bool bias = strstr(t->name, ".bias") != NULL;
        for (int64_t j = j0; j < j1; j++)
            dst[j - j0] = bias ? 0.0f : 1.0f;
        return;
    }
    bool residual = strstr(t->name, ".wo.") || strstr(t->name, ".w_down.");
    float s = residual ? proj : std;
    for (int64_t j = 0; j < t->numel; j++) {
        float v = s * ct_rng_normal(r);
        if (j >= j0 && j < j1) dst[j - j0] = v;
    }
}

ct_status ct_gpt_init(ct_gpt *m, uint64_t seed)
{
    if (!m || !m->params)
        return ct_error(CT_EINVAL, "ct_gpt_init: m must be a model with parameters");
    if (m->mapped) return ct_error(CT_EINVAL, "ct_gpt_init: the model's weights are mapped");
    ct_rng r;
    ct_rng_seed(&r, seed);
    float *host = m->params;
    if (!gpt_host(m)) CT_TRY(ct_alloc((void **)&host, m->pbytes ? m->pbytes : 4));
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        gpt_init_tensor(m, i, &r, 0, t->shape[0], host + t->offset);
    }
    ct_status s = CT_OK;
    if (host != m->params) {
        s = ct_dev_h2d(m->dev, m->params, host, m->pbytes);
        ct_free(host);
    }
    ct_gpt_zero_grad(m);
    return s;
}

ct_status ct_gpt_load_params(ct_gpt *m, const ct_tensor_file *f)
{
    if (!m || !f || !m->params)
        return ct_error(CT_EINVAL, "ct_gpt_load_params: arguments must not be NULL");
    if (m->mapped) return ct_error(CT_EINVAL, "ct_gpt_load_params: the model's weights are mapped");
    if (!gpt_host(m)) { /* read on the host, then one copy to the device */
        float *host;
        CT_TRY(ct_alloc((void **)&host, m->pbytes ? m->pbytes : 4));
        float *dev = m->params;
        m->params = host; /* the loop below writes through m->params */
        ct_device *d = m->dev;
        m->dev = ct_device_cpu();
        ct_status s = ct_gpt_load_params(m, f);
        m->dev = d;
        m->params = dev;
        if (s == CT_OK) s = ct_dev_h2d(d, dev, host, m->pbytes);
        ct_free(host);
        return s;
    }
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        size_t idx;
        if (ct_tensor_file_find(f, t->name, &idx) != CT_OK)
            return ct_error(CT_EFORMAT, "checkpoint: tensor '%s' is missing", t->name);
        ct_tensor_info info;
        CT_TRY(ct_tensor_file_info(f, idx, &info));
        bool same = info.ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = info.shape[d] == t->shape[d];
        if (!same) {
            char want[48];
            if (t->ndim == 2)
                snprintf(want, sizeof want, "[%lld, %lld]", (long long)t->shape[0],
                         (long long)t->shape[1]);
            else
                snprintf(want, sizeof want, "[%lld]", (long long)t->shape[0]);
            return ct_error(CT_EFORMAT,
                            "checkpoint: tensor '%s' has another shape than the configuration's %s",
                            t->name, want);
        }
        ct_tensor dst;
        CT_TRY(ct_tensor_wrap(&dst, m->params + t->offset, CT_DTYPE_F32, t->ndim, t->shape, NULL));
        CT_TRY(ct_tensor_file_read_into(f, idx, &dst));
    }
    return CT_OK;
}

/* ---- attention ------------------------------------------------------------------------------ */

/* [B, heads, T, E] view of a [B, T, heads, E] array. */
static ct_status head_view(ct_tensor *t, float *data, int64_t B, int64_t T, int64_t heads,
                           int64_t E)
{
    int64_t shape[4] = {B, heads, T, E}, strides[4] = {T * heads * E, E, heads * E, 1};
    return ct_tensor_wrap(t, data, CT_DTYPE_F32, 4, shape, strides);
}

/* Document ids of the current batch: the id grows after each EOS token. */
/* The host copies of the batch's inputs and document ids: the activations on the CPU; on a
 * GPU the staging area (inputs, targets, documents), the documents uploaded after. */
static int32_t *host_inp(const ct_gpt *m)
{
    return gpt_host(m) ? m->a.inp : m->stage;
}

static int32_t *host_doc(const ct_gpt *m, int64_t B, int64_t T)
{
    return gpt_host(m) ? m->a.doc : m->stage + 2 * B * T;
}

static void doc_ids(ct_gpt *m, int64_t B, int64_t T)
{
    const int32_t *inp = host_inp(m);
    int32_t *doc = host_doc(m, B, T);
    for (int64_t b = 0; b < B; b++) {
        int32_t d = 0;
        for (int64_t t = 0; t < T; t++) {
            doc[b * T + t] = d;
            if (inp[b * T + t] == m->opt.eos_token) d++;
        }
    }
}

/* Build what attention needs for this batch: the block mask (flex) or the dense mask. */
static ct_status prepare_mask(ct_gpt *m, int64_t B, int64_t T)
{
    bool docs = m->opt.eos_token >= 0;
    int64_t W = m->cfg.window;
    if (docs) {
        doc_ids(m, B, T);
        if (!gpt_host(m)) /* the flex slots read the ids on the device */
            CT_TRY(ct_dev_h2d(m->dev, m->a.doc, host_doc(m, B, T), (size_t)(B * T) * sizeof(int32_t)));
    }
    if (m->opt.dense_attention) {
        if (!gpt_dense_mask(m)) return CT_OK; /* causal: no mask to build */
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < T; i++) {
                uint8_t *row = m->a.dmask + (b * T + i) * T;
                for (int64_t j = 0; j < T; j++)
                    row[j] = j <= i && (W == 0 || i - j <= W) &&
                             (!docs || m->a.doc[b * T + i] == m->a.doc[b * T + j]);
            }
        return CT_OK;
    }
    if (!docs && m->bm && m->bm_T == T) return CT_OK; /* the same causal mask as last time */
    free_masks(m);
    const ct_mask_mod *mm = &m->base_mask;
    if (docs) {
        CT_TRY(ct_mask_mod_document(host_doc(m, B, T), NULL, B, T, T, &m->doc_mask));
        ct_mask_mod two[2] = {m->base_mask, m->doc_mask};
        CT_TRY(ct_mask_mod_and(two, 2, &m->and_mask));
        mm = &m->and_mask;
    }
    int64_t bs = T <= 256 ? 64 : 128;
    CT_TRY(ct_block_mask_create(mm, B, m->cfg.n_head, T, T, bs, &m->bm));
    if (!gpt_host(m)) CT_TRY(ct_dev_block_mask_upload(m->dev, m->bm, &m->dbm)); /* once a mask */
    m->bm_T = docs ? 0 : T;
    return CT_OK;
}

/* FlexAttention on a GPU: the flex slots over the uploaded block mask with the model's
 * built-in masks (causal, or its window; documents by their device ids) and its compiled
 * mods (the user's mask ANDed with causal as on the CPU, where it replaces the window; the
 * user's score mod). */
static ct_flex_args flex_args(const ct_gpt *m, ct_attn_args a)
{
    ct_flex_args f;
    memset(&f, 0, sizeof f);
    f.attn = a;
    f.block_mask = &m->dbm;
    f.mods.mask = CT_FLEX_MASK_CAUSAL;
    f.mods.compiled = m->fj_mods;
    if (m->cfg.window && !m->cfg.mask_mod[0]) {
        f.mods.mask |= CT_FLEX_MASK_WINDOW;
        f.mods.window = m->cfg.window;
    }
    if (m->opt.eos_token >= 0) {
        f.mods.mask |= CT_FLEX_MASK_DOCUMENT;
        f.mods.q_doc = m->a.doc;
        f.mods.doc_batch = a.B;
    }
    f.mods.score = CT_FLEX_SCORE_NONE;
    return f;
}

/* The dense attention of layer l through the device's sdpa slots (causal, or the [B, T, T]
 * mask of a window or documents): the backward's arguments. */
static ct_attn_args dense_args(ct_gpt *m, int l, int64_t B, int64_t T)
{
    const ct_gpt_config *c = &m->cfg;
    int64_t E = gpt_E(m), H = c->n_head, K = c->n_kv_head, N = B * T;
    size_t lo = (size_t)l * (size_t)N;
    ct_attn_args a = {B, T, H, K, E, 1.0f / sqrtf((float)E), m->a.q + lo * H * E,
                      m->a.k + lo * K * E, m->a.v + lo * K * E, m->a.att + lo * H * E,
                      m->a.lse + lo * H, gpt_dense_mask(m) ? m->a.dmask : NULL, CT_DTYPE_F32};
    return a;
}

/* The training attention of a block: io's q, k, v (after RoPE) -> att, keeping lse for the
 * backward (dense: the device's sdpa slot; flex: the model's block mask and score_mod). */
static ct_status attention_forward(const ct_gpt *m, const gpt_block_io *io)
{
    const ct_gpt_config *c = &m->cfg;
    int64_t B = io->B, T = io->T, E = gpt_E(m), H = c->n_head, K = c->n_kv_head;
    if (m->opt.dense_attention) {
        ct_attn_args a = {B, T, H, K, E, 1.0f / sqrtf((float)E), io->q, io->k, io->v, io->att,
                          io->lse, gpt_dense_mask(m) ? m->a.dmask : NULL, CT_DTYPE_F32};
        GPT_DEV(m, sdpa_fwd, &a);
        return CT_OK;
    }
    if (!gpt_host(m)) {
        ct_attn_args a = {B, T, H, K, E, 1.0f / sqrtf((float)E), io->q, io->k, io->v, io->att,
                          io->lse, NULL, CT_DTYPE_F32};
        ct_flex_args f = flex_args(m, a);
        GPT_DEV(m, flex_fwd, &f);
        return CT_OK;
    }
    ct_tensor q, k, v, o, lse; /* flex on the CPU: its tile kernels and compiled mods */
    CT_TRY(head_view(&q, io->q, B, T, H, E));
    CT_TRY(head_view(&k, io->k, B, T, K, E));
    CT_TRY(head_view(&v, io->v, B, T, K, E));
    CT_TRY(head_view(&o, io->att, B, T, H, E));
    int64_t ls[3] = {B, H, T};
    CT_TRY(ct_tensor_wrap(&lse, io->lse, CT_DTYPE_F32, 3, ls, NULL));
    ct_flex_options fo = ct_flex_options_default();
    fo.score_mod = m->user_score.fwd ? &m->user_score : NULL;
    return ct_flex_attention_forward(&q, &k, &v, m->bm, &fo, &o, &lse);
}

static ct_status attention_backward(ct_gpt *m, int l, int64_t B, int64_t T)
{
    if (m->opt.dense_attention) {
        ct_attn_args a = dense_args(m, l, B, T);
        ct_attn_grads g = {m->a.datt, m->a.dq, m->a.dk, m->a.dv};
        GPT_DEV(m, sdpa_bwd, &a, &g);
        return CT_OK;
    }
    if (!gpt_host(m)) {
        ct_attn_args a = dense_args(m, l, B, T);
        a.mask = NULL;
        ct_flex_args f = flex_args(m, a);
        ct_attn_grads g = {m->a.datt, m->a.dq, m->a.dk, m->a.dv};
        GPT_DEV(m, flex_bwd, &f, &g);
        return CT_OK;
    }
    const ct_gpt_config *c = &m->cfg;
    int64_t E = gpt_E(m), H = c->n_head, K = c->n_kv_head, N = B * T;
    size_t lo = (size_t)l * (size_t)N;
    ct_tensor q, k, v, o, lse, dout, dq, dk, dv;
    CT_TRY(head_view(&q, m->a.q + lo * H * E, B, T, H, E));
    CT_TRY(head_view(&k, m->a.k + lo * K * E, B, T, K, E));
    CT_TRY(head_view(&v, m->a.v + lo * K * E, B, T, K, E));
    CT_TRY(head_view(&o, m->a.att + lo * H * E, B, T, H, E));
    CT_TRY(head_view(&dout, m->a.datt, B, T, H, E));
    CT_TRY(head_view(&dq, m->a.dq, B, T, H, E));
    CT_TRY(head_view(&dk, m->a.dk, B, T, K, E));
    CT_TRY(head_view(&dv, m->a.dv, B, T, K, E));
    int64_t ls[3] = {B, H, T};
    CT_TRY(ct_tensor_wrap(&lse, m->a.lse + lo * H, CT_DTYPE_F32, 3, ls, NULL));
    ct_flex_options fo = ct_flex_options_default();
    fo.score_mod = m->user_score.fwd ? &m->user_score : NULL;
    return ct_flex_attention_backward(&q, &k, &v, &o, &lse, &dout, m->bm, &fo, &dq, &dk, &dv);
}

/* ---- forward ------------------------------------------------------------------------------- */

/* RoPE of x [B, T, heads, E] in place at positions 0 .. T-1 (inverse rotation: backward), with
 * the model's frequencies (for unscaled RoPE the values ct_rope_forward computes itself). */
static ct_status gpt_rope(const ct_gpt *m, float *x, int64_t B, int64_t T, int64_t heads,
                          bool backward)
{
    GPT_DEV(m, rope, x, B, T, heads, gpt_E(m), m->inv_freq_dev, backward);
    return CT_OK;
}

ct_status gpt_load_batch(ct_gpt *m, const int32_t *tokens, int64_t B, int64_t T, const char *fn)
{
    if (!m || !tokens) return ct_error(CT_EINVAL, "%s: m and tokens must not be NULL", fn);
    if (B < 1 || B > m->opt.batch)
        return ct_error(CT_EINVAL, "%s: B must be in [1, batch = %lld], got %lld", fn,
                        (long long)m->opt.batch, (long long)B);
    if (T < 1 || T > m->opt.seq)
        return ct_error(CT_EINVAL, "%s: T must be in [1, seq = %lld], got %lld", fn,
                        (long long)m->opt.seq, (long long)T);
    int64_t V = m->cfg.vocab_size;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t <= T; t++) {
            int32_t x = tokens[b * (T + 1) + t];
            if (x < 0 || x >= V)
                return ct_error(CT_EINVAL,
                                "%s: tokens[%lld][%lld] = %d is outside the vocabulary [0, %lld)",
                                fn, (long long)b, (long long)t, x, (long long)V);
        }
    CT_TRY(gpt_acts_ready(m));
    int32_t *inp = gpt_host(m) ? m->a.inp : m->stage, *tgt = gpt_host(m) ? m->a.tgt : m->stage + B * T;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t <= T; t++) {
            int32_t x = tokens[b * (T + 1) + t];
            if (t < T) inp[b * T + t] = x;
            if (t > 0) tgt[b * T + t - 1] = x;
        }
    if (gpt_host(m)) return CT_OK;
    CT_TRY(ct_dev_h2d(m->dev, m->a.inp, inp, (size_t)(B * T) * sizeof(int32_t)));
    return ct_dev_h2d(m->dev, m->a.tgt, tgt, (size_t)(B * T) * sizeof(int32_t));
}

/* Embedding (and the mask of the batch): inputs already in a.inp. */
ct_status gpt_embed_forward(ct_gpt *m, int64_t B, int64_t T)
{
    const ct_gpt_config *c = &m->cfg;
    CT_TRY(prepare_mask(m, B, T));
    if (gpt_host(m)) /* mapped bf16 / f16 tables: the CPU's own lookup */
        return gpt_embed(m->a.resid, m->a.inp, m->w.emb, m->w.hemb, B * T, c->vocab_size, c->d_model);
    GPT_DEV(m, embed_fwd, m->a.resid, m->a.inp, m->w.emb, B * T, c->vocab_size, c->d_model);
    return CT_OK;
}

/* RoPE of x [B, T, heads, E] in place at the positions pos [T] (the KV cache): the host's
 * kernel with the model's frequencies (for unscaled RoPE the values ct_rope_forward computes
 * itself). Other devices have no slot for positions yet. */
static ct_status rope_at(const ct_gpt *m, float *x, const int32_t *pos, int64_t B, int64_t T,
                         int64_t heads)
{
    if (!gpt_host(m))
        return ct_error(CT_EUNSUPPORTED, "ct_gpt: RoPE at given positions (the KV cache) is not "
                                         "implemented on %s", ct_device_name(m->dev));
    return ct_rope_forward_freqs(x, x, pos, B, T, heads, gpt_E(m), m->inv_freq);
}

/* One product of the block: the model's dtype (gpt_layer_input / gpt_layer_linear), or, for
 * the KV cache, f32 through gpt_linear with its GEMV. */
static ct_status block_input(const ct_gpt *m, const gpt_block_io *io, const float *x, int64_t n,
                             gpt_input *in)
{
    if (!io->kv) return gpt_layer_input(m, x, n, in);
    *in = (gpt_input){x, NULL};
    return CT_OK;
}

static ct_status block_linear(const ct_gpt *m, const gpt_block_io *io, float *out, int64_t ldo,
                              gpt_input x, const float *w, gpt_half h, const float *bias,
                              int64_t N, int64_t D, int64_t V, bool accumulate)
{
    if (!io->kv) return gpt_layer_linear(m, out, ldo, x, w, h, bias, N, D, V, accumulate);
    if (!gpt_host(m))
        return ct_error(CT_EUNSUPPORTED, "ct_gpt: the KV cache's products run on the CPU, not %s",
                        ct_device_name(m->dev));
    return gpt_linear(out, ldo, x.f, w, h, bias, N, D, V, accumulate, true);
}

ct_status gpt_block_run(const ct_gpt *m, const gpt_layer *w, const gpt_block_io *io)
{
    const ct_gpt_config *c = &m->cfg;
    int64_t B = io->B, T = io->T, N = B * T, C = c->d_model, E = gpt_E(m), H = c->n_head;
    int64_t K = c->n_kv_head, HE = H * E, KE = K * E, F = c->d_ff;
    gpt_input in;
    /* attention block: x2 = x + attention(rope(q), rope(k), v) wo^T */
    GPT_DEV(m, rmsnorm_fwd, io->ln1, io->rstd1, io->x, w->norm1, N, C, c->norm_eps);
    CT_TRY(block_input(m, io, io->ln1, N * C, &in));
    CT_TRY(block_linear(m, io, io->q, HE, in, w->wq, w->hq, w->bq, N, C, HE, false));
    CT_TRY(block_linear(m, io, io->k, KE, in, w->wk, w->hk, w->bk, N, C, KE, false));
    CT_TRY(block_linear(m, io, io->v, KE, in, w->wv, w->hv, w->bv, N, C, KE, false));
    if (io->pos) {
        CT_TRY(rope_at(m, io->q, io->pos, B, T, H));
        CT_TRY(rope_at(m, io->k, io->pos, B, T, K));
    } else {
        CT_TRY(gpt_rope(m, io->q, B, T, H, false));
        CT_TRY(gpt_rope(m, io->k, B, T, K, false));
    }
    if (io->kv)
        CT_TRY(gpt_kv_attention(m, io->kv, io->q, io->k, io->v, io->att, B, T));
    else
        CT_TRY(attention_forward(m, io));
    if (io->x2 != io->x) CT_TRY(ct_dev_d2d(m->dev, io->x2, io->x, (size_t)(N * C) * sizeof(float)));
    CT_TRY(block_input(m, io, io->att, N * HE, &in));
    CT_TRY(block_linear(m, io, io->x2, C, in, w->wo, w->ho, NULL, N, HE, C, true));
    if (w->bo) GPT_DEV(m, bias_add_rows, io->x2, w->bo, N, C);
    /* MLP block: out = x2 + swiglu(rmsnorm(x2) w_gate_up^T) w_down^T */
    GPT_DEV(m, rmsnorm_fwd, io->ln2, io->rstd2, io->x2, w->norm2, N, C, c->norm_eps);
    CT_TRY(block_input(m, io, io->ln2, N * C, &in));
    if (!w->hgu.p && !w->hup.p && w->wup == w->wgu + F * C) { /* one product on [2F, C] */
        CT_TRY(block_linear(m, io, io->gu, 2 * F, in, w->wgu, w->hgu, NULL, N, C, 2 * F, false));
    } else { /* gate and up held apart (weights mapped from a file: f32 only) */
        CT_TRY(block_linear(m, io, io->gu, 2 * F, in, w->wgu, w->hgu, NULL, N, C, F, false));
        CT_TRY(block_linear(m, io, io->gu + F, 2 * F, in, w->wup, w->hup, NULL, N, C, F, false));
    }
    GPT_DEV(m, swiglu_fwd, io->h, io->gu, N, F);
    if (io->out != io->x2)
        CT_TRY(ct_dev_d2d(m->dev, io->out, io->x2, (size_t)(N * C) * sizeof(float)));
    CT_TRY(block_input(m, io, io->h, N * F, &in));
    return block_linear(m, io, io->out, C, in, w->wdown, w->hdown, NULL, N, F, C, true);
}

/* Layer l: resid[l] -> resid[l + 1], keeping what its backward needs (the training mode of
 * gpt_block_run on the activations of layer l). */
ct_status gpt_block_forward(ct_gpt *m, int64_t l, int64_t B, int64_t T)
{
    const ct_gpt_config *c = &m->cfg;
    int64_t N = B * T, C = c->d_model, HE = c->n_head * gpt_E(m), KE = c->n_kv_head * gpt_E(m);
    int64_t F = c->d_ff;
    gpt_acts *a = &m->a;
    size_t lo = (size_t)l * (size_t)N;
    gpt_block_io io = {
        .B = B, .T = T,
        .x = a->resid + lo * C, .x2 = a->x2 + lo * C, .out = a->resid + (lo + N) * C,
        .ln1 = a->ln1 + lo * C, .rstd1 = a->rstd1 + lo, .ln2 = a->ln2 + lo * C,
        .rstd2 = a->rstd2 + lo,
        .q = a->q + lo * HE, .k = a->k + lo * KE, .v = a->v + lo * KE, .att = a->att + lo * HE,
        .gu = a->gu + lo * 2 * F, .h = a->hb + lo * F,
        .lse = a->lse + lo * c->n_head, .pos = NULL, .kv = NULL,
    };
    return gpt_block_run(m, &m->w.layer[l], &io);
}

/* The final norm of the last layer's output into lnf. */
ct_status gpt_final_norm_forward(ct_gpt *m, int64_t B, int64_t T)
{
    const ct_gpt_config *c = &m->cfg;
    int64_t N = B * T, C = c->d_model;
    GPT_DEV(m, rmsnorm_fwd, m->a.lnf, m->a.rstdf, m->a.resid + (size_t)c->n_layer * N * C,
            m->w.norm, N, C, c->norm_eps);
    return CT_OK;
}

/* Embedding and every layer, then the final norm into lnf: inputs already in a.inp. */
static ct_status forward_body(ct_gpt *m, int64_t B, int64_t T)
{
    if (gpt_bf16(m) && (!m->wbf_held || m->mapped)) CT_TRY(gpt_bf16_refresh(m));
    CT_TRY(gpt_embed_forward(m, B, T));
    for (int64_t l = 0; l < m->cfg.n_layer; l++)
        CT_TRY(gpt_block_forward(m, l, B, T));
    return gpt_final_norm_forward(m, B, T);
}

/* Token rows of the fused head's blocks on the CPU when ct_gpt_options.lce_scratch_bytes is 0. */
#define GPT_LCE_ROWS 512

static ct_ce_options loss_options(const ct_gpt *m, bool train)
{
    ct_ce_options o = ct_ce_options_default();
    if (train) {
        o.z_loss = m->opt.z_loss;
        o.label_smoothing = m->opt.label_smoothing;
    }
    if (m->opt.lce_scratch_bytes) {
        o.scratch_bytes = m->opt.lce_scratch_bytes;
    } else if (gpt_host(m)) {
        /* Room for blocks of GPT_LCE_ROWS tokens (the loss evens them out): the GEMMs of a
         * block of 113 rows (what 64 MiB holds at V 128256) ran at 0.89x the rate of 452
         * rows, and each block crosses W and the weight gradient; docs/architecture.md, "The
         * fused linear cross-entropy". A device keeps its own budget (0). */
        size_t b = ct_lce_scratch_bytes_for_rows(GPT_LCE_ROWS, m->cfg.d_model, m->cfg.vocab_size,
                                                 gpt_bf16(m) ? CT_DTYPE_BF16 : CT_DTYPE_F32);
        o.scratch_bytes = b > CT_DEFAULT_SCRATCH_BYTES ? b : CT_DEFAULT_SCRATCH_BYTES;
    }
    return o;
}

ct_status ct_gpt_forward(ct_gpt *m, const int32_t *tokens, int64_t B, int64_t T, float *loss)
{
    CT_TRY(gpt_load_batch(m, tokens, B, T, "ct_gpt_forward"));
    if (!loss) return ct_error(CT_EINVAL, "ct_gpt_forward: loss must not be NULL");
    CT_TRY(forward_body(m, B, T));
    return gpt_head_loss(m, B, T, loss);
}

/* The fused head's inputs in the model's dtype: x (gpt_layer_input of lnf) and the head. */
static ct_lce_inputs head_inputs(const ct_gpt *m, gpt_input x, int64_t N)
{
    ct_lce_inputs in = {x.f, m->w.out, NULL, CT_DTYPE_F32, m->a.tgt, CT_DTYPE_I32,
                        N, m->cfg.d_model, m->cfg.vocab_size};
    if (x.b) {
        in.h = x.b;
        in.weight = gpt_wb(m, m->w.out);
        in.dtype = CT_DTYPE_BF16;
    }
    return in;
}

/* The evaluation loss (plain cross-entropy) of lnf against the targets. */
ct_status gpt_head_loss(ct_gpt *m, int64_t B, int64_t T, float *loss)
{
    int64_t N = B * T, C = m->cfg.d_model, V = m->cfg.vocab_size;
    if (m->w.hout.p)
        return ct_error(CT_EUNSUPPORTED, "ct_gpt_forward: the loss of a model whose head is mapped "
                                         "in bf16 / f16 is not computed (ct_gpt_logits gives its "
                                         "logits; ct_hf_load_params loads f32 weights)");
    ct_ce_options o = loss_options(m, false);
    ct_ce_outputs out = {gpt_host(m) ? loss : m->a.scal, NULL, NULL};
    gpt_input x;
    CT_TRY(gpt_layer_input(m, m->a.lnf, N * C, &x));
    if (!m->opt.fused_head) {
        CT_TRY(gpt_layer_linear(m, m->a.logits, V, x, m->w.out, m->w.hout, NULL, N, C, V, false));
        GPT_DEV(m, ce_fwd, &out, m->a.logits, m->a.tgt, N, V, &o);
    } else {
        ct_lce_inputs in = head_inputs(m, x, N);
        GPT_DEV(m, lce, &out, NULL, 1.0f, NULL, 0, &in, &o);
    }
    return gpt_host(m) ? CT_OK : ct_dev_d2h(m->dev, loss, m->a.scal, sizeof(float));
}

/* The forward of B sequences of T tokens already checked, then the logits of `rows` rows of
 * lnf from row r0 on into host memory `logits` (a GPU model: through a device buffer). */
static ct_status logits_of(ct_gpt *m, const int32_t *tokens, int64_t B, int64_t T, int64_t r0,
                           int64_t rows, float *logits)
{
    int64_t V = m->cfg.vocab_size, C = m->cfg.d_model;
    CT_TRY(gpt_acts_ready(m));
    memcpy(host_inp(m), tokens, (size_t)(B * T) * sizeof(int32_t)); /* documents read it */
    if (!gpt_host(m)) CT_TRY(ct_dev_h2d(m->dev, m->a.inp, m->stage, (size_t)(B * T) * sizeof(int32_t)));
    CT_TRY(forward_body(m, B, T));
    gpt_input x;
    CT_TRY(gpt_layer_input(m, m->a.lnf + r0 * C, rows * C, &x));
    if (gpt_host(m))
        return gpt_layer_linear(m, logits, V, x, m->w.out, m->w.hout, NULL, rows, C, V, false);
    size_t bytes = (size_t)(rows * V) * sizeof(float);
    float *d;
    CT_TRY(ct_dev_alloc(m->dev, bytes, "ct_gpt logits", (void **)&d));
    ct_status s = gpt_layer_linear(m, d, V, x, m->w.out, m->w.hout, NULL, rows, C, V, false);
    if (s == CT_OK) s = ct_dev_d2h(m->dev, logits, d, bytes);
    ct_dev_free(m->dev, d, bytes);
    return s;
}

ct_status ct_gpt_next_logits(ct_gpt *m, const int32_t *tokens, int64_t T, float *logits)
{
    const char *fn = "ct_gpt_next_logits";
    if (!m || !tokens || !logits) return ct_error(CT_EINVAL, "%s: arguments must not be NULL", fn);
    if (T < 1 || T > m->opt.seq)
        return ct_error(CT_EINVAL, "%s: T must be in [1, seq = %lld], got %lld", fn,
                        (long long)m->opt.seq, (long long)T);
    int64_t V = m->cfg.vocab_size, C = m->cfg.d_model;
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return ct_error(CT_EINVAL, "%s: tokens[%lld] = %d is outside the vocabulary [0, %lld)",
                            fn, (long long)t, tokens[t], (long long)V);
    (void)C;
    return logits_of(m, tokens, 1, T, T - 1, 1, logits);
}

ct_status ct_gpt_logits(ct_gpt *m, const int32_t *tokens, int64_t B, int64_t T, float *logits)
{
    const char *fn = "ct_gpt_logits";
    if (!m || !tokens || !logits) return ct_error(CT_EINVAL, "%s: arguments must not be NULL", fn);
    if (B < 1 || B > m->opt.batch)
        return ct_error(CT_EINVAL, "%s: B must be in [1, batch = %lld], got %lld", fn,
                        (long long)m->opt.batch, (long long)B);
    if (T < 1 || T > m->opt.seq)
        return ct_error(CT_EINVAL, "%s: T must be in [1, seq = %lld], got %lld", fn,
                        (long long)m->opt.seq, (long long)T);
    int64_t V = m->cfg.vocab_size, C = m->cfg.d_model;
    for (int64_t i = 0; i < B * T; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return ct_error(CT_EINVAL,
                            "%s: tokens[%lld][%lld] = %d is outside the vocabulary [0, %lld)", fn,
                            (long long)(i / T), (long long)(i % T), tokens[i], (long long)V);
    (void)C;
    return logits_of(m, tokens, B, T, 0, B * T, logits);
}

/* ---- backward ------------------------------------------------------------------------------ */

ct_status ct_gpt_forward_backward(ct_gpt *m, const int32_t *tokens, int64_t B, int64_t T,
                                  float grad_scale, float *loss)
{
    CT_TRY(gpt_load_batch(m, tokens, B, T, "ct_gpt_forward_backward"));
    if (m->mapped)
        return ct_error(CT_EINVAL, "ct_gpt_forward_backward: the model's weights are mapped from a "
                                   "file (inference only: load them with ct_hf_load_params to train)");
    CT_TRY(forward_body(m, B, T));
    CT_TRY(gpt_head_backward(m, B, T, grad_scale, loss));
    for (int64_t l = m->cfg.n_layer - 1; l >= 0; l--)
        CT_TRY(gpt_block_backward(m, l, B, T));
    return gpt_embed_backward(m, B, T);
}

/* Loss, head and final norm backward: dres = d loss / d resid[L]; the head's and the final
 * norm's gradients are accumulated (tied: the head's into the embedding's). */
ct_status gpt_head_backward(ct_gpt *m, int64_t B, int64_t T, float grad_scale, float *loss)
{
    const ct_gpt_config *c = &m->cfg;
    int64_t N = B * T, C = c->d_model, V = c->vocab_size;
    gpt_acts *a = &m->a;
    float lossv = 0;
    ct_ce_options o = loss_options(m, true);
    ct_ce_outputs out = {gpt_host(m) ? &lossv : a->scal, NULL, NULL};
    /* grad_rows (src/dist): every row's loss gradient is grad_scale / grad_rows, the factor
     * MEAN forms for a batch of grad_rows rows, of which this call holds N: reduction NONE
     * with that upstream gradient per row, the per-row losses into dtmp (free until the
     * blocks' backward) and their mean formed as MEAN's reduction forms it */
    bool rows = m->grad_rows > 0;
    if (rows) {
        if (!gpt_host(m))
            return ct_error(CT_EINTERNAL, "gpt_head_backward: grad_rows needs host memory");
        o.reduction = CT_REDUCTION_NONE;
        grad_scale = (float)((double)grad_scale / m->grad_rows);
        out.loss = a->dtmp;
    }
    /* head: dln = d loss / d lnf; the head weight's gradient is accumulated (tied: into the
     * embedding's gradient, which the embedding backward adds to below) */
    gpt_input x;
    CT_TRY(gpt_layer_input(m, a->lnf, N * C, &x));
    if (m->opt.fused_head) {
        CT_TRY(ct_dev_zero(m->dev, a->dln, (size_t)(N * C) * sizeof(float)));
        ct_lce_inputs in = head_inputs(m, x, N);
        ct_lce_grads g = {a->dln, m->g.out, NULL, true};
        GPT_DEV(m, lce, &out, &g, grad_scale, NULL, 0, &in, &o);
    } else {
        CT_TRY(gpt_layer_linear(m, a->logits, V, x, m->w.out, m->w.hout, NULL, N, C, V, false));
        GPT_DEV(m, ce_fwd, &out, a->logits, a->tgt, N, V, &o);
        GPT_DEV(m, ce_bwd, a->dlogits, grad_scale, a->logits, a->tgt, N, V, &o);
        if (x.b) { /* dlogits rounded into the logits' buffer (dead now; a.dyb holds < V) */
            uint16_t *dlb = (uint16_t *)a->logits;
            CT_TRY(gpt_to_bf16(m, dlb, a->dlogits, N * V));
            GPT_DEV(m, gemm, false, false, N, C, V, 1.0f, dlb, V, gpt_wb(m, m->w.out), C, 0.0f,
                    a->dln, C, CT_DTYPE_BF16);
            GPT_DEV(m, gemm, true, false, V, C, N, 1.0f, dlb, V, x.b, C, 1.0f, m->g.out, C,
                    CT_DTYPE_BF16);
        } else {
            CT_TRY(gpt_layer_linear_backward(m, a->dln, false, m->g.out, a->dlogits, V, x,
                                             m->w.out, N, C, V));
        }
    }
    GPT_DEV(m, rmsnorm_bwd, a->dres, m->g.norm, a->dln, a->resid + (size_t)c->n_layer * N * C,
            m->w.norm, a->rstdf, N, C);
    if (rows) { /* in row order, in double, over the rows not ignored: MEAN's own sum */
        double sum = 0, valid = 0;
        for (int64_t n = 0; n < N; n++) {
            sum += a->dtmp[n];
            valid += a->tgt[n] != o.ignore_index;
        }
        lossv = (float)(sum / valid);
    }
    if (!gpt_host(m) && loss) return ct_dev_d2h(m->dev, loss, a->scal, sizeof(float));
    if (loss) *loss = lossv;
    return CT_OK;
}

/* Layer l backward: dres = d loss / d resid[l + 1] in, d loss / d resid[l] out; the layer's
 * gradients are accumulated into m->g.layer[l]. Each product's backward goes through
 * gpt_layer_linear_backward in the model's dtype (bf16: products and gradients in f32). */
ct_status gpt_block_backward(ct_gpt *m, int64_t l, int64_t B, int64_t T)
{
    const ct_gpt_config *c = &m->cfg;
    int64_t N = B * T, C = c->d_model, E = gpt_E(m), H = c->n_head, K = c->n_kv_head;
    int64_t HE = H * E, KE = K * E, F = c->d_ff;
    gpt_acts *a = &m->a;
    const gpt_layer *w = &m->w.layer[l];
    gpt_layer *g = &m->g.layer[l];
    size_t lo = (size_t)l * (size_t)N;
    float *x = a->resid + lo * C, *x2 = a->x2 + lo * C, *ln1 = a->ln1 + lo * C,
          *ln2 = a->ln2 + lo * C;
    float *att = a->att + lo * HE, *gu = a->gu + lo * 2 * F, *h = a->hb + lo * F;
    gpt_input in;
    /* MLP block: dres is d out; d x2 = dres + rmsnorm'(w_gate_up^T swiglu'(dres w_down)) */
    CT_TRY(gpt_layer_input(m, h, N * F, &in));
    CT_TRY(gpt_layer_linear_backward(m, a->dh, false, g->wdown, a->dres, C, in, w->wdown, N, F, C));
    GPT_DEV(m, swiglu_bwd, a->dgu, a->dh, gu, N, F);
    CT_TRY(gpt_layer_input(m, ln2, N * C, &in));
    if (w->wup == w->wgu + F * C) { /* one product on [2F, C] */
        CT_TRY(gpt_layer_linear_backward(m, a->dln, false, g->wgu, a->dgu, 2 * F, in, w->wgu, N,
                                         C, 2 * F));
    } else { /* gate and up held apart: the gradients' [2F, C] at once, dln from each half */
        CT_TRY(gpt_layer_linear_backward(m, NULL, false, g->wgu, a->dgu, 2 * F, in, NULL, N, C,
                                         2 * F));
        CT_TRY(gpt_layer_linear_backward(m, a->dln, false, NULL, a->dgu, 2 * F, in, w->wgu, N, C,
                                         F));
        CT_TRY(gpt_layer_linear_backward(m, a->dln, true, NULL, a->dgu + F, 2 * F, in, w->wup, N,
                                         C, F));
    }
    GPT_DEV(m, rmsnorm_bwd, a->dtmp, g->norm2, a->dln, x2, w->norm2, a->rstd2 + lo, N, C);
    GPT_DEV(m, add, a->dres, a->dres, a->dtmp, N * C);
    /* attention block: dres is d x2 */
    if (g->bo) GPT_DEV(m, bias_grad_rows, g->bo, a->dres, N, C);
    CT_TRY(gpt_layer_input(m, att, N * HE, &in));
    CT_TRY(gpt_layer_linear_backward(m, a->datt, false, g->wo, a->dres, C, in, w->wo, N, HE, C));
    CT_TRY(attention_backward(m, (int)l, B, T));
    CT_TRY(gpt_rope(m, a->dq, B, T, H, true));
    CT_TRY(gpt_rope(m, a->dk, B, T, K, true));
    if (g->bq) {
        GPT_DEV(m, bias_grad_rows, g->bq, a->dq, N, HE);
        GPT_DEV(m, bias_grad_rows, g->bk, a->dk, N, KE);
        GPT_DEV(m, bias_grad_rows, g->bv, a->dv, N, KE);
    }
    CT_TRY(gpt_layer_input(m, ln1, N * C, &in));
    const float *dy[3] = {a->dq, a->dk, a->dv};
    const float *wt[3] = {w->wq, w->wk, w->wv};
    float *gw[3] = {g->wq, g->wk, g->wv};
    int64_t rows[3] = {HE, KE, KE};
    for (int i = 0; i < 3; i++) /* dln = dq Wq + dk Wk + dv Wv, in this order */
        CT_TRY(gpt_layer_linear_backward(m, a->dln, i > 0, gw[i], dy[i], rows[i], in, wt[i], N, C,
                                         rows[i]));
    GPT_DEV(m, rmsnorm_bwd, a->dtmp, g->norm1, a->dln, x, w->norm1, a->rstd1 + lo, N, C);
    GPT_DEV(m, add, a->dres, a->dres, a->dtmp, N * C);
    return CT_OK;
}

/* Embedding backward: dres (d loss / d resid[0]) scattered into the embedding's gradient. */
ct_status gpt_embed_backward(ct_gpt *m, int64_t B, int64_t T)
{
    GPT_DEV(m, embed_bwd, m->g.emb, m->a.dres, m->a.inp, B * T, m->cfg.vocab_size, m->cfg.d_model);
    return CT_OK;
}
