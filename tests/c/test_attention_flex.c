/* FlexAttention forward and backward against the naive materialised reference: every built-in
 * mask and score mod, GQA, cross-attention lengths, odd lengths and block sizes, head dims
 * E != Ev, bf16, strided views, a user mask and score mod, fully masked rows, finite
 * differences of the reference, determinism across runs and thread counts, and the skipped
 * masked rectangles of partial tiles against every pair computed and masked by -inf. */
#include "test_attention_ref.h"

#define TOL 1e-4

static void check_case(acase c, int64_t bs, bool store, const char *what)
{
    abufs a;
    abufs_init(&a, &c);
    ct_block_mask *bm = NULL;
    if (c.mask) {
        ct_block_mask_options o = ct_block_mask_options_default();
        o.block_size = bs;
        o.store_partial = store;
        CHECK_OK(ct_block_mask_create_ex(c.mask, c.B, c.Hq, c.L, c.S, &o, &bm));
    }
    CHECK_OK(a_run(&c, bm, &a));
    CHECK(a_compare(&c, &a, TOL, what));
    ct_block_mask_free(bm);
    abufs_free(&a);
}

static acase mk(int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t E, int64_t Ev,
                const ct_mask_mod *m, const ct_score_mod *sm)
{
    acase c = {B, Hq, Hkv, L, S, E, Ev, (float)(1.0 / sqrt((double)E)), m, sm};
    return c;
}

/* ---- a user mask (no classifier, depends on h) and a user score mod ------------------------ */

static void user_mask_tile(void *ctx, const ct_attn_tile *t, uint8_t *keep)
{
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t j = 0; j < t->nkv; j++) {
            int64_t q = t->q0 + i, kv = t->kv0 + j;
            keep[i * t->q_stride + j * t->kv_stride] =
                (q * 7 + kv * 3 + t->h) % 5 != 0 && kv <= q + 3;
        }
}

static void quad_fwd(void *ctx, const ct_attn_tile *t, float *s)
{
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t j = 0; j < t->nkv; j++) {
            float *x = s + i * t->q_stride + j * t->kv_stride;
            *x = *x + 0.05f * *x * *x;
        }
}

static void quad_grad(void *ctx, const ct_attn_tile *t, const float *s, float *g, float *dparam)
{
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t j = 0; j < t->nkv; j++) {
            int64_t at = i * t->q_stride + j * t->kv_stride;
            g[at] *= 1.0f + 0.1f * s[at];
        }
}

