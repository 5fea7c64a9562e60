/* The compile layer: the system C compiler run as worker processes (at most
 * CT_COMPILE_THREADS at once, each with a deadline), an on-disk cache of the shared objects
 * keyed by SHA-256 of (IR, compiler path / size / mtime, flags, ISA, ABI), written atomically
 * (temp + rename) and checked against a checksum before it is loaded, and an in-process table
 * so one mod compiles (and loads) once per process. */
#include "jit/jit_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ---- SHA-256 (FIPS 180-4) --------------------------------------------------------------- */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha_block(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
               p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = hh + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

void jit_sha256(const void *data, size_t len, uint8_t out[32])
{
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const uint8_t *p = data;
    size_t n = len;
    while (n >= 64) {
        sha_block(h, p);
        p += 64;
        n -= 64;
    }
    uint8_t tail[128] = {0};
    memcpy(tail, p, n);
    tail[n] = 0x80;
    size_t tl = n + 1 + 8 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++)
        tail[tl - 1 - i] = (uint8_t)(bits >> (8 * i));
    sha_block(h, tail);
    if (tl == 128) sha_block(h, tail + 64);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++)
            out[4 * i + j] = (uint8_t)(h[i] >> (24 - 8 * j));
}

static void hex(const uint8_t d[32], char out[65])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* ---- state ------------------------------------------------------------------------------ */

#define TABLE_MAX 4096
#define DIR_MAX (PATH_MAX - 256) /* room for the entry names after it */

typedef struct tentry {
    char tkey[65];
    jkernel *k;
} tentry;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static tentry g_table[TABLE_MAX];
static int g_ntable;
static atomic_uint g_seq; /* temp names */
static jkernel *g_retired; /* kernels dropped from the table: still loaded, still in use */
static char g_version[256]; /* first line of the compiler's --version (per process) */
static char g_version_of[PATH_MAX + 64]; /* ... of this compiler identity (path, size, mtime) */
static atomic_llong st_table, st_cache, st_compiles, st_rebuilt, st_procs;

void ct_jit_get_stats(ct_jit_stats *out)
{
    if (!out) return;
    out->table_hits = atomic_load(&st_table);
    out->cache_hits = atomic_load(&st_cache);
    out->compiles = atomic_load(&st_compiles);
    out->rebuilt = atomic_load(&st_rebuilt);
    out->processes = atomic_load(&st_procs);
}

void ct_jit_reset_table(void)
{
    pthread_mutex_lock(&g_lock);
    /* the kernels stay loaded (mods made from them keep working) and reachable */
    for (int i = 0; i < g_ntable; i++) {
        g_table[i].k->retired_next = g_retired;
        g_retired = g_table[i].k;
    }
    g_ntable = 0;
    pthread_mutex_unlock(&g_lock);
}

ct_jit_options ct_jit_options_default(void)
{
    ct_jit_options o;
    memset(&o, 0, sizeof o);
    return o;
}

/* ---- compiler, flags, cache dir ---------------------------------------------------------- */

typedef struct env {
    char cc[PATH_MAX];  /* resolved path */
    char ident[PATH_MAX + 64];
    char dir[DIR_MAX];  /* as given (for messages) */
    int dfd;            /* the checked directory: every entry is reached through it */
    const char *flags[16];
    int nflags;
    char flagstr[256];
    int threads;
    double timeout;
} env;

static ct_status resolve_cc(const char *fn, const char *spec, char *out)
{
    if (!spec || !*spec) {
        const char *e = getenv("CC");
        spec = e && *e ? e : "cc";
    }
    if (strlen(spec) >= PATH_MAX) return ct_error(CT_EINVAL, "%s: compiler name too long", fn);
    if (strchr(spec, ' '))
        return ct_error(CT_EINVAL, "%s: CC '%s' must name one program (no arguments)", fn, spec);
    if (strchr(spec, '/')) {
        if (!realpath(spec, out) || access(out, X_OK) != 0)
            return ct_error(CT_EUNSUPPORTED, "%s: no C compiler: CC '%s' is not an executable file",
                            fn, spec);
        return CT_OK;
    }
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    const char *p = path;
    while (*p) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char cand[PATH_MAX];
        if (n > 0 && n + strlen(spec) + 2 < sizeof cand) {
            memcpy(cand, p, n);
            cand[n] = '/';
            strcpy(cand + n + 1, spec);
            struct stat st;
            if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0 &&
                realpath(cand, out))
                return CT_OK;
        }
        if (!e) break;
        p = e + 1;
    }
    return ct_error(CT_EUNSUPPORTED,
                    "%s: no C compiler: '%s' is not on PATH (set CC, or install a C compiler such "
                    "as gcc)",
                    fn, spec);
}

/* ---- the cache directory: opened once, checked on the way ---------------------------------
 *
 * The path is walked from "/" one component at a time with openat(O_NOFOLLOW), so what is
 * checked is what is used: every directory on the way must belong to root or to this user
 * and be writable by nobody else (a world-writable one only with the sticky bit, like /tmp,
 * whose entries only their owners can rename); a symbolic link on the way is followed only
 * when root or this user owns it (it sits in a directory just checked, so nobody else can
 * change it); the last component is never a link, belongs to this user and is writable by
 * nobody else. Missing directories are created 0700. The result is a descriptor: entries are
 * opened, created and renamed relative to it, never through the path again. */

#define WALK_HOPS 40

