/* AdamW against a double-precision reference of torch.optim.AdamW's update, and the same
 * bits from every instruction set's body (ops/optim_kernels.h) at 1 and 2 threads; the global
 * gradient norm and clipping (same bits at 1 and 2 threads), the warmup + cosine schedule. */
#include "test_util.h"

static void test_adamw(void)
{
    enum { N = 1001 };
    static float p[N], g[N], m[N], v[N];
    static double rp[N], rm[N], rv[N];
    t_fill(p, N, -1, 1);
    for (int i = 0; i < N; i++)
        rp[i] = p[i], m[i] = v[i] = 0, rm[i] = rv[i] = 0;
    ct_adamw_options o = ct_adamw_options_default();
    o.lr = 0.01f;
    o.weight_decay = 0.1f;
    for (int step = 1; step <= 5; step++) {
        t_fill(g, N, -0.5f, 0.5f);
        g[7] = 0; /* a zero gradient: the update is the moment alone */
        CHECK_OK(ct_adamw_step(p, g, m, v, N, step, &o));
        double bc1 = 1 - pow(0.9, step), bc2 = 1 - pow(0.95, step);
        for (int i = 0; i < N; i++) {
            rp[i] *= 1 - 0.01 * 0.1;
            rm[i] = 0.9 * rm[i] + 0.1 * g[i];
            rv[i] = 0.95 * rv[i] + 0.05 * (double)g[i] * g[i];
            rp[i] -= 0.01 / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + 1e-8);
        }
    }
    float ref[N];
    for (int i = 0; i < N; i++)
        ref[i] = (float)rp[i];
    CHECK(t_close(p, ref, N, 1e-6, 1e-5, "adamw"));
    /* step 1 with bias correction moves every weight by ~lr (sign of the gradient) */
    float q = 1.0f, gq = 0.3f, mq = 0, vq = 0;
    o.weight_decay = 0;
    CHECK_OK(ct_adamw_step(&q, &gq, &mq, &vq, 1, 1, &o));
    CHECK(fabsf(q - (1.0f - 0.01f)) < 1e-6f);
    CHECK_STATUS(ct_adamw_step(p, g, m, v, N, 0, &o), CT_EINVAL);
    CHECK_STATUS(ct_adamw_step(NULL, g, m, v, N, 1, &o), CT_EINVAL);
    o.beta1 = 1.0f;
    CHECK_STATUS(ct_adamw_step(p, g, m, v, N, 1, &o), CT_EINVAL);
    ct_adamw_options d = ct_adamw_options_default();
    CHECK_OK(ct_adamw_step(NULL, NULL, NULL, NULL, 0, 1, &d));
}

/* x[i] uniform in [lo, hi) from seed alone (t_fill's stream moves on at each call). */
static void fill_seeded(float *x, int64_t n, uint32_t seed, float lo, float hi)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = lo + (hi - lo) * (float)(seed >> 8) * (1.0f / 16777216.0f);
    }
}

/* Three steps over n parameters from fixed inputs under the active ISA and thread count. */
static void adamw_run(float *p, float *m, float *v, float *g, int64_t n)
{
    fill_seeded(p, n, 1, -1, 1);
    memset(m, 0, (size_t)n * 4), memset(v, 0, (size_t)n * 4);
    ct_adamw_options o = ct_adamw_options_default();
    o.lr = 0.01f;
    for (int step = 1; step <= 3; step++) {
        fill_seeded(g, n, 100u + (uint32_t)step, -0.5f, 0.5f);
        for (int64_t i = 0; i < n; i += 97)
            g[i] = 0; /* zero gradients: v can be 0 (sqrt(0) / bc2 + eps) */
        CHECK_OK(ct_adamw_step(p, g, m, v, n, step, &o));
    }
}

/* Every ISA this CPU has (the SIMD bodies keep the scalar loop's IEEE operations and order)
 * and 1 or 2 threads give the scalar body's bits: n = 1 .. 40 (every tail class of 8 and 16
 * lanes) and n = 1000003 (a ragged end after many chunks). */
