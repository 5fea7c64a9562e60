/* ctorch bench flex: FlexAttention with a sliding-window block mask vs dense SDPA producing
 * the same output (every score computed, then a boolean [L, S] mask applied), flex causal vs
 * ct_sdpa(is_causal), unmasked dense SDPA against the machine's sgemm rate, and block-mask
 * creation time and bytes at a long length; beside PyTorch 2.13's torch.compile(flex_attention)
 * forward on the same shapes and masks (bench/torch_baseline.py flex; its CPU backward is tried
 * and reported). Each case runs in its own process (its peak RSS is its own); times are medians
 * of repeats after a warm-up. */
#include "bench_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fcase {
    long long B, H, L, E, W, bs;
    long long D; /* documents of D tokens (--docs), 0: none */
    bool bf16, backward;
    const char *name;
    ct_tensor q, k, v, o, lse, dout, dq, dk, dv;
    ct_block_mask *bm;
    ct_mask_mod mm, base, doc;
    int32_t *ids;
    ct_sdpa_options so;
    ct_tensor mask;
    bool flex;
} fcase;

static ct_status run_fwd(void *p)
{
    fcase *c = p;
    if (c->flex) return ct_flex_attention_forward(&c->q, &c->k, &c->v, c->bm, NULL, &c->o, &c->lse);
    return ct_sdpa_forward(&c->q, &c->k, &c->v, &c->so, &c->o, &c->lse);
}

static ct_status run_bwd(void *p)
{
    fcase *c = p;
    if (c->flex)
        return ct_flex_attention_backward(&c->q, &c->k, &c->v, &c->o, &c->lse, &c->dout, c->bm,
                                          NULL, &c->dq, &c->dk, &c->dv);
    return ct_sdpa_backward(&c->q, &c->k, &c->v, &c->o, &c->lse, &c->dout, &c->so, &c->dq, &c->dk,
                            &c->dv);
}

static ct_status tensor_rand(ct_tensor *t, ct_dtype dt, long long B, long long H, long long L,
                             long long E, uint64_t seed)
{
    int64_t shape[4] = {B, H, L, E};
    ct_status s = ct_tensor_empty(t, dt, E < 0 ? 3 : 4, shape);
    if (s != CT_OK || seed == 0) return s;
    size_t n = (size_t)ct_tensor_numel(t);
    float *x;
    if ((s = ct_alloc((void **)&x, n * 4))) return s;
    bench_fill(x, n, seed, 1.0f);
    if (dt == CT_DTYPE_F32)
        memcpy(t->data, x, n * 4);
    else
        ct_convert_f32_to_bf16(t->data, x, n);
    ct_free(x);
    return CT_OK;
}

/* Kept pairs of the case's mask (per batch and head; documents of D tokens when D > 0). */
static double kept_pairs(const char *name, long long L, long long W, long long D)
{
    bool sliding = strstr(name, "sliding") != NULL;
    if (!sliding && !strstr(name, "causal")) return (double)L * (double)L;
    double n = 0;
    for (long long q = 0; q < L; q++) {
        long long lo = sliding && q > W ? q - W : 0;
        if (D > 0 && q / D * D > lo) lo = q / D * D;
        n += (double)(q - lo + 1);
    }
    return n;
}

static double max_abs_diff(const ct_tensor *a, const ct_tensor *b)
{
    size_t n = (size_t)ct_tensor_numel(a);
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        float x = a->dtype == CT_DTYPE_F32 ? ((float *)a->data)[i]
                                           : ct_bf16_to_f32(((uint16_t *)a->data)[i]);
        float y = b->dtype == CT_DTYPE_F32 ? ((float *)b->data)[i]
                                           : ct_bf16_to_f32(((uint16_t *)b->data)[i]);
        double d = fabs((double)x - y);
        if (d > m || isnan(d)) m = d;
    }
    return m;
}

/* Block-mask creation alone at a long length: median time and bytes. */
typedef struct mcase {
    ct_mask_mod mm;
    long long L, H, bs;
    size_t bytes;
} mcase;

