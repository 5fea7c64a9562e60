/*
 * FlexAttention kernels (FlashAttention-2 style) over a block mask.
 *
 * Work units are independent: the forward and the dQ pass own one (b, h, query block) each,
 * the dK/dV pass one (b, kv head, key block) (looping over the query heads of its group and
 * the query blocks of the transposed lists). Within a unit, blocks are visited in ascending
 * order and every sum runs in that fixed order, so each output is the same bits whichever
 * thread computes it; threads take units from a shared counter (load balance without any
 * effect on the results). Score-mod parameter gradients are gathered per fixed group of dQ
 * units and summed group by group in order.
 *
 * Tiles: queries of a block are processed in sub-tiles of T <= 128 rows, keys likewise. The
 * queries of a sub-tile are packed transposed (Qt[e][i] = scale * q[i][e], padded to Tp
 * columns) so S = K Qt comes out key-major (S[j][i]) and the per-query softmax statistics
 * vectorise across queries. K, V, Q and dO rows are read in place when f32, converted per
 * tile when bf16.
 */
#include "attention/attn.h"
#include "attention/attn_kernels.h"
#include "core/internal.h"
#include "ops/vecmath.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define TILE_MAX 128
#define DIM_MAX 65536

/* Row access to a [B, H, L, W] (or [B, H, L]) tensor. */
typedef struct tens {
    char *data;
    ct_dtype dt;
    size_t es;
    int64_t s0, s1, s2;
} tens;

static inline void *trow(const tens *t, int64_t b, int64_t h, int64_t l)
{
    return t->data + (b * t->s0 + h * t->s1 + l * t->s2) * (int64_t)t->es;
}

static inline int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

typedef struct plan plan;
typedef void (*unit_fn)(plan *p, float *ws, int64_t u);

struct plan {
    int64_t B, Hq, Hkv, G, L, S, E, Ev;
    float scale;
    tens q, k, v, o, lse, dout, dq, dk, dv;
    const ct_block_mask *bm;
    const ct_score_mod *sm;
    bool mod_grad; /* the score mod has a derivative to apply */
    int64_t bs, nqb, nkb, T, Tp;
    int32_t *iota; /* dense lists (no block mask) */
    float *D;      /* [B, Hq, L] rowsum(dO * O) */
    float *ws;     /* per-thread workspaces */
    size_t ws_floats;
    int ws_threads; /* workspaces allocated (tid < ws_threads) */
    unit_fn unit;
    int64_t nunits, group; /* dQ pass: canonical items per unit (0: one item, any order) */
    float *pg;             /* [nunits][param_len] partial parameter gradients */
    atomic_llong next;
};

/* ---- workspace ------------------------------------------------------------------------- */

typedef struct wsl {
    float *qt, *dot, *s, *raw, *dp, *acc, *acc2, *kf, *vf, *qf, *dof;
    float *m, *l, *alpha, *lse, *D, *row;
    uint8_t *keep;
} wsl;

static size_t up16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Lay the workspace out (p->ws_floats is its size when base is NULL). */
static wsl ws_layout(plan *p, float *base)
{
    size_t T = (size_t)p->T, Tp = (size_t)p->Tp, E = (size_t)p->E, Ev = (size_t)p->Ev;
    size_t W = E > Ev ? E : Ev, off = 0;
    wsl w;
#define TAKE(f, n) (w.f = base ? base + off : NULL, off += up16(n))
    TAKE(qt, E * Tp);
    TAKE(dot, Ev * Tp);
    TAKE(s, T * Tp);
    TAKE(raw, T * Tp);
    TAKE(dp, T * Tp);
    TAKE(acc, T * W);
    TAKE(acc2, T * Ev);
    TAKE(kf, T * E);
    TAKE(vf, T * Ev);
    TAKE(qf, T * E);
    TAKE(dof, T * Ev);
    TAKE(m, Tp);
    TAKE(l, Tp);
    TAKE(alpha, Tp);
    TAKE(lse, Tp);
    TAKE(D, Tp);
    TAKE(row, W);
#undef TAKE
    w.keep = base ? (uint8_t *)(base + off) : NULL;
    off += up16((T * Tp + 3) / 4);
    p->ws_floats = off;
    return w;
}

/* ---- rows in and out ----------------------------------------------------------------- */

/* Rows l0 .. l0+n-1 of (b, h) as f32: a pointer into t when it is f32, else converted. */
static const float *rows_f32(const tens *t, int64_t b, int64_t h, int64_t l0, int64_t n,
                             int64_t width, float *buf, int64_t *ld)
{
    if (t->dt == CT_DTYPE_F32) {
        *ld = t->s2;
        return trow(t, b, h, l0);
    }
    for (int64_t i = 0; i < n; i++)
        ct_convert_bf16_to_f32(buf + i * width, trow(t, b, h, l0 + i), (size_t)width);
    *ld = width;
    return buf;
}

/* dst[e][i] = mult * t[b, h, l0 + i, e] for i < n, 0 for n <= i < Tp; returns the rows as
 * f32 (in place, or converted into buf) with their stride in *ld. */
static const float *pack_t(const tens *t, int64_t b, int64_t h, int64_t l0, int64_t n,
                           int64_t width, float mult, float *dst, int64_t Tp, float *buf,
                           int64_t *ld)
{
    const float *x = rows_f32(t, b, h, l0, n, width, buf, ld);
    at_pack_t(x, *ld, n, width, mult, dst, Tp, Tp);
    return x;
}

