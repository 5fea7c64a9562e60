/* ctorch bench comm: bus bandwidth and latency of all_reduce, all_gather_single and
 * reduce_scatter_single at 2 ranks on this host, for ctorch's tcp (or mpi) backend beside
 * MPICH's own MPI_Allreduce / MPI_Allgather / MPI_Reduce_scatter_block on the same sizes in
 * the same run, and beside this machine's memcpy bandwidth.
 *
 * Conventions of nccl-tests: `bytes` is the largest buffer of the op (all_reduce: the
 * buffer; all_gather: the output; reduce_scatter: the input), f32 elements; algbw =
 * bytes / time; busbw = algbw * 2(P-1)/P for all_reduce and * (P-1)/P for the others. Time
 * per op is the median over repeats of (a timed loop of k ops) / k, measured on rank 0
 * after a barrier. The ranks are child processes of this command (tcp: started here with a
 * store; MPI: under mpiexec). --contended starts one busy process per core (nice 0, like the
 * compute of a training job) for the duration of the measurement. */
#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef CT_HAVE_MPI
#include <mpi.h>
#endif

#define NOPS 3
static const char *const op_names[NOPS] = {"all_reduce", "all_gather_single",
                                           "reduce_scatter_single"};
static const char *const mpi_names[NOPS] = {"MPI_Allreduce", "MPI_Allgather",
                                            "MPI_Reduce_scatter_block"};

static const size_t default_sizes[] = {8, 1024, 65536, 1u << 20, 16u << 20, 64u << 20};

typedef struct worker {
    int rank, size, repeats;
    ct_comm *c; /* ctorch's communicator */
    int raw;    /* MPICH's own collectives are measured too (interleaved) */
    float *a, *b;
} worker;

static int iters_for(size_t bytes)
{
    size_t k = (32u << 20) / (bytes < (16u << 10) ? (16u << 10) : bytes);
    return k < 1 ? 1 : k > 2000 ? 2000 : (int)k;
}

static ct_status one_op(worker *w, int raw, int op, size_t bytes)
{
    size_t P = (size_t)w->size, n = bytes / 4, blk = n / P;
#ifdef CT_HAVE_MPI
    if (raw) {
        int rc = op == 0   ? MPI_Allreduce(w->a, w->b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)
                 : op == 1 ? MPI_Allgather(w->a, (int)blk, MPI_FLOAT, w->b, (int)blk, MPI_FLOAT,
                                           MPI_COMM_WORLD)
                           : MPI_Reduce_scatter_block(w->a, w->b, (int)blk, MPI_FLOAT, MPI_SUM,
                                                      MPI_COMM_WORLD);
        return rc == MPI_SUCCESS ? CT_OK : CT_EPEER;
    }
#else
    (void)raw;
#endif
    if (op == 0)
        return ct_comm_all_reduce(w->c, w->a, w->b, n, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL);
    if (op == 1) return ct_comm_all_gather_single(w->c, w->a, w->b, blk, CT_DTYPE_F32, 0, NULL);
    return ct_comm_reduce_scatter_single(w->c, w->a, w->b, blk, CT_DTYPE_F32, CT_REDUCE_SUM, 0,
                                         NULL);
}

static ct_status barrier(worker *w, int raw)
{
#ifdef CT_HAVE_MPI
    if (raw) return MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS ? CT_OK : CT_EPEER;
#endif
    return ct_comm_barrier(w->c, 0, NULL);
}

