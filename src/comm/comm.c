/* Communicators: creation (from a store or the environment), the queue of operations and
 * its executor (a background thread, or the thread that waits), the public operations with
 * their argument checks, work handles, abort and free. */
#include "comm/comm_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- names --------------------------------------------------------------------------------- */

const char *ct_comm_backend_name(ct_comm_backend b)
{
    switch (b) {
    case CT_COMM_TCP:
        return "tcp";
    case CT_COMM_MPI:
        return "mpi";
    }
    return "?";
}

ct_status ct_comm_backend_from_name(const char *name, ct_comm_backend *out)
{
    if (!name || !out)
        return ct_error(CT_EINVAL, "ct_comm_backend_from_name: name and out must not be NULL");
    if (!strcmp(name, "tcp"))
        *out = CT_COMM_TCP;
    else if (!strcmp(name, "mpi"))
        *out = CT_COMM_MPI;
    else
        return ct_error(CT_EINVAL, "ct_comm_backend_from_name: unknown backend '%s' (tcp or mpi)",
                        name);
    return CT_OK;
}

bool ct_comm_backend_available(ct_comm_backend b)
{
#ifdef CT_HAVE_MPI
    return b == CT_COMM_TCP || b == CT_COMM_MPI;
#else
    return b == CT_COMM_TCP;
#endif
}

const char *ct_reduce_op_name(ct_reduce_op op)
{
    switch (op) {
    case CT_REDUCE_SUM:
        return "sum";
    case CT_REDUCE_AVG:
        return "avg";
    case CT_REDUCE_MAX:
        return "max";
    case CT_REDUCE_MIN:
        return "min";
    case CT_REDUCE_PROD:
        return "prod";
    }
    return "?";
}

const char *ct_work_state_name(ct_work_state s)
{
    switch (s) {
    case CT_WORK_NOT_STARTED:
        return "not_started";
    case CT_WORK_IN_PROGRESS:
        return "in_progress";
    case CT_WORK_COMPLETED:
        return "completed";
    case CT_WORK_TIMED_OUT:
        return "timed_out";
    case CT_WORK_ERROR:
        return "error";
    case CT_WORK_CANCELLED:
        return "cancelled";
    }
    return "?";
}

const char *cm_op_name(cm_opkind k)
{
    static const char *names[] = {"all_reduce",
                                  "broadcast",
                                  "reduce",
                                  "all_gather_single",
                                  "reduce_scatter_single",
                                  "all_to_all_single",
                                  "gather",
                                  "scatter",
                                  "send",
                                  "recv",
                                  "barrier"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

static int is_p2p(cm_opkind k)
{
    return k == CM_OP_SEND || k == CM_OP_RECV;
}

static int terminal(int s)
{
    return s >= CT_WORK_COMPLETED;
}

void cm_describe(const ct_work *w, char *buf, size_t cap)
{
    if (is_p2p(w->kind))
        snprintf(buf, cap, "%s #%llu %s rank %d (%zu x %s)", cm_op_name(w->kind),
                 (unsigned long long)w->p2p_seq, w->kind == CM_OP_SEND ? "to" : "from", w->root,
                 w->count, ct_dtype_name(w->dt));
    else if (w->kind == CM_OP_BARRIER)
        snprintf(buf, cap, "barrier seq %llu", (unsigned long long)w->seq);
    else
        snprintf(buf, cap, "%s seq %llu (%zu x %s)", cm_op_name(w->kind),
                 (unsigned long long)w->seq, w->count, ct_dtype_name(w->dt));
}

/* ---- options ----------------------------------------------------------------------------------
 */

ct_comm_options ct_comm_options_default(void)
{
    const char *b = getenv("CT_COMM_BACKEND");
    double timeout = cm_env_double("CT_COMM_TIMEOUT", 600.0);
    long fr = cm_env_long("CT_COMM_FR_ENTRIES", 1024);
    const char *d = getenv("CT_COMM_FR_DUMP_DIR");
    return (ct_comm_options){
        .backend = b && !strcmp(b, "mpi") ? CT_COMM_MPI : CT_COMM_TCP,
        .name = "default",
        .timeout_s = timeout > 0 ? timeout : 600.0,
        .flight_recorder_entries = fr < 0 ? 0 : fr > 1000000 ? 1000000 : (int)fr,
        .dump_dir = d && *d ? d : NULL,
        .nan_check = cm_env_long("CT_COMM_NAN_CHECK", 0) != 0,
        .use_shm = cm_env_long("CT_COMM_SHM", 1) != 0,
        .small_bytes = 64u << 10,
        .slot_bytes = 256u << 10,
        .secret = NULL,
    };
}

static ct_status check_options(const char *fn, const ct_comm_options *o)
{
    if (o->backend != CT_COMM_TCP && o->backend != CT_COMM_MPI)
        return ct_error(CT_EINVAL, "%s: opt->backend %d is not a ct_comm_backend", fn,
                        (int)o->backend);
    if (!ct_comm_backend_available(o->backend))
        return ct_error(CT_EUNSUPPORTED,
                        "%s: backend '%s' is not built into this libctorch (rebuild with MPI)", fn,
                        ct_comm_backend_name(o->backend));
    if (!(o->timeout_s > 0) || !isfinite(o->timeout_s))
        return ct_error(CT_EINVAL,
                        "%s: opt->timeout_s must be a positive number of seconds, got %g", fn,
                        o->timeout_s);
    if (o->flight_recorder_entries < 0)
        return ct_error(CT_EINVAL, "%s: opt->flight_recorder_entries must be >= 0", fn);
    if (o->slot_bytes < 4096 || o->slot_bytes > (64u << 20) || o->slot_bytes % 64)
        return ct_error(CT_EINVAL,
                        "%s: opt->slot_bytes must be a multiple of 64 in [4 KiB, 64 MiB], got %zu",
                        fn, o->slot_bytes);
    if (o->small_bytes > (16u << 20))
        return ct_error(CT_EINVAL, "%s: opt->small_bytes must be <= 16 MiB, got %zu", fn,
                        o->small_bytes);
    if (o->name && strlen(o->name) > 80)
        return ct_error(CT_EINVAL, "%s: opt->name must be at most 80 bytes", fn);
    return CT_OK;
}

/* ---- work bookkeeping ------------------------------------------------------------------------ */

static void work_release(ct_work *w)
{
    if (atomic_fetch_sub(&w->refs, 1) == 1) {
        ct_free(w->missing);
        ct_free(w);
    }
}

ct_status cm_work_fail(ct_work *w, int state, ct_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->msg, sizeof w->msg, fmt, ap);
    va_end(ap);
    w->fail_state = state;
    w->status = s;
    return s;
}

void cm_work_set_missing(ct_work *w, const int *ranks, int n)
{
    ct_free(w->missing);
    w->missing = NULL;
    w->nmissing = 0;
    if (n <= 0 || ct_alloc((void **)&w->missing, sizeof(int) * (size_t)n) != CT_OK) return;
    memcpy(w->missing, ranks, sizeof(int) * (size_t)n);
    w->nmissing = n;
}

static void unlink_work(ct_comm *c, ct_work *w)
{
    ct_work **pp = &c->qhead, *prev = NULL;
    while (*pp && *pp != w) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp) return;
    *pp = w->next;
    if (c->qtail == w) c->qtail = prev;
    w->next = NULL;
}

