/* The rendezvous store: a key-value map served by one thread over TCP (like c10d's
 * TCPStore), and its client. A connection starts with the handshake: the server sends a
 * challenge [u32 magic][u32 version][32-byte nonce], the client its nonce and
 * HMAC-SHA256(secret, "ctorch store client v1" NUL ns nc), the server
 * HMAC(secret, "ctorch store server v1" NUL ns nc); nothing else is read before that (and
 * only for CM_HANDSHAKE_S). Then frames [u32 length][u8 command][fields]; a field is
 * [u32 length][bytes]. The server never blocks on a client: waiting for a key is the
 * client polling GET until its deadline. Every buffer a client can grow is bounded
 * (CT_STORE_MAX_*). */
#include "comm/comm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { ST_SET = 1, ST_GET, ST_CHECK, ST_ADD, ST_CAS, ST_DEL };
enum { ST_OK = 0, ST_MISSING = 1, ST_BAD = 2, ST_FULL = 3 };

#define ST_MAX_KEY CT_STORE_MAX_KEY_BYTES
#define ST_MAX_VAL CT_STORE_MAX_VALUE_BYTES
/* The largest request: compare-set with two values. */
#define ST_MAX_FRAME (2 * (ST_MAX_VAL + 4) + ST_MAX_KEY + 16)
/* Per client: the input buffer holds at most one whole request (plus its length), replies
 * queue up to the rest of CT_STORE_MAX_CLIENT_BYTES; a client that sends requests faster
 * than it reads replies is not read until it has read them (pipelining is bounded). */
#define ST_IN_CAP ((size_t)ST_MAX_FRAME + 4)
#define ST_OUT_CAP ((size_t)CT_STORE_MAX_CLIENT_BYTES - ST_IN_CAP)
#define ST_MAX_REPLY ((size_t)ST_MAX_VAL + 9)
#define ST_ACCEPT_PAUSE_S 0.1
/* What the store holds, whoever writes it (an authenticated client could otherwise grow it
 * until the host runs out of memory): keys, and bytes of keys and values. A write past
 * either is answered ST_FULL (the client's message names the limits) and changes nothing;
 * deleting keys makes room again. */
#define ST_MAX_KEYS ((size_t)1 << 16)
#define ST_MAX_BYTES ((size_t)256 << 20)
#define ST_BUCKETS ((size_t)1 << 16) /* a power of two; chains average <= 1 at ST_MAX_KEYS */
_Static_assert(ST_OUT_CAP >= ST_MAX_REPLY + (1u << 20), "the reply queue must hold a reply");

/* ---- server ---------------------------------------------------------------------------- */

typedef struct kv {
    char *key;
    uint8_t *val;
    size_t len, klen;
    uint32_t hash, next; /* next: index + 1 in the bucket's chain, 0 ends it */
} kv;

typedef struct client {
    int fd;
    int authed;
    double hs_deadline;
    uint8_t ns[CM_NONCE_BYTES];
    char ip[64];
    uint8_t *in;
    size_t in_len, in_cap;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
} client;

struct ct_store_server {
    int lfd, port;
    int wake[2];
    pthread_t th;
    cm_key key;
    double handshake_s;
    double accept_paused_until;
    kv *kvs;
    size_t nkv, cap_kv;
    uint32_t *bucket;  /* ST_BUCKETS chains of kvs (index + 1) */
    size_t bytes;      /* keys and values held */
    client *cl;
    size_t ncl, cap_cl;
    pthread_mutex_t stats_mu;
    cm_store_stats stats;
};

static uint32_t kv_hash(const char *key, size_t klen)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < klen; i++)
        h = (h ^ (uint8_t)key[i]) * 16777619u;
    return h;
}

static kv *kv_find(ct_store_server *s, const char *key, size_t klen)
{
    if (!s->bucket) return NULL;
    uint32_t h = kv_hash(key, klen);
    for (uint32_t i = s->bucket[h & (ST_BUCKETS - 1)]; i; i = s->kvs[i - 1].next) {
        kv *e = &s->kvs[i - 1];
        if (e->hash == h && e->klen == klen && !memcmp(e->key, key, klen)) return e;
    }
    return NULL;
}

/* The link that points at kvs[i] (the bucket head or the previous entry's next). */
static uint32_t *kv_link(ct_store_server *s, size_t i)
{
    uint32_t *l = &s->bucket[s->kvs[i].hash & (ST_BUCKETS - 1)];
    while (*l != i + 1)
        l = &s->kvs[*l - 1].next;
    return l;
}

static void kv_delete(ct_store_server *s, kv *e)
{
    size_t i = (size_t)(e - s->kvs), last = s->nkv - 1;
    *kv_link(s, i) = e->next;
    s->bytes -= e->klen + e->len;
    free(e->key);
    free(e->val);
    if (i != last) { /* the last entry moves into the hole */
        *kv_link(s, last) = (uint32_t)(i + 1);
        s->kvs[i] = s->kvs[last];
    }
    s->nkv--;
}

