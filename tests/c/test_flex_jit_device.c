/* Compiled (jit) flex mods on every device present (src/device/flex_jit.c with the flex slots):
 * the CPU always, "cuda:0" when it opens (the emulated device in test_flex_jit_device_emu;
 * else one "SKIPPED: cuda: <why>" line, a failure when CT_TEST_REQUIRE_CUDA=1).
 *
 * Oracle: ct_flex_attention_forward / _backward on the CPU with the same compiled mods, block
 * mask and dtype (host tensors [B, H, T, E]; the score mod's param_grad on the host). The device
 * runs ct_dev_flex_jit_create / _check / _bind, the slots flex_fwd / flex_bwd over device
 * buffers in the model's layout [B, T, H, E] (the mask: the slots' CAUSAL bit AND the compiled
 * mask), then _collect: out, lse, dq, dk, dv and the parameter gradients. On the CPU device the
 * results must be those bits; on a GPU within rtol * (|ref| + rms(ref)) (f32 2e-4, bf16 2e-2;
 * lse 1e-4) and three runs the same bits. Then: the module served from this process's table
 * while a handle holds it, from the disk cache after it was released, rebuilt when the cache
 * entry is damaged; bad input refused by name; every device byte given back. */
#include "device/device_internal.h"
#include "test_util.h"

#include <glob.h>
#include <stdint.h>
#include <unistd.h>

enum { B = 2, H = 4, HK = 2, T = 80, E = 32, BS = 64 };

static float g_bias[H][2 * T - 1]; /* f32, gradient */
static float g_temp[1];            /* f32 scalar, gradient */
static float g_tab[2][16];         /* f32, gradient */
static int32_t g_doc[T];           /* i32 */

typedef struct jcase {
    const char *name;
    const char *mask;  /* compiled mask mod (ANDed with causal), NULL: causal alone */
    const char *score; /* compiled score mod, NULL: none */
} jcase;

