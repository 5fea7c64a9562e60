/* IR -> the mods' device source (src/device/backend.h, "compiled (jit) mods on a device"):
 * C++ for a GPU backend's run-time compiler, no #include, over the backend's prelude. One
 * element per call: ctj_mask (b, h, q, kv) -> keep, ctj_score (s, b, h, q, kv) -> the modded
 * score, ctj_score_grad -> dL/ds and the parameter-gradient terms of the element.
 *
 * The semantics are the CPU kernels' (codegen.c) to the bit: every float operation is the
 * correctly rounded one the CPU source writes, spelled with the device's round-to-nearest
 * intrinsics (__fadd_rn, __fsub_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn) so that no compiler
 * contracts a * b + c into an FMA; exp and tanh are the CPU's own polynomials; integer + - *
 * and negation wrap (unsigned arithmetic: C++ has no -fwrapv), / and % are Python's floor
 * division and modulo; indices are clamped into their arrays. Only logf is the device's own
 * (CUDA's logf is within 1 ulp of glibc's: the one place a GPU may differ from the CPU). */
#include "jit/jit_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Literal text (no format directives). */
static void text(jit_buf *b, const char *s)
{
    jit_put(b, "%s", s);
}

/* A float constant as a literal of exactly that value. */
static void fconst(jit_buf *b, float f)
{
    if (isnan(f)) jit_put(b, "NAN");
    else if (isinf(f)) jit_put(b, f > 0 ? "INFINITY" : "(-INFINITY)");
    else jit_put(b, "%af", (double)f);
}

/* The helpers every source carries (static, names ctj_*). The constants of exp and tanh are
 * the CPU prelude's quotients (1.0f / 5040.0f, ...), evaluated here in f32 and written as
 * exact hex literals. */
