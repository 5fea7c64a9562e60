/* Communication layer inside one process: the store, the reduction kernels, argument
 * checks, and communicators whose ranks are threads (every op and dtype at small and ring
 * sizes, timeouts naming the missing rank, abort from another thread, the flight recorder,
 * split, the NaN check). Multi-process runs are in test_comm_ops / test_comm_faults. */
#include "comm/comm_internal.h"
#include "test_util.h"
#include "../comm/comm_test_util.h" /* ct_put / ct_get */

#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int g_port;

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- store ---------------------------------------------------------------------------- */

static void test_store(void)
{
    ct_store *s;
    CHECK_OK(ct_store_connect("127.0.0.1", g_port, 5, &s));
    CHECK_OK(ct_store_set(s, "unit/a", "hello", 5));
    void *v = NULL;
    size_t len = 0;
    CHECK_OK(ct_store_get(s, "unit/a", 1, &v, &len));
    CHECK(len == 5 && v && !memcmp(v, "hello", 5) && ((char *)v)[5] == 0);
    ct_free(v);
    bool ex = true;
    CHECK_OK(ct_store_check(s, "unit/missing", &ex));
    CHECK(!ex);
    CHECK_STATUS(ct_store_get(s, "unit/missing", 0.05, &v, NULL), CT_ETIMEDOUT);
    int64_t n = 0;
    CHECK_OK(ct_store_add(s, "unit/ctr", 5, &n));
    CHECK(n == 5);
    CHECK_OK(ct_store_add(s, "unit/ctr", -7, &n));
    CHECK(n == -2);
    size_t al = 0;
    CHECK_OK(ct_store_compare_set(s, "unit/cas", "", 0, "first", 5, &v, &al));
    CHECK(al == 5 && !memcmp(v, "first", 5));
    ct_free(v);
    CHECK_OK(ct_store_compare_set(s, "unit/cas", "", 0, "second", 6, &v, &al));
    CHECK(al == 5 && !memcmp(v, "first", 5)); /* lost: already set */
    ct_free(v);
    CHECK_OK(ct_store_compare_set(s, "unit/cas", "first", 5, "third", 5, &v, &al));
    CHECK(al == 5 && !memcmp(v, "third", 5));
    ct_free(v);
    CHECK_OK(ct_store_delete(s, "unit/cas"));
    CHECK_OK(ct_store_check(s, "unit/cas", &ex));
    CHECK(!ex);
    /* 0-byte value and a value set later by another client while we wait. */
    CHECK_OK(ct_store_set(s, "unit/empty", NULL, 0));
    CHECK_OK(ct_store_get(s, "unit/empty", 1, &v, &len));
    CHECK(len == 0);
    ct_free(v);
    CHECK_STATUS(ct_store_set(s, "", "x", 1), CT_EINVAL);
    CHECK_STATUS(ct_store_set(NULL, "k", "x", 1), CT_EINVAL);
    CHECK_STATUS(ct_store_get(s, "k", 1, NULL, NULL), CT_EINVAL);
    ct_store_free(s);
    CHECK_STATUS(ct_store_connect("127.0.0.1", 0, 1, &s), CT_EINVAL);
    CHECK(s == NULL);
    ct_store_free(NULL);
    ct_store_server_free(NULL);
    /* Nobody listening: connect gives up at its deadline. */
    ct_store_server *tmp;
    CHECK_OK(ct_store_server_start("127.0.0.1", 0, &tmp));
    int dead_port = ct_store_server_port(tmp);
    ct_store_server_free(tmp);
    ct_store *s2 = NULL;
    double t0 = cm_now();
    CHECK_STATUS(ct_store_connect("127.0.0.1", dead_port, 0.2, &s2), CT_ETIMEDOUT);
    CHECK(cm_now() - t0 < 2.0);
}

/* ---- kernels ---------------------------------------------------------------------------- */