/* t[b, h, l0 + i, :] = (rm ? rm[i] : mult) * src[i, :] (src NULL: zeros). */
static void write_rows(const tens *t, int64_t b, int64_t h, int64_t l0, int64_t n, int64_t width,
                       const float *src, int64_t ld, const float *rm, float mult, float *tmp)
{
    for (int64_t i = 0; i < n; i++) {
        float f = rm ? rm[i] : mult;
        bool f32 = t->dt == CT_DTYPE_F32;
        float *d = f32 ? (float *)trow(t, b, h, l0 + i) : tmp;
        for (int64_t e = 0; e < width; e++)
            d[e] = src ? f * src[i * ld + e] : 0.0f;
        if (!f32) ct_convert_f32_to_bf16((uint16_t *)trow(t, b, h, l0 + i), tmp, (size_t)width);
    }
}

/* ---- block lists ----------------------------------------------------------------------- */

typedef struct blist {
    const int32_t *full, *part;
    int64_t nfull, npart;
    const uint8_t *tiles;   /* stored partial tiles, or NULL */
    int64_t part0;          /* rows: tile of part[k] is part0 + k */
    const int64_t *tile_of; /* columns: tile of part[k] is tile_of[k] */
    int64_t a, b;           /* cursors into full and part */
} blist;

static void row_list(const plan *p, int64_t b, int64_t h, int64_t qb, blist *l)
{
    memset(l, 0, sizeof *l);
    const ct_block_mask *m = p->bm;
    if (!m) {
        l->full = p->iota;
        l->nfull = p->nkb;
        return;
    }
    int64_t r = ((m->B == 1 ? 0 : b) * m->H + (m->H == 1 ? 0 : h)) * m->num_q_blocks + qb;
    l->full = m->full_kv_idx + m->full_kv_ptr[r];
    l->nfull = m->full_kv_ptr[r + 1] - m->full_kv_ptr[r];
    l->part = m->kv_idx + m->kv_ptr[r];
    l->npart = m->kv_ptr[r + 1] - m->kv_ptr[r];
    l->tiles = m->tiles;
    l->part0 = m->kv_ptr[r];
}

static void col_list(const plan *p, int64_t b, int64_t h, int64_t kb, blist *l)
{
    memset(l, 0, sizeof *l);
    const ct_block_mask *m = p->bm;
    if (!m) {
        l->full = p->iota;
        l->nfull = p->nqb;
        return;
    }
    int64_t c = ((m->B == 1 ? 0 : b) * m->H + (m->H == 1 ? 0 : h)) * m->num_kv_blocks + kb;
    l->full = m->full_q_idx + m->full_q_ptr[c];
    l->nfull = m->full_q_ptr[c + 1] - m->full_q_ptr[c];
    l->part = m->q_idx + m->q_ptr[c];
    l->npart = m->q_ptr[c + 1] - m->q_ptr[c];
    l->tiles = m->tiles;
    l->tile_of = m->q_tile ? m->q_tile + m->q_ptr[c] : NULL;
}

/* The next block in ascending order (-1 when done); *tile is its stored mask or NULL. */
static int64_t blist_next(blist *l, bool *partial, const uint8_t **tile, size_t area)
{
    bool hf = l->a < l->nfull, hp = l->b < l->npart;
    if (!hf && !hp) return -1;
    if (hp && (!hf || l->part[l->b] < l->full[l->a])) {
        int64_t k = l->b++;
        *partial = true;
        *tile =
            l->tiles ? l->tiles + (size_t)(l->tile_of ? l->tile_of[k] : l->part0 + k) * area : NULL;
        return l->part[k];
    }
    *partial = false;
    *tile = NULL;
    return l->full[l->a++];
}

/* ---- the score tile -------------------------------------------------------------------- */

typedef struct tile_pos {
    int64_t b, h, q0, nq, kv0, nk; /* this sub-tile */
    int64_t oq, ok;                /* its offsets inside the mask block */
    bool partial;
    const uint8_t *stored; /* the block's stored mask, or NULL */
} tile_pos;

/* A rectangle of a sub-tile: keys r0 .. r0+nr-1 and queries c0 .. c0+nc-1 (nc real columns,
 * ncp >= nc computed ones, a multiple of 8 within Tp; c0 a multiple of 8). */
typedef struct rect {
    int64_t r0, nr, c0, nc, ncp;
} rect;

/* The keep bytes of a partial sub-tile (key-major, row stride *kld): the stored mask, or the
 * mask evaluated into w->keep. */
static const uint8_t *tile_keep(const plan *p, wsl *w, const tile_pos *t, int64_t *kld)
{
    if (t->stored) {
        *kld = p->bs;
        return t->stored + t->ok * p->bs + t->oq;
    }
    ct_attn_tile at = {t->b, t->h, t->q0, t->nq, t->kv0, t->nk, 1, p->Tp};
    p->bm->mask_mod.tile(p->bm->mask_mod.ctx, &at, w->keep);
    *kld = p->Tp;
    return w->keep;
}

static inline size_t roff(const plan *p, const rect *r)
{
    return (size_t)(r->r0 * p->Tp + r->c0);
}

/* The scores of a rectangle into w->s (at its place in the sub-tile's layout) after the score
 * mod and the mask (keep NULL: a full block); w->raw = before the mod when keep_raw and the
 * mod has a derivative. */