static void test_masks(void)
{
    ct_mask_mod causal, sw, sw2, pre, noop;
    CHECK_OK(ct_mask_mod_causal(&causal));
    CHECK_OK(ct_mask_mod_sliding_window(20, true, &sw));
    CHECK_OK(ct_mask_mod_sliding_window(7, false, &sw2));
    CHECK_OK(ct_mask_mod_prefix_lm(13, &pre));
    CHECK_OK(ct_mask_mod_noop(&noop));
    check_case(mk(1, 2, 2, 37, 37, 16, 16, NULL, NULL), 128, false, "dense");
    check_case(mk(1, 2, 2, 100, 100, 16, 16, &causal, NULL), 16, false, "causal bs16");
    check_case(mk(2, 1, 1, 129, 129, 8, 8, &causal, NULL), 128, false, "causal bs128 L129");
    check_case(mk(1, 2, 2, 90, 90, 16, 16, &sw, NULL), 16, false, "sliding causal");
    check_case(mk(1, 1, 1, 70, 70, 16, 16, &sw2, NULL), 8, false, "sliding two-sided");
    check_case(mk(1, 2, 2, 61, 61, 16, 16, &pre, NULL), 16, false, "prefix-lm");
    check_case(mk(1, 1, 1, 33, 33, 16, 16, &noop, NULL), 16, false, "noop");
    /* block sizes: sub-tiles (200 -> 2 x 100), tiny blocks */
    check_case(mk(1, 1, 1, 450, 450, 8, 8, &causal, NULL), 200, false, "causal bs200");
    check_case(mk(1, 1, 1, 23, 23, 8, 8, &sw, NULL), 3, false, "sliding bs3");

    /* documents: sorted ids (O(1) classification) and unsorted (evaluated), with causal */
    int32_t ids[80], mixed[80];
    for (int i = 0; i < 80; i++)
        ids[i] = i < 11 ? 0 : i < 40 ? 1 : i < 41 ? 2 : 3;
    for (int i = 0; i < 80; i++)
        mixed[i] = (i * 37) % 3;
    ct_mask_mod doc, docm, dc[2], doc_causal;
    CHECK_OK(ct_mask_mod_document(ids, NULL, 1, 80, 80, &doc));
    CHECK_OK(ct_mask_mod_document(mixed, NULL, 1, 80, 80, &docm));
    dc[0] = doc;
    dc[1] = causal;
    CHECK_OK(ct_mask_mod_and(dc, 2, &doc_causal));
    check_case(mk(1, 2, 2, 80, 80, 16, 16, &doc, NULL), 16, false, "document");
    check_case(mk(1, 2, 2, 80, 80, 16, 16, &docm, NULL), 16, false, "document unsorted");
    check_case(mk(1, 2, 2, 80, 80, 16, 16, &doc_causal, NULL), 16, false, "document & causal");
    /* per-batch document ids */
    int32_t ids2[2 * 50];
    for (int i = 0; i < 50; i++)
        ids2[i] = i / 9, ids2[50 + i] = i / 20;
    ct_mask_mod docb;
    CHECK_OK(ct_mask_mod_document(ids2, NULL, 2, 50, 50, &docb));
    check_case(mk(2, 1, 1, 50, 50, 8, 8, &docb, NULL), 16, false, "document per batch");

    /* or / not: anti-causal rows at the end are fully masked (out 0, lse -inf, grads 0) */
    ct_mask_mod orm, notm, pair[2] = {sw2, pre};
    CHECK_OK(ct_mask_mod_or(pair, 2, &orm));
    CHECK_OK(ct_mask_mod_not(&causal, &notm));
    check_case(mk(1, 1, 1, 64, 64, 16, 16, &orm, NULL), 16, false, "or");
    check_case(mk(1, 2, 2, 40, 40, 16, 16, &notm, NULL), 16, false, "not causal");

    /* a user mask (evaluated per block, depends on h), with and without stored tiles */
    ct_mask_mod um = {user_mask_tile, NULL, NULL, NULL, false, true};
    check_case(mk(1, 3, 3, 57, 57, 16, 16, &um, NULL), 16, false, "user mask");
    check_case(mk(1, 3, 3, 57, 57, 16, 16, &um, NULL), 16, true, "user mask stored");
    check_case(mk(1, 2, 2, 150, 150, 16, 16, &um, NULL), 128, true, "user mask stored bs128");
    check_case(mk(1, 2, 2, 80, 80, 16, 16, &doc_causal, NULL), 32, true,
               "document & causal stored");

    ct_mask_mod_free(&doc_causal);
    ct_mask_mod_free(&orm);
    ct_mask_mod_free(&notm);
    ct_mask_mod_free(&doc);
    ct_mask_mod_free(&docm);
    ct_mask_mod_free(&docb);
    ct_mask_mod_free(&causal);
    ct_mask_mod_free(&sw);
    ct_mask_mod_free(&sw2);
    ct_mask_mod_free(&pre);
    ct_mask_mod_free(&noop);
}