static ct_status dir_refused(const char *fn, const char *spec, const char *at, const char *why,
                             const struct stat *st)
{
    return ct_error(CT_EINVAL,
                    "%s: cache dir %s: %s %s (uid %u, mode %04o): refused, since another user "
                    "could swap the compiled code ctorch loads (make every directory on the path "
                    "belong to you or root and writable only by its owner, or set CT_CACHE_DIR "
                    "to a directory under your home)",
                    fn, spec, at, why, (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777));
}

/* A directory the walk passes through: root's or ours, and nobody else may rename its
 * entries. */
static ct_status check_parent(const char *fn, const char *spec, const char *at, const struct stat *st)
{
    uid_t me = geteuid();
    if (st->st_uid != 0 && st->st_uid != me)
        return dir_refused(fn, spec, at, "(on the way to it) belongs to another user", st);
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX))
        return dir_refused(fn, spec, at, "(on the way to it) is writable by other users", st);
    return CT_OK;
}

/* Whether a path rest names nothing more than where it is ("", "/", "./.", ...). */
static bool only_dots(const char *p)
{
    for (;;) {
        while (*p == '/')
            p++;
        if (!*p) return true;
        if (p[0] == '.' && (p[1] == '/' || !p[1])) {
            p++;
            continue;
        }
        return false;
    }
}

ct_status jit_open_cache_dir(const char *fn, const char *spec, int *out)
{
    *out = -1;
    char walked[PATH_MAX] = ""; /* for messages */
    char rest[2 * PATH_MAX + 2];
    if (spec[0] == '/') {
        snprintf(rest, sizeof rest, "%s", spec);
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd))
            return ct_error(CT_EIO, "%s: cache dir %s: cannot read the working directory: %s", fn,
                            spec, strerror(errno));
        snprintf(rest, sizeof rest, "%s/%s", cwd, spec);
    }
    int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ct_error(CT_EIO, "%s: cache dir %s: cannot open /: %s", fn, spec, strerror(errno));
    struct stat st;
    int hops = 0;
    size_t pos = 0;
    for (;;) {
        while (rest[pos] == '/')
            pos++;
        if (!rest[pos]) break; /* fd is the last directory */
        size_t end = pos;
        while (rest[end] && rest[end] != '/')
            end++;
        char comp[NAME_MAX + 1];
        if (end - pos > NAME_MAX) {
            close(fd);
            return ct_error(CT_EINVAL, "%s: cache dir %s: a path component is longer than %d bytes",
                            fn, spec, NAME_MAX);
        }
        memcpy(comp, rest + pos, end - pos);
        comp[end - pos] = '\0';
        pos = end;
        if (!strcmp(comp, ".")) continue;
        /* the directory fd is about to be searched: it must be trusted */
        if (fstat(fd, &st) != 0) goto io_error;
        ct_status s = check_parent(fn, spec, walked[0] ? walked : "/", &st);
        if (s != CT_OK) {
            close(fd);
            return s;
        }
        size_t wl = strlen(walked);
        snprintf(walked + wl, sizeof walked - wl, "/%s", comp);
        int nfd = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (nfd < 0 && errno == ENOENT) {
            if (mkdirat(fd, comp, 0700) != 0 && errno != EEXIST) {
                int e = errno;
                close(fd);
                return ct_error(CT_EIO,
                                "%s: cannot create cache dir %s (at %s): %s (set CT_CACHE_DIR to a "
                                "directory you can write)",
                                fn, spec, walked, strerror(e));
            }
            nfd = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        if (nfd < 0 && (errno == ELOOP || errno == ENOTDIR)) {
            struct stat ls;
            if (fstatat(fd, comp, &ls, AT_SYMLINK_NOFOLLOW) != 0) goto io_error;
            bool last = only_dots(rest + pos);
            if (!S_ISLNK(ls.st_mode)) {
                close(fd);
                return ct_error(CT_EINVAL, "%s: cache dir %s: %s is not a directory", fn, spec, walked);
            }
            if (last) {
                close(fd);
                return ct_error(CT_EINVAL,
                                "%s: cache dir %s is a symbolic link: refused (set CT_CACHE_DIR to "
                                "the directory it points to)",
                                fn, spec);
            }
            if (ls.st_uid != 0 && ls.st_uid != geteuid()) {
                close(fd);
                return dir_refused(fn, spec, walked, "(a symbolic link on the way) belongs to another user",
                                   &ls);
            }
            if (++hops > WALK_HOPS) {
                close(fd);
                return ct_error(CT_EINVAL, "%s: cache dir %s: more than %d symbolic links", fn, spec,
                                WALK_HOPS);
            }
            char target[PATH_MAX];
            ssize_t tl = readlinkat(fd, comp, target, sizeof target - 1);
            if (tl <= 0) goto io_error;
            target[tl] = '\0';
            char nrest[sizeof rest];
            int nl = snprintf(nrest, sizeof nrest, "%s%s", target, rest + pos);
            if (nl < 0 || (size_t)nl >= sizeof nrest) {
                close(fd);
                return ct_error(CT_EINVAL, "%s: cache dir %s: path too long after its links", fn, spec);
            }
            memcpy(rest, nrest, (size_t)nl + 1);
            pos = 0;
            walked[wl] = '\0'; /* the link's own directory */
            if (target[0] == '/') {
                close(fd);
                fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (fd < 0) goto io_error;
                walked[0] = '\0';
            }
            continue;
        }
        if (nfd < 0) {
            int e = errno;
            close(fd);
            return ct_error(CT_EIO, "%s: cache dir %s: cannot open %s: %s", fn, spec, walked, strerror(e));
        }
        close(fd);
        fd = nfd;
    }
    /* the cache directory itself */
    if (fstat(fd, &st) != 0) goto io_error;
    if (st.st_uid != geteuid()) {
        close(fd);
        return ct_error(CT_EINVAL,
                        "%s: cache dir %s belongs to another user (uid %u): refused (set "
                        "CT_CACHE_DIR to a directory of your own)",
                        fn, spec, (unsigned)st.st_uid);
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        close(fd);
        return ct_error(CT_EINVAL,
                        "%s: cache dir %s is writable by other users (mode %03o): refused (chmod "
                        "go-w it, or set CT_CACHE_DIR)",
                        fn, spec, (unsigned)(st.st_mode & 0777));
    }
    *out = fd;
    return CT_OK;
io_error:;
    int e = errno;
    close(fd);
    return ct_error(CT_EIO, "%s: cache dir %s (at %s): %s", fn, spec, walked[0] ? walked : "/",
                    strerror(e));
}

