/* A restricted unpickler equivalent to torch.load(weights_only=True): it runs the opcodes
 * that build data (containers, numbers, strings, memo), recognises the allow-listed globals
 * by name and models their effect (tensor rebuilds, OrderedDict, Parameter, torch.Size);
 * every other GLOBAL / STACK_GLOBAL is refused when it is read, and REDUCE / NEWOBJ /
 * BUILD / INST / OBJ / EXT* of anything else are refused by name. It never calls anything,
 * never imports anything, and bounds every resource a hostile pickle could grow. */
#include "core/internal.h"
#include "io/io_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tables --------------------------------------------------------------------------- */

const pk_storage_type ct_pk_storage_types[] = {
    {"FloatStorage", CT_ST_F32, 4, false, false, false, false},
    {"DoubleStorage", CT_ST_F64, 8, false, false, false, false},
    {"HalfStorage", CT_ST_F16, 2, false, false, false, false},
    {"BFloat16Storage", CT_ST_BF16, 2, false, false, false, false},
    {"ComplexFloatStorage", CT_ST_C64, 8, false, false, false, false},
    {"ComplexDoubleStorage", CT_ST_F64, 16, true, false, false, false},
    {"ByteStorage", CT_ST_U8, 1, false, false, false, false},
    {"CharStorage", CT_ST_I8, 1, false, false, false, false},
    {"ShortStorage", CT_ST_I16, 2, false, false, false, false},
    {"IntStorage", CT_ST_I32, 4, false, false, false, false},
    {"LongStorage", CT_ST_I64, 8, false, false, false, false},
    {"BoolStorage", CT_ST_BOOL, 1, false, false, false, false},
    {"QInt8Storage", CT_ST_I8, 1, false, true, false, false},
    {"QUInt8Storage", CT_ST_U8, 1, false, true, false, false},
    {"QInt32Storage", CT_ST_I32, 4, false, true, false, false},
    {"QUInt4x2Storage", CT_ST_U8, 1, false, true, false, false},
    {"QUInt2x4Storage", CT_ST_U8, 1, false, true, false, false},
    {"UntypedStorage", CT_ST_U8, 1, false, false, true, false},
    {"TypedStorage", CT_ST_U8, 1, false, false, true, false}, /* no dtype: refused when used */
    /* element types of dtypes that torch (2.x) saves in untyped storages (_rebuild_tensor_v3) */
    {"float8_e4m3fn", CT_ST_F8_E4M3, 1, false, false, false, true},
    {"float8_e5m2", CT_ST_F8_E5M2, 1, false, false, false, true},
    {"float8_e4m3fnuz", CT_ST_F8_E4M3FNUZ, 1, false, false, false, true},
    {"float8_e5m2fnuz", CT_ST_F8_E5M2FNUZ, 1, false, false, false, true},
    {"float8_e8m0fnu", CT_ST_F8_E8M0, 1, false, false, false, true},
    {"uint16", CT_ST_U16, 2, false, false, false, true},
    {"uint32", CT_ST_U32, 4, false, false, false, true},
    {"uint64", CT_ST_U64, 8, false, false, false, true},
    {"complex32", CT_ST_F16, 4, true, false, false, true}, /* F16 pairs, as complex128 */
    {"bits8", CT_ST_U8, 1, false, false, false, true},      /* opaque bits: their bytes */
    {"bits16", CT_ST_U16, 2, false, false, false, true},
};
const size_t ct_pk_storage_type_count = sizeof ct_pk_storage_types / sizeof ct_pk_storage_types[0];

/* torch.cuda has no quantized storages in the allow-list. */
static bool cuda_storage(size_t i)
{
    return !ct_pk_storage_types[i].quantized && !ct_pk_storage_types[i].untyped;
}

/* torch's dtypes (weights_only allows every one in 2.x); the first ten were 1.13's list. With
 * the storage type holding their elements (NULL: none in ctorch). */
static const struct {
    const char *name, *storage;
} dtype_globals[] = {
    {"complex32", "complex32"},
    {"complex64", "ComplexFloatStorage"},
    {"complex128", "ComplexDoubleStorage"},
    {"float16", "HalfStorage"},
    {"float32", "FloatStorage"},
    {"float64", "DoubleStorage"},
    {"int8", "CharStorage"},
    {"int16", "ShortStorage"},
    {"int32", "IntStorage"},
    {"int64", "LongStorage"},
    {"bfloat16", "BFloat16Storage"},
    {"bool", "BoolStorage"},
    {"uint8", "ByteStorage"},
    {"uint16", "uint16"},
    {"uint32", "uint32"},
    {"uint64", "uint64"},
    {"float8_e4m3fn", "float8_e4m3fn"},
    {"float8_e5m2", "float8_e5m2"},
    {"float8_e4m3fnuz", "float8_e4m3fnuz"},
    {"float8_e5m2fnuz", "float8_e5m2fnuz"},
    {"float8_e8m0fnu", "float8_e8m0fnu"},
    {"bits8", "bits8"},
    {"bits16", "bits16"},
    {"float4_e2m1fn_x2", NULL}, /* two 4-bit values a byte, shaped in bytes: not modelled */
    {"bits1x8", NULL},
    {"bits2x4", NULL},
    {"bits4x2", NULL},
};

bool ct_pk_dtype_storage_type(uint16_t arg, size_t *type, const char **name)
{
    if (arg >= sizeof dtype_globals / sizeof dtype_globals[0]) return false;
    *name = dtype_globals[arg].name;
    if (!dtype_globals[arg].storage) return false;
    for (size_t i = 0; i < ct_pk_storage_type_count; i++)
        if (!strcmp(ct_pk_storage_types[i].name, dtype_globals[arg].storage)) {
            *type = i;
            return true;
        }
    return false;
}

static const char *const tensor_classes[] = {
    "BFloat16Tensor", "CharTensor", "IntTensor",   "LongTensor",  "HalfTensor",
    "DoubleTensor",   "ByteTensor", "ShortTensor", "FloatTensor", "BoolTensor"};