static const jcase cases[] = {
    {"mask", "(q - kv) % 3 != 0 || q - kv < 5", NULL},
    {"score with a bias table", NULL, "score + bias[h, q - kv + 79]"},
    {"mask and score", "doc[q] == doc[kv]", "score * temp + tab[h % 2, abs(q - kv) % 16] * 2"},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static ct_jit_binding bindings[] = {
    {"bias", CT_DTYPE_F32, 2, {H, 2 * T - 1}, g_bias, true},
    {"temp", CT_DTYPE_F32, 0, {0}, g_temp, true},
    {"tab", CT_DTYPE_F32, 2, {2, 16}, g_tab, true},
    {"doc", CT_DTYPE_I32, 1, {T}, g_doc, false},
};

typedef struct mods {
    ct_mask_mod causal, user, all;
    bool has_user;
    ct_score_mod sm;
    bool has_sm;
    ct_block_mask *bm;
} mods;

static ct_status mods_make(const jcase *c, mods *m)
{
    memset(m, 0, sizeof *m);
    CT_TRY(ct_mask_mod_causal(&m->causal));
    if (c->mask) {
        CT_TRY(ct_mask_mod_compile(c->mask, &bindings[3], 1, NULL, &m->user));
        m->has_user = true;
        ct_mask_mod two[2] = {m->causal, m->user};
        CT_TRY(ct_mask_mod_and(two, 2, &m->all));
    }
    if (c->score) {
        CT_TRY(ct_score_mod_compile(c->score, bindings, 3, NULL, &m->sm));
        m->has_sm = true;
    }
    return ct_block_mask_create(c->mask ? &m->all : &m->causal, B, H, T, T, BS, &m->bm);
}

static void mods_free(mods *m)
{
    ct_block_mask_free(m->bm);
    if (m->has_user) ct_mask_mod_free(&m->all), ct_mask_mod_free(&m->user);
    ct_mask_mod_free(&m->causal);
    if (m->has_sm) ct_score_mod_free(&m->sm);
}

typedef struct result {
    float *out, *lse, *dq, *dk, *dv, *pg; /* [B, H, T, E] / [B, H, T] / [param_len] */
} result;

static void result_free(result *r)
{
    free(r->out), free(r->lse), free(r->dq), free(r->dk), free(r->dv), free(r->pg);
    memset(r, 0, sizeof *r);
}

static const size_t NQ = (size_t)B * H * T * E, NK = (size_t)B * HK * T * E, NL = (size_t)B * H * T;

/* f32 [B, heads, T, E] values rounded through dt (bf16: to its values). */
static void round_to(float *x, size_t n, ct_dtype dt)
{
    if (dt == CT_DTYPE_BF16)
        for (size_t i = 0; i < n; i++) x[i] = ct_bf16_to_f32(ct_f32_to_bf16(x[i]));
}

/* The CPU oracle: contiguous [B, heads, T, E] host tensors of dt. */
static ct_status oracle(ct_dtype dt, const float *q, const float *k, const float *v, const float *dout,
                        mods *m, result *r)
{
    int64_t qs[4] = {B, H, T, E}, ks[4] = {B, HK, T, E}, ls[3] = {B, H, T};
    size_t es = ct_dtype_size(dt);
    char *hq = malloc(NQ * es), *hk = malloc(NK * es), *hv = malloc(NK * es), *ho = malloc(NQ * es);
    char *hd = malloc(NQ * es), *gq = malloc(NQ * es), *gk = malloc(NK * es), *gv = malloc(NK * es);
    void *src[4] = {hq, hk, hv, hd};
    const float *from[4] = {q, k, v, dout};
    size_t cnt[4] = {NQ, NK, NK, NQ};
    for (int i = 0; i < 4; i++) {
        if (dt == CT_DTYPE_BF16) ct_convert_f32_to_bf16(src[i], from[i], cnt[i]);
        else memcpy(src[i], from[i], cnt[i] * 4);
    }
    int64_t pl = m->has_sm ? m->sm.param_len : 0;
    r->out = malloc(NQ * 4), r->lse = malloc(NL * 4), r->dq = malloc(NQ * 4), r->dk = malloc(NK * 4);
    r->dv = malloc(NK * 4), r->pg = calloc((size_t)pl + 1, 4);
    ct_tensor tq, tk, tv, to, tl, td, tdq, tdk, tdv;
    ct_tensor_wrap(&tq, hq, dt, 4, qs, NULL), ct_tensor_wrap(&tk, hk, dt, 4, ks, NULL);
    ct_tensor_wrap(&tv, hv, dt, 4, ks, NULL), ct_tensor_wrap(&to, ho, dt, 4, qs, NULL);
    ct_tensor_wrap(&tl, r->lse, CT_DTYPE_F32, 3, ls, NULL), ct_tensor_wrap(&td, hd, dt, 4, qs, NULL);
    ct_tensor_wrap(&tdq, gq, dt, 4, qs, NULL), ct_tensor_wrap(&tdk, gk, dt, 4, ks, NULL);
    ct_tensor_wrap(&tdv, gv, dt, 4, ks, NULL);
    ct_flex_options fo = ct_flex_options_default();
    if (m->has_sm) {
        m->sm.param_grad = pl ? r->pg : NULL;
        fo.score_mod = &m->sm;
    }
    ct_status s = ct_flex_attention_forward(&tq, &tk, &tv, m->bm, &fo, &to, &tl);
    if (s == CT_OK) s = ct_flex_attention_backward(&tq, &tk, &tv, &to, &tl, &td, m->bm, &fo, &tdq, &tdk, &tdv);
    void *res[4] = {ho, gq, gk, gv};
    float *into[4] = {r->out, r->dq, r->dk, r->dv};
    size_t rc[4] = {NQ, NQ, NK, NK};
    for (int i = 0; i < 4; i++) {
        if (dt == CT_DTYPE_BF16) ct_convert_bf16_to_f32(into[i], res[i], rc[i]);
        else memcpy(into[i], res[i], rc[i] * 4);
    }
    if (m->has_sm) m->sm.param_grad = NULL;
    free(hq), free(hk), free(hv), free(ho), free(hd), free(gq), free(gk), free(gv);
    return s;
}

/* [B, heads, T, E] f32 <-> the device's [B, T, heads, E] of dt. */
static ct_status upload(ct_device *d, void *dst, const float *x, int64_t heads, ct_dtype dt)
{
    size_t n = (size_t)B * heads * T * E, es = ct_dtype_size(dt);
    char *tmp = malloc(n * es);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t e = 0; e < E; e++) {
                    float v = x[((b * heads + h) * T + t) * E + e];
                    size_t at = (size_t)(((b * T + t) * heads + h) * E + e);
                    if (dt == CT_DTYPE_BF16) ((uint16_t *)tmp)[at] = ct_f32_to_bf16(v);
                    else ((float *)tmp)[at] = v;
                }
    ct_status s = ct_dev_h2d(d, dst, tmp, n * es);
    free(tmp);
    return s;
}

