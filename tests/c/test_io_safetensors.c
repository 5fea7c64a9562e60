/* Safetensors reader: every dtype, empty and 0-rank tensors, metadata, conversions, format
 * detection, and one hostile file per validation rule (status, rule and message). */
#include "test_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

/* A file image: 8-byte length, json (json_len bytes, may hold NUL), pad spaces, data. */
static uint8_t *image(const char *json, size_t json_len, size_t pad, const void *data, size_t dn,
                      size_t *n)
{
    *n = 8 + json_len + pad + dn;
    uint8_t *p = malloc(*n + 1);
    uint64_t hl = json_len + pad;
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(hl >> (8 * i));
    memcpy(p + 8, json, json_len);
    memset(p + 8 + json_len, ' ', pad);
    if (dn) memcpy(p + 8 + json_len + pad, data, dn);
    return p;
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(p, 1, n, f) == n);
    fclose(f);
}

/* ---- every dtype -------------------------------------------------------------------- */

static void test_every_dtype(void)
{
    /* One tensor per dtype: shape [2, 4] (8 elements: 8 x 4 bits and 8 x 6 bits fill bytes). */
    char json[8192];
    size_t o = 0, off = 0;
    uint8_t data[1024];
    o += (size_t)snprintf(json + o, sizeof json - o,
                          "{\"__metadata__\":{\"format\":\"pt\",\"b\":\"\xc3\xa9\"}");
    /* Header order differs from file order on purpose: offsets are assigned in reverse. */
    size_t sizes[CT_ST_DTYPE_COUNT], begins[CT_ST_DTYPE_COUNT];
    size_t total = 0;
    for (int d = 0; d < CT_ST_DTYPE_COUNT; d++) {
        sizes[d] = (size_t)(8 * ct_st_dtype_bits((ct_st_dtype)d) / 8);
        total += sizes[d];
    }
    for (int d = CT_ST_DTYPE_COUNT - 1; d >= 0; d--) {
        begins[d] = off;
        off += sizes[d];
    }
    for (int d = 0; d < CT_ST_DTYPE_COUNT; d++)
        o += (size_t)snprintf(
            json + o, sizeof json - o,
            ",\"t.%s\":{\"dtype\":\"%s\",\"shape\":[2,4],\"data_offsets\":[%zu,%zu]}",
            ct_st_dtype_name((ct_st_dtype)d), ct_st_dtype_name((ct_st_dtype)d), begins[d],
            begins[d] + sizes[d]);
    o += (size_t)snprintf(json + o, sizeof json - o, "}");
    for (size_t i = 0; i < total; i++)
        data[i] = (uint8_t)(t_next() & 0x7F); /* no NaN f8 */
    size_t pad = (8 - o % 8) % 8, n;
    uint8_t *img = image(json, o, pad, data, total, &n);
    ct_st_rule rule;
    CHECK_OK(ct_safetensors_validate(img, n, &rule));
    CHECK(rule == CT_ST_RULE_NONE);
    ct_tensor_file *f = NULL;
    CHECK_OK(ct_load_memory(img, n, NULL, &f));
    if (!f) return;
    CHECK(ct_tensor_file_count(f) == CT_ST_DTYPE_COUNT);
    ct_tensor_file_summary sm;
    CHECK_OK(ct_tensor_file_summarize(f, &sm));
    CHECK(sm.format == CT_FORMAT_SAFETENSORS && sm.file_bytes == n && sm.header_bytes == o + pad);
    CHECK(sm.data_offset == 8 + o + pad && sm.data_bytes == total && sm.metadata == 2);
    CHECK(sm.total_elements == 8 * CT_ST_DTYPE_COUNT);
    uint64_t prev_end = 0;
    for (size_t i = 0; i < ct_tensor_file_count(f); i++) {
        ct_tensor_info t;
        CHECK_OK(ct_tensor_file_info(f, i, &t));
        /* File order is offset order: the reverse of the dtype order here. */
        int d = CT_ST_DTYPE_COUNT - 1 - (int)i;
        char name[64];
        snprintf(name, sizeof name, "t.%s", ct_st_dtype_name((ct_st_dtype)d));
        CHECK(strcmp(t.name, name) == 0);
        CHECK(t.st_dtype == (ct_st_dtype)d);
        CHECK(t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 4 && t.numel == 8);
        CHECK(t.nbytes == sizes[d] && t.data_begin == begins[d] &&
              t.data_end == begins[d] + sizes[d]);
        CHECK(t.data_begin == prev_end);
        prev_end = t.data_end;
        CHECK(t.file_offset == 8 + o + pad + begins[d]);
        CHECK(memcmp(t.data, data + begins[d], sizes[d]) == 0);
        CHECK(t.data == img + t.file_offset); /* zero-copy */
        size_t idx = 99;
        CHECK_OK(ct_tensor_file_find(f, name, &idx));
        CHECK(idx == i);
        ct_dtype cd;
        bool has = ct_st_dtype_to_ct((ct_st_dtype)d, &cd);
        CHECK(t.has_dtype == has);
        ct_tensor v;
        if (has) {
            CHECK(t.dtype == cd);
            CHECK_OK(ct_tensor_file_view(f, i, &v));
            CHECK(v.data == t.data && !v.owns && v.dtype == cd && v.ndim == 2 && v.shape[1] == 4);
            ct_st_dtype back;
            CHECK_OK(ct_st_dtype_from_ct(cd, &back));
            CHECK(back == (ct_st_dtype)d);
            ct_tensor c;
            CHECK_OK(ct_tensor_file_read(f, i, cd, &c)); /* same dtype: an owning copy */
            CHECK(c.owns && memcmp(c.data, t.data, sizes[d]) == 0);
            ct_tensor_free(&c);
        } else {
            CHECK_STATUS(ct_tensor_file_view(f, i, &v), CT_EUNSUPPORTED);
            CHECK(strstr(ct_last_error(), ct_st_dtype_name((ct_st_dtype)d)) != NULL);
            CHECK_STATUS(ct_tensor_file_read(f, i, CT_DTYPE_F32, &v), CT_EUNSUPPORTED);
        }
    }
    /* Metadata in header order, and by key. */
    const char *k, *v;
    CHECK(ct_tensor_file_metadata_count(f) == 2);
    CHECK_OK(ct_tensor_file_metadata(f, 0, &k, &v));
    CHECK(!strcmp(k, "format") && !strcmp(v, "pt"));
    CHECK_OK(ct_tensor_file_metadata(f, 1, &k, &v));
    CHECK(!strcmp(k, "b") && !strcmp(v, "\xc3\xa9"));
    CHECK(ct_tensor_file_metadata_get(f, "format") &&
          !strcmp(ct_tensor_file_metadata_get(f, "format"), "pt"));
    CHECK(ct_tensor_file_metadata_get(f, "nope") == NULL);
    CHECK_STATUS(ct_tensor_file_metadata(f, 2, &k, &v), CT_EINVAL);
    size_t idx;
    CHECK_STATUS(ct_tensor_file_find(f, "t.F33", &idx), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "t.F33") != NULL);
    ct_tensor_info ti;
    CHECK_STATUS(ct_tensor_file_info(f, CT_ST_DTYPE_COUNT, &ti), CT_EINVAL);
    ct_tensor_file_close(f);
    free(img);
    for (int d = 0; d < CT_ST_DTYPE_COUNT; d++) {
        ct_st_dtype back;
        CHECK_OK(ct_st_dtype_from_name(ct_st_dtype_name((ct_st_dtype)d), &back));
        CHECK(back == (ct_st_dtype)d);
    }
    ct_st_dtype bad;
    CHECK_STATUS(ct_st_dtype_from_name("f32", &bad), CT_EINVAL);
    CHECK(ct_st_dtype_bits(CT_ST_F4) == 4 && ct_st_dtype_bits(CT_ST_C64) == 64);
    CHECK(ct_st_dtype_bits(CT_ST_DTYPE_COUNT) == 0);
}