static void test_kernels(void)
{
    float a[5] = {1, -0.0f, NAN, 3, 0.0f}, b[5] = {2, 0.0f, 1, NAN, -0.0f}, o[5];
    cm_reduce3(CT_DTYPE_F32, CT_REDUCE_MAX, o, a, b, 5);
    CHECK(o[0] == 2 && !signbit(o[1]) && isnan(o[2]) && isnan(o[3]) && !signbit(o[4]));
    cm_reduce3(CT_DTYPE_F32, CT_REDUCE_MIN, o, a, b, 5);
    CHECK(o[0] == 1 && signbit(o[1]) && isnan(o[2]) && isnan(o[3]) && signbit(o[4]));
    cm_reduce3(CT_DTYPE_F32, CT_REDUCE_MAX, o, b, a, 5); /* commutative, signed zeros too */
    CHECK(o[0] == 2 && !signbit(o[1]) && !signbit(o[4]));
    uint8_t u[3] = {250, 3, 16}, v[3] = {10, 200, 16};
    cm_reduce(CT_DTYPE_U8, CT_REDUCE_SUM, u, v, 3);
    CHECK(u[0] == 4 && u[1] == 203 && u[2] == 32);
    cm_reduce(CT_DTYPE_U8, CT_REDUCE_PROD, u, v, 3);
    CHECK(u[0] == 40 && u[1] == (uint8_t)(203 * 200) && u[2] == 0);
    int32_t i[2] = {INT32_MAX, -5}, j[2] = {1, 7};
    cm_reduce(CT_DTYPE_I32, CT_REDUCE_SUM, i, j, 2);
    CHECK(i[0] == INT32_MIN && i[1] == 2);
    int64_t k[2] = {-3, 9}, l[2] = {4, -9};
    cm_reduce(CT_DTYPE_I64, CT_REDUCE_MIN, k, l, 2);
    CHECK(k[0] == -3 && k[1] == -9);
    double d[2] = {1.5, 2}, e[2] = {2, 0.25};
    cm_reduce(CT_DTYPE_F64, CT_REDUCE_PROD, d, e, 2);
    CHECK(d[0] == 3 && d[1] == 0.5);
    cm_divide(CT_DTYPE_F64, d, 2, 2);
    CHECK(d[0] == 1.5 && d[1] == 0.25);
    uint16_t h[3] = {0x3C00, 0x7E00, 0x7C00}; /* 1, NaN, inf (f16) */
    CHECK(cm_find_nan(CT_DTYPE_F16, h, 3) == 1);
    CHECK(cm_find_nan(CT_DTYPE_F16, h + 2, 1) == -1);
    uint16_t bf[2] = {0x7F80, 0x7FC1};
    CHECK(cm_find_nan(CT_DTYPE_BF16, bf, 2) == 1);
}

/* ---- threads as ranks ----------------------------------------------------------------------- */

typedef struct rank_ctx {
    int rank, size;
    const char *name;
    void (*body)(struct rank_ctx *, ct_comm *);
    ct_comm_options opt;
    int failures;
    double t_fail;
    ct_status st;
    char msg[400];
    int missing[8], nmissing;
} rank_ctx;

static void *rank_main(void *arg)
{
    rank_ctx *r = arg;
    ct_store *s;
    if (ct_store_connect("127.0.0.1", g_port, 5, &s) != CT_OK) {
        r->failures++;
        return NULL;
    }
    ct_comm *c = NULL;
    r->opt.name = r->name;
    ct_status st = ct_comm_init(s, r->rank, r->size, &r->opt, &c);
    if (st) {
        fprintf(stderr, "rank %d init: %s\n", r->rank, ct_last_error());
        r->failures++;
    } else {
        r->body(r, c);
        ct_comm_free(c);
    }
    ct_store_free(s);
    return NULL;
}

static void run_ranks(int P, const char *name, void (*body)(rank_ctx *, ct_comm *), rank_ctx *ctx,
                      const ct_comm_options *opt)
{
    pthread_t th[8];
    for (int p = 0; p < P; p++) {
        memset(&ctx[p], 0, sizeof ctx[p]);
        ctx[p].rank = p;
        ctx[p].size = P;
        ctx[p].name = name;
        ctx[p].body = body;
        ctx[p].opt = opt ? *opt : ct_comm_options_default();
        pthread_create(&th[p], NULL, rank_main, &ctx[p]);
    }
    for (int p = 0; p < P; p++) {
        pthread_join(th[p], NULL);
        t_failures += ctx[p].failures;
        t_checks++;
    }
}

#define RCHECK(r, cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            (r)->failures++;                                                                       \
            fprintf(stderr, "%s:%d: rank %d: CHECK failed: %s (%s)\n", __FILE__, __LINE__,         \
                    (r)->rank, #cond, ct_last_error());                                            \
        }                                                                                          \
    } while (0)

