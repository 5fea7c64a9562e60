/* ctorch's own GEMM (src/ops/gemm_*.c), forced with ct_gemm_set_impl(CT_GEMM_CTORCH):
 * every transpose, strides wider than the rows, odd sizes, K = 0 and K across several
 * CT_GEMM_KC slices, alpha / beta (beta = 0 over a C of NaN), bf16 operands, against the
 * double reference of tests/ref/ref_gemm.h within its documented bound; the same bits for
 * 1, 2, 3 and 4 threads; the FMA kernels (avx2, avx512) equal bit for bit; ctorch against
 * OpenBLAS; the selection (CT_GEMM, the log line) in child processes. */
#include "test_util.h"

#include "ops/gemm.h"
#include "ops/gemm_kernels.h"
#include "ref/ref_gemm.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

typedef struct {
    int64_t M, N, K;
} shape;

/* Sizes around the AVX2 (6 x 16, MC 144, NC 3072) and AVX-512 (12 x 32, MC 192, NC 768) blockings, odd
 * sizes, K across slices of 256, M past one row chunk (8 MC blocks), N past one column block. */
static const shape shapes[] = {
    {1, 1, 1},    {3, 17, 33},   {17, 3, 127},  {33, 127, 17}, {127, 33, 300}, {64, 64, 513},
    {1, 127, 256}, {127, 1, 257}, {6, 16, 256}, {12, 32, 512}, {300, 50, 40},  {7, 3100, 5},
    {1200, 9, 20}, {5, 7, 0},
    /* the threaded, double-buffered driver across steps: two row chunks (AVX2 1152 rows,
     * AVX-512 1536), two or more column blocks (NC 3072 / 768), K across two slices */
    {1600, 40, 260}, {20, 3100, 260},
};

static const float alphas[] = {1.0f, 0.5f, -1.5f, 0.0f};
static const float betas[] = {0.0f, 0.25f, 1.0f, -2.0f};

typedef struct {
    bool ta, tb, bf;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    float *A, *B, *C0;     /* op storage (f32; bf16 cases hold the rounded values) */
    uint16_t *Ab, *Bb;     /* bf16 copies */
    size_t na, nb, nc;
} gcase;

static void case_make(gcase *g, const shape *s, bool ta, bool tb, int ab, int pad, bool bf)
{
    memset(g, 0, sizeof *g);
    g->ta = ta, g->tb = tb, g->bf = bf;
    g->M = s->M, g->N = s->N, g->K = s->K;
    g->alpha = alphas[ab % 4], g->beta = betas[(ab / 4) % 4];
    g->lda = (ta ? g->M : g->K) + pad;
    g->ldb = (tb ? g->K : g->N) + pad;
    g->ldc = g->N + pad;
    if (g->lda == 0) g->lda = 1;
    if (g->ldb == 0) g->ldb = 1;
    g->na = (size_t)((ta ? g->K : g->M) * g->lda) + 1;
    g->nb = (size_t)((tb ? g->N : g->K) * g->ldb) + 1;
    g->nc = (size_t)(g->M * g->ldc);
    g->A = malloc(4 * g->na), g->B = malloc(4 * g->nb), g->C0 = malloc(4 * g->nc);
    g->Ab = malloc(2 * g->na), g->Bb = malloc(2 * g->nb);
    t_fill(g->A, g->na, -1, 1);
    t_fill(g->B, g->nb, -1, 1);
    t_fill(g->C0, g->nc, -1, 1);
    ct_convert_f32_to_bf16(g->Ab, g->A, g->na);
    ct_convert_f32_to_bf16(g->Bb, g->B, g->nb);
    if (bf) { /* the f32 operands become the bf16 values, so the reference is exact */
        ct_convert_bf16_to_f32(g->A, g->Ab, g->na);
        ct_convert_bf16_to_f32(g->B, g->Bb, g->nb);
    }
    if (g->beta == 0.0f)
        for (int64_t i = 0; i < g->M; i++)
            for (int64_t j = 0; j < g->N; j++) g->C0[i * g->ldc + j] = NAN; /* beta 0 must not read C */
}

static void case_free(gcase *g)
{
    free(g->A), free(g->B), free(g->C0), free(g->Ab), free(g->Bb);
}