/* ---- edge shapes, order of equal offsets, ranks above CT_MAX_DIMS ---------------------- */

static void test_edges(void)
{
    static const char json[] =
        "{\"z\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
        "\"scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
        "\"a\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]},"
        "\"deep\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[4,5]}}";
    float one = 1.5f;
    uint8_t data[5];
    memcpy(data, &one, 4);
    data[4] = 7;
    size_t n;
    uint8_t *img = image(json, sizeof json - 1, 3, data, sizeof data, &n);
    ct_tensor_file *f = NULL;
    CHECK_OK(ct_load_memory(img, n, NULL, &f));
    if (!f) return;
    ct_tensor_info t;
    /* Equal offsets: the empty tensors first, in header order ("z" before "a"). */
    const char *order[4] = {"z", "a", "scalar", "deep"};
    for (size_t i = 0; i < 4; i++) {
        CHECK_OK(ct_tensor_file_info(f, i, &t));
        CHECK(strcmp(t.name, order[i]) == 0);
    }
    ct_tensor v, c;
    CHECK_OK(ct_tensor_file_get(f, "z", &v));
    CHECK(v.ndim == 2 && v.shape[0] == 0 && ct_tensor_numel(&v) == 0);
    CHECK_OK(ct_tensor_file_get_as(f, "z", CT_DTYPE_BF16, &c));
    CHECK(c.ndim == 2 && c.shape[1] == 4 && ct_tensor_numel(&c) == 0);
    ct_tensor_free(&c);
    CHECK_OK(ct_tensor_file_get(f, "scalar", &v));
    float got; /* this writer did not align: read through memcpy */
    memcpy(&got, v.data, 4);
    CHECK(v.ndim == 0 && ct_tensor_numel(&v) == 1 && got == 1.5f);
    CHECK_OK(ct_tensor_file_get_as(f, "scalar", CT_DTYPE_F64, &c));
    CHECK(c.ndim == 0 && *(const double *)c.data == 1.5);
    ct_tensor_free(&c);
    size_t idx;
    CHECK_OK(ct_tensor_file_find(f, "deep", &idx));
    CHECK_OK(ct_tensor_file_info(f, idx, &t));
    CHECK(t.ndim == 9 && t.numel == 1 && ((const uint8_t *)t.data)[0] == 7);
    CHECK_STATUS(ct_tensor_file_view(f, idx, &v), CT_EUNSUPPORTED);
    ct_tensor_file_close(f);
    free(img);

    /* Empty tensors with huge dims beside the 0: valid files (the element count is 0 at
     * every step), but F32 strides would overflow int64: a clean CT_EOVERFLOW, no UB.
     * (Found by fuzz_safetensors: corpus regress-empty-huge-dims.) */
    static const char huge[] =
        "{\"u8\":{\"dtype\":\"U8\",\"shape\":[4611686018427387904,0],\"data_offsets\":[0,0]},"
        "\"f32\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,0],\"data_offsets\":[0,0]},"
        "\"f32b\":{\"dtype\":\"F32\",\"shape\":[0,1099511627776,1099511627776],"
        "\"data_offsets\":[0,0]}}";
    img = image(huge, sizeof huge - 1, 0, NULL, 0, &n);
    CHECK_OK(ct_load_memory(img, n, NULL, &f));
    if (f) {
        CHECK_OK(ct_tensor_file_get(f, "u8", &v));
        CHECK(v.shape[0] == 4611686018427387904ll && ct_tensor_numel(&v) == 0);
        CHECK_STATUS(ct_tensor_file_get_as(f, "u8", CT_DTYPE_F32, &c), CT_EOVERFLOW);
        CHECK_STATUS(ct_tensor_file_get(f, "f32", &v), CT_EOVERFLOW);
        CHECK_STATUS(ct_tensor_file_get(f, "f32b", &v), CT_EOVERFLOW);
        CHECK_STATUS(ct_tensor_file_get_as(f, "f32b", CT_DTYPE_U8, &c), CT_EOVERFLOW);
        ct_tensor_file_close(f);
    }
    free(img);

    /* The empty header and metadata only. */
    static const char *valid[] = {"{}", "{\"__metadata__\":{}}", "{}\n",
                                  "{\"__metadata__\":{\"a\":\"\"}}"};
    for (int i = 0; i < 4; i++) {
        img = image(valid[i], strlen(valid[i]), 5, NULL, 0, &n);
        CHECK_OK(ct_load_memory(img, n, NULL, &f));
        CHECK(ct_tensor_file_count(f) == 0);
        ct_tensor_file_close(f);
        free(img);
    }
    ct_tensor_file_close(NULL);
    CHECK(ct_tensor_file_count(NULL) == 0 && ct_tensor_file_metadata_count(NULL) == 0);
}