/* Value of element i on rank p: small integers so every order of summation is exact. */
static double val(int p, size_t i)
{
    return (double)((int)((i * 7 + (size_t)p * 13) % 11) - 5);
}

static void body_ops(rank_ctx *r, ct_comm *c)
{
    static const size_t sizes[] = {0, 1, 13, 4099, 70001};
    static const ct_dtype dts[] = {CT_DTYPE_F32, CT_DTYPE_BF16, CT_DTYPE_I64, CT_DTYPE_U8};
    int P = ct_comm_size(c), me = ct_comm_rank(c);
    RCHECK(r, me == r->rank && P == r->size && !strcmp(ct_comm_name(c), r->name));
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
            size_t n = sizes[si];
            ct_dtype dt = dts[di];
            size_t es = ct_dtype_size(dt);
            uint8_t *in = calloc(n * (size_t)P + 1, es), *out = calloc(n * (size_t)P + 1, es);
            /* all_reduce sum (u8 inputs are taken mod 256) */
            for (size_t i = 0; i < n; i++)
                ct_put(dt, in, i, dt == CT_DTYPE_U8 ? val(me, i) + 5 : val(me, i));
            RCHECK(r, ct_comm_all_reduce(c, in, out, n, dt, CT_REDUCE_SUM, 0, NULL) == CT_OK);
            int bad = 0;
            for (size_t i = 0; i < n && !bad; i++) {
                double want = 0;
                for (int p = 0; p < P; p++)
                    want += dt == CT_DTYPE_U8 ? val(p, i) + 5 : val(p, i);
                bad = ct_get(dt, out, i) != want;
            }
            RCHECK(r, !bad);
            /* all_gather */
            RCHECK(r, ct_comm_all_gather_single(c, in, out, n, dt, 0, NULL) == CT_OK);
            bad = 0;
            for (int p = 0; p < P && !bad; p++)
                for (size_t i = 0; i < n && !bad; i++)
                    bad = ct_get(dt, out, (size_t)p * n + i) !=
                          (dt == CT_DTYPE_U8 ? val(p, i) + 5 : val(p, i));
            RCHECK(r, !bad);
            /* broadcast from the last rank, in place */
            for (size_t i = 0; i < n; i++)
                ct_put(dt, out, i, me == P - 1 ? val(99, i) + 5 : 0);
            RCHECK(r, ct_comm_broadcast(c, out, n, dt, P - 1, 0, NULL) == CT_OK);
            bad = 0;
            for (size_t i = 0; i < n && !bad; i++)
                bad = ct_get(dt, out, i) != val(99, i) + 5;
            RCHECK(r, !bad);
            free(in);
            free(out);
        }
    }
    RCHECK(r, ct_comm_barrier(c, 0, NULL) == CT_OK);
    /* async: several in flight at once, then wait in reverse */
    float a[3][64], b[3][64];
    ct_work *w[3];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 64; i++)
            a[k][i] = (float)(k + me);
        RCHECK(r, ct_comm_all_reduce(c, a[k], b[k], 64, CT_DTYPE_F32, CT_REDUCE_MAX, 0, &w[k]) ==
                      CT_OK);
    }
    for (int k = 2; k >= 0; k--) {
        RCHECK(r, ct_work_wait(w[k], -1) == CT_OK);
        RCHECK(r, ct_work_get_state(w[k]) == CT_WORK_COMPLETED && ct_work_test(w[k]));
        RCHECK(r, b[k][0] == (float)(k + P - 1) && b[k][63] == (float)(k + P - 1));
        RCHECK(r,
               ct_work_seq(w[k]) > 0 && ct_work_status(w[k]) == CT_OK && !ct_work_error(w[k])[0]);
        ct_work_free(w[k]);
    }
    /* p2p ring: send right, receive left, both queued before waiting */
    double sbuf[1000], rbuf[1000];
    for (int i = 0; i < 1000; i++)
        sbuf[i] = me * 1000 + i;
    ct_work *ws, *wr;
    RCHECK(r, ct_comm_send(c, sbuf, 1000, CT_DTYPE_F64, (me + 1) % P, 0, &ws) == CT_OK);
    RCHECK(r, ct_comm_recv(c, rbuf, 1000, CT_DTYPE_F64, (me + P - 1) % P, 0, &wr) == CT_OK);
    RCHECK(r, ct_work_wait(wr, -1) == CT_OK && ct_work_wait(ws, -1) == CT_OK);
    RCHECK(r, rbuf[0] == ((me + P - 1) % P) * 1000 && rbuf[999] == ((me + P - 1) % P) * 1000 + 999);
    RCHECK(r, ct_work_seq(ws) == 0);
    ct_work_free(ws);
    ct_work_free(wr);
    /* split: the even ranks */
    int ev[4] = {0, 2}, nev = P > 2 ? 2 : 1;
    ct_comm *sub = NULL;
    RCHECK(r, ct_comm_split(c, ev, nev, NULL, &sub) == CT_OK);
    RCHECK(r, (me % 2 == 0 && me < 2 * nev) == (sub != NULL));
    if (sub) {
        int x = me, y = 0;
        RCHECK(r, ct_comm_size(sub) == nev && ct_comm_rank(sub) == me / 2);
        RCHECK(r,
               ct_comm_all_reduce(sub, &x, &y, 1, CT_DTYPE_I32, CT_REDUCE_SUM, 0, NULL) == CT_OK);
        RCHECK(r, y == (nev == 2 ? 2 : 0));
        ct_comm_free(sub);
    }
    /* on-demand recorder */
    char *js = NULL;
    RCHECK(r, ct_comm_flight_recorder_json(c, NULL, &js) == CT_OK && js &&
                  strstr(js, "\"all_reduce\"") && strstr(js, "\"completed\""));
    ct_free(js);
}