static ct_status cache_dir(const char *fn, const char *spec, char out[DIR_MAX], int *dfd)
{
    int n;
    if (spec && *spec) n = snprintf(out, DIR_MAX, "%s", spec);
    else if (getenv("CT_CACHE_DIR") && *getenv("CT_CACHE_DIR"))
        n = snprintf(out, DIR_MAX, "%s", getenv("CT_CACHE_DIR"));
    else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME"))
        n = snprintf(out, DIR_MAX, "%s/ctorch", getenv("XDG_CACHE_HOME"));
    else if (getenv("HOME") && *getenv("HOME"))
        n = snprintf(out, DIR_MAX, "%s/.cache/ctorch", getenv("HOME"));
    else
        return ct_error(CT_EIO, "%s: no cache dir: set CT_CACHE_DIR (HOME is not set)", fn);
    if (n < 0 || n >= DIR_MAX) return ct_error(CT_EINVAL, "%s: cache dir path too long", fn);
    return jit_open_cache_dir(fn, out, dfd);
}

static ct_status make_env(const char *fn, const ct_jit_options *o, env *e)
{
    memset(e, 0, sizeof *e);
    e->dfd = -1;
    CT_TRY(resolve_cc(fn, o->cc, e->cc));
    struct stat st;
    if (stat(e->cc, &st) != 0)
        return ct_error(CT_EUNSUPPORTED, "%s: no C compiler: %s: %s", fn, e->cc, strerror(errno));
    snprintf(e->ident, sizeof e->ident, "%s size %lld mtime %lld.%09ld", e->cc,
             (long long)st.st_size, (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
    static const char *base[] = {"-std=c11", "-O3", "-fPIC", "-shared", "-fwrapv",
                                 "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-Wall", "-Werror"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        e->flags[e->nflags++] = base[i];
#if defined(__x86_64__)
    if (ct_active_isa() == CT_ISA_AVX2 || ct_active_isa() == CT_ISA_AVX512) { /* AVX-512 has AVX2 */
        e->flags[e->nflags++] = "-mavx2";
        e->flags[e->nflags++] = "-mfma";
    }
#endif
    size_t off = 0;
    for (int i = 0; i < e->nflags; i++)
        off += (size_t)snprintf(e->flagstr + off, sizeof e->flagstr - off, "%s ", e->flags[i]);
    snprintf(e->flagstr + off, sizeof e->flagstr - off, "isa=%s", ct_isa_name(ct_active_isa()));
    e->threads = o->threads;
    if (e->threads <= 0) {
        const char *t = getenv("CT_COMPILE_THREADS");
        if (t && *t) {
            char *end;
            errno = 0;
            long v = strtol(t, &end, 10);
            if (errno || *end || v < 1 || v > 1024)
                return ct_error(CT_EINVAL, "%s: CT_COMPILE_THREADS='%s': an integer in [1, 1024] expected",
                                fn, t);
            e->threads = (int)v;
        } else {
            e->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
        }
    }
    if (e->threads < 1) e->threads = 1;
    if (e->threads > 64) e->threads = 64;
    e->timeout = o->timeout_s;
    if (!(e->timeout > 0)) {
        const char *t = getenv("CT_COMPILE_TIMEOUT");
        if (t && *t) {
            char *end;
            errno = 0;
            double v = strtod(t, &end);
            if (errno || *end || !(v > 0) || v > 86400)
                return ct_error(CT_EINVAL,
                                "%s: CT_COMPILE_TIMEOUT='%s': seconds in (0, 86400] expected", fn, t);
            e->timeout = v;
        } else {
            e->timeout = 60;
        }
    }
    return cache_dir(fn, o->cache_dir, e->dir, &e->dfd);
}

/* ---- loading ----------------------------------------------------------------------------- */

static ct_status read_fd(int fd, uint8_t **buf, size_t *len, size_t max)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 0 || (size_t)st.st_size > max) return CT_EIO;
    size_t n = (size_t)st.st_size;
    uint8_t *b;
    CT_TRY(ct_alloc((void **)&b, n ? n : 1));
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, b + got, n - got, (off_t)got);
        if (r <= 0) {
            ct_free(b);
            return CT_EIO;
        }
        got += (size_t)r;
    }
    *buf = b;
    *len = n;
    return CT_OK;
}

#define SO_MAX ((size_t)64 << 20)

/* dlopen the object at path (a private file of this process: a unique name, so the dynamic
 * loader never confuses it with another mod) and resolve the symbols the IR needs. */
