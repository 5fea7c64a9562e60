/* Every kernel family, every instruction set this CPU has, against the naive double
 * references of tests/ref/ref_kernels.h; the SIMD tables against each other bit for bit
 * where they share the algorithm. Instruction sets the CPU lacks are reported as SKIPPED
 * with the reason. Also the ULP bound of the one AVX2 exp (simd/simd_avx2.h), documented
 * there and in docs/architecture.md: at most 2 ulp over the normal range (1 measured). */
#include "test_util.h"
#include "attention/attn_kernels.h"
#include "core/convert_kernels.h"
#include "ops/elementwise_kernels.h"
#include "ops/norm_kernels.h"
#include "ops/optim_kernels.h"
#include "ops/reduce_kernels.h"
#include "ops/rope_kernels.h"
#include "ops/softmax_kernels.h"
#include "ops/vecmath_kernels.h"
#include "ref/ref_kernels.h"

#include <stdint.h>

#define EXP_ULP_BOUND 2

static const int64_t sizes[] = {1, 7, 8, 9, 16, 31, 64, 100, 1027};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static float rel(double got, double want) { return (float)(fabs(got - want) / (fabs(want) + 1e-30)); }

static void test_vec(ct_isa isa)
{
    const ct_vec_kernels *k = ct_vec_tables[isa];
    for (size_t si = 0; si < NSIZES; si++) {
        int64_t n = sizes[si];
        float *x = malloc(4 * (size_t)n), *y = malloc(4 * (size_t)n), *e = malloc(4 * (size_t)n);
        double *de = malloc(8 * (size_t)n);
        t_fill(x, (size_t)n, -20, 20);
        t_fill(y, (size_t)n, -1, 1);
        CHECK(k->vmax(x, n) == (float)ref_vmax(x, n));
        float m = k->vmax(x, n);
        float s = k->vexpsum(e, x, m, n);
        double ds = ref_vexpsum(de, x, m, n);
        CHECK(rel(s, ds) < 1e-5f);
        int64_t worst = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t u = ref_ulp_diff(e[i], (float)de[i]);
            if (u > worst) worst = u;
        }
        CHECK(isa == CT_ISA_SCALAR ? worst <= 1 : worst <= EXP_ULP_BOUND);
        double dd = ref_vdot(x, y, n), da = 0;
        for (int64_t i = 0; i < n; i++) da += fabs((double)x[i] * y[i]);
        CHECK(fabs(k->vdot(x, y, n) - dd) <= 1e-6 * da + 1e-30);
        double sum = 0, asum = 0;
        for (int64_t i = 0; i < n; i++) sum += x[i], asum += fabs(x[i]);
        CHECK(fabs(k->vsum(x, n) - sum) <= 1e-6 * asum);
        free(x), free(y), free(e), free(de);
    }
    float nanrow[9] = {1, 2, NAN, 3, 4, 5, 6, 7, 8};
    CHECK(isnan(k->vmax(nanrow, 9)) && isnan(k->vmax(nanrow + 2, 1)));
    CHECK(k->vmax(nanrow, 0) == -INFINITY);
}

/* exp over a sweep of the whole normal range (and its edges), through vexpsum's stored terms. */
static void test_exp_ulp(ct_isa isa)
{
    const int64_t n = 200001;
    float *x = malloc(4 * (size_t)n), *e = malloc(4 * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = -87.3f + (88.7f + 87.3f) * (float)i / (float)(n - 1);
    ct_vec_tables[isa]->vexpsum(e, x, 0.0f, n);
    int64_t worst = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t u = ref_ulp_diff(e[i], (float)exp((double)x[i]));
        if (u > worst) worst = u;
    }
    printf("test_kernels_isa: %s exp: max %lld ulp over [-87.3, 88.7] (bound %d)\n", ct_isa_name(isa),
           (long long)worst, isa == CT_ISA_SCALAR ? 1 : EXP_ULP_BOUND);
    CHECK(worst <= (isa == CT_ISA_SCALAR ? 1 : EXP_ULP_BOUND));
    float edge[8] = {-INFINITY, -100.0f, 89.0f, INFINITY, NAN, 0.0f, -87.4f, 88.72f}, eo[8];
    ct_vec_tables[isa]->vexpsum(eo, edge, 0.0f, 8);
    CHECK(eo[0] == 0.0f && eo[1] < 1e-40f && eo[5] == 1.0f); /* libm: exp(-100) is subnormal */
    CHECK(isinf(eo[2]) && isinf(eo[3]) && isnan(eo[4]) && eo[6] >= 0.0f && isfinite(eo[7]));
    free(x), free(e);
}

static void test_convert(ct_isa isa)
{
    const ct_convert_kernels *k = ct_convert_tables[isa];
    enum { N = 1031 };
    float x[N], y[N];
    uint16_t h[N];
    t_fill(x, N, -3e4f, 3e4f);
    x[0] = NAN, x[1] = -0.0f, x[2] = INFINITY, x[3] = 1e-40f, x[4] = 1.00390625f; /* a tie */
    k->f32_to_bf16(h, x, N);
    k->bf16_to_f32(y, h, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        if (i == 0) {
            bad += !isnan(y[0]);
            continue;
        }
        bad += h[i] != ref_f32_to_bf16(x[i]);
        float back;
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&back, &u, 4);
        bad += memcmp(&back, &y[i], 4) != 0;
    }
    CHECK(bad == 0);
    /* f16: round trip of every f16 bit pattern that is not NaN is exact */
    static uint16_t all[65536], again[65536];
    static float f[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    k->f16_to_f32(f, all, 65536);
    k->f32_to_f16(again, f, 65536);
    bad = 0;
    for (int i = 0; i < 65536; i++)
        if (!isnan(f[i])) bad += again[i] != all[i];
    CHECK(bad == 0);
}

