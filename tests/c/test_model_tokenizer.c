/* The byte-level BPE tokenizer: the merge rule on a worked example, round trips of any bytes,
 * pieces never merged across, determinism, files, EOS, bad files; the UTF-8 validator. */
#include "test_util.h"
#include "model/tokenizer_internal.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *SAMPLE =
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.\n"
    "Le renard brun saute par-dessus le chien paresseux: \xc3\xa9t\xc3\xa9, \xc3\xa0 la plage.\n"
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87\xe7\xab\xa0 and numbers 12345 "
    "67890, "
    "tabs\tand  double  spaces.\n<|endoftext|>A second document starts here.\n";

static ct_tokenizer *train(const char *text, int64_t vocab, int64_t minf)
{
    ct_bpe_options o = ct_bpe_options_default();
    o.vocab_size = vocab;
    o.min_frequency = minf;
    ct_tokenizer *t = NULL;
    CHECK_OK(ct_tokenizer_train(text, strlen(text), &o, &t));
    return t;
}

static void round_trip(const ct_tokenizer *t, const char *text, size_t len)
{
    int32_t *ids;
    int64_t n;
    char *back;
    size_t blen;
    CHECK_OK(ct_tokenizer_encode(t, text, len, &ids, &n));
    CHECK_OK(ct_tokenizer_decode(t, ids, n, &back, &blen));
    CHECK(blen == len && !memcmp(back, text, len));
    ct_free(ids);
    ct_free(back);
}

/* "aaabdaaabac": (a,a) occurs 4 times and is merged first; then (256,a) and (a,b) tie at 2
 * and the smaller pair (a,b) = (97,98) wins. */
static void test_worked_example(void)
{
    ct_tokenizer *t = train("aaabdaaabac", 259, 2);
    CHECK(ct_tokenizer_vocab_size(t) == 259);
    CHECK(ct_tokenizer_eos(t) == 258);
    const char *b;
    size_t n;
    CHECK_OK(ct_tokenizer_token_bytes(t, 256, &b, &n));
    CHECK(n == 2 && !memcmp(b, "aa", 2));
    CHECK_OK(ct_tokenizer_token_bytes(t, 257, &b, &n));
    CHECK(n == 2 && !memcmp(b, "ab", 2));
    CHECK_OK(ct_tokenizer_token_bytes(t, 258, &b, &n));
    CHECK(n == strlen(CT_TOKENIZER_EOS_TEXT));
    int32_t *ids;
    int64_t k;
    CHECK_OK(ct_tokenizer_encode(t, "aaab", 4, &ids, &k));
    CHECK(k == 2 && ids[0] == 256 && ids[1] == 257); /* "aa" + "ab": rank 0 first */
    ct_free(ids);
    CHECK_STATUS(ct_tokenizer_token_bytes(t, 259, &b, &n), CT_EINVAL);
    ct_tokenizer_free(t);
    /* min_frequency stops early: no pair occurs 5 times */
    t = train("aaabdaaabac", 1000, 5);
    CHECK(ct_tokenizer_vocab_size(t) == 257);
    ct_tokenizer_free(t);
}

static void test_round_trips(void)
{
    ct_tokenizer *t = train(SAMPLE, 400, 2);
    CHECK(ct_tokenizer_vocab_size(t) > 257 && ct_tokenizer_vocab_size(t) <= 400);
    round_trip(t, SAMPLE, strlen(SAMPLE));
    round_trip(t, "", 0);
    /* any bytes: NUL, invalid UTF-8, long runs (cut into 256-byte pieces) */
    char junk[3000];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (char)(t_next() & 0xFF);
    round_trip(t, junk, sizeof junk);
    memset(junk, 'e', sizeof junk);
    round_trip(t, junk, sizeof junk);
    memset(junk, ' ', sizeof junk);
    round_trip(t, junk, sizeof junk);
    /* EOS: the marker text becomes the EOS token and decodes back */
    int32_t *ids;
    int64_t n;
    const char *s = "dog<|endoftext|>fox";
    CHECK_OK(ct_tokenizer_encode(t, s, strlen(s), &ids, &n));
    int eos = 0;
    for (int64_t i = 0; i < n; i++)
        eos += ids[i] == ct_tokenizer_eos(t);
    CHECK(eos == 1);
    ct_free(ids);
    round_trip(t, s, strlen(s));
    /* decode rejects ids outside the vocabulary */
    int32_t bad[2] = {5, 100000};
    char *out;
    size_t len;
    CHECK_STATUS(ct_tokenizer_decode(t, bad, 2, &out, &len), CT_EINVAL);
    ct_tokenizer_free(t);
}

