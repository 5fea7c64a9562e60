/* The tcp backend's plumbing: rendezvous through the store, a full mesh of sockets, one
 * shared-memory segment per rank holding its control block and the channels its same-host
 * peers write into, and the engine that moves requests through them. */
#include "comm/transport.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SEG_MAGIC 0x31306d6d6f637463ull /* "ctcomm01" */
#define NSLOTS 8
#define HDR_BYTES 64
#define CTRL_BYTES ((sizeof(cm_ctrl) + 63) & ~(size_t)63)
#define STAGE_BYTES (256u << 10)

typedef struct seg_hdr {
    uint64_t magic;
    uint64_t slot_bytes;
    uint32_t nslots, nchan;
    uint32_t pad[10];
} seg_hdr;

static size_t chan_stride(size_t slot)
{
    return sizeof(cm_chan) + NSLOTS * sizeof(cm_slot) + NSLOTS * slot;
}

static uint8_t *chan_base(void *seg, size_t slot, int i)
{
    return (uint8_t *)seg + HDR_BYTES + CTRL_BYTES + (size_t)i * chan_stride(slot);
}

static void chan_parts(uint8_t *base, cm_chan **ch, cm_slot **slots, uint8_t **data)
{
    *ch = (cm_chan *)base;
    *slots = (cm_slot *)(base + sizeof(cm_chan));
    *data = base + sizeof(cm_chan) + NSLOTS * sizeof(cm_slot);
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ---- rendezvous ------------------------------------------------------------------------ */

static void host_id(char *buf, size_t cap)
{
    char host[128] = "?", boot[64] = "";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = 0;
    snprintf(buf, cap, "%s/%s", host, boot);
    for (char *p = buf; *p; p++)
        if (*p == '|' || *p == ' ') *p = '_';
}

typedef struct peer_addr {
    char ip[64];
    int port, pid, shm;
    char host[200];
} peer_addr;

static ct_status parse_addr(const char *v, peer_addr *a)
{
    /* ip|port|pid|shm|host */
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", v);
    char *f[5];
    int n = 0;
    for (char *p = tmp, *q; n < 5 && p; p = q) {
        q = strchr(p, '|');
        if (q) *q++ = 0;
        f[n++] = p;
    }
    if (n != 5) return ct_error(CT_EFORMAT, "comm init: malformed peer address '%s'", v);
    snprintf(a->ip, sizeof a->ip, "%.63s", f[0]);
    a->port = atoi(f[1]);
    a->pid = atoi(f[2]);
    a->shm = atoi(f[3]);
    snprintf(a->host, sizeof a->host, "%.199s", f[4]);
    return CT_OK;
}

static ct_status gather_addrs(ct_comm *c, peer_addr *addrs, double deadline)
{
    char key[700];
    for (int p = 0; p < c->size; p++) {
        snprintf(key, sizeof key, "%s/addr/%d", c->prefix, p);
        void *v = NULL;
        double left = deadline - cm_now();
        ct_status st = ct_store_get(c->store, key, left > 0 ? left : 0, &v, NULL);
        if (st == CT_ETIMEDOUT) {
            int *miss = NULL, nm = 0;
            if (ct_alloc((void **)&miss, sizeof(int) * (size_t)c->size) == CT_OK) {
                for (int q = p; q < c->size; q++) {
                    bool ex = false;
                    snprintf(key, sizeof key, "%s/addr/%d", c->prefix, q);
                    if (ct_store_check(c->store, key, &ex) == CT_OK && !ex) miss[nm++] = q;
                }
            }
            char list[512];
            cm_format_ranks(list, sizeof list, miss, nm);
            ct_free(miss);
            return ct_error(CT_ETIMEDOUT,
                            "comm init '%s': rank %d waited %.3g s; ranks %s did not arrive",
                            c->name, c->rank, c->opt.timeout_s, list);
        }
        if (st) return st;
        st = parse_addr(v, &addrs[p]);
        ct_free(v);
        CT_TRY(st);
    }
    return CT_OK;
}

/* The peers on this host that use shared memory, in rank order: index of `who` among the
 * local peers of `of` (-1 if not local). */
static int local_index(const peer_addr *a, int size, int of, int who)
{
    if (who == of || !a[of].shm || !a[who].shm || strcmp(a[of].host, a[who].host)) return -1;
    int k = 0;
    for (int p = 0; p < who; p++)
        if (p != of && a[p].shm && !strcmp(a[p].host, a[of].host)) k++;
    return k;
}

static ct_status create_segment(ct_comm *c, int nchan, char *name, size_t cap)
{
    static _Atomic unsigned counter;
    size_t slot = c->shm_slot;
    size_t len = HDR_BYTES + CTRL_BYTES + (size_t)nchan * chan_stride(slot);
    snprintf(name, cap, "/ctorch.%d.%u.%llx", (int)getpid(), atomic_fetch_add(&counter, 1),
             (unsigned long long)(cm_wall_ns() & 0xffffffffffull));
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return ct_error(CT_EIO, "comm init: shm_open(%s): %s (set CT_COMM_SHM=0 to use TCP)", name,
                        strerror(errno));
    if (ftruncate(fd, (off_t)len) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        return ct_error(CT_EIO, "comm init: cannot size shared memory to %zu bytes: %s", len,
                        strerror(e));
    }
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        shm_unlink(name);
        return ct_error(CT_EIO, "comm init: mmap of %zu bytes: %s", len, strerror(errno));
    }
    seg_hdr *h = m;
    h->magic = SEG_MAGIC;
    h->slot_bytes = slot;
    h->nslots = NSLOTS;
    h->nchan = (uint32_t)nchan;
    c->seg = m;
    c->seg_len = len;
    c->ctrl = (cm_ctrl *)((uint8_t *)m + HDR_BYTES);
    return CT_OK;
}

