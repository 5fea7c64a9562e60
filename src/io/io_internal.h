/* Private helpers of the io module (safetensors reader and writer). */
#ifndef CT_IO_INTERNAL_H
#define CT_IO_INTERNAL_H

#include "ctorch/io.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest header a reader accepts (the reference implementation's MAX_HEADER_SIZE). */
#define CT_ST_MAX_HEADER 100000000ull

/* Length of the valid UTF-8 sequence at s (n bytes available): 1..4, or 0 when the bytes
 * there are not valid UTF-8 (stray continuation, overlong form, surrogate, > U+10FFFF,
 * truncated sequence). */
size_t ct_io_utf8_seq(const uint8_t *s, size_t n);

/* True when s[0..n) is valid UTF-8; otherwise *bad (may be NULL) gets the offset of the
 * first invalid byte. */
bool ct_io_utf8_valid(const void *s, size_t n, size_t *bad);

/* Copy a tensor name into buf (cap >= 8) for an error message: control characters become
 * \xNN, and long names are cut at a character boundary with "...". */
const char *ct_io_quote(char *buf, size_t cap, const char *name);

/* ---- the opened-file tables (shared by the safetensors and PyTorch readers) ----------- */

typedef struct st_entry {
    const char *name;
    const int64_t *shape;
    const int64_t *strides; /* NULL: row-major contiguous (always for safetensors) */
    const uint8_t *data;    /* element [0, ..., 0] (into the image, or into f->owned) */
    uint64_t numel, nbytes, begin, end;
    uint64_t file_offset;    /* absolute position of element 0 in the file */
    uint64_t storage_offset; /* .pt: elements into the storage */
    size_t storage;          /* .pt: index into f->storages; safetensors: own index */
    size_t order;            /* position in the header */
    int ndim;
    ct_st_dtype dt;
} st_entry;

typedef struct pt_storage {
    const char *key;
    const uint8_t *data; /* into the image, or into f->owned (byte-swapped copies) */
    uint64_t nbytes, file_offset;
    ct_st_dtype dt;
} pt_storage;

struct ct_tensor_file {
    ct_file_format format;
    const uint8_t *base; /* the whole file image */
    size_t size;
    void *map; /* non-NULL when we mapped it */
    uint64_t header_len;
    uint64_t data_offset, data_bytes; /* summary figures */
    size_t count;
    st_entry *entries; /* file order */
    size_t *by_name;   /* indices into entries sorted by name */
    size_t meta_count;
    const char **meta; /* key, value, key, value, ... in header order */
    char *strings;     /* every name, key and value */
    int64_t *dims;     /* every shape (and, for .pt, every stride) */
    uint64_t total_elements;
    size_t storage_count;
    pt_storage *storages; /* .pt only */
    void *owned;          /* .pt: byte-swapped storages, freed at close */
};

/* Sort f->by_name (f->entries and f->count set). */
void ct_io_sort_names(ct_tensor_file *f);

/* ---- zip archives (src/io/zip.c) ------------------------------------------------------ */

typedef struct ct_zip_member {
    const char *name;     /* NUL-terminated (names holding NUL are refused) */
    uint64_t data_offset; /* absolute offset of the member's bytes */
    uint64_t size;        /* stored: compressed size == uncompressed size */
    uint64_t header_offset;
    uint32_t crc32;
} ct_zip_member;

typedef struct ct_zip {
    ct_zip_member *members; /* central directory order */
    size_t count;
    char *names;
} ct_zip;

/* Read the central directory of the zip image base[0..size) and check every member:
 * stored (not compressed, not encrypted), inside the file, local header matching, no two
 * members overlapping, no name twice. Errors are CT_EFORMAT "pt [zip-<rule>]: <label>: ..."
 * (CT_EUNSUPPORTED for compressed and encrypted members). */
