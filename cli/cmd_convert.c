/* ctorch convert IN OUT [--dtype D] [--to FORMAT]: convert tensor files and checkpoints.
 *
 * The command is a table of routes. Each route says which (IN, OUT) pairs it handles
 * (`accepts`) and does the conversion (`run`); the first route that accepts the pair runs.
 * To add a conversion:
 *   1. add its options to `convert_args` and parse them in `parse_option` (one branch each);
 *   2. add a route to `routes` (before the generic tensor-file routes when it is more
 *      specific, e.g. one that accepts directories);
 *   3. add a line to `usage`.
 * Every route writes its output atomically (temp file, fsync, rename: ct_save_*), so a failed
 * or interrupted conversion leaves OUT as it was. */
#include "cli.h"
#include "core/internal.h" /* ct_file_*: the one way files are read */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Output formats a route may write. */
typedef enum convert_format {
    CONVERT_AUTO = 0,    /* from OUT's name: *.safetensors, *.pt / *.pth / *.bin */
    CONVERT_SAFETENSORS, /* a safetensors file (ct_save_safetensors_entries) */
    CONVERT_PT,          /* a torch.save zip checkpoint (ct_save_pt) */
    CONVERT_HF,          /* a Hugging Face Llama-family directory (ct_hf_save) */
} convert_format;

/* Everything the command line says. Routes read what they need. */
typedef struct convert_args {
    const char *in, *out;
    bool has_dtype; /* --dtype D: floating-point tensors are converted to `dtype` */
    ct_dtype dtype;
    convert_format to; /* --to safetensors|pt|hf, or CONVERT_AUTO */
    bool quiet;        /* --quiet: no summary line */
    bool merge;        /* --merge-lora [ADAPTER] */
    const char *lora;  /* its ADAPTER directory; NULL: IN is the adapter directory */
} convert_args;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ctorch convert IN OUT [--dtype D] [--to safetensors|pt|hf] [--quiet]\n"
            "       ctorch convert BASE OUT --merge-lora ADAPTER [--dtype D] [--to ...]\n"
            "       ctorch convert ADAPTER OUT --merge-lora\n"
            "Convert a tensor file or a model; OUT is written atomically (temp file or folder,\n"
            "fsync, rename), so a failed conversion leaves it as it was.\n"
            "  IN              any file ct_load reads (safetensors, PyTorch .pt zip or legacy\n"
            "                  checkpoint), detected from its bytes; or a Hugging Face\n"
            "                  Llama-family directory (config.json + model.safetensors or shards)\n"
            "  OUT             *.safetensors -> safetensors; *.pt, *.pth, *.bin -> a torch.save\n"
            "                  zip checkpoint that torch.load(weights_only=True) reads; any other\n"
            "                  name -> a Hugging Face directory (new, or empty)\n"
            "  Models: a HF directory -> *.safetensors writes a ctorch checkpoint (the weights\n"
            "  under ctorch's names, its config, tokenizer.json as \"tokenizer\", config.json as\n"
            "  \"hf_config\": `ctorch generate`, `train --init-from` and models.load read it);\n"
            "  a ctorch checkpoint or a HF directory -> a directory writes the HF layout\n"
            "  (config.json, model.safetensors or the source's shards + index, tokenizer.json).\n"
            "  --merge-lora A  fold the PEFT adapter directory A (adapter_config.json +\n"
            "                  adapter_model.safetensors) into BASE (W += alpha / r B A) and\n"
            "                  write the merged model; without A, IN is the adapter directory and\n"
            "                  BASE its base_model_name_or_path\n"
            "  --dtype D       convert floating-point tensors to D (f32, f16, bf16, f64, ...;\n"
            "                  models: f32, f16 or bf16); integer and bool tensors keep their\n"
            "                  dtype. Default: keep dtypes\n"
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