static ct_status load_path(const char *fn, const env *e, const char *path, const jir *ir, jkernel *k)
{
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        return ct_error(CT_EIO, "%s: cannot load the compiled mod: %s%s%s%s", fn, why ? why : "?",
                        why && strstr(why, "map") ? " (a cache dir on a filesystem mounted noexec "
                                                    "cannot hold it: set CT_CACHE_DIR to another "
                                                    "directory, now " : "",
                        why && strstr(why, "map") ? e->dir : "", why && strstr(why, "map") ? ")" : "");
    }
    int (*abi)(void) = (int (*)(void))dlsym(dl, "ctj_abi");
    if (!abi || abi() != JIT_ABI) {
        dlclose(dl);
        return ct_error(CT_EFORMAT, "%s: compiled mod has the wrong ABI", fn);
    }
    k->dl = dl;
    if (ir->is_mask) {
        *(void **)&k->mask_tile = dlsym(dl, "ctj_mask_tile");
        if (!k->mask_tile) goto missing;
    } else {
        *(void **)&k->score_fwd = dlsym(dl, "ctj_score_fwd");
        *(void **)&k->score_grad = dlsym(dl, "ctj_score_grad");
        if (!k->score_fwd || !k->score_grad) goto missing;
    }
    return CT_OK;
missing:
    dlclose(dl);
    k->dl = NULL;
    return ct_error(CT_EFORMAT, "%s: compiled mod lacks its entry points", fn);
}

/* ---- entries, relative to the cache directory's descriptor ------------------------------- */

/* Open an entry for reading: a regular file of this user that nobody else may write, never
 * through a link, never blocking (a FIFO is refused, not waited on). CT_EIO: absent;
 * CT_EFORMAT: present but not such a file (the entry is rebuilt over it). */
static ct_status open_entry(int dfd, const char *name, int *fd)
{
    *fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (*fd < 0) return errno == ENOENT ? CT_EIO : CT_EFORMAT;
    struct stat st;
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & (S_IWGRP | S_IWOTH))) {
        close(*fd);
        *fd = -1;
        return CT_EFORMAT;
    }
    return CT_OK;
}

