/* The library's thread pool.
 *
 * A parallel region (ct_parallel_for / ct_parallel_for_grain) cuts [0, n) into contiguous
 * chunks whose size comes from n, the thread count and the caller's grain, and publishes a
 * job descriptor (on the caller's stack) in a queue. The caller runs chunks itself as tid 0;
 * idle workers join the job (taking tids 1, 2, ... in the order they join, at most T - 1 of
 * them) and claim chunks from the same atomic counter until none is left. So:
 *
 *  - several threads may run regions at once: each has its own job, workers spread over the
 *    queued jobs, and a caller never waits for another caller's region: if every worker is
 *    busy it runs all of its chunks itself, and at the end it waits only for the chunks that
 *    workers already took from its own job;
 *  - a worker is woken only when a job needs it (no broadcast per job); a worker that has
 *    just finished spins briefly on the queue before sleeping, and a caller spins briefly on
 *    its job's counter before sleeping, so back-to-back regions cost no sleep/wake when the
 *    machine is not oversubscribed;
 *  - tid is < the thread count the region read (ct_num_threads()) and no two chunks running
 *    at the same time share a tid; ct_parallel_for_capped(.., T, ..) keeps tid < T for a
 *    caller that sized per-tid scratch from a count it read earlier;
 *  - which thread runs which chunk is not fixed: kernels make every output depend on its
 *    inputs alone (never on the chunking or the tid), which is what keeps results bitwise
 *    identical across thread counts;
 *  - a region started from inside a region (nested) runs serially on the calling thread. */
#include "core/internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define CT_MAX_THREADS 256
#define CHUNKS_PER_THREAD 4   /* chunks per thread when n is large: balance when some are busy */
#define WORKER_SPIN_NS 100000 /* a worker polls the queue this long before sleeping */
#define CALLER_SPIN_NS 200000 /* a caller polls its job this long before sleeping */

typedef struct job {
    ct_parallel_fn fn;
    void *ctx;
    int64_t n, chunk, nchunks;
    atomic_llong next; /* next chunk to claim */
    atomic_int refs;   /* helpers that joined and have not finished */
    int joined;        /* helpers that joined (tids 1..joined); under mu */
    int max_helpers;
    int queued; /* in the queue (open to helpers); under mu */
    struct job *prev, *nx;
} job;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER; /* workers sleep here */
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER; /* callers sleep here */
static job *q_head, *q_tail;                              /* open jobs; under mu */
static atomic_int q_len;            /* open jobs (written under mu, polled without) */
static int n_workers;               /* started workers; under mu */
static int n_sleeping;              /* workers waiting on work_cv; under mu */
static atomic_int n_spinning;       /* workers polling the queue */
static atomic_int callers_sleeping; /* callers waiting on done_cv */
static atomic_int n_threads;        /* configured count, 0 = not yet read */
static int n_cpus;                  /* online CPUs, read once */
static _Thread_local int in_parallel;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* One step of a polling loop: a few hundred pauses first (the wait is usually short), then
 * yield the CPU between polls, so that a loaded machine runs the thread being waited for. */
static inline void spin_pause(int i)
{
    if (i < 256) cpu_relax();
    else sched_yield();
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void dequeue(job *j)
{
    if (j->prev) j->prev->nx = j->nx;
    else q_head = j->nx;
    if (j->nx) j->nx->prev = j->prev;
    else q_tail = j->prev;
    j->prev = j->nx = NULL;
    j->queued = 0;
    atomic_fetch_sub(&q_len, 1);
}

/* Claim and run chunks of j as `tid` until none is left. */
static void run_chunks(job *j, int tid)
{
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (c >= j->nchunks) return;
        int64_t b = c * j->chunk, e = b + j->chunk < j->n ? b + j->chunk : j->n;
        j->fn(j->ctx, b, e, tid);
    }
}

/* Under mu: join the first open job with work left; return it and the tid, or NULL. Jobs
 * whose chunks are all claimed leave the queue here (or when their caller closes them). */
