/* Block masks: kinds against a naive per-block classification of the evaluated mask, the
 * transposed lists, stored tiles, B/H broadcasting, every tile of the built-in masks and
 * combinators against the element-wise definition, the O(blocks) cost at 131072 tokens, and
 * bad arguments of every attention entry point. */
#include "test_util.h"

static int64_t mn(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* Naive kind of every block by evaluating the whole tile, compared with the block mask. */
static void check_structure(const ct_mask_mod *m, int64_t B, int64_t H, int64_t L, int64_t S,
                            int64_t bs, const char *what)
{
    ct_block_mask_options o = ct_block_mask_options_default();
    o.block_size = bs;
    o.store_partial = true;
    ct_block_mask *bm = NULL;
    CHECK_OK(ct_block_mask_create_ex(m, B, H, L, S, &o, &bm));
    if (!bm) return;
    CHECK(bm->B == (m->uses_b ? B : 1) && bm->H == (m->uses_h ? H : 1));
    int64_t nqb = bm->num_q_blocks, nkb = bm->num_kv_blocks;
    CHECK(nqb == (L + bs - 1) / bs && nkb == (S + bs - 1) / bs);
    uint8_t *kinds = malloc((size_t)(bm->B * bm->H * nqb * nkb));
    uint8_t *tile = malloc((size_t)(bs * bs));
    CHECK_OK(ct_block_mask_to_dense(bm, kinds));
    int bad = 0;
    for (int64_t b = 0; b < bm->B; b++)
        for (int64_t h = 0; h < bm->H; h++)
            for (int64_t qb = 0; qb < nqb; qb++)
                for (int64_t kb = 0; kb < nkb; kb++) {
                    int64_t q0 = qb * bs, kv0 = kb * bs, nq = mn(bs, L - q0), nk = mn(bs, S - kv0);
                    ct_attn_tile t = {b, h, q0, nq, kv0, nk, nk, 1}; /* query-major this time */
                    m->tile(m->ctx, &t, tile);
                    int64_t ones = 0;
                    for (int64_t x = 0; x < nq * nk; x++)
                        ones += tile[x] != 0;
                    int want = ones == 0         ? CT_BLOCK_EMPTY
                               : ones == nq * nk ? CT_BLOCK_FULL
                                                 : CT_BLOCK_PARTIAL;
                    int64_t r = (b * bm->H + h) * nqb + qb;
                    int got = kinds[r * nkb + kb];
                    /* a classifier may call a full/empty block partial (safe), never the reverse */
                    if (got != want && !(got == CT_BLOCK_PARTIAL && m->block)) {
                        if (!bad)
                            fprintf(stderr, "  %s: block (%lld,%lld,%lld,%lld) kind %d, want %d\n",
                                    what, (long long)b, (long long)h, (long long)qb, (long long)kb,
                                    got, want);
                        bad++;
                    }
                    if (got == CT_BLOCK_PARTIAL) { /* the stored tile is the evaluated mask */
                        int64_t e = bm->kv_ptr[r];
                        while (e < bm->kv_ptr[r + 1] && bm->kv_idx[e] != kb)
                            e++;
                        const uint8_t *st = bm->tiles + (size_t)e * (size_t)(bs * bs);
                        for (int64_t i = 0; i < nq; i++)
                            for (int64_t j = 0; j < nk; j++)
                                if ((st[j * bs + i] != 0) != (tile[i * nk + j] != 0)) bad++;
                    }
                }
    CHECK(bad == 0);
    /* transposed lists: same blocks, ascending query blocks, tiles mapped */
    int tbad = 0;
    for (int64_t bh = 0; bh < bm->B * bm->H; bh++)
        for (int64_t kb = 0; kb < nkb; kb++) {
            int64_t c = bh * nkb + kb, prev = -1;
            for (int64_t e = bm->q_ptr[c]; e < bm->q_ptr[c + 1]; e++) {
                int64_t qb = bm->q_idx[e];
                tbad += qb <= prev || kinds[(bh * nqb + qb) * nkb + kb] != CT_BLOCK_PARTIAL;
                tbad += bm->kv_idx[bm->q_tile[e]] != kb;
                prev = qb;
            }
            prev = -1;
            for (int64_t e = bm->full_q_ptr[c]; e < bm->full_q_ptr[c + 1]; e++) {
                int64_t qb = bm->full_q_idx[e];
                tbad += qb <= prev || kinds[(bh * nqb + qb) * nkb + kb] != CT_BLOCK_FULL;
                prev = qb;
            }
        }
    int64_t rows = bm->B * bm->H * nqb, cols = bm->B * bm->H * nkb;
    tbad += bm->kv_ptr[rows] != bm->q_ptr[cols] || bm->full_kv_ptr[rows] != bm->full_q_ptr[cols];
    CHECK(tbad == 0);
    free(kinds);
    free(tile);
    ct_block_mask_free(bm);
}

static void user_tile(void *ctx, const ct_attn_tile *t, uint8_t *keep)
{
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t j = 0; j < t->nkv; j++) {
            int64_t q = t->q0 + i, kv = t->kv0 + j;
            keep[i * t->q_stride + j * t->kv_stride] =
                (uint8_t)((q / 9 + kv / 5 + t->b + t->h) % 3 == 0);
        }
}

