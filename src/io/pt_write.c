/* Writing torch.save zip checkpoints (an OrderedDict of tensors, pickle protocol 2, stored
 * members aligned to 64 bytes, zip64 when needed), and the atomic file writer they share. */
#include "core/internal.h"
#include "io/io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- atomic writes -------------------------------------------------------------------- */

ct_status ct_io_out_write(ct_io_out *o, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(o->fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return ct_error(CT_EIO, "%s: writing '%s' failed: %s", o->fn, o->path,
                            w < 0 ? strerror(errno) : "no progress");
        b += w;
        n -= (size_t)w;
        o->written += (uint64_t)w;
    }
    return CT_OK;
}

static unsigned atomic_seq;

ct_status ct_io_atomic_write(const char *fn, const char *path, const ct_save_options *opts,
                             ct_status (*body)(void *ctx, ct_io_out *out), void *ctx)
{
    ct_save_options o = opts ? *opts : ct_save_options_default();
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return ct_error(CT_EINVAL, "%s: path '%s' does not name a file", fn, path);
    size_t dl = slash ? (size_t)(slash - path) : 1, bl = strlen(base);
    if (slash && dl == 0) dl = 1;
    if (bl > 200) bl = 200;
    char *dir, *tmp;
    CT_TRY(ct_alloc((void **)&dir, dl + 1));
    if (slash)
        memcpy(dir, path, dl);
    else
        dir[0] = '.';
    dir[dl] = '\0';
    ct_status s = ct_alloc((void **)&tmp, dl + bl + 64);
    if (s) {
        ct_free(dir);
        return s;
    }
    int fd = -1;
    for (int tries = 0; tries < 8; tries++) {
        unsigned seq = __atomic_fetch_add(&atomic_seq, 1, __ATOMIC_RELAXED);
        snprintf(tmp, dl + bl + 64, "%s/.%.*s.ctorch-tmp.%ld.p%u", dir, (int)bl, base,
                 (long)getpid(), seq);
        fd = open(tmp, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) break;
    }
    if (fd < 0) {
        s = ct_error(CT_EIO, "%s: cannot create a temp file in '%s' for '%s': %s", fn, dir, path,
                     strerror(errno));
        goto out;
    }
    struct stat old;
    if (stat(path, &old) == 0 && S_ISREG(old.st_mode)) (void)fchmod(fd, old.st_mode & 07777);
    ct_io_out w = {fd, path, fn, 0};
    s = body(ctx, &w);
    if (s == CT_OK && o.sync && fsync(fd) != 0)
        s = ct_error(CT_EIO, "%s: fsync of '%s' failed: %s", fn, path, strerror(errno));
    if (close(fd) != 0 && s == CT_OK)
        s = ct_error(CT_EIO, "%s: closing '%s' failed: %s", fn, path, strerror(errno));
    if (s == CT_OK && rename(tmp, path) != 0)
        s = ct_error(CT_EIO, "%s: cannot rename the temp file over '%s': %s", fn, path,
                     strerror(errno));
    if (s != CT_OK) {
        unlink(tmp);
        goto out;
    }
    if (o.sync) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL && errno != EROFS))
            s = ct_error(CT_EIO, "%s: '%s' was written but fsync of its folder '%s' failed: %s", fn,
                         path, dir, strerror(errno));
        if (dfd >= 0) close(dfd);
    }
out:
    ct_free(dir);
    ct_free(tmp);
    return s;
}

/* ---- byte buffers --------------------------------------------------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
    ct_status err;
} buf;

static void put(buf *b, const void *p, size_t n)
{
    if (b->err) return;
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->n + n)
            nc *= 2;
        uint8_t *q;
        if ((b->err = ct_alloc((void **)&q, nc))) return;
        if (b->n) memcpy(q, b->p, b->n);
        ct_free(b->p);
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void put8(buf *b, uint8_t v)
{
    put(b, &v, 1);
}
static void put16(buf *b, uint16_t v)
{
    uint8_t t[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    put(b, t, 2);
}
static void put32(buf *b, uint32_t v)
{
    uint8_t t[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, t, 4);
}
static void put64(buf *b, uint64_t v)
{
    put32(b, (uint32_t)v);
    put32(b, (uint32_t)(v >> 32));
}

/* ---- the pickle ----------------------------------------------------------------------- */

