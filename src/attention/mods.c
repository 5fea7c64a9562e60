/* The library of mask and score mods. Each built-in mask fills tiles with runs (memset along
 * the query axis when it is contiguous, which is how the attention kernels ask) and
 * classifies blocks from its structure in O(1). */
#include "core/internal.h"
#include "attention/attn.h"
#include "attention/attn_kernels.h"
#include "attention/mods_info.h"
#include "ctorch/attention.h"

#include <math.h>
#include <string.h>

static ct_status new_ctx(void **ctx, size_t bytes, const char *fn)
{
    ct_status s = ct_calloc(ctx, bytes);
    if (s != CT_OK) return ct_error(s, "%s: cannot allocate the mod's context", fn);
    return CT_OK;
}

static void free_ctx(void *ctx)
{
    ct_free(ctx);
}

/* Write `v` at keep(i, j) for i in [i0, i1) of key column j. */
static inline void fill_run(const ct_attn_tile *t, uint8_t *keep, int64_t j, int64_t i0, int64_t i1,
                            uint8_t v)
{
    if (i0 < 0) i0 = 0;
    if (i1 > t->nq) i1 = t->nq;
    if (i0 >= i1) return;
    uint8_t *p = keep + j * t->kv_stride;
    if (t->q_stride == 1) {
        memset(p + i0, v, (size_t)(i1 - i0));
        return;
    }
    for (int64_t i = i0; i < i1; i++)
        p[i * t->q_stride] = v;
}

/* ---- band masks: lo <= q - kv <= hi (causal, sliding windows) ----------------------------- */

typedef struct band {
    int64_t lo, hi; /* bounds on q - kv; INT64_MIN / INT64_MAX for none */
    int64_t prefix; /* prefix-LM: keys below it are always kept; 0 for plain bands */
} band;

#define BAND_NONE_LO AT_BAND_NONE_LO
#define BAND_NONE_HI AT_BAND_NONE_HI

static void band_tile(void *ctx, const ct_attn_tile *t, uint8_t *keep)
{
    const band *c = ctx;
    for (int64_t j = 0; j < t->nkv; j++) {
        int64_t kv = t->kv0 + j;
        if (kv < c->prefix) {
            fill_run(t, keep, j, 0, t->nq, 1);
            continue;
        }
        /* kept queries: kv + lo <= q <= kv + hi, as tile rows i = q - q0 */
        int64_t a = c->lo <= BAND_NONE_LO ? 0 : kv + c->lo - t->q0;
        int64_t e = c->hi >= BAND_NONE_HI ? t->nq : kv + c->hi - t->q0 + 1;
        if (a < 0) a = 0;
        if (e > t->nq) e = t->nq;
        if (a >= e) {
            fill_run(t, keep, j, 0, t->nq, 0);
            continue;
        }
        fill_run(t, keep, j, 0, a, 0);
        fill_run(t, keep, j, a, e, 1);
        fill_run(t, keep, j, e, t->nq, 0);
    }
}

static ct_block_kind band_block(void *ctx, int64_t b, int64_t h, int64_t q0, int64_t nq,
                                int64_t kv0, int64_t nkv)
{
    const band *c = ctx;
    int64_t kv1 = kv0 + nkv; /* exclusive */
    if (kv1 <= c->prefix) return CT_BLOCK_FULL;
    int64_t kb = kv0 > c->prefix ? kv0 : c->prefix; /* first key the band decides */
    int64_t dmin = q0 - (kv1 - 1), dmax = q0 + nq - 1 - kb;
    bool band_full = c->lo <= dmin && dmax <= c->hi;
    bool band_empty = dmax < c->lo || dmin > c->hi;
    if (kv0 < c->prefix) return band_full ? CT_BLOCK_FULL : CT_BLOCK_PARTIAL;
    return band_full ? CT_BLOCK_FULL : band_empty ? CT_BLOCK_EMPTY : CT_BLOCK_PARTIAL;
}