/* Create a new file relative to the directory (never through a link, never an existing one). */
static int create_entry(int dfd, const char *name, int mode)
{
    return openat(dfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
}

/* Create a new file "<prefix>-<pid>-<n><suffix>" (name written to name): the next n when a
 * file of that name is left over from an earlier process that had this pid. */
static int create_unique(int dfd, const char *prefix, const char *suffix, char *name, size_t cap,
                         int mode)
{
    for (int tries = 0; tries < 1000; tries++) {
        snprintf(name, cap, "%s-%ld-%u%s", prefix, (long)getpid(), atomic_fetch_add(&g_seq, 1),
                 suffix);
        int fd = create_entry(dfd, name, mode);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

static ct_status write_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return CT_EIO;
        p += w;
        n -= (size_t)w;
    }
    return CT_OK;
}

/* A new file with these bytes; errno kept on failure. */
static ct_status write_entry(int dfd, const char *name, const void *data, size_t n, int mode)
{
    int fd = create_entry(dfd, name, mode);
    if (fd < 0) return CT_EIO;
    if (write_all(fd, data, n) != CT_OK) {
        int e = errno;
        close(fd);
        unlinkat(dfd, name, 0);
        errno = e;
        return CT_EIO;
    }
    if (close(fd) != 0) {
        int e = errno;
        unlinkat(dfd, name, 0);
        errno = e;
        return CT_EIO;
    }
    return CT_OK;
}

/* The checksum file of an entry: "sha256 <64 hex>\nsize <n>\nkey <key>\n" then free text
 * (compiler, version). CT_OK when it names exactly these bytes under this key. */
ct_status jit_cache_verify(const char *key, const uint8_t *sum, size_t sl, const uint8_t *so,
                           size_t ol)
{
    uint8_t d[32];
    char hx[65], want[256];
    jit_sha256(so, ol, d);
    hex(d, hx);
    int wl = snprintf(want, sizeof want, "sha256 %s\nsize %zu\nkey %s\n", hx, ol, key);
    if (wl < 0 || (size_t)wl >= sizeof want) return CT_EFORMAT;
    return sl >= (size_t)wl && memcmp(sum, want, (size_t)wl) == 0 ? CT_OK : CT_EFORMAT;
}

#define SUM_MAX 4096

/* Read and verify the entry <key>.so / <key>.sum: CT_OK with the verified bytes (the caller
 * frees them), CT_EIO absent, CT_EFORMAT damaged (rebuilt, never loaded). */
ct_status jit_cache_read(int dfd, const char *key, uint8_t **so, size_t *ol)
{
    return jit_cache_read_ext(dfd, key, ".so", so, ol);
}

ct_status jit_cache_read_ext(int dfd, const char *key, const char *ext, uint8_t **so, size_t *ol)
{
    char nso[96], nsum[96];
    snprintf(nso, sizeof nso, "%s%s", key, ext);
    snprintf(nsum, sizeof nsum, "%s.sum", key);
    *so = NULL;
    *ol = 0;
    int sfd, ofd;
    ct_status a = open_entry(dfd, nsum, &sfd), b = open_entry(dfd, nso, &ofd);
    if (a != CT_OK || b != CT_OK) {
        if (sfd >= 0) close(sfd);
        if (ofd >= 0) close(ofd);
        return a == CT_EIO && b == CT_EIO ? CT_EIO : CT_EFORMAT;
    }
    uint8_t *sb = NULL, *ob = NULL;
    size_t sl = 0, l = 0;
    ct_status s = read_fd(sfd, &sb, &sl, SUM_MAX);
    if (s == CT_OK) s = read_fd(ofd, &ob, &l, SO_MAX);
    close(sfd);
    close(ofd);
    if (s == CT_OK) s = jit_cache_verify(key, sb, sl, ob, l);
    else s = CT_EFORMAT;
    ct_free(sb);
    if (s != CT_OK) {
        ct_free(ob);
        return s;
    }
    *so = ob;
    *ol = l;
    return CT_OK;
}

/* dlopen these (verified) bytes: written to a new private file of this process in the cache
 * directory (O_EXCL; nobody else can write there) and loaded through the directory's
 * descriptor, /proc/self/fd/<dir>/<name>, so no path that another user could redirect is
 * involved; the name is unique, so the dynamic loader never takes it for another mod. */
static ct_status load_bytes(const char *fn, const env *e, const uint8_t *b, size_t n, const jir *ir,
                            jkernel *k)
{
    char name[96];
    int fd = create_unique(e->dfd, "tmp-load", ".so", name, sizeof name, 0700);
    if (fd >= 0 && write_all(fd, b, n) != CT_OK) {
        int er = errno;
        close(fd);
        unlinkat(e->dfd, name, 0);
        errno = er;
        fd = -1;
    }
    if (fd >= 0 && close(fd) != 0) {
        int er = errno;
        unlinkat(e->dfd, name, 0);
        errno = er;
        fd = -1;
    }
    if (fd < 0)
        return ct_error(CT_EIO,
                        "%s: cannot write in the cache dir %s: %s (free space there, or set "
                        "CT_CACHE_DIR to another directory)",
                        fn, e->dir, strerror(errno));
    char path[PATH_MAX + 128];
    struct stat a, p;
    snprintf(path, sizeof path, "/proc/self/fd/%d", e->dfd);
    if (stat(path, &p) == 0 && fstat(e->dfd, &a) == 0 && a.st_dev == p.st_dev && a.st_ino == p.st_ino)
        snprintf(path, sizeof path, "/proc/self/fd/%d/%s", e->dfd, name);
    else /* no /proc: the path, whose every directory was checked to be only ours or root's */
        snprintf(path, sizeof path, "%s/%s", e->dir, name);
    ct_status s = load_path(fn, e, path, ir, k);
    unlinkat(e->dfd, name, 0);
    return s;
}

/* Try the cache entry: CT_OK loaded; CT_EFORMAT damaged (checksum or size mismatch, not a
 * file of ours); CT_EIO absent. */
static ct_status try_cache(const char *fn, const env *e, const char *key, const jir *ir, jkernel *k)
{
    uint8_t *b;
    size_t n;
    ct_status s = jit_cache_read(e->dfd, key, &b, &n);
    if (s != CT_OK) return s;
    s = load_bytes(fn, e, b, n, ir, k);
    ct_free(b);
    return s; /* CT_EFORMAT (a verified entry of the wrong ABI) or another failure: rebuilt */
}

/* Publish an entry <key><ext> with its checksum file <key>.sum (note: free text after the
 * checked lines): the data under a new private name first, then renamed into place, then the
 * checksum likewise, so a reader never loads a half-written entry (a new image with an old or
 * no checksum reads as damaged and is rebuilt). */
ct_status jit_cache_write(int dfd, const char *key, const char *ext, const void *data, size_t len,
                          const char *note)
{
    char tmp[96], tsum[96], name[96], sum[96], text[1024];
    uint8_t d[32];
    char hx[65];
    jit_sha256(data, len, d);
    hex(d, hx);
    int tl = snprintf(text, sizeof text, "sha256 %s\nsize %zu\nkey %s\n%s\n", hx, len, key,
                      note ? note : "");
    if (tl < 0) return CT_EIO;
    if ((size_t)tl >= sizeof text) tl = (int)sizeof text - 1;
    snprintf(name, sizeof name, "%s%s", key, ext);
    snprintf(sum, sizeof sum, "%s.sum", key);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "tmp-%.16s", key);
    int fd = create_unique(dfd, prefix, ext, tmp, sizeof tmp, 0600);
    if (fd < 0) return CT_EIO;
    ct_status s = write_all(fd, data, len);
    if (close(fd) != 0) s = CT_EIO;
    if (s == CT_OK) {
        int fs = create_unique(dfd, prefix, ".sum", tsum, sizeof tsum, 0600);
        if (fs < 0) s = CT_EIO;
        else {
            s = write_all(fs, text, (size_t)tl);
            if (close(fs) != 0) s = CT_EIO;
            if (s == CT_OK && (renameat(dfd, tmp, dfd, name) != 0 || renameat(dfd, tsum, dfd, sum) != 0))
                s = CT_EIO;
            if (s != CT_OK) unlinkat(dfd, tsum, 0);
        }
    }
    if (s != CT_OK) unlinkat(dfd, tmp, 0);
    return s;
}

ct_status jit_cache_open(const char *fn, const char *spec, char *dir, size_t cap, int *dfd)
{
    char d[DIR_MAX];
    *dfd = -1;
    CT_TRY(cache_dir(fn, spec, d, dfd));
    if (dir && cap) snprintf(dir, cap, "%s", d);
    return CT_OK;
}

/* ---- processes -------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Run the compiler in the cache directory (its working directory is the checked descriptor,
 * so the names it is given are relative to it and nobody else's), output to out_fd. */
