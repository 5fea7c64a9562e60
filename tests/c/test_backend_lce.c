/* The fused linear + cross-entropy on a device (ct_device_linear_cross_entropy_ex, the lce
 * slot of src/device/backend.h): the per-row upstream gradient (grad_rows, reduction NONE)
 * and the bf16 gradient GEMMs of the GPU (the logits' gradient G rounded to bf16, bf16
 * operands, f32 accumulation) beside CT_LCE_F32_GRADS (G kept in f32, the CPU's numerics).
 *
 * Devices: "cuda:0" when it opens (the emulated device in CI: CTORCH_CUDA_LIB names
 * libctorch_cuda_emu.so and CT_TEST_REQUIRE_CUDA=1 makes its absence a failure), else only
 * the CPU checks run and the line "SKIPPED: cuda: <why>" says so.
 *
 * Every case (option sets: mean, sum, none with one upstream gradient and with grad_rows,
 * ignore_index, label smoothing, class weights, z-loss, softcap, all together; with and
 * without a bias; f32 and bf16; int32 and int64 targets; a small scratch budget giving many
 * tiles; accumulated gradients) is compared with:
 *   - a double reference written here from include/ctorch/loss.h's definitions: the f32 paths
 *     (f32 inputs, and bf16 inputs with CT_LCE_F32_GRADS) within 1e-4; the bf16-G path against
 *     the same reference with G rounded to f32 and then to bf16 (nearest even) as the kernel
 *     does, within 1e-4 plus, for each G element within the device's f32 error of a bf16
 *     rounding boundary, the gap between the two bf16 values it may round to (so the bound is
 *     tight: G left in f32 fails it, which one case checks);
 *   - the CPU device's result (ct_linear_cross_entropy_forward_backward): within 2e-4 for the
 *     f32 paths, 1e-2 (bf16's 2^-9 per term) for the bf16-G path;
 *   - itself: a second run gives the same bits; flags make no difference for f32 inputs; on the
 *     emulated device (whose GEMM is exact for bf16 and f32 operands alike) bf16 inputs with
 *     CT_LCE_F32_GRADS give the bits of the f32 run on the same values (the old bf16 path).
 * Bounds are |got - ref| <= rtol (|ref| + rms(ref)) + extra, element by element. */
#include "device/device_internal.h"
#include "test_util.h"

#include <stdint.h>

#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

static ct_device *t_gpu;
static bool t_emulated;

/* ---- inputs ------------------------------------------------------------------------------ */

static uint16_t bf16_bits(float x) /* round to nearest even; NaN stays NaN */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static double bf16_round_d(double x) /* the kernel's rounding of its f32 G: to f32, then bf16 */
{
    return bf16_float(bf16_bits((float)x));
}

/* One case's inputs (host; f32 values that are bf16 values when dtype is bf16). */
typedef struct lce_case {
    const char *opt_name;
    int64_t N, D, V;
    ct_dtype dtype, tdtype;
    ct_ce_options o;
    float *h, *w, *bias, *cw, *rows, *acc0; /* acc0: starting gradients (accumulate), or NULL */
    uint16_t *hb, *wb;
    int64_t *tg;
    int32_t *t32;
    float grad_scale;
    bool use_rows;
    unsigned flags;
} lce_case;

static size_t nloss(const lce_case *c)
{
    return c->o.reduction == CT_REDUCTION_NONE ? (size_t)c->N : 1;
}

/* Outputs in one double vector: loss, z_loss (nloss each), lse [N], dh [N D], dW [V D], db [V]. */
static size_t nout(const lce_case *c)
{
    return 2 * nloss(c) + (size_t)c->N + (size_t)(c->N * c->D) + (size_t)(c->V * c->D) +
           (c->bias ? (size_t)c->V : 0);
}

/* ---- one run on a device ------------------------------------------------------------------- */

typedef struct dbuf {
    ct_device *d;
    void *p[12];
    size_t n[12];
    int k;
    ct_status st;
} dbuf;