static void helpers(jit_buf *b)
{
    text(b, "__device__ __forceinline__ int64_t ctj_ix(int64_t i, int64_t n)\n"
           "{\n    return i < 0 ? 0 : i >= n ? n - 1 : i;\n}\n"
           "__device__ __forceinline__ int64_t ctj_iadd(int64_t a, int64_t b)\n"
           "{\n    return (int64_t)((unsigned long long)a + (unsigned long long)b);\n}\n"
           "__device__ __forceinline__ int64_t ctj_isub(int64_t a, int64_t b)\n"
           "{\n    return (int64_t)((unsigned long long)a - (unsigned long long)b);\n}\n"
           "__device__ __forceinline__ int64_t ctj_imul(int64_t a, int64_t b)\n"
           "{\n    return (int64_t)((unsigned long long)a * (unsigned long long)b);\n}\n"
           "__device__ __forceinline__ int64_t ctj_ineg(int64_t a)\n"
           "{\n    return (int64_t)(0ull - (unsigned long long)a);\n}\n"
           "__device__ __forceinline__ int64_t ctj_fdiv(int64_t a, int64_t b)\n"
           "{\n"
           "    if (b == 0) return 0;\n"
           "    if (b == -1) return ctj_ineg(a);\n"
           "    int64_t q = a / b;\n"
           "    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;\n"
           "}\n"
           "__device__ __forceinline__ int64_t ctj_fmod(int64_t a, int64_t b)\n"
           "{\n"
           "    if (b == 0 || b == -1) return 0;\n"
           "    int64_t r = a % b;\n"
           "    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;\n"
           "}\n"
           "__device__ __forceinline__ float ctj_fmodf(float a, float b)\n"
           "{\n"
           "    float r = fmodf(a, b);\n"
           "    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? __fadd_rn(r, b) : r;\n"
           "}\n"
           "__device__ __forceinline__ int64_t ctj_f2i(float x)\n"
           "{\n    return x > -9.2e18f && x < 9.2e18f ? (int64_t)x : 0;\n}\n");
    /* exp: Cody-Waite reduction, degree-7 polynomial, 2^n from two exponent fields */
    float c7 = 1.0f / 5040.0f, c6 = 1.0f / 720.0f, c5 = 1.0f / 120.0f, c4 = 1.0f / 24.0f,
          c3 = 1.0f / 6.0f;
    text(b, "__device__ __forceinline__ float ctj_exp(float x)\n"
           "{\n"
           "    float xc = x < -87.33654f ? -87.33654f : x > 88.72283f ? 88.72283f : x;\n"
           "    float n = rintf(__fmul_rn(xc, 1.44269504088896341f));\n"
           "    float r = __fsub_rn(xc, __fmul_rn(n, 0.693359375f));\n"
           "    r = __fsub_rn(r, __fmul_rn(n, -2.12194440e-4f));\n");
    jit_put(b, "    float p = %af;\n", (double)c7);
    jit_put(b, "    p = __fadd_rn(__fmul_rn(p, r), %af);\n", (double)c6);
    jit_put(b, "    p = __fadd_rn(__fmul_rn(p, r), %af);\n", (double)c5);
    jit_put(b, "    p = __fadd_rn(__fmul_rn(p, r), %af);\n", (double)c4);
    jit_put(b, "    p = __fadd_rn(__fmul_rn(p, r), %af);\n", (double)c3);
    text(b, "    p = __fadd_rn(__fmul_rn(p, r), 0.5f);\n"
           "    p = __fadd_rn(__fadd_rn(__fmul_rn(p, __fmul_rn(r, r)), r), 1.0f);\n"
           "    int32_t ni = (int32_t)n, hi = ni / 2;\n"
           "    union { unsigned int u; float f; } f1, f2;\n"
           "    f1.u = (unsigned int)(hi + 127) << 23;\n"
           "    f2.u = (unsigned int)(ni - hi + 127) << 23;\n"
           "    float res = __fmul_rn(__fmul_rn(p, f1.f), f2.f);\n"
           "    res = x < -87.33654f ? 0.0f : res;\n"
           "    res = x > 88.72283f ? INFINITY : res;\n"
           "    return x != x ? x : res;\n"
           "}\n");
    float t9 = 62.0f / 2835.0f, t7 = 17.0f / 315.0f, t5 = 2.0f / 15.0f, t3 = 1.0f / 3.0f;
    text(b, "__device__ __forceinline__ float ctj_tanh(float y)\n"
           "{\n"
           "    float ay = fabsf(y), y2 = __fmul_rn(y, y);\n");
    jit_put(b, "    float p = %af;\n", (double)t9);
    jit_put(b, "    p = __fsub_rn(__fmul_rn(p, y2), %af);\n", (double)t7);
    jit_put(b, "    p = __fadd_rn(__fmul_rn(p, y2), %af);\n", (double)t5);
    jit_put(b, "    p = __fsub_rn(__fmul_rn(p, y2), %af);\n", (double)t3);
    text(b, "    float small = __fadd_rn(__fmul_rn(__fmul_rn(p, y2), y), y);\n"
           "    float big = __fsub_rn(1.0f, __fdiv_rn(2.0f, __fadd_rn(ctj_exp(__fadd_rn(ay, ay)), 1.0f)));\n"
           "    big = y < 0.0f ? -big : big;\n"
           "    return ay < 0.25f ? small : big;\n"
           "}\n\n");
}

/* The arrays' views a mod reads: A[base + k]. */
static void emit_arrays(jit_buf *b, const jir *ir, const bool *need, int base)
{
    bool used[CT_JIT_MAX_ARRAYS] = {false};
    for (int x = 0; x < ir->len; x++)
        if (need[x] && ir->n[x].op == J_ARR) used[ir->n[x].arr] = true;
    for (int k = 0; k < ir->narr; k++) {
        if (!used[k]) continue;
        jit_put(b, "    const %s *a%d = (const %s *)A[%d].data;\n", jit_elt_type(ir->arr[k].dtype), k,
            jit_elt_type(ir->arr[k].dtype), base + k);
        for (int d = 0; d < ir->arr[k].ndim; d++)
            jit_put(b, "    const int64_t a%d_n%d = A[%d].shape[%d], a%d_s%d = A[%d].stride[%d];\n", k, d,
                base + k, d, k, d, base + k, d);
    }
}

