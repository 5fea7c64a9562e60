/* The rendezvous store: a key-value map served by one thread over TCP (like c10d's
 * TCPStore), and its client. Frames are [u32 length][u8 command][fields]; a field is
 * [u32 length][bytes]. The server never blocks on a client: waiting for a key is the
 * client polling GET until its deadline. */
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
enum { ST_OK = 0, ST_MISSING = 1, ST_BAD = 2 };

#define ST_MAX_KEY 1024
#define ST_MAX_VAL (16u << 20)
#define ST_MAX_FRAME (ST_MAX_VAL * 2 + ST_MAX_KEY + 64)

/* ---- server ---------------------------------------------------------------------------- */

typedef struct kv {
    char *key;
    uint8_t *val;
    size_t len;
} kv;

typedef struct client {
    int fd;
    uint8_t *in;
    size_t in_len, in_cap;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
} client;

struct ct_store_server {
    int lfd, port;
    int wake[2];
    pthread_t th;
    kv *kvs;
    size_t nkv, cap_kv;
    client *cl;
    size_t ncl, cap_cl;
};

static kv *kv_find(ct_store_server *s, const char *key, size_t klen)
{
    for (size_t i = 0; i < s->nkv; i++)
        if (strlen(s->kvs[i].key) == klen && !memcmp(s->kvs[i].key, key, klen)) return &s->kvs[i];
    return NULL;
}

static int kv_put(ct_store_server *s, const char *key, size_t klen, const uint8_t *v, size_t vlen)
{
    kv *e = kv_find(s, key, klen);
    uint8_t *nv = malloc(vlen ? vlen : 1);
    if (!nv) return -1;
    memcpy(nv, v, vlen);
    if (e) {
        free(e->val);
        e->val = nv;
        e->len = vlen;
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
    s->kvs[s->nkv++] = (kv){k, nv, vlen};
    return 0;
}

static int buf_reserve(uint8_t **b, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need)
        nc *= 2;
    uint8_t *n = realloc(*b, nc);
    if (!n) return -1;
    *b = n;
    *cap = nc;
    return 0;
}

/* Append a reply [u32 len][u8 status][optional field]. */
static int reply(client *c, uint8_t status, const void *field, size_t flen, int has_field)
{
    size_t body = 1 + (has_field ? 4 + flen : 0);
    if (buf_reserve(&c->out, &c->out_cap, c->out_len + 4 + body)) return -1;
    uint8_t *p = c->out + c->out_len;
    uint32_t b32 = (uint32_t)body;
    memcpy(p, &b32, 4);
    p[4] = status;
    if (has_field) {
        uint32_t f32 = (uint32_t)flen;
        memcpy(p + 5, &f32, 4);
        if (flen) memcpy(p + 9, field, flen);
    }
    c->out_len += 4 + body;
    return 0;
}

/* Read field i of a request body; returns 0 when it is there. */
static int field(const uint8_t *body, size_t len, int idx, const uint8_t **f, size_t *flen)
{
    size_t off = 1;
    for (int i = 0;; i++) {
        uint32_t l;
        if (off + 4 > len) return -1;
        memcpy(&l, body + off, 4);
        if (off + 4 + l > len) return -1;
        if (i == idx) {
            *f = body + off + 4;
            *flen = l;
            return 0;
        }
        off += 4 + l;
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
    case ST_SET:
        if (field(body, len, 1, &a, &al) || kv_put(s, key, kl, a, al)) return -1;
        return reply(c, ST_OK, NULL, 0, 0);
    case ST_GET:
        return e ? reply(c, ST_OK, e->val, e->len, 1) : reply(c, ST_MISSING, NULL, 0, 0);
    case ST_CHECK:
        return reply(c, e ? ST_OK : ST_MISSING, NULL, 0, 0);
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
        if (kv_put(s, key, kl, (const uint8_t *)out, (size_t)n)) return -1;
        return reply(c, ST_OK, &v, 8, 1);
    }
    case ST_CAS:
        if (field(body, len, 1, &a, &al) || field(body, len, 2, &b, &bl)) return -1;
        if ((!e && al == 0) || (e && e->len == al && !memcmp(e->val, a, al))) {
            if (kv_put(s, key, kl, b, bl)) return -1;
            e = kv_find(s, key, kl);
        }
        return e ? reply(c, ST_OK, e->val, e->len, 1) : reply(c, ST_MISSING, NULL, 0, 0);
    case ST_DEL:
        if (e) {
            free(e->key);
            free(e->val);
            *e = s->kvs[--s->nkv];
        }
        return reply(c, ST_OK, NULL, 0, 0);
    }
    return -1;
}

