/* ctorch bench kernels: each kernel family's rate on every instruction set this CPU has,
 * beside scalar and beside this machine's bounds measured in the same run (a streaming copy
 * for GB/s, an FMA loop for GFLOP/s). One thread: the kernels are per row / per tile, the
 * threading is the callers'. Each case also reports its error against the double reference
 * of tests/ref/ref_kernels.h on its own data. */
#include "bench_util.h"

#include "attention/attn_kernels.h"
#include "core/convert_kernels.h"
#include "ops/elementwise_kernels.h"
#include "ops/norm_kernels.h"
#include "ops/reduce_kernels.h"
#include "ops/rope_kernels.h"
#include "ops/softmax_kernels.h"
#include "ops/vecmath_kernels.h"
#include "ref/ref_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { ROW_C = 4096, ROWS = 256, EW_N = 1 << 20, CONV_N = 1 << 24, TILE = 64 };

typedef struct {
    ct_isa isa;
    int which;
    float *x, *y, *w, *o, *rstd;
    uint16_t *h;
} kcase;

enum { K_EXPSUM, K_DOT, K_SOFTMAX, K_ARGMAX, K_GELU, K_SWIGLU, K_RMS, K_ROPE, K_TOBF16, K_FROMBF16, K_TILE_GEMM, K_TILE_SOFTMAX, K_COUNT };
static const struct {
    const char *family, *kernel, *unit;
} kinfo[K_COUNT] = {
    {"rows", "vexpsum (softmax / CE row, C=4096)", "rows/s"},
    {"rows", "vdot (C=4096)", "rows/s"},
    {"softmax", "softmax rows f32 (C=4096)", "rows/s"},
    {"reductions", "argmax rows f32 (C=4096)", "rows/s"},
    {"activations", "gelu erf forward f32 (2^20)", "GB/s"},
    {"activations", "swiglu forward f32 (2^20)", "GB/s"},
    {"norms", "rmsnorm forward rows f32 (C=4096)", "rows/s"},
    {"rope", "rope rotation rows f32 (E=128)", "GB/s"},
    {"conversions", "f32 -> bf16 (2^24)", "GB/s"},
    {"conversions", "bf16 -> f32 (2^24)", "GB/s"},
    {"attention", "tile product 64x64x64", "GFLOP/s"},
    {"attention", "online softmax tile 64x64", "rows/s"},
};

static double work(int which) /* units of work per call */
{
    switch (which) {
    case K_EXPSUM: case K_DOT: case K_SOFTMAX: case K_ARGMAX: case K_RMS: return ROWS;
    case K_GELU: return 8.0 * EW_N / 1e9;
    case K_SWIGLU: return 12.0 * EW_N / 1e9;
    case K_TOBF16: case K_FROMBF16: return 6.0 * CONV_N / 1e9;
    case K_ROPE: return 8.0 * EW_N / 1e9; /* read + write the rows (the table is cache resident) */
    case K_TILE_GEMM: return 2.0 * TILE * TILE * TILE * 16 / 1e9;
    default: return TILE * 16; /* rows of S (queries) per call */
    }
}

/* Bytes moved per unit of work (a row) for the row kernels, 0 where not meaningful. */
static double row_bytes(int which)
{
    switch (which) {
    case K_EXPSUM: case K_DOT: case K_SOFTMAX: case K_RMS: return 8.0 * ROW_C;
    case K_ARGMAX: return 4.0 * ROW_C; /* read a row */ /* read a row + write / read another */
    default: return 0;
    }
}

static volatile float sink;

