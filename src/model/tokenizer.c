/* Byte-level BPE: pre-tokenisation, training on piece counts with a lazy max-heap of pair
 * counts, encoding by merge rank, JSON files. The rules are in include/ctorch/tokenizer.h. */
#include "core/internal.h"
#include "ctorch/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EOS_LEN (sizeof CT_TOKENIZER_EOS_TEXT - 1)
#define MAX_PIECE 256 /* longer runs are cut into pieces of this many bytes */

struct ct_tokenizer {
    int64_t n_merges;
    int32_t *merges;    /* [n_merges][2] */
    uint64_t *rank_key; /* open-addressed map pair key -> rank (cap entries, 0 = empty) */
    int32_t *rank_val;
    size_t rank_cap;
    char *bytes; /* token byte strings, back to back */
    size_t *off; /* [vocab + 1] offsets into bytes */
};

ct_bpe_options ct_bpe_options_default(void)
{
    ct_bpe_options o = {4096, 2};
    return o;
}

/* ---- small growable arrays ------------------------------------------------------------- */

static ct_status grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return CT_OK;
    size_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *q;
    CT_TRY(ct_alloc(&q, nc * elem));
    if (*p) memcpy(q, *p, *cap * elem);
    ct_free(*p);
    *p = q;
    *cap = nc;
    return CT_OK;
}

static inline uint64_t hash64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static inline uint64_t pair_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

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

/* ---- pre-tokenisation ---------------------------------------------------------------------- */

enum { C_LETTER, C_DIGIT, C_OTHER, C_SPACE, C_NEWLINE };

static int cls(unsigned char c)
{
    if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return C_LETTER;
    if (c >= '0' && c <= '9') return C_DIGIT;
    if (c == '\n' || c == '\r') return C_NEWLINE;
    if (c == ' ' || c == '\t' || c == '\v' || c == '\f') return C_SPACE;
    return C_OTHER;
}

/* End of the piece that starts at s[i] (i < len). */
static size_t piece_end(const unsigned char *s, size_t len, size_t i)
{
    size_t j = i, lim = len - i > MAX_PIECE ? i + MAX_PIECE : len;
    int k = cls(s[i]);
    if (s[i] == ' ' && i + 1 < len && cls(s[i + 1]) <= C_OTHER) {
        k = cls(s[i + 1]);
        j = i + 1;
    }
    while (j < lim && cls(s[j]) == k)
        j++;
    if (k == C_SPACE && j < len && j - i > 1 && s[j - 1] == ' ' && cls(s[j]) <= C_OTHER) j--;
    return j;
}

/* Calls fn(ctx, piece, n) for each piece of the text, and fn(ctx, NULL, 0) for each EOS. */
typedef ct_status (*piece_fn)(void *ctx, const unsigned char *p, size_t n);

static ct_status for_each_piece(const char *text, size_t len, piece_fn fn, void *ctx)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        const char *e = memmem(text + i, len - i, CT_TOKENIZER_EOS_TEXT, EOS_LEN);
        size_t stop = e ? (size_t)(e - text) : len;
        while (i < stop) {
            size_t j = piece_end(s, stop, i);
            CT_TRY(fn(ctx, s + i, j - i));
            i = j;
        }
        if (e) {
            CT_TRY(fn(ctx, NULL, 0));
            i = stop + EOS_LEN;
        }
    }
    return CT_OK;
}

/* ---- training ------------------------------------------------------------------------------ */

typedef struct {
    int32_t *ids;
    int32_t n, cap;
} wlist;

