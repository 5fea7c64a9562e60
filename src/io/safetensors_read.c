/* Safetensors reader: strict validation of the header, mmap, zero-copy views. */
#include "core/internal.h"
#include "io/io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Deeper JSON is refused before Jansson sees it (a valid header needs 3 levels). */
#define ST_MAX_DEPTH 64
/* Most tensors one file may list. The header is parsed into a JSON tree first (about 1 KB a
 * tensor) and then into the file's tables, so the count, not the header's bytes, sets the
 * memory an open takes: a 100 MB header of 1.7M empty tensors took 2-3 GB. 2^19 is five times
 * the largest real checkpoint files (about 100k tensors) and keeps an open under ~600 MB. */
#define ST_MAX_TENSORS ((size_t)1 << 19)

/* ---- errors --------------------------------------------------------------------------- */

typedef struct st_ctx {
    const char *label; /* the path, or "<memory>" */
    ct_st_rule rule;
} st_ctx;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static ct_status
st_fail(st_ctx *c, ct_st_rule rule, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->rule = rule;
    return ct_error(rule == CT_ST_RULE_OVERFLOW ? CT_EOVERFLOW : CT_EFORMAT,
                    "safetensors [%s]: %s: %s", ct_st_rule_name(rule), c->label, msg);
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "?";
}

/* ---- header scan ---------------------------------------------------------------------- */

/* One pass before JSON parsing: NUL bytes (raw or \u0000), UTF-8 validity, and nesting depth,
 * so Jansson never recurses deeply and each of these gets its own message. */
static ct_status st_prescan(st_ctx *c, const uint8_t *h, size_t n)
{
    int depth = 0;
    bool in_str = false, esc = false;
    size_t i = 0, keys = 0; /* keys: the top-level object's (tensors and __metadata__) */
    while (i < n) {
        uint8_t b = h[i];
        if (b == 0) return st_fail(c, CT_ST_RULE_NUL, "NUL byte at header byte %zu", i);
        if (b >= 0x80) {
            size_t k = ct_io_utf8_seq(h + i, n - i);
            if (!k)
                return st_fail(c, CT_ST_RULE_UTF8,
                               "byte 0x%02x at header byte %zu is not valid UTF-8 (names and "
                               "strings must be UTF-8)",
                               b, i);
            esc = false;
            i += k;
            continue;
        }
        if (in_str) {
            if (esc) {
                esc = false;
                if (b == 'u' && n - i > 4 && memcmp(h + i + 1, "0000", 4) == 0)
                    return st_fail(c, CT_ST_RULE_NUL,
                                   "\\u0000 (NUL) escape at header byte %zu: names and strings "
                                   "must not hold NUL",
                                   i - 1);
            } else if (b == '\\')
                esc = true;
            else if (b == '"')
                in_str = false;
        } else if (b == '"')
            in_str = true;
        else if (b == '{' || b == '[') {
            if (++depth > ST_MAX_DEPTH)
                return st_fail(c, CT_ST_RULE_DEPTH,
                               "JSON nested deeper than %d levels at header byte %zu", ST_MAX_DEPTH,
                               i);
        } else if (b == '}' || b == ']')
            depth--;
        else if (b == ':' && depth == 1 && ++keys > ST_MAX_TENSORS + 1)
            return st_fail(c, CT_ST_RULE_HEADER_TOO_LARGE,
                           "the header lists more than %zu tensors (the limit of one file; "
                           "header byte %zu): split it into shards",
                           ST_MAX_TENSORS, i);
        i++;
    }
    return CT_OK;
}

static ct_status st_json_error(st_ctx *c, const json_error_t *je)
{
    switch (json_error_code(je)) {
    case json_error_out_of_memory:
        return ct_error(CT_ENOMEM, "safetensors: %s: out of memory parsing the header", c->label);
    case json_error_duplicate_key:
        return st_fail(c, CT_ST_RULE_DUPLICATE_KEY, "%s (header byte %d)", je->text, je->position);
    case json_error_null_character:
    case json_error_null_byte_in_key:
        return st_fail(c, CT_ST_RULE_NUL, "%s (header byte %d)", je->text, je->position);
    case json_error_invalid_utf8:
        return st_fail(c, CT_ST_RULE_UTF8, "%s (header byte %d)", je->text, je->position);
    case json_error_stack_overflow:
        return st_fail(c, CT_ST_RULE_DEPTH, "%s (header byte %d)", je->text, je->position);
    default:
        return st_fail(c, CT_ST_RULE_JSON, "invalid JSON: %s (header byte %d)", je->text,
                       je->position);
    }
}

/* ---- tensor entries ------------------------------------------------------------------- */

typedef struct st_tmp {
    const char *key;
    json_t *shape;
} st_tmp;

