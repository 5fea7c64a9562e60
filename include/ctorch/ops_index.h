/* ctorch/ops_index.h - (kernels arrive here; see ops.h for the conventions). */
#ifndef CTORCH_OPS_INDEX_H
#define CTORCH_OPS_INDEX_H

#include "ctorch/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