/* Merges never cross a piece boundary: "x" and " y" are separate pieces, so no token holds
 * "x y" however often it repeats; and the text compresses. */
static void test_pieces(void)
{
    char text[2000] = "";
    for (int i = 0; i < 200; i++)
        strcat(text, "x y ");
    ct_tokenizer *t = train(text, 300, 2);
    for (int32_t id = 256; id < ct_tokenizer_eos(t); id++) {
        const char *b;
        size_t n;
        CHECK_OK(ct_tokenizer_token_bytes(t, id, &b, &n));
        bool crosses = false;
        for (size_t i = 0; i + 1 < n; i++)
            crosses |= b[i] != ' ' && b[i + 1] == ' ';
        CHECK(!crosses);
    }
    int32_t *ids;
    int64_t n;
    CHECK_OK(ct_tokenizer_encode(t, text, strlen(text), &ids, &n));
    CHECK(n <= (int64_t)strlen(text) / 2 + 1); /* "x", then " y", " x", ... one token each */
    ct_free(ids);
    ct_tokenizer_free(t);
}

static void test_files(void)
{
    ct_tokenizer *a = train(SAMPLE, 350, 2), *b = train(SAMPLE, 350, 2), *c;
    char *ja, *jb, *jc;
    CHECK_OK(ct_tokenizer_to_json(a, &ja));
    CHECK_OK(ct_tokenizer_to_json(b, &jb));
    CHECK(!strcmp(ja, jb)); /* deterministic */
    char path[64];
    snprintf(path, sizeof path, "/tmp/ct_test_tok_%d.json", (int)getpid());
    CHECK_OK(ct_tokenizer_save(a, path));
    CHECK_OK(ct_tokenizer_load(path, &c));
    CHECK_OK(ct_tokenizer_to_json(c, &jc));
    CHECK(!strcmp(ja, jc));
    round_trip(c, SAMPLE, strlen(SAMPLE));
    remove(path);
    ct_tokenizer *d = NULL;
    CHECK_STATUS(ct_tokenizer_load(path, &d), CT_EIO);
    CHECK(d == NULL);
    const char *bad[] = {
        "not json",
        "{\"format\": \"other\", \"version\": 1, \"vocab_size\": 257, \"merges\": []}",
        "{\"format\": \"ctorch-bpe\", \"version\": 2, \"vocab_size\": 257, \"merges\": []}",
        "{\"format\": \"ctorch-bpe\", \"version\": 1, \"vocab_size\": 300, \"merges\": []}",
        "{\"format\": \"ctorch-bpe\", \"version\": 1, \"vocab_size\": 258, \"merges\": [[97, "
        "256]]}",
        "{\"format\": \"ctorch-bpe\", \"version\": 1, \"vocab_size\": 259, \"merges\": [[97, 98], "
        "[97, 98]]}",
        "{\"format\": \"ctorch-bpe\", \"version\": 1, \"vocab_size\": 258, \"merges\": [[97]]}",
        "{\"format\": \"ctorch-bpe\", \"version\": 1, \"vocab_size\": 258, \"merges\": [[-1, 2]]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_STATUS(ct_tokenizer_from_json(bad[i], strlen(bad[i]), &d), CT_EFORMAT);
    const char *ok = "{\"format\": \"ctorch-bpe\", \"version\": 1, \"vocab_size\": 258, "
                     "\"merges\": [[104, 105]]}";
    CHECK_OK(ct_tokenizer_from_json(ok, strlen(ok), &d));
    round_trip(d, "hi hi", 5);
    ct_tokenizer_free(d);
    ct_bpe_options o = ct_bpe_options_default();
    o.vocab_size = 256;
    CHECK_STATUS(ct_tokenizer_train("abc", 3, &o, &d), CT_EINVAL);
    o = ct_bpe_options_default();
    o.min_frequency = 0;
    CHECK_STATUS(ct_tokenizer_train("abc", 3, &o, &d), CT_EINVAL);
    ct_free(ja);
    ct_free(jb);
    ct_free(jc);
    ct_tokenizer_free(a);
    ct_tokenizer_free(b);
    ct_tokenizer_free(c);
}

/* A JSON file whose merge i joins token 255 + i with itself: token 256 + k has 2^(k+1) bytes. */
static char *doubling_json(int doublings)
{
    size_t cap = 128 + (size_t)doublings * 24;
    char *j = malloc(cap);
    int n = snprintf(j, cap,
                     "{\"format\": \"ctorch-bpe\", \"version\": 1, \"vocab_size\": %d, "
                     "\"merges\": [[65, 65]",
                     257 + doublings);
    for (int i = 1; i < doublings; i++)
        n += snprintf(j + n, cap - (size_t)n, ", [%d, %d]", 255 + i, 255 + i);
    snprintf(j + n, cap - (size_t)n, "]}");
    return j;
}

/* Issue 14: 63 doublings overflowed the length sum (heap-buffer-overflow), 33 asked for 17 GB.
 * Each token and the sum of all are bounded before anything is allocated for them. */
static void test_hostile_lengths(void)
{
    int cases[] = {12, 13, 33, 63, 64, 200};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *j = doubling_json(cases[c]);
        ct_tokenizer *t = NULL;
        if (cases[c] == 12) { /* a 4096-byte token, the largest allowed */
            CHECK_OK(ct_tokenizer_from_json(j, strlen(j), &t));
            const char *b;
            size_t n;
            CHECK_OK(ct_tokenizer_token_bytes(t, 256 + 11, &b, &n));
            CHECK(n == CT_TOKENIZER_MAX_TOKEN_BYTES && b[0] == 'A' && b[n - 1] == 'A');
            round_trip(t, b, n);
        } else {
            CHECK_STATUS(ct_tokenizer_from_json(j, strlen(j), &t), CT_EFORMAT);
            CHECK(t == NULL);
            CHECK(strstr(ct_last_error(), "at most 4096 bytes") != NULL);
        }
        ct_tokenizer_free(t);
        free(j);
    }
    /* many long tokens: the sum is bounded too. 128 chains of 11 merges make 'x' * 2048 for
     * 128 bytes x; then every pair of those is one 4096-byte token: 16384 x 4096 B = 64 MiB,
     * past the bound once the chains' own bytes are counted. */
    size_t nm = 128 * 11 + 128 * 128, cap = 160 + nm * 24;
    char *j = malloc(cap);
    int n = snprintf(j, cap,
                     "{\"format\": \"ctorch-bpe\", \"version\": 1, \"vocab_size\": %zu, "
                     "\"merges\": [",
                     257 + nm);
    int32_t next = 256, top[128];
    for (int c = 0; c < 128; c++) {
        int32_t cur = 128 + c;
        for (int k = 0; k < 11; k++) {
            n += snprintf(j + n, cap - (size_t)n, "%s[%d, %d]", next > 256 ? ", " : "", cur, cur);
            cur = next++;
        }
        top[c] = cur;
    }
    for (int a = 0; a < 128; a++)
        for (int b = 0; b < 128; b++)
            n += snprintf(j + n, cap - (size_t)n, ", [%d, %d]", top[a], top[b]);
    snprintf(j + n, cap - (size_t)n, "]}");
    ct_tokenizer *t = NULL;
    CHECK_STATUS(ct_tokenizer_from_json(j, strlen(j), &t), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "add up to more than 64 MiB") != NULL);
    free(j);
}

