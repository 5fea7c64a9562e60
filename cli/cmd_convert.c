/* ctorch convert IN OUT [--dtype D] [--to FORMAT]: convert tensor files and checkpoints.
 *
 * The command is a table of routes. Each route says which (IN, OUT) pairs it handles
 * (`accepts`) and does the conversion (`run`); the first route that accepts the pair runs.
 * To add a conversion (Hugging Face directory <-> ctorch checkpoint, --merge-lora, ...):
 *   1. add its options to `convert_args` and parse them in `parse_option` (one branch each);
 *   2. add a route to `routes` (before the generic tensor-file routes when it is more
 *      specific, e.g. one that accepts directories);
 *   3. add a line to `usage`.
 * Every route writes its output atomically (temp file, fsync, rename: ct_save_*), so a failed
 * or interrupted conversion leaves OUT as it was. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Output formats a route may write. */
typedef enum convert_format {
    CONVERT_AUTO = 0,    /* from OUT's name: *.safetensors, *.pt / *.pth / *.bin */
    CONVERT_SAFETENSORS, /* a safetensors file (ct_save_safetensors_entries) */
    CONVERT_PT,          /* a torch.save zip checkpoint (ct_save_pt) */
} convert_format;

/* Everything the command line says. Routes read what they need. */
typedef struct convert_args {
    const char *in, *out;
    bool has_dtype; /* --dtype D: floating-point tensors are converted to `dtype` */
    ct_dtype dtype;
    convert_format to; /* --to safetensors|pt, or CONVERT_AUTO */
    bool quiet;        /* --quiet: no summary line */
} convert_args;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ctorch convert IN OUT [--dtype D] [--to safetensors|pt] [--quiet]\n"
            "Convert a tensor file; OUT is written atomically (temp file, fsync, rename), so a\n"
            "failed conversion leaves it as it was.\n"
            "  IN              any file ct_load reads (safetensors, PyTorch .pt zip or legacy\n"
            "                  checkpoint), detected from its bytes\n"
            "  OUT             *.safetensors -> safetensors; *.pt, *.pth, *.bin -> a torch.save\n"
            "                  zip checkpoint that torch.load(weights_only=True) reads\n"
            "  --dtype D       convert floating-point tensors to D (f32, f16, bf16, f64, ...);\n"
            "                  integer and bool tensors keep their dtype. Default: keep dtypes\n"
            "  --to FORMAT     the output format, whatever OUT is called\n"
            "  --quiet         print nothing on success\n"
            "Tensor names are kept (nested .pt containers become dotted names); .pt metadata\n"
            "(non-tensor values, as JSON) goes to the safetensors __metadata__.\n"
            "Exit status: 0 done, 1 a failure (the message says what), 2 a bad option.\n");
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static convert_format out_format(const convert_args *a)
{
    if (a->to != CONVERT_AUTO) return a->to;
    if (ends_with(a->out, ".safetensors")) return CONVERT_SAFETENSORS;
    if (ends_with(a->out, ".pt") || ends_with(a->out, ".pth") || ends_with(a->out, ".bin"))
        return CONVERT_PT;
    return CONVERT_AUTO;
}

static bool is_regular_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool is_float_dtype(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64 || dt == CT_DTYPE_F16 || dt == CT_DTYPE_BF16 ||
           dt == CT_DTYPE_F8_E4M3 || dt == CT_DTYPE_F8_E5M2;
}

/* ---- route: tensor file -> safetensors / .pt ------------------------------------------ */

/* The tensors of f as save entries: views (any strides), converted copies (--dtype) in
 * conv[], or raw bytes for dtypes ctorch has none for. */
typedef struct tensor_set {
    size_t n;
    ct_save_entry *e;
    ct_tensor *views, *conv;
    const char **mk, **mv;
    size_t m;
} tensor_set;

static void tensor_set_free(tensor_set *t)
{
    if (t->conv)
        for (size_t i = 0; i < t->n; i++)
            ct_tensor_free(&t->conv[i]);
    free(t->e);
    free(t->views);
    free(t->conv);
    free(t->mk);
    free(t->mv);
    memset(t, 0, sizeof *t);
}