static int cmp_d(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* CPU time of this process (all its threads), seconds. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* cpu: the CPU seconds rank 0's process used per op (sorted too): 1.0 x time = a whole core
 * busy while waiting. */
static json_t *row_json(const double *t, const double *cpu, int repeats, size_t bytes, int op,
                        int P, int k)
{
    double med = t[repeats / 2], alg = (double)bytes / med * 1e-9;
    double bus = alg * (op == 0 ? 2.0 * (P - 1) / P : (double)(P - 1) / P);
    return json_pack("{s:I, s:f, s:f, s:f, s:f, s:f, s:i}", "bytes", (json_int_t)bytes, "time_us",
                     med * 1e6, "time_min_us", t[0] * 1e6, "cpu_us", cpu[repeats / 2] * 1e6,
                     "algbw_gbps", alg, "busbw_gbps", bus, "iters", k);
}

/* Rank 0 prints {"ctorch": {"<op>": [rows]}, "mpi": {...}}. With `raw`, each repeat times
 * ctorch's op and then MPICH's, so both see the same machine. */
static int run_worker(worker *w, const size_t *sizes, int nsizes)
{
    size_t maxb = 0;
    for (int i = 0; i < nsizes; i++)
        maxb = sizes[i] > maxb ? sizes[i] : maxb;
    if (ct_alloc((void **)&w->a, maxb + 64) || ct_alloc((void **)&w->b, maxb + 64))
        return cli_fail("bench comm", CT_ENOMEM);
    bench_fill(w->a, maxb / 4, (uint64_t)w->rank + 1, 1.0f);
    memset(w->b, 0, maxb);
    json_t *res[2] = {json_object(), w->raw ? json_object() : NULL};
    int P = w->size;
    ct_status st = CT_OK;
    for (int op = 0; op < NOPS && !st; op++) {
        json_t *rows[2] = {json_array(), w->raw ? json_array() : NULL};
        for (int si = 0; si < nsizes && !st; si++) {
            size_t unit = op == 0 ? 4 : 4 * (size_t)P;
            size_t bytes = sizes[si] / unit * unit;
            if (bytes == 0) bytes = unit;
            int k = iters_for(bytes);
            double t[2][64], cpu[2][64];
            for (int raw = 0; raw <= w->raw && !st; raw++)
                for (int wu = 0; wu < 3 && !st; wu++)
                    st = one_op(w, raw, op, bytes);
            for (int r = 0; r < w->repeats && !st; r++)
                for (int raw = 0; raw <= w->raw && !st; raw++) {
                    st = barrier(w, raw);
                    double t0 = bench_now(), c0 = cpu_now();
                    for (int i = 0; i < k && !st; i++)
                        st = one_op(w, raw, op, bytes);
                    t[raw][r] = (bench_now() - t0) / k;
                    cpu[raw][r] = (cpu_now() - c0) / k;
                }
            for (int raw = 0; raw <= w->raw && !st; raw++) {
                qsort(t[raw], (size_t)w->repeats, sizeof(double), cmp_d);
                qsort(cpu[raw], (size_t)w->repeats, sizeof(double), cmp_d);
                json_array_append_new(rows[raw],
                                      row_json(t[raw], cpu[raw], w->repeats, bytes, op, P, k));
            }
        }
        for (int raw = 0; raw <= w->raw; raw++)
            json_object_set_new(res[raw], op_names[op], rows[raw]);
    }
    if (!st && w->rank == 0) {
        json_t *out = json_pack("{s:O}", "ctorch", res[0]);
        if (res[1]) json_object_set(out, "mpi", res[1]);
        char *s = json_dumps(out, JSON_COMPACT | JSON_REAL_PRECISION(8));
        if (s) puts(s);
        free(s);
        json_decref(out);
        fflush(stdout);
    }
    json_decref(res[0]);
    json_decref(res[1]);
    ct_free(w->a);
    ct_free(w->b);
    return st ? cli_fail("bench comm worker", st) : 0;
}

static int parse_sizes(const char *v, size_t *sizes, int cap)
{
    int n = 0;
    const char *p = v;
    while (*p && n < cap) {
        char *end;
        double x = strtod(p, &end);
        if (end == p || x < 1) return -1;
        if (*end == 'K' || *end == 'k')
            x *= 1024, end++;
        else if (*end == 'M' || *end == 'm')
            x *= 1048576, end++;
        else if (*end == 'G' || *end == 'g')
            x *= 1073741824.0, end++;
        if (x > 4294967296.0) return -1;
        sizes[n++] = (size_t)x;
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        p = end;
    }
    return n;
}

static void sizes_arg(const size_t *sizes, int n, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n && len + 24 < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%zu", i ? "," : "", sizes[i]);
}

/* Run argv (with extra env for tcp ranks) as `nranks` processes; the output of the first is
 * parsed as JSON. */
static json_t *spawn_ranks(char *const *argv, int nranks, int port, char **why)
{
    int fd[2];
    if (pipe(fd)) return NULL;
    pid_t pids[2] = {0, 0};
    for (int r = 0; r < nranks; r++) {
        /* The rank's variables are set here, not in the child: the store server's thread
         * runs at fork, and the child may call only async-signal-safe functions before exec. */
        if (port > 0) {
            char b[32];
            snprintf(b, sizeof b, "%d", r);
            setenv("RANK", b, 1);
            setenv("LOCAL_RANK", b, 1);
            snprintf(b, sizeof b, "%d", nranks);
            setenv("WORLD_SIZE", b, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            snprintf(b, sizeof b, "%d", port);
            setenv("MASTER_PORT", b, 1);
            setenv("CT_STORE_HOSTED", "1", 1);
        }
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            if (r == 0)
                dup2(fd[1], 1);
            else {
                int dn = open("/dev/null", O_WRONLY);
                if (dn >= 0) dup2(dn, 1);
            }
            close(fd[0]);
            close(fd[1]);
            execvp(argv[0], argv);
            _exit(127);
        }
        pids[r] = pid;
    }
    if (port > 0) {
        static const char *const vars[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                           "MASTER_PORT", "CT_STORE_HOSTED"};
        for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
            unsetenv(vars[i]);
    }
    close(fd[1]);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while (buf && (k = read(fd[0], buf + len, cap - len - 1)) > 0) {
        len += (size_t)k;
        if (len + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    close(fd[0]);
    int bad = 0;
    for (int r = 0; r < nranks; r++) {
        int st = 0;
        if (pids[r] > 0) waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) bad = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    }
    json_t *j = NULL;
    if (buf && !bad) {
        buf[len] = 0;
        j = json_loads(buf, 0, NULL);
    }
    free(buf);
    if (!j) *why = bad == 127 ? "not installed" : "failed";
    return j;
}

/* One busy process per online core, until stop_hogs; returns how many started. */
static int start_hogs(pid_t *pids, int cap)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int n = ncpu < 1 ? 1 : ncpu > cap ? cap : (int)ncpu;
    for (int i = 0; i < n; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            volatile uint64_t x = 0;
            for (;;)
                x = x * 6364136223846793005ull + 1442695040888963407ull;
        }
        pids[i] = pid;
    }
    return n;
}

