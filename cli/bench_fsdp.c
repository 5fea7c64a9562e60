/* ctorch bench fsdp: training steps of a model where communication matters (d_model 512, 8
 * layers) at N = 1 and N = 2 ranks of one thread each: tokens/s, exposed communication, per-rank
 * peak tracked memory; FSDP with overlap on and off, with and without the separate
 * reduce-scatter communicator, data parallel; beside PyTorch 2.13 (bench/torch_ddp.py: one
 * process, DDP over gloo and FSDP2 fully_shard over gloo at N = 2) on the same weights and tokens. Each case is a `ctorch train` run in its own
 * processes (through the launcher for N = 2); figures are medians over the timed steps. */
#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct fcase {
    const char *name, *what;
    int nproc;
    const char *flags[4];
} fcase;

static const fcase CASES[] = {
    {"single", "one process, no communicator", 1, {NULL}},
    {"fsdp", "FSDP, overlap on, separate reduce-scatter communicator", 2, {"--fsdp", NULL}},
    {"fsdp-no-overlap", "FSDP, every collective waited at once", 2, {"--fsdp", "--no-overlap", NULL}},
    {"fsdp-shared-rs", "FSDP, reduce-scatters on the all-gather communicator", 2,
     {"--fsdp", "--no-separate-rs", NULL}},
    {"dp", "data parallel, bucketed all_reduce", 2, {"--dp", NULL}},
};
#define NCASES (sizeof CASES / sizeof CASES[0])

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Run argv quietly (stdout and stderr to /dev/null unless verbose); exit status. */
static int run_quiet(char *const argv[])
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int n = open("/dev/null", O_WRONLY); /* async-signal-safe until exec */
        if (n >= 0) {
            dup2(n, 1);
            dup2(n, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void usage(FILE *f)
{
    fputs("usage: ctorch bench fsdp [--json] [--steps N] [--layers L] [--d-model C] [--batch B]\n"
          "                         [--seq T] [--cases LIST] [--torch-modes LIST] [--no-torch]\n"
          "Training steps at N=1 and N=2 ranks of one thread: tokens/s, exposed communication\n"
          "(% of the step and of the collectives' time), per-rank peak tracked memory and\n"
          "training state; FSDP overlap on/off, separate reduce-scatter communicator on/off,\n"
          "data parallel; PyTorch 2.13 one process, DDP over gloo and FSDP2 (fully_shard per\n"
          "block, gloo) on the same model (bench/torch_ddp.py; SDPA is_causal, so without the\n"
          "document mask). Cases (LIST, all by default): single, fsdp, fsdp-no-overlap,\n"
          "fsdp-shared-rs, dp; PyTorch modes: single, ddp, fsdp2.\n"
          "Defaults: 8 layers, d_model 512, 8 heads (4 kv), ffn 1024, vocab 2048, batch 4 x 32,\n"
          "3 steps (the first is not timed).\n",
          f);
}

int bench_fsdp(bench_ctx *b, int argc, char **argv)
{
    long long steps = 3, layers = 8, dmodel = 512, batch = 4, seq = 32;
    bool torch = true;
    const char *only = NULL, *tmodes = "single,ddp,fsdp2";
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (cli_opt(argc, argv, &i, "--steps", &v)) {
            if (!cli_int("--steps", v, 2, 1000, &steps)) return 2;
        } else if (cli_opt(argc, argv, &i, "--layers", &v)) {
            if (!cli_int("--layers", v, 1, 64, &layers)) return 2;
        } else if (cli_opt(argc, argv, &i, "--d-model", &v)) {
            if (!cli_int("--d-model", v, 64, 4096, &dmodel) || dmodel % 64) return 2;
        } else if (cli_opt(argc, argv, &i, "--batch", &v)) {
            if (!cli_int("--batch", v, 2, 1024, &batch) || batch % 2) return 2;
        } else if (cli_opt(argc, argv, &i, "--seq", &v)) {
            if (!cli_int("--seq", v, 8, 4096, &seq)) return 2;
        } else if (!strcmp(argv[i], "--no-torch")) {
            torch = false;
        } else if (cli_opt(argc, argv, &i, "--cases", &v)) {
            only = v;
        } else if (cli_opt(argc, argv, &i, "--torch-modes", &v)) {
            tmodes = v;
        } else {
            fprintf(stderr, "ctorch bench fsdp: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (only) { /* every name a case */
        const char *p = only;
        do {
            size_t n = strcspn(p, ",");
            bool known = false;
            for (size_t c = 0; c < NCASES && !known; c++)
                known = strlen(CASES[c].name) == n && !strncmp(p, CASES[c].name, n);
            if (!known) {
                fprintf(stderr, "ctorch bench fsdp: --cases: unknown case '%.*s' (cases: single, fsdp, "
                        "fsdp-no-overlap, fsdp-shared-rs, dp)\n", (int)(n > 64 ? 64 : n), p);
                return 2;
            }
            p += n;
        } while (*p++ == ',');
    }
    {
        const char *p = tmodes;
        do {
            size_t n = strcspn(p, ",");
            if (!((n == 6 && !strncmp(p, "single", 6)) || (n == 3 && !strncmp(p, "ddp", 3)) ||
                  (n == 5 && !strncmp(p, "fsdp2", 5)))) {
                fprintf(stderr, "ctorch bench fsdp: --torch-modes: unknown mode '%.*s' (modes: single, ddp, "
                        "fsdp2)\n", (int)(n > 64 ? 64 : n), p);
                return 2;
            }
            p += n;
        } while (*p++ == ',');
    }
    char tmp[] = "/tmp/ctorch-bench-fsdp-XXXXXX";
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "ctorch bench fsdp: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    char exe[4096];
    ssize_t el = readlink(b->exe, exe, sizeof exe - 1);
    if (el <= 0) return cli_fail("bench fsdp: /proc/self/exe", CT_EIO);
    exe[el] = '\0';
    char s_layers[32], s_d[32], s_heads[32], s_kv[32], s_ffn[32], s_batch[32], s_seq[32], s_steps[32];
    snprintf(s_layers, sizeof s_layers, "%lld", layers);
    snprintf(s_d, sizeof s_d, "%lld", dmodel);
    snprintf(s_heads, sizeof s_heads, "%lld", dmodel / 64);
    snprintf(s_kv, sizeof s_kv, "%lld", dmodel / 128 > 0 ? dmodel / 128 : 1);
    snprintf(s_ffn, sizeof s_ffn, "%lld", 2 * dmodel);
    snprintf(s_batch, sizeof s_batch, "%lld", batch);
    snprintf(s_seq, sizeof s_seq, "%lld", seq);
    snprintf(s_steps, sizeof s_steps, "%lld", steps);
    const char *model[] = {"--layers", s_layers, "--d-model", s_d, "--heads", s_heads,
                           "--kv-heads", s_kv, "--ffn", s_ffn, "--vocab", "2048", "--context",
                           s_seq, "--batch", s_batch, "--steps", s_steps, "--warmup", "2",
                           "--eval-batches", "1", "--eval-every", "0", "--threads", "1", "--quiet",
                           "--overwrite", NULL};
    json_t *cases = json_array();
    double single_tps = NAN, fsdp_tps = NAN, fsdp_serial_tps = NAN;
    json_int_t fsdp_state = 0, dp_state = 0;
    for (size_t c = 0; c < NCASES; c++) {
        const fcase *fc = &CASES[c];
        if (only) { /* the case named in --cases? */
            size_t n = strlen(fc->name);
            bool listed = false;
            for (const char *p = only; !listed && (p = strstr(p, fc->name)) != NULL; p += n)
                listed = (p == only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0');
            if (!listed) continue;
        }
        char out[4200], np[16];
        snprintf(out, sizeof out, "%s/%s", tmp, fc->name);
        snprintf(np, sizeof np, "%d", fc->nproc);
        char *av[64];
        int n = 0;
        av[n++] = exe;
        av[n++] = "train";
        for (int i = 0; model[i]; i++)
            av[n++] = (char *)model[i];
        av[n++] = "--out";
        av[n++] = out;
        for (int i = 0; fc->flags[i]; i++)
            av[n++] = (char *)fc->flags[i];
        if (fc->nproc > 1) {
            av[n++] = "--nproc";
            av[n++] = np;
        }
        av[n] = NULL;
        if (!b->json) fprintf(stderr, "running %s (%d rank%s) ...\n", fc->name, fc->nproc, fc->nproc > 1 ? "s" : "");
        int rc = run_quiet(av);
        char mp[4300];
        snprintf(mp, sizeof mp, "%s/metrics.jsonl", out);
        FILE *f = rc == 0 ? fopen(mp, "r") : NULL;
        if (!f) {
            json_array_append_new(cases, json_pack("{s:s, s:s, s:i}", "name", fc->name, "status",
                                                   "failed", "exit", rc));
            continue;
        }
        double st[1024], ex[1024], co[1024];
        int k = 0;
        json_int_t tokens = 0, state = 0;
        json_t *end = NULL;
        char line[1 << 14];
        while (fgets(line, sizeof line, f)) {
            json_t *j = json_loads(line, 0, NULL);
            if (!j) continue;
            json_t *stp = json_object_get(j, "step_s");
            if (json_is_integer(json_object_get(j, "step")) && json_integer_value(json_object_get(j, "step")) > 1 &&
                json_is_number(stp) && k < 1024) {
                st[k] = json_number_value(stp);
                ex[k] = json_number_value(json_object_get(j, "exposed_comm_s"));
                co[k] = json_number_value(json_object_get(j, "collective_s"));
                tokens = json_integer_value(json_object_get(j, "tokens"));
                k++;
            }
            if (json_is_integer(json_object_get(j, "state_bytes")) && !state)
                state = json_integer_value(json_object_get(j, "state_bytes"));
            const char *ev = json_string_value(json_object_get(j, "event"));
            if (ev && !strcmp(ev, "end")) {
                json_decref(end);
                end = json_incref(j);
            }
            json_decref(j);
        }
        fclose(f);
        double step = median(st, k), exposed = median(ex, k), coll = median(co, k);
        double tps = step > 0 ? (double)tokens / step : NAN;
        json_t *peaks = end ? json_object_get(end, "peak_mem_bytes_per_rank") : NULL;
        json_t *o = json_pack("{s:s, s:s, s:i, s:f, s:f, s:i}", "name", fc->name, "what", fc->what,
                              "nproc", fc->nproc, "step_median_s", step, "tokens_per_s", tps,
                              "timed_steps", k);
        if (fc->nproc > 1 || strcmp(fc->name, "single")) {
            json_object_set_new(o, "exposed_comm_s", json_real(exposed));
            json_object_set_new(o, "collective_s", json_real(coll));
            json_object_set_new(o, "exposed_pct_of_step", json_real(step > 0 ? 100 * exposed / step : NAN));
            json_object_set_new(o, "exposed_pct_of_collectives", json_real(coll > 0 ? 100 * exposed / coll : NAN));
            json_object_set_new(o, "state_bytes_per_rank", json_integer(state));
        }
        if (peaks) json_object_set(o, "peak_tracked_bytes_per_rank", peaks);
        else if (end) json_object_set(o, "peak_tracked_bytes_per_rank", json_pack("[O]", json_object_get(end, "peak_mem_bytes")));
        json_decref(end);
        json_array_append_new(cases, o);
        if (!strcmp(fc->name, "single")) single_tps = tps;
        if (!strcmp(fc->name, "fsdp")) fsdp_tps = tps, fsdp_state = state;
        if (!strcmp(fc->name, "dp")) dp_state = state;
        if (!strcmp(fc->name, "fsdp-no-overlap")) fsdp_serial_tps = tps;
    }
    /* PyTorch 2.13 on the same weights and tokens: one process, DDP and FSDP2 over gloo */
    json_t *tj = json_null();
    if (torch) {
        char dump[4200];
        snprintf(dump, sizeof dump, "%s/weights.safetensors", tmp);
        char *av[64];
        int n = 0;
        av[n++] = exe;
        av[n++] = "train";
        for (int i = 0; model[i]; i++)
            av[n++] = (char *)model[i];
        av[n++] = "--out";
        char od[4300];
        snprintf(od, sizeof od, "%s/dump", tmp);
        av[n++] = od;
        av[n++] = "--dump-grads";
        av[n++] = dump;
        av[n] = NULL;
        if (!b->json) fprintf(stderr, "running PyTorch (%s) ...\n", tmodes);
        if (run_quiet(av) == 0) {
            char *pa[] = {"--weights", dump, "--steps", s_steps, "--modes", (char *)tmodes, NULL};
            tj = bench_python("torch_ddp.py", pa);
        } else {
            tj = json_pack("{s:s}", "status", "could not write the weights");
        }
    }
    char rmcmd[4300];
    snprintf(rmcmd, sizeof rmcmd, "rm -rf '%s'", tmp);
    if (system(rmcmd)) { /* leave it */
    }
    json_t *res = json_pack("{s:s, s:{s:I, s:I, s:I, s:I, s:I}, s:o, s:o}", "bench", "fsdp",
                            "model", "layers", (json_int_t)layers, "d_model", (json_int_t)dmodel,
                            "batch", (json_int_t)batch, "seq", (json_int_t)seq, "threads_per_rank",
                            (json_int_t)1, "cases", cases, "torch", tj);
    if (isfinite(fsdp_tps / single_tps))
        json_object_set_new(res, "speedup_fsdp2_vs_single", json_real(fsdp_tps / single_tps));
    if (isfinite(fsdp_tps / fsdp_serial_tps))
        json_object_set_new(res, "speedup_overlap_vs_serialized", json_real(fsdp_tps / fsdp_serial_tps));
    /* dp replicates the whole state, as one process holds it: the N=1 state */
    if (fsdp_state > 0 && dp_state > 0)
        json_object_set_new(res, "state_fsdp2_vs_replicated", json_real((double)fsdp_state / (double)dp_state));
    json_t *ddp = json_object_get(json_object_get(tj, "ddp"), "tokens_per_s");
    if (json_is_number(ddp) && json_number_value(ddp) > 0)
        json_object_set_new(res, "speedup_fsdp2_vs_torch_ddp", json_real(fsdp_tps / json_number_value(ddp)));
    json_t *tf2 = json_object_get(json_object_get(tj, "fsdp2"), "tokens_per_s");
    if (json_is_number(tf2) && json_number_value(tf2) > 0)
        json_object_set_new(res, "speedup_fsdp2_vs_torch_fsdp2", json_real(fsdp_tps / json_number_value(tf2)));
    json_t *ts1 = json_object_get(json_object_get(tj, "single"), "tokens_per_s");
    if (json_is_number(ts1) && json_number_value(ts1) > 0)
        json_object_set_new(res, "speedup_single_vs_torch_single", json_real(single_tps / json_number_value(ts1)));
    if (b->json) {
        bench_print_json(res);
    } else {
        printf("bench fsdp: %lld layers, d_model %lld, global batch %lld x %lld, 1 thread per rank\n",
               layers, dmodel, batch, seq);
        printf("%-16s %3s %10s %10s %9s %9s %12s %s\n", "case", "N", "step s", "tokens/s",
               "exposed", "exp/coll", "state/rank", "peak tracked per rank");
        size_t i;
        json_t *o;
        json_array_foreach(cases, i, o)
        {
            if (json_object_get(o, "status")) {
                printf("%-16s failed\n", json_string_value(json_object_get(o, "name")));
                continue;
            }
            char peaks[128] = "";
            size_t q, off = 0;
            json_t *pv;
            json_array_foreach(json_object_get(o, "peak_tracked_bytes_per_rank"), q, pv)
                off += (size_t)snprintf(peaks + off, sizeof peaks - off, "%s%.1f MiB", q ? ", " : "",
                                        json_number_value(pv) / 1048576.0);
            json_t *ep = json_object_get(o, "exposed_pct_of_step"), *ec = json_object_get(o, "exposed_pct_of_collectives");
            json_t *sb = json_object_get(o, "state_bytes_per_rank");
            char cols[3][32] = {"-", "-", "-"}; /* the one-process case has no collectives */
            if (ep) snprintf(cols[0], sizeof cols[0], "%.1f%%", json_number_value(ep));
            if (ec) snprintf(cols[1], sizeof cols[1], "%.1f%%", json_number_value(ec));
            if (sb) snprintf(cols[2], sizeof cols[2], "%.1f MiB", json_integer_value(sb) / 1048576.0);
            printf("%-16s %3lld %10.3f %10.0f %9s %9s %12s %s\n",
                   json_string_value(json_object_get(o, "name")),
                   (long long)json_integer_value(json_object_get(o, "nproc")),
                   json_number_value(json_object_get(o, "step_median_s")),
                   json_number_value(json_object_get(o, "tokens_per_s")), cols[0], cols[1],
                   cols[2], peaks);
        }
        const char *ts = json_string_value(json_object_get(tj, "status"));
        if (ts && !strcmp(ts, "ok")) {
            static const char *const tk[3][2] = {{"single", "one process"},
                                                 {"ddp", "DDP over gloo, 2 ranks"},
                                                 {"fsdp2", "FSDP2 fully_shard over gloo, 2 ranks"}};
            printf("PyTorch %s (%s):\n", json_string_value(json_object_get(tj, "torch_version")),
                   json_string_value(json_object_get(tj, "attention")));
            for (int k = 0; k < 3; k++) {
                json_t *to = json_object_get(tj, tk[k][0]);
                if (!to) continue;
                const char *os = json_string_value(json_object_get(to, "status"));
                if (os && !strcmp(os, "ok"))
                    printf("  %-38s %10.3f s %10.0f tokens/s, peak RSS %.1f MiB%s\n", tk[k][1],
                           json_number_value(json_object_get(to, "step_s")),
                           json_number_value(json_object_get(to, "tokens_per_s")),
                           json_number_value(json_object_get(to, "peak_rss_bytes")) / 1048576.0,
                           k ? " per rank" : "");
                else
                    printf("  %-38s %s\n", tk[k][1], os ? os : "failed");
            }
        } else if (torch) {
            printf("PyTorch: %s\n", ts ? ts : "failed");
        }
        json_t *r;
        if ((r = json_object_get(res, "state_fsdp2_vs_replicated")))
            printf("training state per rank, fsdp N=2 / replicated (N=1): %.3fx\n", json_number_value(r));
        if (isfinite(fsdp_tps / fsdp_serial_tps))
            printf("overlap on / every collective waited: %.2fx tokens/s\n", fsdp_tps / fsdp_serial_tps);
        if ((r = json_object_get(res, "speedup_fsdp2_vs_torch_ddp")))
            printf("fsdp N=2 / PyTorch DDP N=2: %.2fx tokens/s\n", json_number_value(r));
        if ((r = json_object_get(res, "speedup_fsdp2_vs_torch_fsdp2")))
            printf("fsdp N=2 / PyTorch FSDP2 N=2: %.2fx tokens/s\n", json_number_value(r));
    }
    json_decref(res);
    return 0;
}