static ct_status run_case(void *p)
{
    kcase *c = p;
    float acc = 0;
    switch (c->which) {
    case K_EXPSUM:
        for (int r = 0; r < ROWS; r++) acc += ct_vec_tables[c->isa]->vexpsum(c->o, c->x + (size_t)r * ROW_C, 1.0f, ROW_C);
        break;
    case K_DOT:
        for (int r = 0; r < ROWS; r++) acc += ct_vec_tables[c->isa]->vdot(c->x + (size_t)r * ROW_C, c->y, ROW_C);
        break;
    case K_SOFTMAX: ct_softmax_tables[c->isa]->softmax_rows(c->o, c->x, 0, ROWS, ROW_C); break;
    case K_ARGMAX: {
        int64_t idx[ROWS];
        ct_reduce_tables[c->isa]->extreme_rows(NULL, idx, c->x, 0, ROWS, ROW_C, 1);
        acc += (float)idx[ROWS - 1];
        break;
    }
    case K_GELU: ct_elementwise_tables[c->isa]->act_forward(0, c->o, c->x, EW_N, 0); break;
    case K_SWIGLU: ct_elementwise_tables[c->isa]->swiglu_forward(c->o, c->x, c->y, EW_N, 0); break;
    case K_RMS: ct_norm_tables[c->isa]->rms_forward_rows(c->o, c->rstd, c->x, c->w, 0, ROWS, ROW_C, 1e-5f, 0); break;
    case K_ROPE: /* 2^20 floats = 8192 rows of E = 128, T = 256 positions of H = 32 rows each */
        ct_rope_tables[c->isa]->rotate_rows(c->o, c->x, c->w, 0, EW_N / 128, 256, 32, 64, 1.0f);
        break;
    case K_TOBF16: ct_convert_tables[c->isa]->f32_to_bf16(c->h, c->o, CONV_N); break;
    case K_FROMBF16: ct_convert_tables[c->isa]->bf16_to_f32(c->o, c->h, CONV_N); break;
    case K_TILE_GEMM:
        for (int t = 0; t < 16; t++)
            ct_attn_tables[c->isa]->gemm(TILE, TILE, TILE, c->x + t * TILE * TILE, TILE, 1, c->y, TILE,
                                         c->o + t * TILE * TILE, TILE, false, NULL);
        break;
    default:
        for (int t = 0; t < 16; t++) {
            float m[TILE], l[TILE], al[TILE];
            for (int i = 0; i < TILE; i++) m[i] = -INFINITY, l[i] = 0;
            memcpy(c->o, c->x + t * TILE * TILE, 4 * TILE * TILE);
            ct_attn_tables[c->isa]->softmax_update(c->o, TILE, TILE, TILE, m, l, al);
            acc += l[0];
        }
    }
    sink = acc;
    return CT_OK;
}

/* Error of the case's output against the double reference (relative, max over checked values). */
static double case_error(kcase *c)
{
    double e = 0;
    run_case(c);
    if (c->which == K_EXPSUM) {
        float s = ct_vec_tables[c->isa]->vexpsum(NULL, c->x, 1.0f, ROW_C);
        double r = ref_vexpsum(NULL, c->x, 1.0f, ROW_C);
        e = fabs(s - r) / r;
    } else if (c->which == K_GELU) {
        for (int i = 0; i < 4096; i++) {
            double r = ref_act(c->x[i], 0);
            e = fmax(e, fabs(c->o[i] - r) / (fabs(r) + 1e-3));
        }
    } else if (c->which == K_RMS) {
        double *y = malloc(sizeof(double) * ROW_C);
        ref_rmsnorm_row(y, c->x, c->w, ROW_C, 1e-5);
        for (int i = 0; i < ROW_C; i++) e = fmax(e, fabs(c->o[i] - y[i]) / (fabs(y[i]) + 1e-3));
        free(y);
    } else if (c->which == K_SOFTMAX) {
        double *y = malloc(sizeof(double) * ROW_C);
        ref_softmax_row(y, c->x, ROW_C);
        for (int i = 0; i < ROW_C; i++) e = fmax(e, fabs(c->o[i] - y[i]) / (fabs(y[i]) + 1e-30));
        free(y);
    } else if (c->which == K_ARGMAX) {
        int64_t idx[ROWS];
        ct_reduce_tables[c->isa]->extreme_rows(NULL, idx, c->x, 0, ROWS, ROW_C, 1);
        for (int r = 0; r < ROWS; r++) e += idx[r] != ref_extreme_index(c->x + (size_t)r * ROW_C, ROW_C, 1);
    } else if (c->which == K_TOBF16) {
        for (int i = 0; i < 4096; i++) e += c->h[i] != ref_f32_to_bf16(c->o[i]);
    } else {
        return -1; /* not checked here (tests/c/test_kernels_isa.c covers it) */
    }
    return e;
}

