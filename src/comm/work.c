/* Operations in flight: the per-communicator queue, its executor (the background progress
 * thread, or the thread that waits on a work) which hands each operation to the backend's
 * table, failure bookkeeping, and the ct_work handles. */
#include "comm/comm_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- names of operations, descriptions -------------------------------------------------------- */

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

void cm_describe(const ct_work *w, char *buf, size_t cap)
{
    if (cm_is_p2p(w->kind))
        snprintf(buf, cap, "%s #%llu %s rank %d (%zu x %s)", cm_op_name(w->kind),
                 (unsigned long long)w->p2p_seq, w->kind == CM_OP_SEND ? "to" : "from", w->root,
                 w->count, ct_dtype_name(w->dt));
    else if (w->kind == CM_OP_BARRIER)
        snprintf(buf, cap, "barrier seq %llu", (unsigned long long)w->seq);
    else
        snprintf(buf, cap, "%s seq %llu (%zu x %s)", cm_op_name(w->kind),
                 (unsigned long long)w->seq, w->count, ct_dtype_name(w->dt));
}

/* ---- work bookkeeping ------------------------------------------------------------------------ */

void cm_work_release(ct_work *w)
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
void cm_work_end_locked(ct_comm *c, ct_work *w, ct_status st)
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
    } else if (!cm_is_p2p(w->kind)) {
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
    cm_work_end_locked(c, w, st);
    pthread_mutex_unlock(&c->mu);
    cm_work_release(w);
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
void cm_cancel_queued_locked(ct_comm *c)
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
            cm_work_end_locked(c, w, CT_ECANCELLED);
            cm_work_release(w);
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
    if (!cm_is_p2p(w->kind)) {
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
        if (!cm_is_p2p(w->kind) || atomic_load(&c->aborted)) break;
        mark_started(c, w);
        cm_fr_update(c, w);
        ws[have++] = w;
    }
    pthread_mutex_unlock(&c->mu);
    return have;
}

/* Run queued works in order until `target` has ended (or the queue is empty for NULL).
 * Called and returns with c->mu held and c->executing set by the caller. */
void cm_exec_loop(ct_comm *c, ct_work *target)
{
    for (;;) {
        if (target && cm_work_terminal(atomic_load(&target->state))) return;
        ct_work *w = next_ready(c);
        if (!w) return;
        if (atomic_load(&c->failed) || atomic_load(&c->aborted)) {
            cm_cancel_queued_locked(c);
            continue;
        }
        mark_started(c, w);
        cm_fr_update(c, w);
        pthread_mutex_unlock(&c->mu);
        ct_status st;
        if (cm_is_p2p(w->kind)) {
            st = c->be->run_p2p(c, w);
        } else {
            st = c->be->run(c, w);
            if (st) cm_comm_fail(c, w, st, st == CT_EPEER || st == CT_EINVAL);
            cm_work_end(c, w, st);
        }
        pthread_mutex_lock(&c->mu);
    }
}

void *cm_bg_main(void *arg)
{
    ct_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        if (!c->executing && next_ready(c)) {
            c->executing = 1;
            cm_exec_loop(c, NULL);
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
void cm_release_executor(ct_comm *c)
{
    c->executing = 0;
    pthread_cond_broadcast(&c->cv);
    if (next_ready(c)) pthread_cond_signal(&c->bg_cv);
}

/* ---- work handles
 * ---------------------------------------------------------------------------------- */

ct_work_state ct_work_get_state(const ct_work *w)
{
    return w ? (ct_work_state)atomic_load(&w->state) : CT_WORK_ERROR;
}

bool ct_work_test(ct_work *w)
{
    return w && cm_work_terminal(atomic_load(&w->state));
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
    if (cm_work_terminal(atomic_load(&w->state))) return result(w);
    ct_comm *c = w->c;
    double now = cm_now(), until = max_wait_s < 0 ? 1e300 : now + max_wait_s;
    /* A short spin catches operations the progress thread is about to finish. */
    for (int i = 0; i < 4000 && max_wait_s != 0 && atomic_load(&w->state) == CT_WORK_IN_PROGRESS;
         i++)
        __asm__ __volatile__("" ::: "memory");
    pthread_mutex_lock(&c->mu);
    while (!cm_work_terminal(atomic_load(&w->state))) {
        if (max_wait_s < 0 && !c->executing) {
            c->executing = 1;
            cm_exec_loop(c, w);
            cm_release_executor(c);
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
            cm_work_end_locked(c, w, CT_ETIMEDOUT);
            pthread_mutex_unlock(&c->mu);
            cm_work_release(w);
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
    return cm_work_terminal(atomic_load(&w->state)) && atomic_load(&w->state) != CT_WORK_COMPLETED
               ? w->status
               : CT_OK;
}

const char *ct_work_error(const ct_work *w)
{
    return w && cm_work_terminal(atomic_load(&w->state)) ? w->msg : "";
}

int ct_work_missing_ranks(const ct_work *w, int *ranks, int cap)
{
    if (!w || !cm_work_terminal(atomic_load(&w->state))) return 0;
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
    if (w) cm_work_release(w);
}