static void scores(const plan *p, wsl *w, const float *K, int64_t ldk, const tile_pos *t,
                   const uint8_t *keep, int64_t kld, const rect *r, bool keep_raw)
{
    int64_t Tp = p->Tp;
    float *s = w->s + roff(p, r);
    at_gemm(r->nr, r->ncp, p->E, K + r->r0 * ldk, ldk, 1, w->qt + r->c0, Tp, s, Tp, false, NULL);
    if (p->sm) {
        ct_attn_tile at = {t->b, t->h, t->q0 + r->c0, r->nc, t->kv0 + r->r0, r->nr, 1, Tp};
        if (keep_raw && p->mod_grad)
            for (int64_t j = 0; j < r->nr; j++)
                memcpy(w->raw + roff(p, r) + j * Tp, s + j * Tp, (size_t)r->ncp * sizeof(float));
        p->sm->fwd(p->sm->ctx, &at, s);
    }
    if (keep) at_apply_keep(s, Tp, keep + r->r0 * kld + r->c0, kld, r->nr, r->nc);
}

/* ---- trimming partial tiles ----------------------------------------------------------------
 * Inside a partial sub-tile, the rectangles where every pair is masked contribute exact zeros
 * (P = 0: nothing to the softmax sums, the maxima or any product), so they are skipped: the
 * forward and dQ passes take the queries in chunks of CHUNK columns, each over the keys from its
 * first to its last kept one (the first rounded down to even: each row keeps its parity in the
 * softmax's two row accumulators); the dK/dV pass takes the keys in chunks of
 * CHUNK rows, each over the queries of its kept pairs (8-column steps). The results are those
 * of the whole sub-tile (up to the sign of a zero); a sub-tile the trimming would not shrink by
 * a fifth is taken whole. Causal diagonal blocks shrink by 3/8 (64 rows) to 7/16 (128), a
 * 128-block of two causal 64-token documents by 11/16. */
#define CHUNK 16
#define NCH_MAX ((TILE_MAX + 15) / CHUNK + 1)

/* Query chunks of a partial sub-tile: rects[n] over the keys each needs; returns n (0: the
 * sub-tile is masked whole), or -1 when the whole sub-tile is the better unit. */
static int q_rects(const plan *p, const tile_pos *t, const uint8_t *keep, int64_t kld,
                   rect *rects)
{
    int nch = (int)((t->nq + CHUNK - 1) / CHUNK);
    int64_t lo[NCH_MAX], hi[NCH_MAX];
    for (int c = 0; c < nch; c++)
        lo[c] = t->nk, hi[c] = -1;
    for (int64_t j = 0; j < t->nk; j++) {
        const uint8_t *row = keep + j * kld;
        for (int c = 0; c < nch; c++) {
            int64_t i0 = (int64_t)c * CHUNK, i1 = min64(i0 + CHUNK, t->nq);
            bool any = false;
            for (int64_t i = i0; i < i1 && !any; i += 8) {
                uint64_t x = 0;
                if (i + 8 <= i1)
                    memcpy(&x, row + i, 8);
                else
                    for (int64_t k = i; k < i1; k++)
                        x |= row[k];
                any = x != 0;
            }
            if (any) {
                if (j < lo[c]) lo[c] = j;
                hi[c] = j;
            }
        }
    }
    int n = 0;
    int64_t area = 0;
    for (int c = 0; c < nch; c++) {
        if (hi[c] < 0) continue;
        int64_t r0 = lo[c] & ~(int64_t)1, c0 = (int64_t)c * CHUNK;
        rects[n] = (rect){r0, hi[c] + 1 - r0, c0, min64(CHUNK, t->nq - c0), CHUNK};
        area += rects[n].nr;
        n++;
    }
    if (n && area * 5 > (int64_t)nch * t->nk * 4) return -1;
    return n;
}

/* Key chunks of a partial sub-tile: rects[n] over the queries each needs (see q_rects). */
static int k_rects(const plan *p, const tile_pos *t, const uint8_t *keep, int64_t kld,
                   rect *rects)
{
    int nch = (int)((t->nk + CHUNK - 1) / CHUNK), n = 0;
    int64_t area = 0, nw = (t->nq + 7) / 8;
    for (int c = 0; c < nch; c++) {
        int64_t r0 = (int64_t)c * CHUNK, r1 = min64(r0 + CHUNK, t->nk), w0 = nw, w1 = -1;
        for (int64_t wi = 0; wi < nw; wi++) {
            int64_t i0 = wi * 8, i1 = min64(i0 + 8, t->nq);
            uint64_t x = 0;
            for (int64_t j = r0; j < r1 && !x; j++) {
                const uint8_t *row = keep + j * kld;
                if (i1 - i0 == 8) {
                    uint64_t y;
                    memcpy(&y, row + i0, 8);
                    x |= y;
                } else {
                    for (int64_t k = i0; k < i1; k++)
                        x |= row[k];
                }
            }
            if (x) {
                if (wi < w0) w0 = wi;
                w1 = wi;
            }
        }
        if (w1 < 0) continue;
        int64_t c0 = w0 * 8, c1 = min64((w1 + 1) * 8, t->nq);
        rects[n] = (rect){r0, r1 - r0, c0, c1 - c0, (c1 - c0 + 7) & ~(int64_t)7};
        area += (r1 - r0) * rects[n].ncp;
        n++;
    }
    if (n && area * 5 > t->nk * p->Tp * 4) return -1;
    return n;
}

