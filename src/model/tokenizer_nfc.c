/* Unicode Normalization Form C (UAX #15), for tokenizers whose normalizer is NFC (Qwen2): the
 * text between added tokens is normalized before it is cut into pieces, as Hugging Face does.
 *
 * Only the stretches where NFC can change anything are worked on. A character that is a
 * starter (combining class 0) and NFC_Quick_Check Yes can neither join nor move past what
 * precedes it, so the text may be cut before it: each stretch runs from the character before a
 * character of ct_uni_nfc_unstable (which it may join) to the next such stable character. A
 * stretch is decomposed fully (canonical mappings applied again and again; Hangul syllables by
 * arithmetic), its runs of non-starters sorted by combining class (stably: a counting sort, so
 * a long run is linear), then composed: each character joins the last starter when nothing
 * between them blocks it (a starter, or a character of the same or a higher class) and the
 * pair is a primary composite. Data: tokenizer_nfc_tables.c (scripts/gen_nfc_tables.py), from
 * the same Unicode version as tokenizer_unicode.c. A byte that is not UTF-8 is kept as it is:
 * a starter that joins nothing. */
#include "model/tokenizer_internal.h"

#include <string.h>

#define RAW_BYTE 0x80000000u /* a byte that is not UTF-8: RAW_BYTE | byte */
#define S_BASE 0xAC00u
#define L_BASE 0x1100u
#define V_BASE 0x1161u
#define T_BASE 0x11A7u
#define L_COUNT 19u
#define V_COUNT 21u
#define T_COUNT 28u
#define N_COUNT (V_COUNT * T_COUNT)
#define S_COUNT (L_COUNT * N_COUNT)

static int ccc(uint32_t cp)
{
    size_t lo = 0, hi = ct_nfc_ccc_n;
    if (cp < 0x300 || cp & RAW_BYTE) return 0;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (cp < ct_nfc_ccc[m][0])
            hi = m;
        else if (cp > ct_nfc_ccc[m][1])
            lo = m + 1;
        else
            return (int)ct_nfc_ccc[m][2];
    }
    return 0;
}

static const uint32_t *mapping(uint32_t cp)
{
    size_t lo = 0, hi = ct_nfc_decomp_n;
    if (cp < 0xC0 || cp & RAW_BYTE) return NULL;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (cp < ct_nfc_decomp[m][0])
            hi = m;
        else if (cp > ct_nfc_decomp[m][0])
            lo = m + 1;
        else
            return ct_nfc_decomp[m];
    }
    return NULL;
}

/* The primary composite of a then b, 0 if none. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a - L_BASE < L_COUNT && b - V_BASE < V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a - S_BASE < S_COUNT && (a - S_BASE) % T_COUNT == 0 && b - T_BASE - 1 < T_COUNT - 1)
        return a + (b - T_BASE);
    size_t lo = 0, hi = ct_nfc_compose_n;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        const uint32_t *p = ct_nfc_compose[m];
        if (a < p[0] || (a == p[0] && b < p[1]))
            hi = m;
        else if (a > p[0] || b > p[1])
            lo = m + 1;
        else
            return p[2];
    }
    return 0;
}

typedef struct {
    uint32_t *cp, *tmp;
    unsigned char *cl;
    size_t n, cap, tmp_cap;
} cpbuf;

static ct_status push(cpbuf *b, uint32_t cp)
{
    if (b->n == b->cap) {
        size_t cap = b->cap;
        CT_TRY(ct_tok_grow((void **)&b->cp, &b->cap, b->n + 1, sizeof *b->cp));
        CT_TRY(ct_tok_grow((void **)&b->cl, &cap, b->cap, 1));
    }
    b->cl[b->n] = (unsigned char)ccc(cp);
    b->cp[b->n++] = cp;
    return CT_OK;
}

/* Canonical mappings nest at most a few deep (3 in Unicode 9.0). */
static ct_status decompose(cpbuf *b, uint32_t cp, int depth)
{
    if (cp - S_BASE < S_COUNT) {
        uint32_t s = cp - S_BASE, t = s % T_COUNT;
        CT_TRY(push(b, L_BASE + s / N_COUNT));
        CT_TRY(push(b, V_BASE + (s % N_COUNT) / T_COUNT));
        return t ? push(b, T_BASE + t) : CT_OK;
    }
    const uint32_t *d = depth < 8 ? mapping(cp) : NULL;
    if (!d) return push(b, cp);
    CT_TRY(decompose(b, d[1], depth + 1));
    return d[2] ? decompose(b, d[2], depth + 1) : CT_OK;
}

