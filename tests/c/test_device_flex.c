/* ct_device_flex_attention_forward / _backward and ct_device_block_mask_upload
 * (include/ctorch/device.h) on every device present: the CPU always, "cuda:0" when it opens
 * (the emulated device in test_device_flex_emu; else one "SKIPPED: cuda: <why>" line, a
 * failure when CT_TEST_REQUIRE_CUDA=1).
 *
 * Oracle: ct_flex_attention_forward / _backward on the CPU over host tensors in PyTorch's
 * contiguous [B, H, L, E] layout, with the same block mask, mods, dtype (bf16 out and
 * gradients with bf16 inputs). The device calls take the same values in device buffers laid
 * out [B, L, H, E] (the GPU's layout, as [B, H, L, E] views). On the CPU device the results
 * must be those bits; on a GPU within rtol * (|ref| + rms(ref)) (f32 2e-4, bf16 2e-2), lse's
 * -inf rows exactly, and three runs must give the same bits. Then bad input on each device:
 * every refusal names its cause. */
#include "device/device_internal.h"
#include "test_util.h"

#include <stdint.h>

#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct fcase {
    const char *name;
    int64_t B, Hq, Hkv, L, E, bs;
    int mask;  /* 0 none (NULL), 1 causal, 2 causal window, 3 two-sided window, 4 causal AND
                  documents per batch, 5 documents shared, 6 prefix LM, 7 AND(causal window,
                  prefix LM, noop), 8 AND(causal, a compiled mask) */
    int score; /* 0 none, 1 softcap, 2 ALiBi, 3 a compiled score mod over a table with a
                  gradient */
    int64_t arg;
} fcase;

static const fcase cases[] = {
    {"causal", 2, 2, 2, 37, 16, 64, 1, 0, 0},
    {"causal GQA 4/2", 1, 4, 2, 70, 32, 64, 1, 0, 0},
    {"causal window 20", 1, 2, 1, 131, 16, 64, 2, 0, 20},
    {"two-sided window 9", 2, 2, 2, 45, 16, 64, 3, 0, 9},
    {"causal documents", 2, 2, 1, 99, 16, 64, 4, 0, 0},
    {"shared documents", 2, 2, 2, 61, 8, 128, 5, 0, 0},
    {"prefix 30", 1, 2, 2, 77, 16, 128, 6, 0, 30},
    {"window 12 and prefix 8", 1, 2, 1, 66, 16, 64, 7, 0, 12},
    {"softcap 2.5 causal", 1, 2, 2, 50, 16, 64, 1, 1, 0},
    {"alibi causal GQA", 2, 4, 2, 33, 16, 64, 1, 2, 0},
    {"alibi, no mask", 1, 2, 2, 29, 16, 64, 0, 2, 0},
    {"no mask, odd E", 1, 2, 1, 19, 24, 64, 0, 0, 0},
    {"compiled score with a table, causal GQA", 2, 4, 2, 45, 16, 64, 1, 3, 0},
    {"compiled mask AND causal", 1, 2, 2, 70, 16, 64, 8, 0, 0},
    {"compiled mask and score", 1, 2, 1, 40, 8, 64, 8, 3, 0},
};

/* The compiled mods' table: tab[h % 2, clamp(q - kv + 8, 0, 16)] is added to the score. */
static float g_tab[2 * 17];
#define TAB_LEN (2 * 17)

/* ---- host data ---------------------------------------------------------------------------- */

static void docs_of(int32_t *ids, int64_t L, int64_t b)
{
    static const int lens[] = {23, 9, 5, 41, 17};
    int64_t t = 0;
    for (int d = 0; t < L; d++)
        for (int64_t n = lens[(d + b) % 5]; n > 0 && t < L; n--) ids[t++] = d;
}

typedef struct mods {
    ct_mask_mod kids[3], all;
    int nkids;
    bool combined, any;
    ct_score_mod sm;
    bool has_sm;
    int32_t *docs;
} mods;

