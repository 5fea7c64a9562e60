/* Element-wise arithmetic and activations (GELU, SiLU, SwiGLU), f32 and bf16.
 *
 * The activation bodies sit behind the kernel tables of elementwise_kernels.h: the scalar
 * ones (elementwise_scalar.c) use libm (erfcf, expf) and are the reference the vector bodies
 * (elementwise_avx2.c, _avx512.c, _neon.c, _sve.c) are tested against. Both compute GELU as x Phi(x) with
 * Phi(x) = erfc(-x / sqrt 2) / 2 and the tanh form as x sigmoid(2u): algebraically the
 * PyTorch formulas, without the cancellation of 1 + erf / 1 + tanh for negative x. */
#include "core/internal.h"
#include "ops/elementwise_kernels.h"
#include "ctorch/ops.h"

#include <math.h>

#define ACT_SILU 2     /* activation kinds: CT_GELU_NONE (0), CT_GELU_TANH (1), ACT_SILU */
#define EW_BLOCK 16384 /* elements per parallel task */


#if defined(__x86_64__)
#define EW_AVX2 &ct_elementwise_avx2
#define EW_AVX512 &ct_elementwise_avx512
#else
#define EW_AVX2 &ct_elementwise_scalar
#define EW_AVX512 &ct_elementwise_scalar
#endif
#if defined(__aarch64__)
#define EW_NEON &ct_elementwise_neon
#define EW_SVE &ct_elementwise_sve
#else
#define EW_NEON &ct_elementwise_scalar
#define EW_SVE &ct_elementwise_scalar
#endif

const ct_elementwise_kernels *const ct_elementwise_tables[CT_ISA_COUNT] = {
    [CT_ISA_SCALAR] = &ct_elementwise_scalar, [CT_ISA_AVX2] = EW_AVX2, [CT_ISA_AVX512] = EW_AVX512,
    [CT_ISA_NEON] = EW_NEON,                  [CT_ISA_SVE] = EW_SVE,
};

/* ---- argument checks ------------------------------------------------------------------ */

static ct_status check_n(const char *fn, const char *what, int64_t n)
{
    if (n < 0) return ct_error(CT_EINVAL, "%s: %s must be >= 0 (got %lld)", fn, what, (long long)n);
    return CT_OK;
}

static ct_status check_ptr(const char *fn, const char *name, const void *p, int64_t n)
{
    if (n > 0 && !p)
        return ct_error(CT_EINVAL, "%s: %s is NULL but it has %lld elements", fn, name,
                        (long long)n);
    return CT_OK;
}

static ct_status check_approx(const char *fn, ct_gelu_approx a)
{
    if (a != CT_GELU_NONE && a != CT_GELU_TANH)
        return ct_error(CT_EINVAL, "%s: approx must be CT_GELU_NONE or CT_GELU_TANH (got %d)", fn,
                        (int)a);
    return CT_OK;
}

/* ---- element-wise driver ------------------------------------------------------------ */

enum { OP_ADD, OP_MUL, OP_SCALE, OP_ACT_FWD, OP_ACT_BWD };

typedef struct {
    int op, kind, bf;
    void *out;
    const void *a, *b; /* operands; for OP_ACT_BWD a = dout, b = inp */
    float alpha;
    int64_t n;
    bool nt; /* out streamed (ct_stream_stores) */
} ew_ctx;

#define EW_STREAM_ELTS (CT_STREAM_TILE_BYTES / 4) /* elements buffered before streaming out */

/* Elements [i0, i0 + m) of the operation, written to o. */
static void ew_range(const ew_ctx *c, void *o, int64_t i0, int64_t m)
{
    size_t es = c->bf ? 2 : 4;
    const void *a = (const unsigned char *)c->a + (size_t)i0 * es;
    const void *b = c->b ? (const unsigned char *)c->b + (size_t)i0 * es : NULL;
    float *of = o;
    const float *af = a, *bfp = b;
    switch (c->op) {
    case OP_ADD:
        for (int64_t i = 0; i < m; i++)
            of[i] = af[i] + bfp[i];
        break;
    case OP_MUL:
        for (int64_t i = 0; i < m; i++)
            of[i] = af[i] * bfp[i];
        break;
    case OP_SCALE:
        for (int64_t i = 0; i < m; i++)
            of[i] = c->alpha * af[i];
        break;
    case OP_ACT_FWD:
        CT_KERNELS(ct_elementwise_tables)->act_forward(c->kind, o, a, m, c->bf);
        break;
    case OP_ACT_BWD:
        CT_KERNELS(ct_elementwise_tables)->act_backward(c->kind, o, a, b, m, c->bf);
        break;
    }
}

/* A task's blocks: written directly, or (c->nt) computed a piece at a time into an L1-sized
 * buffer streamed out (the same bytes). */
