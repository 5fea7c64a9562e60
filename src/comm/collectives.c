/* The public operations (collectives, point to point, barrier): argument checks that hold
 * on every rank, the NaN check, and queueing a work for the executor (work.c). */
#include "comm/comm_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    if ((rooted || cm_is_p2p(a->kind)) && (a->root < 0 || a->root >= c->size))
        return ct_error(CT_EINVAL, "%s: %s %d is not a rank of this communicator (size %d)", fn,
                        cm_is_p2p(a->kind) ? "peer" : "root", a->root, c->size);
    if (cm_is_p2p(a->kind) && a->root == c->rank)
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
    if (cm_is_p2p(w->kind)) {
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
        cm_work_end_locked(c, w, CT_EINVAL);
        pthread_mutex_unlock(&c->mu);
        ct_status st = ct_error(CT_EINVAL, "%s: %s", a->fn, w->msg);
        cm_work_release(w);
        cm_work_release(w);
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

