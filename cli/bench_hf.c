/* ctorch bench hf: open a multi-GiB sharded Hugging Face directory (ct_hf_open + ct_hf_close:
 * config.json parsed, the index read, every shard mapped, every header validated and every
 * tensor checked against the configuration; no weight is read), beside its baselines in the
 * same run on the same files: ct_load + close of every shard alone (the bare safetensors opens
 * the directory is made of) and ct_hf_open of a one-layer directory (opening does not depend
 * on the size). Then loading a model from it for inference: ct_hf_map_model (the bf16
 * weights left in the mapped files) beside ct_gpt_create + ct_hf_load_params (converted into
 * f32 parameters, what inference did before bf16 stayed mapped), each with the growth of the
 * process's anonymous resident memory (RssAnon: copies, not the mapped files' pages) and of
 * the tracked bytes. The directory is a Llama-shaped model in bf16 (TinyLlama-1.1B's shape by
 * default, 2.2 GB) written by the benchmark into a temporary directory and removed after;
 * page cache warm. */
#include "bench_util.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct hf_case {
    char dir[4096], small[4096];
    int nshards;
    char **shards; /* paths of the big directory's shard files */
    int64_t bytes;
    int tensors;
} hf_case;

typedef struct hf_shape {
    int64_t vocab, d, ff, layers, heads, kv, head_dim;
} hf_shape;

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    bool ok = f && fputs(text, f) >= 0;
    if (f) ok = fclose(f) == 0 && ok;
    if (!ok) fprintf(stderr, "ctorch bench hf: cannot write '%s': %s\n", path, strerror(errno));
    return ok ? 0 : 1;
}

/* The HF names and shapes of the model, in file order. */
typedef struct hf_tensor {
    char name[96];
    int64_t rows, cols; /* cols 0: a vector */
} hf_tensor;