/* With c->mu held. The caller drops the queue's reference afterwards. */
static void end_locked(ct_comm *c, ct_work *w, ct_status st)
{
    w->t_completed = cm_wall_ns();
    int state = CT_WORK_COMPLETED;
    if (st != CT_OK) {
        if (!w->fail_state) {
            w->fail_state = st == CT_ETIMEDOUT    ? CT_WORK_TIMED_OUT
                            : st == CT_ECANCELLED ? CT_WORK_CANCELLED
                                                  : CT_WORK_ERROR;
            if (!w->msg[0]) {
                char d[160];
                cm_describe(w, d, sizeof d);
                snprintf(w->msg, sizeof w->msg, "%s failed on rank %d: %s", d, c->rank,
                         ct_last_error());
            }
        }
        state = w->fail_state;
        w->status = st;
    } else if (!is_p2p(w->kind)) {
        atomic_store(&c->last_completed, w->seq);
        if (c->ctrl) atomic_store(&c->ctrl->completed_seq, w->seq);
    }
    unlink_work(c, w);
    atomic_store(&w->state, state);
    cm_fr_update(c, w);
    pthread_cond_broadcast(&c->cv);
}

void cm_work_end(ct_comm *c, ct_work *w, ct_status st)
{
    pthread_mutex_lock(&c->mu);
    end_locked(c, w, st);
    pthread_mutex_unlock(&c->mu);
    work_release(w);
}

/* Mark the communicator failed because `w` is failing with st (w may be NULL): no new work,
 * peers on this host told (when tell_peers), an event logged, the recorder dumped. Call it
 * before ending w, so the dump shows how w ended. */
void cm_comm_fail(ct_comm *c, ct_work *w, ct_status st, int tell_peers)
{
    if (atomic_exchange(&c->failed, 1)) return;
    snprintf(c->fail_msg, sizeof c->fail_msg, "%s", w ? w->msg : "aborted");
    if (w) cm_fr_update(c, w);
    if (tell_peers && c->ctrl && atomic_load(&c->ctrl->state) == CM_RANK_OK) {
        snprintf(c->ctrl->reason, sizeof c->ctrl->reason, "%.190s", c->fail_msg);
        c->ctrl->culprit = w && w->nmissing == 1 && st == CT_EPEER ? w->missing[0] : -1;
        atomic_store(&c->ctrl->state, CM_RANK_FAILED);
    }
    char esc[CM_MSG * 2];
    size_t k = 0;
    for (const char *p = c->fail_msg; *p && k + 2 < sizeof esc; p++) {
        if (*p == '"' || *p == '\\') esc[k++] = '\\';
        esc[k++] = *p;
    }
    esc[k] = 0;
    cm_log_event(c, CT_LOG_ERROR,
                 st == CT_ETIMEDOUT    ? "timeout"
                 : st == CT_ECANCELLED ? "cancelled"
                                       : "error",
                 "\"seq\":%llu,\"status\":\"%s\",\"message\":\"%s\"",
                 (unsigned long long)(w ? w->seq : 0), ct_status_name(st), esc);
    cm_fr_auto_dump(c, st == CT_ETIMEDOUT    ? "timeout"
                       : st == CT_ECANCELLED ? "cancelled"
                                             : "error");
}

/* With c->mu held: end every queued work that has not started. */
static void cancel_queued_locked(ct_comm *c)
{
    ct_work *w = c->qhead;
    while (w) {
        ct_work *next = w->next;
        if (atomic_load(&w->state) == CT_WORK_NOT_STARTED) {
            char d[160];
            cm_describe(w, d, sizeof d);
            if (atomic_load(&c->aborted))
                cm_work_fail(w, CT_WORK_CANCELLED, CT_ECANCELLED,
                             "%s cancelled on rank %d by ct_comm_abort", d, c->rank);
            else
                cm_work_fail(w, CT_WORK_CANCELLED, CT_ECANCELLED,
                             "%s not run on rank %d: the communicator failed earlier (%s)", d,
                             c->rank, c->fail_msg);
            end_locked(c, w, CT_ECANCELLED);
            work_release(w);
        }
        w = next;
    }
}

