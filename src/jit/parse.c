/* The expression language's parser (grammar in include/ctorch/jit.h): recursive descent into
 * the IR, with C's precedence, type promotion, and errors that name the token and its byte
 * position. Bounded: expression length, nesting depth and IR size. */
#include "jit/jit_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum tk {
    TK_END, TK_INT, TK_FLOAT, TK_NAME, TK_OP,
} tk;

typedef struct parser {
    const char *fn, *src;
    size_t pos;              /* start of the current token */
    size_t end;              /* end of the current token */
    tk kind;
    char op[3];              /* operator text */
    int64_t iv;
    double fv;
    char name[64];
    int depth;
    jir *ir;
    const ct_jit_binding *bind;
    int nbind;
    bool failed;
} parser;

static ct_status perr(parser *p, const char *what)
{
    if (p->failed) return CT_EINVAL;
    p->failed = true;
    int len = (int)(p->end > p->pos ? p->end - p->pos : 0);
    if (len > 24) len = 24;
    if (p->kind == TK_END)
        return ct_error(CT_EINVAL, "%s: %s at the end of the expression (position %zu) in \"%.200s\"",
                        p->fn, what, p->pos, p->src);
    return ct_error(CT_EINVAL, "%s: %s at '%.*s' (position %zu) in \"%.200s\"", p->fn, what, len,
                    p->src + p->pos, p->pos, p->src);
}

