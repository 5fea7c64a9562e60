/*
 * The FlexAttention kernels (cuda_flex.cu's flex_fwd / flex_bwd; see its header comment for
 * the tiling, the order of the sums and the determinism) as device functions templated over
 * the element type T, the head-dim class (EC 32-lane columns, BR-row tiles) and a mods policy P:
 *   Mods     the built-in mods of ct_flex_mods (instantiated by cuda_flex.cu);
 *   JitMods  the built-in mods and a compiled (jit) mask / score mod (backend.h's contract:
 *            ctj_mask / ctj_score / ctj_score_grad), instantiated inside a compiled-mods module
 *            (cuda_flex_jit.cu compiles the prelude, the mods' source, this header and the entry
 *            points at run time: NVRTC on a GPU, the host compiler on the emulated device).
 * A policy has:
 *   NPG                          parameter-gradient terms per pair (0: none)
 *   head(h)                      per-head state (the ALiBi slope)
 *   keep(b, h, q, kv)            the pair mask (partial blocks only)
 *   score_mod(s, slope, b, h, q, kv)   the score after the mod
 *   grad(g, s, slope, b, h, q, kv, pidx, pval)  dL/ds from g = dL/d score_mod(s); writes NPG
 *                                parameter terms (index, value) when NPG > 0
 *   tile_kind(q0, nq, k0, nk)    0 every pair of the tile masked, 2 every pair kept, 1 per pair
 * The kernel bodies take their dynamic shared memory as a pointer (the __global__ entry points
 * declare it), so this header holds no __shared__ and no launch: it compiles unchanged for nvcc,
 * NVRTC and the emulated device's host compiler.
 */
#ifndef CT_CUDA_FLEX_KERNELS_CUH
#define CT_CUDA_FLEX_KERNELS_CUH

#include "cuda/cuda_attn_common.cuh"

#define FX_THREADS 256
#define FX_WARPS (FX_THREADS / 32)
#define FX_E_MAX 256

namespace ctcu_flex {

using namespace ctcu_attn;

/* backend.h's CT_FLEX_MASK_* bits and ct_flex_score values (a module sees no host header;
 * cuda_flex.cu checks that they agree). */
enum { FXM_CAUSAL = 1, FXM_WINDOW = 2, FXM_PREFIX = 4, FXM_DOCUMENT = 8 };
enum { FXS_NONE = 0, FXS_SOFTCAP = 1, FXS_ALIBI = 2 };

/* The block mask's lists (device pointers) and its broadcast. */
struct Mask {
    int64_t B, H, bs, nqb, nkb;
    const int64_t *kv_ptr, *full_kv_ptr, *q_ptr, *full_q_ptr;
    const int32_t *kv_idx, *full_kv_idx, *q_idx, *full_q_idx;
};

/* The parameter-gradient partial sums of the dq pass: per > 0: block g owns the units
 * [g * per, (g + 1) * per) and warp w of it adds into part[(g * FX_WARPS + w) * len ...]
 * (zeroed first); per == 0: none. */
struct PGrad {
    float *part;
    int64_t len, per;
};

/* The built-in mods (ct_flex_mods) with T for the document ids' rows. */
struct Mods {
    unsigned bits;
    int64_t window, prefix, T, doc_batch;
    const int32_t *q_doc, *kv_doc;
    int score;
    float cap;
    const float *slopes;

    static constexpr int NPG = 0;

    __device__ __forceinline__ float head(int64_t h) const
    {
        return score == FXS_ALIBI ? slopes[h] : 0.0f;
    }

    /* Whether query q may attend key kv of batch b: the AND of the masks of the bits set. */
    __device__ __forceinline__ bool keep(int64_t b, int64_t h, int64_t q, int64_t kv) const
    {
        (void)h;
        if ((bits & FXM_CAUSAL) && kv > q) return false;
        if (bits & FXM_WINDOW) {
            int64_t dd = q - kv;
            if (dd > window || -dd > window) return false;
        }
        if ((bits & FXM_PREFIX) && !(kv < prefix || kv <= q)) return false;
        if (bits & FXM_DOCUMENT) {
            int64_t r = (doc_batch == 1 ? 0 : b) * T;
            if (q_doc[r + q] != kv_doc[r + kv]) return false;
        }
        return true;
    }