static void test_adamw_isas(void)
{
    enum { BIG = 1000003 };
    float *buf = malloc((size_t)BIG * 4 * 8);
    CHECK(buf != NULL);
    if (!buf) return;
    float *p0 = buf, *m0 = p0 + BIG, *v0 = m0 + BIG, *g = v0 + BIG;
    float *p1 = g + BIG, *m1 = p1 + BIG, *v1 = m1 + BIG;
    ct_isa active = ct_active_isa();
    int prev = ct_num_threads(), bad = 0, runs = 0;
    for (int64_t n = 1; n <= BIG; n = n < 40 ? n + 1 : BIG + 1) {
        int64_t len = n <= 40 ? n : BIG;
        CHECK_OK(ct_set_isa(CT_ISA_SCALAR));
        CHECK_OK(ct_set_num_threads(1));
        adamw_run(p0, m0, v0, g, len);
        for (int i = 0; i < CT_ISA_COUNT; i++) {
            if (!ct_cpu_has_isa((ct_isa)i)) continue;
            CHECK_OK(ct_set_isa((ct_isa)i));
            for (int t = 1; t <= 2; t++) {
                CHECK_OK(ct_set_num_threads(t));
                adamw_run(p1, m1, v1, g, len);
                size_t b = (size_t)len * 4;
                bad += memcmp(p0, p1, b) != 0 || memcmp(m0, m1, b) != 0 || memcmp(v0, v1, b) != 0;
                runs++;
            }
        }
    }
    CHECK_OK(ct_set_isa(active));
    ct_set_num_threads(prev);
    printf("test_model_optim: adamw under every ISA here at 1 and 2 threads vs the scalar body: "
           "%d of %d runs differ\n", bad, runs);
    CHECK(bad == 0);
    free(buf);
}

static void test_norm_clip(void)
{
    int64_t n = 100003; /* several blocks and a ragged end */
    float *g = malloc((size_t)n * 4), *h = malloc((size_t)n * 4);
    t_fill(g, (size_t)n, -1, 1);
    double ref = 0;
    for (int64_t i = 0; i < n; i++)
        ref += (double)g[i] * g[i];
    ref = sqrt(ref);
    double a, b;
    int prev = ct_num_threads();
    CHECK_OK(ct_set_num_threads(1));
    CHECK_OK(ct_grad_norm(g, n, &a));
    CHECK_OK(ct_set_num_threads(2));
    CHECK_OK(ct_grad_norm(g, n, &b));
    ct_set_num_threads(prev);
    CHECK(a == b);
    CHECK(fabs(a - ref) < 1e-9 * ref);
    memcpy(h, g, (size_t)n * 4);
    double before;
    CHECK_OK(ct_clip_grad_norm(h, n, 10.0f, &before));
    CHECK(before == a);
    CHECK_OK(ct_grad_norm(h, n, &b));
    CHECK(fabs(b - 10.0) < 1e-4);
    memcpy(h, g, (size_t)n * 4);
    CHECK_OK(ct_clip_grad_norm(h, n, 1e6f, NULL)); /* below the limit: untouched */
    CHECK(!memcmp(h, g, (size_t)n * 4));
    CHECK_OK(ct_clip_grad_norm(h, n, 0.0f, &b)); /* 0: measure only */
    CHECK(!memcmp(h, g, (size_t)n * 4) && b == a);
    CHECK_OK(ct_grad_norm(g, 0, &b));
    CHECK(b == 0);
    CHECK_STATUS(ct_grad_norm(g, -1, &b), CT_EINVAL);
    free(g);
    free(h);
}

static void test_schedule(void)
{
    CHECK(fabsf(ct_lr_cosine(0, 10, 100, 1.0f, 0.1f) - 0.1f) < 1e-7f);
    CHECK(ct_lr_cosine(9, 10, 100, 1.0f, 0.1f) == 1.0f);
    CHECK(ct_lr_cosine(10, 10, 100, 1.0f, 0.1f) == 1.0f);
    CHECK(fabsf(ct_lr_cosine(99, 10, 100, 1.0f, 0.1f) - 0.1f) < 1e-7f);
    CHECK(fabsf(ct_lr_cosine(500, 10, 100, 1.0f, 0.1f) - 0.1f) < 1e-7f);
    /* halfway through the decay: the mean of the two */
    CHECK(fabsf(ct_lr_cosine(10 + 89 / 2, 10, 100, 1.0f, 0.1f) - 0.55f) < 0.02f);
    /* monotone after warmup */
    bool mono = true;
    for (int s = 10; s < 99; s++)
        mono &= ct_lr_cosine(s + 1, 10, 100, 1.0f, 0.1f) <= ct_lr_cosine(s, 10, 100, 1.0f, 0.1f);
    CHECK(mono);
    CHECK(ct_lr_cosine(0, 0, 1, 2.0f, 0.5f) == 2.0f); /* a single step: no decay to do */
}

int main(void)
{
    test_adamw();
    test_adamw_isas();
    test_norm_clip();
    test_schedule();
    return t_report("test_model_optim");
}
