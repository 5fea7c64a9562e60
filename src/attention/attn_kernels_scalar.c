/* Scalar tile kernels (see attn_kernels.h): the plain loops the SIMD bodies are tested against. */
#include "attention/attn_kernels.h"

#include <math.h>

static void at_gemm_scalar(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
             const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs)
{
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

static void at_softmax_update_scalar(float *S, int64_t nk, int64_t ld, int64_t ncols, float *m, float *l,
                       float *alpha)
{
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

static void at_exp_sub_scalar(float *S, int64_t nk, int64_t ld, int64_t ncols, const float *lse)
{
    for (int64_t j = 0; j < nk; j++)
        for (int64_t i = 0; i < ncols; i++)
            S[j * ld + i] = expf(S[j * ld + i] - lse[i]);
}

static void at_dsoftmax_scalar(const float *P, float *dP, int64_t nk, int64_t ld, int64_t ncols, const float *D)
{
    for (int64_t j = 0; j < nk; j++)
        for (int64_t i = 0; i < ncols; i++)
            dP[j * ld + i] = P[j * ld + i] * (dP[j * ld + i] - D[i]);
}

static void at_apply_keep_scalar(float *S, int64_t ld, const uint8_t *keep, int64_t kld, int64_t nk, int64_t nq)
{
    for (int64_t j = 0; j < nk; j++)
        for (int64_t i = 0; i < nq; i++)
            if (!keep[j * kld + i]) S[j * ld + i] = -INFINITY;
}

static void at_pack_t_scalar(const float *src, int64_t lds, int64_t n, int64_t width, float mult, float *dst,
               int64_t ldd, int64_t ncols)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < width; e++)
            dst[e * ldd + i] = mult * src[i * lds + e];
    for (int64_t e = 0; e < width; e++)
        for (int64_t i = n; i < ncols; i++)
            dst[e * ldd + i] = 0.0f;
}

static void at_softcap_fwd_scalar(float *x, int64_t n, float cap)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = cap * tanhf(x[i] / cap);
}

static void at_softcap_bwd_scalar(const float *s, float *g, int64_t n, float cap)
{
    for (int64_t i = 0; i < n; i++) {
        float t = tanhf(s[i] / cap);
        g[i] *= 1.0f - t * t;
    }
}

const ct_attn_kernels ct_attn_scalar = {at_gemm_scalar,      at_softmax_update_scalar, at_exp_sub_scalar,
                                        at_dsoftmax_scalar,  at_apply_keep_scalar,     at_pack_t_scalar,
                                        at_softcap_fwd_scalar, at_softcap_bwd_scalar};
