#include "core/internal.h"
#include "ctorch/tensor.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_info[CT_DTYPE_COUNT] = {
    [CT_DTYPE_F32] = {"f32", 4},     [CT_DTYPE_F64] = {"f64", 8},
    [CT_DTYPE_F16] = {"f16", 2},     [CT_DTYPE_BF16] = {"bf16", 2},
    [CT_DTYPE_I8] = {"i8", 1},       [CT_DTYPE_U8] = {"u8", 1},
    [CT_DTYPE_I16] = {"i16", 2},     [CT_DTYPE_I32] = {"i32", 4},
    [CT_DTYPE_I64] = {"i64", 8},     [CT_DTYPE_BOOL] = {"bool", 1},
    [CT_DTYPE_F8_E4M3] = {"f8e4m3", 1}, [CT_DTYPE_F8_E5M2] = {"f8e5m2", 1},
};

static bool dtype_valid(ct_dtype dt)
{
    return (unsigned)dt < CT_DTYPE_COUNT;
}

size_t ct_dtype_size(ct_dtype dt)
{
    return dtype_valid(dt) ? dtype_info[dt].size : 0;
}

const char *ct_dtype_name(ct_dtype dt)
{
    return dtype_valid(dt) ? dtype_info[dt].name : "?";
}

ct_status ct_dtype_from_name(const char *name, ct_dtype *out)
{
    if (!name || !out) return ct_error(CT_EINVAL, "ct_dtype_from_name: name and out must not be NULL");
    for (int i = 0; i < CT_DTYPE_COUNT; i++)
        if (strcmp(name, dtype_info[i].name) == 0) {
            *out = (ct_dtype)i;
            return CT_OK;
        }
    return ct_error(CT_EINVAL, "dtype '%s' is unknown (expected one of f32, f64, f16, bf16, i8, u8, "
                    "i16, i32, i64, bool, f8e4m3, f8e5m2)", name);
}

/* ---- scalar conversions ------------------------------------------------------------- */

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t ct_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float ct_bf16_to_f32(uint16_t x)
{
    return bits_f32((uint32_t)x << 16);
}

uint16_t ct_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7FFFFFFFu;
    if (x >= 0x7F800000u) return sign | (x > 0x7F800000u ? 0x7E00u : 0x7C00u);
    if (x >= 0x477FF000u) return sign | 0x7C00u; /* >= 65520 rounds to infinity */
    if (x < 0x38800000u)                          /* below 2^-14: f16 subnormal or zero */
        return sign | (uint16_t)nearbyintf(bits_f32(x) * 16777216.0f);
    x += 0xC8000FFFu + ((x >> 13) & 1u); /* rebias exponent, round to nearest even */
    return sign | (uint16_t)(x >> 13);
}

