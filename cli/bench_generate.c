/* ctorch bench generate: decoding with the KV cache (ct_gpt_generate: the prompt prefilled
 * once, then one token per step against the cached keys and values) vs the baseline that
 * recomputes the whole sequence for every token (ct_gpt_next_logits), in the same run, on the
 * same random model, prompt and greedy tokens; prompt and decode tokens/s are medians of the
 * repeats after a warm-up. */
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int bench_generate(bench_ctx *b, int argc, char **argv)
{
    long long ctx = 1024, n = 16, batch = 1, layers = 4, dm = 128, heads = 4, kvh = 2, ffn = 384,
              vocab = 32768;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help")) {
            puts("usage: ctorch bench generate [--context N] [--new-tokens N] [--batch B] [--layers L]\n"
                 "                             [--d-model C] [--heads H] [--kv-heads K] [--ffn F]\n"
                 "                             [--vocab V] [--json] [--repeats R]\n"
                 "Greedy generation of --new-tokens tokens (default 16) after a prompt that fills the\n"
                 "context (default 1024) with them, from a random model of ctorch's default shape:\n"
                 "the KV cache (prefill + one token per step) vs recomputing the sequence every token.\n"
                 "Prints prompt and decode tokens/s of both and the decode speedup.");
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
