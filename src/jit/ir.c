/* The mod IR: shared nodes (a DAG, identical subexpressions built once), symbolic
 * differentiation, canonical serialisation (the cache key's input) and interval arithmetic
 * (range checks and the block classifier). */
#include "jit/jit_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int jir_node(jir *ir, jop op, jtype t, int nk, const int *k, int64_t iv, double fv, int arr)
{
    jnode n;
    memset(&n, 0, sizeof n);
    n.op = (uint8_t)op;
    n.t = (uint8_t)t;
    n.nk = (uint8_t)nk;
    n.arr = (int8_t)arr;
    for (int i = 0; i < nk; i++)
        n.k[i] = k[i];
    n.iv = iv;
    n.fv = fv;
    for (int i = 0; i < ir->len; i++) {
        const jnode *m = &ir->n[i];
        if (m->op == n.op && m->t == n.t && m->nk == n.nk && m->arr == n.arr && m->iv == n.iv &&
            memcmp(&m->fv, &n.fv, sizeof n.fv) == 0 && memcmp(m->k, n.k, sizeof n.k) == 0)
            return i;
    }
    if (ir->len >= JIT_MAX_NODES) {
        ct_error(CT_EINVAL, "mod expression: more than %d distinct operations", JIT_MAX_NODES);
        return -1;
    }
    ir->n[ir->len] = n;
    return ir->len++;
}

/* ---- differentiation -------------------------------------------------------------------- */

static int fconst(jir *ir, double v)
{
    return jir_node(ir, J_CONST, JT_FLOAT, 0, NULL, 0, v, -1);
}

static bool is_fconst(const jir *ir, int a, double v)
{
    return a >= 0 && ir->n[a].op == J_CONST && ir->n[a].t == JT_FLOAT && ir->n[a].fv == v;
}

#define ERRV(x)                                                                            \
    do {                                                                                   \
        if ((x) < -1) return -2;                                                           \
    } while (0)

/* Float node helpers with simplification; -1 is zero, -2 an error. */
static int f2(jir *ir, jop op, int a, int b)
{
    if (a < -1 || b < -1) return -2;
    switch (op) {
    case J_ADD:
        if (a < 0) return b;
        if (b < 0) return a;
        break;
    case J_SUB:
        if (b < 0) return a;
        if (a < 0) {
            int k[1] = {b};
            int r = jir_node(ir, J_NEG, JT_FLOAT, 1, k, 0, 0, -1);
            return r < 0 ? -2 : r;
        }
        break;
    case J_MUL:
        if (a < 0 || b < 0) return -1;
        if (is_fconst(ir, a, 1.0)) return b;
        if (is_fconst(ir, b, 1.0)) return a;
        break;
    case J_DIV:
        if (a < 0) return -1;
        break;
    default: break;
    }
    int k[2] = {a, b};
    int r = jir_node(ir, op, op >= J_LT && op <= J_NE ? JT_BOOL : JT_FLOAT, 2, k, 0, 0, -1);
    return r < 0 ? -2 : r;
}

static int fsel(jir *ir, int c, int a, int b)
{
    if (c < -1 || a < -1 || b < -1) return -2;
    if (a < 0 && b < 0) return -1;
    if (a < 0 && (a = fconst(ir, 0.0)) < 0) return -2;
    if (b < 0 && (b = fconst(ir, 0.0)) < 0) return -2;
    int k[3] = {c, a, b};
    int r = jir_node(ir, J_SEL, JT_FLOAT, 3, k, 0, 0, -1);
    return r < 0 ? -2 : r;
}

static int fun1(jir *ir, jop op, int a)
{
    int k[1] = {a};
    int r = jir_node(ir, op, JT_FLOAT, 1, k, 0, 0, -1);
    return r < 0 ? -2 : r;
}

static int band(jir *ir, int a, int b)
{
    int k[2] = {a, b};
    int r = jir_node(ir, J_AND, JT_BOOL, 2, k, 0, 0, -1);
    return r < 0 ? -2 : r;
}

