/* The tokenizer: one representation for every format (tokenizer_internal.h), encoding with
 * special tokens matched first, then pieces, then merges by rank; decoding; the ctorch-bpe
 * file format; loading files and folders of every format. */
#include "model/tokenizer_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EOS_LEN (sizeof CT_TOKENIZER_EOS_TEXT - 1)
#define SHORT_PIECE 64 /* pieces up to this many bytes merge by rescanning; longer by a heap */

ct_status ct_tok_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return CT_OK;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem) return ct_error(CT_ENOMEM, "tokenizer: array too large");
        nc *= 2;
    }
    void *q;
    CT_TRY(ct_alloc(&q, nc * elem));
    if (*p) memcpy(q, *p, *cap * elem);
    ct_free(*p);
    *p = q;
    *cap = nc;
    return CT_OK;
}

static inline uint64_t pair_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

uint64_t ct_tok_hash_bytes(const char *b, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < n; k++)
        h = (h ^ (unsigned char)b[k]) * 1099511628211ull;
    return ct_tok_hash64(h);
}

/* ---- UTF-8 ------------------------------------------------------------------------------- */

/* ---- UTF-8 ------------------------------------------------------------------------------- */

bool ct_utf8_valid(const char *text, size_t len, size_t *bad_offset)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            n = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            n = 4, cp = c & 0x07, min = 0x10000;
        } else {
            goto bad;
        }
        if (i + n > len) goto bad;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) goto bad;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto bad;
        i += n;
    }
    return true;
bad:
    if (bad_offset) *bad_offset = i;
    return false;
}

/* ---- tables ------------------------------------------------------------------------------ */

void ct_tokenizer_free(ct_tokenizer *t)
{
    if (!t) return;
    ct_free(t->merges);
    ct_free(t->rank_key);
    ct_free(t->rank_val);
    ct_free(t->bytes);
    ct_free(t->off);
    ct_free(t->tok_map);
    ct_free(t->special);
    ct_free(t->trie_key);
    ct_free(t->trie_child);
    ct_free(t->trie_id);
    ct_free(t->json);
    ct_free(t);
}

static inline int32_t rank_of(const ct_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = pair_key(a, b) + 1; /* +1: keys are never 0 (the empty mark) */
    size_t s = ct_tok_hash64(key) & (t->rank_cap - 1);
    while (t->rank_key[s]) {
        if (t->rank_key[s] == key) return t->rank_val[s];
        s = (s + 1) & (t->rank_cap - 1);
    }
    return -1;
}

ct_status ct_tok_build_ranks(ct_tokenizer *t)
{
    t->rank_cap = 16;
    while (t->rank_cap < 2 * (size_t)(t->n_merges + 1))
        t->rank_cap *= 2;
    CT_TRY(ct_calloc((void **)&t->rank_key, t->rank_cap * sizeof(uint64_t)));
    CT_TRY(ct_alloc((void **)&t->rank_val, t->rank_cap * sizeof(int32_t)));
    for (int64_t i = 0; i < t->n_merges; i++) {
        int32_t a = t->merges[3 * i], b = t->merges[3 * i + 1];
        if (rank_of(t, a, b) >= 0)
            return ct_error(CT_EFORMAT, "tokenizer: merge %lld [%d, %d] repeats an earlier merge",
                            (long long)i, a, b);
        uint64_t key = pair_key(a, b) + 1;
        size_t slot = ct_tok_hash64(key) & (t->rank_cap - 1);
        while (t->rank_key[slot])
            slot = (slot + 1) & (t->rank_cap - 1);
        t->rank_key[slot] = key;
        t->rank_val[slot] = (int32_t)i;
    }
    return CT_OK;
}

ct_status ct_tok_build_map(ct_tokenizer *t, int64_t n_ids)
{
    t->tok_cap = 16;
    while (t->tok_cap < 2 * (size_t)(n_ids + 1))
        t->tok_cap *= 2;
    CT_TRY(ct_calloc((void **)&t->tok_map, t->tok_cap * sizeof(int32_t)));
    for (int64_t id = 0; id < n_ids; id++) {
        const char *b = t->bytes + t->off[id];
        size_t n = t->off[id + 1] - t->off[id];
        size_t s = ct_tok_hash_bytes(b, n) & (t->tok_cap - 1);
        while (t->tok_map[s]) {
            int32_t o = t->tok_map[s] - 1;
            if (t->off[o + 1] - t->off[o] == n && !memcmp(t->bytes + t->off[o], b, n)) break;
            s = (s + 1) & (t->tok_cap - 1);
        }
        if (!t->tok_map[s]) t->tok_map[s] = (int32_t)id + 1; /* a repeat keeps the first id */
    }
    return CT_OK;
}

int32_t ct_tok_lookup(const ct_tokenizer *t, const char *b, size_t n)
{
    if (!t->tok_map) return -1;
    size_t s = ct_tok_hash_bytes(b, n) & (t->tok_cap - 1);
    while (t->tok_map[s]) {
        int32_t o = t->tok_map[s] - 1;
        if (t->off[o + 1] - t->off[o] == n && !memcmp(t->bytes + t->off[o], b, n)) return o;
        s = (s + 1) & (t->tok_cap - 1);
    }
    return -1;
}