static void test_act(ct_isa isa)
{
    const ct_elementwise_kernels *k = ct_elementwise_tables[isa];
    for (int kind = 0; kind < 3; kind++)
        for (size_t si = 0; si < NSIZES; si++) {
            int64_t n = sizes[si];
            float *x = malloc(4 * (size_t)n), *g = malloc(4 * (size_t)n), *o = malloc(4 * (size_t)n);
            t_fill(x, (size_t)n, -8, 8);
            t_fill(g, (size_t)n, -1, 1);
            k->act_forward(kind, o, x, n, 0);
            int bad = 0;
            for (int64_t i = 0; i < n; i++)
                bad += fabs(o[i] - ref_act(x[i], kind)) > 2e-6 * (fabs(ref_act(x[i], kind)) + 1e-3);
            k->act_backward(kind, o, g, x, n, 0);
            for (int64_t i = 0; i < n; i++) {
                double want = g[i] * ref_act_grad(x[i], kind);
                bad += fabs(o[i] - want) > 2e-6 * (fabs(g[i]) + 1e-3) * 2;
            }
            CHECK(bad == 0);
            if (bad) fprintf(stderr, "  %s act kind %d n %lld: %d off\n", ct_isa_name(isa), kind, (long long)n, bad);
            free(x), free(g), free(o);
        }
}

static void test_rms(ct_isa isa)
{
    const ct_norm_kernels *k = ct_norm_tables[isa];
    for (size_t si = 0; si < NSIZES; si++) {
        int64_t C = sizes[si], R = 3;
        float *x = malloc(4 * (size_t)(R * C)), *w = malloc(4 * (size_t)C), *y = malloc(4 * (size_t)(R * C));
        double *dy = malloc(8 * (size_t)C);
        float rstd[3];
        t_fill(x, (size_t)(R * C), -2, 2);
        t_fill(w, (size_t)C, 0.5f, 1.5f);
        k->rms_forward_rows(y, rstd, x, w, 0, R, C, 1e-5f, 0);
        int bad = 0;
        for (int64_t r = 0; r < R; r++) {
            double rs = ref_rmsnorm_row(dy, x + r * C, w, C, 1e-5);
            bad += rel(rstd[r], rs) > 1e-5f;
            for (int64_t i = 0; i < C; i++) bad += fabs(y[r * C + i] - dy[i]) > 1e-5 * (fabs(dy[i]) + 1e-2);
        }
        CHECK(bad == 0);
        free(x), free(w), free(y), free(dy);
    }
}

/* RoPE: against the double rotation, and bitwise equal to the scalar body (same operations). */
static void test_rope(ct_isa isa)
{
    const int64_t Ps[] = {1, 7, 8, 9, 32, 33};
    for (size_t pi = 0; pi < sizeof Ps / sizeof Ps[0]; pi++) {
        int64_t P = Ps[pi], T = 3, H = 2, rows = 2 * T * H;
        float *x = malloc(4 * (size_t)(rows * 2 * P)), *y = malloc(4 * (size_t)(rows * 2 * P));
        float *z = malloc(4 * (size_t)(rows * 2 * P)), *tab = malloc(4 * (size_t)(T * 2 * P));
        t_fill(x, (size_t)(rows * 2 * P), -2, 2);
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < P; i++) {
                double ang = (double)t * pow(10000.0, -2.0 * (double)i / (double)(2 * P));
                tab[t * 2 * P + i] = (float)cos(ang);
                tab[t * 2 * P + P + i] = (float)sin(ang);
            }
        for (int dir = 0; dir < 2; dir++) {
            float sign = dir ? -1.0f : 1.0f;
            ct_rope_tables[isa]->rotate_rows(y, x, tab, 0, rows, T, H, P, sign);
            ct_rope_scalar.rotate_rows(z, x, tab, 0, rows, T, H, P, sign);
            CHECK(!memcmp(y, z, 4 * (size_t)(rows * 2 * P)));
            int bad = 0;
            for (int64_t r = 0; r < rows; r++) {
                const float *cs = tab + ((r / H) % T) * 2 * P;
                for (int64_t i = 0; i < P; i++) {
                    double c = cs[i], s = sign * cs[P + i], x1 = x[r * 2 * P + i], x2 = x[r * 2 * P + P + i];
                    bad += fabs(y[r * 2 * P + i] - (x1 * c - x2 * s)) > 1e-6;
                    bad += fabs(y[r * 2 * P + P + i] - (x2 * c + x1 * s)) > 1e-6;
                }
            }
            CHECK(bad == 0);
        }
        free(x), free(y), free(z), free(tab);
    }
}

/* ---- norm rows, softmax rows, reductions: odd sizes, bf16, thread counts ---------------- */

static const int64_t row_sizes[] = {1, 7, 8, 9, 17, 33, 64, 79, 1000}; /* tails of 8 and 16 lanes */
#define NROWSIZES (sizeof row_sizes / sizeof row_sizes[0])

/* The worst |got - want| / tol over a check, printed so the margin of each bound shows. */
typedef struct {
    double worst;
    int bad;
} t_err;

static void err_add(t_err *e, double got, double want, double tol)
{
    if (isnan(got) || isnan(want)) {
        e->bad += isnan(got) != isnan(want);
        return;
    }
    if (isinf(got) || isinf(want)) {
        e->bad += got != want;
        return;
    }
    double r = fabs(got - want) / tol;
    if (r > e->worst) e->worst = r;
    e->bad += r > 1.0;
}

static void err_report(ct_isa isa, const char *what, const t_err *e)
{
    printf("test_kernels_isa: %s %s: worst error %.3f of the bound%s\n", ct_isa_name(isa), what,
           e->worst, e->bad ? " (FAILED)" : "");
    CHECK(e->bad == 0);
}

/* x rounded to bf16 into h, and x replaced by the values h holds (the reference's inputs). */
static void to_bf16(uint16_t *h, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h[i] = ref_f32_to_bf16(x[i]);
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&x[i], &u, 4);
    }
}

