/*
 * Cross-entropy on logits (ce_fwd, ce_bwd) and the fused linear + cross-entropy (lce) on the
 * GPU: the definitions of src/loss/ce_core.c (see include/ctorch/loss.h), computed in f32.
 *
 * Determinism: every sum has a fixed order. Row kernels give one block of CE_THREADS threads
 * to a row; each thread folds its strided columns in order, then the block combines the
 * threads' values with a fixed butterfly per warp and warp 0 over the warps' values
 * (block_reduce). Sums over rows (the loss, the mean's denominator, the class weights) run in
 * double in one block the same way. The bias gradient sums rows in row order, one thread per
 * column. No atomics; launch shapes come from the sizes only.
 *
 * Slot conventions (backend.h): pointers are device memory; class_weight is a device pointer;
 * grad_scale is the upstream gradient of the loss: of the single value for MEAN / SUM, of
 * every row for NONE (all rows get the same upstream gradient) unless the fused loss gets
 * grad_rows (NONE: row n's upstream gradient, device memory). As ce_core.c's ce_row_scale,
 * a non-ignored row's gradient is scaled by grad_scale (NONE, SUM), grad_rows[n] (NONE) or by
 * grad_scale / denom in double, rounded to f32 (MEAN). The mean's denominator (count of
 * non-ignored rows, or the sum of their class weights) and sum_c w_c are computed on the
 * device.
 *
 * The fused loss (lce) never holds N x V logits: tokens go in blocks of nb rows, the
 * vocabulary in tiles of vt columns, and the logits tile L [nb, ld] (ld >= vt) lives in the
 * scratch, sized from o->scratch_bytes (0: LCE_DEFAULT_BUDGET, 1 GiB; lce_tiling says how
 * the budget is split). Per token block:
 *   pass 1, tiles t = 0..T-1: L = h W[t]^T (ctcu_gemm, f32 or bf16 operands, f32 out), bias
 *     and softcap applied in place, each row's running max / sum of exponentials (the CPU's
 *     ce_row_stats: tile max, then the tile's sum of exp(z - max) rescaled into the running
 *     sum), the target logit and sum_c w_c z_c; then each row's lse, loss and z term;
 *   pass 2 (gradients wanted), tiles t = T-1..0: the last tile of pass 1 is still in L, the
 *     others are recomputed; L becomes the gradient G (ce_row_grad's formula); then
 *     db[t] (+)= column sums of G (rows in order), dh (+)= G W[t] (one GEMM per tile, beta 1
 *     after the block's first), dW[t] (+)= G^T h (beta 0 on the first token block unless
 *     accumulating).
 * When one tile holds whole rows (vt = V) pass 2 recomputes nothing: three GEMMs per block.
 * bf16 operands: the logits GEMM takes them as they are (bf16 x bf16 products are exact in
 * f32, accumulation in f32). The gradient GEMMs, by default, take G rounded to bf16 (round to
 * nearest even, written to Gb [nb, ldg] beside L) with h and W as they are: bf16 operands,
 * f32 accumulation, PyTorch's bf16 numerics at tensor-core speed; db sums the rounded G.
 * With CT_LCE_F32_GRADS they take G in f32 as the CPU path does (linear_cross_entropy.c
 * widens h and W to f32 and never rounds G), so h's block and W's tile are widened to f32 in
 * the scratch when dW / dh are wanted (f32 GEMMs: several times slower).
 */
#include "cuda/cuda_internal.cuh"

#include <cuda_bf16.h>
#include <math.h>

#define CE_THREADS 256
#define CE_FULL_MASK 0xffffffffu
#define LCE_VT_MIN 256   /* vocabulary tiles at least this wide before token blocks stay big */
#define LCE_VT_FLOOR 8   /* narrower tiles: the budget is refused */
#define LCE_ALIGN 256
#define LCE_NB_GOOD 1024 /* token blocks at least this tall keep the GEMMs' M large */
#define LCE_VT_GOOD 2048 /* tiles at least this wide keep dh's K (and the logits' N) large */
#define LCE_DEFAULT_BUDGET ((size_t)1 << 30) /* o->scratch_bytes == 0 */

namespace {

/* ---- options and row helpers (ce_core.c) ------------------------------------------------- */

struct CeOpt {
    int64_t ignore_index;
    int64_t V;
    const float *cw; /* class weights [V] or NULL */
    int reduction;
    float eps;       /* label smoothing */
    float sV;        /* eps / V */
    float zl;        /* z-loss scale */
    float cap;       /* softcap (0: off) */
    float inv_cap;   /* 1 / cap */
};

/* On the device: the mean's denominator and sum_c w_c (ce_plan_init's denom and wsum). */
struct CeStats {
    double denom;
    float wsum;
    float pad_;
};

CeOpt make_opt(const ct_ce_options *o, int64_t V)
{
    CeOpt c;
    c.ignore_index = o->ignore_index;
    c.V = V;
    c.cw = o->class_weight;
    c.reduction = (int)o->reduction;
    c.eps = o->label_smoothing;
    c.sV = V > 0 ? o->label_smoothing / (float)V : 0.0f;
    c.zl = o->z_loss;
    c.cap = o->softcap;
    c.inv_cap = o->softcap > 0.0f ? 1.0f / o->softcap : 0.0f;
    return c;
}

template <typename TT>
__device__ __forceinline__ int64_t target_of(const TT *t, int64_t n, int64_t ignore_index)
{
    int64_t y = (int64_t)t[n];
    return y == ignore_index ? -1 : y;
}

/* Max that keeps NaN (fmaxf would drop it). */
__device__ __forceinline__ float nan_max(float a, float b)
{
    return (a > b || a != a) ? a : b;
}

struct SumOp {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return nan_max(a, b); }
};