static void *db_new(dbuf *B, const void *host, size_t bytes)
{
    if (B->st != CT_OK || !bytes) return NULL;
    void *p = NULL;
    B->st = ct_dev_alloc(B->d, bytes, "test", &p);
    if (B->st != CT_OK) return NULL;
    B->p[B->k] = p, B->n[B->k++] = bytes;
    if (host) {
        B->st = ct_dev_h2d(B->d, p, host, bytes);
    } else { /* NaN bytes: an output the call forgets shows */
        void *ff = malloc(bytes);
        memset(ff, 0xff, bytes);
        B->st = ct_dev_h2d(B->d, p, ff, bytes);
        free(ff);
    }
    return p;
}

static void db_get(dbuf *B, double *dst, const float *dev, size_t n)
{
    if (B->st != CT_OK || !n) return;
    float *h = malloc(n * 4);
    B->st = ct_dev_d2h(B->d, h, dev, n * 4);
    for (size_t i = 0; i < n && B->st == CT_OK; i++) dst[i] = h[i];
    free(h);
}

static ct_status run_case(ct_device *d, const lce_case *c, unsigned flags, double *out)
{
    dbuf B = {.d = d};
    bool bf = c->dtype == CT_DTYPE_BF16;
    size_t es = bf ? 2 : 4, N = (size_t)c->N, nh = (size_t)(c->N * c->D), nw = (size_t)(c->V * c->D);
    size_t V = (size_t)c->V, nl = nloss(c);
    ct_lce_inputs in = {.dtype = c->dtype, .target_dtype = c->tdtype, .N = c->N, .D = c->D, .V = c->V};
    in.h = db_new(&B, bf ? (const void *)c->hb : c->h, nh * es);
    in.weight = db_new(&B, bf ? (const void *)c->wb : c->w, nw * es);
    in.bias = c->bias ? db_new(&B, c->bias, V * 4) : NULL;
    in.target = db_new(&B, c->tdtype == CT_DTYPE_I64 ? (const void *)c->tg : c->t32,
                       N * (c->tdtype == CT_DTYPE_I64 ? 8 : 4));
    ct_ce_options o = c->o;
    if (o.class_weight) o.class_weight = db_new(&B, c->cw, V * 4);
    const float *rows = c->use_rows ? db_new(&B, c->rows, N * 4) : NULL;
    ct_ce_outputs co = {db_new(&B, NULL, nl * 4), db_new(&B, NULL, nl * 4), db_new(&B, NULL, N * 4)};
    ct_lce_grads g = {.accumulate = c->acc0 != NULL};
    g.dh = db_new(&B, c->acc0, nh * 4);
    g.dweight = db_new(&B, c->acc0, nw * 4);
    g.dbias = c->bias ? db_new(&B, c->acc0, V * 4) : NULL;
    if (B.st == CT_OK)
        B.st = ct_device_linear_cross_entropy_ex(d, &co, &g, c->grad_scale, rows, flags, &in, &o);
    if (B.st == CT_OK) B.st = ct_device_sync(d);
    double *p = out;
    db_get(&B, p, co.loss, nl), p += nl;
    db_get(&B, p, co.z_loss, nl), p += nl;
    db_get(&B, p, co.lse, N), p += N;
    db_get(&B, p, g.dh, nh), p += nh;
    db_get(&B, p, g.dweight, nw), p += nw;
    if (c->bias) db_get(&B, p, g.dbias, V);
    for (int i = B.k - 1; i >= 0; i--) ct_dev_free(d, B.p[i], B.n[i]);
    return B.st;
}

/* ---- the double reference ------------------------------------------------------------------ */

/* ref: the outputs with G exact (g16 false) or G rounded to bf16 through f32 (g16 true); then
 * slack (g16 only, may be NULL) gets, per gradient output, the sum of |operand| x the gap of
 * every G element that the device's f32 error could round to the other bf16 neighbour. */
