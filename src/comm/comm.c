/* Communicators: names and options, creation (from a store or the environment, on the backend
 * table of comm_internal.h), accessors, abort and free. The queue of operations and its
 * executor are in work.c, the public operations in collectives.c. */
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

const cm_backend_ops *cm_backend_for(ct_comm_backend b)
{
    switch (b) {
    case CT_COMM_TCP: return &cm_tcp_backend;
#ifdef CT_HAVE_MPI
    case CT_COMM_MPI: return &cm_mpi_backend;
#endif
    default: return NULL;
    }
}

bool ct_comm_backend_available(ct_comm_backend b)
{
    return cm_backend_for(b) != NULL;
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
    c->be = cm_backend_for(opt->backend); /* check_options made sure it is built in */
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
    ct_status st = c->be->init(c, rank, size, deadline, from);
    if (!st) st = ct_calloc((void **)&c->send_seq, sizeof(uint64_t) * 2 * (size_t)c->size);
    if (!st) {
        c->recv_seq = c->send_seq + c->size;
        if (!c->ctrl) st = ct_calloc((void **)&c->ctrl, sizeof(cm_ctrl));
    }
    if (!st) {
        if (pthread_create(&c->bg, NULL, cm_bg_main, c) != 0)
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
    if (cm_backend_for(o.backend)->needs_store && !store)
        return ct_error(CT_EINVAL, "%s: the %s backend needs a store (ct_store_connect)", fn,
                        cm_backend_for(o.backend)->name);
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
    const cm_backend_ops *be = cm_backend_for(o.backend);
    if (!be->needs_store) { /* the ranks find each other (mpiexec) */
        char prefix[128];
        snprintf(prefix, sizeof prefix, "%s/%s", be->name, name);
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
    if (c->be->wake) c->be->wake(c);
    pthread_mutex_lock(&c->mu);
    cm_cancel_queued_locked(c);
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
            cm_exec_loop(c, NULL);
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
    c->be->teardown(c);
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
