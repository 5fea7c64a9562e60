/*
 * ctorch/comm.h - communicators and collectives (torchcomms for C).
 *
 * A communicator joins `size` processes (ranks 0..size-1). It is created from a key-value
 * store (ct_comm_init) or from the environment a launcher sets (ct_comm_init_env: RANK,
 * WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT as torchrun and `ctorch launch` set
 * them; PMI_RANK / PMI_SIZE or OMPI_COMM_WORLD_RANK / _SIZE under mpiexec).
 *
 * Two backends:
 *  - CT_COMM_TCP (built in): rendezvous through a TCP store; ranks on the same host move
 *    data through shared memory (their sockets carry only liveness), ranks on other hosts
 *    through TCP. Small messages use one-round direct exchanges, large ones rings. Every
 *    reduction runs in a fixed order, so every rank gets bitwise the same result on every
 *    run. bf16 and f16 are reduced in f32 and rounded once at the end.
 *  - CT_COMM_MPI (when built with MPI): non-blocking MPI collectives polled against the
 *    deadline. Timeouts and abort work; shrink does not (MPI has no portable recovery).
 *
 * Every operation is asynchronous: pass a `ct_work **` to get a handle (ct_work_test,
 * ct_work_wait), or NULL to block until it ends. Operations on one communicator run one at
 * a time, in the order they were issued, on a background thread (or on the thread waiting
 * for them). Every rank must issue the collectives of a communicator in the same order.
 * Buffers must stay valid, and must not be written, until the operation has ended.
 *
 * Faults: an operation never outlives its deadline (issue time + timeout). It ends
 * CT_WORK_TIMED_OUT (status CT_ETIMEDOUT) naming the ranks that had not arrived, or
 * CT_WORK_ERROR (CT_EPEER) naming a peer that died or aborted, or CT_WORK_CANCELLED
 * (CT_ECANCELLED) after ct_comm_abort. After any failure the communicator accepts no new
 * work; ct_comm_shrink builds a working communicator of the survivors.
 *
 * Observability: a flight recorder keeps the last N operations of each communicator
 * (sequence number, op, dtype, count, peers, state, times, timeout) and writes them as JSON,
 * one file per rank, on timeout, error or abort (when a dump directory is set) or on
 * demand. Communicator events go to the library's log sink (ct_log_set_sink, component
 * "comm") as one JSON object per message; the library itself never prints.
 *
 *     ct_comm *c;
 *     ct_comm_options o = ct_comm_options_default();
 *     if (ct_comm_init_env(&o, &c) != CT_OK) { fputs(ct_last_error(), stderr); return 1; }
 *     ct_work *w;
 *     ct_comm_all_reduce(c, grad, grad, n, CT_DTYPE_F32, CT_REDUCE_AVG, 0, &w);
 *     ... compute ...
 *     if (ct_work_wait(w, -1) != CT_OK) ...;   // ct_last_error() says who failed
 *     ct_work_free(w);
 *     ct_comm_free(c);
 */
#ifndef CTORCH_COMM_H
#define CTORCH_COMM_H

#include "ctorch/core.h"
#include "ctorch/tensor.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ==== key-value store (the rendezvous point) ======================================== */

typedef struct ct_store ct_store;               /**< a client connection to a store */
typedef struct ct_store_server ct_store_server; /**< a store served by a thread of this process */

/* Limits of the store protocol, the same on both sides (docs/comm.md, "Limits"). */
#define CT_STORE_MAX_KEY_BYTES 1024u              /**< a key: 1..1024 bytes */
#define CT_STORE_MAX_VALUE_BYTES (16u << 20)      /**< one value (and one reply) */
#define CT_STORE_MAX_CLIENT_BYTES (64u << 20)     /**< buffered by the server per client */
#define CT_STORE_MAX_CLIENTS 1024                 /**< connections a server holds */
/* Length of a job secret (CT_JOB_SECRET or .secret), in bytes. */
#define CT_COMM_SECRET_MIN 16
#define CT_COMM_SECRET_MAX 1024

/** Who may use a store. Every connection proves the job secret by HMAC-SHA256
 *  challenge-response (the secret never crosses the wire); without a secret only loopback
 *  addresses are allowed (with a warning through ct_log). */
typedef struct ct_store_options {
    const char *secret;  /**< the job secret; NULL = CT_JOB_SECRET from the environment */
    double handshake_s;  /**< server: an unauthenticated connection that has not proved the
                              secret in this many seconds is closed (default 10,
                              CT_COMM_HANDSHAKE_TIMEOUT); authenticated ones never time out */
} ct_store_options;

