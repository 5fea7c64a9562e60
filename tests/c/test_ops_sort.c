/* Sort, argsort and top-k against a naive stable merge sort in torch's order of floats
 * (NaN largest, -0.0 == +0.0): values bit for bit and indices exactly, including ties. */
#include "test_util.h"

/* a strictly before b in ascending (desc = 0) or descending order */
static int before(float a, float b, int desc)
{
    if (desc) return (isnan(a) && !isnan(b)) || a > b;
    return (!isnan(a) && isnan(b)) || a < b;
}

/* Stable top-down merge sort of positions 0..C-1 (tmp: C scratch entries). */
static void merge_sort(const float *x, int64_t *idx, int64_t *tmp, int64_t n, int desc)
{
    if (n < 2) return;
    int64_t h = n / 2, i = 0, j = h, o = 0;
    merge_sort(x, idx, tmp, h, desc);
    merge_sort(x, idx + h, tmp, n - h, desc);
    while (i < h && j < n)
        tmp[o++] = before(x[idx[j]], x[idx[i]], desc) ? idx[j++] : idx[i++];
    while (i < h)
        tmp[o++] = idx[i++];
    while (j < n)
        tmp[o++] = idx[j++];
    memcpy(idx, tmp, sizeof(int64_t) * (size_t)n);
}

static void ref_sort(const float *x, int64_t C, int desc, int64_t *idx)
{
    int64_t *tmp = malloc(sizeof(int64_t) * (size_t)(C + 1));
    for (int64_t j = 0; j < C; j++)
        idx[j] = j;
    merge_sort(x, idx, tmp, C, desc);
    free(tmp);
}

/* Rows mixing few distinct values (many ties), NaN, infinities and signed zeros. */
static void fill_row(float *x, int64_t C, int kind)
{
    static const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f, -1.0f, 3.5f};
    for (int64_t j = 0; j < C; j++) {
        uint64_t r = t_next();
        if (kind == 0)
            x[j] = t_uniform(-1e4f, 1e4f);
        else if (kind == 1)
            x[j] = (float)(r % 5) - 2.0f;
        else
            x[j] = special[r % 8];
    }
}