static void reference(const lce_case *c, bool g16, double *ref, double *slack)
{
    int64_t N = c->N, D = c->D, V = c->V;
    const ct_ce_options *o = &c->o;
    size_t nl = nloss(c);
    double *G = calloc((size_t)(N * V), sizeof *G), *gap = calloc((size_t)(N * V), sizeof *gap);
    double *z = malloc((size_t)V * sizeof *z), *x = malloc((size_t)V * sizeof *x);
    double W = 0, denom = 0, lsum = 0, zsum = 0;
    for (int64_t j = 0; j < V; j++) W += o->class_weight ? c->cw[j] : 1.0;
    for (int64_t n = 0; n < N; n++)
        if (c->tg[n] != o->ignore_index) denom += o->class_weight ? c->cw[c->tg[n]] : 1.0;
    double eps = o->label_smoothing, s = o->z_loss, cap = o->softcap;
    double *loss = ref, *zl = ref + nl, *lse = ref + 2 * nl;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t j = 0; j < V; j++) {
            double a = c->bias ? c->bias[j] : 0;
            for (int64_t k = 0; k < D; k++) a += (double)c->h[n * D + k] * c->w[j * D + k];
            x[j] = a;
            z[j] = cap > 0 ? cap * tanh(a / cap) : a;
        }
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j < V; j++) m = z[j] > m ? z[j] : m;
        for (int64_t j = 0; j < V; j++) l += exp(z[j] - m);
        double L = m + log(l);
        lse[n] = L;
        int64_t y = c->tg[n];
        bool ign = y == o->ignore_index;
        double row = 0, zt = 0;
        if (!ign) {
            double wy = o->class_weight ? c->cw[y] : 1.0, swz = 0;
            for (int64_t j = 0; j < V; j++) swz += (o->class_weight ? c->cw[j] : 1.0) * z[j];
            zt = s * L * L;
            row = (1 - eps) * wy * (L - z[y]) + eps / (double)V * (W * L - swz) + zt;
        }
        if (o->reduction == CT_REDUCTION_NONE) loss[n] = row, zl[n] = zt;
        lsum += row, zsum += zt;
        double g = c->use_rows ? c->rows[n] : o->reduction == CT_REDUCTION_MEAN ? c->grad_scale / denom : c->grad_scale;
        if (ign || g == 0) continue;
        for (int64_t j = 0; j < V; j++) {
            double p = exp(z[j] - L), wy = o->class_weight ? c->cw[y] : 1.0;
            double wc = o->class_weight ? c->cw[j] : 1.0;
            double d = (1 - eps) * wy * (p - (j == y)) + eps / (double)V * (W * p - wc) + 2 * s * L * p;
            d *= g;
            if (cap > 0) {
                double t = tanh(x[j] / cap);
                d *= 1 - t * t;
            }
            if (g16) {
                /* the device's f32 G is within ~1e-5 relative (plus a little of the row's scale
                 * where terms cancel) of d: both bf16 neighbours it may round to */
                double w = 2e-5 * fabs(d) + 2e-6 * fabs(g);
                double lo = bf16_round_d(d - w), hi = bf16_round_d(d + w);
                gap[n * V + j] = hi - lo;
                d = bf16_round_d(d);
            }
            G[n * V + j] = d;
        }
    }
    if (o->reduction == CT_REDUCTION_SUM) loss[0] = lsum, zl[0] = zsum;
    if (o->reduction == CT_REDUCTION_MEAN) loss[0] = lsum / denom, zl[0] = zsum / denom;
    double *dh = lse + N, *dW = dh + N * D, *db = dW + V * D;
    size_t ng = (size_t)(N * D + V * D + (c->bias ? V : 0));
    if (slack) memset(slack, 0, nout(c) * sizeof *slack);
    double *sh = slack ? slack + 2 * nl + N : NULL, *sW = sh ? sh + N * D : NULL, *sb = sW ? sW + V * D : NULL;
    const float *a0 = c->acc0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < D; k++) {
            double a = a0 ? a0[n * D + k] : 0, e = 0;
            for (int64_t j = 0; j < V; j++) {
                a += G[n * V + j] * c->w[j * D + k];
                e += gap[n * V + j] * fabs(c->w[j * D + k]);
            }
            dh[n * D + k] = a;
            if (sh) sh[n * D + k] = e;
        }
    for (int64_t j = 0; j < V; j++) {
        for (int64_t k = 0; k < D; k++) {
            double a = a0 ? a0[j * D + k] : 0, e = 0;
            for (int64_t n = 0; n < N; n++) {
                a += G[n * V + j] * c->h[n * D + k];
                e += gap[n * V + j] * fabs(c->h[n * D + k]);
            }
            dW[j * D + k] = a;
            if (sW) sW[j * D + k] = e;
        }
        if (c->bias) {
            double a = a0 ? a0[j] : 0, e = 0;
            for (int64_t n = 0; n < N; n++) a += G[n * V + j], e += gap[n * V + j];
            db[j] = a;
            if (sb) sb[j] = e;
        }
    }
    (void)ng;
    free(G), free(gap), free(z), free(x);
}

