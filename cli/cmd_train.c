/* ctorch train: a small GPT trained end to end on the built-in corpus (entropy known) or on
 * a text file (byte-level BPE), with a progress line, a JSON-lines metrics log, checkpoints
 * that resume exactly, held-out evaluation and a loss-curve SVG. */
#include "cli.h"
#include "core/internal.h" /* ct_file_*: the one way files are read */

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    ct_gpt_config c = ct_gpt_config_default();
    ct_train_options t = ct_train_options_default();
    ct_corpus_options co = ct_corpus_options_default();
    fprintf(
        f,
        "usage: ctorch train [options]\n"
        "Train a small GPT. By default on the built-in corpus (documents of a sentence from a\n"
        "class-based Markov source, written R times): its entropy rate (the floor of any model's\n"
        "loss) and unigram entropy are computed exactly and printed beside the held-out loss\n"
        "(docs/train.md). With --data on any UTF-8 text, through a byte-level BPE tokenizer.\n"
        "\ndata:\n"
        "  --corpus-seed N      built-in corpus seed (%llu)\n"
        "  --vocab V            built-in vocabulary incl. EOS (%lld); with --data: the BPE "
        "vocabulary\n"
        "                       when the tokenizer is trained here (4096)\n"
        "  --classes C          built-in word classes (%lld)\n"
        "  --zipf S             built-in Zipf exponent inside a class (%g)\n"
        "  --sentence N         built-in words per sentence (%lld)\n"
        "  --repeats R          built-in copies of the sentence per document (%lld)\n"
        "  --data FILE          train on a UTF-8 text file (last --eval-fraction held out)\n"
        "  --tokenizer FILE     BPE tokenizer for --data (from `ctorch tokenizer train`); without "
        "it\n"
        "                       one is trained on FILE and saved as OUT/tokenizer.json\n"
        "  --eval-fraction F    held-out share of --data (0.05)\n"
        "  --no-doc-mask        let attention cross document (EOS) boundaries\n"
        "\nfine-tuning (docs/models.md):\n"
        "  --init-from DIR|FILE start from a Hugging Face Llama-family directory or a ctorch\n"
        "                       checkpoint (its weights; fresh optimizer): the model comes from\n"
        "                       it (no model options), --data is tokenized with its tokenizer\n"
        "                       (DIR/tokenizer.json, the checkpoint's, or --tokenizer); OUT gets\n"
        "                       the layout it came from (config.json + model.safetensors or the\n"
        "                       same shards) besides checkpoint.safetensors (exact --resume)\n"
        "  --lora-rank R        train only LoRA adapters of rank R; OUT gets PEFT's\n"
        "                       adapter_config.json + adapter_model.safetensors\n"
        "  --lora-alpha A       LoRA alpha (8; the update is scaled by A / R)\n"
        "  --lora-targets LIST  comma-separated q,k,v,o,gate,up,down (q,v)\n"
        "\nmodel (or --config FILE.json with the keys of the checkpoint's \"config\"):\n"
        "  --layers N (%lld)  --d-model C (%lld)  --heads H (%lld)  --kv-heads K (%lld)  --ffn F "
        "(%lld)\n"
        "  --context T (%lld)  --window W (0: full causal)  --rope-base B (%g)  --untied\n"
        "  --init-std X (1 / sqrt(d_model))\n"
        "  --score-mod EXPR     compiled score_mod, e.g. 'score + 0.05 * (kv - q)' (docs/compile.md)\n"
        "  --mask-mod EXPR      compiled mask_mod ANDed with causal (and the document mask), e.g.\n"
        "                       'q - kv <= 64 || kv < 4'; exclusive with --window\n"
        "\ntraining:\n"
        "  --steps N (%lld)  --batch B (%lld)  --seq T (context)  --accum K (%lld)  --seed S "
        "(%llu)\n"
        "  --lr X (%g)  --min-lr X (%g)  --warmup N (%lld)  --weight-decay X (%g)  --clip X (%g)\n"
        "  --z-loss X (0)  --label-smoothing X (0)  --unfused-head  --dense-attention\n"
        "  --eval-every N (steps / 5)  --eval-batches N (%lld)  --threads N\n"
        "  --dtype f32|bf16     operand dtype of the matrix products (f32): bf16 rounds the\n"
        "                       weights' copies and the activations entering each GEMM to bf16\n"
        "                       (PyTorch's CPU autocast for linear / matmul), accumulating in\n"
        "                       f32; master weights, gradients, AdamW state and checkpoints stay\n"
        "                       f32, and --resume keeps the checkpoint's dtype (with --fsdp /\n"
        "                       --dp too: each rank rounds the weights it gathers or holds)\n"
        "\nruns:\n"
        "  --out DIR            where checkpoint.safetensors, metrics.jsonl, loss.svg go "
        "(ctorch-run)\n"
        "  --save-every N       checkpoint every N steps (and at the end; 0: only at the end)\n"
        "  --resume [FILE]      continue exactly from FILE (default OUT/checkpoint.safetensors):\n"
        "                       model, data and training settings come from the checkpoint\n"
        "  --overwrite          replace an earlier run in OUT (its checkpoint, sharded\n"
        "                       checkpoint-<step>/ folders, latest, metrics, plot); without it\n"
        "                       a fresh run refuses an OUT that holds one\n"
        "  --stop-at N          end this run after step N (the schedule still spans --steps)\n"
        "  --log-every N        progress lines when stderr is not a terminal (steps / 20)\n"
        "  --quiet              no progress line\n"
        "  --device D           cpu (default), cuda or cuda:N (libctorch_cuda.so, docs/cuda.md):\n"
        "                       on a GPU FlexAttention takes causal, --window, the document\n"
        "                       mask and compiled --score-mod / --mask-mod, dense attention\n"
        "                       is causal only; not a training setting: --resume may change it\n"
        "  --dump-grads FILE    write the weights (initial, or the --resume checkpoint's), the "
        "loss\n"
        "                       and every gradient of the first micro-batch to FILE (safetensors)\n"
        "                       and exit: for checking against PyTorch\n"
        "\nacross processes (docs/fsdp.md; not training settings: --resume accepts new values):\n"
        "  --fsdp | --dp        sharded (FSDP2-style) or data-parallel training; the ranks come\n"
        "                       from the environment (ctorch launch, mpiexec) or --nproc\n"
        "  --nproc N            start N local ranks through the launcher (--batch stays global)\n"
        "  --backend tcp|mpi    communication backend (tcp)\n"
        "  --elastic            survive the death of a rank: shrink and continue with N-1 (tcp)\n"
        "  --prefetch N         all-gathers issued ahead, forward and backward (1)\n"
        "  --param-dtype bf16   all-gather dtype (f32; --fsdp only; compute follows --dtype)\n"
        "  --no-overlap         wait for every collective at once (the serialized baseline)\n"
        "  --no-separate-rs     reduce-scatters share the all-gather communicator\n"
        "  --no-reshard         keep every block gathered after its forward\n"
        "\nExit status: 0 done, 1 a failure (the message says what), 2 a bad option.\n",
        (unsigned long long)co.seed, (long long)co.vocab_size, (long long)co.classes, co.zipf,
        (long long)co.sentence, (long long)co.repeats, (long long)c.n_layer, (long long)c.d_model,
        (long long)c.n_head, (long long)c.n_kv_head, (long long)c.d_ff, (long long)c.context,
        c.rope_base, (long long)t.steps, (long long)t.batch, (long long)t.accum,
        (unsigned long long)t.seed, t.lr, t.min_lr, (long long)t.warmup, t.weight_decay, t.clip,
        (long long)t.eval_batches);
}

typedef struct run {
    ct_gpt_config cfg;
    ct_train_options to;
    ct_corpus_options co;
    const char *data_path, *tok_path, *out, *resume, *dump, *config_path;
    const char *init_from;  /* --init-from: a HF directory or a ctorch checkpoint */
    const char *model_flag; /* first model option given (refused with --init-from) */
    ct_hf_model *hf;        /* the --init-from directory (kept open for saving its layout) */
    bool lora_on;
    ct_lora_options lora;
    long long text_vocab, stop_at, eval_every, save_every, log_every, threads;
    double eval_fraction;
    bool quiet, no_doc_mask, resuming;
    bool overwrite; /* --overwrite: replace an earlier run in OUT (not a training setting) */
    const char *device; /* --device (not a training setting) */
    ct_device *dev;
    /* across processes (not training settings) */
    long long nproc, prefetch;
    bool dist, elastic, no_overlap, no_separate_rs, no_reshard, bf16;
    ct_fsdp_mode mode;
    const char *backend;
    int rank, world;
    const char *settings_flag; /* first model/data/training option given (refused with --resume) */
    /* data */
    bool builtin;
    int32_t *train, *eval;
    int64_t n_train, n_eval;
    ct_corpus *corpus;
    ct_corpus_entropy ent;
    ct_tokenizer *tok;
    char *data_json, *tok_json;
    char ckpt[4096], metrics[4096], svg[4096];
} run;

/* ---- option parsing ------------------------------------------------------------------------ */

static bool int_opt(int argc, char **argv, int *i, const char *name, long long lo, long long hi,
                    long long *out, bool *bad)
{
    const char *v;
    if (!cli_opt(argc, argv, i, name, &v)) return false;
    if (!cli_int(name, v, lo, hi, out)) *bad = true;
    return true;
}

static bool float_opt(int argc, char **argv, int *i, const char *name, double lo, double hi,
                      double *out, bool *bad)
{
    const char *v;
    if (!cli_opt(argc, argv, i, name, &v)) return false;
    if (!cli_float(name, v, out)) {
        *bad = true;
    } else if (!(*out >= lo && *out <= hi)) {
        fprintf(stderr, "ctorch: %s must be in [%g, %g], got %s\n", name, lo, hi, v);
        *bad = true;
    }
    return true;
}