/* The temporaries of the needed nodes, in order (kids come first). */
static void emit_nodes(jit_buf *b, const jir *ir, const bool *need)
{
    static const char *vars[] = {"score", "b", "h", "q", "kv"};
    for (int x = 0; x < ir->len; x++) {
        if (!need[x]) continue;
        const jnode *n = &ir->n[x];
        int a = n->nk > 0 ? n->k[0] : 0, c = n->nk > 1 ? n->k[1] : 0, d = n->nk > 2 ? n->k[2] : 0;
        int ta = n->nk > 0 ? ir->n[a].t : 0;
        bool fl = n->t == JT_FLOAT;
        if (n->op == J_ARR) {
            jit_put(b, "    const int64_t f%d = ", x);
            if (n->nk == 0) jit_put(b, "0");
            for (int dd = 0; dd < n->nk; dd++)
                jit_put(b, "%sctj_ix(v%d, a%d_n%d) * a%d_s%d", dd ? " + " : "", n->k[dd], n->arr, dd,
                    n->arr, dd);
            jit_put(b, ";\n");
            if (n->t == JT_BOOL) jit_put(b, "    const int v%d = a%d[f%d] != 0;\n", x, n->arr, x);
            else jit_put(b, "    const %s v%d = (%s)a%d[f%d];\n", jit_ctype(n->t), x,
                         jit_ctype(n->t), n->arr, x);
            jit_put(b, "    (void)v%d;\n", x);
            continue;
        }
        jit_put(b, "    const %s v%d = ", jit_ctype(n->t), x);
        switch ((jop)n->op) {
        case J_CONST:
            if (fl) fconst(b, (float)n->fv);
            else if (n->t == JT_BOOL) jit_put(b, "%d", n->iv != 0);
            else if (n->iv == INT64_MIN) jit_put(b, "(int64_t)(-9223372036854775807LL - 1)");
            else jit_put(b, "(int64_t)%lldLL", (long long)n->iv);
            break;
        case J_VAR: jit_put(b, "%s", vars[n->iv]); break;
        case J_CAST:
            if (fl) jit_put(b, "(float)v%d", a);
            else if (n->t == JT_BOOL) jit_put(b, "v%d != 0", a);
            else if (ta == JT_FLOAT) jit_put(b, "ctj_f2i(v%d)", a);
            else jit_put(b, "(int64_t)v%d", a);
            break;
        case J_NEG: jit_put(b, fl ? "-v%d" : "ctj_ineg(v%d)", a); break;
        case J_NOT: jit_put(b, "!v%d", a); break;
        case J_BNOT: jit_put(b, "~v%d", a); break;
        case J_ADD: jit_put(b, fl ? "__fadd_rn(v%d, v%d)" : "ctj_iadd(v%d, v%d)", a, c); break;
        case J_SUB: jit_put(b, fl ? "__fsub_rn(v%d, v%d)" : "ctj_isub(v%d, v%d)", a, c); break;
        case J_MUL: jit_put(b, fl ? "__fmul_rn(v%d, v%d)" : "ctj_imul(v%d, v%d)", a, c); break;
        case J_DIV: jit_put(b, fl ? "__fdiv_rn(v%d, v%d)" : "ctj_fdiv(v%d, v%d)", a, c); break;
        case J_MOD: jit_put(b, fl ? "ctj_fmodf(v%d, v%d)" : "ctj_fmod(v%d, v%d)", a, c); break;
        case J_LT: jit_put(b, "v%d < v%d", a, c); break;
        case J_LE: jit_put(b, "v%d <= v%d", a, c); break;
        case J_GT: jit_put(b, "v%d > v%d", a, c); break;
        case J_GE: jit_put(b, "v%d >= v%d", a, c); break;
        case J_EQ: jit_put(b, "v%d == v%d", a, c); break;
        case J_NE: jit_put(b, "v%d != v%d", a, c); break;
        case J_AND: jit_put(b, "v%d & v%d", a, c); break;
        case J_OR: jit_put(b, "v%d | v%d", a, c); break;
        case J_XOR: jit_put(b, "v%d ^ v%d", a, c); break;
        case J_SEL: jit_put(b, "v%d ? v%d : v%d", a, c, d); break;
        case J_EXP: jit_put(b, "ctj_exp(v%d)", a); break;
        case J_LOG: jit_put(b, "logf(v%d)", a); break;
        case J_TANH: jit_put(b, "ctj_tanh(v%d)", a); break;
        case J_SIGMOID: jit_put(b, "__fdiv_rn(1.0f, __fadd_rn(1.0f, ctj_exp(-v%d)))", a); break;
        case J_SQRT: jit_put(b, "__fsqrt_rn(v%d)", a); break;
        case J_FLOOR: jit_put(b, "floorf(v%d)", a); break;
        case J_ABS: jit_put(b, fl ? "fabsf(v%d)" : "(v%d < 0 ? ctj_ineg(v%d) : v%d)", a, a, a); break;
        case J_MIN: jit_put(b, "v%d < v%d ? v%d : v%d", a, c, a, c); break;
        case J_MAX: jit_put(b, "v%d > v%d ? v%d : v%d", a, c, a, c); break;
        case J_CLAMP:
            jit_put(b, "(v%d < v%d ? v%d : v%d) > v%d ? v%d : (v%d < v%d ? v%d : v%d)", a, c, c, a, d, d,
                a, c, c, a);
            break;
        default: jit_put(b, "0"); break;
        }
        jit_put(b, ";\n");
    }
}

