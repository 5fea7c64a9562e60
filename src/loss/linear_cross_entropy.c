/*
 * Fused linear + cross-entropy. Tokens are processed in chunks of nc rows; each chunk's
 * logits are computed into a tile L[nc, vc] of the scratch budget:
 *   - when vc == V (full rows fit), forward_backward needs three GEMMs: L = h W^T, then
 *     each row of L is turned into its gradient G in one visit (statistics, loss and
 *     gradient while the row is in cache), dh = G W and dW += G^T h;
 *   - otherwise a first pass over the vocabulary tiles gathers each row's online
 *     logsumexp, and a second pass recomputes each tile and turns it into gradients.
 * bf16 operands are converted to f32 in blocks (h per chunk, W per block of wsub rows),
 * never as a whole [V, D] copy. dW and db are accumulated in f32 in a fixed order (chunks
 * in sequence, OpenBLAS never splits K), so results are the same bits for any thread count.
 */
#include "loss/ce_core.h"
#include "ops/gemm.h"
#include "ops/vecmath.h"
#include "ctorch/ops.h"

#include <math.h>
#include <string.h>

typedef struct lce {
    ce_plan p;
    const ct_lce_inputs *in;
    bool bf16;
    int64_t nc, vc, wsub;
    float *scratch;
    float *L;      /* [nc, vc] */
    float *hbuf;   /* [nc, D] (bf16 only) */
    float *wbuf;   /* [wsub, D] (bf16 only) */
    ce_row *rows;  /* [nc] */
    float *lse_c;  /* [nc] */
    float *loss_c; /* [nc] */
    float *z_c;    /* [nc] */
    /* per-pass parameters of the row kernels */
    int64_t n0, cur_nc, v0, cur_vc;
    const float *lse;   /* lse for the rows of the current chunk */
    const float *dloss;
    float *dbias;
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
    int64_t nc, vc, wsub;
} lce_tiling;

static size_t tiling_bytes(const lce_tiling *t, int64_t D, bool bf16)
{
    size_t floats = (size_t)t->nc * (size_t)t->vc + (bf16 ? (size_t)t->nc * D + (size_t)t->wsub * D : 0) +
                    3 * (size_t)t->nc;
    return floats * 4 + (size_t)t->nc * sizeof(ce_row);
}

/* Scratch the three GEMMs of a chunk may take themselves (ops/gemm.h). */
static size_t tiling_gemm_bytes(const lce_tiling *t, int64_t D, bool bf16)
{
    int64_t step = bf16 ? t->wsub : t->vc;
    size_t a = ct_gemm_scratch_bytes(t->nc, step, D), b = ct_gemm_scratch_bytes(t->nc, D, step);
    size_t d = ct_gemm_scratch_bytes(step, D, t->nc);
    return a > b ? (a > d ? a : d) : (b > d ? b : d);
}

/* Tiles for a budget, reserving `extra` bytes per token row: full-vocabulary rows when at
 * least 16 (or N) of them fit, else 32 rows and as many vocabulary columns as fit. */
static bool tiling_for(lce_tiling *t, int64_t N, int64_t D, int64_t V, bool bf16, size_t budget, size_t extra)
{
    int64_t wsub = 0; /* bf16 weight rows converted at a time: 256, or less (a quarter of the budget) */
    if (bf16) {
        int64_t cap = D ? (int64_t)(budget / (16 * (size_t)D)) : 256;
        wsub = V < 256 ? V : 256;
        if (wsub > cap) wsub = cap < 8 ? 8 : cap;
        if (wsub > V) wsub = V;
    }
    size_t wbytes = (size_t)wsub * (size_t)D * 4;
    size_t per_row = (bf16 ? (size_t)D * 4 : 0) + sizeof(ce_row) + 3 * 4 + extra;
    int64_t nmin = N < 16 ? N : 16, nc = 0, vc = 0;
    if (budget > wbytes) nc = (int64_t)((budget - wbytes) / ((size_t)V * 4 + per_row));
    if (nc >= nmin) {
        vc = V;
        if (nc > N) nc = N;
    } else {
        nc = N < 32 ? N : 32;
        size_t fixed = wbytes + (size_t)nc * per_row;
        vc = budget > fixed ? (int64_t)((budget - fixed) / ((size_t)nc * 4)) : 0;
        if (vc < 8) return false;
        if (vc > V) vc = V;
        if (wsub > vc) wsub = vc;
    }
    t->nc = nc;
    t->vc = vc;
    t->wsub = wsub;
    return true;
}

