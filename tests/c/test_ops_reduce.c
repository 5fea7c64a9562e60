/* Row reductions against naive references: the documented summation order bit for bit,
 * thread-count independence, max/min/argmax ties and NaN, empty rows, bad arguments. */
#include "test_util.h"

/* The order documented in ops_index.h, written out plainly. */
static double ref_block(const float *x, int64_t n)
{
    double l[8] = {0};
    for (int64_t i = 0; i < n; i++)
        l[i % 8] += (double)x[i];
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static float ref_sum(const float *x, int64_t n, int mean)
{
    double s = 0;
    for (int64_t b = 0; b < n; b += 4096)
        s += ref_block(x + b, n - b < 4096 ? n - b : 4096);
    return (float)(mean ? s / (double)n : s);
}

static void ref_extreme(const float *x, int64_t n, int sign, float *v, int64_t *ix)
{
    int64_t bi = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) {
            bi = i;
            break;
        }
        if (sign > 0 ? x[i] > x[bi] : x[i] < x[bi]) bi = i;
    }
    *v = x[bi];
    *ix = bi;
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static void test_sums(void)
{
    const int64_t sizes[][2] = {{0, 3},    {3, 0},      {1, 1},    {5, 7},   {17, 4096},
                                {3, 4097}, {1, 100003}, {2, 9000}, {40, 300}};
    int saved = ct_num_threads();
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t N = sizes[s][0], C = sizes[s][1];
        float *x = malloc(sizeof(float) * (size_t)(N * C + 1));
        float *got = malloc(sizeof(float) * (size_t)(N + 1));
        float *want = malloc(sizeof(float) * (size_t)(N + 1));
        float *first = malloc(sizeof(float) * (size_t)(N + 1));
        t_fill(x, (size_t)(N * C), -3, 5);
        for (int mean = 0; mean < 2; mean++) {
            for (int64_t r = 0; r < N; r++)
                want[r] = ref_sum(x + r * C, C, mean);
            for (int t = 1; t <= 3; t++) {
                CHECK_OK(ct_set_num_threads(t));
                CHECK_OK((mean ? ct_mean_rows : ct_sum_rows)(got, x, N, C));
                CHECK(same_bits(got, want, (size_t)N));
                if (t == 1) memcpy(first, got, sizeof(float) * (size_t)N);
                CHECK(same_bits(got, first, (size_t)N));
            }
            if (C == 0)
                for (int64_t r = 0; r < N; r++)
                    CHECK(mean ? isnan(got[r]) : got[r] == 0.0f);
            /* and close to the exact sum (long double as the oracle) */
            for (int64_t r = 0; r < N && C; r++) {
                long double e = 0;
                for (int64_t c = 0; c < C; c++)
                    e += x[r * C + c];
                float ef = (float)(mean ? e / C : e);
                CHECK(t_close(&got[r], &ef, 1, 1e-6, 1e-6, "sum vs exact"));
            }
        }
        /* the whole-tensor sum is the one-row sum */
        float all, one;
        for (int t = 1; t <= 3; t++) {
            CHECK_OK(ct_set_num_threads(t));
            CHECK_OK(ct_sum_all(&all, x, N * C));
            one = ref_sum(x, N * C, 0);
            CHECK(same_bits(&all, &one, 1));
        }
        free(x), free(got), free(want), free(first);
    }
    CHECK_OK(ct_set_num_threads(saved));
    float z = 1.0f;
    CHECK_OK(ct_sum_all(&z, NULL, 0));
    CHECK(z == 0.0f);
    /* NaN and inf propagate */
    float v[5] = {1, 2, NAN, 4, 5}, w[4] = {1, INFINITY, 2, 3}, o;
    CHECK_OK(ct_sum_rows(&o, v, 1, 5));
    CHECK(isnan(o));
    CHECK_OK(ct_mean_rows(&o, w, 1, 4));
    CHECK(isinf(o) && o > 0);
}

