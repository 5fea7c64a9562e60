/* Rotary position embedding (rotate-half pairs (x[i], x[i + E/2])), forward and backward.
 *
 * The cos/sin table [T, E] (cos in the first half of each row, sin in the second) is built
 * once per call in f32 exactly as Hugging Face's LlamaRotaryEmbedding does:
 * inv_freq = 1 / base^(f32(2i) / E), angle = f32(position) * inv_freq. The rotation of each
 * (b, t, h) row then reads the table row of t; every output depends on its own pair only,
 * so results do not depend on the thread count, and out may alias inp. The rotation goes
 * through the kernel tables of rope_kernels.h (scalar and AVX2 bodies give the same bits). */
#include "core/internal.h"
#include "ops/rope_kernels.h"
#include "ctorch/ops.h"

#include <math.h>

typedef struct {
    float *out;
    const float *inp;
    const int32_t *positions;
    const float *inv_freq;
    float *tab;
    int64_t T, H, P;
    float sign; /* +1 forward, -1 backward (the inverse rotation) */
} rope_ctx;

static void table_body(void *arg, int64_t t0, int64_t t1, int tid)
{
    const rope_ctx *c = arg;
    for (int64_t t = t0; t < t1; t++) {
        float p = c->positions ? (float)c->positions[t] : (float)t;
        float *row = c->tab + t * 2 * c->P;
        for (int64_t i = 0; i < c->P; i++) {
            float ang = p * c->inv_freq[i];
            row[i] = cosf(ang);
            row[c->P + i] = sinf(ang);
        }
    }
}

#if defined(__x86_64__)
#define ROPE_AVX2 &ct_rope_avx2
#else
#define ROPE_AVX2 &ct_rope_scalar
#endif
#if defined(__aarch64__)
#define ROPE_NEON &ct_rope_neon
#define ROPE_SVE &ct_rope_sve
#else
#define ROPE_NEON &ct_rope_scalar
#define ROPE_SVE &ct_rope_scalar
#endif

/* Memory bound: avx512 uses the AVX2 body. */
const ct_rope_kernels *const ct_rope_tables[CT_ISA_COUNT] = {
    [CT_ISA_SCALAR] = &ct_rope_scalar, [CT_ISA_AVX2] = ROPE_AVX2, [CT_ISA_AVX512] = ROPE_AVX2,
    [CT_ISA_NEON] = ROPE_NEON,         [CT_ISA_SVE] = ROPE_SVE,
};

static void rotate_body(void *arg, int64_t r0, int64_t r1, int tid)
{
    const rope_ctx *c = arg;
    CT_KERNELS(ct_rope_tables)->rotate_rows(c->out, c->inp, c->tab, r0, r1, c->T, c->H, c->P, c->sign);
}

static ct_status rope(const char *fn, float *out, const char *out_name, const float *inp,
                      const char *inp_name, const int32_t *positions, int64_t B, int64_t T,
                      int64_t H, int64_t E, float base, const float *given, float sign)
{
    if (B < 0 || T < 0 || H < 0 || E < 0)
        return ct_error(CT_EINVAL,
                        "%s: sizes must be >= 0 (got B = %lld, T = %lld, H = %lld, "
                        "E = %lld)",
                        fn, (long long)B, (long long)T, (long long)H, (long long)E);
    if (E % 2)
        return ct_error(CT_EINVAL,
                        "%s: E (head dim) must be even to form rotate-half pairs (got %lld)", fn,
                        (long long)E);
    if (!given && (!(base > 0.0f) || isinf(base)))
        return ct_error(CT_EINVAL, "%s: base must be finite and > 0 (got %g)", fn, (double)base);
    int64_t rows, total, te;
    if (__builtin_mul_overflow(B, T, &rows) || __builtin_mul_overflow(rows, H, &rows) ||
        __builtin_mul_overflow(rows, E, &total) || total > INT64_MAX / 4 ||
        __builtin_mul_overflow(T, E, &te) || te > INT64_MAX / 8)
        return ct_error(CT_EOVERFLOW, "%s: B * T * H * E overflows", fn);
    if (total == 0) return CT_OK;
    if (!out)
        return ct_error(CT_EINVAL, "%s: %s must not be NULL (%lld elements)", fn, out_name,
                        (long long)total);
    if (!inp)
        return ct_error(CT_EINVAL, "%s: %s must not be NULL (%lld elements)", fn, inp_name,
                        (long long)total);

    int64_t P = E / 2;
    if (given)
        for (int64_t i = 0; i < P; i++)
            if (!isfinite(given[i]))
                return ct_error(CT_EINVAL, "%s: inv_freq[%lld] = %g is not finite", fn,
                                (long long)i, (double)given[i]);
    float *buf = NULL;
    CT_TRY(ct_alloc((void **)&buf, (size_t)(te + P) * sizeof(float)));
    float *inv_freq = buf + te;
    for (int64_t i = 0; i < P; i++)
        inv_freq[i] = given ? given[i] : 1.0f / powf(base, (float)(2 * i) / (float)E);
    rope_ctx c = {out, inp, positions, inv_freq, buf, T, H, P, sign};
    ct_parallel_for(T, table_body, &c);
    ct_parallel_for(rows, rotate_body, &c);
    ct_free(buf);
    return CT_OK;
}

ct_status ct_rope_forward(float *out, const float *inp, const int32_t *positions, int64_t B,
                          int64_t T, int64_t H, int64_t E, float base)
{
    return rope("ct_rope_forward", out, "out", inp, "inp", positions, B, T, H, E, base, NULL, 1.0f);
}

ct_status ct_rope_backward(float *dinp, const float *dout, const int32_t *positions, int64_t B,
                           int64_t T, int64_t H, int64_t E, float base)
{
    return rope("ct_rope_backward", dinp, "dinp", dout, "dout", positions, B, T, H, E, base, NULL, -1.0f);
}

ct_status ct_rope_forward_freqs(float *out, const float *inp, const int32_t *positions, int64_t B,
                                int64_t T, int64_t H, int64_t E, const float *inv_freq)
{
    if (!inv_freq && E > 0)
        return ct_error(CT_EINVAL, "ct_rope_forward_freqs: inv_freq must not be NULL");
    return rope("ct_rope_forward_freqs", out, "out", inp, "inp", positions, B, T, H, E, 1.0f,
                inv_freq, 1.0f);
}

ct_status ct_rope_backward_freqs(float *dinp, const float *dout, const int32_t *positions,
                                 int64_t B, int64_t T, int64_t H, int64_t E, const float *inv_freq)
{
    if (!inv_freq && E > 0)
        return ct_error(CT_EINVAL, "ct_rope_backward_freqs: inv_freq must not be NULL");
    return rope("ct_rope_backward_freqs", dinp, "dinp", dout, "dout", positions, B, T, H, E, 1.0f,
                inv_freq, -1.0f);
}