static ct_status next(parser *p)
{
    const char *s = p->src;
    size_t i = p->end;
    while (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')
        i++;
    p->pos = i;
    if (!s[i]) {
        p->kind = TK_END;
        p->end = i;
        return CT_OK;
    }
    unsigned char c = (unsigned char)s[i];
    if (isdigit(c) || (c == '.' && isdigit((unsigned char)s[i + 1]))) {
        size_t j = i;
        bool flt = false;
        while (isdigit((unsigned char)s[j]))
            j++;
        if (s[j] == '.') {
            flt = true;
            j++;
            while (isdigit((unsigned char)s[j]))
                j++;
        }
        if (s[j] == 'e' || s[j] == 'E') {
            size_t k = j + 1;
            if (s[k] == '+' || s[k] == '-') k++;
            if (isdigit((unsigned char)s[k])) {
                flt = true;
                j = k;
                while (isdigit((unsigned char)s[j]))
                    j++;
            }
        }
        p->end = j;
        if (isalpha((unsigned char)s[j]) || s[j] == '_') {
            p->end = j + 1;
            p->kind = TK_OP;
            return perr(p, "malformed number");
        }
        char buf[80];
        if (j - i >= sizeof buf) {
            p->kind = TK_OP;
            return perr(p, "number too long");
        }
        memcpy(buf, s + i, j - i);
        buf[j - i] = '\0';
        errno = 0;
        if (flt) {
            p->kind = TK_FLOAT;
            p->fv = strtod(buf, NULL);
            if (!isfinite(p->fv)) return perr(p, "float literal out of range");
        } else {
            p->kind = TK_INT;
            unsigned long long v = strtoull(buf, NULL, 10);
            if (errno == ERANGE || v > (unsigned long long)INT64_MAX)
                return perr(p, "integer literal does not fit int64");
            p->iv = (int64_t)v;
        }
        return CT_OK;
    }
    if (isalpha(c) || c == '_') {
        size_t j = i;
        while (isalnum((unsigned char)s[j]) || s[j] == '_')
            j++;
        p->end = j;
        p->kind = TK_NAME;
        if (j - i >= sizeof p->name) return perr(p, "name too long (63 bytes at most)");
        memcpy(p->name, s + i, j - i);
        p->name[j - i] = '\0';
        return CT_OK;
    }
    static const char *two[] = {"&&", "||", "==", "!=", "<=", ">=", NULL};
    p->kind = TK_OP;
    for (int k = 0; two[k]; k++)
        if (s[i] == two[k][0] && s[i + 1] == two[k][1]) {
            memcpy(p->op, two[k], 3);
            p->end = i + 2;
            return CT_OK;
        }
    if (strchr("+-*/%<>!~&|^?:()[],", c)) {
        p->op[0] = (char)c;
        p->op[1] = '\0';
        p->end = i + 1;
        return CT_OK;
    }
    p->end = i + 1;
    return perr(p, "unexpected character");
}

static bool is_op(const parser *p, const char *op)
{
    return p->kind == TK_OP && strcmp(p->op, op) == 0;
}

static ct_status expect(parser *p, const char *op)
{
    if (!is_op(p, op)) {
        char what[32];
        snprintf(what, sizeof what, "expected '%s'", op);
        return perr(p, what);
    }
    return next(p);
}

/* ---- typed node construction ------------------------------------------------------------ */

static ct_status node(parser *p, jop op, jtype t, int nk, const int *k, int *out)
{
    int r = jir_node(p->ir, op, t, nk, k, 0, 0, -1);
    if (r < 0) {
        p->failed = true;
        return CT_EINVAL;
    }
    *out = r;
    return CT_OK;
}

static jtype ty(const parser *p, int a)
{
    return (jtype)p->ir->n[a].t;
}

/* Convert a to type t (constants fold). */
static ct_status cast(parser *p, int a, jtype t, int *out)
{
    if (ty(p, a) == t) {
        *out = a;
        return CT_OK;
    }
    const jnode *n = &p->ir->n[a];
    if (n->op == J_CONST) {
        int64_t iv = 0;
        double fv = 0;
        if (t == JT_FLOAT) fv = n->t == JT_FLOAT ? n->fv : (double)n->iv;
        else if (t == JT_BOOL) iv = n->t == JT_FLOAT ? n->fv != 0 : n->iv != 0;
        else if (n->t == JT_FLOAT) {
            if (!(fabs(n->fv) < 9.2e18)) return perr(p, "float constant does not fit int64");
            iv = (int64_t)n->fv;
        } else iv = n->iv;
        int r = jir_node(p->ir, J_CONST, t, 0, NULL, iv, fv, -1);
        if (r < 0) {
            p->failed = true;
            return CT_EINVAL;
        }
        *out = r;
        return CT_OK;
    }
    return node(p, J_CAST, t, 1, &a, out);
}

/* Both to their common numeric type (bool -> int -> float); *t receives it. */
static ct_status promote(parser *p, int *a, int *b, jtype *t)
{
    jtype ta = ty(p, *a), tb = ty(p, *b);
    *t = (ta == JT_FLOAT || tb == JT_FLOAT) ? JT_FLOAT : JT_INT;
    CT_TRY(cast(p, *a, *t, a));
    return cast(p, *b, *t, b);
}

static ct_status binary(parser *p, const char *op, int a, int b, int *out)
{
    int k[2];
    jtype t;
    if (!strcmp(op, "&&") || !strcmp(op, "||")) {
        CT_TRY(cast(p, a, JT_BOOL, &k[0]));
        CT_TRY(cast(p, b, JT_BOOL, &k[1]));
        return node(p, op[0] == '&' ? J_AND : J_OR, JT_BOOL, 2, k, out);
    }
    if (!strcmp(op, "&") || !strcmp(op, "|") || !strcmp(op, "^")) {
        jop o = op[0] == '&' ? J_AND : op[0] == '|' ? J_OR : J_XOR;
        if (ty(p, a) == JT_FLOAT || ty(p, b) == JT_FLOAT)
            return perr(p, "operator needs bool or int operands, not float");
        if (ty(p, a) == JT_BOOL && ty(p, b) == JT_BOOL) {
            k[0] = a, k[1] = b;
            return node(p, o, JT_BOOL, 2, k, out);
        }
        k[0] = a, k[1] = b;
        CT_TRY(promote(p, &k[0], &k[1], &t));
        return node(p, o, JT_INT, 2, k, out);
    }
    k[0] = a, k[1] = b;
    CT_TRY(promote(p, &k[0], &k[1], &t));
    static const struct {
        const char *s;
        jop op;
        bool cmp;
    } tab[] = {{"+", J_ADD, false}, {"-", J_SUB, false}, {"*", J_MUL, false}, {"/", J_DIV, false},
               {"%", J_MOD, false}, {"<", J_LT, true},   {"<=", J_LE, true},  {">", J_GT, true},
               {">=", J_GE, true},  {"==", J_EQ, true},  {"!=", J_NE, true}};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(op, tab[i].s)) return node(p, tab[i].op, tab[i].cmp ? JT_BOOL : t, 2, k, out);
    return perr(p, "unknown operator");
}

