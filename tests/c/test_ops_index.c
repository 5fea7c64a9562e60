/* Gather, scatter and scatter-add along the last dim against naive loops: duplicates
 * (last k wins / summed in k order), K = 0, C = 1, K > C, gather backward as scatter-add,
 * thread-count independence and out-of-range indices. */
#include "test_util.h"

static void test_against_reference(void)
{
    const int64_t sizes[][3] = {{0, 4, 3}, {3, 4, 0},  {5, 1, 3},
                                {7, 9, 4}, {4, 6, 20}, {33, 100, 57}};
    int saved = ct_num_threads();
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t N = sizes[s][0], C = sizes[s][1], K = sizes[s][2];
        float *inp = malloc(sizeof(float) * (size_t)(N * C + 1));
        float *src = malloc(sizeof(float) * (size_t)(N * K + 1));
        float *got = malloc(sizeof(float) * (size_t)(N * (C > K ? C : K) + 1));
        float *want = malloc(sizeof(float) * (size_t)(N * (C > K ? C : K) + 1));
        float *first = malloc(sizeof(float) * (size_t)(N * C + 1));
        int64_t *index = malloc(sizeof(int64_t) * (size_t)(N * K + 1));
        t_fill(inp, (size_t)(N * C), -1, 1);
        t_fill(src, (size_t)(N * K), -1, 1);
        for (int64_t i = 0; i < N * K; i++)
            index[i] = (int64_t)(t_next() % (uint64_t)C);

        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++)
                want[n * K + k] = inp[n * C + index[n * K + k]];
        CHECK_OK(ct_gather_rows(got, inp, index, N, C, K));
        CHECK(memcmp(got, want, sizeof(float) * (size_t)(N * K)) == 0);

        for (int add = 0; add < 2; add++) {
            memcpy(want, inp, sizeof(float) * (size_t)(N * C));
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) {
                    float *d = &want[n * C + index[n * K + k]];
                    *d = add ? *d + src[n * K + k] : src[n * K + k];
                }
            for (int t = 1; t <= 3; t++) {
                CHECK_OK(ct_set_num_threads(t));
                memcpy(got, inp, sizeof(float) * (size_t)(N * C));
                CHECK_OK((add ? ct_scatter_add_rows : ct_scatter_rows)(got, src, index, N, C, K));
                CHECK(memcmp(got, want, sizeof(float) * (size_t)(N * C)) == 0);
                if (t == 1) memcpy(first, got, sizeof(float) * (size_t)(N * C));
                CHECK(memcmp(got, first, sizeof(float) * (size_t)(N * C)) == 0);
            }
        }
        free(inp), free(src), free(got), free(want), free(first), free(index);
    }
    CHECK_OK(ct_set_num_threads(saved));
}

static void test_duplicates_and_backward(void)
{
    /* row 0: column 2 three times -> last wins / 1+2+4; row 1: all distinct */
    float out[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    const float src[2][3] = {{1, 2, 4}, {8, 16, 32}};
    const int64_t index[2][3] = {{2, 2, 2}, {3, 0, 1}};
    CHECK_OK(ct_scatter_rows(&out[0][0], &src[0][0], &index[0][0], 2, 4, 3));
    CHECK(out[0][2] == 4 && out[0][0] == 0 && out[1][3] == 8 && out[1][0] == 16 && out[1][1] == 32);
    memset(out, 0, sizeof out);
    CHECK_OK(ct_scatter_add_rows(&out[0][0], &src[0][0], &index[0][0], 2, 4, 3));
    CHECK(out[0][2] == 7 && out[1][2] == 0 && out[1][1] == 32);

    /* gather backward: dinp = scatter_add(0, dout, index) is the exact gradient of
     * sum(dout * gather(inp)): d/dinp[n,c] = sum of dout[n,k] over k with index[n,k] == c */
    const int64_t N = 3, C = 5, K = 8;
    float dout[3 * 8], dinp[3 * 5] = {0};
    int64_t ix[3 * 8];
    for (int i = 0; i < N * K; i++)
        dout[i] = (float)(i % 5) - 2.0f, ix[i] = (int64_t)(t_next() % C);
    CHECK_OK(ct_scatter_add_rows(dinp, dout, ix, N, C, K));
    int ok = 1;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            float g = 0;
            for (int64_t k = 0; k < K; k++)
                if (ix[n * K + k] == c) g += dout[n * K + k];
            ok &= dinp[n * C + c] == g;
        }
    CHECK(ok);
}

static void test_bad_args(void)
{
    float inp[6] = {1, 2, 3, 4, 5, 6}, out[6] = {0}, keep[6];
    int64_t index[4] = {0, 1, 2, 3}; /* [2, 2]; index[1, 1] = 3 is out of C = 3 */
    int64_t neg[4] = {0, -1, 0, 0};
    memcpy(keep, out, sizeof out);
    CHECK_STATUS(ct_gather_rows(out, inp, index, 2, 3, 2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "index[1, 1] = 3") != NULL);
    CHECK(memcmp(out, keep, sizeof out) == 0);
    CHECK_STATUS(ct_scatter_rows(out, inp, neg, 2, 3, 2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "index[0, 1] = -1") != NULL);
    CHECK(memcmp(out, keep, sizeof out) == 0);
    CHECK_STATUS(ct_scatter_add_rows(out, inp, index, 2, 3, 2), CT_EINVAL);
    CHECK(memcmp(out, keep, sizeof out) == 0);
    CHECK_STATUS(ct_gather_rows(out, inp, index, 2, 0, 2), CT_EINVAL); /* C = 0, K > 0 */
    CHECK_STATUS(ct_gather_rows(out, inp, index, -1, 3, 2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "N must be") != NULL);
    CHECK_STATUS(ct_gather_rows(out, inp, index, 2, -3, 2), CT_EINVAL);
    CHECK_STATUS(ct_gather_rows(out, inp, index, 2, 3, -2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "K must be") != NULL);
    CHECK_STATUS(ct_gather_rows(out, inp, NULL, 2, 3, 2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "index") != NULL);
    CHECK_STATUS(ct_gather_rows(out, NULL, index, 2, 3, 2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "inp") != NULL);
    CHECK_STATUS(ct_scatter_rows(out, NULL, index, 2, 3, 2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "src") != NULL);
    CHECK_STATUS(ct_scatter_add_rows(NULL, inp, index, 2, 3, 2), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "out") != NULL);
    CHECK_STATUS(ct_gather_rows(out, inp, index, INT64_MAX, 3, 2), CT_EOVERFLOW);
    CHECK_OK(ct_gather_rows(NULL, NULL, NULL, 0, 3, 2));
    CHECK_OK(ct_scatter_add_rows(NULL, NULL, NULL, 2, 3, 0));
}

int main(void)
{
    test_against_reference();
    test_duplicates_and_backward();
    test_bad_args();
    return t_report("test_ops_index");
}
