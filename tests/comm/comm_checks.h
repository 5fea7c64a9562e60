/* The op-matrix checks shared by test_comm_ops (tcp backend, under ctorch launch) and
 * comm_mpi_worker (mpi backend, under mpiexec): every collective, dtype and reduction against
 * a serial reference at odd sizes, p2p, split. Needs test_util.h and comm_test_util.h. */
#ifndef CT_COMM_CHECKS_H
#define CT_COMM_CHECKS_H

#include "comm_test_util.h"

static int g_rank, g_size;
static ct_comm *g_c;

#define WCHECK(cond)                                                                               \
    do {                                                                                           \
        t_checks++;                                                                                \
        if (!(cond)) {                                                                             \
            t_failures++;                                                                          \
            if (t_failures < 20)                                                                   \
                fprintf(stderr, "%s:%d: rank %d: CHECK failed: %s (%s)\n", __FILE__, __LINE__,     \
                        g_rank, #cond, ct_last_error());                                           \
        }                                                                                          \
    } while (0)

static const ct_dtype k_dtypes[] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_F16, CT_DTYPE_BF16,
                                    CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_U8};
static const ct_reduce_op k_ops[] = {CT_REDUCE_SUM, CT_REDUCE_AVG, CT_REDUCE_MAX, CT_REDUCE_MIN,
                                     CT_REDUCE_PROD};
/* 0, 1, primes, 1000 (not divisible by 3), and one past the one-round limit (ring). */
static const size_t k_sizes[] = {0, 1, 7, 13, 1000, 1031, 40009};

static inline int is_float(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64 || dt == CT_DTYPE_F16 || dt == CT_DTYPE_BF16;
}

static inline void fill_rank(ct_dtype dt, void *buf, size_t n, int p, int seed)
{
    for (size_t i = 0; i < n; i++)
        ct_put(dt, buf, i, ct_val(p, i, seed, dt));
}

static inline void test_reductions(void)
{
    int P = g_size, me = g_rank;
    int seed = 0;
    for (size_t di = 0; di < sizeof k_dtypes / sizeof k_dtypes[0]; di++)
        for (size_t oi = 0; oi < sizeof k_ops / sizeof k_ops[0]; oi++)
            for (size_t si = 0; si < sizeof k_sizes / sizeof k_sizes[0]; si++) {
                ct_dtype dt = k_dtypes[di];
                ct_reduce_op op = k_ops[oi];
                size_t n = k_sizes[si], es = ct_dtype_size(dt);
                seed++;
                if (op == CT_REDUCE_AVG && !is_float(dt)) {
                    uint8_t x[8];
                    WCHECK(ct_comm_all_reduce(g_c, x, x, 1, dt, op, 0, NULL) == CT_EINVAL);
                    continue;
                }
                uint8_t *in = malloc(n * (size_t)P * es + 8), *out = malloc(n * (size_t)P * es + 8);
                /* all_reduce, out of place then in place */
                fill_rank(dt, in, n, me, seed);
                WCHECK(ct_comm_all_reduce(g_c, in, out, n, dt, op, 0, NULL) == CT_OK);
                int bad = 0;
                for (size_t i = 0; i < n && !bad; i++)
                    bad = ct_get(dt, out, i) != ct_ref(dt, op, P, i, seed);
                WCHECK(!bad);
                WCHECK(ct_comm_all_reduce(g_c, in, in, n, dt, op, 0, NULL) == CT_OK);
                WCHECK(!memcmp(in, out, n * es));
                /* reduce to a root that moves with the case */
                int root = seed % P;
                fill_rank(dt, in, n, me, seed);
                memset(out, 0xAB, n * es + 1);
                WCHECK(ct_comm_reduce(g_c, in, me == root ? out : NULL, n, dt, op, root, 0, NULL) ==
                       CT_OK);
                if (me == root) {
                    bad = 0;
                    for (size_t i = 0; i < n && !bad; i++)
                        bad = ct_get(dt, out, i) != ct_ref(dt, op, P, i, seed);
                    WCHECK(!bad);
                    WCHECK(out[n * es] == 0xAB);
                }
                /* reduce_scatter: rank p's input block q holds ct_val(p, q*n + i) */
                fill_rank(dt, in, n * (size_t)P, me, seed);
                WCHECK(ct_comm_reduce_scatter_single(g_c, in, out, n, dt, op, 0, NULL) == CT_OK);
                bad = 0;
                for (size_t i = 0; i < n && !bad; i++)
                    bad = ct_get(dt, out, i) != ct_ref(dt, op, P, (size_t)me * n + i, seed);
                WCHECK(!bad);
                free(in);
                free(out);
            }
}