static void test_ops(int P, int shm)
{
    rank_ctx ctx[8];
    ct_comm_options o = ct_comm_options_default();
    o.use_shm = shm;
    o.timeout_s = 20;
    o.small_bytes = 4096; /* small enough that the larger sizes take the rings */
    char name[32];
    snprintf(name, sizeof name, "ops%d%s", P, shm ? "" : "_tcp");
    run_ranks(P, name, body_ops, ctx, &o);
}

/* Rank 0 runs all_reduce; rank 1 never does. */
static void body_timeout(rank_ctx *r, ct_comm *c)
{
    if (r->rank == 1) {
        sleep_s(0.6);
        return;
    }
    float x = 1, y;
    double t0 = cm_now();
    r->st = ct_comm_all_reduce(c, &x, &y, 1, CT_DTYPE_F32, CT_REDUCE_SUM, 0.3, NULL);
    r->t_fail = cm_now() - t0;
    snprintf(r->msg, sizeof r->msg, "%s", ct_last_error());
    /* the communicator refuses new work now */
    RCHECK(r, ct_comm_failed(c));
    RCHECK(r, ct_comm_all_reduce(c, &x, &y, 1, CT_DTYPE_F32, CT_REDUCE_SUM, 0.3, NULL) == CT_EPEER);
    char *js = NULL;
    RCHECK(r, ct_comm_flight_recorder_json(c, "test", &js) == CT_OK);
    json_error_t err;
    json_t *doc = js ? json_loads(js, 0, &err) : NULL;
    json_t *e0 = json_array_get(json_object_get(doc, "entries"), 0);
    RCHECK(r, e0 && !strcmp(json_string_value(json_object_get(e0, "state")), "timed_out"));
    RCHECK(r, json_integer_value(json_array_get(json_object_get(e0, "missing_ranks"), 0)) == 1);
    json_t *p1 = json_array_get(json_object_get(doc, "peers"), 0);
    RCHECK(r, json_integer_value(json_object_get(p1, "rank")) == 1 &&
                  json_integer_value(json_object_get(p1, "last_enqueued_seq")) == 0);
    json_decref(doc);
    ct_free(js);
}

static void test_timeout(void)
{
    rank_ctx ctx[2];
    ct_comm_options o = ct_comm_options_default();
    o.timeout_s = 5;
    run_ranks(2, "timeout", body_timeout, ctx, &o);
    CHECK(ctx[0].st == CT_ETIMEDOUT);
    CHECK(ctx[0].t_fail >= 0.29 && ctx[0].t_fail < 1.0);
    CHECK(strstr(ctx[0].msg, "ranks 1 did not arrive") != NULL);
    if (!strstr(ctx[0].msg, "ranks 1 did not arrive"))
        fprintf(stderr, "  message: %s\n", ctx[0].msg);
}

typedef struct {
    ct_comm *c;
    double delay;
} aborter;

static void *abort_later(void *arg)
{
    aborter *a = arg;
    sleep_s(a->delay);
    ct_comm_abort(a->c);
    ct_comm_abort(a->c); /* twice is fine */
    return NULL;
}

