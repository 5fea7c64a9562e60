/*
 * The CPU backend: the table of device/backend.h over today's kernels (no maths lives here).
 * Statuses and messages are the kernels' own (ct_dev_result passes them through on the CPU).
 */
#include "device/device_internal.h"
#include "ctorch/attention.h"
#include "ctorch/ops.h"
#include "ctorch/ops_elementwise.h"
#include "ctorch/ops_index.h"
#include "ctorch/ops_norm.h"
#include "ctorch/optim.h"
#include "model/optim_internal.h"

#include <stdio.h>
#include <string.h>

static int cpu_count(int *n)
{
    *n = 1;
    return 0;
}

static int cpu_open(int index, const ct_backend_host *host, ct_backend **out)
{
    *out = NULL;
    return index == 0 ? 0 : ct_error(CT_EINVAL, "the CPU device has index 0, got %d", index);
}

static void cpu_close(ct_backend *b)
{
}

static const char *cpu_last_error(void)
{
    return ct_last_error();
}

static int cpu_describe(ct_backend *b, ct_backend_info *info)
{
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", ct_cpu_name());
    info->multiprocessors = ct_num_threads();
    return 0;
}

static int cpu_alloc(ct_backend *b, size_t bytes, void **out)
{
    return ct_alloc(out, bytes);
}

static void cpu_free(ct_backend *b, void *p)
{
    ct_free(p);
}

static int cpu_copy(ct_backend *b, void *dst, const void *src, size_t bytes)
{
    if (bytes) memmove(dst, src, bytes);
    return 0;
}

static int cpu_memset0(ct_backend *b, void *dst, size_t bytes)
{
    if (bytes) memset(dst, 0, bytes);
    return 0;
}

static int cpu_sync(ct_backend *b)
{
    return 0;
}

