/* Row sort, argsort and top-k.
 *
 * Each value is mapped to a 32-bit key whose unsigned order is torch's order of floats
 * (-inf < ... < -0.0 == +0.0 < ... < inf < NaN); descending order flips the key bits.
 * Rows are then ordered by (key, position), which is the stable order in both directions:
 * an LSD radix sort over the key bytes (insertion sort for short rows) for sort, and a
 * bounded heap for top-k with small k. Both give the first k of the same total order, so
 * every path returns the same answer. Rows are dealt out to scratch slots in fixed
 * contiguous ranges; a row's result never depends on which slot ran it. */
#include "core/internal.h"
#include "ctorch/ops.h"

#include <math.h>
#include <string.h>

#define SORT_INSERTION_MAX 32

typedef struct {
    uint32_t key;
    int64_t idx;
} kv;

static inline uint32_t float_key(float x)
{
    if (isnan(x)) return 0xFFFFFFFFu;
    if (x == 0.0f) x = 0.0f; /* -0.0 ties with +0.0 */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Sort positions of x[0..C) by (key, position) with key = float_key ^ flip. k0/i0 and
 * k1/i1 are scratch of C entries each; returns the array holding the sorted positions. */
static int64_t *sort_positions(const float *x, int64_t C, uint32_t flip, uint32_t *k0, int64_t *i0,
                               uint32_t *k1, int64_t *i1)
{
    for (int64_t j = 0; j < C; j++)
        k0[j] = float_key(x[j]) ^ flip, i0[j] = j;
    if (C <= SORT_INSERTION_MAX) {
        for (int64_t j = 1; j < C; j++) {
            uint32_t k = k0[j];
            int64_t i = i0[j], m = j;
            for (; m > 0 && k0[m - 1] > k; m--)
                k0[m] = k0[m - 1], i0[m] = i0[m - 1];
            k0[m] = k, i0[m] = i;
        }
        return i0;
    }
    for (int shift = 0; shift < 32; shift += 8) {
        int64_t count[256] = {0};
        for (int64_t j = 0; j < C; j++)
            count[(k0[j] >> shift) & 255]++;
        if (count[(k0[0] >> shift) & 255] == C) continue; /* every key shares this byte */
        int64_t pos = 0;
        for (int b = 0; b < 256; b++) {
            int64_t c = count[b];
            count[b] = pos;
            pos += c;
        }
        for (int64_t j = 0; j < C; j++) {
            int64_t d = count[(k0[j] >> shift) & 255]++;
            k1[d] = k0[j], i1[d] = i0[j];
        }
        uint32_t *tk = k0;
        int64_t *ti = i0;
        k0 = k1, i0 = i1, k1 = tk, i1 = ti;
    }
    return i0;
}

/* (a.key, a.idx) > (b.key, b.idx) */
static inline int kv_after(kv a, kv b)
{
    return a.key > b.key || (a.key == b.key && a.idx > b.idx);
}

static void sift_down(kv *h, int64_t i, int64_t n)
{
    for (;;) {
        int64_t l = 2 * i + 1, m = i;
        if (l < n && kv_after(h[l], h[m])) m = l;
        if (l + 1 < n && kv_after(h[l + 1], h[m])) m = l + 1;
        if (m == i) return;
        kv t = h[i];
        h[i] = h[m], h[m] = t;
        i = m;
    }
}

/* The first k (1 <= k <= C) of x's (key, position) order, in order, into h[0..k). */
static void topk_heap(const float *x, int64_t C, int64_t k, uint32_t flip, kv *h)
{
    for (int64_t j = 0; j < k; j++)
        h[j].key = float_key(x[j]) ^ flip, h[j].idx = j;
    for (int64_t i = k / 2 - 1; i >= 0; i--)
        sift_down(h, i, k); /* max-heap: root is worst */
    for (int64_t j = k; j < C; j++) {
        uint32_t key = float_key(x[j]) ^ flip;
        if (key < h[0].key) { /* a later position never wins a tie */
            h[0].key = key, h[0].idx = j;
            sift_down(h, 0, k);
        }
    }
    for (int64_t end = k - 1; end > 0; end--) {
        kv t = h[0];
        h[0] = h[end], h[end] = t;
        sift_down(h, 0, end);
    }
}

typedef struct {
    float *values;
    int64_t *indices;
    const float *inp;
    int64_t N, C, k; /* k = C for a full sort */
    uint32_t flip;
    int heap;
    unsigned char *scratch;
    size_t slot_bytes;
    int64_t slots;
} sort_ctx;

static void sort_slot_body(void *p, int64_t s0, int64_t s1, int tid)
{
    sort_ctx *c = p;
    for (int64_t s = s0; s < s1; s++) {
        unsigned char *m = c->scratch + (size_t)s * c->slot_bytes;
        for (int64_t r = c->N * s / c->slots; r < c->N * (s + 1) / c->slots; r++) {
            const float *x = c->inp + r * c->C;
            float *vo = c->values ? c->values + r * c->k : NULL;
            int64_t *io = c->indices ? c->indices + r * c->k : NULL;
            if (c->heap) {
                kv *h = (kv *)m;
                topk_heap(x, c->C, c->k, c->flip, h);
                for (int64_t j = 0; j < c->k; j++) {
                    if (vo) vo[j] = x[h[j].idx];
                    if (io) io[j] = h[j].idx;
                }
            } else {
                int64_t *i0 = (int64_t *)m, *i1 = i0 + c->C;
                uint32_t *k0 = (uint32_t *)(i1 + c->C), *k1 = k0 + c->C;
                const int64_t *pos = sort_positions(x, c->C, c->flip, k0, i0, k1, i1);
                for (int64_t j = 0; j < c->k; j++) {
                    if (vo) vo[j] = x[pos[j]];
                    if (io) io[j] = pos[j];
                }
            }
        }
    }
}

static ct_status sort_run(const char *fn, float *values, int64_t *indices, const float *inp,
                          int64_t N, int64_t C, int64_t k, bool descending)
{
    if (N < 0) return ct_error(CT_EINVAL, "%s: N must be >= 0, got %lld", fn, (long long)N);
    if (C < 0) return ct_error(CT_EINVAL, "%s: C must be >= 0, got %lld", fn, (long long)C);
    size_t bytes;
    if (!ct_mul_size((size_t)N, (size_t)C, &bytes))
        return ct_error(CT_EOVERFLOW, "%s: N * C overflows", fn);
    if (N && C && !inp) return ct_error(CT_EINVAL, "%s: inp must not be NULL", fn);
    if (N == 0 || k == 0 || (!values && !indices)) return CT_OK;

    sort_ctx c = {values, indices, inp, N, C, k, descending ? 0xFFFFFFFFu : 0u, 0, NULL, 0, 0};
    c.heap = C > SORT_INSERTION_MAX && k * 8 <= C;
    size_t per = c.heap ? sizeof(kv) : 2 * (sizeof(int64_t) + sizeof(uint32_t));
    size_t count = (size_t)(c.heap ? k : C), total;
    c.slots = ct_num_threads() < N ? ct_num_threads() : N;
    if (!ct_mul_size(per, count, &c.slot_bytes) ||
        !ct_mul_size(c.slot_bytes, (size_t)c.slots, &total))
        return ct_error(CT_EOVERFLOW, "%s: scratch size overflows (C = %lld)", fn, (long long)C);
    CT_TRY(ct_alloc((void **)&c.scratch, total));
    ct_parallel_for(c.slots, sort_slot_body, &c);
    ct_free(c.scratch);
    return CT_OK;
}

ct_status ct_sort_rows(float *values, int64_t *indices, const float *inp, int64_t N, int64_t C,
                       bool descending, bool stable)
{
    return sort_run("ct_sort_rows", values, indices, inp, N, C, C, descending);
}

ct_status ct_argsort_rows(int64_t *indices, const float *inp, int64_t N, int64_t C, bool descending,
                          bool stable)
{
    if (N > 0 && C > 0 && !indices)
        return ct_error(CT_EINVAL, "ct_argsort_rows: indices must not be NULL");
    return sort_run("ct_argsort_rows", NULL, indices, inp, N, C, C, descending);
}

ct_status ct_topk_rows(float *values, int64_t *indices, const float *inp, int64_t N, int64_t C,
                       int64_t k, bool largest, bool sorted)
{
    if (C >= 0 && (k < 0 || k > C))
        return ct_error(CT_EINVAL, "ct_topk_rows: k = %lld must be in [0, C = %lld]", (long long)k,
                        (long long)C);
    return sort_run("ct_topk_rows", values, indices, inp, N, C, k, largest);
}