/* The rectangles of a sub-tile into rects; returns their count. */
static int tile_rects(const plan *p, wsl *w, const tile_pos *t, bool by_keys, rect *rects,
                      const uint8_t **keep, int64_t *kld)
{
    *keep = NULL;
    *kld = 0;
    if (t->partial) {
        *keep = tile_keep(p, w, t, kld);
        int n = by_keys ? k_rects(p, t, *keep, *kld, rects) : q_rects(p, t, *keep, *kld, rects);
        if (n >= 0) return n;
    }
    rects[0] = (rect){0, t->nk, 0, t->nq, p->Tp};
    return 1;
}

/* ---- forward --------------------------------------------------------------------------- */

static void fwd_unit(plan *p, float *wsb, int64_t u)
{
    wsl w = ws_layout(p, wsb);
    int64_t bh = u / p->nqb, qb = p->nqb - 1 - u % p->nqb; /* heavy (late) blocks first */
    int64_t b = bh / p->Hq, h = bh % p->Hq, hk = h / p->G, Tp = p->Tp;
    int64_t qend = min64(p->L, (qb + 1) * p->bs);
    size_t area = (size_t)(p->bs * p->bs);
    rect rects[NCH_MAX];
    for (int64_t q0 = qb * p->bs; q0 < qend; q0 += p->T) {
        int64_t nq = min64(p->T, qend - q0), ldq;
        pack_t(&p->q, b, h, q0, nq, p->E, p->scale, w.qt, Tp, w.qf, &ldq);
        for (int64_t i = 0; i < Tp; i++)
            w.m[i] = -INFINITY, w.l[i] = 0.0f;
        memset(w.acc, 0, (size_t)(nq * p->Ev) * sizeof(float));
        blist bl;
        row_list(p, b, h, qb, &bl);
        tile_pos t = {b, h, q0, nq, 0, 0, q0 - qb * p->bs, 0, false, NULL};
        int64_t kb;
        while ((kb = blist_next(&bl, &t.partial, &t.stored, area)) >= 0) {
            int64_t kend = min64(p->S, (kb + 1) * p->bs);
            for (t.kv0 = kb * p->bs; t.kv0 < kend; t.kv0 += p->T) {
                t.nk = min64(p->T, kend - t.kv0);
                t.ok = t.kv0 - kb * p->bs;
                const uint8_t *keep;
                int64_t kld, ldk, ldv;
                int n = tile_rects(p, &w, &t, false, rects, &keep, &kld);
                if (!n) continue;
                const float *K = rows_f32(&p->k, b, hk, t.kv0, t.nk, p->E, w.kf, &ldk);
                const float *V = rows_f32(&p->v, b, hk, t.kv0, t.nk, p->Ev, w.vf, &ldv);
                for (int x = 0; x < n; x++) {
                    const rect *r = &rects[x];
                    float *S = w.s + roff(p, r);
                    scores(p, &w, K, ldk, &t, keep, kld, r, false);
                    at_softmax_update(S, r->nr, Tp, r->ncp, w.m + r->c0, w.l + r->c0,
                                      w.alpha + r->c0);
                    /* acc starts at zero: alpha (0 before any kept key) times it adds nothing */
                    at_gemm(r->nc, p->Ev, r->nr, S, 1, Tp, V + r->r0 * ldv, ldv,
                            w.acc + r->c0 * p->Ev, p->Ev, true, w.alpha + r->c0);
                }
            }
        }
        for (int64_t i = 0; i < nq; i++)
            w.alpha[i] = w.l[i] > 0.0f ? 1.0f / w.l[i] : 0.0f;
        write_rows(&p->o, b, h, q0, nq, p->Ev, w.acc, p->Ev, w.alpha, 0.0f, w.row);
        if (p->lse.data)
            for (int64_t i = 0; i < nq; i++)
                *(float *)trow(&p->lse, b, h, q0 + i) =
                    w.l[i] > 0.0f ? w.m[i] + logf(w.l[i]) : -INFINITY;
    }
}

/* ---- backward -------------------------------------------------------------------------- */

/* Pack the query side of a sub-tile: Qt, dOt, lse (fully masked rows: +inf, so P = 0) and
 * D, padded to Tp; the rows of q and dO as f32 into *Q and *dO (strides *ldq, *lddo). */
static void load_q_side(const plan *p, wsl *w, int64_t b, int64_t h, int64_t q0, int64_t nq,
                        const float **Q, int64_t *ldq, const float **dO, int64_t *lddo)
{
    *Q = pack_t(&p->q, b, h, q0, nq, p->E, p->scale, w->qt, p->Tp, w->qf, ldq);
    *dO = pack_t(&p->dout, b, h, q0, nq, p->Ev, 1.0f, w->dot, p->Tp, w->dof, lddo);
    const float *D = p->D + (b * p->Hq + h) * p->L + q0;
    for (int64_t i = 0; i < p->Tp; i++) {
        float x = i < nq ? *(const float *)trow(&p->lse, b, h, q0 + i) : INFINITY;
        w->lse[i] = x == -INFINITY ? INFINITY : x;
        w->D[i] = i < nq ? D[i] : 0.0f;
    }
}

/* dS of a rectangle into w->dp (P left in w->s): P = exp(S - lse), dP = V dOt,
 * dS = P (dP - D), then the score mod's derivative (parameter gradients into dparam); with
 * dv, dV += P^T dO over the rectangle's queries. */