static float bf_at(const uint16_t *h, int64_t i)
{
    uint32_t u = (uint32_t)h[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define BF16_RTOL (1.0 / 256) /* bf16 keeps 8 significant bits: rounding is at most 2^-8 relative */

/* RMSNorm (backward, and forward in bf16: test_rms has f32) and LayerNorm rows, forward and
 * backward, f32 and bf16, with and without weight (and bias), against the double
 * references. Bounds: f32 statistics rel 1e-5 (abs 1e-6 on the mean, which is near 0);
 * outputs rel 1e-5 + abs 1e-5 (f32 row sums over at most 1000 values of [-2, 2]); the
 * backward dx within 1e-5 of its own scale rs (|dn| + mean|dn| + |xh| mean|dn xh|) (the row
 * sums it subtracts); pw / pb within 1e-5 of the sums of |terms|; bf16 outputs add 2^-8
 * relative for their rounding. Measured (scalar, avx2 on an AMD EPYC): the f32 errors use at
 * most 4 % of their bounds; the bf16 ones up to 98 %, the rounding itself. */
static void test_norm_rows(ct_isa isa)
{
    const ct_norm_kernels *k = ct_norm_tables[isa];
    t_err ef[2] = {{0}}, eb[2] = {{0}}, rf = {0}, rb[2] = {{0}};
    for (size_t si = 0; si < NROWSIZES; si++)
        for (int bf = 0; bf < 2; bf++)
            for (int aff = 0; aff < 2; aff++) {
                int64_t C = row_sizes[si], R = 3, n = R * C;
                float *x = malloc(4 * (size_t)n), *g = malloc(4 * (size_t)n);
                float *w = malloc(4 * (size_t)C), *b = malloc(4 * (size_t)C);
                float *y = malloc(4 * (size_t)n), *dx = malloc(4 * (size_t)n);
                float *pw = calloc((size_t)C, 4), *pb = calloc((size_t)C, 4);
                uint16_t *xh = malloc(2 * (size_t)n), *gh = malloc(2 * (size_t)n);
                uint16_t *wh = malloc(2 * (size_t)C), *bh = malloc(2 * (size_t)C);
                uint16_t *yh = malloc(2 * (size_t)n), *dxh = malloc(2 * (size_t)n);
                double *dy = malloc(8 * (size_t)C), *ddx = malloc(8 * (size_t)C);
                double *dpw = calloc((size_t)C, 8), *dpb = calloc((size_t)C, 8);
                double *apw = calloc((size_t)C, 8), *apb = calloc((size_t)C, 8);
                float mean[3], rstd[3];
                t_fill(x, (size_t)n, -2, 2);
                t_fill(g, (size_t)n, -1, 1);
                t_fill(w, (size_t)C, 0.5f, 1.5f);
                t_fill(b, (size_t)C, -1, 1);
                if (bf) to_bf16(xh, x, (size_t)n), to_bf16(gh, g, (size_t)n), to_bf16(wh, w, (size_t)C), to_bf16(bh, b, (size_t)C);
                const void *X = bf ? (const void *)xh : x, *G = bf ? (const void *)gh : g;
                const void *W = aff ? (bf ? (const void *)wh : w) : NULL;
                const void *B = aff ? (bf ? (const void *)bh : b) : NULL;
                const float *wr = aff ? w : NULL, *br = aff ? b : NULL;
                double rt = bf ? BF16_RTOL : 0;
                /* LayerNorm forward */
                k->ln_forward_rows(bf ? (void *)yh : y, mean, rstd, X, W, B, 0, R, C, 1e-5f, bf);
                for (int64_t r = 0; r < R; r++) {
                    double m, rs = ref_layernorm_row(dy, &m, x + r * C, wr, br, C, 1e-5);
                    err_add(&ef[bf], mean[r], m, 1e-6 + 1e-5 * fabs(m));
                    err_add(&ef[bf], rstd[r], rs, 1e-5 * rs);
                    for (int64_t i = 0; i < C; i++) {
                        double got = bf ? bf_at(yh, r * C + i) : y[r * C + i];
                        err_add(&ef[bf], got, dy[i], 1e-5 + (1e-5 + rt) * fabs(dy[i]));
                    }
                }
                /* LayerNorm backward from the kernel's own mean / rstd */
                k->ln_backward_rows(bf ? (void *)dxh : dx, pw, pb, G, X, W, mean, rstd, 0, R, C, bf);
                for (int64_t r = 0; r < R; r++) {
                    const float *xr = x + r * C, *gr = g + r * C;
                    ref_layernorm_backward_row(ddx, dpw, dpb, gr, xr, wr, mean[r], rstd[r], C);
                    double a1 = 0, a2 = 0;
                    for (int64_t i = 0; i < C; i++) {
                        double xhat = (xr[i] - mean[r]) * rstd[r], dn = gr[i] * (wr ? wr[i] : 1.0);
                        a1 += fabs(dn), a2 += fabs(dn * xhat);
                        apw[i] += fabs(gr[i] * xhat), apb[i] += fabs(gr[i]);
                    }
                    a1 /= (double)C, a2 /= (double)C;
                    for (int64_t i = 0; i < C; i++) {
                        double xhat = (xr[i] - mean[r]) * rstd[r], dn = gr[i] * (wr ? wr[i] : 1.0);
                        double scale = rstd[r] * (fabs(dn) + a1 + fabs(xhat) * a2);
                        double got = bf ? bf_at(dxh, r * C + i) : dx[r * C + i];
                        err_add(&eb[bf], got, ddx[i], 1e-5 * scale + 1e-30 + rt * fabs(ddx[i]));
                    }
                }
                for (int64_t i = 0; i < C; i++) {
                    err_add(&eb[bf], pw[i], dpw[i], 1e-5 * apw[i] + 1e-30);
                    err_add(&eb[bf], pb[i], dpb[i], 1e-5 * apb[i] + 1e-30);
                }
                /* RMSNorm: the bf16 forward (f32 is test_rms) and the backward */
                if (bf) {
                    k->rms_forward_rows(yh, rstd, X, W, 0, R, C, 1e-5f, 1);
                    for (int64_t r = 0; r < R; r++) {
                        double rs = ref_rmsnorm_row(dy, x + r * C, wr, C, 1e-5);
                        err_add(&rf, rstd[r], rs, 1e-5 * rs);
                        for (int64_t i = 0; i < C; i++)
                            err_add(&rf, bf_at(yh, r * C + i), dy[i], 1e-5 + (1e-5 + rt) * fabs(dy[i]));
                    }
                } else {
                    k->rms_forward_rows(y, rstd, X, W, 0, R, C, 1e-5f, 0);
                }
                memset(pw, 0, 4 * (size_t)C);
                memset(dpw, 0, 8 * (size_t)C);
                memset(apw, 0, 8 * (size_t)C);
                k->rms_backward_rows(bf ? (void *)dxh : dx, pw, G, X, W, rstd, 0, R, C, bf);
                for (int64_t r = 0; r < R; r++) {
                    const float *xr = x + r * C, *gr = g + r * C;
                    double rs = rstd[r], dot = 0;
                    ref_rmsnorm_backward_row(ddx, dpw, gr, xr, wr, rs, C);
                    for (int64_t i = 0; i < C; i++) {
                        dot += fabs(gr[i] * (wr ? wr[i] : 1.0) * xr[i]);
                        apw[i] += fabs(gr[i] * xr[i] * rs);
                    }
                    for (int64_t i = 0; i < C; i++) {
                        double scale = rs * fabs(gr[i] * (wr ? wr[i] : 1.0)) + dot / (double)C * rs * rs * rs * fabs(xr[i]);
                        double got = bf ? bf_at(dxh, r * C + i) : dx[r * C + i];
                        err_add(&rb[bf], got, ddx[i], 1e-5 * scale + 1e-30 + rt * fabs(ddx[i]));
                    }
                }
                for (int64_t i = 0; i < C; i++) err_add(&rb[bf], pw[i], dpw[i], 1e-5 * apw[i] + 1e-30);
                free(x), free(g), free(w), free(b), free(y), free(dx), free(pw), free(pb);
                free(xh), free(gh), free(wh), free(bh), free(yh), free(dxh);
                free(dy), free(ddx), free(dpw), free(dpb), free(apw), free(apb);
            }
    err_report(isa, "layernorm forward f32", &ef[0]);
    err_report(isa, "layernorm forward bf16", &ef[1]);
    err_report(isa, "layernorm backward f32", &eb[0]);
    err_report(isa, "layernorm backward bf16", &eb[1]);
    err_report(isa, "rmsnorm forward bf16", &rf);
    err_report(isa, "rmsnorm backward f32", &rb[0]);
    err_report(isa, "rmsnorm backward bf16", &rb[1]);
}

/* softmax family rows against the double references. Rows: random in [-20, 20]; the same
 * with every third entry -inf; all -inf (softmax NaN, logsumexp -inf). Bounds: softmax
 * rel 1e-5 (exp within 2 ulp, an f32 sum of at most 1000 positive terms); log_softmax and
 * logsumexp abs 1e-6 + 1e-6 |x| + 1e-6 |lse|; the backwards 1e-5 of their own scale
 * (y (|g| + sum|g y|); |g| + exp(y) sum|g|). Measured: at most 22 % of the bounds. */
static void test_softmax_rows(ct_isa isa)
{
    const ct_softmax_kernels *k = ct_softmax_tables[isa];
    t_err es = {0}, el = {0}, ee = {0}, ebs = {0}, ebl = {0};
    for (size_t si = 0; si < NROWSIZES; si++) {
        int64_t C = row_sizes[si], R = 3, n = R * C;
        float *x = malloc(4 * (size_t)n), *y = malloc(4 * (size_t)n), *g = malloc(4 * (size_t)n);
        float *ys = malloc(4 * (size_t)n), *yl = malloc(4 * (size_t)n), lse[3];
        double *d = malloc(8 * (size_t)C);
        t_fill(x, (size_t)n, -20, 20);
        t_fill(g, (size_t)n, -1, 1);
        for (int64_t i = 0; i < C; i++) {
            if (i % 3 == 1 || C == 1) x[C + i] = -INFINITY;
            x[2 * C + i] = -INFINITY;
        }
        k->softmax_rows(y, x, 0, R, C);
        for (int64_t r = 0; r < R; r++) {
            ref_softmax_row(d, x + r * C, C);
            for (int64_t i = 0; i < C; i++) {
                err_add(&es, y[r * C + i], d[i], 1e-5 * fabs(d[i]) + 1e-37);
                ys[r * C + i] = (float)d[i];
            }
        }
        k->log_softmax_rows(y, x, 0, R, C);
        k->logsumexp_rows(lse, x, 0, R, C);
        for (int64_t r = 0; r < R; r++) {
            double l = ref_logsumexp(x + r * C, C);
            err_add(&ee, lse[r], l, 1e-6 + 1e-6 * fabs(l));
            ref_log_softmax_row(d, x + r * C, C);
            for (int64_t i = 0; i < C; i++) {
                err_add(&el, y[r * C + i], d[i], 1e-6 + 1e-6 * (fabs(x[r * C + i]) + fabs(l)));
                yl[r * C + i] = (float)d[i];
            }
        }
        /* backwards over the first two rows (the third is NaN / -inf through and through) */
        k->softmax_backward_rows(y, g, ys, 0, 2, C);
        for (int64_t r = 0; r < 2; r++) {
            const float *gr = g + r * C, *yr = ys + r * C;
            double a = 0;
            for (int64_t i = 0; i < C; i++) a += fabs((double)gr[i] * yr[i]);
            ref_softmax_backward_row(d, gr, yr, C);
            for (int64_t i = 0; i < C; i++)
                err_add(&ebs, y[r * C + i], d[i], 1e-5 * yr[i] * (fabs(gr[i]) + a) + 1e-37);
        }
        k->log_softmax_backward_rows(y, g, yl, 0, 2, C);
        for (int64_t r = 0; r < 2; r++) {
            const float *gr = g + r * C, *yr = yl + r * C;
            double a = 0;
            for (int64_t i = 0; i < C; i++) a += fabs(gr[i]);
            ref_log_softmax_backward_row(d, gr, yr, C);
            for (int64_t i = 0; i < C; i++)
                err_add(&ebl, y[r * C + i], d[i], 1e-5 * (fabs(gr[i]) + exp((double)yr[i]) * a) + 1e-37);
        }
        free(x), free(y), free(g), free(ys), free(yl), free(d);
    }
    err_report(isa, "softmax", &es);
    err_report(isa, "log_softmax", &el);
    err_report(isa, "logsumexp", &ee);
    err_report(isa, "softmax backward", &ebs);
    err_report(isa, "log_softmax backward", &ebl);
}

/* Reductions: the sums bit for bit in the documented fixed order (every body follows it)
 * and, against the exact sum, within f32 rounding (2^-24 relative) plus the double
 * accumulation (C 2^-52 sum|x|); max/min positions exactly, with ties, -0.0 / +0.0, +-inf
 * and NaN. */
static void test_reduce_rows(ct_isa isa)
{
    const ct_reduce_kernels *k = ct_reduce_tables[isa];
    const int64_t bs[] = {0, 1, 7, 8, 9, 33, 1000, 4095, 4096};
    float *x = malloc(4 * 3 * 9000), out[3];
    t_fill(x, 3 * 9000, -3, 5);
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) {
        double s = k->sum_block(x, bs[i]), want = ref_sum_fixed(x, bs[i]);
        CHECK(!memcmp(&s, &want, sizeof s));
    }
    const int64_t cs[] = {1, 7, 8, 9, 33, 1000, 4097, 9000};
    int bad = 0;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
        for (int mean = 0; mean < 2; mean++) {
            int64_t C = cs[ci];
            k->sum_rows(out, x, 0, 3, C, mean);
            for (int64_t r = 0; r < 3; r++) {
                const float *xr = x + r * C;
                double f = ref_sum_fixed(xr, C), exact = 0, a = 0;
                float want = (float)(mean ? f / (double)C : f);
                bad += memcmp(&out[r], &want, 4) != 0;
                for (int64_t i = 0; i < C; i++) exact += xr[i], a += fabs(xr[i]);
                if (mean) exact /= (double)C, a /= (double)C;
                bad += fabs(out[r] - exact) > ldexp(fabs(exact), -24) + 2.0 * (double)C * ldexp(a, -52);
            }
        }
    CHECK(bad == 0);
    bad = 0;
    for (size_t si = 0; si < NROWSIZES; si++)
        for (int pat = 0; pat < 6; pat++)
            for (int sign = -1; sign <= 1; sign += 2) {
                int64_t C = row_sizes[si], ix[2];
                float *row = malloc(4 * (size_t)C * 2), v[2];
                t_fill(row, (size_t)C * 2, -100, 100);
                for (int64_t r = 0; r < 2; r++) {
                    float *xr = row + r * C;
                    int64_t p = (C * (2 + r)) / 5, q = C - 1 - r;
                    if (pat == 1) xr[p] = xr[q] = sign * 1000.0f; /* tie: first wins */
                    if (pat == 2) for (int64_t i = 0; i < C; i++) xr[i] = i % 2 ? 0.0f : -0.0f;
                    if (pat == 3) xr[p] = NAN, xr[q] = NAN;
                    if (pat == 4) xr[q] = sign * INFINITY, xr[p] = -sign * INFINITY;
                    if (pat == 5) xr[0] = NAN;
                }
                k->extreme_rows(v, ix, row, 0, 2, C, sign);
                for (int64_t r = 0; r < 2; r++) {
                    int64_t want = ref_extreme_index(row + r * C, C, sign);
                    bad += ix[r] != want || memcmp(&v[r], &row[r * C + want], 4) != 0;
                }
                k->extreme_rows(NULL, ix, row, 1, 2, C, sign); /* values skipped, one row */
                bad += ix[1] != ref_extreme_index(row + C, C, sign);
                free(row);
            }
    CHECK(bad == 0);
    free(x);
}

/* The public entry points with this ISA active, 1 vs 2 threads: the same bits. */
/* The AdamW body against the scalar loop bit for bit (the same IEEE operations in the same
 * order per element), at every size of `sizes` (every tail class of 8 and 16 lanes), with
 * zero gradients and zero second moments among the elements. */
static void test_optim(ct_isa isa)
{
    enum { M = 1027 };
    static float p0[M], m0[M], v0[M], p1[M], m1[M], v1[M], g[M];
    const ct_adamw_consts k = {1.0f - 1e-3f, 0.9f, 0.1f, 0.95f, 0.05f, 0.01f / 0.1f,
                               0.2236068f, 1e-8f};
    int bad = 0;
    for (size_t si = 0; si < NSIZES; si++) {
        int64_t n = sizes[si];
        t_fill(p0, M, -1, 1);
        t_fill(m0, M, -0.1f, 0.1f);
        t_fill(v0, M, 0, 0.01f);
        t_fill(g, M, -0.5f, 0.5f);
        for (int i = 0; i < M; i += 5)
            g[i] = 0, v0[i] = 0;
        memcpy(p1, p0, sizeof p0), memcpy(m1, m0, sizeof m0), memcpy(v1, v0, sizeof v0);
        ct_optim_tables[CT_ISA_SCALAR]->adamw(p0, g, m0, v0, n, &k);
        ct_optim_tables[isa]->adamw(p1, g, m1, v1, n, &k);
        /* the whole arrays: nothing past n written */
        bad += memcmp(p0, p1, sizeof p0) != 0 || memcmp(m0, m1, sizeof m0) != 0 ||
               memcmp(v0, v1, sizeof v0) != 0;
    }
    printf("test_kernels_isa: %s adamw vs the scalar loop bit for bit: %d sizes differ\n",
           ct_isa_name(isa), bad);
    CHECK(bad == 0);
}

static void test_threads(ct_isa isa)
{
    if (ct_set_isa(isa) != CT_OK) return;
    int saved = ct_num_threads();
    enum { N = 37, C = 1000, L = 100003 };
    float *x = malloc(4 * (size_t)L), *g = malloc(4 * N * C), *w = malloc(4 * C), *b = malloc(4 * C);
    uint16_t *xh = malloc(2 * N * C), *gh = malloc(2 * N * C), *wh = malloc(2 * C), *bh = malloc(2 * C);
    t_fill(x, L, -3, 3);
    t_fill(g, N * C, -1, 1);
    t_fill(w, C, 0.5f, 1.5f);
    t_fill(b, C, -1, 1);
    to_bf16(xh, x, N * C), to_bf16(gh, g, N * C), to_bf16(wh, w, C), to_bf16(bh, b, C);
    /* each run's outputs: f32, int64 and bf16 arrays, compared bytewise */
    const size_t nf = 6 * (size_t)N * C + 3 * (size_t)C + 9 * N + 2, ni = 3 * N, nh = 2 * (size_t)N * C;
    float *fo[2];
    int64_t *io[2];
    uint16_t *ho[2];
    for (int t = 0; t < 2; t++) {
        fo[t] = calloc(nf + 2 * C + 2 * N, 4), io[t] = calloc(ni, 8), ho[t] = calloc(nh, 2);
        CHECK_OK(ct_set_num_threads(t + 1));
        float *y = fo[t], *mean = y + N * C, *rstd = mean + N, *dx = rstd + N, *dw = dx + N * C;
        float *db = dw + C, *sm = db + C, *ls = sm + N * C, *lse = ls + N * C, *ds = lse + N;
        float *dl = ds + N * C, *sums = dl + N * C, *ext = sums + 3 * N + 2, *rr = ext + 2 * N;
        float *rdw = rr + N, *dwb = rdw + C, *dbb = dwb + C, *mb = dbb + C, *rb = mb + N;
        int64_t *idx = io[t];
        uint16_t *yh = ho[t], *dxh = yh + N * C;
        CHECK_OK(ct_layernorm_forward(y, mean, rstd, x, w, b, N, C, 1e-5f));
        CHECK_OK(ct_layernorm_backward(dx, dw, db, g, x, w, mean, rstd, N, C));
        CHECK_OK(ct_layernorm_forward_bf16(yh, mb, rb, xh, wh, bh, N, C, 1e-5f));
        CHECK_OK(ct_layernorm_backward_bf16(dxh, dwb, dbb, gh, xh, wh, mb, rb, N, C));
        CHECK_OK(ct_rmsnorm_forward(y, rr, x, w, N, C, 1e-5f));
        CHECK_OK(ct_rmsnorm_backward(dx, rdw, g, x, w, rr, N, C));
        CHECK_OK(ct_softmax_forward(sm, x, N, C));
        CHECK_OK(ct_log_softmax_forward(ls, x, N, C));
        CHECK_OK(ct_logsumexp_rows(lse, x, N, C));
        CHECK_OK(ct_softmax_backward(ds, g, sm, N, C));
        CHECK_OK(ct_log_softmax_backward(dl, g, ls, N, C));
        CHECK_OK(ct_sum_rows(sums, x, N, C));
        CHECK_OK(ct_mean_rows(sums + N, x, N, C));
        CHECK_OK(ct_sum_rows(sums + 2 * N, x, 1, L)); /* one long row: blocks in parallel */
        CHECK_OK(ct_sum_all(sums + 2 * N + 1, x, L));
        CHECK_OK(ct_max_rows(ext, idx, x, N, C));
        CHECK_OK(ct_min_rows(ext + N, idx + N, x, N, C));
        CHECK_OK(ct_argmax_rows(idx + 2 * N, x, N, C));
        CHECK(rb + N <= fo[t] + nf + 2 * C + 2 * N);
    }
    CHECK(!memcmp(fo[0], fo[1], 4 * (nf + 2 * C + 2 * N)) && !memcmp(io[0], io[1], 8 * ni) &&
          !memcmp(ho[0], ho[1], 2 * nh));
    for (int t = 0; t < 2; t++) free(fo[t]), free(io[t]), free(ho[t]);
    CHECK_OK(ct_set_num_threads(saved));
    free(x), free(g), free(w), free(b), free(xh), free(gh), free(wh), free(bh);
}

/* Two tables giving the same bits on the same inputs: avx512 vs avx2 where both run, sums
 * included; sve vs neon on every element-wise result (the same lane maths), while sums, which
 * SVE folds in an order set by its vector length, agree within a few ulp (sums_bitwise = 0). */
static bool close_rel(const float *p, const float *q, int n, float tol)
{
    for (int i = 0; i < n; i++)
        if (!(fabsf(p[i] - q[i]) <= tol * fmaxf(fabsf(p[i]), fabsf(q[i])))) return false;
    return true;
}

static void test_same_bits(ct_isa a, ct_isa b, int sums_bitwise)
{
    enum { N = 1000 };
    float x[N], o1[N], o2[N];
    t_fill(x, N, -10, 10);
    float e1 = ct_vec_tables[a]->vexpsum(o1, x, 1.0f, N), e2 = ct_vec_tables[b]->vexpsum(o2, x, 1.0f, N);
    CHECK(sums_bitwise ? e1 == e2 : close_rel(&e1, &e2, 1, 1e-6f));
    CHECK(!memcmp(o1, o2, sizeof o1));
    /* element-wise: the same bits in f32 and bf16, with a tail (997 = 124 * 8 + 5) */
    enum { NE = 997 };
    float g[N], d1[N], d2[N];
    uint16_t xb[N], gb[N], hb1[N], hb2[N], kb1[N], kb2[N];
    t_fill(g, N, -2, 2);
    for (int i = 0; i < N; i++) xb[i] = ct_f32_to_bf16(x[i]), gb[i] = ct_f32_to_bf16(g[i]);
    for (int kind = 0; kind < 3; kind++) {
        ct_elementwise_tables[a]->act_forward(kind, o1, x, NE, 0);
        ct_elementwise_tables[b]->act_forward(kind, o2, x, NE, 0);
        CHECK(!memcmp(o1, o2, NE * sizeof(float)));
        ct_elementwise_tables[a]->act_backward(kind, o1, g, x, NE, 0);
        ct_elementwise_tables[b]->act_backward(kind, o2, g, x, NE, 0);
        CHECK(!memcmp(o1, o2, NE * sizeof(float)));
        ct_elementwise_tables[a]->act_forward(kind, hb1, xb, NE, 1);
        ct_elementwise_tables[b]->act_forward(kind, hb2, xb, NE, 1);
        CHECK(!memcmp(hb1, hb2, NE * sizeof(uint16_t)));
        ct_elementwise_tables[a]->act_backward(kind, hb1, gb, xb, NE, 1);
        ct_elementwise_tables[b]->act_backward(kind, hb2, gb, xb, NE, 1);
        CHECK(!memcmp(hb1, hb2, NE * sizeof(uint16_t)));
    }
    ct_elementwise_tables[a]->swiglu_forward(o1, x, g, NE, 0);
    ct_elementwise_tables[b]->swiglu_forward(o2, x, g, NE, 0);
    CHECK(!memcmp(o1, o2, NE * sizeof(float)));
    ct_elementwise_tables[a]->swiglu_backward(o1, d1, g, x, g, NE, 0);
    ct_elementwise_tables[b]->swiglu_backward(o2, d2, g, x, g, NE, 0);
    CHECK(!memcmp(o1, o2, NE * sizeof(float)) && !memcmp(d1, d2, NE * sizeof(float)));
    ct_elementwise_tables[a]->swiglu_backward(hb1, kb1, gb, xb, gb, NE, 1);
    ct_elementwise_tables[b]->swiglu_backward(hb2, kb2, gb, xb, gb, NE, 1);
    CHECK(!memcmp(hb1, hb2, NE * sizeof(uint16_t)) && !memcmp(kb1, kb2, NE * sizeof(uint16_t)));
    float r1[10], r2[10];
    ct_norm_tables[a]->rms_forward_rows(o1, r1, x, NULL, 0, 10, 100, 1e-5f, 0);
    ct_norm_tables[b]->rms_forward_rows(o2, r2, x, NULL, 0, 10, 100, 1e-5f, 0);
    if (sums_bitwise)
        CHECK(!memcmp(o1, o2, sizeof o1) && !memcmp(r1, r2, sizeof r1));
    else
        CHECK(close_rel(o1, o2, N, 1e-6f) && close_rel(r1, r2, 10, 1e-6f));
    float S1[16 * 24], S2[16 * 24], m1[16], m2[16], l1[16], l2[16], al1[16], al2[16];
    t_fill(S1, 16 * 24, -5, 5);
    memcpy(S2, S1, sizeof S1);
    for (int i = 0; i < 16; i++) m1[i] = m2[i] = -INFINITY, l1[i] = l2[i] = 0;
    ct_attn_tables[a]->softmax_update(S1, 24, 16, 16, m1, l1, al1);
    ct_attn_tables[b]->softmax_update(S2, 24, 16, 16, m2, l2, al2);
    CHECK(!memcmp(S1, S2, sizeof S1)); /* max and exp: exact in every ISA */
    CHECK(sums_bitwise ? !memcmp(l1, l2, sizeof l1) : close_rel(l1, l2, 16, 1e-6f));
}

/* avx512 vs avx2 bit for bit at every tail class of both widths (n mod 16 below, at and above
 * 8): the row primitives, the activations (f32 and bf16), the softmax rows, the RMSNorm and
 * LayerNorm rows. */
static void test_same_bits_tails(ct_isa a, ct_isa b)
{
    static const int64_t ns[] = {1, 5, 8, 13, 16, 24, 29, 33, 997};
    enum { M = 1000 };
    static float x[M], g[M], p1[M], p2[M], q1[M], q2[M];
    static uint16_t xb[M], gb[M], h1[M], h2[M], k1[M], k2[M];
    t_fill(x, M, -10, 10);
    t_fill(g, M, -2, 2);
    for (int i = 0; i < M; i++) xb[i] = ct_f32_to_bf16(x[i]), gb[i] = ct_f32_to_bf16(g[i]);
    const ct_vec_kernels *va = ct_vec_tables[a], *vb = ct_vec_tables[b];
    const ct_elementwise_kernels *ea = ct_elementwise_tables[a], *eb = ct_elementwise_tables[b];
    const ct_softmax_kernels *sa = ct_softmax_tables[a], *sb = ct_softmax_tables[b];
    int bad = 0;
#define SAME(p, q, n) (bad += memcmp(p, q, (size_t)(n) * sizeof *(p)) != 0)
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        int64_t n = ns[t];
        float e1 = va->vexpsum(p1, x, 2.0f, n), e2 = vb->vexpsum(p2, x, 2.0f, n);
        bad += memcmp(&e1, &e2, 4) != 0;
        SAME(p1, p2, n);
        float m1 = va->vmax(x, n), m2 = vb->vmax(x, n), d1 = va->vdot(x, g, n), d2 = vb->vdot(x, g, n);
        bad += memcmp(&m1, &m2, 4) != 0 || memcmp(&d1, &d2, 4) != 0;
        memcpy(p1, g, sizeof g), memcpy(p2, g, sizeof g);
        va->vaxpy(p1, 0.37f, x, n), vb->vaxpy(p2, 0.37f, x, n);
        va->vscale(p1, 1.3f, n), vb->vscale(p2, 1.3f, n);
        SAME(p1, p2, M);
        for (int kind = 0; kind < 3; kind++) {
            ea->act_forward(kind, p1, x, n, 0), eb->act_forward(kind, p2, x, n, 0);
            ea->act_backward(kind, q1, g, x, n, 0), eb->act_backward(kind, q2, g, x, n, 0);
            SAME(p1, p2, n), SAME(q1, q2, n);
            ea->act_forward(kind, h1, xb, n, 1), eb->act_forward(kind, h2, xb, n, 1);
            ea->act_backward(kind, k1, gb, xb, n, 1), eb->act_backward(kind, k2, gb, xb, n, 1);
            SAME(h1, h2, n), SAME(k1, k2, n);
        }
        ea->swiglu_forward(p1, x, g, n, 0), eb->swiglu_forward(p2, x, g, n, 0);
        SAME(p1, p2, n);
        ea->swiglu_backward(p1, q1, g, x, g, n, 0), eb->swiglu_backward(p2, q2, g, x, g, n, 0);
        SAME(p1, p2, n), SAME(q1, q2, n);
        ea->swiglu_backward(h1, k1, gb, xb, gb, n, 1), eb->swiglu_backward(h2, k2, gb, xb, gb, n, 1);
        SAME(h1, h2, n), SAME(k1, k2, n);
        /* softmax rows: one row of n, and n rows of 1 */
        int64_t rows = n <= 33 ? 3 : 1;
        sa->softmax_rows(p1, x, 0, rows, n), sb->softmax_rows(p2, x, 0, rows, n);
        SAME(p1, p2, rows * n);
        sa->softmax_backward_rows(q1, g, p1, 0, rows, n), sb->softmax_backward_rows(q2, g, p2, 0, rows, n);
        SAME(q1, q2, rows * n);
        sa->log_softmax_rows(p1, x, 0, rows, n), sb->log_softmax_rows(p2, x, 0, rows, n);
        SAME(p1, p2, rows * n);
        sa->log_softmax_backward_rows(q1, g, p1, 0, rows, n), sb->log_softmax_backward_rows(q2, g, p2, 0, rows, n);
        SAME(q1, q2, rows * n);
        sa->logsumexp_rows(p1, x, 0, rows, n), sb->logsumexp_rows(p2, x, 0, rows, n);
        SAME(p1, p2, rows);
        /* RMSNorm / LayerNorm rows, forward and backward, with and without weight (and bias),
         * f32 and bf16; the weight-gradient rows accumulate into pw / pb */
        const ct_norm_kernels *na = ct_norm_tables[a], *nb = ct_norm_tables[b];
        float r1[3], r2[3], mu1[3], mu2[3];
        for (int bf = 0; bf < 2; bf++)
            for (int hw = 0; hw < 2; hw++) {
                const void *in = bf ? (const void *)xb : x, *gr = bf ? (const void *)gb : g;
                const void *wt = hw ? (bf ? (const void *)gb : g) : NULL;
                void *o1 = bf ? (void *)h1 : p1, *o2 = bf ? (void *)h2 : p2;
                size_t es = bf ? 2 : 4, len = (size_t)(rows * n) * es;
                na->rms_forward_rows(o1, r1, in, wt, 0, rows, n, 1e-5f, bf);
                nb->rms_forward_rows(o2, r2, in, wt, 0, rows, n, 1e-5f, bf);
                bad += memcmp(o1, o2, len) != 0 || memcmp(r1, r2, 4 * (size_t)rows) != 0;
                for (int i = 0; i < n; i++) q1[i] = q2[i] = 0.25f;
                na->rms_backward_rows(o1, q1, gr, in, wt, r1, 0, rows, n, bf);
                nb->rms_backward_rows(o2, q2, gr, in, wt, r1, 0, rows, n, bf);
                bad += memcmp(o1, o2, len) != 0 || memcmp(q1, q2, 4 * (size_t)n) != 0;
                na->ln_forward_rows(o1, mu1, r1, in, wt, wt, 0, rows, n, 1e-5f, bf);
                nb->ln_forward_rows(o2, mu2, r2, in, wt, wt, 0, rows, n, 1e-5f, bf);
                bad += memcmp(o1, o2, len) != 0 || memcmp(r1, r2, 4 * (size_t)rows) != 0 ||
                       memcmp(mu1, mu2, 4 * (size_t)rows) != 0;
                for (int i = 0; i < n; i++) q1[i] = q2[i] = 0.25f, p1[M - 1 - i] = p2[M - 1 - i] = -0.5f;
                float *pb1 = hw ? p1 + M - n : NULL, *pb2 = hw ? p2 + M - n : NULL;
                if (!bf) pb1 = pb2 = NULL; /* p1 / p2 hold the f32 outputs */
                na->ln_backward_rows(o1, q1, pb1, gr, in, wt, mu1, r1, 0, rows, n, bf);
                nb->ln_backward_rows(o2, q2, pb2, gr, in, wt, mu1, r1, 0, rows, n, bf);
                bad += memcmp(o1, o2, len) != 0 || memcmp(q1, q2, 4 * (size_t)n) != 0;
                if (pb1) bad += memcmp(pb1, pb2, 4 * (size_t)n) != 0;
            }
    }
#undef SAME
    printf("test_kernels_isa: %s vs %s bit for bit at n = 1 .. 997 (every tail class): %d differ\n",
           ct_isa_name(b), ct_isa_name(a), bad);
    CHECK(bad == 0);
}