static int cmp_special(const void *x, const void *y, void *ctx)
{
    const ct_tokenizer *t = ctx;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    unsigned char fa = (unsigned char)t->bytes[t->off[a]], fb = (unsigned char)t->bytes[t->off[b]];
    if (fa != fb) return fa < fb ? -1 : 1;
    size_t la = t->off[a + 1] - t->off[a], lb = t->off[b + 1] - t->off[b];
    if (la != lb) return la > lb ? -1 : 1; /* longest first */
    return a < b ? -1 : a > b;
}

static inline int32_t trie_next(const ct_tokenizer *t, int32_t x, unsigned char b)
{
    uint64_t key = ((uint64_t)(uint32_t)x << 8 | b) + 1;
    size_t mask = t->trie_cap - 1, h = ct_tok_hash64(key) & mask;
    while (t->trie_key[h]) {
        if (t->trie_key[h] == key) return t->trie_child[h];
        h = (h + 1) & mask;
    }
    return -1;
}

static ct_status build_trie(ct_tokenizer *t)
{
    ct_free(t->trie_key);
    ct_free(t->trie_child);
    ct_free(t->trie_id);
    t->trie_key = NULL;
    t->trie_child = NULL;
    t->trie_id = NULL;
    t->trie_cap = t->trie_nodes = 0;
    size_t total = 0; /* bytes of all special tokens: a bound on the edges (tokenizer caps) */
    for (size_t k = 0; k < t->n_special; k++)
        total += t->off[t->special[k] + 1] - t->off[t->special[k]];
    if (total >= INT32_MAX / 2)
        return ct_error(CT_EFORMAT, "tokenizer: the special tokens hold %zu bytes, more than %d",
                        total, INT32_MAX / 2);
    size_t cap = 16;
    while (cap < 2 * total + 2)
        cap *= 2;
    CT_TRY(ct_calloc((void **)&t->trie_key, cap * sizeof *t->trie_key));
    CT_TRY(ct_calloc((void **)&t->trie_child, cap * sizeof *t->trie_child));
    CT_TRY(ct_alloc((void **)&t->trie_id, (total + 1) * sizeof *t->trie_id));
    t->trie_cap = cap;
    t->trie_id[0] = -1;
    t->trie_nodes = 1;
    for (size_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k], x = 0;
        for (size_t j = t->off[id]; j < t->off[id + 1]; j++) {
            unsigned char b = (unsigned char)t->bytes[j];
            int32_t c = trie_next(t, x, b);
            if (c < 0) {
                uint64_t key = ((uint64_t)(uint32_t)x << 8 | b) + 1;
                size_t mask = cap - 1, h = ct_tok_hash64(key) & mask;
                while (t->trie_key[h])
                    h = (h + 1) & mask;
                c = (int32_t)t->trie_nodes++;
                t->trie_key[h] = key;
                t->trie_child[h] = c;
                t->trie_id[c] = -1;
            }
            x = c;
        }
        if (x && (t->trie_id[x] < 0 || id < t->trie_id[x])) t->trie_id[x] = id;
    }
    return CT_OK;
}

int32_t ct_tok_special_match(const ct_tokenizer *t, const unsigned char *s, size_t len, size_t i)
{
    if (!t->trie_nodes) return -1;
    int32_t best = -1, x = 0;
    for (size_t k = i; k < len; k++) {
        if ((x = trie_next(t, x, s[k])) < 0) break;
        if (t->trie_id[x] >= 0) best = t->trie_id[x]; /* a longer one wins */
    }
    return best;
}

ct_status ct_tok_index_special(ct_tokenizer *t)
{
    if (t->n_special) qsort_r(t->special, t->n_special, sizeof(int32_t), cmp_special, t);
    size_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (b < 256 && k < t->n_special && (unsigned char)t->bytes[t->off[t->special[k]]] < b)
            k++;
        t->special_at[b] = (uint32_t)k;
    }
    t->special_at[256] = (uint32_t)t->n_special;
    return build_trie(t);
}