static ct_status case_run(const gcase *g, float *C, bool bf)
{
    memcpy(C, g->C0, 4 * g->nc);
    if (bf)
        return ct_gemm_bf16(g->ta, g->tb, g->M, g->N, g->K, g->alpha, g->Ab, g->lda, g->Bb, g->ldb, g->beta, C,
                            g->ldc);
    return ct_gemm_f32(g->ta, g->tb, g->M, g->N, g->K, g->alpha, g->A, g->lda, g->B, g->ldb, g->beta, C, g->ldc);
}

static void describe(const char *what, ct_isa isa, const gcase *g)
{
    fprintf(stderr, "  %s: isa=%s M=%lld N=%lld K=%lld ta=%d tb=%d bf16=%d alpha=%g beta=%g lda=%lld ldb=%lld "
                    "ldc=%lld\n", what, ct_isa_name(isa), (long long)g->M, (long long)g->N, (long long)g->K, g->ta,
            g->tb, g->bf, g->alpha, g->beta, (long long)g->lda, (long long)g->ldb, (long long)g->ldc);
}

/* C against the reference within the bound; the padding columns untouched. */
static int case_check(const gcase *g, const float *C, ct_isa isa, const char *what)
{
    size_t mn = (size_t)(g->M * g->N) + 1;
    double *ref = malloc(8 * mn), *mag = malloc(8 * mn);
    ref_gemm(g->ta, g->tb, g->M, g->N, g->K, g->alpha, g->A, g->lda, g->B, g->ldb, g->beta, g->C0, g->ldc, ref, mag);
    int ok = 1;
    double worst = 0;
    for (int64_t i = 0; i < g->M && ok; i++)
        for (int64_t j = 0; j < g->ldc; j++) {
            float c = C[i * g->ldc + j];
            if (j >= g->N) {
                if (memcmp(&c, &g->C0[i * g->ldc + j], 4)) ok = 0;
                continue;
            }
            double r = ref[i * g->N + j], e = fabs((double)c - r), bnd = ref_gemm_bound(g->K, mag[i * g->N + j]);
            if (!(e <= bnd)) ok = 0; /* also NaN */
            if (bnd > 0 && e / bnd > worst) worst = e / bnd;
        }
    if (!ok) describe(what, isa, g);
    free(ref), free(mag);
    return ok;
}

static int n_cases;
static int n_dot_cases;

/* DAZ / FTZ of vdpbf16ps: a denormal becomes a zero of its sign. */
static float flush(float x)
{
    return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x;
}

static float op_at(const float *X, bool t, int64_t ld, int64_t r, int64_t c)
{
    return t ? X[c * ld + r] : X[r * ld + c];
}

/* The bf16 contract of gemm_kernels.h, one C element at a time, written from the
 * instruction's definition (Intel SDM, VDPBF16PS: per 32-bit lane, the odd pair's product
 * added first, then the even one's, each rounded once, DAZ / FTZ): K slices of CT_GEMM_KC,
 * pairs within a slice, the f32 epilogue. g->A / g->B hold the bf16 values as f32. */
static void emulate_dot(const gcase *g, float *out)
{
    memcpy(out, g->C0, 4 * g->nc);
    for (int64_t i = 0; i < g->M; i++)
        for (int64_t j = 0; j < g->N; j++) {
            float *c = &out[i * g->ldc + j];
            for (int64_t k0 = 0; k0 < g->K; k0 += CT_GEMM_KC) {
                int64_t kb = g->K - k0 < CT_GEMM_KC ? g->K - k0 : CT_GEMM_KC;
                float acc = 0.0f;
                for (int64_t p = 0; p < (kb + 1) / 2; p++)
                    for (int q = 1; q >= 0; q--) {
                        int64_t k = 2 * p + q;
                        float a = k < kb ? op_at(g->A, g->ta, g->lda, i, k0 + k) : 0.0f;
                        float b = k < kb ? op_at(g->B, g->tb, g->ldb, k0 + k, j) : 0.0f;
                        acc = flush(fmaf(flush(a), flush(b), acc));
                    }
                float beta = k0 == 0 ? g->beta : 1.0f;
                *c = beta == 0.0f ? g->alpha * acc : fmaf(g->alpha, acc, beta * *c);
            }
        }
}

/* One case on one ISA: reference, 1/2/3/4/16 threads bitwise, bf16 == f32 on the widened values.
 * Leaves the 1-thread result in out. */
