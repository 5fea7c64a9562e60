/* Every slot of the backend table (src/device/backend.h) on every device present: the CPU
 * always, "cuda:0" when ct_device_open opens it (else one "SKIPPED: cuda: <why>" line, and a
 * failure instead when CT_TEST_REQUIRE_CUDA=1, as scripts/test-cuda.sh sets on a GPU machine).
 *
 * Each case runs on small and odd shapes with inputs from a fixed-seed generator and is
 * compared with a naive double-precision reference written here from the definitions in
 * backend.h and the public headers. On a GPU each case also runs twice more and must give
 * the same bits (determinism), and is compared with the CPU backend's result.
 *
 * Error bound: |got - ref| <= rtol * (|ref| + rms(ref)) element by element (NaN must meet
 * NaN, infinities must be equal). The rms term keeps values that cancel to about zero (a sum
 * of terms of both signs) from demanding more than f32 can give. rtol: 1e-5 for element-wise
 * f32 ops, 1e-4 for reductions, GEMMs and losses; bf16 bounds are looser where said.
 *
 * A slot a device lacks (NULL) must answer CT_EUNSUPPORTED naming the op and the device; the
 * CPU must have every slot. */
#include "device/device_internal.h"
#include "test_util.h"

#include <stdint.h>

#define RTOL_EW 1e-5
#define RTOL_RED 1e-4

/* ---- devices ----------------------------------------------------------------------------- */

typedef struct tdev {
    ct_device *d;
    const ct_backend_ops *ops;
    ct_backend *bk;
    const char *name;
    bool gpu;
} tdev;

static tdev t_cpu;
static int t_missing; /* slots a device lacks (reported at the end) */

static ct_status slot_rc(const tdev *D, const char *op, int rc)
{
    return rc ? ct_dev_result(D->d, op, rc) : CT_OK;
}

/* Call a slot as the model does (CT_DEV): a NULL slot is CT_EUNSUPPORTED from the device layer. */
#define SLOT(D, slot, ...)                                                                         \
    ((D)->ops->slot ? slot_rc((D), #slot, (D)->ops->slot((D)->bk, __VA_ARGS__))                    \
                    : ct_dev_missing((D)->d, #slot))

/* Whether D has the slot; when not, its CT_EUNSUPPORTED answer must name the op and device. */
static bool has_slot(const tdev *D, const char *op, bool present)
{
    if (present) return true;
    ct_clear_error();
    ct_status s = ct_dev_missing(D->d, op);
    const char *msg = ct_last_error();
    CHECK(s == CT_EUNSUPPORTED);
    CHECK(strstr(msg, op) != NULL);
    CHECK(strstr(msg, D->name) != NULL);
    if (!D->gpu) {
        fprintf(stderr, "  %s: slot %s is missing: the CPU backend must have every slot\n", D->name, op);
        t_failures++;
    } else {
        printf("  %s: %s not on this device (%s: %s)\n", D->name, op, ct_status_name(s), msg);
    }
    t_missing++;
    return false;
}
#define HAS(D, slot) has_slot((D), #slot, (D)->ops->slot != NULL)

/* The device buffers of one run, freed together. The first failure is kept in st. */
#define T_MAXBUF 16
typedef struct tbufs {
    const tdev *D;
    void *p[T_MAXBUF];
    size_t n[T_MAXBUF];
    int k;
    ct_status st;
} tbufs;

/* A device buffer of `bytes`: a copy of host (when given), else 0xFF bytes (NaN floats), so
 * that outputs a slot should write and does not show up. */
static void *tb_new(tbufs *B, const void *host, size_t bytes)
{
    if (B->st != CT_OK || !bytes) return NULL;
    if (B->k == T_MAXBUF) {
        B->st = ct_error(CT_EINTERNAL, "test: too many buffers");
        return NULL;
    }
    void *p = NULL;
    ct_device *d = B->D->d;
    ct_status s = ct_dev_alloc(d, bytes, "test buffer", &p);
    if (s == CT_OK) {
        if (host) {
            s = ct_dev_h2d(d, p, host, bytes);
        } else {
            void *ff = malloc(bytes);
            if (!ff) s = ct_error(CT_ENOMEM, "test: host buffer");
            else {
                memset(ff, 0xFF, bytes);
                s = ct_dev_h2d(d, p, ff, bytes);
                free(ff);
            }
        }
    }
    if (s != CT_OK) {
        if (p) ct_dev_free(d, p, bytes);
        B->st = s;
        return NULL;
    }
    B->p[B->k] = p;
    B->n[B->k++] = bytes;
    return p;
}

static void tb_get(tbufs *B, void *host, const void *dev, size_t bytes)
{
    if (B->st != CT_OK || !bytes) return;
    B->st = ct_dev_d2h((ct_device *)B->D->d, host, dev, bytes);
}

static ct_status tb_done(tbufs *B)
{
    for (int i = B->k - 1; i >= 0; i--) ct_dev_free(B->D->d, B->p[i], B->n[i]);
    B->k = 0;
    return B->st;
}

/* ---- comparison and the per-case driver ---------------------------------------------------- */

static int close_enough(const char *dev, const char *what, const double *got, const double *ref, size_t n,
                        double rtol, double atol)
{
    double ss = 0;
    size_t fin = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i])) ss += ref[i] * ref[i], fin++;
    double rms = fin ? sqrt(ss / (double)fin) : 0;
    double worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(ref[i])) {
            if (isnan(got[i]) != isnan(ref[i])) {
                fprintf(stderr, "  %s %s[%zu]: %.9g vs reference %.9g (NaN mismatch)\n", dev, what, i,
                        got[i], ref[i]);
                return 0;
            }
            continue;
        }
        if (isinf(got[i]) || isinf(ref[i])) {
            if (got[i] != ref[i]) {
                fprintf(stderr, "  %s %s[%zu]: %.9g vs reference %.9g\n", dev, what, i, got[i], ref[i]);
                return 0;
            }
            continue;
        }
        double bound = rtol * (fabs(ref[i]) + rms) + atol;
        double e = fabs(got[i] - ref[i]);
        double r = bound > 0 ? e / bound : (e > 0 ? INFINITY : 0);
        if (r > worst) worst = r, wi = i;
    }
    if (worst > 1.0) {
        fprintf(stderr, "  %s %s[%zu of %zu]: %.9g vs reference %.9g (error %.3g x the bound, rtol %g atol %g)\n",
                dev, what, wi, n, got[wi], ref[wi], worst, rtol, atol);
        return 0;
    }
    return 1;
}

/* One run of a case on device D: uploads the case's inputs, calls the slot(s), reads every
 * output back into out (as doubles: exact for f32 and bf16) and frees its buffers. */
typedef ct_status (*run_fn)(const tdev *D, const void *ctx, double *out);

/* The CPU may answer CT_EUNSUPPORTED for this case (bf16 attention): noted, not a failure, and
 * a GPU is then compared with the double reference alone. */
#define VF_CPU_MAY_REFUSE 1

/* Run a case on D and compare with ref (bound: rtol relative, plus atol absolute where an
 * output is a difference of terms of a known size); on a GPU, twice more for determinism and
 * once on the CPU backend. */
static void verify_ex(const tdev *D, const char *what, run_fn run, const void *ctx, size_t n,
                      const double *ref, double rtol, double atol, int flags)
{
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    if (!a || !b) {
        CHECK(!"out of host memory");
        free(a), free(b);
        return;
    }
    ct_clear_error();
    ct_status s = run(D, ctx, a);
    t_checks++;
    if (s == CT_EUNSUPPORTED && !D->gpu && (flags & VF_CPU_MAY_REFUSE)) {
        static int refused;
        if (!refused++) printf("  %s %s and the like: not on this device (%s)\n", D->name, what, ct_last_error());
        goto out;
    }
    if (s != CT_OK) {
        t_failures++;
        fprintf(stderr, "  %s %s: %s: %s\n", D->name, what, ct_status_name(s), ct_last_error());
        goto out;
    }
    t_checks++;
    if (!close_enough(D->name, what, a, ref, n, rtol, atol)) t_failures++;
    if (D->gpu) {
        for (int rep = 1; rep < 3; rep++) {
            s = run(D, ctx, b);
            CHECK_OK(s);
            t_checks++;
            if (s == CT_OK && memcmp(a, b, n * sizeof *a) != 0) {
                size_t i = 0;
                while (i < n && !memcmp(&a[i], &b[i], sizeof *a)) i++;
                t_failures++;
                fprintf(stderr, "  %s %s: run %d differs from run 1 at [%zu]: %.9g vs %.9g (not deterministic)\n",
                        D->name, what, rep + 1, i, b[i], a[i]);
            }
        }
        s = run(&t_cpu, ctx, b);
        if (s == CT_EUNSUPPORTED && (flags & VF_CPU_MAY_REFUSE)) goto out;
        CHECK_OK(s);
        char label[200];
        snprintf(label, sizeof label, "%.160s vs cpu", what);
        t_checks++;
        if (s == CT_OK && !close_enough(D->name, label, a, b, n, 2 * rtol, 2 * atol)) t_failures++;
    }
out:
    free(a);
    free(b);
}

static void verify(const tdev *D, const char *what, run_fn run, const void *ctx, size_t n,
                   const double *ref, double rtol)
{
    verify_ex(D, what, run, ctx, n, ref, rtol, 0, 0);
}

/* ---- inputs ------------------------------------------------------------------------------ */

static float *fvec(size_t n, float lo, float hi)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    if (x) t_fill(x, n, lo, hi);
    return x;
}

/* bf16 bits of x, round to nearest even (the reference's own rounding; NaN stays NaN). */
static uint16_t bf16_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_val(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Round a vector to bf16 values in place and return their bits. */
static uint16_t *bf16_round(float *x, size_t n)
{
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    if (!h) return NULL;
    for (size_t i = 0; i < n; i++) {
        h[i] = bf16_of(x[i]);
        x[i] = bf16_val(h[i]);
    }
    return h;
}

static void f2d(double *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

static double *dvec(size_t n)
{
    return calloc(n ? n : 1, sizeof(double));
}

static const int64_t NS[] = {1, 7, 33};
static const int64_t CS[] = {1, 5, 64, 130};
static const int64_t VS[] = {1, 3, 1000};
#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- gemm -------------------------------------------------------------------------------- */

typedef struct gemm_ctx {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    ct_dtype dtype;
    const float *A, *B, *C0;      /* f32 values (bf16-rounded for bf16) */
    const uint16_t *Ah, *Bh;      /* bf16 bits */
    size_t na, nb, nc;
} gemm_ctx;

static ct_status gemm_run(const tdev *D, const void *vc, double *out)
{
    const gemm_ctx *c = vc;
    tbufs B = {.D = D};
    bool bf = c->dtype == CT_DTYPE_BF16;
    size_t es = bf ? 2 : 4;
    void *a = tb_new(&B, bf ? (const void *)c->Ah : c->A, c->na * es);
    void *b = tb_new(&B, bf ? (const void *)c->Bh : c->B, c->nb * es);
    float *cc = tb_new(&B, c->C0, c->nc * 4);
    if (B.st == CT_OK)
        B.st = SLOT(D, gemm, c->ta, c->tb, c->M, c->N, c->K, c->alpha, a, c->lda, b, c->ldb, c->beta,
                    cc, c->ldc, c->dtype);
    float *h = malloc(c->nc * 4);
    tb_get(&B, h, cc, c->nc * 4);
    if (B.st == CT_OK) f2d(out, h, c->nc);
    free(h);
    return tb_done(&B);
}

static void test_gemm(const tdev *D)
{
    if (!HAS(D, gemm)) return;
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 5, 33}, {33, 130, 64}, {64, 7, 130}, {130, 33, 1000}, {5, 64, 7}};
    int idx = 0;
    for (int s = 0; s < LEN(shapes); s++)
        for (int tr = 0; tr < 4; tr++)
            for (int dt = 0; dt < 2; dt++, idx++) {
                gemm_ctx c = {.ta = tr & 1, .tb = tr >> 1, .M = shapes[s][0], .N = shapes[s][1], .K = shapes[s][2]};
                c.dtype = dt ? CT_DTYPE_BF16 : CT_DTYPE_F32;
                int pad = idx % 3; /* row strides past the minimum on some cases */
                int64_t ar = c.ta ? c.K : c.M, acn = c.ta ? c.M : c.K;
                int64_t br = c.tb ? c.N : c.K, bcn = c.tb ? c.K : c.N;
                c.lda = acn + pad, c.ldb = bcn + pad, c.ldc = c.N + pad;
                c.alpha = idx % 2 ? 0.75f : 1.0f;
                c.beta = idx % 4 == 3 ? 0.5f : 0.0f;
                c.na = (size_t)(ar * c.lda), c.nb = (size_t)(br * c.ldb), c.nc = (size_t)(c.M * c.ldc);
                float *A = fvec(c.na, -1, 1), *Bm = fvec(c.nb, -1, 1), *C0 = fvec(c.nc, -1, 1);
                uint16_t *Ah = NULL, *Bh = NULL;
                if (dt) Ah = bf16_round(A, c.na), Bh = bf16_round(Bm, c.nb);
                c.A = A, c.B = Bm, c.C0 = C0, c.Ah = Ah, c.Bh = Bh;
                double *ref = dvec(c.nc);
                f2d(ref, C0, c.nc);
                for (int64_t i = 0; i < c.M; i++)
                    for (int64_t j = 0; j < c.N; j++) {
                        double acc = 0;
                        for (int64_t k = 0; k < c.K; k++) {
                            double av = c.ta ? A[k * c.lda + i] : A[i * c.lda + k];
                            double bv = c.tb ? Bm[j * c.ldb + k] : Bm[k * c.ldb + j];
                            acc += av * bv;
                        }
                        double prev = c.beta != 0 ? (double)c.beta * C0[i * c.ldc + j] : 0;
                        ref[i * c.ldc + j] = (double)c.alpha * acc + prev;
                    }
                char what[96];
                snprintf(what, sizeof what, "gemm %s%s %s M%lld N%lld K%lld", c.ta ? "T" : "N", c.tb ? "T" : "N",
                         dt ? "bf16" : "f32", (long long)c.M, (long long)c.N, (long long)c.K);
                /* bf16 operands are exact in f32 (the reference uses the same rounded values),
                 * products exact, sums in f32: the f32 bound holds for both dtypes. */
                verify(D, what, gemm_run, &c, c.nc, ref, RTOL_RED);
                free(A), free(Bm), free(C0), free(Ah), free(Bh), free(ref);
            }
}

