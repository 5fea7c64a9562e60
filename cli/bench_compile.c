/* ctorch bench compile: the compile backend (docs/compile.md). Compiled mods against the
 * equivalent built-ins in FlexAttention forward + backward (causal ALiBi, causal softcap) at
 * --seq, the compiled mod against PyTorch 2.13 at --torch-seq (bench/torch_compile_baseline.py:
 * the dense reference maths with the same function, forward + backward, and
 * torch.compile(flex_attention) with the same score_mod, forward; its CPU backward reported), cold compile time per kernel, warm load
 * from the disk cache, and 8 distinct mods compiled by the process pool vs one after another.
 * Every cache is a fresh temp dir, removed at the end. */
#include "bench_util.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TRY(x)                                                                             \
    do {                                                                                   \
        ct_status t_ = (x);                                                                \
        if (t_ != CT_OK) return t_;                                                        \
    } while (0)

typedef struct acase {
    ct_tensor q, k, v, o, lse, dout, dq, dk, dv;
    ct_block_mask *bm;
    ct_flex_options fo;
} acase;

static ct_status fwd_bwd(void *p)
{
    acase *c = p;
    ct_status s = ct_flex_attention_forward(&c->q, &c->k, &c->v, c->bm, &c->fo, &c->o, &c->lse);
    if (s == CT_OK)
        s = ct_flex_attention_backward(&c->q, &c->k, &c->v, &c->o, &c->lse, &c->dout, c->bm, &c->fo,
                                       &c->dq, &c->dk, &c->dv);
    return s;
}

static ct_status fwd_only(void *p)
{
    acase *c = p;
    return ct_flex_attention_forward(&c->q, &c->k, &c->v, c->bm, &c->fo, &c->o, &c->lse);
}

/* The backward alone (o and lse from a forward run before). */
static ct_status bwd_only(void *p)
{
    acase *c = p;
    return ct_flex_attention_backward(&c->q, &c->k, &c->v, &c->o, &c->lse, &c->dout, c->bm, &c->fo,
                                      &c->dq, &c->dk, &c->dv);
}

static ct_status rnd(ct_tensor *t, long long H, long long L, long long E, uint64_t seed)
{
    int64_t shape[4] = {1, H, L, E};
    ct_status s = ct_tensor_empty(t, CT_DTYPE_F32, E < 0 ? 3 : 4, shape);
    if (s == CT_OK && seed) bench_fill(t->data, (size_t)ct_tensor_numel(t), seed, 1.0f);
    return s;
}

static ct_status case_init(acase *c, long long H, long long L, long long E, const ct_mask_mod *m)
{
    memset(c, 0, sizeof *c);
    TRY(rnd(&c->q, H, L, E, 1));
    TRY(rnd(&c->k, H, L, E, 2));
    TRY(rnd(&c->v, H, L, E, 3));
    TRY(rnd(&c->dout, H, L, E, 4));
    TRY(rnd(&c->o, H, L, E, 0));
    TRY(rnd(&c->dq, H, L, E, 0));
    TRY(rnd(&c->dk, H, L, E, 0));
    TRY(rnd(&c->dv, H, L, E, 0));
    TRY(rnd(&c->lse, H, L, -1, 0));
    c->fo = ct_flex_options_default();
    return ct_block_mask_create(m, 1, H, L, L, 128, &c->bm);
}

static void case_free(acase *c)
{
    ct_tensor *ts[] = {&c->q, &c->k, &c->v, &c->o, &c->lse, &c->dout, &c->dq, &c->dk, &c->dv};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        ct_tensor_free(ts[i]);
    ct_block_mask_free(c->bm);
}

static double maxdiff(const ct_tensor *a, const ct_tensor *b)
{
    double m = 0;
    size_t n = (size_t)ct_tensor_numel(a);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)((float *)a->data)[i] - ((float *)b->data)[i]);
        if (d > m || isnan(d)) m = d;
    }
    return m;
}

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