static void test_extremes(void)
{
    /* rows: ties, NaN first/middle/last, -inf only, single element */
    float x[6][5] = {{1, 3, 3, 2, 3},
                     {NAN, 1, 2, NAN, 0},
                     {-1, 5, NAN, 9, NAN},
                     {2, 2, 2, 2, NAN},
                     {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
                     {0.0f, -0.0f, 0.0f, -1, -1}};
    float v[6], wv;
    int64_t ix[6], ai[6], wi;
    CHECK_OK(ct_max_rows(v, ix, &x[0][0], 6, 5));
    CHECK_OK(ct_argmax_rows(ai, &x[0][0], 6, 5));
    for (int r = 0; r < 6; r++) {
        ref_extreme(x[r], 5, 1, &wv, &wi);
        CHECK(same_bits(&v[r], &wv, 1) && ix[r] == wi && ai[r] == wi);
    }
    CHECK(ix[0] == 1 && ix[1] == 0 && ix[2] == 2 && ix[3] == 4 && ix[4] == 0 && ix[5] == 0);
    CHECK_OK(ct_min_rows(v, ix, &x[0][0], 6, 5));
    for (int r = 0; r < 6; r++) {
        ref_extreme(x[r], 5, -1, &wv, &wi);
        CHECK(same_bits(&v[r], &wv, 1) && ix[r] == wi);
    }
    CHECK(ix[0] == 0 && ix[5] == 3);

    /* NaN at every position of a 37-wide row (vector body and tail), a second NaN later,
     * and rows of signed zeros / infinities */
    {
        enum { W = 37 };
        float rows[W + 3][W];
        for (int r = 0; r < W + 3; r++)
            for (int j = 0; j < W; j++)
                rows[r][j] = (float)((j * 7 + r) % 11) - 5.0f;
        for (int r = 0; r < W; r++) {
            rows[r][r] = NAN;
            if (r + 9 < W) rows[r][r + 9] = NAN;
        }
        for (int j = 0; j < W; j++) {
            rows[W][j] = (j % 3) ? -0.0f : 0.0f;
            rows[W + 1][j] = (j % 2) ? INFINITY : -INFINITY;
            rows[W + 2][j] = -INFINITY;
        }
        float rv[W + 3];
        int64_t ri[W + 3];
        for (int sign = -1; sign <= 1; sign += 2) {
            CHECK_OK((sign > 0 ? ct_max_rows : ct_min_rows)(rv, ri, &rows[0][0], W + 3, W));
            int ok = 1;
            for (int r = 0; r < W + 3; r++) {
                ref_extreme(rows[r], W, sign, &wv, &wi);
                ok &= same_bits(&rv[r], &wv, 1) && ri[r] == wi;
                if (r < W) ok &= ri[r] == r;
            }
            CHECK(ok);
        }
    }

    /* random rows, C = 1 and wide rows, values only / indices only */
    const int64_t sizes[][2] = {{9, 1}, {31, 257}, {2, 5000}};
    for (size_t s = 0; s < 3; s++) {
        int64_t N = sizes[s][0], C = sizes[s][1];
        float *a = malloc(sizeof(float) * (size_t)(N * C));
        float *vals = malloc(sizeof(float) * (size_t)N);
        int64_t *idx = malloc(sizeof(int64_t) * (size_t)N);
        for (int64_t i = 0; i < N * C; i++)
            a[i] = (float)(t_next() % 50);
        for (int sign = -1; sign <= 1; sign += 2) {
            CHECK_OK((sign > 0 ? ct_max_rows : ct_min_rows)(vals, NULL, a, N, C));
            CHECK_OK((sign > 0 ? ct_max_rows : ct_min_rows)(NULL, idx, a, N, C));
            for (int64_t r = 0; r < N; r++) {
                ref_extreme(a + r * C, C, sign, &wv, &wi);
                CHECK(vals[r] == wv && idx[r] == wi);
            }
        }
        free(a), free(vals), free(idx);
    }
}

static void test_bad_args(void)
{
    float x[4] = {0}, o[2];
    int64_t ix[2];
    CHECK_OK(ct_max_rows(NULL, NULL, NULL, 0, 0));
    CHECK_OK(ct_sum_rows(NULL, NULL, 0, 5));
    CHECK_OK(ct_argmax_rows(NULL, NULL, 0, 5));
    CHECK_STATUS(ct_max_rows(o, ix, x, 2, 0), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "C must be >= 1") != NULL);
    CHECK_STATUS(ct_argmax_rows(ix, x, 2, 0), CT_EINVAL);
    CHECK_STATUS(ct_argmax_rows(NULL, x, 2, 2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "indices") != NULL);
    CHECK_STATUS(ct_sum_rows(o, x, -1, 2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "N must be") != NULL);
    CHECK_STATUS(ct_mean_rows(o, x, 2, -2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "C must be") != NULL);
    CHECK_STATUS(ct_sum_rows(NULL, x, 2, 2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "out") != NULL);
    CHECK_STATUS(ct_sum_rows(o, NULL, 2, 2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "inp") != NULL);
    CHECK_STATUS(ct_min_rows(o, ix, NULL, 2, 2), CT_EINVAL);
    CHECK_STATUS(ct_sum_rows(o, x, INT64_MAX, 4), CT_EOVERFLOW);
    CHECK_STATUS(ct_sum_all(NULL, x, 4), CT_EINVAL);
    CHECK_STATUS(ct_sum_all(o, x, -4), CT_EINVAL);
    CHECK_STATUS(ct_sum_all(o, NULL, 4), CT_EINVAL);
}

int main(void)
{
    test_sums();
    test_extremes();
    test_bad_args();
    return t_report("test_ops_reduce");
}