    /* score_mod(s) for query q and key kv (slope: the head's ALiBi slope). Rounded step by step
     * as the CPU mods (no contraction into fused multiply-adds). */
    __device__ __forceinline__ float score_mod(float s, float slope, int64_t b, int64_t h, int64_t q,
                                               int64_t kv) const
    {
        (void)b, (void)h;
        if (score == FXS_SOFTCAP) return __fmul_rn(cap, tanhf(__fdiv_rn(s, cap)));
        if (score == FXS_ALIBI) return __fadd_rn(s, __fmul_rn(slope, (float)(kv - q)));
        return s;
    }

    /* dL/ds = g * d score_mod / d s at the score s before the mod. */
    __device__ __forceinline__ float grad(float g, float s, float slope, int64_t b, int64_t h, int64_t q,
                                          int64_t kv, int64_t *pidx, float *pval) const
    {
        (void)slope, (void)b, (void)h, (void)q, (void)kv, (void)pidx, (void)pval;
        if (score == FXS_SOFTCAP) {
            float t = tanhf(__fdiv_rn(s, cap));
            return __fmul_rn(g, __fsub_rn(1.0f, __fmul_rn(t, t)));
        }
        return g;
    }

    /* What the mask is over the tile of queries [q0, q0 + nq) x keys [k0, k0 + nk) of a partial
     * block: 0 every pair masked, 2 every pair kept, 1 mixed or not known (documents). From the
     * band bits' structure in O(1), exact like the CPU mods' classifiers; a skipped tile adds
     * exact zeros (nothing to a softmax sum, a maximum or a product), so the results are those
     * of the per-pair mask (up to the sign of a zero). */
    __device__ __forceinline__ int tile_kind(int64_t q0, int64_t nq, int64_t k0, int64_t nk) const
    {
        int64_t q1 = q0 + nq - 1, k1 = k0 + nk - 1; /* inclusive */
        int64_t dmin = q0 - k1, dmax = q1 - k0;      /* the range of q - kv */
        bool full = !(bits & FXM_DOCUMENT);
        if (bits & FXM_CAUSAL) {
            if (dmax < 0) return 0;
            full = full && dmin >= 0;
        }
        if (bits & FXM_WINDOW) {
            if (dmax < -window || dmin > window) return 0;
            full = full && dmin >= -window && dmax <= window;
        }
        if (bits & FXM_PREFIX) {
            if (k0 >= prefix && dmax < 0) return 0;
            full = full && (k1 < prefix || dmin >= 0);
        }
        return full ? 2 : 1;
    }
};

#ifdef CTCU_JIT_MODULE
/* The built-in mods and the module's compiled mods (the source before this header defines
 * CTJ_MASK, CTJ_SCORE, CTJ_NPG and the ctj_ functions; A: the bound arrays, device memory).
 * keep: the built-in mask AND the compiled one; tile_kind: a tile the built-in mask empties
 * stays skipped, any other tile of a partial block is evaluated per pair when a compiled mask
 * is present (the host block mask, built from the same mask mod, decides empty and full
 * blocks); score_mod / grad: the compiled score mod when present (the built-in score is then
 * CT_FLEX_SCORE_NONE), else the built-in one. */
struct JitMods {
    Mods m;
    const ctj_arr *A;

    static constexpr int NPG = CTJ_NPG;