static const struct {
    const char *name;
    pk_global_id id;
} fixed_globals[] = {
    {"collections.OrderedDict", PKG_ORDERED_DICT},
    {"torch.nn.parameter.Parameter", PKG_PARAMETER},
    {"torch.serialization._get_layout", PKG_GET_LAYOUT},
    {"torch.Size", PKG_SIZE},
    {"torch.Tensor", PKG_TENSOR},
    {"torch._utils._rebuild_parameter", PKG_REBUILD_PARAMETER},
    {"torch._utils._rebuild_tensor", PKG_REBUILD_TENSOR},
    {"torch._utils._rebuild_tensor_v2", PKG_REBUILD_TENSOR_V2},
    {"torch._utils._rebuild_tensor_v3", PKG_REBUILD_TENSOR_V3},
    {"torch._utils._rebuild_sparse_tensor", PKG_REBUILD_SPARSE_TENSOR},
    {"torch._utils._rebuild_meta_tensor_no_storage", PKG_REBUILD_META_TENSOR},
    {"torch._utils._rebuild_sparse_csr_tensor", PKG_REBUILD_SPARSE_CSR_TENSOR},
};

/* The allow-list lookup of "module.name": true and *id / *arg when allowed. */
static bool allowed_global(const char *mod, const char *name, pk_global_id *id, uint16_t *arg)
{
    char full[520];
    snprintf(full, sizeof full, "%s.%s", mod, name);
    *arg = 0;
    for (size_t i = 0; i < sizeof fixed_globals / sizeof fixed_globals[0]; i++)
        if (!strcmp(full, fixed_globals[i].name)) {
            *id = fixed_globals[i].id;
            return true;
        }
    if (!strcmp(mod, "torch"))
        for (size_t i = 0; i < sizeof dtype_globals / sizeof dtype_globals[0]; i++)
            if (!strcmp(name, dtype_globals[i].name)) {
                *id = PKG_DTYPE;
                *arg = (uint16_t)i;
                return true;
            }
    bool sparse = !strcmp(mod, "torch.sparse") || !strcmp(mod, "torch.cuda.sparse");
    if (sparse || !strcmp(mod, "torch") || !strcmp(mod, "torch.cuda"))
        for (size_t i = 0; i < sizeof tensor_classes / sizeof tensor_classes[0]; i++)
            if (!strcmp(name, tensor_classes[i]) && !(sparse && !strcmp(name, "BoolTensor"))) {
                *id = PKG_TENSOR_CLASS;
                *arg = (uint16_t)i;
                return true;
            }
    for (size_t i = 0; i < ct_pk_storage_type_count; i++) {
        const pk_storage_type *t = &ct_pk_storage_types[i];
        if (t->dtype_only || strcmp(name, t->name)) continue;
        bool ok = t->untyped
                      ? !strcmp(mod, "torch.storage")
                      : !strcmp(mod, "torch") || (!strcmp(mod, "torch.cuda") && cuda_storage(i));
        if (ok) {
            *id = PKG_STORAGE_TYPE;
            *arg = (uint16_t)i;
            return true;
        }
    }
    return false;
}

/* ---- the machine ---------------------------------------------------------------------- */

typedef struct pk_block {
    struct pk_block *next;
    size_t used, cap;
    _Alignas(16) uint8_t data[];
} pk_block;

typedef struct memo_slot {
    uint32_t key;
    bool used;
    pk_obj *obj;
} memo_slot;

struct pk_machine {
    const char *label;
    pk_persistent_fn persistent;
    void *ctx;
    pk_block *blocks;
    pk_obj **objs; /* every object, for freeing container arrays */
    size_t nobjs, cap_objs;
    pk_obj **stack;
    size_t sp, cap_stack;
    size_t *marks;
    size_t nmarks, cap_marks;
    memo_slot *memo;
    size_t memo_used, memo_cap;
    uint64_t memo_seed; /* memo_hash's, set when the table is first allocated */
    /* the opcode being run, for messages */
    size_t pos;
    uint8_t op;
};