/* 0 stored, 1 full (nothing changed), -1 refused or out of memory. */
static int kv_put(ct_store_server *s, const char *key, size_t klen, const uint8_t *v, size_t vlen)
{
    if (vlen > ST_MAX_VAL || memchr(key, 0, klen)) return -1;
    kv *e = kv_find(s, key, klen);
    size_t after = s->bytes - (e ? e->len : 0) + vlen + (e ? 0 : klen);
    if (after > ST_MAX_BYTES || (!e && s->nkv >= ST_MAX_KEYS)) return 1;
    if (!s->bucket && !(s->bucket = calloc(ST_BUCKETS, sizeof *s->bucket))) return -1;
    uint8_t *nv = malloc(vlen ? vlen : 1);
    if (!nv) return -1;
    if (vlen) memcpy(nv, v, vlen);
    if (e) {
        free(e->val);
        e->val = nv;
        e->len = vlen;
        s->bytes = after;
        return 0;
    }
    if (s->nkv == s->cap_kv) {
        size_t nc = s->cap_kv ? s->cap_kv * 2 : 64;
        kv *n = realloc(s->kvs, nc * sizeof *n);
        if (!n) {
            free(nv);
            return -1;
        }
        s->kvs = n;
        s->cap_kv = nc;
    }
    char *k = malloc(klen + 1);
    if (!k) {
        free(nv);
        return -1;
    }
    memcpy(k, key, klen);
    k[klen] = 0;
    uint32_t h = kv_hash(key, klen);
    uint32_t *head = &s->bucket[h & (ST_BUCKETS - 1)];
    s->kvs[s->nkv] = (kv){k, nv, vlen, klen, h, *head};
    *head = (uint32_t)(++s->nkv);
    s->bytes = after;
    return 0;
}

/* Grow *b to hold need bytes, never past limit. */
static int buf_reserve(uint8_t **b, size_t *cap, size_t need, size_t limit)
{
    if (need <= *cap) return 0;
    if (need > limit) return -1;
    size_t nc = *cap ? *cap : 256;
    while (nc < need)
        nc = nc > limit / 2 ? limit : nc * 2;
    uint8_t *n = realloc(*b, nc);
    if (!n) return -1;
    *b = n;
    *cap = nc;
    return 0;
}

static void note_bytes(ct_store_server *s, const client *c)
{
    size_t b = c->in_cap + c->out_cap;
    if (b > s->stats.peak_client_bytes) {
        pthread_mutex_lock(&s->stats_mu);
        if (b > s->stats.peak_client_bytes) s->stats.peak_client_bytes = b;
        pthread_mutex_unlock(&s->stats_mu);
    }
}