/* ---- grammar ---------------------------------------------------------------------------- */

static ct_status expr(parser *p, int *out);

static ct_status call(parser *p, const char *name, size_t at, int *out)
{
    static const struct {
        const char *name;
        int nargs;
        jop op;
    } fns[] = {{"exp", 1, J_EXP},     {"log", 1, J_LOG},   {"tanh", 1, J_TANH},
               {"sigmoid", 1, J_SIGMOID}, {"sqrt", 1, J_SQRT}, {"floor", 1, J_FLOOR},
               {"abs", 1, J_ABS},     {"min", 2, J_MIN},   {"max", 2, J_MAX},
               {"clamp", 3, J_CLAMP}, {"where", 3, J_SEL}, {"float", 1, J_CAST},
               {"int", 1, J_CAST}};
    int f = -1;
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        if (!strcmp(name, fns[i].name)) f = (int)i;
    if (f < 0) {
        p->pos = at;
        p->end = at + strlen(name);
        p->kind = TK_NAME;
        return perr(p, "unknown function");
    }
    int args[3], n = 0;
    CT_TRY(next(p)); /* ( */
    if (!is_op(p, ")")) {
        for (;;) {
            if (n == 3) return perr(p, "too many arguments");
            CT_TRY(expr(p, &args[n++]));
            if (!is_op(p, ",")) break;
            CT_TRY(next(p));
        }
    }
    if (n != fns[f].nargs) {
        char what[64];
        snprintf(what, sizeof what, "%s() takes %d argument%s, got %d", name, fns[f].nargs,
                 fns[f].nargs == 1 ? "" : "s", n);
        return perr(p, what);
    }
    CT_TRY(expect(p, ")"));
    jop op = fns[f].op;
    jtype t;
    switch (op) {
    case J_CAST: return cast(p, args[0], name[0] == 'f' ? JT_FLOAT : JT_INT, out);
    case J_ABS:
        if (ty(p, args[0]) == JT_BOOL) CT_TRY(cast(p, args[0], JT_INT, &args[0]));
        return node(p, J_ABS, ty(p, args[0]), 1, args, out);
    case J_MIN:
    case J_MAX:
        CT_TRY(promote(p, &args[0], &args[1], &t));
        return node(p, op, t, 2, args, out);
    case J_CLAMP: {
        jtype t2;
        CT_TRY(promote(p, &args[0], &args[1], &t));
        CT_TRY(promote(p, &args[0], &args[2], &t2));
        if (t2 != t) CT_TRY(cast(p, args[1], t2, &args[1]));
        return node(p, op, t2, 3, args, out);
    }
    case J_SEL:
        CT_TRY(cast(p, args[0], JT_BOOL, &args[0]));
        if (ty(p, args[1]) == JT_BOOL && ty(p, args[2]) == JT_BOOL) t = JT_BOOL;
        else CT_TRY(promote(p, &args[1], &args[2], &t));
        return node(p, op, t, 3, args, out);
    default:
        CT_TRY(cast(p, args[0], JT_FLOAT, &args[0]));
        return node(p, op, JT_FLOAT, 1, args, out);
    }
}

static int find_array(const parser *p, const char *name)
{
    for (int i = 0; i < p->nbind; i++)
        if (p->bind[i].name && !strcmp(p->bind[i].name, name)) return i;
    return -1;
}