/* ---- element-wise and rows ------------------------------------------------------------------ */

typedef struct ew_ctx {
    int op; /* 0 add, 1 add out=x, 2 add out=y, 3 scale, 4 to_bf16, 5 bias_add_rows, 6 bias_grad_rows */
    int64_t n, N, C;
    const float *x, *y;
    float s;
} ew_ctx;

static ct_status ew_run(const tdev *D, const void *vc, double *out)
{
    const ew_ctx *c = vc;
    tbufs B = {.D = D};
    size_t n = (size_t)c->n, bytes = n * 4;
    float *h = malloc(bytes ? bytes : 4);
    switch (c->op) {
    case 0:
    case 1:
    case 2: {
        float *x = tb_new(&B, c->x, bytes), *y = tb_new(&B, c->y, bytes);
        float *o = c->op == 0 ? tb_new(&B, NULL, bytes) : c->op == 1 ? x : y;
        if (B.st == CT_OK) B.st = SLOT(D, add, o, x, y, c->n);
        tb_get(&B, h, o, bytes);
        break;
    }
    case 3: {
        float *x = tb_new(&B, c->x, bytes);
        if (B.st == CT_OK) B.st = SLOT(D, scale, x, c->s, c->n);
        tb_get(&B, h, x, bytes);
        break;
    }
    case 4: {
        float *x = tb_new(&B, c->x, bytes);
        uint16_t *o = tb_new(&B, NULL, n * 2);
        if (B.st == CT_OK) B.st = SLOT(D, to_bf16, o, x, c->n);
        uint16_t *hb = malloc(n * 2);
        tb_get(&B, hb, o, n * 2);
        if (B.st == CT_OK)
            for (size_t i = 0; i < n; i++) h[i] = bf16_val(hb[i]);
        free(hb);
        break;
    }
    case 5: {
        float *x = tb_new(&B, c->x, bytes), *bias = tb_new(&B, c->y, (size_t)c->C * 4);
        if (B.st == CT_OK) B.st = SLOT(D, bias_add_rows, x, bias, c->N, c->C);
        tb_get(&B, h, x, bytes);
        break;
    }
    default: {
        float *d = tb_new(&B, c->x, (size_t)(c->N * c->C) * 4), *db = tb_new(&B, c->y, bytes);
        if (B.st == CT_OK) B.st = SLOT(D, bias_grad_rows, db, d, c->N, c->C);
        tb_get(&B, h, db, bytes);
        break;
    }
    }
    if (B.st == CT_OK) f2d(out, h, n);
    free(h);
    return tb_done(&B);
}

static void test_elementwise(const tdev *D)
{
    static const int64_t ns[] = {1, 7, 33, 1003, 70001};
    char what[96];
    for (int k = 0; k < LEN(ns); k++) {
        int64_t n = ns[k];
        float *x = fvec((size_t)n, -2, 2), *y = fvec((size_t)n, -2, 2);
        double *ref = dvec((size_t)n);
        if (HAS(D, add))
            for (int op = 0; op < 3; op++) {
                for (int64_t i = 0; i < n; i++) ref[i] = (double)x[i] + y[i];
                ew_ctx c = {.op = op, .n = n, .x = x, .y = y};
                snprintf(what, sizeof what, "add%s n%lld", op == 1 ? " out=x" : op == 2 ? " out=y" : "", (long long)n);
                verify(D, what, ew_run, &c, (size_t)n, ref, RTOL_EW);
            }
        if (HAS(D, scale)) {
            for (int64_t i = 0; i < n; i++) ref[i] = (double)x[i] * -1.75;
            ew_ctx c = {.op = 3, .n = n, .x = x, .s = -1.75f};
            snprintf(what, sizeof what, "scale n%lld", (long long)n);
            verify(D, what, ew_run, &c, (size_t)n, ref, RTOL_EW);
        }
        if (HAS(D, to_bf16)) {
            /* special values at the front: zeros, infinities, NaN, the largest float (rounds to
             * inf), ties to even down and up, subnormals, a value that carries into the exponent */
            static const uint32_t sp[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                          0xffc00001u, 0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x00000001u,
                                          0x0001ffffu, 0x807fffffu, 0x3fffffffu, 0x3f80ffffu};
            float *z = malloc((size_t)(n + LEN(sp)) * 4);
            double *zr = dvec((size_t)(n + LEN(sp)));
            for (int i = 0; i < LEN(sp); i++) memcpy(&z[i], &sp[i], 4);
            memcpy(z + LEN(sp), x, (size_t)n * 4);
            int64_t m = n + LEN(sp);
            for (int64_t i = 0; i < m; i++) zr[i] = bf16_val(bf16_of(z[i]));
            ew_ctx c = {.op = 4, .n = m, .x = z};
            snprintf(what, sizeof what, "to_bf16 n%lld", (long long)m);
            verify(D, what, ew_run, &c, (size_t)m, zr, 0); /* exact: one rounding, no arithmetic */
            free(z), free(zr);
        }
        free(x), free(y), free(ref);
    }
    for (int a = 0; a < LEN(NS); a++)
        for (int b = 0; b < LEN(CS); b++) {
            int64_t N = NS[a], C = CS[b];
            size_t nc = (size_t)(N * C);
            float *x = fvec(nc, -2, 2), *bias = fvec((size_t)C, -1, 1), *db0 = fvec((size_t)C, -1, 1);
            double *ref = dvec(nc);
            if (HAS(D, bias_add_rows)) {
                for (int64_t r = 0; r < N; r++)
                    for (int64_t j = 0; j < C; j++) ref[r * C + j] = (double)x[r * C + j] + bias[j];
                ew_ctx c = {.op = 5, .n = (int64_t)nc, .N = N, .C = C, .x = x, .y = bias};
                snprintf(what, sizeof what, "bias_add_rows N%lld C%lld", (long long)N, (long long)C);
                verify(D, what, ew_run, &c, nc, ref, RTOL_EW);
            }
            if (HAS(D, bias_grad_rows)) {
                for (int64_t j = 0; j < C; j++) {
                    double s = db0[j];
                    for (int64_t r = 0; r < N; r++) s += x[r * C + j];
                    ref[j] = s;
                }
                ew_ctx c = {.op = 6, .n = C, .N = N, .C = C, .x = x, .y = db0};
                snprintf(what, sizeof what, "bias_grad_rows N%lld C%lld", (long long)N, (long long)C);
                verify(D, what, ew_run, &c, (size_t)C, ref, RTOL_RED);
            }
            free(x), free(bias), free(db0), free(ref);
        }
}

/* ---- rmsnorm, swiglu, rope ------------------------------------------------------------------ */

typedef struct row_ctx {
    int op; /* 0 rmsnorm fwd, 1 rmsnorm bwd, 2 swiglu fwd, 3 swiglu bwd, 4 rope fwd, 5 rope bwd */
    int64_t N, C;               /* rows, columns (swiglu: C = F) */
    int64_t Bb, T, H, E;        /* rope */
    const float *x, *w, *g, *rstd, *dw0, *inv;
    float eps;
    size_t nout;
} row_ctx;

static ct_status row_run(const tdev *D, const void *vc, double *out)
{
    const row_ctx *c = vc;
    tbufs B = {.D = D};
    int64_t N = c->N, C = c->C;
    float *h = malloc(c->nout * 4);
    switch (c->op) {
    case 0: {
        float *x = tb_new(&B, c->x, (size_t)(N * C) * 4), *w = tb_new(&B, c->w, (size_t)C * 4);
        float *o = tb_new(&B, NULL, (size_t)(N * C) * 4), *r = tb_new(&B, NULL, (size_t)N * 4);
        if (B.st == CT_OK) B.st = SLOT(D, rmsnorm_fwd, o, r, x, w, N, C, c->eps);
        tb_get(&B, h, o, (size_t)(N * C) * 4);
        tb_get(&B, h + N * C, r, (size_t)N * 4);
        break;
    }
    case 1: {
        float *x = tb_new(&B, c->x, (size_t)(N * C) * 4), *w = tb_new(&B, c->w, (size_t)C * 4);
        float *g = tb_new(&B, c->g, (size_t)(N * C) * 4), *r = tb_new(&B, c->rstd, (size_t)N * 4);
        float *di = tb_new(&B, NULL, (size_t)(N * C) * 4), *dw = tb_new(&B, c->dw0, (size_t)C * 4);
        if (B.st == CT_OK) B.st = SLOT(D, rmsnorm_bwd, di, dw, g, x, w, r, N, C);
        tb_get(&B, h, di, (size_t)(N * C) * 4);
        tb_get(&B, h + N * C, dw, (size_t)C * 4);
        break;
    }
    case 2: {
        float *x = tb_new(&B, c->x, (size_t)(N * 2 * C) * 4), *o = tb_new(&B, NULL, (size_t)(N * C) * 4);
        if (B.st == CT_OK) B.st = SLOT(D, swiglu_fwd, o, x, N, C);
        tb_get(&B, h, o, (size_t)(N * C) * 4);
        break;
    }
    case 3: {
        float *x = tb_new(&B, c->x, (size_t)(N * 2 * C) * 4), *g = tb_new(&B, c->g, (size_t)(N * C) * 4);
        float *di = tb_new(&B, NULL, (size_t)(N * 2 * C) * 4);
        if (B.st == CT_OK) B.st = SLOT(D, swiglu_bwd, di, g, x, N, C);
        tb_get(&B, h, di, (size_t)(N * 2 * C) * 4);
        break;
    }
    default: {
        float *x = tb_new(&B, c->x, c->nout * 4), *inv = tb_new(&B, c->inv, (size_t)(c->E / 2) * 4);
        if (B.st == CT_OK) B.st = SLOT(D, rope, x, c->Bb, c->T, c->H, c->E, inv, c->op == 5);
        tb_get(&B, h, x, c->nout * 4);
        break;
    }
    }
    if (B.st == CT_OK) f2d(out, h, c->nout);
    free(h);
    return tb_done(&B);
}