float ct_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f; /* 2^-24 */
        return sign ? -v : v;
    }
    if (e == 31) return bits_f32(sign | 0x7F800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* Round |a| (finite, > 0) to a float format with `mbits` mantissa bits and exponent bias
 * `bias`; returns the exponent field in *ef and mantissa in *mf (may give ef past the max;
 * the caller saturates). */
static void f8_round(float a, int mbits, int bias, int *ef, int *mf)
{
    float min_normal = ldexpf(1.0f, 1 - bias);
    if (a < min_normal) {
        int q = (int)nearbyintf(ldexpf(a, bias - 1 + mbits));
        *ef = q >> mbits; /* q == 2^mbits becomes the smallest normal */
        *mf = q & ((1 << mbits) - 1);
        return;
    }
    int e;
    float fr = frexpf(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
    int m = (int)nearbyintf((fr * 2.0f - 1.0f) * (float)(1 << mbits));
    e -= 1;
    if (m == (1 << mbits)) {
        m = 0;
        e++;
    }
    *ef = e + bias;
    *mf = m;
}

uint8_t ct_f32_to_f8e4m3(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return sign | 0x7F;
    float a = fabsf(x);
    if (a == 0.0f) return sign;
    if (a >= 448.0f) return sign | 0x7E;
    int ef, mf;
    f8_round(a, 3, 7, &ef, &mf);
    if (ef > 15 || (ef == 15 && mf == 7)) return sign | 0x7E;
    return sign | (uint8_t)(ef << 3 | mf);
}

float ct_f8e4m3_to_f32(uint8_t b)
{
    int e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf(1.0f + m / 8.0f, e - 7);
    return (b & 0x80) ? -v : v;
}

uint8_t ct_f32_to_f8e5m2(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return sign | 0x7F; /* PyTorch's NaN (0x7E is one too, but not its bits) */
    float a = fabsf(x);
    if (isinf(a)) return sign | 0x7C;
    if (a == 0.0f) return sign;
    int ef, mf;
    f8_round(a, 2, 15, &ef, &mf);
    if (ef > 30) return sign | 0x7C;
    return sign | (uint8_t)(ef << 2 | mf);
}

float ct_f8e5m2_to_f32(uint8_t b)
{
    int e = (b >> 2) & 31, m = b & 3;
    float v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexpf((float)m, -16);
    else v = ldexpf(1.0f + m / 4.0f, e - 15);
    return (b & 0x80) ? -v : v;
}

/* ---- element load / store through double -------------------------------------------- */

static double load_elem(const void *p, ct_dtype dt)
{
    switch (dt) {
    case CT_DTYPE_F32: return *(const float *)p;
    case CT_DTYPE_F64: return *(const double *)p;
    case CT_DTYPE_F16: return ct_f16_to_f32(*(const uint16_t *)p);
    case CT_DTYPE_BF16: return ct_bf16_to_f32(*(const uint16_t *)p);
    case CT_DTYPE_I8: return *(const int8_t *)p;
    case CT_DTYPE_U8: return *(const uint8_t *)p;
    case CT_DTYPE_I16: return *(const int16_t *)p;
    case CT_DTYPE_I32: return *(const int32_t *)p;
    case CT_DTYPE_I64: return (double)*(const int64_t *)p;
    case CT_DTYPE_BOOL: return *(const uint8_t *)p != 0;
    case CT_DTYPE_F8_E4M3: return ct_f8e4m3_to_f32(*(const uint8_t *)p);
    case CT_DTYPE_F8_E5M2: return ct_f8e5m2_to_f32(*(const uint8_t *)p);
    default: return 0;
    }
}

/* Float to integer: truncate toward zero, saturate at the type's range, NaN -> 0 (C leaves
 * out-of-range conversions undefined; ctorch defines them). */
static double clamp_int(double v, double lo, double hi)
{
    if (isnan(v)) return 0;
    v = trunc(v);
    return v < lo ? lo : v > hi ? hi : v;
}

static void store_elem(void *p, ct_dtype dt, double v)
{
    switch (dt) {
    case CT_DTYPE_F32: *(float *)p = (float)v; break;
    case CT_DTYPE_F64: *(double *)p = v; break;
    case CT_DTYPE_F16: *(uint16_t *)p = ct_f32_to_f16((float)v); break;
    case CT_DTYPE_BF16: *(uint16_t *)p = ct_f32_to_bf16((float)v); break;
    case CT_DTYPE_I8: *(int8_t *)p = (int8_t)clamp_int(v, INT8_MIN, INT8_MAX); break;
    case CT_DTYPE_U8: *(uint8_t *)p = (uint8_t)clamp_int(v, 0, UINT8_MAX); break;
    case CT_DTYPE_I16: *(int16_t *)p = (int16_t)clamp_int(v, INT16_MIN, INT16_MAX); break;
    case CT_DTYPE_I32: *(int32_t *)p = (int32_t)clamp_int(v, INT32_MIN, INT32_MAX); break;
    case CT_DTYPE_I64:
        *(int64_t *)p = (int64_t)clamp_int(v, -9223372036854775808.0, 9223372036854774784.0);
        break;
    case CT_DTYPE_BOOL: *(uint8_t *)p = v != 0; break;
    case CT_DTYPE_F8_E4M3: *(uint8_t *)p = ct_f32_to_f8e4m3((float)v); break;
    case CT_DTYPE_F8_E5M2: *(uint8_t *)p = ct_f32_to_f8e5m2((float)v); break;
    default: break;
    }
}

/* ---- construction ------------------------------------------------------------------- */

static ct_status check_shape(const char *fn, int ndim, const int64_t *shape, size_t esize,
                             size_t *bytes)
{
    if (ndim < 0 || ndim > CT_MAX_DIMS)
        return ct_error(CT_EINVAL, "%s: ndim must be in [0, %d], got %d", fn, CT_MAX_DIMS, ndim);
    if (ndim > 0 && !shape) return ct_error(CT_EINVAL, "%s: shape must not be NULL when ndim > 0", fn);
    size_t n = esize;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return ct_error(CT_EINVAL, "%s: shape[%d] must be >= 0, got %lld", fn, i, (long long)shape[i]);
        if (!ct_mul_size(n, (size_t)shape[i], &n))
            return ct_error(CT_EOVERFLOW, "%s: shape overflows the addressable size", fn);
    }
    *bytes = n;
    return CT_OK;
}

static void set_contiguous(ct_tensor *t, int ndim, const int64_t *shape)
{
    t->ndim = ndim;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t->shape[i] = shape[i];
        t->strides[i] = s;
        s *= shape[i] ? shape[i] : 1;
    }
}

