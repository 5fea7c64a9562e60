/* Gather / scatter / scatter-add along the last dim. Every index is checked before
 * anything is written, so a bad index leaves the output untouched. Rows are split across
 * threads and each row is handled by one thread in increasing k, which is what makes the
 * "last k wins" of scatter and the summation order of scatter-add deterministic. */
#include "core/internal.h"
#include "ctorch/ops.h"

enum { OP_GATHER, OP_SCATTER, OP_SCATTER_ADD };

static ct_status gs_check(const char *fn, const float *out, const float *in, const char *in_name,
                          const int64_t *index, int64_t N, int64_t C, int64_t K)
{
    if (N < 0) return ct_error(CT_EINVAL, "%s: N must be >= 0, got %lld", fn, (long long)N);
    if (C < 0) return ct_error(CT_EINVAL, "%s: C must be >= 0, got %lld", fn, (long long)C);
    if (K < 0) return ct_error(CT_EINVAL, "%s: K must be >= 0, got %lld", fn, (long long)K);
    size_t bytes;
    if (!ct_mul_size((size_t)N, (size_t)C, &bytes) || !ct_mul_size((size_t)N, (size_t)K, &bytes))
        return ct_error(CT_EOVERFLOW, "%s: N * C or N * K overflows", fn);
    if (N == 0 || K == 0) return CT_OK;
    if (!index) return ct_error(CT_EINVAL, "%s: index must not be NULL", fn);
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    if (!in) return ct_error(CT_EINVAL, "%s: %s must not be NULL", fn, in_name);
    for (int64_t n = 0; n < N; n++) {
        const int64_t *ix = index + n * K;
        for (int64_t k = 0; k < K; k++)
            if (ix[k] < 0 || ix[k] >= C)
                return ct_error(CT_EINVAL, "%s: index[%lld, %lld] = %lld is outside [0, C = %lld)",
                                fn, (long long)n, (long long)k, (long long)ix[k], (long long)C);
    }
    return CT_OK;
}

typedef struct {
    float *out;
    const float *in;
    const int64_t *index;
    int64_t C, K;
    int op;
} gs_ctx;

static void gs_rows(void *p, int64_t r0, int64_t r1, int tid)
{
    gs_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t *ix = c->index + r * c->K;
        if (c->op == OP_GATHER) {
            const float *x = c->in + r * c->C;
            float *y = c->out + r * c->K;
            for (int64_t k = 0; k < c->K; k++)
                y[k] = x[ix[k]];
        } else if (c->op == OP_SCATTER) {
            const float *s = c->in + r * c->K;
            float *y = c->out + r * c->C;
            for (int64_t k = 0; k < c->K; k++)
                y[ix[k]] = s[k];
        } else {
            const float *s = c->in + r * c->K;
            float *y = c->out + r * c->C;
            for (int64_t k = 0; k < c->K; k++)
                y[ix[k]] += s[k];
        }
    }
}

static ct_status gs_run(const char *fn, int op, float *out, const float *in, const char *in_name,
                        const int64_t *index, int64_t N, int64_t C, int64_t K)
{
    CT_TRY(gs_check(fn, out, in, in_name, index, N, C, K));
    gs_ctx c = {out, in, index, C, K, op};
    ct_parallel_for(K ? N : 0, gs_rows, &c);
    return CT_OK;
}

ct_status ct_gather_rows(float *out, const float *inp, const int64_t *index, int64_t N, int64_t C,
                         int64_t K)
{
    return gs_run("ct_gather_rows", OP_GATHER, out, inp, "inp", index, N, C, K);
}

ct_status ct_scatter_rows(float *out, const float *src, const int64_t *index, int64_t N, int64_t C,
                          int64_t K)
{
    return gs_run("ct_scatter_rows", OP_SCATTER, out, src, "src", index, N, C, K);
}

ct_status ct_scatter_add_rows(float *out, const float *src, const int64_t *index, int64_t N,
                              int64_t C, int64_t K)
{
    return gs_run("ct_scatter_add_rows", OP_SCATTER_ADD, out, src, "src", index, N, C, K);
}
