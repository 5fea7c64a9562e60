/* ctorch tokenizer train|encode|decode: the byte-level BPE tokenizer that ctorch train --data
 * uses. */
#include "cli.h"
#include "core/internal.h" /* ct_file_*: the one way files are read */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: ctorch tokenizer train --data FILE --out TOKENIZER.json [--vocab N] "
        "[--min-frequency F]\n"
        "       ctorch tokenizer encode --tokenizer TOKENIZER.json (--text TEXT | --file FILE)\n"
        "       ctorch tokenizer decode --tokenizer TOKENIZER.json --ids \"ID ID ...\"\n"
        "Byte-level BPE (docs/train.md): ids 0-255 are bytes, then one id per learned merge, then\n"
        "the end-of-text token written \"<|endoftext|>\". Every text round-trips exactly.\n"
        "  train    learn up to N - 257 merges (default N 4096) from a UTF-8 text file, stopping\n"
        "           early when no pair occurs F times (default 2); saves TOKENIZER.json\n"
        "  encode   print the ids of TEXT (or of FILE's contents), space-separated\n"
        "  decode   print the text of the ids\n"
        "Exit status: 0 done, 1 a failure (the message says what), 2 a bad option.\n");
}

/* The whole of a regular file (NULL and a message on any failure: a folder, a read error). */
static char *slurp(const char *path, size_t *len)
{
    int fd; /* a regular file: a FIFO or /dev/zero is refused, never waited on */
    size_t size;
    ct_status s = ct_file_open_regular(path, "input", SIZE_MAX, &fd, &size);
    if (s) {
        cli_fail("tokenizer", s);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        fprintf(stderr, "ctorch tokenizer: cannot open '%s': %s\n", path, strerror(errno));
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            } else {
                buf = nb;
                cap *= 2;
            }
        }
    }
    if (!buf || ferror(f)) {
        fprintf(stderr, "ctorch tokenizer: cannot read '%s': %s\n", path,
                buf ? strerror(errno) : "out of memory");
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

int cmd_tokenizer(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1], *data = NULL, *out = NULL, *tpath = NULL, *text = NULL, *file = NULL,
               *idtext = NULL;
    long long vocab = 4096, minf = 2;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (cli_opt(argc, argv, &i, "--data", &v))
            data = v;
        else if (cli_opt(argc, argv, &i, "--out", &v))
            out = v;
        else if (cli_opt(argc, argv, &i, "--tokenizer", &v))
            tpath = v;
        else if (cli_opt(argc, argv, &i, "--text", &v))
            text = v;
        else if (cli_opt(argc, argv, &i, "--file", &v))
            file = v;
        else if (cli_opt(argc, argv, &i, "--ids", &v))
            idtext = v;
        else if (cli_opt(argc, argv, &i, "--vocab", &v)) {
            if (!cli_int("--vocab", v, 257, 1 << 20, &vocab)) return 2;
        } else if (cli_opt(argc, argv, &i, "--min-frequency", &v)) {
            if (!cli_int("--min-frequency", v, 1, 1LL << 40, &minf)) return 2;
        } else {
            fprintf(stderr,
                    "ctorch tokenizer: unknown option '%s' (ctorch tokenizer --help lists them)\n",
                    argv[i]);
            return 2;
        }
    }
    ct_status s;
    if (!strcmp(sub, "train")) {
        if (!data || !out) {
            fprintf(stderr, "ctorch tokenizer train: --data FILE and --out FILE are required\n");
            return 2;
        }
        size_t len;
        char *buf = slurp(data, &len);
        if (!buf) return 1;
        size_t bad;
        if (!ct_utf8_valid(buf, len, &bad)) {
            fprintf(
                stderr,
                "ctorch tokenizer: '%s' is not UTF-8 text (invalid byte 0x%02x at offset %zu)\n",
                data, (unsigned char)buf[bad], bad);
            free(buf);
            return 1;
        }
        ct_bpe_options o = ct_bpe_options_default();
        o.vocab_size = vocab;
        o.min_frequency = minf;
        ct_tokenizer *t;
        s = ct_tokenizer_train(buf, len, &o, &t);
        free(buf);
        if (s) return cli_fail("tokenizer train", s);
        s = ct_tokenizer_save(t, out);
        if (!s)
            printf("learned %lld merges from %zu bytes: vocabulary %lld tokens, saved to %s\n",
                   (long long)ct_tokenizer_vocab_size(t) - 257, len,
                   (long long)ct_tokenizer_vocab_size(t), out);
        ct_tokenizer_free(t);
        return s ? cli_fail("tokenizer train", s) : 0;
    }
    if (strcmp(sub, "encode") && strcmp(sub, "decode")) {
        fprintf(stderr, "ctorch tokenizer: unknown subcommand '%s' (train, encode, decode)\n", sub);
        return 2;
    }
    if (!tpath) {
        fprintf(stderr, "ctorch tokenizer %s: --tokenizer FILE is required\n", sub);
        return 2;
    }
    ct_tokenizer *t;
    if ((s = ct_tokenizer_load(tpath, &t))) return cli_fail("tokenizer: --tokenizer", s);
    int rc = 0;
    if (!strcmp(sub, "encode")) {
        size_t len = 0;
        char *buf = NULL;
        if (file) {
            if (!(buf = slurp(file, &len))) rc = 1;
        } else if (text) {
            buf = strdup(text);
            len = strlen(text);
        } else {
            fprintf(stderr, "ctorch tokenizer encode: --text TEXT or --file FILE is required\n");
            rc = 2;
        }
        int32_t *ids;
        int64_t n;
        if (!rc && (s = ct_tokenizer_encode(t, buf, len, &ids, &n)))
            rc = cli_fail("tokenizer encode", s);
        if (!rc) {
            for (int64_t i = 0; i < n; i++)
                printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
            ct_free(ids);
        }
        free(buf);
    } else {
        if (!idtext) {
            fprintf(stderr, "ctorch tokenizer decode: --ids \"ID ID ...\" is required\n");
            ct_tokenizer_free(t);
            return 2;
        }
        size_t cap = strlen(idtext) / 2 + 1, n = 0;
        int32_t *ids = malloc(cap * sizeof *ids);
        if (!ids) {
            fprintf(stderr, "ctorch tokenizer decode: out of memory for --ids\n");
            ct_tokenizer_free(t);
            return 1;
        }
        int64_t nvocab = ct_tokenizer_vocab_size(t);
        const char *p = idtext;
        char *end;
        while (*p && !rc) {
            while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n')
                p++;
            if (!*p) break;
            size_t w = strcspn(p, " ,\t\n"); /* this id's text */
            errno = 0;
            long long v = strtoll(p, &end, 10);
            if (end != p + w || (*p != '-' && (*p < '0' || *p > '9'))) {
                fprintf(stderr,
                        "ctorch tokenizer decode: --ids: '%.*s' is not an integer (ids are "
                        "decimal integers separated by spaces or commas)\n",
                        (int)(w < 64 ? w : 64), p);
                rc = 2;
                break;
            }
            if (errno == ERANGE || v < 0 || v >= nvocab) {
                fprintf(stderr,
                        "ctorch tokenizer decode: --ids: id %.*s is not in [0, %lld): ids must "
                        "be in [0, vocabulary size) of this tokenizer (%lld tokens)\n",
                        (int)(w < 64 ? w : 64), p, (long long)nvocab, (long long)nvocab);
                rc = 2;
                break;
            }
            ids[n++] = (int32_t)v;
            p = end;
        }
        char *out_text;
        size_t len;
        if (!rc && (s = ct_tokenizer_decode(t, ids, (int64_t)n, &out_text, &len)))
            rc = cli_fail("tokenizer decode", s);
        if (!rc) {
            fwrite(out_text, 1, len, stdout);
            printf("\n");
            ct_free(out_text);
        }
        free(ids);
    }
    ct_tokenizer_free(t);
    return rc;
}
