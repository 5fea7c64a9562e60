/* ctorch bench lce: fused linear cross-entropy vs the unfused path (ct_linear +
 * ct_cross_entropy) and PyTorch 2.13 (bench/torch_baseline.py): F.linear_cross_entropy with
 * nn.LinearCrossEntropyOptions() (chunked) and without (reference), F.linear + F.cross_entropy
 * eager and torch.compile'd; forward + backward, each case in its own process so its peak RSS is
 * its own. */
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    long long n, d, v;
    bool bf16;
    double smoothing;
    size_t scratch;
    bool fused;
    void *h, *w;      /* f32 or bf16 */
    float *hf, *wf;   /* f32 copies for the unfused bf16 path */
    int64_t *y;
    float *dh, *dw;
    float *logits, *dlogits; /* the unfused path's buffers when preallocated (--interleaved) */
    float loss;
} lce_case;

static ct_status step_fused(void *p)
{
    lce_case *c = p;
    ct_ce_options o = ct_ce_options_default();
    o.label_smoothing = (float)c->smoothing;
    if (c->scratch) o.scratch_bytes = c->scratch;
    ct_lce_inputs in = {c->h, c->w, NULL, c->bf16 ? CT_DTYPE_BF16 : CT_DTYPE_F32, c->y, CT_DTYPE_I64, c->n, c->d, c->v};
    ct_ce_outputs out = {&c->loss, NULL, NULL};
    ct_lce_grads g = {c->dh, c->dw, NULL, false};
    return ct_linear_cross_entropy_forward_backward(&out, &g, NULL, &in, &o);
}

static ct_status step_unfused(void *p)
{
    lce_case *c = p;
    ct_ce_options o = ct_ce_options_default();
    o.label_smoothing = (float)c->smoothing;
    const float *h = c->bf16 ? c->hf : c->h, *w = c->bf16 ? c->wf : c->w;
    size_t nv = (size_t)c->n * (size_t)c->v * 4;
    float *logits = c->logits, *dlogits = c->dlogits, one = 1.0f;
    bool own = !logits; /* allocated per call, as a plain user would (the case's own process) */
    ct_status s = own ? ct_alloc((void **)&logits, nv) : CT_OK;
    if (!s && own) s = ct_alloc((void **)&dlogits, nv);
    if (!s) s = ct_linear_forward(logits, h, w, NULL, c->n, c->d, c->v);
    ct_ce_outputs out = {&c->loss, NULL, NULL};
    if (!s) s = ct_cross_entropy_forward(&out, logits, c->y, CT_DTYPE_I64, c->n, c->v, &o);
    if (!s) s = ct_cross_entropy_backward(dlogits, &one, logits, c->y, CT_DTYPE_I64, c->n, c->v, &o);
    if (!s) memset(c->dw, 0, (size_t)c->v * (size_t)c->d * 4);
    if (!s) s = ct_linear_backward(c->dh, c->dw, NULL, dlogits, h, w, c->n, c->d, c->v);
    if (own) {
        ct_free(logits);
        ct_free(dlogits);
    }
    return s;
}

static void *alloc_or_die(size_t bytes)
{
    void *p;
    ct_status s = ct_alloc(&p, bytes);
    if (s != CT_OK) {
        cli_fail("bench lce", s);
        exit(1);
    }
    return p;
}

/* The inputs and gradients of a case (for both paths when `both`: bf16 inputs keep their f32
 * copies for the unfused path). */
static void case_inputs(lce_case *c, bool both)
{
    size_t nd = (size_t)c->n * c->d, vd = (size_t)c->v * c->d;
    float *hf = alloc_or_die(nd * 4), *wf = alloc_or_die(vd * 4);
    bench_fill(hf, nd, 11, 1.0f);
    bench_fill(wf, vd, 12, 0.05f);
    if (c->bf16) {
        c->h = alloc_or_die(nd * 2);
        c->w = alloc_or_die(vd * 2);
        ct_convert_f32_to_bf16(c->h, hf, nd);
        ct_convert_f32_to_bf16(c->w, wf, vd);
        if (c->fused && !both) {
            ct_free(hf);
            ct_free(wf);
        } else { /* the unfused path computes in f32: round the copies like the bf16 inputs */
            ct_convert_bf16_to_f32(hf, c->h, nd);
            ct_convert_bf16_to_f32(wf, c->w, vd);
            c->hf = hf;
            c->wf = wf;
        }
    } else {
        c->h = hf;
        c->w = wf;
    }
    c->y = alloc_or_die((size_t)c->n * 8);
    uint64_t s = 7;
    for (long long i = 0; i < c->n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        c->y[i] = (int64_t)((s >> 33) % (uint64_t)c->v);
    }
    c->dh = alloc_or_die(nd * 4);
    c->dw = alloc_or_die(vd * 4);
}