/* Combine one value per thread of the block (blockDim.x a multiple of 32, <= 1024) in a fixed
 * order; every thread gets the result. sh holds 33 values; the block must call it uniformly. */
template <typename T, typename Op>
__device__ T block_reduce(T v, T *sh, Op op, T identity)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int s = 16; s > 0; s >>= 1) v = op(v, __shfl_xor_sync(CE_FULL_MASK, v, s));
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        T x = lane < nw ? sh[lane] : identity;
        for (int s = 16; s > 0; s >>= 1) x = op(x, __shfl_xor_sync(CE_FULL_MASK, x, s));
        if (lane == 0) sh[32] = x;
    }
    __syncthreads();
    T r = sh[32];
    __syncthreads(); /* sh may be reused right after */
    return r;
}

/* ce_row_prep without the bias: the softcap. */
__device__ __forceinline__ float softcap(const CeOpt &o, float x)
{
    return o.cap > 0.0f ? o.cap * tanhf(x * o.inv_cap) : x;
}

/* ce_row_finish. */
__device__ void row_finish(const CeOpt &o, float wsum, float m, float l, float zy, float sw,
                           int64_t y, float *lse, float *loss, float *zterm)
{
    float L = m + logf(l);
    *lse = L;
    if (y < 0) {
        *loss = 0.0f;
        *zterm = 0.0f;
        return;
    }
    float wy = o.cw ? o.cw[y] : 1.0f;
    float zt = o.zl * L * L;
    float v = (1.0f - o.eps) * wy * (L - zy) + zt;
    if (o.eps > 0.0f) v += o.eps / (float)o.V * (wsum * L - sw);
    *loss = v;
    *zterm = zt;
}

/* ce_row_scale: the upstream gradient of a non-ignored row. */
__device__ __forceinline__ float row_scale(const CeOpt &o, const CeStats *st, float grad_scale)
{
    if (o.reduction == CT_REDUCTION_MEAN) return (float)((double)grad_scale / st->denom);
    return grad_scale;
}

/* The part of ce_row_grad's A that is the same for every column. */
__device__ __forceinline__ float grad_A(const CeOpt &o, float wsum, float wy, float lse)
{
    return (1.0f - o.eps) * wy + o.sV * wsum + 2.0f * o.zl * lse;
}

/* ce_row_grad for one prepared logit z of class j (row target y >= 0, scale g != 0). */
__device__ __forceinline__ float grad_elem(const CeOpt &o, float z, int64_t j, int64_t y,
                                           float lse, float g, float A, float wy)
{
    if (o.cap > 0.0f) {
        float t = z * o.inv_cap, pj = expf(z - lse);
        float gj = pj * A - o.sV * (o.cw ? o.cw[j] : 1.0f);
        if (j == y) gj -= (1.0f - o.eps) * wy;
        return g * gj * (1.0f - t * t);
    }
    float v = expf(z - lse) * (g * A);
    if (o.sV > 0.0f) v = o.cw ? v + (-g * o.sV) * o.cw[j] : v - g * o.sV;
    if (j == y) v -= g * (1.0f - o.eps) * wy;
    return v;
}

/* ---- kernels shared by both losses -------------------------------------------------------- */

/* One block: the mean's denominator (double, fixed order) and sum_c w_c. */
template <typename TT>
__global__ void __launch_bounds__(CE_THREADS)
    k_plan(CeStats *st, const TT *target, int64_t N, CeOpt o)
{
    __shared__ double sh[33];
    double d = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        int64_t y = target_of(target, n, o.ignore_index);
        if (y >= 0) d += o.cw ? (double)o.cw[y] : 1.0;
    }
    d = block_reduce(d, sh, SumOp(), 0.0);
    double w = (double)o.V;
    if (o.cw) {
        w = 0.0;
        for (int64_t c = threadIdx.x; c < o.V; c += blockDim.x) w += (double)o.cw[c];
        w = block_reduce(w, sh, SumOp(), 0.0);
    }
    if (threadIdx.x == 0) {
        st->denom = d;
        st->wsum = (float)w;
        st->pad_ = 0.0f;
    }
}

/* One block: the reduction of per-row losses (MEAN, SUM) in double, fixed order (ce_reduce). */
__global__ void __launch_bounds__(CE_THREADS)
    k_reduce(float *loss, float *zloss, const float *loss_rows, const float *z_rows, int64_t N,
             int reduction, const CeStats *st)
{
    __shared__ double sh[33];
    double s = 0.0, z = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        s += (double)loss_rows[n];
        if (zloss) z += (double)z_rows[n];
    }
    s = block_reduce(s, sh, SumOp(), 0.0);
    if (zloss) z = block_reduce(z, sh, SumOp(), 0.0);
    if (threadIdx.x == 0) {
        double d = reduction == CT_REDUCTION_MEAN ? st->denom : 1.0;
        *loss = (float)(s / d);
        if (zloss) *zloss = (float)(z / d);
    }
}

/* ---- cross-entropy on logits -------------------------------------------------------------- */

/* Statistics of row x (V logits, softcap applied on the fly): max m, sum of exp(z - m) l,
 * and sum_c w_c z_c (label smoothing only). Every thread of the block gets them. */
