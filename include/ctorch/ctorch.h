/*
 * ctorch.h - everything of libctorch in one include.
 *
 * ctorch brings the LLM-training advances of PyTorch 2.13 to C: a fused linear +
 * cross-entropy that never holds the N x V logits, strided tensors with an accounting
 * allocator, deterministic kernels, and (as they land) FlexAttention, safetensors,
 * collectives and telemetry. Conventions: every fallible call returns ct_status and
 * ct_last_error() explains a failure; options are structs with *_default() constructors;
 * results are bitwise identical across runs and thread counts.
 *
 *     #include <ctorch/ctorch.h>
 *     float loss, lse[N];
 *     ct_lce_options o = ct_lce_options_default();
 *     if (ct_linear_cross_entropy_forward(...) != CT_OK) puts(ct_last_error());
 */
#ifndef CTORCH_CTORCH_H
#define CTORCH_CTORCH_H

#include "ctorch/core.h"
#include "ctorch/tensor.h"
#include "ctorch/ops.h"
#include "ctorch/loss.h"
#include "ctorch/telemetry.h"
#include "ctorch/attention.h"
#include "ctorch/jit.h"
#include "ctorch/io.h"
#include "ctorch/comm.h"
#include "ctorch/fsdp.h"
#include "ctorch/data.h"
#include "ctorch/tokenizer.h"
#include "ctorch/optim.h"
#include "ctorch/model.h"

#endif
