/* Scalar tile kernels and the AVX2 dispatch (see attn_kernels.h). */
#include "attention/attn_kernels.h"
#include "core/internal.h"

#include <math.h>

void at_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
             const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs)
{
    if (ct_use_avx2()) {
#if defined(__x86_64__) && defined(CT_HAVE_AVX512_KERNELS)
        if (ct_cpu_has_avx512f()) {
            at_gemm_avx512(M, N, K, A, ars, acs, B, ldb, C, ldc, acc, rs);
            return;
        }
#endif
        at_gemm_avx2(M, N, K, A, ars, acs, B, ldb, C, ldc, acc, rs);
        return;
    }
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        float s0 = acc ? (rs ? rs[i] : 1.0f) : 0.0f;
        for (int64_t j = 0; j < N; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++)
                s += A[i * ars + k * acs] * B[k * ldb + j];
            c[j] = acc ? s + s0 * c[j] : s;
        }
    }
}

void at_softmax_update(float *S, int64_t nk, int64_t ld, int64_t ncols, float *m, float *l,
                       float *alpha)
{
    if (ct_use_avx2()) {
        at_softmax_update_avx2(S, nk, ld, ncols, m, l, alpha);
        return;
    }
    for (int64_t i = 0; i < ncols; i++) {
        float mx = m[i];
        for (int64_t j = 0; j < nk; j++)
            mx = fmaxf(mx, S[j * ld + i]);
        float use = mx == -INFINITY ? 0.0f : mx;
        float a = expf(m[i] - use), sum = 0.0f;
        for (int64_t j = 0; j < nk; j++) {
            float p = expf(S[j * ld + i] - use);
            S[j * ld + i] = p;
            sum += p;
        }
        l[i] = l[i] * a + sum;
        m[i] = mx;
        alpha[i] = a;
    }
}

void at_exp_sub(float *S, int64_t nk, int64_t ld, int64_t ncols, const float *lse)
{
    if (ct_use_avx2()) {
        at_exp_sub_avx2(S, nk, ld, ncols, lse);
        return;
    }
    for (int64_t j = 0; j < nk; j++)
        for (int64_t i = 0; i < ncols; i++)
            S[j * ld + i] = expf(S[j * ld + i] - lse[i]);
}

void at_dsoftmax(const float *P, float *dP, int64_t nk, int64_t ld, int64_t ncols, const float *D)
{
    if (ct_use_avx2()) {
        at_dsoftmax_avx2(P, dP, nk, ld, ncols, D);
        return;
    }
    for (int64_t j = 0; j < nk; j++)
        for (int64_t i = 0; i < ncols; i++)
            dP[j * ld + i] = P[j * ld + i] * (dP[j * ld + i] - D[i]);
}

void at_apply_keep(float *S, int64_t ld, const uint8_t *keep, int64_t kld, int64_t nk, int64_t nq)
{
    if (ct_use_avx2()) {
        at_apply_keep_avx2(S, ld, keep, kld, nk, nq);
        return;
    }
    for (int64_t j = 0; j < nk; j++)
        for (int64_t i = 0; i < nq; i++)
            if (!keep[j * kld + i]) S[j * ld + i] = -INFINITY;
}

void at_pack_t(const float *src, int64_t lds, int64_t n, int64_t width, float mult, float *dst,
               int64_t ldd, int64_t ncols)
{
    if (ct_use_avx2()) {
        at_pack_t_avx2(src, lds, n, width, mult, dst, ldd, ncols);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < width; e++)
            dst[e * ldd + i] = mult * src[i * lds + e];
    for (int64_t e = 0; e < width; e++)
        for (int64_t i = n; i < ncols; i++)
            dst[e * ldd + i] = 0.0f;
}

void at_softcap_fwd(float *x, int64_t n, float cap)
{
    if (ct_use_avx2()) {
        at_softcap_fwd_avx2(x, n, cap);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        x[i] = cap * tanhf(x[i] / cap);
}

void at_softcap_bwd(const float *s, float *g, int64_t n, float cap)
{
    if (ct_use_avx2()) {
        at_softcap_bwd_avx2(s, g, n, cap);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float t = tanhf(s[i] / cap);
        g[i] *= 1.0f - t * t;
    }
}