__device__ void logits_row_stats(const CeOpt &o, const float *x, float *m_out, float *l_out,
                                 float *sw_out, float *shf)
{
    int64_t V = o.V;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = nan_max(m, softcap(o, x[j]));
    m = block_reduce(m, shf, MaxOp(), -INFINITY);
    float l = 0.0f, sw = 0.0f;
    if (m != -INFINITY) { /* every logit -inf: the sum is 0, lse -inf (as ce_row_stats) */
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) l += expf(softcap(o, x[j]) - m);
        l = block_reduce(l, shf, SumOp(), 0.0f);
    }
    if (o.eps > 0.0f) {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
            float z = softcap(o, x[j]);
            sw += o.cw ? o.cw[j] * z : z;
        }
        sw = block_reduce(sw, shf, SumOp(), 0.0f);
    }
    *m_out = m;
    *l_out = l;
    *sw_out = sw;
}

__global__ void __launch_bounds__(CE_THREADS)
    k_ce_fwd_rows(float *lse, float *loss_rows, float *z_rows, const float *logits,
                  const int32_t *target, int64_t N, CeOpt o, const CeStats *st)
{
    __shared__ float shf[33];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float *x = logits + n * o.V;
        int64_t y = target_of(target, n, o.ignore_index);
        float m, l, sw;
        logits_row_stats(o, x, &m, &l, &sw, shf);
        if (threadIdx.x == 0) {
            float zy = y >= 0 ? softcap(o, x[y]) : 0.0f;
            row_finish(o, st->wsum, m, l, zy, sw, y, &lse[n], &loss_rows[n], &z_rows[n]);
        }
    }
}

__global__ void __launch_bounds__(CE_THREADS)
    k_ce_bwd_rows(float *dlogits, float grad_scale, const float *logits, const int32_t *target,
                  int64_t N, CeOpt o, const CeStats *st)
{
    __shared__ float shf[33];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float *x = logits + n * o.V;
        float *dx = dlogits + n * o.V;
        int64_t y = target_of(target, n, o.ignore_index);
        float g = y >= 0 ? row_scale(o, st, grad_scale) : 0.0f;
        if (y < 0 || g == 0.0f) {
            for (int64_t j = threadIdx.x; j < o.V; j += blockDim.x) dx[j] = 0.0f;
            continue;
        }
        float m, l, sw;
        logits_row_stats(o, x, &m, &l, &sw, shf);
        float zy = softcap(o, x[y]), L, loss, zt;
        row_finish(o, st->wsum, m, l, zy, sw, y, &L, &loss, &zt);
        float wy = o.cw ? o.cw[y] : 1.0f;
        float A = grad_A(o, st->wsum, wy, L);
        for (int64_t j = threadIdx.x; j < o.V; j += blockDim.x)
            dx[j] = grad_elem(o, softcap(o, x[j]), j, y, L, g, A, wy);
    }
}

/* ---- fused linear + cross-entropy --------------------------------------------------------- */

/* Running statistics of a token block's rows (ce_row), structure of arrays. */
struct RowState {
    float *m, *l, *zy, *sw;
};

/* Prepare a fresh logits tile (bias, softcap, in place) and fold it into the rows' running
 * statistics: ce_row_prep + ce_row_stats. Row r of the tile is L + r * ld, classes v0..v0+vc. */
template <typename TT>
__global__ void __launch_bounds__(CE_THREADS)
    k_lce_stats(float *L, int64_t ld, int64_t nb, int64_t v0, int64_t vc, const float *bias,
                const TT *target, int64_t n0, CeOpt o, RowState rs, int first)
{
    __shared__ float shf[33];
    for (int64_t r = blockIdx.x; r < nb; r += gridDim.x) {
        float *z = L + r * ld;
        int64_t y = target_of(target, n0 + r, o.ignore_index);
        float mo = first ? -INFINITY : rs.m[r];
        float tm = -INFINITY;
        for (int64_t j = threadIdx.x; j < vc; j += blockDim.x) {
            float x = z[j];
            if (bias) x += bias[v0 + j];
            x = softcap(o, x);
            z[j] = x; /* read back below by this same thread only */
            tm = nan_max(tm, x);
            if (v0 + j == y) rs.zy[r] = x;
        }
        tm = block_reduce(tm, shf, MaxOp(), -INFINITY);
        bool up = tm > mo;
        float M = up ? tm : mo;
        float s = 0.0f;
        if (up || mo != -INFINITY) { /* uniform over the block */
            for (int64_t j = threadIdx.x; j < vc; j += blockDim.x) s += expf(z[j] - M);
            s = block_reduce(s, shf, SumOp(), 0.0f);
        }
        float sw = 0.0f;
        if (o.eps > 0.0f) {
            for (int64_t j = threadIdx.x; j < vc; j += blockDim.x)
                sw += o.cw ? o.cw[v0 + j] * z[j] : z[j];
            sw = block_reduce(sw, shf, SumOp(), 0.0f);
        }
        if (threadIdx.x == 0) {
            float lo = first ? 0.0f : rs.l[r];
            float m = mo, l = lo;
            if (up) {
                l = (mo == -INFINITY ? 0.0f : lo * expf(mo - tm)) + s;
                m = tm;
            } else if (mo != -INFINITY) {
                l = lo + s;
            } else if (tm != tm) {
                m = tm;
            }
            rs.m[r] = m;
            rs.l[r] = l;
            if (first) {
                rs.sw[r] = sw;
                if (y < v0 || y >= v0 + vc) rs.zy[r] = 0.0f; /* the target's tile comes later */
            } else {
                rs.sw[r] += sw;
            }
        }
    }
}

