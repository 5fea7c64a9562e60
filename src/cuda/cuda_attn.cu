/*
 * Dense causal scaled-dot-product attention on the GPU (sdpa_fwd, sdpa_bwd): the definitions
 * of ct_sdpa_forward / ct_sdpa_backward with is_causal (src/attention/sdpa.c over flex.c),
 * in f32 with f32 accumulation, f32 or bf16 q / k / v / out / gradients.
 *
 * Layout (backend.h's ct_attn_args): q, out, dout, dq [B, T, H, E]; k, v, dk, dv
 * [B, T, Hk, E]; query head h reads kv head h / (H / Hk); lse [B, H, T] (natural log).
 *
 * Tiling (FlashAttention-2 style, CUDA cores, no tensor cores): tiles of BR query rows and BR
 * keys (BR = 64 for E <= 128, 32 for E <= 256; E > 256 is refused), 256 threads = 8 warps per
 * block, each warp owning BR / 8 rows of the tile. Tiles are widened to f32 in shared memory
 * with a row stride of E | 1 floats (odd: lanes reading different rows hit different banks).
 *   forward: one block per (b, h, query tile): key tiles 0..diagonal, online softmax per row
 *     (running max and sum; the scores of a tile computed by lanes owning keys, the output
 *     accumulated by lanes owning head dimensions); out = acc / l, lse = m + log l;
 *   backward: D = rowsum(dout * out) per row (one warp per row, out as stored, as flex.c);
 *     dq: one block per (b, h, query tile), key tiles 0..diagonal in order;
 *     dk, dv: one block per (b, kv head, key tile): the query heads of the group in head
 *     order, and for each the query tiles from the diagonal to the end in order.
 * Scores are computed as (scale * q) . k, the same products in the same order in all three
 * kernels, so the backward's probabilities exp(s - lse) use the forward's scores. Every sum
 * has a fixed order (no atomics, launch shapes from the sizes): the same bits run to run.
 */
#include "cuda/cuda_attn_common.cuh"
#include "cuda/cuda_internal.cuh"

#include <cuda_bf16.h>
#include <math.h>

#define AT_THREADS 256
#define AT_WARPS (AT_THREADS / 32)
#define AT_E_MAX 256

namespace {

using namespace ctcu_attn;

/* ---- forward ----------------------------------------------------------------------------- */

template <typename T, int EC, int BR>
__global__ void __launch_bounds__(AT_THREADS)
    k_fwd(const T *q, const T *k, const T *v, T *out, float *lse, Dims d)
{
    constexpr int RW = BR / AT_WARPS, KPL = BR / 32;
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
        for (int64_t kt = 0; kt <= qt; kt++) {
            int64_t k0 = kt * BR;
            int nk = (int)(d.T - k0 < BR ? d.T - k0 : BR);
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
                    s[c] = (j < nk && k0 + j <= tq) ? dot(Qs + r * S, Ks + j * S, E) : -INFINITY;
                    mt = nan_max(mt, s[c]);
                }
                mt = warp_max(mt);
                float mn = nan_max(m[i], mt);
                /* a row always sees its own key, so mn is finite unless the inputs are not */
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
#pragma unroll
        for (int i = 0; i < RW; i++) {
            int r = warp * RW + i;
            if (r >= nq) continue;
            int64_t tq = q0 + r;
            int64_t base = ((b * d.T + tq) * d.H + h) * d.E;
#pragma unroll
            for (int c = 0; c < EC; c++) {
                int e = lane + 32 * c;
                if (e < E) st_elem(out, base + e, acc[i][c] / l[i]);
            }
            if (lane == 0) lse[(b * d.H + h) * d.T + tq] = m[i] + logf(l[i]);
        }
    }
}

/* ---- backward ---------------------------------------------------------------------------- */

/* D[b, h, t] = sum_e dout[b, t, h, e] * out[b, t, h, e]: one warp per row. */
template <typename T>
__global__ void __launch_bounds__(AT_THREADS)
    k_rowdot(float *D, const T *dout, const T *out, Dims d)
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