/* Parse argv into r; returns 0, or the exit status (2) of a bad option, or -1 for --help. */
static int parse(run *r, int argc, char **argv)
{
    r->cfg = ct_gpt_config_default();
    r->to = ct_train_options_default();
    r->co = ct_corpus_options_default();
    r->out = "ctorch-run";
    r->text_vocab = 4096;
    r->eval_fraction = 0.05;
    r->eval_every = -1;
    r->save_every = 0;
    r->log_every = -1;
    r->prefetch = 1;
    r->lora = ct_lora_options_default();
    bool bad = false;
    ct_gpt_config *c = &r->cfg;
    ct_train_options *t = &r->to;
    for (int i = 1; i < argc && !bad; i++) {
        long long x;
        double d;
        const char *v, *a = argv[i];
        bool setting = true; /* a model, data or training setting */
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return -1;
        static const char *model_opts[] = {"--config", "--layers", "--d-model", "--heads",
                                           "--kv-heads", "--ffn",  "--context", "--window",
                                           "--rope-base", "--untied", "--init-std", "--vocab",
                                           "--score-mod", "--mask-mod"};
        for (size_t k = 0; k < sizeof model_opts / sizeof model_opts[0] && !r->model_flag; k++)
            if (!strcmp(a, model_opts[k])) r->model_flag = a;
        if (int_opt(argc, argv, &i, "--corpus-seed", 0, LLONG_MAX, &x, &bad))
            r->co.seed = (uint64_t)x;
        else if (int_opt(argc, argv, &i, "--vocab", 2, 1 << 20, &x, &bad))
            r->co.vocab_size = r->text_vocab = x;
        else if (int_opt(argc, argv, &i, "--classes", 1, 1 << 16, &x, &bad))
            r->co.classes = x;
        else if (float_opt(argc, argv, &i, "--zipf", 0, 16, &r->co.zipf, &bad)) {
        } else if (int_opt(argc, argv, &i, "--sentence", 1, 1 << 20, &x, &bad))
            r->co.sentence = x;
        else if (int_opt(argc, argv, &i, "--repeats", 1, 1 << 20, &x, &bad))
            r->co.repeats = x;
        else if (cli_opt(argc, argv, &i, "--data", &v))
            r->data_path = v;
        else if (cli_opt(argc, argv, &i, "--tokenizer", &v))
            r->tok_path = v;
        else if (cli_opt(argc, argv, &i, "--init-from", &v))
            r->init_from = v;
        else if (int_opt(argc, argv, &i, "--lora-rank", 1, 4096, &x, &bad))
            r->lora.rank = x, r->lora_on = true;
        else if (float_opt(argc, argv, &i, "--lora-alpha", 1e-6, 1e6, &d, &bad))
            r->lora.alpha = (float)d;
        else if (cli_opt(argc, argv, &i, "--lora-targets", &v)) {
            ct_status ls = ct_lora_targets_parse(v, &r->lora.targets);
            if (ls) {
                fprintf(stderr, "ctorch: --lora-targets: %s\n", ct_last_error());
                bad = true;
            }
        }
        else if (float_opt(argc, argv, &i, "--eval-fraction", 0.001, 0.5, &r->eval_fraction,
                           &bad)) {
        } else if (!strcmp(a, "--no-doc-mask"))
            r->no_doc_mask = true;
        else if (cli_opt(argc, argv, &i, "--config", &v))
            r->config_path = v;
        else if (int_opt(argc, argv, &i, "--layers", 1, 1024, &x, &bad))
            c->n_layer = x;
        else if (int_opt(argc, argv, &i, "--d-model", 2, 65536, &x, &bad))
            c->d_model = x;
        else if (int_opt(argc, argv, &i, "--heads", 1, 1024, &x, &bad))
            c->n_head = x;
        else if (int_opt(argc, argv, &i, "--kv-heads", 1, 1024, &x, &bad))
            c->n_kv_head = x;
        else if (int_opt(argc, argv, &i, "--ffn", 1, 1 << 20, &x, &bad))
            c->d_ff = x;
        else if (int_opt(argc, argv, &i, "--context", 1, 1 << 20, &x, &bad))
            c->context = x;
        else if (int_opt(argc, argv, &i, "--window", 0, 1 << 20, &x, &bad))
            c->window = x;
        else if (cli_opt(argc, argv, &i, "--score-mod", &v) || cli_opt(argc, argv, &i, "--mask-mod", &v)) {
            char *dst = !strcmp(a, "--score-mod") ? c->score_mod : c->mask_mod;
            if (strlen(v) >= CT_GPT_MOD_MAX || !v[0]) {
                fprintf(stderr, "ctorch train: %s needs an expression of 1 .. %d bytes\n", a,
                        CT_GPT_MOD_MAX - 1);
                return 2;
            }
            memcpy(dst, v, strlen(v) + 1);
        }
        else if (float_opt(argc, argv, &i, "--rope-base", 1e-3, 1e12, &d, &bad))
            c->rope_base = (float)d;
        else if (!strcmp(a, "--untied"))
            c->tied = false;
        else if (float_opt(argc, argv, &i, "--init-std", 0, 10, &d, &bad))
            c->init_std = (float)d;
        else if (int_opt(argc, argv, &i, "--steps", 1, 1LL << 40, &x, &bad))
            t->steps = x;
        else if (int_opt(argc, argv, &i, "--batch", 1, 1 << 20, &x, &bad))
            t->batch = x;
        else if (int_opt(argc, argv, &i, "--seq", 1, 1 << 20, &x, &bad))
            t->seq = x;
        else if (int_opt(argc, argv, &i, "--accum", 1, 1 << 20, &x, &bad))
            t->accum = x;
        else if (int_opt(argc, argv, &i, "--seed", 0, LLONG_MAX, &x, &bad))
            t->seed = (uint64_t)x;
        else if (float_opt(argc, argv, &i, "--lr", 0, 10, &d, &bad))
            t->lr = (float)d;
        else if (float_opt(argc, argv, &i, "--min-lr", 0, 10, &d, &bad))
            t->min_lr = (float)d;
        else if (int_opt(argc, argv, &i, "--warmup", 0, 1LL << 40, &x, &bad))
            t->warmup = x;
        else if (float_opt(argc, argv, &i, "--weight-decay", 0, 10, &d, &bad))
            t->weight_decay = (float)d;
        else if (float_opt(argc, argv, &i, "--clip", 0, 1e9, &d, &bad))
            t->clip = (float)d;
        else if (float_opt(argc, argv, &i, "--z-loss", 0, 1, &d, &bad))
            t->z_loss = (float)d;
        else if (float_opt(argc, argv, &i, "--label-smoothing", 0, 1, &d, &bad))
            t->label_smoothing = (float)d;
        else if (!strcmp(a, "--unfused-head"))
            t->fused_head = false;
        else if (!strcmp(a, "--dense-attention"))
            t->dense_attention = true;
        else if (int_opt(argc, argv, &i, "--eval-batches", 1, 1 << 20, &x, &bad))
            t->eval_batches = x;
        else if (cli_opt(argc, argv, &i, "--dtype", &v)) {
            if (strcmp(v, "f32") && strcmp(v, "bf16")) {
                fprintf(stderr, "ctorch: --dtype must be f32 or bf16, got '%s'\n", v);
                bad = true;
            }
            t->dtype = !strcmp(v, "bf16") ? CT_DTYPE_BF16 : CT_DTYPE_F32;
        } else {
            setting = false;
            if (int_opt(argc, argv, &i, "--eval-every", 0, 1LL << 40, &r->eval_every, &bad)) {
            } else if (int_opt(argc, argv, &i, "--threads", 1, 256, &r->threads, &bad)) {
            } else if (cli_opt(argc, argv, &i, "--out", &v))
                r->out = v;
            else if (int_opt(argc, argv, &i, "--save-every", 0, 1LL << 40, &r->save_every, &bad)) {
            } else if (int_opt(argc, argv, &i, "--stop-at", 1, 1LL << 40, &r->stop_at, &bad)) {
            } else if (int_opt(argc, argv, &i, "--log-every", 1, 1LL << 40, &r->log_every, &bad)) {
            } else if (!strcmp(a, "--quiet"))
                r->quiet = true;
            else if (cli_opt(argc, argv, &i, "--device", &v)) {
                ct_device_options dopt = ct_device_options_default();
                if (ct_device_parse(v, &dopt) != CT_OK) {
                    fprintf(stderr, "ctorch train: --device: %s\n", ct_last_error());
                    bad = true;
                }
                r->device = v;
            }
            else if (int_opt(argc, argv, &i, "--nproc", 1, 256, &r->nproc, &bad)) {
            } else if (!strcmp(a, "--fsdp") || !strcmp(a, "--dp")) {
                r->dist = true;
                r->mode = a[2] == 'f' ? CT_FSDP_FULL_SHARD : CT_FSDP_REPLICATE;
            } else if (cli_opt(argc, argv, &i, "--backend", &v)) {
                ct_comm_backend be;
                if (ct_comm_backend_from_name(v, &be)) {
                    fprintf(stderr, "ctorch: --backend must be tcp or mpi, got '%s'\n", v);
                    bad = true;
                }
                r->backend = v;
            } else if (!strcmp(a, "--elastic"))
                r->elastic = true;
            else if (int_opt(argc, argv, &i, "--prefetch", 0, 8, &r->prefetch, &bad)) {
            } else if (cli_opt(argc, argv, &i, "--param-dtype", &v)) {
                if (strcmp(v, "bf16") && strcmp(v, "f32")) {
                    fprintf(stderr, "ctorch: --param-dtype must be f32 or bf16, got '%s'\n", v);
                    bad = true;
                }
                r->bf16 = !strcmp(v, "bf16");
            } else if (!strcmp(a, "--no-overlap"))
                r->no_overlap = true;
            else if (!strcmp(a, "--no-separate-rs"))
                r->no_separate_rs = true;
            else if (!strcmp(a, "--no-reshard"))
                r->no_reshard = true;
            else if (cli_opt(argc, argv, &i, "--dump-grads", &v))
                r->dump = v;
            else if (!strcmp(a, "--overwrite"))
                r->overwrite = true;
            else if (!strcmp(a, "--resume")) {
                r->resuming = true;
                if (i + 1 < argc && argv[i + 1][0] != '-') r->resume = argv[++i];
            } else {
                fprintf(stderr,
                        "ctorch train: unknown option '%s' (ctorch train --help lists them)\n", a);
                return 2;
            }
        }
        if (setting && !r->settings_flag) r->settings_flag = a;
    }
    if (bad) return 2;
    if ((r->nproc || r->elastic || r->backend) && !r->dist) {
        fprintf(stderr, "ctorch train: --nproc, --backend and --elastic need --fsdp or --dp\n");
        return 2;
    }
    if (r->elastic && r->backend && !strcmp(r->backend, "mpi")) {
        fprintf(stderr,
                "ctorch train: --elastic needs the tcp backend (MPI cannot shrink a "
                "communicator here)\n");
        return 2;
    }
    if (c->mask_mod[0] && c->window) {
        fprintf(stderr, "ctorch train: --mask-mod is exclusive with --window (write the window "
                        "into the mask: q - kv <= W)\n");
        return 2;
    }
    if (r->init_from && r->model_flag) {
        fprintf(stderr,
                "ctorch train: --init-from takes the model from %s; drop %s\n", r->init_from,
                r->model_flag);
        return 2;
    }
    if (r->init_from && !r->data_path && !r->resuming) {
        fprintf(stderr, "ctorch train: --init-from needs --data FILE.txt\n");
        return 2;
    }
    if (r->lora_on && !r->init_from) {
        fprintf(stderr, "ctorch train: --lora-rank needs --init-from (adapters on a model)\n");
        return 2;
    }
    if (r->bf16 && r->dist && r->mode == CT_FSDP_REPLICATE) {
        fprintf(stderr, "ctorch train: --param-dtype bf16 needs --fsdp (--dp keeps f32 replicas "
                        "and gathers nothing; --dtype bf16 computes in bf16)\n");
        return 2;
    }
    if (r->init_from && r->dist) {
        fprintf(stderr, "ctorch train: --init-from does not combine with --fsdp / --dp yet\n");
        return 2;
    }
    if (r->lora_on && r->dump) {
        fprintf(stderr, "ctorch train: --dump-grads does not apply to --lora-rank runs\n");
        return 2;
    }
    if (r->resuming && r->settings_flag) {
        fprintf(stderr,
                "ctorch train: --resume takes the model, data and training settings from the "
                "checkpoint; drop %s\n",
                r->settings_flag);
        return 2;
    }
    return 0;
}

/* ---- files --------------------------------------------------------------------------------- */

/* The whole of a regular file (a FIFO, /dev/zero or a folder refused: never waited on, never
 * read without end) of at most max bytes, into a malloc'd buffer with a NUL after *len. */
