/*
 * ctorch/tensor.h - dtypes, strided tensors, views and casts.
 *
 * A ct_tensor is a small value: a data pointer, a dtype, up to CT_MAX_DIMS sizes and
 * strides (in elements), and whether it owns its memory. Views (slice, transpose, permute,
 * reshape, expand) never copy and never own: the tensor they were taken from must outlive
 * them. ct_tensor_empty / ct_tensor_contiguous / ct_tensor_cast allocate through the
 * accounting allocator and the result must be released with ct_tensor_free.
 */
#ifndef CTORCH_TENSOR_H
#define CTORCH_TENSOR_H

#include "ctorch/core.h"
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CT_MAX_DIMS 8

/** Element types. f8 types are storage only (cast to and from f32). */
typedef enum ct_dtype {
    CT_DTYPE_F32 = 0,
    CT_DTYPE_F64 = 1,
    CT_DTYPE_F16 = 2,
    CT_DTYPE_BF16 = 3,
    CT_DTYPE_I8 = 4,
    CT_DTYPE_U8 = 5,
    CT_DTYPE_I16 = 6,
    CT_DTYPE_I32 = 7,
    CT_DTYPE_I64 = 8,
    CT_DTYPE_BOOL = 9,
    CT_DTYPE_F8_E4M3 = 10, /**< OCP e4m3fn: no infinities, max 448 */
    CT_DTYPE_F8_E5M2 = 11,
    CT_DTYPE_COUNT = 12
} ct_dtype;

/** Bytes per element (0 for an invalid dtype). */
CT_API size_t ct_dtype_size(ct_dtype dt);
/** Lower-case name ("f32", "bf16", ...); "?" for an invalid dtype. */
CT_API const char *ct_dtype_name(ct_dtype dt);
/** Parse a name as printed by ct_dtype_name; CT_EINVAL for an unknown name. */
CT_API ct_status ct_dtype_from_name(const char *name, ct_dtype *out);

typedef struct ct_tensor {
    void *data;                   /**< address of element [0, ..., 0] */
    ct_dtype dtype;
    int ndim;                     /**< 0 (a scalar) .. CT_MAX_DIMS */
    int64_t shape[CT_MAX_DIMS];
    int64_t strides[CT_MAX_DIMS]; /**< in elements; 0 for broadcast (expanded) dims */
    bool owns;                    /**< data was allocated by ctorch and is freed with the tensor */
    struct ct_buffer *buffer;     /**< the device buffer data lies in (ctorch/device.h); NULL:
                                       host memory. Tensors on a GPU are views of a buffer
                                       (ct_tensor_wrap_buffer): host-side calls refuse them. */
} ct_tensor;

/** Allocate a contiguous tensor (uninitialised). shape may be NULL when ndim == 0. */
CT_API ct_status ct_tensor_empty(ct_tensor *out, ct_dtype dt, int ndim, const int64_t *shape);
/** Allocate a contiguous zero-filled tensor. */
CT_API ct_status ct_tensor_zeros(ct_tensor *out, ct_dtype dt, int ndim, const int64_t *shape);
/** Wrap caller memory without copying. strides == NULL means contiguous (row-major). */
CT_API ct_status ct_tensor_wrap(ct_tensor *out, void *data, ct_dtype dt, int ndim,
                                const int64_t *shape, const int64_t *strides);
/** View of bytes [offset, ...) of a device buffer (ctorch/device.h) as a tensor; strides NULL
 *  means contiguous. CT_EINVAL when the elements the view reaches leave the buffer, offset is
 *  not a multiple of the element size, or a stride is negative. Never owns. */
CT_API ct_status ct_tensor_wrap_buffer(ct_tensor *out, struct ct_buffer *buffer, size_t offset,
                                       ct_dtype dt, int ndim, const int64_t *shape,
                                       const int64_t *strides);
/** True when t's memory is host memory (no buffer, or a CPU buffer). */
CT_API bool ct_tensor_on_host(const ct_tensor *t);
/** Release an owning tensor's memory and reset it; views are just reset. NULL is a no-op. */
CT_API void ct_tensor_free(ct_tensor *t);

/** Number of elements (product of the shape; 1 for a scalar). */
CT_API int64_t ct_tensor_numel(const ct_tensor *t);
/** True when the strides are those of a row-major tensor of this shape. */
CT_API bool ct_tensor_is_contiguous(const ct_tensor *t);

/** View of elements start, start+step, ... < end along `dim` (negative dim counts from the
 *  end; start/end are clamped like Python slices; step >= 1). */
CT_API ct_status ct_tensor_slice(const ct_tensor *t, int dim, int64_t start, int64_t end,
                                 int64_t step, ct_tensor *out);
/** View with dims d0 and d1 swapped. */
CT_API ct_status ct_tensor_transpose(const ct_tensor *t, int d0, int d1, ct_tensor *out);
/** View with dims reordered: out dim i is input dim perm[i]; perm must be a permutation. */
CT_API ct_status ct_tensor_permute(const ct_tensor *t, const int *perm, ct_tensor *out);
/** View with a new shape of the same element count; one entry may be -1 (inferred). Needs
 *  a contiguous input (call ct_tensor_contiguous first otherwise): CT_EINVAL if not. */
CT_API ct_status ct_tensor_reshape(const ct_tensor *t, int ndim, const int64_t *shape,
                                   ct_tensor *out);
/** Broadcast view: size-1 dims (or new leading dims) grow to `shape` with stride 0;
 *  -1 keeps a size. */
CT_API ct_status ct_tensor_expand(const ct_tensor *t, int ndim, const int64_t *shape,
                                  ct_tensor *out);
/** New owning contiguous copy of t (same dtype). */
CT_API ct_status ct_tensor_contiguous(const ct_tensor *t, ct_tensor *out);
/** New owning contiguous copy of t converted to dtype dt (round to nearest even for
 *  narrowing float casts; float to int truncates toward zero; to bool: x != 0). */
CT_API ct_status ct_tensor_cast(const ct_tensor *t, ct_dtype dt, ct_tensor *out);
/** Copy src into dst elementwise (same shape; dtypes may differ: converted as
 *  ct_tensor_cast does). dst may be strided but must not have stride-0 dims. */
CT_API ct_status ct_tensor_copy(ct_tensor *dst, const ct_tensor *src);
/** Fill every element with v (converted to the dtype). */
CT_API ct_status ct_tensor_fill(ct_tensor *t, double v);

/* ---- scalar conversions (round to nearest even; NaN stays NaN) ---------------------- */
CT_API uint16_t ct_f32_to_bf16(float x);
CT_API float ct_bf16_to_f32(uint16_t x);
CT_API uint16_t ct_f32_to_f16(float x);
CT_API float ct_f16_to_f32(uint16_t x);
/** e4m3fn: saturates to +-448 (the format has no infinity); NaN -> 0x7F. */
CT_API uint8_t ct_f32_to_f8e4m3(float x);
CT_API float ct_f8e4m3_to_f32(uint8_t x);
/** e5m2: overflow rounds to infinity as IEEE does. */
CT_API uint8_t ct_f32_to_f8e5m2(float x);
CT_API float ct_f8e5m2_to_f32(uint8_t x);

/** Bulk conversions of n contiguous values (vectorised where the CPU allows). */
CT_API void ct_convert_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
CT_API void ct_convert_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
CT_API void ct_convert_f16_to_f32(float *dst, const uint16_t *src, size_t n);
CT_API void ct_convert_f32_to_f16(uint16_t *dst, const float *src, size_t n);

#ifdef __cplusplus
}
#endif
#endif