/** Defaults: secret NULL (the environment's), handshake_s from CT_COMM_HANDSHAKE_TIMEOUT. */
CT_API ct_store_options ct_store_options_default(void);

/** Serve a store on host:port from a background thread of this process, with the default
 *  options (the job secret from CT_JOB_SECRET). host NULL means loopback (127.0.0.1); an
 *  address that is not loopback ("0.0.0.0" for all interfaces) needs a secret. port 0 picks
 *  a free port (read it with ct_store_server_port). Fails with CT_EIO when the address
 *  cannot be bound, CT_EINVAL for a non-loopback address without a secret. */
CT_API ct_status ct_store_server_start(const char *host, int port, ct_store_server **out);
/** ct_store_server_start with options (opt NULL = defaults). */
CT_API ct_status ct_store_server_start_opts(const char *host, int port,
                                            const ct_store_options *opt, ct_store_server **out);
/** The TCP port the server listens on. */
CT_API int ct_store_server_port(const ct_store_server *s);
/** Stop the server thread, close its connections and free it. NULL is a no-op. */
CT_API void ct_store_server_free(ct_store_server *s);

/** Connect to a store at host:port, retrying until timeout_s seconds have passed (the
 *  server may start later), and prove the job secret (CT_JOB_SECRET). CT_ETIMEDOUT if it
 *  never answered, CT_EPEER if the server refused our proof or could not prove its own,
 *  CT_EINVAL for a host that is not loopback without a secret. */
CT_API ct_status ct_store_connect(const char *host, int port, double timeout_s, ct_store **out);
/** ct_store_connect with options (opt NULL = defaults). */
CT_API ct_status ct_store_connect_opts(const char *host, int port, double timeout_s,
                                       const ct_store_options *opt, ct_store **out);
/** Write a fresh random job secret (64 hex digits and a NUL) into buf (cap >= 65), as
 *  `ctorch launch` does for CT_JOB_SECRET. */
CT_API ct_status ct_comm_secret_generate(char *buf, size_t cap);
/** Close the connection and free the client. NULL is a no-op. */
CT_API void ct_store_free(ct_store *s);
/** Set key (a NUL-terminated string of 1..1024 bytes) to len bytes of value (len <= 16 MiB). */
CT_API ct_status ct_store_set(ct_store *s, const char *key, const void *value, size_t len);
/** Wait up to timeout_s seconds for key to exist, then return a copy of its value in
 *  *value (allocated with ct_alloc, NUL-terminated after len bytes; free with ct_free) and
 *  its length in *len (len may be NULL). CT_ETIMEDOUT if the key never appeared. */
CT_API ct_status ct_store_get(ct_store *s, const char *key, double timeout_s, void **value,
                              size_t *len);
/** *exists = whether key is set now (never waits). */
CT_API ct_status ct_store_check(ct_store *s, const char *key, bool *exists);
/** Atomically add delta to the integer stored at key (a missing key counts as 0) and
 *  return the new value in *out (out may be NULL). */
CT_API ct_status ct_store_add(ct_store *s, const char *key, int64_t delta, int64_t *out);
/** Atomically: if key holds `expected` (or is missing and elen == 0), set it to `desired`.
 *  Either way *actual (ct_alloc'd, free with ct_free; may be NULL) receives the value the
 *  key holds afterwards and *alen its length. */
CT_API ct_status ct_store_compare_set(ct_store *s, const char *key, const void *expected,
                                      size_t elen, const void *desired, size_t dlen, void **actual,
                                      size_t *alen);
/** Remove key (no error if it was missing). */
CT_API ct_status ct_store_delete(ct_store *s, const char *key);

/* ==== communicator =================================================================== */

typedef struct ct_comm ct_comm;
typedef struct ct_work ct_work;

/** Backends. */
typedef enum ct_comm_backend {
    CT_COMM_TCP = 0, /**< built in: shared memory on one host, TCP between hosts */
    CT_COMM_MPI = 1, /**< MPI (only when libctorch was built with MPI) */
} ct_comm_backend;

/** Reductions. AVG needs a floating dtype; integer SUM and PROD wrap around. On the tcp
 *  backend MAX and MIN propagate NaN and order signed zeros (+0 > -0); the MPI backend uses
 *  MPI's own MAX / MIN. */
