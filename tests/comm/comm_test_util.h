/* Helpers shared by the communication tests: deterministic per-rank inputs in every dtype,
 * and running this test program itself as the ranks of `ctorch launch`. */
#ifndef CT_COMM_TEST_UTIL_H
#define CT_COMM_TEST_UTIL_H

#include "ctorch/ctorch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Small integers (exact in every dtype and every order of summation): -5..5, or 0..10 for u8. */
static inline double ct_val(int p, size_t i, int seed, ct_dtype dt)
{
    int v = (int)((i * 7 + (size_t)p * 13 + (size_t)seed * 5) % 11) - 5;
    return dt == CT_DTYPE_U8 ? v + 5 : v;
}

static inline void ct_put(ct_dtype dt, void *buf, size_t i, double v)
{
    switch (dt) {
    case CT_DTYPE_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case CT_DTYPE_F64:
        ((double *)buf)[i] = v;
        break;
    case CT_DTYPE_F16:
        ((uint16_t *)buf)[i] = ct_f32_to_f16((float)v);
        break;
    case CT_DTYPE_BF16:
        ((uint16_t *)buf)[i] = ct_f32_to_bf16((float)v);
        break;
    case CT_DTYPE_I32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case CT_DTYPE_I64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case CT_DTYPE_U8:
        ((uint8_t *)buf)[i] = (uint8_t)(int)v;
        break;
    default:
        break;
    }
}

static inline double ct_get(ct_dtype dt, const void *buf, size_t i)
{
    switch (dt) {
    case CT_DTYPE_F32:
        return ((const float *)buf)[i];
    case CT_DTYPE_F64:
        return ((const double *)buf)[i];
    case CT_DTYPE_F16:
        return ct_f16_to_f32(((const uint16_t *)buf)[i]);
    case CT_DTYPE_BF16:
        return ct_bf16_to_f32(((const uint16_t *)buf)[i]);
    case CT_DTYPE_I32:
        return ((const int32_t *)buf)[i];
    case CT_DTYPE_I64:
        return (double)((const int64_t *)buf)[i];
    case CT_DTYPE_U8:
        return ((const uint8_t *)buf)[i];
    default:
        return 0;
    }
}

/* Round v to what dtype dt stores. */
static inline double ct_round_to(ct_dtype dt, double v)
{
    switch (dt) {
    case CT_DTYPE_F32:
        return (float)v;
    case CT_DTYPE_F16:
        return ct_f16_to_f32(ct_f32_to_f16((float)v));
    case CT_DTYPE_BF16:
        return ct_bf16_to_f32(ct_f32_to_bf16((float)v));
    case CT_DTYPE_U8:
        return (double)(uint8_t)(int64_t)v;
    default:
        return v;
    }
}

/* Serial reference of op over ranks 0..P-1 of ct_val(p, i, seed). */
static inline double ct_ref(ct_dtype dt, ct_reduce_op op, int P, size_t i, int seed)
{
    double acc = ct_val(0, i, seed, dt);
    for (int p = 1; p < P; p++) {
        double x = ct_val(p, i, seed, dt);
        switch (op) {
        case CT_REDUCE_SUM:
        case CT_REDUCE_AVG:
            acc += x;
            break;
        case CT_REDUCE_PROD:
            acc *= x;
            break;
        case CT_REDUCE_MAX:
            acc = acc > x ? acc : x;
            break;
        case CT_REDUCE_MIN:
            acc = acc < x ? acc : x;
            break;
        }
    }
    if (dt == CT_DTYPE_U8) acc = (double)((uint64_t)(int64_t)acc & 0xFF);
    if (op == CT_REDUCE_AVG) acc = dt == CT_DTYPE_F64 ? acc / P : (double)((float)acc / (float)P);
    return ct_round_to(dt, acc);
}

static inline double ct_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void ct_sleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Run `ctorch launch <launch_args...> -- <this program> --worker <mode>` with extra
 * environment (NAME=VALUE strings, NULL-terminated), capturing its output into `out`
 * (cap bytes, may be NULL). Returns the launcher's exit status, -1 if it could not run. */
static inline int ct_run_launch(const char *const *launch_args, const char *mode,
                                const char *const *env, char *out, size_t cap)
{
    const char *cli = getenv("CTORCH_CLI");
    if (!cli || !*cli) {
        fprintf(stderr, "CTORCH_CLI is not set (run through ctest)\n");
        return -1;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = 0;
    const char *argv[64];
    int k = 0;
    argv[k++] = cli;
    argv[k++] = "launch";
    for (int i = 0; launch_args[i] && k < 56; i++)
        argv[k++] = launch_args[i];
    argv[k++] = "--";
    argv[k++] = self;
    argv[k++] = "--worker";
    argv[k++] = mode;
    argv[k] = NULL;
    int fd[2];
    if (pipe(fd) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        execv(cli, (char *const *)argv);
        _exit(127);
    }
    close(fd[1]);
    size_t len = 0;
    char buf[4096];
    ssize_t r;
    while ((r = read(fd[0], buf, sizeof buf)) > 0) {
        fwrite(buf, 1, (size_t)r, stdout); /* the ctest log shows the ranks' output */
        if (out && len + 1 < cap) {
            size_t m = (size_t)r < cap - 1 - len ? (size_t)r : cap - 1 - len;
            memcpy(out + len, buf, m);
            len += m;
        }
    }
    if (out) out[len] = 0;
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    fflush(stdout);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

#endif