/* memo[node] caches the derivative: -3 not yet computed. */
static int deriv(jir *ir, int x, int wrt, int *memo)
{
    if (memo[x] != -3) return memo[x];
    const jnode n = ir->n[x];
    int r = -1;
    if (n.t != JT_FLOAT) goto done; /* ints and bools do not depend on the score */
    int a = n.nk > 0 ? n.k[0] : -1, b = n.nk > 1 ? n.k[1] : -1, c = n.nk > 2 ? n.k[2] : -1;
    int da = -1, db = -1, dc = -1;
    if (n.op != J_ARR) {
        if (a >= 0) ERRV(da = deriv(ir, a, wrt, memo));
        if (b >= 0) ERRV(db = deriv(ir, b, wrt, memo));
        if (c >= 0) ERRV(dc = deriv(ir, c, wrt, memo));
    }
    switch ((jop)n.op) {
    case J_CONST: break;
    case J_VAR: r = (wrt < 0 && n.iv == JV_SCORE) ? fconst(ir, 1.0) : -1; break;
    case J_ARR: r = x == wrt ? fconst(ir, 1.0) : -1; break;
    case J_CAST: r = ir->n[a].t == JT_FLOAT ? da : -1; break;
    case J_NEG: r = da < 0 ? -1 : fun1(ir, J_NEG, da); break;
    case J_ADD: r = f2(ir, J_ADD, da, db); break;
    case J_SUB: r = f2(ir, J_SUB, da, db); break;
    case J_MUL: r = f2(ir, J_ADD, f2(ir, J_MUL, da, b), f2(ir, J_MUL, a, db)); break;
    case J_DIV: /* (da - (a / b) db) / b */
        r = f2(ir, J_DIV, f2(ir, J_SUB, da, f2(ir, J_MUL, x, db)), b);
        break;
    case J_MOD: /* a - floor(a / b) b */
        r = f2(ir, J_SUB, da, f2(ir, J_MUL, db >= 0 ? fun1(ir, J_FLOOR, f2(ir, J_DIV, a, b)) : -1, db));
        break;
    case J_SEL: r = fsel(ir, a, db, dc); break;
    case J_EXP: r = f2(ir, J_MUL, da, x); break;
    case J_LOG: r = f2(ir, J_DIV, da, a); break;
    case J_TANH: r = f2(ir, J_MUL, da, f2(ir, J_SUB, fconst(ir, 1.0), f2(ir, J_MUL, x, x))); break;
    case J_SIGMOID:
        r = f2(ir, J_MUL, da, f2(ir, J_MUL, x, f2(ir, J_SUB, fconst(ir, 1.0), x)));
        break;
    case J_SQRT: r = f2(ir, J_DIV, da, f2(ir, J_MUL, fconst(ir, 2.0), x)); break;
    case J_FLOOR: break;
    case J_ABS: {
        if (da < 0) break;
        int z = fconst(ir, 0.0);
        if (z < 0) return -2;
        int pos = f2(ir, J_GT, a, z), neg = f2(ir, J_LT, a, z);
        r = fsel(ir, pos, da, fsel(ir, neg, fun1(ir, J_NEG, da), -1));
        break;
    }
    case J_MIN:
    case J_MAX: { /* as torch.minimum / maximum: ties split the gradient */
        if (da < 0 && db < 0) break;
        int win = f2(ir, n.op == J_MIN ? J_LT : J_GT, a, b), tie = f2(ir, J_EQ, a, b);
        int half = f2(ir, J_MUL, fconst(ir, 0.5), f2(ir, J_ADD, da, db));
        r = fsel(ir, win, da, fsel(ir, tie, half, db));
        break;
    }
    case J_CLAMP: { /* as torch.clamp: x's gradient inside [lo, hi], lo's below, hi's above */
        int in = band(ir, f2(ir, J_GE, a, b), f2(ir, J_LE, a, c));
        if (in < -1) return -2;
        r = fsel(ir, in, da, fsel(ir, f2(ir, J_LT, a, b), db, fsel(ir, f2(ir, J_GT, a, c), dc, -1)));
        break;
    }
    default: break; /* comparisons and logic are bool */
    }
done:
    if (r < -1) return -2;
    memo[x] = r;
    return r;
}

int jir_deriv(jir *ir, int node, int wrt, int *memo)
{
    for (int i = 0; i < JIT_MAX_NODES; i++)
        memo[i] = -3;
    return deriv(ir, node, wrt, memo);
}