ct_status ct_tok_build_ctorch(const int32_t *merges, int64_t n_merges, ct_tokenizer **out)
{
    *out = NULL;
    ct_tokenizer *t;
    CT_TRY(ct_calloc((void **)&t, sizeof *t));
    t->format = TOK_CTORCH;
    t->pretok = PRE_CTORCH;
    t->n_merges = n_merges;
    int64_t V = 257 + n_merges;
    t->vocab = V;
    t->bos = -1;
    t->eos = (int32_t)(V - 1);
    ct_status s;
    if ((s = ct_alloc((void **)&t->merges, (size_t)(3 * n_merges + 1) * sizeof(int32_t))) ||
        (s = ct_alloc((void **)&t->off, (size_t)(V + 1) * sizeof(size_t))) ||
        (s = ct_alloc((void **)&t->special, sizeof(int32_t))))
        goto fail;
    for (int64_t i = 0; i < n_merges; i++) {
        int32_t a = merges[2 * i], b = merges[2 * i + 1];
        if (a < 0 || b < 0 || a >= 256 + i || b >= 256 + i) {
            s = ct_error(CT_EFORMAT,
                         "tokenizer: merge %lld joins [%d, %d], but only tokens below %lld "
                         "exist before it",
                         (long long)i, a, b, (long long)(256 + i));
            goto fail;
        }
        t->merges[3 * i] = a;
        t->merges[3 * i + 1] = b;
        t->merges[3 * i + 2] = (int32_t)(256 + i);
    }
    if ((s = ct_tok_build_ranks(t))) goto fail;
    /* token byte strings: offsets first, then the bytes. A merge joins two tokens, so a
     * hostile file can double a length with each merge: bound each token and the sum before
     * anything is allocated for them. */
    t->off[0] = 0;
    for (int64_t id = 0; id < V; id++) {
        size_t n = 1;
        if (id == V - 1) {
            n = EOS_LEN;
        } else if (id >= 256) {
            int32_t a = merges[2 * (id - 256)], b = merges[2 * (id - 256) + 1];
            n = (t->off[a + 1] - t->off[a]) + (t->off[b + 1] - t->off[b]);
            if (n > CT_TOKENIZER_MAX_TOKEN_BYTES) {
                s = ct_error(CT_EFORMAT,
                             "tokenizer: merge %lld [%d, %d] makes a token of %zu bytes; "
                             "tokens are at most %d bytes",
                             (long long)(id - 256), a, b, n, CT_TOKENIZER_MAX_TOKEN_BYTES);
                goto fail;
            }
        }
        if (t->off[id] + n > CT_TOKENIZER_MAX_TOTAL_BYTES) {
            s = ct_error(CT_EFORMAT,
                         "tokenizer: the tokens' bytes add up to more than %d MiB (at token "
                         "%lld)",
                         CT_TOKENIZER_MAX_TOTAL_BYTES >> 20, (long long)id);
            goto fail;
        }
        t->off[id + 1] = t->off[id] + n;
    }
    size_t total = t->off[V];
    if ((s = ct_alloc((void **)&t->bytes, total + 1))) goto fail;
    for (int64_t id = 0; id < V; id++) {
        char *d = t->bytes + t->off[id];
        if (id < 256) {
            *d = (char)id;
        } else if (id == V - 1) {
            memcpy(d, CT_TOKENIZER_EOS_TEXT, EOS_LEN);
        } else {
            int32_t a = merges[2 * (id - 256)], b = merges[2 * (id - 256) + 1];
            size_t na = t->off[a + 1] - t->off[a];
            memcpy(d, t->bytes + t->off[a], na);
            memcpy(d + na, t->bytes + t->off[b], t->off[b + 1] - t->off[b]);
        }
    }
    t->bytes[total] = '\0';
    for (int b = 0; b < 256; b++)
        t->byte_id[b] = b;
    t->special[0] = t->eos;
    t->n_special = 1;
    if ((s = ct_tok_index_special(t))) goto fail;
    *out = t;
    return CT_OK;
fail:
    ct_tokenizer_free(t);
    return s;
}

/* ---- queries ------------------------------------------------------------------------------- */

int64_t ct_tokenizer_vocab_size(const ct_tokenizer *t)
{
    return t ? t->vocab : 0;
}

int32_t ct_tokenizer_eos(const ct_tokenizer *t)
{
    return t ? t->eos : -1;
}

int32_t ct_tokenizer_bos(const ct_tokenizer *t)
{
    return t ? t->bos : -1;
}

bool ct_tokenizer_add_bos(const ct_tokenizer *t)
{
    return t && t->add_bos && t->bos >= 0;
}

bool ct_tokenizer_add_eos(const ct_tokenizer *t)
{
    return t && t->add_eos && t->eos >= 0;
}

const char *ct_tokenizer_format(const ct_tokenizer *t)
{
    if (!t) return "";
    return t->format == TOK_CTORCH ? "ctorch-bpe" : t->format == TOK_HF ? "hf-bpe" : "gpt2-bpe";
}

ct_status ct_tokenizer_token_bytes(const ct_tokenizer *t, int32_t id, const char **bytes,
                                   size_t *len)
{
    if (!t || !bytes || !len)
        return ct_error(CT_EINVAL, "ct_tokenizer_token_bytes: arguments must not be NULL");
    if (id < 0 || id >= t->vocab)
        return ct_error(CT_EINVAL,
                        "ct_tokenizer_token_bytes: id %d is outside the vocabulary [0, %lld)", id,
                        (long long)t->vocab);
    *bytes = t->bytes + t->off[id];
    *len = t->off[id + 1] - t->off[id];
    return CT_OK;
}

ct_status ct_tokenizer_token_id(const ct_tokenizer *t, const char *bytes, size_t len,
                                int32_t *id)
{
    if (!t || !id || (len && !bytes))
        return ct_error(CT_EINVAL, "ct_tokenizer_token_id: arguments must not be NULL");
    *id = -1;
    for (size_t k = 0; k < t->n_special; k++) {
        int32_t s = t->special[k];
        if (t->off[s + 1] - t->off[s] == len && !memcmp(t->bytes + t->off[s], bytes, len)) {
            *id = s;
            return CT_OK;
        }
    }
    if (t->tok_map) {
        *id = ct_tok_lookup(t, bytes, len);
    } else {
        for (int64_t k = 0; k < t->vocab && *id < 0; k++)
            if (t->off[k + 1] - t->off[k] == len && !memcmp(t->bytes + t->off[k], bytes, len))
                *id = (int32_t)k;
    }
    if (*id < 0) return ct_error(CT_EINVAL, "ct_tokenizer_token_id: no token has these %zu bytes", len);
    return CT_OK;
}

/* ---- encoding ------------------------------------------------------------------------------ */