static const char *args = "int64_t b, int64_t h, int64_t q, int64_t kv";
static const char *unused = "    (void)A;\n    (void)b;\n    (void)h;\n    (void)q;\n    (void)kv;\n";

static void emit_mask(jit_buf *b, const jir *ir)
{
    bool need[JIT_MAX_NODES] = {false};
    jit_mark(ir, ir->root, need);
    jit_put(b, "__device__ __forceinline__ bool ctj_mask(const ctj_arr *A, %s)\n{\n%s", args, unused);
    emit_arrays(b, ir, need, 0);
    emit_nodes(b, ir, need);
    jit_put(b, "    return v%d != 0;\n}\n\n", ir->root);
}

/* The score mod: forward, and the backward by the symbolic derivative (jir_deriv): dL/ds =
 * g * d mod / ds, one parameter term per read of an array with a gradient, value g * d mod /
 * d element, at the element's flat (clamped) index past the array's gofs. *npg: the terms. */
static ct_status emit_score(jit_buf *b, const jir *ir, int base, int *npg)
{
    bool need[JIT_MAX_NODES] = {false};
    jit_mark(ir, ir->root, need);
    jit_put(b, "__device__ __forceinline__ float ctj_score(const ctj_arr *A, float score, %s)\n{\n%s"
           "    (void)score;\n", args, unused);
    emit_arrays(b, ir, need, base);
    emit_nodes(b, ir, need);
    jit_put(b, "    return v%d;\n}\n\n", ir->root);

    jir *w;
    int *memo;
    CT_TRY(ct_alloc((void **)&w, sizeof *w));
    ct_status st = ct_alloc((void **)&memo, sizeof(int) * JIT_MAX_NODES);
    if (st != CT_OK) {
        ct_free(w);
        return st;
    }
    *w = *ir;
    int dsc = jir_deriv(w, ir->root, -1, memo);
    int nparam = 0;
    int *pn = NULL, *pd = NULL;
    if (dsc < -1) st = CT_EINVAL;
    if (st == CT_OK) st = ct_alloc((void **)&pn, sizeof(int) * 2 * JIT_MAX_NODES);
    if (st == CT_OK) pd = pn + JIT_MAX_NODES;
    for (int x = 0; st == CT_OK && x < ir->len; x++) {
        const jnode *n = &ir->n[x];
        if (n->op != J_ARR || !ir->arr[n->arr].grad) continue;
        int d = jir_deriv(w, ir->root, x, memo);
        if (d < -1) st = CT_EINVAL;
        if (d < 0) continue;
        pn[nparam] = x;
        pd[nparam++] = d;
    }
    ct_free(memo);
    if (st != CT_OK) {
        ct_free(pn);
        ct_free(w);
        return st;
    }
    bool all[JIT_MAX_NODES] = {false};
    jit_mark(w, dsc, all);
    for (int k = 0; k < nparam; k++) {
        jit_mark(w, pd[k], all);
        jit_mark(w, pn[k], all);
    }
    jit_put(b, "__device__ __forceinline__ float ctj_score_grad(const ctj_arr *A, float score, %s, "
           "float g, int64_t *pidx, float *pval)\n{\n%s"
           "    (void)score;\n    (void)pidx;\n    (void)pval;\n", args, unused);
    emit_arrays(b, w, all, base);
    emit_nodes(b, w, all);
    for (int k = 0; k < nparam; k++) {
        int x = pn[k];
        jit_put(b, "    pidx[%d] = A[%d].gofs + f%d;\n", k, base + w->n[x].arr, x);
        jit_put(b, "    pval[%d] = g == 0.0f ? 0.0f : __fmul_rn(g, v%d);\n", k, pd[k]);
    }
    if (dsc < 0) jit_put(b, "    return 0.0f;\n}\n\n");
    else jit_put(b, "    return g == 0.0f ? 0.0f : __fmul_rn(g, v%d);\n}\n\n", dsc);
    *npg = nparam;
    ct_free(pn);
    ct_free(w);
    return CT_OK;
}

