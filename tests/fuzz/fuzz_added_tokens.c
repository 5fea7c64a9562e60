/* libFuzzer target: the added-token matcher (src/model/tokenizer.c: the special ids' trie that
 * ct_tok_special_match walks), against a naive reference inside the target: at every position
 * of the text, the longest special token that starts there, of two with the same bytes the
 * lower id, or none. Run at each position in turn that is Hugging Face's leftmost-longest
 * (tests/python/test_hardening_scale.py checks it against the tokenizers library). The input:
 * byte 0 the token count less one (1 + b % 64 tokens), then each token as its length less one
 * (1 + b % 24 bytes) and its bytes, the rest the text. Tokens may repeat, share prefixes or
 * hold any byte. Seeds: run_fuzz.sh writes a few. */
#include "model/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_REQUIRE(c)                                                                            \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_added_tokens: invariant failed: %s\n", #c);                      \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* The reference: every special token compared at position i. */
static int32_t naive_match(const ct_tokenizer *t, const unsigned char *s, size_t len, size_t i)
{
    int32_t best = -1;
    size_t best_n = 0;
    for (size_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        size_t n = t->off[id + 1] - t->off[id];
        if (n > len - i || memcmp(s + i, t->bytes + t->off[id], n)) continue;
        if (best < 0 || n > best_n || (n == best_n && id < best)) {
            best = id;
            best_n = n;
        }
    }
    return best;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    size_t ntok = 1 + data[0] % 64, at = 1;
    ct_tokenizer *t = NULL;
    if (ct_calloc((void **)&t, sizeof *t) != CT_OK) return 0;
    t->bos = t->eos = -1;
    size_t total = 0, n = 0;
    /* the tokens' lengths first (a short input gives fewer tokens) */
    size_t lens[64];
    for (size_t p = at; n < ntok && p < size;) {
        size_t l = 1 + data[p] % 24;
        if (p + 1 + l > size) break;
        lens[n++] = l;
        total += l;
        p += 1 + l;
    }
    if (!n || ct_alloc((void **)&t->bytes, total) != CT_OK ||
        ct_alloc((void **)&t->off, (n + 1) * sizeof *t->off) != CT_OK ||
        ct_alloc((void **)&t->special, n * sizeof *t->special) != CT_OK) {
        ct_tokenizer_free(t);
        return 0;
    }
    size_t o = 0;
    for (size_t k = 0; k < n; k++) {
        t->off[k] = o;
        memcpy(t->bytes + o, data + at + 1, lens[k]);
        o += lens[k];
        at += 1 + lens[k];
        t->special[k] = (int32_t)k;
    }
    t->off[n] = o;
    t->vocab = (int64_t)n;
    t->n_special = n;
    FUZZ_REQUIRE(ct_tok_index_special(t) == CT_OK);
    const unsigned char *s = data + at;
    size_t len = size - at;
    for (size_t i = 0; i < len; i++) {
        int32_t fast = ct_tok_special_match(t, s, len, i), ref = naive_match(t, s, len, i);
        if (fast != ref)
            fprintf(stderr, "fuzz_added_tokens: at %zu the trie says %d, the reference %d\n", i,
                    fast, ref);
        FUZZ_REQUIRE(fast == ref);
        /* the first-byte index the encoder consults before the trie agrees with it */
        FUZZ_REQUIRE(ref < 0 || t->special_at[s[i]] != t->special_at[s[i] + 1]);
    }
    ct_tokenizer_free(t);
    return 0;
}