/* ce_row_finish of a token block's rows: lse, loss and z term of rows n0..n0+nb. */
template <typename TT>
__global__ void k_lce_finish(float *lse, float *loss_rows, float *z_rows, const TT *target,
                             int64_t n0, int64_t nb, CeOpt o, RowState rs, const CeStats *st)
{
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < nb;
         r += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = n0 + r, y = target_of(target, n, o.ignore_index);
        row_finish(o, st->wsum, rs.m[r], rs.l[r], rs.zy[r], rs.sw[r], y, &lse[n], &loss_rows[n],
                   &z_rows[n]);
    }
}

/* Turn a logits tile into the gradient w.r.t. the (pre-softcap) logits, in place. prepared:
 * the tile already holds bias + softcap (pass 1's last tile); else they are applied first. */
/* bf16 bits of x, round to nearest even; NaN stays NaN (quiet bit set), as ct_f32_to_bf16. */
__device__ __forceinline__ uint16_t bf16_bits(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ void store_grad(float *p, float v) { *p = v; }
__device__ __forceinline__ void store_grad(uint16_t *p, float v) { *p = bf16_bits(v); }
__device__ __forceinline__ float load_grad(const float *p) { return *p; }
__device__ __forceinline__ float load_grad(const uint16_t *p) { return __uint_as_float((uint32_t)*p << 16); }

/* The logits tile's gradient G w.r.t. the (pre-softcap) logits into G [nb, ldg] (GT float: G
 * may be L itself, ldg = ld; uint16_t: bf16 bits, rounded to nearest even). prepared: the
 * tile already holds bias + softcap (pass 1's last tile); else they are applied first. Row
 * n's upstream gradient: grad_rows[n] when given (NONE), else row_scale's. */
template <typename TT, typename GT>
__global__ void __launch_bounds__(CE_THREADS)
    k_lce_grad(float *L, int64_t ld, GT *G, int64_t ldg, int64_t nb, int64_t v0, int64_t vc,
               const float *bias, const TT *target, int64_t n0, CeOpt o, const float *lse,
               const CeStats *st, float grad_scale, const float *grad_rows, int prepared)
{
    for (int64_t r = blockIdx.x; r < nb; r += gridDim.x) {
        const float *z = L + r * ld;
        GT *gr = G + r * ldg;
        int64_t n = n0 + r, y = target_of(target, n, o.ignore_index);
        float g = y < 0 ? 0.0f : grad_rows ? grad_rows[n] : row_scale(o, st, grad_scale);
        if (y < 0 || g == 0.0f) {
            for (int64_t j = threadIdx.x; j < vc; j += blockDim.x) store_grad(&gr[j], 0.0f);
            continue;
        }
        float wsum = st->wsum, wy = o.cw ? o.cw[y] : 1.0f, Ln = lse[n];
        float A = grad_A(o, wsum, wy, Ln);
        for (int64_t j = threadIdx.x; j < vc; j += blockDim.x) {
            float x = z[j]; /* read before the store: G may be L (same element, same thread) */
            if (!prepared) {
                if (bias) x += bias[v0 + j];
                x = softcap(o, x);
            }
            store_grad(&gr[j], grad_elem(o, x, v0 + j, y, Ln, g, A, wy));
        }
    }
}

/* db[j] (+)= sum over rows r = 0..nb-1 (in order) of G[r, j] (f32 or bf16 bits), one thread
 * per column. */
template <typename GT>
__global__ void k_col_sums(float *db, const GT *G, int64_t ld, int64_t nb, int64_t vc, int add)
{
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < vc;
         j += (int64_t)gridDim.x * blockDim.x) {
        float s = add ? db[j] : 0.0f;
        for (int64_t r = 0; r < nb; r++) s += load_grad(&G[r * ld + j]);
        db[j] = s;
    }
}

/* dst[i] = src[i] widened from bf16 bits to f32 (exact). */
__global__ void k_bf16_to_f32(float *dst, const uint16_t *src, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}

/* ---- host side ---------------------------------------------------------------------------- */

unsigned row_grid(int64_t rows)
{
    int64_t g = rows < 1 ? 1 : rows;
    return (unsigned)(g > 0x7fffffff ? 0x7fffffff : g);
}

size_t align_up(size_t x)
{
    return (x + LCE_ALIGN - 1) / LCE_ALIGN * LCE_ALIGN;
}

/* Bump allocation inside one scratch block. */
struct Carve {
    char *base;
    size_t off;
    template <typename T> T *take(size_t count)
    {
        T *p = (T *)(base + off);
        off += align_up(count * sizeof(T));
        return p;
    }
};

template <typename TT>
int launch_plan(ct_backend *b, CeStats *st, const TT *target, int64_t N, const CeOpt &o,
                const char *what)
{
    k_plan<TT><<<1, CE_THREADS, 0, ctcu_stream(b)>>>(st, target, N, o);
    return ctcu_launched(what);
}