static ct_status make_band(int64_t lo, int64_t hi, int64_t prefix, ct_mask_mod *out, const char *fn)
{
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    memset(out, 0, sizeof *out);
    band *c;
    CT_TRY(new_ctx((void **)&c, sizeof *c, fn));
    c->lo = lo;
    c->hi = hi;
    c->prefix = prefix;
    *out = (ct_mask_mod){band_tile, band_block, c, free_ctx, false, false};
    return CT_OK;
}

ct_status ct_mask_mod_causal(ct_mask_mod *out)
{
    return make_band(0, BAND_NONE_HI, 0, out, "ct_mask_mod_causal");
}

ct_status ct_mask_mod_sliding_window(int64_t window, bool causal, ct_mask_mod *out)
{
    if (window < 0 || window >= BAND_NONE_HI)
        return ct_error(CT_EINVAL, "ct_mask_mod_sliding_window: window must be >= 0, got %lld",
                        (long long)window);
    return make_band(causal ? 0 : -window, window, 0, out, "ct_mask_mod_sliding_window");
}

ct_status ct_mask_mod_prefix_lm(int64_t prefix_len, ct_mask_mod *out)
{
    if (prefix_len < 0 || prefix_len >= BAND_NONE_HI)
        return ct_error(CT_EINVAL, "ct_mask_mod_prefix_lm: prefix_len must be >= 0, got %lld",
                        (long long)prefix_len);
    return make_band(0, BAND_NONE_HI, prefix_len, out, "ct_mask_mod_prefix_lm");
}

/* ---- noop ------------------------------------------------------------------------------ */

static void noop_tile(void *ctx, const ct_attn_tile *t, uint8_t *keep)
{
    for (int64_t j = 0; j < t->nkv; j++)
        fill_run(t, keep, j, 0, t->nq, 1);
}

static ct_block_kind noop_block(void *ctx, int64_t b, int64_t h, int64_t q0, int64_t nq,
                                int64_t kv0, int64_t nkv)
{
    return CT_BLOCK_FULL;
}

ct_status ct_mask_mod_noop(ct_mask_mod *out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_mask_mod_noop: out must not be NULL");
    *out = (ct_mask_mod){noop_tile, noop_block, NULL, NULL, false, false};
    return CT_OK;
}

/* ---- documents ------------------------------------------------------------------------- */

typedef struct doc {
    int64_t batch, q_len, kv_len;
    bool sorted; /* every row of ids is non-decreasing */
    int32_t *q;  /* [batch, q_len] */
    int32_t *kv; /* [batch, kv_len] (points into q's allocation) */
} doc;

static void doc_tile(void *ctx, const ct_attn_tile *t, uint8_t *keep)
{
    const doc *c = ctx;
    int64_t r = c->batch == 1 ? 0 : t->b;
    const int32_t *qd = c->q + r * c->q_len + t->q0, *kd = c->kv + r * c->kv_len + t->kv0;
    if (c->sorted) { /* a key's document is a run of queries: two cursors and memsets */
        int64_t a = 0, e = 0;
        for (int64_t j = 0; j < t->nkv; j++) {
            int32_t d = kd[j]; /* non-decreasing in j, so the run only moves forward */
            while (a < t->nq && qd[a] < d)
                a++;
            if (e < a) e = a;
            while (e < t->nq && qd[e] == d)
                e++;
            fill_run(t, keep, j, 0, a, 0);
            fill_run(t, keep, j, a, e, 1);
            fill_run(t, keep, j, e, t->nq, 0);
        }
        return;
    }
    for (int64_t j = 0; j < t->nkv; j++) {
        int32_t d = kd[j];
        uint8_t *p = keep + j * t->kv_stride;
        if (t->q_stride == 1) {
            for (int64_t i = 0; i < t->nq; i++)
                p[i] = qd[i] == d;
        } else {
            for (int64_t i = 0; i < t->nq; i++)
                p[i * t->q_stride] = qd[i] == d;
        }
    }
}