typedef enum ct_reduce_op {
    CT_REDUCE_SUM = 0,
    CT_REDUCE_AVG = 1,
    CT_REDUCE_MAX = 2,
    CT_REDUCE_MIN = 3,
    CT_REDUCE_PROD = 4,
} ct_reduce_op;

/** Life of an operation. */
typedef enum ct_work_state {
    CT_WORK_NOT_STARTED = 0, /**< queued behind earlier operations */
    CT_WORK_IN_PROGRESS = 1,
    CT_WORK_COMPLETED = 2,
    CT_WORK_TIMED_OUT = 3, /**< the deadline passed; ct_work_missing_ranks says who was late */
    CT_WORK_ERROR = 4,     /**< a peer died or aborted, or the exchange broke */
    CT_WORK_CANCELLED = 5, /**< ct_comm_abort, or an earlier operation failed */
} ct_work_state;

/** Communicator options. ct_comm_options_default() fills them from the environment:
 *  CT_COMM_BACKEND (tcp|mpi), CT_COMM_TIMEOUT (seconds, default 600),
 *  CT_COMM_FR_ENTRIES (default 1024), CT_COMM_FR_DUMP_DIR, CT_COMM_NAN_CHECK=1,
 *  CT_COMM_SHM=0 (TCP even between ranks of one host), CT_JOB_SECRET. */
typedef struct ct_comm_options {
    ct_comm_backend backend;
    const char *name;            /**< shown in logs and dumps (copied); default "default" */
    double timeout_s;            /**< default timeout of every operation and of set-up */
    int flight_recorder_entries; /**< ring size; 0 turns the recorder off */
    const char *dump_dir;        /**< flight-recorder files on failure; NULL/"" = none */
    bool nan_check;              /**< reject floating inputs holding NaN (on all ranks) */
    bool use_shm;                /**< shared memory between ranks of one host */
    size_t small_bytes;          /**< messages up to this size use one-round algorithms */
    size_t slot_bytes;           /**< pipeline segment (shared-memory slot) size */
    const char *secret; /**< job secret every rank connection proves (HMAC-SHA256
                             challenge-response; copied). NULL (the default) = CT_JOB_SECRET
                             from the environment; "" = none, allowed only when every
                             address is loopback (with a warning through ct_log) */
} ct_comm_options;

/** Defaults, read from the environment as described at ct_comm_options. */
CT_API ct_comm_options ct_comm_options_default(void);

/** Create the communicator of `rank` among `size` ranks that all call this with the same
 *  store and options name. Blocks until every rank has arrived and connected, at most
 *  opt->timeout_s (CT_ETIMEDOUT naming the ranks that did not register). The store must
 *  stay alive until the last communicator made from it (splits, shrinks) is freed.
 *  Communicators are numbered per store client in creation order, so each rank must create
 *  them in the same order; communicators made on different clients of one store server need
 *  different names. opt NULL = defaults. The MPI backend ignores the store and takes rank
 *  and size from MPI (they must agree). */
CT_API ct_status ct_comm_init(ct_store *store, int rank, int size, const ct_comm_options *opt,
                              ct_comm **out);
/** Create the world communicator from the environment. TCP: RANK and WORLD_SIZE (else
 *  PMI_RANK / PMI_SIZE, OMPI_COMM_WORLD_RANK / _SIZE), MASTER_ADDR (default 127.0.0.1),
 *  MASTER_PORT. Rank 0 serves the store on MASTER_ADDR unless CT_STORE_HOSTED=1 (set by
 *  `ctorch launch`, which serves it itself) or TORCHELASTIC_USE_AGENT_STORE=True. The job
 *  secret is opt->secret or CT_JOB_SECRET (needed unless every address is loopback); rank
 *  listeners bind the local address that reaches the store. MPI: initialises MPI
 *  (MPI_THREAD_MULTIPLE) unless the program did, and duplicates MPI_COMM_WORLD. */
CT_API ct_status ct_comm_init_env(const ct_comm_options *opt, ct_comm **out);

/** This process's rank (0..size-1). */
CT_API int ct_comm_rank(const ct_comm *c);
/** Number of ranks. */
CT_API int ct_comm_size(const ct_comm *c);
/** LOCAL_RANK from the environment for ct_comm_init_env, else the index among the ranks of
 *  this host. */