static void test_shapes(void)
{
    ct_mask_mod causal, pre;
    CHECK_OK(ct_mask_mod_causal(&causal));
    CHECK_OK(ct_mask_mod_prefix_lm(30, &pre));
    check_case(mk(1, 4, 2, 50, 50, 16, 16, &causal, NULL), 16, false, "gqa 4/2");
    check_case(mk(2, 6, 2, 41, 41, 8, 8, &causal, NULL), 16, false, "gqa 6/2");
    check_case(mk(1, 3, 1, 20, 20, 8, 8, NULL, NULL), 16, false, "mqa 3/1 dense");
    check_case(mk(1, 2, 2, 40, 75, 24, 40, NULL, NULL), 16, false, "cross dense E24 Ev40");
    check_case(mk(1, 2, 1, 75, 40, 24, 40, &pre, NULL), 16, false, "cross prefix");
    check_case(mk(1, 2, 2, 33, 70, 20, 7, &causal, NULL), 16, false, "cross causal E20 Ev7");
    check_case(mk(1, 1, 1, 1, 1, 1, 1, NULL, NULL), 16, false, "1 element");
    check_case(mk(1, 1, 1, 5, 300, 72, 100, NULL, NULL), 16, false, "long keys E72 Ev100");
    acase c = mk(1, 2, 2, 30, 30, 16, 16, &causal, NULL);
    c.scale = 0.9f;
    check_case(c, 16, false, "scale 0.9");
    ct_mask_mod_free(&causal);
    ct_mask_mod_free(&pre);
}

static void test_score_mods(void)
{
    ct_mask_mod causal, sw;
    CHECK_OK(ct_mask_mod_causal(&causal));
    CHECK_OK(ct_mask_mod_sliding_window(11, true, &sw));
    ct_score_mod cap, alibi, quad = {quad_fwd, quad_grad, NULL, NULL, NULL, 0};
    CHECK_OK(ct_score_mod_softcap(1.5f, &cap));
    CHECK_OK(ct_score_mod_alibi(4, NULL, &alibi));
    acase c = mk(1, 2, 2, 60, 60, 16, 16, &causal, &cap);
    c.scale = 1.0f; /* large scores, so the cap matters */
    check_case(c, 16, false, "softcap causal");
    check_case(mk(1, 4, 2, 45, 45, 16, 16, &sw, &alibi), 16, false, "alibi sliding gqa");
    check_case(mk(1, 4, 4, 45, 45, 16, 16, NULL, &alibi), 16, false, "alibi dense");
    check_case(mk(1, 2, 2, 37, 37, 16, 16, &causal, &quad), 16, false, "user score mod");

    /* relative bias: forward/backward and the table's gradient, per-head and shared tables */
    for (int shared = 0; shared < 2; shared++) {
        int64_t H = 2, T = 15, rows = shared ? 1 : H;
        float table[2 * 15], dtab[2 * 15] = {0}, rdtab[2 * 15] = {0};
        t_fill(table, (size_t)(rows * T), -1, 1);
        ct_score_mod rb, rbr;
        CHECK_OK(ct_score_mod_relative_bias(table, shared ? 0 : H, T, 7, dtab, &rb));
        CHECK_OK(ct_score_mod_relative_bias(table, shared ? 0 : H, T, 7, NULL, &rbr));
        acase rc = mk(1, H, H, 70, 70, 16, 16, &sw, &rb);
        abufs a;
        abufs_init(&a, &rc);
        ct_block_mask *bm;
        CHECK_OK(ct_block_mask_create(&sw, 1, H, 70, 70, 16, &bm));
        CHECK_OK(a_run(&rc, bm, &a));
        acase rr = rc;
        rr.sm = &rbr;
        CHECK(a_compare(&rr, &a, TOL, shared ? "relbias shared" : "relbias per head"));
        ref_backward(&rr, a.q, a.k, a.v, a.dout, a.rdq, a.rdk, a.rdv, rdtab);
        CHECK(t_close(dtab, rdtab, (size_t)(rows * T), TOL, TOL, "relbias dtable"));
        /* a tiny gradient budget: groups of many dQ units, same result */
        float dtab2[2 * 15] = {0};
        rb.param_grad = dtab2;
        ct_flex_options o = ct_flex_options_default();
        o.scale = rc.scale;
        o.score_mod = &rb;
        o.grad_scratch_bytes = 1;
        ct_tensor q = a_wrap(a.q, CT_DTYPE_F32, 1, H, 70, 16),
                  k = a_wrap(a.k, CT_DTYPE_F32, 1, H, 70, 16);
        ct_tensor v = a_wrap(a.v, CT_DTYPE_F32, 1, H, 70, 16),
                  out = a_wrap(a.out, CT_DTYPE_F32, 1, H, 70, 16);
        ct_tensor lse = a_wrap(a.lse, CT_DTYPE_F32, 1, H, 70, -1),
                  dO = a_wrap(a.dout, CT_DTYPE_F32, 1, H, 70, 16);
        CHECK_OK(ct_flex_attention_backward(&q, &k, &v, &out, &lse, &dO, bm, &o, NULL, NULL, NULL));
        CHECK(t_close(dtab2, rdtab, (size_t)(rows * T), TOL, TOL, "relbias dtable, one group"));
        ct_block_mask_free(bm);
        abufs_free(&a);
        ct_score_mod_free(&rb);
        ct_score_mod_free(&rbr);
    }
    ct_score_mod_free(&cap);
    ct_score_mod_free(&alibi);
    ct_mask_mod_free(&causal);
    ct_mask_mod_free(&sw);
}