static int run_case(bench_ctx *b, lce_case *c)
{
    case_inputs(c, false);
    ct_memory_stats_t m0, m1;
    ct_memory_stats(&m0);
    ct_memory_reset_peak();
    bench_time t;
    ct_status st = bench_time_fn(b->repeats, c->fused ? step_fused : step_unfused, c, &t);
    if (st != CT_OK) return cli_fail("bench lce", st);
    ct_memory_stats(&m1);
    json_t *j = json_pack("{s:s, s:o, s:I, s:I, s:I, s:f}", "case", c->fused ? "fused" : "unfused", "time",
                          bench_time_json(&t), "base_bytes", (json_int_t)m0.current_bytes, "peak_tracked_bytes",
                          (json_int_t)m1.peak_bytes, "peak_rss_bytes", (json_int_t)bench_peak_rss(), "loss",
                          (double)c->loss);
    bench_print_json(j);
    json_decref(j);
    return 0;
}

#define LCE_TORCH_MODES 4
static const char *const lce_torch_modes[LCE_TORCH_MODES] = {"chunked", "reference", "unfused",
                                                             "unfused-compiled"};
static const char *const lce_torch_labels[LCE_TORCH_MODES] = {
    "PyTorch chunked", "PyTorch reference", "PyTorch unfused", "PyTorch compiled"};

/* Whether the comma-separated list names `name`. */
static bool in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return true;
    return false;
}

/* Every name of the comma-separated list is a PyTorch mode; else a message naming it. */
static bool check_modes(const char *list)
{
    const char *p = list;
    do {
        size_t n = strcspn(p, ",");
        bool known = false;
        for (int k = 0; k < LCE_TORCH_MODES && !known; k++)
            known = strlen(lce_torch_modes[k]) == n && !strncmp(p, lce_torch_modes[k], n);
        if (!known) {
            fprintf(stderr, "ctorch bench lce: --torch-modes: unknown mode '%.*s' (modes: chunked, reference, "
                    "unfused, unfused-compiled)\n", (int)(n > 64 ? 64 : n), p);
            return false;
        }
        p += n;
    } while (*p++ == ',');
    return true;
}

static ct_status step_interleaved(void *p)
{
    lce_case *c = p;
    c->fused = !c->fused; /* fused, unfused, fused, ... */
    return c->fused ? step_fused(c) : step_unfused(c);
}

/* --interleaved: both paths in this process, call after call (the unfused one on buffers
 * allocated once, as the trainer holds them), so that a drifting machine weighs on both
 * alike; their medians and the ratio. No memory figures (one process holds both). */