/* ---- serialisation ---------------------------------------------------------------------- */

ct_status jir_serialize(const jir *ir, char **out, size_t *len)
{
    size_t cap = 256 + (size_t)ir->len * 96 + (size_t)ir->narr * 96;
    char *s;
    CT_TRY(ct_alloc((void **)&s, cap));
    size_t o = 0;
    o += (size_t)snprintf(s + o, cap - o, "ctorch-jit abi %d %s root %d arrays %d\n", JIT_ABI,
                          ir->is_mask ? "mask" : "score", ir->root, ir->narr);
    for (int i = 0; i < ir->narr; i++)
        o += (size_t)snprintf(s + o, cap - o, "a %d %d %d %d\n", i, (int)ir->arr[i].dtype,
                              ir->arr[i].ndim, ir->arr[i].grad);
    for (int i = 0; i < ir->len; i++) {
        const jnode *n = &ir->n[i];
        uint64_t bits;
        memcpy(&bits, &n->fv, sizeof bits);
        o += (size_t)snprintf(s + o, cap - o, "n %d %d %d %d %lld %llx", n->op, n->t, n->nk,
                              n->arr, (long long)n->iv, (unsigned long long)bits);
        for (int j = 0; j < n->nk; j++)
            o += (size_t)snprintf(s + o, cap - o, " %d", n->k[j]);
        o += (size_t)snprintf(s + o, cap - o, "\n");
    }
    *out = s;
    *len = o;
    return CT_OK;
}

/* ---- intervals -------------------------------------------------------------------------- */

#define IFULL ((jival){INT64_MIN, INT64_MAX})

static bool is_full(jival v)
{
    return v.lo == INT64_MIN && v.hi == INT64_MAX;
}

static jival iv2(int64_t a, int64_t b)
{
    return (jival){a < b ? a : b, a < b ? b : a};
}

static int64_t fdiv64(int64_t a, int64_t b)
{
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0 - (uint64_t)a);
    int64_t q = a / b;
    if (a % b != 0 && ((a < 0) != (b < 0))) q--;
    return q;
}

static jival i_add(jival a, jival b)
{
    int64_t lo, hi;
    if (__builtin_add_overflow(a.lo, b.lo, &lo) || __builtin_add_overflow(a.hi, b.hi, &hi))
        return IFULL;
    return (jival){lo, hi};
}

static jival i_neg(jival a)
{
    if (a.lo == INT64_MIN) return IFULL;
    return (jival){-a.hi, -a.lo};
}

static jival i_mul(jival a, jival b)
{
    int64_t c[4];
    if (__builtin_mul_overflow(a.lo, b.lo, &c[0]) || __builtin_mul_overflow(a.lo, b.hi, &c[1]) ||
        __builtin_mul_overflow(a.hi, b.lo, &c[2]) || __builtin_mul_overflow(a.hi, b.hi, &c[3]))
        return IFULL;
    jival r = {c[0], c[0]};
    for (int i = 1; i < 4; i++) {
        if (c[i] < r.lo) r.lo = c[i];
        if (c[i] > r.hi) r.hi = c[i];
    }
    return r;
}

static jival i_div(jival a, jival b)
{
    if (a.lo == INT64_MIN) return IFULL;
    if (b.lo > 0 || b.hi < 0) { /* floor division is monotonic in each argument here */
        int64_t c[4] = {fdiv64(a.lo, b.lo), fdiv64(a.lo, b.hi), fdiv64(a.hi, b.lo),
                        fdiv64(a.hi, b.hi)};
        jival r = {c[0], c[0]};
        for (int i = 1; i < 4; i++) {
            if (c[i] < r.lo) r.lo = c[i];
            if (c[i] > r.hi) r.hi = c[i];
        }
        return r;
    }
    int64_t m = -a.lo > a.hi ? -a.lo : a.hi; /* |a / b| <= |a|, and x / 0 is 0 */
    return (jival){-m < 0 ? -m : 0, m > 0 ? m : 0};
}