/* Central differences of the reference forward check the reference backward (and the mods'
 * derivatives and the bias table's gradient). */
static double ref_objective(const acase *c, const float *q, const float *k, const float *v,
                            const float *w)
{
    float *out = malloc(sizeof(float) * a_no(c));
    ref_forward(c, q, k, v, out, NULL);
    double f = 0;
    for (size_t i = 0; i < a_no(c); i++)
        f += (double)out[i] * w[i];
    free(out);
    return f;
}

static void fd_check(float *x, size_t n, const float *grad, const acase *c, abufs *a,
                     const char *what)
{
    int bad = 0;
    for (size_t i = 0; i < n; i += 3) {
        float x0 = x[i], eps = 1e-3f;
        x[i] = x0 + eps;
        double fp = ref_objective(c, a->q, a->k, a->v, a->dout);
        x[i] = x0 - eps;
        double fm = ref_objective(c, a->q, a->k, a->v, a->dout);
        x[i] = x0;
        double num = (fp - fm) / (2.0 * eps);
        if (fabs(num - grad[i]) > 2e-3 + 2e-2 * fabs(num)) {
            if (!bad)
                fprintf(stderr, "  fd %s[%zu]: numeric %g vs analytic %g\n", what, i, num, grad[i]);
            bad++;
        }
    }
    CHECK(bad == 0);
}

static void test_reference_fd(void)
{
    ct_mask_mod causal;
    CHECK_OK(ct_mask_mod_causal(&causal));
    ct_score_mod cap;
    CHECK_OK(ct_score_mod_softcap(0.8f, &cap));
    float table[2 * 9], dtab[2 * 9] = {0};
    t_fill(table, 18, -1, 1);
    ct_score_mod rb;
    CHECK_OK(ct_score_mod_relative_bias(table, 2, 9, 4, NULL, &rb));
    const ct_score_mod *mods[2] = {&cap, &rb};
    for (int m = 0; m < 2; m++) {
        acase c = mk(1, 2, 1, 6, 7, 4, 3, &causal, mods[m]);
        c.scale = 1.0f;
        abufs a;
        abufs_init(&a, &c);
        memset(dtab, 0, sizeof dtab);
        ref_backward(&c, a.q, a.k, a.v, a.dout, a.rdq, a.rdk, a.rdv, m ? dtab : NULL);
        fd_check(a.q, a_nq(&c), a.rdq, &c, &a, "q");
        fd_check(a.k, a_nk(&c), a.rdk, &c, &a, "k");
        fd_check(a.v, a_nv(&c), a.rdv, &c, &a, "v");
        if (m) fd_check(table, 18, dtab, &c, &a, "table");
        abufs_free(&a);
    }
    ct_score_mod_free(&cap);
    ct_score_mod_free(&rb);
    ct_mask_mod_free(&causal);
}

