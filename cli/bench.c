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
    {"gemm", bench_gemm, "sgemm / bf16 GEMM rate vs PyTorch torch.matmul on the same shape"},
    {"io", bench_io, "safetensors open / read / bf16->f32 / save vs read(), memcpy, write()"},
    {"comm", bench_comm, "all_reduce / all_gather / reduce_scatter bus bandwidth and latency vs MPICH"},
    {"lce", bench_lce, "fused linear cross-entropy vs unfused (ctorch and PyTorch), fwd+bwd"},
    {"flex", bench_flex, "FlexAttention sliding window / causal vs dense SDPA, block-mask cost"},
    {"compile", bench_compile, "compiled score/mask mods vs built-ins and torch, cold/warm compile, pool"},
    {"tokenizer", bench_tokenizer, "tokenizer encode MB/s (GPT-2, ctorch BPE) vs node's gpt-3-encoder"},
    {"train", bench_train, "one training step: fused vs unfused head, flex window vs dense, vs PyTorch"},
    {"fsdp", bench_fsdp, "training at N=1 and N=2 ranks: FSDP overlap on/off, DP, vs PyTorch DDP"},
    {"hf", bench_hf, "open a multi-GiB sharded Hugging Face directory vs ct_load of its shards"},
    {"kernels", bench_kernels, "each kernel family per instruction set vs scalar and the copy / FMA bound"},
    {"generate", bench_generate, "decode with the KV cache vs recomputing the sequence, prompt/decode tok/s"},
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

typedef struct {
    int64_t m, n, k;
    float *a, *b, *c;
    uint16_t *ab, *bb;
} gemm_case;

static ct_status run_f32(void *p)
{
    gemm_case *g = p;
    return ct_gemm_f32(false, false, g->m, g->n, g->k, 1.0f, g->a, 0, g->b, 0, 0.0f, g->c, 0);
}

static ct_status run_bf16(void *p)
{
    gemm_case *g = p;
    return ct_gemm_bf16(false, false, g->m, g->n, g->k, 1.0f, g->ab, 0, g->bb, 0, 0.0f, g->c, 0);
}

int bench_gemm(bench_ctx *b, int argc, char **argv)
{
    long long m = 2048, n = 2048, k = 2048;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help")) {
            puts("usage: ctorch bench gemm [--m M] [--n N] [--k K] [--json]\n"
                 "Times C[M,N] = A[M,K] B[K,N] in f32 (OpenBLAS sgemm) and bf16 (blocked conversion),\n"
                 "and PyTorch's torch.matmul on the same shape (bench/torch_baseline.py).");
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--m", &v)) { if (!cli_int("--m", v, 1, 1 << 16, &m)) return 2; }
        else if (cli_opt(argc, argv, &i, "--n", &v)) { if (!cli_int("--n", v, 1, 1 << 16, &n)) return 2; }
        else if (cli_opt(argc, argv, &i, "--k", &v)) { if (!cli_int("--k", v, 1, 1 << 16, &k)) return 2; }
        else {
            fprintf(stderr, "ctorch bench gemm: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    gemm_case g = {m, n, k, NULL, NULL, NULL, NULL, NULL};
    ct_status s;
    if ((s = ct_alloc((void **)&g.a, (size_t)(m * k) * 4)) || (s = ct_alloc((void **)&g.b, (size_t)(k * n) * 4)) ||
        (s = ct_alloc((void **)&g.c, (size_t)(m * n) * 4)) || (s = ct_alloc((void **)&g.ab, (size_t)(m * k) * 2)) ||
        (s = ct_alloc((void **)&g.bb, (size_t)(k * n) * 2)))
        return cli_fail("bench gemm", s);
    bench_fill(g.a, (size_t)(m * k), 1, 1.0f);
    bench_fill(g.b, (size_t)(k * n), 2, 1.0f);
    ct_convert_f32_to_bf16(g.ab, g.a, (size_t)(m * k));
    ct_convert_f32_to_bf16(g.bb, g.b, (size_t)(k * n));
    double flops = 2.0 * m * n * k;
    bench_time tf, tb;
    if ((s = bench_time_fn(b->repeats, run_f32, &g, &tf)) || (s = bench_time_fn(b->repeats, run_bf16, &g, &tb)))
        return cli_fail("bench gemm", s);
    char sm[32], sn[32], sk[32], sr[32];
    snprintf(sm, sizeof sm, "%lld", m);
    snprintf(sn, sizeof sn, "%lld", n);
    snprintf(sk, sizeof sk, "%lld", k);
    snprintf(sr, sizeof sr, "%d", b->repeats);
    char *pa[] = {"gemm", "--m", sm, "--n", sn, "--k", sk, "--repeats", sr, NULL};
    json_t *torch = bench_python("torch_baseline.py", pa);
    double f32g = flops / tf.median * 1e-9, bfg = flops / tb.median * 1e-9;
    json_t *tg = json_object_get(torch, "gflops");
    double torchg = tg ? json_real_value(tg) : 0;
    json_t *j = json_pack("{s:s, s:{s:I, s:I, s:I}, s:o, s:{s:o, s:f}, s:{s:o, s:f}, s:o}", "bench", "gemm", "shape",
                          "m", (json_int_t)m, "n", (json_int_t)n, "k", (json_int_t)k, "machine",
                          bench_machine_json(f32g), "ctorch_f32", "time", bench_time_json(&tf), "gflops", f32g,
                          "ctorch_bf16", "time", bench_time_json(&tb), "gflops", bfg, "torch_f32", torch);
    if (torchg > 0) json_object_set_new(j, "ratio_ctorch_vs_torch", json_real(f32g / torchg));
    if (b->json) {
        bench_print_json(j);
    } else {
        printf("gemm M=%lld N=%lld K=%lld, %d threads, %s\n", m, n, k, ct_num_threads(), ct_isa_name(ct_active_isa()));
        printf("  %-22s %10s %10s\n", "", "median s", "GFLOP/s");
        printf("  %-22s %10.4f %10.1f\n", "ctorch sgemm (f32)", tf.median, f32g);
        printf("  %-22s %10.4f %10.1f\n", "ctorch bf16 -> f32", tb.median, bfg);
        if (torchg > 0)
            printf("  %-22s %10.4f %10.1f   (ctorch / torch = %.2f)\n", "torch.matmul (f32)",
                   json_real_value(json_object_get(torch, "median_s")), torchg, f32g / torchg);
        else
            printf("  %-22s %s\n", "torch.matmul (f32)", json_string_value(json_object_get(torch, "status")));
    }
    json_decref(j);
    ct_free(g.a);
    ct_free(g.b);
    ct_free(g.c);
    ct_free(g.ab);
    ct_free(g.bb);
    return 0;
}