static ct_status make_mask(void *p)
{
    mcase *m = p;
    ct_block_mask *bm;
    ct_status s = ct_block_mask_create(&m->mm, 1, m->H, m->L, m->L, m->bs, &bm);
    if (s == CT_OK) m->bytes = bm->bytes;
    ct_block_mask_free(bm);
    return s;
}

/* One case in this process: set up, time, print one JSON object. */
static int run_case(bench_ctx *b, fcase *c, int dense_repeats)
{
    ct_dtype dt = c->bf16 ? CT_DTYPE_BF16 : CT_DTYPE_F32;
    long long B = c->B, H = c->H, L = c->L, E = c->E;
    ct_status s;
    if ((s = tensor_rand(&c->q, dt, B, H, L, E, 1)) ||
        (s = tensor_rand(&c->k, dt, B, H, L, E, 2)) ||
        (s = tensor_rand(&c->v, dt, B, H, L, E, 3)) ||
        (s = tensor_rand(&c->o, dt, B, H, L, E, 0)) ||
        (s = tensor_rand(&c->lse, CT_DTYPE_F32, B, H, L, -1, 0)))
        return cli_fail("bench flex", s);
    if (c->backward && ((s = tensor_rand(&c->dout, dt, B, H, L, E, 4)) ||
                        (s = tensor_rand(&c->dq, dt, B, H, L, E, 0)) ||
                        (s = tensor_rand(&c->dk, dt, B, H, L, E, 0)) ||
                        (s = tensor_rand(&c->dv, dt, B, H, L, E, 0))))
        return cli_fail("bench flex", s);
    bool sliding = strstr(c->name, "sliding") != NULL, causal = strstr(c->name, "causal") != NULL;
    bool docs = c->D > 0 && (sliding || causal);
    c->flex = !strncmp(c->name, "flex", 4);
    if (docs) { /* document ids t / D in every row, as ctorch train's batches of 64-token documents */
        if ((s = ct_alloc((void **)&c->ids, (size_t)L * sizeof(int32_t))))
            return cli_fail("bench flex", s);
        for (long long t = 0; t < L; t++)
            c->ids[t] = (int32_t)(t / c->D);
    }
    c->so = ct_sdpa_options_default();
    json_t *j = json_pack("{s:s}", "case", c->name);
    double create_s = 0;
    size_t mask_bytes = 0;
    if (c->flex) {
        s = sliding ? ct_mask_mod_sliding_window(c->W, true, &c->mm) : ct_mask_mod_causal(&c->mm);
        if (!s && docs) {
            c->base = c->mm;
            s = ct_mask_mod_document(c->ids, NULL, 1, L, L, &c->doc);
            ct_mask_mod two[2] = {c->base, c->doc};
            if (!s) s = ct_mask_mod_and(two, 2, &c->mm);
        }
        if (s) return cli_fail("bench flex", s);
        mcase mc = {c->mm, L, H, c->bs, 0};
        bench_time tc;
        if ((s = bench_time_fn(b->repeats, make_mask, &mc, &tc)) ||
            (s = ct_block_mask_create(&c->mm, B, H, L, L, c->bs, &c->bm)))
            return cli_fail("bench flex", s);
        create_s = tc.median;
        mask_bytes = c->bm->bytes;
    } else if (sliding || docs) { /* the dense baseline: a materialised boolean mask */
        int64_t shape[2] = {L, L};
        if ((s = ct_tensor_empty(&c->mask, CT_DTYPE_BOOL, 2, shape)))
            return cli_fail("bench flex", s);
        uint8_t *m = c->mask.data;
        for (long long i = 0; i < L; i++)
            for (long long jj = 0; jj < L; jj++)
                m[i * L + jj] = jj <= i && (!sliding || i - jj <= c->W) &&
                                (!docs || c->ids[i] == c->ids[jj]);
        c->so.attn_mask = &c->mask;
        mask_bytes = (size_t)(L * L);
    } else {
        c->so.is_causal = causal;
    }
    ct_memory_stats_t m0, m1;
    ct_memory_stats(&m0);
    ct_memory_reset_peak();
    bench_time tf, tb;
    int reps = c->flex ? b->repeats : dense_repeats;
    if ((s = bench_time_fn(reps, run_fwd, c, &tf))) return cli_fail("bench flex", s);
    if (c->backward && (s = bench_time_fn(reps, run_bwd, c, &tb))) return cli_fail("bench flex", s);
    ct_memory_stats(&m1);
    double pairs = (double)B * H * kept_pairs(c->name, L, c->W, docs ? c->D : 0);
    double computed = (double)B * H *
                      (c->flex || (causal && !docs) ? kept_pairs(c->name, L, c->W, docs ? c->D : 0)
                                                     : (double)L * L);
    double ff = 4.0 * E * pairs; /* QK^T and PV: 2 flops per multiply-add, E = Ev */
    json_object_set_new(j, "fwd", bench_time_json(&tf));
    json_object_set_new(j, "gflops_fwd", json_real(ff / tf.median * 1e-9));
    json_object_set_new(j, "computed_gflops_fwd", json_real(4.0 * E * computed / tf.median * 1e-9));
    if (c->backward) {
        json_object_set_new(j, "bwd", bench_time_json(&tb));
        json_object_set_new(j, "gflops_bwd", json_real(2.5 * ff / tb.median * 1e-9));
        json_object_set_new(j, "fwd_bwd_s", json_real(tf.median + tb.median));
    }
    json_object_set_new(j, "mask_bytes", json_integer((json_int_t)mask_bytes));
    json_object_set_new(j, "docs", json_integer((json_int_t)(docs ? c->D : 0)));
    if (c->flex) json_object_set_new(j, "mask_create_s", json_real(create_s));
    json_object_set_new(j, "base_bytes", json_integer((json_int_t)m0.current_bytes));
    json_object_set_new(j, "peak_tracked_bytes", json_integer((json_int_t)m1.peak_bytes));
    json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)bench_peak_rss()));
    if (!c->flex) { /* same output as flex on the same mask? */
        ct_tensor o2, l2;
        ct_mask_mod mm, base, doc;
        ct_block_mask *bm = NULL;
        s = tensor_rand(&o2, dt, B, H, L, E, 0);
        if (!s) s = tensor_rand(&l2, CT_DTYPE_F32, B, H, L, -1, 0);
        if (!s) s = sliding ? ct_mask_mod_sliding_window(c->W, true, &mm) : ct_mask_mod_causal(&mm);
        if (!s && docs) {
            base = mm;
            s = ct_mask_mod_document(c->ids, NULL, 1, L, L, &doc);
            ct_mask_mod two[2] = {base, doc};
            if (!s) s = ct_mask_mod_and(two, 2, &mm);
        }
        if (!s && (sliding || causal)) s = ct_block_mask_create(&mm, B, H, L, L, c->bs, &bm);
        if (!s) s = ct_flex_attention_forward(&c->q, &c->k, &c->v, bm, NULL, &o2, &l2);
        if (!s) s = run_fwd(c);
        if (s) return cli_fail("bench flex", s);
        json_object_set_new(j, "max_abs_diff_vs_flex", json_real(max_abs_diff(&c->o, &o2)));
        ct_block_mask_free(bm);
        ct_mask_mod_free(&mm);
        if (docs) ct_mask_mod_free(&base), ct_mask_mod_free(&doc);
    }
    bench_print_json(j);
    json_decref(j);
    return 0;
}