static void test_rows(const tdev *D)
{
    char what[96];
    for (int a = 0; a < LEN(NS); a++)
        for (int b = 0; b < LEN(CS); b++) {
            int64_t N = NS[a], C = CS[b];
            size_t nc = (size_t)(N * C);
            float *x = fvec(nc, -2, 2), *w = fvec((size_t)C, 0.5f, 1.5f), *g = fvec(nc, -1, 1);
            float *dw0 = fvec((size_t)C, -1, 1), *rstd = malloc((size_t)N * 4);
            double *ref = dvec(nc + (size_t)C + (size_t)N);
            const float eps = 1e-5f;
            for (int64_t r = 0; r < N; r++) {
                double ss = 0;
                for (int64_t j = 0; j < C; j++) ss += (double)x[r * C + j] * x[r * C + j];
                double rs = 1.0 / sqrt(ss / (double)C + eps);
                rstd[r] = (float)rs;
                ref[nc + r] = rs;
                for (int64_t j = 0; j < C; j++) ref[r * C + j] = x[r * C + j] * rs * w[j];
            }
            if (HAS(D, rmsnorm_fwd)) {
                row_ctx c = {.op = 0, .N = N, .C = C, .x = x, .w = w, .eps = eps, .nout = nc + (size_t)N};
                snprintf(what, sizeof what, "rmsnorm_fwd N%lld C%lld", (long long)N, (long long)C);
                verify(D, what, row_run, &c, c.nout, ref, RTOL_RED);
            }
            if (HAS(D, rmsnorm_bwd)) {
                /* from the rstd the slot is given (the forward's, f32) */
                for (int64_t j = 0; j < C; j++) ref[nc + j] = dw0[j];
                for (int64_t r = 0; r < N; r++) {
                    double rs = rstd[r], dot = 0;
                    for (int64_t j = 0; j < C; j++) dot += (double)g[r * C + j] * w[j] * x[r * C + j];
                    for (int64_t j = 0; j < C; j++) {
                        ref[r * C + j] = rs * w[j] * g[r * C + j] - x[r * C + j] * rs * rs * rs * dot / (double)C;
                        ref[nc + j] += (double)g[r * C + j] * x[r * C + j] * rs;
                    }
                }
                row_ctx c = {.op = 1, .N = N, .C = C, .x = x, .w = w, .g = g, .rstd = rstd, .dw0 = dw0,
                             .nout = nc + (size_t)C};
                snprintf(what, sizeof what, "rmsnorm_bwd N%lld C%lld", (long long)N, (long long)C);
                verify(D, what, row_run, &c, c.nout, ref, RTOL_RED);
            }
            free(x), free(w), free(g), free(dw0), free(rstd), free(ref);

            /* swiglu with F = C */
            int64_t F = C;
            float *in = fvec((size_t)(N * 2 * F), -4, 4), *go = fvec((size_t)(N * F), -1, 1);
            double *sr = dvec((size_t)(N * 2 * F));
            if (HAS(D, swiglu_fwd)) {
                for (int64_t r = 0; r < N; r++)
                    for (int64_t j = 0; j < F; j++) {
                        double av = in[r * 2 * F + j], bv = in[r * 2 * F + F + j];
                        sr[r * F + j] = av / (1 + exp(-av)) * bv;
                    }
                row_ctx c = {.op = 2, .N = N, .C = F, .x = in, .nout = (size_t)(N * F)};
                snprintf(what, sizeof what, "swiglu_fwd N%lld F%lld", (long long)N, (long long)F);
                verify(D, what, row_run, &c, c.nout, sr, RTOL_EW);
            }
            if (HAS(D, swiglu_bwd)) {
                for (int64_t r = 0; r < N; r++)
                    for (int64_t j = 0; j < F; j++) {
                        double av = in[r * 2 * F + j], bv = in[r * 2 * F + F + j], gv = go[r * F + j];
                        double s = 1 / (1 + exp(-av));
                        sr[r * 2 * F + j] = gv * bv * s * (1 + av * (1 - s));
                        sr[r * 2 * F + F + j] = gv * av * s;
                    }
                row_ctx c = {.op = 3, .N = N, .C = F, .x = in, .g = go, .nout = (size_t)(N * 2 * F)};
                snprintf(what, sizeof what, "swiglu_bwd N%lld F%lld", (long long)N, (long long)F);
                verify(D, what, row_run, &c, c.nout, sr, RTOL_EW);
            }
            free(in), free(go), free(sr);
        }

    /* rope: [B, T, H, E] in place at positions 0..T-1 */
    static const int64_t es[] = {2, 8, 64, 128}, ts[] = {1, 17, 64};
    if (!HAS(D, rope)) return;
    for (int ei = 0; ei < LEN(es); ei++)
        for (int ti = 0; ti < LEN(ts); ti++)
            for (int bwd = 0; bwd < 2; bwd++) {
                int64_t Bb = 1 + (ti & 1), T = ts[ti], H = 1 + 2 * (ei & 1), E = es[ei], P = E / 2;
                size_t n = (size_t)(Bb * T * H * E);
                float *x = fvec(n, -2, 2), *inv = malloc((size_t)P * 4);
                for (int64_t i = 0; i < P; i++) inv[i] = (float)(1.0 / pow(10000.0, (double)(2 * i) / (double)E));
                double *ref = dvec(n);
                for (int64_t bb = 0; bb < Bb; bb++)
                    for (int64_t t = 0; t < T; t++)
                        for (int64_t hh = 0; hh < H; hh++) {
                            const float *r = x + ((bb * T + t) * H + hh) * E;
                            double *o = ref + ((bb * T + t) * H + hh) * E;
                            for (int64_t i = 0; i < P; i++) {
                                float ang = (float)t * inv[i]; /* the f32 product backend.h names */
                                double cs = cos((double)ang), sn = sin((double)ang) * (bwd ? -1 : 1);
                                o[i] = r[i] * cs - r[i + P] * sn;
                                o[i + P] = r[i + P] * cs + r[i] * sn;
                            }
                        }
                row_ctx c = {.op = 4 + bwd, .Bb = Bb, .T = T, .H = H, .E = E, .x = x, .inv = inv, .nout = n};
                snprintf(what, sizeof what, "rope %s B%lld T%lld H%lld E%lld", bwd ? "bwd" : "fwd", (long long)Bb,
                         (long long)T, (long long)H, (long long)E);
                verify(D, what, row_run, &c, n, ref, RTOL_EW);
                free(x), free(inv), free(ref);
            }
}

/* ---- embedding --------------------------------------------------------------------------- */

typedef struct emb_ctx {
    bool bwd;
    int64_t N, V, Dm;
    const int32_t *ids;
    const float *table, *dout; /* bwd: table holds dtable's starting values */
} emb_ctx;

static ct_status emb_run(const tdev *D, const void *vc, double *out)
{
    const emb_ctx *c = vc;
    tbufs B = {.D = D};
    size_t nt = (size_t)(c->V * c->Dm), no = (size_t)(c->N * c->Dm), n = c->bwd ? nt : no;
    int32_t *ids = tb_new(&B, c->ids, (size_t)c->N * 4);
    float *tab = tb_new(&B, c->table, nt * 4);
    float *o = tb_new(&B, c->bwd ? c->dout : NULL, no * 4);
    if (B.st == CT_OK)
        B.st = c->bwd ? SLOT(D, embed_bwd, tab, o, ids, c->N, c->V, c->Dm)
                      : SLOT(D, embed_fwd, o, ids, tab, c->N, c->V, c->Dm);
    float *h = malloc(n * 4);
    tb_get(&B, h, c->bwd ? tab : o, n * 4);
    if (B.st == CT_OK) f2d(out, h, n);
    free(h);
    return tb_done(&B);
}

static void test_embed(const tdev *D)
{
    char what[96];
    bool hf = HAS(D, embed_fwd), hb = HAS(D, embed_bwd);
    for (int a = 0; a < LEN(NS); a++)
        for (int v = 0; v < LEN(VS); v++)
            for (int d = 0; d < LEN(CS); d++)
                for (int bwd = 0; bwd < 2; bwd++) {
                    if (!(bwd ? hb : hf)) continue;
                    int64_t N = NS[a], V = VS[v], Dm = CS[d];
                    size_t nt = (size_t)(V * Dm), no = (size_t)(N * Dm);
                    int32_t *ids = malloc((size_t)N * 4);
                    /* ids from a few rows so that rows repeat (the backward's order matters) */
                    int64_t span = V < 4 ? V : 4 + (V - 4) * (d & 1);
                    for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)(t_next() % (uint64_t)span);
                    float *tab = fvec(nt, -1, 1), *dout = fvec(no, -1, 1);
                    double *ref = dvec(bwd ? nt : no);
                    if (bwd) {
                        f2d(ref, tab, nt);
                        for (int64_t i = 0; i < N; i++)
                            for (int64_t j = 0; j < Dm; j++) ref[ids[i] * Dm + j] += dout[i * Dm + j];
                    } else {
                        for (int64_t i = 0; i < N; i++)
                            for (int64_t j = 0; j < Dm; j++) ref[i * Dm + j] = tab[ids[i] * Dm + j];
                    }
                    emb_ctx c = {.bwd = bwd, .N = N, .V = V, .Dm = Dm, .ids = ids, .table = tab, .dout = dout};
                    snprintf(what, sizeof what, "embed_%s N%lld V%lld D%lld", bwd ? "bwd" : "fwd", (long long)N,
                             (long long)V, (long long)Dm);
                    verify(D, what, emb_run, &c, bwd ? nt : no, ref, bwd ? RTOL_RED : 0);
                    free(ids), free(tab), free(dout), free(ref);
                }
    /* A backward over more tokens than one 2048-key tile of the CUDA backend's sort (its global
     * merge steps and tile merges run), ids from 37 rows of 1000. */
    if (hb) {
        const int64_t N = 5000, V = 1000, Dm = 5;
        const size_t nt = (size_t)(V * Dm), no = (size_t)(N * Dm);
        int32_t *ids = malloc((size_t)N * 4);
        for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)(t_next() % 37u * 27u);
        float *tab = fvec(nt, -1, 1), *dout = fvec(no, -1, 1);
        double *ref = dvec(nt);
        f2d(ref, tab, nt);
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < Dm; j++) ref[ids[i] * Dm + j] += dout[i * Dm + j];
        emb_ctx c = {.bwd = true, .N = N, .V = V, .Dm = Dm, .ids = ids, .table = tab, .dout = dout};
        verify(D, "embed_bwd N5000 V1000 D5 (sort over 3 tiles)", emb_run, &c, nt, ref, RTOL_RED);
        free(ids), free(tab), free(dout), free(ref);
    }
}

/* ---- losses ------------------------------------------------------------------------------- */

/* The loss of loss.h in double for logits [N, V] (row-major, bias already added), rows' upstream
 * gradient g (MEAN: grad_scale / denominator; SUM, NONE: grad_scale). Writes loss (1 or N),
 * z (1 or N), lse [N] and, when dl is not NULL, d loss / d logits [N, V]. */
static void ce_ref(const double *logits, const int64_t *tgt, int64_t N, int64_t V, const ct_ce_options *o,
                   double grad_scale, double *loss, double *z, double *lse, double *dl)
{
    double W = 0, denom = 0;
    for (int64_t c = 0; c < V; c++) W += o->class_weight ? o->class_weight[c] : 1.0;
    for (int64_t n = 0; n < N; n++)
        if (tgt[n] != o->ignore_index) denom += o->class_weight ? o->class_weight[tgt[n]] : 1.0;
    double eps = o->label_smoothing, s = o->z_loss, cap = o->softcap;
    double lsum = 0, zsum = 0;
    double *zr = malloc((size_t)V * sizeof *zr);
    for (int64_t n = 0; n < N; n++) {
        const double *x = logits + n * V;
        for (int64_t c = 0; c < V; c++) zr[c] = cap > 0 ? cap * tanh(x[c] / cap) : x[c];
        double m = -INFINITY, l = 0;
        for (int64_t c = 0; c < V; c++) m = zr[c] > m ? zr[c] : m;
        for (int64_t c = 0; c < V; c++) l += exp(zr[c] - m);
        double ls = m + log(l);
        lse[n] = ls;
        int64_t y = tgt[n];
        bool ign = y == o->ignore_index;
        double row = 0, zt = 0;
        if (!ign) {
            double wy = o->class_weight ? o->class_weight[y] : 1.0, swz = 0;
            for (int64_t c = 0; c < V; c++) swz += (o->class_weight ? o->class_weight[c] : 1.0) * zr[c];
            zt = s * ls * ls;
            row = (1 - eps) * wy * (ls - zr[y]) + eps / (double)V * (W * ls - swz) + zt;
        }
        if (o->reduction == CT_REDUCTION_NONE) loss[n] = row, z[n] = zt;
        lsum += row, zsum += zt;
        if (!dl) continue;
        double g = o->reduction == CT_REDUCTION_MEAN ? grad_scale / denom : grad_scale;
        for (int64_t c = 0; c < V; c++) {
            double d = 0;
            if (!ign) {
                double p = exp(zr[c] - ls), wy = o->class_weight ? o->class_weight[y] : 1.0;
                double wc = o->class_weight ? o->class_weight[c] : 1.0;
                d = (1 - eps) * wy * (p - (c == y)) + eps / (double)V * (W * p - wc) + 2 * s * ls * p;
                d *= g;
                if (cap > 0) {
                    double t = tanh(x[c] / cap);
                    d *= 1 - t * t;
                }
            }
            dl[n * V + c] = d;
        }
    }
    if (o->reduction == CT_REDUCTION_SUM) loss[0] = lsum, z[0] = zsum;
    if (o->reduction == CT_REDUCTION_MEAN) loss[0] = lsum / denom, z[0] = zsum / denom; /* 0/0: NaN */
    free(zr);
}

/* The option sets every loss runs: each option alone, then together. */
enum { OPT_SETS = 12 };
static const char *opt_name[OPT_SETS] = {"mean",      "none",    "sum",    "ignore(-100)", "ignore(1)", "smoothing",
                                         "weights",   "z_loss",  "softcap", "all none",    "all sum",   "all ignored"};

/* Options of set k (weights: a [V] array the caller owns) and targets in [0, V) or ignored. */
static ct_ce_options opt_set(int k, const float *weights, int64_t *tgt, int64_t N, int64_t V)
{
    ct_ce_options o = ct_ce_options_default();
    for (int64_t n = 0; n < N; n++) tgt[n] = (int64_t)(t_next() % (uint64_t)V);
    switch (k) {
    case 1: o.reduction = CT_REDUCTION_NONE; break;
    case 2: o.reduction = CT_REDUCTION_SUM; break;
    case 3:
        for (int64_t n = 1; n < N; n += 3) tgt[n] = -100;
        break;
    case 4:
        o.ignore_index = V > 1 ? 1 : 0; /* a class id: its rows are ignored */
        break;
    case 5: o.label_smoothing = 0.1f; break;
    case 6:
        o.class_weight = weights;
        for (int64_t n = 2; n < N; n += 4) tgt[n] = -100;
        break;
    case 7: o.z_loss = 1e-3f; break;
    case 8: o.softcap = 3.0f; break;
    case 9:
    case 10:
        o.reduction = k == 9 ? CT_REDUCTION_NONE : CT_REDUCTION_SUM;
        o.class_weight = weights, o.label_smoothing = 0.2f, o.z_loss = 1e-2f, o.softcap = 5.0f;
        for (int64_t n = 1; n < N; n += 2) tgt[n] = -100;
        break;
    case 11: /* MEAN of nothing: NaN, as PyTorch (gradients zero) */
        for (int64_t n = 0; n < N; n++) tgt[n] = -100;
        break;
    default: break;
    }
    return o;
}

typedef struct ce_ctx {
    bool bwd;
    int64_t N, V;
    const float *logits, *weights;
    const int32_t *tgt;
    ct_ce_options o;
    float grad_scale;
    size_t nl; /* loss values: 1 or N */
} ce_ctx;

