/* PyTorch checkpoints: torch.save zip archives and the legacy (non-zip) format, read with
 * the strict zip reader (zip.c) and the restricted unpickler (pickle.c), into the same
 * tables as a safetensors file: tensors are views into storages that stay in the mapping
 * (byte-swapped copies for big-endian archives), nested containers flatten to dotted names,
 * non-tensor values become metadata as JSON. */
#include "core/internal.h"
#include "core/strmap.h"
#include "io/io_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PT_MAX_ENTRIES (1u << 20)     /* tensors + metadata values after flattening */
#define PT_MAX_VISITS (1u << 24)      /* nodes visited while flattening (shared subtrees) */
#define PT_MAX_META_BYTES (64u << 20) /* JSON text of all metadata values */

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static ct_status
ptfail(ct_status code, const char *label, const char *rule, const char *fmt, ...)
{
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ct_error(code, "pt [%s]: %s: %s", rule, label, msg);
}

/* A storage the pickle referred to. Views (legacy format) point at a root. */
typedef struct st_rec {
    const char *key;
    size_t type; /* index into ct_pk_storage_types */
    uint64_t numel;
    size_t root;       /* itself for a root */
    uint64_t view_off; /* elements into the root */
    const uint8_t *data;
    uint64_t file_offset;
    bool has_data;
    size_t views, next_view; /* index + 1 of a root's first legacy view / of the next one */
} st_rec;

typedef struct pt_ctx {
    const char *label;
    const uint8_t *base;
    size_t size;
    bool legacy, big_endian;
    ct_zip zip;
    char prefix[300]; /* "archive/" */
    pk_machine *m;
    st_rec *st;
    size_t nst, cap_st;
    ct_strmap roots;   /* root storage key -> index into st (open is linear in storages) */
    ct_strmap members; /* zip member name -> index into zip.members */
    /* flattening */
    st_entry *ent;
    size_t nent, cap_ent;
    struct {
        char *key, *val;
    } * meta;
    size_t nmeta, cap_meta;
    uint64_t visits, meta_bytes;
    ct_tensor_file *f;
} pt_ctx;

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

static char *dupstr(const char *s, size_t n)
{
    char *c;
    if (ct_alloc((void **)&c, n + 1) != CT_OK) return NULL;
    memcpy(c, s, n);
    c[n] = '\0';
    return c;
}

/* ---- persistent ids: storages --------------------------------------------------------- */

static const char *str_of(const pk_obj *o)
{
    return o && o->kind == PK_STR ? o->u.str.s : NULL;
}

static ct_status add_storage(pt_ctx *c, const char *key, size_t type, uint64_t numel, size_t *idx)
{
    char q[96];
    size_t i;
    if (ct_strmap_get(&c->roots, key, strlen(key), &i)) {
        if (c->st[i].type != type || c->st[i].numel != numel)
            return ptfail(CT_EFORMAT, c->label, "storage",
                          "storage '%s' is referred to as %s of %llu elements and as %s of "
                          "%llu",
                          ct_io_quote(q, sizeof q, key),
                          ct_pk_storage_types[c->st[i].type].name,
                          (unsigned long long)c->st[i].numel, ct_pk_storage_types[type].name,
                          (unsigned long long)numel);
        *idx = i;
        return CT_OK;
    }
    CT_TRY(grow((void **)&c->st, &c->cap_st, c->nst + 1, sizeof *c->st));
    st_rec *r = &c->st[c->nst];
    memset(r, 0, sizeof *r);
    r->key = key;
    r->type = type;
    r->numel = numel;
    r->root = c->nst;
    CT_TRY(ct_strmap_put(&c->roots, key, strlen(key), c->nst, NULL, NULL));
    *idx = c->nst++;
    return CT_OK;
}