static int run_mask_case(bench_ctx *b, long long L, long long W, long long H, long long bs)
{
    mcase m = {{0}, L, H, bs, 0};
    ct_status s = ct_mask_mod_sliding_window(W, true, &m.mm);
    if (s) return cli_fail("bench flex", s);
    ct_memory_stats_t m0, m1;
    ct_memory_stats(&m0);
    ct_memory_reset_peak();
    bench_time t;
    if ((s = bench_time_fn(b->repeats, make_mask, &m, &t))) return cli_fail("bench flex", s);
    ct_memory_stats(&m1);
    json_t *j = json_pack("{s:s, s:I, s:I, s:o, s:I, s:I}", "case", "mask-create", "seq",
                          (json_int_t)L, "window", (json_int_t)W, "time", bench_time_json(&t),
                          "mask_bytes", (json_int_t)m.bytes, "peak_tracked_bytes",
                          (json_int_t)(m1.peak_bytes - m0.current_bytes));
    bench_print_json(j);
    json_decref(j);
    ct_mask_mod_free(&m.mm);
    return 0;
}

/* Whether the comma-separated list names `name`. */
static bool has_case(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return true;
    return false;
}

static const char *const CASES[6] = {"flex-sliding", "sdpa-sliding", "flex-causal",
                                     "sdpa-causal",  "sdpa-dense",   "mask-create"};

