/* ctorch generate: continue a prompt from a model with a KV cache (ct_gpt_generate). */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: ctorch generate --model DIR|FILE [--prompt TEXT | --prompt-ids \"1 2 3\"]\n"
        "                       [--max-new-tokens N] [--greedy] [--temperature T] [--top-k K]\n"
        "                       [--top-p P] [--seed S] [--ignore-eos] [--json] [--no-cache]\n"
        "                       [--threads N]\n"
        "Continue the prompt with up to N tokens (default 64), prefilling the prompt into a KV "
        "cache\n"
        "and decoding one token at a time, from a Hugging Face Llama-family directory (its\n"
        "tokenizer.json when present, else --prompt-ids and ids out), a PyTorch state dict\n"
        "(.pt/.bin with its \"config\" inside or config.json beside it) or a checkpoint of "
        "`ctorch train`:\n"
        "a text model (--data) reads and writes text through the tokenizer stored in the "
        "checkpoint,\n"
        "a built-in corpus model reads and writes its words (\"tobeka\", '.' ends a document).\n"
        "  --model DIR|FILE    the model (alias: --checkpoint)\n"
        "  --prompt TEXT       the prompt as text (default: empty, which starts a document)\n"
        "  --prompt-ids IDS    the prompt as token ids, separated by spaces or commas\n"
        "  --max-new-tokens N  tokens to generate at most (alias: --tokens; default 64)\n"
        "  --temperature T     divide the logits by T (default 0.8; 0: greedy)\n"
        "  --greedy            the most likely token every time (= --temperature 0)\n"
        "  --top-k K           keep the K most likely tokens (default 40; 0: all), after T\n"
        "  --top-p P           then keep the most likely tokens reaching probability P\n"
        "                      (default 1: all)\n"
        "  --seed S            sampling seed (default 1): the same seed gives the same text\n"
        "  --ignore-eos        go on after the end-of-text token (default: stop there)\n"
        "  --json              one JSON line on stdout: {\"prompt_ids\", \"new_ids\", \"text\" (of "
        "the new\n"
        "                      ids), \"prompt_tok_s\", \"decode_tok_s\"}\n"
        "  --no-cache          the baseline: recompute the whole sequence for every token\n"
        "  --device D          cpu (default), cuda or cuda:N: the model from a ctorch checkpoint\n"
        "                      on that device (GPU: no KV cache yet: the sequence recomputed)\n"
        "Prompt and decode speeds (tokens/s) go to stderr (in --json, into the line).\n"
        "Exit status: 0 done, 1 a failure (the message says what), 2 a bad option.\n");
}

/* How tokens read and print: through a tokenizer, as corpus words, or as ids. */
typedef struct gen_io {
    const ct_tokenizer *tok;
    bool ids_only; /* a Hugging Face directory without tokenizer.json */
    bool stream;   /* print each token as it comes */
} gen_io;

/* Bytes of one token: through the tokenizer, the corpus word ('.' ends a line), or its id. */
static void token_text(const gen_io *io, int32_t id, char *buf, const char **b, size_t *n)
{
    if (io->tok) {
        if (ct_tokenizer_token_bytes(io->tok, id, b, n) != CT_OK) *n = 0;
        return;
    }
    if (io->ids_only) {
        snprintf(buf, 24, "%d ", id);
    } else {
        char w[16];
        ct_corpus_token_text(id, w);
        snprintf(buf, 24, id == 0 ? "%s\n" : "%s ", w);
    }
    *b = buf;
    *n = strlen(buf);
}

static void print_token(const gen_io *io, int32_t id)
{
    char buf[24];
    const char *b;
    size_t n;
    token_text(io, id, buf, &b, &n);
    fwrite(b, 1, n, stdout);
    fflush(stdout);
}

static void on_step(void *ctx, int64_t step, const int32_t *tokens, int64_t batch)
{
    const gen_io *io = ctx;
    if (io->stream) print_token(io, tokens[0]);
}

