/* Private structures of the communication layer: the communicator, work items, the
 * shared-memory segment and links to peers, the transfer engine, the flight recorder. */
#ifndef CT_COMM_INTERNAL_H
#define CT_COMM_INTERNAL_H

#include "core/internal.h"
#include "ctorch/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define CM_MAX_RANKS 4096
#define CM_MSG 320 /* bytes of a failure message */

/* ---- clocks (comm_util.c) ---------------------------------------------------------- */
double cm_now(void);      /* monotonic seconds */
int64_t cm_wall_ns(void); /* realtime nanoseconds, comparable across processes */
double cm_env_double(const char *name, double dflt);
long cm_env_long(const char *name, long dflt);
/* Format a list of ranks "1, 3, 4" into buf. */
void cm_format_ranks(char *buf, size_t cap, const int *ranks, int n);

/* ---- sockets (net.c) ----------------------------------------------------------------- */
ct_status cm_net_listen(const char *host, int port, int *fd, int *bound_port);
ct_status cm_net_connect(const char *host, int port, double deadline, int *fd);
ct_status cm_net_accept(int lfd, double deadline, int *fd);
ct_status cm_net_send_all(int fd, const void *buf, size_t n, double deadline);
ct_status cm_net_recv_all(int fd, void *buf, size_t n, double deadline);
void cm_net_tune(int fd); /* TCP_NODELAY, close-on-exec */
void cm_net_nonblock(int fd, int on);
ct_status cm_net_local_ip(int fd, char *buf, size_t cap); /* this end's address of fd */
ct_status cm_net_peer_ip(int fd, char *buf, size_t cap);  /* the other end's address */

/* ---- who may join (auth.c) -------------------------------------------------------------- */
#define CM_NONCE_BYTES 32
#define CM_MAC_BYTES 32
#define CM_HS_VERSION 1u
#define CM_HS_STORE_MAGIC 0x31747363u /* "cst1": store challenge */
#define CM_HS_RANK_MAGIC 0x31727463u  /* "ctr1": rank challenge and hello */
#define CM_HS_CHALLENGE_BYTES (8 + CM_NONCE_BYTES)
#define CM_HS_HELLO_BYTES (8 + CM_NONCE_BYTES + CM_MAC_BYTES)
#define CM_HS_STORE_PROOF_BYTES (CM_NONCE_BYTES + CM_MAC_BYTES) /* client -> server */
/* An unauthenticated connection that has not proved the secret within this many seconds is
 * closed (CT_COMM_HANDSHAKE_TIMEOUT overrides). */
#define CM_HANDSHAKE_S 10.0

/* The job secret as an HMAC key; set = 0 when the job has none (loopback only). */
typedef struct cm_key {
    unsigned char k[CT_COMM_SECRET_MAX];
    size_t n;
    int set;
} cm_key;

/* secret NULL: CT_JOB_SECRET from the environment. */
ct_status cm_key_resolve(const char *fn, const char *secret, cm_key *k);
void cm_key_wipe(cm_key *k);
ct_status cm_random(void *buf, size_t n);
/* HMAC-SHA256(key, label NUL ns nc ctx). */
void cm_mac(const cm_key *k, const char *label, const uint8_t *ns, const uint8_t *nc,
            const void *ctx, size_t ctx_len, uint8_t out[CM_MAC_BYTES]);
int cm_mac_equal(const uint8_t *a, const uint8_t *b); /* constant time */

/* Rank handshake: the acceptor sends a challenge [magic][version][ns], the connector a hello
 * [magic][rank][nc][mac], the acceptor its proof [mac]. Parsers return 0 when well formed. */
typedef struct cm_hello {
    uint32_t rank;
    uint8_t nc[CM_NONCE_BYTES];
    uint8_t mac[CM_MAC_BYTES];
} cm_hello;
void cm_hs_write_challenge(uint8_t out[CM_HS_CHALLENGE_BYTES], uint32_t magic,
                           const uint8_t ns[CM_NONCE_BYTES]);