static int read_file(const char *path, const char *what, size_t max, char **data, size_t *len)
{
    int fd;
    size_t n;
    ct_status s = ct_file_open_regular(path, what, max, &fd, &n);
    char *buf = s ? NULL : malloc(n + 1);
    if (!s && !buf)
        s = ct_error(CT_ENOMEM, "%s '%s' (%zu bytes) does not fit in memory", what, path, n);
    for (size_t got = 0; !s && got < n;) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            s = ct_error(CT_EIO, "reading %s '%s': %s", what, path,
                         r < 0 ? strerror(errno) : "the file shrank while it was read");
        else
            got += (size_t)r;
    }
    if (fd >= 0) close(fd);
    if (s) {
        free(buf);
        return cli_fail("train", s);
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}

static uint64_t checksum(const int32_t *x, int64_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)x[i]) * 1099511628211ull;
    return h;
}

static char *dup_json(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(j);
    return s;
}

/* ---- data ---------------------------------------------------------------------------------- */

static int builtin_data(run *r)
{
    ct_status s = ct_corpus_create(&r->co, &r->corpus);
    if (s) return cli_fail("train: corpus", s);
    ct_corpus_entropy_compute(r->corpus, &r->ent);
    int64_t T = r->to.seq ? r->to.seq : r->cfg.context, B = r->to.batch;
    double need = (double)r->to.steps * (double)r->to.accum * (double)B * (double)T + 1;
    r->n_train = need > (double)(1 << 26) ? (1 << 26) : (int64_t)need;
    if (r->n_train < T + 1) r->n_train = T + 1;
    r->n_eval = (r->to.eval_batches ? r->to.eval_batches : 1) * B * T + 1;
    r->train = malloc((size_t)r->n_train * sizeof(int32_t));
    r->eval = malloc((size_t)r->n_eval * sizeof(int32_t));
    if (!r->train || !r->eval) return cli_fail("train: corpus", CT_ENOMEM);
    if ((s = ct_corpus_generate(r->corpus, 0, r->n_train, r->train)) ||
        (s = ct_corpus_generate(r->corpus, 1, r->n_eval, r->eval)))
        return cli_fail("train: corpus", s);
    r->builtin = true;
    r->cfg.vocab_size = r->co.vocab_size;
    r->to.eos_token = r->no_doc_mask ? -1 : 0;
    r->data_json = dup_json(json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:I}", "kind", "builtin", "seed",
        (json_int_t)r->co.seed, "vocab_size", (json_int_t)r->co.vocab_size, "classes",
        (json_int_t)r->co.classes, "successors", (json_int_t)r->co.successors, "zipf", r->co.zipf,
        "sentence", (json_int_t)r->co.sentence, "repeats", (json_int_t)r->co.repeats,
        "train_tokens", (json_int_t)r->n_train, "eval_tokens", (json_int_t)r->n_eval));
    return 0;
}

static int text_data(run *r, uint64_t want_checksum, int64_t want_tokens)
{
    char *text;
    size_t len;
    if (read_file(r->data_path, "training data", SIZE_MAX, &text, &len)) return 1;
    size_t bad;
    if (!ct_utf8_valid(text, len, &bad)) {
        fprintf(stderr,
                "ctorch train: '%s' is not UTF-8 text (invalid byte 0x%02x at offset %zu)\n",
                r->data_path, (unsigned char)text[bad], bad);
        free(text);
        return 1;
    }
    ct_status s = CT_OK;
    if (!r->tok && r->tok_path) {
        s = ct_tokenizer_load(r->tok_path, &r->tok);
        if (s) {
            free(text);
            return cli_fail("train: --tokenizer", s);
        }
    }
    if (!r->tok) {
        ct_bpe_options bo = ct_bpe_options_default();
        bo.vocab_size = r->text_vocab;
        if (!r->quiet)
            fprintf(stderr, "training a byte-level BPE tokenizer (vocabulary %lld) on %s ...\n",
                    r->text_vocab, r->data_path);
        if ((s = ct_tokenizer_train(text, len, &bo, &r->tok))) {
            free(text);
            return cli_fail("train: tokenizer", s);
        }
        char path[4200];
        snprintf(path, sizeof path, "%s/tokenizer.json", r->out);
        if ((s = ct_tokenizer_save(r->tok, path))) {
            free(text);
            return cli_fail("train: saving the tokenizer", s);
        }
        if (!r->quiet) fprintf(stderr, "tokenizer saved to %s\n", path);
    }
    int32_t *ids;
    int64_t n;
    s = ct_tokenizer_encode(r->tok, text, len, &ids, &n);
    free(text);
    if (s) return cli_fail("train: tokenizing", s);
    uint64_t sum = checksum(ids, n);
    if (want_tokens >= 0 && (n != want_tokens || sum != want_checksum)) {
        ct_free(ids);
        fprintf(
            stderr,
            "ctorch train: '%s' is not the text the checkpoint was trained on (%lld tokens now, "
            "%lld then, or another checksum)\n",
            r->data_path, (long long)n, (long long)want_tokens);
        return 1;
    }
    int64_t T = r->to.seq ? r->to.seq : r->cfg.context;
    int64_t ne = (int64_t)((double)n * r->eval_fraction);
    if (ne < T + 1) ne = T + 1;
    if (n - ne < T + 1) {
        ct_free(ids);
        fprintf(
            stderr,
            "ctorch train: '%s' gives %lld tokens; it needs at least %lld (two windows of seq + 1 "
            "= %lld: train and held out)\n",
            r->data_path, (long long)n, (long long)(2 * (T + 1)), (long long)(T + 1));
        return 1;
    }
    r->n_train = n - ne;
    r->n_eval = ne;
    r->train = malloc((size_t)r->n_train * sizeof(int32_t));
    r->eval = malloc((size_t)r->n_eval * sizeof(int32_t));
    if (!r->train || !r->eval) {
        ct_free(ids);
        return cli_fail("train: data", CT_ENOMEM);
    }
    memcpy(r->train, ids, (size_t)r->n_train * sizeof(int32_t));
    memcpy(r->eval, ids + r->n_train, (size_t)r->n_eval * sizeof(int32_t));
    ct_free(ids);
    r->cfg.vocab_size = ct_tokenizer_vocab_size(r->tok);
    r->to.eos_token = r->no_doc_mask ? -1 : ct_tokenizer_eos(r->tok);
    char ck[32];
    snprintf(ck, sizeof ck, "%016" PRIx64, sum);
    r->data_json = dup_json(json_pack("{s:s, s:s, s:f, s:I, s:s}", "kind", "text", "path",
                                      r->data_path, "eval_fraction", r->eval_fraction, "tokens",
                                      (json_int_t)n, "checksum", ck));
    char *tj;
    if ((s = ct_tokenizer_to_json(r->tok, &tj))) return cli_fail("train: tokenizer", s);
    r->tok_json = strdup(tj);
    ct_free(tj);
    return 0;
}