static ct_status persistent(void *ctx, pk_obj *pid, pk_obj **out)
{
    pt_ctx *c = ctx;
    size_t want = c->legacy ? 6 : 5;
    if (pid->kind != PK_TUPLE || pid->u.seq.n < 1)
        return ptfail(CT_EFORMAT, c->label, "pickle-persid",
                      "a persistent id is %s, not a ('storage', ...) tuple", ct_pk_kind_name(pid));
    pk_obj **a = pid->u.seq.items;
    const char *tag = str_of(a[0]);
    if (!tag || strcmp(tag, "storage")) {
        char q[64];
        return ptfail(CT_EFORMAT, c->label, "pickle-persid",
                      "persistent id of kind '%s': only storages are loaded (a legacy 'module' "
                      "entry is a pickled nn.Module class, which weights_only refuses)",
                      tag ? ct_io_quote(q, sizeof q, tag) : ct_pk_kind_name(a[0]));
    }
    if (pid->u.seq.n != want)
        return ptfail(CT_EFORMAT, c->label, "pickle-persid",
                      "a storage persistent id has %zu fields (%zu expected)", pid->u.seq.n, want);
    if (a[1]->kind != PK_GLOBAL || a[1]->u.global.id != PKG_STORAGE_TYPE)
        return ptfail(CT_EFORMAT, c->label, "pickle-persid",
                      "a storage's type is %s, not a torch storage type", ct_pk_kind_name(a[1]));
    size_t type = a[1]->u.global.arg;
    const pk_storage_type *t = &ct_pk_storage_types[type];
    if (!strcmp(t->name, "TypedStorage"))
        return ptfail(CT_EFORMAT, c->label, "pickle-persid",
                      "a storage of type torch.storage.TypedStorage has no dtype");
    const char *key = str_of(a[2]);
    if (!key || !*key || strlen(key) != a[2]->u.str.n || strlen(key) > 200)
        return ptfail(CT_EFORMAT, c->label, "pickle-persid",
                      "a storage key is %s, not a short non-empty string", ct_pk_kind_name(a[2]));
    if (!str_of(a[3]))
        return ptfail(CT_EFORMAT, c->label, "pickle-persid",
                      "a storage location is %s, not a string", ct_pk_kind_name(a[3]));
    if (a[4]->kind != PK_INT || a[4]->u.i < 0)
        return ptfail(CT_EFORMAT, c->label, "pickle-persid",
                      "a storage's element count must be an int >= 0");
    uint64_t numel = (uint64_t)a[4]->u.i, nb;
    if (__builtin_mul_overflow(numel, (uint64_t)t->elem_size, &nb) || nb > c->size) {
        char q[96];
        return ptfail(CT_EFORMAT, c->label, "storage",
                      "storage '%s' claims %llu elements of %s, more than the file holds",
                      ct_io_quote(q, sizeof q, key), (unsigned long long)numel, t->name);
    }
    size_t idx = 0;
    CT_TRY(add_storage(c, key, type, numel, &idx));
    if (c->legacy && a[5]->kind != PK_NONE) { /* (view_key, offset, view_size) */
        pk_obj *v = a[5];
        if (v->kind != PK_TUPLE || v->u.seq.n != 3 || !str_of(v->u.seq.items[0]) ||
            v->u.seq.items[1]->kind != PK_INT || v->u.seq.items[2]->kind != PK_INT ||
            v->u.seq.items[1]->u.i < 0 || v->u.seq.items[2]->u.i < 0)
            return ptfail(CT_EFORMAT, c->label, "pickle-persid",
                          "a storage view must be (key, offset, size), found %s",
                          ct_pk_kind_name(v));
        uint64_t off = (uint64_t)v->u.seq.items[1]->u.i, vn = (uint64_t)v->u.seq.items[2]->u.i;
        if (off > numel || vn > numel - off)
            return ptfail(CT_EFORMAT, c->label, "storage",
                          "a view of %llu elements at %llu runs past its storage of %llu",
                          (unsigned long long)vn, (unsigned long long)off,
                          (unsigned long long)numel);
        CT_TRY(grow((void **)&c->st, &c->cap_st, c->nst + 1, sizeof *c->st));
        st_rec *r = &c->st[c->nst];
        memset(r, 0, sizeof *r);
        r->key = v->u.seq.items[0]->u.str.s;
        r->type = type;
        r->numel = vn;
        r->root = idx;
        r->view_off = off;
        r->next_view = c->st[idx].views; /* the root's chain of views */
        c->st[idx].views = c->nst + 1;
        idx = c->nst++;
    }
    CT_TRY(ct_pk_make(c->m, PK_STORAGE, out));
    (*out)->u.storage = idx;
    return CT_OK;
}

/* ---- flattening ----------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static ct_status sb_put(sbuf *b, const char *s, size_t n)
{
    CT_TRY(grow((void **)&b->p, &b->cap, b->n + n + 1, 1));
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return CT_OK;
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static ct_status
sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return sb_put(b, tmp, (size_t)k);
}

static ct_status sb_json_str(sbuf *b, const char *s, size_t n)
{
    CT_TRY(sb_put(b, "\"", 1));
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            CT_TRY(sb_put(b, e, 2));
        } else if (ch < 0x20) {
            CT_TRY(sb_printf(b, "\\u%04x", ch));
        } else
            CT_TRY(sb_put(b, (const char *)&ch, 1));
    }
    return sb_put(b, "\"", 1);
}

/* does o hold a tensor? Cached in o->mark: 1 visiting, 2 yes, 3 no. */
static ct_status has_tensor(pt_ctx *c, pk_obj *o, int depth, bool *yes)
{
    if (o->kind == PK_TENSOR) {
        *yes = true;
        return CT_OK;
    }
    if (o->kind != PK_TUPLE && o->kind != PK_LIST && o->kind != PK_DICT && o->kind != PK_SET) {
        *yes = false;
        return CT_OK;
    }
    if (o->mark == 2 || o->mark == 3) {
        *yes = o->mark == 2;
        return CT_OK;
    }
    if (o->mark == 1)
        return ptfail(CT_EFORMAT, c->label, "cycle",
                      "a container holds itself (a reference cycle through the memo)");
    if (depth > PK_MAX_NEST)
        return ptfail(CT_EFORMAT, c->label, "nesting", "containers nested deeper than %d levels",
                      PK_MAX_NEST);
    o->mark = 1;
    bool any = false;
    for (size_t i = 0; i < o->u.seq.n; i++) {
        bool y = false;
        CT_TRY(has_tensor(c, o->u.seq.items[i], depth + 1, &y));
        any |= y;
    }
    o->mark = any ? 2 : 3;
    *yes = any;
    return CT_OK;
}

/* A dict key as a name component. */
static ct_status key_text(pt_ctx *c, const pk_obj *k, const char *path, char *buf, size_t cap,
                          const char **out)
{
    char q[96];
    if (k->kind == PK_STR) {
        if (strlen(k->u.str.s) != k->u.str.n)
            return ptfail(CT_EFORMAT, c->label, "key", "a key under '%s' holds a NUL byte",
                          ct_io_quote(q, sizeof q, path));
        *out = k->u.str.s;
        return CT_OK;
    }
    if (k->kind == PK_INT) {
        snprintf(buf, cap, "%lld", (long long)k->u.i);
        *out = buf;
        return CT_OK;
    }
    return ptfail(CT_EUNSUPPORTED, c->label, "key",
                  "a dict key under '%s' is %s (only str and int keys make names)",
                  ct_io_quote(q, sizeof q, path), ct_pk_kind_name(k));
}