static void one(const gcase *g, ct_isa isa, float *out)
{
    float *C = malloc(4 * g->nc + 4);
    CHECK_OK(ct_set_num_threads(1));
    CHECK_OK(case_run(g, out, g->bf));
    CHECK(case_check(g, out, isa, "reference"));
    static const int Ts[] = {2, 3, 4, 16}; /* 16: tiles of a few strips, many column groups */
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
        int t = Ts[ti];
        CHECK_OK(ct_set_num_threads(t));
        CHECK_OK(case_run(g, C, g->bf));
        if (memcmp(C, out, 4 * g->nc)) {
            CHECK(!"thread counts differ");
            describe("threads", isa, g);
        }
    }
    if (g->bf && ct_gemm_bf16_dot()) { /* vdpbf16ps: the bf16 contract, bit for bit */
        float *E = malloc(4 * g->nc + 4);
        emulate_dot(g, E);
        if (memcmp(E, out, 4 * g->nc)) {
            CHECK(!"bf16 dot kernel differs from the emulation of vdpbf16ps");
            describe("bf16 dot vs emulation", isa, g);
        }
        n_dot_cases++;
        free(E);
    } else if (g->bf) { /* widening while packing is exact: the same bits as the f32 product */
        CHECK_OK(ct_set_num_threads(2));
        CHECK_OK(case_run(g, C, false));
        if (memcmp(C, out, 4 * g->nc)) {
            CHECK(!"bf16 differs from f32 of the same values");
            describe("bf16 vs f32", isa, g);
        }
    }
    n_cases++;
    free(C);
}

/* Every case on every ISA this CPU has; the FMA kernels bitwise equal to each other. */
static void isa_sweep(void)
{
    ct_isa isas[] = {CT_ISA_SCALAR, CT_ISA_AVX2, CT_ISA_AVX512, CT_ISA_NEON, CT_ISA_SVE};
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++)
        if (!ct_cpu_has_isa(isas[i]))
            printf("test_gemm_own: %s skipped: %s lacks it, so its micro-kernel cannot be run here\n",
                   ct_isa_name(isas[i]), ct_cpu_name());
        else
            printf("test_gemm_own: %s: %s micro-kernel\n", ct_isa_name(isas[i]), ct_gemm_tables[isas[i]]->name);
    ct_isa start = ct_active_isa();
    int idx = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            for (int bf = 0; bf < 2; bf++, idx++) {
                if (bf && (s % 3)) continue; /* bf16 on a third of the shapes */
                gcase g;
                case_make(&g, &shapes[s], t & 1, t >> 1, idx, (int)(idx % 3) * 3, bf);
                float *fma_ref = NULL, *R = malloc(4 * g.nc + 4);
                const char *fma_isa = NULL;
                for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
                    if (!ct_cpu_has_isa(isas[i])) continue;
                    CHECK_OK(ct_set_isa(isas[i]));
                    one(&g, isas[i], R);
                    if (isas[i] == CT_ISA_SCALAR || (g.bf && ct_gemm_bf16_dot())) continue; /* other contracts */
                    if (!fma_ref) {
                        fma_ref = malloc(4 * g.nc + 4);
                        memcpy(fma_ref, R, 4 * g.nc);
                        fma_isa = ct_isa_name(isas[i]);
                    } else if (memcmp(fma_ref, R, 4 * g.nc)) {
                        CHECK(!"FMA kernels differ");
                        fprintf(stderr, "  %s vs %s\n", fma_isa, ct_isa_name(isas[i]));
                        describe("isa", isas[i], &g);
                    }
                }
                free(fma_ref), free(R);
                case_free(&g);
            }
    CHECK_OK(ct_set_isa(start));
}

/* ctorch's GEMM against OpenBLAS's on the same operands (both bounded by the reference, so
 * they differ by at most twice the bound). OpenBLAS must load: it is a dependency. */