static bool is_regular_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static convert_format out_format(const convert_args *a)
{
    if (a->to != CONVERT_AUTO) return a->to;
    if (ends_with(a->out, ".safetensors")) return CONVERT_SAFETENSORS;
    if (ends_with(a->out, ".pt") || ends_with(a->out, ".pth") || ends_with(a->out, ".bin"))
        return CONVERT_PT;
    /* a directory, or a new name without an extension */
    const char *base = strrchr(a->out, '/');
    base = base ? base + 1 : a->out;
    if (is_dir(a->out) || (!is_regular_file(a->out) && *base && !strchr(base, '.')))
        return CONVERT_HF;
    return CONVERT_AUTO;
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

/* Most bytes convert writes out for broadcast (stride-0 or overlapping) views of a .pt file:
 * such a view reaches fewer bytes of its storage than it has elements, so a tiny file could
 * ask for any amount of output (a 655-byte file with a stride-0 [2^20, 2^20] view asked for
 * 4 TiB). Other tensors are bounded by the input file's size. */
#define CONVERT_BROADCAST_MAX ((uint64_t)1 << 30)

static void shape_str(char *buf, size_t cap, const ct_tensor_info *inf)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < inf->ndim && d < 8 && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)inf->shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "%s]", inf->ndim > 8 ? ", ..." : "");
}