/* Metadata JSON of a subtree without tensors. */
static ct_status to_json(pt_ctx *c, pk_obj *o, int depth, sbuf *b)
{
    if (++c->visits > PT_MAX_VISITS || b->n > PT_MAX_META_BYTES)
        return ptfail(CT_EFORMAT, c->label, "limit",
                      "the non-tensor values expand to more than %u MiB of JSON (shared "
                      "subtrees?)",
                      PT_MAX_META_BYTES >> 20);
    if (depth > PK_MAX_NEST)
        return ptfail(CT_EFORMAT, c->label, "nesting", "containers nested deeper than %d levels",
                      PK_MAX_NEST);
    switch ((pk_kind)o->kind) {
    case PK_NONE:
        return sb_put(b, "null", 4);
    case PK_BOOL:
        return o->u.b ? sb_put(b, "true", 4) : sb_put(b, "false", 5);
    case PK_INT:
        return sb_printf(b, "%lld", (long long)o->u.i);
    case PK_FLOAT:
        if (isnan(o->u.f)) return sb_put(b, "NaN", 3);
        if (isinf(o->u.f)) return o->u.f > 0 ? sb_put(b, "Infinity", 8) : sb_put(b, "-Infinity", 9);
        {
            char t[40];
            snprintf(t, sizeof t, "%.17g", o->u.f);
            /* shortest repr that reads back: try 15, 16 digits first */
            for (int prec = 15; prec < 17; prec++) {
                char u[40];
                snprintf(u, sizeof u, "%.*g", prec, o->u.f);
                if (strtod(u, NULL) == o->u.f) {
                    memcpy(t, u, sizeof t);
                    break;
                }
            }
            if (!strpbrk(t, ".eE")) strcat(t, ".0");
            return sb_put(b, t, strlen(t));
        }
    case PK_STR:
        return sb_json_str(b, o->u.str.s, o->u.str.n);
    case PK_BYTES:
        CT_TRY(sb_put(b, "{\"__bytes__\": \"", 15));
        for (size_t i = 0; i < o->u.str.n; i++)
            CT_TRY(sb_printf(b, "%02x", (unsigned char)o->u.str.s[i]));
        return sb_put(b, "\"}", 2);
    case PK_GLOBAL:
        return sb_json_str(b, o->u.global.name, strlen(o->u.global.name));
    case PK_TUPLE:
    case PK_LIST:
    case PK_SET:
        if (o->mark == 1) return ptfail(CT_EFORMAT, c->label, "cycle", "a container holds itself");
        o->mark = 1;
        CT_TRY(sb_put(b, "[", 1));
        for (size_t i = 0; i < o->u.seq.n; i++) {
            if (i) CT_TRY(sb_put(b, ", ", 2));
            CT_TRY(to_json(c, o->u.seq.items[i], depth + 1, b));
        }
        o->mark = 3;
        return sb_put(b, "]", 1);
    case PK_DICT:
        if (o->mark == 1) return ptfail(CT_EFORMAT, c->label, "cycle", "a container holds itself");
        o->mark = 1;
        CT_TRY(sb_put(b, "{", 1));
        for (size_t i = 0; i + 1 < o->u.seq.n; i += 2) {
            char kb[32];
            const char *k;
            CT_TRY(key_text(c, o->u.seq.items[i], "(metadata)", kb, sizeof kb, &k));
            if (i) CT_TRY(sb_put(b, ", ", 2));
            CT_TRY(sb_json_str(b, k, strlen(k)));
            CT_TRY(sb_put(b, ": ", 2));
            CT_TRY(to_json(c, o->u.seq.items[i + 1], depth + 1, b));
        }
        o->mark = 3;
        return sb_put(b, "}", 1);
    case PK_STORAGE:
        return ptfail(CT_EUNSUPPORTED, c->label, "storage",
                      "a bare storage (not a tensor) among the values");
    case PK_TENSOR:
        break;
    }
    return ptfail(CT_EFORMAT, c->label, "limit", "unexpected object");
}

static ct_status add_meta(pt_ctx *c, const char *path, pk_obj *o)
{
    if (c->nent + c->nmeta >= PT_MAX_ENTRIES)
        return ptfail(CT_EFORMAT, c->label, "limit", "more than %u tensors and values",
                      PT_MAX_ENTRIES);
    sbuf b = {0};
    ct_status s = to_json(c, o, 0, &b);
    if (s == CT_OK && !b.p) s = sb_put(&b, "", 0);
    if (s == CT_OK && (c->meta_bytes += b.n) > PT_MAX_META_BYTES)
        s = ptfail(CT_EFORMAT, c->label, "limit",
                   "the non-tensor values expand to more than %u MiB of JSON",
                   PT_MAX_META_BYTES >> 20);
    char *k = NULL;
    if (s == CT_OK && !(k = dupstr(path, strlen(path))))
        s = ct_error(CT_ENOMEM, "pt: %s: out of memory", c->label);
    if (s == CT_OK) s = grow((void **)&c->meta, &c->cap_meta, c->nmeta + 1, sizeof *c->meta);
    if (s != CT_OK) {
        ct_free(b.p);
        ct_free(k);
        return s;
    }
    c->meta[c->nmeta].key = k;
    c->meta[c->nmeta].val = b.p;
    c->nmeta++;
    return CT_OK;
}

static bool row_major(int nd, const int64_t *shape, const int64_t *strides)
{
    int64_t want = 1;
    for (int d = nd - 1; d >= 0; d--) {
        if (shape[d] == 0) return true;
        if (shape[d] != 1 && strides[d] != want) return false;
        want *= shape[d];
    }
    return true;
}