/* A cache of the tokens of pieces met before in the same call (words repeat: most pieces of a
 * text are merged once). Slots hold the piece's place in the text and its tokens' place in
 * the output; it stops taking entries when half full. */
#define CACHE_SLOTS 65536
#define CACHE_MAX_PIECE 48
typedef struct {
    uint64_t hash;   /* 0: empty */
    uint32_t at, len; /* the piece: text[at .. at + len) */
    uint32_t out, n;  /* its tokens: ids[out .. out + n) of the first time it was met */
} cache_slot;

typedef struct {
    int32_t *ids;
    size_t n, cap;
    int32_t *work; /* the heap merge's symbols and links */
    uint64_t *heap;
    size_t wcap, heapcap;
    cache_slot *cache;
    size_t cached;
} enc;

static inline ct_status emit(enc *e, int32_t id)
{
    if (e->n == e->cap) CT_TRY(ct_tok_grow((void **)&e->ids, &e->cap, e->n + 1, sizeof(int32_t)));
    e->ids[e->n++] = id;
    return CT_OK;
}

/* Heap entries: rank in the high 32 bits, position in the low: the smallest is the merge of
 * lowest rank, leftmost among equals (Hugging Face's order). */
static void heap_up(uint64_t *h, size_t i)
{
    while (i && h[i] < h[(i - 1) / 2]) {
        uint64_t x = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = x;
        i = (i - 1) / 2;
    }
}

static void heap_down(uint64_t *h, size_t n)
{
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l] < h[m]) m = l;
        if (r < n && h[r] < h[m]) m = r;
        if (m == i) return;
        uint64_t x = h[i];
        h[i] = h[m];
        h[m] = x;
        i = m;
    }
}

/* Merge a long piece in O(n log n): symbols in a linked list, candidate merges in a heap,
 * stale entries skipped when popped. */
static ct_status merge_long(const ct_tokenizer *t, enc *e, const unsigned char *p, size_t n)
{
    CT_TRY(ct_tok_grow((void **)&e->work, &e->wcap, 3 * n, sizeof(int32_t)));
    int32_t *id = e->work, *prev = id + n, *next = prev + n;
    ct_status s = CT_OK;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        id[i] = t->byte_id[p[i]];
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    if ((s = ct_tok_grow((void **)&e->heap, &e->heapcap, n + 1, sizeof(uint64_t)))) goto out;
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t r = rank_of(t, id[i], id[i + 1]);
        if (r >= 0) {
            e->heap[hn] = ((uint64_t)(uint32_t)r << 32) | i;
            heap_up(e->heap, hn++);
        }
    }
    while (hn) {
        uint64_t top = e->heap[0];
        e->heap[0] = e->heap[--hn];
        heap_down(e->heap, hn);
        int32_t r = (int32_t)(top >> 32), pos = (int32_t)(uint32_t)top;
        if (id[pos] < 0 || next[pos] < 0) continue;
        int32_t q = next[pos];
        if (rank_of(t, id[pos], id[q]) != r) continue; /* stale */
        id[pos] = t->merges[3 * r + 2];
        id[q] = -1;
        next[pos] = next[q];
        if (next[q] >= 0) prev[next[q]] = pos;
        if ((s = ct_tok_grow((void **)&e->heap, &e->heapcap, hn + 2, sizeof(uint64_t)))) goto out;
        if (prev[pos] >= 0) {
            int32_t rr = rank_of(t, id[prev[pos]], id[pos]);
            if (rr >= 0) {
                e->heap[hn] = ((uint64_t)(uint32_t)rr << 32) | (uint32_t)prev[pos];
                heap_up(e->heap, hn++);
            }
        }
        if (next[pos] >= 0) {
            int32_t rr = rank_of(t, id[pos], id[next[pos]]);
            if (rr >= 0) {
                e->heap[hn] = ((uint64_t)(uint32_t)rr << 32) | (uint32_t)pos;
                heap_up(e->heap, hn++);
            }
        }
    }
    for (int32_t i = 0; i >= 0 && s == CT_OK; i = next[i])
        s = emit(e, id[i]);
out:
    return s;
}

/* The tokens of one piece: the merge of lowest rank among adjacent pairs, applied to every
 * occurrence left to right, until none applies (the GPT-2 procedure). */
static ct_status encode_piece(const ct_tokenizer *t, enc *e, const unsigned char *p, size_t n)
{
    if (n == 0) return CT_OK;
    if (n == 1) return emit(e, t->byte_id[p[0]]);
    if (t->ignore_merges) {
        int32_t id = ct_tok_lookup(t, (const char *)p, n);
        if (id >= 0) return emit(e, id);
    }
    if (n > SHORT_PIECE) return merge_long(t, e, p, n);
    int32_t s[SHORT_PIECE];
    size_t m = n;
    for (size_t i = 0; i < n; i++)
        s[i] = t->byte_id[p[i]];
    while (m > 1) {
        int32_t best = -1;
        for (size_t i = 0; i + 1 < m; i++) {
            int32_t r = rank_of(t, s[i], s[i + 1]);
            if (r >= 0 && (best < 0 || r < best)) best = r;
        }
        if (best < 0) break;
        int32_t a = t->merges[3 * best], b = t->merges[3 * best + 1], x = t->merges[3 * best + 2];
        size_t k = 0;
        for (size_t i = 0; i < m; i++) {
            if (i + 1 < m && s[i] == a && s[i + 1] == b) {
                s[k++] = x;
                i++;
            } else {
                s[k++] = s[i];
            }
        }
        m = k;
    }
    if (e->n + m > e->cap) CT_TRY(ct_tok_grow((void **)&e->ids, &e->cap, e->n + m, sizeof(int32_t)));
    memcpy(e->ids + e->n, s, m * sizeof(int32_t));
    e->n += m;
    return CT_OK;
}

