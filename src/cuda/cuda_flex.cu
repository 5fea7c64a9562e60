/*
 * FlexAttention on the GPU (flex_fwd, flex_bwd): the definitions of ct_flex_attention_forward
 * / _backward (src/attention/flex.c) over a block mask uploaded to the device
 * (ct_dev_block_mask) with the built-in mods of ct_flex_mods, in f32 with f32 accumulation,
 * f32 or bf16 q / k / v / out / gradients.
 *
 * Layout (backend.h's ct_attn_args): q, out, dout, dq [B, T, H, E]; k, v, dk, dv
 * [B, T, Hk, E]; query head h reads kv head h / (H / Hk); lse [B, H, T] (natural log).
 *
 * For query i and key j: s = (scale * q_i) . k_j, s = score_mod(s), s = -inf where the mask
 * says no; out_i = softmax_j(s) v. A row with no kept key: out = 0, lse = -inf, gradients 0.
 *
 * Tiling as cuda_attn.cu (FlashAttention-2 style on CUDA cores): tiles of BR query rows and
 * BR keys (BR = 64 for E <= 128, 32 for E <= 256), 256 threads = 8 warps per block, each warp
 * owning BR / 8 rows of the tile; tiles widened to f32 in shared memory with a row stride of
 * E | 1 floats. BR divides the mask's block size (64 or 128), so a tile lies in one block.
 *   forward: one block per (b, h, query tile): the key blocks of the tile's mask row in
 *     ascending order (partial and full lists merged), each as BR-key tiles; partial blocks
 *     evaluate the mask per pair, full blocks do not; online softmax per row;
 *   backward: D = rowsum(dout * out) (one warp per row);
 *     dq: one block per (b, h, query tile) over the same key blocks in the same order;
 *     dk, dv: one block per (b, kv head, key tile): the query heads of the group in head
 *     order, for each the query blocks of the mask column (q_ptr / q_idx lists merged) in
 *     ascending order, each as BR-query tiles.
 * Scores are the same products in the same order in all three kernels, so the backward's
 * probabilities exp(s - lse) use the forward's scores. No atomics, launch shapes from the
 * sizes only, every sum in a fixed order: the same bits run to run.
 *
 * The kernels' text is src/cuda/cuda_flex_kernels.cuh, templated over the mods: this file
 * instantiates it for the built-in mods; compiled (jit) mods run the same text compiled at run
 * time with them (cuda_flex_jit.cu), launched from here through the module.
 */
#include "cuda/cuda_flex_kernels.cuh"
#include "cuda/cuda_internal.cuh"

#include <cuda_bf16.h>
#include <math.h>

static_assert((int)ctcu_flex::FXM_CAUSAL == (int)CT_FLEX_MASK_CAUSAL &&
                  (int)ctcu_flex::FXM_WINDOW == (int)CT_FLEX_MASK_WINDOW &&
                  (int)ctcu_flex::FXM_PREFIX == (int)CT_FLEX_MASK_PREFIX &&
                  (int)ctcu_flex::FXM_DOCUMENT == (int)CT_FLEX_MASK_DOCUMENT,
              "cuda_flex_kernels.cuh's mask bits are backend.h's");
static_assert((int)ctcu_flex::FXS_NONE == (int)CT_FLEX_SCORE_NONE &&
                  (int)ctcu_flex::FXS_SOFTCAP == (int)CT_FLEX_SCORE_SOFTCAP &&
                  (int)ctcu_flex::FXS_ALIBI == (int)CT_FLEX_SCORE_ALIBI,
              "cuda_flex_kernels.cuh's score mods are backend.h's");

namespace {

using namespace ctcu_flex;

/* ---- the kernels for the built-in mods ----------------------------------------------------- */

template <typename T, int EC, int BR>
__global__ void __launch_bounds__(FX_THREADS)
    k_flex_fwd(const T *q, const T *k, const T *v, T *out, float *lse, Dims d, Mask mk, Mods md)
{
    extern __shared__ float sm[];
    flex_fwd_body<T, EC, BR, Mods>(sm, q, k, v, out, lse, d, mk, md);
}

template <typename T, int EC, int BR>
__global__ void __launch_bounds__(FX_THREADS)
    k_flex_dq(const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *D, T *dq,
              Dims d, Mask mk, Mods md)
{
    extern __shared__ float sm[];
    flex_dq_body<T, EC, BR, Mods>(sm, q, k, v, dout, lse, D, dq, d, mk, md, PGrad{NULL, 0, 0});
}

template <typename T, int EC, int BR>
__global__ void __launch_bounds__(FX_THREADS)
    k_flex_dkv(const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *D, T *dk,
               T *dv, Dims d, Mask mk, Mods md)
{
    extern __shared__ float sm[];
    flex_dkv_body<T, EC, BR, Mods>(sm, q, k, v, dout, lse, D, dk, dv, d, mk, md);
}

/* D[b, h, t] = sum_e dout[b, t, h, e] * out[b, t, h, e]: one warp per row. */
template <typename T>
__global__ void __launch_bounds__(FX_THREADS) k_flex_rowdot(float *D, const T *dout, const T *out, Dims d)
{
    const int64_t rows = d.B * d.T * d.H;
    const int lane = threadIdx.x & 31;
    for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < rows;
         w += ((int64_t)gridDim.x * blockDim.x) >> 5) {
        /* w = (b * T + t) * H + h */
        int64_t h = w % d.H, bt = w / d.H, t = bt % d.T, b = bt / d.T;
        float s = 0.0f;
        for (int64_t e = lane; e < d.E; e += 32) s += ld_elem(dout, w * d.E + e) * ld_elem(out, w * d.E + e);
        s = warp_sum(s);
        if (lane == 0) D[(b * d.H + h) * d.T + t] = s;
    }
}