static void round_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = ct_bf16_to_f32(ct_f32_to_bf16(x[i]));
}

static void test_bf16(void)
{
    ct_mask_mod sw;
    CHECK_OK(ct_mask_mod_sliding_window(25, true, &sw));
    acase c = mk(1, 4, 2, 90, 90, 32, 24, &sw, NULL);
    abufs a;
    abufs_init(&a, &c);
    round_bf16(a.q, a_nq(&c));
    round_bf16(a.k, a_nk(&c));
    round_bf16(a.v, a_nv(&c));
    round_bf16(a.dout, a_no(&c));
    uint16_t *qb = malloc(2 * a_nq(&c)), *kb = malloc(2 * a_nk(&c)), *vb = malloc(2 * a_nv(&c));
    uint16_t *ob = malloc(2 * a_no(&c)), *gb = malloc(2 * a_no(&c)), *dqb = malloc(2 * a_nq(&c));
    ct_convert_f32_to_bf16(qb, a.q, a_nq(&c));
    ct_convert_f32_to_bf16(kb, a.k, a_nk(&c));
    ct_convert_f32_to_bf16(vb, a.v, a_nv(&c));
    ct_convert_f32_to_bf16(gb, a.dout, a_no(&c));
    ct_block_mask *bm;
    CHECK_OK(ct_block_mask_create(&sw, 1, 1, 90, 90, 32, &bm));
    ct_tensor q = a_wrap(qb, CT_DTYPE_BF16, 1, 4, 90, 32),
              k = a_wrap(kb, CT_DTYPE_BF16, 1, 2, 90, 32);
    ct_tensor v = a_wrap(vb, CT_DTYPE_BF16, 1, 2, 90, 24),
              o = a_wrap(ob, CT_DTYPE_BF16, 1, 4, 90, 24);
    ct_tensor l = a_wrap(a.lse, CT_DTYPE_F32, 1, 4, 90, -1),
              dO = a_wrap(gb, CT_DTYPE_BF16, 1, 4, 90, 24);
    ct_tensor dq = a_wrap(dqb, CT_DTYPE_BF16, 1, 4, 90, 32),
              dk = a_wrap(a.dk, CT_DTYPE_F32, 1, 2, 90, 32);
    ct_tensor dv = a_wrap(a.dv, CT_DTYPE_F32, 1, 2, 90, 24);
    ct_flex_options fo = ct_flex_options_default();
    CHECK_OK(ct_flex_attention_forward(&q, &k, &v, bm, &fo, &o, &l));
    CHECK_OK(ct_flex_attention_backward(&q, &k, &v, &o, &l, &dO, bm, &fo, &dq, &dk, &dv));
    ct_convert_bf16_to_f32(a.out, ob, a_no(&c));
    ct_convert_bf16_to_f32(a.dq, dqb, a_nq(&c));
    ref_forward(&c, a.q, a.k, a.v, a.rout, a.rlse);
    ref_backward(&c, a.q, a.k, a.v, a.dout, a.rdq, a.rdk, a.rdv, NULL);
    CHECK(t_close(a.out, a.rout, a_no(&c), 1e-2, 1e-2, "bf16 out"));
    CHECK(t_close(a.lse, a.rlse, 360, 1e-4, 1e-4, "bf16 lse"));
    CHECK(t_close(a.dq, a.rdq, a_nq(&c), 2e-2, 2e-2, "bf16 dq"));
    CHECK(t_close(a.dk, a.rdk, a_nk(&c), 2e-2, 2e-2, "bf16 dk"));
    CHECK(t_close(a.dv, a.rdv, a_nv(&c), 2e-2, 2e-2, "bf16 dv"));
    free(qb), free(kb), free(vb), free(ob), free(gb), free(dqb);
    ct_block_mask_free(bm);
    abufs_free(&a);
    ct_mask_mod_free(&sw);
}

