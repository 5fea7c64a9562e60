/* Pre-tokenizers: where a text is cut into the pieces that BPE merges never cross.
 *
 * ctorch's own rule (the ctorch-bpe format), and the split regexes of the Hugging Face
 * byte-level BPE tokenizers, each matched by hand exactly as a backtracking regex engine
 * matches it (first alternative that matches, greedy quantifiers, one step of backtracking
 * for the \s+(?!\S) lookahead):
 *   GPT-2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama 3 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   Qwen2   the same with \p{N} for \p{N}{1,3}
 * \p{L}, \p{N}: the Unicode general categories L* and N* (tokenizer_unicode.c); \s: the
 * White_Space property (as Oniguruma, Rust's regex and Python's regex define it); (?i:...):
 * ASCII case folding. A byte that is not valid UTF-8 is a character of its own, in none of
 * the classes. */
#include "model/tokenizer_internal.h"

enum { CL_L, CL_N, CL_S, CL_O };

/* ASCII classes: L letters, N digits, S whitespace, O the rest. */
static const unsigned char ascii_cl[128] = {
#define O CL_O
#define S CL_S
#define N CL_N
#define L CL_L
    O, O, O, O, O, O, O, O, O, S, S, S, S, S, O, O, O, O, O, O, O, O, O, O, O, O, O, O, O, O, O, O,
    S, O, O, O, O, O, O, O, O, O, O, O, O, O, O, O, N, N, N, N, N, N, N, N, N, N, O, O, O, O, O, O,
    O, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, O, O, O, O, O,
    O, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, L, O, O, O, O, O,
#undef O
#undef S
#undef N
#undef L
};