ct_status jit_codegen_device(const jir *mask, const jir *score, char **out)
{
    if (!out) return ct_error(CT_EINVAL, "jit_codegen_device: out must not be NULL");
    *out = NULL;
    if ((!mask && !score) || (mask && !mask->is_mask) || (score && score->is_mask))
        return ct_error(CT_EINVAL, "jit_codegen_device: need a mask IR, a score IR or both");
    jit_buf b = {NULL, 0, 8192, CT_OK};
    CT_TRY(ct_alloc((void **)&b.s, b.cap));
    b.s[0] = '\0';
    int npg = 0;
    /* the score's functions are generated first into their own buffer, to know CTJ_NPG */
    jit_buf sb = {NULL, 0, 8192, CT_OK};
    if (score) {
        ct_status s = ct_alloc((void **)&sb.s, sb.cap);
        if (s == CT_OK) {
            sb.s[0] = '\0';
            s = emit_score(&sb, score, mask ? mask->narr : 0, &npg);
        }
        if (s == CT_OK) s = sb.st;
        if (s != CT_OK) {
            ct_free(sb.s);
            ct_free(b.s);
            return s;
        }
    }
    jit_put(&b, "/* Generated by ctorch's compile backend (abi %d): compiled flex mods for a device.\n"
            " * A's entries: the mask mod's arrays (%d), then the score mod's (%d). */\n",
        JIT_ABI, mask ? mask->narr : 0, score ? score->narr : 0);
    jit_put(&b, "#define CTJ_MASK %d\n#define CTJ_SCORE %d\n#define CTJ_NPG %d\n\n", mask != NULL,
        score != NULL, npg);
    helpers(&b);
    if (mask) emit_mask(&b, mask);
    if (score) jit_put(&b, "%s", sb.s);
    ct_free(sb.s);
    if (b.st != CT_OK) {
        ct_free(b.s);
        return b.st;
    }
    *out = b.s;
    return CT_OK;
}
