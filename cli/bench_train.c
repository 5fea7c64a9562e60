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
#include <unistd.h>

typedef struct tcase {
    ct_trainer *t;
} tcase;

static ct_status run_step(void *p)
{
    return ct_trainer_step(((tcase *)p)->t, NULL);
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
    tcase tc = {NULL};
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
        ct_trainer_free(tc.t);
        free(x);
        return cli_fail("bench train", s);
    }
    ct_memory_stats(&m1);
    ct_gpt_memory mem = ct_gpt_memory_sizes(ct_trainer_model(tc.t));
    double tokens = (double)(c->batch * c->cfg.context);
    json_t *j = json_pack("{s:s, s:o, s:f, s:I, s:I, s:{s:I, s:I, s:I, s:I}}", "case", name, "step",
                          bench_time_json(&bt), "tokens_per_s", tokens / bt.median,
                          "peak_tracked_bytes", (json_int_t)(m1.peak_bytes - m0.current_bytes),
                          "peak_rss_bytes", (json_int_t)bench_peak_rss(), "allocations", "params",
                          (json_int_t)mem.params, "grads", (json_int_t)mem.grads, "optimizer",
                          (json_int_t)mem.optimizer, "activations", (json_int_t)mem.activations);
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
        printf("  %-34s %s\n", label, json_string_value(json_object_get(c, "status")));
        return;
    }
    printf("  %-34s %8.3f %10.0f", label, jnum(c, "step", "median_s"),
           jnum(c, "tokens_per_s", NULL));
    if (json_object_get(c, "peak_tracked_bytes"))
        printf(" %10.1f MiB", jnum(c, "peak_tracked_bytes", NULL) / 1048576.0);
    else
        printf(" %14s", "-");
    printf(" %10.1f MiB\n", jnum(c, "peak_rss_bytes", NULL) / 1048576.0);
}

