/* Byte-level BPE training (the ctorch-bpe format): piece counts, then repeatedly the most
 * frequent adjacent pair, with a lazy max-heap of pair counts. The rules are in
 * include/ctorch/tokenizer.h. */
#include "model/tokenizer_internal.h"

#include <string.h>

ct_bpe_options ct_bpe_options_default(void)
{
    ct_bpe_options o = {4096, 2};
    return o;
}

static ct_status grow(void **p, size_t *cap, size_t need, size_t elem)
{
    return ct_tok_grow(p, cap, need, elem);
}

static inline uint64_t hash64(uint64_t x)
{
    return ct_tok_hash64(x);
}

static inline uint64_t pair_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

#define EOS_LEN (sizeof CT_TOKENIZER_EOS_TEXT - 1)

/* Calls fn(ctx, piece, n) for each piece of the text (EOS markers are skipped). */
typedef ct_status (*piece_fn)(void *ctx, const unsigned char *p, size_t n);

static ct_status for_each_piece(const char *text, size_t len, piece_fn fn, void *ctx)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        const char *e = memmem(text + i, len - i, CT_TOKENIZER_EOS_TEXT, EOS_LEN);
        size_t stop = e ? (size_t)(e - text) : len;
        while (i < stop) {
            size_t j = ct_pretok_end(PRE_CTORCH, s, stop, i);
            CT_TRY(fn(ctx, s + i, j - i));
            i = j;
        }
        if (e) i = stop + EOS_LEN;
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
    if (s == CT_OK) s = ct_tok_build_ctorch(merges, nm, out);
    ct_free(merges);
    return s;
}