/* The special token that starts at s[i] (the longest), or -1: a walk down their trie (a scan
 * of every special token with s[i]'s first byte made 100k added tokens quadratic). */
static inline int32_t special_at(const ct_tokenizer *t, const unsigned char *s, size_t len,
                                 size_t i)
{
    return ct_tok_special_match(t, s, len, i);
}

ct_status ct_tokenizer_encode(const ct_tokenizer *t, const char *text, size_t len, int32_t **ids,
                              int64_t *n)
{
    if (!t || !ids || !n || (len && !text))
        return ct_error(CT_EINVAL, "ct_tokenizer_encode: arguments must not be NULL");
    const unsigned char *s = (const unsigned char *)text;
    enc e;
    memset(&e, 0, sizeof e);
    /* NFC (Qwen2): the text between added tokens is normalized, as Hugging Face does; where
     * the text holds no character NFC could change it is used as it is. marks[k] are the
     * added tokens' places in the normalized text. */
    unsigned char *norm = NULL;
    size_t norm_cap = 0, nmarks = 0, marks_cap = 0, mk = 0;
    struct mark {
        size_t at;
        int32_t id;
    } *marks = NULL;
    ct_status st = CT_OK;
    if (t->nfc && ct_nfc_unstable_at(s, len) < len) {
        size_t nlen = 0;
        for (size_t i = 0; i < len && st == CT_OK;) {
            size_t stop = i;
            int32_t sp = -1;
            for (; t->n_special && stop < len; stop++)
                if (t->special_at[s[stop]] != t->special_at[s[stop] + 1] &&
                    (sp = special_at(t, s, len, stop)) >= 0)
                    break;
            if (!t->n_special) stop = len;
            st = ct_nfc_append(s + i, stop - i, &norm, &nlen, &norm_cap);
            if (sp < 0 || st) break;
            size_t sn = t->off[sp + 1] - t->off[sp];
            if ((st = ct_tok_grow((void **)&marks, &marks_cap, nmarks + 1, sizeof *marks)) ||
                (st = ct_tok_grow((void **)&norm, &norm_cap, nlen + sn, 1)))
                break;
            marks[nmarks++] = (struct mark){nlen, sp};
            memcpy(norm + nlen, s + stop, sn);
            nlen += sn;
            i = stop + sn;
        }
        if (st) {
            ct_free(norm);
            ct_free(marks);
            return st;
        }
        s = norm ? norm : s;
        len = nlen;
    }
    if (st == CT_OK) st = ct_tok_grow((void **)&e.ids, &e.cap, len / 3 + 16, sizeof(int32_t));
    if (st == CT_OK && len >= 4096) st = ct_calloc((void **)&e.cache, CACHE_SLOTS * sizeof(cache_slot));
    size_t i = 0;
    while (i < len && st == CT_OK) {
        /* the next special token at or after i ends the segment that pieces are cut from */
        size_t stop = i;
        int32_t sp = -1;
        if (norm) {
            stop = mk < nmarks ? marks[mk].at : len;
            sp = mk < nmarks ? marks[mk++].id : -1;
        } else if (t->n_special) {
            for (; stop < len; stop++)
                if (t->special_at[s[stop]] != t->special_at[s[stop] + 1] &&
                    (sp = special_at(t, s, len, stop)) >= 0)
                    break;
        } else {
            stop = len;
        }
        while (i < stop && st == CT_OK) {
            size_t j = ct_pretok_end(t->pretok, s, stop, i), pn = j - i;
            cache_slot *slot = NULL;
            uint64_t h = 0;
            if (e.cache && pn > 1 && pn <= CACHE_MAX_PIECE && j <= UINT32_MAX) {
                h = ct_tok_hash_bytes((const char *)s + i, pn) | 1;
                size_t k = h & (CACHE_SLOTS - 1);
                while (e.cache[k].hash && !(e.cache[k].hash == h && e.cache[k].len == pn &&
                                            !memcmp(s + e.cache[k].at, s + i, pn)))
                    k = (k + 1) & (CACHE_SLOTS - 1);
                slot = &e.cache[k];
                if (slot->hash) { /* met before: copy its tokens */
                    size_t m = slot->n;
                    if (e.n + m > e.cap &&
                        (st = ct_tok_grow((void **)&e.ids, &e.cap, e.n + m, sizeof(int32_t))))
                        break;
                    memcpy(e.ids + e.n, e.ids + slot->out, m * sizeof(int32_t));
                    e.n += m;
                    i = j;
                    continue;
                }
                if (2 * e.cached >= CACHE_SLOTS || e.n > UINT32_MAX / 2) slot = NULL;
            }
            size_t before = e.n;
            st = encode_piece(t, &e, s + i, pn);
            if (slot && st == CT_OK) {
                *slot = (cache_slot){h, (uint32_t)i,
                                     (uint32_t)pn, (uint32_t)before, (uint32_t)(e.n - before)};
                e.cached++;
            }
            i = j;
        }
        if (sp >= 0 && st == CT_OK) {
            st = emit(&e, sp);
            i = stop + (t->off[sp + 1] - t->off[sp]);
        }
    }
    ct_free(e.work);
    ct_free(e.heap);
    ct_free(e.cache);
    ct_free(norm);
    ct_free(marks);
    if (st != CT_OK) {
        ct_free(e.ids);
        return st;
    }
    *ids = e.ids;
    *n = (int64_t)e.n;
    return CT_OK;
}

