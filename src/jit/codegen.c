/* IR -> C: one self-contained translation unit per mod (no headers but stdint.h and math.h)
 * with the tile callbacks. Each element is straight-line code over const temporaries (one
 * per shared IR node), inside a loop over the tile's contiguous query axis, so the compiler
 * vectorises it; indices are clamped into their arrays (the range check proper runs before,
 * in the mod's check callback). */
#include "jit/jit_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void jit_put(jit_buf *b, const char *fmt, ...)
{
    if (b->st != CT_OK) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->st = ct_error(CT_EINTERNAL, "jit codegen: formatting failed");
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t nc = b->cap * 2 + (size_t)n + 1;
        char *ns;
        if ((b->st = ct_alloc((void **)&ns, nc)) != CT_OK) return;
        memcpy(ns, b->s, b->len + 1);
        ct_free(b->s);
        b->s = ns;
        b->cap = nc;
    }
}

const char *jit_ctype(int t)
{
    return t == JT_FLOAT ? "float" : t == JT_INT ? "int64_t" : "int";
}

const char *jit_elt_type(ct_dtype dt)
{
    switch (dt) {
    case CT_DTYPE_F32: return "float";
    case CT_DTYPE_I32: return "int32_t";
    case CT_DTYPE_I64: return "int64_t";
    default: return "uint8_t";
    }
}

void jit_mark(const jir *ir, int x, bool *need)
{
    if (x < 0 || need[x]) return;
    need[x] = true;
    for (int i = 0; i < ir->n[x].nk; i++)
        jit_mark(ir, ir->n[x].k[i], need);
}

