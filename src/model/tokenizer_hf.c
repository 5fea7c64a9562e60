/* Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen2 styles) and GPT-2's
 * encoder.json + vocab.bpe, read into the shared tables of tokenizer_internal.h. Everything a
 * file describes is checked before it is used: ids dense and unique, every merge's halves and
 * result in the vocabulary, all 256 bytes present, lengths bounded; a setting ctorch cannot
 * honour (another model type, normalizer, pre-tokenizer or regex, an added token that strips
 * spaces) is refused by name rather than ignored. */
#include "model/hf_internal.h"
#include "model/tokenizer_internal.h"

#include <stdio.h>
#include <string.h>

#define MAX_IDS (1 << 21)

static const struct {
    int kind;
    const char *pattern;
} known_patterns[] = {
    {PRE_GPT2, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
    {PRE_LLAMA3, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                 "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {PRE_QWEN2, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

static const char *type_of(const json_t *o)
{
    const char *t = json_string_value(json_object_get(o, "type"));
    return t ? t : "";
}

static bool is_false(const json_t *v)
{
    return !v || json_is_null(v) || json_is_false(v);
}

static ct_status byte_level(const json_t *o, const char *what, bool *use_regex)
{
    if (!is_false(json_object_get(o, "add_prefix_space")))
        return ct_error(CT_EUNSUPPORTED,
                        "tokenizer: %s: ByteLevel with add_prefix_space is not supported", what);
    const json_t *r = json_object_get(o, "use_regex");
    *use_regex = !r || json_is_true(r);
    return CT_OK;
}

static ct_status split_kind(const json_t *o, const char *what, int *kind)
{
    const json_t *pat = json_object_get(o, "pattern");
    const char *re = json_string_value(json_object_get(pat, "Regex"));
    const char *beh = json_string_value(json_object_get(o, "behavior"));
    if (!re)
        return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: a Split pre-tokenizer needs a \"Regex\" "
                        "pattern", what);
    if (!beh || strcmp(beh, "Isolated") || !is_false(json_object_get(o, "invert")))
        return ct_error(CT_EUNSUPPORTED,
                        "tokenizer: %s: Split behavior '%s' (or invert) is not supported; "
                        "\"Isolated\" is",
                        what, beh ? beh : "");
    for (size_t i = 0; i < sizeof known_patterns / sizeof known_patterns[0]; i++)
        if (!strcmp(re, known_patterns[i].pattern)) {
            *kind = known_patterns[i].kind;
            return CT_OK;
        }
    return ct_error(CT_EUNSUPPORTED,
                    "tokenizer: %s: the split regex '%.200s' is not one ctorch implements (those "
                    "of GPT-2, Llama 3 and Qwen2)",
                    what, re);
}

static ct_status pre_tokenizer(const json_t *p, const char *what, int *kind)
{
    bool use_regex = true;
    if (!p || json_is_null(p))
        return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: no pre_tokenizer: only byte-level BPE "
                        "is supported", what);
    if (!strcmp(type_of(p), "ByteLevel")) {
        CT_TRY(byte_level(p, what, &use_regex));
        *kind = use_regex ? PRE_GPT2 : PRE_NONE;
        return CT_OK;
    }
    if (!strcmp(type_of(p), "Split")) {
        return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: a Split pre-tokenizer without ByteLevel "
                        "is not byte-level BPE", what);
    }
    if (strcmp(type_of(p), "Sequence"))
        return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: pre_tokenizer '%s' is not supported", what,
                        type_of(p));
    const json_t *list = json_object_get(p, "pretokenizers");
    size_t n = json_array_size(list);
    int split = -1;
    bool have_bl = false;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(list, i);
        if (!strcmp(type_of(e), "Split") && split < 0 && !have_bl) {
            CT_TRY(split_kind(e, what, &split));
        } else if (!strcmp(type_of(e), "ByteLevel") && !have_bl) {
            CT_TRY(byte_level(e, what, &use_regex));
            if (use_regex && split >= 0)
                return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: a Split followed by ByteLevel "
                                "with use_regex is not supported", what);
            if (use_regex) split = PRE_GPT2;
            have_bl = true;
        } else {
            return ct_error(CT_EUNSUPPORTED,
                            "tokenizer: %s: pre_tokenizer Sequence item %zu ('%s') is not "
                            "supported (Split then ByteLevel is)",
                            what, i, type_of(e));
        }
    }
    if (!have_bl)
        return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: the pre_tokenizer has no ByteLevel step",
                        what);
    *kind = split < 0 ? PRE_NONE : split;
    return CT_OK;
}