    __device__ __forceinline__ float head(int64_t h) const
    {
        return m.head(h);
    }
    __device__ __forceinline__ bool keep(int64_t b, int64_t h, int64_t q, int64_t kv) const
    {
#if CTJ_MASK
        return m.keep(b, h, q, kv) && ctj_mask(A, b, h, q, kv);
#else
        return m.keep(b, h, q, kv);
#endif
    }
    __device__ __forceinline__ float score_mod(float s, float slope, int64_t b, int64_t h, int64_t q,
                                               int64_t kv) const
    {
#if CTJ_SCORE
        (void)slope;
        return ctj_score(A, s, b, h, q, kv);
#else
        return m.score_mod(s, slope, b, h, q, kv);
#endif
    }
    __device__ __forceinline__ float grad(float g, float s, float slope, int64_t b, int64_t h, int64_t q,
                                          int64_t kv, int64_t *pidx, float *pval) const
    {
#if CTJ_SCORE
        (void)slope;
        return ctj_score_grad(A, s, b, h, q, kv, g, pidx, pval);
#else
        return m.grad(g, s, slope, b, h, q, kv, pidx, pval);
#endif
    }
    __device__ __forceinline__ int tile_kind(int64_t q0, int64_t nq, int64_t k0, int64_t nk) const
    {
        int k = m.tile_kind(q0, nq, k0, nk);
        return k == 0 ? 0 : (CTJ_MASK ? 1 : k);
    }
};
#endif

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

template <typename T, int EC, int BR, typename P>
__device__ __forceinline__ void flex_fwd_body(float *sm, const T *q, const T *k, const T *v, T *out, float *lse,
                                              const Dims &d, const Mask &mk, const P &md)
{
    constexpr int RW = BR / FX_WARPS, KPL = BR / 32;
    const int E = (int)d.E, S = E | 1;
    float *Qs = sm, *Ks = Qs + BR * S, *Vs = Ks + BR * S, *Ps = Vs + BR * S;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *Pw = Ps + warp * BR;
    const int64_t nqt = (d.T + BR - 1) / BR, units = nqt * d.B * d.H;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        int64_t qt = nqt - 1 - u % nqt, bh = u / nqt, b = bh / d.H, h = bh % d.H, hk = h / d.G;
        int64_t q0 = qt * BR;
        int nq = (int)(d.T - q0 < BR ? d.T - q0 : BR);
        float slope = md.head(h);
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
                int kind = partial ? md.tile_kind(q0, nq, k0, nk) : 2; /* block-uniform */
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
                        if (j < nk && (!per_pair || md.keep(b, h, tq, k0 + j)))
                            x = md.score_mod(dot(Qs + r * S, Ks + j * S, E), slope, b, h, tq, k0 + j);
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

/* A row's lse as the backward uses it: a row with no kept key (-inf) becomes +inf, so every
 * exp(s - lse) is 0. */
__device__ __forceinline__ float bwd_lse(float x)
{
    return x == -INFINITY ? INFINITY : x;
}

template <typename T, int EC, int BR, typename P>
__device__ __forceinline__ void flex_dq_body(float *sm, const T *q, const T *k, const T *v, const T *dout,
                                             const float *lse, const float *D, T *dq, const Dims &d, const Mask &mk,
                                             const P &md, const PGrad &pg)
{
    constexpr int RW = BR / FX_WARPS, KPL = BR / 32;
    const int E = (int)d.E, S = E | 1;
    float *Qs = sm, *Os = Qs + BR * S, *Ks = Os + BR * S, *Vs = Ks + BR * S, *Ps = Vs + BR * S;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *Pw = Ps + warp * BR;
    constexpr int PN = P::NPG > 0 ? P::NPG : 1;
    const int64_t nqt = (d.T + BR - 1) / BR, units = nqt * d.B * d.H;
    /* with parameter gradients, block g owns units [g * per, (g + 1) * per) and its warps their
     * partial vectors; else units are strided over the grid */
    int64_t u0 = blockIdx.x, u1 = units, ustep = gridDim.x;
    float *pw = NULL;
    if (pg.per > 0) {
        u0 = (int64_t)blockIdx.x * pg.per;
        u1 = u0 + pg.per < units ? u0 + pg.per : units;
        ustep = 1;
        pw = pg.part + ((int64_t)blockIdx.x * FX_WARPS + warp) * pg.len;
    }
    for (int64_t u = u0; u < u1; u += ustep) {
        int64_t qt = nqt - 1 - u % nqt, bh = u / nqt, b = bh / d.H, h = bh % d.H, hk = h / d.G;
        int64_t q0 = qt * BR;
        int nq = (int)(d.T - q0 < BR ? d.T - q0 : BR);
        float slope = md.head(h);
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
                int kind = partial ? md.tile_kind(q0, nq, k0, nk) : 2; /* block-uniform */
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
                        int64_t pidx[PN];
                        float pval[PN];
#pragma unroll
                        for (int t = 0; t < PN; t++) pidx[t] = 0, pval[t] = 0.0f;
                        if (j < nk && (!per_pair || md.keep(b, h, tq, k0 + j))) {
                            float raw = dot(Qs + r * S, Ks + j * S, E);
                            float p = expf(md.score_mod(raw, slope, b, h, tq, k0 + j) - Lr[i]);
                            float dp = dot(Os + r * S, Vs + j * S, E);
                            ds = md.grad(p * (dp - Dr[i]), raw, slope, b, h, tq, k0 + j, pidx, pval);
                        }
                        Pw[j] = ds;
                        if constexpr (P::NPG > 0) {
                            /* the lanes' parameter-gradient terms in lane order into the warp's
                             * partial vector (lane 0 adds): a fixed order, no atomics */
                            if (pw) { /* warp-uniform */
                                for (int L = 0; L < 32; L++)
#pragma unroll
                                    for (int t = 0; t < PN; t++) {
                                        int64_t ix = __shfl_sync(CTCU_FULL_MASK, pidx[t], L);
                                        float pv = __shfl_sync(CTCU_FULL_MASK, pval[t], L);
                                        if (lane == 0 && pv != 0.0f && ix >= 0 && ix < pg.len) pw[ix] += pv;
                                    }
                            }
                        }
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
                if (e < E && dq) st_elem(dq, base + e, acc[i][c] * d.scale);
            }
        }
    }
}

