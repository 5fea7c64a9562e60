/* Collectives of the tcp backend, written over the transfer engine.
 *
 * Small messages (up to opt.small_bytes) take one round: every rank sends its data
 * straight to the ranks that need it, and reductions are applied in rank order
 * (((x0 op x1) op x2) ...), the order a serial loop over ranks uses. Large messages take
 * rings: reduce-scatter then all-gather for all_reduce, a pipelined chain for broadcast.
 * The ring reduces chunk c in the fixed ring order starting after rank c. Either way the
 * order depends only on the size and the world size, so every rank gets bitwise the same
 * result on every run. bf16 / f16 reductions run in f32 and round once at the end. */
#include "comm/transport.h"

#include <stdio.h>
#include <string.h>

static void eng_init(cm_eng *e, ct_comm *c, ct_work *w)
{
    memset(e, 0, sizeof *e);
    e->c = c;
    e->w = w;
    e->seq = w ? w->seq : 0;
    e->deadline = w ? w->deadline : 0;
    e->r = c->reqs;
    e->cap = c->reqs_cap;
}

static size_t amod(long long a, int P)
{
    long long m = a % P;
    return (size_t)(m < 0 ? m + P : m);
}

/* Chunks of n elements over P ranks: sizes differ by at most one. */
static ct_status chunks(size_t n, int P, size_t **cnt, size_t **off)
{
    CT_TRY(ct_alloc((void **)cnt, sizeof(size_t) * 2 * (size_t)P));
    *off = *cnt + P;
    size_t base = n / (size_t)P, rem = n % (size_t)P, o = 0;
    for (int p = 0; p < P; p++) {
        (*cnt)[p] = base + ((size_t)p < rem);
        (*off)[p] = o;
        o += (*cnt)[p];
    }
    return CT_OK;
}

/* out = x_0 op x_1 op ... op x_{P-1} in rank order; x(p) = base + p*stride except x(me). */
static void reduce_in_order(ct_comm *c, ct_dtype dt, ct_reduce_op op, uint8_t *out,
                            const uint8_t *mine, const uint8_t *base, size_t stride, size_t n)
{
    int P = c->size;
#define X(p) ((p) == c->rank ? mine : base + (size_t)(p)*stride)
    cm_reduce3(dt, op, out, X(0), X(1), n);
    for (int p = 2; p < P; p++)
        cm_reduce3(dt, op, out, out, X(p), n);
#undef X
}

/* ---- reductions --------------------------------------------------------------------------- */

static ct_status ar_direct(cm_eng *e, const uint8_t *s, uint8_t *o, size_t n, ct_dtype dt,
                           ct_reduce_op op)
{
    ct_comm *c = e->c;
    size_t b = n * ct_dtype_size(dt);
    uint8_t *sc = c->scratch;
    const uint8_t *mine = s;
    if (s == o && c->rank > 0) {
        memcpy(sc + (size_t)c->rank * b, s, b);
        mine = sc + (size_t)c->rank * b;
    }
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        cm_eng_send(e, p, s, b);
        cm_eng_recv(e, p, sc + (size_t)p * b, b);
    }
    CT_TRY(cm_eng_run(e));
    reduce_in_order(c, dt, op, o, mine, sc, b, n);
    return CT_OK;
}

/* Ring reduce-scatter: rank r ends with chunk r fully reduced in `out`. Partial chunks
 * travel through `full` (a buffer with every chunk's room, at chunk offsets) or through
 * two ping-pong buffers pp[0], pp[1] of the largest chunk. */
static ct_status ring_rs(cm_eng *e, const uint8_t *s, uint8_t *out, uint8_t *full, uint8_t **pp,
                         const size_t *cnt, const size_t *off, ct_dtype dt, ct_reduce_op op)
{
    ct_comm *c = e->c;
    int P = c->size, r = c->rank;
    size_t es = ct_dtype_size(dt);
    int right = (int)amod(r + 1, P), left = (int)amod(r - 1, P);
    for (int st = 0; st < P - 1; st++) {
        size_t sc = amod(r - st - 1, P), rc = amod(r - st - 2, P);
        const uint8_t *src = st == 0 ? s + off[sc] * es
                             : full  ? full + off[sc] * es
                                     : pp[(st - 1) & 1];
        uint8_t *dst = st == P - 2 ? out : full ? full + off[rc] * es : pp[st & 1];
        cm_eng_send(e, right, src, cnt[sc] * es);
        cm_eng_recv_reduce(e, left, dst, s + off[rc] * es, cnt[rc] * es, dt, op);
        CT_TRY(cm_eng_run(e));
    }
    return CT_OK;
}