static ct_status st_entry_check(st_ctx *c, const char *key, json_t *val, uint64_t data_len,
                                st_entry *e, st_tmp *t)
{
    char q[96];
    const char *nm = ct_io_quote(q, sizeof q, key);
    if (!json_is_object(val))
        return st_fail(c, CT_ST_RULE_ENTRY,
                       "tensor '%s': entry must be an object {dtype, shape, data_offsets}, "
                       "found %s",
                       nm, json_kind(val));
    static const char *const need[3] = {"dtype", "shape", "data_offsets"};
    for (int i = 0; i < 3; i++)
        if (!json_object_get(val, need[i]))
            return st_fail(c, CT_ST_RULE_ENTRY, "tensor '%s': entry lacks \"%s\"", nm, need[i]);
    if (json_object_size(val) != 3) {
        const char *k;
        json_t *v;
        json_object_foreach(val, k, v)
        {
            if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets")) {
                char qk[64];
                return st_fail(c, CT_ST_RULE_ENTRY,
                               "tensor '%s': unknown key \"%s\" (an entry holds dtype, shape "
                               "and data_offsets only)",
                               nm, ct_io_quote(qk, sizeof qk, k));
            }
        }
    }

    json_t *jd = json_object_get(val, "dtype");
    if (!json_is_string(jd))
        return st_fail(c, CT_ST_RULE_DTYPE, "tensor '%s': dtype must be a string, found %s", nm,
                       json_kind(jd));
    ct_st_dtype dt = CT_ST_DTYPE_COUNT;
    for (int i = 0; i < CT_ST_DTYPE_COUNT; i++)
        if (strcmp(json_string_value(jd), ct_st_dtype_name((ct_st_dtype)i)) == 0)
            dt = (ct_st_dtype)i;
    if (dt == CT_ST_DTYPE_COUNT) {
        char qd[40];
        return st_fail(c, CT_ST_RULE_DTYPE,
                       "tensor '%s': dtype \"%s\" is not a safetensors dtype (BOOL, U8, I8, I16, "
                       "U16, F16, BF16, I32, U32, F32, F64, I64, U64, C64, F8_*, F4, F6_*)",
                       nm, ct_io_quote(qd, sizeof qd, json_string_value(jd)));
    }

    json_t *js = json_object_get(val, "shape");
    if (!json_is_array(js))
        return st_fail(c, CT_ST_RULE_SHAPE, "tensor '%s': shape must be an array, found %s", nm,
                       json_kind(js));
    size_t nd = json_array_size(js);
    if (nd > (size_t)INT32_MAX)
        return st_fail(c, CT_ST_RULE_SHAPE, "tensor '%s': shape has %zu dims", nm, nd);
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return st_fail(c, CT_ST_RULE_SHAPE,
                           "tensor '%s': shape[%zu] must be a non-negative integer, found %s%s", nm,
                           i, json_kind(d), json_is_integer(d) ? " below 0" : "");
        if (!overflow && __builtin_mul_overflow(numel, (uint64_t)json_integer_value(d), &numel))
            overflow = true;
    }
    if (overflow)
        return st_fail(c, CT_ST_RULE_OVERFLOW,
                       "tensor '%s': the element count of its %zu-dim shape overflows 64 bits", nm,
                       nd);

    json_t *jo = json_object_get(val, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return st_fail(c, CT_ST_RULE_OFFSETS,
                       "tensor '%s': data_offsets must be an array [begin, end], found %s", nm,
                       json_kind(jo));
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < 0)
        return st_fail(c, CT_ST_RULE_OFFSETS,
                       "tensor '%s': data_offsets entries must be non-negative integers", nm);
    uint64_t begin = (uint64_t)json_integer_value(jb), end = (uint64_t)json_integer_value(je);
    if (end < begin)
        return st_fail(c, CT_ST_RULE_OFFSETS,
                       "tensor '%s': data_offsets [%llu, %llu] end before they begin", nm,
                       (unsigned long long)begin, (unsigned long long)end);

    int bits = ct_st_dtype_bits(dt);
    uint64_t nbits;
    if (__builtin_mul_overflow(numel, (uint64_t)bits, &nbits))
        return st_fail(c, CT_ST_RULE_OVERFLOW,
                       "tensor '%s': %llu elements x %d bits overflows 64 bits", nm,
                       (unsigned long long)numel, bits);
    if (nbits % 8)
        return st_fail(c, CT_ST_RULE_SUBBYTE,
                       "tensor '%s': %llu elements of %s (%d bits each) do not fill whole bytes",
                       nm, (unsigned long long)numel, ct_st_dtype_name(dt), bits);
    uint64_t nbytes = nbits / 8;
    if (end - begin != nbytes)
        return st_fail(c, CT_ST_RULE_SIZE_MISMATCH,
                       "tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but %llu elements "
                       "of %s need %llu",
                       nm, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)(end - begin), (unsigned long long)numel,
                       ct_st_dtype_name(dt), (unsigned long long)nbytes);
    if (end > data_len)
        return st_fail(c, CT_ST_RULE_PAST_END,
                       "tensor '%s': data_offsets end %llu runs past the data buffer (%llu "
                       "bytes): is the file truncated?",
                       nm, (unsigned long long)end, (unsigned long long)data_len);
    e->dt = dt;
    e->ndim = (int)nd;
    e->numel = numel;
    e->nbytes = nbytes;
    e->begin = begin;
    e->end = end;
    t->key = key;
    t->shape = js;
    return CT_OK;
}

