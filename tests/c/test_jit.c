/* The compile backend: the expression language (values against C references written per
 * element, Python floor semantics, errors naming the token and position), the interval block
 * classifier against brute-force evaluation of every element, the symbolic derivative and
 * parameter gradients against finite differences / hand-written references, range checks,
 * and the compile layer (disk cache hit without a process, damaged entry rebuilt, a cache dir
 * others may write refused, no compiler, a compile error, a deadline). The cache goes to a
 * temp dir. */
#include "test_util.h"

#include <stdint.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static int64_t fdiv64(int64_t a, int64_t b)
{
    if (b == 0) return 0;
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static int64_t fmod64(int64_t a, int64_t b)
{
    if (b == 0) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

/* ---- masks: values and the classifier ------------------------------------------------------ */

typedef int (*mask_ref)(int64_t b, int64_t h, int64_t q, int64_t kv);

static int32_t g_doc[300];
static uint8_t g_rnd[97 * 89];

static int r_causal(int64_t b, int64_t h, int64_t q, int64_t kv) { return q >= kv; }
static int r_window(int64_t b, int64_t h, int64_t q, int64_t kv) { return q >= kv && q - kv <= 37; }
static int r_prefix(int64_t b, int64_t h, int64_t q, int64_t kv) { return kv < 50 || q >= kv; }
static int r_doc(int64_t b, int64_t h, int64_t q, int64_t kv) { return g_doc[q] == g_doc[kv] && q >= kv; }
static int r_dilated(int64_t b, int64_t h, int64_t q, int64_t kv)
{
    return fmod64(q - kv, 3) == 0 && (q - kv < 0 ? kv - q : q - kv) <= 60;
}
static int r_headwin(int64_t b, int64_t h, int64_t q, int64_t kv) { return q - kv <= 8 * (h + 1) && kv <= q; }
static int r_floor(int64_t b, int64_t h, int64_t q, int64_t kv) { return fdiv64(q - 90, 7) == fdiv64(kv - 90, 7); }
static int r_rnd(int64_t b, int64_t h, int64_t q, int64_t kv) { return g_rnd[q * 89 + kv]; }
static int r_batch(int64_t b, int64_t h, int64_t q, int64_t kv) { return b == 1 ? q >= kv : kv >= q; }
static int r_bits(int64_t b, int64_t h, int64_t q, int64_t kv)
{
    return ((q & 15) ^ (kv | 3)) < 9 || !(q != kv) || (~q & 1);
}
static int r_tern(int64_t b, int64_t h, int64_t q, int64_t kv)
{
    return (q > 40 ? kv * 2 : kv + 100) >= q + (int64_t)(q % 5 == 0);
}

/* Python's floor semantics on negative operands and divisors, against literal values and the
 * references above */
static int r_negmod(int64_t b, int64_t h, int64_t q, int64_t kv)
{
    return fmod64(q - kv, 5) == 3 || fdiv64(kv - q, -4) == 2 || fmod64(kv - q, -3) == -1;
}
static int r_true(int64_t b, int64_t h, int64_t q, int64_t kv) { return 1; }

static ct_jit_binding bind_doc(void)
{
    ct_jit_binding d = {"doc", CT_DTYPE_I32, 1, {300}, g_doc, false};
    return d;
}

static void check_mask(const char *expr, mask_ref ref, int64_t B, int64_t H, int64_t L, int64_t S,
                       const ct_jit_binding *bind, int nb)
{
    ct_mask_mod m;
    ct_status s = ct_mask_mod_compile(expr, bind, nb, NULL, &m);
    CHECK_OK(s);
    if (s != CT_OK) return;
    CHECK_OK(ct_jit_check_mask(&m, B, H, L, S));
    /* every element of the grid, through odd tiles and both layouts */
    uint8_t keep[64 * 64];
    int bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t q0 = 0; q0 < L; q0 += 29)
                for (int64_t k0 = 0; k0 < S; k0 += 31) {
                    int64_t nq = L - q0 < 29 ? L - q0 : 29, nk = S - k0 < 31 ? S - k0 : 31;
                    bool kv_major = (q0 + k0) % 2 == 0;
                    ct_attn_tile t = {b, h, q0, nq, k0, nk, kv_major ? 1 : 64, kv_major ? 64 : 1};
                    memset(keep, 7, sizeof keep);
                    m.tile(m.ctx, &t, keep);
                    for (int64_t i = 0; i < nq; i++)
                        for (int64_t j = 0; j < nk; j++) {
                            int want = ref(b, h, q0 + i, k0 + j) != 0;
                            int got = keep[i * t.q_stride + j * t.kv_stride];
                            if (got != want && bad++ < 3)
                                fprintf(stderr, "  %s: (%lld,%lld,%lld,%lld) got %d want %d\n", expr,
                                        (long long)b, (long long)h, (long long)(q0 + i),
                                        (long long)(k0 + j), got, want);
                        }
                }
    CHECK(bad == 0);
    /* the classifier: sound everywhere (EMPTY / FULL only when true) */
    int unsound = 0;
    for (int64_t bsz = 7; bsz <= 64; bsz += 19)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t q0 = 0; q0 < L; q0 += bsz)
                    for (int64_t k0 = 0; k0 < S; k0 += bsz) {
                        int64_t nq = L - q0 < bsz ? L - q0 : bsz, nk = S - k0 < bsz ? S - k0 : bsz;
                        int ones = 0;
                        for (int64_t i = 0; i < nq; i++)
                            for (int64_t j = 0; j < nk; j++)
                                ones += ref(b, h, q0 + i, k0 + j) != 0;
                        ct_block_kind k = m.block(m.ctx, b, h, q0, nq, k0, nk);
                        if ((k == CT_BLOCK_FULL && ones != nq * nk) || (k == CT_BLOCK_EMPTY && ones != 0))
                            unsound++;
                        CHECK(k == CT_BLOCK_FULL || k == CT_BLOCK_EMPTY || k == CT_BLOCK_PARTIAL);
                    }
    if (unsound) fprintf(stderr, "  %s: %d unsound block answers\n", expr, unsound);
    CHECK(unsound == 0);
    ct_mask_mod_free(&m);
}