/* Ring all-gather: rank r holds chunk r of buf; afterwards every chunk. */
static ct_status ring_ag(cm_eng *e, uint8_t *buf, const size_t *cnt, const size_t *off, size_t es)
{
    ct_comm *c = e->c;
    int P = c->size, r = c->rank;
    int right = (int)amod(r + 1, P), left = (int)amod(r - 1, P);
    for (int st = 0; st < P - 1; st++) {
        size_t sc = amod(r - st, P), rc = amod(r - st - 1, P);
        cm_eng_send(e, right, buf + off[sc] * es, cnt[sc] * es);
        cm_eng_recv(e, left, buf + off[rc] * es, cnt[rc] * es);
        CT_TRY(cm_eng_run(e));
    }
    return CT_OK;
}

static int small(ct_comm *c, size_t bytes, size_t n)
{
    return bytes <= c->opt.small_bytes || n < (size_t)c->size;
}

static ct_status all_reduce(cm_eng *e, const uint8_t *s, uint8_t *o, size_t n, ct_dtype dt,
                            ct_reduce_op op)
{
    ct_comm *c = e->c;
    size_t es = ct_dtype_size(dt);
    if (small(c, n * es, n)) return ar_direct(e, s, o, n, dt, op);
    size_t *cnt, *off;
    CT_TRY(chunks(n, c->size, &cnt, &off));
    ct_status st = ring_rs(e, s, o + off[c->rank] * es, o, NULL, cnt, off, dt, op);
    if (!st) st = ring_ag(e, o, cnt, off, es);
    ct_free(cnt);
    return st;
}

static ct_status reduce(cm_eng *e, const uint8_t *s, uint8_t *o, size_t n, ct_dtype dt,
                        ct_reduce_op op, int root)
{
    ct_comm *c = e->c;
    size_t es = ct_dtype_size(dt), b = n * es;
    int P = c->size, r = c->rank;
    if (small(c, b, n)) {
        if (r != root) {
            cm_eng_send(e, root, s, b);
            return cm_eng_run(e);
        }
        uint8_t *sc = c->scratch;
        const uint8_t *mine = s;
        if (s == o && r > 0) {
            memcpy(sc + (size_t)r * b, s, b);
            mine = sc + (size_t)r * b;
        }
        for (int p = 0; p < P; p++)
            if (p != r) cm_eng_recv(e, p, sc + (size_t)p * b, b);
        CT_TRY(cm_eng_run(e));
        reduce_in_order(c, dt, op, o, mine, sc, b, n);
        return CT_OK;
    }
    /* Ring reduce-scatter, then every chunk to the root. */
    size_t *cnt, *off;
    CT_TRY(chunks(n, P, &cnt, &off));
    size_t mx = cnt[0] * es;
    uint8_t *tmp = NULL;
    ct_status st = ct_alloc((void **)&tmp, 3 * mx);
    if (st) {
        ct_free(cnt);
        return st;
    }
    uint8_t *pp[2] = {tmp, tmp + mx};
    uint8_t *out = r == root ? o + off[r] * es : tmp + 2 * mx;
    st = ring_rs(e, s, out, NULL, pp, cnt, off, dt, op);
    if (!st) {
        if (r == root) {
            for (int p = 0; p < P; p++)
                if (p != r) cm_eng_recv(e, p, o + off[p] * es, cnt[p] * es);
        } else {
            cm_eng_send(e, root, out, cnt[r] * es);
        }
        st = cm_eng_run(e);
    }
    ct_free(tmp);
    ct_free(cnt);
    return st;
}

static ct_status reduce_scatter(cm_eng *e, const uint8_t *s, uint8_t *o, size_t n, ct_dtype dt,
                                ct_reduce_op op)
{
    ct_comm *c = e->c;
    int P = c->size, r = c->rank;
    size_t es = ct_dtype_size(dt), b = n * es;
    if (b * (size_t)P <= c->opt.small_bytes) {
        uint8_t *sc = c->scratch;
        for (int p = 0; p < P; p++) {
            if (p == r) continue;
            cm_eng_send(e, p, s + (size_t)p * b, b);
            cm_eng_recv(e, p, sc + (size_t)p * b, b);
        }
        CT_TRY(cm_eng_run(e));
        reduce_in_order(c, dt, op, o, s + (size_t)r * b, sc, b, n);
        return CT_OK;
    }
    size_t *cnt, *off;
    CT_TRY(ct_alloc((void **)&cnt, sizeof(size_t) * 2 * (size_t)P));
    off = cnt + P;
    for (int p = 0; p < P; p++) {
        cnt[p] = n;
        off[p] = (size_t)p * n;
    }
    uint8_t *tmp = NULL;
    ct_status st = ct_alloc((void **)&tmp, 2 * b);
    if (!st) {
        uint8_t *pp[2] = {tmp, tmp + b};
        st = ring_rs(e, s, o, NULL, pp, cnt, off, dt, op);
    }
    ct_free(tmp);
    ct_free(cnt);
    return st;
}

