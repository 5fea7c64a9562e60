/* ctorch's GEMM: the AArch64 Advanced SIMD micro-kernel, 8 x 12 (24 accumulators of 4
 * lanes, three B vectors and two A vectors per k, lane-indexed fused multiply-adds). Contract
 * in gemm_kernels.h: one FMA chain per C element in ascending k, so the bits equal the AVX2,
 * AVX-512 and SVE kernels'. */
#include "ops/gemm_kernels.h"

#include <arm_neon.h>
#include <math.h>

#define MR 8
#define NR 12

/* The k loop alone: the 24 accumulators, 3 B and 2 A vectors fit the 32 vector registers. */
static __attribute__((noinline)) void mul_8x12(int64_t kc, const float *ap, const float *bp, float *t)
{
    float32x4_t c[MR][3];
    for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = c[i][2] = vdupq_n_f32(0.0f);
    for (int64_t k = 0; k < kc; k++) {
        float32x4_t b0 = vld1q_f32(bp), b1 = vld1q_f32(bp + 4), b2 = vld1q_f32(bp + 8);
        float32x4_t a0 = vld1q_f32(ap), a1 = vld1q_f32(ap + 4);
#define ROW(i, a, l)                                  \
    c[i][0] = vfmaq_laneq_f32(c[i][0], b0, a, l);     \
    c[i][1] = vfmaq_laneq_f32(c[i][1], b1, a, l);     \
    c[i][2] = vfmaq_laneq_f32(c[i][2], b2, a, l);
        ROW(0, a0, 0) ROW(1, a0, 1) ROW(2, a0, 2) ROW(3, a0, 3)
        ROW(4, a1, 0) ROW(5, a1, 1) ROW(6, a1, 2) ROW(7, a1, 3)
#undef ROW
        ap += MR;
        bp += NR;
    }
    for (int i = 0; i < MR; i++) {
        vst1q_f32(t + i * NR, c[i][0]);
        vst1q_f32(t + i * NR + 4, c[i][1]);
        vst1q_f32(t + i * NR + 8, c[i][2]);
    }
}

static void kernel_8x12(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc, int m, int n,
                        float alpha, float beta)
{
    _Alignas(16) float t[MR * NR];
    mul_8x12(kc, ap, bp, t);
    int b0 = beta == 0.0f;
    if (m == MR && n == NR) {
        float32x4_t va = vdupq_n_f32(alpha), vb = vdupq_n_f32(beta);
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j += 4) {
                float32x4_t acc = vld1q_f32(t + i * NR + j);
                float *p = c + i * ldc + j;
                /* beta == 0: alpha acc, C unread; else fma(alpha, acc, beta c) */
                vst1q_f32(p, b0 ? vmulq_f32(va, acc) : vfmaq_f32(vmulq_f32(vb, vld1q_f32(p)), va, acc));
            }
        return;
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float *p = c + i * ldc + j;
            *p = b0 ? alpha * t[i * NR + j] : fmaf(alpha, t[i * NR + j], beta * *p);
        }
}

const ct_gemm_kernels ct_gemm_neon = {
    .name = "neon 8x12",
    .mr = MR,
    .nr = NR,
    .mc = 128,
    .nc = 3072,
    .kernel = kernel_8x12,
    .pack_a = ct_gemm_pack_a_generic,
    .pack_b = ct_gemm_pack_b_generic,
};