/* ---- the executor -----------------------------------------------------------------------------
 */

static ct_work *next_ready(ct_comm *c)
{
    for (ct_work *w = c->qhead; w; w = w->next)
        if (atomic_load(&w->state) == CT_WORK_NOT_STARTED) return w;
    return NULL;
}

static void mark_started(ct_comm *c, ct_work *w)
{
    w->t_started = cm_wall_ns();
    atomic_store(&w->state, CT_WORK_IN_PROGRESS);
    if (!is_p2p(w->kind)) {
        atomic_store(&c->last_started, w->seq);
        if (c->ctrl) atomic_store(&c->ctrl->started_seq, w->seq);
    }
}

int cm_absorb_p2p(ct_comm *c, ct_work **ws, int have, int cap)
{
    pthread_mutex_lock(&c->mu);
    for (ct_work *w = c->qhead; w && have < cap; w = w->next) {
        int st = atomic_load(&w->state);
        if (st != CT_WORK_NOT_STARTED) continue;
        if (!is_p2p(w->kind) || atomic_load(&c->aborted)) break;
        mark_started(c, w);
        cm_fr_update(c, w);
        ws[have++] = w;
    }
    pthread_mutex_unlock(&c->mu);
    return have;
}

/* Run queued works in order until `target` has ended (or the queue is empty for NULL).
 * Called and returns with c->mu held and c->executing set by the caller. */
static void exec_loop(ct_comm *c, ct_work *target)
{
    for (;;) {
        if (target && terminal(atomic_load(&target->state))) return;
        ct_work *w = next_ready(c);
        if (!w) return;
        if (atomic_load(&c->failed) || atomic_load(&c->aborted)) {
            cancel_queued_locked(c);
            continue;
        }
        mark_started(c, w);
        cm_fr_update(c, w);
        pthread_mutex_unlock(&c->mu);
        ct_status st;
        if (is_p2p(w->kind)) {
            st = c->backend == CT_COMM_MPI ? cm_mpi_run_p2p(c, w) : cm_tcp_run_p2p(c, w);
        } else {
            st = c->backend == CT_COMM_MPI ? cm_mpi_run(c, w) : cm_tcp_run(c, w);
            if (st) cm_comm_fail(c, w, st, st == CT_EPEER || st == CT_EINVAL);
            cm_work_end(c, w, st);
        }
        pthread_mutex_lock(&c->mu);
    }
}

static void *bg_main(void *arg)
{
    ct_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        if (!c->executing && next_ready(c)) {
            c->executing = 1;
            exec_loop(c, NULL);
            c->executing = 0;
            pthread_cond_broadcast(&c->cv);
            continue;
        }
        pthread_cond_wait(&c->bg_cv, &c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* With c->mu held, after a waiting thread stops executing: hand what is left to the
 * progress thread. */
static void release_executor(ct_comm *c)
{
    c->executing = 0;
    pthread_cond_broadcast(&c->cv);
    if (next_ready(c)) pthread_cond_signal(&c->bg_cv);
}

/* ---- creation ----------------------------------------------------------------------------------
 */

ct_status cm_comm_create(ct_store *store, int rank, int size, const ct_comm_options *opt,
                         const char *name, const char *prefix, double deadline,
                         const cm_mpi_from *from, ct_comm **out)
{
    ct_comm *c;
    CT_TRY(ct_calloc((void **)&c, sizeof *c));
    c->rank = rank;
    c->size = size;
    c->opt = *opt;
    c->backend = opt->backend;
    snprintf(c->name, sizeof c->name, "%s", name && *name ? name : "default");
    c->opt.name = c->name;
    if (opt->dump_dir && *opt->dump_dir) {
        snprintf(c->dump_dir, sizeof c->dump_dir, "%s", opt->dump_dir);
        c->opt.dump_dir = c->dump_dir;
    } else {
        c->opt.dump_dir = NULL;
    }
    snprintf(c->prefix, sizeof c->prefix, "%s", prefix ? prefix : "");
    c->shm_slot = opt->slot_bytes;
    c->store = store;
    c->local_rank = -1;
    ct_status kst = cm_key_resolve("ct_comm_init", opt->secret, &c->key);
    if (kst) {
        ct_free(c);
        return kst;
    }
    /* Splits and shrinks pass c->opt on: keep the secret they need in the communicator. */
    memcpy(c->secret, c->key.k, c->key.n);
    c->secret[c->key.n] = 0;
    c->opt.secret = c->secret;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_cond_init(&c->bg_cv, NULL);
    cm_fr_init(&c->fr, (size_t)opt->flight_recorder_entries);
    double t0 = cm_now();
    ct_status st = CT_OK;
    if (c->backend == CT_COMM_MPI) {
        st = cm_mpi_init(c, rank, size, from);
    } else {
        if (size < 1 || size > CM_MAX_RANKS || rank < 0 || rank >= size)
            st = ct_error(CT_EINVAL, "ct_comm_init: rank %d / size %d: need 0 <= rank < size <= %d",
                          rank, size, CM_MAX_RANKS);
        if (!st) st = cm_tcp_setup(c, deadline);
    }
    if (!st) st = ct_calloc((void **)&c->send_seq, sizeof(uint64_t) * 2 * (size_t)c->size);
    if (!st) {
        c->recv_seq = c->send_seq + c->size;
        if (!c->ctrl) st = ct_calloc((void **)&c->ctrl, sizeof(cm_ctrl));
    }
    if (!st) {
        if (pthread_create(&c->bg, NULL, bg_main, c) != 0)
            st = ct_error(CT_EIO, "ct_comm_init: cannot start the progress thread");
        else
            c->bg_started = 1;
    }
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ct_last_error());
        ct_comm_free(c);
        return ct_error(st, "%s", msg);
    }
    if (c->local_rank < 0) c->local_rank = 0;
    cm_log_event(c, CT_LOG_INFO, "init", "\"backend\":\"%s\",\"setup_ms\":%.3f",
                 ct_comm_backend_name(c->backend), (cm_now() - t0) * 1e3);
    *out = c;
    return CT_OK;
}

