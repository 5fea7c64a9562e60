/*
 * ctorch/io.h - tensor files: format detection, safetensors load (mmap, zero-copy views)
 * and atomic save.
 *
 * Loading detects the format from the bytes, never from the file name, as PyTorch 2.13's
 * torch.load does. Safetensors files are mapped read-only and validated in full before any
 * tensor is handed out (the rules are listed with ct_st_rule and in docs/safetensors.md);
 * tensors are then zero-copy views into the mapping, converted or copied only on request.
 * PyTorch checkpoints (torch.save zip files and the legacy non-zip format) are read natively
 * and safely, as torch.load(weights_only=True) does: a strict zip reader and an unpickler
 * that never calls anything and knows only the allow-list of globals (docs/pt.md). Their
 * storages are mapped like safetensors data, tensors are views into them (sharing
 * storages, any strides), nested containers flatten to dotted names, and non-tensor values
 * become metadata (JSON text). GGUF and NumPy files are recognised and refused with
 * CT_EUNSUPPORTED ("not supported yet"); anything else is CT_EFORMAT ("unknown format",
 * with the first bytes in hex).
 *
 *     ct_tensor_file *f;
 *     if (ct_load("model.safetensors", NULL, &f) != CT_OK) puts(ct_last_error());
 *     ct_tensor w, w32;
 *     ct_tensor_file_get(f, "lm_head.weight", &w);                  // view, read-only
 *     ct_tensor_file_get_as(f, "lm_head.weight", CT_DTYPE_F32, &w32); // owning copy
 *     ct_tensor_free(&w32);
 *     ct_tensor_file_close(f);                                       // views die here
 *
 * Saving writes a temporary file in the target's folder, fsyncs it, renames it over the
 * target and fsyncs the folder: a failed or interrupted save leaves the old file as it was.
 * A ct_tensor_file is immutable once opened: any number of threads may read it at once.
 */
#ifndef CTORCH_IO_H
#define CTORCH_IO_H

#include "ctorch/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- formats -------------------------------------------------------------------------- */

/** File formats ct_load recognises. Values are stable (the Python binding relies on them). */
typedef enum ct_file_format {
    CT_FORMAT_UNKNOWN = 0,     /**< none of the below; as ct_load_options.format: detect */
    CT_FORMAT_SAFETENSORS = 1, /**< u64 header length, '{' at byte 8 (loaded) */
    CT_FORMAT_PYTORCH_ZIP = 2, /**< torch.save zip archive, "PK\x03\x04" (loaded) */
    CT_FORMAT_PICKLE = 3,      /**< legacy torch.save / pickle, 0x80 then protocol 2..5
                                    (loaded when it is a legacy torch.save file) */
    CT_FORMAT_GGUF = 4,        /**< llama.cpp GGUF, "GGUF" */
    CT_FORMAT_NUMPY = 5,       /**< NumPy .npy, "\x93NUMPY" */
    CT_FORMAT_NPZ = 6,         /**< NumPy .npz: a zip whose first member ends in ".npy" */
} ct_file_format;

/** Human name of a format ("safetensors", "PyTorch zip checkpoint", ...); never NULL. */
CT_API const char *ct_file_format_name(ct_file_format fmt);

/** Format of a file from its first n bytes (64 are enough; fewer give a best effort).
 *  head may be NULL when n == 0. Never fails: CT_FORMAT_UNKNOWN when nothing matches. */
CT_API ct_file_format ct_detect_format(const void *head, size_t n);

/* ---- safetensors dtypes --------------------------------------------------------------- */

/** Every dtype of the safetensors specification (huggingface/safetensors tensor.rs). */
typedef enum ct_st_dtype {
    CT_ST_BOOL = 0,
    CT_ST_U8,
    CT_ST_I8,
    CT_ST_I16,
    CT_ST_U16,
    CT_ST_F16,
    CT_ST_BF16,
    CT_ST_I32,
    CT_ST_U32,
    CT_ST_F32,
    CT_ST_F64,
    CT_ST_I64,
    CT_ST_U64,
    CT_ST_C64, /**< complex64: two f32 */
    CT_ST_F8_E4M3,
    CT_ST_F8_E5M2,
    CT_ST_F8_E8M0,
    CT_ST_F8_E4M3FNUZ,
    CT_ST_F8_E5M2FNUZ,
    CT_ST_F4,      /**< 4 bits per element: tensors must fill whole bytes */
    CT_ST_F6_E2M3, /**< 6 bits per element */
    CT_ST_F6_E3M2, /**< 6 bits per element */
    CT_ST_DTYPE_COUNT
} ct_st_dtype;

