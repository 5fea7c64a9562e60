/* Who may join a job (issue 14, items 2 and 3):
 *  - the store refuses connections that do not prove the job secret (none, wrong, or the
 *    old unauthenticated frames), and a client refuses a store that cannot prove it;
 *  - a stranger at a rank's listener (the old hello, a wrong proof, a stalled half-handshake)
 *    is dropped, the real ranks join and all_reduce returns the right sum;
 *  - ranks with different secrets never form a communicator;
 *  - without a secret only loopback addresses are allowed;
 *  - the store's limits: one value <= 16 MiB on the server too, replies queued per client
 *    bounded (pipelined GETs), unauthenticated connections closed at the handshake deadline,
 *    at most CT_STORE_MAX_CLIENTS connections, accept() failing with EMFILE does not spin,
 *    and a client does not trust a reply length beyond one value;
 *  - `ctorch launch` gives the ranks a per-job CT_JOB_SECRET in the environment (not argv). */
#include "../comm/comm_test_util.h"
#include "comm/comm_internal.h"
#include "test_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>

#define SECRET "test-secret-0123456789abcdef"
#define OTHER "other-secret-0123456789abcdef"

/* ---- log capture ------------------------------------------------------------------------ */

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_log[1 << 16];
static size_t g_log_len;

static void capture(void *user, ct_log_level level, const char *component, const char *msg)
{
    (void)user;
    (void)level;
    pthread_mutex_lock(&g_log_mu);
    int n = snprintf(g_log + g_log_len, sizeof g_log - g_log_len, "%s: %s\n", component, msg);
    if (n > 0 && g_log_len + (size_t)n < sizeof g_log) g_log_len += (size_t)n;
    pthread_mutex_unlock(&g_log_mu);
}

static int log_has(const char *what)
{
    pthread_mutex_lock(&g_log_mu);
    int r = strstr(g_log, what) != NULL;
    pthread_mutex_unlock(&g_log_mu);
    return r;
}

static void log_clear(void)
{
    pthread_mutex_lock(&g_log_mu);
    g_log_len = 0;
    g_log[0] = 0;
    pthread_mutex_unlock(&g_log_mu);
}

/* ---- raw sockets -------------------------------------------------------------------------- */

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Read exactly n bytes within s seconds; returns bytes read (< n on close or time-out). */
static size_t read_n(int fd, void *buf, size_t n, double s)
{
    size_t got = 0;
    double end = ct_now() + s;
    while (got < n) {
        struct pollfd p = {fd, POLLIN, 0};
        int ms = (int)((end - ct_now()) * 1000);
        if (ms <= 0 || poll(&p, 1, ms) <= 0) break;
        ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
    }
    return got;
}

/* Whether the other side closed fd within s seconds (data before the close is skipped). */
static int closed_within(int fd, double s)
{
    double end = ct_now() + s;
    char b[256];
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        int ms = (int)((end - ct_now()) * 1000);
        if (ms <= 0 || poll(&p, 1, ms) <= 0) return 0;
        ssize_t r = recv(fd, b, sizeof b, 0);
        if (r <= 0) return 1;
    }
}

/* Client half of the store handshake with a given secret ("" = none): 1 when accepted. */
static int raw_store_auth(int fd, const char *secret)
{
    uint8_t ch[CM_HS_CHALLENGE_BYTES], ns[CM_NONCE_BYTES], pr[CM_HS_STORE_PROOF_BYTES], m[32];
    if (read_n(fd, ch, sizeof ch, 5) != sizeof ch) return 0;
    if (cm_hs_parse_challenge(ch, sizeof ch, CM_HS_STORE_MAGIC, ns)) return 0;
    cm_key k;
    if (cm_key_resolve("test", secret, &k)) return 0;
    memset(pr, 7, CM_NONCE_BYTES);
    cm_mac(&k, "ctorch store client v1", ns, pr, NULL, 0, pr + CM_NONCE_BYTES);
    if (send(fd, pr, sizeof pr, MSG_NOSIGNAL) != (ssize_t)sizeof pr) return 0;
    return read_n(fd, m, sizeof m, 5) == sizeof m;
}