ct_status ct_comm_init(ct_store *store, int rank, int size, const ct_comm_options *opt,
                       ct_comm **out)
{
    const char *fn = "ct_comm_init";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    *out = NULL;
    ct_comm_options o = opt ? *opt : ct_comm_options_default();
    CT_TRY(check_options(fn, &o));
    if (o.backend == CT_COMM_TCP && !store)
        return ct_error(CT_EINVAL, "%s: the tcp backend needs a store (ct_store_connect)", fn);
    if (size < 1 || size > CM_MAX_RANKS)
        return ct_error(CT_EINVAL, "%s: size %d is not in [1, %d]", fn, size, CM_MAX_RANKS);
    if (rank < 0 || rank >= size)
        return ct_error(CT_EINVAL, "%s: rank %d is not in [0, size=%d)", fn, rank, size);
    char prefix[256];
    const char *name = o.name && *o.name ? o.name : "default";
    snprintf(prefix, sizeof prefix, "ctc/%s/%lld", name,
             store ? (long long)cm_store_next_id(store) : 0LL);
    return cm_comm_create(store, rank, size, &o, name, prefix, cm_now() + o.timeout_s, NULL, out);
}

static int env_int(const char *const *names, int n, long *out)
{
    for (int i = 0; i < n; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*end) return -1;
            *out = x;
            return 1;
        }
    }
    return 0;
}

ct_status ct_comm_init_env(const ct_comm_options *opt, ct_comm **out)
{
    const char *fn = "ct_comm_init_env";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    *out = NULL;
    ct_comm_options o = opt ? *opt : ct_comm_options_default();
    CT_TRY(check_options(fn, &o));
    const char *name = o.name && *o.name ? o.name : "default";
    if (o.backend == CT_COMM_MPI) {
        char prefix[128];
        snprintf(prefix, sizeof prefix, "mpi/%s", name);
        return cm_comm_create(NULL, -1, -1, &o, name, prefix, cm_now() + o.timeout_s, NULL, out);
    }
    static const char *const rk[] = {"RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"};
    static const char *const sz[] = {"WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"};
    long rank = -1, size = -1, port = -1, local = -1;
    int a = env_int(rk, 3, &rank), b = env_int(sz, 3, &size);
    if (a <= 0 || b <= 0)
        return ct_error(CT_EINVAL,
                        "%s: RANK and WORLD_SIZE must be set to integers (run under ctorch launch, "
                        "torchrun or mpiexec)",
                        fn);
    if (size < 1 || size > CM_MAX_RANKS || rank < 0 || rank >= size)
        return ct_error(CT_EINVAL,
                        "%s: RANK=%ld / WORLD_SIZE=%ld: need 0 <= RANK < WORLD_SIZE <= %d", fn,
                        rank, size, CM_MAX_RANKS);
    static const char *const pt[] = {"MASTER_PORT"};
    if (env_int(pt, 1, &port) <= 0 || port <= 0 || port > 65535)
        return ct_error(CT_EINVAL, "%s: MASTER_PORT must be set to a TCP port (1..65535)", fn);
    static const char *const lr[] = {"LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"};
    if (env_int(lr, 3, &local) <= 0) local = -1;
    const char *addr = getenv("MASTER_ADDR");
    if (!addr || !*addr) addr = "127.0.0.1";
    const char *hosted = getenv("CT_STORE_HOSTED");
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    int external = (hosted && !strcmp(hosted, "1")) || (agent && !strcmp(agent, "True"));
    ct_store_server *srv = NULL;
    ct_store_options so = ct_store_options_default();
    so.secret = o.secret;
    if (!external && rank == 0) CT_TRY(ct_store_server_start_opts(addr, (int)port, &so, &srv));
    ct_store *store = NULL;
    ct_status st = ct_store_connect_opts(addr, (int)port, o.timeout_s, &so, &store);
    if (st) {
        ct_store_server_free(srv);
        return ct_error_wrap(st, "%s: no store at MASTER_ADDR=%s MASTER_PORT=%ld", fn, addr, port);
    }
    char prefix[256];
    snprintf(prefix, sizeof prefix, "ctc/%s/%lld", name, (long long)cm_store_next_id(store));
    ct_comm *c = NULL;
    cm_store_ref *ref = NULL;
    st = ct_calloc((void **)&ref, sizeof *ref);
    if (!st)
        st = cm_comm_create(store, (int)rank, (int)size, &o, name, prefix, cm_now() + o.timeout_s,
                            NULL, &c);
    if (st) {
        ct_free(ref);
        ct_store_free(store);
        ct_store_server_free(srv);
        return st;
    }
    atomic_store(&ref->refs, 1);
    ref->store = store;
    ref->server = srv;
    c->sref = ref;
    if (local >= 0) c->local_rank = (int)local;
    *out = c;
    return CT_OK;
}

/* ---- accessors
 * ------------------------------------------------------------------------------------ */

int ct_comm_rank(const ct_comm *c)
{
    return c ? c->rank : -1;
}

int ct_comm_size(const ct_comm *c)
{
    return c ? c->size : 0;
}