ct_status ct_zip_open(const char *label, const uint8_t *base, size_t size, ct_zip *z);
void ct_zip_close(ct_zip *z);
/* The member called name, or NULL. */
const ct_zip_member *ct_zip_find(const ct_zip *z, const char *name);
/* CRC-32 (ISO-HDLC, as zip uses) of n bytes, continuing from crc (0 to start). */
uint32_t ct_crc32(uint32_t crc, const void *p, size_t n);

/* ---- the restricted unpickler (src/io/pickle.c) --------------------------------------- */

/* Objects the unpickler builds. It never calls anything: the allowed globals
 * (torch.load(weights_only=True)'s allow-list) are recognised by name and their effect is
 * modelled here. */
typedef enum pk_kind {
    PK_NONE,
    PK_BOOL,
    PK_INT,
    PK_FLOAT,
    PK_STR,
    PK_BYTES,
    PK_TUPLE,
    PK_LIST,
    PK_DICT, /* also OrderedDict (flag PK_F_ORDERED) */
    PK_SET,
    PK_GLOBAL,  /* an allowed global: .u.global */
    PK_STORAGE, /* from persistent_load: .u.storage */
    PK_TENSOR,  /* from _rebuild_tensor(_v2 / _v3) / _rebuild_parameter */
} pk_kind;

/* Allowed globals (weights_only=True in PyTorch 2.13). */
typedef enum pk_global_id {
    PKG_ORDERED_DICT,
    PKG_PARAMETER,
    PKG_GET_LAYOUT,
    PKG_SIZE,
    PKG_TENSOR,
    PKG_DTYPE,        /* torch.float32, ...: .u.global.arg = index into the dtype table */
    PKG_TENSOR_CLASS, /* torch.FloatTensor, torch.cuda.FloatTensor, torch.sparse.*, ... */
    PKG_STORAGE_TYPE, /* torch.FloatStorage, ...: .u.global.arg = index into the storage table */
    PKG_REBUILD_PARAMETER,
    PKG_REBUILD_TENSOR,
    PKG_REBUILD_TENSOR_V2,
    PKG_REBUILD_TENSOR_V3, /* (storage, offset, size, stride, requires_grad, hooks, dtype[, meta]) */
    PKG_REBUILD_SPARSE_TENSOR,
    PKG_REBUILD_META_TENSOR,
    PKG_REBUILD_SPARSE_CSR_TENSOR,
} pk_global_id;

/* A storage type: its torch name, element size and the safetensors dtype of its elements
 * (complex128 is exposed as F64 pairs; quantized types have none: quantized true). */
typedef struct pk_storage_type {
    const char *name; /* "FloatStorage" */
    ct_st_dtype dt;
    int elem_size;
    bool complex_pairs; /* ComplexDoubleStorage: each element is two F64 */
    bool quantized;     /* QInt8Storage, ...: ctorch has no quantized tensors */
    bool untyped;       /* UntypedStorage: bytes */
    bool dtype_only;    /* not a storage global: the element type of a torch dtype (v3 rebuilds) */
} pk_storage_type;
extern const pk_storage_type ct_pk_storage_types[];
extern const size_t ct_pk_storage_type_count;
/* The storage type holding the elements of torch dtype number arg (a PKG_DTYPE global's
 * .arg): true and *type (an index into ct_pk_storage_types), false where ctorch has no such
 * element type (bits1x8, float4_e2m1fn_x2, ...). *name is the dtype's name either way. */
bool ct_pk_dtype_storage_type(uint16_t arg, size_t *type, const char **name);

typedef struct pk_obj pk_obj;
typedef struct pk_tensor {
    size_t storage;  /* index of the storage (the loader's numbering) */
    uint64_t offset; /* elements */
    int ndim;
    int64_t *shape, *strides;
    bool parameter, requires_grad;
    bool has_dtype; /* _rebuild_tensor_v3: the dtype below gives the elements */
    uint16_t dtype; /* a PKG_DTYPE .arg */
} pk_tensor;