/* Exact where the structure allows: band masks classify exactly as the built-ins. */
static void check_band_exact(void)
{
    ct_mask_mod m, bi;
    CHECK_OK(ct_mask_mod_compile("q >= kv && q - kv <= 100", NULL, 0, NULL, &m));
    CHECK_OK(ct_mask_mod_sliding_window(100, true, &bi));
    ct_block_mask *a = NULL, *c = NULL;
    CHECK_OK(ct_block_mask_create(&m, 1, 1, 1000, 1000, 64, &a));
    CHECK_OK(ct_block_mask_create(&bi, 1, 1, 1000, 1000, 64, &c));
    if (a && c) {
        size_t n = (size_t)(a->num_q_blocks * a->num_kv_blocks);
        uint8_t *da = malloc(n), *dc = malloc(n);
        CHECK_OK(ct_block_mask_to_dense(a, da));
        CHECK_OK(ct_block_mask_to_dense(c, dc));
        CHECK(memcmp(da, dc, n) == 0);
        CHECK(a->B == 1 && a->H == 1);
        free(da);
        free(dc);
    }
    ct_block_mask_free(a);
    ct_block_mask_free(c);
    /* a document mask over sorted ids: blocks inside one document are FULL, across EMPTY */
    ct_jit_binding d = bind_doc();
    ct_mask_mod dm;
    CHECK_OK(ct_mask_mod_compile("doc[q] == doc[kv]", &d, 1, NULL, &dm));
    CHECK(dm.block(dm.ctx, 0, 0, 0, 10, 0, 10) == CT_BLOCK_FULL);     /* doc 0 is [0, 40) */
    CHECK(dm.block(dm.ctx, 0, 0, 0, 10, 200, 10) == CT_BLOCK_EMPTY);
    ct_mask_mod_free(&dm);
    ct_mask_mod_free(&m);
    ct_mask_mod_free(&bi);
}

/* ---- score mods: values, derivative, parameter gradients ---------------------------------- */

typedef float (*score_ref)(float s, int64_t b, int64_t h, int64_t q, int64_t kv);