static void body_abort(rank_ctx *r, ct_comm *c)
{
    if (r->rank == 1) {
        sleep_s(0.5);
        return;
    }
    float x[100] = {0}, y[100];
    ct_work *w, *w2;
    RCHECK(r, ct_comm_all_reduce(c, x, y, 100, CT_DTYPE_F32, CT_REDUCE_SUM, 30, &w) == CT_OK);
    RCHECK(r, ct_comm_all_reduce(c, x, y, 100, CT_DTYPE_F32, CT_REDUCE_SUM, 30, &w2) == CT_OK);
    aborter a = {c, 0.1};
    pthread_t th;
    pthread_create(&th, NULL, abort_later, &a);
    double t0 = cm_now();
    r->st = ct_work_wait(w, -1);
    r->t_fail = cm_now() - t0;
    RCHECK(r, ct_work_get_state(w) == CT_WORK_CANCELLED);
    RCHECK(r, ct_work_wait(w2, -1) == CT_ECANCELLED && ct_work_get_state(w2) == CT_WORK_CANCELLED);
    pthread_join(th, NULL);
    ct_work_free(w);
    ct_work_free(w2);
    RCHECK(r, ct_comm_barrier(c, 1, NULL) == CT_ECANCELLED);
}

static void test_abort(void)
{
    rank_ctx ctx[2];
    run_ranks(2, "abort", body_abort, ctx, NULL);
    CHECK(ctx[0].st == CT_ECANCELLED);
    CHECK(ctx[0].t_fail >= 0.09 && ctx[0].t_fail < 0.6);
}

static void body_nan(rank_ctx *r, ct_comm *c)
{
    float x[4] = {1, 2, 3, 4}, y[4];
    if (r->rank == 1) x[2] = NAN;
    double t0 = cm_now();
    r->st = ct_comm_all_reduce(c, x, y, 4, CT_DTYPE_F32, CT_REDUCE_SUM, 10, NULL);
    r->t_fail = cm_now() - t0;
    snprintf(r->msg, sizeof r->msg, "%s", ct_last_error());
}

static void test_nan(void)
{
    rank_ctx ctx[2];
    ct_comm_options o = ct_comm_options_default();
    o.nan_check = true;
    run_ranks(2, "nan", body_nan, ctx, &o);
    CHECK(ctx[1].st == CT_EINVAL && strstr(ctx[1].msg, "NaN"));
    /* rank 0 learns it through shared memory, long before its 10 s timeout */
    CHECK(ctx[0].st == CT_EPEER && ctx[0].t_fail < 2.0 && strstr(ctx[0].msg, "rank 1"));
}

/* Background progress: the op completes while this thread never waits. */
static void body_overlap(rank_ctx *r, ct_comm *c)
{
    static float x[2][1 << 16], y[2][1 << 16];
    ct_work *w;
    for (int i = 0; i < (1 << 16); i++)
        x[r->rank][i] = 1;
    RCHECK(r, ct_comm_all_reduce(c, x[r->rank], y[r->rank], 1 << 16, CT_DTYPE_F32, CT_REDUCE_SUM, 0,
                                 &w) == CT_OK);
    double t0 = cm_now();
    while (!ct_work_test(w) && cm_now() - t0 < 5)
        sleep_s(0.001); /* "compute" */
    RCHECK(r, ct_work_get_state(w) == CT_WORK_COMPLETED && y[r->rank][12345] == 2);
    ct_work_free(w);
}

typedef struct {
    pthread_mutex_t mu;
    char text[16384];
    size_t len;
} log_buf;

static void capture(void *user, ct_log_level level, const char *component, const char *message)
{
    log_buf *b = user;
    (void)level;
    pthread_mutex_lock(&b->mu);
    if (!strcmp(component, "comm") && b->len + strlen(message) + 2 < sizeof b->text)
        b->len += (size_t)snprintf(b->text + b->len, sizeof b->text - b->len, "%s\n", message);
    pthread_mutex_unlock(&b->mu);
}