static void grad_scores(const plan *p, wsl *w, const float *V, int64_t ldv, const tile_pos *t,
                        const rect *r, float *dparam, const float *dO, int64_t lddo, float *dv)
{
    int64_t Tp = p->Tp;
    float *S = w->s + roff(p, r), *dP = w->dp + roff(p, r);
    at_exp_sub(S, r->nr, Tp, r->ncp, w->lse + r->c0);
    if (dv)
        at_gemm(r->nr, p->Ev, r->nc, S, Tp, 1, dO + r->c0 * lddo, lddo, dv + r->r0 * p->Ev, p->Ev,
                true, NULL);
    at_gemm(r->nr, r->ncp, p->Ev, V + r->r0 * ldv, ldv, 1, w->dot + r->c0, Tp, dP, Tp, false,
            NULL);
    at_dsoftmax(S, dP, r->nr, Tp, r->ncp, w->D + r->c0);
    if (p->mod_grad) {
        ct_attn_tile at = {t->b, t->h, t->q0 + r->c0, r->nc, t->kv0 + r->r0, r->nr, 1, Tp};
        p->sm->grad(p->sm->ctx, &at, w->raw + roff(p, r), dP, dparam);
    }
}

/* dK and dV of one (b, kv head, key block). */
static void dkv_unit(plan *p, float *wsb, int64_t u)
{
    wsl w = ws_layout(p, wsb);
    int64_t bh = u / p->nkb, kb = u % p->nkb, b = bh / p->Hkv, hk = bh % p->Hkv, Tp = p->Tp;
    int64_t kend = min64(p->S, (kb + 1) * p->bs);
    size_t area = (size_t)(p->bs * p->bs);
    rect rects[NCH_MAX];
    for (int64_t k0 = kb * p->bs; k0 < kend; k0 += p->T) {
        int64_t nk = min64(p->T, kend - k0), ldk, ldv;
        const float *K = rows_f32(&p->k, b, hk, k0, nk, p->E, w.kf, &ldk);
        const float *V = rows_f32(&p->v, b, hk, k0, nk, p->Ev, w.vf, &ldv);
        /* the sums start at zero, then every rectangle adds to them */
        memset(w.acc, 0, (size_t)(nk * p->E) * sizeof(float));
        memset(w.acc2, 0, (size_t)(nk * p->Ev) * sizeof(float));
        for (int64_t h = hk * p->G; h < (hk + 1) * p->G; h++) {
            blist bl;
            col_list(p, b, h, kb, &bl);
            tile_pos t = {b, h, 0, 0, k0, nk, 0, k0 - kb * p->bs, false, NULL};
            int64_t qb;
            while ((qb = blist_next(&bl, &t.partial, &t.stored, area)) >= 0) {
                int64_t qend = min64(p->L, (qb + 1) * p->bs);
                for (t.q0 = qb * p->bs; t.q0 < qend; t.q0 += p->T) {
                    t.nq = min64(p->T, qend - t.q0);
                    t.oq = t.q0 - qb * p->bs;
                    const uint8_t *keep;
                    int64_t kld;
                    int n = tile_rects(p, &w, &t, true, rects, &keep, &kld);
                    if (!n) continue;
                    const float *Q, *dO;
                    int64_t ldq, lddo;
                    load_q_side(p, &w, b, h, t.q0, t.nq, &Q, &ldq, &dO, &lddo);
                    for (int x = 0; x < n; x++) {
                        const rect *r = &rects[x];
                        scores(p, &w, K, ldk, &t, keep, kld, r, true);
                        grad_scores(p, &w, V, ldv, &t, r, NULL, dO, lddo, w.acc2);
                        at_gemm(r->nr, p->E, r->nc, w.dp + roff(p, r), Tp, 1, Q + r->c0 * ldq,
                                ldq, w.acc + r->r0 * p->E, p->E, true, NULL);
                    }
                }
            }
        }
        if (p->dk.data) write_rows(&p->dk, b, hk, k0, nk, p->E, w.acc, p->E, NULL, p->scale, w.row);
        if (p->dv.data) write_rows(&p->dv, b, hk, k0, nk, p->Ev, w.acc2, p->Ev, NULL, 1.0f, w.row);
    }
}

/* dQ of one (b, h, query block); score-mod parameter gradients into dparam. */
static void dq_item(plan *p, wsl *w, int64_t item, float *dparam)
{
    int64_t bh = item / p->nqb, qb = item % p->nqb, b = bh / p->Hq, h = bh % p->Hq;
    int64_t hk = h / p->G, Tp = p->Tp, qend = min64(p->L, (qb + 1) * p->bs);
    size_t area = (size_t)(p->bs * p->bs);
    rect rects[NCH_MAX];
    for (int64_t q0 = qb * p->bs; q0 < qend; q0 += p->T) {
        int64_t nq = min64(p->T, qend - q0), ldq, lddo;
        const float *Q, *dO;
        load_q_side(p, w, b, h, q0, nq, &Q, &ldq, &dO, &lddo);
        memset(w->acc, 0, (size_t)(nq * p->E) * sizeof(float));
        blist bl;
        row_list(p, b, h, qb, &bl);
        tile_pos t = {b, h, q0, nq, 0, 0, q0 - qb * p->bs, 0, false, NULL};
        int64_t kb;
        while ((kb = blist_next(&bl, &t.partial, &t.stored, area)) >= 0) {
            int64_t kend = min64(p->S, (kb + 1) * p->bs);
            for (t.kv0 = kb * p->bs; t.kv0 < kend; t.kv0 += p->T) {
                t.nk = min64(p->T, kend - t.kv0);
                t.ok = t.kv0 - kb * p->bs;
                const uint8_t *keep;
                int64_t kld, ldk, ldv;
                int n = tile_rects(p, w, &t, false, rects, &keep, &kld);
                if (!n) continue;
                const float *K = rows_f32(&p->k, b, hk, t.kv0, t.nk, p->E, w->kf, &ldk);
                const float *V = rows_f32(&p->v, b, hk, t.kv0, t.nk, p->Ev, w->vf, &ldv);
                for (int x = 0; x < n; x++) {
                    const rect *r = &rects[x];
                    scores(p, w, K, ldk, &t, keep, kld, r, true);
                    grad_scores(p, w, V, ldv, &t, r, dparam, NULL, 0, NULL);
                    at_gemm(r->nc, p->E, r->nr, w->dp + roff(p, r), 1, Tp, K + r->r0 * ldk, ldk,
                            w->acc + r->c0 * p->E, p->E, true, NULL);
                }
            }
        }
        if (p->dq.data)
            write_rows(&p->dq, b, h, q0, nq, p->E, w->acc, p->E, NULL, p->scale, w->row);
    }
}

