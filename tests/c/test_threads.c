/* The thread pool (src/core/threads.c): every index covered exactly once for many shapes,
 * grains and thread counts; tid < ct_num_threads() and never shared by two chunks running
 * at once; nested regions serial on the calling thread; regions from 4 caller threads at
 * once; a caller whose region is stuck does not stop another caller's region; thread-count
 * changes between regions; the step's loops moved onto the pool (bias add / fill / gradient,
 * zeroing, the embedding gradient split by vocabulary) give the serial loops' bits at 1, 2,
 * 3 and 16 threads. Workers never call CHECK (the harness counters are plain ints):
 * they record into arrays that the main thread checks.
 *
 * `test_threads --bench` also prints the cost of an empty region (1, 2, 4, 8, 16 threads):
 * a measurement, never a pass/fail condition. */
#include "core/internal.h"
#include "test_util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- coverage ------------------------------------------------------------------------- */

typedef struct {
    unsigned char *hits; /* per index: chunks that covered it */
    atomic_int busy[256]; /* per tid: chunks running now */
    atomic_int bad_tid, shared_tid, bad_range, chunks;
    int T;
    int64_t n;
} cov_ctx;

static void cov_body(void *p, int64_t b, int64_t e, int tid)
{
    cov_ctx *c = p;
    atomic_fetch_add(&c->chunks, 1);
    if (tid < 0 || tid >= c->T) {
        atomic_fetch_add(&c->bad_tid, 1);
        return;
    }
    if (b < 0 || e > c->n || b >= e) atomic_fetch_add(&c->bad_range, 1);
    if (atomic_fetch_add(&c->busy[tid], 1) != 0) atomic_fetch_add(&c->shared_tid, 1);
    for (int64_t i = b; i < e && i >= 0 && i < c->n; i++) c->hits[i]++;
    atomic_fetch_sub(&c->busy[tid], 1);
}

/* Run one region and return 1 when every index was covered once and the tids were sound. */
static int run_cov(int64_t n, int64_t grain, int T)
{
    cov_ctx *c = calloc(1, sizeof *c);
    if (!c) return 0;
    c->hits = calloc((size_t)(n ? n : 1), 1);
    if (!c->hits) {
        free(c);
        return 0;
    }
    c->T = T;
    c->n = n;
    ct_parallel_for_grain(n, grain, cov_body, c);
    int ok = c->bad_tid == 0 && c->shared_tid == 0 && c->bad_range == 0;
    for (int64_t i = 0; i < n; i++) ok &= c->hits[i] == 1;
    if (n == 0) ok &= c->chunks == 0;
    if (n > 0 && n <= grain) ok &= c->chunks == 1; /* n <= grain: one call on the caller */
    free(c->hits);
    free(c);
    return ok;
}

static void test_coverage(void)
{
    const int Ts[] = {1, 2, 3, 4, 7, 16};
    const int64_t ns[] = {0, 1, 2, 5, 17, 64, 1000, 100003};
    const int64_t grains[] = {1, 3, 1000};
    for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++) {
        CHECK_OK(ct_set_num_threads(Ts[a]));
        CHECK(ct_num_threads() == Ts[a]);
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
            for (size_t g = 0; g < sizeof grains / sizeof *grains; g++) {
                int ok = run_cov(ns[b], grains[g], Ts[a]);
                if (!ok)
                    fprintf(stderr, "coverage failed: T %d n %lld grain %lld\n", Ts[a],
                            (long long)ns[b], (long long)grains[g]);
                CHECK(ok);
            }
    }
    /* the public entry point is grain 1 */
    CHECK_OK(ct_set_num_threads(5));
    cov_ctx *c = calloc(1, sizeof *c);
    c->hits = calloc(777, 1);
    c->T = 5;
    c->n = 777;
    ct_parallel_for(777, cov_body, c);
    int ok = c->bad_tid == 0 && c->shared_tid == 0;
    for (int i = 0; i < 777; i++) ok &= c->hits[i] == 1;
    CHECK(ok);
    free(c->hits);
    free(c);
}

/* ct_parallel_tasks: every index once, each chunk one index when the region runs in parallel
 * (one call over [0, n) on a single thread). */
