/*
 * Fused linear + cross-entropy. Logits live only in a tile L[nb, vt] of the scratch budget:
 * tokens in blocks of nb rows (all N when the budget allows), the vocabulary in tiles of vt
 * columns. For each token block:
 *   pass 1 (forward): for each vocabulary tile t = 0..T-1, L = h W[t]^T and each row's online
 *     logsumexp statistics; then per row its lse, loss and z term;
 *   pass 2 (backward): for each tile t = T-1..0, L = h W[t]^T again (the last tile of pass 1
 *     is still in L and is not recomputed), turned into the gradient G in place, then
 *     dW[t] = G^T h (written, beta 0, for the first block: with one block the weight
 *     gradient is written exactly once per step), dh += G W[t] (tiles in that fixed order),
 *     db[t] += column sums of G.
 * With T = 1 (full-vocabulary rows fit) one visit per row does statistics, loss and gradient,
 * with one exponential per logit (ce_row_full: the softmax is exp(z - max) / sum), and a step
 * is three GEMMs; otherwise four (the logits twice). The backward alone does the same visit
 * with T = 1, so it gives forward_backward's bits. The tiling favours big token
 * blocks (the weight gradient crosses memory once per block) and tiles wide enough that every
 * GEMM (nb x vt x D) splits well over the threads (lce_tiling_choose).
 * bf16 inputs: W goes to the GEMMs as it is (ct_gemm_mixed: ctorch's GEMM widens it while it
 * packs its panels), so no [V, D] copy and no conversion buffer for it takes a share of the
 * budget; a block's rows of h (nb x D, small) are widened into the scratch once per block, so
 * the weight gradient's GEMM (G^T h, both f32) runs on the fastest f32 GEMM. Row kernels run in parallel over rows (each row
 * independent), bias sums over columns (rows in order), the GEMMs are deterministic and
 * every sum has a fixed order: results are the same bits for any thread count.
 */
#include "loss/ce_core.h"
#include "ops/gemm.h"
#include "ops/vecmath.h"
#include "ctorch/ops.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tiling preferences (see lce_tiling_choose). */
#define LCE_ROWS_PER_CPU 16 /* full-vocabulary rows: blocks of at least this many rows per online CPU */
#define LCE_ROWS_MIN 32     /* ... and at least this many, */
#define LCE_ROWS_MAX 1024   /* ... and never more than this many required */
#define LCE_VT_MIN 256      /* vocabulary tiles at least this wide when token blocks must shrink */
#define LCE_NB_TINY 32      /* token rows of a block when the budget is too small for the above */

typedef struct lce {
    ce_plan p;
    const ct_lce_inputs *in;
    bool bf16;
    int64_t nb, vt;       /* token block rows, vocabulary tile columns (L's row stride) */
    float *scratch;
    float *L;             /* [nb, vt] */
    float *hf;            /* [nb, D]: the block's rows of h widened (bf16 inputs; else NULL) */
    ce_row *rows;         /* [nb] */
    float *lse_c;         /* [nb] */
    float *loss_c;        /* [nb] */
    float *z_c;           /* [nb] */
    /* per-step parameters of the row kernels */
    int64_t n0, cur_nb, v0, cur_vt;
    const float *lse;     /* lse of the current block's rows */
    const float *dloss;
    float *dbias;
    bool db_add;          /* add the column sums to dbias (else write them) */
} lce;

static ct_status lce_check(const char *fn, const ct_lce_inputs *in)
{
    if (!in) return ct_error(CT_EINVAL, "%s: inputs must not be NULL", fn);
    if (in->dtype != CT_DTYPE_F32 && in->dtype != CT_DTYPE_BF16)
        return ct_error(CT_EINVAL, "%s: h and weight must be f32 or bf16, got %s", fn, ct_dtype_name(in->dtype));
    if (in->D < 0) return ct_error(CT_EINVAL, "%s: D must be >= 0, got %lld", fn, (long long)in->D);
    if (in->N > INT32_MAX || in->V > INT32_MAX || in->D > INT32_MAX)
        return ct_error(CT_EINVAL, "%s: N, D and V must fit in 32 bits", fn);
    if (in->N && in->D && !in->h) return ct_error(CT_EINVAL, "%s: h must not be NULL", fn);
    if (in->V && in->D && !in->weight) return ct_error(CT_EINVAL, "%s: weight must not be NULL", fn);
    return CT_OK;
}