int ct_comm_local_rank(const ct_comm *c)
{
    return c ? c->local_rank : -1;
}

const char *ct_comm_name(const ct_comm *c)
{
    return c ? c->name : "";
}

ct_comm_backend ct_comm_get_backend(const ct_comm *c)
{
    return c ? c->backend : CT_COMM_TCP;
}

bool ct_comm_failed(const ct_comm *c)
{
    return c && atomic_load(&c->failed);
}

/* ---- issuing operations
 * -------------------------------------------------------------------------- */

static int dtype_ok(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64 || dt == CT_DTYPE_F16 || dt == CT_DTYPE_BF16 ||
           dt == CT_DTYPE_I32 || dt == CT_DTYPE_I64 || dt == CT_DTYPE_U8;
}

static int is_float(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64 || dt == CT_DTYPE_F16 || dt == CT_DTYPE_BF16;
}

static int overlap(const void *a, size_t na, const void *b, size_t nb)
{
    const char *x = a, *y = b;
    return na && nb && x < y + nb && y < x + na;
}

typedef struct op_args {
    const char *fn;
    cm_opkind kind;
    const void *sbuf;
    void *rbuf;
    size_t count;
    ct_dtype dt;
    ct_reduce_op op;
    int root;
    double timeout_s;
} op_args;

static ct_status check_args(ct_comm *c, const op_args *a, size_t *bytes)
{
    const char *fn = a->fn;
    if (!c) return ct_error(CT_EINVAL, "%s: comm must not be NULL", fn);
    if (a->kind != CM_OP_BARRIER) {
        if (!dtype_ok(a->dt))
            return ct_error(CT_EINVAL,
                            "%s: dtype %s is not supported (f32, f64, f16, bf16, i32, i64, u8)", fn,
                            ct_dtype_name(a->dt));
        if (!ct_mul_size(a->count, ct_dtype_size(a->dt) * (size_t)c->size, bytes) ||
            *bytes > ((size_t)1 << 46))
            return ct_error(CT_EOVERFLOW, "%s: count %zu x %d ranks is too large", fn, a->count,
                            c->size);
        *bytes = a->count * ct_dtype_size(a->dt);
    } else {
        *bytes = 0;
    }
    if (a->timeout_s != a->timeout_s || a->timeout_s > 1e9)
        return ct_error(CT_EINVAL,
                        "%s: timeout_s must be a number of seconds (<= 0 for the default)", fn);
    int reduction =
        a->kind == CM_OP_ALL_REDUCE || a->kind == CM_OP_REDUCE || a->kind == CM_OP_REDUCE_SCATTER;
    if (reduction) {
        if ((unsigned)a->op > CT_REDUCE_PROD)
            return ct_error(CT_EINVAL, "%s: op %d is not a ct_reduce_op", fn, (int)a->op);
        if (a->op == CT_REDUCE_AVG && !is_float(a->dt))
            return ct_error(CT_EINVAL, "%s: op avg needs a floating dtype, got %s", fn,
                            ct_dtype_name(a->dt));
    }
    int rooted = a->kind == CM_OP_BROADCAST || a->kind == CM_OP_REDUCE || a->kind == CM_OP_GATHER ||
                 a->kind == CM_OP_SCATTER;
    if ((rooted || is_p2p(a->kind)) && (a->root < 0 || a->root >= c->size))
        return ct_error(CT_EINVAL, "%s: %s %d is not a rank of this communicator (size %d)", fn,
                        is_p2p(a->kind) ? "peer" : "root", a->root, c->size);
    if (is_p2p(a->kind) && a->root == c->rank)
        return ct_error(CT_EINVAL, "%s: peer %d is this rank; send to another rank", fn, a->root);
    size_t b = *bytes, P = (size_t)c->size;
    int me_root = a->root == c->rank;
    if (b) {
        switch (a->kind) {
        case CM_OP_ALL_REDUCE:
            if (!a->sbuf || !a->rbuf)
                return ct_error(CT_EINVAL, "%s: sendbuf and recvbuf must not be NULL", fn);
            if (a->sbuf != a->rbuf && overlap(a->sbuf, b, a->rbuf, b))
                return ct_error(CT_EINVAL,
                                "%s: recvbuf overlaps sendbuf (use the same pointer for in place)",
                                fn);
            break;
        case CM_OP_REDUCE:
            if (!a->sbuf || (me_root && !a->rbuf))
                return ct_error(CT_EINVAL, "%s: sendbuf (and recvbuf at the root) must not be NULL",
                                fn);
            if (me_root && a->sbuf != a->rbuf && overlap(a->sbuf, b, a->rbuf, b))
                return ct_error(CT_EINVAL,
                                "%s: recvbuf overlaps sendbuf (use the same pointer for in place)",
                                fn);
            break;
        case CM_OP_REDUCE_SCATTER:
        case CM_OP_ALL_TO_ALL:
            if (!a->sbuf || !a->rbuf)
                return ct_error(CT_EINVAL, "%s: sendbuf and recvbuf must not be NULL", fn);
            if (overlap(a->sbuf, b * P, a->rbuf, a->kind == CM_OP_ALL_TO_ALL ? b * P : b))
                return ct_error(CT_EINVAL, "%s: recvbuf must not overlap sendbuf", fn);
            break;
        case CM_OP_ALL_GATHER:
            if (!a->sbuf || !a->rbuf)
                return ct_error(CT_EINVAL, "%s: sendbuf and recvbuf must not be NULL", fn);
            if (a->sbuf != (const char *)a->rbuf + b * (size_t)c->rank &&
                overlap(a->sbuf, b, a->rbuf, b * P))
                return ct_error(
                    CT_EINVAL,
                    "%s: sendbuf overlaps recvbuf other than as its own block (in place)", fn);
            break;
        case CM_OP_GATHER:
            if (!a->sbuf || (me_root && !a->rbuf))
                return ct_error(CT_EINVAL, "%s: sendbuf (and recvbuf at the root) must not be NULL",
                                fn);
            if (me_root && a->sbuf != (const char *)a->rbuf + b * (size_t)c->rank &&
                overlap(a->sbuf, b, a->rbuf, b * P))
                return ct_error(CT_EINVAL,
                                "%s: sendbuf overlaps recvbuf other than as its own block", fn);
            break;
        case CM_OP_SCATTER:
            if (!a->rbuf || (me_root && !a->sbuf))
                return ct_error(CT_EINVAL, "%s: recvbuf (and sendbuf at the root) must not be NULL",
                                fn);
            if (me_root && a->rbuf != (const char *)a->sbuf + b * (size_t)c->rank &&
                overlap(a->sbuf, b * P, a->rbuf, b))
                return ct_error(CT_EINVAL,
                                "%s: recvbuf overlaps sendbuf other than as its own block", fn);
            break;
        case CM_OP_BROADCAST:
        case CM_OP_RECV:
            if (!a->rbuf) return ct_error(CT_EINVAL, "%s: buf must not be NULL", fn);
            break;
        case CM_OP_SEND:
            if (!a->sbuf) return ct_error(CT_EINVAL, "%s: buf must not be NULL", fn);
            break;
        case CM_OP_BARRIER:
            break;
        }
    }
    if (atomic_load(&c->failed)) {
        if (atomic_load(&c->aborted))
            return ct_error(CT_ECANCELLED,
                            "%s: the communicator '%s' was aborted; shrink it or make a new one",
                            fn, c->name);
        return ct_error(
            CT_EPEER, "%s: the communicator '%s' failed earlier (%s); shrink it or make a new one",
            fn, c->name, c->fail_msg);
    }
    return CT_OK;
}

