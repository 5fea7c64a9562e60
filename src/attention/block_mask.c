/* Block masks. Each block of the (B, H) grids gets a kind: from the mask's O(1) classifier
 * when it has one, else by evaluating the block's tile (rows of blocks in parallel, one
 * block_size^2 byte tile per thread, never the L x S mask). The kinds (one byte per block)
 * become four CSR lists: partial and full key blocks per query block, and their transposes. */
#include "core/internal.h"
#include "attention/attn.h"
#include "ctorch/attention.h"

#include <string.h>

typedef struct build {
    const ct_mask_mod *m;
    int64_t He, q_len, kv_len, bs, nqb, nkb;
    uint8_t *kinds;   /* [rows][nkb] */
    uint8_t *scratch; /* [threads][bs * bs] */
    const ct_block_mask *bm;
} build;

static inline int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static void row_coords(const build *c, int64_t r, int64_t *b, int64_t *h, int64_t *qb)
{
    int64_t bh = r / c->nqb;
    *qb = r % c->nqb;
    *b = bh / c->He;
    *h = bh % c->He;
}

static ct_block_kind classify(const build *c, uint8_t *keep, int64_t b, int64_t h, int64_t qb,
                              int64_t kb)
{
    int64_t q0 = qb * c->bs, kv0 = kb * c->bs;
    int64_t nq = min64(c->bs, c->q_len - q0), nkv = min64(c->bs, c->kv_len - kv0);
    ct_block_kind k =
        c->m->block ? c->m->block(c->m->ctx, b, h, q0, nq, kv0, nkv) : CT_BLOCK_UNKNOWN;
    if (k == CT_BLOCK_EMPTY || k == CT_BLOCK_FULL || k == CT_BLOCK_PARTIAL) return k;
    if (k != CT_BLOCK_UNKNOWN) return CT_BLOCK_PARTIAL; /* a bad answer is treated as safe */
    ct_attn_tile t = {b, h, q0, nq, kv0, nkv, 1, c->bs};
    c->m->tile(c->m->ctx, &t, keep);
    int64_t ones = 0;
    for (int64_t j = 0; j < nkv; j++)
        for (int64_t i = 0; i < nq; i++)
            ones += keep[j * c->bs + i] != 0;
    return ones == 0 ? CT_BLOCK_EMPTY : ones == nq * nkv ? CT_BLOCK_FULL : CT_BLOCK_PARTIAL;
}

static void classify_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    build *c = arg;
    uint8_t *keep = c->scratch + (size_t)tid * (size_t)(c->bs * c->bs);
    for (int64_t r = r0; r < r1; r++) {
        int64_t b, h, qb;
        row_coords(c, r, &b, &h, &qb);
        for (int64_t kb = 0; kb < c->nkb; kb++)
            c->kinds[r * c->nkb + kb] = (uint8_t)classify(c, keep, b, h, qb, kb);
    }
}

/* Evaluate every partial block into its slot of bm->tiles (key-major, width bs). */
static void store_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    build *c = arg;
    const ct_block_mask *bm = c->bm;
    size_t area = (size_t)(c->bs * c->bs);
    for (int64_t r = r0; r < r1; r++) {
        int64_t b, h, qb;
        row_coords(c, r, &b, &h, &qb);
        for (int64_t e = bm->kv_ptr[r]; e < bm->kv_ptr[r + 1]; e++) {
            int64_t q0 = qb * c->bs, kv0 = (int64_t)bm->kv_idx[e] * c->bs;
            ct_attn_tile t = {
                b, h,    q0, min64(c->bs, c->q_len - q0), kv0, min64(c->bs, c->kv_len - kv0),
                1, c->bs};
            c->m->tile(c->m->ctx, &t, bm->tiles + (size_t)e * area);
        }
    }
}

ct_block_mask_options ct_block_mask_options_default(void)
{
    return (ct_block_mask_options){.block_size = 128, .store_partial = false};
}

void ct_block_mask_free(ct_block_mask *m)
{
    if (!m) return;
    ct_free(m->tiles);
    ct_free(m->kv_ptr); /* the lists live in one allocation that starts with kv_ptr */
    ct_free(m);
}

static size_t align8(size_t x)
{
    return (x + 7) & ~(size_t)7;
}