/* ---- comparison --------------------------------------------------------------------------- */

/* 1 when every element is within rtol (|ref| + rms(ref)) + slack[i] (NaN meets NaN); else 0,
 * printing the worst element unless quiet. */
static int within(const char *what, const double *got, const double *ref, const double *slack, size_t n,
                  double rtol, bool quiet)
{
    double ss = 0;
    size_t fin = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i])) ss += ref[i] * ref[i], fin++;
    double rms = fin ? sqrt(ss / (double)fin) : 0, worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i]) || isnan(got[i])) {
            if (isnan(ref[i]) != isnan(got[i])) {
                if (!quiet) fprintf(stderr, "  %s[%zu]: %.9g vs %.9g (NaN mismatch)\n", what, i, got[i], ref[i]);
                return 0;
            }
            continue;
        }
        double bound = rtol * (fabs(ref[i]) + rms) + (slack ? slack[i] : 0), e = fabs(got[i] - ref[i]);
        double r = bound > 0 ? e / bound : (e > 0 ? INFINITY : 0);
        if (r > worst) worst = r, wi = i;
    }
    if (worst > 1) {
        if (!quiet)
            fprintf(stderr, "  %s[%zu of %zu]: %.9g vs %.9g (%.3g x the bound, rtol %g)\n", what, wi, n, got[wi],
                    ref[wi], worst, rtol);
        return 0;
    }
    return 1;
}

static void expect(const char *what, const char *vs, const double *got, const double *ref, const double *slack,
                   size_t n, double rtol)
{
    char label[400];
    snprintf(label, sizeof label, "%s vs %s", what, vs);
    t_checks++;
    if (!within(label, got, ref, slack, n, rtol, false)) t_failures++;
}

static void expect_same(const char *what, const char *vs, const double *a, const double *b, size_t n)
{
    t_checks++;
    if (memcmp(a, b, n * sizeof *a) != 0) {
        size_t i = 0;
        while (i < n && !memcmp(&a[i], &b[i], sizeof *a)) i++;
        t_failures++;
        fprintf(stderr, "  %s: not the bits of %s at [%zu]: %.9g vs %.9g\n", what, vs, i, a[i], b[i]);
    }
}

/* ---- the cases ------------------------------------------------------------------------------ */

enum { OPT_SETS = 11 };
static const char *opt_names[OPT_SETS] = {"mean",      "sum",     "none",   "none rows", "ignore(-100)", "ignore(1)",
                                          "smoothing", "weights", "z_loss", "softcap",   "all none rows"};