static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

/* A request frame [len][cmd][key field][value fields...]. Returns its length. */
static size_t frame(uint8_t *buf, uint8_t cmd, const char *key, const void *val, size_t vlen,
                    int has_val)
{
    size_t kl = strlen(key), body = 1 + 4 + kl + (has_val ? 4 + vlen : 0);
    put32(buf, (uint32_t)body);
    buf[4] = cmd;
    put32(buf + 5, (uint32_t)kl);
    memcpy(buf + 9, key, kl);
    if (has_val) {
        put32(buf + 9 + kl, (uint32_t)vlen);
        if (vlen) memcpy(buf + 13 + kl, val, vlen);
    }
    return 4 + body;
}

/* ---- the store ---------------------------------------------------------------------------- */

static ct_store_options opts(const char *secret)
{
    ct_store_options o = ct_store_options_default();
    o.secret = secret;
    return o;
}

static void test_store_auth(void)
{
    ct_store_options so = opts(SECRET), wrong = opts(OTHER), none = opts("");
    ct_store_server *srv = NULL;
    CHECK_OK(ct_store_server_start_opts("127.0.0.1", 0, &so, &srv));
    if (!srv) return;
    int port = ct_store_server_port(srv);
    ct_store *ok = NULL, *bad = NULL;
    CHECK_OK(ct_store_connect_opts("127.0.0.1", port, 5, &so, &ok));
    CHECK_OK(ct_store_set(ok, "k", "v", 1));
    log_clear();
    CHECK_STATUS(ct_store_connect_opts("127.0.0.1", port, 5, &wrong, &bad), CT_EPEER);
    CHECK(strstr(ct_last_error(), "job secret") != NULL);
    CHECK_STATUS(ct_store_connect_opts("127.0.0.1", port, 5, &none, &bad), CT_EPEER);
    CHECK(bad == NULL);
    for (int i = 0; i < 200 && !log_has("auth_failed"); i++)
        ct_sleep(0.01);
    CHECK(log_has("\"event\":\"auth_failed\""));
    cm_store_stats stt;
    cm_store_server_stats(srv, &stt);
    CHECK(stt.auth_failures == 2);

    /* The old protocol (frames straight away): nothing is stored, the connection is closed. */
    int fd = raw_connect(port);
    CHECK(fd >= 0);
    uint8_t buf[256];
    size_t n = frame(buf, 1 /* SET */, "stranger", "x", 1, 1);
    /* Padded to the proof's size, so the server reads a whole (wrong) proof at once. */
    memset(buf + n, 0, sizeof buf - n);
    CHECK(send(fd, buf, CM_HS_STORE_PROOF_BYTES, MSG_NOSIGNAL) == CM_HS_STORE_PROOF_BYTES);
    CHECK(closed_within(fd, 5));
    close(fd);
    bool ex = true;
    CHECK_OK(ct_store_check(ok, "stranger", &ex));
    CHECK(!ex);

    /* A fake store (a listener that is not this job's): the client refuses it. */
    ct_store_server *fake = NULL;
    CHECK_OK(ct_store_server_start_opts("127.0.0.1", 0, &wrong, &fake));
    CHECK_STATUS(ct_store_connect_opts("127.0.0.1", ct_store_server_port(fake), 5, &so, &bad),
                 CT_EPEER);
    ct_store_server_free(fake);

    /* Without a secret: loopback only. */
    CHECK_STATUS(ct_store_server_start_opts("0.0.0.0", 0, &none, &fake), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "secret") != NULL);
    CHECK_STATUS(ct_store_connect_opts("10.255.255.1", 1, 5, &none, &bad), CT_EINVAL);
    ct_store_server *lo = NULL;
    log_clear();
    CHECK_OK(ct_store_server_start_opts(NULL, 0, &none, &lo)); /* NULL = loopback */
    CHECK(log_has("no_job_secret"));
    ct_store *lc = NULL;
    CHECK_OK(ct_store_connect_opts("127.0.0.1", ct_store_server_port(lo), 5, &none, &lc));
    CHECK_OK(ct_store_set(lc, "a", "b", 1));
    ct_store_free(lc);
    ct_store_server_free(lo);
    /* Secrets out of bounds. */
    ct_store_options shortsec = opts("short");
    CHECK_STATUS(ct_store_server_start_opts(NULL, 0, &shortsec, &lo), CT_EINVAL);

    ct_store_free(ok);
    ct_store_server_free(srv);
}