static ct_status map_peer(ct_comm *c, cm_link *l, const char *name, int my_index, int nchan_peer)
{
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return ct_error(CT_EIO, "comm init: cannot open rank %d's shared memory %s: %s", l->peer,
                        name, strerror(errno));
    size_t len = HDR_BYTES + CTRL_BYTES + (size_t)nchan_peer * chan_stride(c->shm_slot);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return ct_error(CT_EIO, "comm init: cannot map rank %d's shared memory: %s", l->peer,
                        strerror(errno));
    l->pmap = m;
    l->pmap_len = len;
    seg_hdr *h = m;
    if (h->magic != SEG_MAGIC || h->slot_bytes != c->shm_slot || h->nslots != NSLOTS ||
        h->nchan != (uint32_t)nchan_peer)
        return ct_error(CT_EINVAL,
                        "comm init: rank %d uses another shared-memory layout (slot_bytes %llu "
                        "vs %zu): give every rank the same options",
                        l->peer, (unsigned long long)h->slot_bytes, c->shm_slot);
    l->pctrl = (cm_ctrl *)((uint8_t *)m + HDR_BYTES);
    chan_parts(chan_base(m, c->shm_slot, my_index), &l->tx, &l->tx_slot, &l->tx_data);
    return CT_OK;
}

/* ---- rank handshake --------------------------------------------------------------------- */

#define PENDING_MAX 64

/* Connector side: answer rank `to`'s challenge with our proof, check its proof. */
static ct_status hs_connect(ct_comm *c, int fd, int to, double deadline)
{
    uint8_t ch[CM_HS_CHALLENGE_BYTES], ns[CM_NONCE_BYTES], msg[CM_HS_HELLO_BYTES];
    uint8_t ctx[520], theirs[CM_MAC_BYTES], want[CM_MAC_BYTES];
    size_t cl;
    CT_TRY(cm_net_recv_all(fd, ch, sizeof ch, deadline));
    if (cm_hs_parse_challenge(ch, sizeof ch, CM_HS_RANK_MAGIC, ns))
        return ct_error(CT_EPEER, "its challenge is not a ctorch rank handshake");
    cm_hello h;
    h.rank = (uint32_t)c->rank;
    CT_TRY(cm_random(h.nc, sizeof h.nc));
    cm_hs_rank_ctx(c->prefix, (uint32_t)c->rank, (uint32_t)to, ctx, &cl);
    cm_mac(&c->key, "ctorch rank hello v1", ns, h.nc, ctx, cl, h.mac);
    cm_hs_write_hello(msg, &h);
    CT_TRY(cm_net_send_all(fd, msg, sizeof msg, deadline));
    ct_status st = cm_net_recv_all(fd, theirs, sizeof theirs, deadline);
    if (st == CT_EPEER)
        return ct_error(CT_EPEER, "it refused our proof of the job secret (CT_JOB_SECRET differs?)");
    CT_TRY(st);
    cm_hs_rank_ctx(c->prefix, (uint32_t)to, (uint32_t)c->rank, ctx, &cl);
    cm_mac(&c->key, "ctorch rank accept v1", ns, h.nc, ctx, cl, want);
    if (!cm_mac_equal(want, theirs)) {
        cm_log_event(c, CT_LOG_WARN, "auth_failed",
                     "\"peer_rank\":%d,\"msg\":\"the listener did not prove the job secret\"", to);
        return ct_error(CT_EPEER, "it did not prove the job secret (not a rank of this job)");
    }
    return CT_OK;
}

typedef struct pending {
    int fd;
    double deadline;
    uint8_t ns[CM_NONCE_BYTES];
    uint8_t buf[CM_HS_HELLO_BYTES];
    size_t got;
    char ip[64];
} pending;

static void pend_drop(pending *pq, int *n, int i)
{
    close(pq[i].fd);
    pq[i] = pq[--*n];
}

