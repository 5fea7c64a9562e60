/* The BLAS underneath ctorch's GEMM, loaded at first use. */
#ifndef CT_OPS_BLAS_H
#define CT_OPS_BLAS_H

#include "core/internal.h"

/* Row-major single-threaded sgemm: C = alpha op(A) op(B) + beta C (sizes fit in int). */
typedef void (*ct_sgemm_fn)(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                            const float *B, int ldb, float beta, float *C, int ldc);

/* The loaded sgemm, or CT_EUNSUPPORTED with a message when no CBLAS library was found. */
ct_status ct_blas_sgemm(ct_sgemm_fn *out);

#endif
