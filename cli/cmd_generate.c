/* ctorch generate: sample text from a checkpoint written by ctorch train. */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: ctorch generate --checkpoint FILE [--prompt TEXT] [--tokens N] [--temperature T]\n"
        "                       [--top-k K] [--seed S] [--threads N]\n"
        "Continue PROMPT with N sampled tokens (default 64) from a model trained by `ctorch "
        "train`.\n"
        "A text model (--data) reads and writes text through the tokenizer stored in the "
        "checkpoint;\n"
        "a built-in corpus model reads and writes its words (\"tobeka\", '.' ends a document).\n"
        "  --temperature T   divide the logits by T before sampling (default 0.8; 0: greedy)\n"
        "  --top-k K         sample among the K most likely tokens only (default 40; 0: all)\n"
        "  --seed S          sampling seed (default 1): the same seed gives the same text\n"
        "Exit status: 0 done, 1 a failure (the message says what), 2 a bad option.\n");
}

/* Sample from logits[V] with temperature and top-k (sorted descending by ct_topk_rows). */
static int32_t sample(const float *logits, int64_t V, double temp, int64_t k, float *vals,
                      int64_t *idx, ct_rng *rng)
{
    if (temp <= 0) {
        int64_t best;
        ct_argmax_rows(&best, logits, 1, V);
        return (int32_t)best;
    }
    if (k <= 0 || k > V) k = V;
    ct_topk_rows(vals, idx, logits, 1, V, k, true, true);
    double mx = vals[0], sum = 0;
    for (int64_t i = 0; i < k; i++)
        sum += exp((vals[i] - mx) / temp);
    double u = ct_rng_uniform(rng) * sum, acc = 0;
    for (int64_t i = 0; i < k; i++) {
        acc += exp((vals[i] - mx) / temp);
        if (u < acc) return (int32_t)idx[i];
    }
    return (int32_t)idx[k - 1];
}

static void print_token(const ct_tokenizer *tok, int32_t id)
{
    if (tok) {
        const char *b;
        size_t n;
        if (ct_tokenizer_token_bytes(tok, id, &b, &n) == CT_OK) fwrite(b, 1, n, stdout);
    } else {
        char w[16];
        ct_corpus_token_text(id, w);
        printf(id == 0 ? "%s\n" : "%s ", w);
    }
    fflush(stdout);
}

int cmd_generate(int argc, char **argv)
{
    const char *ckpt = NULL, *prompt = "";
    long long ntok = 64, topk = 40, seed = 1, threads = 0;
    double temp = 0.8;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--checkpoint", &v))
            ckpt = v;
        else if (cli_opt(argc, argv, &i, "--prompt", &v))
            prompt = v;
        else if (cli_opt(argc, argv, &i, "--tokens", &v)) {
            if (!cli_int("--tokens", v, 0, 1 << 20, &ntok)) return 2;
        } else if (cli_opt(argc, argv, &i, "--top-k", &v)) {
            if (!cli_int("--top-k", v, 0, 1 << 30, &topk)) return 2;
        } else if (cli_opt(argc, argv, &i, "--seed", &v)) {
            if (!cli_int("--seed", v, 0, LLONG_MAX, &seed)) return 2;
        } else if (cli_opt(argc, argv, &i, "--threads", &v)) {
            if (!cli_int("--threads", v, 1, 256, &threads)) return 2;
        } else if (cli_opt(argc, argv, &i, "--temperature", &v)) {
            if (!cli_float("--temperature", v, &temp)) return 2;
            if (!(temp >= 0 && temp <= 100)) {
                fprintf(stderr, "ctorch: --temperature must be in [0, 100], got %s\n", v);
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
        fprintf(stderr, "ctorch generate: --checkpoint FILE is required\n");
        return 2;
    }
    if (threads) ct_set_num_threads((int)threads);
    ct_tensor_file *f;
    ct_status s = ct_load(ckpt, NULL, &f);
    if (s) return cli_fail("generate: --checkpoint", s);
    ct_gpt_config cfg;
    ct_gpt *m = NULL;
    ct_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    float *logits = NULL, *vals = NULL;
    int64_t *idx = NULL;
    int rc = 0;
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
    ct_gpt_options mo = ct_gpt_options_default();
    mo.batch = 1;
    /* activations for the longest window this run can feed (prompt bytes + tokens), not for
     * the whole context: a deep model with a long context stays small here */
    int64_t longest = (int64_t)strlen(prompt) + ntok + 2;
    mo.seq = longest < cfg.context ? longest : cfg.context;
    const char *tr = ct_tensor_file_metadata_get(f, "train");
    ct_train_options to = ct_train_options_default();
    if (tr && ct_train_options_from_json(tr, &to) == CT_OK) mo.eos_token = to.eos_token;
    if ((s = ct_gpt_create(&cfg, &mo, &m)) || (s = ct_gpt_load_params(m, f))) {
        rc = cli_fail("generate", s);
        goto done;
    }
    /* the prompt as tokens: through the tokenizer, or as corpus words */
    int64_t cap = (int64_t)strlen(prompt) + ntok + 2;
    ids = malloc((size_t)cap * sizeof *ids);
    if (tok) {
        int32_t *p;
        int64_t np;
        if ((s = ct_tokenizer_encode(tok, prompt, strlen(prompt), &p, &np))) {
            rc = cli_fail("generate: --prompt", s);
            goto done;
        }
        memcpy(ids, p, (size_t)np * sizeof *ids);
        n = np;
        ct_free(p);
    } else {
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
    if (n == 0)
        ids[n++] = tok ? ct_tokenizer_eos(tok) : 0; /* an empty prompt starts a document */
    else
        for (int64_t i = 0; i < n; i++)
            print_token(tok, ids[i]);
    logits = malloc((size_t)cfg.vocab_size * sizeof *logits);
    vals = malloc((size_t)cfg.vocab_size * sizeof *vals);
    idx = malloc((size_t)cfg.vocab_size * sizeof *idx);
    ct_rng rng;
    ct_rng_seed(&rng, (uint64_t)seed);
    for (long long k = 0; k < ntok; k++) {
        int64_t T = n < cfg.context ? n : cfg.context;
        if ((s = ct_gpt_next_logits(m, ids + n - T, T, logits))) {
            rc = cli_fail("generate", s);
            goto done;
        }
        int32_t next = sample(logits, cfg.vocab_size, temp, topk, vals, idx, &rng);
        ids[n++] = next;
        print_token(tok, next);
    }
    printf("\n");
done:
    free(ids);
    free(logits);
    free(vals);
    free(idx);
    ct_gpt_free(m);
    ct_tokenizer_free(tok);
    ct_tensor_file_close(f);
    return rc;
}
