/* The emulated CUDA device (tests only): the bf16 type of cuda_bf16.h that the .cu files of src/cuda use.
 * Round to nearest even, NaN kept quiet (as cuda_bf16.h's __float2bfloat16_rn). */
#ifndef CT_CUDA_EMU_BF16_H
#define CT_CUDA_EMU_BF16_H

#include "cuda_runtime.h"

struct __nv_bfloat16 {
    unsigned short x;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    unsigned u = __float_as_uint(f);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.x = (unsigned short)((u >> 16) | 0x0040u);
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    r.x = (unsigned short)(u >> 16);
    return r;
}
inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float((unsigned)h.x << 16); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u)
{
    __nv_bfloat16 r;
    r.x = u;
    return r;
}

#endif