static ct_status mods_make(const fcase *c, mods *m)
{
    memset(m, 0, sizeof *m);
    switch (c->mask) {
    case 0:
        break;
    case 1:
        CT_TRY(ct_mask_mod_causal(&m->all));
        m->any = true;
        break;
    case 2:
        CT_TRY(ct_mask_mod_sliding_window(c->arg, true, &m->all));
        m->any = true;
        break;
    case 3:
        CT_TRY(ct_mask_mod_sliding_window(c->arg, false, &m->all));
        m->any = true;
        break;
    case 4:
    case 5: {
        int64_t rows = c->mask == 4 ? c->B : 1;
        m->docs = malloc((size_t)(rows * c->L) * 4);
        for (int64_t b = 0; b < rows; b++) docs_of(m->docs + b * c->L, c->L, b);
        if (c->mask == 4) CT_TRY(ct_mask_mod_causal(&m->kids[m->nkids++]));
        CT_TRY(ct_mask_mod_document(m->docs, NULL, rows, c->L, c->L, &m->kids[m->nkids++]));
        m->combined = m->any = true;
        break;
    }
    case 6:
        CT_TRY(ct_mask_mod_prefix_lm(c->arg, &m->all));
        m->any = true;
        break;
    case 7:
        CT_TRY(ct_mask_mod_sliding_window(c->arg, true, &m->kids[m->nkids++]));
        CT_TRY(ct_mask_mod_prefix_lm(8, &m->kids[m->nkids++]));
        CT_TRY(ct_mask_mod_noop(&m->kids[m->nkids++]));
        m->combined = m->any = true;
        break;
    case 8:
        CT_TRY(ct_mask_mod_causal(&m->kids[m->nkids++]));
        CT_TRY(ct_mask_mod_compile("(q + 2 * kv) % 5 != 2 || q == kv", NULL, 0, NULL, &m->kids[m->nkids++]));
        m->combined = m->any = true;
        break;
    }
    if (m->combined) CT_TRY(ct_mask_mod_and(m->kids, m->nkids, &m->all));
    if (c->score == 1) CT_TRY(ct_score_mod_softcap(2.5f, &m->sm));
    if (c->score == 2) {
        float sl[2] = {0.5f, 0.125f}; /* 2 slopes over Hq heads: h % 2 */
        CT_TRY(ct_score_mod_alibi(2, sl, &m->sm));
    }
    if (c->score == 3) {
        for (int i = 0; i < TAB_LEN; i++) g_tab[i] = 0.05f * (float)((i * 7) % 11) - 0.25f;
        ct_jit_binding tb = {"tab", CT_DTYPE_F32, 2, {2, 17}, g_tab, true};
        CT_TRY(ct_score_mod_compile("score + tab[h % 2, clamp(q - kv + 8, 0, 16)]", &tb, 1, NULL, &m->sm));
    }
    m->has_sm = c->score != 0;
    return CT_OK;
}

static void mods_free(mods *m)
{
    if (m->any) ct_mask_mod_free(&m->all);
    for (int i = 0; i < m->nkids; i++) ct_mask_mod_free(&m->kids[i]);
    if (m->has_sm) ct_score_mod_free(&m->sm);
    free(m->docs);
}

/* ---- device tensors ------------------------------------------------------------------------ */

typedef struct dten {
    ct_buffer *buf;
    ct_tensor t;
    int64_t n[4]; /* [B, H, L, E] */
    ct_dtype dt;
} dten;

/* A [B, H, L, E] tensor in d's memory laid out [B, L, H, E] (blhe) or [B, H, L, E], filled
 * from host (f32 values of [B, H, L, E], converted to dt) or zero. */
static ct_status dten_make(ct_device *d, const float *host, ct_dtype dt, const int64_t n[4], bool blhe,
                           dten *o)
{
    memset(o, 0, sizeof *o);
    memcpy(o->n, n, sizeof o->n);
    o->dt = dt;
    size_t cnt = (size_t)(n[0] * n[1] * n[2] * n[3]), es = ct_dtype_size(dt);
    CT_TRY(ct_buffer_zeros(d, cnt * es + 64, &o->buf));
    int64_t st[4];
    if (blhe) st[3] = 1, st[1] = n[3], st[2] = n[1] * n[3], st[0] = n[2] * st[2];
    else st[3] = 1, st[2] = n[3], st[1] = n[2] * n[3], st[0] = n[1] * st[1];
    CT_TRY(ct_tensor_wrap_buffer(&o->t, o->buf, 0, dt, 4, n, st));
    if (!host) return CT_OK;
    char *tmp = malloc(cnt * es + 1);
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t h = 0; h < n[1]; h++)
            for (int64_t l = 0; l < n[2]; l++)
                for (int64_t e = 0; e < n[3]; e++) {
                    float x = host[((b * n[1] + h) * n[2] + l) * n[3] + e];
                    size_t at = (size_t)(b * st[0] + h * st[1] + l * st[2] + e);
                    if (dt == CT_DTYPE_BF16) ((uint16_t *)tmp)[at] = ct_f32_to_bf16(x);
                    else ((float *)tmp)[at] = x;
                }
    ct_status s = ct_buffer_write(o->buf, 0, tmp, cnt * es);
    free(tmp);
    return s;
}

