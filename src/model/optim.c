/* AdamW, gradient norm and clipping, learning-rate schedule (include/ctorch/optim.h). */
#include "core/internal.h"
#include "ctorch/optim.h"
#include "model/optim_internal.h"
#include "ops/optim_kernels.h"

#include <math.h>

#define NORM_BLOCK 16384

ct_adamw_options ct_adamw_options_default(void)
{
    ct_adamw_options o = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    return o;
}

/* The scalar body of the kernel table (ops/optim_kernels.h). This file is compiled with
 * -fno-math-errno, so the loop vectorises at the baseline width (SSE2, Advanced SIMD); every
 * lane does the scalar loop's IEEE operations in the same order (no contraction in ISO C
 * mode), so the bits do not change. The AVX2 / AVX-512 bodies (optim_x86.h) give these bits. */
static void scalar_adamw(float *restrict pp, const float *restrict gp, float *restrict mp,
                         float *restrict vp, int64_t n, const ct_adamw_consts *k)
{
    const float b1 = k->b1, one_b1 = k->one_b1, b2 = k->b2, one_b2 = k->one_b2;
    const float decay = k->decay, step_size = k->step_size, bc2_sqrt = k->bc2_sqrt, eps = k->eps;
    for (int64_t i = 0; i < n; i++) {
        float g = gp[i];
        float m = b1 * mp[i] + one_b1 * g;
        float v = b2 * vp[i] + one_b2 * g * g;
        mp[i] = m;
        vp[i] = v;
        float p = pp[i] * decay;
        pp[i] = p - step_size * m / (sqrtf(v) / bc2_sqrt + eps);
    }
}

const ct_optim_kernels ct_optim_scalar = {scalar_adamw};

#if defined(__x86_64__)
#define OPTIM_AVX2 &ct_optim_avx2
#define OPTIM_AVX512 &ct_optim_avx512
#else
#define OPTIM_AVX2 &ct_optim_scalar
#define OPTIM_AVX512 &ct_optim_scalar
#endif

/* Every entry gives the scalar loop's bits; AArch64 runs the scalar body (vectorised). */
const ct_optim_kernels *const ct_optim_tables[CT_ISA_COUNT] = {
    [CT_ISA_SCALAR] = &ct_optim_scalar, [CT_ISA_AVX2] = OPTIM_AVX2,
    [CT_ISA_AVX512] = OPTIM_AVX512,     [CT_ISA_NEON] = &ct_optim_scalar,
    [CT_ISA_SVE] = &ct_optim_scalar,
};

typedef struct {
    float *p, *m, *v;
    const float *g;
    ct_adamw_consts k;
    const ct_optim_kernels *kern;
} adamw_job;

static void adamw_range(void *ctx, int64_t i0, int64_t i1, int tid)
{
    const adamw_job *j = ctx;
    j->kern->adamw(j->p + i0, j->g + i0, j->m + i0, j->v + i0, i1 - i0, &j->k);
}

ct_status ct_adamw_step(float *param, const float *grad, float *m, float *v, int64_t n,
                        int64_t step, const ct_adamw_options *opt)
{
    const char *fn = "ct_adamw_step";
    if (!opt) return ct_error(CT_EINVAL, "%s: opt must not be NULL", fn);
    if (n < 0) return ct_error(CT_EINVAL, "%s: n must be >= 0, got %lld", fn, (long long)n);
    if (step < 1)
        return ct_error(CT_EINVAL, "%s: step must be >= 1 (1-based), got %lld", fn,
                        (long long)step);
    if (n && (!param || !grad || !m || !v))
        return ct_error(CT_EINVAL, "%s: param, grad, m and v must not be NULL", fn);
    if (!(opt->beta1 >= 0 && opt->beta1 < 1) || !(opt->beta2 >= 0 && opt->beta2 < 1))
        return ct_error(CT_EINVAL, "%s: beta1 and beta2 must be in [0, 1), got %g and %g", fn,
                        opt->beta1, opt->beta2);
    if (!(opt->eps > 0) || !(opt->weight_decay >= 0) || !isfinite(opt->lr) || opt->lr < 0)
        return ct_error(CT_EINVAL,
                        "%s: need eps > 0, weight_decay >= 0 and a finite lr >= 0 (got %g, %g, %g)",
                        fn, opt->eps, opt->weight_decay, opt->lr);
    double b1 = opt->beta1, b2 = opt->beta2;
    double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
    adamw_job j = {param,
                   m,
                   v,
                   grad,
                   {(float)(1.0 - (double)opt->lr * opt->weight_decay), opt->beta1,
                    (float)(1.0 - b1), opt->beta2, (float)(1.0 - b2), (float)(opt->lr / bc1),
                    (float)sqrt(bc2), opt->eps},
                   CT_KERNELS(ct_optim_tables)};
    ct_parallel_for_grain(n, 4096, adamw_range, &j);
    return CT_OK;
}