static const char *op_name(uint8_t op)
{
    switch (op) {
    case 0x28:
        return "MARK";
    case 0x2e:
        return "STOP";
    case 0x30:
        return "POP";
    case 0x31:
        return "POP_MARK";
    case 0x32:
        return "DUP";
    case 0x46:
        return "FLOAT";
    case 0x49:
        return "INT";
    case 0x4a:
        return "BININT";
    case 0x4b:
        return "BININT1";
    case 0x4c:
        return "LONG";
    case 0x4d:
        return "BININT2";
    case 0x4e:
        return "NONE";
    case 0x50:
        return "PERSID";
    case 0x51:
        return "BINPERSID";
    case 0x52:
        return "REDUCE";
    case 0x53:
        return "STRING";
    case 0x54:
        return "BINSTRING";
    case 0x55:
        return "SHORT_BINSTRING";
    case 0x56:
        return "UNICODE";
    case 0x58:
        return "BINUNICODE";
    case 0x61:
        return "APPEND";
    case 0x62:
        return "BUILD";
    case 0x63:
        return "GLOBAL";
    case 0x64:
        return "DICT";
    case 0x7d:
        return "EMPTY_DICT";
    case 0x65:
        return "APPENDS";
    case 0x67:
        return "GET";
    case 0x68:
        return "BINGET";
    case 0x69:
        return "INST";
    case 0x6a:
        return "LONG_BINGET";
    case 0x6c:
        return "LIST";
    case 0x5d:
        return "EMPTY_LIST";
    case 0x6f:
        return "OBJ";
    case 0x70:
        return "PUT";
    case 0x71:
        return "BINPUT";
    case 0x72:
        return "LONG_BINPUT";
    case 0x73:
        return "SETITEM";
    case 0x74:
        return "TUPLE";
    case 0x29:
        return "EMPTY_TUPLE";
    case 0x75:
        return "SETITEMS";
    case 0x47:
        return "BINFLOAT";
    case 0x80:
        return "PROTO";
    case 0x81:
        return "NEWOBJ";
    case 0x82:
        return "EXT1";
    case 0x83:
        return "EXT2";
    case 0x84:
        return "EXT4";
    case 0x85:
        return "TUPLE1";
    case 0x86:
        return "TUPLE2";
    case 0x87:
        return "TUPLE3";
    case 0x88:
        return "NEWTRUE";
    case 0x89:
        return "NEWFALSE";
    case 0x8a:
        return "LONG1";
    case 0x8b:
        return "LONG4";
    case 0x42:
        return "BINBYTES";
    case 0x43:
        return "SHORT_BINBYTES";
    case 0x8c:
        return "SHORT_BINUNICODE";
    case 0x8d:
        return "BINUNICODE8";
    case 0x8e:
        return "BINBYTES8";
    case 0x8f:
        return "EMPTY_SET";
    case 0x90:
        return "ADDITEMS";
    case 0x91:
        return "FROZENSET";
    case 0x92:
        return "NEWOBJ_EX";
    case 0x93:
        return "STACK_GLOBAL";
    case 0x94:
        return "MEMOIZE";
    case 0x95:
        return "FRAME";
    case 0x96:
        return "BYTEARRAY8";
    case 0x97:
        return "NEXT_BUFFER";
    case 0x98:
        return "READONLY_BUFFER";
    }
    return NULL;
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static ct_status
pfail(pk_machine *m, ct_status code, const char *rule, const char *fmt, ...)
{
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *on = op_name(m->op);
    char opbuf[32];
    if (!on) {
        snprintf(opbuf, sizeof opbuf, "0x%02x", m->op);
        on = opbuf;
    }
    return ct_error(code, "pt [pickle-%s]: %s: %s (opcode %s at pickle byte %zu)", rule, m->label,
                    msg, on, m->pos);
}

const char *ct_pk_kind_name(const pk_obj *o)
{
    if (!o) return "nothing";
    switch ((pk_kind)o->kind) {
    case PK_NONE:
        return "None";
    case PK_BOOL:
        return "a bool";
    case PK_INT:
        return "an int";
    case PK_FLOAT:
        return "a float";
    case PK_STR:
        return "a str";
    case PK_BYTES:
        return "bytes";
    case PK_TUPLE:
        return "a tuple";
    case PK_LIST:
        return "a list";
    case PK_DICT:
        return o->flags & PK_F_ORDERED ? "an OrderedDict" : "a dict";
    case PK_SET:
        return "a set";
    case PK_GLOBAL:
        return o->u.global.name;
    case PK_STORAGE:
        return "a storage";
    case PK_TENSOR:
        return "a tensor";
    }
    return "?";
}

static void *arena(pk_machine *m, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    pk_block *b = m->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        pk_block *nb;
        if (ct_alloc((void **)&nb, sizeof *nb + cap) != CT_OK) return NULL;
        nb->next = m->blocks;
        nb->used = 0;
        nb->cap = cap;
        m->blocks = nb;
        /* A big allocation gets its own block; keep filling the previous one. */
        if (n > 65536 / 2 && b) {
            nb->next = b->next;
            b->next = nb;
            m->blocks = b;
            nb->used = n;
            return nb->data;
        }
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

/* Grow an array of elem-size items to hold at least need items. */
static ct_status grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return CT_OK;
    size_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *p = NULL;
    CT_TRY(ct_alloc(&p, nc * elem));
    if (*cap) memcpy(p, *arr, *cap * elem);
    ct_free(*arr);
    *arr = p;
    *cap = nc;
    return CT_OK;
}

ct_status ct_pk_make(pk_machine *m, pk_kind kind, pk_obj **out)
{
    if (m->nobjs >= PK_MAX_OBJECTS)
        return pfail(m, CT_EFORMAT, "limit",
                     "the pickle creates more than %u objects (a state dict needs a few per "
                     "tensor)",
                     PK_MAX_OBJECTS);
    CT_TRY(grow((void **)&m->objs, &m->cap_objs, m->nobjs + 1, sizeof *m->objs));
    pk_obj *o = arena(m, sizeof *o);
    if (!o) return ct_error(CT_ENOMEM, "pt: %s: out of memory unpickling", m->label);
    memset(o, 0, sizeof *o);
    o->kind = (uint8_t)kind;
    m->objs[m->nobjs++] = o;
    *out = o;
    return CT_OK;
}

ct_status ct_pk_new(const char *label, pk_persistent_fn persistent, void *ctx, pk_machine **out)
{
    pk_machine *m;
    CT_TRY(ct_calloc((void **)&m, sizeof *m));
    m->label = label;
    m->persistent = persistent;
    m->ctx = ctx;
    *out = m;
    return CT_OK;
}

void ct_pk_free(pk_machine *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->nobjs; i++) {
        pk_obj *o = m->objs[i];
        if (o->kind == PK_TUPLE || o->kind == PK_LIST || o->kind == PK_DICT || o->kind == PK_SET)
            ct_free(o->u.seq.items);
    }
    ct_free(m->objs);
    ct_free(m->stack);
    ct_free(m->marks);
    ct_free(m->memo);
    for (pk_block *b = m->blocks; b;) {
        pk_block *n = b->next;
        ct_free(b);
        b = n;
    }
    ct_free(m);
}

/* ---- stack, marks, memo --------------------------------------------------------------- */

static ct_status push(pk_machine *m, pk_obj *o)
{
    CT_TRY(grow((void **)&m->stack, &m->cap_stack, m->sp + 1, sizeof *m->stack));
    m->stack[m->sp++] = o;
    return CT_OK;
}

static size_t floor_sp(const pk_machine *m)
{
    return m->nmarks ? m->marks[m->nmarks - 1] : 0;
}

static ct_status pop(pk_machine *m, pk_obj **o)
{
    if (m->sp <= floor_sp(m))
        return pfail(m, CT_EFORMAT, "stack", "pops from an empty stack (or past a MARK)");
    *o = m->stack[--m->sp];
    return CT_OK;
}

static ct_status top(pk_machine *m, pk_obj **o)
{
    if (m->sp <= floor_sp(m))
        return pfail(m, CT_EFORMAT, "stack", "needs an object but the stack is empty");
    *o = m->stack[m->sp - 1];
    return CT_OK;
}

/* Items pushed since the last MARK: *items, *n; the mark is removed (the items stay on the
 * stack above m->sp, valid until the next push). */
static ct_status pop_mark(pk_machine *m, pk_obj ***items, size_t *n)
{
    if (!m->nmarks) return pfail(m, CT_EFORMAT, "stack", "needs a MARK but none is open");
    size_t at = m->marks[--m->nmarks];
    *items = m->stack ? m->stack + at : NULL; /* nothing was ever pushed: no items */
    *n = m->sp - at;
    m->sp = at;
    return CT_OK;
}

static ct_status seq_add(pk_obj *c, pk_obj *o)
{
    CT_TRY(grow((void **)&c->u.seq.items, &c->u.seq.cap, c->u.seq.n + 1, sizeof(pk_obj *)));
    c->u.seq.items[c->u.seq.n++] = o;
    return CT_OK;
}