/* The per-row results (scratch [N] each) into the outputs: rows for NONE, else the sums. */
int write_outputs(ct_backend *b, const ct_ce_outputs *out, const float *lse, const float *loss_rows,
                  const float *z_rows, int64_t N, const CeOpt &o, const CeStats *st,
                  const char *what)
{
    if (!out) return 0;
    cudaStream_t s = ctcu_stream(b);
    size_t bytes = (size_t)N * sizeof(float);
    int rc = 0;
    if (out->lse && N > 0)
        rc = ctcu_check(cudaMemcpyAsync(out->lse, lse, bytes, cudaMemcpyDeviceToDevice, s), what);
    if (rc) return rc;
    if (o.reduction == CT_REDUCTION_NONE) {
        if (out->loss && N > 0)
            rc = ctcu_check(cudaMemcpyAsync(out->loss, loss_rows, bytes, cudaMemcpyDeviceToDevice, s),
                            what);
        if (!rc && out->z_loss && N > 0)
            rc = ctcu_check(cudaMemcpyAsync(out->z_loss, z_rows, bytes, cudaMemcpyDeviceToDevice, s),
                            what);
        return rc;
    }
    if (!out->loss) return 0;
    k_reduce<<<1, CE_THREADS, 0, s>>>(out->loss, out->z_loss, loss_rows, z_rows, N, o.reduction, st);
    return ctcu_launched(what);
}

int check_options(const char *slot, const ct_ce_options *o, int64_t N, int64_t V)
{
    if (!o) return ctcu_fail(CT_EINVAL, "%s: options must not be NULL", slot);
    if (N < 0 || V < 0 || (N > 0 && V < 1))
        return ctcu_fail(CT_EINVAL, "%s: N = %lld and V = %lld must be >= 0 (V >= 1 with rows)", slot,
                         (long long)N, (long long)V);
    if (o->reduction != CT_REDUCTION_NONE && o->reduction != CT_REDUCTION_MEAN &&
        o->reduction != CT_REDUCTION_SUM)
        return ctcu_fail(CT_EINVAL, "%s: reduction must be NONE, MEAN or SUM, got %d", slot,
                         (int)o->reduction);
    return 0;
}

/* ---- the fused loss's tiling ---------------------------------------------------------------- */

struct LceTiling {
    int64_t nb, vt, ld, ldg; /* token rows per block, vocabulary columns per tile, the row
                                strides of L (f32) and of Gb (bf16; 0: no Gb) */
};

/* What the scratch holds beside the tiles. */
struct LceNeeds {
    bool g16;    /* Gb: G rounded to bf16 for bf16 gradient GEMMs */
    bool h, w;   /* CT_LCE_F32_GRADS with bf16: h's block / W's tile widened to f32 */
};

size_t ld_of(int64_t vt) { return (size_t)(vt + 7) / 8 * 8; }

/* Scratch bytes of a tiling (every piece rounded to LCE_ALIGN). */
size_t lce_bytes(int64_t N, int64_t D, int64_t nb, int64_t vt, int64_t ld, int64_t ldg,
                 const LceNeeds &q)
{
    size_t s = align_up(sizeof(CeStats)) + 3 * align_up((size_t)N * sizeof(float));
    s += align_up((size_t)nb * (size_t)ld * sizeof(float));
    if (q.g16) s += align_up((size_t)nb * (size_t)ldg * sizeof(uint16_t));
    s += 4 * align_up((size_t)nb * sizeof(float));
    if (q.h) s += align_up((size_t)nb * (size_t)D * sizeof(float));
    if (q.w) s += align_up((size_t)vt * (size_t)D * sizeof(float));
    return s;
}