typedef struct {
    /* unique pieces */
    uint64_t *ph; /* hash table of piece indices + 1 (0 = empty) */
    size_t ph_cap;
    const unsigned char **pstr;
    size_t *plen;
    int64_t *pcount;
    size_t np, np_cap, plen_cap, pcount_cap;
    /* words: symbols of each unique piece */
    int32_t *sym;
    size_t *woff;
    int32_t *wlen;
    uint32_t *wstamp;
    /* pairs */
    uint64_t *kh; /* hash table: pair index + 1 */
    size_t kh_cap;
    uint64_t *pkey;
    int64_t *pcnt;
    wlist *pw;
    uint32_t *pstamp;
    size_t npairs, pkey_cap, pcnt_cap, pw_cap, pstamp_cap;
    /* heap of (count, key) */
    int64_t *hc;
    uint64_t *hk;
    size_t hn, hc_cap, hk_cap;
} bpe;

static ct_status piece_add(void *ctx, const unsigned char *p, size_t n)
{
    bpe *b = ctx;
    if (!p) return CT_OK;
    if (2 * (b->np + 1) > b->ph_cap) { /* rehash at half load */
        size_t nc = b->ph_cap ? 2 * b->ph_cap : 1024;
        uint64_t *t;
        CT_TRY(ct_calloc((void **)&t, nc * sizeof *t));
        for (size_t i = 0; i < b->np; i++) {
            uint64_t h = 1469598103934665603ull;
            for (size_t k = 0; k < b->plen[i]; k++)
                h = (h ^ b->pstr[i][k]) * 1099511628211ull;
            size_t s = hash64(h) & (nc - 1);
            while (t[s])
                s = (s + 1) & (nc - 1);
            t[s] = i + 1;
        }
        ct_free(b->ph);
        b->ph = t;
        b->ph_cap = nc;
    }
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < n; k++)
        h = (h ^ p[k]) * 1099511628211ull;
    size_t s = hash64(h) & (b->ph_cap - 1);
    while (b->ph[s]) {
        size_t i = b->ph[s] - 1;
        if (b->plen[i] == n && !memcmp(b->pstr[i], p, n)) {
            b->pcount[i]++;
            return CT_OK;
        }
        s = (s + 1) & (b->ph_cap - 1);
    }
    size_t need = b->np + 1;
    CT_TRY(grow((void **)&b->pstr, &b->np_cap, need, sizeof *b->pstr));
    CT_TRY(grow((void **)&b->plen, &b->plen_cap, need, sizeof *b->plen));
    CT_TRY(grow((void **)&b->pcount, &b->pcount_cap, need, sizeof *b->pcount));
    b->pstr[b->np] = p;
    b->plen[b->np] = n;
    b->pcount[b->np] = 1;
    b->ph[s] = ++b->np;
    return CT_OK;
}

/* Index of a pair (created with count 0 when absent). */
static ct_status pair_get(bpe *b, uint64_t key, size_t *idx)
{
    if (2 * (b->npairs + 1) > b->kh_cap) {
        size_t nc = b->kh_cap ? 2 * b->kh_cap : 4096;
        uint64_t *t;
        CT_TRY(ct_calloc((void **)&t, nc * sizeof *t));
        for (size_t i = 0; i < b->npairs; i++) {
            size_t s = hash64(b->pkey[i]) & (nc - 1);
            while (t[s])
                s = (s + 1) & (nc - 1);
            t[s] = i + 1;
        }
        ct_free(b->kh);
        b->kh = t;
        b->kh_cap = nc;
    }
    size_t s = hash64(key) & (b->kh_cap - 1);
    while (b->kh[s]) {
        if (b->pkey[b->kh[s] - 1] == key) {
            *idx = b->kh[s] - 1;
            return CT_OK;
        }
        s = (s + 1) & (b->kh_cap - 1);
    }
    size_t need = b->npairs + 1;
    CT_TRY(grow((void **)&b->pkey, &b->pkey_cap, need, sizeof *b->pkey));
    CT_TRY(grow((void **)&b->pcnt, &b->pcnt_cap, need, sizeof *b->pcnt));
    CT_TRY(grow((void **)&b->pw, &b->pw_cap, need, sizeof *b->pw));
    CT_TRY(grow((void **)&b->pstamp, &b->pstamp_cap, need, sizeof *b->pstamp));
    b->pkey[b->npairs] = key;
    b->pcnt[b->npairs] = 0;
    memset(&b->pw[b->npairs], 0, sizeof(wlist));
    b->pstamp[b->npairs] = 0;
    *idx = b->npairs;
    b->kh[s] = ++b->npairs;
    return CT_OK;
}

