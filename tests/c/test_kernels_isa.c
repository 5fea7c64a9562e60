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
#include "ops/rope_kernels.h"
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

/* Two tables giving the same bits on the same inputs (avx512 vs avx2 where both run). */
static void test_same_bits(ct_isa a, ct_isa b)
{
    enum { N = 1000 };
    float x[N], o1[N], o2[N];
    t_fill(x, N, -10, 10);
    CHECK(ct_vec_tables[a]->vexpsum(o1, x, 1.0f, N) == ct_vec_tables[b]->vexpsum(o2, x, 1.0f, N));
    CHECK(!memcmp(o1, o2, sizeof o1));
    for (int kind = 0; kind < 3; kind++) {
        ct_elementwise_tables[a]->act_forward(kind, o1, x, N, 0);
        ct_elementwise_tables[b]->act_forward(kind, o2, x, N, 0);
        CHECK(!memcmp(o1, o2, sizeof o1));
    }
    float r1[10], r2[10];
    ct_norm_tables[a]->rms_forward_rows(o1, r1, x, NULL, 0, 10, 100, 1e-5f, 0);
    ct_norm_tables[b]->rms_forward_rows(o2, r2, x, NULL, 0, 10, 100, 1e-5f, 0);
    CHECK(!memcmp(o1, o2, sizeof o1) && !memcmp(r1, r2, sizeof r1));
    float S1[16 * 24], S2[16 * 24], m1[16], m2[16], l1[16], l2[16], al1[16], al2[16];
    t_fill(S1, 16 * 24, -5, 5);
    memcpy(S2, S1, sizeof S1);
    for (int i = 0; i < 16; i++) m1[i] = m2[i] = -INFINITY, l1[i] = l2[i] = 0;
    ct_attn_tables[a]->softmax_update(S1, 24, 16, 16, m1, l1, al1);
    ct_attn_tables[b]->softmax_update(S2, 24, 16, 16, m2, l2, al2);
    CHECK(!memcmp(S1, S2, sizeof S1) && !memcmp(l1, l2, sizeof l1));
}

int main(void)
{
    ct_isa simd[CT_ISA_COUNT];
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
        if (isa != CT_ISA_SCALAR) simd[nsimd++] = isa;
    }
    for (int i = 1; i < nsimd; i++)
        if ((simd[0] == CT_ISA_AVX2 && simd[i] == CT_ISA_AVX512) ||
            (simd[0] == CT_ISA_NEON && simd[i] == CT_ISA_SVE))
            test_same_bits(simd[0], simd[i]);
    return t_report("test_kernels_isa");
}
