/* Embedding forward (f32 and bf16 tables, int64 and int32 ids) and backward against naive
 * references; the backward's bits across thread counts; bad arguments. */
#include "test_util.h"

static void ref_backward(float *dtable, const float *dout, const int64_t *ids, int64_t N, int64_t D,
                         int64_t pad)
{
    for (int64_t n = 0; n < N; n++) {
        if (ids[n] == pad) continue;
        for (int64_t d = 0; d < D; d++)
            dtable[ids[n] * D + d] += dout[n * D + d];
    }
}

static void test_forward(void)
{
    const int64_t sizes[][3] = {{0, 5, 4}, {1, 1, 1}, {7, 3, 0}, {13, 11, 37}, {64, 50, 96}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t N = sizes[s][0], V = sizes[s][1], D = sizes[s][2];
        float *table = malloc(sizeof(float) * (size_t)(V * D + 1));
        uint16_t *tb = malloc(sizeof(uint16_t) * (size_t)(V * D + 1));
        float *out = malloc(sizeof(float) * (size_t)(N * D + 1));
        float *want = malloc(sizeof(float) * (size_t)(N * D + 1));
        int64_t *ids = malloc(sizeof(int64_t) * (size_t)(N + 1));
        int32_t *ids32 = malloc(sizeof(int32_t) * (size_t)(N + 1));
        t_fill(table, (size_t)(V * D), -2, 2);
        for (int64_t i = 0; i < V * D; i++)
            tb[i] = ct_f32_to_bf16(table[i]);
        for (int64_t n = 0; n < N; n++)
            ids[n] = (int64_t)(t_next() % (uint64_t)V), ids32[n] = (int32_t)ids[n];
        for (int64_t n = 0; n < N; n++)
            memcpy(want + n * D, table + ids[n] * D, sizeof(float) * (size_t)D);

        memset(out, 0xAB, sizeof(float) * (size_t)(N * D));
        CHECK_OK(ct_embedding_forward(out, ids, CT_DTYPE_I64, table, N, V, D));
        CHECK(memcmp(out, want, sizeof(float) * (size_t)(N * D)) == 0);
        memset(out, 0xAB, sizeof(float) * (size_t)(N * D));
        CHECK_OK(ct_embedding_forward(out, ids32, CT_DTYPE_I32, table, N, V, D));
        CHECK(memcmp(out, want, sizeof(float) * (size_t)(N * D)) == 0);

        for (int64_t n = 0; n < N; n++)
            for (int64_t d = 0; d < D; d++)
                want[n * D + d] = ct_bf16_to_f32(tb[ids[n] * D + d]);
        CHECK_OK(ct_embedding_forward_bf16(out, ids32, CT_DTYPE_I32, tb, N, V, D));
        CHECK(memcmp(out, want, sizeof(float) * (size_t)(N * D)) == 0);
        free(table), free(tb), free(out), free(want), free(ids), free(ids32);
    }
}

/* Gradients accumulate onto what dtable holds; the result equals the serial token-order
 * reference bit for bit, for several thread counts, with and without padding. */
