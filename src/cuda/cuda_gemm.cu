/*
 * The gemm slot on cuBLASLt, loaded at run time with dlopen (like src/ops/blas.c loads
 * OpenBLAS): libctorch_cuda.so links no cuBLAS, and a machine without it still opens the
 * device (only the GEMM then fails, naming what was tried). Tried in order:
 * $CTORCH_CUBLASLT_LIB, libcublasLt.so.13, libcublasLt.so; its major version must be the CUDA
 * major version this library was built with.
 *
 * The contract is ct_gemm_f32's, row-major: C[M,N] = alpha op(A) op(B) + beta C. cuBLASLt is
 * column-major, and a row-major matrix is its transpose in column-major order, so the product
 * is asked as C^T = op(B)^T op(A)^T: cuBLAS's A operand is our B (N x K after its op), its B
 * operand our A (K x M), its C our C seen as an N x M column-major matrix of leading dimension
 * ldc. Compute type CUBLAS_COMPUTE_32F (no TF32, no emulation: f32 multiply-adds), alpha and
 * beta f32; bf16 operands are CUDA_R_16BF with an f32 C. beta == 0 is passed as 0, and cuBLAS
 * then does not read C (NaN in C stays out, as in ct_gemm_f32).
 *
 * Determinism: cuBLASLt gives the same bits run to run for the same algorithm (all its split-K
 * reduction schemes are ordered). The algorithm is chosen once per (transposes, dtype, M, N,
 * K, strides, operand alignments) by its heuristic with this backend's fixed 32 MiB workspace
 * and kept in a per-backend cache, with its descriptors, so the same call runs the same
 * algorithm for the life of the backend.
 */
#include "cuda/cuda_internal.cuh"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the part of cuBLASLt's API used here (values from its cublasLt.h / cublas_api.h) ------- */

typedef int cublas_status;                 /* cublasStatus_t */
typedef struct cublasLtContext *lt_handle; /* cublasLtHandle_t */
typedef void *lt_desc;                     /* cublasLtMatmulDesc_t */
typedef void *lt_layout;                   /* cublasLtMatrixLayout_t */
typedef void *lt_pref;                     /* cublasLtMatmulPreference_t */
typedef struct {
    uint64_t data[8];
} lt_algo; /* cublasLtMatmulAlgo_t */
typedef struct {
    lt_algo algo;
    size_t workspaceSize;
    cublas_status state;
    float wavesCount;
    int reserved[4];
} lt_heuristic; /* cublasLtMatmulHeuristicResult_t */

enum {
    CUBLAS_STATUS_SUCCESS_ = 0,
    CUBLAS_OP_N_ = 0,
    CUBLAS_OP_T_ = 1,
    CUBLAS_COMPUTE_32F_ = 68,
    CUBLASLT_MATMUL_DESC_TRANSA_ = 3,
    CUBLASLT_MATMUL_DESC_TRANSB_ = 4,
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES_ = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES_ = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES_ = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES_ = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES_ = 8,
};
/* cudaDataType (library_types.h, shipped with cudart): CUDA_R_32F = 0, CUDA_R_16BF = 14. */

typedef size_t (*lt_get_version_fn)(void);
typedef const char *(*lt_status_name_fn)(cublas_status);
typedef cublas_status (*lt_create_fn)(lt_handle *);
typedef cublas_status (*lt_destroy_fn)(lt_handle);
typedef cublas_status (*lt_desc_create_fn)(lt_desc *, int compute, cudaDataType_t scale);
typedef cublas_status (*lt_desc_destroy_fn)(lt_desc);
typedef cublas_status (*lt_desc_set_fn)(lt_desc, int attr, const void *buf, size_t bytes);
typedef cublas_status (*lt_layout_create_fn)(lt_layout *, cudaDataType_t, uint64_t rows, uint64_t cols, int64_t ld);
typedef cublas_status (*lt_layout_destroy_fn)(lt_layout);
typedef cublas_status (*lt_pref_create_fn)(lt_pref *);
typedef cublas_status (*lt_pref_destroy_fn)(lt_pref);
typedef cublas_status (*lt_pref_set_fn)(lt_pref, int attr, const void *buf, size_t bytes);
typedef cublas_status (*lt_heuristic_fn)(lt_handle, lt_desc, lt_layout, lt_layout, lt_layout, lt_layout, lt_pref,
                                         int requested, lt_heuristic *results, int *returned);