/* Append raw bytes to a client's reply queue (moving what is unsent to the front first). */
static int out_put(ct_store_server *s, client *c, const void *a, size_t an, const void *b,
                   size_t bn)
{
    if (c->out_off) {
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    if (buf_reserve(&c->out, &c->out_cap, c->out_len + an + bn, ST_OUT_CAP)) return -1;
    memcpy(c->out + c->out_len, a, an);
    if (bn) memcpy(c->out + c->out_len + an, b, bn);
    c->out_len += an + bn;
    note_bytes(s, c);
    return 0;
}

/* Append a reply [u32 len][u8 status][optional field]. */
static int reply(ct_store_server *s, client *c, uint8_t status, const void *field, size_t flen,
                 int has_field)
{
    if (flen > ST_MAX_VAL) return -1;
    uint8_t h[9];
    uint32_t body = (uint32_t)(1 + (has_field ? 4 + flen : 0)), f32 = (uint32_t)flen;
    memcpy(h, &body, 4);
    h[4] = status;
    memcpy(h + 5, &f32, 4);
    return out_put(s, c, h, has_field ? 9 : 5, has_field ? field : NULL, has_field ? flen : 0);
}

/* Read field i of a request body; returns 0 when it is there. */
static int field(const uint8_t *body, size_t len, int idx, const uint8_t **f, size_t *flen)
{
    size_t off = 1;
    for (int i = 0;; i++) {
        uint32_t l;
        if (len < 4 || off > len - 4) return -1;
        memcpy(&l, body + off, 4);
        if (l > len - off - 4) return -1;
        if (i == idx) {
            *f = body + off + 4;
            *flen = l;
            return 0;
        }
        off += 4 + (size_t)l;
    }
}

static int handle(ct_store_server *s, client *c, const uint8_t *body, size_t len)
{
    const uint8_t *k, *a, *b;
    size_t kl, al, bl;
    if (len < 1 || field(body, len, 0, &k, &kl) || kl == 0 || kl > ST_MAX_KEY) return -1;
    const char *key = (const char *)k;
    kv *e = kv_find(s, key, kl);
    switch (body[0]) {
    case ST_SET: {
        int r;
        if (field(body, len, 1, &a, &al) || al > ST_MAX_VAL || (r = kv_put(s, key, kl, a, al)) < 0)
            return -1;
        return reply(s, c, r ? ST_FULL : ST_OK, NULL, 0, 0);
    }
    case ST_GET:
        return e ? reply(s, c, ST_OK, e->val, e->len, 1) : reply(s, c, ST_MISSING, NULL, 0, 0);
    case ST_CHECK:
        return reply(s, c, e ? ST_OK : ST_MISSING, NULL, 0, 0);
    case ST_ADD: {
        int64_t delta, v = 0;
        if (field(body, len, 1, &a, &al) || al != 8) return -1;
        memcpy(&delta, a, 8);
        if (e) {
            char tmp[32];
            size_t n = e->len < sizeof tmp - 1 ? e->len : sizeof tmp - 1;
            memcpy(tmp, e->val, n);
            tmp[n] = 0;
            v = strtoll(tmp, NULL, 10);
        }
        v = (int64_t)((uint64_t)v + (uint64_t)delta);
        char out[32];
        int n = snprintf(out, sizeof out, "%lld", (long long)v);
        int r = kv_put(s, key, kl, (const uint8_t *)out, (size_t)n);
        if (r < 0) return -1;
        return r ? reply(s, c, ST_FULL, NULL, 0, 0) : reply(s, c, ST_OK, &v, 8, 1);
    }
    case ST_CAS:
        if (field(body, len, 1, &a, &al) || field(body, len, 2, &b, &bl) || al > ST_MAX_VAL ||
            bl > ST_MAX_VAL)
            return -1;
        if ((!e && al == 0) || (e && e->len == al && !memcmp(e->val, a, al))) {
            int r = kv_put(s, key, kl, b, bl);
            if (r < 0) return -1;
            if (r) return reply(s, c, ST_FULL, NULL, 0, 0);
            e = kv_find(s, key, kl);
        }
        return e ? reply(s, c, ST_OK, e->val, e->len, 1) : reply(s, c, ST_MISSING, NULL, 0, 0);
    case ST_DEL:
        if (e) kv_delete(s, e);
        return reply(s, c, ST_OK, NULL, 0, 0);
    }
    return -1;
}

static void client_free_bufs(client *c)
{
    free(c->in);
    free(c->out);
    c->in = c->out = NULL;
}

static void client_close(ct_store_server *s, size_t i)
{
    if (s->cl[i].fd >= 0) close(s->cl[i].fd);
    client_free_bufs(&s->cl[i]);
    s->cl[i] = s->cl[--s->ncl];
    pthread_mutex_lock(&s->stats_mu);
    s->stats.clients = s->ncl;
    pthread_mutex_unlock(&s->stats_mu);
}

static void count(ct_store_server *s, uint64_t *field_)
{
    pthread_mutex_lock(&s->stats_mu);
    (*field_)++;
    pthread_mutex_unlock(&s->stats_mu);
}

/* Bytes a client may send us now: before authentication exactly its proof; after, up to one
 * whole request beyond what is buffered. */
static size_t in_room(const client *c)
{
    size_t cap = c->authed ? ST_IN_CAP : CM_HS_STORE_PROOF_BYTES;
    return c->in_len < cap ? cap - c->in_len : 0;
}

/* Whether the reply queue can take the largest reply. */
static int out_room(const client *c)
{
    return c->out_len - c->out_off + ST_MAX_REPLY <= ST_OUT_CAP;
}

/* Check a client's proof of the secret and answer with ours. -1 closes it. */
static int client_auth(ct_store_server *s, client *c)
{
    const uint8_t *nc = c->in;
    uint8_t want[CM_MAC_BYTES], mine[CM_MAC_BYTES];
    cm_mac(&s->key, "ctorch store client v1", c->ns, nc, NULL, 0, want);
    if (!cm_mac_equal(want, c->in + CM_NONCE_BYTES)) {
        count(s, &s->stats.auth_failures);
        ct_log(CT_LOG_WARN, "comm",
               "{\"event\":\"auth_failed\",\"where\":\"store\",\"port\":%d,\"peer\":\"%s\","
               "\"msg\":\"a connection did not prove the job secret: dropped\"}",
               s->port, c->ip);
        return -1;
    }
    cm_mac(&s->key, "ctorch store server v1", c->ns, nc, NULL, 0, mine);
    c->authed = 1;
    c->in_len = 0;
    return out_put(s, c, mine, sizeof mine, NULL, 0);
}

/* Answer the complete requests buffered, while the reply queue has room. -1 closes. */
static int client_process(ct_store_server *s, client *c)
{
    if (!c->authed) {
        if (c->in_len < CM_HS_STORE_PROOF_BYTES) return 0;
        return client_auth(s, c);
    }
    size_t off = 0;
    while (c->in_len - off >= 4 && out_room(c)) {
        uint32_t len;
        memcpy(&len, c->in + off, 4);
        if (len == 0 || len > ST_MAX_FRAME) return -1;
        if (c->in_len - off - 4 < len) break;
        if (handle(s, c, c->in + off + 4, len)) return -1;
        off += 4 + (size_t)len;
    }
    if (off) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    if (c->in_len == 0 && c->in_cap > (1u << 20)) { /* give a big request's memory back */
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
    return 0;
}

/* Read what is there (within the client's room), answer complete frames; -1 closes. */
static int client_read(ct_store_server *s, client *c)
{
    for (;;) {
        size_t room = in_room(c);
        if (room == 0) break;
        size_t want = room < 65536 ? room : 65536;
        size_t lim = c->authed ? ST_IN_CAP : CM_HS_STORE_PROOF_BYTES;
        if (buf_reserve(&c->in, &c->in_cap, c->in_len + want, lim)) return -1;
        note_bytes(s, c);
        ssize_t r = recv(c->fd, c->in + c->in_len, want, MSG_DONTWAIT);
        if (r == 0) return -1;
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR) continue;
            return -1;
        }
        c->in_len += (size_t)r;
        if (!c->authed && c->in_len == CM_HS_STORE_PROOF_BYTES) break;
    }
    return client_process(s, c);
}