/* A _rebuild_tensor_v3 tensor: its dtype gives the elements of its storage. torch 2.x saves
 * the dtypes without a typed storage class (float8_*, uint16/32/64, complex32, bits*) in an
 * UntypedStorage of bytes: the storage (its root, and the legacy view the tensor uses) is given
 * the dtype's element type here, once; its byte count must hold whole elements. A storage
 * already typed must have the dtype's type. */
static ct_status type_storage(pt_ctx *c, const char *qn, const pk_tensor *t)
{
    size_t want = 0;
    const char *name = "?";
    if (!ct_pk_dtype_storage_type(t->dtype, &want, &name))
        return ptfail(CT_EUNSUPPORTED, c->label, "unsupported",
                      "tensor '%s' has dtype torch.%s, which ctorch does not model", qn, name);
    st_rec *v = &c->st[t->storage], *r = &c->st[v->root];
    const pk_storage_type *wt = &ct_pk_storage_types[want];
    if (!ct_pk_storage_types[r->type].untyped) {
        if (r->type != want)
            return ptfail(CT_EFORMAT, c->label, "storage",
                          "tensor '%s' (torch.%s) views storage '%s' of %s", qn, name, r->key,
                          ct_pk_storage_types[r->type].name);
        return CT_OK;
    }
    uint64_t es = (uint64_t)wt->elem_size;
    if (r->numel % es || v->numel % es || v->view_off % es)
        return ptfail(CT_EFORMAT, c->label, "storage",
                      "tensor '%s' (torch.%s, %llu bytes an element) views a storage of %llu "
                      "bytes: not whole elements",
                      qn, name, (unsigned long long)es, (unsigned long long)v->numel);
    for (st_rec *x = r;; x = v) { /* the root, then the view (when it is another record) */
        x->type = want;
        x->numel /= es;
        x->view_off /= es;
        if (x == v || v == r) break;
    }
    /* other legacy views of the same root (its chain: once per root, not a scan per root) */
    for (size_t i = r->views; i; i = c->st[i - 1].next_view) {
        st_rec *x = &c->st[i - 1];
        if (x != r && x != v) {
            if (x->numel % es || x->view_off % es)
                return ptfail(CT_EFORMAT, c->label, "storage",
                              "a view of storage '%s' does not hold whole torch.%s elements",
                              r->key, name);
            x->type = want;
            x->numel /= es;
            x->view_off /= es;
        }
    }
    return CT_OK;
}

static ct_status add_tensor(pt_ctx *c, const char *path, const pk_tensor *t)
{
    char q[96];
    const char *qn = ct_io_quote(q, sizeof q, path);
    if (c->nent + c->nmeta >= PT_MAX_ENTRIES)
        return ptfail(CT_EFORMAT, c->label, "limit", "more than %u tensors and values",
                      PT_MAX_ENTRIES);
    if (t->has_dtype) CT_TRY(type_storage(c, qn, t));
    const st_rec *v = &c->st[t->storage];
    const pk_storage_type *ty = &ct_pk_storage_types[v->type];
    if (ty->quantized)
        return ptfail(CT_EUNSUPPORTED, c->label, "unsupported",
                      "tensor '%s' views a %s: ctorch has no quantized tensors", qn, ty->name);
    /* Bounds: the furthest element must lie inside the (view of the) storage. */
    uint64_t numel = 1, last = t->offset;
    for (int d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel))
            return ptfail(CT_EOVERFLOW, c->label, "tensor",
                          "tensor '%s': its element count overflows 64 bits", qn);
    if (numel) {
        for (int d = 0; d < t->ndim; d++) {
            uint64_t step;
            if (__builtin_mul_overflow((uint64_t)(t->shape[d] - 1), (uint64_t)t->strides[d],
                                       &step) ||
                __builtin_add_overflow(last, step, &last))
                return ptfail(CT_EOVERFLOW, c->label, "tensor",
                              "tensor '%s': its strides reach past 2^64 elements", qn);
        }
        if (last >= v->numel)
            return ptfail(CT_EFORMAT, c->label, "tensor",
                          "tensor '%s' (offset %llu, %d dims) reaches element %llu of a storage "
                          "of %llu elements",
                          qn, (unsigned long long)t->offset, t->ndim, (unsigned long long)last,
                          (unsigned long long)v->numel);
    } else if (t->offset > v->numel)
        return ptfail(CT_EFORMAT, c->label, "tensor",
                      "tensor '%s' (empty) starts at element %llu of a storage of %llu", qn,
                      (unsigned long long)t->offset, (unsigned long long)v->numel);
    CT_TRY(grow((void **)&c->ent, &c->cap_ent, c->nent + 1, sizeof *c->ent));
    st_entry *e = &c->ent[c->nent];
    memset(e, 0, sizeof *e);
    int nd = t->ndim + (ty->complex_pairs ? 1 : 0);
    int64_t *dims;
    CT_TRY(ct_alloc((void **)&dims, (size_t)(2 * nd + 1) * sizeof *dims));
    for (int d = 0; d < t->ndim; d++) {
        dims[d] = t->shape[d];
        dims[nd + d] = t->strides[d] * (ty->complex_pairs ? 2 : 1);
    }
    /* In elements of the root storage (complex128: of its F64 halves). */
    uint64_t off = t->offset + v->view_off, end_el = last + v->view_off + 1;
    uint64_t esz = (uint64_t)ty->elem_size;
    if (ty->complex_pairs) { /* complex128 / complex32 as F64 / F16 pairs: a trailing dim of 2 */
        dims[nd - 1] = 2;
        dims[2 * nd - 1] = 1;
        esz = (uint64_t)ty->elem_size / 2;
        off *= 2;
        end_el *= 2;
        numel *= 2;
    }
    char *name = dupstr(path, strlen(path));
    if (!name) {
        ct_free(dims);
        return ct_error(CT_ENOMEM, "pt: %s: out of memory", c->label);
    }
    e->name = name;
    e->ndim = nd;
    e->shape = dims;
    e->strides = row_major(nd, dims, dims + nd) ? NULL : dims + nd;
    e->dt = ty->dt;
    e->numel = numel;
    e->nbytes = numel * esz; /* <= storage bytes x strides: checked above */
    e->storage = v->root;
    e->storage_offset = off;
    e->begin = off * esz;
    e->end = numel ? end_el * esz : e->begin;
    e->order = c->nent;
    c->nent++;
    return CT_OK;
}

