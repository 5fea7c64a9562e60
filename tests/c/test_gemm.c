/* GEMM: every layout (tile grid, K split, tiny) and transpose against a double reference,
 * strided operands, beta handling, bf16, same bits for 1 and 2 threads, bad arguments. */
#include "test_util.h"

static void ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++)
                s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            C[i * ldc + j] = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * C[i * ldc + j]));
        }
}

static void one(int64_t M, int64_t N, int64_t K, bool ta, bool tb, float beta)
{
    int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
    size_t na = (size_t)((ta ? K : M) * lda), nb = (size_t)((tb ? N : K) * ldb), nc = (size_t)(M * ldc);
    float *A = malloc(4 * na + 4), *B = malloc(4 * nb + 4), *C = malloc(4 * nc + 4), *R = malloc(4 * nc + 4);
    float *C2 = malloc(4 * nc + 4);
    t_fill(A, na, -1, 1);
    t_fill(B, nb, -1, 1);
    t_fill(C, nc, -1, 1);
    memcpy(R, C, 4 * nc);
    memcpy(C2, C, 4 * nc);
    if (beta == 0.0f)
        for (size_t i = 0; i < nc; i++) C[i] = C2[i] = NAN; /* beta 0 must not read C */
    CHECK_OK(ct_set_num_threads(1));
    CHECK_OK(ct_gemm_f32(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C, ldc));
    CHECK_OK(ct_set_num_threads(2));
    CHECK_OK(ct_gemm_f32(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C2, ldc));
    ref(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, R, ldc);
    int ok = 1;
    for (int64_t i = 0; i < M; i++) {
        if (memcmp(C + i * ldc, C2 + i * ldc, 4 * (size_t)N)) ok = 0;
        if (!t_close(C + i * ldc, R + i * ldc, (size_t)N, 1e-4, 1e-4, "gemm")) ok = 0;
    }
    if (!ok) fprintf(stderr, "  M=%lld N=%lld K=%lld ta=%d tb=%d beta=%g\n", (long long)M, (long long)N,
                     (long long)K, ta, tb, beta);
    CHECK(ok);
    free(A), free(B), free(C), free(R), free(C2);
}

int main(void)
{
    int64_t shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {600, 530, 70}, {70, 1100, 40}, {130, 96, 4500},
                           {40, 33, 2100}, {3, 600, 1}, {513, 2, 9}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            one(shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, t == 2 ? 0.0f : 0.25f);
    /* K = 0: C = beta C */
    float c[4] = {1, 2, 3, 4};
    CHECK_OK(ct_gemm_f32(false, false, 2, 2, 0, 1.0f, NULL, 0, NULL, 0, 2.0f, c, 0));
    CHECK(c[0] == 2 && c[3] == 8);
    /* bf16 operands equal the f32 product of the rounded values */
    float a[6 * 5], b[5 * 4], r1[24], r2[24];
    uint16_t ab[30], bb[20];
    t_fill(a, 30, -1, 1);
    t_fill(b, 20, -1, 1);
    ct_convert_f32_to_bf16(ab, a, 30);
    ct_convert_f32_to_bf16(bb, b, 20);
    ct_convert_bf16_to_f32(a, ab, 30);
    ct_convert_bf16_to_f32(b, bb, 20);
    CHECK_OK(ct_gemm_f32(false, true, 6, 4, 5, 1.0f, a, 5, b, 5, 0.0f, r1, 4));
    CHECK_OK(ct_gemm_bf16(false, true, 6, 4, 5, 1.0f, ab, 5, bb, 5, 0.0f, r2, 4));
    CHECK(t_close(r2, r1, 24, 1e-6, 1e-6, "bf16 gemm"));
    CHECK_OK(ct_gemm_bf16(true, false, 6, 4, 5, 1.0f, ab, 6, bb, 4, 0.0f, r2, 4));
    ref(true, false, 6, 4, 5, 1.0f, a, 6, b, 4, 0.0f, r1, 4);
    CHECK(t_close(r2, r1, 24, 1e-5, 1e-5, "bf16 gemm ta"));
    /* bad arguments */
    CHECK_STATUS(ct_gemm_f32(false, false, -1, 2, 2, 1.0f, a, 0, b, 0, 0.0f, r1, 0), CT_EINVAL);
    CHECK_STATUS(ct_gemm_f32(false, false, 2, 2, 2, 1.0f, NULL, 0, b, 0, 0.0f, r1, 0), CT_EINVAL);
    CHECK_STATUS(ct_gemm_f32(false, false, (int64_t)1 << 33, 2, 2, 1.0f, a, 0, b, 0, 0.0f, r1, 0), CT_EINVAL);
    CHECK_STATUS(ct_linear_forward(NULL, a, b, NULL, 2, 2, 2), CT_EINVAL);
    return t_report("test_gemm");
}