static void test_overlap_and_log(void)
{
    static log_buf lb = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};
    ct_log_set_sink(capture, &lb, CT_LOG_DEBUG);
    rank_ctx ctx[2];
    run_ranks(2, "overlap", body_overlap, ctx, NULL);
    ct_log_set_sink(NULL, NULL, CT_LOG_INFO);
    /* Every event is one JSON object: init and free for both ranks. */
    int inits = 0, frees = 0, bad = 0;
    for (char *line = strtok(lb.text, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t err;
        json_t *j = json_loads(line, 0, &err);
        if (!j) {
            bad++;
            continue;
        }
        const char *ev = json_string_value(json_object_get(j, "event"));
        inits += ev && !strcmp(ev, "init") &&
                 !strcmp(json_string_value(json_object_get(j, "comm")), "overlap");
        frees += ev && !strcmp(ev, "free");
        json_decref(j);
    }
    CHECK(bad == 0 && inits == 2 && frees == 2);
}

static void test_args(void)
{
    ct_comm_options o = ct_comm_options_default();
    ct_comm *c = NULL;
    CHECK_STATUS(ct_comm_init(NULL, 0, 1, &o, &c), CT_EINVAL);
    ct_store *s;
    CHECK_OK(ct_store_connect("127.0.0.1", g_port, 5, &s));
    CHECK_STATUS(ct_comm_init(s, 1, 1, &o, &c), CT_EINVAL);
    o.timeout_s = -1;
    CHECK_STATUS(ct_comm_init(s, 0, 1, &o, &c), CT_EINVAL);
    o = ct_comm_options_default();
    o.slot_bytes = 100;
    CHECK_STATUS(ct_comm_init(s, 0, 1, &o, &c), CT_EINVAL);
    o = ct_comm_options_default();
    o.name = "single";
    CHECK_OK(ct_comm_init(s, 0, 1, &o, &c));
    float x[3] = {1, 2, 3}, y[3] = {0}, z[9];
    CHECK_OK(ct_comm_all_reduce(c, x, y, 3, CT_DTYPE_F32, CT_REDUCE_AVG, 0, NULL));
    CHECK(y[0] == 1 && y[2] == 3);
    CHECK_OK(ct_comm_reduce_scatter_single(c, x, y, 3, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL));
    CHECK_OK(ct_comm_all_gather_single(c, x, z, 3, CT_DTYPE_F32, 0, NULL));
    CHECK(z[2] == 3);
    CHECK_OK(ct_comm_barrier(c, 0, NULL));
    int32_t ix[2] = {1, 2};
    CHECK_STATUS(ct_comm_all_reduce(c, ix, ix, 2, CT_DTYPE_I32, CT_REDUCE_AVG, 0, NULL), CT_EINVAL);
    CHECK_STATUS(ct_comm_all_reduce(c, x, x + 1, 2, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL),
                 CT_EINVAL);
    CHECK_STATUS(ct_comm_all_reduce(c, x, y, 3, CT_DTYPE_I8, CT_REDUCE_SUM, 0, NULL), CT_EINVAL);
    CHECK_STATUS(ct_comm_all_reduce(c, x, y, 3, CT_DTYPE_F32, (ct_reduce_op)9, 0, NULL), CT_EINVAL);
    CHECK_STATUS(ct_comm_all_reduce(c, NULL, y, 3, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL),
                 CT_EINVAL);
    CHECK_STATUS(ct_comm_all_reduce(NULL, x, y, 3, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL),
                 CT_EINVAL);
    CHECK_STATUS(ct_comm_all_reduce(c, x, y, 3, CT_DTYPE_F32, CT_REDUCE_SUM, NAN, NULL), CT_EINVAL);
    CHECK_STATUS(ct_comm_broadcast(c, x, 3, CT_DTYPE_F32, 1, 0, NULL), CT_EINVAL);
    CHECK_STATUS(ct_comm_send(c, x, 3, CT_DTYPE_F32, 0, 0, NULL), CT_EINVAL);
    CHECK_STATUS(ct_comm_all_to_all_single(c, x, x, 1, CT_DTYPE_F32, 0, NULL), CT_EINVAL);
    CHECK_STATUS(ct_comm_all_reduce(c, x, y, SIZE_MAX / 2, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL),
                 CT_EOVERFLOW);
    int r2[2] = {0, 0};
    ct_comm *sub;
    CHECK_STATUS(ct_comm_split(c, r2, 2, NULL, &sub), CT_EINVAL);
    CHECK_STATUS(ct_comm_split(c, r2, 0, NULL, &sub), CT_EINVAL);
    CHECK_STATUS(ct_work_wait(NULL, -1), CT_EINVAL);
    CHECK(ct_work_get_state(NULL) == CT_WORK_ERROR && !ct_work_test(NULL));
    CHECK_STATUS(ct_comm_flight_recorder_dump(c, NULL), CT_EINVAL);
    char path[256];
    snprintf(path, sizeof path, "/tmp/ctorch_unit_fr_%d.json", (int)getpid());
    CHECK_OK(ct_comm_flight_recorder_dump(c, path));
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (f) {
        char buf[4096] = {0};
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        CHECK(n > 0 && strstr(buf, "\"comm\": \"single\""));
        fclose(f);
    }
    unlink(path);
    ct_comm_free(c);
    ct_comm_free(NULL);
    ct_comm_abort(NULL);
    ct_store_free(s);
    /* names */
    CHECK(!strcmp(ct_comm_backend_name(CT_COMM_TCP), "tcp") &&
          !strcmp(ct_reduce_op_name(CT_REDUCE_PROD), "prod"));
    CHECK(!strcmp(ct_work_state_name(CT_WORK_TIMED_OUT), "timed_out"));
    ct_comm_backend b;
    CHECK_OK(ct_comm_backend_from_name("mpi", &b));
    CHECK(b == CT_COMM_MPI);
    CHECK_STATUS(ct_comm_backend_from_name("nccl", &b), CT_EINVAL);
    CHECK(ct_comm_backend_available(CT_COMM_TCP));
}