/* Acceptor side, one hello complete: the connecting rank, or -1 (logged) to drop it. */
static int hs_check(ct_comm *c, pending *q)
{
    cm_hello h;
    if (cm_hs_parse_hello(q->buf, sizeof q->buf, &h)) {
        cm_log_event(c, CT_LOG_WARN, "auth_failed",
                     "\"peer\":\"%s\",\"msg\":\"not a ctorch rank hello: dropped\"", q->ip);
        return -1;
    }
    uint8_t ctx[520], want[CM_MAC_BYTES];
    size_t cl;
    int from = (int)h.rank;
    if (h.rank <= (uint32_t)c->rank || h.rank >= (uint32_t)c->size) {
        cm_log_event(c, CT_LOG_WARN, "auth_failed",
                     "\"peer\":\"%s\",\"claimed_rank\":%u,\"msg\":\"no such higher rank: dropped\"",
                     q->ip, h.rank);
        return -1;
    }
    cm_hs_rank_ctx(c->prefix, h.rank, (uint32_t)c->rank, ctx, &cl);
    cm_mac(&c->key, "ctorch rank hello v1", q->ns, h.nc, ctx, cl, want);
    if (!cm_mac_equal(want, h.mac)) {
        cm_log_event(c, CT_LOG_WARN, "auth_failed",
                     "\"peer\":\"%s\",\"claimed_rank\":%d,\"msg\":\"wrong proof of the job "
                     "secret: dropped\"",
                     q->ip, from);
        return -1;
    }
    if (c->links[from].fd >= 0) {
        cm_log_event(c, CT_LOG_WARN, "auth_failed",
                     "\"peer\":\"%s\",\"claimed_rank\":%d,\"msg\":\"rank already connected: "
                     "dropped\"",
                     q->ip, from);
        return -1;
    }
    cm_hs_rank_ctx(c->prefix, (uint32_t)c->rank, h.rank, ctx, &cl);
    cm_mac(&c->key, "ctorch rank accept v1", q->ns, h.nc, ctx, cl, want);
    double dl = cm_now() + 1.0 < q->deadline ? cm_now() + 1.0 : q->deadline;
    if (cm_net_send_all(q->fd, want, sizeof want, dl) != CT_OK) return -1;
    return from;
}

/* Accept the ranks above us: every connection must prove the secret within the handshake
 * deadline; several are handled at once, so a stalled or hostile one delays nobody. */
static ct_status accept_ranks(ct_comm *c, int lfd, double deadline)
{
    int P = c->size, r = c->rank;
    pending pq[PENDING_MAX];
    int npq = 0;
    double hs = cm_handshake_s(), paused_until = 0;
    ct_status st = CT_OK;
    for (int got = 0; got < P - 1 - r;) {
        double now = cm_now();
        if (now >= deadline) {
            int miss[64], nm = 0;
            for (int p = r + 1; p < P && nm < 64; p++)
                if (c->links[p].fd < 0) miss[nm++] = p;
            char list[400];
            cm_format_ranks(list, sizeof list, miss, nm);
            st = ct_error(CT_ETIMEDOUT,
                          "comm init '%s': ranks %s did not connect to rank %d in time", c->name,
                          list, r);
            break;
        }
        struct pollfd pf[PENDING_MAX + 1];
        double wake = deadline;
        int listening = now >= paused_until;
        pf[0] = (struct pollfd){listening ? lfd : -1, POLLIN, 0};
        if (!listening && paused_until < wake) wake = paused_until;
        for (int i = 0; i < npq; i++) {
            pf[i + 1] = (struct pollfd){pq[i].fd, POLLIN, 0};
            if (pq[i].deadline < wake) wake = pq[i].deadline;
        }
        double d = wake - now;
        int ms = d <= 0 ? 0 : d > 1000 ? 1000000 : (int)(d * 1000) + 1;
        int pr = poll(pf, (nfds_t)npq + 1, ms);
        if (pr < 0 && errno != EINTR) {
            st = ct_error(CT_EIO, "comm init: poll: %s", strerror(errno));
            break;
        }
        now = cm_now();
        /* Pending connections (from the last: dropping moves the last one into i). */
        for (int i = npq; i-- > 0;) {
            pending *q = &pq[i];
            if (pr > 0 && pf[i + 1].revents) {
                ssize_t k = recv(q->fd, q->buf + q->got, sizeof q->buf - q->got, MSG_DONTWAIT);
                if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                    pend_drop(pq, &npq, i);
                    continue;
                }
                if (k > 0) q->got += (size_t)k;
                if (q->got == sizeof q->buf) {
                    int from = hs_check(c, q);
                    if (from < 0) {
                        pend_drop(pq, &npq, i);
                    } else {
                        cm_net_nonblock(q->fd, 0);
                        c->links[from].fd = q->fd;
                        got++;
                        pq[i] = pq[--npq];
                    }
                    continue;
                }
            }
            if (now >= q->deadline) {
                cm_log_event(c, CT_LOG_WARN, "handshake_timeout",
                             "\"peer\":\"%s\",\"msg\":\"no proof of the job secret within %.3g "
                             "s: dropped\"",
                             q->ip, hs);
                pend_drop(pq, &npq, i);
            }
        }
        if (pr > 0 && listening && (pf[0].revents & POLLIN)) {
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd < 0) {
                if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK &&
                    errno != ECONNABORTED) {
                    /* Out of descriptors: shed the oldest stranger, pause accepting. */
                    if (npq) {
                        int old = 0;
                        for (int i = 1; i < npq; i++)
                            if (pq[i].deadline < pq[old].deadline) old = i;
                        pend_drop(pq, &npq, old);
                    }
                    paused_until = now + 0.05;
                }
                continue;
            }
            if (npq == PENDING_MAX) { /* full: shed the oldest */
                int old = 0;
                for (int i = 1; i < npq; i++)
                    if (pq[i].deadline < pq[old].deadline) old = i;
                pend_drop(pq, &npq, old);
            }
            pending *q = &pq[npq];
            memset(q, 0, sizeof *q);
            q->fd = fd;
            q->deadline = now + hs < deadline ? now + hs : deadline;
            snprintf(q->ip, sizeof q->ip, "?");
            cm_net_peer_ip(fd, q->ip, sizeof q->ip);
            cm_net_tune(fd);
            uint8_t ch[CM_HS_CHALLENGE_BYTES];
            if (cm_random(q->ns, sizeof q->ns) != CT_OK) {
                close(fd);
                continue;
            }
            cm_hs_write_challenge(ch, CM_HS_RANK_MAGIC, q->ns);
            if (send(fd, ch, sizeof ch, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof ch) {
                close(fd);
                continue;
            }
            npq++;
        }
    }
    for (int i = npq; i-- > 0;)
        pend_drop(pq, &npq, i);
    return st;
}

