/* Safetensors dtypes, validation rule names, and file format detection. */
#include "core/internal.h"
#include "io/io_internal.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int bits;
    int ct; /* ct_dtype, or -1 when ctorch has none */
} st_dtypes[CT_ST_DTYPE_COUNT] = {
    [CT_ST_BOOL] = {"BOOL", 8, CT_DTYPE_BOOL},
    [CT_ST_U8] = {"U8", 8, CT_DTYPE_U8},
    [CT_ST_I8] = {"I8", 8, CT_DTYPE_I8},
    [CT_ST_I16] = {"I16", 16, CT_DTYPE_I16},
    [CT_ST_U16] = {"U16", 16, -1},
    [CT_ST_F16] = {"F16", 16, CT_DTYPE_F16},
    [CT_ST_BF16] = {"BF16", 16, CT_DTYPE_BF16},
    [CT_ST_I32] = {"I32", 32, CT_DTYPE_I32},
    [CT_ST_U32] = {"U32", 32, -1},
    [CT_ST_F32] = {"F32", 32, CT_DTYPE_F32},
    [CT_ST_F64] = {"F64", 64, CT_DTYPE_F64},
    [CT_ST_I64] = {"I64", 64, CT_DTYPE_I64},
    [CT_ST_U64] = {"U64", 64, -1},
    [CT_ST_C64] = {"C64", 64, -1},
    [CT_ST_F8_E4M3] = {"F8_E4M3", 8, CT_DTYPE_F8_E4M3},
    [CT_ST_F8_E5M2] = {"F8_E5M2", 8, CT_DTYPE_F8_E5M2},
    [CT_ST_F8_E8M0] = {"F8_E8M0", 8, -1},
    [CT_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, -1},
    [CT_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, -1},
    [CT_ST_F4] = {"F4", 4, -1},
    [CT_ST_F6_E2M3] = {"F6_E2M3", 6, -1},
    [CT_ST_F6_E3M2] = {"F6_E3M2", 6, -1},
};

static bool st_valid(ct_st_dtype dt)
{
    return (unsigned)dt < CT_ST_DTYPE_COUNT;
}

const char *ct_st_dtype_name(ct_st_dtype dt)
{
    return st_valid(dt) ? st_dtypes[dt].name : "?";
}

int ct_st_dtype_bits(ct_st_dtype dt)
{
    return st_valid(dt) ? st_dtypes[dt].bits : 0;
}

ct_status ct_st_dtype_from_name(const char *name, ct_st_dtype *out)
{
    if (!name || !out)
        return ct_error(CT_EINVAL, "ct_st_dtype_from_name: name and out must not be NULL");
    for (int i = 0; i < CT_ST_DTYPE_COUNT; i++)
        if (strcmp(name, st_dtypes[i].name) == 0) {
            *out = (ct_st_dtype)i;
            return CT_OK;
        }
    return ct_error(CT_EINVAL, "ct_st_dtype_from_name: '%s' is not a safetensors dtype", name);
}

bool ct_st_dtype_to_ct(ct_st_dtype dt, ct_dtype *out)
{
    if (!st_valid(dt) || st_dtypes[dt].ct < 0) return false;
    if (out) *out = (ct_dtype)st_dtypes[dt].ct;
    return true;
}

ct_status ct_st_dtype_from_ct(ct_dtype dt, ct_st_dtype *out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_st_dtype_from_ct: out must not be NULL");
    for (int i = 0; i < CT_ST_DTYPE_COUNT; i++)
        if (st_dtypes[i].ct >= 0 && st_dtypes[i].ct == (int)dt) {
            *out = (ct_st_dtype)i;
            return CT_OK;
        }
    return ct_error(CT_EINVAL, "ct_st_dtype_from_ct: invalid dtype %d", (int)dt);
}

const char *ct_st_rule_name(ct_st_rule rule)
{
    static const char *const names[CT_ST_RULE_COUNT] = {
        [CT_ST_RULE_NONE] = "none",
        [CT_ST_RULE_FILE_TOO_SMALL] = "file-too-small",
        [CT_ST_RULE_HEADER_TOO_LARGE] = "header-too-large",
        [CT_ST_RULE_HEADER_PAST_END] = "header-past-end",
        [CT_ST_RULE_HEADER_START] = "header-start",
        [CT_ST_RULE_NUL] = "nul",
        [CT_ST_RULE_UTF8] = "utf8",
        [CT_ST_RULE_DEPTH] = "depth",
        [CT_ST_RULE_JSON] = "json",
        [CT_ST_RULE_DUPLICATE_KEY] = "duplicate-key",
        [CT_ST_RULE_ENTRY] = "entry",
        [CT_ST_RULE_DTYPE] = "dtype",
        [CT_ST_RULE_SHAPE] = "shape",
        [CT_ST_RULE_OFFSETS] = "offsets",
        [CT_ST_RULE_OVERFLOW] = "overflow",
        [CT_ST_RULE_SUBBYTE] = "subbyte",
        [CT_ST_RULE_SIZE_MISMATCH] = "size-mismatch",
        [CT_ST_RULE_PAST_END] = "past-end",
        [CT_ST_RULE_GAP] = "gap",
        [CT_ST_RULE_OVERLAP] = "overlap",
        [CT_ST_RULE_TRAILING] = "trailing",
        [CT_ST_RULE_METADATA] = "metadata",
    };
    return (unsigned)rule < CT_ST_RULE_COUNT ? names[rule] : "?";
}