static int tensor_set_make(const convert_args *a, const ct_tensor_file *f, tensor_set *t)
{
    uint64_t broadcast = 0; /* bytes the broadcast views so far write out */
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
        uint64_t reach = inf.data_end - inf.data_begin; /* storage bytes the view can read */
        if (inf.nbytes > reach) {
            broadcast += inf.nbytes;
            if (broadcast > CONVERT_BROADCAST_MAX || broadcast < inf.nbytes) {
                char sh[192];
                shape_str(sh, sizeof sh, &inf);
                fprintf(stderr,
                        "ctorch convert: tensor '%s' %s is a broadcast (stride-0 or overlapping) "
                        "view of %llu storage bytes that would write %llu bytes; broadcast views "
                        "are written out up to %llu bytes in all (the output size limit): "
                        "save it contiguous (.contiguous() or .clone()) if it is meant\n",
                        inf.name, sh, (unsigned long long)reach, (unsigned long long)inf.nbytes,
                        (unsigned long long)CONVERT_BROADCAST_MAX);
                return 1;
            }
        }
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
    convert_format f = out_format(a);
    return is_regular_file(a->in) && (f == CONVERT_SAFETENSORS || f == CONVERT_PT);
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

/* ---- route: models (HF directory <-> ctorch checkpoint, --merge-lora) ------------------- */

/* A model read for conversion: the source, its weights in a ct_gpt (f32), its tokenizer. */
typedef struct model_src {
    ct_hf_model *hf;   /* a Hugging Face directory, or */
    ct_tensor_file *f; /* a ctorch checkpoint */
    ct_gpt_config cfg;
    ct_dtype dtype; /* the weights' dtype (HF: torch_dtype; checkpoint: the embedding's) */
    ct_gpt *m;
    ct_tokenizer *tok; /* NULL when the source has none */
    char *hf_config;   /* config.json's text (HF) or the checkpoint's "hf_config"; malloc'd */
    bool pt;           /* f is a PyTorch state dict with a configuration (model_pt.c) */
} model_src;

static void model_src_free(model_src *s)
{
    ct_gpt_free(s->m);
    ct_hf_close(s->hf);
    ct_tensor_file_close(s->f);
    ct_tokenizer_free(s->tok);
    free(s->hf_config);
    memset(s, 0, sizeof s[0]);
}

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

#define CONVERT_TEXT_MAX ((size_t)1 << 20) /* config.json, adapter_config.json: as the library */

/* A small text file (at most CONVERT_TEXT_MAX bytes) into a new NUL-terminated buffer. */
static char *read_text(const char *path, size_t *len)
{
    char *text; /* a regular file (a FIFO or /dev/zero refused), at most CONVERT_TEXT_MAX */
    size_t n;
    ct_status s = ct_file_read_all(path, "config", CONVERT_TEXT_MAX, &text, &n);
    if (s) {
        cli_fail("convert", s);
        return NULL;
    }
    char *buf = malloc(n + 1);
    if (buf) memcpy(buf, text, n + 1);
    ct_free(text);
    if (!buf) {
        cli_fail("convert", CT_ENOMEM);
        return NULL;
    }
    if (len) *len = n;
    return buf;
}

static bool is_hf_dir(const char *p)
{
    char *c = path_join(p, "config.json");
    bool ok = c && is_dir(p) && is_regular_file(c);
    free(c);
    return ok;
}

static bool is_model_dtype(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F16 || dt == CT_DTYPE_BF16;
}

/* Open IN (a HF directory or a ctorch checkpoint) and read its weights into an f32 model. */
static int model_open(const char *path, model_src *s)
{
    memset(s, 0, sizeof s[0]);
    ct_status st;
    if (is_dir(path)) {
        if (!is_hf_dir(path)) {
            fprintf(stderr,
                    "ctorch convert: '%s' is a directory without config.json: not a Hugging Face "
                    "model directory\n",
                    path);
            return 1;
        }
        if ((st = ct_hf_open(path, &s->hf))) return cli_fail("convert", st);
        s->cfg = *ct_hf_get_config(s->hf);
        s->dtype = ct_hf_get_info(s->hf)->dtype;
        char *cp = path_join(path, "config.json"), *tp = path_join(path, "tokenizer.json");
        if (!cp || !tp) {
            free(cp);
            free(tp);
            return cli_fail("convert", CT_ENOMEM);
        }
        s->hf_config = read_text(cp, NULL);
        free(cp);
        if (s->hf_config && is_regular_file(tp) && (st = ct_tokenizer_load(path, &s->tok))) {
            fprintf(stderr, "ctorch convert: warning: %s: %s: %s; the output has no tokenizer\n",
                    tp, ct_status_name(st), ct_last_error());
            s->tok = NULL;
        }
        free(tp);
        if (!s->hf_config) return 1;
    } else {
        if ((st = ct_load(path, NULL, &s->f))) return cli_fail("convert", st);
        const char *fmt = ct_tensor_file_metadata_get(s->f, "format");
        if (!fmt || strcmp(fmt, "ctorch-gpt")) {
            /* a PyTorch state dict with its configuration inside or a config.json beside it
             * (model_pt.c), and the tokenizer.json beside it when there is one */
            ct_hf_info pi;
            if (cli_pt_model_config(path, s->f, &s->cfg, &pi, &s->hf_config)) return 1;
            s->pt = true;
            s->dtype = pi.dtype;
            const char *sl = strrchr(path, '/');
            char tp[4200];
            snprintf(tp, sizeof tp, "%.*s/tokenizer.json", sl ? (int)(sl - path) : 1,
                     sl ? path : ".");
            if (is_regular_file(tp) && (st = ct_tokenizer_load(tp, &s->tok))) {
                fprintf(stderr,
                        "ctorch convert: warning: %s: %s: %s; the output has no tokenizer\n", tp,
                        ct_status_name(st), ct_last_error());
                s->tok = NULL;
            }
            goto create;
        }
        if ((st = ct_gpt_checkpoint_check(s->f, false, &s->cfg))) {
            fprintf(stderr,
                    "ctorch convert: '%s' is not a model ctorch can convert: %s\n"
                    "(a model is a Hugging Face directory or a ctorch checkpoint: safetensors "
                    "with \"format\" ctorch-gpt and its \"config\")\n",
                    path, ct_last_error());
            return 1;
        }
        s->dtype = CT_DTYPE_F32;
        size_t k;
        ct_tensor_info inf;
        if (ct_tensor_file_find(s->f, "tok_embeddings.weight", &k) == CT_OK &&
            ct_tensor_file_info(s->f, k, &inf) == CT_OK && inf.has_dtype &&
            is_model_dtype(inf.dtype))
            s->dtype = inf.dtype;
        const char *tj = ct_tensor_file_metadata_get(s->f, "tokenizer");
        if (tj && (st = ct_tokenizer_from_json(tj, strlen(tj), &s->tok)))
            return cli_fail("convert: the checkpoint's tokenizer", st);
        const char *hc = ct_tensor_file_metadata_get(s->f, "hf_config");
        if (hc && !(s->hf_config = strdup(hc))) return cli_fail("convert", CT_ENOMEM);
    }
create:;
    ct_gpt_options mo = ct_gpt_options_default();
    mo.batch = 1; /* no activations to speak of: the weights are all that is used */
    mo.seq = 1;
    if ((st = ct_gpt_create(&s->cfg, &mo, &s->m)) ||
        (!s->pt && (st = s->hf ? ct_hf_load_params(s->hf, s->m) : ct_gpt_load_params(s->m, s->f))))
        return cli_fail("convert", st);
    if (s->pt && cli_pt_model_load(path, s->f, s->m)) return 1;
    return 0;
}

/* --merge-lora without BASE: the adapter's base_model_name_or_path (as written, else relative
 * to the adapter directory). */
static char base_from_adapter[4096];

static int model_base_from_adapter(convert_args *a)
{
    char *cp = path_join(a->lora, "adapter_config.json");
    char *text = cp ? read_text(cp, NULL) : NULL;
    if (!text) {
        free(cp);
        return 1;
    }
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    free(text);
    const char *b = json_string_value(json_object_get(j, "base_model_name_or_path"));
    int rc = 0;
    if (!b || !*b) {
        fprintf(stderr,
                "ctorch convert: %s %s: give the base model: ctorch convert BASE OUT "
                "--merge-lora %s\n",
                cp, j ? "has no base_model_name_or_path" : "is not JSON", a->lora);
        rc = 1;
    } else if (b[0] != '/' && !is_dir(b) && !is_regular_file(b)) {
        snprintf(base_from_adapter, sizeof base_from_adapter, "%s/%s", a->lora, b);
    } else {
        snprintf(base_from_adapter, sizeof base_from_adapter, "%s", b);
    }
    a->in = base_from_adapter;
    json_decref(j);
    free(cp);
    return rc;
}

static bool model_accepts(const convert_args *a)
{
    if (a->merge || is_dir(a->in)) return true;
    return is_regular_file(a->in) && out_format(a) == CONVERT_HF;
}

/* The output dtype of a model tensor: --dtype, else the source's dtype of that tensor (a
 * checkpoint's own; a HF directory's torch_dtype). */
static ct_dtype model_tensor_dtype(const convert_args *a, const model_src *s, const char *name)
{
    if (a->has_dtype) return a->dtype;
    size_t k;
    ct_tensor_info inf;
    if (s->f && !s->pt && ct_tensor_file_find(s->f, name, &k) == CT_OK &&
        ct_tensor_file_info(s->f, k, &inf) == CT_OK && inf.has_dtype && is_model_dtype(inf.dtype))
        return inf.dtype;
    return s->dtype;
}

/* The model as a ctorch checkpoint (atomic: ct_save_safetensors_entries). */
static int write_checkpoint(const convert_args *a, model_src *s)
{
    int nt = ct_gpt_num_tensors(s->m), rc = 0;
    ct_save_entry *e = calloc((size_t)nt, sizeof *e);
    ct_tensor *views = calloc((size_t)nt, sizeof *views), *conv = calloc((size_t)nt, sizeof *conv);
    char *cj = NULL, *tj = NULL;
    if (!e || !views || !conv) {
        free(e);
        free(views);
        free(conv);
        return cli_fail("convert", CT_ENOMEM);
    }
    ct_status st = CT_OK;
    for (int i = 0; i < nt && !st; i++) {
        const char *name;
        if ((st = ct_gpt_tensor(s->m, i, &name, &views[i], NULL))) break;
        ct_dtype dt = model_tensor_dtype(a, s, name);
        e[i].name = name;
        e[i].tensor = &views[i];
        if (dt != CT_DTYPE_F32) { /* exact when the source had that dtype */
            if ((st = ct_tensor_cast(&views[i], dt, &conv[i]))) break;
            e[i].tensor = &conv[i];
        }
    }
    if (!st) st = ct_gpt_config_to_json(&s->cfg, &cj);
    if (!st && s->tok) st = ct_tokenizer_to_json(s->tok, &tj);
    if (!st) {
        const char *mk[8], *mv[8];
        size_t n = 0;
        mk[n] = "format", mv[n++] = "ctorch-gpt";
        mk[n] = "config", mv[n++] = cj;
        if (tj) mk[n] = "tokenizer", mv[n++] = tj;
        if (s->hf_config) mk[n] = "hf_config", mv[n++] = s->hf_config;
        /* a checkpoint's settings that still hold for these weights (not its trainer state:
         * the weights may have changed, so --resume from here is refused) */
        static const char *keep[] = {"train", "data"};
        for (size_t k = 0; s->f && !s->pt && k < sizeof keep / sizeof keep[0]; k++) {
            const char *v = ct_tensor_file_metadata_get(s->f, keep[k]);
            if (v) mk[n] = keep[k], mv[n++] = v;
        }
        st = ct_save_safetensors_entries(a->out, e, (size_t)nt, mk, mv, n, NULL);
    }
    if (st) rc = cli_fail("convert", st);
    for (int i = 0; conv && i < nt; i++)
        ct_tensor_free(&conv[i]);
    free(conv);
    free(views);
    free(e);
    ct_free(cj);
    ct_free(tj);
    return rc;
}

/* Write len bytes to dir/name (the directory is made durable as a whole afterwards). */
static int write_file(const char *dir, const char *name, const char *data, size_t len)
{
    char *p = path_join(dir, name);
    if (!p) return cli_fail("convert", CT_ENOMEM);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    bool ok = fd >= 0;
    for (size_t o = 0; ok && o < len;) {
        ssize_t w = write(fd, data + o, len - o);
        if (w < 0 && errno == EINTR) continue;
        ok = w > 0;
        o += ok ? (size_t)w : 0;
    }
    if (ok) ok = fsync(fd) == 0;
    if (fd >= 0 && close(fd) != 0) ok = false;
    if (!ok) fprintf(stderr, "ctorch convert: cannot write '%s': %s\n", p, strerror(errno));
    free(p);
    return ok ? 0 : 1;
}

/* The first setting in which two configurations describe different models (NULL: none):
 * init_std and a head_dim of 0 (d_model / n_head) do not change a trained model. */
static const char *config_diff(const ct_gpt_config *a, const ct_gpt_config *b)
{
#define CT_DIFF(f)                                                                                \
    if (a->f != b->f) return #f
    CT_DIFF(vocab_size);
    CT_DIFF(context);
    CT_DIFF(n_layer);
    CT_DIFF(d_model);
    CT_DIFF(n_head);
    CT_DIFF(n_kv_head);
    CT_DIFF(d_ff);
    CT_DIFF(rope_base);
    CT_DIFF(window);
    CT_DIFF(tied);
    CT_DIFF(norm_eps);
    CT_DIFF(qkv_bias);
    CT_DIFF(o_bias);
    CT_DIFF(rope_scaling);
    if (ct_gpt_head_dim(a) != ct_gpt_head_dim(b)) return "head_dim";
    if (a->rope_scaling != CT_ROPE_SCALING_NONE) CT_DIFF(rope_factor);
    if (a->rope_scaling == CT_ROPE_SCALING_LLAMA3) {
        CT_DIFF(rope_low_freq_factor);
        CT_DIFF(rope_high_freq_factor);
        CT_DIFF(rope_original_context);
    }
#undef CT_DIFF
    if (strcmp(a->score_mod, b->score_mod)) return "score_mod";
    if (strcmp(a->mask_mod, b->mask_mod)) return "mask_mod";
    return NULL;
}

/* Does config.json text describe s's model (as ctorch reads it)? If not, *why says how: the
 * parser's error or the first setting that differs. */
static bool config_matches(const char *text, const model_src *s, char *why, size_t n)
{
    ct_gpt_config c;
    ct_hf_info info;
    if (ct_hf_config_parse(text, strlen(text), &c, &info) != CT_OK) {
        snprintf(why, n, "%s", ct_last_error());
        return false;
    }
    const char *d = config_diff(&c, &s->cfg);
    if (d) snprintf(why, n, "it has another \"%s\" than the model's configuration", d);
    return !d;
}

/* config.json of a checkpoint that came from a HF directory: its "hf_config" as it was (only
 * torch_dtype set to the saved dtype) when that still describes the model, else its keys with
 * the shape keys ct_hf_save wrote; so bos / eos ids, architectures and the rest come back. For
 * a checkpoint made by ctorch: the BOS / EOS ids of its tokenizer added. */
static int restore_config(const char *dir, const model_src *s)
{
    char *cp = path_join(dir, "config.json");
    char *text = cp ? read_text(cp, NULL) : NULL;
    free(cp);
    if (!text) return 1;
    json_error_t je;
    json_t *gen = json_loads(text, 0, &je), *old = NULL;
    free(text);
    if (s->hf_config) old = json_loads(s->hf_config, 0, &je);
    if (!gen || (s->hf_config && !json_is_object(old))) {
        fprintf(stderr, "ctorch convert: the checkpoint's \"hf_config\" is not a JSON object\n");
        json_decref(gen);
        json_decref(old);
        return 1;
    }
    char *out = NULL;
    char why[512] = "";
    if (old) {
        /* the saved dtype, under the key the source used ("dtype" in transformers 5) */
        bool new_key = json_object_get(old, "dtype") && !json_object_get(old, "torch_dtype");
        json_object_set(old, new_key ? "dtype" : "torch_dtype", json_object_get(gen, "torch_dtype"));
        out = json_dumps(old, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
        if (out && !config_matches(out, s, why, sizeof why)) {
            free(out);
            const char *key;
            json_t *v;
            json_object_del(old, "rope_parameters"); /* gen's rope_theta / rope_scaling rule */
            json_object_del(old, "dtype");
            json_object_foreach(gen, key, v)
            {
                if (strcmp(key, "architectures") && strcmp(key, "model_type"))
                    json_object_set(old, key, v);
            }
            out = json_dumps(old, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
        }
    } else {
        int32_t bos = -1, eos = -1;
        if (s->tok) {
            bos = ct_tokenizer_bos(s->tok);
            eos = ct_tokenizer_eos(s->tok);
        } else if (s->f && !s->pt) { /* a trainer checkpoint: the EOS it trained with */
            const char *tr = ct_tensor_file_metadata_get(s->f, "train");
            json_t *t = tr ? json_loads(tr, 0, NULL) : NULL;
            json_t *e = json_object_get(t, "eos_token");
            if (json_is_integer(e) && json_integer_value(e) >= 0 &&
                json_integer_value(e) < INT32_MAX)
                eos = (int32_t)json_integer_value(e);
            json_decref(t);
        }
        if (bos >= 0 && bos < s->cfg.vocab_size)
            json_object_set_new(gen, "bos_token_id", json_integer(bos));
        if (eos >= 0 && eos < s->cfg.vocab_size)
            json_object_set_new(gen, "eos_token_id", json_integer(eos));
        out = json_dumps(gen, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    }
    json_decref(gen);
    json_decref(old);
    if (!out) return cli_fail("convert", CT_ENOMEM);
    /* what comes back must still be a configuration ctorch reads as this model */
    if (!config_matches(out, s, why, sizeof why)) {
        fprintf(stderr, "ctorch convert: the config.json written for the checkpoint describes "
                        "another model than its \"config\": %s\n",
                        why);
        free(out);
        return 1;
    }
    size_t n = strlen(out);
    char *withnl = realloc(out, n + 2);
    if (!withnl) {
        free(out);
        return cli_fail("convert", CT_ENOMEM);
    }
    withnl[n] = '\n';
    withnl[n + 1] = '\0';
    char *cfgp = path_join(dir, "config.json");
    if (cfgp) remove(cfgp);
    free(cfgp);
    int rc = write_file(dir, "config.json", withnl, n + 1);
    free(withnl);
    return rc;
}

/* Remove the files of a temporary output directory, then the directory. */
static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                char *p = path_join(dir, de->d_name);
                if (p) unlink(p);
                free(p);
            }
        closedir(d);
    }
    rmdir(dir);
}

static bool dir_is_empty(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *de;
    bool empty = true;
    while (empty && (de = readdir(d)))
        empty = !strcmp(de->d_name, ".") || !strcmp(de->d_name, "..");
    closedir(d);
    return empty;
}

/* The model as a Hugging Face directory, built in a temporary directory beside OUT and
 * renamed onto it (OUT new or empty), so OUT is either untouched or complete. */
static int write_hf(const convert_args *a, model_src *s)
{
    size_t ol = strlen(a->out);
    while (ol > 1 && a->out[ol - 1] == '/')
        ol--;
    char out[4096], tmp[4200];
    if (ol >= sizeof out) {
        fprintf(stderr, "ctorch convert: OUT is too long\n");
        return 2;
    }
    memcpy(out, a->out, ol);
    out[ol] = '\0';
    if (is_dir(out) ? !dir_is_empty(out) : is_regular_file(out)) {
        fprintf(stderr,
                "ctorch convert: '%s' exists and is not an empty directory: a Hugging Face "
                "directory is written to a new or empty one\n",
                out);
        return 1;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", out);
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "ctorch convert: cannot create a directory beside '%s': %s\n", out,
                strerror(errno));
        return 1;
    }
    ct_hf_save_options o = ct_hf_save_options_default();
    o.dtype = a->has_dtype ? (int)a->dtype : (int)s->dtype;
    ct_status st = ct_hf_save(s->m, s->hf, tmp, &o);
    int rc = st ? cli_fail("convert", st) : 0;
    if (!rc && !s->hf) rc = restore_config(tmp, s);
    if (!rc && s->hf) { /* the tokenizer and generation files, as they are */
        rc = cli_copy_side_files("convert", a->in, tmp);
    } else if (!rc && s->tok) {
        char *tp = path_join(tmp, "tokenizer.json");
        if (!tp || (st = ct_tokenizer_save(s->tok, tp))) rc = cli_fail("convert", st ? st : CT_ENOMEM);
        free(tp);
    }
    if (!rc) {
        int fd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd >= 0) {
            fsync(fd);
            close(fd);
        }
        if (rename(tmp, out) != 0) {
            fprintf(stderr, "ctorch convert: cannot rename '%s' to '%s': %s\n", tmp, out,
                    strerror(errno));
            rc = 1;
        } else {
            char parent[4096];
            snprintf(parent, sizeof parent, "%s", out);
            char *sl = strrchr(parent, '/');
            if (sl == parent) sl[1] = '\0';
            else if (sl) *sl = '\0';
            else snprintf(parent, sizeof parent, ".");
            if ((fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
                fsync(fd);
                close(fd);
            }
        }
    }
    if (rc) remove_tree(tmp);
    return rc;
}

