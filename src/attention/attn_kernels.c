/* Attention tile kernels: the per-ISA tables and the entry points of attn_kernels.h. */
#include "attention/attn_kernels.h"

#if defined(__x86_64__)
static const ct_attn_kernels attn_avx2 = {at_gemm_avx2,      at_softmax_update_avx2, at_exp_sub_avx2,
                                          at_dsoftmax_avx2,  at_apply_keep_avx2,     at_pack_t_avx2,
                                          at_softcap_fwd_avx2, at_softcap_bwd_avx2};
static const ct_attn_kernels attn_avx512 = {
    at_gemm_avx512,       at_softmax_update_avx512, at_exp_sub_avx512,     at_dsoftmax_avx512,
    at_apply_keep_avx512, at_pack_t_avx2,           at_softcap_fwd_avx512, at_softcap_bwd_avx512};
#define ATTN_AVX2 &attn_avx2
#define ATTN_AVX512 &attn_avx512
#else
#define ATTN_AVX2 &ct_attn_scalar
#define ATTN_AVX512 &ct_attn_scalar
#endif

#if defined(__aarch64__)
#define ATTN_NEON &ct_attn_neon
#define ATTN_SVE &ct_attn_sve
#else
#define ATTN_NEON &ct_attn_scalar
#define ATTN_SVE &ct_attn_scalar
#endif

const ct_attn_kernels *const ct_attn_tables[CT_ISA_COUNT] = {
    [CT_ISA_SCALAR] = &ct_attn_scalar, [CT_ISA_AVX2] = ATTN_AVX2, [CT_ISA_AVX512] = ATTN_AVX512,
    [CT_ISA_NEON] = ATTN_NEON,         [CT_ISA_SVE] = ATTN_SVE,
};

void at_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
             const float *B, int64_t ldb, float *C, int64_t ldc, bool acc, const float *rs)
{
    CT_KERNELS(ct_attn_tables)->gemm(M, N, K, A, ars, acs, B, ldb, C, ldc, acc, rs);
}
void at_softmax_update(float *S, int64_t nk, int64_t ld, int64_t ncols, float *m, float *l,
                       float *alpha)
{
    CT_KERNELS(ct_attn_tables)->softmax_update(S, nk, ld, ncols, m, l, alpha);
}
void at_exp_sub(float *S, int64_t nk, int64_t ld, int64_t ncols, const float *lse)
{
    CT_KERNELS(ct_attn_tables)->exp_sub(S, nk, ld, ncols, lse);
}
void at_dsoftmax(const float *P, float *dP, int64_t nk, int64_t ld, int64_t ncols, const float *D)
{
    CT_KERNELS(ct_attn_tables)->dsoftmax(P, dP, nk, ld, ncols, D);
}
void at_apply_keep(float *S, int64_t ld, const uint8_t *keep, int64_t kld, int64_t nk, int64_t nq)
{
    CT_KERNELS(ct_attn_tables)->apply_keep(S, ld, keep, kld, nk, nq);
}
void at_pack_t(const float *src, int64_t lds, int64_t n, int64_t width, float mult, float *dst,
               int64_t ldd, int64_t ncols)
{
    CT_KERNELS(ct_attn_tables)->pack_t(src, lds, n, width, mult, dst, ldd, ncols);
}
void at_softcap_fwd(float *x, int64_t n, float cap) { CT_KERNELS(ct_attn_tables)->softcap_fwd(x, n, cap); }
void at_softcap_bwd(const float *s, float *g, int64_t n, float cap)
{
    CT_KERNELS(ct_attn_tables)->softcap_bwd(s, g, n, cap);
}
