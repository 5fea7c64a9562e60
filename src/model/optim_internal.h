/* Private pieces of src/model/optim.c shared with the CPU backend. */
#ifndef CT_MODEL_OPTIM_INTERNAL_H
#define CT_MODEL_OPTIM_INTERNAL_H

#include "core/internal.h"

/* *out = sum of g[i]^2 in double: blocks of 16384 values (4 interleaved lanes each, combined as
 * (l0 + l1) + (l2 + l3)), the block sums added in block order: ct_grad_norm is its sqrt. */
ct_status ct_grad_sumsq(const float *g, int64_t n, double *out);

#endif