/* q, out and dq as strided views of [B, L, H, E] buffers give the same bits as contiguous. */
static void test_strided(void)
{
    int64_t B = 2, H = 3, L = 45, E = 16;
    ct_mask_mod causal;
    CHECK_OK(ct_mask_mod_causal(&causal));
    acase c = mk(B, H, H, L, L, E, E, &causal, NULL);
    abufs a;
    abufs_init(&a, &c);
    ct_block_mask *bm;
    CHECK_OK(ct_block_mask_create(&causal, B, H, L, L, 16, &bm));
    CHECK_OK(a_run(&c, bm, &a));
    size_t n = a_nq(&c);
    float *qt = malloc(4 * n), *ot = calloc(n, 4), *dqt = calloc(n, 4), *o2 = malloc(4 * n),
          *dq2 = malloc(4 * n);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t l = 0; l < L; l++)
                memcpy(qt + ((b * L + l) * H + h) * E, a.q + ((b * H + h) * L + l) * E,
                       4 * (size_t)E);
    ct_tensor qs = a_wrap(qt, CT_DTYPE_F32, B, L, H, E), q,
              os = a_wrap(ot, CT_DTYPE_F32, B, L, H, E), o;
    ct_tensor dqs = a_wrap(dqt, CT_DTYPE_F32, B, L, H, E), dq;
    CHECK_OK(ct_tensor_transpose(&qs, 1, 2, &q));
    CHECK_OK(ct_tensor_transpose(&os, 1, 2, &o));
    CHECK_OK(ct_tensor_transpose(&dqs, 1, 2, &dq));
    ct_tensor k = a_wrap(a.k, CT_DTYPE_F32, B, H, L, E), v = a_wrap(a.v, CT_DTYPE_F32, B, H, L, E);
    ct_tensor lse = a_wrap(a.rlse, CT_DTYPE_F32, B, H, L, -1),
              dO = a_wrap(a.dout, CT_DTYPE_F32, B, H, L, E);
    CHECK_OK(ct_flex_attention_forward(&q, &k, &v, bm, NULL, &o, &lse));
    CHECK_OK(ct_flex_attention_backward(&q, &k, &v, &o, &lse, &dO, bm, NULL, &dq, NULL, NULL));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t l = 0; l < L; l++) {
                memcpy(o2 + ((b * H + h) * L + l) * E, ot + ((b * L + l) * H + h) * E,
                       4 * (size_t)E);
                memcpy(dq2 + ((b * H + h) * L + l) * E, dqt + ((b * L + l) * H + h) * E,
                       4 * (size_t)E);
            }
    CHECK(memcmp(o2, a.out, 4 * n) == 0);
    CHECK(memcmp(dq2, a.dq, 4 * n) == 0);
    free(qt), free(ot), free(dqt), free(o2), free(dq2);
    ct_block_mask_free(bm);
    abufs_free(&a);
    ct_mask_mod_free(&causal);
}

static void test_empty(void)
{
    float q[32], k[1], v[1], out[32], lse[2];
    t_fill(q, 32, -1, 1);
    for (int i = 0; i < 32; i++)
        out[i] = 7.0f;
    ct_tensor tq = a_wrap(q, CT_DTYPE_F32, 1, 1, 2, 16), tk = a_wrap(k, CT_DTYPE_F32, 1, 1, 0, 16);
    ct_tensor tv = a_wrap(v, CT_DTYPE_F32, 1, 1, 0, 16),
              to = a_wrap(out, CT_DTYPE_F32, 1, 1, 2, 16);
    ct_tensor tl = a_wrap(lse, CT_DTYPE_F32, 1, 1, 2, -1);
    CHECK_OK(ct_flex_attention_forward(&tq, &tk, &tv, NULL, NULL, &to, &tl));
    CHECK(out[0] == 0.0f && out[31] == 0.0f && lse[0] == -INFINITY && lse[1] == -INFINITY);
    ct_tensor tq0 = a_wrap(q, CT_DTYPE_F32, 1, 1, 0, 16),
              to0 = a_wrap(out, CT_DTYPE_F32, 1, 1, 0, 16);
    ct_tensor tk1 = a_wrap(q, CT_DTYPE_F32, 1, 1, 2, 16);
    CHECK_OK(ct_flex_attention_forward(&tq0, &tk1, &tk1, NULL, NULL, &to0, NULL));
}