static ct_status spawn(const char *fn, const env *e, char *const argv[], int out_fd, pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
    posix_spawn_file_actions_addfchdir_np(&fa, e->dfd);
    int r = posix_spawn(pid, e->cc, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (r != 0)
        return ct_error(CT_EUNSUPPORTED, "%s: no C compiler: cannot run %s: %s", fn, e->cc, strerror(r));
    atomic_fetch_add(&st_procs, 1);
    return CT_OK;
}

/* An unnamed scratch file for a process's output (created in the cache dir, then unlinked). */
static int scratch_fd(const env *e)
{
    char name[96];
    int fd = create_unique(e->dfd, "tmp-out", "", name, sizeof name, 0600);
    if (fd >= 0) unlinkat(e->dfd, name, 0);
    return fd;
}

static void slurp_fd(int fd, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (fd < 0) return;
    ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
}

/* The compiler's --version, first line, once per process and compiler identity (only on a
 * miss): a compiler replaced at the same path is asked again. */
static void compiler_version(const char *fn, const env *e)
{
    if (!strcmp(g_version_of, e->ident)) return;
    int out = scratch_fd(e);
    char *argv[] = {(char *)e->cc, "--version", NULL};
    pid_t pid;
    g_version[0] = '\0';
    if (out >= 0 && spawn(fn, e, argv, out, &pid) == CT_OK) {
        double t0 = now_s();
        int stt;
        for (;;) {
            pid_t w = waitpid(pid, &stt, WNOHANG);
            if (w == pid || (w < 0 && errno != EINTR)) break;
            if (now_s() - t0 > e->timeout) {
                kill(pid, SIGKILL);
                waitpid(pid, &stt, 0);
                break;
            }
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        }
        slurp_fd(out, g_version, sizeof g_version);
        char *nl = strchr(g_version, '\n');
        if (nl) *nl = '\0';
    }
    if (out >= 0) close(out);
    snprintf(g_version_of, sizeof g_version_of, "%s", e->ident);
}

typedef struct job {
    int ir;            /* index into the batch */
    char key[65];
    char base[128];    /* temp name prefix, relative to the cache dir */
    char *src;
    int err_fd;        /* the compiler's output (unnamed) */
    pid_t pid;
    double t0;
    bool running, done;
    ct_status st;
} job;

/* Report a compiler failure. An error at a line of the generated source is a bug of ctorch
 * (the message shows the source around it); anything else (no space or no right to write in
 * the cache dir, a file size limit, a compiler that cannot build shared objects) is said as
 * such, with what to check. */
static ct_status compile_error(const char *fn, const env *e, const job *j, int status)
{
    char err[2048];
    slurp_fd(j->err_fd, err, sizeof err);
    char srcname[160];
    snprintf(srcname, sizeof srcname, "%s.c:", j->base);
    int line = 0;
    const char *el = NULL;
    /* the first line that names the source at a line and says error */
    for (const char *p = err; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        const char *m = strstr(p, srcname);
        if (m && m < p + len && m[strlen(srcname)] >= '1' && m[strlen(srcname)] <= '9') {
            const char *er = strstr(p, "error");
            if (er && er < p + len) {
                el = p;
                line = atoi(m + strlen(srcname));
                break;
            }
        }
        if (!nl) break;
        p = nl + 1;
    }
    const char *shown = el ? el : err;
    while (*shown == '\n')
        shown++;
    const char *nl = strchr(shown, '\n');
    char first[256];
    snprintf(first, sizeof first, "%.*s", nl ? (int)(nl - shown) : (int)strlen(shown), shown);
    if (!el)
        return ct_error(CT_EIO,
                        "%s: the C compiler %s failed (status %d) without an error in the generated "
                        "source: %s (check that it can build a shared object, and that the cache "
                        "dir %s is writable with free space and no file size limit; or set CC / "
                        "CT_CACHE_DIR)",
                        fn, e->cc, status, first[0] ? first : "(no output)", e->dir);
    char ctxt[600] = "";
    size_t off = 0;
    if (line > 0 && j->src) {
        const char *p = j->src;
        for (int ln = 1; *p && ln <= line + 1; ln++) {
            const char *q = strchr(p, '\n');
            int len = q ? (int)(q - p) : (int)strlen(p);
            if (ln >= line - 1 && off < sizeof ctxt)
                off += (size_t)snprintf(ctxt + off, sizeof ctxt - off, "%c%5d | %.*s\n",
                                        ln == line ? '>' : ' ', ln, len > 100 ? 100 : len, p);
            if (!q) break;
            p = q + 1;
        }
    }
    return ct_error(CT_EINTERNAL,
                    "%s: the C compiler failed (status %d) on the generated source (a bug: please "
                    "report): %s\n%s",
                    fn, status, first, ctxt);
}

static void cleanup(const env *e, job *j)
{
    if (!j->base[0]) return;
    static const char *ext[] = {".c", ".so", ".sum"};
    char p[160];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s%s", j->base, ext[i]);
        unlinkat(e->dfd, p, 0);
    }
    if (j->err_fd >= 0) close(j->err_fd);
    j->err_fd = -1;
}

/* Finish a job whose compiler exited 0: read its output through the directory, load those
 * bytes, then publish them with their checksum. */
