/* Sharded checkpoints of the distributed trainer (include/ctorch/fsdp.h): one safetensors file
 * per rank, a JSON index, a commit marker written last and OUT/latest switched by rename;
 * loading with any world size reads only the rows a rank holds. */
#include "dist/trainer_internal.h"
#include "io/io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_NAME "index.json"
#define COMMIT_NAME "COMMITTED"
#define PATH_CAP 4096

static const char *MOMENT[3] = {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."};

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static ct_status path_join(char *buf, const char *a, const char *b)
{
    int n = snprintf(buf, PATH_CAP, "%s/%s", a, b);
    if (n < 0 || n >= PATH_CAP) return ct_error(CT_EINVAL, "checkpoint: path '%s/%s' is too long", a, b);
    return CT_OK;
}

/* Write text to path atomically (temp file, fsync, rename). */
static ct_status write_atomic(const char *path, const char *text)
{
    char tmp[PATH_CAP + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ct_error(CT_EIO, "checkpoint: open '%s': %s", tmp, strerror(errno));
    size_t n = strlen(text), off = 0;
    while (off < n) {
        ssize_t w = write(fd, text + off, n - off);
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return ct_error(CT_EIO, "checkpoint: write '%s': %s", tmp, strerror(e));
        }
        off += (size_t)w;
    }
    if (fsync(fd) || close(fd)) {
        unlink(tmp);
        return ct_error(CT_EIO, "checkpoint: fsync '%s': %s", tmp, strerror(errno));
    }
    if (rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        return ct_error(CT_EIO, "checkpoint: rename to '%s': %s", path, strerror(e));
    }
    return CT_OK;
}

static void sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* ---- metadata ----------------------------------------------------------------------------- */

/* The metadata pairs of a checkpoint of t (ct_trainer_save's keys) plus the caller's. */
typedef struct meta {
    const char *k[32], *v[32];
    size_t n;
    char *cfg, *trn;
    char step[32], epoch[32], pos[32], rng[80];
} meta;

static const char *RESERVED[] = {"format", "config", "train", "step", "epoch", "data_pos", "rng"};

static ct_status meta_make(const ct_fsdp_trainer *t, const char *format, size_t n_extra,
                           const char *const *keys, const char *const *values, meta *m)
{
    memset(m, 0, sizeof *m);
    if (n_extra > 20) return ct_error(CT_EINVAL, "checkpoint: at most 20 extra metadata pairs");
    for (size_t i = 0; i < n_extra; i++) {
        if (!keys || !values || !keys[i] || !values[i])
            return ct_error(CT_EINVAL, "checkpoint: extra metadata pair %zu is NULL", i);
        for (size_t r = 0; r < sizeof RESERVED / sizeof *RESERVED; r++)
            if (!strcmp(keys[i], RESERVED[r]))
                return ct_error(CT_EINVAL, "checkpoint: extra metadata key '%s' is reserved",
                                keys[i]);
    }
    CT_TRY(ct_gpt_config_to_json(&t->cfg, &m->cfg));
    ct_status s = ct_train_options_to_json(&t->o, &m->trn);
    if (s) {
        ct_free(m->cfg);
        return s;
    }
    snprintf(m->step, sizeof m->step, "%lld", (long long)t->step);
    snprintf(m->epoch, sizeof m->epoch, "%lld", (long long)t->epoch);
    snprintf(m->pos, sizeof m->pos, "%lld", (long long)t->pos);
    snprintf(m->rng, sizeof m->rng, "%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64,
             t->rng.s[0], t->rng.s[1], t->rng.s[2], t->rng.s[3]);
    const char *vals[] = {format, m->cfg, m->trn, m->step, m->epoch, m->pos, m->rng};
    for (size_t r = 0; r < 7; r++)
        m->k[m->n] = RESERVED[r], m->v[m->n++] = vals[r];
    for (size_t i = 0; i < n_extra; i++)
        m->k[m->n] = keys[i], m->v[m->n++] = values[i];
    return CT_OK;
}

static void meta_free(meta *m)
{
    ct_free(m->cfg);
    ct_free(m->trn);
}

/* A metadata source: a tensor file, or the index's "metadata" object. */
typedef struct msrc {
    const ct_tensor_file *f;
    json_t *obj;
} msrc;

static const char *mget(const msrc *m, const char *key)
{
    if (m->f) return ct_tensor_file_metadata_get(m->f, key);
    return json_string_value(json_object_get(m->obj, key));
}

static const char *msrc_get(const void *m, const char *key)
{
    return mget(m, key);
}

/* Check the configuration and read step, epoch, data position and random state. */
static ct_status meta_read(const ct_fsdp_trainer *t, const msrc *m, int64_t *step, int64_t *epoch,
                           int64_t *pos, ct_rng *rng)
{
    const char *js = mget(m, "config");
    if (!js) return ct_error(CT_EFORMAT, "checkpoint: metadata \"config\" is missing");
    ct_gpt_config c = ct_gpt_config_default();
    if (ct_gpt_config_from_json(js, &c))
        return ct_error_wrap(CT_EFORMAT, "checkpoint: bad \"config\"");
    char *mine = NULL, *theirs = NULL;
    ct_status s = ct_gpt_config_to_json(&t->cfg, &mine);
    if (!s) s = ct_gpt_config_to_json(&c, &theirs);
    if (!s && strcmp(mine, theirs))
        s = ct_error(CT_EFORMAT, "checkpoint: its model configuration %s differs from this run's %s",
                     theirs, mine);
    ct_free(mine);
    ct_free(theirs);
    CT_TRY(s);
    CT_TRY(gpt_read_trainer_state(msrc_get, m, step, epoch, pos, rng)); /* shared with train.c */
    if (*pos > t->n_train)
        return ct_error(CT_EFORMAT,
                        "checkpoint: data position %lld is past the end of the training data "
                        "(%lld tokens)",
                        (long long)*pos, (long long)t->n_train);
    return CT_OK;
}

/* ---- save ----------------------------------------------------------------------------------- */

static ct_status barrier(ct_fsdp_trainer *t, double *flag)
{
    return ct_fsdp_all_reduce_f64(t->f, flag, 1);
}

static void shard_file_name(char *buf, size_t cap, int r, int N)
{
    snprintf(buf, cap, "model-%05d-of-%05d.safetensors", r, N);
}

/* This rank's shard file: its rows of every parameter and moment. */
static ct_status write_shard(ct_fsdp_trainer *t, const char *path, const meta *md)
{
    ct_fsdp *f = t->f;
    int nt = ct_fsdp_num_tensors(f);
    size_t cap = 3 * (size_t)nt;
    ct_tensor *tens = NULL;
    char **names = NULL, *buf = NULL;
    ct_status s;
    if ((s = ct_alloc((void **)&tens, cap * sizeof *tens)) ||
        (s = ct_alloc((void **)&names, cap * sizeof *names)) || (s = ct_alloc((void **)&buf, cap * 160)))
        goto done;
    size_t n = 0;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < nt && !s; i++) {
            const char *name;
            int nd;
            int64_t shape[2], r0, r1;
            float *ptr[3];
            s = ct_fsdp_tensor(f, i, &name, &nd, shape, &r0, &r1, &ptr[0], &ptr[1], &ptr[2]);
            if (s || r1 <= r0) continue;
            int64_t sh[2] = {r1 - r0, shape[1]};
            if ((s = ct_tensor_wrap(&tens[n], ptr[k], CT_DTYPE_F32, nd, sh, NULL))) break;
            names[n] = buf + n * 160;
            snprintf(names[n], 160, "%s%s", MOMENT[k], name);
            n++;
        }
    if (!s)
        s = ct_save_safetensors(path, tens, (const char *const *)names, n, md->k, md->v, md->n, NULL);
done:
    ct_free(buf);
    ct_free(names);
    ct_free(tens);
    return s;
}