static ct_status wlist_add(wlist *l, int32_t w)
{
    if (l->n && l->ids[l->n - 1] == w) return CT_OK;
    if (l->n == l->cap) {
        size_t cap = (size_t)l->cap;
        CT_TRY(grow((void **)&l->ids, &cap, (size_t)l->n + 1, sizeof(int32_t)));
        l->cap = (int32_t)cap;
    }
    l->ids[l->n++] = w;
    return CT_OK;
}

/* Heap order: larger count first, then the smaller key. */
static inline bool heap_above(const bpe *b, size_t i, size_t j)
{
    return b->hc[i] > b->hc[j] || (b->hc[i] == b->hc[j] && b->hk[i] < b->hk[j]);
}

static void heap_swap(bpe *b, size_t i, size_t j)
{
    int64_t c = b->hc[i];
    uint64_t k = b->hk[i];
    b->hc[i] = b->hc[j], b->hk[i] = b->hk[j];
    b->hc[j] = c, b->hk[j] = k;
}

static ct_status heap_push(bpe *b, int64_t cnt, uint64_t key)
{
    CT_TRY(grow((void **)&b->hc, &b->hc_cap, b->hn + 1, sizeof *b->hc));
    CT_TRY(grow((void **)&b->hk, &b->hk_cap, b->hn + 1, sizeof *b->hk));
    size_t i = b->hn++;
    b->hc[i] = cnt;
    b->hk[i] = key;
    while (i && heap_above(b, i, (i - 1) / 2)) {
        heap_swap(b, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    return CT_OK;
}

static void heap_pop(bpe *b)
{
    b->hn--;
    b->hc[0] = b->hc[b->hn];
    b->hk[0] = b->hk[b->hn];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < b->hn && heap_above(b, l, m)) m = l;
        if (r < b->hn && heap_above(b, r, m)) m = r;
        if (m == i) break;
        heap_swap(b, i, m);
        i = m;
    }
}

/* Add (sign = +1) or remove (-1) the pairs of word w to the counts; with sign +1 and a new
 * token x, pairs holding x list the word and are collected in touched[]. */
static ct_status word_pairs(bpe *b, int32_t w, int sign, int32_t x, uint32_t stamp,
                            size_t **touched, size_t *nt, size_t *tcap)
{
    const int32_t *s = b->sym + b->woff[w];
    int64_t c = b->pcount[w] * sign;
    for (int32_t i = 0; i + 1 < b->wlen[w]; i++) {
        size_t p;
        CT_TRY(pair_get(b, pair_key(s[i], s[i + 1]), &p));
        b->pcnt[p] += c;
        if (sign > 0 && (x < 0 || s[i] == x || s[i + 1] == x)) {
            CT_TRY(wlist_add(&b->pw[p], w));
            if (touched && b->pstamp[p] != stamp) {
                b->pstamp[p] = stamp;
                CT_TRY(grow((void **)touched, tcap, *nt + 1, sizeof(size_t)));
                (*touched)[(*nt)++] = p;
            }
        }
    }
    return CT_OK;
}

static void bpe_free(bpe *b)
{
    ct_free(b->ph);
    ct_free(b->pstr);
    ct_free(b->plen);
    ct_free(b->pcount);
    ct_free(b->sym);
    ct_free(b->woff);
    ct_free(b->wlen);
    ct_free(b->wstamp);
    ct_free(b->kh);
    ct_free(b->pkey);
    ct_free(b->pcnt);
    for (size_t i = 0; i < b->npairs; i++)
        ct_free(b->pw[i].ids);
    ct_free(b->pw);
    ct_free(b->pstamp);
    ct_free(b->hc);
    ct_free(b->hk);
}

