/* Checks shared by the .pt fuzz targets: an opened PyTorch checkpoint is self-consistent,
 * every byte a tensor can reach lies inside its storage, views and conversions work, and a
 * file whose tensors PyTorch has storages for saves as .pt and loads back equal. */
#ifndef FUZZ_PT_COMMON_H
#define FUZZ_PT_COMMON_H
#include "ctorch/ctorch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_REQUIRE(c)                                                                            \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_pt: invariant failed: %s (%s)\n", #c, ct_last_error());          \
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

static void fuzz_pt_check(ct_tensor_file *f)
{
    ct_tensor_file_summary sm;
    FUZZ_REQUIRE(ct_tensor_file_summarize(f, &sm) == CT_OK);
    FUZZ_REQUIRE(sm.storages == ct_tensor_file_storage_count(f));
    uint64_t sum = 0, bytes = 0;
    for (size_t i = 0; i < sm.storages; i++) {
        ct_storage_info si;
        FUZZ_REQUIRE(ct_tensor_file_storage(f, i, &si) == CT_OK);
        sum += fuzz_touch(si.data, (size_t)si.nbytes) + fuzz_touch(si.key, strlen(si.key));
        bytes += si.nbytes;
    }
    FUZZ_REQUIRE(bytes == sm.data_bytes);
    int writable = 1;
    for (size_t i = 0; i < sm.tensors; i++) {
        ct_tensor_info t;
        FUZZ_REQUIRE(ct_tensor_file_info(f, i, &t) == CT_OK);
        ct_storage_info si;
        FUZZ_REQUIRE(ct_tensor_file_storage(f, t.storage, &si) == CT_OK);
        FUZZ_REQUIRE(t.data_begin <= t.data_end && t.data_end <= si.nbytes);
        FUZZ_REQUIRE((const uint8_t *)t.data == (const uint8_t *)si.data + t.data_begin);
        sum += fuzz_touch((const uint8_t *)si.data + t.data_begin,
                          (size_t)(t.data_end - t.data_begin));
        size_t j = (size_t)-1;
        FUZZ_REQUIRE(ct_tensor_file_find(f, t.name, &j) == CT_OK && j == i);
        if (!t.has_dtype || t.ndim > CT_MAX_DIMS) writable = 0;
        if (t.has_dtype && (t.dtype == CT_DTYPE_F8_E4M3 || t.dtype == CT_DTYPE_F8_E5M2))
            writable = 0;
        ct_tensor v;
        ct_status vs = ct_tensor_file_view(f, i, &v);
        if (vs == CT_OK && t.numel <= (1u << 16)) {
            ct_tensor c;
            ct_status rs = ct_tensor_file_read(f, i, CT_DTYPE_F64, &c);
            FUZZ_REQUIRE(rs == CT_OK);
            sum += fuzz_touch(c.data, (size_t)t.numel * 8);
            ct_tensor_free(&c);
        } else if (vs != CT_OK)
            writable = 0;
    }
    for (size_t i = 0; i < sm.metadata; i++) {
        const char *k, *v;
        FUZZ_REQUIRE(ct_tensor_file_metadata(f, i, &k, &v) == CT_OK);
        sum += fuzz_touch(v, strlen(v)) + fuzz_touch(k, strlen(k));
    }
    /* Round trip through the .pt writer. */
    if (writable && sm.total_elements <= (1u << 20)) {
        size_t n = sm.tensors;
        ct_tensor *ts = calloc(n + 1, sizeof *ts);
        const char **names = calloc(n + 1, sizeof *names);
        FUZZ_REQUIRE(ts && names);
        for (size_t i = 0; i < n; i++) {
            ct_tensor_info t;
            ct_tensor_file_info(f, i, &t);
            names[i] = t.name;
            FUZZ_REQUIRE(ct_tensor_file_view(f, i, &ts[i]) == CT_OK);
        }
        char path[256];
        const char *dir = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/ctorch-fuzz-pt-%ld.pt", dir && *dir ? dir : "/tmp",
                 (long)getpid());
        ct_save_options o = ct_save_options_default();
        o.sync = false;
        ct_status s = ct_save_pt(path, ts, names, n, &o);
        FUZZ_REQUIRE(s == CT_OK || s == CT_EIO || s == CT_ENOMEM);
        if (s == CT_OK) {
            ct_tensor_file *g = NULL;
            FUZZ_REQUIRE(ct_load(path, NULL, &g) == CT_OK);
            FUZZ_REQUIRE(ct_tensor_file_count(g) == n);
            for (size_t i = 0; i < n; i++) {
                size_t j;
                FUZZ_REQUIRE(ct_tensor_file_find(g, names[i], &j) == CT_OK);
                ct_tensor a, b;
                FUZZ_REQUIRE(ct_tensor_file_read(f, i, ts[i].dtype, &a) == CT_OK);
                FUZZ_REQUIRE(ct_tensor_file_read(g, j, ts[i].dtype, &b) == CT_OK);
                FUZZ_REQUIRE(a.ndim == b.ndim);
                size_t nb = (size_t)ct_tensor_numel(&a) * ct_dtype_size(a.dtype);
                FUZZ_REQUIRE(nb == 0 || memcmp(a.data, b.data, nb) == 0);
                ct_tensor_free(&a);
                ct_tensor_free(&b);
            }
            ct_tensor_file_close(g);
            unlink(path);
        }
        free(ts);
        free(names);
    }
    (void)sum;
}
#endif