static void pk_int(buf *b, int64_t v)
{
    if (v >= 0 && v < 256) {
        put8(b, 0x4b); /* BININT1 */
        put8(b, (uint8_t)v);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        put8(b, 0x4a); /* BININT */
        put32(b, (uint32_t)(int32_t)v);
    } else {
        put8(b, 0x8a); /* LONG1, 8 bytes two's complement */
        put8(b, 8);
        put64(b, (uint64_t)v);
    }
}

static void pk_str(buf *b, const char *s)
{
    size_t n = strlen(s);
    put8(b, 0x58); /* BINUNICODE */
    put32(b, (uint32_t)n);
    put(b, s, n);
}

static void pk_global(buf *b, const char *mod, const char *name)
{
    put8(b, 0x63);
    put(b, mod, strlen(mod));
    put8(b, '\n');
    put(b, name, strlen(name));
    put8(b, '\n');
}

static void pk_tuple(buf *b, int n, const int64_t *v)
{
    if (n == 0) {
        put8(b, 0x29);
        return;
    }
    put8(b, 0x28);
    for (int i = 0; i < n; i++)
        pk_int(b, v[i]);
    put8(b, 0x74);
}

static void pk_ordered_dict(buf *b)
{
    pk_global(b, "collections", "OrderedDict");
    put8(b, 0x29);
    put8(b, 0x52); /* REDUCE */
}

/* ---- the plan ------------------------------------------------------------------------- */

typedef struct pt_item {
    const char *name;
    const char *storage_type; /* "FloatStorage"; NULL: an UntypedStorage of the dtype below */
    const char *dtype;        /* "float8_e4m3fn": written with _rebuild_tensor_v3 */
    int ndim;
    int64_t shape[CT_MAX_DIMS > 64 ? CT_MAX_DIMS : 64];
    uint64_t numel, nbytes;
    const ct_tensor *tensor; /* or raw data */
    const void *data;
    uint64_t header_offset, crc;
    char key[24];
    bool zip64;
} pt_item;

/* Typed storages (_rebuild_tensor_v2, as torch writes them), and the dtypes torch 2.x writes
 * as an UntypedStorage of bytes with _rebuild_tensor_v3. */
static const struct {
    ct_st_dtype st;
    const char *storage, *dtype;
} pt_types[] = {
    {CT_ST_F32, "FloatStorage", NULL},
    {CT_ST_F64, "DoubleStorage", NULL},
    {CT_ST_F16, "HalfStorage", NULL},
    {CT_ST_BF16, "BFloat16Storage", NULL},
    {CT_ST_I8, "CharStorage", NULL},
    {CT_ST_U8, "ByteStorage", NULL},
    {CT_ST_I16, "ShortStorage", NULL},
    {CT_ST_I32, "IntStorage", NULL},
    {CT_ST_I64, "LongStorage", NULL},
    {CT_ST_BOOL, "BoolStorage", NULL},
    {CT_ST_C64, "ComplexFloatStorage", NULL},
    {CT_ST_U16, NULL, "uint16"},
    {CT_ST_U32, NULL, "uint32"},
    {CT_ST_U64, NULL, "uint64"},
    {CT_ST_F8_E4M3, NULL, "float8_e4m3fn"},
    {CT_ST_F8_E5M2, NULL, "float8_e5m2"},
    {CT_ST_F8_E4M3FNUZ, NULL, "float8_e4m3fnuz"},
    {CT_ST_F8_E5M2FNUZ, NULL, "float8_e5m2fnuz"},
    {CT_ST_F8_E8M0, NULL, "float8_e8m0fnu"},
};