/* Settings from a checkpoint's metadata (for --resume). */
static bool is_directory(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int settings_from_checkpoint(run *r, const char *path, uint64_t *sum, int64_t *tokens)
{
    ct_tensor_file *f = NULL;
    bool sharded = is_directory(path); /* resolved already: a committed sharded checkpoint */
    char *sm[4] = {NULL, NULL, NULL, NULL};
    ct_status s = CT_OK;
    if (sharded) {
        const char *keys[4] = {"train", "data", "tokenizer", "config"};
        for (int i = 0; i < 4; i++)
            if (ct_sharded_checkpoint_metadata(path, keys[i], &sm[i])) sm[i] = NULL;
    } else {
        s = ct_load(path, NULL, &f);
    }
    if (s) return cli_fail("train: --resume", s);
    int rc = 0;
    const char *tj = sharded ? sm[0] : ct_tensor_file_metadata_get(f, "train"),
               *dj = sharded ? sm[1] : ct_tensor_file_metadata_get(f, "data");
    const char *kj = sharded ? sm[2] : ct_tensor_file_metadata_get(f, "tokenizer");
    json_t *d = dj ? json_loads(dj, 0, NULL) : NULL;
    /* the whole checkpoint (config, tensor shapes and dtypes, trainer state) is checked
     * before anything the model's size is allocated (sharded: the index against the
     * configuration, and the shards against the index) */
    if ((s = sharded ? ct_sharded_checkpoint_check(path, true, &r->cfg)
                     : ct_gpt_checkpoint_check(f, true, &r->cfg)) ||
        (tj && (s = ct_train_options_from_json(tj, &r->to)))) {
        rc = cli_fail("train: --resume", s);
        goto done;
    }
    if (!tj || !d) {
        fprintf(stderr,
                "ctorch train: --resume: '%s' lacks the \"train\" or \"data\" metadata of ctorch "
                "train\n",
                path);
        rc = 1;
        goto done;
    }
    const char *init = ct_tensor_file_metadata_get(f, "init_from");
    if (init) { /* a fine-tuning run: its source again, for the layout it saves */
        static char init_buf[4096];
        snprintf(init_buf, sizeof init_buf, "%s", init);
        r->init_from = init_buf;
        bool has = false;
        if ((s = ct_lora_checkpoint_options(f, &r->lora, &has))) {
            rc = cli_fail("train: --resume", s);
            goto done;
        }
        r->lora_on = has;
    }
    const char *kind = json_string_value(json_object_get(d, "kind"));
    if (kind && !strcmp(kind, "builtin")) {
        r->co.seed = (uint64_t)json_integer_value(json_object_get(d, "seed"));
        r->co.vocab_size = json_integer_value(json_object_get(d, "vocab_size"));
        r->co.classes = json_integer_value(json_object_get(d, "classes"));
        r->co.successors = json_integer_value(json_object_get(d, "successors"));
        r->co.zipf = json_number_value(json_object_get(d, "zipf"));
        r->co.sentence = json_integer_value(json_object_get(d, "sentence"));
        r->co.repeats = json_integer_value(json_object_get(d, "repeats"));
        r->no_doc_mask = r->to.eos_token < 0;
        *tokens = -1;
    } else if (kind && !strcmp(kind, "text") && kj) {
        static char path_buf[4096];
        snprintf(path_buf, sizeof path_buf, "%s", json_string_value(json_object_get(d, "path")));
        r->data_path = path_buf;
        r->eval_fraction = json_number_value(json_object_get(d, "eval_fraction"));
        *tokens = json_integer_value(json_object_get(d, "tokens"));
        const char *ck = json_string_value(json_object_get(d, "checksum"));
        *sum = ck ? strtoull(ck, NULL, 16) : 0;
        r->no_doc_mask = r->to.eos_token < 0;
        if ((s = ct_tokenizer_from_json(kj, strlen(kj), &r->tok)))
            rc = cli_fail("train: --resume tokenizer", s);
    } else {
        fprintf(stderr,
                "ctorch train: --resume: '%s' has no known data kind in its \"data\" metadata\n",
                path);
        rc = 1;
    }
done:
    json_decref(d);
    if (f) ct_tensor_file_close(f);
    for (int i = 0; i < 4; i++)
        ct_free(sm[i]);
    return rc;
}

/* ---- gradients dump (the PyTorch check) ---------------------------------------------------- */

static int dump_grads(run *r)
{
    ct_gpt_options mo = ct_train_model_options(&r->to);
    ct_gpt *m;
    ct_status s = ct_gpt_create(&r->cfg, &mo, &m);
    if (s) return cli_fail("train: model", s);
    int64_t B = r->to.batch, T = r->to.seq;
    if (r->n_train < B * T + 1) {
        ct_gpt_free(m);
        fprintf(stderr, "ctorch train: --dump-grads needs batch * seq + 1 = %lld training tokens\n",
                (long long)(B * T + 1));
        return 1;
    }
    int32_t *tokens = malloc((size_t)(B * (T + 1)) * sizeof(int32_t));
    for (int64_t b = 0; b < B; b++)
        memcpy(tokens + b * (T + 1), r->train + b * T, (size_t)(T + 1) * sizeof(int32_t));
    float loss = 0;
    if (r->resuming) { /* the checkpoint's weights */
        ct_tensor_file *f;
        if (!(s = ct_load(r->resume, NULL, &f))) s = ct_gpt_load_params(m, f);
        ct_tensor_file_close(f);
    } else if (r->hf) {
        s = ct_hf_load_params(r->hf, m);
    } else if (r->init_from) {
        ct_tensor_file *f;
        if (!(s = ct_load(r->init_from, NULL, &f))) s = ct_gpt_load_params(m, f);
        ct_tensor_file_close(f);
    } else {
        s = ct_gpt_init(m, r->to.seed);
    }
    if (!s) s = ct_gpt_forward_backward(m, tokens, B, T, 1.0f, &loss);
    int nt = ct_gpt_num_tensors(m);
    ct_tensor *tens = calloc((size_t)(2 * nt + 1), sizeof *tens);
    char **names = calloc((size_t)(2 * nt + 1), sizeof *names);
    for (int i = 0; i < nt && !s; i++) {
        const char *name;
        s = ct_gpt_tensor(m, i, &name, &tens[i], &tens[nt + i]);
        names[i] = strdup(name);
        names[nt + i] = malloc(strlen(name) + 8);
        sprintf(names[nt + i], "grad.%s", name);
    }
    int64_t ts[2] = {B, T + 1};
    if (!s) s = ct_tensor_wrap(&tens[2 * nt], tokens, CT_DTYPE_I32, 2, ts, NULL);
    names[2 * nt] = strdup("tokens");
    char ls[32], *cj = NULL, *tj = NULL;
    snprintf(ls, sizeof ls, "%.9g", loss);
    if (!s) s = ct_gpt_config_to_json(&r->cfg, &cj);
    if (!s) s = ct_train_options_to_json(&r->to, &tj);
    if (!s) {
        const char *keys[] = {"format", "config", "train", "loss"};
        const char *vals[] = {"ctorch-gpt-grads", cj, tj, ls};
        s = ct_save_safetensors(r->dump, tens, (const char *const *)names, (size_t)(2 * nt + 1),
                                keys, vals, 4, NULL);
    }
    for (int i = 0; i < 2 * nt + 1; i++)
        free(names[i]);
    free(names);
    free(tens);
    free(tokens);
    ct_free(cj);
    ct_free(tj);
    ct_gpt_free(m);
    if (s) return cli_fail("train: --dump-grads", s);
    printf("loss %.9g; weights and gradients of %d tensors written to %s\n", loss, nt, r->dump);
    return 0;
}

/* ---- progress, metrics, plot --------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fmt_time(double s, char *buf, size_t n)
{
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

/* The loss curve as SVG: training loss per step (and its moving average), held-out points,
 * and for the built-in corpus the entropy floor and the unigram entropy. From metrics.jsonl,
 * so a resumed run plots its whole history. */
static int write_svg(const run *r)
{
    int mfd;
    size_t msize;
    if (ct_file_open_regular(r->metrics, "metrics", SIZE_MAX, &mfd, &msize)) return 1;
    FILE *in = fdopen(mfd, "r");
    if (!in) {
        close(mfd);
        return 1;
    }
    size_t cap = 1024, n = 0, ne = 0, cape = 64;
    double *xs = malloc(cap * sizeof *xs), *ys = malloc(cap * sizeof *ys);
    double *ex = malloc(cape * sizeof *ex), *ey = malloc(cape * sizeof *ey);
    char line[4096];
    while (fgets(line, sizeof line, in)) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j) continue;
        json_t *st = json_object_get(j, "step"), *l = json_object_get(j, "loss"),
               *e = json_object_get(j, "eval_loss");
        if (json_is_integer(st) && json_is_number(l)) {
            if (n == cap)
                cap *= 2, xs = realloc(xs, cap * sizeof *xs), ys = realloc(ys, cap * sizeof *ys);
            /* a resumed run rewrites the steps after its checkpoint: keep the latest */
            double sx = (double)json_integer_value(st);
            while (n && xs[n - 1] >= sx)
                n--;
            xs[n] = sx, ys[n++] = json_number_value(l);
        }
        if (json_is_integer(st) && json_is_number(e)) {
            if (ne == cape)
                cape *= 2, ex = realloc(ex, cape * sizeof *ex), ey = realloc(ey, cape * sizeof *ey);
            double sx = (double)json_integer_value(st);
            while (ne && ex[ne - 1] >= sx)
                ne--;
            ex[ne] = sx, ey[ne++] = json_number_value(e);
        }
        json_decref(j);
    }
    fclose(in);
    if (!n) { /* nothing to plot: no empty file */
        free(xs), free(ys), free(ex), free(ey);
        return 2;
    }
    FILE *f = fopen(r->svg, "w");
    if (!f) {
        free(xs), free(ys), free(ex), free(ey);
        return 1;
    }
    double x1 = xs[n - 1] > 1 ? xs[n - 1] : 2, y0 = 1e30, y1 = -1e30;
    for (size_t i = 0; i < n; i++)
        y0 = fmin(y0, ys[i]), y1 = fmax(y1, ys[i]);
    for (size_t i = 0; i < ne; i++)
        y0 = fmin(y0, ey[i]), y1 = fmax(y1, ey[i]);
    if (r->builtin) y0 = fmin(y0, r->ent.rate), y1 = fmax(y1, r->ent.unigram);
    y0 = floor(y0 - 0.25), y1 = ceil(fmin(y1, y0 + 12) + 0.25);
    const double W = 800, H = 480, L = 60, R = 20, Tp = 30, Bm = 50;
#define PX(x) (L + ((x)-1) / (x1 - 1) * (W - L - R))
#define PY(y) (Tp + (y1 - fmax(y0, fmin(y1, (y)))) / (y1 - y0) * (H - Tp - Bm))
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
            "font-family=\"sans-serif\" "
            "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H);
    fprintf(
        f,
        "<text x=\"%g\" y=\"18\" font-size=\"14\">ctorch train: loss (nats/token) by step</text>\n",
        L);
    for (double y = y0; y <= y1 + 1e-9; y += (y1 - y0 > 6 ? 2 : 1))
        fprintf(f,
                "<line x1=\"%g\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%g\" "
                "y=\"%.1f\" "
                "text-anchor=\"end\">%g</text>\n",
                L, W - R, PY(y), PY(y), L - 6, PY(y) + 4, y);
    for (int k = 0; k <= 5; k++) {
        double x = 1 + (x1 - 1) * k / 5.0;
        fprintf(f, "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%.0f</text>\n", PX(x),
                H - Bm + 18, x);
    }
    fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">step</text>\n", (W + L) / 2, H - 12);
    fprintf(f, "<polyline fill=\"none\" stroke=\"#9ecae1\" stroke-width=\"1\" points=\"");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%.1f,%.1f ", PX(xs[i]), PY(ys[i]));
    fprintf(f, "\"/>\n<polyline fill=\"none\" stroke=\"#08519c\" stroke-width=\"2\" points=\"");
    double ema = ys[0];
    for (size_t i = 0; i < n; i++) {
        ema = i ? 0.9 * ema + 0.1 * ys[i] : ys[0];
        fprintf(f, "%.1f,%.1f ", PX(xs[i]), PY(ema));
    }
    fprintf(f, "\"/>\n");
    for (size_t i = 0; i < ne; i++)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#e6550d\"/>\n", PX(ex[i]),
                PY(ey[i]));
    double ly = Tp + 16;
    if (r->builtin) {
        fprintf(f,
                "<line x1=\"%g\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#31a354\" "
                "stroke-dasharray=\"6,4\"/>\n",
                L, W - R, PY(r->ent.rate), PY(r->ent.rate));
        fprintf(f,
                "<line x1=\"%g\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#756bb1\" "
                "stroke-dasharray=\"6,4\"/>\n",
                L, W - R, PY(r->ent.unigram), PY(r->ent.unigram));
    }
    const char *labels[4] = {"training loss", "moving average", "held-out loss", NULL};
    const char *colors[4] = {"#9ecae1", "#08519c", "#e6550d", NULL};
    char fl[64], ul[64];
    int nl = 3;
    if (r->builtin) {
        snprintf(fl, sizeof fl, "entropy floor %.3f", r->ent.rate);
        snprintf(ul, sizeof ul, "unigram entropy %.3f", r->ent.unigram);
        labels[3] = fl, colors[3] = "#31a354", nl = 4;
    }
    for (int i = 0; i < nl; i++, ly += 16)
        fprintf(f,
                "<rect x=\"%g\" y=\"%.1f\" width=\"14\" height=\"4\" fill=\"%s\"/><text x=\"%g\" "
                "y=\"%.1f\">%s"
                "</text>\n",
                W - R - 190, ly - 4, colors[i], W - R - 170, ly, labels[i]);
    if (r->builtin)
        fprintf(f,
                "<rect x=\"%g\" y=\"%.1f\" width=\"14\" height=\"4\" fill=\"#756bb1\"/><text "
                "x=\"%g\" y=\"%.1f\">"
                "%s</text>\n",
                W - R - 190, ly - 4, W - R - 170, ly, ul);
    fprintf(f, "</svg>\n");
#undef PX
#undef PY
    int rc = ferror(f) | fclose(f) ? 1 : 0;
    if (rc) unlink(r->svg); /* no partial plot */
    free(xs), free(ys), free(ex), free(ey);
    return rc;
}

/* write_svg with its message: 0, or 1 when the plot could not be written (the run fails:
 * every file it names must be there). */
static int plot(const run *r)
{
    errno = 0;
    int w = write_svg(r);
    if (w == 1) {
        fprintf(stderr, "ctorch train: could not write the loss plot %s: %s\n", r->svg,
                errno ? strerror(errno) : "write error");
        return 1;
    }
    if (w == 2)
        fprintf(stderr, "ctorch train: %s holds no training step: no loss plot written\n",
                r->metrics);
    return 0;
}

/* A resumed run whose checkpoint is already at its last step (or at --stop-at): nothing to
 * train, and nothing is written (metrics, plot and checkpoint stay as they are). */
static bool nothing_left(const run *r, int64_t start, int64_t stop, int64_t total)
{
    if (start < stop) return false;
    if (stop < total)
        fprintf(stderr,
                "ctorch train: %s is at step %lld, at or past --stop-at %lld: no steps left to "
                "train; nothing was written (give a later --stop-at, or none to train to step "
                "%lld)\n",
                r->resume, (long long)start, (long long)stop, (long long)total);
    else
        fprintf(stderr,
                "ctorch train: %s is at step %lld of %lld: the run is complete, no steps left to "
                "train; nothing was written (to train further, start a new run from its weights: "
                "--init-from with a larger --steps)\n",
                r->resume, (long long)start, (long long)total);
    return true;
}

