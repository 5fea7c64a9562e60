/* New communicators from old ones: split (a chosen subgroup) and shrink (the survivors of
 * a failure, agreed through the store). */
#include "comm/comm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t hash_ranks(const int *r, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint64_t)(uint32_t)r[i]) * 1099511628211ull;
    return h;
}

ct_status ct_comm_split(ct_comm *c, const int *ranks, int nranks, const char *name, ct_comm **out)
{
    const char *fn = "ct_comm_split";
    if (!c || !out) return ct_error(CT_EINVAL, "%s: comm and out must not be NULL", fn);
    *out = NULL;
    if (!ranks || nranks < 1 || nranks > c->size)
        return ct_error(CT_EINVAL, "%s: need 1..%d ranks, got %d", fn, c->size, nranks);
    if (name && strlen(name) > 80)
        return ct_error(CT_EINVAL, "%s: name must be at most 80 bytes", fn);
    int me = -1;
    for (int i = 0; i < nranks; i++) {
        if (ranks[i] < 0 || ranks[i] >= c->size)
            return ct_error(CT_EINVAL, "%s: ranks[%d] = %d is not a rank of '%s' (size %d)", fn, i,
                            ranks[i], c->name, c->size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return ct_error(CT_EINVAL, "%s: rank %d appears twice", fn, ranks[i]);
        if (ranks[i] == c->rank) me = i;
    }
    if (atomic_load(&c->failed))
        return ct_error(CT_EPEER, "%s: communicator '%s' failed (%s); shrink it first", fn, c->name,
                        c->fail_msg);
    int k = ++c->children;
    if (me < 0) return CT_OK;
    char nm[96], prefix[700];
    if (name && *name)
        snprintf(nm, sizeof nm, "%s", name);
    else
        snprintf(nm, sizeof nm, "%.60s.split%d", c->name, k);
    snprintf(prefix, sizeof prefix, "%s/split%d/%llx", c->prefix, k,
             (unsigned long long)hash_ranks(ranks, nranks));
    cm_mpi_from from = {c, ranks, nranks};
    ct_comm *child;
    CT_TRY(cm_comm_create(c->store, me, nranks, &c->opt, nm, prefix, cm_now() + c->opt.timeout_s,
                          &from, &child)); /* the subgroup, for backends that need it */
    cm_store_share(c, child);
    cm_log_event(child, CT_LOG_INFO, "split", "\"parent\":\"%s\",\"parent_rank\":%d", c->name,
                 c->rank);
    *out = child;
    return CT_OK;
}

static void nap(double s)
{
    struct timespec ts = {0, (long)(s * 1e9)};
    nanosleep(&ts, NULL);
}

ct_status ct_comm_shrink(ct_comm *c, double timeout_s, ct_comm **out)
{
    const char *fn = "ct_comm_shrink";
    if (!c || !out) return ct_error(CT_EINVAL, "%s: comm and out must not be NULL", fn);
    *out = NULL;
    if (!c->be->can_shrink)
        return ct_error(CT_EUNSUPPORTED,
                        "%s: the %s backend cannot shrink (MPI has no portable recovery); "
                        "use the tcp backend for fault tolerance",
                        fn, ct_comm_backend_name(c->backend));
    if (timeout_s != timeout_s) return ct_error(CT_EINVAL, "%s: timeout_s is NaN", fn);
    double T = timeout_s > 0 ? timeout_s : c->opt.timeout_s, t0 = cm_now(), deadline = t0 + T;
    cm_comm_abort_quiet(c);
    /* Let the cancelled operation (if any) leave the links before we look at them. */
    pthread_mutex_lock(&c->mu);
    while (c->executing && cm_now() < t0 + 0.25 * T) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 2000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
    int P = c->size, k = ++c->children;
    char base[700], key[800];
    snprintf(base, sizeof base, "%s/shrink%d", c->prefix, k);
    snprintf(key, sizeof key, "%s/join/%d", base, c->rank);
    CT_TRY(ct_store_set(c->store, key, "1", 1));
    uint8_t *alive, *joined;
    CT_TRY(ct_calloc((void **)&alive, 2 * (size_t)P));
    joined = alive + P;
    int dead;
    char msg[256];
    cm_tcp_check_peers(c, &dead, msg, sizeof msg);
    for (int p = 0; p < P; p++)
        alive[p] = p == c->rank || !c->links[p].dead;
    joined[c->rank] = 1;
    /* Wait for the ranks we believe alive to join; those that do not within half the
     * timeout are dropped (the other half is for building the new communicator). */
    char dkey[800];
    snprintf(dkey, sizeof dkey, "%s/decision", base);
    ct_status st = CT_OK;
    for (;;) {
        bool decided = false;
        if ((st = ct_store_check(c->store, dkey, &decided))) break;
        if (decided) break;
        int pending = 0;
        cm_tcp_check_peers(c, &dead, msg, sizeof msg);
        for (int p = 0; p < P && !st; p++) {
            if (!alive[p] || joined[p]) continue;
            if (c->links[p].dead) {
                alive[p] = 0;
                continue;
            }
            bool ex = false;
            snprintf(key, sizeof key, "%s/join/%d", base, p);
            st = ct_store_check(c->store, key, &ex);
            joined[p] = ex;
            pending += !ex;
        }
        if (st) break;
        if (pending == 0 || cm_now() > t0 + 0.5 * T) {
            char prop[8 * CM_MAX_RANKS > 65536 ? 65536 : 8 * CM_MAX_RANKS];
            size_t len = 0;
            for (int p = 0; p < P && len + 12 < sizeof prop; p++)
                if (alive[p] && joined[p])
                    len +=
                        (size_t)snprintf(prop + len, sizeof prop - len, "%s%d", len ? "," : "", p);
            st = ct_store_compare_set(c->store, dkey, "", 0, prop, len, NULL, NULL);
            break;
        }
        nap(0.002);
    }
    ct_free(alive);
    if (st)
        return ct_error_wrap(st, "%s: the store failed during the agreement", fn);
    void *dv = NULL;
    size_t dl = 0;
    double left = deadline - cm_now();
    CT_TRY(ct_store_get(c->store, dkey, left > 0.001 ? left : 0.001, &dv, &dl));
    int *members = NULL, n = 0, me = -1;
    st = ct_alloc((void **)&members, sizeof(int) * (size_t)P);
    for (char *p = dv; !st && p && *p;) {
        char *end;
        long r = strtol(p, &end, 10);
        if (end == p || r < 0 || r >= P || n >= P) {
            st = ct_error(CT_EFORMAT, "%s: malformed decision '%s' in the store", fn, (char *)dv);
            break;
        }
        if (r == c->rank) me = n;
        members[n++] = (int)r;
        p = *end == ',' ? end + 1 : end;
    }
    char list[1024];
    cm_format_ranks(list, sizeof list, members ? members : &me, members ? n : 0);
    ct_free(dv);
    if (!st && me < 0)
        st =
            ct_error(CT_EPEER, "%s: rank %d of '%s' was left out: the survivors agreed on ranks %s",
                     fn, c->rank, c->name, list);
    if (st) {
        ct_free(members);
        return st;
    }
    char prefix[800];
    snprintf(prefix, sizeof prefix, "%s/comm", base);
    ct_comm *nc = NULL;
    st = cm_comm_create(c->store, me, n, &c->opt, c->name, prefix, deadline, NULL, &nc);
    ct_free(members);
    if (st)
        return ct_error_wrap(st, "%s: rebuilding '%s' of ranks %s failed", fn, c->name, list);
    cm_store_share(c, nc);
    cm_log_event(nc, CT_LOG_WARN, "shrink",
                 "\"old_rank\":%d,\"old_size\":%d,\"survivors\":\"%s\",\"ms\":%.3f", c->rank, P,
                 list, (cm_now() - t0) * 1e3);
    *out = nc;
    return CT_OK;
}
