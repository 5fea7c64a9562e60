/* Row primitives shared by softmax, cross-entropy and attention: vectorised where the CPU
 * allows, scalar otherwise (kernel tables: vecmath_kernels.h). Each is a pure function of its inputs, so
 * results never depend on how rows are split across threads. The AVX2 exp is a
 * polynomial with relative error below 2e-7 (the scalar path uses expf). */
#ifndef CT_OPS_VECMATH_H
#define CT_OPS_VECMATH_H

#include <stdint.h>

/* max of x[0..n); -INFINITY for n == 0. NaNs propagate. */
float ct_vmax(const float *x, int64_t n);
/* sum_i exp(x[i] - m), also storing the terms into out when out != NULL (out may be x). */
float ct_vexpsum(float *out, const float *x, float m, int64_t n);
/* sum_i x[i] */
float ct_vsum(const float *x, int64_t n);
/* sum_i a[i] * b[i] */
float ct_vdot(const float *a, const float *b, int64_t n);
/* y[i] += a * x[i] */
void ct_vaxpy(float *y, float a, const float *x, int64_t n);
/* x[i] *= a */
void ct_vscale(float *x, float a, int64_t n);

#endif