typedef struct {
    int64_t nb, vt;
} lce_tiling;

/* Bytes per token row of a block besides its logits and h widened: row state. */
static size_t row_bytes(void)
{
    return sizeof(ce_row) + 3 * sizeof(float);
}

static size_t tiling_bytes(const lce_tiling *t)
{
    return (size_t)t->nb * (size_t)t->vt * sizeof(float) + (size_t)t->nb * row_bytes();
}

/* Bytes per token row for its h widened to f32 (bf16 inputs). */
static size_t hf_row_bytes(int64_t D, bool bf16)
{
    return bf16 ? (size_t)D * sizeof(float) : 0;
}

/* Scratch the three GEMMs of a step may take themselves (ops/gemm.h); h is f32 (widened). */
static size_t tiling_gemm_bytes(const lce_tiling *t, int64_t D, bool bf16)
{
    size_t a = ct_gemm_mixed_scratch_bytes(t->nb, t->vt, D, false, bf16);
    size_t b = ct_gemm_mixed_scratch_bytes(t->nb, D, t->vt, false, bf16);
    size_t d = ct_gemm_mixed_scratch_bytes(t->vt, D, t->nb, false, false);
    return a > b ? (a > d ? a : d) : (b > d ? b : d);
}

/* Token rows that fit in `budget` beside tiles of vt columns. */
static int64_t rows_fit(int64_t vt, size_t budget, size_t extra)
{
    return (int64_t)(budget / ((size_t)vt * sizeof(float) + row_bytes() + extra));
}

/* Widest tile for blocks of nb rows in `budget`. */
static int64_t cols_fit(int64_t nb, size_t budget, size_t extra)
{
    size_t fixed = (size_t)nb * (row_bytes() + extra);
    if (budget <= fixed) return 0;
    return (int64_t)((budget - fixed) / ((size_t)nb * sizeof(float)));
}

/* n split into blocks of at most b: equal blocks of the smallest count. */
static int64_t balanced(int64_t n, int64_t b)
{
    int64_t k = (n + b - 1) / b;
    return (n + k - 1) / k;
}

/* Smallest block of full-vocabulary rows worth a step of three GEMMs, from the machine (the
 * online CPUs, never the thread count in use: the tiling and so the bits must not depend on
 * it). Full rows save a GEMM (the logits are computed once) but each block adds one read and
 * write of the [V, D] weight gradient (an nb-deep GEMM update); vocabulary tiles over big
 * token blocks write it once but compute the logits twice. Measured on 2 cores (docs/
 * architecture.md, "Fused linear + cross-entropy"): full rows in blocks of ~110 rows took
 * 0.75-0.8x the time of the tiles; the weight gradient's traffic weighs more as cores share
 * the memory, so the threshold grows with the CPUs (2: 32 rows, 16: 256). CT_LCE_ROWS_MIN=n
 * (n > 0) overrides it, for benchmarks. */
static int64_t lce_rows_min(void)
{
    static _Atomic int64_t cached;
    int64_t r = atomic_load_explicit(&cached, memory_order_relaxed);
    if (r) return r;
    const char *e = getenv("CT_LCE_ROWS_MIN");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    r = (int64_t)(cpus > 0 ? cpus : 1) * LCE_ROWS_PER_CPU;
    r = r < LCE_ROWS_MIN ? LCE_ROWS_MIN : r > LCE_ROWS_MAX ? LCE_ROWS_MAX : r;
    if (e) { /* a positive count overrides the rule (benchmarks); anything else is ignored */
        char *end;
        long long v = strtoll(e, &end, 10);
        if (end != e && *end == '\0' && v > 0) r = v;
    }
    atomic_store_explicit(&cached, r, memory_order_relaxed);
    return r;
}