/* The backward is the same bits across runs and across 1 and 2 threads. */
/* ---- skipping the masked rectangles of partial tiles changes no result -------------------- */

/* A score mod adding -inf where its mask_mod drops a pair: with a block mask whose every block
 * is full, the kernels compute every pair, the arithmetic the masked path skips. */
static void minus_inf_fwd(void *ctx, const ct_attn_tile *t, float *s)
{
    const ct_mask_mod *m = ctx;
    uint8_t *keep = malloc((size_t)(t->nq * t->nkv));
    ct_attn_tile u = *t;
    u.q_stride = 1, u.kv_stride = t->nq;
    m->tile(m->ctx, &u, keep);
    for (int64_t j = 0; j < t->nkv; j++)
        for (int64_t i = 0; i < t->nq; i++)
            if (!keep[j * t->nq + i]) s[i * t->q_stride + j * t->kv_stride] = -INFINITY;
    free(keep);
}

static int same_values(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (!(a[i] == b[i]) && !(isinf(a[i]) && a[i] == b[i])) {
            fprintf(stderr, "  %s: [%zu] %.9g vs %.9g\n", what, i, (double)a[i], (double)b[i]);
            return 0;
        }
    return 1;
}

/* The trimmed partial tiles (queries in chunks over the keys they keep; keys in chunks over
 * the queries) against every pair computed and masked by -inf: the same values (bits up to
 * the sign of a zero), out, lse, dq, dk and dv, at several block sizes (sub-tiles of 128, 64,
 * 100 rows) and with GQA. */
static void test_trim(void)
{
    enum { L = 300 };
    int32_t ids[2 * L];
    for (int i = 0; i < L; i++)
        ids[i] = i < 37 ? 0 : i < 101 ? 1 : i < 102 ? 2 : i < 230 ? 3 : 4, ids[L + i] = i / 64;
    ct_mask_mod causal, win, doc, kids[2], mods[2], noop;
    CHECK_OK(ct_mask_mod_causal(&causal));
    CHECK_OK(ct_mask_mod_sliding_window(20, true, &win));
    CHECK_OK(ct_mask_mod_document(ids, NULL, 2, L, L, &doc));
    CHECK_OK(ct_mask_mod_noop(&noop));
    kids[0] = causal, kids[1] = doc;
    CHECK_OK(ct_mask_mod_and(kids, 2, &mods[0]));
    kids[0] = win;
    CHECK_OK(ct_mask_mod_and(kids, 2, &mods[1]));
    static const int64_t sizes[] = {128, 64, 200};
    for (int mi = 0; mi < 2; mi++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            ct_score_mod sm = {minus_inf_fwd, NULL, &mods[mi], NULL, NULL, 0};
            acase c = mk(2, 4, 2, L, L, 32, 16, &mods[mi], NULL), cf = c;
            cf.mask = &noop, cf.sm = &sm;
            abufs a, f;
            abufs_init(&a, &c);
            abufs_init(&f, &cf);
            memcpy(f.q, a.q, a_nq(&c) * sizeof(float));
            memcpy(f.k, a.k, a_nk(&c) * sizeof(float));
            memcpy(f.v, a.v, a_nv(&c) * sizeof(float));
            memcpy(f.dout, a.dout, a_no(&c) * sizeof(float));
            ct_block_mask *bm = NULL, *full = NULL;
            CHECK_OK(ct_block_mask_create(&mods[mi], 2, 4, L, L, sizes[si], &bm));
            CHECK_OK(ct_block_mask_create(&noop, 2, 4, L, L, sizes[si], &full));
            CHECK_OK(a_run(&c, bm, &a));
            CHECK_OK(a_run(&cf, full, &f));
            char w[64];
            snprintf(w, sizeof w, "trim mask %d bs %lld", mi, (long long)sizes[si]);
            CHECK(same_values(a.out, f.out, a_no(&c), w));
            CHECK(same_values(a.lse, f.lse, (size_t)(2 * 4 * L), w));
            CHECK(same_values(a.dq, f.dq, a_nq(&c), w));
            CHECK(same_values(a.dk, f.dk, a_nk(&c), w));
            CHECK(same_values(a.dv, f.dv, a_nv(&c), w));
            ct_block_mask_free(bm);
            ct_block_mask_free(full);
            abufs_free(&a);
            abufs_free(&f);
        }
    ct_mask_mod_free(&mods[0]), ct_mask_mod_free(&mods[1]), ct_mask_mod_free(&causal);
    ct_mask_mod_free(&win), ct_mask_mod_free(&doc), ct_mask_mod_free(&noop);
}