struct pk_obj {
    uint8_t kind;  /* pk_kind */
    uint8_t flags; /* PK_F_* */
    uint8_t mark;  /* flatten: visiting */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            char *s; /* NUL-terminated copy */
            size_t n;
        } str;
        struct {
            pk_obj **items; /* dict: key, value, key, value, ... */
            size_t n, cap;
        } seq;
        struct {
            uint8_t id; /* pk_global_id */
            uint16_t arg;
            const char *name; /* "torch.FloatStorage" */
        } global;
        size_t storage;
        pk_tensor *tensor;
    } u;
};
#define PK_F_ORDERED 1 /* an OrderedDict */

/* Persistent ids (BINPERSID): the caller turns the pid into an object (a PK_STORAGE). */
typedef ct_status (*pk_persistent_fn)(void *ctx, pk_obj *pid, pk_obj **out);

typedef struct pk_machine pk_machine;

/* Limits (every one has its own error). */
#define PK_MAX_OBJECTS (1u << 22) /* objects one pickle may create */
#define PK_MAX_MARKS 4096         /* MARKs open at once */
#define PK_MAX_DIMS 64            /* tensor rank */
#define PK_MAX_NEST 64            /* container nesting when flattening */

/* A machine whose objects live until ct_pk_free (several pickles may share it, as the
 * legacy format's do). label names the file in messages. */
ct_status ct_pk_new(const char *label, pk_persistent_fn persistent, void *ctx, pk_machine **out);
void ct_pk_free(pk_machine *m);
/* Run the pickle in p[0..n) to its STOP; *used gets the bytes consumed, *out the result.
 * Errors: CT_EFORMAT "pt [pickle-<rule>]: <label>: ..." naming the opcode, its position and
 * the global or type it met; CT_EUNSUPPORTED for allowed globals ctorch cannot model
 * (sparse, meta and quantized tensors); CT_ENOMEM. */
ct_status ct_pk_run(pk_machine *m, const uint8_t *p, size_t n, size_t *used, pk_obj **out);
/* New objects for the persistent-load callback. */
ct_status ct_pk_make(pk_machine *m, pk_kind kind, pk_obj **out);
/* A message naming an object's type ("a list", "torch.FloatStorage", ...). */
const char *ct_pk_kind_name(const pk_obj *o);

/* ---- PyTorch checkpoints (src/io/pt_read.c) ------------------------------------------- */

/* Parse a torch.save zip (CT_FORMAT_PYTORCH_ZIP) or legacy (CT_FORMAT_PICKLE) image into f
 * (zeroed by the caller; on failure the caller frees it with ct_io_file_free). */
ct_status ct_io_pt_parse(const char *label, ct_file_format fmt, const uint8_t *base, size_t size,
                         ct_tensor_file *f);
/* Free f's tables (not f itself, not the mapping). */
void ct_io_file_free(ct_tensor_file *f);

/* ct_save_pt_entries, with zip64 records for every member when force_zip64 (tests). */
ct_status ct_io_save_pt_impl(const char *path, const ct_save_entry *entries, size_t count,
                             const ct_save_options *opts, bool force_zip64);

/* ---- atomic file writing (src/io/pt_write.c) ------------------------------------------ */

typedef struct ct_io_out {
    int fd;
    const char *path; /* for messages */
    const char *fn;   /* the calling function, for messages */
    uint64_t written;
} ct_io_out;

/* Write n bytes (retrying short writes); CT_EIO naming fn, path and errno. */
ct_status ct_io_out_write(ct_io_out *o, const void *p, size_t n);
/* Write `path` atomically: create a temp file in its folder, call body(ctx, out), fsync,
 * rename over path, fsync the folder (as ct_save_safetensors does; opts as there). */
ct_status ct_io_atomic_write(const char *fn, const char *path, const ct_save_options *opts,
                             ct_status (*body)(void *ctx, ct_io_out *out), void *ctx);

#endif