typedef struct pt_job {
    pt_item *items;
    size_t count;
    buf pickle;
    bool force_zip64;
} pt_job;

typedef struct zrec {
    const char *name;
    uint64_t size, offset;
    uint32_t crc;
    bool zip64;
} zrec;

static ct_status write_local(ct_io_out *o, zrec *r)
{
    buf h = {0};
    size_t nl = strlen(r->name);
    r->offset = o->written;
    size_t fixed = 30 + nl + (r->zip64 ? 20 : 0);
    size_t pad = (size_t)((64 - (o->written + fixed + 4) % 64) % 64);
    put32(&h, 0x04034b50u);
    put16(&h, r->zip64 ? 45 : 20);
    put16(&h, 0x0808); /* sizes in a data descriptor; UTF-8 names */
    put16(&h, 0);      /* stored */
    put16(&h, 0);      /* time 00:00 */
    put16(&h, 0x21);   /* 1980-01-01: deterministic */
    put32(&h, 0);      /* CRC in the descriptor */
    put32(&h, r->zip64 ? 0xFFFFFFFFu : (uint32_t)r->size);
    put32(&h, r->zip64 ? 0xFFFFFFFFu : (uint32_t)r->size);
    put16(&h, (uint16_t)nl);
    put16(&h, (uint16_t)((r->zip64 ? 20 : 0) + 4 + pad));
    put(&h, r->name, nl);
    if (r->zip64) {
        put16(&h, 0x0001);
        put16(&h, 16);
        put64(&h, r->size);
        put64(&h, r->size);
    }
    put16(&h, 0x4246); /* "FB": padding so the data starts at a multiple of 64 */
    put16(&h, (uint16_t)pad);
    for (size_t i = 0; i < pad; i++)
        put8(&h, 0);
    ct_status s = h.err ? h.err : ct_io_out_write(o, h.p, h.n);
    ct_free(h.p);
    return s;
}

static ct_status write_descriptor(ct_io_out *o, const zrec *r)
{
    buf h = {0};
    put32(&h, 0x08074b50u);
    put32(&h, r->crc);
    if (r->zip64) {
        put64(&h, r->size);
        put64(&h, r->size);
    } else {
        put32(&h, (uint32_t)r->size);
        put32(&h, (uint32_t)r->size);
    }
    ct_status s = h.err ? h.err : ct_io_out_write(o, h.p, h.n);
    ct_free(h.p);
    return s;
}

static ct_status write_bytes_rec(ct_io_out *o, zrec *r, const void *p, size_t n)
{
    CT_TRY(write_local(o, r));
    r->crc = ct_crc32(0, p, n);
    CT_TRY(ct_io_out_write(o, p, n));
    return write_descriptor(o, r);
}

static ct_status write_tensor_rec(ct_io_out *o, zrec *r, const pt_item *it)
{
    CT_TRY(write_local(o, r));
    const void *p = it->data;
    ct_tensor tmp = {0};
    if (it->tensor) {
        if (ct_tensor_is_contiguous(it->tensor))
            p = it->tensor->data;
        else {
            CT_TRY(ct_tensor_contiguous(it->tensor, &tmp));
            p = tmp.data;
        }
    }
    r->crc = it->nbytes ? ct_crc32(0, p, (size_t)it->nbytes) : 0;
    ct_status s = it->nbytes ? ct_io_out_write(o, p, (size_t)it->nbytes) : CT_OK;
    ct_tensor_free(&tmp);
    CT_TRY(s);
    return write_descriptor(o, r);
}