static ct_status tensor_alloc(ct_tensor *out, ct_dtype dt, int ndim, const int64_t *shape, int zero)
{
    if (!out) return ct_error(CT_EINVAL, "ct_tensor_empty: out must not be NULL");
    memset(out, 0, sizeof *out);
    if (!dtype_valid(dt)) return ct_error(CT_EINVAL, "ct_tensor_empty: invalid dtype %d", (int)dt);
    size_t bytes;
    CT_TRY(check_shape("ct_tensor_empty", ndim, shape, ct_dtype_size(dt), &bytes));
    void *p;
    CT_TRY(zero ? ct_calloc(&p, bytes) : ct_alloc(&p, bytes));
    out->data = p;
    out->dtype = dt;
    out->owns = true;
    set_contiguous(out, ndim, shape);
    return CT_OK;
}

ct_status ct_tensor_empty(ct_tensor *out, ct_dtype dt, int ndim, const int64_t *shape)
{
    return tensor_alloc(out, dt, ndim, shape, 0);
}

ct_status ct_tensor_zeros(ct_tensor *out, ct_dtype dt, int ndim, const int64_t *shape)
{
    return tensor_alloc(out, dt, ndim, shape, 1);
}

ct_status ct_tensor_wrap(ct_tensor *out, void *data, ct_dtype dt, int ndim, const int64_t *shape,
                         const int64_t *strides)
{
    if (!out) return ct_error(CT_EINVAL, "ct_tensor_wrap: out must not be NULL");
    memset(out, 0, sizeof *out);
    if (!dtype_valid(dt)) return ct_error(CT_EINVAL, "ct_tensor_wrap: invalid dtype %d", (int)dt);
    size_t bytes;
    CT_TRY(check_shape("ct_tensor_wrap", ndim, shape, ct_dtype_size(dt), &bytes));
    if (!data && bytes) return ct_error(CT_EINVAL, "ct_tensor_wrap: data must not be NULL for a non-empty tensor");
    out->data = data;
    out->dtype = dt;
    set_contiguous(out, ndim, shape);
    if (strides)
        for (int i = 0; i < ndim; i++) out->strides[i] = strides[i];
    return CT_OK;
}

