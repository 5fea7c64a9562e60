/* Safetensors writer: temp file in the target's folder, fsync, rename, fsync the folder. */
#include "core/internal.h"
#include "io/io_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STAGE_BYTES ((size_t)4 << 20)
#define WRITE_MAX ((size_t)1 << 30)

ct_save_options ct_save_options_default(void)
{
    return (ct_save_options){.sync = true, .anonymous_temp = true};
}

/* What one entry will write. */
typedef struct plan_item {
    const ct_save_entry *e;
    ct_st_dtype dt;
    int bits;
    uint64_t nbytes, begin;
} plan_item;

/* ---- argument checks ------------------------------------------------------------------ */

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sort a copy of the strings and report the first duplicate (or NULL). */
static ct_status find_duplicate(const char *const *s, size_t n, const char **dup)
{
    *dup = NULL;
    if (n < 2) return CT_OK;
    const char **v;
    CT_TRY(ct_alloc((void **)&v, n * sizeof *v));
    memcpy(v, s, n * sizeof *v);
    qsort(v, n, sizeof *v, cmp_str_ptr);
    for (size_t i = 1; i < n && !*dup; i++)
        if (strcmp(v[i - 1], v[i]) == 0) *dup = v[i];
    ct_free(v);
    return CT_OK;
}

static ct_status check_text(const char *what, size_t i, const char *s)
{
    size_t bad;
    if (!s) return ct_error(CT_EINVAL, "ct_save_safetensors: %s[%zu] is NULL", what, i);
    if (!ct_io_utf8_valid(s, strlen(s), &bad))
        return ct_error(CT_EINVAL, "ct_save_safetensors: %s[%zu] is not valid UTF-8 (byte %zu)",
                        what, i, bad);
    return CT_OK;
}

static ct_status plan_entry(const ct_save_entry *e, size_t i, plan_item *p)
{
    char q[96];
    CT_TRY(check_text("names", i, e->name));
    const char *nm = ct_io_quote(q, sizeof q, e->name);
    if (strcmp(e->name, "__metadata__") == 0)
        return ct_error(CT_EINVAL,
                        "ct_save_safetensors: names[%zu] is \"__metadata__\", the "
                        "key reserved for metadata",
                        i);
    uint64_t numel = 1;
    p->e = e;
    if (e->tensor) {
        const ct_tensor *t = e->tensor;
        if (ct_st_dtype_from_ct(t->dtype, &p->dt) != CT_OK)
            return ct_error(CT_EINVAL, "ct_save_safetensors: tensor '%s' has invalid dtype %d", nm,
                            (int)t->dtype);
        if (t->ndim < 0 || t->ndim > CT_MAX_DIMS)
            return ct_error(CT_EINVAL, "ct_save_safetensors: tensor '%s' has ndim %d (0..%d)", nm,
                            t->ndim, CT_MAX_DIMS);
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0)
                return ct_error(CT_EINVAL, "ct_save_safetensors: tensor '%s' has shape[%d] = %lld",
                                nm, d, (long long)t->shape[d]);
            if (__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel))
                return ct_error(CT_EOVERFLOW,
                                "ct_save_safetensors: tensor '%s': element count "
                                "overflows",
                                nm);
        }
        if (numel && !t->data)
            return ct_error(CT_EINVAL, "ct_save_safetensors: tensor '%s' has NULL data", nm);
    } else {
        if ((unsigned)e->st_dtype >= CT_ST_DTYPE_COUNT)
            return ct_error(CT_EINVAL,
                            "ct_save_safetensors: raw entry '%s' has invalid "
                            "st_dtype %d",
                            nm, (int)e->st_dtype);
        p->dt = e->st_dtype;
        if (e->ndim < 0 || (e->ndim > 0 && !e->shape))
            return ct_error(CT_EINVAL,
                            "ct_save_safetensors: raw entry '%s' has ndim %d and "
                            "%s shape",
                            nm, e->ndim, e->shape ? "a" : "a NULL");
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] < 0)
                return ct_error(CT_EINVAL,
                                "ct_save_safetensors: raw entry '%s' has shape[%d] "
                                "= %lld",
                                nm, d, (long long)e->shape[d]);
            if (__builtin_mul_overflow(numel, (uint64_t)e->shape[d], &numel))
                return ct_error(CT_EOVERFLOW,
                                "ct_save_safetensors: raw entry '%s': element "
                                "count overflows",
                                nm);
        }
    }
    p->bits = ct_st_dtype_bits(p->dt);
    uint64_t nbits;
    if (__builtin_mul_overflow(numel, (uint64_t)p->bits, &nbits))
        return ct_error(CT_EOVERFLOW, "ct_save_safetensors: '%s': size overflows", nm);
    if (nbits % 8)
        return ct_error(CT_EINVAL,
                        "ct_save_safetensors: raw entry '%s': %llu elements of %s "
                        "do not fill whole bytes",
                        nm, (unsigned long long)numel, ct_st_dtype_name(p->dt));
    p->nbytes = nbits / 8;
    if (!e->tensor && p->nbytes && !e->data)
        return ct_error(CT_EINVAL, "ct_save_safetensors: raw entry '%s' has NULL data", nm);
    return CT_OK;
}