static void client_close(ct_store_server *s, size_t i)
{
    close(s->cl[i].fd);
    free(s->cl[i].in);
    free(s->cl[i].out);
    s->cl[i] = s->cl[--s->ncl];
}

/* Read what is there, answer complete frames; -1 closes the client. */
static int client_read(ct_store_server *s, client *c)
{
    for (;;) {
        if (buf_reserve(&c->in, &c->in_cap, c->in_len + 65536)) return -1;
        ssize_t r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
        if (r == 0) return -1;
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR) continue;
            return -1;
        }
        c->in_len += (size_t)r;
    }
    size_t off = 0;
    while (c->in_len - off >= 4) {
        uint32_t len;
        memcpy(&len, c->in + off, 4);
        if (len == 0 || len > ST_MAX_FRAME) return -1;
        if (c->in_len - off - 4 < len) break;
        if (handle(s, c, c->in + off + 4, len)) return -1;
        off += 4 + (size_t)len;
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    return 0;
}

static int client_write(client *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w =
            send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        c->out_off += (size_t)w;
    }
    c->out_off = c->out_len = 0;
    return 0;
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
        pf[0] = (struct pollfd){s->wake[0], POLLIN, 0};
        pf[1] = (struct pollfd){s->lfd, POLLIN, 0};
        for (size_t i = 0; i < s->ncl; i++)
            pf[i + 2] =
                (struct pollfd){s->cl[i].fd, (short)(POLLIN | (s->cl[i].out_len ? POLLOUT : 0)), 0};
        int pr = poll(pf, s->ncl + 2, -1);
        if (pr < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[0].revents) break;
        /* Clients first (indices stay valid: closing moves the last one into i). */
        size_t n = s->ncl;
        for (size_t i = n; i-- > 0;) {
            short ev = pf[i + 2].revents;
            if (!ev) continue;
            int bad = (ev & (POLLERR | POLLNVAL)) != 0;
            if (!bad && (ev & (POLLIN | POLLHUP))) bad = client_read(s, &s->cl[i]) != 0;
            if (!bad && s->cl[i].out_len) bad = client_write(&s->cl[i]) != 0;
            if (bad) client_close(s, i);
        }
        if (pf[1].revents & POLLIN) {
            int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0) {
                if (s->ncl == s->cap_cl) {
                    size_t nc = s->cap_cl ? s->cap_cl * 2 : 16;
                    client *ncl = realloc(s->cl, nc * sizeof *ncl);
                    if (!ncl) {
                        close(fd);
                        continue;
                    }
                    s->cl = ncl;
                    s->cap_cl = nc;
                }
                cm_net_tune(fd);
                s->cl[s->ncl++] = (client){fd, NULL, 0, 0, NULL, 0, 0, 0};
            }
        }
    }
    free(pf);
    return NULL;
}