static ct_status tokenizer_build(const int32_t *merges, int64_t n_merges, ct_tokenizer **out);

static ct_status bpe_run(bpe *b, const ct_bpe_options *o, int32_t **merges_out, int64_t *nm_out)
{
    size_t total = 0;
    for (size_t w = 0; w < b->np; w++)
        total += b->plen[w];
    CT_TRY(ct_alloc((void **)&b->sym, (total ? total : 1) * sizeof(int32_t)));
    CT_TRY(ct_alloc((void **)&b->woff, (b->np ? b->np : 1) * sizeof(size_t)));
    CT_TRY(ct_alloc((void **)&b->wlen, (b->np ? b->np : 1) * sizeof(int32_t)));
    CT_TRY(ct_calloc((void **)&b->wstamp, (b->np ? b->np : 1) * sizeof(uint32_t)));
    size_t pos = 0;
    for (size_t w = 0; w < b->np; w++) {
        b->woff[w] = pos;
        b->wlen[w] = (int32_t)b->plen[w];
        for (size_t k = 0; k < b->plen[w]; k++)
            b->sym[pos++] = b->pstr[w][k];
        CT_TRY(word_pairs(b, (int32_t)w, +1, -1, 0, NULL, NULL, NULL));
    }
    for (size_t p = 0; p < b->npairs; p++)
        if (b->pcnt[p] > 0) CT_TRY(heap_push(b, b->pcnt[p], b->pkey[p]));
    int64_t want = o->vocab_size - 257, nm = 0;
    int32_t *merges = NULL;
    size_t mcap = 0, *touched = NULL, tcap = 0;
    ct_status s = CT_OK;
    uint32_t stamp = 0;
    while (nm < want && b->hn) {
        int64_t cnt = b->hc[0];
        uint64_t key = b->hk[0];
        heap_pop(b);
        size_t p;
        if ((s = pair_get(b, key, &p))) break;
        if (b->pcnt[p] != cnt) { /* stale: re-queue a decreased count */
            if (b->pcnt[p] > 0 && b->pcnt[p] < cnt && (s = heap_push(b, b->pcnt[p], key))) break;
            continue;
        }
        if (cnt < o->min_frequency) break;
        int32_t a = (int32_t)(key >> 32), c2 = (int32_t)(uint32_t)key, x = (int32_t)(256 + nm);
        if ((s = grow((void **)&merges, &mcap, 2 * (size_t)(nm + 1), sizeof(int32_t)))) break;
        merges[2 * nm] = a;
        merges[2 * nm + 1] = c2;
        nm++;
        stamp++;
        size_t nt = 0;
        wlist l = b->pw[p]; /* the list may grow while we walk it: take its words first */
        memset(&b->pw[p], 0, sizeof l);
        for (int32_t i = 0; i < l.n && s == CT_OK; i++) {
            int32_t w = l.ids[i];
            if (b->wstamp[w] == stamp) continue;
            b->wstamp[w] = stamp;
            int32_t *sy = b->sym + b->woff[w], n = b->wlen[w];
            bool has = false;
            for (int32_t k = 0; k + 1 < n && !has; k++)
                has = sy[k] == a && sy[k + 1] == c2;
            if (!has) continue;
            if ((s = word_pairs(b, w, -1, x, stamp, NULL, NULL, NULL))) break;
            int32_t m = 0;
            for (int32_t k = 0; k < n; k++) {
                if (k + 1 < n && sy[k] == a && sy[k + 1] == c2) {
                    sy[m++] = x;
                    k++;
                } else {
                    sy[m++] = sy[k];
                }
            }
            b->wlen[w] = m;
            s = word_pairs(b, w, +1, x, stamp, &touched, &nt, &tcap);
        }
        ct_free(l.ids);
        for (size_t i = 0; i < nt && s == CT_OK; i++)
            if (b->pcnt[touched[i]] > 0) s = heap_push(b, b->pcnt[touched[i]], b->pkey[touched[i]]);
        if (s) break;
    }
    ct_free(touched);
    if (s) {
        ct_free(merges);
        return s;
    }
    *merges_out = merges;
    *nm_out = nm;
    return CT_OK;
}

