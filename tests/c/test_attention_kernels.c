/* The AVX-512 tile product gives the same bits as the AVX2 one (and both match a double
 * reference), for every edge shape of the 6x16 / 8x32 blocking, strided A, and accumulate. */
#include "test_util.h"
#include "attention/attn_kernels.h"
#include "core/internal.h"

int main(void)
{
#if !defined(__x86_64__)
    printf("test_attention_kernels: SKIPPED the AVX-512 tile product: not an x86-64 build (%s); "
           "test_kernels_isa compares this CPU's tables with scalar\n", ct_cpu_name());
    return t_report("test_attention_kernels");
#else
    if (!ct_cpu_has_isa(CT_ISA_AVX512)) {
        printf("test_attention_kernels: SKIPPED the AVX-512 tile product: %s lacks avx512 "
               "(F+BW+DQ+VL); the scalar and AVX2 paths are covered by test_attention_flex\n",
               ct_cpu_name());
        return t_report("test_attention_kernels");
    }
    int64_t Ms[] = {1, 5, 6, 7, 8, 9, 17}, Ns[] = {1, 8, 15, 16, 17, 31, 32, 33, 70}, Ks[] = {1, 3, 64};
    for (size_t a = 0; a < 7; a++)
        for (size_t b = 0; b < 9; b++)
            for (size_t k = 0; k < 3; k++)
                for (int acc = 0; acc < 3; acc++) {
                    int64_t M = Ms[a], N = Ns[b], K = Ks[k], ldb = N + 3, ldc = N + 5;
                    float *A = malloc(4 * (size_t)(M * K * 2)), *B = malloc(4 * (size_t)(K * ldb));
                    float *C1 = malloc(4 * (size_t)(M * ldc)), *C2 = malloc(4 * (size_t)(M * ldc));
                    float rs[17];
                    t_fill(A, (size_t)(M * K * 2), -1, 1);
                    t_fill(B, (size_t)(K * ldb), -1, 1);
                    t_fill(C1, (size_t)(M * ldc), -1, 1);
                    t_fill(rs, 17, 0.5f, 1.5f);
                    memcpy(C2, C1, 4 * (size_t)(M * ldc));
                    /* A read transposed with a stride: element (i, k) at A[i + k * 2M] */
                    at_gemm_avx2(M, N, K, A, 1, 2 * M, B, ldb, C1, ldc, acc > 0, acc == 2 ? rs : NULL);
                    at_gemm_avx512(M, N, K, A, 1, 2 * M, B, ldb, C2, ldc, acc > 0, acc == 2 ? rs : NULL);
                    CHECK(!memcmp(C1, C2, 4 * (size_t)(M * ldc)));
                    free(A), free(B), free(C1), free(C2);
                }
    return t_report("test_attention_kernels");
#endif
}