template <typename T, int EC, int BR>
__global__ void __launch_bounds__(AT_THREADS)
    k_dq(const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *D, T *dq,
         Dims d)
{
    constexpr int RW = BR / AT_WARPS, KPL = BR / 32;
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
        __syncthreads();
        load_tile<T, BR>(Qs, S, q, b, q0, nq, h, d.H, d, d.scale);
        load_tile<T, BR>(Os, S, dout, b, q0, nq, h, d.H, d, 1.0f);
        float acc[RW][EC], Lr[RW], Dr[RW];
#pragma unroll
        for (int i = 0; i < RW; i++) {
            int r = warp * RW + i;
            int64_t row = (b * d.H + h) * d.T + q0 + (r < nq ? r : 0);
            Lr[i] = lse[row];
            Dr[i] = D[row];
#pragma unroll
            for (int c = 0; c < EC; c++) acc[i][c] = 0.0f;
        }
        for (int64_t kt = 0; kt <= qt; kt++) {
            int64_t k0 = kt * BR;
            int nk = (int)(d.T - k0 < BR ? d.T - k0 : BR);
            __syncthreads();
            load_tile<T, BR>(Ks, S, k, b, k0, nk, hk, d.Hk, d, 1.0f);
            load_tile<T, BR>(Vs, S, v, b, k0, nk, hk, d.Hk, d, 1.0f);
            __syncthreads();
#pragma unroll
            for (int i = 0; i < RW; i++) {
                int r = warp * RW + i;
                if (r >= nq) continue;
                int64_t tq = q0 + r;
#pragma unroll
                for (int c = 0; c < KPL; c++) {
                    int j = lane + 32 * c;
                    float ds = 0.0f;
                    if (j < nk && k0 + j <= tq) {
                        float p = expf(dot(Qs + r * S, Ks + j * S, E) - Lr[i]);
                        float dp = dot(Os + r * S, Vs + j * S, E);
                        ds = p * (dp - Dr[i]);
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
__global__ void __launch_bounds__(AT_THREADS)
    k_dkv(const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *D, T *dk,
          T *dv, Dims d)
{
    constexpr int RW = BR / AT_WARPS, KPL = BR / 32;
    extern __shared__ float sm[];
    const int E = (int)d.E, S = E | 1;
    float *Ks = sm, *Vs = Ks + BR * S, *Qs = Vs + BR * S, *Os = Qs + BR * S;
    float *Ls = Os + BR * S, *Dsm = Ls + BR, *Pall = Dsm + BR, *Sall = Pall + AT_WARPS * BR;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *Pw = Pall + warp * BR, *Sw = Sall + warp * BR;
    const int64_t nt = (d.T + BR - 1) / BR, units = nt * d.B * d.Hk;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        int64_t kt = u % nt, bh = u / nt, b = bh / d.Hk, hk = bh % d.Hk;
        int64_t k0 = kt * BR;
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
            for (int64_t qt = kt; qt < nt; qt++) {
                int64_t q0 = qt * BR;
                int nq = (int)(d.T - q0 < BR ? d.T - q0 : BR);
                __syncthreads();
                load_tile<T, BR>(Qs, S, q, b, q0, nq, h, d.H, d, d.scale);
                load_tile<T, BR>(Os, S, dout, b, q0, nq, h, d.H, d, 1.0f);
                for (int r = threadIdx.x; r < BR; r += blockDim.x) {
                    int64_t row = (b * d.H + h) * d.T + q0 + r;
                    Ls[r] = r < nq ? lse[row] : 0.0f;
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
                        if (qi < nq && q0 + qi >= tk) {
                            p = expf(dot(Qs + qi * S, Ks + jr * S, E) - Ls[qi]);
                            float dp = dot(Os + qi * S, Vs + jr * S, E);
                            ds = p * (dp - Dsm[qi]);
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

/* ---- host side ----------------------------------------------------------------------------- */

size_t smem_fwd(int64_t E, int64_t BR)
{
    return (size_t)(3 * BR * (E | 1) + AT_WARPS * BR) * sizeof(float);
}
size_t smem_dq(int64_t E, int64_t BR)
{
    return (size_t)(4 * BR * (E | 1) + AT_WARPS * BR) * sizeof(float);
}
size_t smem_dkv(int64_t E, int64_t BR)
{
    return (size_t)(4 * BR * (E | 1) + 2 * BR + 2 * AT_WARPS * BR) * sizeof(float);
}

unsigned unit_grid(int64_t units)
{
    return (unsigned)(units < 1 ? 1 : units > 0x7fffffff ? 0x7fffffff : units);
}

/* Dynamic shared memory beyond 48 KiB needs the kernel's opt-in. */
template <typename K>
int allow_smem(K kernel, size_t bytes, const char *what)
{
    return ctcu_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)bytes),
                      what);
}

template <typename T, int EC, int BR>
int fwd_launch(ct_backend *b, const ct_attn_args *a, const Dims &d)
{
    size_t sh = smem_fwd(d.E, BR);
    int rc = allow_smem(k_fwd<T, EC, BR>, sh, "sdpa_fwd: shared memory");
    if (rc) return rc;
    int64_t units = (d.T + BR - 1) / BR * d.B * d.H;
    k_fwd<T, EC, BR><<<unit_grid(units), AT_THREADS, sh, ctcu_stream(b)>>>(
        (const T *)a->q, (const T *)a->k, (const T *)a->v, (T *)a->out, a->lse, d);
    return ctcu_launched("sdpa_fwd");
}

template <typename T, int EC, int BR>
int bwd_launch(ct_backend *b, const ct_attn_args *a, const ct_attn_grads *g, const Dims &d,
               const float *D)
{
    cudaStream_t s = ctcu_stream(b);
    int rc = 0;
    if (g->dq) {
        size_t sh = smem_dq(d.E, BR);
        if ((rc = allow_smem(k_dq<T, EC, BR>, sh, "sdpa_bwd: shared memory (dq)"))) return rc;
        int64_t units = (d.T + BR - 1) / BR * d.B * d.H;
        k_dq<T, EC, BR><<<unit_grid(units), AT_THREADS, sh, s>>>(
            (const T *)a->q, (const T *)a->k, (const T *)a->v, (const T *)g->dout, a->lse, D,
            (T *)g->dq, d);
        if ((rc = ctcu_launched("sdpa_bwd: dq"))) return rc;
    }
    if (g->dk || g->dv) {
        size_t sh = smem_dkv(d.E, BR);
        if ((rc = allow_smem(k_dkv<T, EC, BR>, sh, "sdpa_bwd: shared memory (dk, dv)"))) return rc;
        int64_t units = (d.T + BR - 1) / BR * d.B * d.Hk;
        k_dkv<T, EC, BR><<<unit_grid(units), AT_THREADS, sh, s>>>(
            (const T *)a->q, (const T *)a->k, (const T *)a->v, (const T *)g->dout, a->lse, D,
            (T *)g->dk, (T *)g->dv, d);
        if ((rc = ctcu_launched("sdpa_bwd: dk, dv"))) return rc;
    }
    return 0;
}

/* Checks only this backend makes; fills d. 1: nothing to do (an empty problem). */
int attn_setup(const char *slot, const ct_attn_args *a, Dims *d)
{
    if (!a) return ctcu_fail(CT_EINVAL, "%s: arguments must not be NULL", slot);
    if (a->mask) return ctcu_fail(CT_EUNSUPPORTED, "sdpa on cuda: only causal (mask must be NULL)");
    if (a->dtype != CT_DTYPE_F32 && a->dtype != CT_DTYPE_BF16)
        return ctcu_fail(CT_EUNSUPPORTED, "%s: q, k, v must be f32 or bf16 (dtype %d)", slot,
                         (int)a->dtype);
    if (a->B < 0 || a->T < 0 || a->H < 0 || a->Hk < 0 || a->E < 0)
        return ctcu_fail(CT_EINVAL, "%s: sizes must be >= 0", slot);
    if (a->E > AT_E_MAX)
        return ctcu_fail(CT_EUNSUPPORTED, "sdpa on cuda: head dim E = %lld is above %d",
                         (long long)a->E, AT_E_MAX);
    if (a->H > 0 && (a->Hk < 1 || a->H % a->Hk != 0))
        return ctcu_fail(CT_EINVAL, "%s: H = %lld must be a multiple of Hk = %lld", slot,
                         (long long)a->H, (long long)a->Hk);
    *d = {a->B, a->T, a->H, a->Hk, a->E, a->H > 0 ? a->H / a->Hk : 1, a->scale};
    return a->B == 0 || a->T == 0 || a->H == 0 ? -1 : 0;
}

template <typename T>
int fwd_dispatch(ct_backend *b, const ct_attn_args *a, const Dims &d)
{
    if (d.E <= 32) return fwd_launch<T, 1, 64>(b, a, d);
    if (d.E <= 64) return fwd_launch<T, 2, 64>(b, a, d);
    if (d.E <= 128) return fwd_launch<T, 4, 64>(b, a, d);
    return fwd_launch<T, 8, 32>(b, a, d);
}

template <typename T>
int bwd_dispatch(ct_backend *b, const ct_attn_args *a, const ct_attn_grads *g, const Dims &d,
                 float *D)
{
    int64_t rows = d.B * d.T * d.H;
    unsigned grid = ctcu_blocks(rows, AT_WARPS); /* one warp per row */
    if (grid > 65535u * 16u) grid = 65535u * 16u;
    k_rowdot<T><<<grid, AT_THREADS, 0, ctcu_stream(b)>>>(D, (const T *)g->dout, (const T *)a->out, d);
    int rc = ctcu_launched("sdpa_bwd: rowsum(dout * out)");
    if (rc) return rc;
    if (d.E <= 32) return bwd_launch<T, 1, 64>(b, a, g, d, D);
    if (d.E <= 64) return bwd_launch<T, 2, 64>(b, a, g, d, D);
    if (d.E <= 128) return bwd_launch<T, 4, 64>(b, a, g, d, D);
    return bwd_launch<T, 8, 32>(b, a, g, d, D);
}

} /* namespace */

extern "C" int ctcu_sdpa_fwd(ct_backend *b, const ct_attn_args *a)
{
    Dims d = {};
    int rc = attn_setup("sdpa_fwd", a, &d);
    if (rc) return rc < 0 ? 0 : rc;
    static_assert(64 % AT_WARPS == 0 && 32 % AT_WARPS == 0, "tile rows per warp");
    return a->dtype == CT_DTYPE_BF16 ? fwd_dispatch<uint16_t>(b, a, d) : fwd_dispatch<float>(b, a, d);
}

extern "C" int ctcu_sdpa_bwd(ct_backend *b, const ct_attn_args *a, const ct_attn_grads *g)
{
    Dims d = {};
    int rc = attn_setup("sdpa_bwd", a, &d);
    if (rc > 0) return rc;
    if (!g || (!g->dout && rc == 0)) return ctcu_fail(CT_EINVAL, "sdpa_bwd: dout must not be NULL");
    if (rc < 0) { /* no query rows: dk and dv are zero (H = 0 with kv heads) */
        size_t bytes = (size_t)(d.B * d.T * d.Hk * d.E) * (a->dtype == CT_DTYPE_BF16 ? 2 : 4);
        cudaStream_t s = ctcu_stream(b);
        if (bytes && g->dk && (rc = ctcu_check(cudaMemsetAsync(g->dk, 0, bytes, s), "sdpa_bwd: zero dk")))
            return rc;
        if (bytes && g->dv && (rc = ctcu_check(cudaMemsetAsync(g->dv, 0, bytes, s), "sdpa_bwd: zero dv")))
            return rc;
        return 0;
    }
    if (!g->dq && !g->dk && !g->dv) return 0;
    void *D = NULL;
    if ((rc = ctcu_scratch(b, (size_t)(d.B * d.H * d.T) * sizeof(float), &D))) return rc;
    rc = a->dtype == CT_DTYPE_BF16 ? bwd_dispatch<uint16_t>(b, a, g, d, (float *)D)
                                   : bwd_dispatch<float>(b, a, g, d, (float *)D);
    ctcu_scratch_free(b, D);
    return rc;
}