static int client_write(ct_store_server *s, client *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w =
            send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        c->out_off += (size_t)w;
    }
    c->out_off = c->out_len = 0;
    if (c->out_cap > (1u << 20)) {
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    /* Room again: answer the requests that waited for it. */
    return c->in_len ? client_process(s, c) : 0;
}

/* Close the oldest connection that has not authenticated (to make room); 0 if none. */
static int shed_one(ct_store_server *s)
{
    size_t best = s->ncl;
    for (size_t i = 0; i < s->ncl; i++)
        if (!s->cl[i].authed && (best == s->ncl || s->cl[i].hs_deadline < s->cl[best].hs_deadline))
            best = i;
    if (best == s->ncl) return 0;
    client_close(s, best);
    count(s, &s->stats.shed);
    return 1;
}

static int client_add(ct_store_server *s, int fd)
{
    if (s->ncl >= CT_STORE_MAX_CLIENTS && !shed_one(s)) {
        count(s, &s->stats.shed);
        return -1;
    }
    if (s->ncl == s->cap_cl) {
        size_t nc = s->cap_cl ? s->cap_cl * 2 : 16;
        client *ncl = realloc(s->cl, nc * sizeof *ncl);
        if (!ncl) return -1;
        s->cl = ncl;
        s->cap_cl = nc;
    }
    client c;
    memset(&c, 0, sizeof c);
    c.fd = fd;
    c.hs_deadline = cm_now() + s->handshake_s;
    snprintf(c.ip, sizeof c.ip, "?");
    if (fd >= 0) cm_net_peer_ip(fd, c.ip, sizeof c.ip);
    uint8_t ch[CM_HS_CHALLENGE_BYTES];
    if (cm_random(c.ns, sizeof c.ns)) return -1;
    cm_hs_write_challenge(ch, CM_HS_STORE_MAGIC, c.ns);
    s->cl[s->ncl] = c;
    if (out_put(s, &s->cl[s->ncl], ch, sizeof ch, NULL, 0)) {
        client_free_bufs(&s->cl[s->ncl]);
        return -1;
    }
    s->ncl++;
    pthread_mutex_lock(&s->stats_mu);
    s->stats.clients = s->ncl;
    pthread_mutex_unlock(&s->stats_mu);
    return 0;
}

static void accept_some(ct_store_server *s)
{
    for (int k = 0; k < 64; k++) {
        count(s, &s->stats.accept_calls);
        int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            /* Out of descriptors or memory: free one held by a stranger and stop accepting
             * for a moment instead of spinning on a listener that stays readable. */
            count(s, &s->stats.accept_errors);
            shed_one(s);
            s->accept_paused_until = cm_now() + ST_ACCEPT_PAUSE_S;
            return;
        }
        cm_net_tune(fd);
        if (client_add(s, fd)) close(fd);
    }
}

static void *server_main(void *arg)
{
    ct_store_server *s = arg;
    struct pollfd *pf = NULL;
    size_t pcap = 0;
    for (;;) {
        size_t need = s->ncl + 2;
        if (need > pcap) {
            struct pollfd *n = realloc(pf, need * 2 * sizeof *n);
            if (!n) break;
            pf = n;
            pcap = need * 2;
        }
        double now = cm_now(), wake_at = 0;
        int listening = now >= s->accept_paused_until;
        if (!listening) wake_at = s->accept_paused_until;
        pf[0] = (struct pollfd){s->wake[0], POLLIN, 0};
        pf[1] = (struct pollfd){listening ? s->lfd : -1, POLLIN, 0};
        for (size_t i = 0; i < s->ncl; i++) {
            client *c = &s->cl[i];
            short ev = 0;
            if (in_room(c) && (!c->authed || out_room(c))) ev |= POLLIN;
            if (c->out_len > c->out_off) ev |= POLLOUT;
            pf[i + 2] = (struct pollfd){c->fd, ev, 0};
            if (!c->authed && (wake_at == 0 || c->hs_deadline < wake_at)) wake_at = c->hs_deadline;
        }
        int ms = -1;
        if (wake_at > 0) ms = wake_at <= now ? 0 : (int)((wake_at - now) * 1000.0) + 1;
        int pr = poll(pf, s->ncl + 2, ms);
        if (pr < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[0].revents) break;
        /* Clients first (indices stay valid: closing moves the last one into i). */
        size_t n = s->ncl;
        now = cm_now();
        for (size_t i = n; i-- > 0;) {
            client *c = &s->cl[i];
            short ev = pf[i + 2].revents;
            int bad = (ev & (POLLERR | POLLNVAL)) != 0;
            if (!bad && (ev & (POLLIN | POLLHUP))) bad = client_read(s, c) != 0;
            if (!bad && (ev & POLLOUT)) bad = client_write(s, c) != 0;
            if (!bad && !c->authed && now >= c->hs_deadline) {
                count(s, &s->stats.handshake_timeouts);
                ct_log(CT_LOG_WARN, "comm",
                       "{\"event\":\"handshake_timeout\",\"where\":\"store\",\"port\":%d,"
                       "\"peer\":\"%s\",\"msg\":\"a connection did not prove the job secret "
                       "within %.3g s: dropped\"}",
                       s->port, c->ip, s->handshake_s);
                bad = 1;
            }
            if (bad) client_close(s, i);
        }
        if (listening && (pf[1].revents & POLLIN)) accept_some(s);
    }
    free(pf);
    return NULL;
}