typedef cublas_status (*lt_matmul_fn)(lt_handle, lt_desc, const void *alpha, const void *A, lt_layout,
                                      const void *B, lt_layout, const void *beta, const void *C, lt_layout, void *D,
                                      lt_layout, const lt_algo *, void *workspace, size_t workspace_bytes,
                                      cudaStream_t);

static struct {
    lt_get_version_fn get_version;
    lt_status_name_fn status_name; /* optional */
    lt_create_fn create;
    lt_destroy_fn destroy;
    lt_desc_create_fn desc_create;
    lt_desc_destroy_fn desc_destroy;
    lt_desc_set_fn desc_set;
    lt_layout_create_fn layout_create;
    lt_layout_destroy_fn layout_destroy;
    lt_pref_create_fn pref_create;
    lt_pref_destroy_fn pref_destroy;
    lt_pref_set_fn pref_set;
    lt_heuristic_fn heuristic;
    lt_matmul_fn matmul;
} lt;

static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static bool lt_loaded;
static char lt_describe[512]; /* "cuBLASLt 13.1.0 from libcublasLt.so.13" or why not loaded */

static void *sym(void *h, const char *name, bool *ok)
{
    void *p = dlsym(h, name);
    if (!p) *ok = false;
    return p;
}

static void lt_load(void)
{
    const char *env = getenv("CTORCH_CUBLASLT_LIB");
    const char *names[] = {env, "libcublasLt.so.13", "libcublasLt.so"};
    char tried[384] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!names[i] || !names[i][0]) continue;
        int w = snprintf(tried + used, sizeof tried - used, "%s%s", used ? ", " : "", names[i]);
        if (w > 0 && (size_t)w < sizeof tried - used) used += (size_t)w;
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        bool ok = true;
        lt.get_version = (lt_get_version_fn)sym(h, "cublasLtGetVersion", &ok);
        lt.create = (lt_create_fn)sym(h, "cublasLtCreate", &ok);
        lt.destroy = (lt_destroy_fn)sym(h, "cublasLtDestroy", &ok);
        lt.desc_create = (lt_desc_create_fn)sym(h, "cublasLtMatmulDescCreate", &ok);
        lt.desc_destroy = (lt_desc_destroy_fn)sym(h, "cublasLtMatmulDescDestroy", &ok);
        lt.desc_set = (lt_desc_set_fn)sym(h, "cublasLtMatmulDescSetAttribute", &ok);
        lt.layout_create = (lt_layout_create_fn)sym(h, "cublasLtMatrixLayoutCreate", &ok);
        lt.layout_destroy = (lt_layout_destroy_fn)sym(h, "cublasLtMatrixLayoutDestroy", &ok);
        lt.pref_create = (lt_pref_create_fn)sym(h, "cublasLtMatmulPreferenceCreate", &ok);
        lt.pref_destroy = (lt_pref_destroy_fn)sym(h, "cublasLtMatmulPreferenceDestroy", &ok);
        lt.pref_set = (lt_pref_set_fn)sym(h, "cublasLtMatmulPreferenceSetAttribute", &ok);
        lt.heuristic = (lt_heuristic_fn)sym(h, "cublasLtMatmulAlgoGetHeuristic", &ok);
        lt.matmul = (lt_matmul_fn)sym(h, "cublasLtMatmul", &ok);
        lt.status_name = (lt_status_name_fn)dlsym(h, "cublasLtGetStatusName");
        if (!ok) {
            snprintf(lt_describe, sizeof lt_describe, "cuBLASLt not loaded: %s lacks cublasLt functions", names[i]);
            dlclose(h);
            memset(&lt, 0, sizeof lt);
            return;
        }
        size_t v = lt.get_version(); /* major * 10000 + minor * 100 + patch */
        if ((int)(v / 10000) != CUDART_VERSION / 1000) {
            snprintf(lt_describe, sizeof lt_describe,
                     "cuBLASLt not loaded: %s is cuBLASLt %zu.%zu.%zu, this library needs cuBLASLt %d (its CUDA "
                     "major version)", names[i], v / 10000, v / 100 % 100, v % 100, CUDART_VERSION / 1000);
            dlclose(h);
            memset(&lt, 0, sizeof lt);
            return;
        }
        snprintf(lt_describe, sizeof lt_describe, "cuBLASLt %zu.%zu.%zu from %s", v / 10000, v / 100 % 100, v % 100,
                 names[i]);
        lt_loaded = true;
        return; /* the handle stays open for the life of the process */
    }
    snprintf(lt_describe, sizeof lt_describe,
             "cuBLASLt not loaded: none of %s could be loaded (install the CUDA %d cuBLAS library, or set "
             "CTORCH_CUBLASLT_LIB to its libcublasLt.so)", tried[0] ? tried : "(nothing)", CUDART_VERSION / 1000);
}