/** The name used in safetensors headers ("BF16", "F8_E4M3", ...); "?" if invalid. */
CT_API const char *ct_st_dtype_name(ct_st_dtype dt);
/** Bits per element (4, 6, 8, 16, 32 or 64); 0 if invalid. */
CT_API int ct_st_dtype_bits(ct_st_dtype dt);
/** Parse a header dtype name (exact, case-sensitive); CT_EINVAL if unknown. */
CT_API ct_status ct_st_dtype_from_name(const char *name, ct_st_dtype *out);
/** The ctorch dtype of a safetensors dtype into *out (may be NULL); false when ctorch has
 *  none (U16, U32, U64, C64, F8_E8M0, the FNUZ and sub-byte types: raw bytes only). */
CT_API bool ct_st_dtype_to_ct(ct_st_dtype dt, ct_dtype *out);
/** The safetensors dtype a ctorch dtype is saved as; CT_EINVAL for an invalid dtype. */
CT_API ct_status ct_st_dtype_from_ct(ct_dtype dt, ct_st_dtype *out);

/* ---- validation rules ----------------------------------------------------------------- */

/** The rule a rejected safetensors file broke. Each has a distinct message too, which
 *  starts with "safetensors [<rule name>]" and names the tensor when there is one. */
typedef enum ct_st_rule {
    CT_ST_RULE_NONE = 0,         /**< valid */
    CT_ST_RULE_FILE_TOO_SMALL,   /**< fewer than 8 bytes */
    CT_ST_RULE_HEADER_TOO_LARGE, /**< header length N > 100,000,000 */
    CT_ST_RULE_HEADER_PAST_END,  /**< N > file size - 8 */
    CT_ST_RULE_HEADER_START,     /**< the header does not start with '{' */
    CT_ST_RULE_NUL,              /**< a NUL byte or \u0000 inside the header */
    CT_ST_RULE_UTF8,             /**< the header (names, strings) is not valid UTF-8 */
    CT_ST_RULE_DEPTH,            /**< JSON nested deeper than 64 levels */
    CT_ST_RULE_JSON,             /**< not one well-formed JSON object (trailing spaces ok) */
    CT_ST_RULE_DUPLICATE_KEY,    /**< the same key twice in one object */
    CT_ST_RULE_ENTRY,            /**< a tensor entry is not {dtype, shape, data_offsets} */
    CT_ST_RULE_DTYPE,            /**< dtype is not a string naming a specification dtype */
    CT_ST_RULE_SHAPE,            /**< shape is not an array of non-negative integers */
    CT_ST_RULE_OFFSETS,          /**< data_offsets is not [begin, end], 0 <= begin <= end */
    CT_ST_RULE_OVERFLOW,         /**< element count x element bits overflows 64 bits */
    CT_ST_RULE_SUBBYTE,          /**< a sub-byte tensor does not fill whole bytes */
    CT_ST_RULE_SIZE_MISMATCH,    /**< end - begin differs from element count x size */
    CT_ST_RULE_PAST_END,         /**< a tensor's bytes run past the end of the file */
    CT_ST_RULE_GAP,              /**< bytes between two tensors that no tensor owns */
    CT_ST_RULE_OVERLAP,          /**< two tensors share bytes */
    CT_ST_RULE_TRAILING,         /**< bytes after the last tensor (polyglot files) */
    CT_ST_RULE_METADATA,         /**< __metadata__ is not an object of string values */
    CT_ST_RULE_COUNT
} ct_st_rule;

/** Short stable name of a rule ("header-too-large", "gap", ...); never NULL. */
CT_API const char *ct_st_rule_name(ct_st_rule rule);

/** Validate an in-memory safetensors file image of `size` bytes against every rule (the
 *  same checks ct_load makes). *rule (may be NULL) receives CT_ST_RULE_NONE or the rule
 *  broken. Returns CT_OK, CT_EFORMAT, CT_EOVERFLOW (CT_ST_RULE_OVERFLOW) or CT_ENOMEM. */
CT_API ct_status ct_safetensors_validate(const void *data, size_t size, ct_st_rule *rule);

/* ---- loading -------------------------------------------------------------------------- */

