/* ctorch bench <name>: every benchmark beside its baseline, measured in the same run. */
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    bench_fn fn;
    const char *summary;
} benches[] = {
    {"gemm", bench_gemm, "OpenBLAS and ctorch GEMM (f32 / bf16) side by side, vs PyTorch 2.13 torch.matmul"},
    {"io", bench_io, "safetensors open / read / bf16->f32 / save vs read(), memcpy, write()"},
    {"comm", bench_comm, "all_reduce / all_gather / reduce_scatter bus bandwidth and latency vs MPICH"},
    {"lce", bench_lce, "fused linear cross-entropy vs unfused and PyTorch 2.13 (chunked, reference, unfused)"},
    {"flex", bench_flex, "FlexAttention sliding window / causal vs dense SDPA and PyTorch 2.13's flex_attention"},
    {"compile", bench_compile, "compiled score/mask mods vs built-ins and torch, cold/warm compile, pool"},
    {"tokenizer", bench_tokenizer, "tokenizer encode MB/s (GPT-2, ctorch BPE) vs Hugging Face tokenizers"},
    {"train", bench_train, "one training step: fused vs unfused head, flex vs dense, vs PyTorch 2.13 (SDPA)"},
    {"fsdp", bench_fsdp, "training at N=1 and N=2 ranks: FSDP overlap on/off, DP, vs PyTorch DDP / FSDP2"},
    {"hf", bench_hf, "open a multi-GiB sharded Hugging Face directory vs ct_load of its shards"},
    {"kernels", bench_kernels, "each kernel family per instruction set vs scalar and the copy / FMA bound"},
    {"scaling", bench_scaling, "hot paths of training at 1..N threads: speedup, efficiency, beside PyTorch 2.13"},
    {"generate", bench_generate, "decode with the KV cache vs recomputing the sequence, prompt/decode tok/s"},
    {"cuda", bench_cuda, "GEMM and the fused loss vs unfused on a GPU, beside PyTorch on the same GPU (SKIPPED without one)"},
};

static void bench_usage(FILE *f)
{
    fprintf(f, "usage: ctorch bench <name> [options] [--json] [--repeats R]\n\nbenchmarks:\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(f, "  %-9s %s\n", benches[i].name, benches[i].summary);
    fprintf(f, "\nctorch bench <name> --help lists a benchmark's options.\n");
}

int cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        bench_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    bench_ctx b = {false, 3, argv[1], "/proc/self/exe"};
    /* Strip the common options; pass the rest to the benchmark. */
    char **rest = malloc(sizeof(char *) * (size_t)(argc + 1));
    int n = 0;
    rest[n++] = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *v;
        long long r;
        if (!strcmp(argv[i], "--json")) b.json = true;
        else if (cli_opt(argc, argv, &i, "--repeats", &v)) {
            if (!cli_int("--repeats", v, 3, 64, &r)) {
                free(rest);
                return 2;
            }
            b.repeats = (int)r;
        } else
            rest[n++] = argv[i];
    }
    rest[n] = NULL;
    int rc = -1;
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name)) rc = benches[i].fn(&b, n, rest);
    if (rc == -1) {
        fprintf(stderr, "ctorch bench: unknown benchmark '%s'\n\n", argv[1]);
        bench_usage(stderr);
        rc = 2;
    }
    free(rest);
    return rc;
}

/* ---- gemm ------------------------------------------------------------------------------ */
/* OpenBLAS and ctorch's GEMM on the same operands, f32 and bf16, interleaved repeat by repeat
 * (so load changes hit both alike), medians; PyTorch 2.13's torch.matmul (f32 and bf16) on the
 * first shape. */

typedef struct {
    bool ta, tb;
    int64_t m, n, k;
    float *a, *b, *c;
    uint16_t *ab, *bb;
} gemm_case;

/* Training shapes of a GPT-2-small layer (D = 768, 512 tokens): forward x W^T, the input
 * gradient dy W, the weight gradient dy^T x; then skinny and small products. */
