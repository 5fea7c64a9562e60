/* The MPI backend: every operation is one non-blocking MPI call polled with MPI_Test
 * against the deadline, so a collective never outlives its timeout and abort returns at
 * once. MPI cannot cancel a collective: after a timeout or abort the request is set aside.
 * ct_comm_free gives such requests one more timeout to complete (the late ranks may still
 * arrive); if they do not, the MPI communicator is left alone and MPI is not finalised,
 * since MPI would wait for them forever. */
#include "comm/comm_internal.h"

#ifdef CT_HAVE_MPI

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_ABANDONED 64

struct cm_mpi {
    MPI_Comm comm;
    int tainted; /* a request was abandoned and has not completed */
    MPI_Request abandoned[MAX_ABANDONED];
    int nab;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_we_init, g_refs, g_tainted;

static ct_status mpi_err(int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return ct_error(CT_EPEER, "comm (mpi): %s failed: %s", what, s);
}

static void abandon(cm_mpi *m, MPI_Request r)
{
    if (!m->tainted) {
        m->tainted = 1;
        g_tainted++;
    }
    if (m->nab < MAX_ABANDONED) m->abandoned[m->nab++] = r;
}

/* Poll a request until done, the deadline, or abort. */
static ct_status poll_req(ct_comm *c, MPI_Request *req, double deadline, int *abandoned)
{
    unsigned spins = 0;
    double idle0 = 0;
    *abandoned = 0;
    for (;;) {
        int done = 0;
        pthread_mutex_lock(&g_mu);
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        pthread_mutex_unlock(&g_mu);
        if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Test");
        if (done) return CT_OK;
        if (atomic_load(&c->aborted)) {
            *abandoned = 1;
            return ct_error(CT_ECANCELLED, "cancelled by ct_comm_abort");
        }
        if (++spins & 15) continue;
        double now = cm_now();
        if (now >= deadline) {
            *abandoned = 1;
            return ct_error(
                CT_ETIMEDOUT,
                "MPI request still pending at the deadline (MPI cannot tell which ranks "
                "did not arrive)");
        }
        if (idle0 == 0) idle0 = now;
        if (now - idle0 < 50e-6) continue;
        if (now - idle0 < 2e-3) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

static MPI_Datatype mpi_type(ct_dtype dt)
{
    switch (dt) {
    case CT_DTYPE_F32:
        return MPI_FLOAT;
    case CT_DTYPE_F64:
        return MPI_DOUBLE;
    case CT_DTYPE_I32:
        return MPI_INT32_T;
    case CT_DTYPE_I64:
        return MPI_INT64_T;
    case CT_DTYPE_U8:
        return MPI_UINT8_T;
    default:
        return MPI_UINT16_T; /* f16 / bf16 moved as bits */
    }
}

static MPI_Op mpi_op(ct_reduce_op op)
{
    switch (op) {
    case CT_REDUCE_MAX:
        return MPI_MAX;
    case CT_REDUCE_MIN:
        return MPI_MIN;
    case CT_REDUCE_PROD:
        return MPI_PROD;
    default:
        return MPI_SUM;
    }
}

ct_status cm_mpi_init(ct_comm *c, int want_rank, int want_size, const cm_mpi_from *from)
{
    cm_mpi *m;
    CT_TRY(ct_calloc((void **)&m, sizeof *m));
    m->comm = MPI_COMM_NULL;
    c->mpi = m;
    pthread_mutex_lock(&g_mu);
    int flag = 0, fin = 0, provided = MPI_THREAD_SINGLE, rc = MPI_SUCCESS;
    MPI_Finalized(&fin);
    MPI_Initialized(&flag);
    if (fin) {
        pthread_mutex_unlock(&g_mu);
        return ct_error(CT_EUNSUPPORTED, "comm (mpi): MPI was already finalised in this process");
    }
    if (!flag) {
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc == MPI_SUCCESS) g_we_init = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    if (rc != MPI_SUCCESS) {
        pthread_mutex_unlock(&g_mu);
        return mpi_err(rc, "MPI_Init_thread");
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        pthread_mutex_unlock(&g_mu);
        return ct_error(CT_EUNSUPPORTED,
                        "comm (mpi): MPI runs at thread level %d; ctorch needs "
                        "MPI_THREAD_SERIALIZED or better (initialise MPI with MPI_Init_thread)",
                        provided);
    }
    g_refs++;
    MPI_Request req = MPI_REQUEST_NULL;
    if (from) {
        MPI_Group pg, g;
        MPI_Comm_group(from->parent->mpi->comm, &pg);
        MPI_Group_incl(pg, from->n, from->ranks, &g);
        rc = MPI_Comm_create_group(from->parent->mpi->comm, g, 0x6374, &m->comm);
        MPI_Group_free(&g);
        MPI_Group_free(&pg);
    } else {
        rc = MPI_Comm_idup(MPI_COMM_WORLD, &m->comm, &req);
    }
    pthread_mutex_unlock(&g_mu);
    if (rc != MPI_SUCCESS) return mpi_err(rc, from ? "MPI_Comm_create_group" : "MPI_Comm_idup");
    if (!from) {
        int ab;
        ct_status st = poll_req(c, &req, cm_now() + c->opt.timeout_s, &ab);
        if (st) {
            abandon(m, req);
            return ct_error_wrap(st, "comm init (mpi): duplicating MPI_COMM_WORLD");
        }
    }
    pthread_mutex_lock(&g_mu);
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &c->rank);
    MPI_Comm_size(m->comm, &c->size);
    pthread_mutex_unlock(&g_mu);
    if (!from &&
        ((want_rank >= 0 && want_rank != c->rank) || (want_size >= 0 && want_size != c->size)))
        return ct_error(CT_EINVAL,
                        "ct_comm_init (mpi): rank %d / size %d differ from MPI's %d / %d",
                        want_rank, want_size, c->rank, c->size);
    CT_TRY(ct_calloc((void **)&c->ctrl, sizeof(cm_ctrl)));
    c->local_rank =
        (int)cm_env_long("MPI_LOCALRANKID", cm_env_long("OMPI_COMM_WORLD_LOCAL_RANK", 0));
    return CT_OK;
}

static int is_red(cm_opkind k)
{
    return k == CM_OP_ALL_REDUCE || k == CM_OP_REDUCE || k == CM_OP_REDUCE_SCATTER;
}

ct_status cm_mpi_run(ct_comm *c, ct_work *w)
{
    cm_mpi *m = c->mpi;
    int P = c->size, r = c->rank;
    size_t n = w->count,
           nin = w->kind == CM_OP_REDUCE_SCATTER || w->kind == CM_OP_ALL_TO_ALL ? n * (size_t)P : n;
    char d[160];
    cm_describe(w, d, sizeof d);
    if (n == 0 && w->kind != CM_OP_BARRIER) return CT_OK;
    if (nin > INT_MAX)
        return cm_work_fail(w, CT_WORK_ERROR, CT_EUNSUPPORTED,
                            "%s: more than INT_MAX elements for MPI", d);
    int half = is_red(w->kind) && (w->dt == CT_DTYPE_BF16 || w->dt == CT_DTYPE_F16);
    ct_dtype dt = half ? CT_DTYPE_F32 : w->dt;
    const void *s = w->sbuf;
    void *o = w->rbuf;
    float *tin = NULL, *tout = NULL;
    if (half) {
        ct_status st = ct_alloc((void **)&tin, nin * sizeof(float));
        if (!st && w->kind == CM_OP_REDUCE_SCATTER)
            st = ct_alloc((void **)&tout, n * sizeof(float));
        if (st) {
            ct_free(tin);
            return cm_work_fail(w, CT_WORK_ERROR, st, "%s: %s", d, ct_last_error());
        }
        if (w->dt == CT_DTYPE_BF16)
            ct_convert_bf16_to_f32(tin, s, nin);
        else
            ct_convert_f16_to_f32(tin, s, nin);
        s = tin;
        o = tout ? (void *)tout : (void *)tin;
    }
    MPI_Datatype ty = mpi_type(dt);
    MPI_Op op = mpi_op(w->op);
    int cnt = (int)n;
    size_t b = n * ct_dtype_size(dt);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc;
    pthread_mutex_lock(&g_mu);
    switch (w->kind) {
    case CM_OP_ALL_REDUCE:
        rc = MPI_Iallreduce(s == o ? MPI_IN_PLACE : s, o, cnt, ty, op, m->comm, &req);
        break;
    case CM_OP_REDUCE:
        rc = MPI_Ireduce(r == w->root && s == o ? MPI_IN_PLACE : s, o, cnt, ty, op, w->root,
                         m->comm, &req);
        break;
    case CM_OP_REDUCE_SCATTER:
        rc = MPI_Ireduce_scatter_block(s, o, cnt, ty, op, m->comm, &req);
        break;
    case CM_OP_ALL_GATHER:
        rc = MPI_Iallgather(s == (char *)o + (size_t)r * b ? MPI_IN_PLACE : s, cnt, ty, o, cnt, ty,
                            m->comm, &req);
        break;
    case CM_OP_BROADCAST:
        rc = MPI_Ibcast(o, cnt, ty, w->root, m->comm, &req);
        break;
    case CM_OP_ALL_TO_ALL:
        rc = MPI_Ialltoall(s, cnt, ty, o, cnt, ty, m->comm, &req);
        break;
    case CM_OP_GATHER:
        rc = MPI_Igather(r == w->root && s == (char *)o + (size_t)r * b ? MPI_IN_PLACE : s, cnt, ty,
                         o, cnt, ty, w->root, m->comm, &req);
        break;
    case CM_OP_SCATTER:
        rc = MPI_Iscatter(s, cnt, ty,
                          r == w->root && o == (const char *)s + (size_t)r * b ? MPI_IN_PLACE : o,
                          cnt, ty, w->root, m->comm, &req);
        break;
    case CM_OP_BARRIER:
        rc = MPI_Ibarrier(m->comm, &req);
        break;
    default:
        rc = MPI_ERR_OTHER;
        break;
    }
    pthread_mutex_unlock(&g_mu);
    ct_status st = CT_OK;
    if (rc != MPI_SUCCESS) {
        st = mpi_err(rc, cm_op_name(w->kind));
    } else {
        int ab;
        st = poll_req(c, &req, w->deadline, &ab);
        if (ab) abandon(m, req);
    }
    if (st) {
        ct_free(tin);
        ct_free(tout);
        if (st == CT_ETIMEDOUT)
            return cm_work_fail(w, CT_WORK_TIMED_OUT, st,
                                "%s timed out on rank %d after %.3g s: %s", d, r, w->timeout_s,
                                ct_last_error());
        return cm_work_fail(w, st == CT_ECANCELLED ? CT_WORK_CANCELLED : CT_WORK_ERROR, st,
                            "%s failed on rank %d: %s", d, r, ct_last_error());
    }
    int mine = is_red(w->kind) && (w->kind != CM_OP_REDUCE || r == w->root);
    if (mine && w->op == CT_REDUCE_AVG) cm_divide(dt, o, n, P);
    if (half && mine) {
        if (w->dt == CT_DTYPE_BF16)
            ct_convert_f32_to_bf16(w->rbuf, o, n);
        else
            ct_convert_f32_to_f16(w->rbuf, o, n);
    }
    ct_free(tin);
    ct_free(tout);
    return CT_OK;
}

ct_status cm_mpi_run_p2p(ct_comm *c, ct_work *first)
{
    enum { MAX = 256 };
    ct_work *ws[MAX];
    MPI_Request rq[MAX];
    int n = 0, posted = 0, left = 0;
    ws[n++] = first;
    cm_mpi *m = c->mpi;
    ct_status st = CT_OK;
    unsigned spins = 0;
    for (;;) {
        for (; posted < n; posted++) {
            ct_work *w = ws[posted];
            size_t b = w->count * ct_dtype_size(w->dt);
            int rc;
            if (b > INT_MAX) {
                st = ct_error(CT_EUNSUPPORTED, "more than INT_MAX bytes for MPI");
                break;
            }
            pthread_mutex_lock(&g_mu);
            if (w->kind == CM_OP_SEND)
                rc = MPI_Isend(w->sbuf, (int)b, MPI_BYTE, w->root, 7, m->comm, &rq[posted]);
            else
                rc = MPI_Irecv(w->rbuf, (int)b, MPI_BYTE, w->root, 7, m->comm, &rq[posted]);
            pthread_mutex_unlock(&g_mu);
            if (rc != MPI_SUCCESS) {
                st = mpi_err(rc, w->kind == CM_OP_SEND ? "MPI_Isend" : "MPI_Irecv");
                break;
            }
            left++;
        }
        if (st) break;
        for (int i = 0; i < posted; i++) {
            if (!ws[i]) continue;
            int done = 0;
            pthread_mutex_lock(&g_mu);
            int rc = MPI_Test(&rq[i], &done, MPI_STATUS_IGNORE);
            pthread_mutex_unlock(&g_mu);
            if (rc != MPI_SUCCESS) {
                st = mpi_err(rc, "MPI_Test");
                break;
            }
            if (done) {
                cm_work_end(c, ws[i], CT_OK);
                ws[i] = NULL;
                left--;
            }
        }
        if (st) break;
        n = cm_absorb_p2p(c, ws, n, MAX);
        if (left == 0 && posted == n) return CT_OK;
        if (atomic_load(&c->aborted)) {
            st = ct_error(CT_ECANCELLED, "cancelled by ct_comm_abort");
            break;
        }
        if (++spins & 63) continue;
        double now = cm_now(), dl = 1e300;
        for (int i = 0; i < n; i++)
            if (ws[i] && ws[i]->deadline < dl) dl = ws[i]->deadline;
        if (now >= dl) {
            st = ct_error(CT_ETIMEDOUT, "the peer did not match it in time");
            break;
        }
        sched_yield();
    }
    for (int i = 0; i < posted; i++)
        if (ws[i]) abandon(m, rq[i]);
    char msg[CM_MSG];
    snprintf(msg, sizeof msg, "%s", ct_last_error());
    int told = 0;
    for (int i = 0; i < n; i++) {
        ct_work *w = ws[i];
        if (!w) continue;
        char d[160];
        cm_describe(w, d, sizeof d);
        int state = st == CT_ETIMEDOUT    ? CT_WORK_TIMED_OUT
                    : st == CT_ECANCELLED ? CT_WORK_CANCELLED
                                          : CT_WORK_ERROR;
        cm_work_fail(w, state, st, "%s %s on rank %d: %s", d,
                     st == CT_ETIMEDOUT ? "timed out" : "failed", c->rank, msg);
        int peer = w->root;
        cm_work_set_missing(w, &peer, 1);
        if (!told++) cm_comm_fail(c, w, st, 0);
        cm_work_end(c, w, st);
    }
    return st;
}

void cm_mpi_free(ct_comm *c)
{
    cm_mpi *m = c->mpi;
    if (!m) return;
    /* Late ranks may still complete what we gave up on. */
    double until = cm_now() + c->opt.timeout_s;
    while (m->tainted && cm_now() < until) {
        int all = 1;
        pthread_mutex_lock(&g_mu);
        for (int i = 0; i < m->nab; i++) {
            int done = 0;
            if (m->abandoned[i] != MPI_REQUEST_NULL)
                MPI_Test(&m->abandoned[i], &done, MPI_STATUS_IGNORE);
            all &= m->abandoned[i] == MPI_REQUEST_NULL;
        }
        pthread_mutex_unlock(&g_mu);
        if (all && m->nab < MAX_ABANDONED) {
            m->tainted = 0;
            g_tainted--;
        } else {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    pthread_mutex_lock(&g_mu);
    if (m->comm != MPI_COMM_NULL && !m->tainted) MPI_Comm_free(&m->comm);
    if (g_refs > 0 && --g_refs == 0 && g_we_init && !g_tainted) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
    }
    pthread_mutex_unlock(&g_mu);
    ct_free(m);
    c->mpi = NULL;
}

/* The MPI communicator and the shared control block it was given at creation. */
static void mpi_teardown(ct_comm *c)
{
    cm_mpi_free(c);
    ct_free(c->ctrl);
    c->ctrl = NULL;
}

static ct_status mpi_init(ct_comm *c, int rank, int size, double deadline,
                          const cm_mpi_from *from)
{
    (void)deadline; /* MPI's own set-up has no deadline */
    return cm_mpi_init(c, rank, size, from);
}

const cm_backend_ops cm_mpi_backend = {
    .id = CT_COMM_MPI,
    .name = "mpi",
    .needs_store = false,
    .can_shrink = false, /* MPI has no portable recovery */
    .init = mpi_init,
    .run = cm_mpi_run,
    .run_p2p = cm_mpi_run_p2p,
    .wake = NULL, /* the executor polls MPI_Test and the abort flag */
    .teardown = mpi_teardown,
    .peer_progress = NULL,
};

#endif /* CT_HAVE_MPI */
