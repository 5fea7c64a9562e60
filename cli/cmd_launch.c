/* ctorch launch: start N local ranks of a program with the environment torchrun sets,
 * serve their rendezvous store, stream their output with rank prefixes, and report which
 * rank failed and how. Without --elastic the first failure ends the others (SIGTERM, then
 * SIGKILL after a grace period); with it the survivors keep going. */
#include "cli.h"
#include "core/internal.h" /* ct_file_*: the one way files are read */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct stream {
    int fd;
    FILE *out;
    char buf[8192];
    size_t len;
} stream;

typedef struct rank_proc {
    pid_t pid; /* also its process group */
    int running;
    int group;        /* its process group may still have members */
    double group_end; /* after the rank ended: SIGKILL its group at this time */
    int killed;       /* its group got SIGKILL */
    int status;     /* from waitpid */
    int terminated; /* ended by the launcher */
    double t_end;
    stream s[2];
} rank_proc;

static volatile sig_atomic_t g_signal;
static int g_json;

static void on_signal(int sig)
{
    g_signal = sig;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A launcher event: text or one JSON object per line on stderr (CT_COMM_LOG=json). */
static void event(const char *name, const char *json_fields, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void event(const char *name, const char *json_fields, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (g_json) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        json_t *j = json_loads(json_fields && *json_fields ? json_fields : "{}", 0, NULL);
        if (!j) j = json_object();
        json_object_set_new(j, "ts", json_real((double)ts.tv_sec + ts.tv_nsec * 1e-9));
        json_object_set_new(j, "component", json_string("launch"));
        json_object_set_new(j, "event", json_string(name));
        json_object_set_new(j, "msg", json_string(text));
        char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
        if (s) fprintf(stderr, "%s\n", s);
        free(s);
        json_decref(j);
    } else {
        fprintf(stderr, "ctorch launch: %s\n", text);
    }
    fflush(stderr);
}

static void emit(stream *s, int rank, int prefix, const char *line, size_t n)
{
    if (prefix) fprintf(s->out, "[rank%d]: ", rank);
    fwrite(line, 1, n, s->out);
    fputc('\n', s->out);
    fflush(s->out);
}

/* Read what a rank wrote; print whole lines. Returns 0 at end of file. */
static int pump(stream *s, int rank, int prefix)
{
    ssize_t r = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (r < 0) return errno == EINTR || errno == EAGAIN ? 1 : 0;
    if (r == 0) {
        if (s->len) emit(s, rank, prefix, s->buf, s->len);
        s->len = 0;
        return 0;
    }
    s->len += (size_t)r;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] != '\n') continue;
        emit(s, rank, prefix, s->buf + start, i - start);
        start = i + 1;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    if (s->len == sizeof s->buf) { /* a very long line: print it in pieces */
        emit(s, rank, prefix, s->buf, s->len);
        s->len = 0;
    }
    return 1;
}

static void describe_status(int st, char *buf, size_t cap)
{
    if (WIFEXITED(st))
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, cap, "ended with wait status %d", st);
}

static int exit_code(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
}

/* Remove the shared-memory segments a rank made (/dev/shm/ctorch.<pid>.*): a rank killed
 * between creating and unlinking one leaves it behind. */
static void remove_segments(pid_t pid, int rank)
{
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    char pre[40];
    int pl = snprintf(pre, sizeof pre, "ctorch.%d.", (int)pid);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, pre, (size_t)pl)) continue;
        char nm[300];
        snprintf(nm, sizeof nm, "/%s", e->d_name);
        if (shm_unlink(nm) == 0) {
            char fields[400];
            snprintf(fields, sizeof fields, "{\"rank\":%d,\"pid\":%d,\"segment\":\"%s\"}", rank,
                     (int)pid, nm);
            event("shm_cleanup", fields, "removed rank %d's shared memory %s (it died holding it)",
                  rank, nm);
        }
    }
    closedir(d);
}

/* Signal a rank's process group (the rank and whatever it started there); notes when the
 * group is gone. */
static void signal_group(rank_proc *p, int sig)
{
    if (!p->pid || !p->group) return;
    if (sig == SIGKILL) p->killed = 1;
    if (kill(-p->pid, sig) != 0 && errno == ESRCH) p->group = 0;
}

/* A number of seconds for a launch option: finite, > 0 (or >= 0 where zero_ok); a value
 * outside that is named with the rule. */