/** Options of ct_load / ct_load_memory. */
typedef struct ct_load_options {
    ct_file_format format; /**< CT_FORMAT_UNKNOWN (default): detect from the bytes;
                                CT_FORMAT_SAFETENSORS / _PYTORCH_ZIP / _PICKLE: parse as
                                that format regardless */
    bool populate;         /**< prefault every page at open (MAP_POPULATE): the open
                                reads the whole file, later reads take no page faults.
                                Default false: open costs the same for any file size */
} ct_load_options;

/** The defaults listed above. */
CT_API ct_load_options ct_load_options_default(void);

/** An opened tensor file (opaque). */
typedef struct ct_tensor_file ct_tensor_file;

/** Open `path`, detect its format and load it into *out (closed with ct_tensor_file_close).
 *  opts may be NULL (defaults). Safetensors files are mapped read-only, not read: the pages
 *  come in as tensors are touched. The file must not be truncated while it is open (the OS
 *  would deliver SIGBUS on access to the lost pages); replacing it with ct_save_* is safe
 *  (rename keeps the old inode alive). Errors: CT_EIO (open/stat/map failed), CT_EINVAL
 *  (not a regular file), CT_EUNSUPPORTED (a recognised format ctorch cannot read yet, or
 *  a .pt file holding what ctorch has no tensor for: sparse, quantized or meta tensors),
 *  CT_EFORMAT / CT_EOVERFLOW (an unknown format, a safetensors rule broken: see
 *  ct_st_rule, or a .pt file refused: "pt [<rule>]", docs/pt.md), CT_ENOMEM.
 *  *out is NULL on failure. */
CT_API ct_status ct_load(const char *path, const ct_load_options *opts, ct_tensor_file **out);

/** Same as ct_load over a file image already in memory. Nothing is copied: `data` must
 *  stay valid and unchanged until ct_tensor_file_close. data may be NULL when size == 0. */
CT_API ct_status ct_load_memory(const void *data, size_t size, const ct_load_options *opts,
                                ct_tensor_file **out);

/** Unmap and free a file; every view taken from it becomes invalid. NULL is a no-op. */
CT_API void ct_tensor_file_close(ct_tensor_file *f);

/** Figures of an opened file. */
typedef struct ct_tensor_file_summary {
    ct_file_format format;
    uint64_t file_bytes;     /**< total size */
    uint64_t header_bytes;   /**< N, the JSON header length including padding (.pt: the
                                  size of the pickle holding the object tree) */
    uint64_t data_offset;    /**< 8 + N: where the data buffer starts in the file (.pt: 0) */
    uint64_t data_bytes;     /**< size of the data buffer (.pt: sum of the storages) */
    uint64_t total_elements; /**< sum over tensors */
    size_t tensors;
    size_t metadata; /**< __metadata__ entries (.pt: non-tensor values) */
    size_t storages; /**< .pt: storages (several tensors may view one); safetensors: tensors */
} ct_tensor_file_summary;

/** Fill *out with the figures of f. CT_EINVAL if either is NULL. */
CT_API ct_status ct_tensor_file_summarize(const ct_tensor_file *f, ct_tensor_file_summary *out);

/** Everything the header says about one tensor. Pointers stay valid until the file is
 *  closed. For .pt files a tensor is a view into a storage (several may share one): then
 *  data_begin / data_end delimit the bytes of the storage the view can reach (relative to
 *  the storage's start; end - begin may exceed nbytes for strided views and be smaller for
 *  broadcast ones), `strides` is set unless the view is row-major contiguous, and data /
 *  file_offset locate element [0, ..., 0]. */
typedef struct ct_tensor_info {
    const char *name;     /**< UTF-8, NUL-terminated (names holding NUL are rejected) */
    ct_st_dtype st_dtype; /**< the header's dtype */
    bool has_dtype;       /**< true when ctorch has a dtype for it (see ct_st_dtype_to_ct) */
    ct_dtype dtype;       /**< valid when has_dtype */
    int ndim;             /**< any rank; views need ndim <= CT_MAX_DIMS */
    const int64_t *shape; /**< ndim entries (NULL when ndim == 0) */
    uint64_t numel;       /**< element count (1 for 0-rank) */
    uint64_t nbytes;      /**< numel x bits / 8 == data_end - data_begin */
    uint64_t data_begin;  /**< data_offsets[0], relative to the data buffer */
    uint64_t data_end;    /**< data_offsets[1] (exclusive) */
    uint64_t file_offset; /**< 8 + N + data_begin: absolute position in the file (.pt: of
                               element [0, ..., 0]) */
    const void *data;     /**< the bytes (read-only; may be unaligned if the writer did
                               not align: ctorch's writer always aligns) */
    const int64_t *strides;  /**< ndim strides in elements, or NULL when the tensor is
                                  row-major contiguous (always NULL for safetensors) */
    size_t storage;          /**< index of its storage (ct_tensor_file_storage); for
                                  safetensors, the tensor's own index */
    uint64_t storage_offset; /**< .pt: elements from the storage's start to element 0 */
} ct_tensor_info;