ct_status ct_tokenizer_decode(const ct_tokenizer *t, const int32_t *ids, int64_t n, char **text,
                              size_t *len)
{
    if (!t || !text || (n && !ids) || n < 0)
        return ct_error(CT_EINVAL, "ct_tokenizer_decode: bad arguments (NULL pointer or n < 0)");
    int64_t V = t->vocab;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V)
            return ct_error(CT_EINVAL,
                            "ct_tokenizer_decode: ids[%lld] = %d is outside the vocabulary "
                            "[0, %lld)",
                            (long long)i, ids[i], (long long)V);
        size_t k = t->off[ids[i] + 1] - t->off[ids[i]];
        if (total > SIZE_MAX - 1 - k)
            return ct_error(CT_ENOMEM, "ct_tokenizer_decode: the text would be too large");
        total += k;
    }
    char *out;
    CT_TRY(ct_alloc((void **)&out, total + 1));
    size_t pos = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t k = t->off[ids[i] + 1] - t->off[ids[i]];
        memcpy(out + pos, t->bytes + t->off[ids[i]], k);
        pos += k;
    }
    out[total] = '\0';
    *text = out;
    if (len) *len = total;
    return CT_OK;
}

/* A raw NUL byte is never JSON (inside a string it is written \u0000). Jansson lets one
 * through between tokens, so it is refused here: the text a tokenizer.json keeps for
 * ct_tokenizer_to_json must stay one C string, and a config read as a C string must not be cut
 * short. */
ct_status ct_tok_json_no_nul(const char *text, size_t len, const char *what)
{
    const char *nul = memchr(text, '\0', len);
    if (nul)
        return ct_error(CT_EFORMAT,
                        "tokenizer: %s holds a NUL byte at offset %zu (JSON text never does; "
                        "inside a string it is written \\u0000)",
                        what, (size_t)(nul - text));
    return CT_OK;
}

/* ---- files --------------------------------------------------------------------------------- */

ct_status ct_tokenizer_to_json(const ct_tokenizer *t, char **json)
{
    if (!t || !json) return ct_error(CT_EINVAL, "ct_tokenizer_to_json: arguments must not be NULL");
    if (t->json) {
        size_t n = strlen(t->json);
        CT_TRY(ct_alloc((void **)json, n + 1));
        memcpy(*json, t->json, n + 1);
        return CT_OK;
    }
    json_t *m = json_array();
    for (int64_t i = 0; i < t->n_merges; i++)
        json_array_append_new(m, json_pack("[ii]", t->merges[3 * i], t->merges[3 * i + 1]));
    json_t *j = json_pack("{s:s, s:i, s:I, s:s, s:o}", "format", "ctorch-bpe", "version", 1,
                          "vocab_size", (json_int_t)t->vocab, "eos", CT_TOKENIZER_EOS_TEXT,
                          "merges", m);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return ct_error(CT_ENOMEM, "ct_tokenizer_to_json: out of memory");
    size_t n = strlen(s);
    ct_status st = ct_alloc((void **)json, n + 1);
    if (st == CT_OK) memcpy(*json, s, n + 1);
    free(s);
    return st;
}

static ct_status from_ctorch_json(json_t *j, ct_tokenizer **out)
{
    ct_status s = CT_OK;
    const char *fmt = json_string_value(json_object_get(j, "format"));
    json_t *m = json_object_get(j, "merges"), *vs = json_object_get(j, "vocab_size");
    int32_t *merges = NULL;
    size_t nm = json_is_array(m) ? json_array_size(m) : 0;
    if (!fmt || strcmp(fmt, "ctorch-bpe"))
        s = ct_error(CT_EFORMAT, "tokenizer: \"format\" must be \"ctorch-bpe\"");
    else if (json_integer_value(json_object_get(j, "version")) != 1)
        s = ct_error(CT_EFORMAT, "tokenizer: \"version\" must be 1");
    else if (!json_is_array(m) || nm > (1 << 20))
        s = ct_error(CT_EFORMAT, "tokenizer: \"merges\" must be an array of at most 2^20 pairs");
    else if (json_object_get(j, "eos") &&
             (!json_is_string(json_object_get(j, "eos")) ||
              strcmp(json_string_value(json_object_get(j, "eos")), CT_TOKENIZER_EOS_TEXT)))
        s = ct_error(CT_EFORMAT,
                     "tokenizer: \"eos\" must be \"" CT_TOKENIZER_EOS_TEXT
                     "\" (the only end-of-text text a ctorch-bpe file can have)");
    else if (!json_is_integer(vs) || json_integer_value(vs) != (json_int_t)(257 + nm))
        s = ct_error(CT_EFORMAT,
                     "tokenizer: \"vocab_size\" must be 257 + the number of merges (%zu)",
                     257 + nm);
    if (s == CT_OK) s = ct_alloc((void **)&merges, (2 * nm + 1) * sizeof(int32_t));
    for (size_t i = 0; i < nm && s == CT_OK; i++) {
        json_t *e = json_array_get(m, i);
        json_t *a = json_array_get(e, 0), *b = json_array_get(e, 1);
        if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_integer(a) ||
            !json_is_integer(b) || json_integer_value(a) < 0 || json_integer_value(b) < 0 ||
            json_integer_value(a) > INT32_MAX || json_integer_value(b) > INT32_MAX)
            s = ct_error(CT_EFORMAT, "tokenizer: merge %zu must be a pair of token ids", i);
        else {
            merges[2 * i] = (int32_t)json_integer_value(a);
            merges[2 * i + 1] = (int32_t)json_integer_value(b);
        }
    }
    if (s == CT_OK) s = ct_tok_build_ctorch(merges, (int64_t)nm, out);
    ct_free(merges);
    return s;
}