static ct_block_kind doc_block(void *ctx, int64_t b, int64_t h, int64_t q0, int64_t nq, int64_t kv0,
                               int64_t nkv)
{
    const doc *c = ctx;
    if (!c->sorted) return CT_BLOCK_UNKNOWN;
    int64_t r = c->batch == 1 ? 0 : b;
    const int32_t *qd = c->q + r * c->q_len, *kd = c->kv + r * c->kv_len;
    int32_t qa = qd[q0], qz = qd[q0 + nq - 1], ka = kd[kv0], kz = kd[kv0 + nkv - 1];
    if (qz < ka || kz < qa) return CT_BLOCK_EMPTY;
    if (qa == qz && ka == kz && qa == ka) return CT_BLOCK_FULL;
    return CT_BLOCK_PARTIAL;
}

static bool nondecreasing(const int32_t *x, int64_t n)
{
    for (int64_t i = 1; i < n; i++)
        if (x[i] < x[i - 1]) return false;
    return true;
}

ct_status ct_mask_mod_document(const int32_t *q_doc, const int32_t *kv_doc, int64_t batch,
                               int64_t q_len, int64_t kv_len, ct_mask_mod *out)
{
    const char *fn = "ct_mask_mod_document";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    memset(out, 0, sizeof *out);
    if (!q_doc) return ct_error(CT_EINVAL, "%s: q_doc must not be NULL", fn);
    if (batch < 1 || q_len < 1 || kv_len < 1)
        return ct_error(CT_EINVAL,
                        "%s: batch, q_len and kv_len must be >= 1 (got %lld, %lld, %lld)", fn,
                        (long long)batch, (long long)q_len, (long long)kv_len);
    if (!kv_doc && kv_len != q_len)
        return ct_error(CT_EINVAL, "%s: kv_doc is NULL (shared ids) but kv_len %lld != q_len %lld",
                        fn, (long long)kv_len, (long long)q_len);
    size_t nq, nk, bytes;
    if (!ct_mul_size((size_t)batch, (size_t)q_len, &nq) ||
        !ct_mul_size((size_t)batch, (size_t)kv_len, &nk) ||
        !ct_mul_size(nq + nk, sizeof(int32_t), &bytes) || !ct_add_size(bytes, sizeof(doc), &bytes))
        return ct_error(CT_EOVERFLOW, "%s: ids size overflows", fn);
    doc *c;
    CT_TRY(new_ctx((void **)&c, bytes, fn));
    c->batch = batch;
    c->q_len = q_len;
    c->kv_len = kv_len;
    c->q = (int32_t *)(c + 1);
    c->kv = c->q + nq;
    memcpy(c->q, q_doc, nq * sizeof(int32_t));
    memcpy(c->kv, kv_doc ? kv_doc : q_doc, nk * sizeof(int32_t));
    c->sorted = true;
    for (int64_t r = 0; r < batch; r++)
        c->sorted = c->sorted && nondecreasing(c->q + r * q_len, q_len) &&
                    nondecreasing(c->kv + r * kv_len, kv_len);
    *out = (ct_mask_mod){doc_tile, doc_block, c, free_ctx, batch > 1, false};
    return CT_OK;
}

/* ---- combinators ----------------------------------------------------------------------- */

enum { COMB_AND, COMB_OR, COMB_NOT };

typedef struct comb {
    int op, n;
    ct_mask_mod kids[];
} comb;

#define SUB 64 /* combinators evaluate children on sub-tiles of SUB x SUB */

/* A child's kind over a tile (PARTIAL when it has no classifier or does not know). */
static ct_block_kind kid_kind(const ct_mask_mod *m, const ct_attn_tile *t)
{
    ct_block_kind k = m->block ? m->block(m->ctx, t->b, t->h, t->q0, t->nq, t->kv0, t->nkv)
                               : CT_BLOCK_PARTIAL;
    return k == CT_BLOCK_EMPTY || k == CT_BLOCK_FULL ? k : CT_BLOCK_PARTIAL;
}

static void fill_tile(const ct_attn_tile *t, uint8_t *keep, uint8_t v)
{
    for (int64_t j = 0; j < t->nkv; j++)
        fill_run(t, keep, j, 0, t->nq, v);
}

/* AND / OR: children whose classifier settles a (sub-)tile are not evaluated there (EMPTY and
 * FULL are exact by contract): the result is the same bytes, without the per-element work. */