static void dq_unit(plan *p, float *wsb, int64_t u)
{
    wsl w = ws_layout(p, wsb);
    if (!p->group) {
        int64_t bh = u / p->nqb, qb = p->nqb - 1 - u % p->nqb;
        dq_item(p, &w, bh * p->nqb + qb, NULL);
        return;
    }
    int64_t n = p->B * p->Hq * p->nqb;
    float *dparam = p->pg + (size_t)u * (size_t)p->sm->param_len;
    for (int64_t it = u * p->group; it < min64(n, (u + 1) * p->group); it++)
        dq_item(p, &w, it, dparam);
}

/* ---- running a pass ------------------------------------------------------------------- */

static void worker(void *arg, int64_t t0, int64_t t1, int tid)
{
    plan *p = arg;
    float *ws = p->ws + (size_t)tid * p->ws_floats;
    for (;;) {
        int64_t u = atomic_fetch_add(&p->next, 1);
        if (u >= p->nunits) break;
        p->unit(p, ws, u);
    }
}

static void run_pass(plan *p, unit_fn fn, int64_t nunits)
{
    p->unit = fn;
    p->nunits = nunits;
    atomic_store(&p->next, 0);
    int T = p->ws_threads; /* the workspaces alloc_ws made: tid < T */
    ct_parallel_for_capped(nunits < T ? nunits : T, 1, T, worker, p);
}

static void d_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    plan *p = arg;
    float a[64], c[64];
    for (int64_t r = r0; r < r1; r++) {
        int64_t l = r % p->L, bh = r / p->L, b = bh / p->Hq, h = bh % p->Hq;
        const char *x = trow(&p->dout, b, h, l), *y = trow(&p->o, b, h, l);
        float s = 0.0f;
        for (int64_t e0 = 0; e0 < p->Ev; e0 += 64) {
            int64_t n = min64(64, p->Ev - e0);
            const float *xa = a, *ya = c;
            if (p->dout.dt == CT_DTYPE_F32)
                xa = (const float *)x + e0;
            else
                ct_convert_bf16_to_f32(a, (const uint16_t *)x + e0, (size_t)n);
            if (p->o.dt == CT_DTYPE_F32)
                ya = (const float *)y + e0;
            else
                ct_convert_bf16_to_f32(c, (const uint16_t *)y + e0, (size_t)n);
            s += ct_vdot(xa, ya, n);
        }
        p->D[r] = s;
    }
}

static void reduce_pg(void *arg, int64_t j0, int64_t j1, int tid)
{
    plan *p = arg;
    size_t len = (size_t)p->sm->param_len;
    for (int64_t j = j0; j < j1; j++) {
        float s = 0.0f;
        for (int64_t g = 0; g < p->nunits; g++)
            s += p->pg[(size_t)g * len + (size_t)j];
        p->sm->param_grad[j] += s;
    }
}

/* ---- validation and setup ------------------------------------------------------------- */

static ct_status get_tens(const char *fn, const char *name, const ct_tensor *t, int nd,
                          const int64_t *shape, ct_dtype d1, ct_dtype d2, tens *o)
{
    if (!t) return ct_error(CT_EINVAL, "%s: %s must not be NULL", fn, name);
    if (t->ndim != nd)
        return ct_error(CT_EINVAL, "%s: %s must have %d dims, got %d", fn, name, nd, t->ndim);
    for (int i = 0; i < nd; i++)
        if (shape[i] >= 0 && t->shape[i] != shape[i])
            return ct_error(CT_EINVAL, "%s: %s.shape[%d] must be %lld, got %lld", fn, name, i,
                            (long long)shape[i], (long long)t->shape[i]);
    if (t->dtype != d1 && t->dtype != d2)
        return ct_error(CT_EINVAL, "%s: %s must be %s%s%s, got %s", fn, name, ct_dtype_name(d1),
                        d1 == d2 ? "" : " or ", d1 == d2 ? "" : ct_dtype_name(d2),
                        ct_dtype_name(t->dtype));
    if (nd == 4 && t->shape[3] > 1 && t->strides[3] != 1)
        return ct_error(CT_EINVAL,
                        "%s: %s's last dim must be contiguous (stride 1), got stride %lld", fn,
                        name, (long long)t->strides[3]);
    if (!t->data && ct_tensor_numel(t) > 0)
        return ct_error(CT_EINVAL, "%s: %s.data must not be NULL", fn, name);
    *o = (tens){t->data,       t->dtype,      ct_dtype_size(t->dtype),
                t->strides[0], t->strides[1], t->strides[2]};
    return CT_OK;
}

