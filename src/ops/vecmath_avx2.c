#include "ops/vecmath.h"

#include <immintrin.h>
#include <math.h>

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x) for x <= ~88: range reduction by ln 2, degree-6 polynomial; below -87.3 the
 * result is 0 (so exp(-inf) == 0 for masked entries); NaN propagates. */
static inline __m256 exp256(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.3762626647949f);
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 ln2hi = _mm256_set1_ps(0.693359375f), ln2lo = _mm256_set1_ps(-2.12194440e-4f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(x, hi);
    __m256 xc = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, ln2hi, xc);
    r = _mm256_fnmadd_ps(n, ln2lo, r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 r2 = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(p, r2, r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    res = _mm256_andnot_ps(under, res);
    /* NaN inputs: the compare above is false for NaN, min/max dropped it; restore it. */
    __m256 isnan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_blendv_ps(res, x, isnan);
}

float ct_vmax_avx2(const float *x, int64_t n)
{
    __m256 m = _mm256_set1_ps(-INFINITY);
    __m256 nanacc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        nanacc = _mm256_or_ps(nanacc, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(m, v);
    }
    float r = hmax(m);
    if (_mm256_movemask_ps(nanacc)) return NAN;
    for (; i < n; i++) {
        if (isnan(x[i])) return NAN;
        if (x[i] > r) r = x[i];
    }
    return r;
}

float ct_vexpsum_avx2(float *out, const float *x, float m, int64_t n)
{
    __m256 acc = _mm256_setzero_ps(), mv = _mm256_set1_ps(m);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        if (out) _mm256_storeu_ps(out + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (i < n) {
        float buf[8], ob[8];
        int k = (int)(n - i);
        for (int j = 0; j < 8; j++) buf[j] = j < k ? x[i + j] - m : -INFINITY;
        __m256 e = exp256(_mm256_loadu_ps(buf));
        _mm256_storeu_ps(ob, e);
        if (out)
            for (int j = 0; j < k; j++) out[i + j] = ob[j];
        acc = _mm256_add_ps(acc, e);
    }
    return hsum(acc);
}

float ct_vsum_avx2(const float *x, int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
    float s = hsum(acc);
    for (; i < n; i++) s += x[i];
    return s;
}

float ct_vdot_avx2(const float *a, const float *b, int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void ct_vaxpy_avx2(float *y, float a, const float *x, int64_t n)
{
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

void ct_vscale_avx2(float *x, float a, int64_t n)
{
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), av));
    for (; i < n; i++) x[i] *= a;
}