/* ---- machine bounds ---------------------------------------------------------------------- */

static double copy_gbs(int repeats)
{
    size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0;
    for (int r = 0; r < repeats + 1; r++) {
        double t0 = bench_now();
        memcpy(b, a, n);
        double t = bench_now() - t0;
        sink = (float)b[n / 2];
        if (r && 2.0 * n / t / 1e9 > best) best = 2.0 * n / t / 1e9; /* read + write */
    }
    free(a), free(b);
    return best;
}

#if defined(__x86_64__)
/* 12 independent FMA chains (more than 2 pipes x 5 cycles of latency). */
__attribute__((target("avx2,fma"))) static double fma_avx2(long iters)
{
    __m256 a[12], m = _mm256_set1_ps(0.999999f), k = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (long t = 0; t < iters; t++)
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], m, k);
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    sink = out[0];
    return 12.0 * 8 * 2 * (double)iters;
}
__attribute__((target("avx512f"))) static double fma_avx512(long iters)
{
    __m512 a[12], m = _mm512_set1_ps(0.999999f), k = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long t = 0; t < iters; t++)
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], m, k);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    sink = _mm512_reduce_add_ps(s);
    return 12.0 * 16 * 2 * (double)iters;
}
#endif

static double fma_gflops(ct_isa isa, int repeats)
{
    double best = 0;
#if defined(__x86_64__)
    /* short runs, best of many: a loaded machine preempts some of them */
    for (int r = 0; r < 4 * repeats + 1; r++) {
        double t0 = bench_now();
        double f = isa == CT_ISA_AVX512 ? fma_avx512(2000000) : fma_avx2(2000000);
        double t = bench_now() - t0;
        if (r && f / t / 1e9 > best) best = f / t / 1e9;
    }
#endif
    return best;
}

