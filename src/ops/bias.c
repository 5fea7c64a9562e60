/* Row-broadcast bias add, bias fill and bias gradient, and a parallel zero fill: the loops a
 * training step used to run serially (src/model/gpt.c, ct_linear_forward / _backward).
 *
 * Determinism: the add and fill write each element from its inputs alone. The gradient's
 * threads own blocks of BIAS_COLS columns and walk all rows in order, accumulating into
 * db[j] itself: the additions are those of the serial loop
 * `for n: for j: db[j] += d[n, j]`, so the bits are the same for any thread count. */
#include "core/internal.h"

#include <string.h>

#define BIAS_COLS 16       /* columns a gradient task owns (one 64-byte line of floats) */
#define MIN_WORK 16384     /* elements below which a chunk is not worth a thread */

typedef struct {
    float *x;
    const float *b, *d;
    int64_t N, C;
} bias_ctx;

static int64_t grain_for(int64_t per_index)
{
    if (per_index < 1) per_index = 1;
    int64_t g = MIN_WORK / per_index;
    return g < 1 ? 1 : g;
}

static void add_body(void *p, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const bias_ctx *c = p;
    const int64_t C = c->C;
    const float *restrict b = c->b;
    for (int64_t n = r0; n < r1; n++) {
        float *restrict x = c->x + n * C;
        for (int64_t j = 0; j < C; j++) x[j] += b[j];
    }
}

static void fill_body(void *p, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const bias_ctx *c = p;
    for (int64_t n = r0; n < r1; n++) memcpy(c->x + n * c->C, c->b, (size_t)c->C * sizeof(float));
}

static void grad_body(void *p, int64_t b0, int64_t b1, int tid)
{
    (void)tid;
    const bias_ctx *c = p;
    int64_t c0 = b0 * BIAS_COLS, c1 = b1 * BIAS_COLS < c->C ? b1 * BIAS_COLS : c->C;
    /* Column strips of up to 256 in registers / L1, rows in order. */
    for (int64_t s0 = c0; s0 < c1; s0 += 256) {
        int64_t w = c1 - s0 < 256 ? c1 - s0 : 256;
        float acc[256];
        memcpy(acc, c->x + s0, (size_t)w * sizeof(float));
        for (int64_t n = 0; n < c->N; n++) {
            const float *restrict d = c->d + n * c->C + s0;
            for (int64_t j = 0; j < w; j++) acc[j] += d[j];
        }
        memcpy(c->x + s0, acc, (size_t)w * sizeof(float));
    }
}

static void zero_body(void *p, int64_t b0, int64_t b1, int tid)
{
    (void)tid;
    const bias_ctx *c = p;
    int64_t e = b1 * MIN_WORK < c->N ? b1 * MIN_WORK : c->N;
    memset(c->x + b0 * MIN_WORK, 0, (size_t)(e - b0 * MIN_WORK) * sizeof(float));
}

void ct_bias_add_rows(float *x, const float *b, int64_t N, int64_t C)
{
    if (N <= 0 || C <= 0) return;
    bias_ctx c = {x, b, NULL, N, C};
    ct_parallel_for_grain(N, grain_for(C), add_body, &c);
}

void ct_bias_fill_rows(float *x, const float *b, int64_t N, int64_t C)
{
    if (N <= 0 || C <= 0) return;
    bias_ctx c = {x, b, NULL, N, C};
    ct_parallel_for_grain(N, grain_for(C), fill_body, &c);
}

void ct_bias_grad_rows(float *db, const float *d, int64_t N, int64_t C)
{
    if (N <= 0 || C <= 0) return;
    bias_ctx c = {db, NULL, d, N, C};
    ct_parallel_for_grain((C + BIAS_COLS - 1) / BIAS_COLS, grain_for(N * BIAS_COLS), grad_body, &c);
}

void ct_zero_floats(float *x, int64_t n)
{
    if (n <= 0) return;
    bias_ctx c = {x, NULL, NULL, n, 0};
    ct_parallel_for_grain((n + MIN_WORK - 1) / MIN_WORK, 4, zero_body, &c);
}