static ct_status array_ref(parser *p, int ai, int *out)
{
    const ct_jit_binding *bb = &p->bind[ai];
    int idx[CT_JIT_MAX_DIMS], n = 0;
    while (n < bb->ndim && is_op(p, "[")) {
        CT_TRY(next(p));
        for (;;) {
            if (n == bb->ndim) {
                char what[96];
                snprintf(what, sizeof what, "too many indices for '%s' (%d dims)", bb->name, bb->ndim);
                return perr(p, what);
            }
            CT_TRY(expr(p, &idx[n]));
            jtype t = ty(p, idx[n]);
            if (t == JT_FLOAT) {
                char what[96];
                snprintf(what, sizeof what, "index %d of '%s' is a float (indices are int)", n, bb->name);
                return perr(p, what);
            }
            if (t == JT_BOOL) CT_TRY(cast(p, idx[n], JT_INT, &idx[n]));
            n++;
            if (!is_op(p, ",")) break;
            CT_TRY(next(p));
        }
        CT_TRY(expect(p, "]"));
    }
    if (n != bb->ndim) {
        char what[96];
        snprintf(what, sizeof what, "'%s' has %d dims but %d indices", bb->name, bb->ndim, n);
        return perr(p, what);
    }
    if (is_op(p, "[")) {
        char what[96];
        snprintf(what, sizeof what, "too many indices for '%s' (%d dims)", bb->name, bb->ndim);
        return perr(p, what);
    }
    jtype t = bb->dtype == CT_DTYPE_F32 ? JT_FLOAT
              : (bb->dtype == CT_DTYPE_BOOL || bb->dtype == CT_DTYPE_U8) ? JT_BOOL
                                                                          : JT_INT;
    int r = jir_node(p->ir, J_ARR, t, n, idx, 0, 0, ai);
    if (r < 0) {
        p->failed = true;
        return CT_EINVAL;
    }
    *out = r;
    return CT_OK;
}

static ct_status primary(parser *p, int *out)
{
    if (p->kind == TK_INT) {
        int r = jir_node(p->ir, J_CONST, JT_INT, 0, NULL, p->iv, 0, -1);
        if (r < 0) return p->failed = true, CT_EINVAL;
        *out = r;
        return next(p);
    }
    if (p->kind == TK_FLOAT) {
        int r = jir_node(p->ir, J_CONST, JT_FLOAT, 0, NULL, 0, p->fv, -1);
        if (r < 0) return p->failed = true, CT_EINVAL;
        *out = r;
        return next(p);
    }
    if (is_op(p, "(")) {
        CT_TRY(next(p));
        CT_TRY(expr(p, out));
        return expect(p, ")");
    }
    if (p->kind != TK_NAME) return perr(p, "expected a value");
    char name[64];
    memcpy(name, p->name, sizeof name);
    size_t at = p->pos;
    CT_TRY(next(p));
    if (is_op(p, "(")) return call(p, name, at, out);
    static const char *vars[] = {"score", "b", "h", "q", "kv", "q_idx", "kv_idx"};
    for (int v = 0; v < 7; v++)
        if (!strcmp(name, vars[v])) {
            int id = v < 5 ? v : v - 2;
            if (id == JV_SCORE && p->ir->is_mask) {
                p->pos = at, p->end = at + strlen(name), p->kind = TK_NAME;
                return perr(p, "'score' is not available in a mask mod");
            }
            int r = jir_node(p->ir, J_VAR, id == JV_SCORE ? JT_FLOAT : JT_INT, 0, NULL, id, 0, -1);
            if (r < 0) return p->failed = true, CT_EINVAL;
            *out = r;
            return CT_OK;
        }
    if (!strcmp(name, "inf")) {
        int r = jir_node(p->ir, J_CONST, JT_FLOAT, 0, NULL, 0, INFINITY, -1);
        if (r < 0) return p->failed = true, CT_EINVAL;
        *out = r;
        return CT_OK;
    }
    if (!strcmp(name, "true") || !strcmp(name, "false")) {
        int r = jir_node(p->ir, J_CONST, JT_BOOL, 0, NULL, name[0] == 't', 0, -1);
        if (r < 0) return p->failed = true, CT_EINVAL;
        *out = r;
        return CT_OK;
    }
    int ai = find_array(p, name);
    if (ai < 0) {
        p->pos = at, p->end = at + strlen(name), p->kind = TK_NAME;
        return perr(p, "unknown name (not score, b, h, q, kv or a bound array)");
    }
    return array_ref(p, ai, out);
}