static bool in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0])
            hi = mid;
        else if (cp > r[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

bool ct_uni_is_letter(uint32_t cp)
{
    return cp < 128 ? ascii_cl[cp] == CL_L : in_ranges(ct_uni_letter, ct_uni_letter_n, cp);
}

bool ct_uni_is_number(uint32_t cp)
{
    return cp < 128 ? ascii_cl[cp] == CL_N : in_ranges(ct_uni_number, ct_uni_number_n, cp);
}

bool ct_uni_is_space(uint32_t cp)
{
    if (cp < 128) return ascii_cl[cp] == CL_S;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

uint32_t ct_utf8_at(const unsigned char *s, size_t len, size_t i, size_t *n)
{
    unsigned c = s[i];
    size_t k;
    uint32_t cp, min;
    if (c < 0x80) {
        *n = 1;
        return c;
    } else if ((c & 0xE0) == 0xC0) {
        k = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        k = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        k = 4, cp = c & 0x07, min = 0x10000;
    } else {
        goto bad;
    }
    if (i + k > len) goto bad;
    for (size_t j = 1; j < k; j++) {
        if ((s[i + j] & 0xC0) != 0x80) goto bad;
        cp = (cp << 6) | (s[i + j] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto bad;
    *n = k;
    return cp;
bad:
    *n = 1;
    return 0xFFFFFFFFu;
}

typedef struct {
    uint32_t cp;
    size_t n;
    int cl;
} uch;

static inline void at(const unsigned char *s, size_t len, size_t i, uch *u)
{
    if (s[i] < 0x80) {
        u->cp = s[i];
        u->n = 1;
        u->cl = ascii_cl[s[i]];
        return;
    }
    u->cp = ct_utf8_at(s, len, i, &u->n);
    u->cl = u->cp == 0xFFFFFFFFu      ? CL_O
            : ct_uni_is_letter(u->cp) ? CL_L
            : ct_uni_is_number(u->cp) ? CL_N
            : ct_uni_is_space(u->cp)  ? CL_S
                                      : CL_O;
}

/* End of the run of class cl that starts at i. */
static size_t run(const unsigned char *s, size_t len, size_t i, int cl)
{
    uch u;
    while (i < len) {
        if (s[i] < 0x80) {
            if (ascii_cl[s[i]] != cl) break;
            i++;
            continue;
        }
        at(s, len, i, &u);
        if (u.cl != cl) break;
        i += u.n;
    }
    return i;
}

/* \s+(?!\S)|\s+ at i (s[i] is whitespace). */
static size_t space_tail(const unsigned char *s, size_t len, size_t i)
{
    size_t j = i, last = i, count = 0;
    uch u;
    while (j < len) {
        at(s, len, j, &u);
        if (u.cl != CL_S) break;
        last = j;
        j += u.n;
        count++;
    }
    if (j == len || count == 1) return j;
    return last; /* leave the last whitespace character to the next piece */
}

/* 's|'t|'re|'ve|'m|'ll|'d after the apostrophe at i; 0 if none. */
static size_t contraction(const unsigned char *s, size_t len, size_t i, bool fold)
{
    if (i + 1 >= len) return 0;
    unsigned a = s[i + 1], b = i + 2 < len ? s[i + 2] : 0;
    if (fold) {
        a = a >= 'A' && a <= 'Z' ? a + 32 : a;
        b = b >= 'A' && b <= 'Z' ? b + 32 : b;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
}

static size_t gpt2_end(const unsigned char *s, size_t len, size_t i)
{
    uch c, d;
    at(s, len, i, &c);
    if (c.cp == '\'') {
        size_t j = contraction(s, len, i, false);
        if (j) return j;
    }
    if (c.cp == ' ' && i + 1 < len) {
        at(s, len, i + 1, &d);
        if (d.cl != CL_S) return run(s, len, i + 1, d.cl);
    }
    if (c.cl != CL_S) return run(s, len, i, c.cl);
    return space_tail(s, len, i);
}

static size_t crlf_run(const unsigned char *s, size_t len, size_t j)
{
    while (j < len && (s[j] == '\r' || s[j] == '\n'))
        j++;
    return j;
}

static size_t llama_end(const unsigned char *s, size_t len, size_t i, int max_digits)
{
    uch c, d;
    at(s, len, i, &c);
    if (c.cp == '\'') {
        size_t j = contraction(s, len, i, true);
        if (j) return j;
    }
    if (c.cl == CL_L) return run(s, len, i, CL_L);
    bool has_next = i + c.n < len;
    if (has_next) at(s, len, i + c.n, &d);
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c.cp != '\r' && c.cp != '\n' && c.cl != CL_N && has_next && d.cl == CL_L)
        return run(s, len, i + c.n, CL_L);
    if (c.cl == CL_N) { /* \p{N}{1,max} */
        size_t j = i + c.n;
        for (int k = 1; k < max_digits && j < len; k++) {
            at(s, len, j, &d);
            if (d.cl != CL_N) break;
            j += d.n;
        }
        return j;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    if (c.cp == ' ' && has_next && d.cl == CL_O)
        return crlf_run(s, len, run(s, len, i + 1, CL_O));
    if (c.cl == CL_O) return crlf_run(s, len, run(s, len, i, CL_O));
    /* \s*[\r\n]+ : the whitespace run up to its last line break */
    size_t j = i, nl = 0;
    bool has_nl = false;
    while (j < len) {
        at(s, len, j, &d);
        if (d.cl != CL_S) break;
        if (d.cp == '\r' || d.cp == '\n') nl = j, has_nl = true;
        j += d.n;
    }
    if (has_nl) return nl + 1;
    return space_tail(s, len, i);
}

/* ctorch's own rule (tokenizer.h): runs of letters (ASCII and every byte >= 0x80), digits or
 * other printable bytes with at most one leading space; whitespace apart; runs are cut into
 * pieces of at most 256 bytes. */
enum { B_LETTER, B_DIGIT, B_OTHER, B_SPACE, B_NEWLINE };
#define MAX_PIECE 256

static int bcls(unsigned char c)
{
    if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return B_LETTER;
    if (c >= '0' && c <= '9') return B_DIGIT;
    if (c == '\n' || c == '\r') return B_NEWLINE;
    if (c == ' ' || c == '\t' || c == '\v' || c == '\f') return B_SPACE;
    return B_OTHER;
}

static size_t ctorch_end(const unsigned char *s, size_t len, size_t i)
{
    size_t j = i, lim = len - i > MAX_PIECE ? i + MAX_PIECE : len;
    int k = bcls(s[i]);
    if (s[i] == ' ' && i + 1 < len && bcls(s[i + 1]) <= B_OTHER) {
        k = bcls(s[i + 1]);
        j = i + 1;
    }
    while (j < lim && bcls(s[j]) == k)
        j++;
    if (k == B_SPACE && j < len && j - i > 1 && s[j - 1] == ' ' && bcls(s[j]) <= B_OTHER) j--;
    return j;
}

size_t ct_pretok_end(int kind, const unsigned char *s, size_t len, size_t i)
{
    switch (kind) {
    case PRE_CTORCH: return ctorch_end(s, len, i);
    case PRE_GPT2: return gpt2_end(s, len, i);
    case PRE_LLAMA3: return llama_end(s, len, i, 3);
    case PRE_QWEN2: return llama_end(s, len, i, 1);
    default: return len;
    }
}

size_t ct_nfc_unstable_at(const unsigned char *s, size_t len)
{
    for (size_t i = 0; i < len;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp = ct_utf8_at(s, len, i, &n);
        if (cp != 0xFFFFFFFFu && in_ranges(ct_uni_nfc_unstable, ct_uni_nfc_unstable_n, cp))
            return i;
        i += n;
    }
    return len;
}

/* Byte-level BPE's map (GPT-2's bytes_to_unicode): the printable bytes '!'..'~', 0xA1..0xAC
 * and 0xAE..0xFF stand for themselves; the 68 others, in order, for U+0100 .. U+0143. */
uint32_t ct_byte_char(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return (uint32_t)b;
    if (b <= 32) return 256u + (uint32_t)b;
    if (b <= 160) return 256u + 33u + (uint32_t)(b - 127);
    return 256u + 67u; /* 0xAD */
}

int ct_char_byte(uint32_t cp)
{
    if (cp < 256) {
        int b = (int)cp;
        return ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) ? b : -1;
    }
    if (cp >= 256 + 68) return -1;
    uint32_t n = cp - 256;
    return n <= 32 ? (int)n : n <= 66 ? (int)(127 + n - 33) : 173;
}