int main(void)
{
    ct_isa simd[CT_ISA_COUNT], active = ct_active_isa();
    int nsimd = 0;
    for (int i = 0; i < CT_ISA_COUNT; i++) {
        ct_isa isa = (ct_isa)i;
        if (!ct_cpu_has_isa(isa)) {
            printf("test_kernels_isa: %s SKIPPED: %s lacks it (ct_cpu_has_isa); its bodies are not "
                   "run here\n", ct_isa_name(isa), ct_cpu_name());
            continue;
        }
        printf("test_kernels_isa: %s\n", ct_isa_name(isa));
        test_vec(isa);
        test_exp_ulp(isa);
        test_convert(isa);
        test_act(isa);
        test_rms(isa);
        test_rope(isa);
        test_norm_rows(isa);
        test_softmax_rows(isa);
        test_reduce_rows(isa);
        test_threads(isa);
        test_optim(isa);
        if (isa != CT_ISA_SCALAR) simd[nsimd++] = isa;
    }
    for (int i = 1; i < nsimd; i++)
        if (simd[0] == CT_ISA_AVX2 && simd[i] == CT_ISA_AVX512) {
            test_same_bits(simd[0], simd[i], 1);
            test_same_bits_tails(simd[0], simd[i]);
        }
        else if (simd[0] == CT_ISA_NEON && simd[i] == CT_ISA_SVE)
            test_same_bits(simd[0], simd[i], 0);
    CHECK_OK(ct_set_isa(active));
    return t_report("test_kernels_isa");
}