/* The file's "eos" is honoured or refused, never ignored; save never follows a planted name. */
static void test_eos_and_save(void)
{
    const char *other = "{\"format\": \"ctorch-bpe\", \"version\": 1, \"vocab_size\": 257, "
                        "\"eos\": \"</s>\", \"merges\": []}";
    const char *num = "{\"format\": \"ctorch-bpe\", \"version\": 1, \"vocab_size\": 257, "
                      "\"eos\": 5, \"merges\": []}";
    ct_tokenizer *t = NULL;
    CHECK_STATUS(ct_tokenizer_from_json(other, strlen(other), &t), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "eos") != NULL);
    CHECK_STATUS(ct_tokenizer_from_json(num, strlen(num), &t), CT_EFORMAT);
    t = train(SAMPLE, 300, 2);
    char dir[64], path[96], planted[128], victim[96];
    snprintf(dir, sizeof dir, "/tmp/ct_test_toksave_%d", (int)getpid());
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/tok.json", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    FILE *f = fopen(victim, "w");
    fputs("keep", f);
    fclose(f);
    /* the old writer opened PATH.tmp.PID with fopen: a link planted there was followed */
    snprintf(planted, sizeof planted, "%s.tmp.%d", path, (int)getpid());
    CHECK(symlink(victim, planted) == 0);
    CHECK_OK(ct_tokenizer_save(t, path));
    char buf[8] = {0};
    f = fopen(victim, "r");
    CHECK(fread(buf, 1, sizeof buf - 1, f) == 4 && !strcmp(buf, "keep"));
    fclose(f);
    ct_tokenizer *u = NULL;
    CHECK_OK(ct_tokenizer_load(path, &u));
    CHECK(ct_tokenizer_vocab_size(u) == ct_tokenizer_vocab_size(t));
    ct_tokenizer_free(u);
    /* nothing but the three names is left in the folder */
    DIR *d = opendir(dir);
    int count = 0;
    for (struct dirent *e; (e = readdir(d));)
        count += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    CHECK(count == 3);
    /* a folder given as the tokenizer file is an error, not an empty tokenizer */
    CHECK(ct_tokenizer_load(dir, &u) != CT_OK && u == NULL);
    CHECK_STATUS(ct_tokenizer_save(t, dir), CT_EIO);
    unlink(planted);
    unlink(victim);
    unlink(path);
    rmdir(dir);
    ct_tokenizer_free(t);
}

