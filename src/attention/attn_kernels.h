/* Tile kernels of the attention module. Score tiles are key-major: element (query i, key j)
 * of a tile lives at S[j * ld + i], so column-wise softmax statistics (per query) vectorise
 * across queries. Every kernel is a pure function of its inputs (the result of an element
 * never depends on how work is split), which keeps attention deterministic. Layout: the
 * entry points below (attn_kernels.c) call the active instruction set's ct_attn_kernels
 * table; bodies in attn_kernels_scalar.c, attn_kernels_avx2.c, attn_kernels_avx512.c (the
 * tile product, dsoftmax and apply_keep; the rest of the avx512 table is the AVX2 bodies). */
#ifndef CT_ATTENTION_KERNELS_H
#define CT_ATTENTION_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/internal.h"

/* C[M, N] = A[M, K] B[K, N] (+ C when acc; + rs[i] * C when acc and rs != NULL), where
 * A[i, k] = A[i * ars + k * acs] and B is row-major with row stride ldb. */
void at_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
             const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs);

/* Online softmax over the rows j < nk of a key-major tile, columns i < ncols (multiple of 8):
 * m[i] becomes max(m[i], max_j S), alpha[i] = exp(m_old - m_new) (0 when m_old = -inf),
 * S[j][i] = exp(S - m_new) (m_new = -inf counts as 0), l[i] = l[i] * alpha[i] + sum_j S. */
void at_softmax_update(float *S, int64_t nk, int64_t ld, int64_t ncols, float *m, float *l,
                       float *alpha);

/* S[j][i] = exp(S[j][i] - lse[i]) for j < nk, i < ncols (multiple of 8). */
void at_exp_sub(float *S, int64_t nk, int64_t ld, int64_t ncols, const float *lse);

/* dP[j][i] = P[j][i] * (dP[j][i] - D[i]) for j < nk, i < ncols (multiple of 8). */
void at_dsoftmax(const float *P, float *dP, int64_t nk, int64_t ld, int64_t ncols, const float *D);

/* S[j][i] = -inf where keep[j * kld + i] == 0, for j < nk, i < nq. */
void at_apply_keep(float *S, int64_t ld, const uint8_t *keep, int64_t kld, int64_t nk, int64_t nq);

/* dst[e * ldd + i] = mult * src[i * lds + e] for i < n, e < width; columns n <= i < ncols
 * of dst are zeroed (the transposed, scaled, padded operand of a tile product). */
void at_pack_t(const float *src, int64_t lds, int64_t n, int64_t width, float mult, float *dst,
               int64_t ldd, int64_t ncols);

/* x[i] = cap * tanh(x[i] / cap) over n contiguous values. */
void at_softcap_fwd(float *x, int64_t n, float cap);
/* g[i] *= 1 - tanh(s[i] / cap)^2 over n contiguous values. */
void at_softcap_bwd(const float *s, float *g, int64_t n, float cap);

typedef struct ct_attn_kernels {
    void (*gemm)(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
                 const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs);
    void (*softmax_update)(float *S, int64_t nk, int64_t ld, int64_t ncols, float *m, float *l,
                           float *alpha);
    void (*exp_sub)(float *S, int64_t nk, int64_t ld, int64_t ncols, const float *lse);
    void (*dsoftmax)(const float *P, float *dP, int64_t nk, int64_t ld, int64_t ncols, const float *D);
    void (*apply_keep)(float *S, int64_t ld, const uint8_t *keep, int64_t kld, int64_t nk, int64_t nq);
    void (*pack_t)(const float *src, int64_t lds, int64_t n, int64_t width, float mult, float *dst,
                   int64_t ldd, int64_t ncols);
    void (*softcap_fwd)(float *x, int64_t n, float cap);
    void (*softcap_bwd)(const float *s, float *g, int64_t n, float cap);
} ct_attn_kernels;

extern const ct_attn_kernels ct_attn_scalar; /* attn_kernels_scalar.c */
/* One entry per ct_isa (attn_kernels.c). */
extern const ct_attn_kernels *const ct_attn_tables[CT_ISA_COUNT];

#if defined(__x86_64__)
/* AVX-512 (F+BW+DQ+VL) bodies, bitwise equal to the AVX2 ones (attn_kernels_avx512.c). */
void at_gemm_avx512(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
                    const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs);
void at_dsoftmax_avx512(const float *P, float *dP, int64_t nk, int64_t ld, int64_t ncols,
                        const float *D);
void at_apply_keep_avx512(float *S, int64_t ld, const uint8_t *keep, int64_t kld, int64_t nk,
                          int64_t nq);
void at_softmax_update_avx512(float *S, int64_t nk, int64_t ld, int64_t ncols, float *m, float *l,
                              float *alpha);
void at_exp_sub_avx512(float *S, int64_t nk, int64_t ld, int64_t ncols, const float *lse);
void at_softcap_fwd_avx512(float *x, int64_t n, float cap);
void at_softcap_bwd_avx512(const float *s, float *g, int64_t n, float cap);

/* AVX2 bodies. */
void at_gemm_avx2(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
                  const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs);
void at_softmax_update_avx2(float *S, int64_t nk, int64_t ld, int64_t ncols, float *m, float *l,
                            float *alpha);
void at_exp_sub_avx2(float *S, int64_t nk, int64_t ld, int64_t ncols, const float *lse);
void at_dsoftmax_avx2(const float *P, float *dP, int64_t nk, int64_t ld, int64_t ncols,
                      const float *D);
void at_apply_keep_avx2(float *S, int64_t ld, const uint8_t *keep, int64_t kld, int64_t nk,
                        int64_t nq);
void at_pack_t_avx2(const float *src, int64_t lds, int64_t n, int64_t width, float mult, float *dst,
                    int64_t ldd, int64_t ncols);
void at_softcap_fwd_avx2(float *x, int64_t n, float cap);
void at_softcap_bwd_avx2(const float *s, float *g, int64_t n, float cap);
#endif

#if defined(__aarch64__)
extern const ct_attn_kernels ct_attn_neon; /* attn_kernels_neon.c: bitwise the AVX2 bodies */
extern const ct_attn_kernels ct_attn_sve;  /* attn_kernels_sve.c: vector-length agnostic */
#endif

#endif