ct_status cm_tcp_setup(ct_comm *c, double deadline)
{
    int P = c->size, r = c->rank;
    /* Waiting for a peer: spin 20 us (a peer that is running answers within that), then sleep
     * on the futex at once. No sched_yield phase: on a core shared with compute, yielding
     * hands the core to the compute thread for a whole time slice (milliseconds), while a
     * sleeper woken by its peer's FUTEX_WAKE preempts it at once (see docs/comm.md,
     * "Latency under contention"). */
    c->spin_s = cm_env_double("CT_COMM_SPIN_US", 20.0) * 1e-6;
    c->yield_s = cm_env_double("CT_COMM_YIELD_US", 0.0) * 1e-6;
    if (!(c->spin_s >= 0 && c->spin_s <= 1.0)) c->spin_s = 20e-6;
    if (!(c->yield_s >= 0 && c->yield_s <= 1.0)) c->yield_s = 0;
    CT_TRY(ct_calloc((void **)&c->links, sizeof(cm_link) * (size_t)P));
    for (int p = 0; p < P; p++) {
        c->links[p].fd = -1;
        c->links[p].peer = p;
    }
    c->reqs_cap = 2 * P + 4;
    CT_TRY(ct_calloc(&c->reqs, sizeof(cm_req) * (size_t)c->reqs_cap));
    c->scratch_len = c->opt.small_bytes * (size_t)P;
    CT_TRY(ct_alloc(&c->scratch, c->scratch_len ? c->scratch_len : 64));

    peer_addr *a = NULL;
    int lfd = -1, lport = 0;
    ct_status st = ct_calloc((void **)&a, sizeof(peer_addr) * (size_t)P);
    char ip[64], hid[200], rec[512], key[700];
    /* Listen on the interface that reaches the store (loopback for a loopback store), not on
     * every interface. */
    if (!st) st = cm_store_local_ip(c->store, ip, sizeof ip);
    if (!st && !c->key.set && !cm_ip_is_loopback(ip))
        st = ct_error(CT_EINVAL,
                      "comm init '%s': rank %d reaches the store through %s (not loopback): a "
                      "job secret is needed (CT_JOB_SECRET or ct_comm_options.secret)",
                      c->name, r, ip);
    if (!st) st = cm_net_listen(ip, 0, &lfd, &lport);
    if (!st) {
        host_id(hid, sizeof hid);
        snprintf(rec, sizeof rec, "%s|%d|%d|%d|%s", ip, lport, (int)getpid(),
                 c->opt.use_shm ? 1 : 0, hid);
        snprintf(key, sizeof key, "%s/addr/%d", c->prefix, r);
        st = ct_store_set(c->store, key, rec, strlen(rec));
    }
    if (!st) st = gather_addrs(c, a, deadline);
    for (int p = 0; !st && !c->key.set && p < P; p++)
        if (!cm_ip_is_loopback(a[p].ip))
            st = ct_error(CT_EINVAL,
                          "comm init '%s': rank %d is at %s (not loopback): a job without a "
                          "secret must stay on loopback (set CT_JOB_SECRET on every rank)",
                          c->name, p, a[p].ip);
    if (!st && !c->key.set && r == 0) cm_warn_no_secret("comm");
    int nlocal = 0;
    if (!st) {
        for (int p = 0; p < P; p++) {
            c->links[p].local = local_index(a, P, r, p) >= 0;
            nlocal += c->links[p].local;
        }
        int k = 0;
        for (int p = 0; p < P; p++)
            if (p < r) k += c->links[p].local;
        c->local_rank = k;
    }
    char segname[96] = "";
    if (!st) {
        if (nlocal) {
            st = create_segment(c, nlocal, segname, sizeof segname);
        } else {
            st = ct_calloc((void **)&c->ctrl, sizeof(cm_ctrl));
        }
    }
    if (!st) {
        c->ctrl->pid = (int32_t)getpid();
        for (int p = 0; p < P; p++) {
            int idx = local_index(a, P, r, p);
            if (idx >= 0)
                chan_parts(chan_base(c->seg, c->shm_slot, idx), &c->links[p].rx,
                           &c->links[p].rx_slot, &c->links[p].rx_data);
        }
    }
    /* Connect to lower ranks, accept higher ones; every link proves the job secret. */
    for (int p = 0; !st && p < r; p++) {
        st = cm_net_connect(a[p].ip, a[p].port, deadline, &c->links[p].fd);
        if (!st) st = hs_connect(c, c->links[p].fd, p, deadline);
        if (st)
            st = ct_error_wrap(st, "comm init '%s': rank %d cannot join rank %d at %s:%d",
                               c->name, r, p, a[p].ip, a[p].port);
    }
    if (!st) st = accept_ranks(c, lfd, deadline);
    if (lfd >= 0) close(lfd);
    /* Same-host peers: swap segment names, map, and unlink once everyone has mapped. */
    for (int p = 0; !st && p < P; p++) {
        if (!c->links[p].local) continue;
        char nm[96] = {0};
        snprintf(nm, sizeof nm, "%s", segname);
        st = cm_net_send_all(c->links[p].fd, nm, sizeof nm, deadline);
    }
    for (int p = 0; !st && p < P; p++) {
        if (!c->links[p].local) continue;
        char nm[96];
        st = cm_net_recv_all(c->links[p].fd, nm, sizeof nm, deadline);
        nm[sizeof nm - 1] = 0;
        int np = 0;
        for (int q = 0; q < P; q++)
            np += local_index(a, P, p, q) >= 0;
        if (!st) st = map_peer(c, &c->links[p], nm, local_index(a, P, p, r), np);
    }
    for (int p = 0; !st && p < P; p++)
        if (c->links[p].local) st = cm_net_send_all(c->links[p].fd, "m", 1, deadline);
    for (int p = 0; !st && p < P; p++) {
        char b;
        if (c->links[p].local) st = cm_net_recv_all(c->links[p].fd, &b, 1, deadline);
    }
    if (segname[0]) shm_unlink(segname);
    for (int p = 0; !st && p < P; p++) {
        if (p == r) continue;
        cm_net_nonblock(c->links[p].fd, 1);
        if (!c->links[p].local) st = ct_alloc((void **)&c->links[p].stage, STAGE_BYTES);
    }
    ct_free(a);
    if (st == CT_EPEER)
        st = ct_error_wrap(CT_EPEER, "comm init '%s': a peer left during set-up", c->name);
    return st;
}