int cm_hs_parse_challenge(const uint8_t *buf, size_t n, uint32_t magic,
                          uint8_t ns[CM_NONCE_BYTES]);
void cm_hs_write_hello(uint8_t out[CM_HS_HELLO_BYTES], const cm_hello *h);
int cm_hs_parse_hello(const uint8_t *buf, size_t n, cm_hello *h);
/* MAC context of a rank link: from-rank, to-rank, the communicator's key prefix. ctx needs
 * 520 bytes. */
void cm_hs_rank_ctx(const char *prefix, uint32_t from, uint32_t to, uint8_t *ctx, size_t *len);
/* 1 when host is (or resolves only to) a 127.x address. */
int cm_ip_is_loopback(const char *host);
/* The warning of a job without a secret (through ct_log). */
void cm_warn_no_secret(const char *where);
double cm_handshake_s(void);

/* ---- store client internals (store.c) ------------------------------------------------- */
/* Our end's address of the store connection: the interface peers can reach us on. */
ct_status cm_store_local_ip(ct_store *s, char *buf, size_t cap);
/* 1, 2, ...: numbers the communicators made on this client (the same order on every rank). */
int64_t cm_store_next_id(ct_store *s);
/* Whether the store connection proved a job secret (0: a loopback job without one). */
int cm_store_has_secret(const ct_store *s);
/* The address the store client connected to. */
const char *cm_store_host(const ct_store *s);

/* Store server internals, for tests and the fuzz targets. */
typedef struct cm_store_stats {
    size_t clients;          /* connections now */
    size_t peak_client_bytes;/* most bytes one client had buffered (in + out) */
    uint64_t accept_calls;   /* accept() calls */
    uint64_t accept_errors;  /* accept() failures (EMFILE, ...) */
    uint64_t shed;           /* connections closed because the server was full */
    uint64_t auth_failures;  /* wrong or missing proofs */
    uint64_t handshake_timeouts;
} cm_store_stats;
void cm_store_server_stats(ct_store_server *s, cm_store_stats *out);
/* Feed bytes to a fresh in-memory server as one client would (authenticated: frames only,
 * else the handshake first); returns the bytes the server would send back (count only).
 * No sockets, no thread: the fuzz target of the store protocol. */
size_t cm_store_fuzz_feed(const uint8_t *data, size_t n, int authenticated);
/* Parse n bytes as a store's reply to one GET, as a client does (through a socket pair);
 * returns the value length accepted (0 if refused). */
size_t cm_store_fuzz_reply(const uint8_t *data, size_t n);

/* ---- reductions (reduce.c) ------------------------------------------------------------- */
/* acc[i] = acc[i] op in[i] for dtypes f32, f64, i32, i64, u8 (AVG acts as SUM). */
void cm_reduce(ct_dtype dt, ct_reduce_op op, void *acc, const void *in, size_t n);
/* out[i] = a[i] op b[i]; out may alias a or b. */
void cm_reduce3(ct_dtype dt, ct_reduce_op op, void *out, const void *a, const void *b, size_t n);
/* buf[i] /= size (floating dtypes). */
void cm_divide(ct_dtype dt, void *buf, size_t n, int size);
/* Index of the first NaN in a floating buffer, or -1. */
int64_t cm_find_nan(ct_dtype dt, const void *buf, size_t n);

/* ---- shared memory ---------------------------------------------------------------------- */
/* Control block of a rank, read by its peers on the same host. */
typedef struct cm_ctrl {
    _Atomic uint32_t wake;     /* futex word: bumped by peers that changed a channel of ours */
    _Atomic uint32_t sleeping; /* 1 while our executor sleeps on `wake` */
    char pad0[56];
    _Atomic uint64_t issued_seq;    /* last collective issued by the program */
    _Atomic uint64_t started_seq;   /* last collective the executor started */
    _Atomic uint64_t completed_seq; /* last collective that completed */
    _Atomic int32_t state;          /* CM_RANK_OK / CM_RANK_ABORTED / CM_RANK_FAILED */
    int32_t pid;
    int32_t culprit; /* with FAILED: the rank whose loss caused it, or -1 */
    char reason[192];
} cm_ctrl;