static void test_structures(void)
{
    ct_mask_mod causal, sw, sw2, pre, noop, doc, docu, docb, both, orm, notm, user, pair[2];
    CHECK_OK(ct_mask_mod_causal(&causal));
    CHECK_OK(ct_mask_mod_sliding_window(10, true, &sw));
    CHECK_OK(ct_mask_mod_sliding_window(5, false, &sw2));
    CHECK_OK(ct_mask_mod_prefix_lm(21, &pre));
    CHECK_OK(ct_mask_mod_noop(&noop));
    int32_t ids[100], idk[60], mixed[100], ids2[200];
    for (int i = 0; i < 100; i++)
        ids[i] = i / 17, mixed[i] = (i * 13) % 4;
    for (int i = 0; i < 60; i++)
        idk[i] = i / 10;
    for (int i = 0; i < 200; i++)
        ids2[i] = (i % 100) / (i < 100 ? 30 : 7);
    CHECK_OK(ct_mask_mod_document(ids, idk, 1, 100, 60, &doc));
    CHECK_OK(ct_mask_mod_document(mixed, NULL, 1, 100, 100, &docu));
    CHECK_OK(ct_mask_mod_document(ids2, NULL, 2, 100, 100, &docb));
    pair[0] = docb, pair[1] = causal;
    CHECK_OK(ct_mask_mod_and(pair, 2, &both));
    pair[0] = sw2, pair[1] = pre;
    CHECK_OK(ct_mask_mod_or(pair, 2, &orm));
    CHECK_OK(ct_mask_mod_not(&sw, &notm));
    user = (ct_mask_mod){user_tile, NULL, NULL, NULL, true, true};
    check_structure(&causal, 2, 3, 100, 100, 16, "causal");
    check_structure(&causal, 1, 1, 70, 130, 32, "causal cross");
    check_structure(&sw, 1, 1, 100, 100, 8, "sliding");
    check_structure(&sw2, 1, 1, 100, 100, 7, "sliding two-sided");
    check_structure(&pre, 1, 1, 100, 100, 8, "prefix");
    check_structure(&noop, 1, 1, 45, 45, 16, "noop");
    check_structure(&doc, 1, 1, 100, 60, 8, "document cross");
    check_structure(&docu, 1, 1, 100, 100, 8, "document unsorted");
    check_structure(&both, 2, 2, 100, 100, 16, "document per batch & causal");
    check_structure(&orm, 1, 1, 100, 100, 16, "or");
    check_structure(&notm, 1, 1, 100, 100, 16, "not");
    check_structure(&user, 2, 2, 77, 91, 16, "user");
    check_structure(&user, 2, 2, 77, 91, 200, "user one block");

    /* exactness where the structure allows: causal diagonal blocks are the only partial ones */
    ct_block_mask *bm;
    CHECK_OK(ct_block_mask_create(&causal, 4, 8, 1024, 1024, 128, &bm));
    CHECK(bm->B == 1 && bm->H == 1);
    CHECK(bm->kv_ptr[8] == 8 && bm->full_kv_ptr[8] == 28);
    ct_block_mask_free(bm);

    ct_mask_mod_free(&causal), ct_mask_mod_free(&sw), ct_mask_mod_free(&sw2);
    ct_mask_mod_free(&pre), ct_mask_mod_free(&noop), ct_mask_mod_free(&doc);
    ct_mask_mod_free(&docu), ct_mask_mod_free(&docb), ct_mask_mod_free(&both);
    ct_mask_mod_free(&orm), ct_mask_mod_free(&notm);
}