static int make_dir(char *out, size_t n, const char *root, const char *name)
{
    snprintf(out, n, "%s/%s", root, name);
    return mkdir(out, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

static int cmp_d(const void *a, const void *b);

static void fill_time(double *t, int n, bench_time *out)
{
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    out->repeats = n;
    out->min = t[0];
    out->max = t[n - 1];
    out->median = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* fn on x and on y alternately, one run each per repeat after a warm-up of each, so a change of
 * load on a shared machine falls on both sides alike. */
static ct_status time_pair(int repeats, ct_status (*fn)(void *), void *x, void *y, bench_time *tx,
                           bench_time *ty)
{
    double a[64], b[64];
    if (repeats < 1) repeats = 1;
    if (repeats > 64) repeats = 64;
    TRY(fn(x));
    TRY(fn(y));
    for (int r = 0; r < repeats; r++) {
        double t0 = bench_now();
        TRY(fn(x));
        double t1 = bench_now();
        TRY(fn(y));
        a[r] = t1 - t0;
        b[r] = bench_now() - t1;
    }
    fill_time(a, repeats, tx);
    fill_time(b, repeats, ty);
    return CT_OK;
}

/* {"builtin", "compiled", "compiled_over_builtin" (of the medians), "..._min" (of the minima:
 * the least disturbed runs)} */
static json_t *pair_json(const bench_time *b, const bench_time *c)
{
    return json_pack("{s:o, s:o, s:f, s:f}", "builtin", bench_time_json(b), "compiled",
                     bench_time_json(c), "compiled_over_builtin", c->median / b->median,
                     "compiled_over_builtin_min", c->min / b->min);
}

/* Built-in vs compiled, same mask kind and score mod: times and the largest difference. */
static ct_status compare(bench_ctx *b, long long H, long long L, long long E,
                         const ct_score_mod *bi, const ct_mask_mod *bim, const ct_score_mod *cs,
                         const ct_mask_mod *cm, json_t **out)
{
    acase x, y;
    bench_time tb, tc, fb, fc, bb, bc;
    ct_status s = case_init(&x, H, L, E, bim);
    if (s == CT_OK) s = case_init(&y, H, L, E, cm);
    x.fo.score_mod = bi;
    y.fo.score_mod = cs;
    /* built-in and compiled alternate run by run, so a change of load hits both */
    if (s == CT_OK) s = time_pair(b->repeats, fwd_only, &x, &y, &fb, &fc);
    if (s == CT_OK) s = time_pair(b->repeats, bwd_only, &x, &y, &bb, &bc);
    if (s == CT_OK) s = time_pair(b->repeats, fwd_bwd, &x, &y, &tb, &tc);
    if (s == CT_OK) {
        double d = fmax(maxdiff(&x.o, &y.o), fmax(maxdiff(&x.dq, &y.dq), maxdiff(&x.dk, &y.dk)));
        *out = pair_json(&tb, &tc);
        json_object_set_new(*out, "max_abs_diff", json_real(d));
        json_object_set_new(*out, "forward", pair_json(&fb, &fc));
        json_object_set_new(*out, "backward", pair_json(&bb, &bc));
    }
    case_free(&x);
    case_free(&y);
    return s;
}

static ct_status time_one_compile(const char *expr, bool mask, const ct_jit_options *o, double *sec)
{
    double t0 = bench_now();
    ct_status s;
    if (mask) {
        ct_mask_mod m;
        s = ct_mask_mod_compile(expr, NULL, 0, o, &m);
        ct_mask_mod_free(&m);
    } else {
        ct_score_mod m;
        s = ct_score_mod_compile(expr, NULL, 0, o, &m);
        ct_score_mod_free(&m);
    }
    *sec = bench_now() - t0;
    return s;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_d);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

int bench_compile(bench_ctx *b, int argc, char **argv)
{
    long long L = 8192, H = 1, E = 64, TL = 2048;
    int pool_threads = 0;
    bool torch_compile = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long long *dst = !strcmp(a, "--seq")         ? &L
                         : !strcmp(a, "--heads")     ? &H
                         : !strcmp(a, "--head-dim")  ? &E
                         : !strcmp(a, "--torch-seq") ? &TL
                                                     : NULL;
        if (!strcmp(a, "--help")) {
            puts("usage: ctorch bench compile [--seq L (8192)] [--heads H (1)] [--head-dim E (64)]\n"
                 "                            [--torch-seq L (2048)] [--threads N] [--no-torch-compile]\n"
                 "                            [--json]\n"
                 "Compiled score/mask mods vs the equivalent built-ins (causal ALiBi, causal\n"
                 "softcap; flex forward + backward at --seq), vs PyTorch 2.13 at --torch-seq: the dense\n"
                 "reference maths with the same function (forward + backward) and\n"
                 "torch.compile(flex_attention) with that score_mod (forward; --no-torch-compile runs it\n"
                 "eager), cold compile per kernel, warm\n"
                 "load from the cache, 8 mods by the pool (--threads, default the core count)\n"
                 "vs serial. Caches go to a temp dir.");
            return 0;
        }
        if (!strcmp(a, "--no-torch-compile")) {
            torch_compile = false;
            continue;
        }
        if (!strcmp(a, "--threads") && i + 1 < argc) {
            pool_threads = atoi(argv[++i]);
            continue;
        }
        if (!dst || i + 1 >= argc) {
            fprintf(stderr, "ctorch bench compile: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        *dst = atoll(argv[++i]);
        if (*dst < 1 || *dst > (1 << 20)) {
            fprintf(stderr, "ctorch bench compile: %s must be in [1, 2^20]\n", a);
            return 2;
        }
    }
    if (pool_threads <= 0) pool_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    char root[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/ctorch-bench-compile-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(root)) {
        perror("ctorch bench compile: mkdtemp");
        return 1;
    }
    char dmain[400], dcold[400], dser[400], dpool[400];
    make_dir(dmain, sizeof dmain, root, "main");
    make_dir(dcold, sizeof dcold, root, "cold");
    make_dir(dser, sizeof dser, root, "serial");
    make_dir(dpool, sizeof dpool, root, "pool");
    ct_jit_options o = ct_jit_options_default();
    o.cache_dir = dmain;
    int rc = 0;
    ct_status s = CT_OK;
    json_t *alibi = NULL, *softcap = NULL, *torchj = NULL, *ours = NULL;
    double sg = bench_sgemm_gflops();

    /* 1. compiled vs built-in */
    float *slope = malloc((size_t)H * sizeof(float));
    for (long long h = 0; h < H; h++)
        slope[h] = (float)exp2(-8.0 * (double)(h + 1) / (double)H);
    ct_jit_binding sb = {"slope", CT_DTYPE_F32, 1, {H}, slope, false};
    ct_score_mod ba = {0}, ca = {0}, bs = {0}, cs = {0};
    ct_mask_mod bc = {0}, cc = {0};
    if (!s) s = ct_score_mod_alibi(H, slope, &ba);
    if (!s) s = ct_score_mod_softcap(20.0f, &bs);
    if (!s) s = ct_mask_mod_causal(&bc);
    if (!s) s = ct_score_mod_compile("score + slope[h] * (kv - q)", &sb, 1, &o, &ca);
    if (!s) s = ct_score_mod_compile("20 * tanh(score / 20)", NULL, 0, &o, &cs);
    if (!s) s = ct_mask_mod_compile("q >= kv", NULL, 0, &o, &cc);
    if (!s) s = compare(b, H, L, E, &ba, &bc, &ca, &cc, &alibi);
    if (!s) s = compare(b, H, L, E, &bs, &bc, &cs, &cc, &softcap);

    /* 2. vs PyTorch dense reference maths, same function (ALiBi + causal), at --torch-seq */
    if (!s) {
        acase t;
        bench_time tt;
        s = case_init(&t, H, TL, E, &cc);
        t.fo.score_mod = &ca;
        bench_time tfw;
        if (!s) s = bench_time_fn(b->repeats, fwd_bwd, &t, &tt);
        if (!s) s = bench_time_fn(b->repeats, fwd_only, &t, &tfw);
        if (!s) {
            ours = bench_time_json(&tt);
            json_object_set_new(ours, "fwd", bench_time_json(&tfw));
        }
        case_free(&t);
        char sl[32], sh[32], se[32], sr[32], st[32];
        snprintf(st, sizeof st, "%d", ct_num_threads());
        snprintf(sl, sizeof sl, "%lld", TL);
        snprintf(sh, sizeof sh, "%lld", H);
        snprintf(se, sizeof se, "%lld", E);
        snprintf(sr, sizeof sr, "%d", b->repeats);
        char *args[] = {"--seq", sl, "--heads", sh, "--head-dim", se, "--repeats", sr, "--threads", st,
                        torch_compile ? NULL : "--no-compile", NULL};
        torchj = bench_python("torch_compile_baseline.py", args);
    }

    /* 3. cold compile per kernel (serial, a fresh cache), 4. warm load */
    double cold[6], warm[7];
    ct_jit_options oc = o;
    oc.cache_dir = dcold;
    oc.threads = 1;
    for (int i = 0; i < 6 && !s; i++) {
        char e[96];
        snprintf(e, sizeof e, "score * %d.5 + (q - kv) / %d", i + 1, i + 2);
        s = time_one_compile(e, false, &oc, &cold[i]);
    }
    ct_jit_stats st0, st;
    ct_jit_get_stats(&st0);
    for (int i = 0; i < 7 && !s; i++) {
        ct_jit_reset_table();
        s = time_one_compile("score * 1.5 + (q - kv) / 2", false, &oc, &warm[i]);
    }
    ct_jit_get_stats(&st); /* the warm loads: processes started, disk hits */
    /* 5. 8 distinct mods: pool vs one after another (fresh caches) */
    double t_ser = 0, t_pool = 0;
    if (!s) {
        char ex[8][96];
        ct_score_mod sm[8];
        ct_jit_request rq[8];
        for (int i = 0; i < 8; i++) {
            snprintf(ex[i], sizeof ex[i], "%d * tanh(score / %d) + sigmoid(score) * (kv - q) / %d",
                     10 + i, 10 + i, 3 + i);
            rq[i] = (ct_jit_request){ex[i], NULL, 0, &sm[i], NULL};
        }
        ct_jit_options os = o, op = o;
        os.cache_dir = dser;
        os.threads = 1;
        op.cache_dir = dpool;
        op.threads = pool_threads;
        ct_jit_reset_table();
        double t0 = bench_now();
        for (int i = 0; i < 8 && !s; i++) /* one after another: one compile per call */
            s = ct_mod_compile_many(&rq[i], 1, &os);
        t_ser = bench_now() - t0;
        for (int i = 0; i < 8 && !s; i++)
            ct_score_mod_free(&sm[i]);
        ct_jit_reset_table();
        t0 = bench_now();
        if (!s) s = ct_mod_compile_many(rq, 8, &op);
        t_pool = bench_now() - t0;
        for (int i = 0; i < 8 && !s; i++)
            ct_score_mod_free(&sm[i]);
    }
    if (s) {
        rc = cli_fail("bench compile", s);
    } else {
        double cm = median(cold, 6), wm = median(warm, 7);
        json_t *j = json_pack(
            "{s:s, s:o, s:{s:I, s:I, s:I, s:I}, s:o, s:o, s:{s:I, s:o, s:o}, s:{s:f, s:f}, "
            "s:{s:f, s:f, s:I, s:I}, s:{s:i, s:f, s:f, s:f}}",
            "bench", "compile", "machine", bench_machine_json(sg), "shape", "B", (json_int_t)1, "H",
            (json_int_t)H, "L", (json_int_t)L, "E", (json_int_t)E, "alibi_causal_fwd_bwd", alibi,
            "softcap_causal_fwd_bwd", softcap, "vs_torch_dense_alibi_causal", "seq", (json_int_t)TL,
            "ctorch_compiled", ours, "torch", torchj, "cold_compile_per_kernel_s", "median", cm,
            "max", cold[5] > cold[0] ? cold[5] : cold[0], "warm_cache_load_ms", "median", wm * 1e3,
            "min", warm[0] * 1e3, "warm_load_processes", (json_int_t)(st.processes - st0.processes), "warm_load_cache_hits",
            (json_int_t)(st.cache_hits - st0.cache_hits), "pool_8_mods", "threads",
            pool_threads, "serial_s", t_ser, "pool_s", t_pool, "pool_over_serial", t_pool / t_ser);
        alibi = softcap = torchj = ours = NULL;
        if (b->json) {
            bench_print_json(j);
        } else {
            json_t *a = json_object_get(j, "alibi_causal_fwd_bwd"),
                   *c = json_object_get(j, "softcap_causal_fwd_bwd");
            printf("compiled mods vs built-ins, flex fwd+bwd, B=1 H=%lld L=%lld E=%lld (median of %d)\n",
                   H, L, E, b->repeats);
            json_t *rows[2] = {a, c};
            const char *names[2] = {"alibi+causal  ", "softcap+causal"};
            for (int r = 0; r < 2; r++) {
                json_t *x = rows[r], *f = json_object_get(x, "forward"), *w = json_object_get(x, "backward");
#define MED(o, k) json_real_value(json_object_get(json_object_get(o, k), "median_s"))
#define RAT(o) json_real_value(json_object_get(o, "compiled_over_builtin")), \
               json_real_value(json_object_get(o, "compiled_over_builtin_min"))
                printf("  %s fwd+bwd built-in %.3f s compiled %.3f s (%.3fx, of minima %.3fx; max diff "
                       "%.2g); fwd %.3fx (%.3fx); bwd %.3fx (%.3fx)\n",
                       names[r], MED(x, "builtin"), MED(x, "compiled"), RAT(x),
                       json_real_value(json_object_get(x, "max_abs_diff")), RAT(f), RAT(w));
#undef RAT
#undef MED
            }
            json_t *tv = json_object_get(j, "vs_torch_dense_alibi_causal");
            json_t *tj = json_object_get(tv, "torch");
            double ct = json_real_value(json_object_get(json_object_get(tv, "ctorch_compiled"), "median_s"));
            if (json_object_get(tj, "median_s")) {
                printf("  vs PyTorch %s dense reference, same function, L=%lld: ctorch %.3f s, "
                       "torch %.3f s (%.1fx)\n",
                       json_string_value(json_object_get(tj, "torch_version")), TL, ct,
                       json_number_value(json_object_get(tj, "median_s")),
                       json_number_value(json_object_get(tj, "median_s")) / ct);
                json_t *ff = json_object_get(tj, "flex_fwd");
                double cf = json_number_value(
                    json_object_get(json_object_get(json_object_get(tv, "ctorch_compiled"), "fwd"), "median_s"));
                if (json_object_get(ff, "median_s"))
                    printf("  vs PyTorch %s flex_attention (ALiBi score_mod, causal block mask), forward: ctorch "
                           "%.4f s, torch %.4f s (%.1fx; its first call %.1f s); its backward: %s\n",
                           json_string_value(json_object_get(ff, "mode")), cf,
                           json_number_value(json_object_get(ff, "median_s")),
                           json_number_value(json_object_get(ff, "median_s")) / cf,
                           json_number_value(json_object_get(ff, "first_call_s")),
                           json_string_value(json_object_get(json_object_get(tj, "flex_backward"), "status")));
            } else
                printf("  vs PyTorch dense reference at L=%lld: ctorch %.3f s, torch %s\n", TL, ct,
                       json_string_value(json_object_get(tj, "status")));
            printf("cold compile per kernel: median %.3f s; warm cache load: median %.2f ms (%lld "
                   "processes)\n",
                   cm, wm * 1e3, (long long)(st.processes - st0.processes));
            printf("8 mods: serial %.2f s, pool of %d %.2f s (%.2fx)\n", t_ser, pool_threads, t_pool,
                   t_pool / t_ser);
        }
        json_decref(j);
    }
    json_decref(alibi);
    json_decref(softcap);
    json_decref(torchj);
    json_decref(ours);
    ct_score_mod_free(&ba);
    ct_score_mod_free(&ca);
    ct_score_mod_free(&bs);
    ct_score_mod_free(&cs);
    ct_mask_mod_free(&bc);
    ct_mask_mod_free(&cc);
    free(slope);
    rm_tree(dmain);
    rm_tree(dcold);
    rm_tree(dser);
    rm_tree(dpool);
    rmdir(root);
    return rc;
}