static int tensor_set_make(const convert_args *a, const ct_tensor_file *f, tensor_set *t)
{
    memset(t, 0, sizeof *t);
    t->n = ct_tensor_file_count(f);
    t->m = ct_tensor_file_metadata_count(f);
    t->e = calloc(t->n + 1, sizeof *t->e);
    t->views = calloc(t->n + 1, sizeof *t->views);
    t->conv = calloc(t->n + 1, sizeof *t->conv);
    t->mk = calloc(t->m + 1, sizeof *t->mk);
    t->mv = calloc(t->m + 1, sizeof *t->mv);
    if (!t->e || !t->views || !t->conv || !t->mk || !t->mv) {
        fprintf(stderr, "ctorch convert: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < t->n; i++) {
        ct_tensor_info inf;
        ct_status s = ct_tensor_file_info(f, i, &inf);
        if (s != CT_OK) return cli_fail("convert", s);
        t->e[i].name = inf.name;
        if (inf.has_dtype && inf.ndim <= CT_MAX_DIMS) {
            if ((s = ct_tensor_file_view(f, i, &t->views[i])) != CT_OK)
                return cli_fail("convert", s);
            if (a->has_dtype && is_float_dtype(inf.dtype) && inf.dtype != a->dtype) {
                if ((s = ct_tensor_file_read(f, i, a->dtype, &t->conv[i])) != CT_OK)
                    return cli_fail("convert", s);
                t->e[i].tensor = &t->conv[i];
            } else
                t->e[i].tensor = &t->views[i];
        } else {
            if (inf.strides) {
                fprintf(stderr,
                        "ctorch convert: tensor '%s' is %s and strided: ctorch can only copy "
                        "contiguous tensors of dtypes it has no dtype for\n",
                        inf.name, ct_st_dtype_name(inf.st_dtype));
                return 1;
            }
            t->e[i].st_dtype = inf.st_dtype;
            t->e[i].ndim = inf.ndim;
            t->e[i].shape = inf.shape;
            t->e[i].data = inf.data;
        }
    }
    for (size_t i = 0; i < t->m; i++) {
        ct_status s = ct_tensor_file_metadata(f, i, &t->mk[i], &t->mv[i]);
        if (s != CT_OK) return cli_fail("convert", s);
    }
    return 0;
}

static bool tensor_file_accepts(const convert_args *a)
{
    return is_regular_file(a->in) && out_format(a) != CONVERT_AUTO;
}

static int tensor_file_run(const convert_args *a)
{
    ct_tensor_file *f;
    ct_status s = ct_load(a->in, NULL, &f);
    if (s != CT_OK) return cli_fail("convert", s);
    tensor_set t;
    int rc = tensor_set_make(a, f, &t);
    convert_format fmt = out_format(a);
    if (rc == 0) {
        if (fmt == CONVERT_SAFETENSORS)
            s = ct_save_safetensors_entries(a->out, t.e, t.n, t.mk, t.mv, t.m, NULL);
        else
            s = ct_save_pt_entries(a->out, t.e, t.n, NULL);
        if (s != CT_OK) rc = cli_fail("convert", s);
    }
    if (rc == 0 && !a->quiet) {
        ct_tensor_file_summary sm;
        ct_tensor_file_summarize(f, &sm);
        printf("converted %s (%s, %zu tensors) -> %s (%s%s%s)\n", a->in,
               ct_file_format_name(sm.format), t.n, a->out,
               fmt == CONVERT_SAFETENSORS ? "safetensors" : "PyTorch zip checkpoint",
               a->has_dtype ? ", floating-point tensors as " : "",
               a->has_dtype ? ct_dtype_name(a->dtype) : "");
        if (fmt == CONVERT_PT && t.m)
            printf("note: the %zu metadata entries are not written to the .pt file (it holds "
                   "a state dict of tensors only)\n",
                   t.m);
    }
    tensor_set_free(&t);
    ct_tensor_file_close(f);
    return rc;
}

/* ---- the route table ------------------------------------------------------------------ */

typedef struct convert_route {
    const char *name;
    bool (*accepts)(const convert_args *a);
    int (*run)(const convert_args *a);
} convert_route;

static const convert_route routes[] = {
    {"tensor file -> safetensors / .pt", tensor_file_accepts, tensor_file_run},
};

/* One option at argv[*i]: 1 consumed, 0 not an option of this command, -1 bad value. */
static int parse_option(int argc, char **argv, int *i, convert_args *a)
{
    const char *v;
    if (cli_opt(argc, argv, i, "--dtype", &v)) {
        if (ct_dtype_from_name(v, &a->dtype) != CT_OK) {
            fprintf(stderr,
                    "ctorch convert: --dtype '%s' is not a dtype (f32, f64, f16, bf16, "
                    "i8, u8, i16, i32, i64, bool, f8e4m3, f8e5m2)\n",
                    v);
            return -1;
        }
        a->has_dtype = true;
        return 1;
    }
    if (cli_opt(argc, argv, i, "--to", &v)) {
        if (!strcmp(v, "safetensors"))
            a->to = CONVERT_SAFETENSORS;
        else if (!strcmp(v, "pt"))
            a->to = CONVERT_PT;
        else {
            fprintf(stderr, "ctorch convert: --to expects safetensors or pt, got '%s'\n", v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(argv[*i], "--quiet")) {
        a->quiet = true;
        return 1;
    }
    return 0;
}

int cmd_convert(int argc, char **argv)
{
    convert_args a;
    memset(&a, 0, sizeof a);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        int r = parse_option(argc, argv, &i, &a);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "ctorch convert: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        if (!a.in)
            a.in = argv[i];
        else if (!a.out)
            a.out = argv[i];
        else {
            fprintf(stderr, "ctorch convert: one IN and one OUT only ('%s' is a third)\n", argv[i]);
            return 2;
        }
    }
    if (!a.in || !a.out) {
        usage(stderr);
        return 2;
    }
    for (size_t r = 0; r < sizeof routes / sizeof routes[0]; r++)
        if (routes[r].accepts(&a)) return routes[r].run(&a);
    if (!is_regular_file(a.in))
        fprintf(stderr, "ctorch convert: '%s' is not a file ctorch can convert from\n", a.in);
    else
        fprintf(stderr,
                "ctorch convert: cannot tell the output format from '%s': name it *.safetensors "
                "or *.pt, or give --to safetensors|pt\n",
                a.out);
    return 2;
}