/* ---- header --------------------------------------------------------------------------- */

static json_t *shape_json(const plan_item *p)
{
    const ct_save_entry *e = p->e;
    int nd = e->tensor ? e->tensor->ndim : e->ndim;
    const int64_t *sh = e->tensor ? e->tensor->shape : e->shape;
    json_t *a = json_array();
    for (int d = 0; a && d < nd; d++)
        if (json_array_append_new(a, json_integer((json_int_t)sh[d])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* The 8-byte length and the space-padded header in one ct_alloc'd buffer. */
static ct_status build_header(const plan_item *items, size_t count, const char *const *mk,
                              const char *const *mv, size_t mcount, uint8_t **out, size_t *len)
{
    json_t *root = json_object();
    ct_status s = CT_OK;
    if (!root) return ct_error(CT_ENOMEM, "ct_save_safetensors: out of memory (header)");
    if (mcount) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m) != 0) goto nomem;
        for (size_t i = 0; i < mcount; i++)
            if (json_object_set_new(m, mk[i], json_string(mv[i])) != 0) goto nomem;
    }
    for (size_t i = 0; i < count; i++) {
        const plan_item *p = &items[i];
        json_t *sh = shape_json(p);
        json_t *o =
            sh ? json_pack("{s:s, s:o, s:[I, I]}", "dtype", ct_st_dtype_name(p->dt), "shape", sh,
                           "data_offsets", (json_int_t)p->begin, (json_int_t)(p->begin + p->nbytes))
               : NULL;
        if (!o || json_object_set_new(root, p->e->name, o) != 0) goto nomem;
    }
    size_t n = json_dumpb(root, NULL, 0, JSON_COMPACT);
    if (n == 0) goto nomem;
    size_t padded = (n + 7) / 8 * 8;
    if (padded > CT_ST_MAX_HEADER) {
        s = ct_error(CT_EINVAL,
                     "ct_save_safetensors: the header would be %zu bytes, more than "
                     "the %llu a reader accepts (too many tensors or too much metadata)",
                     padded, CT_ST_MAX_HEADER);
        goto done;
    }
    uint8_t *buf;
    if ((s = ct_alloc((void **)&buf, 8 + padded))) goto done;
    json_dumpb(root, (char *)buf + 8, n, JSON_COMPACT);
    memset(buf + 8 + n, ' ', padded - n);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    *out = buf;
    *len = 8 + padded;
    goto done;
nomem:
    s = ct_error(CT_ENOMEM, "ct_save_safetensors: out of memory building the header");
done:
    json_decref(root);
    return s;
}

/* ---- writing -------------------------------------------------------------------------- */

typedef struct st_writer {
    int fd;
    const char *path; /* the target, for messages */
    uint64_t written;
    uint8_t *stage; /* STAGE_BYTES, allocated on first need */
} st_writer;

static ct_status write_all(st_writer *w, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t r = write(w->fd, b, n < WRITE_MAX ? n : WRITE_MAX);
        if (r < 0) {
            if (errno == EINTR) continue;
            return ct_error(CT_EIO, "ct_save_safetensors: writing '%s' failed after %llu bytes: %s",
                            w->path, (unsigned long long)w->written, strerror(errno));
        }
        b += r;
        n -= (size_t)r;
        w->written += (uint64_t)r;
    }
    return CT_OK;
}