/* The input a rank contributes, for the NaN check. */
static const void *nan_input(ct_comm *c, const op_args *a, size_t *n)
{
    *n = a->count;
    switch (a->kind) {
    case CM_OP_ALL_REDUCE:
    case CM_OP_REDUCE:
    case CM_OP_ALL_GATHER:
    case CM_OP_GATHER:
    case CM_OP_SEND:
        return a->sbuf;
    case CM_OP_REDUCE_SCATTER:
    case CM_OP_ALL_TO_ALL:
        *n = a->count * (size_t)c->size;
        return a->sbuf;
    case CM_OP_BROADCAST:
        return a->root == c->rank ? a->rbuf : NULL;
    case CM_OP_SCATTER:
        *n = a->count * (size_t)c->size;
        return a->root == c->rank ? a->sbuf : NULL;
    default:
        return NULL;
    }
}

static ct_status issue(ct_comm *c, const op_args *a, ct_work **out)
{
    size_t bytes;
    if (out) *out = NULL;
    CT_TRY(check_args(c, a, &bytes));
    ct_work *w;
    CT_TRY(ct_calloc((void **)&w, sizeof *w));
    w->c = c;
    atomic_store(&w->refs, 2); /* the caller's and the queue's */
    w->kind = a->kind;
    w->sbuf = a->sbuf;
    w->rbuf = a->rbuf;
    w->count = a->count;
    w->dt = a->kind == CM_OP_BARRIER ? CT_DTYPE_U8 : a->dt;
    w->op = a->op;
    w->root = a->root;
    w->timeout_s = a->timeout_s > 0 ? a->timeout_s : c->opt.timeout_s;
    int64_t nan_at = -1;
    if (c->opt.nan_check && is_float(w->dt)) {
        size_t n;
        const void *in = nan_input(c, a, &n);
        if (in) nan_at = cm_find_nan(w->dt, in, n);
    }
    pthread_mutex_lock(&c->mu);
    w->t_created = cm_wall_ns();
    w->deadline = cm_now() + w->timeout_s;
    if (is_p2p(w->kind)) {
        w->p2p_seq = w->kind == CM_OP_SEND ? ++c->send_seq[w->root] : ++c->recv_seq[w->root];
    } else {
        w->seq = ++c->next_seq;
        atomic_store(&c->last_enqueued, w->seq);
        atomic_store(&c->ctrl->issued_seq, w->seq);
    }
    cm_fr_record(c, w);
    if (c->qtail)
        c->qtail->next = w;
    else
        c->qhead = w;
    c->qtail = w;
    if (nan_at >= 0) {
        char d[160];
        cm_describe(w, d, sizeof d);
        cm_work_fail(w, CT_WORK_ERROR, CT_EINVAL,
                     "%s on rank %d: nan_check: input element %lld is NaN", d, c->rank,
                     (long long)nan_at);
        pthread_mutex_unlock(&c->mu);
        cm_comm_fail(c, w, CT_EINVAL, 1);
        pthread_mutex_lock(&c->mu);
        end_locked(c, w, CT_EINVAL);
        pthread_mutex_unlock(&c->mu);
        ct_status st = ct_error(CT_EINVAL, "%s: %s", a->fn, w->msg);
        work_release(w);
        work_release(w);
        return st;
    }
    if (out && !c->executing) pthread_cond_signal(&c->bg_cv);
    pthread_mutex_unlock(&c->mu);
    if (out) {
        *out = w;
        return CT_OK;
    }
    ct_status st = ct_work_wait(w, -1);
    ct_work_free(w);
    return st;
}