static int cmp_offsets(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* qsort has no context argument: the names are reached through this array while sorting.
 * Sorting happens on the caller's thread only, so a thread-local is enough. */
static _Thread_local const st_entry *sort_entries;

static int cmp_names(const void *a, const void *b)
{
    return strcmp(sort_entries[*(const size_t *)a].name, sort_entries[*(const size_t *)b].name);
}

void ct_io_file_free(ct_tensor_file *f)
{
    ct_free(f->entries);
    ct_free(f->by_name);
    ct_free((void *)f->meta);
    ct_free(f->strings);
    ct_free(f->dims);
    ct_free(f->storages);
    ct_free(f->owned);
}

void ct_io_sort_names(ct_tensor_file *f)
{
    for (size_t i = 0; i < f->count; i++)
        f->by_name[i] = i;
    sort_entries = f->entries;
    qsort(f->by_name, f->count, sizeof(size_t), cmp_names);
    sort_entries = NULL;
}

/* Validate the image base[0..size) and fill f's tables. */
static ct_status st_parse(st_ctx *c, const uint8_t *base, size_t size, ct_tensor_file *f)
{
    if (size < 8)
        return st_fail(c, CT_ST_RULE_FILE_TOO_SMALL,
                       "the file has %zu bytes, fewer than the 8 of the header length", size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | base[i];
    if (n > CT_ST_MAX_HEADER)
        return st_fail(c, CT_ST_RULE_HEADER_TOO_LARGE,
                       "header length %llu exceeds the limit of %llu bytes", (unsigned long long)n,
                       CT_ST_MAX_HEADER);
    if (n > size - 8)
        return st_fail(c, CT_ST_RULE_HEADER_PAST_END,
                       "header length %llu runs past the end of the file (%zu bytes follow the "
                       "length)",
                       (unsigned long long)n, size - 8);
    const uint8_t *h = base + 8;
    if (n == 0 || h[0] != '{') {
        if (n == 0) return st_fail(c, CT_ST_RULE_HEADER_START, "the header is empty");
        return st_fail(c, CT_ST_RULE_HEADER_START,
                       "the header must start with '{', found byte 0x%02x", h[0]);
    }
    CT_TRY(st_prescan(c, h, (size_t)n));
    json_error_t je;
    json_t *root = json_loadb((const char *)h, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root) return st_json_error(c, &je);
    ct_status s = CT_OK;
    st_tmp *tmp = NULL;
    uint64_t data_len = size - 8 - n;
    if (!json_is_object(root)) {
        s = st_fail(c, CT_ST_RULE_JSON, "the header must be a JSON object, found %s",
                    json_kind(root));
        goto done;
    }

    /* Pass 1: check every entry, count tensors, strings and dims. */
    size_t nkeys = json_object_size(root), count = 0, nstr = 0, ndims = 0;
    json_t *meta = NULL;
    if ((s = ct_calloc((void **)&f->entries, (nkeys ? nkeys : 1) * sizeof(st_entry))) ||
        (s = ct_calloc((void **)&tmp, (nkeys ? nkeys : 1) * sizeof(st_tmp))))
        goto done;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                s = st_fail(c, CT_ST_RULE_METADATA,
                            "__metadata__ must be an object of strings, found %s", json_kind(val));
                goto done;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv)
            {
                if (!json_is_string(mv)) {
                    char q[96];
                    s = st_fail(c, CT_ST_RULE_METADATA,
                                "__metadata__ value of '%s' must be a string, found %s",
                                ct_io_quote(q, sizeof q, mk), json_kind(mv));
                    goto done;
                }
                nstr += strlen(mk) + json_string_length(mv) + 2;
            }
            meta = val;
            continue;
        }
        st_entry *e = &f->entries[count];
        if ((s = st_entry_check(c, key, val, data_len, e, &tmp[count]))) goto done;
        e->order = count++;
        nstr += strlen(key) + 1;
        ndims += (size_t)e->ndim;
    }

    if (count > ST_MAX_TENSORS) { /* the prescan allowed one key more, for __metadata__ */
        s = st_fail(c, CT_ST_RULE_HEADER_TOO_LARGE,
                    "the header lists more than %zu tensors (the limit of one file): split it "
                    "into shards",
                    ST_MAX_TENSORS);
        goto done;
    }

    /* Pass 2: copy names, shapes and metadata out of the JSON tree. */
    f->count = count;
    f->meta_count = meta ? json_object_size(meta) : 0;
    if ((s = ct_alloc((void **)&f->strings, nstr ? nstr : 1)) ||
        (s = ct_alloc((void **)&f->dims, (ndims ? ndims : 1) * sizeof(int64_t))) ||
        (s = ct_alloc((void **)&f->meta,
                      (f->meta_count ? 2 * f->meta_count : 1) * sizeof(char *))) ||
        (s = ct_alloc((void **)&f->by_name, (count ? count : 1) * sizeof(size_t))))
        goto done;
    char *sp = f->strings;
    int64_t *dp = f->dims;
    for (size_t i = 0; i < count; i++) {
        st_entry *e = &f->entries[i];
        size_t len = strlen(tmp[i].key) + 1;
        memcpy(sp, tmp[i].key, len);
        e->name = sp;
        sp += len;
        e->shape = e->ndim ? dp : NULL;
        for (int d = 0; d < e->ndim; d++)
            *dp++ = (int64_t)json_integer_value(json_array_get(tmp[i].shape, (size_t)d));
        f->total_elements += e->numel;
    }
    if (meta) {
        size_t m = 0;
        const char *mk;
        json_t *mv;
        json_object_foreach(meta, mk, mv)
        {
            size_t kl = strlen(mk) + 1, vl = json_string_length(mv) + 1;
            memcpy(sp, mk, kl);
            f->meta[m++] = sp;
            sp += kl;
            memcpy(sp, json_string_value(mv), vl);
            f->meta[m++] = sp;
            sp += vl;
        }
    }

    /* The data buffer: tensors back to back from 0 to its very end, in offset order. */
    qsort(f->entries, count, sizeof(st_entry), cmp_offsets);
    uint64_t cursor = 0;
    for (size_t i = 0; i < count; i++) {
        const st_entry *e = &f->entries[i];
        char q1[96], q2[96];
        if (e->begin > cursor) {
            s = st_fail(c, CT_ST_RULE_GAP,
                        "tensor '%s' begins at data offset %llu but %s%s%s ends at %llu: %llu "
                        "bytes between them belong to no tensor",
                        ct_io_quote(q1, sizeof q1, e->name), (unsigned long long)e->begin,
                        i ? "tensor '" : "the data buffer start",
                        i ? ct_io_quote(q2, sizeof q2, f->entries[i - 1].name) : "", i ? "'" : "",
                        (unsigned long long)cursor, (unsigned long long)(e->begin - cursor));
            goto done;
        }
        if (e->begin < cursor) {
            s = st_fail(c, CT_ST_RULE_OVERLAP,
                        "tensor '%s' at data offsets [%llu, %llu] overlaps tensor '%s', which "
                        "ends at %llu",
                        ct_io_quote(q1, sizeof q1, e->name), (unsigned long long)e->begin,
                        (unsigned long long)e->end,
                        ct_io_quote(q2, sizeof q2, f->entries[i - 1].name),
                        (unsigned long long)cursor);
            goto done;
        }
        cursor = e->end;
    }
    if (cursor != data_len) {
        s = st_fail(c, CT_ST_RULE_TRAILING,
                    "the tensors end at data offset %llu but the data buffer has %llu bytes: "
                    "%llu trailing bytes belong to no tensor",
                    (unsigned long long)cursor, (unsigned long long)data_len,
                    (unsigned long long)(data_len - cursor));
        goto done;
    }
    for (size_t i = 0; i < count; i++) {
        st_entry *e = &f->entries[i];
        e->file_offset = 8 + n + e->begin;
        e->data = base + e->file_offset;
        e->storage = i;
    }
    ct_io_sort_names(f);
    f->base = base;
    f->size = size;
    f->header_len = n;
    f->data_offset = 8 + n;
    f->data_bytes = data_len;
    f->format = CT_FORMAT_SAFETENSORS;