static job *join_job(int *tid)
{
    for (job *j = q_head; j;) {
        job *nx = j->nx;
        if (atomic_load_explicit(&j->next, memory_order_relaxed) >= j->nchunks) {
            dequeue(j);
        } else {
            *tid = ++j->joined;
            atomic_fetch_add(&j->refs, 1);
            if (j->joined >= j->max_helpers) dequeue(j);
            return j;
        }
        j = nx;
    }
    return NULL;
}

static void *worker_main(void *arg)
{
    (void)arg;
    in_parallel = 1;
    int spun = 0; /* polled the queue until the time ran out since the last job */
    pthread_mutex_lock(&mu);
    for (;;) {
        int tid;
        job *j = join_job(&tid);
        if (j) {
            pthread_mutex_unlock(&mu);
            run_chunks(j, tid);
            /* After this decrement j may be gone (the caller returns): touch only globals. */
            if (atomic_fetch_sub(&j->refs, 1) == 1 && atomic_load(&callers_sleeping) > 0) {
                pthread_mutex_lock(&mu);
                pthread_cond_broadcast(&done_cv);
                pthread_mutex_unlock(&mu);
            }
            spun = 0;
            pthread_mutex_lock(&mu);
            continue;
        }
        /* Nothing open: poll the queue a while (unless the machine is oversubscribed), then
         * sleep until a caller signals. Every queued job has chunks left or leaves the queue
         * in join_job, so polling q_len cannot livelock. */
        if (!spun && atomic_load_explicit(&n_threads, memory_order_relaxed) <= n_cpus) {
            atomic_fetch_add(&n_spinning, 1);
            pthread_mutex_unlock(&mu);
            int64_t t0 = now_ns();
            for (int i = 1;; i++) {
                if (atomic_load_explicit(&q_len, memory_order_relaxed) > 0) break;
                spin_pause(i);
                if ((i & 63) == 0 && now_ns() - t0 > WORKER_SPIN_NS) {
                    spun = 1;
                    break;
                }
            }
            pthread_mutex_lock(&mu);
            atomic_fetch_sub(&n_spinning, 1);
            continue;
        }
        n_sleeping++;
        pthread_cond_wait(&work_cv, &mu);
        n_sleeping--;
        spun = 0;
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
    /* Several ranks on this host (ctorch launch / torchrun's LOCAL_WORLD_SIZE, MPICH's
     * MPI_LOCALNRANKS, Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE): share the cores. */
    static const char *const local_size[] = {"LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS",
                                             "OMPI_COMM_WORLD_LOCAL_SIZE"};
    for (size_t i = 0; i < sizeof local_size / sizeof *local_size; i++) {
        const char *v = getenv(local_size[i]);
        char *end;
        long r = v && *v ? strtol(v, &end, 10) : 0;
        if (r >= 1 && r <= 1 << 20 && *end == '\0') {
            n = n / r < 1 ? 1 : n / r;
            break;
        }
    }
    if (n > CT_MAX_THREADS) n = CT_MAX_THREADS;
    return (int)n;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void pool_init(void)
{
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    n_cpus = c < 1 ? 1 : c > CT_MAX_THREADS ? CT_MAX_THREADS : (int)c;
    int expected = 0;
    atomic_compare_exchange_strong(&n_threads, &expected, default_threads());
}

int ct_num_threads(void)
{
    int n = atomic_load_explicit(&n_threads, memory_order_acquire);
    if (n) return n;
    pthread_once(&init_once, pool_init);
    return atomic_load(&n_threads);
}

ct_status ct_set_num_threads(int n)
{
    if (n < 1 || n > CT_MAX_THREADS)
        return ct_error(CT_EINVAL, "ct_set_num_threads: n must be in [1, %d], got %d", CT_MAX_THREADS, n);
    pthread_once(&init_once, pool_init);
    atomic_store(&n_threads, n);
    return CT_OK;
}

void ct_parallel_for_grain(int64_t n, int64_t grain, ct_parallel_fn fn, void *ctx)
{
    ct_parallel_for_capped(n, grain, CT_MAX_THREADS, fn, ctx);
}

/* Run [0, n) in chunks of `chunk` indices (0: about CHUNKS_PER_THREAD chunks per thread, never
 * under the grain) on at most max_threads threads. */
static void parallel_run(int64_t n, int64_t grain, int64_t chunk, int max_threads, ct_parallel_fn fn, void *ctx)
{
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int T = ct_num_threads();
    if (max_threads < T) T = max_threads < 1 ? 1 : max_threads;
    if (T <= 1 || in_parallel || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    if (chunk < 1) {
        int64_t want = (int64_t)T * CHUNKS_PER_THREAD;
        chunk = (n + want - 1) / want;
        if (chunk < grain) chunk = grain;
    }
    int64_t nchunks = (n + chunk - 1) / chunk;
    if (nchunks <= 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    job j;
    j.fn = fn;
    j.ctx = ctx;
    j.n = n;
    j.chunk = chunk;
    j.nchunks = nchunks;
    atomic_init(&j.next, 0);
    atomic_init(&j.refs, 0);
    j.joined = 0;
    j.max_helpers = (int)((int64_t)T < nchunks ? T : nchunks) - 1;
    j.prev = j.nx = NULL;

    int wake = 0, wake_all = 0;
    pthread_mutex_lock(&mu);
    while (n_workers < j.max_helpers && n_workers < CT_MAX_THREADS - 1) {
        pthread_t th;
        if (pthread_create(&th, NULL, worker_main, NULL) != 0) break;
        pthread_detach(th);
        n_workers++;
    }
    if (j.max_helpers > n_workers) j.max_helpers = n_workers; /* could not start enough */
    if (j.max_helpers > 0) {
        j.prev = q_tail;
        if (q_tail) q_tail->nx = &j;
        else q_head = &j;
        q_tail = &j;
        j.queued = 1;
        atomic_fetch_add(&q_len, 1);
        wake = j.max_helpers - atomic_load(&n_spinning);
        if (wake >= n_sleeping) wake = n_sleeping, wake_all = 1;
    } else {
        j.queued = 0;
    }
    pthread_mutex_unlock(&mu);
    /* Wake outside the lock (the job is queued under it, and a worker checks the queue under
     * it before sleeping, so no wake is lost), so the woken do not queue up on mu behind us;
     * one broadcast when every sleeper is wanted. */
    if (wake_all && wake > 0) pthread_cond_broadcast(&work_cv);
    else
        for (int i = 0; i < wake; i++) pthread_cond_signal(&work_cv);

    in_parallel = 1;
    run_chunks(&j, 0);
    in_parallel = 0;

    /* Close the job to new helpers, then wait for those that joined. */
    if (j.max_helpers > 0) {
        pthread_mutex_lock(&mu);
        if (j.queued) dequeue(&j);
        pthread_mutex_unlock(&mu);
    }
    if (atomic_load(&j.refs) == 0) return;
    if (T <= n_cpus) {
        int64_t t0 = now_ns();
        for (int i = 1; atomic_load(&j.refs) != 0; i++) {
            spin_pause(i);
            if ((i & 63) == 0 && now_ns() - t0 > CALLER_SPIN_NS) break;
        }
    }
    if (atomic_load(&j.refs) == 0) return;
    pthread_mutex_lock(&mu);
    atomic_fetch_add(&callers_sleeping, 1);
    while (atomic_load(&j.refs) != 0) pthread_cond_wait(&done_cv, &mu);
    atomic_fetch_sub(&callers_sleeping, 1);
    pthread_mutex_unlock(&mu);
}

void ct_parallel_for_capped(int64_t n, int64_t grain, int max_threads, ct_parallel_fn fn, void *ctx)
{
    parallel_run(n, grain, 0, max_threads, fn, ctx);
}

void ct_parallel_tasks(int64_t n, ct_parallel_fn fn, void *ctx)
{
    parallel_run(n, 1, 1, CT_MAX_THREADS, fn, ctx);
}

void ct_parallel_for(int64_t n, ct_parallel_fn fn, void *ctx)
{
    ct_parallel_for_grain(n, 1, fn, ctx);
}
