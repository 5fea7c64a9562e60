/* ctorch inspect FILE [--json]: what a tensor file holds, after full validation. */
#include "cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ctorch inspect FILE|DIR [--json]\n"
            "Detect FILE's format from its bytes; for safetensors and PyTorch checkpoints (.pt\n"
            "zip or legacy), validate every rule and list the tensors (name, dtype, shape, bytes,\n"
            "data offsets; for .pt also strides and storage), the metadata and the totals.\n"
            "A DIR is a sharded checkpoint (ctorch train --fsdp): its index and every shard are\n"
            "checked.\n"
            "Exit status 0 for a valid file; 1 with the reason on stderr otherwise.\n"
            "  --json   one JSON object on stdout ({\"valid\": false, ...} for an invalid file)\n");
}

/* Print s with control characters escaped, so a hostile name cannot drive the terminal. */
static void put_safe(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p < 0x20 || *p == 0x7F)
            printf("\\x%02x", *p);
        else
            putchar(*p);
    }
}

static void shape_text(const ct_tensor_info *t, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static int print_json(const char *path, ct_tensor_file *f, const ct_tensor_file_summary *sm)
{
    json_t *tensors = json_array(), *meta = json_object(), *by = json_object();
    bool pt = sm->format == CT_FORMAT_PYTORCH_ZIP || sm->format == CT_FORMAT_PICKLE;
    uint64_t bytes_by[CT_ST_DTYPE_COUNT] = {0};
    size_t count_by[CT_ST_DTYPE_COUNT] = {0};
    for (size_t i = 0; i < sm->tensors; i++) {
        ct_tensor_info t;
        ct_tensor_file_info(f, i, &t);
        json_t *shape = json_array();
        for (int d = 0; d < t.ndim; d++)
            json_array_append_new(shape, json_integer(t.shape[d]));
        json_array_append_new(tensors, json_pack("{s:s, s:s, s:o, s:I, s:I, s:[I, I], s:I}", "name",
                                                 t.name, "dtype", ct_st_dtype_name(t.st_dtype),
                                                 "shape", shape, "elements", (json_int_t)t.numel,
                                                 "bytes", (json_int_t)t.nbytes, "data_offsets",
                                                 (json_int_t)t.data_begin, (json_int_t)t.data_end,
                                                 "file_offset", (json_int_t)t.file_offset));
        if (pt) {
            json_t *o = json_array_get(tensors, json_array_size(tensors) - 1), *st = json_array();
            for (int d = 0; t.strides && d < t.ndim; d++)
                json_array_append_new(st, json_integer(t.strides[d]));
            json_object_set_new(o, "strides", t.strides ? st : (json_decref(st), json_null()));
            ct_storage_info si;
            ct_tensor_file_storage(f, t.storage, &si);
            json_object_set_new(o, "storage", json_string(si.key));
            json_object_set_new(o, "storage_offset", json_integer((json_int_t)t.storage_offset));
        }
        bytes_by[t.st_dtype] += t.nbytes;
        count_by[t.st_dtype]++;
    }
    for (size_t i = 0; i < sm->metadata; i++) {
        const char *k, *v;
        ct_tensor_file_metadata(f, i, &k, &v);
        json_object_set_new(meta, k, json_string(v));
    }
    for (int d = 0; d < CT_ST_DTYPE_COUNT; d++)
        if (count_by[d])
            json_object_set_new(by, ct_st_dtype_name((ct_st_dtype)d),
                                json_pack("{s:I, s:I}", "tensors", (json_int_t)count_by[d], "bytes",
                                          (json_int_t)bytes_by[d]));
    json_t *j = json_pack(
        "{s:s, s:b, s:s, s:I, s:I, s:I, s:I, s:o, s:o, s:{s:I, s:I, s:I, s:o}}", "file", path,
        "valid", 1, "format", ct_file_format_name(sm->format), "file_bytes",
        (json_int_t)sm->file_bytes, "header_bytes", (json_int_t)sm->header_bytes, "data_offset",
        (json_int_t)sm->data_offset, "data_bytes", (json_int_t)sm->data_bytes, "metadata", meta,
        "tensors", tensors, "totals", "tensors", (json_int_t)sm->tensors, "elements",
        (json_int_t)sm->total_elements, "bytes", (json_int_t)sm->data_bytes, "by_dtype", by);
    if (pt) json_object_set_new(j, "storages", json_integer((json_int_t)sm->storages));
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!s) return cli_fail("inspect: out of memory", CT_ENOMEM);
    puts(s);
    free(s);
    return 0;
}