done:
    ct_free(tmp);
    json_decref(root);
    return s;
}

/* ---- public: validation and loading --------------------------------------------------- */

ct_status ct_safetensors_validate(const void *data, size_t size, ct_st_rule *rule)
{
    if (rule) *rule = CT_ST_RULE_NONE;
    if (!data && size)
        return ct_error(CT_EINVAL, "ct_safetensors_validate: data is NULL but size is %zu", size);
    st_ctx c = {"<memory>", CT_ST_RULE_NONE};
    ct_tensor_file f;
    memset(&f, 0, sizeof f);
    ct_status s = st_parse(&c, data ? data : (const uint8_t *)"", size, &f);
    ct_io_file_free(&f);
    if (rule) *rule = c.rule;
    return s;
}

ct_load_options ct_load_options_default(void)
{
    return (ct_load_options){.format = CT_FORMAT_UNKNOWN, .populate = false};
}

static ct_status refuse_format(const char *fn, const char *label, ct_file_format fmt,
                               const uint8_t *head, size_t nh, uint64_t size)
{
    if (fmt != CT_FORMAT_UNKNOWN)
        return ct_error(CT_EUNSUPPORTED,
                        "%s: %s is a %s, which ctorch does not support yet (it reads safetensors "
                        "and PyTorch checkpoints)",
                        fn, label, ct_file_format_name(fmt));
    if (size == 0)
        return ct_error(CT_EFORMAT, "%s: %s is empty (0 bytes), not a tensor file", fn, label);
    char hex[16 * 3 + 1];
    size_t k = nh < 16 ? nh : 16;
    for (size_t i = 0; i < k; i++)
        snprintf(hex + 3 * i, 4, "%02x ", head[i]);
    hex[k ? 3 * k - 1 : 0] = '\0';
    return ct_error(CT_EFORMAT,
                    "%s: %s is in an unknown format (first %zu bytes: %s); ctorch reads "
                    "safetensors and PyTorch checkpoints and recognises GGUF and NumPy files",
                    fn, label, k, hex);
}

