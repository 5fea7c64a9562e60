/*
 * ctorch/device.h - devices and the buffers that live on them.
 *
 * A device is where tensors live and ops run: the CPU (always there) or an NVIDIA GPU through
 * libctorch_cuda.so, which libctorch loads with dlopen on first use (so libctorch, and every
 * program that only uses the CPU, never needs CUDA). CTORCH_CUDA_LIB names the file to load
 * instead of the one installed beside libctorch.
 *
 * Each device keeps its own memory statistics (current, peak, limit: the analog of
 * torch.cuda.max_memory_allocated). The CPU device's are the process-wide figures of ct_alloc
 * (ct_memory_stats). A buffer is one allocation on one device; ct_tensor.buffer names it
 * (NULL: host memory, as tensors have always been).
 *
 *     ct_device_options o = ct_device_options_default();
 *     ct_device_parse("cuda:0", &o);
 *     ct_device *gpu;
 *     if (ct_device_open(&o, &gpu) != CT_OK) fprintf(stderr, "%s\n", ct_last_error());
 */
#ifndef CTORCH_DEVICE_H
#define CTORCH_DEVICE_H

#include "ctorch/attention.h"
#include "ctorch/core.h"
#include "ctorch/loss.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ct_device_kind {
    CT_DEVICE_CPU = 0,
    CT_DEVICE_CUDA = 1,
} ct_device_kind;

typedef struct ct_device_options {
    ct_device_kind kind; /**< default CT_DEVICE_CPU */
    int index;           /**< which device of the kind (cuda:N); 0 by default */
    size_t memory_limit; /**< bytes this device may hold through ctorch (0: no limit) */
} ct_device_options;

typedef struct ct_device ct_device;
typedef struct ct_buffer ct_buffer;

/** CPU, index 0, no limit. */
CT_API ct_device_options ct_device_options_default(void);

/** Parse "cpu", "cuda" (index 0) or "cuda:N" (N a decimal in [0, 1024)) into o->kind and
 *  o->index; CT_EINVAL naming the text and the accepted forms otherwise. */
CT_API ct_status ct_device_parse(const char *name, ct_device_options *o);

/** Open a device. CPU: the process's CPU device (one shared object; a limit applies to
 *  ct_alloc as ct_memory_set_limit does). CUDA: loads libctorch_cuda.so (once), checks the
 *  driver against the build's CUDA version and opens GPU `index` with its own stream,
 *  memory pool and statistics. Errors: CT_EUNSUPPORTED with the cause (library not found or
 *  not built, no GPU, driver older than the build's CUDA naming both versions, index out of
 *  range naming the count). Open a device once and share it; ct_device_close releases it. */
CT_API ct_status ct_device_open(const ct_device_options *o, ct_device **out);

/** The CPU device; never fails, never needs closing. */
CT_API ct_device *ct_device_cpu(void);

/** Release a device opened by ct_device_open (its buffers must be freed first: otherwise
 *  CT_EINVAL naming the live bytes, and the device stays open). NULL and the CPU device: no-op. */
CT_API ct_status ct_device_close(ct_device *d);

CT_API ct_device_kind ct_device_get_kind(const ct_device *d);
CT_API int ct_device_index(const ct_device *d);
/** "cpu" or "cuda:N"; valid while the device is open. */
CT_API const char *ct_device_name(const ct_device *d);
/** One line describing it: "cpu (AMD EPYC 7B13, 2 threads)", "cuda:0 (NVIDIA H200, 139.8 GiB,
 *  sm_90, driver 13.0, runtime 13.0)"; valid while the device is open. */
CT_API const char *ct_device_describe(const ct_device *d);

/** Wait until the device has finished the work queued on it. */
CT_API ct_status ct_device_sync(ct_device *d);

/** Memory this device holds through ctorch. */
CT_API void ct_device_memory_stats(const ct_device *d, ct_memory_stats_t *out);
/** Set the peak to the current bytes. */
CT_API void ct_device_reset_peak(ct_device *d);
/** Cap the bytes this device may hold (0: none); allocations past it fail with CT_ENOMEM. */
CT_API void ct_device_set_memory_limit(ct_device *d, size_t bytes);

