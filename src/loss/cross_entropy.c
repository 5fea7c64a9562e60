/* Cross-entropy on materialised logits: the unfused reference and benchmark baseline. */
#include "loss/ce_core.h"

#include <string.h>

typedef struct {
    const ce_plan *p;
    const float *logits;
    const float *dloss;
    float *work; /* forward: one row per thread; backward: dlogits */
    float *loss_rows, *z_rows, *lse;
} ce_ctx;

static void fwd_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    ce_ctx *c = arg;
    int64_t V = c->p->V;
    float *z = c->work + (size_t)tid * (size_t)V;
    for (int64_t n = r0; n < r1; n++) {
        int64_t y = ce_target(c->p, n);
        memcpy(z, c->logits + n * V, (size_t)V * sizeof(float));
        ce_row_prep(c->p, z, 0, V);
        ce_row r;
        ce_row_begin(&r);
        ce_row_stats(c->p, &r, z, 0, V, y);
        ce_row_finish(c->p, &r, y, &c->lse[n], &c->loss_rows[n], &c->z_rows[n]);
    }
}

ct_status ct_cross_entropy_forward(const ct_ce_outputs *out, const float *logits, const void *target,
                                   ct_dtype target_dtype, int64_t N, int64_t V, const ct_ce_options *opt)
{
    const char *fn = "ct_cross_entropy_forward";
    ce_plan p;
    CT_TRY(ce_plan_init(&p, fn, opt, target, target_dtype, N, V));
    if (!out || !out->loss) return ct_error(CT_EINVAL, "%s: out->loss must not be NULL", fn);
    if (N && !logits) return ct_error(CT_EINVAL, "%s: logits must not be NULL", fn);
    int T = ct_num_threads();
    float *buf = NULL;
    size_t rows = (size_t)T * (size_t)V + 3 * (size_t)N, bytes;
    if (!ct_mul_size(rows, sizeof(float), &bytes)) return ct_error(CT_EOVERFLOW, "%s: sizes overflow", fn);
    CT_TRY(ct_alloc((void **)&buf, bytes));
    ce_ctx c = {&p, logits, NULL, buf, buf + (size_t)T * V, buf + (size_t)T * V + N, buf + (size_t)T * V + 2 * N};
    ct_parallel_for_capped(N, 1, T, fwd_rows, &c); /* tid < T: the scratch rows */
    ce_reduce(&p, c.loss_rows, out->loss);
    if (out->z_loss) ce_reduce(&p, c.z_rows, out->z_loss);
    if (out->lse) memcpy(out->lse, c.lse, (size_t)N * sizeof(float));
    ct_free(buf);
    return CT_OK;
}

static void bwd_rows(void *arg, int64_t r0, int64_t r1, int tid)
{
    ce_ctx *c = arg;
    int64_t V = c->p->V;
    for (int64_t n = r0; n < r1; n++) {
        int64_t y = ce_target(c->p, n);
        float *z = c->work + n * V;
        memcpy(z, c->logits + n * V, (size_t)V * sizeof(float));
        ce_row_prep(c->p, z, 0, V);
        ce_row r;
        ce_row_begin(&r);
        ce_row_stats(c->p, &r, z, 0, V, y);
        float lse, l, zt;
        ce_row_finish(c->p, &r, y, &lse, &l, &zt);
        ce_row_grad(c->p, z, 0, V, y, lse, ce_row_scale(c->p, c->dloss, n));
    }
}

ct_status ct_cross_entropy_backward(float *dlogits, const float *dloss, const float *logits,
                                    const void *target, ct_dtype target_dtype, int64_t N, int64_t V,
                                    const ct_ce_options *opt)
{
    const char *fn = "ct_cross_entropy_backward";
    ce_plan p;
    CT_TRY(ce_plan_init(&p, fn, opt, target, target_dtype, N, V));
    if (N && (!dlogits || !logits || !dloss))
        return ct_error(CT_EINVAL, "%s: dlogits, dloss and logits must not be NULL", fn);
    ce_ctx c = {&p, logits, dloss, dlogits, NULL, NULL, NULL};
    ct_parallel_for(N, bwd_rows, &c);
    return CT_OK;
}