static ct_status flatten(pt_ctx *c, pk_obj *o, sbuf *path, int depth, bool root)
{
    if (++c->visits > PT_MAX_VISITS)
        return ptfail(CT_EFORMAT, c->label, "limit",
                      "flattening visits more than %u objects (shared subtrees?)", PT_MAX_VISITS);
    if (depth > PK_MAX_NEST)
        return ptfail(CT_EFORMAT, c->label, "nesting", "containers nested deeper than %d levels",
                      PK_MAX_NEST);
    const char *p = path->p ? path->p : "";
    if (o->kind == PK_TENSOR) return add_tensor(c, root ? "tensor" : p, o->u.tensor);
    bool container =
        o->kind == PK_DICT || o->kind == PK_LIST || o->kind == PK_TUPLE || o->kind == PK_SET;
    bool yes = false;
    if (container) CT_TRY(has_tensor(c, o, depth, &yes));
    if (!container || (!yes && !root)) return add_meta(c, root ? "value" : p, o);
    if (o->mark == 1) return ptfail(CT_EFORMAT, c->label, "cycle", "a container holds itself");
    uint8_t saved = o->mark;
    o->mark = 1;
    size_t base = path->n;
    bool dict = o->kind == PK_DICT;
    for (size_t i = 0; i < o->u.seq.n; i += dict ? 2 : 1) {
        char kb[32];
        const char *k = kb;
        if (dict)
            CT_TRY(key_text(c, o->u.seq.items[i], p, kb, sizeof kb, &k));
        else
            snprintf(kb, sizeof kb, "%zu", i);
        if (base) CT_TRY(sb_put(path, ".", 1));
        CT_TRY(sb_put(path, k, strlen(k)));
        CT_TRY(flatten(c, o->u.seq.items[dict ? i + 1 : i], path, depth + 1, false));
        path->n = base;
        if (path->p) path->p[base] = '\0';
        p = path->p ? path->p : "";
    }
    o->mark = saved;
    return CT_OK;
}

/* ---- the two layouts ------------------------------------------------------------------ */

static ct_status check_crc(pt_ctx *c, const ct_zip_member *mb)
{
    uint32_t crc = ct_crc32(0, c->base + mb->data_offset, (size_t)mb->size);
    if (crc != mb->crc32) {
        char q[96];
        return ptfail(CT_EFORMAT, c->label, "zip-crc",
                      "member '%s': CRC-32 %08x but the archive says %08x (corrupt file)",
                      ct_io_quote(q, sizeof q, mb->name), crc, mb->crc32);
    }
    return CT_OK;
}

