/* One thread pool for the whole library. ct_parallel_for splits [0, n) into T equal
 * contiguous chunks; chunk 0 runs on the caller, chunk t on worker t. Kernels make every
 * output element depend on its inputs alone (never on the chunking), which is what makes
 * results bitwise identical across thread counts. */
#include "core/internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#define CT_MAX_THREADS 256

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;  /* one parallel_for at a time */
static pthread_mutex_t state_mu = PTHREAD_MUTEX_INITIALIZER; /* guards the fields below */
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static pthread_t workers[CT_MAX_THREADS];
static int n_workers;       /* started worker threads (excluding the caller) */
static int n_threads;       /* configured thread count, 0 = not yet read */
static uint64_t generation; /* bumped for each job */
static int pending;         /* chunks not yet finished in the current job */
static ct_parallel_fn job_fn;
static void *job_ctx;
static int64_t job_n;
static int job_threads;
static _Thread_local int in_parallel;

static void run_chunk(int t)
{
    int64_t begin = job_n * t / job_threads, end = job_n * (t + 1) / job_threads;
    if (begin < end) job_fn(job_ctx, begin, end, t);
}

static void *worker_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t seen = 0;
    in_parallel = 1;
    pthread_mutex_lock(&state_mu);
    for (;;) {
        while (generation == seen) pthread_cond_wait(&work_cv, &state_mu);
        seen = generation;
        if (t >= job_threads) continue;
        pthread_mutex_unlock(&state_mu);
        run_chunk(t);
        pthread_mutex_lock(&state_mu);
        if (--pending == 0) pthread_cond_signal(&done_cv);
    }
    return NULL;
}

static int default_threads(void)
{
    const char *env = getenv("CT_NUM_THREADS");
    if (env && *env) {
        int v = atoi(env);
        if (v >= 1 && v <= CT_MAX_THREADS) return v;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > CT_MAX_THREADS) n = CT_MAX_THREADS;
    return (int)n;
}

int ct_num_threads(void)
{
    pthread_mutex_lock(&state_mu);
    if (!n_threads) n_threads = default_threads();
    int n = n_threads;
    pthread_mutex_unlock(&state_mu);
    return n;
}

ct_status ct_set_num_threads(int n)
{
    if (n < 1 || n > CT_MAX_THREADS)
        return ct_error(CT_EINVAL, "ct_set_num_threads: n must be in [1, %d], got %d", CT_MAX_THREADS, n);
    pthread_mutex_lock(&pool_mu);
    pthread_mutex_lock(&state_mu);
    n_threads = n;
    pthread_mutex_unlock(&state_mu);
    pthread_mutex_unlock(&pool_mu);
    return CT_OK;
}

void ct_parallel_for(int64_t n, ct_parallel_fn fn, void *ctx)
{
    if (n <= 0) return;
    int T = ct_num_threads();
    if (T > n) T = (int)n;
    if (T <= 1 || in_parallel) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&pool_mu);
    pthread_mutex_lock(&state_mu);
    while (n_workers < T - 1) {
        if (pthread_create(&workers[n_workers], NULL, worker_main,
                           (void *)(intptr_t)(n_workers + 1)) != 0)
            break;
        pthread_detach(workers[n_workers]);
        n_workers++;
    }
    if (T > n_workers + 1) T = n_workers + 1; /* could not start enough: fewer chunks */
    job_fn = fn;
    job_ctx = ctx;
    job_n = n;
    job_threads = T;
    pending = T - 1;
    generation++;
    pthread_cond_broadcast(&work_cv);
    pthread_mutex_unlock(&state_mu);

    in_parallel = 1;
    run_chunk(0);
    in_parallel = 0;

    pthread_mutex_lock(&state_mu);
    while (pending > 0) pthread_cond_wait(&done_cv, &state_mu);
    pthread_mutex_unlock(&state_mu);
    pthread_mutex_unlock(&pool_mu);
}