ct_status ct_comm_all_reduce(ct_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                             ct_dtype dt, ct_reduce_op op, double timeout_s, ct_work **work)
{
    op_args a = {
        "ct_comm_all_reduce", CM_OP_ALL_REDUCE, sendbuf, recvbuf, count, dt, op, 0, timeout_s};
    return issue(c, &a, work);
}

ct_status ct_comm_broadcast(ct_comm *c, void *buf, size_t count, ct_dtype dt, int root,
                            double timeout_s, ct_work **work)
{
    op_args a = {
        "ct_comm_broadcast", CM_OP_BROADCAST, buf, buf, count, dt, CT_REDUCE_SUM, root, timeout_s};
    return issue(c, &a, work);
}

ct_status ct_comm_reduce(ct_comm *c, const void *sendbuf, void *recvbuf, size_t count, ct_dtype dt,
                         ct_reduce_op op, int root, double timeout_s, ct_work **work)
{
    op_args a = {"ct_comm_reduce", CM_OP_REDUCE, sendbuf, recvbuf, count, dt, op, root, timeout_s};
    return issue(c, &a, work);
}

ct_status ct_comm_all_gather_single(ct_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                    ct_dtype dt, double timeout_s, ct_work **work)
{
    op_args a = {"ct_comm_all_gather_single",
                 CM_OP_ALL_GATHER,
                 sendbuf,
                 recvbuf,
                 count,
                 dt,
                 CT_REDUCE_SUM,
                 0,
                 timeout_s};
    return issue(c, &a, work);
}

ct_status ct_comm_reduce_scatter_single(ct_comm *c, const void *sendbuf, void *recvbuf,
                                        size_t count, ct_dtype dt, ct_reduce_op op,
                                        double timeout_s, ct_work **work)
{
    op_args a = {"ct_comm_reduce_scatter_single",
                 CM_OP_REDUCE_SCATTER,
                 sendbuf,
                 recvbuf,
                 count,
                 dt,
                 op,
                 0,
                 timeout_s};
    return issue(c, &a, work);
}

ct_status ct_comm_all_to_all_single(ct_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                    ct_dtype dt, double timeout_s, ct_work **work)
{
    op_args a = {"ct_comm_all_to_all_single",
                 CM_OP_ALL_TO_ALL,
                 sendbuf,
                 recvbuf,
                 count,
                 dt,
                 CT_REDUCE_SUM,
                 0,
                 timeout_s};
    return issue(c, &a, work);
}

ct_status ct_comm_gather(ct_comm *c, const void *sendbuf, void *recvbuf, size_t count, ct_dtype dt,
                         int root, double timeout_s, ct_work **work)
{
    op_args a = {"ct_comm_gather", CM_OP_GATHER, sendbuf,  recvbuf, count, dt,
                 CT_REDUCE_SUM,    root,         timeout_s};
    return issue(c, &a, work);
}

ct_status ct_comm_scatter(ct_comm *c, const void *sendbuf, void *recvbuf, size_t count, ct_dtype dt,
                          int root, double timeout_s, ct_work **work)
{
    op_args a = {"ct_comm_scatter", CM_OP_SCATTER, sendbuf,  recvbuf, count, dt,
                 CT_REDUCE_SUM,     root,          timeout_s};
    return issue(c, &a, work);
}

ct_status ct_comm_send(ct_comm *c, const void *buf, size_t count, ct_dtype dt, int peer,
                       double timeout_s, ct_work **work)
{
    op_args a = {"ct_comm_send", CM_OP_SEND, buf, NULL, count, dt, CT_REDUCE_SUM, peer, timeout_s};
    return issue(c, &a, work);
}

ct_status ct_comm_recv(ct_comm *c, void *buf, size_t count, ct_dtype dt, int peer, double timeout_s,
                       ct_work **work)
{
    op_args a = {"ct_comm_recv", CM_OP_RECV, NULL, buf, count, dt, CT_REDUCE_SUM, peer, timeout_s};
    return issue(c, &a, work);
}

ct_status ct_comm_barrier(ct_comm *c, double timeout_s, ct_work **work)
{
    op_args a = {"ct_comm_barrier", CM_OP_BARRIER, NULL, NULL,     0,
                 CT_DTYPE_U8,       CT_REDUCE_SUM, 0,    timeout_s};
    return issue(c, &a, work);
}

/* ---- work handles
 * ---------------------------------------------------------------------------------- */

ct_work_state ct_work_get_state(const ct_work *w)
{
    return w ? (ct_work_state)atomic_load(&w->state) : CT_WORK_ERROR;
}

bool ct_work_test(ct_work *w)
{
    return w && terminal(atomic_load(&w->state));
}

static ct_status result(const ct_work *w)
{
    if (atomic_load(&w->state) == CT_WORK_COMPLETED) return CT_OK;
    return ct_error(w->status ? w->status : CT_EINTERNAL, "%s", w->msg);
}

#define GRACE_S 0.05

