#include "bench_util.h"

#ifdef __linux__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

ct_status bench_time_fn(int repeats, ct_status (*fn)(void *), void *arg, bench_time *out)
{
    double t[64];
    if (repeats < 1) repeats = 1;
    if (repeats > 64) repeats = 64;
    ct_status s = fn(arg);
    if (s != CT_OK) return s;
    for (int r = 0; r < repeats; r++) {
        double t0 = bench_now();
        s = fn(arg);
        t[r] = bench_now() - t0;
        if (s != CT_OK) return s;
    }
    bench_time_of(t, repeats, out);
    return CT_OK;
}

void bench_time_of(double *t, int repeats, bench_time *out)
{
    qsort(t, (size_t)repeats, sizeof t[0], cmp_double);
    out->repeats = repeats;
    out->min = t[0];
    out->max = t[repeats - 1];
    out->median = repeats % 2 ? t[repeats / 2] : 0.5 * (t[repeats / 2 - 1] + t[repeats / 2]);
}

size_t bench_peak_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = strtoull(line + 6, NULL, 10);
    fclose(f);
    return kb * 1024;
}

size_t bench_rss_anon(void)
{
#ifdef __GLIBC__
    /* give back what the allocator keeps of freed blocks, or reusing it hides the growth */
    malloc_trim(0);
#endif
    size_t kb = 0;
    bool found = false;
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    while (f && !found && fgets(line, sizeof line, f))
        found = sscanf(line, "RssAnon: %zu kB", &kb) == 1;
    if (f) fclose(f);
    if (found) return kb * 1024;
    /* kernels (and sandboxes) without RssAnon: resident minus file-backed pages */
    unsigned long long size = 0, resident = 0, shared = 0;
    f = fopen("/proc/self/statm", "r");
    bool ok = f && fscanf(f, "%llu %llu %llu", &size, &resident, &shared) == 3;
    if (f) fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    if (!ok || page <= 0 || resident < shared) return 0;
    return (size_t)(resident - shared) * (size_t)page;
}

typedef struct {
    float *a, *b, *c;
    int64_t n;
} sq_gemm;

static ct_status run_sq(void *p)
{
    sq_gemm *g = p;
    return ct_gemm_f32(false, false, g->n, g->n, g->n, 1.0f, g->a, 0, g->b, 0, 0.0f, g->c, 0);
}

double bench_sgemm_gflops(void)
{
    sq_gemm g = {NULL, NULL, NULL, 2048};
    size_t n2 = (size_t)g.n * g.n;
    if (ct_alloc((void **)&g.a, n2 * 4) || ct_alloc((void **)&g.b, n2 * 4) || ct_alloc((void **)&g.c, n2 * 4)) {
        ct_free(g.a);
        ct_free(g.b);
        return 0;
    }
    bench_fill(g.a, n2, 1, 1.0f);
    bench_fill(g.b, n2, 2, 1.0f);
    bench_time t = {0};
    ct_status s = bench_time_fn(5, run_sq, &g, &t);
    ct_free(g.a);
    ct_free(g.b);
    ct_free(g.c);
    return s == CT_OK ? 2.0 * g.n * g.n * g.n / t.median * 1e-9 : 0;
}

json_t *bench_time_json(const bench_time *t)
{
    return json_pack("{s:f, s:f, s:f, s:i}", "median_s", t->median, "min_s", t->min, "max_s", t->max, "repeats",
                     t->repeats);
}

/* Run argv, capture stdout, parse it as JSON. */
static json_t *run_json(char *const argv[], bool quiet_missing)
{
    int fd[2];
    if (pipe(fd) != 0) return NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return NULL;
    }
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execv(argv[0], argv);
        if (!quiet_missing) fprintf(stderr, "ctorch bench: cannot run %s\n", argv[0]);
        _exit(127);
    }
    close(fd[1]);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while (buf && (r = read(fd[0], buf + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            } else {
                buf = nb;
            }
        }
    }
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!buf) return NULL;
    buf[len] = 0;
    json_t *j = NULL;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        json_error_t err;
        j = json_loads(buf, 0, &err);
    }
    free(buf);
    if (!j && !(quiet_missing && WIFEXITED(st) && WEXITSTATUS(st) == 127))
        fprintf(stderr, "ctorch bench: %s failed (status %d)\n", argv[0], st);
    return j;
}

json_t *bench_child(const bench_ctx *b, char *const args[])
{
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)b->exe;
    argv[n++] = "bench";
    for (int i = 0; args[i] && n < 60; i++) argv[n++] = args[i];
    argv[n++] = "--json";
    argv[n] = NULL;
    return run_json(argv, false);
}

json_t *bench_python(const char *script, char *const args[])
{
    const char *dir = cli_source_dir();
    if (!dir) return json_pack("{s:s, s:s}", "status", "not installed", "why", "bench/ scripts not found");
    /* $CTORCH_PYTHON, else the source tree's .venv (scripts/setup.sh --python makes it) */
    char venv[4096];
    const char *py = getenv("CTORCH_PYTHON");
    if (!py || !*py) {
        snprintf(venv, sizeof venv, "%s/.venv/bin/python", dir);
        py = venv;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/bench/%s", dir, script);
    if (access(py, X_OK) != 0)
        return json_pack("{s:s, s:s}", "status", "not installed", "why",
                         "no python with PyTorch: run bash scripts/setup.sh --python (makes .venv) or set CTORCH_PYTHON");
    if (access(path, R_OK) != 0) return json_pack("{s:s, s:s}", "status", "not installed", "why", path);
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)py;
    argv[n++] = path;
    for (int i = 0; args[i] && n < 62; i++) argv[n++] = args[i];
    argv[n] = NULL;
    json_t *j = run_json(argv, true);
    return j ? j : json_pack("{s:s}", "status", "failed or torch not installed");
}

void bench_fill(float *x, size_t n, uint64_t seed, float scale)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = scale * (float)((double)(s >> 40) / 8388608.0 - 1.0);
    }
}

void bench_print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    if (s) puts(s);
    free(s);
}

json_t *bench_machine_json(double sgemm)
{
    return json_pack("{s:i, s:s, s:s, s:b, s:f}", "threads", ct_num_threads(), "isa",
                     ct_isa_name(ct_active_isa()), "cpu", ct_cpu_name(), "bf16_dot",
                     (int)ct_cpu_has_bf16(), "sgemm_gflops", sgemm);
}