static float g_slope[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
static float g_bias[3][41];

static float s_softcap(float s, int64_t b, int64_t h, int64_t q, int64_t kv) { return 20.0f * tanhf(s / 20.0f); }
static float s_alibi(float s, int64_t b, int64_t h, int64_t q, int64_t kv) { return s + g_slope[h] * (float)(kv - q); }
static float s_rel(float s, int64_t b, int64_t h, int64_t q, int64_t kv)
{
    int64_t d = q - kv + 20;
    d = d < 0 ? 0 : d > 40 ? 40 : d;
    return s + g_bias[h][d];
}
static float s_mix(float s, int64_t b, int64_t h, int64_t q, int64_t kv)
{
    float x = s * s / 3.0f;
    float m = x < s ? x : s;
    return (q % 2 == 0 ? expf(s / 4.0f) : 1.0f / (1.0f + expf(-s))) + m + fabsf(s - 1.0f);
}
static float s_clamp(float s, int64_t b, int64_t h, int64_t q, int64_t kv)
{
    float lo = -1.0f, hi = 1.5f;
    float c = s < lo ? lo : s;
    c = c > hi ? hi : c;
    return c + sqrtf(s * s + 1.0f) + logf(s * s + 2.0f) + (float)fdiv64(q - kv, 4);
}

static void check_score(const char *expr, score_ref ref, const ct_jit_binding *bind, int nb,
                        bool want_grad_fn)
{
    ct_score_mod m;
    ct_status st = ct_score_mod_compile(expr, bind, nb, NULL, &m);
    CHECK_OK(st);
    if (st != CT_OK) return;
    CHECK((m.grad != NULL) == want_grad_fn);
    enum { NQ = 13, NK = 11 };
    float s[NQ * NK], raw[NQ * NK], g[NQ * NK];
    int bad = 0, badg = 0;
    for (int64_t h = 0; h < 3; h++) {
        ct_attn_tile t = {0, h, 5, NQ, 3, NK, 1, NQ};
        for (int i = 0; i < NQ * NK; i++)
            raw[i] = s[i] = (float)((i * 37 % 23) - 11) * 0.37f;
        m.fwd(m.ctx, &t, s);
        for (int j = 0; j < NK; j++)
            for (int i = 0; i < NQ; i++) {
                float want = ref(raw[j * NQ + i], 0, h, 5 + i, 3 + j), got = s[j * NQ + i];
                if (fabsf(got - want) > 1e-5f * (1.0f + fabsf(want)) && bad++ < 3)
                    fprintf(stderr, "  %s: h=%lld q=%d kv=%d got %g want %g\n", expr, (long long)h,
                            5 + i, 3 + j, got, want);
            }
        if (!m.grad) continue;
        for (int i = 0; i < NQ * NK; i++)
            g[i] = 1.0f;
        m.grad(m.ctx, &t, raw, g, NULL);
        for (int j = 0; j < NK; j++)
            for (int i = 0; i < NQ; i++) {
                double x = raw[j * NQ + i], e = 1e-2;
                double fd = ((double)ref((float)(x + e), 0, h, 5 + i, 3 + j) -
                             (double)ref((float)(x - e), 0, h, 5 + i, 3 + j)) / (2 * e);
                if (fabs(g[j * NQ + i] - fd) > 2e-2 * (1 + fabs(fd)) && badg++ < 3)
                    fprintf(stderr, "  %s d/dscore: q=%d kv=%d got %g fd %g (s=%g)\n", expr, 5 + i,
                            3 + j, g[j * NQ + i], fd, x);
            }
    }
    CHECK(bad == 0);
    CHECK(badg == 0);
    ct_score_mod_free(&m);
}

static void check_param_grads(void)
{
    /* two parameters: slopes [4] and bias [3, 41], packed in binding order */
    ct_jit_binding bb[2] = {{"slope", CT_DTYPE_F32, 1, {4}, g_slope, true},
                            {"bias", CT_DTYPE_F32, 2, {3, 41}, g_bias, true}};
    ct_score_mod m;
    CHECK_OK(ct_score_mod_compile("score * 2 + slope[h] * (kv - q) + bias[h, clamp(q - kv + 20, 0, 40)]",
                                  bb, 2, NULL, &m));
    CHECK(m.param_len == 4 + 3 * 41);
    CHECK(m.grad != NULL);
    float dp[4 + 123] = {0}, want[4 + 123] = {0};
    enum { NQ = 9, NK = 30 };
    float raw[NQ * NK], g[NQ * NK];
    for (int64_t h = 0; h < 3; h++) {
        ct_attn_tile t = {0, h, 2, NQ, 0, NK, 1, NQ};
        for (int i = 0; i < NQ * NK; i++) {
            raw[i] = 0.1f * (float)i;
            g[i] = (i % 7 == 0) ? 0.0f : 0.01f * (float)(i % 13) - 0.05f;
        }
        for (int j = 0; j < NK; j++)
            for (int i = 0; i < NQ; i++) {
                float gi = g[j * NQ + i];
                int64_t q = 2 + i, kv = j, d = q - kv + 20;
                d = d < 0 ? 0 : d > 40 ? 40 : d;
                want[h] += gi * (float)(kv - q);
                want[4 + h * 41 + d] += gi;
            }
        float g0[NQ * NK];
        memcpy(g0, g, sizeof g);
        m.grad(m.ctx, &t, raw, g, dp);
        int bad = 0;
        for (int i = 0; i < NQ * NK; i++)
            bad += g[i] != 2.0f * g0[i];
        CHECK(bad == 0);
    }
    CHECK(t_close(dp, want, 127, 1e-5, 1e-4, "param_grad"));
    ct_score_mod_free(&m);
}

/* ---- errors ------------------------------------------------------------------------------ */

static void check_errors(void)
{
    ct_score_mod m;
    ct_mask_mod k;
    CHECK_STATUS(ct_score_mod_compile("score + (q * ", NULL, 0, NULL, &m), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "end of the expression") != NULL);
    CHECK_STATUS(ct_score_mod_compile("score + foo[q]", NULL, 0, NULL, &m), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "'foo'") && strstr(ct_last_error(), "position 8"));
    CHECK_STATUS(ct_score_mod_compile("score $ 2", NULL, 0, NULL, &m), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "'$'") && strstr(ct_last_error(), "position 6"));
    CHECK_STATUS(ct_mask_mod_compile("score > 0", NULL, 0, NULL, &k), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "'score'") != NULL);
    CHECK_STATUS(ct_mask_mod_compile("q >= kv )", NULL, 0, NULL, &k), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "position 8") != NULL);
    CHECK_STATUS(ct_score_mod_compile("frob(score)", NULL, 0, NULL, &m), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "unknown function") != NULL);
    CHECK_STATUS(ct_score_mod_compile("exp(score, 2)", NULL, 0, NULL, &m), CT_EINVAL);
    CHECK_STATUS(ct_score_mod_compile("99999999999999999999", NULL, 0, NULL, &m), CT_EINVAL);
    CHECK_STATUS(ct_score_mod_compile("", NULL, 0, NULL, &m), CT_EINVAL);
    CHECK_STATUS(ct_score_mod_compile(NULL, NULL, 0, NULL, &m), CT_EINVAL);
    CHECK_STATUS(ct_mask_mod_compile("q & 1.5", NULL, 0, NULL, &k), CT_EINVAL);
    ct_jit_binding d = bind_doc();
    CHECK_STATUS(ct_mask_mod_compile("doc[q, kv] == 1", &d, 1, NULL, &k), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "too many indices") != NULL);
    CHECK_STATUS(ct_mask_mod_compile("doc == 1", &d, 1, NULL, &k), CT_EINVAL);
    CHECK_STATUS(ct_mask_mod_compile("doc[1.5] == 1", &d, 1, NULL, &k), CT_EINVAL);
    ct_jit_binding bad = {"q", CT_DTYPE_I32, 1, {300}, g_doc, false};
    CHECK_STATUS(ct_mask_mod_compile("q >= kv", &bad, 1, NULL, &k), CT_EINVAL);
    ct_jit_binding f64 = {"x", CT_DTYPE_F64, 1, {3}, g_doc, false};
    CHECK_STATUS(ct_mask_mod_compile("q >= kv", &f64, 1, NULL, &k), CT_EINVAL);
    /* nesting is bounded, never a stack overflow */
    char deep[4096];
    memset(deep, '(', 2000);
    strcpy(deep + 2000, "q");
    CHECK_STATUS(ct_mask_mod_compile(deep, NULL, 0, NULL, &k), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "nested too deeply") != NULL);
}