/* A small byte-level tokenizer.json: the 256 byte tokens (id = byte), then "he", "ll", "llo",
 * " w" (written "\u0120w"), and the added token "<s>". */
static json_t *hf_small(void)
{
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        uint32_t cp = ct_byte_char(b); /* < U+0800: one or two UTF-8 bytes */
        char u[3] = {(char)cp, 0, 0};
        if (cp >= 0x80) u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F));
        json_object_set_new(vocab, u, json_integer(b));
    }
    json_object_set_new(vocab, "he", json_integer(256));
    json_object_set_new(vocab, "ll", json_integer(257));
    json_object_set_new(vocab, "llo", json_integer(258));
    json_object_set_new(vocab, "\u0120w", json_integer(259));
    return json_pack("{s:[{s:i, s:s, s:b}], s:n, s:{s:s, s:b}, s:{s:s}, s:{s:s, s:o, s:[s, s, [s, s], s]}}",
                     "added_tokens", "id", 260, "content", "<s>", "special", 1, "normalizer",
                     "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0, "decoder",
                     "type", "ByteLevel", "model", "type", "BPE", "vocab", vocab, "merges", "h e",
                     "l l", "ll", "o", "\u0120 w");
}

static ct_status hf_load(json_t *j, ct_tokenizer **t)
{
    char *text = json_dumps(j, JSON_COMPACT);
    ct_status s = ct_tokenizer_from_json(text, strlen(text), t);
    free(text);
    json_decref(j);
    return s;
}

