/* Faults, in processes started by `ctorch launch`:
 *  - one rank sleeps past the timeout: the others end TIMED_OUT within it, naming that rank,
 *    and their flight-recorder dumps show who stopped at which sequence number;
 *  - one rank is SIGKILLed in the middle of a large all_reduce: the survivors get ERROR
 *    naming it well within the timeout, shrink, and run correct all_reduces on the smaller
 *    group;
 *  - abort from another thread during a wait;
 *  - the launcher reports a failing rank, ends the others and returns its status. */
#include "../comm/comm_test_util.h"
#include "test_util.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#define TIMEOUT_S 1.5

static int g_rank;

#define WCHECK(cond)                                                                               \
    do {                                                                                           \
        t_checks++;                                                                                \
        if (!(cond)) {                                                                             \
            t_failures++;                                                                          \
            fprintf(stderr, "%s:%d: rank %d: CHECK failed: %s (%s)\n", __FILE__, __LINE__, g_rank, \
                    #cond, ct_last_error());                                                       \
        }                                                                                          \
    } while (0)

static ct_comm *init(void)
{
    ct_comm *c = NULL;
    if (ct_comm_init_env(NULL, &c) != CT_OK) {
        fprintf(stderr, "init: %s\n", ct_last_error());
        exit(1);
    }
    g_rank = ct_comm_rank(c);
    return c;
}

static void warm_up(ct_comm *c, int k)
{
    for (int i = 0; i < k; i++) {
        float x = 1, y = 0;
        WCHECK(ct_comm_all_reduce(c, &x, &y, 1, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL) == CT_OK);
        WCHECK(y == (float)ct_comm_size(c));
    }
}

/* ---- one rank sleeps ------------------------------------------------------------------ */

static int worker_timeout(void)
{
    ct_comm *c = init();
    int P = ct_comm_size(c), me = g_rank;
    warm_up(c, 3);
    float x[64] = {0}, y[64];
    if (me == P - 1) {
        ct_sleep(TIMEOUT_S + 1.0);
        /* Late: the others have given up. Their contributions may already sit in our channels
         * (then this completes); either way it ends within its short timeout. */
        double t0 = ct_now();
        ct_comm_all_reduce(c, x, y, 64, CT_DTYPE_F32, CT_REDUCE_SUM, 0.5, NULL);
        WCHECK(ct_now() - t0 < 1.0);
    } else {
        ct_work *w;
        double t0 = ct_now();
        WCHECK(ct_comm_all_reduce(c, x, y, 64, CT_DTYPE_F32, CT_REDUCE_SUM, 0, &w) == CT_OK);
        ct_status st = ct_work_wait(w, -1);
        double dt = ct_now() - t0;
        WCHECK(st == CT_ETIMEDOUT && ct_work_get_state(w) == CT_WORK_TIMED_OUT);
        WCHECK(dt >= TIMEOUT_S - 0.01 && dt < TIMEOUT_S + 1.0);
        int miss[8];
        WCHECK(ct_work_missing_ranks(w, miss, 8) == 1 && miss[0] == P - 1);
        char want[64];
        snprintf(want, sizeof want, "ranks %d did not arrive", P - 1);
        WCHECK(strstr(ct_work_error(w), want) != NULL);
        printf("timed out after %.2f s: %s\n", dt, ct_work_error(w));
        ct_work_free(w);
        /* Stay connected a while: a rank that times out a few ms before another must not
         * exit first, or the other sees a dead peer (ERROR) before its own deadline. */
        ct_sleep(1.0);
    }
    ct_comm_free(c);
    return t_failures ? 1 : 0;
}

static void test_timeout(void)
{
    char dir[] = "/tmp/ctorch_fr_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char to[32];
    snprintf(to, sizeof to, "%g", TIMEOUT_S);
    const char *args[] = {"--nproc", "4",          "--timeout", to,  "--fr-dump-dir",
                          dir,       "--max-time", "60",        NULL};
    static char out[1 << 16];
    CHECK(ct_run_launch(args, "timeout", NULL, out, sizeof out) == 0);
    /* The launcher's summary names the missing rank. */
    CHECK(strstr(out, "missing ranks 3") != NULL);
    for (int r = 0; r < 3; r++) {
        char path[256];
        snprintf(path, sizeof path, "%s/ctorch_fr_default_rank%d.json", dir, r);
        json_error_t err;
        json_t *j = json_load_file(path, 0, &err);
        CHECK(j != NULL);
        if (!j) continue;
        CHECK(!strcmp(json_string_value(json_object_get(j, "reason")), "timeout"));
        CHECK(json_integer_value(json_object_get(j, "last_enqueued_seq")) == 4);
        CHECK(json_integer_value(json_object_get(j, "last_completed_seq")) == 3);
        json_t *es = json_object_get(j, "entries");
        json_t *last = json_array_get(es, json_array_size(es) - 1);
        CHECK(json_integer_value(json_object_get(last, "seq")) == 4);
        CHECK(!strcmp(json_string_value(json_object_get(last, "state")), "timed_out"));
        json_t *m = json_object_get(last, "missing_ranks");
        CHECK(json_array_size(m) == 1 && json_integer_value(json_array_get(m, 0)) == 3);
        json_t *peers = json_object_get(j, "peers");
        int seen = 0;
        for (size_t k = 0; k < json_array_size(peers); k++) {
            json_t *p = json_array_get(peers, k);
            json_int_t pr = json_integer_value(json_object_get(p, "rank"));
            json_int_t enq = json_integer_value(json_object_get(p, "last_enqueued_seq"));
            seen += pr == 3 && enq == 3;
            if (pr != 3) CHECK(enq == 4);
        }
        CHECK(seen == 1);
        json_decref(j);
        unlink(path);
    }
    char path[256];
    snprintf(path, sizeof path, "%s/ctorch_fr_default_rank3.json", dir);
    unlink(path);
    rmdir(dir);
}

/* ---- one rank is killed --------------------------------------------------------------- */

#define BIG (4u << 20)

static int allreduce_ok(ct_comm *c, size_t n, int salt)
{
    int P = ct_comm_size(c), me = ct_comm_rank(c);
    float *x = malloc(n * 4), *y = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)((i + (size_t)salt) % 17) + me);
    int ok = ct_comm_all_reduce(c, x, y, n, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL) == CT_OK;
    for (size_t i = 0; ok && i < n; i++)
        ok = y[i] == (float)(P * (int)((i + (size_t)salt) % 17) + P * (P - 1) / 2);
    free(x);
    free(y);
    return ok;
}