ct_status ct_tensor_wrap_buffer(ct_tensor *out, struct ct_buffer *buffer, size_t offset,
                                ct_dtype dt, int ndim, const int64_t *shape, const int64_t *strides)
{
    const char *fn = "ct_tensor_wrap_buffer";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    memset(out, 0, sizeof *out);
    if (!buffer) return ct_error(CT_EINVAL, "%s: buffer must not be NULL", fn);
    if (!dtype_valid(dt)) return ct_error(CT_EINVAL, "%s: invalid dtype %d", fn, (int)dt);
    size_t es = ct_dtype_size(dt), bytes, cap = buffer->bytes;
    CT_TRY(check_shape(fn, ndim, shape, es, &bytes));
    if (offset % es)
        return ct_error(CT_EINVAL, "%s: offset %zu is not a multiple of the %s element size %zu", fn,
                        offset, ct_dtype_name(dt), es);
    /* the farthest element the view reaches: sum of (shape - 1) * stride */
    uint64_t last = 0;
    bool empty = false;
    for (int i = 0; i < ndim; i++) {
        int64_t st = strides ? strides[i] : 0;
        if (shape[i] == 0) empty = true;
        if (strides && st < 0)
            return ct_error(CT_EINVAL, "%s: stride %d is negative (%lld)", fn, i, (long long)st);
    }
    if (strides && !empty) {
        for (int i = 0; i < ndim; i++) {
            uint64_t ext = (uint64_t)(shape[i] - 1), st = (uint64_t)strides[i];
            if (st && ext > (UINT64_MAX - last) / st)
                return ct_error(CT_EOVERFLOW, "%s: the view's extent overflows", fn);
            last += ext * st;
        }
        if (last > (UINT64_MAX / es) - 1)
            return ct_error(CT_EOVERFLOW, "%s: the view's extent overflows", fn);
        bytes = (size_t)((last + 1) * es);
    } else if (empty) {
        bytes = 0;
    }
    if (offset > cap || bytes > cap - offset)
        return ct_error(CT_EINVAL, "%s: bytes [%zu, %zu + %zu) leave the buffer of %zu bytes", fn,
                        offset, offset, bytes, cap);
    out->data = (char *)buffer->data + offset;
    out->dtype = dt;
    out->buffer = buffer;
    set_contiguous(out, ndim, shape);
    if (strides)
        for (int i = 0; i < ndim; i++) out->strides[i] = strides[i];
    return CT_OK;
}

bool ct_tensor_on_host(const ct_tensor *t)
{
    return t && (!t->buffer || t->buffer->host);
}

/* Host-side element access refuses tensors that live on a GPU. */
static ct_status host_only(const char *fn, const ct_tensor *t)
{
    if (ct_tensor_on_host(t)) return CT_OK;
    return ct_error(CT_EINVAL, "%s: the tensor lives on %s: copy it to the host first "
                               "(ct_buffer_read)",
                    fn, t->buffer->where);
}

void ct_tensor_free(ct_tensor *t)
{
    if (!t) return;
    if (t->owns) ct_free(t->data);
    memset(t, 0, sizeof *t);
}

