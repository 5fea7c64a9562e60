/* ctorch bench train: one training step (forward, backward, clipping, AdamW) of the same model
 * on the same batch, four ways: the fused linear cross-entropy vs the unfused head, FlexAttention
 * with a sliding-window block mask vs dense SDPA reading a [B, T, T] mask, and PyTorch 2.13
 * (bench/torch_train.py: F.scaled_dot_product_attention, eager and torch.compile'd, initialised
 * from the same weights). Each case runs in its own process,
 * so its peak RSS is its own; times are medians of repeats after a warm-up. */
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct tcase {
    ct_trainer *t;
    json_t *losses; /* each step's loss, the warm-up's first (the loss at the initial weights) */
    double cpu[64]; /* each step's process CPU time (all threads), the warm-up's first */
    int n;
} tcase;

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static ct_status run_step(void *p)
{
    tcase *tc = p;
    ct_train_step_info info;
    double c0 = cpu_now();
    ct_status s = ct_trainer_step(tc->t, &info);
    if (tc->n < 64) tc->cpu[tc->n++] = cpu_now() - c0;
    if (!s) json_array_append_new(tc->losses, json_real(info.loss));
    return s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of the timed steps' CPU times (the warm-up left out). */
static double cpu_median(tcase *tc)
{
    int n = tc->n - 1;
    if (n < 1) return 0;
    qsort(tc->cpu + 1, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? tc->cpu[1 + n / 2] : 0.5 * (tc->cpu[n / 2] + tc->cpu[1 + n / 2]);
}

typedef bench_train_conf bconf; /* bench_util.h: shared with bench scaling */

/* The batch: B windows of T + 1 tokens of the built-in corpus, as one stream whose rows are
 * stream[b T .. b T + T] (what the trainer reads, and what "tokens" [B, T+1] holds). */
static int32_t *make_stream(const bconf *c, int64_t *n)
{
    int64_t T = c->cfg.context;
    *n = c->batch * T + 1;
    ct_corpus_options co = ct_corpus_options_default();
    co.vocab_size = c->cfg.vocab_size;
    if (co.classes >= co.vocab_size) co.classes = co.vocab_size - 1;
    ct_corpus *cp;
    int32_t *x = malloc((size_t)*n * sizeof *x);
    if (ct_corpus_create(&co, &cp) || ct_corpus_generate(cp, 0, *n, x)) {
        ct_corpus_free(cp);
        free(x);
        return NULL;
    }
    ct_corpus_free(cp);
    return x;
}

static ct_train_options step_options(const bconf *c, const char *name)
{
    ct_train_options o = ct_train_options_default();
    o.batch = c->batch;
    o.seq = c->cfg.context;
    o.eos_token = 0;
    o.warmup = 0;
    o.fused_head = strstr(name, "unfused") == NULL;
    o.dense_attention = strstr(name, "dense") != NULL;
    o.dtype = strstr(name, "bf16") ? CT_DTYPE_BF16 : CT_DTYPE_F32; /* "fused-flex-bf16", ... */
    return o;
}

/* Write the initial weights, the batch and the options for the other processes. */
static int write_weights(const bconf *c, const char *path)
{
    int64_t n;
    int32_t *x = make_stream(c, &n);
    if (!x) return cli_fail("bench train: corpus", CT_ENOMEM);
    ct_train_options o = step_options(c, "fused-flex");
    ct_trainer *t;
    ct_status s = ct_trainer_create(&c->cfg, &o, x, n, NULL, 0, &t);
    if (s) {
        free(x);
        return cli_fail("bench train", s);
    }
    ct_gpt *m = ct_trainer_model(t);
    int nt = ct_gpt_num_tensors(m);
    ct_tensor *tens = calloc((size_t)nt + 1, sizeof *tens);
    const char **names = calloc((size_t)nt + 1, sizeof *names);
    for (int i = 0; i < nt && !s; i++)
        s = ct_gpt_tensor(m, i, &names[i], &tens[i], NULL);
    int64_t T = c->cfg.context, shape[2] = {c->batch, T + 1};
    int32_t *rows = malloc((size_t)(c->batch * (T + 1)) * sizeof *rows);
    for (int64_t b = 0; b < c->batch; b++)
        memcpy(rows + b * (T + 1), x + b * T, (size_t)(T + 1) * sizeof *rows);
    if (!s) s = ct_tensor_wrap(&tens[nt], rows, CT_DTYPE_I32, 2, shape, NULL);
    names[nt] = "tokens";
    char *cj = NULL, *tj = NULL;
    if (!s) s = ct_gpt_config_to_json(&c->cfg, &cj);
    if (!s) s = ct_train_options_to_json(&o, &tj);
    if (!s) {
        const char *keys[] = {"format", "config", "train"}, *vals[] = {"ctorch-gpt-bench", cj, tj};
        ct_save_options so = ct_save_options_default();
        so.sync = false;
        s = ct_save_safetensors(path, tens, names, (size_t)nt + 1, keys, vals, 3, &so);
    }
    ct_free(cj);
    ct_free(tj);
    free(rows);
    free(tens);
    free(names);
    ct_trainer_free(t);
    free(x);
    return s ? cli_fail("bench train: writing the weights", s) : 0;
}

/* One case in this process: load the weights, time steps, print one JSON object. */
static int run_case(bench_ctx *b, const bconf *c, const char *name, const char *weights)
{
    int64_t n;
    int32_t *x = make_stream(c, &n);
    if (!x) return cli_fail("bench train: corpus", CT_ENOMEM);
    ct_train_options o = step_options(c, name);
    o.steps = 1000000; /* a flat schedule: every timed step does the same work */
    tcase tc = {NULL, json_array(), {0}, 0};
    ct_tensor_file *f = NULL;
    ct_memory_stats_t m0, m1;
    ct_memory_stats(&m0);
    ct_memory_reset_peak();
    ct_status s = ct_trainer_create(&c->cfg, &o, x, n, NULL, 0, &tc.t);
    if (!s) s = ct_load(weights, NULL, &f);
    if (!s) s = ct_gpt_load_params(ct_trainer_model(tc.t), f);
    ct_tensor_file_close(f);
    bench_time bt;
    if (!s) s = bench_time_fn(b->repeats, run_step, &tc, &bt);
    if (s) {
        json_decref(tc.losses);
        ct_trainer_free(tc.t);
        free(x);
        return cli_fail("bench train", s);
    }
    ct_memory_stats(&m1);
    ct_gpt_memory mem = ct_gpt_memory_sizes(ct_trainer_model(tc.t));
    double tokens = (double)(c->batch * c->cfg.context);
    json_t *j = json_pack("{s:s, s:s, s:i, s:o, s:f, s:I, s:I, s:{s:I, s:I, s:I, s:I}}", "case", name,
                          "dtype", o.dtype == CT_DTYPE_BF16 ? "bf16" : "f32", "threads",
                          ct_num_threads(), "step", bench_time_json(&bt), "tokens_per_s",
                          tokens / bt.median,
                          "peak_tracked_bytes", (json_int_t)(m1.peak_bytes - m0.current_bytes),
                          "peak_rss_bytes", (json_int_t)bench_peak_rss(), "allocations", "params",
                          (json_int_t)mem.params, "grads", (json_int_t)mem.grads, "optimizer",
                          (json_int_t)mem.optimizer, "activations", (json_int_t)mem.activations);
    /* CPU time beside wall time: other processes on the same cores stretch the wall time */
    json_object_set_new(j, "step_cpu_s", json_real(cpu_median(&tc)));
    json_object_set_new(j, "losses", tc.losses);
    bench_print_json(j);
    json_decref(j);
    ct_trainer_free(tc.t);
    free(x);
    return 0;
}

static double jnum(json_t *o, const char *a, const char *k)
{
    json_t *x = json_object_get(o, a);
    if (k) x = json_object_get(x, k);
    return json_number_value(x);
}

static void row(const char *label, json_t *c)
{
    if (!c) return;
    if (!json_object_get(c, "step")) {
        printf("  %-50s %s\n", label, json_string_value(json_object_get(c, "status")));
        return;
    }
    printf("  %-50s %8.3f %10.0f", label, jnum(c, "step", "median_s"),
           jnum(c, "tokens_per_s", NULL));
    if (json_object_get(c, "peak_tracked_bytes"))
        printf(" %10.1f MiB", jnum(c, "peak_tracked_bytes", NULL) / 1048576.0);
    else
        printf(" %14s", "-");
    printf(" %10.1f MiB\n", jnum(c, "peak_rss_bytes", NULL) / 1048576.0);
}

/* The three ctorch cases and the two PyTorch modes, one row each per dtype. */
#define NCASE 3
#define NROW (NCASE + 2)
static const char *const case_names[NCASE] = {"fused-flex", "unfused-flex", "fused-dense"};
static const char *const case_keys[NCASE] = {"fused_flex", "unfused_flex", "fused_dense"};
static const char *const torch_modes[2] = {"eager", "compiled"};
static const char *const dtype_names[2] = {"f32", "bf16"};

/* A comma-separated LIST of names out of `known` (n of them) into the flags `on`; 0, or 2 with a
 * message naming the flag and the bad item. */
static int parse_list(const char *flag, const char *v, const char *const *known, int n, bool *on)
{
    for (int k = 0; k < n; k++)
        on[k] = false;
    const char *p = v;
    int any = 0;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int k = 0;
        while (k < n && !(strlen(known[k]) == len && !strncmp(known[k], p, len)))
            k++;
        if (k == n) {
            fprintf(stderr, "ctorch bench train: %s takes a comma-separated list of", flag);
            for (int i = 0; i < n; i++)
                fprintf(stderr, "%s %s", i ? "," : "", known[i]);
            fprintf(stderr, "; unknown item '%.*s' in '%s'\n", (int)len, p, v);
            return 2;
        }
        on[k] = true;
        any = 1;
        p = e ? e + 1 : p + len;
    }
    if (!any) {
        fprintf(stderr, "ctorch bench train: %s needs at least one item\n", flag);
        return 2;
    }
    return 0;
}

/* Ratios of one dtype's rows, as top-level keys with the suffix sfx ("" for f32, "_bf16"). */
static void ratios(json_t *j, json_t *const *res, const char *sfx, double *tt, double *rt, double *mt)
{
    char key[96];
    double tf = jnum(res[0], "tokens_per_s", NULL), mf = jnum(res[0], "peak_tracked_bytes", NULL);
    if (res[0] && res[1]) {
        double tu = jnum(res[1], "tokens_per_s", NULL), mu = jnum(res[1], "peak_tracked_bytes", NULL);
        snprintf(key, sizeof key, "fused_vs_unfused%s_tokens_per_s", sfx);
        json_object_set_new(j, key, json_real(tf / tu));
        snprintf(key, sizeof key, "fused_vs_unfused%s_peak_tracked", sfx);
        json_object_set_new(j, key, json_real(mu / mf));
    }
    if (res[0] && res[2]) {
        double td = jnum(res[2], "tokens_per_s", NULL), md = jnum(res[2], "peak_tracked_bytes", NULL);
        snprintf(key, sizeof key, "flex_vs_dense%s_tokens_per_s", sfx);
        json_object_set_new(j, key, json_real(tf / td));
        snprintf(key, sizeof key, "flex_vs_dense%s_peak_tracked", sfx);
        json_object_set_new(j, key, json_real(md / mf));
    }
    for (int k = 0; k < 2; k++) {
        tt[k] = rt[k] = mt[k] = 0;
        if (!res[0] || !json_object_get(res[NCASE + k], "step")) continue;
        tt[k] = tf / jnum(res[NCASE + k], "tokens_per_s", NULL);
        rt[k] = jnum(res[NCASE + k], "peak_rss_bytes", NULL) / jnum(res[0], "peak_rss_bytes", NULL);
        mt[k] = jnum(res[NCASE + k], "peak_tracked_bytes", NULL) / mf;
        snprintf(key, sizeof key, "ctorch_vs_pytorch_%s%s_tokens_per_s", torch_modes[k], sfx);
        json_object_set_new(j, key, json_real(tt[k]));
        snprintf(key, sizeof key, "pytorch_%s%s_vs_ctorch_peak_rss", torch_modes[k], sfx);
        json_object_set_new(j, key, json_real(rt[k]));
        snprintf(key, sizeof key, "pytorch_%s%s_vs_ctorch_peak_tracked", torch_modes[k], sfx);
        json_object_set_new(j, key, json_real(mt[k]));
    }
}

int bench_train(bench_ctx *b, int argc, char **argv)
{
    bconf c = {ct_gpt_config_default(), 2};
    c.cfg.context = 512;
    c.cfg.window = 128;
    const char *which = NULL, *weights = NULL, *tattn = "causal", *preset = NULL;
    bool ton[2] = {true, true}, don[2] = {true, false}, con[NCASE] = {true, true, true};
    /* the preset first, so that the other flags refine it wherever they stand */
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!cli_opt(argc, argv, &i, "--preset", &v)) continue;
        if (strcmp(v, "gpt2-small")) {
            fprintf(stderr, "ctorch bench train: --preset must be gpt2-small, got '%s'\n", v);
            return 2;
        }
        /* GPT-2 small's shape: 12 layers, d 768, 12 heads (no GQA), V 50304 (50257 padded to
         * a multiple of 64), context 1024, tied head, full causal attention; the SwiGLU hidden
         * size 2048 gives the MLP GPT-2's parameter count (3 x 768 x 2048 = 2 x 768 x 3072) */
        preset = v;
        c.cfg.n_layer = 12;
        c.cfg.d_model = 768;
        c.cfg.n_head = 12;
        c.cfg.n_kv_head = 12;
        c.cfg.d_ff = 2048;
        c.cfg.vocab_size = 50304;
        c.cfg.context = 1024;
        c.cfg.window = 0;
        c.cfg.tied = true;
        c.batch = 4;
    }
    for (int i = 1; i < argc; i++) {
        const char *v;
        long long x;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            puts(
                "usage: ctorch bench train [--preset gpt2-small] [--batch B] [--seq T] [--window W]\n"
                "       [--layers N] [--d-model C] [--heads H] [--kv-heads K] [--ffn F] [--vocab V]\n"
                "       [--dtype f32|bf16|f32,bf16] [--cases LIST] [--torch-modes LIST]\n"
                "       [--torch-attention causal|mask] [--no-torch] [--repeats R] [--json]\n"
                "One training step (forward, backward, gradient clipping, AdamW) of the same model "
                "on the\n"
                "same batch, each case in its own process:\n"
                "  fused-flex     fused linear cross-entropy + FlexAttention, sliding-window block "
                "mask\n"
                "  unfused-flex   logits [B T, V] and their gradient materialised + FlexAttention\n"
                "  fused-dense    fused loss + dense SDPA reading a [B, T, T] boolean mask\n"
                "  pytorch        bench/torch_train.py: the same model in PyTorch 2.13 from the "
                "same\n"
                "                 weights and batch (F.scaled_dot_product_attention is_causal, F.linear +\n"
                "                 F.cross_entropy), eager and torch.compile'd; --torch-attention mask gives\n"
                "                 SDPA the model's exact mask (window, documents) instead of is_causal;\n"
                "                 --torch-modes eager|compiled|eager,compiled (default both), --no-torch\n"
                "--cases LIST picks ctorch's cases (default fused-flex,unfused-flex,fused-dense; the\n"
                "ratios to PyTorch are fused-flex's, the trainer's default).\n"
                "--dtype f32 (default), bf16, or f32,bf16 (a row of each): bf16 runs every case as\n"
                "`ctorch train --dtype bf16` (bf16 GEMM operands, f32 master weights and\n"
                "accumulation) beside PyTorch under torch.autocast(\"cpu\", dtype=torch.bfloat16);\n"
                "f32,bf16 also gives ctorch's bf16 vs f32 step. Without bf16 dot instructions\n"
                "(AVX512_BF16; machine.bf16_dot) ctorch widens bf16 to f32 and PyTorch's bf16 matmul\n"
                "is far slower than its f32 one: a bf16 ratio then says little.\n"
                "Defaults: the default ctorch train model (V 32768, 4 layers, d_model 128, 4 "
                "heads, 2 kv,\n"
                "ffn 384) with B=2, T=512 and a causal window of 128. --preset gpt2-small: 12 layers,\n"
                "d_model 768, 12 heads (12 kv), ffn 2048 (SwiGLU with GPT-2's MLP parameter count),\n"
                "V 50304, tied head, full causal attention, B=4, T=1024 (other flags refine it).\n"
                "Reports the median step time, tokens/s, the allocator's peak tracked bytes and the\n"
                "process's peak RSS.");
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--preset", &v)) {
            /* applied above */
        } else if (cli_opt(argc, argv, &i, "--batch", &v)) {
            if (!cli_int("--batch", v, 1, 4096, &c.batch)) return 2;
        } else if (cli_opt(argc, argv, &i, "--seq", &v)) {
            if (!cli_int("--seq", v, 1, 1 << 16, &x)) return 2;
            c.cfg.context = x;
        } else if (cli_opt(argc, argv, &i, "--window", &v)) {
            if (!cli_int("--window", v, 0, 1 << 16, &x)) return 2;
            c.cfg.window = x;
        } else if (cli_opt(argc, argv, &i, "--layers", &v)) {
            if (!cli_int("--layers", v, 1, 256, &x)) return 2;
            c.cfg.n_layer = x;
        } else if (cli_opt(argc, argv, &i, "--d-model", &v)) {
            if (!cli_int("--d-model", v, 2, 65536, &x)) return 2;
            c.cfg.d_model = x;
        } else if (cli_opt(argc, argv, &i, "--heads", &v)) {
            if (!cli_int("--heads", v, 1, 1024, &x)) return 2;
            c.cfg.n_head = x;
        } else if (cli_opt(argc, argv, &i, "--kv-heads", &v)) {
            if (!cli_int("--kv-heads", v, 1, 1024, &x)) return 2;
            c.cfg.n_kv_head = x;
        } else if (cli_opt(argc, argv, &i, "--ffn", &v)) {
            if (!cli_int("--ffn", v, 1, 1 << 20, &x)) return 2;
            c.cfg.d_ff = x;
        } else if (cli_opt(argc, argv, &i, "--vocab", &v)) {
            if (!cli_int("--vocab", v, 66, 1 << 20, &x)) return 2;
            c.cfg.vocab_size = x;
        } else if (cli_opt(argc, argv, &i, "--dtype", &v)) {
            if (parse_list("--dtype", v, dtype_names, 2, don)) return 2;
        } else if (cli_opt(argc, argv, &i, "--cases", &v)) {
            if (parse_list("--cases", v, case_names, NCASE, con)) return 2;
        } else if (cli_opt(argc, argv, &i, "--case", &v)) {
            which = v;
        } else if (cli_opt(argc, argv, &i, "--weights", &v)) {
            weights = v;
        } else if (cli_opt(argc, argv, &i, "--torch-modes", &v)) {
            if (parse_list("--torch-modes", v, torch_modes, 2, ton)) return 2;
        } else if (cli_opt(argc, argv, &i, "--torch-attention", &v)) {
            if (strcmp(v, "causal") && strcmp(v, "mask")) {
                fprintf(stderr, "ctorch bench train: --torch-attention must be causal or mask, got '%s'\n", v);
                return 2;
            }
            tattn = v;
        } else if (!strcmp(argv[i], "--no-torch")) {
            ton[0] = ton[1] = false;
        } else {
            fprintf(stderr, "ctorch bench train: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    ct_status s = ct_gpt_config_check(&c.cfg);
    if (s) return cli_fail("bench train: model", s);
    if (which) {
        if (!weights) {
            fprintf(stderr, "ctorch bench train: --case needs --weights\n");
            return 2;
        }
        return run_case(b, &c, which, weights);
    }
    char path[4096];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/ctorch-bench-train-%d.safetensors", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    int rc = write_weights(&c, path);
    if (rc) return rc;
    double sg = bench_sgemm_gflops();
    char sB[32], sT[32], sW[32], sL[32], sC[32], sH[32], sK[32], sF[32], sV[32], sR[32], st[32];
    snprintf(sB, sizeof sB, "%lld", c.batch);
    snprintf(sT, sizeof sT, "%lld", (long long)c.cfg.context);
    snprintf(sW, sizeof sW, "%lld", (long long)c.cfg.window);
    snprintf(sL, sizeof sL, "%lld", (long long)c.cfg.n_layer);
    snprintf(sC, sizeof sC, "%lld", (long long)c.cfg.d_model);
    snprintf(sH, sizeof sH, "%lld", (long long)c.cfg.n_head);
    snprintf(sK, sizeof sK, "%lld", (long long)c.cfg.n_kv_head);
    snprintf(sF, sizeof sF, "%lld", (long long)c.cfg.d_ff);
    snprintf(sV, sizeof sV, "%lld", (long long)c.cfg.vocab_size);
    snprintf(sR, sizeof sR, "%d", b->repeats);
    snprintf(st, sizeof st, "%d", ct_num_threads());
    /* res[d][0..NCASE): ctorch's cases in dtype d; res[d][NCASE + k]: PyTorch's mode k */
    json_t *res[2][NROW] = {{0}};
    for (int d = 0; d < 2 && !rc; d++) {
        if (!don[d]) continue;
        for (int k = 0; k < NCASE && !rc; k++) {
            if (!con[k]) continue;
            char name[64];
            snprintf(name, sizeof name, "%s%s", case_names[k], d ? "-bf16" : "");
            char *args[32] = {"train",     "--case",    name,
                              "--weights", path,        "--batch",
                              sB,          "--seq",     sT,
                              "--window",  sW,          "--layers",
                              sL,          "--d-model", sC,
                              "--heads",   sH,          "--kv-heads",
                              sK,          "--ffn",     sF,
                              "--vocab",   sV,          "--repeats",
                              sR,          NULL};
            res[d][k] = bench_child(b, args);
            if (!res[d][k]) rc = 1;
        }
        /* PyTorch 2.13, eager and compiled, each in its own process; bf16 under autocast */
        for (int k = 0; k < 2 && !rc; k++) {
            if (!ton[k]) continue;
            char *pargs[16] = {"--weights", path, "--repeats", sR, "--mode", (char *)torch_modes[k],
                               "--attention", (char *)tattn, "--threads", st, "--dtype",
                               (char *)dtype_names[d], NULL};
            res[d][NCASE + k] = bench_python("torch_train.py", pargs);
        }
    }
    remove(path);
    if (rc) {
        for (int d = 0; d < 2; d++)
            for (int k = 0; k < NROW; k++)
                json_decref(res[d][k]);
        return rc;
    }
    json_t *dts = json_array();
    for (int d = 0; d < 2; d++)
        if (don[d]) json_array_append_new(dts, json_string(dtype_names[d]));
    json_t *j = json_pack(
        "{s:s, s:s?, s:o, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:o}", "bench", "train",
        "preset", preset, "dtypes", dts, "shape", "batch", (json_int_t)c.batch, "seq",
        (json_int_t)c.cfg.context, "window", (json_int_t)c.cfg.window, "vocab",
        (json_int_t)c.cfg.vocab_size, "layers", (json_int_t)c.cfg.n_layer, "d_model",
        (json_int_t)c.cfg.d_model, "heads", (json_int_t)c.cfg.n_head, "kv_heads",
        (json_int_t)c.cfg.n_kv_head, "ffn", (json_int_t)c.cfg.d_ff, "machine", bench_machine_json(sg));
    double tt[2][2], rt[2][2], mt[2][2];
    for (int d = 0; d < 2; d++) {
        const char *sfx = d ? "_bf16" : "";
        char key[64];
        for (int k = 0; k < NCASE; k++) {
            snprintf(key, sizeof key, "%s%s", case_keys[k], sfx);
            if (res[d][k]) json_object_set(j, key, res[d][k]);
        }
        for (int k = 0; k < 2; k++) {
            snprintf(key, sizeof key, "pytorch_%s%s", torch_modes[k], sfx);
            if (res[d][NCASE + k]) json_object_set(j, key, res[d][NCASE + k]);
        }
        ratios(j, res[d], sfx, tt[d], rt[d], mt[d]);
    }
    /* ctorch's own bf16 step against its f32 step, case by case */
    for (int k = 0; k < NCASE; k++) {
        if (!res[0][k] || !res[1][k]) continue;
        char key[64];
        snprintf(key, sizeof key, "%s_bf16_vs_f32_tokens_per_s", case_keys[k]);
        json_object_set_new(j, key,
                            json_real(jnum(res[1][k], "tokens_per_s", NULL) /
                                      jnum(res[0][k], "tokens_per_s", NULL)));
    }
    if (b->json) {
        bench_print_json(j);
    } else {
        printf("train step%s%s: B=%lld T=%lld window %lld, %lld layers, d_model %lld, %lld heads "
               "(%lld kv), ffn %lld, V %lld\n%d threads, %s, %s, bf16 dot instructions: %s, sgemm "
               "%.1f GFLOP/s\n",
               preset ? " " : "", preset ? preset : "", c.batch, (long long)c.cfg.context,
               (long long)c.cfg.window, (long long)c.cfg.n_layer, (long long)c.cfg.d_model,
               (long long)c.cfg.n_head, (long long)c.cfg.n_kv_head, (long long)c.cfg.d_ff,
               (long long)c.cfg.vocab_size, ct_num_threads(), ct_cpu_name(),
               ct_isa_name(ct_active_isa()), ct_cpu_has_bf16() ? "yes" : "no (widened to f32)", sg);
        printf("  %-50s %8s %10s %14s %14s\n", "", "step s", "tokens/s", "peak tracked",
               "peak RSS");
        static const char *const labels[NROW] = {
            "ctorch fused loss + flex", "ctorch unfused head + flex", "ctorch fused loss + dense SDPA",
            "PyTorch eager (SDPA, unfused head)", "PyTorch torch.compile'd"};
        for (int d = 0; d < 2; d++) {
            if (!don[d]) continue;
            for (int k = 0; k < NROW; k++) {
                char label[96];
                snprintf(label, sizeof label, "%s%s", labels[k],
                         !d ? "" : k < NCASE ? " bf16" : " bf16 autocast");
                row(label, res[d][k]);
            }
        }
        for (int d = 0; d < 2; d++) {
            if (!don[d]) continue;
            const char *dn = dtype_names[d];
            double tf = jnum(res[d][0], "tokens_per_s", NULL);
            if (res[d][0] && res[d][1])
                printf("  %s fused vs unfused head: %.2fx tokens/s, %.1fx less peak tracked memory\n",
                       dn, tf / jnum(res[d][1], "tokens_per_s", NULL),
                       jnum(res[d][1], "peak_tracked_bytes", NULL) /
                           jnum(res[d][0], "peak_tracked_bytes", NULL));
            if (res[d][0] && res[d][2])
                printf("  %s flex vs dense attention: %.2fx tokens/s, %.1fx less peak tracked memory\n",
                       dn, tf / jnum(res[d][2], "tokens_per_s", NULL),
                       jnum(res[d][2], "peak_tracked_bytes", NULL) /
                           jnum(res[d][0], "peak_tracked_bytes", NULL));
            for (int k = 0; k < 2; k++) {
                json_t *r = res[d][NCASE + k];
                if (!r || !(tt[d][k] > 0)) continue;
                printf("  %s ctorch (fused + flex) vs PyTorch %s %s%s: %.2fx tokens/s, %.1fx less peak "
                       "RSS, %.1fx less peak tracked; first step %.1f s; attention: %s\n",
                       dn, json_string_value(json_object_get(r, "torch_version")), torch_modes[k],
                       d ? " (autocast bf16)" : "", tt[d][k], rt[d][k], mt[d][k],
                       jnum(r, "first_step_s", NULL),
                       json_string_value(json_object_get(r, "attention")));
            }
        }
        for (int k = 0; k < NCASE; k++)
            if (res[0][k] && res[1][k])
                printf("  ctorch %s bf16 vs f32: %.2fx tokens/s\n", case_names[k],
                       jnum(res[1][k], "tokens_per_s", NULL) / jnum(res[0][k], "tokens_per_s", NULL));
    }
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < NROW; k++)
            json_decref(res[d][k]);
    json_decref(j);
    return 0;
}

/* The batch, options and weights file of this benchmark, for `ctorch bench scaling`. */
int32_t *bench_train_stream(const bench_train_conf *c, int64_t *n)
{
    return make_stream(c, n);
}

ct_train_options bench_train_options(const bench_train_conf *c, const char *name)
{
    return step_options(c, name);
}

int bench_train_write_weights(const bench_train_conf *c, const char *path)
{
    return write_weights(c, path);
}