static void stop_hogs(pid_t *pids, int n)
{
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) waitpid(pids[i], NULL, 0);
}

static double memcpy_gbps(void)
{
    size_t n = 64u << 20;
    void *a = NULL, *b = NULL;
    if (ct_alloc(&a, n) || ct_alloc(&b, n)) {
        ct_free(a);
        return 0;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double t[5];
    for (int r = 0; r < 5; r++) {
        double t0 = bench_now();
        memcpy(b, a, n);
        t[r] = bench_now() - t0;
    }
    qsort(t, 5, sizeof t[0], cmp_d);
    ct_free(a);
    ct_free(b);
    return (double)n / t[2] * 1e-9;
}

static double busbw_at(json_t *res, const char *op, size_t bytes, const char *field)
{
    json_t *rows = json_object_get(res, op);
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *r = json_array_get(rows, i);
        if ((size_t)json_integer_value(json_object_get(r, "bytes")) == bytes)
            return json_real_value(json_object_get(r, field));
    }
    return 0;
}

static const char *mpiexec_path(void)
{
    static char found[4096];
    const char *path = getenv("PATH");
    if (!path) return NULL;
    char tmp[8192];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *d = strtok(tmp, ":"); d; d = strtok(NULL, ":")) {
        snprintf(found, sizeof found, "%s/mpiexec", d);
        if (access(found, X_OK) == 0) return found;
    }
    return NULL;
}