/* Unauthenticated connections end at the handshake deadline; authenticated ones stay. */
static void test_store_handshake_deadline(void)
{
    ct_store_options so = opts(SECRET);
    so.handshake_s = 0.3;
    ct_store_server *srv = NULL;
    CHECK_OK(ct_store_server_start_opts("127.0.0.1", 0, &so, &srv));
    if (!srv) return;
    int port = ct_store_server_port(srv);
    int idle = raw_connect(port), half = raw_connect(port), good = raw_connect(port);
    CHECK(idle >= 0 && half >= 0 && good >= 0);
    CHECK(raw_store_auth(good, SECRET));
    uint8_t junk[10] = {0};
    CHECK(send(half, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk); /* trickles */
    CHECK(closed_within(idle, 10));
    CHECK(closed_within(half, 10));
    /* The authenticated one was not closed: it still answers after the deadline. */
    ct_sleep(0.5);
    uint8_t buf[64], rep[5];
    size_t n = frame(buf, 3 /* CHECK */, "k", NULL, 0, 0);
    CHECK(send(good, buf, n, MSG_NOSIGNAL) == (ssize_t)n);
    CHECK(read_n(good, rep, 5, 5) == 5 && rep[4] == 1 /* missing */);
    cm_store_stats st;
    cm_store_server_stats(srv, &st);
    CHECK(st.handshake_timeouts == 2);
    close(idle);
    close(half);
    close(good);
    ct_store_server_free(srv);
}

/* Values over the limit are refused by the server too; replies queued per client are bounded
 * (a client pipelining GETs of a big value without reading is not read further until it
 * reads), and every reply still arrives intact. */
static void test_store_limits(void)
{
    ct_store_options so = opts(SECRET);
    ct_store_server *srv = NULL;
    CHECK_OK(ct_store_server_start_opts("127.0.0.1", 0, &so, &srv));
    if (!srv) return;
    int port = ct_store_server_port(srv);
    ct_store *cl = NULL;
    CHECK_OK(ct_store_connect_opts("127.0.0.1", port, 5, &so, &cl));
    size_t big = CT_STORE_MAX_VALUE_BYTES;
    uint8_t *val = malloc(big + 64);
    for (size_t i = 0; i < big + 64; i++)
        val[i] = (uint8_t)(i * 31 + 7);
    CHECK_STATUS(ct_store_set(cl, "over", val, big + 1), CT_EINVAL);
    CHECK_OK(ct_store_set(cl, "big", val, big));

    /* A raw client sends a value one byte over the limit: closed, nothing stored. */
    int fd = raw_connect(port);
    CHECK(raw_store_auth(fd, SECRET));
    uint8_t *fr = malloc(big + 128);
    size_t n = frame(fr, 1, "over", val, big + 1, 1);
    size_t sent = 0;
    while (sent < n) {
        ssize_t w = send(fd, fr + sent, n - sent, MSG_NOSIGNAL);
        if (w <= 0) break;
        sent += (size_t)w;
    }
    CHECK(closed_within(fd, 10));
    close(fd);
    bool ex = true;
    CHECK_OK(ct_store_check(cl, "over", &ex));
    CHECK(!ex);

    /* 40 pipelined GETs of a 16 MiB value. */
    fd = raw_connect(port);
    CHECK(raw_store_auth(fd, SECRET));
    enum { NGET = 40 };
    size_t one = frame(fr, 2 /* GET */, "big", NULL, 0, 0);
    for (int i = 1; i < NGET; i++)
        memcpy(fr + (size_t)i * one, fr, one);
    CHECK(send(fd, fr, one * NGET, MSG_NOSIGNAL) == (ssize_t)(one * NGET));
    ct_sleep(0.3); /* let the server take in the requests and fill its queue */
    uint8_t *got = malloc(big + 16);
    int intact = 0;
    for (int i = 0; i < NGET; i++) {
        if (read_n(fd, got, 9 + big, 30) != 9 + big) break;
        uint32_t len, flen;
        memcpy(&len, got, 4);
        memcpy(&flen, got + 5, 4);
        intact += len == big + 5 && got[4] == 0 && flen == big && !memcmp(got + 9, val, big);
    }
    CHECK(intact == NGET);
    cm_store_stats st;
    cm_store_server_stats(srv, &st);
    printf("store: peak bytes buffered for one client %zu (limit %u)\n", st.peak_client_bytes,
           CT_STORE_MAX_CLIENT_BYTES);
    CHECK(st.peak_client_bytes <= CT_STORE_MAX_CLIENT_BYTES);
    close(fd);

    /* A frame whose length is over the largest request: closed at once. */
    fd = raw_connect(port);
    CHECK(raw_store_auth(fd, SECRET));
    uint8_t hdr[4];
    put32(hdr, 0xfffffff0u);
    CHECK(send(fd, hdr, 4, MSG_NOSIGNAL) == 4);
    CHECK(closed_within(fd, 10));
    close(fd);
    free(got);
    free(fr);
    free(val);
    ct_store_free(cl);
    ct_store_server_free(srv);
}

/* At most CT_STORE_MAX_CLIENTS connections: strangers beyond it are shed (oldest first),
 * and a real client still gets in. */
static void test_store_client_cap(void)
{
    ct_store_options so = opts(SECRET);
    ct_store_server *srv = NULL;
    CHECK_OK(ct_store_server_start_opts("127.0.0.1", 0, &so, &srv));
    if (!srv) return;
    int port = ct_store_server_port(srv);
    enum { N = CT_STORE_MAX_CLIENTS + 40 };
    static int fds[N];
    int opened = 0;
    for (int i = 0; i < N; i++) {
        fds[i] = raw_connect(port);
        opened += fds[i] >= 0;
    }
    CHECK(opened == N);
    cm_store_stats st;
    for (int i = 0; i < 500; i++) {
        cm_store_server_stats(srv, &st);
        if (st.shed >= 40) break;
        ct_sleep(0.01);
    }
    CHECK(st.clients <= CT_STORE_MAX_CLIENTS);
    CHECK(st.shed >= 40);
    ct_store *cl = NULL;
    CHECK_OK(ct_store_connect_opts("127.0.0.1", port, 5, &so, &cl));
    CHECK_OK(ct_store_set(cl, "x", "1", 1));
    ct_store_free(cl);
    for (int i = 0; i < N; i++)
        if (fds[i] >= 0) close(fds[i]);
    ct_store_server_free(srv);
}

/* accept() failing with EMFILE: the server backs off instead of spinning, and recovers. The
 * server runs in a child whose descriptor limit is all used; the parent connects. */
static void test_store_emfile(void)
{
    int up[2], down[2];
    CHECK(pipe(up) == 0 && pipe(down) == 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        ct_store_options so = opts(SECRET);
        ct_store_server *srv = NULL;
        if (ct_store_server_start_opts("127.0.0.1", 0, &so, &srv)) _exit(10);
        int port = ct_store_server_port(srv);
        struct rlimit rl, low;
        getrlimit(RLIMIT_NOFILE, &rl);
        int probe = dup(0); /* the lowest free descriptor: no new one fits under it */
        close(probe);
        low = rl;
        low.rlim_cur = (rlim_t)probe;
        setrlimit(RLIMIT_NOFILE, &low);
        if (write(up[1], &port, sizeof port) != sizeof port) _exit(15);
        char go;
        if (read(down[0], &go, 1) != 1) _exit(16); /* the parent's connections wait */
        ct_sleep(0.2);
        cm_store_stats a, b;
        cm_store_server_stats(srv, &a);
        ct_sleep(1.0);
        cm_store_server_stats(srv, &b);
        uint64_t calls = b.accept_calls - a.accept_calls;
        printf("emfile: %llu accept calls in 1 s, %llu errors\n", (unsigned long long)calls,
               (unsigned long long)b.accept_errors);
        int rc = 0;
        if (b.accept_errors == 0) rc = 11; /* the test did not provoke EMFILE */
        if (calls > 200) rc = 12;           /* spinning */
        setrlimit(RLIMIT_NOFILE, &rl);
        ct_store *cl = NULL;
        if (!rc && ct_store_connect_opts("127.0.0.1", port, 5, &so, &cl)) rc = 13;
        if (!rc && ct_store_set(cl, "x", "1", 1)) rc = 14;
        ct_store_free(cl);
        ct_store_server_free(srv);
        fflush(stdout);
        _exit(rc);
    }
    close(up[1]);
    close(down[0]);
    int port = 0, fds[16], n = 0;
    CHECK(read(up[0], &port, sizeof port) == sizeof port);
    for (int i = 0; i < 16 && port > 0; i++) {
        fds[n] = raw_connect(port);
        if (fds[n] >= 0) n++;
    }
    CHECK(n == 16);
    CHECK(write(down[1], "g", 1) == 1);
    int ws = 0;
    waitpid(pid, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws)) fprintf(stderr, "emfile child: status %d\n", ws);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    close(up[0]);
    close(down[1]);
}