/* Sort b->cp[a..e) (non-starters) by class, keeping the order of equal classes. */
static ct_status reorder(cpbuf *b, size_t a, size_t e)
{
    size_t n = e - a;
    if (n < 16) { /* insertion sort: short runs are the rule */
        for (size_t i = a + 1; i < e; i++)
            for (size_t j = i; j > a && b->cl[j - 1] > b->cl[j]; j--) {
                uint32_t c = b->cp[j];
                unsigned char k = b->cl[j];
                b->cp[j] = b->cp[j - 1], b->cl[j] = b->cl[j - 1];
                b->cp[j - 1] = c, b->cl[j - 1] = k;
            }
        return CT_OK;
    }
    CT_TRY(ct_tok_grow((void **)&b->tmp, &b->tmp_cap, n, sizeof *b->tmp));
    size_t count[257] = {0};
    for (size_t i = a; i < e; i++)
        count[b->cl[i] + 1]++;
    for (int k = 1; k < 257; k++)
        count[k] += count[k - 1];
    for (size_t i = a; i < e; i++)
        b->tmp[count[b->cl[i]]++] = b->cp[i];
    for (size_t i = 0; i < n; i++) {
        b->cp[a + i] = b->tmp[i];
        b->cl[a + i] = (unsigned char)ccc(b->tmp[i]);
    }
    return CT_OK;
}

static ct_status put_utf8(unsigned char **out, size_t *olen, size_t *ocap, uint32_t cp)
{
    CT_TRY(ct_tok_grow((void **)out, ocap, *olen + 4, 1));
    unsigned char *p = *out + *olen;
    if (cp & RAW_BYTE) {
        p[0] = (unsigned char)(cp & 0xFF);
        *olen += 1;
    } else if (cp < 0x80) {
        p[0] = (unsigned char)cp;
        *olen += 1;
    } else if (cp < 0x800) {
        p[0] = (unsigned char)(0xC0 | cp >> 6);
        p[1] = (unsigned char)(0x80 | (cp & 0x3F));
        *olen += 2;
    } else if (cp < 0x10000) {
        p[0] = (unsigned char)(0xE0 | cp >> 12);
        p[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        p[2] = (unsigned char)(0x80 | (cp & 0x3F));
        *olen += 3;
    } else {
        p[0] = (unsigned char)(0xF0 | cp >> 18);
        p[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
        p[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        p[3] = (unsigned char)(0x80 | (cp & 0x3F));
        *olen += 4;
    }
    return CT_OK;
}

static bool unstable(uint32_t cp)
{
    if (cp == 0xFFFFFFFFu || cp < 0x300) return false;
    size_t lo = 0, hi = ct_uni_nfc_unstable_n;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (cp < ct_uni_nfc_unstable[m][0])
            hi = m;
        else if (cp > ct_uni_nfc_unstable[m][1])
            lo = m + 1;
        else
            return true;
    }
    return false;
}

/* NFC of the stretch s[0..n) appended to out. */
static ct_status stretch(cpbuf *b, const unsigned char *s, size_t n, unsigned char **out,
                         size_t *olen, size_t *ocap)
{
    b->n = 0;
    for (size_t i = 0, k; i < n; i += k) {
        uint32_t cp = ct_utf8_at(s, n, i, &k);
        CT_TRY(cp == 0xFFFFFFFFu ? push(b, RAW_BYTE | s[i]) : decompose(b, cp, 0));
    }
    for (size_t i = 0; i < b->n;) {
        if (!b->cl[i]) {
            i++;
            continue;
        }
        size_t e = i;
        while (e < b->n && b->cl[e])
            e++;
        CT_TRY(reorder(b, i, e));
        i = e;
    }
    size_t starter = SIZE_MAX, m = 0;
    int last = 0;
    for (size_t i = 0; i < b->n; i++) {
        uint32_t c = b->cp[i];
        int k = b->cl[i];
        if (starter != SIZE_MAX && (m == starter + 1 || (last != 0 && last < k))) {
            uint32_t x = compose(b->cp[starter], c);
            if (x) {
                b->cp[starter] = x;
                continue;
            }
        }
        if (k == 0) starter = m;
        last = k;
        b->cp[m++] = c;
    }
    for (size_t i = 0; i < m; i++)
        CT_TRY(put_utf8(out, olen, ocap, b->cp[i]));
    return CT_OK;
}

ct_status ct_nfc_append(const unsigned char *s, size_t n, unsigned char **out, size_t *olen,
                        size_t *ocap)
{
    cpbuf b;
    memset(&b, 0, sizeof b);
    ct_status st = CT_OK;
    size_t i = 0;
    while (i < n && st == CT_OK) {
        /* the next unstable character j, and the character before it (from i on) */
        size_t j = i, prev = i, k = 1;
        bool found = false;
        for (; j < n; j += k) {
            if (s[j] < 0x80) {
                k = 1;
            } else if (unstable(ct_utf8_at(s, n, j, &k))) {
                found = true;
                break;
            }
            prev = j;
        }
        size_t from = found ? (j > i ? prev : j) : n;
        if (from > i && (st = ct_tok_grow((void **)out, ocap, *olen + (from - i), 1)) == CT_OK) {
            memcpy(*out + *olen, s + i, from - i);
            *olen += from - i;
        }
        if (!found || st) break;
        size_t e = j + k;
        while (e < n && s[e] >= 0x80 && unstable(ct_utf8_at(s, n, e, &k)))
            e += k;
        st = stretch(&b, s + from, e - from, out, olen, ocap);
        i = e;
    }
    ct_free(b.cp);
    ct_free(b.cl);
    ct_free(b.tmp);
    return st;
}