typedef struct {
    const float *g;
    int64_t n;
    double *part;
} norm_job;

static void norm_blocks(void *ctx, int64_t b0, int64_t b1, int tid)
{
    const norm_job *j = ctx;
    for (int64_t b = b0; b < b1; b++) {
        int64_t s = b * NORM_BLOCK, e = s + NORM_BLOCK < j->n ? s + NORM_BLOCK : j->n;
        double acc[4] = {0, 0, 0, 0};
        int64_t i = s;
        for (; i + 4 <= e; i += 4)
            for (int k = 0; k < 4; k++)
                acc[k] += (double)j->g[i + k] * j->g[i + k];
        for (; i < e; i++)
            acc[0] += (double)j->g[i] * j->g[i];
        j->part[b] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
}

ct_status ct_grad_sumsq(const float *g, int64_t n, double *out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_grad_norm: norm must not be NULL");
    if (n < 0 || (n && !g))
        return ct_error(CT_EINVAL, "ct_grad_norm: need n >= 0 and g with n values");
    int64_t nb = (n + NORM_BLOCK - 1) / NORM_BLOCK;
    double *part;
    CT_TRY(ct_alloc((void **)&part, (size_t)(nb ? nb : 1) * sizeof(double)));
    norm_job j = {g, n, part};
    ct_parallel_for(nb, norm_blocks, &j);
    double s = 0;
    for (int64_t b = 0; b < nb; b++)
        s += part[b];
    ct_free(part);
    *out = s;
    return CT_OK;
}

ct_status ct_grad_norm(const float *g, int64_t n, double *norm)
{
    if (!norm) return ct_error(CT_EINVAL, "ct_grad_norm: norm must not be NULL");
    double s = 0;
    CT_TRY(ct_grad_sumsq(g, n, &s));
    *norm = sqrt(s);
    return CT_OK;
}

typedef struct {
    float *g;
    float c;
} scale_job;

static void scale_range(void *ctx, int64_t i0, int64_t i1, int tid)
{
    const scale_job *j = ctx;
    for (int64_t i = i0; i < i1; i++)
        j->g[i] *= j->c;
}

ct_status ct_clip_grad_norm(float *g, int64_t n, float max_norm, double *norm)
{
    double N;
    CT_TRY(ct_grad_norm(g, n, &N));
    if (norm) *norm = N;
    if (max_norm > 0 && N > max_norm) {
        scale_job j = {g, (float)(max_norm / (N + 1e-6))};
        ct_parallel_for_grain(n, 8192, scale_range, &j);
    }
    return CT_OK;
}

float ct_lr_cosine(int64_t step, int64_t warmup, int64_t total, float lr_max, float lr_min)
{
    if (step < warmup) return (float)((double)lr_max * (double)(step + 1) / (double)warmup);
    int64_t span = total - 1 - warmup;
    if (span <= 0) return lr_max;
    if (step >= total - 1) return lr_min;
    double r = (double)(step - warmup) / (double)span;
    return (float)(lr_min + 0.5 * (lr_max - lr_min) * (1.0 + cos(3.141592653589793 * r)));
}