static void vs_openblas(void)
{
    ct_status s = ct_gemm_set_impl(CT_GEMM_OPENBLAS);
    CHECK_OK(s);
    if (s != CT_OK) {
        fprintf(stderr, "  OpenBLAS cannot be loaded: %s\n", ct_last_error());
        return;
    }
    shape sh[] = {{127, 33, 300}, {64, 64, 513}, {300, 50, 40}, {1, 127, 256}};
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++)
        for (int t = 0; t < 4; t++) {
            gcase g;
            case_make(&g, &sh[i], t & 1, t >> 1, (int)(i * 4 + (size_t)t) * 5, 2, t == 3);
            float *Co = malloc(4 * g.nc), *Cb = malloc(4 * g.nc);
            CHECK_OK(ct_set_num_threads(2));
            CHECK_OK(ct_gemm_set_impl(CT_GEMM_OPENBLAS));
            CHECK_OK(case_run(&g, Cb, g.bf));
            CHECK_OK(ct_gemm_set_impl(CT_GEMM_CTORCH));
            CHECK_OK(case_run(&g, Co, g.bf));
            CHECK(case_check(&g, Cb, ct_active_isa(), "openblas vs reference"));
            size_t mn = (size_t)(g.M * g.N);
            double *ref = malloc(8 * mn), *mag = malloc(8 * mn);
            ref_gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, g.A, g.lda, g.B, g.ldb, g.beta, g.C0, g.ldc, ref, mag);
            int ok = 1;
            for (int64_t r = 0; r < g.M; r++)
                for (int64_t c = 0; c < g.N; c++)
                    if (!(fabs((double)Co[r * g.ldc + c] - Cb[r * g.ldc + c]) <= 2 * ref_gemm_bound(g.K, mag[r * g.N + c])))
                        ok = 0;
            if (!ok) describe("ctorch vs openblas", ct_active_isa(), &g);
            CHECK(ok);
            free(ref), free(mag), free(Co), free(Cb);
            case_free(&g);
        }
    CHECK_OK(ct_gemm_set_impl(CT_GEMM_CTORCH));
}

static void bad_args(void)
{
    float a[16] = {0}, b[16] = {0}, c[16] = {0};
    CHECK_STATUS(ct_gemm_set_impl((ct_gemm_impl)7), CT_EINVAL);
    CHECK_STATUS(ct_gemm_select(1, 1, 1, NULL), CT_EINVAL);
    /* strides below the row length */
    CHECK_STATUS(ct_gemm_f32(false, false, 2, 2, 3, 1.0f, a, 2, b, 0, 0.0f, c, 0), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "lda=2 >= 3") != NULL);
    CHECK_STATUS(ct_gemm_f32(false, true, 2, 3, 2, 1.0f, a, 0, b, 1, 0.0f, c, 0), CT_EINVAL);
    CHECK_STATUS(ct_gemm_bf16(false, false, 2, 3, 2, 1.0f, (uint16_t *)a, 0, (uint16_t *)b, 0, 0.0f, c, 2),
                 CT_EINVAL);
    CHECK_STATUS(ct_gemm_f32(false, false, 2, -1, 2, 1.0f, a, 0, b, 0, 0.0f, c, 0), CT_EINVAL);
    /* M or N of 0 touches nothing; K of 0 scales C */
    CHECK_OK(ct_gemm_f32(false, false, 0, 3, 3, 1.0f, NULL, 0, NULL, 0, 0.0f, NULL, 0));
    float k0[4] = {1, NAN, 3, 4};
    CHECK_OK(ct_gemm_f32(true, true, 2, 2, 0, 1.0f, NULL, 0, NULL, 0, 0.0f, k0, 0));
    CHECK(k0[0] == 0 && k0[1] == 0 && k0[3] == 0);
}

/* ---- selection, in child processes (CT_GEMM is read once per process) ---- */

typedef struct {
    int n;
    ct_log_level level;
    char msg[512];
} log_cap;

static void capture(void *user, ct_log_level level, const char *component, const char *message)
{
    log_cap *l = user;
    if (strcmp(component, "gemm")) return;
    l->n++;
    l->level = level;
    snprintf(l->msg, sizeof l->msg, "%s", message);
}