static void test_tasks(void)
{
    const int Ts[] = {1, 2, 3, 16};
    const int64_t ns[] = {0, 1, 2, 7, 64, 1001};
    for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++) {
        CHECK_OK(ct_set_num_threads(Ts[a]));
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++) {
            int64_t n = ns[b];
            cov_ctx *c = calloc(1, sizeof *c);
            c->hits = calloc((size_t)(n ? n : 1), 1);
            c->T = Ts[a];
            c->n = n;
            ct_parallel_tasks(n, cov_body, c);
            int ok = c->bad_tid == 0 && c->shared_tid == 0 && c->bad_range == 0;
            for (int64_t i = 0; i < n; i++) ok &= c->hits[i] == 1;
            if (n == 0) ok &= c->chunks == 0;
            else if (Ts[a] == 1 || n == 1) ok &= c->chunks == 1;
            else ok &= c->chunks == n;
            if (!ok) fprintf(stderr, "ct_parallel_tasks failed: T %d n %lld\n", Ts[a], (long long)n);
            CHECK(ok);
            free(c->hits);
            free(c);
        }
    }
}

/* ---- nested regions -------------------------------------------------------------------- */

typedef struct {
    int64_t *inner_hits; /* [n_outer * n_inner] */
    int64_t n_inner;
    atomic_int wrong_thread, wrong_tid;
} nest_ctx;

typedef struct {
    nest_ctx *c;
    int64_t row;
    pthread_t self;
} inner_ctx;

static void inner_body(void *p, int64_t b, int64_t e, int tid)
{
    inner_ctx *ic = p;
    if (!pthread_equal(ic->self, pthread_self())) atomic_fetch_add(&ic->c->wrong_thread, 1);
    if (tid != 0 || b != 0 || e != ic->c->n_inner) atomic_fetch_add(&ic->c->wrong_tid, 1);
    for (int64_t i = b; i < e; i++) ic->c->inner_hits[ic->row * ic->c->n_inner + i]++;
}

static void outer_body(void *p, int64_t b, int64_t e, int tid)
{
    (void)tid;
    nest_ctx *c = p;
    for (int64_t r = b; r < e; r++) {
        inner_ctx ic = {c, r, pthread_self()};
        ct_parallel_for(c->n_inner, inner_body, &ic); /* serial, on this thread */
    }
}

static void test_nested(void)
{
    for (int T = 1; T <= 4; T++) {
        CHECK_OK(ct_set_num_threads(T));
        nest_ctx c = {NULL, 50, 0, 0};
        c.inner_hits = calloc(40 * 50, sizeof(int64_t));
        ct_parallel_for(40, outer_body, &c);
        int ok = 1;
        for (int i = 0; i < 40 * 50; i++) ok &= c.inner_hits[i] == 1;
        CHECK(ok);
        CHECK(c.wrong_thread == 0);
        CHECK(c.wrong_tid == 0);
        free(c.inner_hits);
    }
}

/* ---- regions from several callers at once ------------------------------------------------ */

typedef struct {
    int id;
    int failures;
} caller_arg;

static void *caller_main(void *p)
{
    caller_arg *a = p;
    uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(a->id + 1);
    for (int k = 0; k < 150; k++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        int64_t n = (int64_t)(r % 5000);
        int64_t grain = 1 + (int64_t)((r >> 20) % 50);
        if (!run_cov(n, grain, ct_num_threads())) a->failures++;
    }
    return NULL;
}

static void test_concurrent_callers(void)
{
    CHECK_OK(ct_set_num_threads(4));
    pthread_t th[4];
    caller_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (caller_arg){i, 0};
        CHECK(pthread_create(&th[i], NULL, caller_main, &args[i]) == 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) CHECK(args[i].failures == 0);
}

/* Caller A's region blocks (every chunk waits for B_done); caller B's region must still run
 * to completion meanwhile: with one region at a time for the whole process it could not,
 * and A's chunks give up after 20 s and record the failure (no hang). */
static atomic_int a_started, b_done, a_timed_out;