/* The tiling for a budget, reserving `extra` bytes per token row:
 *   1. full-vocabulary rows when all N rows fit, or blocks of at least lce_rows_min() rows
 *      (three GEMMs a step; the weight gradient crosses memory once per block);
 *   2. else the biggest token block beside tiles of LCE_VT_MIN columns (all N rows when they
 *      fit), then the widest tile beside that block (four GEMMs, each nb x vt x D);
 *   3. a budget too small for either: blocks of LCE_NB_TINY rows and the widest tile.
 * Blocks and tiles are then evened out (equal sizes of the same count). */
static bool lce_tiling_choose(lce_tiling *t, int64_t N, int64_t V, size_t budget, size_t extra)
{
    int64_t nb, vt;
    int64_t full = rows_fit(V, budget, extra);
    int64_t rows_min = lce_rows_min();
    if (full >= N || full >= rows_min) {
        nb = full < N ? full : N;
        vt = V;
    } else {
        int64_t vmin = V < LCE_VT_MIN ? V : LCE_VT_MIN;
        nb = rows_fit(vmin, budget, extra);
        int64_t floor_rows = N < LCE_NB_TINY ? N : LCE_NB_TINY;
        if (nb < floor_rows) nb = floor_rows;
        if (nb > N) nb = N;
        nb = balanced(N, nb);
        vt = cols_fit(nb, budget, extra);
        if (vt < 8 && vt < V) return false;
        if (vt > V) vt = V;
    }
    if (nb < 1) return false;
    nb = balanced(N, nb);
    vt = balanced(V, vt);
    t->nb = nb;
    t->vt = vt;
    return true;
}

/* Choose the tiling and allocate the scratch: the tile, row state, and room for the GEMMs' own scratch, all within opt->scratch_bytes. */
static ct_status lce_setup(lce *c, const char *fn, const ct_lce_inputs *in, const ct_ce_options *o)
{
    memset(c, 0, sizeof *c);
    CT_TRY(lce_check(fn, in));
    CT_TRY(ce_plan_init(&c->p, fn, o, in->target, in->target_dtype, in->N, in->V));
    c->p.bias = in->bias;
    c->in = in;
    c->bf16 = in->dtype == CT_DTYPE_BF16;
    int64_t N = in->N, D = in->D, V = in->V;
    if (N == 0) return CT_OK;
    size_t budget = o->scratch_bytes ? o->scratch_bytes : CT_DEFAULT_SCRATCH_BYTES;
    lce_tiling t;
    bool ok = false;
    size_t hrow = hf_row_bytes(D, c->bf16);
    /* First without, then with a reservation per row for the GEMMs' K-split partial sums
     * (ops/gemm.h) should the first attempts not converge. */
    for (int pass = 0; pass < 2 && !ok; pass++) {
        /* the GEMMs' packed panels grow with the tile: shrink the tiles' share of the budget
         * by what the GEMMs overshoot, a few times */
        size_t share = budget;
        for (int shrink = 0; shrink < 16 && !ok; shrink++) {
            if (!lce_tiling_choose(&t, N, V, share, hrow + (pass ? CT_GEMM_SCRATCH_PER_ROW(D) : 0))) break;
            size_t need = tiling_bytes(&t) + (size_t)t.nb * hrow + tiling_gemm_bytes(&t, D, c->bf16);
            ok = need <= budget;
            if (!ok) share = need - budget < share / 2 ? share - (need - budget) : share / 2;
        }
    }
    if (!ok) {
        lce_tiling m = {N < LCE_NB_TINY ? N : LCE_NB_TINY, V < 8 ? V : 8};
        return ct_error(CT_EINVAL, "%s: scratch_bytes = %zu is too small for D = %lld; give at least %zu", fn,
                        budget, (long long)D,
                        tiling_bytes(&m) + (size_t)m.nb * hrow + tiling_gemm_bytes(&m, D, c->bf16));
    }
    c->nb = t.nb;
    c->vt = t.vt;
    CT_TRY(ct_alloc((void **)&c->scratch, tiling_bytes(&t) + (size_t)t.nb * hrow));
    float *q = c->scratch;
    c->L = q, q += (size_t)t.nb * t.vt;
    if (hrow) c->hf = q, q += (size_t)t.nb * D;
    c->lse_c = q, q += t.nb;
    c->loss_c = q, q += t.nb;
    c->z_c = q, q += t.nb;
    c->rows = (ce_row *)q;
    return CT_OK;
}

