/* The linear layers and embedding of mapped bf16 / f16 weights (src/model/gpt_linear.c)
 * against a naive reference in double on the widened weights: the GEMV (decode) and the
 * panel path, with and without bias and accumulation, row lengths not a multiple of 8, more
 * rows than one panel, rows longer than 16384 values (panels of 16 rows) and than 65536 (split
 * in column blocks); the GEMV on half
 * weights is bitwise the f32 GEMV on the widened weights; every path is bitwise the same for
 * 1, 2 and 3 threads; bad ids are refused. */
#include "model/gpt_internal.h"
#include "test_util.h"

static float rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(*s >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
}

static void widen(float *dst, const uint16_t *src, ct_dtype dt, size_t n)
{
    if (dt == CT_DTYPE_BF16)
        ct_convert_bf16_to_f32(dst, src, n);
    else
        ct_convert_f16_to_f32(dst, src, n);
}

/* out = inp W^T (+ out0) + bias in double. */
static void naive(float *out, int64_t ldo, const float *inp, const float *w, const float *bias,
                  int64_t N, int64_t D, int64_t V, bool acc)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t v = 0; v < V; v++) {
            double s = acc ? out[n * ldo + v] : 0;
            for (int64_t d = 0; d < D; d++)
                s += (double)inp[n * D + d] * w[v * D + d];
            if (bias) s += bias[v];
            out[n * ldo + v] = (float)s;
        }
}

static void one_case(ct_dtype dt, int64_t N, int64_t D, int64_t V, bool bias, bool acc, bool gemv)
{
    uint64_t seed = (uint64_t)(N * 1000003 + D * 101 + V) ^ (uint64_t)dt;
    size_t nw = (size_t)(V * D);
    int64_t ldo = V + 3;
    float *wf = malloc(nw * sizeof(float)), *inp = malloc((size_t)(N * D) * sizeof(float));
    uint16_t *wh = malloc(nw * sizeof(uint16_t));
    float *b = malloc((size_t)V * sizeof(float)), *init = malloc((size_t)(N * ldo) * sizeof(float));
    float *want = malloc((size_t)(N * ldo) * sizeof(float)), *got = malloc((size_t)(N * ldo) * sizeof(float));
    float *f32 = malloc((size_t)(N * ldo) * sizeof(float));
    CHECK(wf && inp && wh && b && init && want && got && f32);
    for (size_t i = 0; i < nw; i++)
        wf[i] = rnd(&seed);
    if (dt == CT_DTYPE_BF16)
        ct_convert_f32_to_bf16(wh, wf, nw);
    else
        ct_convert_f32_to_f16(wh, wf, nw);
    widen(wf, wh, dt, nw); /* the weights the file holds, in f32 */
    for (int64_t i = 0; i < N * D; i++)
        inp[i] = rnd(&seed);
    for (int64_t i = 0; i < V; i++)
        b[i] = rnd(&seed);
    for (int64_t i = 0; i < N * ldo; i++)
        init[i] = rnd(&seed);
    memcpy(want, init, (size_t)(N * ldo) * sizeof(float));
    naive(want, ldo, inp, wf, bias ? b : NULL, N, D, V, acc);
    gpt_half h = {wh, dt};
    gpt_half none = {NULL, CT_DTYPE_F32};
    float *first = malloc((size_t)(N * ldo) * sizeof(float));
    for (int t = 1; t <= 3; t++) {
        CHECK_OK(ct_set_num_threads(t));
        memcpy(got, init, (size_t)(N * ldo) * sizeof(float));
        CHECK_OK(gpt_linear(got, ldo, inp, NULL, h, bias ? b : NULL, N, D, V, acc, gemv));
        bool ok = true;
        for (int64_t n = 0; n < N; n++)
            for (int64_t v = 0; v < V; v++) {
                float g = got[n * ldo + v], w = want[n * ldo + v];
                if (!(fabsf(g - w) <= 2e-6f * (float)D + 1e-5f * fabsf(w))) ok = false;
            }
        for (int64_t n = 0; n < N; n++) /* the padding of each output row is untouched */
            for (int64_t v = V; v < ldo; v++)
                if (got[n * ldo + v] != init[n * ldo + v]) ok = false;
        if (!ok)
            fprintf(stderr, "  dt %d N %lld D %lld V %lld bias %d acc %d gemv %d threads %d\n",
                    (int)dt, (long long)N, (long long)D, (long long)V, bias, acc, gemv, t);
        CHECK(ok);
        if (t == 1)
            memcpy(first, got, (size_t)(N * ldo) * sizeof(float));
        else
            CHECK(memcmp(first, got, (size_t)(N * ldo) * sizeof(float)) == 0);
    }
    /* the half GEMV is the f32 GEMV of the widened weights, bit for bit */
    if (gemv && N <= GPT_GEMV_MAX) {
        memcpy(f32, init, (size_t)(N * ldo) * sizeof(float));
        CHECK_OK(gpt_linear(f32, ldo, inp, wf, none, bias ? b : NULL, N, D, V, acc, true));
        CHECK(memcmp(first, f32, (size_t)(N * ldo) * sizeof(float)) == 0);
    }
    free(first);
    free(wf);
    free(inp);
    free(wh);
    free(b);
    free(init);
    free(want);
    free(got);
    free(f32);
}