int bench_train(bench_ctx *b, int argc, char **argv)
{
    bconf c = {ct_gpt_config_default(), 2};
    c.cfg.context = 512;
    c.cfg.window = 128;
    const char *which = NULL, *weights = NULL, *tmodes = "eager,compiled", *tattn = "causal";
    for (int i = 1; i < argc; i++) {
        const char *v;
        long long x;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            puts(
                "usage: ctorch bench train [--batch B] [--seq T] [--window W] [--layers N] "
                "[--d-model C]\n"
                "       [--heads H] [--kv-heads K] [--ffn F] [--vocab V] [--torch-modes LIST]\n"
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
                "Defaults: the default ctorch train model (V 32768, 4 layers, d_model 128, 4 "
                "heads, 2 kv,\n"
                "ffn 384) with B=2, T=512 and a causal window of 128. Reports the median step "
                "time,\n"
                "tokens/s, the allocator's peak tracked bytes and the process's peak RSS.");
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--batch", &v)) {
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
        } else if (cli_opt(argc, argv, &i, "--case", &v)) {
            which = v;
        } else if (cli_opt(argc, argv, &i, "--weights", &v)) {
            weights = v;
        } else if (cli_opt(argc, argv, &i, "--torch-modes", &v)) {
            if (strcmp(v, "eager") && strcmp(v, "compiled") && strcmp(v, "eager,compiled") &&
                strcmp(v, "compiled,eager")) {
                fprintf(stderr, "ctorch bench train: --torch-modes must be eager, compiled or eager,compiled; "
                                "got '%s'\n", v);
                return 2;
            }
            tmodes = v;
        } else if (cli_opt(argc, argv, &i, "--torch-attention", &v)) {
            if (strcmp(v, "causal") && strcmp(v, "mask")) {
                fprintf(stderr, "ctorch bench train: --torch-attention must be causal or mask, got '%s'\n", v);
                return 2;
            }
            tattn = v;
        } else if (!strcmp(argv[i], "--no-torch")) {
            tmodes = "";
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
    char sB[32], sT[32], sW[32], sL[32], sC[32], sH[32], sK[32], sF[32], sV[32], sR[32];
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
    const char *names[3] = {"fused-flex", "unfused-flex", "fused-dense"};
    json_t *res[5] = {0};
    for (int k = 0; k < 3 && !rc; k++) {
        char *args[32] = {"train",     "--case",    (char *)names[k],
                          "--weights", path,        "--batch",
                          sB,          "--seq",     sT,
                          "--window",  sW,          "--layers",
                          sL,          "--d-model", sC,
                          "--heads",   sH,          "--kv-heads",
                          sK,          "--ffn",     sF,
                          "--vocab",   sV,          "--repeats",
                          sR,          NULL};
        res[k] = bench_child(b, args);
        if (!res[k]) rc = 1;
    }
    /* PyTorch 2.13, eager and compiled, each in its own process */
    static const char *const tm[2] = {"eager", "compiled"};
    for (int k = 0; k < 2 && !rc; k++) {
        if (!strstr(tmodes, tm[k])) continue;
        char st[32];
        snprintf(st, sizeof st, "%d", ct_num_threads());
        char *pargs[16] = {"--weights", path, "--repeats", sR, "--mode", (char *)tm[k],
                           "--attention", (char *)tattn, "--threads", st, NULL};
        res[3 + k] = bench_python("torch_train.py", pargs);
    }
    remove(path);
    if (rc) {
        for (int k = 0; k < 5; k++)
            json_decref(res[k]);
        return rc;
    }
    json_t *j =
        json_pack("{s:s, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:o}", "bench", "train",
                  "shape", "batch", (json_int_t)c.batch, "seq", (json_int_t)c.cfg.context, "window",
                  (json_int_t)c.cfg.window, "vocab", (json_int_t)c.cfg.vocab_size, "layers",
                  (json_int_t)c.cfg.n_layer, "d_model", (json_int_t)c.cfg.d_model, "heads",
                  (json_int_t)c.cfg.n_head, "kv_heads", (json_int_t)c.cfg.n_kv_head, "ffn",
                  (json_int_t)c.cfg.d_ff, "machine", bench_machine_json(sg));
    const char *keys[5] = {"fused_flex", "unfused_flex", "fused_dense", "pytorch_eager", "pytorch_compiled"};
    for (int k = 0; k < 5; k++)
        if (res[k]) json_object_set_new(j, keys[k], res[k]);
    double tf = jnum(res[0], "tokens_per_s", NULL), tu = jnum(res[1], "tokens_per_s", NULL);
    double td = jnum(res[2], "tokens_per_s", NULL);
    double mf = jnum(res[0], "peak_tracked_bytes", NULL),
           mu = jnum(res[1], "peak_tracked_bytes", NULL);
    double md = jnum(res[2], "peak_tracked_bytes", NULL);
    json_object_set_new(j, "fused_vs_unfused_tokens_per_s", json_real(tf / tu));
    json_object_set_new(j, "fused_vs_unfused_peak_tracked", json_real(mu / mf));
    json_object_set_new(j, "flex_vs_dense_tokens_per_s", json_real(tf / td));
    json_object_set_new(j, "flex_vs_dense_peak_tracked", json_real(md / mf));
    double tt[2] = {0}, rt[2] = {0}, mt[2] = {0};
    for (int k = 0; k < 2; k++) {
        if (!json_object_get(res[3 + k], "step")) continue;
        tt[k] = tf / jnum(res[3 + k], "tokens_per_s", NULL);
        rt[k] = jnum(res[3 + k], "peak_rss_bytes", NULL) / jnum(res[0], "peak_rss_bytes", NULL);
        mt[k] = jnum(res[3 + k], "peak_tracked_bytes", NULL) / mf;
        char key[64];
        snprintf(key, sizeof key, "ctorch_vs_pytorch_%s_tokens_per_s", tm[k]);
        json_object_set_new(j, key, json_real(tt[k]));
        snprintf(key, sizeof key, "pytorch_%s_vs_ctorch_peak_rss", tm[k]);
        json_object_set_new(j, key, json_real(rt[k]));
        snprintf(key, sizeof key, "pytorch_%s_vs_ctorch_peak_tracked", tm[k]);
        json_object_set_new(j, key, json_real(mt[k]));
    }
    if (b->json) {
        bench_print_json(j);
    } else {
        printf("train step: B=%lld T=%lld window %lld, %lld layers, d_model %lld, %lld heads (%lld "
               "kv), ffn %lld, "
               "V %lld\n%d threads, %s, sgemm %.1f GFLOP/s\n",
               c.batch, (long long)c.cfg.context, (long long)c.cfg.window, (long long)c.cfg.n_layer,
               (long long)c.cfg.d_model, (long long)c.cfg.n_head, (long long)c.cfg.n_kv_head,
               (long long)c.cfg.d_ff, (long long)c.cfg.vocab_size, ct_num_threads(),
               ct_isa_name(ct_active_isa()), sg);
        printf("  %-34s %8s %10s %14s %14s\n", "", "step s", "tokens/s", "peak tracked",
               "peak RSS");
        row("ctorch fused loss + flex", res[0]);
        row("ctorch unfused head + flex", res[1]);
        row("ctorch fused loss + dense SDPA", res[2]);
        row("PyTorch eager (SDPA, unfused head)", res[3]);
        row("PyTorch torch.compile'd", res[4]);
        printf("  fused vs unfused head: %.2fx tokens/s, %.1fx less peak tracked memory\n", tf / tu,
               mu / mf);
        printf("  flex vs dense attention: %.2fx tokens/s, %.1fx less peak tracked memory\n",
               tf / td, md / mf);
        for (int k = 0; k < 2; k++) {
            if (!res[3 + k]) continue;
            if (tt[k] > 0)
                printf("  ctorch (fused + flex) vs PyTorch %s %s: %.2fx tokens/s, %.1fx less peak RSS, %.1fx less "
                       "peak tracked; first step %.1f s; attention: %s\n",
                       json_string_value(json_object_get(res[3 + k], "torch_version")), tm[k], tt[k], rt[k], mt[k],
                       jnum(res[3 + k], "first_step_s", NULL),
                       json_string_value(json_object_get(res[3 + k], "attention")));
        }
    }
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