/* Read back as f32 [B, H, L, E]. */
static ct_status dten_read(const dten *o, float *host)
{
    const int64_t *n = o->n;
    size_t cnt = (size_t)(n[0] * n[1] * n[2] * n[3]), es = ct_dtype_size(o->dt);
    char *tmp = malloc(cnt * es + 1);
    ct_status s = ct_buffer_read(o->buf, 0, tmp, cnt * es);
    for (int64_t b = 0; b < n[0] && s == CT_OK; b++)
        for (int64_t h = 0; h < n[1]; h++)
            for (int64_t l = 0; l < n[2]; l++)
                for (int64_t e = 0; e < n[3]; e++) {
                    size_t at = (size_t)(b * o->t.strides[0] + h * o->t.strides[1] + l * o->t.strides[2] + e);
                    host[((b * n[1] + h) * n[2] + l) * n[3] + e] =
                        o->dt == CT_DTYPE_BF16 ? ct_bf16_to_f32(((uint16_t *)tmp)[at]) : ((float *)tmp)[at];
                }
    free(tmp);
    return s;
}

static void dten_free(dten *o)
{
    ct_buffer_free(o->buf);
    memset(o, 0, sizeof *o);
}

/* An lse [B, H, L] f32 buffer. */
static ct_status lse_make(ct_device *d, int64_t B, int64_t H, int64_t L, dten *o)
{
    memset(o, 0, sizeof *o);
    o->n[0] = B, o->n[1] = H, o->n[2] = L, o->n[3] = 1;
    o->dt = CT_DTYPE_F32;
    CT_TRY(ct_buffer_zeros(d, (size_t)(B * H * L) * 4 + 64, &o->buf));
    int64_t shape[3] = {B, H, L};
    return ct_tensor_wrap_buffer(&o->t, o->buf, 0, CT_DTYPE_F32, 3, shape, NULL);
}

/* ---- the host oracle ----------------------------------------------------------------------- */

typedef struct result {
    float *out, *lse, *dq, *dk, *dv; /* f32 values, [B, H, L, E] / [B, H, L] */
    float pg[TAB_LEN];               /* the score mod's parameter gradient (compiled: the table's) */
} result;

/* fo with its score mod's parameter gradient going to r->pg (zeroed). */
static ct_flex_options with_pg(const ct_flex_options *fo, ct_score_mod *copy, result *r)
{
    ct_flex_options o = *fo;
    memset(r->pg, 0, sizeof r->pg);
    if (fo->score_mod && fo->score_mod->param_len > 0 && fo->score_mod->param_len <= TAB_LEN) {
        *copy = *fo->score_mod;
        copy->param_grad = r->pg;
        o.score_mod = copy;
    }
    return o;
}

static void result_free(result *r)
{
    free(r->out), free(r->lse), free(r->dq), free(r->dk), free(r->dv);
    memset(r, 0, sizeof *r);
}

static void to_dtype(void *dst, const float *src, size_t n, ct_dtype dt)
{
    if (dt == CT_DTYPE_BF16) ct_convert_f32_to_bf16(dst, src, n);
    else memcpy(dst, src, n * 4);
}

static void from_dtype(float *dst, const void *src, size_t n, ct_dtype dt)
{
    if (dt == CT_DTYPE_BF16) ct_convert_bf16_to_f32(dst, src, n);
    else memcpy(dst, src, n * 4);
}