/* The widest tile (<= V) beside token blocks of nb rows within budget (0: none fits). */
int64_t widest_tile(int64_t N, int64_t D, int64_t V, int64_t nb, const LceNeeds &q, size_t budget)
{
    int64_t lo = 0, hi = V;
    while (lo < hi) { /* bytes grow with vt */
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (lce_bytes(N, D, nb, mid, mid, mid, q) <= budget) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The tiling rule (GEMM shapes first, then the budget):
 *  1. Whole rows (vt = V: three GEMMs per token block, nothing recomputed) when the budget
 *     holds them for blocks of at least min(N, LCE_NB_GOOD) rows: the tallest such block.
 *  2. Else the tallest block (from all N rows, halving) whose tile is at least
 *     min(V, LCE_VT_GOOD) wide, halving no lower than LCE_NB_GOOD rows;
 *  3. below that (small budgets) halving on until the tile is at least LCE_VT_MIN columns
 *     (or V) wide, or one row.
 * Then blocks and tiles are evened out (the same count, sizes differing by at most one) and
 * the row strides rounded up to 8 elements when that still fits. false when even
 * LCE_VT_FLOOR columns of one row do not fit. Examples (D = 4096, V = 128256, bf16 G): a
 * 1 GiB budget gives whole rows in blocks of 1366 (N = 8192: 6 blocks; N = 32768: 24), 1003 MiB
 * of scratch; 64 MiB gives blocks of 4096 rows and 48 tiles of 2672 columns (63 MiB). */
bool lce_tiling(LceTiling *t, int64_t N, int64_t D, int64_t V, const LceNeeds &q, size_t budget)
{
    int64_t vmin = V < LCE_VT_MIN ? V : LCE_VT_MIN, floor_vt = V < LCE_VT_FLOOR ? V : LCE_VT_FLOOR;
    int64_t vgood = V < LCE_VT_GOOD ? V : LCE_VT_GOOD, nbgood = N < LCE_NB_GOOD ? N : LCE_NB_GOOD;
    int64_t nb = N, vt = 0;
    /* 1: the tallest block of whole rows (rows grow the bytes: binary search) */
    int64_t lo = 0, hi = N;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (lce_bytes(N, D, mid, V, V, V, q) <= budget) lo = mid;
        else hi = mid - 1;
    }
    if (lo >= nbgood && lo >= 1) {
        nb = lo;
        vt = V;
    } else {
        for (;;) {
            vt = widest_tile(N, D, V, nb, q, budget);
            if (vt >= vgood || nb == 1) break;
            if (nb > LCE_NB_GOOD) { /* 2 */
                nb = (nb + 1) / 2 > LCE_NB_GOOD ? (nb + 1) / 2 : LCE_NB_GOOD;
                continue;
            }
            if (vt >= vmin) break; /* 3 */
            nb = (nb + 1) / 2;
        }
    }
    if (vt < floor_vt || vt < 1) return false;
    int64_t k = (N + nb - 1) / nb;
    nb = (N + k - 1) / k;
    int64_t T = (V + vt - 1) / vt;
    vt = (V + T - 1) / T;
    int64_t ld = (int64_t)ld_of(vt);
    if (lce_bytes(N, D, nb, vt, ld, ld, q) > budget) ld = vt;
    t->nb = nb;
    t->vt = vt;
    t->ld = ld;
    t->ldg = q.g16 ? ld : 0;
    return true;
}

struct Lce {
    ct_backend *b;
    cudaStream_t s;
    const ct_lce_inputs *in;
    CeOpt o;
    bool bf16;
    bool g16;                        /* gradient GEMMs on bf16 G (bf16 inputs, no F32 flag) */
    LceTiling t;
    CeStats *st;
    float *lse, *loss_rows, *z_rows; /* [N] */
    float *L;                        /* [nb, ld] */
    uint16_t *Gb;                    /* g16: [nb, ldg] */
    RowState rs;                     /* [nb] each */
    float *hbuf, *wbuf;              /* bf16 with CT_LCE_F32_GRADS: h's block, W's tile as f32 */
    const float *grad_rows;          /* NONE: [N] upstream gradients, or NULL */
};

/* L[0:nb, 0:vc] = h[n0:n0+nb] W[v0:v0+vc]^T. */
int lce_logits(Lce &c, int64_t n0, int64_t nb, int64_t v0, int64_t vc)
{
    int64_t D = c.in->D;
    if (D == 0)
        return ctcu_check(cudaMemsetAsync(c.L, 0, (size_t)nb * (size_t)c.t.ld * sizeof(float), c.s),
                          "lce: zero logits");
    size_t es = c.bf16 ? 2 : 4;
    const char *h = (const char *)c.in->h + (size_t)n0 * (size_t)D * es;
    const char *w = (const char *)c.in->weight + (size_t)v0 * (size_t)D * es;
    return ctcu_gemm(c.b, false, true, nb, vc, D, 1.0f, h, D, w, D, 0.0f, c.L, c.t.ld, c.in->dtype);
}

template <typename TT>
int lce_stats(Lce &c, const TT *target, int64_t n0, int64_t nb, int64_t v0, int64_t vc, bool first)
{
    k_lce_stats<TT><<<row_grid(nb), CE_THREADS, 0, c.s>>>(c.L, c.t.ld, nb, v0, vc, c.in->bias,
                                                           target, n0, c.o, c.rs, first ? 1 : 0);
    return ctcu_launched("lce: row statistics");
}

template <typename TT>
int lce_grad(Lce &c, const TT *target, int64_t n0, int64_t nb, int64_t v0, int64_t vc,
             float grad_scale, bool prepared)
{
    if (c.g16)
        k_lce_grad<TT, uint16_t><<<row_grid(nb), CE_THREADS, 0, c.s>>>(
            c.L, c.t.ld, c.Gb, c.t.ldg, nb, v0, vc, c.in->bias, target, n0, c.o, c.lse, c.st,
            grad_scale, c.grad_rows, prepared ? 1 : 0);
    else
        k_lce_grad<TT, float><<<row_grid(nb), CE_THREADS, 0, c.s>>>(
            c.L, c.t.ld, c.L, c.t.ld, nb, v0, vc, c.in->bias, target, n0, c.o, c.lse, c.st,
            grad_scale, c.grad_rows, prepared ? 1 : 0);
    return ctcu_launched("lce: logit gradients");
}

int widen(Lce &c, float *dst, const void *src, int64_t n, const char *what)
{
    if (n <= 0) return 0;
    unsigned grid = ctcu_blocks(n, 256);
    if (grid > 16u * 65535u) grid = 16u * 65535u; /* grid-stride beyond */
    k_bf16_to_f32<<<grid, 256, 0, c.s>>>(dst, (const uint16_t *)src, n);
    return ctcu_launched(what);
}

/* One token block: pass 1, then pass 2 when grads. */
template <typename TT>
int lce_block(Lce &c, const TT *target, int64_t n0, int64_t nb, const ct_lce_grads *g,
              float grad_scale)
{
    int64_t V = c.in->V, D = c.in->D, vt = c.t.vt, T = (V + vt - 1) / vt;
    int rc = 0;
    for (int64_t t = 0; t < T && !rc; t++) {
        int64_t v0 = t * vt, vc = V - v0 < vt ? V - v0 : vt;
        rc = lce_logits(c, n0, nb, v0, vc);
        if (!rc) rc = lce_stats(c, target, n0, nb, v0, vc, t == 0);
    }
    if (rc) return rc;
    k_lce_finish<TT><<<ctcu_blocks(nb, 128), 128, 0, c.s>>>(c.lse, c.loss_rows, c.z_rows, target, n0,
                                                            nb, c.o, c.rs, c.st);
    if ((rc = ctcu_launched("lce: row losses"))) return rc;
    if (!g) return 0;

    bool acc = g->accumulate;
    float *dh = g->dh && D > 0 ? g->dh + n0 * D : NULL;
    float *dW = D > 0 ? g->dweight : NULL;
    /* the gradient GEMMs' operands: G (f32 L or bf16 Gb), h's block and W's tiles */
    const void *G = c.g16 ? (const void *)c.Gb : (const void *)c.L;
    int64_t ldg = c.g16 ? c.t.ldg : c.t.ld;
    ct_dtype gdt = c.g16 ? CT_DTYPE_BF16 : CT_DTYPE_F32;
    const void *hop = NULL;
    if (dW) {
        if (c.g16) {
            hop = (const uint16_t *)c.in->h + n0 * D;
        } else if (c.bf16) {
            rc = widen(c, c.hbuf, (const uint16_t *)c.in->h + n0 * D, nb * D, "lce: widen h");
            hop = c.hbuf;
        } else {
            hop = (const float *)c.in->h + n0 * D;
        }
    }
    float dw_beta = acc || n0 > 0 ? 1.0f : 0.0f;
    bool db_add = acc || n0 > 0, dh_first = true;
    for (int64_t t = T - 1; t >= 0 && !rc; t--) {
        int64_t v0 = t * vt, vc = V - v0 < vt ? V - v0 : vt;
        bool prepared = t == T - 1; /* pass 1's last tile is still in L */
        if (!prepared && (rc = lce_logits(c, n0, nb, v0, vc))) break;
        if ((rc = lce_grad(c, target, n0, nb, v0, vc, grad_scale, prepared))) break;
        if (g->dbias) {
            if (c.g16)
                k_col_sums<uint16_t><<<ctcu_blocks(vc, 256), 256, 0, c.s>>>(g->dbias + v0, c.Gb, ldg,
                                                                            nb, vc, db_add ? 1 : 0);
            else
                k_col_sums<float><<<ctcu_blocks(vc, 256), 256, 0, c.s>>>(g->dbias + v0, c.L, ldg, nb,
                                                                         vc, db_add ? 1 : 0);
            if ((rc = ctcu_launched("lce: bias gradient"))) break;
        }
        if (dh) {
            const void *wop;
            if (c.g16) {
                wop = (const uint16_t *)c.in->weight + v0 * D;
            } else if (c.bf16) {
                if ((rc = widen(c, c.wbuf, (const uint16_t *)c.in->weight + v0 * D, vc * D,
                                "lce: widen W")))
                    break;
                wop = c.wbuf;
            } else {
                wop = (const float *)c.in->weight + v0 * D;
            }
            float beta = dh_first && !acc ? 0.0f : 1.0f;
            rc = ctcu_gemm(c.b, false, false, nb, D, vc, 1.0f, G, ldg, wop, D, beta, dh, D, gdt);
            dh_first = false;
            if (rc) break;
        }
        if (dW)
            rc = ctcu_gemm(c.b, true, false, vc, D, nb, 1.0f, G, ldg, hop, D, dw_beta, dW + v0 * D, D,
                           gdt);
    }
    return rc;
}

template <typename TT>
int lce_run(Lce &c, const TT *target, ct_ce_outputs *out, ct_lce_grads *g, float grad_scale)
{
    int64_t N = c.in->N;
    int rc = launch_plan(c.b, c.st, target, N, c.o, "lce: plan");
    for (int64_t n0 = 0; n0 < N && !rc; n0 += c.t.nb) {
        int64_t nb = N - n0 < c.t.nb ? N - n0 : c.t.nb;
        rc = lce_block(c, target, n0, nb, g, grad_scale);
    }
    if (!rc) rc = write_outputs(c.b, out, c.lse, c.loss_rows, c.z_rows, N, c.o, c.st, "lce: outputs");
    return rc;
}

} /* namespace */