/* Write a strided tensor in row-major order through the staging buffer: whole tensor, or
 * groups of rows along dim 0, or one row at a time recursively when a row alone is larger. */
static ct_status write_strided(st_writer *w, const ct_tensor *t)
{
    size_t es = ct_dtype_size(t->dtype), bytes = (size_t)ct_tensor_numel(t) * es;
    if (bytes == 0) return CT_OK;
    if (!w->stage) CT_TRY(ct_alloc((void **)&w->stage, STAGE_BYTES));
    if (bytes <= STAGE_BYTES) {
        ct_tensor d;
        CT_TRY(ct_tensor_wrap(&d, w->stage, t->dtype, t->ndim, t->shape, NULL));
        CT_TRY(ct_tensor_copy(&d, t));
        return write_all(w, w->stage, bytes);
    }
    int64_t rows = t->shape[0];
    size_t row_bytes = bytes / (size_t)rows;
    int64_t group = row_bytes <= STAGE_BYTES ? (int64_t)(STAGE_BYTES / row_bytes) : 1;
    for (int64_t i = 0; i < rows; i += group) {
        ct_tensor sub = *t;
        sub.owns = false;
        sub.data = (char *)t->data + i * t->strides[0] * (int64_t)es;
        if (row_bytes <= STAGE_BYTES) {
            sub.shape[0] = rows - i < group ? rows - i : group;
        } else { /* drop dim 0 */
            sub.ndim = t->ndim - 1;
            memmove(sub.shape, t->shape + 1, sizeof(int64_t) * (size_t)sub.ndim);
            memmove(sub.strides, t->strides + 1, sizeof(int64_t) * (size_t)sub.ndim);
        }
        CT_TRY(write_strided(w, &sub));
    }
    return CT_OK;
}

static ct_status write_item(st_writer *w, const plan_item *p)
{
    const ct_tensor *t = p->e->tensor;
    if (!t) return write_all(w, p->e->data, (size_t)p->nbytes);
    if (ct_tensor_is_contiguous(t)) return write_all(w, t->data, (size_t)p->nbytes);
    return write_strided(w, t);
}

/* ---- the temp file and the rename ----------------------------------------------------- */

typedef struct st_target {
    char *dir;  /* folder of the target ("." if none) */
    char *base; /* file name of the target (its first 200 bytes), for temp names */
    char *tmp;  /* name of the named temp file (when one exists) */
    const char *path;
} st_target;

static unsigned tmp_seq;

static ct_status split_path(const char *path, st_target *t)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return ct_error(CT_EINVAL, "ct_save_safetensors: path '%s' does not name a file", path);
    size_t dl = slash ? (size_t)(slash - path) : 1, bl = strlen(base);
    if (slash && dl == 0) dl = 1; /* "/name" */
    CT_TRY(ct_alloc((void **)&t->dir, dl + 1));
    if (slash)
        memcpy(t->dir, path, dl);
    else
        t->dir[0] = '.';
    t->dir[dl] = '\0';
    if (bl > 200) bl = 200; /* temp names must stay under NAME_MAX (255) */
    CT_TRY(ct_alloc((void **)&t->base, bl + 1));
    memcpy(t->base, base, bl);
    t->base[bl] = '\0';
    CT_TRY(ct_alloc((void **)&t->tmp, dl + bl + 64));
    t->tmp[0] = '\0';
    t->path = path;
    return CT_OK;
}

static void named_tmp(st_target *t)
{
    unsigned seq = __atomic_fetch_add(&tmp_seq, 1, __ATOMIC_RELAXED);
    sprintf(t->tmp, "%s/.%s.ctorch-tmp.%ld.%u", t->dir, t->base, (long)getpid(), seq);
}