void cm_tcp_teardown(ct_comm *c)
{
    if (c->links) {
        for (int p = 0; p < c->size; p++) {
            cm_link *l = &c->links[p];
            if (l->fd >= 0) close(l->fd);
            if (l->pmap) munmap(l->pmap, l->pmap_len);
            ct_free(l->stage);
        }
        ct_free(c->links);
        c->links = NULL;
    }
    if (c->seg)
        munmap(c->seg, c->seg_len);
    else
        ct_free(c->ctrl);
    c->seg = NULL;
    c->ctrl = NULL;
    ct_free(c->scratch);
    ct_free(c->reqs);
    c->scratch = c->reqs = NULL;
}

void cm_tcp_wake_self(ct_comm *c)
{
    if (!c->ctrl) return;
    atomic_fetch_add(&c->ctrl->wake, 1);
    futex(&c->ctrl->wake, FUTEX_WAKE, 1 << 30, NULL);
}

int cm_tcp_peer_progress(ct_comm *c, int peer, uint64_t *issued, uint64_t *started,
                         uint64_t *completed, int *state)
{
    if (!c->links || peer < 0 || peer >= c->size || peer == c->rank) return 0;
    cm_ctrl *pc = c->links[peer].pctrl;
    if (!pc) return 0;
    *issued = atomic_load(&pc->issued_seq);
    *started = atomic_load(&pc->started_seq);
    *completed = atomic_load(&pc->completed_seq);
    *state = atomic_load(&pc->state);
    return 1;
}

/* ---- liveness --------------------------------------------------------------------------- */

/* Mark links whose socket closed; cheap enough to run every few milliseconds. */
static void poll_links(ct_comm *c)
{
    struct pollfd pf[64];
    int idx[64];
    for (int base = 0; base < c->size; base += 64) {
        int n = 0;
        for (int p = base; p < c->size && p < base + 64; p++) {
            if (p == c->rank || c->links[p].fd < 0) continue;
            pf[n] = (struct pollfd){c->links[p].fd, POLLIN, 0};
            idx[n++] = p;
        }
        if (n == 0 || poll(pf, (nfds_t)n, 0) <= 0) continue;
        for (int i = 0; i < n; i++) {
            cm_link *l = &c->links[idx[i]];
            if (!pf[i].revents || l->dead) continue;
            char b;
            ssize_t k = recv(l->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
                (k < 0 && (pf[i].revents & (POLLERR | POLLHUP))))
                l->dead = 1;
        }
    }
}

ct_status cm_tcp_check_peers(ct_comm *c, int *dead, char *msg, size_t cap)
{
    poll_links(c);
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        cm_link *l = &c->links[p];
        if (l->dead) {
            *dead = p;
            snprintf(msg, cap,
                     "rank %d is gone (its connection closed: the process exited or was killed)",
                     p);
            return CT_EPEER;
        }
        if (l->pctrl && atomic_load(&l->pctrl->state) != CM_RANK_OK) {
            *dead = p;
            snprintf(msg, cap, "rank %d %s", p,
                     atomic_load(&l->pctrl->state) == CM_RANK_ABORTED ? "aborted its communicator"
                                                                      : "failed");
            return CT_EPEER;
        }
    }
    return CT_OK;
}

/* ---- engine ------------------------------------------------------------------------------ */

