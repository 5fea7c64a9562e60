/* Row machinery shared by the cross-entropy on logits and the fused linear cross-entropy:
 * option checks, target validation, and the per-row kernels over a tile of classes
 * [v0, v0 + vc). Both losses are these kernels driven over different tilings, so they
 * cannot drift apart. */
#ifndef CT_LOSS_CE_CORE_H
#define CT_LOSS_CE_CORE_H

#include "core/internal.h"
#include "ctorch/loss.h"

typedef struct ce_plan {
    const ct_ce_options *o;
    int64_t N, V;
    const void *target;
    ct_dtype target_dtype;
    const float *bias;    /* fused loss only; NULL otherwise */
    float wsum;           /* sum_c w_c (V without class weights) */
    double denom;         /* MEAN denominator (count or weight sum of non-ignored rows) */
    int64_t n_valid;      /* non-ignored rows */
} ce_plan;

/* Running statistics of one row over the tiles seen so far. */
typedef struct ce_row {
    float m;  /* running max */
    float l;  /* sum exp(z - m) */
    float zy; /* target logit */
    float sw; /* sum_c w_c z_c (only with label smoothing) */
} ce_row;

/* Check options, sizes and every target; fill the plan. `fn` names the caller in errors. */
ct_status ce_plan_init(ce_plan *p, const char *fn, const ct_ce_options *o, const void *target,
                       ct_dtype target_dtype, int64_t N, int64_t V);

/* Target of row n, or -1 when the row is ignored. */
int64_t ce_target(const ce_plan *p, int64_t n);

/* Upstream gradient of row n's loss (0 for ignored rows). dloss NULL means 1. */
float ce_row_scale(const ce_plan *p, const float *dloss, int64_t n);

void ce_row_begin(ce_row *r);
/* Add the bias slice and apply the softcap to z[0..vc) (the classes v0..v0+vc), in place. */
void ce_row_prep(const ce_plan *p, float *z, int64_t v0, int64_t vc);
/* Fold a prepared tile into the running statistics. */
void ce_row_stats(const ce_plan *p, ce_row *r, const float *z, int64_t v0, int64_t vc, int64_t y);
/* Finish a row: its logsumexp, loss and z term (0, 0 for ignored rows; lse still set). */
void ce_row_finish(const ce_plan *p, const ce_row *r, int64_t y, float *lse, float *loss, float *zterm);
/* Overwrite a prepared tile with d loss / d (pre-softcap logits), scaled by g. */
void ce_row_grad(const ce_plan *p, float *z, int64_t v0, int64_t vc, int64_t y, float lse, float g);
/* A whole prepared row (v0 0, vc V) in one visit: statistics (into r), lse, loss, z term, then
 * its gradient (scale g) in place. The exponentials are computed once (z <- exp(z - max), the
 * softmax is that times 1 / sum) where ce_row_stats + ce_row_grad compute them twice; with a
 * softcap, or a row whose max is not finite, it is exactly those calls. */
void ce_row_full(const ce_plan *p, ce_row *r, float *z, int64_t y, float g, float *lse, float *loss,
                 float *zterm);

/* Reduce per-row values (in row order, in double: deterministic) into out (1 or N floats). */
void ce_reduce(const ce_plan *p, const float *rows, float *out);

#endif