ct_status ct_tokenizer_train(const char *text, size_t len, const ct_bpe_options *opt,
                             ct_tokenizer **out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_tokenizer_train: out must not be NULL");
    *out = NULL;
    if (len && !text) return ct_error(CT_EINVAL, "ct_tokenizer_train: text must not be NULL");
    ct_bpe_options o = opt ? *opt : ct_bpe_options_default();
    if (o.vocab_size < 257 || o.vocab_size > (1 << 20))
        return ct_error(CT_EINVAL,
                        "ct_tokenizer_train: vocab_size must be in [257, 1048576] "
                        "(256 bytes + merges + EOS), got %lld",
                        (long long)o.vocab_size);
    if (o.min_frequency < 1)
        return ct_error(CT_EINVAL, "ct_tokenizer_train: min_frequency must be >= 1, got %lld",
                        (long long)o.min_frequency);
    bpe b;
    memset(&b, 0, sizeof b);
    int32_t *merges = NULL;
    int64_t nm = 0;
    ct_status s = for_each_piece(text, len, piece_add, &b);
    if (s == CT_OK) s = bpe_run(&b, &o, &merges, &nm);
    bpe_free(&b);
    if (s == CT_OK) s = tokenizer_build(merges, nm, out);
    ct_free(merges);
    return s;
}

/* ---- the tokenizer ------------------------------------------------------------------------- */

void ct_tokenizer_free(ct_tokenizer *t)
{
    if (!t) return;
    ct_free(t->merges);
    ct_free(t->rank_key);
    ct_free(t->rank_val);
    ct_free(t->bytes);
    ct_free(t->off);
    ct_free(t);
}

static int32_t rank_of(const ct_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = pair_key(a, b) + 1; /* +1: keys are never 0 (the empty mark) */
    size_t s = hash64(key) & (t->rank_cap - 1);
    while (t->rank_key[s]) {
        if (t->rank_key[s] == key) return t->rank_val[s];
        s = (s + 1) & (t->rank_cap - 1);
    }
    return -1;
}