/* A fake store that proves the secret, then answers with a reply length of ~4 GiB. */
typedef struct fake_srv {
    int lfd;
    const char *secret;
} fake_srv;

static void *fake_main(void *arg)
{
    fake_srv *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    uint8_t ns[CM_NONCE_BYTES], ch[CM_HS_CHALLENGE_BYTES], pr[CM_HS_STORE_PROOF_BYTES], m[32];
    memset(ns, 3, sizeof ns);
    cm_hs_write_challenge(ch, CM_HS_STORE_MAGIC, ns);
    send(fd, ch, sizeof ch, MSG_NOSIGNAL);
    if (read_n(fd, pr, sizeof pr, 5) == sizeof pr) {
        cm_key k;
        cm_key_resolve("test", f->secret, &k);
        cm_mac(&k, "ctorch store server v1", ns, pr, NULL, 0, m);
        send(fd, m, sizeof m, MSG_NOSIGNAL);
        uint8_t req[64];
        recv(fd, req, sizeof req, 0);
        uint8_t rep[9] = {0};
        put32(rep, 0xfffffff0u);
        put32(rep + 5, 0xfffffff0u - 5);
        send(fd, rep, sizeof rep, MSG_NOSIGNAL);
        closed_within(fd, 10);
    }
    close(fd);
    return NULL;
}

