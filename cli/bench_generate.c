/* ctorch bench generate: decoding with the KV cache (ct_gpt_generate: the prompt prefilled
 * once, then one token per step against the cached keys and values) vs the baseline that
 * recomputes the whole sequence for every token (ct_gpt_next_logits), in the same run, on the
 * same random model, prompt and greedy tokens; prompt and decode tokens/s are medians of the
 * repeats after a warm-up. With --model DIR (a Hugging Face directory) or --dtype bf16|f16 (the
 * random model written as one, in that dtype, under $TMPDIR and removed after): the KV cache
 * on the directory's weights mapped in their dtype (ct_hf_map_model) vs converted to f32
 * (ct_hf_load_params), same prompt. */
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static bench_time summarise(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    bench_time t = {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v[0], v[n - 1], n};
    return t;
}

typedef struct gen_result {
    bench_time prompt, decode;
    size_t peak;
    int32_t *out;
} gen_result;

/* Warm-up + repeats of one way of generating; times from ct_generate_stats. */
static ct_status run_way(ct_gpt *m, const int32_t *prompt, int64_t B, int64_t T, int64_t n,
                         bool no_cache, int repeats, gen_result *r)
{
    ct_generate_options o = ct_generate_options_default();
    o.max_new_tokens = n;
    o.sample.temperature = 0;
    o.no_cache = no_cache;
    double *ps = malloc(sizeof(double) * (size_t)repeats), *ds = malloc(sizeof(double) * (size_t)repeats);
    ct_status s = ps && ds ? CT_OK : CT_ENOMEM;
    for (int i = -1; !s && i < repeats; i++) {
        ct_generate_stats st;
        ct_memory_reset_peak();
        ct_memory_stats_t before, after;
        ct_memory_stats(&before);
        s = ct_gpt_generate(m, prompt, B, T, &o, r->out, NULL, &st);
        ct_memory_stats(&after);
        r->peak = after.peak_bytes - before.current_bytes;
        if (!s && i >= 0) {
            ps[i] = st.prompt_seconds;
            ds[i] = st.decode_seconds;
        }
    }
    if (!s) {
        r->prompt = summarise(ps, repeats);
        r->decode = summarise(ds, repeats);
    }
    free(ps);
    free(ds);
    return s;
}

/* One way of loading the directory: mapped or converted, its KV-cache generation. */
typedef struct hf_way {
    ct_gpt *m;
    gen_result r;
    size_t anon;     /* anonymous RSS growth of loading it */
    ct_gpt_memory mem;
    double load_s;
    int in_place;    /* tensors read in place (mapped) */
} hf_way;

static ct_status load_way(ct_hf_model *h, const ct_gpt_options *mo, bool mapped, hf_way *w)
{
    size_t a0 = bench_rss_anon();
    double t0 = bench_now();
    ct_status s = mapped ? ct_hf_map_model(h, mo, &w->m, &w->in_place)
                         : ct_gpt_create(ct_hf_get_config(h), mo, &w->m);
    if (!s && !mapped) s = ct_hf_load_params(h, w->m);
    w->load_s = bench_now() - t0;
    size_t a1 = bench_rss_anon();
    w->anon = a1 > a0 ? a1 - a0 : 0;
    if (!s) w->mem = ct_gpt_memory_sizes(w->m);
    return s;
}

static json_t *way_json(const hf_way *w, double pt, double dt)
{
    return json_pack("{s:o, s:o, s:f, s:f, s:I, s:I, s:I, s:I, s:f, s:i}", "prompt_time",
                     bench_time_json(&w->r.prompt), "decode_time", bench_time_json(&w->r.decode),
                     "prompt_tok_s", pt / w->r.prompt.median, "decode_tok_s", dt / w->r.decode.median,
                     "generate_peak_bytes", (json_int_t)w->r.peak, "weight_bytes",
                     (json_int_t)(w->mem.params + w->mem.grads), "activation_bytes",
                     (json_int_t)w->mem.activations,
                     "load_rss_anon_bytes", (json_int_t)w->anon, "load_s", w->load_s,
                     "tensors_in_place", w->in_place);
}

/* The random model of cfg written as a Hugging Face directory in dtype dt under dir. */
static ct_status write_random_dir(const ct_gpt_config *cfg, int dt, const char *dir)
{
    ct_gpt_options mo = ct_gpt_options_default();
    mo.batch = 1;
    mo.seq = 1;
    ct_gpt *m = NULL;
    ct_status s = ct_gpt_create(cfg, &mo, &m);
    if (!s) s = ct_gpt_init(m, 1);
    ct_hf_save_options so = ct_hf_save_options_default();
    so.dtype = dt;
    if (!s) s = ct_hf_save(m, NULL, dir, &so);
    ct_gpt_free(m);
    return s;
}