static int model_tensors(const hf_shape *s, hf_tensor **out)
{
    int n = 3 + 9 * (int)s->layers, k = 0;
    hf_tensor *t = calloc((size_t)n, sizeof *t);
    if (!t) return -1;
    int64_t q = s->heads * s->head_dim, kv = s->kv * s->head_dim;
#define ADD(nm, r, c)                                             \
    do {                                                          \
        snprintf(t[k].name, sizeof t[k].name, "%s", nm);          \
        t[k].rows = (r);                                          \
        t[k].cols = (c);                                          \
        k++;                                                      \
    } while (0)
    ADD("model.embed_tokens.weight", s->vocab, s->d);
    for (int64_t l = 0; l < s->layers; l++) {
        char b[96];
        static const char *names[] = {"input_layernorm.weight", "self_attn.q_proj.weight",
                                      "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                      "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                                      "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                      "mlp.down_proj.weight"};
        int64_t rows[] = {s->d, q, kv, kv, s->d, s->d, s->ff, s->ff, s->d};
        int64_t cols[] = {0, s->d, s->d, s->d, q, 0, s->d, s->d, s->ff};
        for (int j = 0; j < 9; j++) {
            snprintf(b, sizeof b, "model.layers.%lld.%s", (long long)l, names[j]);
            ADD(b, rows[j], cols[j]);
        }
    }
    ADD("model.norm.weight", s->d, 0);
    ADD("lm_head.weight", s->vocab, s->d);
#undef ADD
    *out = t;
    return n;
}

/* Write dir: config.json, shards of at most shard_bytes (one when 0) and, for several, the
 * index. Every tensor's bytes come from one buffer (the data is never read by an open). */
static int write_dir(const char *dir, const hf_shape *s, int64_t shard_bytes, hf_case *c)
{
    if (mkdir(dir, 0777) != 0) {
        fprintf(stderr, "ctorch bench hf: cannot create '%s': %s\n", dir, strerror(errno));
        return 1;
    }
    hf_tensor *t;
    int n = model_tensors(s, &t);
    if (n < 0) return cli_fail("bench hf", CT_ENOMEM);
    int64_t biggest = 0, total = 0;
    for (int i = 0; i < n; i++) {
        int64_t e = t[i].rows * (t[i].cols ? t[i].cols : 1);
        if (e > biggest) biggest = e;
        total += 2 * e;
    }
    uint16_t *buf = malloc((size_t)biggest * 2);
    float *tmp = malloc(4096 * sizeof *tmp);
    ct_tensor *views = calloc((size_t)n, sizeof *views);
    const char **names = calloc((size_t)n, sizeof *names);
    int *file = calloc((size_t)n, sizeof *file);
    if (!buf || !tmp || !views || !names || !file) return cli_fail("bench hf", CT_ENOMEM);
    bench_fill(tmp, 4096, 7, 0.05f);
    for (int64_t i = 0; i < biggest; i += 4096) {
        size_t m = (size_t)(biggest - i < 4096 ? biggest - i : 4096);
        ct_convert_f32_to_bf16(buf + i, tmp, m);
    }
    int nf = 0;
    int64_t in_file = 0;
    for (int i = 0; i < n; i++) {
        int64_t b = 2 * t[i].rows * (t[i].cols ? t[i].cols : 1);
        if (shard_bytes > 0 && in_file > 0 && in_file + b > shard_bytes) {
            nf++;
            in_file = 0;
        }
        file[i] = nf;
        in_file += b;
        int64_t shape[2] = {t[i].rows, t[i].cols};
        ct_status st = ct_tensor_wrap(&views[i], buf, CT_DTYPE_BF16, t[i].cols ? 2 : 1, shape, NULL);
        if (st) return cli_fail("bench hf", st);
        names[i] = t[i].name;
    }
    nf++;
    char path[4300];
    c->nshards = nf;
    c->shards = calloc((size_t)nf, sizeof *c->shards);
    ct_tensor *pv = calloc((size_t)n, sizeof *pv);
    const char **pn = calloc((size_t)n, sizeof *pn);
    if (!c->shards || !pv || !pn) return cli_fail("bench hf", CT_ENOMEM);
    ct_save_options so = ct_save_options_default();
    so.sync = false;
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    for (int f = 0; f < nf; f++) {
        char fn[64];
        if (nf == 1)
            snprintf(fn, sizeof fn, "model.safetensors");
        else
            snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", f + 1, nf);
        snprintf(path, sizeof path, "%s/%s", dir, fn);
        size_t np = 0;
        for (int i = 0; i < n; i++)
            if (file[i] == f) pv[np] = views[i], pn[np++] = names[i];
        ct_status st = ct_save_safetensors(path, pv, pn, np, mk, mv, 1, &so);
        if (st) return cli_fail("bench hf: writing a shard", st);
        c->shards[f] = strdup(path);
    }
    if (nf > 1) {
        json_t *wm = json_object();
        for (int i = 0; i < n; i++) {
            char fn[64];
            snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", file[i] + 1, nf);
            json_object_set_new(wm, names[i], json_string(fn));
        }
        json_t *ix = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                               "weight_map", wm);
        char *js = json_dumps(ix, JSON_INDENT(2));
        json_decref(ix);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (!js || write_text(path, js)) return 1;
        free(js);
    }
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
             "\"hidden_size\": %lld, \"intermediate_size\": %lld, \"num_hidden_layers\": %lld, "
             "\"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld, "
             "\"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"rope_scaling\": null, "
             "\"max_position_embeddings\": 2048, \"tie_word_embeddings\": false, "
             "\"vocab_size\": %lld, \"torch_dtype\": \"bfloat16\", \"attention_bias\": false, "
             "\"hidden_act\": \"silu\", \"bos_token_id\": 1, \"eos_token_id\": 2}\n",
             (long long)s->d, (long long)s->ff, (long long)s->layers, (long long)s->heads,
             (long long)s->kv, (long long)s->head_dim, (long long)s->vocab);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (write_text(path, cfg)) return 1;
    c->bytes = total;
    c->tensors = n;
    free(pv);
    free(pn);
    free(file);
    free(names);
    free(views);
    free(tmp);
    free(buf);
    free(t);
    return 0;
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                char p[4400];
                snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(dir);
}

static ct_status run_open(void *p)
{
    ct_hf_model *h;
    ct_status s = ct_hf_open(((hf_case *)p)->dir, &h);
    ct_hf_close(h);
    return s;
}

static ct_status run_open_small(void *p)
{
    ct_hf_model *h;
    ct_status s = ct_hf_open(((hf_case *)p)->small, &h);
    ct_hf_close(h);
    return s;
}

typedef struct load_case {
    const char *dir;
    bool mapped;
    size_t anon, tracked; /* growth while the model is loaded (the last run's) */
} load_case;