static ct_status download(ct_device *d, float *x, const void *src, int64_t heads, ct_dtype dt)
{
    size_t n = (size_t)B * heads * T * E, es = ct_dtype_size(dt);
    char *tmp = malloc(n * es);
    ct_status s = ct_dev_d2h(d, tmp, src, n * es);
    for (int64_t b = 0; b < B && s == CT_OK; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t e = 0; e < E; e++) {
                    size_t at = (size_t)(((b * T + t) * heads + h) * E + e);
                    x[((b * heads + h) * T + t) * E + e] =
                        dt == CT_DTYPE_BF16 ? ct_bf16_to_f32(((uint16_t *)tmp)[at]) : ((float *)tmp)[at];
                }
    free(tmp);
    return s;
}

static ct_status slots(ct_device *d, const ct_flex_args *f, const ct_attn_grads *g)
{
    CT_DEV(d, flex_fwd, f);
    CT_DEV(d, flex_bwd, f, g);
    return CT_OK;
}

/* The device run: j bound with parameter gradients, the slots, collect. */
static ct_status on_device(ct_device *d, ct_dev_flex_jit *j, ct_dtype dt, const float *q, const float *k,
                           const float *v, const float *dout, mods *m, result *r)
{
    size_t es = ct_dtype_size(dt);
    void *dq_ = NULL, *dk_ = NULL, *dv_ = NULL, *dd = NULL, *dout_ = NULL, *dgq = NULL, *dgk = NULL,
         *dgv = NULL;
    float *dlse = NULL;
    ct_dev_block_mask dbm;
    memset(&dbm, 0, sizeof dbm);
    int64_t pl = m->has_sm ? m->sm.param_len : 0;
    r->out = malloc(NQ * 4), r->lse = malloc(NL * 4), r->dq = malloc(NQ * 4), r->dk = malloc(NK * 4);
    r->dv = malloc(NK * 4), r->pg = calloc((size_t)pl + 1, 4);
    ct_status s = ct_dev_alloc(d, NQ * es, "q", &dq_);
    if (!s) s = ct_dev_alloc(d, NK * es, "k", &dk_);
    if (!s) s = ct_dev_alloc(d, NK * es, "v", &dv_);
    if (!s) s = ct_dev_alloc(d, NQ * es, "dout", &dd);
    if (!s) s = ct_dev_alloc(d, NQ * es, "out", &dout_);
    if (!s) s = ct_dev_alloc(d, NL * 4, "lse", (void **)&dlse);
    if (!s) s = ct_dev_alloc(d, NQ * es, "dq", &dgq);
    if (!s) s = ct_dev_alloc(d, NK * es, "dk", &dgk);
    if (!s) s = ct_dev_alloc(d, NK * es, "dv", &dgv);
    if (!s) s = upload(d, dq_, q, H, dt);
    if (!s) s = upload(d, dk_, k, HK, dt);
    if (!s) s = upload(d, dv_, v, HK, dt);
    if (!s) s = upload(d, dd, dout, H, dt);
    if (!s) s = ct_dev_block_mask_upload(d, m->bm, &dbm);
    ct_flex_args f;
    memset(&f, 0, sizeof f);
    f.attn = (ct_attn_args){B, T, H, HK, E, 1.0f / sqrtf((float)E), dq_, dk_, dv_, dout_, dlse, NULL, dt};
    f.block_mask = &dbm;
    f.mods.mask = CT_FLEX_MASK_CAUSAL;
    f.mods.score = CT_FLEX_SCORE_NONE;
    if (m->has_sm) m->sm.param_grad = pl ? r->pg : NULL;
    if (!s) s = ct_dev_flex_jit_bind(j, pl > 0, &f.mods);
    ct_attn_grads g = {dd, dgq, dgk, dgv};
    if (!s) s = slots(d, &f, &g);
    if (!s) s = ct_dev_flex_jit_collect(j);
    if (!s) s = ct_device_sync(d);
    if (!s) s = download(d, r->out, dout_, H, dt);
    if (!s) s = ct_dev_d2h(d, r->lse, dlse, NL * 4);
    if (!s) s = download(d, r->dq, dgq, H, dt);
    if (!s) s = download(d, r->dk, dgk, HK, dt);
    if (!s) s = download(d, r->dv, dgv, HK, dt);
    if (m->has_sm) m->sm.param_grad = NULL;
    ct_dev_block_mask_free(d, &dbm);
    ct_dev_free(d, dq_, NQ * es), ct_dev_free(d, dk_, NK * es), ct_dev_free(d, dv_, NK * es);
    ct_dev_free(d, dd, NQ * es), ct_dev_free(d, dout_, NQ * es), ct_dev_free(d, dlse, NL * 4);
    ct_dev_free(d, dgq, NQ * es), ct_dev_free(d, dgk, NK * es), ct_dev_free(d, dgv, NK * es);
    return s;
}