static ct_status make_seq(pk_machine *m, pk_kind kind, pk_obj **items, size_t n, pk_obj **out)
{
    pk_obj *o = NULL;
    CT_TRY(ct_pk_make(m, kind, &o));
    if (n) {
        CT_TRY(grow((void **)&o->u.seq.items, &o->u.seq.cap, n, sizeof(pk_obj *)));
        memcpy(o->u.seq.items, items, n * sizeof *items);
        o->u.seq.n = n;
    }
    *out = o;
    return CT_OK;
}

/* The memo's slot for a key: the key (the pickle's choice, 32 bits) mixed with a seed taken
 * from the table's first address, so no set of keys is known ahead of time to share a slot (a
 * bare multiply kept the low bits, and keys equal modulo the table's size made every lookup
 * linear: a quadratic load). */
static size_t memo_hash(const pk_machine *m, uint32_t key)
{
    uint64_t h = (uint64_t)key ^ m->memo_seed;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return (size_t)h;
}

static memo_slot *memo_find(pk_machine *m, uint32_t key)
{
    if (!m->memo_cap) return NULL;
    size_t mask = m->memo_cap - 1, h = memo_hash(m, key) & mask;
    while (m->memo[h].used) {
        if (m->memo[h].key == key) return &m->memo[h];
        h = (h + 1) & mask;
    }
    return NULL;
}

static ct_status memo_put(pk_machine *m, uint32_t key, pk_obj *o)
{
    memo_slot *s = memo_find(m, key);
    if (s) {
        s->obj = o;
        return CT_OK;
    }
    if ((m->memo_used + 1) * 2 > m->memo_cap) { /* rehash into twice the slots */
        size_t nc = m->memo_cap ? m->memo_cap * 2 : 64;
        memo_slot *old = m->memo, *nm;
        size_t oc = m->memo_cap;
        CT_TRY(ct_calloc((void **)&nm, nc * sizeof *nm));
        if (!oc) m->memo_seed = (uint64_t)(uintptr_t)nm * 0x9e3779b97f4a7c15ull;
        m->memo = nm;
        m->memo_cap = nc;
        for (size_t i = 0; i < oc; i++)
            if (old[i].used) {
                size_t h = memo_hash(m, old[i].key) & (nc - 1);
                while (nm[h].used)
                    h = (h + 1) & (nc - 1);
                nm[h] = old[i];
            }
        ct_free(old);
    }
    size_t mask = m->memo_cap - 1, h = memo_hash(m, key) & mask;
    while (m->memo[h].used)
        h = (h + 1) & mask;
    m->memo[h] = (memo_slot){key, true, o};
    m->memo_used++;
    return CT_OK;
}

/* ---- the allow-listed callables ------------------------------------------------------- */

static bool is_int(const pk_obj *o)
{
    return o && (o->kind == PK_INT || o->kind == PK_BOOL);
}

static int64_t int_of(const pk_obj *o)
{
    return o->kind == PK_BOOL ? o->u.b : o->u.i;
}

/* A tuple (or list) of non-negative ints: *dims (arena) and *n. */
static ct_status int_tuple(pk_machine *m, const pk_obj *o, const char *what, int64_t **dims, int *n)
{
    if (!o || (o->kind != PK_TUPLE && o->kind != PK_LIST))
        return pfail(m, CT_EFORMAT, "reduce", "a tensor's %s must be a tuple of ints, found %s",
                     what, ct_pk_kind_name(o));
    if (o->u.seq.n > PK_MAX_DIMS)
        return pfail(m, CT_EFORMAT, "limit", "a tensor's %s has %zu dims (at most %d)", what,
                     o->u.seq.n, PK_MAX_DIMS);
    int64_t *d = arena(m, (o->u.seq.n + 1) * sizeof *d);
    if (!d) return ct_error(CT_ENOMEM, "pt: %s: out of memory unpickling", m->label);
    for (size_t i = 0; i < o->u.seq.n; i++) {
        const pk_obj *v = o->u.seq.items[i];
        if (!is_int(v) || int_of(v) < 0)
            return pfail(m, CT_EFORMAT, "reduce",
                         "a tensor's %s[%zu] must be an int >= 0, found %s%s", what, i,
                         ct_pk_kind_name(v), is_int(v) ? " below 0" : "");
        d[i] = int_of(v);
    }
    *dims = d;
    *n = (int)o->u.seq.n;
    return CT_OK;
}

static ct_status rebuild_tensor(pk_machine *m, pk_obj **a, size_t n, int version, pk_obj **out)
{
    bool v2 = version >= 2, v3 = version == 3;
    const char *fn = v3   ? "torch._utils._rebuild_tensor_v3"
                     : v2 ? "torch._utils._rebuild_tensor_v2"
                          : "torch._utils._rebuild_tensor";
    if (v3 ? (n != 7 && n != 8) : v2 ? (n != 6 && n != 7) : n != 4)
        return pfail(m, CT_EFORMAT, "reduce", "%s takes %s arguments, got %zu", fn,
                     v3 ? "7 or 8" : v2 ? "6 or 7" : "4", n);
    if (a[0]->kind != PK_STORAGE)
        return pfail(m, CT_EFORMAT, "reduce", "%s's storage argument is %s, not a storage", fn,
                     ct_pk_kind_name(a[0]));
    if (!is_int(a[1]) || int_of(a[1]) < 0)
        return pfail(m, CT_EFORMAT, "reduce", "%s's storage offset must be an int >= 0", fn);
    pk_tensor *t = arena(m, sizeof *t);
    if (!t) return ct_error(CT_ENOMEM, "pt: %s: out of memory unpickling", m->label);
    memset(t, 0, sizeof *t);
    int ns = 0;
    CT_TRY(int_tuple(m, a[2], "size", &t->shape, &t->ndim));
    CT_TRY(int_tuple(m, a[3], "stride", &t->strides, &ns));
    if (ns != t->ndim)
        return pfail(m, CT_EFORMAT, "reduce", "%s: %d sizes but %d strides", fn, t->ndim, ns);
    if (v2) {
        if (a[4]->kind != PK_BOOL)
            return pfail(m, CT_EFORMAT, "reduce", "%s's requires_grad must be a bool, found %s", fn,
                         ct_pk_kind_name(a[4]));
        if (a[5]->kind != PK_DICT && a[5]->kind != PK_NONE)
            return pfail(m, CT_EFORMAT, "reduce", "%s's backward_hooks must be a dict, found %s",
                         fn, ct_pk_kind_name(a[5]));
        if (a[5]->kind == PK_DICT && a[5]->u.seq.n)
            return pfail(m, CT_EFORMAT, "reduce",
                         "%s: a tensor with backward hooks (torch never saves hooks)", fn);
        size_t meta = v3 ? 7 : 6;
        if (n == meta + 1 && a[meta]->kind != PK_NONE && a[meta]->kind != PK_DICT)
            return pfail(m, CT_EFORMAT, "reduce", "%s's metadata must be None or a dict", fn);
        if (v3) {
            if (a[6]->kind != PK_GLOBAL || a[6]->u.global.id != PKG_DTYPE)
                return pfail(m, CT_EFORMAT, "reduce", "%s's dtype is %s, not a torch dtype", fn,
                             ct_pk_kind_name(a[6]));
            t->has_dtype = true;
            t->dtype = a[6]->u.global.arg;
        }
        t->requires_grad = a[4]->u.b;
    }
    t->storage = a[0]->u.storage;
    t->offset = (uint64_t)int_of(a[1]);
    pk_obj *o = NULL;
    CT_TRY(ct_pk_make(m, PK_TENSOR, &o));
    o->u.tensor = t;
    *out = o;
    return CT_OK;
}