static void make_options(lce_case *c, int k)
{
    ct_ce_options o = ct_ce_options_default();
    int64_t N = c->N, V = c->V;
    for (int64_t n = 0; n < N; n++) c->tg[n] = (int64_t)(t_next() % (uint64_t)V);
    c->grad_scale = 0.7f;
    switch (k) {
    case 1: o.reduction = CT_REDUCTION_SUM; break;
    case 2: o.reduction = CT_REDUCTION_NONE; break;
    case 3: o.reduction = CT_REDUCTION_NONE, c->use_rows = true; break;
    case 4:
        for (int64_t n = 1; n < N; n += 3) c->tg[n] = -100;
        break;
    case 5: o.ignore_index = V > 1 ? 1 : 0; break;
    case 6: o.label_smoothing = 0.1f; break;
    case 7:
        o.class_weight = c->cw;
        for (int64_t n = 2; n < N; n += 4) c->tg[n] = -100;
        break;
    case 8: o.z_loss = 1e-3f; break;
    case 9: o.softcap = 3.0f; break;
    case 10:
        o.reduction = CT_REDUCTION_NONE, c->use_rows = true;
        o.class_weight = c->cw, o.label_smoothing = 0.2f, o.z_loss = 1e-2f, o.softcap = 5.0f;
        for (int64_t n = 1; n < N; n += 3) c->tg[n] = -100;
        break;
    default: break;
    }
    for (int64_t n = 0; n < N; n++) c->t32[n] = (int32_t)c->tg[n];
    c->o = o;
    c->opt_name = opt_names[k];
}

static void case_free(lce_case *c)
{
    free(c->h), free(c->w), free(c->bias), free(c->cw), free(c->rows), free(c->acc0);
    free(c->hb), free(c->wb), free(c->tg), free(c->t32);
}

static float *fvec(size_t n, float lo, float hi)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    t_fill(x, n, lo, hi);
    return x;
}

static void case_make(lce_case *c, int64_t N, int64_t D, int64_t V, ct_dtype dt, int k, bool bias, bool acc)
{
    memset(c, 0, sizeof *c);
    c->N = N, c->D = D, c->V = V, c->dtype = dt;
    c->tdtype = (N + V + k) % 2 ? CT_DTYPE_I64 : CT_DTYPE_I32;
    size_t nh = (size_t)(N * D), nw = (size_t)(V * D);
    c->h = fvec(nh, -1, 1), c->w = fvec(nw, -1, 1);
    c->bias = bias ? fvec((size_t)V, -1, 1) : NULL;
    c->cw = fvec((size_t)V, 0.25f, 2.0f);
    c->rows = fvec((size_t)N, -1.5f, 1.5f);
    c->rows[0] = 0.0f; /* a row whose upstream gradient is 0: zero gradients */
    if (acc) {
        size_t m = nh > nw ? nh : nw;
        c->acc0 = fvec(m > (size_t)V ? m : (size_t)V, -1, 1);
    }
    if (dt == CT_DTYPE_BF16) {
        c->hb = malloc(nh * 2), c->wb = malloc(nw * 2);
        for (size_t i = 0; i < nh; i++) c->hb[i] = bf16_bits(c->h[i]), c->h[i] = bf16_float(c->hb[i]);
        for (size_t i = 0; i < nw; i++) c->wb[i] = bf16_bits(c->w[i]), c->w[i] = bf16_float(c->wb[i]);
    }
    c->tg = malloc((size_t)N * 8), c->t32 = malloc((size_t)N * 4);
    make_options(c, k);
}