static ct_status ce_run(const tdev *D, const void *vc, double *out)
{
    const ce_ctx *c = vc;
    tbufs B = {.D = D};
    size_t nv = (size_t)(c->N * c->V), N = (size_t)c->N;
    float *lg = tb_new(&B, c->logits, nv * 4);
    int32_t *t = tb_new(&B, c->tgt, N * 4);
    ct_ce_options o = c->o;
    if (o.class_weight) o.class_weight = tb_new(&B, c->weights, (size_t)c->V * 4);
    size_t nout = c->bwd ? nv : 2 * c->nl + N;
    float *h = malloc(nout * 4);
    if (c->bwd) {
        float *dl = tb_new(&B, NULL, nv * 4);
        if (B.st == CT_OK) B.st = SLOT(D, ce_bwd, dl, c->grad_scale, lg, t, c->N, c->V, &o);
        tb_get(&B, h, dl, nv * 4);
    } else {
        ct_ce_outputs co = {tb_new(&B, NULL, c->nl * 4), tb_new(&B, NULL, c->nl * 4), tb_new(&B, NULL, N * 4)};
        if (B.st == CT_OK) B.st = SLOT(D, ce_fwd, &co, lg, t, c->N, c->V, &o);
        tb_get(&B, h, co.loss, c->nl * 4);
        tb_get(&B, h + c->nl, co.z_loss, c->nl * 4);
        tb_get(&B, h + 2 * c->nl, co.lse, N * 4);
    }
    if (B.st == CT_OK) f2d(out, h, nout);
    free(h);
    return tb_done(&B);
}

static void test_ce(const tdev *D)
{
    char what[128];
    bool hf = HAS(D, ce_fwd), hb = HAS(D, ce_bwd);
    if (!hf && !hb) return;
    for (int a = 0; a < LEN(NS); a++)
        for (int v = 0; v < LEN(VS); v++)
            for (int k = 0; k < OPT_SETS; k++) {
                int64_t N = NS[a], V = VS[v];
                size_t nv = (size_t)(N * V);
                float *lg = fvec(nv, -6, 6), *w = fvec((size_t)V, 0.25f, 2.0f);
                int64_t *tg = malloc((size_t)N * 8);
                int32_t *t32 = malloc((size_t)N * 4);
                ct_ce_options o = opt_set(k, w, tg, N, V);
                for (int64_t n = 0; n < N; n++) t32[n] = (int32_t)tg[n];
                size_t nl = o.reduction == CT_REDUCTION_NONE ? (size_t)N : 1;
                double *ld = dvec(nv), *ref = dvec(2 * nl + (size_t)N), *dref = dvec(nv);
                f2d(ld, lg, nv);
                const float gs = 0.7f;
                ce_ref(ld, tg, N, V, &o, gs, ref, ref + nl, ref + 2 * nl, dref);
                ce_ctx c = {.N = N, .V = V, .logits = lg, .weights = w, .tgt = t32, .o = o, .grad_scale = gs, .nl = nl};
                snprintf(what, sizeof what, "ce_fwd %s N%lld V%lld", opt_name[k], (long long)N, (long long)V);
                if (hf) verify(D, what, ce_run, &c, 2 * nl + (size_t)N, ref, RTOL_RED);
                c.bwd = true;
                snprintf(what, sizeof what, "ce_bwd %s N%lld V%lld", opt_name[k], (long long)N, (long long)V);
                /* A logit's gradient is a difference of terms of the row's scale (p - 1 at the
                 * target: V = 1 cancels to ~0): f32 leaves ~1 ulp of grad_scale there. */
                if (hb) verify_ex(D, what, ce_run, &c, nv, dref, RTOL_RED, RTOL_EW * gs, 0);
                free(lg), free(w), free(tg), free(t32), free(ld), free(ref), free(dref);
            }
}

typedef struct lce_ctx {
    int64_t N, Dm, V;
    ct_dtype dtype, tdtype;
    const float *h, *w, *bias, *weights, *dw0;
    const uint16_t *hb, *wb;
    const void *tgt;
    ct_ce_options o;
    float grad_scale;
    int grads; /* 0 forward only, 1 gradients (overwrite), 2 gradients accumulated into dW */
    size_t nl;
} lce_ctx;

static size_t lce_nout(const lce_ctx *c)
{
    size_t n = 2 * c->nl + (size_t)c->N;
    if (c->grads) n += (size_t)(c->N * c->Dm) + (size_t)(c->V * c->Dm) + (c->bias ? (size_t)c->V : 0);
    return n;
}

static ct_status lce_run(const tdev *D, const void *vc, double *out)
{
    const lce_ctx *c = vc;
    tbufs B = {.D = D};
    bool bf = c->dtype == CT_DTYPE_BF16;
    size_t es = bf ? 2 : 4, N = (size_t)c->N, nh = (size_t)(c->N * c->Dm), nw = (size_t)(c->V * c->Dm);
    ct_lce_inputs in = {.dtype = c->dtype, .target_dtype = c->tdtype, .N = c->N, .D = c->Dm, .V = c->V};
    in.h = tb_new(&B, bf ? (const void *)c->hb : c->h, nh * es);
    in.weight = tb_new(&B, bf ? (const void *)c->wb : c->w, nw * es);
    in.bias = c->bias ? tb_new(&B, c->bias, (size_t)c->V * 4) : NULL;
    in.target = tb_new(&B, c->tgt, N * (c->tdtype == CT_DTYPE_I64 ? 8 : 4));
    ct_ce_options o = c->o;
    if (o.class_weight) o.class_weight = tb_new(&B, c->weights, (size_t)c->V * 4);
    ct_ce_outputs co = {tb_new(&B, NULL, c->nl * 4), tb_new(&B, NULL, c->nl * 4), tb_new(&B, NULL, N * 4)};
    ct_lce_grads g = {0};
    if (c->grads) {
        g.dh = tb_new(&B, c->grads == 2 ? c->dw0 : NULL, nh * 4);
        g.dweight = tb_new(&B, c->grads == 2 ? c->dw0 : NULL, nw * 4);
        g.dbias = c->bias ? tb_new(&B, c->grads == 2 ? c->dw0 : NULL, (size_t)c->V * 4) : NULL;
        g.accumulate = c->grads == 2;
    }
    if (B.st == CT_OK) B.st = SLOT(D, lce, &co, c->grads ? &g : NULL, c->grad_scale, NULL, 0, &in, &o);
    size_t nout = lce_nout(c);
    float *h = malloc(nout * 4), *p = h;
    tb_get(&B, p, co.loss, c->nl * 4), p += c->nl;
    tb_get(&B, p, co.z_loss, c->nl * 4), p += c->nl;
    tb_get(&B, p, co.lse, N * 4), p += N;
    if (c->grads) {
        tb_get(&B, p, g.dh, nh * 4), p += nh;
        tb_get(&B, p, g.dweight, nw * 4), p += nw;
        if (c->bias) tb_get(&B, p, g.dbias, (size_t)c->V * 4);
    }
    if (B.st == CT_OK) f2d(out, h, nout);
    free(h);
    return tb_done(&B);
}

static void test_lce(const tdev *D)
{
    if (!HAS(D, lce)) return;
    static const int64_t ds[] = {8, 64};
    char what[160];
    int idx = 0;
    for (int a = 0; a < LEN(NS); a++)
        for (int v = 0; v < LEN(VS); v++)
            for (int k = 0; k < OPT_SETS; k++, idx++) {
                int64_t N = NS[a], V = VS[v], Dm = ds[idx % 2];
                lce_ctx c = {.N = N, .Dm = Dm, .V = V, .grad_scale = 0.7f};
                c.dtype = idx % 3 == 2 ? CT_DTYPE_BF16 : CT_DTYPE_F32;
                c.tdtype = idx % 4 == 1 ? CT_DTYPE_I64 : CT_DTYPE_I32;
                c.grads = idx % 5 == 4 ? 0 : idx % 5 == 3 ? 2 : 1; /* forward only / tied-like dW / plain */
                size_t nh = (size_t)(N * Dm), nw = (size_t)(V * Dm), nv = (size_t)(N * V);
                float *hf = fvec(nh, -1, 1), *wf = fvec(nw, -1, 1), *bias = idx % 2 ? fvec((size_t)V, -1, 1) : NULL;
                /* dw0: the starting values of every gradient when accumulating (its first N*D values
                 * for dh, V*D for dW, V for db) */
                size_t n0 = nw > nh ? nw : nh;
                float *wts = fvec((size_t)V, 0.25f, 2.0f), *dw0 = fvec(n0 > (size_t)V ? n0 : (size_t)V, -1, 1);
                uint16_t *hb = NULL, *wb = NULL;
                if (c.dtype == CT_DTYPE_BF16) hb = bf16_round(hf, nh), wb = bf16_round(wf, nw);
                int64_t *tg = malloc((size_t)N * 8);
                int32_t *t32 = malloc((size_t)N * 4);
                ct_ce_options o = opt_set(k, wts, tg, N, V);
                if (idx % 7 == 6) o.scratch_bytes = 64 << 10; /* a small budget: many tiles */
                for (int64_t n = 0; n < N; n++) t32[n] = (int32_t)tg[n];
                c.h = hf, c.w = wf, c.bias = bias, c.weights = wts, c.dw0 = dw0, c.hb = hb, c.wb = wb;
                c.tgt = c.tdtype == CT_DTYPE_I64 ? (const void *)tg : t32;
                c.o = o;
                c.nl = o.reduction == CT_REDUCTION_NONE ? (size_t)N : 1;
                /* reference: logits in double, the CE reference, then the two products */
                double *lg = dvec(nv), *dl = dvec(nv);
                for (int64_t n = 0; n < N; n++)
                    for (int64_t j = 0; j < V; j++) {
                        double s = bias ? bias[j] : 0;
                        for (int64_t d = 0; d < Dm; d++) s += (double)hf[n * Dm + d] * wf[j * Dm + d];
                        lg[n * V + j] = s;
                    }
                size_t nout = lce_nout(&c);
                double *ref = dvec(nout);
                ce_ref(lg, tg, N, V, &o, c.grad_scale, ref, ref + c.nl, ref + 2 * c.nl, dl);
                if (c.grads) {
                    double *dh = ref + 2 * c.nl + N, *dW = dh + nh, *db = dW + nw;
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t d = 0; d < Dm; d++) {
                            double s = c.grads == 2 ? dw0[n * Dm + d] : 0;
                            for (int64_t j = 0; j < V; j++) s += dl[n * V + j] * wf[j * Dm + d];
                            dh[n * Dm + d] = s;
                        }
                    for (int64_t j = 0; j < V; j++) {
                        for (int64_t d = 0; d < Dm; d++) {
                            double s = c.grads == 2 ? dw0[j * Dm + d] : 0;
                            for (int64_t n = 0; n < N; n++) s += dl[n * V + j] * hf[n * Dm + d];
                            dW[j * Dm + d] = s;
                        }
                        if (bias) {
                            double s = c.grads == 2 ? dw0[j] : 0;
                            for (int64_t n = 0; n < N; n++) s += dl[n * V + j];
                            db[j] = s;
                        }
                    }
                }
                snprintf(what, sizeof what, "lce %s %s%s N%lld D%lld V%lld %s%s", opt_name[k], ct_dtype_name(c.dtype),
                         bias ? " bias" : "", (long long)N, (long long)Dm, (long long)V,
                         c.grads == 0 ? "forward" : c.grads == 1 ? "grads" : "grads accumulate",
                         o.scratch_bytes == (64 << 10) ? " scratch 64KiB" : "");
                /* bf16: the operands are exact bf16 values in both the reference and the slot; a
                 * backend may still round the logit gradient to bf16 for its tensor-core
                 * products (2^-9 relative per term), so bf16 gets 1e-2 where f32 gets 1e-4. */
                verify_ex(D, what, lce_run, &c, nout, ref, c.dtype == CT_DTYPE_BF16 && c.grads ? 1e-2 : RTOL_RED,
                          RTOL_EW * c.grad_scale, 0); /* atol: as for ce_bwd */
                free(hf), free(wf), free(bias), free(wts), free(dw0), free(hb), free(wb), free(tg), free(t32);
                free(lg), free(dl), free(ref);
            }
}

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct attn_ctx {
    bool bwd;
    int64_t Bb, T, H, Hk, E;
    float scale;
    ct_dtype dtype;
    const float *q, *k, *v, *out, *lse, *dout; /* f32 (bf16-rounded values for bf16) */
    const uint16_t *qb, *kb, *vb, *outb, *doutb;
} attn_ctx;