/* Carve the list arrays out of one allocation. */
static ct_status alloc_lists(ct_block_mask *bm, int64_t rows, int64_t cols, int64_t npart,
                             int64_t nfull, bool store)
{
    size_t ptrs = ((size_t)rows + 1) * 2 * 8 + ((size_t)cols + 1) * 2 * 8;
    size_t idx = align8((size_t)npart * 4) * 2 + align8((size_t)nfull * 4) * 2;
    size_t tq = store ? (size_t)npart * 8 : 0;
    size_t bytes = ptrs + idx + tq;
    char *p;
    CT_TRY(ct_calloc((void **)&p, bytes));
    bm->kv_ptr = (int64_t *)p, p += ((size_t)rows + 1) * 8;
    bm->full_kv_ptr = (int64_t *)p, p += ((size_t)rows + 1) * 8;
    bm->q_ptr = (int64_t *)p, p += ((size_t)cols + 1) * 8;
    bm->full_q_ptr = (int64_t *)p, p += ((size_t)cols + 1) * 8;
    bm->q_tile = store ? (int64_t *)p : NULL, p += tq;
    bm->kv_idx = (int32_t *)p, p += align8((size_t)npart * 4);
    bm->q_idx = (int32_t *)p, p += align8((size_t)npart * 4);
    bm->full_kv_idx = (int32_t *)p, p += align8((size_t)nfull * 4);
    bm->full_q_idx = (int32_t *)p;
    bm->bytes += bytes;
    return CT_OK;
}

/* Turn the kinds into the four lists (rows in order, so every column's query blocks come out
 * ascending). */
static ct_status make_lists(ct_block_mask *bm, const build *c, int64_t rows, bool store)
{
    int64_t nkb = c->nkb, nqb = c->nqb, cols = rows / nqb * nkb;
    int64_t npart = 0, nfull = 0;
    for (size_t i = 0; i < (size_t)rows * (size_t)nkb; i++) {
        npart += c->kinds[i] == CT_BLOCK_PARTIAL;
        nfull += c->kinds[i] == CT_BLOCK_FULL;
    }
    if (npart > INT32_MAX || nfull > INT32_MAX)
        return ct_error(CT_EOVERFLOW, "ct_block_mask_create: more than 2^31 blocks in a list");
    CT_TRY(alloc_lists(bm, rows, cols, npart, nfull, store));
    /* column counts, then starts */
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = r / nqb * nkb;
        const uint8_t *k = c->kinds + r * nkb;
        for (int64_t kb = 0; kb < nkb; kb++) {
            bm->q_ptr[base + kb + 1] += k[kb] == CT_BLOCK_PARTIAL;
            bm->full_q_ptr[base + kb + 1] += k[kb] == CT_BLOCK_FULL;
        }
    }
    for (int64_t col = 0; col < cols; col++) {
        bm->q_ptr[col + 1] += bm->q_ptr[col];
        bm->full_q_ptr[col + 1] += bm->full_q_ptr[col];
    }
    int64_t *qcur, *fcur;
    CT_TRY(ct_alloc((void **)&qcur, (size_t)cols * 2 * sizeof(int64_t)));
    fcur = qcur + cols;
    memcpy(qcur, bm->q_ptr, (size_t)cols * sizeof(int64_t));
    memcpy(fcur, bm->full_q_ptr, (size_t)cols * sizeof(int64_t));
    int64_t pe = 0, fe = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = r / nqb * nkb, qb = r % nqb;
        const uint8_t *k = c->kinds + r * nkb;
        for (int64_t kb = 0; kb < nkb; kb++) {
            if (k[kb] == CT_BLOCK_PARTIAL) {
                int64_t at = qcur[base + kb]++;
                bm->kv_idx[pe] = (int32_t)kb;
                bm->q_idx[at] = (int32_t)qb;
                if (store) bm->q_tile[at] = pe;
                pe++;
            } else if (k[kb] == CT_BLOCK_FULL) {
                bm->full_kv_idx[fe++] = (int32_t)kb;
                bm->full_q_idx[fcur[base + kb]++] = (int32_t)qb;
            }
        }
        bm->kv_ptr[r + 1] = pe;
        bm->full_kv_ptr[r + 1] = fe;
    }
    ct_free(qcur);
    return CT_OK;
}