static int worker_kill(void)
{
    ct_comm *c = init();
    int P = ct_comm_size(c), me = g_rank, victim = 2;
    warm_up(c, 3);
    float *x = malloc(BIG * 4), *y = malloc(BIG * 4);
    for (size_t i = 0; i < BIG; i++)
        x[i] = (float)(i % 5);
    if (me == victim) {
        ct_work *w;
        ct_comm_all_reduce(c, x, y, BIG, CT_DTYPE_F32, CT_REDUCE_SUM, 0, &w);
        while (ct_work_get_state(w) == CT_WORK_NOT_STARTED)
            ct_sleep(0.0002);
        ct_sleep(0.002);
        kill(getpid(), SIGKILL);
    }
    double t0 = ct_now();
    ct_status st = ct_comm_all_reduce(c, x, y, BIG, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL);
    int mid = st != CT_OK;
    if (st == CT_OK) st = ct_comm_all_reduce(c, x, y, 1024, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL);
    double dt = ct_now() - t0;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ct_last_error());
    WCHECK(st == CT_EPEER);
    WCHECK(strstr(msg, "rank 2 is gone") != NULL);
    int miss[4];
    WCHECK(ct_work_missing_ranks(NULL, miss, 4) == 0);
    WCHECK(dt < 0.8 * TIMEOUT_S * 2); /* far from hanging; the timeout here is 3 s */
    WCHECK(ct_comm_failed(c));
    ct_comm *nc = NULL;
    double t1 = ct_now();
    WCHECK(ct_comm_shrink(c, 0, &nc) == CT_OK);
    double ds = ct_now() - t1;
    if (nc) {
        WCHECK(ct_comm_size(nc) == P - 1);
        WCHECK(ct_comm_rank(nc) == (me < victim ? me : me - 1));
        for (int k = 0; k < 3; k++) {
            WCHECK(allreduce_ok(nc, 1000 + (size_t)k, k));
            WCHECK(allreduce_ok(nc, 300000 + (size_t)k, k));
        }
        ct_comm_free(nc);
    }
    printf("error after %.3f s (%s the big all_reduce): %s; shrunk in %.3f s\n", dt,
           mid ? "in" : "after", msg, ds);
    ct_comm_free(c);
    free(x);
    free(y);
    return t_failures ? 1 : 0;
}

/* ---- abort from another thread ----------------------------------------------------------- */

static void *abort_soon(void *arg)
{
    ct_sleep(0.2);
    ct_comm_abort(arg);
    return NULL;
}

/* A file rank 1 creates once it has seen rank 0's abort (named after this job's store port). */
static const char *abort_seen_path(void)
{
    static char path[256];
    const char *tmp = getenv("TMPDIR"), *port = getenv("MASTER_PORT");
    snprintf(path, sizeof path, "%s/ctorch_test_abort_%s_seen", tmp && *tmp ? tmp : "/tmp",
             port ? port : "0");
    return path;
}