static ct_status attn_run(const tdev *D, const void *vc, double *res)
{
    const attn_ctx *c = vc;
    tbufs B = {.D = D};
    bool bf = c->dtype == CT_DTYPE_BF16;
    size_t es = bf ? 2 : 4, nq = (size_t)(c->Bb * c->T * c->H * c->E), nk = (size_t)(c->Bb * c->T * c->Hk * c->E);
    size_t nl = (size_t)(c->Bb * c->H * c->T);
    ct_attn_args a = {.B = c->Bb, .T = c->T, .H = c->H, .Hk = c->Hk, .E = c->E, .scale = c->scale, .dtype = c->dtype};
    a.q = tb_new(&B, bf ? (const void *)c->qb : c->q, nq * es);
    a.k = tb_new(&B, bf ? (const void *)c->kb : c->k, nk * es);
    a.v = tb_new(&B, bf ? (const void *)c->vb : c->v, nk * es);
    a.out = tb_new(&B, c->bwd ? (bf ? (const void *)c->outb : c->out) : NULL, nq * es);
    a.lse = tb_new(&B, c->bwd ? c->lse : NULL, nl * 4);
    size_t nout = c->bwd ? nq + 2 * nk : nq + nl;
    float *h = malloc(nout * 4);
    uint16_t *hb = malloc(nout * 2);
    if (c->bwd) {
        ct_attn_grads g = {.dout = tb_new(&B, bf ? (const void *)c->doutb : c->dout, nq * es)};
        g.dq = tb_new(&B, NULL, nq * es), g.dk = tb_new(&B, NULL, nk * es), g.dv = tb_new(&B, NULL, nk * es);
        if (B.st == CT_OK) B.st = SLOT(D, sdpa_bwd, &a, &g);
        if (bf) {
            tb_get(&B, hb, g.dq, nq * 2), tb_get(&B, hb + nq, g.dk, nk * 2), tb_get(&B, hb + nq + nk, g.dv, nk * 2);
            for (size_t i = 0; i < nout; i++) h[i] = bf16_val(hb[i]);
        } else {
            tb_get(&B, h, g.dq, nq * 4), tb_get(&B, h + nq, g.dk, nk * 4), tb_get(&B, h + nq + nk, g.dv, nk * 4);
        }
    } else {
        if (B.st == CT_OK) B.st = SLOT(D, sdpa_fwd, &a);
        if (bf) {
            tb_get(&B, hb, a.out, nq * 2);
            for (size_t i = 0; i < nq; i++) h[i] = bf16_val(hb[i]);
        } else {
            tb_get(&B, h, a.out, nq * 4);
        }
        tb_get(&B, h + nq, a.lse, nl * 4);
    }
    if (B.st == CT_OK) f2d(res, h, nout);
    free(h), free(hb);
    return tb_done(&B);
}

/* Causal attention in double: out [B,T,H,E], lse [B,H,T]; with dout also dq, dk, dv. */
static void attn_ref(const attn_ctx *c, double *out, double *lse, double *dq, double *dk, double *dv)
{
    int64_t T = c->T, H = c->H, Hk = c->Hk, E = c->E, G = H / Hk;
    double *p = malloc((size_t)T * sizeof *p), *dp = malloc((size_t)T * sizeof *dp);
#define QI(b, t, h) ((((b) * T + (t)) * H + (h)) * E)
#define KI(b, t, h) ((((b) * T + (t)) * Hk + (h)) * E)
    for (int64_t b = 0; b < c->Bb; b++)
        for (int64_t h = 0; h < H; h++) {
            int64_t hk = h / G;
            for (int64_t i = 0; i < T; i++) {
                double m = -INFINITY, l = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double s = 0;
                    for (int64_t e = 0; e < E; e++) s += (double)c->q[QI(b, i, h) + e] * c->k[KI(b, j, hk) + e];
                    p[j] = s * c->scale;
                    m = p[j] > m ? p[j] : m;
                }
                for (int64_t j = 0; j <= i; j++) l += exp(p[j] - m);
                double ls = m + log(l);
                for (int64_t j = 0; j <= i; j++) p[j] = exp(p[j] - ls);
                if (lse) lse[(b * H + h) * T + i] = ls;
                if (out)
                    for (int64_t e = 0; e < E; e++) {
                        double s = 0;
                        for (int64_t j = 0; j <= i; j++) s += p[j] * c->v[KI(b, j, hk) + e];
                        out[QI(b, i, h) + e] = s;
                    }
                if (!dq) continue;
                /* dP = dout . v; dS = P (dP - D); dq = scale dS k; dk += scale dS q; dv += P dout, with
                 * D = sum_j P dP = dout . out: the slot's definition takes out as given (c->out, rounded
                 * as stored: bf16 for bf16), as ct_sdpa_backward does. */
                double dsum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double s = 0;
                    for (int64_t e = 0; e < E; e++) s += (double)c->dout[QI(b, i, h) + e] * c->v[KI(b, j, hk) + e];
                    dp[j] = s;
                    dsum += p[j] * s;
                }
                if (c->out) {
                    dsum = 0;
                    for (int64_t e = 0; e < E; e++) dsum += (double)c->dout[QI(b, i, h) + e] * c->out[QI(b, i, h) + e];
                }
                for (int64_t j = 0; j <= i; j++) {
                    double ds = p[j] * (dp[j] - dsum) * c->scale;
                    for (int64_t e = 0; e < E; e++) {
                        dq[QI(b, i, h) + e] += ds * c->k[KI(b, j, hk) + e];
                        dk[KI(b, j, hk) + e] += ds * c->q[QI(b, i, h) + e];
                        dv[KI(b, j, hk) + e] += p[j] * c->dout[QI(b, i, h) + e];
                    }
                }
            }
        }
#undef QI
#undef KI
    free(p), free(dp);
}

static void test_attn(const tdev *D)
{
    static const int64_t ts[] = {1, 17, 64}, es[] = {8, 64, 128}, hs[][2] = {{4, 2}, {2, 2}};
    char what[128];
    bool hf = HAS(D, sdpa_fwd), hb = HAS(D, sdpa_bwd);
    if (!hf && !hb) return;
    int idx = 0;
    for (int ti = 0; ti < LEN(ts); ti++)
        for (int ei = 0; ei < LEN(es); ei++)
            for (int hi = 0; hi < LEN(hs); hi++)
                for (int dt = 0; dt < 2; dt++, idx++) {
                    attn_ctx c = {.Bb = 1 + idx % 2, .T = ts[ti], .H = hs[hi][0], .Hk = hs[hi][1], .E = es[ei]};
                    c.dtype = dt ? CT_DTYPE_BF16 : CT_DTYPE_F32;
                    c.scale = (float)(1.0 / sqrt((double)c.E));
                    size_t nq = (size_t)(c.Bb * c.T * c.H * c.E), nk = (size_t)(c.Bb * c.T * c.Hk * c.E);
                    size_t nl = (size_t)(c.Bb * c.H * c.T);
                    float *q = fvec(nq, -2, 2), *k = fvec(nk, -2, 2), *v = fvec(nk, -1, 1), *dout = fvec(nq, -1, 1);
                    float *outf = malloc(nq * 4), *lsef = malloc(nl * 4);
                    uint16_t *qb = NULL, *kb = NULL, *vb = NULL, *db = NULL, *ob = NULL;
                    if (dt) qb = bf16_round(q, nq), kb = bf16_round(k, nk), vb = bf16_round(v, nk), db = bf16_round(dout, nq);
                    c.q = q, c.k = k, c.v = v, c.dout = dout, c.qb = qb, c.kb = kb, c.vb = vb, c.doutb = db;
                    double *ref = dvec(nq + nl), *gref = dvec(nq + 2 * nk);
                    attn_ref(&c, ref, ref + nq, NULL, NULL, NULL);
                    /* The backward gets the reference's forward (rounded as a device would store it). */
                    for (size_t i = 0; i < nq; i++) outf[i] = (float)ref[i];
                    for (size_t i = 0; i < nl; i++) lsef[i] = (float)ref[nq + i];
                    if (dt) ob = bf16_round(outf, nq);
                    c.out = outf, c.lse = lsef, c.outb = ob;
                    attn_ref(&c, NULL, NULL, gref, gref + nq, gref + nq + nk);
                    snprintf(what, sizeof what, "sdpa_fwd %s B%lld T%lld H%lld Hk%lld E%lld", dt ? "bf16" : "f32",
                             (long long)c.Bb, (long long)c.T, (long long)c.H, (long long)c.Hk, (long long)c.E);
                    /* bf16: out is stored in bf16 (2^-9 relative) and a backend may round the
                     * probabilities to bf16 before P.V; dq, dk, dv likewise: 1e-2 for bf16. */
                    if (hf) verify_ex(D, what, attn_run, &c, nq + nl, ref, dt ? 1e-2 : RTOL_RED, 0, VF_CPU_MAY_REFUSE);
                    c.bwd = true;
                    memcpy(what + 5, "bwd", 3);
                    if (hb) verify_ex(D, what, attn_run, &c, nq + 2 * nk, gref, dt ? 1e-2 : RTOL_RED, 0, VF_CPU_MAY_REFUSE);
                    free(q), free(k), free(v), free(dout), free(outf), free(lsef);
                    free(qb), free(kb), free(vb), free(db), free(ob), free(ref), free(gref);
                }
}

/* ---- flex attention ------------------------------------------------------------------------ */
/* flex_fwd / flex_bwd over a host block mask uploaded with ct_dev_block_mask_upload, with the
 * built-in mods of ct_flex_mods: each case against a dense double reference of the definitions
 * (every pair evaluated: the block lists must skip only masked pairs), on the GPU also 3x
 * bitwise and against the CPU slot (ct_flex_attention_forward / _backward). */

typedef struct flex_ctx {
    bool bwd;
    int64_t Bb, T, H, Hk, E, bs;
    float scale;
    ct_dtype dtype;
    unsigned bits;
    int64_t window, prefix, doc_batch;
    const int32_t *qdoc, *kvdoc; /* host [doc_batch, T]; kvdoc NULL: qdoc */
    ct_flex_score score;
    float cap;
    const float *slopes; /* host [H] */
    const ct_block_mask *bm;
    const struct ct_flex_jit *compiled;
    const float *q, *k, *v, *out, *lse, *dout;
    const uint16_t *qb, *kb, *vb, *outb, *doutb;
    /* compiled mods (FJ_*): the sample's bound arrays (host), its host mods (the CPU runs them)
     * and its module on the GPU (the device's flex_jit_load of the sample's source) */
    int jit;
    const float *bias, *w;   /* FJ_RELPOS: bias [H, 129]; FJ_PAIR: w [H] */
    const int32_t *keepv;    /* FJ_PAIR: keep [T] */
    ct_score_mod *jsm;       /* NULL: no compiled score mod */
    const ct_mask_mod *jmm;  /* NULL: no compiled mask mod */
    void *module;
    bool no_dq;              /* the backward without dq (param grads still wanted) */
} flex_ctx;

enum { FJ_NONE, FJ_RELPOS, FJ_MOD3, FJ_PAIR };

/* The param-grad vector's length of a case (0: none). */
static size_t fj_npg(const flex_ctx *c)
{
    return c->jit == FJ_RELPOS ? (size_t)(c->H * 129) : c->jit == FJ_PAIR ? (size_t)c->H : 0;
}

static void fj_arr(ct_flex_jit_arr *a, const void *data, int64_t d0, int64_t d1, int64_t gofs)
{
    memset(a, 0, sizeof *a);
    a->data = data;
    a->shape[0] = d0, a->shape[1] = d1 ? d1 : 1;
    a->stride[0] = d1 ? d1 : 1, a->stride[1] = 1;
    a->numel = d0 * (d1 ? d1 : 1);
    a->gofs = gofs;
}

