/*
 * libctorch_cuda.so's private toolbox, shared by its .cu files (one per op family):
 * the backend context, errors, scratch memory, and every slot's implementation.
 *
 * Files and what they hold (each implements the slots listed for it; ct_cuda_ops in
 * cuda_backend.cu points the table at them):
 *   cuda_backend.cu      entry point, table, count/open/close/describe, errors, memory pool,
 *                        copies, memset, sync, driver check
 *   cuda_gemm.cu         gemm (cuBLASLt, loaded with dlopen; fixed workspace)
 *   cuda_elementwise.cu  add, scale, to_bf16, bias_add_rows, bias_grad_rows, swiglu fwd/bwd
 *   cuda_norm.cu         rmsnorm fwd/bwd, rope
 *   cuda_embed.cu        embed fwd/bwd
 *   cuda_optim.cu        adamw, sumsq
 *   cuda_loss.cu         ce fwd/bwd, fused linear + cross-entropy
 *   cuda_attn.cu         dense causal sdpa fwd/bwd
 *   cuda_flex.cu         flex fwd/bwd (block masks, built-in mods; see the block below);
 *                        kernels in cuda_flex_kernels.cuh
 *   cuda_flex_jit.cu     flex_jit_identity / _build / _load / _unload, compiled mods' launches
 *                        (NVRTC and the module text: cuda_flex_nvrtc.cpp, cuda_flex_jit.h)
 */
#ifndef CT_CUDA_INTERNAL_CUH
#define CT_CUDA_INTERNAL_CUH

#include "device/backend.h"

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* ---- errors (thread-local message; never printed) ----------------------------------------- */
/* Set the thread's message (printf format) and return status (a ct_status value). */
int ctcu_fail(int status, const char *fmt, ...);
/* 0 when e == cudaSuccess; otherwise ctcu_fail(CT_EINTERNAL or CT_ENOMEM for
 * cudaErrorMemoryAllocation, "<what>: <cudaGetErrorName>: <cudaGetErrorString>"). */
int ctcu_check(cudaError_t e, const char *what);
/* After a kernel launch: the launch error, if any (cudaGetLastError), as ctcu_check does. */
int ctcu_launched(const char *what);
const char *ctcu_last_error(void);

/* ---- the context -------------------------------------------------------------------------- */
cudaStream_t ctcu_stream(ct_backend *b);
int ctcu_device(ct_backend *b); /* the CUDA device index */
int ctcu_sm_count(ct_backend *b);
/* Stream-ordered scratch from the backend's pool (freed with ctcu_scratch_free, also
 * stream-ordered: safe to free right after queueing the kernels that use it). */
int ctcu_scratch(ct_backend *b, size_t bytes, void **out);
void ctcu_scratch_free(ct_backend *b, void *p);

/* ---- slots (signatures as in device/backend.h) -------------------------------------------- */
#ifdef __cplusplus
extern "C" {
#endif
int ctcu_gemm(ct_backend *b, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
              float alpha, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
              float *C, int64_t ldc, ct_dtype dtype);
/* Describe the GEMM library for ctorch version ("cuBLASLt 13.1.0 from libcublasLt.so.13" or
 * why it is not loaded); loads it on first use. */
const char *ctcu_gemm_describe(void);
void ctcu_gemm_close(ct_backend *b); /* release the handle and workspace of b */

int ctcu_add(ct_backend *b, float *out, const float *x, const float *y, int64_t n);
int ctcu_scale(ct_backend *b, float *x, float s, int64_t n);
int ctcu_to_bf16(ct_backend *b, uint16_t *dst, const float *src, int64_t n);
int ctcu_bias_add_rows(ct_backend *b, float *x, const float *bias, int64_t N, int64_t C);
int ctcu_bias_grad_rows(ct_backend *b, float *db, const float *d, int64_t N, int64_t C);
int ctcu_swiglu_fwd(ct_backend *b, float *out, const float *inp, int64_t N, int64_t F);
int ctcu_swiglu_bwd(ct_backend *b, float *dinp, const float *dout, const float *inp, int64_t N,
                    int64_t F);

int ctcu_rmsnorm_fwd(ct_backend *b, float *out, float *rstd, const float *inp,
                     const float *weight, int64_t N, int64_t C, float eps);
int ctcu_rmsnorm_bwd(ct_backend *b, float *dinp, float *dweight, const float *dout,
                     const float *inp, const float *weight, const float *rstd, int64_t N,
                     int64_t C);
int ctcu_rope(ct_backend *b, float *x, int64_t B, int64_t T, int64_t H, int64_t E,
              const float *inv_freq, bool backward);

int ctcu_embed_fwd(ct_backend *b, float *out, const int32_t *ids, const float *table, int64_t N,
                   int64_t V, int64_t D);
int ctcu_embed_bwd(ct_backend *b, float *dtable, const float *dout, const int32_t *ids,
                   int64_t N, int64_t V, int64_t D);

int ctcu_adamw(ct_backend *b, float *param, const float *grad, float *m, float *v, int64_t n,
               int64_t step, float lr, float beta1, float beta2, float eps, float weight_decay);
int ctcu_sumsq(ct_backend *b, double *out, const float *g, int64_t n);

int ctcu_ce_fwd(ct_backend *b, ct_ce_outputs *out, const float *logits, const int32_t *target,
                int64_t N, int64_t V, const ct_ce_options *o);
int ctcu_ce_bwd(ct_backend *b, float *dlogits, float grad_scale, const float *logits,
                const int32_t *target, int64_t N, int64_t V, const ct_ce_options *o);
int ctcu_lce(ct_backend *b, ct_ce_outputs *out, ct_lce_grads *grads, float grad_scale,
             const float *grad_rows, unsigned flags, const ct_lce_inputs *in,
             const ct_ce_options *o);

int ctcu_sdpa_fwd(ct_backend *b, const ct_attn_args *a);
int ctcu_sdpa_bwd(ct_backend *b, const ct_attn_args *a, const ct_attn_grads *g);
#ifdef __cplusplus
}
#endif

/* ---- added by the core files (cuda_backend.cu / cuda_gemm.cu) ----------------------------- */
/* The GEMM state of a backend (cuBLASLt handle, workspace, plan cache), owned by cuda_gemm.cu
 * and released by ctcu_gemm_close; NULL until the first GEMM. */
struct ctcu_gemm_state;
struct ctcu_gemm_state **ctcu_gemm_state_of(ct_backend *b);
/* cudaSetDevice(the backend's device), checked: the table's slots call it before the slot. */
int ctcu_use_device(ct_backend *b);

/* ---- added for flex attention (cuda_flex.cu: slots flex_fwd, flex_bwd) ------------------- */
#ifdef __cplusplus
extern "C" {
#endif
int ctcu_flex_fwd(ct_backend *b, const ct_flex_args *a);
int ctcu_flex_bwd(ct_backend *b, const ct_flex_args *a, const ct_attn_grads *g);
/* compiled (jit) mods (cuda_flex_jit.cu) */
int ctcu_flex_jit_identity(ct_backend *b, char *out, size_t cap);
int ctcu_flex_jit_build(ct_backend *b, const char *source, ct_dtype dtype, int64_t E, void **image,
                        size_t *len);
int ctcu_flex_jit_load(ct_backend *b, const void *image, size_t len, void **module);
void ctcu_flex_jit_unload(ct_backend *b, void *module);
#ifdef __cplusplus
}
#endif

/* Launch helpers. */
static inline unsigned ctcu_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : (b > 0x7fffffff ? 0x7fffffff : b));
}

#endif
