/* The vector tile products give the same bits as each other (AVX-512 = AVX2 on x86-64,
 * SVE = NEON on AArch64: one FMA chain per element in ascending k) and match the scalar
 * one within rounding, for every edge shape of the blockings (M, N, K odd and past the
 * row / column blocks), A transposed or row-major with a stride, B with a padded or a
 * power-of-two row stride (the AVX-512 body packs B panels for the latter), and accumulate
 * (with and without the row scale); dsoftmax and apply_keep give the scalar bits. */
#include "test_util.h"
#include "attention/attn_kernels.h"
#include "core/internal.h"

#include <math.h>

int main(void)
{
    ct_isa vec[CT_ISA_COUNT];
    int nvec = 0;
    for (int i = 1; i < CT_ISA_COUNT; i++) {
        ct_isa isa = (ct_isa)i;
        if (!ct_cpu_has_isa(isa)) {
            printf("test_attention_kernels: %s SKIPPED: %s lacks it\n", ct_isa_name(isa), ct_cpu_name());
            continue;
        }
        vec[nvec++] = isa;
    }
    if (!nvec) printf("test_attention_kernels: no vector ISA on %s: only scalar runs\n", ct_cpu_name());
    int64_t Ms[] = {1, 3, 5, 6, 7, 8, 9, 15, 16, 17, 33, 64, 65};
    int64_t Ns[] = {1, 3, 8, 15, 16, 17, 31, 32, 33, 48, 64, 70};
    int64_t Ks[] = {1, 3, 17, 64, 130, 520};
    enum { NM = sizeof Ms / sizeof Ms[0], NN = sizeof Ns / sizeof Ns[0], NK = sizeof Ks / sizeof Ks[0] };
    /* Layouts: 0 A read transposed with a stride (element (i, k) at A[i + k * 2M]) and B rows
     * N + 3 apart; 1 A row-major with a row stride (A[i * (K + 5) + k]) and B rows 1024 apart
     * (the power-of-two row stride for which the AVX-512 body packs B panels). Large K only
     * with a few shapes (K = 520 is past that body's packing limit of 256). */
    for (int lay = 0; lay < 2; lay++)
    for (size_t a = 0; a < NM; a++)
        for (size_t b = 0; b < NN; b++)
            for (size_t k = 0; k < NK; k++)
                for (int acc = 0; acc < 3; acc++) {
                    int64_t M = Ms[a], N = Ns[b], K = Ks[k];
                    if (K > 64 && (M % 8 == 0 || N % 16 == 0) && !(M == 65 && N == 70)) continue;
                    int64_t ldb = lay ? 1024 : N + 3, ldc = N + 5;
                    int64_t ars = lay ? K + 5 : 1, acs = lay ? 1 : 2 * M;
                    size_t na = (size_t)(lay ? M * (K + 5) : M * K * 2);
                    size_t nc = (size_t)(M * ldc);
                    float *A = malloc(4 * na), *B = malloc(4 * (size_t)(K * ldb));
                    float *C0 = malloc(4 * nc), *Cs = malloc(4 * nc), *Cv = malloc(4 * nc), *C1 = malloc(4 * nc);
                    float rs[65];
                    t_fill(A, na, -1, 1);
                    t_fill(B, (size_t)(K * ldb), -1, 1);
                    t_fill(C0, nc, -1, 1);
                    t_fill(rs, 65, 0.5f, 1.5f);
                    memcpy(Cs, C0, 4 * nc);
                    ct_attn_tables[CT_ISA_SCALAR]->gemm(M, N, K, A, ars, acs, B, ldb, Cs, ldc, acc > 0,
                                                        acc == 2 ? rs : NULL);
                    for (int v = 0; v < nvec; v++) {
                        float *C = v == 0 ? C1 : Cv;
                        memcpy(C, C0, 4 * nc);
                        ct_attn_tables[vec[v]]->gemm(M, N, K, A, ars, acs, B, ldb, C, ldc, acc > 0,
                                                     acc == 2 ? rs : NULL);
                        if (v > 0) CHECK(!memcmp(C1, Cv, 4 * nc));
                        if (v > 0 && memcmp(C1, Cv, 4 * nc)) {
                            fprintf(stderr, "  %s vs %s layout %d M=%lld N=%lld K=%lld acc=%d\n",
                                    ct_isa_name(vec[0]), ct_isa_name(vec[v]), lay, (long long)M,
                                    (long long)N, (long long)K, acc);
                        }
                        /* |error| <= (K + 2) u (sum |a b| + |c|) with |a|, |b|, |c|, rs <= 1.5 */
                        double tol = (double)(K + 2) * 6e-8 * (1.5 * (double)K + 2.5) * 2;
                        int bad = 0;
                        for (size_t e = 0; e < nc; e++)
                            if (!(fabs((double)C[e] - (double)Cs[e]) <= tol)) bad++;
                        CHECK(bad == 0);
                        if (bad) {
                            fprintf(stderr, "  %s: %d elements layout %d M=%lld N=%lld K=%lld acc=%d\n",
                                    ct_isa_name(vec[v]), bad, lay, (long long)M, (long long)N, (long long)K,
                                    acc);
                        }
                    }
                    free(A), free(B), free(C0), free(Cs), free(Cv), free(C1);
                }
    /* The element-wise tile passes are exact per element: every vector body gives the scalar
     * bits, for row counts, column counts past and short of the vector widths and keep
     * patterns with whole 16-byte groups kept. */
    int64_t nks[] = {1, 5, 64}, ncs[] = {8, 16, 24, 40, 128}, nqs[] = {1, 7, 15, 16, 17, 33, 127, 128};
    for (size_t a = 0; a < 3; a++) {
        int64_t nk = nks[a], ld = 136;
        size_t n = (size_t)(nk * ld);
        float *P = malloc(4 * n), *Q0 = malloc(4 * n), *Qs = malloc(4 * n), *Qv = malloc(4 * n), D[136];
        uint8_t *keep = malloc(n);
        t_fill(P, n, 0, 1);
        t_fill(Q0, n, -1, 1);
        t_fill(D, 136, -0.5f, 0.5f);
        for (size_t e = 0; e < n; e++)
            keep[e] = (uint8_t)((e / 16) % 3 == 0 ? 1 : (e * 2654435761u >> 7) % 3 != 0);
        for (size_t b = 0; b < sizeof ncs / sizeof ncs[0]; b++) {
            memcpy(Qs, Q0, 4 * n);
            ct_attn_tables[CT_ISA_SCALAR]->dsoftmax(P, Qs, nk, ld, ncs[b], D);
            for (int v = 0; v < nvec; v++) {
                memcpy(Qv, Q0, 4 * n);
                ct_attn_tables[vec[v]]->dsoftmax(P, Qv, nk, ld, ncs[b], D);
                CHECK(!memcmp(Qs, Qv, 4 * n));
            }
        }
        for (size_t b = 0; b < sizeof nqs / sizeof nqs[0]; b++) {
            memcpy(Qs, Q0, 4 * n);
            ct_attn_tables[CT_ISA_SCALAR]->apply_keep(Qs, ld, keep, ld - 3, nk, nqs[b]);
            for (int v = 0; v < nvec; v++) {
                memcpy(Qv, Q0, 4 * n);
                ct_attn_tables[vec[v]]->apply_keep(Qv, ld, keep, ld - 3, nk, nqs[b]);
                CHECK(!memcmp(Qs, Qv, 4 * n));
            }
        }
        /* the online softmax update and exp_sub: per column the same operations in avx2 and
         * avx512 (exp included), so the same bits, at column counts past and short of 16 */
        for (size_t b = 0; b < sizeof ncs / sizeof ncs[0]; b++)
            for (int v = 1; v < nvec; v++) {
                if (vec[0] != CT_ISA_AVX2 || vec[v] != CT_ISA_AVX512) continue;
                float m0[136], l0[136], al0[136], m1[136], l1[136], al1[136];
                for (int i = 0; i < 136; i++) m0[i] = m1[i] = i % 3 ? 0.25f : -INFINITY, l0[i] = l1[i] = 0.5f;
                memcpy(Qs, Q0, 4 * n), memcpy(Qv, Q0, 4 * n);
                ct_attn_tables[vec[0]]->softmax_update(Qs, nk, ld, ncs[b], m0, l0, al0);
                ct_attn_tables[vec[v]]->softmax_update(Qv, nk, ld, ncs[b], m1, l1, al1);
                size_t nc = (size_t)ncs[b];
                CHECK(!memcmp(Qs, Qv, 4 * n) && !memcmp(m0, m1, 4 * nc) && !memcmp(l0, l1, 4 * nc) &&
                      !memcmp(al0, al1, 4 * nc));
                memcpy(Qs, Q0, 4 * n), memcpy(Qv, Q0, 4 * n);
                ct_attn_tables[vec[0]]->exp_sub(Qs, nk, ld, ncs[b], D);
                ct_attn_tables[vec[v]]->exp_sub(Qv, nk, ld, ncs[b], D);
                CHECK(!memcmp(Qs, Qv, 4 * n));
            }
        free(P), free(Q0), free(Qs), free(Qv), free(keep);
    }
    /* soft-capping, forward and backward, every tail class of both widths */
    for (int v = 1; v < nvec; v++) {
        if (vec[0] != CT_ISA_AVX2 || vec[v] != CT_ISA_AVX512) continue;
        int64_t ns[] = {1, 7, 8, 9, 15, 16, 17, 33, 100};
        float x0[100], s0[100], s1[100], g0[100], g1[100];
        t_fill(x0, 100, -60, 60);
        for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
            memcpy(s0, x0, sizeof x0), memcpy(s1, x0, sizeof x0);
            ct_attn_tables[vec[0]]->softcap_fwd(s0, ns[t], 30.0f);
            ct_attn_tables[vec[v]]->softcap_fwd(s1, ns[t], 30.0f);
            CHECK(!memcmp(s0, s1, sizeof s0));
            t_fill(g0, 100, -1, 1);
            memcpy(g1, g0, sizeof g0);
            ct_attn_tables[vec[0]]->softcap_bwd(x0, g0, ns[t], 30.0f);
            ct_attn_tables[vec[v]]->softcap_bwd(x0, g1, ns[t], 30.0f);
            CHECK(!memcmp(g0, g1, sizeof g0));
        }
    }
    return t_report("test_attention_kernels");
}