static inline void test_movement(void)
{
    int P = g_size, me = g_rank;
    int seed = 1000;
    for (size_t di = 0; di < sizeof k_dtypes / sizeof k_dtypes[0]; di++)
        for (size_t si = 0; si < sizeof k_sizes / sizeof k_sizes[0]; si++) {
            ct_dtype dt = k_dtypes[di];
            size_t n = k_sizes[si], es = ct_dtype_size(dt), b = n * es;
            seed++;
            int root = seed % P;
            uint8_t *in = malloc(b * (size_t)P + 8), *out = malloc(b * (size_t)P + 8),
                    *ref = malloc(b + 8);
            /* broadcast */
            fill_rank(dt, out, n, me == root ? root : P + 7, seed);
            WCHECK(ct_comm_broadcast(g_c, out, n, dt, root, 0, NULL) == CT_OK);
            fill_rank(dt, ref, n, root, seed);
            WCHECK(!memcmp(out, ref, b));
            /* all_gather, out of place and in place */
            fill_rank(dt, in, n, me, seed);
            WCHECK(ct_comm_all_gather_single(g_c, in, out, n, dt, 0, NULL) == CT_OK);
            int bad = 0;
            for (int p = 0; p < P && !bad; p++) {
                fill_rank(dt, ref, n, p, seed);
                bad = memcmp(out + (size_t)p * b, ref, b) != 0;
            }
            WCHECK(!bad);
            memset(in, 0, b * (size_t)P);
            fill_rank(dt, in + (size_t)me * b, n, me, seed);
            WCHECK(ct_comm_all_gather_single(g_c, in + (size_t)me * b, in, n, dt, 0, NULL) ==
                   CT_OK);
            WCHECK(!memcmp(in, out, b * (size_t)P));
            /* all_to_all: block q of rank p's input = ct_val(p, q*n + i) */
            fill_rank(dt, in, n * (size_t)P, me, seed);
            WCHECK(ct_comm_all_to_all_single(g_c, in, out, n, dt, 0, NULL) == CT_OK);
            bad = 0;
            for (int p = 0; p < P && !bad; p++)
                for (size_t i = 0; i < n && !bad; i++)
                    bad = ct_get(dt, out, (size_t)p * n + i) !=
                          ct_round_to(dt, ct_val(p, (size_t)me * n + i, seed, dt));
            WCHECK(!bad);
            /* gather */
            fill_rank(dt, in, n, me, seed);
            WCHECK(ct_comm_gather(g_c, in, me == root ? out : NULL, n, dt, root, 0, NULL) == CT_OK);
            if (me == root) {
                bad = 0;
                for (int p = 0; p < P && !bad; p++) {
                    fill_rank(dt, ref, n, p, seed);
                    bad = memcmp(out + (size_t)p * b, ref, b) != 0;
                }
                WCHECK(!bad);
            }
            /* scatter */
            if (me == root) fill_rank(dt, in, n * (size_t)P, root, seed);
            WCHECK(ct_comm_scatter(g_c, me == root ? in : NULL, out, n, dt, root, 0, NULL) ==
                   CT_OK);
            bad = 0;
            for (size_t i = 0; i < n && !bad; i++)
                bad = ct_get(dt, out, i) !=
                      ct_round_to(dt, ct_val(root, (size_t)me * n + i, seed, dt));
            WCHECK(!bad);
            free(in);
            free(out);
            free(ref);
        }
    WCHECK(ct_comm_barrier(g_c, 0, NULL) == CT_OK);
}