static ct_status publish(const char *fn, const env *e, job *j, const jir *ir, jkernel *k)
{
    char so[160], sum[160], dso[80], dsum[80];
    snprintf(so, sizeof so, "%s.so", j->base);
    snprintf(sum, sizeof sum, "%s.sum", j->base);
    snprintf(dso, sizeof dso, "%s.so", j->key);
    snprintf(dsum, sizeof dsum, "%s.sum", j->key);
    int fd;
    if (open_entry(e->dfd, so, &fd) != CT_OK)
        return ct_error(CT_EIO, "%s: the compiler wrote no output %s in the cache dir %s", fn, so, e->dir);
    uint8_t *b;
    size_t n;
    ct_status s = read_fd(fd, &b, &n, SO_MAX);
    close(fd);
    if (s != CT_OK) return ct_error(CT_EIO, "%s: cannot read %s in the cache dir %s", fn, so, e->dir);
    uint8_t d[32];
    char hx[65], text[768];
    jit_sha256(b, n, d);
    hex(d, hx);
    int tl = snprintf(text, sizeof text, "sha256 %s\nsize %zu\nkey %s\ncompiler %s\nversion %s\n",
                      hx, n, j->key, e->ident, g_version);
    s = load_bytes(fn, e, b, n, ir, k); /* what was hashed, before it is published */
    ct_free(b);
    if (s != CT_OK) return s;
    /* publish: the .so first, then its checksum; a reader seeing a new .so with an old (or no)
     * checksum treats it as damaged and rebuilds, never loads it */
    if (write_entry(e->dfd, sum, text, (size_t)(tl < (int)sizeof text ? tl : (int)sizeof text - 1),
                    0600) != CT_OK ||
        renameat(e->dfd, so, e->dfd, dso) != 0 || renameat(e->dfd, sum, e->dfd, dsum) != 0)
        return ct_error(CT_EIO,
                        "%s: cannot write the cache entry %s in the cache dir %s: %s (free space "
                        "there, or set CT_CACHE_DIR to another directory)",
                        fn, dso, e->dir, strerror(errno));
    return CT_OK;
}

/* Compile the jobs, at most e->threads at once. */
static ct_status run_jobs(const char *fn, const env *e, job *jobs, int nj, jir **irs,
                          jkernel **ks)
{
    for (int i = 0; i < nj; i++)
        jobs[i].err_fd = -1;
    for (int i = 0; i < nj; i++) {
        job *j = &jobs[i];
        char prefix[32], path[160];
        snprintf(prefix, sizeof prefix, "tmp-%.16s", j->key);
        int fd = create_unique(e->dfd, prefix, ".c", path, sizeof path, 0600);
        if (fd >= 0) {
            snprintf(j->base, sizeof j->base, "%.*s", (int)(strlen(path) - 2), path);
            char old[160]; /* leftovers of a crashed process that had this pid */
            snprintf(old, sizeof old, "%s.so", j->base);
            unlinkat(e->dfd, old, 0);
            snprintf(old, sizeof old, "%s.sum", j->base);
            unlinkat(e->dfd, old, 0);
            ct_status w = write_all(fd, j->src, strlen(j->src));
            if (close(fd) != 0) w = CT_EIO;
            if (w != CT_OK) fd = -1;
        }
        if (fd < 0 || (j->err_fd = scratch_fd(e)) < 0) {
            int er = errno;
            for (int k = 0; k <= i; k++)
                cleanup(e, &jobs[k]);
            return ct_error(CT_EIO,
                            "%s: cannot write in the cache dir %s: %s (free space there, or set "
                            "CT_CACHE_DIR to another directory)",
                            fn, e->dir, strerror(er));
        }
    }
    compiler_version(fn, e);
    int next = 0, running = 0, done = 0;
    ct_status first = CT_OK;
    while (done < nj) {
        while (running < e->threads && next < nj && first == CT_OK) {
            job *j = &jobs[next++];
            char c[160], so[160];
            snprintf(c, sizeof c, "%s.c", j->base);
            snprintf(so, sizeof so, "%s.so", j->base);
            char *argv[24];
            int a = 0;
            argv[a++] = (char *)e->cc;
            for (int f = 0; f < e->nflags; f++)
                argv[a++] = (char *)e->flags[f];
            argv[a++] = "-o";
            argv[a++] = so;
            argv[a++] = c;
            argv[a++] = "-lm";
            argv[a] = NULL;
            j->st = spawn(fn, e, argv, j->err_fd, &j->pid);
            if (j->st != CT_OK) {
                first = j->st;
                j->done = true;
                done++;
                continue;
            }
            atomic_fetch_add(&st_compiles, 1);
            j->t0 = now_s();
            j->running = true;
            running++;
        }
        if (first != CT_OK && running == 0) break;
        bool progressed = false;
        for (int i = 0; i < nj; i++) {
            job *j = &jobs[i];
            if (!j->running) continue;
            int stt;
            pid_t w = waitpid(j->pid, &stt, WNOHANG);
            if (w == 0) {
                if (now_s() - j->t0 > e->timeout) {
                    kill(j->pid, SIGKILL);
                    waitpid(j->pid, &stt, 0);
                    j->st = ct_error(CT_ETIMEDOUT,
                                     "%s: compiling a mod took longer than %g s (CT_COMPILE_TIMEOUT)",
                                     fn, e->timeout);
                    goto finished;
                }
                continue;
            }
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) j->st = ct_error(CT_EINTERNAL, "%s: waitpid: %s", fn, strerror(errno));
            else if (!WIFEXITED(stt) || WEXITSTATUS(stt) != 0)
                j->st = compile_error(fn, e, j, WIFEXITED(stt) ? WEXITSTATUS(stt) : -WTERMSIG(stt));
            else j->st = publish(fn, e, j, irs[j->ir], ks[j->ir]);
        finished:
            j->running = false;
            j->done = true;
            running--;
            done++;
            progressed = true;
            if (j->st != CT_OK && first == CT_OK) first = j->st;
        }
        if (!progressed && running > 0) nanosleep(&(struct timespec){0, 1000000}, NULL);
        if (first != CT_OK && next < nj) { /* do not start more after a failure */
            done += nj - next;
            next = nj;
        }
    }
    for (int i = 0; i < nj; i++)
        cleanup(e, &jobs[i]);
    return first;
}

/* ---- the entry point -------------------------------------------------------------------- */

static jkernel *table_find(const char *tkey)
{
    for (int i = 0; i < g_ntable; i++)
        if (!strcmp(g_table[i].tkey, tkey)) return g_table[i].k;
    return NULL;
}