static void metrics_line(FILE *f, json_t *j)
{
    if (!f) {
        json_decref(j);
        return;
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(j);
    if (s) {
        fputs(s, f);
        fputc('\n', f);
        fflush(f);
        free(s);
    }
}

/* Where the held-out loss sits between the unigram entropy (0%) and the floor (100%). */
static double progress_to_floor(const run *r, double loss)
{
    return 100.0 * (r->ent.unigram - loss) / (r->ent.unigram - r->ent.rate);
}

/* ---- the run ------------------------------------------------------------------------------- */

/* Copy the tokenizer and generation files of a HF directory into OUT (atomically each), so
 * OUT is a complete model directory (cli/side_files.c: regular files inside the directory,
 * their permission bits kept). */
static int copy_side_files(const run *r)
{
    return cli_copy_side_files("train", r->init_from, r->out);
}

static int save(const run *r, ct_trainer *t)
{
    const char *keys[4] = {"data", "tokenizer", NULL, NULL};
    const char *vals[4] = {r->data_json, r->tok_json, NULL, NULL};
    size_t n = r->tok_json ? 2 : 1;
    if (r->init_from) keys[n] = "init_from", vals[n++] = r->init_from;
    ct_status s = ct_trainer_save(t, r->ckpt, n, keys, vals);
    if (s) return cli_fail("train: saving the checkpoint", s);
    if (r->lora_on) { /* PEFT's adapter layout */
        if ((s = ct_lora_save(ct_trainer_lora(t), r->out, r->init_from)))
            return cli_fail("train: saving the LoRA adapter", s);
    } else if (r->hf) { /* the layout it came from */
        if ((s = ct_hf_save(ct_trainer_model(t), r->hf, r->out, NULL)))
            return cli_fail("train: saving the Hugging Face directory", s);
        if (copy_side_files(r)) return 1;
    }
    return 0;
}

/* The --init-from weights into the trainer's model (a fresh run), then the adapters. */
static int init_weights(run *r, ct_trainer *t)
{
    ct_gpt *m = ct_trainer_model(t);
    ct_status s = CT_OK;
    if (!r->resuming) {
        if (r->hf) {
            s = ct_hf_load_params(r->hf, m);
        } else {
            ct_tensor_file *f;
            if (!(s = ct_load(r->init_from, NULL, &f))) {
                s = ct_gpt_load_params(m, f);
                ct_tensor_file_close(f);
            }
        }
        if (s) return cli_fail("train: --init-from", s);
    }
    if (r->lora_on && (s = ct_trainer_enable_lora(t, &r->lora)))
        return cli_fail("train: --lora-rank", s);
    return 0;
}

/* --device: open it. On a GPU FlexAttention takes the built-in masks (causal, window,
 * documents) and compiled --score-mod / --mask-mod (built for the device at model creation);
 * dense attention is causal only (its document mask is dropped with a note). */
static int open_device(run *r)
{
    ct_device_options o = ct_device_options_default();
    ct_status s = ct_device_parse(r->device, &o);
    if (s) return cli_fail("train: --device", s);
    if (o.kind == CT_DEVICE_CPU) return 0;
    if (r->dist) {
        fprintf(stderr, "ctorch train: --device %s: --fsdp / --dp run on the CPU only\n", r->device);
        return 1;
    }
    if (r->to.dense_attention && r->cfg.window) {
        fprintf(stderr, "ctorch train: --device %s: dense attention on a GPU is causal only "
                        "(a --window runs through FlexAttention: drop --dense-attention)\n",
                r->device);
        return 1;
    }
    if ((s = ct_device_open(&o, &r->dev))) return cli_fail("train: --device", s);
    r->to.device = r->dev;
    if (r->to.dense_attention && r->to.eos_token >= 0) {
        if (!r->quiet)
            fprintf(stderr, "note: %s: dense attention is causal only there: no document mask "
                            "(as --no-doc-mask; FlexAttention keeps it)\n", r->device);
        r->to.eos_token = -1;
    }
    return 0;
}

/* ---- an earlier run in OUT ----------------------------------------------------------------- */

/* "checkpoint-<digits>": a sharded checkpoint folder. */
static bool sharded_name(const char *n)
{
    if (strncmp(n, "checkpoint-", 11) || !n[11]) return false;
    for (const char *p = n + 11; *p; p++)
        if (*p < '0' || *p > '9') return false;
    return true;
}

static const char *const RUN_FILES[] = {"checkpoint.safetensors", "metrics.jsonl", "latest",
                                        "loss.svg"};

/* The first thing of an earlier run in dir (into what), or false when there is none. Only
 * a checkpoint, the metrics, `latest` or a checkpoint-<step>/ folder count (the plot alone
 * does not: it is redrawn from the metrics). */
static bool earlier_run(const char *dir, char *what, size_t cap)
{
    struct stat st;
    char p[4200];
    for (size_t i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, RUN_FILES[i]);
        if (!lstat(p, &st)) {
            snprintf(what, cap, "%s", RUN_FILES[i]);
            return true;
        }
    }
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));)
        if (sharded_name(e->d_name)) {
            snprintf(what, cap, "%s/", e->d_name);
            found = true;
        }
    closedir(d);
    return found;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) ? -1 : 0;
}

/* --overwrite: remove the earlier run's files and sharded folders (nothing else in dir). */
static int remove_earlier_run(const char *dir)
{
    char p[4200];
    for (size_t i = 0; i < sizeof RUN_FILES / sizeof RUN_FILES[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, RUN_FILES[i]);
        struct stat st;
        if (lstat(p, &st)) continue;
        int bad = S_ISDIR(st.st_mode) ? nftw(p, rm_entry, 16, FTW_DEPTH | FTW_PHYS) : unlink(p);
        if (bad) {
            fprintf(stderr, "ctorch train: --overwrite: cannot remove '%s': %s\n", p,
                    strerror(errno));
            return 1;
        }
    }
    DIR *d = opendir(dir);
    if (!d) return 0;
    int rc = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        if (!sharded_name(e->d_name)) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (nftw(p, rm_entry, 16, FTW_DEPTH | FTW_PHYS)) {
            fprintf(stderr, "ctorch train: --overwrite: cannot remove '%s': %s\n", p,
                    strerror(errno));
            rc = 1;
        }
    }
    closedir(d);
    return rc;
}

/* ---- training across processes (--fsdp, --dp; docs/fsdp.md) --------------------------------- */

/* `ctorch train --nproc N ...`: the same command through `ctorch launch` (N local ranks),
 * without --nproc, with --threads cores / N unless given. */
static int spawn_nproc(run *r, int argc, char **argv)
{
    char exe[4096];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el <= 0) {
        fprintf(stderr, "ctorch train: --nproc: cannot find this program (/proc/self/exe)\n");
        return 1;
    }
    exe[el] = '\0';
    char **av = calloc((size_t)argc + 16, sizeof *av);
    char np[32], th[32], frdir[4200];
    if (!av) return cli_fail("train: --nproc", CT_ENOMEM);
    int n = 0;
    av[n++] = "launch";
    av[n++] = "--nproc";
    snprintf(np, sizeof np, "%lld", r->nproc);
    av[n++] = np;
    if (r->elastic) {
        av[n++] = "--elastic";
        snprintf(frdir, sizeof frdir, "%s/flight", r->out);
        mkdir(r->out, 0777);
        mkdir(frdir, 0777);
        av[n++] = "--fr-dump-dir";
        av[n++] = frdir;
    }
    av[n++] = "--";
    av[n++] = exe;
    av[n++] = "train";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc")) {
            i++;
            continue;
        }
        av[n++] = argv[i];
    }
    if (!r->threads) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        long t = cores > 0 ? cores / r->nproc : 1;
        snprintf(th, sizeof th, "%ld", t < 1 ? 1 : t);
        av[n++] = "--threads";
        av[n++] = th;
    }
    av[n] = NULL;
    int rc = cmd_launch(n, av);
    free(av);
    return rc;
}

/* The world communicator: from the environment (a launcher, mpiexec), or one rank alone. */
static ct_status dist_comm(run *r, ct_store_server **srv, ct_store **store, ct_comm **out)
{
    ct_comm_options co = ct_comm_options_default();
    if (r->backend) {
        ct_status s = ct_comm_backend_from_name(r->backend, &co.backend);
        if (s) return s;
    }
    co.name = "train";
    bool env = getenv("WORLD_SIZE") || getenv("PMI_SIZE") || getenv("OMPI_COMM_WORLD_SIZE");
    if (env || co.backend == CT_COMM_MPI) return ct_comm_init_env(&co, out);
    ct_status s = ct_store_server_start("127.0.0.1", 0, srv);
    if (!s) s = ct_store_connect("127.0.0.1", ct_store_server_port(*srv), 30, store);
    if (!s) s = ct_comm_init(*store, 0, 1, &co, out);
    return s;
}

static int dist_save(run *r, ct_fsdp_trainer *t)
{
    const char *keys[3] = {"data", "tokenizer", NULL};
    const char *vals[3] = {r->data_json, r->tok_json, NULL};
    ct_status s = ct_fsdp_trainer_save(t, r->out, r->tok_json ? 2 : 1, keys, vals);
    if (s) return cli_fail("train: saving the sharded checkpoint", s);
    return 0;
}

/* ---- the training loop: one process (ct_trainer) or across processes (ct_fsdp_trainer) ---- */

typedef struct loop loop;

/* The calls that differ between the two trainers, chosen once (single_ops, dist_ops); the
 * schedule, evaluation cadence, saving, --stop-at, metrics records, progress lines, the end
 * record, the plot and the summary are train_steps()'s alone. */
typedef struct loop_ops {
    int (*open)(loop *L); /* the trainer, its weights or the --resume checkpoint */
    int64_t (*step_count)(const loop *L);
    ct_status (*step)(loop *L, ct_train_step_info *info);
    void (*after_step)(loop *L, double dt, bool report); /* a step done (NULL: nothing) */
    ct_status (*evaluate)(loop *L, float *loss);
    int (*save)(loop *L); /* the checkpoint: 0, or the exit status (its message printed) */
    void (*describe)(const loop *L); /* rank 0, not --quiet: the model and memory lines */
    void (*start_records)(loop *L, const char *event); /* metrics: the start / resume record */
    void (*step_fields)(const loop *L, json_t *j, double dt); /* a step record's own fields */
    void (*progress)(const loop *L, int64_t step, double dt, const ct_memory_stats_t *ms,
                     char *buf, size_t n); /* the progress line after tok/s */
    int (*recover)(loop *L, int64_t *step); /* --elastic: a failed step (NULL: fatal) */
    int (*finish)(loop *L, int rc, const ct_memory_stats_t *ms); /* every rank, after saving */
    void (*end_fields)(loop *L, json_t *end); /* the end record's own fields (NULL: none) */
    void (*done)(const loop *L, double wall, const ct_memory_stats_t *ms); /* the summary */
    void (*free)(loop *L);
} loop_ops;

