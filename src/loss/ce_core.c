#include "loss/ce_core.h"
#include "ops/vecmath.h"

#include <math.h>
#include <string.h>

ct_ce_options ct_ce_options_default(void)
{
    return (ct_ce_options){.ignore_index = -100,
                           .reduction = CT_REDUCTION_MEAN,
                           .label_smoothing = 0.0f,
                           .class_weight = NULL,
                           .z_loss = 0.0f,
                           .softcap = 0.0f,
                           .scratch_bytes = CT_DEFAULT_SCRATCH_BYTES};
}

int64_t ce_target(const ce_plan *p, int64_t n)
{
    int64_t t = p->target_dtype == CT_DTYPE_I64 ? ((const int64_t *)p->target)[n]
                                                : ((const int32_t *)p->target)[n];
    return t == p->o->ignore_index ? -1 : t;
}

ct_status ce_plan_init(ce_plan *p, const char *fn, const ct_ce_options *o, const void *target,
                       ct_dtype target_dtype, int64_t N, int64_t V)
{
    memset(p, 0, sizeof *p);
    if (!o) return ct_error(CT_EINVAL, "%s: options must not be NULL (use ct_ce_options_default())", fn);
    if (N < 0 || V < 0) return ct_error(CT_EINVAL, "%s: N and V must be >= 0 (N=%lld, V=%lld)", fn, (long long)N, (long long)V);
    if (V == 0 && N > 0) return ct_error(CT_EINVAL, "%s: V must be >= 1 when N > 0", fn);
    if (target_dtype != CT_DTYPE_I64 && target_dtype != CT_DTYPE_I32)
        return ct_error(CT_EINVAL, "%s: target dtype must be i64 or i32, got %s", fn, ct_dtype_name(target_dtype));
    if (N && !target) return ct_error(CT_EINVAL, "%s: target must not be NULL", fn);
    if (o->reduction != CT_REDUCTION_NONE && o->reduction != CT_REDUCTION_MEAN && o->reduction != CT_REDUCTION_SUM)
        return ct_error(CT_EINVAL, "%s: reduction must be NONE, MEAN or SUM, got %d", fn, (int)o->reduction);
    if (!(o->label_smoothing >= 0.0f && o->label_smoothing <= 1.0f))
        return ct_error(CT_EINVAL, "%s: label_smoothing must be in [0, 1], got %g", fn, (double)o->label_smoothing);
    if (!(o->z_loss >= 0.0f) || isinf(o->z_loss))
        return ct_error(CT_EINVAL, "%s: z_loss must be finite and >= 0, got %g", fn, (double)o->z_loss);
    if (!(o->softcap >= 0.0f) || isinf(o->softcap))
        return ct_error(CT_EINVAL, "%s: softcap must be finite and >= 0 (0 = off), got %g", fn, (double)o->softcap);
    p->o = o;
    p->N = N;
    p->V = V;
    p->target = target;
    p->target_dtype = target_dtype;
    double ws = 0;
    if (o->class_weight)
        for (int64_t c = 0; c < V; c++) ws += o->class_weight[c];
    else
        ws = (double)V;
    p->wsum = (float)ws;
    double denom = 0;
    for (int64_t n = 0; n < N; n++) {
        int64_t t = target_dtype == CT_DTYPE_I64 ? ((const int64_t *)target)[n] : ((const int32_t *)target)[n];
        if (t == o->ignore_index) continue;
        if (t < 0 || t >= V)
            return ct_error(CT_EINVAL, "%s: target[%lld] = %lld is outside [0, %lld) and is not ignore_index (%lld)",
                            fn, (long long)n, (long long)t, (long long)V, (long long)o->ignore_index);
        p->n_valid++;
        denom += o->class_weight ? o->class_weight[t] : 1.0;
    }
    p->denom = denom;
    return CT_OK;
}

float ce_row_scale(const ce_plan *p, const float *dloss, int64_t n)
{
    if (ce_target(p, n) < 0) return 0.0f;
    switch (p->o->reduction) {
    case CT_REDUCTION_NONE: return dloss ? dloss[n] : 1.0f;
    case CT_REDUCTION_SUM: return dloss ? dloss[0] : 1.0f;
    case CT_REDUCTION_MEAN: return (float)((dloss ? dloss[0] : 1.0) / p->denom);
    }
    return 0.0f;
}

void ce_row_begin(ce_row *r)
{
    r->m = -INFINITY;
    r->l = 0.0f;
    r->zy = 0.0f;
    r->sw = 0.0f;
}

void ce_row_prep(const ce_plan *p, float *z, int64_t v0, int64_t vc)
{
    if (p->bias) ct_vaxpy(z, 1.0f, p->bias + v0, vc);
    float cap = p->o->softcap;
    if (cap > 0.0f) {
        float inv = 1.0f / cap;
        for (int64_t j = 0; j < vc; j++) z[j] = cap * tanhf(z[j] * inv);
    }
}

void ce_row_stats(const ce_plan *p, ce_row *r, const float *z, int64_t v0, int64_t vc, int64_t y)
{
    float tm = ct_vmax(z, vc);
    if (tm > r->m) {
        r->l = (r->m == -INFINITY ? 0.0f : r->l * expf(r->m - tm)) + ct_vexpsum(NULL, z, tm, vc);
        r->m = tm;
    } else if (r->m != -INFINITY) {
        r->l += ct_vexpsum(NULL, z, r->m, vc);
    } else if (isnan(tm)) {
        r->m = tm;
    }
    if (y >= v0 && y < v0 + vc) r->zy = z[y - v0];
    if (p->o->label_smoothing > 0.0f)
        r->sw += p->o->class_weight ? ct_vdot(p->o->class_weight + v0, z, vc) : ct_vsum(z, vc);
}