/** What `ctorch version` prints about the CUDA backend: "cuda: NVIDIA H200 (driver 13.0,
 *  runtime 13.0) from <file>" or "cuda: not loaded: <why>". Loads the library if needed;
 *  never fails; valid until the next call on the thread. */
CT_API const char *ct_cuda_describe(void);

/** The fused linear + cross-entropy (ct_linear_cross_entropy_forward_backward's contract) on
 *  device d: every pointer of out, grads (NULL: forward only), in and o->class_weight is d's
 *  memory (a CUDA tensor's data pointer, say). grad_scale is the upstream gradient (of every
 *  row with CT_REDUCTION_NONE). Targets must be in range or ignore_index (the caller checks:
 *  a device's ids are not read on the host). The work is queued on d's stream; ct_device_sync
 *  waits for it. CT_EUNSUPPORTED when d has no fused loss. */
CT_API ct_status ct_device_linear_cross_entropy(ct_device *d, const ct_ce_outputs *out,
                                                const ct_lce_grads *grads, float grad_scale,
                                                const ct_lce_inputs *in, const ct_ce_options *o);

/** Flags of ct_device_linear_cross_entropy_ex. */
#define CT_LCE_F32_GRADS 1u /**< bf16 h and W: keep the logits' gradient in f32 and run the two
                                 gradient GEMMs (dh = G W, dW = G^T h) in f32, the CPU's numerics.
                                 Without it a GPU rounds G to bf16 (nearest even) and runs them on
                                 bf16 operands with f32 accumulation, as PyTorch's bf16 path does
                                 (and far faster). No effect on f32 inputs or on the CPU device
                                 (which always keeps f32). */

/** ct_device_linear_cross_entropy with a per-row upstream gradient and flags: grad_rows (d's
 *  memory, N floats; reduction CT_REDUCTION_NONE only, CT_EINVAL otherwise) is row n's
 *  upstream gradient (as dloss of ct_linear_cross_entropy_backward); NULL: grad_scale as in
 *  ct_device_linear_cross_entropy. flags: 0 or CT_LCE_F32_GRADS (others: CT_EINVAL).
 *  ct_device_linear_cross_entropy is this call with grad_rows NULL and flags 0. Both bound
 *  the device's scratch by o->scratch_bytes (0: the device's own budget, 1 GiB on CUDA; the
 *  tiling is described in docs/cuda.md). */
CT_API ct_status ct_device_linear_cross_entropy_ex(ct_device *d, const ct_ce_outputs *out,
                                                   const ct_lce_grads *grads, float grad_scale,
                                                   const float *grad_rows, unsigned flags,
                                                   const ct_lce_inputs *in, const ct_ce_options *o);

/* ---- FlexAttention on device memory ---------------------------------------------------- */
/* ct_flex_attention_forward / _backward (ctorch/attention.h) on device d. The tensors are
 * ct_tensor views whose data is d's memory: a view of one of d's buffers
 * (ct_tensor_wrap_buffer; its buffer must be d's) or, with buffer NULL, a device pointer
 * from elsewhere (a CUDA tensor's data pointer, say; ct_tensor_wrap). Shapes are
 * attention.h's: q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev], out [B, Hq, L, Ev],
 * lse [B, Hq, L] f32.
 *
 * On the CPU device the calls are ct_flex_attention_forward / _backward (any strides, any
 * mods, the same bits). On a GPU (the flex slots, docs/cuda.md):
 * - memory layout [B, L, H, E]: q, out, dout and dq are the [B, Hq, L, E] views of contiguous
 *   [B, L, Hq, E] memory (strides L*Hq*E, E, Hq*E, 1: PyTorch's x.transpose(1, 2) of a
 *   contiguous [B, L, H, E] tensor), k, v, dk and dv the same over Hkv; lse contiguous;
 * - one dtype (f32 or bf16) for q, k, v, out, dout and the gradients; Ev == E (up to 256);
 *   L == S (else CT_EUNSUPPORTED); block sizes 64 and 128;
 * - the mods the GPU evaluates: mask_mods made by ct_mask_mod_causal, _sliding_window,
 *   _prefix_lm, _document, _noop and ct_mask_mod_and of them with at most one compiled mask
 *   (ctorch/jit.h); score_mods ct_score_mod_softcap, _alibi and compiled ones (their arrays
 *   uploaded per call, a table's gradient added into param_grad). Others (a callback of
 *   yours, or, not, relative_bias) answer CT_EUNSUPPORTED naming the mod: compile it as an
 *   expression (ctorch/jit.h) to run it on a GPU.
 * The work is queued on d's stream (ct_device_sync waits; a call with compiled mods waits for
 * the device itself before it returns). */