/* Choose the tiling and allocate the scratch: tiles, row state, the bf16 conversion blocks,
 * and room for the GEMMs' own partial sums, all within opt->scratch_bytes. */
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
    /* First reserve the dh GEMM's partial sums per row; small budgets (small tiles, where
     * no GEMM splits K) go without the reservation. */
    for (int pass = 0; pass < 2 && !ok; pass++) {
        /* ctorch's GEMM packs panels that grow with the tile: shrink the tiles' share of the
         * budget by what the GEMMs overshoot, a few times */
        size_t share = budget;
        for (int shrink = 0; shrink < 16 && !ok; shrink++) {
            if (!tiling_for(&t, N, D, V, c->bf16, share, pass ? 0 : CT_GEMM_SCRATCH_PER_ROW(D))) break;
            size_t need = tiling_bytes(&t, D, c->bf16) + tiling_gemm_bytes(&t, D, c->bf16);
            ok = need <= budget;
            if (!ok) share = need - budget < share / 2 ? share - (need - budget) : share / 2;
        }
    }
    if (!ok) {
        lce_tiling m = {N < 32 ? N : 32, V < 8 ? V : 8, c->bf16 ? (V < 8 ? V : 8) : 0};
        return ct_error(CT_EINVAL, "%s: scratch_bytes = %zu is too small for D = %lld; give at least %zu", fn,
                        budget, (long long)D, tiling_bytes(&m, D, c->bf16) + tiling_gemm_bytes(&m, D, c->bf16));
    }
    c->nc = t.nc;
    c->vc = t.vc;
    c->wsub = t.wsub;
    CT_TRY(ct_alloc((void **)&c->scratch, tiling_bytes(&t, D, c->bf16)));
    float *q = c->scratch;
    c->L = q, q += (size_t)t.nc * t.vc;
    if (c->bf16) {
        c->hbuf = q, q += (size_t)t.nc * D;
        c->wbuf = q, q += (size_t)t.wsub * D;
    }
    c->lse_c = q, q += t.nc;
    c->loss_c = q, q += t.nc;
    c->z_c = q, q += t.nc;
    c->rows = (ce_row *)q;
    return CT_OK;
}

static const float *chunk_h(lce *c, int64_t n0, int64_t nc)
{
    int64_t D = c->in->D;
    if (!c->bf16) return (const float *)c->in->h + n0 * D;
    ct_convert_bf16_to_f32(c->hbuf, (const uint16_t *)c->in->h + n0 * D, (size_t)(nc * D));
    return c->hbuf;
}

/* Rows s0..s0+sw of W as f32 (a pointer into W, or converted into wbuf). */
static const float *weight_rows(lce *c, int64_t s0, int64_t sw)
{
    int64_t D = c->in->D;
    if (!c->bf16) return (const float *)c->in->weight + s0 * D;
    ct_convert_bf16_to_f32(c->wbuf, (const uint16_t *)c->in->weight + s0 * D, (size_t)(sw * D));
    return c->wbuf;
}

/* L[0:nc, 0:vc] = hc W[v0:v0+vc]^T */
static ct_status tile_logits(lce *c, const float *hc, int64_t nc, int64_t v0, int64_t vc)
{
    int64_t D = c->in->D, step = c->bf16 ? c->wsub : vc;
    for (int64_t s0 = v0; s0 < v0 + vc; s0 += step) {
        int64_t sw = v0 + vc - s0 < step ? v0 + vc - s0 : step;
        CT_TRY(ct_gemm_f32(false, true, nc, sw, D, 1.0f, hc, D, weight_rows(c, s0, sw), D, 0.0f,
                           c->L + (s0 - v0), c->vc));
    }
    return CT_OK;
}

static void rows_stats(void *arg, int64_t r0, int64_t r1, int tid)
{
    lce *c = arg;
    for (int64_t r = r0; r < r1; r++) {
        float *z = c->L + r * c->vc;
        int64_t y = ce_target(&c->p, c->n0 + r);
        ce_row_prep(&c->p, z, c->v0, c->cur_vc);
        ce_row_stats(&c->p, &c->rows[r], z, c->v0, c->cur_vc, y);
    }
}