size_t ct_lce_scratch_bytes_for_rows(int64_t rows, int64_t D, int64_t V, ct_dtype dtype)
{
    if (rows <= 0 || D <= 0 || V <= 0 || (dtype != CT_DTYPE_F32 && dtype != CT_DTYPE_BF16)) return 0;
    if (rows > INT32_MAX || D > INT32_MAX || V > INT32_MAX) return 0;
    bool bf16 = dtype == CT_DTYPE_BF16;
    /* per row: V logits, the row state and h widened; overflow-checked in double first */
    double per = (double)V * sizeof(float) + (double)row_bytes() + (double)hf_row_bytes(D, bf16);
    if ((double)rows * per > (double)SIZE_MAX / 2) return 0;
    lce_tiling t = {rows, V};
    return tiling_bytes(&t) + (size_t)rows * hf_row_bytes(D, bf16) + tiling_gemm_bytes(&t, D, bf16);
}

/* Rows n0..n0+nb of h as f32: in place, or widened into the scratch (bf16 inputs). */
static const float *block_h(const lce *c, int64_t n0, int64_t nb)
{
    int64_t D = c->in->D;
    if (!c->bf16) return (const float *)c->in->h + n0 * D;
    ct_convert_bf16_to_f32(c->hf, (const uint16_t *)c->in->h + n0 * D, (size_t)(nb * D));
    return c->hf;
}

/* Rows s0.. of W, in its own dtype (f32 or bf16). */
static const void *weight_rows(const lce *c, int64_t s0)
{
    return (const unsigned char *)c->in->weight + (size_t)(s0 * c->in->D) * (c->bf16 ? 2 : 4);
}

/* L[0:nb, 0:vc] = hc W[v0:v0+vc]^T */
static ct_status tile_logits(lce *c, const float *hc, int64_t nb, int64_t v0, int64_t vc)
{
    int64_t D = c->in->D;
    return ct_gemm_mixed(false, true, nb, vc, D, 1.0f, hc, false, D, weight_rows(c, v0), c->bf16, D, 0.0f, c->L,
                         c->vt);
}

static void rows_begin(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    lce *c = arg;
    for (int64_t r = r0; r < r1; r++) ce_row_begin(&c->rows[r]);
}

static void rows_stats(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    lce *c = arg;
    for (int64_t r = r0; r < r1; r++) {
        float *z = c->L + r * c->vt;
        int64_t y = ce_target(&c->p, c->n0 + r);
        ce_row_prep(&c->p, z, c->v0, c->cur_vt);
        ce_row_stats(&c->p, &c->rows[r], z, c->v0, c->cur_vt, y);
    }
}

static void rows_finish(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    lce *c = arg;
    for (int64_t r = r0; r < r1; r++)
        ce_row_finish(&c->p, &c->rows[r], ce_target(&c->p, c->n0 + r), &c->lse_c[r], &c->loss_c[r], &c->z_c[r]);
}