static void remove_random_dir(const char *dir)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

static int bench_generate_hf(bench_ctx *b, const char *model, int dt, const ct_gpt_config *rcfg,
                             int64_t ctx, int64_t n, int64_t B)
{
    char tmp[4096] = "";
    ct_status s = CT_OK;
    if (!model) {
        const char *td = getenv("TMPDIR");
        snprintf(tmp, sizeof tmp, "%s/ctorch-bench-generate-%ld", td && *td ? td : "/tmp",
                 (long)getpid());
        if ((s = write_random_dir(rcfg, dt, tmp))) {
            remove_random_dir(tmp);
            return cli_fail("bench generate: writing the directory", s);
        }
        model = tmp;
    }
    ct_hf_model *h = NULL;
    hf_way w[2];
    memset(w, 0, sizeof w);
    int32_t *prompt = NULL;
    int rc = 0;
    if ((s = ct_hf_open(model, &h))) {
        rc = cli_fail("bench generate: --model", s);
        goto done;
    }
    const ct_gpt_config *cfg = ct_hf_get_config(h);
    if (ctx > cfg->context) ctx = cfg->context;
    if (n >= ctx) {
        fprintf(stderr, "ctorch bench generate: --new-tokens must be below the context (%lld)\n",
                (long long)ctx);
        rc = 2;
        goto done;
    }
    int64_t T = ctx - n, V = cfg->vocab_size;
    ct_gpt_options mo = ct_gpt_options_default();
    mo.batch = 1;
    mo.seq = ctx; /* the window generation reads (its activations stay untouched with the cache) */
    prompt = malloc((size_t)(B * T) * sizeof *prompt);
    w[0].r.out = malloc((size_t)(B * ctx) * sizeof(int32_t));
    w[1].r.out = malloc((size_t)(B * ctx) * sizeof(int32_t));
    if (!prompt || !w[0].r.out || !w[1].r.out) {
        rc = cli_fail("bench generate", CT_ENOMEM);
        goto done;
    }
    ct_rng rng;
    ct_rng_seed(&rng, 7);
    for (int64_t i = 0; i < B * T; i++)
        prompt[i] = (int32_t)(ct_rng_next(&rng) % (uint64_t)V);
    double sgemm = bench_sgemm_gflops();
    for (int k = 0; k < 2; k++) { /* mapped, then converted (one model alive at a time) */
        if ((s = load_way(h, &mo, k == 0, &w[k])) ||
            (s = run_way(w[k].m, prompt, B, T, n, false, b->repeats, &w[k].r))) {
            rc = cli_fail("bench generate", s);
            goto done;
        }
        ct_gpt_free(w[k].m);
        w[k].m = NULL;
    }
    bool same = memcmp(w[0].r.out, w[1].r.out, (size_t)(B * ctx) * sizeof(int32_t)) == 0;
    double pt = (double)(B * T), dtk = (double)(B * (n - 1));
    const ct_hf_info *info = ct_hf_get_info(h);
    const char *dname = info->dtype == CT_DTYPE_BF16 ? "bf16" : info->dtype == CT_DTYPE_F16 ? "f16" : "f32";
    char *cj = NULL;
    ct_gpt_config_to_json(cfg, &cj);
    double ratio = w[1].r.decode.median / w[0].r.decode.median;
    json_t *j = json_pack("{s:s, s:o, s:s, s:s, s:o, s:{s:I, s:I, s:I, s:I}, s:o, s:o, s:f, s:b}",
                          "bench", "generate", "machine", bench_machine_json(sgemm), "directory",
                          tmp[0] ? "random (written by the benchmark)" : model, "dtype", dname,
                          "config", cj ? json_loads(cj, 0, NULL) : json_null(), "shape", "batch",
                          (json_int_t)B, "context", (json_int_t)ctx, "prompt_tokens", (json_int_t)T,
                          "new_tokens", (json_int_t)n, "mapped", way_json(&w[0], pt, dtk),
                          "converted_f32", way_json(&w[1], pt, dtk), "decode_mapped_vs_converted",
                          ratio, "same_tokens", same);
    if (b->json) {
        bench_print_json(j);
    } else {
        printf("generate: %s directory (%lld layers, d_model %lld, d_ff %lld, vocab %lld); batch %lld, "
               "prompt %lld + %lld new tokens, greedy, KV cache; %d threads, %s\n",
               dname, (long long)cfg->n_layer, (long long)cfg->d_model, (long long)cfg->d_ff,
               (long long)V, (long long)B, (long long)T, (long long)n, ct_num_threads(),
               ct_isa_name(ct_active_isa()));
        printf("  %-26s %12s %12s %10s %12s %12s\n", "", "prompt tok/s", "decode tok/s", "load s",
               "params MiB", "+anon MiB");
        const char *names[2] = {"mapped (in its dtype)", "converted to f32"};
        for (int k = 0; k < 2; k++)
            printf("  %-26s %12.1f %12.1f %10.3f %12.1f %12.1f\n", names[k],
                   pt / w[k].r.prompt.median, dtk / w[k].r.decode.median, w[k].load_s,
                   (double)(w[k].mem.params + w[k].mem.grads) / 1048576.0,
                   (double)w[k].anon / 1048576.0);
        printf("  decode mapped / converted: %.2fx; same tokens: %s\n", ratio,
               same ? "yes" : "no (rounding decided a near tie)");
    }
    json_decref(j);
    ct_free(cj);
done:
    for (int k = 0; k < 2; k++) {
        ct_gpt_free(w[k].m);
        free(w[k].r.out);
    }
    free(prompt);
    ct_hf_close(h);
    if (tmp[0]) remove_random_dir(tmp);
    return rc;
}