static void ew_body(void *arg, int64_t b0, int64_t b1, int tid)
{
    const ew_ctx *c = arg;
    int64_t i0 = b0 * EW_BLOCK, i1 = b1 * EW_BLOCK < c->n ? b1 * EW_BLOCK : c->n;
    size_t es = c->bf ? 2 : 4;
    if (!c->nt) {
        ew_range(c, (unsigned char *)c->out + (size_t)i0 * es, i0, i1 - i0);
        return;
    }
    _Alignas(64) float buf[EW_STREAM_ELTS];
    for (int64_t i = i0; i < i1; i += EW_STREAM_ELTS) {
        int64_t m = i1 - i < EW_STREAM_ELTS ? i1 - i : EW_STREAM_ELTS;
        ew_range(c, buf, i, m);
        ct_stream_copy((unsigned char *)c->out + (size_t)i * es, buf, (size_t)m * es);
    }
    ct_stream_fence();
}

static void ew_run(ew_ctx *c)
{
    c->nt = ct_stream_stores((size_t)c->n * (c->bf ? 2 : 4));
    ct_parallel_for((c->n + EW_BLOCK - 1) / EW_BLOCK, ew_body, c);
}

/* ---- arithmetic ----------------------------------------------------------------------- */

ct_status ct_add(float *out, const float *a, const float *b, int64_t n)
{
    const char *fn = "ct_add";
    CT_TRY(check_n(fn, "n", n));
    CT_TRY(check_ptr(fn, "out", out, n));
    CT_TRY(check_ptr(fn, "a", a, n));
    CT_TRY(check_ptr(fn, "b", b, n));
    ew_ctx c = {OP_ADD, 0, 0, out, a, b, 0.0f, n, false};
    ew_run(&c);
    return CT_OK;
}

ct_status ct_mul(float *out, const float *a, const float *b, int64_t n)
{
    const char *fn = "ct_mul";
    CT_TRY(check_n(fn, "n", n));
    CT_TRY(check_ptr(fn, "out", out, n));
    CT_TRY(check_ptr(fn, "a", a, n));
    CT_TRY(check_ptr(fn, "b", b, n));
    ew_ctx c = {OP_MUL, 0, 0, out, a, b, 0.0f, n, false};
    ew_run(&c);
    return CT_OK;
}

ct_status ct_scale(float *out, const float *a, float alpha, int64_t n)
{
    const char *fn = "ct_scale";
    CT_TRY(check_n(fn, "n", n));
    CT_TRY(check_ptr(fn, "out", out, n));
    CT_TRY(check_ptr(fn, "a", a, n));
    ew_ctx c = {OP_SCALE, 0, 0, out, a, NULL, alpha, n, false};
    ew_run(&c);
    return CT_OK;
}

/* ---- activations ------------------------------------------------------------------- */

static ct_status act_forward(const char *fn, int kind, int bf, void *out, const void *inp,
                             int64_t n)
{
    CT_TRY(check_n(fn, "n", n));
    CT_TRY(check_ptr(fn, "out", out, n));
    CT_TRY(check_ptr(fn, "inp", inp, n));
    ew_ctx c = {OP_ACT_FWD, kind, bf, out, inp, NULL, 0.0f, n, false};
    ew_run(&c);
    return CT_OK;
}

static ct_status act_backward(const char *fn, int kind, int bf, void *dinp, const void *dout,
                              const void *inp, int64_t n)
{
    CT_TRY(check_n(fn, "n", n));
    CT_TRY(check_ptr(fn, "dinp", dinp, n));
    CT_TRY(check_ptr(fn, "dout", dout, n));
    CT_TRY(check_ptr(fn, "inp", inp, n));
    ew_ctx c = {OP_ACT_BWD, kind, bf, dinp, dout, inp, 0.0f, n, false};
    ew_run(&c);
    return CT_OK;
}

ct_status ct_gelu_forward(float *out, const float *inp, int64_t n, ct_gelu_approx approx)
{
    CT_TRY(check_approx("ct_gelu_forward", approx));
    return act_forward("ct_gelu_forward", (int)approx, 0, out, inp, n);
}

ct_status ct_gelu_backward(float *dinp, const float *dout, const float *inp, int64_t n,
                           ct_gelu_approx approx)
{
    CT_TRY(check_approx("ct_gelu_backward", approx));
    return act_backward("ct_gelu_backward", (int)approx, 0, dinp, dout, inp, n);
}

ct_status ct_gelu_forward_bf16(uint16_t *out, const uint16_t *inp, int64_t n, ct_gelu_approx approx)
{
    CT_TRY(check_approx("ct_gelu_forward_bf16", approx));
    return act_forward("ct_gelu_forward_bf16", (int)approx, 1, out, inp, n);
}

ct_status ct_gelu_backward_bf16(uint16_t *dinp, const uint16_t *dout, const uint16_t *inp,
                                int64_t n, ct_gelu_approx approx)
{
    CT_TRY(check_approx("ct_gelu_backward_bf16", approx));
    return act_backward("ct_gelu_backward_bf16", (int)approx, 1, dinp, dout, inp, n);
}