static ct_status open_image(const char *fn, const char *label, const uint8_t *base, size_t size,
                            void *map, const ct_load_options *opts, ct_tensor_file **out)
{
    ct_load_options o = opts ? *opts : ct_load_options_default();
    ct_file_format fmt = o.format;
    if (fmt == CT_FORMAT_UNKNOWN) fmt = ct_detect_format(base, size < 64 ? size : 64);
    if (fmt != CT_FORMAT_SAFETENSORS && fmt != CT_FORMAT_PYTORCH_ZIP && fmt != CT_FORMAT_PICKLE)
        return refuse_format(fn, label, fmt, base, size < 64 ? size : 64, size);
    ct_tensor_file *f;
    CT_TRY(ct_calloc((void **)&f, sizeof *f));
    st_ctx c = {label, CT_ST_RULE_NONE};
    ct_status s = fmt == CT_FORMAT_SAFETENSORS ? st_parse(&c, base, size, f)
                                               : ct_io_pt_parse(label, fmt, base, size, f);
    if (s != CT_OK) {
        ct_io_file_free(f);
        ct_free(f);
        return s;
    }
    f->map = map;
    *out = f;
    return CT_OK;
}

ct_status ct_load_memory(const void *data, size_t size, const ct_load_options *opts,
                         ct_tensor_file **out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_load_memory: out must not be NULL");
    *out = NULL;
    if (!data && size)
        return ct_error(CT_EINVAL, "ct_load_memory: data is NULL but size is %zu", size);
    return open_image("ct_load_memory", "<memory>", data ? data : (const uint8_t *)"", size, NULL,
                      opts, out);
}

ct_status ct_load(const char *path, const ct_load_options *opts, ct_tensor_file **out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_load: out must not be NULL");
    *out = NULL;
    if (!path) return ct_error(CT_EINVAL, "ct_load: path must not be NULL");
    /* a regular file (a FIFO or /dev/zero refused, never waited on); its own size the bound */
    int fd;
    size_t size;
    ct_status os = ct_file_open_regular(path, "tensor file", SIZE_MAX, &fd, &size);
    if (os) return ct_error_wrap(os, "ct_load");
    ct_load_options o = opts ? *opts : ct_load_options_default();
    char label[4096 + 2];
    snprintf(label, sizeof label, "'%s'", path);
    if (o.format == CT_FORMAT_UNKNOWN) {
        /* Detect from the first bytes before mapping anything. */
        uint8_t head[64];
        size_t want = size < sizeof head ? size : sizeof head, got = 0;
        while (got < want) {
            ssize_t r = pread(fd, head + got, want - got, (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                int e = errno;
                close(fd);
                return ct_error(CT_EIO, "ct_load: cannot read '%s': %s", path,
                                r < 0 ? strerror(e) : "unexpected end of file");
            }
            got += (size_t)r;
        }
        o.format = ct_detect_format(head, got);
        if (o.format != CT_FORMAT_SAFETENSORS && o.format != CT_FORMAT_PYTORCH_ZIP &&
            o.format != CT_FORMAT_PICKLE) {
            close(fd);
            return refuse_format("ct_load", label, o.format, head, got, size);
        }
    }
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_SHARED | (o.populate ? MAP_POPULATE : 0), fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return ct_error(CT_EIO, "ct_load: cannot map '%s' (%zu bytes): %s", path, size,
                            strerror(e));
        }
    }
    close(fd);
    ct_status s = open_image("ct_load", label, map ? map : (const uint8_t *)"", size, map, &o, out);
    if (s != CT_OK && map) munmap(map, size);
    return s;
}