static void blocked_body(void *p, int64_t b, int64_t e, int tid)
{
    (void)p, (void)b, (void)e, (void)tid;
    atomic_store(&a_started, 1);
    double t0 = now_s();
    while (!atomic_load(&b_done)) {
        if (now_s() - t0 > 20.0) {
            atomic_store(&a_timed_out, 1);
            return;
        }
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

static void *caller_a(void *p)
{
    (void)p;
    ct_parallel_for(64, blocked_body, NULL);
    return NULL;
}

static void test_independent_progress(void)
{
    CHECK_OK(ct_set_num_threads(4));
    atomic_store(&a_started, 0);
    atomic_store(&b_done, 0);
    atomic_store(&a_timed_out, 0);
    pthread_t a;
    CHECK(pthread_create(&a, NULL, caller_a, NULL) == 0);
    double t0 = now_s();
    while (!atomic_load(&a_started) && now_s() - t0 < 20.0) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    CHECK(atomic_load(&a_started));
    int ok = run_cov(10000, 1, 4); /* B: runs while A's region holds every worker it can */
    atomic_store(&b_done, 1);
    pthread_join(a, NULL);
    CHECK(ok);
    CHECK(atomic_load(&a_timed_out) == 0);
}

/* ---- thread-count changes between regions ------------------------------------------------- */

static void test_count_changes(void)
{
    const int seq[] = {3, 1, 8, 2, 16, 5, 1, 4, 12, 2};
    for (int rep = 0; rep < 3; rep++)
        for (size_t i = 0; i < sizeof seq / sizeof *seq; i++) {
            CHECK_OK(ct_set_num_threads(seq[i]));
            CHECK(run_cov(3000 + (int64_t)i * 17, 1, seq[i]));
        }
    CHECK_STATUS(ct_set_num_threads(0), CT_EINVAL);
    CHECK_STATUS(ct_set_num_threads(257), CT_EINVAL);
}

/* ---- the step's loops on the pool: the serial loops' bits at any thread count ---------- */

static void test_step_loops(void)
{
    const int64_t shapes[][2] = {{1, 1}, {3, 17}, {1000, 1}, {257, 300}, {64, 4096}, {2048, 128}};
    const int Ts[] = {1, 2, 3, 16};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t N = shapes[s][0], C = shapes[s][1];
        float *d = malloc((size_t)(N * C) * sizeof(float)), *b = malloc((size_t)C * sizeof(float));
        float *ref = malloc((size_t)C * sizeof(float)), *db = malloc((size_t)C * sizeof(float));
        float *x = malloc((size_t)(N * C) * sizeof(float)), *xr = malloc((size_t)(N * C) * sizeof(float));
        t_fill(d, (size_t)(N * C), -1.0f, 1.0f);
        t_fill(b, (size_t)C, -1.0f, 1.0f);
        for (int64_t j = 0; j < C; j++) ref[j] = b[j] * 0.5f;
        for (int64_t n = 0; n < N; n++) /* the serial loops the step used to run */
            for (int64_t j = 0; j < C; j++) {
                ref[j] += d[n * C + j];
                xr[n * C + j] = d[n * C + j] + b[j];
            }
        for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++) {
            CHECK_OK(ct_set_num_threads(Ts[a]));
            for (int64_t j = 0; j < C; j++) db[j] = b[j] * 0.5f;
            ct_bias_grad_rows(db, d, N, C);
            CHECK(memcmp(db, ref, (size_t)C * sizeof(float)) == 0);
            memcpy(x, d, (size_t)(N * C) * sizeof(float));
            ct_bias_add_rows(x, b, N, C);
            CHECK(memcmp(x, xr, (size_t)(N * C) * sizeof(float)) == 0);
            ct_bias_fill_rows(x, b, N, C);
            int ok = 1;
            for (int64_t n = 0; n < N; n++) ok &= memcmp(x + n * C, b, (size_t)C * sizeof(float)) == 0;
            CHECK(ok);
            ct_zero_floats(x, N * C);
            ok = 1;
            for (int64_t i = 0; i < N * C; i++) ok &= x[i] == 0.0f;
            CHECK(ok);
        }
        free(d), free(b), free(ref), free(db), free(x), free(xr);
    }
    /* the embedding gradient split by vocabulary (narrow table, many threads): the bits of a
     * serial scatter in token order, skewed ids included */
    const int64_t N = 3000, V = 97, D = 20;
    int32_t *ids = malloc((size_t)N * sizeof(int32_t));
    float *dout = malloc((size_t)(N * D) * sizeof(float));
    float *ref = calloc((size_t)(V * D), sizeof(float)), *got = malloc((size_t)(V * D) * sizeof(float));
    for (int64_t n = 0; n < N; n++) ids[n] = (int32_t)(n % 3 ? t_next() % V : 5);
    t_fill(dout, (size_t)(N * D), -1.0f, 1.0f);
    for (int64_t n = 0; n < N; n++)
        if (ids[n] != 7) /* padding_idx 7 */
            for (int64_t j = 0; j < D; j++) ref[ids[n] * D + j] += dout[n * D + j];
    for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++) {
        CHECK_OK(ct_set_num_threads(Ts[a]));
        memset(got, 0, (size_t)(V * D) * sizeof(float));
        CHECK_OK(ct_embedding_backward(got, dout, ids, CT_DTYPE_I32, N, V, D, 7));
        CHECK(memcmp(got, ref, (size_t)(V * D) * sizeof(float)) == 0);
    }
    free(ids), free(dout), free(ref), free(got);
}

