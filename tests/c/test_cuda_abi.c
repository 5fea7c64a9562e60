/* libctorch_cuda.so's side of the backend ABI (src/device/backend.h), loaded with dlopen as
 * libctorch loads it: the entry point refuses another API version and gives a table with every
 * slot set; count() on a machine without a GPU (or driver) answers a status and a message,
 * never a crash. With a GPU: open / describe / bad indices, memory round trips, and the GEMM
 * slot (the row-major contract on cuBLASLt) in both transposes, f32 and bf16, with strided and
 * offset operands, beta 0 (C never read: NaN there stays out) and beta != 0, K == 0, against a
 * double-precision reference, each run twice for the same bits.
 *
 * The library is the one this build made (CT_CUDA_LIB_PATH, from CMake); CTORCH_CUDA_LIB
 * overrides it. Built without CUDA: one "SKIPPED" line. Without a GPU the GPU parts print
 * "SKIPPED: no GPU: <why>", unless CT_TEST_REQUIRE_CUDA=1 (scripts/test-cuda.sh on a GPU
 * machine), where that is a failure. */
#include "device/backend.h"
#include "test_util.h"

#include <dlfcn.h>
#include <stdint.h>

static const char *lib_path(void)
{
    const char *env = getenv("CTORCH_CUDA_LIB");
    if (env && env[0]) return env;
#ifdef CT_CUDA_LIB_PATH
    return CT_CUDA_LIB_PATH;
#else
    return NULL;
#endif
}

static bool require_gpu(void)
{
    const char *e = getenv("CT_TEST_REQUIRE_CUDA");
    return e && strcmp(e, "1") == 0;
}

/* Every function pointer of the table, in order (a new slot must be added here too). */
static void check_table(const ct_backend_ops *o)
{
    CHECK(o->api_version == CT_BACKEND_API_VERSION);
    CHECK(o->kind && strcmp(o->kind, "cuda") == 0);
    const struct {
        const char *name;
        bool set;
    } slots[] = {
        {"count", o->count != NULL},
        {"open", o->open != NULL},
        {"close", o->close != NULL},
        {"last_error", o->last_error != NULL},
        {"describe", o->describe != NULL},
        {"alloc", o->alloc != NULL},
        {"free", o->free != NULL},
        {"copy_h2d", o->copy_h2d != NULL},
        {"copy_d2h", o->copy_d2h != NULL},
        {"copy_d2d", o->copy_d2d != NULL},
        {"memset0", o->memset0 != NULL},
        {"sync", o->sync != NULL},
        {"gemm", o->gemm != NULL},
        {"add", o->add != NULL},
        {"scale", o->scale != NULL},
        {"to_bf16", o->to_bf16 != NULL},
        {"bias_add_rows", o->bias_add_rows != NULL},
        {"bias_grad_rows", o->bias_grad_rows != NULL},
        {"rmsnorm_fwd", o->rmsnorm_fwd != NULL},
        {"rmsnorm_bwd", o->rmsnorm_bwd != NULL},
        {"rope", o->rope != NULL},
        {"swiglu_fwd", o->swiglu_fwd != NULL},
        {"swiglu_bwd", o->swiglu_bwd != NULL},
        {"embed_fwd", o->embed_fwd != NULL},
        {"embed_bwd", o->embed_bwd != NULL},
        {"ce_fwd", o->ce_fwd != NULL},
        {"ce_bwd", o->ce_bwd != NULL},
        {"lce", o->lce != NULL},
        {"sdpa_fwd", o->sdpa_fwd != NULL},
        {"sdpa_bwd", o->sdpa_bwd != NULL},
        {"adamw", o->adamw != NULL},
        {"sumsq", o->sumsq != NULL},
        {"flex_fwd", o->flex_fwd != NULL},
        {"flex_bwd", o->flex_bwd != NULL},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
        t_checks++;
        if (!slots[i].set) {
            t_failures++;
            fprintf(stderr, "slot %s is NULL\n", slots[i].name);
        }
    }
}

/* ---- GPU parts ----------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static uint16_t to_bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (finite inputs only here) */
    return (uint16_t)(u >> 16);
}

static float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void check_rc(const ct_backend_ops *o, int rc, const char *what)
{
    t_checks++;
    if (rc != 0) {
        t_failures++;
        fprintf(stderr, "%s: status %d: %s\n", what, rc, o->last_error());
    }
}

/* One GEMM case: C[M,N] (ldc) = alpha op(A) op(B) + beta C with A, B of `bf16` type at element
 * offset `off` into their buffers (misaligned for off > 0). */