struct loop {
    run *r;
    const loop_ops *ops;
    /* one process */
    ct_trainer *t;
    ct_telemetry tel;
    double step_s, cpu; /* the step time's moving average (ETA); the last CPU sample */
    /* across processes */
    ct_fsdp_trainer *ft;
    ct_comm *world;
    ct_store_server *srv;
    ct_store *store;
    ct_fsdp_stats fs;            /* the last step's (before its evaluation) */
    ct_memory_stats_t setup_mem; /* what the set-up holds: model shards, communicators */
    double exposed_all, coll_all;
    double *peaks; /* peak tracked memory per rank */
    /* the run */
    bool tty;         /* progress rewritten in place */
    bool floor_notes; /* held-out losses against the built-in corpus's entropies */
    int step_width;   /* of the step number in the progress line */
    char saved[4200]; /* what the end names as the checkpoint */
    int64_t start, stop, total, steps_run, tokens_run;
    double t0, busy_s; /* the steps' time, evaluation and saving excluded */
    float last_eval;
    FILE *mf; /* metrics.jsonl (rank 0) */
};

/* One process. */

static int single_open(loop *L)
{
    run *r = L->r;
    ct_status s = ct_trainer_create(&r->cfg, &r->to, r->train, r->n_train, r->eval, r->n_eval,
                                    &L->t);
    if (s) return cli_fail("train", s);
    if (r->init_from && init_weights(r, L->t)) return 1;
    if (r->resuming && (s = ct_trainer_load(L->t, r->resume)))
        return cli_fail("train: --resume", s);
    if (r->to.dtype == CT_DTYPE_BF16 && !ct_cpu_has_bf16()) /* once, even with --quiet */
        fprintf(stderr, "ctorch train: --dtype bf16: %s has no bf16 dot-product instructions "
                        "(AVX512_BF16 / BF16); the bf16 operands are converted to f32 for each "
                        "product (same results, no bf16 speed-up)\n",
                ct_cpu_name());
    L->tty = isatty(2);
    L->floor_notes = r->builtin;
    L->step_width = (int)(log10((double)r->to.steps) + 1);
    snprintf(L->saved, sizeof L->saved, "%s", r->ckpt);
    ct_telemetry_sample ts;
    ct_telemetry_init(&L->tel);
    ct_telemetry_read(&L->tel, &ts);
    return 0;
}

static int64_t single_step_count(const loop *L)
{
    return ct_trainer_step_count(L->t);
}

static ct_status single_step(loop *L, ct_train_step_info *info)
{
    return ct_trainer_step(L->t, info);
}

static void single_after_step(loop *L, double dt, bool report)
{
    L->step_s = L->steps_run ? 0.8 * L->step_s + 0.2 * dt : dt;
    ct_telemetry_sample ts;
    if (report && ct_telemetry_read(&L->tel, &ts) == CT_OK && !isnan(ts.process_cpu))
        L->cpu = ts.process_cpu;
}

static ct_status single_evaluate(loop *L, float *loss)
{
    return ct_trainer_evaluate(L->t, loss);
}

static int single_save(loop *L)
{
    return save(L->r, L->t);
}

static void single_describe(const loop *L)
{
    const run *r = L->r;
    const ct_train_options *o = &r->to;
    ct_gpt *m = ct_trainer_model(L->t);
    ct_gpt_memory mem = ct_gpt_memory_sizes(m);
    int64_t T = o->seq ? o->seq : r->cfg.context;
    if (r->builtin)
        fprintf(stderr,
                "data: built-in corpus (seed %llu, vocabulary %lld incl. EOS, %lld classes, Zipf "
                "%g, documents of a %lld-word sentence x %lld): %lld training + %lld held-out "
                "tokens\n"
                "      entropy floor %.4f nats/token (the rate: no model can do better), unigram "
                "entropy %.4f\n",
                (unsigned long long)r->co.seed, (long long)r->co.vocab_size,
                (long long)r->co.classes, r->co.zipf, (long long)r->co.sentence,
                (long long)r->co.repeats, (long long)r->n_train, (long long)r->n_eval, r->ent.rate,
                r->ent.unigram);
    else
        fprintf(stderr, "data: %s: %lld training + %lld held-out tokens, BPE vocabulary %lld\n",
                r->data_path, (long long)r->n_train, (long long)r->n_eval,
                (long long)r->cfg.vocab_size);
    fprintf(stderr,
            "model: %lld layers, d_model %lld, %lld heads (%lld kv), ffn %lld, context %lld%s, %s "
            "head, %.2fM parameters\n",
            (long long)r->cfg.n_layer, (long long)r->cfg.d_model, (long long)r->cfg.n_head,
            (long long)r->cfg.n_kv_head, (long long)r->cfg.d_ff, (long long)r->cfg.context,
            r->cfg.window ? ", sliding window" : "", r->cfg.tied ? "tied" : "untied",
            (double)ct_gpt_num_params(m) / 1e6);
    fprintf(stderr,
            "memory: parameters %.1f MiB, gradients %.1f MiB, AdamW %.1f MiB, activations %.1f MiB "
            "(batch %lld x %lld, %s loss, %s attention%s)\n",
            mem.params / 1048576.0, mem.grads / 1048576.0, mem.optimizer / 1048576.0,
            mem.activations / 1048576.0, (long long)o->batch, (long long)T,
            o->fused_head ? "fused" : "unfused", o->dense_attention ? "dense" : "flex",
            o->eos_token >= 0 ? ", documents masked" : "");
    fprintf(stderr,
            "training: %lld steps of %lld tokens (accum %lld), lr %g -> %g, %s, %d threads, on "
            "%s%s\n",
            (long long)L->total, (long long)(o->accum * o->batch * T), (long long)o->accum, o->lr,
            o->min_lr, o->dtype == CT_DTYPE_BF16 ? "bf16 GEMMs (f32 master weights)" : "f32",
            ct_num_threads(), ct_device_name(ct_gpt_device(m)), L->start ? " (resumed)" : "");
}

static void single_start_records(loop *L, const char *event)
{
    const run *r = L->r;
    ct_gpt *m = ct_trainer_model(L->t);
    json_t *hdr = json_pack("{s:s, s:I, s:I, s:I, s:i}", "event", event, "step",
                            (json_int_t)L->start, "params", (json_int_t)ct_gpt_num_params(m),
                            "steps", (json_int_t)L->total, "threads", ct_num_threads());
    json_object_set_new(hdr, "dtype", json_string(ct_dtype_name(r->to.dtype)));
    json_object_set_new(hdr, "device", json_string(ct_device_describe(ct_gpt_device(m))));
    if (r->builtin) {
        json_object_set_new(hdr, "entropy_floor", json_real(r->ent.rate));
        json_object_set_new(hdr, "unigram_entropy", json_real(r->ent.unigram));
    }
    metrics_line(L->mf, hdr);
}

static void single_step_fields(const loop *L, json_t *j, double dt)
{
    if (!isnan(L->cpu)) json_object_set_new(j, "cpu", json_real(L->cpu));
}

static void single_progress(const loop *L, int64_t step, double dt, const ct_memory_stats_t *ms,
                            char *buf, size_t n)
{
    char eta[32], cpus[32] = "";
    fmt_time(L->step_s * (double)(L->stop - step), eta, sizeof eta);
    if (!isnan(L->cpu)) snprintf(cpus, sizeof cpus, " | cpu %3.0f%%", 100 * L->cpu);
    snprintf(buf, n, "ETA %s | mem %.1f MiB%s", eta, ms->current_bytes / 1048576.0, cpus);
}

static void single_done(const loop *L, double wall, const ct_memory_stats_t *ms)
{
    const run *r = L->r;
    char el[32];
    fmt_time(wall, el, sizeof el);
    fprintf(stderr, "done: %lld steps in %s (%.0f tokens/s), peak tracked memory %.1f MiB\n",
            (long long)(single_step_count(L) - L->start), el,
            wall > 0 ? L->tokens_run / wall : 0.0, ms->peak_bytes / 1048576.0);
    if (!isnan(L->last_eval) && r->builtin)
        fprintf(stderr,
                "held-out loss %.4f | entropy floor %.4f | unigram entropy %.4f -> %.0f%% of the "
                "way from the unigram entropy to the floor (%s)\n",
                L->last_eval, r->ent.rate, r->ent.unigram, progress_to_floor(r, L->last_eval),
                L->last_eval - r->ent.rate < r->ent.unigram - L->last_eval
                    ? "closer to the floor"
                    : "closer to the unigram entropy");
}

static void single_free(loop *L)
{
    ct_trainer_free(L->t);
}

static const loop_ops single_ops = {
    .open = single_open,
    .step_count = single_step_count,
    .step = single_step,
    .after_step = single_after_step,
    .evaluate = single_evaluate,
    .save = single_save,
    .describe = single_describe,
    .start_records = single_start_records,
    .step_fields = single_step_fields,
    .progress = single_progress,
    .done = single_done,
    .free = single_free,
};

/* Across processes (--fsdp, --dp; docs/fsdp.md). */

static int dist_open(loop *L)
{
    run *r = L->r;
    ct_status s = dist_comm(r, &L->srv, &L->store, &L->world);
    if (s) return cli_fail("train: communicator", s);
    if (r->elastic && ct_comm_get_backend(L->world) == CT_COMM_MPI) {
        fprintf(stderr, "ctorch train: --elastic needs the tcp backend\n");
        return 2;
    }
    r->rank = ct_comm_rank(L->world);
    r->world = ct_comm_size(L->world);
    ct_fsdp_options fo = ct_fsdp_options_default();
    fo.mode = r->mode;
    fo.forward_prefetch = fo.backward_prefetch = (int)r->prefetch;
    fo.overlap = !r->no_overlap;
    fo.separate_reduce_scatter_comm = !r->no_separate_rs;
    fo.reshard_after_forward = !r->no_reshard;
    if (r->bf16) fo.param_dtype = CT_DTYPE_BF16;
    if ((s = ct_fsdp_trainer_create(L->world, &r->cfg, &r->to, &fo, r->train, r->n_train,
                                    r->eval, r->n_eval, &L->ft)))
        return cli_fail("train", s);
    if (r->resuming && (s = ct_fsdp_trainer_load(L->ft, r->resume)))
        return cli_fail("train: --resume", s);
    if (r->to.dtype == CT_DTYPE_BF16 && !ct_cpu_has_bf16() && r->rank == 0)
        fprintf(stderr, "ctorch train: --dtype bf16: %s has no bf16 dot-product instructions "
                        "(AVX512_BF16 / BF16); the bf16 operands are converted to f32 for each "
                        "product (same results, no bf16 speed-up)\n",
                ct_cpu_name());
    ct_fsdp_get_stats(ct_fsdp_trainer_model(L->ft), &L->fs);
    ct_memory_stats(&L->setup_mem);
    snprintf(L->saved, sizeof L->saved, "%s/latest", r->out);
    /* elastic FSDP recovers from the last committed checkpoint: make sure there is one */
    if (r->elastic && r->mode == CT_FSDP_FULL_SHARD && !ct_fsdp_trainer_step_count(L->ft))
        return dist_save(r, L->ft);
    return 0;
}

static int64_t dist_step_count(const loop *L)
{
    return ct_fsdp_trainer_step_count(L->ft);
}

static ct_status dist_step(loop *L, ct_train_step_info *info)
{
    ct_fsdp *f = ct_fsdp_trainer_model(L->ft);
    ct_fsdp_reset_stats(f);
    ct_status s = ct_fsdp_trainer_step(L->ft, info);
    if (!s) {
        ct_fsdp_get_stats(f, &L->fs);
        L->exposed_all += L->fs.exposed_s, L->coll_all += L->fs.collective_s;
    }
    return s;
}

static ct_status dist_evaluate(loop *L, float *loss)
{
    return ct_fsdp_trainer_evaluate(L->ft, loss);
}