static ct_status flex_run(const tdev *D, const void *vc, double *res)
{
    const flex_ctx *c = vc;
    tbufs B = {.D = D};
    bool bf = c->dtype == CT_DTYPE_BF16;
    size_t es = bf ? 2 : 4, nq = (size_t)(c->Bb * c->T * c->H * c->E), nk = (size_t)(c->Bb * c->T * c->Hk * c->E);
    size_t nl = (size_t)(c->Bb * c->H * c->T);
    ct_flex_args fa = {.attn = {.B = c->Bb, .T = c->T, .H = c->H, .Hk = c->Hk, .E = c->E, .scale = c->scale,
                                .dtype = c->dtype}};
    fa.attn.q = tb_new(&B, bf ? (const void *)c->qb : c->q, nq * es);
    fa.attn.k = tb_new(&B, bf ? (const void *)c->kb : c->k, nk * es);
    fa.attn.v = tb_new(&B, bf ? (const void *)c->vb : c->v, nk * es);
    fa.attn.out = tb_new(&B, c->bwd ? (bf ? (const void *)c->outb : c->out) : NULL, nq * es);
    fa.attn.lse = tb_new(&B, c->bwd ? c->lse : NULL, nl * 4);
    fa.mods = (ct_flex_mods){.mask = c->bits, .window = c->window, .prefix = c->prefix, .doc_batch = c->doc_batch,
                             .score = c->score, .softcap = c->cap, .compiled = c->compiled};
    if (c->bits & CT_FLEX_MASK_DOCUMENT) {
        fa.mods.q_doc = tb_new(&B, c->qdoc, (size_t)(c->doc_batch * c->T) * 4);
        if (c->kvdoc) fa.mods.kv_doc = tb_new(&B, c->kvdoc, (size_t)(c->doc_batch * c->T) * 4);
    }
    if (c->score == CT_FLEX_SCORE_ALIBI && c->slopes) fa.mods.alibi_slopes = tb_new(&B, c->slopes, (size_t)c->H * 4);
    ct_dev_block_mask dm = {0};
    if (B.st == CT_OK) B.st = ct_dev_block_mask_upload(D->d, c->bm, &dm);
    fa.block_mask = &dm;
    ct_flex_jit jt = {0};
    size_t npg = c->bwd ? fj_npg(c) : 0;
    if (c->jit) {
        jt.host_score = c->jsm, jt.host_mask = c->jmm, jt.module = D->gpu ? c->module : NULL;
        if (c->jit == FJ_RELPOS) fj_arr(&jt.arr[jt.narr++], tb_new(&B, c->bias, (size_t)(c->H * 129) * 4), c->H, 129, 0);
        if (c->jit == FJ_PAIR) {
            fj_arr(&jt.arr[jt.narr++], tb_new(&B, c->keepv, (size_t)c->T * 4), c->T, 0, 0);
            fj_arr(&jt.arr[jt.narr++], tb_new(&B, c->w, (size_t)c->H * 4), c->H, 0, 0);
        }
        if (npg) {
            float *z = calloc(npg, 4);
            jt.param_grad = tb_new(&B, z, npg * 4);
            jt.param_len = (int64_t)npg;
            free(z);
        }
        /* the CPU adds the parameter gradients into its host score mod's vector (device memory
         * is host memory there) */
        if (c->jsm) c->jsm->param_grad = D->gpu ? NULL : jt.param_grad;
        fa.mods.compiled = &jt;
    }
    size_t nout = (c->bwd ? nq + 2 * nk : nq + nl) + npg;
    float *h = malloc(nout * 4);
    uint16_t *hb = malloc(nout * 2);
    if (c->bwd) {
        ct_attn_grads g = {.dout = tb_new(&B, bf ? (const void *)c->doutb : c->dout, nq * es)};
        g.dq = c->no_dq ? NULL : tb_new(&B, NULL, nq * es);
        g.dk = tb_new(&B, NULL, nk * es), g.dv = tb_new(&B, NULL, nk * es);
        if (B.st == CT_OK) B.st = SLOT(D, flex_bwd, &fa, &g);
        if (c->no_dq) memset(hb, 0, nq * 2), memset(h, 0, nq * 4); /* not computed: reads as 0 */
        if (bf) {
            if (g.dq) tb_get(&B, hb, g.dq, nq * 2);
            tb_get(&B, hb + nq, g.dk, nk * 2), tb_get(&B, hb + nq + nk, g.dv, nk * 2);
            for (size_t i = 0; i < nq + 2 * nk; i++) h[i] = bf16_val(hb[i]);
        } else {
            if (g.dq) tb_get(&B, h, g.dq, nq * 4);
            tb_get(&B, h + nq, g.dk, nk * 4), tb_get(&B, h + nq + nk, g.dv, nk * 4);
        }
        tb_get(&B, h + nq + 2 * nk, jt.param_grad, npg * 4);
    } else {
        if (B.st == CT_OK) B.st = SLOT(D, flex_fwd, &fa);
        if (bf) {
            tb_get(&B, hb, fa.attn.out, nq * 2);
            for (size_t i = 0; i < nq; i++) h[i] = bf16_val(hb[i]);
        } else {
            tb_get(&B, h, fa.attn.out, nq * 4);
        }
        tb_get(&B, h + nq, fa.attn.lse, nl * 4);
    }
    if (B.st == CT_OK) f2d(res, h, nout);
    if (c->jsm) c->jsm->param_grad = NULL;
    free(h), free(hb);
    ct_dev_block_mask_free(D->d, &dm);
    return tb_done(&B);
}

/* The reference's mask and score mod, from the definitions in backend.h / attention.h. */
static bool fref_keep(const flex_ctx *c, int64_t b, int64_t i, int64_t j)
{
    if (c->jit == FJ_MOD3 && !(((i - j) % 3 + 3) % 3 != 0 || i == j)) return false;
    if (c->jit == FJ_PAIR && !(c->keepv[j] != 0 || i == j)) return false;
    if ((c->bits & CT_FLEX_MASK_CAUSAL) && j > i) return false;
    if ((c->bits & CT_FLEX_MASK_WINDOW) && (i - j > c->window || j - i > c->window)) return false;
    if ((c->bits & CT_FLEX_MASK_PREFIX) && !(j < c->prefix || j <= i)) return false;
    if (c->bits & CT_FLEX_MASK_DOCUMENT) {
        int64_t r = (c->doc_batch == 1 ? 0 : b) * c->T;
        const int32_t *kd = c->kvdoc ? c->kvdoc : c->qdoc;
        if (c->qdoc[r + i] != kd[r + j]) return false;
    }
    return true;
}

static int64_t fref_relpos(int64_t i, int64_t j)
{
    int64_t x = i - j + 64;
    return x < 0 ? 0 : x > 128 ? 128 : x;
}

static double fref_mod(const flex_ctx *c, double s, int64_t h, int64_t i, int64_t j)
{
    if (c->jit == FJ_RELPOS) return s + c->bias[h * 129 + fref_relpos(i, j)];
    if (c->jit == FJ_PAIR) return s * c->w[h];
    if (c->score == CT_FLEX_SCORE_SOFTCAP) return c->cap * tanh(s / c->cap);
    if (c->score == CT_FLEX_SCORE_ALIBI) return s + (double)c->slopes[h] * (double)(j - i);
    return s;
}

/* The parameter gradient of a pair: g = dL / d score_mod(s). */
static void fref_pgrad(const flex_ctx *c, double *pg, double s, double g, int64_t h, int64_t i, int64_t j)
{
    if (c->jit == FJ_RELPOS) pg[h * 129 + fref_relpos(i, j)] += g;
    if (c->jit == FJ_PAIR) pg[h] += g * s;
}

static double fref_dmod(const flex_ctx *c, double s, int64_t h)
{
    if (c->jit == FJ_PAIR) return c->w[h];
    if (c->score != CT_FLEX_SCORE_SOFTCAP) return 1;
    double t = tanh(s / c->cap);
    return 1 - t * t;
}

/* Flex attention in double over every pair: out [B,T,H,E], lse [B,H,T] (a row with no kept key:
 * out 0, lse -inf); with dq also dq, dk, dv. */
static void flex_ref(const flex_ctx *c, double *out, double *lse, double *dq, double *dk, double *dv, double *pg)
{
    int64_t T = c->T, H = c->H, Hk = c->Hk, E = c->E, G = H / Hk;
    double *p = malloc((size_t)T * sizeof *p), *dp = malloc((size_t)T * sizeof *dp), *raw = malloc((size_t)T * sizeof *raw);
    bool *kp = malloc((size_t)T * sizeof *kp);
#define QI(b, t, h) ((((b) * T + (t)) * H + (h)) * E)
#define KI(b, t, h) ((((b) * T + (t)) * Hk + (h)) * E)
    for (int64_t b = 0; b < c->Bb; b++)
        for (int64_t h = 0; h < H; h++) {
            int64_t hk = h / G;
            for (int64_t i = 0; i < T; i++) {
                double m = -INFINITY, l = 0;
                for (int64_t j = 0; j < T; j++) {
                    kp[j] = fref_keep(c, b, i, j);
                    if (!kp[j]) continue;
                    double s = 0;
                    for (int64_t e = 0; e < E; e++) s += (double)c->q[QI(b, i, h) + e] * c->k[KI(b, j, hk) + e];
                    raw[j] = s * c->scale;
                    p[j] = fref_mod(c, raw[j], h, i, j);
                    m = p[j] > m ? p[j] : m;
                }
                if (m == -INFINITY) { /* no kept key */
                    if (lse) lse[(b * H + h) * T + i] = -INFINITY;
                    if (out)
                        for (int64_t e = 0; e < E; e++) out[QI(b, i, h) + e] = 0;
                    continue;
                }
                for (int64_t j = 0; j < T; j++)
                    if (kp[j]) l += exp(p[j] - m);
                double ls = m + log(l);
                for (int64_t j = 0; j < T; j++) p[j] = kp[j] ? exp(p[j] - ls) : 0;
                if (lse) lse[(b * H + h) * T + i] = ls;
                if (out)
                    for (int64_t e = 0; e < E; e++) {
                        double s = 0;
                        for (int64_t j = 0; j < T; j++) s += p[j] * c->v[KI(b, j, hk) + e];
                        out[QI(b, i, h) + e] = s;
                    }
                if (!dq) continue;
                /* D = rowsum(dout * out) from the out the slot is given (bf16-rounded for bf16),
                 * as the definition has it (sum_j P dP with the exact out) */
                double dsum = 0;
                for (int64_t e = 0; e < E; e++) dsum += (double)c->dout[QI(b, i, h) + e] * c->out[QI(b, i, h) + e];
                for (int64_t j = 0; j < T; j++) {
                    if (!kp[j]) continue;
                    double s = 0;
                    for (int64_t e = 0; e < E; e++) s += (double)c->dout[QI(b, i, h) + e] * c->v[KI(b, j, hk) + e];
                    dp[j] = s;
                }
                for (int64_t j = 0; j < T; j++) {
                    if (!kp[j]) continue;
                    double g = p[j] * (dp[j] - dsum);
                    double ds = g * fref_dmod(c, raw[j], h) * c->scale;
                    if (pg) fref_pgrad(c, pg, raw[j], g, h, i, j);
                    for (int64_t e = 0; e < E; e++) {
                        dq[QI(b, i, h) + e] += ds * c->k[KI(b, j, hk) + e];
                        dk[KI(b, j, hk) + e] += ds * c->q[QI(b, i, h) + e];
                        dv[KI(b, j, hk) + e] += p[j] * c->dout[QI(b, i, h) + e];
                    }
                }
            }
        }
#undef QI
#undef KI
    free(p), free(dp), free(raw), free(kp);
}

/* The host mask_mod of a case (the AND of its bits' built-ins; noop without bits), kids kept in
 * kids[] (freed by flex_mods_free). */
typedef struct flex_mods_host {
    ct_mask_mod kids[4], all;
    int n;
} flex_mods_host;

static ct_status flex_mods_make(const flex_ctx *c, flex_mods_host *m)
{
    memset(m, 0, sizeof *m);
    if (c->bits & CT_FLEX_MASK_CAUSAL) CT_TRY(ct_mask_mod_causal(&m->kids[m->n++]));
    if (c->bits & CT_FLEX_MASK_WINDOW) CT_TRY(ct_mask_mod_sliding_window(c->window, false, &m->kids[m->n++]));
    if (c->bits & CT_FLEX_MASK_PREFIX) CT_TRY(ct_mask_mod_prefix_lm(c->prefix, &m->kids[m->n++]));
    if (c->bits & CT_FLEX_MASK_DOCUMENT)
        CT_TRY(ct_mask_mod_document(c->qdoc, c->kvdoc, c->doc_batch, c->T, c->T, &m->kids[m->n++]));
    if (m->n == 0) return ct_mask_mod_noop(&m->all);
    if (m->n == 1) {
        m->all = m->kids[0];
        m->all.destroy = NULL; /* owned by kids[0] */
        return CT_OK;
    }
    return ct_mask_mod_and(m->kids, m->n, &m->all);
}

static void flex_mods_free(flex_mods_host *m)
{
    ct_mask_mod_free(&m->all);
    for (int i = 0; i < m->n; i++) ct_mask_mod_free(&m->kids[i]);
}

typedef struct flex_case {
    const char *name;
    int64_t Bb, T, H, Hk, E, bs;
    unsigned bits;
    int64_t window, prefix;
    int doc; /* 0 none, 1 ids per batch, 2 one shared row, 3 kv ids apart (rows with no key) */
    ct_flex_score score;
    float cap;
    bool rows_bh; /* the block mask keeps a row per batch and head (no broadcast) */
} flex_case;

/* Packed documents: lengths from a fixed pattern, shifted by the batch. */
static void flex_docs(int32_t *ids, int64_t T, int64_t b)
{
    static const int lens[] = {23, 64, 5, 41, 90, 17};
    int64_t t = 0;
    for (int d = 0; t < T; d++)
        for (int64_t n = lens[(d + b) % 6]; n > 0 && t < T; n--) ids[t++] = d;
}