static ct_status unary(parser *p, int *out)
{
    if (++p->depth > JIT_MAX_DEPTH) return perr(p, "expression nested too deeply");
    ct_status s;
    if (p->kind == TK_OP && (is_op(p, "-") || is_op(p, "+") || is_op(p, "!") || is_op(p, "~"))) {
        char op = p->op[0];
        CT_TRY(next(p));
        int a;
        CT_TRY(unary(p, &a));
        jtype t = ty(p, a);
        if (op == '+') {
            if (t == JT_BOOL) CT_TRY(cast(p, a, JT_INT, &a));
            *out = a;
        } else if (op == '-') {
            if (t == JT_BOOL) CT_TRY(cast(p, a, JT_INT, &a));
            const jnode *n = &p->ir->n[a];
            if (n->op == J_CONST) { /* fold, so "-5" is a literal */
                int r = n->t == JT_FLOAT
                            ? jir_node(p->ir, J_CONST, JT_FLOAT, 0, NULL, 0, -n->fv, -1)
                            : jir_node(p->ir, J_CONST, JT_INT, 0, NULL,
                                       (int64_t)(0 - (uint64_t)n->iv), 0, -1);
                if (r < 0) return p->failed = true, CT_EINVAL;
                *out = r;
            } else {
                CT_TRY(node(p, J_NEG, ty(p, a), 1, &a, out));
            }
        } else if (op == '!' || (op == '~' && t == JT_BOOL)) {
            CT_TRY(cast(p, a, JT_BOOL, &a));
            CT_TRY(node(p, J_NOT, JT_BOOL, 1, &a, out));
        } else {
            if (t == JT_FLOAT) return perr(p, "'~' needs a bool or int operand, not float");
            CT_TRY(node(p, J_BNOT, JT_INT, 1, &a, out));
        }
        s = CT_OK;
    } else {
        s = primary(p, out);
    }
    p->depth--;
    return s;
}

/* Binary levels from tightest to loosest. */
static const char *levels[][5] = {
    {"*", "/", "%", NULL}, {"+", "-", NULL}, {"<", "<=", ">", ">=", NULL}, {"==", "!=", NULL},
    {"&", NULL},           {"^", NULL},      {"|", NULL},                  {"&&", NULL},
    {"||", NULL},
};

static ct_status level(parser *p, int lv, int *out)
{
    if (lv < 0) return unary(p, out);
    if (++p->depth > JIT_MAX_DEPTH) return perr(p, "expression nested too deeply");
    CT_TRY(level(p, lv - 1, out));
    for (;;) {
        const char *hit = NULL;
        if (p->kind == TK_OP)
            for (int i = 0; levels[lv][i]; i++)
                if (!strcmp(p->op, levels[lv][i])) hit = levels[lv][i];
        if (!hit) break;
        CT_TRY(next(p));
        int b;
        CT_TRY(level(p, lv - 1, &b));
        CT_TRY(binary(p, hit, *out, b, out));
    }
    p->depth--;
    return CT_OK;
}

static ct_status expr(parser *p, int *out)
{
    if (++p->depth > JIT_MAX_DEPTH) return perr(p, "expression nested too deeply");
    CT_TRY(level(p, 8, out));
    if (is_op(p, "?")) {
        CT_TRY(next(p));
        int k[3];
        CT_TRY(cast(p, *out, JT_BOOL, &k[0]));
        CT_TRY(expr(p, &k[1]));
        CT_TRY(expect(p, ":"));
        CT_TRY(expr(p, &k[2]));
        jtype t;
        if (ty(p, k[1]) == JT_BOOL && ty(p, k[2]) == JT_BOOL) t = JT_BOOL;
        else CT_TRY(promote(p, &k[1], &k[2], &t));
        CT_TRY(node(p, J_SEL, t, 3, k, out));
    }
    p->depth--;
    return CT_OK;
}