void ce_row_finish(const ce_plan *p, const ce_row *r, int64_t y, float *lse, float *loss, float *zterm)
{
    float L = r->m + logf(r->l);
    *lse = L;
    if (y < 0) {
        *loss = 0.0f;
        *zterm = 0.0f;
        return;
    }
    float eps = p->o->label_smoothing;
    float wy = p->o->class_weight ? p->o->class_weight[y] : 1.0f;
    float zt = p->o->z_loss * L * L;
    float v = (1.0f - eps) * wy * (L - r->zy) + zt;
    if (eps > 0.0f) v += eps / (float)p->V * (p->wsum * L - r->sw);
    *loss = v;
    *zterm = zt;
}

/* The softmax's factor in a row's gradient: (1 - eps) w_y + eps / V sum_c w_c + 2 z_loss lse. */
static float grad_factor(const ce_plan *p, int64_t y, float lse)
{
    const ct_ce_options *o = p->o;
    float eps = o->label_smoothing, wy = o->class_weight ? o->class_weight[y] : 1.0f;
    return (1.0f - eps) * wy + eps / (float)p->V * p->wsum + 2.0f * o->z_loss * lse;
}

/* z holds the softmax times 1 / s (columns v0..v0+vc): the gradient g (A p_j - eps / V w_j
 * - (1 - eps) w_y [j == y]) in place, with p_j = s z_j. */
static void grad_from_softmax(const ce_plan *p, float *z, int64_t v0, int64_t vc, int64_t y, float g, float A,
                              float s)
{
    const ct_ce_options *o = p->o;
    float eps = o->label_smoothing, sV = eps / (float)p->V;
    ct_vscale(z, g * A * s, vc);
    if (sV > 0.0f) {
        if (o->class_weight) ct_vaxpy(z, -g * sV, o->class_weight + v0, vc);
        else
            for (int64_t j = 0; j < vc; j++) z[j] -= g * sV;
    }
    if (y >= v0 && y < v0 + vc) z[y - v0] -= g * (1.0f - eps) * (o->class_weight ? o->class_weight[y] : 1.0f);
}

void ce_row_grad(const ce_plan *p, float *z, int64_t v0, int64_t vc, int64_t y, float lse, float g)
{
    if (y < 0 || g == 0.0f) {
        memset(z, 0, (size_t)vc * sizeof(float));
        return;
    }
    const ct_ce_options *o = p->o;
    float eps = o->label_smoothing, sV = eps / (float)p->V;
    float wy = o->class_weight ? o->class_weight[y] : 1.0f;
    float A = grad_factor(p, y, lse);
    float cap = o->softcap;
    if (cap > 0.0f) {
        /* z holds cap * tanh(x / cap); d/dx = 1 - (z / cap)^2. */
        float inv = 1.0f / cap;
        for (int64_t j = 0; j < vc; j++) {
            float t = z[j] * inv, pj = expf(z[j] - lse);
            float gj = pj * A - sV * (o->class_weight ? o->class_weight[v0 + j] : 1.0f);
            if (v0 + j == y) gj -= (1.0f - eps) * wy;
            z[j] = g * gj * (1.0f - t * t);
        }
        return;
    }
    ct_vexpsum(z, z, lse, vc); /* z <- p */
    grad_from_softmax(p, z, v0, vc, y, g, A, 1.0f);
}

void ce_row_full(const ce_plan *p, ce_row *r, float *z, int64_t y, float g, float *lse, float *loss,
                 float *zterm)
{
    const ct_ce_options *o = p->o;
    int64_t V = p->V;
    ce_row_begin(r);
    float m = o->softcap > 0.0f ? NAN : ct_vmax(z, V);
    if (!isfinite(m)) { /* a softcap (its derivative needs z), or an inf / NaN row */
        ce_row_stats(p, r, z, 0, V, y);
        ce_row_finish(p, r, y, lse, loss, zterm);
        ce_row_grad(p, z, 0, V, y, *lse, g);
        return;
    }
    /* what ce_row_stats gathers, before z is overwritten (the same sums in the same order) */
    r->m = m;
    if (y >= 0 && y < V) r->zy = z[y];
    float eps = o->label_smoothing;
    if (eps > 0.0f) r->sw = o->class_weight ? ct_vdot(o->class_weight, z, V) : ct_vsum(z, V);
    r->l = ct_vexpsum(z, z, m, V); /* z <- exp(z - m) */
    ce_row_finish(p, r, y, lse, loss, zterm);
    if (y < 0 || g == 0.0f) {
        memset(z, 0, (size_t)V * sizeof(float));
        return;
    }
    grad_from_softmax(p, z, 0, V, y, g, grad_factor(p, y, *lse), 1.0f / r->l); /* softmax = z / l */
}

void ce_reduce(const ce_plan *p, const float *rows, float *out)
{
    if (p->o->reduction == CT_REDUCTION_NONE) {
        if (out != rows) memcpy(out, rows, (size_t)p->N * sizeof(float));
        return;
    }
    double s = 0;
    for (int64_t n = 0; n < p->N; n++) s += rows[n];
    *out = (float)(p->o->reduction == CT_REDUCTION_MEAN ? s / p->denom : s);
}
