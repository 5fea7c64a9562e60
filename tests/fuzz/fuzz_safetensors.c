/* libFuzzer target: the whole safetensors loader on arbitrary bytes.
 *
 * Checks, beyond "no crash, no out-of-bounds read, no leak, no undefined behaviour":
 * validation and loading agree; every tensor lies inside the image, tensors tile the data
 * buffer, lookups by name find each tensor; views and conversions work; and a valid file
 * saved again through raw entries loads back with the same tensors and metadata. */
#include "ctorch/ctorch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_REQUIRE(c)                                                                            \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_safetensors: invariant failed: %s (%s)\n", #c, ct_last_error()); \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t fuzz_touch(const void *p, size_t n)
{
    const volatile uint8_t *b = p;
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += b[i];
    return s;
}

/* Save f again (raw entries, in file order, same metadata) and compare what loads back. */
static void fuzz_round_trip(const ct_tensor_file *f)
{
    size_t n = ct_tensor_file_count(f), m = ct_tensor_file_metadata_count(f);
    ct_save_entry *e = calloc(n + 1, sizeof *e);
    const char **mk = calloc(m + 1, sizeof *mk), **mv = calloc(m + 1, sizeof *mv);
    FUZZ_REQUIRE(e && mk && mv);
    for (size_t i = 0; i < n; i++) {
        ct_tensor_info t;
        FUZZ_REQUIRE(ct_tensor_file_info(f, i, &t) == CT_OK);
        e[i] = (ct_save_entry){t.name, NULL, t.st_dtype, t.ndim, t.shape, t.data};
    }
    for (size_t i = 0; i < m; i++)
        FUZZ_REQUIRE(ct_tensor_file_metadata(f, i, &mk[i], &mv[i]) == CT_OK);
    char path[256];
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/ctorch-fuzz-%ld.safetensors", dir && *dir ? dir : "/tmp",
             (long)getpid());
    ct_save_options o = ct_save_options_default();
    o.sync = false;
    ct_status s = ct_save_safetensors_entries(path, e, n, mk, mv, m, &o);
    /* The only refusal a valid file can meet: a rewritten header over the size limit. */
    FUZZ_REQUIRE(s == CT_OK || s == CT_EIO || s == CT_ENOMEM);
    ct_tensor_file *g = NULL;
    if (s == CT_OK) {
        FUZZ_REQUIRE(ct_load(path, NULL, &g) == CT_OK);
        FUZZ_REQUIRE(ct_tensor_file_count(g) == n && ct_tensor_file_metadata_count(g) == m);
        for (size_t i = 0; i < n; i++) {
            size_t j;
            ct_tensor_info a, b;
            FUZZ_REQUIRE(ct_tensor_file_find(g, e[i].name, &j) == CT_OK);
            ct_tensor_file_info(f, i, &a);
            ct_tensor_file_info(g, j, &b);
            FUZZ_REQUIRE(a.st_dtype == b.st_dtype && a.ndim == b.ndim && a.nbytes == b.nbytes);
            for (int d = 0; d < a.ndim; d++)
                FUZZ_REQUIRE(a.shape[d] == b.shape[d]);
            FUZZ_REQUIRE(memcmp(a.data, b.data, (size_t)a.nbytes) == 0);
        }
        for (size_t i = 0; i < m; i++) {
            const char *v = ct_tensor_file_metadata_get(g, mk[i]);
            FUZZ_REQUIRE(v && strcmp(v, mv[i]) == 0);
        }
        ct_tensor_file_close(g);
        unlink(path);
    }
    free(e);
    free(mk);
    free(mv);
}

static int fuzz_safetensors_one(const uint8_t *data, size_t size)
{
    ct_st_rule rule = CT_ST_RULE_COUNT;
    ct_status vs = ct_safetensors_validate(data, size, &rule);
    FUZZ_REQUIRE((vs == CT_OK) == (rule == CT_ST_RULE_NONE));
    (void)ct_detect_format(data, size);
    ct_tensor_file *auto_f = NULL;
    if (ct_load_memory(data, size, NULL, &auto_f) == CT_OK) ct_tensor_file_close(auto_f);

    ct_load_options o = ct_load_options_default();
    o.format = CT_FORMAT_SAFETENSORS;
    ct_tensor_file *f = NULL;
    ct_status s = ct_load_memory(data, size, &o, &f);
    FUZZ_REQUIRE(s == vs);
    if (s != CT_OK) {
        FUZZ_REQUIRE(f == NULL && ct_last_error()[0] != '\0');
        return 0;
    }
    ct_tensor_file_summary sm;
    FUZZ_REQUIRE(ct_tensor_file_summarize(f, &sm) == CT_OK);
    FUZZ_REQUIRE(sm.file_bytes == size && sm.data_offset + sm.data_bytes == size);
    uint64_t cursor = 0, sum = 0;
    for (size_t i = 0; i < sm.tensors; i++) {
        ct_tensor_info t;
        FUZZ_REQUIRE(ct_tensor_file_info(f, i, &t) == CT_OK);
        const uint8_t *p = t.data;
        FUZZ_REQUIRE(p >= data + sm.data_offset && p + t.nbytes <= data + size);
        FUZZ_REQUIRE(t.data_begin == cursor && t.data_end - t.data_begin == t.nbytes);
        cursor = t.data_end;
        size_t j = (size_t)-1;
        FUZZ_REQUIRE(ct_tensor_file_find(f, t.name, &j) == CT_OK && j == i);
        sum += fuzz_touch(t.data, (size_t)t.nbytes) + fuzz_touch(t.name, strlen(t.name));
        ct_tensor v;
        ct_status vs2 = ct_tensor_file_view(f, i, &v);
        /* Only empty tensors may have dims too large for ct_tensor strides. */
        if (!t.has_dtype || t.ndim > CT_MAX_DIMS)
            FUZZ_REQUIRE(vs2 == CT_EUNSUPPORTED);
        else
            FUZZ_REQUIRE(vs2 == CT_OK || (vs2 == CT_EOVERFLOW && t.numel == 0));
        if (vs2 == CT_OK) {
            FUZZ_REQUIRE(v.data == t.data && ct_tensor_numel(&v) == (int64_t)t.numel);
            sum += fuzz_touch(v.data, (size_t)t.numel * ct_dtype_size(v.dtype));
        }
        if (vs2 == CT_OK && t.numel <= (1u << 16)) {
            static const ct_dtype to[3] = {CT_DTYPE_F32, CT_DTYPE_BF16, CT_DTYPE_F64};
            for (int k = 0; k < 3; k++) {
                ct_tensor c;
                ct_status rs = ct_tensor_file_read(f, i, to[k], &c);
                FUZZ_REQUIRE(rs == CT_OK || (rs == CT_EOVERFLOW && t.numel == 0));
                if (rs == CT_OK) sum += fuzz_touch(c.data, (size_t)t.numel * ct_dtype_size(to[k]));
                ct_tensor_free(&c);
            }
        }
    }
    FUZZ_REQUIRE(cursor == sm.data_bytes);
    for (size_t i = 0; i < sm.metadata; i++) {
        const char *k, *v;
        FUZZ_REQUIRE(ct_tensor_file_metadata(f, i, &k, &v) == CT_OK);
        FUZZ_REQUIRE(ct_tensor_file_metadata_get(f, k) == v);
        sum += fuzz_touch(v, strlen(v));
    }
    if (size <= (1u << 20)) fuzz_round_trip(f);
    ct_tensor_file_close(f);
    return (int)(sum & 0);
}

#ifndef CT_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_safetensors_one(data, size);
}
#endif