/* ---- host side ---------------------------------------------------------------------------------- */

/* Dynamic shared memory beyond 48 KiB needs the kernel's opt-in. */
template <typename K>
int allow_smem(K kernel, size_t bytes, const char *what)
{
    return ctcu_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
                      what);
}

template <typename T, int EC, int BR>
int fwd_launch(ct_backend *b, const ct_flex_args *a, const Setup &s)
{
    size_t sh = smem_fwd(s.d.E, BR);
    int rc = allow_smem(k_flex_fwd<T, EC, BR>, sh, "flex_fwd: shared memory");
    if (rc) return rc;
    int64_t units = (s.d.T + BR - 1) / BR * s.d.B * s.d.H;
    k_flex_fwd<T, EC, BR><<<unit_grid(units), FX_THREADS, sh, ctcu_stream(b)>>>(
        (const T *)a->attn.q, (const T *)a->attn.k, (const T *)a->attn.v, (T *)a->attn.out, a->attn.lse, s.d,
        s.mk, s.md);
    return ctcu_launched("flex_fwd");
}

template <typename T, int EC, int BR>
int bwd_launch(ct_backend *b, const ct_flex_args *a, const ct_attn_grads *g, const Setup &s, const float *D)
{
    cudaStream_t st = ctcu_stream(b);
    const ct_attn_args *at = &a->attn;
    int rc = 0;
    if (g->dq) {
        size_t sh = smem_dq(s.d.E, BR);
        if ((rc = allow_smem(k_flex_dq<T, EC, BR>, sh, "flex_bwd: shared memory (dq)"))) return rc;
        int64_t units = (s.d.T + BR - 1) / BR * s.d.B * s.d.H;
        k_flex_dq<T, EC, BR><<<unit_grid(units), FX_THREADS, sh, st>>>(
            (const T *)at->q, (const T *)at->k, (const T *)at->v, (const T *)g->dout, at->lse, D, (T *)g->dq, s.d,
            s.mk, s.md);
        if ((rc = ctcu_launched("flex_bwd: dq"))) return rc;
    }
    if (g->dk || g->dv) {
        size_t sh = smem_dkv(s.d.E, BR);
        if ((rc = allow_smem(k_flex_dkv<T, EC, BR>, sh, "flex_bwd: shared memory (dk, dv)"))) return rc;
        int64_t units = (s.d.T + BR - 1) / BR * s.d.B * s.d.Hk;
        k_flex_dkv<T, EC, BR><<<unit_grid(units), FX_THREADS, sh, st>>>(
            (const T *)at->q, (const T *)at->k, (const T *)at->v, (const T *)g->dout, at->lse, D, (T *)g->dk,
            (T *)g->dv, s.d, s.mk, s.md);
        if ((rc = ctcu_launched("flex_bwd: dk, dv"))) return rc;
    }
    return 0;
}