static ct_status normalizer(const json_t *n, const char *what, bool *nfc)
{
    *nfc = false;
    if (!n || json_is_null(n)) return CT_OK;
    if (!strcmp(type_of(n), "NFC")) {
        *nfc = true;
        return CT_OK;
    }
    if (!strcmp(type_of(n), "Sequence")) {
        const json_t *l = json_object_get(n, "normalizers");
        for (size_t i = 0; i < json_array_size(l); i++)
            CT_TRY(normalizer(json_array_get(l, i), what, nfc));
        return CT_OK;
    }
    return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: normalizer '%s' is not supported (none or "
                    "NFC are)", what, type_of(n));
}

/* A byte-level token string (code points of the byte map) into bytes; false if a code point
 * is outside the map. */
static bool unmap(const char *s, size_t n, char *out, size_t *m)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t w;
        uint32_t cp = ct_utf8_at(u, n, i, &w);
        int b = cp == 0xFFFFFFFFu ? -1 : ct_char_byte(cp);
        if (b < 0) return false;
        out[k++] = (char)b;
        i += w;
    }
    *m = k;
    return true;
}

/* Whether a vocab entry (byte-level alphabet) and an added token's content are one token: the
 * same text as written, or the same bytes once the entry is mapped back (GPT-2's
 * <|endoftext|> is both). */
static bool same_token(const char *vocab, size_t vn, const char *content, size_t cn)
{
    if (vn == cn && !memcmp(vocab, content, cn)) return true;
    char buf[64];
    size_t m;
    return vn <= sizeof buf && unmap(vocab, vn, buf, &m) && m == cn && !memcmp(buf, content, cn);
}

/* The id string of a token given as "<s>" or {"content": "<s>"} in tokenizer_config.json. */
static const char *token_name(const json_t *v)
{
    if (json_is_string(v)) return json_string_value(v);
    return json_string_value(json_object_get(v, "content"));
}

static int32_t special_named(const ct_tokenizer *t, const char *name)
{
    if (!name) return -1;
    size_t n = strlen(name);
    for (size_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        if (t->off[id + 1] - t->off[id] == n && !memcmp(t->bytes + t->off[id], name, n)) return id;
    }
    return ct_tok_lookup(t, name, n);
}

/* BOS / EOS from a TemplateProcessing post-processor: special tokens before / after $A. */
static ct_status template_tokens(ct_tokenizer *t, const json_t *pp, const char *what)
{
    if (!pp || json_is_null(pp)) return CT_OK;
    const char *ty = type_of(pp);
    if (!strcmp(ty, "Sequence")) {
        const json_t *l = json_object_get(pp, "processors");
        for (size_t i = 0; i < json_array_size(l); i++)
            CT_TRY(template_tokens(t, json_array_get(l, i), what));
        return CT_OK;
    }
    if (!strcmp(ty, "ByteLevel")) return CT_OK; /* offsets only */
    if (strcmp(ty, "TemplateProcessing"))
        return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: post_processor '%s' is not supported", what,
                        ty);
    const json_t *single = json_object_get(pp, "single");
    bool seen_a = false;
    int before = 0, after = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *e = json_array_get(single, i);
        const json_t *sp = json_object_get(e, "SpecialToken");
        if (json_object_get(e, "Sequence")) {
            seen_a = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        const json_t *ids = json_object_get(json_object_get(json_object_get(pp, "special_tokens"),
                                                            name ? name : ""),
                                            "ids");
        int32_t id = json_is_integer(json_array_get(ids, 0))
                         ? (int32_t)json_integer_value(json_array_get(ids, 0))
                         : special_named(t, name);
        if (!name || id < 0 || id >= t->vocab || json_array_size(ids) > 1)
            return ct_error(CT_EFORMAT, "tokenizer: %s: post_processor item %zu names no single "
                            "known token", what, i);
        if (!seen_a) {
            t->bos = id;
            t->add_bos = true;
            before++;
        } else {
            t->eos = id;
            t->add_eos = true;
            after++;
        }
    }
    if (before > 1 || after > 1)
        return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: a post_processor template with more than "
                        "one token before or after the text is not supported", what);
    return CT_OK;
}