ct_store_options ct_store_options_default(void)
{
    return (ct_store_options){.secret = NULL, .handshake_s = cm_handshake_s()};
}

ct_status ct_store_server_start(const char *host, int port, ct_store_server **out)
{
    return ct_store_server_start_opts(host, port, NULL, out);
}

ct_status ct_store_server_start_opts(const char *host, int port, const ct_store_options *opt,
                                     ct_store_server **out)
{
    const char *fn = "ct_store_server_start";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    *out = NULL;
    if (port < 0 || port > 65535)
        return ct_error(CT_EINVAL, "%s: port %d is not in [0, 65535]", fn, port);
    ct_store_options o = opt ? *opt : ct_store_options_default();
    if (!(o.handshake_s > 0) || !(o.handshake_s < 1e6))
        return ct_error(CT_EINVAL, "%s: handshake_s must be in (0, 1e6) seconds, got %g", fn,
                        o.handshake_s);
    if (!host || !*host) host = "127.0.0.1";
    ct_store_server *s;
    CT_TRY(ct_calloc((void **)&s, sizeof *s));
    s->lfd = -1;
    ct_status st = cm_key_resolve(fn, o.secret, &s->key);
    if (!st && !s->key.set && !cm_ip_is_loopback(host))
        st = ct_error(CT_EINVAL,
                      "%s: serving on '%s' (not a loopback address) needs a job secret: set "
                      "CT_JOB_SECRET (ctorch launch makes one) or options .secret",
                      fn, host);
    if (!st) st = cm_net_listen(host, port, &s->lfd, &s->port);
    if (st) {
        cm_key_wipe(&s->key);
        ct_free(s);
        return st;
    }
    if (!s->key.set) cm_warn_no_secret("store server");
    s->handshake_s = o.handshake_s;
    pthread_mutex_init(&s->stats_mu, NULL);
    if (pipe2(s->wake, O_CLOEXEC) != 0) {
        close(s->lfd);
        ct_free(s);
        return ct_error(CT_EIO, "%s: pipe: %s", fn, strerror(errno));
    }
    cm_net_nonblock(s->lfd, 1);
    if (pthread_create(&s->th, NULL, server_main, s) != 0) {
        close(s->lfd);
        close(s->wake[0]);
        close(s->wake[1]);
        ct_free(s);
        return ct_error(CT_EIO, "%s: cannot start the server thread", fn);
    }
    *out = s;
    return CT_OK;
}

int ct_store_server_port(const ct_store_server *s)
{
    return s ? s->port : 0;
}

void cm_store_server_stats(ct_store_server *s, cm_store_stats *out)
{
    pthread_mutex_lock(&s->stats_mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->stats_mu);
}

static void server_free_state(ct_store_server *s)
{
    while (s->ncl)
        client_close(s, s->ncl - 1);
    free(s->cl);
    for (size_t i = 0; i < s->nkv; i++) {
        free(s->kvs[i].key);
        free(s->kvs[i].val);
    }
    free(s->kvs);
    free(s->bucket);
    cm_key_wipe(&s->key);
    pthread_mutex_destroy(&s->stats_mu);
}

void ct_store_server_free(ct_store_server *s)
{
    if (!s) return;
    char b = 1;
    ssize_t w = write(s->wake[1], &b, 1);
    (void)w;
    pthread_join(s->th, NULL);
    close(s->lfd);
    close(s->wake[0]);
    close(s->wake[1]);
    server_free_state(s);
    ct_free(s);
}