/* 131072 tokens, sliding window 256: O(blocks) time, well under 16 MiB. */
static void test_long(void)
{
    ct_mask_mod sw;
    CHECK_OK(ct_mask_mod_sliding_window(256, true, &sw));
    ct_memory_stats_t m0, m1;
    ct_memory_stats(&m0);
    ct_memory_reset_peak();
    ct_block_mask *bm = NULL;
    CHECK_OK(ct_block_mask_create(&sw, 1, 8, 131072, 131072, 128, &bm));
    ct_memory_stats(&m1);
    CHECK(m1.peak_bytes - m0.current_bytes < ((size_t)16 << 20));
    if (bm) {
        CHECK(bm->H == 1 && bm->num_q_blocks == 1024);
        CHECK(bm->kv_ptr[1024] == 1023 + 1023 && bm->full_kv_ptr[1024] == 1023);
        CHECK(bm->bytes < ((size_t)1 << 20));
    }
    ct_block_mask_free(bm);
    ct_mask_mod_free(&sw);
}

/* ---- element truth of the built-in masks' tiles -------------------------------------------- */

typedef struct etruth {
    int kind; /* 0 causal, 1 window 10 causal, 2 documents, 3 doc & causal, 4 doc | window,
                 5 not(doc & causal) */
    const int32_t *qd, *kd; /* [2][L] ids */
} etruth;

static int truth(const etruth *e, int64_t b, int64_t q, int64_t kv, int64_t L)
{
    int causal = kv <= q, win = kv <= q && q - kv <= 10;
    int doc = e->qd[b * L + q] == e->kd[b * L + kv];
    switch (e->kind) {
    case 0: return causal;
    case 1: return win;
    case 2: return doc;
    case 3: return doc && causal;
    case 4: return doc || win;
    default: return !(doc && causal);
    }
}

/* Every tile of every position, size and layout (key-major contiguous as the kernels ask,
 * query-major strided) against the element-wise definition: the run writers (documents as
 * runs of sorted ids) and the combinators' skipping of children their classifiers settle. */