static void comb_tile(void *ctx, const ct_attn_tile *t, uint8_t *keep)
{
    const comb *c = ctx;
    if (c->op == COMB_NOT) {
        c->kids[0].tile(c->kids[0].ctx, t, keep);
        for (int64_t j = 0; j < t->nkv; j++)
            for (int64_t i = 0; i < t->nq; i++) {
                uint8_t *p = keep + i * t->q_stride + j * t->kv_stride;
                *p = !*p;
            }
        return;
    }
    bool is_and = c->op == COMB_AND;
    /* the absorbing kind (EMPTY for AND, FULL for OR) settles the tile; the neutral one drops
     * the child */
    ct_block_kind absorb = is_and ? CT_BLOCK_EMPTY : CT_BLOCK_FULL;
    ct_block_kind neutral = is_and ? CT_BLOCK_FULL : CT_BLOCK_EMPTY;
    int first = -1;
    for (int k = 0; k < c->n; k++) {
        ct_block_kind kk = kid_kind(&c->kids[k], t);
        if (kk == absorb) {
            fill_tile(t, keep, is_and ? 0 : 1);
            return;
        }
        if (kk != neutral && first < 0) first = k;
    }
    if (first < 0) { /* every child neutral */
        fill_tile(t, keep, is_and ? 1 : 0);
        return;
    }
    c->kids[first].tile(c->kids[first].ctx, t, keep);
    uint8_t tmp[SUB * SUB];
    for (int k = first + 1; k < c->n; k++) {
        const ct_mask_mod *kid = &c->kids[k];
        for (int64_t i0 = 0; i0 < t->nq; i0 += SUB)
            for (int64_t j0 = 0; j0 < t->nkv; j0 += SUB) {
                ct_attn_tile s = *t;
                s.q0 = t->q0 + i0;
                s.nq = t->nq - i0 < SUB ? t->nq - i0 : SUB;
                s.kv0 = t->kv0 + j0;
                s.nkv = t->nkv - j0 < SUB ? t->nkv - j0 : SUB;
                ct_block_kind kk = kid_kind(kid, &s);
                if (kk == neutral) continue;
                if (kk == absorb) { /* the sub-tile is settled: write it in place */
                    ct_attn_tile d = s;
                    d.q_stride = t->q_stride;
                    d.kv_stride = t->kv_stride;
                    fill_tile(&d, keep + i0 * t->q_stride + j0 * t->kv_stride, is_and ? 0 : 1);
                    continue;
                }
                s.q_stride = 1;
                s.kv_stride = SUB;
                kid->tile(kid->ctx, &s, tmp);
                for (int64_t j = 0; j < s.nkv; j++) {
                    uint8_t *p = keep + i0 * t->q_stride + (j0 + j) * t->kv_stride;
                    const uint8_t *v = tmp + j * SUB;
                    if (t->q_stride == 1) {
                        if (is_and)
                            for (int64_t i = 0; i < s.nq; i++)
                                p[i] = (uint8_t)((p[i] != 0) & (v[i] != 0));
                        else
                            for (int64_t i = 0; i < s.nq; i++)
                                p[i] = (uint8_t)((p[i] != 0) | (v[i] != 0));
                    } else {
                        for (int64_t i = 0; i < s.nq; i++) {
                            uint8_t *q = p + i * t->q_stride;
                            *q = is_and ? (uint8_t)((*q != 0) & (v[i] != 0))
                                        : (uint8_t)((*q != 0) | (v[i] != 0));
                        }
                    }
                }
            }
    }
}