static int model_run(const convert_args *a)
{
    convert_format fmt = out_format(a);
    if (a->has_dtype && !is_model_dtype(a->dtype)) {
        fprintf(stderr, "ctorch convert: --dtype %s: a model's weights are f32, f16 or bf16\n",
                ct_dtype_name(a->dtype));
        return 2;
    }
    if (fmt != CONVERT_SAFETENSORS && fmt != CONVERT_HF) {
        fprintf(stderr,
                "ctorch convert: a model converts to a ctorch checkpoint (*.safetensors) or a "
                "Hugging Face directory (a new name without extension, or --to hf), not '%s'\n",
                a->out);
        return 2;
    }
    model_src s;
    int rc = model_open(a->in, &s);
    int merged = 0;
    if (!rc && a->merge) {
        ct_status st = ct_lora_merge(s.m, a->lora, &merged);
        if (st) rc = cli_fail("convert: --merge-lora", st);
    }
    if (!rc) rc = fmt == CONVERT_HF ? write_hf(a, &s) : write_checkpoint(a, &s);
    if (!rc && !a->quiet) {
        char adapters[4300] = "";
        if (a->merge)
            snprintf(adapters, sizeof adapters, ", %d LoRA adapters of %s merged", merged, a->lora);
        printf("converted %s (%s, %d layers) -> %s (%s, weights as %s%s)\n", a->in,
               s.hf ? "Hugging Face directory" : "ctorch checkpoint", (int)s.cfg.n_layer, a->out,
               fmt == CONVERT_HF ? "Hugging Face directory" : "ctorch checkpoint",
               a->has_dtype          ? ct_dtype_name(a->dtype)
               : fmt == CONVERT_HF || s.hf ? ct_dtype_name(s.dtype)
                                           : "the source's dtypes",
               adapters);
    }
    model_src_free(&s);
    return rc;
}