/** One storage of a .pt file: the bytes tensors view (safetensors: one per tensor). */
typedef struct ct_storage_info {
    const char *key;      /**< its key in the checkpoint ("0", ...); the tensor name for
                               safetensors */
    ct_st_dtype st_dtype; /**< element dtype (complex128 storages: F64, two per element) */
    uint64_t nbytes;
    uint64_t file_offset; /**< absolute position of its bytes in the file */
    const void *data;     /**< read-only; a byte-swapped copy for big-endian files */
} ct_storage_info;

/** Number of storages (see ct_tensor_file_summary.storages). 0 for NULL. */
CT_API size_t ct_tensor_file_storage_count(const ct_tensor_file *f);

/** Storage `index`. CT_EINVAL if index >= count. */
CT_API ct_status ct_tensor_file_storage(const ct_tensor_file *f, size_t index,
                                        ct_storage_info *out);

/** Number of tensors. 0 for NULL. */
CT_API size_t ct_tensor_file_count(const ct_tensor_file *f);

/** Tensor `index` in file order (ascending data offset; tensors of equal offset, all empty
 *  but the last, in header order). CT_EINVAL if index >= count. */
CT_API ct_status ct_tensor_file_info(const ct_tensor_file *f, size_t index, ct_tensor_info *out);

/** Index (in file order) of the tensor called `name` (O(log n)). CT_EINVAL naming the
 *  tensor if there is none. */
CT_API ct_status ct_tensor_file_find(const ct_tensor_file *f, const char *name, size_t *index);

/** Zero-copy view of tensor `index`: out->data points into the read-only mapping (writing
 *  through it faults), out->owns is false, and it dies with the file. Views of .pt tensors
 *  keep their strides (views of one storage share memory). CT_EUNSUPPORTED for
 *  dtypes without a ctorch dtype (read ct_tensor_info.data instead) or ndim > CT_MAX_DIMS. */
CT_API ct_status ct_tensor_file_view(const ct_tensor_file *f, size_t index, ct_tensor *out);

/** New owning contiguous copy of tensor `index` converted to `dt` (same dtype: a copy;
 *  f16/bf16/f8 <-> f32 and every other pair as ct_tensor_cast converts; bulk-vectorised and
 *  threaded for bf16/f16 <-> f32). Free with ct_tensor_free. CT_EUNSUPPORTED as for
 *  ct_tensor_file_view. */
CT_API ct_status ct_tensor_file_read(const ct_tensor_file *f, size_t index, ct_dtype dt,
                                     ct_tensor *out);

/** Convert tensor `index` into caller memory: dst must be contiguous, of the tensor's shape,
 *  any ctorch dtype (converted as ct_tensor_file_read does). Nothing is allocated, so
 *  loading into existing parameters costs no page faults. CT_EINVAL for another shape or a
 *  strided dst; CT_EUNSUPPORTED as for ct_tensor_file_view. */
CT_API ct_status ct_tensor_file_read_into(const ct_tensor_file *f, size_t index, ct_tensor *dst);

/** ct_tensor_file_find + ct_tensor_file_view. */
CT_API ct_status ct_tensor_file_get(const ct_tensor_file *f, const char *name, ct_tensor *out);

/** ct_tensor_file_find + ct_tensor_file_read. */
CT_API ct_status ct_tensor_file_get_as(const ct_tensor_file *f, const char *name, ct_dtype dt,
                                       ct_tensor *out);

/** Number of __metadata__ entries (0 when the header has none). */
CT_API size_t ct_tensor_file_metadata_count(const ct_tensor_file *f);

/** Metadata entry `index` in header order: *key and *value (either may be NULL) point to
 *  NUL-terminated UTF-8 valid until close. CT_EINVAL if index >= count. */
CT_API ct_status ct_tensor_file_metadata(const ct_tensor_file *f, size_t index, const char **key,
                                         const char **value);