/* Remove named temp files of this target left by processes that no longer exist. */
static void remove_stale(const st_target *t)
{
    DIR *d = opendir(t->dir);
    if (!d) return;
    size_t pl = strlen(t->base) + 13;
    char *prefix;
    if (ct_alloc((void **)&prefix, pl + 1) == CT_OK) {
        snprintf(prefix, pl + 1, ".%s.ctorch-tmp.", t->base);
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (strncmp(de->d_name, prefix, pl) != 0) continue;
            char *end;
            long pid = strtol(de->d_name + pl, &end, 10);
            if (pid <= 0 || *end != '.' || pid == (long)getpid()) continue;
            if (kill((pid_t)pid, 0) == -1 && errno == ESRCH) unlinkat(dirfd(d), de->d_name, 0);
        }
        ct_free(prefix);
    }
    closedir(d);
}

/* Give an O_TMPFILE inode a name in the folder (fails without /proc or the capability). */
static bool link_anonymous(int fd, st_target *t)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    for (int tries = 0; tries < 8; tries++) {
        named_tmp(t);
        if (linkat(fd, "", AT_FDCWD, t->tmp, AT_EMPTY_PATH) == 0 ||
            linkat(AT_FDCWD, proc, AT_FDCWD, t->tmp, AT_SYMLINK_FOLLOW) == 0)
            return true;
        if (errno != EEXIST) break;
    }
    t->tmp[0] = '\0';
    return false;
}

/* One attempt: returns CT_OK, an error, or CT_EUNSUPPORTED (silently, *retry set) when the
 * anonymous inode could not be linked and the caller should retry with a named file. */
static ct_status save_once(st_target *t, bool anonymous, const ct_save_options *o,
                           const uint8_t *hdr, size_t hlen, const plan_item *items, size_t count,
                           bool *retry)
{
    st_writer w = {-1, t->path, 0, NULL};
    ct_status s = CT_OK;
    struct stat old;
    bool have_old = stat(t->path, &old) == 0 && S_ISREG(old.st_mode);
    *retry = false;
    if (anonymous) {
        w.fd = open(t->dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
        if (w.fd < 0) anonymous = false;
    }
    if (!anonymous) {
        for (int tries = 0; tries < 8; tries++) {
            named_tmp(t);
            w.fd = open(t->tmp, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0666);
            if (w.fd >= 0 || errno != EEXIST) break;
        }
        if (w.fd < 0) {
            s = ct_error(CT_EIO,
                         "ct_save_safetensors: cannot create a temp file in '%s' for '%s': %s",
                         t->dir, t->path, strerror(errno));
            t->tmp[0] = '\0';
            goto fail;
        }
    }
    if (have_old) (void)fchmod(w.fd, old.st_mode & 07777);
    if ((s = write_all(&w, hdr, hlen))) goto fail;
    for (size_t i = 0; i < count; i++)
        if ((s = write_item(&w, &items[i]))) goto fail;
    if (o->sync && fsync(w.fd) != 0) {
        s = ct_error(CT_EIO, "ct_save_safetensors: fsync of '%s' failed: %s", t->path,
                     strerror(errno));
        goto fail;
    }
    if (anonymous && !link_anonymous(w.fd, t)) {
        *retry = true;
        s = CT_EUNSUPPORTED;
        goto fail;
    }
    if (close(w.fd) != 0) {
        w.fd = -1;
        s = ct_error(CT_EIO, "ct_save_safetensors: closing '%s' failed: %s", t->path,
                     strerror(errno));
        goto fail;
    }
    w.fd = -1;
    if (rename(t->tmp, t->path) != 0) {
        s = ct_error(CT_EIO, "ct_save_safetensors: cannot rename the temp file over '%s': %s",
                     t->path, strerror(errno));
        goto fail;
    }
    t->tmp[0] = '\0';
    if (o->sync) {
        int dfd = open(t->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL && errno != EROFS)) {
            s = ct_error(CT_EIO,
                         "ct_save_safetensors: '%s' was written but fsync of its folder "
                         "'%s' failed: %s",
                         t->path, t->dir, strerror(errno));
        }
        if (dfd >= 0) close(dfd);
    }
    ct_free(w.stage);
    return s;
fail:
    if (w.fd >= 0) close(w.fd);
    if (t->tmp[0]) unlink(t->tmp);
    t->tmp[0] = '\0';
    ct_free(w.stage);
    return s;
}