ct_status ct_tokenizer_from_json(const char *text, size_t len, ct_tokenizer **out)
{
    if (!out || !text)
        return ct_error(CT_EINVAL, "ct_tokenizer_from_json: arguments must not be NULL");
    *out = NULL;
    if (len > CT_TOKENIZER_MAX_FILE_BYTES)
        return ct_error(CT_EFORMAT, "tokenizer: %zu bytes of JSON, more than the %d MiB allowed",
                        len, CT_TOKENIZER_MAX_FILE_BYTES >> 20);
    CT_TRY(ct_tok_json_no_nul(text, len, "the JSON"));
    json_error_t err;
    json_t *j = json_loadb(text, len, 0, &err);
    if (!j) return ct_error(CT_EFORMAT, "tokenizer: not JSON (line %d: %s)", err.line, err.text);
    ct_status s;
    if (json_is_object(j) && json_object_get(j, "format"))
        s = from_ctorch_json(j, out);
    else if (json_is_object(j) && json_object_get(j, "model"))
        s = ct_tok_from_hf_json(j, text, len, NULL, "tokenizer.json", out);
    else
        s = ct_error(CT_EFORMAT,
                     "tokenizer: JSON with neither \"format\" (ctorch-bpe) nor \"model\" "
                     "(Hugging Face tokenizer.json); GPT-2's encoder.json needs its vocab.bpe: "
                     "load their folder");
    json_decref(j);
    return s;
}

/* Write len bytes to path atomically: a temp file made with mkstemp (O_EXCL) in the target's
 * folder, fsync, rename over the target, fsync of the folder. A crash leaves the old file or
 * the new one, never a mix, and no other process can have prepared the temp name. */
static ct_status write_atomic(const char *path, const char *data, size_t len)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return ct_error(CT_EINVAL, "ct_tokenizer_save: path '%s' does not name a file", path);
    size_t dl = slash ? (size_t)(slash - path) : 1, bl = strlen(base);
    if (slash && dl == 0) dl = 1; /* "/name" */
    if (bl > 200) bl = 200;        /* the temp name stays under NAME_MAX */
    char *dir, *tmp;
    CT_TRY(ct_alloc((void **)&dir, dl + 1));
    if (ct_alloc((void **)&tmp, dl + bl + 32)) {
        ct_free(dir);
        return CT_ENOMEM;
    }
    if (slash)
        memcpy(dir, path, dl);
    else
        dir[0] = '.';
    dir[dl] = '\0';
    sprintf(tmp, "%s/.%.*s.XXXXXX", dir, (int)bl, base);
    ct_status s = CT_OK;
    int fd = mkstemp(tmp);
    if (fd < 0) {
        s = ct_error(CT_EIO, "ct_tokenizer_save: cannot create a temp file in '%s' for '%s': %s",
                     dir, path, strerror(errno));
        goto done;
    }
    (void)fchmod(fd, 0644);
    for (size_t off = 0; off < len && s == CT_OK;) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            s = ct_error(CT_EIO, "ct_tokenizer_save: write to the temp file of '%s': %s", path,
                         w < 0 ? strerror(errno) : "no progress");
        else
            off += (size_t)w;
    }
    if (s == CT_OK && fsync(fd) != 0)
        s = ct_error(CT_EIO, "ct_tokenizer_save: fsync of the temp file of '%s': %s", path,
                     strerror(errno));
    if (close(fd) != 0 && s == CT_OK)
        s = ct_error(CT_EIO, "ct_tokenizer_save: close of the temp file of '%s': %s", path,
                     strerror(errno));
    if (s == CT_OK && rename(tmp, path) != 0)
        s = ct_error(CT_EIO, "ct_tokenizer_save: rename to '%s': %s", path, strerror(errno));
    if (s != CT_OK) {
        unlink(tmp);
        goto done;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL && errno != EROFS))
        s = ct_error(CT_EIO, "ct_tokenizer_save: '%s' was written but fsync of its folder '%s' "
                     "failed: %s", path, dir, strerror(errno));
    if (dfd >= 0) close(dfd);
done:
    ct_free(tmp);
    ct_free(dir);
    return s;
}

ct_status ct_tokenizer_save(const ct_tokenizer *t, const char *path)
{
    if (!t || !path) return ct_error(CT_EINVAL, "ct_tokenizer_save: arguments must not be NULL");
    char *json;
    CT_TRY(ct_tokenizer_to_json(t, &json));
    size_t n = strlen(json);
    json[n] = '\n'; /* the file ends with a newline (the NUL is not written) */
    ct_status s = write_atomic(path, json, n + 1);
    ct_free(json);
    return s;
}