static int dist_save_loop(loop *L)
{
    return dist_save(L->r, L->ft);
}

static void dist_describe(const loop *L)
{
    const run *r = L->r;
    fprintf(stderr,
            "%s: %d ranks (%s backend), %lld rows each of a global batch %lld, ~%.2fM "
            "parameters\n",
            r->mode == CT_FSDP_FULL_SHARD ? "fsdp" : "dp", r->world,
            ct_comm_backend_name(ct_comm_get_backend(L->world)),
            (long long)(r->to.batch / r->world), (long long)r->to.batch,
            (double)L->fs.state_bytes / 16 * r->world / 1e6);
    fprintf(stderr,
            "memory per rank: training state %.1f MiB (parameters, gradients, AdamW), one "
            "gathered block %.1f MiB\n",
            L->fs.state_bytes / 1048576.0, L->fs.block_bytes / 1048576.0);
    fprintf(stderr, "compute: %s, all-gather %s, gradient reduction f32\n",
            r->to.dtype == CT_DTYPE_BF16 ? "bf16 GEMMs (f32 master weights)" : "f32",
            r->bf16 ? "bf16" : "f32");
}

static void dist_start_records(loop *L, const char *event)
{
    const run *r = L->r;
    json_t *hdr = json_pack("{s:s, s:I, s:I, s:s, s:i, s:I, s:I, s:i}", "event", event, "step",
                            (json_int_t)L->start, "steps", (json_int_t)L->total, "mode",
                            ct_fsdp_mode_name(r->mode), "world_size", r->world, "state_bytes",
                            (json_int_t)L->fs.state_bytes, "block_bytes",
                            (json_int_t)L->fs.block_bytes, "prefetch", (int)r->prefetch);
    json_object_set_new(hdr, "dtype", json_string(ct_dtype_name(r->to.dtype)));
    json_object_set_new(hdr, "param_dtype", json_string(r->bf16 ? "bf16" : "f32"));
    metrics_line(L->mf, hdr);
    metrics_line(L->mf, json_pack("{s:s, s:I}", "event", "setup", "mem_bytes",
                                  (json_int_t)L->setup_mem.current_bytes));
}

static void dist_step_fields(const loop *L, json_t *j, double dt)
{
    json_object_set_new(j, "exposed_comm_s", json_real(L->fs.exposed_s));
    json_object_set_new(j, "collective_s", json_real(L->fs.collective_s));
    json_object_set_new(j, "exposed_comm_pct",
                        json_real(dt > 0 ? 100 * L->fs.exposed_s / dt : 0.0));
    json_object_set_new(j, "world_size", json_integer(L->r->world));
}

static void dist_progress(const loop *L, int64_t step, double dt, const ct_memory_stats_t *ms,
                          char *buf, size_t n)
{
    snprintf(buf, n, "exposed comm %.0f%% | mem %.1f MiB | %d ranks",
             dt > 0 ? 100 * L->fs.exposed_s / dt : 0.0, ms->current_bytes / 1048576.0,
             L->r->world);
}

/* --elastic: a rank died or timed out: shrink to the survivors and go on (FSDP from the last
 * committed checkpoint, DP from the surviving replicas); *step becomes the step resumed at. */
static int dist_recover(loop *L, int64_t *step)
{
    run *r = L->r;
    fprintf(stderr, "ctorch train: rank %d: step %lld failed (%s); shrinking\n", r->rank,
            (long long)*step + 1, ct_last_error());
    ct_comm *nw = NULL;
    ct_status s = ct_comm_shrink(L->world, 0, &nw);
    if (s) return cli_fail("train: --elastic shrink", s);
    s = ct_fsdp_trainer_rebuild(L->ft, nw);
    ct_comm_free(L->world);
    L->world = nw;
    if (!s && r->mode == CT_FSDP_FULL_SHARD) {
        char latest[4200];
        snprintf(latest, sizeof latest, "%s/latest", r->out);
        s = ct_fsdp_trainer_load(L->ft, latest);
    }
    if (s) return cli_fail("train: --elastic recovery", s);
    int old = r->world;
    r->rank = ct_comm_rank(L->world);
    r->world = ct_comm_size(L->world);
    *step = ct_fsdp_trainer_step_count(L->ft);
    if (r->rank == 0) {
        if (!L->mf) L->mf = fopen(r->metrics, "a");
        metrics_line(L->mf, json_pack("{s:s, s:I, s:i, s:i}", "event", "shrink", "step",
                                      (json_int_t)*step, "world_size_before", old, "world_size",
                                      r->world));
        if (!r->quiet)
            fprintf(stderr, "elastic: continuing with %d ranks from step %lld (%s)\n", r->world,
                    (long long)*step,
                    r->mode == CT_FSDP_FULL_SHARD ? "last committed checkpoint"
                                                  : "surviving replicas");
    }
    return 0;
}

/* per-rank peak tracked memory (a gather through a sum of one-hot slots) */
static int dist_finish(loop *L, int rc, const ct_memory_stats_t *ms)
{
    run *r = L->r;
    L->peaks = calloc((size_t)r->world, sizeof *L->peaks);
    if (!rc && L->peaks) {
        L->peaks[r->rank] = (double)ms->peak_bytes;
        ct_status s = ct_fsdp_all_reduce_f64(ct_fsdp_trainer_model(L->ft), L->peaks, r->world);
        if (s) rc = cli_fail("train: memory report", s);
    }
    return rc;
}

static void dist_end_fields(loop *L, json_t *end)
{
    const run *r = L->r;
    json_t *pk = json_array();
    for (int i = 0; L->peaks && i < r->world; i++)
        json_array_append_new(pk, json_integer((json_int_t)L->peaks[i]));
    json_object_set_new(end, "peak_mem_bytes_per_rank", pk);
    json_object_set_new(end, "exposed_comm_pct",
                        json_real(L->busy_s > 0 ? 100 * L->exposed_all / L->busy_s : 0.0));
    json_object_set_new(end, "exposed_of_collective_pct",
                        json_real(L->coll_all > 0 ? 100 * L->exposed_all / L->coll_all : 0.0));
    json_object_set_new(end, "collective_s", json_real(L->coll_all));
    json_object_set_new(end, "world_size", json_integer(r->world));
    ct_fsdp_stats fs;
    ct_fsdp_get_stats(ct_fsdp_trainer_model(L->ft), &fs);
    json_object_set_new(end, "state_bytes", json_integer((json_int_t)fs.state_bytes));
    json_object_set_new(end, "peak_gathered_bytes",
                        json_integer((json_int_t)fs.peak_gathered_bytes));
    /* of the last step's block computes, those with a collective issued and not waited */
    json_object_set_new(end, "block_computes", json_integer((json_int_t)fs.block_computes));
    json_object_set_new(end, "block_computes_overlapped",
                        json_integer((json_int_t)fs.block_computes_overlapped));
}

static void dist_done(const loop *L, double wall, const ct_memory_stats_t *ms)
{
    const run *r = L->r;
    fprintf(stderr,
            "done: %lld steps (%.0f tokens/s), exposed comm %.1f%% of step time (%.1f%% of "
            "collective time), peak tracked memory per rank:",
            (long long)(dist_step_count(L) - L->start), wall > 0 ? L->tokens_run / wall : 0.0,
            L->busy_s > 0 ? 100 * L->exposed_all / L->busy_s : 0.0,
            L->coll_all > 0 ? 100 * L->exposed_all / L->coll_all : 0.0);
    for (int i = 0; L->peaks && i < r->world; i++)
        fprintf(stderr, " %.1f MiB", L->peaks[i] / 1048576.0);
    fprintf(stderr, "\n");
    if (!isnan(L->last_eval)) fprintf(stderr, "held-out loss %.4f\n", L->last_eval);
}

static void dist_free(loop *L)
{
    free(L->peaks);
    ct_fsdp_trainer_free(L->ft);
    ct_comm_free(L->world);
    ct_store_free(L->store);
    ct_store_server_free(L->srv);
}

static const loop_ops dist_ops = {
    .open = dist_open,
    .step_count = dist_step_count,
    .step = dist_step,
    .evaluate = dist_evaluate,
    .save = dist_save_loop,
    .describe = dist_describe,
    .start_records = dist_start_records,
    .step_fields = dist_step_fields,
    .progress = dist_progress,
    .recover = dist_recover,
    .finish = dist_finish,
    .end_fields = dist_end_fields,
    .done = dist_done,
    .free = dist_free,
};

/* A step's metrics record and progress lines (rank 0). */
static void report_step(loop *L, const ct_train_step_info *info, double dt, double tnow, float el,
                        bool show, const ct_memory_stats_t *ms)
{
    const run *r = L->r;
    json_t *j =
        json_pack("{s:I, s:f, s:f, s:f, s:I, s:f, s:f, s:I}", "step", (json_int_t)info->step,
                  "loss", (double)info->loss, "lr", (double)info->lr, "grad_norm", info->grad_norm,
                  "tokens", (json_int_t)info->tokens, "step_s", dt, "elapsed_s", tnow - L->t0,
                  "mem_bytes", (json_int_t)ms->current_bytes);
    L->ops->step_fields(L, j, dt);
    if (r->dev) { /* a GPU run: its own memory beside the host's */
        ct_memory_stats_t dm;
        ct_device_memory_stats(r->dev, &dm);
        json_object_set_new(j, "device_mem_bytes", json_integer((json_int_t)dm.current_bytes));
    }
    if (!isnan(el)) json_object_set_new(j, "eval_loss", json_real(el));
    metrics_line(L->mf, j);
    if (r->quiet || !show) return;
    char note[256];
    L->ops->progress(L, info->step, dt, ms, note, sizeof note);
    fprintf(stderr, "%sstep %*lld/%lld | loss %.4f | lr %.2e | %6.0f tok/s | %s%s",
            L->tty ? "\r\033[K" : "", L->step_width, (long long)info->step, (long long)L->total,
            info->loss, info->lr, L->tokens_run / (tnow - L->t0), note, L->tty ? "" : "\n");
    if (!isnan(el)) {
        if (L->floor_notes)
            fprintf(stderr,
                    "%sheld-out loss %.4f at step %lld (floor %.4f, unigram %.4f: %.0f%% of the "
                    "way to the floor)\n",
                    L->tty ? "\n" : "", el, (long long)info->step, r->ent.rate, r->ent.unigram,
                    progress_to_floor(r, el));
        else
            fprintf(stderr, "%sheld-out loss %.4f at step %lld\n", L->tty ? "\n" : "", el,
                    (long long)info->step);
    }
    fflush(stderr);
}

/* The steps from the trainer's step to --stop-at (or --steps), then the last checkpoint, the
 * end record, the plot and the summary. */