/* A freshly computed tile: prepare it (bias, softcap) and turn it into gradients. */
static void rows_grad(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    lce *c = arg;
    for (int64_t r = r0; r < r1; r++) {
        float *z = c->L + r * c->vt;
        int64_t n = c->n0 + r, y = ce_target(&c->p, n);
        ce_row_prep(&c->p, z, c->v0, c->cur_vt);
        ce_row_grad(&c->p, z, c->v0, c->cur_vt, y, c->lse[r], ce_row_scale(&c->p, c->dloss, n));
    }
}

/* The last tile of pass 1, still in L and already prepared: gradients only. */
static void rows_grad_prepared(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    lce *c = arg;
    for (int64_t r = r0; r < r1; r++) {
        float *z = c->L + r * c->vt;
        int64_t n = c->n0 + r, y = ce_target(&c->p, n);
        ce_row_grad(&c->p, z, c->v0, c->cur_vt, y, c->lse[r], ce_row_scale(&c->p, c->dloss, n));
    }
}

/* Full-vocabulary rows: prepare, statistics, loss and gradient of each row in one visit,
 * while the row (V floats) is still in cache, instead of one sweep of L per step. */
static void rows_full(void *arg, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    lce *c = arg;
    int64_t V = c->p.V;
    for (int64_t r = r0; r < r1; r++) {
        float *z = c->L + r * c->vt;
        int64_t n = c->n0 + r, y = ce_target(&c->p, n);
        ce_row_prep(&c->p, z, 0, V);
        ce_row_full(&c->p, &c->rows[r], z, y, ce_row_scale(&c->p, c->dloss, n), &c->lse_c[r], &c->loss_c[r],
                    &c->z_c[r]);
    }
}

/* A block of full-vocabulary rows (one tile): its logits, then rows_full (statistics, loss and
 * gradient of each row; the lse it takes is the row's own, which is the forward's). */
static ct_status block_full(lce *c, const float *hc, int64_t n0, int64_t nb, const float *dloss)
{
    CT_TRY(tile_logits(c, hc, nb, 0, c->p.V));
    c->n0 = n0;
    c->cur_nb = nb;
    c->dloss = dloss;
    ct_parallel_for(nb, rows_full, c);
    return CT_OK;
}

/* db[v0 + j] (+)= sum over the block's rows of G[r, j]: threads own columns, rows in order. */
static void cols_bias(void *arg, int64_t j0, int64_t j1, int tid)
{
    (void)tid;
    lce *c = arg;
    float *db = c->dbias + c->v0;
    if (!c->db_add) memset(db + j0, 0, (size_t)(j1 - j0) * sizeof(float));
    for (int64_t r = 0; r < c->cur_nb; r++) {
        const float *g = c->L + r * c->vt;
        for (int64_t j = j0; j < j1; j++) db[j] += g[j];
    }
}

static int64_t tile_count(const lce *c)
{
    return (c->p.V + c->vt - 1) / c->vt;
}

/* Pass 1 over every vocabulary tile of a block: lse, loss and z term per row. The last
 * tile's prepared logits stay in L. */
static ct_status block_forward(lce *c, const float *hc, int64_t n0, int64_t nb)
{
    c->n0 = n0;
    c->cur_nb = nb;
    ct_parallel_for(nb, rows_begin, c);
    for (int64_t v0 = 0; v0 < c->p.V; v0 += c->vt) {
        int64_t vc = c->p.V - v0 < c->vt ? c->p.V - v0 : c->vt;
        CT_TRY(tile_logits(c, hc, nb, v0, vc));
        c->v0 = v0;
        c->cur_vt = vc;
        ct_parallel_for(nb, rows_stats, c);
    }
    ct_parallel_for(nb, rows_finish, c);
    return CT_OK;
}

/* How L enters pass 2's last tile (the first one it visits). */
typedef enum { TILE_RECOMPUTE, TILE_PREPARED, TILE_GRADIENT } tile_state;

/* Pass 2: gradients of a block, tiles in reverse order. `last` says what L holds for the last
 * tile: nothing (recompute it), its prepared logits (pass 1 just ran), or its gradient
 * (rows_full did it). */