static const convert_route routes[] = {
    {"model (--merge-lora, HF directory <-> ctorch checkpoint)", model_accepts, model_run},
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
        else if (!strcmp(v, "hf"))
            a->to = CONVERT_HF;
        else {
            fprintf(stderr, "ctorch convert: --to expects safetensors, pt or hf, got '%s'\n", v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(argv[*i], "--quiet")) {
        a->quiet = true;
        return 1;
    }
    if (!strcmp(argv[*i], "--merge-lora")) { /* its value is optional */
        a->merge = true;
        if (*i + 1 < argc && argv[*i + 1][0] != '-') a->lora = argv[++*i];
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
    if (a.merge && a.lora && a.in && !a.out) { /* convert --merge-lora ADAPTER OUT */
        a.out = a.in;
        a.in = NULL;
    }
    if (!a.out || (!a.in && !a.merge)) {
        usage(stderr);
        return 2;
    }
    if (a.merge && !a.in) { /* the base named by the adapter */
        if (model_base_from_adapter(&a)) return 1;
    } else if (a.merge && !a.lora) { /* IN is the adapter directory */
        a.lora = a.in;
        if (model_base_from_adapter(&a)) return 1;
    }
    for (size_t r = 0; r < sizeof routes / sizeof routes[0]; r++)
        if (routes[r].accepts(&a)) return routes[r].run(&a);
    if (!is_regular_file(a.in))
        fprintf(stderr,
                "ctorch convert: '%s' is not a file ctorch can convert from, nor a Hugging Face "
                "directory (config.json)\n",
                a.in);
    else
        fprintf(stderr,
                "ctorch convert: cannot tell the output format from '%s': name it *.safetensors "
                "or *.pt, or give --to safetensors|pt\n",
                a.out);
    return 2;
}
