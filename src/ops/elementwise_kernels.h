/* Activation and RMSNorm row kernels (private). Scalar bodies are in elementwise.c and
 * norm.c, the AVX2 + FMA bodies in elementwise_avx2.c; bf selects bf16 arrays (0: f32). */
#ifndef CT_ELEMENTWISE_KERNELS_H
#define CT_ELEMENTWISE_KERNELS_H

#include <stdint.h>

void ct_act_forward_avx2(int kind, void *out, const void *inp, int64_t n, int bf);
void ct_act_backward_avx2(int kind, void *dinp, const void *dout, const void *inp, int64_t n,
                          int bf);
void ct_swiglu_forward_avx2(void *out, const void *a, const void *b, int64_t n, int bf);
void ct_swiglu_backward_avx2(void *da, void *db, const void *dout, const void *a, const void *b,
                             int64_t n, int bf);
void ct_rmsnorm_forward_rows_avx2(void *out, float *rstd, const void *inp, const void *w,
                                  int64_t r0, int64_t r1, int64_t C, float eps, int bf);
void ct_rmsnorm_backward_rows_avx2(void *dinp, float *pw, const void *dout, const void *inp,
                                   const void *w, const float *rstd, int64_t r0, int64_t r1,
                                   int64_t C, int bf);

#endif