void ct_tensor_file_close(ct_tensor_file *f)
{
    if (!f) return;
    if (f->map) munmap(f->map, f->size);
    ct_io_file_free(f);
    ct_free(f);
}

/* ---- public: access ------------------------------------------------------------------- */

ct_status ct_tensor_file_summarize(const ct_tensor_file *f, ct_tensor_file_summary *out)
{
    if (!f || !out)
        return ct_error(CT_EINVAL, "ct_tensor_file_summarize: f and out must not be NULL");
    out->format = f->format;
    out->file_bytes = f->size;
    out->header_bytes = f->header_len;
    out->data_offset = f->data_offset;
    out->data_bytes = f->data_bytes;
    out->total_elements = f->total_elements;
    out->tensors = f->count;
    out->metadata = f->meta_count;
    out->storages = f->storages ? f->storage_count : f->count;
    return CT_OK;
}

size_t ct_tensor_file_storage_count(const ct_tensor_file *f)
{
    return !f ? 0 : f->storages ? f->storage_count : f->count;
}

ct_status ct_tensor_file_storage(const ct_tensor_file *f, size_t index, ct_storage_info *out)
{
    if (!f || !out)
        return ct_error(CT_EINVAL, "ct_tensor_file_storage: f and out must not be NULL");
    size_t n = ct_tensor_file_storage_count(f);
    if (index >= n)
        return ct_error(CT_EINVAL,
                        "ct_tensor_file_storage: index %zu is out of range (the file has %zu "
                        "storages)",
                        index, n);
    memset(out, 0, sizeof *out);
    if (f->storages) {
        const pt_storage *st = &f->storages[index];
        out->key = st->key;
        out->st_dtype = st->dt;
        out->nbytes = st->nbytes;
        out->file_offset = st->file_offset;
        out->data = st->data;
    } else {
        const st_entry *e = &f->entries[index];
        out->key = e->name;
        out->st_dtype = e->dt;
        out->nbytes = e->nbytes;
        out->file_offset = e->file_offset;
        out->data = e->data;
    }
    return CT_OK;
}

size_t ct_tensor_file_count(const ct_tensor_file *f)
{
    return f ? f->count : 0;
}

static ct_status get_entry(const char *fn, const ct_tensor_file *f, size_t index,
                           const st_entry **e)
{
    if (!f) return ct_error(CT_EINVAL, "%s: f must not be NULL", fn);
    if (index >= f->count)
        return ct_error(CT_EINVAL, "%s: index %zu is out of range (the file has %zu tensors)", fn,
                        index, f->count);
    *e = &f->entries[index];
    return CT_OK;
}

ct_status ct_tensor_file_info(const ct_tensor_file *f, size_t index, ct_tensor_info *out)
{
    const st_entry *e = NULL;
    if (!out) return ct_error(CT_EINVAL, "ct_tensor_file_info: out must not be NULL");
    CT_TRY(get_entry("ct_tensor_file_info", f, index, &e));
    memset(out, 0, sizeof *out);
    out->name = e->name;
    out->st_dtype = e->dt;
    out->has_dtype = ct_st_dtype_to_ct(e->dt, &out->dtype);
    out->ndim = e->ndim;
    out->shape = e->shape;
    out->numel = e->numel;
    out->nbytes = e->nbytes;
    out->data_begin = e->begin;
    out->data_end = e->end;
    out->file_offset = e->file_offset;
    out->data = e->data;
    out->strides = e->strides;
    out->storage = e->storage;
    out->storage_offset = e->storage_offset;
    return CT_OK;
}

ct_status ct_tensor_file_find(const ct_tensor_file *f, const char *name, size_t *index)
{
    if (!f || !name || !index)
        return ct_error(CT_EINVAL, "ct_tensor_file_find: f, name and index must not be NULL");
    size_t lo = 0, hi = f->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->entries[f->by_name[mid]].name, name);
        if (c == 0) {
            *index = f->by_name[mid];
            return CT_OK;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    char q[96];
    return ct_error(CT_EINVAL, "ct_tensor_file_find: no tensor named '%s' (the file has %zu)",
                    ct_io_quote(q, sizeof q, name), f->count);
}