static ct_status make_parameter(pk_machine *m, const char *fn, pk_obj **a, size_t n, size_t min,
                                size_t max, pk_obj **out)
{
    if (n < min || n > max)
        return pfail(m, CT_EFORMAT, "reduce", "%s takes %zu to %zu arguments, got %zu", fn, min,
                     max, n);
    if (n == 0 || a[0]->kind != PK_TENSOR)
        return pfail(m, CT_EFORMAT, "reduce", "%s's data must be a tensor, found %s", fn,
                     n ? ct_pk_kind_name(a[0]) : "nothing");
    if (n > 1 && a[1]->kind != PK_BOOL)
        return pfail(m, CT_EFORMAT, "reduce", "%s's requires_grad must be a bool, found %s", fn,
                     ct_pk_kind_name(a[1]));
    if (n > 2 && a[2]->kind != PK_DICT)
        return pfail(m, CT_EFORMAT, "reduce", "%s's backward_hooks must be a dict, found %s", fn,
                     ct_pk_kind_name(a[2]));
    pk_tensor *t = arena(m, sizeof *t);
    if (!t) return ct_error(CT_ENOMEM, "pt: %s: out of memory unpickling", m->label);
    *t = *a[0]->u.tensor;
    t->parameter = true;
    t->requires_grad = n > 1 ? a[1]->u.b : true;
    pk_obj *o = NULL;
    CT_TRY(ct_pk_make(m, PK_TENSOR, &o));
    o->u.tensor = t;
    *out = o;
    return CT_OK;
}

/* REDUCE of func with args (a tuple). */
static ct_status reduce(pk_machine *m, pk_obj *func, pk_obj *args, pk_obj **out)
{
    if (func->kind != PK_GLOBAL)
        return pfail(m, CT_EFORMAT, "reduce", "calls %s, which is not an allowed callable",
                     ct_pk_kind_name(func));
    if (args->kind != PK_TUPLE)
        return pfail(m, CT_EFORMAT, "reduce", "the arguments of %s are %s, not a tuple",
                     func->u.global.name, ct_pk_kind_name(args));
    pk_obj **a = args->u.seq.items;
    size_t n = args->u.seq.n;
    switch ((pk_global_id)func->u.global.id) {
    case PKG_ORDERED_DICT:
        if (n != 0)
            return pfail(m, CT_EFORMAT, "reduce",
                         "collections.OrderedDict is called with %zu arguments (torch.save "
                         "writes none)",
                         n);
        CT_TRY(ct_pk_make(m, PK_DICT, out));
        (*out)->flags = PK_F_ORDERED;
        return CT_OK;
    case PKG_REBUILD_TENSOR_V3:
        return rebuild_tensor(m, a, n, 3, out);
    case PKG_REBUILD_TENSOR_V2:
        return rebuild_tensor(m, a, n, 2, out);
    case PKG_REBUILD_TENSOR:
        return rebuild_tensor(m, a, n, 1, out);
    case PKG_REBUILD_PARAMETER:
        return make_parameter(m, "torch._utils._rebuild_parameter", a, n, 3, 3, out);
    case PKG_PARAMETER:
        return make_parameter(m, "torch.nn.parameter.Parameter", a, n, 0, 2, out);
    case PKG_SIZE:
        if (n != 1 || (a[0]->kind != PK_TUPLE && a[0]->kind != PK_LIST))
            return pfail(m, CT_EFORMAT, "reduce", "torch.Size takes one tuple of ints");
        for (size_t i = 0; i < a[0]->u.seq.n; i++)
            if (!is_int(a[0]->u.seq.items[i]))
                return pfail(m, CT_EFORMAT, "reduce", "torch.Size takes one tuple of ints");
        return make_seq(m, PK_TUPLE, a[0]->u.seq.items, a[0]->u.seq.n, out);
    case PKG_REBUILD_SPARSE_TENSOR:
    case PKG_REBUILD_SPARSE_CSR_TENSOR:
        return pfail(m, CT_EUNSUPPORTED, "unsupported",
                     "%s: sparse tensors are allowed by weights_only but ctorch has no sparse "
                     "tensors",
                     func->u.global.name);
    case PKG_REBUILD_META_TENSOR:
        return pfail(m, CT_EUNSUPPORTED, "unsupported", "%s: meta tensors have no data to load",
                     func->u.global.name);
    default:
        return pfail(m, CT_EUNSUPPORTED, "unsupported",
                     "calling %s is allowed by weights_only, but torch.save never writes it "
                     "for a tensor and ctorch does not model it",
                     func->u.global.name);
    }
}

/* ---- reading -------------------------------------------------------------------------- */

typedef struct rd {
    const uint8_t *p;
    size_t n, i;
} rd;

static ct_status need(pk_machine *m, const rd *r, uint64_t k)
{
    if (k > r->n - r->i)
        return pfail(m, CT_EFORMAT, "truncated",
                     "needs %llu more bytes but the pickle ends after %zu", (unsigned long long)k,
                     r->n - r->i);
    return CT_OK;
}