/* Indices are range-checked for the grid before use: CT_EINVAL naming the array. */
static void check_ranges(void)
{
    ct_jit_binding d = bind_doc();
    ct_mask_mod k;
    CHECK_OK(ct_mask_mod_compile("doc[q] == doc[kv]", &d, 1, NULL, &k));
    CHECK_OK(ct_jit_check_mask(&k, 1, 1, 300, 300));
    CHECK_STATUS(ct_jit_check_mask(&k, 1, 1, 301, 300), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "'doc'") && strstr(ct_last_error(), "[0, 300]"));
    ct_block_mask *bm = NULL;
    CHECK_STATUS(ct_block_mask_create(&k, 1, 1, 300, 400, 64, &bm), CT_EINVAL);
    CHECK(bm == NULL);
    /* through a combinator too */
    ct_mask_mod both[2], conj;
    CHECK_OK(ct_mask_mod_causal(&both[0]));
    both[1] = k;
    CHECK_OK(ct_mask_mod_and(both, 2, &conj));
    CHECK_STATUS(ct_block_mask_create(&conj, 1, 1, 300, 400, 64, &bm), CT_EINVAL);
    CHECK_OK(ct_block_mask_create(&conj, 1, 1, 300, 300, 64, &bm));
    ct_block_mask_free(bm);
    ct_mask_mod_free(&conj);
    ct_mask_mod_free(&both[0]);
    ct_mask_mod_free(&k);
    /* an index through another array's values */
    int32_t perm[5] = {4, 0, 2, 1, 3}, tab[5] = {1, 2, 3, 4, 5};
    ct_jit_binding two[2] = {{"perm", CT_DTYPE_I32, 1, {5}, perm, false},
                             {"tab", CT_DTYPE_I32, 1, {5}, tab, false}};
    CHECK_OK(ct_mask_mod_compile("tab[perm[q % 5]] > kv", two, 2, NULL, &k));
    CHECK_OK(ct_jit_check_mask(&k, 1, 1, 1000, 1000));
    ct_mask_mod_free(&k);
    two[1].shape[0] = 4;
    CHECK_OK(ct_mask_mod_compile("tab[perm[q % 5]] > kv", two, 2, NULL, &k));
    CHECK_STATUS(ct_jit_check_mask(&k, 1, 1, 10, 10), CT_EINVAL);
    ct_mask_mod_free(&k);
    /* the flex calls run a score mod's check */
    float bias[8] = {0};
    ct_jit_binding bb = {"bias", CT_DTYPE_F32, 1, {8}, bias, false};
    ct_score_mod sm;
    CHECK_OK(ct_score_mod_compile("score + bias[q - kv + 4]", &bb, 1, NULL, &sm));
    float qd[1 * 1 * 6 * 4] = {0}, od[6 * 4];
    ct_tensor q = {0}, o = {0};
    CHECK_OK(ct_tensor_wrap(&q, qd, CT_DTYPE_F32, 4, (int64_t[]){1, 1, 6, 4}, NULL));
    CHECK_OK(ct_tensor_wrap(&o, od, CT_DTYPE_F32, 4, (int64_t[]){1, 1, 6, 4}, NULL));
    ct_flex_options fo = ct_flex_options_default();
    fo.score_mod = &sm;
    CHECK_STATUS(ct_flex_attention_forward(&q, &q, &q, NULL, &fo, &o, NULL), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "'bias'") != NULL);
    CHECK_OK(ct_tensor_wrap(&q, qd, CT_DTYPE_F32, 4, (int64_t[]){1, 1, 4, 4}, NULL));
    CHECK_OK(ct_tensor_wrap(&o, od, CT_DTYPE_F32, 4, (int64_t[]){1, 1, 4, 4}, NULL));
    CHECK_OK(ct_flex_attention_forward(&q, &q, &q, NULL, &fo, &o, NULL));
    ct_score_mod_free(&sm);
}

/* ---- attention end to end: compiled ALiBi / softcap vs the built-ins ----------------------- */

static void check_vs_builtin(void)
{
    enum { B = 1, H = 4, L = 77, E = 16 };
    size_t n = (size_t)B * H * L * E;
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *o1 = malloc(n * 4),
          *o2 = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        q[i] = sinf((float)i * 0.37f);
        k[i] = cosf((float)i * 0.11f);
        v[i] = sinf((float)i * 0.05f + 1.0f);
    }
    ct_tensor tq, tk, tv, t1, t2;
    int64_t shp[4] = {B, H, L, E};
    ct_tensor_wrap(&tq, q, CT_DTYPE_F32, 4, shp, NULL);
    ct_tensor_wrap(&tk, k, CT_DTYPE_F32, 4, shp, NULL);
    ct_tensor_wrap(&tv, v, CT_DTYPE_F32, 4, shp, NULL);
    ct_tensor_wrap(&t1, o1, CT_DTYPE_F32, 4, shp, NULL);
    ct_tensor_wrap(&t2, o2, CT_DTYPE_F32, 4, shp, NULL);
    ct_score_mod a, c;
    ct_jit_binding sb = {"slope", CT_DTYPE_F32, 1, {4}, g_slope, false};
    CHECK_OK(ct_score_mod_alibi(4, g_slope, &a));
    CHECK_OK(ct_score_mod_compile("score + slope[h] * (kv - q)", &sb, 1, NULL, &c));
    ct_mask_mod cm, cb;
    CHECK_OK(ct_mask_mod_causal(&cb));
    CHECK_OK(ct_mask_mod_compile("q >= kv", NULL, 0, NULL, &cm));
    ct_block_mask *m1 = NULL, *m2 = NULL;
    CHECK_OK(ct_block_mask_create(&cb, B, H, L, L, 32, &m1));
    CHECK_OK(ct_block_mask_create(&cm, B, H, L, L, 32, &m2));
    ct_flex_options f1 = ct_flex_options_default(), f2 = f1;
    f1.score_mod = &a;
    f2.score_mod = &c;
    CHECK_OK(ct_flex_attention_forward(&tq, &tk, &tv, m1, &f1, &t1, NULL));
    CHECK_OK(ct_flex_attention_forward(&tq, &tk, &tv, m2, &f2, &t2, NULL));
    CHECK(t_close(o2, o1, n, 1e-6, 1e-5, "compiled alibi+causal vs built-in"));
    ct_block_mask_free(m1);
    ct_block_mask_free(m2);
    ct_mask_mod_free(&cm);
    ct_mask_mod_free(&cb);
    ct_score_mod_free(&a);
    ct_score_mod_free(&c);
    free(q), free(k), free(v), free(o1), free(o2);
}

/* ---- the compile layer ------------------------------------------------------------------- */