static void check_elements(const ct_mask_mod *m, const etruth *e, int64_t L, const char *what)
{
    static const int64_t sizes[] = {1, 7, 16, 33, 64, 100};
    uint8_t *buf = malloc((size_t)(L * L * 3));
    int bad = 0;
    for (int64_t b = 0; b < 2; b++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (size_t sj = 0; sj < sizeof sizes / sizeof sizes[0]; sj++)
                for (int64_t q0 = 0; q0 < L; q0 += 13)
                    for (int64_t kv0 = 0; kv0 < L; kv0 += 17)
                        for (int layout = 0; layout < 2; layout++) {
                            int64_t nq = mn(sizes[si], L - q0), nk = mn(sizes[sj], L - kv0);
                            ct_attn_tile t = {b, 0, q0, nq, kv0, nk, 1, nq + 3};
                            if (layout) t.q_stride = 2 * nk + 1, t.kv_stride = 2;
                            memset(buf, 7, (size_t)(L * L * 3));
                            m->tile(m->ctx, &t, buf);
                            for (int64_t i = 0; i < nq; i++)
                                for (int64_t j = 0; j < nk; j++) {
                                    uint8_t got = buf[i * t.q_stride + j * t.kv_stride];
                                    int want = truth(e, b, q0 + i, kv0 + j, L);
                                    if ((got != 0 && got != 1) || got != want) {
                                        if (!bad)
                                            fprintf(stderr,
                                                    "  %s: b %lld q %lld kv %lld got %d want %d\n",
                                                    what, (long long)b, (long long)(q0 + i),
                                                    (long long)(kv0 + j), got, want);
                                        bad++;
                                    }
                                }
                        }
    CHECK(bad == 0);
    free(buf);
}

static void test_elements(void)
{
    enum { L = 150 };
    int32_t sorted[2 * L], cross[2 * L], mixed[2 * L];
    for (int i = 0; i < L; i++) {
        sorted[i] = i / 64, sorted[L + i] = i < 3 ? 0 : i < 40 ? 1 : i < 41 ? 2 : 5 + i / 50;
        cross[i] = i / 30, cross[L + i] = i / 20; /* kv ids differ from q ids */
        mixed[i] = (i * 37) % 3, mixed[L + i] = (i * 11) % 4;
    }
    ct_mask_mod causal, win, ds, dx, dm, kids[2], both, either, nboth;
    CHECK_OK(ct_mask_mod_causal(&causal));
    CHECK_OK(ct_mask_mod_sliding_window(10, true, &win));
    CHECK_OK(ct_mask_mod_document(sorted, NULL, 2, L, L, &ds));
    CHECK_OK(ct_mask_mod_document(sorted, cross, 2, L, L, &dx));
    CHECK_OK(ct_mask_mod_document(mixed, NULL, 2, L, L, &dm));
    check_elements(&causal, &(etruth){0, sorted, sorted}, L, "causal");
    check_elements(&win, &(etruth){1, sorted, sorted}, L, "window");
    check_elements(&ds, &(etruth){2, sorted, sorted}, L, "documents sorted");
    check_elements(&dx, &(etruth){2, sorted, cross}, L, "documents cross ids");
    check_elements(&dm, &(etruth){2, mixed, mixed}, L, "documents unsorted");
    const ct_mask_mod *docs[3] = {&ds, &dm, &dx};
    const int32_t *kd[3] = {sorted, mixed, cross}, *qd[3] = {sorted, mixed, sorted};
    for (int d = 0; d < 3; d++) {
        for (int order = 0; order < 2; order++) { /* the child settled first or second */
            kids[order] = *docs[d], kids[1 - order] = causal;
            CHECK_OK(ct_mask_mod_and(kids, 2, &both));
            check_elements(&both, &(etruth){3, qd[d], kd[d]}, L, "doc & causal");
            CHECK_OK(ct_mask_mod_not(&both, &nboth));
            check_elements(&nboth, &(etruth){5, qd[d], kd[d]}, L, "not (doc & causal)");
            kids[order] = *docs[d], kids[1 - order] = win;
            CHECK_OK(ct_mask_mod_or(kids, 2, &either));
            check_elements(&either, &(etruth){4, qd[d], kd[d]}, L, "doc | window");
            ct_mask_mod_free(&nboth), ct_mask_mod_free(&both), ct_mask_mod_free(&either);
        }
    }
    ct_mask_mod_free(&causal), ct_mask_mod_free(&win), ct_mask_mod_free(&ds);
    ct_mask_mod_free(&dx), ct_mask_mod_free(&dm);
}

static void test_bad_args(void)
{
    ct_mask_mod m, causal;
    ct_score_mod sm;
    ct_block_mask *bm = NULL;
    CHECK_OK(ct_mask_mod_causal(&causal));
    CHECK_STATUS(ct_mask_mod_causal(NULL), CT_EINVAL);
    CHECK_STATUS(ct_mask_mod_sliding_window(-1, true, &m), CT_EINVAL);
    CHECK_STATUS(ct_mask_mod_prefix_lm(-3, &m), CT_EINVAL);
    int32_t ids[4] = {0, 0, 1, 1};
    CHECK_STATUS(ct_mask_mod_document(NULL, NULL, 1, 4, 4, &m), CT_EINVAL);
    CHECK_STATUS(ct_mask_mod_document(ids, NULL, 1, 4, 3, &m), CT_EINVAL);
    CHECK_STATUS(ct_mask_mod_document(ids, NULL, 0, 4, 4, &m), CT_EINVAL);
    /* ids shorter than the block mask's lengths, or fewer rows than its batches: refused
     * (they were read past their end), also inside a combination */
    {
        int32_t two[8] = {0, 0, 1, 1, 0, 1, 1, 1};
        ct_mask_mod d1, d2, cz, both;
        bm = NULL;
        CHECK_OK(ct_mask_mod_document(two, NULL, 1, 4, 4, &d1));
        CHECK_OK(ct_mask_mod_document(two, NULL, 2, 4, 4, &d2));
        CHECK_STATUS(ct_block_mask_create(&d1, 1, 1, 5, 4, 4, &bm), CT_EINVAL);
        CHECK(strstr(ct_last_error(), "Q_LEN = 5"));
        CHECK_STATUS(ct_block_mask_create(&d1, 1, 1, 4, 9, 4, &bm), CT_EINVAL);
        CHECK_STATUS(ct_block_mask_create(&d2, 3, 1, 4, 4, 4, &bm), CT_EINVAL);
        CHECK(strstr(ct_last_error(), "2 batches, fewer than B = 3"));
        CHECK_OK(ct_mask_mod_causal(&cz));
        ct_mask_mod kids[2] = {cz, d2};
        CHECK_OK(ct_mask_mod_and(kids, 2, &both));
        CHECK_STATUS(ct_block_mask_create(&both, 3, 2, 4, 4, 4, &bm), CT_EINVAL);
        CHECK_OK(ct_block_mask_create(&both, 2, 2, 4, 4, 4, &bm)); /* fits */
        ct_block_mask_free(bm);
        bm = NULL;
        CHECK_OK(ct_block_mask_create(&d1, 7, 1, 3, 4, 4, &bm)); /* shared, shorter q */
        ct_block_mask_free(bm);
        ct_mask_mod_free(&both);
        ct_mask_mod_free(&cz);
        ct_mask_mod_free(&d2);
        ct_mask_mod_free(&d1);
    }
    CHECK_STATUS(ct_mask_mod_and(&causal, 0, &m), CT_EINVAL);
    CHECK_STATUS(ct_mask_mod_or(NULL, 2, &m), CT_EINVAL);
    CHECK_STATUS(ct_mask_mod_not(NULL, &m), CT_EINVAL);
    ct_mask_mod notile = {NULL, NULL, NULL, NULL, false, false};
    CHECK_STATUS(ct_mask_mod_and(&notile, 1, &m), CT_EINVAL);
    CHECK_STATUS(ct_score_mod_softcap(0.0f, &sm), CT_EINVAL);
    CHECK_STATUS(ct_score_mod_softcap(-2.0f, &sm), CT_EINVAL);
    CHECK_STATUS(ct_score_mod_alibi(0, NULL, &sm), CT_EINVAL);
    float table[3] = {0};
    CHECK_STATUS(ct_score_mod_relative_bias(NULL, 1, 3, 1, NULL, &sm), CT_EINVAL);
    CHECK_STATUS(ct_score_mod_relative_bias(table, 1, 0, 1, NULL, &sm), CT_EINVAL);
    CHECK_STATUS(ct_block_mask_create(NULL, 1, 1, 8, 8, 4, &bm), CT_EINVAL);
    CHECK_STATUS(ct_block_mask_create(&notile, 1, 1, 8, 8, 4, &bm), CT_EINVAL);
    CHECK_STATUS(ct_block_mask_create(&causal, 0, 1, 8, 8, 4, &bm), CT_EINVAL);
    CHECK_STATUS(ct_block_mask_create(&causal, 1, 1, 0, 8, 4, &bm), CT_EINVAL);
    CHECK_STATUS(ct_block_mask_create(&causal, 1, 1, 8, 8, 0, &bm), CT_EINVAL);
    CHECK_STATUS(ct_block_mask_create(&causal, 1, 1, 8, 8, 2048, &bm), CT_EINVAL);
    CHECK_STATUS(ct_block_mask_create(&causal, 1, 1, 8, 8, 4, NULL), CT_EINVAL);
    CHECK_STATUS(ct_block_mask_to_dense(NULL, NULL), CT_EINVAL);

    /* attention shapes and types */
    float q[2 * 8 * 4], k[2 * 8 * 4], v[2 * 8 * 4], o[2 * 8 * 4], lse[16];
    uint16_t kb16[64];
    t_fill(q, 64, -1, 1);
    memcpy(k, q, sizeof k);
    memcpy(v, q, sizeof v);
    int64_t s4[4] = {1, 2, 8, 4}, s3[3] = {1, 2, 8}, s1h[4] = {1, 1, 8, 4}, s3h[4] = {1, 3, 8, 4};
    ct_tensor tq, tk, tv, to, tl, t3, tkb, tk3h, tq3h, to3h, tl_bad, to_bad, tstr;
    ct_tensor_wrap(&tq, q, CT_DTYPE_F32, 4, s4, NULL);
    ct_tensor_wrap(&tk, k, CT_DTYPE_F32, 4, s4, NULL);
    ct_tensor_wrap(&tv, v, CT_DTYPE_F32, 4, s4, NULL);
    ct_tensor_wrap(&to, o, CT_DTYPE_F32, 4, s4, NULL);
    ct_tensor_wrap(&tl, lse, CT_DTYPE_F32, 3, s3, NULL);
    ct_tensor_wrap(&t3, q, CT_DTYPE_F32, 3, s3, NULL);
    ct_tensor_wrap(&tkb, kb16, CT_DTYPE_BF16, 4, s4, NULL);
    ct_tensor_wrap(&tk3h, k, CT_DTYPE_F32, 4, s1h, NULL);
    ct_tensor_wrap(&tq3h, q, CT_DTYPE_F32, 4, s3h, NULL);
    ct_tensor_wrap(&to3h, o, CT_DTYPE_F32, 4, s3h, NULL);
    ct_tensor_wrap(&tl_bad, lse, CT_DTYPE_F16, 3, s3, NULL);
    ct_tensor_wrap(&to_bad, o, CT_DTYPE_F32, 4, s1h, NULL);
    int64_t st[4] = {64, 32, 4, 2};
    ct_tensor_wrap(&tstr, q, CT_DTYPE_F32, 4, (int64_t[]){1, 2, 8, 2}, st);
    ct_flex_options fo = ct_flex_options_default();
    CHECK_OK(ct_flex_attention_forward(&tq, &tk, &tv, NULL, &fo, &to, &tl));
    CHECK_STATUS(ct_flex_attention_forward(NULL, &tk, &tv, NULL, &fo, &to, &tl), CT_EINVAL);
    CHECK_STATUS(ct_flex_attention_forward(&t3, &tk, &tv, NULL, &fo, &to, &tl), CT_EINVAL);
    CHECK_STATUS(ct_flex_attention_forward(&tq, &tkb, &tv, NULL, &fo, &to, &tl), CT_EINVAL);
    CHECK_STATUS(ct_flex_attention_forward(&tq, &tk, &tv, NULL, &fo, &to_bad, &tl), CT_EINVAL);
    CHECK_STATUS(ct_flex_attention_forward(&tq, &tk, &tv, NULL, &fo, &to, &tl_bad), CT_EINVAL);
    CHECK_STATUS(ct_flex_attention_forward(&tq, &tk, &tv, NULL, &fo, &to, NULL), CT_OK);
    CHECK_STATUS(ct_flex_attention_forward(&tstr, &tk, &tv, NULL, &fo, &to, NULL), CT_EINVAL);
    (void)tk3h;
    fo.scale = NAN;
    CHECK_STATUS(ct_flex_attention_forward(&tq, &tk, &tv, NULL, &fo, &to, &tl), CT_EINVAL);
    fo.scale = 0;
    ct_score_mod nofwd = {NULL, NULL, NULL, NULL, NULL, 0};
    fo.score_mod = &nofwd;
    CHECK_STATUS(ct_flex_attention_forward(&tq, &tk, &tv, NULL, &fo, &to, &tl), CT_EINVAL);
    fo.score_mod = NULL;
    CHECK_OK(ct_block_mask_create(&causal, 1, 1, 8, 9, 4, &bm));
    CHECK_STATUS(ct_flex_attention_forward(&tq, &tk, &tv, bm, &fo, &to, &tl), CT_EINVAL);
    ct_block_mask_free(bm);
    ct_mask_mod hm = causal;
    hm.uses_h = true;
    CHECK_OK(ct_block_mask_create(&hm, 1, 3, 8, 8, 4, &bm));
    CHECK_STATUS(ct_flex_attention_forward(&tq, &tk, &tv, bm, &fo, &to, &tl), CT_EINVAL);
    ct_block_mask_free(bm);
    CHECK_STATUS(
        ct_flex_attention_backward(&tq, &tk, &tv, &to, NULL, &tq, NULL, &fo, NULL, NULL, NULL),
        CT_EINVAL);
    CHECK_STATUS(
        ct_flex_attention_backward(&tq, &tk, &tv, &to, &tl, &to_bad, NULL, &fo, NULL, NULL, NULL),
        CT_EINVAL);
    CHECK_STATUS(
        ct_flex_attention_backward(&tq, &tk, &tv, &to, &tl, &tq, NULL, &fo, &to_bad, NULL, NULL),
        CT_EINVAL);
    /* GQA: 3 query heads over 2 kv heads */
    CHECK_STATUS(ct_flex_attention_forward(&tq3h, &tk, &tv, NULL, &fo, &to3h, NULL), CT_EINVAL);
    /* sdpa */
    ct_sdpa_options so = ct_sdpa_options_default();
    uint8_t mask[64] = {0};
    int32_t imask[64] = {0};
    int64_t ms[2] = {8, 8}, mbad[2] = {8, 7};
    ct_tensor tm, tmi, tmb;
    ct_tensor_wrap(&tm, mask, CT_DTYPE_BOOL, 2, ms, NULL);
    ct_tensor_wrap(&tmi, imask, CT_DTYPE_I32, 2, ms, NULL);
    ct_tensor_wrap(&tmb, mask, CT_DTYPE_BOOL, 2, mbad, NULL);
    so.is_causal = true;
    so.attn_mask = &tm;
    CHECK_STATUS(ct_sdpa_forward(&tq, &tk, &tv, &so, &to, &tl), CT_EINVAL);
    so.is_causal = false;
    so.attn_mask = &tmi;
    CHECK_STATUS(ct_sdpa_forward(&tq, &tk, &tv, &so, &to, &tl), CT_EINVAL);
    so.attn_mask = &tmb;
    CHECK_STATUS(ct_sdpa_forward(&tq, &tk, &tv, &so, &to, &tl), CT_EINVAL);
    so.attn_mask = &tm;
    CHECK_OK(ct_sdpa_forward(&tq, &tk, &tv, &so, &to, &tl));
    CHECK(o[0] == 0.0f && lse[0] == -INFINITY); /* an all-false mask masks every row */
    ct_mask_mod_free(&causal);
}

int main(void)
{
    test_structures();
    test_long();
    test_elements();
    test_bad_args();
    return t_report("test_attention_mask");
}