static bool valid_name(const char *s)
{
    if (!s || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return false;
    size_t n = 0;
    for (; s[n]; n++)
        if (!(isalnum((unsigned char)s[n]) || s[n] == '_')) return false;
    return n < 64;
}

ct_status jit_parse(const char *fn, const char *src, bool is_mask, const ct_jit_binding *bind,
                    int nbind, jir *ir)
{
    memset(ir, 0, sizeof *ir);
    ir->is_mask = is_mask;
    if (!src) return ct_error(CT_EINVAL, "%s: expr must not be NULL", fn);
    size_t len = strnlen(src, JIT_MAX_EXPR + 1);
    if (len > JIT_MAX_EXPR)
        return ct_error(CT_EINVAL, "%s: expression longer than %d bytes", fn, JIT_MAX_EXPR);
    if (nbind < 0 || nbind > CT_JIT_MAX_ARRAYS || (nbind > 0 && !bind))
        return ct_error(CT_EINVAL, "%s: need 0 .. %d bindings (and a bindings array), got %d", fn,
                        CT_JIT_MAX_ARRAYS, nbind);
    static const char *reserved[] = {"score", "b", "h", "q", "kv", "q_idx", "kv_idx", "true",
                                     "false", "inf", "exp", "log", "tanh", "sigmoid", "sqrt", "floor",
                                     "abs", "min", "max", "clamp", "where", "float", "int"};
    for (int i = 0; i < nbind; i++) {
        const ct_jit_binding *b = &bind[i];
        if (!valid_name(b->name))
            return ct_error(CT_EINVAL, "%s: bindings[%d].name must be an identifier of < 64 bytes", fn, i);
        for (size_t r = 0; r < sizeof reserved / sizeof reserved[0]; r++)
            if (!strcmp(b->name, reserved[r]))
                return ct_error(CT_EINVAL, "%s: bindings[%d].name '%s' is reserved", fn, i, b->name);
        for (int j = 0; j < i; j++)
            if (!strcmp(bind[j].name, b->name))
                return ct_error(CT_EINVAL, "%s: two bindings are named '%s'", fn, b->name);
        if (b->dtype != CT_DTYPE_F32 && b->dtype != CT_DTYPE_I32 && b->dtype != CT_DTYPE_I64 &&
            b->dtype != CT_DTYPE_BOOL && b->dtype != CT_DTYPE_U8)
            return ct_error(CT_EINVAL, "%s: binding '%s' has dtype %s (need f32, i32, i64, bool or u8)",
                            fn, b->name, ct_dtype_name(b->dtype));
        if (b->ndim < 0 || b->ndim > CT_JIT_MAX_DIMS)
            return ct_error(CT_EINVAL, "%s: binding '%s' has %d dims (0 .. %d)", fn, b->name, b->ndim,
                            CT_JIT_MAX_DIMS);
        if (b->requires_grad && (b->dtype != CT_DTYPE_F32 || is_mask))
            return ct_error(CT_EINVAL, "%s: binding '%s' requires_grad: only f32 arrays of score mods",
                            fn, b->name);
        ir->arr[i].dtype = b->dtype;
        ir->arr[i].ndim = b->ndim;
        ir->arr[i].grad = b->requires_grad;
        snprintf(ir->arr[i].name, sizeof ir->arr[i].name, "%s", b->name);
    }
    ir->narr = nbind;
    parser p = {.fn = fn, .src = src, .ir = ir, .bind = bind, .nbind = nbind};
    CT_TRY(next(&p));
    if (p.kind == TK_END) return perr(&p, "empty expression");
    int root;
    CT_TRY(expr(&p, &root));
    if (p.kind != TK_END) return perr(&p, "unexpected token");
    CT_TRY(cast(&p, root, is_mask ? JT_BOOL : JT_FLOAT, &root));
    ir->root = root;
    return CT_OK;
}