enum { CM_RANK_OK = 0, CM_RANK_ABORTED = 1, CM_RANK_FAILED = 2 };

/* One direction of a same-host pair: a ring of slots written by the sender, read by the
 * receiver (single producer, single consumer). Lives in the receiver's segment. */
typedef struct cm_chan {
    _Atomic uint64_t head; /* slots published (sender) */
    char pad0[56];
    _Atomic uint64_t tail; /* slots consumed (receiver) */
    char pad1[56];
} cm_chan;

typedef struct cm_slot {
    uint64_t tag, len, total, off;
    uint64_t pad[4];
} cm_slot;

/* A link to one peer. */
typedef struct cm_link {
    int peer;
    int fd;    /* socket: data for remote peers, liveness for local ones */
    int local; /* data through shared memory */
    int dead;  /* its socket closed */
    cm_chan *tx, *rx;
    cm_slot *tx_slot, *rx_slot;
    uint8_t *tx_data, *rx_data;
    cm_ctrl *pctrl; /* the peer's control block (local peers) */
    void *pmap;     /* the peer's segment */
    size_t pmap_len;
    int need_wake;
    uint8_t *stage; /* TCP receive-and-reduce staging */
} cm_link;

/* ---- work ------------------------------------------------------------------------------- */
typedef enum cm_opkind {
    CM_OP_ALL_REDUCE,
    CM_OP_BROADCAST,
    CM_OP_REDUCE,
    CM_OP_ALL_GATHER,
    CM_OP_REDUCE_SCATTER,
    CM_OP_ALL_TO_ALL,
    CM_OP_GATHER,
    CM_OP_SCATTER,
    CM_OP_SEND,
    CM_OP_RECV,
    CM_OP_BARRIER,
} cm_opkind;

const char *cm_op_name(cm_opkind k);

struct ct_work {
    ct_comm *c;
    _Atomic int refs;
    struct ct_work *next; /* queue */
    cm_opkind kind;
    const void *sbuf;
    void *rbuf;
    size_t count;
    ct_dtype dt;
    ct_reduce_op op;
    int root; /* root, or the peer of send/recv */
    uint64_t seq, p2p_seq;
    uint64_t record_id;
    double timeout_s, deadline;
    int64_t t_created, t_started, t_completed; /* wall ns */
    _Atomic int state;
    int fail_state; /* the state a failure will publish */
    ct_status status;
    char msg[CM_MSG];
    int *missing;
    int nmissing;
};

/* ---- flight recorder (flight.c) ---------------------------------------------------------- */
typedef struct cm_fr_entry {
    uint64_t record_id, seq, p2p_seq;
    cm_opkind kind;
    ct_dtype dt;
    size_t count;
    int root;
    int state;
    int64_t t_created, t_started, t_completed;
    double timeout_s;
    int nmissing;
    int missing[8];
    char error[CM_MSG];
} cm_fr_entry;

typedef struct cm_fr {
    pthread_mutex_t mu;
    cm_fr_entry *e;
    size_t cap;
    uint64_t next_id;
} cm_fr;