static ct_status parse_zip(pt_ctx *c, pk_obj **root, size_t *pickle_bytes)
{
    CT_TRY(ct_zip_open(c->label, c->base, c->size, &c->zip));
    const ct_zip_member *pkl = NULL;
    for (size_t i = 0; i < c->zip.count; i++) {
        const char *nm = c->zip.members[i].name, *sl = strchr(nm, '/');
        if (sl && !strcmp(sl, "/data.pkl")) {
            if (pkl) {
                return ptfail(CT_EFORMAT, c->label, "layout",
                              "two pickles ('%s' and '%s'): not one torch.save archive", pkl->name,
                              nm);
            }
            pkl = &c->zip.members[i];
        }
    }
    if (!pkl)
        return ptfail(CT_EFORMAT, c->label, "layout",
                      "no '<archive>/data.pkl' member: a zip, but not a torch.save checkpoint");
    size_t pl = (size_t)(strchr(pkl->name, '/') - pkl->name) + 1;
    if (pl >= sizeof c->prefix - 32)
        return ptfail(CT_EFORMAT, c->label, "layout", "the archive name is too long");
    memcpy(c->prefix, pkl->name, pl);
    c->prefix[pl] = '\0';
    char nm[sizeof c->prefix + 256];
    snprintf(nm, sizeof nm, "%sconstants.pkl", c->prefix);
    if (ct_zip_find(&c->zip, nm))
        return ptfail(CT_EUNSUPPORTED, c->label, "layout",
                      "a TorchScript archive (torch.jit.save): ctorch reads torch.save "
                      "checkpoints");
    snprintf(nm, sizeof nm, "%sbyteorder", c->prefix);
    const ct_zip_member *bo = ct_zip_find(&c->zip, nm);
    if (bo) {
        CT_TRY(check_crc(c, bo));
        const char *t = (const char *)c->base + bo->data_offset;
        if (bo->size == 6 && !memcmp(t, "little", 6))
            c->big_endian = false;
        else if (bo->size == 3 && !memcmp(t, "big", 3))
            c->big_endian = true;
        else
            return ptfail(CT_EFORMAT, c->label, "byteorder",
                          "the byteorder record must say 'little' or 'big' (%llu bytes)",
                          (unsigned long long)bo->size);
    }
    CT_TRY(check_crc(c, pkl));
    size_t used;
    CT_TRY(ct_pk_run(c->m, c->base + pkl->data_offset, (size_t)pkl->size, &used, root));
    if (used != pkl->size)
        return ptfail(CT_EFORMAT, c->label, "pickle-trailing",
                      "%llu bytes follow the pickle's STOP in data.pkl",
                      (unsigned long long)(pkl->size - used));
    *pickle_bytes = (size_t)pkl->size;
    /* The storages' records: the members indexed by name once (the first of a name, as
     * ct_zip_find), each storage's found in it. */
    CT_TRY(ct_strmap_init(&c->members, c->zip.count));
    for (size_t i = 0; i < c->zip.count; i++) {
        const char *mn = c->zip.members[i].name;
        CT_TRY(ct_strmap_put(&c->members, mn, strlen(mn), i, NULL, NULL));
    }
    for (size_t i = 0; i < c->nst; i++) {
        st_rec *r = &c->st[i];
        if (r->root != i) continue;
        char q[96];
        snprintf(nm, sizeof nm, "%sdata/%s", c->prefix, r->key);
        size_t mi;
        const ct_zip_member *mb =
            ct_strmap_get(&c->members, nm, strlen(nm), &mi) ? &c->zip.members[mi] : NULL;
        if (!mb)
            return ptfail(CT_EFORMAT, c->label, "layout", "storage '%s' has no member '%s'",
                          ct_io_quote(q, sizeof q, r->key), nm);
        uint64_t want = r->numel * (uint64_t)ct_pk_storage_types[r->type].elem_size;
        if (mb->size != want)
            return ptfail(CT_EFORMAT, c->label, "storage",
                          "member '%s' holds %llu bytes but storage '%s' (%llu elements of %s) "
                          "needs %llu",
                          nm, (unsigned long long)mb->size, ct_io_quote(q, sizeof q, r->key),
                          (unsigned long long)r->numel, ct_pk_storage_types[r->type].name,
                          (unsigned long long)want);
        r->data = c->base + mb->data_offset;
        r->file_offset = mb->data_offset;
        r->has_data = true;
    }
    return CT_OK;
}

/* The legacy layout: pickles of the magic number, the protocol version, sys_info, the
 * object tree, the storage keys; then each storage as an 8-byte element count and bytes. */
static ct_status parse_legacy(pt_ctx *c, pk_obj **root, size_t *pickle_bytes)
{
    static const uint8_t magic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                    0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};
    if (c->size < sizeof magic || memcmp(c->base, magic, sizeof magic))
        return ptfail(CT_EFORMAT, c->label, "legacy",
                      "a pickle, but not a legacy torch.save file (no torch magic number)");
    size_t at = sizeof magic, used;
    pk_obj *o = NULL;
    CT_TRY(ct_pk_run(c->m, c->base + at, c->size - at, &used, &o));
    if (o->kind != PK_INT || o->u.i != 1001)
        return ptfail(CT_EFORMAT, c->label, "legacy", "protocol version %s%lld, not 1001",
                      o->kind == PK_INT ? "" : "(not an int) ",
                      o->kind == PK_INT ? (long long)o->u.i : 0LL);
    at += used;
    CT_TRY(ct_pk_run(c->m, c->base + at, c->size - at, &used, &o));
    if (o->kind != PK_DICT)
        return ptfail(CT_EFORMAT, c->label, "legacy", "sys_info is %s, not a dict",
                      ct_pk_kind_name(o));
    for (size_t i = 0; i + 1 < o->u.seq.n; i += 2) {
        const char *k = str_of(o->u.seq.items[i]);
        pk_obj *v = o->u.seq.items[i + 1];
        /* torch writes storages little-endian whatever the machine; a big-endian writer
         * says so here and its storages are read as torch reads them: little-endian. */
        if (k && !strcmp(k, "little_endian") && v->kind != PK_BOOL)
            return ptfail(CT_EFORMAT, c->label, "byteorder",
                          "sys_info's little_endian is %s, not a bool", ct_pk_kind_name(v));
    }
    at += used;
    size_t start = at;
    c->legacy = true;
    CT_TRY(ct_pk_run(c->m, c->base + at, c->size - at, &used, root));
    *pickle_bytes = used;
    at += used;
    (void)start;
    CT_TRY(ct_pk_run(c->m, c->base + at, c->size - at, &used, &o));
    at += used;
    if (o->kind != PK_LIST)
        return ptfail(CT_EFORMAT, c->label, "legacy", "the storage keys are %s, not a list",
                      ct_pk_kind_name(o));
    for (size_t i = 0; i < o->u.seq.n; i++) {
        const char *k = str_of(o->u.seq.items[i]);
        char q[96];
        if (!k)
            return ptfail(CT_EFORMAT, c->label, "legacy", "storage key %zu is %s, not a string", i,
                          ct_pk_kind_name(o->u.seq.items[i]));
        st_rec *r = NULL;
        size_t j;
        if (ct_strmap_get(&c->roots, k, strlen(k), &j)) r = &c->st[j];
        if (!r)
            return ptfail(CT_EFORMAT, c->label, "legacy",
                          "storage key '%s' is listed but no tensor uses it",
                          ct_io_quote(q, sizeof q, k));
        if (r->has_data)
            return ptfail(CT_EFORMAT, c->label, "legacy", "storage key '%s' is listed twice",
                          ct_io_quote(q, sizeof q, k));
        if (c->size - at < 8)
            return ptfail(CT_EFORMAT, c->label, "truncated", "the file ends before storage '%s'",
                          ct_io_quote(q, sizeof q, k));
        uint64_t n = 0;
        for (int b = 7; b >= 0; b--)
            n = n << 8 | c->base[at + (size_t)b];
        at += 8;
        uint64_t es = (uint64_t)ct_pk_storage_types[r->type].elem_size;
        if (n != r->numel)
            return ptfail(CT_EFORMAT, c->label, "storage",
                          "storage '%s' holds %llu elements but the pickle says %llu",
                          ct_io_quote(q, sizeof q, k), (unsigned long long)n,
                          (unsigned long long)r->numel);
        if (n > (c->size - at) / es)
            return ptfail(CT_EFORMAT, c->label, "truncated",
                          "storage '%s' (%llu elements of %llu bytes) runs past the end of the "
                          "file",
                          ct_io_quote(q, sizeof q, k), (unsigned long long)n,
                          (unsigned long long)es);
        r->data = c->base + at;
        r->file_offset = at;
        r->has_data = true;
        at += (size_t)(n * es);
    }
    for (size_t j = 0; j < c->nst; j++)
        if (c->st[j].root == j && !c->st[j].has_data) {
            char q[96];
            return ptfail(CT_EFORMAT, c->label, "legacy", "storage '%s' has no data",
                          ct_io_quote(q, sizeof q, c->st[j].key));
        }
    if (at != c->size)
        return ptfail(CT_EFORMAT, c->label, "trailing", "%zu bytes follow the last storage",
                      c->size - at);
    return CT_OK;
}