/* ---- data movement ------------------------------------------------------------------------- */

static ct_status all_gather(cm_eng *e, const uint8_t *s, uint8_t *o, size_t n, size_t es)
{
    ct_comm *c = e->c;
    int P = c->size, r = c->rank;
    size_t b = n * es;
    if (s != o + (size_t)r * b) memmove(o + (size_t)r * b, s, b);
    if (b * (size_t)P <= c->opt.small_bytes) {
        for (int p = 0; p < P; p++) {
            if (p == r) continue;
            cm_eng_send(e, p, o + (size_t)r * b, b);
            cm_eng_recv(e, p, o + (size_t)p * b, b);
        }
        return cm_eng_run(e);
    }
    size_t *cnt;
    CT_TRY(ct_alloc((void **)&cnt, sizeof(size_t) * 2 * (size_t)P));
    size_t *off = cnt + P;
    for (int p = 0; p < P; p++) {
        cnt[p] = n;
        off[p] = (size_t)p * n;
    }
    ct_status st = ring_ag(e, o, cnt, off, es);
    ct_free(cnt);
    return st;
}

static ct_status broadcast(cm_eng *e, uint8_t *buf, size_t b, int root)
{
    ct_comm *c = e->c;
    int P = c->size, r = c->rank;
    if (b <= c->opt.small_bytes) {
        if (r == root) {
            for (int p = 0; p < P; p++)
                if (p != r) cm_eng_send(e, p, buf, b);
        } else {
            cm_eng_recv(e, root, buf, b);
        }
        return cm_eng_run(e);
    }
    /* Pipelined chain root -> root+1 -> ...: each rank forwards what it has received. */
    size_t v = amod(r - root, P);
    int pred = (int)amod(r - 1, P), succ = (int)amod(r + 1, P);
    if (v == 0) {
        cm_eng_send(e, succ, buf, b);
    } else {
        cm_req *in = cm_eng_recv(e, pred, buf, b);
        if (v + 1 < (size_t)P) cm_eng_send(e, succ, buf, b)->avail = &in->done;
    }
    return cm_eng_run(e);
}

static ct_status all_to_all(cm_eng *e, const uint8_t *s, uint8_t *o, size_t b)
{
    ct_comm *c = e->c;
    int P = c->size, r = c->rank;
    memcpy(o + (size_t)r * b, s + (size_t)r * b, b);
    for (int k = 1; k < P; k++) {
        int to = (int)amod(r + k, P), from = (int)amod(r - k, P);
        cm_eng_send(e, to, s + (size_t)to * b, b);
        cm_eng_recv(e, from, o + (size_t)from * b, b);
    }
    return cm_eng_run(e);
}

static ct_status gather(cm_eng *e, const uint8_t *s, uint8_t *o, size_t b, int root)
{
    ct_comm *c = e->c;
    if (c->rank != root) {
        cm_eng_send(e, root, s, b);
        return cm_eng_run(e);
    }
    if (s != o + (size_t)root * b) memmove(o + (size_t)root * b, s, b);
    for (int p = 0; p < c->size; p++)
        if (p != root) cm_eng_recv(e, p, o + (size_t)p * b, b);
    return cm_eng_run(e);
}

static ct_status scatter(cm_eng *e, const uint8_t *s, uint8_t *o, size_t b, int root)
{
    ct_comm *c = e->c;
    if (c->rank != root) {
        cm_eng_recv(e, root, o, b);
        return cm_eng_run(e);
    }
    for (int p = 0; p < c->size; p++)
        if (p != root) cm_eng_send(e, p, s + (size_t)p * b, b);
    CT_TRY(cm_eng_run(e));
    if (o != s + (size_t)root * b) memmove(o, s + (size_t)root * b, b);
    return CT_OK;
}

