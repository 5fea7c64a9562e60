#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    cli_cmd_fn fn;
    const char *summary;
} commands[] = {
    {"bench", cmd_bench, "run a benchmark (gemm, lce, ...) against its baseline"},
    {"checkpoint", cmd_checkpoint, "consolidate a sharded checkpoint into one file"},
    {"convert", cmd_convert, "convert tensor files: .pt <-> safetensors, --dtype (atomic)"},
    {"generate", cmd_generate, "sample text from a checkpoint of ctorch train"},
    {"inspect", cmd_inspect, "validate a tensor file and list its tensors and metadata (--json)"},
    {"launch", cmd_launch, "start N local ranks of a program (store, output prefixes, failure report)"},
    {"telemetry", cmd_telemetry, "memory, CPU utilisation and clocks, temperature, power (--json, --watch)"},
    {"tokenizer", cmd_tokenizer, "train / apply a byte-level BPE tokenizer"},
    {"train", cmd_train, "train a small GPT on the built-in corpus or a text file (--help)"},
    {"version", cmd_version, "print the version and the instruction set in use"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: ctorch <command> [options]   (ctorch <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nlibrary messages at WARN and above go to stderr as text lines; --log-json (anywhere\n"
               "before a `--`) makes them JSON lines {\"ts\",\"level\",\"component\",\"msg\"}\n");
    fprintf(f, "\nenvironment: CT_NUM_THREADS (threads), CT_FORCE_ISA=scalar|avx2|avx512|neon|sve (kernels;\n"
               "             the best this CPU has when unset), CT_FORCE_SCALAR=1 (= CT_FORCE_ISA=scalar)\n");
}

/* Remove every `--log-json` before the first `--` (what follows `--` belongs to another
 * program, e.g. ctorch launch's ranks) and install the library's log sink on stderr at WARN:
 * text lines by default, JSON lines with --log-json. Returns the new argc. */
static int install_log_sink(int argc, char **argv)
{
    bool json = false;
    int n = 1;
    bool passthrough = false;
    for (int i = 1; i < argc; i++) {
        if (!passthrough && !strcmp(argv[i], "--")) passthrough = true;
        if (!passthrough && !strcmp(argv[i], "--log-json")) {
            json = true;
            continue;
        }
        argv[n++] = argv[i];
    }
    argv[n] = NULL;
    ct_log_set_sink(json ? ct_log_sink_json : ct_log_sink_text, stderr, CT_LOG_WARN);
    return n;
}

int main(int argc, char **argv)
{
    argc = install_log_sink(argc, argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    ct_status isa_st = ct_isa_env_status(); /* a forced instruction set this CPU lacks */
    if (isa_st != CT_OK) return cli_fail("CT_FORCE_ISA", isa_st);
    const char *gemm_env = getenv("CT_GEMM"); /* an unknown CT_GEMM, or OpenBLAS forced and missing */
    ct_gemm_impl gemm_impl;
    ct_status gemm_st = gemm_env && gemm_env[0] ? ct_gemm_select(1, 1, 1, &gemm_impl) : CT_OK;
    if (gemm_st != CT_OK) return cli_fail("CT_GEMM", gemm_st);
    if (!strcmp(argv[1], "--version")) return cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "ctorch: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}

int cmd_version(int argc, char **argv)
{
    printf("ctorch %s (%s, %d threads, gemm: %s)\n", ct_version(), ct_isa_name(ct_active_isa()), ct_num_threads(),
           ct_gemm_describe());
    printf("cpu: %s; instruction sets:", ct_cpu_name());
    for (int i = 0; i < CT_ISA_COUNT; i++)
        if (ct_cpu_has_isa((ct_isa)i)) printf(" %s", ct_isa_name((ct_isa)i));
    if (ct_cpu_sve_bytes()) printf("; SVE vector length %zu bits", 8 * ct_cpu_sve_bytes());
    printf("\n");
    printf("%s\n", ct_cuda_describe());
    return 0;
}

int cli_fail(const char *what, ct_status s)
{
    fprintf(stderr, "ctorch: %s: %s: %s\n", what, ct_status_name(s), ct_last_error());
    return 1;
}

bool cli_int(const char *opt, const char *val, long long lo, long long hi, long long *out)
{
    char *end;
    long long v = strtoll(val, &end, 10);
    if (!*val || *end || v < lo || v > hi) {
        fprintf(stderr, "ctorch: %s expects an integer in [%lld, %lld], got '%s'\n", opt, lo, hi, val);
        return false;
    }
    *out = v;
    return true;
}

bool cli_float(const char *opt, const char *val, double *out)
{
    char *end;
    double v = strtod(val, &end);
    if (!*val || *end) {
        fprintf(stderr, "ctorch: %s expects a number, got '%s'\n", opt, val);
        return false;
    }
    *out = v;
    return true;
}

bool cli_opt(int argc, char **argv, int *i, const char *name, const char **val)
{
    if (strcmp(argv[*i], name) != 0) return false;
    if (*i + 1 >= argc) {
        fprintf(stderr, "ctorch: %s needs a value\n", name);
        exit(2);
    }
    *val = argv[++*i];
    return true;
}

const char *cli_source_dir(void)
{
    const char *env = getenv("CTORCH_SOURCE_DIR");
    if (env && *env) return env;
#ifdef CT_SOURCE_DIR
    return CT_SOURCE_DIR;
#else
    return NULL;
#endif
}