extern "C" const char *ctcu_gemm_describe(void)
{
    pthread_once(&lt_once, lt_load);
    return lt_describe;
}

static int lt_fail(cublas_status s, const char *what)
{
    const char *name = lt.status_name ? lt.status_name(s) : NULL;
    int status = s == 3 /* CUBLAS_STATUS_ALLOC_FAILED */ ? CT_ENOMEM : CT_EINTERNAL;
    return ctcu_fail(status, "gemm: %s failed: %s (cublasStatus %d)", what, name ? name : "?", (int)s);
}
#define LT_TRY(call, what)                                                                                      \
    do {                                                                                                        \
        cublas_status s_ = (call);                                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS_) {                                                                     \
            rc = lt_fail(s_, what);                                                                             \
            goto done;                                                                                          \
        }                                                                                                       \
    } while (0)

/* ---- the per-backend state: handle, workspace, plans --------------------------------------- */

enum { WORKSPACE_BYTES = 32 << 20, PLAN_BUCKETS = 256, PLAN_MAX = 4096 };

typedef struct plan_key {
    int64_t M, N, K, lda, ldb, ldc;
    int trans_a, trans_b, dtype;
    unsigned align_a, align_b, align_c; /* bytes, powers of two up to 256 */
} plan_key;

typedef struct gemm_plan {
    plan_key key;
    lt_desc desc;
    lt_layout la, lb, lc; /* cuBLAS's A (our B), B (our A), C */
    lt_algo algo;
    size_t workspace; /* bytes the algorithm needs */
    struct gemm_plan *next;
} gemm_plan;

struct ctcu_gemm_state {
    lt_handle handle;
    void *workspace;
    pthread_mutex_t lock;
    gemm_plan *buckets[PLAN_BUCKETS];
    int plans;
};

static void plan_free(gemm_plan *p)
{
    if (!p) return;
    if (p->lc) lt.layout_destroy(p->lc);
    if (p->lb) lt.layout_destroy(p->lb);
    if (p->la) lt.layout_destroy(p->la);
    if (p->desc) lt.desc_destroy(p->desc);
    free(p);
}

static void plans_clear(struct ctcu_gemm_state *g)
{
    for (int i = 0; i < PLAN_BUCKETS; i++) {
        gemm_plan *p = g->buckets[i];
        while (p) {
            gemm_plan *n = p->next;
            plan_free(p);
            p = n;
        }
        g->buckets[i] = NULL;
    }
    g->plans = 0;
}

extern "C" void ctcu_gemm_close(ct_backend *b)
{
    struct ctcu_gemm_state **slot = ctcu_gemm_state_of(b);
    struct ctcu_gemm_state *g = *slot;
    if (!g) return;
    plans_clear(g);
    if (g->handle) lt.destroy(g->handle);
    ctcu_scratch_free(b, g->workspace);
    pthread_mutex_destroy(&g->lock);
    free(g);
    *slot = NULL;
}

static int gemm_state(ct_backend *b, struct ctcu_gemm_state **out)
{
    struct ctcu_gemm_state **slot = ctcu_gemm_state_of(b);
    if (*slot) {
        *out = *slot;
        return 0;
    }
    pthread_once(&lt_once, lt_load);
    if (!lt_loaded) return ctcu_fail(CT_EUNSUPPORTED, "gemm: %s", lt_describe);
    struct ctcu_gemm_state *g = (struct ctcu_gemm_state *)calloc(1, sizeof *g);
    if (!g) return ctcu_fail(CT_ENOMEM, "gemm: out of host memory for the cuBLASLt state");
    if (pthread_mutex_init(&g->lock, NULL) != 0) {
        free(g);
        return ctcu_fail(CT_EINTERNAL, "gemm: pthread_mutex_init failed");
    }
    int rc = 0;
    LT_TRY(lt.create(&g->handle), "cublasLtCreate");
    if ((rc = ctcu_scratch(b, WORKSPACE_BYTES, &g->workspace))) goto done;
    *slot = g;
    *out = g;
    return 0;
done:
    if (g->handle) lt.destroy(g->handle);
    pthread_mutex_destroy(&g->lock);
    free(g);
    return rc;
}