/* ct_flex_attention_forward / _backward over contiguous host tensors of dtype dt. */
static ct_status oracle(const fcase *c, ct_dtype dt, const float *q, const float *k, const float *v,
                        const float *dout, const ct_block_mask *bm, const ct_flex_options *fo, result *r)
{
    int64_t qs[4] = {c->B, c->Hq, c->L, c->E}, ks[4] = {c->B, c->Hkv, c->L, c->E}, ls[3] = {c->B, c->Hq, c->L};
    size_t nq = (size_t)(c->B * c->Hq * c->L * c->E), nk = (size_t)(c->B * c->Hkv * c->L * c->E);
    size_t nl = (size_t)(c->B * c->Hq * c->L), es = ct_dtype_size(dt);
    char *hq = malloc(nq * es), *hk = malloc(nk * es), *hv = malloc(nk * es), *ho = malloc(nq * es);
    char *hd = malloc(nq * es), *gq = malloc(nq * es), *gk = malloc(nk * es), *gv = malloc(nk * es);
    to_dtype(hq, q, nq, dt), to_dtype(hk, k, nk, dt), to_dtype(hv, v, nk, dt), to_dtype(hd, dout, nq, dt);
    r->out = malloc(nq * 4), r->lse = malloc(nl * 4), r->dq = malloc(nq * 4), r->dk = malloc(nk * 4),
    r->dv = malloc(nk * 4);
    ct_tensor tq, tk, tv, to, tl, td, tdq, tdk, tdv;
    ct_tensor_wrap(&tq, hq, dt, 4, qs, NULL), ct_tensor_wrap(&tk, hk, dt, 4, ks, NULL);
    ct_tensor_wrap(&tv, hv, dt, 4, ks, NULL), ct_tensor_wrap(&to, ho, dt, 4, qs, NULL);
    ct_tensor_wrap(&tl, r->lse, CT_DTYPE_F32, 3, ls, NULL), ct_tensor_wrap(&td, hd, dt, 4, qs, NULL);
    ct_tensor_wrap(&tdq, gq, dt, 4, qs, NULL), ct_tensor_wrap(&tdk, gk, dt, 4, ks, NULL);
    ct_tensor_wrap(&tdv, gv, dt, 4, ks, NULL);
    ct_score_mod smc;
    ct_flex_options o = with_pg(fo, &smc, r);
    ct_status s = ct_flex_attention_forward(&tq, &tk, &tv, bm, &o, &to, &tl);
    if (s == CT_OK) s = ct_flex_attention_backward(&tq, &tk, &tv, &to, &tl, &td, bm, &o, &tdq, &tdk, &tdv);
    from_dtype(r->out, ho, nq, dt), from_dtype(r->dq, gq, nq, dt), from_dtype(r->dk, gk, nk, dt);
    from_dtype(r->dv, gv, nk, dt);
    free(hq), free(hk), free(hv), free(ho), free(hd), free(gq), free(gk), free(gv);
    return s;
}

/* The API on device d: inputs in [B, L, H, E] device buffers; mask a handle for d (or NULL). */
static ct_status on_device(ct_device *d, const fcase *c, ct_dtype dt, const float *q, const float *k,
                           const float *v, const float *dout, const ct_device_block_mask *mask,
                           const ct_flex_options *fo, result *r)
{
    int64_t qs[4] = {c->B, c->Hq, c->L, c->E}, ks[4] = {c->B, c->Hkv, c->L, c->E};
    size_t nq = (size_t)(c->B * c->Hq * c->L * c->E), nk = (size_t)(c->B * c->Hkv * c->L * c->E);
    size_t nl = (size_t)(c->B * c->Hq * c->L);
    dten tq, tk, tv, to, tl, td, tdq, tdk, tdv;
    ct_status s = dten_make(d, q, dt, qs, true, &tq);
    if (s == CT_OK) s = dten_make(d, k, dt, ks, true, &tk);
    if (s == CT_OK) s = dten_make(d, v, dt, ks, true, &tv);
    if (s == CT_OK) s = dten_make(d, dout, dt, qs, true, &td);
    if (s == CT_OK) s = dten_make(d, NULL, dt, qs, true, &to);
    if (s == CT_OK) s = dten_make(d, NULL, dt, qs, true, &tdq);
    if (s == CT_OK) s = dten_make(d, NULL, dt, ks, true, &tdk);
    if (s == CT_OK) s = dten_make(d, NULL, dt, ks, true, &tdv);
    if (s == CT_OK) s = lse_make(d, c->B, c->Hq, c->L, &tl);
    ct_score_mod smc;
    ct_flex_options o = with_pg(fo, &smc, r);
    if (s == CT_OK) s = ct_device_flex_attention_forward(d, &tq.t, &tk.t, &tv.t, mask, &o, &to.t, &tl.t);
    if (s == CT_OK)
        s = ct_device_flex_attention_backward(d, &tq.t, &tk.t, &tv.t, &to.t, &tl.t, &td.t, mask, &o, &tdq.t,
                                              &tdk.t, &tdv.t);
    if (s == CT_OK) s = ct_device_sync(d);
    r->out = malloc(nq * 4), r->lse = malloc(nl * 4), r->dq = malloc(nq * 4), r->dk = malloc(nk * 4),
    r->dv = malloc(nk * 4);
    if (s == CT_OK) s = dten_read(&to, r->out);
    if (s == CT_OK) s = ct_buffer_read(tl.buf, 0, r->lse, nl * 4);
    if (s == CT_OK) s = dten_read(&tdq, r->dq);
    if (s == CT_OK) s = dten_read(&tdk, r->dk);
    if (s == CT_OK) s = dten_read(&tdv, r->dv);
    dten_free(&tq), dten_free(&tk), dten_free(&tv), dten_free(&to), dten_free(&tl), dten_free(&td);
    dten_free(&tdq), dten_free(&tdk), dten_free(&tdv);
    return s;
}

