/* The benchmark protocol of docs/benchmarks.md: warm-up + median of repeats, tracked peak
 * bytes, peak RSS (one case per process), the machine's sgemm rate measured first. */
#ifndef CT_BENCH_UTIL_H
#define CT_BENCH_UTIL_H

#include "cli.h"

#include <jansson.h>

typedef struct bench_time {
    double median, min, max;
    int repeats;
} bench_time;

typedef struct bench_ctx {
    bool json;     /* --json: one JSON object on stdout */
    int repeats;   /* timed repeats after one warm-up (>= 3) */
    const char *name;
    const char *exe; /* path of this program, to run cases in child processes */
} bench_ctx;

typedef int (*bench_fn)(bench_ctx *b, int argc, char **argv);

double bench_now(void);
/* Run fn once to warm up, then `repeats` times; fails on the first non-OK status. */
ct_status bench_time_fn(int repeats, ct_status (*fn)(void *), void *arg, bench_time *out);
/* Median, min and max of t[0..repeats) (sorts t). */
void bench_time_of(double *t, int repeats, bench_time *out);
/* Peak resident set size of this process in bytes (VmHWM), 0 if unknown. */
size_t bench_peak_rss(void);
/* Anonymous resident bytes of this process (RssAnon, else statm's resident - shared pages),
 * after handing freed heap memory back to the system (glibc malloc_trim) so that a growth
 * measured between two calls is not hidden by the allocator reusing freed pages; 0 if unknown. */
size_t bench_rss_anon(void);
/* Measured sgemm GFLOP/s (square 2048, median of 5), for the ratio of every benchmark. */
double bench_sgemm_gflops(void);
/* JSON object of a bench_time {"median_s", "min_s", "max_s", "repeats"}. */
json_t *bench_time_json(const bench_time *t);
/* Run `exe bench <args...> --json` in a child process and parse its JSON output; NULL (and a
 * message on stderr) if it failed. */
json_t *bench_child(const bench_ctx *b, char *const args[]);
/* Run the PyTorch baseline script bench/<script> with $CTORCH_PYTHON, else the source tree's
 * .venv/bin/python (scripts/setup.sh --python);
 * returns its JSON, or {"status": "not installed" | "failed", ...}. */
json_t *bench_python(const char *script, char *const args[]);
/* Fill x[0..n) with deterministic values in [-scale, scale). */
void bench_fill(float *x, size_t n, uint64_t seed, float scale);
/* Print a JSON value (indented) or nothing. */
void bench_print_json(json_t *j);
/* The common header: machine figures (threads, isa, the CPU's name, whether it has bf16 dot
 * instructions ("bf16_dot": AVX512_BF16 / AArch64 BF16), sgemm rate). */
json_t *bench_machine_json(double sgemm);

/* bench train's model and batch (bench_train.c), shared with bench scaling: the stream of
 * B windows of T + 1 corpus tokens (malloc'd; NULL on failure), the step's options for a case
 * name ("fused-flex", "unfused-flex", "fused-dense"), and the weights file (parameters, the
 * batch as "tokens" [B, T+1], config and train metadata) that bench/torch_train.py reads;
 * the last returns 0 or prints the failure and returns non-zero. */
typedef struct bench_train_conf {
    ct_gpt_config cfg;
    long long batch;
} bench_train_conf;
int32_t *bench_train_stream(const bench_train_conf *c, int64_t *n);
ct_train_options bench_train_options(const bench_train_conf *c, const char *name);
int bench_train_write_weights(const bench_train_conf *c, const char *path);

int bench_gemm(bench_ctx *b, int argc, char **argv);
int bench_lce(bench_ctx *b, int argc, char **argv);
int bench_flex(bench_ctx *b, int argc, char **argv);
int bench_io(bench_ctx *b, int argc, char **argv);
int bench_train(bench_ctx *b, int argc, char **argv);
int bench_compile(bench_ctx *b, int argc, char **argv);
int bench_comm(bench_ctx *b, int argc, char **argv);
int bench_generate(bench_ctx *b, int argc, char **argv);
int bench_tokenizer(bench_ctx *b, int argc, char **argv);
int bench_fsdp(bench_ctx *b, int argc, char **argv);
int bench_hf(bench_ctx *b, int argc, char **argv);
int bench_kernels(bench_ctx *b, int argc, char **argv);
int bench_scaling(bench_ctx *b, int argc, char **argv);
int bench_cuda(bench_ctx *b, int argc, char **argv);
/* 1-core FMA-loop GFLOP/s of the best instruction set (0 without SIMD); bench_kernels.c. */
double bench_fma_gflops_1core(int repeats);

#endif