/* The id of tokenizer_config.json's bos_token / eos_token v (a token string, or an object with
 * "content" as transformers writes AddedToken), or an error naming what is there. */
static ct_status config_token(const ct_tokenizer *t, const json_t *v, const char *key,
                              const char *what, int32_t *id)
{
    const char *name = token_name(v);
    if (!name) {
        char val[48] = "";
        if (json_is_integer(v))
            snprintf(val, sizeof val, " %lld", (long long)json_integer_value(v));
        else if (json_is_real(v))
            snprintf(val, sizeof val, " %g", json_real_value(v));
        return ct_error(CT_EFORMAT,
                        "tokenizer: %s: tokenizer_config.json's %s is %s%s, not a token: it must "
                        "be the token's text (\"<s>\") or {\"content\": \"<s>\", ...} (an id "
                        "goes in config.json's %s_id)",
                        what, key,
                        json_is_integer(v) ? "the integer"
                        : json_is_real(v)  ? "the number"
                        : json_is_boolean(v) ? "a boolean"
                        : json_is_array(v)   ? "an array"
                        : json_is_object(v)  ? "an object without a \"content\" string"
                                             : "not a string",
                        val, key);
    }
    *id = special_named(t, name);
    if (*id < 0)
        return ct_error(CT_EFORMAT,
                        "tokenizer: %s: tokenizer_config.json's %s '%.100s' is not one of the "
                        "tokenizer's added tokens (added_tokens of tokenizer.json)",
                        what, key, name);
    return CT_OK;
}

static ct_status apply_config(ct_tokenizer *t, const json_t *cfg, const char *what)
{
    if (!json_is_object(cfg)) return CT_OK;
    const json_t *b = json_object_get(cfg, "bos_token"), *e = json_object_get(cfg, "eos_token");
    if (b && !json_is_null(b)) CT_TRY(config_token(t, b, "bos_token", what, &t->bos));
    if (e && !json_is_null(e)) CT_TRY(config_token(t, e, "eos_token", what, &t->eos));
    if (json_is_true(json_object_get(cfg, "add_bos_token"))) t->add_bos = true;
    if (json_is_true(json_object_get(cfg, "add_eos_token"))) t->add_eos = true;
    if (json_is_false(json_object_get(cfg, "add_bos_token"))) t->add_bos = false;
    if (json_is_false(json_object_get(cfg, "add_eos_token"))) t->add_eos = false;
    return CT_OK;
}

/* Merge i as two token strings. */
static bool merge_parts(const json_t *m, const char **a, size_t *an, const char **b, size_t *bn)
{
    if (json_is_array(m)) {
        if (json_array_size(m) != 2 || !json_is_string(json_array_get(m, 0)) ||
            !json_is_string(json_array_get(m, 1)))
            return false;
        *a = json_string_value(json_array_get(m, 0));
        *an = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *bn = json_string_length(json_array_get(m, 1));
        return true;
    }
    if (!json_is_string(m)) return false;
    const char *s = json_string_value(m);
    size_t n = json_string_length(m);
    const char *sp = memchr(s, ' ', n);
    if (!sp || sp == s || sp == s + n - 1 || memchr(sp + 1, ' ', (size_t)(s + n - sp - 1)))
        return false;
    *a = s;
    *an = (size_t)(sp - s);
    *b = sp + 1;
    *bn = (size_t)(s + n - sp - 1);
    return true;
}

typedef struct {
    const char *str; /* token text as in the file */
    size_t len;
    bool added;
} slot;