static int cpu_gemm(ct_backend *b, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C,
                    int64_t ldc, ct_dtype dtype)
{
    if (dtype == CT_DTYPE_BF16)
        return ct_gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (dtype != CT_DTYPE_F32)
        return ct_error(CT_EUNSUPPORTED, "gemm on cpu: operands must be f32 or bf16, got %s",
                        ct_dtype_name(dtype));
    return ct_gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static int cpu_add(ct_backend *b, float *out, const float *x, const float *y, int64_t n)
{
    return ct_add(out, x, y, n);
}

static int cpu_scale(ct_backend *b, float *x, float s, int64_t n)
{
    return ct_scale(x, x, s, n);
}

#define BF16_CHUNK 16384 /* values rounded per task: elementwise, so any split gives the same bits */

typedef struct bf16_job {
    uint16_t *dst;
    const float *src;
    int64_t n;
} bf16_job;

static void bf16_chunks(void *arg, int64_t c0, int64_t c1, int tid)
{
    const bf16_job *j = arg;
    (void)tid;
    for (int64_t c = c0; c < c1; c++) {
        int64_t i = c * BF16_CHUNK, k = j->n - i < BF16_CHUNK ? j->n - i : BF16_CHUNK;
        ct_convert_f32_to_bf16(j->dst + i, j->src + i, (size_t)k);
    }
}

/* Rounded in fixed chunks across threads. */
static int cpu_to_bf16(ct_backend *b, uint16_t *dst, const float *src, int64_t n)
{
    if (n <= BF16_CHUNK) {
        ct_convert_f32_to_bf16(dst, src, (size_t)n);
        return 0;
    }
    bf16_job j = {dst, src, n};
    ct_parallel_for((n + BF16_CHUNK - 1) / BF16_CHUNK, bf16_chunks, &j);
    return 0;
}

static int cpu_bias_add_rows(ct_backend *b, float *x, const float *bias, int64_t N, int64_t C)
{
    ct_bias_add_rows(x, bias, N, C);
    return 0;
}

static int cpu_bias_grad_rows(ct_backend *b, float *db, const float *d, int64_t N, int64_t C)
{
    ct_bias_grad_rows(db, d, N, C);
    return 0;
}

static int cpu_rmsnorm_fwd(ct_backend *b, float *out, float *rstd, const float *inp,
                           const float *weight, int64_t N, int64_t C, float eps)
{
    return ct_rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
}

static int cpu_rmsnorm_bwd(ct_backend *b, float *dinp, float *dweight, const float *dout,
                           const float *inp, const float *weight, const float *rstd, int64_t N,
                           int64_t C)
{
    return ct_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
}

static int cpu_rope(ct_backend *b, float *x, int64_t B, int64_t T, int64_t H, int64_t E,
                    const float *inv_freq, bool backward)
{
    return backward ? ct_rope_backward_freqs(x, x, NULL, B, T, H, E, inv_freq)
                    : ct_rope_forward_freqs(x, x, NULL, B, T, H, E, inv_freq);
}

static int cpu_swiglu_fwd(ct_backend *b, float *out, const float *inp, int64_t N, int64_t F)
{
    return ct_swiglu_forward(out, inp, N, F);
}

static int cpu_swiglu_bwd(ct_backend *b, float *dinp, const float *dout, const float *inp,
                          int64_t N, int64_t F)
{
    return ct_swiglu_backward(dinp, dout, inp, N, F);
}

static int cpu_embed_fwd(ct_backend *b, float *out, const int32_t *ids, const float *table,
                         int64_t N, int64_t V, int64_t D)
{
    return ct_embedding_forward(out, ids, CT_DTYPE_I32, table, N, V, D);
}

static int cpu_embed_bwd(ct_backend *b, float *dtable, const float *dout, const int32_t *ids,
                         int64_t N, int64_t V, int64_t D)
{
    return ct_embedding_backward(dtable, dout, ids, CT_DTYPE_I32, N, V, D,
                                 CT_EMBEDDING_NO_PADDING);
}

static int cpu_ce_fwd(ct_backend *b, ct_ce_outputs *out, const float *logits,
                      const int32_t *target, int64_t N, int64_t V, const ct_ce_options *o)
{
    return ct_cross_entropy_forward(out, logits, target, CT_DTYPE_I32, N, V, o);
}

static int cpu_ce_bwd(ct_backend *b, float *dlogits, float grad_scale, const float *logits,
                      const int32_t *target, int64_t N, int64_t V, const ct_ce_options *o)
{
    if (o->reduction != CT_REDUCTION_NONE)
        return ct_cross_entropy_backward(dlogits, &grad_scale, logits, target, CT_DTYPE_I32, N, V, o);
    float *d = NULL; /* NONE: every row's upstream gradient is grad_scale */
    CT_TRY(ct_alloc((void **)&d, (size_t)(N ? N : 1) * sizeof *d));
    for (int64_t n = 0; n < N; n++) d[n] = grad_scale;
    ct_status s = ct_cross_entropy_backward(dlogits, d, logits, target, CT_DTYPE_I32, N, V, o);
    ct_free(d);
    return s;
}

static int cpu_lce(ct_backend *b, ct_ce_outputs *out, ct_lce_grads *grads, float grad_scale,
                   const float *grad_rows, unsigned flags, const ct_lce_inputs *in,
                   const ct_ce_options *o)
{
    (void)flags; /* the CPU keeps the logits' gradient in f32 (CT_LCE_F32_GRADS or not) */
    if (!grads) return ct_linear_cross_entropy_forward(out, in, o);
    if (o->reduction != CT_REDUCTION_NONE)
        return ct_linear_cross_entropy_forward_backward(out, grads, &grad_scale, in, o);
    if (grad_rows) return ct_linear_cross_entropy_forward_backward(out, grads, grad_rows, in, o);
    float *d = NULL; /* NONE: every row's upstream gradient is grad_scale */
    CT_TRY(ct_alloc((void **)&d, (size_t)(in->N ? in->N : 1) * sizeof *d));
    for (int64_t n = 0; n < in->N; n++) d[n] = grad_scale;
    ct_status s = ct_linear_cross_entropy_forward_backward(out, grads, d, in, o);
    ct_free(d);
    return s;
}

/* The model's attention layout as tensors for ct_sdpa_*: [B, T, H, E] memory seen as
 * [B, H, T, E] (the head dim moved by strides). */
static ct_status head_view(ct_tensor *t, const void *p, int64_t B, int64_t T, int64_t H, int64_t E)
{
    int64_t shape[4] = {B, H, T, E}, strides[4] = {T * H * E, E, H * E, 1};
    return ct_tensor_wrap(t, (void *)p, CT_DTYPE_F32, 4, shape, strides);
}

static ct_status attn_views(const ct_attn_args *a, ct_tensor *q, ct_tensor *k, ct_tensor *v,
                            ct_tensor *o, ct_tensor *lse, ct_tensor *mask, ct_sdpa_options *so)
{
    if (a->dtype != CT_DTYPE_F32)
        return ct_error(CT_EUNSUPPORTED, "sdpa on cpu: f32 only, got %s", ct_dtype_name(a->dtype));
    CT_TRY(head_view(q, a->q, a->B, a->T, a->H, a->E));
    CT_TRY(head_view(k, a->k, a->B, a->T, a->Hk, a->E));
    CT_TRY(head_view(v, a->v, a->B, a->T, a->Hk, a->E));
    CT_TRY(head_view(o, a->out, a->B, a->T, a->H, a->E));
    int64_t ls[3] = {a->B, a->H, a->T};
    CT_TRY(ct_tensor_wrap(lse, a->lse, CT_DTYPE_F32, 3, ls, NULL));
    *so = ct_sdpa_options_default();
    so->scale = a->scale;
    if (!a->mask) {
        so->is_causal = true;
    } else {
        int64_t ms[4] = {a->B, 1, a->T, a->T};
        CT_TRY(ct_tensor_wrap(mask, (void *)a->mask, CT_DTYPE_BOOL, 4, ms, NULL));
        so->attn_mask = mask;
    }
    return CT_OK;
}

static int cpu_sdpa_fwd(ct_backend *b, const ct_attn_args *a)
{
    ct_tensor q, k, v, o, lse, mask;
    ct_sdpa_options so;
    CT_TRY(attn_views(a, &q, &k, &v, &o, &lse, &mask, &so));
    return ct_sdpa_forward(&q, &k, &v, &so, &o, &lse);
}

static int cpu_sdpa_bwd(ct_backend *b, const ct_attn_args *a, const ct_attn_grads *g)
{
    ct_tensor q, k, v, o, lse, mask, dout, dq, dk, dv;
    ct_sdpa_options so;
    CT_TRY(attn_views(a, &q, &k, &v, &o, &lse, &mask, &so));
    CT_TRY(head_view(&dout, g->dout, a->B, a->T, a->H, a->E));
    CT_TRY(head_view(&dq, g->dq, a->B, a->T, a->H, a->E));
    CT_TRY(head_view(&dk, g->dk, a->B, a->T, a->Hk, a->E));
    CT_TRY(head_view(&dv, g->dv, a->B, a->T, a->Hk, a->E));
    return ct_sdpa_backward(&q, &k, &v, &o, &lse, &dout, &so, &dq, &dk, &dv);
}

/* ---- flex attention: the slot's arguments onto ct_flex_attention_forward / _backward ---- */

/* The mods of a flex slot as the library's built-in ct_mask_mod / ct_score_mod, the block
 * mask as a ct_block_mask over the same lists (device memory is host memory here) and the
 * tensors as [B, H, T, E] views of the model's layout.
 * Compiled (jit) mods (mods.compiled): the host mods they were generated from run here, the
 * mask (compiled->host_mask) ANDed with the built-in bits' masks and the score mod
 * (compiled->host_score) as the score mod. Their parameter gradients are the host score mod's
 * business on the CPU: ct_flex_attention_backward adds them into host_score->param_grad (when
 * the caller set it); compiled->param_grad, the device's vector, is not used here. */
typedef struct cpu_flex {
    ct_mask_mod kids[5], all; /* all: kids[0] alone, their AND, or noop */
    int nkids;
    bool borrowed;            /* kids[nkids - 1] is compiled->host_mask (not ours to free) */
    ct_score_mod sm;
    ct_block_mask bm;
    ct_flex_options fo;
    ct_tensor q, k, v, o, lse;
} cpu_flex;

static void cpu_flex_free(cpu_flex *f)
{
    if (f->nkids > 1) ct_mask_mod_free(&f->all);
    for (int i = 0; i < f->nkids - (f->borrowed ? 1 : 0); i++) ct_mask_mod_free(&f->kids[i]);
    ct_score_mod_free(&f->sm);
}

static ct_status flex_view(ct_tensor *t, const void *p, ct_dtype dt, int64_t B, int64_t T,
                           int64_t H, int64_t E)
{
    int64_t shape[4] = {B, H, T, E}, strides[4] = {T * H * E, E, H * E, 1};
    return ct_tensor_wrap(t, (void *)p, dt, 4, shape, strides);
}

/* 1: an empty problem (nothing to compute). */
static ct_status cpu_flex_setup(const char *fn, const ct_flex_args *fa, cpu_flex *f, int *empty)
{
    memset(f, 0, sizeof *f);
    *empty = 0;
    if (!fa) return ct_error(CT_EINVAL, "%s: arguments must not be NULL", fn);
    const ct_attn_args *a = &fa->attn;
    const ct_flex_mods *md = &fa->mods;
    const ct_flex_jit *cj = md->compiled;
    if (cj && cj->host_score && md->score != CT_FLEX_SCORE_NONE)
        return ct_error(CT_EINVAL, "%s: a compiled score mod replaces the built-in score: mods.score must be NONE",
                        fn);
    if (a->mask) return ct_error(CT_EINVAL, "%s: attn.mask must be NULL (the block mask masks)", fn);
    if (!fa->block_mask) return ct_error(CT_EINVAL, "%s: block_mask must not be NULL", fn);
    if (a->E < 1) return ct_error(CT_EINVAL, "%s: head dim E must be >= 1, got %lld", fn, (long long)a->E);
    if (md->mask & ~(unsigned)(CT_FLEX_MASK_CAUSAL | CT_FLEX_MASK_WINDOW | CT_FLEX_MASK_PREFIX |
                               CT_FLEX_MASK_DOCUMENT))
        return ct_error(CT_EINVAL, "%s: unknown mask bits 0x%x", fn, md->mask);
    if (a->B == 0 || a->T == 0 || a->H == 0) {
        *empty = 1;
        return CT_OK;
    }
    const ct_dev_block_mask *dm = fa->block_mask;
    if (md->mask & CT_FLEX_MASK_CAUSAL) CT_TRY(ct_mask_mod_causal(&f->kids[f->nkids++]));
    if (md->mask & CT_FLEX_MASK_WINDOW)
        CT_TRY(ct_mask_mod_sliding_window(md->window, false, &f->kids[f->nkids++]));
    if (md->mask & CT_FLEX_MASK_PREFIX) CT_TRY(ct_mask_mod_prefix_lm(md->prefix, &f->kids[f->nkids++]));
    if (md->mask & CT_FLEX_MASK_DOCUMENT) {
        if (!md->q_doc) return ct_error(CT_EINVAL, "%s: the document mask needs q_doc", fn);
        if (md->doc_batch != 1 && md->doc_batch != a->B)
            return ct_error(CT_EINVAL, "%s: doc_batch must be 1 or B = %lld, got %lld", fn,
                            (long long)a->B, (long long)md->doc_batch);
        CT_TRY(ct_mask_mod_document(md->q_doc, md->kv_doc, md->doc_batch, a->T, a->T,
                                    &f->kids[f->nkids++]));
    }
    if (cj && cj->host_mask) {
        f->kids[f->nkids++] = *cj->host_mask;
        f->borrowed = true;
    }
    if (f->nkids == 0) CT_TRY(ct_mask_mod_noop(&f->all));
    else if (f->nkids == 1) {
        f->all = f->kids[0];
        f->all.destroy = NULL; /* kids[0]'s (or the caller's) */
    }
    else CT_TRY(ct_mask_mod_and(f->kids, f->nkids, &f->all));
    f->fo = ct_flex_options_default();
    f->fo.scale = a->scale;
    switch (md->score) {
    case CT_FLEX_SCORE_NONE:
        break;
    case CT_FLEX_SCORE_SOFTCAP:
        CT_TRY(ct_score_mod_softcap(md->softcap, &f->sm));
        f->fo.score_mod = &f->sm;
        break;
    case CT_FLEX_SCORE_ALIBI:
        if (!md->alibi_slopes) return ct_error(CT_EINVAL, "%s: ALiBi needs alibi_slopes [H]", fn);
        CT_TRY(ct_score_mod_alibi(a->H, md->alibi_slopes, &f->sm));
        f->fo.score_mod = &f->sm;
        break;
    default:
        return ct_error(CT_EINVAL, "%s: unknown score mod %d", fn, (int)md->score);
    }
    if (cj && cj->host_score) f->fo.score_mod = (ct_score_mod *)cj->host_score;
    f->bm = (ct_block_mask){.B = dm->B, .H = dm->H, .q_len = dm->q_len, .kv_len = dm->kv_len,
                            .block_size = dm->block_size, .num_q_blocks = dm->num_q_blocks,
                            .num_kv_blocks = dm->num_kv_blocks, .mask_mod = f->all,
                            .kv_ptr = (int64_t *)dm->kv_ptr, .full_kv_ptr = (int64_t *)dm->full_kv_ptr,
                            .kv_idx = (int32_t *)dm->kv_idx, .full_kv_idx = (int32_t *)dm->full_kv_idx,
                            .q_ptr = (int64_t *)dm->q_ptr, .full_q_ptr = (int64_t *)dm->full_q_ptr,
                            .q_idx = (int32_t *)dm->q_idx, .full_q_idx = (int32_t *)dm->full_q_idx};
    CT_TRY(flex_view(&f->q, a->q, a->dtype, a->B, a->T, a->H, a->E));
    CT_TRY(flex_view(&f->k, a->k, a->dtype, a->B, a->T, a->Hk, a->E));
    CT_TRY(flex_view(&f->v, a->v, a->dtype, a->B, a->T, a->Hk, a->E));
    CT_TRY(flex_view(&f->o, a->out, a->dtype, a->B, a->T, a->H, a->E));
    int64_t ls[3] = {a->B, a->H, a->T};
    return ct_tensor_wrap(&f->lse, a->lse, CT_DTYPE_F32, 3, ls, NULL);
}

static int cpu_flex_fwd(ct_backend *b, const ct_flex_args *fa)
{
    cpu_flex f;
    int empty;
    ct_status s = cpu_flex_setup("flex_fwd", fa, &f, &empty);
    if (s == CT_OK && !empty) s = ct_flex_attention_forward(&f.q, &f.k, &f.v, &f.bm, &f.fo, &f.o, &f.lse);
    cpu_flex_free(&f);
    return s;
}

static int cpu_flex_bwd(ct_backend *b, const ct_flex_args *fa, const ct_attn_grads *g)
{
    cpu_flex f;
    int empty;
    ct_status s = cpu_flex_setup("flex_bwd", fa, &f, &empty);
    if (s == CT_OK && !g) s = ct_error(CT_EINVAL, "flex_bwd: grads must not be NULL");
    if (s == CT_OK && empty) { /* no query rows: dk and dv are zero */
        const ct_attn_args *a = &fa->attn;
        size_t n = (size_t)(a->B * a->T * a->Hk * a->E) * ct_dtype_size(a->dtype);
        if (g->dk && n) memset(g->dk, 0, n);
        if (g->dv && n) memset(g->dv, 0, n);
    } else if (s == CT_OK) {
        const ct_attn_args *a = &fa->attn;
        ct_tensor dout, dq, dk, dv;
        if (!g->dout) s = ct_error(CT_EINVAL, "flex_bwd: dout must not be NULL");
        if (s == CT_OK) s = flex_view(&dout, g->dout, a->dtype, a->B, a->T, a->H, a->E);
        if (s == CT_OK && g->dq) s = flex_view(&dq, g->dq, a->dtype, a->B, a->T, a->H, a->E);
        if (s == CT_OK && g->dk) s = flex_view(&dk, g->dk, a->dtype, a->B, a->T, a->Hk, a->E);
        if (s == CT_OK && g->dv) s = flex_view(&dv, g->dv, a->dtype, a->B, a->T, a->Hk, a->E);
        if (s == CT_OK)
            s = ct_flex_attention_backward(&f.q, &f.k, &f.v, &f.o, &f.lse, &dout, &f.bm, &f.fo,
                                           g->dq ? &dq : NULL, g->dk ? &dk : NULL, g->dv ? &dv : NULL);
    }
    cpu_flex_free(&f);
    return s;
}

static int cpu_adamw(ct_backend *b, float *param, const float *grad, float *m, float *v, int64_t n,
                     int64_t step, float lr, float beta1, float beta2, float eps, float wd)
{
    ct_adamw_options o = {lr, beta1, beta2, eps, wd};
    return ct_adamw_step(param, grad, m, v, n, step, &o);
}

static int cpu_sumsq(ct_backend *b, double *out, const float *g, int64_t n)
{
    return ct_grad_sumsq(g, n, out);
}

static const ct_backend_ops cpu_ops = {
    .api_version = CT_BACKEND_API_VERSION,
    .kind = "cpu",
    .count = cpu_count,
    .open = cpu_open,
    .close = cpu_close,
    .last_error = cpu_last_error,
    .describe = cpu_describe,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
    .memset0 = cpu_memset0,
    .sync = cpu_sync,
    .gemm = cpu_gemm,
    .add = cpu_add,
    .scale = cpu_scale,
    .to_bf16 = cpu_to_bf16,
    .bias_add_rows = cpu_bias_add_rows,
    .bias_grad_rows = cpu_bias_grad_rows,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .rope = cpu_rope,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .embed_fwd = cpu_embed_fwd,
    .embed_bwd = cpu_embed_bwd,
    .ce_fwd = cpu_ce_fwd,
    .ce_bwd = cpu_ce_bwd,
    .lce = cpu_lce,
    .sdpa_fwd = cpu_sdpa_fwd,
    .sdpa_bwd = cpu_sdpa_bwd,
    .adamw = cpu_adamw,
    .sumsq = cpu_sumsq,
    .flex_fwd = cpu_flex_fwd,
    .flex_bwd = cpu_flex_bwd,
};

const ct_backend_ops *ct_cpu_backend_ops(void)
{
    return &cpu_ops;
}