void cm_fr_init(cm_fr *fr, size_t cap);
void cm_fr_destroy(cm_fr *fr);
void cm_fr_record(ct_comm *c, ct_work *w); /* on creation: sets w->record_id */
void cm_fr_update(ct_comm *c, ct_work *w); /* on start and end */
/* Dump to the dump dir (if any) after a failure or abort. */
void cm_fr_auto_dump(ct_comm *c, const char *reason);
/* Structured event through ct_log: `fields` is the inside of a JSON object. */
void cm_log_event(ct_comm *c, ct_log_level lvl, const char *event, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* ---- the communicator ------------------------------------------------------------------- */
typedef struct cm_mpi cm_mpi;

/* A store (and maybe its server) owned by the communicators made from the environment and
 * their splits and shrinks; freed with the last of them. */
typedef struct cm_store_ref {
    _Atomic int refs;
    ct_store *store;
    ct_store_server *server;
} cm_store_ref;

/* How an MPI communicator is made: from MPI_COMM_WORLD, or as a subgroup of a parent. */
typedef struct cm_mpi_from {
    const struct ct_comm *parent;
    const int *ranks;
    int n;
} cm_mpi_from;

/* ---- backends ------------------------------------------------------------------------------
 * A backend is a private table of operations, chosen once when a communicator is created
 * (cm_backend_for) and kept in c->be: the lifecycle (comm.c), the executor (work.c),
 * recovery and the flight recorder call through it and never test which backend runs. */
typedef struct cm_backend_ops {
    ct_comm_backend id;
    const char *name; /* "tcp", "mpi": prefixes of store keys and events */
    /* The ranks come from the store (tcp: the caller's rank / size) or find each other
     * themselves (mpi: from MPI_COMM_WORLD, or the subgroup `from` of a split). */
    bool needs_store;
    bool can_shrink; /* ct_comm_shrink works (survivors re-form a communicator) */
    /* Connect: rank / size are the caller's (-1 / -1 from the environment for mpi). Sets
     * c->rank, c->size, c->local_rank where the backend learns them. */
    ct_status (*init)(ct_comm *c, int rank, int size, double deadline, const cm_mpi_from *from);
    /* Run one collective (the executor ends it) or a batch of p2p operations starting at
     * `first` (the backend ends each); fill w->msg / w->missing on failure. */
    ct_status (*run)(ct_comm *c, ct_work *w);
    ct_status (*run_p2p)(ct_comm *c, ct_work *first);
    /* Wake our own executor out of a blocking wait (abort); NULL: nothing to wake. */
    void (*wake)(ct_comm *c);
    /* Release what init made (also after a failed init). */
    void (*teardown)(ct_comm *c);
    /* A peer's progress as shared control blocks tell it (0: unknown); NULL: never known. */
    int (*peer_progress)(ct_comm *c, int peer, uint64_t *issued, uint64_t *started,
                         uint64_t *completed, int *state);
} cm_backend_ops;

extern const cm_backend_ops cm_tcp_backend; /* tcp.c */
#ifdef CT_HAVE_MPI
extern const cm_backend_ops cm_mpi_backend; /* mpi.c */
#endif
/* The table of a backend built into this library; NULL for another value. */
const cm_backend_ops *cm_backend_for(ct_comm_backend b);

struct ct_comm {
    int rank, size, local_rank;
    ct_comm_backend backend;
    const cm_backend_ops *be; /* the backend's table, chosen at creation */
    ct_comm_options opt;
    char name[96];
    char dump_dir[512];
    char prefix[512]; /* store key prefix */
    cm_key key;       /* the job secret every rank link proves */
    char secret[CT_COMM_SECRET_MAX + 1];
    ct_store *store;
    struct cm_store_ref *sref; /* shared ownership of a store made by ct_comm_init_env */
    int children;              /* split / shrink counter (identical on all ranks) */

    /* tcp backend */
    cm_link *links; /* size entries; links[rank] unused */
    cm_ctrl *ctrl;  /* ours: in our segment, or private memory without one */
    void *seg;
    size_t seg_len;
    int shm_nslots;
    size_t shm_slot;
    void *scratch; /* small_bytes * size bytes for one-round algorithms */
    size_t scratch_len;
    double spin_s, yield_s; /* waiting: spin, then sched_yield, then sleep (see cm_eng_run) */
    void *reqs; /* cm_req[reqs_cap] for collectives */
    int reqs_cap;

    /* the queue of operations and its executor */
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* works ended / executor released: waiters */
    pthread_cond_t bg_cv; /* work for the progress thread */
    ct_work *qhead, *qtail;
    int executing; /* a thread runs operations */
    int stop;
    int bg_started;
    pthread_t bg;
    uint64_t next_seq;
    uint64_t *send_seq, *recv_seq; /* p2p counters per peer */
    _Atomic int aborted;
    _Atomic int failed;
    char fail_msg[CM_MSG];
    _Atomic uint64_t last_enqueued, last_started, last_completed;

    cm_fr fr;
    cm_mpi *mpi;
};

/* Run a collective or a batch of p2p operations (the backend's job); returns its status
 * and fills w->msg / w->missing on failure. */
ct_status cm_tcp_run(ct_comm *c, ct_work *w);
ct_status cm_tcp_run_p2p(ct_comm *c, ct_work *first);
ct_status cm_tcp_setup(ct_comm *c, double deadline);
void cm_tcp_teardown(ct_comm *c);
/* Liveness of peers: CT_OK, or CT_EPEER with a message naming the rank (in *dead). */
ct_status cm_tcp_check_peers(ct_comm *c, int *dead, char *msg, size_t cap);
/* Wake our own executor (abort). */
void cm_tcp_wake_self(ct_comm *c);
/* Peer progress as the shm control blocks tell it: returns 0 when unknown (remote). */
int cm_tcp_peer_progress(ct_comm *c, int peer, uint64_t *issued, uint64_t *started,
                         uint64_t *completed, int *state);

/* MPI backend (mpi.c, with CT_HAVE_MPI; its table is cm_mpi_backend). */
ct_status cm_mpi_init(ct_comm *c, int want_rank, int want_size, const cm_mpi_from *from);
ct_status cm_mpi_run(ct_comm *c, ct_work *w);
ct_status cm_mpi_run_p2p(ct_comm *c, ct_work *first);
void cm_mpi_free(ct_comm *c);

/* Fail a work: set state, status and message (printf style). */
ct_status cm_work_fail(ct_work *w, int state, ct_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
void cm_work_set_missing(ct_work *w, const int *ranks, int n);
/* End a work with status st (state derived from it), wake its waiters, record it. */
void cm_work_end(ct_comm *c, ct_work *w, ct_status st);
void cm_comm_fail(ct_comm *c, ct_work *w, ct_status st, int tell_peers);
/* Pull the p2p works queued right behind a running batch (executor only). */
int cm_absorb_p2p(ct_comm *c, ct_work **ws, int have, int cap);
/* "all_reduce seq 5 (1024 x f32)": for messages. */
void cm_describe(const ct_work *w, char *buf, size_t cap);

/* The queue and its executor (work.c), shared with comm.c and collectives.c. */
static inline int cm_is_p2p(cm_opkind k)
{
    return k == CM_OP_SEND || k == CM_OP_RECV;
}
static inline int cm_work_terminal(int state)
{
    return state >= CT_WORK_COMPLETED;
}
/* Drop one reference of a work (the caller's or the queue's). */
void cm_work_release(ct_work *w);
/* With c->mu held: end w with status st (state derived from it), unlink it, wake waiters. */
void cm_work_end_locked(ct_comm *c, ct_work *w, ct_status st);
/* With c->mu held: end every queued work that has not started. */
void cm_cancel_queued_locked(ct_comm *c);
/* Run queued works in order until `target` has ended (or the queue is empty for NULL).
 * Called and returns with c->mu held and c->executing set by the caller. */
void cm_exec_loop(ct_comm *c, ct_work *target);
/* The progress thread's body (arg: the ct_comm). */
void *cm_bg_main(void *arg);
/* With c->mu held, after a waiting thread stops executing: hand the rest to the thread. */
void cm_release_executor(ct_comm *c);

/* Shared construction used by init, split and shrink. */
ct_status cm_comm_create(ct_store *store, int rank, int size, const ct_comm_options *opt,
                         const char *name, const char *prefix, double deadline,
                         const cm_mpi_from *from, ct_comm **out);
/* Share c's store ownership with child (no-op for a caller-owned store). */
void cm_store_share(const ct_comm *c, ct_comm *child);
/* Abort without the recorder dump (shrink). */
void cm_comm_abort_quiet(ct_comm *c);

#endif