static int child(const char *mode)
{
    log_cap l = {0};
    ct_log_set_sink(capture, &l, CT_LOG_DEBUG);
    float a[64], b[64], c[64];
    t_fill(a, 64, -1, 1);
    t_fill(b, 64, -1, 1);
    ct_gemm_impl impl = CT_GEMM_AUTO;
    if (!strcmp(mode, "bad")) { /* CT_GEMM=bogus: every GEMM fails, naming the value */
        CHECK_STATUS(ct_gemm_f32(false, false, 8, 8, 8, 1.0f, a, 0, b, 0, 0.0f, c, 0), CT_EINVAL);
        CHECK(strstr(ct_last_error(), "CT_GEMM=bogus") != NULL);
        CHECK_STATUS(ct_gemm_select(8, 8, 8, &impl), CT_EINVAL);
        CHECK(strstr(ct_gemm_describe(), "invalid CT_GEMM") != NULL);
        CHECK(l.n == 0);
        CHECK_OK(ct_gemm_set_impl(CT_GEMM_CTORCH)); /* a program may still force one */
        CHECK_OK(ct_gemm_f32(false, false, 8, 8, 8, 1.0f, a, 0, b, 0, 0.0f, c, 0));
    } else if (!strcmp(mode, "ctorch")) { /* forced, even for a big product */
        CHECK_OK(ct_gemm_select(2048, 2048, 2048, &impl));
        CHECK(impl == CT_GEMM_CTORCH);
        CHECK_OK(ct_gemm_f32(false, false, 8, 8, 8, 1.0f, a, 0, b, 0, 0.0f, c, 0));
        CHECK(l.n == 1 && l.level == CT_LOG_INFO && strstr(l.msg, "forced") && strstr(l.msg, "x"));
        CHECK(strstr(ct_gemm_describe(), "ctorch") == ct_gemm_describe());
    } else if (!strcmp(mode, "openblas")) { /* forced, even for a tiny product */
        CHECK_OK(ct_gemm_select(1, 1, 1, &impl));
        CHECK(impl == CT_GEMM_OPENBLAS);
        CHECK_OK(ct_gemm_f32(false, false, 8, 8, 8, 1.0f, a, 0, b, 0, 0.0f, c, 0));
        CHECK(l.n == 1 && l.level == CT_LOG_INFO && strstr(l.msg, "OpenBLAS"));
        CHECK(strstr(ct_gemm_describe(), "openblas (forced)") != NULL);
    } else { /* unset: the fixed rule; one log line for many GEMMs */
        /* the rule: ctorch's GEMM at 2048^3 with the avx512 kernel only; OpenBLAS for a side < 32 */
        bool big_ctorch = ct_active_isa() == CT_ISA_AVX512;
        CHECK_OK(ct_gemm_select(2048, 2048, 2048, &impl));
        CHECK(impl == (big_ctorch ? CT_GEMM_CTORCH : CT_GEMM_OPENBLAS));
        ct_gemm_impl small;
        CHECK_OK(ct_gemm_select(8, 2048, 2048, &small));
        CHECK(small == CT_GEMM_OPENBLAS);
        ct_gemm_impl again;
        for (int i = 0; i < 3; i++) {
            CHECK_OK(ct_gemm_select(2048, 2048, 2048, &again));
            CHECK(again == impl); /* a rule, not a timing */
        }
        CHECK_OK(ct_gemm_f32(false, false, 8, 8, 8, 1.0f, a, 0, b, 0, 0.0f, c, 0));
        CHECK(l.n == 1 && l.level == CT_LOG_INFO && strstr(l.msg, "fixed rule"));
        CHECK(strstr(ct_gemm_describe(), big_ctorch ? "(openblas where a side < 32)" : "openblas (ctorch") != NULL);
    }
    ct_log_set_sink(NULL, NULL, CT_LOG_WARN);
    return t_report(mode);
}

static void spawn_child(const char *value, const char *mode)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    if (n <= 0) return;
    self[n] = 0;
    /* the environment without CT_GEMM, then CT_GEMM=value (if any) */
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **env = calloc(ne + 2, sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "CT_GEMM=", 8)) env[k++] = environ[i];
    char var[64];
    if (value) {
        snprintf(var, sizeof var, "CT_GEMM=%s", value);
        env[k++] = var;
    }
    env[k] = NULL;
    /* cross-built: run the child through the emulator (CT_TEST_EMULATOR, set by ctest) */
    char *emu = getenv("CT_TEST_EMULATOR");
    char *argv_native[] = {self, "--child", (char *)mode, NULL};
    char *argv_emu[] = {emu, self, "--child", (char *)mode, NULL};
    char **argv = emu && *emu ? argv_emu : argv_native;
    pid_t pid;
    int st = 0;
    CHECK(posix_spawnp(&pid, argv[0], NULL, NULL, argv, env) == 0);
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        CHECK(!"child failed");
        fprintf(stderr, "  child CT_GEMM=%s (%s) exit status %d\n", value ? value : "(unset)", mode, st);
    }
    free(env);
}