/* ---- slots ---------------------------------------------------------------------------------- */

extern "C" int ctcu_ce_fwd(ct_backend *b, ct_ce_outputs *out, const float *logits,
                           const int32_t *target, int64_t N, int64_t V, const ct_ce_options *o)
{
    int rc = check_options("ce_fwd", o, N, V);
    if (rc) return rc;
    CeOpt opt = make_opt(o, V);
    cudaStream_t s = ctcu_stream(b);
    size_t bytes = align_up(sizeof(CeStats)) + 3 * align_up((size_t)N * sizeof(float));
    void *scratch = NULL;
    if ((rc = ctcu_scratch(b, bytes, &scratch))) return rc;
    Carve cv = {(char *)scratch, 0};
    CeStats *st = cv.take<CeStats>(1);
    float *lse = cv.take<float>((size_t)N), *loss_rows = cv.take<float>((size_t)N);
    float *z_rows = cv.take<float>((size_t)N);
    rc = launch_plan(b, st, target, N, opt, "ce_fwd: plan");
    if (!rc && N > 0) {
        k_ce_fwd_rows<<<row_grid(N), CE_THREADS, 0, s>>>(lse, loss_rows, z_rows, logits, target, N,
                                                          opt, st);
        rc = ctcu_launched("ce_fwd: rows");
    }
    if (!rc) rc = write_outputs(b, out, lse, loss_rows, z_rows, N, opt, st, "ce_fwd: outputs");
    ctcu_scratch_free(b, scratch);
    return rc;
}