size_t cm_store_fuzz_feed(const uint8_t *data, size_t n, int authenticated)
{
    ct_store_server s;
    memset(&s, 0, sizeof s);
    s.lfd = -1;
    s.handshake_s = 10;
    pthread_mutex_init(&s.stats_mu, NULL);
    size_t sent = 0;
    if (client_add(&s, -1) == 0) {
        client *c = &s.cl[0];
        if (authenticated) {
            c->authed = 1;
            c->out_len = c->out_off = 0;
        }
        size_t off = 0;
        for (;;) {
            size_t room = in_room(c), k = n - off < room ? n - off : room;
            if (k) {
                if (buf_reserve(&c->in, &c->in_cap, c->in_len + k,
                                c->authed ? ST_IN_CAP : CM_HS_STORE_PROOF_BYTES))
                    break;
                memcpy(c->in + c->in_len, data + off, k);
                c->in_len += k;
                off += k;
            }
            size_t had = c->in_len;
            if (client_process(&s, c)) break;
            if (c->in_cap + c->out_cap > CT_STORE_MAX_CLIENT_BYTES) __builtin_trap();
            sent += c->out_len - c->out_off;
            c->out_off = c->out_len = 0; /* the peer read everything */
            if (!k && c->in_len == had) break;
        }
    }
    server_free_state(&s);
    return sent;
}

/* ---- client ---------------------------------------------------------------------------- */

struct ct_store {
    pthread_mutex_t mu;
    int fd; /* -1 once the stream broke (a reply out of protocol): every request fails */
    double op_timeout;
    char host[256];
    int port;
    int secret;
    int64_t ids;
};

int64_t cm_store_next_id(ct_store *s)
{
    pthread_mutex_lock(&s->mu);
    int64_t id = ++s->ids;
    pthread_mutex_unlock(&s->mu);
    return id;
}

int cm_store_has_secret(const ct_store *s)
{
    return s->secret;
}

const char *cm_store_host(const ct_store *s)
{
    return s->host;
}

/* The client's half of the handshake on a fresh connection. */
static ct_status client_handshake(int fd, const cm_key *key, const char *host, int port,
                                  double deadline)
{
    const char *fn = "ct_store_connect";
    uint8_t ch[CM_HS_CHALLENGE_BYTES], ns[CM_NONCE_BYTES], pr[CM_HS_STORE_PROOF_BYTES];
    uint8_t mine[CM_MAC_BYTES], theirs[CM_MAC_BYTES];
    ct_status st = cm_net_recv_all(fd, ch, sizeof ch, deadline);
    if (st)
        return ct_error_wrap(st == CT_ETIMEDOUT ? CT_ETIMEDOUT : CT_EPEER,
                             "%s: %s:%d sent no store challenge", fn, host, port);
    if (cm_hs_parse_challenge(ch, sizeof ch, CM_HS_STORE_MAGIC, ns))
        return ct_error(CT_EPEER,
                        "%s: %s:%d is not a ctorch store of this version (bad challenge)", fn,
                        host, port);
    CT_TRY(cm_random(pr, CM_NONCE_BYTES));
    cm_mac(key, "ctorch store client v1", ns, pr, NULL, 0, pr + CM_NONCE_BYTES);
    st = cm_net_send_all(fd, pr, sizeof pr, deadline);
    if (!st) st = cm_net_recv_all(fd, theirs, sizeof theirs, deadline);
    if (st == CT_ETIMEDOUT)
        return ct_error(CT_ETIMEDOUT, "%s: store %s:%d did not finish the handshake in time", fn,
                        host, port);
    if (st)
        return ct_error(CT_EPEER,
                        "%s: store %s:%d refused this connection: the job secret does not match "
                        "(CT_JOB_SECRET %s)",
                        fn, host, port, key->set ? "differs from the store's" : "is not set");
    cm_mac(key, "ctorch store server v1", ns, pr, NULL, 0, mine);
    if (!cm_mac_equal(mine, theirs)) {
        ct_log(CT_LOG_WARN, "comm",
               "{\"event\":\"auth_failed\",\"where\":\"store client\",\"peer\":\"%s:%d\","
               "\"msg\":\"the store did not prove the job secret: dropped\"}",
               host, port);
        return ct_error(CT_EPEER, "%s: %s:%d did not prove the job secret (not this job's store)",
                        fn, host, port);
    }
    return CT_OK;
}

ct_status ct_store_connect(const char *host, int port, double timeout_s, ct_store **out)
{
    return ct_store_connect_opts(host, port, timeout_s, NULL, out);
}