static void test_client_reply_cap(void)
{
    int lfd, port;
    CHECK_OK(cm_net_listen("127.0.0.1", 0, &lfd, &port));
    fake_srv f = {lfd, SECRET};
    pthread_t th;
    pthread_create(&th, NULL, fake_main, &f);
    ct_store_options so = opts(SECRET);
    ct_store *cl = NULL;
    CHECK_OK(ct_store_connect_opts("127.0.0.1", port, 5, &so, &cl));
    void *v = NULL;
    double t0 = ct_now();
    CHECK_STATUS(ct_store_get(cl, "k", 1, &v, NULL), CT_EFORMAT);
    CHECK(ct_now() - t0 < 5); /* refused at the header, not after waiting for 4 GiB */
    CHECK(v == NULL);
    /* The stream is out of step: later requests fail at once. */
    bool ex;
    CHECK_STATUS(ct_store_check(cl, "k", &ex), CT_EIO);
    ct_store_free(cl);
    pthread_join(th, NULL);
    close(lfd);
}

/* ---- rank links --------------------------------------------------------------------------- */

typedef struct rank_arg {
    int rank, size, port;
    const char *store_secret, *comm_secret;
    double timeout;
    ct_status init_st, ar_st;
    char msg[512];
    float result;
} rank_arg;