/* Every comma-separated name of `list` is a case (and there is at least one); else the
 * message names the first that is not. */
static bool check_cases(const char *opt, const char *list)
{
    const char *p = list;
    do {
        size_t n = strcspn(p, ",");
        bool known = false;
        for (int k = 0; k < 6 && !known; k++)
            known = strlen(CASES[k]) == n && !strncmp(p, CASES[k], n);
        if (!known) {
            fprintf(stderr,
                    "ctorch bench flex: %s: unknown case '%.*s' (cases: flex-sliding, "
                    "sdpa-sliding, flex-causal, sdpa-causal, sdpa-dense, mask-create)\n",
                    opt, (int)(n > 64 ? 64 : n), p);
            return false;
        }
        p += n;
    } while (*p++ == ',');
    return true;
}

static double jnum(json_t *o, const char *a, const char *b)
{
    json_t *x = json_object_get(o, a);
    if (b) x = json_object_get(x, b);
    return json_number_value(x);
}

static void print_row(const char *label, json_t *c, bool bwd, double sg)
{
    if (!c) return;
    double tf = jnum(c, "fwd", "median_s"), g = jnum(c, "computed_gflops_fwd", NULL);
    printf("  %-26s %9.4f %9.1f %7.0f%%", label, tf, jnum(c, "gflops_fwd", NULL), 100 * g / sg);
    if (bwd)
        printf(" %9.4f %9.1f %7.0f%%", jnum(c, "bwd", "median_s"), jnum(c, "gflops_bwd", NULL),
               100 * jnum(c, "gflops_bwd", NULL) / sg *
                   (jnum(c, "computed_gflops_fwd", NULL) / jnum(c, "gflops_fwd", NULL)));
    printf(" %10.1f MiB\n",
           (jnum(c, "peak_tracked_bytes", NULL) - jnum(c, "base_bytes", NULL)) / 1048576.0);
}

