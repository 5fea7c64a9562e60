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
 */
#include "cuda/cuda_attn_common.cuh"
#include "cuda/cuda_internal.cuh"

#include <cuda_bf16.h>
#include <math.h>

#define FX_THREADS 256
#define FX_WARPS (FX_THREADS / 32)
#define FX_E_MAX 256

namespace {

using namespace ctcu_attn;

/* The block mask's lists (device pointers) and its broadcast. */
struct Mask {
    int64_t B, H, bs, nqb, nkb;
    const int64_t *kv_ptr, *full_kv_ptr, *q_ptr, *full_q_ptr;
    const int32_t *kv_idx, *full_kv_idx, *q_idx, *full_q_idx;
};

/* The built-in mods (ct_flex_mods) with T for the document ids' rows. */
struct Mods {
    unsigned bits;
    int64_t window, prefix, T, doc_batch;
    const int32_t *q_doc, *kv_doc;
    int score;
    float cap;
    const float *slopes;
};

/* ---- mods ----------------------------------------------------------------------------------- */

/* Whether query q may attend key kv of batch b: the AND of the masks of the bits set. */
__device__ __forceinline__ bool keep_pair(const Mods &m, int64_t b, int64_t q, int64_t kv)
{
    if ((m.bits & CT_FLEX_MASK_CAUSAL) && kv > q) return false;
    if (m.bits & CT_FLEX_MASK_WINDOW) {
        int64_t dd = q - kv;
        if (dd > m.window || -dd > m.window) return false;
    }
    if ((m.bits & CT_FLEX_MASK_PREFIX) && !(kv < m.prefix || kv <= q)) return false;
    if (m.bits & CT_FLEX_MASK_DOCUMENT) {
        int64_t r = (m.doc_batch == 1 ? 0 : b) * m.T;
        if (m.q_doc[r + q] != m.kv_doc[r + kv]) return false;
    }
    return true;
}

/* score_mod(s) for query q and key kv (slope: the head's ALiBi slope). Rounded step by step as
 * the CPU mods (no contraction into fused multiply-adds). */
__device__ __forceinline__ float mod_score(const Mods &m, float s, float slope, int64_t q, int64_t kv)
{
    if (m.score == CT_FLEX_SCORE_SOFTCAP) return __fmul_rn(m.cap, tanhf(__fdiv_rn(s, m.cap)));
    if (m.score == CT_FLEX_SCORE_ALIBI) return __fadd_rn(s, __fmul_rn(slope, (float)(kv - q)));
    return s;
}

/* d score_mod / d s at the score s before the mod. */
__device__ __forceinline__ float mod_grad(const Mods &m, float s)
{
    if (m.score == CT_FLEX_SCORE_SOFTCAP) {
        float t = tanhf(__fdiv_rn(s, m.cap));
        return __fsub_rn(1.0f, __fmul_rn(t, t));
    }
    return 1.0f;
}

/* What the mask is over the tile of queries [q0, q0 + nq) x keys [k0, k0 + nk) of a partial
 * block: 0 every pair masked, 2 every pair kept, 1 mixed or not known (documents). From the
 * band bits' structure in O(1), exact like the CPU mods' classifiers; a skipped tile adds
 * exact zeros (nothing to a softmax sum, a maximum or a product), so the results are those of
 * the per-pair mask (up to the sign of a zero). */
__device__ __forceinline__ int tile_kind(const Mods &m, int64_t q0, int64_t nq, int64_t k0, int64_t nk)
{
    int64_t q1 = q0 + nq - 1, k1 = k0 + nk - 1; /* inclusive */
    int64_t dmin = q0 - k1, dmax = q1 - k0;  /* the range of q - kv */
    bool full = !(m.bits & CT_FLEX_MASK_DOCUMENT);
    if (m.bits & CT_FLEX_MASK_CAUSAL) {
        if (dmax < 0) return 0;
        full = full && dmin >= 0;
    }
    if (m.bits & CT_FLEX_MASK_WINDOW) {
        if (dmax < -m.window || dmin > m.window) return 0;
        full = full && dmin >= -m.window && dmax <= m.window;
    }
    if (m.bits & CT_FLEX_MASK_PREFIX) {
        if (k0 >= m.prefix && dmax < 0) return 0;
        full = full && (k1 < m.prefix || dmin >= 0);
    }
    return full ? 2 : 1;
}

/* ---- block lists ---------------------------------------------------------------------------- */

struct BList {
    const int32_t *full, *part;
    int64_t nfull, npart, a, p;
};

/* The key blocks of query block qb of (b, h). */
__device__ __forceinline__ BList row_list(const Mask &m, int64_t b, int64_t h, int64_t qb)
{
    int64_t r = ((m.B == 1 ? 0 : b) * m.H + (m.H == 1 ? 0 : h)) * m.nqb + qb;
    int64_t f0 = m.full_kv_ptr[r], p0 = m.kv_ptr[r];
    return {m.full_kv_idx + f0, m.kv_idx + p0, m.full_kv_ptr[r + 1] - f0, m.kv_ptr[r + 1] - p0, 0, 0};
}

/* The query blocks of key block kb of (b, h). */
__device__ __forceinline__ BList col_list(const Mask &m, int64_t b, int64_t h, int64_t kb)
{
    int64_t c = ((m.B == 1 ? 0 : b) * m.H + (m.H == 1 ? 0 : h)) * m.nkb + kb;
    int64_t f0 = m.full_q_ptr[c], p0 = m.q_ptr[c];
    return {m.full_q_idx + f0, m.q_idx + p0, m.full_q_ptr[c + 1] - f0, m.q_ptr[c + 1] - p0, 0, 0};
}

/* The next block in ascending order (-1 when done); *partial says which list it came from.
 * Every thread of a block walks the same list: the answers are block-uniform. */
__device__ __forceinline__ int64_t next_block(BList &l, bool *partial)
{
    bool hf = l.a < l.nfull, hp = l.p < l.npart;
    if (!hf && !hp) return -1;
    if (hp && (!hf || l.part[l.p] < l.full[l.a])) {
        *partial = true;
        return l.part[l.p++];
    }
    *partial = false;
    return l.full[l.a++];
}

/* ---- forward ---------------------------------------------------------------------------------- */

template <typename T, int EC, int BR>
__global__ void __launch_bounds__(FX_THREADS)
    k_flex_fwd(const T *q, const T *k, const T *v, T *out, float *lse, Dims d, Mask mk, Mods md)
{
    constexpr int RW = BR / FX_WARPS, KPL = BR / 32;
    extern __shared__ float sm[];
    const int E = (int)d.E, S = E | 1;
    float *Qs = sm, *Ks = Qs + BR * S, *Vs = Ks + BR * S, *Ps = Vs + BR * S;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *Pw = Ps + warp * BR;
    const int64_t nqt = (d.T + BR - 1) / BR, units = nqt * d.B * d.H;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        int64_t qt = nqt - 1 - u % nqt, bh = u / nqt, b = bh / d.H, h = bh % d.H, hk = h / d.G;
        int64_t q0 = qt * BR;
        int nq = (int)(d.T - q0 < BR ? d.T - q0 : BR);
        float slope = md.score == CT_FLEX_SCORE_ALIBI ? md.slopes[h] : 0.0f;
        __syncthreads(); /* the previous unit is done with the tiles */
        load_tile<T, BR>(Qs, S, q, b, q0, nq, h, d.H, d, d.scale);
        float m[RW], l[RW], acc[RW][EC];
#pragma unroll
        for (int i = 0; i < RW; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
#pragma unroll
            for (int c = 0; c < EC; c++) acc[i][c] = 0.0f;
        }
        BList bl = row_list(mk, b, h, q0 / mk.bs);
        bool partial = false;
        int64_t kb;
        while ((kb = next_block(bl, &partial)) >= 0) {
            int64_t kend = (kb + 1) * mk.bs < d.T ? (kb + 1) * mk.bs : d.T;
            for (int64_t k0 = kb * mk.bs; k0 < kend; k0 += BR) {
                int nk = (int)(kend - k0 < BR ? kend - k0 : BR);
                int kind = partial ? tile_kind(md, q0, nq, k0, nk) : 2; /* block-uniform */
                if (kind == 0) continue;
                bool per_pair = kind == 1;
                __syncthreads();
                load_tile<T, BR>(Ks, S, k, b, k0, nk, hk, d.Hk, d, 1.0f);
                load_tile<T, BR>(Vs, S, v, b, k0, nk, hk, d.Hk, d, 1.0f);
                __syncthreads();
#pragma unroll
                for (int i = 0; i < RW; i++) {
                    int r = warp * RW + i;
                    if (r >= nq) continue; /* warp-uniform */
                    int64_t tq = q0 + r;
                    float s[KPL], mt = -INFINITY;
#pragma unroll
                    for (int c = 0; c < KPL; c++) {
                        int j = lane + 32 * c;
                        float x = -INFINITY;
                        if (j < nk && (!per_pair || keep_pair(md, b, tq, k0 + j)))
                            x = mod_score(md, dot(Qs + r * S, Ks + j * S, E), slope, tq, k0 + j);
                        s[c] = x;
                        mt = nan_max(mt, x);
                    }
                    mt = warp_max(mt);
                    float mn = nan_max(m[i], mt);
                    if (mn == -INFINITY) continue; /* no key kept yet: nothing to add (warp-uniform) */
                    float alpha = m[i] == -INFINITY ? 0.0f : expf(m[i] - mn);
                    float ps = 0.0f;
#pragma unroll
                    for (int c = 0; c < KPL; c++) {
                        float p = s[c] == -INFINITY ? 0.0f : expf(s[c] - mn);
                        Pw[lane + 32 * c] = p;
                        ps += p;
                    }
                    ps = warp_sum(ps);
                    l[i] = l[i] * alpha + ps;
                    m[i] = mn;
                    __syncwarp();
#pragma unroll
                    for (int c = 0; c < EC; c++) {
                        int e = lane + 32 * c;
                        if (e < E) {
                            float a = acc[i][c] * alpha;
                            for (int j = 0; j < nk; j++) a += Pw[j] * Vs[j * S + e];
                            acc[i][c] = a;
                        }
                    }
                    __syncwarp();
                }
            }
        }
#pragma unroll
        for (int i = 0; i < RW; i++) {
            int r = warp * RW + i;
            if (r >= nq) continue;
            int64_t tq = q0 + r;
            int64_t base = ((b * d.T + tq) * d.H + h) * d.E;
            float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f; /* no key kept: out = 0 */
#pragma unroll
            for (int c = 0; c < EC; c++) {
                int e = lane + 32 * c;
                if (e < E) st_elem(out, base + e, acc[i][c] * inv);
            }
            if (lane == 0) lse[(b * d.H + h) * d.T + tq] = l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
        }
    }
}