static ct_block_kind comb_block(void *ctx, int64_t b, int64_t h, int64_t q0, int64_t nq,
                                int64_t kv0, int64_t nkv)
{
    const comb *c = ctx;
    int nfull = 0, nempty = 0, nunknown = 0;
    for (int k = 0; k < c->n; k++) {
        ct_block_kind kk = c->kids[k].block
                               ? c->kids[k].block(c->kids[k].ctx, b, h, q0, nq, kv0, nkv)
                               : CT_BLOCK_UNKNOWN;
        nfull += kk == CT_BLOCK_FULL;
        nempty += kk == CT_BLOCK_EMPTY;
        nunknown += kk == CT_BLOCK_UNKNOWN;
    }
    switch (c->op) {
    case COMB_NOT:
        return nfull      ? CT_BLOCK_EMPTY
               : nempty   ? CT_BLOCK_FULL
               : nunknown ? CT_BLOCK_UNKNOWN
                          : CT_BLOCK_PARTIAL;
    case COMB_AND:
        if (nempty) return CT_BLOCK_EMPTY;
        if (nfull == c->n) return CT_BLOCK_FULL;
        break;
    default:
        if (nfull) return CT_BLOCK_FULL;
        if (nempty == c->n) return CT_BLOCK_EMPTY;
        break;
    }
    return nunknown ? CT_BLOCK_UNKNOWN : CT_BLOCK_PARTIAL;
}

static ct_status make_comb(int op, const ct_mask_mod *mods, int n, ct_mask_mod *out, const char *fn)
{
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    memset(out, 0, sizeof *out);
    if (!mods || n < 1) return ct_error(CT_EINVAL, "%s: needs n >= 1 mods, got %d", fn, n);
    for (int k = 0; k < n; k++)
        if (!mods[k].tile) return ct_error(CT_EINVAL, "%s: mods[%d].tile must not be NULL", fn, k);
    comb *c;
    CT_TRY(new_ctx((void **)&c, sizeof *c + (size_t)n * sizeof(ct_mask_mod), fn));
    c->op = op;
    c->n = n;
    bool ub = false, uh = false;
    for (int k = 0; k < n; k++) {
        c->kids[k] = mods[k];
        ub = ub || mods[k].uses_b;
        uh = uh || mods[k].uses_h;
    }
    *out = (ct_mask_mod){comb_tile, comb_block, c, free_ctx, ub, uh};
    return CT_OK;
}

ct_status ct_mask_mod_and(const ct_mask_mod *mods, int n, ct_mask_mod *out)
{
    return make_comb(COMB_AND, mods, n, out, "ct_mask_mod_and");
}

ct_status ct_mask_mod_or(const ct_mask_mod *mods, int n, ct_mask_mod *out)
{
    return make_comb(COMB_OR, mods, n, out, "ct_mask_mod_or");
}

ct_status ct_mask_mod_not(const ct_mask_mod *m, ct_mask_mod *out)
{
    return make_comb(COMB_NOT, m, m ? 1 : 0, out, "ct_mask_mod_not");
}

/* A document mask reads ids[b][q] and ids[b][kv]: the ids must cover the block mask's
 * batches (or be shared: batch 1) and lengths. */
static ct_status doc_check(const doc *c, int64_t B, int64_t L, int64_t S)
{
    if (c->batch != 1 && c->batch < B)
        return ct_error(CT_EINVAL,
                        "ct_block_mask_create: the document mask has ids for %lld batches, "
                        "fewer than B = %lld (give one row per batch, or one shared row)",
                        (long long)c->batch, (long long)B);
    if (c->q_len < L || c->kv_len < S)
        return ct_error(CT_EINVAL,
                        "ct_block_mask_create: the document mask has ids for %lld queries and "
                        "%lld keys, fewer than Q_LEN = %lld / KV_LEN = %lld",
                        (long long)c->q_len, (long long)c->kv_len, (long long)L, (long long)S);
    return CT_OK;
}

ct_status at_mask_check(const ct_mask_mod *m, int64_t B, int64_t H, int64_t L, int64_t S)
{
    if (m->tile == doc_tile) return doc_check(m->ctx, B, L, S);
    if (m->tile == comb_tile) {
        const comb *c = m->ctx;
        for (int k = 0; k < c->n; k++)
            CT_TRY(at_mask_check(&c->kids[k], B, H, L, S));
        return CT_OK;
    }
    return jit_mask_check(m, B, H, L, S);
}