/* The index of a checkpoint with N ranks (rows by ceil(rows / N) chunks; replicated: all in
 * rank 0's file). */
static char *index_json(ct_fsdp_trainer *t, int N, bool replicated, const meta *md)
{
    ct_fsdp *f = t->f;
    json_t *root = json_object(), *tensors = json_object(), *mj = json_object();
    json_object_set_new(root, "format", json_string("ctorch-sharded"));
    json_object_set_new(root, "world_size", json_integer(N));
    json_object_set_new(root, "step", json_integer((json_int_t)t->step));
    json_object_set_new(root, "mode", json_string(replicated ? "dp" : "fsdp"));
    for (size_t i = 0; i < md->n; i++)
        json_object_set_new(mj, md->k[i], json_string(md->v[i]));
    json_object_set_new(root, "metadata", mj);
    int nt = ct_fsdp_num_tensors(f);
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < nt; i++) {
            const char *name;
            int nd;
            int64_t shape[2];
            ct_fsdp_tensor(f, i, &name, &nd, shape, NULL, NULL, NULL, NULL, NULL);
            json_t *e = json_object(), *sh = json_array(), *shards = json_array();
            for (int d = 0; d < nd; d++)
                json_array_append_new(sh, json_integer((json_int_t)shape[d]));
            int64_t rows = shape[0], chunk = replicated ? rows : (rows + N - 1) / N;
            for (int r = 0; r < (replicated ? 1 : N); r++) {
                int64_t b = (int64_t)r * chunk, en = b + chunk < rows ? b + chunk : rows;
                if (en <= b) continue;
                char fn[64];
                shard_file_name(fn, sizeof fn, r, replicated ? 1 : N);
                json_array_append_new(shards, json_pack("{s:s, s:I, s:I}", "file", fn, "begin",
                                                        (json_int_t)b, "end", (json_int_t)en));
            }
            json_object_set_new(e, "shape", sh);
            json_object_set_new(e, "dtype", json_string("F32"));
            json_object_set_new(e, "shards", shards);
            char nm[160];
            snprintf(nm, sizeof nm, "%s%s", MOMENT[k], name);
            json_object_set_new(tensors, nm, e);
        }
    json_object_set_new(root, "tensors", tensors);
    char *s = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return s;
}

/* Open OUT/<name> (rank 0 creates it first) without following a link there: a link or a
 * file planted as OUT/checkpoint-<step> would send the save elsewhere. *fd is the directory;
 * base is a path that reaches it through that descriptor (/proc/self/fd/N), so what the
 * rank writes lands in the directory checked here, whatever is renamed meanwhile. */
