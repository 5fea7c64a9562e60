/* Elementwise reduction kernels. Each output element depends only on the two operands
 * given, so the order of a reduction is the order in which the algorithm applies them
 * (fixed), and every rank that applies them in the same order gets the same bits. MAX and
 * MIN are made commutative even for signed zeros (+0 wins MAX, -0 wins MIN) and propagate
 * NaN; integer arithmetic wraps (computed unsigned). */
#include "comm/comm_internal.h"

#include <math.h>

#define F_MAX(a, b)                                                                                \
    (((a) != (a))                                 ? (a)                                            \
     : ((b) != (b))                               ? (b)                                            \
     : ((a) > (b) || ((a) == (b) && !signbit(a))) ? (a)                                            \
                                                  : (b))
#define F_MIN(a, b)                                                                                \
    (((a) != (a))                                ? (a)                                             \
     : ((b) != (b))                              ? (b)                                             \
     : ((a) < (b) || ((a) == (b) && signbit(a))) ? (a)                                             \
                                                 : (b))
#define I_MAX(a, b) ((a) > (b) ? (a) : (b))
#define I_MIN(a, b) ((a) < (b) ? (a) : (b))

#define FLOAT_KERNEL(NAME, T)                                                                      \
    static void NAME(ct_reduce_op op, T *o, const T *a, const T *b, size_t n)                      \
    {                                                                                              \
        switch (op) {                                                                              \
        case CT_REDUCE_SUM:                                                                        \
        case CT_REDUCE_AVG:                                                                        \
            for (size_t i = 0; i < n; i++)                                                         \
                o[i] = a[i] + b[i];                                                                \
            break;                                                                                 \
        case CT_REDUCE_PROD:                                                                       \
            for (size_t i = 0; i < n; i++)                                                         \
                o[i] = a[i] * b[i];                                                                \
            break;                                                                                 \
        case CT_REDUCE_MAX:                                                                        \
            for (size_t i = 0; i < n; i++)                                                         \
                o[i] = F_MAX(a[i], b[i]);                                                          \
            break;                                                                                 \
        case CT_REDUCE_MIN:                                                                        \
            for (size_t i = 0; i < n; i++)                                                         \
                o[i] = F_MIN(a[i], b[i]);                                                          \
            break;                                                                                 \
        }                                                                                          \
    }

/* Integer kernels: T signed or unsigned, U its unsigned twin (wrapping arithmetic). */
#define INT_KERNEL(NAME, T, U)                                                                     \
    static void NAME(ct_reduce_op op, T *o, const T *a, const T *b, size_t n)                      \
    {                                                                                              \
        switch (op) {                                                                              \
        case CT_REDUCE_SUM:                                                                        \
        case CT_REDUCE_AVG:                                                                        \
            for (size_t i = 0; i < n; i++)                                                         \
                o[i] = (T)((U)a[i] + (U)b[i]);                                                     \
            break;                                                                                 \
        case CT_REDUCE_PROD:                                                                       \
            for (size_t i = 0; i < n; i++)                                                         \
                o[i] = (T)((U)a[i] * (U)b[i]);                                                     \
            break;                                                                                 \
        case CT_REDUCE_MAX:                                                                        \
            for (size_t i = 0; i < n; i++)                                                         \
                o[i] = I_MAX(a[i], b[i]);                                                          \
            break;                                                                                 \
        case CT_REDUCE_MIN:                                                                        \
            for (size_t i = 0; i < n; i++)                                                         \
                o[i] = I_MIN(a[i], b[i]);                                                          \
            break;                                                                                 \
        }                                                                                          \
    }

FLOAT_KERNEL(red_f32, float)
FLOAT_KERNEL(red_f64, double)
INT_KERNEL(red_i32, int32_t, uint32_t)
INT_KERNEL(red_i64, int64_t, uint64_t)
INT_KERNEL(red_u8, uint8_t, unsigned)

/* Out may alias a or b exactly (in place); the compiler checks overlap at run time and
 * still vectorises. */
void cm_reduce3(ct_dtype dt, ct_reduce_op op, void *o, const void *a, const void *b, size_t n)
{
    switch (dt) {
    case CT_DTYPE_F32:
        red_f32(op, o, a, b, n);
        break;
    case CT_DTYPE_F64:
        red_f64(op, o, a, b, n);
        break;
    case CT_DTYPE_I32:
        red_i32(op, o, a, b, n);
        break;
    case CT_DTYPE_I64:
        red_i64(op, o, a, b, n);
        break;
    case CT_DTYPE_U8:
        red_u8(op, o, a, b, n);
        break;
    default:
        break;
    }
}

void cm_reduce(ct_dtype dt, ct_reduce_op op, void *acc, const void *in, size_t n)
{
    cm_reduce3(dt, op, acc, acc, in, n);
}

void cm_divide(ct_dtype dt, void *buf, size_t n, int size)
{
    if (dt == CT_DTYPE_F32) {
        float *x = buf, d = (float)size;
        for (size_t i = 0; i < n; i++)
            x[i] /= d;
    } else if (dt == CT_DTYPE_F64) {
        double *x = buf, d = (double)size;
        for (size_t i = 0; i < n; i++)
            x[i] /= d;
    }
}

int64_t cm_find_nan(ct_dtype dt, const void *buf, size_t n)
{
    switch (dt) {
    case CT_DTYPE_F32: {
        const float *x = buf;
        for (size_t i = 0; i < n; i++)
            if (x[i] != x[i]) return (int64_t)i;
        break;
    }
    case CT_DTYPE_F64: {
        const double *x = buf;
        for (size_t i = 0; i < n; i++)
            if (x[i] != x[i]) return (int64_t)i;
        break;
    }
    case CT_DTYPE_F16:
    case CT_DTYPE_BF16: {
        const uint16_t *x = buf;
        uint16_t expm = dt == CT_DTYPE_F16 ? 0x7C00 : 0x7F80;
        uint16_t manm = dt == CT_DTYPE_F16 ? 0x03FF : 0x007F;
        for (size_t i = 0; i < n; i++)
            if ((x[i] & expm) == expm && (x[i] & manm)) return (int64_t)i;
        break;
    }
    default:
        break;
    }
    return -1;
}