static inline uint64_t fnv(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Random floats: identical bits on every rank and run; the one-round path equals the serial
 * rank-order sum exactly, the ring path is close to it. */
static inline void test_determinism(void)
{
    if (ct_comm_get_backend(g_c) != CT_COMM_TCP) return; /* MPI picks its own orders */
    int P = g_size, me = g_rank;
    size_t sizes[2] = {1000, 300007};
    for (int k = 0; k < 2; k++) {
        size_t n = sizes[k];
        float *x = malloc(n * 4 * (size_t)P), *y = malloc(n * 4), *z = malloc(n * 4);
        for (int p = 0; p < P; p++) {
            t_rng = 0x1234 + (uint64_t)p * 977;
            t_fill(x + (size_t)p * n, n, -1, 1);
        }
        const float *mine = x + (size_t)me * n;
        WCHECK(ct_comm_all_reduce(g_c, mine, y, n, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL) == CT_OK);
        WCHECK(ct_comm_all_reduce(g_c, mine, z, n, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL) == CT_OK);
        WCHECK(!memcmp(y, z, n * 4));
        uint64_t h = fnv(y, n * 4), *hs = malloc(sizeof(uint64_t) * (size_t)P);
        WCHECK(ct_comm_all_gather_single(g_c, &h, hs, 1, CT_DTYPE_I64, 0, NULL) == CT_OK);
        for (int p = 0; p < P; p++)
            WCHECK(hs[p] == h);
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            float serial = x[i];
            double exact = x[i];
            for (int p = 1; p < P; p++) {
                serial += x[(size_t)p * n + i];
                exact += x[(size_t)p * n + i];
            }
            if (k == 0 && y[i] != serial) bad++;
            if (fabs(y[i] - exact) > 1e-5) bad++;
        }
        WCHECK(bad == 0);
        free(x);
        free(y);
        free(z);
        free(hs);
    }
}

static inline void test_p2p_and_split(void)
{
    int P = g_size, me = g_rank;
    /* A message larger than the shared-memory channel, both ways at once: the queued send
     * and receive must progress together. */
    size_t n = 1u << 20;
    float *s = malloc(n * 4), *r = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        s[i] = (float)(me * 7 + (int)(i % 1000));
    ct_work *ws, *wr;
    int right = (me + 1) % P, left = (me + P - 1) % P;
    WCHECK(ct_comm_send(g_c, s, n, CT_DTYPE_F32, right, 0, &ws) == CT_OK);
    WCHECK(ct_comm_recv(g_c, r, n, CT_DTYPE_F32, left, 0, &wr) == CT_OK);
    WCHECK(ct_work_wait(ws, -1) == CT_OK && ct_work_wait(wr, -1) == CT_OK);
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++)
        bad = r[i] != (float)(left * 7 + (int)(i % 1000));
    WCHECK(!bad);
    ct_work_free(ws);
    ct_work_free(wr);
    /* several small messages in order */
    if (me == 0) {
        for (int k = 0; k < 5; k++)
            WCHECK(ct_comm_send(g_c, &k, 1, CT_DTYPE_I32, P - 1, 0, NULL) == CT_OK);
    } else if (me == P - 1) {
        for (int k = 0; k < 5; k++) {
            int v = -1;
            WCHECK(ct_comm_recv(g_c, &v, 1, CT_DTYPE_I32, 0, 0, NULL) == CT_OK && v == k);
        }
    }
    free(s);
    free(r);
    /* split: the odd ranks, in reverse order */
    int odd[4], no = 0;
    for (int p = P - 1; p >= 0; p--)
        if (p % 2) odd[no++] = p;
    ct_comm *sub = NULL;
    WCHECK(ct_comm_split(g_c, odd, no, "odd", &sub) == CT_OK);
    WCHECK((me % 2 == 1) == (sub != NULL));
    if (sub) {
        int32_t v = me, sum = 0;
        WCHECK(ct_comm_size(sub) == no && !strcmp(ct_comm_name(sub), "odd"));
        WCHECK(odd[ct_comm_rank(sub)] == me);
        WCHECK(ct_comm_all_reduce(sub, &v, &sum, 1, CT_DTYPE_I32, CT_REDUCE_SUM, 0, NULL) == CT_OK);
        int want = 0;
        for (int k = 0; k < no; k++)
            want += odd[k];
        WCHECK(sum == want);
        ct_comm_free(sub);
    }
    WCHECK(ct_comm_barrier(g_c, 0, NULL) == CT_OK);
}

#endif
