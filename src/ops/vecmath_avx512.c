/* AVX-512 row primitives (see vecmath_kernels.h), bitwise the AVX2 bodies of vecmath_avx2.c:
 * exp is simd_x86.h's at 16 lanes, and the sum of exps is accumulated 8 lanes at a time in
 * the AVX2 order (cv_acc8), so the exp work doubles its width while the sum keeps its bits.
 * max, sum and dot are one dependent chain of 8-lane operations in the AVX2 order (latency
 * bound: a wider body could only go faster by changing the order, hence the bits), so they
 * are the AVX2 bodies. */
#include "ops/vecmath_kernels.h"
#include "simd/simd_avx512.h"

static float vmax_avx512(const float *x, int64_t n) { return ct_vec_avx2.vmax(x, n); }
static float vsum_avx512(const float *x, int64_t n) { return ct_vec_avx2.vsum(x, n); }
static float vdot_avx512(const float *a, const float *b, int64_t n) { return ct_vec_avx2.vdot(a, b, n); }

static float vexpsum_avx512(float *out, const float *x, float m, int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    const __m512 mv = _mm512_set1_ps(m);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = cv_exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        if (out) _mm512_storeu_ps(out + i, e);
        acc = cv_acc8(acc, e);
    }
    if (i < n) { /* padded lanes are -inf: exp gives 0, as the AVX2 tail's buffer */
        int64_t k = n - i;
        __mmask16 mk = (__mmask16)((1u << k) - 1);
        __m512 e = cv_exp(_mm512_sub_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), mk, x + i), mv));
        if (out) _mm512_mask_storeu_ps(out + i, mk, e);
        acc = k > 8 ? cv_acc8(acc, e) : _mm256_add_ps(acc, cv_lo8(e));
    }
    return ct_hsum256(acc);
}

/* y += a x: 16 lanes, then one masked 8-lane step and a scalar tail, as the AVX2 body
 * (whose tail is a separate multiply and add, not an FMA). */
static void vaxpy_avx512(float *y, float a, const float *x, int64_t n)
{
    const __m512 av = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i + 8 <= n) {
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm512_castps512_ps256(av), _mm256_loadu_ps(x + i),
                                                _mm256_loadu_ps(y + i)));
        i += 8;
    }
    for (; i < n; i++) y[i] += a * x[i];
}

static void vscale_avx512(float *x, float a, int64_t n)
{
    const __m512 av = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), av));
    for (; i < n; i++) x[i] *= a;
}

const ct_vec_kernels ct_vec_avx512 = {vmax_avx512, vexpsum_avx512, vsum_avx512,
                                      vdot_avx512, vaxpy_avx512,   vscale_avx512};