static void plan_free(plan *p)
{
    ct_free(p->iota);
    ct_free(p->ws);
    ct_free(p->D);
    ct_free(p->pg);
}

static ct_status plan_init(plan *p, const char *fn, const ct_tensor *q, const ct_tensor *k,
                           const ct_tensor *v, const ct_block_mask *bm, const ct_flex_options *o)
{
    memset(p, 0, sizeof *p);
    if (!q || !k || !v) return ct_error(CT_EINVAL, "%s: q, k and v must not be NULL", fn);
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return ct_error(CT_EINVAL,
                        "%s: q, k and v must have 4 dims [B, H, len, dim], got %d, %d, %d", fn,
                        q->ndim, k->ndim, v->ndim);
    p->B = q->shape[0], p->Hq = q->shape[1], p->L = q->shape[2], p->E = q->shape[3];
    p->Hkv = k->shape[1], p->S = k->shape[2], p->Ev = v->shape[3];
    CT_TRY(
        get_tens(fn, "q", q, 4, (int64_t[]){-1, -1, -1, -1}, CT_DTYPE_F32, CT_DTYPE_BF16, &p->q));
    CT_TRY(get_tens(fn, "k", k, 4, (int64_t[]){p->B, -1, -1, p->E}, q->dtype, q->dtype, &p->k));
    CT_TRY(get_tens(fn, "v", v, 4, (int64_t[]){p->B, p->Hkv, p->S, -1}, q->dtype, q->dtype, &p->v));
    if (p->E < 1 || p->Ev < 1 || p->E > DIM_MAX || p->Ev > DIM_MAX)
        return ct_error(CT_EINVAL, "%s: head dims must be in [1, %d], got E=%lld Ev=%lld", fn,
                        DIM_MAX, (long long)p->E, (long long)p->Ev);
    if (p->Hkv < 1 || p->Hq % p->Hkv != 0)
        return ct_error(CT_EINVAL,
                        "%s: query heads (%lld) must be a multiple of key/value heads (%lld)", fn,
                        (long long)p->Hq, (long long)p->Hkv);
    p->G = p->Hq / p->Hkv;
    if (!isfinite(o->scale))
        return ct_error(CT_EINVAL, "%s: scale must be finite, got %g", fn, (double)o->scale);
    p->scale = o->scale != 0.0f ? o->scale : (float)(1.0 / sqrt((double)p->E));
    if (o->score_mod && !o->score_mod->fwd)
        return ct_error(CT_EINVAL, "%s: score_mod->fwd must not be NULL", fn);
    p->sm = o->score_mod;
    p->mod_grad = p->sm && p->sm->grad;
    if (p->sm) CT_TRY(at_score_check(p->sm, p->B, p->Hq, p->L, p->S)); /* compiled mods */
    if (bm) {
        if (bm->q_len != p->L || bm->kv_len != p->S)
            return ct_error(CT_EINVAL,
                            "%s: block mask is for Q_LEN=%lld KV_LEN=%lld but q has %lld "
                            "queries and k %lld keys",
                            fn, (long long)bm->q_len, (long long)bm->kv_len, (long long)p->L,
                            (long long)p->S);
        if ((bm->B != 1 && bm->B != p->B) || (bm->H != 1 && bm->H != p->Hq))
            return ct_error(CT_EINVAL,
                            "%s: block mask B=%lld H=%lld must be 1 or match B=%lld Hq=%lld", fn,
                            (long long)bm->B, (long long)bm->H, (long long)p->B, (long long)p->Hq);
        if (!bm->tiles && !bm->mask_mod.tile)
            return ct_error(CT_EINVAL, "%s: block mask has no mask_mod tile function", fn);
    }
    p->bm = bm;
    p->bs = bm ? bm->block_size : TILE_MAX;
    p->nqb = (p->L + p->bs - 1) / p->bs;
    p->nkb = (p->S + p->bs - 1) / p->bs;
    p->T = p->bs <= TILE_MAX ? p->bs
                             : (p->bs + (p->bs + TILE_MAX - 1) / TILE_MAX - 1) /
                                   ((p->bs + TILE_MAX - 1) / TILE_MAX);
    p->Tp = (p->T + 15) & ~(int64_t)15;
    if (!bm) {
        int64_t n = p->nqb > p->nkb ? p->nqb : p->nkb;
        if (n > INT32_MAX) return ct_error(CT_EINVAL, "%s: sequence too long", fn);
        CT_TRY(ct_alloc((void **)&p->iota, (size_t)(n ? n : 1) * sizeof(int32_t)));
        for (int64_t i = 0; i < n; i++)
            p->iota[i] = (int32_t)i;
    }
    return CT_OK;
}

static ct_status alloc_ws(plan *p)
{
    ws_layout(p, NULL);
    size_t bytes;
    int T = ct_num_threads();
    p->ws_threads = T;
    if (!ct_mul_size(p->ws_floats * sizeof(float), (size_t)T, &bytes))
        return ct_error(CT_EOVERFLOW, "attention: workspace size overflows");
    return ct_alloc((void **)&p->ws, bytes);
}

ct_flex_options ct_flex_options_default(void)
{
    return (ct_flex_options){.scale = 0.0f, .score_mod = NULL,
                             .grad_scratch_bytes = CT_DEFAULT_SCRATCH_BYTES};
}