static void test_hf_files(void)
{
    ct_tokenizer *t = NULL;
    CHECK_OK(hf_load(hf_small(), &t));
    CHECK(!strcmp(ct_tokenizer_format(t), "hf-bpe") && ct_tokenizer_vocab_size(t) == 261);
    int32_t *ids;
    int64_t n;
    const char *text = "hello world<s>hell";
    CHECK_OK(ct_tokenizer_encode(t, text, strlen(text), &ids, &n));
    int32_t want[] = {256, 258, 259, 'o', 'r', 'l', 'd', 260, 256, 257};
    CHECK(n == 10 && !memcmp(ids, want, sizeof want));
    ct_free(ids);
    round_trip(t, text, strlen(text));
    char junk[2000];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (char)(t_next() & 0xFF);
    round_trip(t, junk, sizeof junk); /* any bytes, long pieces through the heap merge */
    memset(junk, 'l', sizeof junk);
    CHECK_OK(ct_tokenizer_encode(t, junk, sizeof junk, &ids, &n));
    CHECK(n == (int64_t)sizeof junk / 2 && ids[0] == 257 && ids[n - 1] == 257);
    ct_free(ids);
    int32_t id;
    CHECK_OK(ct_tokenizer_token_id(t, "<s>", 3, &id));
    CHECK(id == 260 && ct_tokenizer_bos(t) == -1);
    ct_tokenizer_free(t);

    /* each rule broken once: the status and a message naming it */
    struct {
        const char *what, *path, *value, *needle;
        ct_status want;
    } bad[] = {
        {"model type", "model.type", "\"WordPiece\"", "WordPiece", CT_EUNSUPPORTED},
        {"unknown regex", "pre_tokenizer",
         "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
         "{\"Regex\":\"\\\\w+\"},\"behavior\":\"Isolated\",\"invert\":false},"
         "{\"type\":\"ByteLevel\",\"use_regex\":false}]}",
         "split regex", CT_EUNSUPPORTED},
        {"normalizer", "normalizer", "{\"type\":\"Lowercase\"}", "Lowercase", CT_EUNSUPPORTED},
        {"prefix space", "pre_tokenizer", "{\"type\":\"ByteLevel\",\"add_prefix_space\":true}",
         "add_prefix_space", CT_EUNSUPPORTED},
        {"lstrip", "added_tokens",
         "[{\"id\":260,\"content\":\"<s>\",\"lstrip\":true}]", "strips", CT_EUNSUPPORTED},
        {"id gap", "added_tokens", "[{\"id\":262,\"content\":\"<s>\"}]", "no token has id 260",
         CT_EFORMAT},
        {"two added on one id", "added_tokens",
         "[{\"id\":260,\"content\":\"<s>\"},{\"id\":260,\"content\":\"<t>\"}]", "two added",
         CT_EFORMAT},
        {"huge id", "added_tokens", "[{\"id\":99999999,\"content\":\"<s>\"}]", "2^21", CT_EFORMAT},
        {"empty added", "added_tokens", "[{\"id\":260,\"content\":\"\"}]", "bytes", CT_EFORMAT},
        {"merge result", "model.merges", "[\"h l\"]", "the result", CT_EFORMAT},
        {"merge part", "model.merges", "[\"hx e\"]", "the first part", CT_EFORMAT},
        {"merge form", "model.merges", "[\"h e l\"]", "must be", CT_EFORMAT},
        {"merge repeated", "model.merges", "[\"h e\", [\"h\", \"e\"]]", "repeats", CT_EFORMAT},
        {"no vocab", "model.vocab", "[]", "vocab", CT_EFORMAT},
        {"byte missing", "model.vocab.A", "300", "no token has id 65", CT_EFORMAT},
        {"decoder", "decoder", "{\"type\":\"WordPiece\"}", "decoder", CT_EUNSUPPORTED},
        {"template", "post_processor", "{\"type\":\"BertProcessing\"}", "BertProcessing",
         CT_EUNSUPPORTED},
        {"byte fallback", "model.byte_fallback", "true", "byte_fallback", CT_EUNSUPPORTED},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        json_t *j = hf_small(), *o = j;
        char path[64];
        snprintf(path, sizeof path, "%s", bad[k].path);
        char *key = path, *dot;
        while ((dot = strchr(key, '.'))) {
            *dot = '\0';
            o = json_object_get(o, key);
            key = dot + 1;
        }
        json_object_set_new(o, key, json_loads(bad[k].value, JSON_DECODE_ANY, NULL));
        t = NULL;
        CHECK_STATUS(hf_load(j, &t), bad[k].want);
        CHECK(t == NULL);
        if (!strstr(ct_last_error(), bad[k].needle))
            fprintf(stderr, "%s: message '%s' lacks '%s'\n", bad[k].what, ct_last_error(),
                    bad[k].needle);
        CHECK(strstr(ct_last_error(), bad[k].needle) != NULL);
    }
    /* a token past the length bound */
    json_t *j = hf_small();
    char *longtok = malloc(5000);
    memset(longtok, 'a', 4999);
    longtok[4999] = '\0';
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), longtok,
                        json_integer(261));
    free(longtok);
    CHECK_STATUS(hf_load(j, &t), CT_EFORMAT);
    /* NFC: e + U+0301 encodes as the precomposed U+00E9 (tests/python/test_tokenizers.py
     * compares with Hugging Face tokenizers) */
    j = hf_small();
    json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "NFC"));
    CHECK_OK(hf_load(j, &t));
    const char *ok = "caf\xc3\xa9 \xe6\x97\xa5", *no = "cafe\xcc\x81 \xe6\x97\xa5";
    int32_t *ids2;
    int64_t n2;
    CHECK_OK(ct_tokenizer_encode(t, ok, strlen(ok), &ids, &n));
    CHECK_OK(ct_tokenizer_encode(t, no, strlen(no), &ids2, &n2));
    CHECK(n == n2 && !memcmp(ids, ids2, (size_t)n * sizeof *ids));
    ct_free(ids);
    ct_free(ids2);
    ct_tokenizer_free(t);
    /* a raw NUL between JSON tokens (Jansson lets one through after a number): refused before anything keeps
     * the text, which once made ct_tokenizer_to_json write a cut-off file (found by fuzzing) */
    {
        json_t *h = hf_small();
        char *jtext = json_dumps(h, JSON_COMPACT);
        json_decref(h);
        size_t tl = strlen(jtext);
        char *withnul = malloc(tl + 1);
        const char *num = strstr(jtext, ":260"); /* after a number is where Jansson lets it by */
        CHECK(num != NULL);
        size_t at = (size_t)(num + 4 - jtext);
        memcpy(withnul, jtext, at);
        withnul[at] = '\0';
        memcpy(withnul + at + 1, jtext + at, tl - at);
        t = NULL;
        CHECK_STATUS(ct_tokenizer_from_json(withnul, tl + 1, &t), CT_EFORMAT);
        CHECK(t == NULL);
        char nulmsg[64];
        snprintf(nulmsg, sizeof nulmsg, "NUL byte at offset %zu", at);
        CHECK(strstr(ct_last_error(), nulmsg) != NULL);
        CHECK_STATUS(ct_tokenizer_from_gpt2(withnul, tl + 1, "", 0, &t), CT_EFORMAT);
        CHECK(strstr(ct_last_error(), "encoder.json holds a NUL byte") != NULL);
        free(withnul);
        free(jtext);
    }
    /* a JSON that is neither format */
    CHECK_STATUS(ct_tokenizer_from_json("{\"a\": 1}", 8, &t), CT_EFORMAT);
    /* GPT-2's pair from memory */
    const char *enc = "{\"a\": 0, \"b\": 1}", *bpe = "#version: 0.2\na b\n";
    CHECK_STATUS(ct_tokenizer_from_gpt2(enc, strlen(enc), bpe, strlen(bpe), &t), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "no token for byte 0x00") != NULL);
}

static void test_utf8(void)
{
    size_t off = 99;
    CHECK(ct_utf8_valid(SAMPLE, strlen(SAMPLE), &off));
    CHECK(ct_utf8_valid("", 0, NULL));
    CHECK(ct_utf8_valid("\xf0\x9f\x98\x80", 4, NULL)); /* U+1F600 */
    struct {
        const char *s;
        size_t at;
    } bad[] = {{"ab\xc0\x80", 2},  {"\xed\xa0\x80", 0}, {"x\xf4\x90\x80\x80", 1},
               {"abc\xe6\x97", 3}, {"\x80", 0},         {"a\xff", 1},
               {"\xc3(", 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(!ct_utf8_valid(bad[i].s, strlen(bad[i].s), &off));
        CHECK(off == bad[i].at);
    }
}

int main(void)
{
    test_worked_example();
    test_round_trips();
    test_pieces();
    test_files();
    test_utf8();
    test_hostile_lengths();
    test_eos_and_save();
    test_hf_files();
    return t_report("test_model_tokenizer");
}