int bench_comm(bench_ctx *b, int argc, char **argv)
{
    const char *backend = "tcp", *worker_kind = NULL, *sizes_opt = NULL;
    int full = 0, contended = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help")) {
            puts("usage: ctorch bench comm [--backend tcp|mpi] [--full] [--sizes 8,1K,64M,...] "
                 "[--contended] [--json] [--repeats R]\n"
                 "Bus bandwidth and latency of all_reduce, all_gather_single and "
                 "reduce_scatter_single (f32) at 2\n"
                 "ranks on this host: ctorch's backend beside MPICH's MPI_Allreduce / "
                 "MPI_Allgather /\n"
                 "MPI_Reduce_scatter_block on the same sizes (run under mpiexec in the same run) "
                 "and beside\n"
                 "memcpy. Default sizes 8 B, 1 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB (under a "
                 "minute);\n"
                 "--full sweeps 8 B to 256 MiB by 4x. --contended starts one busy process per "
                 "core for the\n"
                 "duration of the measurement (ranks share their cores with compute, as in "
                 "training).");
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--backend", &v))
            backend = v;
        else if (cli_opt(argc, argv, &i, "--worker", &v))
            worker_kind = v;
        else if (cli_opt(argc, argv, &i, "--sizes", &v))
            sizes_opt = v;
        else if (!strcmp(argv[i], "--full"))
            full = 1;
        else if (!strcmp(argv[i], "--contended"))
            contended = 1;
        else {
            fprintf(stderr, "ctorch bench comm: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    size_t sizes[64];
    int nsizes = 0;
    if (sizes_opt) {
        nsizes = parse_sizes(sizes_opt, sizes, 64);
        if (nsizes <= 0) {
            fprintf(stderr, "ctorch bench comm: --sizes expects a list like 8,1K,64M (up to 4G)\n");
            return 2;
        }
    } else if (full) {
        for (size_t s = 8; s <= (256u << 20); s *= 4)
            sizes[nsizes++] = s;
        sizes[nsizes++] = 256u << 20;
    } else {
        nsizes = (int)(sizeof default_sizes / sizeof default_sizes[0]);
        memcpy(sizes, default_sizes, sizeof default_sizes);
    }
    if (strcmp(backend, "tcp") && strcmp(backend, "mpi")) {
        fprintf(stderr, "ctorch bench comm: --backend is tcp or mpi\n");
        return 2;
    }
    if (worker_kind) {
        worker w = {0, 0, b->repeats, NULL, 0, NULL, NULL};
        int with_mpi = !strcmp(worker_kind, "mpi");
#ifdef CT_HAVE_MPI
        int provided;
        if (with_mpi) MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
#endif
        if (!with_mpi && strcmp(worker_kind, "tcp")) {
            fprintf(stderr, "ctorch bench comm: --worker tcp|mpi\n");
            return 2;
        }
        ct_comm_options o = ct_comm_options_default();
        o.backend = strcmp(backend, "mpi") ? CT_COMM_TCP : CT_COMM_MPI;
        o.timeout_s = 120;
        ct_status st = ct_comm_init_env(&o, &w.c);
        int rc = st ? cli_fail("bench comm worker", st) : 0;
        if (!st) {
            w.rank = ct_comm_rank(w.c);
            w.size = ct_comm_size(w.c);
            w.raw = with_mpi;
            rc = run_worker(&w, sizes, nsizes);
        }
        ct_comm_free(w.c);
#ifdef CT_HAVE_MPI
        if (with_mpi) MPI_Finalize();
#endif
        return rc;
    }
    /* The driver. */
    if (!strcmp(backend, "mpi") && (!ct_comm_backend_available(CT_COMM_MPI) || !mpiexec_path())) {
        fprintf(stderr, "ctorch bench comm: --backend mpi needs MPI built in and mpiexec\n");
        return 2;
    }
    char exe[4096];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el <= 0) return cli_fail("bench comm: cannot find this program", CT_EIO);
    exe[el] = 0;
    char sz[2048], rp[16];
    sizes_arg(sizes, nsizes, sz, sizeof sz);
    snprintf(rp, sizeof rp, "%d", b->repeats);
    double mcpy = memcpy_gbps();
    /* Both stacks in the same two processes when MPI is there (mpiexec -n 2, the tcp ranks
     * finding the store through MASTER_ADDR / MASTER_PORT); else tcp alone. */
    const char *mpiexec = mpiexec_path();
    int have_mpi = ct_comm_backend_available(CT_COMM_MPI) && mpiexec;
    const char *why_base = !ct_comm_backend_available(CT_COMM_MPI) ? "not built with MPI"
                           : !mpiexec                              ? "mpiexec not found"
                                                                   : "failed";
    /* A job secret for the ranks (they inherit it), as ctorch launch makes one. */
    char secret[80];
    if (!getenv("CT_JOB_SECRET")) {
        ct_status gs = ct_comm_secret_generate(secret, sizeof secret);
        if (gs) return cli_fail("bench comm: job secret", gs);
        setenv("CT_JOB_SECRET", secret, 1);
    }
    ct_store_server *srv = NULL;
    ct_status sst = ct_store_server_start("127.0.0.1", 0, &srv);
    if (sst) return cli_fail("bench comm: store", sst);
    pid_t hogs[512];
    int nhogs = contended ? start_hogs(hogs, 512) : 0;
    char port[16];
    snprintf(port, sizeof port, "%d", ct_store_server_port(srv));
    json_t *res = NULL;
    char *why = "failed";
    if (have_mpi) {
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", port, 1);
        setenv("CT_STORE_HOSTED", "1", 1);
        char *args[] = {(char *)mpiexec, "-n",       "2",         exe,         "bench",
                        "comm",          "--worker", "mpi",       "--backend", (char *)backend,
                        "--sizes",       sz,         "--repeats", rp,          NULL};
        res = spawn_ranks(args, 1, 0, &why);
    } else {
        char *args[] = {exe,       "bench", "comm",      "--worker", "tcp",
                        "--sizes", sz,      "--repeats", rp,         NULL};
        res = spawn_ranks(args, 2, ct_store_server_port(srv), &why);
    }
    stop_hogs(hogs, nhogs);
    ct_store_server_free(srv);
    json_t *ours = json_object_get(res, "ctorch"), *base = json_object_get(res, "mpi");
    if (!ours) {
        fprintf(stderr, "ctorch bench comm: the ranks %s\n", why);
        json_decref(res);
        return 1;
    }
    json_t *j = json_pack("{s:s, s:s, s:i, s:s, s:i, s:f, s:b, s:i, s:o}", "bench", "comm",
                          "backend", backend, "ranks", 2, "dtype", "f32", "repeats", b->repeats,
                          "memcpy_gbps", mcpy, "contended", contended, "busy_processes", nhogs,
                          "machine", bench_machine_json(0));
    json_object_set_new(j, "mpi_baseline",
                        base ? json_string("MPICH (same processes, interleaved)")
                             : json_string(why_base));
    json_t *ops = json_object();
    for (int op = 0; op < NOPS; op++) {
        json_t *rows = json_array(), *orow = json_object_get(ours, op_names[op]);
        for (size_t i = 0; i < json_array_size(orow); i++) {
            json_t *r = json_array_get(orow, i);
            size_t bytes = (size_t)json_integer_value(json_object_get(r, "bytes"));
            json_t *row = json_pack("{s:I, s:O}", "bytes", (json_int_t)bytes, "ctorch", r);
            double mb = base ? busbw_at(base, op_names[op], bytes, "busbw_gbps") : 0;
            double mt = base ? busbw_at(base, op_names[op], bytes, "time_us") : 0;
            if (base) {
                json_t *rows_b = json_object_get(base, op_names[op]);
                json_object_set(row, "mpi", json_array_get(rows_b, i));
            }
            if (mb > 0)
                json_object_set_new(
                    row, "busbw_ratio",
                    json_real(json_real_value(json_object_get(r, "busbw_gbps")) / mb));
            if (mt > 0)
                json_object_set_new(row, "latency_ratio",
                                    json_real(json_real_value(json_object_get(r, "time_us")) / mt));
            json_array_append_new(rows, row);
        }
        json_object_set_new(ops, op_names[op], rows);
    }
    json_object_set_new(j, "ops", ops);
    double r64 = 0, lat8 = 0, lat8min = 0, ag1 = 0;
    if (base) {
        double ga = busbw_at(ours, "all_gather_single", 1u << 20, "busbw_gbps"),
               gm = busbw_at(base, "all_gather_single", 1u << 20, "busbw_gbps");
        if (ga > 0 && gm > 0) ag1 = ga / gm;
        double a = busbw_at(ours, "all_reduce", 64u << 20, "busbw_gbps"),
               m = busbw_at(base, "all_reduce", 64u << 20, "busbw_gbps");
        double ta = busbw_at(ours, "all_reduce", 8, "time_us"),
               tm = busbw_at(base, "all_reduce", 8, "time_us");
        double ua = busbw_at(ours, "all_reduce", 8, "time_min_us"),
               um = busbw_at(base, "all_reduce", 8, "time_min_us");
        if (a > 0 && m > 0) r64 = a / m;
        if (ta > 0 && tm > 0) lat8 = ta / tm;
        if (ua > 0 && um > 0) lat8min = ua / um;
        json_object_set_new(j, "summary",
                            json_pack("{s:f, s:f, s:f, s:f}", "all_reduce_64MiB_busbw_vs_mpi", r64,
                                      "all_reduce_8B_latency_vs_mpi", lat8,
                                      "all_reduce_8B_min_latency_vs_mpi", lat8min,
                                      "all_gather_1MiB_busbw_vs_mpi", ag1));
    }
    if (b->json) {
        bench_print_json(j);
    } else {
        printf("comm: 2 ranks on this host, f32, median of %d; memcpy %.2f GB/s; baseline %s%s\n",
               b->repeats, mcpy, base ? "MPICH, same processes, interleaved" : why_base,
               contended ? "; contended (one busy process per core)" : "");
        for (int op = 0; op < NOPS; op++) {
            printf("\n%-22s %-26s %-26s\n", op_names[op],
                   backend[0] == 't' ? "ctorch tcp" : "ctorch mpi", base ? mpi_names[op] : "");
            printf("%12s %12s %12s %12s %12s %10s %10s\n", "bytes", "time us", "busbw GB/s",
                   "time us", "busbw GB/s", "busbw x", "time x");
            json_t *rows = json_object_get(ops, op_names[op]);
            for (size_t i = 0; i < json_array_size(rows); i++) {
                json_t *row = json_array_get(rows, i), *c = json_object_get(row, "ctorch"),
                       *m = json_object_get(row, "mpi");
                printf("%12lld %12.2f %12.3f",
                       (long long)json_integer_value(json_object_get(row, "bytes")),
                       json_real_value(json_object_get(c, "time_us")),
                       json_real_value(json_object_get(c, "busbw_gbps")));
                if (m)
                    printf(" %12.2f %12.3f %9.2fx %9.2fx",
                           json_real_value(json_object_get(m, "time_us")),
                           json_real_value(json_object_get(m, "busbw_gbps")),
                           json_real_value(json_object_get(row, "busbw_ratio")),
                           json_real_value(json_object_get(row, "latency_ratio")));
                putchar('\n');
            }
        }
        if (base) { /* a size left out by --sizes has no ratio */
            char f[4][32] = {"not measured", "not measured", "not measured", "not measured"};
            double v[4] = {r64, lat8, lat8min, ag1};
            for (int i = 0; i < 4; i++)
                if (v[i] > 0) snprintf(f[i], sizeof f[i], "%.2fx", v[i]);
            printf("\nall_reduce 64 MiB bus bandwidth: %s MPICH's; 8 B latency: %s MPICH's "
                   "(median), %s (best repeat); all_gather 1 MiB bus bandwidth: %s\n",
                   f[0], f[1], f[2], f[3]);
        }
    }
    json_decref(j);
    json_decref(res);
    return 0;
}