/* Run case c on the CPU and the GPU (when open) and check everything the header lists. */
static void check_case(lce_case *c, const char *extra)
{
    char what[200];
    bool bf = c->dtype == CT_DTYPE_BF16;
    snprintf(what, sizeof what, "lce %s %s%s N%lld D%lld V%lld%s%s", c->opt_name, ct_dtype_name(c->dtype),
             c->bias ? " bias" : "", (long long)c->N, (long long)c->D, (long long)c->V, c->acc0 ? " accumulate" : "",
             extra);
    size_t n = nout(c);
    double *ref = calloc(n, 8), *ref16 = calloc(n, 8), *slack = calloc(n, 8);
    double *cpu = calloc(n, 8), *a = calloc(n, 8), *b = calloc(n, 8), *f = calloc(n, 8);
    reference(c, false, ref, NULL);
    if (bf) reference(c, true, ref16, slack);
    /* the CPU device: f32 G always */
    ct_clear_error();
    ct_status s = run_case(ct_device_cpu(), c, 0, cpu);
    CHECK_OK(s);
    if (s == CT_OK) expect(what, "reference (cpu)", cpu, ref, NULL, n, 1e-4);
    if (t_gpu && s == CT_OK) {
        char lab[320];
        snprintf(lab, sizeof lab, "%.200s on %s", what, ct_device_name(t_gpu));
        s = run_case(t_gpu, c, 0, a);
        CHECK_OK(s);
        if (s == CT_OK) {
            if (bf) {
                /* loss, z and lse: no G in them, the f32 reference holds */
                size_t head = 2 * nloss(c) + (size_t)c->N;
                expect(lab, "reference", a, ref, NULL, head, 1e-4);
                expect(lab, "reference with G rounded to bf16", a, ref16, slack, n, 1e-4);
                expect(lab, "cpu (f32 G)", a, cpu, NULL, n, 1e-2);
            } else {
                expect(lab, "reference", a, ref, NULL, n, 1e-4);
                expect(lab, "cpu", a, cpu, NULL, n, 2e-4);
            }
            CHECK_OK(run_case(t_gpu, c, 0, b));
            expect_same(lab, "its first run", b, a, n);
        }
        /* CT_LCE_F32_GRADS: the CPU's numerics */
        s = run_case(t_gpu, c, CT_LCE_F32_GRADS, f);
        CHECK_OK(s);
        if (s == CT_OK) {
            snprintf(lab, sizeof lab, "%.200s on %s, CT_LCE_F32_GRADS", what, ct_device_name(t_gpu));
            expect(lab, "reference", f, ref, NULL, n, 1e-4);
            expect(lab, "cpu", f, cpu, NULL, n, 2e-4);
            if (!bf) expect_same(lab, "the run without the flag", f, a, n);
            /* the old bf16 path: the f32 run on the same values (the same tiling: a budget
             * that binds tiles bf16 with CT_LCE_F32_GRADS, which widens h and W into it,
             * differently from f32) */
            if (bf && t_emulated && (c->o.scratch_bytes == 0 || c->o.scratch_bytes >= ((size_t)1 << 20))) {
                lce_case c32 = *c;
                c32.dtype = CT_DTYPE_F32;
                CHECK_OK(run_case(t_gpu, &c32, 0, b));
                expect_same(lab, "the f32 run on the same values", f, b, n);
            }
        }
    }
    free(ref), free(ref16), free(slack), free(cpu), free(a), free(b), free(f);
}

static void test_cases(void)
{
    static const int64_t ns[] = {1, 7, 33}, vs[] = {3, 1000};
    int idx = 0;
    for (int in = 0; in < LEN(ns); in++)
        for (int iv = 0; iv < LEN(vs); iv++)
            for (int k = 0; k < OPT_SETS; k++, idx++) {
                int64_t N = ns[in], V = vs[iv], D = idx % 2 ? 64 : 8;
                /* every option set in both dtypes over the shapes, in fewer runs than all */
                for (int dt = 0; dt < 2; dt++) {
                    if ((idx + dt) % 2 && !(in == 2 && iv == 1)) continue;
                    lce_case c;
                    case_make(&c, N, D, V, dt ? CT_DTYPE_BF16 : CT_DTYPE_F32, k, idx % 3 == 0, idx % 7 == 3);
                    check_case(&c, "");
                    case_free(&c);
                }
            }
    /* many tiles (a 64 KiB budget) and the backend's own budget (0: whole rows) */
    for (int dt = 0; dt < 2; dt++)
        for (int k = 0; k < 2; k++) {
            lce_case c;
            case_make(&c, 33, 64, 1000, dt ? CT_DTYPE_BF16 : CT_DTYPE_F32, k ? 10 : 0, true, false);
            c.o.scratch_bytes = k ? 0 : (size_t)64 << 10;
            check_case(&c, k ? " scratch 0 (the device's own)" : " scratch 64 KiB");
            case_free(&c);
        }
}