/* Dissemination barrier: ceil(log2 P) rounds of one-byte tokens. */
static ct_status barrier(cm_eng *e)
{
    ct_comm *c = e->c;
    int P = c->size, r = c->rank;
    static const uint8_t token = 1;
    uint8_t got;
    for (int k = 1; k < P; k *= 2) {
        cm_eng_send(e, (int)amod(r + k, P), &token, 1);
        cm_eng_recv(e, (int)amod(r - k, P), &got, 1);
        CT_TRY(cm_eng_run(e));
    }
    return CT_OK;
}

/* ---- dispatch ------------------------------------------------------------------------------ */

static int is_reduction(cm_opkind k)
{
    return k == CM_OP_ALL_REDUCE || k == CM_OP_REDUCE || k == CM_OP_REDUCE_SCATTER;
}

static ct_status run_kind(cm_eng *e, cm_opkind kind, const uint8_t *s, uint8_t *o, size_t n,
                          ct_dtype dt, ct_reduce_op op, int root)
{
    size_t es = ct_dtype_size(dt);
    switch (kind) {
    case CM_OP_ALL_REDUCE:
        return all_reduce(e, s, o, n, dt, op);
    case CM_OP_REDUCE:
        return reduce(e, s, o, n, dt, op, root);
    case CM_OP_REDUCE_SCATTER:
        return reduce_scatter(e, s, o, n, dt, op);
    case CM_OP_ALL_GATHER:
        return all_gather(e, s, o, n, es);
    case CM_OP_BROADCAST:
        return broadcast(e, o, n * es, root);
    case CM_OP_ALL_TO_ALL:
        return all_to_all(e, s, o, n * es);
    case CM_OP_GATHER:
        return gather(e, s, o, n * es, root);
    case CM_OP_SCATTER:
        return scatter(e, s, o, n * es, root);
    case CM_OP_BARRIER:
        return barrier(e);
    default:
        return ct_error(CT_EINTERNAL, "comm: unexpected operation kind %d", (int)kind);
    }
}

/* One rank: every collective is a copy (or nothing). */
static void run_single(ct_work *w)
{
    size_t b = w->count * ct_dtype_size(w->dt);
    if (w->kind == CM_OP_BARRIER || w->kind == CM_OP_BROADCAST || !w->rbuf || w->rbuf == w->sbuf)
        return;
    memmove(w->rbuf, w->sbuf, b);
}

static ct_status convert_in(ct_dtype dt, const void *src, float *dst, size_t n)
{
    if (dt == CT_DTYPE_BF16)
        ct_convert_bf16_to_f32(dst, src, n);
    else
        ct_convert_f16_to_f32(dst, src, n);
    return CT_OK;
}

static void convert_out(ct_dtype dt, const float *src, void *dst, size_t n)
{
    if (dt == CT_DTYPE_BF16)
        ct_convert_f32_to_bf16(dst, src, n);
    else
        ct_convert_f32_to_f16(dst, src, n);
}

static ct_status fail_work(ct_comm *c, ct_work *w, cm_eng *e, ct_status st)
{
    char d[160];
    cm_describe(w, d, sizeof d);
    int state = st == CT_ETIMEDOUT    ? CT_WORK_TIMED_OUT
                : st == CT_ECANCELLED ? CT_WORK_CANCELLED
                                      : CT_WORK_ERROR;
    const char *what = e->msg[0] ? e->msg : ct_last_error();
    if (st == CT_ETIMEDOUT)
        cm_work_fail(w, state, st, "%s timed out on rank %d after %.3g s: %s", d, c->rank,
                     w->timeout_s, what);
    else
        cm_work_fail(w, state, st, "%s failed on rank %d: %s", d, c->rank, what);
    if (e->nmissing) cm_work_set_missing(w, e->missing, e->nmissing);
    return st;
}

ct_status cm_tcp_run(ct_comm *c, ct_work *w)
{
    cm_eng e;
    eng_init(&e, c, w);
    size_t n = w->count;
    if (n == 0 && w->kind != CM_OP_BARRIER) return CT_OK;
    if (c->size == 1) {
        run_single(w);
        return CT_OK;
    }
    ct_dtype dt = w->dt;
    ct_reduce_op op = w->op;
    const uint8_t *s = w->sbuf;
    uint8_t *o = w->rbuf;
    int half = is_reduction(w->kind) && (dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F16);
    int P = c->size, r = c->rank;
    float *tin = NULL, *tout = NULL;
    ct_status st = CT_OK;
    size_t nin = w->kind == CM_OP_REDUCE_SCATTER ? n * (size_t)P : n;
    if (half) {
        st = ct_alloc((void **)&tin, nin * sizeof(float));
        if (!st && w->kind == CM_OP_REDUCE_SCATTER)
            st = ct_alloc((void **)&tout, n * sizeof(float));
        if (st) {
            ct_free(tin);
            return fail_work(c, w, &e, st);
        }
        convert_in(dt, s, tin, nin);
        s = (const uint8_t *)tin;
        o = (uint8_t *)(tout ? tout : tin);
        dt = CT_DTYPE_F32;
    }
    st = run_kind(&e, w->kind, s, o, n, dt, op, w->root);
    if (!st && op == CT_REDUCE_AVG && is_reduction(w->kind) &&
        (w->kind != CM_OP_REDUCE || r == w->root))
        cm_divide(dt, o, n, P);
    if (!st && half && (w->kind != CM_OP_REDUCE || r == w->root))
        convert_out(w->dt, (float *)o, w->rbuf, n);
    ct_free(tin);
    ct_free(tout);
    if (st) return fail_work(c, w, &e, st);
    return CT_OK;
}