static cm_req *add(cm_eng *e, int send, int peer, size_t len)
{
    cm_req *q = &e->r[e->n++];
    memset(q, 0, sizeof *q);
    q->send = send;
    q->peer = peer;
    q->len = len;
    q->complete = len == 0;
    q->tag = e->seq;
    q->user = -1;
    return q;
}

cm_req *cm_eng_send(cm_eng *e, int peer, const void *buf, size_t len)
{
    cm_req *q = add(e, 1, peer, len);
    q->sbuf = buf;
    return q;
}

cm_req *cm_eng_recv(cm_eng *e, int peer, void *buf, size_t len)
{
    cm_req *q = add(e, 0, peer, len);
    q->rbuf = buf;
    return q;
}

cm_req *cm_eng_recv_reduce(cm_eng *e, int peer, void *buf, const void *local, size_t len,
                           ct_dtype dt, ct_reduce_op op)
{
    cm_req *q = add(e, 0, peer, len);
    q->rbuf = buf;
    q->local = local;
    q->dt = dt;
    q->op = op;
    q->esize = ct_dtype_size(dt);
    return q;
}

static int fail(cm_eng *e, ct_status st, int peer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(cm_eng *e, ct_status st, int peer, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->st = st;
    e->nmissing = 0;
    if (peer >= 0) e->missing[e->nmissing++] = peer;
    return -1;
}

static void wake_peer(cm_link *l)
{
    l->need_wake = 0;
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&l->pctrl->sleeping, memory_order_relaxed)) {
        atomic_fetch_add(&l->pctrl->wake, 1);
        futex(&l->pctrl->wake, FUTEX_WAKE, 1 << 30, NULL);
    }
}

static int shm_send(cm_eng *e, cm_req *q, cm_link *l)
{
    size_t slot = e->c->shm_slot;
    size_t lim = q->avail ? (*q->avail < q->len ? *q->avail : q->len) : q->len;
    uint64_t head = atomic_load_explicit(&l->tx->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&l->tx->tail, memory_order_acquire);
    int prog = 0;
    while (q->done < lim) {
        if (head - tail >= NSLOTS) {
            tail = atomic_load_explicit(&l->tx->tail, memory_order_acquire);
            if (head - tail >= NSLOTS) break;
        }
        size_t k = head % NSLOTS, n = lim - q->done < slot ? lim - q->done : slot;
        memcpy(l->tx_data + k * slot, q->sbuf + q->done, n);
        l->tx_slot[k] = (cm_slot){q->tag, n, q->len, q->done, {0, 0, 0, 0}};
        atomic_store_explicit(&l->tx->head, ++head, memory_order_release);
        q->done += n;
        prog = 1;
    }
    if (prog) l->need_wake = 1;
    return prog;
}

static int shm_recv(cm_eng *e, cm_req *q, cm_link *l)
{
    size_t slot = e->c->shm_slot;
    uint64_t tail = atomic_load_explicit(&l->rx->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&l->rx->head, memory_order_acquire);
    int prog = 0;
    while (q->done < q->len && tail < head) {
        size_t k = tail % NSLOTS;
        const cm_slot *s = &l->rx_slot[k];
        if (s->tag != q->tag || s->total != q->len || s->off != q->done ||
            s->len > q->len - q->done)
            return fail(e, CT_EPEER, q->peer,
                        "protocol mismatch with rank %d: expected %s %llu of %zu bytes at %zu, got "
                        "%s %llu of %llu bytes at %llu (ranks issued different operations?)",
                        q->peer, q->tag & CM_TAG_P2P ? "p2p message" : "collective",
                        (unsigned long long)(q->tag & ~CM_TAG_P2P), q->len, q->done,
                        s->tag & CM_TAG_P2P ? "p2p message" : "collective",
                        (unsigned long long)(s->tag & ~CM_TAG_P2P), (unsigned long long)s->total,
                        (unsigned long long)s->off);
        const uint8_t *src = l->rx_data + k * slot;
        if (q->local)
            cm_reduce3(q->dt, q->op, q->rbuf + q->done, q->local + q->done, src, s->len / q->esize);
        else
            memcpy(q->rbuf + q->done, src, s->len);
        q->done += s->len;
        atomic_store_explicit(&l->rx->tail, ++tail, memory_order_release);
        prog = 1;
        if (tail == head) head = atomic_load_explicit(&l->rx->head, memory_order_acquire);
    }
    if (prog) l->need_wake = 1;
    return prog;
}

static int sock_gone(cm_eng *e, cm_req *q, ssize_t k)
{
    e->c->links[q->peer].dead = 1;
    return fail(e, CT_EPEER, q->peer, "rank %d is gone (%s while %s %zu of %zu bytes)", q->peer,
                k == 0 ? "connection closed" : strerror(errno), q->send ? "sending" : "receiving",
                q->done, q->len);
}