static int run_interleaved(bench_ctx *b, lce_case *c, const char *dt)
{
    case_inputs(c, true);
    size_t nv = (size_t)c->n * (size_t)c->v * 4;
    c->logits = alloc_or_die(nv);
    c->dlogits = alloc_or_die(nv);
    int R = b->repeats;
    double *t[2];
    t[0] = alloc_or_die(sizeof(double) * (size_t)R);
    t[1] = alloc_or_die(sizeof(double) * (size_t)R);
    c->fused = false;
    for (int r = -1; r < R; r++) /* one warm-up pair */
        for (int k = 0; k < 2; k++) {
            double t0 = bench_now();
            ct_status st = step_interleaved(c);
            if (st != CT_OK) return cli_fail("bench lce", st);
            if (r >= 0) t[k][r] = bench_now() - t0;
        }
    bench_time bt[2];
    for (int k = 0; k < 2; k++) bench_time_of(t[k], R, &bt[k]);
    double flops = 6.0 * c->n * c->d * c->v;
    json_t *j = json_pack("{s:s, s:s, s:{s:I, s:I, s:I, s:s, s:f}, s:i, s:o, s:o, s:f}", "bench", "lce", "mode",
                          "interleaved", "shape", "n", (json_int_t)c->n, "d", (json_int_t)c->d, "v",
                          (json_int_t)c->v, "dtype", dt, "label_smoothing", c->smoothing, "threads",
                          ct_num_threads(), "fused", bench_time_json(&bt[0]), "unfused", bench_time_json(&bt[1]),
                          "fused_over_unfused", bt[0].median / bt[1].median);
    if (b->json) {
        bench_print_json(j);
    } else {
        printf("lce N=%lld D=%lld V=%lld %s, fwd+bwd, %d threads, interleaved (%d calls each)\n", c->n, c->d, c->v,
               dt, ct_num_threads(), R);
        for (int k = 0; k < 2; k++)
            printf("  %-16s median %.4f s (%.4f-%.4f), %.1f GFLOP/s\n", k ? "ctorch unfused" : "ctorch fused",
                   bt[k].median, bt[k].min, bt[k].max, flops / bt[k].median * 1e-9);
        printf("  fused / unfused (medians): %.3f\n", bt[0].median / bt[1].median);
        json_decref(j);
    }
    return 0;
}

static double jnum(json_t *o, const char *a, const char *b)
{
    json_t *x = json_object_get(o, a);
    if (b) x = json_object_get(x, b);
    return json_number_value(x);
}