template <typename T, int EC, int BR, typename P>
__device__ __forceinline__ void flex_dkv_body(float *sm, const T *q, const T *k, const T *v, const T *dout,
                                              const float *lse, const float *D, T *dk, T *dv, const Dims &d,
                                              const Mask &mk, const P &md)
{
    constexpr int RW = BR / FX_WARPS, KPL = BR / 32, PN = P::NPG > 0 ? P::NPG : 1;
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
            float slope = md.head(h);
            BList bl = col_list(mk, b, h, kb);
            bool partial = false;
            int64_t qb;
            while ((qb = next_block(bl, &partial)) >= 0) {
                int64_t qend = (qb + 1) * mk.bs < d.T ? (qb + 1) * mk.bs : d.T;
                for (int64_t q0 = qb * mk.bs; q0 < qend; q0 += BR) {
                    int nq = (int)(qend - q0 < BR ? qend - q0 : BR);
                    int kind = partial ? md.tile_kind(q0, nq, k0, nk) : 2; /* block-uniform */
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
                            if (qi < nq && (!per_pair || md.keep(b, h, q0 + qi, tk))) {
                                float raw = dot(Qs + qi * S, Ks + jr * S, E);
                                p = expf(md.score_mod(raw, slope, b, h, q0 + qi, tk) - Ls[qi]);
                                float dp = dot(Os + qi * S, Vs + jr * S, E);
                                int64_t pidx[PN]; /* the parameter terms are the dq pass's */
                                float pval[PN];
                                ds = md.grad(p * (dp - Dsm[qi]), raw, slope, b, h, q0 + qi, tk, pidx, pval);
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

/* ---- host side (cuda_flex.cu and cuda_flex_jit.cu) ----------------------------------------------- */
#ifndef CTCU_JIT_MODULE

/* Dynamic shared memory of the three kernels. */
inline size_t smem_fwd(int64_t E, int64_t BR)
{
    return (size_t)(3 * BR * (E | 1) + FX_WARPS * BR) * sizeof(float);
}
inline size_t smem_dq(int64_t E, int64_t BR)
{
    return (size_t)(4 * BR * (E | 1) + FX_WARPS * BR) * sizeof(float);
}
inline size_t smem_dkv(int64_t E, int64_t BR)
{
    return (size_t)(4 * BR * (E | 1) + 2 * BR + 2 * FX_WARPS * BR) * sizeof(float);
}

inline unsigned unit_grid(int64_t units)
{
    return (unsigned)(units < 1 ? 1 : units > 0x7fffffff ? 0x7fffffff : units);
}

/* The head-dim classes: E <= 32, 64, 128, 256 -> (EC, BR) = (1, 64), (2, 64), (4, 64), (8, 32). */
inline int e_class(int64_t E)
{
    return E <= 32 ? 0 : E <= 64 ? 1 : E <= 128 ? 2 : 3;
}
inline int class_ec(int c)
{
    return 1 << c;
}
inline int class_br(int c)
{
    return c == 3 ? 32 : 64;
}

/* A flex slot's checked arguments (cuda_flex.cu's flex_setup). */
struct Setup {
    Dims d;
    Mask mk;
    Mods md;
};

/* Compiled mods (cuda_flex_jit.cu): the checks only a module can make (its dtype, head-dim class
 * and mods against the call), and the launches of its kernels (D: rowsum(dout * out), made by
 * cuda_flex.cu). */
int ctcu_flex_jit_check(const char *slot, const ct_flex_args *a);
int ctcu_flex_jit_fwd(ct_backend *b, const ct_flex_args *a, const Setup &s);
int ctcu_flex_jit_bwd(ct_backend *b, const ct_flex_args *a, const ct_attn_grads *g, const Setup &s,
                      const float *D);

#endif

} /* namespace ctcu_flex */

#endif