/* ct_gemm_mixed (ops/gemm.h): one operand bf16, the other f32, widened while packing: the same
 * bits as ctorch's f32 GEMM on the widened values, for every transpose, at 1 and 2 threads,
 * whatever GEMM the rule or CT_GEMM would pick (this runs under the AUTO rule too); both bf16
 * the same (never the dot instructions); both f32 is ct_gemm_f32. */
static void mixed(void)
{
    static const shape ms[] = {{3, 17, 33}, {127, 33, 300}, {300, 50, 40}, {20, 3100, 260}, {1600, 40, 260}, {5, 7, 0}};
    int saved = ct_num_threads();
    for (size_t si = 0; si < sizeof ms / sizeof ms[0]; si++)
        for (int t = 0; t < 4; t++)
            for (int kind = 0; kind < 3; kind++) { /* A bf16, B bf16, both */
                gcase g;
                case_make(&g, &ms[si], t & 1, t >> 1, 5, 3, true); /* f32 operands hold bf16 values */
                bool abf = kind != 1, bbf = kind != 0;
                float *ref = malloc(4 * g.nc), *got = malloc(4 * g.nc);
                memcpy(ref, g.C0, 4 * g.nc);
                CHECK_OK(ct_gemm_set_impl(CT_GEMM_CTORCH));
                CHECK_OK(ct_gemm_f32(g.ta, g.tb, g.M, g.N, g.K, g.alpha, g.A, g.lda, g.B, g.ldb, g.beta, ref, g.ldc));
                CHECK_OK(ct_gemm_set_impl(CT_GEMM_AUTO));
                for (int th = 1; th <= 2; th++) {
                    CHECK_OK(ct_set_num_threads(th));
                    memcpy(got, g.C0, 4 * g.nc);
                    CHECK_OK(ct_gemm_mixed(g.ta, g.tb, g.M, g.N, g.K, g.alpha, abf ? (const void *)g.Ab : g.A, abf,
                                           g.lda, bbf ? (const void *)g.Bb : g.B, bbf, g.ldb, g.beta, got, g.ldc));
                    bool same = true;
                    for (int64_t i = 0; i < g.M; i++) /* the padding between rows is never written */
                        same &= !memcmp(ref + i * g.ldc, got + i * g.ldc, 4 * (size_t)g.N);
                    if (!same)
                        printf("  ct_gemm_mixed %lldx%lldx%lld ta %d tb %d A %s B %s, %d thread(s): not the f32 GEMM's bits\n",
                               (long long)g.M, (long long)g.N, (long long)g.K, g.ta, g.tb, abf ? "bf16" : "f32",
                               bbf ? "bf16" : "f32", th);
                    CHECK(same);
                }
                free(ref), free(got);
                case_free(&g);
            }
    CHECK_OK(ct_set_num_threads(saved));
    float c = 0;
    CHECK_STATUS(ct_gemm_mixed(false, false, -1, 1, 1, 1.0f, &c, true, 1, &c, false, 1, 0.0f, &c, 1), CT_EINVAL);
    CHECK_OK(ct_gemm_set_impl(CT_GEMM_CTORCH));
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--child")) return child(argv[2]);
    spawn_child("bogus", "bad");
    spawn_child("ctorch", "ctorch");
    spawn_child("openblas", "openblas");
    spawn_child(NULL, "rule");
    CHECK_OK(ct_gemm_set_impl(CT_GEMM_CTORCH));
    bad_args();
    isa_sweep();
    printf("test_gemm_own: %d cases\n", n_cases);
    /* the bf16 dot kernel (AVX512_BF16) ran above, against emulate_dot, where the CPU has it */
    bool dot = false;
    if (ct_cpu_has_isa(CT_ISA_AVX512)) {
        ct_isa was = ct_active_isa();
        CHECK_OK(ct_set_isa(CT_ISA_AVX512));
        dot = ct_gemm_bf16_dot();
        CHECK_OK(ct_set_isa(was));
    }
    if (dot)
        printf("test_gemm_own: bf16 dot (vdpbf16ps): %d cases bit for bit against its emulation\n", n_dot_cases);
    else
        printf("test_gemm_own: bf16 dot (vdpbf16ps) SKIPPED: %s lacks AVX512_BF16 (with AVX-512 F/BW/DQ/VL)\n",
               ct_cpu_name());
    vs_openblas();
    mixed();
    CHECK_OK(ct_gemm_set_impl(CT_GEMM_AUTO));
    return t_report("test_gemm_own");
}