extern "C" int ctcu_ce_bwd(ct_backend *b, float *dlogits, float grad_scale, const float *logits,
                           const int32_t *target, int64_t N, int64_t V, const ct_ce_options *o)
{
    int rc = check_options("ce_bwd", o, N, V);
    if (rc || N == 0) return rc;
    CeOpt opt = make_opt(o, V);
    void *scratch = NULL;
    if ((rc = ctcu_scratch(b, align_up(sizeof(CeStats)), &scratch))) return rc;
    CeStats *st = (CeStats *)scratch;
    rc = launch_plan(b, st, target, N, opt, "ce_bwd: plan");
    if (!rc) {
        k_ce_bwd_rows<<<row_grid(N), CE_THREADS, 0, ctcu_stream(b)>>>(dlogits, grad_scale, logits,
                                                                       target, N, opt, st);
        rc = ctcu_launched("ce_bwd: rows");
    }
    ctcu_scratch_free(b, scratch);
    return rc;
}

extern "C" int ctcu_lce(ct_backend *b, ct_ce_outputs *out, ct_lce_grads *grads, float grad_scale,
                        const float *grad_rows, unsigned flags, const ct_lce_inputs *in,
                        const ct_ce_options *o)
{
    if (!in) return ctcu_fail(CT_EINVAL, "lce: inputs must not be NULL");
    int rc = check_options("lce", o, in->N, in->V);
    if (rc) return rc;
    if (in->dtype != CT_DTYPE_F32 && in->dtype != CT_DTYPE_BF16)
        return ctcu_fail(CT_EINVAL, "lce: h and weight must be f32 or bf16 (dtype %d)", (int)in->dtype);
    if (in->target_dtype != CT_DTYPE_I32 && in->target_dtype != CT_DTYPE_I64)
        return ctcu_fail(CT_EINVAL, "lce: target must be int32 or int64 (dtype %d)",
                         (int)in->target_dtype);
    if (in->D < 0) return ctcu_fail(CT_EINVAL, "lce: D must be >= 0, got %lld", (long long)in->D);
    int64_t N = in->N, D = in->D, V = in->V;
    cudaStream_t s = ctcu_stream(b);
    if (N == 0) { /* no rows: the loss (NaN for MEAN, 0 for SUM), and zero gradients */
        if (grads && !grads->accumulate && V > 0 && D > 0 && grads->dweight &&
            (rc = ctcu_check(cudaMemsetAsync(grads->dweight, 0, (size_t)V * (size_t)D * sizeof(float), s),
                             "lce: zero dW")))
            return rc;
        if (grads && !grads->accumulate && V > 0 && grads->dbias &&
            (rc = ctcu_check(cudaMemsetAsync(grads->dbias, 0, (size_t)V * sizeof(float), s),
                             "lce: zero db")))
            return rc;
    }
    Lce c = {};
    c.b = b;
    c.s = s;
    c.in = in;
    c.o = make_opt(o, V);
    c.bf16 = in->dtype == CT_DTYPE_BF16;
    bool gwant = grads && D > 0 && (grads->dh || grads->dweight);
    c.g16 = c.bf16 && gwant && !(flags & CT_LCE_F32_GRADS);
    c.grad_rows = o->reduction == CT_REDUCTION_NONE ? grad_rows : NULL;
    LceNeeds q;
    q.g16 = c.g16;
    q.h = c.bf16 && !c.g16 && grads && grads->dweight && D > 0;
    q.w = c.bf16 && !c.g16 && grads && grads->dh && D > 0;
    size_t budget = o->scratch_bytes ? o->scratch_bytes : LCE_DEFAULT_BUDGET;
    if (N > 0 && !lce_tiling(&c.t, N, D, V, q, budget)) {
        int64_t f = V < LCE_VT_FLOOR ? V : LCE_VT_FLOOR;
        size_t need = lce_bytes(N, D, 1, f, f, f, q);
        return ctcu_fail(CT_EINVAL,
                         "lce: scratch_bytes = %zu is too small for N = %lld, D = %lld; give at least %zu",
                         budget, (long long)N, (long long)D, need);
    }
    if (N == 0) c.t = {0, 0, 0, 0};
    void *scratch = NULL;
    if ((rc = ctcu_scratch(b, lce_bytes(N, D, c.t.nb, c.t.vt, c.t.ld, c.t.ldg, q), &scratch)))
        return rc;
    Carve cv = {(char *)scratch, 0};
    c.st = cv.take<CeStats>(1);
    c.lse = cv.take<float>((size_t)N);
    c.loss_rows = cv.take<float>((size_t)N);
    c.z_rows = cv.take<float>((size_t)N);
    c.L = cv.take<float>((size_t)c.t.nb * (size_t)c.t.ld);
    c.Gb = q.g16 ? cv.take<uint16_t>((size_t)c.t.nb * (size_t)c.t.ldg) : NULL;
    c.rs.m = cv.take<float>((size_t)c.t.nb);
    c.rs.l = cv.take<float>((size_t)c.t.nb);
    c.rs.zy = cv.take<float>((size_t)c.t.nb);
    c.rs.sw = cv.take<float>((size_t)c.t.nb);
    c.hbuf = q.h ? cv.take<float>((size_t)c.t.nb * (size_t)D) : NULL;
    c.wbuf = q.w ? cv.take<float>((size_t)c.t.vt * (size_t)D) : NULL;
    if (in->target_dtype == CT_DTYPE_I64)
        rc = lce_run(c, (const int64_t *)in->target, out, grads, grad_scale);
    else
        rc = lce_run(c, (const int32_t *)in->target, out, grads, grad_scale);
    ctcu_scratch_free(b, scratch);
    return rc;
}