ct_status ct_save_safetensors_entries(const char *path, const ct_save_entry *entries, size_t count,
                                      const char *const *meta_keys, const char *const *meta_values,
                                      size_t meta_count, const ct_save_options *opts)
{
    if (!path) return ct_error(CT_EINVAL, "ct_save_safetensors: path must not be NULL");
    if (count && !entries)
        return ct_error(CT_EINVAL, "ct_save_safetensors: %zu tensors but no entries", count);
    if (meta_count && (!meta_keys || !meta_values))
        return ct_error(CT_EINVAL,
                        "ct_save_safetensors: %zu metadata entries but keys or "
                        "values is NULL",
                        meta_count);
    for (size_t i = 0; i < meta_count; i++) {
        CT_TRY(check_text("meta_keys", i, meta_keys[i]));
        CT_TRY(check_text("meta_values", i, meta_values[i]));
    }
    ct_save_options o = opts ? *opts : ct_save_options_default();
    plan_item *items = NULL, *sorted = NULL;
    const char **names = NULL;
    uint8_t *hdr = NULL;
    size_t hlen = 0;
    st_target t = {NULL, NULL, NULL, path};
    ct_status s;
    const char *dup;
    if ((s = ct_calloc((void **)&items, (count ? count : 1) * sizeof *items)) ||
        (s = ct_calloc((void **)&sorted, (count ? count : 1) * sizeof *sorted)) ||
        (s = ct_calloc((void **)&names, (count ? count : 1) * sizeof *names)))
        goto done;
    for (size_t i = 0; i < count; i++) {
        if ((s = plan_entry(&entries[i], i, &items[i]))) goto done;
        names[i] = entries[i].name;
    }
    if ((s = find_duplicate(names, count, &dup))) goto done;
    if (dup) {
        char q[96];
        s = ct_error(CT_EINVAL, "ct_save_safetensors: two tensors are named '%s'",
                     ct_io_quote(q, sizeof q, dup));
        goto done;
    }
    if ((s = find_duplicate(meta_keys, meta_count, &dup))) goto done;
    if (dup) {
        char q[96];
        s = ct_error(CT_EINVAL, "ct_save_safetensors: metadata key '%s' appears twice",
                     ct_io_quote(q, sizeof q, dup));
        goto done;
    }
    /* Layout order: descending element bits, ties in the order given. */
    static const int order_bits[] = {64, 32, 16, 8, 6, 4};
    size_t k = 0;
    uint64_t off = 0;
    for (size_t b = 0; b < sizeof order_bits / sizeof order_bits[0]; b++)
        for (size_t i = 0; i < count; i++)
            if (items[i].bits == order_bits[b]) {
                sorted[k] = items[i];
                sorted[k].begin = off;
                off += items[i].nbytes;
                k++;
            }
    if ((s = build_header(sorted, count, meta_keys, meta_values, meta_count, &hdr, &hlen)))
        goto done;
    if ((s = split_path(path, &t))) goto done;
    bool retry;
    s = save_once(&t, o.anonymous_temp, &o, hdr, hlen, sorted, count, &retry);
    if (retry) s = save_once(&t, false, &o, hdr, hlen, sorted, count, &retry);
    if (s == CT_OK) remove_stale(&t);
done:
    ct_free(items);
    ct_free(sorted);
    ct_free(names);
    ct_free(hdr);
    ct_free(t.dir);
    ct_free(t.base);
    ct_free(t.tmp);
    return s;
}

ct_status ct_save_safetensors(const char *path, const ct_tensor *tensors, const char *const *names,
                              size_t count, const char *const *meta_keys,
                              const char *const *meta_values, size_t meta_count,
                              const ct_save_options *opts)
{
    if (count && (!tensors || !names))
        return ct_error(CT_EINVAL,
                        "ct_save_safetensors: %zu tensors but tensors or names is "
                        "NULL",
                        count);
    ct_save_entry *e;
    CT_TRY(ct_calloc((void **)&e, (count ? count : 1) * sizeof *e));
    for (size_t i = 0; i < count; i++) {
        e[i].name = names[i];
        e[i].tensor = &tensors[i];
    }
    ct_status s =
        ct_save_safetensors_entries(path, e, count, meta_keys, meta_values, meta_count, opts);
    ct_free(e);
    return s;
}