static void test_flex(const tdev *D)
{
    static const flex_case cases[] = {
        {"causal", 2, 17, 4, 2, 64, 64, CT_FLEX_MASK_CAUSAL, 0, 0, 0, CT_FLEX_SCORE_NONE, 0, false},
        {"causal window 20", 1, 150, 2, 1, 64, 64, CT_FLEX_MASK_CAUSAL | CT_FLEX_MASK_WINDOW, 20, 0, 0,
         CT_FLEX_SCORE_NONE, 0, false},
        {"causal window 130 (sub-tiles full / empty)", 1, 300, 2, 1, 64, 128,
         CT_FLEX_MASK_CAUSAL | CT_FLEX_MASK_WINDOW, 130, 0, 0, CT_FLEX_SCORE_NONE, 0, false},
        {"two-sided window 40", 1, 100, 2, 2, 32, 64, CT_FLEX_MASK_WINDOW, 40, 0, 0, CT_FLEX_SCORE_NONE, 0, false},
        {"causal documents", 2, 131, 4, 1, 64, 64, CT_FLEX_MASK_CAUSAL | CT_FLEX_MASK_DOCUMENT, 0, 0, 1,
         CT_FLEX_SCORE_NONE, 0, false},
        {"shared documents", 2, 70, 2, 2, 16, 64, CT_FLEX_MASK_DOCUMENT, 0, 0, 2, CT_FLEX_SCORE_NONE, 0, false},
        {"documents, rows without keys", 1, 90, 2, 1, 64, 64, CT_FLEX_MASK_DOCUMENT, 0, 0, 3, CT_FLEX_SCORE_NONE, 0,
         false},
        {"prefix 70", 1, 133, 2, 2, 128, 128, CT_FLEX_MASK_PREFIX, 0, 70, 0, CT_FLEX_SCORE_NONE, 0, false},
        {"alibi, no mask", 1, 75, 4, 2, 64, 64, 0, 0, 0, 0, CT_FLEX_SCORE_ALIBI, 0, false},
        {"alibi causal", 2, 33, 2, 1, 128, 128, CT_FLEX_MASK_CAUSAL, 0, 0, 0, CT_FLEX_SCORE_ALIBI, 0, false},
        {"softcap causal window 30", 1, 90, 2, 2, 128, 128, CT_FLEX_MASK_CAUSAL | CT_FLEX_MASK_WINDOW, 30, 0, 0,
         CT_FLEX_SCORE_SOFTCAP, 1.5f, false},
        {"softcap, rows per b and h", 2, 40, 2, 1, 64, 64, CT_FLEX_MASK_CAUSAL, 0, 0, 0, CT_FLEX_SCORE_SOFTCAP, 3.0f,
         true},
        {"causal E256", 1, 37, 2, 1, 256, 64, CT_FLEX_MASK_CAUSAL, 0, 0, 0, CT_FLEX_SCORE_NONE, 0, false},
    };
    char what[160];
    bool hf = HAS(D, flex_fwd), hb = HAS(D, flex_bwd);
    if (!hf && !hb) return;
    for (int ci = 0; ci < LEN(cases); ci++)
        for (int dt = 0; dt < 2; dt++) {
            const flex_case *fc = &cases[ci];
            flex_ctx c = {.Bb = fc->Bb, .T = fc->T, .H = fc->H, .Hk = fc->Hk, .E = fc->E, .bs = fc->bs,
                          .bits = fc->bits, .window = fc->window, .prefix = fc->prefix, .score = fc->score,
                          .cap = fc->cap};
            c.dtype = dt ? CT_DTYPE_BF16 : CT_DTYPE_F32;
            c.scale = (float)(1.0 / sqrt((double)c.E));
            size_t nq = (size_t)(c.Bb * c.T * c.H * c.E), nk = (size_t)(c.Bb * c.T * c.Hk * c.E);
            size_t nl = (size_t)(c.Bb * c.H * c.T);
            int32_t *qdoc = NULL, *kvdoc = NULL;
            if (fc->doc) {
                c.doc_batch = fc->doc == 2 ? 1 : c.Bb;
                qdoc = malloc((size_t)(c.doc_batch * c.T) * 4);
                for (int64_t b = 0; b < c.doc_batch; b++) flex_docs(qdoc + b * c.T, c.T, b);
                if (fc->doc == 3) { /* the last document's queries find no key of theirs */
                    kvdoc = malloc((size_t)(c.doc_batch * c.T) * 4);
                    memcpy(kvdoc, qdoc, (size_t)(c.doc_batch * c.T) * 4);
                    for (int64_t t = 0; t < c.doc_batch * c.T; t++)
                        if (kvdoc[t] == qdoc[c.doc_batch * c.T - 1]) kvdoc[t] += 100;
                }
            }
            c.qdoc = qdoc, c.kvdoc = kvdoc;
            float slopes[8];
            for (int64_t h = 0; h < c.H; h++) slopes[h] = (float)exp2(-8.0 * (double)(h + 1) / (double)c.H);
            c.slopes = slopes;
            flex_mods_host mh;
            ct_block_mask *bm = NULL;
            ct_status st = flex_mods_make(&c, &mh);
            if (st == CT_OK) {
                ct_mask_mod m = mh.all;
                if (fc->rows_bh) m.uses_b = m.uses_h = true;
                st = ct_block_mask_create(&m, c.Bb, c.H, c.T, c.T, c.bs, &bm);
            }
            CHECK_OK(st);
            if (st != CT_OK) {
                flex_mods_free(&mh);
                free(qdoc), free(kvdoc);
                continue;
            }
            if (fc->rows_bh) CHECK(bm->B == c.Bb && bm->H == c.H);
            c.bm = bm;
            float *q = fvec(nq, -2, 2), *k = fvec(nk, -2, 2), *v = fvec(nk, -1, 1), *dout = fvec(nq, -1, 1);
            float *outf = malloc(nq * 4), *lsef = malloc(nl * 4);
            uint16_t *qb = NULL, *kb = NULL, *vb = NULL, *db = NULL, *ob = NULL;
            if (dt) qb = bf16_round(q, nq), kb = bf16_round(k, nk), vb = bf16_round(v, nk), db = bf16_round(dout, nq);
            c.q = q, c.k = k, c.v = v, c.dout = dout, c.qb = qb, c.kb = kb, c.vb = vb, c.doutb = db;
            double *ref = dvec(nq + nl), *gref = dvec(nq + 2 * nk);
            flex_ref(&c, ref, ref + nq, NULL, NULL, NULL, NULL);
            for (size_t i = 0; i < nq; i++) outf[i] = (float)ref[i];
            for (size_t i = 0; i < nl; i++) lsef[i] = (float)ref[nq + i];
            if (dt) ob = bf16_round(outf, nq);
            c.out = outf, c.lse = lsef, c.outb = ob;
            flex_ref(&c, NULL, NULL, gref, gref + nq, gref + nq + nk, NULL);
            snprintf(what, sizeof what, "flex_fwd %s %s B%lld T%lld H%lld Hk%lld E%lld bs%lld", fc->name,
                     dt ? "bf16" : "f32", (long long)c.Bb, (long long)c.T, (long long)c.H, (long long)c.Hk,
                     (long long)c.E, (long long)c.bs);
            if (hf) verify_ex(D, what, flex_run, &c, nq + nl, ref, dt ? 1e-2 : RTOL_RED, 0, 0);
            c.bwd = true;
            memcpy(what + 5, "bwd", 3);
            if (hb) verify_ex(D, what, flex_run, &c, nq + 2 * nk, gref, dt ? 1e-2 : RTOL_RED, 0, 0);
            free(q), free(k), free(v), free(dout), free(outf), free(lsef);
            free(qb), free(kb), free(vb), free(db), free(ob), free(ref), free(gref);
            ct_block_mask_free(bm);
            flex_mods_free(&mh);
            free(qdoc), free(kvdoc);
        }

    /* Refusals on a GPU: compiled mods without their module (CT_EINVAL naming it), block sizes
     * other than 64 / 128 (CT_EUNSUPPORTED naming it). */
    ct_mask_mod cm;
    ct_block_mask *bm32 = NULL;
    CHECK_OK(ct_mask_mod_causal(&cm));
    CHECK_OK(ct_block_mask_create(&cm, 1, 1, 40, 40, 32, &bm32));
    ct_block_mask *bmj = NULL;
    CHECK_OK(ct_block_mask_create(&cm, 1, 1, 40, 40, 64, &bmj));
    float *q = fvec(40 * 8, -1, 1);
    static const ct_flex_jit dummy = {0};
    for (int kind = 0; kind < 2 && bm32 && bmj && q && hf && D->gpu; kind++) {
        flex_ctx c = {.Bb = 1, .T = 40, .H = 1, .Hk = 1, .E = 8, .bs = 32, .bits = CT_FLEX_MASK_CAUSAL,
                      .scale = 0.35f, .dtype = CT_DTYPE_F32, .bm = kind == 0 ? bmj : bm32, .q = q, .k = q, .v = q,
                      .compiled = kind == 0 ? &dummy : NULL};
        double *res = dvec(40 * 8 + 40);
        ct_clear_error();
        ct_status s = flex_run(D, &c, res);
        t_checks++;
        const char *msg = ct_last_error();
        ct_status want = kind == 0 ? CT_EINVAL : CT_EUNSUPPORTED;
        if (s != want || !strstr(msg, kind == 0 ? "module" : "block size")) {
            t_failures++;
            fprintf(stderr, "  %s flex_fwd with %s: %s: %s (expected %s naming it)\n", D->name,
                    kind == 0 ? "compiled mods without a module" : "block size 32", ct_status_name(s), msg,
                    ct_status_name(want));
        }
        free(res);
    }
    /* Bad arguments on every device: unknown mask bits, a document batch that is neither 1
     * nor B, ALiBi without slopes (CT_EINVAL naming the rule); a NULL mask to the upload. */
    ct_block_mask *bm64 = NULL;
    CHECK_OK(ct_block_mask_create(&cm, 1, 1, 40, 40, 64, &bm64));
    static const int32_t docs[2 * 40];
    for (int kind = 0; kind < 3 && bm64 && q && hf; kind++) {
        flex_ctx c = {.Bb = 1, .T = 40, .H = 1, .Hk = 1, .E = 8, .bs = 64, .scale = 0.35f, .dtype = CT_DTYPE_F32,
                      .bm = bm64, .q = q, .k = q, .v = q};
        if (kind == 0) c.bits = 1u << 7;
        if (kind == 1) c.bits = CT_FLEX_MASK_DOCUMENT, c.qdoc = docs, c.doc_batch = 2;
        if (kind == 2) c.score = CT_FLEX_SCORE_ALIBI; /* slopes NULL: none uploaded */
        double *res = dvec(40 * 8 + 40);
        ct_clear_error();
        ct_status s = flex_run(D, &c, res);
        t_checks++;
        const char *msg = ct_last_error(), *want = kind == 0 ? "mask bits" : kind == 1 ? "doc_batch" : "slopes";
        if (s != CT_EINVAL || !strstr(msg, want)) {
            t_failures++;
            fprintf(stderr, "  %s flex_fwd bad argument %d: %s: %s (expected CT_EINVAL naming %s)\n", D->name, kind,
                    ct_status_name(s), msg, want);
        }
        free(res);
    }
    ct_dev_block_mask dm;
    ct_clear_error();
    CHECK(ct_dev_block_mask_upload(D->d, NULL, &dm) == CT_EINVAL && strstr(ct_last_error(), "block mask"));
    ct_block_mask_free(bm64);
    free(q);
    ct_block_mask_free(bm32);
    ct_block_mask_free(bmj);
    ct_mask_mod_free(&cm);
}

/* ---- flex attention with compiled (jit) mods ----------------------------------------------------
 * The mods' device source written by hand after backend.h's contract (tests/cuda_emu/
 * flex_jit_samples.h: a relative-position bias score mod over a bound array with its gradient,
 * a mask mod (q - kv) % 3 != 0 || q == kv under the causal bits, a mask + score pair over two
 * arrays, the score's with a gradient). The CPU runs the host mods compiled from the same
 * expressions (ct_score_mod_compile / ct_mask_mod_compile) through its flex slots; a GPU runs
 * its module of the source (flex_jit_build + flex_jit_load, once per source, dtype and head-dim
 * class). Each case against the double reference (out / lse, dq / dk / dv and the parameter
 * gradient), on a GPU also 3x bitwise and against the CPU; f32 and bf16. */

#include "../cuda_emu/flex_jit_samples.h"

typedef struct fj_module {
    int jit, dtype, eclass;
    void *module;
} fj_module;

/* The device's module for (kind, dtype, E): built and loaded on first use, kept in mods[]. */
static void *fj_module_get(const tdev *D, fj_module *mods, int *nmods, int jit, ct_dtype dt, int64_t E)
{
    int ec = E <= 32 ? 0 : E <= 64 ? 1 : E <= 128 ? 2 : 3;
    for (int i = 0; i < *nmods; i++)
        if (mods[i].jit == jit && mods[i].dtype == (int)dt && mods[i].eclass == ec) return mods[i].module;
    const char *src = jit == FJ_RELPOS ? FJ_RELPOS_SRC : jit == FJ_MOD3 ? FJ_MOD3_SRC : FJ_PAIR_SRC;
    void *image = NULL, *module = NULL;
    size_t len = 0;
    ct_status s = SLOT(D, flex_jit_build, src, dt, E, &image, &len);
    CHECK_OK(s);
    if (s == CT_OK) {
        s = SLOT(D, flex_jit_load, image, len, &module);
        CHECK_OK(s);
        /* a damaged image (a payload byte flipped) and a cut one are refused, never loaded */
        void *bad = NULL;
        unsigned char *cp = malloc(len);
        if (cp) {
            memcpy(cp, image, len);
            cp[len / 2] ^= 0x40;
            ct_clear_error();
            CHECK(SLOT(D, flex_jit_load, cp, len, &bad) == CT_EFORMAT && !bad);
            CHECK(SLOT(D, flex_jit_load, image, 40, &bad) == CT_EFORMAT && !bad);
            free(cp);
        }
    }
    free(image);
    if (module) mods[(*nmods)++] = (fj_module){jit, (int)dt, ec, module};
    return module;
}