static jival i_mod(jival a, jival b)
{
    if (b.lo == b.hi && b.lo > 0) {
        int64_t c = b.lo, k = fdiv64(a.lo, c);
        if (k == fdiv64(a.hi, c) && !is_full(a)) {
            int64_t off = (int64_t)((uint64_t)k * (uint64_t)c);
            return (jival){a.lo - off, a.hi - off};
        }
        return (jival){0, c - 1};
    }
    if (b.lo > 0) return (jival){0, b.hi - 1};
    if (b.hi < 0) return (jival){b.lo + 1, 0};
    if (b.lo == INT64_MIN) return IFULL;
    return (jival){b.lo + 1 < 0 ? b.lo + 1 : 0, b.hi - 1 > 0 ? b.hi - 1 : 0};
}

static jival i_min(jival a, jival b)
{
    return (jival){a.lo < b.lo ? a.lo : b.lo, a.hi < b.hi ? a.hi : b.hi};
}

static jival i_max(jival a, jival b)
{
    return (jival){a.lo > b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi};
}

static jival i_hull(jival a, jival b)
{
    return (jival){a.lo < b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi};
}

static jival b_of(bool can0, bool can1)
{
    return (jival){can0 ? 0 : 1, can1 ? 1 : 0};
}

static jival to_bool(jival a)
{
    bool can0 = a.lo <= 0 && a.hi >= 0, can1 = !(a.lo == 0 && a.hi == 0);
    return b_of(can0, can1);
}

/* Bound of a | b or a ^ b for non-negative a, b: below the next power of two. */
static int64_t pow2_bound(int64_t m)
{
    int64_t p = 1;
    while (p <= m && p < (INT64_MAX >> 1))
        p <<= 1;
    return p <= m ? INT64_MAX : p - 1;
}

static int64_t load_int(const ctj_arr *a, ct_dtype dt, int64_t flat)
{
    switch (dt) {
    case CT_DTYPE_I32: return ((const int32_t *)a->data)[flat];
    case CT_DTYPE_I64: return ((const int64_t *)a->data)[flat];
    default: return ((const uint8_t *)a->data)[flat] != 0;
    }
}

#define BOX_MAX 4096

static jival arr_value(const jir *ir, const jbound *bd, const jnode *n, const jival *v)
{
    const jarr *ja = &ir->arr[n->arr];
    if (ja->dtype == CT_DTYPE_F32) return IFULL;
    const ctj_arr *a = &bd->a[n->arr];
    jival whole = bd->vrange[n->arr];
    if (a->numel == 0) return whole;
    /* the kernel clamps indices into the array: so does this box */
    int64_t lo[CT_JIT_MAX_DIMS], hi[CT_JIT_MAX_DIMS], count = 1;
    for (int d = 0; d < n->nk; d++) {
        jival x = v[n->k[d]];
        int64_t top = a->shape[d] - 1;
        lo[d] = x.lo < 0 ? 0 : x.lo > top ? top : x.lo;
        hi[d] = x.hi < 0 ? 0 : x.hi > top ? top : x.hi;
        int64_t w = hi[d] - lo[d] + 1;
        if (w > BOX_MAX || (count *= w) > BOX_MAX) return whole;
    }
    jival r = {INT64_MAX, INT64_MIN};
    int64_t idx[CT_JIT_MAX_DIMS];
    for (int d = 0; d < n->nk; d++)
        idx[d] = lo[d];
    for (;;) {
        int64_t flat = 0;
        for (int d = 0; d < n->nk; d++)
            flat += idx[d] * a->stride[d];
        int64_t x = load_int(a, ja->dtype, flat);
        if (x < r.lo) r.lo = x;
        if (x > r.hi) r.hi = x;
        int d = n->nk - 1;
        while (d >= 0 && idx[d] == hi[d]) {
            idx[d] = lo[d];
            d--;
        }
        if (d < 0) break;
        idx[d]++;
    }
    return r;
}

