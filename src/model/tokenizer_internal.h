/* The tokenizer's shared representation: every format (ctorch's own BPE, Hugging Face
 * tokenizer.json, GPT-2's encoder.json + vocab.bpe) becomes the same tables, so encoding,
 * decoding and the bounds are written once (src/model/tokenizer.c). */
#ifndef CT_TOKENIZER_INTERNAL_H
#define CT_TOKENIZER_INTERNAL_H

#include "core/internal.h"
#include "ctorch/tokenizer.h"

#include <jansson.h>
#include <stdint.h>

enum { TOK_CTORCH, TOK_HF, TOK_GPT2 };
/* Pre-tokenizers: ctorch's own rule, none (the whole text is one piece), and the split regexes
 * of GPT-2, Llama 3 and Qwen2 (tokenizer_pretok.c). */
enum { PRE_CTORCH, PRE_NONE, PRE_GPT2, PRE_LLAMA3, PRE_QWEN2 };

struct ct_tokenizer {
    int format, pretok;
    int64_t vocab;     /* ids 0 .. vocab-1 */
    int64_t n_merges;  /* merge r (its rank) joins merges[3r], merges[3r+1] into merges[3r+2] */
    int32_t *merges;
    uint64_t *rank_key; /* open-addressed map pair key + 1 -> rank (0 = empty) */
    int32_t *rank_val;
    size_t rank_cap;
    char *bytes;  /* the bytes each id decodes to, back to back */
    size_t *off;  /* [vocab + 1] */
    int32_t byte_id[256]; /* the token of each single byte: where encoding starts */
    int32_t *tok_map; /* open-addressed map token bytes -> id + 1 (HF vocabularies) */
    size_t tok_cap;
    int32_t *special; /* ids matched in the text before splitting, longest first per byte */
    size_t n_special;
    uint32_t special_at[257]; /* special[special_at[b] .. special_at[b+1]) start with byte b */
    /* The special ids' bytes as a trie (ct_tok_special_match walks it: the work at a text
     * position is at most the longest special token, not the number of special tokens):
     * node 0 the root; the child of node x by byte b in an open-addressed map from key
     * (x << 8 | b) + 1 (0 = empty) to the child; trie_id[x] the special id spelled by x, or -1. */
    uint64_t *trie_key;
    int32_t *trie_child;
    size_t trie_cap;
    int32_t *trie_id;
    size_t trie_nodes;
    bool ignore_merges; /* a piece that is a token is that token (Llama 3's BPE) */
    bool nfc;           /* the tokenizer normalizes to NFC: refuse text that is not NFC */
    bool add_bos, add_eos;
    int32_t bos, eos; /* -1: none */
    char *json;       /* the HF / GPT-2 form as tokenizer.json text, for to_json */
};

/* Grow *p (of *cap elements of elem bytes) to hold need elements, doubling. */
ct_status ct_tok_grow(void **p, size_t *cap, size_t need, size_t elem);

static inline uint64_t ct_tok_hash64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* The ctorch-bpe tokenizer of n_merges [left, right] pairs (checked: each joins earlier
 * tokens, lengths bounded). */
ct_status ct_tok_build_ctorch(const int32_t *merges, int64_t n_merges, ct_tokenizer **out);

/* Build the rank table and check the merges; t->merges and t->n_merges set. */
ct_status ct_tok_build_ranks(ct_tokenizer *t);
/* Index the special ids by their first byte and build their trie (t->special, t->n_special
 * set; t->bytes, t->off hold their bytes). */
ct_status ct_tok_index_special(ct_tokenizer *t);
/* The special token that starts at s[i] (i < len): the longest, of two with the same bytes the
 * lower id; -1 if none. Leftmost-longest as Hugging Face's added-token matcher when called at
 * each position in turn. */
int32_t ct_tok_special_match(const ct_tokenizer *t, const unsigned char *s, size_t len, size_t i);
/* Id of a vocabulary token's bytes, -1 if none (t->tok_map built). */
int32_t ct_tok_lookup(const ct_tokenizer *t, const char *b, size_t n);
ct_status ct_tok_build_map(ct_tokenizer *t, int64_t n_ids);
uint64_t ct_tok_hash_bytes(const char *b, size_t n);

/* Read a whole regular file (at most CT_TOKENIZER_MAX_FILE_BYTES) into a NUL-terminated
 * ct_alloc'ed buffer. */
ct_status ct_tok_read_file(const char *path, char **buf, size_t *len);
ct_status ct_tok_json_no_nul(const char *text, size_t len, const char *what);

/* A Hugging Face tokenizer.json, parsed (root) and as text (len bytes, kept for to_json);
 * config: tokenizer_config.json text (NUL-terminated) or NULL; what names the input. */
ct_status ct_tok_from_hf_json(json_t *root, const char *text, size_t len, const char *config,
                              const char *what, ct_tokenizer **out);

/* End of the piece that starts at s[i] (i < len) under pre-tokenizer kind. */
size_t ct_pretok_end(int kind, const unsigned char *s, size_t len, size_t i);
/* Offset of the first byte where NFC could change the text, or len if there is none. */
size_t ct_nfc_unstable_at(const unsigned char *s, size_t len);
/* Append NFC(s[0..n)) to *out (*olen bytes used of *ocap, grown with ct_tok_grow);
 * tokenizer_nfc.c. */
ct_status ct_nfc_append(const unsigned char *s, size_t n, unsigned char **out, size_t *olen,
                        size_t *ocap);
extern const uint32_t ct_nfc_ccc[][3];
extern const size_t ct_nfc_ccc_n;
extern const uint32_t ct_nfc_decomp[][3];
extern const size_t ct_nfc_decomp_n;
extern const uint32_t ct_nfc_compose[][3];
extern const size_t ct_nfc_compose_n;
/* Decode one code point at s[i]: *n its bytes; an invalid byte is U+FFFFFFFF of 1 byte. */
uint32_t ct_utf8_at(const unsigned char *s, size_t len, size_t i, size_t *n);
/* Unicode classes of the pre-tokenizer regexes. */
bool ct_uni_is_letter(uint32_t cp);
bool ct_uni_is_number(uint32_t cp);
bool ct_uni_is_space(uint32_t cp);

extern const char ct_unicode_version[];
extern const uint32_t ct_uni_letter[][2];
extern const size_t ct_uni_letter_n;
extern const uint32_t ct_uni_number[][2];
extern const size_t ct_uni_number_n;
extern const uint32_t ct_uni_nfc_unstable[][2];
extern const size_t ct_uni_nfc_unstable_n;

/* The GPT-2 byte <-> unicode map of byte-level BPE: byte b is written as code point
 * ct_byte_char(b); ct_char_byte(cp) is the byte, -1 for a code point outside the map. */
uint32_t ct_byte_char(int b);
int ct_char_byte(uint32_t cp);

#endif