static int train_steps(loop *L)
{
    run *r = L->r;
    const loop_ops *ops = L->ops;
    L->total = r->to.steps;
    L->stop = r->stop_at && r->stop_at < L->total ? r->stop_at : L->total;
    L->start = ops->step_count(L);
    long long eval_every = r->eval_every >= 0 ? r->eval_every : (L->total >= 5 ? L->total / 5 : 1);
    long long log_every = r->log_every > 0 ? r->log_every : (L->total >= 20 ? L->total / 20 : 1);
    if (L->start >= L->stop) { /* every rank stops here; rank 0 says why */
        if (r->rank == 0) nothing_left(r, L->start, L->stop, L->total);
        return 0;
    }
    if (r->rank == 0 && !r->quiet) {
        ops->describe(L);
        if (L->start)
            fprintf(stderr, "resumed from %s at step %lld\n", r->resume, (long long)L->start);
    }
    int rc = 0;
    if (r->rank == 0) {
        if (!(L->mf = fopen(r->metrics, L->start ? "a" : "w"))) {
            fprintf(stderr, "ctorch train: cannot write '%s': %s\n", r->metrics, strerror(errno));
            return 1;
        }
        ops->start_records(L, L->start ? "resume" : "start");
    }
    L->t0 = now_s();
    for (int64_t step = L->start; step < L->stop;) {
        ct_train_step_info info;
        const char *what = "train: step";
        float el = NAN;
        double ts0 = now_s();
        ct_status s = ops->step(L, &info);
        double tnow = now_s(), dt = tnow - ts0;
        bool eval_now = !s && (info.step == L->stop || (eval_every && info.step % eval_every == 0));
        bool log_now = !s && (info.step == L->stop || info.step % log_every == 0);
        ct_memory_stats_t ms;
        ct_memory_stats(&ms);
        if (!s && ops->after_step) ops->after_step(L, dt, L->tty || log_now || eval_now);
        if (!s && eval_now && r->n_eval) {
            what = "train: evaluation";
            s = ops->evaluate(L, &el);
        }
        if (!s && r->save_every && info.step % r->save_every == 0 && info.step != L->stop) {
            int src = ops->save(L); /* a rank lost during a save: --elastic recovers too */
            if (src) s = CT_EIO, rc = src;
        }
        if (s && r->elastic && ops->recover) {
            if ((rc = ops->recover(L, &step))) break;
            continue;
        }
        if (s) {
            if (!rc) rc = cli_fail(what, s);
            break;
        }
        step = info.step;
        L->steps_run++;
        L->tokens_run += info.tokens;
        L->busy_s += dt;
        if (eval_now && r->n_eval) L->last_eval = el;
        if (r->rank == 0) report_step(L, &info, dt, tnow, el, L->tty || log_now || eval_now, &ms);
    }
    if (!rc) rc = ops->save(L);
    ct_memory_stats_t ms;
    ct_memory_stats(&ms);
    if (ops->finish) rc = ops->finish(L, rc, &ms);
    if (r->rank != 0 || !L->mf) return rc;
    double wall = now_s() - L->t0;
    json_t *end = json_pack("{s:s, s:I, s:f, s:f, s:I}", "event", "end", "step",
                            (json_int_t)ops->step_count(L), "wall_s", wall, "tokens_per_s",
                            wall > 0 ? L->tokens_run / wall : 0.0, "peak_mem_bytes",
                            (json_int_t)ms.peak_bytes);
    if (ops->end_fields) ops->end_fields(L, end);
    if (r->dev) {
        ct_memory_stats_t dm;
        ct_device_memory_stats(r->dev, &dm);
        json_object_set_new(end, "device_peak_mem_bytes", json_integer((json_int_t)dm.peak_bytes));
    }
    if (!isnan(L->last_eval)) json_object_set_new(end, "eval_loss", json_real(L->last_eval));
    metrics_line(L->mf, end);
    fclose(L->mf);
    L->mf = NULL;
    if (!rc) rc = plot(r);
    if (!rc && !r->quiet) {
        if (L->tty) fputc('\n', stderr);
        ops->done(L, wall, &ms);
        fprintf(stderr, "wrote %s, %s, %s\n", L->saved, r->metrics, r->svg);
    }
    return rc;
}

/* ctorch train's one loop, with the trainer of ops (single_ops or dist_ops). */
static int train(run *r, const loop_ops *ops)
{
    loop L = {.r = r, .ops = ops, .cpu = NAN, .last_eval = NAN};
    int rc = ops->open(&L);
    if (!rc) rc = train_steps(&L);
    if (L.mf) fclose(L.mf);
    ops->free(&L);
    return rc;
}

static void run_free(run *r)
{
    free(r->train);
    free(r->eval);
    ct_corpus_free(r->corpus);
    ct_tokenizer_free(r->tok);
    free(r->data_json);
    free(r->tok_json);
    ct_hf_close(r->hf);
}

/* --init-from: the model's configuration and tokenizer from a HF directory or a ctorch
 * checkpoint (the weights are read into the trainer later). */
static int init_source(run *r)
{
    struct stat st;
    if (stat(r->init_from, &st)) {
        fprintf(stderr, "ctorch train: --init-from: cannot open '%s': %s\n", r->init_from,
                strerror(errno));
        return 1;
    }
    ct_status s;
    ct_gpt_config cfg;
    const char *tj = NULL;
    ct_tensor_file *f = NULL;
    if (S_ISDIR(st.st_mode)) {
        if ((s = ct_hf_open(r->init_from, &r->hf))) return cli_fail("train: --init-from", s);
        cfg = *ct_hf_get_config(r->hf);
    } else {
        if ((s = ct_load(r->init_from, NULL, &f)) || (s = ct_gpt_checkpoint_config(f, &cfg))) {
            ct_tensor_file_close(f);
            return cli_fail("train: --init-from", s);
        }
        tj = ct_tensor_file_metadata_get(f, "tokenizer");
    }
    if (!r->resuming) r->cfg = cfg;
    int rc = 0;
    if (!r->tok && !r->tok_path) { /* the model's own tokenizer */
        if (r->hf) {
            char tp[4200];
            snprintf(tp, sizeof tp, "%s/tokenizer.json", r->init_from);
            if ((s = ct_tokenizer_load(tp, &r->tok))) rc = cli_fail("train: --init-from tokenizer", s);
        } else if (tj) {
            if ((s = ct_tokenizer_from_json(tj, strlen(tj), &r->tok)))
                rc = cli_fail("train: --init-from tokenizer", s);
        } else {
            fprintf(stderr, "ctorch train: --init-from: '%s' carries no tokenizer; give --tokenizer\n",
                    r->init_from);
            rc = 1;
        }
    }
    ct_tensor_file_close(f);
    return rc;
}

int cmd_train(int argc, char **argv)
{
    run r;
    memset(&r, 0, sizeof r);
    int rc = parse(&r, argc, argv);
    if (rc == -1) {
        usage(stdout);
        return 0;
    }
    if (rc) return rc;
    if (r.device && r.dist && strcmp(r.device, "cpu")) { /* before any rank starts */
        fprintf(stderr, "ctorch train: --device %s: --fsdp / --dp run on the CPU only\n", r.device);
        return 1;
    }
    if (r.nproc) return spawn_nproc(&r, argc, argv);
    if (r.threads && (rc = ct_set_num_threads((int)r.threads)))
        return cli_fail("train: --threads", (ct_status)rc);
    if (mkdir(r.out, 0777) && errno != EEXIST) {
        fprintf(stderr, "ctorch train: cannot create the output folder '%s': %s\n", r.out,
                strerror(errno));
        return 1;
    }
    char prior[300];
    if (!r.resuming && !r.dump && !r.overwrite && earlier_run(r.out, prior, sizeof prior)) {
        fprintf(stderr,
                "ctorch train: '%s' holds an earlier run (%s); --resume continues it, "
                "--overwrite replaces it, or choose another --out\n",
                r.out, prior);
        return 1;
    }
    snprintf(r.ckpt, sizeof r.ckpt, "%s/checkpoint.safetensors", r.out);
    snprintf(r.metrics, sizeof r.metrics, "%s/metrics.jsonl", r.out);
    snprintf(r.svg, sizeof r.svg, "%s/loss.svg", r.out);
    if (r.resuming && !r.resume) {
        char lt[4200];
        snprintf(lt, sizeof lt, "%s/latest", r.out);
        r.resume = r.dist && is_directory(lt) ? r.out : r.ckpt;
    }
    /* a sharded checkpoint (directory): resolved to its committed checkpoint-<step>; the
     * one-process trainer takes it consolidated into one file */
    static char resolved[4200], consolidated[4200];
    if (r.resuming && is_directory(r.resume)) {
        char *res;
        bool dir;
        ct_status s = ct_sharded_checkpoint_resolve(r.resume, &res, &dir);
        if (s) return cli_fail("train: --resume", s);
        snprintf(resolved, sizeof resolved, "%s", res);
        ct_free(res);
        r.resume = resolved;
        if (!r.dist) {
            snprintf(consolidated, sizeof consolidated, "%s/.resume-%d.safetensors", r.out,
                     (int)getpid());
            if ((s = ct_sharded_checkpoint_consolidate(r.resume, consolidated)))
                return cli_fail("train: --resume", s);
            r.resume = consolidated;
        }
    }
    uint64_t sum = 0;
    int64_t tokens = -1;
    if (r.resuming) rc = settings_from_checkpoint(&r, r.resume, &sum, &tokens);
    if (!rc && r.config_path) {
        char *text;
        size_t len;
        if (!(rc = read_file(r.config_path, "--config", CT_FILE_CONFIG_MAX, &text, &len))) {
            char *z = realloc(text, len + 1);
            z[len] = '\0';
            ct_status s = ct_gpt_config_from_json(z, &r.cfg);
            free(z);
            if (s) rc = cli_fail("train: --config", s);
        }
    }
    if (!rc && r.to.eval_batches < 1) { /* every run evaluates (eval_every and at the end) */
        fprintf(stderr,
                "ctorch train: eval_batches must be >= 1 (got %lld from the checkpoint's "
                "\"train\")\n",
                (long long)r.to.eval_batches);
        rc = 1;
    }
    if (!rc && r.init_from) rc = init_source(&r);
    if (!rc && r.init_from && r.to.seq == 0 && r.cfg.context > 1024) r.to.seq = 1024; /* not 128k */
    int64_t model_vocab = r.cfg.vocab_size;
    if (!rc) rc = r.data_path ? text_data(&r, sum, tokens) : builtin_data(&r);
    if (!rc && r.init_from) { /* the model's vocabulary, which holds the tokenizer's */
        if (r.cfg.vocab_size > model_vocab) {
            fprintf(stderr,
                    "ctorch train: the tokenizer has %lld tokens, more than the model's "
                    "vocabulary %lld\n",
                    (long long)r.cfg.vocab_size, (long long)model_vocab);
            rc = 1;
        }
        r.cfg.vocab_size = model_vocab;
    }
    if (!rc && r.to.seq == 0) r.to.seq = r.cfg.context;
    if (!rc) {
        ct_status s = ct_gpt_config_check(&r.cfg);
        if (s) rc = cli_fail("train: model configuration", s);
    }
    /* across processes only one rank removes (the others touch OUT after the rendezvous) */
    const char *rk = getenv("RANK") ? getenv("RANK") : getenv("PMI_RANK") ? getenv("PMI_RANK")
                                                                            : getenv("OMPI_COMM_WORLD_RANK");
    bool first_rank = !r.dist || !rk || !strcmp(rk, "0");
    if (!rc && !r.dump && !r.resuming && r.overwrite && first_rank) rc = remove_earlier_run(r.out);
    if (!rc && r.device) rc = open_device(&r);
    if (!rc) rc = r.dump ? dump_grads(&r) : train(&r, r.dist ? &dist_ops : &single_ops);
    if (r.dev) (void)ct_device_close(r.dev);
    if (r.resume == consolidated) unlink(consolidated);
    run_free(&r);
    return rc;
}