/* ---- backward --------------------------------------------------------------------------------- */

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

/* A row's lse as the backward uses it: a row with no kept key (-inf) becomes +inf, so every
 * exp(s - lse) is 0. */
__device__ __forceinline__ float bwd_lse(float x)
{
    return x == -INFINITY ? INFINITY : x;
}

template <typename T, int EC, int BR>
__global__ void __launch_bounds__(FX_THREADS)
    k_flex_dq(const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *D, T *dq,
              Dims d, Mask mk, Mods md)
{
    constexpr int RW = BR / FX_WARPS, KPL = BR / 32;
    extern __shared__ float sm[];
    const int E = (int)d.E, S = E | 1;
    float *Qs = sm, *Os = Qs + BR * S, *Ks = Os + BR * S, *Vs = Ks + BR * S, *Ps = Vs + BR * S;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *Pw = Ps + warp * BR;
    const int64_t nqt = (d.T + BR - 1) / BR, units = nqt * d.B * d.H;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        int64_t qt = nqt - 1 - u % nqt, bh = u / nqt, b = bh / d.H, h = bh % d.H, hk = h / d.G;
        int64_t q0 = qt * BR;
        int nq = (int)(d.T - q0 < BR ? d.T - q0 : BR);
        float slope = md.score == CT_FLEX_SCORE_ALIBI ? md.slopes[h] : 0.0f;
        __syncthreads();
        load_tile<T, BR>(Qs, S, q, b, q0, nq, h, d.H, d, d.scale);
        load_tile<T, BR>(Os, S, dout, b, q0, nq, h, d.H, d, 1.0f);
        float acc[RW][EC], Lr[RW], Dr[RW];
#pragma unroll
        for (int i = 0; i < RW; i++) {
            int r = warp * RW + i;
            int64_t row = (b * d.H + h) * d.T + q0 + (r < nq ? r : 0);
            Lr[i] = bwd_lse(lse[row]);
            Dr[i] = D[row];
#pragma unroll
            for (int c = 0; c < EC; c++) acc[i][c] = 0.0f;
        }
        BList bl = row_list(mk, b, h, q0 / mk.bs);
        bool partial = false;
        int64_t kb;
        while ((kb = next_block(bl, &partial)) >= 0) {
            int64_t kend = (kb + 1) * mk.bs < d.T ? (kb + 1) * mk.bs : d.T;
            for (int64_t k0 = kb * mk.bs; k0 < kend; k0 += BR) {
                int nk = (int)(kend - k0 < BR ? kend - k0 : BR);
                int kind = partial ? tile_kind(md, q0, nq, k0, nk) : 2; /* block-uniform */
                if (kind == 0) continue;
                bool per_pair = kind == 1;
                __syncthreads();
                load_tile<T, BR>(Ks, S, k, b, k0, nk, hk, d.Hk, d, 1.0f);
                load_tile<T, BR>(Vs, S, v, b, k0, nk, hk, d.Hk, d, 1.0f);
                __syncthreads();
#pragma unroll
                for (int i = 0; i < RW; i++) {
                    int r = warp * RW + i;
                    if (r >= nq) continue; /* warp-uniform */
                    int64_t tq = q0 + r;
#pragma unroll
                    for (int c = 0; c < KPL; c++) {
                        int j = lane + 32 * c;
                        float ds = 0.0f;
                        if (j < nk && (!per_pair || keep_pair(md, b, tq, k0 + j))) {
                            float raw = dot(Qs + r * S, Ks + j * S, E);
                            float p = expf(mod_score(md, raw, slope, tq, k0 + j) - Lr[i]);
                            float dp = dot(Os + r * S, Vs + j * S, E);
                            ds = p * (dp - Dr[i]);
                            if (md.score == CT_FLEX_SCORE_SOFTCAP) ds = __fmul_rn(ds, mod_grad(md, raw));
                        }
                        Pw[j] = ds;
                    }
                    __syncwarp();
#pragma unroll
                    for (int c = 0; c < EC; c++) {
                        int e = lane + 32 * c;
                        if (e < E) {
                            float a = acc[i][c];
                            for (int j = 0; j < nk; j++) a += Pw[j] * Ks[j * S + e];
                            acc[i][c] = a;
                        }
                    }
                    __syncwarp();
                }
            }
        }
#pragma unroll
        for (int i = 0; i < RW; i++) {
            int r = warp * RW + i;
            if (r >= nq) continue;
            int64_t base = ((b * d.T + q0 + r) * d.H + h) * d.E;
#pragma unroll
            for (int c = 0; c < EC; c++) {
                int e = lane + 32 * c;
                if (e < E) st_elem(dq, base + e, acc[i][c] * d.scale);
            }
        }
    }
}