CT_API int ct_comm_local_rank(const ct_comm *c);
/** The name given at creation (never NULL). */
CT_API const char *ct_comm_name(const ct_comm *c);
/** The backend in use. */
CT_API ct_comm_backend ct_comm_get_backend(const ct_comm *c);
/** True once an operation failed, timed out or the communicator was aborted: no new work
 *  is accepted (ct_comm_shrink or a fresh communicator is the way on). */
CT_API bool ct_comm_failed(const ct_comm *c);

/** Subgroup: every rank of c calls this with the same list of distinct ranks (in the order
 *  they take in the new communicator). Members get the new communicator in *out, the others
 *  get *out = NULL and CT_OK. name NULL = "<parent name>.split<k>". Uses c's options. */
CT_API ct_status ct_comm_split(ct_comm *c, const int *ranks, int nranks, const char *name,
                               ct_comm **out);

/** Abort: cancel the running and queued operations of c (they end CT_WORK_CANCELLED),
 *  tell peers on this host (their operations with this rank end with CT_WORK_ERROR), and
 *  write the flight recorder if a dump directory is set. Non-blocking (it waits for no
 *  peer and no operation) and safe to call from any thread, e.g. a watchdog; not from a
 *  signal handler. Calling it again is a no-op. c stays valid until ct_comm_free. */
CT_API void ct_comm_abort(ct_comm *c);

/** After a failure: the survivors agree through the store on who is alive (ranks whose
 *  connection closed are out; ranks that do not join within timeout_s are dropped) and
 *  build a new communicator of them, keeping their order. Every survivor calls this.
 *  timeout_s <= 0 uses c's timeout; the whole agreement and set-up fit in it. A rank left
 *  out gets CT_EPEER. c is aborted (if not already) and must still be freed. TCP backend. */
CT_API ct_status ct_comm_shrink(ct_comm *c, double timeout_s, ct_comm **out);

/** Wait for the outstanding operations to end (each by its deadline at the latest), then
 *  close connections and free. NULL is a no-op. */
CT_API void ct_comm_free(ct_comm *c);

/* ---- collectives and point-to-point --------------------------------------------------
 * Common parameters: `timeout_s` <= 0 uses the communicator's timeout; `work` NULL blocks
 * until the operation ends and returns its status, otherwise *work receives a handle and
 * the call returns CT_OK once the operation is queued. Argument errors return CT_EINVAL at
 * once (no handle). sendbuf == recvbuf (in place) is allowed where noted. Counts are in
 * elements of dtype dt: f32, f64, f16, bf16, i32, i64 or u8. */

/** recvbuf[i] = op over ranks of sendbuf[i], count elements; in place allowed. */
CT_API ct_status ct_comm_all_reduce(ct_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                    ct_dtype dt, ct_reduce_op op, double timeout_s, ct_work **work);
/** Root's buf (count elements) is copied to every rank's buf. */
CT_API ct_status ct_comm_broadcast(ct_comm *c, void *buf, size_t count, ct_dtype dt, int root,
                                   double timeout_s, ct_work **work);
/** recvbuf on root = op over ranks of sendbuf; recvbuf is ignored (may be NULL) elsewhere. */
CT_API ct_status ct_comm_reduce(ct_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                ct_dtype dt, ct_reduce_op op, int root, double timeout_s,
                                ct_work **work);
/** recvbuf (size*count) = the sendbufs (count each) of ranks 0..size-1, concatenated. */
CT_API ct_status ct_comm_all_gather_single(ct_comm *c, const void *sendbuf, void *recvbuf,
                                           size_t count, ct_dtype dt, double timeout_s,
                                           ct_work **work);
/** recvbuf (count) = op over ranks of block `rank` of their sendbuf (size*count). */
CT_API ct_status ct_comm_reduce_scatter_single(ct_comm *c, const void *sendbuf, void *recvbuf,
                                               size_t count, ct_dtype dt, ct_reduce_op op,
                                               double timeout_s, ct_work **work);
/** Block j of recvbuf (count elements each, size blocks) = block `rank` of rank j's sendbuf. */
CT_API ct_status ct_comm_all_to_all_single(ct_comm *c, const void *sendbuf, void *recvbuf,
                                           size_t count, ct_dtype dt, double timeout_s,
                                           ct_work **work);
/** Root's recvbuf (size*count) = every rank's sendbuf (count) in rank order; recvbuf is
 *  ignored elsewhere. */
