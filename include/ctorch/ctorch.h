/*
 * ctorch.h - everything of libctorch in one include.
 *
 * ctorch brings the LLM-training advances of PyTorch 2.13 to C: a fused linear +
 * cross-entropy that never holds the N x V logits, strided tensors with an accounting
 * allocator, deterministic kernels, FlexAttention and dense attention, safetensors / .pt
 * loading and saving, a score-mod compiler, collectives (tcp and MPI backends) with FSDP,
 * a small GPT with its tokenizer, optimiser and trainer, and telemetry. Conventions: every
 * fallible call returns ct_status and ct_last_error() explains a failure; options are
 * structs with *_default() constructors; results are bitwise identical across runs and
 * thread counts.
 *
 * Example (a whole program; the test test_header_example compiles and runs this text):
 *
 *     #include <ctorch/ctorch.h>
 *     #include <math.h>
 *     #include <stdio.h>
 *
 *     int main(void)
 *     {
 *         enum { N = 4, D = 8, V = 16 };
 *         float h[N * D] = {0}, w[V * D], loss, lse[N];
 *         int64_t y[N] = {1, 5, 0, 15};
 *         for (int i = 0; i < V * D; i++) w[i] = 0.01f * (float)(i % 7);
 *         ct_ce_options o = ct_ce_options_default();
 *         ct_lce_inputs in = {.h = h, .weight = w, .dtype = CT_DTYPE_F32, .target = y,
 *                             .target_dtype = CT_DTYPE_I64, .N = N, .D = D, .V = V};
 *         ct_ce_outputs out = {.loss = &loss, .lse = lse};
 *         if (ct_linear_cross_entropy_forward(&out, &in, &o) != CT_OK) {
 *             fprintf(stderr, "%s\n", ct_last_error());
 *             return 1;
 *         }
 *         // h = 0 makes every logit 0: the mean loss is ln V
 *         printf("loss %.6f, ln %d = %.6f\n", loss, V, log(V));
 *         return fabsf(loss - logf((float)V)) < 1e-5f ? 0 : 1;
 *     }
 */
#ifndef CTORCH_CTORCH_H
#define CTORCH_CTORCH_H

#include "ctorch/core.h"
#include "ctorch/tensor.h"
#include "ctorch/device.h"
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