static ct_status run_load(void *p)
{
    load_case *l = p;
    ct_memory_stats_t m0, m1;
    size_t a0 = bench_rss_anon();
    ct_memory_stats(&m0);
    ct_hf_model *h;
    ct_status s = ct_hf_open(l->dir, &h);
    if (s) return s;
    ct_gpt_options o = ct_gpt_options_default();
    o.batch = 1;
    o.seq = 1;
    ct_gpt *m = NULL;
    s = l->mapped ? ct_hf_map_model(h, &o, &m, NULL) : ct_gpt_create(ct_hf_get_config(h), &o, &m);
    if (!s && !l->mapped) s = ct_hf_load_params(h, m);
    size_t a1 = bench_rss_anon();
    ct_memory_stats(&m1);
    l->anon = a1 > a0 ? a1 - a0 : 0;
    l->tracked = m1.current_bytes > m0.current_bytes ? m1.current_bytes - m0.current_bytes : 0;
    ct_gpt_free(m);
    ct_hf_close(h);
    return s;
}

static ct_status run_shards(void *p)
{
    hf_case *c = p;
    for (int i = 0; i < c->nshards; i++) {
        ct_tensor_file *f;
        ct_status s = ct_load(c->shards[i], NULL, &f);
        ct_tensor_file_close(f);
        if (s) return s;
    }
    return CT_OK;
}