/* The bf16-G bound is tight: G left in f32 (CT_LCE_F32_GRADS) does not meet it. */
static void test_bound_is_tight(void)
{
    if (!t_gpu) return;
    lce_case c;
    case_make(&c, 33, 64, 1000, CT_DTYPE_BF16, 1, true, false);
    size_t n = nout(&c);
    double *ref16 = calloc(n, 8), *slack = calloc(n, 8), *f = calloc(n, 8);
    reference(&c, true, ref16, slack);
    ct_status s = run_case(t_gpu, &c, CT_LCE_F32_GRADS, f);
    CHECK_OK(s);
    size_t head = 2 * nloss(&c) + (size_t)c.N;
    t_checks++;
    if (s == CT_OK && within("", f + head, ref16 + head, slack + head, n - head, 1e-4, true)) {
        t_failures++;
        fprintf(stderr, "  the f32-G gradients meet the bf16-G bound: the bound cannot tell them apart\n");
    }
    free(ref16), free(slack), free(f);
    case_free(&c);
}

/* Bad arguments: grad_rows with MEAN / SUM, unknown flags (CT_EINVAL naming the rule). */
static void test_refusals(ct_device *d)
{
    float one = 1.0f, *rows = NULL, *loss = NULL;
    uint16_t *hw = NULL;
    int32_t *t = NULL;
    CHECK_OK(ct_dev_alloc(d, 64, "rows", (void **)&rows));
    CHECK_OK(ct_dev_alloc(d, 64, "loss", (void **)&loss));
    CHECK_OK(ct_dev_alloc(d, 64, "hw", (void **)&hw));
    CHECK_OK(ct_dev_alloc(d, 64, "t", (void **)&t));
    if (rows && loss && hw && t) {
        int32_t zero[2] = {0, 0};
        CHECK_OK(ct_dev_h2d(d, t, zero, sizeof zero));
        CHECK_OK(ct_dev_h2d(d, rows, &one, 4));
        ct_lce_inputs in = {.h = hw, .weight = hw, .dtype = CT_DTYPE_BF16, .target = t,
                            .target_dtype = CT_DTYPE_I32, .N = 1, .D = 8, .V = 2};
        ct_ce_outputs out = {loss, NULL, NULL};
        float *dh = loss + 4;
        ct_lce_grads g = {dh, NULL, NULL, false};
        ct_ce_options o = ct_ce_options_default();
        CHECK_STATUS(ct_device_linear_cross_entropy_ex(d, &out, &g, 1.0f, rows, 0, &in, &o), CT_EINVAL);
        CHECK(strstr(ct_last_error(), "grad_rows") && strstr(ct_last_error(), "NONE"));
        o.reduction = CT_REDUCTION_NONE;
        CHECK_STATUS(ct_device_linear_cross_entropy_ex(d, &out, &g, 1.0f, rows, 0x6, &in, &o), CT_EINVAL);
        CHECK(strstr(ct_last_error(), "flags") != NULL);
        CHECK_OK(ct_device_sync(d));
    }
    ct_dev_free(d, rows, 64), ct_dev_free(d, loss, 64), ct_dev_free(d, hw, 64), ct_dev_free(d, t, 64);
}

int main(void)
{
    ct_device_options o = ct_device_options_default();
    CHECK_OK(ct_device_parse("cuda:0", &o));
    if (ct_device_open(&o, &t_gpu) != CT_OK) {
        t_gpu = NULL;
        printf("SKIPPED: cuda: %s (the CPU device's checks run)\n", ct_last_error());
        const char *req = getenv("CT_TEST_REQUIRE_CUDA");
        if (req && !strcmp(req, "1")) {
            fprintf(stderr, "CT_TEST_REQUIRE_CUDA=1 and no CUDA device opened\n");
            t_failures++;
        }
    } else {
        t_emulated = strstr(ct_device_describe(t_gpu), "emulated") != NULL;
        printf("%s\n", ct_device_describe(t_gpu));
    }
    t_rng = 0x5EED0000C0DEu;
    test_cases();
    test_bound_is_tight();
    test_refusals(ct_device_cpu());
    if (t_gpu) {
        test_refusals(t_gpu);
        ct_memory_stats_t ms;
        ct_device_memory_stats(t_gpu, &ms);
        CHECK(ms.current_bytes == 0);
        CHECK_OK(ct_device_close(t_gpu));
    }
    return t_report("test_backend_lce");
}