/* The flight-recorder dump (issue 14 item 8): a link planted at the old predictable
 * temporary name (<path>.tmp<pid>) or at the target itself is never followed; the dump
 * lands complete, and no temporary file is left. */
static void test_fr_dump_atomic(void)
{
    char dir[] = "/tmp/ctorch_fr_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256], victim[256], planted[300];
    snprintf(path, sizeof path, "%s/fr.json", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(planted, sizeof planted, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(victim, "w");
    fputs("precious", f);
    fclose(f);
    CHECK(symlink(victim, planted) == 0);
    ct_store *s = NULL;
    CHECK_OK(ct_store_connect("127.0.0.1", g_port, 5, &s));
    ct_comm_options o = ct_comm_options_default();
    o.name = "frdump";
    ct_comm *c = NULL;
    CHECK_OK(ct_comm_init(s, 0, 1, &o, &c));
    for (int round = 0; round < 2 && c; round++) {
        CHECK_OK(ct_comm_flight_recorder_dump(c, path));
        char buf[64] = {0};
        f = fopen(victim, "r");
        CHECK(f && fread(buf, 1, sizeof buf - 1, f) == 8 && !strcmp(buf, "precious"));
        if (f) fclose(f);
        json_error_t err;
        json_t *j = json_load_file(path, 0, &err);
        CHECK(j && json_integer_value(json_object_get(j, "rank")) == 0);
        json_decref(j);
        struct stat sb;
        CHECK(lstat(path, &sb) == 0 && S_ISREG(sb.st_mode));
        /* Round 2: the target itself is a link to the victim (replaced, not followed). */
        unlink(path);
        CHECK(symlink(victim, path) == 0);
    }
    CHECK_OK(ct_comm_flight_recorder_dump(c, path));
    DIR *d = opendir(dir);
    int entries = 0, tmps = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        entries++;
        tmps += strcmp(e->d_name, "fr.json") && strcmp(e->d_name, "victim") &&
                strcmp(e->d_name, strrchr(planted, '/') + 1);
    }
    if (d) closedir(d);
    CHECK(entries == 3 && tmps == 0); /* fr.json, victim, the planted link */
    CHECK_STATUS(ct_comm_flight_recorder_dump(c, "/nonexistent-dir/x/fr.json"), CT_EIO);
    ct_comm_free(c);
    ct_store_free(s);
    unlink(planted);
    unlink(path);
    unlink(victim);
    rmdir(dir);
}

int main(void)
{
    ct_store_server *srv;
    if (ct_store_server_start("127.0.0.1", 0, &srv) != CT_OK) {
        fprintf(stderr, "cannot start the store: %s\n", ct_last_error());
        return 1;
    }
    g_port = ct_store_server_port(srv);
    test_store();
    test_kernels();
    test_args();
    test_ops(2, 1);
    test_ops(3, 1);
    test_ops(4, 1);
    test_ops(3, 0);
    test_timeout();
    test_abort();
    test_nan();
    test_overlap_and_log();
    test_fr_dump_atomic();
    ct_store_server_free(srv);
    return t_report("test_comm_unit");
}
