/* The x86 AdamW body (see optim_kernels.h), written once over simd_x86.h's vector type:
 * optim_avx2.c includes this at 8 lanes, optim_avx512.c at 16, each defining CT_OPTIM_TABLE,
 * the name of its table. Each lane does the scalar loop's operations in its order: two
 * multiplies and an add for m, three multiplies and an add for v (((1 - b2) g) g), the decay
 * multiply, sqrt, the two divides and the subtract; never an FMA (the bits would change), so
 * the results are the scalar loop's bit for bit. The tail (n mod the width) goes through the
 * same lane operations (zero-padded buffer at 8 lanes, masked loads and stores at 16): the
 * padding lanes compute 0 / eps, never a trap or a NaN that could be seen.
 *
 * Memory-bound on purpose: 16 bytes read and 12 written per parameter, one pass. At 8 lanes
 * the divides and the sqrt no longer limit a core (the SSE2 loop of the scalar body does:
 * one sqrtps and two divps per 4 parameters). */
#ifndef CT_OPTIM_TABLE
#error "define CT_OPTIM_TABLE and include simd_avx2.h or simd_avx512.h first"
#endif

#include "ops/optim_kernels.h"

#define CT_OPT_INLINE static inline __attribute__((always_inline))

typedef struct {
    ct_vf b1, one_b1, b2, one_b2, decay, step_size, bc2_sqrt, eps;
} adamw_vconsts;

/* One vector of parameters: returns the new p; *mo, *vo the new moments. */
CT_OPT_INLINE ct_vf adamw_lanes(const adamw_vconsts *c, ct_vf p, ct_vf g, ct_vf m, ct_vf v,
                                ct_vf *mo, ct_vf *vo)
{
    m = cv_add(cv_mul(c->b1, m), cv_mul(c->one_b1, g));
    v = cv_add(cv_mul(c->b2, v), cv_mul(cv_mul(c->one_b2, g), g));
    *mo = m;
    *vo = v;
    ct_vf denom = cv_add(cv_div(CV_(sqrt_ps)(v), c->bc2_sqrt), c->eps);
    return cv_sub(cv_mul(p, c->decay), cv_div(cv_mul(c->step_size, m), denom));
}

static void x86_adamw(float *p, const float *g, float *m, float *v, int64_t n,
                      const ct_adamw_consts *k)
{
    adamw_vconsts c = {cv_set1(k->b1),     cv_set1(k->one_b1),   cv_set1(k->b2),
                       cv_set1(k->one_b2), cv_set1(k->decay),    cv_set1(k->step_size),
                       cv_set1(k->bc2_sqrt), cv_set1(k->eps)};
    int64_t i = 0;
    for (; i + CV_W <= n; i += CV_W) {
        ct_vf mo, vo;
        ct_vf po = adamw_lanes(&c, cv_loadu(p + i), cv_loadu(g + i), cv_loadu(m + i),
                               cv_loadu(v + i), &mo, &vo);
        cv_storeu(m + i, mo);
        cv_storeu(v + i, vo);
        cv_storeu(p + i, po);
    }
    if (i < n) {
        int64_t r = n - i;
        ct_vf mo, vo;
        ct_vf po = adamw_lanes(&c, cv_ld_part(p, i, r, 0), cv_ld_part(g, i, r, 0),
                               cv_ld_part(m, i, r, 0), cv_ld_part(v, i, r, 0), &mo, &vo);
        cv_st_part(m, i, r, mo, 0);
        cv_st_part(v, i, r, vo, 0);
        cv_st_part(p, i, r, po, 0);
    }
}

const ct_optim_kernels CT_OPTIM_TABLE = {x86_adamw};