static void test_flex_jit(const tdev *D)
{
    static const struct {
        const char *name;
        int jit;
        int64_t Bb, T, H, Hk, E, bs;
        unsigned bits;
    } cases[] = {
        {"relpos bias (grad), causal", FJ_RELPOS, 2, 100, 2, 1, 64, 64, CT_FLEX_MASK_CAUSAL},
        {"mask (q-kv)%3, causal", FJ_MOD3, 1, 90, 2, 2, 32, 64, CT_FLEX_MASK_CAUSAL},
        {"mask keep[kv] + score w[h] (grad)", FJ_PAIR, 1, 70, 4, 2, 64, 128, 0},
    };
    bool hf = HAS(D, flex_fwd), hb = HAS(D, flex_bwd);
    if (D->gpu && !(HAS(D, flex_jit_build) && HAS(D, flex_jit_load) && HAS(D, flex_jit_unload))) return;
    if (!hf || !hb) return;
    if (D->gpu) { /* the compiler's identity names it */
        char id[128] = "";
        CHECK_OK(SLOT(D, flex_jit_identity, id, sizeof id));
        CHECK(strstr(id, "sm_") != NULL);
        printf("  %s: compiled mods by %s\n", D->name, id);
    }
    fj_module mods[16];
    int nmods = 0;
    char what[200];
    for (int ci = 0; ci < LEN(cases); ci++) {
        int64_t Bb = cases[ci].Bb, T = cases[ci].T, H = cases[ci].H, Hk = cases[ci].Hk, E = cases[ci].E;
        float *bias = fvec((size_t)(H * 129), -1, 1), *w = fvec((size_t)H, 0.5f, 1.5f);
        int32_t *keepv = malloc((size_t)T * 4);
        for (int64_t t = 0; t < T; t++) keepv[t] = (t * 7 + 3) % 5 != 0;
        ct_jit_binding bb = {.name = "bias", .dtype = CT_DTYPE_F32, .ndim = 2, .shape = {H, 129}, .data = bias,
                             .requires_grad = true};
        ct_jit_binding bk = {.name = "keep", .dtype = CT_DTYPE_I32, .ndim = 1, .shape = {T}, .data = keepv};
        ct_jit_binding bw = {.name = "w", .dtype = CT_DTYPE_F32, .ndim = 1, .shape = {H}, .data = w,
                             .requires_grad = true};
        ct_score_mod jsm = {0};
        ct_mask_mod jmm = {0};
        bool has_s = cases[ci].jit != FJ_MOD3, has_m = cases[ci].jit != FJ_RELPOS;
        ct_status st = CT_OK;
        if (cases[ci].jit == FJ_RELPOS) st = ct_score_mod_compile(FJ_RELPOS_EXPR, &bb, 1, NULL, &jsm);
        if (cases[ci].jit == FJ_MOD3) st = ct_mask_mod_compile(FJ_MOD3_EXPR, NULL, 0, NULL, &jmm);
        if (cases[ci].jit == FJ_PAIR) {
            st = ct_mask_mod_compile(FJ_PAIR_MASK_EXPR, &bk, 1, NULL, &jmm);
            if (st == CT_OK) st = ct_score_mod_compile(FJ_PAIR_SCORE_EXPR, &bw, 1, NULL, &jsm);
        }
        CHECK_OK(st);
        /* the block mask of the built-in bits AND the compiled mask */
        ct_mask_mod kids[2], all = {0};
        int nk = 0;
        ct_block_mask *bm = NULL;
        if (st == CT_OK && (cases[ci].bits & CT_FLEX_MASK_CAUSAL)) st = ct_mask_mod_causal(&kids[nk++]);
        if (st == CT_OK && has_m) kids[nk++] = jmm;
        if (st == CT_OK) st = nk == 0 ? ct_mask_mod_noop(&all) : nk == 1 ? CT_OK : ct_mask_mod_and(kids, nk, &all);
        if (st == CT_OK) st = ct_block_mask_create(nk == 1 ? &kids[0] : &all, Bb, H, T, T, cases[ci].bs, &bm);
        CHECK_OK(st);
        for (int dt = 0; dt < 2 && st == CT_OK; dt++) {
            flex_ctx c = {.Bb = Bb, .T = T, .H = H, .Hk = Hk, .E = E, .bs = cases[ci].bs, .bits = cases[ci].bits,
                          .jit = cases[ci].jit, .bias = bias, .w = w, .keepv = keepv, .jsm = has_s ? &jsm : NULL,
                          .jmm = has_m ? &jmm : NULL, .bm = bm};
            c.dtype = dt ? CT_DTYPE_BF16 : CT_DTYPE_F32;
            c.scale = (float)(1.0 / sqrt((double)E));
            if (D->gpu && !(c.module = fj_module_get(D, mods, &nmods, c.jit, c.dtype, E))) break;
            size_t nq = (size_t)(Bb * T * H * E), nkv = (size_t)(Bb * T * Hk * E), nl = (size_t)(Bb * H * T);
            size_t npg = fj_npg(&c);
            float *q = fvec(nq, -2, 2), *k = fvec(nkv, -2, 2), *v = fvec(nkv, -1, 1), *dout = fvec(nq, -1, 1);
            float *outf = malloc(nq * 4), *lsef = malloc(nl * 4);
            uint16_t *qb = NULL, *kb = NULL, *vb = NULL, *db = NULL, *ob = NULL;
            if (dt) qb = bf16_round(q, nq), kb = bf16_round(k, nkv), vb = bf16_round(v, nkv), db = bf16_round(dout, nq);
            c.q = q, c.k = k, c.v = v, c.dout = dout, c.qb = qb, c.kb = kb, c.vb = vb, c.doutb = db;
            double *ref = dvec(nq + nl), *gref = dvec(nq + 2 * nkv + npg);
            flex_ref(&c, ref, ref + nq, NULL, NULL, NULL, NULL);
            for (size_t i = 0; i < nq; i++) outf[i] = (float)ref[i];
            for (size_t i = 0; i < nl; i++) lsef[i] = (float)ref[nq + i];
            if (dt) ob = bf16_round(outf, nq);
            c.out = outf, c.lse = lsef, c.outb = ob;
            flex_ref(&c, NULL, NULL, gref, gref + nq, gref + nq + nkv, gref + nq + 2 * nkv);
            snprintf(what, sizeof what, "flex_fwd jit %s %s B%lld T%lld H%lld Hk%lld E%lld bs%lld", cases[ci].name,
                     dt ? "bf16" : "f32", (long long)Bb, (long long)T, (long long)H, (long long)Hk, (long long)E,
                     (long long)cases[ci].bs);
            verify_ex(D, what, flex_run, &c, nq + nl, ref, dt ? 1e-2 : RTOL_RED, 0, 0);
            c.bwd = true;
            memcpy(what + 5, "bwd", 3);
            verify_ex(D, what, flex_run, &c, nq + 2 * nkv + npg, gref, dt ? 1e-2 : RTOL_RED, 0, 0);
            if (npg && !dt) { /* the parameter gradient without dq (dq reads as 0) */
                c.no_dq = true;
                memset(gref, 0, nq * sizeof *gref);
                strncat(what, " no dq", sizeof what - strlen(what) - 1);
                verify_ex(D, what, flex_run, &c, nq + 2 * nkv + npg, gref, RTOL_RED, 0, 0);
            }
            free(q), free(k), free(v), free(dout), free(outf), free(lsef);
            free(qb), free(kb), free(vb), free(db), free(ob), free(ref), free(gref);
        }
        ct_block_mask_free(bm);
        if (nk > 1 || nk == 0) ct_mask_mod_free(&all);
        if ((cases[ci].bits & CT_FLEX_MASK_CAUSAL)) ct_mask_mod_free(&kids[0]);
        ct_mask_mod_free(&jmm);
        ct_score_mod_free(&jsm);
        free(bias), free(w), free(keepv);
    }
    /* a module for another dtype or head-dim class than the call's: CT_EINVAL naming it */
    if (D->gpu && nmods) {
        ct_mask_mod cm;
        ct_block_mask *bm = NULL;
        CHECK_OK(ct_mask_mod_causal(&cm));
        CHECK_OK(ct_block_mask_create(&cm, 1, 1, 40, 40, 64, &bm));
        float *q = fvec(40 * 200, -1, 1);
        flex_ctx c = {.Bb = 1, .T = 40, .H = 1, .Hk = 1, .E = 200, .bs = 64, .bits = CT_FLEX_MASK_CAUSAL,
                      .scale = 0.1f, .dtype = CT_DTYPE_F32, .bm = bm, .q = q, .k = q, .v = q, .jit = mods[0].jit,
                      .module = mods[0].module};
        float w[1] = {1}, bias[129] = {0};
        int32_t keepv[40] = {0};
        ct_score_mod dummy = {0};
        c.bias = bias, c.w = w, c.keepv = keepv, c.jsm = &dummy;
        double *res = dvec(40 * 200 + 40);
        ct_clear_error();
        ct_status s = flex_run(D, &c, res);
        CHECK(s == CT_EINVAL && strstr(ct_last_error(), "module"));
        free(res), free(q);
        ct_block_mask_free(bm);
        ct_mask_mod_free(&cm);
    }
    for (int i = 0; i < nmods; i++) D->ops->flex_jit_unload(D->bk, mods[i].module);
}

/* ---- optimizer ------------------------------------------------------------------------------ */

typedef struct opt_ctx {
    bool sumsq;
    int64_t n, step;
    const float *p, *g, *m, *v;
} opt_ctx;

#define A_LR 1e-2f
#define A_B1 0.9f
#define A_B2 0.95f
#define A_EPS 1e-8f
#define A_WD 0.1f

static ct_status opt_run(const tdev *D, const void *vc, double *out)
{
    const opt_ctx *c = vc;
    tbufs B = {.D = D};
    size_t n = (size_t)c->n, bytes = n * 4;
    if (c->sumsq) {
        float *g = tb_new(&B, c->g, bytes);
        double *o = tb_new(&B, NULL, sizeof(double));
        if (B.st == CT_OK) B.st = SLOT(D, sumsq, o, g, c->n);
        tb_get(&B, out, o, sizeof(double));
        return tb_done(&B);
    }
    float *p = tb_new(&B, c->p, bytes), *g = tb_new(&B, c->g, bytes), *m = tb_new(&B, c->m, bytes),
          *v = tb_new(&B, c->v, bytes);
    if (B.st == CT_OK) B.st = SLOT(D, adamw, p, g, m, v, c->n, c->step, A_LR, A_B1, A_B2, A_EPS, A_WD);
    float *h = malloc(3 * bytes);
    tb_get(&B, h, p, bytes), tb_get(&B, h + n, m, bytes), tb_get(&B, h + 2 * n, v, bytes);
    if (B.st == CT_OK) f2d(out, h, 3 * n);
    free(h);
    return tb_done(&B);
}

static void test_optim(const tdev *D)
{
    static const int64_t ns[] = {1, 7, 33, 1000, 16384, 2 * 16384 + 33};
    char what[96];
    for (int i = 0; i < LEN(ns); i++) {
        int64_t n = ns[i];
        float *p = fvec((size_t)n, -1, 1), *g = fvec((size_t)n, -1, 1), *m = fvec((size_t)n, -0.1f, 0.1f);
        float *v = fvec((size_t)n, 0, 0.01f);
        if (HAS(D, adamw))
            for (int64_t step = 1; step <= 7; step += 6) {
                double *ref = dvec(3 * (size_t)n);
                for (int64_t j = 0; j < n; j++) {
                    double m0 = step == 1 ? 0 : m[j], v0 = step == 1 ? 0 : v[j], gj = g[j];
                    double mj = A_B1 * m0 + (1 - (double)A_B1) * gj, vj = A_B2 * v0 + (1 - (double)A_B2) * gj * gj;
                    double bc1 = 1 - pow(A_B1, (double)step), bc2 = 1 - pow(A_B2, (double)step);
                    double pj = p[j] * (1 - (double)A_LR * A_WD);
                    ref[j] = pj - (double)A_LR / bc1 * mj / (sqrt(vj) / sqrt(bc2) + A_EPS);
                    ref[n + j] = mj, ref[2 * n + j] = vj;
                }
                float *z = calloc((size_t)n, 4);
                opt_ctx c = {.n = n, .step = step, .p = p, .g = g, .m = step == 1 ? z : m, .v = step == 1 ? z : v};
                snprintf(what, sizeof what, "adamw n%lld step %lld", (long long)n, (long long)step);
                verify(D, what, opt_run, &c, 3 * (size_t)n, ref, RTOL_EW);
                free(z), free(ref);
            }
        if (HAS(D, sumsq)) {
            double ref = 0;
            for (int64_t j = 0; j < n; j++) ref += (double)g[j] * g[j];
            opt_ctx c = {.sumsq = true, .n = n, .g = g};
            snprintf(what, sizeof what, "sumsq n%lld", (long long)n);
            verify(D, what, opt_run, &c, 1, &ref, 1e-12); /* double sums of exact squares */
        }
        free(p), free(g), free(m), free(v);
    }
}

/* ---- main -------------------------------------------------------------------------------- */

static void run_device(const tdev *D)
{
    printf("%s: %s\n", D->name, ct_device_describe(D->d));
    int before = t_failures;
    t_rng = 0x5EED0000BAC0u; /* the same inputs on every device */
    test_gemm(D);
    test_elementwise(D);
    test_rows(D);
    test_embed(D);
    test_ce(D);
    test_lce(D);
    test_attn(D);
    test_flex(D);
    test_flex_jit(D);
    test_optim(D);
    printf("%s: %d failed checks\n", D->name, t_failures - before);
}

int main(void)
{
    t_cpu.d = ct_device_cpu();
    t_cpu.ops = ct_device_ops(t_cpu.d);
    t_cpu.bk = ct_device_backend(t_cpu.d);
    t_cpu.name = ct_device_name(t_cpu.d);
    t_cpu.gpu = false;

    /* The device layer's answer for a slot a device lacks. */
    ct_clear_error();
    CHECK(ct_dev_missing(t_cpu.d, "sdpa_fwd") == CT_EUNSUPPORTED);
    CHECK(strstr(ct_last_error(), "sdpa_fwd") && strstr(ct_last_error(), "cpu"));

    run_device(&t_cpu);

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
    } else {
        tdev gd = {g, ct_device_ops(g), ct_device_backend(g), ct_device_name(g), true};
        run_device(&gd);
        ct_memory_stats_t ms;
        ct_device_memory_stats(g, &ms);
        CHECK(ms.current_bytes == 0); /* every test buffer freed */
        CHECK_OK(ct_device_close(g));
    }
    if (t_missing) printf("slots missing on a device: %d (listed above)\n", t_missing);
    return t_report("test_backend_ops");
}