ct_status ct_store_server_start(const char *host, int port, ct_store_server **out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_store_server_start: out must not be NULL");
    *out = NULL;
    if (port < 0 || port > 65535)
        return ct_error(CT_EINVAL, "ct_store_server_start: port %d is not in [0, 65535]", port);
    ct_store_server *s;
    CT_TRY(ct_calloc((void **)&s, sizeof *s));
    ct_status st = cm_net_listen(host, port, &s->lfd, &s->port);
    if (st) {
        ct_free(s);
        return st;
    }
    if (pipe2(s->wake, O_CLOEXEC) != 0) {
        close(s->lfd);
        ct_free(s);
        return ct_error(CT_EIO, "ct_store_server_start: pipe: %s", strerror(errno));
    }
    cm_net_nonblock(s->lfd, 1);
    if (pthread_create(&s->th, NULL, server_main, s) != 0) {
        close(s->lfd);
        close(s->wake[0]);
        close(s->wake[1]);
        ct_free(s);
        return ct_error(CT_EIO, "ct_store_server_start: cannot start the server thread");
    }
    *out = s;
    return CT_OK;
}

int ct_store_server_port(const ct_store_server *s)
{
    return s ? s->port : 0;
}

void ct_store_server_free(ct_store_server *s)
{
    if (!s) return;
    char b = 1;
    ssize_t w = write(s->wake[1], &b, 1);
    (void)w;
    pthread_join(s->th, NULL);
    while (s->ncl)
        client_close(s, s->ncl - 1);
    free(s->cl);
    for (size_t i = 0; i < s->nkv; i++) {
        free(s->kvs[i].key);
        free(s->kvs[i].val);
    }
    free(s->kvs);
    close(s->lfd);
    close(s->wake[0]);
    close(s->wake[1]);
    ct_free(s);
}

/* ---- client ---------------------------------------------------------------------------- */

struct ct_store {
    pthread_mutex_t mu;
    int fd;
    double op_timeout;
    char host[256];
    int port;
    int64_t ids;
};

int64_t cm_store_next_id(ct_store *s)
{
    pthread_mutex_lock(&s->mu);
    int64_t id = ++s->ids;
    pthread_mutex_unlock(&s->mu);
    return id;
}

ct_status ct_store_connect(const char *host, int port, double timeout_s, ct_store **out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_store_connect: out must not be NULL");
    *out = NULL;
    if (!host || !*host)
        return ct_error(CT_EINVAL, "ct_store_connect: host must be a name or address");
    if (port <= 0 || port > 65535)
        return ct_error(CT_EINVAL, "ct_store_connect: port %d is not in [1, 65535]", port);
    if (!(timeout_s > 0)) return ct_error(CT_EINVAL, "ct_store_connect: timeout_s must be > 0");
    int fd;
    ct_status st = cm_net_connect(host, port, cm_now() + timeout_s, &fd);
    if (st) return ct_error_wrap(st, "ct_store_connect");
    ct_store *s;
    if ((st = ct_calloc((void **)&s, sizeof *s))) {
        close(fd);
        return st;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->fd = fd;
    s->op_timeout = timeout_s < 30 ? 30 : timeout_s;
    snprintf(s->host, sizeof s->host, "%s", host);
    s->port = port;
    *out = s;
    return CT_OK;
}

void ct_store_free(ct_store *s)
{
    if (!s) return;
    close(s->fd);
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
    double deadline = cm_now() + s->op_timeout;
    ct_status st = cm_net_send_all(s->fd, req, off, deadline);
    ct_free(req);
    uint8_t hdr[5];
    if (!st) st = cm_net_recv_all(s->fd, hdr, 5, deadline);
    uint32_t len = 0, flen = 0;
    if (!st) {
        memcpy(&len, hdr, 4);
        *status = hdr[4];
        if (len > 1) {
            if (len < 5)
                st = ct_error(CT_EFORMAT, "%s: malformed store reply", fn);
            else
                st = cm_net_recv_all(s->fd, &flen, 4, deadline);
            if (!st && flen != len - 5) st = ct_error(CT_EFORMAT, "%s: malformed store reply", fn);
        }
    }
    void *val = NULL;
    if (!st && len > 1) {
        st = ct_alloc(&val, (size_t)flen + 1);
        if (!st) st = cm_net_recv_all(s->fd, val, flen, deadline);
        if (!st) ((char *)val)[flen] = 0;
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