static int worker_abort(void)
{
    ct_comm *c = init();
    warm_up(c, 2);
    float x[256] = {0}, y[256];
    if (g_rank == 0) {
        ct_work *w;
        WCHECK(ct_comm_all_reduce(c, x, y, 256, CT_DTYPE_F32, CT_REDUCE_SUM, 10, &w) == CT_OK);
        pthread_t th;
        pthread_create(&th, NULL, abort_soon, c);
        double t0 = ct_now();
        ct_status st = ct_work_wait(w, -1);
        double dt = ct_now() - t0;
        WCHECK(st == CT_ECANCELLED && ct_work_get_state(w) == CT_WORK_CANCELLED);
        WCHECK(dt > 0.15 && dt < 9.0); /* the abort, not the 10 s timeout, ended it */
        pthread_join(th, NULL);
        ct_work_free(w);
        /* Stay alive until rank 1 has seen the abort (it must learn of the abort, not of an
         * exit): it says so with a file, so no sleep decides the outcome on a loaded machine. */
        for (double t1 = ct_now(); access(abort_seen_path(), F_OK) != 0 && ct_now() - t1 < 60;)
            ct_sleep(0.01);
        unlink(abort_seen_path());
    } else {
        ct_sleep(0.4);
        /* Rank 0's part of the first one may already be here; the second needs rank 0. */
        double t0 = ct_now();
        ct_status st = ct_comm_all_reduce(c, x, y, 256, CT_DTYPE_F32, CT_REDUCE_SUM, 10, NULL);
        if (st == CT_OK)
            st = ct_comm_all_reduce(c, x, y, 256, CT_DTYPE_F32, CT_REDUCE_SUM, 10, NULL);
        WCHECK(st == CT_EPEER && strstr(ct_last_error(), "rank 0 aborted") && ct_now() - t0 < 9.0);
        FILE *f = fopen(abort_seen_path(), "w");
        if (f) fclose(f);
    }
    ct_comm_free(c);
    return t_failures ? 1 : 0;
}

/* ---- the launcher ------------------------------------------------------------------------- */

static int worker_exit3(void)
{
    if (atoi(getenv("RANK")) == 1) {
        fprintf(stderr, "rank 1 gives up\n");
        return 3;
    }
    ct_sleep(20); /* the launcher ends us */
    return 0;
}

static void test_launcher(void)
{
    static char out[1 << 16];
    const char *args[] = {"--nproc", "3", "--grace", "2", "--max-time", "30", NULL};
    double t0 = ct_now();
    CHECK(ct_run_launch(args, "exit3", NULL, out, sizeof out) == 3);
    CHECK(ct_now() - t0 < 5);
    CHECK(strstr(out, "[rank1]: rank 1 gives up") != NULL);
    CHECK(strstr(out, "rank 1 (pid") && strstr(out, "exited with status 3"));
    CHECK(strstr(out, "ended by the launcher") != NULL);
    const char *env[] = {"CT_COMM_LOG=json", NULL};
    CHECK(ct_run_launch(args, "exit3", env, out, sizeof out) == 3);
    CHECK(strstr(out, "\"event\":\"rank_failed\"") && strstr(out, "\"exit_code\":3"));
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "--worker")) {
        if (!strcmp(argv[2], "timeout")) return worker_timeout();
        if (!strcmp(argv[2], "kill")) return worker_kill();
        if (!strcmp(argv[2], "abort")) return worker_abort();
        if (!strcmp(argv[2], "exit3")) return worker_exit3();
        return 2;
    }
    if (argc > 1 && !strcmp(argv[1], "--kill-only")) {
        const char *args[] = {"--nproc", "4",          "--elastic", "--timeout",
                              "3",       "--max-time", "60",        NULL};
        CHECK(ct_run_launch(args, "kill", NULL, NULL, 0) == 0);
        return t_report("test_comm_faults --kill-only");
    }
    test_timeout();
    const char *kargs[] = {"--nproc", "4", "--elastic", "--timeout", "3", "--max-time", "60", NULL};
    static char out[1 << 16];
    CHECK(ct_run_launch(kargs, "kill", NULL, out, sizeof out) == 0);
    CHECK(strstr(out, "rank 2 (pid") && strstr(out, "killed by signal 9"));
    const char *aargs[] = {"--nproc", "2", "--max-time", "60", NULL};
    CHECK(ct_run_launch(aargs, "abort", NULL, NULL, 0) == 0);
    test_launcher();
    return t_report("test_comm_faults");
}