static ct_status block_backward(lce *c, const ct_lce_grads *g, const float *hc, int64_t n0, int64_t nb,
                                const float *lse, const float *dloss, tile_state last)
{
    int64_t D = c->in->D, V = c->p.V, T = tile_count(c);
    c->n0 = n0;
    c->cur_nb = nb;
    c->lse = lse;
    c->dloss = dloss;
    c->dbias = g->dbias;
    c->db_add = g->accumulate || n0 > 0;
    float *dh = g->dh ? g->dh + n0 * D : NULL;
    float dw_beta = g->accumulate || n0 > 0 ? 1.0f : 0.0f;
    bool dh_first = true;
    for (int64_t t = T - 1; t >= 0; t--) {
        int64_t v0 = t * c->vt, vc = V - v0 < c->vt ? V - v0 : c->vt;
        c->v0 = v0;
        c->cur_vt = vc;
        tile_state st = t == T - 1 ? last : TILE_RECOMPUTE;
        if (st == TILE_RECOMPUTE) {
            CT_TRY(tile_logits(c, hc, nb, v0, vc));
            ct_parallel_for(nb, rows_grad, c);
        } else if (st == TILE_PREPARED) {
            ct_parallel_for(nb, rows_grad_prepared, c);
        }
        if (g->dbias) ct_parallel_for(vc, cols_bias, c);
        if (!dh && !g->dweight) continue;
        if (dh) {
            float beta = dh_first && !g->accumulate ? 0.0f : 1.0f;
            CT_TRY(ct_gemm_mixed(false, false, nb, D, vc, 1.0f, c->L, false, c->vt, weight_rows(c, v0), c->bf16, D,
                                 beta, dh, D));
            dh_first = false;
        }
        if (g->dweight)
            CT_TRY(ct_gemm_f32(true, false, vc, D, nb, 1.0f, c->L, c->vt, hc, D, dw_beta, g->dweight + v0 * D, D));
    }
    return CT_OK;
}

/* No token rows: the gradients that are not accumulated are zero. */
static void zero_grads(const ct_lce_grads *g, const ct_lce_inputs *in)
{
    if (g->accumulate) return;
    if (g->dweight) memset(g->dweight, 0, (size_t)(in->V * in->D) * sizeof(float));
    if (g->dbias) memset(g->dbias, 0, (size_t)in->V * sizeof(float));
}

/* Write a block's per-row outputs; accumulate the sums in row order. */
static void block_outputs(lce *c, const ct_ce_outputs *out, int64_t n0, int64_t nb, double *ls, double *zs)
{
    if (out->lse) memcpy(out->lse + n0, c->lse_c, (size_t)nb * sizeof(float));
    if (c->p.o->reduction == CT_REDUCTION_NONE) {
        memcpy(out->loss + n0, c->loss_c, (size_t)nb * sizeof(float));
        if (out->z_loss) memcpy(out->z_loss + n0, c->z_c, (size_t)nb * sizeof(float));
        return;
    }
    for (int64_t r = 0; r < nb; r++) {
        *ls += c->loss_c[r];
        *zs += c->z_c[r];
    }
}

static void final_outputs(const lce *c, const ct_ce_outputs *out, double ls, double zs)
{
    ct_reduction red = c->p.o->reduction;
    if (red == CT_REDUCTION_NONE) return;
    double d = red == CT_REDUCTION_MEAN ? c->p.denom : 1.0;
    *out->loss = (float)(ls / d);
    if (out->z_loss) *out->z_loss = (float)(zs / d);
}