static unsigned align_of(const void *p, int64_t ld, size_t elem)
{
    uintptr_t a = (uintptr_t)p | (uintptr_t)((uint64_t)ld * elem) | 256u;
    return (unsigned)(a & (~a + 1)); /* lowest set bit: the largest power of two dividing both */
}

static uint64_t key_hash(const plan_key *k)
{
    const int64_t v[] = {k->M, k->N, k->K, k->lda, k->ldb, k->ldc, k->trans_a, k->trans_b, k->dtype,
                         (int64_t)k->align_a, (int64_t)k->align_b, (int64_t)k->align_c};
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        h ^= (uint64_t)v[i];
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    return h;
}

static bool key_eq(const plan_key *a, const plan_key *b)
{
    return a->M == b->M && a->N == b->N && a->K == b->K && a->lda == b->lda && a->ldb == b->ldb &&
           a->ldc == b->ldc && a->trans_a == b->trans_a && a->trans_b == b->trans_b && a->dtype == b->dtype &&
           a->align_a == b->align_a && a->align_b == b->align_b && a->align_c == b->align_c;
}

/* Make the descriptors and choose the algorithm for k. */
static int plan_make(struct ctcu_gemm_state *g, const plan_key *k, gemm_plan **out)
{
    *out = NULL;
    gemm_plan *p = (gemm_plan *)calloc(1, sizeof *p);
    if (!p) return ctcu_fail(CT_ENOMEM, "gemm: out of host memory for a plan");
    p->key = *k;
    int rc = 0;
    lt_pref pref = NULL;
    lt_heuristic res;
    int found = 0;
    const cudaDataType_t ab = k->dtype == CT_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const int32_t op_a = k->trans_b ? CUBLAS_OP_T_ : CUBLAS_OP_N_; /* cuBLAS's A is our B */
    const int32_t op_b = k->trans_a ? CUBLAS_OP_T_ : CUBLAS_OP_N_; /* cuBLAS's B is our A */
    const uint64_t ws = WORKSPACE_BYTES;
    /* cuBLAS's A is our B and its B our A: their alignments swap too; D is C. */
    const uint32_t al_a = k->align_b, al_b = k->align_a, al_c = k->align_c;
    memset(&res, 0, sizeof res);
    LT_TRY(lt.desc_create(&p->desc, CUBLAS_COMPUTE_32F_, CUDA_R_32F), "cublasLtMatmulDescCreate");
    LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA_, &op_a, sizeof op_a), "setting TRANSA");
    LT_TRY(lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB_, &op_b, sizeof op_b), "setting TRANSB");
    /* our B: K x N (trans_b: N x K) row-major = column-major N x K (K x N), ld ldb */
    LT_TRY(lt.layout_create(&p->la, ab, (uint64_t)(k->trans_b ? k->K : k->N), (uint64_t)(k->trans_b ? k->N : k->K),
                            k->ldb),
           "cublasLtMatrixLayoutCreate(B)");
    /* our A: M x K (trans_a: K x M) row-major = column-major K x M (M x K), ld lda */
    LT_TRY(lt.layout_create(&p->lb, ab, (uint64_t)(k->trans_a ? k->M : k->K), (uint64_t)(k->trans_a ? k->K : k->M),
                            k->lda),
           "cublasLtMatrixLayoutCreate(A)");
    /* C: M x N row-major = column-major N x M, ld ldc */
    LT_TRY(lt.layout_create(&p->lc, CUDA_R_32F, (uint64_t)k->N, (uint64_t)k->M, k->ldc), "cublasLtMatrixLayoutCreate(C)");
    LT_TRY(lt.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
    LT_TRY(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES_, &ws, sizeof ws), "setting the workspace");
    LT_TRY(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES_, &al_a, sizeof al_a), "setting alignments");
    LT_TRY(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES_, &al_b, sizeof al_b), "setting alignments");
    LT_TRY(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES_, &al_c, sizeof al_c), "setting alignments");
    LT_TRY(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES_, &al_c, sizeof al_c), "setting alignments");
    LT_TRY(lt.heuristic(g->handle, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found),
           "cublasLtMatmulAlgoGetHeuristic");
    if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS_) {
        rc = ctcu_fail(CT_EUNSUPPORTED,
                       "gemm: cuBLASLt has no algorithm for M=%lld N=%lld K=%lld (%s%s, %s, lda=%lld ldb=%lld "
                       "ldc=%lld)", (long long)k->M, (long long)k->N, (long long)k->K, k->trans_a ? "A^T" : "A",
                       k->trans_b ? " B^T" : " B", k->dtype == CT_DTYPE_BF16 ? "bf16" : "f32", (long long)k->lda,
                       (long long)k->ldb, (long long)k->ldc);
        goto done;
    }
    p->algo = res.algo;
    p->workspace = res.workspaceSize;