/* ---- conversions -------------------------------------------------------------------- */

static void test_conversions(void)
{
    /* Misaligned on purpose: one U8 byte first, so the BF16 data starts at an odd address. */
    enum { N = 70001 }; /* enough blocks to go through the thread pool */
    uint16_t *bf = malloc(N * 2), *hf = malloc(N * 2);
    uint8_t *f8 = malloc(N);
    float *ref = malloc(N * 4), *src = malloc(N * 4);
    t_fill(src, N, -100.0f, 100.0f);
    for (int i = 0; i < N; i++) {
        bf[i] = ct_f32_to_bf16(src[i]);
        hf[i] = ct_f32_to_f16(src[i]);
        f8[i] = ct_f32_to_f8e4m3(src[i]);
    }
    char json[512];
    size_t o = (size_t)snprintf(
        json, sizeof json,
        "{\"pad\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
        "\"bf\":{\"dtype\":\"BF16\",\"shape\":[%d],\"data_offsets\":[1,%d]},"
        "\"hf\":{\"dtype\":\"F16\",\"shape\":[%d],\"data_offsets\":[%d,%d]},"
        "\"f8\":{\"dtype\":\"F8_E4M3\",\"shape\":[%d],\"data_offsets\":[%d,%d]},"
        "\"f32\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%d,%d]}}",
        N, 1 + 2 * N, N, 1 + 2 * N, 1 + 4 * N, N, 1 + 4 * N, 1 + 5 * N, N, 1 + 5 * N, 1 + 9 * N);
    size_t dn = 1 + 9 * (size_t)N, n;
    uint8_t *data = malloc(dn);
    data[0] = 42;
    memcpy(data + 1, bf, 2 * N);
    memcpy(data + 1 + 2 * N, hf, 2 * N);
    memcpy(data + 1 + 4 * N, f8, N);
    memcpy(data + 1 + 5 * N, src, 4 * (size_t)N);
    uint8_t *img = image(json, o, (8 - o % 8) % 8, data, dn, &n);
    ct_tensor_file *f = NULL;
    CHECK_OK(ct_load_memory(img, n, NULL, &f));
    if (!f) return;
    ct_tensor t;
    CHECK_OK(ct_tensor_file_get_as(f, "bf", CT_DTYPE_F32, &t));
    for (int i = 0; i < N; i++)
        ref[i] = ct_bf16_to_f32(bf[i]);
    CHECK(t.dtype == CT_DTYPE_F32 && t.shape[0] == N && memcmp(t.data, ref, 4 * (size_t)N) == 0);
    ct_tensor_free(&t);
    /* Into caller memory: same bits, no allocation. */
    size_t bi;
    CHECK_OK(ct_tensor_file_find(f, "bf", &bi));
    int64_t shn[1] = {N}, shw[1] = {N - 1}, sh2[2] = {N, 1};
    float *into = malloc(4 * (size_t)N * 2);
    ct_tensor dst;
    CHECK_OK(ct_tensor_wrap(&dst, into, CT_DTYPE_F32, 1, shn, NULL));
    CHECK_OK(ct_tensor_file_read_into(f, bi, &dst));
    CHECK(memcmp(into, ref, 4 * (size_t)N) == 0);
    CHECK_OK(ct_tensor_wrap(&dst, into, CT_DTYPE_F32, 1, shw, NULL));
    CHECK_STATUS(ct_tensor_file_read_into(f, bi, &dst), CT_EINVAL);
    CHECK_OK(ct_tensor_wrap(&dst, into, CT_DTYPE_F32, 2, sh2, NULL));
    CHECK_STATUS(ct_tensor_file_read_into(f, bi, &dst), CT_EINVAL);
    int64_t st2[1] = {2};
    CHECK_OK(ct_tensor_wrap(&dst, into, CT_DTYPE_F32, 1, shn, st2));
    CHECK_STATUS(ct_tensor_file_read_into(f, bi, &dst), CT_EINVAL);
    CHECK_STATUS(ct_tensor_file_read_into(f, bi, NULL), CT_EINVAL);
    free(into);
    CHECK_OK(ct_tensor_file_get_as(f, "hf", CT_DTYPE_F32, &t));
    for (int i = 0; i < N; i++)
        ref[i] = ct_f16_to_f32(hf[i]);
    CHECK(memcmp(t.data, ref, 4 * (size_t)N) == 0);
    ct_tensor_free(&t);
    CHECK_OK(ct_tensor_file_get_as(f, "f8", CT_DTYPE_F32, &t));
    for (int i = 0; i < N; i++)
        ref[i] = ct_f8e4m3_to_f32(f8[i]);
    CHECK(memcmp(t.data, ref, 4 * (size_t)N) == 0);
    ct_tensor_free(&t);
    /* And back: f32 -> bf16 / f16 / f8 round to nearest even like the scalar conversions. */
    CHECK_OK(ct_tensor_file_get_as(f, "f32", CT_DTYPE_BF16, &t));
    CHECK(memcmp(t.data, bf, 2 * (size_t)N) == 0);
    ct_tensor_free(&t);
    CHECK_OK(ct_tensor_file_get_as(f, "f32", CT_DTYPE_F16, &t));
    CHECK(memcmp(t.data, hf, 2 * (size_t)N) == 0);
    ct_tensor_free(&t);
    CHECK_OK(ct_tensor_file_get_as(f, "f32", CT_DTYPE_F8_E4M3, &t));
    CHECK(memcmp(t.data, f8, (size_t)N) == 0);
    ct_tensor_free(&t);
    CHECK_OK(ct_tensor_file_get_as(f, "pad", CT_DTYPE_I32, &t));
    CHECK(((const int32_t *)t.data)[0] == 42);
    ct_tensor_free(&t);
    /* The same bits for any thread count. */
    int nt = ct_num_threads();
    ct_tensor a, b;
    CHECK_OK(ct_set_num_threads(1));
    CHECK_OK(ct_tensor_file_get_as(f, "bf", CT_DTYPE_F32, &a));
    CHECK_OK(ct_set_num_threads(3));
    CHECK_OK(ct_tensor_file_get_as(f, "bf", CT_DTYPE_F32, &b));
    CHECK(memcmp(a.data, b.data, 4 * (size_t)N) == 0);
    ct_set_num_threads(nt);
    ct_tensor_free(&a);
    ct_tensor_free(&b);
    CHECK_STATUS(ct_tensor_file_get_as(f, "bf", (ct_dtype)99, &t), CT_EINVAL);
    ct_tensor_file_close(f);
    free(img);
    free(data);
    free(bf);
    free(hf);
    free(f8);
    free(ref);
    free(src);
}