static void test_linear(void)
{
    static const int64_t shapes[][3] = {
        {1, 36, 96},   {3, 45, 36},    {4, 64, 700},  {5, 36, 700}, {38, 32, 48},
        {2, 17000, 40}, {9, 17000, 33}, {1, 7, 1},     {6, 8, 300}, {17, 130, 513},
        {5, 70000, 20}, {1, 70001, 3}, {3, 1030, 600}};
    ct_dtype dts[2] = {CT_DTYPE_BF16, CT_DTYPE_F16};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int d = 0; d < 2; d++)
            for (int mode = 0; mode < 8; mode++) {
                bool gemv = mode & 1, acc = mode & 2, bias = mode & 4;
                one_case(dts[d], shapes[i][0], shapes[i][1], shapes[i][2], bias, acc, gemv);
            }
}

static void test_embed(void)
{
    int64_t V = 50, D = 13, N = 6;
    uint64_t seed = 5;
    float wf[50 * 13], out[6 * 13];
    uint16_t wh[50 * 13];
    int32_t ids[6] = {0, 49, 7, 7, 3, 20};
    for (int i = 0; i < V * D; i++)
        wf[i] = rnd(&seed);
    ct_dtype dts[2] = {CT_DTYPE_BF16, CT_DTYPE_F16};
    for (int d = 0; d < 2; d++) {
        if (dts[d] == CT_DTYPE_BF16)
            ct_convert_f32_to_bf16(wh, wf, (size_t)(V * D));
        else
            ct_convert_f32_to_f16(wh, wf, (size_t)(V * D));
        float wide[50 * 13];
        widen(wide, wh, dts[d], (size_t)(V * D));
        gpt_half h = {wh, dts[d]};
        CHECK_OK(gpt_embed(out, ids, NULL, h, N, V, D));
        bool ok = true;
        for (int64_t n = 0; n < N; n++)
            ok = ok && memcmp(out + n * D, wide + ids[n] * D, (size_t)D * sizeof(float)) == 0;
        CHECK(ok);
        int32_t bad[2] = {1, 50};
        CHECK_STATUS(gpt_embed(out, bad, NULL, h, 2, V, D), CT_EINVAL);
        bad[1] = -1;
        CHECK_STATUS(gpt_embed(out, bad, NULL, h, 2, V, D), CT_EINVAL);
    }
    gpt_half h = {wh, CT_DTYPE_BF16};
    CHECK_STATUS(gpt_linear(out, 1, wf, NULL, h, NULL, 1, 13, 2, false, false), CT_EINVAL);
}

int main(void)
{
    int threads = ct_num_threads();
    test_linear();
    CHECK_OK(ct_set_num_threads(threads));
    test_embed();
    printf("test_model_mapped: %d checks, %d failures\n", t_checks, t_failures);
    return t_failures ? 1 : 0;
}