/* Build a tokenizer from merges (validated: each merge joins earlier tokens). */
static ct_status tokenizer_build(const int32_t *merges, int64_t n_merges, ct_tokenizer **out)
{
    ct_tokenizer *t;
    CT_TRY(ct_calloc((void **)&t, sizeof *t));
    t->n_merges = n_merges;
    int64_t V = 257 + n_merges;
    t->rank_cap = 16;
    while (t->rank_cap < 2 * (size_t)(n_merges + 1))
        t->rank_cap *= 2;
    ct_status s;
    if ((s = ct_alloc((void **)&t->merges, (size_t)(2 * n_merges + 1) * sizeof(int32_t))) ||
        (s = ct_calloc((void **)&t->rank_key, t->rank_cap * sizeof(uint64_t))) ||
        (s = ct_alloc((void **)&t->rank_val, t->rank_cap * sizeof(int32_t))) ||
        (s = ct_alloc((void **)&t->off, (size_t)(V + 1) * sizeof(size_t)))) {
        ct_tokenizer_free(t);
        return s;
    }
    if (n_merges) memcpy(t->merges, merges, (size_t)(2 * n_merges) * sizeof(int32_t));
    size_t total = 256 + EOS_LEN;
    for (int64_t i = 0; i < n_merges; i++) {
        int32_t a = merges[2 * i], b = merges[2 * i + 1];
        if (a < 0 || b < 0 || a >= 256 + i || b >= 256 + i) {
            ct_tokenizer_free(t);
            return ct_error(CT_EFORMAT,
                            "tokenizer: merge %lld joins [%d, %d], but only tokens below "
                            "%lld exist before it",
                            (long long)i, a, b, (long long)(256 + i));
        }
        if (rank_of(t, a, b) >= 0) {
            ct_tokenizer_free(t);
            return ct_error(CT_EFORMAT, "tokenizer: merge %lld [%d, %d] repeats an earlier merge",
                            (long long)i, a, b);
        }
        uint64_t key = pair_key(a, b) + 1;
        size_t slot = hash64(key) & (t->rank_cap - 1);
        while (t->rank_key[slot])
            slot = (slot + 1) & (t->rank_cap - 1);
        t->rank_key[slot] = key;
        t->rank_val[slot] = (int32_t)i;
    }
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
                ct_tokenizer_free(t);
                return ct_error(CT_EFORMAT,
                                "tokenizer: merge %lld [%d, %d] makes a token of %zu bytes; "
                                "tokens are at most %d bytes",
                                (long long)(id - 256), a, b, n, CT_TOKENIZER_MAX_TOKEN_BYTES);
            }
        }
        if (t->off[id] + n > CT_TOKENIZER_MAX_TOTAL_BYTES) {
            ct_tokenizer_free(t);
            return ct_error(CT_EFORMAT,
                            "tokenizer: the tokens' bytes add up to more than %d MiB (at token "
                            "%lld)",
                            CT_TOKENIZER_MAX_TOTAL_BYTES >> 20, (long long)id);
        }
        t->off[id + 1] = t->off[id] + n;
    }
    total = t->off[V];
    if ((s = ct_alloc((void **)&t->bytes, total + 1))) {
        ct_tokenizer_free(t);
        return s;
    }
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
    *out = t;
    return CT_OK;
}

int64_t ct_tokenizer_vocab_size(const ct_tokenizer *t)
{
    return t ? 257 + t->n_merges : 0;
}

int32_t ct_tokenizer_eos(const ct_tokenizer *t)
{
    return t ? (int32_t)(256 + t->n_merges) : -1;
}

ct_status ct_tokenizer_token_bytes(const ct_tokenizer *t, int32_t id, const char **bytes,
                                   size_t *len)
{
    if (!t || !bytes || !len)
        return ct_error(CT_EINVAL, "ct_tokenizer_token_bytes: arguments must not be NULL");
    if (id < 0 || id >= ct_tokenizer_vocab_size(t))
        return ct_error(CT_EINVAL,
                        "ct_tokenizer_token_bytes: id %d is outside the vocabulary [0, %lld)", id,
                        (long long)ct_tokenizer_vocab_size(t));
    *bytes = t->bytes + t->off[id];
    *len = t->off[id + 1] - t->off[id];
    return CT_OK;
}

typedef struct {
    const ct_tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    int32_t buf[MAX_PIECE];
} enc;