/* ---- formats -------------------------------------------------------------------------- */

const char *ct_file_format_name(ct_file_format fmt)
{
    switch (fmt) {
    case CT_FORMAT_UNKNOWN:
        return "unknown";
    case CT_FORMAT_SAFETENSORS:
        return "safetensors";
    case CT_FORMAT_PYTORCH_ZIP:
        return "PyTorch zip checkpoint (torch.save)";
    case CT_FORMAT_PICKLE:
        return "Python pickle (legacy torch.save)";
    case CT_FORMAT_GGUF:
        return "GGUF file";
    case CT_FORMAT_NUMPY:
        return "NumPy .npy file";
    case CT_FORMAT_NPZ:
        return "NumPy .npz archive";
    }
    return "unknown";
}

ct_file_format ct_detect_format(const void *head, size_t n)
{
    const uint8_t *b = head;
    if (!b) return CT_FORMAT_UNKNOWN;
    if (n >= 4 && memcmp(b, "PK\x03\x04", 4) == 0) {
        /* Local file header: name length at 26 (LE u16), name at 30. np.savez names its
         * members "<key>.npy"; torch.save names them "<archive>/data.pkl", ... */
        if (n >= 30) {
            size_t len = (size_t)b[26] | (size_t)b[27] << 8;
            if (len >= 4 && 30 + len <= n && memcmp(b + 30 + len - 4, ".npy", 4) == 0)
                return CT_FORMAT_NPZ;
        }
        return CT_FORMAT_PYTORCH_ZIP;
    }
    if (n >= 4 && memcmp(b, "GGUF", 4) == 0) return CT_FORMAT_GGUF;
    if (n >= 6 && memcmp(b, "\x93NUMPY", 6) == 0) return CT_FORMAT_NUMPY;
    if (n >= 9 && b[8] == '{') return CT_FORMAT_SAFETENSORS;
    if (n >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5) return CT_FORMAT_PICKLE;
    return CT_FORMAT_UNKNOWN;
}

/* ---- text helpers --------------------------------------------------------------------- */

size_t ct_io_utf8_seq(const uint8_t *s, size_t n)
{
    uint8_t b0 = s[0];
    if (b0 < 0x80) return 1;
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b0 >= 0xC2 && b0 <= 0xDF)
        len = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3;
        if (b0 == 0xE0) lo = 0xA0; /* overlong */
        if (b0 == 0xED) hi = 0x9F; /* surrogates */
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4;
        if (b0 == 0xF0) lo = 0x90; /* overlong */
        if (b0 == 0xF4) hi = 0x8F; /* > U+10FFFF */
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return len;
}

bool ct_io_utf8_valid(const void *s, size_t n, size_t *bad)
{
    const uint8_t *p = s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = ct_io_utf8_seq(p + i, n - i);
        if (!k) {
            if (bad) *bad = i;
            return false;
        }
        i += k;
    }
    return true;
}

const char *ct_io_quote(char *buf, size_t cap, const char *name)
{
    size_t o = 0, i = 0, limit = cap - 8;
    const uint8_t *s = (const uint8_t *)name;
    while (s[i] && o < limit) {
        if (s[i] < 0x20 || s[i] == 0x7F) {
            if (o + 4 > limit) break;
            snprintf(buf + o, 5, "\\x%02x", s[i]);
            o += 4;
            i++;
        } else if (s[i] < 0x80) {
            buf[o++] = (char)s[i++];
        } else {
            size_t avail = 1;
            while (avail < 4 && s[i + avail])
                avail++;
            size_t k = ct_io_utf8_seq(s + i, avail);
            if (!k) k = 1; /* never happens for validated names; keep going regardless */
            if (o + k > limit) break;
            memcpy(buf + o, s + i, k);
            o += k;
            i += k;
        }
    }
    if (s[i]) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}