static ct_status viewable(const char *fn, const st_entry *e, ct_dtype *dt)
{
    char q[96];
    if (!ct_st_dtype_to_ct(e->dt, dt))
        return ct_error(CT_EUNSUPPORTED,
                        "%s: tensor '%s' is %s, which has no ctorch dtype: read its %llu raw "
                        "bytes through ct_tensor_info.data",
                        fn, ct_io_quote(q, sizeof q, e->name), ct_st_dtype_name(e->dt),
                        (unsigned long long)e->nbytes);
    if (e->ndim > CT_MAX_DIMS)
        return ct_error(CT_EUNSUPPORTED,
                        "%s: tensor '%s' has %d dims, more than a ct_tensor holds (%d): read "
                        "its raw bytes through ct_tensor_info.data",
                        fn, ct_io_quote(q, sizeof q, e->name), e->ndim, CT_MAX_DIMS);
    return CT_OK;
}

/* An empty tensor may have huge dims beside its 0 ([2^62, 0] is valid in a file), but a
 * ct_tensor needs every stride, the product of the other non-zero dims, to fit int64. */
static ct_status strides_fit(const char *fn, const st_entry *e, size_t esize)
{
    uint64_t p = esize;
    for (int d = 0; d < e->ndim; d++) {
        uint64_t m = e->shape[d] ? (uint64_t)e->shape[d] : 1;
        if (__builtin_mul_overflow(p, m, &p) || p > (uint64_t)INT64_MAX) {
            char q[96];
            return ct_error(CT_EOVERFLOW,
                            "%s: tensor '%s' (empty) has dims whose strides overflow int64: read "
                            "its shape through ct_tensor_info",
                            fn, ct_io_quote(q, sizeof q, e->name));
        }
    }
    return CT_OK;
}

ct_status ct_tensor_file_view(const ct_tensor_file *f, size_t index, ct_tensor *out)
{
    const st_entry *e = NULL;
    ct_dtype dt;
    if (!out) return ct_error(CT_EINVAL, "ct_tensor_file_view: out must not be NULL");
    CT_TRY(get_entry("ct_tensor_file_view", f, index, &e));
    CT_TRY(viewable("ct_tensor_file_view", e, &dt));
    CT_TRY(strides_fit("ct_tensor_file_view", e, ct_dtype_size(dt)));
    return ct_tensor_wrap(out, (void *)e->data, dt, e->ndim, e->shape, e->strides);
}

/* ---- conversion ----------------------------------------------------------------------- */

#define CONV_BLOCK 4096

typedef struct conv_job {
    const uint8_t *src;
    uint8_t *dst;
    ct_dtype sdt, ddt;
    size_t ss, ds;
    int64_t n;
} conv_job;

static void conv_run(const conv_job *j, uint8_t *d, const uint8_t *s, int64_t k)
{
    size_t n = (size_t)k;
    if (j->sdt == j->ddt)
        memcpy(d, s, n * j->ss);
    else if (j->sdt == CT_DTYPE_BF16 && j->ddt == CT_DTYPE_F32)
        ct_convert_bf16_to_f32((float *)d, (const uint16_t *)s, n);
    else if (j->sdt == CT_DTYPE_F16 && j->ddt == CT_DTYPE_F32)
        ct_convert_f16_to_f32((float *)d, (const uint16_t *)s, n);
    else if (j->sdt == CT_DTYPE_F32 && j->ddt == CT_DTYPE_BF16)
        ct_convert_f32_to_bf16((uint16_t *)d, (const float *)s, n);
    else if (j->sdt == CT_DTYPE_F32 && j->ddt == CT_DTYPE_F16)
        ct_convert_f32_to_f16((uint16_t *)d, (const float *)s, n);
    else {
        int64_t shape[1] = {k};
        ct_tensor ts, td;
        /* Both are valid 1-d views of k elements: neither call can fail. */
        if (ct_tensor_wrap(&ts, (void *)s, j->sdt, 1, shape, NULL) == CT_OK &&
            ct_tensor_wrap(&td, d, j->ddt, 1, shape, NULL) == CT_OK)
            ct_tensor_copy(&td, &ts);
    }
}

static void conv_body(void *ctx, int64_t b0, int64_t b1, int tid)
{
    const conv_job *j = ctx;
    _Alignas(64) uint8_t stage[CONV_BLOCK * 8];
    for (int64_t b = b0; b < b1; b++) {
        int64_t i0 = b * CONV_BLOCK, k = j->n - i0 < CONV_BLOCK ? j->n - i0 : CONV_BLOCK;
        const uint8_t *s = j->src + (size_t)i0 * j->ss;
        if ((uintptr_t)s % j->ss) { /* a writer that did not align: stage the block */
            memcpy(stage, s, (size_t)k * j->ss);
            s = stage;
        }
        conv_run(j, j->dst + (size_t)i0 * j->ds, s, k);
    }
}