/* ---- comparisons ----------------------------------------------------------------------------- */

static bool same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* |got - ref| <= rtol (|ref| + rms(ref)); infinities equal, NaN nowhere. */
static bool close_to(const float *got, const float *ref, size_t n, double rtol, const char *what)
{
    double ss = 0;
    size_t fin = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i])) ss += (double)ref[i] * ref[i], fin++;
    double rms = fin ? sqrt(ss / (double)fin) : 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(ref[i]) || !isfinite(got[i])) {
            if (got[i] != ref[i]) {
                fprintf(stderr, "  %s[%zu]: %g vs %g\n", what, i, got[i], ref[i]);
                return false;
            }
            continue;
        }
        double e = fabs((double)got[i] - ref[i]), lim = rtol * (fabs((double)ref[i]) + rms) + 1e-30;
        if (e > lim) {
            fprintf(stderr, "  %s[%zu]: %.9g vs %.9g (|diff| %.3g > %.3g)\n", what, i, got[i], ref[i], e, lim);
            return false;
        }
    }
    return true;
}

static bool result_cmp(const fcase *c, const result *a, const result *b, bool bitwise, double rtol,
                       const char *what)
{
    size_t nq = (size_t)(c->B * c->Hq * c->L * c->E), nk = (size_t)(c->B * c->Hkv * c->L * c->E);
    size_t nl = (size_t)(c->B * c->Hq * c->L);
    const float *x[6] = {a->out, a->lse, a->dq, a->dk, a->dv, a->pg};
    const float *y[6] = {b->out, b->lse, b->dq, b->dk, b->dv, b->pg};
    size_t n[6] = {nq, nl, nq, nk, nk, TAB_LEN};
    static const char *names[6] = {"out", "lse", "dq", "dk", "dv", "param_grad"};
    bool ok = true;
    for (int i = 0; i < 6; i++) {
        char w[240];
        snprintf(w, sizeof w, "%.200s %s", what, names[i]);
        bool o = bitwise ? same_bits(x[i], y[i], n[i]) : close_to(x[i], y[i], n[i], i == 1 ? 1e-4 : rtol, w);
        if (!o) fprintf(stderr, "  %s: %s differs%s\n", what, names[i], bitwise ? " (bits)" : "");
        ok = ok && o;
    }
    return ok;
}

/* ---- the cases ---------------------------------------------------------------------------------- */

static void run_cases(ct_device *d, bool gpu)
{
    for (int ci = 0; ci < LEN(cases); ci++)
        for (int di = 0; di < 2; di++) {
            const fcase *c = &cases[ci];
            ct_dtype dt = di ? CT_DTYPE_BF16 : CT_DTYPE_F32;
            char what[200];
            snprintf(what, sizeof what, "%s: %s %s", ct_device_name(d), c->name, ct_dtype_name(dt));
            size_t nq = (size_t)(c->B * c->Hq * c->L * c->E), nk = (size_t)(c->B * c->Hkv * c->L * c->E);
            float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
            t_fill(q, nq, -2, 2), t_fill(k, nk, -2, 2), t_fill(v, nk, -1, 1), t_fill(dout, nq, -1, 1);
            mods m;
            ct_block_mask *bm = NULL;
            ct_device_block_mask *hm = NULL;
            ct_status s = mods_make(c, &m);
            if (s == CT_OK && m.any) s = ct_block_mask_create(&m.all, c->B, c->Hq, c->L, c->L, c->bs, &bm);
            if (s == CT_OK && bm) s = ct_device_block_mask_upload(d, bm, &hm);
            ct_flex_options fo = ct_flex_options_default();
            if (m.has_sm) fo.score_mod = &m.sm;
            result ref = {0}, got = {0}, again = {0};
            if (s == CT_OK) s = oracle(c, dt, q, k, v, dout, bm, &fo, &ref);
            if (s == CT_OK) s = on_device(d, c, dt, q, k, v, dout, hm, &fo, &got);
            CHECK_OK(s);
            if (s == CT_OK) {
                t_checks++;
                if (!result_cmp(c, &got, &ref, !gpu, dt == CT_DTYPE_BF16 ? 2e-2 : 2e-4, what)) {
                    t_failures++;
                    fprintf(stderr, "%s: the device's results differ from ct_flex_attention_*\n", what);
                }
                for (int rep = 0; rep < (gpu ? 2 : 1); rep++) {
                    CHECK_OK(on_device(d, c, dt, q, k, v, dout, hm, &fo, &again));
                    t_checks++;
                    if (!result_cmp(c, &again, &got, true, 0, what)) {
                        t_failures++;
                        fprintf(stderr, "%s: run %d differs from the first run\n", what, rep + 2);
                    }
                    result_free(&again);
                }
            }
            result_free(&ref), result_free(&got);
            ct_device_block_mask_free(hm);
            ct_block_mask_free(bm);
            mods_free(&m);
            free(q), free(k), free(v), free(dout);
        }
}