static ct_status write_central(ct_io_out *o, const zrec *recs, size_t n, bool force64)
{
    buf h = {0};
    uint64_t cd_off = o->written;
    bool any64 = force64 || n >= 0xFFFF;
    for (size_t i = 0; i < n; i++) {
        const zrec *r = &recs[i];
        bool big = r->zip64 || r->offset >= 0xFFFFFFFFu;
        any64 |= big;
        size_t nl = strlen(r->name);
        put32(&h, 0x02014b50u);
        put16(&h, 0x0300 | (big ? 45 : 20)); /* made by Unix */
        put16(&h, big ? 45 : 20);
        put16(&h, 0x0808);
        put16(&h, 0);
        put16(&h, 0);
        put16(&h, 0x21);
        put32(&h, r->crc);
        put32(&h, big ? 0xFFFFFFFFu : (uint32_t)r->size);
        put32(&h, big ? 0xFFFFFFFFu : (uint32_t)r->size);
        put16(&h, (uint16_t)nl);
        put16(&h, big ? 28 : 0);
        put16(&h, 0);
        put16(&h, 0);
        put16(&h, 0);
        put32(&h, 0100644u << 16);
        put32(&h, big ? 0xFFFFFFFFu : (uint32_t)r->offset);
        put(&h, r->name, nl);
        if (big) {
            put16(&h, 0x0001);
            put16(&h, 24);
            put64(&h, r->size);
            put64(&h, r->size);
            put64(&h, r->offset);
        }
    }
    uint64_t cd_size = h.n;
    if (cd_off + cd_size >= 0xFFFFFFFFu) any64 = true;
    if (any64) {
        uint64_t e64 = cd_off + cd_size;
        put32(&h, 0x06064b50u);
        put64(&h, 44);
        put16(&h, 0x032d);
        put16(&h, 45);
        put32(&h, 0);
        put32(&h, 0);
        put64(&h, n);
        put64(&h, n);
        put64(&h, cd_size);
        put64(&h, cd_off);
        put32(&h, 0x07064b50u);
        put32(&h, 0);
        put64(&h, e64);
        put32(&h, 1);
    }
    put32(&h, 0x06054b50u);
    put16(&h, 0);
    put16(&h, 0);
    put16(&h, any64 ? 0xFFFF : (uint16_t)n);
    put16(&h, any64 ? 0xFFFF : (uint16_t)n);
    put32(&h, any64 ? 0xFFFFFFFFu : (uint32_t)cd_size);
    put32(&h, any64 ? 0xFFFFFFFFu : (uint32_t)cd_off);
    put16(&h, 0);
    ct_status s = h.err ? h.err : ct_io_out_write(o, h.p, h.n);
    ct_free(h.p);
    return s;
}

static ct_status pt_body(void *ctx, ct_io_out *o)
{
    pt_job *j = ctx;
    size_t n = j->count + 3;
    zrec *recs;
    char *names;
    CT_TRY(ct_calloc((void **)&recs, n * sizeof *recs));
    ct_status s = ct_alloc((void **)&names, j->count * 48 + 1);
    if (s) {
        ct_free(recs);
        return s;
    }
    recs[0] = (zrec){"archive/data.pkl", j->pickle.n, 0, 0, j->force_zip64};
    if ((s = write_bytes_rec(o, &recs[0], j->pickle.p, j->pickle.n))) goto out;
    for (size_t i = 0; i < j->count; i++) {
        char *nm = names + 48 * i;
        snprintf(nm, 48, "archive/data/%zu", i);
        recs[1 + i] = (zrec){nm, j->items[i].nbytes, 0, 0,
                             j->force_zip64 || j->items[i].nbytes >= 0xFFFFFFFFu};
        if ((s = write_tensor_rec(o, &recs[1 + i], &j->items[i]))) goto out;
    }
    recs[n - 2] = (zrec){"archive/version", 2, 0, 0, j->force_zip64};
    if ((s = write_bytes_rec(o, &recs[n - 2], "3\n", 2))) goto out;
    recs[n - 1] = (zrec){"archive/byteorder", 6, 0, 0, j->force_zip64};
    if ((s = write_bytes_rec(o, &recs[n - 1], "little", 6))) goto out;
    s = write_central(o, recs, n, j->force_zip64);
out:
    ct_free(recs);
    ct_free(names);
    return s;
}