static void test_backward(void)
{
    const int64_t N = 3000, V = 9, D = 70; /* many repeats of few ids; D not a block multiple */
    float *dout = malloc(sizeof(float) * N * D);
    float *base = malloc(sizeof(float) * V * D);
    float *want = malloc(sizeof(float) * V * D);
    float *got = malloc(sizeof(float) * V * D);
    float *first = malloc(sizeof(float) * V * D);
    int64_t *ids = malloc(sizeof(int64_t) * N);
    int32_t *ids32 = malloc(sizeof(int32_t) * N);
    t_fill(dout, (size_t)(N * D), -1, 1);
    t_fill(base, (size_t)(V * D), -1, 1);
    for (int64_t n = 0; n < N; n++) {
        uint64_t r = t_next() % 16; /* skewed: id 0 half of the time */
        ids[n] = r < 8 ? 0 : (int64_t)(r % (uint64_t)V);
        ids32[n] = (int32_t)ids[n];
    }
    const int64_t pads[] = {CT_EMBEDDING_NO_PADDING, 0, 4, -7};
    int saved = ct_num_threads();
    for (size_t p = 0; p < 4; p++) {
        memcpy(want, base, sizeof(float) * V * D);
        ref_backward(want, dout, ids, N, D, pads[p] < 0 ? -1 : pads[p]);
        for (int t = 1; t <= 4; t++) {
            CHECK_OK(ct_set_num_threads(t));
            memcpy(got, base, sizeof(float) * V * D);
            CHECK_OK(ct_embedding_backward(got, dout,
                                           t % 2 ? (const void *)ids : (const void *)ids32,
                                           t % 2 ? CT_DTYPE_I64 : CT_DTYPE_I32, N, V, D, pads[p]));
            CHECK(memcmp(got, want, sizeof(float) * V * D) == 0);
            if (t == 1) memcpy(first, got, sizeof(float) * V * D);
            CHECK(memcmp(got, first, sizeof(float) * V * D) == 0);
        }
        if (pads[p] >= 0) /* the padding row kept its old value exactly */
            CHECK(memcmp(got + pads[p] * D, base + pads[p] * D, sizeof(float) * D) == 0);
    }
    CHECK_OK(ct_set_num_threads(saved));

    /* The gradient exactly: with integer dout every sum is exact, so dtable[v, d] is the
     * count-weighted sum independent of order. */
    for (int64_t i = 0; i < N * D; i++)
        dout[i] = (float)((int64_t)(t_next() % 7) - 3);
    memset(got, 0, sizeof(float) * V * D);
    CHECK_OK(ct_embedding_backward(got, dout, ids, CT_DTYPE_I64, N, V, D, CT_EMBEDDING_NO_PADDING));
    int exact = 1;
    for (int64_t v = 0; v < V; v++)
        for (int64_t d = 0; d < D; d++) {
            double s = 0;
            for (int64_t n = 0; n < N; n++)
                if (ids[n] == v) s += dout[n * D + d];
            exact &= got[v * D + d] == (float)s;
        }
    CHECK(exact);
    /* Empty cases leave dtable alone. */
    memcpy(got, base, sizeof(float) * V * D);
    CHECK_OK(ct_embedding_backward(got, NULL, NULL, CT_DTYPE_I64, 0, V, D, -1));
    CHECK_OK(ct_embedding_backward(NULL, NULL, ids, CT_DTYPE_I64, N, V, 0, -1));
    CHECK(memcmp(got, base, sizeof(float) * V * D) == 0);
    free(dout), free(base), free(want), free(got), free(first), free(ids), free(ids32);
}

static void test_bad_args(void)
{
    float table[12] = {0}, out[8], dout[8] = {0};
    int64_t ids[2] = {1, 3};
    int32_t ids32[2] = {2, -1};
    float keep[8];
    for (int i = 0; i < 8; i++)
        out[i] = (float)i, keep[i] = (float)i;
    CHECK_STATUS(ct_embedding_forward(out, ids, CT_DTYPE_I64, table, 2, 3, 4), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "ids[1] = 3") != NULL);
    CHECK(memcmp(out, keep, sizeof out) == 0);
    CHECK_STATUS(ct_embedding_forward(out, ids32, CT_DTYPE_I32, table, 2, 3, 4), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "ids[1] = -1") != NULL);
    CHECK_STATUS(ct_embedding_forward(out, ids, CT_DTYPE_F32, table, 2, 4, 3), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "ids_dtype") != NULL);
    CHECK_STATUS(ct_embedding_forward(out, ids, CT_DTYPE_I64, table, -1, 4, 3), CT_EINVAL);
    CHECK_STATUS(ct_embedding_forward(out, ids, CT_DTYPE_I64, table, 2, 4, -3), CT_EINVAL);
    CHECK_STATUS(ct_embedding_forward(NULL, ids, CT_DTYPE_I64, table, 2, 4, 3), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "out") != NULL);
    CHECK_STATUS(ct_embedding_forward(out, NULL, CT_DTYPE_I64, table, 2, 4, 3), CT_EINVAL);
    CHECK_STATUS(ct_embedding_forward(out, ids, CT_DTYPE_I64, NULL, 2, 4, 3), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "table") != NULL);
    CHECK_STATUS(ct_embedding_forward(out, ids, CT_DTYPE_I64, table, 2, INT64_MAX, 3),
                 CT_EOVERFLOW);
    CHECK_STATUS(ct_embedding_forward_bf16(out, ids, CT_DTYPE_I64, NULL, 2, 4, 3), CT_EINVAL);
    CHECK_STATUS(ct_embedding_backward(table, dout, ids, CT_DTYPE_I64, 2, 3, 4, -1), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "ids[1] = 3") != NULL);
    CHECK_STATUS(ct_embedding_backward(table, dout, ids, CT_DTYPE_I64, 2, 4, 3, 4), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "padding_idx") != NULL);
    CHECK_STATUS(ct_embedding_backward(table, NULL, ids, CT_DTYPE_I64, 2, 4, 3, -1), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "dout") != NULL);
    CHECK_STATUS(ct_embedding_backward(NULL, dout, ids, CT_DTYPE_I64, 2, 4, 3, -1), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "dtable") != NULL);
}

int main(void)
{
    test_forward();
    test_backward();
    test_bad_args();
    return t_report("test_ops_embedding");
}