ct_status ct_tok_read_file(const char *path, char **buf, size_t *len)
{
    return ct_file_read_all(path, "tokenizer file", CT_TOKENIZER_MAX_FILE_BYTES, buf, len);
}

/* Whether a name is present (a link too, even dangling): the reader then refuses what is not
 * a regular file (a FIFO, /dev/zero) with a message instead of passing over it. */
static bool is_file(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* "DIR/name" into a new string. */
static ct_status join(const char *dir, const char *name, char **out)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    CT_TRY(ct_alloc((void **)out, n));
    snprintf(*out, n, "%s/%s", dir, name);
    return CT_OK;
}

/* The folder part of a file path ("." when there is none). */
static ct_status dir_of(const char *path, char **out)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return join(".", "", out) == CT_OK ? ((*out)[1] = '\0', CT_OK) : CT_ENOMEM;
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    CT_TRY(ct_alloc((void **)out, n + 1));
    memcpy(*out, path, n);
    (*out)[n] = '\0';
    return CT_OK;
}

static ct_status load_hf_file(const char *path, const char *dir, ct_tokenizer **out)
{
    char *buf = NULL, *cfg = NULL, *cpath = NULL;
    size_t n = 0, cn = 0;
    CT_TRY(ct_tok_read_file(path, &buf, &n));
    ct_status s = join(dir, "tokenizer_config.json", &cpath);
    if (s == CT_OK && is_file(cpath)) s = ct_tok_read_file(cpath, &cfg, &cn);
    if (s == CT_OK) s = ct_tok_json_no_nul(buf, n, path);
    if (s == CT_OK && cfg) s = ct_tok_json_no_nul(cfg, cn, cpath);
    if (s == CT_OK) {
        json_error_t err;
        json_t *j = json_loadb(buf, n, 0, &err);
        if (!j)
            s = ct_error(CT_EFORMAT, "tokenizer: '%s' is not JSON (line %d: %s)", path, err.line,
                         err.text);
        else if (json_is_object(j) && json_object_get(j, "format"))
            s = from_ctorch_json(j, out);
        else if (json_is_object(j) && json_object_get(j, "model"))
            s = ct_tok_from_hf_json(j, buf, n, cfg, path, out);
        else
            s = ct_error(CT_EFORMAT,
                         "tokenizer: '%s' has neither \"format\" (ctorch-bpe) nor \"model\" "
                         "(Hugging Face tokenizer.json)",
                         path);
        json_decref(j);
    }
    ct_free(buf);
    ct_free(cfg);
    ct_free(cpath);
    return s;
}

static ct_status load_gpt2(const char *enc_path, const char *bpe_path, ct_tokenizer **out)
{
    char *e = NULL, *b = NULL;
    size_t en = 0, bn = 0;
    ct_status s = ct_tok_read_file(enc_path, &e, &en);
    if (s == CT_OK) s = ct_tok_read_file(bpe_path, &b, &bn);
    if (s == CT_OK) s = ct_tokenizer_from_gpt2(e, en, b, bn, out);
    ct_free(e);
    ct_free(b);
    return s;
}

ct_status ct_tokenizer_load(const char *path, ct_tokenizer **out)
{
    if (!path || !out) return ct_error(CT_EINVAL, "ct_tokenizer_load: arguments must not be NULL");
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return ct_error(CT_EIO, "ct_tokenizer_load: cannot open '%s': %s", path, strerror(errno));
    char *a = NULL, *b = NULL, *dir = NULL;
    ct_status s;
    if (S_ISDIR(st.st_mode)) {
        if ((s = join(path, "tokenizer.json", &a))) goto done;
        if (is_file(a)) {
            s = load_hf_file(a, path, out);
            goto done;
        }
        ct_free(a);
        a = NULL;
        if ((s = join(path, "encoder.json", &a)) || (s = join(path, "vocab.bpe", &b))) goto done;
        if (is_file(a) && is_file(b))
            s = load_gpt2(a, b, out);
        else
            s = ct_error(CT_EIO,
                         "ct_tokenizer_load: folder '%s' holds neither tokenizer.json nor "
                         "encoder.json + vocab.bpe",
                         path);
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        s = ct_error(CT_EIO, "ct_tokenizer_load: '%s' is neither a file nor a folder", path);
        goto done;
    }
    if ((s = dir_of(path, &dir))) goto done;
    /* GPT-2's pair: either file names its partner in the same folder */
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    bool is_bpe = strlen(base) >= 4 && !strcmp(base + strlen(base) - 4, ".bpe");
    if (is_bpe || !strcmp(base, "encoder.json")) {
        if ((s = join(dir, is_bpe ? "encoder.json" : "vocab.bpe", &a))) goto done;
        if (!is_file(a)) {
            s = ct_error(CT_EIO, "ct_tokenizer_load: '%s' is half of GPT-2's pair; '%s' is missing",
                         path, a);
            goto done;
        }
        s = is_bpe ? load_gpt2(a, path, out) : load_gpt2(path, a, out);
        goto done;
    }
    s = load_hf_file(path, dir, out);
done:
    ct_free(a);
    ct_free(b);
    ct_free(dir);
    return s;
}