template <typename T, int EC, int BR>
__global__ void __launch_bounds__(FX_THREADS)
    k_flex_dkv(const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *D, T *dk,
               T *dv, Dims d, Mask mk, Mods md)
{
    constexpr int RW = BR / FX_WARPS, KPL = BR / 32;
    extern __shared__ float sm[];
    const int E = (int)d.E, S = E | 1;
    float *Ks = sm, *Vs = Ks + BR * S, *Qs = Vs + BR * S, *Os = Qs + BR * S;
    float *Ls = Os + BR * S, *Dsm = Ls + BR, *Pall = Dsm + BR, *Sall = Pall + FX_WARPS * BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *Pw = Pall + warp * BR, *Sw = Sall + warp * BR;
    const int64_t nt = (d.T + BR - 1) / BR, units = nt * d.B * d.Hk;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        int64_t kt = u % nt, bh = u / nt, b = bh / d.Hk, hk = bh % d.Hk;
        int64_t k0 = kt * BR, kb = k0 / mk.bs;
        int nk = (int)(d.T - k0 < BR ? d.T - k0 : BR);
        __syncthreads();
        load_tile<T, BR>(Ks, S, k, b, k0, nk, hk, d.Hk, d, 1.0f);
        load_tile<T, BR>(Vs, S, v, b, k0, nk, hk, d.Hk, d, 1.0f);
        float gk[RW][EC], gv[RW][EC];
#pragma unroll
        for (int i = 0; i < RW; i++)
#pragma unroll
            for (int c = 0; c < EC; c++) gk[i][c] = gv[i][c] = 0.0f;
        for (int64_t h = hk * d.G; h < (hk + 1) * d.G; h++) {
            float slope = md.score == CT_FLEX_SCORE_ALIBI ? md.slopes[h] : 0.0f;
            BList bl = col_list(mk, b, h, kb);
            bool partial = false;
            int64_t qb;
            while ((qb = next_block(bl, &partial)) >= 0) {
                int64_t qend = (qb + 1) * mk.bs < d.T ? (qb + 1) * mk.bs : d.T;
                for (int64_t q0 = qb * mk.bs; q0 < qend; q0 += BR) {
                    int nq = (int)(qend - q0 < BR ? qend - q0 : BR);
                    int kind = partial ? tile_kind(md, q0, nq, k0, nk) : 2; /* block-uniform */
                    if (kind == 0) continue;
                    bool per_pair = kind == 1;
                    __syncthreads();
                    load_tile<T, BR>(Qs, S, q, b, q0, nq, h, d.H, d, d.scale);
                    load_tile<T, BR>(Os, S, dout, b, q0, nq, h, d.H, d, 1.0f);
                    for (int r = threadIdx.x; r < BR; r += blockDim.x) {
                        int64_t row = (b * d.H + h) * d.T + q0 + r;
                        Ls[r] = r < nq ? bwd_lse(lse[row]) : INFINITY;
                        Dsm[r] = r < nq ? D[row] : 0.0f;
                    }
                    __syncthreads();
#pragma unroll
                    for (int i = 0; i < RW; i++) {
                        int jr = warp * RW + i;
                        if (jr >= nk) continue; /* warp-uniform */
                        int64_t tk = k0 + jr;
#pragma unroll
                        for (int c = 0; c < KPL; c++) {
                            int qi = lane + 32 * c;
                            float p = 0.0f, ds = 0.0f;
                            if (qi < nq && (!per_pair || keep_pair(md, b, q0 + qi, tk))) {
                                float raw = dot(Qs + qi * S, Ks + jr * S, E);
                                p = expf(mod_score(md, raw, slope, q0 + qi, tk) - Ls[qi]);
                                float dp = dot(Os + qi * S, Vs + jr * S, E);
                                ds = p * (dp - Dsm[qi]);
                                if (md.score == CT_FLEX_SCORE_SOFTCAP) ds = __fmul_rn(ds, mod_grad(md, raw));
                            }
                            Pw[qi] = p;
                            Sw[qi] = ds;
                        }
                        __syncwarp();
#pragma unroll
                        for (int c = 0; c < EC; c++) {
                            int e = lane + 32 * c;
                            if (e < E) {
                                float a = gv[i][c], g = gk[i][c];
                                for (int qi = 0; qi < nq; qi++) {
                                    a += Pw[qi] * Os[qi * S + e];
                                    g += Sw[qi] * Qs[qi * S + e]; /* Qs holds scale * q */
                                }
                                gv[i][c] = a;
                                gk[i][c] = g;
                            }
                        }
                        __syncwarp();
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < RW; i++) {
            int jr = warp * RW + i;
            if (jr >= nk) continue;
            int64_t base = ((b * d.T + k0 + jr) * d.Hk + hk) * d.E;
#pragma unroll
            for (int c = 0; c < EC; c++) {
                int e = lane + 32 * c;
                if (e < E) {
                    if (dk) st_elem(dk, base + e, gk[i][c]);
                    if (dv) st_elem(dv, base + e, gv[i][c]);
                }
            }
        }
    }
}

/* ---- host side ---------------------------------------------------------------------------------- */

size_t smem_fwd(int64_t E, int64_t BR)
{
    return (size_t)(3 * BR * (E | 1) + FX_WARPS * BR) * sizeof(float);
}
size_t smem_dq(int64_t E, int64_t BR)
{
    return (size_t)(4 * BR * (E | 1) + FX_WARPS * BR) * sizeof(float);
}
size_t smem_dkv(int64_t E, int64_t BR)
{
    return (size_t)(4 * BR * (E | 1) + 2 * BR + 2 * FX_WARPS * BR) * sizeof(float);
}

unsigned unit_grid(int64_t units)
{
    return (unsigned)(units < 1 ? 1 : units > 0x7fffffff ? 0x7fffffff : units);
}

/* Dynamic shared memory beyond 48 KiB needs the kernel's opt-in. */
template <typename K>
int allow_smem(K kernel, size_t bytes, const char *what)
{
    return ctcu_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
                      what);
}

struct Setup {
    Dims d;
    Mask mk;
    Mods md;
};

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
    if (m->compiled)
        return ctcu_fail(CT_EUNSUPPORTED, "%s on cuda: compiled (jit) mods are not on the GPU yet", slot);
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
    if (!g->dq && !g->dk && !g->dv) return 0;
    if (!g->dout || !at->q || !at->k || !at->v || !at->out || !at->lse)
        return ctcu_fail(CT_EINVAL, "flex_bwd: q, k, v, out, lse and dout must not be NULL");
    void *D = NULL;
    if ((rc = ctcu_scratch(b, (size_t)(s.d.B * s.d.H * s.d.T) * sizeof(float), &D))) return rc;
    rc = at->dtype == CT_DTYPE_BF16 ? bwd_dispatch<uint16_t>(b, a, g, s, (float *)D)
                                    : bwd_dispatch<float>(b, a, g, s, (float *)D);
    ctcu_scratch_free(b, D);
    return rc;
}