ct_status at_forward(const char *fn, const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                     const ct_block_mask *bm, const ct_flex_options *opt, ct_tensor *out,
                     ct_tensor *lse)
{
    ct_flex_options o = opt ? *opt : ct_flex_options_default();
    plan p;
    ct_status s = plan_init(&p, fn, q, k, v, bm, &o);
    int64_t B = p.B, Hq = p.Hq, L = p.L;
    if (s == CT_OK)
        s = get_tens(fn, "out", out, 4, (int64_t[]){B, Hq, L, p.Ev}, q->dtype, CT_DTYPE_F32, &p.o);
    if (s == CT_OK && lse)
        s = get_tens(fn, "lse", lse, 3, (int64_t[]){B, Hq, L}, CT_DTYPE_F32, CT_DTYPE_F32, &p.lse);
    if (s == CT_OK) s = alloc_ws(&p);
    if (s == CT_OK) run_pass(&p, fwd_unit, B * Hq * p.nqb);
    plan_free(&p);
    return s;
}

ct_status at_backward(const char *fn, const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                      const ct_tensor *out, const ct_tensor *lse, const ct_tensor *dout,
                      const ct_block_mask *bm, const ct_flex_options *opt, ct_tensor *dq,
                      ct_tensor *dk, ct_tensor *dv)
{
    ct_flex_options o = opt ? *opt : ct_flex_options_default();
    plan p;
    ct_status s = plan_init(&p, fn, q, k, v, bm, &o);
    int64_t B = p.B, Hq = p.Hq, L = p.L, S = p.S;
    ct_dtype dt = q ? q->dtype : CT_DTYPE_F32;
    if (s == CT_OK)
        s = get_tens(fn, "out", out, 4, (int64_t[]){B, Hq, L, p.Ev}, dt, CT_DTYPE_F32, &p.o);
    if (s == CT_OK)
        s = get_tens(fn, "lse", lse, 3, (int64_t[]){B, Hq, L}, CT_DTYPE_F32, CT_DTYPE_F32, &p.lse);
    if (s == CT_OK)
        s = get_tens(fn, "dout", dout, 4, (int64_t[]){B, Hq, L, p.Ev}, dt, CT_DTYPE_F32, &p.dout);
    if (s == CT_OK && dq)
        s = get_tens(fn, "dq", dq, 4, (int64_t[]){B, Hq, L, p.E}, dt, CT_DTYPE_F32, &p.dq);
    if (s == CT_OK && dk)
        s = get_tens(fn, "dk", dk, 4, (int64_t[]){B, p.Hkv, S, p.E}, dt, CT_DTYPE_F32, &p.dk);
    if (s == CT_OK && dv)
        s = get_tens(fn, "dv", dv, 4, (int64_t[]){B, p.Hkv, S, p.Ev}, dt, CT_DTYPE_F32, &p.dv);
    bool want_pg = s == CT_OK && p.mod_grad && p.sm->param_grad && p.sm->param_len > 0;
    int64_t nitems = B * Hq * p.nqb;
    if (s == CT_OK && B * Hq * L > 0) {
        s = ct_alloc((void **)&p.D, (size_t)(B * Hq * L) * sizeof(float));
        if (s == CT_OK) ct_parallel_for(B * Hq * L, d_rows, &p);
    }
    if (s == CT_OK) s = alloc_ws(&p);
    if (s == CT_OK && (dk || dv)) run_pass(&p, dkv_unit, B * p.Hkv * p.nkb);
    if (s == CT_OK && want_pg && nitems > 0) {
        /* fixed groups of consecutive dQ items, each with its own partial sums */
        size_t len = (size_t)p.sm->param_len,
               budget = o.grad_scratch_bytes ? o.grad_scratch_bytes : CT_DEFAULT_SCRATCH_BYTES;
        int64_t ngroups = (int64_t)(budget / (len * sizeof(float)));
        if (ngroups < 1) ngroups = 1;
        if (ngroups > nitems) ngroups = nitems;
        p.group = (nitems + ngroups - 1) / ngroups;
        int64_t nunits = (nitems + p.group - 1) / p.group;
        size_t bytes;
        if (!ct_mul_size((size_t)nunits * len, sizeof(float), &bytes))
            s = ct_error(CT_EOVERFLOW, "%s: parameter gradient partials overflow", fn);
        if (s == CT_OK) s = ct_calloc((void **)&p.pg, bytes);
        if (s == CT_OK) {
            run_pass(&p, dq_unit, nunits);
            ct_parallel_for((int64_t)len, reduce_pg, &p);
        }
    } else if (s == CT_OK && dq) {
        run_pass(&p, dq_unit, nitems);
    }
    plan_free(&p);
    return s;
}

ct_status ct_flex_attention_forward(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                                    const ct_block_mask *mask, const ct_flex_options *opt,
                                    ct_tensor *out, ct_tensor *lse)
{
    return at_forward("ct_flex_attention_forward", q, k, v, mask, opt, out, lse);
}

ct_status ct_flex_attention_backward(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                                     const ct_tensor *out, const ct_tensor *lse,
                                     const ct_tensor *dout, const ct_block_mask *mask,
                                     const ct_flex_options *opt, ct_tensor *dq, ct_tensor *dk,
                                     ct_tensor *dv)
{
    return at_backward("ct_flex_attention_backward", q, k, v, out, lse, dout, mask, opt, dq, dk,
                       dv);
}