/* Checks only this backend makes; fills s. -1: nothing to compute (an empty problem). */
int flex_setup(const char *slot, const ct_flex_args *fa, Setup *s)
{
    if (!fa) return ctcu_fail(CT_EINVAL, "%s: arguments must not be NULL", slot);
    const ct_attn_args *a = &fa->attn;
    const ct_flex_mods *m = &fa->mods;
    if (a->mask) return ctcu_fail(CT_EINVAL, "%s: attn.mask must be NULL (the block mask masks)", slot);
    if (!fa->block_mask) return ctcu_fail(CT_EINVAL, "%s: block_mask must not be NULL", slot);
    if (a->dtype != CT_DTYPE_F32 && a->dtype != CT_DTYPE_BF16)
        return ctcu_fail(CT_EUNSUPPORTED, "%s: q, k, v must be f32 or bf16 (dtype %d)", slot, (int)a->dtype);
    if (a->B < 0 || a->T < 0 || a->H < 0 || a->Hk < 0)
        return ctcu_fail(CT_EINVAL, "%s: sizes must be >= 0", slot);
    if (a->E < 1 || a->E > FX_E_MAX)
        return ctcu_fail(a->E < 1 ? CT_EINVAL : CT_EUNSUPPORTED, "%s on cuda: head dim E = %lld is not in [1, %d]",
                         slot, (long long)a->E, FX_E_MAX);
    if (a->H > 0 && (a->Hk < 1 || a->H % a->Hk != 0))
        return ctcu_fail(CT_EINVAL, "%s: H = %lld must be a multiple of Hk = %lld", slot, (long long)a->H,
                         (long long)a->Hk);
    if (m->mask & ~(unsigned)(CT_FLEX_MASK_CAUSAL | CT_FLEX_MASK_WINDOW | CT_FLEX_MASK_PREFIX | CT_FLEX_MASK_DOCUMENT))
        return ctcu_fail(CT_EINVAL, "%s: unknown mask bits 0x%x", slot, m->mask);
    s->d = {a->B, a->T, a->H, a->Hk, a->E, a->H > 0 ? a->H / a->Hk : 1, a->scale};
    if (a->B == 0 || a->T == 0 || a->H == 0) return -1;
    const ct_dev_block_mask *bm = fa->block_mask;
    if (bm->block_size != 64 && bm->block_size != 128)
        return ctcu_fail(CT_EUNSUPPORTED, "%s on cuda: block mask block size %lld (64 or 128 here)", slot,
                         (long long)bm->block_size);
    int64_t nb = (a->T + bm->block_size - 1) / bm->block_size;
    if (bm->q_len != a->T || bm->kv_len != a->T || bm->num_q_blocks != nb || bm->num_kv_blocks != nb)
        return ctcu_fail(CT_EINVAL, "%s: block mask is for Q_LEN=%lld KV_LEN=%lld, the attention has T=%lld", slot,
                         (long long)bm->q_len, (long long)bm->kv_len, (long long)a->T);
    if ((bm->B != 1 && bm->B != a->B) || (bm->H != 1 && bm->H != a->H))
        return ctcu_fail(CT_EINVAL, "%s: block mask B=%lld H=%lld must be 1 or match B=%lld H=%lld", slot,
                         (long long)bm->B, (long long)bm->H, (long long)a->B, (long long)a->H);
    if (!bm->kv_ptr || !bm->full_kv_ptr || !bm->q_ptr || !bm->full_q_ptr || !bm->kv_idx || !bm->full_kv_idx ||
        !bm->q_idx || !bm->full_q_idx)
        return ctcu_fail(CT_EINVAL, "%s: the block mask's lists must not be NULL", slot);
    s->mk = {bm->B,      bm->H,           bm->block_size, bm->num_q_blocks, bm->num_kv_blocks,
             bm->kv_ptr, bm->full_kv_ptr, bm->q_ptr,      bm->full_q_ptr,   bm->kv_idx,
             bm->full_kv_idx, bm->q_idx,  bm->full_q_idx};
    if ((m->mask & CT_FLEX_MASK_WINDOW) && m->window < 0)
        return ctcu_fail(CT_EINVAL, "%s: window must be >= 0, got %lld", slot, (long long)m->window);
    if ((m->mask & CT_FLEX_MASK_PREFIX) && m->prefix < 0)
        return ctcu_fail(CT_EINVAL, "%s: prefix must be >= 0, got %lld", slot, (long long)m->prefix);
    if (m->mask & CT_FLEX_MASK_DOCUMENT) {
        if (!m->q_doc) return ctcu_fail(CT_EINVAL, "%s: the document mask needs q_doc", slot);
        if (m->doc_batch != 1 && m->doc_batch != a->B)
            return ctcu_fail(CT_EINVAL, "%s: doc_batch must be 1 or B = %lld, got %lld", slot, (long long)a->B,
                             (long long)m->doc_batch);
    }
    switch (m->score) {
    case CT_FLEX_SCORE_NONE:
        break;
    case CT_FLEX_SCORE_SOFTCAP:
        if (!(m->softcap > 0.0f) || isinf(m->softcap))
            return ctcu_fail(CT_EINVAL, "%s: softcap must be finite and > 0, got %g", slot, (double)m->softcap);
        break;
    case CT_FLEX_SCORE_ALIBI:
        if (!m->alibi_slopes) return ctcu_fail(CT_EINVAL, "%s: ALiBi needs alibi_slopes [H]", slot);
        break;
    default:
        return ctcu_fail(CT_EINVAL, "%s: unknown score mod %d", slot, (int)m->score);
    }
    s->md = {m->mask,  m->window, m->prefix, a->T, m->doc_batch, m->q_doc, m->kv_doc ? m->kv_doc : m->q_doc,
             (int)m->score, m->softcap, m->alibi_slopes};
    if (m->compiled) return ctcu_flex_jit_check(slot, fa);
    return 0;
}