int bench_lce(bench_ctx *b, int argc, char **argv)
{
    lce_case c = {.n = 2048, .d = 1024, .v = 128256, .fused = true};
    const char *which = NULL, *dt = "f32", *tmodes = "chunked,reference,unfused,unfused-compiled";
    long long scratch_mib = 0;
    bool no_compile = false, interleaved = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help")) {
            puts("usage: ctorch bench lce [--n N] [--d D] [--v V] [--dtype f32|bf16] [--label-smoothing E]\n"
                 "                        [--scratch-mib M] [--torch-modes LIST] [--no-torch-compile]\n"
                 "                        [--interleaved] [--repeats R] [--json]\n"
                 "Forward + backward of loss = cross_entropy(h W^T, y), h [N,D], W [V,D]:\n"
                 "fused (ctorch, logits never held) vs unfused (ctorch linear + cross_entropy) vs PyTorch\n"
                 "2.13 (bench/torch_baseline.py), each in its own process. PyTorch modes (LIST, all by\n"
                 "default): chunked (F.linear_cross_entropy, nn.LinearCrossEntropyOptions()), reference\n"
                 "(options=None), unfused (F.linear + F.cross_entropy), unfused-compiled (the same under\n"
                 "torch.compile; --no-torch-compile drops it). Default N=2048 D=1024 V=128256.\n"
                 "--interleaved: fused and unfused alone, alternated call after call in this process (the\n"
                 "unfused path on buffers allocated once, as the trainer holds them): medians and their\n"
                 "ratio, steady on a machine whose speed drifts between processes; no memory figures.");
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--n", &v)) { if (!cli_int("--n", v, 1, 1 << 24, &c.n)) return 2; }
        else if (cli_opt(argc, argv, &i, "--d", &v)) { if (!cli_int("--d", v, 1, 1 << 16, &c.d)) return 2; }
        else if (cli_opt(argc, argv, &i, "--v", &v)) { if (!cli_int("--v", v, 1, 1 << 24, &c.v)) return 2; }
        else if (cli_opt(argc, argv, &i, "--scratch-mib", &v)) { if (!cli_int("--scratch-mib", v, 1, 1 << 20, &scratch_mib)) return 2; }
        else if (cli_opt(argc, argv, &i, "--label-smoothing", &v)) { if (!cli_float("--label-smoothing", v, &c.smoothing)) return 2; }
        else if (cli_opt(argc, argv, &i, "--dtype", &v)) dt = v;
        else if (cli_opt(argc, argv, &i, "--case", &v)) which = v;
        else if (cli_opt(argc, argv, &i, "--torch-modes", &v)) { if (!check_modes(v)) return 2; tmodes = v; }
        else if (!strcmp(argv[i], "--no-torch-compile")) no_compile = true;
        else if (!strcmp(argv[i], "--interleaved")) interleaved = true;
        else {
            fprintf(stderr, "ctorch bench lce: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (strcmp(dt, "f32") && strcmp(dt, "bf16")) {
        fprintf(stderr, "ctorch bench lce: --dtype must be f32 or bf16, got '%s'\n", dt);
        return 2;
    }
    c.bf16 = !strcmp(dt, "bf16");
    c.scratch = (size_t)scratch_mib << 20;
    if (which) {
        c.fused = !strcmp(which, "fused");
        return run_case(b, &c);
    }
    if (interleaved) return run_interleaved(b, &c, dt);
    double sg = bench_sgemm_gflops();
    char sn[32], sd[32], sv[32], sr[32], ss[32], sl[32];
    snprintf(sn, sizeof sn, "%lld", c.n);
    snprintf(sd, sizeof sd, "%lld", c.d);
    snprintf(sv, sizeof sv, "%lld", c.v);
    snprintf(sr, sizeof sr, "%d", b->repeats);
    snprintf(ss, sizeof ss, "%lld", scratch_mib ? scratch_mib : 64);
    snprintf(sl, sizeof sl, "%g", c.smoothing);
    char *fa[] = {"lce", "--case", "fused", "--n", sn, "--d", sd, "--v", sv, "--dtype", (char *)dt, "--repeats", sr,
                  "--scratch-mib", ss, "--label-smoothing", sl, NULL};
    json_t *fused = bench_child(b, fa);
    fa[2] = "unfused";
    json_t *unfused = bench_child(b, fa);
    char st[32];
    snprintf(st, sizeof st, "%d", ct_num_threads());
    json_t *torch = json_object();
    json_t *tm[LCE_TORCH_MODES] = {0};
    for (int k = 0; k < LCE_TORCH_MODES; k++) {
        if (!in_list(tmodes, lce_torch_modes[k]) || (no_compile && strstr(lce_torch_modes[k], "compiled")))
            continue;
        char *pa[] = {"lce", "--mode", (char *)lce_torch_modes[k], "--n", sn, "--d", sd, "--v", sv, "--dtype",
                      (char *)dt, "--repeats", sr, "--label-smoothing", sl, "--threads", st, NULL};
        tm[k] = bench_python("torch_baseline.py", pa);
        json_object_set_new(torch, lce_torch_modes[k], tm[k]);
    }
    if (!fused || !unfused) {
        json_decref(torch);
        return 1;
    }
    double flops = 6.0 * c.n * c.d * c.v;
    double tf = jnum(fused, "time", "median_s"), tu = jnum(unfused, "time", "median_s");
    double xf = jnum(fused, "peak_tracked_bytes", NULL) - jnum(fused, "base_bytes", NULL);
    double xu = jnum(unfused, "peak_tracked_bytes", NULL) - jnum(unfused, "base_bytes", NULL);
    json_object_set_new(fused, "gflops", json_real(flops / tf * 1e-9));
    json_object_set_new(fused, "fraction_of_sgemm", json_real(flops / tf * 1e-9 / sg));
    json_object_set_new(unfused, "gflops", json_real(flops / tu * 1e-9));
    json_object_set_new(unfused, "fraction_of_sgemm", json_real(flops / tu * 1e-9 / sg));
    json_t *j = json_pack("{s:s, s:{s:I, s:I, s:I, s:s, s:f}, s:o, s:o, s:o, s:o, s:{s:f, s:f, s:f}}", "bench", "lce",
                          "shape", "n", (json_int_t)c.n, "d", (json_int_t)c.d, "v", (json_int_t)c.v, "dtype", dt,
                          "label_smoothing", c.smoothing, "machine", bench_machine_json(sg), "fused", fused,
                          "unfused", unfused, "torch", torch, "ratios", "speedup_fused_vs_unfused", tu / tf,
                          "peak_tracked_unfused_over_fused", jnum(unfused, "peak_tracked_bytes", NULL) /
                                                                 jnum(fused, "peak_tracked_bytes", NULL),
                          "extra_bytes_unfused_over_fused", xu / (xf > 0 ? xf : 1));
    /* ctorch's fused loss against each PyTorch mode: time, tracked peak, peak RSS */
    json_t *vs = json_object();
    for (int k = 0; k < LCE_TORCH_MODES; k++) {
        double tt = jnum(tm[k], "median_s", NULL);
        if (!tm[k] || !(tt > 0)) continue;
        json_object_set_new(
            vs, lce_torch_modes[k],
            json_pack("{s:f, s:f, s:f}", "speedup_fused", tt / tf, "peak_tracked_over_fused",
                      jnum(tm[k], "peak_tracked_bytes", NULL) / jnum(fused, "peak_tracked_bytes", NULL),
                      "peak_rss_over_fused", jnum(tm[k], "peak_rss_bytes", NULL) / jnum(fused, "peak_rss_bytes", NULL)));
    }
    json_object_set_new(j, "vs_torch", vs);
    if (b->json) {
        bench_print_json(j);
    } else {
        printf("lce N=%lld D=%lld V=%lld %s, fwd+bwd, %d threads, %s, sgemm %.1f GFLOP/s\n", c.n, c.d, c.v, dt,
               ct_num_threads(), ct_isa_name(ct_active_isa()), sg);
        printf("  %-18s %9s %8s %9s %14s %14s %12s\n", "", "median s", "GFLOP/s", "of sgemm", "peak tracked",
               "above inputs", "peak RSS");
        json_t *cases[2] = {fused, unfused};
        const char *names[2] = {"ctorch fused", "ctorch unfused"};
        for (int k = 0; k < 2; k++) {
            double t = jnum(cases[k], "time", "median_s");
            printf("  %-18s %9.3f %8.1f %8.0f%% %11.1f MiB %11.1f MiB %8.1f MiB\n", names[k], t, flops / t * 1e-9,
                   100 * flops / t * 1e-9 / sg, jnum(cases[k], "peak_tracked_bytes", NULL) / 1048576.0,
                   (k ? xu : xf) / 1048576.0, jnum(cases[k], "peak_rss_bytes", NULL) / 1048576.0);
        }
        const char *tv = NULL;
        long long tthreads = 0;
        for (int k = 0; k < LCE_TORCH_MODES; k++) {
            if (!tm[k]) continue;
            if (json_object_get(tm[k], "median_s")) {
                tv = json_string_value(json_object_get(tm[k], "torch_version"));
                tthreads = (long long)json_integer_value(json_object_get(tm[k], "threads"));
                printf("  %-18s %9.3f %8.1f %8.0f%% %11.1f MiB %11.1f MiB %8.1f MiB\n", lce_torch_labels[k],
                       jnum(tm[k], "median_s", NULL), jnum(tm[k], "gflops", NULL),
                       100 * jnum(tm[k], "gflops", NULL) / sg, jnum(tm[k], "peak_tracked_bytes", NULL) / 1048576.0,
                       jnum(tm[k], "peak_tracked_extra_bytes", NULL) / 1048576.0,
                       jnum(tm[k], "peak_rss_bytes", NULL) / 1048576.0);
            } else {
                printf("  %-18s %s\n", lce_torch_labels[k], json_string_value(json_object_get(tm[k], "status")));
            }
        }
        json_t *res = json_object_get(tm[0], "resolved");
        if (json_is_object(res))
            printf("  PyTorch %s chunked: LinearCrossEntropyOptions() resolved to acc_policy %s, %s, %lld rows "
                   "a chunk (%lld chunks)\n",
                   tv ? tv : "", json_string_value(json_object_get(res, "acc_policy")),
                   json_string_value(json_object_get(res, "chunking_method")),
                   (long long)json_integer_value(json_object_get(res, "batch_chunk_size")),
                   (long long)json_integer_value(json_object_get(res, "chunks")));
        else if (json_is_string(res))
            printf("  PyTorch chunked: %s\n", json_string_value(res));
        if (tv)
            printf("  (PyTorch %s, %lld threads; its tracked peak: inputs + the CPU allocator's peak over one "
                   "step, torch.profiler)\n", tv, tthreads);
        printf("  fused vs unfused: %.2fx faster, %.1fx less peak tracked memory, %.0fx less memory above inputs\n",
               tu / tf, jnum(unfused, "peak_tracked_bytes", NULL) / jnum(fused, "peak_tracked_bytes", NULL),
               xu / (xf > 0 ? xf : 1));
    }
    json_decref(j);
    return 0;
}