int64_t ct_tensor_numel(const ct_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

bool ct_tensor_is_contiguous(const ct_tensor *t)
{
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

/* ---- views -------------------------------------------------------------------------- */

static ct_status norm_dim(const char *fn, const ct_tensor *t, int *dim)
{
    int d = *dim < 0 ? *dim + t->ndim : *dim;
    if (d < 0 || d >= t->ndim)
        return ct_error(CT_EINVAL, "%s: dim %d is out of range for a %d-dim tensor", fn, *dim, t->ndim);
    *dim = d;
    return CT_OK;
}

static void view_of(const ct_tensor *t, ct_tensor *out)
{
    if (out != t) *out = *t;
    out->owns = false;
}

ct_status ct_tensor_slice(const ct_tensor *t, int dim, int64_t start, int64_t end, int64_t step,
                          ct_tensor *out)
{
    if (!t || !out) return ct_error(CT_EINVAL, "ct_tensor_slice: t and out must not be NULL");
    CT_TRY(norm_dim("ct_tensor_slice", t, &dim));
    if (step < 1) return ct_error(CT_EINVAL, "ct_tensor_slice: step must be >= 1, got %lld", (long long)step);
    int64_t n = t->shape[dim];
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < start ? start : end > n ? n : end;
    ct_tensor v;
    view_of(t, &v);
    v.data = (char *)t->data + (size_t)(start * t->strides[dim]) * ct_dtype_size(t->dtype);
    v.shape[dim] = (end - start + step - 1) / step;
    v.strides[dim] = t->strides[dim] * step;
    *out = v;
    return CT_OK;
}

ct_status ct_tensor_transpose(const ct_tensor *t, int d0, int d1, ct_tensor *out)
{
    if (!t || !out) return ct_error(CT_EINVAL, "ct_tensor_transpose: t and out must not be NULL");
    CT_TRY(norm_dim("ct_tensor_transpose", t, &d0));
    CT_TRY(norm_dim("ct_tensor_transpose", t, &d1));
    ct_tensor v;
    view_of(t, &v);
    v.shape[d0] = t->shape[d1];
    v.shape[d1] = t->shape[d0];
    v.strides[d0] = t->strides[d1];
    v.strides[d1] = t->strides[d0];
    *out = v;
    return CT_OK;
}

ct_status ct_tensor_permute(const ct_tensor *t, const int *perm, ct_tensor *out)
{
    if (!t || !out || (!perm && t->ndim))
        return ct_error(CT_EINVAL, "ct_tensor_permute: t, perm and out must not be NULL");
    bool seen[CT_MAX_DIMS] = {0};
    ct_tensor v;
    view_of(t, &v);
    for (int i = 0; i < t->ndim; i++) {
        int p = perm[i];
        if (p < 0 || p >= t->ndim || seen[p])
            return ct_error(CT_EINVAL, "ct_tensor_permute: perm is not a permutation of 0..%d (entry %d is %d)",
                            t->ndim - 1, i, p);
        seen[p] = true;
        v.shape[i] = t->shape[p];
        v.strides[i] = t->strides[p];
    }
    *out = v;
    return CT_OK;
}

ct_status ct_tensor_reshape(const ct_tensor *t, int ndim, const int64_t *shape, ct_tensor *out)
{
    if (!t || !out) return ct_error(CT_EINVAL, "ct_tensor_reshape: t and out must not be NULL");
    if (ndim < 0 || ndim > CT_MAX_DIMS || (ndim && !shape))
        return ct_error(CT_EINVAL, "ct_tensor_reshape: ndim must be in [0, %d] with a shape", CT_MAX_DIMS);
    if (!ct_tensor_is_contiguous(t))
        return ct_error(CT_EINVAL, "ct_tensor_reshape: input is not contiguous; call ct_tensor_contiguous first");
    int64_t shp[CT_MAX_DIMS], known = 1, numel = ct_tensor_numel(t);
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        shp[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) return ct_error(CT_EINVAL, "ct_tensor_reshape: only one dim may be -1");
            infer = i;
        } else if (shape[i] < 0) {
            return ct_error(CT_EINVAL, "ct_tensor_reshape: shape[%d] = %lld is negative", i, (long long)shape[i]);
        } else if (__builtin_mul_overflow(known, shape[i], &known)) {
            return ct_error(CT_EOVERFLOW, "ct_tensor_reshape: shape overflows");
        }
    }
    if (infer >= 0) {
        if (known == 0 || numel % known)
            return ct_error(CT_EINVAL, "ct_tensor_reshape: cannot infer dim %d: %lld elements into %lld",
                            infer, (long long)numel, (long long)known);
        shp[infer] = numel / known;
        known = numel;
    }
    if (known != numel)
        return ct_error(CT_EINVAL, "ct_tensor_reshape: new shape holds %lld elements, input has %lld",
                        (long long)known, (long long)numel);
    ct_tensor v;
    view_of(t, &v);
    set_contiguous(&v, ndim, shp);
    *out = v;
    return CT_OK;
}

ct_status ct_tensor_expand(const ct_tensor *t, int ndim, const int64_t *shape, ct_tensor *out)
{
    if (!t || !out || (ndim && !shape))
        return ct_error(CT_EINVAL, "ct_tensor_expand: t, shape and out must not be NULL");
    if (ndim < t->ndim || ndim > CT_MAX_DIMS)
        return ct_error(CT_EINVAL, "ct_tensor_expand: ndim %d must be in [%d, %d]", ndim, t->ndim, CT_MAX_DIMS);
    ct_tensor v;
    view_of(t, &v);
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - lead;
        int64_t cur = j >= 0 ? t->shape[j] : 1, st = j >= 0 ? t->strides[j] : 0;
        int64_t want = shape[i] == -1 ? cur : shape[i];
        if (want < 0 || (j < 0 && shape[i] == -1))
            return ct_error(CT_EINVAL, "ct_tensor_expand: shape[%d] = %lld is invalid", i, (long long)shape[i]);
        if (cur != want) {
            if (cur != 1)
                return ct_error(CT_EINVAL, "ct_tensor_expand: dim %d has size %lld, only size-1 dims expand (to %lld)",
                                i, (long long)cur, (long long)want);
            st = 0;
        }
        v.shape[i] = want;
        v.strides[i] = st;
    }
    v.ndim = ndim;
    *out = v;
    return CT_OK;
}