int bench_kernels(bench_ctx *b, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: ctorch bench kernels [--json] [--repeats R]\n"
                   "each kernel family on every instruction set this CPU has (one thread), beside\n"
                   "scalar and the machine's streaming-copy GB/s and FMA-loop GFLOP/s\n");
            return 0;
        }
        fprintf(stderr, "ctorch bench kernels: unknown option '%s'\n", argv[i]);
        return 2;
    }
    int old_threads = ct_num_threads();
    ct_set_num_threads(1);
    ct_isa isas[CT_ISA_COUNT];
    int nisa = 0;
    json_t *skipped = json_array();
    for (int i = 0; i < CT_ISA_COUNT; i++) {
        if (ct_cpu_has_isa((ct_isa)i)) isas[nisa++] = (ct_isa)i;
        else json_array_append_new(skipped, json_string(ct_isa_name((ct_isa)i)));
    }
    ct_isa best = isas[nisa - 1];
    double copy = copy_gbs(b->repeats);
    double fma = best == CT_ISA_SCALAR ? 0 : fma_gflops(best, b->repeats);
    json_t *out = json_pack("{s:s, s:o, s:s, s:{s:f, s:f, s:s}, s:o}", "bench", "kernels", "machine",
                            bench_machine_json(0), "cpu", ct_cpu_name(), "bounds", "copy_gbs", copy,
                            "fma_gflops_1core", fma, "fma_isa", ct_isa_name(best), "isa_skipped", skipped);
    if (!b->json) {
        printf("kernels on %s, 1 thread; bounds measured now: streaming copy %.1f GB/s, %s FMA loop %.1f "
               "GFLOP/s (1 core)\n", ct_cpu_name(), copy, ct_isa_name(best), fma);
        for (size_t i = 0; i < json_array_size(skipped); i++)
            printf("  %s: SKIPPED (this CPU lacks it)\n", json_string_value(json_array_get(skipped, i)));
        printf("%-12s %-38s %-8s %12s %9s %10s %10s\n", "family", "kernel", "isa", "rate", "unit",
               "vs scalar", "vs bound");
    }
    json_t *rows = json_array();
    float *x = malloc(sizeof(float) * CONV_N), *y = malloc(sizeof(float) * CONV_N);
    float *o = malloc(sizeof(float) * CONV_N), *w = malloc(sizeof(float) * 256 * 128), rstd[ROWS];
    uint16_t *h = malloc(2 * (size_t)CONV_N);
    bench_fill(x, CONV_N, 1, 4.0f);
    bench_fill(y, CONV_N, 2, 1.0f);
    bench_fill(o, CONV_N, 3, 100.0f);
    bench_fill(w, 256 * 128, 4, 1.0f); /* RMSNorm weight (first ROW_C), RoPE table [256, 128] */
    ct_convert_tables[CT_ISA_SCALAR]->f32_to_bf16(h, o, CONV_N);
    int rc = 0;
    for (int k = 0; k < K_COUNT && !rc; k++) {
        double scalar_rate = 0;
        for (int ii = 0; ii < nisa; ii++) {
            kcase c = {isas[ii], k, x, y, w, o, rstd, h};
            if (k == K_TOBF16) bench_fill(o, CONV_N, 3, 100.0f);
            bench_time t;
            if (bench_time_fn(b->repeats, run_case, &c, &t) != CT_OK) {
                rc = cli_fail("bench kernels", CT_EINVAL);
                break;
            }
            double rate = work(k) / t.median;
            if (isas[ii] == CT_ISA_SCALAR) scalar_rate = rate;
            double err = case_error(&c);
            bool gb = !strcmp(kinfo[k].unit, "GB/s"), gf = !strcmp(kinfo[k].unit, "GFLOP/s");
            double rb = row_bytes(k);
            double frac = gb ? rate / copy : gf && fma > 0 ? rate / fma : rb > 0 ? rate * rb / 1e9 / copy : -1;
            json_t *row = json_pack("{s:s, s:s, s:s, s:f, s:s, s:f, s:o}", "family", kinfo[k].family,
                                    "kernel", kinfo[k].kernel, "isa", ct_isa_name(isas[ii]), "rate", rate,
                                    "unit", kinfo[k].unit, "vs_scalar", rate / scalar_rate, "time",
                                    bench_time_json(&t));
            if (rb > 0) json_object_set_new(row, "gbs", json_real(rate * rb / 1e9));
            if (frac >= 0) json_object_set_new(row, gf ? "fraction_of_fma" : "fraction_of_copy", json_real(frac));
            if (err >= 0) json_object_set_new(row, k == K_TOBF16 || k == K_ARGMAX ? "mismatches_vs_ref" : "max_rel_err_vs_ref",
                                              json_real(err));
            json_array_append_new(rows, row);
            if (!b->json) {
                char fb[16] = "-";
                if (frac >= 0) snprintf(fb, sizeof fb, "%.2f", frac);
                printf("%-12s %-38s %-8s %12.4g %9s %9.2fx %10s\n", kinfo[k].family, kinfo[k].kernel,
                       ct_isa_name(isas[ii]), rate, kinfo[k].unit, rate / scalar_rate, fb);
            }
        }
    }
    /* the FMA bound again after the cases, the better of the two kept (a loaded machine
     * preempts some runs) */
    if (best != CT_ISA_SCALAR) {
        double again = fma_gflops(best, b->repeats);
        if (again > fma) json_object_set_new(json_object_get(out, "bounds"), "fma_gflops_1core", json_real(again));
        if (!b->json) printf("FMA loop again after the cases: %.1f GFLOP/s\n", again);
    }
    json_object_set_new(out, "kernels", rows);
    if (b->json && !rc) bench_print_json(out);
    json_decref(out);
    free(x), free(y), free(o), free(w), free(h);
    ct_set_num_threads(old_threads);
    return rc;
}

/* The 1-core FMA-loop GFLOP/s of the best instruction set (for `ctorch bench gemm`). */
double bench_fma_gflops_1core(int repeats)
{
    ct_isa best = ct_cpu_has_isa(CT_ISA_AVX512) ? CT_ISA_AVX512 : ct_cpu_has_isa(CT_ISA_AVX2) ? CT_ISA_AVX2 : CT_ISA_SCALAR;
    return best == CT_ISA_SCALAR ? 0 : fma_gflops(best, repeats);
}
