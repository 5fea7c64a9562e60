/* softmax, log_softmax, logsumexp and the two backwards over the rows of [N, C] f32 arrays:
 * argument checks and threading (rows split across threads; each row is a pure function of
 * its inputs, so the bits never depend on the thread count). The row bodies are the
 * softmax kernel table of softmax_kernels.h (softmax_scalar.c, softmax_avx2.c). */
#include "core/internal.h"
#include "ctorch/ops.h"
#include "ops/softmax_kernels.h"

#if defined(__x86_64__)
#define SOFTMAX_AVX2 &ct_softmax_avx2
#define SOFTMAX_AVX512 &ct_softmax_avx512
#else
#define SOFTMAX_AVX2 &ct_softmax_portable
#define SOFTMAX_AVX512 &ct_softmax_portable
#endif

#if defined(__aarch64__)
#define SOFTMAX_NEON &ct_softmax_neon
#define SOFTMAX_SVE &ct_softmax_sve
#else
#define SOFTMAX_NEON &ct_softmax_portable
#define SOFTMAX_SVE &ct_softmax_portable
#endif

/* neon/sve have their own bodies on AArch64 (softmax_neon.c, softmax_sve.c), the portable C
 * elsewhere. */
const ct_softmax_kernels *const ct_softmax_tables[CT_ISA_COUNT] = {
    [CT_ISA_SCALAR] = &ct_softmax_scalar,  [CT_ISA_AVX2] = SOFTMAX_AVX2,
    [CT_ISA_AVX512] = SOFTMAX_AVX512,       [CT_ISA_NEON] = SOFTMAX_NEON,
    [CT_ISA_SVE] = SOFTMAX_SVE,
};

typedef struct {
    float *out;
    const float *a, *b;
    int64_t C;
} rows_ctx;

static ct_status rows_check(const char *fn, const void *o, const void *i, int64_t N, int64_t C)
{
    if (N < 0 || C < 0) return ct_error(CT_EINVAL, "%s: N and C must be >= 0", fn);
    if (N && C && (!o || !i)) return ct_error(CT_EINVAL, "%s: pointers must not be NULL", fn);
    return CT_OK;
}

static void softmax_body(void *p, int64_t r0, int64_t r1, int tid)
{
    rows_ctx *c = p;
    CT_KERNELS(ct_softmax_tables)->softmax_rows(c->out, c->a, r0, r1, c->C);
}

ct_status ct_softmax_forward(float *out, const float *inp, int64_t N, int64_t C)
{
    CT_TRY(rows_check("ct_softmax_forward", out, inp, N, C));
    rows_ctx c = {out, inp, NULL, C};
    ct_parallel_for(C ? N : 0, softmax_body, &c);
    return CT_OK;
}

static void log_softmax_body(void *p, int64_t r0, int64_t r1, int tid)
{
    rows_ctx *c = p;
    CT_KERNELS(ct_softmax_tables)->log_softmax_rows(c->out, c->a, r0, r1, c->C);
}

ct_status ct_log_softmax_forward(float *out, const float *inp, int64_t N, int64_t C)
{
    CT_TRY(rows_check("ct_log_softmax_forward", out, inp, N, C));
    rows_ctx c = {out, inp, NULL, C};
    ct_parallel_for(C ? N : 0, log_softmax_body, &c);
    return CT_OK;
}

static void lse_body(void *p, int64_t r0, int64_t r1, int tid)
{
    rows_ctx *c = p;
    CT_KERNELS(ct_softmax_tables)->logsumexp_rows(c->out, c->a, r0, r1, c->C);
}

ct_status ct_logsumexp_rows(float *lse, const float *inp, int64_t N, int64_t C)
{
    CT_TRY(rows_check("ct_logsumexp_rows", lse, inp, N, C));
    rows_ctx c = {lse, inp, NULL, C};
    ct_parallel_for(N, lse_body, &c); /* C == 0: every row gives -inf */
    return CT_OK;
}

static void softmax_bwd_body(void *p, int64_t r0, int64_t r1, int tid)
{
    rows_ctx *c = p; /* a = dout, b = out */
    CT_KERNELS(ct_softmax_tables)->softmax_backward_rows(c->out, c->a, c->b, r0, r1, c->C);
}

ct_status ct_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N, int64_t C)
{
    CT_TRY(rows_check("ct_softmax_backward", dinp, dout, N, C));
    if (N && C && !out) return ct_error(CT_EINVAL, "ct_softmax_backward: out must not be NULL");
    rows_ctx c = {dinp, dout, out, C};
    ct_parallel_for(C ? N : 0, softmax_bwd_body, &c);
    return CT_OK;
}

static void log_softmax_bwd_body(void *p, int64_t r0, int64_t r1, int tid)
{
    rows_ctx *c = p; /* a = dout, b = out */
    CT_KERNELS(ct_softmax_tables)->log_softmax_backward_rows(c->out, c->a, c->b, r0, r1, c->C);
}

ct_status ct_log_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N, int64_t C)
{
    CT_TRY(rows_check("ct_log_softmax_backward", dinp, dout, N, C));
    if (N && C && !out) return ct_error(CT_EINVAL, "ct_log_softmax_backward: out must not be NULL");
    rows_ctx c = {dinp, dout, out, C};
    ct_parallel_for(C ? N : 0, log_softmax_bwd_body, &c);
    return CT_OK;
}