static void gemm_case(const ct_backend_ops *o, ct_backend *b, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                      int64_t pad, int64_t off, float alpha, float beta, bool bf16)
{
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    const int64_t lda = ac + pad, ldb = bc + pad, ldc = N + pad;
    const size_t es = bf16 ? 2 : 4;
    const size_t na = (size_t)(ar * lda + off), nb = (size_t)(br * ldb + off), nc = (size_t)(M * ldc);
    float *a = calloc(na, sizeof(float)), *bm = calloc(nb, sizeof(float));
    float *c0 = malloc(nc * sizeof(float)), *c = malloc(nc * sizeof(float)), *c2 = malloc(nc * sizeof(float));
    uint16_t *ah = calloc(na, 2), *bh = calloc(nb, 2);
    if (!a || !bm || !c0 || !c || !c2 || !ah || !bh) {
        CHECK(!"out of host memory");
        goto out;
    }
    for (size_t i = 0; i < na; i++) {
        ah[i] = to_bf16_bits(rnd());
        a[i] = bf16 ? bf16_value(ah[i]) : rnd();
    }
    for (size_t i = 0; i < nb; i++) {
        bh[i] = to_bf16_bits(rnd());
        bm[i] = bf16 ? bf16_value(bh[i]) : rnd();
    }
    for (size_t i = 0; i < nc; i++) c0[i] = beta == 0.0f ? NAN : rnd();

    void *da = NULL, *db = NULL, *dc = NULL;
    char what[160];
    snprintf(what, sizeof what, "gemm %s M=%lld N=%lld K=%lld ta=%d tb=%d pad=%lld off=%lld beta=%g",
             bf16 ? "bf16" : "f32", (long long)M, (long long)N, (long long)K, ta, tb, (long long)pad,
             (long long)off, (double)beta);
    check_rc(o, o->alloc(b, na * es, &da), what);
    check_rc(o, o->alloc(b, nb * es, &db), what);
    check_rc(o, o->alloc(b, nc * 4, &dc), what);
    if (!da || !db || !dc) goto dev_out;
    check_rc(o, o->copy_h2d(b, da, bf16 ? (const void *)ah : (const void *)a, na * es), what);
    check_rc(o, o->copy_h2d(b, db, bf16 ? (const void *)bh : (const void *)bm, nb * es), what);
    for (int rep = 0; rep < 2; rep++) {
        check_rc(o, o->copy_h2d(b, dc, c0, nc * 4), what);
        check_rc(o, o->gemm(b, ta, tb, M, N, K, alpha, (const char *)da + off * (int64_t)es, lda,
                            (const char *)db + off * (int64_t)es, ldb, beta, (float *)dc, ldc,
                            bf16 ? CT_DTYPE_BF16 : CT_DTYPE_F32),
                 what);
        check_rc(o, o->copy_d2h(b, rep ? c2 : c, dc, nc * 4), what);
    }
    t_checks++;
    if (memcmp(c, c2, nc * 4) != 0) {
        t_failures++;
        fprintf(stderr, "%s: two runs differ\n", what);
    }
    double worst = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ldc; j++) {
            float got = c[i * ldc + j];
            if (j >= N) { /* padding is never written */
                float want = c0[i * ldc + j];
                if (!(got == want || (isnan(got) && isnan(want)))) worst = INFINITY;
                continue;
            }
            double s = 0, sa = 0;
            for (int64_t k = 0; k < K; k++) {
                double x = ta ? a[off + k * lda + i] : a[off + i * lda + k];
                double y = tb ? bm[off + j * ldb + k] : bm[off + k * ldb + j];
                s += x * y;
                sa += fabs(x * y);
            }
            double want = alpha * s + (beta == 0.0f ? 0.0 : beta * (double)c0[i * ldc + j]);
            double scale = fabs(alpha) * sa + fabs(beta * (double)c0[i * ldc + j]) + 1e-30;
            if (isnan(got)) {
                worst = INFINITY;
                continue;
            }
            double e = fabs(got - want) / scale;
            if (e > worst) worst = e;
        }
    t_checks++;
    if (!(worst <= 1e-5)) {
        t_failures++;
        fprintf(stderr, "%s: error %g of the sum of |terms| (bound 1e-5)\n", what, worst);
    }
dev_out:
    if (da) o->free(b, da);
    if (db) o->free(b, db);
    if (dc) o->free(b, dc);
out:
    free(a);
    free(bm);
    free(c0);
    free(c);
    free(c2);
    free(ah);
    free(bh);
}