static const struct { const char *what; bool ta, tb; int64_t m, n, k; } gemm_train_shapes[] = {
    {"qkv forward", false, true, 512, 2304, 768},   {"mlp up forward", false, true, 512, 3072, 768},
    {"mlp down forward", false, true, 512, 768, 3072}, {"mlp up dinput", false, false, 512, 768, 3072},
    {"mlp up dweight", true, false, 3072, 768, 512}, {"attn proj forward", false, true, 512, 768, 768},
    {"decode step", false, true, 1, 2304, 768},     {"8 tokens", false, true, 8, 768, 768},
    {"head 64", false, true, 64, 64, 64},
};

static ct_status gemm_run(const gemm_case *g, ct_gemm_impl impl, bool bf)
{
    ct_status s = ct_gemm_set_impl(impl);
    if (s != CT_OK) return s;
    int64_t lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
    if (bf) return ct_gemm_bf16(g->ta, g->tb, g->m, g->n, g->k, 1.0f, g->ab, lda, g->bb, ldb, 0.0f, g->c, 0);
    return ct_gemm_f32(g->ta, g->tb, g->m, g->n, g->k, 1.0f, g->a, lda, g->b, ldb, 0.0f, g->c, 0);
}

static int cmp_dbl(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

#define GEMM_VARIANTS 4 /* openblas f32, ctorch f32, openblas bf16, ctorch bf16 */

/* Times the four variants interleaved; t[v] gets the medians (0 where a variant cannot run). */
static ct_status gemm_time(gemm_case *g, int repeats, bench_time t[GEMM_VARIANTS], bool have_blas)
{
    double x[GEMM_VARIANTS][64];
    if (repeats > 64) repeats = 64;
    for (int r = -1; r < repeats; r++) /* r = -1: warm-up */
        for (int v = 0; v < GEMM_VARIANTS; v++) {
            if (!(v & 1) && !have_blas) continue;
            double t0 = bench_now();
            ct_status s = gemm_run(g, v & 1 ? CT_GEMM_CTORCH : CT_GEMM_OPENBLAS, v >= 2);
            if (s != CT_OK) return s;
            if (r >= 0) x[v][r] = bench_now() - t0;
        }
    for (int v = 0; v < GEMM_VARIANTS; v++) {
        memset(&t[v], 0, sizeof t[v]);
        if (!(v & 1) && !have_blas) continue;
        qsort(x[v], (size_t)repeats, sizeof x[v][0], cmp_dbl);
        t[v].repeats = repeats;
        t[v].min = x[v][0];
        t[v].max = x[v][repeats - 1];
        t[v].median = repeats % 2 ? x[v][repeats / 2] : 0.5 * (x[v][repeats / 2 - 1] + x[v][repeats / 2]);
    }
    return ct_gemm_set_impl(CT_GEMM_AUTO);
}

static ct_status gemm_alloc(gemm_case *g)
{
    size_t na = (size_t)(g->m * g->k), nb = (size_t)(g->k * g->n);
    ct_status s;
    if ((s = ct_alloc((void **)&g->a, na * 4)) || (s = ct_alloc((void **)&g->b, nb * 4)) ||
        (s = ct_alloc((void **)&g->c, (size_t)(g->m * g->n) * 4)) || (s = ct_alloc((void **)&g->ab, na * 2)) ||
        (s = ct_alloc((void **)&g->bb, nb * 2)))
        return s;
    bench_fill(g->a, na, 1, 1.0f);
    bench_fill(g->b, nb, 2, 1.0f);
    ct_convert_f32_to_bf16(g->ab, g->a, na);
    ct_convert_f32_to_bf16(g->bb, g->b, nb);
    return CT_OK;
}

static void gemm_release(gemm_case *g)
{
    ct_free(g->a), ct_free(g->b), ct_free(g->c), ct_free(g->ab), ct_free(g->bb);
    g->a = g->b = g->c = NULL;
    g->ab = g->bb = NULL;
}

static const char *const gemm_vnames[GEMM_VARIANTS] = {"openblas_f32", "ctorch_f32", "openblas_bf16",
                                                       "ctorch_bf16"};

int bench_gemm(bench_ctx *b, int argc, char **argv)
{
    long long m = 2048, n = 2048, k = 2048;
    bool train = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help")) {
            puts("usage: ctorch bench gemm [--m M] [--n N] [--k K] [--train] [--json]\n"
                 "Times C[M,N] = A[M,K] B[K,N] with OpenBLAS (ctorch's deterministic blocks) and with\n"
                 "ctorch's own GEMM, f32 and bf16 operands, interleaved in the same run (medians), and\n"
                 "PyTorch 2.13's torch.matmul (f32, bf16) on the same shape (bench/torch_baseline.py,\n"
                 "ctorch's thread count). --train adds the\n"
                 "training shapes of a GPT-2-small layer and small / skinny products. GFLOP/s and the\n"
                 "fraction of the FMA bound (threads x the 1-core FMA loop measured in the same run).");
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--m", &v)) { if (!cli_int("--m", v, 1, 1 << 16, &m)) return 2; }
        else if (cli_opt(argc, argv, &i, "--n", &v)) { if (!cli_int("--n", v, 1, 1 << 16, &n)) return 2; }
        else if (cli_opt(argc, argv, &i, "--k", &v)) { if (!cli_int("--k", v, 1, 1 << 16, &k)) return 2; }
        else if (!strcmp(argv[i], "--train")) train = true;
        else {
            fprintf(stderr, "ctorch bench gemm: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    ct_gemm_impl dflt;
    ct_status s = ct_gemm_select(m, n, k, &dflt);
    if (s != CT_OK) return cli_fail("bench gemm", s);
    bool have_blas = ct_gemm_set_impl(CT_GEMM_OPENBLAS) == CT_OK;
    ct_clear_error();
    ct_gemm_set_impl(CT_GEMM_AUTO);
    double fma1 = bench_fma_gflops_1core(b->repeats);
    double bound = fma1 * ct_num_threads();
    size_t nshapes = 1 + (train ? sizeof gemm_train_shapes / sizeof gemm_train_shapes[0] : 0);
    json_t *rows = json_array();
    double first[GEMM_VARIANTS] = {0};
    if (!b->json) {
        printf("gemm, %d threads, %s, %s; FMA bound %.1f GFLOP/s (%d x %.1f, 1-core FMA loop now)\n",
               ct_num_threads(), ct_isa_name(ct_active_isa()), ct_gemm_describe(), bound, ct_num_threads(), fma1);
        printf("  %-18s %5s %5s %5s %2s %2s | %-13s %-13s | %-13s %-13s | GFLOP/s (fraction of bound)\n", "shape", "M",
               "N", "K", "tA", "tB", "openblas f32", "ctorch f32", "openblas bf16", "ctorch bf16");
    }
    for (size_t si = 0; si < nshapes; si++) {
        gemm_case g = {false, false, m, n, k, NULL, NULL, NULL, NULL, NULL};
        const char *what = "square";
        if (si > 0) {
            what = gemm_train_shapes[si - 1].what;
            g.ta = gemm_train_shapes[si - 1].ta, g.tb = gemm_train_shapes[si - 1].tb;
            g.m = gemm_train_shapes[si - 1].m, g.n = gemm_train_shapes[si - 1].n, g.k = gemm_train_shapes[si - 1].k;
        }
        bench_time t[GEMM_VARIANTS];
        if ((s = gemm_alloc(&g)) || (s = gemm_time(&g, b->repeats, t, have_blas))) {
            gemm_release(&g);
            json_decref(rows);
            ct_gemm_set_impl(CT_GEMM_AUTO);
            return cli_fail("bench gemm", s);
        }
        double flops = 2.0 * (double)g.m * (double)g.n * (double)g.k;
        ct_gemm_impl rule;
        ct_gemm_select(g.m, g.n, g.k, &rule);
        json_t *row = json_pack("{s:s, s:I, s:I, s:I, s:b, s:b, s:s}", "shape", what, "m", (json_int_t)g.m, "n",
                                (json_int_t)g.n, "k", (json_int_t)g.k, "trans_a", g.ta, "trans_b", g.tb, "default",
                                rule == CT_GEMM_CTORCH ? "ctorch" : "openblas");
        if (!b->json)
            printf("  %-18s %5lld %5lld %5lld %2d %2d |", what, (long long)g.m, (long long)g.n, (long long)g.k, g.ta,
                   g.tb);
        double gf[GEMM_VARIANTS] = {0};
        for (int v = 0; v < GEMM_VARIANTS; v++) {
            if (t[v].median <= 0) {
                json_object_set_new(row, gemm_vnames[v], json_pack("{s:s}", "status", "OpenBLAS not loaded"));
                if (!b->json) printf(" %-13s", "n/a");
                continue;
            }
            gf[v] = flops / t[v].median * 1e-9;
            json_t *o = json_pack("{s:o, s:f}", "time", bench_time_json(&t[v]), "gflops", gf[v]);
            if (bound > 0) json_object_set_new(o, "fraction_of_fma", json_real(gf[v] / bound));
            json_object_set_new(row, gemm_vnames[v], o);
            if (!b->json) printf(" %6.1f (%.2f)%s", gf[v], bound > 0 ? gf[v] / bound : 0, v == 1 ? " |" : "");
        }
        if (gf[0] > 0) json_object_set_new(row, "ratio_ctorch_vs_openblas_f32", json_real(gf[1] / gf[0]));
        if (gf[2] > 0) json_object_set_new(row, "ratio_ctorch_vs_openblas_bf16", json_real(gf[3] / gf[2]));
        if (!b->json) printf("  ctorch/openblas f32 %.2f\n", gf[0] > 0 ? gf[1] / gf[0] : 0);
        if (si == 0) memcpy(first, gf, sizeof first);
        json_array_append_new(rows, row);
        gemm_release(&g);
    }
    char sm[32], sn[32], sk[32], sr[32];
    snprintf(sm, sizeof sm, "%lld", m);
    snprintf(sn, sizeof sn, "%lld", n);
    snprintf(sk, sizeof sk, "%lld", k);
    snprintf(sr, sizeof sr, "%d", b->repeats);
    char st[32];
    snprintf(st, sizeof st, "%d", ct_num_threads());
    char *pa[] = {"gemm", "--m", sm, "--n", sn, "--k", sk, "--repeats", sr, "--threads", st, NULL};
    json_t *torch = bench_python("torch_baseline.py", pa);
    double torchg = json_number_value(json_object_get(json_object_get(torch, "f32"), "gflops"));
    double torchb = json_number_value(json_object_get(json_object_get(torch, "bf16"), "gflops"));
    double best = first[0] > first[1] ? first[0] : first[1];
    double bestb = first[2] > first[3] ? first[2] : first[3];
    /* "torch_f32" keeps its name; it holds both dtypes ("f32", "bf16") */
    json_t *j = json_pack("{s:s, s:o, s:s, s:{s:f, s:f}, s:o, s:o}", "bench", "gemm", "machine",
                          bench_machine_json(best), "gemm_default", ct_gemm_describe(), "fma_bound",
                          "gflops_1core", fma1, "gflops", bound, "shapes", rows, "torch_f32", torch);
    if (torchg > 0) json_object_set_new(j, "ratio_best_vs_torch", json_real(best / torchg));
    if (torchb > 0) json_object_set_new(j, "ratio_best_vs_torch_bf16", json_real(bestb / torchb));
    if (b->json) {
        bench_print_json(j);
    } else if (torchg > 0) {
        printf("  PyTorch %s torch.matmul %lldx%lldx%lld, %lld threads: f32 %.1f GFLOP/s (best ctorch path / torch = "
               "%.2f), bf16 %.1f GFLOP/s (%.2f)\n",
               json_string_value(json_object_get(torch, "torch_version")), m, n, k,
               (long long)json_integer_value(json_object_get(torch, "threads")), torchg, best / torchg, torchb,
               torchb > 0 ? bestb / torchb : 0);
    } else {
        printf("  torch.matmul: %s\n", json_string_value(json_object_get(torch, "status")));
    }
    json_decref(j);
    return 0;
}