ct_status jit_build(jir **irs, int n, const ct_jit_options *opt, jkernel **out)
{
    const char *fn = "ct_mod_compile";
    ct_jit_options o = opt ? *opt : ct_jit_options_default();
    char (*tkeys)[65] = NULL;
    jkernel **fresh = NULL;
    job *jobs = NULL;
    env *e = NULL;
    ct_status s = ct_calloc((void **)&tkeys, (size_t)n * 65);
    if (s == CT_OK) s = ct_calloc((void **)&fresh, (size_t)n * sizeof *fresh);
    if (s == CT_OK) s = ct_calloc((void **)&jobs, (size_t)n * sizeof *jobs);
    if (s != CT_OK) goto out_free;
    for (int i = 0; i < n; i++) {
        out[i] = NULL;
        char *text;
        size_t len;
        if ((s = jir_serialize(irs[i], &text, &len)) != CT_OK) goto out_free;
        uint8_t d[32];
        /* the table key: the IR and the compiler asked for */
        const char *cc = o.cc ? o.cc : getenv("CC") ? getenv("CC") : "cc";
        size_t cl = strlen(cc);
        char *t2;
        if ((s = ct_alloc((void **)&t2, len + cl + 2)) != CT_OK) {
            ct_free(text);
            goto out_free;
        }
        memcpy(t2, text, len);
        t2[len] = '\n';
        memcpy(t2 + len + 1, cc, cl + 1);
        jit_sha256(t2, len + cl + 1, d);
        hex(d, tkeys[i]);
        ct_free(t2);
        ct_free(text);
    }
    pthread_mutex_lock(&g_lock);
    int nmiss = 0;
    for (int i = 0; i < n; i++) {
        out[i] = table_find(tkeys[i]);
        for (int j = 0; !out[i] && j < i; j++) /* the same mod twice in one batch */
            if (!strcmp(tkeys[j], tkeys[i])) out[i] = out[j] ? out[j] : fresh[j];
        if (out[i]) {
            atomic_fetch_add(&st_table, 1);
            continue;
        }
        nmiss++;
    }
    if (nmiss && g_ntable + nmiss > TABLE_MAX) {
        s = ct_error(CT_ENOMEM, "%s: more than %d distinct mods in one process", fn, TABLE_MAX);
        goto out_unlock;
    }
    if (nmiss) {
        if ((s = ct_calloc((void **)&e, sizeof *e)) != CT_OK) goto out_unlock;
        if ((s = make_env(fn, &o, e)) != CT_OK) goto out_unlock;
    }
    int nj = 0;
    for (int i = 0; i < n; i++) {
        if (out[i]) continue;
        bool dup = false;
        for (int j = 0; j < i; j++)
            if (!strcmp(tkeys[j], tkeys[i])) dup = true;
        if (dup) continue;
        if ((s = ct_calloc((void **)&fresh[i], sizeof(jkernel))) != CT_OK) goto out_unlock;
        /* the disk key */
        char *text;
        size_t len;
        if ((s = jir_serialize(irs[i], &text, &len)) != CT_OK) goto out_unlock;
        size_t extra = strlen(e->ident) + strlen(e->flagstr) + 64;
        char *t2;
        if ((s = ct_alloc((void **)&t2, len + extra)) != CT_OK) {
            ct_free(text);
            goto out_unlock;
        }
        memcpy(t2, text, len);
        int m = snprintf(t2 + len, extra, "\n%s\n%s\nabi %d ctorch %s\n", e->ident, e->flagstr,
                         JIT_ABI, ct_version());
        uint8_t d[32];
        jit_sha256(t2, len + (size_t)m, d);
        ct_free(t2);
        ct_free(text);
        hex(d, fresh[i]->key);
        ct_status c = try_cache(fn, e, fresh[i]->key, irs[i], fresh[i]);
        if (c == CT_OK) {
            atomic_fetch_add(&st_cache, 1);
            continue;
        }
        if (c == CT_EFORMAT) atomic_fetch_add(&st_rebuilt, 1);
        job *j = &jobs[nj++];
        j->ir = i;
        memcpy(j->key, fresh[i]->key, 65);
        if ((s = jit_codegen(irs[i], &j->src)) != CT_OK) goto out_unlock;
    }
    if (nj) s = run_jobs(fn, e, jobs, nj, irs, fresh);
    if (s == CT_OK) {
        for (int i = 0; i < n; i++) {
            if (!fresh[i]) continue;
            fresh[i]->ir = irs[i];
            irs[i] = NULL;
            memcpy(g_table[g_ntable].tkey, tkeys[i], 65);
            g_table[g_ntable++].k = fresh[i];
            out[i] = fresh[i];
            fresh[i] = NULL;
        }
        for (int i = 0; i < n; i++)
            if (!out[i])
                for (int j = 0; j < i; j++)
                    if (!strcmp(tkeys[j], tkeys[i])) out[i] = out[j];
    }
out_unlock:
    pthread_mutex_unlock(&g_lock);
out_free:
    for (int i = 0; jobs && i < n; i++)
        ct_free(jobs[i].src);
    for (int i = 0; fresh && i < n; i++)
        if (fresh[i]) {
            if (fresh[i]->dl) dlclose(fresh[i]->dl);
            ct_free(fresh[i]);
        }
    if (s != CT_OK && out)
        for (int i = 0; i < n; i++)
            out[i] = NULL;
    ct_free(jobs);
    ct_free(fresh);
    ct_free(tkeys);
    if (e && e->dfd >= 0) close(e->dfd);
    ct_free(e);
    return s;
}