static void gpu_checks(const ct_backend_ops *o, int n)
{
    ct_backend *b = NULL;
    CHECK(o->open(n, NULL, &b) != 0 && b == NULL && o->last_error()[0]);
    CHECK(o->open(-1, NULL, &b) != 0 && b == NULL && o->last_error()[0]);
    int rc = o->open(0, NULL, &b);
    check_rc(o, rc, "open(0)");
    if (rc) return;
    ct_backend_info info;
    check_rc(o, o->describe(b, &info), "describe");
    printf("cuda:0: %s, %.1f GiB, compute capability %d, %d SMs, driver %d, runtime %d\n", info.name,
           (double)info.total_bytes / (1 << 30), info.compute_capability, info.multiprocessors, info.driver_version,
           info.runtime_version);
    CHECK(info.name[0] && info.total_bytes > 0 && info.compute_capability >= 80 && info.multiprocessors > 0);

    /* Memory: alignment, h2d / d2d / memset0 / d2h round trip. */
    enum { NB = 1000003 };
    unsigned char *h = malloc(NB), *back = malloc(NB);
    void *d1 = NULL, *d2 = NULL;
    if (h && back) {
        for (size_t i = 0; i < NB; i++) h[i] = (unsigned char)(i * 131u + 7u);
        check_rc(o, o->alloc(b, NB, &d1), "alloc");
        check_rc(o, o->alloc(b, 3, &d2), "alloc");
        CHECK(((uintptr_t)d1 & 255u) == 0 && ((uintptr_t)d2 & 255u) == 0);
        o->free(b, d2);
        d2 = NULL;
        check_rc(o, o->alloc(b, NB, &d2), "alloc");
        if (d1 && d2) {
            check_rc(o, o->copy_h2d(b, d1, h, NB), "copy_h2d");
            check_rc(o, o->copy_d2d(b, d2, d1, NB), "copy_d2d");
            check_rc(o, o->memset0(b, d1, NB), "memset0");
            check_rc(o, o->copy_d2h(b, back, d2, NB), "copy_d2h");
            CHECK(memcmp(h, back, NB) == 0);
            check_rc(o, o->copy_d2h(b, back, d1, NB), "copy_d2h");
            size_t nz = 0;
            for (size_t i = 0; i < NB; i++) nz += back[i] != 0;
            CHECK(nz == 0);
            check_rc(o, o->sync(b), "sync");
        }
        /* An allocation past the device's memory: CT_ENOMEM and a message, no crash. */
        void *huge = NULL;
        CHECK(o->alloc(b, (size_t)1 << 50, &huge) == CT_ENOMEM && huge == NULL && o->last_error()[0]);
        if (huge) o->free(b, huge);
        if (d1) o->free(b, d1);
        if (d2) o->free(b, d2);
    }
    free(h);
    free(back);

    /* GEMM: every transpose pair, f32 and bf16, odd shapes, strides, offsets, betas. */
    for (int dt = 0; dt < 2; dt++)
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            gemm_case(o, b, ta, tb, 37, 53, 71, 0, 0, 1.0f, 0.0f, dt);
            gemm_case(o, b, ta, tb, 64, 128, 256, 0, 0, 0.5f, 1.0f, dt);
            gemm_case(o, b, ta, tb, 5, 3, 300, 7, 1, -1.25f, 0.75f, dt);
            gemm_case(o, b, ta, tb, 1, 200, 33, 3, 3, 1.0f, 0.0f, dt);
        }
    gemm_case(o, b, false, true, 3, 4, 0, 2, 0, 1.0f, 0.0f, false); /* K == 0: C = 0 */
    gemm_case(o, b, false, true, 3, 4, 0, 2, 0, 1.0f, 2.0f, false); /* K == 0: C = 2 C */
    check_rc(o, o->sync(b), "sync");
    o->close(b);
}

int main(void)
{
    const char *path = lib_path();
    if (!path) {
        printf("SKIPPED: built without CUDA (CTORCH_CUDA=OFF): no libctorch_cuda.so to test\n");
        return 0;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return 1;
    }
    ct_backend_entry_fn entry;
    *(void **)&entry = dlsym(h, "ct_backend_cuda_entry");
    CHECK(entry != NULL);
    if (!entry) return 1;

    /* A wrong API version is refused with a message; the right one gives the full table. */
    static const ct_backend_ops not_null;
    const ct_backend_ops *ops = &not_null; /* the entry must clear it when it refuses */
    const ct_backend_ops *refused = &not_null;
    CHECK(entry(CT_BACKEND_API_VERSION + 1, &ops) != 0 && ops == NULL);
    ops = &not_null;
    CHECK(entry(0, &ops) != 0 && ops == NULL);
    CHECK(entry(CT_BACKEND_API_VERSION, NULL) != 0);
    int rc = entry(CT_BACKEND_API_VERSION, &ops);
    CHECK(rc == 0 && ops != NULL);
    if (rc || !ops) return 1;
    entry(CT_BACKEND_API_VERSION + 1, &refused);
    CHECK(refused == NULL && strstr(ops->last_error(), "version") != NULL); /* the refusal names the cause */
    check_table(ops);

    /* count: a number of GPUs, or a status and the reason. */
    int n = -1;
    rc = ops->count(&n);
    if (rc != 0 || n < 1) {
        CHECK(rc != 0 && n == 0 && ops->last_error()[0] != '\0');
        ct_backend *b = NULL;
        CHECK(ops->open(0, NULL, &b) != 0 && b == NULL && ops->last_error()[0] != '\0');
        if (require_gpu()) {
            fprintf(stderr, "CT_TEST_REQUIRE_CUDA=1 but no GPU: %s\n", ops->last_error());
            t_failures++;
        } else {
            printf("SKIPPED: no GPU: %s\n", ops->last_error());
        }
    } else {
        printf("%d CUDA device(s)\n", n);
        gpu_checks(ops, n);
    }
    printf("%d checks, %d failures\n", t_checks, t_failures);
    return t_failures != 0;
}