ct_status at_score_check(const ct_score_mod *m, int64_t B, int64_t H, int64_t L, int64_t S)
{
    return jit_score_check(m, B, H, L, S);
}

void ct_mask_mod_free(ct_mask_mod *m)
{
    if (!m) return;
    if (m->destroy) m->destroy(m->ctx);
    memset(m, 0, sizeof *m);
}

/* ---- score mods ------------------------------------------------------------------------ */

typedef struct softcap {
    float cap;
} softcap;

static void softcap_fwd(void *ctx, const ct_attn_tile *t, float *s)
{
    float cap = ((const softcap *)ctx)->cap;
    for (int64_t j = 0; j < t->nkv; j++) {
        float *p = s + j * t->kv_stride;
        if (t->q_stride == 1) {
            at_softcap_fwd(p, t->nq, cap);
        } else {
            for (int64_t i = 0; i < t->nq; i++)
                at_softcap_fwd(p + i * t->q_stride, 1, cap);
        }
    }
}

static void softcap_grad(void *ctx, const ct_attn_tile *t, const float *s, float *g, float *dparam)
{
    float cap = ((const softcap *)ctx)->cap;
    for (int64_t j = 0; j < t->nkv; j++) {
        const float *ps = s + j * t->kv_stride;
        float *pg = g + j * t->kv_stride;
        if (t->q_stride == 1) {
            at_softcap_bwd(ps, pg, t->nq, cap);
        } else {
            for (int64_t i = 0; i < t->nq; i++)
                at_softcap_bwd(ps + i * t->q_stride, pg + i * t->q_stride, 1, cap);
        }
    }
}

ct_status ct_score_mod_softcap(float cap, ct_score_mod *out)
{
    const char *fn = "ct_score_mod_softcap";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    memset(out, 0, sizeof *out);
    if (!(cap > 0.0f) || isinf(cap))
        return ct_error(CT_EINVAL, "%s: cap must be finite and > 0, got %g", fn, (double)cap);
    softcap *c;
    CT_TRY(new_ctx((void **)&c, sizeof *c, fn));
    c->cap = cap;
    *out = (ct_score_mod){softcap_fwd, softcap_grad, c, free_ctx, NULL, 0};
    return CT_OK;
}

typedef struct alibi {
    int64_t heads;
    float slope[];
} alibi;

static void alibi_fwd(void *ctx, const ct_attn_tile *t, float *s)
{
    const alibi *c = ctx;
    float m = c->slope[t->h % c->heads];
    for (int64_t j = 0; j < t->nkv; j++) {
        float *p = s + j * t->kv_stride;
        int64_t d = t->kv0 + j - t->q0;
        for (int64_t i = 0; i < t->nq; i++)
            p[i * t->q_stride] += m * (float)(d - i);
    }
}

ct_status ct_score_mod_alibi(int64_t num_heads, const float *slopes, ct_score_mod *out)
{
    const char *fn = "ct_score_mod_alibi";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    memset(out, 0, sizeof *out);
    if (num_heads < 1 || num_heads > (1 << 20))
        return ct_error(CT_EINVAL, "%s: num_heads must be in [1, 2^20], got %lld", fn,
                        (long long)num_heads);
    alibi *c;
    CT_TRY(new_ctx((void **)&c, sizeof *c + (size_t)num_heads * sizeof(float), fn));
    c->heads = num_heads;
    for (int64_t h = 0; h < num_heads; h++)
        c->slope[h] = slopes ? slopes[h] : (float)exp2(-8.0 * (double)(h + 1) / (double)num_heads);
    *out = (ct_score_mod){alibi_fwd, NULL, c, free_ctx, NULL, 0};
    return CT_OK;
}

typedef struct relbias {
    const float *table;
    int64_t heads, len, offset;
} relbias;

static inline int64_t rel_index(const relbias *c, int64_t q, int64_t kv)
{
    int64_t d = q - kv + c->offset;
    return d < 0 ? 0 : d >= c->len ? c->len - 1 : d;
}