static uint64_t le(const uint8_t *p, int k)
{
    uint64_t v = 0;
    for (int i = k - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static ct_status make_str(pk_machine *m, pk_kind kind, const uint8_t *s, size_t n, pk_obj **out)
{
    if (kind == PK_STR && !ct_io_utf8_valid(s, n, NULL))
        return pfail(m, CT_EFORMAT, "utf8", "a string of %zu bytes is not valid UTF-8", n);
    pk_obj *o = NULL;
    CT_TRY(ct_pk_make(m, kind, &o));
    char *c = arena(m, n + 1);
    if (!c) return ct_error(CT_ENOMEM, "pt: %s: out of memory unpickling", m->label);
    memcpy(c, s, n);
    c[n] = '\0';
    o->u.str.s = c;
    o->u.str.n = n;
    *out = o;
    return CT_OK;
}

/* A text line of GLOBAL / INST (ends with '\n', at most 256 bytes, printable ASCII). */
static ct_status line(pk_machine *m, rd *r, char *buf)
{
    size_t k = 0;
    while (true) {
        if (r->i >= r->n)
            return pfail(m, CT_EFORMAT, "truncated", "a module or name line is not terminated");
        uint8_t c = r->p[r->i++];
        if (c == '\n') break;
        if (c < 0x20 || c > 0x7e || k >= 256)
            return pfail(m, CT_EFORMAT, "global",
                         "a module or name is not a short printable ASCII line");
        buf[k++] = (char)c;
    }
    buf[k] = '\0';
    return CT_OK;
}

static ct_status global(pk_machine *m, const char *mod, const char *name)
{
    pk_global_id id;
    uint16_t arg;
    char q1[96], q2[96];
    if (!allowed_global(mod, name, &id, &arg))
        return pfail(m, CT_EFORMAT, "global",
                     "global '%s.%s' is not allowed (only the weights_only allow-list: tensor "
                     "rebuilds, torch storages and dtypes, collections.OrderedDict, ...); "
                     "nothing was run",
                     ct_io_quote(q1, sizeof q1, mod), ct_io_quote(q2, sizeof q2, name));
    pk_obj *o = NULL;
    CT_TRY(ct_pk_make(m, PK_GLOBAL, &o));
    size_t nl = strlen(mod) + strlen(name) + 2;
    char *full = arena(m, nl);
    if (!full) return ct_error(CT_ENOMEM, "pt: %s: out of memory unpickling", m->label);
    snprintf(full, nl, "%s.%s", mod, name);
    o->u.global.id = (uint8_t)id;
    o->u.global.arg = arg;
    o->u.global.name = full;
    return push(m, o);
}

ct_status ct_pk_run(pk_machine *m, const uint8_t *p, size_t n, size_t *used, pk_obj **out)
{
    rd r = {p, n, 0};
    m->sp = 0;
    m->nmarks = 0;
    *out = NULL;
    size_t frame_end = 0; /* end of the current FRAME (0: none) */
    while (true) {
        if (r.i >= r.n) {
            m->op = 0;
            m->pos = r.i;
            return pfail(m, CT_EFORMAT, "truncated", "the pickle ends before its STOP");
        }
        if (frame_end && r.i > frame_end)
            return pfail(m, CT_EFORMAT, "frame", "an opcode runs past the end of its FRAME");
        m->pos = r.i;
        uint8_t op = m->op = r.p[r.i++];
        pk_obj *o = NULL, *a = NULL, *b = NULL, **items = NULL;
        size_t k = 0;
        uint64_t len;
        switch (op) {
        case 0x80: /* PROTO */
            CT_TRY(need(m, &r, 1));
            if (r.p[r.i] < 2 || r.p[r.i] > 5)
                return pfail(m, CT_EFORMAT, "opcode", "pickle protocol %u (2 to 5 are read)",
                             r.p[r.i]);
            r.i++;
            break;
        case 0x95: /* FRAME */
            CT_TRY(need(m, &r, 8));
            len = le(r.p + r.i, 8);
            r.i += 8;
            if (len > r.n - r.i)
                return pfail(m, CT_EFORMAT, "frame",
                             "a FRAME of %llu bytes runs past the end of the pickle (%zu bytes "
                             "left): truncated",
                             (unsigned long long)len, r.n - r.i);
            frame_end = r.i + (size_t)len;
            break;
        case 0x2e: /* STOP */
            if (m->nmarks)
                return pfail(m, CT_EFORMAT, "stack", "STOP with %zu MARKs still open", m->nmarks);
            if (m->sp != 1)
                return pfail(m, CT_EFORMAT, "stack",
                             "STOP with %zu objects on the stack (1 "
                             "expected)",
                             m->sp);
            *out = m->stack[0];
            m->sp = 0;
            *used = r.i;
            return CT_OK;
        case 0x28: /* MARK */
            if (m->nmarks >= PK_MAX_MARKS)
                return pfail(m, CT_EFORMAT, "depth", "more than %d MARKs open at once",
                             PK_MAX_MARKS);
            CT_TRY(grow((void **)&m->marks, &m->cap_marks, m->nmarks + 1, sizeof *m->marks));
            m->marks[m->nmarks++] = m->sp;
            break;
        case 0x30: /* POP */
            if (m->sp > floor_sp(m))
                m->sp--;
            else
                CT_TRY(pop_mark(m, &items, &k)); /* POP of a MARK, as CPython does */
            break;
        case 0x31: /* POP_MARK */
            CT_TRY(pop_mark(m, &items, &k));
            break;
        case 0x32: /* DUP */
            CT_TRY(top(m, &o));
            CT_TRY(push(m, o));
            break;
        case 0x4e: /* NONE */
            CT_TRY(ct_pk_make(m, PK_NONE, &o));
            CT_TRY(push(m, o));
            break;
        case 0x88: /* NEWTRUE */
        case 0x89: /* NEWFALSE */
            CT_TRY(ct_pk_make(m, PK_BOOL, &o));
            o->u.b = op == 0x88;
            CT_TRY(push(m, o));
            break;
        case 0x4a: /* BININT */
        case 0x4b: /* BININT1 */
        case 0x4d: /* BININT2 */
            k = op == 0x4a ? 4 : op == 0x4b ? 1 : 2;
            CT_TRY(need(m, &r, k));
            CT_TRY(ct_pk_make(m, PK_INT, &o));
            o->u.i = op == 0x4a ? (int64_t)(int32_t)(uint32_t)le(r.p + r.i, 4)
                                : (int64_t)le(r.p + r.i, (int)k);
            r.i += k;
            CT_TRY(push(m, o));
            break;
        case 0x8a: /* LONG1 */
        case 0x8b: /* LONG4 */
            CT_TRY(need(m, &r, op == 0x8a ? 1 : 4));
            len = op == 0x8a ? r.p[r.i] : le(r.p + r.i, 4);
            r.i += op == 0x8a ? 1 : 4;
            CT_TRY(need(m, &r, len));
            if (len > 8)
                return pfail(m, CT_EFORMAT, "limit",
                             "an integer of %llu bytes does not fit 64 bits",
                             (unsigned long long)len);
            CT_TRY(ct_pk_make(m, PK_INT, &o));
            if (len) {
                uint64_t v = le(r.p + r.i, (int)len);
                if (len < 8 && (r.p[r.i + len - 1] & 0x80)) v |= ~(uint64_t)0 << (8 * len);
                o->u.i = (int64_t)v;
            }
            r.i += (size_t)len;
            CT_TRY(push(m, o));
            break;
        case 0x47: /* BINFLOAT, big-endian */
            CT_TRY(need(m, &r, 8));
            {
                uint64_t v = 0;
                for (int i = 0; i < 8; i++)
                    v = v << 8 | r.p[r.i + i];
                double d;
                memcpy(&d, &v, 8);
                CT_TRY(ct_pk_make(m, PK_FLOAT, &o));
                o->u.f = d;
            }
            r.i += 8;
            CT_TRY(push(m, o));
            break;
        case 0x58: /* BINUNICODE */
        case 0x8c: /* SHORT_BINUNICODE */
        case 0x8d: /* BINUNICODE8 */
        case 0x55: /* SHORT_BINSTRING */
        case 0x54: /* BINSTRING */
        case 0x43: /* SHORT_BINBYTES */
        case 0x42: /* BINBYTES */
        case 0x8e: /* BINBYTES8 */
        case 0x96: /* BYTEARRAY8 */
            k = (op == 0x8c || op == 0x55 || op == 0x43)   ? 1
                : (op == 0x8d || op == 0x8e || op == 0x96) ? 8
                                                           : 4;
            CT_TRY(need(m, &r, k));
            len = le(r.p + r.i, (int)k);
            r.i += k;
            if (op == 0x54 && len > 0x7fffffffu)
                return pfail(m, CT_EFORMAT, "limit", "a BINSTRING of negative length");
            CT_TRY(need(m, &r, len));
            CT_TRY(make_str(m, (op == 0x58 || op == 0x8c || op == 0x8d) ? PK_STR : PK_BYTES,
                            r.p + r.i, (size_t)len, &o));
            r.i += (size_t)len;
            CT_TRY(push(m, o));
            break;
        case 0x29: /* EMPTY_TUPLE */
            CT_TRY(make_seq(m, PK_TUPLE, NULL, 0, &o));
            CT_TRY(push(m, o));
            break;
        case 0x85: /* TUPLE1 */
        case 0x86: /* TUPLE2 */
        case 0x87: /* TUPLE3 */
            k = (size_t)(op - 0x84);
            if (m->sp < floor_sp(m) + k)
                return pfail(m, CT_EFORMAT, "stack", "needs %zu objects on the stack", k);
            CT_TRY(make_seq(m, PK_TUPLE, m->stack + m->sp - k, k, &o));
            m->sp -= k;
            CT_TRY(push(m, o));
            break;
        case 0x74: /* TUPLE */
        case 0x6c: /* LIST */
        case 0x91: /* FROZENSET */
            CT_TRY(pop_mark(m, &items, &k));
            CT_TRY(make_seq(m,
                            op == 0x74   ? PK_TUPLE
                            : op == 0x6c ? PK_LIST
                                         : PK_SET,
                            items, k, &o));
            CT_TRY(push(m, o));
            break;
        case 0x5d: /* EMPTY_LIST */
        case 0x7d: /* EMPTY_DICT */
        case 0x8f: /* EMPTY_SET */
            CT_TRY(make_seq(m, op == 0x5d ? PK_LIST : op == 0x7d ? PK_DICT : PK_SET, NULL, 0, &o));
            CT_TRY(push(m, o));
            break;
        case 0x64: /* DICT */
            CT_TRY(pop_mark(m, &items, &k));
            if (k % 2)
                return pfail(m, CT_EFORMAT, "stack", "DICT of an odd number (%zu) of objects", k);
            CT_TRY(make_seq(m, PK_DICT, items, k, &o));
            CT_TRY(push(m, o));
            break;
        case 0x61: /* APPEND */
            CT_TRY(pop(m, &a));
            CT_TRY(top(m, &o));
            if (o->kind != PK_LIST)
                return pfail(m, CT_EFORMAT, "type", "APPEND to %s (only lists)",
                             ct_pk_kind_name(o));
            CT_TRY(seq_add(o, a));
            break;
        case 0x65: /* APPENDS */
        case 0x90: /* ADDITEMS */
            CT_TRY(pop_mark(m, &items, &k));
            CT_TRY(top(m, &o));
            if (o->kind != (op == 0x65 ? PK_LIST : PK_SET))
                return pfail(m, CT_EFORMAT, "type", "%s to %s (only %s)", op_name(op),
                             ct_pk_kind_name(o), op == 0x65 ? "lists" : "sets");
            for (size_t i = 0; i < k; i++)
                CT_TRY(seq_add(o, items[i]));
            break;
        case 0x73: /* SETITEM */
            CT_TRY(pop(m, &b));
            CT_TRY(pop(m, &a));
            CT_TRY(top(m, &o));
            if (o->kind != PK_DICT)
                return pfail(m, CT_EFORMAT, "type", "SETITEM on %s (only dicts)",
                             ct_pk_kind_name(o));
            CT_TRY(seq_add(o, a));
            CT_TRY(seq_add(o, b));
            break;
        case 0x75: /* SETITEMS */
            CT_TRY(pop_mark(m, &items, &k));
            CT_TRY(top(m, &o));
            if (o->kind != PK_DICT)
                return pfail(m, CT_EFORMAT, "type", "SETITEMS on %s (only dicts)",
                             ct_pk_kind_name(o));
            if (k % 2)
                return pfail(m, CT_EFORMAT, "stack", "SETITEMS of an odd number (%zu) of objects",
                             k);
            for (size_t i = 0; i < k; i++)
                CT_TRY(seq_add(o, items[i]));
            break;
        case 0x71: /* BINPUT */
        case 0x72: /* LONG_BINPUT */
        case 0x94: /* MEMOIZE */
            k = op == 0x71 ? 1 : op == 0x72 ? 4 : 0;
            CT_TRY(need(m, &r, k));
            len = k ? le(r.p + r.i, (int)k) : m->memo_used;
            r.i += k;
            if (len > 0xffffffffu)
                return pfail(m, CT_EFORMAT, "memo", "the memo holds 2^32 entries");
            CT_TRY(top(m, &o));
            CT_TRY(memo_put(m, (uint32_t)len, o));
            break;
        case 0x68: /* BINGET */
        case 0x6a: /* LONG_BINGET */
            k = op == 0x68 ? 1 : 4;
            CT_TRY(need(m, &r, k));
            len = le(r.p + r.i, (int)k);
            r.i += k;
            {
                memo_slot *s = memo_find(m, (uint32_t)len);
                if (!s)
                    return pfail(m, CT_EFORMAT, "memo", "memo entry %llu was never stored",
                                 (unsigned long long)len);
                CT_TRY(push(m, s->obj));
            }
            break;
        case 0x63: /* GLOBAL */
        {
            char mod[260], name[260];
            CT_TRY(line(m, &r, mod));
            CT_TRY(line(m, &r, name));
            CT_TRY(global(m, mod, name));
            break;
        }
        case 0x93: /* STACK_GLOBAL */
            CT_TRY(pop(m, &b));
            CT_TRY(pop(m, &a));
            if (a->kind != PK_STR || b->kind != PK_STR || a->u.str.n > 256 || b->u.str.n > 256)
                return pfail(m, CT_EFORMAT, "global",
                             "STACK_GLOBAL needs two short strings, found %s and %s",
                             ct_pk_kind_name(a), ct_pk_kind_name(b));
            /* a NUL inside would end the C string early: "torch\0x" would be looked up as
             * "torch" (Python resolves the whole string and finds no such module) */
            for (int w = 0; w < 2; w++) {
                const pk_obj *sv = w ? b : a;
                const char *nul = memchr(sv->u.str.s, '\0', sv->u.str.n);
                if (nul) {
                    char q1[96], q2[96];
                    return pfail(m, CT_EFORMAT, "global",
                                 "STACK_GLOBAL %s '%s\\x00%s' holds a NUL byte (at %zu of its %zu "
                                 "bytes): no module or name has one; nothing was run",
                                 w ? "name" : "module", ct_io_quote(q1, sizeof q1, sv->u.str.s),
                                 ct_io_quote(q2, sizeof q2, nul + 1),
                                 (size_t)(nul - sv->u.str.s), sv->u.str.n);
                }
            }
            CT_TRY(global(m, a->u.str.s, b->u.str.s));
            break;
        case 0x52: /* REDUCE */
            CT_TRY(pop(m, &a));
            CT_TRY(top(m, &o));
            CT_TRY(reduce(m, o, a, &b));
            m->stack[m->sp - 1] = b;
            break;
        case 0x81: /* NEWOBJ */
            CT_TRY(pop(m, &a));
            CT_TRY(pop(m, &o));
            if (o->kind != PK_GLOBAL || o->u.global.id != PKG_PARAMETER)
                return pfail(m, CT_EFORMAT, "newobj",
                             "NEWOBJ of %s (only torch.nn.parameter.Parameter may be "
                             "instantiated)",
                             ct_pk_kind_name(o));
            if (a->kind != PK_TUPLE)
                return pfail(m, CT_EFORMAT, "newobj", "NEWOBJ arguments are %s, not a tuple",
                             ct_pk_kind_name(a));
            CT_TRY(make_parameter(m, "torch.nn.parameter.Parameter", a->u.seq.items, a->u.seq.n, 0,
                                  2, &b));
            CT_TRY(push(m, b));
            break;
        case 0x62: /* BUILD */
            CT_TRY(pop(m, &a));
            CT_TRY(top(m, &o));
            if (o->kind == PK_DICT && (o->flags & PK_F_ORDERED)) {
                /* OrderedDict attributes (a state dict's _metadata): kept out of the tensors */
                if (a->kind != PK_DICT && a->kind != PK_NONE)
                    return pfail(m, CT_EFORMAT, "build",
                                 "BUILD of an OrderedDict with %s (a dict of attributes "
                                 "expected)",
                                 ct_pk_kind_name(a));
            } else if (o->kind == PK_TENSOR) {
                bool empty = a->kind == PK_NONE ||
                             ((a->kind == PK_DICT || a->kind == PK_TUPLE) && a->u.seq.n == 0);
                if (!empty)
                    return pfail(m, CT_EFORMAT, "build",
                                 "BUILD of a tensor with state (%s): tensor attributes are not "
                                 "supported",
                                 ct_pk_kind_name(a));
            } else
                return pfail(m, CT_EFORMAT, "build",
                             "BUILD on %s (only tensors, parameters and OrderedDicts may be "
                             "built)",
                             ct_pk_kind_name(o));
            break;
        case 0x51: /* BINPERSID */
            CT_TRY(pop(m, &a));
            if (!m->persistent)
                return pfail(m, CT_EFORMAT, "persid", "a persistent id where none is expected");
            CT_TRY(m->persistent(m->ctx, a, &b));
            CT_TRY(push(m, b));
            break;
        case 0x69: /* INST */
        {
            char mod[260], name[260];
            CT_TRY(line(m, &r, mod));
            CT_TRY(line(m, &r, name));
            return pfail(m, CT_EFORMAT, "opcode", "INST of '%s.%s' is refused; nothing was run",
                         mod, name);
        }
        case 0x6f: /* OBJ */
        case 0x92: /* NEWOBJ_EX */
            return pfail(m, CT_EFORMAT, "opcode",
                         "%s (instantiating a class) is refused; nothing was run", op_name(op));
        case 0x82: /* EXT1 */
        case 0x83: /* EXT2 */
        case 0x84: /* EXT4 */
            return pfail(m, CT_EFORMAT, "opcode",
                         "%s (a global from the copyreg extension registry) is refused",
                         op_name(op));
        default:
            if (op_name(op))
                return pfail(m, CT_EFORMAT, "opcode",
                             "opcode %s is not supported (torch.save writes binary pickles of "
                             "protocol 2)",
                             op_name(op));
            return pfail(m, CT_EFORMAT, "opcode", "byte 0x%02x is not a pickle opcode", op);
        }
    }
}