static int tcp_send(cm_eng *e, cm_req *q, cm_link *l)
{
    int prog = 0;
    if (q->hdone < 16) {
        if (q->hdone == 0) {
            uint64_t h[2] = {q->tag, q->len};
            memcpy(q->hdr, h, 16);
        }
        ssize_t k = send(l->fd, q->hdr + q->hdone, 16 - q->hdone, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0)
            return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0
                                                                               : sock_gone(e, q, k);
        q->hdone += (size_t)k;
        prog = 1;
        if (q->hdone < 16) return prog;
    }
    size_t lim = q->avail ? (*q->avail < q->len ? *q->avail : q->len) : q->len;
    while (q->done < lim) {
        ssize_t k = send(l->fd, q->sbuf + q->done, lim - q->done, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
            return sock_gone(e, q, k);
        }
        q->done += (size_t)k;
        prog = 1;
    }
    return prog;
}

static int tcp_recv(cm_eng *e, cm_req *q, cm_link *l)
{
    int prog = 0;
    if (q->hdone < 16) {
        ssize_t k = recv(l->fd, q->hdr + q->hdone, 16 - q->hdone, MSG_DONTWAIT);
        if (k <= 0) {
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
            return sock_gone(e, q, k);
        }
        q->hdone += (size_t)k;
        prog = 1;
        if (q->hdone < 16) return prog;
        uint64_t h[2];
        memcpy(h, q->hdr, 16);
        if (h[0] != q->tag || h[1] != q->len)
            return fail(e, CT_EPEER, q->peer,
                        "protocol mismatch with rank %d: expected tag %llx of %zu bytes, got tag "
                        "%llx of %llu bytes (ranks issued different operations?)",
                        q->peer, (unsigned long long)q->tag, q->len, (unsigned long long)h[0],
                        (unsigned long long)h[1]);
    }
    while (q->done < q->len) {
        if (!q->local) {
            ssize_t k = recv(l->fd, q->rbuf + q->done, q->len - q->done, MSG_DONTWAIT);
            if (k <= 0) {
                if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
                return sock_gone(e, q, k);
            }
            q->done += (size_t)k;
            prog = 1;
            continue;
        }
        size_t want = q->len - q->done - q->staged;
        if (want > STAGE_BYTES - q->staged) want = STAGE_BYTES - q->staged;
        ssize_t k = recv(l->fd, l->stage + q->staged, want, MSG_DONTWAIT);
        if (k <= 0) {
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
            return sock_gone(e, q, k);
        }
        q->staged += (size_t)k;
        size_t whole = q->staged / q->esize * q->esize;
        if (whole) {
            cm_reduce3(q->dt, q->op, q->rbuf + q->done, q->local + q->done, l->stage,
                       whole / q->esize);
            memmove(l->stage, l->stage + whole, q->staged - whole);
            q->staged -= whole;
            q->done += whole;
        }
        prog = 1;
    }
    return prog;
}

/* One pass over the requests: 1 if anything moved, -1 on failure. */
static int pass(cm_eng *e, int *left)
{
    ct_comm *c = e->c;
    int prog = 0;
    *left = 0;
    for (int i = 0; i < e->n; i++) {
        cm_req *q = &e->r[i];
        if (q->complete) continue;
        int blocked = 0; /* an earlier request on the same link and direction goes first */
        for (int j = 0; j < i && !blocked; j++)
            blocked = !e->r[j].complete && e->r[j].peer == q->peer && e->r[j].send == q->send;
        if (blocked) {
            (*left)++;
            continue;
        }
        cm_link *l = &c->links[q->peer];
        int k = l->local ? (q->send ? shm_send(e, q, l) : shm_recv(e, q, l))
                         : (q->send ? tcp_send(e, q, l) : tcp_recv(e, q, l));
        if (k < 0) return -1;
        prog |= k;
        if (q->done == q->len && (l->local || q->hdone == 16)) {
            q->complete = 1;
            if (e->on_done) e->on_done(e, q);
        } else {
            (*left)++;
        }
    }
    for (int i = 0; i < e->n; i++) {
        cm_link *l = &c->links[e->r[i].peer];
        if (l->need_wake) wake_peer(l);
    }
    return prog;
}

/* Should a gone peer fail this exchange? For a collective, when the peer had not completed
 * it (if it had, everything it owed us is already in our channels); for p2p, when we still
 * have a request with it. Remote peers: when we still have a request with them. */
static int peer_matters(cm_eng *e, int p)
{
    cm_link *l = &e->c->links[p];
    if (e->seq && l->pctrl) return atomic_load(&l->pctrl->completed_seq) < e->seq;
    for (int i = 0; i < e->n; i++)
        if (!e->r[i].complete && e->r[i].peer == p) return 1;
    return 0;
}

static int check_faults(cm_eng *e)
{
    ct_comm *c = e->c;
    poll_links(c);
    /* Gone peers first: they are the cause; a failed flag is often its echo. */
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank || !c->links[p].dead || !peer_matters(e, p)) continue;
        return fail(e, CT_EPEER, p,
                    "rank %d is gone (its connection closed: the process exited or was killed)", p);
    }
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        cm_link *l = &c->links[p];
        int st = l->pctrl ? atomic_load(&l->pctrl->state) : CM_RANK_OK;
        if (st == CM_RANK_OK || !peer_matters(e, p)) continue;
        if (st == CM_RANK_ABORTED)
            return fail(e, CT_EPEER, p, "rank %d aborted its communicator", p);
        int cause = l->pctrl->culprit;
        char why[200];
        snprintf(why, sizeof why, "%s", l->pctrl->reason);
        if (cause >= 0 && cause < c->size && cause != c->rank)
            return fail(e, CT_EPEER, cause, "rank %d is gone (reported by rank %d: %s)", cause, p,
                        why);
        return fail(e, CT_EPEER, p, "rank %d failed%s%s", p, why[0] ? ": " : "", why);
    }
    return 0;
}