template <typename T>
int fwd_dispatch(ct_backend *b, const ct_flex_args *a, const Setup &s)
{
    if (s.d.E <= 32) return fwd_launch<T, 1, 64>(b, a, s);
    if (s.d.E <= 64) return fwd_launch<T, 2, 64>(b, a, s);
    if (s.d.E <= 128) return fwd_launch<T, 4, 64>(b, a, s);
    return fwd_launch<T, 8, 32>(b, a, s);
}

template <typename T>
int bwd_dispatch(ct_backend *b, const ct_flex_args *a, const ct_attn_grads *g, const Setup &s, float *D)
{
    int64_t rows = s.d.B * s.d.T * s.d.H;
    unsigned grid = ctcu_blocks(rows, FX_WARPS); /* one warp per row */
    if (grid > 65535u * 16u) grid = 65535u * 16u;
    k_flex_rowdot<T><<<grid, FX_THREADS, 0, ctcu_stream(b)>>>(D, (const T *)g->dout, (const T *)a->attn.out, s.d);
    int rc = ctcu_launched("flex_bwd: rowsum(dout * out)");
    if (rc) return rc;
    if (a->mods.compiled) return ctcu_flex_jit_bwd(b, a, g, s, D);
    if (s.d.E <= 32) return bwd_launch<T, 1, 64>(b, a, g, s, D);
    if (s.d.E <= 64) return bwd_launch<T, 2, 64>(b, a, g, s, D);
    if (s.d.E <= 128) return bwd_launch<T, 4, 64>(b, a, g, s, D);
    return bwd_launch<T, 8, 32>(b, a, g, s, D);
}

} /* namespace */

extern "C" int ctcu_flex_fwd(ct_backend *b, const ct_flex_args *a)
{
    Setup s = {};
    int rc = flex_setup("flex_fwd", a, &s);
    if (rc) return rc < 0 ? 0 : rc;
    static_assert(64 % FX_WARPS == 0 && 32 % FX_WARPS == 0, "tile rows per warp");
    if (!a->attn.q || !a->attn.k || !a->attn.v || !a->attn.out || !a->attn.lse)
        return ctcu_fail(CT_EINVAL, "flex_fwd: q, k, v, out and lse must not be NULL");
    if (a->mods.compiled) return ctcu_flex_jit_fwd(b, a, s);
    return a->attn.dtype == CT_DTYPE_BF16 ? fwd_dispatch<uint16_t>(b, a, s) : fwd_dispatch<float>(b, a, s);
}

extern "C" int ctcu_flex_bwd(ct_backend *b, const ct_flex_args *a, const ct_attn_grads *g)
{
    Setup s = {};
    int rc = flex_setup("flex_bwd", a, &s);
    if (rc > 0) return rc;
    if (!g) return ctcu_fail(CT_EINVAL, "flex_bwd: grads must not be NULL");
    const ct_attn_args *at = &a->attn;
    if (rc < 0) { /* no query rows: dk and dv are zero */
        size_t bytes = (size_t)(at->B * at->T * at->Hk * at->E) * (at->dtype == CT_DTYPE_BF16 ? 2 : 4);
        cudaStream_t st = ctcu_stream(b);
        if (bytes && g->dk && (rc = ctcu_check(cudaMemsetAsync(g->dk, 0, bytes, st), "flex_bwd: zero dk")))
            return rc;
        if (bytes && g->dv && (rc = ctcu_check(cudaMemsetAsync(g->dv, 0, bytes, st), "flex_bwd: zero dv")))
            return rc;
        return 0;
    }
    bool pgrad = a->mods.compiled && a->mods.compiled->param_grad;
    if (!g->dq && !g->dk && !g->dv && !pgrad) return 0;
    if (!g->dout || !at->q || !at->k || !at->v || !at->out || !at->lse)
        return ctcu_fail(CT_EINVAL, "flex_bwd: q, k, v, out, lse and dout must not be NULL");
    void *D = NULL;
    if ((rc = ctcu_scratch(b, (size_t)(s.d.B * s.d.H * s.d.T) * sizeof(float), &D))) return rc;
    rc = at->dtype == CT_DTYPE_BF16 ? bwd_dispatch<uint16_t>(b, a, g, s, (float *)D)
                                    : bwd_dispatch<float>(b, a, g, s, (float *)D);
    ctcu_scratch_free(b, D);
    return rc;
}