static void rows_grad(void *arg, int64_t r0, int64_t r1, int tid)
{
    lce *c = arg;
    for (int64_t r = r0; r < r1; r++) {
        float *z = c->L + r * c->vc;
        int64_t n = c->n0 + r, y = ce_target(&c->p, n);
        ce_row_prep(&c->p, z, c->v0, c->cur_vc);
        ce_row_grad(&c->p, z, c->v0, c->cur_vc, y, c->lse[r], ce_row_scale(&c->p, c->dloss, n));
    }
}

/* Full-vocabulary rows: prepare, statistics, loss and gradient of each row in one visit,
 * while the row (V floats) is still in cache, instead of one sweep of L per step. */
static void rows_full(void *arg, int64_t r0, int64_t r1, int tid)
{
    lce *c = arg;
    int64_t V = c->p.V;
    for (int64_t r = r0; r < r1; r++) {
        float *z = c->L + r * c->vc;
        int64_t n = c->n0 + r, y = ce_target(&c->p, n);
        ce_row_prep(&c->p, z, 0, V);
        ce_row_begin(&c->rows[r]);
        ce_row_stats(&c->p, &c->rows[r], z, 0, V, y);
        ce_row_finish(&c->p, &c->rows[r], y, &c->lse_c[r], &c->loss_c[r], &c->z_c[r]);
        ce_row_grad(&c->p, z, 0, V, y, c->lse_c[r], ce_row_scale(&c->p, c->dloss, n));
    }
}

/* db[v0 + j] += sum over rows of G[r, j]: threads own columns, rows in order. */
static void cols_bias(void *arg, int64_t j0, int64_t j1, int tid)
{
    lce *c = arg;
    float *db = c->dbias + c->v0;
    for (int64_t r = 0; r < c->cur_nc; r++) {
        const float *g = c->L + r * c->vc;
        for (int64_t j = j0; j < j1; j++) db[j] += g[j];
    }
}

/* Pass A over every vocabulary tile of a chunk: lse, loss and z term per row. */
static ct_status chunk_forward(lce *c, const float *hc, int64_t n0, int64_t nc)
{
    for (int64_t r = 0; r < nc; r++) ce_row_begin(&c->rows[r]);
    c->n0 = n0;
    c->cur_nc = nc;
    for (int64_t v0 = 0; v0 < c->p.V; v0 += c->vc) {
        int64_t vc = c->p.V - v0 < c->vc ? c->p.V - v0 : c->vc;
        CT_TRY(tile_logits(c, hc, nc, v0, vc));
        c->v0 = v0;
        c->cur_vc = vc;
        ct_parallel_for(nc, rows_stats, c);
    }
    for (int64_t r = 0; r < nc; r++)
        ce_row_finish(&c->p, &c->rows[r], ce_target(&c->p, n0 + r), &c->lse_c[r], &c->loss_c[r], &c->z_c[r]);
    return CT_OK;
}

/* Pass B: gradients of a chunk. With ready, L already holds the gradient of the single
 * full-vocabulary tile (rows_full did it); otherwise each tile is recomputed. */
static ct_status chunk_backward(lce *c, const ct_lce_grads *g, const float *hc, int64_t n0, int64_t nc,
                                const float *lse, const float *dloss, bool ready)
{
    int64_t D = c->in->D;
    c->n0 = n0;
    c->cur_nc = nc;
    c->lse = lse;
    c->dloss = dloss;
    c->dbias = g->dbias;
    float *dh = g->dh ? g->dh + n0 * D : NULL;
    for (int64_t v0 = 0; v0 < c->p.V; v0 += c->vc) {
        int64_t vc = c->p.V - v0 < c->vc ? c->p.V - v0 : c->vc;
        c->v0 = v0;
        c->cur_vc = vc;
        if (!ready) {
            CT_TRY(tile_logits(c, hc, nc, v0, vc));
            ct_parallel_for(nc, rows_grad, c);
        }
        if (g->dbias) ct_parallel_for(vc, cols_bias, c);
        int64_t step = c->bf16 ? c->wsub : vc;
        for (int64_t s0 = v0; s0 < v0 + vc; s0 += step) {
            int64_t sw = v0 + vc - s0 < step ? v0 + vc - s0 : step;
            if (!g->dh && !g->dweight) break;
            const float *Gs = c->L + (s0 - v0);
            const float *Ws = g->dh ? weight_rows(c, s0, sw) : NULL;
            if (dh) CT_TRY(ct_gemm_f32(false, false, nc, D, sw, 1.0f, Gs, c->vc, Ws, D, 1.0f, dh, D));
            if (g->dweight)
                CT_TRY(ct_gemm_f32(true, false, sw, D, nc, 1.0f, Gs, c->vc, hc, D, 1.0f, g->dweight + s0 * D, D));
        }
    }
    return CT_OK;
}