ct_status ct_store_connect_opts(const char *host, int port, double timeout_s,
                                const ct_store_options *opt, ct_store **out)
{
    const char *fn = "ct_store_connect";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    *out = NULL;
    if (!host || !*host) return ct_error(CT_EINVAL, "%s: host must be a name or address", fn);
    if (port <= 0 || port > 65535)
        return ct_error(CT_EINVAL, "%s: port %d is not in [1, 65535]", fn, port);
    if (!(timeout_s > 0)) return ct_error(CT_EINVAL, "%s: timeout_s must be > 0", fn);
    ct_store_options o = opt ? *opt : ct_store_options_default();
    cm_key key;
    CT_TRY(cm_key_resolve(fn, o.secret, &key));
    if (!key.set && !cm_ip_is_loopback(host))
        return ct_error(CT_EINVAL,
                        "%s: store host '%s' is not a loopback address: a job secret is needed "
                        "(CT_JOB_SECRET or options .secret)",
                        fn, host);
    int fd;
    double deadline = cm_now() + timeout_s;
    ct_status st = cm_net_connect(host, port, deadline, &fd);
    if (st) return ct_error_wrap(st, "%s", fn);
    /* The server answers at once; give a slow one at least a few seconds. */
    double hs_deadline = deadline > cm_now() + 5 ? deadline : cm_now() + 5;
    st = client_handshake(fd, &key, host, port, hs_deadline);
    int secret = key.set;
    cm_key_wipe(&key);
    if (st) {
        close(fd);
        return st;
    }
    if (!secret) cm_warn_no_secret("store client");
    ct_store *s;
    if ((st = ct_calloc((void **)&s, sizeof *s))) {
        close(fd);
        return st;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->fd = fd;
    s->secret = secret;
    s->op_timeout = timeout_s < 30 ? 30 : timeout_s;
    snprintf(s->host, sizeof s->host, "%s", host);
    s->port = port;
    *out = s;
    return CT_OK;
}

void ct_store_free(ct_store *s)
{
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    pthread_mutex_destroy(&s->mu);
    ct_free(s);
}

ct_status cm_store_local_ip(ct_store *s, char *buf, size_t cap)
{
    return cm_net_local_ip(s->fd, buf, cap);
}

/* One request/response. `field` receives the reply's field (ct_alloc'd) when wanted. */
static ct_status request(ct_store *s, const char *fn, uint8_t cmd, const char *key, int nf,
                         const void *const *fv, const size_t *fl, uint8_t *status, void **rv,
                         size_t *rl)
{
    if (!s) return ct_error(CT_EINVAL, "%s: store must not be NULL", fn);
    size_t klen = key ? strlen(key) : 0;
    if (klen == 0 || klen > ST_MAX_KEY)
        return ct_error(CT_EINVAL, "%s: key must be 1..%d bytes, got %zu", fn, ST_MAX_KEY, klen);
    size_t body = 1 + 4 + klen;
    for (int i = 0; i < nf; i++) {
        if (fl[i] > ST_MAX_VAL)
            return ct_error(CT_EINVAL, "%s: value of %zu bytes is over the %u limit", fn, fl[i],
                            ST_MAX_VAL);
        body += 4 + fl[i];
    }
    uint8_t *req;
    CT_TRY(ct_alloc((void **)&req, 4 + body));
    uint32_t b32 = (uint32_t)body, k32 = (uint32_t)klen;
    memcpy(req, &b32, 4);
    req[4] = cmd;
    memcpy(req + 5, &k32, 4);
    memcpy(req + 9, key, klen);
    size_t off = 9 + klen;
    for (int i = 0; i < nf; i++) {
        uint32_t l = (uint32_t)fl[i];
        memcpy(req + off, &l, 4);
        if (fl[i]) memcpy(req + off + 4, fv[i], fl[i]);
        off += 4 + fl[i];
    }
    pthread_mutex_lock(&s->mu);
    if (s->fd < 0) {
        pthread_mutex_unlock(&s->mu);
        ct_free(req);
        return ct_error(CT_EIO, "%s: the connection to store %s:%d broke earlier", fn, s->host,
                        s->port);
    }
    double deadline = cm_now() + s->op_timeout;
    ct_status st = cm_net_send_all(s->fd, req, off, deadline);
    ct_free(req);
    uint8_t hdr[5];
    if (!st) st = cm_net_recv_all(s->fd, hdr, 5, deadline);
    uint32_t len = 0, flen = 0;
    if (!st) {
        memcpy(&len, hdr, 4);
        *status = hdr[4];
        /* A reply is [status] or [status][u32 n][n bytes] with n <= one value. */
        if (len == 0 || (len > 1 && (len < 5 || len - 5 > ST_MAX_VAL)) || *status > ST_FULL)
            st = ct_error(CT_EFORMAT,
                          "%s: malformed store reply (%u bytes, status %u; at most %u bytes)", fn,
                          len, (unsigned)*status, ST_MAX_VAL + 5);
        else if (len > 1)
            st = cm_net_recv_all(s->fd, &flen, 4, deadline);
        if (!st && len > 1 && flen != len - 5)
            st = ct_error(CT_EFORMAT, "%s: malformed store reply (field of %u in %u bytes)", fn,
                          flen, len);
    }
    void *val = NULL;
    if (!st && len > 1) {
        st = ct_alloc(&val, (size_t)flen + 1);
        if (!st) st = cm_net_recv_all(s->fd, val, flen, deadline);
        if (!st) ((char *)val)[flen] = 0;
    }
    if (st) { /* the stream is out of step now: nothing more can be read from it */
        close(s->fd);
        s->fd = -1;
    }
    pthread_mutex_unlock(&s->mu);
    if (st) {
        ct_free(val);
        if (st == CT_EFORMAT) return st;
        return ct_error_wrap(st == CT_ETIMEDOUT ? CT_ETIMEDOUT : CT_EIO,
                             "%s: store %s:%d did not answer", fn, s->host, s->port);
    }
    if (*status == ST_BAD) {
        ct_free(val);
        return ct_error(CT_EIO, "%s: store rejected the request", fn);
    }
    if (*status == ST_FULL) {
        ct_free(val);
        return ct_error(CT_ENOMEM,
                        "%s: key '%.64s': store %s:%d is full (it holds at most %zu keys and %zu MiB "
                        "of keys and values): nothing was written; delete keys no longer needed",
                        fn, key, s->host, s->port, ST_MAX_KEYS, ST_MAX_BYTES >> 20);
    }
    if (rv) {
        *rv = val;
        if (rl) *rl = flen;
    } else {
        ct_free(val);
    }
    return CT_OK;
}

ct_status ct_store_set(ct_store *s, const char *key, const void *value, size_t len)
{
    if (len && !value)
        return ct_error(CT_EINVAL, "ct_store_set: value must not be NULL when len > 0");
    const void *fv[1] = {value};
    size_t fl[1] = {len};
    uint8_t st;
    return request(s, "ct_store_set", ST_SET, key, 1, fv, fl, &st, NULL, NULL);
}

ct_status ct_store_check(ct_store *s, const char *key, bool *exists)
{
    if (!exists) return ct_error(CT_EINVAL, "ct_store_check: exists must not be NULL");
    uint8_t st = ST_MISSING;
    CT_TRY(request(s, "ct_store_check", ST_CHECK, key, 0, NULL, NULL, &st, NULL, NULL));
    *exists = st == ST_OK;
    return CT_OK;
}

ct_status ct_store_get(ct_store *s, const char *key, double timeout_s, void **value, size_t *len)
{
    if (!value) return ct_error(CT_EINVAL, "ct_store_get: value must not be NULL");
    *value = NULL;
    double deadline = cm_now() + (timeout_s > 0 ? timeout_s : 0);
    double backoff = 0.0005;
    for (;;) {
        uint8_t st = ST_MISSING;
        void *v = NULL;
        size_t l = 0;
        CT_TRY(request(s, "ct_store_get", ST_GET, key, 0, NULL, NULL, &st, &v, &l));
        if (st == ST_OK) {
            *value = v;
            if (len) *len = l;
            return CT_OK;
        }
        ct_free(v);
        double now = cm_now();
        if (now >= deadline)
            return ct_error(CT_ETIMEDOUT, "ct_store_get: key '%s' was not set within %.3g s", key,
                            timeout_s);
        double d = backoff < deadline - now ? backoff : deadline - now;
        struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
        nanosleep(&ts, NULL);
        if (backoff < 0.01) backoff *= 1.5;
    }
}

ct_status ct_store_add(ct_store *s, const char *key, int64_t delta, int64_t *out)
{
    const void *fv[1] = {&delta};
    size_t fl[1] = {8};
    uint8_t st;
    void *v = NULL;
    size_t l = 0;
    CT_TRY(request(s, "ct_store_add", ST_ADD, key, 1, fv, fl, &st, &v, &l));
    if (l != 8) {
        ct_free(v);
        return ct_error(CT_EFORMAT, "ct_store_add: malformed store reply");
    }
    if (out) memcpy(out, v, 8);
    ct_free(v);
    return CT_OK;
}

ct_status ct_store_compare_set(ct_store *s, const char *key, const void *expected, size_t elen,
                               const void *desired, size_t dlen, void **actual, size_t *alen)
{
    if ((elen && !expected) || (dlen && !desired))
        return ct_error(CT_EINVAL,
                        "ct_store_compare_set: expected/desired must not be NULL with a length");
    const void *fv[2] = {expected, desired};
    size_t fl[2] = {elen, dlen};
    uint8_t st;
    void *v = NULL;
    size_t l = 0;
    CT_TRY(request(s, "ct_store_compare_set", ST_CAS, key, 2, fv, fl, &st, &v, &l));
    if (actual) {
        *actual = v;
        if (alen) *alen = l;
    } else {
        ct_free(v);
    }
    return CT_OK;
}

ct_status ct_store_delete(ct_store *s, const char *key)
{
    uint8_t st;
    return request(s, "ct_store_delete", ST_DEL, key, 0, NULL, NULL, &st, NULL, NULL);
}

size_t cm_store_fuzz_reply(const uint8_t *data, size_t n)
{
    int sv[2];
    if (n > 65536 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
    size_t off = 0;
    while (off < n) {
        ssize_t w = send(sv[1], data + off, n - off, MSG_NOSIGNAL);
        if (w <= 0) break;
        off += (size_t)w;
    }
    shutdown(sv[1], SHUT_WR);
    ct_store s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.mu, NULL);
    s.fd = sv[0];
    s.op_timeout = 1;
    snprintf(s.host, sizeof s.host, "fuzz");
    uint8_t st = 0;
    void *v = NULL;
    size_t len = 0;
    if (request(&s, "fuzz", ST_GET, "k", 0, NULL, NULL, &st, &v, &len) == CT_OK && v) {
        if (len > ST_MAX_VAL) __builtin_trap();
        ct_free(v);
    }
    if (s.fd >= 0) close(s.fd);
    close(sv[1]);
    pthread_mutex_destroy(&s.mu);
    return len;
}