ct_status ct_block_mask_create_ex(const ct_mask_mod *mask, int64_t B, int64_t H, int64_t q_len,
                                  int64_t kv_len, const ct_block_mask_options *opt,
                                  ct_block_mask **out)
{
    const char *fn = "ct_block_mask_create";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    *out = NULL;
    ct_block_mask_options o = opt ? *opt : ct_block_mask_options_default();
    if (!mask || !mask->tile)
        return ct_error(CT_EINVAL, "%s: mask and mask->tile must not be NULL", fn);
    if (B < 1 || H < 1 || q_len < 1 || kv_len < 1)
        return ct_error(CT_EINVAL,
                        "%s: B, H, Q_LEN and KV_LEN must be >= 1 (got %lld, %lld, %lld, %lld)", fn,
                        (long long)B, (long long)H, (long long)q_len, (long long)kv_len);
    if (o.block_size < 1 || o.block_size > 1024)
        return ct_error(CT_EINVAL, "%s: block_size must be in [1, 1024], got %lld", fn,
                        (long long)o.block_size);
    CT_TRY(at_mask_check(mask, B, H, q_len, kv_len)); /* compiled mods: index ranges */
    int64_t bs = o.block_size;
    int64_t nqb = (q_len + bs - 1) / bs, nkb = (kv_len + bs - 1) / bs;
    int64_t Be = mask->uses_b ? B : 1, He = mask->uses_h ? H : 1;
    size_t rows, cols, nkinds, rc;
    if (nqb > INT32_MAX || nkb > INT32_MAX || !ct_mul_size((size_t)(Be * He), (size_t)nqb, &rows) ||
        !ct_mul_size(rows, (size_t)nkb, &nkinds) ||
        !ct_mul_size((size_t)(Be * He), (size_t)nkb, &cols) || !ct_add_size(rows, cols, &rc) ||
        rc > ((size_t)1 << 40))
        return ct_error(CT_EOVERFLOW, "%s: the block grid %lld x %lld x %lld x %lld is too large",
                        fn, (long long)Be, (long long)He, (long long)nqb, (long long)nkb);
    ct_block_mask *bm;
    CT_TRY(ct_calloc((void **)&bm, sizeof *bm));
    bm->B = Be;
    bm->H = He;
    bm->q_len = q_len;
    bm->kv_len = kv_len;
    bm->block_size = bs;
    bm->num_q_blocks = nqb;
    bm->num_kv_blocks = nkb;
    bm->mask_mod = *mask;
    bm->bytes = sizeof *bm;
    int T = ct_num_threads();
    build c = {mask, He, q_len, kv_len, bs, nqb, nkb, NULL, NULL, bm};
    ct_status s = ct_alloc((void **)&c.kinds, nkinds ? nkinds : 1);
    if (s == CT_OK) s = ct_alloc((void **)&c.scratch, (size_t)T * (size_t)(bs * bs));
    if (s == CT_OK) {
        ct_parallel_for_capped((int64_t)rows, 1, T, classify_rows, &c); /* tid < T: scratch */
        s = make_lists(bm, &c, (int64_t)rows, o.store_partial);
    }
    ct_free(c.scratch);
    ct_free(c.kinds);
    if (s == CT_OK && o.store_partial) {
        int64_t npart = bm->kv_ptr[rows];
        size_t tb;
        if (!ct_mul_size((size_t)npart, (size_t)(bs * bs), &tb))
            s = ct_error(CT_EOVERFLOW, "%s: stored tiles overflow", fn);
        if (s == CT_OK) s = ct_calloc((void **)&bm->tiles, tb ? tb : 1);
        if (s == CT_OK) {
            bm->bytes += tb;
            ct_parallel_for((int64_t)rows, store_rows, &c);
        }
    }
    if (s != CT_OK) {
        ct_block_mask_free(bm);
        return s;
    }
    *out = bm;
    return CT_OK;
}

ct_status ct_block_mask_create(const ct_mask_mod *mask, int64_t B, int64_t H, int64_t q_len,
                               int64_t kv_len, int64_t block_size, ct_block_mask **out)
{
    ct_block_mask_options o = ct_block_mask_options_default();
    o.block_size = block_size;
    return ct_block_mask_create_ex(mask, B, H, q_len, kv_len, &o, out);
}

ct_status ct_block_mask_to_dense(const ct_block_mask *m, uint8_t *out)
{
    if (!m || !out)
        return ct_error(CT_EINVAL, "ct_block_mask_to_dense: m and out must not be NULL");
    int64_t rows = m->B * m->H * m->num_q_blocks, nkb = m->num_kv_blocks;
    memset(out, CT_BLOCK_EMPTY, (size_t)(rows * nkb));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t e = m->kv_ptr[r]; e < m->kv_ptr[r + 1]; e++)
            out[r * nkb + m->kv_idx[e]] = CT_BLOCK_PARTIAL;
        for (int64_t e = m->full_kv_ptr[r]; e < m->full_kv_ptr[r + 1]; e++)
            out[r * nkb + m->full_kv_idx[e]] = CT_BLOCK_FULL;
    }
    return CT_OK;
}