static void zero_grads(const ct_lce_grads *g, const ct_lce_inputs *in)
{
    if (g->accumulate) return;
    if (g->dh) memset(g->dh, 0, (size_t)(in->N * in->D) * sizeof(float));
    if (g->dweight) memset(g->dweight, 0, (size_t)(in->V * in->D) * sizeof(float));
    if (g->dbias) memset(g->dbias, 0, (size_t)in->V * sizeof(float));
}

/* Write a chunk's per-row outputs; accumulate the sums in row order. */
static void chunk_outputs(lce *c, const ct_ce_outputs *out, int64_t n0, int64_t nc, double *ls, double *zs)
{
    if (out->lse) memcpy(out->lse + n0, c->lse_c, (size_t)nc * sizeof(float));
    if (c->p.o->reduction == CT_REDUCTION_NONE) {
        memcpy(out->loss + n0, c->loss_c, (size_t)nc * sizeof(float));
        if (out->z_loss) memcpy(out->z_loss + n0, c->z_c, (size_t)nc * sizeof(float));
        return;
    }
    for (int64_t r = 0; r < nc; r++) {
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
    for (int64_t n0 = 0; n0 < in->N && s == CT_OK; n0 += c.nc) {
        int64_t nc = in->N - n0 < c.nc ? in->N - n0 : c.nc;
        s = chunk_forward(&c, chunk_h(&c, n0, nc), n0, nc);
        if (s == CT_OK) chunk_outputs(&c, out, n0, nc, &ls, &zs);
    }
    if (s == CT_OK) final_outputs(&c, out, ls, zs);
    ct_free(c.scratch);
    return s;
}

static ct_status grads_check(const char *fn, const ct_lce_grads *g, const ct_ce_options *opt,
                             const float *dloss, bool dloss_required)
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
    CT_TRY(grads_check(fn, grads, opt, dloss, true));
    lce c;
    CT_TRY(lce_setup(&c, fn, in, opt));
    if (in->N && !lse) {
        ct_free(c.scratch);
        return ct_error(CT_EINVAL, "%s: lse must not be NULL (take it from the forward)", fn);
    }
    zero_grads(grads, in);
    ct_status s = CT_OK;
    for (int64_t n0 = 0; n0 < in->N && s == CT_OK; n0 += c.nc) {
        int64_t nc = in->N - n0 < c.nc ? in->N - n0 : c.nc;
        s = chunk_backward(&c, grads, chunk_h(&c, n0, nc), n0, nc, lse + n0, dloss, false);
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
    CT_TRY(grads_check(fn, grads, opt, dloss, false));
    lce c;
    CT_TRY(lce_setup(&c, fn, in, opt));
    zero_grads(grads, in);
    ct_status s = CT_OK;
    double ls = 0, zs = 0;
    for (int64_t n0 = 0; n0 < in->N && s == CT_OK; n0 += c.nc) {
        int64_t nc = in->N - n0 < c.nc ? in->N - n0 : c.nc;
        const float *hc = chunk_h(&c, n0, nc);
        bool full = c.vc == in->V;
        if (full) { /* three GEMMs: logits, then dh and dW from the gradient left in L */
            s = tile_logits(&c, hc, nc, 0, in->V);
            c.n0 = n0;
            c.cur_nc = nc;
            c.dloss = dloss;
            if (s == CT_OK) ct_parallel_for(nc, rows_full, &c);
        } else {
            s = chunk_forward(&c, hc, n0, nc);
        }
        if (s != CT_OK) break;
        chunk_outputs(&c, out, n0, nc, &ls, &zs);
        s = chunk_backward(&c, grads, hc, n0, nc, c.lse_c, dloss, full);
    }
    if (s == CT_OK) final_outputs(&c, out, ls, zs);
    ct_free(c.scratch);
    return s;
}