static int count_entries(const char *dir, const char *ext)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls %s/*%s 2>/dev/null | wc -l", dir, ext);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = -1;
        pclose(p);
    }
    return n;
}

static void write_script(const char *path, const char *body)
{
    FILE *f = fopen(path, "w");
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    chmod(path, 0755);
}

static void check_cache(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/cache", g_dir);
    ct_jit_options o = ct_jit_options_default();
    o.cache_dir = dir;
    const char *expr = "q - kv <= 17 && q >= kv && (q + kv) % 3 != 1";
    ct_mask_mod m;
    ct_jit_stats s0, s1, s2, s3;
    ct_jit_get_stats(&s0);
    CHECK_OK(ct_mask_mod_compile(expr, NULL, 0, &o, &m));
    ct_mask_mod_free(&m);
    ct_jit_get_stats(&s1);
    CHECK(s1.compiles == s0.compiles + 1);
    CHECK(count_entries(dir, ".so") == 1 && count_entries(dir, ".sum") == 1);
    /* the in-process table: no disk access, no process */
    CHECK_OK(ct_mask_mod_compile(expr, NULL, 0, &o, &m));
    ct_mask_mod_free(&m);
    ct_jit_get_stats(&s2);
    CHECK(s2.table_hits == s1.table_hits + 1 && s2.processes == s1.processes);
    /* a fresh table (as a new process): a disk hit runs no process */
    ct_jit_reset_table();
    CHECK_OK(ct_mask_mod_compile(expr, NULL, 0, &o, &m));
    ct_jit_get_stats(&s3);
    CHECK(s3.cache_hits == s2.cache_hits + 1);
    CHECK(s3.processes == s2.processes);
    CHECK(s3.compiles == s2.compiles);
    uint8_t keep[4];
    ct_attn_tile t = {0, 0, 20, 2, 2, 2, 1, 2};
    m.tile(m.ctx, &t, keep); /* q 20,21 x kv 2,3: q - kv > 17 except (20, 3) */
    CHECK(keep[0] == 0 && keep[1] == 0 && keep[2] == 1 && keep[3] == 0);
    ct_mask_mod_free(&m);
    /* the key holds the ISA and the constants: another ISA (other flags) or another constant
     * is a miss and a new entry, never the old kernel */
    ct_isa was = ct_active_isa();
    if (was != CT_ISA_SCALAR) {
        ct_jit_stats k0, k1;
        ct_jit_reset_table();
        ct_jit_get_stats(&k0);
        CHECK_OK(ct_set_isa(CT_ISA_SCALAR));
        CHECK_OK(ct_mask_mod_compile(expr, NULL, 0, &o, &m));
        ct_mask_mod_free(&m);
        CHECK_OK(ct_set_isa(was));
        ct_jit_get_stats(&k1);
        CHECK(k1.compiles == k0.compiles + 1 && k1.cache_hits == k0.cache_hits);
        CHECK(count_entries(dir, ".so") == 2);
    } else {
        printf("check_cache: the ISA part of the key SKIPPED (the CPU runs scalar only)\n");
    }
    {
        ct_jit_stats k0, k1;
        int before = count_entries(dir, ".so");
        ct_jit_reset_table();
        ct_jit_get_stats(&k0);
        CHECK_OK(ct_mask_mod_compile("q - kv <= 18 && q >= kv && (q + kv) % 3 != 1", NULL, 0, &o, &m));
        ct_mask_mod_free(&m);
        ct_jit_get_stats(&k1);
        CHECK(k1.compiles == k0.compiles + 1 && k1.cache_hits == k0.cache_hits);
        CHECK(count_entries(dir, ".so") == before + 1);
    }
    /* damage the entry: detected by the checksum and rebuilt, never loaded */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "for f in %s/*.so; do printf 'garbage' | dd of=$f bs=1 seek=100 conv=notrunc 2>/dev/null; done", dir);
    CHECK(system(cmd) == 0);
    ct_jit_reset_table();
    ct_jit_stats s4, s5;
    ct_jit_get_stats(&s4);
    CHECK_OK(ct_mask_mod_compile(expr, NULL, 0, &o, &m));
    ct_jit_get_stats(&s5);
    CHECK(s5.rebuilt == s4.rebuilt + 1 && s5.compiles == s4.compiles + 1);
    ct_mask_mod_free(&m);
    ct_jit_reset_table();
    ct_jit_get_stats(&s4);
    CHECK_OK(ct_mask_mod_compile(expr, NULL, 0, &o, &m)); /* the rebuilt entry is good */
    ct_jit_get_stats(&s5);
    CHECK(s5.cache_hits == s4.cache_hits + 1 && s5.processes == s4.processes);
    ct_mask_mod_free(&m);
    CHECK(count_entries(dir, ".c") == 0); /* temp files are gone */
    /* a cache dir others may write is refused */
    char open_dir[300];
    snprintf(open_dir, sizeof open_dir, "%s/open", g_dir);
    mkdir(open_dir, 0700);
    chmod(open_dir, 0777);
    ct_jit_options oo = o;
    oo.cache_dir = open_dir;
    CHECK_STATUS(ct_mask_mod_compile("q != kv + 5", NULL, 0, &oo, &m), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "writable by other users") != NULL);
    /* a cache dir that belongs to another user is refused (as root: one given to nobody; as
     * anyone else: "/", which root owns) */
    char other_dir[300];
    snprintf(other_dir, sizeof other_dir, "%s/other", g_dir);
    if (geteuid() == 0) {
        mkdir(other_dir, 0700);
        CHECK(chown(other_dir, 65534, 65534) == 0);
    } else {
        snprintf(other_dir, sizeof other_dir, "/");
    }
    oo = o;
    oo.cache_dir = other_dir;
    CHECK_STATUS(ct_mask_mod_compile("q != kv + 7", NULL, 0, &oo, &m), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "belongs to another user") != NULL);
    /* no compiler */
    oo = o;
    oo.cc = "ctorch-no-such-compiler";
    CHECK_STATUS(ct_mask_mod_compile("q != kv + 6", NULL, 0, &oo, &m), CT_EUNSUPPORTED);
    CHECK(strstr(ct_last_error(), "no C compiler") != NULL);
    /* a compiler that fails: the message shows the generated source at the line */
    char fake[300];
    snprintf(fake, sizeof fake, "%s/badcc", g_dir);
    write_script(fake, "for a; do case $a in *.c) src=$a;; esac; done\n"
                       "[ -n \"$src\" ] || { echo fake 1.0; exit 0; }\n"
                       "echo \"$src:5:3: error: boom\"; exit 1");
    oo = o;
    oo.cc = fake;
    CHECK_STATUS(ct_mask_mod_compile("q != kv + 7", NULL, 0, &oo, &m), CT_EINTERNAL);
    CHECK(strstr(ct_last_error(), "boom") && strstr(ct_last_error(), ">    5 |"));
    /* a compiler that fails without an error in the generated source (it could not write its
     * output, say): not called a bug; the message names the cache dir and what to check */
    snprintf(fake, sizeof fake, "%s/fullcc", g_dir);
    write_script(fake, "for a; do case $a in *.c) echo 'ld: cannot open output file x.so: No space "
                       "left on device'; exit 1;; esac; done\necho full 1.0");
    oo = o;
    oo.cc = fake;
    CHECK_STATUS(ct_mask_mod_compile("q != kv + 9", NULL, 0, &oo, &m), CT_EIO);
    CHECK(strstr(ct_last_error(), "No space left") && !strstr(ct_last_error(), "a bug") &&
          strstr(ct_last_error(), dir) && strstr(ct_last_error(), "CT_CACHE_DIR"));
    /* a deadline */
    snprintf(fake, sizeof fake, "%s/slowcc", g_dir);
    write_script(fake, "for a; do case $a in *.c) exec sleep 30;; esac; done\necho slow 1.0");
    oo.cc = fake;
    oo.timeout_s = 0.3;
    CHECK_STATUS(ct_mask_mod_compile("q != kv + 8", NULL, 0, &oo, &m), CT_ETIMEDOUT);
    /* a batch: compiled by the pool, every mod correct */
    ct_mask_mod ms[4];
    ct_jit_request rq[4];
    const char *ex[4] = {"q % 4 == kv % 4", "q / 4 == kv / 4", "q + kv < 50", "q % 4 == kv % 4"};
    for (int i = 0; i < 4; i++)
        rq[i] = (ct_jit_request){ex[i], NULL, 0, NULL, &ms[i]};
    o.threads = 2;
    CHECK_OK(ct_mod_compile_many(rq, 4, &o));
    for (int i = 0; i < 4; i++) {
        ct_attn_tile tt = {0, 0, 9, 1, 5, 1, 1, 1};
        uint8_t kk = 9;
        ms[i].tile(ms[i].ctx, &tt, &kk);
        int want = i == 0 || i == 3 ? 9 % 4 == 5 % 4 : i == 1 ? 9 / 4 == 5 / 4 : 14 < 50;
        CHECK(kk == want);
        ct_mask_mod_free(&ms[i]);
    }
}