static ct_status open_step_dir(const char *out_dir, const char *name, bool create, int *fd,
                               char base[PATH_CAP])
{
    *fd = -1;
    int ofd = open(out_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (ofd < 0 && create && errno == ENOENT && mkdir(out_dir, 0777) == 0)
        ofd = open(out_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (ofd < 0) return ct_error(CT_EIO, "checkpoint: open '%s': %s", out_dir, strerror(errno));
    if (create && mkdirat(ofd, name, 0777) && errno != EEXIST) {
        int e = errno;
        close(ofd);
        return ct_error(CT_EIO, "checkpoint: mkdir '%s/%s': %s", out_dir, name, strerror(e));
    }
    int dfd = openat(ofd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int e = errno;
    struct stat ls;
    bool link = dfd < 0 && fstatat(ofd, name, &ls, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(ls.st_mode);
    close(ofd);
    if (dfd < 0) {
        if (link || e == ELOOP)
            return ct_error(CT_EINVAL,
                            "checkpoint: '%s/%s' is a symbolic link: refused (a save writes only "
                            "into a directory it made; remove the link)",
                            out_dir, name);
        if (e == ENOTDIR)
            return ct_error(CT_EINVAL, "checkpoint: '%s/%s' is not a directory: refused (remove it)",
                            out_dir, name);
        return ct_error(CT_EIO, "checkpoint: open '%s/%s': %s", out_dir, name, strerror(e));
    }
    struct stat a, b;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", dfd);
    if (stat(proc, &b) == 0 && fstat(dfd, &a) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
        snprintf(base, PATH_CAP, "%s", proc);
    } else { /* no /proc: the path (checked just now) */
        ct_status s = path_join(base, out_dir, name);
        if (s) {
            close(dfd);
            return s;
        }
    }
    *fd = dfd;
    return CT_OK;
}

ct_status ct_fsdp_trainer_save(ct_fsdp_trainer *t, const char *out_dir, size_t n_extra,
                               const char *const *keys, const char *const *values)
{
    if (!t || !out_dir) return ct_error(CT_EINVAL, "ct_fsdp_trainer_save: t and out_dir must not be NULL");
    ct_fsdp *f = t->f;
    int r = ct_fsdp_rank(f), N = ct_fsdp_world_size(f);
    bool replicated = ct_fsdp_get_options(f)->mode == CT_FSDP_REPLICATE;
    char dir[PATH_CAP], name[64], path[PATH_CAP];
    snprintf(name, sizeof name, "checkpoint-%lld", (long long)t->step);
    CT_TRY(path_join(dir, out_dir, name));
    meta md;
    CT_TRY(meta_make(t, "ctorch-gpt-shard", n_extra, keys, values, &md));
    ct_status s = CT_OK;
    double bad = 0;
    int dfd = -1;
    char shown[PATH_CAP]; /* the directory as the user knows it, for messages */
    snprintf(shown, sizeof shown, "%s", dir);
    if (r == 0) {
        s = open_step_dir(out_dir, name, true, &dfd, dir);
        /* rewriting a step: it is not committed until written again */
        if (!s) unlinkat(dfd, COMMIT_NAME, 0);
        if (s) bad = 1;
    }
    ct_status bs = barrier(t, &bad);
    if (bs || bad) {
        meta_free(&md);
        if (dfd >= 0) close(dfd);
        return bs ? bs : s ? s : ct_error(CT_EIO, "checkpoint: rank 0 could not create '%s'", shown);
    }
    if (r != 0 && (s = open_step_dir(out_dir, name, false, &dfd, dir)) != CT_OK) bad = 1;
    bs = barrier(t, &bad);
    if (bs || bad) {
        meta_free(&md);
        if (dfd >= 0) close(dfd);
        return bs ? bs : s ? s : ct_error(CT_EIO, "checkpoint: a rank could not open '%s'", shown);
    }
    bad = 0;
    if (!replicated || r == 0) {
        shard_file_name(name, sizeof name, r, replicated ? 1 : N);
        if (!(s = path_join(path, dir, name))) s = write_shard(t, path, &md);
        if (s) s = ct_error_wrap(s, "checkpoint: writing %s/%s", shown, name), bad = 1;
    }
    char msg[512] = "";
    if (s) snprintf(msg, sizeof msg, "%s", ct_last_error());
    bs = barrier(t, &bad);
    if (bs || bad) {
        meta_free(&md);
        close(dfd);
        if (bs) return bs;
        return s ? ct_error(s, "%s", msg)
                 : ct_error(CT_EIO, "checkpoint: another rank failed to write its shard");
    }
    bad = 0;
    if (r == 0) {
        char *idx = index_json(t, N, replicated, &md);
        if (!idx) s = ct_error(CT_ENOMEM, "checkpoint: index");
        if (!s && !(s = path_join(path, dir, INDEX_NAME))) s = write_atomic(path, idx);
        free(idx);
        if (!s) fsync(dfd);
        /* the commit marker, last */
        if (!s && !(s = path_join(path, dir, COMMIT_NAME))) s = write_atomic(path, name);
        if (!s) fsync(dfd);
        /* OUT/latest -> checkpoint-<step>, switched by rename */
        char lt[PATH_CAP], ln[PATH_CAP + 32], target[64];
        snprintf(target, sizeof target, "checkpoint-%lld", (long long)t->step);
        if (!s) s = path_join(lt, out_dir, "latest");
        if (!s) {
            snprintf(ln, sizeof ln, "%s.tmp.%d", lt, (int)getpid());
            unlink(ln);
            if (symlink(target, ln) || rename(ln, lt)) {
                s = ct_error(CT_EIO, "checkpoint: switching '%s': %s", lt, strerror(errno));
                unlink(ln);
            }
        }
        if (!s) sync_dir(out_dir);
        if (s) bad = 1, snprintf(msg, sizeof msg, "%s", ct_last_error());
    }
    meta_free(&md);
    close(dfd);
    bs = barrier(t, &bad);
    if (bs) return bs;
    if (bad) return s ? ct_error(s, "%s", msg) : ct_error(CT_EIO, "checkpoint: rank 0 could not commit");
    return CT_OK;
}

/* ---- resolve, index ------------------------------------------------------------------------ */

ct_status ct_sharded_checkpoint_resolve(const char *path, char **resolved, bool *dir)
{
    if (!path || !resolved || !dir)
        return ct_error(CT_EINVAL, "ct_sharded_checkpoint_resolve: arguments must not be NULL");
    char p[PATH_CAP], q[PATH_CAP];
    snprintf(p, sizeof p, "%s", path);
    if (is_dir(p) && !exists((path_join(q, p, INDEX_NAME), q))) {
        if (path_join(q, p, "latest") == CT_OK && is_dir(q)) snprintf(p, sizeof p, "%s", q);
    }
    *dir = is_dir(p);
    if (*dir) {
        CT_TRY(path_join(q, p, COMMIT_NAME));
        if (!exists(q))
            return ct_error(CT_EFORMAT,
                            "checkpoint: '%s' is not a committed sharded checkpoint (no %s)", p,
                            COMMIT_NAME);
    } else if (!exists(p)) {
        return ct_error(CT_EIO, "checkpoint: '%s' does not exist", p);
    }
    size_t n = strlen(p);
    CT_TRY(ct_alloc((void **)resolved, n + 1));
    memcpy(*resolved, p, n + 1);
    return CT_OK;
}

/* The parsed index of a committed sharded checkpoint, validated. */
static ct_status load_index(const char *dir, json_t **out)
{
    char p[PATH_CAP];
    CT_TRY(path_join(p, dir, INDEX_NAME));
    struct stat st;
    if (lstat(p, &st)) return ct_error(CT_EFORMAT, "checkpoint: '%s' is missing", p);
    char *text;
    size_t len;
    ct_status rs = ct_file_read_all(p, "checkpoint index", CT_FILE_INDEX_MAX, &text, &len);
    if (rs) return ct_error_wrap(rs, "checkpoint");
    json_error_t err;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    ct_free(text);
    if (!j) return ct_error(CT_EFORMAT, "checkpoint: '%s': %s (line %d)", p, err.text, err.line);
    const char *fmt = json_string_value(json_object_get(j, "format"));
    json_t *ws = json_object_get(j, "world_size"), *tens = json_object_get(j, "tensors");
    if (!fmt || strcmp(fmt, "ctorch-sharded") || !json_is_integer(ws) ||
        json_integer_value(ws) < 1 || json_integer_value(ws) > 65536 || !json_is_object(tens) ||
        !json_is_object(json_object_get(j, "metadata"))) {
        json_decref(j);
        return ct_error(CT_EFORMAT,
                        "checkpoint: '%s' is not a ctorch-sharded index (format, world_size, "
                        "tensors, metadata)",
                        p);
    }
    *out = j;
    return CT_OK;
}

ct_status ct_sharded_checkpoint_metadata(const char *dir, const char *key, char **value)
{
    if (!dir || !key || !value)
        return ct_error(CT_EINVAL, "ct_sharded_checkpoint_metadata: arguments must not be NULL");
    json_t *j;
    CT_TRY(load_index(dir, &j));
    const char *v = json_string_value(json_object_get(json_object_get(j, "metadata"), key));
    ct_status s = CT_OK;
    if (!v) {
        s = ct_error(CT_EFORMAT, "checkpoint: the index of '%s' has no metadata \"%s\"", dir, key);
    } else {
        size_t n = strlen(v);
        if (!(s = ct_alloc((void **)value, n + 1))) memcpy(*value, v, n + 1);
    }
    json_decref(j);
    return s;
}

/* Open shard files lazily, each once. */
typedef struct files {
    const char *dir;
    char names[64][64];
    ct_tensor_file *f[64];
    int n;
} files;

static ct_status files_get(files *fs, const char *name, ct_tensor_file **out)
{
    if (strchr(name, '/') || !strcmp(name, "..") || strlen(name) >= 64)
        return ct_error(CT_EFORMAT, "checkpoint: shard file name '%s' is not a plain name", name);
    for (int i = 0; i < fs->n; i++)
        if (!strcmp(fs->names[i], name)) {
            *out = fs->f[i];
            return CT_OK;
        }
    if (fs->n == 64) { /* a bounded cache: close the oldest */
        ct_tensor_file_close(fs->f[0]);
        memmove(fs->f, fs->f + 1, 63 * sizeof fs->f[0]);
        memmove(fs->names, fs->names + 1, sizeof fs->names - sizeof fs->names[0]);
        fs->n--;
    }
    char p[PATH_CAP];
    CT_TRY(path_join(p, fs->dir, name));
    CT_TRY(ct_load(p, NULL, &fs->f[fs->n]));
    snprintf(fs->names[fs->n], 64, "%s", name);
    *out = fs->f[fs->n++];
    return CT_OK;
}

static void files_close(files *fs)
{
    for (int i = 0; i < fs->n; i++)
        ct_tensor_file_close(fs->f[i]);
    fs->n = 0;
}

/* Copy rows [r0, r1) of tensor `name` (shape rows x cols) from a tensor file holding rows
 * [b, e) of it into dst. */
static ct_status copy_rows(const ct_tensor_file *tf, const char *name, int64_t b, int64_t e,
                           int64_t cols, int64_t r0, int64_t r1, float *dst)
{
    size_t idx;
    if (ct_tensor_file_find(tf, name, &idx) != CT_OK)
        return ct_error(CT_EFORMAT, "checkpoint: tensor '%s' is missing", name);
    ct_tensor_info info;
    CT_TRY(ct_tensor_file_info(tf, idx, &info));
    if (!info.has_dtype || info.dtype != CT_DTYPE_F32 || info.ndim < 1 || info.ndim > 2 ||
        info.shape[0] != e - b || (info.ndim == 2 ? info.shape[1] : 1) != cols)
        return ct_error(CT_EFORMAT,
                        "checkpoint: tensor '%s' is not f32 rows [%lld, %lld) of %lld columns", name,
                        (long long)b, (long long)e, (long long)cols);
    int64_t lo = r0 > b ? r0 : b, hi = r1 < e ? r1 : e;
    if (hi <= lo) return CT_OK;
    memcpy(dst + (lo - r0) * cols, (const float *)info.data + (lo - b) * cols,
           (size_t)((hi - lo) * cols) * sizeof(float));
    return CT_OK;
}

/* Fill rows [r0, r1) of tensor `name` from a sharded directory's index. */
static ct_status read_sharded_rows(files *fs, json_t *tensors, const char *name, int64_t rows,
                                   int64_t cols, int64_t r0, int64_t r1, float *dst)
{
    json_t *e = json_object_get(tensors, name);
    json_t *sh = json_object_get(e, "shape"), *shards = json_object_get(e, "shards");
    const char *dt = json_string_value(json_object_get(e, "dtype"));
    if (!json_is_array(sh) || !json_is_array(shards) || json_array_size(sh) < 1 ||
        json_integer_value(json_array_get(sh, 0)) != rows || !dt || strcmp(dt, "F32"))
        return ct_error(CT_EFORMAT, "checkpoint: the index lacks tensor '%s' as F32 of %lld rows",
                        name, (long long)rows);
    int64_t covered = 0;
    size_t i;
    json_t *s;
    json_array_foreach(shards, i, s)
    {
        const char *file = json_string_value(json_object_get(s, "file"));
        json_t *jb = json_object_get(s, "begin"), *je = json_object_get(s, "end");
        if (!file || !json_is_integer(jb) || !json_is_integer(je))
            return ct_error(CT_EFORMAT, "checkpoint: bad shard entry of '%s'", name);
        int64_t b = json_integer_value(jb), en = json_integer_value(je);
        if (b < 0 || en <= b || en > rows)
            return ct_error(CT_EFORMAT, "checkpoint: shard rows [%lld, %lld) of '%s' are outside [0, %lld)",
                            (long long)b, (long long)en, name, (long long)rows);
        int64_t lo = r0 > b ? r0 : b, hi = r1 < en ? r1 : en;
        if (hi <= lo) continue;
        ct_tensor_file *tf;
        CT_TRY(files_get(fs, file, &tf));
        CT_TRY(copy_rows(tf, name, b, en, cols, r0, r1, dst));
        covered += hi - lo;
    }
    if (covered != r1 - r0)
        return ct_error(CT_EFORMAT, "checkpoint: the shards of '%s' do not cover rows [%lld, %lld)",
                        name, (long long)r0, (long long)r1);
    return CT_OK;
}

/* Rows [r0, r1) of a single-file checkpoint's tensor (converted from any float dtype). */
static ct_status read_file_rows(const ct_tensor_file *tf, const char *name, int64_t rows,
                                int64_t cols, int64_t r0, int64_t r1, float *dst)
{
    size_t idx;
    if (ct_tensor_file_find(tf, name, &idx) != CT_OK)
        return ct_error(CT_EFORMAT, "checkpoint: tensor '%s' is missing", name);
    ct_tensor_info info;
    CT_TRY(ct_tensor_file_info(tf, idx, &info));
    if (info.ndim < 1 || info.ndim > 2 || info.shape[0] != rows ||
        (info.ndim == 2 ? info.shape[1] : 1) != cols)
        return ct_error(CT_EFORMAT, "checkpoint: tensor '%s' has another shape than the configuration's",
                        name);
    if (info.has_dtype && info.dtype == CT_DTYPE_F32)
        return copy_rows(tf, name, 0, rows, cols, r0, r1, dst);
    ct_tensor full;
    CT_TRY(ct_tensor_file_read(tf, idx, CT_DTYPE_F32, &full));
    if (r1 > r0)
        memcpy(dst, (const float *)full.data + r0 * cols, (size_t)((r1 - r0) * cols) * sizeof(float));
    ct_tensor_free(&full);
    return CT_OK;
}

ct_status ct_fsdp_trainer_load(ct_fsdp_trainer *t, const char *path)
{
    if (!t || !path) return ct_error(CT_EINVAL, "ct_fsdp_trainer_load: t and path must not be NULL");
    char *res;
    bool dir;
    CT_TRY(ct_sharded_checkpoint_resolve(path, &res, &dir));
    ct_fsdp *f = t->f;
    json_t *idx = NULL;
    ct_tensor_file *single = NULL;
    files fs;
    memset(&fs, 0, sizeof fs);
    fs.dir = res;
    msrc ms = {NULL, NULL};
    ct_status s;
    if (dir) {
        s = load_index(res, &idx);
        if (!s) ms.obj = json_object_get(idx, "metadata");
    } else {
        s = ct_load(res, NULL, &single);
        if (!s) {
            const char *fmt = ct_tensor_file_metadata_get(single, "format");
            if (!fmt || strcmp(fmt, "ctorch-gpt"))
                s = ct_error(CT_EFORMAT, "checkpoint: '%s' is not a ctorch-gpt checkpoint", res);
            ms.f = single;
        }
    }
    int64_t step = 0, epoch = 0, pos = 0;
    ct_rng rng;
    if (!s) s = meta_read(t, &ms, &step, &epoch, &pos, &rng);
    int nt = ct_fsdp_num_tensors(f);
    for (int k = 0; k < 3 && !s; k++)
        for (int i = 0; i < nt && !s; i++) {
            const char *name;
            int nd;
            int64_t shape[2], r0, r1;
            float *ptr[3];
            ct_fsdp_tensor(f, i, &name, &nd, shape, &r0, &r1, &ptr[0], &ptr[1], &ptr[2]);
            char nm[160];
            snprintf(nm, sizeof nm, "%s%s", MOMENT[k], name);
            int64_t cols = nd == 2 ? shape[1] : 1;
            s = dir ? read_sharded_rows(&fs, json_object_get(idx, "tensors"), nm, shape[0], cols, r0,
                                        r1, ptr[k])
                    : read_file_rows(single, nm, shape[0], cols, r0, r1, ptr[k]);
        }
    files_close(&fs);
    json_decref(idx);
    ct_tensor_file_close(single);
    ct_free(res);
    CT_TRY(s);
    t->step = step, t->epoch = epoch, t->pos = pos, t->rng = rng;
    t->in_step = false;
    ds_drop_gathered(f); /* gathered copies hold the old weights */
    return CT_OK;
}

ct_status ct_sharded_checkpoint_consolidate(const char *dir, const char *out_file)
{
    if (!dir || !out_file)
        return ct_error(CT_EINVAL, "ct_sharded_checkpoint_consolidate: arguments must not be NULL");
    char *res;
    bool isdir;
    CT_TRY(ct_sharded_checkpoint_resolve(dir, &res, &isdir));
    if (!isdir) {
        ct_free(res);
        return ct_error(CT_EINVAL, "checkpoint consolidate: '%s' is not a sharded checkpoint directory",
                        dir);
    }
    /* every shard present with its shape first: what is allocated below is bounded by the
     * data the files hold */
    char *sum = NULL;
    ct_status s = ct_sharded_checkpoint_verify(res, &sum);
    ct_free(sum);
    json_t *idx = NULL;
    if (!s) s = load_index(res, &idx);
    if (s) {
        ct_free(res);
        return s;
    }
    json_t *tensors = json_object_get(idx, "tensors"), *md = json_object_get(idx, "metadata");
    size_t n = json_object_size(tensors), nm = json_object_size(md);
    files fs;
    memset(&fs, 0, sizeof fs);
    fs.dir = res;
    ct_tensor *tens = NULL;
    const char **names = NULL, **mk = NULL, **mv = NULL;
    if ((s = ct_calloc((void **)&tens, (n ? n : 1) * sizeof *tens)) ||
        (s = ct_calloc((void **)&names, (n ? n : 1) * sizeof *names)) ||
        (s = ct_calloc((void **)&mk, (nm + 1) * sizeof *mk)) ||
        (s = ct_calloc((void **)&mv, (nm + 1) * sizeof *mv)))
        goto done;
    size_t i = 0;
    const char *key;
    json_t *e;
    json_object_foreach(tensors, key, e)
    {
        json_t *sh = json_object_get(e, "shape");
        int nd = (int)json_array_size(sh);
        int64_t shape[2] = {0, 0};
        for (int d = 0; d < nd && d < 2; d++)
            shape[d] = json_integer_value(json_array_get(sh, (size_t)d));
        if (nd < 1 || nd > 2 || shape[0] < 1 || shape[0] > (1LL << 32) || (nd == 2 && (shape[1] < 1 || shape[1] > (1LL << 32)))) {
            s = ct_error(CT_EFORMAT, "checkpoint: bad shape of '%s' in the index", key);
            break;
        }
        if ((s = ct_tensor_zeros(&tens[i], CT_DTYPE_F32, nd, shape))) break;
        names[i] = key;
        i++;
        if ((s = read_sharded_rows(&fs, tensors, key, shape[0], nd == 2 ? shape[1] : 1, 0, shape[0],
                                   tens[i - 1].data)))
            break;
    }
    if (!s) {
        size_t k = 0;
        json_t *v;
        json_object_foreach(md, key, v)
        {
            mk[k] = key;
            mv[k] = !strcmp(key, "format") ? "ctorch-gpt" : json_string_value(v);
            if (mv[k]) k++;
        }
        s = ct_save_safetensors(out_file, tens, names, i, mk, mv, k, NULL);
    }
    for (size_t j = 0; tens && j < n; j++)
        ct_tensor_free(&tens[j]);
done:
    files_close(&fs);
    ct_free(tens);
    ct_free(names);
    ct_free(mk);
    ct_free(mv);
    json_decref(idx);
    ct_free(res);
    return s;
}

ct_status ct_sharded_checkpoint_check(const char *dir, bool trainer_state, ct_gpt_config *cfg)
{
    if (!dir || !cfg)
        return ct_error(CT_EINVAL, "ct_sharded_checkpoint_check: arguments must not be NULL");
    char *summary = NULL;
    CT_TRY(ct_sharded_checkpoint_verify(dir, &summary)); /* the shards hold the index's rows */
    ct_free(summary);
    char *res;
    bool isdir;
    CT_TRY(ct_sharded_checkpoint_resolve(dir, &res, &isdir));
    json_t *idx;
    ct_status s = load_index(res, &idx);
    ct_free(res);
    CT_TRY(s);
    json_t *md = json_object_get(idx, "metadata"), *tensors = json_object_get(idx, "tensors");
    const char *cj = json_string_value(json_object_get(md, "config"));
    *cfg = ct_gpt_config_default();
    if (!cj)
        s = ct_error(CT_EFORMAT, "checkpoint: the index has no metadata \"config\"");
    else if (ct_gpt_config_from_json(cj, cfg))
        s = ct_error_wrap(CT_EFORMAT, "checkpoint: bad \"config\"");
    gpt_tensor *tab = NULL;
    int n = 0;
    if (!s) s = gpt_tensor_table(cfg, &tab, &n);
    /* every tensor the configuration has, with its shape, before the model is allocated */
    for (int i = 0; i < n && !s; i++)
        for (int k = 0; k < (trainer_state ? 3 : 1) && !s; k++) {
            char nm[160];
            snprintf(nm, sizeof nm, "%s%s", MOMENT[k], tab[i].name);
            json_t *e = json_object_get(tensors, nm), *sh = json_object_get(e, "shape");
            const char *dt = json_string_value(json_object_get(e, "dtype"));
            bool same = e && json_array_size(sh) == (size_t)tab[i].ndim && dt && !strcmp(dt, "F32");
            for (int d = 0; same && d < tab[i].ndim; d++)
                same = json_integer_value(json_array_get(sh, (size_t)d)) == tab[i].shape[d];
            if (!same)
                s = ct_error(CT_EFORMAT,
                             "checkpoint: the index lacks tensor '%s' as the configuration has it "
                             "(F32 %s[%lld%s%lld])",
                             nm, tab[i].name, (long long)tab[i].shape[0],
                             tab[i].ndim == 2 ? ", " : "", tab[i].ndim == 2 ? (long long)tab[i].shape[1] : 0LL);
        }
    ct_free(tab);
    if (!s && trainer_state) {
        msrc m = {NULL, md};
        const char *tj = json_string_value(json_object_get(md, "train"));
        if (tj) {
            ct_train_options o = ct_train_options_default();
            s = ct_train_options_from_json(tj, &o);
            if (!s) s = gpt_check_train_options(cfg, &o, "checkpoint");
            if (s) s = ct_error_wrap(CT_EFORMAT, "checkpoint: metadata \"train\"");
        }
        int64_t step, epoch, pos;
        ct_rng rng;
        if (!s) s = gpt_read_trainer_state(msrc_get, &m, &step, &epoch, &pos, &rng);
    }
    json_decref(idx);
    return s;
}

ct_status ct_sharded_checkpoint_verify(const char *dir, char **summary)
{
    if (!dir || !summary)
        return ct_error(CT_EINVAL, "ct_sharded_checkpoint_verify: arguments must not be NULL");
    *summary = NULL;
    char *res;
    bool isdir;
    CT_TRY(ct_sharded_checkpoint_resolve(dir, &res, &isdir));
    if (!isdir) {
        ct_free(res);
        return ct_error(CT_EINVAL, "checkpoint: '%s' is not a sharded checkpoint directory", dir);
    }
    json_t *idx;
    ct_status s = load_index(res, &idx);
    if (s) {
        ct_free(res);
        return s;
    }
    files fs;
    memset(&fs, 0, sizeof fs);
    fs.dir = res;
    json_t *tensors = json_object_get(idx, "tensors"), *files_seen = json_object();
    const char *key;
    json_t *e;
    int64_t elements = 0;
    json_object_foreach(tensors, key, e)
    {
        json_t *sh = json_object_get(e, "shape"), *shards = json_object_get(e, "shards");
        size_t nd = json_array_size(sh);
        int64_t rows = json_integer_value(json_array_get(sh, 0));
        int64_t cols = nd == 2 ? json_integer_value(json_array_get(sh, 1)) : 1;
        int64_t numel;
        if (nd < 1 || nd > 2 || rows < 1 || cols < 1 || rows > (1LL << 40) || cols > (1LL << 40) ||
            __builtin_mul_overflow(rows, cols, &numel) || !json_is_array(shards)) {
            s = ct_error(CT_EFORMAT, "checkpoint: bad entry of '%s' in the index", key);
            break;
        }
        /* the shards are read as f32 rows: an index naming another dtype would be ignored */
        const char *dt = json_string_value(json_object_get(e, "dtype"));
        if (!dt || strcmp(dt, "F32")) {
            char q[64];
            s = ct_error(CT_EFORMAT,
                         "checkpoint: the index gives '%s' dtype %s%s%s; a ctorch sharded "
                         "checkpoint holds \"F32\" tensors only (as ctorch writes it): the "
                         "index was edited or written by another tool",
                         key, dt ? "\"" : "", dt ? ct_io_quote(q, sizeof q, dt) : "(none)",
                         dt ? "\"" : "");
            break;
        }
        /* the shards must tile [0, rows) in order (checked before any file is opened), each
         * read back with its shape */
        int64_t next = 0;
        size_t i;
        json_t *sj;
        json_array_foreach(shards, i, sj)
        {
            json_t *jb = json_object_get(sj, "begin"), *je = json_object_get(sj, "end");
            int64_t b = json_integer_value(jb), en = json_integer_value(je);
            if (!json_is_integer(jb) || !json_is_integer(je) || b != next || en <= b || en > rows)
                break;
            next = en;
        }
        if (next != rows) {
            s = ct_error(CT_EFORMAT, "checkpoint: the shards of '%s' do not tile rows [0, %lld) in order",
                         key, (long long)rows);
            break;
        }
        next = 0;
        json_array_foreach(shards, i, sj)
        {
            const char *file = json_string_value(json_object_get(sj, "file"));
            int64_t b = json_integer_value(json_object_get(sj, "begin")),
                    en = json_integer_value(json_object_get(sj, "end"));
            if (!file || b != next || en <= b || en > rows) {
                s = ct_error(CT_EFORMAT,
                             "checkpoint: the shards of '%s' do not tile rows [0, %lld) in order",
                             key, (long long)rows);
                break;
            }
            ct_tensor_file *tf;
            if ((s = files_get(&fs, file, &tf))) break;
            size_t ti;
            ct_tensor_info info;
            if (ct_tensor_file_find(tf, key, &ti) != CT_OK ||
                (s = ct_tensor_file_info(tf, ti, &info)) || info.ndim != (int)nd ||
                info.shape[0] != en - b || (nd == 2 && info.shape[1] != cols)) {
                s = ct_error(CT_EFORMAT, "checkpoint: '%s' lacks rows [%lld, %lld) of '%s'", file,
                             (long long)b, (long long)en, key);
                break;
            }
            if (!info.has_dtype || info.dtype != CT_DTYPE_F32) {
                s = ct_error(CT_EFORMAT,
                             "checkpoint: '%s' holds rows [%lld, %lld) of '%s' as %s; the index "
                             "says F32",
                             file, (long long)b, (long long)en, key, ct_st_dtype_name(info.st_dtype));
                break;
            }
            json_object_set_new(files_seen, file, json_true());
            next = en;
        }
        if (!s && next != rows)
            s = ct_error(CT_EFORMAT, "checkpoint: the shards of '%s' stop at row %lld of %lld", key,
                         (long long)next, (long long)rows);
        if (s) break;
        elements += numel;
    }
    files_close(&fs);
    if (!s) {
        json_t *fl = json_array();
        const char *fk;
        json_t *fv;
        json_object_foreach(files_seen, fk, fv)
            json_array_append_new(fl, json_string(fk));
        json_t *out = json_pack("{s:s, s:s, s:O, s:O, s:I, s:I, s:o, s:O}", "directory", res,
                                "format", "ctorch-sharded", "world_size",
                                json_object_get(idx, "world_size"), "step",
                                json_object_get(idx, "step") ? json_object_get(idx, "step")
                                                             : json_null(),
                                "tensors", (json_int_t)json_object_size(tensors), "elements",
                                (json_int_t)elements, "files", fl, "metadata",
                                json_object_get(idx, "metadata"));
        char *txt = json_dumps(out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(out);
        size_t n = txt ? strlen(txt) : 0;
        if (!txt)
            s = ct_error(CT_ENOMEM, "checkpoint: summary");
        else if (!(s = ct_alloc((void **)summary, n + 1)))
            memcpy(*summary, txt, n + 1);
        free(txt);
    }
    json_decref(files_seen);
    json_decref(idx);
    ct_free(res);
    return s;
}