/* ---- empty-region cost (measurement only) -------------------------------------------------- */

static void empty_body(void *p, int64_t b, int64_t e, int tid)
{
    (void)p, (void)b, (void)e, (void)tid;
}

static void bench_empty(void)
{
    const int Ts[] = {1, 2, 4, 8, 16};
    printf("empty region (n = T chunks, grain 1): median of 7 runs of 20000 regions\n");
    for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++) {
        ct_set_num_threads(Ts[a]);
        double best[7];
        for (int r = 0; r < 7; r++) {
            const int reps = 20000;
            double t0 = now_s();
            for (int k = 0; k < reps; k++) ct_parallel_for(Ts[a], empty_body, NULL);
            best[r] = (now_s() - t0) / reps;
        }
        for (int i = 0; i < 7; i++)
            for (int k = i + 1; k < 7; k++)
                if (best[k] < best[i]) {
                    double t = best[i];
                    best[i] = best[k];
                    best[k] = t;
                }
        printf("  %2d threads: %8.2f us per region\n", Ts[a], best[3] * 1e6);
    }
}

/* All T chunks of a region must run at once (each waits for the others): the cost of
 * waking T - 1 workers, their joining and the end-of-region wait, beside the empty region
 * above (where the caller may finish every chunk before a worker arrives). */
static atomic_long meet_arrived;
static long meet_target;

static void meet_body(void *p, int64_t b, int64_t e, int tid)
{
    (void)p, (void)tid;
    for (int64_t i = b; i < e; i++) {
        atomic_fetch_add(&meet_arrived, 1);
        for (int k = 0; atomic_load(&meet_arrived) < meet_target; k++)
            if (k > 64) sched_yield();
    }
}

static void bench_meet(void)
{
    const int Ts[] = {2, 4, 8, 16};
    printf("region whose T chunks meet (T threads run at once): median of 5 runs of 2000\n");
    for (size_t a = 0; a < sizeof Ts / sizeof *Ts; a++) {
        ct_set_num_threads(Ts[a]);
        double r[5];
        for (int k = 0; k < 5; k++) {
            double t0 = now_s();
            for (int i = 0; i < 2000; i++) {
                meet_target += Ts[a];
                ct_parallel_for(Ts[a], meet_body, NULL);
            }
            r[k] = (now_s() - t0) / 2000;
        }
        for (int i = 0; i < 5; i++)
            for (int k = i + 1; k < 5; k++)
                if (r[k] < r[i]) {
                    double t = r[i];
                    r[i] = r[k];
                    r[k] = t;
                }
        printf("  %2d threads: %8.2f us per region\n", Ts[a], r[2] * 1e6);
    }
}

int main(int argc, char **argv)
{
    int saved = ct_num_threads();
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench_empty();
        bench_meet();
        return 0;
    }
    test_coverage();
    test_tasks();
    test_nested();
    test_concurrent_callers();
    test_independent_progress();
    test_count_changes();
    test_step_loops();
    CHECK_OK(ct_set_num_threads(saved));
    return t_report("test_threads");
}