static int max_int_line(const char *path)
{
    FILE *f = fopen(path, "r");
    int m = -1, x;
    if (!f) return -1;
    while (fscanf(f, "%d", &x) == 1)
        if (x > m) m = x;
    fclose(f);
    return m;
}

static bool file_has(const char *path, const char *needle)
{
    char buf[8192];
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

/* CT_COMPILE_THREADS and CT_COMPILE_TIMEOUT (the options left 0), the flags the compiler is
 * given, and the compiler's identity: its resolved path, size and mtime are in the key, so a
 * compiler touched in place is a miss (and asked its --version again), an untouched one a hit. */
static void check_env(void)
{
    char runs[300], conc[300], args[300], cc[300], body[4096], dir[300];
    snprintf(runs, sizeof runs, "%s/runs", g_dir);
    snprintf(conc, sizeof conc, "%s/conc.log", g_dir);
    snprintf(args, sizeof args, "%s/args.log", g_dir);
    snprintf(cc, sizeof cc, "%s/countcc", g_dir);
    mkdir(runs, 0700);
    /* a compiler that records how many compiles run at once: each waits (CTJ_TRIES x 50 ms at
     * most) until CTJ_WAIT of them run, then logs the count */
    snprintf(body, sizeof body,
             "for a; do case $a in *.c) src=$a;; esac; done\n"
             "[ -n \"$src\" ] || exec cc \"$@\"\n"
             "echo \"$@\" >> %s\n"
             "mkdir %s/r.$$\n"
             "i=0; while [ $(ls %s | wc -l) -lt ${CTJ_WAIT:-1} ] && [ $i -lt ${CTJ_TRIES:-1} ]; do "
             "sleep 0.05; i=$((i+1)); done\n"
             "ls %s | wc -l >> %s\n"
             "cc \"$@\"; rc=$?; rmdir %s/r.$$; exit $rc",
             args, runs, runs, runs, conc, runs);
    write_script(cc, body);
    ct_jit_options o = ct_jit_options_default();
    o.cc = cc;
    const char *ex[3][2] = {{"q % 7 == kv % 7 + 1", "q % 7 == kv % 7 + 2"},
                            {"q % 9 == kv % 9 + 1", "q % 9 == kv % 9 + 2"},
                            {"q % 11 == kv % 11 + 1", "q % 11 == kv % 11 + 2"}};
    const char *threads[3] = {"1", "2", "2"};
    const char *tries[3] = {"10", "200", "200"};
    int want[3] = {1, 2, 2};
    for (int t = 0; t < 3; t++) {
        snprintf(dir, sizeof dir, "%s/env%d", g_dir, t);
        o.cache_dir = dir;
        o.threads = t == 2 ? 2 : 0; /* 0: CT_COMPILE_THREADS decides */
        setenv("CT_COMPILE_THREADS", t == 2 ? "1" : threads[t], 1); /* the option wins */
        setenv("CTJ_WAIT", "2", 1);
        setenv("CTJ_TRIES", tries[t], 1);
        unlink(conc);
        ct_mask_mod ms[2];
        ct_jit_request rq[2] = {{ex[t][0], NULL, 0, NULL, &ms[0]}, {ex[t][1], NULL, 0, NULL, &ms[1]}};
        CHECK_OK(ct_mod_compile_many(rq, 2, &o));
        for (int i = 0; i < 2; i++)
            ct_mask_mod_free(&ms[i]);
        int m = max_int_line(conc);
        if (m != want[t]) fprintf(stderr, "  threads case %d: %d compiles at once, want %d\n", t, m, want[t]);
        CHECK(m == want[t]);
    }
    unsetenv("CT_COMPILE_THREADS");
    unsetenv("CTJ_WAIT");
    unsetenv("CTJ_TRIES");
    /* generated code is compiled with -Wall -Werror (and compiles) */
    CHECK(file_has(args, "-Wall") && file_has(args, "-Werror"));
#if defined(__x86_64__)
    /* vector flags follow the library's kernels (AVX-512 machines run AVX2 code too) */
    bool vec = ct_active_isa() == CT_ISA_AVX2 || ct_active_isa() == CT_ISA_AVX512;
    CHECK(file_has(args, "-mavx2") == vec);
#endif
    /* CT_COMPILE_TIMEOUT */
    char slow[300];
    snprintf(slow, sizeof slow, "%s/slowcc2", g_dir);
    write_script(slow, "for a; do case $a in *.c) exec sleep 30;; esac; done\necho slow 1.0");
    setenv("CT_COMPILE_TIMEOUT", "0.4", 1);
    ct_jit_options os = ct_jit_options_default();
    os.cc = slow;
    snprintf(dir, sizeof dir, "%s/envslow", g_dir);
    os.cache_dir = dir;
    ct_mask_mod k;
    CHECK_STATUS(ct_mask_mod_compile("q != kv + 21", NULL, 0, &os, &k), CT_ETIMEDOUT);
    CHECK(strstr(ct_last_error(), "0.4 s") != NULL);
    unsetenv("CT_COMPILE_TIMEOUT");
    /* values that are not numbers in range are refused by name, never silently defaulted */
    const char *bad_env[][2] = {{"CT_COMPILE_THREADS", "two"}, {"CT_COMPILE_THREADS", "0"},
                                {"CT_COMPILE_THREADS", "3x"}, {"CT_COMPILE_TIMEOUT", "soon"},
                                {"CT_COMPILE_TIMEOUT", "-1"}, {"CT_COMPILE_TIMEOUT", "nan"}};
    for (size_t i = 0; i < sizeof bad_env / sizeof bad_env[0]; i++) {
        setenv(bad_env[i][0], bad_env[i][1], 1);
        ct_jit_reset_table();
        CHECK_STATUS(ct_mask_mod_compile("q != kv + 23", NULL, 0, &os, &k), CT_EINVAL);
        CHECK(strstr(ct_last_error(), bad_env[i][0]) && strstr(ct_last_error(), bad_env[i][1]));
        unsetenv(bad_env[i][0]);
    }
    /* the compiler's identity */
    snprintf(dir, sizeof dir, "%s/envid", g_dir);
    o.cache_dir = dir;
    o.threads = 1;
    ct_jit_stats a, b2;
    ct_jit_reset_table();
    CHECK_OK(ct_mask_mod_compile("q != kv + 22", NULL, 0, &o, &k));
    ct_mask_mod_free(&k);
    ct_jit_reset_table();
    ct_jit_get_stats(&a);
    CHECK_OK(ct_mask_mod_compile("q != kv + 22", NULL, 0, &o, &k)); /* untouched: a hit */
    ct_mask_mod_free(&k);
    ct_jit_get_stats(&b2);
    CHECK(b2.cache_hits == a.cache_hits + 1 && b2.processes == a.processes);
    struct stat st;
    CHECK(stat(cc, &st) == 0);
    struct timespec ts[2] = {st.st_atim, st.st_mtim};
    ts[1].tv_sec += 100;
    CHECK(utimensat(AT_FDCWD, cc, ts, 0) == 0);
    ct_jit_reset_table();
    ct_jit_get_stats(&a);
    CHECK_OK(ct_mask_mod_compile("q != kv + 22", NULL, 0, &o, &k)); /* touched: a miss */
    ct_mask_mod_free(&k);
    ct_jit_get_stats(&b2);
    CHECK(b2.compiles == a.compiles + 1 && b2.cache_hits == a.cache_hits);
    CHECK(b2.processes == a.processes + 2); /* its --version again, then the compile */
    CHECK(count_entries(dir, ".so") == 2);
    /* reached through a symlink: the same resolved path, the same entry */
    char link[300];
    snprintf(link, sizeof link, "%s/ccLink", g_dir);
    CHECK(symlink(cc, link) == 0);
    o.cc = link;
    ct_jit_reset_table();
    ct_jit_get_stats(&a);
    CHECK_OK(ct_mask_mod_compile("q != kv + 22", NULL, 0, &o, &k));
    ct_mask_mod_free(&k);
    ct_jit_get_stats(&b2);
    CHECK(b2.cache_hits == a.cache_hits + 1 && b2.processes == a.processes);
}

static void check_source(void)
{
    char *src = NULL;
    ct_jit_binding bb = {"slope", CT_DTYPE_F32, 1, {4}, g_slope, true};
    CHECK_OK(ct_jit_generate_source("score + slope[h] * (kv - q)", false, &bb, 1, &src));
    CHECK(src && strstr(src, "ctj_score_fwd") && strstr(src, "ctj_score_grad") &&
          strstr(src, "dparam[a0_g + "));
    ct_free(src);
}

/* The GPT config carries the expressions (so checkpoints keep them) and refuses mask + window. */
static void check_gpt_config(void)
{
    ct_gpt_config c = ct_gpt_config_default(), d = ct_gpt_config_default();
    snprintf(c.score_mod, sizeof c.score_mod, "score + 0.5 * (kv - q)");
    snprintf(c.mask_mod, sizeof c.mask_mod, "q - kv <= 9 || kv < 2");
    char *js = NULL;
    CHECK_OK(ct_gpt_config_to_json(&c, &js));
    CHECK(js && strstr(js, "\"mask_mod\":\"q - kv <= 9 || kv < 2\""));
    if (js) CHECK_OK(ct_gpt_config_from_json(js, &d));
    CHECK(!strcmp(d.score_mod, c.score_mod) && !strcmp(d.mask_mod, c.mask_mod));
    ct_free(js);
    c.window = 4;
    CHECK_STATUS(ct_gpt_config_check(&c), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "exclusive with window") != NULL);
    char big[600];
    memset(big, 'q', sizeof big);
    snprintf(big, sizeof big, "{\"score_mod\": \"%0400d\"}", 1);
    CHECK_STATUS(ct_gpt_config_from_json(big, &d), CT_EFORMAT);
    /* a model with a bad expression is refused at creation, naming the position */
    c = ct_gpt_config_default();
    snprintf(c.mask_mod, sizeof c.mask_mod, "q >= kv )");
    ct_gpt *m = NULL;
    CHECK_STATUS(ct_gpt_create(&c, NULL, &m), CT_EINVAL);
    CHECK(m == NULL && strstr(ct_last_error(), "position 8"));
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/ctorch-test-jit-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    char cache[300];
    snprintf(cache, sizeof cache, "%s/main", g_dir);
    setenv("CT_CACHE_DIR", cache, 1);
    for (int i = 0; i < 300; i++)
        g_doc[i] = i < 40 ? 0 : i < 41 ? 1 : i < 170 ? 2 : 3 + (i - 170) / 50;
    uint32_t r = 12345;
    for (int i = 0; i < 97 * 89; i++) {
        r = r * 1103515245u + 12345u;
        g_rnd[i] = (r >> 16) % 3 == 0;
    }
    for (int h = 0; h < 3; h++)
        for (int d = 0; d < 41; d++)
            g_bias[h][d] = 0.01f * (float)((h * 41 + d) % 17) - 0.08f;
    ct_jit_binding d = bind_doc();
    ct_jit_binding rb = {"m", CT_DTYPE_BOOL, 2, {97, 89}, g_rnd, false};
    check_mask("q >= kv", r_causal, 1, 1, 150, 150, NULL, 0);
    check_mask("q >= kv && q - kv <= 37", r_window, 1, 1, 200, 180, NULL, 0);
    check_mask("kv < 50 || q >= kv", r_prefix, 1, 1, 150, 170, NULL, 0);
    check_mask("doc[q] == doc[kv] && q >= kv", r_doc, 1, 1, 300, 300, &d, 1);
    check_mask("(q - kv) % 3 == 0 && abs(q - kv) <= 60", r_dilated, 1, 1, 150, 150, NULL, 0);
    check_mask("q - kv <= 8 * (h + 1) && kv <= q", r_headwin, 1, 3, 100, 100, NULL, 0);
    check_mask("(q - 90) / 7 == (kv - 90) / 7", r_floor, 1, 1, 150, 150, NULL, 0);
    check_mask("m[q, kv]", r_rnd, 1, 1, 97, 89, &rb, 1);
    check_mask("b == 1 ? q >= kv : kv >= q", r_batch, 2, 1, 60, 60, NULL, 0);
    check_mask("((q & 15) ^ (kv | 3)) < 9 || !(q != kv) || (~q & 1)", r_bits, 1, 1, 70, 70, NULL, 0);
    check_mask("where(q > 40, kv * 2, kv + 100) >= q + (q % 5 == 0)", r_tern, 1, 1, 120, 120, NULL, 0);
    check_mask("(q - kv) % 5 == 3 || (kv - q) / -4 == 2 || (kv - q) % -3 == -1", r_negmod, 1, 1, 60, 60,
               NULL, 0);
    check_mask("-7 / 2 == -4 && -7 % 2 == 1 && 7 / -2 == -4 && 7 % -2 == -1 && -7 / -2 == 3 && "
               "-7 % -2 == -1 && (q - kv - 7) % 1 == 0 && -7.5 % 2 == 0.5 && 7.5 % -2 == -0.5",
               r_true, 1, 1, 9, 9, NULL, 0);
    check_band_exact();
    ct_jit_binding sb = {"slope", CT_DTYPE_F32, 1, {4}, g_slope, false};
    ct_jit_binding bb = {"bias", CT_DTYPE_F32, 2, {3, 41}, g_bias, false};
    check_score("20 * tanh(score / 20)", s_softcap, NULL, 0, true);
    check_score("score + slope[h] * (kv - q)", s_alibi, &sb, 1, false);
    check_score("score + bias[h][clamp(q - kv + 20, 0, 40)]", s_rel, &bb, 1, false);
    check_score("(q % 2 == 0 ? exp(score / 4) : sigmoid(score)) + min(score * score / 3, score) + abs(score - 1)",
                s_mix, NULL, 0, true);
    check_score("clamp(score, -1, 1.5) + sqrt(score * score + 1) + log(score * score + 2) + (q - kv) / 4",
                s_clamp, NULL, 0, true);
    check_param_grads();
    check_errors();
    check_ranges();
    check_vs_builtin();
    check_source();
    check_gpt_config();
    check_cache();
    check_env();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "chmod -R u+w %s; rm -rf %s", g_dir, g_dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", g_dir);
    printf("test_jit: %d checks, %d failures\n", t_checks, t_failures);
    return t_failures != 0;
}