static void *rank_main(void *p)
{
    rank_arg *a = p;
    ct_store_options so = opts(a->store_secret);
    ct_store *st = NULL;
    a->init_st = ct_store_connect_opts("127.0.0.1", a->port, 10, &so, &st);
    ct_comm *c = NULL;
    if (!a->init_st) {
        ct_comm_options o = ct_comm_options_default();
        o.name = "authtest";
        o.timeout_s = a->timeout;
        o.secret = a->comm_secret;
        a->init_st = ct_comm_init(st, a->rank, a->size, &o, &c);
    }
    snprintf(a->msg, sizeof a->msg, "%s", a->init_st ? ct_last_error() : "");
    if (!a->init_st) {
        float x = (float)(a->rank + 1);
        a->ar_st = ct_comm_all_reduce(c, &x, &a->result, 1, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL);
    }
    ct_comm_free(c);
    ct_store_free(st);
    return NULL;
}

static uint64_t fnv(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Rank 0's listener port, from its address record in the store (what a port scan finds). */
static int listener_port(ct_store *st, const char *key)
{
    void *v = NULL;
    if (ct_store_get(st, key, 20, &v, NULL)) return -1;
    int port = -1;
    char *bar = strchr((char *)v, '|');
    if (bar) port = atoi(bar + 1);
    ct_free(v);
    return port;
}

static void test_stranger_at_rank(int shm)
{
    ct_store_options so = opts(SECRET);
    ct_store_server *srv = NULL;
    CHECK_OK(ct_store_server_start_opts("127.0.0.1", 0, &so, &srv));
    if (!srv) return;
    int port = ct_store_server_port(srv);
    setenv("CT_COMM_SHM", shm ? "1" : "0", 1);
    rank_arg r0 = {0, 2, port, SECRET, SECRET, 60, 0, 0, "", 0};
    rank_arg r1 = {1, 2, port, SECRET, SECRET, 60, 0, 0, "", 0};
    pthread_t t0, t1;
    log_clear();
    pthread_create(&t0, NULL, rank_main, &r0);
    ct_store *spy = NULL;
    CHECK_OK(ct_store_connect_opts("127.0.0.1", port, 5, &so, &spy));
    int lport = listener_port(spy, "ctc/authtest/1/addr/0");
    CHECK(lport > 0);
    /* Stand in for rank 1's address record (what the real rank 1 will write), so rank 0 goes
     * on to accept connections while the strangers try their luck. */
    void *rec = NULL;
    size_t rl = 0;
    CHECK_OK(ct_store_get(spy, "ctc/authtest/1/addr/0", 5, &rec, &rl));
    if (rec) CHECK_OK(ct_store_set(spy, "ctc/authtest/1/addr/1", rec, rl));
    ct_free(rec);
    /* 1: the old hello (magic, rank 1, hash of the predictable prefix), then junk. */
    int s1 = raw_connect(lport);
    CHECK(s1 >= 0);
    uint8_t old[CM_HS_HELLO_BYTES];
    memset(old, 0, sizeof old);
    uint32_t mg = 0x6374686cu, rk = 1;
    uint64_t h = fnv("ctc/authtest/1");
    memcpy(old, &mg, 4);
    memcpy(old + 4, &rk, 4);
    memcpy(old + 8, &h, 8);
    CHECK(send(s1, old, sizeof old, MSG_NOSIGNAL) == (ssize_t)sizeof old);
    /* 2: the new hello with a wrong proof. */
    int s2 = raw_connect(lport);
    uint8_t ch[CM_HS_CHALLENGE_BYTES], ns[CM_NONCE_BYTES], msg[CM_HS_HELLO_BYTES];
    CHECK(read_n(s2, ch, sizeof ch, 10) == sizeof ch);
    CHECK(cm_hs_parse_challenge(ch, sizeof ch, CM_HS_RANK_MAGIC, ns) == 0);
    cm_hello hh = {1, {0}, {0}};
    cm_key wk;
    cm_key_resolve("test", OTHER, &wk);
    uint8_t ctx[520];
    size_t cl;
    cm_hs_rank_ctx("ctc/authtest/1", 1, 0, ctx, &cl);
    cm_mac(&wk, "ctorch rank hello v1", ns, hh.nc, ctx, cl, hh.mac);
    cm_hs_write_hello(msg, &hh);
    CHECK(send(s2, msg, sizeof msg, MSG_NOSIGNAL) == (ssize_t)sizeof msg);
    /* 3: a half-handshake that stalls (and never closes). */
    int s3 = raw_connect(lport);
    CHECK(send(s3, old, 20, MSG_NOSIGNAL) == 20);
    CHECK(closed_within(s1, 10));
    CHECK(closed_within(s2, 10));
    /* Now the real rank 1 joins: rank 0 must not be held up by s3. */
    pthread_create(&t1, NULL, rank_main, &r1);
    pthread_join(t0, NULL);
    pthread_join(t1, NULL);
    CHECK(r0.init_st == CT_OK && r1.init_st == CT_OK);
    if (r0.init_st || r1.init_st) fprintf(stderr, "rank 0: %s\nrank 1: %s\n", r0.msg, r1.msg);
    CHECK(r0.ar_st == CT_OK && r1.ar_st == CT_OK);
    CHECK(r0.result == 3.0f && r1.result == 3.0f);
    CHECK(log_has("\"event\":\"auth_failed\""));
    close(s1);
    close(s2);
    close(s3);
    ct_store_free(spy);
    ct_store_server_free(srv);
    unsetenv("CT_COMM_SHM");
}

/* Ranks that hold different secrets (the store is shared) never form a communicator. */
static void test_rank_wrong_secret(void)
{
    ct_store_options so = opts(SECRET);
    ct_store_server *srv = NULL;
    CHECK_OK(ct_store_server_start_opts("127.0.0.1", 0, &so, &srv));
    if (!srv) return;
    int port = ct_store_server_port(srv);
    rank_arg r0 = {0, 2, port, SECRET, SECRET, 3, 0, 0, "", 0};
    rank_arg r1 = {1, 2, port, SECRET, OTHER, 3, 0, 0, "", 0};
    pthread_t t0, t1;
    log_clear();
    pthread_create(&t0, NULL, rank_main, &r0);
    pthread_create(&t1, NULL, rank_main, &r1);
    pthread_join(t0, NULL);
    pthread_join(t1, NULL);
    CHECK(r0.init_st == CT_ETIMEDOUT);
    CHECK(r1.init_st == CT_EPEER && strstr(r1.msg, "job secret") != NULL);
    if (r1.init_st != CT_EPEER || !strstr(r1.msg, "job secret")) fprintf(stderr, "rank 1: %s\n", r1.msg);
    CHECK(log_has("wrong proof of the job secret"));
    ct_store_server_free(srv);
}

/* Listeners bind the store's interface (loopback here), not every interface. */
/* Whether a socket listens on TCP port `port` (from /proc/net/tcp, state 0A = LISTEN), and
 * whether one of them is bound to the wildcard address. */
static int listening(int port, int *wildcard)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    int found = 0;
    *wildcard = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned a, p, st;
        if (sscanf(line, " %*d: %8X:%4X %*8X:%*4X %2X", &a, &p, &st) != 3) continue;
        if ((int)p != port || st != 0x0A) continue;
        found = 1;
        *wildcard |= a == 0;
    }
    if (f) fclose(f);
    return found;
}