ct_status ct_tok_from_hf_json(json_t *root, const char *text, size_t len, const char *config,
                              const char *what, ct_tokenizer **out)
{
    *out = NULL;
    const json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(model) || (json_object_get(model, "type") && strcmp(type_of(model), "BPE")))
        return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: model type '%s' is not supported (BPE is)",
                        what, type_of(model));
    if (!json_is_object(vocab) || !json_is_array(merges))
        return ct_error(CT_EFORMAT, "tokenizer: %s: model needs a \"vocab\" object and a "
                        "\"merges\" array", what);
    if (!is_false(json_object_get(model, "byte_fallback")) ||
        (json_object_get(model, "dropout") && !json_is_null(json_object_get(model, "dropout"))))
        return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: BPE byte_fallback / dropout are not "
                        "supported", what);
    const char *cs = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *ew = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((cs && *cs) || (ew && *ew))
        return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: continuing_subword_prefix / "
                        "end_of_word_suffix are not supported", what);
    const json_t *dec = json_object_get(root, "decoder");
    if (dec && !json_is_null(dec) && strcmp(type_of(dec), "ByteLevel"))
        return ct_error(CT_EUNSUPPORTED, "tokenizer: %s: decoder '%s' is not supported (ByteLevel "
                        "is)", what, type_of(dec));
    size_t nv = json_object_size(vocab), na = json_array_size(added), nm = json_array_size(merges);
    if (nv > MAX_IDS || na > MAX_IDS || nm > MAX_IDS)
        return ct_error(CT_EFORMAT, "tokenizer: %s: more than 2^21 tokens, added tokens or merges",
                        what);
    if (added && !json_is_array(added))
        return ct_error(CT_EFORMAT, "tokenizer: %s: \"added_tokens\" must be an array", what);
    int pretok = PRE_NONE;
    bool nfc;
    CT_TRY(pre_tokenizer(json_object_get(root, "pre_tokenizer"), what, &pretok));
    CT_TRY(normalizer(json_object_get(root, "normalizer"), what, &nfc));

    /* ids: dense, each defined once (an added token may restate a vocabulary entry) */
    int64_t V = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= MAX_IDS)
            return ct_error(CT_EFORMAT, "tokenizer: %s: vocab entry '%.100s' needs an id in "
                            "[0, 2^21)", what, key);
        if (id + 1 > V) V = id + 1;
    }
    for (size_t i = 0; i < na; i++) {
        const json_t *a = json_array_get(added, i);
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (!json_is_integer(json_object_get(a, "id")) || id < 0 || id >= MAX_IDS ||
            !json_is_string(json_object_get(a, "content")))
            return ct_error(CT_EFORMAT, "tokenizer: %s: added token %zu needs an id in [0, 2^21) "
                            "and a content string", what, i);
        if (id + 1 > V) V = id + 1;
    }
    if (V == 0) return ct_error(CT_EFORMAT, "tokenizer: %s: an empty vocabulary", what);
    ct_tokenizer *t = NULL;
    slot *sl = NULL;
    char *tmp = NULL;
    ct_status s;
    if ((s = ct_calloc((void **)&sl, (size_t)V * sizeof *sl))) return s;
    if ((s = ct_calloc((void **)&t, sizeof *t))) goto fail;
    t->format = TOK_HF;
    t->pretok = pretok;
    t->nfc = nfc;
    t->vocab = V;
    t->bos = t->eos = -1;
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (sl[id].str) {
            s = ct_error(CT_EFORMAT, "tokenizer: %s: id %lld is given to two vocab entries", what,
                         (long long)id);
            goto fail;
        }
        sl[id].str = key;
        sl[id].len = strlen(key);
    }
    for (size_t i = 0; i < na; i++) {
        const json_t *a = json_array_get(added, i);
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        const char *c = json_string_value(json_object_get(a, "content"));
        size_t cl = json_string_length(json_object_get(a, "content"));
        if (!cl || cl > CT_TOKENIZER_MAX_TOKEN_BYTES) {
            s = ct_error(CT_EFORMAT, "tokenizer: %s: added token %zu has %zu bytes (1 .. %d "
                         "allowed)", what, i, cl, CT_TOKENIZER_MAX_TOKEN_BYTES);
            goto fail;
        }
        if (!is_false(json_object_get(a, "lstrip")) || !is_false(json_object_get(a, "rstrip")) ||
            !is_false(json_object_get(a, "single_word"))) {
            s = ct_error(CT_EUNSUPPORTED, "tokenizer: %s: added token '%.100s' strips spaces or "
                         "matches single words only, which is not supported", what, c);
            goto fail;
        }
        if (sl[id].added) {
            s = ct_error(CT_EFORMAT, "tokenizer: %s: id %lld is given to two added tokens", what,
                         (long long)id);
            goto fail;
        }
        if (sl[id].str && !same_token(sl[id].str, sl[id].len, c, cl)) {
            /* the vocab's token at that id would be lost (and with it, say, a byte) */
            s = ct_error(CT_EFORMAT,
                         "tokenizer: %s: added token %zu ('%.100s') has id %lld, which the "
                         "vocab gives to '%.100s': an id names one token (give the added token "
                         "an id past the vocab, or the vocab entry's own text)",
                         what, i, c, (long long)id, sl[id].str);
            goto fail;
        }
        sl[id].str = c;
        sl[id].len = cl;
        sl[id].added = true;
    }
    /* bytes of every id: vocab entries through the byte map, added tokens as written */
    if ((s = ct_alloc((void **)&t->off, (size_t)(V + 1) * sizeof(size_t)))) goto fail;
    t->off[0] = 0;
    for (int64_t id = 0; id < V; id++) {
        if (!sl[id].str) {
            s = ct_error(CT_EFORMAT, "tokenizer: %s: no token has id %lld (ids must be 0 .. %lld "
                         "without gaps)", what, (long long)id, (long long)(V - 1));
            goto fail;
        }
        if (sl[id].len > 4 * CT_TOKENIZER_MAX_TOKEN_BYTES) {
            s = ct_error(CT_EFORMAT, "tokenizer: %s: token %lld is longer than %d bytes", what,
                         (long long)id, CT_TOKENIZER_MAX_TOKEN_BYTES);
            goto fail;
        }
        size_t n = sl[id].len; /* an upper bound: the byte map only shrinks a string */
        if (t->off[id] + n > CT_TOKENIZER_MAX_TOTAL_BYTES) {
            s = ct_error(CT_EFORMAT, "tokenizer: %s: the tokens' bytes add up to more than %d MiB",
                         what, CT_TOKENIZER_MAX_TOTAL_BYTES >> 20);
            goto fail;
        }
        t->off[id + 1] = t->off[id] + n;
    }
    if ((s = ct_alloc((void **)&t->bytes, t->off[V] + 1))) goto fail;
    size_t pos = 0;
    for (int64_t id = 0; id < V; id++) {
        size_t m = sl[id].len;
        if (sl[id].added) {
            memcpy(t->bytes + pos, sl[id].str, m);
        } else if (!unmap(sl[id].str, sl[id].len, t->bytes + pos, &m)) {
            s = ct_error(CT_EFORMAT, "tokenizer: %s: vocab entry '%.100s' (id %lld) has a character "
                         "outside the byte-level alphabet", what, sl[id].str, (long long)id);
            goto fail;
        }
        if (m > CT_TOKENIZER_MAX_TOKEN_BYTES || m == 0) {
            s = ct_error(CT_EFORMAT, "tokenizer: %s: token %lld has %zu bytes (1 .. %d allowed)",
                         what, (long long)id, m, CT_TOKENIZER_MAX_TOKEN_BYTES);
            goto fail;
        }
        t->off[id] = pos;
        pos += m;
    }
    t->off[V] = pos;
    t->bytes[pos] = '\0';
    if ((s = ct_tok_build_map(t, V))) goto fail;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        if ((t->byte_id[b] = ct_tok_lookup(t, &c, 1)) < 0) {
            s = ct_error(CT_EFORMAT, "tokenizer: %s: no token for byte 0x%02x: not a byte-level "
                         "vocabulary", what, b);
            goto fail;
        }
    }
    /* merges, in rank order */
    t->n_merges = (int64_t)nm;
    if ((s = ct_alloc((void **)&t->merges, (3 * nm + 1) * sizeof(int32_t))) ||
        (s = ct_alloc((void **)&tmp, 2 * CT_TOKENIZER_MAX_TOKEN_BYTES + 8)))
        goto fail;
    for (size_t i = 0; i < nm; i++) {
        const char *a, *b;
        size_t an, bn, am, bm;
        if (!merge_parts(json_array_get(merges, i), &a, &an, &b, &bn)) {
            s = ct_error(CT_EFORMAT, "tokenizer: %s: merge %zu must be \"a b\" or [\"a\", \"b\"]",
                         what, i);
            goto fail;
        }
        int32_t ia = -1, ib = -1, ir = -1;
        if (an <= 4 * CT_TOKENIZER_MAX_TOKEN_BYTES && bn <= 4 * CT_TOKENIZER_MAX_TOKEN_BYTES &&
            unmap(a, an, tmp, &am) && am <= CT_TOKENIZER_MAX_TOKEN_BYTES &&
            (ia = ct_tok_lookup(t, tmp, am)) >= 0 && unmap(b, bn, tmp + am, &bm) &&
            bm <= CT_TOKENIZER_MAX_TOKEN_BYTES && (ib = ct_tok_lookup(t, tmp + am, bm)) >= 0)
            ir = ct_tok_lookup(t, tmp, am + bm);
        if (ir < 0) {
            s = ct_error(CT_EFORMAT, "tokenizer: %s: merge %zu ('%.60s' + '%.60s'): %s is not in "
                         "the vocabulary", what, i, a, b,
                         ia < 0 ? "the first part" : ib < 0 ? "the second part" : "the result");
            goto fail;
        }
        t->merges[3 * i] = ia;
        t->merges[3 * i + 1] = ib;
        t->merges[3 * i + 2] = ir;
    }
    if ((s = ct_tok_build_ranks(t))) goto fail;
    /* added tokens are matched in the text before it is split */
    if ((s = ct_alloc((void **)&t->special, (na + 1) * sizeof(int32_t)))) goto fail;
    for (int64_t id = 0; id < V; id++)
        if (sl[id].added) t->special[t->n_special++] = (int32_t)id;
    if ((s = ct_tok_index_special(t))) goto fail;
    /* BOS / EOS: the post-processor's template, then tokenizer_config.json (ctorch keeps it in
     * the "ctorch" key of the JSON it writes), then the usual names */
    if ((s = template_tokens(t, json_object_get(root, "post_processor"), what))) goto fail;
    if ((s = apply_config(t, json_object_get(root, "ctorch"), what))) goto fail;
    const char *fmt = json_string_value(json_object_get(json_object_get(root, "ctorch"), "format"));
    if (fmt && !strcmp(fmt, "gpt2-bpe")) t->format = TOK_GPT2;
    json_t *cfg = NULL;
    if (config) {
        json_error_t err;
        /* transformers writes model_max_length as 1e30 in integer form (Llama 3): read
         * integers beyond int64 as reals, as config.json is read */
        cfg = hf_json_loadb(config, strlen(config), 0, &err);
        if (!cfg) {
            s = ct_error(CT_EFORMAT, "tokenizer: %s: tokenizer_config.json is not JSON (line %d: "
                         "%s)", what, err.line, err.text);
            goto fail;
        }
        s = apply_config(t, cfg, what);
        if (s) {
            json_decref(cfg);
            goto fail;
        }
    }
    static const char *eos_names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>"};
    for (size_t k = 0; k < 4 && t->eos < 0; k++)
        t->eos = special_named(t, eos_names[k]);
    /* keep the JSON for to_json; the settings read from tokenizer_config.json go with it */
    if (cfg) {
        json_t *keep = json_pack("{s:b, s:b}", "add_bos_token", t->add_bos, "add_eos_token",
                                 t->add_eos);
        if (t->bos >= 0)
            json_object_set_new(keep, "bos_token",
                                json_stringn(t->bytes + t->off[t->bos],
                                             t->off[t->bos + 1] - t->off[t->bos]));
        if (t->eos >= 0)
            json_object_set_new(keep, "eos_token",
                                json_stringn(t->bytes + t->off[t->eos],
                                             t->off[t->eos + 1] - t->off[t->eos]));
        json_object_set_new(root, "ctorch", keep);
        json_decref(cfg);
        char *d = json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII);
        size_t dn = d ? strlen(d) : 0;
        if (!d || (s = ct_alloc((void **)&t->json, dn + 1))) {
            free(d);
            s = s ? s : ct_error(CT_ENOMEM, "tokenizer: %s: out of memory", what);
            goto fail;
        }
        memcpy(t->json, d, dn + 1);
        free(d);
    } else {
        if ((s = ct_alloc((void **)&t->json, len + 1))) goto fail;
        memcpy(t->json, text, len);
        t->json[len] = '\0';
    }
    ct_free(sl);
    ct_free(tmp);
    *out = t;
    return CT_OK;