static void test_determinism(void)
{
    int64_t L = 333, Hq = 4, Hkv = 2, E = 32, T = 21;
    int32_t ids[333];
    for (int i = 0; i < 333; i++)
        ids[i] = i / 70;
    ct_mask_mod causal, doc, both, pair[2];
    CHECK_OK(ct_mask_mod_causal(&causal));
    CHECK_OK(ct_mask_mod_document(ids, NULL, 1, L, L, &doc));
    pair[0] = doc, pair[1] = causal;
    CHECK_OK(ct_mask_mod_and(pair, 2, &both));
    float table[4 * 21];
    t_fill(table, 4 * 21, -1, 1);
    float dt[3][4 * 21];
    ct_score_mod rb;
    acase c = mk(1, Hq, Hkv, L, L, E, E, &both, &rb);
    abufs a[3];
    ct_block_mask *bm;
    CHECK_OK(ct_block_mask_create(&both, 1, Hq, L, L, 64, &bm));
    int threads[3] = {2, 2, 1};
    for (int r = 0; r < 3; r++) {
        t_rng = 12345; /* same inputs each run */
        abufs_init(&a[r], &c);
        memset(dt[r], 0, sizeof dt[r]);
        CHECK_OK(ct_score_mod_relative_bias(table, Hq, T, 10, dt[r], &rb));
        CHECK_OK(ct_set_num_threads(threads[r]));
        CHECK_OK(a_run(&c, bm, &a[r]));
        ct_score_mod_free(&rb);
    }
    CHECK_OK(ct_set_num_threads(2));
    for (int r = 1; r < 3; r++) {
        CHECK(memcmp(a[0].out, a[r].out, 4 * a_no(&c)) == 0);
        CHECK(memcmp(a[0].lse, a[r].lse, 4 * (size_t)(Hq * L)) == 0);
        CHECK(memcmp(a[0].dq, a[r].dq, 4 * a_nq(&c)) == 0);
        CHECK(memcmp(a[0].dk, a[r].dk, 4 * a_nk(&c)) == 0);
        CHECK(memcmp(a[0].dv, a[r].dv, 4 * a_nv(&c)) == 0);
        CHECK(memcmp(dt[0], dt[r], sizeof dt[0]) == 0);
    }
    for (int r = 0; r < 3; r++)
        abufs_free(&a[r]);
    ct_block_mask_free(bm);
    ct_mask_mod_free(&both);
    ct_mask_mod_free(&doc);
    ct_mask_mod_free(&causal);
}

int main(void)
{
    test_masks();
    test_shapes();
    test_score_mods();
    test_reference_fd();
    test_bf16();
    test_strided();
    test_empty();
    test_determinism();
    test_trim();
    ct_isa isa = ct_active_isa();
    if (isa == CT_ISA_AVX2 && ct_set_isa(CT_ISA_SCALAR) == CT_OK) { /* the scalar kernels too */
        test_masks();
        test_score_mods();
        test_determinism();
        test_trim();
        ct_set_isa(isa);
    }
    return t_report("test_attention_flex");
}