CT_API ct_status ct_comm_gather(ct_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                ct_dtype dt, int root, double timeout_s, ct_work **work);
/** recvbuf (count) = block `rank` of root's sendbuf (size*count); sendbuf ignored elsewhere. */
CT_API ct_status ct_comm_scatter(ct_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                 ct_dtype dt, int root, double timeout_s, ct_work **work);
/** Send count elements to rank peer (matched in order by its ct_comm_recv from this rank;
 *  sizes must agree). Queued sends and receives run concurrently with each other. */
CT_API ct_status ct_comm_send(ct_comm *c, const void *buf, size_t count, ct_dtype dt, int peer,
                              double timeout_s, ct_work **work);
/** Receive count elements from rank peer. */
CT_API ct_status ct_comm_recv(ct_comm *c, void *buf, size_t count, ct_dtype dt, int peer,
                              double timeout_s, ct_work **work);
/** Return once every rank has called it. */
CT_API ct_status ct_comm_barrier(ct_comm *c, double timeout_s, ct_work **work);

/* ---- work handles ------------------------------------------------------------------- */

/** Current state (never blocks). */
CT_API ct_work_state ct_work_get_state(const ct_work *w);
/** True when the operation has ended (completed or failed); never blocks. */
CT_API bool ct_work_test(ct_work *w);
/** Wait for the operation to end and return its status (CT_OK when completed; otherwise
 *  ct_last_error() holds its message). max_wait_s < 0 waits until it ends, which is by
 *  its deadline at the latest; max_wait_s >= 0 returns CT_ETIMEDOUT after that long if it
 *  is still running (its state then stays CT_WORK_IN_PROGRESS or NOT_STARTED). */
CT_API ct_status ct_work_wait(ct_work *w, double max_wait_s);
/** Final status (CT_OK while running or when completed). */
CT_API ct_status ct_work_status(const ct_work *w);
/** Failure message ("" when none). Valid until ct_work_free. */
CT_API const char *ct_work_error(const ct_work *w);
/** Ranks that had not arrived when the operation timed out (or the dead peer for an error):
 *  writes up to cap of them to ranks (may be NULL) and returns how many there are. */
CT_API int ct_work_missing_ranks(const ct_work *w, int *ranks, int cap);
/** Sequence number of a collective in its communicator (1, 2, ...; 0 for send/recv). */
CT_API uint64_t ct_work_seq(const ct_work *w);
/** Release the handle. A running operation goes on (its buffers must stay valid until
 *  it ends). NULL is a no-op. */
CT_API void ct_work_free(ct_work *w);

/* ---- flight recorder ---------------------------------------------------------------- */

/** The recorder as a JSON document (ct_alloc'd, NUL-terminated; free with ct_free):
 *  {"version", "comm", "rank", "size", "pid", "backend", "reason", "last_enqueued_seq",
 *  "last_started_seq", "last_completed_seq", "peers": [{"rank", "last_enqueued_seq", ...}],
 *  "entries": [{"record_id", "seq", "p2p_seq", "op", "dtype", "count", "peers", "root",
 *  "state", "time_created_ns", "time_started_ns", "time_completed_ns", "timeout_ms",
 *  "missing_ranks", "error"}]}. Peer progress is known for ranks on this host. */
CT_API ct_status ct_comm_flight_recorder_json(ct_comm *c, const char *reason, char **json);
/** Write the recorder to path, or (path NULL) to <dump dir>/ctorch_fr_<name>_rank<r>.json;
 *  CT_EINVAL when path is NULL and no dump directory is set. */
CT_API ct_status ct_comm_flight_recorder_dump(ct_comm *c, const char *path);

/* ---- names ---------------------------------------------------------------------------- */

/** True when the backend is compiled in. */
CT_API bool ct_comm_backend_available(ct_comm_backend b);
/** "tcp", "mpi" ("?" otherwise). */
CT_API const char *ct_comm_backend_name(ct_comm_backend b);
/** Parse "tcp" / "mpi"; CT_EINVAL otherwise. */
CT_API ct_status ct_comm_backend_from_name(const char *name, ct_comm_backend *out);
/** "sum", "avg", "max", "min", "prod" ("?" otherwise). */
CT_API const char *ct_reduce_op_name(ct_reduce_op op);
/** "not_started", "in_progress", "completed", "timed_out", "error", "cancelled". */
CT_API const char *ct_work_state_name(ct_work_state s);

#ifdef __cplusplus
}
#endif
#endif