ct_status ct_linear_cross_entropy_forward(const ct_ce_outputs *out, const ct_lce_inputs *in,
                                          const ct_ce_options *opt)
{
    const char *fn = "ct_linear_cross_entropy_forward";
    if (!out || !out->loss) return ct_error(CT_EINVAL, "%s: out->loss must not be NULL", fn);
    lce c;
    CT_TRY(lce_setup(&c, fn, in, opt));
    ct_status s = CT_OK;
    double ls = 0, zs = 0;
    for (int64_t n0 = 0; n0 < in->N && s == CT_OK; n0 += c.nb) {
        int64_t nb = in->N - n0 < c.nb ? in->N - n0 : c.nb;
        s = block_forward(&c, block_h(&c, n0, nb), n0, nb);
        if (s == CT_OK) block_outputs(&c, out, n0, nb, &ls, &zs);
    }
    if (s == CT_OK) final_outputs(&c, out, ls, zs);
    ct_free(c.scratch);
    return s;
}

static ct_status grads_check(const char *fn, const ct_lce_grads *g, const float *dloss, bool dloss_required)
{
    if (!g) return ct_error(CT_EINVAL, "%s: grads must not be NULL (set unwanted fields to NULL)", fn);
    if (dloss_required && !dloss)
        return ct_error(CT_EINVAL, "%s: dloss must not be NULL (1 float, or N for reduction NONE)", fn);
    return CT_OK;
}

ct_status ct_linear_cross_entropy_backward(const ct_lce_grads *grads, const float *dloss, const float *lse,
                                           const ct_lce_inputs *in, const ct_ce_options *opt)
{
    const char *fn = "ct_linear_cross_entropy_backward";
    CT_TRY(grads_check(fn, grads, dloss, true));
    lce c;
    CT_TRY(lce_setup(&c, fn, in, opt));
    if (in->N && !lse) {
        ct_free(c.scratch);
        return ct_error(CT_EINVAL, "%s: lse must not be NULL (take it from the forward)", fn);
    }
    if (in->N == 0) zero_grads(grads, in);
    ct_status s = CT_OK;
    for (int64_t n0 = 0; n0 < in->N && s == CT_OK; n0 += c.nb) {
        int64_t nb = in->N - n0 < c.nb ? in->N - n0 : c.nb;
        const float *hc = block_h(&c, n0, nb);
        tile_state last = TILE_RECOMPUTE;
        if (c.vt == in->V) { /* as forward_backward does: the same bits */
            s = block_full(&c, hc, n0, nb, dloss);
            last = TILE_GRADIENT;
        }
        if (s == CT_OK) s = block_backward(&c, grads, hc, n0, nb, lse + n0, dloss, last);
    }
    ct_free(c.scratch);
    return s;
}

ct_status ct_linear_cross_entropy_forward_backward(const ct_ce_outputs *out, const ct_lce_grads *grads,
                                                   const float *dloss, const ct_lce_inputs *in,
                                                   const ct_ce_options *opt)
{
    const char *fn = "ct_linear_cross_entropy_forward_backward";
    if (!out || !out->loss) return ct_error(CT_EINVAL, "%s: out->loss must not be NULL", fn);
    CT_TRY(grads_check(fn, grads, dloss, false));
    lce c;
    CT_TRY(lce_setup(&c, fn, in, opt));
    if (in->N == 0) zero_grads(grads, in);
    ct_status s = CT_OK;
    double ls = 0, zs = 0;
    for (int64_t n0 = 0; n0 < in->N && s == CT_OK; n0 += c.nb) {
        int64_t nb = in->N - n0 < c.nb ? in->N - n0 : c.nb;
        const float *hc = block_h(&c, n0, nb);
        tile_state last;
        if (c.vt == in->V) { /* one tile: logits once, then dh and dW from the gradient left in L */
            s = block_full(&c, hc, n0, nb, dloss);
            last = TILE_GRADIENT;
        } else {
            s = block_forward(&c, hc, n0, nb);
            last = TILE_PREPARED;
        }
        if (s != CT_OK) break;
        block_outputs(&c, out, n0, nb, &ls, &zs);
        s = block_backward(&c, grads, hc, n0, nb, c.lse_c, dloss, last);
    }
    if (s == CT_OK) final_outputs(&c, out, ls, zs);
    ct_free(c.scratch);
    return s;
}