/* ---- assembling the file -------------------------------------------------------------- */

static _Thread_local const pt_storage *sort_st;
static int cmp_file_order(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    uint64_t fx = sort_st[x->storage].file_offset + x->begin,
             fy = sort_st[y->storage].file_offset + y->begin;
    if (fx != fy) return fx < fy ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_strp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void swap_bytes(uint8_t *p, uint64_t n, int w)
{
    for (uint64_t i = 0; i + (uint64_t)w <= n; i += (uint64_t)w)
        for (int k = 0; k < w / 2; k++) {
            uint8_t t = p[i + (uint64_t)k];
            p[i + (uint64_t)k] = p[i + (uint64_t)(w - 1 - k)];
            p[i + (uint64_t)(w - 1 - k)] = t;
        }
}

/* Bytes of one scalar part of an element (complex types: each of the two parts). */
static int part_size(const pk_storage_type *ty)
{
    return ty->dt == CT_ST_C64 || ty->complex_pairs ? ty->elem_size / 2 : ty->elem_size;
}

static bool needs_copy(const pt_ctx *c, const st_rec *r)
{
    const pk_storage_type *ty = &ct_pk_storage_types[r->type];
    if (!r->numel) return false;
    return c->big_endian || (uintptr_t)r->data % (uintptr_t)part_size(ty) != 0;
}

static ct_status assemble(pt_ctx *c, size_t pickle_bytes)
{
    ct_tensor_file *f = c->f;
    /* Roots become the file's storages (renumbered); views map to them. */
    size_t nroots = 0;
    size_t *map;
    CT_TRY(ct_alloc((void **)&map, (c->nst ? c->nst : 1) * sizeof *map));
    for (size_t i = 0; i < c->nst; i++)
        if (c->st[i].root == i) map[i] = nroots++;
    ct_status s = CT_OK;
    uint64_t total = 0, names = 0, dims = 0;
    for (size_t i = 0; i < c->nst; i++)
        if (c->st[i].root == i)
            total += c->st[i].numel * (uint64_t)ct_pk_storage_types[c->st[i].type].elem_size;
    if ((s = ct_calloc((void **)&f->storages, (nroots ? nroots : 1) * sizeof *f->storages)))
        goto done;
    f->storage_count = nroots;
    /* Storages are copied (once) when they must be byte-swapped, or when they are not
     * aligned to their element size in the file (zips written by other tools than torch,
     * which aligns to 64 bytes): views are then always aligned. */
    uint64_t copy_bytes = 0;
    for (size_t i = 0; i < c->nst; i++)
        if (c->st[i].root == i && needs_copy(c, &c->st[i]))
            copy_bytes += (c->st[i].numel * (uint64_t)ct_pk_storage_types[c->st[i].type].elem_size +
                           63) & ~(uint64_t)63;
    uint8_t *swapped = NULL;
    if (copy_bytes) {
        if ((s = ct_alloc((void **)&f->owned, (size_t)copy_bytes))) goto done;
        swapped = f->owned;
    }
    for (size_t i = 0; i < c->nst; i++) {
        const st_rec *r = &c->st[i];
        if (r->root != i) continue;
        pt_storage *ps = &f->storages[map[i]];
        const pk_storage_type *ty = &ct_pk_storage_types[r->type];
        ps->nbytes = r->numel * (uint64_t)ty->elem_size;
        ps->file_offset = r->file_offset;
        ps->dt = ty->dt;
        ps->data = r->data;
        if (needs_copy(c, r)) {
            memcpy(swapped, r->data, (size_t)ps->nbytes);
            int w = part_size(ty);
            if (c->big_endian && w > 1) swap_bytes(swapped, ps->nbytes, w);
            ps->data = swapped;
            swapped += (ps->nbytes + 63) & ~(uint64_t)63;
        }
        names += strlen(r->key) + 1;
    }
    for (size_t i = 0; i < c->nent; i++) {
        names += strlen(c->ent[i].name) + 1;
        dims += 2 * (uint64_t)c->ent[i].ndim;
    }
    for (size_t i = 0; i < c->nmeta; i++)
        names += strlen(c->meta[i].key) + strlen(c->meta[i].val) + 2;
    if ((s = ct_alloc((void **)&f->strings, (size_t)names + 1)) ||
        (s = ct_alloc((void **)&f->dims, ((size_t)dims + 1) * sizeof *f->dims)) ||
        (s = ct_calloc((void **)&f->entries, (c->nent ? c->nent : 1) * sizeof *f->entries)) ||
        (s = ct_alloc((void **)&f->by_name, (c->nent ? c->nent : 1) * sizeof *f->by_name)) ||
        (s = ct_alloc((void **)&f->meta, (c->nmeta ? 2 * c->nmeta : 1) * sizeof *f->meta)))
        goto done;
    char *sp = f->strings;
    for (size_t i = 0; i < c->nst; i++)
        if (c->st[i].root == i) {
            size_t l = strlen(c->st[i].key) + 1;
            memcpy(sp, c->st[i].key, l);
            f->storages[map[i]].key = sp;
            sp += l;
        }
    int64_t *dp = f->dims;
    for (size_t i = 0; i < c->nent; i++) {
        st_entry e = c->ent[i];
        size_t l = strlen(e.name) + 1;
        memcpy(sp, e.name, l);
        e.name = sp;
        sp += l;
        memcpy(dp, c->ent[i].shape, (size_t)e.ndim * sizeof *dp);
        memcpy(dp + e.ndim, c->ent[i].shape + e.ndim, (size_t)e.ndim * sizeof *dp);
        e.shape = e.ndim ? dp : NULL;
        e.strides = c->ent[i].strides ? dp + e.ndim : NULL;
        dp += 2 * e.ndim;
        e.storage = map[e.storage];
        const pt_storage *ps = &f->storages[e.storage];
        e.data = ps->data + e.begin;
        e.file_offset = ps->file_offset + e.begin;
        f->entries[i] = e;
        f->total_elements += e.numel;
    }
    for (size_t i = 0; i < c->nmeta; i++) {
        size_t kl = strlen(c->meta[i].key) + 1, vl = strlen(c->meta[i].val) + 1;
        memcpy(sp, c->meta[i].key, kl);
        f->meta[2 * i] = sp;
        sp += kl;
        memcpy(sp, c->meta[i].val, vl);
        f->meta[2 * i + 1] = sp;
        sp += vl;
    }
    f->count = c->nent;
    f->meta_count = c->nmeta;
    sort_st = f->storages;
    qsort(f->entries, f->count, sizeof *f->entries, cmp_file_order);
    sort_st = NULL;
    ct_io_sort_names(f);
    for (size_t i = 1; i < f->count; i++)
        if (!strcmp(f->entries[f->by_name[i]].name, f->entries[f->by_name[i - 1]].name)) {
            char q[96];
            s = ptfail(CT_EFORMAT, c->label, "key",
                       "two tensors flatten to the name '%s' (a dotted key beside a nested one?)",
                       ct_io_quote(q, sizeof q, f->entries[f->by_name[i]].name));
            goto done;
        }
    if (c->nmeta > 1) {
        const char **keys;
        if ((s = ct_alloc((void **)&keys, c->nmeta * sizeof *keys))) goto done;
        for (size_t i = 0; i < c->nmeta; i++)
            keys[i] = f->meta[2 * i];
        qsort(keys, c->nmeta, sizeof *keys, cmp_strp);
        for (size_t i = 1; i < c->nmeta && s == CT_OK; i++)
            if (!strcmp(keys[i], keys[i - 1])) {
                char q[96];
                s = ptfail(CT_EFORMAT, c->label, "key", "two values flatten to the name '%s'",
                           ct_io_quote(q, sizeof q, keys[i]));
            }
        ct_free(keys);
        if (s) goto done;
    }
    f->data_offset = 0;
    f->data_bytes = total;
    f->header_len = pickle_bytes;
done:
    ct_free(map);
    return s;
}

ct_status ct_io_pt_parse(const char *label, ct_file_format fmt, const uint8_t *base, size_t size,
                         ct_tensor_file *f)
{
    pt_ctx c;
    memset(&c, 0, sizeof c);
    c.label = label;
    c.base = base;
    c.size = size;
    c.f = f;
    ct_status s = ct_pk_new(label, persistent, &c, &c.m);
    pk_obj *root = NULL;
    size_t pickle_bytes = 0;
    if (s == CT_OK)
        s = fmt == CT_FORMAT_PYTORCH_ZIP ? parse_zip(&c, &root, &pickle_bytes)
                                         : parse_legacy(&c, &root, &pickle_bytes);
    if (s == CT_OK) {
        sbuf path = {0};
        s = flatten(&c, root, &path, 0, true);
        ct_free(path.p);
    }
    if (s == CT_OK) s = assemble(&c, pickle_bytes);
    if (s == CT_OK) {
        f->base = base;
        f->size = size;
        f->format = fmt;
    }
    for (size_t i = 0; i < c.nent; i++) {
        ct_free((void *)c.ent[i].name);
        ct_free((void *)c.ent[i].shape);
    }
    for (size_t i = 0; i < c.nmeta; i++) {
        ct_free(c.meta[i].key);
        ct_free(c.meta[i].val);
    }
    ct_free(c.ent);
    ct_free(c.meta);
    ct_free(c.st);
    ct_strmap_free(&c.roots);
    ct_strmap_free(&c.members);
    ct_zip_close(&c.zip);
    ct_pk_free(c.m);
    return s;
}