static void print_text(const char *path, ct_tensor_file *f, const ct_tensor_file_summary *sm)
{
    bool pt = sm->format == CT_FORMAT_PYTORCH_ZIP || sm->format == CT_FORMAT_PICKLE;
    printf("file    ");
    put_safe(path);
    if (pt)
        printf("\nformat  %s, %llu bytes: pickle %llu bytes, %zu storages of %llu bytes\n",
               ct_file_format_name(sm->format), (unsigned long long)sm->file_bytes,
               (unsigned long long)sm->header_bytes, sm->storages,
               (unsigned long long)sm->data_bytes);
    else
        printf("\nformat  %s, %llu bytes: header %llu bytes, data %llu bytes at offset %llu\n",
               ct_file_format_name(sm->format), (unsigned long long)sm->file_bytes,
               (unsigned long long)sm->header_bytes, (unsigned long long)sm->data_bytes,
               (unsigned long long)sm->data_offset);
    if (sm->metadata) {
        printf("metadata (%zu)\n", sm->metadata);
        for (size_t i = 0; i < sm->metadata; i++) {
            const char *k, *v;
            ct_tensor_file_metadata(f, i, &k, &v);
            printf("  ");
            put_safe(k);
            printf(" = ");
            put_safe(v);
            putchar('\n');
        }
    }
    printf("tensors (%zu, in file order%s)\n", sm->tensors,
           pt ? "; begin and end: bytes of the storage the tensor reaches" : "");
    if (sm->tensors)
        printf("  %-12s %-22s %14s %14s %14s  %s\n", "dtype", "shape", "bytes", "begin", "end",
               "name");
    for (size_t i = 0; i < sm->tensors; i++) {
        ct_tensor_info t;
        char shape[256];
        ct_tensor_file_info(f, i, &t);
        shape_text(&t, shape, sizeof shape);
        printf("  %-12s %-22s %14llu %14llu %14llu  ", ct_st_dtype_name(t.st_dtype), shape,
               (unsigned long long)t.nbytes, (unsigned long long)t.data_begin,
               (unsigned long long)t.data_end);
        put_safe(t.name);
        if (pt) {
            ct_storage_info si;
            ct_tensor_file_storage(f, t.storage, &si);
            printf("  (storage ");
            put_safe(si.key);
            printf(" at element %llu", (unsigned long long)t.storage_offset);
            if (t.strides) {
                printf(", strides [");
                for (int d = 0; d < t.ndim; d++)
                    printf("%s%lld", d ? ", " : "", (long long)t.strides[d]);
                printf("]");
            }
            printf(")");
        }
        putchar('\n');
    }
    printf("total   %zu tensors, %llu elements, %llu bytes (%.2f MiB)\n", sm->tensors,
           (unsigned long long)sm->total_elements, (unsigned long long)sm->data_bytes,
           sm->data_bytes / 1048576.0);
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "ctorch inspect: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (path) {
            fprintf(stderr, "ctorch inspect: one FILE only ('%s' and '%s' given)\n", path, argv[i]);
            return 2;
        } else
            path = argv[i];
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return cli_inspect_sharded(path, json);
    ct_tensor_file *f;
    ct_status s = ct_load(path, NULL, &f);
    if (s != CT_OK) {
        if (json) {
            json_t *j = json_pack("{s:s, s:b, s:s, s:s}", "file", path, "valid", 0, "status",
                                  ct_status_name(s), "error", ct_last_error());
            char *o = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            if (o) puts(o);
            free(o);
            json_decref(j);
        }
        return cli_fail("inspect", s);
    }
    ct_tensor_file_summary sm;
    ct_tensor_file_summarize(f, &sm);
    int rc = 0;
    if (json)
        rc = print_json(path, f, &sm);
    else
        print_text(path, f, &sm);
    ct_tensor_file_close(f);
    return rc;
}