ct_status ct_work_wait(ct_work *w, double max_wait_s)
{
    if (!w) return ct_error(CT_EINVAL, "ct_work_wait: work must not be NULL");
    if (max_wait_s != max_wait_s) return ct_error(CT_EINVAL, "ct_work_wait: max_wait_s is NaN");
    if (terminal(atomic_load(&w->state))) return result(w);
    ct_comm *c = w->c;
    double now = cm_now(), until = max_wait_s < 0 ? 1e300 : now + max_wait_s;
    /* A short spin catches operations the progress thread is about to finish. */
    for (int i = 0; i < 4000 && max_wait_s != 0 && atomic_load(&w->state) == CT_WORK_IN_PROGRESS;
         i++)
        __asm__ __volatile__("" ::: "memory");
    pthread_mutex_lock(&c->mu);
    while (!terminal(atomic_load(&w->state))) {
        if (max_wait_s < 0 && !c->executing) {
            c->executing = 1;
            exec_loop(c, w);
            release_executor(c);
            continue;
        }
        now = cm_now();
        if (atomic_load(&w->state) == CT_WORK_NOT_STARTED && now > w->deadline + GRACE_S) {
            /* Stuck behind an earlier operation that is still running. */
            char d[160];
            cm_describe(w, d, sizeof d);
            cm_work_fail(w, CT_WORK_TIMED_OUT, CT_ETIMEDOUT,
                         "%s timed out on rank %d after %.3g s without starting: an earlier "
                         "operation of '%s' "
                         "still ran (last started seq %llu)",
                         d, c->rank, w->timeout_s, c->name,
                         (unsigned long long)atomic_load(&c->last_started));
            pthread_mutex_unlock(&c->mu);
            cm_comm_fail(c, w, CT_ETIMEDOUT, 0);
            pthread_mutex_lock(&c->mu);
            end_locked(c, w, CT_ETIMEDOUT);
            pthread_mutex_unlock(&c->mu);
            work_release(w);
            return result(w);
        }
        if (now >= until) {
            pthread_mutex_unlock(&c->mu);
            char d[160];
            cm_describe(w, d, sizeof d);
            return ct_error(CT_ETIMEDOUT,
                            "ct_work_wait: %s is still %s after %.3g s (its deadline is in %.3g s)",
                            d, ct_work_state_name((ct_work_state)atomic_load(&w->state)),
                            max_wait_s, w->deadline - now);
        }
        double t = until;
        if (w->deadline + GRACE_S < t) t = w->deadline + GRACE_S;
        if (now + 0.05 < t) t = now + 0.05;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double wake = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + (t - now > 0 ? t - now : 0);
        ts.tv_sec = (time_t)wake;
        ts.tv_nsec = (long)((wake - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
    return result(w);
}

ct_status ct_work_status(const ct_work *w)
{
    if (!w) return CT_EINVAL;
    return terminal(atomic_load(&w->state)) && atomic_load(&w->state) != CT_WORK_COMPLETED
               ? w->status
               : CT_OK;
}

const char *ct_work_error(const ct_work *w)
{
    return w && terminal(atomic_load(&w->state)) ? w->msg : "";
}

int ct_work_missing_ranks(const ct_work *w, int *ranks, int cap)
{
    if (!w || !terminal(atomic_load(&w->state))) return 0;
    for (int i = 0; ranks && i < w->nmissing && i < cap; i++)
        ranks[i] = w->missing[i];
    return w->nmissing;
}

uint64_t ct_work_seq(const ct_work *w)
{
    return w ? w->seq : 0;
}

void ct_work_free(ct_work *w)
{
    if (w) work_release(w);
}

/* ---- abort and free
 * -------------------------------------------------------------------------------- */

void cm_store_share(const ct_comm *c, ct_comm *child)
{
    if (!c->sref) return;
    atomic_fetch_add(&c->sref->refs, 1);
    child->sref = c->sref;
}

static void abort_impl(ct_comm *c, int dump)
{
    if (!c || atomic_exchange(&c->aborted, 1)) return;
    int was_failed = atomic_exchange(&c->failed, 1);
    if (!was_failed) snprintf(c->fail_msg, sizeof c->fail_msg, "aborted by ct_comm_abort");
    if (c->ctrl && atomic_load(&c->ctrl->state) == CM_RANK_OK) {
        snprintf(c->ctrl->reason, sizeof c->ctrl->reason, "ct_comm_abort");
        atomic_store(&c->ctrl->state, CM_RANK_ABORTED);
    }
    if (c->backend == CT_COMM_TCP) cm_tcp_wake_self(c);
    pthread_mutex_lock(&c->mu);
    cancel_queued_locked(c);
    pthread_mutex_unlock(&c->mu);
    cm_log_event(c, CT_LOG_WARN, "abort", "\"last_enqueued_seq\":%llu,\"last_completed_seq\":%llu",
                 (unsigned long long)atomic_load(&c->last_enqueued),
                 (unsigned long long)atomic_load(&c->last_completed));
    if (dump) cm_fr_auto_dump(c, "abort");
}

void ct_comm_abort(ct_comm *c)
{
    abort_impl(c, 1);
}

void cm_comm_abort_quiet(ct_comm *c)
{
    abort_impl(c, 0);
}

void ct_comm_free(ct_comm *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    while (c->qhead) {
        if (!c->executing) {
            c->executing = 1;
            exec_loop(c, NULL);
            c->executing = 0;
            pthread_cond_broadcast(&c->cv);
            continue;
        }
        pthread_cond_wait(&c->cv, &c->mu);
    }
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_cond_signal(&c->bg_cv);
    pthread_mutex_unlock(&c->mu);
    if (c->bg_started) pthread_join(c->bg, NULL);
    if (c->send_seq)
        cm_log_event(c, CT_LOG_INFO, "free", "\"last_completed_seq\":%llu",
                     (unsigned long long)atomic_load(&c->last_completed));
    if (c->backend == CT_COMM_MPI) {
        cm_mpi_free(c);
        ct_free(c->ctrl);
        c->ctrl = NULL;
    } else {
        cm_tcp_teardown(c);
    }
    if (c->sref && atomic_fetch_sub(&c->sref->refs, 1) == 1) {
        ct_store_free(c->sref->store);
        ct_store_server_free(c->sref->server);
        ct_free(c->sref);
    }
    cm_fr_destroy(&c->fr);
    ct_free(c->send_seq);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->bg_cv);
    cm_key_wipe(&c->key);
    memset(c->secret, 0, sizeof c->secret);
    ct_free(c);
}