/* ---- bad input ------------------------------------------------------------------------------------ */

static void cb_tile(void *ctx, const ct_attn_tile *t, uint8_t *keep)
{
    (void)ctx;
    for (int64_t j = 0; j < t->nkv; j++)
        for (int64_t i = 0; i < t->nq; i++) keep[i * t->q_stride + j * t->kv_stride] = t->q0 + i >= t->kv0 + j;
}

static void cb_score(void *ctx, const ct_attn_tile *t, float *s)
{
    (void)ctx, (void)t, (void)s;
}

#define EXPECT(expr, want, text)                                                                   \
    do {                                                                                           \
        ct_clear_error();                                                                          \
        ct_status s_ = (expr);                                                                     \
        t_checks++;                                                                                \
        if (s_ != (want) || !strstr(ct_last_error(), (text))) {                                    \
            t_failures++;                                                                          \
            fprintf(stderr, "%s:%d: %s: %s '%s' (want %s naming '%s')\n", __FILE__, __LINE__, #expr, \
                    ct_status_name(s_), ct_last_error(), ct_status_name(want), (text));            \
        }                                                                                          \
    } while (0)

static void bad_input(ct_device *d, bool gpu, ct_device *other)
{
    const int64_t B = 1, H = 2, L = 40, E = 8;
    int64_t qs[4] = {B, H, L, E}, q2[4] = {B, H, L + 1, E}, k3[4] = {B, 3, L, E};
    dten q, o, lse, qn, q32, qs2, k3t;
    /* values for the largest of the tensors below (k3: 3 heads; q2: L + 1 rows) */
    const size_t nx = (size_t)(B * 3 * (L + 1) * E);
    float *x = malloc(nx * 4);
    t_fill(x, nx, -1, 1);
    CHECK_OK(dten_make(d, x, CT_DTYPE_F32, qs, true, &q));
    CHECK_OK(dten_make(d, NULL, CT_DTYPE_F32, qs, true, &o));
    CHECK_OK(lse_make(d, B, H, L, &lse));
    CHECK_OK(dten_make(d, x, CT_DTYPE_F32, qs, false, &qn));   /* contiguous [B, H, L, E] */
    CHECK_OK(dten_make(d, x, CT_DTYPE_BF16, qs, true, &q32));  /* bf16 */
    CHECK_OK(dten_make(d, x, CT_DTYPE_F32, q2, true, &qs2));   /* L + 1 */
    CHECK_OK(dten_make(d, x, CT_DTYPE_F32, k3, true, &k3t));   /* 3 kv heads */
    ct_mask_mod causal, other_m, orm, cb = {cb_tile, NULL, NULL, NULL, false, false};
    CHECK_OK(ct_mask_mod_causal(&causal));
    CHECK_OK(ct_mask_mod_prefix_lm(4, &other_m));
    ct_mask_mod two[2] = {causal, other_m};
    CHECK_OK(ct_mask_mod_or(two, 2, &orm));
    ct_block_mask *bm = NULL, *bm_or = NULL, *bm_cb = NULL, *bm41 = NULL, *bm_rect = NULL;
    CHECK_OK(ct_block_mask_create(&causal, 1, 1, L, L, 64, &bm));
    CHECK_OK(ct_block_mask_create(&orm, 1, 1, L, L, 64, &bm_or));
    CHECK_OK(ct_block_mask_create(&cb, 1, 1, L, L, 64, &bm_cb));
    CHECK_OK(ct_block_mask_create(&causal, 1, 1, L + 1, L + 1, 64, &bm41));
    CHECK_OK(ct_block_mask_create(&causal, 1, 1, L, L + 1, 64, &bm_rect));
    ct_device_block_mask *hm = NULL, *hm41 = NULL, *hm_other = NULL, *tmp = NULL;
    CHECK_OK(ct_device_block_mask_upload(d, bm, &hm));
    CHECK_OK(ct_device_block_mask_upload(d, bm41, &hm41));
    if (other) CHECK_OK(ct_device_block_mask_upload(other, bm, &hm_other));
    const char *fn = "ct_device_flex_attention_forward";

    /* NULLs */
    EXPECT(ct_device_flex_attention_forward(NULL, &q.t, &q.t, &q.t, hm, NULL, &o.t, &lse.t), CT_EINVAL, "d must not");
    EXPECT(ct_device_flex_attention_forward(d, NULL, &q.t, &q.t, hm, NULL, &o.t, &lse.t), CT_EINVAL, "must not be NULL");
    EXPECT(ct_device_flex_attention_forward(d, &q.t, &q.t, &q.t, hm, NULL, NULL, &lse.t), CT_EINVAL, "out");
    EXPECT(ct_device_flex_attention_backward(d, &q.t, &q.t, &q.t, &o.t, &lse.t, NULL, hm, NULL, &o.t, NULL, NULL),
           CT_EINVAL, "dout");
    EXPECT(ct_device_block_mask_upload(d, NULL, &tmp), CT_EINVAL, "must not be NULL");
    EXPECT(ct_device_block_mask_upload(d, bm, NULL), CT_EINVAL, "out must not");
    EXPECT(ct_device_block_mask_upload(NULL, bm, &tmp), CT_EINVAL, "must not be NULL");
    CHECK(tmp == NULL);
    ct_device_block_mask_free(NULL);
    /* the checks ct_flex_attention_forward makes */
    EXPECT(ct_device_flex_attention_forward(d, &q.t, &k3t.t, &k3t.t, NULL, NULL, &o.t, &lse.t), CT_EINVAL,
           "multiple of key/value heads");
    EXPECT(ct_device_flex_attention_forward(d, &q.t, &q.t, &q.t, hm41, NULL, &o.t, &lse.t), CT_EINVAL, "Q_LEN=41");
    ct_flex_options fo = ct_flex_options_default();
    fo.scale = NAN;
    EXPECT(ct_device_flex_attention_forward(d, &q.t, &q.t, &q.t, hm, &fo, &o.t, &lse.t), CT_EINVAL, "scale");
    EXPECT(ct_device_flex_attention_forward(d, &q.t, &q32.t, &q32.t, hm, NULL, &o.t, &lse.t), CT_EINVAL, "bf16");
    EXPECT(ct_device_flex_attention_forward(d, &q.t, &q.t, &q.t, hm, NULL, &qs2.t, &lse.t), CT_EINVAL, "shape[2]");
    /* device mismatch: a handle or a buffer of another device */
    if (other) {
        EXPECT(ct_device_flex_attention_forward(d, &q.t, &q.t, &q.t, hm_other, NULL, &o.t, &lse.t), CT_EINVAL,
               "uploaded to");
        dten oq;
        CHECK_OK(dten_make(other, x, CT_DTYPE_F32, qs, true, &oq));
        EXPECT(ct_device_flex_attention_forward(d, &oq.t, &q.t, &q.t, hm, NULL, &o.t, &lse.t), CT_EINVAL,
               "q is in a buffer of");
        EXPECT(ct_device_flex_attention_backward(d, &q.t, &q.t, &q.t, &o.t, &lse.t, &q.t, hm, NULL, NULL, &oq.t,
                                                 NULL),
               CT_EINVAL, "dk is in a buffer of");
        dten_free(&oq);
    }
    CHECK(ct_device_block_mask_device(hm) == d && ct_device_block_mask_host(hm) == bm);
    if (gpu) {
        /* the GPU's own rules */
        EXPECT(ct_device_flex_attention_forward(d, &qn.t, &q.t, &q.t, hm, NULL, &o.t, &lse.t), CT_EINVAL,
               "contiguous [B, L, H, E]");
        EXPECT(ct_device_flex_attention_forward(d, &q.t, &qs2.t, &qs2.t, NULL, NULL, &o.t, &lse.t),
               CT_EUNSUPPORTED, "L == S");
        EXPECT(ct_device_block_mask_upload(d, bm_rect, &tmp), CT_EUNSUPPORTED, "KV_LEN");
        EXPECT(ct_device_flex_attention_forward(d, &q32.t, &q32.t, &q32.t, hm, NULL, &o.t, &lse.t), CT_EINVAL,
               "out must be bf16");
        EXPECT(ct_device_block_mask_upload(d, bm_or, &tmp), CT_EUNSUPPORTED, "ct_mask_mod_or");
        EXPECT(ct_device_block_mask_upload(d, bm_cb, &tmp), CT_EUNSUPPORTED, "callback");
        EXPECT(ct_device_block_mask_upload(d, bm_cb, &tmp), CT_EUNSUPPORTED, "compile");
        CHECK(tmp == NULL);
        float table[9] = {0};
        ct_score_mod rb, cbs = {cb_score, NULL, NULL, NULL, NULL, 0};
        CHECK_OK(ct_score_mod_relative_bias(table, 0, 9, 4, NULL, &rb));
        fo = ct_flex_options_default();
        fo.score_mod = &rb;
        EXPECT(ct_device_flex_attention_forward(d, &q.t, &q.t, &q.t, hm, &fo, &o.t, &lse.t), CT_EUNSUPPORTED,
               "relative_bias");
        fo.score_mod = &cbs;
        EXPECT(ct_device_flex_attention_forward(d, &q.t, &q.t, &q.t, hm, &fo, &o.t, &lse.t), CT_EUNSUPPORTED,
               "callback of your own");
        ct_score_mod_free(&rb);
        /* a compiled mod's indices are range-checked for the call's sizes */
        ct_score_mod jm;
        float small[4] = {0};
        ct_jit_binding sb = {"t", CT_DTYPE_F32, 1, {4}, small, false};
        ct_status js = ct_score_mod_compile("score + t[q]", &sb, 1, NULL, &jm);
        CHECK_OK(js);
        if (js == CT_OK) {
            fo.score_mod = &jm;
            EXPECT(ct_device_flex_attention_forward(d, &q.t, &q.t, &q.t, hm, &fo, &o.t, &lse.t), CT_EINVAL,
                   "'t'");
            ct_score_mod_free(&jm);
        }
        /* the lse may be left out; a raw device pointer (no buffer) is taken */
        ct_tensor raw = q.t;
        raw.buffer = NULL;
        CHECK_OK(ct_device_flex_attention_forward(d, &raw, &q.t, &q.t, hm, NULL, &o.t, NULL));
    } else {
        /* the CPU takes any mods and layouts (ct_flex_attention_forward's rules) */
        CHECK_OK(ct_device_block_mask_upload(d, bm_cb, &tmp));
        CHECK_OK(ct_device_flex_attention_forward(d, &qn.t, &q.t, &q.t, tmp, NULL, &o.t, NULL));
        ct_device_block_mask_free(tmp);
        tmp = NULL;
    }
    (void)fn;
    ct_device_block_mask_free(hm), ct_device_block_mask_free(hm41), ct_device_block_mask_free(hm_other);
    ct_block_mask_free(bm), ct_block_mask_free(bm_or), ct_block_mask_free(bm_cb), ct_block_mask_free(bm41);
    ct_block_mask_free(bm_rect);
    ct_mask_mod_free(&orm), ct_mask_mod_free(&causal), ct_mask_mod_free(&other_m);
    dten_free(&q), dten_free(&o), dten_free(&lse), dten_free(&qn), dten_free(&q32), dten_free(&qs2);
    dten_free(&k3t);
    free(x);
}

int main(void)
{
    ct_device *cpu = ct_device_cpu();
    ct_device_options o = ct_device_options_default();
    CHECK_OK(ct_device_parse("cuda:0", &o));
    ct_device *g = NULL;
    if (ct_device_open(&o, &g) != CT_OK) {
        printf("SKIPPED: cuda: %s\n", ct_last_error());
        const char *req = getenv("CT_TEST_REQUIRE_CUDA");
        if (req && !strcmp(req, "1")) {
            fprintf(stderr, "CT_TEST_REQUIRE_CUDA=1 and no CUDA device opened\n");
            t_failures++;
        }
        g = NULL;
    }
    run_cases(cpu, false);
    bad_input(cpu, false, g);
    if (g) {
        run_cases(g, true);
        bad_input(g, true, cpu);
        ct_memory_stats_t ms;
        ct_device_memory_stats(g, &ms);
        CHECK(ms.current_bytes == 0); /* every buffer and upload freed */
        CHECK_OK(ct_device_close(g));
    }
    return t_report("test_device_flex");
}