/** The metadata value of `key`, or NULL when absent (or f/key is NULL). */
CT_API const char *ct_tensor_file_metadata_get(const ct_tensor_file *f, const char *key);

/* ---- saving --------------------------------------------------------------------------- */

/** Options of ct_save_*. */
typedef struct ct_save_options {
    bool sync;           /**< fsync the file and its folder (default true). false keeps
                              atomicity against process death but not power loss */
    bool anonymous_temp; /**< write into an unnamed O_TMPFILE inode where the file system
                              allows: a killed process leaves nothing behind (default
                              true). false (or unsupported): a named temp file
                              ".<name>.ctorch-tmp.<pid>.<n>", removed on failure; those of
                              dead processes are removed by the next successful save */
} ct_save_options;

/** The defaults listed above. */
CT_API ct_save_options ct_save_options_default(void);

/** One tensor to save: either `tensor` (any ctorch dtype, any strides, ndim <= 8), or, when
 *  tensor is NULL, raw bytes of any safetensors dtype: st_dtype, ndim, shape (ndim entries,
 *  may be NULL when ndim == 0) and `data` holding numel x bits / 8 bytes. */
typedef struct ct_save_entry {
    const char *name;
    const ct_tensor *tensor;
    ct_st_dtype st_dtype;
    int ndim;
    const int64_t *shape;
    const void *data;
} ct_save_entry;

/** Write `count` tensors (tensors[i] called names[i]) and `meta_count` metadata pairs to a
 *  safetensors file at `path`, atomically (see the top of this header).
 *  Layout: 8-byte header length, then the header, compact JSON with "__metadata__" first
 *  (when meta_count > 0) and the tensors in layout order, padded with spaces to a multiple
 *  of 8; then the data in layout order: by descending element size (8, 4, 2, 1 byte, then
 *  sub-byte), ties in the order given. So every tensor starts at a multiple of its element
 *  size and loads as an aligned view. Non-contiguous tensors are written through a bounded
 *  4 MiB staging buffer (never a whole copy). Names and metadata must be valid UTF-8, names
 *  unique and not "__metadata__", metadata keys unique. opts may be NULL (defaults).
 *  Errors: CT_EINVAL (an argument, naming it), CT_EOVERFLOW, CT_ENOMEM, CT_EIO (naming the
 *  system call and errno text); on any error the target is untouched and the temp file is
 *  gone. names/meta arrays may be NULL when their count is 0. */
CT_API ct_status ct_save_safetensors(const char *path, const ct_tensor *tensors,
                                     const char *const *names, size_t count,
                                     const char *const *meta_keys, const char *const *meta_values,
                                     size_t meta_count, const ct_save_options *opts);

/** Same as ct_save_safetensors for entries that may also be raw bytes of dtypes ctorch has
 *  no dtype for (so any valid file can be rewritten bit for bit). */
CT_API ct_status ct_save_safetensors_entries(const char *path, const ct_save_entry *entries,
                                             size_t count, const char *const *meta_keys,
                                             const char *const *meta_values, size_t meta_count,
                                             const ct_save_options *opts);

/** Write `count` tensors to a torch.save zip checkpoint at `path` (atomically, as
 *  ct_save_safetensors): an OrderedDict name -> tensor that torch.load reads, with
 *  weights_only=True too (PyTorch 1.13 and later). Each tensor gets its own storage,
 *  written contiguous (a strided tensor is copied contiguous first, one at a time),
 *  64-byte aligned in the file; zip64 records are written when the archive needs them.
 *  Entries may be ct_tensors of any ctorch dtype but the f8 ones, or raw bytes of the
 *  safetensors dtypes torch has (BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64, C64).
 *  Names must be unique, valid UTF-8. Errors: CT_EINVAL (naming the entry),
 *  CT_EUNSUPPORTED (a dtype PyTorch has no storage for), CT_EOVERFLOW, CT_ENOMEM, CT_EIO;
 *  the target is untouched on error. opts may be NULL (defaults). */
CT_API ct_status ct_save_pt_entries(const char *path, const ct_save_entry *entries, size_t count,
                                    const ct_save_options *opts);

/** ct_save_pt_entries for tensors[i] named names[i]. */
CT_API ct_status ct_save_pt(const char *path, const ct_tensor *tensors, const char *const *names,
                            size_t count, const ct_save_options *opts);

#ifdef __cplusplus
}
#endif
#endif