/** A block mask made ready for device d: on a GPU its lists (and a document mask's ids)
 *  copied to the device once, to be used by any number of calls. */
typedef struct ct_device_block_mask ct_device_block_mask;

/** Make m ready for device d (upload on a GPU; nothing is copied on the CPU). m must stay
 *  alive and unchanged while the handle is used (the CPU reads it; the handle refers to it).
 *  Errors: NULLs (CT_EINVAL), a mask_mod the GPU cannot evaluate (CT_EUNSUPPORTED naming it),
 *  device memory (CT_ENOMEM). Free with ct_device_block_mask_free (before closing d). */
CT_API ct_status ct_device_block_mask_upload(ct_device *d, const ct_block_mask *m,
                                             ct_device_block_mask **out);
/** NULL is a no-op. */
CT_API void ct_device_block_mask_free(ct_device_block_mask *m);
/** The device and the host mask a handle was made for. */
CT_API ct_device *ct_device_block_mask_device(const ct_device_block_mask *m);
CT_API const ct_block_mask *ct_device_block_mask_host(const ct_device_block_mask *m);

/** Forward on d. mask NULL: every pair attends; else a handle made for d (another device's:
 *  CT_EINVAL). lse may be NULL (not kept). opt NULL: the defaults. */
CT_API ct_status ct_device_flex_attention_forward(ct_device *d, const ct_tensor *q,
                                                  const ct_tensor *k, const ct_tensor *v,
                                                  const ct_device_block_mask *mask,
                                                  const ct_flex_options *opt, ct_tensor *out,
                                                  ct_tensor *lse);

/** Backward on d from the forward's out and lse; dq, dk, dv may be NULL (skipped). */
CT_API ct_status ct_device_flex_attention_backward(ct_device *d, const ct_tensor *q,
                                                   const ct_tensor *k, const ct_tensor *v,
                                                   const ct_tensor *out, const ct_tensor *lse,
                                                   const ct_tensor *dout,
                                                   const ct_device_block_mask *mask,
                                                   const ct_flex_options *opt, ct_tensor *dq,
                                                   ct_tensor *dk, ct_tensor *dv);

/* ---- buffers --------------------------------------------------------------------------- */

/** One allocation of `bytes` (> 0) on device d, uninitialised (64-byte aligned on the CPU,
 *  256 on a GPU). CT_ENOMEM names the device, the size and the limit. */
CT_API ct_status ct_buffer_alloc(ct_device *d, size_t bytes, ct_buffer **out);
/** Same, zero-filled. */
CT_API ct_status ct_buffer_zeros(ct_device *d, size_t bytes, ct_buffer **out);
/** NULL is a no-op. */
CT_API void ct_buffer_free(ct_buffer *b);
CT_API ct_device *ct_buffer_device(const ct_buffer *b);
CT_API size_t ct_buffer_size(const ct_buffer *b);
/** The buffer's address on its device (a host pointer for the CPU; a device pointer that the
 *  host must not dereference for a GPU). */
CT_API void *ct_buffer_data(const ct_buffer *b);
/** Copy host memory into [offset, offset + n) of b. CT_EINVAL when the range leaves b. */
CT_API ct_status ct_buffer_write(ct_buffer *b, size_t offset, const void *src, size_t n);
/** Copy [offset, offset + n) of b into host memory (waits for the device). */
CT_API ct_status ct_buffer_read(const ct_buffer *b, size_t offset, void *dst, size_t n);
/** Copy n bytes between buffers (on one device, or across devices through the host). */
CT_API ct_status ct_buffer_copy(ct_buffer *dst, size_t dst_offset, const ct_buffer *src,
                                size_t src_offset, size_t n);

#ifdef __cplusplus
}
#endif
#endif