done:
    if (pref) lt.pref_destroy(pref);
    if (rc) {
        plan_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* The plan of k, made on first use (the caller holds g->lock). */
static int plan_get(struct ctcu_gemm_state *g, const plan_key *k, gemm_plan **out)
{
    uint64_t h = key_hash(k) % PLAN_BUCKETS;
    for (gemm_plan *p = g->buckets[h]; p; p = p->next)
        if (key_eq(&p->key, k)) {
            *out = p;
            return 0;
        }
    /* A bounded cache: past PLAN_MAX shapes start again (the heuristic answers the same for the
     * same inputs, so a re-made plan runs the same algorithm). */
    if (g->plans >= PLAN_MAX) plans_clear(g);
    gemm_plan *p = NULL;
    int rc = plan_make(g, k, &p);
    if (rc) return rc;
    p->next = g->buckets[h];
    g->buckets[h] = p;
    g->plans++;
    *out = p;
    return 0;
}

/* C = beta C (beta == 0: zeros, C never read), for K == 0. */
static __global__ void gemm_scale_c(float *C, int64_t M, int64_t N, int64_t ldc, float beta)
{
    const int64_t total = M * N;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / N, c = i - r * N;
        float *x = C + r * ldc + c;
        *x = beta == 0.0f ? 0.0f : beta * *x;
    }
}

extern "C" int ctcu_gemm(ct_backend *b, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc,
                         ct_dtype dtype)
{
    if (dtype != CT_DTYPE_F32 && dtype != CT_DTYPE_BF16)
        return ctcu_fail(CT_EUNSUPPORTED, "gemm: operands of dtype %d (f32 or bf16 only)", (int)dtype);
    if (M == 0 || N == 0) return 0;
    if (K == 0) {
        const int threads = 256;
        unsigned blocks = ctcu_blocks(M * N, threads);
        if (blocks > 65536u) blocks = 65536u;
        gemm_scale_c<<<blocks, threads, 0, ctcu_stream(b)>>>(C, M, N, ldc, beta);
        return ctcu_launched("gemm (K = 0: C = beta C)");
    }
    struct ctcu_gemm_state *g = NULL;
    int rc = gemm_state(b, &g);
    if (rc) return rc;
    const size_t elem = dtype == CT_DTYPE_BF16 ? 2 : 4;
    plan_key k;
    memset(&k, 0, sizeof k);
    k.M = M;
    k.N = N;
    k.K = K;
    k.lda = lda;
    k.ldb = ldb;
    k.ldc = ldc;
    k.trans_a = trans_a;
    k.trans_b = trans_b;
    k.dtype = (int)dtype;
    k.align_a = align_of(A, lda, elem);
    k.align_b = align_of(B, ldb, elem);
    k.align_c = align_of(C, ldc, sizeof(float));
    pthread_mutex_lock(&g->lock);
    gemm_plan *p = NULL;
    rc = plan_get(g, &k, &p);
    if (rc == 0) {
        /* cuBLAS's A is our B, its B our A (see the top of this file). */
        cublas_status s = lt.matmul(g->handle, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                                    &p->algo, g->workspace, WORKSPACE_BYTES, ctcu_stream(b));
        if (s != CUBLAS_STATUS_SUCCESS_) rc = lt_fail(s, "cublasLtMatmul");
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}