void jit_intervals(const jir *ir, const jbound *bd, jival *v)
{
    for (int i = 0; i < ir->len; i++) {
        const jnode *n = &ir->n[i];
        jival a = n->nk > 0 ? v[n->k[0]] : IFULL, b = n->nk > 1 ? v[n->k[1]] : IFULL;
        jival c = n->nk > 2 ? v[n->k[2]] : IFULL;
        jival r = IFULL;
        if (n->t == JT_FLOAT && n->op != J_ARR) {
            v[i] = IFULL;
            continue;
        }
        bool fa = n->nk > 0 && ir->n[n->k[0]].t == JT_FLOAT;
        bool fb = n->nk > 1 && ir->n[n->k[1]].t == JT_FLOAT;
        switch ((jop)n->op) {
        case J_CONST: r = (jival){n->iv, n->iv}; break;
        case J_VAR: r = bd->var[n->iv]; break;
        case J_ARR: r = n->t == JT_FLOAT ? IFULL : arr_value(ir, bd, n, v); break;
        case J_CAST:
            if (fa) r = n->t == JT_BOOL ? b_of(true, true) : IFULL;
            else r = n->t == JT_BOOL ? to_bool(a) : a;
            break;
        case J_NEG: r = i_neg(a); break;
        case J_NOT: r = b_of(a.hi >= 1, a.lo <= 0); break;
        case J_BNOT: r = (jival){~a.hi, ~a.lo}; break;
        case J_ADD: r = i_add(a, b); break;
        case J_SUB: r = i_add(a, i_neg(b)); break;
        case J_MUL: r = i_mul(a, b); break;
        case J_DIV: r = i_div(a, b); break;
        case J_MOD: r = i_mod(a, b); break;
        case J_LT:
        case J_LE:
        case J_GT:
        case J_GE:
        case J_EQ:
        case J_NE: {
            if (fa || fb) {
                r = b_of(true, true);
                break;
            }
            bool t, f; /* provably true / provably false */
            switch ((jop)n->op) {
            case J_LT: t = a.hi < b.lo; f = a.lo >= b.hi; break;
            case J_LE: t = a.hi <= b.lo; f = a.lo > b.hi; break;
            case J_GT: t = a.lo > b.hi; f = a.hi <= b.lo; break;
            case J_GE: t = a.lo >= b.hi; f = a.hi < b.lo; break;
            case J_EQ: t = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo; f = a.hi < b.lo || b.hi < a.lo; break;
            default: f = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo; t = a.hi < b.lo || b.hi < a.lo; break;
            }
            r = b_of(!t, !f);
            break;
        }
        case J_AND:
            if (n->t == JT_BOOL) r = (jival){a.lo & b.lo, a.hi & b.hi};
            else if (a.lo >= 0 && b.lo >= 0) r = (jival){0, a.hi < b.hi ? a.hi : b.hi};
            else if (a.lo >= 0) r = (jival){0, a.hi};
            else if (b.lo >= 0) r = (jival){0, b.hi};
            break;
        case J_OR:
            if (n->t == JT_BOOL) r = (jival){a.lo | b.lo, a.hi | b.hi};
            else if (a.lo >= 0 && b.lo >= 0)
                r = (jival){a.lo > b.lo ? a.lo : b.lo, pow2_bound(a.hi > b.hi ? a.hi : b.hi)};
            break;
        case J_XOR:
            if (n->t == JT_BOOL) {
                if (a.lo == a.hi && b.lo == b.hi) r = (jival){a.lo ^ b.lo, a.lo ^ b.lo};
                else r = b_of(true, true);
            } else if (a.lo >= 0 && b.lo >= 0) {
                r = (jival){0, pow2_bound(a.hi > b.hi ? a.hi : b.hi)};
            }
            break;
        case J_SEL: {
            jival cc = a;
            r = cc.lo >= 1 ? b : cc.hi <= 0 ? c : i_hull(b, c);
            break;
        }
        case J_ABS:
            if (a.lo >= 0) r = a;
            else if (a.lo == INT64_MIN) r = IFULL;
            else if (a.hi <= 0) r = (jival){-a.hi, -a.lo};
            else r = (jival){0, -a.lo > a.hi ? -a.lo : a.hi};
            break;
        case J_MIN: r = i_min(a, b); break;
        case J_MAX: r = i_max(a, b); break;
        case J_CLAMP: r = i_min(i_max(a, b), c); break;
        default: r = IFULL; break;
        }
        if (n->t == JT_BOOL && (r.lo < 0 || r.hi > 1)) r = b_of(true, true);
        v[i] = r;
    }
    (void)iv2;
}