static bool seconds_opt(const char *opt, const char *val, bool zero_ok, double *out)
{
    double x;
    if (!cli_float(opt, val, &x)) return false;
    if (!isfinite(x) || x < 0 || (x == 0 && !zero_ok)) {
        fprintf(stderr, "ctorch launch: %s %s: seconds %s expected (a finite number)\n", opt, val,
                zero_ok ? ">= 0" : "> 0");
        return false;
    }
    *out = x;
    return true;
}

static void launch_usage(FILE *f)
{
    fputs("usage: ctorch launch --nproc N [--timeout S] [--elastic] [--grace S] [--max-time S]\n"
          "                     [--master-addr A] [--master-port P] [--fr-dump-dir DIR]\n"
          "                     [--log text|json] [--no-prefix] -- PROGRAM [ARGS...]\n\n"
          "Starts N ranks of PROGRAM on this host with RANK, LOCAL_RANK, WORLD_SIZE,\n"
          "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and CT_STORE_HOSTED=1 set (the launcher\n"
          "serves the store), prefixes their output with [rankK]:, and reports how each failed.\n"
          "A random job secret goes to the ranks in CT_JOB_SECRET (kept when already set): the\n"
          "store and every rank connection check it, so no other process can join the job.\n"
          "  --timeout S      communicator timeout of the ranks (sets CT_COMM_TIMEOUT)\n"
          "  --elastic        keep the other ranks running when one fails; exit 0 when every\n"
          "                   rank that exited did so with 0 (ranks killed by a signal are\n"
          "                   reported and tolerated)\n"
          "  --grace S        after a failure, seconds between SIGTERM and SIGKILL (default 5)\n"
          "  --max-time S     end the whole job after S seconds (default: no limit)\n"
          "  --master-port P  store port (default 0: a free port)\n"
          "  --fr-dump-dir D  ranks dump their flight recorders there on failure (sets\n"
          "                   CT_COMM_FR_DUMP_DIR); the launcher summarises them\n"
          "  --log json       launcher events as JSON lines (also CT_COMM_LOG=json)\n",
          f);
}

static int is_dump(const struct dirent *d)
{
    size_t n = strlen(d->d_name);
    return !strncmp(d->d_name, "ctorch_fr_", 10) && n > 15 && !strcmp(d->d_name + n - 5, ".json") &&
           strstr(d->d_name, "_rank") != NULL;
}

/* One line per flight-recorder dump the ranks wrote: who stopped at which sequence number. */
static void summarise_dumps(const char *dir)
{
    struct dirent **names = NULL;
    int n = scandir(dir, &names, is_dump, alphasort);
    for (int i = 0; i < n; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        free(names[i]);
        json_error_t err;
        char *text; /* a regular file (a FIFO planted there is passed over, not waited on) */
        size_t tlen;
        if (ct_file_read_all(path, "flight recorder dump", CT_FILE_INDEX_MAX, &text, &tlen))
            continue;
        json_t *j = json_loadb(text, tlen, 0, &err);
        ct_free(text);
        if (!j) continue;
        json_int_t r = json_integer_value(json_object_get(j, "rank"));
        json_int_t enq = json_integer_value(json_object_get(j, "last_enqueued_seq"));
        json_int_t sta = json_integer_value(json_object_get(j, "last_started_seq"));
        json_int_t com = json_integer_value(json_object_get(j, "last_completed_seq"));
        const char *why = json_string_value(json_object_get(j, "reason"));
        const char *comm = json_string_value(json_object_get(j, "comm"));
        char stuck[600] = "";
        json_t *es = json_object_get(j, "entries");
        for (size_t k = json_array_size(es); k-- > 0;) {
            json_t *e = json_array_get(es, k);
            const char *st = json_string_value(json_object_get(e, "state"));
            if (!st || !strcmp(st, "completed")) continue;
            char miss[200] = "";
            json_t *m = json_object_get(e, "missing_ranks");
            size_t len = 0;
            for (size_t q = 0; q < json_array_size(m) && len + 12 < sizeof miss; q++)
                len += (size_t)snprintf(miss + len, sizeof miss - len, "%s%lld", q ? "," : "",
                                        (long long)json_integer_value(json_array_get(m, q)));
            snprintf(stuck, sizeof stuck, "; %s seq %lld %s%s%s%s",
                     json_string_value(json_object_get(e, "op")),
                     (long long)json_integer_value(json_object_get(e, "seq")), st,
                     miss[0] ? " (missing ranks " : "", miss, miss[0] ? ")" : "");
            break;
        }
        char fields[512];
        snprintf(
            fields, sizeof fields,
            "{\"comm\":\"%s\",\"rank\":%lld,\"last_enqueued_seq\":%lld,\"last_started_seq\":%lld,"
            "\"last_completed_seq\":%lld}",
            comm ? comm : "?", (long long)r, (long long)enq, (long long)sta, (long long)com);
        event("flight_recorder", fields,
              "%s rank %lld (%s): last enqueued / started / completed seq %lld / %lld / %lld%s",
              comm ? comm : "?", (long long)r, why ? why : "?", (long long)enq, (long long)sta,
              (long long)com, stuck);
        json_decref(j);
    }
    free(names);
    if (n > 0) event("flight_recorder", NULL, "%d flight-recorder dumps in %s", n, dir);
}