int bench_generate(bench_ctx *b, int argc, char **argv)
{
    long long ctx = 1024, n = 16, batch = 1, layers = 4, dm = 128, heads = 4, kvh = 2, ffn = 384,
              vocab = 32768;
    const char *model = NULL;
    int dtype = -1;
    bool shape_given = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (cli_opt(argc, argv, &i, "--model", &v)) {
            model = v;
            continue;
        }
        if (cli_opt(argc, argv, &i, "--dtype", &v)) {
            if (!strcmp(v, "bf16")) dtype = CT_DTYPE_BF16;
            else if (!strcmp(v, "f16")) dtype = CT_DTYPE_F16;
            else {
                fprintf(stderr, "ctorch bench generate: --dtype must be bf16 or f16, got '%s'\n", v);
                return 2;
            }
            continue;
        }
        if (!strcmp(argv[i], "--help")) {
            puts("usage: ctorch bench generate [--context N] [--new-tokens N] [--batch B] [--layers L]\n"
                 "                             [--d-model C] [--heads H] [--kv-heads K] [--ffn F]\n"
                 "                             [--vocab V] [--json] [--repeats R]\n"
                 "       ctorch bench generate --model DIR | --dtype bf16|f16 [--context N] [--new-tokens N]\n"
                 "                             [--batch B] [shape options with --dtype]\n"
                 "Greedy generation of --new-tokens tokens (default 16) after a prompt that fills the\n"
                 "context (default 1024) with them, from a random model of ctorch's default shape:\n"
                 "the KV cache (prefill + one token per step) vs recomputing the sequence every token.\n"
                 "Prints prompt and decode tokens/s of both and the decode speedup.\n"
                 "--model DIR (a Hugging Face directory; the shape is its own) or --dtype (the random\n"
                 "model written as one in bf16 / f16 under $TMPDIR, removed after): the KV cache on its\n"
                 "weights mapped in their dtype (ct_hf_map_model) vs converted to f32\n"
                 "(ct_hf_load_params): prompt and decode tokens/s, load time, model memory.");
            return 0;
        }
        struct { const char *name; long long lo, hi, *dst; } opts[] = {
            {"--context", 2, 1 << 16, &ctx}, {"--new-tokens", 2, 4096, &n}, {"--batch", 1, 256, &batch},
            {"--layers", 1, 64, &layers},    {"--d-model", 2, 8192, &dm},   {"--heads", 1, 256, &heads},
            {"--kv-heads", 1, 256, &kvh},    {"--ffn", 1, 65536, &ffn},     {"--vocab", 2, 1 << 20, &vocab}};
        bool found = false;
        for (size_t k = 0; k < sizeof opts / sizeof opts[0] && !found; k++)
            if (cli_opt(argc, argv, &i, opts[k].name, &v)) {
                if (!cli_int(opts[k].name, v, opts[k].lo, opts[k].hi, opts[k].dst)) return 2;
                found = true;
                shape_given = shape_given || k >= 3;
            }
        if (!found) {
            fprintf(stderr, "ctorch bench generate: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (n >= ctx) {
        fprintf(stderr, "ctorch bench generate: --new-tokens must be below --context\n");
        return 2;
    }
    ct_gpt_config cfg = ct_gpt_config_default();
    cfg.vocab_size = vocab;
    cfg.context = ctx;
    cfg.n_layer = layers;
    cfg.d_model = dm;
    cfg.n_head = heads;
    cfg.n_kv_head = kvh;
    cfg.d_ff = ffn;
    if (model && (shape_given || dtype >= 0)) {
        fprintf(stderr, "ctorch bench generate: --model takes its shape and dtype from the "
                        "directory (no --layers, --d-model, --heads, --kv-heads, --ffn, --vocab, "
                        "--dtype)\n");
        return 2;
    }
    if (model || dtype >= 0) return bench_generate_hf(b, model, dtype, &cfg, ctx, n, batch);
    ct_gpt_options mo = ct_gpt_options_default();
    mo.batch = 1;
    int64_t T = ctx - n, B = batch;
    ct_gpt *m = NULL;
    ct_status s;
    if ((s = ct_gpt_create(&cfg, &mo, &m)) || (s = ct_gpt_init(m, 1))) {
        ct_gpt_free(m);
        return cli_fail("bench generate", s);
    }
    int32_t *prompt = malloc((size_t)(B * T) * sizeof *prompt);
    gen_result rc = {0}, rb = {0};
    rc.out = malloc((size_t)(B * ctx) * sizeof(int32_t));
    rb.out = malloc((size_t)(B * ctx) * sizeof(int32_t));
    if (!prompt || !rc.out || !rb.out) {
        ct_gpt_free(m);
        return cli_fail("bench generate", CT_ENOMEM);
    }
    ct_rng rng;
    ct_rng_seed(&rng, 7);
    for (int64_t i = 0; i < B * T; i++)
        prompt[i] = (int32_t)(ct_rng_next(&rng) % (uint64_t)vocab);
    double sgemm = bench_sgemm_gflops();
    if ((s = run_way(m, prompt, B, T, n, false, b->repeats, &rc)) ||
        (s = run_way(m, prompt, B, T, n, true, b->repeats, &rb))) {
        ct_gpt_free(m);
        return cli_fail("bench generate", s);
    }
    bool same = memcmp(rc.out, rb.out, (size_t)(B * ctx) * sizeof(int32_t)) == 0;
    double rows = (double)B, pt = rows * (double)T, dt = rows * (double)(n - 1);
    double c_p = pt / rc.prompt.median, c_d = dt / rc.decode.median;
    double b_p = pt / rb.prompt.median, b_d = dt / rb.decode.median;
    char *cj = NULL;
    ct_gpt_config_to_json(&cfg, &cj);
    json_t *j = json_pack(
        "{s:s, s:o, s:o, s:{s:I, s:I, s:I, s:I}, s:{s:o, s:o, s:f, s:f, s:I}, "
        "s:{s:o, s:o, s:f, s:f, s:I}, s:f, s:b}",
        "bench", "generate", "machine", bench_machine_json(sgemm), "config",
        cj ? json_loads(cj, 0, NULL) : json_null(), "shape", "batch", (json_int_t)B, "context",
        (json_int_t)ctx, "prompt_tokens", (json_int_t)T, "new_tokens", (json_int_t)n, "kv_cache",
        "prompt_time", bench_time_json(&rc.prompt), "decode_time", bench_time_json(&rc.decode),
        "prompt_tok_s", c_p, "decode_tok_s", c_d, "peak_bytes", (json_int_t)rc.peak, "no_cache",
        "prompt_time", bench_time_json(&rb.prompt), "decode_time", bench_time_json(&rb.decode),
        "prompt_tok_s", b_p, "decode_tok_s", b_d, "peak_bytes", (json_int_t)rb.peak,
        "decode_speedup", c_d / b_d, "same_tokens", same);
    if (b->json) {
        bench_print_json(j);
    } else {
        printf("generate: %lld layers, d_model %lld, %lld/%lld heads, vocab %lld; batch %lld, prompt "
               "%lld + %lld new tokens (context %lld), greedy; %d threads, %s\n",
               layers, dm, heads, kvh, vocab, batch, (long long)T, n, ctx, ct_num_threads(),
               ct_isa_name(ct_active_isa()));
        printf("  %-26s %12s %12s %12s %12s\n", "", "prompt s", "prompt tok/s", "decode s",
               "decode tok/s");
        printf("  %-26s %12.4f %12.1f %12.4f %12.1f\n", "KV cache", rc.prompt.median, c_p,
               rc.decode.median, c_d);
        printf("  %-26s %12.4f %12.1f %12.4f %12.1f\n", "no cache (recompute all)",
               rb.prompt.median, b_p, rb.decode.median, b_d);
        printf("  decode speedup with the cache: %.1fx; same tokens: %s; tracked peak %.1f MiB "
               "(cache) vs %.1f MiB\n",
               c_d / b_d, same ? "yes" : "NO", (double)rc.peak / 1048576.0,
               (double)rb.peak / 1048576.0);
    }
    json_decref(j);
    ct_free(cj);
    free(prompt);
    free(rc.out);
    free(rb.out);
    ct_gpt_free(m);
    return same ? 0 : 1;
}