/* ---- copies ------------------------------------------------------------------------- */

ct_status ct_tensor_copy(ct_tensor *dst, const ct_tensor *src)
{
    if (!dst || !src) return ct_error(CT_EINVAL, "ct_tensor_copy: dst and src must not be NULL");
    CT_TRY(host_only("ct_tensor_copy (dst)", dst));
    CT_TRY(host_only("ct_tensor_copy (src)", src));
    if (!dtype_valid(dst->dtype) || !dtype_valid(src->dtype))
        return ct_error(CT_EINVAL, "ct_tensor_copy: invalid dtype");
    if (dst->ndim != src->ndim)
        return ct_error(CT_EINVAL, "ct_tensor_copy: dst has %d dims, src has %d", dst->ndim, src->ndim);
    for (int i = 0; i < dst->ndim; i++) {
        if (dst->shape[i] != src->shape[i])
            return ct_error(CT_EINVAL, "ct_tensor_copy: dim %d differs (dst %lld, src %lld)", i,
                            (long long)dst->shape[i], (long long)src->shape[i]);
        if (dst->strides[i] == 0 && dst->shape[i] > 1)
            return ct_error(CT_EINVAL, "ct_tensor_copy: dst dim %d is a broadcast (stride 0)", i);
    }
    int64_t n = ct_tensor_numel(src);
    if (n == 0) return CT_OK;
    size_t ds = ct_dtype_size(dst->dtype), ss = ct_dtype_size(src->dtype);
    if (dst->dtype == src->dtype && ct_tensor_is_contiguous(dst) && ct_tensor_is_contiguous(src)) {
        memmove(dst->data, src->data, (size_t)n * ds);
        return CT_OK;
    }
    int64_t idx[CT_MAX_DIMS] = {0};
    int nd = src->ndim;
    for (int64_t k = 0; k < n; k++) {
        int64_t so = 0, dof = 0;
        for (int i = 0; i < nd; i++) {
            so += idx[i] * src->strides[i];
            dof += idx[i] * dst->strides[i];
        }
        const char *sp = (const char *)src->data + so * (int64_t)ss;
        char *dp = (char *)dst->data + dof * (int64_t)ds;
        if (dst->dtype == src->dtype) memcpy(dp, sp, ds);
        else store_elem(dp, dst->dtype, load_elem(sp, src->dtype));
        for (int i = nd - 1; i >= 0; i--) {
            if (++idx[i] < src->shape[i]) break;
            idx[i] = 0;
        }
    }
    return CT_OK;
}

ct_status ct_tensor_contiguous(const ct_tensor *t, ct_tensor *out)
{
    if (!t) return ct_error(CT_EINVAL, "ct_tensor_contiguous: t must not be NULL");
    return ct_tensor_cast(t, t->dtype, out);
}

ct_status ct_tensor_cast(const ct_tensor *t, ct_dtype dt, ct_tensor *out)
{
    if (!t || !out) return ct_error(CT_EINVAL, "ct_tensor_cast: t and out must not be NULL");
    CT_TRY(host_only("ct_tensor_cast", t));
    ct_tensor src = *t; /* out may alias t */
    ct_tensor r;
    CT_TRY(ct_tensor_empty(&r, dt, src.ndim, src.shape));
    ct_status s = ct_tensor_copy(&r, &src);
    if (s != CT_OK) {
        ct_tensor_free(&r);
        return s;
    }
    *out = r;
    return CT_OK;
}

ct_status ct_tensor_fill(ct_tensor *t, double v)
{
    if (!t || !dtype_valid(t->dtype)) return ct_error(CT_EINVAL, "ct_tensor_fill: invalid tensor");
    CT_TRY(host_only("ct_tensor_fill", t));
    unsigned char one[8];
    store_elem(one, t->dtype, v);
    ct_tensor s;
    CT_TRY(ct_tensor_wrap(&s, one, t->dtype, 0, NULL, NULL));
    ct_tensor e;
    CT_TRY(ct_tensor_expand(&s, t->ndim, t->shape, &e));
    return ct_tensor_copy(t, &e);
}

/* ---- bulk conversions ------------------------------------------------------------------ */


/* ct_convert_*: convert.c (kernel tables in convert_kernels.h). */