cli_launch_opts cli_launch_defaults(void)
{
    cli_launch_opts o;
    memset(&o, 0, sizeof o);
    o.grace = 5;
    o.prefix = 1;
    o.addr = "127.0.0.1";
    const char *logmode = getenv("CT_COMM_LOG");
    o.json = logmode && !strcmp(logmode, "json");
    return o;
}

int cmd_launch(int argc, char **argv)
{
    long long nproc = 0, port = 0;
    double timeout = 0, grace = 5, max_time = 0;
    int elastic = 0, prefix = 1;
    const char *addr = "127.0.0.1", *frdir = NULL, *logmode = getenv("CT_COMM_LOG");
    int i = 1;
    for (; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--")) {
            i++;
            break;
        }
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            launch_usage(stdout);
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--nproc", &v)) {
            if (!cli_int("--nproc", v, 1, 1024, &nproc)) return 2;
        } else if (cli_opt(argc, argv, &i, "--timeout", &v)) {
            if (!seconds_opt("--timeout", v, false, &timeout)) return 2;
        } else if (cli_opt(argc, argv, &i, "--grace", &v)) {
            if (!seconds_opt("--grace", v, true, &grace)) return 2;
        } else if (cli_opt(argc, argv, &i, "--max-time", &v)) {
            if (!seconds_opt("--max-time", v, false, &max_time)) return 2;
        } else if (cli_opt(argc, argv, &i, "--master-addr", &v)) {
            addr = v;
        } else if (cli_opt(argc, argv, &i, "--master-port", &v)) {
            if (!cli_int("--master-port", v, 0, 65535, &port)) return 2;
        } else if (cli_opt(argc, argv, &i, "--fr-dump-dir", &v)) {
            frdir = v;
        } else if (cli_opt(argc, argv, &i, "--log", &v)) {
            logmode = v;
        } else if (!strcmp(argv[i], "--elastic")) {
            elastic = 1;
        } else if (!strcmp(argv[i], "--no-prefix")) {
            prefix = 0;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "ctorch launch: unknown option '%s'\n", argv[i]);
            launch_usage(stderr);
            return 2;
        } else {
            break;
        }
    }
    g_json = logmode && !strcmp(logmode, "json");
    if (nproc < 1 || i >= argc) {
        fprintf(stderr, "ctorch launch: need --nproc N and a program to run\n");
        launch_usage(stderr);
        return 2;
    }
    cli_launch_opts o = cli_launch_defaults();
    o.nproc = (int)nproc;
    o.port = (int)port;
    o.timeout = timeout;
    o.grace = grace;
    o.max_time = max_time;
    o.elastic = elastic;
    o.prefix = prefix;
    o.addr = addr;
    o.frdir = frdir;
    o.json = g_json;
    return cli_launch_run(&o, argv + i);
}

extern char **environ;

/* The program's path as execvp would find it, resolved before fork (the child may call only
 * async-signal-safe functions: the store thread may hold the allocator's lock at fork). */
static char *resolve_program(const char *name)
{
    if (strchr(name, '/')) return strdup(name);
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    size_t nl = strlen(name);
    for (const char *p = path;; p++) {
        const char *e = strchr(p, ':');
        size_t dl = e ? (size_t)(e - p) : strlen(p);
        char *cand = malloc(dl + nl + 3);
        if (!cand) return NULL;
        if (dl) {
            memcpy(cand, p, dl);
            cand[dl] = '/';
            memcpy(cand + dl + 1, name, nl + 1);
        } else {
            cand[0] = '.';
            cand[1] = '/';
            memcpy(cand + 2, name, nl + 1);
        }
        if (access(cand, X_OK) == 0) return cand;
        free(cand);
        if (!e) break;
        p = e;
    }
    return strdup(name); /* execve reports ENOENT */
}