static ct_status encode_piece(void *ctx, const unsigned char *p, size_t n)
{
    enc *e = ctx;
    const ct_tokenizer *t = e->t;
    CT_TRY(grow((void **)&e->ids, &e->cap, e->n + (p ? n : 1), sizeof(int32_t)));
    if (!p) {
        e->ids[e->n++] = ct_tokenizer_eos(t);
        return CT_OK;
    }
    int32_t *s = e->buf;
    size_t m = n;
    for (size_t i = 0; i < n; i++)
        s[i] = p[i];
    while (m > 1) {
        int32_t best = -1;
        for (size_t i = 0; i + 1 < m; i++) {
            int32_t r = rank_of(t, s[i], s[i + 1]);
            if (r >= 0 && (best < 0 || r < best)) best = r;
        }
        if (best < 0) break;
        int32_t a = t->merges[2 * best], b = t->merges[2 * best + 1], x = 256 + best;
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
    memcpy(e->ids + e->n, s, m * sizeof(int32_t));
    e->n += m;
    return CT_OK;
}

ct_status ct_tokenizer_encode(const ct_tokenizer *t, const char *text, size_t len, int32_t **ids,
                              int64_t *n)
{
    if (!t || !ids || !n || (len && !text))
        return ct_error(CT_EINVAL, "ct_tokenizer_encode: arguments must not be NULL");
    enc *e;
    CT_TRY(ct_calloc((void **)&e, sizeof *e));
    e->t = t;
    ct_status s = grow((void **)&e->ids, &e->cap, len / 2 + 1, sizeof(int32_t));
    if (s == CT_OK) s = for_each_piece(text, len, encode_piece, e);
    if (s != CT_OK) {
        ct_free(e->ids);
        ct_free(e);
        return s;
    }
    *ids = e->ids;
    *n = (int64_t)e->n;
    ct_free(e);
    return CT_OK;
}

ct_status ct_tokenizer_decode(const ct_tokenizer *t, const int32_t *ids, int64_t n, char **text,
                              size_t *len)
{
    if (!t || !text || (n && !ids) || n < 0)
        return ct_error(CT_EINVAL, "ct_tokenizer_decode: bad arguments (NULL pointer or n < 0)");
    int64_t V = ct_tokenizer_vocab_size(t);
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V)
            return ct_error(CT_EINVAL,
                            "ct_tokenizer_decode: ids[%lld] = %d is outside the vocabulary "
                            "[0, %lld)",
                            (long long)i, ids[i], (long long)V);
        total += t->off[ids[i] + 1] - t->off[ids[i]];
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

/* ---- files --------------------------------------------------------------------------------- */

ct_status ct_tokenizer_to_json(const ct_tokenizer *t, char **json)
{
    if (!t || !json) return ct_error(CT_EINVAL, "ct_tokenizer_to_json: arguments must not be NULL");
    json_t *m = json_array();
    for (int64_t i = 0; i < t->n_merges; i++)
        json_array_append_new(m, json_pack("[ii]", t->merges[2 * i], t->merges[2 * i + 1]));
    json_t *j = json_pack("{s:s, s:i, s:I, s:s, s:o}", "format", "ctorch-bpe", "version", 1,
                          "vocab_size", (json_int_t)ct_tokenizer_vocab_size(t), "eos",
                          CT_TOKENIZER_EOS_TEXT, "merges", m);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return ct_error(CT_ENOMEM, "ct_tokenizer_to_json: out of memory");
    size_t n = strlen(s);
    ct_status st = ct_alloc((void **)json, n + 1);
    if (st == CT_OK) memcpy(*json, s, n + 1);
    free(s);
    return st;
}

ct_status ct_tokenizer_from_json(const char *text, size_t len, ct_tokenizer **out)
{
    if (!out || !text)
        return ct_error(CT_EINVAL, "ct_tokenizer_from_json: arguments must not be NULL");
    *out = NULL;
    json_error_t err;
    json_t *j = json_loadb(text, len, 0, &err);
    if (!j) return ct_error(CT_EFORMAT, "tokenizer: not JSON (line %d: %s)", err.line, err.text);
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
    json_decref(j);
    if (s == CT_OK) s = tokenizer_build(merges, (int64_t)nm, out);
    ct_free(merges);
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

ct_status ct_tokenizer_load(const char *path, ct_tokenizer **out)
{
    if (!path || !out) return ct_error(CT_EINVAL, "ct_tokenizer_load: arguments must not be NULL");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return ct_error(CT_EIO, "ct_tokenizer_load: cannot open '%s': %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, n = 0;
    ct_status s = CT_OK;
    for (;;) {
        if ((s = grow((void **)&buf, &cap, n + 65536, 1))) break;
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    if (s == CT_OK && ferror(f))
        s = ct_error(CT_EIO, "ct_tokenizer_load: read '%s': %s", path, strerror(errno));
    fclose(f);
    if (s == CT_OK) s = ct_tokenizer_from_json(buf, n, out);
    ct_free(buf);
    return s;
}