static void test_sort_and_topk(void)
{
    const int64_t sizes[][2] = {{0, 5},  {4, 0},  {3, 1},   {5, 2},    {6, 31},
                                {6, 32}, {6, 33}, {4, 100}, {3, 1000}, {2, 70000}};
    int saved = ct_num_threads();
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t N = sizes[s][0], C = sizes[s][1], NC = N * C;
        float *x = malloc(sizeof(float) * (size_t)(NC + 1));
        float *vals = malloc(sizeof(float) * (size_t)(NC + 1));
        float *wvals = malloc(sizeof(float) * (size_t)(NC + 1));
        int64_t *idx = malloc(sizeof(int64_t) * (size_t)(NC + 1));
        int64_t *idx2 = malloc(sizeof(int64_t) * (size_t)(NC + 1));
        int64_t *widx = malloc(sizeof(int64_t) * (size_t)(NC + 1));
        for (int64_t r = 0; r < N; r++)
            fill_row(x + r * C, C, (int)(r % 3));
        for (int desc = 0; desc < 2; desc++) {
            for (int64_t r = 0; r < N; r++) {
                ref_sort(x + r * C, C, desc, widx + r * C);
                for (int64_t j = 0; j < C; j++)
                    wvals[r * C + j] = x[r * C + widx[r * C + j]];
            }
            CHECK_OK(ct_set_num_threads(1 + (int)(s % 3)));
            CHECK_OK(ct_sort_rows(vals, idx, x, N, C, desc, true));
            CHECK(memcmp(vals, wvals, sizeof(float) * (size_t)NC) == 0);
            CHECK(memcmp(idx, widx, sizeof(int64_t) * (size_t)NC) == 0);
            CHECK_OK(ct_argsort_rows(idx2, x, N, C, desc, false));
            CHECK(memcmp(idx2, widx, sizeof(int64_t) * (size_t)NC) == 0);
            CHECK_OK(ct_sort_rows(vals, NULL, x, N, C, desc, false));
            CHECK(memcmp(vals, wvals, sizeof(float) * (size_t)NC) == 0);

            /* top-k is the first k of the stable order: both the heap and the sort path */
            const int64_t ks[] = {0, 1, 2, C / 8, C / 8 + 1, C / 2, C - 1, C};
            for (size_t q = 0; q < 8; q++) {
                int64_t k = ks[q];
                if (k < 0 || k > C) continue;
                CHECK_OK(ct_topk_rows(vals, idx, x, N, C, k, desc, true));
                int ok = 1;
                for (int64_t r = 0; r < N; r++)
                    for (int64_t j = 0; j < k; j++) {
                        ok &= memcmp(&vals[r * k + j], &wvals[r * C + j], sizeof(float)) == 0;
                        ok &= idx[r * k + j] == widx[r * C + j];
                    }
                CHECK(ok);
                CHECK_OK(ct_topk_rows(NULL, idx2, x, N, C, k, desc, false));
                CHECK(memcmp(idx2, idx, sizeof(int64_t) * (size_t)(N * k)) == 0);
            }
        }
        free(x), free(vals), free(wvals), free(idx), free(idx2), free(widx);
    }
    CHECK_OK(ct_set_num_threads(saved));

    /* the documented torch examples */
    float t[4] = {1, NAN, 3, NAN};
    int64_t ti[4];
    CHECK_OK(ct_argsort_rows(ti, t, 1, 4, false, true));
    CHECK(ti[0] == 0 && ti[1] == 2 && ti[2] == 1 && ti[3] == 3);
    CHECK_OK(ct_argsort_rows(ti, t, 1, 4, true, true));
    CHECK(ti[0] == 1 && ti[1] == 3 && ti[2] == 2 && ti[3] == 0);
    float u[5] = {1, 2, 2, 2, 0}, uv[2];
    CHECK_OK(ct_topk_rows(uv, ti, u, 1, 5, 2, true, true));
    CHECK(uv[0] == 2 && uv[1] == 2 && ti[0] == 1 && ti[1] == 2);
    CHECK_OK(ct_topk_rows(uv, ti, u, 1, 5, 2, false, true));
    CHECK(uv[0] == 0 && uv[1] == 1 && ti[0] == 4 && ti[1] == 0);
}

static void test_bad_args(void)
{
    float x[6] = {0}, v[6];
    int64_t ix[6];
    CHECK_STATUS(ct_topk_rows(v, ix, x, 2, 3, 4, true, true), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "k = 4") != NULL);
    CHECK_STATUS(ct_topk_rows(v, ix, x, 2, 3, -1, true, true), CT_EINVAL);
    CHECK_STATUS(ct_sort_rows(v, ix, x, -2, 3, false, false), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "N must be") != NULL);
    CHECK_STATUS(ct_sort_rows(v, ix, x, 2, -3, false, false), CT_EINVAL);
    CHECK_STATUS(ct_sort_rows(v, ix, NULL, 2, 3, false, false), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "inp") != NULL);
    CHECK_STATUS(ct_argsort_rows(NULL, x, 2, 3, false, false), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "indices") != NULL);
    CHECK_STATUS(ct_sort_rows(v, ix, x, INT64_MAX, 3, false, false), CT_EOVERFLOW);
    CHECK_OK(ct_sort_rows(NULL, NULL, NULL, 0, 3, false, false));
    CHECK_OK(ct_topk_rows(NULL, NULL, x, 2, 3, 0, true, true));
    /* scratch honours the memory limit */
    ct_memory_stats_t st;
    ct_memory_stats(&st);
    ct_memory_set_limit(st.current_bytes + 16);
    float big[64];
    t_fill(big, 64, -1, 1);
    float bo[64];
    CHECK_STATUS(ct_sort_rows(bo, NULL, big, 1, 64, false, false), CT_ENOMEM);
    ct_memory_set_limit(0);
}

int main(void)
{
    test_sort_and_topk();
    test_bad_args();
    return t_report("test_ops_sort");
}