/* The variables the launcher sets for a rank; any inherited value of them is replaced. */
static const char *const RANK_VARS[] = {"RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE",
                                        "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                        "CT_STORE_HOSTED", "CT_COMM_TIMEOUT",
                                        "CT_COMM_FR_DUMP_DIR"};
#define N_RANK_VARS (sizeof RANK_VARS / sizeof RANK_VARS[0])

static int is_rank_var(const char *kv)
{
    for (size_t i = 0; i < N_RANK_VARS; i++) {
        size_t n = strlen(RANK_VARS[i]);
        if (!strncmp(kv, RANK_VARS[i], n) && kv[n] == '=') return 1;
    }
    return 0;
}

static void free_env(char **env)
{
    if (!env) return;
    for (char **e = env; *e; e++)
        free(*e);
    free(env);
}

/* Rank r's whole environment, built in the parent: this process's environment without the
 * rank variables, then the rank variables for r. NULL when out of memory. */
static char **rank_env(int r, long long nproc, const char *addr, int sport, double timeout,
                       const char *frdir)
{
    size_t n = 0;
    for (char **e = environ; e && *e; e++)
        n++;
    char **env = calloc(n + N_RANK_VARS + 1, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    int bad = 0;
    for (char **e = environ; e && *e && !bad; e++)
        if (!is_rank_var(*e)) bad = !(env[k++] = strdup(*e));
    char v[N_RANK_VARS][64];
    const char *val[N_RANK_VARS] = {0};
    snprintf(v[0], sizeof v[0], "%d", r);
    val[0] = val[1] = v[0];
    val[2] = "0";
    snprintf(v[3], sizeof v[3], "%lld", nproc);
    val[3] = val[4] = v[3];
    val[5] = addr;
    snprintf(v[6], sizeof v[6], "%d", sport);
    val[6] = v[6];
    val[7] = "1";
    if (timeout > 0) {
        snprintf(v[8], sizeof v[8], "%g", timeout);
        val[8] = v[8];
    }
    val[9] = frdir;
    for (size_t i = 0; i < N_RANK_VARS && !bad; i++) {
        if (!val[i]) continue;
        size_t len = strlen(RANK_VARS[i]) + strlen(val[i]) + 2;
        if (!(env[k] = malloc(len))) {
            bad = 1;
            break;
        }
        snprintf(env[k++], len, "%s=%s", RANK_VARS[i], val[i]);
    }
    if (bad) {
        free_env(env);
        return NULL;
    }
    return env;
}

int cli_launch_run(const cli_launch_opts *o, char *const *prog)
{
    long long nproc = o->nproc;
    double timeout = o->timeout, grace = o->grace, max_time = o->max_time;
    int elastic = o->elastic, prefix = o->prefix, port = o->port;
    const char *addr = o->addr && *o->addr ? o->addr : "127.0.0.1", *frdir = o->frdir;
    g_json = o->json;
    if (nproc < 1 || nproc > 1024 || !prog || !prog[0]) {
        fprintf(stderr, "ctorch launch: need 1..1024 ranks and a program to run\n");
        return 2;
    }
    /* The job secret: every rank proves it to the store and to each other (never on a
     * command line: ranks inherit it in the environment). */
    char secret[80];
    const char *given = getenv("CT_JOB_SECRET");
    secret[0] = 0;
    if (!given || !*given) {
        ct_status gs = ct_comm_secret_generate(secret, sizeof secret);
        if (gs) return cli_fail("launch: cannot make a job secret", gs);
        setenv("CT_JOB_SECRET", secret, 1);
    }
    ct_store_server *srv;
    ct_status st = ct_store_server_start(addr, (int)port, &srv);
    if (st) return cli_fail("launch: cannot serve the store", st);
    int sport = ct_store_server_port(srv);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    rank_proc *rp = calloc((size_t)nproc, sizeof *rp);
    char *exe = resolve_program(prog[0]);
    if (!rp || !exe) {
        free(rp);
        free(exe);
        return cli_fail("launch", CT_ENOMEM);
    }
    double t0 = now_s();
    char fields[512];
    snprintf(fields, sizeof fields,
             "{\"nproc\":%lld,\"master_addr\":\"%s\",\"master_port\":%d,\"elastic\":%s}", nproc,
             addr, sport, elastic ? "true" : "false");
    event("start", fields, "starting %lld ranks of %s (store %s:%d%s)", nproc, prog[0], addr, sport,
          elastic ? ", elastic" : "");
    int failed_code = 0, first_failed = -1, running = 0, fatal = 0;
    for (int r = 0; r < nproc; r++) {
        int po[2], pe[2];
        if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC)) {
            fprintf(stderr, "ctorch launch: pipe: %s\n", strerror(errno));
            fatal = 1;
            break;
        }
        char **env = rank_env(r, nproc, addr, sport, timeout, frdir);
        if (!env) {
            fprintf(stderr, "ctorch launch: out of memory for rank %d's environment\n", r);
            close(po[0]);
            close(po[1]);
            close(pe[0]);
            close(pe[1]);
            fatal = 1;
            break;
        }
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid != 0) free_env(env);
        if (pid < 0) {
            fprintf(stderr, "ctorch launch: fork: %s\n", strerror(errno));
            close(po[0]);
            close(po[1]);
            close(pe[0]);
            close(pe[1]);
            fatal = 1;
            break;
        }
        if (pid == 0) {
            /* async-signal-safe calls only until execve (see resolve_program) */
            setpgid(0, 0);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            signal(SIGPIPE, SIG_DFL);
            dup2(po[1], 1);
            dup2(pe[1], 2);
            execve(exe, prog, env);
            int err = errno;
            static const char m1[] = "ctorch launch: cannot run ";
            (void)!write(2, m1, sizeof m1 - 1);
            (void)!write(2, prog[0], strlen(prog[0]));
            (void)!write(2, ": ", 2);
            const char *es = err == ENOENT ? "no such file" : err == EACCES ? "permission denied"
                                                                          : "exec failed";
            (void)!write(2, es, strlen(es));
            (void)!write(2, "\n", 1);
            _exit(127);
        }
        setpgid(pid, pid); /* as the child does: no window where a signal misses its group */
        close(po[1]);
        close(pe[1]);
        rp[r].pid = pid;
        rp[r].running = 1;
        rp[r].group = 1;
        rp[r].s[0] = (stream){po[0], stdout, {0}, 0};
        rp[r].s[1] = (stream){pe[0], stderr, {0}, 0};
        running++;
    }
    double kill_at = 0;
    int terminating = fatal;
    if (fatal) {
        for (int r = 0; r < nproc; r++)
            signal_group(&rp[r], SIGTERM);
        kill_at = now_s() + grace;
        failed_code = 1;
    }
    double drain_until = 0; /* every group killed: stop waiting for escaped holders of a pipe */
    struct pollfd *pf = calloc((size_t)nproc * 2, sizeof *pf);
    int *who = calloc((size_t)nproc * 2, sizeof *who);
    for (;;) {
        int nf = 0;
        for (int r = 0; r < nproc; r++)
            for (int k = 0; k < 2; k++)
                if (rp[r].s[k].fd >= 0 && rp[r].pid) {
                    pf[nf] = (struct pollfd){rp[r].s[k].fd, POLLIN, 0};
                    who[nf++] = r * 2 + k;
                }
        if (running == 0) {
            /* Every rank ended: what is left in their groups (orphans holding a pipe) is
             * ended too, SIGTERM at the rank's exit, SIGKILL a grace period later. */
            int groups = 0;
            for (int r = 0; r < nproc; r++)
                groups += rp[r].group && !rp[r].killed;
            if (groups == 0 && drain_until == 0) drain_until = now_s() + 1.0;
            if (nf == 0 || (drain_until > 0 && now_s() > drain_until)) break;
        }
        poll(pf, (nfds_t)nf, 20);
        for (int k = 0; k < nf; k++) {
            if (!pf[k].revents) continue;
            stream *s = &rp[who[k] / 2].s[who[k] % 2];
            if (!pump(s, who[k] / 2, prefix)) {
                close(s->fd);
                s->fd = -1;
            }
        }
        pid_t pid;
        int ws;
        while ((pid = waitpid(-1, &ws, WNOHANG)) > 0) {
            int r = 0;
            while (r < nproc && rp[r].pid != pid)
                r++;
            if (r == nproc || !rp[r].running) continue;
            rp[r].running = 0;
            rp[r].status = ws;
            rp[r].t_end = now_s() - t0;
            running--;
            remove_segments(pid, r);
            signal_group(&rp[r], SIGTERM);
            rp[r].group_end = now_s() + grace;
            char how[160];
            describe_status(ws, how, sizeof how);
            int ok = WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
            snprintf(fields, sizeof fields,
                     "{\"rank\":%d,\"pid\":%d,\"exit_code\":%d,\"seconds\":%.3f}", r, (int)pid,
                     exit_code(ws), rp[r].t_end);
            if (ok) {
                event("rank_exit", fields, "rank %d (pid %d) exited with status 0 after %.2f s", r,
                      (int)pid, rp[r].t_end);
                continue;
            }
            if (rp[r].terminated) {
                event("rank_ended", fields,
                      "rank %d (pid %d) %s after %.2f s (ended by the launcher)", r, (int)pid, how,
                      rp[r].t_end);
                continue;
            }
            event("rank_failed", fields, "rank %d (pid %d) %s after %.2f s", r, (int)pid, how,
                  rp[r].t_end);
            int tolerated = elastic && WIFSIGNALED(ws);
            if (first_failed < 0 && !tolerated) {
                first_failed = r;
                failed_code = exit_code(ws);
            }
            if (!elastic && !terminating) {
                terminating = 1;
                kill_at = now_s() + grace;
                int others = 0;
                for (int q = 0; q < nproc; q++) {
                    if (rp[q].running) {
                        rp[q].terminated = 1;
                        others++;
                    }
                    signal_group(&rp[q], SIGTERM);
                }
                if (others)
                    event("terminate", NULL,
                          "rank %d failed: ending the %d other running ranks (SIGTERM, SIGKILL "
                          "after %g s)",
                          r, others, grace);
            }
        }
        if (g_signal) {
            /* Forward SIGINT / SIGTERM to every rank's process group (each time one comes);
             * SIGKILL follows after the grace period. */
            int sig = (int)g_signal;
            g_signal = 0;
            event("signal", NULL, "got signal %d (%s): forwarding it to the ranks", sig,
                  strsignal(sig));
            for (int q = 0; q < nproc; q++) {
                if (rp[q].running) rp[q].terminated = 1;
                signal_group(&rp[q], sig);
            }
            if (!terminating) {
                terminating = 1;
                kill_at = now_s() + grace;
            }
            if (!failed_code) failed_code = 128 + sig;
        }
        if (max_time > 0 && !terminating && now_s() - t0 > max_time) {
            terminating = 1;
            kill_at = now_s() + grace;
            event("max_time", NULL, "the job ran past --max-time %g s: ending the ranks", max_time);
            for (int q = 0; q < nproc; q++) {
                if (rp[q].running) rp[q].terminated = 1;
                signal_group(&rp[q], SIGTERM);
            }
            if (!failed_code) failed_code = 124;
        }
        if (terminating && kill_at > 0 && now_s() > kill_at) {
            for (int q = 0; q < nproc; q++)
                signal_group(&rp[q], SIGKILL);
            kill_at = 0;
        }
        for (int q = 0; q < nproc; q++) {
            if (!rp[q].running && rp[q].group && rp[q].group_end > 0 && now_s() > rp[q].group_end) {
                signal_group(&rp[q], SIGKILL);
                rp[q].group_end = 0;
            }
            if (!rp[q].running && rp[q].group) signal_group(&rp[q], 0); /* still anyone? */
        }
    }
    for (int q = 0; q < nproc; q++) { /* nothing of the job outlives the launcher */
        signal_group(&rp[q], SIGKILL);
        if (rp[q].pid) remove_segments(rp[q].pid, q);
    }
    free(pf);
    free(who);
    int ok_ranks = 0;
    for (int r = 0; r < nproc; r++)
        ok_ranks += rp[r].pid && WIFEXITED(rp[r].status) && WEXITSTATUS(rp[r].status) == 0;
    if (elastic && ok_ranks == 0 && !failed_code) failed_code = 1;
    if (frdir) summarise_dumps(frdir);
    snprintf(fields, sizeof fields,
             "{\"exit_code\":%d,\"ranks_ok\":%d,\"nproc\":%lld,\"seconds\":%.3f}", failed_code,
             ok_ranks, nproc, now_s() - t0);
    if (failed_code)
        event("end", fields, "%d of %lld ranks succeeded; exit status %d%s", ok_ranks, nproc,
              failed_code, first_failed >= 0 ? " (from the first rank that failed)" : "");
    else
        event("end", fields, "%d of %lld ranks succeeded in %.2f s", ok_ranks, nproc, now_s() - t0);
    free(rp);
    free(exe);
    ct_store_server_free(srv);
    if (secret[0]) { /* ours: not for whatever this process runs next */
        unsetenv("CT_JOB_SECRET");
        memset(secret, 0, sizeof secret);
    }
    return failed_code;
}
