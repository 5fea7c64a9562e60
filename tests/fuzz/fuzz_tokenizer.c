/* libFuzzer target: tokenizer files of every format. The first byte picks the reader:
 * even = ct_tokenizer_from_json (ctorch-bpe or Hugging Face tokenizer.json, by content),
 * odd = ct_tokenizer_from_gpt2 with encoder.json and vocab.bpe split at the first NUL byte.
 * A tokenizer that loads must encode any text (the input itself, and a fixed sample) and
 * decode it back exactly, keep its ids in range, and reload from its own JSON. Seeds:
 * tests/fuzz/make_corpus_tokenizer.py (run_fuzz.sh runs it). */
#include "ctorch/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char SAMPLE[] = "Hello world, it's 2024!\n\n  \t<|endoftext|><s> caf\xc3\xa9 \xe6\x97\xa5"
                             "\xe6\x9c\xac 123456 DON'T\r\n\xff\xfe";

static void check_round_trip(const ct_tokenizer *t, const char *text, size_t len)
{
    int32_t *ids;
    int64_t n;
    if (ct_tokenizer_encode(t, text, len, &ids, &n) != CT_OK) return; /* e.g. out of memory for a huge text */
    int64_t V = ct_tokenizer_vocab_size(t);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) __builtin_trap();
    char *back;
    size_t blen;
    if (ct_tokenizer_decode(t, ids, n, &back, &blen) != CT_OK) __builtin_trap();
    if (blen != len || memcmp(back, text, len)) __builtin_trap();
    ct_free(back);
    ct_free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int mode = data[0] & 1;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    ct_tokenizer *t = NULL;
    if (mode == 0) {
        (void)ct_tokenizer_from_json(p, n, &t);
    } else {
        const char *nul = memchr(p, '\0', n);
        size_t en = nul ? (size_t)(nul - p) : n;
        (void)ct_tokenizer_from_gpt2(p, en, nul ? nul + 1 : "", nul ? n - en - 1 : 0, &t);
    }
    if (!t) return 0;
    int64_t V = ct_tokenizer_vocab_size(t);
    int32_t bos = ct_tokenizer_bos(t), eos = ct_tokenizer_eos(t);
    if (V <= 0 || bos >= V || eos >= V || bos < -1 || eos < -1) __builtin_trap();
    check_round_trip(t, SAMPLE, sizeof SAMPLE - 1);
    check_round_trip(t, p, n > 4096 ? 4096 : n);
    char *json;
    if (ct_tokenizer_to_json(t, &json) == CT_OK) {
        ct_tokenizer *u = NULL;
        if (ct_tokenizer_from_json(json, strlen(json), &u) != CT_OK) __builtin_trap();
        if (ct_tokenizer_vocab_size(u) != V || ct_tokenizer_eos(u) != eos) __builtin_trap();
        ct_tokenizer_free(u);
        ct_free(json);
    }
    ct_tokenizer_free(t);
    return 0;
}