int bench_hf(bench_ctx *b, int argc, char **argv)
{
    hf_shape s = {32000, 2048, 5632, 22, 32, 4, 64};
    long long layers = s.layers, shard_mib = 1024, vocab = s.vocab, hidden = s.d, inter = s.ff;
    const char *tmpd = getenv("TMPDIR");
    if (!tmpd || !*tmpd) tmpd = "/tmp";
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help")) {
            puts("usage: ctorch bench hf [--layers N] [--shard-mib M] [--dir D] [--json] "
                 "[--repeats R]\n"
                 "                      [--vocab V] [--hidden C] [--intermediate F]\n"
                 "Writes a Llama-shaped Hugging Face directory in bf16 (TinyLlama-1.1B's shape:\n"
                 "vocab 32000, hidden 2048, intermediate 5632, 32 heads, 4 kv heads, N = 22\n"
                 "layers, 2.2 GB; C / 64 heads of 64 dims, C / 512 kv heads) in shards of at most M MiB (default 1024) with\n"
                 "model.safetensors.index.json under D (default $TMPDIR or /tmp), and times with\n"
                 "the page cache warm (median of R):\n"
                 "  open    ct_hf_open + ct_hf_close: config.json, the index, every shard mapped\n"
                 "          and its header validated, every tensor checked against the config\n"
                 "  shards  ct_load + close of every shard (the bare safetensors opens), baseline\n"
                 "  small   ct_hf_open + close of a one-layer directory of the same shape\n"
                 "  load    ct_hf_open + ct_hf_map_model (bf16 weights mapped, inference) vs\n"
                 "          ct_gpt_create + ct_hf_load_params (converted to f32), with the growth\n"
                 "          of anonymous RSS and tracked bytes while loaded (3 converted runs at most)"
                 "The directories are removed afterwards.");
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--layers", &v)) {
            if (!cli_int("--layers", v, 1, 512, &layers)) return 2;
        } else if (cli_opt(argc, argv, &i, "--vocab", &v)) {
            if (!cli_int("--vocab", v, 2, 1 << 20, &vocab)) return 2;
        } else if (cli_opt(argc, argv, &i, "--hidden", &v)) {
            if (!cli_int("--hidden", v, 512, 1 << 16, &hidden)) return 2;
            if (hidden % 512) {
                fprintf(stderr, "ctorch bench hf: --hidden must be a multiple of 512\n");
                return 2;
            }
        } else if (cli_opt(argc, argv, &i, "--intermediate", &v)) {
            if (!cli_int("--intermediate", v, 1, 1 << 18, &inter)) return 2;
        } else if (cli_opt(argc, argv, &i, "--shard-mib", &v)) {
            if (!cli_int("--shard-mib", v, 1, 1 << 20, &shard_mib)) return 2;
        } else if (cli_opt(argc, argv, &i, "--dir", &v)) {
            tmpd = v;
        } else {
            fprintf(stderr, "ctorch bench hf: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    s.layers = layers;
    s.vocab = vocab;
    s.d = hidden;
    s.ff = inter;
    s.heads = hidden / 64;
    s.kv = hidden / 512;
    hf_case c, cs;
    memset(&c, 0, sizeof c);
    memset(&cs, 0, sizeof cs);
    snprintf(c.dir, sizeof c.dir, "%s/ctorch-bench-hf-%ld", tmpd, (long)getpid());
    snprintf(c.small, sizeof c.small, "%s/ctorch-bench-hf-%ld-small", tmpd, (long)getpid());
    hf_shape one = s;
    one.layers = 1;
    double t0 = bench_now();
    int rc = write_dir(c.dir, &s, shard_mib << 20, &c);
    if (!rc) rc = write_dir(c.small, &one, 0, &cs);
    double t_write = bench_now() - t0;
    bench_time to, ts, tsm, tlm, tlc;
    load_case lm = {c.dir, true, 0, 0}, lc = {c.dir, false, 0, 0};
    ct_status st = CT_OK;
    if (!rc && ((st = bench_time_fn(b->repeats, run_open, &c, &to)) ||
                (st = bench_time_fn(b->repeats, run_shards, &c, &ts)) ||
                (st = bench_time_fn(b->repeats, run_open_small, &c, &tsm)) ||
                (st = bench_time_fn(b->repeats, run_load, &lm, &tlm)) ||
                (st = bench_time_fn(b->repeats < 3 ? b->repeats : 3, run_load, &lc, &tlc))))
        rc = cli_fail("bench hf", st);
    remove_dir(c.dir);
    remove_dir(c.small);
    for (int i = 0; i < c.nshards && c.shards; i++)
        free(c.shards[i]);
    for (int i = 0; i < cs.nshards && cs.shards; i++)
        free(cs.shards[i]);
    free(c.shards);
    free(cs.shards);
    if (rc) return rc;
    json_t *j = json_pack(
        "{s:s, s:o, s:{s:I, s:i, s:i, s:I, s:s, s:s}, s:o, s:o, s:o, s:f, s:f}", "bench", "hf",
        "machine", json_pack("{s:i, s:s}", "threads", ct_num_threads(), "isa", ct_isa_name(ct_active_isa())),
        "directory", "data_bytes", (json_int_t)c.bytes, "shards", c.nshards, "tensors", c.tensors,
        "layers", (json_int_t)s.layers, "dtype", "bf16", "cache", "page cache, warm", "open",
        bench_time_json(&to), "shards_ct_load", bench_time_json(&ts), "open_one_layer",
        bench_time_json(&tsm), "open_vs_shards", to.median / ts.median, "write_s", t_write);
    json_t *jm = bench_time_json(&tlm), *jc = bench_time_json(&tlc);
    json_object_set_new(jm, "rss_anon_bytes", json_integer((json_int_t)lm.anon));
    json_object_set_new(jm, "tracked_bytes", json_integer((json_int_t)lm.tracked));
    json_object_set_new(jc, "rss_anon_bytes", json_integer((json_int_t)lc.anon));
    json_object_set_new(jc, "tracked_bytes", json_integer((json_int_t)lc.tracked));
    json_object_set_new(j, "load_mapped", jm);
    json_object_set_new(j, "load_converted", jc);
    json_object_set_new(j, "load_mapped_vs_converted", json_real(tlm.median / tlc.median));
    if (b->json) {
        bench_print_json(j);
    } else {
        printf("hf: %.2f GiB bf16 Llama directory (%lld layers, %d tensors) in %d shard%s, "
               "page cache warm\n",
               c.bytes / 1073741824.0, (long long)s.layers, c.tensors, c.nshards,
               c.nshards > 1 ? "s + index" : "");
        printf("  %-44s %9s\n", "", "median");
        printf("  %-44s %6.3f ms\n", "open: ct_hf_open + close (mmap, validated)", to.median * 1e3);
        printf("  %-44s %6.3f ms  (open is %.2fx)\n", "baseline: ct_load + close of every shard",
               ts.median * 1e3, to.median / ts.median);
        printf("  %-44s %6.3f ms\n", "one-layer directory: ct_hf_open + close", tsm.median * 1e3);
        printf("  %-44s %6.3f ms  +%.1f MiB anon RSS, +%.1f MiB tracked\n",
               "load mapped: open + ct_hf_map_model", tlm.median * 1e3, lm.anon / 1048576.0,
               lm.tracked / 1048576.0);
        printf("  %-44s %6.3f ms  +%.1f MiB anon RSS, +%.1f MiB tracked\n",
               "load converted: open + ct_hf_load_params", tlc.median * 1e3, lc.anon / 1048576.0,
               lc.tracked / 1048576.0);
    }
    json_decref(j);
    return 0;
}