/* ---- hostile files: one per rule ----------------------------------------------------- */

typedef struct hostile {
    const char *json;
    size_t len;  /* 0: strlen(json) */
    size_t data; /* data buffer bytes */
    ct_st_rule rule;
    bool names_tensor; /* the message names "bad.w" */
} hostile;

#define E(dt, shape, b, e)                                                                         \
    "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" b "," e "]}"
#define OK4 "\"ok\":" E("F32", "[1]", "0", "4")

static const hostile cases[] = {
    {" {}", 0, 0, CT_ST_RULE_HEADER_START, false},
    {"[1]", 0, 0, CT_ST_RULE_HEADER_START, false},
    {"{\"bad.w\0\":" E("F32", "[1]", "0", "4") "}", 59, 4, CT_ST_RULE_NUL, false},
    {"{\"bad.w\\u0000\":" E("F32", "[1]", "0", "4") "}", 0, 4, CT_ST_RULE_NUL, false},
    {"{\"bad.w\xff\":" E("F32", "[1]", "0", "4") "}", 0, 4, CT_ST_RULE_UTF8, false},
    {"{\"bad.w\xc0\x80\":" E("F32", "[1]", "0", "4") "}", 0, 4, CT_ST_RULE_UTF8, false},
    {"{\"bad.w\xed\xa0\x80\":" E("F32", "[1]", "0", "4") "}", 0, 4, CT_ST_RULE_UTF8, false},
    {"{\"bad.w\xf4\x90\x80\x80\":" E("F32", "[1]", "0", "4") "}", 0, 4, CT_ST_RULE_UTF8, false},
    {"{\"a\":1", 0, 0, CT_ST_RULE_JSON, false},
    {"{} x", 0, 0, CT_ST_RULE_JSON, false},
    {"{" OK4 ",}", 0, 4, CT_ST_RULE_JSON, false},
    {"{'a':1}", 0, 0, CT_ST_RULE_JSON, false},
    {"{" OK4 "}{}", 0, 4, CT_ST_RULE_JSON, false},
    {"{\"bad.w\":" E("F32", "[1]", "0", "4") ",\"bad.w\":" E("F32", "[1]", "4", "8") "}", 0, 8,
     CT_ST_RULE_DUPLICATE_KEY, false},
    {"{\"bad.w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 4,
     CT_ST_RULE_DUPLICATE_KEY, false},
    {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, 0, CT_ST_RULE_DUPLICATE_KEY, false},
    {"{\"bad.w\":5}", 0, 0, CT_ST_RULE_ENTRY, true},
    {"{\"bad.w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 0, 4, CT_ST_RULE_ENTRY, true},
    {"{\"bad.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 0, 4,
     CT_ST_RULE_ENTRY, true},
    {"{\"bad.w\":" E("F7", "[1]", "0", "4") "}", 0, 4, CT_ST_RULE_DTYPE, true},
    {"{\"bad.w\":" E("f32", "[1]", "0", "4") "}", 0, 4, CT_ST_RULE_DTYPE, true},
    {"{\"bad.w\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 4, CT_ST_RULE_DTYPE,
     true},
    {"{\"bad.w\":" E("F32", "[-1]", "0", "4") "}", 0, 4, CT_ST_RULE_SHAPE, true},
    {"{\"bad.w\":" E("F32", "[1.0]", "0", "4") "}", 0, 4, CT_ST_RULE_SHAPE, true},
    {"{\"bad.w\":" E("F32", "[\"1\"]", "0", "4") "}", 0, 4, CT_ST_RULE_SHAPE, true},
    {"{\"bad.w\":" E("F32", "[true]", "0", "4") "}", 0, 4, CT_ST_RULE_SHAPE, true},
    {"{\"bad.w\":" E("F32", "1", "0", "4") "}", 0, 4, CT_ST_RULE_SHAPE, true},
    {"{\"bad.w\":" E("F32", "[1]", "4", "0") "}", 0, 4, CT_ST_RULE_OFFSETS, true},
    {"{\"bad.w\":" E("F32", "[1]", "-1", "3") "}", 0, 4, CT_ST_RULE_OFFSETS, true},
    {"{\"bad.w\":" E("F32", "[1]", "0.0", "4") "}", 0, 4, CT_ST_RULE_OFFSETS, true},
    {"{\"bad.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 0, 4, CT_ST_RULE_OFFSETS,
     true},
    {"{\"bad.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,4]}}", 0, 4,
     CT_ST_RULE_OFFSETS, true},
    {"{\"bad.w\":" E("F32", "[4294967296,4294967296,4294967296]", "0", "4") "}", 0, 4,
     CT_ST_RULE_OVERFLOW, true},
    {"{\"bad.w\":" E("F32", "[2305843009213693952]", "0", "4") "}", 0, 4, CT_ST_RULE_OVERFLOW,
     true},
    {"{\"bad.w\":" E("U8", "[4611686018427387904,4]", "0", "4") "}", 0, 4, CT_ST_RULE_OVERFLOW,
     true},
    {"{\"bad.w\":" E("F4", "[3]", "0", "2") "}", 0, 2, CT_ST_RULE_SUBBYTE, true},
    {"{\"bad.w\":" E("F6_E2M3", "[1]", "0", "1") "}", 0, 1, CT_ST_RULE_SUBBYTE, true},
    {"{\"bad.w\":" E("F32", "[2]", "0", "4") "}", 0, 4, CT_ST_RULE_SIZE_MISMATCH, true},
    {"{\"bad.w\":" E("F32", "[0]", "0", "4") "}", 0, 4, CT_ST_RULE_SIZE_MISMATCH, true},
    {"{\"bad.w\":" E("F32", "[2]", "0", "8") "}", 0, 4, CT_ST_RULE_PAST_END, true},
    {"{" OK4 ",\"bad.w\":" E("F32", "[1]", "8", "12") "}", 0, 12, CT_ST_RULE_GAP, true},
    {"{\"bad.w\":" E("F32", "[1]", "4", "8") "}", 0, 8, CT_ST_RULE_GAP, true},
    {"{\"ok\":" E("F32", "[2]", "0", "8") ",\"bad.w\":" E("F32", "[2]", "4", "12") "}", 0, 12,
     CT_ST_RULE_OVERLAP, true},
    {"{" OK4 ",\"bad.w\":" E("F32", "[1]", "0", "4") "}", 0, 4, CT_ST_RULE_OVERLAP, true},
    {"{" OK4 "}", 0, 8, CT_ST_RULE_TRAILING, false},
    {"{}", 0, 1, CT_ST_RULE_TRAILING, false},
    {"{\"__metadata__\":{\"k\":1}}", 0, 0, CT_ST_RULE_METADATA, false},
    {"{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, 0, CT_ST_RULE_METADATA, false},
    {"{\"__metadata__\":[]}", 0, 0, CT_ST_RULE_METADATA, false},
    {"{\"__metadata__\":null}", 0, 0, CT_ST_RULE_METADATA, false},
};

static void check_hostile(const char *what, const uint8_t *img, size_t n, ct_st_rule want,
                          bool names_tensor)
{
    ct_status ws = want == CT_ST_RULE_OVERFLOW ? CT_EOVERFLOW : CT_EFORMAT;
    ct_st_rule got = CT_ST_RULE_NONE;
    ct_status s = ct_safetensors_validate(img, n, &got);
    t_checks++;
    if (s != ws || got != want) {
        t_failures++;
        fprintf(stderr, "case %s: got %s / rule %s, want %s / rule %s (%s)\n", what,
                ct_status_name(s), ct_st_rule_name(got), ct_status_name(ws), ct_st_rule_name(want),
                ct_last_error());
    }
    /* Through the loader, forced to safetensors: same status, the rule in the message. */
    ct_load_options o = ct_load_options_default();
    o.format = CT_FORMAT_SAFETENSORS;
    ct_tensor_file *f = (ct_tensor_file *)1;
    CHECK_STATUS(ct_load_memory(img, n, &o, &f), ws);
    CHECK(f == NULL);
    char tag[64];
    snprintf(tag, sizeof tag, "[%s]", ct_st_rule_name(want));
    CHECK(strstr(ct_last_error(), tag) != NULL);
    if (names_tensor && !strstr(ct_last_error(), "'bad.w'")) {
        t_failures++;
        fprintf(stderr, "case %s: message does not name the tensor: %s\n", what, ct_last_error());
    }
}

static void test_hostile(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const hostile *h = &cases[i];
        size_t len = h->len ? h->len : strlen(h->json), n;
        uint8_t *data = calloc(h->data + 1, 1);
        uint8_t *img = image(h->json, len, 0, data, h->data, &n);
        char what[32];
        snprintf(what, sizeof what, "#%zu", i);
        check_hostile(what, img, n, h->rule, h->names_tensor);
        /* And from a file, format detected from the bytes (all but the two without '{'). */
        if (img[8] == '{') {
            char path[300];
            snprintf(path, sizeof path, "%s/hostile.safetensors", tmpdir);
            write_file(path, img, n);
            ct_tensor_file *f = NULL;
            ct_status ws = h->rule == CT_ST_RULE_OVERFLOW ? CT_EOVERFLOW : CT_EFORMAT;
            CHECK_STATUS(ct_load(path, NULL, &f), ws);
            CHECK(strstr(ct_last_error(), path) != NULL);
        }
        free(img);
        free(data);
    }

    /* Lengths: too small, too large, past the end. */
    uint8_t small[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    for (size_t n = 0; n < 8; n++)
        check_hostile("small", small, n, CT_ST_RULE_FILE_TOO_SMALL, false);
    uint8_t big[16] = {0x01, 0xE1, 0xF5, 0x05, 0, 0, 0, 0, '{', '}'}; /* 100,000,001 */
    check_hostile("100000001", big, sizeof big, CT_ST_RULE_HEADER_TOO_LARGE, false);
    memset(big, 0xFF, 8);
    check_hostile("2^64-1", big, sizeof big, CT_ST_RULE_HEADER_TOO_LARGE, false);
    uint8_t past[16] = {9, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    check_hostile("past end", past, sizeof past, CT_ST_RULE_HEADER_PAST_END, false);
    uint8_t zero[8] = {0};
    check_hostile("empty header", zero, sizeof zero, CT_ST_RULE_HEADER_START, false);
    /* The limit itself is allowed (only the length check is reached here). */
    uint8_t lim[16] = {0x00, 0xE1, 0xF5, 0x05, 0, 0, 0, 0, '{', '}'};
    check_hostile("100000000", lim, sizeof lim, CT_ST_RULE_HEADER_PAST_END, false);

    /* Deep nesting: rejected by the scan, before the JSON parser recurses. */
    for (int depth = 65; depth <= 100000; depth *= 40) {
        size_t len = 16 + 2 * (size_t)depth, n;
        char *j = malloc(len + 1);
        size_t o = (size_t)sprintf(j, "{\"__metadata__\":");
        for (int d = 0; d < depth; d++)
            j[o++] = '[';
        for (int d = 0; d < depth; d++)
            j[o++] = ']';
        j[o++] = '}';
        uint8_t *img = image(j, o, 0, NULL, 0, &n);
        check_hostile("deep", img, n, CT_ST_RULE_DEPTH, false);
        free(img);
        free(j);
    }
    /* Unbalanced: many '[' only. */
    {
        size_t n;
        char j[200];
        memset(j, '[', sizeof j);
        j[0] = '{';
        uint8_t *img = image(j, sizeof j, 0, NULL, 0, &n);
        check_hostile("unbalanced", img, n, CT_ST_RULE_DEPTH, false);
        free(img);
    }
    /* A name with a control character: the message escapes it. */
    {
        static const char j[] = "{\"bad\\u001b[31m\":" E("F7", "[1]", "0", "4") "}";
        size_t n;
        uint8_t d4[4] = {0};
        uint8_t *img = image(j, sizeof j - 1, 0, d4, 4, &n);
        ct_st_rule r;
        CHECK_STATUS(ct_safetensors_validate(img, n, &r), CT_EFORMAT);
        CHECK(strchr(ct_last_error(), 0x1b) == NULL && strstr(ct_last_error(), "\\x1b") != NULL);
        free(img);
    }
    CHECK_STATUS(ct_safetensors_validate(NULL, 5, NULL), CT_EINVAL);
    CHECK_STATUS(ct_safetensors_validate(NULL, 0, NULL), CT_EFORMAT);
    for (int r = 0; r < CT_ST_RULE_COUNT; r++)
        for (int q = 0; q < r; q++)
            CHECK(strcmp(ct_st_rule_name((ct_st_rule)r), ct_st_rule_name((ct_st_rule)q)) != 0);
}

/* ---- format detection ------------------------------------------------------------------ */

static void test_formats(void)
{
    /* Zip local file headers: the member name (length at 26, name at 30) tells npz apart. */
    static char zip_pt[64], zip_npz[64];
    memcpy(zip_pt, "PK\x03\x04", 4);
    memcpy(zip_npz, "PK\x03\x04", 4);
    zip_pt[26] = 16;
    memcpy(zip_pt + 30, "archive/data.pkl", 16);
    zip_npz[26] = 5;
    memcpy(zip_npz + 30, "w.npy", 5);
    struct {
        const char *bytes;
        size_t n;
        ct_file_format fmt;
        const char *name_part;
    } f[] = {
        {zip_pt, 46, CT_FORMAT_PYTORCH_ZIP, "PyTorch"},
        {zip_npz, 35, CT_FORMAT_NPZ, "NumPy"},
        {"PK\x03\x04", 4, CT_FORMAT_PYTORCH_ZIP, "PyTorch"},
        {"GGUF\x03\0\0\0", 8, CT_FORMAT_GGUF, "GGUF"},
        {"\x93NUMPY\x01\0v\0{'descr'", 18, CT_FORMAT_NUMPY, "NumPy"},
        {"\x80\x02\x8a\x0alZ\xfc\x9c", 8, CT_FORMAT_PICKLE, "pickle"},
    };
    char path[300];
    snprintf(path, sizeof path, "%s/fmt.bin", tmpdir);
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        CHECK(ct_detect_format(f[i].bytes, f[i].n) == f[i].fmt);
        write_file(path, f[i].bytes, f[i].n);
        ct_tensor_file *tf = NULL;
        if (f[i].fmt == CT_FORMAT_PYTORCH_ZIP || f[i].fmt == CT_FORMAT_PICKLE) {
            /* Read natively now (tests/c/test_io_pt.c): these stubs are broken files. */
            CHECK_STATUS(ct_load(path, NULL, &tf), CT_EFORMAT);
            CHECK(strstr(ct_last_error(), "pt [") != NULL);
            CHECK_STATUS(ct_load_memory(f[i].bytes, f[i].n, NULL, &tf), CT_EFORMAT);
            continue;
        }
        CHECK_STATUS(ct_load(path, NULL, &tf), CT_EUNSUPPORTED);
        CHECK(strstr(ct_last_error(), f[i].name_part) && strstr(ct_last_error(), "not support"));
        CHECK_STATUS(ct_load_memory(f[i].bytes, f[i].n, NULL, &tf), CT_EUNSUPPORTED);
    }
    /* Unknown: the first bytes in hex. */
    write_file(path,
               "\x7f"
               "ELF\x02\x01\x01",
               7);
    ct_tensor_file *tf = NULL;
    CHECK_STATUS(ct_load(path, NULL, &tf), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "unknown format") &&
          strstr(ct_last_error(), "7f 45 4c 46 02 01 01)"));
    write_file(path, "", 0);
    CHECK_STATUS(ct_load(path, NULL, &tf), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "empty") != NULL);
    CHECK_STATUS(ct_load_memory(NULL, 0, NULL, &tf), CT_EFORMAT);
    CHECK(ct_detect_format(NULL, 0) == CT_FORMAT_UNKNOWN);
    CHECK(ct_detect_format("{}", 2) == CT_FORMAT_UNKNOWN);
    CHECK(ct_detect_format("\x02\0\0\0\0\0\0\0{}", 10) == CT_FORMAT_SAFETENSORS);
    /* Forcing the format skips detection. */
    ct_load_options o = ct_load_options_default();
    o.format = CT_FORMAT_SAFETENSORS;
    write_file(path, "\x02\0\0\0\0\0\0\0 {", 10);
    CHECK_STATUS(ct_load(path, &o, &tf), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "[header-start]") != NULL);
    o.format = CT_FORMAT_GGUF;
    CHECK_STATUS(ct_load(path, &o, &tf), CT_EUNSUPPORTED);
    /* Not a file, missing, NULL arguments. */
    CHECK_STATUS(ct_load(tmpdir, NULL, &tf), CT_EINVAL);
    snprintf(path, sizeof path, "%s/missing.safetensors", tmpdir);
    CHECK_STATUS(ct_load(path, NULL, &tf), CT_EIO);
    CHECK_STATUS(ct_load(NULL, NULL, &tf), CT_EINVAL);
    CHECK_STATUS(ct_load(path, NULL, NULL), CT_EINVAL);
    for (int i = 0; i <= CT_FORMAT_NPZ; i++)
        CHECK(ct_file_format_name((ct_file_format)i)[0] != '\0');
}

/* ---- a real file, mapped; populate ------------------------------------------------------ */

static void test_mapped(void)
{
    static const char json[] = "{\"w\":" E("F32", "[3]", "0", "12") "}";
    float d[3] = {1, 2, 3};
    size_t n;
    uint8_t *img = image(json, sizeof json - 1, (8 - (sizeof json - 1) % 8) % 8, d, sizeof d, &n);
    char path[300];
    snprintf(path, sizeof path, "%s/w.safetensors", tmpdir);
    write_file(path, img, n);
    for (int pop = 0; pop < 2; pop++) {
        ct_load_options o = ct_load_options_default();
        o.populate = pop;
        ct_tensor_file *f = NULL;
        CHECK_OK(ct_load(path, &o, &f));
        ct_tensor v;
        CHECK_OK(ct_tensor_file_get(f, "w", &v));
        CHECK(v.ndim == 1 && ((const float *)v.data)[2] == 3.0f);
        CHECK(((uintptr_t)v.data % 4) == 0);
        ct_tensor_file_close(f);
    }
    free(img);
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ct_io_test_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_every_dtype();
    test_edges();
    test_conversions();
    test_hostile();
    test_formats();
    test_mapped();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return t_report("test_io_safetensors");
}