static ct_status plan(const ct_save_entry *e, size_t i, pt_item *it)
{
    char q[96];
    if (!e->name) return ct_error(CT_EINVAL, "ct_save_pt: entry %zu has no name", i);
    if (!ct_io_utf8_valid(e->name, strlen(e->name), NULL))
        return ct_error(CT_EINVAL, "ct_save_pt: entry %zu's name is not valid UTF-8", i);
    const char *qn = ct_io_quote(q, sizeof q, e->name);
    ct_st_dtype st;
    it->name = e->name;
    if (e->tensor) {
        const ct_tensor *t = e->tensor;
        if (t->ndim < 0 || t->ndim > CT_MAX_DIMS)
            return ct_error(CT_EINVAL, "ct_save_pt: tensor '%s' has %d dims: a ct_tensor has 0 to "
                            "%d (pass more as a raw entry: ndim and shape)",
                            qn, t->ndim, CT_MAX_DIMS);
        if (ct_st_dtype_from_ct(t->dtype, &st) != CT_OK)
            return ct_error(CT_EINVAL, "ct_save_pt: tensor '%s' has an invalid dtype", qn);
        it->ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++)
            it->shape[d] = t->shape[d];
        it->tensor = t;
    } else {
        if (e->ndim < 0 || e->ndim > 64)
            return ct_error(CT_EINVAL, "ct_save_pt: entry '%s' has %d dims: ctorch writes 0 to 64 "
                            "(the most its .pt reader takes back)",
                            qn, e->ndim);
        if (e->ndim && !e->shape)
            return ct_error(CT_EINVAL, "ct_save_pt: entry '%s' has %d dims and a NULL shape", qn,
                            e->ndim);
        st = e->st_dtype;
        it->ndim = e->ndim;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] < 0)
                return ct_error(CT_EINVAL, "ct_save_pt: entry '%s' has a negative dim", qn);
            it->shape[d] = e->shape[d];
        }
        it->data = e->data;
    }
    it->storage_type = it->dtype = NULL;
    for (size_t k = 0; k < sizeof pt_types / sizeof pt_types[0]; k++)
        if (pt_types[k].st == st) {
            it->storage_type = pt_types[k].storage;
            it->dtype = pt_types[k].dtype;
        }
    if (!it->storage_type && !it->dtype)
        return ct_error(CT_EUNSUPPORTED,
                        "ct_save_pt: tensor '%s' is %s, which PyTorch has no storage for (convert "
                        "it first)",
                        qn, ct_st_dtype_name(st));
    uint64_t numel = 1;
    for (int d = 0; d < it->ndim; d++)
        if (__builtin_mul_overflow(numel, (uint64_t)it->shape[d], &numel))
            return ct_error(CT_EOVERFLOW, "ct_save_pt: tensor '%s': element count overflows", qn);
    uint64_t nb;
    if (__builtin_mul_overflow(numel, (uint64_t)(ct_st_dtype_bits(st) / 8), &nb) ||
        nb > (uint64_t)INT64_MAX)
        return ct_error(CT_EOVERFLOW, "ct_save_pt: tensor '%s': byte count overflows", qn);
    if (!e->tensor && nb && !e->data)
        return ct_error(CT_EINVAL, "ct_save_pt: entry '%s' has no data", qn);
    it->numel = numel;
    it->nbytes = nb;
    return CT_OK;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