static void timed_out(cm_eng *e)
{
    ct_comm *c = e->c;
    int late[64], nl = 0;
    uint64_t min_issued = UINT64_MAX;
    if (e->seq) {
        for (int p = 0; p < c->size && nl < 64; p++) {
            cm_link *l = &c->links[p];
            if (p == c->rank || !l->pctrl) continue;
            uint64_t is = atomic_load(&l->pctrl->issued_seq);
            if (is < e->seq) {
                late[nl++] = p;
                if (is < min_issued) min_issued = is;
            }
        }
    }
    int waiting[64], nw = 0;
    for (int i = 0; i < e->n && nw < 64; i++) {
        cm_req *q = &e->r[i];
        if (q->complete) continue;
        int dup = 0;
        for (int j = 0; j < nw; j++)
            dup |= waiting[j] == q->peer;
        if (!dup) waiting[nw++] = q->peer;
    }
    char list[200];
    e->st = CT_ETIMEDOUT;
    if (nl) {
        cm_format_ranks(list, sizeof list, late, nl);
        snprintf(e->msg, sizeof e->msg, "ranks %s did not arrive (last issued seq %llu)", list,
                 (unsigned long long)min_issued);
        memcpy(e->missing, late, sizeof(int) * (size_t)nl);
        e->nmissing = nl;
    } else {
        /* Remote peers (no control block), or everyone arrived and someone stalls. */
        int rem = 0;
        for (int i = 0; i < nw; i++)
            rem |= !c->links[waiting[i]].pctrl;
        cm_format_ranks(list, sizeof list, waiting, nw);
        snprintf(e->msg, sizeof e->msg, "%s %s",
                 rem ? "no data from ranks" : "all ranks arrived; stalled waiting for ranks", list);
        memcpy(e->missing, waiting, sizeof(int) * (size_t)nw);
        e->nmissing = nw;
    }
}

#define CHECK_S 3e-3
#define SLEEP_S 5e-3

ct_status cm_eng_run(cm_eng *e)
{
    ct_comm *c = e->c;
    double idle_since = 0, last_check = 0;
    unsigned spins = 0;
    e->st = CT_OK;
    for (;;) {
        int left;
        int k = pass(e, &left);
        if (k < 0) return e->st;
        if (e->absorb && e->absorb(e)) continue;
        if (left == 0) {
            e->n = 0;
            return CT_OK;
        }
        if (k > 0) {
            spins = 0;
            idle_since = 0;
            continue;
        }
        if (atomic_load_explicit(&c->aborted, memory_order_relaxed)) {
            e->st = CT_ECANCELLED;
            snprintf(e->msg, sizeof e->msg, "cancelled by ct_comm_abort");
            e->nmissing = 0;
            return e->st;
        }
        if (++spins & 31) {
            cpu_relax();
            continue;
        }
        double now = cm_now();
        if (idle_since == 0) {
            idle_since = now;
            if (last_check == 0) last_check = now;
        }
        if (e->next_deadline) e->deadline = e->next_deadline(e);
        if (now >= e->deadline) {
            timed_out(e);
            return e->st;
        }
        if (now - last_check >= CHECK_S) {
            last_check = now;
            if (check_faults(e)) return e->st;
        }
        double idle = now - idle_since;
        if (idle < c->spin_s) {
            cpu_relax();
            continue;
        }
        if (idle < c->yield_s) {
            sched_yield();
            continue;
        }
        /* Sleep until a peer touches one of our channels, a socket wakes, or 5 ms. */
        double d = e->deadline - now;
        if (d > SLEEP_S) d = SLEEP_S;
        int tcp = 0, shm = 0;
        struct pollfd pf[128];
        for (int i = 0; i < e->n; i++) {
            cm_req *q = &e->r[i];
            if (q->complete) continue;
            if (c->links[q->peer].local) {
                shm = 1;
            } else if (tcp < 128) {
                pf[tcp++] =
                    (struct pollfd){c->links[q->peer].fd, (short)(q->send ? POLLOUT : POLLIN), 0};
            }
        }
        if (tcp) {
            int ms = shm ? 1 : (int)(d * 1000) + 1;
            poll(pf, (nfds_t)tcp, ms);
            continue;
        }
        if (!shm) continue;
        atomic_store(&c->ctrl->sleeping, 1);
        atomic_thread_fence(memory_order_seq_cst);
        uint32_t v = atomic_load(&c->ctrl->wake);
        k = pass(e, &left);
        if (k != 0 || left == 0 || atomic_load(&c->aborted)) {
            atomic_store(&c->ctrl->sleeping, 0);
            if (k < 0) return e->st;
            continue;
        }
        struct timespec ts = {0, (long)(d * 1e9)};
        futex(&c->ctrl->wake, FUTEX_WAIT, v, &ts);
        atomic_store(&c->ctrl->sleeping, 0);
        last_check = 1e-9; /* after a sleep, look at the peers at once */
    }
}