/* |got - ref| <= rtol (|ref| + rms(ref)); infinities equal. */
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

static bool result_cmp(const result *a, const result *b, size_t npg, bool bitwise, double rtol, const char *what)
{
    const float *x[6] = {a->out, a->lse, a->dq, a->dk, a->dv, a->pg}, *y[6] = {b->out, b->lse, b->dq, b->dk, b->dv, b->pg};
    size_t n[6] = {NQ, NL, NQ, NK, NK, npg};
    static const char *names[6] = {"out", "lse", "dq", "dk", "dv", "param_grad"};
    bool ok = true;
    for (int i = 0; i < 6; i++) {
        char w[240];
        snprintf(w, sizeof w, "%.200s %s", what, names[i]);
        bool o = bitwise ? memcmp(x[i], y[i], n[i] * 4) == 0 : close_to(x[i], y[i], n[i], i == 1 ? 1e-4 : rtol, w);
        if (!o) fprintf(stderr, "  %s: %s differs%s\n", what, names[i], bitwise ? " (bits)" : "");
        ok = ok && o;
    }
    return ok;
}

static void run_cases(ct_device *d, bool gpu)
{
    for (int ci = 0; ci < NCASES; ci++)
        for (int di = 0; di < 2; di++) {
            const jcase *c = &cases[ci];
            ct_dtype dt = di ? CT_DTYPE_BF16 : CT_DTYPE_F32;
            char what[200];
            snprintf(what, sizeof what, "%s: %s %s", ct_device_name(d), c->name, ct_dtype_name(dt));
            float *q = malloc(NQ * 4), *k = malloc(NK * 4), *v = malloc(NK * 4), *dout = malloc(NQ * 4);
            t_fill(q, NQ, -2, 2), t_fill(k, NK, -2, 2), t_fill(v, NK, -1, 1), t_fill(dout, NQ, -1, 1);
            round_to(q, NQ, dt), round_to(k, NK, dt), round_to(v, NK, dt), round_to(dout, NQ, dt);
            mods m;
            ct_dev_flex_jit *j = NULL;
            ct_status s = mods_make(c, &m);
            if (s == CT_OK)
                s = ct_dev_flex_jit_create(d, m.has_sm ? &m.sm : NULL, m.has_user ? &m.user : NULL, dt, E, &j);
            if (s == CT_OK) s = ct_dev_flex_jit_check(j, B, H, T, T);
            result ref = {0}, got = {0}, again = {0};
            if (s == CT_OK) s = oracle(dt, q, k, v, dout, &m, &ref);
            if (s == CT_OK) s = on_device(d, j, dt, q, k, v, dout, &m, &got);
            CHECK_OK(s);
            if (s == CT_OK) {
                size_t npg = m.has_sm ? (size_t)m.sm.param_len : 0;
                t_checks++;
                if (!result_cmp(&got, &ref, npg, !gpu, dt == CT_DTYPE_BF16 ? 2e-2 : 2e-4, what)) {
                    t_failures++;
                    fprintf(stderr, "%s: the device's results differ from ct_flex_attention_*\n", what);
                }
                for (int rep = 0; rep < (gpu ? 2 : 1); rep++) {
                    CHECK_OK(on_device(d, j, dt, q, k, v, dout, &m, &again));
                    t_checks++;
                    if (!result_cmp(&again, &got, npg, true, 0, what)) {
                        t_failures++;
                        fprintf(stderr, "%s: run %d differs from the first run\n", what, rep + 2);
                    }
                    result_free(&again);
                }
            }
            result_free(&ref), result_free(&got);
            ct_dev_flex_jit_free(j);
            mods_free(&m);
            free(q), free(k), free(v), free(dout);
        }
}

