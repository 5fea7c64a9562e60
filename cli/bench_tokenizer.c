/* ctorch bench tokenizer: encode speed (MB/s of UTF-8 text, one thread) of ctorch's
 * tokenizers on real English text (the files of /usr/share/common-licenses, repeated to --mb MB): its own
 * BPE trained on that text, and GPT-2's real vocabulary (--tokenizer, or the encoder.json +
 * vocab.bpe that scripts/fetch_test_deps.sh makes in build/test-deps/gpt2), beside the baseline
 * of the same run: Hugging Face `tokenizers` encoding the same text with the same files
 * (bench/tokenizers_baseline.py, run by the test stack's python through bench_python). */
#include "bench_util.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct tok_case {
    const ct_tokenizer *t;
    const char *text;
    size_t len;
    int64_t tokens;
} tok_case;

static ct_status run_encode(void *p)
{
    tok_case *c = p;
    int32_t *ids;
    int64_t n;
    ct_status s = ct_tokenizer_encode(c->t, c->text, c->len, &ids, &n);
    if (s) return s;
    c->tokens = n;
    ct_free(ids);
    return CT_OK;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One warm-up, then R timed encodes: the median wall time (bench_time) and the median CPU
 * time of this thread (what the encoder costs when other processes share the cores). */
static ct_status time_case(int R, tok_case *c, bench_time *t, double *cpu)
{
    double w[64], u[64];
    ct_status s = run_encode(c);
    for (int r = 0; r < R && s == CT_OK; r++) {
        double t0 = bench_now(), c0 = cpu_now();
        s = run_encode(c);
        w[r] = bench_now() - t0;
        u[r] = cpu_now() - c0;
    }
    if (s) return s;
    qsort(w, (size_t)R, sizeof *w, cmp_double);
    qsort(u, (size_t)R, sizeof *u, cmp_double);
    t->median = w[R / 2];
    t->min = w[0];
    t->max = w[R - 1];
    t->repeats = R;
    *cpu = u[R / 2];
    return CT_OK;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The license texts, concatenated in name order, repeated to at least want bytes. */
static char *english_text(size_t want, size_t *len, size_t *once)
{
    const char *dir = "/usr/share/common-licenses";
    DIR *d = opendir(dir);
    char *names[256];
    int nn = 0;
    for (struct dirent *e; d && (e = readdir(d)) && nn < 256;)
        if (e->d_name[0] != '.') names[nn++] = strdup(e->d_name);
    if (d) closedir(d);
    qsort(names, (size_t)nn, sizeof *names, cmp_name);
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    for (int i = 0; i < nn; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        FILE *f = stat(path, &st) == 0 && S_ISREG(st.st_mode) ? fopen(path, "rb") : NULL;
        if (f) {
            if (n + (size_t)st.st_size + 1 > cap) buf = realloc(buf, cap = 2 * (n + (size_t)st.st_size + 1));
            n += fread(buf + n, 1, (size_t)st.st_size, f);
            fclose(f);
        }
        free(names[i]);
    }
    if (n == 0) {
        free(buf);
        return NULL;
    }
    *once = n;
    if (want > n) buf = realloc(buf, want + n);
    while (n < want) {
        memcpy(buf + n, buf, *once);
        n += *once;
    }
    *len = n;
    return buf;
}

static json_t *case_json(const char *name, const bench_time *t, double cpu, size_t bytes,
                         int64_t tokens)
{
    return json_pack("{s:s, s:o, s:f, s:f, s:f, s:I, s:I}", "name", name, "time",
                     bench_time_json(t), "cpu_median_s", cpu, "mb_s",
                     (double)bytes / t->median / 1e6, "cpu_mb_s", (double)bytes / cpu / 1e6,
                     "bytes", (json_int_t)bytes, "tokens", (json_int_t)tokens);
}

int bench_tokenizer(bench_ctx *b, int argc, char **argv)
{
    const char *tpath = NULL;
    long long mb = 8, base_kb = 1024;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: ctorch bench tokenizer [--tokenizer PATH] [--mb N] [--baseline-kb K] "
                   "[--json] [--repeats R]\n"
                   "Encode MB/s (one thread) on the license texts of /usr/share/common-licenses\n"
                   "repeated to N MB (default 8): ctorch's BPE trained on them, and GPT-2 (PATH,\n"
                   "default the encoder.json + vocab.bpe scripts/fetch_test_deps.sh makes in\n"
                   "build/test-deps/gpt2), beside Hugging Face tokenizers (the venv's python running\n"
                   "bench/tokenizers_baseline.py) on the first K KiB (default 1024) with the same files.\n"
                   "Wall and CPU (this thread's) medians: CPU MB/s holds when other processes\n"
                   "share the cores.\n");
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--tokenizer", &v))
            tpath = v;
        else if (cli_opt(argc, argv, &i, "--mb", &v)) {
            if (!cli_int("--mb", v, 1, 1024, &mb)) return 2;
        } else if (cli_opt(argc, argv, &i, "--baseline-kb", &v)) {
            if (!cli_int("--baseline-kb", v, 1, 1 << 20, &base_kb)) return 2;
        } else {
            fprintf(stderr, "ctorch bench tokenizer: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    size_t len = 0, once = 0;
    char *text = english_text((size_t)mb << 20, &len, &once);
    if (!text) {
        fprintf(stderr, "ctorch bench tokenizer: no text in /usr/share/common-licenses\n");
        return 1;
    }
    char gdir[4096] = "";
    const char *src = cli_source_dir();
    if (!tpath && src) {
        snprintf(gdir, sizeof gdir, "%s/build/test-deps/gpt2", src);
        struct stat st;
        if (stat(gdir, &st) == 0) tpath = gdir;
    }
    int rc = 0;
    ct_tokenizer *own = NULL, *gpt2 = NULL;
    ct_bpe_options o = ct_bpe_options_default();
    ct_status s = ct_tokenizer_train(text, once, &o, &own);
    if (s) return cli_fail("bench tokenizer: training", s);
    if (tpath && (s = ct_tokenizer_load(tpath, &gpt2))) {
        ct_tokenizer_free(own);
        free(text);
        return cli_fail("bench tokenizer: --tokenizer", s);
    }
    ct_set_num_threads(1);
    tok_case c_own = {own, text, len, 0}, c_gpt2 = {gpt2, text, len, 0};
    bench_time t_own, t_gpt2 = {0};
    double u_own = 0, u_gpt2 = 0;
    if ((s = time_case(b->repeats, &c_own, &t_own, &u_own)) ||
        (gpt2 && (s = time_case(b->repeats, &c_gpt2, &t_gpt2, &u_gpt2)))) {
        rc = cli_fail("bench tokenizer", s);
        goto done;
    }
    /* the baseline: Hugging Face tokenizers on the first base_kb KiB (cut at a line break), a
     * file made by mkstemp in $TMPDIR (or /tmp) */
    json_t *hf = NULL;
    size_t blen = (size_t)base_kb << 10;
    if (blen > len) blen = len;
    while (blen < len && blen > 0 && text[blen - 1] != '\n')
        blen--;
    if (!gpt2) {
        hf = json_pack("{s:s, s:s}", "status", "not installed", "why",
                       "no GPT-2 files: run bash scripts/fetch_test_deps.sh or give --tokenizer");
    } else {
        const char *tmp = getenv("TMPDIR");
        char tfile[4096];
        snprintf(tfile, sizeof tfile, "%s/ctorch-bench-tok-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        int fd = mkstemp(tfile);
        bool wrote = false;
        if (fd >= 0) {
            wrote = write(fd, text, blen) == (ssize_t)blen;
            close(fd);
        }
        if (wrote) {
            char reps[32];
            snprintf(reps, sizeof reps, "%d", b->repeats);
            char *args[] = {"--tokenizer", (char *)tpath, "--text", tfile, "--repeats", reps, NULL};
            hf = bench_python("tokenizers_baseline.py", args);
        } else {
            hf = json_pack("{s:s, s:s}", "status", "failed", "why", "cannot write the baseline's text file");
        }
        if (fd >= 0) unlink(tfile);
    }
    double hf_mb_s = 0, hf_cpu_mb_s = 0;
    double hf_bytes = (double)json_integer_value(json_object_get(hf, "bytes"));
    if (json_real_value(json_object_get(hf, "median_s")) > 0)
        hf_mb_s = hf_bytes / json_real_value(json_object_get(hf, "median_s")) / 1e6;
    if (json_real_value(json_object_get(hf, "cpu_median_s")) > 0)
        hf_cpu_mb_s = hf_bytes / json_real_value(json_object_get(hf, "cpu_median_s")) / 1e6;
    if (hf_mb_s > 0) {
        /* ctorch's count on the same part: equal when both read the files alike */
        tok_case part = {gpt2, text, blen, 0};
        if (run_encode(&part) == CT_OK) json_object_set_new(hf, "ctorch_tokens", json_integer(part.tokens));
        json_object_set_new(hf, "mb_s", json_real(hf_mb_s));
    }
    if (hf_cpu_mb_s > 0) json_object_set_new(hf, "cpu_mb_s", json_real(hf_cpu_mb_s));
    if (hf_mb_s > 0 && json_real_value(json_object_get(hf, "cold_s")) > 0)
        json_object_set_new(hf, "cold_mb_s", json_real(hf_bytes / json_real_value(json_object_get(hf, "cold_s")) / 1e6));
    json_t *cases = json_array();
    json_array_append_new(cases, case_json("ctorch-bpe (own, 4096)", &t_own, u_own, len, c_own.tokens));
    if (gpt2) json_array_append_new(cases, case_json("gpt2 (ctorch)", &t_gpt2, u_gpt2, len, c_gpt2.tokens));
    json_t *j = json_pack("{s:s, s:i, s:I, s:s, s:o, s:o}", "bench", "tokenizer", "threads", 1,
                          "text_bytes", (json_int_t)len, "text", "/usr/share/common-licenses/*",
                          "cases", cases, "baseline_hf_tokenizers", hf);
    if (gpt2 && hf_mb_s > 0)
        json_object_set_new(j, "gpt2_vs_hf_tokenizers",
                            json_real((double)len / t_gpt2.median / 1e6 / hf_mb_s));
    if (b->json) {
        bench_print_json(j);
    } else {
        printf("tokenizer encode: %.1f MB of license texts, 1 thread, median of %d\n",
               (double)len / 1e6, b->repeats);
        printf("  %-34s %10s %9s %9s %10s\n", "", "median", "MB/s", "CPU MB/s", "tokens");
        printf("  %-34s %7.1f ms %9.1f %9.1f %10lld\n", "ctorch-bpe (own, vocab 4096)",
               t_own.median * 1e3, (double)len / t_own.median / 1e6, (double)len / u_own / 1e6,
               (long long)c_own.tokens);
        if (gpt2)
            printf("  %-34s %7.1f ms %9.1f %9.1f %10lld\n", "gpt2 (ctorch)", t_gpt2.median * 1e3,
                   (double)len / t_gpt2.median / 1e6, (double)len / u_gpt2 / 1e6,
                   (long long)c_gpt2.tokens);
        if (hf_mb_s > 0) {
            char name[64];
            const char *ver = json_string_value(json_object_get(hf, "tokenizers_version"));
            snprintf(name, sizeof name, "gpt2 (HF tokenizers %s)", ver ? ver : "?");
            printf("  %-34s %7.1f ms %9.1f %9.1f %10lld  (first %.1f MB, ctorch %lld tokens; "
                   "cold %.1f MB/s)\n", name, json_real_value(json_object_get(hf, "median_s")) * 1e3,
                   hf_mb_s, hf_cpu_mb_s, (long long)json_integer_value(json_object_get(hf, "tokens")),
                   hf_bytes / 1e6, (long long)json_integer_value(json_object_get(hf, "ctorch_tokens")),
                   json_real_value(json_object_get(hf, "cold_mb_s")));
        } else {
            const char *why = json_string_value(json_object_get(hf, "why"));
            printf("  gpt2 (HF tokenizers): %s%s%s\n", json_string_value(json_object_get(hf, "status")),
                   why ? ": " : "", why ? why : "");
        }
    }
    json_decref(j);
done:
    ct_tokenizer_free(own);
    ct_tokenizer_free(gpt2);
    free(text);
    return rc;
}