/* Emit the temporaries of the needed nodes, in order (kids come first). */
static void emit_nodes(jit_buf *b, const jir *ir, const bool *need, const char *ind)
{
    for (int x = 0; x < ir->len; x++) {
        if (!need[x]) continue;
        const jnode *n = &ir->n[x];
        int a = n->nk > 0 ? n->k[0] : 0, c = n->nk > 1 ? n->k[1] : 0, d = n->nk > 2 ? n->k[2] : 0;
        int ta = n->nk > 0 ? ir->n[a].t : 0;
        bool fl = n->t == JT_FLOAT;
        if (n->op == J_ARR) {
            jit_put(b, "%sconst int64_t f%d = ", ind, x);
            if (n->nk == 0) jit_put(b, "0");
            for (int dd = 0; dd < n->nk; dd++)
                jit_put(b, "%sctj_ix(v%d, a%d_n%d) * a%d_s%d", dd ? " + " : "", n->k[dd], n->arr, dd,
                    n->arr, dd);
            jit_put(b, ";\n");
            ct_dtype dt = ir->arr[n->arr].dtype;
            if (n->t == JT_BOOL) jit_put(b, "%sconst int v%d = a%d[f%d] != 0;\n", ind, x, n->arr, x);
            else jit_put(b, "%sconst %s v%d = (%s)a%d[f%d];\n", ind, jit_ctype(n->t), x,
                         jit_ctype(n->t), n->arr, x);
            jit_put(b, "%s(void)v%d;\n", ind, x);
            (void)dt;
            continue;
        }
        jit_put(b, "%sconst %s v%d = ", ind, jit_ctype(n->t), x);
        static const char *vars[] = {"score", "b", "h", "q", "kv"};
        switch ((jop)n->op) {
        case J_CONST:
            if (fl && isinf(n->fv)) jit_put(b, n->fv > 0 ? "INFINITY" : "(-INFINITY)");
            else if (fl) jit_put(b, "%af", (double)(float)n->fv);
            else if (n->t == JT_BOOL) jit_put(b, "%d", n->iv != 0);
            else if (n->iv == INT64_MIN) jit_put(b, "(-INT64_MAX - 1)");
            else jit_put(b, "INT64_C(%lld)", (long long)n->iv);
            break;
        case J_VAR: jit_put(b, "%s", vars[n->iv]); break;
        case J_CAST:
            if (fl) jit_put(b, "(float)v%d", a);
            else if (n->t == JT_BOOL) jit_put(b, "v%d != 0", a);
            else if (ta == JT_FLOAT) jit_put(b, "ctj_f2i(v%d)", a);
            else jit_put(b, "(int64_t)v%d", a);
            break;
        case J_NEG: jit_put(b, "-v%d", a); break;
        case J_NOT: jit_put(b, "!v%d", a); break;
        case J_BNOT: jit_put(b, "~v%d", a); break;
        case J_ADD: jit_put(b, "v%d + v%d", a, c); break;
        case J_SUB: jit_put(b, "v%d - v%d", a, c); break;
        case J_MUL: jit_put(b, "v%d * v%d", a, c); break;
        case J_DIV: jit_put(b, fl ? "v%d / v%d" : "ctj_fdiv(v%d, v%d)", a, c); break;
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
        case J_SIGMOID: jit_put(b, "1.0f / (1.0f + ctj_exp(-v%d))", a); break;
        case J_SQRT: jit_put(b, "sqrtf(v%d)", a); break;
        case J_FLOOR: jit_put(b, "floorf(v%d)", a); break;
        case J_ABS: jit_put(b, fl ? "fabsf(v%d)" : "(v%d < 0 ? -v%d : v%d)", a, a, a); break;
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

static void emit_arrays(jit_buf *b, const jir *ir, const bool *need, bool gofs)
{
    bool used[CT_JIT_MAX_ARRAYS] = {false};
    for (int x = 0; x < ir->len; x++)
        if (need[x] && ir->n[x].op == J_ARR) used[ir->n[x].arr] = true;
    for (int k = 0; k < ir->narr; k++) {
        if (!used[k]) continue;
        jit_put(b, "    const %s *a%d = (const %s *)A[%d].data;\n", jit_elt_type(ir->arr[k].dtype), k,
            jit_elt_type(ir->arr[k].dtype), k);
        for (int d = 0; d < ir->arr[k].ndim; d++)
            jit_put(b, "    const int64_t a%d_n%d = A[%d].shape[%d], a%d_s%d = A[%d].stride[%d];\n", k, d,
                k, d, k, d, k, d);
        if (gofs && ir->arr[k].grad)
            jit_put(b, "    const int64_t a%d_g = A[%d].gofs;\n    (void)a%d_g;\n", k, k, k);
    }
}

static const char *preamble =
    "/* Generated by ctorch's compile backend: a mod's tile callbacks. */\n"
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "\n"
    "typedef struct ct_attn_tile {\n"
    "    int64_t b, h, q0, nq, kv0, nkv, q_stride, kv_stride;\n"
    "} ct_attn_tile;\n"
    "typedef struct ctj_arr {\n"
    "    const void *data;\n"
    "    int64_t shape[4], stride[4], numel, gofs;\n"
    "} ctj_arr;\n"
    "\n"
    "static inline int64_t ctj_ix(int64_t i, int64_t n) { return i < 0 ? 0 : i >= n ? n - 1 : i; }\n"
    "static inline int64_t ctj_fdiv(int64_t a, int64_t b)\n"
    "{\n"
    "    if (b == 0) return 0;\n"
    "    if (b == -1) return (int64_t)(0 - (uint64_t)a);\n"
    "    int64_t q = a / b;\n"
    "    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;\n"
    "}\n"
    "static inline int64_t ctj_fmod(int64_t a, int64_t b)\n"
    "{\n"
    "    if (b == 0 || b == -1) return 0;\n"
    "    int64_t r = a % b;\n"
    "    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;\n"
    "}\n"
    "static inline float ctj_fmodf(float a, float b)\n"
    "{\n"
    "    float r = fmodf(a, b);\n"
    "    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;\n"
    "}\n"
    "static inline int64_t ctj_f2i(float x) { return x > -9.2e18f && x < 9.2e18f ? (int64_t)x : 0; }\n"
    "/* exp and tanh in branch-free arithmetic the compiler vectorises (relative error < 2e-7\n"
    " * for exp): Cody-Waite reduction, a degree-7 polynomial, 2^n from two exponent fields. */\n"
    "static inline float ctj_exp(float x)\n"
    "{\n"
    "    float xc = x < -87.33654f ? -87.33654f : x > 88.72283f ? 88.72283f : x;\n"
    "    float n = rintf(xc * 1.44269504088896341f);\n"
    "    float r = xc - n * 0.693359375f;\n"
    "    r = r - n * -2.12194440e-4f;\n"
    "    float p = 1.0f / 5040.0f;\n"
    "    p = p * r + 1.0f / 720.0f;\n"
    "    p = p * r + 1.0f / 120.0f;\n"
    "    p = p * r + 1.0f / 24.0f;\n"
    "    p = p * r + 1.0f / 6.0f;\n"
    "    p = p * r + 0.5f;\n"
    "    p = p * (r * r) + r + 1.0f;\n"
    "    int32_t ni = (int32_t)n, hi = ni / 2;\n"
    "    union { uint32_t u; float f; } f1, f2;\n"
    "    f1.u = (uint32_t)(hi + 127) << 23;\n"
    "    f2.u = (uint32_t)(ni - hi + 127) << 23;\n"
    "    float res = p * f1.f * f2.f;\n"
    "    res = x < -87.33654f ? 0.0f : res;\n"
    "    res = x > 88.72283f ? INFINITY : res;\n"
    "    return x != x ? x : res;\n"
    "}\n"
    "static inline float ctj_tanh(float y)\n"
    "{\n"
    "    float ay = fabsf(y), y2 = y * y;\n"
    "    float p = 62.0f / 2835.0f;\n"
    "    p = p * y2 - 17.0f / 315.0f;\n"
    "    p = p * y2 + 2.0f / 15.0f;\n"
    "    p = p * y2 - 1.0f / 3.0f;\n"
    "    float small = p * y2 * y + y;\n"
    "    float big = 1.0f - 2.0f / (ctj_exp(ay + ay) + 1.0f);\n"
    "    big = y < 0.0f ? -big : big;\n"
    "    return ay < 0.25f ? small : big;\n"
    "}\n"
    "\n";

/* The element loop: for each key column j, each query row i (contiguous when q_stride is 1:
 * the vectorised path), run body with `q`, `kv` and the loaded element. */
static void loop_open(jit_buf *b, const char *ind)
{
    jit_put(b, "%sfor (int64_t j = 0; j < t->nkv; j++) {\n", ind);
    jit_put(b, "%s    const int64_t kv = t->kv0 + j;\n", ind);
    jit_put(b, "%s    (void)kv;\n", ind);
}

ct_status jit_codegen(const jir *ir, char **out)
{
    *out = NULL;
    jit_buf b = {NULL, 0, 4096, CT_OK};
    CT_TRY(ct_alloc((void **)&b.s, b.cap));
    b.s[0] = '\0';
    bool need[JIT_MAX_NODES];
    jit_put(&b, "%s", preamble);
    jit_put(&b, "int ctj_abi(void) { return %d; }\n\n", JIT_ABI);
    static const char *paths[2][2] = {{"i", "1"}, {"i * t->q_stride", "t->q_stride"}};
    if (ir->is_mask) {
        memset(need, 0, sizeof need);
        jit_mark(ir, ir->root, need);
        jit_put(&b, "void ctj_mask_tile(const ctj_arr *A, const ct_attn_tile *t, uint8_t *keep)\n{\n");
        jit_put(&b, "    (void)A;\n");
        emit_arrays(&b, ir, need, false);
        jit_put(&b, "    const int64_t b = t->b, h = t->h;\n    (void)b;\n    (void)h;\n");
        loop_open(&b, "    ");
        jit_put(&b, "        uint8_t *p = keep + j * t->kv_stride;\n");
        for (int v = 0; v < 2; v++) {
            jit_put(&b, v == 0 ? "        if (t->q_stride == 1) {\n" : "        } else {\n");
            jit_put(&b, "            for (int64_t i = 0; i < t->nq; i++) {\n");
            jit_put(&b, "                const int64_t q = t->q0 + i;\n                (void)q;\n");
            emit_nodes(&b, ir, need, "                ");
            jit_put(&b, "                p[%s] = (uint8_t)(v%d != 0);\n", paths[v][0], ir->root);
            jit_put(&b, "            }\n");
        }
        jit_put(&b, "        }\n    }\n}\n");
    } else {
        /* forward */
        memset(need, 0, sizeof need);
        jit_mark(ir, ir->root, need);
        jit_put(&b, "void ctj_score_fwd(const ctj_arr *A, const ct_attn_tile *t, float *s)\n{\n");
        jit_put(&b, "    (void)A;\n");
        emit_arrays(&b, ir, need, false);
        jit_put(&b, "    const int64_t b = t->b, h = t->h;\n    (void)b;\n    (void)h;\n");
        loop_open(&b, "    ");
        jit_put(&b, "        float *p = s + j * t->kv_stride;\n");
        for (int v = 0; v < 2; v++) {
            jit_put(&b, v == 0 ? "        if (t->q_stride == 1) {\n" : "        } else {\n");
            jit_put(&b, "            for (int64_t i = 0; i < t->nq; i++) {\n");
            jit_put(&b, "                const int64_t q = t->q0 + i;\n                (void)q;\n");
            jit_put(&b, "                const float score = p[%s];\n                (void)score;\n",
                paths[v][0]);
            emit_nodes(&b, ir, need, "                ");
            jit_put(&b, "                p[%s] = v%d;\n", paths[v][0], ir->root);
            jit_put(&b, "            }\n");
        }
        jit_put(&b, "        }\n    }\n}\n\n");

        /* backward: the derivative over the score, then parameter gradients */
        jir *w;
        ct_status st = ct_alloc((void **)&w, sizeof *w);
        if (st != CT_OK) {
            ct_free(b.s);
            return st;
        }
        *w = *ir;
        int *memo = NULL;
        st = ct_alloc((void **)&memo, sizeof(int) * JIT_MAX_NODES);
        int dsc = -1;
        int nparam = 0, pnode[JIT_MAX_NODES], pder[JIT_MAX_NODES];
        if (st == CT_OK) {
            dsc = jir_deriv(w, ir->root, -1, memo);
            if (dsc < -1) st = CT_EINVAL;
        }
        for (int x = 0; st == CT_OK && x < ir->len; x++) {
            const jnode *n = &ir->n[x];
            if (n->op != J_ARR || !ir->arr[n->arr].grad) continue;
            int d = jir_deriv(w, ir->root, x, memo);
            if (d < -1) st = CT_EINVAL;
            if (d < 0) continue;
            pnode[nparam] = x;
            pder[nparam++] = d;
        }
        ct_free(memo);
        if (st != CT_OK) {
            ct_free(w);
            ct_free(b.s);
            return st;
        }
        memset(need, 0, sizeof need);
        jit_mark(w, dsc, need);
        jit_put(&b, "void ctj_score_grad(const ctj_arr *A, const ct_attn_tile *t, const float *s, "
                "float *g, float *dparam)\n{\n");
        jit_put(&b, "    (void)A;\n    (void)dparam;\n");
        bool need2[JIT_MAX_NODES];
        memset(need2, 0, sizeof need2);
        for (int k = 0; k < nparam; k++) {
            jit_mark(w, pder[k], need2);
            jit_mark(w, pnode[k], need2);
        }
        bool all[JIT_MAX_NODES];
        for (int x = 0; x < JIT_MAX_NODES; x++)
            all[x] = need[x] || need2[x];
        emit_arrays(&b, w, all, true);
        jit_put(&b, "    const int64_t b = t->b, h = t->h;\n    (void)b;\n    (void)h;\n");
        loop_open(&b, "    ");
        jit_put(&b, "        const float *ps = s + j * t->kv_stride;\n");
        jit_put(&b, "        float *pg = g + j * t->kv_stride;\n");
        if (nparam) {
            /* masked elements have g == 0 and add nothing; order fixed: j, i, then the
             * array reads in IR order */
            jit_put(&b, "        if (dparam) {\n");
            jit_put(&b, "            for (int64_t i = 0; i < t->nq; i++) {\n");
            jit_put(&b, "                const int64_t q = t->q0 + i;\n                (void)q;\n");
            jit_put(&b, "                const float score = ps[i * t->q_stride];\n                (void)score;\n");
            jit_put(&b, "                const float g0 = pg[i * t->q_stride];\n");
            jit_put(&b, "                if (g0 == 0.0f) continue;\n");
            emit_nodes(&b, w, need2, "                ");
            for (int k = 0; k < nparam; k++)
                jit_put(&b, "                dparam[a%d_g + f%d] += g0 * v%d;\n", w->n[pnode[k]].arr,
                    pnode[k], pder[k]);
            jit_put(&b, "            }\n        }\n");
        }
        for (int v = 0; v < 2; v++) {
            jit_put(&b, v == 0 ? "        if (t->q_stride == 1) {\n" : "        } else {\n");
            jit_put(&b, "            for (int64_t i = 0; i < t->nq; i++) {\n");
            jit_put(&b, "                const int64_t q = t->q0 + i;\n                (void)q;\n");
            jit_put(&b, "                const float score = ps[%s];\n                (void)score;\n",
                paths[v][0]);
            jit_put(&b, "                const float g0 = pg[%s];\n                (void)g0;\n", paths[v][0]);
            emit_nodes(&b, w, need, "                ");
            if (dsc < 0) jit_put(&b, "                pg[%s] = 0.0f;\n", paths[v][0]);
            else
                jit_put(&b, "                pg[%s] = g0 == 0.0f ? 0.0f : g0 * v%d;\n", paths[v][0], dsc);
            jit_put(&b, "            }\n");
        }
        jit_put(&b, "        }\n");
        jit_put(&b, "    }\n}\n");
        ct_free(w);
    }
    if (b.st != CT_OK) {
        ct_free(b.s);
        return b.st;
    }
    *out = b.s;
    return CT_OK;
}
