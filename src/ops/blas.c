/*
 * Loading OpenBLAS at run time.
 *
 * OpenBLAS picks its kernels in a constructor, from OPENBLAS_CORETYPE or its own CPU table.
 * Releases that do not know a CPU fall back to the SSE3 "Prescott" kernels: on a recent
 * Xeon that is 3x slower than its AVX-512 kernels (measured with `ctorch bench gemm`).
 * Linking OpenBLAS directly would run that constructor before ctorch could say anything,
 * so ctorch dlopen()s it on first use: if OPENBLAS_CORETYPE is unset, it is first set from
 * the CPU's features (SkylakeX for AVX-512 F/BW/DQ/VL, Haswell for AVX2+FMA). A value the
 * user set is kept. If OpenBLAS was already loaded by someone else in the process, its
 * choice stands. OpenBLAS runs single-threaded: ctorch's pool splits the GEMMs. So that its
 * constructor starts no thread pool either, OPENBLAS_NUM_THREADS is set to 1 when unset: the
 * pool's idle threads spin, and under qemu-user (the AArch64 tests) they starved the loading
 * thread so that dlopen() did not return (seen with Debian's arm64 OpenBLAS 0.3.21).
 * CTORCH_BLAS names another CBLAS library to load instead.
 */
#include "ops/blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum { CB_ROW_MAJOR = 101, CB_NO_TRANS = 111, CB_TRANS = 112 };
typedef void (*cblas_sgemm_t)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                              float *, int);

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static cblas_sgemm_t blas_sgemm;
static char blas_error[256];

static void pick_coretype(void)
{
    if (getenv("OPENBLAS_CORETYPE")) return;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const char *core = NULL;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        core = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        core = "Haswell";
    if (core) setenv("OPENBLAS_CORETYPE", core, 0);
#endif
}

static void blas_load(void)
{
    pick_coretype();
    if (!getenv("OPENBLAS_NUM_THREADS")) setenv("OPENBLAS_NUM_THREADS", "1", 0);
    const char *names[] = {getenv("CTORCH_BLAS"), "libopenblas.so.0", "libopenblas.so", "libcblas.so.3", "libblas.so.3"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!names[i] || !names[i][0]) continue;
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        cblas_sgemm_t f = (cblas_sgemm_t)dlsym(h, "cblas_sgemm");
        if (!f) {
            dlclose(h);
            continue;
        }
        void (*threads)(int) = (void (*)(int))dlsym(h, "openblas_set_num_threads");
        if (threads) threads(1);
        blas_sgemm = f;
        return;
    }
    snprintf(blas_error, sizeof blas_error,
             "no CBLAS library could be loaded (tried $CTORCH_BLAS, libopenblas.so.0, libopenblas.so, "
             "libcblas.so.3, libblas.so.3): install libopenblas0");
}

static void sgemm_rowmajor(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc)
{
    blas_sgemm(CB_ROW_MAJOR, ta ? CB_TRANS : CB_NO_TRANS, tb ? CB_TRANS : CB_NO_TRANS, M, N, K, alpha, A, lda, B,
               ldb, beta, C, ldc);
}

ct_status ct_blas_sgemm(ct_sgemm_fn *out)
{
    pthread_once(&blas_once, blas_load);
    if (!blas_sgemm) return ct_error(CT_EUNSUPPORTED, "ct_gemm_f32: %s", blas_error);
    *out = sgemm_rowmajor;
    return CT_OK;
}