static void relbias_fwd(void *ctx, const ct_attn_tile *t, float *s)
{
    const relbias *c = ctx;
    const float *row = c->table + (c->heads ? (t->h % c->heads) * c->len : 0);
    for (int64_t j = 0; j < t->nkv; j++) {
        float *p = s + j * t->kv_stride;
        int64_t kv = t->kv0 + j;
        for (int64_t i = 0; i < t->nq; i++)
            p[i * t->q_stride] += row[rel_index(c, t->q0 + i, kv)];
    }
}

static void relbias_grad(void *ctx, const ct_attn_tile *t, const float *s, float *g, float *dparam)
{
    const relbias *c = ctx;
    if (!dparam) return; /* the derivative is 1 */
    float *row = dparam + (c->heads ? (t->h % c->heads) * c->len : 0);
    for (int64_t j = 0; j < t->nkv; j++) {
        const float *p = g + j * t->kv_stride;
        int64_t kv = t->kv0 + j;
        for (int64_t i = 0; i < t->nq; i++)
            row[rel_index(c, t->q0 + i, kv)] += p[i * t->q_stride];
    }
}

ct_status ct_score_mod_relative_bias(const float *table, int64_t num_heads, int64_t table_len,
                                     int64_t offset, float *dtable, ct_score_mod *out)
{
    const char *fn = "ct_score_mod_relative_bias";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    memset(out, 0, sizeof *out);
    if (!table) return ct_error(CT_EINVAL, "%s: table must not be NULL", fn);
    if (num_heads < 0 || table_len < 1 || num_heads > (1 << 20) || table_len > ((int64_t)1 << 40))
        return ct_error(CT_EINVAL, "%s: need num_heads >= 0 and table_len >= 1 (got %lld, %lld)",
                        fn, (long long)num_heads, (long long)table_len);
    relbias *c;
    CT_TRY(new_ctx((void **)&c, sizeof *c, fn));
    *c = (relbias){table, num_heads, table_len, offset};
    int64_t n = (num_heads ? num_heads : 1) * table_len;
    *out = (ct_score_mod){relbias_fwd, relbias_grad, c, free_ctx, dtable, dtable ? n : 0};
    return CT_OK;
}

void ct_score_mod_free(ct_score_mod *m)
{
    if (!m) return;
    if (m->destroy) m->destroy(m->ctx);
    memset(m, 0, sizeof *m);
}

/* ---- introspection (mods_info.h): which built-in a mod is, from its callbacks ----------- */

void at_mask_describe(const ct_mask_mod *m, at_mask_info *out)
{
    memset(out, 0, sizeof *out);
    if (!m) return;
    if (m->tile == band_tile && m->ctx) {
        const band *c = m->ctx;
        out->kind = AT_MOD_BAND;
        out->lo = c->lo, out->hi = c->hi, out->prefix = c->prefix;
    } else if (m->tile == noop_tile) {
        out->kind = AT_MOD_NOOP;
    } else if (m->tile == doc_tile && m->ctx) {
        const doc *c = m->ctx;
        out->kind = AT_MOD_DOCUMENT;
        out->q_doc = c->q, out->kv_doc = c->kv;
        out->doc_batch = c->batch, out->doc_q_len = c->q_len, out->doc_kv_len = c->kv_len;
    } else if (m->tile == comb_tile && m->ctx) {
        const comb *c = m->ctx;
        out->kind = c->op == COMB_AND ? AT_MOD_AND : c->op == COMB_OR ? AT_MOD_OR : AT_MOD_NOT;
        out->kids = c->kids, out->n = c->n;
    }
}

void at_score_describe(const ct_score_mod *m, at_score_info *out)
{
    memset(out, 0, sizeof *out);
    if (!m || !m->ctx) return;
    if (m->fwd == softcap_fwd) {
        out->kind = AT_MOD_SOFTCAP;
        out->cap = ((const softcap *)m->ctx)->cap;
    } else if (m->fwd == alibi_fwd) {
        const alibi *c = m->ctx;
        out->kind = AT_MOD_ALIBI;
        out->heads = c->heads, out->slopes = c->slope;
    } else if (m->fwd == relbias_fwd) {
        out->kind = AT_MOD_RELBIAS;
    }
}