ct_status ct_io_save_pt_impl(const char *path, const ct_save_entry *entries, size_t count,
                             const ct_save_options *opts, bool force_zip64)
{
    if (!path) return ct_error(CT_EINVAL, "ct_save_pt: path must not be NULL");
    if (count && !entries)
        return ct_error(CT_EINVAL, "ct_save_pt: %zu tensors but no entries", count);
    pt_job j = {0};
    j.force_zip64 = force_zip64;
    j.count = count;
    const char **names = NULL;
    ct_status s;
    if ((s = ct_calloc((void **)&j.items, (count ? count : 1) * sizeof *j.items)) ||
        (s = ct_alloc((void **)&names, (count ? count : 1) * sizeof *names)))
        goto done;
    for (size_t i = 0; i < count; i++) {
        if ((s = plan(&entries[i], i, &j.items[i]))) goto done;
        names[i] = entries[i].name;
    }
    qsort(names, count, sizeof *names, cmp_names);
    for (size_t i = 1; i < count; i++)
        if (!strcmp(names[i], names[i - 1])) {
            char q[96];
            s = ct_error(CT_EINVAL, "ct_save_pt: two tensors are named '%s'",
                         ct_io_quote(q, sizeof q, names[i]));
            goto done;
        }
    /* The pickle: OrderedDict, then SETITEMS in batches of 1000 as pickle does. */
    buf *b = &j.pickle;
    put8(b, 0x80);
    put8(b, 2);
    pk_ordered_dict(b);
    for (size_t i = 0; i < count; i++) {
        const pt_item *it = &j.items[i];
        if (i % 1000 == 0) put8(b, 0x28);
        pk_str(b, it->name);
        bool v3 = !it->storage_type; /* an UntypedStorage of bytes and the dtype */
        pk_global(b, "torch._utils", v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
        put8(b, 0x28);
        put8(b, 0x28); /* the persistent id */
        pk_str(b, "storage");
        if (v3)
            pk_global(b, "torch.storage", "UntypedStorage");
        else
            pk_global(b, "torch", it->storage_type);
        char key[24];
        snprintf(key, sizeof key, "%zu", i);
        pk_str(b, key);
        pk_str(b, "cpu");
        pk_int(b, (int64_t)(v3 ? it->nbytes : it->numel));
        put8(b, 0x74);
        put8(b, 0x51); /* BINPERSID */
        pk_int(b, 0);
        pk_tuple(b, it->ndim, it->shape);
        int64_t strides[64];
        int64_t acc = 1;
        for (int d = it->ndim - 1; d >= 0; d--) {
            strides[d] = acc;
            acc *= it->shape[d] ? it->shape[d] : 1;
        }
        pk_tuple(b, it->ndim, strides);
        put8(b, 0x89); /* requires_grad False */
        pk_ordered_dict(b);
        if (v3) pk_global(b, "torch", it->dtype);
        put8(b, 0x74);
        put8(b, 0x52);
        if (i % 1000 == 999 || i + 1 == count) put8(b, 0x75); /* SETITEMS */
    }
    put8(b, 0x2e);
    if ((s = b->err)) goto done;
    s = ct_io_atomic_write("ct_save_pt", path, opts, pt_body, &j);
done:
    ct_free(j.items);
    ct_free(j.pickle.p);
    ct_free(names);
    return s;
}

ct_status ct_save_pt_entries(const char *path, const ct_save_entry *entries, size_t count,
                             const ct_save_options *opts)
{
    return ct_io_save_pt_impl(path, entries, count, opts, false);
}

ct_status ct_save_pt(const char *path, const ct_tensor *tensors, const char *const *names,
                     size_t count, const ct_save_options *opts)
{
    if (count && (!tensors || !names))
        return ct_error(CT_EINVAL, "ct_save_pt: %zu tensors but tensors or names is NULL", count);
    ct_save_entry *e;
    CT_TRY(ct_calloc((void **)&e, (count ? count : 1) * sizeof *e));
    for (size_t i = 0; i < count; i++) {
        e[i].name = names[i];
        e[i].tensor = &tensors[i];
    }
    ct_status s = ct_save_pt_entries(path, e, count, opts);
    ct_free(e);
    return s;
}