/* ---- point to point ---------------------------------------------------------------------- */

#define P2P_MAX 256

typedef struct p2p_batch {
    ct_work *ws[P2P_MAX];
    int n;
} p2p_batch;

static void p2p_add(cm_eng *e, ct_work *w, int idx)
{
    size_t b = w->count * ct_dtype_size(w->dt);
    cm_req *q = w->kind == CM_OP_SEND ? cm_eng_send(e, w->root, w->sbuf, b)
                                      : cm_eng_recv(e, w->root, w->rbuf, b);
    q->tag = CM_TAG_P2P | w->p2p_seq;
    q->user = idx;
}

static void p2p_done(cm_eng *e, cm_req *q)
{
    p2p_batch *b = e->ud;
    ct_work *w = b->ws[q->user];
    b->ws[q->user] = NULL;
    cm_work_end(e->c, w, CT_OK);
}

static int p2p_absorb(cm_eng *e)
{
    p2p_batch *b = e->ud;
    int before = b->n;
    if (e->n + 1 > e->cap) return 0;
    int room = e->cap - e->n < P2P_MAX - b->n ? e->cap - e->n : P2P_MAX - b->n;
    b->n = cm_absorb_p2p(e->c, b->ws, b->n, b->n + room);
    for (int i = before; i < b->n; i++) {
        p2p_add(e, b->ws[i], i);
        if (e->r[e->n - 1].complete) p2p_done(e, &e->r[e->n - 1]);
    }
    return b->n - before;
}

static double p2p_deadline(cm_eng *e)
{
    p2p_batch *b = e->ud;
    double d = 1e300;
    for (int i = 0; i < b->n; i++)
        if (b->ws[i] && b->ws[i]->deadline < d) d = b->ws[i]->deadline;
    return d;
}

ct_status cm_tcp_run_p2p(ct_comm *c, ct_work *first)
{
    p2p_batch *b;
    ct_status st = ct_alloc((void **)&b, sizeof *b);
    cm_req *reqs = NULL;
    if (!st) st = ct_alloc((void **)&reqs, sizeof(cm_req) * P2P_MAX);
    if (st) {
        ct_free(b);
        cm_work_end(c, first, st);
        return st;
    }
    cm_eng e;
    eng_init(&e, c, NULL);
    e.r = reqs;
    e.cap = P2P_MAX;
    e.ud = b;
    e.on_done = p2p_done;
    e.absorb = p2p_absorb;
    e.next_deadline = p2p_deadline;
    b->n = 1;
    b->ws[0] = first;
    p2p_add(&e, first, 0);
    if (e.r[0].complete) p2p_done(&e, &e.r[0]);
    e.deadline = p2p_deadline(&e);
    st = cm_eng_run(&e);
    if (st) {
        /* Fail every work of the batch that had not finished. */
        int told = 0;
        for (int i = 0; i < b->n; i++) {
            ct_work *w = b->ws[i];
            if (!w) continue;
            int nm = 0, miss[1] = {w->root};
            if (st == CT_ETIMEDOUT) {
                char d[160];
                cm_describe(w, d, sizeof d);
                cm_work_fail(w, CT_WORK_TIMED_OUT, st,
                             "%s timed out on rank %d after %.3g s: rank %d did not match it", d,
                             c->rank, w->timeout_s, w->root);
                nm = 1;
            } else {
                fail_work(c, w, &e, st);
                if (!e.nmissing) nm = 0;
            }
            if (nm) cm_work_set_missing(w, miss, nm);
            if (!told++) cm_comm_fail(c, w, st, st == CT_EPEER);
            cm_work_end(c, w, st);
        }
    }
    ct_free(reqs);
    ct_free(b);
    return st;
}