/* The module: from the table while a handle holds it, from the disk cache after release. */
static void cache(ct_device *d, bool gpu)
{
    mods m;
    CHECK_OK(mods_make(&cases[2], &m));
    ct_dev_flex_jit *a = NULL, *b = NULL;
    int64_t t0, c0, b0, t1, c1, b1, t2, c2, b2;
    ct_dev_flex_jit_stats(&t0, &c0, &b0);
    CHECK_OK(ct_dev_flex_jit_create(d, &m.sm, &m.user, CT_DTYPE_F32, E, &a));
    CHECK_OK(ct_dev_flex_jit_create(d, &m.sm, &m.user, CT_DTYPE_F32, E, &b));
    ct_dev_flex_jit_stats(&t1, &c1, &b1);
    ct_dev_flex_jit_free(a);
    ct_dev_flex_jit_free(b);
    CHECK_OK(ct_dev_flex_jit_create(d, &m.sm, &m.user, CT_DTYPE_F32, E, &a));
    ct_dev_flex_jit_stats(&t2, &c2, &b2);
    ct_dev_flex_jit_free(a);
    if (gpu) {
        CHECK(c1 + b1 == c0 + b0 + 1);   /* the first handle: loaded from the disk or built */
        CHECK(t1 == t0 + 1);             /* the second: the table */
        CHECK(c2 == c1 + 1 && b2 == b1); /* released, then created again: the disk cache */
        /* a damaged entry (one byte of every image flipped) is rebuilt, never loaded */
        glob_t gl;
        char pat[200];
        snprintf(pat, sizeof pat, "%s/*.cubin", getenv("CT_CACHE_DIR"));
        int n = 0;
        if (glob(pat, 0, NULL, &gl) == 0)
            for (size_t i = 0; i < gl.gl_pathc; i++) {
                FILE *f = fopen(gl.gl_pathv[i], "r+b");
                if (!f) continue;
                fseek(f, 100, SEEK_SET);
                int c = fgetc(f);
                fseek(f, 100, SEEK_SET);
                fputc(c ^ 0x5a, f);
                fclose(f);
                n++;
            }
        globfree(&gl);
        CHECK(n >= 1);
        int64_t t3, c3, b3;
        CHECK_OK(ct_dev_flex_jit_create(d, &m.sm, &m.user, CT_DTYPE_F32, E, &a));
        ct_dev_flex_jit_stats(&t3, &c3, &b3);
        CHECK(b3 == b2 + 1 && c3 == c2);
        ct_flex_mods fm;
        memset(&fm, 0, sizeof fm);
        CHECK_OK(ct_dev_flex_jit_check(a, B, H, T, T));
        CHECK_OK(ct_dev_flex_jit_bind(a, false, &fm));
        CHECK(fm.compiled && fm.compiled->module != NULL && fm.compiled->narr == 4);
        ct_dev_flex_jit_free(a);
    } else {
        CHECK(t2 == t0 && c2 == c0 && b2 == b0); /* the CPU compiles nothing for a device */
    }
    mods_free(&m);
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

static void bad_input(ct_device *d)
{
    mods m;
    CHECK_OK(mods_make(&cases[1], &m));
    ct_dev_flex_jit *j = NULL;
    ct_flex_mods fm;
    memset(&fm, 0, sizeof fm);
    ct_mask_mod causal;
    ct_score_mod cap;
    CHECK_OK(ct_mask_mod_causal(&causal));
    CHECK_OK(ct_score_mod_softcap(3.0f, &cap));
    EXPECT(ct_dev_flex_jit_create(d, NULL, &causal, CT_DTYPE_F32, E, &j), CT_EINVAL, "ct_mask_mod_compile");
    EXPECT(ct_dev_flex_jit_create(d, &cap, NULL, CT_DTYPE_F32, E, &j), CT_EINVAL, "ct_score_mod_compile");
    EXPECT(ct_dev_flex_jit_create(d, NULL, NULL, CT_DTYPE_F32, E, &j), CT_EINVAL, "need a compiled");
    EXPECT(ct_dev_flex_jit_create(d, &m.sm, NULL, CT_DTYPE_I32, E, &j), CT_EINVAL, "dtype");
    EXPECT(ct_dev_flex_jit_create(d, &m.sm, NULL, CT_DTYPE_F32, 0, &j), CT_EINVAL, "head dim");
    CHECK(j == NULL);
    CHECK_OK(ct_dev_flex_jit_create(d, &m.sm, NULL, CT_DTYPE_F32, E, &j));
    EXPECT(ct_dev_flex_jit_bind(j, false, &fm), CT_EINVAL, "range-checked");
    /* bias[h, q - kv + 79] leaves its 159 columns when T > 80 */
    EXPECT(ct_dev_flex_jit_check(j, B, H, T + 1, T + 1), CT_EINVAL, "'bias'");
    EXPECT(ct_dev_flex_jit_bind(j, false, &fm), CT_EINVAL, "range-checked");
    CHECK_OK(ct_dev_flex_jit_check(j, B, H, T, T));
    fm.score = CT_FLEX_SCORE_SOFTCAP;
    EXPECT(ct_dev_flex_jit_bind(j, false, &fm), CT_EINVAL, "CT_FLEX_SCORE_NONE");
    fm.score = CT_FLEX_SCORE_NONE;
    EXPECT(ct_dev_flex_jit_bind(j, true, &fm), CT_EINVAL, "param_grad is NULL");
    CHECK_OK(ct_dev_flex_jit_bind(j, false, &fm));
    CHECK(fm.compiled != NULL && fm.compiled->param_len == m.sm.param_len);
    CHECK(fm.compiled->param_grad == NULL);
    CHECK_OK(ct_dev_flex_jit_collect(j)); /* nothing wanted: nothing added */
    ct_dev_flex_jit_free(j);
    ct_dev_flex_jit_free(NULL);
    ct_mask_mod_free(&causal);
    ct_score_mod_free(&cap);
    mods_free(&m);
}

int main(void)
{
    char dir[96]; /* TMPDIR of up to ~70 bytes */
    const char *tmp = getenv("TMPDIR");
    int dn = snprintf(dir, sizeof dir, "%s/ctorch-test-fjdev-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (dn < 0 || (size_t)dn >= sizeof dir || !mkdtemp(dir)) {
        fprintf(stderr, "cannot make a temporary directory under TMPDIR (at most ~70 bytes here)\n");
        return 1;
    }
    setenv("CT_CACHE_DIR", dir, 1);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < 2 * T - 1; i++) g_bias[h][i] = 0.02f * (float)((h * 7 + i) % 23) - 0.2f;
    g_temp[0] = 0.8f;
    for (int i = 0; i < 32; i++) (&g_tab[0][0])[i] = 0.05f * (float)(i % 9) - 0.2f;
    for (int t = 0; t < T; t++) g_doc[t] = t < 30 ? 0 : t < 33 ? 1 : t < 70 ? 2 : 3;

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
    cache(cpu, false);
    bad_input(cpu);
    if (g) {
        run_cases(g, true);
        cache(g, true);
        bad_input(g);
        ct_memory_stats_t ms;
        ct_device_memory_stats(g, &ms);
        CHECK(ms.current_bytes == 0); /* every buffer and module freed */
        CHECK_OK(ct_device_close(g));
    }
    char cmd[120];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return t_report("test_flex_jit_device");
}
