/* AVX2 + FMA row primitives (see vecmath_kernels.h). exp is ct_exp256 (simd/simd_avx2.h). */
#include "ops/vecmath_kernels.h"
#include "simd/simd_avx2.h"

static float ct_vmax_avx2(const float *x, int64_t n)
{
    __m256 m = _mm256_set1_ps(-INFINITY);
    __m256 nanacc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        nanacc = _mm256_or_ps(nanacc, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(m, v);
    }
    float r = ct_hmax256(m);
    if (_mm256_movemask_ps(nanacc)) return NAN;
    for (; i < n; i++) {
        if (isnan(x[i])) return NAN;
        if (x[i] > r) r = x[i];
    }
    return r;
}

static float ct_vexpsum_avx2(float *out, const float *x, float m, int64_t n)
{
    __m256 acc = _mm256_setzero_ps(), mv = _mm256_set1_ps(m);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = ct_exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        if (out) _mm256_storeu_ps(out + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (i < n) {
        float buf[8], ob[8];
        int k = (int)(n - i);
        for (int j = 0; j < 8; j++) buf[j] = j < k ? x[i + j] - m : -INFINITY;
        __m256 e = ct_exp256(_mm256_loadu_ps(buf));
        _mm256_storeu_ps(ob, e);
        if (out)
            for (int j = 0; j < k; j++) out[i + j] = ob[j];
        acc = _mm256_add_ps(acc, e);
    }
    return ct_hsum256(acc);
}

static float ct_vsum_avx2(const float *x, int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
    float s = ct_hsum256(acc);
    for (; i < n; i++) s += x[i];
    return s;
}

static float ct_vdot_avx2(const float *a, const float *b, int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = ct_hsum256(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void ct_vaxpy_avx2(float *y, float a, const float *x, int64_t n)
{
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void ct_vscale_avx2(float *x, float a, int64_t n)
{
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), av));
    for (; i < n; i++) x[i] *= a;
}

const ct_vec_kernels ct_vec_avx2 = {ct_vmax_avx2, ct_vexpsum_avx2, ct_vsum_avx2,
                                    ct_vdot_avx2, ct_vaxpy_avx2,   ct_vscale_avx2};