ct_status ct_silu_forward(float *out, const float *inp, int64_t n)
{
    return act_forward("ct_silu_forward", ACT_SILU, 0, out, inp, n);
}

ct_status ct_silu_backward(float *dinp, const float *dout, const float *inp, int64_t n)
{
    return act_backward("ct_silu_backward", ACT_SILU, 0, dinp, dout, inp, n);
}

ct_status ct_silu_forward_bf16(uint16_t *out, const uint16_t *inp, int64_t n)
{
    return act_forward("ct_silu_forward_bf16", ACT_SILU, 1, out, inp, n);
}

ct_status ct_silu_backward_bf16(uint16_t *dinp, const uint16_t *dout, const uint16_t *inp,
                                int64_t n)
{
    return act_backward("ct_silu_backward_bf16", ACT_SILU, 1, dinp, dout, inp, n);
}

/* ---- SwiGLU -------------------------------------------------------------------------- */

typedef struct {
    int bf;
    void *out; /* forward: out [N, H]; backward: dinp [N, 2H] */
    const void *inp, *dout;
    int64_t H;
} swiglu_ctx;

static void swiglu_fwd_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    const swiglu_ctx *c = arg;
    size_t es = c->bf ? 2 : 4;
    int64_t H = c->H;
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *a = (const unsigned char *)c->inp + (size_t)(2 * r * H) * es;
        const unsigned char *b = a + (size_t)H * es;
        unsigned char *o = (unsigned char *)c->out + (size_t)(r * H) * es;
        CT_KERNELS(ct_elementwise_tables)->swiglu_forward(o, a, b, H, c->bf);
    }
}

static void swiglu_bwd_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    const swiglu_ctx *c = arg;
    size_t es = c->bf ? 2 : 4;
    int64_t H = c->H;
    int bf = c->bf;
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *a = (const unsigned char *)c->inp + (size_t)(2 * r * H) * es;
        const unsigned char *b = a + (size_t)H * es;
        const unsigned char *g = (const unsigned char *)c->dout + (size_t)(r * H) * es;
        unsigned char *da = (unsigned char *)c->out + (size_t)(2 * r * H) * es;
        unsigned char *db = da + (size_t)H * es;
        CT_KERNELS(ct_elementwise_tables)->swiglu_backward(da, db, g, a, b, H, bf);
    }
}

static ct_status swiglu_check(const char *fn, int64_t N, int64_t H, const void *p0, const char *n0,
                              const void *p1, const char *n1, const void *p2, const char *n2)
{
    CT_TRY(check_n(fn, "N", N));
    CT_TRY(check_n(fn, "H", H));
    int64_t nh, n2h;
    if (__builtin_mul_overflow(N, H, &nh) || __builtin_mul_overflow(nh, (int64_t)2, &n2h) ||
        n2h > INT64_MAX / 4)
        return ct_error(CT_EOVERFLOW, "%s: N * 2H overflows (N = %lld, H = %lld)", fn, (long long)N,
                        (long long)H);
    CT_TRY(check_ptr(fn, n0, p0, nh));
    CT_TRY(check_ptr(fn, n1, p1, nh));
    if (n2) CT_TRY(check_ptr(fn, n2, p2, nh));
    return CT_OK;
}

static ct_status swiglu_forward(const char *fn, int bf, void *out, const void *inp, int64_t N,
                                int64_t H)
{
    CT_TRY(swiglu_check(fn, N, H, out, "out", inp, "inp", NULL, NULL));
    swiglu_ctx c = {bf, out, inp, NULL, H};
    ct_parallel_for(H ? N : 0, swiglu_fwd_rows, &c);
    return CT_OK;
}

static ct_status swiglu_backward(const char *fn, int bf, void *dinp, const void *dout,
                                 const void *inp, int64_t N, int64_t H)
{
    CT_TRY(swiglu_check(fn, N, H, dinp, "dinp", dout, "dout", inp, "inp"));
    swiglu_ctx c = {bf, dinp, inp, dout, H};
    ct_parallel_for(H ? N : 0, swiglu_bwd_rows, &c);
    return CT_OK;
}

ct_status ct_swiglu_forward(float *out, const float *inp, int64_t N, int64_t H)
{
    return swiglu_forward("ct_swiglu_forward", 0, out, inp, N, H);
}

ct_status ct_swiglu_backward(float *dinp, const float *dout, const float *inp, int64_t N, int64_t H)
{
    return swiglu_backward("ct_swiglu_backward", 0, dinp, dout, inp, N, H);
}

ct_status ct_swiglu_forward_bf16(uint16_t *out, const uint16_t *inp, int64_t N, int64_t H)
{
    return swiglu_forward("ct_swiglu_forward_bf16", 1, out, inp, N, H);
}

ct_status ct_swiglu_backward_bf16(uint16_t *dinp, const uint16_t *dout, const uint16_t *inp,
                                  int64_t N, int64_t H)
{
    return swiglu_backward("ct_swiglu_backward_bf16", 1, dinp, dout, inp, N, H);
}
