#include "core/internal.h"
#include "ctorch/ops.h"
#include "ops/vecmath.h"

#include <math.h>

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

static void softmax_rows(void *p, int64_t r0, int64_t r1, int tid)
{
    rows_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->a + r * c->C;
        float *y = c->out + r * c->C;
        float m = ct_vmax(x, c->C);
        if (m == -INFINITY) { /* fully masked row: PyTorch gives NaN; keep that */
            for (int64_t j = 0; j < c->C; j++) y[j] = NAN;
            continue;
        }
        float s = ct_vexpsum(y, x, m, c->C);
        ct_vscale(y, 1.0f / s, c->C);
    }
}

ct_status ct_softmax_forward(float *out, const float *inp, int64_t N, int64_t C)
{
    CT_TRY(rows_check("ct_softmax_forward", out, inp, N, C));
    rows_ctx c = {out, inp, NULL, C};
    ct_parallel_for(C ? N : 0, softmax_rows, &c);
    return CT_OK;
}

static void log_softmax_rows(void *p, int64_t r0, int64_t r1, int tid)
{
    rows_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->a + r * c->C;
        float *y = c->out + r * c->C;
        float m = ct_vmax(x, c->C);
        float lse = m == -INFINITY ? -INFINITY : m + logf(ct_vexpsum(NULL, x, m, c->C));
        for (int64_t j = 0; j < c->C; j++) y[j] = x[j] - lse;
    }
}

ct_status ct_log_softmax_forward(float *out, const float *inp, int64_t N, int64_t C)
{
    CT_TRY(rows_check("ct_log_softmax_forward", out, inp, N, C));
    rows_ctx c = {out, inp, NULL, C};
    ct_parallel_for(C ? N : 0, log_softmax_rows, &c);
    return CT_OK;
}

static void lse_rows(void *p, int64_t r0, int64_t r1, int tid)
{
    rows_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->a + r * c->C;
        float m = ct_vmax(x, c->C);
        c->out[r] = m == -INFINITY ? -INFINITY : m + logf(ct_vexpsum(NULL, x, m, c->C));
    }
}

ct_status ct_logsumexp_rows(float *lse, const float *inp, int64_t N, int64_t C)
{
    CT_TRY(rows_check("ct_logsumexp_rows", lse, inp, N, C));
    rows_ctx c = {lse, inp, NULL, C};
    ct_parallel_for(N, lse_rows, &c);
    return CT_OK;
}

static void softmax_bwd_rows(void *p, int64_t r0, int64_t r1, int tid)
{
    rows_ctx *c = p; /* a = dout, b = out */
    for (int64_t r = r0; r < r1; r++) {
        const float *g = c->a + r * c->C, *y = c->b + r * c->C;
        float *d = c->out + r * c->C;
        float dot = ct_vdot(g, y, c->C);
        for (int64_t j = 0; j < c->C; j++) d[j] = y[j] * (g[j] - dot);
    }
}

ct_status ct_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N, int64_t C)
{
    CT_TRY(rows_check("ct_softmax_backward", dinp, dout, N, C));
    if (N && C && !out) return ct_error(CT_EINVAL, "ct_softmax_backward: out must not be NULL");
    rows_ctx c = {dinp, dout, out, C};
    ct_parallel_for(C ? N : 0, softmax_bwd_rows, &c);
    return CT_OK;
}

static void log_softmax_bwd_rows(void *p, int64_t r0, int64_t r1, int tid)
{
    rows_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) {
        const float *g = c->a + r * c->C, *y = c->b + r * c->C;
        float *d = c->out + r * c->C;
        float s = ct_vsum(g, c->C);
        for (int64_t j = 0; j < c->C; j++) d[j] = g[j] - expf(y[j]) * s;
    }
}

ct_status ct_log_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N, int64_t C)
{
    CT_TRY(rows_check("ct_log_softmax_backward", dinp, dout, N, C));
    if (N && C && !out) return ct_error(CT_EINVAL, "ct_log_softmax_backward: out must not be NULL");
    rows_ctx c = {dinp, dout, out, C};
    ct_parallel_for(C ? N : 0, log_softmax_bwd_rows, &c);
    return CT_OK;
}
