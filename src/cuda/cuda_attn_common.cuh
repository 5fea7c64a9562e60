/*
 * Device helpers shared by the attention kernels (cuda_attn.cu: dense causal SDPA; cuda_flex.cu
 * and the compiled-mods modules of cuda_flex_jit.cu: FlexAttention): the layout's sizes, element
 * loads and stores (f32, or bf16 bits widened / rounded to nearest even), warp reductions in a
 * fixed order, and a tile loader into shared memory. Each file includes it inside its own
 * anonymous namespace use.
 *
 * It also compiles inside a compiled-mods module (CTCU_JIT_MODULE defined by the module's
 * prelude: NVRTC, or the emulated device's run-time compile), where no host header exists: the
 * prelude gives the integer types, INFINITY / NAN and the device math.
 */
#ifndef CT_CUDA_ATTN_COMMON_CUH
#define CT_CUDA_ATTN_COMMON_CUH

#ifndef CTCU_JIT_MODULE
#include "cuda/cuda_internal.cuh"

#include <cuda_bf16.h>
#include <stdint.h>
#endif

#define CTCU_FULL_MASK 0xffffffffu

namespace ctcu_attn {

struct Dims {
    int64_t B, T, H, Hk, E, G; /* G = H / Hk */
    float scale;
};

__device__ __forceinline__ float ld_elem(const float *p, int64_t i)
{
    return p[i];
}
__device__ __forceinline__ float ld_elem(const uint16_t *p, int64_t i)
{
    return __uint_as_float((uint32_t)p[i] << 16);
}
__device__ __forceinline__ void st_elem(float *p, int64_t i, float v)
{
    p[i] = v;
}
#ifdef CTCU_JIT_MODULE
/* f32 -> bf16 bits, round to nearest even, a NaN kept quiet with its sign (cuda_bf16.h's
 * __float2bfloat16_rn, written with bit operations: a module includes no header). */
__device__ __forceinline__ uint16_t bf16_bits_rn(float v)
{
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
__device__ __forceinline__ void st_elem(uint16_t *p, int64_t i, float v)
{
    p[i] = bf16_bits_rn(v);
}
#else
__device__ __forceinline__ void st_elem(uint16_t *p, int64_t i, float v)
{
    p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v)); /* round to nearest even */
}
#endif

__device__ __forceinline__ float nan_max(float a, float b)
{
    return (a > b || a != a) ? a : b;
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(CTCU_FULL_MASK, v, s);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int s = 16; s > 0; s >>= 1) v = nan_max(v, __shfl_xor_sync(CTCU_FULL_MASK, v, s));
    return __shfl_sync(CTCU_FULL_MASK, v, 0); /* one lane's value for all (-0 vs +0) */
}

/* Rows t0..t0+n-1 of head hh of x [B, T, HH, E] into sm [BR][S] as f32 times mul; rows n..BR-1
 * zero. */
template <typename T, int BR>
__device__ void load_tile(float *sm, int S, const T *x, int64_t b, int64_t t0, int n, int64_t hh,
                          int64_t HH, const Dims &d, float mul)
{
    int E = (int)d.E;
    for (int idx = threadIdx.x; idx < BR * E; idx += blockDim.x) {
        int r = idx / E, e = idx - r * E;
        float v = 0.0f;
        if (r < n) v = mul * ld_elem(x, ((b * d.T + t0 + r) * HH + hh) * d.E + e);
        sm[r * S + e] = v;
    }
}

__device__ __forceinline__ float dot(const float *a, const float *b, int E)
{
    float s = 0.0f;
    for (int e = 0; e < E; e++) s += a[e] * b[e];
    return s;
}

} /* namespace ctcu_attn */

#endif