/* The store rank 0 starts itself (no launcher: CT_STORE_HOSTED unset) binds MASTER_ADDR. */
static void test_env_store_bind(void)
{
    int probe = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    CHECK(probe >= 0 && bind(probe, (struct sockaddr *)&sa, sizeof sa) == 0 &&
          getsockname(probe, (struct sockaddr *)&sa, &sl) == 0);
    int port = ntohs(sa.sin_port);
    close(probe);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", ps, 1);
    unsetenv("CT_STORE_HOSTED");
    ct_comm_options o = ct_comm_options_default();
    o.timeout_s = 20;
    o.secret = SECRET;
    ct_comm *c = NULL;
    CHECK_OK(ct_comm_init_env(&o, &c));
    int wildcard = 0;
    CHECK(listening(port, &wildcard));
    CHECK(!wildcard);
    ct_comm_free(c);
    const char *vars[] = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

static void test_listener_bind(void)
{
    ct_store_options so = opts(SECRET);
    ct_store_server *srv = NULL;
    CHECK_OK(ct_store_server_start_opts("127.0.0.1", 0, &so, &srv));
    if (!srv) return;
    int port = ct_store_server_port(srv);
    rank_arg r0 = {0, 2, port, SECRET, SECRET, 30, 0, 0, "", 0};
    rank_arg r1 = {1, 2, port, SECRET, SECRET, 30, 0, 0, "", 0};
    pthread_t t0, t1;
    pthread_create(&t0, NULL, rank_main, &r0);
    ct_store *spy = NULL;
    CHECK_OK(ct_store_connect_opts("127.0.0.1", port, 5, &so, &spy));
    int lport = listener_port(spy, "ctc/authtest/1/addr/0");
    int wildcard = 0;
    CHECK(listening(lport, &wildcard));
    CHECK(!wildcard);
    pthread_create(&t1, NULL, rank_main, &r1);
    pthread_join(t0, NULL);
    pthread_join(t1, NULL);
    CHECK(r0.init_st == CT_OK && r1.init_st == CT_OK && r0.result == 3.0f);
    ct_store_free(spy);
    ct_store_server_free(srv);
}

/* ---- the launcher's secret ---------------------------------------------------------------- */

static int worker_secret(void)
{
    const char *s = getenv("CT_JOB_SECRET");
    int ok = s && strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64;
    /* Never on a command line: neither ours nor the launcher's. */
    char path[64], buf[8192];
    for (int k = 0; k < 2 && ok; k++) {
        snprintf(path, sizeof path, "/proc/%d/cmdline", k ? (int)getppid() : (int)getpid());
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        for (size_t i = 0; i < n; i++)
            if (!buf[i]) buf[i] = ' ';
        buf[n] = 0;
        if (strstr(buf, s)) ok = 0;
    }
    ct_comm *c = NULL;
    if (ct_comm_init_env(NULL, &c)) {
        fprintf(stderr, "init: %s\n", ct_last_error());
        return 1;
    }
    /* Every rank got the same secret. */
    uint8_t mine[64] = {0}, all[128];
    if (s) memcpy(mine, s, strlen(s) < 64 ? strlen(s) : 64);
    int good = ct_comm_all_gather_single(c, mine, all, 64, CT_DTYPE_U8, 0, NULL) == CT_OK &&
               !memcmp(all, all + 64, 64);
    float x = 1, y = 0;
    good &= ct_comm_all_reduce(c, &x, &y, 1, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL) == CT_OK &&
            y == 2.0f;
    ct_comm_free(c);
    printf("secret ok %d, same on every rank %d\n", ok, good);
    return ok && good ? 0 : 1;
}

static void test_launch_secret(void)
{
    const char *args[] = {"--nproc", "2", "--max-time", "60", NULL};
    static char out[1 << 14];
    CHECK(ct_run_launch(args, "secret", NULL, out, sizeof out) == 0);
    /* Two jobs get different secrets (random, not derived from anything predictable). */
    char a[65], b[65];
    CHECK_OK(ct_comm_secret_generate(a, sizeof a));
    CHECK_OK(ct_comm_secret_generate(b, sizeof b));
    CHECK(strlen(a) == 64 && strcmp(a, b) != 0);
    CHECK_STATUS(ct_comm_secret_generate(a, 10), CT_EINVAL);
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "--worker")) {
        if (!strcmp(argv[2], "secret")) return worker_secret();
        return 2;
    }
    unsetenv("CT_JOB_SECRET");
    ct_log_set_sink(capture, NULL, CT_LOG_DEBUG);
    test_store_auth();
    test_store_handshake_deadline();
    test_client_reply_cap();
    test_store_limits();
    test_store_client_cap();
    test_store_emfile();
    test_stranger_at_rank(1);
    test_stranger_at_rank(0);
    test_rank_wrong_secret();
    test_listener_bind();
    test_env_store_bind();
    test_launch_secret();
    return t_report("test_comm_auth");
}