static void convert_into(const ct_tensor_file *f, const st_entry *e, ct_dtype sdt, void *dst,
                         ct_dtype dt)
{
    (void)f;
    if (e->strides) { /* a strided view into a .pt storage: element by element */
        ct_tensor ts, td;
        if (ct_tensor_wrap(&ts, (void *)e->data, sdt, e->ndim, e->shape, e->strides) == CT_OK &&
            ct_tensor_wrap(&td, dst, dt, e->ndim, e->shape, NULL) == CT_OK)
            ct_tensor_copy(&td, &ts);
        return;
    }
    conv_job j = {e->data,
                  dst,
                  sdt,
                  dt,
                  ct_dtype_size(sdt),
                  ct_dtype_size(dt),
                  (int64_t)e->numel};
    int64_t blocks = (j.n + CONV_BLOCK - 1) / CONV_BLOCK;
    if (blocks >= 16)
        ct_parallel_for(blocks, conv_body, &j);
    else if (blocks > 0)
        conv_body(&j, 0, blocks, 0);
}

ct_status ct_tensor_file_read(const ct_tensor_file *f, size_t index, ct_dtype dt, ct_tensor *out)
{
    const st_entry *e = NULL;
    ct_dtype sdt;
    if (!out) return ct_error(CT_EINVAL, "ct_tensor_file_read: out must not be NULL");
    memset(out, 0, sizeof *out);
    CT_TRY(get_entry("ct_tensor_file_read", f, index, &e));
    CT_TRY(viewable("ct_tensor_file_read", e, &sdt));
    if (ct_dtype_size(dt) == 0)
        return ct_error(CT_EINVAL, "ct_tensor_file_read: invalid target dtype %d", (int)dt);
    size_t big = ct_dtype_size(dt) > ct_dtype_size(sdt) ? ct_dtype_size(dt) : ct_dtype_size(sdt);
    CT_TRY(strides_fit("ct_tensor_file_read", e, big));
    ct_tensor r;
    CT_TRY(ct_tensor_empty(&r, dt, e->ndim, e->shape));
    convert_into(f, e, sdt, r.data, dt);
    *out = r;
    return CT_OK;
}

ct_status ct_tensor_file_read_into(const ct_tensor_file *f, size_t index, ct_tensor *dst)
{
    const st_entry *e = NULL;
    ct_dtype sdt;
    char q[96];
    if (!dst) return ct_error(CT_EINVAL, "ct_tensor_file_read_into: dst must not be NULL");
    CT_TRY(get_entry("ct_tensor_file_read_into", f, index, &e));
    CT_TRY(viewable("ct_tensor_file_read_into", e, &sdt));
    if (ct_dtype_size(dst->dtype) == 0)
        return ct_error(CT_EINVAL, "ct_tensor_file_read_into: dst has invalid dtype %d",
                        (int)dst->dtype);
    bool same = dst->ndim == e->ndim;
    for (int d = 0; same && d < e->ndim; d++)
        same = dst->shape[d] == e->shape[d];
    if (!same)
        return ct_error(CT_EINVAL,
                        "ct_tensor_file_read_into: dst's shape differs from tensor '%s' (%d dims)",
                        ct_io_quote(q, sizeof q, e->name), e->ndim);
    if (!ct_tensor_is_contiguous(dst))
        return ct_error(CT_EINVAL, "ct_tensor_file_read_into: dst must be contiguous");
    if (e->numel && !dst->data)
        return ct_error(CT_EINVAL, "ct_tensor_file_read_into: dst has NULL data");
    convert_into(f, e, sdt, dst->data, dst->dtype);
    return CT_OK;
}

ct_status ct_tensor_file_get(const ct_tensor_file *f, const char *name, ct_tensor *out)
{
    size_t i;
    CT_TRY(ct_tensor_file_find(f, name, &i));
    return ct_tensor_file_view(f, i, out);
}

ct_status ct_tensor_file_get_as(const ct_tensor_file *f, const char *name, ct_dtype dt,
                                ct_tensor *out)
{
    size_t i;
    CT_TRY(ct_tensor_file_find(f, name, &i));
    return ct_tensor_file_read(f, i, dt, out);
}

size_t ct_tensor_file_metadata_count(const ct_tensor_file *f)
{
    return f ? f->meta_count : 0;
}

ct_status ct_tensor_file_metadata(const ct_tensor_file *f, size_t index, const char **key,
                                  const char **value)
{
    if (!f) return ct_error(CT_EINVAL, "ct_tensor_file_metadata: f must not be NULL");
    if (index >= f->meta_count)
        return ct_error(CT_EINVAL,
                        "ct_tensor_file_metadata: index %zu is out of range (%zu entries)", index,
                        f->meta_count);
    if (key) *key = f->meta[2 * index];
    if (value) *value = f->meta[2 * index + 1];
    return CT_OK;
}

const char *ct_tensor_file_metadata_get(const ct_tensor_file *f, const char *key)
{
    if (!f || !key) return NULL;
    for (size_t i = 0; i < f->meta_count; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}