/* Append bytes as valid UTF-8 (an invalid sequence becomes U+FFFD) for a JSON string. */
static void utf8_append(char *dst, size_t *len, const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = k > 0 && i + k <= n;
        for (size_t j = 1; ok && j < k; j++)
            ok = (s[i + j] & 0xC0) == 0x80;
        if (ok && k == 2) ok = c >= 0xC2;
        if (ok && k == 3) {
            unsigned cp = ((c & 15u) << 12) | ((s[i + 1] & 63u) << 6) | (s[i + 2] & 63u);
            ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
        }
        if (ok && k == 4) {
            unsigned cp = ((c & 7u) << 18) | ((s[i + 1] & 63u) << 12);
            ok = cp >= 0x10000 && cp <= 0x10FFFF;
        }
        if (ok && c != 0) {
            memcpy(dst + *len, s + i, k);
            *len += k;
            i += k;
        } else {
            memcpy(dst + *len, "\xEF\xBF\xBD", 3);
            *len += 3;
            i++;
        }
    }
}

int cmd_generate(int argc, char **argv)
{
    const char *ckpt = NULL, *prompt = NULL, *prompt_ids = NULL;
    long long ntok = 64, topk = 40, seed = 1, threads = 0;
    double temp = 0.8, topp = 1.0;
    bool json = false, ignore_eos = false, no_cache = false;
    ct_device_options dopt = ct_device_options_default();
    ct_device *dev = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--greedy"))
            temp = 0;
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--ignore-eos"))
            ignore_eos = true;
        else if (!strcmp(argv[i], "--no-cache"))
            no_cache = true;
        else if (cli_opt(argc, argv, &i, "--checkpoint", &v) || cli_opt(argc, argv, &i, "--model", &v))
            ckpt = v;
        else if (cli_opt(argc, argv, &i, "--prompt", &v))
            prompt = v;
        else if (cli_opt(argc, argv, &i, "--prompt-ids", &v))
            prompt_ids = v;
        else if (cli_opt(argc, argv, &i, "--tokens", &v) ||
                 cli_opt(argc, argv, &i, "--max-new-tokens", &v)) {
            if (!cli_int(argv[i - 1], v, 0, 1 << 20, &ntok)) return 2;
        } else if (cli_opt(argc, argv, &i, "--top-k", &v)) {
            if (!cli_int("--top-k", v, 0, 1 << 30, &topk)) return 2;
        } else if (cli_opt(argc, argv, &i, "--seed", &v)) {
            if (!cli_int("--seed", v, 0, LLONG_MAX, &seed)) return 2;
        } else if (cli_opt(argc, argv, &i, "--threads", &v)) {
            if (!cli_int("--threads", v, 1, 256, &threads)) return 2;
        } else if (cli_opt(argc, argv, &i, "--device", &v)) {
            if (ct_device_parse(v, &dopt) != CT_OK) {
                fprintf(stderr, "ctorch generate: --device: %s\n", ct_last_error());
                return 2;
            }
        } else if (cli_opt(argc, argv, &i, "--temperature", &v)) {
            if (!cli_float("--temperature", v, &temp)) return 2;
            if (!(temp >= 0 && temp <= 100)) {
                fprintf(stderr, "ctorch: --temperature must be in [0, 100], got %s\n", v);
                return 2;
            }
        } else if (cli_opt(argc, argv, &i, "--top-p", &v)) {
            if (!cli_float("--top-p", v, &topp)) return 2;
            if (!(topp >= 0 && topp <= 1)) {
                fprintf(stderr, "ctorch: --top-p must be in [0, 1], got %s\n", v);
                return 2;
            }
        } else {
            fprintf(stderr,
                    "ctorch generate: unknown option '%s' (ctorch generate --help lists them)\n",
                    argv[i]);
            return 2;
        }
    }
    if (!ckpt) {
        fprintf(stderr, "ctorch generate: --model FILE (or --checkpoint FILE) is required\n");
        return 2;
    }
    if (prompt && prompt_ids) {
        fprintf(stderr, "ctorch generate: give --prompt or --prompt-ids, not both\n");
        return 2;
    }
    if (!prompt) prompt = "";
    if (threads) ct_set_num_threads((int)threads);
    ct_tensor_file *f = NULL;
    ct_hf_model *hf = NULL;
    ct_gpt_config cfg;
    ct_gpt *m = NULL;
    ct_tokenizer *tok = NULL;
    int32_t *ids = NULL, *out = NULL, eos = -1, bos = -1;
    bool hf_model = false; /* a HF directory, or a checkpoint converted from one (hf_config) */
    bool pt = false;       /* a PyTorch state dict with a configuration (model_pt.c) */
    int64_t n = 0;
    int rc = 0;
    char *tpath = NULL;
    struct stat sb;
    ct_status s;
    if (stat(ckpt, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        /* a Hugging Face directory: config.json and the weights, checked when opened */
        if ((s = ct_hf_open(ckpt, &hf))) return cli_fail("generate: --model", s);
        cfg = *ct_hf_get_config(hf);
        eos = ct_hf_get_info(hf)->eos_token;
        bos = ct_hf_get_info(hf)->bos_token;
        hf_model = true;
        size_t tl = strlen(ckpt) + sizeof "/tokenizer.json";
        tpath = malloc(tl);
        if (!tpath) {
            rc = cli_fail("generate", CT_ENOMEM);
            goto done;
        }
        snprintf(tpath, tl, "%s/tokenizer.json", ckpt);
        if (stat(tpath, &sb) == 0 && (s = ct_tokenizer_load(ckpt, &tok))) {
            if (!prompt_ids && *prompt) {
                rc = cli_fail("generate: the directory's tokenizer.json", s);
                goto done;
            }
            /* ids in, ids out: the weights do not need the tokenizer */
            fprintf(stderr, "ctorch generate: warning: %s: %s: %s; writing token ids\n", tpath,
                    ct_status_name(s), ct_last_error());
            tok = NULL;
        }
        if (!tok && !prompt_ids && *prompt) {
            fprintf(stderr, "ctorch generate: %s has no tokenizer.json: give the prompt as "
                            "--prompt-ids\n", ckpt);
            rc = 2;
            goto done;
        }
        if (eos < 0 && tok) eos = ct_tokenizer_eos(tok);
    } else {
        if ((s = ct_load(ckpt, NULL, &f))) return cli_fail("generate: --model", s);
        const char *fmt = ct_tensor_file_metadata_get(f, "format");
        pt = !fmt || strcmp(fmt, "ctorch-gpt") != 0;
    }
    if (pt) {
        /* a PyTorch state dict: the configuration in the file or config.json beside it, the
         * tokenizer.json beside it when there is one; ids in and out otherwise */
        ct_hf_info pi;
        if ((rc = cli_pt_model_config(ckpt, f, &cfg, &pi, NULL))) goto done;
        hf_model = true;
        bos = pi.bos_token;
        eos = pi.eos_token;
        const char *sl = strrchr(ckpt, '/');
        size_t dl = sl ? (size_t)(sl - ckpt) : 1;
        size_t tl = dl + sizeof "/tokenizer.json";
        if (!(tpath = malloc(tl))) {
            rc = cli_fail("generate", CT_ENOMEM);
            goto done;
        }
        snprintf(tpath, tl, "%.*s/tokenizer.json", (int)dl, sl ? ckpt : ".");
        if (stat(tpath, &sb) == 0 && (s = ct_tokenizer_load(tpath, &tok))) {
            rc = cli_fail("generate: the tokenizer.json beside the model", s);
            goto done;
        }
        if (eos < 0 && tok) eos = ct_tokenizer_eos(tok);
        if (!tok && !prompt_ids && *prompt) {
            fprintf(stderr, "ctorch generate: %s has no tokenizer.json beside it: give the prompt "
                            "as --prompt-ids\n", ckpt);
            rc = 2;
            goto done;
        }
    } else if (!hf) {
        /* config + every tensor's shape and dtype, checked before the model is allocated */
        if ((s = ct_gpt_checkpoint_check(f, false, &cfg))) {
            rc = cli_fail("generate", s);
            goto done;
        }
        const char *tj = ct_tensor_file_metadata_get(f, "tokenizer");
        if (tj && (s = ct_tokenizer_from_json(tj, strlen(tj), &tok))) {
            rc = cli_fail("generate: the checkpoint's tokenizer", s);
            goto done;
        }
        /* a checkpoint converted from a HF directory (ctorch convert) keeps its config.json:
         * the model's BOS / EOS ids, and ids in and out without a tokenizer */
        const char *hc = ct_tensor_file_metadata_get(f, "hf_config");
        ct_gpt_config hcfg;
        ct_hf_info hi;
        if (hc && ct_hf_config_parse(hc, strlen(hc), &hcfg, &hi) == CT_OK) {
            hf_model = true;
            bos = hi.bos_token;
            eos = hi.eos_token >= 0 ? hi.eos_token : tok ? ct_tokenizer_eos(tok) : -1;
        } else {
            eos = tok ? ct_tokenizer_eos(tok) : 0; /* the corpus's '.' ends a document */
        }
        if (hf_model && !tok && !prompt_ids && *prompt) {
            fprintf(stderr, "ctorch generate: %s carries no tokenizer: give the prompt as "
                            "--prompt-ids\n", ckpt);
            rc = 2;
            goto done;
        }
    }
    gen_io io = {tok, hf_model && !tok, !json};
    /* the prompt as tokens: ids, through the tokenizer, or as corpus words */
    size_t plen = strlen(prompt_ids ? prompt_ids : prompt);
    int64_t cap = (int64_t)plen + 2;
    ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) {
        rc = cli_fail("generate", CT_ENOMEM);
        goto done;
    }
    if (prompt_ids || tok) {
        int32_t *p = NULL;
        int64_t np = 0;
        if (prompt_ids && (s = ct_token_ids_parse(prompt_ids, plen, cfg.vocab_size, &p, &np))) {
            fprintf(stderr, "ctorch generate: --prompt-ids: %s\n", ct_last_error());
            rc = 2;
            goto done;
        }
        if (!prompt_ids && (s = ct_tokenizer_encode(tok, prompt, plen, &p, &np))) {
            rc = cli_fail("generate: --prompt", s);
            goto done;
        }
        if (np > cap) {
            int32_t *bigger = realloc(ids, (size_t)np * sizeof *ids);
            if (!bigger) {
                ct_free(p);
                rc = cli_fail("generate", CT_ENOMEM);
                goto done;
            }
            ids = bigger;
        }
        if (np) memcpy(ids, p, (size_t)np * sizeof *ids); /* none: p may be NULL */
        n = np;
        ct_free(p);
        for (int64_t i = 0; i < n; i++)
            if (ids[i] >= cfg.vocab_size) {
                fprintf(stderr,
                        "ctorch generate: --prompt token %d is outside the model's vocabulary\n",
                        ids[i]);
                rc = 1;
                goto done;
            }
    } else if (!hf_model) {
        char *copy = strdup(prompt), *save = NULL;
        for (char *w = strtok_r(copy, " \t\n", &save); w; w = strtok_r(NULL, " \t\n", &save)) {
            if ((s = ct_corpus_token_parse(w, &ids[n]))) {
                free(copy);
                rc = cli_fail("generate: --prompt", s);
                goto done;
            }
            if (ids[n] >= cfg.vocab_size) {
                fprintf(stderr,
                        "ctorch generate: --prompt word '%s' is token %d, outside the model's "
                        "vocabulary\n",
                        w, ids[n]);
                free(copy);
                rc = 1;
                goto done;
            }
            n++;
        }
        free(copy);
    }
    if (eos >= cfg.vocab_size) eos = -1;
    if (n == 0 && bos >= 0 && bos < cfg.vocab_size) {
        ids[n++] = bos; /* an empty prompt starts from the model's BOS */
    } else if (n == 0) {
        if (eos < 0) {
            fprintf(stderr, "ctorch generate: the prompt is empty and the model has no EOS token "
                            "to start from\n");
            rc = 1;
            goto done;
        }
        ids[n++] = eos; /* an empty prompt starts a document */
    } else if (!json) {
        for (int64_t i = 0; i < n; i++)
            print_token(&io, ids[i]);
    }
    ct_gpt_options mo = ct_gpt_options_default();
    mo.batch = 1;
    /* activations (the baseline's) for the longest window this run feeds, not the whole
     * context; the cache is sized the same way */
    int64_t longest = n + ntok;
    mo.seq = longest < cfg.context ? longest : cfg.context;
    const char *tr = f ? ct_tensor_file_metadata_get(f, "train") : NULL;
    ct_train_options to = ct_train_options_default();
    if (tr && ct_train_options_from_json(tr, &to) == CT_OK) mo.eos_token = to.eos_token;
    if (dopt.kind != CT_DEVICE_CPU) { /* a GPU: FlexAttention (built-in masks, compiled mods), no KV cache */
        if (hf) {
            fprintf(stderr, "ctorch generate: --device: a Hugging Face directory is read in place "
                            "on the CPU; convert it to a checkpoint for a GPU\n");
            rc = 1;
            goto done;
        }
        if ((s = ct_device_open(&dopt, &dev))) {
            rc = cli_fail("generate: --device", s);
            goto done;
        }
        mo.device = dev;
        no_cache = true; /* the sequence recomputed for each token (the model's own forward) */
    }
    /* a directory's weights are read in place from the mapped files, in their dtype (no
     * copy, no parameter arrays) */
    if ((s = hf ? ct_hf_map_model(hf, &mo, &m, NULL) : ct_gpt_create(&cfg, &mo, &m)) ||
        (!pt && !hf && (s = ct_gpt_load_params(m, f)))) {
        rc = cli_fail("generate", s);
        goto done;
    }
    if (pt && (rc = cli_pt_model_load(ckpt, f, m))) goto done;
    out = malloc((size_t)(n + ntok) * sizeof *out);
    if (!out) {
        rc = cli_fail("generate", CT_ENOMEM);
        goto done;
    }
    ct_generate_options go = ct_generate_options_default();
    go.max_new_tokens = ntok;
    go.sample.temperature = (float)temp;
    go.sample.top_k = topk;
    go.sample.top_p = (float)topp;
    go.seed = (uint64_t)seed;
    go.eos_token = ignore_eos ? -1 : eos;
    go.no_cache = no_cache;
    go.on_step = on_step;
    go.ctx = &io;
    int64_t nnew = 0;
    ct_generate_stats st;
    if ((s = ct_gpt_generate(m, ids, 1, n, &go, out, &nnew, &st))) {
        if (!json) printf("\n");
        rc = cli_fail("generate", s);
        goto done;
    }
    double ptps = st.prompt_seconds > 0 ? (double)st.prompt_tokens / st.prompt_seconds : 0;
    double dtps = st.decode_seconds > 0 ? (double)(st.new_tokens - 1) / st.decode_seconds : 0;
    if (json) {
        json_t *pi = json_array(), *ni = json_array();
        size_t tbytes = 0;
        for (int64_t i = 0; i < n; i++)
            json_array_append_new(pi, json_integer(ids[i]));
        for (int64_t i = 0; i < nnew; i++) {
            json_array_append_new(ni, json_integer(out[n + i]));
            char buf[24];
            const char *b;
            size_t k;
            token_text(&io, out[n + i], buf, &b, &k);
            tbytes += k;
        }
        char *text = malloc(3 * tbytes + 1);
        size_t tl = 0;
        for (int64_t i = 0; text && i < nnew; i++) {
            char buf[24];
            const char *b;
            size_t k;
            token_text(&io, out[n + i], buf, &b, &k);
            utf8_append(text, &tl, (const unsigned char *)b, k);
        }
        json_t *j = json_pack("{s:o, s:o, s:s%, s:f, s:f}", "prompt_ids", pi, "new_ids", ni,
                              "text", text ? text : "", text ? tl : (size_t)0, "prompt_tok_s", ptps,
                              "decode_tok_s", dtps);
        char *line = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (line) printf("%s\n", line);
        else rc = cli_fail("generate: --json", CT_ENOMEM);
        free(line);
        free(text);
        json_decref(j);
    } else {
        printf("\n");
        fprintf(stderr,
                "ctorch generate: prompt %lld tokens, %.1f tok/s; decode %lld tokens, %.1f tok/s "
                "(%s)\n",
                (long long)st.prompt_tokens, ptps, (long long)st.new_tokens, dtps,
                no_cache ? "no cache" : "KV cache");
    }
done:
    free(ids);
    free(out);
    ct_gpt_free(m);
    ct_tokenizer_free(tok);
    ct_tensor_file_close(f);
    ct_hf_close(hf); /* after the model: its weights may point into the mapped files */
    if (dev) (void)ct_device_close(dev);
    free(tpath);
    return rc;
}