int bench_flex(bench_ctx *b, int argc, char **argv)
{
    fcase c = {0};
    c.B = 1, c.H = 8, c.L = 4096, c.E = 64, c.W = 64, c.bs = 128;
    long long mask_seq = 131072, dense_repeats = b->repeats;
    const char *which = NULL, *dt = "f32";
    bool torch = true, torch_eager = false;
    const char *cases = "flex-sliding,sdpa-sliding,flex-causal,sdpa-causal,sdpa-dense,mask-create";
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help")) {
            puts("usage: ctorch bench flex [--seq L] [--window W] [--heads H] [--head-dim E]\n"
                 "       [--batch B] [--block-size N] [--docs N] [--dtype f32|bf16] [--backward]\n"
                 "       [--cases LIST] [--dense-repeats R] [--mask-seq N] [--no-torch]\n"
                 "       [--torch-eager] [--repeats R] [--json]\n"
                 "Cases (all by default; LIST is comma-separated):\n"
                 "  flex-sliding  flex attention, causal sliding window W (block mask)\n"
                 "  sdpa-sliding  dense SDPA + boolean [L, L] mask: every score, then masked\n"
                 "  flex-causal   flex attention, causal block mask\n"
                 "  sdpa-causal   ct_sdpa(is_causal)\n"
                 "  sdpa-dense    unmasked SDPA, against the sgemm rate\n"
                 "  mask-create   block-mask creation at --mask-seq tokens (default 131072)\n"
                 "Defaults: B=1 H=8 L=4096 E=64 W=64 f32, forward (--backward adds the backward).\n"
                 "--docs N: documents of N tokens too (the sliding and causal cases AND a document\n"
                 "mask, ctorch train's batches: N = 64; sdpa-causal then reads a boolean mask);\n"
                 "no PyTorch run with it.\n"
                 "Beside flex-sliding and flex-causal: PyTorch 2.13's torch.compile(flex_attention)\n"
                 "forward, same shapes, mask and block size (bench/torch_baseline.py; its CPU backward\n"
                 "is tried and reported); --torch-eager runs flex_attention uncompiled, --no-torch none.\n"
                 "The seed's cases: --seq 8192 --window 64, and --seq 32768 --window 256 (its "
                 "dense\n"
                 "baselines take about a minute a run: --dense-repeats 1 times one after the "
                 "warm-up).\n"
                 "GFLOP/s count kept pairs (4 E flops each forward, 2.5x that backward); the\n"
                 "sgemm columns count every computed pair against the sgemm rate.");
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--seq", &v)) {
            if (!cli_int("--seq", v, 1, 1 << 20, &c.L)) return 2;
        } else if (cli_opt(argc, argv, &i, "--window", &v)) {
            if (!cli_int("--window", v, 0, 1 << 20, &c.W)) return 2;
        } else if (cli_opt(argc, argv, &i, "--heads", &v)) {
            if (!cli_int("--heads", v, 1, 1024, &c.H)) return 2;
        } else if (cli_opt(argc, argv, &i, "--head-dim", &v)) {
            if (!cli_int("--head-dim", v, 1, 1024, &c.E)) return 2;
        } else if (cli_opt(argc, argv, &i, "--batch", &v)) {
            if (!cli_int("--batch", v, 1, 1024, &c.B)) return 2;
        } else if (cli_opt(argc, argv, &i, "--docs", &v)) {
            if (!cli_int("--docs", v, 0, 1 << 20, &c.D)) return 2;
        } else if (cli_opt(argc, argv, &i, "--block-size", &v)) {
            if (!cli_int("--block-size", v, 1, 1024, &c.bs)) return 2;
        } else if (cli_opt(argc, argv, &i, "--mask-seq", &v)) {
            if (!cli_int("--mask-seq", v, 1, 1 << 24, &mask_seq)) return 2;
        } else if (cli_opt(argc, argv, &i, "--dense-repeats", &v)) {
            if (!cli_int("--dense-repeats", v, 1, 64, &dense_repeats)) return 2;
        } else if (cli_opt(argc, argv, &i, "--dtype", &v))
            dt = v;
        else if (cli_opt(argc, argv, &i, "--case", &v))
            which = v;
        else if (!strcmp(argv[i], "--backward"))
            c.backward = true;
        else if (!strcmp(argv[i], "--no-torch"))
            torch = false;
        else if (!strcmp(argv[i], "--torch-eager"))
            torch_eager = true;
        else if (cli_opt(argc, argv, &i, "--cases", &v))
            cases = v;
        else {
            fprintf(stderr, "ctorch bench flex: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (strcmp(dt, "f32") && strcmp(dt, "bf16")) {
        fprintf(stderr, "ctorch bench flex: --dtype must be f32 or bf16, got '%s'\n", dt);
        return 2;
    }
    c.bf16 = !strcmp(dt, "bf16");
    if (!check_cases("--cases", cases) || (which && !check_cases("--case", which))) return 2;
    if (which) {
        if (!strcmp(which, "mask-create")) return run_mask_case(b, mask_seq, c.W, c.H, c.bs);
        c.name = which;
        return run_case(b, &c, (int)dense_repeats);
    }
    double sg = bench_sgemm_gflops();
    char sL[32], sW[32], sH[32], sE[32], sB[32], sbs[32], sr[32], sdr[32], sm[32], sD[32];
    snprintf(sD, sizeof sD, "%lld", c.D);
    snprintf(sL, sizeof sL, "%lld", c.L);
    snprintf(sW, sizeof sW, "%lld", c.W);
    snprintf(sH, sizeof sH, "%lld", c.H);
    snprintf(sE, sizeof sE, "%lld", c.E);
    snprintf(sB, sizeof sB, "%lld", c.B);
    snprintf(sbs, sizeof sbs, "%lld", c.bs);
    snprintf(sr, sizeof sr, "%d", b->repeats);
    snprintf(sdr, sizeof sdr, "%lld", dense_repeats);
    snprintf(sm, sizeof sm, "%lld", mask_seq);
    const char *const *names = CASES;
    json_t *res[6] = {0};
    for (int k = 0; k < 6; k++) {
        if (!has_case(cases, names[k])) continue;
        char *args[32] = {"flex",
                          "--case",
                          (char *)names[k],
                          "--seq",
                          sL,
                          "--window",
                          sW,
                          "--heads",
                          sH,
                          "--head-dim",
                          sE,
                          "--batch",
                          sB,
                          "--block-size",
                          sbs,
                          "--dtype",
                          (char *)dt,
                          "--repeats",
                          sr,
                          "--dense-repeats",
                          sdr,
                          "--mask-seq",
                          sm,
                          "--docs",
                          sD,
                          NULL};
        if (c.backward && k < 5) args[25] = "--backward";
        res[k] = bench_child(b, args);
        if (!res[k]) return 1;
    }
    /* PyTorch 2.13: torch.compile(flex_attention) forward on the flex cases, one process each */
    json_t *tj[2] = {0};
    if (torch && c.D == 0)
        for (int k = 0; k < 2; k++) {
            if (!has_case(cases, names[2 * k])) continue;
            char st[32];
            snprintf(st, sizeof st, "%d", ct_num_threads());
            char *pa[32] = {"flex",      "--case",     (char *)names[2 * k], "--seq", sL, "--window", sW,
                            "--heads",   sH,           "--head-dim",         sE,      "--batch", sB,
                            "--block-size", sbs,       "--dtype",            (char *)dt, "--repeats", sr,
                            "--threads", st,           torch_eager ? "--eager" : NULL, NULL};
            tj[k] = bench_python("torch_baseline.py", pa);
        }
    json_t *j = json_pack("{s:s, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:b}, s:o}", "bench", "flex",
                          "shape", "batch", (json_int_t)c.B, "heads", (json_int_t)c.H, "seq",
                          (json_int_t)c.L, "head_dim", (json_int_t)c.E, "window", (json_int_t)c.W,
                          "block_size", (json_int_t)c.bs, "dtype", dt, "backward", c.backward,
                          "machine", bench_machine_json(sg));
    json_object_set_new(json_object_get(j, "shape"), "docs", json_integer((json_int_t)c.D));
    for (int k = 0; k < 6; k++)
        if (res[k]) json_object_set(j, names[k], res[k]);
    double sf = 0, sfb = 0, cr = 0;
    if (res[0] && res[1]) {
        sf = jnum(res[1], "fwd", "median_s") / jnum(res[0], "fwd", "median_s");
        json_object_set_new(j, "speedup_sliding_fwd", json_real(sf));
        if (c.backward) {
            sfb = jnum(res[1], "fwd_bwd_s", NULL) / jnum(res[0], "fwd_bwd_s", NULL);
            json_object_set_new(j, "speedup_sliding_fwd_bwd", json_real(sfb));
        }
    }
    if (res[2] && res[3]) {
        cr = jnum(res[3], "fwd", "median_s") / jnum(res[2], "fwd", "median_s");
        json_object_set_new(j, "speedup_causal_flex_vs_sdpa_fwd", json_real(cr));
        if (c.backward)
            json_object_set_new(j, "speedup_causal_flex_vs_sdpa_fwd_bwd",
                                json_real(jnum(res[3], "fwd_bwd_s", NULL) /
                                          jnum(res[2], "fwd_bwd_s", NULL)));
    }
    json_t *torchj = json_object();
    for (int k = 0; k < 2; k++) {
        if (!tj[k]) continue;
        double tt = jnum(tj[k], "fwd", "median_s"), ct = jnum(res[2 * k], "fwd", "median_s");
        if (tt > 0 && ct > 0) {
            json_object_set_new(tj[k], "ctorch_speedup_fwd", json_real(tt / ct));
            json_object_set_new(tj[k], "peak_tracked_over_ctorch",
                                json_real(jnum(tj[k], "peak_tracked_bytes", NULL) /
                                          jnum(res[2 * k], "peak_tracked_bytes", NULL)));
            json_object_set_new(tj[k], "peak_rss_over_ctorch",
                                json_real(jnum(tj[k], "peak_rss_bytes", NULL) /
                                          jnum(res[2 * k], "peak_rss_bytes", NULL)));
        }
        json_object_set_new(torchj, names[2 * k], tj[k]);
    }
    json_object_set_new(j, "torch", torchj);
    if (b->json) {
        bench_print_json(j);
    } else {
        printf("flex B=%lld H=%lld L=%lld E=%lld window=%lld block=%lld%s%s %s, %d threads, %s, "
               "sgemm %.1f GFLOP/s\n",
               c.B, c.H, c.L, c.E, c.W, c.bs, c.D ? " documents=" : "",
               c.D ? sD : "", dt, ct_num_threads(), ct_isa_name(ct_active_isa()), sg);
        printf("  %-26s %9s %9s %8s", "", "fwd s", "GFLOP/s", "sgemm");
        if (c.backward) printf(" %9s %9s %8s", "bwd s", "GFLOP/s", "sgemm");
        printf(" %14s\n", "peak extra");
        print_row("flex sliding window", res[0], c.backward, sg);
        print_row("sdpa + bool mask (dense)", res[1], c.backward, sg);
        print_row(c.D ? "flex causal & documents" : "flex causal", res[2], c.backward, sg);
        print_row(c.D ? "sdpa + bool mask (causal)" : "sdpa is_causal", res[3], c.backward, sg);
        print_row("sdpa unmasked", res[4], c.backward, sg);
        if (res[0] && res[1]) {
            printf("  sliding window: flex %.1fx faster than dense SDPA (forward)", sf);
            if (c.backward) printf(", %.1fx forward+backward", sfb);
            printf("; outputs differ by %.2g\n  masks: dense %.1f MiB, block mask %.1f KiB\n",
                   jnum(res[1], "max_abs_diff_vs_flex", NULL),
                   jnum(res[1], "mask_bytes", NULL) / 1048576.0,
                   jnum(res[0], "mask_bytes", NULL) / 1024.0);
        }
        if (res[2] && res[3]) {
            printf("  causal: sdpa time / flex time = %.2f (forward)", cr);
            if (c.backward)
                printf(", %.2f (forward+backward)",
                       jnum(j, "speedup_causal_flex_vs_sdpa_fwd_bwd", NULL));
            printf(", outputs differ by %.2g\n", jnum(res[3], "max_abs_diff_vs_flex", NULL));
        }
        for (int k = 0; k < 2; k++) {
            if (!tj[k]) continue;
            const char *lab = k ? "causal" : "sliding window";
            if (!json_object_get(tj[k], "fwd")) {
                printf("  PyTorch flex_attention %s: %s\n", lab,
                       json_string_value(json_object_get(tj[k], "status")));
                continue;
            }
            printf("  PyTorch %s %s flex_attention, %s: fwd %.4f s (ctorch %.2fx), first call %.1f s, peak "
                   "extra %.1f MiB, peak RSS %.1f MiB (ctorch %.1f MiB); backward: %s\n",
                   json_string_value(json_object_get(tj[k], "torch_version")),
                   json_string_value(json_object_get(tj[k], "mode")), lab, jnum(tj[k], "fwd", "median_s"),
                   jnum(tj[k], "ctorch_speedup_fwd", NULL), jnum(tj[k], "first_call_s", NULL),
                   jnum(tj[k], "peak_tracked_extra_bytes", NULL) / 1048576.0,
                   jnum(tj[k], "peak_rss_bytes", NULL) / 1048576.0,
                   jnum(res[2 * k], "peak_rss_bytes", NULL) / 1048576.0,
                   json_string_value(json_object_get(json_object_get(tj[k], "backward"), "status")));
        }
        if (res[0])
            printf("  block mask creation at L=%lld: %.3f ms, %.1f KiB\n", c.L,
                   1e3 * jnum(res[0], "mask_create_s", NULL),
                   jnum(res[0], "mask_bytes", NULL) / 1024.0);
        if (res[5])
            printf("  block mask creation at L=%lld window %lld: %.2f ms, %.1f KiB held, peak %.2f "
                   "MiB\n",
                   mask_seq, c.W, 1e3 * jnum(res[5], "time", "median_s"),
                   jnum(res[5], "mask_bytes", NULL) / 1024.0,
                   jnum(res[5], "peak_tracked_bytes", NULL) / 1048576.0);
    }
    json_decref(j);
    for (int k = 0; k < 6; k++)
        json_decref(res[k]);
    return 0;
}
