/* Compiled-mods sources written by hand after backend.h's contract (what src/jit's CUDA code
 * generator writes for the expressions beside them), for the tests of the device side:
 * test_backend_ops (the emulated GPU against the CPU's compiled mods of the same expressions)
 * and test_flex_nvrtc (NVRTC compiles them). Indices are clamped into their arrays, as the
 * generated code does. */
#ifndef CT_TEST_FLEX_JIT_SAMPLES_H
#define CT_TEST_FLEX_JIT_SAMPLES_H

/* score + bias[h, clamp(q - kv + 64, 0, 128)], bias f32 [H, 129] with a gradient. */
#define FJ_RELPOS_EXPR "score + bias[h, clamp(q - kv + 64, 0, 128)]"
static const char FJ_RELPOS_SRC[] =
    "#define CTJ_MASK 0\n"
    "#define CTJ_SCORE 1\n"
    "#define CTJ_NPG 1\n"
    "__device__ __forceinline__ int64_t ctj_relpos(const ctj_arr *A, int64_t h, int64_t q, int64_t kv)\n"
    "{\n"
    "    int64_t i = q - kv + 64;\n"
    "    i = i < 0 ? 0 : i > 128 ? 128 : i;\n"
    "    if (i >= A[0].shape[1]) i = A[0].shape[1] - 1;\n"
    "    int64_t hh = h < 0 ? 0 : h >= A[0].shape[0] ? A[0].shape[0] - 1 : h;\n"
    "    return hh * A[0].stride[0] + i * A[0].stride[1];\n"
    "}\n"
    "__device__ __forceinline__ float ctj_score(const ctj_arr *A, float s, int64_t b, int64_t h, int64_t q,\n"
    "                                           int64_t kv)\n"
    "{\n"
    "    return __fadd_rn(s, ((const float *)A[0].data)[ctj_relpos(A, h, q, kv)]);\n"
    "}\n"
    "__device__ __forceinline__ float ctj_score_grad(const ctj_arr *A, float s, int64_t b, int64_t h, int64_t q,\n"
    "                                                int64_t kv, float g, int64_t *pidx, float *pval)\n"
    "{\n"
    "    pidx[0] = A[0].gofs + ctj_relpos(A, h, q, kv);\n"
    "    pval[0] = g;\n"
    "    return g;\n"
    "}\n";

/* (q - kv) % 3 != 0 || q == kv (Python's floor modulo), no arrays. */
#define FJ_MOD3_EXPR "(q - kv) % 3 != 0 || q == kv"
static const char FJ_MOD3_SRC[] =
    "#define CTJ_MASK 1\n"
    "#define CTJ_SCORE 0\n"
    "#define CTJ_NPG 0\n"
    "__device__ __forceinline__ bool ctj_mask(const ctj_arr *A, int64_t b, int64_t h, int64_t q, int64_t kv)\n"
    "{\n"
    "    int64_t r = (q - kv) % 3;\n"
    "    if (r < 0) r += 3;\n"
    "    return r != 0 || q == kv;\n"
    "}\n";

/* mask keep[kv] != 0 || q == kv (keep i32 [T]) and score score * w[h] (w f32 [H], with a
 * gradient): A[0] keep (the mask's), A[1] w (the score's). */
#define FJ_PAIR_MASK_EXPR "keep[kv] != 0 || q == kv"
#define FJ_PAIR_SCORE_EXPR "score * w[h]"
static const char FJ_PAIR_SRC[] =
    "#define CTJ_MASK 1\n"
    "#define CTJ_SCORE 1\n"
    "#define CTJ_NPG 1\n"
    "__device__ __forceinline__ bool ctj_mask(const ctj_arr *A, int64_t b, int64_t h, int64_t q, int64_t kv)\n"
    "{\n"
    "    int64_t i = kv < 0 ? 0 : kv >= A[0].numel ? A[0].numel - 1 : kv;\n"
    "    return ((const int32_t *)A[0].data)[i] != 0 || q == kv;\n"
    "}\n"
    "__device__ __forceinline__ int64_t ctj_wi(const ctj_arr *A, int64_t h)\n"
    "{\n"
    "    return h < 0 ? 0 : h >= A[1].numel ? A[1].numel - 1 : h;\n"
    "}\n"
    "__device__ __forceinline__ float ctj_score(const ctj_arr *A, float s, int64_t b, int64_t h, int64_t q,\n"
    "                                           int64_t kv)\n"
    "{\n"
    "    return __fmul_rn(s, ((const float *)A[1].data)[ctj_wi(A, h)]);\n"
    "}\n"
    "__device__ __forceinline__ float ctj_score_grad(const ctj_arr *A, float s, int64_t b, int64_t h, int64_t q,\n"
    "                                                int64_t kv, float g, int64_t *pidx, float *pval)\n"
    "{\n"
    "    int64_t i = ctj_wi(A, h);\n"
    "    pidx[0] = A[1].gofs + i;\n"
    "    pval[0] = __fmul_rn(g, s);\n"
    "    return __fmul_rn(g, ((const float *)A[1].data)[i]);\n"
    "}\n";

#endif