fail:
    ct_free(sl);
    ct_free(tmp);
    ct_tokenizer_free(t);
    return s;
}

ct_status ct_tokenizer_from_gpt2(const char *encoder_json, size_t encoder_len,
                                 const char *vocab_bpe, size_t bpe_len, ct_tokenizer **out)
{
    if (!out || !encoder_json || (bpe_len && !vocab_bpe))
        return ct_error(CT_EINVAL, "ct_tokenizer_from_gpt2: arguments must not be NULL");
    *out = NULL;
    if (encoder_len > CT_TOKENIZER_MAX_FILE_BYTES || bpe_len > CT_TOKENIZER_MAX_FILE_BYTES)
        return ct_error(CT_EFORMAT, "tokenizer: GPT-2 files larger than %d MiB",
                        CT_TOKENIZER_MAX_FILE_BYTES >> 20);
    CT_TRY(ct_tok_json_no_nul(encoder_json, encoder_len, "encoder.json"));
    json_error_t err;
    json_t *enc = json_loadb(encoder_json, encoder_len, 0, &err);
    if (!enc) return ct_error(CT_EFORMAT, "tokenizer: encoder.json is not JSON (line %d: %s)",
                              err.line, err.text);
    if (!json_is_object(enc)) {
        json_decref(enc);
        return ct_error(CT_EFORMAT, "tokenizer: encoder.json must map token -> id");
    }
    json_t *merges = json_array();
    ct_status s = CT_OK;
    size_t i = 0, line = 0;
    while (i < bpe_len && s == CT_OK) {
        const char *e = memchr(vocab_bpe + i, '\n', bpe_len - i);
        size_t end = e ? (size_t)(e - vocab_bpe) : bpe_len, a = i, b;
        line++;
        i = end + 1;
        if (end > a && vocab_bpe[end - 1] == '\r') end--;
        if (end == a || (line == 1 && end - a >= 8 && !memcmp(vocab_bpe + a, "#version", 8)))
            continue;
        if (json_array_size(merges) >= MAX_IDS) {
            s = ct_error(CT_EFORMAT, "tokenizer: vocab.bpe has more than 2^21 merges");
            break;
        }
        for (b = a; b < end && vocab_bpe[b] != ' '; b++) {
        }
        size_t c = b + 1;
        if (b == a || b + 1 >= end || memchr(vocab_bpe + c, ' ', end - c)) {
            s = ct_error(CT_EFORMAT, "tokenizer: vocab.bpe line %zu must be two tokens split by "
                         "one space", line);
            break;
        }
        json_t *pair = json_array();
        json_array_append_new(pair, json_stringn(vocab_bpe + a, b - a));
        json_array_append_new(pair, json_stringn(vocab_bpe + c, end - c));
        if (!json_string_value(json_array_get(pair, 0)) || !json_string_value(json_array_get(pair, 1)))
            s = ct_error(CT_EFORMAT, "tokenizer: vocab.bpe line %zu is not UTF-8", line);
        json_array_append_new(merges, pair);
    }
    json_t *root = NULL;
    if (s == CT_OK) {
        json_t *added = json_array();
        json_t *eot = json_object_get(enc, CT_TOKENIZER_EOS_TEXT);
        if (json_is_integer(eot))
            json_array_append_new(added, json_pack("{s:O, s:s, s:b, s:b, s:b, s:b, s:b}", "id", eot,
                                                   "content", CT_TOKENIZER_EOS_TEXT, "single_word",
                                                   0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                                   "special", 1));
        root = json_pack("{s:s, s:o, s:n, s:{s:s, s:b, s:b, s:b}, s:n, s:{s:s}, s:{s:s, s:O, s:o}}",
                         "version", "1.0", "added_tokens", added, "normalizer", "pre_tokenizer",
                         "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
                         "use_regex", 1, "post_processor", "decoder", "type", "ByteLevel",
                         "model", "type", "BPE", "vocab", enc, "merges", merges);
        merges = NULL;
        if (root && json_is_integer(eot))
            json_object_set_new(root, "ctorch",
                                json_pack("{s:s, s:s, s:s}", "format", "gpt2-bpe", "bos_token",
                                          CT_TOKENIZER_EOS_TEXT, "eos_token",
                                          CT_TOKENIZER_EOS_TEXT));
        char *text = root ? json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        if (!text)
            s = ct_error(CT_ENOMEM, "tokenizer: GPT-2 files: out of memory");
        else
            s = ct_tok_from_hf_json(root, text, strlen(text), NULL, "encoder.json + vocab.bpe", out);
        free(text);
        if (s == CT_OK) (*out)->format = TOK_GPT2;
    }
    json_decref(merges);
    json_decref(root);
    json_decref(enc);
    return s;
}
